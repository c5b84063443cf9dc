//! `stepwell serve` from the outside: a real server process on a loopback
//! port, called over HTTP (ureq), followed over Server-Sent Events and the
//! AHP WebSocket (tungstenite), beside CLI processes on the same SQLite
//! file.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell_tests::served::Served;
use stepwell_tests::{repo, stepwell_binary, wait_for};

fn example(name: &str) -> String {
    repo()
        .join("flows/examples")
        .join(name)
        .display()
        .to_string()
}

/// Reads SSE events (name, id, data) from `reader` until `stop` says so.
fn read_events(
    reader: impl Read,
    mut stop: impl FnMut(&[(String, Option<String>, Value)]) -> bool,
) -> Vec<(String, Option<String>, Value)> {
    let mut events = Vec::new();
    let (mut name, mut id, mut data) = (String::new(), None, String::new());
    for line in BufReader::new(reader).lines() {
        let line = line.unwrap();
        if line.is_empty() {
            if !data.is_empty() {
                events.push((
                    std::mem::take(&mut name),
                    id.take(),
                    serde_json::from_str(&data).unwrap(),
                ));
                data.clear();
                if stop(&events) {
                    break;
                }
            }
            continue;
        }
        if let Some(v) = line.strip_prefix("event: ") {
            name = v.to_string();
        } else if let Some(v) = line.strip_prefix("id: ") {
            id = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("data: ") {
            data.push_str(v);
        }
    }
    events
}

fn stream(s: &Served, path: &str) -> impl Read {
    s.agent
        .get(format!("{}{path}", s.url))
        .header("Authorization", format!("Bearer {}", s.token))
        .call()
        .unwrap()
        .into_body()
        .into_reader()
}

/// The README's session: start the ask-user example over HTTP, answer it,
/// read its ledger; the health check needs no token, everything else does.
#[test]
fn a_new_user_starts_answers_and_reads_a_run_over_http() {
    let mut s = Served::start(&[]);
    let (status, health) = s.call("GET", "/v1/health", None, None);
    assert_eq!((status, &health["status"]), (200, &json!("ok")));
    // No token, a wrong one: 401, and no data.
    let (status, body) = s.call("GET", "/v1/runs", None, None);
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, _) = s.call("GET", "/v1/runs", None, Some("0123456789abcdef0123"));
    assert_eq!(status, 401);
    let (status, _) = s.call(
        "POST",
        "/v1/runs",
        Some(&json!({"bundle": example("ask-user")}).to_string()),
        None,
    );
    assert_eq!(status, 401);
    assert!(s.ok("/v1/runs?limit=5")["items"]
        .as_array()
        .unwrap()
        .is_empty());

    let (status, run) = s.post("/v1/runs", json!({"bundle": example("ask-user")}));
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "waiting");
    assert_eq!(run["waiting"]["prompt"], "What is your name?");
    let id = run["run_id"].as_str().unwrap().to_string();
    assert_eq!(s.ok(&format!("/v1/runs/{id}"))["status"], "waiting");
    // It is in the list of runs waiting on a person.
    let waits = s.ok("/v1/waits");
    assert_eq!(waits["items"][0]["run_id"], json!(id));

    let (status, done) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"text": "Ada"}}),
    );
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"], json!({"greeting": "Hello, Ada!"}));
    // The same answer again: the wait was resumed once.
    let (status, stale) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"text": "Bob"}}),
    );
    assert_eq!(status, 409, "{stale}");
    assert_eq!(stale["error"]["code"], "stale_resume");

    let ledger = s.ok(&format!("/v1/runs/{id}/ledger"));
    let ledger = ledger.as_array().unwrap();
    assert_eq!(ledger.len(), 4);
    assert_eq!(ledger[0]["seq"], 1);
    assert_eq!(ledger[3]["node_id"], "greet");
    let after = s.ok(&format!("/v1/runs/{id}/ledger?after=2"));
    assert_eq!(after.as_array().unwrap().len(), 2);
    assert_eq!(after[0]["seq"], 3);
    let verified = s.ok(&format!("/v1/runs/{id}/ledger/verify"));
    assert_eq!(
        (verified["ok"].clone(), verified["records"].clone()),
        (json!(true), json!(4))
    );

    // The CLI on the same file sees the same run.
    let out = s.cli(&["--json", "status", &id]);
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli["output"], done["output"]);
    assert!(s.stop().success());
}

/// Bad input gets a typed error naming the field, with a status that
/// fits; nothing is created.
#[test]
fn bad_requests_get_typed_errors() {
    let s = Served::start(&["--max-body-bytes", "4096"]);
    // (method, path, body, status, code, the field's start)
    type Case<'a> = (&'a str, &'a str, String, u16, &'a str, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "GET",
            "/v1/runs/nope",
            String::new(),
            404,
            "run_not_found",
            None,
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": example("ask-user"), "surprise": 1}).to_string(),
            400,
            "invalid_input",
            Some("body"),
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": example("ask-user"), "vars": [1]}).to_string(),
            400,
            "invalid_input",
            Some("body.vars"),
        ),
        (
            "POST",
            "/v1/runs",
            "{not json".to_string(),
            400,
            "invalid_input",
            Some("body"),
        ),
        (
            "POST",
            "/v1/runs",
            json!({}).to_string(),
            400,
            "invalid_input",
            Some("body"),
        ),
        (
            "POST",
            "/v1/runs",
            json!({"workflow_id": "never-loaded"}).to_string(),
            404,
            "unknown_workflow",
            None,
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": "/nonexistent/bundle"}).to_string(),
            400,
            "invalid_definition",
            None,
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": example("hello"), "vars": {"_meta": {"automation": {}}}}).to_string(),
            400,
            "invalid_input",
            Some("body.vars: _meta.automation"),
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": example("hello"), "session_id": "automation:x"}).to_string(),
            400,
            "invalid_input",
            Some("body.session_id"),
        ),
        (
            "POST",
            "/v1/runs",
            json!({"bundle": example("hello"), "vars": {"name": "x".repeat(5000)}}).to_string(),
            413,
            "payload_too_large",
            None,
        ),
        (
            "GET",
            "/v1/runs?status=sleeping",
            String::new(),
            400,
            "invalid_input",
            Some("status"),
        ),
        (
            "GET",
            "/v1/runs?limit=0",
            String::new(),
            400,
            "invalid_input",
            Some("limit"),
        ),
        (
            "GET",
            "/v1/runs?bogus=1",
            String::new(),
            400,
            "invalid_input",
            Some("query"),
        ),
        (
            "GET",
            "/v1/runs?cursor=not-a-run",
            String::new(),
            400,
            "invalid_input",
            Some("cursor"),
        ),
        (
            "GET",
            "/v1/automations/nope",
            String::new(),
            404,
            "automation_not_found",
            None,
        ),
        (
            "POST",
            "/v1/automations",
            json!({"request_id": "x", "title": "t", "surprise": 1}).to_string(),
            400,
            "invalid_definition",
            None,
        ),
        (
            "GET",
            "/v1/nothing-here",
            String::new(),
            404,
            "not_found",
            None,
        ),
        (
            "POST",
            "/v1/snapshots/nope/restore",
            String::new(),
            404,
            "snapshot_not_found",
            Some("id"),
        ),
        (
            "PUT",
            "/v1/runs",
            String::new(),
            405,
            "method_not_allowed",
            None,
        ),
    ];
    for (method, path, body, status, code, field) in cases {
        let (got, v) = s.call(method, path, Some(&body), Some(&s.token.clone()));
        assert_eq!(got, status, "{method} {path} {body:.80}: {v}");
        assert_eq!(v["error"]["code"], code, "{method} {path}: {v}");
        if let Some(f) = field {
            assert!(
                v["error"]["field"]
                    .as_str()
                    .is_some_and(|x| x.starts_with(f)),
                "{method} {path}: field {f:?} in {v}"
            );
        }
    }
    // The definition error names the field.
    let (_, v) = s.post(
        "/v1/automations",
        json!({"request_id": "x", "title": "t", "surprise": 1}),
    );
    assert!(
        v["error"]["message"].as_str().unwrap().contains("surprise"),
        "{v}"
    );
    // Nothing was created by any of them.
    assert!(s.ok("/v1/runs")["items"].as_array().unwrap().is_empty());
    // Resuming a run that does not wait, with the wrong key.
    let (_, run) = s.post("/v1/runs", json!({"bundle": example("ask-user")}));
    let id = run["run_id"].as_str().unwrap();
    let (status, v) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"text": "x"}, "wait_key": "wrong"}),
    );
    assert_eq!(
        (status, v["error"]["code"].clone()),
        (409, json!("stale_resume")),
        "{v}"
    );
    let (status, v) = s.post(&format!("/v1/runs/{id}/resume"), json!({}));
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("body.payload")),
        "{v}"
    );
    // Text after the JSON value is refused, and the run still waits.
    let (status, v) = s.call(
        "POST",
        &format!("/v1/runs/{id}/resume"),
        Some(r#"{"payload": {"text": "x"}} garbage"#),
        Some(&s.token.clone()),
    );
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("body")),
        "{v}"
    );
    assert_eq!(s.ok(&format!("/v1/runs/{id}"))["status"], "waiting");
    // A cursor past the store's feed.
    let (status, v) = s.get("/v1/stream?after=999999");
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("after")),
        "{v}"
    );
    let (status, v) = s.get(&format!("/v1/runs/{id}/ledger/stream?after=99"));
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("after")),
        "{v}"
    );
    // Cancel, then resume: stale.
    let (status, v) = s.post(&format!("/v1/runs/{id}/cancel"), json!({"reason": "test"}));
    assert_eq!(
        (status, v["status"].clone()),
        (200, json!("cancelled")),
        "{v}"
    );
    let (status, _) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"text": "x"}}),
    );
    assert_eq!(status, 409);
}

/// Runs list newest first, filtered, in pages that neither skip nor
/// repeat a run.
#[test]
fn runs_list_in_pages_with_filters() {
    let s = Served::start(&[]);
    let mut ids = Vec::new();
    for i in 0..7 {
        let bundle = if i % 2 == 0 { "ask-user" } else { "hello" };
        let (status, run) = s.post(
            "/v1/runs",
            json!({"bundle": example(bundle), "vars": {"name": format!("n{i}")}}),
        );
        assert_eq!(status, 201, "{run}");
        ids.push(run["run_id"].as_str().unwrap().to_string());
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/runs?limit=3&cursor={c}"),
            None => "/v1/runs?limit=3".into(),
        };
        let page = s.ok(&path);
        for r in page["items"].as_array().unwrap() {
            seen.push(r["run_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let waiting = s.ok("/v1/runs?status=waiting&wait_reason=user");
    assert_eq!(waiting["items"].as_array().unwrap().len(), 4);
    // Summaries: no vars or output, the wait's prompt kept.
    let summary = s.ok("/v1/runs?status=waiting&view=summary&limit=1");
    let first = &summary["items"][0];
    assert!(
        first.get("vars").is_none() && first.get("output").is_none(),
        "{first}"
    );
    assert_eq!(first["waiting"]["prompt"], "What is your name?");
    assert_eq!(first["run_id"], waiting["items"][0]["run_id"]);
    let (status, _) = s.get("/v1/runs?view=everything");
    assert_eq!(status, 400);
    let hello = s.ok("/v1/runs?workflow_id=hello&status=completed");
    assert_eq!(hello["items"].as_array().unwrap().len(), 3);
}

/// A run's stream: records as they are committed (by this server, and by
/// a CLI process beside it), its state, its end; resumable from a seq.
#[test]
fn a_run_stream_follows_commits_of_every_process_and_resumes() {
    let s = Served::start(&[]);
    let (_, run) = s.post("/v1/runs", json!({"bundle": example("ask-user")}));
    let id = run["run_id"].as_str().unwrap().to_string();
    let reader = stream(&s, &format!("/v1/runs/{id}/ledger/stream"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let events = read_events(reader, |e| e.last().is_some_and(|x| x.0 == "end"));
        tx.send(events).unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    // Answered by another process.
    let out = s.cli(&["resume", &id, "--payload", r#"{"text": "Grace"}"#]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the stream ended");
    let records: Vec<&(String, Option<String>, Value)> =
        events.iter().filter(|e| e.0 == "record").collect();
    assert_eq!(records.len(), 4, "{events:?}");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.1.as_deref(), Some((i + 1).to_string().as_str()));
        assert_eq!(r.2["seq"], json!(i + 1));
    }
    let states: Vec<&Value> = events
        .iter()
        .filter(|e| e.0 == "state")
        .map(|e| &e.2)
        .collect();
    assert_eq!(states.first().unwrap()["status"], "waiting");
    assert_eq!(states.last().unwrap()["status"], "completed");
    assert_eq!(events.last().unwrap().2["records"], 4);

    // From seq 2 (Last-Event-ID): only 3 and 4, then the end.
    let reader = s
        .agent
        .get(format!("{}/v1/runs/{id}/ledger/stream", s.url))
        .header("Authorization", format!("Bearer {}", s.token))
        .header("Last-Event-ID", "2")
        .call()
        .unwrap()
        .into_body()
        .into_reader();
    let events = read_events(reader, |e| e.last().is_some_and(|x| x.0 == "end"));
    let seqs: Vec<Value> = events
        .iter()
        .filter(|e| e.0 == "record")
        .map(|e| e.2["seq"].clone())
        .collect();
    assert_eq!(seqs, vec![json!(3), json!(4)]);
    let (status, _) = s.get("/v1/runs/nope/ledger/stream");
    assert_eq!(status, 404);
}

/// The store's stream: every commit of every process in commit order,
/// records then the run's summary, resumable after any commit.
#[test]
fn the_store_stream_shows_every_commit_and_resumes() {
    let s = Served::start(&[]);
    let reader = stream(&s, "/v1/stream");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let events = read_events(reader, |e| {
            e.iter()
                .filter(|x| x.0 == "run" && x.2["status"] == "completed")
                .count()
                >= 2
        });
        tx.send(events).unwrap();
    });
    std::thread::sleep(Duration::from_millis(300));
    let (_, a) = s.post(
        "/v1/runs",
        json!({"bundle": example("hello"), "vars": {"name": "A"}}),
    );
    // A CLI process commits too.
    let out = s.cli(&[
        "--json",
        "run",
        &example("hello"),
        "--vars",
        r#"{"name": "B"}"#,
    ]);
    assert!(out.status.success());
    let b: Value = serde_json::from_slice(&out.stdout).unwrap();
    let events = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("both runs seen");
    let runs: Vec<&Value> = events
        .iter()
        .filter(|e| e.0 == "run")
        .map(|e| &e.2)
        .collect();
    let ids: Vec<&Value> = runs.iter().map(|r| &r["run_id"]).collect();
    assert!(
        ids.contains(&&a["run_id"]) && ids.contains(&&b["run_id"]),
        "{ids:?}"
    );
    // The stream starts at the newest commit (none yet) and says so.
    assert_eq!(events[0].0, "position");
    assert_eq!(events[0].2, json!({"after": 0, "head": 0}));
    // Every commit's last event carries the feed position; they increase.
    let positions: Vec<u64> = events
        .iter()
        .filter(|e| e.0 != "position")
        .filter_map(|e| e.1.as_ref())
        .map(|i| i.parse().unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    // Resuming after the first commit skips it.
    let first = positions[0];
    let reader = stream(&s, &format!("/v1/stream?after={first}"));
    let last = positions.last().unwrap().to_string();
    let again = read_events(reader, |e| {
        e.last().and_then(|x| x.1.as_deref()) == Some(last.as_str())
    });
    let again_positions: Vec<u64> = again
        .iter()
        .filter(|e| e.0 != "position")
        .filter_map(|e| e.1.as_ref())
        .map(|i| i.parse().unwrap())
        .collect();
    assert_eq!(again_positions, positions[1..].to_vec());
}

/// Automations over HTTP: create, list, show, pause and resume, a
/// rejected command (422), occurrences, the AHP run summaries.
#[test]
fn automations_are_created_commanded_and_read_over_http() {
    let s = Served::start(&[]);
    let ws = s.dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let request = json!({
        "request_id": "echo-often", "title": "Echo often",
        "target": {"workflow_id": "echo", "bundle_ref": repo().join("flows/automations/echo").display().to_string(),
                   "flow_id": "echo", "input_data": {"prompt": "hello"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
        "workspace_root": ws.display().to_string(),
    });
    let (status, created) = s.post("/v1/automations", request.clone());
    assert_eq!(status, 201, "{created}");
    let id = created["automation_id"].as_str().unwrap().to_string();
    let (status, again) = s.post("/v1/automations", request);
    assert_eq!((status, again["created"].clone()), (200, json!(false)));
    let list = s.ok("/v1/automations");
    assert_eq!(list["items"][0]["automation_id"], json!(id));
    // The driver in the server admits the first occurrence and runs it.
    wait_for(
        "the first occurrence completes",
        Duration::from_secs(30),
        || s.ok(&format!("/v1/automations/{id}/occurrences"))["items"][0]["status"] == "completed",
    );
    let summaries = s.ok(&format!("/v1/automations/{id}/runs"));
    let first = &summaries["items"][0];
    assert_eq!(
        first["resource"],
        json!(format!("ahp-automation-run:/{id}/1"))
    );
    assert_eq!(first["lifecycle"]["status"], "completed");
    assert_eq!(first["origin"]["kind"], "trigger");
    assert!(first["origin"]["scheduledFor"].is_string(), "{first}");
    assert_eq!(first["sessionCount"], 1);

    let command = |kind: &str, cid: &str| {
        s.post(
            &format!("/v1/automations/{id}/commands"),
            json!({"type": kind, "command_id": cid}),
        )
    };
    let (status, answer) = command("pause", "c1");
    assert_eq!(
        (status, answer["status"].clone()),
        (200, json!("applied")),
        "{answer}"
    );
    assert_eq!(s.ok(&format!("/v1/automations/{id}"))["status"], "paused");
    // At the wrong revision: rejected, 422 with the reason.
    let (status, answer) = s.post(
        &format!("/v1/automations/{id}/commands"),
        json!({"type": "resume", "command_id": "c2", "expected_revision": 99}),
    );
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["status"], "rejected");
    assert_eq!(
        answer["error"]["reason_code"], "revision_conflict",
        "{answer}"
    );
    // Nothing in flight to stop: refused by the automation, 422.
    let (status, answer) = command("stop_current", "c2b");
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"]["reason_code"], "invalid_state", "{answer}");
    // No such automation: 404.
    let (status, answer) = s.post(
        "/v1/automations/nope/commands",
        json!({"type": "pause", "command_id": "c2c"}),
    );
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = command("resume", "c3");
    assert_eq!(
        (status, answer["status"].clone()),
        (200, json!("applied")),
        "{answer}"
    );
    assert_eq!(s.ok(&format!("/v1/automations/{id}"))["status"], "active");
    // A run now: a manual occurrence.
    let (status, answer) = command("run_now", "c4");
    assert_eq!(status, 200, "{answer}");
    wait_for(
        "the run-now occurrence completes",
        Duration::from_secs(30),
        || {
            let runs = s.ok(&format!("/v1/automations/{id}/runs"));
            runs["items"][0]["origin"]["kind"] == "manual"
                && runs["items"][0]["lifecycle"]["status"] == "completed"
        },
    );
    let (status, v) = s.post(
        &format!("/v1/automations/{id}/commands"),
        json!({"type": "pause"}),
    );
    assert_eq!(
        (status, v["error"]["field"].clone()),
        (400, json!("body")),
        "{v}"
    );
    assert!(s.ok(&format!("/v1/automations/{id}/attention"))["items"].is_array());
    assert!(s.ok(&format!("/v1/automations/{id}/waits"))["items"].is_array());
    let triggers = s.ok("/v1/triggers");
    assert!(triggers["items"].as_array().unwrap().len() >= 2);
    let (status, preview) = s.post(
        "/v1/triggers/schedule@1/preview",
        json!({"config": {"every": "1h"}, "from": "2026-01-01T00:00:00Z", "count": 2}),
    );
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["fires"].as_array().unwrap().len(), 2, "{preview}");
    let (status, bad) = s.post(
        "/v1/triggers/schedule@1/validate",
        json!({"config": {"every": "never"}}),
    );
    assert_eq!(status, 400, "{bad}");
    let (status, _) = s.post("/v1/triggers/nope@1/validate", json!({"config": {}}));
    assert_eq!(status, 400);
    assert_eq!(s.ok("/v1/quarantined")["items"], json!([]));
    let tools = s.ok("/v1/tools");
    assert!(tools["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "write_file"));
}

/// `run` once it no longer runs: the server's calls fly their effects (a
/// tool batch, a model call), so a start answers the run `running` (an
/// approval, the run still waiting and `resuming`), and it goes on when
/// its effect lands.
fn settled(s: &Served, run: Value) -> Value {
    let id = run["run_id"].as_str().unwrap().to_string();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut run = run;
    while run["status"] == "running" || run["resuming"] == true {
        assert!(std::time::Instant::now() < until, "still running: {run}");
        std::thread::sleep(std::time::Duration::from_millis(10));
        run = s.ok(&format!("/v1/runs/{id}"));
    }
    run
}

/// A tool approval answered over HTTP runs the tool once.
#[test]
fn a_tool_call_is_approved_over_http() {
    let s = Served::start(&[]);
    let ws = s.dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let (status, run) = s.post(
        "/v1/runs",
        json!({"bundle": example("write-note"),
               "vars": {"workspace_root": ws.display().to_string(), "note": "approved"}}),
    );
    assert_eq!(status, 201, "{run}");
    let run = settled(&s, run);
    assert_eq!(run["waiting"]["details"]["mode"], "approval_required");
    assert_eq!(
        run["waiting"]["details"]["tool_calls"][0]["name"],
        "write_file"
    );
    assert!(!ws.join("note.txt").exists());
    let id = run["run_id"].as_str().unwrap();
    let (status, answered) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"approved": true}}),
    );
    // The batch runs in flight: accepted, the run waits until it lands.
    assert_eq!(
        (
            status,
            answered["status"].clone(),
            answered["resuming"].clone()
        ),
        (202, json!("waiting"), json!(true)),
        "{answered}"
    );
    let done = settled(&s, answered);
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done.get("resuming").is_none(), "{done}");
    assert_eq!(
        std::fs::read_to_string(ws.join("note.txt")).unwrap(),
        "approved"
    );
    // A denial of another: nothing is written.
    let (_, run) = s.post(
        "/v1/runs",
        json!({"bundle": example("write-note"),
               "vars": {"workspace_root": ws.display().to_string(), "note": "denied"}}),
    );
    let run = settled(&s, run);
    assert_eq!(run["status"], "waiting", "{run}");
    let id = run["run_id"].as_str().unwrap();
    let (_, done) = s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"approved": false, "reason": "no"}}),
    );
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        std::fs::read_to_string(ws.join("note.txt")).unwrap(),
        "approved"
    );
}

/// The OpenAPI document and the router agree: every documented route is
/// answered (not the fallback, not 405), and every route of the router
/// is documented.
#[test]
fn the_openapi_document_matches_the_routes() {
    let s = Served::start(&[]);
    let (status, doc) = s.call("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            documented.push((method.to_uppercase(), path.clone()));
            let concrete = path.replace("{id}", "x").replace("{source}", "schedule@1");
            if concrete == "/v1/ahp" || concrete.ends_with("/stream") {
                continue; // long-lived: checked by their own tests
            }
            let token = s.token.clone();
            let (got, body) = s.call(&method.to_uppercase(), &concrete, Some("{}"), Some(&token));
            assert_ne!(got, 405, "{method} {path}: {body}");
            assert_ne!(body["error"]["message"], "no such route", "{method} {path}");
            let open = op["security"].as_array().unwrap().is_empty();
            let (anon, _) = s.call(&method.to_uppercase(), &concrete, Some("{}"), None);
            if open {
                assert_ne!(anon, 401, "{method} {path} is documented as open");
            } else {
                assert_eq!(anon, 401, "{method} {path} must need the token");
            }
        }
    }
    // Every route the router declares is documented.
    let source = std::fs::read_to_string(repo().join("crates/serve/src/api.rs")).unwrap();
    let route = regex_lite_routes(&source);
    assert!(route.len() > 25, "{route:?}");
    for (method, path) in route {
        assert!(
            documented.contains(&(method.clone(), path.clone())),
            "{method} {path} is served but not in /openapi.json"
        );
    }
}

/// `.route("PATH", get(..).post(..))` declarations of the router source.
fn regex_lite_routes(source: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let flat: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    for part in flat.split(".route(\"").skip(1) {
        let Some((path, rest)) = part.split_once('"') else {
            continue;
        };
        // Up to the closing of this .route( call.
        let mut depth = 1;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let call = &rest[..end];
        for m in ["get", "post", "put", "delete", "patch"] {
            if call.contains(&format!(" {m}("))
                || call.contains(&format!(".{m}("))
                || call.contains(&format!(",{m}("))
            {
                out.push((m.to_uppercase(), path.to_string()));
            }
        }
    }
    out
}

/// Metrics in the Prometheus text format, needing the token.
#[test]
fn metrics_are_scrapable() {
    let s = Served::start(&[]);
    let (_, run) = s.post("/v1/runs", json!({"bundle": example("ask-user")}));
    let id = run["run_id"].as_str().unwrap();
    s.post(
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"text": "x"}}),
    );
    let (status, _) = s.call("GET", "/metrics", None, None);
    assert_eq!(status, 401);
    // A made-up method is counted as OTHER, whatever it is.
    {
        use std::io::Write;
        let host = s.url.trim_start_matches("http://");
        let mut c = std::net::TcpStream::connect(host).unwrap();
        let method = "Z".repeat(5000);
        write!(
            c,
            "{method} /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        let _ = c.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    }
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    let text = text.as_str().unwrap().to_string();
    for needle in [
        "stepwell_runs{status=\"completed\"} 1",
        "# TYPE stepwell_store_commit_seconds histogram",
        "stepwell_store_commit_seconds_bucket{le=\"+Inf\"}",
        "stepwell_resumes_total 1",
        "stepwell_guest_calls_total",
        "stepwell_http_requests_total{method=\"POST\",route=\"/v1/runs\",status=\"201\"} 1",
        "stepwell_http_requests_total{method=\"OTHER\",route=\"/v1/health\",status=\"405\"} 1",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }
    assert!(!text.contains("ZZZZ"));
    let steps: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("stepwell_steps_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(steps >= 4, "{text}");
}

/// The token file is created 0600 and reused; a readable one is refused.
#[test]
fn the_token_file_is_private_and_kept() {
    use std::os::unix::fs::PermissionsExt;
    let mut s = Served::start(&[]);
    let path = s.dir.path().join("serve-token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let token = s.token.clone();
    assert_eq!(token.len(), 64);
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&path, dir.path().join("serve-token")).unwrap();
    std::fs::set_permissions(
        dir.path().join("serve-token"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    assert!(s.stop().success());
    // Started again beside the same database: the same token.
    let mut again = Served::start_in(dir, &[]);
    assert_eq!(again.token, token);
    let path = again.dir.path().join("serve-token");
    assert!(again.stop().success());
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = stepwell_tests::scratch_home(&mut Command::new(stepwell_binary()), again.dir.path())
        .arg("--db")
        .arg(path.with_file_name("db.sqlite"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("readable by others"));
}

/// A memory store has no folder of its own: `stepwell serve` keeps its
/// token in the user's state folder (`$XDG_STATE_HOME/stepwell`, else
/// `~/.local/state/stepwell`), created private, and writes nothing in the
/// working directory; with neither variable it asks for `--token-file`.
#[test]
fn a_memory_store_keeps_its_token_in_the_state_folder() {
    use std::os::unix::fs::PermissionsExt;
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("notes.txt"), "mine").unwrap();
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(cwd.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let serve = |env: &[(&str, &std::path::Path)]| {
        let mut c = Command::new(stepwell_binary());
        c.args(["--store", "memory", "serve", "--listen", "127.0.0.1:0"])
            .current_dir(cwd.path())
            .env_remove("XDG_STATE_HOME")
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        c
    };
    let start = |env: &[(&str, &std::path::Path)], home: tempfile::TempDir| {
        let mut child = serve(env).spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = lines.next().unwrap().unwrap();
        let url = url.strip_prefix("stepwell serve: ").unwrap();
        let file = lines.next().unwrap().unwrap();
        let file = PathBuf::from(file.strip_prefix("token file: ").unwrap());
        std::thread::spawn(move || for _ in lines {});
        let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
        let served = Served {
            child,
            url: url.trim_end_matches('/').to_string(),
            token,
            dir: home,
            agent: stepwell_tests::served::agent(),
        };
        (served, file)
    };

    let home = tempfile::tempdir().unwrap();
    let xdg = home.path().join("state");
    let cache = home.path().join("cache");
    let (mut s, file) = start(
        &[("XDG_STATE_HOME", &xdg), ("XDG_CACHE_HOME", &cache)],
        home,
    );
    assert_eq!(file, xdg.join("stepwell/serve-token"));
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&xdg.join("stepwell")), 0o700);
    s.ok("/v1/runs");
    assert!(s.stop().success());
    assert_eq!(listing(), before, "the working directory changed");

    // Without XDG_STATE_HOME: under $HOME.
    let home = tempfile::tempdir().unwrap();
    let user = home.path().to_path_buf();
    let (mut s, file) = start(
        &[("HOME", &user), ("XDG_CACHE_HOME", &user.join(".cache"))],
        home,
    );
    assert_eq!(file, user.join(".local/state/stepwell/serve-token"));
    s.ok("/v1/runs");
    assert!(s.stop().success());
    assert_eq!(listing(), before, "the working directory changed");

    // Neither: refused, naming what is missing; nothing written.
    let out = serve(&[]).env_remove("HOME").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file") && err.contains("XDG_STATE_HOME"),
        "{err}"
    );
    assert_eq!(listing(), before, "the working directory changed");
}

/// A token file wherever the operator put it (here: inside a workspace)
/// is out of every tool's reach: a run cannot read it into its ledger.
#[test]
fn tools_cannot_read_the_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let token_file = ws.join("tok");
    let bundle = stepwell_tests::write_bundle(
        dir.path(),
        "read-token",
        &[(
            "flow.json",
            json!({"workflow_id": "read-token", "entry": "read", "nodes": {
                "read": {"effect": "tool_calls", "payload": {"tool_calls": [
                    {"name": "read_file", "call_id": "r", "arguments": {"file_path": "tok"}}]},
                         "result_key": "out", "next": "done"},
                "done": {"complete": {"$var": "out"}}}}),
        )],
    );
    let s = Served::start_in(dir, &["--token-file", token_file.to_str().unwrap()]);
    let (status, run) = s.post(
        "/v1/runs",
        json!({"bundle": bundle.display().to_string(),
               "vars": {"workspace_root": ws.display().to_string()}}),
    );
    assert_eq!(status, 201, "{run}");
    let run = settled(&s, run);
    // Refused as a workspace that holds the host's files.
    assert_eq!(run["status"], "failed", "{run}");
    assert!(
        run["error"]
            .as_str()
            .unwrap()
            .starts_with("workspace_policy"),
        "{run}"
    );
    let text = run.to_string();
    assert!(!text.contains(&s.token), "the token leaked: {text}");
    if let Some(id) = run["run_id"].as_str() {
        let ledger = s.ok(&format!("/v1/runs/{id}/ledger")).to_string();
        assert!(!ledger.contains(&s.token), "the token is in the ledger");
    }
}

/// A client that never finishes sending its request's headers is cut off
/// (no token needed to try it), and the server goes on answering others.
#[test]
fn a_half_sent_request_is_closed() {
    use std::io::Write;
    let s = Served::start(&["--header-timeout-ms", "500"]);
    let host = s.url.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&host).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // Closed by the server (EOF), not by our 10 s read timeout.
    let read = c.read_to_end(&mut answer);
    assert!(read.is_ok(), "{read:?} after {:?}", started.elapsed());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let (status, _) = s.call("GET", "/v1/health", None, None);
    assert_eq!(status, 200);
}

/// SIGTERM: the server stops accepting, ends its streams, finishes what
/// it has in hand, and exits 0; the store is consistent and the runs it
/// started go on under another process.
#[test]
fn sigterm_stops_gracefully() {
    let s = Served::start(&[]);
    let (_, run) = s.post("/v1/runs", json!({"bundle": example("ask-user")}));
    let id = run["run_id"].as_str().unwrap().to_string();
    let reader = stream(&s, &format!("/v1/runs/{id}/ledger/stream"));
    let follower = std::thread::spawn(move || read_events(reader, |_| false).len());
    std::thread::sleep(Duration::from_millis(300));
    let db = s.db();
    let started = Instant::now();
    let mut s = s;
    // SAFETY: kill(2) takes no pointers. The pid is the server's, our
    // child, not yet reaped (`wait` below reaps it), so it names no other
    // process.
    assert_eq!(unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) }, 0);
    let status = s.child.wait().unwrap();
    // The stream ended (its reader returned) after its first events.
    assert!(follower.join().unwrap() >= 2);
    // The store is whole, and another process goes on with the run.
    let rt = open_runtime(&StoreSpec::Sqlite(db), &HostOptions::default()).unwrap();
    assert_eq!(
        rt.get_state(&id).unwrap().status,
        stepwell::RunStatus::Waiting
    );
    let done = rt.respond(&id, json!({"text": "after"})).unwrap();
    assert_eq!(done.status, stepwell::RunStatus::Completed);
    assert!(rt.verify_ledger(&id).unwrap().is_ok());
    assert!(status.success(), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// An AHP client over the WebSocket.
struct Ahp {
    ws: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>,
    next_id: u64,
    /// Actions received while waiting for a response.
    actions: Vec<Value>,
}

impl Ahp {
    fn connect(s: &Served) -> Ahp {
        use tungstenite::client::IntoClientRequest;
        let url = s.url.replace("http://", "ws://") + "/v1/ahp";
        let mut req = url.as_str().into_client_request().unwrap();
        req.headers_mut().insert(
            "Authorization",
            format!("Bearer {}", s.token).parse().unwrap(),
        );
        let (ws, _) = tungstenite::connect(req).unwrap();
        if let tungstenite::stream::MaybeTlsStream::Plain(t) = ws.get_ref() {
            t.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        }
        let mut a = Ahp {
            ws,
            next_id: 0,
            actions: Vec::new(),
        };
        let init = a.request(
            "initialize",
            json!({"channel": "ahp-root://", "protocolVersions": [1], "clientId": "test-client"}),
        );
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
        assert_eq!(
            init["result"]["capabilities"]["automationRuns"]["runCancellation"],
            true
        );
        a
    }

    fn send(&mut self, v: Value) {
        self.ws
            .send(tungstenite::Message::Text(v.to_string().into()))
            .unwrap();
    }

    fn read(&mut self) -> Value {
        loop {
            match self.ws.read().unwrap() {
                tungstenite::Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
                tungstenite::Message::Close(_) => panic!("closed"),
                _ => {}
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.read();
            if m["id"] == json!(id) {
                return m;
            }
            self.actions.push(m);
        }
    }

    /// The next `action` notification's params.
    fn action(&mut self) -> Value {
        if !self.actions.is_empty() {
            return self.actions.remove(0)["params"].clone();
        }
        let m = self.read();
        assert_eq!(m["method"], "action", "{m}");
        m["params"].clone()
    }

    /// Actions until one of `kind` whose lifecycle status is `status`.
    fn until_lifecycle(&mut self, status: &str) -> Vec<Value> {
        let mut seen = Vec::new();
        loop {
            let a = self.action();
            let done = a["action"]["type"] == "automationRun/lifecycleChanged"
                && a["action"]["lifecycle"]["status"] == status;
            seen.push(a);
            if done {
                return seen;
            }
        }
    }
}

fn ask_automation(s: &Served, request_id: &str) -> String {
    let ws = s.dir.path().join(format!("ws-{request_id}"));
    std::fs::create_dir_all(&ws).unwrap();
    let (status, created) = s.post(
        "/v1/automations",
        json!({
            "request_id": request_id, "title": "Ask hourly",
            "target": {"workflow_id": "ask", "bundle_ref": repo().join("flows/automations/ask").display().to_string(),
                       "flow_id": "ask", "input_data": {"prompt": "How are you?"}},
            "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
            "workspace_root": ws.display().to_string(),
        }),
    );
    assert_eq!(status, 201, "{created}");
    created["automation_id"].as_str().unwrap().to_string()
}

/// A client follows an occurrence from pending to completed through AHP
/// actions. The server only answers (`--no-drive`); this test's process
/// moves the controller one step at a time through the library on the same
/// database, and the person's answer comes over HTTP.
#[test]
fn an_ahp_client_follows_an_occurrence_from_pending_to_completed() {
    let s = Served::start(&["--no-drive"]);
    let aid = ask_automation(&s, "follow");
    let rt = open_runtime(&StoreSpec::Sqlite(s.db()), &HostOptions::default()).unwrap();
    // Step the controller until its first occurrence is admitted.
    let mut steps = 0;
    while s.ok(&format!("/v1/automations/{aid}/runs"))["items"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        rt.tick_with(&aid, 1).unwrap();
        steps += 1;
        assert!(steps < 50, "no admission after 50 controller steps");
    }
    let uri = format!("ahp-automation-run:/{aid}/1");
    let mut ahp = Ahp::connect(&s);
    let sub = ahp.request("subscribe", json!({"resource": uri}));
    let state = &sub["result"]["state"];
    assert_eq!(state["lifecycle"]["status"], "pending", "{sub}");
    assert!(state["lifecycle"]["createdAt"].is_string());
    assert_eq!(state["sessions"], json!([]));
    assert_eq!(state["automation"], json!(format!("ahp-automation:/{aid}")));
    assert_eq!(state["origin"]["kind"], "trigger");
    assert!(state["origin"]["scheduledFor"].is_string());
    let from = sub["result"]["fromSeq"].as_u64().unwrap();
    // Dispatch: the child starts and waits on a person.
    let child = loop {
        rt.tick_with(&aid, 1).unwrap();
        let runs = s.ok(&format!("/v1/automations/{aid}/runs"));
        if let Some(p) = runs["items"][0]["primarySession"].as_str() {
            break p.strip_prefix("ahp-session:/").unwrap().to_string();
        }
    };
    let actions = ahp.until_lifecycle("running");
    let types: Vec<&str> = actions
        .iter()
        .map(|a| a["action"]["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"automationRun/sessionSet"), "{types:?}");
    assert!(
        types.contains(&"automationRun/primarySessionChanged"),
        "{types:?}"
    );
    let set = actions
        .iter()
        .find(|a| a["action"]["type"] == "automationRun/sessionSet")
        .unwrap();
    assert_eq!(
        set["action"]["session"],
        json!(format!("ahp-session:/{child}"))
    );
    assert!(actions.iter().all(|a| a["channel"] == json!(uri)));
    let seqs: Vec<u64> = actions
        .iter()
        .map(|a| a["serverSeq"].as_u64().unwrap())
        .collect();
    assert!(
        seqs[0] > from && seqs.windows(2).all(|w| w[0] < w[1]),
        "{seqs:?}"
    );
    let running = &actions.last().unwrap()["action"]["lifecycle"];
    assert!(running["startedAt"].is_string(), "{running}");
    // The child exists and waits (more controller steps may be needed).
    let mut steps = 0;
    while rt
        .load_run_opt(&child)
        .unwrap()
        .is_none_or(|r| r.status != stepwell::RunStatus::Waiting)
    {
        rt.tick_with(&aid, 1).unwrap();
        if rt.load_run_opt(&child).unwrap().is_some() {
            rt.tick(&child).unwrap();
        }
        steps += 1;
        assert!(steps < 50, "the child never waited");
    }
    // The person answers over HTTP; the controller records the outcome.
    let (status, done) = s.post(
        &format!("/v1/runs/{child}/resume"),
        json!({"payload": {"text": "fine"}}),
    );
    assert_eq!(
        (status, done["status"].clone()),
        (200, json!("completed")),
        "{done}"
    );
    stepwell::automation::drive_until_idle(&rt, 100).unwrap();
    let actions = ahp.until_lifecycle("completed");
    let completed = &actions.last().unwrap()["action"]["lifecycle"];
    assert!(
        completed["completedAt"].is_string() && completed["startedAt"].is_string(),
        "{completed}"
    );
    // The summaries of the automation's history, over the channel too.
    let list = ahp.request(
        "listAutomationRuns",
        json!({"automation": format!("ahp-automation:/{aid}")}),
    );
    assert_eq!(
        list["result"]["items"][0]["lifecycle"]["status"], "completed",
        "{list}"
    );
    // An unknown resource and method.
    let bad = ahp.request(
        "subscribe",
        json!({"resource": format!("ahp-automation-run:/{aid}/99")}),
    );
    assert_eq!(bad["error"]["code"], -32004, "{bad}");
    let bad = ahp.request("frobnicate", json!({}));
    assert_eq!(bad["error"]["code"], -32601);
    let bad = ahp.request(
        "listAutomationRuns",
        json!({"automation": "ahp-automation:/nope"}),
    );
    assert_eq!(bad["error"]["code"], -32004, "{bad}");
    assert_eq!(
        bad["error"]["data"]["code"], "automation_not_found",
        "{bad}"
    );
    // One spelling per occurrence.
    let bad = ahp.request(
        "subscribe",
        json!({"resource": format!("ahp-automation-run:/{aid}/01")}),
    );
    assert_eq!(bad["error"]["code"], -32602, "{bad}");
    // A batch is refused; a notification sent with an id is answered.
    ahp.send(json!([{"jsonrpc": "2.0", "id": 99, "method": "ping"}]));
    let m = ahp.read();
    assert_eq!(m["error"]["code"], -32600, "{m}");
    let m = ahp.request("unsubscribe", json!({"resource": uri}));
    assert_eq!(m["result"], json!({}), "{m}");
}

/// `automationRun/cancelRequested` cancels an occurrence that waits on a
/// person; the outcome arrives as a lifecycle action; a second request on
/// the ended run is rejected.
#[test]
fn an_ahp_cancel_request_cancels_a_waiting_occurrence() {
    let s = Served::start(&[]);
    let aid = ask_automation(&s, "cancel-me");
    let mut child = String::new();
    wait_for(
        "the occurrence waits on a person",
        Duration::from_secs(30),
        || {
            let waits = s.ok(&format!("/v1/automations/{aid}/waits"));
            match waits["items"][0]["run_id"].as_str() {
                Some(r) => {
                    child = r.to_string();
                    true
                }
                None => false,
            }
        },
    );
    // A stop aimed at another occurrence stops nothing.
    let (status, answer) = s.post(
        &format!("/v1/automations/{aid}/commands"),
        json!({"type": "stop_current", "command_id": "wrong-one", "payload": {"occurrence_index": 2}}),
    );
    assert_eq!(status, 422, "{answer}");
    assert_eq!(
        answer["error"]["field"], "payload.occurrence_index",
        "{answer}"
    );
    let (status, answer) = s.post(
        &format!("/v1/automations/{aid}/commands"),
        json!({"type": "stop_current", "command_id": "not-an-index", "payload": {"occurrence_index": "1"}}),
    );
    assert_eq!(
        (status, answer["error"]["reason_code"].clone()),
        (400, json!("invalid_request")),
        "{answer}"
    );
    assert_eq!(s.ok(&format!("/v1/runs/{child}"))["status"], "waiting");
    let uri = format!("ahp-automation-run:/{aid}/1");
    let mut ahp = Ahp::connect(&s);
    let sub = ahp.request("subscribe", json!({"resource": uri}));
    assert_eq!(
        sub["result"]["state"]["lifecycle"]["status"], "running",
        "{sub}"
    );
    ahp.send(json!({"jsonrpc": "2.0", "method": "dispatchAction",
                    "params": {"channel": uri, "clientSeq": 1, "action": {"type": "automationRun/cancelRequested"}}}));
    let echo = ahp.action();
    assert_eq!(
        echo["action"]["type"], "automationRun/cancelRequested",
        "{echo}"
    );
    assert_eq!(
        echo["origin"],
        json!({"clientId": "test-client", "clientSeq": 1})
    );
    assert!(echo.get("rejectionReason").is_none(), "{echo}");
    let actions = ahp.until_lifecycle("cancelled");
    assert!(actions.last().unwrap()["action"]["lifecycle"]["completedAt"].is_string());
    assert_eq!(s.ok(&format!("/v1/runs/{child}"))["status"], "cancelled");
    ahp.send(json!({"jsonrpc": "2.0", "method": "dispatchAction",
                    "params": {"channel": uri, "clientSeq": 2, "action": {"type": "automationRun/cancelRequested"}}}));
    let echo = ahp.action();
    assert!(
        echo["rejectionReason"]
            .as_str()
            .unwrap()
            .contains("cancelled"),
        "{echo}"
    );
    // Without the token there is no channel.
    use tungstenite::client::IntoClientRequest;
    let url = s.url.replace("http://", "ws://") + "/v1/ahp";
    let req = url.as_str().into_client_request().unwrap();
    assert!(tungstenite::connect(req).is_err());
}

/// What the dashboard reads: runs created in a window (a run made by
/// another process with `--now` in 2020, after the others, is found by
/// its time), the children of a run, and the flow a run executes with its
/// current node. A bad time names its parameter.
#[test]
fn runs_are_listed_by_time_and_parent_and_a_run_shows_its_flow() {
    let s = Served::start(&[]);
    let (status, parent) = s.post(
        "/v1/runs",
        json!({"bundle": example("subworkflow"), "vars": {"text": "hi"}, "run_id": "parent"}),
    );
    assert_eq!(status, 201, "{parent}");
    let (_, asked) = s.post(
        "/v1/runs",
        json!({"bundle": example("ask-user"), "run_id": "asked"}),
    );
    assert_eq!(asked["status"], "waiting");
    let out = stepwell_tests::scratch_home(&mut Command::new(stepwell_binary()), s.dir.path())
        .arg("--db")
        .arg(s.db())
        .args(["--now", "2020-06-01T00:00:00Z", "run", &example("hello")])
        .args(["--vars", r#"{"name": "Old"}"#, "--run-id", "dated-2020"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let ids = |q: &str| -> Vec<String> {
        s.ok(&format!("/v1/runs?{q}"))["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let child = parent["vars"]["child"]["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(ids("parent_run_id=parent"), std::slice::from_ref(&child));
    assert_eq!(ids("until=2021-01-01T00:00:00Z"), ["dated-2020"]);
    let recent = ids("since=2026-01-01T00:00:00Z");
    assert!(!recent.contains(&"dated-2020".to_string()), "{recent:?}");
    for id in ["parent", "asked", child.as_str()] {
        assert!(recent.contains(&id.to_string()), "{id} not in {recent:?}");
    }
    assert_eq!(
        ids("since=2026-01-01T00:00:00Z&workflow_id=ask-user"),
        ["asked"]
    );
    assert!(ids("since=2999-01-01T00:00:00Z").is_empty());
    let (status, err) = s.get("/v1/runs?since=yesterday");
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("since")),
        "{err}"
    );
    let (status, err) = s.get("/v1/runs?since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z");
    assert_eq!(
        (status, &err["error"]["field"]),
        (400, &json!("until")),
        "{err}"
    );
    // The flow: its nodes, their moves, and where the run is.
    let flow = s.ok("/v1/runs/asked/flow");
    assert_eq!(flow["entry"], "ask");
    assert_eq!(flow["current_node"], "ask");
    assert_eq!(flow["status"], "waiting");
    assert_eq!(
        flow["nodes"],
        json!([
            {"id": "ask", "kind": "effect", "effect": "ask_user", "next": "greet", "routes": {}},
            {"id": "greet", "kind": "component", "effect": null, "next": null, "routes": {}},
        ])
    );
    let flow = s.ok("/v1/runs/parent/flow");
    assert_eq!(flow["current_node"], Value::Null);
    assert_eq!(flow["nodes"][1]["effect"], "start_subworkflow");
    let (status, _) = s.get("/v1/runs/nobody/flow");
    assert_eq!(status, 404);
}

/// A bundle directory deployed over HTTP whose flow routes on a label its
/// component does not declare is deployed, and the answer says so.
#[test]
fn a_deployment_answers_the_routes_its_components_do_not_declare() {
    let s = Served::start(&[]);
    let dir = stepwell_tests::misspelt_expenses(s.dir.path());
    let expenses = repo().join("flows/examples/expenses");
    let (status, answer) = s.post(
        "/v1/deployments",
        json!({"path": dir.display().to_string()}),
    );
    assert_eq!(status, 201, "{answer}");
    let warnings = answer["warnings"].as_array().expect("warnings");
    assert_eq!(warnings.len(), 1, "{answer}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("nodes.triage.routes.reveiw"),
        "{answer}"
    );
    let (status, answer) = s.post(
        "/v1/deployments",
        json!({"path": expenses.display().to_string()}),
    );
    assert_eq!(status, 201, "{answer}");
    assert!(answer.get("warnings").is_none(), "{answer}");
    // Packed, uploaded: the same warning.
    let packed = s.dir.path().join("typo.flow");
    let out = Command::new(stepwell_binary())
        .args(["--store", "memory", "bundle", "pack"])
        .arg(&dir)
        .arg("-o")
        .arg(&packed)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut r = s
        .agent
        .post(format!("{}/v1/deployments", s.url))
        .header("Authorization", format!("Bearer {}", s.token))
        .header("Content-Type", "application/zip")
        .send(&std::fs::read(&packed).unwrap()[..])
        .unwrap();
    let answer: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert!(
        answer["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("nodes.triage.routes.reveiw")),
        "{answer}"
    );
}

/// Whether the browser test can run here: Chromium, node and
/// playwright-core (scripts/setup-browser installs them). Under CI they
/// must be there.
fn browser_ready() -> Option<PathBuf> {
    let modules = repo().join("target/browser/node_modules");
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let ready = node && chromium.is_file() && modules.join("playwright-core").is_dir();
    if !ready {
        assert!(
            std::env::var_os("CI").is_none(),
            "the browser test must run under CI: run scripts/setup-browser"
        );
        eprintln!("skipped: no chromium, node or playwright-core (scripts/setup-browser)");
        return None;
    }
    Some(modules)
}

/// The dashboard in a real browser (Debian's Chromium, headless, driven by
/// playwright-core): enter the token, start the ask-user example and
/// answer it in the page, approve a tool call, pause and resume an
/// automation (its buttons following its state), the waits, runs and
/// workflows pages, the runs filters, a run's flow picture, a parent's child
/// links, a controller's activity, and each page again at a phone's width.
/// Screenshots of every page land in target/browser/screenshots.
#[test]
fn the_dashboard_works_in_a_real_browser() {
    let Some(modules) = browser_ready() else {
        return;
    };
    let s = Served::start(&[]);
    let ws = s.dir.path().join("note-ws");
    std::fs::create_dir_all(&ws).unwrap();
    let auto_ws = s.dir.path().join("auto-ws");
    std::fs::create_dir_all(&auto_ws).unwrap();
    let (status, created) = s.post(
        "/v1/automations",
        json!({
            "request_id": "dashboard", "title": "Echo hourly",
            "target": {"workflow_id": "echo", "bundle_ref": repo().join("flows/automations/echo").display().to_string(),
                       "flow_id": "echo", "input_data": {"prompt": "hello from the schedule"}},
            "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
            "workspace_root": auto_ws.display().to_string(),
        }),
    );
    assert_eq!(status, 201, "{created}");
    // A webhook trigger beside it: its config (a connection id) must not
    // widen the automations table.
    let (status, conn) = s.post(
        "/v1/connections",
        json!({"source": "webhook.received@1", "label": "payments"}),
    );
    assert_eq!(status, 201, "{conn}");
    let (status, hooked) = s.post(
        "/v1/automations",
        json!({
            "request_id": "dashboard-hook", "title": "Echo each payment",
            "target": {"workflow_id": "echo", "bundle_ref": repo().join("flows/automations/echo").display().to_string(),
                       "flow_id": "echo", "input_data": {"prompt": "a payment"}},
            "trigger": {"source_id": "webhook.received", "source_version": 1,
                        "config": {"connection_id": conn["connection_id"]}},
            "workspace_root": auto_ws.display().to_string(),
        }),
    );
    assert_eq!(status, 201, "{hooked}");
    // One whose occurrence waits on a person: in flight.
    let (status, asking) = s.post(
        "/v1/automations",
        json!({
            "request_id": "dashboard-ask", "title": "Ask hourly",
            "target": {"workflow_id": "ask-user", "bundle_ref": example("ask-user"),
                       "flow_id": "ask-user", "input_data": {}},
            "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
            "workspace_root": auto_ws.display().to_string(),
        }),
    );
    assert_eq!(status, 201, "{asking}");
    let shots = repo().join("target/browser/screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    let out = Command::new("node")
        .arg(repo().join("tests/browser/dashboard.mjs"))
        .env("STEPWELL_URL", &s.url)
        .env("STEPWELL_TOKEN", &s.token)
        .env("STEPWELL_REPO", repo())
        .env("STEPWELL_SCREENSHOTS", &shots)
        .env(
            "STEPWELL_AUTOMATION_ID",
            created["automation_id"].as_str().unwrap(),
        )
        .env(
            "STEPWELL_ASKING_AUTOMATION_ID",
            asking["automation_id"].as_str().unwrap(),
        )
        .env("STEPWELL_WORKSPACE", &ws)
        .env("STEPWELL_NODE_MODULES", &modules)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "the browser test failed:\n{text}");
    assert_eq!(
        std::fs::read_to_string(ws.join("note.txt")).unwrap(),
        "from the browser"
    );
    let pngs = std::fs::read_dir(&shots)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "png"))
        })
        .count();
    // A screenshot per step and page, desktop and phone (tests/browser).
    assert!(
        pngs >= 26,
        "{pngs} screenshots in {}:\n{text}",
        shots.display()
    );
}

/// Deployments over HTTP: a packed bundle uploaded (201, then 200
/// unchanged), another by a path the server reads; the workflows and
/// their versions listed; a run started by id is pinned; a damaged
/// archive is refused, naming why, and deploys nothing.
#[test]
fn bundles_are_deployed_and_listed_over_http() {
    let s = Served::start(&["--max-body-bytes", "4000000"]);
    let packed = s.dir.path().join("ask.flow");
    let out = std::process::Command::new(stepwell_tests::stepwell_binary())
        .args(["--store", "memory", "bundle", "pack"])
        .arg(stepwell_tests::example("ask-user"))
        .arg("-o")
        .arg(&packed)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&packed).unwrap();
    let upload = |bytes: &[u8]| {
        let mut r = s
            .agent
            .post(format!("{}/v1/deployments", s.url))
            .header("Authorization", format!("Bearer {}", s.token))
            .header("Content-Type", "application/zip")
            .send(bytes)
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        (status, v)
    };
    let (status, first) = upload(&bytes);
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["items"][0]["version"]["version"], 1, "{first}");
    let (status, again) = upload(&bytes);
    assert_eq!(
        (status, &again["unchanged"]),
        (200, &json!(true)),
        "{again}"
    );
    let mut damaged = bytes.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 0xff;
    let (status, bad) = upload(&damaged);
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "invalid_definition", "{bad}");
    let (status, by_path) = s.post(
        "/v1/deployments",
        json!({"path": stepwell_tests::example("hello"), "deployed_by": "ops"}),
    );
    assert_eq!(status, 201, "{by_path}");
    let listed = s.ok("/v1/workflows");
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["workflow_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ask-user", "hello"], "{listed}");
    assert_eq!(listed["items"][1]["latest"]["deployed_by"], "ops");
    let (status, run) = s.post("/v1/runs", json!({"workflow_id": "ask-user"}));
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["workflow_version"], 1, "{run}");
    // Its history as one file.
    let mut r = s
        .agent
        .get(format!(
            "{}/v1/runs/{}/export",
            s.url,
            run["run_id"].as_str().unwrap()
        ))
        .header("Authorization", format!("Bearer {}", s.token))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let zip = r
        .body_mut()
        .with_config()
        .limit(8 << 20)
        .read_to_vec()
        .unwrap();
    assert!(zip.starts_with(b"PK\x03\x04"), "an archive");
    let versions = s.ok("/v1/workflows/ask-user/versions");
    assert_eq!(
        versions["versions"][0]["runs"],
        json!({"waiting": 1}),
        "{versions}"
    );
    // Forked from its first step, with a var the fork's ask uses.
    let id = run["run_id"].as_str().unwrap();
    assert_eq!(
        s.ok(&format!("/v1/runs/{id}/evidence")),
        json!({"items": []})
    );
    let points = s.ok(&format!("/v1/runs/{id}/fork-points"));
    assert_eq!(points["items"][0]["seq"], 1, "{points}");
    assert_eq!(points["items"][0]["node_id"], "ask", "{points}");
    let (status, fork) = s.post(
        &format!("/v1/runs/{id}/fork"),
        json!({"at": 1, "vars": {"note": "forked"}}),
    );
    assert_eq!(status, 201, "{fork}");
    assert_ne!(fork["run_id"], run["run_id"]);
    assert_eq!(fork["vars"]["_meta"]["forked_from"]["run"], id, "{fork}");
    let (status, refused) = s.post(&format!("/v1/runs/{id}/fork"), json!({"at": 2}));
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "not_forkable", "{refused}");
    let (status, missing) = s.get("/v1/workflows/nope/versions");
    assert_eq!(status, 404, "{missing}");
    // Unauthenticated: refused.
    let (status, _) = s.call("GET", "/v1/workflows", None, None);
    assert_eq!(status, 401);
}

//! Automations from a user's shell: `stepwell automations ...` and
//! `stepwell drive --until-idle` with a fixed clock (`--now`), and commands
//! from many OS processes at once beside a driver, on one SQLite file.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell::{RunStatus, StepRecord};
use stepwell_tests::shell::Shell;
use stepwell_tests::{repo, wait_for};

const ID: &str = "34f631d4-0bf3-5fea-a282-70c1b1d5b24b";

/// The run's ledger, read as another process reads it.
fn ledger(sh: &Shell, id: &str) -> Vec<StepRecord> {
    sh.runtime().get_ledger(id).unwrap()
}

fn memory_watch(workspace: &Path) -> String {
    json!({
        "request_id": "memory-watch",
        "title": "Memory watch",
        "target": {"workflow_id": "echo", "bundle_ref": "flows/automations/echo", "flow_id": "echo",
                   "input_data": {"prompt": "check memory"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "2m"}},
        "workspace_root": workspace.display().to_string(),
    })
    .to_string()
}

/// A time in the first hour of 2026-01-01, `m` minutes in (for `--now`).
fn minute(m: u32) -> String {
    format!("2026-01-01T00:{m:02}:00Z")
}

/// Creates the memory-watch automation at 00:00.
fn create_memory_watch(sh: &Shell) {
    let request = memory_watch(sh.dir.path());
    let now = minute(0);
    sh.json(&[
        "--now",
        &now,
        "--json",
        "automations",
        "create",
        "--request",
        &request,
    ]);
}

/// `stepwell drive --until-idle` at `now`: its report.
fn drive_at(sh: &Shell, now: &str) -> Value {
    sh.json(&["--now", now, "--json", "drive", "--until-idle"])
}

fn names(ledger: &[StepRecord]) -> Vec<(String, Value)> {
    ledger
        .iter()
        .filter(|r| {
            r.idempotency_key
                .as_deref()
                .is_some_and(|k| k.starts_with("automation:"))
        })
        .map(|r| {
            let e = r.effect.as_ref().unwrap();
            (
                e.payload["name"].as_str().unwrap().to_string(),
                e.payload["payload"].clone(),
            )
        })
        .collect()
}

/// The issue's new-user session: an every-2m automation created at
/// 00:00:00, driven at 00:00:00, 00:02:30 and 00:11:00: three children
/// with the reference's ids, the third admission coalesced, the next fire
/// time 00:12:00.
#[test]
fn a_new_user_runs_an_automation_from_the_shell() {
    let sh = Shell::new();
    let request = memory_watch(sh.dir.path());
    let t0 = ["--now", "2026-01-01T00:00:00Z"];
    let created = sh.json(
        &[
            &t0[..],
            &["--json", "automations", "create", "--request", &request],
        ]
        .concat(),
    );
    assert_eq!(
        created,
        json!({"automation_id": ID, "revision": 1, "created": true})
    );
    // The same request again: the same automation.
    let again = sh.json(
        &[
            &t0[..],
            &["--json", "automations", "create", "--request", &request],
        ]
        .concat(),
    );
    assert_eq!(again["created"], false);
    for now in [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:02:30Z",
        "2026-01-01T00:11:00Z",
    ] {
        let report = sh.json(&["--now", now, "--json", "drive", "--until-idle"]);
        assert!(report["passes"].as_u64().unwrap() >= 1, "{report}");
        assert_eq!(report["errors"], json!([]), "{report}");
    }
    let runs = sh.json(&["--json", "list", "--workflow", "echo"]);
    let mut ids: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "1a852a72-f109-5b94-be0b-3a5dada8b537",
            "1cc9f78d-ab67-5d54-acf2-fb44a5f70be2",
            "2fe4b30e-c19c-5afa-b5e5-e8d9d05cbd12",
        ]
    );
    let coalesced: Vec<Value> = names(&ledger(&sh, ID))
        .into_iter()
        .filter(|(n, _)| n == "automation.coalesced")
        .map(|(_, p)| p)
        .collect();
    assert_eq!(coalesced.len(), 1);
    assert_eq!(coalesced[0]["first_tick"], 2);
    assert_eq!(coalesced[0]["last_tick"], 5);
    assert_eq!(coalesced[0]["missed_count"], 3);
    let shown = sh.json(&[
        "--now",
        "2026-01-01T00:11:00Z",
        "--json",
        "automations",
        "show",
        ID,
    ]);
    assert_eq!(shown["next_fire_at"], "2026-01-01T00:12:00+00:00");
    assert_eq!(shown["status"], "active");
    let occurrences = sh.json(&["--json", "automations", "occurrences", ID, "--limit", "2"]);
    let items = occurrences["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["index"], 3);
    assert_eq!(items[0]["fired_at"], "2026-01-01T00:10:00+00:00");
    assert_eq!(occurrences["next_cursor"], "occ1:2");
    let listed = sh.json(&[
        "--now",
        "2026-01-01T00:11:00Z",
        "--json",
        "automations",
        "list",
    ]);
    assert_eq!(listed["items"][0]["automation_id"], ID);
    assert_eq!(listed["items"][0]["occurrence_count"], 3);
    // Human output names what it shows.
    let text = sh.run(&["--now", "2026-01-01T00:11:00Z", "automations", "list"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(ID) && text.contains("next 2026-01-01T00:12:00Z"),
        "{text}"
    );
}

/// A command is answered as the library answers it; a rejected one exits 1.
#[test]
fn commands_from_the_shell() {
    let sh = Shell::new();
    let request = memory_watch(sh.dir.path());
    sh.json(
        &[
            "--now",
            "2026-01-01T00:00:00Z",
            "automations",
            "create",
            "--request",
            &request,
        ]
        .iter()
        .copied()
        .chain(["--json"])
        .collect::<Vec<_>>(),
    );
    let out = sh.run(&[
        "--now",
        "2026-01-01T00:00:00Z",
        "--json",
        "automations",
        "command",
        ID,
        "explode",
        "--command-id",
        "c1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["status"], "rejected");
    assert_eq!(answer["error"]["reason_code"], "invalid_request");
    assert_eq!(answer["error"]["field"], "type");
    let pause = [
        "--now",
        "2026-01-01T00:01:00Z",
        "--json",
        "automations",
        "command",
        ID,
        "automation.pause",
        "--command-id",
        "p1",
    ];
    assert_eq!(
        sh.json(&pause),
        json!({"status": "applied", "duplicate": false})
    );
    assert_eq!(
        sh.json(&pause),
        json!({"status": "applied", "duplicate": true})
    );
    let stale = sh.run(&[
        "--json",
        "automations",
        "command",
        ID,
        "resume",
        "--command-id",
        "r1",
        "--expected-revision",
        "7",
    ]);
    assert_eq!(stale.status.code(), Some(1));
    let answer: Value = serde_json::from_slice(&stale.stdout).unwrap();
    assert_eq!(answer["error"]["reason_code"], "revision_conflict");
    // Without --command-id one is made up and printed; sent again with
    // it, the command is its own duplicate.
    let out = sh.run(&["--json", "automations", "command", ID, "resume"]);
    assert_eq!(out.status.code(), Some(0));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["duplicate"], false, "{answer}");
    let err = String::from_utf8_lossy(&out.stderr);
    let made = err
        .strip_prefix("command id: ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("{err}"));
    assert!(made.starts_with("cli-"), "{made}");
    assert_eq!(answer["command_id"], made, "{answer}");
    let again = sh.json(&[
        "--json",
        "automations",
        "command",
        ID,
        "resume",
        "--command-id",
        made,
    ]);
    assert_eq!(again["duplicate"], true, "{again}");
    // An unknown automation is an error naming its code.
    let missing = sh.run(&["--json", "automations", "show", "no-such-automation"]);
    assert_eq!(missing.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&missing.stderr).unwrap();
    assert_eq!(e["error"]["code"], "automation_not_found");
    // A malformed request names the field.
    let bad = sh.run(&[
        "--json",
        "automations",
        "create",
        "--request",
        r#"{"request_id": "x", "title": "t", "surprise": 1}"#,
    ]);
    assert_eq!(bad.status.code(), Some(1));
    let e: Value = serde_json::from_slice(&bad.stderr).unwrap();
    assert_eq!(e["error"]["code"], "invalid_definition");
    assert_eq!(e["error"]["field"], "surprise");
}

/// Commands from many processes at once, beside a driver process: every
/// command is recorded once, the same command id sent by two processes at
/// once is applied once (the other is its duplicate), every occurrence has
/// exactly one run per attempt, and the state's version counts exactly the
/// decisions in the ledger.
#[test]
fn commands_from_many_processes_beside_a_driver() {
    let sh = Shell::new();
    let request = json!({
        "request_id": "manual-race",
        "title": "Race",
        "target": {"workflow_id": "echo", "bundle_ref": "flows/automations/echo", "flow_id": "echo",
                   "input_data": {"prompt": "go"}},
        "trigger": {"source_id": "manual", "source_version": 1, "config": {}},
        "workspace_root": sh.dir.path().display().to_string(),
    })
    .to_string();
    let created = sh.json(&["--json", "automations", "create", "--request", &request]);
    let id = created["automation_id"].as_str().unwrap().to_string();
    let mut driver = sh
        .cmd(&["drive", "--interval-ms", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut procs = Vec::new();
    let sends: Vec<(String, &str)> = (0..6)
        .map(|i| (format!("run-{i}"), "run_now"))
        .chain([
            ("same".to_string(), "run_now"),
            ("same".to_string(), "run_now"),
            ("p1".to_string(), "pause"),
            ("q1".to_string(), "resume"),
        ])
        .collect();
    for (cid, kind) in &sends {
        procs.push((
            cid.clone(),
            sh.cmd(&[
                "--json",
                "automations",
                "command",
                &id,
                kind,
                "--command-id",
                cid,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        ));
    }
    let mut answers: Vec<(String, Value)> = Vec::new();
    for (cid, p) in procs {
        let out = p.wait_with_output().unwrap();
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{cid}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        answers.push((cid, answer));
    }
    // Let the driver finish whatever was admitted.
    let rt = open_runtime(&StoreSpec::Sqlite(sh.db()), &HostOptions::default()).unwrap();
    wait_for("the controller to park", Duration::from_secs(30), || {
        let run = rt.get_state(&id).unwrap();
        run.status == RunStatus::Waiting
            && run.waiting.as_ref().unwrap().wait_key.ends_with(":wake")
            && run.vars["_runtime"]["automation"]["pending_occurrence"].is_null()
            && run.vars["_runtime"]["automation"]["manual_pending"].is_null()
    });
    driver.kill().ok();
    driver.wait().ok();
    let same: Vec<&Value> = answers
        .iter()
        .filter(|(c, _)| c == "same")
        .map(|(_, a)| a)
        .collect();
    assert_eq!(
        same.iter().filter(|a| a["duplicate"] == false).count(),
        1,
        "{same:?}"
    );
    assert_eq!(same[0]["status"], same[1]["status"], "{same:?}");
    let ledger = rt.get_ledger(&id).unwrap();
    stepwell::store::verify_chain(&ledger).unwrap();
    let records = names(&ledger);
    assert_eq!(
        stepwell_tests::repeated_automation_keys(&ledger),
        Vec::<String>::new(),
        "every record key once"
    );
    let results = records
        .iter()
        .filter(|(n, _)| n == "automation.command_result")
        .count();
    assert_eq!(results, 9, "one command_result per command id");
    let decisions = records
        .iter()
        .filter(|(n, _)| {
            [
                "automation.command_result",
                "automation.admitted",
                "automation.dispatched",
                "automation.retry_scheduled",
                "automation.completed",
            ]
            .contains(&n.as_str())
        })
        .count();
    let run = rt.get_state(&id).unwrap();
    assert_eq!(
        run.vars["_runtime"]["automation"]["state_version"],
        json!(decisions)
    );
    let admitted: Vec<&Value> = records
        .iter()
        .filter(|(n, _)| n == "automation.admitted")
        .map(|(_, p)| p)
        .collect();
    let applied_runs = answers
        .iter()
        .filter(|(c, a)| c.starts_with("run-") && a["status"] == "applied")
        .count()
        + usize::from(same.iter().any(|a| a["status"] == "applied"));
    assert_eq!(
        admitted.len(),
        applied_runs,
        "one occurrence per applied run-now"
    );
    let children = rt
        .list_runs(&stepwell::RunQuery {
            parent_run_id: Some(id.clone()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(children.len(), admitted.len(), "one child per occurrence");
    for a in admitted {
        let child = rt.get_state(a["run_id"].as_str().unwrap()).unwrap();
        assert_eq!(child.status, RunStatus::Completed);
    }
    // Every rejection says why.
    for (cid, a) in &answers {
        if a["status"] == "rejected" {
            let code = a["error"]["reason_code"].as_str().unwrap();
            assert!(
                ["automation_busy", "invalid_state"].contains(&code),
                "{cid}: {a}"
            );
        }
    }
}

/// The README's automation session, run as written: every `$ stepwell`
/// line of the block, and the output it shows.
#[test]
fn the_readme_session_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = &readme[readme
        .find("## Automations")
        .expect("an Automations section")..];
    let start = section.find("```\n").unwrap() + 4;
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let sh = Shell::new();
    let mut lines = block.lines().peekable();
    let mut ran = 0;
    while let Some(line) = lines.next() {
        let command = line.strip_prefix("$ ").expect("a command line");
        let mut shown = Vec::new();
        while let Some(next) = lines.peek() {
            if next.starts_with("$ ") {
                break;
            }
            shown.push(lines.next().unwrap());
        }
        if command.starts_with("cat ") {
            std::fs::write(sh.dir.path().join("hourly.json"), shown.join("\n")).unwrap();
            continue;
        }
        // Drop a trailing `# comment`, then the program name.
        let command = command.split("  #").next().unwrap().trim();
        let request = format!("@{}", sh.dir.path().join("hourly.json").display());
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1)
            .map(|a| {
                if a == "@hourly.json" {
                    request.clone()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = sh.run(&args);
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            printed.trim_end().lines().collect::<Vec<_>>(),
            shown,
            "{command}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ran += 1;
    }
    assert!(ran >= 10, "{ran} commands");
}

/// A growing automation from the shell, its session's turns, and a
/// discussion about its third occurrence (`automations discuss`), with the
/// reference's reason codes for a bad request.
#[test]
fn a_growing_automation_and_a_discussion_from_the_shell() {
    let sh = Shell::new();
    let ws = sh.dir.path().join("automation-ws");
    let own = sh.dir.path().join("discussion-ws");
    std::fs::create_dir_all(&ws).unwrap();
    let request = json!({
        "request_id": "memory-chat", "title": "Memory watch",
        "target": {"workflow_id": "history", "bundle_ref": "flows/automations/history",
                   "flow_id": "history", "input_data": {"prompt": "check memory"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "2m"}},
        "context": {"mode": "growing"},
        "workspace_root": ws.display().to_string(),
    })
    .to_string();
    let created = sh.json(&[
        "--now",
        "2026-01-01T00:00:00Z",
        "--json",
        "automations",
        "create",
        "--request",
        &request,
    ]);
    let id = created["automation_id"].as_str().unwrap().to_string();
    for t in ["00:00:00", "00:02:00", "00:04:00"] {
        let now = format!("2026-01-01T{t}Z");
        sh.json(&["--now", &now, "--json", "drive", "--until-idle"]);
    }
    let session = format!("automation:{id}");
    let turns = sh.json(&["--json", "sessions", "turns", &session]);
    let answers: Vec<&str> = turns
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["answer"].as_str().unwrap())
        .collect();
    assert_eq!(answers.len(), 3, "{turns}");
    assert!(answers[0].ends_with("| history=0"));
    assert!(answers[2].ends_with("| history=4"), "{answers:?}");
    assert_eq!(turns[2]["occurrence_index"], 3);
    let history = sh.json(&["--json", "sessions", "history", &session]);
    assert_eq!(history["messages"].as_array().unwrap().len(), 6);
    assert_eq!(history["report"]["replayed_messages"], 6);
    let own_s = own.display().to_string();
    let discuss = |request_id: &str, prompt: &str, workspace: &str| {
        sh.run(&[
            "--json",
            "automations",
            "discuss",
            &id,
            "--occurrence",
            "3",
            "--request-id",
            request_id,
            "--prompt",
            prompt,
            "--workspace",
            workspace,
        ])
    };
    let out = discuss("d3", "Trend?", &own_s);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(d["session_kind"], "discussion");
    assert_eq!(d["status"], "completed");
    assert_eq!(
        d["output"],
        json!({"response": "echo:Trend? | history=6", "success": true})
    );
    assert_eq!(
        d["session_id"],
        json!(format!(
            "discussion-session:{}",
            d["run_id"].as_str().unwrap()
        ))
    );
    // Again: the same discussion.
    let again: Value = serde_json::from_slice(&discuss("d3", "Trend?", &own_s).stdout).unwrap();
    assert_eq!(again["run_id"], d["run_id"]);
    // The discussion goes on: a run in its session with its history,
    // anchored to its root (its workspace).
    let session_d = d["session_id"].as_str().unwrap();
    let next = sh.json(&[
        "--json",
        "run",
        "flows/automations/history",
        "--session",
        session_d,
        "--history",
        "--vars",
        r#"{"prompt": "And then?"}"#,
    ]);
    assert_eq!(next["output"]["response"], "echo:And then? | history=8");
    assert_eq!(next["session_id"], session_d);
    let later = sh.json(&["--json", "status", next["run_id"].as_str().unwrap()]);
    assert_eq!(later["vars"]["workspace_root"], json!(own_s));
    assert_eq!(
        later["vars"]["_meta"]["discussion"]["discussion_root_run_id"],
        d["run_id"]
    );
    // A run from the shell may not claim to be an occurrence.
    let forged = sh.run(&[
        "run",
        "flows/automations/history",
        "--vars",
        &json!({"prompt": "x", "_meta": {"occurrence": {"automation_id": id}}}).to_string(),
    ]);
    assert_eq!(forged.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&forged.stderr).contains("_meta.occurrence"));
    // A different prompt under the same id, the automation's own
    // workspace, a relative one: refused with the reference's codes.
    for (request_id, prompt, workspace, code, field) in [
        (
            "d3",
            "Other?",
            own_s.as_str(),
            "identity_conflict",
            "request_id",
        ),
        (
            "d4",
            "Trend?",
            &ws.display().to_string(),
            "invalid_request",
            "workspace_root",
        ),
        (
            "d5",
            "Trend?",
            "relative",
            "invalid_definition",
            "workspace_root",
        ),
    ] {
        let out = discuss(request_id, prompt, workspace);
        assert_eq!(out.status.code(), Some(1));
        let err: Value = serde_json::from_slice(&out.stderr).unwrap();
        assert_eq!(err["error"]["code"], code, "{err}");
        assert_eq!(err["error"]["field"], field, "{err}");
    }
    // A year later, retention deletes none of the growing automation's
    // occurrences (its history reads them) nor its discussions.
    let pruned = sh.json(&[
        "--now",
        "2027-01-01T00:00:00Z",
        "--json",
        "prune",
        "--retain",
        "completed=1d,failed=1d,cancelled=1d",
    ]);
    let trees = pruned["trees"].as_array().unwrap();
    assert!(
        trees.iter().all(|t| t["workflow_id"] != "history"),
        "{pruned}"
    );
    assert!(!pruned["kept"].as_array().unwrap().is_empty(), "{pruned}");
}

/// A host without the automations (a kernel-only embedder) driving the same
/// SQLite file as `stepwell` leaves the controller to it: it reports the
/// run as foreign, writes nothing to it (no deferral, no error), and the
/// `stepwell` process fires the occurrence at the due time, as if the other
/// host were not there.
#[test]
fn a_host_without_the_automations_leaves_their_controller_alone() {
    let sh = Shell::new();
    let request = memory_watch(sh.dir.path());
    let at = |t: &str| format!("2026-01-01T00:0{t}Z");
    let (t0, due) = (at("0:00"), at("2:30"));
    sh.json(&[
        "--now",
        &t0,
        "--json",
        "automations",
        "create",
        "--request",
        &request,
    ]);
    let report = sh.json(&["--now", &t0, "--json", "drive", "--until-idle"]);
    assert_eq!(report["errors"], json!([]), "{report}");
    // The other host: the bare kernel, in this test's process, at the time
    // the controller's wait falls due.
    let store = std::sync::Arc::new(stepwell::SqliteStore::open(sh.db()).unwrap());
    let clock = std::sync::Arc::new(stepwell::ManualClock::new(due.parse().unwrap()));
    let kernel = stepwell::Runtime::builder(store.clone())
        .clock(clock)
        .build()
        .unwrap();
    for i in 0..3 {
        let pass = kernel.drive_once().unwrap();
        assert_eq!(pass.errors, [], "{pass:?}");
        assert!(
            pass.due_resumed.is_empty() && pass.ticked.is_empty(),
            "{pass:?}"
        );
        // Met once, then listed past.
        let met: &[&str] = if i == 0 { &[ID] } else { &[] };
        assert_eq!(pass.foreign, met, "pass {i}: {pass:?}");
    }
    use stepwell::Store as _;
    assert_eq!(store.deferral(ID).unwrap(), None, "nothing set aside");
    let controller = sh.runtime().get_state(ID).unwrap();
    assert_eq!(controller.status, RunStatus::Waiting, "left as it was");
    // `stepwell` fires the occurrence at once.
    let report = sh.json(&["--now", &due, "--json", "drive", "--until-idle"]);
    assert_eq!(report["errors"], json!([]), "{report}");
    let runs = sh.json(&["--json", "list", "--workflow", "echo"]);
    // (`list` is newest first.)
    let created: Vec<&str> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["created_at"].as_str().unwrap())
        .collect();
    assert_eq!(
        created,
        ["2026-01-01T00:02:30.000000Z", "2026-01-01T00:00:00.000000Z"],
        "the second occurrence fired when due"
    );
    let shown = sh.json(&["--now", &due, "--json", "automations", "show", ID]);
    assert_eq!(shown["held"], Value::Null, "{shown}");
}

/// Retention and automations: an every-2m automation driven for twenty
/// minutes (`--now`), then `prune --retain completed=10m`: the occurrences
/// that ended more than ten minutes ago go (whole, with their ledgers),
/// the controller and the newer ones stay, the controller's ledger still
/// verifies, and the automation fires on as before. A growing automation's
/// occurrences stay (its history reads them).
#[test]
fn an_automation_loses_its_old_occurrences_to_retention_and_fires_on() {
    let sh = Shell::new();
    let at = minute;
    create_memory_watch(&sh);
    for m in (0..=20).step_by(2) {
        let report = drive_at(&sh, &at(m));
        assert_eq!(report["errors"], json!([]), "{report}");
    }
    let echo = |sh: &Shell| -> Vec<Value> {
        sh.json(&["--json", "list", "--workflow", "echo"])
            .as_array()
            .unwrap()
            .clone()
    };
    assert_eq!(echo(&sh).len(), 11);
    // Failed runs are kept a day: so is the controller's history (its
    // ledger is compacted by the longest span, see the next test), which
    // still names the occurrences whose runs went.
    let prune = ["prune", "--retain", "completed=10m,failed=1d"];
    let dry = sh.json(&[&["--now", &at(21), "--json"][..], &prune, &["--dry-run"]].concat());
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["trees"].as_array().unwrap().len(), 6, "{dry}");
    assert_eq!(echo(&sh).len(), 11, "a dry run deletes nothing");
    let done = sh.json(&[&["--now", &at(21), "--json"][..], &prune].concat());
    let trees = done["trees"].as_array().unwrap();
    assert_eq!(trees.len(), 6, "{done}");
    assert_eq!(done["compacted"], json!([]), "{done}");
    for t in trees {
        assert_eq!(t["workflow_id"], "echo", "{t}");
        assert!(
            t["ended_at"].as_str().unwrap() < "2026-01-01T00:11:00",
            "{t}"
        );
    }
    let left = echo(&sh);
    assert_eq!(left.len(), 5);
    assert!(left
        .iter()
        .all(|r| r["updated_at"].as_str().unwrap() >= "2026-01-01T00:12:00"));
    // The space goes back to the file system (nothing else is running).
    let vacuumed = sh.json(&["--json", "db", "vacuum"]);
    assert!(
        vacuumed["bytes_after"].as_u64().unwrap() <= vacuumed["bytes_before"].as_u64().unwrap(),
        "{vacuumed}"
    );
    // The controller stays, whole and verifiable, and fires on.
    let verified = sh.json(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(verified["ok"], true, "{verified}");
    let report = sh.json(&["--now", &at(22), "--json", "drive", "--until-idle"]);
    assert_eq!(report["errors"], json!([]), "{report}");
    assert_eq!(echo(&sh).len(), 6);
    let shown = sh.json(&["--now", &at(22), "--json", "automations", "show", ID]);
    assert_eq!(shown["status"], "active");
    assert_eq!(shown["next_fire_at"], "2026-01-01T00:24:00+00:00");
    // Nothing more goes at once: the rest is not old enough.
    let again = sh.json(&[&["--now", &at(22), "--json"][..], &prune].concat());
    assert_eq!(again["trees"], json!([]), "{again}");
    // A discussion of the latest occurrence still starts: the pruned ones
    // show in its timeline as deleted.
    let ws = tempfile::tempdir().unwrap();
    let discussed = sh.run(&[
        "--now",
        &at(22),
        "--json",
        "automations",
        "discuss",
        ID,
        "--occurrence",
        "12",
        "--request-id",
        "after-prune",
        "--prompt",
        "What happened?",
        "--workspace",
        ws.path().to_str().unwrap(),
    ]);
    assert!(
        discussed.status.code() != Some(1)
            || !String::from_utf8_lossy(&discussed.stderr).contains("history_unavailable"),
        "{}",
        String::from_utf8_lossy(&discussed.stderr)
    );
    let started: Value = serde_json::from_slice(&discussed.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&discussed.stderr)));
    let run_id = started["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"));
    let state = sh.json(&["--json", "status", run_id]).to_string();
    assert!(state.contains("was deleted by retention"), "{state}");
}

/// The keyed records of a ledger: (seq, key).
fn keyed(sh: &Shell, id: &str) -> Vec<(u64, String)> {
    let rt = sh.runtime();
    let mut out = Vec::new();
    for page in rt.ledger_pages(id, 0) {
        for (seq, r) in page.unwrap() {
            if let Some(k) = r.idempotency_key {
                out.push((seq, k));
            }
        }
    }
    out
}

/// Retention compacts a long-lived controller's ledger: `prune --retain
/// completed=10m` at 00:21 replaces the records older than ten minutes by
/// a checkpoint (archived first), `ledger --verify` proves the rest to the
/// same head, a command repeated under an old id is answered as before
/// (its result rides in the checkpoint), and the automation fires on; a
/// second prune compacts again, counting on.
#[test]
fn a_controllers_ledger_is_compacted_behind_a_checkpoint_and_still_verifies() {
    let sh = Shell::new();
    let at = minute;
    create_memory_watch(&sh);
    let command = |m: u32, kind: &str, id: &str| {
        let out = sh.run(&[
            "--now",
            &at(m),
            "--json",
            "automations",
            "command",
            ID,
            kind,
            "--command-id",
            id,
        ]);
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    for m in (0..=20).step_by(2) {
        if m == 4 {
            assert_eq!(command(4, "automation.pause", "p1")["status"], "applied");
            assert_eq!(command(4, "automation.resume", "r1")["status"], "applied");
        }
        let report = drive_at(&sh, &at(m));
        assert_eq!(report["errors"], json!([]), "{report}");
    }
    let before = sh.json(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(before["ok"], true, "{before}");
    assert_eq!(before["checkpoint"], Value::Null);
    let dir = tempfile::tempdir().unwrap();
    let prune = |m: u32, extra: &[&str]| {
        let now = at(m);
        let mut args = vec![
            "--now",
            &now,
            "--json",
            "prune",
            "--retain",
            "completed=10m",
        ];
        args.extend_from_slice(extra);
        sh.json(&args)
    };
    let dry = prune(21, &["--dry-run"]);
    let would = &dry["compacted"][0];
    assert_eq!(would["run_id"], ID, "{dry}");
    assert_eq!(
        sh.json(&["--json", "ledger", ID, "--verify"]),
        before,
        "a dry run compacts nothing"
    );

    let done = prune(21, &["--archive", dir.path().to_str().unwrap()]);
    let compacted = done["compacted"].as_array().unwrap();
    assert_eq!(compacted.len(), 1, "{done}");
    let c = &compacted[0];
    assert_eq!(c, would, "the dry run said what would go");
    let through = c["through_seq"].as_u64().unwrap();
    let replaced = c["records"].as_u64().unwrap();
    assert_eq!(
        replaced, through,
        "the first compaction replaces every record up to it"
    );
    assert!(
        c["carried"].as_u64().unwrap() >= 2,
        "{c}: p1 and r1 ride along"
    );

    let after = sh.json(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(after["ok"], true, "{after}");
    // The checkpoint and its seal, which follows the old head.
    assert_eq!(
        after["records"].as_u64().unwrap(),
        before["records"].as_u64().unwrap() - replaced + 2
    );
    let checkpoint = &after["checkpoint"];
    assert_eq!(checkpoint["through_seq"], through);
    assert_eq!(checkpoint["replaced_records"], replaced);
    // Nothing replaced was newer than ten minutes before the prune.
    let records = sh.json(&["--json", "ledger", ID]);
    let first = &records[0];
    assert_eq!(first["status"], "checkpoint", "{first}");
    let seal = records.as_array().unwrap().last().unwrap();
    assert_eq!(seal["step_id"], format!("sealed:checkpoint:{through}"));
    assert_eq!(seal["prev_hash"], before["head"], "{seal}");
    assert_eq!(after["head"], seal["record_hash"]);
    let kept_from = records[1]["started_at"].as_str().unwrap();
    assert!(kept_from > "2026-01-01T00:10:00", "{kept_from}");

    // The archive: the replaced records as stored, chained, ending on the
    // hash the checkpoint names.
    // (Beside the archives of the occurrences pruned.)
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with(&format!("{ID}-ledger-{through}-")) && name.ends_with(".jsonl"),
        "{name}"
    );
    let archived: Vec<StepRecord> = std::fs::read_to_string(&files[0])
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(archived.len() as u64, replaced);
    let head = stepwell::store::verify_chain(&archived).unwrap();
    assert_eq!(head.as_deref(), checkpoint["replaced_head"].as_str());

    // The compacted commands are still known by their ids.
    assert_eq!(
        command(22, "automation.pause", "p1"),
        json!({"status": "applied", "duplicate": true})
    );
    let conflict = command(22, "automation.archive", "r1");
    assert_eq!(
        conflict["error"]["reason_code"], "identity_conflict",
        "{conflict}"
    );
    let shown = sh.json(&["--now", &at(22), "--json", "automations", "show", ID]);
    assert_eq!(
        shown["status"], "active",
        "the repeated pause changed nothing"
    );

    // It fires on; a later prune compacts again, counting on.
    let echo = |sh: &Shell| {
        sh.json(&["--json", "list", "--workflow", "echo"])
            .as_array()
            .unwrap()
            .len()
    };
    let fired = echo(&sh);
    for m in [22, 24, 26, 28] {
        let report = drive_at(&sh, &at(m));
        assert_eq!(report["errors"], json!([]), "{report}");
    }
    assert!(echo(&sh) > fired);
    let again = prune(29, &[]);
    let c2 = &again["compacted"][0];
    assert!(c2["through_seq"].as_u64().unwrap() > through, "{again}");
    let last = sh.json(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(last["ok"], true, "{last}");
    assert_eq!(
        last["checkpoint"]["replaced_records"].as_u64().unwrap(),
        replaced + c2["records"].as_u64().unwrap(),
        "{last} {c2}"
    );
    assert_eq!(
        command(29, "automation.pause", "p1")["duplicate"],
        true,
        "carried on by the second checkpoint"
    );

    // Left alone, the controller's ledger settles: a prune compacts what
    // it had kept as last, the next finds only seals to replace.
    let later = |m: u32| {
        let now = format!("2026-01-01T01:{m:02}:00Z");
        let args = [
            "--now",
            &now,
            "--json",
            "prune",
            "--retain",
            "completed=10m",
        ];
        sh.json(&args)["compacted"].as_array().unwrap().len()
    };
    assert_eq!(later(0), 1);
    assert!(later(1) <= 1);
    assert_eq!(later(2), 0, "only seals left to replace");
    let settled = sh.json(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(settled["ok"], true, "{settled}");

    // A checkpoint changed by hand (here: what it carries, its hash made
    // to match) is one no seal names: the chain breaks there.
    let conn = rusqlite::Connection::open(sh.db()).unwrap();
    let (seq, data): (i64, String) = conn
        .query_row(
            "SELECT seq, data FROM ledger WHERE run_id = ?1 ORDER BY seq LIMIT 1",
            [ID],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let real: StepRecord = serde_json::from_str(&data).unwrap();
    let mut body = stepwell::store::compaction::checkpoint_body(&real).unwrap();
    body.carried.clear();
    let forged = stepwell::store::compaction::checkpoint_record(ID, &body);
    conn.execute(
        "UPDATE ledger SET data = ?3, hash = ?4 WHERE run_id = ?1 AND seq = ?2",
        rusqlite::params![
            ID,
            seq,
            serde_json::to_string(&forged).unwrap(),
            forged.record_hash
        ],
    )
    .unwrap();
    let out = sh.run(&["--json", "ledger", ID, "--verify"]);
    assert_eq!(out.status.code(), Some(1));
    let verdict: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        verdict["break"]["problem"], "unsealed checkpoint",
        "{verdict}"
    );
}

/// What an automation still needs stays: an occurrence waiting on a person
/// for longer than the policy keeps its records from its admission on,
/// whatever their age, and completes after the prune.
#[test]
fn compaction_keeps_the_records_of_the_occurrence_in_progress() {
    let sh = Shell::new();
    let id = created_at(&sh, "2026-01-01T00:00:00Z", &hourly_ask(&sh, "ask-hourly"));
    for h in 0..6 {
        let now = format!("2026-01-01T{h:02}:00:00Z");
        let report = sh.json(&["--now", &now, "--json", "drive", "--until-idle"]);
        assert_eq!(report["errors"], json!([]), "{report}");
    }
    let admitted = format!("automation:admitted:{id}:1");
    let seq_of = |sh: &Shell| {
        keyed(sh, &id)
            .into_iter()
            .find(|(_, k)| *k == admitted)
            .map(|(s, _)| s)
    };
    let at = seq_of(&sh).expect("occurrence 1 was admitted");
    let pruned = sh.json(&[
        "--now",
        "2026-01-02T00:00:00Z",
        "--json",
        "prune",
        "--retain",
        "completed=1h",
    ]);
    // What came before the admission goes (the controller's start, its
    // first wait); the admission and everything after it stay.
    let c = &pruned["compacted"][0];
    assert_eq!(c["run_id"], json!(id), "{pruned}");
    assert_eq!(c["through_seq"].as_u64().unwrap(), at - 1, "{pruned}");
    assert_eq!(seq_of(&sh), Some(at), "the admission stays, at its seq");
    let verified = sh.json(&["--json", "ledger", &id, "--verify"]);
    assert_eq!(verified["ok"], true, "{verified}");
    // The person answers; the occurrence completes and is recorded.
    let waiting = sh.json(&["--json", "list", "--workflow", "ask", "--status", "waiting"]);
    let run = waiting[0]["run_id"].as_str().unwrap().to_string();
    let done = sh.json(&[
        "--now",
        "2026-01-02T00:00:01Z",
        "--json",
        "resume",
        &run,
        "--payload",
        r#"{"text": "Fine"}"#,
    ]);
    assert_eq!(done["status"], "completed", "{done}");
    let report = sh.json(&[
        "--now",
        "2026-01-02T00:00:02Z",
        "--json",
        "drive",
        "--until-idle",
    ]);
    assert_eq!(report["errors"], json!([]), "{report}");
    let completed = format!("automation:completed:{id}:1");
    assert!(
        keyed(&sh, &id).iter().any(|(_, k)| *k == completed),
        "occurrence 1 completed"
    );
}

/// A controller ledger row that cannot be read stops its compaction only:
/// the prune deletes the old occurrences, says why the ledger stays, and
/// the next prune says the same (a driver's policy keeps running).
#[test]
fn an_unreadable_ledger_row_stops_only_its_compaction() {
    let sh = Shell::new();
    let at = minute;
    create_memory_watch(&sh);
    for m in (0..=8).step_by(2) {
        drive_at(&sh, &at(m));
    }
    let conn = rusqlite::Connection::open(sh.db()).unwrap();
    conn.execute(
        "UPDATE ledger SET data = '{' WHERE run_id = ?1 AND seq = 5",
        [ID],
    )
    .unwrap();
    drop(conn);
    for _ in 0..2 {
        let pruned = sh.json(&[
            "--now",
            &at(30),
            "--json",
            "prune",
            "--retain",
            "completed=10m",
        ]);
        assert_eq!(pruned["compacted"], json!([]), "{pruned}");
        let kept = pruned["kept"].to_string();
        assert!(
            kept.contains(ID) && kept.contains("store_corrupt"),
            "{pruned}"
        );
    }
}

/// An occurrence whose run waits on a person reads as waiting in the text
/// listing (the controller's JSON keeps `running`, as the reference's).
#[test]
fn an_occurrence_waiting_on_a_person_is_shown_waiting() {
    let sh = Shell::new();
    let id = created_at(&sh, "2026-01-01T00:00:00Z", &hourly_ask(&sh, "ask-once"));
    let now = ["--now", "2026-01-01T00:00:00Z"];
    let report = sh.json(&[now[0], now[1], "--json", "drive", "--until-idle"]);
    assert_eq!(report["errors"], json!([]), "{report}");
    let page = sh.json(&["--json", "automations", "occurrences", &id]);
    assert_eq!(page["items"][0]["status"], "running", "{page}");
    let out = sh.run(&["automations", "occurrences", &id]);
    let text = String::from_utf8(out.stdout).unwrap();
    let first = text.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("#1  waiting (user)  1 attempt  fired 2026-01-01T00:00:00Z  run "),
        "{text}"
    );
}

/// The creation request of an hourly automation of the `ask` example
/// (each occurrence waits on a person) in `sh`'s folder.
fn hourly_ask(sh: &Shell, request_id: &str) -> String {
    json!({
        "request_id": request_id, "title": "Ask",
        "target": {"workflow_id": "ask", "bundle_ref": repo().join("flows/automations/ask").display().to_string(),
                   "flow_id": "ask", "input_data": {"prompt": "How are you?"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
        "workspace_root": sh.dir.path().display().to_string(),
    })
    .to_string()
}

/// Creates the automation `request` asks for, with the clock at `now`;
/// its id.
fn created_at(sh: &Shell, now: &str, request: &str) -> String {
    let created = sh.json(&[
        "--now",
        now,
        "--json",
        "automations",
        "create",
        "--request",
        request,
    ]);
    created["automation_id"].as_str().unwrap().to_string()
}

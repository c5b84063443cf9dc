//! A guest naming run ids it does not own (attacks-369e311, F3): a
//! sandboxed node asks for `start_subworkflow` children under ids the host
//! derives for others (an automation's controller, its occurrences, another
//! run's default child). A named child lives under its parent, so none of
//! them is taken; and an id taken anyway (by a caller of the API who chose
//! it) is recognised by the automation layer, which never touches a run it
//! did not start.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use serde_json::{json, Value};
use stepwell::automation::{automation_id, occurrence_run_id, OccurrenceKind};
use stepwell::effects::subworkflow::{default_child_id, named_child_id};
use stepwell::{ManualClock, RunQuery, RunStatus, RuntimeConfig, StartOptions};
use stepwell_tests::shell::{output_text, Shell};
use stepwell_tests::world::{at_time, World, T0};
use stepwell_tests::{component, repo, write_bundle, Backend, Host};

/// A store driven by the `stepwell` binary, one process per command.
/// `drive --until-idle` at `now`; asserts it met no error.
fn drive(sh: &Shell, now: &str) {
    let report = sh.json(&["--json", "--now", now, "drive", "--until-idle"]);
    assert_eq!(report["errors"], json!([]), "drive at {now}: {report}");
}

/// Creates the automation of `request` at `now`.
fn create(sh: &Shell, request: &Value, now: &str) -> Output {
    let request = request.to_string();
    sh.run(&[
        "--json",
        "--now",
        now,
        "automations",
        "create",
        "--request",
        &request,
    ])
}

const T1: &str = "2026-01-01T00:00:00Z";

/// An hourly automation of the `echo` target, created as `request_id`.
fn hourly_echo(request_id: &str, workspace: &Path, policy: Option<Value>) -> Value {
    let mut r = json!({
        "request_id": request_id,
        "title": request_id,
        "target": {"workflow_id": "echo", "bundle_ref": "flows/automations/echo", "flow_id": "echo",
                   "input_data": {"prompt": "hi"}},
        "trigger": {"source_id": "schedule", "source_version": 1,
                    "config": {"start_at": T1, "every": "1h"}},
        "workspace_root": workspace.display().to_string(),
    });
    if let Some(p) = policy {
        r["policy"] = p;
    }
    r
}

fn scheduled(automation: &str, index: u64, attempt: u32) -> String {
    occurrence_run_id(
        automation,
        OccurrenceKind::Scheduled { revision: 1, index },
        attempt,
    )
}

/// The attacker's bundle: its guest (`hostile.wasm`, mode `effect`) asks,
/// node after node, for an async `start_subworkflow` child under each of
/// `ids`; the child waits on a person for ever.
fn squatter_bundle(root: &Path, ids: &[String]) -> PathBuf {
    let hostile = component("runaway/hostile.wasm");
    let mut nodes = serde_json::Map::new();
    for (k, id) in ids.iter().enumerate() {
        let next = if k + 1 < ids.len() {
            format!("g{}", k + 1)
        } else {
            "done".into()
        };
        nodes.insert(
            format!("g{k}"),
            json!({"component": hostile, "next": next, "config": {"mode": "effect", "patch": {},
                   "effect": {"kind": "start_subworkflow",
                              "payload": {"workflow_id": "squat.child", "run_id": id, "async": true},
                              "result_key": format!("r{k}")}}}),
        );
    }
    nodes.insert("done".into(), json!({"complete": {"ok": true}}));
    write_bundle(
        root,
        "squat",
        &[
            (
                "flow.json",
                json!({"workflow_id": "squat", "entry": "g0", "nodes": nodes}),
            ),
            (
                "child.flow.json",
                json!({"workflow_id": "squat.child", "entry": "w",
                       "nodes": {"w": {"effect": "ask_user", "payload": {"prompt": "squatting"}}}}),
            ),
        ],
    )
}

/// The issue's attack, with real processes: a guest starts children under
/// an automation's future controller id, another automation's first three
/// occurrence ids and another run's default child id. Each child is
/// confined under the attacker's run; both automations are created and run
/// their occurrences, and the other run's subworkflow completes.
#[test]
fn a_guest_cannot_take_ids_the_host_derives_for_others() {
    let sh = Shell::new();
    let nightly = automation_id("local", "local", "nightly");
    let nightly2 = automation_id("local", "local", "nightly2");
    let victim_child = default_child_id("victim:1");
    let mut targets = vec![nightly.clone()];
    targets.extend((1..=3).map(|i| scheduled(&nightly2, i, 1)));
    targets.push(victim_child.clone());
    let bundle = squatter_bundle(sh.dir.path(), &targets);

    let attacker = sh.json(&[
        "--json",
        "run",
        bundle.to_str().unwrap(),
        "--run-id",
        "attacker",
    ]);
    assert_eq!(attacker["status"], "completed", "{attacker}");
    drive(&sh, T1);
    let rt = sh.runtime();
    for (k, id) in targets.iter().enumerate() {
        let confined = named_child_id("attacker", id);
        assert_eq!(
            attacker["vars"][format!("r{k}")]["sub_run_id"],
            json!(confined),
            "{attacker}"
        );
        let child = rt.get_state(&confined).unwrap();
        assert_eq!(child.parent_run_id.as_deref(), Some("attacker"));
        assert_eq!(child.status, RunStatus::Waiting);
        assert!(
            !sh.run(&["status", id]).status.success(),
            "{id} was taken: {}",
            output_text(&sh.run(&["status", id]))
        );
        println!("asked for {id} -> child {confined} (parent attacker)");
    }

    // The automations created afterwards work.
    let ws = sh.dir.path().join("ws");
    let out = create(&sh, &hourly_echo("nightly", &ws, None), T1);
    assert!(out.status.success(), "{}", output_text(&out));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        created,
        json!({"automation_id": nightly, "revision": 1, "created": true})
    );
    let out = create(&sh, &hourly_echo("nightly2", &ws, None), T1);
    assert!(out.status.success(), "{}", output_text(&out));
    for now in [T1, "2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"] {
        drive(&sh, now);
    }
    for (id, count) in [(&nightly, 3), (&nightly2, 3)] {
        let shown = sh.json(&[
            "--json",
            "--now",
            "2026-01-01T02:00:00Z",
            "automations",
            "show",
            id,
        ]);
        assert_eq!(shown["status"], "active", "{shown}");
        assert_eq!(shown["current_occurrence"], Value::Null, "{shown}");
        assert_eq!(shown["state"]["scheduled_count"], count, "{shown}");
        let page = sh.json(&["--json", "automations", "occurrences", id]);
        let items = page["items"].as_array().unwrap();
        assert_eq!(items.len(), count as usize, "{page}");
        for item in items {
            assert_eq!(item["status"], "completed", "{item}");
        }
        println!(
            "automation {id}: {} occurrences, statuses {:?}",
            items.len(),
            items
                .iter()
                .map(|i| i["status"].as_str().unwrap())
                .collect::<Vec<_>>()
        );
    }
    for i in 1..=3 {
        let occurrence = rt.get_state(&scheduled(&nightly2, i, 1)).unwrap();
        assert_eq!(occurrence.parent_run_id.as_deref(), Some(nightly2.as_str()));
        assert_eq!(occurrence.status, RunStatus::Completed);
    }

    // The other run's default subworkflow completes.
    let example = repo().join("flows/examples/subworkflow");
    let victim = sh.json(&[
        "--json",
        "run",
        example.to_str().unwrap(),
        "--run-id",
        "victim",
        "--vars",
        r#"{"text":"hi"}"#,
    ]);
    assert_eq!(victim["status"], "completed", "{victim}");
    assert_eq!(victim["output"], json!({"shouted": "HI"}));
    assert_eq!(victim["vars"]["child"]["sub_run_id"], json!(victim_child));
    println!(
        "victim: {} output {} (child {victim_child})",
        victim["status"], victim["output"]
    );
}

/// An automation id taken by a run a caller of the API started under it is
/// named as such: `identity_conflict` on `request_id`, saying the id is
/// held by a run that is not an automation, and that run is untouched.
#[test]
fn an_automation_id_taken_by_another_run_is_named_as_such() {
    let sh = Shell::new();
    let id = automation_id("local", "local", "taken");
    let ask = repo().join("flows/examples/ask-user");
    let squatter = sh.json(&["--json", "run", ask.to_str().unwrap(), "--run-id", &id]);
    assert_eq!(squatter["status"], "waiting");
    let out = create(
        &sh,
        &hourly_echo("taken", &sh.dir.path().join("ws"), None),
        T1,
    );
    assert!(!out.status.success());
    let said = output_text(&out);
    assert!(said.contains("identity_conflict"), "{said}");
    assert!(said.contains("request_id"), "{said}");
    assert!(
        said.contains(&format!(
            "the automation id {id} is taken by a run that is not an automation (a root run, workflow ask-user)"
        )),
        "{said}"
    );
    println!("create 'taken': {}", said.trim());
    let after = sh.json(&["--json", "status", &id]);
    assert_eq!(after["status"], "waiting", "{after}");
    // Another request id gives another automation.
    let out = create(
        &sh,
        &hourly_echo("not-taken", &sh.dir.path().join("ws"), None),
        T1,
    );
    assert!(out.status.success(), "{}", output_text(&out));
}

/// Occurrence ids taken by runs a caller of the API started under them:
/// the controller does not wait on them. Without retries the occurrence
/// fails with `identity_conflict` (its failure attention item says so) and
/// the next one runs; with retries the next attempt runs under its own
/// fresh id. The squatting runs are never cancelled or resumed.
#[test]
fn a_taken_occurrence_id_fails_that_attempt_and_never_wedges_the_automation() {
    let sh = Shell::new();
    let ws = sh.dir.path().join("ws");
    let once = automation_id("local", "local", "once");
    let retried = automation_id("local", "local", "retried");
    let ask = repo().join("flows/examples/ask-user");
    let taken = [scheduled(&once, 1, 1), scheduled(&retried, 1, 1)];
    for id in &taken {
        let squatter = sh.json(&["--json", "run", ask.to_str().unwrap(), "--run-id", id]);
        assert_eq!(squatter["status"], "waiting");
    }
    let no_retry = json!({"retry": {"max_attempts": 1}});
    let retry = json!({"retry": {"max_attempts": 2, "backoff": {"initial": "1m"}}});
    for r in [
        hourly_echo("once", &ws, Some(no_retry)),
        hourly_echo("retried", &ws, Some(retry)),
    ] {
        let out = create(&sh, &r, T1);
        assert!(out.status.success(), "{}", output_text(&out));
    }
    for now in [T1, "2026-01-01T00:02:00Z", "2026-01-01T01:00:00Z"] {
        drive(&sh, now);
    }

    let page = sh.json(&["--json", "automations", "occurrences", &once]);
    let statuses: Vec<(i64, &str)> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["index"].as_i64().unwrap(), i["status"].as_str().unwrap()))
        .collect();
    assert_eq!(statuses, [(2, "completed"), (1, "failed")], "{page}");
    let attention = sh.json(&["--json", "automations", "attention", &once]);
    let failure = &attention["items"][0];
    assert_eq!(failure["kind"], "failure", "{attention}");
    assert_eq!(failure["run_id"], json!(taken[0]), "{attention}");
    let body = failure["body"].as_str().unwrap();
    assert!(
        body.starts_with(&format!(
            "identity_conflict: the occurrence's run id {} is taken by another run (a root run, workflow ask-user), not started by automation {once}",
            taken[0]
        )),
        "{body}"
    );
    println!("'once' attention: {body}");

    let page = sh.json(&["--json", "automations", "occurrences", &retried]);
    let first = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["index"] == 1)
        .unwrap()
        .clone();
    let fresh = scheduled(&retried, 1, 2);
    assert_eq!(first["status"], "completed", "{page}");
    assert_eq!(first["attempts"], 2, "{page}");
    assert_eq!(first["run_id"], json!(fresh), "{page}");
    println!("'retried' occurrence 1: attempt 2 completed under fresh id {fresh}");

    let rt = sh.runtime();
    for id in &taken {
        let squatter = rt.get_state(id).unwrap();
        assert_eq!(squatter.status, RunStatus::Waiting, "{id} was touched");
        assert_eq!(squatter.parent_run_id, None);
    }
}

/// `stop_current` while the dispatched attempt's id is held by a run the
/// controller did not start: that run is not cancelled, and the attempt
/// ends `cancelled` (the stop) all the same.
#[test]
fn stop_current_never_cancels_a_run_the_controller_did_not_start() {
    // One step a tick, to stop the controller between the start of its
    // attempt and the read of that attempt's outcome.
    let clock = Arc::new(ManualClock::new(at_time(T0)));
    let config = RuntimeConfig {
        max_steps_per_tick: 1,
        ..RuntimeConfig::default()
    };
    let w = World {
        h: Host::with_config(Backend::Sqlite, clock.clone(), config),
        clock,
    };
    let id = automation_id("local", "local", "memory-watch");
    let taken = scheduled(&id, 1, 1);
    let ask = w.h.load("ask-user");
    w.rt()
        .start(
            &ask,
            StartOptions {
                run_id: Some(taken.clone()),
                ..StartOptions::default()
            },
        )
        .unwrap();
    w.rt().tick(&taken).unwrap();
    assert_eq!(w.create(json!({})), id);
    let mut stopped_at = None;
    for _ in 0..200 {
        let run = w.rt().tick(&id).unwrap();
        let pending = &run.vars["_runtime"]["automation"]["pending_occurrence"];
        if run.current_node.as_deref() == Some("record_outcome") && pending["phase"] == "dispatched"
        {
            stopped_at = Some(run.current_node.clone());
            break;
        }
    }
    assert!(
        stopped_at.is_some(),
        "the controller never started its attempt"
    );
    let answer = w.cmd(&id, "s1", "stop_current", T0);
    assert_eq!(answer["status"], "applied", "{answer}");
    assert_eq!(
        w.rt().get_state(&taken).unwrap().status,
        RunStatus::Waiting,
        "stop_current cancelled a run its controller did not start"
    );
    w.drive(&id);
    let completed = w.records(&id, "automation.completed");
    assert_eq!(completed.len(), 1, "{completed:?}");
    assert_eq!(completed[0]["status"], "cancelled", "{completed:?}");
    assert_eq!(w.rt().get_state(&taken).unwrap().status, RunStatus::Waiting);
    assert!(w
        .rt()
        .list_runs(&RunQuery {
            parent_run_id: Some(id.clone()),
            ..RunQuery::default()
        })
        .unwrap()
        .is_empty());
}

/// A guest cannot plant a child in a session the host keeps (a
/// discussion's, whose id it can compute, or an automation's): the step
/// fails with `invalid_effect` naming `session_id`, and no run joins the
/// session. A child in a session of its own naming is fine.
#[test]
fn a_guest_cannot_plant_runs_in_the_host_s_sessions() {
    let sh = Shell::new();
    let hostile = component("runaway/hostile.wasm");
    // Each case its own workflow ids: a store keeps one bundle per id.
    let node = |name: &str, session: &str| {
        json!({"component": hostile, "config": {"mode": "effect", "patch": {},
               "effect": {"kind": "start_subworkflow",
                          "payload": {"workflow_id": format!("{name}.child"), "session_id": session, "async": true},
                          "result_key": "r"}}})
    };
    let child = |name: &str| {
        json!({"workflow_id": format!("{name}.child"), "entry": "w",
               "nodes": {"w": {"effect": "ask_user", "payload": {"prompt": "planted"}}}})
    };
    for (name, session, planted) in [
        (
            "disc",
            "discussion-session:0b8a3f7e-6a0a-5d6b-9a43-1f5c3b1e2d4c",
            false,
        ),
        (
            "auto",
            "automation:0b8a3f7e-6a0a-5d6b-9a43-1f5c3b1e2d4c",
            false,
        ),
        ("own", "my-own-session", true),
    ] {
        let flow = json!({"workflow_id": name, "entry": "g", "nodes": {"g": node(name, session)}});
        let bundle = write_bundle(
            sh.dir.path(),
            name,
            &[("flow.json", flow), ("child.flow.json", child(name))],
        );
        let out = sh.run(&["--json", "run", bundle.to_str().unwrap()]);
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        let joined = sh.runtime().list_runs(&RunQuery::default()).unwrap();
        let in_session = joined
            .iter()
            .filter(|r| r.session_id.as_deref() == Some(session))
            .count();
        if planted {
            assert_eq!(in_session, 1, "{run}");
        } else {
            assert_eq!(run["status"], "failed", "{run}");
            let error = run["error"].as_str().unwrap_or_default();
            assert!(
                error.starts_with("invalid_effect") && error.contains("session_id"),
                "{error}"
            );
            assert_eq!(in_session, 0, "{session}: {joined:?}");
        }
    }
}

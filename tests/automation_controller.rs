//! The automation controller end to end: the embedded controller flow (its
//! WASM nodes and host effects) driving real occurrence runs of the
//! example targets (`flows/automations/`), on real stores. Where the
//! reference implementation (abstractruntime 0.13.0) ran the same
//! scenario (tests/fixtures/automation-ledgers.json), every automation
//! record, every view and every query page must be the reference's.

#[path = "plugin_invariants.rs"]
mod plugin_invariants;

use std::path::PathBuf;
use std::sync::Arc;
use stepwell::tools::ToolsExt;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use stepwell::automation::{
    apply_automation_command, create_automation, drive_until_idle, list_attention,
    list_occurrences, show_automation, Command,
};
use stepwell::{ManualClock, RunStatus, Runtime};
use stepwell_tests::{repo, store_tests, Backend, Host};

const T0: &str = "2026-01-01T00:00:00Z";

fn at(t: &str) -> DateTime<Utc> {
    t.parse().unwrap()
}

fn fixture(name: &str) -> Value {
    let path = repo().join("tests/fixtures").join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn target_dir(workflow: &str) -> PathBuf {
    repo()
        .join("flows/automations")
        .join(workflow)
        .canonicalize()
        .unwrap()
}

/// The reference harness's creation request (title "Memory watch", a 2m
/// grid from T0, workspace /tmp/automation-ws), for our target bundle.
fn request(request_id: &str, workflow: &str, input: Value) -> Value {
    json!({
        "request_id": request_id,
        "title": "Memory watch",
        "target": {"workflow_id": workflow, "bundle_ref": target_dir(workflow).display().to_string(),
                   "flow_id": workflow, "input_data": input},
        "trigger": {"source_id": "schedule", "source_version": 1,
                    "config": {"start_at": "2026-01-01T00:00:00+00:00", "every": "2m"}},
        "workspace_root": "/tmp/automation-ws",
    })
}

/// `value` with what differs by construction between the reference's run
/// and ours replaced: the target's bundle (a bundle id there, our
/// directory here), the tool grant's candidates (AbstractCore's tool table
/// there, stepwell's here: `grant`, every tool of the host's table, none of
/// which sends messages) and the harness echo's ` | history=<n>` suffix.
fn normalized(value: &Value, workflow: &str, grant: &[String]) -> Value {
    let text = value
        .to_string()
        .replace(
            "\"fixtures@1.0.0\"",
            &json!(target_dir(workflow).display().to_string()).to_string(),
        )
        .replace(" | history=0", "");
    let mut v: Value = serde_json::from_str(&text).unwrap();
    fn walk(v: &mut Value, grant: &[String]) {
        match v {
            Value::Object(m) => {
                if let Some(tools) = m.get_mut("auto_approve_tools") {
                    *tools = json!(grant);
                }
                m.values_mut().for_each(|v| walk(v, grant));
            }
            Value::Array(a) => a.iter_mut().for_each(|v| walk(v, grant)),
            _ => {}
        }
    }
    walk(&mut v, grant);
    v
}

/// Every tool of `rt`'s table, sorted: what an `auto` grant pre-approves.
fn table_grant(rt: &Runtime) -> Vec<String> {
    let mut names: Vec<String> = rt
        .tools()
        .unwrap()
        .specs()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    names.sort();
    names
}

/// A record as compared: without the hash chain's fields, and without
/// fields that are null (stepwell leaves them out of a record).
fn comparable(record: &Value) -> Value {
    let mut r = record.clone();
    if let Some(m) = r.as_object_mut() {
        for k in ["prev_hash", "record_hash", "hash"] {
            m.remove(k);
        }
        m.retain(|_, v| !v.is_null());
        if let Some(Value::Object(e)) = m.get_mut("effect") {
            e.retain(|_, v| !v.is_null());
        }
    }
    r
}

fn automation_records(rt: &Runtime, id: &str) -> Vec<Value> {
    rt.get_ledger(id)
        .unwrap()
        .iter()
        .filter(|r| {
            r.idempotency_key
                .as_deref()
                .is_some_and(|k| k.starts_with("automation:"))
        })
        .map(|r| comparable(&serde_json::to_value(r).unwrap()))
        .collect()
}

/// Another runtime on `h`'s store that also loads the plugin trigger
/// sources of `flows/triggers/plugins` (`cron@1`).
fn plugin_runtime(h: &Host, clock: &Arc<ManualClock>) -> Runtime {
    stepwell::builder(h.store.clone())
        .engine(h.rt.engine().clone())
        .clock(clock.clone() as Arc<dyn stepwell::Clock>)
        .plugin(Arc::new(
            stepwell::triggers::Triggers::new().dir(repo().join("flows/triggers/plugins")),
        ))
        .build()
        .unwrap()
}

/// How many occurrences automation `id` has had.
fn occurrence_count(rt: &Runtime, id: &str) -> usize {
    list_occurrences(rt, id, None, 50).unwrap()["items"]
        .as_array()
        .unwrap()
        .len()
}

fn host(b: Backend, clock: &Arc<ManualClock>) -> Host {
    Host::with_clock(b, clock.clone())
}

/// Replays the reference's scenarios (create at T0, drive, then move the
/// clock and drive again at each time) and compares everything.
fn reference_scenarios(b: Backend) {
    let cases = fixture("automation-ledgers");
    let setups = [
        (
            "memory-watch",
            "echo",
            json!({"prompt": "check memory", "notify": true}),
        ),
        ("flaky-1", "flaky", json!({"prompt": "p", "fail_until": 2})),
        ("flaky-2", "flaky", json!({"prompt": "p", "fail_until": 9})),
    ];
    for (case, (request_id, workflow, input)) in cases.as_array().unwrap().iter().zip(setups) {
        let name = case["name"].as_str().unwrap();
        let clock = Arc::new(ManualClock::new(at(T0)));
        let h = host(b, &clock);
        let grant = table_grant(&h.rt);
        let created =
            create_automation(&h.rt, &request(request_id, workflow, input), at(T0), None).unwrap();
        assert_eq!(created.automation_id, case["automation_id"], "{name}");
        let id = created.automation_id.as_str();
        drive_until_idle(&h.rt, 100).unwrap();
        let views = case["views"].as_array().unwrap();
        for (i, view) in views.iter().enumerate() {
            let now = at(view["now"].as_str().unwrap());
            if i > 0 {
                clock.set(now);
                drive_until_idle(&h.rt, 100).unwrap();
            }
            let ours = show_automation(&h.rt, id, now).unwrap();
            assert_eq!(
                ours,
                normalized(&view["get_automation"], workflow, &grant),
                "{name}: get_automation at {now}"
            );
            let run = h.rt.get_state(id).unwrap();
            assert_eq!(
                run.status.as_str(),
                view["run"]["status"],
                "{name}: controller status at {now}"
            );
            let waiting = run
                .waiting
                .as_ref()
                .map(|w| (w.wait_key.clone(), w.until.clone()));
            let theirs = &view["run"]["waiting"];
            let expected = (!theirs.is_null()).then(|| {
                (
                    theirs["wait_key"].as_str().unwrap().to_string(),
                    theirs["until"].as_str().map(str::to_string),
                )
            });
            assert_eq!(waiting, expected, "{name}: the controller's wait at {now}");
        }
        let ours = automation_records(&h.rt, id);
        let theirs: Vec<Value> = case["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["idempotency_key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("automation:"))
            })
            .map(|r| comparable(&normalized(r, workflow, &grant)))
            .collect();
        assert_eq!(ours.len(), theirs.len(), "{name}: record count");
        for (o, t) in ours.iter().zip(&theirs) {
            assert_eq!(o, t, "{name}: record {}", t["step_id"]);
        }
        for q in case["occurrences"].as_array().unwrap() {
            let query = &q["query"];
            let page = list_occurrences(
                &h.rt,
                id,
                query["cursor"].as_str(),
                query["limit"].as_i64().unwrap_or(50),
            )
            .unwrap();
            assert_eq!(
                page,
                normalized(&q["page"], workflow, &grant),
                "{name}: occurrences {query}"
            );
        }
        for q in case["attention"].as_array().unwrap() {
            let query = &q["query"];
            let page = list_attention(
                &h.rt,
                id,
                query["after_seq"].as_i64().unwrap_or(0),
                query["cursor"].as_str(),
                query["limit"].as_i64().unwrap_or(50),
            )
            .unwrap();
            assert_eq!(
                page,
                normalized(&q["page"], workflow, &grant),
                "{name}: attention {query}"
            );
        }
    }
}

store_tests!(reference_scenarios);

fn command(rt: &Runtime, id: &str, kind: &str, command_id: &str, now: &str) -> Value {
    apply_automation_command(
        rt,
        &Command {
            automation_id: id,
            command_id,
            command_type: kind,
            ..Command::default()
        },
        at(now),
    )
    .unwrap()
}

#[test]
fn a_creation_replayed_returns_the_same_automation_and_a_changed_one_conflicts() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let req = request("same", "echo", json!({"prompt": "x"}));
    let first = create_automation(&h.rt, &req, at(T0), None).unwrap();
    assert!(first.created);
    let again = create_automation(&h.rt, &req, at("2026-01-01T05:00:00Z"), None).unwrap();
    assert_eq!(again.automation_id, first.automation_id);
    assert!(!again.created);
    assert_eq!(again.revision, 1);
    let created = automation_records(&h.rt, &first.automation_id);
    assert_eq!(created.len(), 1, "one automation.created");
    let shown = show_automation(&h.rt, &first.automation_id, at(T0)).unwrap();
    assert_eq!(
        shown["definition"]["created_at"],
        "2026-01-01T00:00:00+00:00"
    );
    let mut changed = req.clone();
    changed["title"] = json!("Another title");
    let e = create_automation(&h.rt, &changed, at(T0), None).unwrap_err();
    assert_eq!(e.reason_code(), "identity_conflict");
    assert!(e.to_string().contains("request_id"), "{e}");
    // Nothing was written by the refused creation.
    assert_eq!(automation_records(&h.rt, &first.automation_id).len(), 1);
}

#[test]
fn a_target_that_is_neither_a_bundle_nor_known_is_refused_naming_the_field() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    let mut req = request("nowhere", "echo", json!({}));
    req["target"]["bundle_ref"] = json!("/no/such/bundle");
    req["target"]["workflow_id"] = json!("not-loaded");
    let e = create_automation(&h.rt, &req, at(T0), None).unwrap_err();
    assert_eq!(e.reason_code(), "invalid_definition");
    assert!(e.to_string().contains("target.bundle_ref"), "{e}");
    let mut req = request("wrong-workflow", "echo", json!({}));
    req["target"]["workflow_id"] = json!("flaky");
    let e = create_automation(&h.rt, &req, at(T0), None).unwrap_err();
    assert!(e.to_string().contains("target.workflow_id"), "{e}");
    assert!(h.rt.list_runs(&Default::default()).unwrap().is_empty());
}

/// Spec 8 #18: hourly; pause at 00:10, nothing fires at 03:30; resume at
/// 03:30 parks until 04:00 and records `next_fire_at`; at 04:00 the second
/// occurrence runs.
#[test]
fn pause_and_resume_never_catch_up() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let mut req = request("hourly", "echo", json!({"prompt": "x"}));
    req["trigger"]["config"] = json!({"start_at": "2026-01-01T00:00:00Z", "every": "1h"});
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    clock.set(at("2026-01-01T00:10:00Z"));
    let a = command(&h.rt, &id, "pause", "p1", "2026-01-01T00:10:00Z");
    assert_eq!(a, json!({"status": "applied", "duplicate": false}));
    drive_until_idle(&h.rt, 100).unwrap();
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(run.waiting.as_ref().unwrap().until, None);
    clock.set(at("2026-01-01T03:30:00Z"));
    drive_until_idle(&h.rt, 100).unwrap();
    let shown = show_automation(&h.rt, &id, at("2026-01-01T03:30:00Z")).unwrap();
    assert_eq!(shown["status"], "paused");
    assert_eq!(shown["state"]["next_index"], 2, "one child only");
    let a = command(
        &h.rt,
        &id,
        "automation.resume",
        "r1",
        "2026-01-01T03:30:00Z",
    );
    assert_eq!(a["status"], "applied");
    drive_until_idle(&h.rt, 100).unwrap();
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(
        run.waiting.as_ref().unwrap().until.as_deref(),
        Some("2026-01-01T04:00:00+00:00")
    );
    let resumed: Vec<Value> = automation_records(&h.rt, &id)
        .into_iter()
        .filter(|r| r["effect"]["payload"]["name"] == "automation.resumed")
        .collect();
    assert_eq!(
        resumed[0]["effect"]["payload"]["payload"]["next_fire_at"],
        "2026-01-01T04:00:00+00:00"
    );
    clock.set(at("2026-01-01T04:00:00Z"));
    drive_until_idle(&h.rt, 100).unwrap();
    let page = list_occurrences(&h.rt, &id, None, 50).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    assert_eq!(page["items"][0]["fired_at"], "2026-01-01T04:00:00+00:00");
}

/// Spec 8 #19, #21, #22: run now while paused (the manual occurrence id,
/// the manual envelope, still paused), duplicates and reused command ids.
#[test]
fn run_now_while_paused_and_command_idempotency() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let id = create_automation(
        &h.rt,
        &request("run-now", "echo", json!({"prompt": "x"})),
        at(T0),
        None,
    )
    .unwrap()
    .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    assert_eq!(
        command(&h.rt, &id, "pause", "same", "2026-01-01T00:01:00Z"),
        json!({"status": "applied", "duplicate": false})
    );
    assert_eq!(
        command(&h.rt, &id, "pause", "same", "2026-01-01T00:01:00Z"),
        json!({"status": "applied", "duplicate": true})
    );
    // The same id for another command: refused, nothing recorded.
    let before = automation_records(&h.rt, &id).len();
    let a = command(&h.rt, &id, "archive", "same", "2026-01-01T00:01:00Z");
    assert_eq!(a["status"], "rejected");
    assert_eq!(a["error"]["reason_code"], "identity_conflict");
    assert_eq!(a["error"]["field"], "command_id");
    assert_eq!(a["duplicate"], false);
    assert_eq!(automation_records(&h.rt, &id).len(), before);
    clock.set(at("2026-01-01T00:06:00Z"));
    let a = command(&h.rt, &id, "run_now", "run-1", "2026-01-01T00:06:00Z");
    assert_eq!(a["status"], "applied");
    drive_until_idle(&h.rt, 100).unwrap();
    let manual = stepwell::automation::occurrence_run_id(
        &id,
        stepwell::automation::OccurrenceKind::Manual {
            command_id: "run-1",
        },
        1,
    );
    let child = h.rt.get_state(&manual).unwrap();
    assert_eq!(child.status, RunStatus::Completed);
    let envelope = &child.vars["_meta"]["occurrence"]["trigger_envelope"];
    assert_eq!(envelope["source_id"], "manual");
    assert_eq!(envelope["event_id"], "manual:run-1");
    assert!(child.vars["prompt"].as_str().unwrap().starts_with(
        "[Trigger manual@1 \u{b7} occurrence 2 \u{b7} fired 2026-01-01T00:06:00+00:00]\n"
    ));
    let shown = show_automation(&h.rt, &id, at("2026-01-01T00:06:00Z")).unwrap();
    assert_eq!(shown["state"]["paused"], true);
    assert_eq!(shown["state"]["manual_pending"], Value::Null);
    assert_eq!(shown["state"]["scheduled_count"], 1);
    // An unknown type is answered, not raised.
    let a = command(&h.rt, &id, "explode", "x1", "2026-01-01T00:06:00Z");
    assert_eq!(a["error"]["reason_code"], "invalid_request");
    assert_eq!(a["error"]["field"], "type");
}

/// Spec 8 #25: stop_current on an occurrence that waits on a person
/// cancels its run; the occurrence completes `cancelled` without an
/// attention item; a second stop is `invalid_state`.
#[test]
fn stop_current_cancels_the_occurrence_run() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let id = create_automation(&h.rt, &request("ask-1", "ask", json!({})), at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    let shown = show_automation(&h.rt, &id, at(T0)).unwrap();
    assert_eq!(shown["current_occurrence"]["status"], "running");
    let child_id = shown["current_occurrence"]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let child = h.rt.get_state(&child_id).unwrap();
    assert_eq!(child.status, RunStatus::Waiting);
    let a = command(&h.rt, &id, "stop_current", "s1", "2026-01-01T00:00:10Z");
    assert_eq!(a["status"], "applied");
    drive_until_idle(&h.rt, 100).unwrap();
    assert_eq!(
        h.rt.get_state(&child_id).unwrap().status,
        RunStatus::Cancelled
    );
    let page = list_occurrences(&h.rt, &id, None, 50).unwrap();
    assert_eq!(page["items"][0]["status"], "cancelled");
    assert_eq!(page["items"][0]["attention"], Value::Null);
    let shown = show_automation(&h.rt, &id, at("2026-01-01T00:00:10Z")).unwrap();
    assert_eq!(shown["state"]["pending_occurrence"], Value::Null);
    let a = command(&h.rt, &id, "stop_current", "s2", "2026-01-01T00:00:20Z");
    assert_eq!(a["error"]["reason_code"], "invalid_state");
}

/// Spec 8 #29, #30: archive ends the controller once its occurrence is
/// answered; commands on an archived automation are `invalid_state`;
/// unarchive revives it paused, resume re-arms it.
#[test]
fn archive_and_unarchive() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let mut req = request("archive-1", "ask", json!({}));
    req["trigger"]["config"] = json!({"start_at": "2026-01-01T00:00:00Z", "every": "1h"});
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    let child = show_automation(&h.rt, &id, at(T0)).unwrap()["current_occurrence"]["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        command(&h.rt, &id, "archive", "a1", "2026-01-01T00:01:00Z")["status"],
        "applied"
    );
    h.rt.resume(&child, &format!("ask:{child}"), json!({"response": "yes"}))
        .or_else(|_| {
            let key = h.rt.get_state(&child).unwrap().waiting.unwrap().wait_key;
            h.rt.resume(&child, &key, json!({"response": "yes"}))
        })
        .unwrap();
    drive_until_idle(&h.rt, 100).unwrap();
    let shown = show_automation(&h.rt, &id, at("2026-01-01T00:02:00Z")).unwrap();
    assert_eq!(shown["status"], "archived");
    assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Completed);
    let archived: Vec<Value> = automation_records(&h.rt, &id)
        .into_iter()
        .filter(|r| r["effect"]["payload"]["name"] == "automation.archived")
        .collect();
    assert_eq!(
        archived[0]["effect"]["payload"]["payload"]["active_occurrence_run_id"],
        json!(child)
    );
    for (kind, cid) in [
        ("pause", "x1"),
        ("resume", "x2"),
        ("run_now", "x3"),
        ("stop_current", "x4"),
    ] {
        let a = command(&h.rt, &id, kind, cid, "2026-01-01T00:03:00Z");
        assert_eq!(a["error"]["reason_code"], "invalid_state", "{kind}");
    }
    clock.set(at("2026-01-01T00:20:00Z"));
    let a = command(&h.rt, &id, "unarchive", "u1", "2026-01-01T00:20:00Z");
    assert_eq!(a, json!({"status": "applied", "duplicate": false}));
    drive_until_idle(&h.rt, 100).unwrap();
    let shown = show_automation(&h.rt, &id, at("2026-01-01T00:20:00Z")).unwrap();
    assert_eq!(shown["status"], "paused");
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(run.status, RunStatus::Waiting);
    assert_eq!(run.waiting.as_ref().unwrap().until, None);
    clock.set(at("2026-01-01T00:30:00Z"));
    command(&h.rt, &id, "resume", "r1", "2026-01-01T00:30:00Z");
    drive_until_idle(&h.rt, 100).unwrap();
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(
        run.waiting.as_ref().unwrap().until.as_deref(),
        Some("2026-01-01T01:00:00+00:00")
    );
}

/// Spec 8 #13: a one-shot schedule parks until its time, fires once, and
/// the controller completes.
#[test]
fn a_one_shot_fires_once_and_the_controller_completes() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Memory, &clock);
    let mut req = request("once", "echo", json!({"prompt": "x"}));
    req["trigger"]["config"] = json!({"start_at": "2026-01-01T01:00:00Z"});
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(
        run.waiting.as_ref().unwrap().until.as_deref(),
        Some("2026-01-01T01:00:00+00:00")
    );
    clock.set(at("2026-01-01T01:00:05Z"));
    drive_until_idle(&h.rt, 100).unwrap();
    assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Completed);
    let shown = show_automation(&h.rt, &id, at("2026-01-01T01:00:05Z")).unwrap();
    assert_eq!(shown["status"], "completed");
    assert_eq!(occurrence_count(&h.rt, &id), 1);
}

/// The controller loops for as long as the automation lives: the limit on
/// node steps counts the steps since the run last waited, and the
/// controller waits between its loops.
#[test]
fn a_controller_outlives_the_node_step_limit() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let config = stepwell::RuntimeConfig {
        max_node_visits: 30,
        ..Default::default()
    };
    let h = Host::with_config(Backend::Memory, clock.clone(), config);
    let id = create_automation(
        &h.rt,
        &request("long-lived", "echo", json!({"prompt": "x"})),
        at(T0),
        None,
    )
    .unwrap()
    .automation_id;
    for minute in (0..=40).step_by(2) {
        clock.set(at(T0) + chrono::Duration::minutes(minute));
        drive_until_idle(&h.rt, 100).unwrap();
    }
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(run.status, RunStatus::Waiting, "{:?}", run.error);
    assert!(run.vars["_runtime"]["node_visits"].as_u64().unwrap() > 100);
    assert_eq!(occurrence_count(&h.rt, &id), 21);
}

/// No bundle may define the controller's workflow: its host effects
/// would otherwise run under a flow the host did not write.
#[test]
fn the_controller_workflow_id_is_reserved() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    let dir = stepwell_tests::write_bundle(
        h.dir.path(),
        "impostor",
        &[(
            "flow.json",
            json!({"workflow_id": stepwell::automation::CONTROLLER_WORKFLOW_ID, "entry": "end",
                   "nodes": {"end": {"complete": {"ended": true}}}}),
        )],
    );
    let e = h.rt.load_bundle(&dir).unwrap_err();
    assert_eq!(e.reason_code(), "invalid_definition");
    assert!(e.to_string().contains("reserved"), "{e}");
}

/// A flow that asks for a controller effect gets `invalid_effect`: the
/// effects act only on the controller's own state.
#[test]
fn controller_effects_refuse_other_workflows() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    for (i, kind) in stepwell::automation::decisions::protocol::EFFECTS
        .iter()
        .enumerate()
    {
        let workflow = format!("borrower{i}");
        let dir = stepwell_tests::write_bundle(
            h.dir.path(),
            &workflow,
            &[(
                "flow.json",
                json!({"workflow_id": workflow, "entry": "take",
                       "nodes": {"take": {"effect": kind, "next": "end"},
                                 "end": {"complete": {"ok": true}}}}),
            )],
        );
        h.rt.load_bundle(&dir).unwrap();
        let run = h.rt.run(&workflow, Default::default()).unwrap();
        assert_eq!(run.status, RunStatus::Failed, "{kind}");
        let error = run.error.unwrap();
        assert!(
            error.starts_with("invalid_effect") && error.contains("automation controller"),
            "{kind}: {error}"
        );
    }
}

/// One workflow id names one bundle per store: an automation whose bundle
/// re-defines another bundle's workflow id is refused, so it cannot change
/// the code another automation's occurrences run.
#[test]
fn a_bundle_cannot_take_over_another_bundles_workflow() {
    let h = host(Backend::Sqlite, &Arc::new(ManualClock::new(at(T0))));
    create_automation(
        &h.rt,
        &request("a", "echo", json!({"prompt": "x"})),
        at(T0),
        None,
    )
    .unwrap();
    let evil = stepwell_tests::write_bundle(
        h.dir.path(),
        "evil",
        &[(
            "flow.json",
            json!({"workflow_id": "echo", "entry": "end", "nodes": {"end": {"complete": {"owned": true}}}}),
        )],
    );
    let mut b = request("b", "echo", json!({"prompt": "x"}));
    b["target"]["bundle_ref"] = json!(evil.display().to_string());
    let e = create_automation(&h.rt, &b, at(T0), None).unwrap_err();
    assert_eq!(e.reason_code(), "invalid_definition");
    let text = e.to_string();
    assert!(
        text.contains("target.bundle_ref") && text.contains("already defined by the bundle"),
        "{text}"
    );
    // Nothing was deployed: echo's latest version is still its own.
    let latest = h.store.workflow_version("echo", None).unwrap().unwrap();
    assert_eq!(latest.version, 1);
    assert_eq!(
        latest.source.as_deref(),
        Some(target_dir("echo").to_str().unwrap())
    );
}

/// Inputs are bounded, and the controller is no target.
#[test]
fn oversized_inputs_and_the_controller_as_target_are_refused() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    let big = "x".repeat(stepwell::automation::MAX_INPUT_DATA_BYTES);
    let e = create_automation(
        &h.rt,
        &request("big", "echo", json!({"prompt": big})),
        at(T0),
        None,
    )
    .unwrap_err();
    assert!(e.to_string().contains("target.input_data"), "{e}");
    let mut req = request("self", "echo", json!({}));
    req["target"]["workflow_id"] = json!(stepwell::automation::CONTROLLER_WORKFLOW_ID);
    let e = create_automation(&h.rt, &req, at(T0), None).unwrap_err();
    assert!(e.to_string().contains("target.workflow_id"), "{e}");
    assert!(h.rt.list_runs(&Default::default()).unwrap().is_empty());
}

/// A step of the controller that fails (here: over the runtime's state
/// budget) does not fail the automation: the controller stays at its node,
/// the driver reports it, and a host with room goes on from there.
#[test]
fn a_failing_controller_step_leaves_the_controller_at_its_node() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let tight = stepwell::RuntimeConfig {
        max_state_bytes: 24 << 10,
        ..Default::default()
    };
    let h = Host::with_config(Backend::Sqlite, clock.clone(), tight);
    let id = create_automation(
        &h.rt,
        &request("tight", "echo", json!({"prompt": "y".repeat(16 << 10)})),
        at(T0),
        None,
    )
    .unwrap()
    .automation_id;
    let report = drive_until_idle(&h.rt, 100).unwrap();
    assert!(
        report.errors.iter().any(|e| e.run_id == id
            && e.error.contains("controller_seam")
            && e.error.contains("state_too_large")),
        "{report:?}"
    );
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(run.status, RunStatus::Running, "{:?}", run.error);
    // The operator sees why: in the view and in the list.
    let shown = stepwell::automation::show_automation(&h.rt, &id, at(T0)).unwrap();
    let held = &shown["held"];
    assert!(
        held["error"].as_str().unwrap().contains("state_too_large"),
        "{shown}"
    );
    assert_eq!(held["failures"], 1, "{held}");
    assert!(held["retry_at"].is_string(), "{held}");
    let listed = stepwell::automation::list_automations(&h.rt, None, None, 10, at(T0)).unwrap();
    assert_eq!(listed["items"][0]["held"], *held, "{listed}");
    // Another host on the same store, with the default budget.
    let roomy = h.runtime(Some(clock.clone()), Default::default());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    drive_until_idle(&roomy, 100).unwrap();
    let page = list_occurrences(&roomy, &id, None, 50).unwrap();
    assert_eq!(page["items"][0]["status"], "completed", "{page}");
    // Moving again ends the hold.
    let shown = stepwell::automation::show_automation(&roomy, &id, at(T0)).unwrap();
    assert!(shown.get("held").is_none(), "{shown}");
}

/// The automation id reads tenant and user as the reference does:
/// `str(value or "local")`.
#[test]
fn ids_from_any_tenant_value_are_the_references() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    for (tenant, expected) in [
        (json!(0), "e3d8cf62-a62a-54d9-bdf8-807016bf8f75"),
        (json!(true), "c2bdf8e1-6153-5ba7-af92-31335e06700c"),
        (json!({"a": 1}), "cd8e7c8f-7528-5ef7-a0cd-e819a78a5ddd"),
        (json!(1.5), "7f69dba2-bc30-54c6-8af5-2bb86c78eb38"),
        (json!("x"), "61f63e3e-dde6-5b2b-bc0a-1bc9a4c61bb9"),
        (json!([1, "a"]), "4aba8f4b-eb08-5f97-b589-dadcb48eff1c"),
    ] {
        let mut req = request("r", "echo", json!({}));
        req["tenant"] = tenant.clone();
        match create_automation(&h.rt, &req, at(T0), None) {
            Ok(c) => assert_eq!(c.automation_id, expected, "{tenant}"),
            Err(e) => panic!("{tenant}: {e}"),
        }
    }
}

/// A creation replayed after its target bundle moved still finds its
/// automation; a command payload that is not an object is refused.
#[test]
fn a_replayed_creation_survives_a_moved_bundle() {
    let h = host(Backend::Sqlite, &Arc::new(ManualClock::new(at(T0))));
    let copy = h.dir.path().join("echo-copy");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["flow.json", "steps.wasm"] {
        std::fs::copy(target_dir("echo").join(f), copy.join(f)).unwrap();
    }
    let mut req = request("moved", "echo", json!({"prompt": "x"}));
    req["target"]["bundle_ref"] = json!(copy.display().to_string());
    let first = create_automation(&h.rt, &req, at(T0), None).unwrap();
    std::fs::rename(&copy, h.dir.path().join("elsewhere")).unwrap();
    let again = create_automation(&h.rt, &req, at(T0), None).unwrap();
    assert_eq!(again.automation_id, first.automation_id);
    assert!(!again.created);
    for payload in [json!([]), json!("text"), json!(3)] {
        let a = apply_automation_command(
            &h.rt,
            &Command {
                automation_id: &first.automation_id,
                command_id: "c1",
                command_type: "pause",
                payload: Some(&payload),
                ..Command::default()
            },
            at(T0),
        )
        .unwrap();
        assert_eq!(a["error"]["reason_code"], "invalid_request", "{payload}");
        assert_eq!(a["error"]["field"], "payload");
    }
    assert_eq!(automation_records(&h.rt, &first.automation_id).len(), 1);
}

/// A plugin trigger source drives an automation like a built-in one: the
/// `cron@1` plugin's own state is kept in `source_state` and handed back
/// to it; an occurrence fires at the tick's time.
#[test]
fn a_plugin_trigger_source_drives_an_automation() {
    let clock = Arc::new(ManualClock::new(at("2026-12-01T07:00:00Z")));
    let h = host(Backend::Sqlite, &clock);
    let rt = plugin_runtime(&h, &clock);
    let mut req = request("cron", "echo", json!({"prompt": "x"}));
    req["trigger"] = json!({"source_id": "cron", "source_version": 1,
        "config": {"expression": "0 9 * * 1-5", "timezone": "Europe/Paris"}});
    let id = create_automation(&rt, &req, at("2026-12-01T07:00:00Z"), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&rt, 100).unwrap();
    let run = rt.get_state(&id).unwrap();
    assert_eq!(
        run.waiting.as_ref().unwrap().until.as_deref(),
        Some("2026-12-01T08:00:00+00:00")
    );
    clock.set(at("2026-12-01T08:00:30Z"));
    drive_until_idle(&rt, 100).unwrap();
    let page = list_occurrences(&rt, &id, None, 50).unwrap();
    assert_eq!(page["items"][0]["status"], "completed", "{page}");
    assert_eq!(page["items"][0]["fired_at"], "2026-12-01T08:00:00+00:00");
    let shown = show_automation(&rt, &id, at("2026-12-01T08:00:30Z")).unwrap();
    assert_eq!(
        shown["state"]["source_state"],
        json!({"admitted": 1, "next_at": "2026-12-02T08:00:00Z", "next_tick": 1})
    );
    assert_eq!(shown["next_fire_at"], "2026-12-02T08:00:00+00:00");
}

/// A database of schema 4 (before the ledger's key index) gets the index
/// when it is opened (key lookups name it), and the column of a held run's
/// reason (schema 6).
#[test]
fn a_schema_4_database_gets_the_key_index() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    drop(stepwell::SqliteStore::open(&db).unwrap());
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "DROP INDEX ledger_keyed; ALTER TABLE runs DROP COLUMN defer_reason;
             PRAGMA user_version = 4;",
        )
        .unwrap();
    }
    let clock = Arc::new(ManualClock::new(at(T0)));
    let store: Arc<dyn stepwell::Store> = Arc::new(stepwell::SqliteStore::open(&db).unwrap());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .clock(clock as Arc<dyn stepwell::Clock>)
        .build()
        .unwrap();
    let id = create_automation(&rt, &request("upgraded", "echo", json!({})), at(T0), None)
        .unwrap()
        .automation_id;
    assert_eq!(
        command(&rt, &id, "pause", "p1", "2026-01-01T00:00:01Z")["status"],
        "applied"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, stepwell::store::SQLITE_SCHEMA_VERSION);
    let has_reason: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'defer_reason'")
        .unwrap()
        .exists([])
        .unwrap();
    assert!(has_reason, "the deferral reason column is added");
}

/// A revision from schedule@1 to a plugin source starts the trigger state
/// afresh (shared keys at their initial values), and a plugin source that
/// runs out is noted exhausted.
#[test]
fn a_revision_to_a_plugin_source_starts_afresh() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let rt = plugin_runtime(&h, &clock);
    let mut req = request("to-cron", "echo", json!({"prompt": "x"}));
    req["trigger"]["config"] = json!({"start_at": T0, "every": "1h"});
    let id = create_automation(&rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&rt, 100).unwrap();
    let a = apply_automation_command(
        &rt,
        &Command {
            automation_id: &id,
            command_id: "r1",
            command_type: "revise",
            payload: Some(
                &json!({"changes": {"trigger": {"source_id": "cron", "source_version": 1,
                "config": {"expression": "0 * * * *", "count": 1}}}}),
            ),
            ..Command::default()
        },
        at(T0),
    )
    .unwrap();
    assert_eq!(a["status"], "applied", "{a}");
    let state = show_automation(&rt, &id, at(T0)).unwrap()["state"].clone();
    assert_eq!(
        (
            &state["tick"],
            &state["scheduled_count"],
            &state["exhausted"]
        ),
        (&json!(0), &json!(0), &json!(false))
    );
    clock.set(at("2026-01-01T01:00:10Z"));
    drive_until_idle(&rt, 100).unwrap();
    clock.set(at("2026-01-01T03:00:10Z"));
    drive_until_idle(&rt, 100).unwrap();
    let shown = show_automation(&rt, &id, at("2026-01-01T03:00:10Z")).unwrap();
    assert_eq!(occurrence_count(&rt, &id), 2);
    assert_eq!(shown["status"], "completed", "{shown}");
    assert_eq!(shown["state"]["exhausted"], true);
    // A host without the plugin still lists every automation, the one it
    // cannot read with why.
    let mut req = request("cron-active", "echo", json!({"prompt": "x"}));
    req["trigger"] = json!({"source_id": "cron", "source_version": 1,
                            "config": {"expression": "0 * * * *"}});
    create_automation(&rt, &req, at("2026-01-01T03:00:10Z"), None).unwrap();
    let listed =
        stepwell::automation::list_automations(&h.rt, None, None, 50, at("2026-01-01T03:00:10Z"))
            .unwrap();
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{listed}");
    assert_eq!(
        items[0]["error"]["reason_code"], "unknown_trigger_source",
        "{listed}"
    );
    // ... and shows it, without a next firing, saying why.
    let cron_id = items[0]["automation_id"].as_str().unwrap();
    let shown = show_automation(&h.rt, cron_id, at("2026-01-01T03:00:10Z")).unwrap();
    assert_eq!(shown["next_fire_at"], Value::Null, "{shown}");
    assert_eq!(shown["error"]["reason_code"], "unknown_trigger_source");
    assert_eq!(shown["definition"]["trigger"]["source_id"], "cron");
}

/// Deploying another directory that defines an id is a new version of
/// it (an operator's explicit act); an automation's bundle may take an id
/// over only from a directory that no longer defines it.
#[test]
fn another_bundle_of_an_id_is_a_new_version_of_it() {
    let h = host(Backend::Sqlite, &Arc::new(ManualClock::new(at(T0))));
    let flow = |id: &str| json!({"workflow_id": id, "entry": "end", "nodes": {"end": {"complete": {"ok": true}}}});
    let x = stepwell_tests::write_bundle(h.dir.path(), "x", &[("flow.json", flow("xw"))]);
    h.rt.load_bundle(&x).unwrap();
    let y = stepwell_tests::write_bundle(
        h.dir.path(),
        "y",
        &[(
            "flow.json",
            json!({"workflow_id": "xw", "entry": "end", "nodes": {"end": {"complete": {"ok": 2}}}}),
        )],
    );
    let d = h.rt.deploy(&y, None).unwrap();
    assert_eq!(d.workflows[0].version.version, 2);
    let latest = h.store.workflow_version("xw", None).unwrap().unwrap();
    assert_eq!(latest.source.as_deref(), Some(y.to_str().unwrap()));
}

/// A command that lands between a node's question to the host and its
/// decision makes the node ask again: a trigger revised while a `prepare`
/// answer of the old trigger waits is not parked on by the old deadline.
#[test]
fn an_answer_asked_before_a_command_is_asked_again() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let one_step = stepwell::RuntimeConfig {
        max_steps_per_tick: 1,
        ..Default::default()
    };
    let h = Host::with_config(Backend::Sqlite, clock.clone(), one_step);
    let mut req = request("stale", "echo", json!({"prompt": "x"}));
    req["trigger"]["config"] = json!({"start_at": "2026-01-01T00:05:00Z", "every": "1m"});
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    // start, read_definition, then wait asks the trigger's prepare.
    let mut run = h.rt.get_state(&id).unwrap();
    for _ in 0..3 {
        run = h.rt.tick(&id).unwrap();
    }
    assert_eq!(run.current_node.as_deref(), Some("wait"));
    let facts = &run.vars["_automation_facts"];
    assert_eq!(facts["answer"]["op"], "prepare", "{facts}");
    assert_eq!(
        facts["answer"]["wait"]["until"], "2026-01-01T00:05:00+00:00",
        "{facts}"
    );
    let revised = apply_automation_command(
        &h.rt,
        &Command {
            automation_id: &id,
            command_id: "later",
            command_type: "revise",
            payload: Some(&json!({"changes": {"trigger": {"source_id": "schedule",
                "source_version": 1, "config": {"start_at": "2026-01-01T03:00:00Z", "every": "1h"}}}})),
            ..Command::default()
        },
        at(T0),
    )
    .unwrap();
    assert_eq!(revised["status"], "applied", "{revised}");
    drive_until_idle(&h.rt, 100).unwrap();
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(
        run.waiting.as_ref().unwrap().until.as_deref(),
        Some("2026-01-01T03:00:00+00:00"),
        "parked by the revised trigger, not by the old answer"
    );
    assert!(
        run.vars.get("_automation_facts").is_none(),
        "the answer is dropped"
    );
}

/// A controller's data budget counts from its last wait: an automation
/// whose inputs are large fires for as long as it lives.
#[test]
fn a_controller_with_large_inputs_outlives_the_data_budget() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let small = stepwell::RuntimeConfig {
        max_run_data_bytes: 4 << 20,
        ..Default::default()
    };
    let h = Host::with_config(Backend::Sqlite, clock.clone(), small);
    let mut req = request("big", "echo", json!({"prompt": "y".repeat(200 << 10)}));
    req["trigger"]["config"] = json!({"start_at": T0, "every": "1m"});
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    for minute in 0..30 {
        clock.set(at(T0) + chrono::Duration::minutes(minute));
        let report = drive_until_idle(&h.rt, 100).unwrap();
        assert!(report.errors.is_empty(), "minute {minute}: {report:?}");
    }
    let run = h.rt.get_state(&id).unwrap();
    assert_eq!(run.status, RunStatus::Waiting, "{:?}", run.error);
    let shown = show_automation(&h.rt, &id, at(T0)).unwrap();
    assert_eq!(shown["state"]["next_index"], 31, "30 occurrences");
    assert!(
        run.vars["_runtime"]["data_bytes"].as_u64().unwrap() > 4 << 20,
        "more than the budget over its life"
    );
    // The commit steps' own records name the records they wrote; the
    // fields and deltas are in those records only.
    let ledger = h.rt.get_ledger(&id).unwrap();
    let commits: Vec<_> = ledger
        .iter()
        .filter_map(|r| r.effect.as_ref())
        .filter(|e| e.kind == "automation.commit")
        .collect();
    assert!(commits.len() > 60, "{}", commits.len());
    for e in commits {
        for entry in e.payload["entries"].as_array().unwrap() {
            let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["as", "discriminator", "name"], "{entry}");
        }
    }
    // Per occurrence, the reference's records carry the prompt three times
    // (admitted: the frozen inputs, and the pending occurrence in its
    // delta; dispatched: the pending occurrence), and the echoed answer
    // comes twice (the child's end resuming the controller, and the read
    // of it): about five copies, not the eleven of commit payloads kept in
    // full.
    let bytes = serde_json::to_vec(&ledger).unwrap().len();
    assert!(
        bytes < 30 * 6 * (200 << 10),
        "at most about five copies of the prompt per occurrence: {bytes}"
    );
}

/// Runs of the controller's workflow come only with their automation.
#[test]
fn the_controller_cannot_be_started_on_its_own() {
    let h = host(Backend::Memory, &Arc::new(ManualClock::new(at(T0))));
    let id = stepwell::automation::CONTROLLER_WORKFLOW_ID;
    for e in [
        h.rt.start(id, Default::default()).unwrap_err(),
        h.rt.run(id, Default::default()).unwrap_err(),
    ] {
        assert_eq!(e.reason_code(), "invalid_input", "{e}");
        assert!(e.to_string().contains("automations create"), "{e}");
    }
}

/// An automation's target pinned to a version runs every occurrence on
/// it, whatever is deployed since; a revise can move the pin (or drop it:
/// the latest at each occurrence's start); a pin to a version the store
/// does not keep is refused at creation.
#[test]
fn a_pinned_target_runs_its_version_and_revise_moves_the_pin() {
    let clock = Arc::new(ManualClock::new(at(T0)));
    let h = host(Backend::Sqlite, &clock);
    let flow = |v: u32| json!({"workflow_id": "pinme", "entry": "e", "nodes": {"e": {"complete": {"v": v}}}});
    let dir = stepwell_tests::write_bundle(h.dir.path(), "pinme", &[("flow.json", flow(1))]);
    h.rt.deploy(&dir, None).unwrap();
    stepwell_tests::write_bundle(h.dir.path(), "pinme", &[("flow.json", flow(2))]);
    h.rt.deploy(&dir, None).unwrap();
    let mut req = request("pinned", "echo", json!({}));
    req["target"] = json!({"workflow_id": "pinme", "bundle_ref": dir.display().to_string(),
                           "flow_id": "pinme", "input_data": {}, "version": 7});
    let e = create_automation(&h.rt, &req, at(T0), None).unwrap_err();
    assert!(e.to_string().contains("target.version"), "{e}");
    req["target"]["version"] = json!(1);
    let id = create_automation(&h.rt, &req, at(T0), None)
        .unwrap()
        .automation_id;
    drive_until_idle(&h.rt, 100).unwrap();
    let occurrence = |command_id: &str| {
        let a = command(&h.rt, &id, "run_now", command_id, T0);
        assert_eq!(a["status"], "applied", "{a}");
        drive_until_idle(&h.rt, 100).unwrap();
        let run_id = stepwell::automation::occurrence_run_id(
            &id,
            stepwell::automation::OccurrenceKind::Manual { command_id },
            1,
        );
        let run = h.rt.get_state(&run_id).unwrap();
        (run.workflow_version, run.output.unwrap()["v"].clone())
    };
    assert_eq!(occurrence("one"), (Some(1), json!(1)));
    let revise = |command_id: &str, version: Value| {
        let mut target = req["target"].clone();
        target["version"] = version;
        apply_automation_command(
            &h.rt,
            &Command {
                automation_id: &id,
                command_id,
                command_type: "revise",
                payload: Some(&json!({"changes": {"target": target}})),
                ..Command::default()
            },
            at(T0),
        )
        .unwrap()
    };
    assert_eq!(revise("to-9", json!(9))["status"], "rejected");
    assert_eq!(revise("to-2", json!(2))["status"], "applied");
    assert_eq!(occurrence("two"), (Some(2), json!(2)));
    // v3 deployed: a prune keeps the pinned v2 (no run waits on it).
    stepwell_tests::write_bundle(h.dir.path(), "pinme", &[("flow.json", flow(3))]);
    h.rt.deploy(&dir, None).unwrap();
    let gone = h.rt.prune_versions(Some("pinme"), None, false).unwrap();
    assert_eq!(gone.iter().map(|v| v.version).collect::<Vec<_>>(), [1]);
    assert_eq!(revise("unpinned", Value::Null)["status"], "applied");
    assert_eq!(occurrence("three"), (Some(3), json!(3)));
}

//! The checkable behaviours of the automation specification
//! (`specs/automations.md` section 8), each driven the way the reference
//! implementation's own tests drive it (its `automation_harness.py`: create
//! at T0, drive, `at(t)` = move the clock, wake the controller, drive), with
//! the reference's expected values.

use serde_json::{json, Value};
use stepwell::automation::{
    automation_id, list_attention, list_automations, list_occurrences, occurrence_run_id,
    OccurrenceKind,
};
use stepwell::{RunState, RunStatus};
use stepwell_tests::repo;
use stepwell_tests::world::{at_time, hourly, World, T0};

fn wait_of(run: &RunState) -> (String, Option<String>) {
    let w = run.waiting.as_ref().expect("waiting");
    (w.wait_key.clone(), w.until.clone())
}

/// #10: the first drive admits occurrence 1 (its own session, the prompt
/// header) and parks on the wake wait until the next tick.
#[test]
fn s10_create_and_drive() {
    let w = World::new();
    let id = w.create(json!({}));
    let run = w.drive(&id);
    assert_eq!(run.status, RunStatus::Waiting);
    assert_eq!(run.waiting.as_ref().unwrap().reason.as_str(), "event");
    assert_eq!(
        wait_of(&run),
        (
            format!("automation:{id}:wake"),
            Some("2026-01-01T00:02:00+00:00".into())
        )
    );
    let kids = w.children(&id);
    assert_eq!(kids.len(), 1);
    let first = occurrence_run_id(
        &id,
        OccurrenceKind::Scheduled {
            revision: 1,
            index: 1,
        },
        1,
    );
    assert_eq!(kids[0].run_id, first);
    assert_eq!(kids[0].session_id.as_deref(), Some(first.as_str()));
    assert_eq!(
        kids[0].vars["prompt"],
        "[Trigger schedule@1 \u{b7} occurrence 1 \u{b7} fired 2026-01-01T00:00:00+00:00]\ncheck memory"
    );
}

/// #11: at 00:02:30 the second occurrence; records created, (admitted,
/// dispatched, completed) x 2; next fire 00:04.
#[test]
fn s11_second_occurrence() {
    let w = World::new();
    let id = w.create(json!({}));
    w.drive(&id);
    w.at(&id, "2026-01-01T00:02:30+00:00");
    assert_eq!(w.children(&id).len(), 2);
    let st = w.state(&id);
    assert_eq!(
        (
            &st["next_index"],
            &st["scheduled_count"],
            &st["pending_occurrence"]
        ),
        (&json!(3), &json!(2), &Value::Null)
    );
    let names: Vec<String> = w
        .rt()
        .get_ledger(&id)
        .unwrap()
        .iter()
        .filter_map(|r| r.effect.as_ref())
        .filter(|e| e.kind == "emit_event")
        .map(|e| e.payload["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "automation.created",
            "automation.admitted",
            "automation.dispatched",
            "automation.completed",
            "automation.admitted",
            "automation.dispatched",
            "automation.completed"
        ]
    );
    let shown = w.show(&id);
    assert_eq!(shown["status"], "active");
    assert_eq!(shown["next_fire_at"], "2026-01-01T00:04:00+00:00");
    let occ = list_occurrences(w.rt(), &id, None, 50).unwrap();
    let rows: Vec<(Value, Value, Value)> = occ["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["index"].clone(),
                o["status"].clone(),
                o["attempts"].clone(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (json!(2), json!("completed"), json!(1)),
            (json!(1), json!("completed"), json!(1))
        ]
    );
}

/// #12: drive, then at 00:11: one coalesced admission {1, 5, 4}.
#[test]
fn s12_missed_ticks_coalesce() {
    let w = World::new();
    let id = w.create(json!({}));
    w.drive(&id);
    w.at(&id, "2026-01-01T00:11:00+00:00");
    assert_eq!(w.children(&id).len(), 2);
    let c = w.records(&id, "automation.coalesced");
    assert_eq!(c.len(), 1);
    assert_eq!(
        (
            &c[0]["first_tick"],
            &c[0]["last_tick"],
            &c[0]["missed_count"]
        ),
        (&json!(1), &json!(5), &json!(4))
    );
    let admitted = w.records(&id, "automation.admitted");
    assert_eq!(
        admitted[1]["trigger_envelope"]["payload"],
        json!({"tick": 5, "scheduled_at": "2026-01-01T00:10:00+00:00",
               "coalesced": {"first_tick": 1, "last_tick": 5, "missed_count": 4}})
    );
    assert_eq!(w.state(&id)["scheduled_count"], 2);
}

/// #13 is in automation_controller.rs; #14: stale wakes before the first
/// hourly tick admit nothing.
#[test]
fn s14_stale_wakes_admit_nothing() {
    let w = World::new();
    let id = w.create(
        json!({"trigger": {"source_id": "schedule", "source_version": 1,
        "config": {"start_at": "2026-01-01T01:00:00Z", "every": "1h"}}}),
    );
    w.drive(&id);
    for t in ["2026-01-01T00:10:00+00:00", "2026-01-01T00:59:59+00:00"] {
        let run = w.at(&id, t);
        assert_eq!(run.status, RunStatus::Waiting);
        assert_eq!(
            wait_of(&run).1.as_deref(),
            Some("2026-01-01T01:00:00+00:00")
        );
    }
    assert!(w.children(&id).is_empty());
}

/// #15: a manual trigger parks with no deadline; a wake a month later
/// admits nothing.
#[test]
fn s15_manual_trigger_parks_idle() {
    let w = World::new();
    let id =
        w.create(json!({"trigger": {"source_id": "manual", "source_version": 1, "config": {}}}));
    let run = w.drive(&id);
    assert_eq!(wait_of(&run).1, None);
    let run = w.at(&id, "2026-02-01T00:00:00+00:00");
    assert_eq!(wait_of(&run).1, None);
    assert!(w.children(&id).is_empty());
}

/// #16, #17: notify from the occurrence's output becomes an attention
/// item; quiet ones do not; pages of attention items.
#[test]
fn s16_s17_notify_and_attention_pages() {
    let cases = [
        (
            json!(true),
            Some(("Memory watch".to_string(), "echo:[Trigger".to_string())),
        ),
        (
            json!({"title": "Spike", "body": "CPU 97%"}),
            Some(("Spike".to_string(), "CPU 97%".to_string())),
        ),
        (json!({"title": "", "body": " "}), None),
        (Value::Null, None),
    ];
    for (i, (notify, expected)) in cases.into_iter().enumerate() {
        let w = World::new();
        let mut input = json!({"prompt": "check memory"});
        if !notify.is_null() {
            input["notify"] = notify;
        }
        let id = w.create(json!({"request_id": format!("n{i}"), "input_data": input}));
        w.drive(&id);
        let page = list_attention(w.rt(), &id, 0, None, 50).unwrap();
        let items = page["items"].as_array().unwrap();
        match expected {
            None => assert!(items.is_empty(), "{i}: {page}"),
            Some((title, body)) => {
                assert_eq!(items.len(), 1, "{i}");
                assert_eq!(items[0]["kind"], "notify");
                assert_eq!(items[0]["title"], json!(title));
                assert!(
                    items[0]["body"].as_str().unwrap().starts_with(&body),
                    "{i}: {page}"
                );
                assert_eq!(items[0]["cursor"], "att1:1");
            }
        }
    }
    let w = World::new();
    let id = w.create(json!({"input_data": {"prompt": "p", "notify": true}}));
    w.drive(&id);
    for t in [
        "2026-01-01T00:02:00+00:00",
        "2026-01-01T00:04:00+00:00",
        "2026-01-01T00:06:00+00:00",
    ] {
        w.at(&id, t);
    }
    let seqs = |page: &Value| -> Vec<i64> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["seq"].as_i64().unwrap())
            .collect()
    };
    let p1 = list_attention(w.rt(), &id, 0, None, 2).unwrap();
    assert_eq!(
        (seqs(&p1), &p1["next_cursor"]),
        (vec![1, 2], &json!("att1:2"))
    );
    let p2 = list_attention(w.rt(), &id, 0, p1["next_cursor"].as_str(), 2).unwrap();
    assert_eq!((seqs(&p2), &p2["next_cursor"]), (vec![3, 4], &Value::Null));
    let p3 = list_attention(w.rt(), &id, 3, None, 50).unwrap();
    assert_eq!(seqs(&p3), vec![4]);
}

/// #20: run now is busy while an occurrence waits on a person or a run
/// now is queued, and invalid on a finished one-shot.
#[test]
fn s20_run_now_busy_and_finished() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "ask", "input_data": {}, "trigger": hourly()}));
    w.drive(&id);
    let r = w.cmd(&id, "rn", "run_now", "2026-01-01T00:01:00+00:00");
    assert_eq!(r["error"]["reason_code"], "automation_busy");
    let once = w.create(
        json!({"request_id": "once", "trigger": {"source_id": "schedule",
        "source_version": 1, "config": {"start_at": "2026-01-01T00:00:00Z"}}}),
    );
    assert_eq!(w.drive(&once).status, RunStatus::Completed);
    let r = w.cmd(&once, "rn2", "run_now", "2026-01-01T00:01:00+00:00");
    assert_eq!(r["error"]["reason_code"], "invalid_state");
    let manual = w.create(json!({"request_id": "m",
        "trigger": {"source_id": "manual", "source_version": 1, "config": {}}}));
    w.drive(&manual);
    // Commands do not run the controller: the first run now is queued.
    assert_eq!(
        w.cmd(&manual, "a", "run_now", "2026-01-01T00:01:00+00:00")["status"],
        "applied"
    );
    assert_eq!(
        w.cmd(&manual, "b", "run_now", "2026-01-01T00:01:00+00:00")["error"]["reason_code"],
        "automation_busy"
    );
    let r = w.cmd("no-such", "c", "pause", T0);
    assert_eq!(r["error"]["reason_code"], "automation_not_found");
    assert_eq!(r["duplicate"], false);
}

/// #21: duplicates of applied and rejected commands; what they record.
#[test]
fn s21_duplicates() {
    let w = World::new();
    let id = w.create(json!({"trigger": hourly()}));
    w.drive(&id);
    let before = w.state(&id)["state_version"].as_u64().unwrap();
    assert_eq!(
        w.cmd(&id, "same", "pause", "2026-01-01T00:01:00+00:00"),
        json!({"status": "applied", "duplicate": false})
    );
    assert_eq!(
        w.cmd(&id, "same", "pause", "2026-01-01T00:01:00+00:00"),
        json!({"status": "applied", "duplicate": true})
    );
    let bad = Some(json!({"changes": {"title": ""}}));
    let r1 = w.cmd_with(
        &id,
        "bad",
        "revise",
        "2026-01-01T00:02:00+00:00",
        bad.clone(),
        None,
    );
    let r2 = w.cmd_with(&id, "bad", "revise", "2026-01-01T00:02:00+00:00", bad, None);
    assert_eq!(r1["status"], "rejected");
    assert_eq!(r1["duplicate"], false);
    assert_eq!(r2["duplicate"], true);
    assert_eq!(r1["error"], r2["error"]);
    let names: Vec<String> = w
        .rt()
        .get_ledger(&id)
        .unwrap()
        .iter()
        .filter(|r| r.node_id.as_deref() == Some("command"))
        .map(|r| {
            r.effect.as_ref().unwrap().payload["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        [
            "automation.command_result",
            "automation.paused",
            "automation.command_result"
        ]
    );
    assert_eq!(w.state(&id)["state_version"], json!(before + 2));
}

/// #22: a reused command id with another command, payload or expected
/// revision is `identity_conflict`, recording nothing.
#[test]
fn s22_reused_command_ids() {
    let w = World::new();
    let id = w.create(json!({"trigger": hourly()}));
    w.drive(&id);
    assert_eq!(
        w.cmd(&id, "p2", "pause", "2026-01-01T00:05:00+00:00")["status"],
        "applied"
    );
    let version = w.state(&id)["state_version"].clone();
    let ledger_len = w.rt().get_ledger(&id).unwrap().len();
    for (kind, payload, expected) in [
        ("archive", None, None),
        ("pause", Some(json!({"x": 1})), None),
        ("revise", Some(json!({"changes": {"title": "x"}})), None),
        ("pause", None, Some(1)),
    ] {
        let r = w.cmd_with(
            &id,
            "p2",
            kind,
            "2026-01-01T00:06:00+00:00",
            payload,
            expected,
        );
        assert_eq!(r["status"], "rejected", "{kind}");
        assert_eq!(r["error"]["reason_code"], "identity_conflict");
        assert_eq!(r["error"]["field"], "command_id");
        assert_eq!(r["duplicate"], false);
    }
    assert_eq!(w.state(&id)["state_version"], version);
    assert_eq!(w.rt().get_ledger(&id).unwrap().len(), ledger_len);
    assert_eq!(w.show(&id)["definition"]["archived_at"], Value::Null);
    assert_eq!(
        w.cmd(&id, "p2", "pause", "2026-01-01T00:07:00+00:00"),
        json!({"status": "applied", "duplicate": true})
    );
}

/// #23: revising the policy merges it.
#[test]
fn s23_policy_revisions_merge() {
    let w = World::new();
    let id = w.create(json!({"trigger": hourly(),
        "policy": {"tool_approval": "ask", "retry": {"max_attempts": 5}}}));
    let r = w.cmd_with(
        &id,
        "r",
        "revise",
        "2026-01-01T00:01:00+00:00",
        Some(json!({"changes": {"policy": {"retry": {"max_attempts": 2}}}})),
        None,
    );
    assert_eq!(r["status"], "applied");
    let p = w.show(&id)["definition"]["policy"].clone();
    assert_eq!(
        (&p["tool_approval"], &p["retry"]["max_attempts"]),
        (&json!("ask"), &json!(2))
    );
    w.cmd_with(
        &id,
        "r2",
        "revise",
        "2026-01-01T00:02:00+00:00",
        Some(json!({"changes": {"policy": {"tool_approval": "auto"}}})),
        None,
    );
    let p = w.show(&id)["definition"]["policy"].clone();
    assert_eq!(
        (&p["tool_approval"], &p["retry"]["max_attempts"]),
        (&json!("auto"), &json!(2))
    );
}

/// #24: expected revision, same binding for a title change, a new binding
/// (re-armed after now) for a trigger change, revised records, and an
/// unsupported change refused.
#[test]
fn s24_revise() {
    let w = World::new();
    let id = w.create(json!({"trigger": hourly()}));
    w.drive(&id);
    let old = w.show(&id)["definition"]["trigger"]["binding_id"].clone();
    let ok = w.cmd_with(
        &id,
        "r1",
        "revise",
        "2026-01-01T00:20:00+00:00",
        Some(json!({"changes": {"title": "Renamed"}})),
        Some(1),
    );
    assert_eq!(ok["status"], "applied");
    let stale = w.cmd_with(
        &id,
        "r2",
        "revise",
        "2026-01-01T00:21:00+00:00",
        Some(json!({"changes": {"title": "Lost update"}})),
        Some(1),
    );
    assert_eq!(stale["error"]["reason_code"], "revision_conflict");
    assert_eq!(
        stale["error"]["message"],
        "Automation is at revision 2, not 1."
    );
    let d = w.show(&id)["definition"].clone();
    assert_eq!(
        (&d["revision"], &d["title"]),
        (&json!(2), &json!("Renamed"))
    );
    assert_eq!(d["trigger"]["binding_id"], old);
    w.clock.set(at_time("2026-01-01T00:30:00+00:00"));
    let changed = w.cmd_with(
        &id,
        "r3",
        "revise",
        "2026-01-01T00:30:00+00:00",
        Some(
            json!({"changes": {"trigger": {"source_id": "schedule", "source_version": 1,
            "config": {"start_at": "2026-01-01T00:00:00Z", "every": "15m"}}}}),
        ),
        None,
    );
    assert_eq!(changed["status"], "applied");
    let d = w.show(&id)["definition"].clone();
    assert_eq!(d["revision"], 3);
    assert_ne!(d["trigger"]["binding_id"], old);
    let run = w.drive(&id);
    assert_eq!(
        wait_of(&run).1.as_deref(),
        Some("2026-01-01T00:45:00+00:00")
    );
    assert_eq!(w.children(&id).len(), 1);
    let revised: Vec<(Value, Value)> = w
        .records(&id, "automation.revised")
        .iter()
        .map(|p| {
            (
                p["previous_revision"].clone(),
                p["definition"]["revision"].clone(),
            )
        })
        .collect();
    assert_eq!(revised, [(json!(1), json!(2)), (json!(2), json!(3))]);
    let bad = w.cmd_with(
        &id,
        "r4",
        "revise",
        "2026-01-01T00:31:00+00:00",
        Some(json!({"changes": {"context": {"mode": "growing", "growing":
            {"summary": {"enabled": true, "every_n": 3, "max_tokens": 100}}}}})),
        None,
    );
    assert_eq!(bad["error"]["reason_code"], "unsupported_feature");
}

/// #26: stop_current or pause during a backoff cancels the retry quietly.
#[test]
fn s26_stop_or_pause_during_backoff() {
    for kind in ["stop_current", "pause"] {
        let w = World::new();
        let id = w.create(json!({"workflow_id": "flaky",
            "input_data": {"prompt": "p", "fail_until": 99}, "trigger": hourly()}));
        w.drive(&id);
        assert_eq!(w.state(&id)["pending_occurrence"]["phase"], "backoff");
        w.clock.set(at_time("2026-01-01T00:00:05+00:00"));
        assert_eq!(
            w.cmd(&id, "c", kind, "2026-01-01T00:00:05+00:00")["status"],
            "applied"
        );
        w.drive(&id);
        w.at(&id, "2026-01-01T00:00:31+00:00");
        assert_eq!(w.children(&id).len(), 1, "{kind}: attempt 2 never started");
        let done: Vec<(Value, Value)> = w
            .records(&id, "automation.completed")
            .iter()
            .map(|d| (d["status"].clone(), d["attention"].clone()))
            .collect();
        assert_eq!(done, [(json!("cancelled"), Value::Null)], "{kind}");
        if kind == "pause" {
            assert_eq!(w.state(&id)["paused"], true);
            assert_eq!(w.show(&id)["status"], "paused");
        }
    }
}

/// #27: an attempt that fails while the automation is paused is not
/// retried (a scheduled occurrence).
#[test]
fn s27_failure_while_paused_is_not_retried() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "flaky",
        "input_data": {"prompt": "p", "fail_until": 99}, "trigger": hourly()}));
    // Only the controller runs: it admits and dispatches occurrence 1,
    // whose run is created but not run yet.
    let run = w.rt().tick(&id).unwrap();
    assert_eq!(run.waiting.as_ref().unwrap().reason.as_str(), "subworkflow");
    let child = w.children(&id).remove(0);
    assert_eq!(child.status, RunStatus::Running);
    assert_eq!(
        w.cmd(&id, "p", "pause", "2026-01-01T00:00:01+00:00")["status"],
        "applied"
    );
    // The attempt runs (a pause does not stop it) and fails.
    w.drive(&id);
    assert_eq!(
        w.rt().get_state(&child.run_id).unwrap().status,
        RunStatus::Completed
    );
    w.at(&id, "2026-01-01T00:10:00+00:00");
    assert_eq!(w.children(&id).len(), 1);
    assert!(w.records(&id, "automation.retry_scheduled").is_empty());
    let done: Vec<(Value, Value)> = w
        .records(&id, "automation.completed")
        .iter()
        .map(|d| (d["status"].clone(), d["attempts"].clone()))
        .collect();
    assert_eq!(done, [(json!("failed"), json!(1))]);
    assert_eq!(w.state(&id)["paused"], true);
}

/// #28: a run now while paused keeps its retries.
#[test]
fn s28_manual_run_while_paused_keeps_its_retries() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "flaky",
        "input_data": {"prompt": "p", "fail_until": 2}, "trigger": hourly()}));
    w.drive(&id);
    w.at(&id, "2026-01-01T00:00:30+00:00");
    w.cmd(&id, "p", "pause", "2026-01-01T00:05:00+00:00");
    w.drive(&id);
    w.clock.set(at_time("2026-01-01T00:06:00+00:00"));
    assert_eq!(
        w.cmd(&id, "run-1", "run_now", "2026-01-01T00:06:00+00:00")["status"],
        "applied"
    );
    w.drive(&id);
    let pending = w.state(&id)["pending_occurrence"].clone();
    assert_eq!(
        (
            &pending["phase"],
            &pending["attempt"],
            &pending["command_id"]
        ),
        (&json!("backoff"), &json!(2), &json!("run-1"))
    );
    w.at(&id, "2026-01-01T00:06:30+00:00");
    let done: Vec<(Value, Value)> = w
        .records(&id, "automation.completed")
        .iter()
        .map(|d| (d["status"].clone(), d["attempts"].clone()))
        .collect();
    assert_eq!(
        done,
        [
            (json!("completed"), json!(2)),
            (json!("completed"), json!(2))
        ]
    );
}

/// #33: the backoff is capped.
#[test]
fn s33_backoff_is_capped() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "flaky", "input_data": {"prompt": "p", "fail_until": 99},
        "policy": {"retry": {"max_attempts": 4, "backoff": {"initial": "4m", "factor": 3, "max": "10m"}}}}));
    w.drive(&id);
    assert_eq!(
        w.state(&id)["pending_occurrence"]["retry_at"],
        "2026-01-01T00:04:00+00:00"
    );
    w.at(&id, "2026-01-01T00:04:00+00:00");
    assert_eq!(
        w.state(&id)["pending_occurrence"]["retry_at"],
        "2026-01-01T00:14:00+00:00"
    );
}

/// #34: a revision during a backoff does not change the next attempt; the
/// next occurrence uses the new revision (and its id).
#[test]
fn s34_revise_during_backoff() {
    let w = World::new();
    let id = w.create(
        json!({"workflow_id": "flaky", "input_data": {"prompt": "original", "fail_until": 2}}),
    );
    w.drive(&id);
    let echo = repo()
        .join("flows/automations/echo")
        .canonicalize()
        .unwrap();
    let r = w.cmd_with(
        &id,
        "c-rev",
        "revise",
        "2026-01-01T00:00:10+00:00",
        Some(json!({"changes": {"target": {"workflow_id": "echo",
            "bundle_ref": echo.display().to_string(), "flow_id": "echo",
            "input_data": {"prompt": "REVISED"}}}})),
        None,
    );
    assert_eq!(r["status"], "applied");
    w.at(&id, "2026-01-01T00:00:30+00:00");
    let kids = w.children(&id);
    let attempt2 = &kids[1];
    assert_eq!(attempt2.workflow_id, "flaky");
    assert!(attempt2.vars["prompt"]
        .as_str()
        .unwrap()
        .ends_with("\noriginal"));
    assert_eq!(attempt2.vars["_meta"]["occurrence"]["revision"], 1);
    assert_eq!(attempt2.status, RunStatus::Completed);
    w.at(&id, "2026-01-01T00:02:00+00:00");
    let third = &w.children(&id)[2];
    assert_eq!(third.workflow_id, "echo");
    assert!(third.vars["prompt"]
        .as_str()
        .unwrap()
        .ends_with("\nREVISED"));
    assert_eq!(
        third.run_id,
        occurrence_run_id(
            &id,
            OccurrenceKind::Scheduled {
                revision: 2,
                index: 2
            },
            1
        )
    );
}

/// #36: the status of every shape, from `get_automation` and the list.
#[test]
fn s36_statuses() {
    let w = World::new();
    let active = w.create(json!({"request_id": "active", "trigger": hourly()}));
    let paused = w.create(json!({"request_id": "paused", "trigger": hourly()}));
    let done = w.create(
        json!({"request_id": "done", "trigger": {"source_id": "schedule",
        "source_version": 1, "config": {"start_at": "2026-01-01T00:00:00Z"}}}),
    );
    let archived = w.create(json!({"request_id": "archived", "trigger": hourly()}));
    let cancelled = w.create(json!({"request_id": "cancelled", "trigger": hourly()}));
    w.drive(&active);
    w.cmd(&paused, "p", "pause", T0);
    w.cmd(&archived, "a", "archive", T0);
    w.drive(&active);
    w.rt().cancel_run_by(&cancelled, None, "test").unwrap();
    let expect = [
        (&active, "active"),
        (&paused, "paused"),
        (&done, "completed"),
        (&archived, "archived"),
        (&cancelled, "failed"),
    ];
    for (id, status) in expect {
        assert_eq!(w.show(id)["status"], status, "{id}");
    }
    let listed = list_automations(w.rt(), None, None, 50, at_time(T0)).unwrap();
    for (id, status) in expect {
        let row = listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["automation_id"] == json!(id))
            .unwrap();
        assert_eq!(row["status"], status, "{id}");
    }
    let only = list_automations(w.rt(), Some("paused,archived"), None, 50, at_time(T0)).unwrap();
    assert_eq!(only["items"].as_array().unwrap().len(), 2);
}

/// #37: a person-waiting occurrence: the current occurrence is running,
/// the next fire time is the next tick, then the coalesced one, which
/// the next occurrence fires at.
#[test]
fn s37_next_fire_while_an_occurrence_waits() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "ask", "input_data": {}, "trigger": hourly()}));
    w.drive(&id);
    let child = w.children(&id).remove(0);
    w.clock.set(at_time("2026-01-01T00:10:00+00:00"));
    let shown = w.show(&id);
    assert_eq!(
        shown["current_occurrence"],
        json!({"index": 1, "run_id": child.run_id, "attempt": 1, "status": "running"})
    );
    assert_eq!(shown["next_fire_at"], "2026-01-01T01:00:00+00:00");
    w.clock.set(at_time("2026-01-01T03:30:00+00:00"));
    assert_eq!(w.show(&id)["next_fire_at"], "2026-01-01T03:00:00+00:00");
    w.answer(&child, "yes");
    w.drive(&id);
    let occ = list_occurrences(w.rt(), &id, None, 1).unwrap();
    assert_eq!(occ["items"][0]["index"], 2);
    assert_eq!(occ["items"][0]["fired_at"], "2026-01-01T03:00:00+00:00");
}

/// #38: pages of automations, newest first, archived ones listed.
#[test]
fn s38_automation_pages() {
    let w = World::new();
    let mut ids = Vec::new();
    for i in 0..5 {
        w.clock
            .set(at_time(&format!("2026-09-27T10:0{i}:00+00:00")));
        ids.push(w.create(json!({"request_id": format!("auto-{i}"), "trigger": hourly()})));
    }
    w.cmd(&ids[0], "a", "archive", "2026-09-27T10:05:00+00:00");
    let now = at_time("2026-09-27T10:05:00+00:00");
    let page = |cursor: Option<&str>| list_automations(w.rt(), None, cursor, 2, now).unwrap();
    let listed = |p: &Value| -> Vec<String> {
        p["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["automation_id"].as_str().unwrap().to_string())
            .collect()
    };
    let p1 = page(None);
    assert_eq!(listed(&p1), [ids[4].clone(), ids[3].clone()]);
    assert_eq!(
        p1["next_cursor"],
        json!(stepwell::automation::automations_cursor(
            "2026-09-27T10:03:00+00:00",
            &ids[3]
        ))
    );
    let p2 = page(p1["next_cursor"].as_str());
    assert_eq!(listed(&p2), [ids[2].clone(), ids[1].clone()]);
    let p3 = page(p2["next_cursor"].as_str());
    assert_eq!(listed(&p3), [ids[0].clone()]);
    assert_eq!(p3["items"][0]["status"], "archived");
    assert_eq!(p3["next_cursor"], Value::Null);
    let e = list_automations(w.rt(), None, Some("garbage"), 2, now).unwrap_err();
    assert_eq!(e.reason_code(), "invalid_request");
    assert_eq!(automation_id("local", "local", "auto-3"), ids[3]);
}

/// Spec 2.10: waits on a person in the occurrence trees are live facts
/// (never attention items), typed by kind; the controller's own wake wait
/// is never one.
#[test]
fn s_pending_waits_are_live_facts() {
    let w = World::new();
    let id = w.create(json!({"workflow_id": "ask", "input_data": {}, "trigger": hourly()}));
    w.drive(&id);
    let child = w.children(&id).remove(0);
    let waits = stepwell::automation::pending_waits(w.rt(), &id, 20).unwrap();
    let key = child.waiting.as_ref().unwrap().wait_key.clone();
    assert_eq!(
        waits,
        vec![
            json!({"run_id": child.run_id, "wait_key": key, "kind": "ask_user",
                    "reason": "user", "index": 1, "prompt": "Proceed?",
                    "choices": ["yes", "no"]})
        ]
    );
    assert!(list_attention(w.rt(), &id, 0, None, 50).unwrap()["items"]
        .as_array()
        .unwrap()
        .is_empty());
    w.answer(&child, "yes");
    w.drive(&id);
    assert!(stepwell::automation::pending_waits(w.rt(), &id, 20)
        .unwrap()
        .is_empty());
    assert_eq!(
        w.rt().get_state(&id).unwrap().waiting.unwrap().wait_key,
        format!("automation:{id}:wake")
    );
    let other = w.create(json!({"request_id": "quiet", "trigger": hourly()}));
    w.drive(&other);
    assert!(stepwell::automation::pending_waits(w.rt(), &other, 20)
        .unwrap()
        .is_empty());
}

/// A drive until idle hands its caller what it did so far as it goes
/// (the CLI shows it on a terminal), and its last word is its report.
#[test]
fn a_long_drive_reports_its_progress() {
    let w = World::new();
    let id = w.create(json!({}));
    let mut seen = Vec::new();
    let report = stepwell::automation::drive_until_idle_with(
        w.rt(),
        200,
        std::time::Duration::ZERO,
        &mut |so_far| seen.push((so_far.passes, so_far.moved)),
    )
    .unwrap();
    assert!(report.passes >= 2, "{report:?}");
    // One word a pass that moved something, each further along.
    assert_eq!(seen.len() as u64, report.passes, "{seen:?}");
    assert!(
        seen.windows(2).all(|p| p[0].0 < p[1].0 && p[0].1 <= p[1].1),
        "{seen:?}"
    );
    assert_eq!(seen.last(), Some(&(report.passes, report.moved)));
    assert_eq!(w.rt().get_state(&id).unwrap().status, RunStatus::Waiting);
    // Asked seldom: not a word before the first interval has passed.
    let w = World::new();
    w.create(json!({}));
    let mut words = 0;
    stepwell::automation::drive_until_idle_with(
        w.rt(),
        200,
        std::time::Duration::from_secs(3600),
        &mut |_| words += 1,
    )
    .unwrap();
    assert_eq!(words, 0);
}

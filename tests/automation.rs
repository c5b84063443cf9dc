//! The automation definition: ids, digests, validation and revisions give
//! exactly what the reference implementation (abstractruntime 0.13.0) gives
//! for the same input. Expected values were produced by the reference.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use stepwell::automation::{
    automation_id, automation_status, backoff_delay, binding_id, build_definition, discussion_ids,
    initial_state, occurrence_run_id, request_digest, revise_definition, trigger_changed,
    validate_policy, AutomationStatus, OccurrenceKind,
};
use stepwell::triggers::TriggerRegistry;
use stepwell_tests::trigger_registry;

const ID: &str = "34f631d4-0bf3-5fea-a282-70c1b1d5b24b";

fn now() -> DateTime<Utc> {
    "2026-01-01T00:00:00Z".parse().unwrap()
}

fn base() -> Value {
    json!({
        "request_id": "memory-watch",
        "title": "  Memory watch ",
        "target": {"workflow_id": "echo", "bundle_ref": "/srv/flows/echo", "flow_id": "echo",
                   "input_data": {"prompt": "check memory"}},
        "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "2m"}},
        "workspace_root": "/tmp/ws"
    })
}

/// `base()` with the top-level keys of `patch` replaced.
fn with(patch: Value) -> Value {
    let mut req = base();
    for (k, v) in patch.as_object().unwrap() {
        req[k] = v.clone();
    }
    req
}

fn build(r: &TriggerRegistry, request: &Value) -> Result<Value, (String, Option<String>)> {
    build_definition(request, ID, now(), r).map_err(|e| (e.reason_code, e.field))
}

/// A fixture the reference wrote (tests/fixtures/<name>.json).
fn fixture(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A record payload's own fields (without the ones every record has).
fn own_fields(payload: &Value) -> serde_json::Map<String, Value> {
    let common = stepwell::automation::decisions::protocol::COMMON_FIELDS;
    payload
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !common.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[test]
fn ids_are_the_references() {
    assert_eq!(automation_id("local", "local", "memory-watch"), ID);
    assert_eq!(binding_id(ID, 1), "a5d46496-9e93-54c8-b142-587deb6b287f");
    assert_eq!(binding_id(ID, 3), "b65fcd63-46e5-5aff-ac31-5d8afa7d9a0d");
    let scheduled = OccurrenceKind::Scheduled {
        revision: 1,
        index: 2,
    };
    assert_eq!(
        occurrence_run_id(ID, scheduled, 1),
        "1a852a72-f109-5b94-be0b-3a5dada8b537"
    );
    let seventh = OccurrenceKind::Scheduled {
        revision: 2,
        index: 7,
    };
    assert_eq!(
        occurrence_run_id(ID, seventh, 3),
        "74f1a9a8-1fee-5d2e-80e2-f94ade82bc9d"
    );
    let manual = OccurrenceKind::Manual { command_id: "c9" };
    assert_eq!(
        occurrence_run_id(ID, manual, 2),
        "93dc209b-4c4a-5fff-964d-84e867dad2bf"
    );
    let (run, session) = discussion_ids(ID, "d1");
    assert_eq!(run, "0749d725-aa55-50b5-95a7-db20f17df2fa");
    assert_eq!(session, format!("discussion-session:{run}"));
}

#[test]
fn digests_are_the_references() {
    assert_eq!(
        request_digest(&base()),
        "sha256:7685aa2f7158cb82a12d62bbe7d2dee3c4164e10dbdc573b7935f133d327f7f2"
    );
    assert_eq!(
        request_digest(&json!({"x": [1e16, 1.5e-5, "é\n"], "a": true})),
        "sha256:c229b6a5951a5cb51fb3d4bf51782c7fd9c8976ff6d435f516d11edbfdceabff"
    );
}

#[test]
fn a_definition_is_built_as_the_reference_builds_it() {
    let (r, _dir) = trigger_registry(&[]);
    let d = build(&r, &base()).unwrap();
    let expected = json!({
        "archived_at": null,
        "context": {"growing": {}, "mode": "independent"},
        "controller": {"bundle_ref": "abstractframework.automation-controller@1.0.0", "flow_id": "controller"},
        "created_at": "2026-01-01T00:00:00+00:00",
        "notify": {"channels": ["console"]},
        "policy": {"email_allowed_recipients": ["self"], "failure": "continue", "misfire": "coalesce",
                   "retry": {"backoff": {"factor": 2, "initial": "30s", "max": "10m"}, "max_attempts": 3},
                   "serial": true, "tool_approval": "auto", "untrusted_input_tools": []},
        "revision": 1,
        "schema_version": 2,
        "session_id": "automation:34f631d4-0bf3-5fea-a282-70c1b1d5b24b",
        "target": {"bundle_ref": "/srv/flows/echo", "flow_id": "echo",
                   "input_data": {"prompt": "check memory"}, "workflow_id": "echo"},
        "title": "Memory watch",
        "trigger": {"binding_id": "a5d46496-9e93-54c8-b142-587deb6b287f",
                    "config": {"anchor": "2026-01-01T00:00:00+00:00", "every": "2m",
                               "start_at": "2026-01-01T00:00:00+00:00"},
                    "source_id": "schedule", "source_version": 1},
        "workspace_root": "/tmp/ws"
    });
    assert_eq!(d, expected);

    // Everything optional, normalised the way the reference does.
    let full = build(
        &r,
        &with(json!({
            "trigger": {"source_id": "schedule", "source_version": 1,
                        "config": {"start_at": "2026-01-01T01:00:00.5+01:00", "every": "1h",
                                   "count": 3, "until": "2026-02-01T00:00:00Z"}},
            "policy": {"email_allowed_recipients": [" Self", "A@Example.test", "a@example.test"],
                       "untrusted_input_tools": ["fetch_url", "fetch_url", "x.y-z"],
                       "tool_policy": {"auto_approve_tools": ["b", " a", "b"]}, "serial": 1},
            "notify": {"channels": ["email", "console", "email"], "always": true,
                       "title": "  t  ", "body": "b".repeat(3000), "recipients": ["self"]},
            "context": {"mode": "growing"},
            "session_id": " s1 ",
            "one_shot": true,
            "untrusted_origin": false,
            "origin_run_id": "r0"
        })),
    )
    .unwrap();
    assert_eq!(
        full["trigger"]["config"],
        json!({"anchor": "2026-01-01T00:00:00.500000+00:00", "count": 3, "every": "1h",
               "start_at": "2026-01-01T00:00:00.500000+00:00", "until": "2026-02-01T00:00:00+00:00"})
    );
    assert_eq!(
        full["policy"],
        json!({"email_allowed_recipients": ["self", "a@example.test"], "failure": "continue",
               "misfire": "coalesce",
               "retry": {"backoff": {"factor": 2, "initial": "30s", "max": "10m"}, "max_attempts": 3},
               "serial": true, "tool_approval": "auto",
               "tool_policy": {"auto_approve_tools": ["a", "b"], "require_approval_tools": []},
               "untrusted_input_tools": ["fetch_url", "x.y-z"]})
    );
    assert_eq!(full["notify"]["channels"], json!(["console", "email"]));
    assert_eq!(full["notify"]["always"], json!(true));
    assert_eq!(full["notify"]["title"], json!("t"));
    assert_eq!(full["notify"]["body"].as_str().unwrap().len(), 2000);
    assert_eq!(full["notify"]["recipients"], json!(["self"]));
    assert_eq!(full["session_id"], json!("s1"));
    assert_eq!(full["one_shot"], json!(true));
    assert_eq!(full["origin_run_id"], json!("r0"));
    assert!(full.get("untrusted_origin").is_none());

    let manual = build(
        &r,
        &with(json!({"trigger": {"source_id": "manual", "source_version": 1}})),
    )
    .unwrap();
    assert_eq!(manual["trigger"]["config"], json!({}));
}

#[test]
fn every_refusal_names_its_reason_and_field() {
    let (r, _dir) = trigger_registry(&[]);
    let schedule = |config: Value| json!({"trigger": {"source_id": "schedule", "source_version": 1, "config": config}});
    let target = |patch: Value| {
        let mut t = base()["target"].clone();
        for (k, v) in patch.as_object().unwrap() {
            t[k] = v.clone();
        }
        json!({ "target": t })
    };
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"surprise": 1, "zeta": 2}),
            "invalid_definition",
            "surprise",
        ),
        (
            json!({"request_id": "  "}),
            "invalid_definition",
            "request_id",
        ),
        (
            json!({"title": "x".repeat(121)}),
            "invalid_definition",
            "title",
        ),
        (json!({"title": 5}), "invalid_definition", "title"),
        (
            target(json!({"extra": 1})),
            "invalid_definition",
            "target.extra",
        ),
        (
            target(json!({"input_data": null})),
            "invalid_definition",
            "target.input_data",
        ),
        (
            target(json!({"flow_id": "@default"})),
            "invalid_definition",
            "target.flow_id",
        ),
        (
            json!({"target": {"bundle_ref": "b", "flow_id": "f"}}),
            "invalid_definition",
            "target.workflow_id",
        ),
        (
            json!({"trigger": {"source_id": "schedule", "source_version": true}}),
            "invalid_definition",
            "trigger.source_version",
        ),
        (
            json!({"trigger": {"source_id": "nope", "source_version": 1}}),
            "unknown_trigger_source",
            "trigger.source_id",
        ),
        (
            schedule(json!({"every": "1w"})),
            "invalid_definition",
            "trigger.config.every",
        ),
        (
            schedule(json!({"zz": 1, "every": "1w"})),
            "invalid_definition",
            "trigger.config.zz",
        ),
        (
            schedule(json!({"count": 2})),
            "invalid_definition",
            "trigger.config.count",
        ),
        (
            schedule(json!({"anchor": "2026-01-02T00:00:00Z"})),
            "unsupported_feature",
            "trigger.config.anchor",
        ),
        (
            schedule(json!({"until": "2025-01-02T00:00:00Z"})),
            "invalid_definition",
            "trigger.config.until",
        ),
        (
            schedule(json!({"start_at": "2026-01-02T00:00:00"})),
            "invalid_definition",
            "trigger.config.start_at",
        ),
        (
            schedule(json!({"every": "5é"})),
            "invalid_definition",
            "trigger.config.every",
        ),
        (
            schedule(json!({"every": "1日"})),
            "invalid_definition",
            "trigger.config.every",
        ),
        (
            schedule(json!({"start_at": "9999-12-31T23:59:59-01:00"})),
            "invalid_definition",
            "trigger.config.start_at",
        ),
        (
            schedule(json!({"start_at": "2026-12-31T23:59:60Z"})),
            "invalid_definition",
            "trigger.config.start_at",
        ),
        (
            json!({"trigger": {"source_id": "schedule", "source_version": 1, "config": null}}),
            "invalid_definition",
            "trigger.config",
        ),
        (
            json!({"trigger": {"source_id": "manual", "source_version": 1, "config": {"b": 1, "a": 2}}}),
            "invalid_definition",
            "trigger.config.a",
        ),
        (
            json!({"context": {"mode": "growing", "growing": {"summary": true}}}),
            "unsupported_feature",
            "context.growing.summary",
        ),
        (
            json!({"context": {"mode": "growing", "growing": {"max_tokens": 1.5}}}),
            "invalid_definition",
            "context.growing.max_tokens",
        ),
        (
            json!({"context": {"mode": "weird"}}),
            "invalid_definition",
            "context.mode",
        ),
        (
            json!({"policy": {"tool_approval": "never", "serial": false}}),
            "invalid_definition",
            "policy.tool_approval",
        ),
        (
            json!({"policy": {"serial": false}}),
            "unsupported_feature",
            "policy.serial",
        ),
        (
            json!({"policy": {"retry": {"max_attempts": 11}}}),
            "invalid_definition",
            "policy.retry.max_attempts",
        ),
        (
            json!({"policy": {"retry": {"backoff": {"factor": true}}}}),
            "invalid_definition",
            "policy.retry.backoff.factor",
        ),
        (
            json!({"policy": {"retry": {"backoff": {"initial": "0m"}}}}),
            "invalid_definition",
            "policy.retry.backoff.initial",
        ),
        (
            json!({"policy": {"email_allowed_recipients": ["Self", "A@Example.test", "bad@nodot"]}}),
            "invalid_definition",
            "policy.email_allowed_recipients[2]",
        ),
        (
            json!({"policy": {"untrusted_input_tools": ["ALL"]}}),
            "invalid_definition",
            "policy.untrusted_input_tools[0]",
        ),
        (
            json!({"notify": {"channels": ["email", "sms"]}}),
            "invalid_definition",
            "notify.channels[1]",
        ),
        (
            json!({"notify": {"recipients": []}}),
            "invalid_definition",
            "notify.recipients",
        ),
        (
            json!({"workspace_root": "rel/path"}),
            "invalid_definition",
            "workspace_root",
        ),
        (
            json!({"session_id": "s1"}),
            "invalid_definition",
            "session_id",
        ),
        (json!({"one_shot": "yes"}), "invalid_definition", "one_shot"),
    ];
    for (patch, code, field) in cases {
        let got = build(&r, &with(patch.clone()));
        assert_eq!(
            got,
            Err((code.to_string(), Some(field.to_string()))),
            "{patch}"
        );
    }
    let not_an_object = build(&r, &json!([])).unwrap_err();
    assert_eq!(
        not_an_object,
        ("invalid_definition".into(), Some("request".into()))
    );
}

#[test]
fn revisions_merge_the_policy_and_rebind_a_changed_trigger() {
    let (r, _dir) = trigger_registry(&[]);
    let d = build(&r, &with(json!({"policy": {"tool_approval": "ask"}}))).unwrap();
    assert_eq!(d["policy"]["tool_approval"], json!("ask"));
    let later: DateTime<Utc> = "2026-01-01T00:05:00Z".parse().unwrap();
    // The same schedule resent (start_at included): the binding is kept.
    let same = revise_definition(
        &d,
        &json!({"policy": {"retry": {"max_attempts": 5}},
                "trigger": {"source_id": "schedule", "source_version": 1,
                            "config": {"start_at": "2026-01-01T00:00:00Z", "every": "2m"}}}),
        ID,
        later,
        &r,
    )
    .unwrap();
    assert_eq!(same["revision"], json!(2));
    assert_eq!(same["trigger"], d["trigger"]);
    assert!(!trigger_changed(&d, &same));
    assert_eq!(same["policy"]["retry"]["max_attempts"], json!(5));
    assert_eq!(
        same["policy"]["tool_approval"],
        json!("ask"),
        "a retry-only change keeps the rest of the policy"
    );
    // Without start_at, the config takes the command's time: a new binding.
    let changed = revise_definition(
        &d,
        &json!({"trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "2m"}}}),
        ID,
        later,
        &r,
    )
    .unwrap();
    assert_eq!(
        changed["trigger"],
        json!({"binding_id": "5dce7e60-dad1-5927-860b-d0f058bb6f00", "source_id": "schedule",
               "source_version": 1,
               "config": {"start_at": "2026-01-01T00:05:00+00:00",
                          "anchor": "2026-01-01T00:05:00+00:00", "every": "2m"}})
    );
    assert!(trigger_changed(&d, &changed));
    for (changes, field) in [
        (json!({}), "changes"),
        (json!({"bogus": 1}), "changes.bogus"),
        (json!([]), "changes"),
        (json!({"policy": []}), "changes.policy"),
    ] {
        let e = revise_definition(&d, &changes, ID, later, &r).unwrap_err();
        assert_eq!(
            (e.reason_code.as_str(), e.field.as_deref()),
            ("invalid_definition", Some(field))
        );
    }
}

#[test]
fn backoff_grows_by_the_factor_up_to_the_cap() {
    let policy = validate_policy(Some(
        &json!({"retry": {"backoff": {"initial": "30s", "factor": 2.5, "max": "10m"}}}),
    ))
    .unwrap();
    let seconds: Vec<f64> = (1..=5)
        .map(|a| {
            backoff_delay(&policy, a)
                .unwrap()
                .num_microseconds()
                .unwrap() as f64
                / 1e6
        })
        .collect();
    assert_eq!(seconds, [30.0, 75.0, 187.5, 468.75, 600.0]);
    // A factor with no exact binary form, to the reference's microsecond.
    let policy = validate_policy(Some(
        &json!({"retry": {"backoff": {"initial": "5s", "factor": 5.29, "max": "366d"}}}),
    ))
    .unwrap();
    assert_eq!(
        backoff_delay(&policy, 9).unwrap().num_microseconds(),
        Some(3_066_305_207_840)
    );
}

#[test]
fn the_status_rule_and_the_initial_state() {
    let (r, _dir) = trigger_registry(&[]);
    let d = build(&r, &base()).unwrap();
    let state = initial_state(
        &d,
        &json!({"anchor": "2026-01-01T00:00:00+00:00", "tick": 0, "scheduled_count": 0, "exhausted": false}),
    );
    assert_eq!(
        state,
        json!({"state_version": 0, "active_revision": 1, "pending_occurrence": null,
               "anchor": "2026-01-01T00:00:00+00:00", "tick": 0, "next_index": 1,
               "scheduled_count": 0, "paused": false, "attention_seq": 0, "exhausted": false,
               "manual_pending": null, "last_outcome": null, "intent": null})
    );
    let mut run: stepwell::RunState = serde_json::from_value(json!({
        "run_id": ID, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
        "status": "running", "current_node": "wait",
        "vars": {"_meta": {"automation": d}, "_runtime": {"automation": state}},
        "waiting": null, "output": null, "error": null,
        "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
        "actor_id": null, "session_id": null, "parent_run_id": null
    }))
    .unwrap();
    assert_eq!(automation_status(&run), AutomationStatus::Active);
    run.vars["_runtime"]["automation"]["paused"] = json!(true);
    assert_eq!(automation_status(&run), AutomationStatus::Paused);
    run.status = stepwell::RunStatus::Cancelled;
    assert_eq!(automation_status(&run), AutomationStatus::Failed);
    run.status = stepwell::RunStatus::Completed;
    assert_eq!(automation_status(&run), AutomationStatus::Completed);
    run.vars["_meta"]["automation"]["archived_at"] = json!("2026-01-02T00:00:00+00:00");
    assert_eq!(automation_status(&run), AutomationStatus::Archived);
}

/// Automation attribution crosses every subworkflow hop, set by the host: a
/// child (and grandchild) of an occurrence is a descendant of it, a child
/// of a discussion keeps its provenance without the seed.
#[test]
fn children_of_an_occurrence_are_its_descendants() {
    use stepwell::store::{RunIndexRow, RunIndexer};
    use stepwell_tests::{Backend, Host};
    for backend in [Backend::Memory, Backend::Sqlite] {
        let h = Host::new(backend);
        let hop = |id: &str, child: &str, run_id: &str| {
            json!({"workflow_id": id, "entry": "go", "nodes": {
                "go": {"effect": "start_subworkflow",
                       "payload": {"workflow_id": child, "run_id": run_id}, "result_key": "child", "next": "done"},
                "done": {"complete": {"$var": "child.output"}}}})
        };
        h.load_scratch(
            "leaf",
            &[(
                "flow.json",
                json!({"workflow_id": "desc-leaf", "entry": "end",
            "nodes": {"end": {"complete": {"leaf": true}}}}),
            )],
        );
        h.load_scratch(
            "child",
            &[("flow.json", hop("desc-child", "desc-leaf", "leaf-1"))],
        );
        let parent = h.load_scratch(
            "parent",
            &[("flow.json", hop("desc-parent", "desc-child", "child-1"))],
        );
        let occurrence = json!({"automation_id": ID, "occurrence_index": 3, "attempt": 1,
                                "role": "occurrence", "session_kind": "occurrence", "revision": 1});
        let mut options = stepwell::StartOptions::default();
        options.vars.insert(
            "_meta".into(),
            json!({"occurrence": occurrence,
                   "discussion": {"automation_id": ID, "occurrence_index": 3, "seed_messages": ["long"]}}),
        );
        let run = h.rt.run(&parent, options).unwrap();
        assert_eq!(
            run.status,
            stepwell::RunStatus::Completed,
            "{:?}",
            run.error
        );
        assert_eq!(run.output, Some(json!({"leaf": true})));
        // Named children live under their parents.
        let child_1 = stepwell::effects::subworkflow::named_child_id(&run.run_id, "child-1");
        let leaf_1 = stepwell::effects::subworkflow::named_child_id(&child_1, "leaf-1");
        for id in [&child_1, &leaf_1] {
            let child = h.rt.get_state(id).unwrap();
            let mut expected = occurrence.clone();
            expected["role"] = json!("descendant");
            let meta = &child.vars["_meta"];
            assert_eq!(meta["occurrence"], expected, "{id}");
            assert_eq!(
                meta["discussion"],
                json!({"automation_id": ID, "occurrence_index": 3}),
                "{id}"
            );
            assert!(meta["creation_digest"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"));
            let row = RunIndexRow::of(&child, &stepwell::automation::AutomationIndex);
            assert_eq!(row.role.as_deref(), Some("descendant"), "{id}");
            assert_eq!(row.automation_id.as_deref(), Some(ID));
            assert_eq!(row.occurrence_index, Some(3));
            assert!(
                !row.is_turn_root(&stepwell::automation::AutomationIndex.turn_roots()),
                "a descendant is never a turn of its own"
            );
        }
        // A run outside any automation passes nothing on.
        let plain = h.load_scratch(
            "plain",
            &[("flow.json", hop("plain-parent", "desc-leaf", "leaf-2"))],
        );
        let run = h.rt.run(&plain, stepwell::StartOptions::default()).unwrap();
        assert_eq!(
            run.status,
            stepwell::RunStatus::Completed,
            "{:?}",
            run.error
        );
        let leaf =
            h.rt.get_state(&stepwell::effects::subworkflow::named_child_id(
                &run.run_id,
                "leaf-2",
            ))
            .unwrap();
        let meta = leaf.vars["_meta"].as_object().unwrap();
        assert_eq!(
            meta.keys().collect::<Vec<_>>(),
            ["creation_digest"],
            "{meta:?}"
        );
        assert_eq!(
            RunIndexRow::of(&leaf, &stepwell::automation::AutomationIndex).role,
            None
        );
    }
}

/// A run started under an explicit id without a creation digest gets the
/// reference's: sha256 of the canonical `{workflow_id, session_id,
/// parent_run_id, vars}` as the caller passed them.
#[test]
fn explicit_ids_get_the_references_creation_digest() {
    use stepwell_tests::{Backend, Host};
    let h = Host::new(Backend::Sqlite);
    let wf = h.load("hello");
    let start = |id: &str, vars: Value, session: Option<&str>| {
        h.rt.start(
            &wf,
            stepwell::StartOptions {
                vars: serde_json::from_value(vars).unwrap(),
                run_id: Some(id.into()),
                session_id: session.map(str::to_string),
                ..Default::default()
            },
        )
    };
    start("r1", json!({"name": "Ann"}), None).unwrap();
    let digest = |id: &str| h.rt.get_state(id).unwrap().vars["_meta"]["creation_digest"].clone();
    assert_eq!(
        digest("r1"),
        "sha256:566c745ed261b9a14417cfb4bf5d500ae92f6407b5826b77fd79a3eeb6827cfe"
    );
    start("r2", json!({"name": "Ann", "_meta": {"x": 1}}), Some("s1")).unwrap();
    assert_eq!(
        digest("r2"),
        "sha256:ad1aab62189a6857e7444085520992e42a23b2f93886cfe24359e4ef590ad967"
    );
    assert_eq!(h.rt.get_state("r2").unwrap().vars["_meta"]["x"], 1);
    // The same request again is the same run; other vars are a conflict.
    assert_eq!(start("r1", json!({"name": "Ann"}), None).unwrap(), "r1");
    let err = start("r1", json!({"name": "Bob"}), None).unwrap_err();
    assert_eq!(err.reason_code(), "identity_conflict");
    assert!(
        err.to_string().contains("vars._meta.creation_digest"),
        "{err}"
    );
    // A digest the caller names is kept as it is.
    start(
        "r3",
        json!({"_meta": {"creation_digest": "sha256:mine"}}),
        None,
    )
    .unwrap();
    assert_eq!(digest("r3"), "sha256:mine");
}

/// Occurrence outputs, notify values and completions answer as the
/// reference's (tests/fixtures/automation-outcomes.json, written by
/// scripts/reference/automation-outcomes.py with abstractruntime 0.13.0).
#[test]
fn outcomes_and_completions_are_the_references() {
    use stepwell::automation::{
        complete_occurrence, current_occurrence, normalize_occurrence_output, notify_payload,
        OccurrenceOutcome,
    };
    let fixture: Value = fixture("automation-outcomes");
    let run = |status: &Value, output: &Value, error: &Value, vars: Value| -> stepwell::RunState {
        serde_json::from_value(json!({
            "run_id": "c1", "workflow_id": "w", "status": status, "current_node": null,
            "vars": vars, "waiting": null, "output": output, "error": error,
            "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
            "actor_id": null, "session_id": null, "parent_run_id": null
        }))
        .unwrap()
    };
    let cases = fixture["outputs"].as_array().unwrap();
    assert_eq!(cases.len(), 14);
    for case in cases {
        let child = run(&case["status"], &case["output"], &case["error"], json!({}));
        assert_eq!(
            normalize_occurrence_output(&child).to_json(),
            case["expected"],
            "{case}"
        );
    }
    let title = format!("Memory watch{}", "!".repeat(130));
    let answer = "a".repeat(400);
    for case in fixture["notify"].as_array().unwrap() {
        let got = notify_payload(&case["raw"], &title, &answer).unwrap_or(Value::Null);
        assert_eq!(got, case["expected"], "{case}");
    }
    let completions = fixture["completions"].as_array().unwrap();
    assert_eq!(completions.len(), 24);
    for case in completions {
        let state = json!({"pending_occurrence": {"run_id": "r-1", "index": 3, "attempt": 2},
                           "attention_seq": 4});
        let outcome = case["outcome"].as_object().map(|o| OccurrenceOutcome {
            answer: o["answer"].as_str().unwrap().to_string(),
            success: o["success"].as_bool().unwrap(),
            notify: o["notify"].clone(),
            error: o["error"].as_str().map(str::to_string),
        });
        let c = complete_occurrence(
            &case["definition"],
            &state,
            case["status"].as_str().unwrap(),
            outcome.as_ref(),
            "2026-01-01T00:01:30+00:00",
        );
        let expected = &case["expected"];
        assert_eq!(expected["name"], "automation.completed");
        assert_eq!(c.fields, expected["fields"], "{case}");
        assert_eq!(c.state, expected["state"], "{case}");
    }
    let controller = run(
        &json!("running"),
        &Value::Null,
        &Value::Null,
        json!({"_runtime": {"automation": {"pending_occurrence":
            {"index": 2, "run_id": "x", "attempt": 2, "phase": "backoff"}}}}),
    );
    assert_eq!(
        current_occurrence(&controller),
        Some(fixture["current"].clone())
    );
}

/// Occurrence and attention pages folded from controller ledgers the
/// reference wrote (tests/fixtures/automation-ledgers.json, written by
/// scripts/reference/automation-ledgers.py) are the reference's pages.
#[test]
fn occurrences_and_attention_read_from_the_references_ledgers() {
    use stepwell::automation::{attention_page, automation_records, occurrence_page};
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    assert_eq!(scenarios.len(), 3);
    for s in &scenarios {
        let name = s["name"].as_str().unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(s["records"].clone()).unwrap();
        assert!(automation_records(&records, &[]).len() >= 4, "{name}");
        for q in s["occurrences"].as_array().unwrap() {
            let query = &q["query"];
            let page = occurrence_page(
                &records,
                query["cursor"].as_str(),
                query["limit"].as_i64().unwrap_or(50),
            )
            .unwrap();
            assert_eq!(page, q["page"], "{name}: occurrences {query}");
        }
        let id = s["automation_id"].as_str().unwrap();
        for q in s["attention"].as_array().unwrap() {
            let query = &q["query"];
            let page = attention_page(
                id,
                &records,
                query["after_seq"].as_i64().unwrap_or(0),
                query["cursor"].as_str(),
                query["limit"].as_i64().unwrap_or(50),
            )
            .unwrap();
            assert_eq!(page, q["page"], "{name}: attention {query}");
        }
    }
}

#[test]
fn cursors_are_the_references() {
    use stepwell::automation::{
        automations_cursor, parse_attention_cursor, parse_automations_cursor,
        parse_occurrence_cursor,
    };
    let c = automations_cursor("2026-09-27T10:03:00+00:00", "auto-3");
    assert_eq!(
        c,
        "auto1:WyIyMDI2LTA5LTI3VDEwOjAzOjAwKzAwOjAwIiwiYXV0by0zIl0="
    );
    assert_eq!(
        parse_automations_cursor(&c).unwrap(),
        (
            "2026-09-27T10:03:00+00:00".to_string(),
            "auto-3".to_string()
        )
    );
    // Non-ASCII is escaped as Python's json.dumps escapes it.
    let c = automations_cursor("é", "x");
    assert_eq!(c, "auto1:WyJcdTAwZTkiLCJ4Il0=");
    assert_eq!(parse_automations_cursor(&c).unwrap().0, "é");
    for bad in [
        "garbage",
        "auto1:",
        "auto1:e30=",
        "auto1:WyJhIl0=",
        "auto1:W=yJ",
        "occ1:3",
    ] {
        let e = parse_automations_cursor(bad).unwrap_err();
        assert_eq!(
            (e.reason_code.as_str(), e.field.as_deref()),
            ("invalid_request", Some("cursor")),
            "{bad}"
        );
    }
    assert_eq!(parse_occurrence_cursor("occ1:12").unwrap(), 12);
    assert_eq!(parse_occurrence_cursor("occ1: 1_0").unwrap(), 10);
    assert!(parse_occurrence_cursor("occ1:x").is_err());
    assert!(parse_occurrence_cursor("att1:1").is_err());
    assert_eq!(parse_attention_cursor("att1:3").unwrap(), 3);
    assert!(parse_attention_cursor("att1:").is_err());
}

/// The envelopes, prompt headers, origins and occurrence vars in the
/// reference's ledgers are what stepwell's functions build from the same
/// frozen inputs.
#[test]
fn envelopes_and_occurrence_vars_are_the_references() {
    use stepwell::automation::{
        automation_records, ensure_cloudevent_attributes, occurrence_origin, occurrence_vars,
        prompt_header, to_cloudevent,
    };
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    let mut admissions = 0;
    let mut dispatches = 0;
    for s in &scenarios {
        let id = s["automation_id"].as_str().unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(s["records"].clone()).unwrap();
        for rec in automation_records(&records, &["automation.admitted"]) {
            admissions += 1;
            let p = rec.payload;
            let recorded = &p["trigger_envelope"];
            // What the source's normalize gave, before the controller added
            // the CloudEvents attributes.
            let mut envelope = serde_json::Map::new();
            for k in [
                "event_id",
                "source_id",
                "source_version",
                "fired_at",
                "payload",
                "binding_id",
            ] {
                envelope.insert(k.into(), recorded[k].clone());
            }
            ensure_cloudevent_attributes(&mut envelope, "trusted");
            assert_eq!(Value::Object(envelope.clone()), *recorded);
            let mut again = envelope.clone();
            ensure_cloudevent_attributes(&mut again, "untrusted");
            assert_eq!(again, envelope, "an envelope with attributes is kept");
            let input = &p["prepared"]["input_data"];
            assert_eq!(input["event"], to_cloudevent(recorded));
            let index = p["index"].as_u64().unwrap();
            let header = prompt_header(
                recorded["source_id"].as_str().unwrap(),
                recorded["source_version"].as_i64().unwrap(),
                index,
                recorded["fired_at"].as_str().unwrap(),
            );
            let created = automation_records(&records, &["automation.created"]);
            let asked = &created[0].payload["definition"]["target"]["input_data"]["prompt"];
            assert_eq!(
                input["prompt"].as_str().unwrap(),
                format!("{header}{}", asked.as_str().unwrap())
            );
            assert_eq!(
                input["_meta"]["origin"],
                occurrence_origin(
                    false,
                    Some("local:local"),
                    id,
                    p["event_id"].as_str().unwrap(),
                    "schedule@1",
                    index
                )
            );
        }
        for rec in automation_records(&records, &["automation.dispatched"]) {
            dispatches += 1;
            let pending = &rec.payload["delta"]["state"]["pending_occurrence"];
            let child = pending["run_id"].as_str().unwrap();
            let start = records
                .iter()
                .find(|r| {
                    r.effect.as_ref().is_some_and(|e| {
                        e.kind == "start_subworkflow" && e.payload["run_id"] == child
                    })
                })
                .expect("the dispatch's start_subworkflow record");
            assert_eq!(
                start.effect.as_ref().unwrap().payload["vars"],
                occurrence_vars(id, pending)
            );
        }
    }
    assert_eq!((admissions, dispatches), (5, 8));
}

/// Every automation record in the reference's ledgers is what `decide` or
/// `observe` writes for the same transition, and a decision changes the
/// run as its delta says; a key written before is never written again.
#[test]
fn decisions_and_observations_write_the_references_records() {
    use stepwell::automation::{automation_record, decide, observe, Transition};
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    let mut checked = 0;
    for s in &scenarios {
        let id = s["automation_id"].as_str().unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(s["records"].clone()).unwrap();
        for (i, r) in records.iter().enumerate() {
            let Some(rec) = automation_record(r) else {
                continue;
            };
            let p = rec.payload;
            let key = rec.key.unwrap();
            let discriminator = key.rsplit_once(&format!("{id}:")).unwrap().1;
            let fields = own_fields(p);
            let t = Transition {
                name: rec.name,
                discriminator,
                fields,
                node_id: r.node_id.as_deref().unwrap(),
                command_id: p.get("command_id").and_then(Value::as_str),
                at: p["at"].as_str().unwrap(),
            };
            let version = p["state_version"].as_u64().unwrap();
            let is_decision = p["delta"] != json!({});
            let mut run: stepwell::RunState = serde_json::from_value(json!({
                "run_id": id, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
                "status": "running", "current_node": "admit",
                "vars": {"_meta": {"automation": {"revision": p["revision"]}},
                         "_runtime": {"automation": {"state_version": if is_decision { version - 1 } else { version },
                                                      "intent": null, "next_index": 1}}},
                "waiting": null, "output": null, "error": null,
                "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
                "actor_id": null, "session_id": null, "parent_run_id": null
            }))
            .unwrap();
            let before = &records[..i];
            let written = if is_decision {
                decide(&mut run, before, &t, p["delta"].clone()).unwrap()
            } else {
                observe(&run, before, &t).unwrap()
            };
            assert_eq!(written.payload, *p, "{key}");
            assert_eq!(written.record.as_ref(), Some(r), "{key}");
            let state = &run.vars["_runtime"]["automation"];
            assert_eq!(state["state_version"], json!(version), "{key}");
            if let Some(Value::Object(changes)) = p["delta"].get("state") {
                for (k, v) in changes {
                    assert_eq!(state[k], *v, "{key}: {k}");
                }
            }
            // Written once: with its own record in the ledger, nothing more.
            let after = &records[..=i];
            let again = if is_decision {
                decide(&mut run, after, &t, p["delta"].clone()).unwrap()
            } else {
                observe(&run, after, &t).unwrap()
            };
            assert_eq!((again.payload, again.record), (p.clone(), None), "{key}");
            checked += 1;
        }
    }
    assert_eq!(checked, 11 + 6 + 8);
}

/// Commands the reference applied (tests/fixtures/automation-commands.json,
/// written by scripts/reference/automation-commands.py): from the same
/// controller state, stepwell decides the same (the same delta or the same
/// rejection), writes the same `command_result` record and the same
/// observation.
#[test]
fn commands_decide_as_the_reference() {
    use stepwell::automation::{
        automation_record, command_digest, command_observation, decide, decide_command, observe,
        CommandDecision, Transition,
    };
    let (triggers, _dir) = trigger_registry(&[]);
    let fixture: Value = fixture("automation-commands");
    let id = fixture["automation_id"].as_str().unwrap();
    let steps = fixture["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 20);
    for step in steps {
        let command_id = step["command_id"].as_str().unwrap();
        let kind = step["type"].as_str().unwrap();
        let at = step["now"].as_str().unwrap();
        let now: DateTime<Utc> = at.parse().unwrap();
        let expected_revision = step["expected_revision"].as_i64();
        let mut run: stepwell::RunState = serde_json::from_value(json!({
            "run_id": id, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
            "status": step["before"]["status"], "current_node": "wait",
            "vars": step["before"]["vars"], "waiting": null, "output": null, "error": null,
            "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
            "actor_id": null, "session_id": null, "parent_run_id": null
        }))
        .unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(step["records"].clone()).unwrap();
        let automation: Vec<_> = records
            .iter()
            .filter_map(|r| automation_record(r).map(|a| (r, a)))
            .collect();
        let (result_record, recorded) = &automation[0];
        assert_eq!(recorded.name, "automation.command_result");
        let p = recorded.payload;
        let decision = decide_command(
            &run,
            kind,
            &step["payload"],
            command_id,
            now,
            expected_revision,
            &triggers,
        )
        .unwrap();
        let (status, delta) = match &decision {
            CommandDecision::Applied(delta) => ("applied", delta.clone()),
            CommandDecision::Rejected(error) => {
                assert_eq!(*error, p["error"], "{command_id}");
                ("rejected", json!({}))
            }
        };
        assert_eq!(p["status"], status, "{command_id}");
        assert_eq!(p["delta"], delta, "{command_id}");
        let mut fields = serde_json::Map::new();
        fields.insert("command_id".into(), json!(command_id));
        fields.insert("type".into(), json!(kind));
        fields.insert("actor".into(), Value::Null);
        fields.insert(
            "command_digest".into(),
            json!(command_digest(
                kind,
                Some(&step["payload"]),
                expected_revision
            )),
        );
        fields.insert("status".into(), json!(status));
        if let CommandDecision::Rejected(error) = &decision {
            fields.insert("error".into(), error.clone());
        }
        let t = Transition {
            name: "automation.command_result",
            discriminator: command_id,
            fields,
            node_id: "command",
            command_id: Some(command_id),
            at,
        };
        let written = decide(&mut run, &[], &t, delta).unwrap();
        assert_eq!(
            written.record.as_ref(),
            Some(*result_record),
            "{command_id}"
        );
        // What a reader sees after the command (paused, archived, re-armed).
        let after = &step["after"];
        let shown: stepwell::RunState = serde_json::from_value(json!({
            "run_id": id, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
            "status": after["status"], "current_node": "wait", "vars": after["vars"],
            "waiting": after["waiting"], "output": null, "error": null,
            "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
            "actor_id": null, "session_id": null, "parent_run_id": null
        }))
        .unwrap();
        assert_eq!(
            stepwell::automation::get_automation(&shown, now, &triggers).unwrap(),
            after["get_automation"],
            "{command_id}"
        );
        let observation = if status == "applied" {
            command_observation(&run, kind, command_id, now, &triggers).unwrap()
        } else {
            None
        };
        match (observation, automation.get(1)) {
            (None, None) => {}
            (Some((name, discriminator, fields)), Some((obs_record, _))) => {
                let t = Transition {
                    name,
                    discriminator: &discriminator,
                    fields,
                    node_id: "command",
                    command_id: Some(command_id),
                    at,
                };
                let written = observe(&run, &[], &t).unwrap();
                assert_eq!(written.record.as_ref(), Some(*obs_record), "{command_id}");
            }
            (ours, theirs) => panic!("{command_id}: observation {ours:?} vs {theirs:?}"),
        }
    }
}

/// What readers see of the reference's controllers (their view, their list
/// summary, when they fire next, also between steps) is what stepwell's
/// functions show of the same runs at the same time.
#[test]
fn views_and_next_fire_times_are_the_references() {
    use stepwell::automation::{automation_summary, get_automation, next_fire_at};
    let (triggers, _dir) = trigger_registry(&[]);
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    let mut checked = 0;
    for s in &scenarios {
        let id = s["automation_id"].as_str().unwrap();
        for v in s["views"].as_array().unwrap() {
            let now: DateTime<Utc> = v["now"].as_str().unwrap().parse().unwrap();
            let r = &v["run"];
            let run: stepwell::RunState = serde_json::from_value(json!({
                "run_id": id, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
                "status": r["status"], "current_node": "wait", "vars": r["vars"], "waiting": r["waiting"],
                "output": null, "error": null, "session_id": r["session_id"],
                "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
                "actor_id": null, "parent_run_id": null
            }))
            .unwrap();
            assert_eq!(
                get_automation(&run, now, &triggers).unwrap(),
                v["get_automation"],
                "{}",
                v["now"]
            );
            let mut ours = automation_summary(&run, now, &triggers).unwrap();
            let mut theirs = v["summary"].clone();
            for k in ["created_at", "updated_at"] {
                ours.as_object_mut().unwrap().remove(k);
                theirs.as_object_mut().unwrap().remove(k);
            }
            assert_eq!(ours, theirs, "{}", v["now"]);
            let mut between = run.clone();
            between.status = stepwell::RunStatus::Running;
            between.waiting = None;
            for (at, expected) in v["between_steps"].as_object().unwrap() {
                let at: DateTime<Utc> = at.parse().unwrap();
                assert_eq!(
                    next_fire_at(&between, at, &triggers)
                        .unwrap()
                        .map(Value::String)
                        .unwrap_or(Value::Null),
                    *expected,
                    "{} between steps at {at}",
                    v["now"]
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
}

/// Stored states a command cannot change are refused, never a panic.
#[test]
fn commands_refuse_states_they_cannot_change() {
    use stepwell::automation::decide_command;
    let (triggers, _dir) = trigger_registry(&[]);
    let definition = build(&triggers, &base()).unwrap();
    let run_with = |pending: Value, version: Value| -> stepwell::RunState {
        let mut d = definition.clone();
        d["trigger"]["source_version"] = version;
        serde_json::from_value(json!({
            "run_id": ID, "workflow_id": "abstractframework.automation-controller@1.0.0:controller",
            "status": "waiting", "current_node": "wait",
            "vars": {"_meta": {"automation": d},
                     "_runtime": {"automation": {"state_version": 3, "paused": true, "tick": 0,
                                                  "scheduled_count": 0, "exhausted": false,
                                                  "pending_occurrence": pending}}},
            "waiting": null, "output": null, "error": null,
            "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
            "actor_id": null, "session_id": null, "parent_run_id": null
        }))
        .unwrap()
    };
    let e = decide_command(
        &run_with(json!("x"), json!(1)),
        "automation.stop_current",
        &json!({}),
        "c1",
        now(),
        None,
        &triggers,
    )
    .unwrap_err();
    assert_eq!(e.reason_code, "invalid_state", "{e}");
    // A trigger version beyond u32 names no source (not schedule@1).
    let e = decide_command(
        &run_with(Value::Null, json!(4_294_967_297u64)),
        "automation.resume",
        &json!({}),
        "c2",
        now(),
        None,
        &triggers,
    )
    .unwrap_err();
    assert_eq!(e.reason_code, "unknown_trigger_source", "{e}");
    // The code once, and the field, in its text.
    let text = e.to_string();
    assert_eq!(text.matches("unknown_trigger_source").count(), 1, "{text}");
    assert!(text.contains("trigger.source_id"), "{text}");
}

/// The dispatches, retries and completions in the reference's ledgers are
/// what stepwell plans from the same state and the same ended runs.
#[test]
fn dispatches_retries_and_completions_are_the_references() {
    use stepwell::automation::{automation_record, plan_dispatch, plan_outcome};
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    let mut planned = 0;
    for s in &scenarios {
        let id = s["automation_id"].as_str().unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(s["records"].clone()).unwrap();
        let mut definition = Value::Null;
        let mut state = json!({"attention_seq": 0, "paused": false, "pending_occurrence": null});
        let mut delivered = Value::Null;
        let mut after_dispatch = None;
        for r in &records {
            if let Some(e) = r.effect.as_ref().filter(|e| e.kind == "resume") {
                if e.payload["wait_reason"] == "subworkflow" {
                    delivered = e.payload["payload"].clone();
                }
                continue;
            }
            let Some(rec) = automation_record(r) else {
                continue;
            };
            let p = rec.payload;
            let fields = own_fields(p);
            let now: DateTime<Utc> = p["at"].as_str().unwrap().parse().unwrap();
            let ours = match rec.name {
                "automation.created" => {
                    definition = p["definition"].clone();
                    None
                }
                "automation.dispatched" => Some(plan_dispatch(id, &state).unwrap().unwrap()),
                "automation.retry_scheduled" | "automation.completed" => {
                    let child: stepwell::RunState = serde_json::from_value(json!({
                        "run_id": delivered["sub_run_id"], "workflow_id": "target", "status": "completed",
                        "current_node": null, "vars": {}, "waiting": null, "output": delivered["output"],
                        "error": null, "created_at": "2026-01-01T00:00:00.000000Z",
                        "updated_at": "2026-01-01T00:00:00.000000Z", "actor_id": null,
                        "session_id": null, "parent_run_id": id
                    }))
                    .unwrap();
                    Some(
                        plan_outcome(&definition, &state, &child, now)
                            .unwrap()
                            .unwrap(),
                    )
                }
                _ => None,
            };
            if let Some(plan) = ours {
                assert_eq!(plan.name, rec.name);
                assert_eq!(
                    plan.discriminator,
                    rec.key.unwrap().rsplit_once(&format!("{id}:")).unwrap().1
                );
                assert_eq!(plan.fields, fields, "{}", rec.key.unwrap());
                assert_eq!(plan.delta, p["delta"], "{}", rec.key.unwrap());
                planned += 1;
            }
            // Follow the state as the record's delta changes it.
            if let Some(Value::Object(changes)) = p["delta"].get("state") {
                for (k, v) in changes {
                    state[k] = v.clone();
                }
            }
            if rec.name == "automation.dispatched" {
                after_dispatch = Some(state.clone());
            }
        }
        // A dispatched attempt is not dispatched again; a run still going
        // ends nothing.
        let dispatched = after_dispatch.expect("a dispatch");
        assert_eq!(plan_dispatch(id, &dispatched).unwrap(), None);
        let running: stepwell::RunState = serde_json::from_value(json!({
            "run_id": "c", "workflow_id": "target", "status": "waiting", "current_node": "ask",
            "vars": {}, "waiting": null, "output": null, "error": null,
            "created_at": "2026-01-01T00:00:00.000000Z", "updated_at": "2026-01-01T00:00:00.000000Z",
            "actor_id": null, "session_id": null, "parent_run_id": id
        }))
        .unwrap();
        let now: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(
            plan_outcome(&definition, &dispatched, &running, now).unwrap(),
            None
        );
    }
    // 3 + 2 + 3 dispatches, 3 + 1 + 1 completions, 1 + 2 retries.
    assert_eq!(planned, 8 + 5 + 3);
}

/// Every wake wait the reference's controllers parked on is what
/// `plan_wait` decides from the same state at the same time, and its
/// payload is `wake_payload`'s; later, paused or archived, it goes on,
/// parks without a deadline, or ends.
#[test]
fn wake_waits_are_the_references() {
    use stepwell::automation::{
        automation_record, definition_ends, plan_wait, wake_payload, WaitPlan,
    };
    let (triggers, _dir) = trigger_registry(&[]);
    let scenarios = fixture("automation-ledgers").as_array().unwrap().clone();
    let mut parked = 0;
    for s in &scenarios {
        let id = s["automation_id"].as_str().unwrap();
        let records: Vec<stepwell::StepRecord> =
            serde_json::from_value(s["records"].clone()).unwrap();
        let mut definition = Value::Null;
        let mut state = json!({"paused": false, "pending_occurrence": null, "manual_pending": null,
                               "tick": 0, "scheduled_count": 0, "exhausted": false});
        let mut now = String::new();
        for r in &records {
            if let Some(rec) = automation_record(r) {
                if rec.name == "automation.created" {
                    definition = rec.payload["definition"].clone();
                    state["anchor"] = definition["trigger"]["config"]["anchor"].clone();
                }
                if let Some(Value::Object(changes)) = rec.payload["delta"].get("state") {
                    for (k, v) in changes {
                        state[k] = v.clone();
                    }
                }
                now = rec.payload["at"].as_str().unwrap().to_string();
                continue;
            }
            let Some(e) = r.effect.as_ref().filter(|e| e.kind == "wait_event") else {
                continue;
            };
            if r.status != stepwell::StepStatus::Started {
                continue;
            }
            let at: DateTime<Utc> = now.parse().unwrap();
            let until = e.payload["until"].as_str().map(str::to_string);
            assert!(!definition_ends(&definition, &state));
            assert_eq!(
                plan_wait(&definition, &state, at, &triggers).unwrap(),
                WaitPlan::Park(until.clone()),
                "{id} at {now}"
            );
            assert_eq!(wake_payload(id, until.as_deref()), e.payload);
            let later: DateTime<Utc> = until.as_deref().unwrap().parse().unwrap();
            assert_eq!(
                plan_wait(&definition, &state, later, &triggers).unwrap(),
                WaitPlan::Go
            );
            parked += 1;
        }
        let mut paused = state.clone();
        paused["paused"] = json!(true);
        let at: DateTime<Utc> = now.parse().unwrap();
        assert_eq!(
            plan_wait(&definition, &paused, at, &triggers).unwrap(),
            WaitPlan::Park(None)
        );
        let mut archived = definition.clone();
        archived["archived_at"] = json!(now);
        assert_eq!(
            plan_wait(&archived, &state, at, &triggers).unwrap(),
            WaitPlan::End
        );
        assert!(definition_ends(&archived, &state));
        let mut queued = paused.clone();
        queued["manual_pending"] = json!({"command_id": "c1"});
        assert_eq!(
            plan_wait(&definition, &queued, at, &triggers).unwrap(),
            WaitPlan::Go
        );
    }
    assert_eq!(parked, 3 + 2 + 3);
}

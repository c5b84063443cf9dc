//! The durable step loop through the library API, on every store: start,
//! tick, resume (at most once), waits, events, subworkflows, cancel, and the
//! crash-ordering law.

use std::sync::{Arc, Barrier};

use serde_json::{json, Value};
use stepwell::effects::subworkflow::named_child_id;
use stepwell::{
    Error, JsonFileStore, RunQuery, RunState, RunStatus, Runtime, StartOptions, StepRecord,
    StepStatus, Store, StoreError, WaitReason,
};
use stepwell_tests::{
    component, emitter_flow, listener_flow, manual_clock, store_tests, vars, Backend, Host,
};

fn start(h: &Host, wf: &str, v: Value) -> String {
    h.rt.start(
        wf,
        StartOptions {
            vars: vars(v),
            ..StartOptions::default()
        },
    )
    .expect("start")
}

/// How many of `records` end a wait with a resume.
fn resumes(records: &[StepRecord]) -> usize {
    records
        .iter()
        .filter(|r| {
            r.result
                .as_ref()
                .is_some_and(|v| v.get("resumed").is_some())
        })
        .count()
}

fn statuses(records: &[StepRecord]) -> Vec<&'static str> {
    records.iter().map(|r| r.status.as_str()).collect()
}

fn hello_completes_with_greeting(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("hello");
    let id = start(&h, &wf, json!({"name": "Alice"}));
    assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Running);
    let state = h.rt.tick(&id).unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    assert_eq!(state.output, Some(json!({"message": "Hello, Alice!"})));
    assert_eq!(
        h.rt.get_state(&id).unwrap(),
        state,
        "the returned state is the saved one"
    );
    let ledger = h.rt.get_ledger(&id).unwrap();
    assert_eq!(statuses(&ledger), ["completed"]);
    assert_eq!(ledger[0].node_id.as_deref(), Some("greet"));
    // Ticking an ended run changes nothing.
    assert_eq!(h.rt.tick(&id).unwrap(), state);
    assert_eq!(h.rt.get_ledger(&id).unwrap().len(), 1);
}

fn limits_are_set_at_start(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("hello");
    let id = start(&h, &wf, json!({}));
    let limits = h.rt.get_state(&id).unwrap().vars["_limits"].clone();
    for key in [
        "max_iterations",
        "current_iteration",
        "max_tokens",
        "max_output_tokens",
        "max_input_tokens",
        "estimated_tokens_used",
        "max_history_messages",
        "warn_iterations_pct",
        "warn_tokens_pct",
    ] {
        assert!(
            limits.get(key).is_some(),
            "_limits.{key} missing in {limits}"
        );
    }
    assert_eq!(limits["max_iterations"], json!(20));
    // Caller-provided limits are kept, and the others seeded key by key
    // (the reference's setdefault, spec llm-tools 4.2).
    let id = start(&h, &wf, json!({"_limits": {"max_iterations": 3}}));
    let given = h.rt.get_state(&id).unwrap().vars["_limits"].clone();
    assert_eq!(given["max_iterations"], json!(3));
    assert_eq!(given["max_tokens"], limits["max_tokens"]);
    assert_eq!(
        given.as_object().unwrap().len(),
        limits.as_object().unwrap().len()
    );
}

/// Steps without effects, one after another in a tick, whose patches add,
/// replace and remove vars (also keys the step before did not touch): the
/// store holds exactly the vars the runtime has after every tick (the
/// memory store updates only the keys a step names, so a key it missed
/// would show here), and the output is what the patches made.
fn patches_of_consecutive_steps_land_whole_in_the_store(b: Backend) {
    let h = Host::new(b);
    let hostile = component("runaway/hostile.wasm");
    let node = |patch: Value, next: &str| json!({"component": hostile, "config": {"mode": "patch", "patch": patch}, "next": next});
    let wf = h.load_scratch(
        "patches",
        &[(
            "flow.json",
            json!({"workflow_id": "patches", "entry": "a", "nodes": {
                "a": node(json!({"x": 1, "y": {"deep": [1, 2]}}), "b"),
                "b": node(json!({"x": 2, "z": "new"}), "c"),
                "c": node(json!({"y": null, "keep": "me"}), "d"),
                "d": node(json!({"x": null, "y": {"deep": [3]}}), "e"),
                "e": {"component": hostile, "config": {"mode": "echo_vars"}}}}),
        )],
    );
    let id = start(&h, &wf, json!({"keep": "start", "other": 7}));
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(h.rt.get_state(&id).unwrap().vars, run.vars);
    let mut out = run.output.unwrap();
    out.as_object_mut().unwrap().remove("_meta");
    assert_eq!(
        out,
        json!({"keep": "me", "other": 7, "y": {"deep": [3]}, "z": "new"})
    );
    // Steps in several ticks: each tick's first step compares all vars.
    let id = start(&h, &wf, json!({}));
    let mut run = h.rt.get_state(&id).unwrap();
    while run.status == RunStatus::Running {
        run = h.rt.tick_with(&id, 2).unwrap();
        assert_eq!(h.rt.get_state(&id).unwrap().vars, run.vars);
    }
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
}

fn host_owned_vars_stay_host_owned(b: Backend) {
    let h = Host::new(b);
    let hostile = component("runaway/hostile.wasm");
    let one_node = |name: &str, node: Value| {
        h.load_scratch(
            name,
            &[(
                "flow.json",
                json!({"workflow_id": name, "entry": "n", "nodes": {"n": node}}),
            )],
        )
    };
    let fails = |wf: &str, vars: Value, code: &str, what: &str| {
        let id = start(&h, wf, vars);
        let run = h.rt.tick(&id).unwrap();
        assert_eq!(run.status, RunStatus::Failed, "{wf}: {run:?}");
        let error = run.error.unwrap();
        assert!(
            error.starts_with(code) && error.contains(what),
            "{wf}: {error}"
        );
        let vars = h.rt.get_state(&id).unwrap().vars;
        assert!(vars.get("_meta").is_none(), "{wf}: nothing was written");
    };
    // A guest's vars patch.
    for key in ["_runtime", "_meta", "_limits"] {
        let wf = one_node(
            &format!("patch{}", key.replace('_', "-")),
            json!({"component": hostile, "config": {"mode": "effect",
                    "patch": {key: {"x": 1}}, "effect": {"kind": "vars_query", "payload": {}}}}),
        );
        fails(
            &wf,
            json!({}),
            "guest_bad_output",
            &format!("host-owned var \"{key}\""),
        );
    }
    // An effect's result key, asked for by a guest.
    let wf = one_node(
        "result-key",
        json!({"component": hostile, "config": {"mode": "effect",
                "effect": {"kind": "vars_query", "payload": {}, "result_key": "_meta"}}}),
    );
    fails(
        &wf,
        json!({}),
        "guest_bad_output",
        "host-owned var \"_meta\"",
    );
    // A child's vars.
    let wf = one_node(
        "child-vars",
        json!({"effect": "start_subworkflow",
               "payload": {"workflow_id": "hello", "vars": {"_runtime": {"x": 1}}}}),
    );
    h.load("hello");
    fails(&wf, json!({}), "invalid_effect", "owned by the host");
    // A flow's result key is refused when the flow is loaded.
    let dir = stepwell_tests::write_bundle(
        h.dir.path(),
        "flow-key",
        &[(
            "flow.json",
            json!({"workflow_id": "flow-key", "entry": "a", "nodes": {
                "a": {"effect": "ask_user", "payload": {"prompt": "?"}, "result_key": "_limits"}}}),
        )],
    );
    let err = h.rt.load_bundle(&dir).unwrap_err().to_string();
    assert!(err.contains("_limits"), "{err}");
    // The caller cannot seed _runtime through vars; the host can, through
    // its own option.
    let wf = one_node(
        "echo",
        json!({"component": hostile, "config": {"mode": "echo_vars"}}),
    );
    let err =
        h.rt.start(
            &wf,
            StartOptions {
                vars: vars(json!({"_runtime": {"x": 1}})),
                ..StartOptions::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.reason_code(), "invalid_input");
    let id =
        h.rt.start(
            &wf,
            StartOptions {
                vars: vars(json!({"name": "x"})),
                runtime: vars(json!({"automation": {"id": "a1"}})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    let done = h.rt.tick(&id).unwrap();
    assert_eq!(done.vars["_runtime"]["automation"], json!({"id": "a1"}));
    // A guest sees neither _runtime nor _limits unless its node asks.
    let seen = done.output.unwrap();
    assert_eq!(seen["name"], json!("x"));
    assert!(
        seen.get("_runtime").is_none() && seen.get("_limits").is_none(),
        "{seen}"
    );
    let wf = one_node(
        "echo-host",
        json!({"component": hostile, "config": {"mode": "echo_vars"}, "host_vars": true}),
    );
    let id =
        h.rt.start(
            &wf,
            StartOptions {
                runtime: vars(json!({"automation": {"id": "a2"}})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    let seen = h.rt.tick(&id).unwrap().output.unwrap();
    assert_eq!(
        seen["_runtime"]["automation"],
        json!({"id": "a2"}),
        "{seen}"
    );
    assert!(seen.get("_limits").is_some(), "{seen}");
}

fn ask_user_parks_and_resume_completes(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let id = start(&h, &wf, json!({}));
    let parked = h.rt.tick(&id).unwrap();
    assert_eq!(parked.status, RunStatus::Waiting);
    let wait = parked.waiting.clone().unwrap();
    assert_eq!(wait.reason, WaitReason::User);
    assert_eq!(wait.prompt.as_deref(), Some("What is your name?"));
    assert_eq!(wait.result_key.as_deref(), Some("user_input"));
    assert_eq!(wait.resume_to_node.as_deref(), Some("greet"));
    assert_eq!(parked.current_node.as_deref(), Some("ask"));
    assert_eq!(h.rt.get_state(&id).unwrap(), parked);
    // A tick of a parked run changes nothing.
    assert_eq!(h.rt.tick(&id).unwrap(), parked);

    let done =
        h.rt.resume(&id, &wait.wait_key, json!({"text": "Bob"}))
            .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Bob!"})));
    assert_eq!(done.vars["user_input"], json!({"text": "Bob"}));
    assert!(done.waiting.is_none());
    let ledger = h.rt.get_ledger(&id).unwrap();
    assert_eq!(
        statuses(&ledger),
        ["started", "waiting", "completed", "completed"]
    );
    assert_eq!(ledger[0].effect.as_ref().unwrap().kind, "ask_user");
    assert_eq!(ledger[0].idempotency_key, ledger[1].idempotency_key);
    assert!(ledger[0].idempotency_key.is_some());
    assert_eq!(
        ledger[2].result.as_ref().unwrap()["resumed"]["payload"],
        json!({"text": "Bob"})
    );
    assert_eq!(ledger[3].node_id.as_deref(), Some("greet"));
}

fn a_second_resume_is_stale_and_changes_nothing(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let id = start(&h, &wf, json!({}));
    let key = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    h.rt.resume(&id, &key, json!({"text": "Bob"})).unwrap();
    let before = (h.rt.get_state(&id).unwrap(), h.rt.get_ledger(&id).unwrap());
    match h.rt.resume(&id, &key, json!({"text": "Eve"})) {
        Err(e @ Error::StaleResume { .. }) => {
            assert_eq!(e.reason_code(), "stale_resume");
            assert!(e.to_string().contains("Run is not waiting"), "{e}");
        }
        other => panic!("expected a stale resume, got {other:?}"),
    }
    assert_eq!(
        (h.rt.get_state(&id).unwrap(), h.rt.get_ledger(&id).unwrap()),
        before
    );
}

fn a_wrong_wait_key_is_refused_and_changes_nothing(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let id = start(&h, &wf, json!({}));
    let parked = h.rt.tick(&id).unwrap();
    let ledger = h.rt.get_ledger(&id).unwrap();
    let err =
        h.rt.resume(&id, "not-the-key", json!({"text": "Bob"}))
            .unwrap_err();
    assert!(matches!(err, Error::StaleResume { .. }), "{err:?}");
    assert!(err.to_string().contains("not-the-key"), "{err}");
    assert_eq!(h.rt.get_state(&id).unwrap(), parked);
    assert_eq!(h.rt.get_ledger(&id).unwrap(), ledger);
}

/// A runtime remembers the state a run parked in and resumes from it
/// without reading the run back; when another runtime (another process)
/// changed the run in between, the resume is done from the stored state:
/// the right key succeeds, the old key is refused, nothing is lost.
fn a_resume_after_another_runtime_moved_the_run_is_done_from_the_store(b: Backend) {
    let h = Host::new(b);
    let flow = json!({"workflow_id": "twice", "entry": "a", "nodes": {
        "a": {"effect": "ask_user", "payload": {"prompt": "first?"}, "result_key": "first", "next": "b"},
        "b": {"effect": "ask_user", "payload": {"prompt": "second?"}, "result_key": "second", "next": "c"},
        "c": {"complete": {"first": {"$var": "first.text"}, "second": {"$var": "second.text"}}}}});
    let wf = h.load_scratch("twice", &[("flow.json", flow)]);
    let other = h.runtime(None, stepwell::RuntimeConfig::default());
    other
        .load_bundle(&h.dir.path().join("twice"))
        .expect("load in the other runtime");

    // This runtime parks the run on the first question; the other answers
    // it, and the run parks on the second.
    let id = start(&h, &wf, json!({}));
    let first = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    let moved = other.resume(&id, &first, json!({"text": "one"})).unwrap();
    assert_eq!(moved.status, RunStatus::Waiting);
    let second = moved.waiting.unwrap().wait_key;
    assert_ne!(first, second);

    // The old key: refused (this runtime's memory says the run waits on
    // it), and nothing changes.
    let before = (h.rt.get_state(&id).unwrap(), h.rt.get_ledger(&id).unwrap());
    let err =
        h.rt.resume(&id, &first, json!({"text": "again"}))
            .unwrap_err();
    assert!(matches!(err, Error::StaleResume { .. }), "{err:?}");
    assert!(err.to_string().contains("wait_key mismatch"), "{err}");
    assert_eq!(
        (h.rt.get_state(&id).unwrap(), h.rt.get_ledger(&id).unwrap()),
        before
    );

    // Parked by this runtime again, then moved on by the other: the new
    // key succeeds here.
    let id = start(&h, &wf, json!({}));
    let first = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    let second = other
        .resume(&id, &first, json!({"text": "one"}))
        .unwrap()
        .waiting
        .unwrap()
        .wait_key;
    let done = h.rt.resume(&id, &second, json!({"text": "two"})).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!({"first": "one", "second": "two"})));
    let ledger = h.rt.get_ledger(&id).unwrap();
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
    assert_eq!(resumes(&ledger), 2, "each answer resumed the run once");

    // Parked here, cancelled by the other: the resume finds it not waiting.
    let id = start(&h, &wf, json!({}));
    let first = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    other.cancel_run(&id, Some("changed my mind")).unwrap();
    let err =
        h.rt.resume(&id, &first, json!({"text": "late"}))
            .unwrap_err();
    assert!(err.to_string().contains("Run is not waiting"), "{err}");
    assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Cancelled);
}

fn unknown_runs_are_not_found(b: Backend) {
    let h = Host::new(b);
    h.load("ask-user");
    for err in [
        h.rt.resume("nope", "k", json!({})).unwrap_err(),
        h.rt.tick("nope").unwrap_err(),
        h.rt.get_state("nope").unwrap_err(),
        h.rt.get_ledger("nope").unwrap_err(),
        h.rt.cancel_run("nope", None).unwrap_err(),
    ] {
        assert!(matches!(err, Error::RunNotFound { .. }), "{err:?}");
        assert_eq!(err.reason_code(), "run_not_found");
    }
    assert!(h.rt.list_runs(&RunQuery::default()).unwrap().is_empty());
}

fn concurrent_resumes_of_one_wait_succeed_once(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let id = start(&h, &wf, json!({}));
    let key = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (rt, id, key, barrier) = (h.rt.clone(), id.clone(), key.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                rt.resume(&id, &key, json!({"text": format!("caller {i}")}))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let stale = results
        .iter()
        .filter(|r| matches!(r, Err(Error::StaleResume { .. })))
        .count();
    assert_eq!((ok, stale), (1, n - 1), "{results:?}");
    let ledger = h.rt.get_ledger(&id).unwrap();
    let greets = ledger
        .iter()
        .filter(|r| r.node_id.as_deref() == Some("greet"))
        .count();
    assert_eq!(greets, 1, "the resumed node ran exactly once");
}

/// A node's `now` counts from 1970: a step under a clock that reads
/// earlier fails, naming the clock, rather than pass a wrong time.
fn a_step_under_a_clock_before_1970_fails(b: Backend) {
    use chrono::TimeZone;
    let clock = Arc::new(stepwell::ManualClock::new(
        chrono::Utc
            .with_ymd_and_hms(1969, 12, 31, 23, 59, 59)
            .unwrap(),
    ));
    let h = Host::with_clock(b, clock);
    let wf = h.load("hello");
    let id = start(&h, &wf, json!({"name": "Ada"}));
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.error.unwrap();
    assert!(
        error.starts_with(
            "invalid_state: the host's clock reads 1969-12-31T23:59:59.000000Z, before 1970"
        ),
        "{error}"
    );
}

fn wait_until_is_resumed_by_the_driver_when_due(b: Backend) {
    let clock = manual_clock();
    let h = Host::with_clock(b, clock.clone());
    let wf = h.load("wait-until");
    let id = start(&h, &wf, json!({"seconds": 60}));
    let parked = h.rt.tick(&id).unwrap();
    assert_eq!(parked.status, RunStatus::Waiting);
    let wait = parked.waiting.unwrap();
    assert_eq!(wait.reason, WaitReason::Until);
    assert_eq!(wait.until.as_deref(), Some("2026-11-30T09:01:00.000000Z"));

    clock.advance(chrono::Duration::seconds(59));
    let report = h.rt.drive_once().unwrap();
    assert!(report.due_resumed.is_empty(), "{report:?}");
    assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Waiting);

    clock.advance(chrono::Duration::seconds(1));
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.due_resumed, vec![id.clone()]);
    let done = h.rt.get_state(&id).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!({"ok": true})));
    stepwell_tests::assert_forkable(&h.rt, &id);
    // The default of 2 seconds.
    let id = start(&h, &wf, json!({}));
    let until = h.rt.tick(&id).unwrap().waiting.unwrap().until.unwrap();
    assert_eq!(until, "2026-11-30T09:01:02.000000Z");
    clock.advance(chrono::Duration::seconds(2));
    assert_eq!(
        h.rt.tick(&id).unwrap().status,
        RunStatus::Completed,
        "a tick resolves a due wait"
    );
}

fn deadline_flow() -> Value {
    json!({
        "workflow_id": "deadline",
        "entry": "wait",
        "nodes": {
            "wait": {
                "effect": "wait_event",
                "payload": {"wait_key": {"$var": "key"}, "until": {"$var": "deadline"}},
                "result_key": "event",
                "next": "done"
            },
            "done": {"complete": {"$var": "event"}}
        }
    })
}

fn an_event_wait_times_out_at_its_deadline(b: Backend) {
    let clock = manual_clock();
    let h = Host::with_clock(b, clock.clone());
    let wf = h.load_scratch("deadline", &[("flow.json", deadline_flow())]);
    let id = start(
        &h,
        &wf,
        json!({"key": "k1", "deadline": "2026-11-30T10:30:00+01:00"}),
    );
    let parked = h.rt.tick(&id).unwrap();
    let wait = parked.waiting.unwrap();
    assert_eq!(
        (wait.reason, wait.wait_key.as_str()),
        (WaitReason::Event, "k1")
    );
    assert_eq!(
        wait.until.as_deref(),
        Some("2026-11-30T09:30:00.000000Z"),
        "normalised to UTC"
    );
    clock.advance(chrono::Duration::minutes(29));
    assert!(h.rt.drive_once().unwrap().due_resumed.is_empty());
    clock.advance(chrono::Duration::minutes(1));
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.due_resumed, vec![id.clone()]);
    let done = h.rt.get_state(&id).unwrap();
    assert_eq!(done.output, Some(json!({"timed_out": true})));

    // A deadline already past resolves at once, without parking.
    let id = start(
        &h,
        &wf,
        json!({"key": "k0", "deadline": "2026-11-30T09:00:00Z"}),
    );
    assert_eq!(
        h.rt.tick(&id).unwrap().output,
        Some(json!({"timed_out": true}))
    );

    // An event before the deadline wins.
    let id = start(
        &h,
        &wf,
        json!({"key": "k2", "deadline": "2026-11-30T10:30:00Z"}),
    );
    h.rt.tick(&id).unwrap();
    let done = h.rt.resume(&id, "k2", json!({"paid": true})).unwrap();
    assert_eq!(done.output, Some(json!({"paid": true})));
    clock.advance(chrono::Duration::hours(1));
    assert!(h.rt.drive_once().unwrap().due_resumed.is_empty());
}

fn an_event_name_cannot_reach_another_workflows_scope(b: Backend) {
    // Workflow "tenantB" emits "billing:invoice.paid" to its workflow
    // scope; workflow "tenantB:billing" waits on "invoice.paid" in its own.
    // Joined with ':' the two keys would be one; they are not.
    let h = Host::new(b);
    let load = |name: &str, flow: Value| h.load_scratch(name, &[("flow.json", flow)]);
    let listener = load(
        "listener",
        listener_flow(
            "tenantB:billing",
            json!({"name": "invoice.paid", "scope": "workflow"}),
            json!({"$var": "got"}),
        ),
    );
    let spy = load(
        "spy",
        listener_flow(
            "spy",
            json!({"wait_key": "evt:workflow:tenantB:billing:invoice.paid"}),
            json!({"$var": "got"}),
        ),
    );
    let emitter = load(
        "emitter",
        emitter_flow(
            "tenantB",
            json!({"name": "billing:invoice.paid", "scope": "workflow", "payload": {}}),
            json!({"$var": "sent"}),
        ),
    );
    let l = start(&h, &listener, json!({}));
    let waiting = h.rt.tick(&l).unwrap();
    assert_eq!(
        waiting.waiting.unwrap().wait_key,
        "evt:workflow:tenantB%3Abilling:invoice.paid"
    );
    // A flow cannot wait on an event key by hand.
    let s = start(&h, &spy, json!({}));
    let refused = h.rt.tick(&s).unwrap();
    assert_eq!(refused.status, RunStatus::Failed);
    assert!(
        refused
            .error
            .as_deref()
            .unwrap()
            .starts_with("invalid_effect: wait_event.payload.wait_key"),
        "{refused:?}"
    );
    let e = start(&h, &emitter, json!({}));
    let sent = h.rt.tick(&e).unwrap().output.unwrap();
    assert_eq!(sent["delivered"], json!(0), "{sent}");
    assert_eq!(
        sent["wait_key"],
        json!("evt:workflow:tenantB:billing%3Ainvoice.paid")
    );
    assert_eq!(h.rt.get_state(&l).unwrap().status, RunStatus::Waiting);

    // A wildcard listener of a scope gets every name, ':' or not.
    let any = load(
        "any",
        listener_flow(
            "any",
            json!({"name": "*", "scope": "global"}),
            json!({"$var": "got.name"}),
        ),
    );
    let shout = load(
        "shout",
        emitter_flow(
            "shout",
            json!({"name": "billing:invoice.paid", "scope": "global"}),
            json!({"$var": "sent.delivered"}),
        ),
    );
    let w = start(&h, &any, json!({}));
    assert_eq!(
        h.rt.tick(&w).unwrap().waiting.unwrap().wait_key,
        "evt:global:global:*"
    );
    let e = start(&h, &shout, json!({}));
    assert_eq!(h.rt.tick(&e).unwrap().output, Some(json!(1)));
    assert_eq!(
        h.rt.get_state(&w).unwrap().output,
        Some(json!("billing:invoice.paid"))
    );
}

fn emit_event_resumes_every_waiting_run(b: Backend) {
    let h = Host::new(b);
    let waiter = h.load("event");
    let a = start(&h, &waiter, json!({}));
    let c = start(&h, &waiter, json!({}));
    for id in [&a, &c] {
        let w = h.rt.tick(id).unwrap().waiting.unwrap();
        assert_eq!(
            (w.reason, w.wait_key.as_str()),
            (WaitReason::Event, "evt:global:global:order.paid")
        );
        assert_eq!(w.details, Some(json!({"kind": "order"})));
    }
    let waiting =
        h.rt.list_runs(&RunQuery {
            status: Some(RunStatus::Waiting),
            wait_reason: Some(WaitReason::Event),
            ..RunQuery::default()
        })
        .unwrap();
    assert_eq!(waiting.len(), 2);

    let emitter = start(&h, "event.emitter", json!({"payload": {"order": 42}}));
    let out = h.rt.tick(&emitter).unwrap();
    assert_eq!(out.status, RunStatus::Completed);
    let result = out.output.clone().unwrap();
    assert_eq!(result["delivered"], json!(2));
    assert_eq!(result["wait_key"], json!("evt:global:global:order.paid"));
    assert_eq!(result["delivered_to"], json!([a, c]));
    for id in [&a, &c] {
        let s = h.rt.get_state(id).unwrap();
        assert_eq!(s.status, RunStatus::Completed);
        // The listener gets the event's envelope.
        let event = &s.output.as_ref().unwrap()["received"];
        assert_eq!(event["payload"], json!({"order": 42}));
        assert_eq!(event["name"], json!("order.paid"));
        assert_eq!(event["scope"], json!("global"));
        assert_eq!(event["emitter"]["run_id"], json!(emitter));
        stepwell_tests::assert_forkable(&h.rt, id);
    }
    stepwell_tests::assert_forkable(&h.rt, &emitter);
    // Nobody is listening any more.
    let again = start(&h, "event.emitter", json!({"payload": 1}));
    assert_eq!(
        h.rt.tick(&again).unwrap().output.unwrap()["delivered"],
        json!(0)
    );
}

fn a_sync_subworkflow_completes_with_the_child_output(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("subworkflow");
    let id = start(&h, &wf, json!({"text": "hi"}));
    let done = h.rt.tick(&id).unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{:?}", done.error);
    assert_eq!(done.output, Some(json!({"shouted": "HI"})));
    let child_id = done.vars["child"]["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let child = h.rt.get_state(&child_id).unwrap();
    assert_eq!(child.parent_run_id.as_deref(), Some(id.as_str()));
    assert_eq!(child.workflow_id, "subworkflow.child");
    assert_eq!(child.status, RunStatus::Completed);
    let children =
        h.rt.list_runs(&RunQuery {
            parent_run_id: Some(id.clone()),
            ..RunQuery::default()
        })
        .unwrap();
    assert_eq!(children.len(), 1);
}

fn explicit_child_ids_are_created_once_and_identity_checked(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("subworkflow");
    let p1 = start(&h, &wf, json!({"text": "one", "child_run_id": "child-1"}));
    let done = h.rt.tick(&p1).unwrap();
    assert_eq!(done.output, Some(json!({"shouted": "ONE"})));
    // A named child lives under its parent: its id is derived from the
    // parent's id and the name.
    let id1 = named_child_id(&p1, "child-1");
    assert_eq!(done.vars["child"]["sub_run_id"], json!(id1));
    let child = h.rt.get_state(&id1).unwrap();
    assert_eq!(child.parent_run_id.as_deref(), Some(p1.as_str()));
    assert!(matches!(
        h.rt.get_state("child-1"),
        Err(Error::RunNotFound { .. })
    ));

    // Another parent naming a child the same: its own child, under its own
    // id; the first one is untouched.
    let p2 = start(&h, &wf, json!({"text": "two", "child_run_id": "child-1"}));
    let done2 = h.rt.tick(&p2).unwrap();
    assert_eq!(done2.output, Some(json!({"shouted": "TWO"})));
    let id2 = named_child_id(&p2, "child-1");
    assert_ne!(id1, id2);
    assert_eq!(
        h.rt.get_state(&id2).unwrap().parent_run_id.as_deref(),
        Some(p2.as_str())
    );
    assert_eq!(
        h.rt.get_state(&id1).unwrap(),
        child,
        "the existing child is untouched"
    );
    // A run started under the id a parent's name gives, with another
    // identity, is a conflict when the parent names that child.
    h.rt.start(
        "subworkflow.child",
        StartOptions {
            run_id: Some(named_child_id("p3", "child-1")),
            ..StartOptions::default()
        },
    )
    .unwrap();
    let p3 =
        h.rt.run(
            &wf,
            StartOptions {
                run_id: Some("p3".into()),
                vars: vars(json!({"text": "three", "child_run_id": "child-1"})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    assert_eq!(p3.status, RunStatus::Failed);
    assert_eq!(
        p3.error.unwrap(),
        format!(
            "identity_conflict: run {} already exists with a different parent_run_id",
            named_child_id("p3", "child-1")
        )
    );

    // The same identity through the API (the same workflow, parent and
    // vars, hence the same creation digest) returns the existing run
    // untouched; other vars are another creation.
    let same =
        h.rt.start(
            "subworkflow.child",
            StartOptions {
                vars: vars(json!({"text": "one"})),
                run_id: Some(id1.clone()),
                parent_run_id: Some(p1.clone()),
                ..StartOptions::default()
            },
        )
        .unwrap();
    assert_eq!(same, id1);
    assert_eq!(h.rt.get_state(&id1).unwrap(), child);
    let err =
        h.rt.start(
            "subworkflow.child",
            StartOptions {
                vars: vars(json!({"text": "other"})),
                run_id: Some(id1.clone()),
                parent_run_id: Some(p1.clone()),
                ..StartOptions::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::IdentityConflict { field, .. } if field == "vars._meta.creation_digest"),
        "{err:?}"
    );
    // A different workflow under that id is a conflict.
    let err =
        h.rt.start(
            "subworkflow",
            StartOptions {
                run_id: Some(id1.clone()),
                parent_run_id: Some(p1.clone()),
                ..StartOptions::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::IdentityConflict { field, .. } if field == "workflow_id"),
        "{err:?}"
    );
    assert_eq!(err.reason_code(), "identity_conflict");
    // The host's bookkeeping cannot be seeded by a caller.
    let err =
        h.rt.start(
            "subworkflow",
            StartOptions {
                vars: vars(json!({"_runtime": {"effect_seq": 99}})),
                ..StartOptions::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { field, .. } if field == "vars._runtime"),
        "{err:?}"
    );
    // Malformed explicit ids are refused before anything is written.
    let err =
        h.rt.start(
            "subworkflow",
            StartOptions {
                run_id: Some("no spaces/allowed".into()),
                ..StartOptions::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidInput { field, .. } if field == "run_id"),
        "{err:?}"
    );
}

fn async_flows() -> Vec<(&'static str, Value)> {
    vec![
        (
            "flow.json",
            json!({
                "workflow_id": "parent",
                "entry": "start",
                "nodes": {
                    "start": {
                        "effect": "start_subworkflow",
                        "payload": {"workflow_id": "asker", "async": true, "wait": {"$var": "wait"},
                                    "on_child_failure": {"$var": "on_child_failure"},
                                    "run_id": {"$var": "child_id"}},
                        "result_key": "child",
                        "next": "done"
                    },
                    "done": {"complete": {"$var": "child"}}
                }
            }),
        ),
        (
            "asker.flow.json",
            json!({
                "workflow_id": "asker",
                "entry": "ask",
                "nodes": {
                    "ask": {
                        "effect": "ask_user",
                        "payload": {"prompt": "Go?", "wait_key": "go"},
                        "result_key": "answer",
                        "next": "done"
                    },
                    "done": {"complete": {"answer": {"$var": "answer.text"}}}
                }
            }),
        ),
    ]
}

fn an_async_child_resumes_its_waiting_parent_through_the_driver(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch("async", &async_flows());
    let parent = start(&h, &wf, json!({"wait": true}));
    let parked = h.rt.tick(&parent).unwrap();
    let wait = parked.waiting.unwrap();
    assert_eq!(wait.reason, WaitReason::Subworkflow);
    let child = wait.details.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wait.wait_key, format!("subworkflow:{child}"));
    assert_eq!(
        h.rt.get_state(&child).unwrap().status,
        RunStatus::Running,
        "async: not ticked by the parent"
    );

    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.ticked, vec![child.clone()]);
    assert_eq!(h.rt.get_state(&child).unwrap().status, RunStatus::Waiting);
    assert!(report.parents_resumed.is_empty());

    h.rt.resume(&child, "go", json!({"text": "yes"})).unwrap();
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed, vec![parent.clone()]);
    let done = h.rt.get_state(&parent).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(
        done.output,
        Some(json!({"sub_run_id": child, "status": "completed", "output": {"answer": "yes"}}))
    );
}

fn a_cancelled_child_resumes_its_waiting_parent_with_its_outcome(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch("async", &async_flows());
    let parent = start(&h, &wf, json!({"wait": true}));
    let wait = h.rt.tick(&parent).unwrap().waiting.unwrap();
    let child = wait.details.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    h.rt.cancel_run(&child, Some("not needed")).unwrap();
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed, vec![parent.clone()]);
    let done = h.rt.get_state(&parent).unwrap();
    assert_eq!(done.status, RunStatus::Completed, "a failed child is data");
    assert_eq!(
        done.output,
        Some(json!({
            "sub_run_id": child,
            "status": "cancelled",
            "output": {"success": false, "cancelled": true, "error": "cancelled: not needed"},
            "error": "cancelled: not needed",
            "cancelled": true,
        }))
    );
    // A second pass finds nothing more to do.
    assert!(h.rt.drive_once().unwrap().parents_resumed.is_empty());
}

fn a_parent_that_says_fail_fails_with_its_child(b: Backend) {
    // The child asks, then waits as long as the answer says: an answer that
    // is not a number fails it (invalid_effect).
    let h = Host::new(b);
    let mut flows = async_flows();
    flows[1] = (
        "asker.flow.json",
        json!({"workflow_id": "asker", "entry": "ask", "nodes": {
            "ask": {"effect": "ask_user", "payload": {"prompt": "How long?", "wait_key": "go"},
                    "result_key": "answer", "next": "sleep"},
            "sleep": {"effect": "wait_until", "payload": {"seconds": {"$var": "answer.text"}},
                      "next": "done"},
            "done": {"complete": {"slept": true}}}}),
    );
    let wf = h.load_scratch("async", &flows);
    let parent = start(&h, &wf, json!({"wait": true, "on_child_failure": "fail"}));
    let wait = h.rt.tick(&parent).unwrap().waiting.unwrap();
    let child = wait.details.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    h.rt.tick(&child).unwrap();
    let failed_child = h.rt.resume(&child, "go", json!({"text": "soon"})).unwrap();
    assert_eq!(failed_child.status, RunStatus::Failed, "{failed_child:?}");
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed, vec![parent.clone()]);
    let failed = h.rt.get_state(&parent).unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(failed.error.unwrap().starts_with("subworkflow_failed"));
    assert_eq!(
        h.rt.get_ledger(&parent).unwrap().last().unwrap().status,
        StepStatus::Failed
    );

    // A cancelled child is data even so: whoever cancelled it meant the
    // child (as in the reference runtime).
    let parent = start(&h, &wf, json!({"wait": true, "on_child_failure": "fail"}));
    let wait = h.rt.tick(&parent).unwrap().waiting.unwrap();
    let child = wait.details.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    h.rt.cancel_run(&child, Some("not needed")).unwrap();
    h.rt.drive_once().unwrap();
    let done = h.rt.get_state(&parent).unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:?}");
    assert_eq!(done.output.unwrap()["cancelled"], json!(true));
}

fn a_parent_learns_that_its_child_was_quarantined(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch("async", &async_flows());
    let mut parents = Vec::new();
    for policy in ["data", "fail"] {
        let parent = start(&h, &wf, json!({"wait": true, "on_child_failure": policy}));
        let wait = h.rt.tick(&parent).unwrap().waiting.unwrap();
        let child = wait.details.unwrap()["sub_run_id"]
            .as_str()
            .unwrap()
            .to_string();
        h.store
            .quarantine(&child, "store_corrupt: unreadable")
            .unwrap();
        parents.push((parent, child));
    }
    let report = h.rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed.len(), 2, "{report:?}");
    let (data, child) = &parents[0];
    let done = h.rt.get_state(data).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let out = done.output.unwrap();
    assert_eq!(out["sub_run_id"], json!(child));
    assert_eq!(out["status"], json!("quarantined"));
    assert_eq!(out["output"]["success"], json!(false));
    assert!(
        out["error"].as_str().unwrap().contains("unreadable"),
        "{out}"
    );
    let failed = h.rt.get_state(&parents[1].0).unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .starts_with("subworkflow_failed"),
        "{failed:?}"
    );
    assert!(h.rt.drive_once().unwrap().parents_resumed.is_empty());
}

fn a_child_that_ended_before_its_parent_waited_is_read_at_once(b: Backend) {
    // A replay: the parent's async start of an explicit child runs again
    // after the child already finished; the parent continues with the
    // child's outcome instead of waiting for ever.
    let h = Host::new(b);
    let wf = h.load_scratch("async", &async_flows());
    let kid = named_child_id("dad", "kid");
    h.rt.start(
        "asker",
        StartOptions {
            run_id: Some(kid.clone()),
            parent_run_id: Some("dad".into()),
            ..StartOptions::default()
        },
    )
    .unwrap();
    h.rt.cancel_run(&kid, Some("gone")).unwrap();
    let done =
        h.rt.run(
            &wf,
            StartOptions {
                run_id: Some("dad".into()),
                vars: vars(json!({"wait": true, "child_id": "kid"})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output.unwrap()["status"], json!("cancelled"));
}

fn a_fire_and_forget_child_runs_on_its_own(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch("async", &async_flows());
    let parent = start(&h, &wf, json!({"wait": false}));
    let done = h.rt.tick(&parent).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let child = done.output.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(h.rt.get_state(&child).unwrap().status, RunStatus::Running);
    h.rt.drive_once().unwrap();
    assert_eq!(h.rt.get_state(&child).unwrap().status, RunStatus::Waiting);
}

fn vars_query_and_answer_user_complete_at_once(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch(
        "misc",
        &[(
            "flow.json",
            json!({
                "workflow_id": "misc",
                "entry": "tell",
                "nodes": {
                    "tell": {"effect": "answer_user", "payload": {"message": "working on it"}, "result_key": "told", "next": "one"},
                    "one": {"effect": "vars_query", "payload": {"path": "deep.x.1"}, "result_key": "q1", "next": "many"},
                    "many": {"effect": "vars_query", "payload": {"paths": ["deep.x", "missing"]}, "result_key": "q2", "next": "done"},
                    "done": {"complete": {"told": {"$var": "told"}, "q1": {"$var": "q1"}, "q2": {"$var": "q2"}}}
                }
            }),
        )],
    );
    let id = start(&h, &wf, json!({"deep": {"x": [1, 2]}}));
    let done = h.rt.tick(&id).unwrap();
    assert_eq!(
        done.output,
        Some(
            json!({"told": {"message": "working on it"}, "q1": 2, "q2": {"deep.x": [1, 2], "missing": null}})
        )
    );
    assert_eq!(done.vars["_runtime"]["effect_seq"], json!(3));
    let kinds: Vec<_> =
        h.rt.get_ledger(&id)
            .unwrap()
            .into_iter()
            .filter(|r| r.status == StepStatus::Completed)
            .filter_map(|r| r.effect.map(|e| e.kind))
            .collect();
    assert_eq!(kinds, ["answer_user", "vars_query", "vars_query"]);
}

fn an_invalid_effect_payload_fails_the_run_naming_the_field(b: Backend) {
    let h = Host::new(b);
    let wf = h.load_scratch(
        "bad-effect",
        &[(
            "flow.json",
            json!({"workflow_id": "bad-effect", "entry": "ask",
                   "nodes": {"ask": {"effect": "ask_user", "payload": {"question": "?"}}}}),
        )],
    );
    let id = start(&h, &wf, json!({}));
    let failed = h.rt.tick(&id).unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.error.as_deref(),
        Some("invalid_effect: ask_user.payload.prompt: is required")
    );
    assert_eq!(
        statuses(&h.rt.get_ledger(&id).unwrap()),
        ["started", "failed"]
    );

    let wf = h.load_scratch(
        "bad-async",
        &[(
            "flow.json",
            json!({"workflow_id": "bad-async", "entry": "go",
                   "nodes": {"go": {"effect": "start_subworkflow", "payload": {"workflow_id": "bad-async", "async": "yes"}}}}),
        )],
    );
    let id = start(&h, &wf, json!({}));
    let failed = h.rt.tick(&id).unwrap();
    assert_eq!(
        failed.error.as_deref(),
        Some("invalid_effect: start_subworkflow.payload.async: must be a boolean")
    );
    assert!(h
        .rt
        .list_runs(&RunQuery {
            parent_run_id: Some(id),
            ..RunQuery::default()
        })
        .unwrap()
        .is_empty());
}

fn cancel_stops_a_waiting_run(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let id = start(&h, &wf, json!({}));
    let key = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    let cancelled = h.rt.cancel_run(&id, Some("changed my mind")).unwrap();
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    assert_eq!(
        cancelled.error.as_deref(),
        Some("cancelled: changed my mind")
    );
    assert_eq!(
        h.rt.get_ledger(&id).unwrap().last().unwrap().status,
        StepStatus::Cancelled
    );
    assert!(matches!(
        h.rt.resume(&id, &key, json!({})),
        Err(Error::StaleResume { .. })
    ));
    // Cancelling again returns the ended run unchanged.
    assert_eq!(h.rt.cancel_run(&id, None).unwrap(), cancelled);
}

fn routes(b: Backend, with_route: bool) -> RunState {
    let h = Host::new(b);
    let hostile = component("runaway/hostile.wasm");
    let mut spin = json!({"component": hostile, "config": {"mode": "unknown_next"}});
    if with_route {
        spin["routes"] = json!({"nowhere": "end"});
    }
    let wf = h.load_scratch(
        "routes",
        &[(
            "flow.json",
            json!({"workflow_id": "routes", "entry": "spin",
                   "nodes": {"spin": spin, "end": {"complete": "routed"}}}),
        )],
    );
    let id = start(&h, &wf, json!({}));
    h.rt.tick(&id).unwrap()
}

fn route_labels_map_to_nodes(b: Backend) {
    let done = routes(b, true);
    assert_eq!(done.output, Some(json!("routed")));
    let failed = routes(b, false);
    assert_eq!(failed.status, RunStatus::Failed);
    let error = failed.error.unwrap();
    assert!(
        error.starts_with("guest_bad_output") && error.contains("\"nowhere\""),
        "{error}"
    );
}

fn list_filters_by_status_and_wait_reason(b: Backend) {
    let h = Host::new(b);
    let hello = h.load("hello");
    let ask = h.load("ask-user");
    let done = start(&h, &hello, json!({}));
    h.rt.tick(&done).unwrap();
    let parked = start(&h, &ask, json!({}));
    h.rt.tick(&parked).unwrap();
    let fresh = start(&h, &hello, json!({}));
    let ids = |q: RunQuery| -> Vec<String> {
        h.rt.list_runs(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    assert_eq!(
        ids(RunQuery::default()),
        vec![done.clone(), parked.clone(), fresh.clone()]
    );
    assert_eq!(
        ids(RunQuery {
            status: Some(RunStatus::Completed),
            ..Default::default()
        }),
        vec![done.clone()]
    );
    assert_eq!(
        ids(RunQuery {
            status: Some(RunStatus::Running),
            ..Default::default()
        }),
        vec![fresh.clone()]
    );
    assert_eq!(
        ids(RunQuery {
            wait_reason: Some(WaitReason::User),
            ..Default::default()
        }),
        vec![parked.clone()]
    );
    assert!(ids(RunQuery {
        wait_reason: Some(WaitReason::Event),
        ..Default::default()
    })
    .is_empty());
    assert_eq!(
        ids(RunQuery {
            workflow_id: Some(hello.clone()),
            limit: Some(1),
            ..Default::default()
        }),
        vec![done]
    );
}

store_tests!(
    hello_completes_with_greeting,
    limits_are_set_at_start,
    patches_of_consecutive_steps_land_whole_in_the_store,
    a_step_under_a_clock_before_1970_fails,
    ask_user_parks_and_resume_completes,
    host_owned_vars_stay_host_owned,
    a_second_resume_is_stale_and_changes_nothing,
    a_wrong_wait_key_is_refused_and_changes_nothing,
    a_resume_after_another_runtime_moved_the_run_is_done_from_the_store,
    unknown_runs_are_not_found,
    concurrent_resumes_of_one_wait_succeed_once,
    wait_until_is_resumed_by_the_driver_when_due,
    an_event_wait_times_out_at_its_deadline,
    emit_event_resumes_every_waiting_run,
    an_event_name_cannot_reach_another_workflows_scope,
    a_sync_subworkflow_completes_with_the_child_output,
    explicit_child_ids_are_created_once_and_identity_checked,
    an_async_child_resumes_its_waiting_parent_through_the_driver,
    a_cancelled_child_resumes_its_waiting_parent_with_its_outcome,
    a_parent_that_says_fail_fails_with_its_child,
    a_parent_learns_that_its_child_was_quarantined,
    a_child_that_ended_before_its_parent_waited_is_read_at_once,
    a_fire_and_forget_child_runs_on_its_own,
    vars_query_and_answer_user_complete_at_once,
    an_invalid_effect_payload_fails_the_run_naming_the_field,
    cancel_stops_a_waiting_run,
    route_labels_map_to_nodes,
    list_filters_by_status_and_wait_reason,
);

mod driver {
    //! The driver's fairness: broken runs set aside, running runs served in turn.
    use super::*;
    use stepwell::RuntimeConfig;

    /// Removes every deployed version of `workflow_id` from the store:
    /// another process can no longer load its runs' code.
    fn forget_bundle(h: &Host, workflow_id: &str) {
        let versions = h.store.workflow_versions(Some(workflow_id)).unwrap();
        assert_eq!(h.store.remove_versions(&versions).unwrap(), versions.len());
    }

    fn a_few_broken_due_runs_never_starve_the_driver(b: Backend) {
        // Six due runs of a workflow whose bundle is gone fail every time the
        // driver takes them; a pass takes four runs. They are set aside after
        // each failure, so the second pass reaches the good runs behind them.
        let clock = stepwell_tests::manual_clock();
        let config = RuntimeConfig {
            drive_batch: 4,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, clock.clone(), config.clone());
        let steps = stepwell_tests::example("wait-until").join("steps.wasm");
        let broken = h.load_scratch(
            "broken",
            &[(
                "flow.json",
                json!({"workflow_id": "broken-wait", "entry": "schedule", "nodes": {
                    "schedule": {"component": steps, "next": "execute"},
                    "execute": {"component": steps}}}),
            )],
        );
        let good = h.load("wait-until");
        let start = |wf: &str, seconds: u64| {
            let id =
                h.rt.start(
                    wf,
                    StartOptions {
                        vars: stepwell_tests::vars(json!({"seconds": seconds})),
                        ..StartOptions::default()
                    },
                )
                .unwrap();
            assert_eq!(h.rt.tick(&id).unwrap().status, RunStatus::Waiting);
            id
        };
        let bad: Vec<String> = (0..6).map(|_| start(&broken, 1)).collect();
        let fine: Vec<String> = (0..2).map(|_| start(&good, 2)).collect();
        forget_bundle(&h, "broken-wait");
        clock.advance(chrono::Duration::seconds(10));

        // Another process: it knows the broken workflow only by its bundle.
        let rt = h.runtime(Some(clock.clone()), config);
        let first = rt.drive_once().unwrap();
        assert_eq!(first.errors.len(), 4, "{first:?}");
        assert!(first.due_resumed.is_empty(), "{first:?}");
        assert!(
            first.errors[0].error.starts_with("unknown_version"),
            "{first:?}"
        );
        let second = rt.drive_once().unwrap();
        assert_eq!(second.errors.len(), 2, "{second:?}");
        let mut resumed = second.due_resumed.clone();
        resumed.sort();
        let mut expected = fine.clone();
        expected.sort();
        assert_eq!(resumed, expected, "{second:?}");
        for id in &fine {
            assert_eq!(rt.get_state(id).unwrap().status, RunStatus::Completed);
        }
        // The broken runs wait, set aside: the next pass leaves them be.
        let third = rt.drive_once().unwrap();
        assert!(third.errors.is_empty(), "{third:?}");
        for id in &bad {
            assert_eq!(rt.get_state(id).unwrap().status, RunStatus::Waiting);
        }
        // Their time comes again, and they fail again (the bundle is still
        // gone): each is set aside longer.
        clock.advance(chrono::Duration::seconds(2));
        assert_eq!(rt.drive_once().unwrap().errors.len(), 4);
    }

    fn the_driver_rotates_through_more_running_runs_than_a_pass_takes(b: Backend) {
        // Four running chains, two runs and one step per pass: the second pass
        // serves the two the first did not.
        let config = RuntimeConfig {
            drive_batch: 2,
            drive_steps_per_run: 1,
            // Batches, not time: however slow the machine, a pass hands
            // out its whole batch.
            drive_pass_time: std::time::Duration::from_secs(60),
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, stepwell_tests::manual_clock(), config);
        let wf = h.load("chain");
        let ids: Vec<String> = (0..4)
            .map(|_| h.rt.start(&wf, StartOptions::default()).unwrap())
            .collect();
        let first = h.rt.drive_once().unwrap().ticked;
        let second = h.rt.drive_once().unwrap().ticked;
        assert_eq!(first.len(), 2);
        let mut all: Vec<String> = first.iter().chain(&second).cloned().collect();
        all.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(all, expected, "first {first:?}, second {second:?}");
        // And on, until every chain is done.
        for _ in 0..20 {
            h.rt.drive_once().unwrap();
        }
        for id in &ids {
            assert_eq!(h.rt.get_state(id).unwrap().status, RunStatus::Completed);
        }
    }

    fn a_pass_hands_out_running_runs_only_for_its_time(b: Backend) {
        // Three running chains and no time per pass: each pass moves one of
        // them (at least one, so the backlog still moves), then ends, so
        // the next starts with what fell due meanwhile.
        let config = RuntimeConfig {
            drive_pass_time: std::time::Duration::ZERO,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, stepwell_tests::manual_clock(), config);
        let wf = h.load("chain");
        let ids: Vec<String> = (0..3)
            .map(|_| h.rt.start(&wf, StartOptions::default()).unwrap())
            .collect();
        let mut moved = Vec::new();
        for _ in 0..3 {
            let ticked = h.rt.drive_once().unwrap().ticked;
            assert_eq!(ticked.len(), 1, "{ticked:?}");
            moved.extend(ticked);
        }
        moved.sort();
        let mut expected = ids.clone();
        expected.sort();
        assert_eq!(moved, expected);
        for id in &ids {
            assert_eq!(h.rt.get_state(id).unwrap().status, RunStatus::Completed);
        }
    }

    fn listeners_that_answer_an_event_with_itself_end_bounded(b: Backend) {
        // Twelve runs each answer "ping" with "ping" and wait again: every
        // emit resumes every other listener, inside the step, without end.
        // One step executes at most max_cascade_runs others inline (the
        // rest are resumed and left to the driver, keeping their place in
        // the chain), and a chain longer than max_nesting fails with
        // limit_exceeded: the storm ends within a few driver passes.
        let config = RuntimeConfig {
            max_cascade_runs: 50,
            max_nesting: 6,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, stepwell_tests::manual_clock(), config);
        let wf = h.load_scratch("echo", &stepwell_tests::echo_flows());
        let echoes: Vec<String> = (0..12)
            .map(|_| {
                let id = h.rt.start(&wf, StartOptions::default()).unwrap();
                h.rt.tick(&id).unwrap();
                id
            })
            .collect();
        let kick = h.rt.run("kick", StartOptions::default()).unwrap();
        assert_eq!(kick.status, RunStatus::Completed);
        let mut passes = 0;
        while h.rt.drive_once().unwrap().moved_anything() {
            passes += 1;
            assert!(passes < 20, "the storm did not end");
        }
        let mut failed = 0;
        let mut records = 0;
        for id in &echoes {
            let run = h.rt.get_state(id).unwrap();
            assert_ne!(run.status, RunStatus::Running, "{run:?}");
            if run.status == RunStatus::Failed {
                failed += 1;
                assert!(run.error.unwrap().starts_with("limit_exceeded"));
            }
            records += h.rt.get_ledger(id).unwrap().len();
        }
        assert!(failed > 0);
        assert!(records < 20_000, "{records} records");
    }

    fn a_sync_child_past_the_cascade_limit_is_left_to_the_driver(b: Backend) {
        // With no run allowed inline, a sync child is started and left to
        // the driver; its parent waits for it and goes on when it ends.
        let config = RuntimeConfig {
            max_cascade_runs: 0,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, stepwell_tests::manual_clock(), config);
        let wf = h.load("subworkflow");
        let parent =
            h.rt.run(
                &wf,
                StartOptions {
                    vars: stepwell_tests::vars(json!({"text": "hi"})),
                    ..StartOptions::default()
                },
            )
            .unwrap();
        assert_eq!(parent.status, RunStatus::Waiting, "{parent:?}");
        for _ in 0..5 {
            h.rt.drive_once().unwrap();
        }
        let done = h.rt.get_state(&parent.run_id).unwrap();
        assert_eq!(done.status, RunStatus::Completed, "{done:?}");
    }

    fn async_children_that_start_themselves_stop_at_the_nesting_limit(b: Backend) {
        // Each run starts two async children of its own workflow: a tree
        // that doubles with every driver pass. A child is one run further
        // down its parent's chain, async or not, so the tree stops at
        // max_nesting levels.
        let config = RuntimeConfig {
            max_nesting: 3,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, stepwell_tests::manual_clock(), config);
        let spawn = |next: &str| {
            json!({"effect": "start_subworkflow",
                   "payload": {"workflow_id": "bomb", "async": true}, "next": next})
        };
        let wf = h.load_scratch(
            "bomb",
            &[(
                "flow.json",
                json!({"workflow_id": "bomb", "entry": "a", "nodes": {
                    "a": spawn("b"), "b": spawn("done"), "done": {"complete": {}}}}),
            )],
        );
        h.rt.run(&wf, StartOptions::default()).unwrap();
        let mut passes = 0;
        while h.rt.drive_once().unwrap().moved_anything() {
            passes += 1;
            assert!(passes < 20, "the tree kept growing");
        }
        let runs = h.rt.list_runs(&RunQuery::default()).unwrap();
        // The root, and 2 + 4 + 8 children at depths 1 to 3; those at depth
        // 3 cannot start any.
        assert_eq!(runs.len(), 15, "{}", runs.len());
        let failed: Vec<&RunState> = runs
            .iter()
            .filter(|r| r.status == RunStatus::Failed)
            .collect();
        assert_eq!(failed.len(), 8);
        assert!(failed
            .iter()
            .all(|r| r.error.as_deref().unwrap().starts_with("limit_exceeded")));
    }

    fn parents_that_cannot_be_resumed_do_not_starve_the_others(b: Backend) {
        // Six parents whose workflow is gone wait on children that ended,
        // one good parent too; a pass takes four. Each broken parent is set
        // aside after it fails, so the good one is resumed in the second
        // pass.
        let clock = stepwell_tests::manual_clock();
        let config = RuntimeConfig {
            drive_batch: 4,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, clock.clone(), config.clone());
        h.load("hello");
        let parent = |id: &str| {
            json!({"workflow_id": id, "entry": "start", "nodes": {
                "start": {"effect": "start_subworkflow",
                          "payload": {"workflow_id": "hello", "async": true, "wait": true},
                          "result_key": "child", "next": "done"},
                "done": {"complete": {"$var": "child.status"}}}})
        };
        let broken = h.load_scratch("broken", &[("flow.json", parent("broken-parent"))]);
        let good = h.load_scratch("good", &[("flow.json", parent("good-parent"))]);
        for _ in 0..6 {
            h.rt.run(&broken, StartOptions::default()).unwrap();
        }
        let fine = h.rt.run(&good, StartOptions::default()).unwrap().run_id;
        // The children run (two passes of four); the parents are not
        // resumed yet by this runtime's passes only because the test
        // deletes the broken bundle first.
        for _ in 0..2 {
            for id in h.store.list_claimable(chrono::Utc::now(), 100).unwrap() {
                h.rt.tick(&id).unwrap();
            }
        }
        forget_bundle(&h, "broken-parent");
        let rt = h.runtime(Some(clock.clone()), config);
        let first = rt.drive_once().unwrap();
        assert_eq!(first.errors.len(), 4, "{first:?}");
        let second = rt.drive_once().unwrap();
        assert_eq!(second.parents_resumed, vec![fine.clone()], "{second:?}");
        assert_eq!(rt.get_state(&fine).unwrap().status, RunStatus::Completed);
    }

    store_tests!(
        parents_that_cannot_be_resumed_do_not_starve_the_others,
        async_children_that_start_themselves_stop_at_the_nesting_limit,
        listeners_that_answer_an_event_with_itself_end_bounded,
        a_sync_child_past_the_cascade_limit_is_left_to_the_driver,
        a_few_broken_due_runs_never_starve_the_driver,
        the_driver_rotates_through_more_running_runs_than_a_pass_takes,
        a_pass_hands_out_running_runs_only_for_its_time,
    );
}

/// A JSON-file store whose commits tear on demand: the ledger is appended,
/// then the "process dies" before the run file is replaced.
struct SaveFails {
    inner: JsonFileStore,
    fail: std::sync::atomic::AtomicBool,
    /// How many commits failed so.
    failed: std::sync::atomic::AtomicUsize,
    /// Commits land, then fail as if the answer was lost (an unknown
    /// outcome).
    land_then_fail: std::sync::atomic::AtomicBool,
}

impl Store for SaveFails {
    fn indexer(&self) -> std::sync::Arc<dyn stepwell::store::RunIndexer> {
        self.inner.indexer()
    }
    fn set_indexer(
        &self,
        indexer: std::sync::Arc<dyn stepwell::store::RunIndexer>,
    ) -> Result<(), StoreError> {
        self.inner.set_indexer(indexer)
    }
    fn load_run(&self, id: &str) -> Result<Option<RunState>, StoreError> {
        self.inner.load_run(id)
    }
    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.inner.create_if_absent(run)
    }
    fn claim(
        &self,
        id: &str,
        lease: &stepwell::LeaseRequest<'_>,
    ) -> Result<stepwell::Claim, StoreError> {
        self.inner.claim(id, lease)
    }
    fn renew(
        &self,
        h: &str,
        ids: &[String],
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        self.inner.renew(h, ids, until)
    }
    fn release(&self, id: &str, h: &str) -> Result<(), StoreError> {
        self.inner.release(id, h)
    }
    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: stepwell::Fence<'_>,
        lease: stepwell::LeaseAfter,
    ) -> Result<(), StoreError> {
        if self
            .land_then_fail
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            self.inner.commit(records, run, fence, lease)?;
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(StoreError::io(
                "injected: the commit's outcome is unknown; read the run again",
            ));
        }
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) && fence.version > 0 {
            self.failed
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // What a commit that dies after its ledger append leaves: the
            // records' lines past the run file's mark.
            let path = self
                .inner
                .dir()
                .join(format!("ledger_{}.jsonl", run.run_id));
            let mut text = String::new();
            for r in records {
                text.push_str(&serde_json::to_string(r).unwrap());
                text.push('\n');
            }
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
            return Err(StoreError::io("injected: the process died before the save"));
        }
        self.inner.commit(records, run, fence, lease)
    }
    fn append_ahead(&self, r: &[StepRecord], fence: stepwell::Fence<'_>) -> Result<(), StoreError> {
        self.inner.append_ahead(r, fence)
    }
    fn append_records(&self, r: &[StepRecord]) -> Result<(), StoreError> {
        self.inner.append_records(r)
    }
    fn list_records(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_records(id)
    }
    fn list_ahead(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_ahead(id)
    }
    fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        self.inner.list_runs(q)
    }
    fn list_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        n: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_due(now, n)
    }
    fn list_claimable(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        n: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_claimable(now, n)
    }
    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_leased(limit)
    }
    fn quarantine(&self, id: &str, why: &str) -> Result<(), StoreError> {
        self.inner.quarantine(id, why)
    }
    fn defer(
        &self,
        id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> chrono::DateTime<chrono::Utc>,
    ) -> Result<u32, StoreError> {
        self.inner.defer(id, reason, until)
    }
    fn deferral(&self, id: &str) -> Result<Option<stepwell::store::Deferral>, StoreError> {
        self.inner.deferral(id)
    }
    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_quarantined()
    }
    fn bundle_dir(&self, w: &str) -> Result<Option<std::path::PathBuf>, StoreError> {
        self.inner.bundle_dir(w)
    }
    fn deploy(
        &self,
        d: &stepwell::store::Deployment<'_>,
    ) -> Result<Vec<stepwell::store::Deployed>, StoreError> {
        self.inner.deploy(d)
    }
    fn workflow_version(
        &self,
        w: &str,
        v: Option<u32>,
    ) -> Result<Option<stepwell::store::WorkflowVersion>, StoreError> {
        self.inner.workflow_version(w, v)
    }
    fn workflow_versions(
        &self,
        w: Option<&str>,
    ) -> Result<Vec<stepwell::store::WorkflowVersion>, StoreError> {
        self.inner.workflow_versions(w)
    }
    fn remove_versions(&self, v: &[stepwell::store::WorkflowVersion]) -> Result<usize, StoreError> {
        self.inner.remove_versions(v)
    }
    fn delete_runs(&self, ids: &[String]) -> Result<stepwell::store::Deleted, StoreError> {
        self.inner.delete_runs(ids)
    }
    fn version_use(&self, w: &str) -> Result<Vec<stepwell::store::VersionUse>, StoreError> {
        self.inner.version_use(w)
    }
    fn bundle_files(
        &self,
        digest: &str,
    ) -> Result<Vec<stepwell::flow::archive::BundleFile>, StoreError> {
        self.inner.bundle_files(digest)
    }
}

/// A runtime on a [`SaveFails`] store in `dir`, failing nothing yet.
fn save_fails(dir: &std::path::Path) -> (Arc<SaveFails>, Runtime) {
    let store = Arc::new(SaveFails {
        inner: JsonFileStore::open(dir.join("store")).unwrap(),
        fail: false.into(),
        failed: 0.into(),
        land_then_fail: false.into(),
    });
    let rt = stepwell::builder(store.clone())
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    (store, rt)
}

/// A resume from the state this runtime parked the run in whose commit
/// lands but whose answer is lost (the store cannot say whether it
/// landed) returns that error: it is not done again, which would answer
/// the run's next wait with the same payload.
#[test]
fn a_resume_whose_commit_outcome_is_unknown_is_not_done_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rt) = save_fails(dir.path());
    let flow = json!({"workflow_id": "loop", "entry": "ask", "nodes": {
        "ask": {"effect": "ask_user", "payload": {"prompt": "more?", "wait_key": "more"},
                "result_key": "answer", "next": "ask"}}});
    let bundle = stepwell_tests::write_bundle(dir.path(), "loop", &[("flow.json", flow)]);
    let wf = rt.load_bundle(&bundle).unwrap().main_workflow_id;
    let id = rt.start(&wf, StartOptions::default()).unwrap();
    assert_eq!(rt.tick(&id).unwrap().status, RunStatus::Waiting);
    let ledger = rt.get_ledger(&id).unwrap().len();

    store
        .land_then_fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = rt.respond(&id, json!({"text": "once"})).unwrap_err();
    assert_eq!(err.reason_code(), "store_io", "{err:?}");
    assert_eq!(store.failed.load(std::sync::atomic::Ordering::SeqCst), 1);
    store
        .land_then_fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    // The answer landed once: one resume record, the run waits again on
    // the same key for the next answer.
    let after = rt.get_ledger(&id).unwrap();
    assert_eq!(resumes(&after[ledger..]), 1, "{after:?}");
    let state = rt.get_state(&id).unwrap();
    assert_eq!(state.status, RunStatus::Waiting);
    assert_eq!(state.vars["answer"], json!({"text": "once"}));
}

#[test]
fn a_crash_between_append_and_save_leaves_the_ledger_ahead_and_replay_converges() {
    let dir = tempfile::tempdir().unwrap();
    let (store, rt) = save_fails(dir.path());
    let wf = rt
        .load_bundle(&stepwell_tests::example("ask-user"))
        .unwrap()
        .main_workflow_id;
    let id = rt.start(&wf, StartOptions::default()).unwrap();
    let key = rt.tick(&id).unwrap().waiting.unwrap().wait_key;

    store.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let err = rt.resume(&id, &key, json!({"text": "Bob"})).unwrap_err();
    assert_eq!(err.reason_code(), "store_io");
    // The resume started from the state this runtime parked the run in;
    // its commit's outcome is unknown to it, so it was not done again.
    assert_eq!(store.failed.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The torn commit's records are in the file, past the run file's mark:
    // the saved state still waits and the ledger does not show them.
    let state = rt.get_state(&id).unwrap();
    assert_eq!(state.status, RunStatus::Waiting);
    let file = store.inner.dir().join(format!("ledger_{id}.jsonl"));
    assert!(std::fs::read_to_string(&file)
        .unwrap()
        .contains("Hello, Bob!"));
    assert_eq!(
        statuses(&rt.get_ledger(&id).unwrap()),
        ["started", "waiting"]
    );

    // "Restart": the same resume is accepted again, the run converges to the
    // output of an uninterrupted run, and the torn commit's records are
    // cut off before the replay's land: none is there twice.
    store.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let done = rt.resume(&id, &key, json!({"text": "Bob"})).unwrap();
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Bob!"})));
    let ledger = rt.get_ledger(&id).unwrap();
    assert_eq!(
        statuses(&ledger),
        ["started", "waiting", "completed", "completed"]
    );
    let terminal = stepwell_tests::count_results(&ledger, "complete_output");
    assert_eq!(terminal, 1, "the terminal record exactly once");
    assert_eq!(
        ledger[3].idempotency_key.as_deref(),
        Some(format!("{id}:terminal").as_str())
    );
    let effect_key = ledger[0].idempotency_key.clone().unwrap();
    assert!(
        ledger[2]
            .idempotency_key
            .as_deref()
            .unwrap()
            .starts_with(&format!("{effect_key}:resumed:")),
        "a resume completes its effect (its key extends the effect's)"
    );

    // Another run: the first resume is lost in a crash, the caller then
    // resumes with another answer. The lost attempt never became true: the
    // ledger, like the state, holds only the second.
    let id = rt.start(&wf, StartOptions::default()).unwrap();
    let key = rt.tick(&id).unwrap().waiting.unwrap().wait_key;
    store.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    rt.resume(&id, &key, json!({"text": "Bob"})).unwrap_err();
    store.fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let done = rt.resume(&id, &key, json!({"text": "Eve"})).unwrap();
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Eve!"})));
    let payloads: Vec<_> = rt
        .get_ledger(&id)
        .unwrap()
        .iter()
        .filter_map(|r| {
            r.result
                .as_ref()?
                .get("resumed")
                .map(|v| v["payload"]["text"].clone())
        })
        .collect();
    assert_eq!(payloads, [json!("Eve")]);
    let outputs: Vec<_> = rt
        .get_ledger(&id)
        .unwrap()
        .iter()
        .filter_map(|r| r.result.as_ref()?.get("complete_output").cloned())
        .collect();
    assert_eq!(outputs, [json!({"greeting": "Hello, Eve!"})]);
    assert!(rt.verify_ledger(&id).unwrap().is_ok());
    let text = std::fs::read_to_string(store.inner.dir().join(format!("ledger_{id}.jsonl")));
    assert!(!text.unwrap().contains("Bob"), "cut off the file too");
}

fn run_starts_and_ticks_in_one_call(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let parked = h.rt.run(&wf, StartOptions::default()).expect("run");
    assert_eq!(parked.status, RunStatus::Waiting);
    assert_eq!(
        h.rt.get_state(&parked.run_id).unwrap(),
        parked,
        "created and saved"
    );
    assert_eq!(
        statuses(&h.rt.get_ledger(&parked.run_id).unwrap()),
        ["started", "waiting"]
    );
    // With an explicit id: create-if-absent, then the same identity again
    // returns the existing run as it is.
    let explicit = StartOptions {
        run_id: Some("named-run".into()),
        ..StartOptions::default()
    };
    let first = h.rt.run(&wf, explicit.clone()).unwrap();
    assert_eq!(first.run_id, "named-run");
    assert_eq!(h.rt.run(&wf, explicit).unwrap(), first);
}

mod run_api {
    use super::*;
    #[test]
    fn memory() {
        run_starts_and_ticks_in_one_call(Backend::Memory)
    }
    #[test]
    fn sqlite() {
        run_starts_and_ticks_in_one_call(Backend::Sqlite)
    }
    #[test]
    fn json() {
        run_starts_and_ticks_in_one_call(Backend::Json)
    }
}

/// Each runtime counts its own commits and resumes (two in one process
/// used to share process-wide counters), unless given the same metrics;
/// guest calls are counted by the engine they share.
#[test]
fn runtimes_count_apart_unless_they_share_metrics() {
    let engine = stepwell::WasmEngine::new(stepwell::EngineConfig::default()).unwrap();
    let build = |metrics: Option<Arc<stepwell::core::metrics::Metrics>>| {
        let mut b =
            stepwell::builder(Arc::new(stepwell::MemoryStore::new())).engine(engine.clone());
        if let Some(m) = metrics {
            b = b.metrics(m);
        }
        let rt = b.build().unwrap();
        rt.load_bundle(&stepwell_tests::example("ask-user"))
            .unwrap();
        rt
    };
    let (a, b) = (build(None), build(None));
    let parked = a.run("ask-user", StartOptions::default()).unwrap();
    let key = parked.waiting.unwrap().wait_key;
    a.resume(&parked.run_id, &key, json!({"text": "Bob"}))
        .unwrap();
    let (ca, cb) = (a.counters(), b.counters());
    assert!(ca.commits >= 2 && ca.records >= 4, "{ca:?}");
    assert_eq!(ca.resumes, 1);
    assert_eq!((cb.commits, cb.records, cb.resumes), (0, 0, 0), "{cb:?}");
    assert!(ca.guest_calls > 0);
    assert_eq!(cb.guest_calls, ca.guest_calls, "the engine's own");
    let shared = Arc::new(stepwell::core::metrics::Metrics::default());
    let (c, d) = (build(Some(shared.clone())), build(Some(shared)));
    c.run("ask-user", StartOptions::default()).unwrap();
    assert_eq!(c.counters().commits, d.counters().commits);
    assert!(d.counters().commits > 0);
}

fn subscribers_see_records_as_they_are_committed(b: Backend) {
    let h = Host::new(b);
    let wf = h.load("ask-user");
    let all = h.rt.subscribe_ledger(None);
    let none = h.rt.subscribe_ledger(Some("some-other-run"));
    let parked = h.rt.run(&wf, StartOptions::default()).unwrap();
    let seen: Vec<_> = all.try_iter().map(|r| r.status.as_str()).collect();
    assert_eq!(seen, ["started", "waiting"]);
    let key = parked.waiting.unwrap().wait_key;
    h.rt.resume(&parked.run_id, &key, json!({"text": "Bob"}))
        .unwrap();
    let seen: Vec<_> = all
        .try_iter()
        .map(|r| (r.status.as_str(), r.node_id.unwrap_or_default()))
        .collect();
    assert_eq!(
        seen,
        [
            ("completed", "ask".to_string()),
            ("completed", "greet".to_string())
        ]
    );
    assert_eq!(none.try_iter().count(), 0);
    // A dropped receiver unsubscribes; the runtime keeps working.
    drop(all);
    h.rt.run(&wf, StartOptions::default()).unwrap();
}

mod subscriptions {
    use super::*;
    store_tests!(subscribers_see_records_as_they_are_committed);
}

fn a_snapshot_restores_a_known_good_state(b: Backend) {
    let h = Host::new(b);
    let snaps = stepwell::store::MemorySnapshotStore::new();
    let wf = h.load("ask-user");
    let parked = h.rt.run(&wf, StartOptions::default()).unwrap();
    let id = parked.run_id.clone();
    let snap =
        h.rt.create_snapshot(
            &snaps,
            &id,
            "asked",
            "waiting for a name",
            vec!["demo".into()],
        )
        .unwrap();
    assert_eq!(snap.run_state, parked);
    assert_eq!(
        snap.step_id,
        h.rt.get_ledger(&id)
            .unwrap()
            .last()
            .map(|r| r.step_id.clone())
    );
    let key = parked.waiting.clone().unwrap().wait_key;
    let done = h.rt.resume(&id, &key, json!({"text": "Bob"})).unwrap();
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Bob!"})));

    let restored = h.rt.restore_snapshot(&snaps, &snap.snapshot_id).unwrap();
    assert_eq!(restored.status, RunStatus::Waiting);
    assert_eq!(restored.waiting, parked.waiting);
    assert_eq!(h.rt.get_state(&id).unwrap(), restored);
    let again = h.rt.resume(&id, &key, json!({"text": "Eve"})).unwrap();
    assert_eq!(again.output, Some(json!({"greeting": "Hello, Eve!"})));
    let ledger = h.rt.get_ledger(&id).unwrap();
    assert!(ledger.iter().any(|r| r
        .result
        .as_ref()
        .is_some_and(|v| v["restored"]["snapshot_id"] == json!(snap.snapshot_id))));
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
    // Both completions are in the evidence: the restored run's new records
    // do not pass for replays of the old ones.
    let greetings: Vec<_> = ledger
        .iter()
        .filter_map(|r| r.result.as_ref()?.get("complete_output").cloned())
        .collect();
    assert_eq!(
        greetings,
        [
            json!({"greeting": "Hello, Bob!"}),
            json!({"greeting": "Hello, Eve!"})
        ]
    );
    let resumes = stepwell_tests::count_results(&ledger, "resumed");
    assert_eq!(resumes, 2);
    let err =
        h.rt.restore_snapshot(&snaps, "no-such-snapshot")
            .unwrap_err();
    assert_eq!(err.reason_code(), "invalid_input");
}

mod snapshots_on_stores {
    use super::*;
    store_tests!(a_snapshot_restores_a_known_good_state);
}

fn large_values_are_offloaded_to_artifacts_and_loaded_back(b: Backend) {
    let base = Host::new(b);
    let artifacts = Arc::new(stepwell::MemoryArtifactStore::new());
    let rt = stepwell::builder(base.store.clone())
        .engine(stepwell_tests::engine())
        .artifacts(artifacts.clone(), 200)
        .build()
        .unwrap();
    let wf = rt
        .load_bundle(&stepwell_tests::example("hello"))
        .unwrap()
        .main_workflow_id;
    let name = "x".repeat(1000);
    let big_meta = json!({"occurrence": "o".repeat(500)});
    let done = rt
        .run(
            &wf,
            StartOptions {
                vars: vars(json!({"name": name, "small": 1, "_meta": big_meta})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    let message = format!("Hello, {name}!");
    assert_eq!(done.output, Some(json!({"message": message})));
    // As stored: references; identity metadata inline.
    let raw = base.store.load_run(&done.run_id).unwrap().unwrap();
    let name_ref = raw.vars["name"]["$artifact"]
        .as_str()
        .expect("name offloaded")
        .to_string();
    assert_eq!(raw.vars["small"], json!(1));
    assert_eq!(raw.vars["_meta"], big_meta, "_meta stays inline");
    assert!(
        raw.output.as_ref().unwrap().get("$artifact").is_some(),
        "output offloaded"
    );
    let meta = stepwell::ArtifactStore::meta(&*artifacts, &name_ref)
        .unwrap()
        .unwrap();
    assert_eq!(meta.size as usize, name.len() + 2);
    assert_eq!(meta.run_id.as_deref(), Some(done.run_id.as_str()));
    // As read: loaded back, transparently.
    assert_eq!(rt.get_state(&done.run_id).unwrap(), done);
    let raw_ledger = base.store.list_records(&done.run_id).unwrap();
    assert!(
        raw_ledger[0]
            .result
            .as_ref()
            .unwrap()
            .get("$artifact")
            .is_some(),
        "record result offloaded"
    );
    let ledger = rt.get_ledger(&done.run_id).unwrap();
    assert_eq!(
        ledger[0].result,
        Some(json!({"complete_output": {"message": message}}))
    );
    assert!(
        rt.verify_ledger(&done.run_id).unwrap().is_ok(),
        "the chain covers the stored form"
    );
    assert_eq!(
        rt.list_runs(&RunQuery::default()).unwrap()[0].vars["name"],
        json!(name)
    );
}

mod artifacts_on_stores {
    use super::*;
    store_tests!(large_values_are_offloaded_to_artifacts_and_loaded_back);
}

/// An external effect for the tests: fails (retryably, as a transport
/// error would) until attempt `payload.succeed_on`, and records each call's
/// idempotency key and attempt.
struct Flaky {
    calls: Arc<std::sync::Mutex<Vec<(String, u32)>>>,
}

impl stepwell::EffectHandler for Flaky {
    fn kind(&self) -> &str {
        "flaky_call"
    }
    fn class(&self) -> stepwell::EffectClass {
        stepwell::EffectClass::External
    }
    fn execute(
        &self,
        cx: &stepwell::EffectCx<'_>,
        payload: &serde_json::Map<String, Value>,
        _: Option<&Value>,
    ) -> stepwell::Result<stepwell::Outcome> {
        self.calls
            .lock()
            .unwrap()
            .push((cx.key.to_string(), cx.attempt));
        let succeed_on = payload
            .get("succeed_on")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        Ok(if u64::from(cx.attempt) < succeed_on {
            stepwell::Outcome::Failed(stepwell::Failure::retryable(
                "transport_error",
                "connection reset",
            ))
        } else {
            stepwell::Outcome::Completed(json!({"attempt": cx.attempt, "key": cx.key}))
        })
    }
}

fn a_failed_effect_is_retried_with_backoff_then_fails_the_run(b: Backend) {
    let clock = manual_clock();
    let base = Host::with_clock(b, clock.clone());
    let mut config = stepwell::RuntimeConfig::default();
    let policy = stepwell::RetryPolicy {
        max_attempts: 3,
        initial_backoff: std::time::Duration::from_secs(10),
        factor: 2.0,
        max_backoff: std::time::Duration::from_secs(60),
    };
    config.retries.insert("flaky_call".into(), policy);
    config.retries.insert("ask_user".into(), policy);
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let rt = stepwell::builder(base.store.clone())
        .engine(stepwell_tests::engine())
        .clock(clock.clone())
        .config(config)
        .effect(Arc::new(Flaky {
            calls: calls.clone(),
        }))
        .build()
        .unwrap();
    let flow = |name: &str, succeed_on: u64| {
        json!({"workflow_id": name, "entry": "call",
               "nodes": {"call": {"component": component("runaway/hostile.wasm"),
                                  "config": {"mode": "effect", "patch": {"touched": true},
                                             "effect": {"kind": "flaky_call", "payload": {"succeed_on": succeed_on}, "result_key": "out"}},
                                  "next": "done"},
                         "done": {"complete": {"out": {"$var": "out"}, "touched": {"$var": "touched"}}}}})
    };
    for (name, doc) in [
        ("twice", flow("twice", 2)),
        ("never", flow("never", 9)),
        (
            "invalid",
            json!({"workflow_id": "invalid", "entry": "ask",
                   "nodes": {"ask": {"effect": "ask_user", "payload": {}, "result_key": "a"}}}),
        ),
    ] {
        let dir = stepwell_tests::write_bundle(base.dir.path(), name, &[("flow.json", doc)]);
        rt.load_bundle(&dir).unwrap();
    }

    // Attempt 1 fails; the run waits 10 s; its vars patch was not kept.
    let first = rt.run("twice", StartOptions::default()).unwrap();
    assert_eq!(first.status, RunStatus::Waiting);
    let wait = first.waiting.clone().unwrap();
    assert_eq!(
        (wait.reason, wait.wait_key.as_str()),
        (WaitReason::Until, "retry:call:2")
    );
    assert_eq!(wait.until.as_deref(), Some("2026-11-30T09:00:10.000000Z"));
    assert!(
        first.vars.get("touched").is_none(),
        "the failed attempt's patch is taken back"
    );
    clock.advance(chrono::Duration::seconds(9));
    assert!(rt.drive_once().unwrap().due_resumed.is_empty());
    clock.advance(chrono::Duration::seconds(1));
    rt.drive_once().unwrap();
    // Attempt 2 succeeds, with the same idempotency key.
    let done = rt.get_state(&first.run_id).unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:?}");
    let key = format!("{}:1", first.run_id);
    assert_eq!(
        done.output,
        Some(json!({"out": {"attempt": 2, "key": key}, "touched": true}))
    );
    assert_eq!(
        *calls.lock().unwrap(),
        [(key.clone(), 1), (key.clone(), 2)],
        "the same key for every attempt"
    );
    let attempts = |id: &str| -> Vec<(&'static str, u32)> {
        rt.get_ledger(id)
            .unwrap()
            .iter()
            .filter(|r| r.effect.is_some())
            .map(|r| (r.status.as_str(), r.attempt))
            .collect()
    };
    assert_eq!(
        attempts(&first.run_id),
        [
            ("started", 1),
            ("failed", 1),
            ("started", 2),
            ("completed", 2)
        ]
    );
    assert!(done.vars["_runtime"].get("attempt").is_none());
    assert!(done.vars["_runtime"].get("retry_seq").is_none());

    // Retried after 10 s then 20 s, failing every time: fails after 3.
    calls.lock().unwrap().clear();
    let never = rt.run("never", StartOptions::default()).unwrap();
    clock.advance(chrono::Duration::seconds(10));
    rt.drive_once().unwrap();
    assert_eq!(
        rt.get_state(&never.run_id)
            .unwrap()
            .waiting
            .unwrap()
            .until
            .as_deref(),
        Some("2026-11-30T09:00:40.000000Z")
    );
    clock.advance(chrono::Duration::seconds(20));
    rt.drive_once().unwrap();
    let failed = rt.get_state(&never.run_id).unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(
        failed.error.as_deref(),
        Some("transport_error: connection reset (after 3 attempts)")
    );
    assert_eq!(
        attempts(&never.run_id),
        [
            ("started", 1),
            ("failed", 1),
            ("started", 2),
            ("failed", 2),
            ("started", 3),
            ("failed", 3)
        ]
    );
    assert_eq!(calls.lock().unwrap().len(), 3);

    // A failure a retry cannot help (an invalid payload) is not retried,
    // policy or not.
    let invalid = rt.run("invalid", StartOptions::default()).unwrap();
    assert_eq!(invalid.status, RunStatus::Failed);
    assert_eq!(
        invalid.error.as_deref(),
        Some("invalid_effect: ask_user.payload.prompt: is required")
    );
}

mod retries {
    use super::*;
    store_tests!(a_failed_effect_is_retried_with_backoff_then_fails_the_run);
}

fn ping_pong_events_resume_each_run_once(b: Backend) {
    let h = Host::new(b);
    let side = |name: &str, wait: &str, emit: &str| {
        json!({"workflow_id": name, "entry": "wait",
               "nodes": {"wait": {"effect": "wait_event", "payload": {"name": wait, "scope": "global"}, "result_key": "got", "next": "emit"},
                         "emit": {"effect": "emit_event", "payload": {"name": emit, "scope": "global", "payload": name}, "result_key": "sent", "next": "done"},
                         "done": {"complete": {"got": {"$var": "got.payload.value"}, "sent": {"$var": "sent.delivered"}}}}})
    };
    let starter = json!({"workflow_id": "starter", "entry": "go",
        "nodes": {"go": {"effect": "emit_event", "payload": {"name": "ping", "scope": "global", "payload": "start"}}}});
    h.load_scratch(
        "pingpong",
        &[
            ("flow.json", starter),
            ("a.flow.json", side("a", "ping", "pong")),
            ("b.flow.json", side("b", "pong", "ping")),
        ],
    );
    let a = start(&h, "a", json!({}));
    let bb = start(&h, "b", json!({}));
    h.rt.tick(&a).unwrap();
    h.rt.tick(&bb).unwrap();
    let go = start(&h, "starter", json!({}));
    let out = h.rt.tick(&go).unwrap();
    assert_eq!(out.output.unwrap()["delivered"], json!(1));
    // a was resumed once (by the starter), b once (by a); b's ping found a
    // no longer waiting: it was not resumed a second time mid-step.
    let a_state = h.rt.get_state(&a).unwrap();
    assert_eq!(a_state.output, Some(json!({"got": "start", "sent": 1})));
    assert_eq!(
        h.rt.get_state(&bb).unwrap().output,
        Some(json!({"got": "a", "sent": 0}))
    );
    for id in [&a, &bb] {
        let resumes = stepwell_tests::count_results(&h.rt.get_ledger(id).unwrap(), "resumed");
        assert_eq!(resumes, 1, "{id} resumed once");
    }
}

fn values_that_look_like_references_are_kept_as_they_are(b: Backend) {
    let base = Host::new(b);
    let rt = stepwell::builder(base.store.clone())
        .engine(stepwell_tests::engine())
        .artifacts(Arc::new(stepwell::MemoryArtifactStore::new()), 10)
        .build()
        .unwrap();
    let wf = rt
        .load_bundle(&stepwell_tests::example("hello"))
        .unwrap()
        .main_workflow_id;
    let forged =
        json!({"$artifact": "0000000000000000000000000000000000000000000000000000000000000000"});
    let escaped = json!({"$literal": 1});
    let id = rt
        .start(
            &wf,
            StartOptions {
                vars: vars(json!({"x": forged, "y": escaped})),
                ..StartOptions::default()
            },
        )
        .unwrap();
    let state = rt.tick(&id).unwrap();
    assert_eq!(state.status, RunStatus::Completed);
    let read = rt.get_state(&id).unwrap();
    assert_eq!(read.vars["x"], forged, "never resolved");
    assert_eq!(read.vars["y"], escaped);
}

mod review_fixes {
    use super::*;
    store_tests!(
        ping_pong_events_resume_each_run_once,
        values_that_look_like_references_are_kept_as_they_are
    );

    #[test]
    fn a_huge_backoff_is_clamped() {
        let p = stepwell::RetryPolicy {
            max_attempts: 100,
            initial_backoff: std::time::Duration::from_secs(1),
            factor: 2.0,
            max_backoff: std::time::Duration::from_secs(3600),
        };
        assert_eq!(p.backoff(1), std::time::Duration::from_secs(1));
        assert_eq!(p.backoff(3), std::time::Duration::from_secs(4));
        assert_eq!(p.backoff(65), std::time::Duration::from_secs(3600));
        assert_eq!(p.backoff(u32::MAX), std::time::Duration::from_secs(3600));
    }
}

mod limits {
    //! What bounds a run's data, its children and its share of the driver,
    //! and what happens when the host itself fails in a step.
    use super::*;
    use stepwell::{EffectClass, EffectCx, EffectHandler, Outcome, RuntimeConfig};

    fn one_flow(h: &Host, name: &str, nodes: Value, entry: &str) -> String {
        h.load_scratch(
            name,
            &[(
                "flow.json",
                json!({"workflow_id": name, "entry": entry, "nodes": nodes}),
            )],
        )
    }

    fn vars_that_double_every_step_fail_the_run(b: Backend) {
        // Two vars_query nodes copy all the vars into one var, in turn: the
        // vars double every step, with no guest involved.
        let h = Host::new(b);
        let q = |key: &str, next: &str| {
            json!({"effect": "vars_query", "payload": {"paths": ["a", "b", "seed"]},
                   "result_key": key, "next": next})
        };
        let wf = one_flow(
            &h,
            "doubling",
            json!({"a": q("a", "b"), "b": q("b", "a")}),
            "a",
        );
        let id = start(&h, &wf, json!({"seed": "x".repeat(1000)}));
        let run = h.rt.tick(&id).unwrap();
        assert_eq!(run.status, RunStatus::Failed, "{:?}", run.status);
        let error = run.error.unwrap();
        assert!(error.starts_with("state_too_large"), "{error}");
        let steps = h.rt.get_ledger(&id).unwrap().len();
        assert!(steps < 200, "stopped early: {steps} records");
    }

    fn a_run_has_a_budget_of_data(b: Backend) {
        // Each resume brings 600 KB; the run may take 2 MB of data in all.
        let config = RuntimeConfig {
            max_run_data_bytes: 2 << 20,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, manual_clock(), config);
        let ask = |next: &str| {
            json!({"effect": "ask_user", "payload": {"prompt": "more?", "wait_key": "more"},
                   "result_key": "answer", "next": next})
        };
        let wf = one_flow(
            &h,
            "hungry",
            json!({"ask": ask("again"), "again": ask("ask")}),
            "ask",
        );
        let id = start(&h, &wf, json!({}));
        h.rt.tick(&id).unwrap();
        let big = json!({"text": "y".repeat(600_000)});
        let mut last = None;
        for _ in 0..6 {
            let run = h.rt.resume(&id, "more", big.clone()).unwrap();
            if run.status == RunStatus::Failed {
                last = run.error;
                break;
            }
        }
        let error = last.expect("the run failed within 6 resumes");
        assert!(error.starts_with("limit_exceeded"), "{error}");
        assert!(error.contains("max_run_data_bytes"), "{error}");
    }

    fn values_that_nest_too_deep_are_refused_at_the_door(b: Backend) {
        let h = Host::new(b);
        let wf = h.load("ask-user");
        let mut deep = json!(1);
        for _ in 0..70 {
            deep = json!([deep]);
        }
        // At start.
        let err =
            h.rt.start(
                &wf,
                StartOptions {
                    vars: vars(json!({"x": deep})),
                    ..StartOptions::default()
                },
            )
            .unwrap_err();
        assert_eq!(err.reason_code(), "invalid_input");
        assert!(err.to_string().contains("vars.x"), "{err}");
        // In a resume payload: refused, and the run still waits.
        let id = start(&h, &wf, json!({}));
        let key = h.rt.tick(&id).unwrap().waiting.unwrap().wait_key;
        let err = h.rt.resume(&id, &key, json!({"text": deep})).unwrap_err();
        assert_eq!(err.reason_code(), "invalid_input");
        assert_eq!(h.rt.get_state(&id).unwrap().status, RunStatus::Waiting);
        // A flow's result key of too many parts is refused when loaded.
        let key = vec!["k"; 40].join(".");
        let dir = stepwell_tests::write_bundle(
            h.dir.path(),
            "long-key",
            &[(
                "flow.json",
                json!({"workflow_id": "long-key", "entry": "a", "nodes": {
                    "a": {"effect": "ask_user", "payload": {"prompt": "?"}, "result_key": key}}}),
            )],
        );
        let err = h.rt.load_bundle(&dir).unwrap_err().to_string();
        assert!(
            err.contains("result_key") && err.contains("dotted parts"),
            "{err}"
        );
        // A flow file of more than 4 MiB is refused before it is parsed.
        let big = h.dir.path().join("big");
        std::fs::create_dir_all(&big).unwrap();
        std::fs::write(big.join("flow.json"), " ".repeat(5 << 20)).unwrap();
        let err = h.rt.load_bundle(&big).unwrap_err().to_string();
        assert!(err.contains("over the limit"), "{err}");
    }

    fn a_self_starting_tree_stops_at_the_nesting_limit_even_across_waits(b: Backend) {
        // Each run waits a moment, then starts an async child of its own
        // workflow: waiting does not reset how many runs are above it.
        let config = RuntimeConfig {
            max_nesting: 4,
            ..RuntimeConfig::default()
        };
        let clock = manual_clock();
        let h = Host::with_config(b, clock.clone(), config);
        let wf = one_flow(
            &h,
            "patient",
            json!({
                "nap": {"effect": "wait_until", "payload": {"seconds": 1}, "next": "spawn"},
                "spawn": {"effect": "start_subworkflow",
                          "payload": {"workflow_id": "patient", "async": true}, "next": "done"},
                "done": {"complete": {}}}),
            "nap",
        );
        h.rt.run(&wf, StartOptions::default()).unwrap();
        for _ in 0..20 {
            clock.advance(chrono::Duration::seconds(2));
            h.rt.drive_once().unwrap();
        }
        let runs = h.rt.list_runs(&RunQuery::default()).unwrap();
        assert_eq!(runs.len(), 5, "the root and four generations");
        let failed: Vec<&RunState> = runs
            .iter()
            .filter(|r| r.status == RunStatus::Failed)
            .collect();
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0]
                .error
                .as_deref()
                .unwrap()
                .contains("runs above it"),
            "{:?}",
            failed[0].error
        );
    }

    fn a_run_may_start_only_so_many_children(b: Backend) {
        let config = RuntimeConfig {
            max_children_per_run: 5,
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, manual_clock(), config);
        h.load("hello");
        let wf = one_flow(
            &h,
            "spawner",
            json!({"spawn": {"effect": "start_subworkflow",
                             "payload": {"workflow_id": "hello", "async": true}, "next": "spawn"}}),
            "spawn",
        );
        let run = h.rt.run(&wf, StartOptions::default()).unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        assert!(
            run.error
                .as_deref()
                .unwrap()
                .contains("max_children_per_run"),
            "{:?}",
            run.error
        );
        let children =
            h.rt.list_runs(&RunQuery {
                parent_run_id: Some(run.run_id.clone()),
                ..RunQuery::default()
            })
            .unwrap();
        assert_eq!(children.len(), 5);
    }

    fn slow_steps_of_one_run_leave_time_for_the_others(b: Backend) {
        // With 20 ms a run per pass, a chain of slow steps gives way after
        // a step or two, and every run of the pass gets its turn.
        let config = RuntimeConfig {
            drive_time_per_run: std::time::Duration::from_millis(20),
            ..RuntimeConfig::default()
        };
        let h = Host::with_config(b, manual_clock(), config);
        let spin = json!({"component": component("runaway/hostile.wasm"),
                          "config": {"mode": "spin", "iterations": 60_000_000u64}});
        let mut nodes = serde_json::Map::new();
        for i in 0..10 {
            let mut node = spin.clone();
            node["next"] = json!(if i < 9 {
                format!("s{}", i + 1)
            } else {
                "end".into()
            });
            nodes.insert(format!("s{i}"), node);
        }
        nodes.insert("end".into(), json!({"complete": {}}));
        let wf = one_flow(&h, "slow", Value::Object(nodes), "s0");
        let ids: Vec<String> = (0..3)
            .map(|_| h.rt.start(&wf, StartOptions::default()).unwrap())
            .collect();
        let report = h.rt.drive_once().unwrap();
        assert_eq!(report.ticked.len(), 3, "{report:?}");
        for id in &ids {
            let run = h.rt.get_state(id).unwrap();
            assert_eq!(
                run.status,
                RunStatus::Running,
                "every run got a turn, none all of it"
            );
        }
    }

    fn compiling_a_component_on_its_first_use_does_not_use_up_a_runs_time(b: Backend) {
        // A driver on a fresh engine (no compiled code, no disk cache)
        // loads the run's workflow in the pass, compiling its component,
        // which takes far longer than the 50 ms the run gets: the three
        // steps are taken in that one pass all the same (without the rule
        // the pass stops after the first).
        let h = Host::new(b);
        let step = json!({"component": component("chain/step.wasm")});
        let nodes = json!({
            "a": {"component": step["component"], "next": "b"},
            "b": {"component": step["component"], "next": "c"},
            "c": {"component": step["component"], "config": {"last": true}},
        });
        let wf = one_flow(&h, "cold", nodes, "a");
        let id = h.rt.start(&wf, StartOptions::default()).unwrap();
        let engine = stepwell::WasmEngine::new(stepwell::EngineConfig {
            cache_dir: None,
            ..stepwell::EngineConfig::default()
        })
        .unwrap();
        let cold = stepwell::builder(h.store.clone())
            .engine(engine)
            .config(RuntimeConfig {
                drive_time_per_run: std::time::Duration::from_millis(50),
                ..RuntimeConfig::default()
            })
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let report = cold.drive_once().unwrap();
        assert_eq!(report.ticked, std::slice::from_ref(&id), "{report:?}");
        let run = cold.get_state(&id).unwrap();
        assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
        assert_eq!(run.output, Some(json!({"steps": 3})));
        // The compilation is what took the time (else this proves nothing).
        assert!(started.elapsed() > std::time::Duration::from_millis(50));
    }

    /// An effect whose execution panics: a bug in the host, not in a flow.
    struct Explode;

    impl EffectHandler for Explode {
        fn kind(&self) -> &str {
            "explode"
        }
        fn class(&self) -> EffectClass {
            EffectClass::Pure
        }
        fn execute(
            &self,
            _: &EffectCx<'_>,
            _: &serde_json::Map<String, Value>,
            _: Option<&Value>,
        ) -> stepwell::Result<Outcome> {
            panic!("the effect blew up");
        }
    }

    fn a_panic_in_a_step_fails_that_run_and_the_host_goes_on(b: Backend) {
        let h = Host::new(b);
        let rt = stepwell::builder(h.store.clone())
            .engine(h.rt.engine().clone())
            .effect(std::sync::Arc::new(Explode))
            .build()
            .unwrap();
        let dir = stepwell_tests::write_bundle(
            h.dir.path(),
            "explode",
            &[(
                "flow.json",
                json!({"workflow_id": "explode", "entry": "boom", "nodes": {
                    "boom": {"effect": "explode", "payload": {}, "next": "done"},
                    "done": {"complete": {}}}}),
            )],
        );
        rt.load_bundle(&dir).unwrap();
        let id = rt.start("explode", StartOptions::default()).unwrap();
        let run = rt.tick(&id).unwrap();
        assert_eq!(run.status, RunStatus::Failed);
        let error = run.error.unwrap();
        assert!(
            error.starts_with("host_panic") && error.contains("the effect blew up"),
            "{error}"
        );
        let ledger = rt.get_ledger(&id).unwrap();
        let last = ledger.last().unwrap();
        assert_eq!(last.status, StepStatus::Failed);
        assert_eq!(last.error.as_deref(), Some(error.as_str()));
        assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Failed);
        // The same runtime goes on.
        rt.load_bundle(&stepwell_tests::example("hello")).unwrap();
        let hello = rt
            .run(
                "hello",
                StartOptions {
                    vars: vars(json!({"name": "after"})),
                    ..StartOptions::default()
                },
            )
            .unwrap();
        assert_eq!(hello.status, RunStatus::Completed);
    }

    store_tests!(
        vars_that_double_every_step_fail_the_run,
        a_run_has_a_budget_of_data,
        values_that_nest_too_deep_are_refused_at_the_door,
        a_self_starting_tree_stops_at_the_nesting_limit_even_across_waits,
        a_run_may_start_only_so_many_children,
        slow_steps_of_one_run_leave_time_for_the_others,
        compiling_a_component_on_its_first_use_does_not_use_up_a_runs_time,
        a_panic_in_a_step_fails_that_run_and_the_host_goes_on,
    );
}

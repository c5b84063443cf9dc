//! Effects in flight: a model call the driver starts leaves its pass at
//! once (a due timer is not held behind it), a cancel drops the call's
//! request, and a cancel made by another runtime on the same store reaches
//! it too. Against a real HTTP server on loopback (`support/llm_mock.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use stepwell::llm::{LlmCall, Provider, Providers};
use stepwell::{Clock, ManualClock, RunStatus, Runtime, RuntimeConfig, StartOptions};
use stepwell_tests::llm_mock::{LlmMock, Reply};
use stepwell_tests::write_bundle;

/// A runtime over the SQLite file in `dir` whose provider is `mock` (a
/// minute's timeout, one attempt), with the flows `ask` (one model call)
/// and `nap` (a one-second timer).
fn runtime(mock: &LlmMock, dir: &std::path::Path, clock: Arc<ManualClock>) -> Runtime {
    runtime_with(mock, dir, clock, RuntimeConfig::default())
}

/// [`runtime`] with `config` (its retries replaced by one attempt).
fn runtime_with(
    mock: &LlmMock,
    dir: &std::path::Path,
    clock: Arc<ManualClock>,
    config: RuntimeConfig,
) -> Runtime {
    let providers = Providers::only(Provider {
        timeout_s: Some(60.0),
        ..Provider::new("mock", &mock.base_url, Some("mock-model"))
    });
    let once = stepwell::RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_secs(1),
        factor: 2.0,
        max_backoff: Duration::from_secs(1),
    };
    let store = Arc::new(stepwell::SqliteStore::open(dir.join("db.sqlite")).unwrap());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .clock(clock as Arc<dyn Clock>)
        .config(RuntimeConfig {
            retries: [("llm_call".to_string(), once)].into(),
            ..config
        })
        .effect(Arc::new(LlmCall::new(providers)))
        .build()
        .unwrap();
    for (name, flow) in [
        (
            "ask",
            json!({"workflow_id": "ask", "entry": "ask", "nodes": {
                "ask": {"effect": "llm_call", "payload": {"prompt": "Hello"}, "result_key": "answer", "next": "end"},
                "end": {"complete": {"answer": {"$var": "answer.content"}}}}}),
        ),
        (
            "nap",
            json!({"workflow_id": "nap", "entry": "nap", "nodes": {
                "nap": {"effect": "wait_until", "payload": {"seconds": 1}, "next": "end"},
                "end": {"complete": {"woke": true}}}}),
        ),
    ] {
        rt.load_bundle(&write_bundle(dir, name, &[("flow.json", flow)]))
            .unwrap();
    }
    rt
}

/// Waits (at most 10 s) until `done` holds.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_slow_model_call_leaves_the_pass_and_a_due_timer_is_not_held_behind_it() {
    let mock = LlmMock::always(Reply::Delay(
        Duration::from_secs(3),
        Box::new(Reply::text("late but fine")),
    ));
    let dir = tempfile::tempdir().unwrap();
    let clock = stepwell_tests::manual_clock();
    let rt = runtime(&mock, dir.path(), clock.clone());
    let nap = rt.run("nap", StartOptions::default()).unwrap();
    assert_eq!(nap.status, RunStatus::Waiting);
    let ask = rt.start("ask", StartOptions::default()).unwrap();

    // The pass starts the call and moves on: the run is running, its
    // effect in flight, its `started` record written.
    let pass = rt.drive_once().unwrap();
    assert_eq!(pass.ticked, vec![ask.clone()]);
    assert_eq!(rt.in_flight(), 1);
    assert_eq!(rt.get_state(&ask).unwrap().status, RunStatus::Running);
    let started = rt.get_ledger(&ask).unwrap();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(
        started[0].status,
        stepwell::core::model::StepStatus::Started
    );
    // Nobody else of this runtime takes the run while its call flies.
    let busy = rt.tick(&ask).unwrap_err();
    assert_eq!(busy.reason_code(), "conflict", "{busy}");

    // The timer falls due while the call is out: the next pass resumes it
    // (the call, answered after 3 s, is still out when it does).
    clock.advance(chrono::Duration::seconds(2));
    let pass = rt.drive_once().unwrap();
    assert_eq!(pass.due_resumed, vec![nap.run_id.clone()]);
    assert_eq!(
        rt.get_state(&nap.run_id).unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(rt.get_state(&ask).unwrap().status, RunStatus::Running);
    assert_eq!(rt.in_flight(), 1, "the call was still out");

    // The call lands; the run goes on by itself, once.
    assert!(rt.wait_in_flight(Duration::from_secs(30)));
    let run = rt.get_state(&ask).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.output.unwrap()["answer"], "late but fine");
    assert_eq!(mock.count(), 1);
    rt.verify_ledger(&ask).unwrap().expect("the chain holds");
    let statuses: Vec<_> = rt
        .get_ledger(&ask)
        .unwrap()
        .iter()
        .map(|r| format!("{:?}", r.status))
        .collect();
    assert_eq!(statuses, ["Started", "Completed", "Completed"]);
}

#[test]
fn a_cancel_drops_every_call_in_flight() {
    let mock = LlmMock::always(Reply::Hang);
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&mock, dir.path(), stepwell_tests::manual_clock());
    let ids: Vec<String> = (0..20)
        .map(|_| rt.start("ask", StartOptions::default()).unwrap())
        .collect();
    rt.drive_once().unwrap();
    eventually("every call reached the server", || mock.count() == 20);
    assert_eq!(rt.in_flight(), 20);
    for id in &ids {
        let run = rt.cancel_run(id, Some("enough")).unwrap();
        assert_eq!(run.status, RunStatus::Cancelled);
    }
    // Each request is dropped (its connection closed), not waited out.
    eventually("every call was dropped", || mock.dropped() == 20);
    assert!(rt.wait_in_flight(Duration::from_secs(10)));
    for id in &ids {
        let run = rt.get_state(id).unwrap();
        assert_eq!(run.status, RunStatus::Cancelled);
        let ledger = rt.get_ledger(id).unwrap();
        assert!(
            ledger
                .iter()
                .all(|r| r.status != stepwell::core::model::StepStatus::Completed),
            "{ledger:?}"
        );
    }
    assert_eq!(mock.count(), 20, "no call was made again");
}

#[test]
fn a_cancel_by_another_runtime_reaches_the_call() {
    let mock = LlmMock::always(Reply::Hang);
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime(&mock, dir.path(), stepwell_tests::manual_clock());
    let id = rt.start("ask", StartOptions::default()).unwrap();
    rt.drive_once().unwrap();
    eventually("the call reached the server", || mock.count() == 1);
    // Another runtime on the same file (another holder: what another
    // process is to this one).
    let other = runtime(&mock, dir.path(), stepwell_tests::manual_clock());
    other.cancel_run(&id, None).unwrap();
    eventually("the call was dropped", || mock.dropped() == 1);
    assert!(rt.wait_in_flight(Duration::from_secs(10)));
    assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Cancelled);
}

#[test]
fn past_max_in_flight_a_run_is_held_back_not_executed_in_the_pass() {
    held_back_past(RuntimeConfig {
        max_in_flight: 1,
        ..RuntimeConfig::default()
    });
}

/// The bound on bytes holds back as the bound on count does: the first
/// call's request (a few hundred bytes) is past a bound of 1 byte.
#[test]
fn past_max_in_flight_bytes_a_run_is_held_back_not_executed_in_the_pass() {
    held_back_past(RuntimeConfig {
        max_in_flight_bytes: 1,
        ..RuntimeConfig::default()
    });
}

/// With `config`, one of two runs whose calls would fly flies and the
/// other is held back (not called inside the pass), then flies once the
/// first has landed.
fn held_back_past(config: RuntimeConfig) {
    let mock = LlmMock::always(Reply::Delay(
        Duration::from_secs(2),
        Box::new(Reply::text("fine")),
    ));
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime_with(&mock, dir.path(), stepwell_tests::manual_clock(), config);
    let a = rt.start("ask", StartOptions::default()).unwrap();
    let b = rt.start("ask", StartOptions::default()).unwrap();
    // One pass: one flies (a pass starts at a point of its own in the
    // list); the other would fly past the limit, so it is held back (not
    // called inside the pass, which would hold it 2 s).
    let pass = rt.drive_once().unwrap();
    assert_eq!(pass.ticked.len(), 2, "{pass:?}");
    assert_eq!(rt.in_flight(), 1);
    eventually("the first call reached the server", || mock.count() == 1);
    assert_eq!(mock.count(), 1, "the held-back call was not made");
    // Its `started` record stays; once the first has landed, a later pass
    // flies it.
    assert!(rt.wait_in_flight(Duration::from_secs(30)));
    let (first, second) = match rt.get_state(&a).unwrap().status {
        RunStatus::Completed => (a, b),
        _ => (b, a),
    };
    assert_eq!(rt.get_state(&first).unwrap().status, RunStatus::Completed);
    assert_eq!(rt.get_state(&second).unwrap().status, RunStatus::Running);
    eventually("the second flew", || {
        rt.drive_once().unwrap();
        rt.in_flight() == 1 || rt.get_state(&second).unwrap().status == RunStatus::Completed
    });
    assert!(rt.wait_in_flight(Duration::from_secs(30)));
    let run = rt.get_state(&second).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(mock.count(), 2);
    let started = rt
        .get_ledger(&second)
        .unwrap()
        .iter()
        .filter(|r| r.status == stepwell::core::model::StepStatus::Started)
        .count();
    assert_eq!(started, 1, "one started record, reused by the replay");
}

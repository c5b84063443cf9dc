//! Hostile and broken guests fail only their own run, quickly, with a ledger
//! record and an error that says which limit or what output; the host keeps
//! serving every other run.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stepwell::{RunState, RunStatus, StartOptions, StepStatus};
use stepwell_tests::{component, strict_engine, wait_for, Backend, Host};

const TIME_LIMIT: Duration = Duration::from_millis(500);
const MEMORY_MIB: usize = 64;

fn host(b: Backend) -> Host {
    Host::with_engine(b, strict_engine(TIME_LIMIT, MEMORY_MIB))
}

/// Runs the hostile component in `mode` as the only node of a flow.
fn run_mode(h: &Host, mode: &str) -> RunState {
    let flow = json!({
        "workflow_id": format!("hostile-{mode}"),
        "entry": "node",
        "nodes": {
            "node": {"component": component("runaway/hostile.wasm"), "config": {"mode": mode}, "next": "end"},
            "end": {"complete": "reached the end"}
        }
    });
    let wf = h.load_scratch(&format!("hostile-{mode}"), &[("flow.json", flow)]);
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    h.rt.tick(&id).unwrap()
}

fn assert_failed(h: &Host, run: &RunState, code: &str) -> String {
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.error.clone().unwrap();
    assert!(error.starts_with(code), "expected {code}, got {error}");
    assert!(
        error.contains("node node") && error.contains("workflow hostile-"),
        "names the node and its workflow: {error}"
    );
    let ledger = h.rt.get_ledger(&run.run_id).unwrap();
    let last = ledger.last().unwrap();
    assert_eq!(last.status, StepStatus::Failed);
    assert_eq!(last.error.as_ref(), Some(&error));
    assert_eq!(
        h.rt.get_state(&run.run_id).unwrap(),
        *run,
        "the failure is saved"
    );
    error
}

/// After a hostile guest, the same host still runs a well-behaved flow.
fn still_serves(h: &Host) {
    let wf = h.load("hello");
    let id =
        h.rt.start(
            &wf,
            StartOptions {
                vars: serde_json::from_value(json!({"name": "after"})).unwrap(),
                ..StartOptions::default()
            },
        )
        .unwrap();
    assert_eq!(
        h.rt.tick(&id).unwrap().output,
        Some(json!({"message": "Hello, after!"}))
    );
}

fn a_guest_that_never_returns_is_stopped_at_its_time_limit(b: Backend) {
    let h = host(b);
    let t = Instant::now();
    let run = run_mode(&h, "loop");
    let took = t.elapsed();
    let error = assert_failed(&h, &run, "guest_timeout");
    assert!(error.contains("time limit of 500 ms"), "{error}");
    assert!(took >= TIME_LIMIT, "stopped after {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "stopped within seconds, took {took:?}"
    );
    still_serves(&h);
}

fn the_runaway_example_fails_only_its_own_run(b: Backend) {
    let h = host(b);
    let wf = h.load("runaway");
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.error.unwrap().starts_with("guest_timeout"));
    still_serves(&h);
}

fn a_guest_that_allocates_without_bound_hits_the_memory_limit(b: Backend) {
    // The memory limit, not time: a time limit growing to 64 MiB can never
    // reach, however busy the machine.
    let h = Host::with_engine(b, strict_engine(Duration::from_secs(30), MEMORY_MIB));
    let run = run_mode(&h, "alloc");
    let error = assert_failed(&h, &run, "guest_memory_limit");
    assert!(error.contains("64 MiB"), "{error}");
    still_serves(&h);
}

fn output_over_the_limit_is_refused(b: Backend) {
    // Output limits, not time: a time limit writing 40 MiB can never reach,
    // however busy the machine.
    let h = Host::with_engine(b, strict_engine(Duration::from_secs(30), MEMORY_MIB));
    let run = |bytes: u64| {
        let flow = json!({
            "workflow_id": format!("hostile-big-{bytes}"),
            "entry": "node",
            "nodes": {"node": {"component": component("runaway/hostile.wasm"),
                               "config": {"mode": "big_output", "bytes": bytes}}}
        });
        let wf = h.load_scratch(&format!("big-{bytes}"), &[("flow.json", flow)]);
        let id = h.rt.start(&wf, StartOptions::default()).unwrap();
        h.rt.tick(&id).unwrap()
    };
    // Just over the 8 MiB limit: counted and refused.
    let error = assert_failed(&h, &run((8 << 20) + 1000), "output_too_large");
    assert!(
        error.contains("returned 8389610 bytes of output, over the limit of 8388608"),
        "{error}"
    );
    // Far over: the host stops copying it out of the guest.
    let error = assert_failed(&h, &run(40 << 20), "output_too_large");
    assert!(error.contains("far more output than the limit"), "{error}");
    // Within the limit: fine.
    let ok = run(1 << 20);
    assert_eq!(ok.status, RunStatus::Completed, "{:?}", ok.error);
    still_serves(&h);
}

fn traps_panics_and_stack_overflows_are_reported(b: Backend) {
    let h = host(b);
    let error = assert_failed(&h, &run_mode(&h, "trap"), "guest_trap");
    assert!(error.contains("unreachable"), "{error}");
    let error = assert_failed(&h, &run_mode(&h, "panic"), "guest_trap");
    assert!(
        error.contains("the hostile node panicked on purpose"),
        "stderr is kept: {error}"
    );
    let error = assert_failed(&h, &run_mode(&h, "stack"), "guest_trap");
    assert!(error.contains("stack"), "{error}");
    still_serves(&h);
}

fn output_that_does_not_parse_is_refused(b: Backend) {
    let h = host(b);
    let error = assert_failed(&h, &run_mode(&h, "bad_json"), "guest_bad_output");
    assert!(
        error.contains("step-plan.complete-output") && error.contains("not JSON"),
        "{error}"
    );
    let error = assert_failed(&h, &run_mode(&h, "bad_vars"), "guest_bad_output");
    assert!(
        error.contains("step-plan.vars") && error.contains("an array"),
        "{error}"
    );
    let error = assert_failed(&h, &run_mode(&h, "unknown_next"), "guest_bad_output");
    assert!(error.contains("nowhere"), "{error}");
    let error = assert_failed(&h, &run_mode(&h, "no_such_mode"), "node_invalid_input");
    assert!(error.contains("unknown mode"), "{error}");
    still_serves(&h);
}

fn the_sandbox_has_no_filesystem_environment_network_or_clock(b: Backend) {
    let h = host(b);
    let flow = json!({
        "workflow_id": "probe",
        "entry": "node",
        "nodes": {"node": {"component": component("runaway/hostile.wasm"), "config": {"mode": "probe"}}}
    });
    let wf = h.load_scratch("probe", &[("flow.json", flow)]);
    std::env::set_var("STEPWELL_SECRET_FOR_TEST", "x");
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    let seen: Value = run.output.unwrap();
    assert_eq!(seen["env_count"], json!(0), "{seen}");
    assert_eq!(seen["args_count"], json!(0), "{seen}");
    assert!(
        seen["fs_root"].as_str().unwrap().starts_with("error"),
        "{seen}"
    );
    assert!(
        seen["fs_relative"].as_str().unwrap().starts_with("error"),
        "{seen}"
    );
    assert_eq!(seen["net"], Value::Null, "no port, no connection: {seen}");
    assert_eq!(
        seen["clock_unix_secs"],
        json!(0),
        "the guest clock reads the epoch: {seen}"
    );

    // A listener that is really there: the guest's connect traps before
    // anything reaches it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let flow = json!({
        "workflow_id": "hostile-probe-net",
        "entry": "node",
        "nodes": {"node": {
            "component": component("runaway/hostile.wasm"),
            "config": {"mode": "probe", "port": port}
        }}
    });
    let wf = h.load_scratch("hostile-probe-net", &[("flow.json", flow)]);
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let error = assert_failed(&h, &h.rt.tick(&id).unwrap(), "guest_trap");
    assert!(
        error.contains("wasi:sockets") && error.contains("not available to stepwell guests"),
        "{error}"
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the guest reached the listener: {other:?}"),
    }
    still_serves(&h);
}

fn a_runaway_guest_does_not_block_other_runs(b: Backend) {
    // A longer limit than the other tests: the well-behaved runs below must
    // all finish while the runaway is still spinning.
    let h = Host::with_engine(b, strict_engine(Duration::from_secs(3), MEMORY_MIB));
    let wf = h.load("runaway");
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let rt = h.rt.clone();
    let runaway = id.clone();
    let spinner = std::thread::spawn(move || rt.tick(&runaway).unwrap());
    wait_for(
        "the runaway to be under way",
        Duration::from_secs(10),
        || {
            h.store
                .list_leased(10)
                .unwrap()
                .iter()
                .any(|(r, _)| *r == id)
        },
    );
    // Runs served while the store still shows the runaway running (its
    // step has not ended): they did not wait for it.
    let mut served_beside = 0;
    for _ in 0..20 {
        still_serves(&h);
        if h.rt.get_state(&id).unwrap().status == RunStatus::Running {
            served_beside += 1;
        }
    }
    assert!(served_beside > 0, "no run completed while the runaway spun");
    let run = spinner.join().unwrap();
    assert!(run.error.unwrap().starts_with("guest_timeout"));
}

fn state_an_instance_keeps_between_calls_never_fails_a_step(b: Backend) {
    // Twenty steps on one component in one tick share an instance; each
    // keeps 8 MiB more, so the instance reaches the 64 MiB limit around the
    // eighth call. That step is tried again on a fresh instance and the run
    // completes.
    let h = host(b);
    let mut nodes = serde_json::Map::new();
    for i in 0..20 {
        let next = if i == 19 {
            "end".to_string()
        } else {
            format!("n{}", i + 1)
        };
        nodes.insert(
            format!("n{i}"),
            json!({"component": component("runaway/hostile.wasm"),
                   "config": {"mode": "leak", "bytes": 8 << 20}, "next": next}),
        );
    }
    nodes.insert("end".into(), json!({"complete": {"done": true}}));
    let flow = json!({"workflow_id": "hostile-leak", "entry": "n0", "nodes": nodes});
    let wf = h.load_scratch("hostile-leak", &[("flow.json", flow)]);
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.output, Some(json!({"done": true})));
    let ledger = h.rt.get_ledger(&id).unwrap();
    assert!(
        ledger.iter().all(|r| r.status != StepStatus::Failed),
        "{ledger:?}"
    );
}

/// A flow of `count` steps: node `n<i>` calls `components[i]`, writing its
/// instance's call count in var `c<i>`.
fn count_flow(workflow_id: &str, components: &[std::path::PathBuf]) -> Value {
    let mut nodes = serde_json::Map::new();
    let last = components.len() - 1;
    for (i, path) in components.iter().enumerate() {
        let next = if i == last {
            "end".to_string()
        } else {
            format!("n{}", i + 1)
        };
        nodes.insert(
            format!("n{i}"),
            json!({"component": path, "config": {"mode": "count", "key": format!("c{i}")}, "next": next}),
        );
    }
    nodes.insert("end".into(), json!({"complete": {"done": true}}));
    json!({"workflow_id": workflow_id, "entry": "n0", "nodes": nodes})
}

/// The count each step's instance had reached, in step order.
fn counts(run: &RunState, steps: usize) -> Vec<u64> {
    (0..steps)
        .map(|i| run.vars[&format!("c{i}")].as_u64().unwrap())
        .collect()
}

fn the_steps_of_one_tick_reuse_an_instance_and_a_new_tick_starts_fresh(b: Backend) {
    let h = host(b);
    let hostile = component("runaway/hostile.wasm");
    let wf = h.load_scratch(
        "count",
        &[("flow.json", count_flow("hostile-count", &vec![hostile; 6]))],
    );
    // One tick: six steps on one instance.
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(counts(&run, 6), [1, 2, 3, 4, 5, 6]);
    // A tick of one step at a time: every step on a fresh instance (nothing
    // an instance keeps survives its tick, or reaches another run).
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let mut run = h.rt.tick_with(&id, 1).unwrap();
    while run.status == RunStatus::Running {
        run = h.rt.tick_with(&id, 1).unwrap();
    }
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(counts(&run, 6), [1; 6]);
    // With reuse turned off, every call gets a fresh instance.
    let rt = h.runtime(
        None,
        stepwell::RuntimeConfig {
            reuse_instances: false,
            ..stepwell::RuntimeConfig::default()
        },
    );
    rt.load_bundle(&h.dir.path().join("count")).unwrap();
    let id = rt.start(&wf, StartOptions::default()).unwrap();
    let run = rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(counts(&run, 6), [1; 6]);
}

fn a_tick_through_more_components_than_it_keeps_instances_of(b: Backend) {
    // Distinct components (the hostile one, each copy made distinct by a
    // custom section) called in one tick: the tick keeps the instances of
    // the four it used last and lets the least recently used go.
    let h = host(b);
    let bytes = std::fs::read(component("runaway/hostile.wasm")).unwrap();
    let copies: Vec<std::path::PathBuf> = (0..10u8)
        .map(|copy| {
            let path = h.dir.path().join(format!("hostile-{copy}.wasm"));
            let mut distinct = bytes.clone();
            // A custom section named "x" holding one byte.
            distinct.extend_from_slice(&[0, 3, 1, b'x', copy]);
            std::fs::write(&path, distinct).unwrap();
            path
        })
        .collect();
    // Ten components in turn, twice over: each one's instance is gone by
    // the time it is called again.
    let round: Vec<_> = copies.iter().cycle().take(20).cloned().collect();
    let wf = h.load_scratch("many", &[("flow.json", count_flow("hostile-many", &round))]);
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(h.rt.get_ledger(&id).unwrap().len(), 21);
    assert_eq!(counts(&run, 20), [1; 20]);
    // Four components keep their instances. Copy 0 is used again, so the
    // fifth (copy 4) pushes out the least recently used, copy 1 (not copy
    // 0, the first made): copy 0 goes on counting, copy 1 starts over, and
    // its new instance pushes out copy 2, while copy 3 is still kept.
    let order = [0, 1, 2, 3, 0, 4, 0, 1, 3, 2];
    let steps: Vec<_> = order.iter().map(|&i| copies[i].clone()).collect();
    let wf = h.load_scratch("lru", &[("flow.json", count_flow("hostile-lru", &steps))]);
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(counts(&run, order.len()), [1, 1, 1, 1, 2, 1, 3, 1, 2, 1]);
}

fn the_guests_of_one_host_share_a_memory_limit(b: Backend) {
    // Each guest may hold 64 MiB; all of the engine's live guests together
    // 72 MiB. A parent keeps the instance that holds 40 MiB while its sync
    // child (inside the same step) tries to hold 40 MiB more: the child
    // fails, the process stays small.
    let engine = stepwell::WasmEngine::new(stepwell::EngineConfig {
        cache_dir: Some(stepwell_tests::cache_dir()),
        limits: stepwell::SandboxLimits {
            time_limit: TIME_LIMIT,
            memory_limit_bytes: MEMORY_MIB << 20,
            total_memory_bytes: 72 << 20,
            ..stepwell::SandboxLimits::default()
        },
        digests: None,
    })
    .unwrap();
    let h = Host::with_engine(b, engine);
    let hostile = component("runaway/hostile.wasm");
    let leak = json!({"mode": "leak", "bytes": 40 << 20});
    let wf = h.load_scratch(
        "shared-memory",
        &[
            (
                "flow.json",
                json!({"workflow_id": "hostile-shared", "entry": "hold", "nodes": {
                    "hold": {"component": hostile, "config": leak, "next": "child"},
                    "child": {"effect": "start_subworkflow",
                              "payload": {"workflow_id": "hostile-shared-child"},
                              "result_key": "c", "next": "end"},
                    "end": {"complete": {"done": true}}}}),
            ),
            (
                "child.flow.json",
                json!({"workflow_id": "hostile-shared-child", "entry": "hold", "nodes": {
                    "hold": {"component": hostile, "config": leak, "next": "end"},
                    "end": {"complete": {"done": true}}}}),
            ),
        ],
    );
    let id = h.rt.start(&wf, StartOptions::default()).unwrap();
    let run = h.rt.tick(&id).unwrap();
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.error.unwrap();
    assert!(
        error.contains("guest_memory_limit")
            && error.contains("together hold their limit of 72 MiB"),
        "{error}"
    );
    // The memory went with the instances: the host runs as before.
    still_serves(&h);
    let again = h.rt.start(&wf, StartOptions::default()).unwrap();
    assert_eq!(h.rt.tick(&again).unwrap().status, RunStatus::Failed);
}

fn random_bytes_are_the_same_for_the_same_step_of_the_same_run(b: Backend) {
    // Two steps of one run draw different bytes; the same run started again
    // under the same id (in another store) draws the same ones: the stream
    // is seeded by the run and its step, so a replay sees what the first
    // execution saw.
    let draw = |b: Backend| {
        let h = host(b);
        let hostile = component("runaway/hostile.wasm");
        let wf = h.load_scratch(
            "random",
            &[(
                "flow.json",
                json!({"workflow_id": "hostile-random", "entry": "a", "nodes": {
                    "a": {"component": hostile, "config": {"mode": "random", "key": "a"}, "next": "b"},
                    "b": {"component": hostile, "config": {"mode": "random", "key": "b"}, "next": "end"},
                    "end": {"complete": {"a": {"$var": "a"}, "b": {"$var": "b"}}}}}),
            )],
        );
        let run = |id: &str| {
            let id =
                h.rt.start(
                    &wf,
                    StartOptions {
                        run_id: Some(id.into()),
                        ..StartOptions::default()
                    },
                )
                .unwrap();
            h.rt.tick(&id).unwrap().output.unwrap()
        };
        (run("same-run"), run("other-run"))
    };
    let (first, other) = draw(b);
    let (again, _) = draw(b);
    assert_ne!(first["a"], first["b"], "two steps draw different bytes");
    assert_eq!(first["a"].as_str().unwrap().len(), 32);
    assert_eq!(
        first, again,
        "the same steps of the same run draw the same bytes"
    );
    assert_ne!(first["a"], other["a"], "another run draws other bytes");
}

fn output_that_nests_too_deep_or_writes_a_bad_key_is_refused(b: Backend) {
    let h = host(b);
    let hostile = component("runaway/hostile.wasm");
    let run = |name: &str, config: Value| {
        let wf = h.load_scratch(
            name,
            &[(
                "flow.json",
                json!({"workflow_id": format!("hostile-{name}"), "entry": "node", "nodes": {
                    "node": {"component": hostile, "config": config, "next": "end"},
                    "end": {"complete": {"ok": true}}}}),
            )],
        );
        let id = h.rt.start(&wf, StartOptions::default()).unwrap();
        h.rt.tick(&id).unwrap()
    };
    // A vars patch 100 levels deep (the stores read back 128, the host
    // takes 64).
    let mut deep = json!(1);
    for _ in 0..100 {
        deep = json!({ "d": deep });
    }
    let error = assert_failed(
        &h,
        &run(
            "deep",
            json!({"mode": "effect", "patch": {"x": deep}, "effect": {"kind": "vars_query", "payload": {}}}),
        ),
        "guest_bad_output",
    );
    assert!(
        error.contains("step-plan.vars.x") && error.contains("levels deep"),
        "{error}"
    );
    // A result key of a hundred thousand dotted parts.
    let key = vec!["a"; 100_000].join(".");
    let error = assert_failed(
        &h,
        &run(
            "long-key",
            json!({"mode": "effect", "effect": {"kind": "vars_query", "payload": {}, "result_key": key}}),
        ),
        "guest_bad_output",
    );
    assert!(
        error.contains("bytes long") || error.contains("dotted parts"),
        "{error}"
    );
    still_serves(&h);
}

stepwell_tests::store_tests!(
    random_bytes_are_the_same_for_the_same_step_of_the_same_run,
    output_that_nests_too_deep_or_writes_a_bad_key_is_refused,
    the_guests_of_one_host_share_a_memory_limit,
    a_tick_through_more_components_than_it_keeps_instances_of,
    the_steps_of_one_tick_reuse_an_instance_and_a_new_tick_starts_fresh,
    state_an_instance_keeps_between_calls_never_fails_a_step,
    a_guest_that_never_returns_is_stopped_at_its_time_limit,
    the_runaway_example_fails_only_its_own_run,
    a_guest_that_allocates_without_bound_hits_the_memory_limit,
    traps_panics_and_stack_overflows_are_reported,
    output_over_the_limit_is_refused,
    output_that_does_not_parse_is_refused,
    the_sandbox_has_no_filesystem_environment_network_or_clock,
    a_runaway_guest_does_not_block_other_runs,
);

#[test]
fn a_file_that_is_not_a_component_is_refused_at_load() {
    let h = host(Backend::Memory);
    let dir = h.dir.path().join("junk");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("junk.wasm"), b"definitely not wasm").unwrap();
    std::fs::write(
        dir.join("flow.json"),
        json!({"workflow_id": "junk", "entry": "n", "nodes": {"n": {"component": "junk.wasm"}}})
            .to_string(),
    )
    .unwrap();
    let err = h.rt.load_bundle(&dir).unwrap_err();
    let msg = err.to_string();
    assert_eq!(err.reason_code(), "invalid_definition");
    assert!(
        msg.contains("flow.json") && msg.contains("nodes.n.component"),
        "{msg}"
    );
    assert!(msg.contains("not a valid WebAssembly component"), "{msg}");
}

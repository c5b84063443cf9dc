//! Many processes on one store, the way operators run stepwell: drivers
//! looping beside `resume`, `run` and `cancel` commands, each its own OS
//! process, on one SQLite file. Nothing is done twice, nothing is lost, and
//! the loser of a race gets a typed error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell::{RunStatus, Runtime, StartOptions, StepRecord};
use stepwell_tests::{count_results, example, stepwell_binary, vars, wait_for};

/// A database in a scratch directory, and the runtime tests set runs up
/// with.
struct Db {
    dir: tempfile::TempDir,
}

impl Db {
    fn new() -> Db {
        Db {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("db.sqlite")
    }

    fn runtime(&self) -> Runtime {
        open_runtime(&StoreSpec::Sqlite(self.path()), &HostOptions::default()).unwrap()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(stepwell_binary());
        c.arg("--db")
            .arg(self.path())
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE");
        c
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn output(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// `count` drivers looping on the database.
    fn drivers(&self, count: usize, extra: &[&str]) -> Drivers {
        let mut args = vec!["drive", "--interval-ms", "20"];
        args.extend_from_slice(extra);
        Drivers((0..count).map(|_| self.spawn(&args)).collect())
    }
}

/// Driver processes, killed when dropped.
struct Drivers(Vec<Child>);

impl Drop for Drivers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn node_visits(ledger: &[StepRecord]) -> Vec<String> {
    ledger
        .iter()
        .filter(|r| {
            r.effect.is_none()
                && r.result.as_ref().is_some_and(|v| {
                    v.get("next_node").is_some() || v.get("complete_output").is_some()
                })
        })
        .map(|r| r.node_id.clone().unwrap_or_default())
        .collect()
}

#[test]
fn two_processes_resuming_one_wait_complete_it_once() {
    let db = Db::new();
    let rt = db.runtime();
    let wf = rt
        .load_bundle(&example("ask-user"))
        .unwrap()
        .main_workflow_id;
    let ids: Vec<String> = (0..50).map(|i| format!("race-{i}")).collect();
    let mut keys = Vec::new();
    for id in &ids {
        let parked = rt
            .run(
                &wf,
                StartOptions {
                    run_id: Some(id.clone()),
                    ..StartOptions::default()
                },
            )
            .unwrap();
        keys.push(parked.waiting.unwrap().wait_key);
    }
    for (i, id) in ids.iter().enumerate() {
        // Half name the wait, half resume whatever the run waits on.
        let contenders: Vec<Child> = ["A", "B"]
            .iter()
            .map(|who| {
                let payload = json!({ "text": who }).to_string();
                let mut args = vec![
                    "resume",
                    id.as_str(),
                    "--payload",
                    payload.as_str(),
                    "--json",
                ];
                if i % 2 == 0 {
                    args.extend(["--wait-key", keys[i].as_str()]);
                }
                db.spawn(&args)
            })
            .collect();
        let outs: Vec<Output> = contenders
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect();
        let winners: Vec<&Output> = outs.iter().filter(|o| o.status.success()).collect();
        assert_eq!(winners.len(), 1, "{id}: exactly one resume wins: {outs:?}");
        let loser = outs.iter().find(|o| !o.status.success()).unwrap();
        assert_eq!(loser.status.code(), Some(1), "{id}");
        let err: Value = serde_json::from_slice(&loser.stderr).unwrap();
        let code = err["error"]["code"].as_str().unwrap();
        assert!(
            code == "stale_resume" || code == "conflict",
            "{id}: a typed error: {err}"
        );
        let won: Value = serde_json::from_slice(&winners[0].stdout).unwrap();
        let state = rt.get_state(id).unwrap();
        assert_eq!(state.status, RunStatus::Completed);
        assert_eq!(state.output, won["output"].clone().into(), "{id}");
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(count_results(&ledger, "resumed"), 1, "{id}: {ledger:?}");
        assert_eq!(count_results(&ledger, "complete_output"), 1, "{id}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    for id in ids.iter().take(3) {
        let verify = db.output(&["ledger", id, "--verify"]);
        assert!(verify.status.success(), "{id}: {verify:?}");
    }
}

#[test]
fn three_drivers_move_every_run_once() {
    let db = Db::new();
    let rt = db.runtime();
    let waiter = rt
        .load_bundle(&example("wait-until"))
        .unwrap()
        .main_workflow_id;
    let chain = rt.load_bundle(&example("chain")).unwrap().main_workflow_id;
    let mut waits = Vec::new();
    for _ in 0..100 {
        let parked = rt
            .run(
                &waiter,
                StartOptions {
                    vars: vars(json!({"seconds": 0.5})),
                    ..StartOptions::default()
                },
            )
            .unwrap();
        assert_eq!(parked.status, RunStatus::Waiting);
        waits.push(parked.run_id);
    }
    let chains: Vec<String> = (0..20)
        .map(|_| rt.start(&chain, StartOptions::default()).unwrap())
        .collect();
    let drivers = db.drivers(3, &[]);
    let all: Vec<&String> = waits.iter().chain(&chains).collect();
    wait_for("every run to complete", Duration::from_secs(90), || {
        all.iter()
            .all(|id| rt.get_state(id).unwrap().status == RunStatus::Completed)
    });
    drop(drivers);
    for id in &waits {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(
            count_results(&ledger, "due"),
            1,
            "{id}: one resume per wait"
        );
        assert_eq!(
            node_visits(&ledger),
            ["execute"],
            "{id}: one execution per node visit"
        );
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
    }
    for id in &chains {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(
            node_visits(&ledger),
            ["n0", "n1", "n2", "n3", "n4"],
            "{id}: one execution per node visit"
        );
        assert_eq!(rt.get_state(id).unwrap().output, Some(json!({"steps": 5})));
    }
}

/// A chain of `len` slow (but finite) nodes.
fn slow_chain(dir: &Path, len: usize) -> PathBuf {
    let hostile = stepwell_tests::component("runaway/hostile.wasm");
    let mut nodes = serde_json::Map::new();
    for i in 0..len {
        let mut node =
            json!({"component": hostile, "config": {"mode": "spin", "iterations": 60_000_000u64}});
        node["next"] = json!(if i + 1 < len {
            format!("s{}", i + 1)
        } else {
            "done".into()
        });
        nodes.insert(format!("s{i}"), node);
    }
    nodes.insert("done".into(), json!({"complete": {"ok": true}}));
    stepwell_tests::write_bundle(
        dir,
        "slow",
        &[(
            "flow.json",
            json!({"workflow_id": "slow", "entry": "s0", "nodes": nodes}),
        )],
    )
}

#[test]
fn a_driver_killed_mid_run_leaves_it_to_another_with_no_step_done_twice() {
    let db = Db::new();
    let rt = db.runtime();
    rt.load_bundle(&slow_chain(db.dir.path(), 12)).unwrap();
    let id = rt.start("slow", StartOptions::default()).unwrap();
    // The default lease lasts 30 s; the dead driver's runs are taken over
    // at once all the same (its process is known to be gone).
    let mut first = db.drivers(1, &[]);
    wait_for(
        "the first driver to be under way",
        Duration::from_secs(60),
        || rt.get_ledger(&id).unwrap().len() >= 3,
    );
    // kill -9: no destructor, no lease given back.
    first.0[0].kill().unwrap();
    first.0[0].wait().unwrap();
    let at_kill = node_visits(&rt.get_ledger(&id).unwrap());
    assert!(
        at_kill.len() < 12,
        "the run was still going when its driver died: {at_kill:?}"
    );
    assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Running);
    let _second = db.drivers(1, &[]);
    wait_for(
        "another driver to finish the run",
        Duration::from_secs(90),
        || rt.get_state(&id).unwrap().status == RunStatus::Completed,
    );
    let ledger = rt.get_ledger(&id).unwrap();
    let expected: Vec<String> = (0..12)
        .map(|i| format!("s{i}"))
        .chain(["done".to_string()])
        .collect();
    assert_eq!(node_visits(&ledger), expected, "each node once, in order");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

#[test]
fn a_stalled_driver_loses_its_run_when_the_lease_lapses_and_cannot_commit_after() {
    // A driver stopped (SIGSTOP) is alive but renews nothing: another takes
    // the run over once the lease lapses (not at once: its holder still
    // runs). Let go again, the stalled driver's step in flight is refused.
    let db = Db::new();
    let rt = db.runtime();
    rt.load_bundle(&slow_chain(db.dir.path(), 8)).unwrap();
    let id = rt.start("slow", StartOptions::default()).unwrap();
    let ttl = ["--lease-ttl-ms", "1500"];
    let first = db.drivers(1, &ttl);
    wait_for(
        "the first driver to be under way",
        Duration::from_secs(60),
        || node_visits(&rt.get_ledger(&id).unwrap()).len() >= 2,
    );
    let pid = first.0[0].id().to_string();
    let signal = |sig: &str| {
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    signal("-STOP");
    let at_stop = node_visits(&rt.get_ledger(&id).unwrap());
    assert!(at_stop.len() < 9, "{at_stop:?}");
    let _second = db.drivers(1, &ttl);
    wait_for(
        "another driver to finish the run",
        Duration::from_secs(120),
        || rt.get_state(&id).unwrap().status == RunStatus::Completed,
    );
    let done = rt.get_ledger(&id).unwrap();
    signal("-CONT");
    // The stalled driver wakes in the middle of a step of a run that has
    // moved on: its commit is refused, and nothing more lands.
    std::thread::sleep(Duration::from_millis(1500));
    drop(first);
    let ledger = rt.get_ledger(&id).unwrap();
    assert_eq!(ledger, done, "nothing landed after the takeover");
    let expected: Vec<String> = (0..8)
        .map(|i| format!("s{i}"))
        .chain(["done".to_string()])
        .collect();
    assert_eq!(node_visits(&ledger), expected, "each node once, in order");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

#[test]
fn a_cancel_from_another_process_is_not_overwritten_by_the_driver() {
    let db = Db::new();
    let rt = db.runtime();
    rt.load_bundle(&slow_chain(db.dir.path(), 30)).unwrap();
    let id = rt.start("slow", StartOptions::default()).unwrap();
    let _driver = db.drivers(1, &[]);
    wait_for(
        "the driver to be under way",
        Duration::from_secs(60),
        || rt.get_ledger(&id).unwrap().len() >= 2,
    );
    let out = db.output(&["cancel", &id, "--reason", "enough", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let cancelled: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cancelled["status"], "cancelled");
    // The driver's step in flight finds the run changed and stops: its
    // commit never lands, and nothing runs after the cancel.
    std::thread::sleep(Duration::from_millis(800));
    let state = rt.get_state(&id).unwrap();
    assert_eq!(state.status, RunStatus::Cancelled);
    assert_eq!(state.error.as_deref(), Some("cancelled: enough"));
    let ledger = rt.get_ledger(&id).unwrap();
    let last = ledger.last().unwrap();
    assert_eq!(last.status, stepwell::StepStatus::Cancelled, "{ledger:?}");
    assert_eq!(
        last.result,
        Some(json!({"cancelled": {"by": "cli", "reason": "enough"}}))
    );
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

#[test]
fn a_run_started_beside_a_driver_is_executed_once() {
    // `stepwell run` (start + tick) in one process while two drivers loop
    // in others, on a chain slow enough that a driver can pick the run up
    // between its creation and its first step: whoever gets the run first
    // executes it, the others leave it.
    let db = Db::new();
    let rt = db.runtime();
    let bundle = slow_chain(db.dir.path(), 3);
    rt.load_bundle(&bundle).unwrap();
    let _drivers = db.drivers(2, &[]);
    let mut ids = Vec::new();
    for i in 0..4 {
        let id = format!("beside-{i}");
        let out = db.output(&["run", bundle.to_str().unwrap(), "--run-id", &id, "--json"]);
        assert!(out.status.success(), "{out:?}");
        ids.push(id);
    }
    wait_for("every run to complete", Duration::from_secs(120), || {
        ids.iter()
            .all(|id| rt.get_state(id).unwrap().status == RunStatus::Completed)
    });
    for id in &ids {
        assert_eq!(
            node_visits(&rt.get_ledger(id).unwrap()),
            ["s0", "s1", "s2", "done"],
            "{id}"
        );
    }
}

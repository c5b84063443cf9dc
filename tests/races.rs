//! Many processes on one store, the way operators run stepwell: drivers
//! looping beside `resume`, `run` and `cancel` commands, each its own OS
//! process, on one SQLite file or one PostgreSQL database (as several hosts
//! would be). Nothing is done twice, nothing is lost, and the loser of a
//! race gets a typed error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell::{RunStatus, Runtime, StartOptions, StepRecord};
use stepwell_tests::{count_results, example, stepwell_binary, vars, wait_for, Backend};

/// A store (SQLite in a scratch directory, or a PostgreSQL schema of its
/// own), and the runtime tests set runs up with.
struct Db {
    dir: tempfile::TempDir,
    spec: StoreSpec,
}

impl Db {
    fn new(backend: Backend) -> Db {
        let dir = tempfile::tempdir().unwrap();
        let spec = match backend {
            Backend::Sqlite => StoreSpec::Sqlite(dir.path().join("db.sqlite")),
            Backend::Postgres => {
                stepwell_tests::open_store(backend, dir.path());
                StoreSpec::parse(&stepwell_tests::store_spec(backend, dir.path())).unwrap()
            }
            other => panic!("no races on {other:?}"),
        };
        Db { dir, spec }
    }

    fn runtime(&self) -> Runtime {
        open_runtime(&self.spec, &HostOptions::default()).unwrap()
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(stepwell_binary());
        // State and caches of the test's own, not the user's.
        stepwell_tests::scratch_home(&mut c, self.dir.path())
            .arg("--store")
            .arg(match &self.spec {
                StoreSpec::Sqlite(p) => format!("sqlite:{}", p.display()),
                StoreSpec::Postgres(url) => url.clone(),
                other => panic!("no races on {other:?}"),
            })
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

    /// [`Db::cmd`] run from `cwd` instead, with its state and caches in
    /// `cwd/.state` and `cwd/.cache` (another host: its own).
    fn cmd_in(&self, cwd: &Path, args: &[&str]) -> Command {
        let mut c = self.cmd(args);
        stepwell_tests::scratch_home(&mut c, cwd).current_dir(cwd);
        c
    }

    /// Runs a `--json` command from `cwd` ([`Db::cmd_in`]): its exit code
    /// and the JSON it printed (on stdout when it succeeded, else stderr).
    fn json_in(&self, cwd: &Path, args: &[&str]) -> (Option<i32>, Value) {
        let out = self.cmd_in(cwd, args).output().unwrap();
        let text = if out.status.success() {
            &out.stdout
        } else {
            &out.stderr
        };
        let printed = serde_json::from_slice(text).unwrap_or_else(|e| {
            panic!(
                "{e}: stdout {} stderr {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out.status.code(), printed)
    }

    /// A client of the PostgreSQL schema, to read and damage its tables.
    fn sql(&self) -> ::postgres::Client {
        let StoreSpec::Postgres(url) = &self.spec else {
            panic!("not a PostgreSQL store")
        };
        ::postgres::Client::connect(url, ::postgres::NoTls).unwrap()
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

fn two_processes_resuming_one_wait_complete_it_once(b: Backend) {
    let db = Db::new(b);
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

fn three_drivers_move_every_run_once(b: Backend) {
    let db = Db::new(b);
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

/// The node visits of a whole run of [`slow_chain`]`(len)`: each node
/// once, in order.
fn slow_visits(len: usize) -> Vec<String> {
    (0..len)
        .map(|i| format!("s{i}"))
        .chain(["done".to_string()])
        .collect()
}

/// A chain of `len` slow (but finite) nodes.
fn slow_chain(dir: &Path, len: usize) -> PathBuf {
    slow_chain_of(dir, len, 60_000_000)
}

/// A chain of `len` nodes that each spin `iterations` times.
fn slow_chain_of(dir: &Path, len: usize, iterations: u64) -> PathBuf {
    let hostile = stepwell_tests::component("runaway/hostile.wasm");
    let mut nodes = serde_json::Map::new();
    for i in 0..len {
        let mut node =
            json!({"component": hostile, "config": {"mode": "spin", "iterations": iterations}});
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

fn a_driver_killed_mid_run_leaves_it_to_another_with_no_step_done_twice(b: Backend) {
    let db = Db::new(b);
    let rt = db.runtime();
    // Slower nodes than the other races': on a loaded machine the first
    // driver must still be under way when this thread looks.
    rt.load_bundle(&slow_chain_of(db.dir.path(), 12, 150_000_000))
        .unwrap();
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
    let expected = slow_visits(12);
    assert_eq!(node_visits(&ledger), expected, "each node once, in order");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

fn a_stalled_driver_loses_its_run_when_the_lease_lapses_and_cannot_commit_after(b: Backend) {
    // A driver stopped (SIGSTOP) is alive but renews nothing: another takes
    // the run over once the lease lapses (not at once: its holder still
    // runs). Let go again, the stalled driver's step in flight is refused.
    let db = Db::new(b);
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
    let expected = slow_visits(8);
    assert_eq!(node_visits(&ledger), expected, "each node once, in order");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

fn a_cancel_from_another_process_is_not_overwritten_by_the_driver(b: Backend) {
    let db = Db::new(b);
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

fn a_run_started_beside_a_driver_is_executed_once(b: Backend) {
    // `stepwell run` (start + tick) in one process while two drivers loop
    // in others, on a chain slow enough that a driver can pick the run up
    // between its creation and its first step: whoever gets the run first
    // executes it, the others leave it.
    let db = Db::new(b);
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

/// Three drivers on one store, as three hosts would run: 300 runs mixing
/// chains, ask-user runs resumed by other processes, timers and
/// subworkflows, and 20 automations on a 2-second schedule (3 firings
/// each). Every run completes exactly once, every ledger verifies, every
/// occurrence runs once. With `kill_one`, one driver is `kill -9`'d when
/// about half of the runs are done; the other two finish its work.
fn cluster(b: Backend, kill_one: bool) {
    let db = Db::new(b);
    let rt = db.runtime();
    let wf = |name: &str| rt.load_bundle(&example(name)).unwrap().main_workflow_id;
    let (chain, ask, timer, sub) = (
        wf("chain"),
        wf("ask-user"),
        wf("wait-until"),
        wf("subworkflow"),
    );
    let mut automations = Vec::new();
    for i in 0..20 {
        let request = json!({
            "request_id": format!("cluster-{i}"),
            "title": format!("Cluster {i}"),
            "target": {
                "workflow_id": "echo",
                "bundle_ref": stepwell_tests::repo().join("flows/automations/echo"),
                "flow_id": "echo",
                "input_data": {"prompt": format!("tick {i}")},
            },
            "trigger": {"source_id": "schedule", "source_version": 1,
                        "config": {"every": "2s", "count": 3}},
            "workspace_root": db.dir.path(),
        });
        let created =
            stepwell::automation::create_automation(&rt, &request, chrono::Utc::now(), None)
                .unwrap();
        automations.push(created.automation_id);
    }
    let (mut chains, mut asks, mut timers, mut subs) = (vec![], vec![], vec![], vec![]);
    for i in 0..75 {
        let opts = |v: Value| StartOptions {
            vars: vars(v),
            ..StartOptions::default()
        };
        chains.push(rt.start(&chain, StartOptions::default()).unwrap());
        let parked = rt.run(&ask, StartOptions::default()).unwrap();
        assert_eq!(parked.status, RunStatus::Waiting);
        asks.push(parked.run_id);
        let seconds = 0.5 + f64::from(i % 5) * 0.5;
        timers.push(
            rt.run(&timer, opts(json!({"seconds": seconds})))
                .unwrap()
                .run_id,
        );
        subs.push(
            rt.start(&sub, opts(json!({"text": format!("child {i}")})))
                .unwrap(),
        );
    }
    let mut drivers = db.drivers(3, &["--lease-ttl-ms", "3000"]);
    // Other processes answer the people, a few at a time.
    let mut killed = !kill_one;
    let all: Vec<&String> = chains
        .iter()
        .chain(&asks)
        .chain(&timers)
        .chain(&subs)
        .collect();
    let done = |id: &String| rt.get_state(id).unwrap().status == RunStatus::Completed;
    for batch in asks.chunks(8) {
        let resumers: Vec<Child> = batch
            .iter()
            .map(|id| {
                db.spawn(&[
                    "resume",
                    id,
                    "--payload",
                    r#"{"text": "cluster"}"#,
                    "--json",
                ])
            })
            .collect();
        for r in resumers {
            let out = r.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        if !killed && all.iter().filter(|id| done(id)).count() >= all.len() / 2 {
            // kill -9: no destructor, its leases left to lapse.
            drivers.0[0].kill().unwrap();
            drivers.0[0].wait().unwrap();
            killed = true;
        }
    }
    wait_for("every run to complete", Duration::from_secs(180), || {
        all.iter().all(|id| done(id))
    });
    if !killed {
        drivers.0[0].kill().unwrap();
        drivers.0[0].wait().unwrap();
    }
    wait_for(
        "every automation to fire 3 times",
        Duration::from_secs(120),
        || {
            automations.iter().all(|id| {
                let page = stepwell::automation::list_occurrences(&rt, id, None, 10).unwrap();
                let items = page["items"].as_array().unwrap();
                items.len() == 3 && items.iter().all(|o| o["status"] == "completed")
            })
        },
    );
    drop(drivers);
    for id in &chains {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(node_visits(&ledger), ["n0", "n1", "n2", "n3", "n4"], "{id}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    for id in &asks {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(count_results(&ledger, "resumed"), 1, "{id}: one resume");
        assert_eq!(count_results(&ledger, "complete_output"), 1, "{id}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    for id in &timers {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(
            count_results(&ledger, "due"),
            1,
            "{id}: one resume per wait"
        );
        assert_eq!(node_visits(&ledger), ["execute"], "{id}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    for (i, id) in subs.iter().enumerate() {
        let children = rt
            .list_runs(&stepwell::RunQuery {
                parent_run_id: Some(id.clone()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(children.len(), 1, "{id}: one child");
        assert_eq!(children[0].status, RunStatus::Completed);
        assert!(stepwell::store::verify_chain(&rt.get_ledger(id).unwrap()).is_ok());
        assert!(
            stepwell::store::verify_chain(&rt.get_ledger(&children[0].run_id).unwrap()).is_ok()
        );
        assert_eq!(
            rt.get_state(id).unwrap().output,
            Some(json!({"shouted": format!("CHILD {i}")})),
            "{id}"
        );
    }
    for id in &automations {
        let ledger = rt.get_ledger(id).unwrap();
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
        assert_eq!(
            stepwell_tests::repeated_automation_keys(&ledger),
            Vec::<String>::new(),
            "{id}: every decision once"
        );
        let page = stepwell::automation::list_occurrences(&rt, id, None, 10).unwrap();
        let mut indexes: Vec<i64> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["index"].as_i64().unwrap())
            .collect();
        indexes.sort();
        assert_eq!(indexes, [1, 2, 3], "{id}: each firing once");
        let children = rt
            .list_runs(&stepwell::RunQuery {
                parent_run_id: Some(id.clone()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(children.len(), 3, "{id}: one run per occurrence");
        for c in &children {
            assert_eq!(c.status, RunStatus::Completed, "{}", c.run_id);
            assert!(stepwell::store::verify_chain(&rt.get_ledger(&c.run_id).unwrap()).is_ok());
        }
    }
}

fn three_drivers_share_300_runs_and_20_automations(b: Backend) {
    cluster(b, false);
}

fn a_driver_killed_halfway_leaves_its_share_to_the_others(b: Backend) {
    cluster(b, true);
}

/// On PostgreSQL a driver that polls every ten minutes still starts a run
/// another process started at once: the start's commit signals it
/// (LISTEN/NOTIFY), and it wakes, also after the server restarted.
#[test]
fn a_slow_polling_driver_wakes_when_another_process_adds_work() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    // It restarts the server: no test that cannot ride that out runs meanwhile.
    let _restarting = stepwell_tests::postgres_restarting();
    let db = Db::new(Backend::Postgres);
    let rt = db.runtime();
    let chain = rt.load_bundle(&example("chain")).unwrap().main_workflow_id;
    let _driver = Drivers(vec![db.spawn(&["drive", "--interval-ms", "600000"])]);
    // Its first pass found nothing; it now waits (for ten minutes).
    std::thread::sleep(Duration::from_millis(1500));
    let restart = std::env::var_os("STEPWELL_TEST_POSTGRES_RESTART");
    for round in 0..3 {
        if round == 2 {
            // The server restarts: the driver listens again on a new
            // connection, and still wakes.
            let Some(restart) = &restart else { break };
            assert!(Command::new(restart).status().unwrap().success());
        }
        let id = rt.start(&chain, StartOptions::default()).unwrap();
        wait_for(
            &format!("the driver to wake for run {round}"),
            Duration::from_secs(60),
            || rt.get_state(&id).unwrap().status == RunStatus::Completed,
        );
    }
}

/// On PostgreSQL idle drivers are idle: with nothing due they wait for a
/// signal (at most `IDLE_POLL`, 5 s) instead of passing every
/// `--interval-ms`, and a time wait parked by another process wakes them
/// when it falls due, not at their next poll.
#[test]
fn idle_drivers_pass_rarely_and_wake_when_a_timer_falls_due() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let rt = db.runtime();
    let timer = rt
        .load_bundle(&example("wait-until"))
        .unwrap()
        .main_workflow_id;
    // Polling every 50 ms, three idle drivers would make 60 passes each
    // in 3 s (each pass prints a line with --json).
    let mut drivers: Vec<Child> = (0..3)
        .map(|_| db.spawn(&["--json", "drive", "--interval-ms", "50"]))
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    for d in &mut drivers {
        d.kill().unwrap();
    }
    for d in drivers {
        let out = d.wait_with_output().unwrap();
        let passes = String::from_utf8_lossy(&out.stdout).lines().count();
        assert!(
            (1..=3).contains(&passes),
            "an idle driver made {passes} passes in 3 s; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Drivers whose safety-net poll is 10 minutes: a 1 s timer parked by
    // this process completes about 1 s later (the park signals them, and
    // they sleep until it falls due).
    let _drivers = Drivers(
        (0..2)
            .map(|_| db.spawn(&["drive", "--interval-ms", "600000"]))
            .collect(),
    );
    std::thread::sleep(Duration::from_millis(1500));
    let started = std::time::Instant::now();
    let id = rt
        .start(
            &timer,
            StartOptions {
                vars: vars(json!({"seconds": 1})),
                ..Default::default()
            },
        )
        .unwrap();
    wait_for(
        "the timer's run to complete",
        Duration::from_secs(60),
        || rt.get_state(&id).unwrap().status == RunStatus::Completed,
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "completed before its timer: {took:?}"
    );
}

/// Copies the files of folder `from` (not below it) into a new folder `to`.
fn copy_flat(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// On PostgreSQL the database keeps each bundle's files: a host that has
/// never seen the bundle's directory (it is gone, or on another machine)
/// resumes the workflow's runs from them, through a cache folder of its
/// own, and files changed in the database are refused by their digest.
#[test]
fn a_host_without_the_bundle_directory_runs_the_files_the_database_keeps() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let (host_a, host_b, host_c) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let src = tempfile::tempdir().unwrap();
    let bundle = src.path().join("ask");
    copy_flat(&example("ask-user"), &bundle);
    let bundle_arg = bundle.to_str().unwrap();
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let (_, run) = db.json_in(host_a.path(), &["--json", "run", bundle_arg]);
            assert_eq!(run["status"], "waiting", "{run}");
            run["run_id"].as_str().unwrap().to_string()
        })
        .collect();
    drop(src);
    assert!(!bundle.exists());
    // Host B has neither the directory nor a cache: it resumes the run.
    let payload = r#"{"response": "Ada"}"#;
    let (code, run) = db.json_in(
        host_b.path(),
        &["--json", "resume", &ids[0], "--payload", payload],
    );
    assert!(code == Some(0), "{run}");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["workflow_version"], 1, "{run}");
    let mut sql = db.sql();
    // A component changed in the database: host C refuses to run it, and
    // the run stays as it was.
    sql.execute(
        "UPDATE bundle_files SET content = content || 'x'::bytea WHERE path = 'greet.wasm'",
        &[],
    )
    .unwrap();
    let (code, err) = db.json_in(
        host_c.path(),
        &["--json", "resume", &ids[1], "--payload", payload],
    );
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err["error"]["code"], "invalid_definition", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("do not match their digest") && m.contains("ask-user")),
        "{err}"
    );
    let rt = db.runtime();
    assert_eq!(rt.get_state(&ids[1]).unwrap().status, RunStatus::Waiting);
}

/// A component outside its bundle's directory (`../greet.wasm`) is kept
/// with the bundle on PostgreSQL: a host without either runs it.
#[test]
fn a_component_outside_the_bundle_is_kept_with_it_on_a_shared_store() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let (host_a, host_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = tempfile::tempdir().unwrap();
    std::fs::copy(
        example("ask-user").join("greet.wasm"),
        src.path().join("greet.wasm"),
    )
    .unwrap();
    let bundle = src.path().join("b");
    std::fs::create_dir(&bundle).unwrap();
    let mut flow: Value =
        serde_json::from_slice(&std::fs::read(example("ask-user").join("flow.json")).unwrap())
            .unwrap();
    flow["workflow_id"] = json!("outside");
    flow["nodes"]["greet"]["component"] = json!("../greet.wasm");
    std::fs::write(bundle.join("flow.json"), flow.to_string()).unwrap();
    let (_, run) = db.json_in(host_a.path(), &["--json", "run", bundle.to_str().unwrap()]);
    assert_eq!(run["status"], "waiting", "{run}");
    drop(src);
    let (_, done) = db.json_in(
        host_b.path(),
        &[
            "--json",
            "resume",
            run["run_id"].as_str().unwrap(),
            "--payload",
            r#"{"response": "Ada"}"#,
        ],
    );
    assert_eq!(done["status"], "completed", "{done}");
    let mut sql = db.sql();
    let paths: Vec<String> = sql
        .query("SELECT path FROM bundle_files ORDER BY path", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(paths[0].starts_with(".stepwell-outside/") && paths[0].ends_with("/greet.wasm"));
    assert_eq!(paths[1], "flow.json");
    let kept: Vec<u8> = sql
        .query_one(
            "SELECT content FROM bundle_files WHERE path = 'flow.json'",
            &[],
        )
        .unwrap()
        .get(0);
    let kept: Value = serde_json::from_slice(&kept).unwrap();
    assert_eq!(kept["nodes"]["greet"]["component"], json!(paths[0]));
}

/// A component named by a symbolic link, by a path through `..`, or by an
/// absolute path is kept under a name the kept flow file uses: a host
/// without the bundle runs each.
#[test]
fn components_named_by_links_dot_dots_and_absolute_paths_run_on_another_host() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let (host_a, host_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let src = tempfile::tempdir().unwrap();
    let template: Value =
        serde_json::from_slice(&std::fs::read(example("ask-user").join("flow.json")).unwrap())
            .unwrap();
    let mut parked = Vec::new();
    for (i, how) in ["link", "dotdot", "absolute"].iter().enumerate() {
        let bundle = src.path().join(how);
        std::fs::create_dir_all(bundle.join("real")).unwrap();
        std::fs::create_dir_all(bundle.join("sub")).unwrap();
        let real = bundle.join("real/greet.wasm");
        std::fs::copy(example("ask-user").join("greet.wasm"), &real).unwrap();
        std::os::unix::fs::symlink("real/greet.wasm", bundle.join("link.wasm")).unwrap();
        let component = match i {
            0 => "link.wasm".to_string(),
            1 => "sub/../real/greet.wasm".to_string(),
            _ => real.display().to_string(),
        };
        let mut flow = template.clone();
        flow["workflow_id"] = json!(format!("named-{how}"));
        flow["nodes"]["greet"]["component"] = json!(component);
        std::fs::write(bundle.join("flow.json"), flow.to_string()).unwrap();
        let (_, run) = db.json_in(host_a.path(), &["--json", "run", bundle.to_str().unwrap()]);
        assert_eq!(run["status"], "waiting", "{how}: {run}");
        parked.push((how, run["run_id"].as_str().unwrap().to_string()));
    }
    drop(src);
    for (how, id) in parked {
        let (_, done) = db.json_in(
            host_b.path(),
            &[
                "--json",
                "resume",
                &id,
                "--payload",
                r#"{"response": "Ada"}"#,
            ],
        );
        assert_eq!(done["status"], "completed", "{how}: {done}");
    }
}

/// Bundle files damaged in the database are the bundle's fault, not its
/// runs': a driver reports them and backs off, and quarantines nothing.
#[test]
fn a_driver_reports_damaged_bundle_files_and_quarantines_nothing() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let (host_a, host_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (_, run) = db.json_in(
        host_a.path(),
        &[
            "--json",
            "run",
            example("wait-until").to_str().unwrap(),
            "--vars",
            r#"{"seconds": 0.2}"#,
        ],
    );
    assert_eq!(run["status"], "waiting", "{run}");
    let id = run["run_id"].as_str().unwrap().to_string();
    let mut sql = db.sql();
    let changed = sql
        .execute(
            "UPDATE bundle_files SET content = content || 'x'::bytea WHERE path = 'steps.wasm'",
            &[],
        )
        .unwrap();
    assert_eq!(changed, 1);
    std::thread::sleep(Duration::from_millis(400));
    let out = db
        .cmd_in(host_b.path(), &["--json", "drive", "--once"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["quarantined"], json!([]), "{report}");
    assert_eq!(report["errors"][0]["run_id"], json!(id), "{report}");
    assert!(
        report["errors"][0]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("invalid_definition") && e.contains("digest")),
        "{report}"
    );
    let rt = db.runtime();
    assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Waiting);
    assert_eq!(rt.store().quarantined(&id).unwrap(), None);
    // Loading the bundle again repairs its files: the run goes on (once
    // its back-off is over).
    rt.load_bundle(&example("wait-until")).unwrap();
    wait_for(
        "the repaired run to complete",
        Duration::from_secs(30),
        || {
            db.cmd_in(host_b.path(), &["--json", "drive", "--once"])
                .output()
                .unwrap();
            rt.get_state(&id).unwrap().status == RunStatus::Completed
        },
    );
}

/// A database at schema version 1 (bundles as paths) is brought to this
/// build's version by `stepwell db migrate`: its recorded paths are kept,
/// and the first host that needs such a workflow deploys it from there (a
/// version of it from then on).
#[test]
fn a_version_1_database_is_migrated_keeping_its_bundle_paths() {
    use stepwell::store::Store;
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let StoreSpec::Postgres(url) = &db.spec else {
        unreachable!()
    };
    drop(stepwell::PostgresStore::open(url).unwrap());
    // Back to version 1, as a previous stepwell left it, with a bundle
    // recorded by its path.
    let mut sql = db.sql();
    sql.batch_execute(
        "DROP TABLE workflow_versions; DROP TABLE bundle_files;
         ALTER TABLE bundles DROP COLUMN digest; ALTER TABLE artifacts DROP COLUMN stored_us;
         DROP INDEX runs_unindexed; UPDATE stepwell_schema SET version = 1",
    )
    .unwrap();
    let dir = example("ask-user");
    sql.execute(
        "INSERT INTO bundles (workflow_id, dir) VALUES ('ask-user', $1)",
        &[&dir.to_string_lossy().as_ref()],
    )
    .unwrap();
    let out = db.output(&["db", "migrate"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!(
            "schema version {}",
            stepwell::store::POSTGRES_SCHEMA_VERSION
        )),
        "{out:?}"
    );
    let version: i64 = sql
        .query_one("SELECT version FROM stepwell_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, stepwell::store::POSTGRES_SCHEMA_VERSION);
    let store = stepwell::PostgresStore::open(url).unwrap();
    assert_eq!(store.bundle_dir("ask-user").unwrap(), Some(dir));
    assert_eq!(store.workflow_version("ask-user", None).unwrap(), None);
    // The path still serves (this checkout has it): the first use deploys
    // it as version 1.
    let rt = db.runtime();
    rt.workflow("ask-user").unwrap();
    let v1 = store.workflow_version("ask-user", None).unwrap().unwrap();
    assert_eq!(v1.version, 1);
    assert!(!store.bundle_files(&v1.digest).unwrap().is_empty());
}

/// A database at schema version 3 (each workflow id naming the files of
/// one bundle) is migrated keeping them: each becomes version 1.
#[test]
fn a_version_3_database_keeps_its_bundles_as_version_1() {
    use stepwell::store::Store;
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let db = Db::new(Backend::Postgres);
    let StoreSpec::Postgres(url) = &db.spec else {
        unreachable!()
    };
    let rt = db.runtime();
    rt.load_bundle(&example("ask-user")).unwrap();
    let v1 = rt
        .store()
        .workflow_version("ask-user", None)
        .unwrap()
        .unwrap();
    drop(rt);
    let mut sql = db.sql();
    sql.batch_execute(&format!(
        "DROP TABLE workflow_versions; ALTER TABLE artifacts DROP COLUMN stored_us;
         INSERT INTO bundles (workflow_id, dir, digest) VALUES ('ask-user', '/gone', '{}');
         UPDATE stepwell_schema SET version = 3",
        v1.digest
    ))
    .unwrap();
    let store = stepwell::PostgresStore::open(url).unwrap();
    let migrated = store.workflow_version("ask-user", None).unwrap().unwrap();
    assert_eq!((migrated.version, &migrated.digest), (1, &v1.digest));
    assert_eq!(migrated.source.as_deref(), Some("/gone"));
    assert_eq!(store.bundle_dir("ask-user").unwrap(), None);
    let rt = db.runtime();
    let run = rt.run("ask-user", StartOptions::default()).unwrap();
    assert_eq!(run.workflow_version, Some(1));
}

/// The database restarted twice under load (its connections cut, the
/// second time as a crash): the
/// drivers reconnect, every commit in flight either landed or is done
/// again, and nothing is done twice.
#[test]
fn a_database_restarted_under_load_loses_and_doubles_nothing() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let Some(restart) = std::env::var_os("STEPWELL_TEST_POSTGRES_RESTART") else {
        eprintln!("skipped: STEPWELL_TEST_POSTGRES_RESTART is unset (a server of your own)");
        return;
    };
    let _restarting = stepwell_tests::postgres_restarting();
    let db = Db::new(Backend::Postgres);
    let rt = db.runtime();
    let chain = rt.load_bundle(&example("chain")).unwrap().main_workflow_id;
    let timer = rt
        .load_bundle(&example("wait-until"))
        .unwrap()
        .main_workflow_id;
    rt.load_bundle(&slow_chain(db.dir.path(), 4)).unwrap();
    let mut ids: Vec<String> = Vec::new();
    for i in 0..40 {
        ids.push(rt.start(&chain, StartOptions::default()).unwrap());
        let seconds = 0.5 + f64::from(i % 4);
        let parked = rt
            .run(
                &timer,
                StartOptions {
                    vars: vars(json!({"seconds": seconds})),
                    ..StartOptions::default()
                },
            )
            .unwrap();
        ids.push(parked.run_id);
    }
    let slow: Vec<String> = (0..4)
        .map(|_| rt.start("slow", StartOptions::default()).unwrap())
        .collect();
    let drivers = db.drivers(2, &["--lease-ttl-ms", "3000"]);
    // A clean restart, then a crash of the server (no shutdown checkpoint:
    // every pooled connection is stale at once).
    for mode in ["fast", "immediate"] {
        std::thread::sleep(Duration::from_millis(700));
        let status = Command::new(&restart).arg(mode).status().unwrap();
        assert!(status.success(), "the server restarted ({mode})");
    }
    let all: Vec<&String> = ids.iter().chain(&slow).collect();
    wait_for("every run to complete", Duration::from_secs(180), || {
        all.iter().all(|id| {
            rt.get_state(id)
                .is_ok_and(|r| r.status == RunStatus::Completed)
        })
    });
    drop(drivers);
    for id in &ids {
        let ledger = rt.get_ledger(id).unwrap();
        let visits = node_visits(&ledger);
        assert!(
            visits == ["n0", "n1", "n2", "n3", "n4"] || visits == ["execute"],
            "{id}: each node once: {visits:?}"
        );
        assert!(count_results(&ledger, "due") <= 1, "{id}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    for id in &slow {
        let ledger = rt.get_ledger(id).unwrap();
        assert_eq!(
            node_visits(&ledger),
            ["s0", "s1", "s2", "s3", "done"],
            "{id}: each node once"
        );
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
}

/// A host on another machine dies holding leases (`kill -9`). Here the
/// other machine is a driver in a UTS namespace of its own, with another
/// host name: nobody can tell that it died, so its runs wait until its
/// leases lapse, then a driver of this machine finishes them, each step
/// once.
#[test]
fn runs_of_a_host_killed_on_another_machine_finish_here_once_its_leases_lapse() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let unshare_works = Command::new("unshare")
        .args(["--uts", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !unshare_works {
        eprintln!("skipped: `unshare --uts` is not allowed here (it needs root)");
        return;
    }
    let db = Db::new(Backend::Postgres);
    let rt = db.runtime();
    rt.load_bundle(&slow_chain(db.dir.path(), 8)).unwrap();
    let id = rt.start("slow", StartOptions::default()).unwrap();
    let ttl = ["--lease-ttl-ms", "6000"];
    let store = match &db.spec {
        StoreSpec::Postgres(url) => url.clone(),
        other => panic!("{other:?}"),
    };
    let mut other = Drivers(vec![Command::new("unshare")
        .args([
            "--uts",
            "sh",
            "-c",
            "hostname stepwell-other-host && exec \"$0\" \"$@\"",
        ])
        .arg(stepwell_binary())
        .args(["--store", &store, "drive", "--interval-ms", "20"])
        .args(ttl)
        .current_dir(db.dir.path())
        .env_remove("STEPWELL_DB")
        .env_remove("STEPWELL_STORE")
        // State and caches of the test's own (`scratch_home`).
        .env("XDG_STATE_HOME", db.dir.path().join(".state"))
        .env("XDG_CACHE_HOME", db.dir.path().join(".cache"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()]);
    wait_for(
        "the other host to be under way",
        Duration::from_secs(60),
        || node_visits(&rt.get_ledger(&id).unwrap()).len() >= 2,
    );
    let leased = rt.store().list_leased(10).unwrap();
    assert!(
        leased
            .iter()
            .any(|(run, holder)| *run == id && holder.starts_with("stepwell-other-host:")),
        "the other host holds the run: {leased:?}"
    );
    // kill -9 (the `exec` made the driver the namespace's first process).
    other.0[0].kill().unwrap();
    other.0[0].wait().unwrap();
    // A commit the killed process had sent may still land on the server
    // just after it died: the ledger is read once that has settled.
    std::thread::sleep(Duration::from_millis(300));
    let at_kill = rt.get_ledger(&id).unwrap();
    let _here = db.drivers(1, &ttl);
    // Its lease was renewed at most 2 s ago: for a while nobody may move
    // the run.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        rt.get_ledger(&id).unwrap(),
        at_kill,
        "the run moved before the dead host's lease lapsed"
    );
    wait_for(
        "a driver here to finish the run",
        Duration::from_secs(120),
        || rt.get_state(&id).unwrap().status == RunStatus::Completed,
    );
    let ledger = rt.get_ledger(&id).unwrap();
    let expected = slow_visits(8);
    assert_eq!(node_visits(&ledger), expected, "each node once, in order");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

/// Each race on SQLite and on PostgreSQL.
/// A flow `raced` that asks a person, then completes with `{"v": tag}`.
fn raced_flow(tag: u32) -> Value {
    json!({"workflow_id": "raced", "entry": "ask", "nodes": {
        "ask": {"effect": "ask_user", "payload": {"prompt": "go?"}, "next": "done"},
        "done": {"complete": {"v": tag}}}})
}

/// Six `stepwell deploy` processes of six contents of one workflow at once:
/// versions 1 to 6, one per content, none lost or doubled.
fn deploys_racing_in_processes_get_distinct_versions(b: Backend) {
    let db = Db::new(b);
    let dirs: Vec<PathBuf> = (1..=6)
        .map(|i| {
            stepwell_tests::write_bundle(
                db.dir.path(),
                &format!("raced-{i}"),
                &[("flow.json", raced_flow(i))],
            )
        })
        .collect();
    let procs: Vec<Child> = dirs
        .iter()
        .map(|d| db.spawn(&["--json", "deploy", d.to_str().unwrap()]))
        .collect();
    for p in procs {
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let rt = db.runtime();
    let versions = rt.store().workflow_versions(Some("raced")).unwrap();
    let numbers: Vec<u32> = versions.iter().map(|v| v.version).collect();
    assert_eq!(numbers, [1, 2, 3, 4, 5, 6]);
    let mut digests: Vec<&str> = versions.iter().map(|v| v.digest.as_str()).collect();
    digests.sort();
    digests.dedup();
    assert_eq!(digests.len(), 6, "one version per content");
    // Each version runs its own content.
    let mut outputs: Vec<i64> = versions
        .iter()
        .map(|v| {
            let run = rt
                .run(
                    "raced",
                    StartOptions {
                        workflow_version: Some(v.version),
                        ..StartOptions::default()
                    },
                )
                .unwrap();
            let key = run.waiting.unwrap().wait_key;
            let done = rt.resume(&run.run_id, &key, json!({})).unwrap();
            done.output.unwrap()["v"].as_i64().unwrap()
        })
        .collect();
    outputs.sort();
    assert_eq!(outputs, [1, 2, 3, 4, 5, 6]);
}

/// A `resume` and an `upgrade` of one waiting run, in two processes at
/// once: the run ends whole on one version. Upgraded first, it completes
/// on v2 with the `upgraded` record; resumed first, it completes on v1 and
/// the upgrade is refused (the run has ended) or lost the race (conflict).
fn an_upgrade_racing_a_resume_lands_whole(b: Backend) {
    let db = Db::new(b);
    let dir = stepwell_tests::write_bundle(db.dir.path(), "raced", &[("flow.json", raced_flow(1))]);
    let rt = db.runtime();
    rt.deploy(&dir, None).unwrap();
    let ids: Vec<String> = (0..12)
        .map(|_| rt.run("raced", StartOptions::default()).unwrap().run_id)
        .collect();
    stepwell_tests::write_bundle(db.dir.path(), "raced", &[("flow.json", raced_flow(2))]);
    rt.deploy(&dir, None).unwrap();
    let mut upgraded_first = 0;
    for id in &ids {
        let resume = db.spawn(&["--json", "resume", id, "--payload", "{}"]);
        let upgrade = db.spawn(&["--json", "upgrade", id, "--to", "2"]);
        let resumed = resume.wait_with_output().unwrap();
        let upgraded = upgrade.wait_with_output().unwrap();
        assert!(resumed.status.success(), "{id}: {resumed:?}");
        let run = rt.get_state(id).unwrap();
        assert_eq!(run.status, RunStatus::Completed, "{id}");
        let ledger = rt.get_ledger(id).unwrap();
        let moved = count_results(&ledger, "upgraded");
        if upgraded.status.success() {
            let u: Value = serde_json::from_slice(&upgraded.stdout).unwrap();
            assert_eq!(u["moved"], true, "{id}: {u}");
            assert_eq!(moved, 1, "{id}");
            assert_eq!(run.workflow_version, Some(2), "{id}");
            assert_eq!(run.output, Some(json!({"v": 2})), "{id}");
            upgraded_first += 1;
        } else {
            let err: Value = serde_json::from_slice(&upgraded.stderr).unwrap();
            let code = err["error"]["code"].as_str().unwrap();
            assert!(code == "invalid_input" || code == "conflict", "{id}: {err}");
            assert_eq!(moved, 0, "{id}");
            assert_eq!(run.workflow_version, Some(1), "{id}");
            assert_eq!(run.output, Some(json!({"v": 1})), "{id}");
        }
        assert!(stepwell::store::verify_chain(&ledger).is_ok(), "{id}");
    }
    eprintln!(
        "{upgraded_first} of {} upgraded before their resume",
        ids.len()
    );
}

mod on {
    macro_rules! both {
        ($($name:ident),* $(,)?) => {
            mod sqlite {
                $( #[test] fn $name() { super::super::$name(stepwell_tests::Backend::Sqlite) } )*
            }
            mod postgres {
                $( #[test] fn $name() {
                    if !stepwell_tests::postgres_skipped() {
                        super::super::$name(stepwell_tests::Backend::Postgres)
                    }
                } )*
            }
        };
    }

    both!(
        two_processes_resuming_one_wait_complete_it_once,
        three_drivers_share_300_runs_and_20_automations,
        a_driver_killed_halfway_leaves_its_share_to_the_others,
        three_drivers_move_every_run_once,
        a_driver_killed_mid_run_leaves_it_to_another_with_no_step_done_twice,
        a_stalled_driver_loses_its_run_when_the_lease_lapses_and_cannot_commit_after,
        a_cancel_from_another_process_is_not_overwritten_by_the_driver,
        a_run_started_beside_a_driver_is_executed_once,
        deploys_racing_in_processes_get_distinct_versions,
        an_upgrade_racing_a_resume_lands_whole,
    );
}

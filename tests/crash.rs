//! The crash harness: a host running each scenario is aborted at every
//! persistence point (before the write, after it, in the middle of a commit,
//! and, on JSON files, at each point inside the store's own writes); new
//! hosts restart on the same store (some crashing again during recovery,
//! some running two at once) until the scenario is done. Every time, the
//! harness compares the outcome with an uninterrupted run's: each root
//! run's status and output, its children, and its whole ledger record by
//! record (content, not counts: node, status, effect, key, attempt, result
//! and error), with an intact hash chain. An external effect is checked
//! against the outside world it touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use stepwell::{JsonFileStore, RunQuery, SqliteStore, StepRecord, Store};

fn host() -> PathBuf {
    env!("CARGO_BIN_EXE_crash-host").into()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Sqlite,
    Json,
    /// A schema of its own on the tests' PostgreSQL server, named in
    /// `dir/postgres.url`.
    Postgres,
}

fn spec(kind: Kind, dir: &Path) -> String {
    match kind {
        Kind::Sqlite => format!("sqlite:{}", dir.join("db.sqlite").display()),
        Kind::Json => format!("json:{}", dir.join("store").display()),
        Kind::Postgres => {
            let file = dir.join("postgres.url");
            if !file.exists() {
                std::fs::write(&file, stepwell_tests::postgres_url()).unwrap();
            }
            std::fs::read_to_string(file).unwrap()
        }
    }
}

fn open(kind: Kind, dir: &Path) -> Box<dyn Store> {
    match kind {
        Kind::Sqlite => Box::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
        Kind::Json => Box::new(JsonFileStore::open(dir.join("store")).unwrap()),
        Kind::Postgres => Box::new(stepwell::PostgresStore::open(&spec(kind, dir)).unwrap()),
    }
}

/// How a host process ended.
#[derive(Debug, PartialEq)]
enum Ended {
    /// Completed; its report (`points`, `kinds`).
    Done(Value),
    /// Aborted at the fault.
    Crashed,
    /// Completed without meeting the fault (no such point).
    NotFired,
}

fn command(kind: Kind, dir: &Path, scenario: &str, crash: Option<(usize, &str)>) -> Command {
    let mut cmd = Command::new(host());
    cmd.arg(spec(kind, dir)).arg(scenario);
    // Where a database elsewhere keeps the side files.
    cmd.env("STEPWELL_CRASH_DIR", dir);
    if let Some((n, phase)) = crash {
        cmd.arg(n.to_string()).arg(phase);
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn ended(child: Child, crash: bool) -> Ended {
    let out = child.wait_with_output().unwrap();
    match out.status.code() {
        Some(0) => Ended::Done(serde_json::from_slice(&out.stdout).unwrap()),
        Some(3) if crash => Ended::NotFired,
        None if crash => Ended::Crashed,
        _ => panic!(
            "the host failed ({:?}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn run(kind: Kind, dir: &Path, scenario: &str, crash: Option<(usize, &str)>) -> Ended {
    ended(
        command(kind, dir, scenario, crash).spawn().unwrap(),
        crash.is_some(),
    )
}

/// `value` less the fields that hold the time something happened.
fn without_times(value: Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.ends_with("_at") && k != "until")
                .map(|(k, v)| (k, without_times(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_times).collect()),
        other => other,
    }
}

/// A ledger record's content: what it says happened.
fn content(r: &StepRecord) -> Value {
    json!({
        "node": r.node_id,
        "status": r.status.as_str(),
        "effect": r.effect.as_ref().map(|e| without_times(json!({"kind": e.kind, "payload": e.payload}))),
        "key": r.idempotency_key,
        "attempt": r.attempt,
        "result": r.result.clone().map(without_times),
        "error": r.error,
    })
}

/// What must be the same after any crash and recovery, for every root run
/// and its children.
fn outcome(kind: Kind, dir: &Path, roots: &[&str]) -> Value {
    let store = open(kind, dir);
    let mut out = Vec::new();
    for root in roots {
        let run = store.load_run(root).unwrap().expect("the root run exists");
        let children: Vec<String> = store
            .list_runs(&RunQuery {
                parent_run_id: Some(root.to_string()),
                ..RunQuery::default()
            })
            .unwrap()
            .into_iter()
            .map(|c| c.run_id)
            .collect();
        let mut ledgers = Vec::new();
        for id in std::iter::once(root.to_string()).chain(children.iter().cloned()) {
            let ledger = store.list_records(&id).unwrap();
            stepwell::store::verify_chain(&ledger)
                .unwrap_or_else(|b| panic!("{id}: chain broken: {b:?}"));
            ledgers.push(
                json!({"run": id, "records": ledger.iter().map(content).collect::<Vec<_>>()}),
            );
        }
        out.push(json!({
            "run": root,
            "status": run.status.as_str(),
            "output": without_times(run.output.clone().unwrap_or_default()),
            "children": children,
            "ledgers": ledgers,
        }));
    }
    // The store's own folder (a tool's workspace lives in it) is named the
    // same in every trial.
    let text = serde_json::to_string(&Value::Array(out)).unwrap();
    let here = dir.canonicalize().unwrap();
    serde_json::from_str(&text.replace(here.to_str().unwrap(), "$DIR")).unwrap()
}

/// The keys the `external` scenario's effect wrote to the outside world.
fn side_effects(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("side-effects.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

struct Scenario {
    name: &'static str,
    roots: &'static [&'static str],
    /// Whether two hosts may run it at once and must end as one would.
    /// Not for a scenario that moves its clock: a host that acts at the
    /// earlier time while the other already moved on records a later
    /// outcome, correctly, that an uninterrupted run does not have.
    concurrent: bool,
    /// The loopback LLM server the scenario calls (its hosts get its URL
    /// in `STEPWELL_CRASH_LLM_URL`).
    llm: Option<stepwell_tests::llm_mock::LlmMock>,
    /// Whether the scenario's tools append lines to `ws/log.txt`: each
    /// line once, twice only when a crash fell between the tool's run and
    /// the record of its results.
    tool_log: bool,
}

/// The lines the `tools` scenario's writes appended.
fn tool_log(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("ws/log.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn phases(kind: Kind) -> &'static [&'static str] {
    match kind {
        // A SQLite commit is one transaction: it cannot be torn in two.
        Kind::Sqlite => &["before", "after"],
        Kind::Json => &["before", "after", "ledger", "temp", "published", "lease"],
        Kind::Postgres => &["before", "after"],
    }
}

/// Checks a recovered store against the uninterrupted outcome.
fn check(kind: Kind, dir: &Path, s: &Scenario, expected: &Value, what: &str) {
    let got = outcome(kind, dir, s.roots);
    assert_eq!(&got, expected, "{kind:?} {}: {what}", s.name);
}

/// What one crash point showed.
#[derive(Default)]
struct Found {
    /// The fault fired (the host was aborted there).
    fired: bool,
    /// The recovered run asked the model again.
    asked_twice: bool,
    /// How many of the tools' writes ran twice.
    wrote_twice: usize,
}

fn harness(kind: Kind, s: Scenario) {
    // Its hosts exit on a cut connection: no server restart meanwhile.
    let _steady = (kind == Kind::Postgres).then(stepwell_tests::postgres_steady);
    let requests = || s.llm.as_ref().map_or(0, |m| m.count());
    let asked_at_start = requests();
    let clean = tempfile::tempdir().unwrap();
    let Ended::Done(report) = run(kind, clean.path(), s.name, None) else {
        panic!("an uninterrupted host did not complete");
    };
    let kinds: Vec<String> = serde_json::from_value(report["kinds"].clone()).unwrap();
    let points = kinds.len();
    assert!(points >= 3, "{}: only {points} persistence points", s.name);
    let expected = outcome(kind, clean.path(), s.roots);
    let external = s.name == "external";
    if external {
        assert_eq!(side_effects(clean.path()).len(), 1);
    }
    if s.llm.is_some() {
        assert_eq!(
            requests() - asked_at_start,
            1,
            "the uninterrupted run asks once"
        );
    }
    if s.tool_log {
        assert_eq!(tool_log(clean.path()), ["one", "two"]);
    }
    // Each point runs in a folder of its own: two at a time, except where
    // the scenario counts the requests its one LLM server was sent.
    let point = |n: usize, phase: &'static str| -> Found {
        let mut found = Found::default();
        let dir = tempfile::tempdir().unwrap();
        let asked_before = requests();
        let how = run(kind, dir.path(), s.name, Some((n, phase)));
        match (phase, &how) {
            ("before" | "after", Ended::Crashed) => {}
            ("before" | "after", other) => {
                panic!("{phase} fault at {n} did not fire: {other:?}")
            }
            (_, Ended::Done(_)) => panic!("{phase} at {n}: the host ignored the fault"),
            _ => {}
        }
        if how != Ended::Crashed {
            return found;
        }
        found.fired = true;
        // Now and then the recovery itself crashes, once or twice.
        if n.is_multiple_of(3) && phase == "after" {
            for m in 1..=2 {
                run(kind, dir.path(), s.name, Some((m, "after")));
            }
        }
        let recovered = run(kind, dir.path(), s.name, None);
        assert!(matches!(recovered, Ended::Done(_)), "recovery completes");
        let repeated_write = s.tool_log && {
            let lines = tool_log(dir.path());
            ["one", "two"]
                .iter()
                .any(|l| lines.iter().filter(|x| x == l).count() > 1)
        };
        if repeated_write {
            // The one window: a write ran twice, so its second result
            // says the file grew twice. The run still ends the same.
            let got = outcome(kind, dir.path(), s.roots);
            assert_eq!(got[0]["status"], expected[0]["status"]);
            assert_eq!(got[0]["output"], expected[0]["output"]);
        } else {
            check(
                kind,
                dir.path(),
                &s,
                &expected,
                &format!("crash at point {n} ({phase})"),
            );
        }
        if s.llm.is_some() {
            // The server's own count: once its answer is recorded the
            // call is never made again; only a crash between the
            // answer and that record repeats it.
            let asked = requests() - asked_before;
            found.asked_twice = asked == 2;
            let max = if phase == "after" { 1 } else { 2 };
            assert!(
                (1..=max).contains(&asked),
                "{phase} at {n}: the model was asked {asked} times"
            );
        }
        if s.tool_log {
            // Each approved write ran once, twice only when the crash
            // fell between its run and the record of its results.
            let lines = tool_log(dir.path());
            let max = if phase == "after" { 1 } else { 2 };
            for line in ["one", "two"] {
                let count = lines.iter().filter(|l| *l == line).count();
                assert!((1..=max).contains(&count), "{phase} at {n}: {lines:?}");
                found.wrote_twice += usize::from(count == 2);
            }
        }
        if external {
            let keys = side_effects(dir.path());
            assert!(
                !keys.is_empty() && keys.iter().all(|k| *k == keys[0]),
                "{keys:?}"
            );
            // Once its outcome is recorded an effect never runs again;
            // only a crash between the call and that record repeats it
            // (with the same key).
            let max = if phase == "after" { 1 } else { 2 };
            assert!(
                keys.len() <= max,
                "{phase} at {n}: the effect ran {} times",
                keys.len()
            );
        }
        found
    };
    let jobs: Vec<(usize, &'static str)> = (1..=points)
        .flat_map(|n| phases(kind).iter().map(move |p| (n, *p)))
        .collect();
    let workers = if s.llm.is_some() { 1 } else { 2 };
    let next = std::sync::atomic::AtomicUsize::new(0);
    // A failed point stops the other worker at its next job (a failure at
    // the first point is reported then, not minutes later), and its panic
    // names the scenario and the point.
    let failed = std::sync::atomic::AtomicBool::new(false);
    let founds = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (jobs, next, failed, founds, point) = (&jobs, &next, &failed, &founds, &point);
            let name = s.name;
            std::thread::Builder::new()
                .name(format!("{kind:?}-{name}-{worker}"))
                .spawn_scoped(scope, move || loop {
                    if failed.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let Some(&(n, phase)) = jobs.get(i) else {
                        break;
                    };
                    let tried =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| point(n, phase)));
                    match tried {
                        Ok(found) => founds.lock().unwrap().push((phase, found)),
                        Err(panic) => {
                            failed.store(true, std::sync::atomic::Ordering::SeqCst);
                            let msg = panic
                                .downcast_ref::<String>()
                                .map(String::as_str)
                                .or_else(|| panic.downcast_ref::<&str>().copied())
                                .unwrap_or("(a panic without a message)");
                            panic!("{kind:?} {name} {phase} at point {n}: {msg}");
                        }
                    }
                })
                .unwrap();
        }
    });
    let mut wrote_twice = 0;
    let mut fired = std::collections::BTreeMap::<&str, usize>::new();
    let mut asked_twice = 0;
    for (phase, found) in founds.into_inner().unwrap() {
        *fired.entry(phase).or_default() += usize::from(found.fired);
        wrote_twice += found.wrote_twice;
        asked_twice += usize::from(found.asked_twice);
    }
    for phase in phases(kind) {
        assert!(
            fired.get(phase).copied().unwrap_or(0) > 0,
            "{kind:?} {}: no {phase} fault ever fired",
            s.name
        );
    }
    assert_eq!(fired["before"], points);
    assert_eq!(fired["after"], points, "every after fault fired");
    if s.llm.is_some() {
        // The window is real: a fault just before the answer's record
        // makes the recovery ask again; every other point never does.
        assert!(
            asked_twice >= 1,
            "{kind:?}: no crash point repeated the call"
        );
        assert!(
            asked_twice <= phases(kind).len(),
            "{kind:?}: {asked_twice} crash points repeated the call"
        );
    }

    if s.tool_log {
        assert!(
            wrote_twice >= 1,
            "{kind:?}: no crash point repeated a write"
        );
        assert!(
            wrote_twice <= 2 * phases(kind).len(),
            "{kind:?}: {wrote_twice} crash points repeated a write"
        );
    }

    // Two hosts at once on one store, and a crashing host beside a live one.
    let trials = if s.concurrent { 3 } else { 0 };
    for trial in 0..trials {
        let dir = tempfile::tempdir().unwrap();
        let crash = (trial > 0).then_some((points / 2 + trial, "after"));
        let a = command(kind, dir.path(), s.name, crash).spawn().unwrap();
        let b = command(kind, dir.path(), s.name, None).spawn().unwrap();
        ended(a, crash.is_some());
        assert!(matches!(ended(b, false), Ended::Done(_)));
        assert!(matches!(
            run(kind, dir.path(), s.name, None),
            Ended::Done(_)
        ));
        check(
            kind,
            dir.path(),
            &s,
            &expected,
            &format!("two hosts at once (trial {trial})"),
        );
        if external {
            let keys = side_effects(dir.path());
            assert!(
                keys.len() <= 2 && keys.iter().all(|k| *k == keys[0]),
                "{keys:?}"
            );
        }
    }
}

/// Every persistent store: SQLite, JSON files and (where a server is
/// named) PostgreSQL.
fn both(s: fn() -> Scenario) {
    harness(Kind::Sqlite, s());
    harness(Kind::Json, s());
    if !stepwell_tests::postgres_skipped() {
        harness(Kind::Postgres, s());
    }
}

#[test]
fn chain_survives_a_crash_at_every_point() {
    both(|| Scenario {
        name: "chain",
        roots: &["crash-chain"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

#[test]
fn ask_user_survives_a_crash_at_every_point() {
    both(|| Scenario {
        name: "ask",
        roots: &["crash-ask"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

#[test]
fn a_subworkflow_with_an_explicit_child_id_gets_exactly_one_child() {
    both(|| Scenario {
        name: "subworkflow",
        roots: &["crash-sub"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

#[test]
fn an_event_is_delivered_once_and_its_result_reused_after_a_crash() {
    // The emitter's result (delivered 1) is the same after any crash: a
    // replayed emit_event reuses its recorded outcome instead of emitting
    // again, and the listener is resumed exactly once.
    both(|| Scenario {
        name: "event",
        roots: &["crash-emitter", "crash-waiter"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

#[test]
fn a_replayed_event_does_not_resume_a_listener_waiting_on_it_again() {
    both(|| Scenario {
        name: "event-loop",
        roots: &["crash-ticker", "crash-looper"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

#[test]
fn an_external_effect_runs_once_once_its_outcome_is_recorded() {
    both(|| Scenario {
        name: "external",
        roots: &["crash-external"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

/// An `llm_call` whose host crashes at any point asks the model once,
/// twice only when the crash falls between the answer and its record; the
/// run ends with the answer either way (the loopback server counts).
#[test]
fn an_llm_call_is_not_repeated_once_its_answer_is_recorded() {
    let mock =
        stepwell_tests::llm_mock::LlmMock::always(stepwell_tests::llm_mock::Reply::text("Hi"));
    // The crash hosts inherit it (only the llm scenario reads it).
    std::env::set_var("STEPWELL_CRASH_LLM_URL", &mock.base_url);
    for kind in [Kind::Sqlite, Kind::Json] {
        harness(
            kind,
            Scenario {
                name: "llm",
                roots: &["crash-llm"],
                concurrent: false,
                llm: Some(mock.clone()),
                tool_log: false,
            },
        );
    }
}

#[test]
fn a_loop_of_identical_records_loses_none_to_a_crash() {
    // Each visit of a node that loops to itself commits a record that
    // differs from the last only in its id and times: after any crash the
    // ledger holds one record per visit, as an uninterrupted run's does.
    both(|| Scenario {
        name: "loop",
        roots: &["crash-loop"],
        concurrent: true,
        llm: None,
        tool_log: false,
    });
}

/// Automations (spec section 7): after a crash at any point of admission,
/// dispatch, retry scheduling, completion or a command (run now; stop
/// current of a person-waiting occurrence, archive, unarchive, whose
/// follow-ups run after the command's commit and again when it is sent
/// again), and recovery, each controller's ledger is the uninterrupted one
/// (every record key once), and there is exactly one child run per
/// occurrence id.
#[test]
fn an_automation_survives_a_crash_at_every_point() {
    both(|| Scenario {
        name: "automation",
        roots: &[
            "ebbf9de7-276d-5cdb-a787-159013ec055b",
            "8bf50d57-4d62-55b2-a735-d265f66167b4",
        ],
        concurrent: false,
        llm: None,
        tool_log: false,
    });
}

/// Approved tool calls (write_file appends, run inside the approval's
/// resume) whose host crashes at any point: each write lands once, twice
/// only when the crash falls between the tool's run and the record of its
/// results, and the run ends as an uninterrupted one does.
#[test]
fn an_approved_tool_call_is_not_repeated_once_its_results_are_recorded() {
    both(|| Scenario {
        name: "tools",
        roots: &["crash-tools"],
        concurrent: false,
        llm: None,
        tool_log: true,
    });
}

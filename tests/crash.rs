//! The crash harness: a run of each scenario is aborted at every persistence
//! point (before the write, after it, and, for the non-atomic JSON store, in
//! the middle of a commit), a new host restarts on the same store and drives
//! it, and the harness checks: the same terminal output as an uninterrupted
//! run, the terminal ledger record exactly once, one child per explicit id,
//! and an intact ledger hash chain.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use stepwell::{JsonFileStore, RunQuery, SqliteStore, Store};

fn host() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("crash-host");
    assert!(bin.is_file(), "{} not built", bin.display());
    bin
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sqlite,
    Json,
}

fn spec(kind: Kind, dir: &std::path::Path) -> String {
    match kind {
        Kind::Sqlite => format!("sqlite:{}", dir.join("db.sqlite").display()),
        Kind::Json => format!("json:{}", dir.join("store").display()),
    }
}

fn open(kind: Kind, dir: &std::path::Path) -> Box<dyn Store> {
    match kind {
        Kind::Sqlite => Box::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
        Kind::Json => Box::new(JsonFileStore::open(dir.join("store")).unwrap()),
    }
}

/// Runs the host; returns its stdout when it completed, None when it crashed.
fn run(
    kind: Kind,
    dir: &std::path::Path,
    scenario: &str,
    crash: Option<(usize, &str)>,
) -> Option<Value> {
    let mut cmd = Command::new(host());
    cmd.arg(spec(kind, dir)).arg(scenario);
    if let Some((n, phase)) = crash {
        cmd.arg(n.to_string()).arg(phase);
    }
    let out = cmd.output().unwrap();
    if out.status.success() {
        Some(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        assert!(
            crash.is_some(),
            "an uninterrupted host failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        None
    }
}

/// What must be the same after any crash and recovery, for every root run.
fn outcome(kind: Kind, dir: &std::path::Path, roots: &[&str]) -> Value {
    Value::Array(roots.iter().map(|r| outcome_of(kind, dir, r)).collect())
}

fn outcome_of(kind: Kind, dir: &std::path::Path, root: &str) -> Value {
    let store = open(kind, dir);
    let run = store.load_run(root).unwrap().expect("the root run exists");
    let mut children = Vec::new();
    let mut terminal_records = Vec::new();
    let mut resumes = Vec::new();
    let mut ids = vec![root.to_string()];
    ids.extend(
        store
            .list_runs(&RunQuery {
                parent_run_id: Some(root.into()),
                ..RunQuery::default()
            })
            .unwrap()
            .into_iter()
            .map(|c| {
                children.push(c.run_id.clone());
                c.run_id
            }),
    );
    for id in &ids {
        let ledger = store.list_records(id).unwrap();
        stepwell::store::verify_chain(&ledger)
            .unwrap_or_else(|b| panic!("{id}: chain broken: {b:?}"));
        let ends = stepwell_tests::count_results(&ledger, "complete_output");
        terminal_records.push(ends);
        resumes.push(stepwell_tests::count_results(&ledger, "resumed"));
    }
    serde_json::json!({
        "status": run.status.as_str(),
        "output": without_times(run.output.clone().unwrap_or_default()),
        "children": children,
        "terminal_records": terminal_records,
        "resumes": resumes,
    })
}

/// `value` less the fields that hold the time something happened.
fn without_times(value: Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| !k.ends_with("_at"))
                .map(|(k, v)| (k, without_times(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(without_times).collect()),
        other => other,
    }
}

fn harness(kind: Kind, scenario: &str, roots: &[&str], phases: &[&str]) {
    let clean = tempfile::tempdir().unwrap();
    let points = run(kind, clean.path(), scenario, None).unwrap()["points"]
        .as_u64()
        .unwrap() as usize;
    let expected = outcome(kind, clean.path(), roots);
    for o in expected.as_array().unwrap() {
        assert_eq!(o["status"], "completed", "{expected}");
        assert!(
            o["terminal_records"]
                .as_array()
                .unwrap()
                .iter()
                .all(|n| n == 1),
            "{expected}"
        );
    }
    assert!(points >= 3, "{scenario}: only {points} persistence points");
    let mut crashed = 0;
    for n in 1..=points {
        for phase in phases {
            let dir = tempfile::tempdir().unwrap();
            if run(kind, dir.path(), scenario, Some((n, phase))).is_none() {
                crashed += 1;
            }
            run(kind, dir.path(), scenario, None).expect("recovery completes");
            let got = outcome(kind, dir.path(), roots);
            assert_eq!(
                got, expected,
                "{kind:?} {scenario}: crash at point {n} ({phase})"
            );
        }
    }
    assert!(
        crashed >= points,
        "{kind:?} {scenario}: the faults fired ({crashed} crashes)"
    );
}

#[test]
fn chain_survives_a_crash_at_every_point() {
    harness(
        Kind::Sqlite,
        "chain",
        &["crash-chain"],
        &["before", "after"],
    );
    harness(
        Kind::Json,
        "chain",
        &["crash-chain"],
        &["before", "after", "mid"],
    );
}

#[test]
fn ask_user_survives_a_crash_at_every_point() {
    harness(Kind::Sqlite, "ask", &["crash-ask"], &["before", "after"]);
    harness(
        Kind::Json,
        "ask",
        &["crash-ask"],
        &["before", "after", "mid"],
    );
}

#[test]
fn a_subworkflow_with_an_explicit_child_id_gets_exactly_one_child() {
    harness(
        Kind::Sqlite,
        "subworkflow",
        &["crash-sub"],
        &["before", "after"],
    );
    harness(
        Kind::Json,
        "subworkflow",
        &["crash-sub"],
        &["before", "after", "mid"],
    );
}

#[test]
fn an_event_is_delivered_once_and_its_result_reused_after_a_crash() {
    // The emitter's result (delivered 1) is the same after any crash: a
    // replayed emit_event reuses its recorded outcome instead of emitting
    // again, and the listener is resumed exactly once.
    harness(
        Kind::Sqlite,
        "event",
        &["crash-emitter", "crash-waiter"],
        &["before", "after"],
    );
    harness(
        Kind::Json,
        "event",
        &["crash-emitter", "crash-waiter"],
        &["before", "after", "mid"],
    );
}

//! One store contract, one conformance suite: the same calls return the same
//! answers on the memory, SQLite and JSON-file stores.

use std::sync::Arc;

use serde_json::json;
use stepwell::{
    JsonFileStore, MemoryStore, RunQuery, RunState, RunStatus, SqliteStore, StepRecord, StepStatus,
    Store, WaitReason, WaitState,
};
use stepwell_tests::{store_tests, Backend};

struct Fixture {
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    backend: Backend,
}

fn open(backend: Backend, dir: &std::path::Path) -> Arc<dyn Store> {
    match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::Sqlite => Arc::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
        Backend::Json => Arc::new(JsonFileStore::open(dir.join("store")).unwrap()),
    }
}

fn fixture(backend: Backend) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    Fixture {
        store: open(backend, dir.path()),
        dir,
        backend,
    }
}

fn run(id: &str, workflow: &str) -> RunState {
    RunState {
        run_id: id.into(),
        workflow_id: workflow.into(),
        status: RunStatus::Running,
        current_node: Some("a".into()),
        vars: serde_json::from_value(json!({"n": 1})).unwrap(),
        waiting: None,
        output: None,
        error: None,
        created_at: "2026-11-30T09:00:00.000000Z".into(),
        updated_at: "2026-11-30T09:00:00.000000Z".into(),
        actor_id: None,
        session_id: None,
        parent_run_id: None,
    }
}

fn waiting(mut r: RunState, reason: WaitReason, key: &str, until: Option<&str>) -> RunState {
    r.status = RunStatus::Waiting;
    r.waiting = Some(WaitState {
        reason,
        wait_key: key.into(),
        until: until.map(str::to_string),
        resume_to_node: Some("b".into()),
        result_key: Some("r".into()),
        prompt: None,
        choices: None,
        details: None,
    });
    r
}

fn record(run_id: &str, n: u32, key: Option<&str>) -> StepRecord {
    StepRecord {
        step_id: format!("{run_id}-step-{n}"),
        run_id: run_id.into(),
        node_id: Some(format!("n{n}")),
        status: StepStatus::Completed,
        effect: None,
        result: Some(json!({"n": n})),
        error: None,
        started_at: "2026-11-30T09:00:00.000000Z".into(),
        ended_at: None,
        attempt: 1,
        idempotency_key: key.map(str::to_string),
        prev_hash: None,
        record_hash: None,
    }
}

fn ids(runs: Vec<RunState>) -> Vec<String> {
    runs.into_iter().map(|r| r.run_id).collect()
}

fn runs_load_and_save(b: Backend) {
    let f = fixture(b);
    assert_eq!(f.store.load_run("r1").unwrap(), None);
    let mut r = run("r1", "wf");
    f.store.save_run(&r).unwrap();
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r.clone()));
    r.status = RunStatus::Completed;
    r.output = Some(json!({"ok": true}));
    r.current_node = None;
    f.store.save_run(&r).unwrap();
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r));
    assert_eq!(
        ids(f.store.list_runs(&RunQuery::default()).unwrap()),
        ["r1"]
    );
}

fn create_if_absent_never_overwrites(b: Backend) {
    let f = fixture(b);
    let first = run("r1", "wf");
    let (stored, created) = f.store.create_if_absent(&first).unwrap();
    assert!(created);
    assert_eq!(stored, first);
    let mut other = run("r1", "another");
    other.vars.insert("n".into(), json!(2));
    let (stored, created) = f.store.create_if_absent(&other).unwrap();
    assert!(!created);
    assert_eq!(stored, first, "the existing run is returned untouched");
    assert_eq!(f.store.load_run("r1").unwrap(), Some(first));
}

fn list_runs_filters_orders_and_limits(b: Backend) {
    let f = fixture(b);
    let mut child = run("c", "wf.child");
    child.parent_run_id = Some("a".into());
    let all = [
        run("a", "wf"),
        waiting(run("b", "wf"), WaitReason::User, "ask:1", None),
        child,
        waiting(run("d", "other"), WaitReason::Event, "order.paid", None),
        waiting(run("e", "wf"), WaitReason::Event, "other.key", None),
    ];
    for r in &all {
        f.store.create_if_absent(r).unwrap();
    }
    // An update keeps the creation order.
    let mut a = all[0].clone();
    a.status = RunStatus::Completed;
    f.store.save_run(&a).unwrap();
    let q = |q: RunQuery| ids(f.store.list_runs(&q).unwrap());
    assert_eq!(q(RunQuery::default()), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Waiting),
            ..Default::default()
        }),
        ["b", "d", "e"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Completed),
            ..Default::default()
        }),
        ["a"]
    );
    assert_eq!(
        q(RunQuery {
            wait_reason: Some(WaitReason::Event),
            ..Default::default()
        }),
        ["d", "e"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Waiting),
            wait_reason: Some(WaitReason::Event),
            wait_key: Some("order.paid".into()),
            ..Default::default()
        }),
        ["d"]
    );
    assert_eq!(
        q(RunQuery {
            workflow_id: Some("wf".into()),
            ..Default::default()
        }),
        ["a", "b", "e"]
    );
    assert_eq!(
        q(RunQuery {
            parent_run_id: Some("a".into()),
            ..Default::default()
        }),
        ["c"]
    );
    assert_eq!(
        q(RunQuery {
            limit: Some(2),
            ..Default::default()
        }),
        ["a", "b"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Cancelled),
            ..Default::default()
        }),
        Vec::<String>::new()
    );
}

fn due_waits_include_deadline_carrying_event_waits(b: Backend) {
    let f = fixture(b);
    let runs = [
        waiting(
            run("late-until", "wf"),
            WaitReason::Until,
            "until:x",
            Some("2026-11-30T10:00:00.000000Z"),
        ),
        waiting(
            run("early-until", "wf"),
            WaitReason::Until,
            "until:y",
            Some("2026-11-30T08:00:00.000000Z"),
        ),
        waiting(
            run("event-deadline", "wf"),
            WaitReason::Event,
            "k",
            Some("2026-11-30T09:00:00.000000Z"),
        ),
        waiting(run("event-open", "wf"), WaitReason::Event, "k", None),
        waiting(run("user", "wf"), WaitReason::User, "ask", None),
        waiting(
            run("future", "wf"),
            WaitReason::Until,
            "until:z",
            Some("2026-12-01T00:00:00.000000Z"),
        ),
    ];
    for r in &runs {
        f.store.create_if_absent(r).unwrap();
    }
    let now = chrono::DateTime::parse_from_rfc3339("2026-11-30T10:00:00Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    assert_eq!(
        ids(f.store.list_due_waits(now).unwrap()),
        ["early-until", "event-deadline", "late-until"]
    );
    // A run that stopped waiting is no longer due.
    let mut moved = runs[1].clone();
    moved.status = RunStatus::Running;
    moved.waiting = None;
    f.store.save_run(&moved).unwrap();
    assert_eq!(
        ids(f.store.list_due_waits(now).unwrap()),
        ["event-deadline", "late-until"]
    );
}

fn ledgers_append_in_order_per_run(b: Backend) {
    let f = fixture(b);
    f.store
        .append_records(&[
            record("r1", 1, None),
            record("r2", 1, None),
            record("r1", 2, None),
        ])
        .unwrap();
    f.store
        .append_records(&[record("r1", 3, Some("r1:1"))])
        .unwrap();
    let steps = |id: &str| -> Vec<String> {
        f.store
            .list_records(id)
            .unwrap()
            .into_iter()
            .map(|r| r.step_id)
            .collect()
    };
    assert_eq!(steps("r1"), ["r1-step-1", "r1-step-2", "r1-step-3"]);
    assert_eq!(steps("r2"), ["r2-step-1"]);
    assert!(steps("nobody").is_empty());
    let stored = f.store.list_records("r1").unwrap();
    let mut plain = stored[2].clone();
    (plain.prev_hash, plain.record_hash) = (None, None);
    assert_eq!(plain, record("r1", 3, Some("r1:1")));
    // The store chained them: each record names the one before it.
    assert_eq!(stored[0].prev_hash, None);
    assert_eq!(stored[1].prev_hash, stored[0].record_hash);
    assert_eq!(stored[2].prev_hash, stored[1].record_hash);
    assert!(stepwell::store::verify_chain(&stored).is_ok());
}

fn commit_saves_both_and_replays_land_once(b: Backend) {
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    r.current_node = Some("b".into());
    let records = [record("r1", 1, None), record("r1", 2, Some("r1:terminal"))];
    f.store.commit(&records, &r).unwrap();
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r.clone()));
    assert_eq!(f.store.list_records("r1").unwrap().len(), 2);
    // A transition replayed after a crash: keyed records are not appended
    // twice by a non-atomic backend; an atomic one never gets here twice,
    // but must accept a fresh transition.
    f.store
        .commit(&[record("r1", 3, Some("r1:1"))], &r)
        .unwrap();
    assert_eq!(f.store.list_records("r1").unwrap().len(), 3);
}

fn bundles_are_recorded(b: Backend) {
    let f = fixture(b);
    assert_eq!(f.store.bundle_dir("wf").unwrap(), None);
    f.store.put_bundle("wf", "/a/b".as_ref()).unwrap();
    f.store.put_bundle("wf", "/c/d".as_ref()).unwrap();
    f.store.put_bundle("other", "/e".as_ref()).unwrap();
    assert_eq!(f.store.bundle_dir("wf").unwrap(), Some("/c/d".into()));
}

fn a_reopened_store_has_everything(b: Backend) {
    let f = fixture(b);
    if f.backend == Backend::Memory {
        return; // nothing survives by design
    }
    f.store
        .create_if_absent(&waiting(run("r1", "wf"), WaitReason::User, "k", None))
        .unwrap();
    f.store.append_records(&[record("r1", 1, None)]).unwrap();
    f.store.put_bundle("wf", "/x".as_ref()).unwrap();
    let again = open(f.backend, f.dir.path());
    assert_eq!(
        again.load_run("r1").unwrap(),
        f.store.load_run("r1").unwrap()
    );
    assert_eq!(again.list_records("r1").unwrap().len(), 1);
    assert_eq!(again.bundle_dir("wf").unwrap(), Some("/x".into()));
    // Two objects on one store see each other's new runs.
    again.create_if_absent(&run("r2", "wf")).unwrap();
    assert_eq!(
        ids(f.store.list_runs(&RunQuery::default()).unwrap()),
        ["r1", "r2"]
    );
}

store_tests!(
    runs_load_and_save,
    create_if_absent_never_overwrites,
    list_runs_filters_orders_and_limits,
    due_waits_include_deadline_carrying_event_waits,
    ledgers_append_in_order_per_run,
    commit_saves_both_and_replays_land_once,
    bundles_are_recorded,
    a_reopened_store_has_everything,
);

#[test]
fn json_files_are_named_per_run_and_crash_leftovers_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    store.create_if_absent(&run("r1", "wf")).unwrap();
    store.append_records(&[record("r1", 1, None)]).unwrap();
    assert!(path.join("run_r1.json").is_file());
    assert!(path.join("ledger_r1.jsonl").is_file());
    std::fs::write(path.join(".tmp-999-1"), b"half a run").unwrap();
    drop(store);
    JsonFileStore::open(&path).unwrap();
    assert!(
        !path.join(".tmp-999-1").exists(),
        "temp files are removed at open"
    );
}

#[test]
fn corrupt_json_files_are_reported_with_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    for id in ["good", "bad"] {
        store.create_if_absent(&run(id, "wf")).unwrap();
        store
            .append_records(&[record(id, 1, None), record(id, 2, None)])
            .unwrap();
    }
    std::fs::write(path.join("run_bad.json"), b"{not json").unwrap();
    let ledger = path.join("ledger_bad.jsonl");
    let text = std::fs::read_to_string(&ledger).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(&ledger, format!("{first}\n{{broken line\n")).unwrap();

    let err = store.load_run("bad").unwrap_err();
    assert_eq!(err.code, "store_corrupt");
    assert!(err.message.contains("run_bad.json"), "{err}");
    let err = store.list_records("bad").unwrap_err();
    assert!(
        err.message.contains("ledger_bad.jsonl:2"),
        "names the line: {err}"
    );
    // The rest of the store stays readable.
    assert!(store.load_run("good").unwrap().is_some());
    assert_eq!(store.list_records("good").unwrap().len(), 2);
}

#[test]
fn a_json_store_from_a_newer_format_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    std::fs::create_dir_all(&path).unwrap();
    let meta = r#"{"format": "stepwell.json-files", "version": 7}"#;
    std::fs::write(path.join("stepwell-store.json"), meta).unwrap();
    let err = JsonFileStore::open(&path).unwrap_err();
    assert_eq!(err.code, "store_schema");
    assert_eq!(
        std::fs::read_to_string(path.join("stepwell-store.json")).unwrap(),
        meta
    );
}

fn the_ledger_chain_reports_the_first_tampered_record(b: Backend) {
    let f = fixture(b);
    let batch: Vec<_> = (1..=5).map(|n| record("r1", n, None)).collect();
    f.store.append_records(&batch[..2]).unwrap();
    f.store.append_records(&batch[2..]).unwrap();
    let good = f.store.list_records("r1").unwrap();
    let head = stepwell::store::verify_chain(&good).unwrap();
    assert_eq!(head, good[4].record_hash);

    let mut changed = good.clone();
    changed[2].result = Some(json!({"n": 999}));
    let b3 = stepwell::store::verify_chain(&changed).unwrap_err();
    assert_eq!((b3.index, b3.problem), (3, "changed"));

    let mut removed = good.clone();
    removed.remove(1);
    let b2 = stepwell::store::verify_chain(&removed).unwrap_err();
    assert_eq!(
        (b2.index, b2.problem, b2.step_id.as_str()),
        (2, "removed or reordered", "r1-step-3")
    );

    let mut reordered = good.clone();
    reordered.swap(3, 4);
    let b4 = stepwell::store::verify_chain(&reordered).unwrap_err();
    assert_eq!((b4.index, b4.problem), (4, "removed or reordered"));
}

mod chain {
    use super::*;
    #[test]
    fn memory() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Memory)
    }
    #[test]
    fn sqlite() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Sqlite)
    }
    #[test]
    fn json() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Json)
    }
}

fn inbox(b: Backend, dir: &std::path::Path) -> Arc<dyn stepwell::CommandStore> {
    match b {
        Backend::Memory => Arc::new(stepwell::MemoryCommandStore::new()),
        Backend::Sqlite => Arc::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
        Backend::Json => Arc::new(stepwell::JsonlCommandStore::open(dir.join("inbox")).unwrap()),
    }
}

fn command(id: &str, kind: &str) -> stepwell::CommandRecord {
    stepwell::CommandRecord {
        command_id: id.into(),
        seq: 0,
        kind: kind.into(),
        target: Some("auto-1".into()),
        payload: json!({"why": kind}),
        created_at: "2026-11-30T09:00:00Z".into(),
    }
}

fn the_command_inbox_is_idempotent_and_ordered(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let inbox = inbox(b, dir.path());
    let a = inbox.append_command(&command("c1", "pause")).unwrap();
    assert_eq!((a.accepted, a.duplicate, a.seq), (true, false, 1));
    let b2 = inbox.append_command(&command("c2", "run_now")).unwrap();
    assert_eq!(b2.seq, 2);
    // A retried append is recognised, never applied twice.
    let again = inbox.append_command(&command("c1", "pause")).unwrap();
    assert_eq!(
        (again.accepted, again.duplicate, again.seq),
        (false, true, 1)
    );
    let all = inbox.commands_after(0, 10).unwrap();
    assert_eq!(
        all.iter()
            .map(|c| (c.command_id.as_str(), c.seq))
            .collect::<Vec<_>>(),
        [("c1", 1), ("c2", 2)]
    );
    assert_eq!(all[1].payload, json!({"why": "run_now"}));
    assert_eq!(inbox.commands_after(1, 10).unwrap().len(), 1);
    assert_eq!(inbox.commands_after(0, 1).unwrap().len(), 1);
    assert_eq!(inbox.find_command("c2").unwrap().unwrap().kind, "run_now");
    assert_eq!(inbox.find_command("nope").unwrap(), None);
    assert_eq!(inbox.cursor("worker").unwrap(), 0);
    inbox.set_cursor("worker", 1).unwrap();
    assert_eq!(inbox.cursor("worker").unwrap(), 1);
    assert_eq!(inbox.cursor("other").unwrap(), 0);
    if b != Backend::Memory {
        drop(inbox);
        let reopened = inbox_reopen(b, dir.path());
        assert_eq!(reopened.cursor("worker").unwrap(), 1);
        assert_eq!(
            reopened
                .append_command(&command("c2", "run_now"))
                .unwrap()
                .seq,
            2
        );
        assert_eq!(
            reopened
                .append_command(&command("c3", "resume"))
                .unwrap()
                .seq,
            3
        );
    }
}

fn inbox_reopen(b: Backend, dir: &std::path::Path) -> Arc<dyn stepwell::CommandStore> {
    inbox(b, dir)
}

fn concurrent_retries_are_accepted_once(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let inbox = inbox(b, dir.path());
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let inbox = inbox.clone();
            std::thread::spawn(move || inbox.append_command(&command("same", "pause")).unwrap())
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.accepted).count(), 1);
    assert!(results.iter().all(|r| r.seq == 1));
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 1);
}

mod commands {
    use super::*;
    store_tests!(
        the_command_inbox_is_idempotent_and_ordered,
        concurrent_retries_are_accepted_once
    );
}

fn attributed(id: &str, parent: Option<&str>, meta: serde_json::Value) -> RunState {
    let mut r = run(id, "wf");
    r.parent_run_id = parent.map(str::to_string);
    r.vars.insert("_meta".into(), meta);
    r
}

fn the_run_index_carries_attribution_and_filters(b: Backend) {
    let f = fixture(b);
    let mut plain = run("plain", "wf");
    plain.session_id = Some("s1".into());
    plain
        .vars
        .insert("workspace_root".into(), json!("  /work/x  "));
    let runs = [
        plain,
        attributed(
            "ctl",
            None,
            json!({"automation": {"automation_id": "a1", "role": "controller"}}),
        ),
        attributed(
            "occ-0",
            Some("ctl"),
            json!({"automation": {"automation_id": "a1", "role": "occurrence", "occurrence_index": 0}, "session_kind": "automation"}),
        ),
        attributed(
            "occ-1",
            Some("ctl"),
            json!({"automation": {"automation_id": "a1", "role": "occurrence", "occurrence_index": 1}, "session_kind": "automation"}),
        ),
        attributed(
            "disc",
            None,
            json!({"automation": {"automation_id": "a2", "role": "discussion"}, "session_kind": "discussion"}),
        ),
        run("tool-child", "wf"),
    ];
    for mut r in runs {
        if r.run_id == "tool-child" {
            r.parent_run_id = Some("occ-0".into());
        }
        f.store.create_if_absent(&r).unwrap();
    }
    let q = |q: stepwell::RunIndexQuery| -> Vec<String> {
        f.store
            .list_run_index(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    use stepwell::RunIndexQuery as Q;
    assert_eq!(
        q(Q {
            oldest_first: true,
            ..Q::default()
        }),
        ["plain", "ctl", "occ-0", "occ-1", "disc", "tool-child"]
    );
    assert_eq!(q(Q::default())[0], "tool-child", "newest first by default");
    assert_eq!(
        q(Q {
            root_only: true,
            oldest_first: true,
            ..Q::default()
        }),
        ["plain", "occ-0", "occ-1", "disc"]
    );
    assert_eq!(
        q(Q {
            automation_id: vec!["a1".into()],
            oldest_first: true,
            ..Q::default()
        }),
        ["ctl", "occ-0", "occ-1"]
    );
    assert_eq!(
        q(Q {
            automation_id: stepwell::store::filter_values("a1, a2"),
            role: vec!["occurrence".into(), "discussion".into()],
            oldest_first: true,
            ..Q::default()
        }),
        ["occ-0", "occ-1", "disc"]
    );
    assert_eq!(
        q(Q {
            session_kind: vec!["discussion".into()],
            ..Q::default()
        }),
        ["disc"]
    );
    assert_eq!(
        q(Q {
            session_id: Some("s1".into()),
            ..Q::default()
        }),
        ["plain"]
    );
    assert_eq!(
        q(Q {
            root_only: true,
            limit: Some(2),
            ..Q::default()
        }),
        ["disc", "occ-1"]
    );
    let rows = f
        .store
        .list_run_index(&Q {
            oldest_first: true,
            ..Q::default()
        })
        .unwrap();
    assert_eq!(rows[0].workspace_root.as_deref(), Some("/work/x"));
    assert_eq!(rows[3].occurrence_index, Some(1));
    assert_eq!(rows[3].role.as_deref(), Some("occurrence"));
    assert_eq!(rows[1].automation_id.as_deref(), Some("a1"));
    assert_eq!(rows[5].automation_id, None);
}

fn ledger_records_are_found_by_idempotency_key(b: Backend) {
    let f = fixture(b);
    f.store
        .append_records(&[
            record("r1", 1, Some("r1:1")),
            record("r1", 2, None),
            record("r1", 3, Some("r1:1")),
            record("r1", 4, Some("r1:2")),
        ])
        .unwrap();
    let found: Vec<_> = f
        .store
        .find_records("r1", "r1:1")
        .unwrap()
        .into_iter()
        .map(|r| r.step_id)
        .collect();
    assert_eq!(found, ["r1-step-1", "r1-step-3"]);
    assert!(f.store.find_records("r1", "r1:9").unwrap().is_empty());
    assert!(f.store.find_records("nobody", "r1:1").unwrap().is_empty());
}

mod index {
    use super::*;
    store_tests!(
        the_run_index_carries_attribution_and_filters,
        ledger_records_are_found_by_idempotency_key
    );
}

fn snapshot(
    id: &str,
    run_id: &str,
    name: &str,
    tags: &[&str],
    at: &str,
) -> stepwell::store::Snapshot {
    stepwell::store::Snapshot {
        snapshot_id: id.into(),
        run_id: run_id.into(),
        step_id: None,
        name: name.into(),
        description: format!("{name} description"),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        created_at: at.into(),
        run_state: run(run_id, "wf"),
    }
}

fn snapshot_stores_search_by_run_tag_and_text(json_files: bool) {
    use stepwell::store::{SnapshotQuery as Q, SnapshotStore};
    let dir = tempfile::tempdir().unwrap();
    let store: Box<dyn SnapshotStore> = if json_files {
        Box::new(stepwell::store::JsonSnapshotStore::open(dir.path().join("snaps")).unwrap())
    } else {
        Box::new(stepwell::store::MemorySnapshotStore::new())
    };
    store
        .save_snapshot(&snapshot(
            "s1",
            "r1",
            "Before deploy",
            &["prod"],
            "2026-11-30T09:00:00Z",
        ))
        .unwrap();
    store
        .save_snapshot(&snapshot(
            "s2",
            "r1",
            "after",
            &["prod", "ok"],
            "2026-11-30T10:00:00Z",
        ))
        .unwrap();
    store
        .save_snapshot(&snapshot(
            "s3",
            "r2",
            "other run",
            &[],
            "2026-11-30T11:00:00Z",
        ))
        .unwrap();
    let ids = |q: Q| -> Vec<String> {
        store
            .search_snapshots(&q)
            .unwrap()
            .into_iter()
            .map(|s| s.snapshot_id)
            .collect()
    };
    assert_eq!(ids(Q::default()), ["s3", "s2", "s1"], "newest first");
    assert_eq!(
        ids(Q {
            run_id: Some("r1".into()),
            ..Q::default()
        }),
        ["s2", "s1"]
    );
    assert_eq!(
        ids(Q {
            tag: Some("ok".into()),
            ..Q::default()
        }),
        ["s2"]
    );
    assert_eq!(
        ids(Q {
            text: Some("DEPLOY".into()),
            ..Q::default()
        }),
        ["s1"]
    );
    assert_eq!(
        ids(Q {
            text: Some("description".into()),
            limit: Some(2),
            ..Q::default()
        }),
        ["s3", "s2"]
    );
    assert_eq!(store.load_snapshot("s2").unwrap().unwrap().name, "after");
    assert!(store.delete_snapshot("s2").unwrap());
    assert!(!store.delete_snapshot("s2").unwrap());
    assert_eq!(store.load_snapshot("s2").unwrap(), None);
    assert_eq!(store.load_snapshot("../etc/passwd").unwrap(), None);
}

#[test]
fn memory_snapshots_search() {
    snapshot_stores_search_by_run_tag_and_text(false);
}

#[test]
fn json_snapshots_search() {
    snapshot_stores_search_by_run_tag_and_text(true);
}

fn artifact_store_is_content_addressed(files: bool) {
    use stepwell::ArtifactStore;
    let dir = tempfile::tempdir().unwrap();
    let store: Box<dyn ArtifactStore> = if files {
        Box::new(stepwell::FileArtifactStore::open(dir.path().join("artifacts")).unwrap())
    } else {
        Box::new(stepwell::MemoryArtifactStore::new())
    };
    let a = store
        .put(
            b"{\"big\":true}",
            "application/json",
            Some("r1"),
            "2026-11-30T09:00:00Z",
        )
        .unwrap();
    let again = store
        .put(
            b"{\"big\":true}",
            "application/json",
            Some("r2"),
            "2026-11-30T10:00:00Z",
        )
        .unwrap();
    assert_eq!(
        a, again,
        "the same content is stored once, with its first metadata"
    );
    assert_eq!(
        a.artifact_id,
        stepwell::store::artifacts::artifact_id(b"{\"big\":true}")
    );
    assert_eq!((a.size, a.run_id.as_deref()), (12, Some("r1")));
    assert_eq!(
        store.get(&a.artifact_id).unwrap().unwrap(),
        b"{\"big\":true}"
    );
    assert_eq!(store.meta(&a.artifact_id).unwrap().unwrap(), a);
    let other = store
        .put(b"other", "text/plain", None, "2026-11-30T09:00:00Z")
        .unwrap();
    assert_ne!(other.artifact_id, a.artifact_id);
    assert_eq!(store.get(&"0".repeat(64)).unwrap(), None);
    assert_eq!(store.get("../../etc/passwd").unwrap(), None);
    if files {
        let shard = dir.path().join("artifacts").join(&a.artifact_id[..2]);
        let names: Vec<_> = std::fs::read_dir(&shard)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "content and metadata: {names:?}");
    }
}

#[test]
fn memory_artifacts() {
    artifact_store_is_content_addressed(false);
}

#[test]
fn file_artifacts() {
    artifact_store_is_content_addressed(true);
}

#[test]
fn a_torn_last_command_line_is_dropped_not_fatal() {
    use stepwell::CommandStore;
    let dir = tempfile::tempdir().unwrap();
    let inbox = stepwell::JsonlCommandStore::open(dir.path()).unwrap();
    inbox.append_command(&command("c1", "pause")).unwrap();
    let file = dir.path().join("commands.jsonl");
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("{\"command_id\":\"c2\",\"se");
    std::fs::write(&file, text).unwrap();
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 1);
    let r = inbox.append_command(&command("c2", "resume")).unwrap();
    assert_eq!((r.accepted, r.seq), (true, 2));
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 2);
}

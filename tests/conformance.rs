//! One store contract, one conformance suite: the suite the runtime exports
//! (`stepwell::store::conformance`, the `conformance` feature) on the
//! memory, SQLite, JSON-file and PostgreSQL stores, one module each; then
//! what only some of them promise: their files, and processes that share
//! one store.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use stepwell::store::conformance::fixtures::{command, event, fence, record, run, save};
use stepwell::store::conformance::Harness;
use stepwell::store::{JsonSnapshotStore, MemorySnapshotStore, SnapshotStore};
use stepwell::{
    ArtifactStore, Claim, CommandStore, Fence, FileArtifactStore, JsonFileStore, JsonlCommandStore,
    LeaseAfter, LeaseRequest, MemoryArtifactStore, MemoryCommandStore, RunStatus, SqliteStore,
    Store,
};
use stepwell_tests::Backend;

/// A built-in store, as the suite opens it: the store of
/// `stepwell_tests::open_store`, with the command inbox, snapshot store and
/// artifact store that go with it.
struct BuiltIn(Backend);

impl Harness for BuiltIn {
    fn name(&self) -> &str {
        match self.0 {
            Backend::Memory => "the memory store",
            Backend::Sqlite => "the SQLite store",
            Backend::Json => "the JSON-file store",
            Backend::Postgres => "the PostgreSQL store",
        }
    }

    fn open(&self, dir: &Path) -> Arc<dyn Store> {
        open(self.0, dir)
    }

    fn reopens(&self) -> bool {
        self.0 != Backend::Memory
    }

    fn commands(&self, dir: &Path) -> Option<Arc<dyn CommandStore>> {
        Some(match self.0 {
            Backend::Memory => Arc::new(MemoryCommandStore::new()),
            Backend::Sqlite => Arc::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
            Backend::Json => Arc::new(JsonlCommandStore::open(dir.join("inbox")).unwrap()),
            Backend::Postgres => Arc::new(stepwell_tests::open_postgres(dir)),
        })
    }

    fn snapshots(&self, dir: &Path) -> Option<Arc<dyn SnapshotStore>> {
        match self.0 {
            Backend::Memory => Some(Arc::new(MemorySnapshotStore::new())),
            // The CLI keeps a SQLite store's snapshots in JSON files.
            Backend::Sqlite => None,
            Backend::Json => Some(Arc::new(
                JsonSnapshotStore::open(dir.join("snaps")).unwrap(),
            )),
            Backend::Postgres => Some(Arc::new(stepwell_tests::open_postgres(dir))),
        }
    }

    fn artifacts(&self, dir: &Path) -> Option<Arc<dyn ArtifactStore>> {
        match self.0 {
            Backend::Memory => Some(Arc::new(MemoryArtifactStore::new())),
            // The CLI keeps a SQLite store's artifacts in files.
            Backend::Sqlite => None,
            Backend::Json => Some(Arc::new(
                FileArtifactStore::open(dir.join("artifacts")).unwrap(),
            )),
            Backend::Postgres => Some(Arc::new(stepwell_tests::open_postgres(dir))),
        }
    }

    fn skip(&self) -> Option<String> {
        (self.0 == Backend::Postgres && stepwell_tests::postgres_skipped())
            .then(|| format!("{} is unset", stepwell_tests::POSTGRES_URL_ENV))
    }
}

fn open(backend: Backend, dir: &Path) -> Arc<dyn Store> {
    stepwell_tests::open_store(backend, dir)
}

mod memory {
    stepwell::store_conformance!(super::BuiltIn(stepwell_tests::Backend::Memory));
}

mod sqlite {
    stepwell::store_conformance!(super::BuiltIn(stepwell_tests::Backend::Sqlite));
}

mod json {
    stepwell::store_conformance!(super::BuiltIn(stepwell_tests::Backend::Json));
}

mod postgres {
    stepwell::store_conformance!(super::BuiltIn(stepwell_tests::Backend::Postgres));
}

/// A process without the automations (a kernel-only embedder) that saves
/// an attributed run, on a store the hosts with them share, keeps the run's
/// attribution: the columns are the indexer's, and that process has none.
fn a_save_without_an_indexer_keeps_the_attribution(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let full = stepwell_tests::open_store(b, dir.path());
    full.set_indexer(Arc::new(stepwell::automation::AutomationIndex))
        .unwrap();
    let bare = stepwell_tests::open_store(b, dir.path());
    let mut occurrence = run("occ", "wf");
    occurrence.vars.insert(
        "_meta".into(),
        json!({"occurrence": {"automation_id": "a1", "occurrence_index": 1}}),
    );
    full.create_if_absent(&occurrence).unwrap();
    let mut moved = bare.load_run("occ").unwrap().unwrap();
    moved.status = RunStatus::Completed;
    save(&*bare, &[], &mut moved, 1);
    let rows = full
        .list_run_index(&stepwell::RunIndexQuery {
            automation_id: Some(vec!["a1".into()]),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].status, RunStatus::Completed);
    assert_eq!(rows[0].role.as_deref(), Some("occurrence"));
    assert_eq!(rows[0].session_kind.as_deref(), Some("occurrence"));
}

#[test]
fn a_save_without_an_indexer_keeps_the_attribution_on_sqlite() {
    a_save_without_an_indexer_keeps_the_attribution(Backend::Sqlite);
}

#[test]
fn a_save_without_an_indexer_keeps_the_attribution_on_postgres() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    a_save_without_an_indexer_keeps_the_attribution(Backend::Postgres);
}

/// A file artifact store keeps an artifact's content and its metadata in
/// the shard of its id's first two hex digits.
#[test]
fn file_artifacts_keep_content_and_metadata_in_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileArtifactStore::open(dir.path().join("artifacts")).unwrap();
    let meta = store
        .put(b"x", "text/plain", None, "2026-11-30T09:00:00Z")
        .unwrap();
    let shard = dir.path().join("artifacts").join(&meta.artifact_id[..2]);
    let names: Vec<_> = std::fs::read_dir(&shard)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "content and metadata: {names:?}");
}

#[test]
fn json_files_are_named_per_run_and_crash_leftovers_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    store.create_if_absent(&run("r1", "wf")).unwrap();
    store.append_records(&[record("r1", 1, None)]).unwrap();
    assert!(path.join("run_r1.json").is_file());
    assert!(path.join("ledger_r1.jsonl").is_file());
    std::fs::write(path.join(".tmp-2147483647-1"), b"half a run").unwrap();
    drop(store);
    JsonFileStore::open(&path).unwrap();
    assert!(
        !path.join(".tmp-2147483647-1").exists(),
        "temp files are removed at open"
    );
}

/// A JSON store whose writes panic at the named point once armed (and
/// only once), and its trigger.
fn json_store_torn_at(
    path: &std::path::Path,
    point: &'static str,
) -> (JsonFileStore, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let armed = Arc::new(AtomicBool::new(false));
    let trigger = armed.clone();
    let store = JsonFileStore::open(path)
        .unwrap()
        .with_crash_points(Arc::new(move |name| {
            if name == point && armed.swap(false, Ordering::SeqCst) {
                panic!("torn at {name}");
            }
        }));
    (store, trigger)
}

#[test]
fn a_json_commit_torn_before_its_run_file_leaves_no_trace() {
    // The commit of "Bob" dies after its ledger append, before the run file
    // is replaced: no state reflects it. Readers do not show its records,
    // and the next commit ("Eve", another turn) cuts them off: the ledger
    // holds one terminal record, the state's.
    for point in ["ledger-appended", "run-temp-written"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let (store, armed) = json_store_torn_at(&path, point);
        let mut r = run("r1", "wf");
        store.create_if_absent(&r).unwrap();
        save(&store, &[record("r1", 1, None)], &mut r, 1);
        let mut bob = record("r1", 2, Some("r1:terminal"));
        bob.result = Some(json!({"complete_output": "Hello, Bob!"}));
        let mut done = r.clone();
        done.status = RunStatus::Completed;
        done.version = 3;
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let torn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.commit(&[bob.clone()], &done, fence(2, None), LeaseAfter::Release)
        }));
        assert!(torn.is_err(), "{point}: the commit was torn");
        assert_eq!(store.load_run("r1").unwrap().unwrap().version, 2);
        assert_eq!(store.list_records("r1").unwrap().len(), 1, "{point}");
        assert!(store.list_ahead("r1").unwrap().is_empty(), "{point}");

        let mut eve = bob.clone();
        eve.step_id = "eve".into();
        eve.result = Some(json!({"complete_output": "Hello, Eve!"}));
        let again = JsonFileStore::open(&path).unwrap();
        again
            .commit(&[eve], &done, fence(2, None), LeaseAfter::Release)
            .unwrap();
        let ledger = again.list_records("r1").unwrap();
        let steps: Vec<&str> = ledger.iter().map(|x| x.step_id.as_str()).collect();
        assert_eq!(steps, ["r1-step-1", "eve"], "{point}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        let text = std::fs::read_to_string(path.join("ledger_r1.jsonl")).unwrap();
        assert!(!text.contains("Bob"), "{point}: cut off the file too");
    }
}

#[test]
fn a_json_run_file_without_a_mark_counts_its_whole_ledger() {
    // A folder written by hand (or an older stepwell): no mark in the run
    // file. Its ledger counts as committed, and the next commit appends.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    save(
        &store,
        &[record("r1", 1, None), record("r1", 2, None)],
        &mut r,
        1,
    );
    std::fs::write(path.join("run_r1.json"), serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(store.list_records("r1").unwrap().len(), 2);
    assert!(store.list_ahead("r1").unwrap().is_empty());
    save(&store, &[record("r1", 3, None)], &mut r, 2);
    let ledger = store.list_records("r1").unwrap();
    assert_eq!(ledger.len(), 3);
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
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

/// A JSON store's inbox whose last line was torn by a crash: the torn
/// event was never appended, the next one is, and every stream still reads.
#[test]
fn a_torn_json_inbox_line_is_dropped_by_the_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(Backend::Json, dir.path());
    store.append_event(&event("trigger:a", "w1", 1)).unwrap();
    let path = dir.path().join("store").join("inbox.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(
        &mut file,
        br#"{"seq":2,"stream":"trigger:a","event_id":"torn"#,
    )
    .unwrap();
    drop(file);
    assert_eq!(store.events_after("trigger:a", 0, 10).unwrap().len(), 1);
    let next = store.append_event(&event("trigger:a", "w2", 2)).unwrap();
    assert!(!next.duplicate);
    let read = store.events_after("trigger:a", 0, 10).unwrap();
    assert_eq!(
        read.iter()
            .map(|e| e.dedupe_key.as_str())
            .collect::<Vec<_>>(),
        ["w1", "w2"]
    );
    // A whole line whose newline was not written is torn too: never read,
    // dropped by the next append (no event is read and then lost).
    let text = std::fs::read_to_string(&path).unwrap();
    let line = serde_json::to_string(&stepwell::store::InboxEvent {
        seq: 3,
        ..event("trigger:a", "w3", 3)
    })
    .unwrap();
    std::fs::write(&path, format!("{text}{line}")).unwrap();
    assert_eq!(store.events_after("trigger:a", 0, 10).unwrap().len(), 2);
    let w4 = store.append_event(&event("trigger:a", "w4", 4)).unwrap();
    assert_eq!(w4.seq, 3);
    assert_eq!(store.events_after("trigger:a", 0, 10).unwrap().len(), 3);
}

#[test]
fn a_torn_last_command_line_is_dropped_not_fatal() {
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

/// The run transaction across OS processes: two `store-worker` processes
/// each add 1 to one run's counter 200 times, on one SQLite file or one
/// JSON folder. With leases no commit ever loses (the lease excludes the
/// other process); with versions alone some lose and retry. Either way no
/// update is lost and none lands twice: the counter ends at 400, the ledger
/// holds 400 records in an intact chain, and the version counts every
/// commit.
mod processes {
    use super::*;

    fn worker() -> std::path::PathBuf {
        env!("CARGO_BIN_EXE_store-worker").into()
    }

    /// Starts `n` workers with `args`, all at once (behind a file in `dir`),
    /// and returns what each printed.
    fn workers(dir: &std::path::Path, n: usize, args: &[&str]) -> Vec<serde_json::Value> {
        let go = dir.join("go");
        let children: Vec<_> = (0..n)
            .map(|_| {
                std::process::Command::new(worker())
                    .args(args)
                    .arg(&go)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::fs::write(&go, b"go").unwrap();
        children
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                serde_json::from_slice(&out.stdout).unwrap()
            })
            .collect()
    }

    /// The `--store` text of `open(backend, dir)`'s store, for a worker.
    fn spec_of(backend: Backend, dir: &std::path::Path) -> String {
        stepwell_tests::store_spec(backend, dir)
    }

    /// A disk that fills in the middle of a transaction: another process's
    /// commit of 2 MiB fails when its write-ahead-log writes (gathered by
    /// the store's file layer) meet the file size limit, and its next,
    /// small commit lands. The database is whole, holds both small commits
    /// and nothing of the big one, the chain is intact, and the file takes
    /// new commits after the limit is gone.
    #[test]
    fn sqlite_a_commit_that_meets_a_full_disk_fails_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (
            open(Backend::Sqlite, dir.path()),
            spec_of(Backend::Sqlite, dir.path()),
        );
        let r = run("filled", "wf");
        store.create_if_absent(&r).unwrap();
        let out = std::process::Command::new(worker())
            .args([spec.as_str(), "full-disk", "filled", "256"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let big = &report["big"];
        let message = big["message"].as_str().unwrap();
        // SQLite's words for a write the file system refused.
        assert!(
            big["code"] == "store_io"
                && (message.ends_with("disk I/O error")
                    || message.ends_with("database or disk is full")),
            "the big commit failed for another reason: {big}"
        );
        let ledger = store.list_records("filled").unwrap();
        let texts: Vec<&str> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["before", "after"], "nothing of the failed commit");
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        assert_eq!(store.load_run("filled").unwrap().unwrap().version, 3);
        let db = spec.strip_prefix("sqlite:").unwrap();
        let check = rusqlite::Connection::open(db).unwrap();
        let integrity: String = check
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
        // Without the limit, this process commits on the same file.
        let mut run = store.load_run("filled").unwrap().unwrap();
        run.version = 4;
        store
            .commit(&[], &run, Fence::unleased(3), LeaseAfter::Release)
            .unwrap();
        assert_eq!(store.load_run("filled").unwrap().unwrap().version, 4);
    }

    fn race(backend: Backend, mode: &str) -> Vec<serde_json::Value> {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (open(backend, dir.path()), spec_of(backend, dir.path()));
        let mut r = run("counted", "wf");
        r.vars.insert("count".into(), json!(0));
        store.create_if_absent(&r).unwrap();
        // Both start at once, behind a file.
        let reports = workers(dir.path(), 2, &[spec.as_str(), mode, "counted", "200"]);
        let done = store.load_run("counted").unwrap().unwrap();
        assert_eq!(done.vars["count"], json!(400), "no update lost or doubled");
        assert_eq!(done.version, 401);
        let ledger = store.list_records("counted").unwrap();
        assert_eq!(ledger.len(), 400);
        let counts: Vec<u64> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["count"].as_u64().unwrap())
            .collect();
        assert_eq!(
            counts,
            (1..=400).collect::<Vec<_>>(),
            "one record per commit, in order"
        );
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        // The two really overlapped: their commits interleave.
        let by: Vec<&str> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["by"].as_str().unwrap())
            .collect();
        let switches = by.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            switches >= 2,
            "the workers ran one after the other: {switches} switches"
        );
        reports
    }

    /// Four processes append the same 100 dedupe keys to one stream at
    /// once: each key is stored once, in one place of the stream.
    fn events_race(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (open(backend, dir.path()), spec_of(backend, dir.path()));
        let reports = workers(
            dir.path(),
            4,
            &[spec.as_str(), "events", "trigger:race", "100"],
        );
        let stored: u64 = reports.iter().map(|r| r["stored"].as_u64().unwrap()).sum();
        assert_eq!(stored, 100, "{reports:?}");
        let events = store.events_after("trigger:race", 0, 1000).unwrap();
        let mut keys: Vec<&str> = events.iter().map(|e| e.dedupe_key.as_str()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!((events.len(), keys.len()), (100, 100));
        assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    }

    #[test]
    fn sqlite_event_appends_from_processes_store_each_key_once() {
        events_race(Backend::Sqlite);
    }

    #[test]
    fn json_event_appends_from_processes_store_each_key_once() {
        events_race(Backend::Json);
    }

    /// A host stalled inside a transaction (paused, cut off) holds its
    /// row locks: a claim of that run answers busy at once instead of
    /// waiting behind it.
    #[test]
    fn postgres_a_claim_never_waits_behind_a_stalled_transaction() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = open(Backend::Postgres, dir.path());
        store.create_if_absent(&run("stalled", "wf")).unwrap();
        let url = stepwell_tests::store_spec(Backend::Postgres, dir.path());
        let mut stalled = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let mut tx = stalled.transaction().unwrap();
        tx.query(
            "SELECT 1 FROM runs WHERE run_id = 'stalled' FOR UPDATE",
            &[],
        )
        .unwrap();
        let t = std::time::Instant::now();
        let now = chrono::Utc::now();
        let lease = LeaseRequest {
            holder: "h2",
            now,
            until: now + chrono::Duration::seconds(30),
            dead_holder: None,
        };
        let claim = store.claim("stalled", &lease).unwrap();
        assert!(matches!(claim, Claim::Busy { .. }), "{claim:?}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(4),
            "{:?}",
            t.elapsed()
        );
        tx.rollback().unwrap();
        // Let go, the run is claimed.
        let claim = store.claim("stalled", &lease).unwrap();
        assert!(matches!(claim, Claim::Held(_)), "{claim:?}");
    }

    #[test]
    fn postgres_event_appends_from_processes_store_each_key_once() {
        if !stepwell_tests::postgres_skipped() {
            events_race(Backend::Postgres);
        }
    }

    #[test]
    fn postgres_leases_exclude_another_process() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let reports = race(Backend::Postgres, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn postgres_versions_refuse_a_stale_write_from_another_process() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let reports = race(Backend::Postgres, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }

    #[test]
    fn sqlite_leases_exclude_another_process() {
        let reports = race(Backend::Sqlite, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn sqlite_versions_refuse_a_stale_write_from_another_process() {
        let reports = race(Backend::Sqlite, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }

    #[test]
    fn json_leases_exclude_another_process() {
        let reports = race(Backend::Json, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn json_versions_refuse_a_stale_write_from_another_process() {
        let reports = race(Backend::Json, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }
}

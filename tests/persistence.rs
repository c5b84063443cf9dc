//! Durability across processes: a run parked by one runtime (or process) is
//! resumed by another on the same SQLite file; compiled components are
//! cached on disk; a database from a newer schema is refused.

use std::sync::Arc;

use serde_json::json;
use stepwell::wasm::LoadOrigin;
use stepwell::{
    EngineConfig, RunStatus, Runtime, SandboxLimits, SqliteStore, StartOptions, Store, WasmEngine,
};
use stepwell_tests::example;

fn runtime_on(path: &std::path::Path, cache: &std::path::Path) -> Runtime {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).unwrap());
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(cache.to_path_buf()),
        limits: SandboxLimits::default(),
        digests: None,
    })
    .unwrap();
    stepwell::builder(store).engine(engine).build().unwrap()
}

#[test]
fn a_run_parked_before_a_restart_is_resumed_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stepwell.sqlite");
    let cache = dir.path().join("cache");
    let (id, key) = {
        let rt = runtime_on(&db, &cache);
        let wf = rt
            .load_bundle(&example("ask-user"))
            .unwrap()
            .main_workflow_id;
        let id = rt.start(&wf, StartOptions::default()).unwrap();
        let parked = rt.tick(&id).unwrap();
        assert_eq!(parked.status, RunStatus::Waiting);
        (id, parked.waiting.unwrap().wait_key)
    }; // everything of the first host is dropped here

    // A new host that never loaded the bundle: it finds the workflow through
    // the store.
    let rt = runtime_on(&db, &cache);
    let state = rt.get_state(&id).unwrap();
    assert_eq!(state.status, RunStatus::Waiting);
    let done = rt.resume(&id, &key, json!({"text": "Bob"})).unwrap();
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Bob!"})));
    assert_eq!(rt.get_ledger(&id).unwrap().len(), 4);
}

#[test]
fn compiled_components_are_read_from_the_disk_cache_by_a_second_engine() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = EngineConfig {
        cache_dir: Some(cache.clone()),
        limits: SandboxLimits::default(),
        digests: None,
    };
    let greet = example("hello").join("greet.wasm");
    let first = WasmEngine::new(config.clone())
        .unwrap()
        .load_node(&greet)
        .unwrap();
    assert_eq!(first.origin(), LoadOrigin::Compiled);
    let mut cached: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    cached.sort();
    assert_eq!(
        cached.len(),
        3,
        "its compile lock, one compiled file and its digest: {cached:?}"
    );
    let lock = cached.remove(0);
    assert!(cached[0].ends_with(".cwasm") && cached[1].ends_with(".cwasm.sha256"));
    assert_eq!(lock, format!(".{}.lock", cached[0]));
    let second = WasmEngine::new(config).unwrap().load_node(&greet).unwrap();
    assert_eq!(second.origin(), LoadOrigin::DiskCache);
    assert_eq!(first.digest(), second.digest());

    // A corrupted cache file is not trusted: the component is compiled again.
    let file = cache.join(&cached[0]);
    std::fs::write(&file, b"garbage").unwrap();
    let third = WasmEngine::new(EngineConfig {
        cache_dir: Some(cache.clone()),
        limits: SandboxLimits::default(),
        digests: None,
    })
    .unwrap()
    .load_node(&greet)
    .unwrap();
    assert_eq!(third.origin(), LoadOrigin::Compiled);
}

/// Two threads that load one component at once on a fresh engine compile
/// it once: the second waits for the first's compile and takes its code
/// (with and without a disk cache).
#[test]
fn two_threads_loading_one_component_at_once_compile_it_once() {
    let bytes = std::fs::read(example("chain").join("step.wasm")).unwrap();
    for cached in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let engine = WasmEngine::new(EngineConfig {
            cache_dir: cached.then(|| dir.path().join("cache")),
            limits: SandboxLimits::default(),
            digests: None,
        })
        .unwrap();
        let go = std::sync::Barrier::new(2);
        let digests: Vec<String> = std::thread::scope(|s| {
            let loads: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        go.wait();
                        let label = std::path::Path::new("step.wasm");
                        engine
                            .load_node_bytes(&bytes, label)
                            .unwrap()
                            .digest()
                            .to_string()
                    })
                })
                .collect();
            loads.into_iter().map(|l| l.join().unwrap()).collect()
        });
        assert_eq!(digests[0], digests[1]);
        assert_eq!(engine.components_compiled(), 1, "cached: {cached}");
    }
}

/// Hosts started together on one cache directory compile a component once:
/// one process compiles it while the others wait for its compile lock, then
/// read what it wrote.
#[test]
fn hosts_started_together_on_one_cache_compile_a_component_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let go = dir.path().join("go");
    let component = example("chain").join("step.wasm");
    let workers: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_store-worker"))
                .arg(&cache)
                .arg("compile")
                .arg(&component)
                .arg("0")
                .arg(&go)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(&go, b"").unwrap();
    let mut origins: Vec<String> = workers
        .into_iter()
        .map(|w| printed(w.wait_with_output().unwrap()))
        .collect();
    origins.sort();
    assert_eq!(origins, ["Compiled", "DiskCache", "DiskCache"]);
}

/// A host whose umask lets its group write new files (002, common for
/// ordinary users) still writes cache files only it may write, so the next
/// host loads them rather than refusing them and compiling again.
#[test]
fn a_cache_written_under_a_permissive_umask_is_read_by_the_next_host() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let component = example("chain").join("step.wasm");
    let origin = || {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"umask 002 && exec "$0" "$1" compile "$2" 0"#)
            .arg(env!("CARGO_BIN_EXE_store-worker"))
            .arg(&cache)
            .arg(&component)
            .output()
            .unwrap();
        printed(out)
    };
    assert_eq!(origin(), "Compiled");
    assert_eq!(origin(), "DiskCache");
}

/// What a `store-worker` printed, once it succeeded.
fn printed(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The hello node's greeting for `name`, through `engine` (checks that the
/// code loaded is the hello component's).
fn greets(engine: &WasmEngine, name: &str) -> String {
    let greet = engine
        .load_node(&example("hello").join("greet.wasm"))
        .unwrap();
    let vars = json!({"name": name}).to_string();
    let plan = greet
        .call(&stepwell::wasm::NodeCall {
            run_id: "r",
            workflow_id: "hello",
            node_id: "greet",
            config_json: None,
            vars_json: &vars,
            now: chrono::Utc::now(),
            attempt: 1,
            seed: 1,
        })
        .unwrap();
    plan.complete_output.unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Swaps the hello component's cached file for the chain step's: what an
/// attacker (or a bad copy) could leave in a cache directory.
fn swap_cached_code(cache: &std::path::Path, engine: &WasmEngine) {
    let greet = engine
        .load_node(&example("hello").join("greet.wasm"))
        .unwrap();
    let step = engine
        .load_node(&example("chain").join("step.wasm"))
        .unwrap();
    let file = |digest: &str| {
        std::fs::read_dir(cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let name = p.file_name().unwrap().to_str().unwrap();
                name.starts_with(digest) && name.ends_with(".cwasm")
            })
            .unwrap()
    };
    std::fs::copy(file(step.digest()), file(greet.digest())).unwrap();
}

#[test]
fn a_cache_file_swapped_for_other_code_is_detected_and_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = EngineConfig {
        cache_dir: Some(cache.clone()),
        ..EngineConfig::default()
    };
    let first = WasmEngine::new(config.clone()).unwrap();
    assert_eq!(greets(&first, "Ann"), "Hello, Ann!");
    swap_cached_code(&cache, &first);
    // A new engine finds a file whose digest is not the one recorded: it
    // compiles the component again instead of running the step's code.
    let second = WasmEngine::new(config.clone()).unwrap();
    let greet = second
        .load_node(&example("hello").join("greet.wasm"))
        .unwrap();
    assert_eq!(greet.origin(), LoadOrigin::Compiled);
    assert_eq!(greets(&second, "Bob"), "Hello, Bob!");
    // The recompiled file is vouched for again.
    let third = WasmEngine::new(config).unwrap();
    let greet = third
        .load_node(&example("hello").join("greet.wasm"))
        .unwrap();
    assert_eq!(greet.origin(), LoadOrigin::DiskCache);
}

#[test]
fn a_sqlite_host_keeps_the_cache_digests_in_its_store() {
    use stepwell::host::{open_runtime, HostOptions, StoreSpec};
    let dir = tempfile::tempdir().unwrap();
    let spec = StoreSpec::Sqlite(dir.path().join("stepwell.sqlite"));
    let cache = spec.cache_dir(None).unwrap();
    let rt = open_runtime(&spec, &HostOptions::default()).unwrap();
    assert_eq!(greets(rt.engine(), "Ann"), "Hello, Ann!");
    assert!(
        !std::fs::read_dir(&cache).unwrap().any(|e| e
            .unwrap()
            .path()
            .extension()
            .is_some_and(|x| x == "sha256")),
        "no digest beside the files: the database keeps them"
    );
    swap_cached_code(&cache, rt.engine());
    drop(rt);
    let rt = open_runtime(&spec, &HostOptions::default()).unwrap();
    let greet = rt
        .engine()
        .load_node(&example("hello").join("greet.wasm"))
        .unwrap();
    assert_eq!(greet.origin(), LoadOrigin::Compiled);
    assert_eq!(greets(rt.engine(), "Bob"), "Hello, Bob!");
}

/// A bundle whose `parent` starts an async `asker` child (which asks) and
/// waits for it, completing with the child's status.
fn parent_and_asker(dir: &std::path::Path) -> std::path::PathBuf {
    stepwell_tests::write_bundle(
        dir,
        "parent",
        &[
            (
                "flow.json",
                json!({"workflow_id": "parent", "entry": "start", "nodes": {
                    "start": {"effect": "start_subworkflow",
                              "payload": {"workflow_id": "asker", "async": true, "wait": true},
                              "result_key": "child", "next": "done"},
                    "done": {"complete": {"$var": "child.status"}}}}),
            ),
            (
                "asker.flow.json",
                json!({"workflow_id": "asker", "entry": "ask", "nodes": {
                    "ask": {"effect": "ask_user", "payload": {"prompt": "?"}}}}),
            ),
        ],
    )
}

#[test]
fn a_child_that_cannot_be_read_is_set_aside_and_its_parent_learns_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    let spec = stepwell::host::StoreSpec::Sqlite(db.clone());
    let rt = stepwell::host::open_runtime(&spec, &Default::default()).unwrap();
    let dir_bundle = parent_and_asker(dir.path());
    rt.load_bundle(&dir_bundle).unwrap();
    let parent = rt.run("parent", StartOptions::default()).unwrap();
    let child = parent.waiting.unwrap().details.unwrap()["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    rt.drive_once().unwrap();
    // The child ends (its parent is marked for the driver's next pass),
    // then its row is damaged before the pass reads it.
    let ended = rt.respond(&child, json!({"text": "done"})).unwrap();
    assert_eq!(ended.status, RunStatus::Completed);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE runs SET data = '{broken' WHERE run_id = ?1",
        [&child],
    )
    .unwrap();
    let report = rt.drive_once().unwrap();
    assert_eq!(
        report.parents_resumed,
        vec![parent.run_id.clone()],
        "{report:?}"
    );
    let quarantined: Vec<String> = rt
        .store()
        .list_quarantined()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(quarantined, vec![child], "the child, not its parent");
    let done = rt.get_state(&parent.run_id).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!("quarantined")));
}

#[cfg(unix)]
#[test]
fn a_cache_directory_others_may_write_or_own_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = |cache: &std::path::Path| EngineConfig {
        cache_dir: Some(cache.to_path_buf()),
        ..EngineConfig::default()
    };
    // Created private.
    let fresh = dir.path().join("a/b/cache");
    WasmEngine::new(config(&fresh)).unwrap();
    let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    // Writable by others: refused, naming it.
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = WasmEngine::new(config(&open)).unwrap_err();
    assert_eq!(err.path, open);
    assert!(err.message.contains("writable by others"), "{err}");
    // A symbolic link to a good directory: refused (the link could be
    // pointed elsewhere between the check and a load).
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&fresh, &link).unwrap();
    let err = WasmEngine::new(config(&link)).unwrap_err();
    assert!(err.message.contains("symbolic link"), "{err}");
    // A cached file that became a link is not loaded: recompiled instead.
    let engine = WasmEngine::new(config(&fresh)).unwrap();
    let greet = example("hello").join("greet.wasm");
    engine.load_node(&greet).unwrap();
    let cwasm = std::fs::read_dir(&fresh)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .unwrap();
    let elsewhere = dir.path().join("elsewhere.cwasm");
    std::fs::rename(&cwasm, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &cwasm).unwrap();
    let again = WasmEngine::new(config(&fresh)).unwrap();
    assert_eq!(
        again.load_node(&greet).unwrap().origin(),
        LoadOrigin::Compiled
    );
    // Someone else's (only root can give a directory away to check this).
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    if std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).is_ok() {
        let err = WasmEngine::new(config(&theirs)).unwrap_err();
        assert!(err.message.contains("belongs to user 65534"), "{err}");
    }
}

/// Gives the ledger of `conn` the shape it had up to schema 9: a table
/// keyed by `(run_id, seq)`, and (with `feed`) the separate `feed` table of
/// one row per append, filled in the order the records were committed.
fn old_ledger_shape(conn: &rusqlite::Connection, feed: bool) {
    conn.execute_batch(
        "CREATE TABLE ledger_old (run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL,
             hash TEXT, idem_key TEXT, PRIMARY KEY (run_id, seq)) WITHOUT ROWID;
         INSERT INTO ledger_old SELECT run_id, seq, data, hash, idem_key FROM ledger;",
    )
    .unwrap();
    if feed {
        conn.execute_batch(
            "CREATE TABLE feed (seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL,
                 from_seq INTEGER NOT NULL, to_seq INTEGER NOT NULL);",
        )
        .unwrap();
        let rows: Vec<(String, i64)> = conn
            .prepare("SELECT run_id, seq FROM ledger ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut appends: Vec<(String, i64, i64)> = Vec::new();
        for (run, seq) in rows {
            match appends.last_mut() {
                Some(a) if a.0 == run && a.2 + 1 == seq => a.2 = seq,
                _ => appends.push((run, seq, seq)),
            }
        }
        for (run, from, to) in appends {
            conn.execute(
                "INSERT INTO feed (run_id, from_seq, to_seq) VALUES (?1, ?2, ?3)",
                rusqlite::params![run, from, to],
            )
            .unwrap();
        }
    }
    conn.execute_batch("DROP TABLE ledger; ALTER TABLE ledger_old RENAME TO ledger;")
        .unwrap();
}

/// A version-6 database (before the change feed) is migrated when opened:
/// its records join the feed first, and its runs go on and are fed.
#[test]
fn a_version_6_database_gets_the_change_feed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("six.sqlite");
    let id = {
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let rt = stepwell::builder(store)
            .engine(stepwell_tests::engine())
            .build()
            .unwrap();
        let bundle = rt.load_bundle(&example("ask-user")).unwrap();
        rt.run(&bundle.main_workflow_id, Default::default())
            .unwrap()
            .run_id
    };
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        old_ledger_shape(&conn, false);
        conn.execute_batch("PRAGMA user_version = 6;").unwrap();
    }
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    let rt = stepwell::builder(store.clone())
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    rt.load_bundle(&example("ask-user")).unwrap();
    let done = rt.respond(&id, serde_json::json!({"text": "x"})).unwrap();
    assert_eq!(done.status, stepwell::RunStatus::Completed);
    let feed = store.list_feed(0, 10).unwrap().unwrap();
    let ranges: Vec<(&str, u64, u64)> = feed
        .iter()
        .map(|e| (e.run_id.as_str(), e.from_seq, e.to_seq))
        .collect();
    // The records from before the upgrade, then the resume's (one run's
    // records one after another are one entry).
    assert_eq!(ranges, vec![(id.as_str(), 1, 4)]);
    assert_eq!(store.feed_head().unwrap(), Some(feed[0].seq));
    assert_eq!(feed[0].seq, 4);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, stepwell::store::SQLITE_SCHEMA_VERSION);
}

/// A version-9 database (a ledger keyed by run and a separate feed table)
/// is migrated when opened: the records keep their chains, the feed keeps
/// its order across runs, and a position held before the upgrade reads
/// every record committed after it (some again, none missed).
#[test]
fn a_version_9_database_keeps_its_feed_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nine.sqlite");
    let (a, b, before) = {
        let store = Arc::new(SqliteStore::open(&db).unwrap());
        let rt = stepwell::builder(store.clone())
            .engine(stepwell_tests::engine())
            .build()
            .unwrap();
        let bundle = rt.load_bundle(&example("ask-user")).unwrap();
        let a = rt
            .run(&bundle.main_workflow_id, Default::default())
            .unwrap();
        let b = rt
            .run(&bundle.main_workflow_id, Default::default())
            .unwrap();
        // Interleaved: a's first append, b's, then a's second.
        rt.respond(&a.run_id, json!({"text": "a"})).unwrap();
        let before = store.list_feed(0, 100).unwrap().unwrap();
        (a.run_id, b.run_id, before)
    };
    let ranges = |feed: &[stepwell::FeedEntry]| -> Vec<(String, u64, u64)> {
        feed.iter()
            .map(|e| (e.run_id.clone(), e.from_seq, e.to_seq))
            .collect()
    };
    assert_eq!(
        ranges(&before),
        vec![(a.clone(), 1, 2), (b.clone(), 1, 2), (a.clone(), 3, 4)]
    );
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        old_ledger_shape(&conn, true);
        // An operator's view on the ledger does not stop the upgrade.
        conn.execute_batch(
            "CREATE VIEW ledger_rows AS SELECT run_id, seq FROM ledger;
             PRAGMA user_version = 9;",
        )
        .unwrap();
        // The old feed's positions were 1, 2, 3.
        let head: i64 = conn
            .query_row("SELECT MAX(seq) FROM feed", [], |r| r.get(0))
            .unwrap();
        assert_eq!(head, 3);
    }
    let store = Arc::new(SqliteStore::open(&db).unwrap());
    let feed = store.list_feed(0, 100).unwrap().unwrap();
    assert_eq!(ranges(&feed), ranges(&before));
    // A client that had read the old feed up to position 1 (a's first
    // append) still gets b's first append and a's second.
    let after_1 = store.list_feed(1, 100).unwrap().unwrap();
    let got = ranges(&after_1);
    assert!(
        got.ends_with(&[(b.clone(), 1, 2), (a.clone(), 3, 4)]),
        "{got:?}"
    );
    for id in [&a, &b] {
        let records = store.list_records(id).unwrap();
        assert!(stepwell::store::verify_chain(&records).is_ok(), "{id}");
    }
    assert_eq!(store.list_records(&a).unwrap().len(), 4);
    let viewed: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT COUNT(*) FROM ledger_rows", [], |r| r.get(0))
        .unwrap();
    assert_eq!(viewed, 6);
    // And the runs go on: b is resumed and fed after everything before.
    let rt = stepwell::builder(store.clone())
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    rt.load_bundle(&example("ask-user")).unwrap();
    let done = rt.respond(&b, json!({"text": "b"})).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    let last = store.list_feed(feed[2].seq, 100).unwrap().unwrap();
    assert_eq!(ranges(&last), vec![(b.clone(), 3, 4)]);
}

#[test]
fn a_database_from_a_newer_schema_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("newer.sqlite");
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE future (x); PRAGMA user_version = 99;")
            .unwrap();
    }
    let err = SqliteStore::open(&db).unwrap_err();
    assert_eq!(err.code, "store_schema");
    assert!(
        err.message.contains("newer.sqlite") && err.message.contains("99"),
        "{err}"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, 99);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'runs'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 0, "nothing was created in it");
}

/// A run whose stored state cannot be read: reported with its id when
/// asked for, left out of listings, quarantined (and reported) by the
/// driver, and every other run keeps moving.
fn a_corrupt_run_is_quarantined_and_the_rest_moves_on(json_files: bool) {
    let dir = tempfile::tempdir().unwrap();
    let spec = if json_files {
        stepwell::host::StoreSpec::Json(dir.path().join("store"))
    } else {
        stepwell::host::StoreSpec::Sqlite(dir.path().join("db.sqlite"))
    };
    let rt = stepwell::host::open_runtime(&spec, &Default::default()).unwrap();
    let wf = rt.load_bundle(&example("hello")).unwrap().main_workflow_id;
    let waiter = rt
        .load_bundle(&example("wait-until"))
        .unwrap()
        .main_workflow_id;
    let good = rt.start(&wf, StartOptions::default()).unwrap();
    let bad = rt.start(&wf, StartOptions::default()).unwrap();
    let due = rt
        .run(
            &waiter,
            StartOptions {
                vars: serde_json::from_value(json!({"seconds": 0.05})).unwrap(),
                ..StartOptions::default()
            },
        )
        .unwrap()
        .run_id;
    match &spec {
        stepwell::host::StoreSpec::Sqlite(db) => {
            let conn = rusqlite::Connection::open(db).unwrap();
            conn.execute("UPDATE runs SET data = '{broken' WHERE run_id = ?1", [&bad])
                .unwrap();
        }
        stepwell::host::StoreSpec::Json(store) => {
            std::fs::write(store.join(format!("run_{bad}.json")), b"{broken").unwrap();
        }
        stepwell::host::StoreSpec::Memory | stepwell::host::StoreSpec::Postgres(_) => {
            unreachable!()
        }
    }
    let err = rt.get_state(&bad).unwrap_err();
    assert_eq!(err.reason_code(), "store_corrupt");
    assert!(err.to_string().contains(&bad), "{err}");
    // Listings leave it out instead of failing.
    let listed: Vec<String> = rt
        .list_runs(&stepwell::RunQuery::default())
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert!(
        listed.contains(&good) && !listed.contains(&bad),
        "{listed:?}"
    );
    // The driver reports and quarantines it, and moves the others.
    std::thread::sleep(std::time::Duration::from_millis(60));
    let report = rt.drive_once().unwrap();
    assert_eq!(
        report
            .quarantined
            .iter()
            .map(|q| q.run_id.as_str())
            .collect::<Vec<_>>(),
        [bad.as_str()],
        "{report:?}"
    );
    assert!(report.quarantined[0].error.starts_with("store_corrupt"));
    assert_eq!(report.ticked, vec![good.clone()]);
    assert_eq!(report.due_resumed, vec![due.clone()]);
    assert_eq!(rt.get_state(&good).unwrap().status, RunStatus::Completed);
    assert_eq!(rt.get_state(&due).unwrap().status, RunStatus::Completed);
    assert_eq!(
        rt.store().list_quarantined().unwrap()[0].0,
        bad,
        "it stays set aside"
    );
    // The next pass has nothing to say about it.
    let again = rt.drive_once().unwrap();
    assert!(
        again.quarantined.is_empty() && again.errors.is_empty(),
        "{again:?}"
    );
    assert!(matches!(
        rt.tick(&bad).unwrap_err(),
        stepwell::Error::Store(_) | stepwell::Error::Quarantined { .. }
    ));
}

#[test]
fn a_corrupt_run_row_is_quarantined_and_the_rest_moves_on() {
    a_corrupt_run_is_quarantined_and_the_rest_moves_on(false);
}

#[test]
fn a_corrupt_run_file_is_quarantined_and_the_rest_moves_on() {
    a_corrupt_run_is_quarantined_and_the_rest_moves_on(true);
}

#[test]
fn a_resume_that_cannot_continue_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    let cache = dir.path().join("cache");
    let bundle = dir.path().join("ask-copy");
    std::fs::create_dir_all(&bundle).unwrap();
    for f in ["flow.json", "greet.wasm"] {
        std::fs::copy(example("ask-user").join(f), bundle.join(f)).unwrap();
    }
    let waiter = dir.path().join("waiter");
    std::fs::create_dir_all(&waiter).unwrap();
    std::fs::write(
        waiter.join("flow.json"),
        json!({"workflow_id": "waiter", "entry": "w",
               "nodes": {"w": {"effect": "wait_event", "payload": {"name": "ping", "scope": "global"}}}})
        .to_string(),
    )
    .unwrap();
    let (asker, listener) = {
        let rt = runtime_on(&db, &cache);
        rt.load_bundle(&bundle).unwrap();
        rt.load_bundle(&waiter).unwrap();
        let a = rt.start("ask-user", StartOptions::default()).unwrap();
        rt.tick(&a).unwrap();
        let w = rt.start("waiter", StartOptions::default()).unwrap();
        rt.tick(&w).unwrap();
        (a, w)
    };
    // Their versions are gone when a new host comes up (removed from the
    // store by hand: a prune keeps the versions of waiting runs).
    let rt = runtime_on(&db, &cache);
    for id in ["ask-user", "waiter"] {
        let versions = rt.store().workflow_versions(Some(id)).unwrap();
        rt.store().remove_versions(&versions).unwrap();
    }
    let before = (
        rt.get_state(&asker).unwrap(),
        rt.get_ledger(&asker).unwrap(),
    );
    let key = before.0.waiting.clone().unwrap().wait_key;
    let err = rt.resume(&asker, &key, json!({"text": "Bob"})).unwrap_err();
    assert_eq!(err.reason_code(), "unknown_version", "{err}");
    assert!(err.to_string().contains("ask-user"), "{err}");
    assert_eq!(
        (
            rt.get_state(&asker).unwrap(),
            rt.get_ledger(&asker).unwrap()
        ),
        before
    );

    // An event for a listener that cannot continue: the listener stays
    // waiting, and the emitter says so.
    let emitter = dir.path().join("emitter");
    std::fs::create_dir_all(&emitter).unwrap();
    std::fs::write(
        emitter.join("flow.json"),
        json!({"workflow_id": "emitter", "entry": "e",
               "nodes": {"e": {"effect": "emit_event", "payload": {"name": "ping", "scope": "global"}}}})
        .to_string(),
    )
    .unwrap();
    rt.load_bundle(&emitter).unwrap();
    let e = rt.start("emitter", StartOptions::default()).unwrap();
    let out = rt.tick(&e).unwrap().output.unwrap();
    assert_eq!(out["delivered"], json!(0), "{out}");
    assert_eq!(out["resumed"][0]["run_id"], json!(listener), "{out}");
    assert_eq!(out["resumed"][0]["status"], json!("error"), "{out}");
    assert!(
        out["resumed"][0]["error"]
            .as_str()
            .unwrap()
            .contains("unknown_version"),
        "{out}"
    );
    assert_eq!(rt.get_state(&listener).unwrap().status, RunStatus::Waiting);
}

/// A version-8 database (before the driver's markers) is migrated when
/// opened: a parent already waiting on an ended child, and an unfinished
/// child of a parent already cancelled, are marked, so the driver's
/// indexed queries find them; its waiting runs are indexed again.
#[test]
fn a_version_8_database_gets_the_drivers_markers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("eight.sqlite");
    let spec = stepwell::host::StoreSpec::Sqlite(db.clone());
    let bundle = parent_and_asker(dir.path());
    let child_of = |run: &stepwell::RunState| {
        run.waiting.as_ref().unwrap().details.as_ref().unwrap()["sub_run_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (waiting, ended_child, cancelled, orphan) = {
        let rt = stepwell::host::open_runtime(&spec, &Default::default()).unwrap();
        rt.load_bundle(&bundle).unwrap();
        let waiting = rt.run("parent", StartOptions::default()).unwrap();
        let cancelled = rt.run("parent", StartOptions::default()).unwrap();
        let ended_child = child_of(&waiting);
        rt.drive_once().unwrap();
        rt.respond(&ended_child, json!({"text": "done"})).unwrap();
        rt.cancel_run(&cancelled.run_id, None).unwrap();
        // A child started under the parent as it was cancelled (its cancel
        // had already cancelled the children it knew of).
        let orphan = rt
            .start(
                "asker",
                StartOptions {
                    parent_run_id: Some(cancelled.run_id.clone()),
                    ..Default::default()
                },
            )
            .unwrap();
        (waiting.run_id, ended_child, cancelled.run_id, orphan)
    };
    {
        // As a version-8 database had them: no marker columns or indexes.
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "DROP INDEX runs_child_ended; DROP INDEX runs_orphan; DROP INDEX runs_consumer;
             ALTER TABLE runs DROP COLUMN child_ended_us; ALTER TABLE runs DROP COLUMN orphan_us;
             ALTER TABLE runs DROP COLUMN wakes_on;
             PRAGMA user_version = 8;",
        )
        .unwrap();
        // Attribution a waiting run's indexer no longer gives: a waiting
        // run is indexed again (its `wakes_on` is new), whatever its role.
        conn.execute(
            "UPDATE runs SET role = 'stale', session_kind = 'stale' WHERE run_id = ?1",
            [&waiting],
        )
        .unwrap();
        // A controller row whose data is not even text does not stop the
        // migration (its claim reports it).
        conn.execute(
            "INSERT INTO runs (run_id, workflow_id, status, data, role)
             VALUES ('broken', 'automation.controller', 'waiting', CAST(X'7B22FF22' AS TEXT),
                     'controller')",
            [],
        )
        .unwrap();
    }
    let rt = stepwell::host::open_runtime(&spec, &Default::default()).unwrap();
    let row = rt
        .store()
        .list_run_index(&Default::default())
        .unwrap()
        .into_iter()
        .find(|r| r.run_id == waiting)
        .unwrap();
    assert_eq!(
        (row.role, row.session_kind.as_deref()),
        (None, Some("chat")),
        "indexed again"
    );
    let report = rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed, vec![waiting.clone()], "{report:?}");
    assert_eq!(report.orphans_cancelled, vec![orphan.clone()], "{report:?}");
    assert_eq!(
        rt.get_state(&waiting).unwrap().output,
        Some(json!("completed"))
    );
    assert_eq!(
        rt.get_state(&ended_child).unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(
        rt.get_state(&cancelled).unwrap().status,
        RunStatus::Cancelled
    );
    assert_eq!(rt.get_state(&orphan).unwrap().status, RunStatus::Cancelled);
    assert!(!rt.drive_once().unwrap().moved_anything());
}

/// The driver's markers follow runs that go back: a child restored from a
/// snapshot to a wait after it ended resumes nobody, and a child restored
/// to a wait after its parent was cancelled is cancelled again.
#[test]
fn a_restored_child_is_judged_as_it_is_now() {
    let dir = tempfile::tempdir().unwrap();
    let spec = stepwell::host::StoreSpec::Sqlite(dir.path().join("db.sqlite"));
    let rt = stepwell::host::open_runtime(&spec, &Default::default()).unwrap();
    let snapshots = spec.snapshots().unwrap();
    rt.load_bundle(&parent_and_asker(dir.path())).unwrap();
    let child_of = |run: &stepwell::RunState| {
        run.waiting.as_ref().unwrap().details.as_ref().unwrap()["sub_run_id"]
            .as_str()
            .unwrap()
            .to_string()
    };

    // A parent whose child asks, and a snapshot of the child asking.
    let parked = || {
        let parent = rt.run("parent", StartOptions::default()).unwrap();
        let child = child_of(&parent);
        rt.drive_once().unwrap();
        let asking = rt
            .create_snapshot(snapshots.as_ref(), &child, "asking", "", vec![])
            .unwrap();
        (parent, child, asking)
    };

    // Ended, then back to its wait: the parent waits on.
    let (parent, child, asking) = parked();
    rt.respond(&child, json!({"text": "done"})).unwrap();
    rt.restore_snapshot(snapshots.as_ref(), &asking.snapshot_id)
        .unwrap();
    assert_eq!(rt.get_state(&child).unwrap().status, RunStatus::Waiting);
    let report = rt.drive_once().unwrap();
    assert!(report.parents_resumed.is_empty(), "{report:?}");
    assert_eq!(
        rt.get_state(&parent.run_id).unwrap().status,
        RunStatus::Waiting
    );
    // When it ends again, the parent goes on.
    rt.respond(&child, json!({"text": "again"})).unwrap();
    let report = rt.drive_once().unwrap();
    assert_eq!(report.parents_resumed, vec![parent.run_id.clone()]);

    // Cancelled with its parent, then back to its wait: cancelled again.
    let (parent, child, asking) = parked();
    rt.cancel_run(&parent.run_id, None).unwrap();
    rt.drive_once().unwrap();
    assert_eq!(rt.get_state(&child).unwrap().status, RunStatus::Cancelled);
    rt.restore_snapshot(snapshots.as_ref(), &asking.snapshot_id)
        .unwrap();
    assert_eq!(rt.get_state(&child).unwrap().status, RunStatus::Waiting);
    let report = rt.drive_once().unwrap();
    assert_eq!(report.orphans_cancelled, vec![child.clone()], "{report:?}");
    assert_eq!(rt.get_state(&child).unwrap().status, RunStatus::Cancelled);
}

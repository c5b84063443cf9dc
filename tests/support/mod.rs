//! Shared helpers of the integration tests: where the repository's flows
//! are, runtimes over each store, and scratch bundles written on the fly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Map, Value};
use stepwell::{
    Clock, EngineConfig, ManualClock, MemoryStore, Runtime, SandboxLimits, SqliteStore, Store,
    WasmEngine,
};
use tempfile::TempDir;

pub mod llm_mock;
pub mod otlp;
pub mod proxy;
pub mod served;
pub mod shell;
pub mod world;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The bundle directory of an example flow, checking its components were built.
pub fn example(name: &str) -> PathBuf {
    let dir = repo().join("flows/examples").join(name);
    assert!(
        repo().join("flows/examples/hello/greet.wasm").is_file(),
        "the guest components are not built: run scripts/build-guests first"
    );
    dir
}

/// A component of an example, by its path under flows/examples.
pub fn component(rel: &str) -> PathBuf {
    let p = repo().join("flows/examples").join(rel);
    assert!(
        p.is_file(),
        "{} missing: run scripts/build-guests",
        p.display()
    );
    p
}

/// Where the tests cache compiled components (shared by the test binaries).
pub fn cache_dir() -> PathBuf {
    repo().join("target/stepwell-test-cache")
}

/// One engine per test binary, with the default limits.
pub fn engine() -> WasmEngine {
    static ENGINE: OnceLock<WasmEngine> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            WasmEngine::new(EngineConfig {
                cache_dir: Some(cache_dir()),
                limits: SandboxLimits::default(),
                digests: None,
            })
            .expect("engine")
        })
        .clone()
}

/// An engine with tight limits, for hostile guests.
pub fn strict_engine(time: Duration, memory_mib: usize) -> WasmEngine {
    WasmEngine::new(EngineConfig {
        cache_dir: Some(cache_dir()),
        limits: SandboxLimits {
            time_limit: time,
            memory_limit_bytes: memory_mib << 20,
            ..SandboxLimits::default()
        },
        digests: None,
    })
    .expect("engine")
}

/// The stores every kernel test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// [`MemoryStore`].
    Memory,
    /// [`SqliteStore`] in a temporary directory.
    Sqlite,
    /// [`stepwell::JsonFileStore`] in a temporary directory.
    Json,
    /// [`stepwell::PostgresStore`] in a schema of its own on the server
    /// `STEPWELL_TEST_POSTGRES_URL` names (`scripts/with-postgres` starts
    /// one).
    Postgres,
}

/// The environment variable naming the PostgreSQL server of the tests.
pub const POSTGRES_URL_ENV: &str = "STEPWELL_TEST_POSTGRES_URL";

/// Whether the PostgreSQL tests are skipped: no server was named. With
/// `STEPWELL_REQUIRE_POSTGRES=1` (CI), a missing server fails the test
/// instead.
pub fn postgres_skipped() -> bool {
    if std::env::var_os(POSTGRES_URL_ENV).is_some() {
        return false;
    }
    if std::env::var("STEPWELL_REQUIRE_POSTGRES").as_deref() == Ok("1") {
        panic!("{POSTGRES_URL_ENV} is unset and STEPWELL_REQUIRE_POSTGRES=1");
    }
    eprintln!("skipped: no PostgreSQL ({POSTGRES_URL_ENV} is unset; see scripts/with-postgres)");
    true
}

/// Tests that restart the tests' PostgreSQL server hold this exclusively;
/// tests whose processes cannot ride out a restart (a crash test's host
/// exits on a cut connection, by design) hold it shared, so that no
/// restart cuts them in the middle. Tests of one binary run as threads of
/// one process, so a lock of the process is enough.
static POSTGRES_RESTARTS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held while the test must not see the PostgreSQL server restart.
pub fn postgres_steady() -> std::sync::RwLockReadGuard<'static, ()> {
    POSTGRES_RESTARTS.read().unwrap_or_else(|e| e.into_inner())
}

/// Held by a test that restarts the PostgreSQL server: it waits for the
/// tests holding [`postgres_steady`], and they wait for it.
pub fn postgres_restarting() -> std::sync::RwLockWriteGuard<'static, ()> {
    POSTGRES_RESTARTS.write().unwrap_or_else(|e| e.into_inner())
}

/// A `--store` URL for a fresh, empty schema on the tests' PostgreSQL
/// server (created by the store when it is first opened).
pub fn postgres_url() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var(POSTGRES_URL_ENV).expect("STEPWELL_TEST_POSTGRES_URL");
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let schema = format!(
        "t{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    );
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-csearch_path%3D{schema}")
}

/// A store on `backend` with its files under `dir` (a PostgreSQL store
/// gets a fresh schema, whose URL is kept in `dir/postgres.url` for
/// [`store_spec`]).
pub fn open_store(backend: Backend, dir: &Path) -> Arc<dyn Store> {
    match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::Sqlite => Arc::new(SqliteStore::open(dir.join("db.sqlite")).expect("open")),
        Backend::Json => Arc::new(stepwell::JsonFileStore::open(dir.join("store")).expect("open")),
        Backend::Postgres => Arc::new(open_postgres(dir)),
    }
}

/// The PostgreSQL store of `dir` ([`open_store`]): the schema named in
/// `dir/postgres.url`, or a fresh one named there.
pub fn open_postgres(dir: &Path) -> stepwell::PostgresStore {
    let file = dir.join("postgres.url");
    let url = std::fs::read_to_string(&file).unwrap_or_else(|_| {
        let url = postgres_url();
        std::fs::write(&file, &url).expect("write postgres.url");
        url
    });
    stepwell::PostgresStore::open(&url).expect("open postgres")
}

/// The `--store` text of [`open_store`]'s store in `dir`, for another
/// process (the memory store has none).
pub fn store_spec(backend: Backend, dir: &Path) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite:{}", dir.join("db.sqlite").display()),
        Backend::Json => format!("json:{}", dir.join("store").display()),
        Backend::Postgres => {
            std::fs::read_to_string(dir.join("postgres.url")).expect("open the store first")
        }
        Backend::Memory => panic!("the memory store is one process's"),
    }
}

/// A runtime and what keeps its files alive.
pub struct Host {
    /// The runtime.
    pub rt: Runtime,
    /// The store it runs on.
    pub store: Arc<dyn Store>,
    /// Scratch space: the database (SQLite) and scratch bundles.
    pub dir: TempDir,
}

impl Host {
    /// A runtime on `backend` with the system clock.
    pub fn new(backend: Backend) -> Host {
        Host::build(backend, None, engine())
    }

    /// A runtime on `backend` with a manual clock.
    pub fn with_clock(backend: Backend, clock: Arc<ManualClock>) -> Host {
        Host::build(backend, Some(clock), engine())
    }

    /// A runtime on `backend` with its own engine.
    pub fn with_engine(backend: Backend, engine: WasmEngine) -> Host {
        Host::build(backend, None, engine)
    }

    /// A runtime on `backend` with a manual clock and `config`.
    pub fn with_config(
        backend: Backend,
        clock: Arc<ManualClock>,
        config: stepwell::RuntimeConfig,
    ) -> Host {
        let mut host = Host::build(backend, Some(clock.clone()), engine());
        host.rt = host.runtime(Some(clock), config);
        host
    }

    /// Another runtime on this host's store (no workflow loaded yet), as
    /// another process would have.
    pub fn runtime(
        &self,
        clock: Option<Arc<ManualClock>>,
        config: stepwell::RuntimeConfig,
    ) -> Runtime {
        let mut b = stepwell::builder(self.store.clone())
            .engine(self.rt.engine().clone())
            .config(config);
        if let Some(c) = clock {
            b = b.clock(c as Arc<dyn Clock>);
        }
        b.build().expect("runtime")
    }

    fn build(backend: Backend, clock: Option<Arc<ManualClock>>, engine: WasmEngine) -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open_store(backend, dir.path());
        let mut b = stepwell::builder(store.clone()).engine(engine);
        if let Some(c) = clock {
            b = b.clock(c as Arc<dyn Clock>);
        }
        Host {
            rt: b.build().expect("runtime"),
            store,
            dir,
        }
    }

    /// Loads an example bundle and returns its main workflow id.
    pub fn load(&self, example_name: &str) -> String {
        self.rt
            .load_bundle(&example(example_name))
            .expect("load bundle")
            .main_workflow_id
    }

    /// Writes a scratch bundle (file name -> flow document) and loads it.
    pub fn load_scratch(&self, name: &str, files: &[(&str, Value)]) -> String {
        let dir = write_bundle(self.dir.path(), name, files);
        self.rt
            .load_bundle(&dir)
            .expect("load scratch bundle")
            .main_workflow_id
    }
}

/// Writes a bundle directory `name` under `root` holding `files`.
pub fn write_bundle(root: &Path, name: &str, files: &[(&str, Value)]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (file, doc) in files {
        std::fs::write(dir.join(file), serde_json::to_string_pretty(doc).unwrap()).expect("write");
    }
    dir
}

/// A JSON object as vars.
pub fn vars(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("vars must be an object, got {other}"),
    }
}

/// A manual clock at a fixed, round start time.
pub fn manual_clock() -> Arc<ManualClock> {
    use chrono::TimeZone;
    Arc::new(ManualClock::new(
        chrono::Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(),
    ))
}

/// Runs a test body once per backend: `store_tests!(name, ...)` expects a
/// function `fn name(b: Backend)` for each name and generates
/// `memory::name`, `sqlite::name`, `json::name` and `postgres::name` tests
/// (the last skipped where no PostgreSQL server is named).
#[macro_export]
macro_rules! store_tests {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $( #[test] fn $name() { super::$name($crate::Backend::Memory) } )*
        }
        mod sqlite {
            $( #[test] fn $name() { super::$name($crate::Backend::Sqlite) } )*
        }
        mod json {
            $( #[test] fn $name() { super::$name($crate::Backend::Json) } )*
        }
        mod postgres {
            $( #[test] fn $name() {
                if !$crate::postgres_skipped() {
                    super::$name($crate::Backend::Postgres)
                }
            } )*
        }
    };
}

/// A trigger registry over the shared engine, with `plugins` (file name,
/// component path) copied into a fresh plugin folder (kept alive by the
/// returned directory).
pub fn trigger_registry(
    plugins: &[(&str, PathBuf)],
) -> (stepwell::triggers::TriggerRegistry, TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, src) in plugins {
        std::fs::copy(src, dir.path().join(name)).expect("copy plugin");
    }
    let registry =
        stepwell::triggers::TriggerRegistry::load(&engine(), Some(dir.path())).expect("registry");
    (registry, dir)
}

/// A trigger component shipped in the repository (`flows/triggers/<rel>`).
pub fn trigger_component(rel: &str) -> PathBuf {
    let p = repo().join("flows/triggers").join(rel);
    assert!(
        p.is_file(),
        "{} missing: run scripts/build-guests",
        p.display()
    );
    p
}

/// The `automation:` idempotency keys that occur more than once in
/// `ledger` (an automation controller records each decision once).
pub fn repeated_automation_keys(ledger: &[stepwell::StepRecord]) -> Vec<String> {
    let mut keys: Vec<&str> = ledger
        .iter()
        .filter_map(|r| r.idempotency_key.as_deref())
        .filter(|k| k.starts_with("automation:"))
        .collect();
    keys.sort_unstable();
    let mut repeated: Vec<String> = keys
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| w[0].to_string())
        .collect();
    repeated.dedup();
    repeated
}

/// How many of `ledger`'s records that are not effect records have a
/// result with the top-level key `key` (`"resumed"`, `"complete_output"`,
/// ...).
pub fn count_results(ledger: &[stepwell::StepRecord], key: &str) -> usize {
    ledger
        .iter()
        .filter(|r| r.effect.is_none() && r.result.as_ref().is_some_and(|v| v.get(key).is_some()))
        .count()
}

/// The `stepwell` binary (built by `scripts/setup` or `cargo build
/// --release -p stepwell`), beside this test binary's directory.
pub fn stepwell_binary() -> PathBuf {
    // target/<profile>/deps/<test>-<hash> -> target/<profile>/stepwell
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("stepwell");
    assert!(
        bin.is_file(),
        "{} not built: run `cargo build --release -p stepwell` first",
        bin.display()
    );
    bin
}

/// `c` (a `stepwell` process) with the user's state and cache folders
/// (`XDG_STATE_HOME`, `XDG_CACHE_HOME`) under `dir`, so that what it keeps
/// in them (a memory or PostgreSQL store's server token and compiled
/// components) goes into the test's scratch folder, not the user's home.
pub fn scratch_home<'c>(
    c: &'c mut std::process::Command,
    dir: &Path,
) -> &'c mut std::process::Command {
    c.env("XDG_STATE_HOME", dir.join(".state"))
        .env("XDG_CACHE_HOME", dir.join(".cache"))
}

/// Waits until `done` holds, checking every 50 ms, for at most `limit`;
/// panics with `what` if it never does.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "gave up waiting for {what} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A flow that waits for the event `payload` names, then completes with
/// `complete` (a template over the event's envelope in `got`).
pub fn listener_flow(workflow_id: &str, payload: Value, complete: Value) -> Value {
    serde_json::json!({"workflow_id": workflow_id, "entry": "wait", "nodes": {
        "wait": {"effect": "wait_event", "payload": payload, "result_key": "got", "next": "done"},
        "done": {"complete": complete}}})
}

/// A flow that emits the event `payload` describes, then completes with
/// `complete` (a template over the emit's result in `sent`).
pub fn emitter_flow(workflow_id: &str, payload: Value, complete: Value) -> Value {
    serde_json::json!({"workflow_id": workflow_id, "entry": "emit", "nodes": {
        "emit": {"effect": "emit_event", "payload": payload, "result_key": "sent", "next": "done"},
        "done": {"complete": complete}}})
}

/// An event storm: `echo` runs answer the global event `ping` with `ping`
/// and wait again, for ever; `kick` sends the first one.
pub fn echo_flows() -> Vec<(&'static str, Value)> {
    let ping = serde_json::json!({"name": "ping", "scope": "global"});
    vec![
        (
            "flow.json",
            serde_json::json!({"workflow_id": "echo", "entry": "wait", "nodes": {
                "wait": {"effect": "wait_event", "payload": ping, "result_key": "got", "next": "emit"},
                "emit": {"effect": "emit_event", "payload": ping, "result_key": "sent", "next": "wait"}}}),
        ),
        (
            "kick.flow.json",
            emitter_flow(
                "kick",
                ping.clone(),
                serde_json::json!({"$var": "sent.delivered"}),
            ),
        ),
    ]
}

/// Asserts that every point of the run's history can be forked from: its
/// ledger rebuilds its vars (forks, docs/history.md).
pub fn assert_forkable(rt: &stepwell::Runtime, run_id: &str) {
    let points = rt.fork_points(run_id).expect("fork points");
    assert!(!points.is_empty(), "run {run_id} offers no fork point");
    let lost: Vec<_> = points.iter().filter(|p| !p.reproducible).collect();
    assert!(
        lost.is_empty(),
        "the ledger of {run_id} does not rebuild its vars: {lost:?}"
    );
}

/// The text of the artifact `reference` (`{"$artifact": id}`) names, from
/// the runtime's artifact store.
pub fn artifact_text(rt: &stepwell::Runtime, reference: &Value) -> String {
    let id = reference["$artifact"]
        .as_str()
        .expect("an artifact reference");
    let store = rt.artifact_store().expect("an artifact store");
    String::from_utf8(store.get(id).unwrap().expect("the artifact")).unwrap()
}

/// An HTTP/1.1 request as the tests' servers read it: its request line,
/// its headers (names in lower case) and its body.
pub type HttpRequest = (String, Vec<(String, String)>, Vec<u8>);

/// One HTTP/1.1 request read off `reader` (its body: `Content-Length`
/// bytes); `None` at the end of the connection or on a short read.
pub fn read_http_request(reader: &mut impl std::io::BufRead) -> Option<HttpRequest> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((line.trim_end().to_string(), headers, body))
}

/// A copy of the `expenses` example under `parent/typo`, workflow `typo`,
/// whose flow misspells the route `review` as `reveiw`: a route its
/// component does not declare. Returns the bundle directory.
pub fn misspelt_expenses(parent: &Path) -> PathBuf {
    let dir = parent.join("typo");
    std::fs::create_dir_all(&dir).unwrap();
    let expenses = repo().join("flows/examples/expenses");
    std::fs::copy(expenses.join("triage.wasm"), dir.join("triage.wasm")).unwrap();
    let flow = std::fs::read_to_string(expenses.join("flow.json")).unwrap();
    let typo = flow
        .replace("\"review\"", "\"reveiw\"")
        .replace("\"expenses\"", "\"typo\"");
    std::fs::write(dir.join("flow.json"), typo).unwrap();
    dir
}

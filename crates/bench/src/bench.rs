//! The benchmarks behind `stepwell bench`: medians over repeated runs, all in
//! one process so the figures compare (but for the multi-process ones).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use stepwell::core::trace::Tracer;
use stepwell::host::StoreSpec;
use stepwell::store::{JsonFileStore, MemoryStore, PostgresStore, SqliteStore, Store};
use stepwell::wasm::{EngineConfig, NodeCall, WasmEngine};
use stepwell::{Error, Result, RunStatus, Runtime, StartOptions};

/// What to measure with, and how long.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// The repository's `flows/` directory (the example components).
    pub flows_dir: PathBuf,
    /// Node dispatches measured.
    pub dispatch_samples: usize,
    /// Nodes in the chain.
    pub chain_len: usize,
    /// Times each chain run is repeated (the median is reported).
    pub chain_repeats: usize,
    /// Ask / resume cycles per batch.
    pub cycles_per_batch: usize,
    /// Batches of cycles (the median is reported).
    pub cycle_batches: usize,
    /// Run only the benchmarks whose figure names contain this text
    /// (`dispatch`, `chain`, `memory`, `sqlite`, `json`, `ledger`, `cycles`,
    /// `trigger`, `conflicts`, `3procs`, `hostile`, `automation`).
    pub only: Option<String>,
    /// Waits the two racing processes of `resume_conflicts_per_s_sqlite`
    /// each try to resume.
    pub race_waits: usize,
    /// Runs the three drivers of `drive_runs_per_s_sqlite_3procs` complete.
    pub drive_runs: usize,
    /// Runs of the PostgreSQL hosts figures (`wf_per_s_postgres_*`): long
    /// enough that process starts do not dominate.
    pub hosts_runs: usize,
    /// Rounds of the hostile corpus (`hostile_contained_per_s`): each runs
    /// every fast-failing hostile mode once, then a well-behaved run.
    pub hostile_rounds: usize,
    /// Whether the per-language figures (`lang_*`: a contract node in
    /// Rust, C, Python and JavaScript) are measured: not with `--quick`
    /// unless `--only` names them (compiling Python and JavaScript takes
    /// some 12 s).
    pub languages: bool,
    /// The `stepwell` binary the multi-process benchmarks start (default:
    /// the one beside this binary).
    pub exe: Option<PathBuf>,
    /// Occurrences per batch of `automation_occurrences_per_s_sqlite`.
    pub automation_occurrences: usize,
    /// Commands per batch of `automation_commands_per_s_sqlite`.
    pub automation_commands: usize,
    /// Batches of both automation benchmarks (a fresh automation each).
    pub automation_batches: usize,
    /// The HTTP load test's size (`http_*`).
    pub http: super::http::HttpLoad,
    /// A PostgreSQL server (`postgres://...`, from `--store`): the chain,
    /// ask/resume and three-driver benchmarks run on it too, each in a
    /// schema of its own that is dropped afterwards.
    pub postgres: Option<String>,
    /// Print each figure (`name value`) as soon as it is measured, for a
    /// person watching a terminal.
    pub live: bool,
}

/// The figures measured so far, in order; printed one by one as they
/// come when `live`.
struct Figures {
    map: Map<String, Value>,
    live: bool,
}

impl Figures {
    fn insert(&mut self, name: String, value: Value) {
        if self.live {
            println!("{name:32} {value}");
        }
        self.map.insert(name, value);
    }

    fn extend(&mut self, more: Map<String, Value>) {
        for (name, value) in more {
            self.insert(name, value);
        }
    }
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            flows_dir: PathBuf::from("flows"),
            dispatch_samples: 5_000,
            chain_len: 1_000,
            chain_repeats: 25,
            cycles_per_batch: 500,
            cycle_batches: 5,
            only: None,
            race_waits: 400,
            drive_runs: 300,
            hosts_runs: 2_000,
            hostile_rounds: 60,
            languages: true,
            exe: None,
            automation_occurrences: 100,
            automation_commands: 200,
            automation_batches: 3,
            http: super::http::HttpLoad {
                webhooks: 2_000,
                starts: 1_000,
                start_clients: 16,
                resumes: 200,
                subscribers: 10,
            },
            postgres: None,
            live: false,
        }
    }
}

impl BenchOptions {
    /// `--quick`: fewer samples, a quick look, not a measurement.
    pub fn quick(&mut self) {
        self.dispatch_samples = 500;
        self.chain_repeats = 1;
        self.cycles_per_batch = 50;
        self.cycle_batches = 1;
        self.race_waits = 50;
        self.drive_runs = 30;
        self.hosts_runs = 200;
        self.hostile_rounds = 5;
        self.languages = false;
        self.automation_occurrences = 20;
        self.automation_commands = 40;
        self.automation_batches = 1;
        self.http.starts = 100;
        self.http.webhooks = 100;
        self.http.resumes = 40;
        self.http.subscribers = 3;
    }
}

/// The `stepwell` binary beside this one (the multi-process benchmarks
/// start it), or an error saying how to build it.
pub(super) fn stepwell_exe() -> Result<PathBuf> {
    let me = std::env::current_exe().map_err(|e| bench_err(e.to_string()))?;
    let exe = me.with_file_name(format!("stepwell{}", std::env::consts::EXE_SUFFIX));
    if !exe.is_file() {
        return Err(bench_err(format!(
            "{} not found: build it with `cargo build --release`",
            exe.display()
        )));
    }
    Ok(exe)
}

/// A benchmark that could not run or whose check failed.
pub(super) fn bench_err(message: impl Into<String>) -> Error {
    invalid("bench", message)
}

pub(super) fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::InvalidInput {
        field: field.into(),
        message: message.into(),
    }
}

/// The median of `xs` (NaN for none).
pub(super) fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    if xs.is_empty() {
        return f64::NAN;
    }
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

/// A scratch directory of the benchmark, removed when dropped.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    pub(super) fn new(tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "stepwell-bench-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| invalid("bench", e.to_string()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // `STEPWELL_BENCH_KEEP=1` keeps the stores, to look into them.
        if std::env::var_os("STEPWELL_BENCH_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn write_chain(dir: &Path, component: &Path, len: usize) -> Result<()> {
    let mut nodes = Map::new();
    for i in 0..len {
        let mut node = json!({ "component": component });
        if i + 1 < len {
            node["next"] = json!(format!("n{}", i + 1));
        } else {
            node["config"] = json!({ "last": true });
        }
        nodes.insert(format!("n{i}"), node);
    }
    let doc = json!({ "workflow_id": "bench.chain", "entry": "n0", "nodes": nodes });
    std::fs::write(dir.join("flow.json"), doc.to_string())
        .map_err(|e| invalid("bench", e.to_string()))
}

/// The median steps per second of `repeats` runs (at least one) of the
/// `bench.chain` flow of `len` nodes ([`write_chain`]'s) loaded in `rt`,
/// each ticked to its end; a run that does not complete with
/// `{"steps": len}` fails the benchmark.
pub(super) fn chain_runs(rt: &Runtime, len: usize, repeats: usize) -> Result<f64> {
    let mut rates = Vec::with_capacity(repeats.max(1));
    for _ in 0..repeats.max(1) {
        let id = rt.start("bench.chain", StartOptions::default())?;
        let t = Instant::now();
        let state = rt.tick(&id)?;
        let secs = t.elapsed().as_secs_f64();
        if state.status != RunStatus::Completed || state.output != Some(json!({"steps": len})) {
            return Err(invalid(
                "bench",
                format!(
                    "chain ended {:?}: {:?} {:?}",
                    state.status, state.output, state.error
                ),
            ));
        }
        rates.push(len as f64 / secs);
    }
    Ok(median(rates))
}

/// The raw commit ceiling of SQLite here: transactions of one run-row
/// upsert and one ledger append (a step's writes, with payloads the size of
/// a chain step's, into tables shaped as the store's: a ledger of ids with
/// its `(run_id, seq)` index), on a connection set up as the store's, per
/// second (median of the repeats).
pub(super) fn raw_commits(len: usize, repeats: usize, path: &Path) -> Result<f64> {
    let db = |e: rusqlite::Error| invalid("bench", e.to_string());
    let conn = stepwell::store::open_sqlite_connection(path).map_err(db)?;
    stepwell::store::configure_sqlite(&conn, stepwell::Durability::Normal).map_err(db)?;
    conn.execute_batch(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL, data TEXT NOT NULL);
         CREATE TABLE ledger (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL);
         CREATE UNIQUE INDEX ledger_run ON ledger(run_id, seq);",
    )
    .map_err(db)?;
    let run_data = "x".repeat(600);
    let record_data = "y".repeat(400);
    let mut rates = Vec::new();
    for repeat in 0..repeats {
        let run = format!("raw-{repeat}");
        let t = Instant::now();
        for seq in 1..=len as i64 {
            let tx = conn.unchecked_transaction().map_err(db)?;
            tx.prepare_cached(
                "INSERT INTO runs (run_id, status, version, data) VALUES (?1, 'running', ?2, ?3)
                 ON CONFLICT(run_id) DO UPDATE SET version = excluded.version, data = excluded.data",
            )
            .and_then(|mut st| st.execute(rusqlite::params![run, seq, run_data]))
            .map_err(db)?;
            tx.prepare_cached("INSERT INTO ledger (run_id, seq, data) VALUES (?1, ?2, ?3)")
                .and_then(|mut st| st.execute(rusqlite::params![run, seq, record_data]))
                .map_err(db)?;
            tx.commit().map_err(db)?;
        }
        rates.push(len as f64 / t.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

/// A call on an instance made for it and dropped after it, as a call
/// without instances made ahead or dropped elsewhere costs.
fn instantiate_call_drop(
    component: &Arc<stepwell::wasm::NodeComponent>,
    call: &NodeCall<'_>,
) -> std::result::Result<(), stepwell::GuestError> {
    let mut session = component.session_made_now()?;
    let out = session.call(call).map(|_| ());
    session.discard();
    out
}

fn runtime(store: Arc<dyn Store>, engine: &WasmEngine) -> Result<Runtime> {
    stepwell::builder(store).engine(engine.clone()).build()
}

/// The median time of deploying the bundle at `dir` again unchanged (its
/// flow files read and validated, its files collected and hashed, the
/// store asked: nothing recorded), in milliseconds.
fn deploy_unchanged(rt: &Runtime, dir: &Path) -> Result<f64> {
    rt.deploy(dir, None)?;
    let mut samples = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let d = rt.deploy(dir, None)?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        if !d.unchanged() {
            return Err(invalid(
                "bench",
                "an unchanged bundle deployed a new version",
            ));
        }
    }
    Ok(median(samples))
}

/// Runs every benchmark and returns the figures as one JSON object.
pub fn run(options: &BenchOptions) -> Result<Value> {
    let scratch = Scratch::new("run")?;
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(scratch.0.join("cache")),
        ..EngineConfig::default()
    })?;
    let step = options.flows_dir.join("examples/chain/step.wasm");
    let step = step.canonicalize().map_err(|e| {
        invalid(
            "flows_dir",
            format!(
                "{}: {e} (build the guests first: scripts/build-guests)",
                step.display()
            ),
        )
    })?;

    let want = |key: &str| options.only.as_deref().is_none_or(|o| key.contains(o));
    let mut figures = Figures {
        map: Map::new(),
        live: options.live,
    };
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);

    // 1. Dispatch: a call of a trivial node through the instance a run's
    //    tick keeps (as the step loop makes it), and a call through a fresh
    //    instance (the first step of a tick).
    let component = engine.load_node(&step)?;
    let vars_json = "{\"i\":1}".to_string();
    let call = NodeCall {
        run_id: "bench",
        workflow_id: "bench",
        node_id: "n0",
        config_json: None,
        vars_json: &vars_json,
        now: chrono::Utc::now(),
        attempt: 1,
        seed: 1,
    };
    let guest = |e: stepwell::GuestError| invalid("bench", e.to_string());
    if want("node_dispatch_us_p50") {
        let mut session = component.session().map_err(guest)?;
        let mut samples = Vec::with_capacity(options.dispatch_samples);
        for i in 0..(options.dispatch_samples + 200) {
            if session.calls() >= 5_000 {
                session = component.session().map_err(guest)?;
            }
            let t = Instant::now();
            session.call(&call).map_err(guest)?;
            if i >= 200 {
                samples.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        figures.insert(
            "node_dispatch_us_p50".into(),
            json!(round(median(samples), 2)),
        );
    }
    if want("node_instantiate_us_p50") {
        for _ in 0..200 {
            instantiate_call_drop(&component, &call).map_err(guest)?;
        }
        let mut samples = Vec::with_capacity(options.dispatch_samples);
        for _ in 0..options.dispatch_samples {
            let t = Instant::now();
            instantiate_call_drop(&component, &call).map_err(guest)?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        figures.insert(
            "node_instantiate_us_p50".into(),
            json!(round(median(samples), 2)),
        );
    }

    // 1b. The same contract node in each language.
    let named = options.only.as_deref().is_some_and(|o| o.contains("lang_"));
    if (options.languages && want("lang_")) || named {
        figures.extend(crate::languages::measure(
            &options.flows_dir,
            &scratch.0,
            options.dispatch_samples.min(2_000),
            (options.chain_len, options.chain_repeats.min(5)),
        )?);
    }

    // 2. A chain of WASM nodes, in memory and on SQLite.
    let chain_dir = scratch.0.join("chain");
    std::fs::create_dir_all(&chain_dir).map_err(|e| invalid("bench", e.to_string()))?;
    write_chain(&chain_dir, &step, options.chain_len)?;
    let chain_traced = |store: Arc<dyn Store>, tracer: Tracer| -> Result<f64> {
        let rt = stepwell::builder(store)
            .engine(engine.clone())
            .tracer(tracer)
            .build()?;
        rt.load_bundle(&chain_dir)?;
        chain_runs(&rt, options.chain_len, options.chain_repeats)
    };
    let chain = |store: Arc<dyn Store>| chain_traced(store, Tracer::off());
    if want("chain_traced_steps_per_s_memory") {
        // The same chain with every span sent to a collector on loopback.
        let sink = crate::traced::Sink::start()?;
        let exporter =
            stepwell::otlp::OtlpExporter::start(stepwell::otlp::OtlpConfig::new(&sink.endpoint))
                .map_err(|e| invalid("bench", e.to_string()))?;
        let exporter = Arc::new(exporter);
        let rate = chain_traced(Arc::new(MemoryStore::new()), Tracer::new(exporter.clone()))?;
        crate::traced::check(&sink, &exporter, options.chain_len * options.chain_repeats)?;
        figures.insert(
            "chain_traced_steps_per_s_memory".into(),
            json!(round(rate, 0)),
        );
    }
    if want("chain_steps_per_s_memory") {
        let rate = chain(Arc::new(MemoryStore::new()))?;
        figures.insert("chain_steps_per_s_memory".into(), json!(round(rate, 0)));
    }
    if want("chain_steps_per_s_json") {
        let rate = chain(Arc::new(JsonFileStore::open(scratch.0.join("chain-json"))?))?;
        figures.insert("chain_steps_per_s_json".into(), json!(round(rate, 0)));
    }
    if want("ledger_append_per_s_sqlite") {
        let store = SqliteStore::open(scratch.0.join("ledger.sqlite"))?;
        let record = |run: &str, n: usize| stepwell::StepRecord {
            step_id: format!("{run}-{n}"),
            run_id: run.to_string(),
            node_id: Some("n".into()),
            status: stepwell::StepStatus::Completed,
            effect: None,
            result: Some(json!({ "next_node": "m" })),
            error: None,
            started_at: "2026-11-30T09:00:00.000000Z".into(),
            ended_at: Some("2026-11-30T09:00:00.000000Z".into()),
            attempt: 1,
            idempotency_key: None,
            prev_hash: None,
            record_hash: None,
            vars: None,
            input: None,
        };
        let mut rates = Vec::new();
        for batch in 0..options.chain_repeats {
            let run = format!("bench-ledger-{batch}");
            let t = Instant::now();
            for n in 0..options.chain_len {
                store.append_records(&[record(&run, n)])?;
            }
            rates.push(options.chain_len as f64 / t.elapsed().as_secs_f64());
        }
        figures.insert(
            "ledger_append_per_s_sqlite".into(),
            json!(round(median(rates), 0)),
        );
    }
    if want("sqlite_raw_commit_per_s") {
        let rate = raw_commits(
            options.chain_len,
            options.chain_repeats,
            &scratch.0.join("raw.sqlite"),
        )?;
        figures.insert("sqlite_raw_commit_per_s".into(), json!(round(rate, 0)));
    }
    if want("deploy_unchanged_ms_sqlite") {
        let rt = runtime(
            Arc::new(SqliteStore::open(scratch.0.join("deploy.sqlite"))?),
            &engine,
        )?;
        let ms = deploy_unchanged(&rt, &options.flows_dir.join("examples/ask-user"))?;
        figures.insert("deploy_unchanged_ms_sqlite".into(), json!(round(ms, 2)));
    }
    if want("chain_steps_per_s_sqlite") {
        let rate = chain(Arc::new(SqliteStore::open(scratch.0.join("chain.sqlite"))?))?;
        figures.insert("chain_steps_per_s_sqlite".into(), json!(round(rate, 0)));
    }
    if let Some(server) = &options.postgres {
        if want("chain_steps_per_s_postgres") {
            let schema = BenchSchema::new(server, "chain")?;
            let rate = chain(Arc::new(PostgresStore::open(&schema.url)?))?;
            figures.insert("chain_steps_per_s_postgres".into(), json!(round(rate, 0)));
        }
        if want("drive_runs_per_s_postgres_3procs") {
            let schema = BenchSchema::new(server, "drive")?;
            let dir = scratch.0.join("drive-postgres");
            std::fs::create_dir_all(&dir).map_err(|e| invalid("bench", e.to_string()))?;
            let rate = drive_three(options, &StoreSpec::Postgres(schema.url.clone()), &dir)?;
            figures.insert(
                "drive_runs_per_s_postgres_3procs".into(),
                json!(round(rate, 0)),
            );
        }
        if want("wf_per_s_postgres_") {
            // One backlog, driven by 1, 2 and 3 hosts (processes) in turn;
            // with what the machine's cores and the database did meanwhile.
            let mut rates = Vec::new();
            for hosts in 1..=3 {
                let schema = BenchSchema::new(server, &format!("hosts{hosts}"))?;
                let dir = scratch.0.join(format!("hosts-{hosts}"));
                std::fs::create_dir_all(&dir).map_err(|e| invalid("bench", e.to_string()))?;
                let spec = StoreSpec::Postgres(schema.url.clone());
                let drove = drive_hosts(options, &spec, &dir, hosts, options.hosts_runs)?;
                let name = if hosts == 1 {
                    "1host".to_string()
                } else {
                    format!("{hosts}hosts")
                };
                figures.insert(
                    format!("wf_per_s_postgres_{name}"),
                    json!(round(drove.rate, 0)),
                );
                if let Some(cpu) = drove.cpu {
                    figures.insert(
                        format!("wf_postgres_{name}_cpu_ms_per_wf"),
                        json!(round(cpu.busy_ms / drove.runs as f64, 2)),
                    );
                    figures.insert(
                        format!("wf_postgres_{name}_idle_pct"),
                        json!(round(cpu.idle_pct, 1)),
                    );
                }
                if let Some(x) = drove.xacts {
                    figures.insert(
                        format!("wf_postgres_{name}_xacts_per_wf"),
                        json!(round(x as f64 / drove.runs as f64, 1)),
                    );
                }
                rates.push(drove.rate);
            }
            figures.insert(
                "wf_postgres_3hosts_over_1host".into(),
                json!(round(rates[2] / rates[0], 2)),
            );
        }
        if want("ask_resume_cycles_per_s_postgres") {
            let schema = BenchSchema::new(server, "ask")?;
            let rt = runtime(Arc::new(PostgresStore::open(&schema.url)?), &engine)?;
            figures.insert(
                "ask_resume_cycles_per_s_postgres".into(),
                json!(round(ask_resume(&rt, options)?, 0)),
            );
        }
    }
    // 3. One `prepare` call on schedule@1, through the component.
    if want("trigger_prepare_us_p50") {
        let registry = stepwell::triggers::TriggerRegistry::load(&engine, None)?;
        let source = registry.get("schedule@1")?;
        let now = "2026-11-30T09:00:00Z";
        let config = source.validate(&json!({"every": "5m"}), now)?;
        let binding = stepwell::triggers::Binding {
            binding_id: "bench".into(),
            source_id: "schedule".into(),
            source_version: 1,
            config,
        };
        let state = source.initial_state(&binding, now)?;
        for _ in 0..200 {
            source.prepare(&binding, &state, now, &[])?;
        }
        let mut samples = Vec::with_capacity(options.dispatch_samples);
        for _ in 0..options.dispatch_samples {
            let t = Instant::now();
            source.prepare(&binding, &state, now, &[])?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        figures.insert(
            "trigger_prepare_us_p50".into(),
            json!(round(median(samples), 2)),
        );
    }
    if want("hostile_contained_per_s") {
        let rate = hostile_contained(options, &engine, &scratch.0.join("hostile"))?;
        figures.insert("hostile_contained_per_s".into(), json!(round(rate, 0)));
    }
    if want("resume_conflicts_per_s_sqlite") {
        let rate = resume_conflicts(options, &scratch.0.join("race"))?;
        figures.insert(
            "resume_conflicts_per_s_sqlite".into(),
            json!(round(rate, 0)),
        );
    }
    if want("drive_runs_per_s_sqlite_3procs") {
        let dir = scratch.0.join("drive");
        std::fs::create_dir_all(&dir).map_err(|e| invalid("bench", e.to_string()))?;
        let rate = drive_three(options, &StoreSpec::Sqlite(dir.join("drive.sqlite")), &dir)?;
        figures.insert(
            "drive_runs_per_s_sqlite_3procs".into(),
            json!(round(rate, 0)),
        );
    }
    if want("automation_occurrences_per_s_sqlite") {
        let rate = automation_occurrences(options, &engine, &scratch.0.join("automation"))?;
        figures.insert(
            "automation_occurrences_per_s_sqlite".into(),
            json!(round(rate, 1)),
        );
    }
    if want("llm_call_overhead_us_p50") {
        let us = llm_call_overhead(options, &engine, &scratch.0.join("llm"))?;
        figures.insert("llm_call_overhead_us_p50".into(), json!(round(us, 1)));
    }
    if want("tool_call_us_p50") {
        let us = tool_call(options, &engine, &scratch.0.join("tools"))?;
        figures.insert("tool_call_us_p50".into(), json!(round(us, 1)));
    }
    if want("history_window_us_p50") {
        let us = history_window(options, &engine)?;
        figures.insert("history_window_us_p50".into(), json!(round(us, 1)));
    }
    if want("http_start_runs_per_s") || want("http_resume_p99_ms") {
        figures.extend(super::http::http_load(
            &options.http,
            &options.flows_dir,
            &engine,
            &scratch.0.join("http"),
        )?);
    }
    if want("webhook_accept_per_s") {
        figures.extend(super::http::webhook_load(
            &options.http,
            &engine,
            &scratch.0.join("hooks"),
        )?);
    }
    if want("automation_commands_per_s_sqlite") {
        let rate = automation_commands(options, &engine, &scratch.0.join("commands"))?;
        figures.insert(
            "automation_commands_per_s_sqlite".into(),
            json!(round(rate, 1)),
        );
    }
    if !want("ask_resume_cycles_per_s_sqlite") {
        return Ok(Value::Object(figures.map));
    }

    // 4. Start, park on ask_user, resume, complete: on SQLite.
    let rt = runtime(
        Arc::new(SqliteStore::open(scratch.0.join("ask.sqlite"))?),
        &engine,
    )?;
    figures.insert(
        "ask_resume_cycles_per_s_sqlite".into(),
        json!(round(ask_resume(&rt, options)?, 0)),
    );
    Ok(Value::Object(figures.map))
}

/// Ask/resume cycles per second on `rt`'s store: start, park on
/// ask_user, resume, complete (the median of the batches).
fn ask_resume(rt: &Runtime, options: &BenchOptions) -> Result<f64> {
    let bundle = rt.load_bundle(&options.flows_dir.join("examples/ask-user"))?;
    let mut rates = Vec::new();
    for _ in 0..options.cycle_batches {
        let t = Instant::now();
        for _ in 0..options.cycles_per_batch {
            let parked = rt.run(&bundle.main_workflow_id, StartOptions::default())?;
            let id = parked.run_id.clone();
            let key = parked
                .waiting
                .as_ref()
                .map(|w| w.wait_key.clone())
                .ok_or_else(|| invalid("bench", "ask-user did not park"))?;
            let done = rt.resume(&id, &key, json!({ "text": "Bob" }))?;
            if done.status != RunStatus::Completed {
                return Err(invalid("bench", "ask-user did not complete"));
            }
        }
        rates.push(options.cycles_per_batch as f64 / t.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

/// A schema of its own on a PostgreSQL server for one benchmark, dropped
/// when done.
struct BenchSchema {
    server: String,
    name: String,
    url: String,
}

impl BenchSchema {
    fn new(server: &str, what: &str) -> Result<BenchSchema> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
        let name = format!("stepwell_bench_{what}_{}_{nanos}", std::process::id());
        let sep = if server.contains('?') { '&' } else { '?' };
        Ok(BenchSchema {
            server: server.to_string(),
            url: format!("{server}{sep}options=-csearch_path%3D{name}"),
            name,
        })
    }
}

impl Drop for BenchSchema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.server, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name));
        }
    }
}

/// A chat-completions server on loopback that answers every request at
/// once with the same completion (keeping connections open); returns its
/// base URL.
fn instant_llm_server() -> Result<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| invalid("bench", e.to_string()))?;
    let port = listener
        .local_addr()
        .map_err(|e| invalid("bench", e.to_string()))?
        .port();
    let body = json!({"id": "c", "object": "chat.completion", "model": "bench",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
    .to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let body = body.clone();
            std::thread::spawn(move || {
                let _ = stream.set_nodelay(true);
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end().to_ascii_lowercase();
                        if h.is_empty() {
                            break;
                        }
                        if let Some(v) = h.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut buf = vec![0; length];
                    if reader.read_exact(&mut buf).is_err() {
                        return;
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    if writer.write_all(head.as_bytes()).is_err()
                        || writer.write_all(body.as_bytes()).is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(format!("http://127.0.0.1:{port}/v1"))
}

/// The host's time for a run of one `llm_call` node (start, the request
/// to a loopback server that answers at once, the recorded outcome, the
/// commit), memory store, warm: median, in microseconds.
fn llm_call_overhead(options: &BenchOptions, engine: &WasmEngine, dir: &Path) -> Result<f64> {
    use stepwell::llm::LlmCall;
    use stepwell::llm::{Provider, Providers};
    let url = instant_llm_server()?;
    let provider = Provider {
        timeout_s: Some(10.0),
        ..Provider::new("bench", &url, Some("bench"))
    };
    let rt = stepwell::builder(Arc::new(MemoryStore::new()))
        .engine(engine.clone())
        .effect(Arc::new(LlmCall::new(Providers::only(provider))))
        .build()?;
    std::fs::create_dir_all(dir).map_err(|e| invalid("bench", e.to_string()))?;
    let doc = json!({"workflow_id": "bench.llm", "entry": "ask", "nodes": {
        "ask": {"effect": "llm_call", "payload": {"prompt": "hi"}, "result_key": "answer", "next": "end"},
        "end": {"complete": {"$var": "answer.content"}}}});
    std::fs::write(dir.join("flow.json"), doc.to_string())
        .map_err(|e| invalid("bench", e.to_string()))?;
    rt.load_bundle(dir)?;
    let samples = options.dispatch_samples.clamp(50, 2_000);
    let mut times = Vec::with_capacity(samples);
    for i in 0..(samples + 50) {
        let t = Instant::now();
        let run = rt.run("bench.llm", StartOptions::default())?;
        if run.status != RunStatus::Completed {
            return Err(invalid(
                "bench",
                format!("the llm run ended {:?}: {:?}", run.status, run.error),
            ));
        }
        if i >= 50 {
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(times))
}

/// The host's time for a run of one `tool_calls` node that reads a small
/// file with the built-in `read_file` tool (start, the scope checks, a
/// fresh sandboxed instance with the workspace preopened, the recorded
/// outcome, the commit), memory store, warm: median, in microseconds.
fn tool_call(options: &BenchOptions, engine: &WasmEngine, dir: &Path) -> Result<f64> {
    let rt = stepwell::builder(Arc::new(MemoryStore::new()))
        .engine(engine.clone())
        .build()?;
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).map_err(|e| invalid("bench", e.to_string()))?;
    std::fs::write(ws.join("notes.txt"), "one\ntwo\nthree\n")
        .map_err(|e| invalid("bench", e.to_string()))?;
    let doc = json!({"workflow_id": "bench.tools", "entry": "read", "nodes": {
        "read": {"effect": "tool_calls", "result_key": "out", "next": "end",
                 "payload": {"tool_calls": [{"name": "read_file", "arguments": {"file_path": "notes.txt"}}]}},
        "end": {"complete": {"$var": "out.results.0.success"}}}});
    std::fs::write(dir.join("flow.json"), doc.to_string())
        .map_err(|e| invalid("bench", e.to_string()))?;
    rt.load_bundle(dir)?;
    let mut vars = Map::new();
    vars.insert("workspace_root".into(), json!(ws.to_string_lossy()));
    let samples = options.dispatch_samples.clamp(50, 2_000);
    let mut times = Vec::with_capacity(samples);
    for i in 0..(samples + 50) {
        let t = Instant::now();
        let run = rt.run(
            "bench.tools",
            StartOptions {
                vars: vars.clone(),
                ..StartOptions::default()
            },
        )?;
        if run.output != Some(json!(true)) {
            return Err(invalid(
                "bench",
                format!(
                    "the tool run ended {:?}: {:?} {:?}",
                    run.status, run.error, run.output
                ),
            ));
        }
        if i >= 50 {
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(times))
}

/// The history of a 500-turn session (each turn ~105 estimated tokens)
/// read and folded into the default 50,000-token window, as a growing
/// automation's admission reads it: turns selected from the run index,
/// their runs loaded, prompts and answers extracted, the window folded
/// (some turns dropped, the notice written). On the memory store, so the
/// figure is the host's work, not the disk's.
fn history_window(options: &BenchOptions, engine: &WasmEngine) -> Result<f64> {
    use stepwell::sessions::{session_chat_messages, HistoryOptions};
    let store = Arc::new(MemoryStore::new());
    let rt = stepwell::builder(store.clone())
        .engine(engine.clone())
        .build()?;
    let answer = "The figure held steady at forty-one percent. ".repeat(9);
    for i in 0..500u32 {
        let at = format!(
            "2026-01-01T{:02}:{:02}:{:02}+00:00",
            i / 3600,
            (i / 60) % 60,
            i % 60
        );
        let mut vars = Map::new();
        vars.insert(
            "prompt".into(),
            json!(format!("How is memory now? (turn {i})")),
        );
        let run = stepwell::RunState {
            version: 1,
            run_id: format!("turn-{i:04}"),
            workflow_id: "chat".into(),
            workflow_version: None,
            status: RunStatus::Completed,
            current_node: None,
            vars,
            waiting: None,
            output: Some(json!({"response": answer})),
            error: None,
            created_at: at.clone(),
            updated_at: at,
            actor_id: None,
            session_id: Some("bench-session".into()),
            parent_run_id: None,
        };
        store.create_if_absent(&run)?;
    }
    let samples = (options.dispatch_samples / 10).clamp(20, 200);
    let mut times = Vec::with_capacity(samples);
    for i in 0..(samples + 5) {
        let t = Instant::now();
        let history = session_chat_messages(&rt, "bench-session", &HistoryOptions::default())?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        if history.report.dropped_messages == 0 || history.messages.is_empty() {
            return Err(invalid(
                "bench",
                "the 500-turn history did not fill the window",
            ));
        }
        if i >= 5 {
            times.push(us);
        }
    }
    Ok(median(times))
}

/// The `stepwell` binary the multi-process benchmarks start.
fn exe(options: &BenchOptions) -> Result<PathBuf> {
    match &options.exe {
        Some(p) => Ok(p.clone()),
        None => stepwell_exe(),
    }
}

/// A runtime on the SQLite file `db` the way the CLI opens it.
pub(super) fn cli_runtime(db: &Path) -> Result<Runtime> {
    stepwell::host::open_runtime(
        &stepwell::host::StoreSpec::Sqlite(db.to_path_buf()),
        &stepwell::host::HostOptions::default(),
    )
}

/// Two processes resume the same `race_waits` parked runs, in the same
/// order, at the same time: each wait is resumed once, and every other try
/// is a conflict detected (a stale resume). Returns conflicts per second of
/// the race.
fn resume_conflicts(options: &BenchOptions, dir: &Path) -> Result<f64> {
    std::fs::create_dir_all(dir).map_err(|e| invalid("bench", e.to_string()))?;
    let db = dir.join("race.sqlite");
    let rt = cli_runtime(&db)?;
    let bundle = rt.load_bundle(&options.flows_dir.join("examples/ask-user"))?;
    let mut ids = Vec::with_capacity(options.race_waits);
    for _ in 0..options.race_waits {
        ids.push(
            rt.run(&bundle.main_workflow_id, StartOptions::default())?
                .run_id,
        );
    }
    drop(rt);
    let list = dir.join("runs.txt");
    std::fs::write(&list, ids.join("\n")).map_err(|e| invalid("bench", e.to_string()))?;
    let start = Instant::now();
    let workers: Vec<std::process::Child> = ["A", "B"]
        .iter()
        .map(|who| {
            std::process::Command::new(
                std::env::current_exe().map_err(|e| invalid("bench", e.to_string()))?,
            )
            .arg("resume-all")
            .arg("--db")
            .arg(&db)
            .arg(&list)
            .arg(who)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| invalid("bench", e.to_string()))
        })
        .collect::<Result<_>>()?;
    let mut conflicts = 0;
    let mut resumed = 0;
    for w in workers {
        let out = w
            .wait_with_output()
            .map_err(|e| invalid("bench", e.to_string()))?;
        let report: Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| invalid("bench", format!("a race worker failed: {e}")))?;
        conflicts += report["conflicts"].as_u64().unwrap_or(0);
        resumed += report["resumed"].as_u64().unwrap_or(0);
    }
    let secs = start.elapsed().as_secs_f64();
    if resumed != options.race_waits as u64 {
        return Err(invalid(
            "bench",
            format!("{resumed} resumes of {} waits won", options.race_waits),
        ));
    }
    Ok(conflicts as f64 / secs)
}

/// Three `stepwell drive` processes complete `drive_runs` chain runs on one
/// store (a SQLite file, or a PostgreSQL database as three hosts would
/// share it). Returns runs completed per second.
fn drive_three(options: &BenchOptions, spec: &StoreSpec, dir: &Path) -> Result<f64> {
    drive_hosts(options, spec, dir, 3, options.drive_runs).map(|d| d.rate)
}

/// What [`drive_hosts`] measured.
struct Drove {
    /// Workflows per second.
    rate: f64,
    runs: usize,
    /// The machine's cores meanwhile (Linux).
    cpu: Option<CpuUse>,
    /// Transactions the database committed meanwhile (PostgreSQL).
    xacts: Option<i64>,
}

/// The machine's CPU use over an interval, from `/proc/stat`.
struct CpuUse {
    /// CPU time spent busy, all cores, in ms.
    busy_ms: f64,
    /// The share of the cores' time spent idle.
    idle_pct: f64,
}

/// The machine's busy and idle CPU ticks so far (Linux).
fn cpu_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let n: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let idle = n.get(3)? + n.get(4)?;
    let busy = n.iter().take(8).sum::<u64>() - idle;
    Some((busy, idle))
}

/// The CPU use between two [`cpu_ticks`] readings.
fn cpu_between(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<CpuUse> {
    let ((b0, i0), (b1, i1)) = (before?, after?);
    let (busy, idle) = ((b1 - b0) as f64, (i1 - i0) as f64);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(CpuUse {
        busy_ms: busy * 1000.0 / hz,
        idle_pct: 100.0 * idle / (busy + idle).max(1.0),
    })
}

/// A connection of the benchmark's own to the store the drivers share:
/// it counts what is left, in one query.
enum Counter {
    Postgres(Box<postgres::Client>),
    Sqlite(rusqlite::Connection),
}

impl Counter {
    fn open(spec: &StoreSpec) -> Result<Counter> {
        let e = |e: String| invalid("bench", e);
        match spec {
            StoreSpec::Postgres(url) => postgres::Client::connect(url, postgres::NoTls)
                .map(|c| Counter::Postgres(Box::new(c)))
                .map_err(|x| e(x.to_string())),
            StoreSpec::Sqlite(path) => rusqlite::Connection::open(path)
                .map(Counter::Sqlite)
                .map_err(|x| e(x.to_string())),
            other => Err(e(format!("no drivers on {other}"))),
        }
    }

    /// How many runs are not completed.
    fn left(&mut self) -> Result<i64> {
        const LEFT: &str = "SELECT count(*) FROM runs WHERE status <> 'completed'";
        match self {
            Counter::Postgres(db) => db
                .query_one(LEFT, &[])
                .map(|r| r.get(0))
                .map_err(|e| e.to_string()),
            Counter::Sqlite(db) => db
                .query_row(LEFT, [], |r| r.get(0))
                .map_err(|e| e.to_string()),
        }
        .map_err(|e| invalid("bench", e))
    }

    /// The transactions the database has committed so far (PostgreSQL).
    fn xacts(&mut self) -> Option<i64> {
        let Counter::Postgres(db) = self else {
            return None;
        };
        db.query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .ok()
        .map(|row| row.get(0))
    }
}

/// `hosts` `stepwell drive` processes complete `runs` runs of
/// `flows/examples/chain` on one store: runs completed per second, process
/// start included, with the machine's CPU and the database's transactions
/// meanwhile.
fn drive_hosts(
    options: &BenchOptions,
    spec: &StoreSpec,
    dir: &Path,
    hosts: usize,
    runs: usize,
) -> Result<Drove> {
    let rt = stepwell::host::open_runtime(spec, &stepwell::host::HostOptions::default())?;
    let mut db = Counter::open(spec)?;
    let store_arg = match spec {
        StoreSpec::Sqlite(p) => format!("sqlite:{}", p.display()),
        StoreSpec::Postgres(url) => url.clone(),
        other => return Err(invalid("bench", format!("no drivers on {other}"))),
    };
    let bundle = rt.load_bundle(&options.flows_dir.join("examples/chain"))?;
    let mut ids = Vec::with_capacity(runs);
    for _ in 0..runs {
        ids.push(rt.start(&bundle.main_workflow_id, StartOptions::default())?);
    }
    let (cpu0, x0) = (cpu_ticks(), db.xacts());
    let start = Instant::now();
    let mut drivers: Vec<std::process::Child> = (0..hosts)
        .map(|_| {
            std::process::Command::new(exe(options)?)
                .arg("--store")
                .arg(&store_arg)
                .args(["drive", "--interval-ms", "5"])
                .current_dir(dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| invalid("bench", e.to_string()))
        })
        .collect::<Result<_>>()?;
    let deadline = Instant::now() + std::time::Duration::from_secs(300);
    // One count every 10 ms (not a read per run: the measuring must not
    // load the database it measures).
    let outcome = loop {
        let left = db.left()?;
        if left == 0 {
            break Ok(runs as f64 / start.elapsed().as_secs_f64());
        }
        if Instant::now() > deadline {
            break Err(invalid("bench", format!("{left} runs never completed")));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let cpu = cpu_between(cpu0, cpu_ticks());
    for d in &mut drivers {
        let _ = d.kill();
        let _ = d.wait();
    }
    let rate = outcome?;
    for id in &ids {
        if rt.get_state(id)?.status != RunStatus::Completed {
            return Err(invalid("bench", format!("run {id} did not complete")));
        }
    }
    // A killed driver's backend reports its statistics as it ends.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let xacts = match (x0, db.xacts()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    Ok(Drove {
        rate,
        runs,
        cpu,
        xacts,
    })
}

/// `stepwell-bench resume-all --db DB FILE WHO`: resumes every run listed in
/// FILE with `{"text": WHO}`, each once, and prints how many resumes won
/// and how many found the wait taken (a conflict detected).
pub fn resume_all(rt: &Runtime, file: &Path, who: &str) -> Result<Value> {
    let text = std::fs::read_to_string(file).map_err(|e| invalid("bench", e.to_string()))?;
    let (mut resumed, mut conflicts) = (0u64, 0u64);
    for id in text.lines().filter(|l| !l.is_empty()) {
        match rt.respond(id, json!({ "text": who })) {
            Ok(_) => resumed += 1,
            Err(Error::StaleResume { .. } | Error::Conflict { .. }) => conflicts += 1,
            Err(e) => return Err(e),
        }
    }
    Ok(json!({ "resumed": resumed, "conflicts": conflicts }))
}

/// The hostile modes that fail fast (a trap, a panic, output that does not
/// parse, a wait, a stack overflow, output over the limit): the corpus of
/// `hostile_contained_per_s`. (`loop` and `alloc` cost their time and
/// memory limits by design, and are left out.)
const HOSTILE_CORPUS: &[(&str, Option<u64>)] = &[
    ("trap", None),
    ("panic", None),
    ("bad_json", None),
    ("bad_vars", None),
    ("unknown_next", None),
    ("sleep", None),
    ("poll", None),
    ("stack", None),
    ("big_output", Some(9 << 20)),
];

/// Hostile guest calls contained per second: each round runs every mode of
/// [`HOSTILE_CORPUS`] as a run of its own on an in-memory store (each must
/// fail with its typed error), then a well-behaved run (which must
/// complete: the host still serves).
fn hostile_contained(options: &BenchOptions, engine: &WasmEngine, dir: &Path) -> Result<f64> {
    let hostile = options
        .flows_dir
        .join("examples/runaway/hostile.wasm")
        .canonicalize()
        .map_err(|e| invalid("flows_dir", format!("hostile.wasm: {e}")))?;
    std::fs::create_dir_all(dir).map_err(|e| invalid("bench", e.to_string()))?;
    let rt = runtime(Arc::new(MemoryStore::new()), engine)?;
    for (mode, bytes) in HOSTILE_CORPUS.iter().chain(&[("ok", None)]) {
        let mut config = json!({ "mode": mode });
        if let Some(b) = bytes {
            config["bytes"] = json!(b);
        }
        let doc = json!({"workflow_id": format!("bench.hostile.{mode}"), "entry": "n",
                         "nodes": {"n": {"component": hostile, "config": config, "next": "end"},
                                   "end": {"complete": {"ok": true}}}});
        let bundle = dir.join(mode);
        std::fs::create_dir_all(&bundle).map_err(|e| invalid("bench", e.to_string()))?;
        std::fs::write(bundle.join("flow.json"), doc.to_string())
            .map_err(|e| invalid("bench", e.to_string()))?;
        rt.load_bundle(&bundle)?;
    }
    let round = || -> Result<usize> {
        for (mode, _) in HOSTILE_CORPUS {
            let state = rt.run(&format!("bench.hostile.{mode}"), StartOptions::default())?;
            if state.status != RunStatus::Failed {
                return Err(invalid(
                    "bench",
                    format!("hostile mode {mode} was not contained: {:?}", state.status),
                ));
            }
        }
        let ok = rt.run("bench.hostile.ok", StartOptions::default())?;
        if ok.status != RunStatus::Completed {
            return Err(invalid("bench", "the host stopped serving"));
        }
        Ok(HOSTILE_CORPUS.len())
    };
    round()?;
    let t = Instant::now();
    let mut calls = 0;
    for _ in 0..options.hostile_rounds {
        calls += round()?;
    }
    Ok(calls as f64 / t.elapsed().as_secs_f64())
}

const AUTOMATION_T0: &str = "2026-01-01T00:00:00Z";

/// A runtime on a fresh SQLite file with a clock the benchmark moves.
fn automation_world(
    engine: &WasmEngine,
    db: &Path,
) -> Result<(Runtime, Arc<stepwell::ManualClock>)> {
    let clock = Arc::new(stepwell::ManualClock::new(
        AUTOMATION_T0.parse().expect("a valid time"),
    ));
    let rt = stepwell::builder(Arc::new(SqliteStore::open(db)?))
        .engine(engine.clone())
        .clock(clock.clone())
        .build()?;
    Ok((rt, clock))
}

fn automation_request(options: &BenchOptions, request_id: &str, every: &str) -> Result<Value> {
    let echo = options.flows_dir.join("automations/echo");
    let echo = echo
        .canonicalize()
        .map_err(|e| invalid("flows_dir", format!("{}: {e}", echo.display())))?;
    Ok(json!({
        "request_id": request_id, "title": "Bench",
        "target": {"workflow_id": "echo", "bundle_ref": echo.display().to_string(), "flow_id": "echo",
                   "input_data": {"prompt": "check memory"}},
        "trigger": {"source_id": "schedule", "source_version": 1,
                    "config": {"start_at": AUTOMATION_T0, "every": every}},
        "workspace_root": "/tmp/automation-ws",
    }))
}

/// `automation_occurrences_per_s_sqlite`: one automation firing every
/// minute; each occurrence moves the clock a minute and runs driver passes
/// until nothing moves (the due wake, admission, dispatch, the `echo`
/// child, the parent's resume, completion). Median of the batches.
fn automation_occurrences(options: &BenchOptions, engine: &WasmEngine, dir: &Path) -> Result<f64> {
    use stepwell::automation::{create_automation, drive_until_idle};
    std::fs::create_dir_all(dir).map_err(|e| invalid("bench", e.to_string()))?;
    let n = options.automation_occurrences.max(1);
    let mut rates = Vec::new();
    for b in 0..options.automation_batches.max(1) {
        let (rt, clock) = automation_world(engine, &dir.join(format!("occ-{b}.sqlite")))?;
        let t0: chrono::DateTime<chrono::Utc> = AUTOMATION_T0.parse().expect("a valid time");
        let request = automation_request(options, &format!("bench-{b}"), "1m")?;
        let id = create_automation(&rt, &request, t0, None)?.automation_id;
        drive_until_idle(&rt, 100)?;
        let t = Instant::now();
        for i in 1..=n {
            clock.set(t0 + chrono::Duration::minutes(i as i64));
            drive_until_idle(&rt, 100)?;
        }
        rates.push(n as f64 / t.elapsed().as_secs_f64());
        let state = rt.get_state(&id)?.vars["_runtime"]["automation"].clone();
        if state["next_index"] != json!(n + 2) || state["last_outcome"]["status"] != "completed" {
            return Err(invalid(
                "bench",
                format!(
                    "automation bench: next_index {} last outcome {}",
                    state["next_index"], state["last_outcome"]
                ),
            ));
        }
    }
    Ok(median(rates))
}

/// `automation_commands_per_s_sqlite`: pause and resume in turn (new
/// command ids) on a parked hourly automation. Median of the batches.
fn automation_commands(options: &BenchOptions, engine: &WasmEngine, dir: &Path) -> Result<f64> {
    use stepwell::automation::{apply_automation_command, create_automation, drive_until_idle};
    std::fs::create_dir_all(dir).map_err(|e| invalid("bench", e.to_string()))?;
    let n = options.automation_commands.max(1);
    let mut rates = Vec::new();
    for b in 0..options.automation_batches.max(1) {
        let (rt, _clock) = automation_world(engine, &dir.join(format!("cmd-{b}.sqlite")))?;
        let t0: chrono::DateTime<chrono::Utc> = AUTOMATION_T0.parse().expect("a valid time");
        let request = automation_request(options, &format!("cmd-{b}"), "1h")?;
        let id = create_automation(&rt, &request, t0, None)?.automation_id;
        drive_until_idle(&rt, 100)?;
        let t = Instant::now();
        for i in 0..n {
            let kind = if i % 2 == 0 { "pause" } else { "resume" };
            let command_id = format!("c{i}");
            let answer = apply_automation_command(
                &rt,
                &stepwell::automation::Command {
                    automation_id: &id,
                    command_id: &command_id,
                    command_type: kind,
                    ..Default::default()
                },
                t0,
            )?;
            if answer["status"] != "applied" {
                return Err(invalid("bench", format!("command bench: {answer}")));
            }
        }
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

//! The benchmarks behind `stepwell bench`: medians over repeated runs, all in
//! one process so the figures compare.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::core::Result;
use crate::store::{JsonFileStore, MemoryStore, SqliteStore, Store};
use crate::wasm::{EngineConfig, NodeCall, WasmEngine};
use crate::{Error, RunStatus, Runtime, StartOptions};

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
    /// `trigger`).
    pub only: Option<String>,
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
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
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

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "stepwell-bench-{tag}-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| Error::invalid("bench", e.to_string()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_chain(dir: &Path, component: &Path, len: usize) -> Result<()> {
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
        .map_err(|e| Error::invalid("bench", e.to_string()))
}

fn runtime(store: Arc<dyn Store>, engine: &WasmEngine) -> Result<Runtime> {
    Runtime::builder(store).engine(engine.clone()).build()
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
        Error::invalid(
            "flows_dir",
            format!(
                "{}: {e} (build the guests first: scripts/build-guests)",
                step.display()
            ),
        )
    })?;

    let want = |key: &str| options.only.as_deref().is_none_or(|o| key.contains(o));
    let mut figures = Map::new();
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);

    // 1. Dispatch: instantiate + call of a trivial node.
    let component = engine.load_node(&step)?;
    if want("node_dispatch_us_p50") {
        let call = NodeCall {
            run_id: "bench",
            workflow_id: "bench",
            node_id: "n0",
            config_json: "null",
            vars_json: "{\"i\":1}",
            now: "2026-01-01T00:00:00.000000Z",
            attempt: 1,
        };
        for _ in 0..200 {
            component
                .call(&call)
                .map_err(|e| Error::invalid("bench", e.to_string()))?;
        }
        let mut samples = Vec::with_capacity(options.dispatch_samples);
        for _ in 0..options.dispatch_samples {
            let t = Instant::now();
            component
                .call(&call)
                .map_err(|e| Error::invalid("bench", e.to_string()))?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        figures.insert(
            "node_dispatch_us_p50".into(),
            json!(round(median(samples), 2)),
        );
    }

    // 2. A chain of WASM nodes, in memory and on SQLite.
    let chain_dir = scratch.0.join("chain");
    std::fs::create_dir_all(&chain_dir).map_err(|e| Error::invalid("bench", e.to_string()))?;
    write_chain(&chain_dir, &step, options.chain_len)?;
    let chain = |store: Arc<dyn Store>| -> Result<f64> {
        let rt = runtime(store, &engine)?;
        rt.load_bundle(&chain_dir)?;
        let mut rates = Vec::new();
        for _ in 0..options.chain_repeats {
            let id = rt.start("bench.chain", StartOptions::default())?;
            let t = Instant::now();
            let state = rt.tick(&id)?;
            let secs = t.elapsed().as_secs_f64();
            if state.status != RunStatus::Completed {
                return Err(Error::invalid(
                    "bench",
                    format!("chain ended {:?}: {:?}", state.status, state.error),
                ));
            }
            rates.push(options.chain_len as f64 / secs);
        }
        Ok(median(rates))
    };
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
        let record = |run: &str, n: usize| crate::StepRecord {
            step_id: format!("{run}-{n}"),
            run_id: run.to_string(),
            node_id: Some("n".into()),
            status: crate::StepStatus::Completed,
            effect: None,
            result: Some(json!({ "next_node": "m" })),
            error: None,
            started_at: "2026-11-30T09:00:00.000000Z".into(),
            ended_at: Some("2026-11-30T09:00:00.000000Z".into()),
            attempt: 1,
            idempotency_key: None,
            prev_hash: None,
            record_hash: None,
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
    if want("chain_steps_per_s_sqlite") {
        let rate = chain(Arc::new(SqliteStore::open(scratch.0.join("chain.sqlite"))?))?;
        figures.insert("chain_steps_per_s_sqlite".into(), json!(round(rate, 0)));
    }
    // 3. One `prepare` call on schedule@1, through the component.
    if want("trigger_prepare_us_p50") {
        let registry = crate::triggers::TriggerRegistry::load(&engine, None)?;
        let source = registry.get("schedule@1")?;
        let now = "2026-11-30T09:00:00Z";
        let config = source.validate(&json!({"every": "5m"}), now)?;
        let binding = crate::triggers::Binding {
            binding_id: "bench".into(),
            source_id: "schedule".into(),
            source_version: 1,
            config,
        };
        let state = source.initial_state(&binding, now)?;
        for _ in 0..200 {
            source.prepare(&binding, &state, now)?;
        }
        let mut samples = Vec::with_capacity(options.dispatch_samples);
        for _ in 0..options.dispatch_samples {
            let t = Instant::now();
            source.prepare(&binding, &state, now)?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        figures.insert(
            "trigger_prepare_us_p50".into(),
            json!(round(median(samples), 2)),
        );
    }
    if !want("ask_resume_cycles_per_s_sqlite") {
        return Ok(Value::Object(figures));
    }

    // 4. Start, park on ask_user, resume, complete: on SQLite.
    let rt = runtime(
        Arc::new(SqliteStore::open(scratch.0.join("ask.sqlite"))?),
        &engine,
    )?;
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
                .ok_or_else(|| Error::invalid("bench", "ask-user did not park"))?;
            let done = rt.resume(&id, &key, json!({ "text": "Bob" }))?;
            if done.status != RunStatus::Completed {
                return Err(Error::invalid("bench", "ask-user did not complete"));
            }
        }
        rates.push(options.cycles_per_batch as f64 / t.elapsed().as_secs_f64());
    }
    figures.insert(
        "ask_resume_cycles_per_s_sqlite".into(),
        json!(round(median(rates), 0)),
    );
    Ok(Value::Object(figures))
}

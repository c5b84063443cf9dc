//! What a node costs in each language: the contract nodes of
//! `flows/examples/contract-<lang>` (Rust, C, Python, JavaScript), each
//! compiled in a new cache (its cold start), called warm on a kept
//! instance, and called on a fresh instance; and a chain of each
//! language's chain step (`flows/examples/chain/step*`) run in memory.
//! Every answer is checked: a wrong one fails the benchmark.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};
use stepwell::store::MemoryStore;
use stepwell::wasm::{NodeCall, NodeComponent};
use stepwell::{EngineConfig, Result, WasmEngine};

use super::bench::{chain_runs, invalid, median, write_chain};

/// The languages measured: figure name, contract example directory and
/// chain step (in `flows/examples/chain/`).
const LANGUAGES: [(&str, &str, &str); 4] = [
    ("rust", "contract-rust", "step.wasm"),
    ("c", "contract-c", "step-c.wasm"),
    ("py", "contract-py", "step-py.wasm"),
    ("js", "contract-js", "step-js.wasm"),
];

/// `lang_<l>_component_bytes`, `lang_<l>_compile_ms` (the first load, in
/// a new cache), `lang_<l>_dispatch_us_p50` (warm) and
/// `lang_<l>_instantiate_us_p50` (a fresh instance per call) for each
/// language, `samples` warm calls each (a tenth as many fresh ones); and
/// `lang_<l>_chain_steps_per_s`, the median rate of `chain.1` runs of a
/// chain of `chain.0` nodes of that language's chain step, in memory.
pub fn measure(
    flows: &Path,
    scratch: &Path,
    samples: usize,
    chain: (usize, usize),
) -> Result<Map<String, Value>> {
    let mut figures = Map::new();
    for (lang, example, step) in LANGUAGES {
        let path = flows.join("examples").join(example).join("node.wasm");
        let bytes = built(&path)?;
        let engine = WasmEngine::new(EngineConfig {
            cache_dir: Some(scratch.join(format!("lang-cache-{lang}"))),
            ..EngineConfig::default()
        })?;
        let t = Instant::now();
        let component = engine.load_node(&path)?;
        let compile_ms = t.elapsed().as_secs_f64() * 1e3;
        let warm = dispatch(&component, samples, false)?;
        let fresh = dispatch(&component, (samples / 10).max(20), true)?;
        let round = |x: f64| (x * 100.0).round() / 100.0;
        figures.insert(format!("lang_{lang}_component_bytes"), json!(bytes));
        figures.insert(format!("lang_{lang}_compile_ms"), json!(round(compile_ms)));
        figures.insert(format!("lang_{lang}_dispatch_us_p50"), json!(round(warm)));
        figures.insert(
            format!("lang_{lang}_instantiate_us_p50"),
            json!(round(fresh)),
        );
        let step = flows.join("examples/chain").join(step);
        built(&step)?;
        let dir = scratch.join(format!("lang-chain-{lang}"));
        let rate = chain_rate(&engine, &step, &dir, chain)?;
        figures.insert(
            format!("lang_{lang}_chain_steps_per_s"),
            json!(rate.round()),
        );
    }
    Ok(figures)
}

/// The size of the built component at `path`, or an error saying to build it.
fn built(path: &Path) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| {
        invalid(
            "flows_dir",
            format!("{}: {e} (scripts/build-guests)", path.display()),
        )
    })?;
    Ok(meta.len())
}

/// The median steps per second of `repeats` runs of a chain of `len` nodes
/// of component `step`, each run ticked to its end in a memory store; a run
/// that does not complete with `len` steps fails the benchmark.
fn chain_rate(
    engine: &WasmEngine,
    step: &Path,
    dir: &Path,
    (len, repeats): (usize, usize),
) -> Result<f64> {
    let io = |e: std::io::Error| invalid("bench", format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let step = step.canonicalize().map_err(io)?;
    write_chain(dir, &step, len)?;
    let rt = stepwell::builder(Arc::new(MemoryStore::new()))
        .engine(engine.clone())
        .build()?;
    rt.load_bundle(dir)?;
    chain_runs(&rt, len, repeats)
        .map_err(|e| invalid("bench", format!("a chain of {}: {e}", step.display())))
}

/// The median time of `n` calls of the node's `complete` mode (after a
/// tenth as many unmeasured), on one kept instance or (`fresh`) a new
/// one each, in microseconds; each answer checked.
fn dispatch(component: &Arc<NodeComponent>, n: usize, fresh: bool) -> Result<f64> {
    let vars = json!({"mode": "complete", "value": 7}).to_string();
    let call = NodeCall {
        run_id: "bench",
        workflow_id: "bench",
        node_id: "act",
        config_json: None,
        vars_json: &vars,
        now: chrono::Utc::now(),
        attempt: 1,
        seed: 1,
    };
    let guest = |e: stepwell::GuestError| invalid("bench", e.to_string());
    let mut session = component.session().map_err(guest)?;
    let mut samples = Vec::with_capacity(n);
    for i in 0..(n + n / 10) {
        if !fresh && session.calls() >= 5_000 {
            session = component.session_made_now().map_err(guest)?;
        }
        // A fresh instance's time is its making, the call and its drop
        // (as `node_instantiate_us_p50`'s).
        let t = Instant::now();
        if fresh {
            std::mem::replace(&mut session, component.session_made_now().map_err(guest)?).discard();
        }
        let plan = session.call(&call).map_err(guest)?;
        let took = t.elapsed().as_secs_f64() * 1e6;
        let echo = plan.complete_output.as_ref().map(|o| &o["echo"]);
        if echo != Some(&json!(7)) {
            return Err(invalid(
                "bench",
                format!("a contract node answered {plan:?}"),
            ));
        }
        if i >= n / 10 {
            samples.push(took);
        }
    }
    Ok(median(samples))
}

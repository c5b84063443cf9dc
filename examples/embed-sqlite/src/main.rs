//! Embedding stepwell: a run that waits for a person, parked by one runtime
//! and resumed by another over the same SQLite file (a restart in between).
//! The application takes only the kernel and the SQLite store
//! (`default-features = false, features = ["sqlite"]`).
//!
//! Build the guest components first (`scripts/build-guests`), then, from
//! the repository root:
//!
//! ```sh
//! cargo build --release && target/release/embed-sqlite
//! ```

use std::sync::Arc;

use serde_json::json;
use stepwell::{EngineConfig, RunStatus, Runtime, SqliteStore, StartOptions, WasmEngine};

fn open(db: &std::path::Path) -> Result<Runtime, stepwell::Error> {
    let store = Arc::new(SqliteStore::open(db)?);
    // Cache compiled components beside the database: the second runtime does
    // not compile them again.
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(db.with_file_name("cache")),
        ..EngineConfig::default()
    })?;
    stepwell::builder(store).engine(engine).build()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("stepwell-embed-{}", std::process::id()));
    let db = dir.join("stepwell.sqlite");

    // First runtime: start the run; it parks on ask_user.
    let (run_id, wait_key) = {
        let runtime = open(&db)?;
        let bundle = runtime.load_bundle(&repo.join("flows/examples/ask-user"))?;
        let parked = runtime.run(&bundle.main_workflow_id, StartOptions::default())?;
        assert_eq!(parked.status, RunStatus::Waiting);
        let wait = parked.waiting.expect("a waiting run has a wait");
        println!(
            "run {} asks: {}",
            parked.run_id,
            wait.prompt.unwrap_or_default()
        );
        (parked.run_id, wait.wait_key)
    };

    // Second runtime, as after a restart: it finds the workflow through the
    // store and resumes the wait.
    let runtime = open(&db)?;
    let done = runtime.resume(&run_id, &wait_key, json!({"text": "Bob"}))?;
    println!(
        "run {} {}: {}",
        run_id,
        done.status.as_str(),
        done.output.unwrap_or_default()
    );
    for record in runtime.get_ledger(&run_id)? {
        println!(
            "  {:10} {}",
            record.status.as_str(),
            record.node_id.unwrap_or_default()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

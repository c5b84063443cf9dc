//! # stepwell
//!
//! A durable, WebAssembly-sandboxed workflow host. A workflow is a graph of
//! nodes; each run of it is a persisted state machine that executes node by
//! node, waits (for a person, a time, an event, a child run) for as long as
//! it must, and continues after a restart. Every step lands in an
//! append-only ledger.
//!
//! Node logic is WebAssembly: components implementing the `node` world of
//! `crates/wasm/wit/stepwell.wit`, run in a sandbox bounded in time and memory. The host
//! executes every effect they ask for.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), stepwell::Error> {
//! use std::sync::Arc;
//! use stepwell::{SqliteStore, StartOptions};
//!
//! let store = Arc::new(SqliteStore::open(".stepwell/stepwell.sqlite")?);
//! // The kernel and every feature this build has (`Runtime::builder` is
//! // the bare kernel).
//! let runtime = stepwell::builder(store).build()?;
//! let bundle = runtime.load_bundle("flows/examples/hello".as_ref())?;
//! let mut options = StartOptions::default();
//! options.vars.insert("name".into(), "Alice".into());
//! // `run` starts the run and ticks it until it waits or ends.
//! let state = runtime.run(&bundle.main_workflow_id, options)?;
//! assert_eq!(state.output, Some(serde_json::json!({"message": "Hello, Alice!"})));
//! # Ok(()) }
//! # #[cfg(not(feature = "sqlite"))]
//! # fn main() {}
//! ```

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds (a `SAFETY:` comment), also inside an
// `unsafe fn`.
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

pub mod host;

// The features, each a crate of its own with its kernel plugin, under the
// paths they always had here.
#[cfg(feature = "automation")]
pub use stepwell_automation::{self as automation, sessions, triggers};
#[cfg(feature = "llm")]
pub use stepwell_llm as llm;
/// Spans to an OpenTelemetry collector (OTLP/HTTP).
#[cfg(feature = "otlp")]
pub use stepwell_otlp as otlp;
#[cfg(feature = "tools")]
pub use stepwell_tools as tools;

// The kernel (crates/runtime), under the paths it always had here.
pub use stepwell_runtime::{core, effects, flow, store, wasm};

#[cfg(feature = "conformance")]
pub use stepwell_runtime::store_conformance;
#[cfg(feature = "postgres")]
pub use stepwell_runtime::PostgresStore;
#[cfg(feature = "sqlite")]
pub use stepwell_runtime::SqliteStore;
pub use stepwell_runtime::{
    ArtifactMeta, ArtifactStore, Attribution, ChainVerifier, Claim, Clock, CommandRecord,
    CommandStore, DriveReport, Durability, EffectClass, EffectCx, EffectHandler, EffectRecord,
    EffectRegistry, EffectRequest, EngineConfig, Error, FeedEntry, Fence, FileArtifactStore,
    GuestError, JsonFileStore, JsonlCommandStore, LeaseAfter, LeaseRequest, LedgerCheck,
    LedgerPages, ManualClock, MemoryArtifactStore, MemoryCommandStore, MemoryStore, Outcome,
    Result, RetryPolicy, RunIndexQuery, RunIndexRow, RunPort, RunQuery, RunState, RunStatus,
    Runtime, RuntimeBuilder, RuntimeConfig, SandboxLimits, StartOptions, StepPlan, StepRecord,
    StepStatus, Store, StoreError, SystemClock, WaitReason, WaitState, WasmEngine, LEDGER_PAGE,
    MIN_LEASE_TTL,
};
pub use stepwell_runtime::{Delivery, Failure};

/// A builder of a runtime over `store` with every feature this build of
/// the library has (its cargo features), each as a kernel plugin
/// ([`core::plugin`]) with its defaults: LLM calls (`llm`: no provider
/// configured), the built-in workspace tools (`tools`: `execute_command`
/// off), the built-in trigger sources (no sealing key) and automations
/// (`automation`). Give the builder a plugin of the same name to configure
/// one (`.plugin(Arc::new(Tools::new().dir(..)))`);
/// [`Runtime::builder`] is the bare kernel.
///
/// ```
/// use std::sync::Arc;
/// use stepwell::MemoryStore;
///
/// # fn main() -> stepwell::Result<()> {
/// let rt = stepwell::builder(Arc::new(MemoryStore::new())).build()?;
/// # #[cfg(feature = "full")]
/// assert_eq!(rt.plugins(), ["llm", "tools", "triggers", "automations"]);
/// # Ok(()) }
/// ```
pub fn builder(store: std::sync::Arc<dyn Store>) -> RuntimeBuilder {
    #[allow(unused_mut)]
    let mut builder = Runtime::builder(store);
    #[cfg(feature = "llm")]
    {
        builder = builder.plugin(std::sync::Arc::new(llm::Llm::default()));
    }
    #[cfg(feature = "tools")]
    {
        builder = builder.plugin(std::sync::Arc::new(tools::Tools::new()));
    }
    #[cfg(feature = "automation")]
    {
        builder = builder
            .plugin(std::sync::Arc::new(triggers::Triggers::new()))
            .plugin(std::sync::Arc::new(automation::Automations));
    }
    builder
}

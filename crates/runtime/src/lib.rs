//! # stepwell-runtime
//!
//! stepwell's kernel: the run model and the runtime (`core`: start, tick,
//! resume, cancel, the run transaction, the step machine, the driver), the
//! stores (`store`), the WebAssembly sandbox (`wasm`), flows and bundles
//! (`flow`) and the kernel's own effects (`effects`: waits, events,
//! subworkflows, vars queries).
//!
//! It knows no feature built on it. LLM calls, tools, trigger sources and
//! automations come as plugins ([`core::plugin`]) the builder is given; the
//! `stepwell` crate assembles them. Most applications depend on `stepwell`,
//! which re-exports everything here.
//!
//! ```no_run
//! # #[cfg(feature = "sqlite")]
//! # fn main() -> Result<(), stepwell_runtime::Error> {
//! use std::sync::Arc;
//! use stepwell_runtime::{Runtime, SqliteStore, StartOptions};
//!
//! let store = Arc::new(SqliteStore::open(".stepwell/stepwell.sqlite")?);
//! let runtime = Runtime::builder(store).build()?;
//! let bundle = runtime.load_bundle("flows/examples/hello".as_ref())?;
//! let state = runtime.run(&bundle.main_workflow_id, StartOptions::default())?;
//! println!("{:?}", state.output);
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

pub mod core;
pub mod effects;
pub mod flow;
pub use stepwell_store as store;
#[cfg(feature = "conformance")]
pub use stepwell_store::store_conformance;
pub use stepwell_wasm as wasm;

pub use crate::core::clock::{Clock, ManualClock, SystemClock};
pub use crate::core::config::{RetryPolicy, RuntimeConfig, StartOptions, MIN_LEASE_TTL};
pub use crate::core::model::{
    EffectRecord, EffectRequest, RunState, RunStatus, StepPlan, StepRecord, StepStatus, WaitReason,
    WaitState,
};
pub use crate::core::runtime::{Runtime, RuntimeBuilder};
pub use crate::core::{DriveReport, Error, LedgerCheck, LedgerPages, Result, LEDGER_PAGE};
pub use crate::effects::{
    Delivery, EffectClass, EffectCx, EffectHandler, EffectRegistry, Failure, Outcome, RunPort,
};
#[cfg(feature = "postgres")]
pub use crate::store::PostgresStore;
#[cfg(feature = "sqlite")]
pub use crate::store::SqliteStore;
pub use crate::store::{
    ArtifactMeta, ArtifactStore, Attribution, ChainVerifier, Claim, CommandRecord, CommandStore,
    Durability, FeedEntry, Fence, FileArtifactStore, JsonFileStore, JsonlCommandStore, LeaseAfter,
    LeaseRequest, MemoryArtifactStore, MemoryCommandStore, MemoryStore, RunIndexQuery, RunIndexRow,
    RunQuery, Store, StoreError,
};
pub use crate::wasm::{EngineConfig, GuestError, SandboxLimits, WasmEngine};

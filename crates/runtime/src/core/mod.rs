//! The kernel: the run model, the runtime (start / tick / resume / cancel),
//! the run transaction, the step machine, the driver, time, and the errors
//! the API returns.

pub(crate) mod cascade;
pub mod compaction;
pub mod config;
mod driver;
mod error;
pub mod export;
mod feed;
pub mod flight;
mod flying_resume;
mod foreign;
pub mod fork;
pub mod keys;
pub mod locks;
pub mod metrics;
mod offload;
pub mod panics;
mod parked;
pub mod plugin;
pub mod retention;
pub mod runtime;
mod snapshots;
mod step;
pub mod trace;
mod txn;
pub mod versions;

/// The clock a host reads time from (the `stepwell-model` crate's).
pub use stepwell_model::clock;
/// A run's state, its ledger records, waits, plans: the `stepwell-model`
/// crate's, which every layer shares.
pub use stepwell_model::model;
/// Which recorded keys name secrets, and values with them redacted.
pub use stepwell_model::secrets;

pub use driver::{DriveReport, RunError, IDLE_POLL};
pub use error::{Error, ExtensionError, Result};
pub use feed::{LedgerCheck, LedgerPages, LEDGER_PAGE};
pub use txn::RunTxn;

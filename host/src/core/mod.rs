//! The kernel: the run model, the runtime (start / tick / resume / cancel),
//! the run transaction, the step machine, the driver, time, and the errors
//! the API returns.

pub(crate) mod cascade;
pub mod clock;
pub mod config;
mod driver;
mod error;
mod feed;
pub mod keys;
pub mod locks;
pub mod metrics;
pub mod model;
pub mod panics;
mod parked;
pub mod runtime;
mod snapshots;
mod step;
mod txn;

pub use driver::{DriveReport, RunError, IDLE_POLL};
pub use error::{Error, Result};
pub use feed::{LedgerCheck, LedgerPages, LEDGER_PAGE};

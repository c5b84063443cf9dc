//! The kernel: the run model, the runtime (start / tick / resume / cancel),
//! per-run locks, time, and the errors the API returns.

pub mod clock;
mod error;
pub mod locks;
pub mod model;
pub mod runtime;

pub use error::{Error, Result};

//! The vocabulary every layer of stepwell shares, and nothing else: what a
//! run is ([`model::RunState`], its status and wait), what its ledger
//! holds ([`model::StepRecord`]), what a node asks for
//! ([`model::StepPlan`], [`model::EffectRequest`]), the [`clock::Clock`]
//! a host reads the time from, and the [`ExtensionError`] a feature's
//! errors implement.
//!
//! It depends on serde and chrono only: a store, a tool or a trigger
//! source can speak of runs without compiling the host. The `stepwell`
//! crate re-exports both modules as `stepwell::core::model` and
//! `stepwell::core::clock` (docs/architecture.md).

#![deny(missing_docs)]

pub mod clock;
pub mod error;
pub mod json;
pub mod model;
pub mod secrets;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::ExtensionError;
pub use model::{
    EffectRecord, EffectRequest, RunState, RunStatus, StepPlan, StepRecord, StepStatus, WaitReason,
    WaitState,
};

//! The WebAssembly side of the host: one [`WasmEngine`] compiles components
//! (once, with an on-disk cache), pre-instantiates them, and calls them inside
//! a sandbox bounded in time and memory.
//!
//! Guests get an empty WASI context: no preopened directories, no environment
//! or arguments, no network, no inherited stdio. Their clocks are stopped at
//! the Unix epoch and nothing they can call waits (a sleep or a wait on a
//! pollable ends the call with `guest_blocked`); their random source is a
//! stream seeded per step, so a guest that looks for the time or for
//! entropy gets a deterministic answer. The real time reaches a guest only
//! as the `now` field of its input. The details are in `sandbox.rs`.
//!
//! This crate is the sandbox alone: it depends on the run model and the
//! stores' file-privacy checks, not on the runtime; `stepwell-runtime`
//! re-exports it as `stepwell_runtime::wasm` (and `stepwell::wasm`). The
//! WIT contract it implements is this crate's `wit/` (which the guests build against too).

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds, also inside an `unsafe fn`.
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

pub(crate) mod cache;
mod engine;
mod fsguard;
pub mod inspect;
mod node;
mod sandbox;
mod tool;
mod trigger;
mod warm;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use cache::CompiledDigests;
pub use engine::time_compiling;
pub use engine::{write_perf_map, EngineConfig, GuestCounts, LoadOrigin, WasmEngine, CONTRACT};
pub use fsguard::RefusedPaths;
pub use inspect::{inspect, ComponentInfo};
pub use node::vars_json;
pub use node::{NodeCall, NodeComponent, NodeSession, HOST_BOOKKEEPING_VARS};
pub use sandbox::{Preopen, Reach};
pub use tool::{Stop, ToolClass, ToolComponent, ToolFault, ToolSpec};
pub use trigger::{
    Admission, AdmitResult, Binding, Descriptor, Envelope, SourceKind, TriggerComponent,
    TriggerError, Wait,
};

/// The bounds every guest call runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Wall time one call may take (making an instance is bounded by the
    /// same limit, counted on its own). Default 2 s.
    pub time_limit: Duration,
    /// The most linear memory an instance may hold, all its memories
    /// together, in bytes. Default 256 MiB.
    pub memory_limit_bytes: usize,
    /// The most table elements one instance may hold. Default 100,000.
    pub table_elements_limit: usize,
    /// The most bytes of JSON a call may return (its vars patch, effect
    /// payload and output together): more is `output_too_large`. Default
    /// 8 MiB.
    pub max_output_bytes: usize,
    /// Memory all live guest instances of one engine may hold together
    /// (runs nested inside a step each hold an instance at once): a guest
    /// that would grow past it fails with `guest_memory_limit`. Default
    /// 1 GiB.
    pub total_memory_bytes: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            time_limit: Duration::from_secs(2),
            memory_limit_bytes: 256 << 20,
            table_elements_limit: 100_000,
            max_output_bytes: 8 << 20,
            total_memory_bytes: 1 << 30,
        }
    }
}

/// A component could not be loaded (read, compiled, or matched against the
/// world it must implement). Reason code `component_load_failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The component file.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

/// So the runtime's error converts it like any error below it (into its
/// `Wasm` variant).
impl stepwell_model::ExtensionError for LoadError {
    fn reason_code(&self) -> &'static str {
        "component_load_failed"
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": "component_load_failed", "message": self.to_string()})
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "component_load_failed: {}: {}",
            self.path.display(),
            self.message
        )
    }
}

impl std::error::Error for LoadError {}

/// Why a guest call did not produce a usable plan. The run whose step it was
/// fails with this error; the host and every other run are unaffected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestError {
    /// The call ran past [`SandboxLimits::time_limit`].
    Timeout {
        /// The limit, in milliseconds.
        limit_ms: u64,
    },
    /// The guest tried to grow its memory past [`SandboxLimits::memory_limit_bytes`].
    MemoryLimit {
        /// The limit, in bytes.
        limit_bytes: usize,
        /// Whether the limit reached is the one all of the engine's live
        /// guest instances share ([`SandboxLimits::total_memory_bytes`])
        /// rather than the guest's own.
        shared: bool,
    },
    /// The guest trapped (a panic, `unreachable`, a stack overflow, ...).
    Trap {
        /// The trap, and what the guest wrote to stderr, if anything.
        message: String,
    },
    /// The guest asked to wait (a sleep, a pollable that is not ready):
    /// guests cannot wait, so the call ends at once.
    Blocked {
        /// What it tried to wait on.
        what: String,
    },
    /// The guest returned more than [`SandboxLimits::max_output_bytes`].
    OutputTooLarge {
        /// How many bytes it returned (`None`: more than the host would
        /// copy out of the guest to count them).
        bytes: Option<usize>,
        /// The limit.
        limit_bytes: usize,
    },
    /// The guest returned output that does not parse or has the wrong shape.
    BadOutput {
        /// Which field, and what is wrong with it.
        message: String,
    },
    /// The node reported `invalid-input`.
    InvalidInput(String),
    /// The node reported `failed`.
    Failed(String),
}

impl GuestError {
    /// The reason code (`guest_timeout`, `guest_memory_limit`, `guest_trap`,
    /// `guest_blocked`, `output_too_large`, `guest_bad_output`,
    /// `node_invalid_input`, `node_failed`).
    pub fn code(&self) -> &'static str {
        match self {
            GuestError::Timeout { .. } => "guest_timeout",
            GuestError::MemoryLimit { .. } => "guest_memory_limit",
            GuestError::Trap { .. } => "guest_trap",
            GuestError::Blocked { .. } => "guest_blocked",
            GuestError::OutputTooLarge { .. } => "output_too_large",
            GuestError::BadOutput { .. } => "guest_bad_output",
            GuestError::InvalidInput(_) => "node_invalid_input",
            GuestError::Failed(_) => "node_failed",
        }
    }
}

impl fmt::Display for GuestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.code())?;
        match self {
            GuestError::Timeout { limit_ms } => {
                write!(f, "the guest ran past its time limit of {limit_ms} ms")
            }
            GuestError::MemoryLimit {
                limit_bytes,
                shared: false,
            } => write!(
                f,
                "the guest tried to grow its memory past the limit of {} MiB",
                limit_bytes >> 20
            ),
            GuestError::MemoryLimit {
                limit_bytes,
                shared: true,
            } => write!(
                f,
                "the guest tried to grow its memory while the host's live guests together hold their limit of {} MiB (SandboxLimits::total_memory_bytes)",
                limit_bytes >> 20
            ),
            GuestError::Trap { message } => write!(f, "the guest trapped: {message}"),
            GuestError::Blocked { what } => write!(
                f,
                "the guest tried to wait ({what}); guests cannot wait: ask the host for a wait effect"
            ),
            GuestError::OutputTooLarge {
                bytes: Some(bytes),
                limit_bytes,
            } => write!(
                f,
                "the guest returned {bytes} bytes of output, over the limit of {limit_bytes}"
            ),
            GuestError::OutputTooLarge {
                bytes: None,
                limit_bytes,
            } => write!(
                f,
                "the guest returned far more output than the limit of {limit_bytes} bytes (the host stopped copying it)"
            ),
            GuestError::BadOutput { message } => write!(f, "the guest returned {message}"),
            GuestError::InvalidInput(m) | GuestError::Failed(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for GuestError {}

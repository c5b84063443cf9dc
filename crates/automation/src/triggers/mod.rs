//! Trigger sources: what decides when an automation fires. Every source is a
//! WebAssembly component implementing the `trigger-source` world
//! (`crates/wasm/wit/trigger.wit`). The built-in `schedule@1` and `manual@1` are embedded
//! in the host; third-party sources are discovered in a plugin folder.
//!
//! See `docs/triggers.md`.

pub mod connections;
pub mod feed;
mod plugin;
mod registry;
pub mod webhook;

pub use connections::{
    check_binding, connection_view, feed_once, run_feed_poller, sweep_once, Connections, Created,
    FeedReport, SealingKey,
};
pub(crate) use plugin::trigger_state;
pub use plugin::{TriggerState, Triggers, TriggersExt};
pub use registry::{Fire, Origin, Preview, SourceEntry, TriggerRegistry, PLUGIN_DIR_ENV};
pub use webhook::{Received, Webhooks};

// What a trigger source's contract says (its descriptor, bindings,
// admissions, envelopes, refusals) lives with the sandbox that loads the
// sources (`wasm`), named here too.
pub use stepwell_runtime::wasm::{
    Admission, AdmitResult, Binding, Descriptor, Envelope, SourceKind, TriggerError, Wait,
};

/// The source a stored trigger binding (`{source_id, source_version, ...}`)
/// names, `id@version`.
pub fn trigger_source(trigger: &serde_json::Value) -> String {
    format!(
        "{}@{}",
        trigger["source_id"].as_str().unwrap_or_default(),
        trigger["source_version"]
    )
}

/// Whether `id` is a connection id: letters, digits, `_` or `-`, 1 to 64,
/// starting with a letter or digit.
pub fn connection_id_ok(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
}

//! Trigger sources: what decides when an automation fires. Every source is a
//! WebAssembly component implementing the `trigger-source` world
//! (`wit/trigger.wit`). The built-in `schedule@1` and `manual@1` are embedded
//! in the host; third-party sources are discovered in a plugin folder.
//!
//! See `docs/triggers.md`.

pub mod connections;
pub mod feed;
mod registry;
pub mod webhook;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wasm::GuestError;

pub use connections::{
    check_binding, connection_view, feed_once, run_feed_poller, sweep_once, Created, FeedReport,
    SealingKey,
};
pub use registry::{Fire, Origin, Preview, SourceEntry, TriggerRegistry, PLUGIN_DIR_ENV};
pub use webhook::Received;

/// What makes a source fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A clock.
    Time,
    /// Only explicit "run now" requests.
    Manual,
    /// External events.
    Event,
}

/// Who a source is and what it accepts (contract C of the seeds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    /// The id (`[a-z0-9][a-z0-9._-]*`).
    pub id: String,
    /// The major version, at least 1.
    pub version: u32,
    /// A short human label.
    pub label: String,
    /// A JSON Schema of the config.
    pub config_schema: Value,
    /// A JSON Schema of admitted payloads.
    pub event_schema: Value,
    /// What makes it fire.
    pub kind: SourceKind,
}

impl Descriptor {
    /// `id@version`.
    pub fn name(&self) -> String {
        format!("{}@{}", self.id, self.version)
    }

    /// Why this descriptor is unusable, if it is.
    pub fn problem(&self) -> Option<String> {
        let id_ok = self
            .id
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && self.id.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            });
        if !id_ok {
            return Some(format!(
                "descriptor.id {:?} is not [a-z0-9][a-z0-9._-]*",
                self.id
            ));
        }
        if self.version < 1 {
            return Some(format!(
                "descriptor.version of {:?} is {}, it must be at least 1",
                self.id, self.version
            ));
        }
        if self.label.trim().is_empty() {
            return Some(format!("descriptor.label of {:?} is empty", self.id));
        }
        for (field, schema) in [
            ("config_schema", &self.config_schema),
            ("event_schema", &self.event_schema),
        ] {
            if !schema.is_object() {
                return Some(format!(
                    "descriptor.{field} of {:?} is not a JSON Schema object",
                    self.id
                ));
            }
        }
        None
    }
}

/// One use of a source by one automation revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// A UUID, new for every revision that changes the trigger.
    pub binding_id: String,
    /// The source's id.
    pub source_id: String,
    /// The source's version.
    pub source_version: u32,
    /// The config as `validate` returned it.
    pub config: Value,
}

/// What a source waits for next (the seeds' `TriggerWait`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Wait {
    /// Nothing fires before `until`.
    Until {
        /// An RFC 3339 time.
        until: String,
    },
    /// No deadline: only a manual request or an event moves the source.
    Idle,
    /// Never fires again.
    Exhausted,
}

/// One firing a source admits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    /// A stable id: the same firing always gets the same id.
    pub event_id: String,
    /// When it fired.
    pub fired_at: String,
    /// What the occurrence receives.
    pub payload: Value,
    /// An event source's named inputs for the occurrence (an object set on
    /// its `input_data`), never part of the envelope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
}

/// The answer of `admit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmitResult {
    /// The firing, if one was due.
    pub admission: Option<Admission>,
    /// The new state.
    pub state: Value,
}

/// A firing in the shared form (the seeds' `TriggerEnvelope`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// The firing's id.
    pub event_id: String,
    /// The source's id.
    pub source_id: String,
    /// The source's version.
    pub source_version: u32,
    /// When it fired.
    pub fired_at: String,
    /// The payload.
    pub payload: Value,
    /// The binding it belongs to.
    pub binding_id: String,
}

/// Why a trigger call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TriggerError {
    /// The source refused a config or argument (`invalid_definition`).
    #[error("invalid_definition: {field}: {message}")]
    Invalid {
        /// The field, such as `trigger.config.every`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// Valid but unsupported (`unsupported_feature`).
    #[error("unsupported_feature: {field}: {message}")]
    Unsupported {
        /// The field.
        field: String,
        /// What is not supported.
        message: String,
    },
    /// The source failed for another reason (`trigger_failed`).
    #[error("trigger_failed: {0}")]
    Failed(String),
    /// The component trapped, ran out of time or memory, or answered with
    /// output that does not parse.
    #[error("{0}")]
    Guest(GuestError),
    /// No source has this `id@version` (`unknown_trigger_source`).
    #[error("unknown_trigger_source: {0}")]
    UnknownSource(String),
    /// The source exists but cannot be used (`trigger_source_unavailable`).
    #[error("trigger_source_unavailable: {name}: {reason}")]
    Unavailable {
        /// `id@version`.
        name: String,
        /// Why.
        reason: String,
    },
    /// A built-in source is missing or broken: the host cannot start
    /// (`trigger_registry_error`).
    #[error("trigger_registry_error: {0}")]
    Registry(String),
    /// A malformed argument of a host-side call (`invalid_input`).
    #[error("invalid_input: {field}: {message}")]
    Input {
        /// The argument.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl TriggerError {
    /// The reason code.
    pub fn reason_code(&self) -> &'static str {
        match self {
            TriggerError::Invalid { .. } => "invalid_definition",
            TriggerError::Unsupported { .. } => "unsupported_feature",
            TriggerError::Failed(_) => "trigger_failed",
            TriggerError::Guest(g) => g.code(),
            TriggerError::UnknownSource(_) => "unknown_trigger_source",
            TriggerError::Unavailable { .. } => "trigger_source_unavailable",
            TriggerError::Registry(_) => "trigger_registry_error",
            TriggerError::Input { .. } => "invalid_input",
        }
    }

    /// The error as a JSON object: `{"code", "message", "field"?}`.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::json!({ "code": self.reason_code(), "message": self.to_string() });
        if let TriggerError::Invalid { field, .. }
        | TriggerError::Unsupported { field, .. }
        | TriggerError::Input { field, .. } = self
        {
            v["field"] = Value::String(field.clone());
        }
        v
    }
}

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

impl crate::core::ExtensionError for TriggerError {
    fn reason_code(&self) -> &'static str {
        TriggerError::reason_code(self)
    }

    fn to_json(&self) -> Value {
        TriggerError::to_json(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl From<TriggerError> for crate::core::Error {
    fn from(e: TriggerError) -> Self {
        crate::core::Error::Extension(Box::new(e))
    }
}

//! Trigger-source components: the `trigger-source` world's bindings and its
//! calls, each in a fresh sandboxed instance under the engine's limits.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wasmtime::Store;

use super::sandbox::{classify, new_store, GuestState};
use super::{GuestError, LoadOrigin, WasmEngine};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "trigger-source",
    });
}

use bindings::stepwell::flow::trigger_types as wit;
use bindings::TriggerSource;
pub(super) use bindings::TriggerSourcePre;

/// A trigger-source component, compiled and pre-instantiated. Every call
/// runs in a fresh instance: sources keep no state between calls.
pub struct TriggerComponent {
    label: PathBuf,
    digest: String,
    origin: LoadOrigin,
    pre: TriggerSourcePre<GuestState>,
    engine: WasmEngine,
}

impl std::fmt::Debug for TriggerComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriggerComponent")
            .field("label", &self.label)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

fn wit_binding(b: &Binding) -> wit::Binding {
    wit::Binding {
        binding_id: b.binding_id.clone(),
        source_id: b.source_id.clone(),
        source_version: b.source_version,
        config: b.config.to_string(),
    }
}

fn from_wit_error(e: wit::TriggerError) -> TriggerError {
    match e {
        wit::TriggerError::Invalid(f) => TriggerError::Invalid {
            field: f.field,
            message: f.message,
        },
        wit::TriggerError::Unsupported(f) => TriggerError::Unsupported {
            field: f.field,
            message: f.message,
        },
        wit::TriggerError::Failed(m) => TriggerError::Failed(m),
    }
}

fn json(what: &str, text: &str) -> Result<Value, TriggerError> {
    serde_json::from_str(text).map_err(|e| {
        TriggerError::Guest(GuestError::BadOutput {
            message: format!("{what} that is not JSON ({e})"),
        })
    })
}

impl TriggerComponent {
    pub(super) fn new(
        label: PathBuf,
        digest: String,
        origin: LoadOrigin,
        pre: TriggerSourcePre<GuestState>,
        engine: WasmEngine,
    ) -> Self {
        TriggerComponent {
            label,
            digest,
            origin,
            pre,
            engine,
        }
    }

    /// Where the component came from (a file, or `builtin:<name>`).
    pub fn label(&self) -> &Path {
        &self.label
    }

    /// The SHA-256 of the component's bytes, in hex.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Whether the compiled code was compiled now or read from the cache.
    pub fn origin(&self) -> LoadOrigin {
        self.origin
    }

    /// Instantiates the component in a fresh sandbox and runs `f` on it.
    fn call<R>(
        &self,
        f: impl FnOnce(&TriggerSource, &mut Store<GuestState>) -> wasmtime::Result<R>,
    ) -> Result<R, TriggerError> {
        let (mut store, stderr) = new_store(&self.engine);
        let result = self
            .pre
            .instantiate(&mut store)
            .and_then(|source| f(&source, &mut store));
        result.map_err(|err| {
            TriggerError::Guest(classify(err, &store, &self.engine.limits(), &stderr))
        })
    }

    /// The source's descriptor, as the component reports it (not checked).
    pub fn descriptor(&self) -> Result<Descriptor, TriggerError> {
        let d = self.call(|s, st| s.call_descriptor(st))?;
        Ok(Descriptor {
            id: d.id,
            version: d.version,
            label: d.label,
            config_schema: json("descriptor.config-schema", &d.config_schema)?,
            event_schema: json("descriptor.event-schema", &d.event_schema)?,
            kind: match d.kind {
                wit::SourceKind::Time => SourceKind::Time,
                wit::SourceKind::Manual => SourceKind::Manual,
                wit::SourceKind::Event => SourceKind::Event,
            },
        })
    }

    /// `validate(config, now)`: the config with its defaults filled in.
    pub fn validate(&self, config: &Value, now: &str) -> Result<Value, TriggerError> {
        let out = self
            .call(|s, st| s.call_validate(st, &config.to_string(), now))?
            .map_err(from_wit_error)?;
        json("validate", &out)
    }

    /// `initial-state(binding, now)`.
    pub fn initial_state(&self, binding: &Binding, now: &str) -> Result<Value, TriggerError> {
        let out = self
            .call(|s, st| s.call_initial_state(st, &wit_binding(binding), now))?
            .map_err(from_wit_error)?;
        json("initial-state", &out)
    }

    /// `prepare(binding, state, now, events)`: what the source waits for
    /// next. `events`: an event source's pending inbox records
    /// ([`stepwell_store::InboxEvent::to_source_record`]), else empty.
    pub fn prepare(
        &self,
        binding: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<Wait, TriggerError> {
        let events = Value::from(events.to_vec()).to_string();
        let out = self
            .call(|s, st| {
                s.call_prepare(st, &wit_binding(binding), &state.to_string(), now, &events)
            })?
            .map_err(from_wit_error)?;
        Ok(match out {
            wit::TriggerWait::Until(t) => Wait::Until { until: t },
            wit::TriggerWait::Idle => Wait::Idle,
            wit::TriggerWait::Exhausted => Wait::Exhausted,
        })
    }

    /// `admit(binding, state, now, events)`: the firing due at `now`, if
    /// any, and the new state (`events` as for [`TriggerComponent::prepare`]).
    pub fn admit(
        &self,
        binding: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<AdmitResult, TriggerError> {
        let events = Value::from(events.to_vec()).to_string();
        let out = self
            .call(|s, st| {
                s.call_admit(st, &wit_binding(binding), &state.to_string(), now, &events)
            })?
            .map_err(from_wit_error)?;
        Ok(AdmitResult {
            admission: match out.admission {
                None => None,
                Some(a) => Some(Admission {
                    payload: json("admission.payload", &a.payload)?,
                    inputs: match a.inputs {
                        None => None,
                        Some(text) => match json("admission.inputs", &text)? {
                            v @ Value::Object(_) => Some(v),
                            _ => {
                                return Err(TriggerError::Guest(GuestError::BadOutput {
                                    message: "admission.inputs that is not a JSON object".into(),
                                }))
                            }
                        },
                    },
                    event_id: a.event_id,
                    fired_at: a.fired_at,
                }),
            },
            state: json("admit.state", &out.state)?,
        })
    }

    /// `rearm(binding, state, now)`: the state past everything due at or
    /// before `now`.
    pub fn rearm(
        &self,
        binding: &Binding,
        state: &Value,
        now: &str,
    ) -> Result<Value, TriggerError> {
        let out = self
            .call(|s, st| s.call_rearm(st, &wit_binding(binding), &state.to_string(), now))?
            .map_err(from_wit_error)?;
        json("rearm", &out)
    }

    /// `normalize(binding, event_id, fired_at, payload)`.
    pub fn normalize(
        &self,
        binding: &Binding,
        event_id: &str,
        fired_at: &str,
        payload: &Value,
    ) -> Result<Envelope, TriggerError> {
        let e = self
            .call(|s, st| {
                s.call_normalize(
                    st,
                    &wit_binding(binding),
                    event_id,
                    fired_at,
                    &payload.to_string(),
                )
            })?
            .map_err(from_wit_error)?;
        Ok(Envelope {
            payload: json("envelope.payload", &e.payload)?,
            event_id: e.event_id,
            source_id: e.source_id,
            source_version: e.source_version,
            fired_at: e.fired_at,
            binding_id: e.binding_id,
        })
    }
}

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

impl stepwell_model::ExtensionError for TriggerError {
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

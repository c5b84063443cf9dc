//! Trigger-source components: the `trigger-source` world's bindings and its
//! calls, each in a fresh sandboxed instance under the engine's limits.

use std::path::{Path, PathBuf};

use serde_json::Value;
use wasmtime::Store;

use super::sandbox::{classify, new_store, GuestState};
use super::{GuestError, LoadOrigin, WasmEngine};
use crate::triggers::{
    Admission, AdmitResult, Binding, Descriptor, Envelope, SourceKind, TriggerError, Wait,
};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit",
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
    /// ([`crate::store::InboxEvent::to_source_record`]), else empty.
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

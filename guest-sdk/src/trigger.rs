//! Write trigger sources in Rust: implement [`TriggerSource`] over serde_json
//! values and export the type with [`export_trigger_source!`](crate::export_trigger_source).
//!
//! A trigger source decides when an automation fires. Every method is pure:
//! it gets the persisted state and the time (`now`, RFC 3339 with an offset)
//! as arguments and returns the new state. See `docs/triggers.md`.
//!
//! ```ignore
//! use serde_json::{json, Value};
//! use stepwell_guest::export_trigger_source;
//! use stepwell_guest::trigger::*;
//!
//! struct Never;
//!
//! impl TriggerSource for Never {
//!     fn descriptor() -> Descriptor {
//!         Descriptor::new("never", 1, "Never fires", Kind::Time)
//!     }
//!     fn validate(config: Value, _now: &str) -> Result<Value, TriggerError> {
//!         Ok(config)
//!     }
//!     fn initial_state(_: &Binding, _: &str) -> Result<Value, TriggerError> {
//!         Ok(json!({}))
//!     }
//!     fn prepare(_: &Binding, _: &Value, _: &str, _: &[Value]) -> Result<Wait, TriggerError> {
//!         Ok(Wait::Exhausted)
//!     }
//!     fn admit(_: &Binding, state: &Value, _: &str, _: &[Value]) -> Result<(Option<Admission>, Value), TriggerError> {
//!         Ok((None, state.clone()))
//!     }
//!     fn rearm(_: &Binding, state: &Value, _: &str) -> Result<Value, TriggerError> {
//!         Ok(state.clone())
//!     }
//! }
//!
//! export_trigger_source!(Never);
//! ```

use serde_json::{json, Value};

/// Bindings generated from `crates/wasm/wit/trigger.wit` (the `trigger-source` world).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../crates/wasm/wit",
        world: "trigger-source",
        pub_export_macro: true,
        export_macro_name: "__export_trigger_world",
        default_bindings_module: "stepwell_guest::trigger::bindings",
    });
}

use bindings::stepwell::flow::trigger_types as wit;

/// What makes a source fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A clock.
    Time,
    /// Only explicit "run now" requests.
    Manual,
    /// External events.
    Event,
}

/// Who a source is and what it accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct Descriptor {
    /// The id (`[a-z0-9][a-z0-9._-]*`).
    pub id: String,
    /// The major version (at least 1).
    pub version: u32,
    /// A short human label.
    pub label: String,
    /// A JSON Schema of the config.
    pub config_schema: Value,
    /// A JSON Schema of admitted payloads.
    pub event_schema: Value,
    /// What makes it fire.
    pub kind: Kind,
}

impl Descriptor {
    /// A descriptor with permissive (`{}`) schemas.
    pub fn new(id: &str, version: u32, label: &str, kind: Kind) -> Self {
        Descriptor {
            id: id.into(),
            version,
            label: label.into(),
            config_schema: json!({}),
            event_schema: json!({}),
            kind,
        }
    }
}

/// One use of a source by one automation revision.
#[derive(Debug, Clone, PartialEq)]
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

/// What a source waits for next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Nothing fires before this RFC 3339 time.
    Until(String),
    /// No deadline.
    Idle,
    /// Never fires again.
    Exhausted,
}

/// One firing.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// A stable id for this firing.
    pub event_id: String,
    /// When it fired.
    pub fired_at: String,
    /// What the occurrence receives.
    pub payload: Value,
    /// Event sources: named inputs for the occurrence beyond the envelope
    /// (an object set on its `input_data`), if any.
    pub inputs: Option<Value>,
}

/// A firing in the shared form.
#[derive(Debug, Clone, PartialEq)]
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

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerError {
    /// Invalid config or argument (`invalid_definition`), naming the field.
    Invalid {
        /// The field, such as `trigger.config.every`.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Valid but unsupported (`unsupported_feature`), naming the field.
    Unsupported {
        /// The field.
        field: String,
        /// What is not supported.
        message: String,
    },
    /// Anything else.
    Failed(String),
}

impl TriggerError {
    /// An [`TriggerError::Invalid`] for `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        TriggerError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// An [`TriggerError::Unsupported`] for `field`.
    pub fn unsupported(field: impl Into<String>, message: impl Into<String>) -> Self {
        TriggerError::Unsupported {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A trigger source. Implement it on a unit struct and export it with
/// [`export_trigger_source!`](crate::export_trigger_source).
pub trait TriggerSource {
    /// Who the source is.
    fn descriptor() -> Descriptor;
    /// Checks a config and fills in its defaults (`now` is the creation time).
    fn validate(config: Value, now: &str) -> Result<Value, TriggerError>;
    /// The state of a new binding.
    fn initial_state(binding: &Binding, now: &str) -> Result<Value, TriggerError>;
    /// What the source waits for next. `events` are, for an event source,
    /// the records of its connection's stream after the automation's cursor
    /// (`{seq, event_id, stream, appended_at, payload}`, oldest first);
    /// empty for a time or manual source.
    fn prepare(
        binding: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<Wait, TriggerError>;
    /// The firing due at `now`, if any, and the new state (`events` as for
    /// [`TriggerSource::prepare`]).
    fn admit(
        binding: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError>;
    /// The state moved past everything due at or before `now`, admitting nothing.
    fn rearm(binding: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError>;
    /// The firing in the shared envelope form. The default copies the fields.
    fn normalize(
        binding: &Binding,
        event_id: &str,
        fired_at: &str,
        payload: Value,
    ) -> Result<Envelope, TriggerError> {
        Envelope::checked(binding, event_id, fired_at, payload)
    }
}

impl Envelope {
    /// The envelope of a firing of `binding`.
    pub fn of(binding: &Binding, event_id: &str, fired_at: &str, payload: Value) -> Self {
        Envelope {
            event_id: event_id.into(),
            source_id: binding.source_id.clone(),
            source_version: binding.source_version,
            fired_at: fired_at.into(),
            payload,
            binding_id: binding.binding_id.clone(),
        }
    }

    /// [`Envelope::of`], refusing an empty event id (what the default
    /// `normalize` does).
    pub fn checked(
        binding: &Binding,
        event_id: &str,
        fired_at: &str,
        payload: Value,
    ) -> Result<Self, TriggerError> {
        if event_id.is_empty() {
            return Err(TriggerError::invalid("event_id", "must not be empty"));
        }
        Ok(Envelope::of(binding, event_id, fired_at, payload))
    }

    /// This envelope as a firing of source `id@version`, whatever source its
    /// binding names (`manual@1` normalizes run-now firings under any
    /// automation's binding).
    pub fn as_source(mut self, id: &str, version: u32) -> Self {
        self.source_id = id.into();
        self.source_version = version;
        self
    }
}

fn parse(field: &str, text: &str) -> Result<Value, wit::TriggerError> {
    serde_json::from_str(text).map_err(|e| {
        wit::TriggerError::Invalid(wit::FieldError {
            field: field.into(),
            message: format!("is not JSON: {e}"),
        })
    })
}

fn to_wit_error(e: TriggerError) -> wit::TriggerError {
    match e {
        TriggerError::Invalid { field, message } => {
            wit::TriggerError::Invalid(wit::FieldError { field, message })
        }
        TriggerError::Unsupported { field, message } => {
            wit::TriggerError::Unsupported(wit::FieldError { field, message })
        }
        TriggerError::Failed(m) => wit::TriggerError::Failed(m),
    }
}

fn binding(b: wit::Binding) -> Result<Binding, wit::TriggerError> {
    Ok(Binding {
        config: parse("binding.config", &b.config)?,
        binding_id: b.binding_id,
        source_id: b.source_id,
        source_version: b.source_version,
    })
}

/// Glue between the WIT exports and a [`TriggerSource`]; used by
/// [`export_trigger_source!`](crate::export_trigger_source).
#[doc(hidden)]
pub mod glue {
    use super::*;

    pub fn descriptor<T: TriggerSource>() -> wit::Descriptor {
        let d = T::descriptor();
        wit::Descriptor {
            id: d.id,
            version: d.version,
            label: d.label,
            config_schema: crate::json_text(&d.config_schema),
            event_schema: crate::json_text(&d.event_schema),
            kind: match d.kind {
                Kind::Time => wit::SourceKind::Time,
                Kind::Manual => wit::SourceKind::Manual,
                Kind::Event => wit::SourceKind::Event,
            },
        }
    }

    pub fn validate<T: TriggerSource>(
        config: String,
        now: String,
    ) -> Result<String, wit::TriggerError> {
        let config = parse("trigger.config", &config)?;
        T::validate(config, &now)
            .map(|v| crate::json_text(&v))
            .map_err(to_wit_error)
    }

    pub fn initial_state<T: TriggerSource>(
        b: wit::Binding,
        now: String,
    ) -> Result<String, wit::TriggerError> {
        T::initial_state(&binding(b)?, &now)
            .map(|v| crate::json_text(&v))
            .map_err(to_wit_error)
    }

    fn events(text: &str) -> Result<Vec<Value>, wit::TriggerError> {
        match parse("events", text)? {
            Value::Array(items) => Ok(items),
            _ => Err(wit::TriggerError::Invalid(wit::FieldError {
                field: "events".into(),
                message: "is not a JSON array".into(),
            })),
        }
    }

    pub fn prepare<T: TriggerSource>(
        b: wit::Binding,
        state: String,
        now: String,
        events_json: String,
    ) -> Result<wit::TriggerWait, wit::TriggerError> {
        let state = parse("state", &state)?;
        let events = events(&events_json)?;
        T::prepare(&binding(b)?, &state, &now, &events)
            .map(|w| match w {
                Wait::Until(t) => wit::TriggerWait::Until(t),
                Wait::Idle => wit::TriggerWait::Idle,
                Wait::Exhausted => wit::TriggerWait::Exhausted,
            })
            .map_err(to_wit_error)
    }

    pub fn admit<T: TriggerSource>(
        b: wit::Binding,
        state: String,
        now: String,
        events_json: String,
    ) -> Result<wit::AdmitResult, wit::TriggerError> {
        let state = parse("state", &state)?;
        let events = events(&events_json)?;
        let (admission, state) =
            T::admit(&binding(b)?, &state, &now, &events).map_err(to_wit_error)?;
        Ok(wit::AdmitResult {
            admission: admission.map(|a| wit::Admission {
                event_id: a.event_id,
                fired_at: a.fired_at,
                payload: crate::json_text(&a.payload),
                inputs: a.inputs.map(|i| crate::json_text(&i)),
            }),
            state: crate::json_text(&state),
        })
    }

    pub fn rearm<T: TriggerSource>(
        b: wit::Binding,
        state: String,
        now: String,
    ) -> Result<String, wit::TriggerError> {
        let state = parse("state", &state)?;
        T::rearm(&binding(b)?, &state, &now)
            .map(|v| crate::json_text(&v))
            .map_err(to_wit_error)
    }

    pub fn normalize<T: TriggerSource>(
        b: wit::Binding,
        event_id: String,
        fired_at: String,
        payload: String,
    ) -> Result<wit::Envelope, wit::TriggerError> {
        let payload = parse("payload", &payload)?;
        let e = T::normalize(&binding(b)?, &event_id, &fired_at, payload).map_err(to_wit_error)?;
        Ok(wit::Envelope {
            event_id: e.event_id,
            source_id: e.source_id,
            source_version: e.source_version,
            fired_at: e.fired_at,
            payload: crate::json_text(&e.payload),
            binding_id: e.binding_id,
        })
    }
}

/// Export `$ty` (a type implementing [`TriggerSource`]) as this component's
/// trigger source. Call it once, at the crate root.
#[macro_export]
macro_rules! export_trigger_source {
    ($ty:ty) => {
        const _: () = {
            use $crate::trigger::bindings::stepwell::flow::trigger_types as __t;
            use $crate::trigger::glue;

            struct __StepwellTrigger;

            impl $crate::trigger::bindings::Guest for __StepwellTrigger {
                fn descriptor() -> __t::Descriptor {
                    glue::descriptor::<$ty>()
                }
                fn validate(config: String, now: String) -> Result<String, __t::TriggerError> {
                    glue::validate::<$ty>(config, now)
                }
                fn initial_state(b: __t::Binding, now: String) -> Result<String, __t::TriggerError> {
                    glue::initial_state::<$ty>(b, now)
                }
                fn prepare(b: __t::Binding, state: String, now: String, events: String) -> Result<__t::TriggerWait, __t::TriggerError> {
                    glue::prepare::<$ty>(b, state, now, events)
                }
                fn admit(b: __t::Binding, state: String, now: String, events: String) -> Result<__t::AdmitResult, __t::TriggerError> {
                    glue::admit::<$ty>(b, state, now, events)
                }
                fn rearm(b: __t::Binding, state: String, now: String) -> Result<String, __t::TriggerError> {
                    glue::rearm::<$ty>(b, state, now)
                }
                fn normalize(
                    b: __t::Binding,
                    event_id: String,
                    fired_at: String,
                    payload: String,
                ) -> Result<__t::Envelope, __t::TriggerError> {
                    glue::normalize::<$ty>(b, event_id, fired_at, payload)
                }
            }

            $crate::trigger::bindings::__export_trigger_world!(__StepwellTrigger with_types_in $crate::trigger::bindings);
        };
    };
}

#[cfg(feature = "connection")]
pub mod connection;

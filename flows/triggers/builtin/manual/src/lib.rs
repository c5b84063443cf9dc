//! `manual@1`: fires only when asked ("run now"). It never has a deadline;
//! a manual firing is normalized with the event id `manual:<command_id>`, as
//! source `manual` version 1 under whatever binding it is given (the
//! automation's own, whatever its trigger). State: the reference's trigger
//! slice, `{anchor: null, tick, scheduled_count, exhausted}`; `rearm` keeps
//! it and clears `exhausted`.
use serde_json::{json, Value};
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::*;

struct Manual;

impl TriggerSource for Manual {
    fn descriptor() -> Descriptor {
        Descriptor {
            config_schema: json!({"type": "object", "additionalProperties": false}),
            event_schema: json!({"type": "object"}),
            ..Descriptor::new("manual", 1, "Run now only", Kind::Manual)
        }
    }

    fn validate(config: Value, _now: &str) -> Result<Value, TriggerError> {
        match config {
            Value::Object(map) => match map.keys().next() {
                Some(k) => Err(TriggerError::invalid(
                    format!("trigger.config.{k}"),
                    "manual@1 takes no config",
                )),
                None => Ok(json!({})),
            },
            _ => Err(TriggerError::invalid("trigger.config", "must be an object")),
        }
    }

    fn initial_state(_: &Binding, _: &str) -> Result<Value, TriggerError> {
        Ok(json!({"anchor": null, "tick": 0, "scheduled_count": 0, "exhausted": false}))
    }

    fn prepare(_: &Binding, _: &Value, _: &str, _: &[Value]) -> Result<Wait, TriggerError> {
        Ok(Wait::Idle)
    }

    fn admit(
        _: &Binding,
        state: &Value,
        _: &str,
        _: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        Ok((None, state.clone()))
    }

    fn rearm(_: &Binding, state: &Value, _: &str) -> Result<Value, TriggerError> {
        let count = |k: &str| state.get(k).and_then(Value::as_u64).unwrap_or(0);
        Ok(json!({
            "anchor": state.get("anchor").cloned().unwrap_or(Value::Null),
            "tick": count("tick"),
            "scheduled_count": count("scheduled_count"),
            "exhausted": false,
        }))
    }

    fn normalize(
        binding: &Binding,
        event_id: &str,
        fired_at: &str,
        payload: Value,
    ) -> Result<Envelope, TriggerError> {
        match event_id.strip_prefix("manual:") {
            Some(command_id) if !command_id.is_empty() => {
                // Every run-now of any automation is a manual@1 firing, under
                // the automation's own (current) binding.
                Ok(Envelope::of(binding, event_id, fired_at, payload).as_source("manual", 1))
            }
            _ => Err(TriggerError::invalid(
                "event_id",
                format!("{event_id:?} is not manual:<command_id>"),
            )),
        }
    }
}

export_trigger_source!(Manual);

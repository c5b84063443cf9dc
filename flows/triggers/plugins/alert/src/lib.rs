//! `alert@1`, an example **event-source plugin**: an automation bound to a
//! connection of this source runs on the alerts sent to the connection
//! (`stepwell connections send <id> --data '{"severity": "error", "text":
//! "disk full"}'`, or `POST /v1/connections/<id>/events`) whose severity is
//! at least the binding's `min_severity` (`info` < `warning` < `error` <
//! `critical`; default `warning`). Alerts that arrive together become one
//! occurrence; an alert below the threshold never runs anything.
//!
//! Config: `{connection_id, min_severity?, max_batch?, start_at?}`. The
//! occurrence gets the named input `alerts`: each `{severity, text}`.
//!
//! The shared logic of connection-bound sources (cursor, batching, the
//! admission's payload) is `stepwell_guest::trigger::connection`: this
//! plugin adds a config field and a filter (`connection::admit_selected`:
//! alerts below the threshold are passed over, the cursor moving past them).
use serde_json::{json, Value};
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::connection;
use stepwell_guest::trigger::*;

const SEVERITIES: [&str; 4] = ["info", "warning", "error", "critical"];

fn rank(severity: &str) -> Option<usize> {
    SEVERITIES.iter().position(|s| *s == severity)
}

struct Alert;

/// Whether inbox record `e` is at or above the binding's threshold.
fn selected(binding: &Binding, e: &Value) -> bool {
    let min = rank(binding.config["min_severity"].as_str().unwrap_or("warning")).unwrap_or(1);
    e["payload"]["data"]["severity"]
        .as_str()
        .and_then(rank)
        .is_some_and(|r| r >= min)
}

/// The `alerts` input of an admission's payload.
fn alerts(payload: &Value) -> Option<Value> {
    let alerts: Vec<Value> = payload["events"]
        .as_array()?
        .iter()
        .map(|e| json!({"severity": e["data"]["severity"], "text": e["data"]["text"]}))
        .collect();
    Some(json!({ "alerts": alerts }))
}

impl TriggerSource for Alert {
    fn descriptor() -> Descriptor {
        let mut config_schema = connection::binding_config_schema();
        config_schema["properties"]["min_severity"] =
            json!({"type": "string", "enum": SEVERITIES, "default": "warning"});
        Descriptor {
            config_schema,
            event_schema: connection::batch_event_schema(),
            ..Descriptor::new("alert", 1, "When an alert is sent", Kind::Event)
        }
    }

    fn validate(config: Value, now: &str) -> Result<Value, TriggerError> {
        let mut rest = config.clone();
        let min = match rest.as_object_mut().and_then(|m| m.remove("min_severity")) {
            None | Some(Value::Null) => "warning".to_string(),
            Some(Value::String(s)) if rank(&s).is_some() => s,
            Some(_) => {
                return Err(TriggerError::invalid(
                    "trigger.config.min_severity",
                    "must be one of info, warning, error, critical",
                ))
            }
        };
        let mut out = connection::validate(rest, now)?;
        out["min_severity"] = json!(min);
        Ok(out)
    }

    fn initial_state(binding: &Binding, _: &str) -> Result<Value, TriggerError> {
        Ok(connection::initial_state(binding))
    }

    fn prepare(
        b: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<Wait, TriggerError> {
        // Due while anything is pending: passing over an alert below the
        // threshold moves the cursor too.
        connection::prepare(b, state, now, events)
    }

    fn admit(
        b: &Binding,
        state: &Value,
        now: &str,
        events: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        connection::admit_selected(b, state, now, events, |e| selected(b, e), alerts)
    }

    fn rearm(b: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
        connection::rearm(b, state, now)
    }
}

export_trigger_source!(Alert);

//! The `wait-until` example: `schedule` computes a time `vars.seconds` (default 2)
//! after the host's `now` and waits for it; `execute` completes the run.
use chrono::{DateTime, Duration, SecondsFormat};
use serde_json::json;
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

fn steps(input: Input) -> Result<Plan, NodeError> {
    match input.node_id.as_str() {
        "schedule" => {
            let seconds = match input.vars.get("seconds") {
                None => 2.0,
                Some(v) => v
                    .as_f64()
                    .filter(|s| *s >= 0.0)
                    .ok_or_else(|| NodeError::invalid("vars.seconds must be a number >= 0"))?,
            };
            let now = i64::try_from(input.now.seconds)
                .ok()
                .and_then(|s| DateTime::from_timestamp(s, input.now.nanoseconds))
                .ok_or_else(|| NodeError::invalid(format!("now {} is out of range", input.now)))?;
            let until = now + Duration::milliseconds((seconds * 1000.0) as i64);
            Ok(Plan::follow().with_effect(Effect::wait_until(
                until.to_rfc3339_opts(SecondsFormat::Micros, true),
            )))
        }
        "execute" => Ok(Plan::complete(json!({ "ok": true }))),
        other => Err(NodeError::invalid(format!("unknown node {other}"))),
    }
}

export_node!(steps);

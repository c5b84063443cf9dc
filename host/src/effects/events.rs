//! `emit_event`: durable events between runs.

use serde_json::{json, Map, Value};

use super::{invalid, opt_str, EffectContext, Outcome};
use crate::core::model::{RunStatus, WaitReason};
use crate::core::{Error, Result};
use crate::store::RunQuery;

/// `emit_event {name, payload?}`: resumes every run waiting (reason `event`)
/// on the key `name`, each with `payload` (default `null`), and ticks them.
/// The result is `{"name", "delivered", "run_ids"}`, plus `refused` (run id
/// and error) for listeners that could not continue (their workflow cannot be
/// loaded): those stay waiting, untouched. A listener that another caller
/// resumed first is skipped, not an error.
pub(crate) fn emit_event(ctx: &EffectContext<'_>, p: &Map<String, Value>) -> Result<Outcome> {
    let name = match opt_str("emit_event", p, "name") {
        Ok(Some(n)) => n.to_string(),
        Ok(None) => return Ok(invalid("emit_event", "name", "is required")),
        Err(o) => return Ok(o),
    };
    let payload = p.get("payload").cloned().unwrap_or(Value::Null);
    let listeners = ctx.runtime.store().list_runs(&RunQuery {
        status: Some(RunStatus::Waiting),
        wait_reason: Some(WaitReason::Event),
        wait_key: Some(name.clone()),
        ..RunQuery::default()
    })?;
    let mut delivered = Vec::new();
    let mut refused = Vec::new();
    for listener in listeners {
        if listener.run_id == ctx.run.run_id {
            continue;
        }
        match ctx.runtime.resume(&listener.run_id, &name, payload.clone()) {
            Ok(_) => delivered.push(listener.run_id),
            Err(Error::StaleResume { .. }) => {}
            Err(e @ Error::Store(_)) => return Err(e),
            // A listener whose workflow cannot be loaded is left waiting,
            // untouched; the others still get the event.
            Err(e) => refused.push(json!({ "run_id": listener.run_id, "error": e.to_string() })),
        }
    }
    let mut result = json!({
        "name": name,
        "delivered": delivered.len(),
        "run_ids": delivered,
    });
    if !refused.is_empty() {
        result["refused"] = Value::Array(refused);
    }
    Ok(Outcome::Completed(result))
}

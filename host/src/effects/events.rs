//! `emit_event`: durable events between runs.

use serde_json::{json, Map, Value};

use super::{invalid, opt_str, EffectContext, Outcome};
use crate::core::model::{RunStatus, StepStatus, WaitReason};
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
    let key = crate::core::runtime::effect_idempotency_key(ctx.run, ctx.seq);
    // The listeners are fixed, and recorded, before any is resumed: a step
    // replayed after a crash reaches the same ones, and skips those this
    // event already resumed.
    let prior = ctx
        .runtime
        .find_records(&ctx.run.run_id, &key)?
        .into_iter()
        .find(|r| r.status == StepStatus::Started)
        .and_then(|r| r.result)
        .and_then(|v| serde_json::from_value::<Vec<String>>(v["targets"].clone()).ok());
    let targets = match prior {
        Some(t) => t,
        None => {
            let targets: Vec<String> = ctx
                .runtime
                .store()
                .list_runs(&RunQuery {
                    status: Some(RunStatus::Waiting),
                    wait_reason: Some(WaitReason::Event),
                    wait_key: Some(name.clone()),
                    ..RunQuery::default()
                })?
                .into_iter()
                .map(|r| r.run_id)
                .filter(|id| *id != ctx.run.run_id)
                .collect();
            let mut started = ctx.started.clone();
            started.result = Some(json!({ "targets": targets }));
            ctx.runtime.append_ahead(&[started])?;
            targets
        }
    };
    let mut delivered = Vec::new();
    let mut refused = Vec::new();
    for target in targets {
        match ctx
            .runtime
            .resume_by(&target, &name, payload.clone(), Some(&key))
        {
            Ok(_) => delivered.push(target),
            // Not waiting any more: this event reached it before a crash
            // (its resume record names this effect), or someone else did.
            Err(Error::StaleResume { .. }) => {
                if resumed_by(ctx, &target, &key)? {
                    delivered.push(target);
                }
            }
            Err(e @ Error::Store(_)) => return Err(e),
            // A listener whose workflow cannot be loaded is refused before
            // anything is written: it stays waiting, untouched. Any other
            // error came after its resume was committed.
            Err(e) => {
                if resumed_by(ctx, &target, &key)? {
                    delivered.push(target);
                } else {
                    refused.push(json!({ "run_id": target, "error": e.to_string() }));
                }
            }
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

/// Whether `run_id`'s ledger records a resume caused by effect `key`.
fn resumed_by(ctx: &EffectContext<'_>, run_id: &str, key: &str) -> Result<bool> {
    Ok(ctx.runtime.get_ledger(run_id)?.iter().any(|r| {
        r.result
            .as_ref()
            .and_then(|v| v.get("resumed"))
            .and_then(|v| v.get("cause"))
            .and_then(Value::as_str)
            == Some(key)
    }))
}

//! `start_subworkflow`: child runs.

use serde_json::{json, Map, Value};

use super::{invalid, opt_str, EffectContext, Outcome};
use crate::core::model::{RunState, RunStatus, WaitReason, WaitState};
use crate::core::runtime::StartOptions;
use crate::core::{Error, Result};

/// The namespace of the default child run ids (uuid5 of
/// `"<effect idempotency key>:subworkflow"`, the key being
/// `<parent_run_id>:<effect_seq>` until a snapshot is restored): a step
/// replayed after a crash asks for the same child and re-attaches to it.
pub const SUBWORKFLOW_NAMESPACE: uuid::Uuid = uuid::uuid!("6b1f7c0e-2d4a-5c3b-9e8f-1a2b3c4d5e6f");

/// The wait key of a parent waiting on child `child_run_id`.
pub fn wait_key(child_run_id: &str) -> String {
    format!("subworkflow:{child_run_id}")
}

/// What a parent receives when its child completed: `{"sub_run_id", "output"}`.
pub fn child_result(child: &RunState) -> Value {
    json!({ "sub_run_id": child.run_id, "output": child.output })
}

/// Why a parent fails when its child failed or was cancelled.
pub fn child_failure(child: &RunState) -> String {
    format!(
        "subworkflow_failed: child run {} ({}) ended {}: {}",
        child.run_id,
        child.workflow_id,
        child.status.as_str(),
        child.error.as_deref().unwrap_or("no error recorded")
    )
}

/// `start_subworkflow {workflow_id, vars?, run_id?, session_id?, async?, wait?}`.
///
/// - sync (default): the child runs inside this step; its output comes back
///   as `{"sub_run_id", "output"}`. If the child parks, the parent waits
///   (reason `subworkflow`, key `subworkflow:<child id>`) until the driver
///   resumes it when the child ends.
/// - `async: true, wait: true`: the child is created and left for the driver;
///   the parent waits on it.
/// - `async: true`: fire and forget; the result is `{"sub_run_id"}`.
///
/// `run_id` names the child explicitly (create-if-absent, identity-checked);
/// by default the id is derived from the parent's id and the effect's
/// sequence number. A child that failed fails the parent.
pub(crate) fn start_subworkflow(
    ctx: &EffectContext<'_>,
    p: &Map<String, Value>,
) -> Result<Outcome> {
    let k = "start_subworkflow";
    let workflow_id = match opt_str(k, p, "workflow_id") {
        Ok(Some(w)) => w.to_string(),
        Ok(None) => return Ok(invalid(k, "workflow_id", "is required")),
        Err(o) => return Ok(o),
    };
    let vars = match p.get("vars") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Ok(invalid(k, "vars", "must be a JSON object")),
    };
    let flag = |name: &str| match p.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(invalid(k, name, "must be a boolean")),
    };
    let (is_async, wait) = match (flag("async"), flag("wait")) {
        (Ok(a), Ok(w)) => (a, w),
        (Err(o), _) | (_, Err(o)) => return Ok(o),
    };
    let run_id = match opt_str(k, p, "run_id") {
        Ok(Some(id)) => id.to_string(),
        Ok(None) => uuid::Uuid::new_v5(
            &SUBWORKFLOW_NAMESPACE,
            format!(
                "{}:subworkflow",
                crate::core::runtime::effect_idempotency_key(ctx.run, ctx.seq)
            )
            .as_bytes(),
        )
        .to_string(),
        Err(o) => return Ok(o),
    };
    let session_id = match opt_str(k, p, "session_id") {
        Ok(s) => s.map(str::to_string).or_else(|| ctx.run.session_id.clone()),
        Err(o) => return Ok(o),
    };
    let options = StartOptions {
        vars,
        run_id: Some(run_id),
        actor_id: ctx.run.actor_id.clone(),
        session_id,
        parent_run_id: Some(ctx.run.run_id.clone()),
    };
    let child_id = match ctx.runtime.start(&workflow_id, options) {
        Ok(id) => id,
        Err(
            e @ (Error::IdentityConflict { .. }
            | Error::UnknownWorkflow { .. }
            | Error::InvalidInput { .. }),
        ) => return Ok(Outcome::Failed(e.to_string())),
        Err(e) => return Err(e),
    };
    if is_async && !wait {
        return Ok(Outcome::Completed(json!({ "sub_run_id": child_id })));
    }
    let child = if is_async {
        ctx.runtime.get_state(&child_id)?
    } else {
        ctx.runtime.tick(&child_id)?
    };
    Ok(match child.status {
        RunStatus::Completed => Outcome::Completed(child_result(&child)),
        RunStatus::Failed | RunStatus::Cancelled => Outcome::Failed(child_failure(&child)),
        RunStatus::Running | RunStatus::Waiting => Outcome::Waiting(Box::new(WaitState {
            reason: WaitReason::Subworkflow,
            wait_key: wait_key(&child_id),
            until: None,
            resume_to_node: None,
            result_key: None,
            prompt: None,
            choices: None,
            details: Some(json!({ "sub_run_id": child_id, "sub_workflow_id": workflow_id })),
        })),
    })
}

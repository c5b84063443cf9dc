//! What an occurrence produced: the pure rules are the shared crate's
//! ([`stepwell_automation_core::outcome`]); here they read a run of the
//! store.

use serde_json::{json, Value};

pub use stepwell_automation_core::outcome::*;

use stepwell_runtime::core::model::RunState;

/// What the controller sees of run `run` ([`ChildView::of`]).
pub fn child_view(run: &RunState) -> ChildView {
    ChildView::of(
        &run.run_id,
        run.status.as_str(),
        run.output.as_ref(),
        run.error.as_deref(),
    )
}

/// Why run `run`, found under the id of an occurrence of the automation
/// `controller_id`, is not that occurrence: it was not started by that
/// controller (its id was taken by another run). `None` when it is the
/// controller's own child. The controller never waits on, reads the outcome
/// of, cancels or resumes such a run.
pub fn taken_occurrence_id(controller_id: &str, run: &RunState) -> Option<String> {
    if run.parent_run_id.as_deref() == Some(controller_id) {
        return None;
    }
    let started_by = match run.parent_run_id.as_deref() {
        Some(parent) => format!("a child of run {parent}"),
        None => "a root run".to_string(),
    };
    Some(format!(
        "identity_conflict: the occurrence's run id {} is taken by another run ({started_by}, workflow {}), not started by automation {controller_id}",
        run.run_id, run.workflow_id
    ))
}

/// What the controller `controller_id` sees of the run under its
/// occurrence's id: [`child_view`] of its own child; for a run it did not
/// start ([`taken_occurrence_id`]), a `failed` attempt whose error says so
/// (so the occurrence fails, or is retried under its next attempt's id,
/// with that error in its `failure` attention item).
pub fn occurrence_view(controller_id: &str, run: &RunState) -> ChildView {
    match taken_occurrence_id(controller_id, run) {
        None => child_view(run),
        Some(error) => ChildView::of(&run.run_id, "failed", None, Some(&error)),
    }
}

/// The outcome of the ended occurrence root `child`
/// ([`stepwell_automation_core::normalize_occurrence_output`]).
pub fn normalize_occurrence_output(child: &RunState) -> OccurrenceOutcome {
    stepwell_automation_core::normalize_occurrence_output(&child_view(child))
}

/// The occurrence in flight, `{index, run_id, attempt, status}` with status
/// `admitted`, `running` (dispatched) or `backoff`, or `None`.
pub fn current_occurrence(controller: &RunState) -> Option<Value> {
    let pending = controller
        .vars
        .get("_runtime")?
        .get("automation")?
        .get("pending_occurrence")?
        .as_object()?;
    let phase = pending
        .get("phase")
        .map(py_str)
        .unwrap_or_else(|| "None".into());
    let status = match phase.as_str() {
        "admitted" => "admitted",
        "dispatched" => "running",
        "backoff" => "backoff",
        other => other,
    };
    Some(json!({
        "index": pending.get("index").and_then(Value::as_i64).unwrap_or(0),
        "run_id": pending.get("run_id").cloned().unwrap_or(Value::Null),
        "attempt": pending.get("attempt").and_then(Value::as_i64).filter(|a| *a != 0).unwrap_or(1),
        "status": status,
    }))
}

//! What an occurrence produced: the pure rules are the shared crate's
//! ([`stepwell_automation_core::outcome`]); here they read a run of the
//! store.

use serde_json::{json, Value};

pub use stepwell_automation_core::outcome::*;

use crate::core::model::RunState;

/// What the controller sees of run `run` ([`ChildView::of`]).
pub fn child_view(run: &RunState) -> ChildView {
    ChildView::of(
        &run.run_id,
        run.status.as_str(),
        run.output.as_ref(),
        run.error.as_deref(),
    )
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

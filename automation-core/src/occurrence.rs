//! The controller's decisions about the occurrence in flight: dispatching
//! its current attempt, and what its run's end means (completed, cancelled,
//! retried after a backoff, or failed).

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use crate::definition::backoff_delay;
use crate::ids::{occurrence_run_id, OccurrenceKind};
use crate::outcome::{complete_occurrence, normalize_occurrence_output, ChildView};
use crate::protocol::{Planned, TriggerWait};
use crate::time::{format_timestamp, parse_timestamp, respell};
use crate::AutomationError;

fn pending_of(state: &Value) -> Result<&Map<String, Value>, AutomationError> {
    state
        .get("pending_occurrence")
        .and_then(Value::as_object)
        .ok_or_else(|| AutomationError::new("invalid_state", None, "no occurrence is pending"))
}

fn number(p: &Map<String, Value>, key: &str) -> Result<u64, AutomationError> {
    p.get(key).and_then(Value::as_u64).ok_or_else(|| {
        AutomationError::new(
            "invalid_state",
            Some(&format!("pending_occurrence.{key}")),
            format!("the pending occurrence has no whole-number {key}"),
        )
    })
}

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The `automation.dispatched` decision of the pending occurrence's current
/// attempt (keyed by the attempt's run id), or `None` when it was
/// dispatched already: the run id is the deterministic one
/// ([`occurrence_run_id`]), the phase becomes `dispatched`, `retry_at` null.
pub fn plan_dispatch(
    automation_id: &str,
    state: &Value,
) -> Result<Option<Planned>, AutomationError> {
    let pending = pending_of(state)?;
    if pending.get("phase").and_then(Value::as_str) == Some("dispatched") {
        return Ok(None);
    }
    let index = number(pending, "index")?;
    let attempt = u32::try_from(number(pending, "attempt")?).unwrap_or(u32::MAX);
    let kind = match pending
        .get("command_id")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    {
        Some(command_id) => OccurrenceKind::Manual { command_id },
        None => OccurrenceKind::Scheduled {
            revision: number(pending, "revision")?,
            index,
        },
    };
    let child = occurrence_run_id(automation_id, kind, attempt);
    let mut next = pending.clone();
    next.insert("phase".into(), json!("dispatched"));
    next.insert("run_id".into(), json!(child));
    next.insert("retry_at".into(), Value::Null);
    Ok(Some(Planned {
        name: "automation.dispatched".into(),
        discriminator: child.clone(),
        fields: fields(json!({"run_id": child, "index": index, "attempt": attempt})),
        delta: json!({"state": {"pending_occurrence": next}}),
    }))
}

/// What the end of the dispatched attempt's run `child` means, at `now`:
/// `None` while it has not ended (the controller waits on it again);
/// else `automation.completed` (`completed` if it succeeded, `cancelled`
/// if it was cancelled or a stop was asked, `failed` when no attempt is
/// left) or `automation.retry_scheduled` (the next attempt after the
/// backoff; a scheduled occurrence of a paused automation is not retried).
pub fn plan_outcome(
    definition: &Value,
    state: &Value,
    child: &ChildView,
    now: DateTime<Utc>,
) -> Result<Option<Planned>, AutomationError> {
    let pending = pending_of(state)?;
    if !child.ended() {
        return Ok(None);
    }
    let at = format_timestamp(now);
    let outcome = normalize_occurrence_output(child);
    let index = number(pending, "index")?;
    let complete = |status: &str| {
        let c = complete_occurrence(definition, state, status, Some(&outcome), &at);
        Planned {
            name: "automation.completed".into(),
            discriminator: index.to_string(),
            fields: fields(c.fields),
            delta: json!({"state": c.state}),
        }
    };
    if outcome.success {
        return Ok(Some(complete("completed")));
    }
    if child.status == "cancelled" || pending.get("stop_requested") == Some(&json!(true)) {
        return Ok(Some(complete("cancelled")));
    }
    let retry = pending
        .get("retry")
        .filter(|r| r.is_object())
        .cloned()
        .unwrap_or(json!({"max_attempts": 1}));
    let attempt = number(pending, "attempt")?;
    let scheduled = pending.get("command_id").is_none_or(Value::is_null);
    let paused = state.get("paused") == Some(&json!(true));
    let max = retry["max_attempts"].as_u64().unwrap_or(1);
    if attempt < max && !(paused && scheduled) {
        let delay = backoff_delay(
            &json!({"retry": retry}),
            u32::try_from(attempt).unwrap_or(u32::MAX),
        )?;
        let retry_at = format_timestamp(now + delay);
        let run_id = pending.get("run_id").cloned().unwrap_or(Value::Null);
        let mut next = pending.clone();
        next.insert("attempt".into(), json!(attempt + 1));
        next.insert("phase".into(), json!("backoff"));
        next.insert("retry_at".into(), json!(retry_at));
        return Ok(Some(Planned {
            name: "automation.retry_scheduled".into(),
            discriminator: run_id.as_str().unwrap_or_default().to_string(),
            fields: fields(json!({"run_id": run_id, "index": index, "attempt": attempt,
                                  "error": outcome.error, "retry_at": retry_at})),
            delta: json!({"state": {"pending_occurrence": next}}),
        }));
    }
    Ok(Some(complete("failed")))
}

/// What the controller's `wait` node decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitPlan {
    /// Something is to be done now: go on to `admit`.
    Go,
    /// Nothing can ever run again: go on to `end`.
    End,
    /// Park on the wake wait, until this time (`None`: until a command).
    Park(Option<String>),
}

/// Whether `read_definition` ends the controller: nothing is pending and
/// the automation is archived or its trigger exhausted.
pub fn definition_ends(definition: &Value, state: &Value) -> bool {
    let set = |v: Option<&Value>| !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)));
    state.get("pending_occurrence").is_none_or(Value::is_null)
        && (set(definition.get("archived_at")) || set(state.get("exhausted")))
}

/// What the controller's `wait` node decides at `now` from the
/// definition and the state alone, first match: a pending occurrence goes
/// on (or parks until its retry time during a backoff); a queued run-now
/// goes on; archived ends; paused parks with no deadline. `None`: the
/// trigger source decides ([`wait_after_prepare`] on its `prepare` answer
/// for the persisted cursor).
pub fn plan_wait_locally(
    definition: &Value,
    state: &Value,
    now: DateTime<Utc>,
) -> Option<WaitPlan> {
    let set = |v: Option<&Value>| !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)));
    let due = |t: &str| parse_timestamp(t, "until").is_ok_and(|t| t <= now);
    if let Some(p) = state.get("pending_occurrence").filter(|p| !p.is_null()) {
        let retry_at = p.get("retry_at").and_then(Value::as_str);
        if p["phase"] == "backoff" && !set(p.get("stop_requested")) && !retry_at.is_some_and(due) {
            return Some(WaitPlan::Park(retry_at.map(str::to_string)));
        }
        return Some(WaitPlan::Go);
    }
    if set(state.get("manual_pending")) {
        return Some(WaitPlan::Go);
    }
    if set(definition.get("archived_at")) {
        return Some(WaitPlan::End);
    }
    if set(state.get("paused")) {
        return Some(WaitPlan::Park(None));
    }
    None
}

/// What the `wait` node decides at `now` from its trigger source's
/// `prepare` answer: exhausted ends, idle parks with no deadline, a due
/// time goes on, a later one parks until it.
pub fn wait_after_prepare(answer: &TriggerWait, now: DateTime<Utc>) -> WaitPlan {
    match answer {
        TriggerWait::Exhausted => WaitPlan::End,
        TriggerWait::Idle => WaitPlan::Park(None),
        TriggerWait::Until { until } if parse_timestamp(until, "until").is_ok_and(|t| t <= now) => {
            WaitPlan::Go
        }
        TriggerWait::Until { until } => WaitPlan::Park(Some(respell(until))),
    }
}

/// The payload of the controller's wake wait (`wait_event` on
/// `automation:<id>:wake`, with `until` when it has a deadline).
pub fn wake_payload(automation_id: &str, until: Option<&str>) -> Value {
    let mut p = json!({"wait_key": crate::ids::wake_wait_key(automation_id)});
    if let Some(u) = until {
        p["until"] = json!(u);
    }
    p
}

//! What a reader sees of an automation: its view (`get_automation`), its
//! list summary, and when it fires next.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::definition::{automation_status, trigger_state_of, AutomationStatus};
use super::ids::wake_wait_key;
use super::outcome::current_occurrence;
use super::time::{format_timestamp, parse_timestamp};
use super::AutomationError;
use crate::triggers::{SourceKind, TriggerRegistry, Wait};
use stepwell_runtime::core::model::{RunState, RunStatus, WaitReason};

/// The history window of a growing context, in tokens, when the definition
/// names none.
pub const HISTORY_REPLAY_MAX_TOKENS: u64 = 50_000;

fn parts(run: &RunState) -> Result<(&Value, &Value), AutomationError> {
    let definition = run
        .vars
        .get("_meta")
        .and_then(|m| m.get("automation"))
        .filter(|d| d.is_object());
    let Some(definition) = definition else {
        return Err(AutomationError::new(
            "automation_not_found",
            None,
            format!("Automation {} does not exist.", run.run_id),
        ));
    };
    static EMPTY: Value = Value::Null;
    let state = run
        .vars
        .get("_runtime")
        .and_then(|r| r.get("automation"))
        .filter(|s| s.is_object())
        .unwrap_or(&EMPTY);
    Ok((definition, state))
}

/// The deadline of the controller's own wake wait, if it is parked on one.
fn wake_until(run: &RunState) -> Option<&str> {
    let w = run.waiting.as_ref()?;
    (run.status == RunStatus::Waiting
        && w.reason == WaitReason::Event
        && w.wait_key == wake_wait_key(&run.run_id))
    .then_some(w.until.as_deref())
    .flatten()
    .filter(|u| !u.is_empty())
}

/// When the automation whose controller is `run` admits its next
/// occurrence, as the controller will decide it, at `now`: `None` unless
/// it is active; the wake wait's deadline when the controller is parked on
/// it; the retry time during a backoff; else the trigger's own answer on
/// the persisted cursor (the next tick if it is ahead, else the tick a
/// coalesced admission fires as soon as the running occurrence ends).
/// `None` for a manual or event trigger and an exhausted one.
pub fn next_fire_at(
    run: &RunState,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Result<Option<String>, AutomationError> {
    let (definition, state) = parts(run)?;
    if automation_status(run) != AutomationStatus::Active {
        return Ok(None);
    }
    if run.status == RunStatus::Waiting
        && run
            .waiting
            .as_ref()
            .is_some_and(|w| w.wait_key == wake_wait_key(&run.run_id))
    {
        return Ok(run
            .waiting
            .as_ref()
            .and_then(|w| w.until.clone())
            .filter(|u| !u.is_empty()));
    }
    let pending = state.get("pending_occurrence").filter(|p| p.is_object());
    if let Some(p) = pending.filter(|p| p["phase"] == "backoff") {
        return Ok(p
            .get("retry_at")
            .and_then(Value::as_str)
            .map(str::to_string));
    }
    let b = super::commands::binding_of(definition);
    let name = format!("{}@{}", b.source_id, b.source_version);
    let trigger_error = super::definition::trigger_failure;
    let entry = triggers.entries().iter().find(|e| e.name == name);
    if entry
        .and_then(|e| e.descriptor.as_ref())
        .is_some_and(|d| d.kind == SourceKind::Event)
    {
        return Ok(None);
    }
    let source = triggers.get(&name).map_err(trigger_error)?;
    let at = format_timestamp(now);
    let slice = trigger_state_of(state);
    let Wait::Until { until } = source
        .prepare(&b, &slice, &at, &[])
        .map_err(trigger_error)?
    else {
        return Ok(None);
    };
    if parse_timestamp(&until, "until").is_ok_and(|u| u > now) {
        return Ok(Some(super::time::respell(&until)));
    }
    let admitted = source.admit(&b, &slice, &at, &[]).map_err(trigger_error)?;
    let due = admitted.admission.map_or(until, |a| a.fired_at);
    Ok(Some(super::time::respell(&due)))
}

/// A stored run time in the automation layer's spelling (`+00:00`).
fn reference_time(t: &str) -> Value {
    match super::time::parse_timestamp(t, "at") {
        Ok(t) => Value::String(format_timestamp(t)),
        Err(_) => Value::String(t.to_string()),
    }
}

/// The automation whose controller is `run`, as a reader sees it at
/// `now`: `{automation_id, definition, active_revision, state (without
/// intent), status, next_fire_at, current_occurrence}`.
pub fn get_automation(
    run: &RunState,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Result<Value, AutomationError> {
    let next = next_fire_at(run, now, triggers)?;
    automation_view(run, json!(next))
}

/// [`get_automation`] with `next_fire_at` given (`null` where the trigger
/// source cannot be asked).
pub(crate) fn automation_view(run: &RunState, next: Value) -> Result<Value, AutomationError> {
    let (definition, state) = parts(run)?;
    let active = state
        .get("active_revision")
        .and_then(Value::as_u64)
        .filter(|r| *r != 0)
        .or_else(|| definition["revision"].as_u64());
    let shown: Map<String, Value> = state
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| *k != "intent")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    Ok(json!({
        "automation_id": run.run_id,
        "definition": definition,
        "active_revision": active,
        "state": shown,
        "status": automation_status(run).as_str(),
        "next_fire_at": next,
        "current_occurrence": current_occurrence(run),
    }))
}

/// The summary of the automation whose controller is `run`, at `now` (one
/// row of the automations list): `{automation_id, title, status, revision,
/// trigger, context_mode, growing_max_tokens, target, session_id,
/// workspace_root, next_fire_at, retry_at, current_occurrence,
/// occurrence_count, pending_occurrence, last_outcome, archived_at,
/// created_at, updated_at}`.
pub fn automation_summary(
    run: &RunState,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Result<Value, AutomationError> {
    let (definition, state) = parts(run)?;
    let pending = state.get("pending_occurrence").filter(|p| p.is_object());
    let in_backoff = pending.is_some_and(|p| p["phase"] == "backoff");
    let context = definition.get("context").filter(|c| c.is_object());
    let next_index = state.get("next_index").and_then(Value::as_i64).unwrap_or(1);
    Ok(json!({
        "automation_id": run.run_id,
        "title": definition.get("title"),
        "status": automation_status(run).as_str(),
        "revision": definition.get("revision"),
        "trigger": definition.get("trigger"),
        "context_mode": context.and_then(|c| c.get("mode")).cloned().unwrap_or(json!("independent")),
        "growing_max_tokens": context
            .and_then(|c| c.get("growing"))
            .and_then(|g| g.get("max_tokens"))
            .cloned()
            .unwrap_or(json!(HISTORY_REPLAY_MAX_TOKENS)),
        "target": definition.get("target"),
        "session_id": run.session_id,
        "workspace_root": definition.get("workspace_root"),
        "next_fire_at": next_fire_at(run, now, triggers)?,
        "retry_at": wake_until(run).filter(|_| in_backoff),
        "current_occurrence": current_occurrence(run),
        "occurrence_count": (next_index - 1).max(0),
        "pending_occurrence": pending,
        "last_outcome": state.get("last_outcome").cloned().unwrap_or(Value::Null),
        "archived_at": definition.get("archived_at").cloned().unwrap_or(Value::Null),
        "created_at": reference_time(&run.created_at),
        "updated_at": reference_time(&run.updated_at),
    }))
}

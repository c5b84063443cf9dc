//! The automation definition: the pure rules are the shared crate's
//! ([`stepwell_automation_core::definition`]); here are the parts that
//! need the host: the trigger sources' checks of a trigger's config, and
//! the status rule over a controller run.

use chrono::{DateTime, Utc};
use serde_json::Value;

pub use stepwell_automation_core::definition::*;

use super::AutomationError;
use crate::triggers::{TriggerError, TriggerRegistry};
use stepwell_runtime::core::model::{RunState, RunStatus};

type Res<T> = Result<T, AutomationError>;

/// A trigger source's refusal or failure as an automation error (an
/// unknown or unusable source is `unknown_trigger_source`).
pub(crate) fn trigger_failure(e: TriggerError) -> AutomationError {
    match e {
        TriggerError::Invalid { field, message } => AutomationError::invalid(&field, message),
        TriggerError::Unsupported { field, message } => {
            AutomationError::unsupported(&field, message)
        }
        TriggerError::UnknownSource(_)
        | TriggerError::Unavailable { .. }
        | TriggerError::Input { .. } => AutomationError::new(
            "unknown_trigger_source",
            Some("trigger.source_id"),
            without_code(&e.to_string(), "unknown_trigger_source"),
        ),
        other => AutomationError::new(
            other.reason_code(),
            Some("trigger"),
            without_code(&other.to_string(), other.reason_code()),
        ),
    }
}

/// `text` without a leading `<code>: `: the error that carries it names
/// its code once.
fn without_code(text: &str, code: &str) -> String {
    text.strip_prefix(code)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(text)
        .to_string()
}

impl TriggerCheck for TriggerRegistry {
    fn validate(&self, name: &str, config: &Value, now: &str) -> Res<Value> {
        let source = self.get(name).map_err(trigger_failure)?;
        source.validate(config, now).map_err(trigger_failure)
    }
}

/// Validates creation request `request` of automation `automation_id` and
/// builds revision 1 of its definition (`vars._meta.automation`), as of
/// `now`, with the trigger sources of `triggers` checking the trigger's
/// config ([`stepwell_automation_core::build_definition`]).
pub fn build_definition(
    request: &Value,
    automation_id: &str,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Res<Value> {
    stepwell_automation_core::build_definition(request, automation_id, now, triggers)
}

/// The next revision of `definition` with `changes` applied, as of `now`
/// ([`stepwell_automation_core::revise_definition`]).
pub fn revise_definition(
    definition: &Value,
    changes: &Value,
    automation_id: &str,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Res<Value> {
    stepwell_automation_core::revise_definition(definition, changes, automation_id, now, triggers)
}

/// An automation's status, by one rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutomationStatus {
    /// Firing as its trigger says.
    Active,
    /// Paused by a command: no scheduled occurrence is admitted.
    Paused,
    /// The controller completed (its trigger is exhausted).
    Completed,
    /// The controller failed or was cancelled: it never runs again.
    Failed,
    /// Archived (whatever the controller run's status).
    Archived,
}

impl AutomationStatus {
    /// The wire name (`active`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AutomationStatus::Active => "active",
            AutomationStatus::Paused => "paused",
            AutomationStatus::Completed => "completed",
            AutomationStatus::Failed => "failed",
            AutomationStatus::Archived => "archived",
        }
    }
}

/// The status of the automation whose controller run is `run`: `archived`
/// if its definition has `archived_at`; `failed` if the run failed or was
/// cancelled; `completed` if it completed; `paused` if its state says so;
/// else `active`.
pub fn automation_status(run: &RunState) -> AutomationStatus {
    let definition = run.vars.get("_meta").and_then(|m| m.get("automation"));
    let state = run.vars.get("_runtime").and_then(|r| r.get("automation"));
    let truthy = |v: Option<&Value>| match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Bool(true)) => true,
    };
    if truthy(definition.and_then(|d| d.get("archived_at"))) {
        return AutomationStatus::Archived;
    }
    match run.status {
        RunStatus::Failed | RunStatus::Cancelled => AutomationStatus::Failed,
        RunStatus::Completed => AutomationStatus::Completed,
        _ if truthy(state.and_then(|s| s.get("paused"))) => AutomationStatus::Paused,
        _ => AutomationStatus::Active,
    }
}

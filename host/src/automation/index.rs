//! The run index's attribution columns as the automations define them
//! (seed 003 "Run attribution"), and which controllers an event wakes.

use serde_json::Value;

use crate::core::model::{RunState, RunStatus};
use crate::store::{index::workspace_root, Attribution, RunIndexer};

/// The automations' [`RunIndexer`], installed by the
/// [`Automations`](super::Automations) plugin. A run's attribution comes
/// from its inline `vars._meta`, first match wins:
///
/// | `_meta` has | automation_id | role | occurrence_index | session_kind |
/// |---|---|---|---|---|
/// | `automation` (object) | the run's own id | `controller` | - | `automation` |
/// | `occurrence` (object) | its `automation_id` | its `role` if `occurrence` or `descendant`, else `occurrence` | its `occurrence_index` (integers only) | its `session_kind` if `automation`, `occurrence` or `chat`, else `occurrence` |
/// | `discussion` (object) | its `automation_id` | `discussion` | its `occurrence_index` | `discussion` |
/// | `schedule.kind == "scheduled_run"` | - | `legacy_schedule` | - | `automation` |
/// | otherwise | - | - | - | `chat` |
///
/// and it wakes on the connection of its trigger when it is a controller
/// idle at its wake wait, neither paused nor archived.
///
/// ```
/// use stepwell::automation::AutomationIndex;
/// use stepwell::store::RunIndexer;
/// # use stepwell::{RunState, RunStatus};
/// # let mut run: RunState = serde_json::from_value(serde_json::json!({
/// #     "run_id": "r1", "workflow_id": "wf", "status": "running", "vars": {},
/// #     "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})).unwrap();
/// run.vars.insert("_meta".into(), serde_json::json!({"discussion": {"automation_id": "a1"}}));
/// let row = AutomationIndex.index(&run);
/// assert_eq!(row.role.as_deref(), Some("discussion"));
/// assert_eq!(row.session_kind.as_deref(), Some("discussion"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct AutomationIndex;

impl RunIndexer for AutomationIndex {
    fn index(&self, run: &RunState) -> Attribution {
        let mut a = attribution(run);
        a.workspace_root = workspace_root(run);
        a.wakes_on = wakes_on(run);
        a
    }
}

/// A string (stripped, non-empty) or an integer, as text; booleans and
/// other values are not ids.
fn id_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.trim().to_string()).filter(|s| !s.is_empty()),
        Value::Number(n) if n.is_i64() || n.is_u64() => Some(n.to_string()),
        _ => None,
    }
}

/// `v` if it is one of `allowed`, else `default`.
fn one_of(v: Option<&Value>, allowed: &[&str], default: &str) -> Option<String> {
    let s = v.and_then(Value::as_str).filter(|s| allowed.contains(s));
    Some(s.unwrap_or(default).to_string())
}

/// The first matching row of the table above, without the workspace root.
fn attribution(run: &RunState) -> Attribution {
    let meta = run.vars.get("_meta").and_then(Value::as_object);
    let section = |name: &str| meta.and_then(|m| m.get(name)).and_then(Value::as_object);
    let text = |s: &str| Some(s.to_string());
    if section("automation").is_some() {
        return Attribution {
            automation_id: Some(run.run_id.clone()),
            role: text("controller"),
            session_kind: text("automation"),
            ..Attribution::default()
        };
    }
    if let Some(o) = section("occurrence") {
        return Attribution {
            automation_id: id_text(o.get("automation_id")),
            role: one_of(o.get("role"), &["occurrence", "descendant"], "occurrence"),
            occurrence_index: o.get("occurrence_index").and_then(Value::as_i64),
            session_kind: one_of(
                o.get("session_kind"),
                &["automation", "occurrence", "chat"],
                "occurrence",
            ),
            ..Attribution::default()
        };
    }
    if let Some(d) = section("discussion") {
        return Attribution {
            automation_id: id_text(d.get("automation_id")),
            role: text("discussion"),
            occurrence_index: d.get("occurrence_index").and_then(Value::as_i64),
            session_kind: text("discussion"),
            ..Attribution::default()
        };
    }
    let schedule = section("schedule").and_then(|s| s.get("kind"));
    if schedule.and_then(Value::as_str) == Some("scheduled_run") {
        return Attribution {
            role: text("legacy_schedule"),
            session_kind: text("automation"),
            ..Attribution::default()
        };
    }
    Attribution {
        session_kind: text("chat"),
        ..Attribution::default()
    }
}

/// The trigger connection whose events would wake `run` now: set for an
/// automation controller bound to a connection (an event source) that
/// waits idle at its wake wait, neither paused nor archived
/// ([`Store::list_consumers`](crate::Store::list_consumers)). A busy,
/// paused or archived controller is not woken by an event, so a store
/// need not list it.
pub fn wakes_on(run: &RunState) -> Option<String> {
    let waiting = run
        .waiting
        .as_ref()
        .filter(|_| run.status == RunStatus::Waiting)?;
    if waiting.wait_key != stepwell_automation_core::ids::wake_wait_key(&run.run_id) {
        return None;
    }
    let definition = run.vars.get("_meta")?.get("automation")?;
    let state = run.vars.get("_runtime").and_then(|r| r.get("automation"));
    let paused = state.and_then(|s| s.get("paused")) == Some(&Value::Bool(true));
    let archived = definition.get("archived_at").is_some_and(|a| !a.is_null());
    if paused || archived {
        return None;
    }
    let id = definition
        .get("trigger")?
        .get("config")?
        .get("connection_id")?;
    Some(id.as_str()?.trim().to_string()).filter(|s| !s.is_empty())
}

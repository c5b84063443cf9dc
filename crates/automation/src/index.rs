//! The run index's attribution columns as the automations define them
//! (seed 003 "Run attribution"), and which controllers an event wakes.

use serde_json::Value;

use stepwell_runtime::core::model::{RunState, RunStatus};
use stepwell_runtime::store::{index::workspace_root, Attribution, RunIndexer, TurnRoots};

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
/// idle at its wake wait, neither paused nor archived. Its turn roots
/// ([`RunIndexer::turn_roots`]): an occurrence always is one, a controller
/// never, other runs when they have no parent.
///
/// ```
/// use stepwell_automation::AutomationIndex;
/// use stepwell_runtime::store::RunIndexer;
/// # use stepwell_runtime::{RunState, RunStatus};
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

    fn turn_roots(&self) -> TurnRoots {
        TurnRoots {
            roots: vec!["occurrence".into()],
            not_roots: vec!["controller".into()],
        }
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
/// ([`Store::list_consumers`](stepwell_runtime::Store::list_consumers)). A busy,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(id: &str, vars: Value) -> RunState {
        serde_json::from_value(
            json!({"run_id": id, "workflow_id": "wf", "status": "running",
            "vars": vars, "created_at": "2026-01-01T00:00:00Z",
            "updated_at": "2026-01-01T00:00:00Z"}),
        )
        .unwrap()
    }

    fn columns(vars: Value) -> (Option<String>, Option<String>, Option<i64>, Option<String>) {
        let a = AutomationIndex.index(&run("r1", vars));
        (a.automation_id, a.role, a.occurrence_index, a.session_kind)
    }

    #[test]
    fn the_first_matching_row_of_the_rule_wins() {
        let s = |v: &str| Some(v.to_string());
        let occurrence = json!({"automation_id": "ctl", "occurrence_index": 2,
            "role": "descendant", "session_kind": "automation"});
        let cases = [
            (json!({}), (None, None, None, s("chat"))),
            (
                json!({"_meta": {"automation": {}, "occurrence": occurrence}}),
                (s("r1"), s("controller"), None, s("automation")),
            ),
            (
                json!({"_meta": {"occurrence": occurrence}}),
                (s("ctl"), s("descendant"), Some(2), s("automation")),
            ),
            (
                json!({"_meta": {"occurrence": {"automation_id": 7, "occurrence_index": true,
                    "role": "boss", "session_kind": "weird"}}}),
                (s("7"), s("occurrence"), None, s("occurrence")),
            ),
            (
                json!({"_meta": {"discussion": {"automation_id": " a2 ", "occurrence_index": 4}}}),
                (s("a2"), s("discussion"), Some(4), s("discussion")),
            ),
            (
                json!({"_meta": {"schedule": {"kind": "scheduled_run"}}}),
                (None, s("legacy_schedule"), None, s("automation")),
            ),
            (
                json!({"_meta": {"occurrence": "not an object"}}),
                (None, None, None, s("chat")),
            ),
        ];
        for (vars, want) in cases {
            assert_eq!(columns(vars.clone()), want, "{vars}");
        }
        let root = AutomationIndex.index(&run("r1", json!({"workspace_root": "  /w  "})));
        assert_eq!(root.workspace_root.as_deref(), Some("/w"));
    }

    #[test]
    fn a_controller_wakes_on_its_connection_only_idle_at_its_wake_wait() {
        let controller = |paused: bool, archived: Value| {
            let mut r = run(
                "c1",
                json!({"_meta": {"automation": {"archived_at": archived,
                    "trigger": {"config": {"connection_id": " conn "}}}},
                    "_runtime": {"automation": {"paused": paused}}}),
            );
            r.status = RunStatus::Waiting;
            r.waiting = Some(
                serde_json::from_value(json!({"reason": "event",
                "wait_key": stepwell_automation_core::ids::wake_wait_key("c1")}))
                .unwrap(),
            );
            r
        };
        assert_eq!(
            wakes_on(&controller(false, Value::Null)).as_deref(),
            Some("conn")
        );
        assert_eq!(wakes_on(&controller(true, Value::Null)), None, "paused");
        assert_eq!(
            wakes_on(&controller(false, json!("2026-01-01"))),
            None,
            "archived"
        );
        let mut busy = controller(false, Value::Null);
        busy.status = RunStatus::Running;
        assert_eq!(wakes_on(&busy), None, "not waiting");
        let mut elsewhere = controller(false, Value::Null);
        elsewhere.waiting.as_mut().unwrap().wait_key = "ask".into();
        assert_eq!(wakes_on(&elsewhere), None, "another wait");
    }
}

//! What the automations keep across a run's lineage: the attribution a
//! child inherits of its parent, the sessions a flow or a caller may not
//! join, and the `_meta` sections that are part of a run's identity.

use serde_json::{json, Map, Value};

use stepwell_runtime::core::model::RunState;
use stepwell_runtime::core::plugin::ChildStart;

/// The `_meta` a child of `parent` is born with: automation attribution
/// crosses every hop, set by the host (a flow cannot set or clear it). A
/// child of an occurrence, or of any descendant of one, is a descendant of
/// that occurrence (`_meta.occurrence` with `role: "descendant"`, so it is
/// never a turn of the session itself); a child of a discussion carries the
/// discussion's provenance without its (large) `seed_messages`. `None` when
/// the parent carries neither.
pub fn descendant_meta(parent: &RunState) -> Option<Value> {
    let meta = parent.vars.get("_meta").and_then(Value::as_object)?;
    let occurrence = meta.get("occurrence").and_then(Value::as_object);
    let discussion = meta.get("discussion").and_then(Value::as_object);
    if occurrence.is_none() && discussion.is_none() {
        return None;
    }
    let mut child = Map::new();
    if let Some(o) = occurrence {
        let mut o = o.clone();
        o.insert("role".into(), json!("descendant"));
        child.insert("occurrence".into(), Value::Object(o));
    }
    if let Some(d) = discussion {
        let mut d = d.clone();
        d.remove("seed_messages");
        child.insert("discussion".into(), Value::Object(d));
    }
    Some(Value::Object(child))
}

/// Checks what a caller (the CLI's `run`, the HTTP API's `POST /v1/runs`)
/// asks of a new run: its vars may not say the run is an automation's
/// controller, occurrence or discussion (`_meta.automation`,
/// `_meta.occurrence`, `_meta.discussion`: the host's attribution), and its
/// session may not be an automation's own (`automation:<id>`: only its
/// occurrences are its turns). `vars_field` and `session_field` name the
/// inputs in the error.
pub fn check_caller_run(
    vars: &Map<String, Value>,
    session: Option<&str>,
    vars_field: &str,
    session_field: &str,
) -> stepwell_runtime::Result<()> {
    if let Some(meta) = vars.get("_meta").and_then(Value::as_object) {
        if let Some(key) = ["automation", "occurrence", "discussion"]
            .into_iter()
            .find(|k| meta.contains_key(*k))
        {
            return Err(stepwell_runtime::Error::invalid(
                format!("{vars_field}: _meta.{key}"),
                "is set by the host (automations and discussions), not by a caller",
            ));
        }
    }
    // A discussion's session a caller may name: that is how its later
    // turns join it.
    if let Some(s) = session.filter(|s| s.starts_with("automation:")) {
        return Err(stepwell_runtime::Error::invalid(
            session_field,
            format!("{s} is an automation's own session: only its occurrences are its turns"),
        ));
    }
    Ok(())
}

/// Whether `session` is one the host names and keeps: an automation's
/// (`automation:<id>`) or a discussion's (`discussion-session:<run id>`).
/// A guest naming one other than its own run's could plant a run in it
/// (its id can be computed) and block or steer its turns.
pub fn is_host_session(session: &str) -> bool {
    session.starts_with("automation:") || session.starts_with("discussion-session:")
}

/// The automations' part of [`stepwell_runtime::core::plugin::Plugin::prepare_child`]:
/// the child takes its parent's attribution ([`descendant_meta`]) and may
/// not name a session the host keeps other than its parent's.
pub(crate) fn prepare_child(child: &mut ChildStart<'_>) -> Result<(), (String, String)> {
    let parent_session = child.parent.session_id.as_deref();
    if let Some(s) = child
        .session_id
        .filter(|s| is_host_session(s) && Some(*s) != parent_session)
    {
        return Err((
            "session_id".into(),
            format!("{s} is a session the host keeps (an automation's or a discussion's): only its own runs join it"),
        ));
    }
    if let Some(meta) = descendant_meta(child.parent) {
        child.vars.insert("_meta".into(), meta);
    }
    Ok(())
}

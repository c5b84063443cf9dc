//! `emit_event`: durable events between runs. Touches other runs.

use serde_json::{json, Map, Value};

use super::waits::event_wait_key;
use super::{opt_str, Delivery, EffectClass, EffectCx, EffectHandler, Outcome};
use crate::core::clock::format_time;
use crate::core::Result;

/// `emit_event {name, scope?, session_id?, payload?, event_id?}`: resumes
/// every run waiting (reason `event`) on the event's key (or on the
/// wildcard `*` of its scope), each with the event envelope `{"event_id",
/// "name", "scope", "session_id", "payload", "emitted_at", "emitter":
/// {"run_id", "workflow_id", "node_id"}}`, and runs them on inside this step.
///
/// The key is built as [`event_wait_key`] says: `scope` `session` (the
/// default) reaches the waits of `session_id` (default: the emitter's
/// session, else its run id), `workflow` those of runs of the emitter's
/// workflow, `global` every run waiting on the name in scope `global`;
/// `run` reaches no other run (a record in the emitter's ledger only).
/// Listeners are matched by their wait key: a wait whose explicit
/// `wait_key` is not an `evt:` key is never reached by an event, only by an
/// explicit resume. A payload that is not an object is delivered as
/// `{"value": payload}`; no payload as `{}`.
///
/// The listeners are fixed, and recorded in the effect's `started` record,
/// before any is resumed; each is resumed at most once by this event, even
/// when the step is replayed after a crash and the listener waits on the
/// same key again. The result is `{"wait_key", "name", "scope",
/// "delivered", "delivered_to", "resumed": [{"run_id", "status",
/// "error"?}]}`: a listener that could not be resumed (its workflow cannot
/// be loaded, someone else resumed it first) is listed with status
/// `skipped` or `error` and left as it was.
pub struct EmitEvent;

struct Event {
    name: String,
    scope: String,
    session_id: Option<String>,
    wait_key: String,
}

impl Event {
    /// The key of the scope's wildcard listeners (`evt:<scope>:<id>:*`).
    fn wildcard(&self) -> String {
        // The name is the key's last part (encoded: it holds no ':').
        match self.wait_key.rsplit_once(':') {
            Some((scope, _)) => format!("{scope}:*"),
            None => format!("{}*", self.wait_key),
        }
    }
}

fn event(cx: &EffectCx<'_>, p: &Map<String, Value>) -> std::result::Result<Event, Outcome> {
    let k = "emit_event";
    let name = match (opt_str(k, p, "name")?, opt_str(k, p, "event_name")?) {
        (Some(n), _) | (None, Some(n)) if !n.trim().is_empty() => n.trim().to_string(),
        _ => return Err(Outcome::invalid(k, "name", "is required")),
    };
    let scope = opt_str(k, p, "scope")?
        .unwrap_or("session")
        .trim()
        .to_ascii_lowercase();
    if !cx.emit_scopes.contains(&scope) {
        return Err(Outcome::invalid(
            k,
            "scope",
            &format!(
                "{scope:?} is not allowed here (allowed: {})",
                cx.emit_scopes.join(", ")
            ),
        ));
    }
    let session_id = opt_str(k, p, "session_id")?.map(str::to_string);
    let wait_key = event_wait_key(&scope, &name, session_id.as_deref(), cx.run)
        .map_err(|e| Outcome::invalid(k, "scope", &e))?;
    let session_id = (scope == "session").then(|| {
        session_id
            .or_else(|| cx.run.session_id.clone())
            .unwrap_or_else(|| cx.run.run_id.clone())
    });
    Ok(Event {
        name,
        scope,
        session_id,
        wait_key,
    })
}

impl EffectHandler for EmitEvent {
    fn kind(&self) -> &str {
        "emit_event"
    }

    fn class(&self) -> EffectClass {
        EffectClass::TouchesRuns
    }

    fn prepare(&self, cx: &EffectCx<'_>, p: &Map<String, Value>) -> Result<Option<Value>> {
        let Ok(ev) = event(cx, p) else {
            // execute reports the invalid payload.
            return Ok(None);
        };
        let targets: Vec<String> = if ev.scope == "run" {
            Vec::new()
        } else {
            cx.runs
                .event_listeners(&[ev.wait_key.clone(), ev.wildcard()])?
                .into_iter()
                .map(|r| r.run_id)
                .filter(|id| *id != cx.run.run_id)
                .collect()
        };
        Ok(Some(json!({
            "wait_key": ev.wait_key,
            "targets": targets,
            "emitted_at": format_time(cx.now),
        })))
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        prepared: Option<&Value>,
    ) -> Result<Outcome> {
        let ev = match event(cx, p) {
            Ok(ev) => ev,
            Err(o) => return Ok(o),
        };
        let targets: Vec<String> = prepared
            .and_then(|v| v.get("targets"))
            .and_then(|t| serde_json::from_value(t.clone()).ok())
            .unwrap_or_default();
        if !targets.is_empty() {
            if let Some(limit) = cx.check_depth("emit_event") {
                return Ok(limit);
            }
        }
        let payload = match p.get("payload") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(Value::Object(m)) => Value::Object(m.clone()),
            Some(other) => json!({ "value": other }),
        };
        let envelope = json!({
            "event_id": p.get("event_id").cloned().unwrap_or(Value::Null),
            "name": ev.name,
            "scope": ev.scope,
            "session_id": ev.session_id,
            "payload": payload,
            // The time recorded when the listeners were fixed: a replay
            // delivers the very same envelope.
            "emitted_at": prepared
                .and_then(|v| v.get("emitted_at"))
                .cloned()
                .unwrap_or_else(|| json!(format_time(cx.now))),
            "emitter": {
                "run_id": cx.run.run_id,
                "workflow_id": cx.run.workflow_id,
                "node_id": cx.run.current_node,
            },
        });
        let wildcard = ev.wildcard();
        let mut delivered_to = Vec::new();
        let mut resumed = Vec::new();
        for target in targets {
            // A wildcard listener is resumed with its own key; one that
            // waits on neither key any more is met by the delivery check.
            let waits_on_wildcard = cx
                .runs
                .get_run(&target)
                .ok()
                .and_then(|r| r.waiting)
                .is_some_and(|w| w.wait_key == wildcard);
            let key = if waits_on_wildcard {
                wildcard.clone()
            } else {
                ev.wait_key.clone()
            };
            match cx.runs.deliver(
                &target,
                &key,
                envelope.clone(),
                cx.key,
                cx.depth + 1,
                cx.take_inline(),
            )? {
                Delivery::Resumed(status) => {
                    resumed.push(json!({ "run_id": target, "status": status.as_str() }));
                    delivered_to.push(target);
                }
                Delivery::AlreadyDelivered(status) => {
                    resumed.push(json!({ "run_id": target, "status": status.as_str() }));
                    delivered_to.push(target);
                }
                Delivery::NotWaiting => resumed
                    .push(json!({ "run_id": target, "status": "skipped", "error": "not waiting" })),
                Delivery::Refused(e) => {
                    resumed.push(json!({ "run_id": target, "status": "error", "error": e }))
                }
            }
        }
        Ok(Outcome::Completed(json!({
            "wait_key": ev.wait_key,
            "name": ev.name,
            "scope": ev.scope,
            "delivered": delivered_to.len(),
            "delivered_to": delivered_to,
            "resumed": resumed,
        })))
    }
}

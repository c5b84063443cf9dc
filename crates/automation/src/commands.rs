//! The seven automation commands, decided from the persisted state: pause,
//! resume, run now, revise, stop current, archive, unarchive. A command is
//! applied (with the delta it makes) or rejected (with a reason); either
//! way its result is the `automation.command_result` decision, written with
//! [`super::decide`], and an applied command adds its observation.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::definition::{
    revise_definition, trigger_changed, trigger_failure as trigger_error, trigger_state_of,
};
use super::ids::canonical_json;
use super::time::format_timestamp;
use super::AutomationError;
use crate::triggers::{Binding, TriggerRegistry, Wait};
use stepwell_runtime::core::model::{RunState, RunStatus};

/// The command types, by their full names.
pub const COMMAND_TYPES: [&str; 7] = [
    "automation.revise",
    "automation.pause",
    "automation.resume",
    "automation.run_now",
    "automation.stop_current",
    "automation.archive",
    "automation.unarchive",
];

/// The full name of a command type given as `automation.pause` or `pause`
/// (`None` if it is neither).
pub fn command_type(name: &str) -> Option<&'static str> {
    COMMAND_TYPES
        .iter()
        .copied()
        .find(|t| *t == name || t.strip_prefix("automation.") == Some(name))
}

/// `sha256:` of the canonical `{type, payload, expected_revision}` (a null
/// payload is `{}`): a reused command id is a duplicate only for the same
/// command.
pub fn command_digest(
    command_type: &str,
    payload: Option<&Value>,
    expected_revision: Option<i64>,
) -> String {
    let payload = match payload {
        None | Some(Value::Null) => json!({}),
        Some(p) => p.clone(),
    };
    let body =
        json!({"type": command_type, "payload": payload, "expected_revision": expected_revision});
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(canonical_json(&body).as_bytes()))
    )
}

/// What a command decides.
#[derive(Debug, Clone, PartialEq)]
pub enum CommandDecision {
    /// Applied; the delta to apply (`{}` for an applied no-op).
    Applied(Value),
    /// Rejected: `{reason_code, message, field?}`.
    Rejected(Value),
}

fn reject(reason_code: &str, message: impl Into<String>, field: Option<&str>) -> CommandDecision {
    let mut e = json!({"reason_code": reason_code, "message": message.into()});
    if let Some(f) = field {
        e["field"] = json!(f);
    }
    CommandDecision::Rejected(e)
}

/// The trigger binding of a stored definition (a version that is not a
/// `u32` reads as 0, which no source has).
pub(crate) fn binding_of(definition: &Value) -> Binding {
    let t = &definition["trigger"];
    Binding {
        binding_id: t["binding_id"].as_str().unwrap_or_default().to_string(),
        source_id: t["source_id"].as_str().unwrap_or_default().to_string(),
        source_version: t["source_version"]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(0),
        config: t["config"].clone(),
    }
}

/// What a stored state or a source's answer must be to be changed here.
fn stored_object(what: &str, v: Value) -> Result<Value, AutomationError> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(AutomationError::new(
            "invalid_state",
            None,
            format!("{what} is not a JSON object: {v}"),
        ))
    }
}

/// `rearm` of the definition's trigger on `slice` at `now`.
fn rearm(
    definition: &Value,
    slice: &Value,
    now: &str,
    triggers: &TriggerRegistry,
) -> Result<Value, AutomationError> {
    let b = binding_of(definition);
    let source = triggers
        .get(&format!("{}@{}", b.source_id, b.source_version))
        .map_err(trigger_error)?;
    source.rearm(&b, slice, now).map_err(trigger_error)
}

fn definition_and_state(run: &RunState) -> Result<(&Value, &Value), AutomationError> {
    let missing = || {
        AutomationError::new(
            "automation_not_found",
            None,
            format!("Automation {} does not exist.", run.run_id),
        )
    };
    let definition = run
        .vars
        .get("_meta")
        .and_then(|m| m.get("automation"))
        .filter(|d| d.is_object())
        .ok_or_else(missing)?;
    let state = run
        .vars
        .get("_runtime")
        .and_then(|r| r.get("automation"))
        .filter(|s| s.is_object())
        .ok_or_else(missing)?;
    Ok((definition, state))
}

fn truthy(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
        && v != Some(&json!(""))
        && v != Some(&json!(0))
}

/// Decides command `command_type` (a full name) with `payload` and id
/// `command_id` on the controller run `run` at `now`, from its persisted
/// state (`expected_revision` checked first). `Err` only for what is not a
/// decision: a run that is not an automation, or a trigger source that
/// cannot be called.
pub fn decide_command(
    run: &RunState,
    command_type: &str,
    payload: &Value,
    command_id: &str,
    now: DateTime<Utc>,
    expected_revision: Option<i64>,
    triggers: &TriggerRegistry,
) -> Result<CommandDecision, AutomationError> {
    let (definition, state) = definition_and_state(run)?;
    let revision = definition["revision"].as_i64().unwrap_or(0);
    if let Some(expected) = expected_revision.filter(|e| *e != revision) {
        return Ok(reject(
            "revision_conflict",
            format!("Automation is at revision {revision}, not {expected}."),
            Some("expected_revision"),
        ));
    }
    let c = Deciding {
        run,
        definition,
        state,
        payload,
        now,
        at: format_timestamp(now),
        triggers,
        archived: truthy(definition.get("archived_at")),
        terminal: matches!(
            run.status,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        ),
        pending: state.get("pending_occurrence").filter(|p| !p.is_null()),
        paused: truthy(state.get("paused")),
    };
    match command_type {
        "automation.pause" => Ok(c.pause()),
        "automation.resume" => c.resume(),
        "automation.run_now" => Ok(c.run_now(command_id)),
        "automation.stop_current" => c.stop_current(),
        "automation.archive" => Ok(c.archive()),
        "automation.unarchive" => Ok(c.unarchive()),
        "automation.revise" => c.revise(),
        other => Ok(reject(
            "invalid_request",
            format!("unknown automation command type {other:?}"),
            Some("type"),
        )),
    }
}

/// A command being decided: the controller run and what its persisted
/// state says.
struct Deciding<'a> {
    run: &'a RunState,
    definition: &'a Value,
    state: &'a Value,
    payload: &'a Value,
    now: DateTime<Utc>,
    /// `now` in the reference's spelling.
    at: String,
    triggers: &'a TriggerRegistry,
    archived: bool,
    /// The controller run has ended.
    terminal: bool,
    /// The occurrence running or waiting to retry, if any.
    pending: Option<&'a Value>,
    paused: bool,
}

impl Deciding<'_> {
    /// `automation.pause`: a stop is asked of an occurrence in back-off.
    fn pause(&self) -> CommandDecision {
        if self.archived || self.terminal {
            return reject(
                "invalid_state",
                "An archived or finished automation cannot be paused.",
                None,
            );
        }
        let mut change = json!({"paused": true});
        if let Some(p) = self
            .pending
            .filter(|p| !self.paused && p["phase"] == "backoff")
        {
            let mut p = p.clone();
            p["stop_requested"] = json!(true);
            change["pending_occurrence"] = p;
        }
        CommandDecision::Applied(json!({"state": change}))
    }

    /// `automation.resume`: the trigger rearmed from now.
    fn resume(&self) -> Result<CommandDecision, AutomationError> {
        if self.archived || self.terminal {
            return Ok(reject(
                "invalid_state",
                "An archived or finished automation cannot be resumed.",
                None,
            ));
        }
        if !self.paused {
            return Ok(CommandDecision::Applied(json!({})));
        }
        let rearmed = stored_object(
            "the trigger's rearmed state",
            rearm(
                self.definition,
                &trigger_state_of(self.state),
                &self.at,
                self.triggers,
            )?,
        )?;
        let mut rearmed = Value::Object(super::definition::stored_trigger_state(&rearmed));
        rearmed["paused"] = json!(false);
        Ok(CommandDecision::Applied(json!({"state": rearmed})))
    }

    /// `automation.run_now`: a manual occurrence is pending.
    fn run_now(&self, command_id: &str) -> CommandDecision {
        if self.archived || self.terminal || truthy(self.state.get("exhausted")) {
            return reject(
                "invalid_state",
                "An archived, finished or exhausted automation cannot run.",
                None,
            );
        }
        if self.pending.is_some()
            || self
                .state
                .get("manual_pending")
                .is_some_and(|m| !m.is_null())
        {
            return reject(
                "automation_busy",
                "An occurrence is already running or waiting to run.",
                None,
            );
        }
        CommandDecision::Applied(json!({"state": {"manual_pending": {"command_id": command_id}}}))
    }

    /// `automation.stop_current`: the running occurrence (the one named, a
    /// stepwell extension) is asked to stop.
    fn stop_current(&self) -> Result<CommandDecision, AutomationError> {
        let payload = self.payload;
        Ok(match self.pending {
            _ if payload
                .get("occurrence_index")
                .is_some_and(|i| i.as_i64().is_none()) =>
            {
                reject(
                    "invalid_request",
                    "payload.occurrence_index must be an integer.",
                    Some("payload.occurrence_index"),
                )
            }
            None => reject("invalid_state", "No occurrence is running.", None),
            // A stop aimed at one occurrence (`payload.occurrence_index`, a
            // stepwell extension) does not stop the next one.
            Some(p)
                if payload
                    .get("occurrence_index")
                    .is_some_and(|want| *want != p["index"]) =>
            {
                reject(
                    "invalid_state",
                    format!(
                        "Occurrence {} is not the one running (occurrence {} is).",
                        payload["occurrence_index"], p["index"]
                    ),
                    Some("payload.occurrence_index"),
                )
            }
            Some(p) => {
                let mut p = stored_object("the pending occurrence", p.clone())?;
                p["stop_requested"] = json!(true);
                CommandDecision::Applied(json!({"state": {"pending_occurrence": p}}))
            }
        })
    }

    /// `automation.archive`.
    fn archive(&self) -> CommandDecision {
        if self.archived {
            return CommandDecision::Applied(json!({}));
        }
        let mut d = self.definition.clone();
        d["archived_at"] = json!(self.at);
        CommandDecision::Applied(json!({"definition": d}))
    }

    /// `automation.unarchive`: paused again unless it cannot run anyway.
    fn unarchive(&self) -> CommandDecision {
        if !self.archived {
            return CommandDecision::Applied(json!({}));
        }
        let mut d = self.definition.clone();
        d["archived_at"] = Value::Null;
        let mut delta = json!({"definition": d});
        if !truthy(self.state.get("exhausted"))
            && !matches!(self.run.status, RunStatus::Failed | RunStatus::Cancelled)
        {
            delta["state"] = json!({"paused": true});
        }
        CommandDecision::Applied(delta)
    }

    /// `automation.revise`: the next revision of the definition, and a fresh
    /// trigger state when the trigger changed.
    fn revise(&self) -> Result<CommandDecision, AutomationError> {
        if self.archived || self.terminal {
            return Ok(reject(
                "invalid_state",
                "An archived or finished automation cannot be revised.",
                None,
            ));
        }
        let changes = self.payload.get("changes").unwrap_or(&Value::Null);
        let new = match revise_definition(
            self.definition,
            changes,
            &self.run.run_id,
            self.now,
            self.triggers,
        ) {
            Ok(new) => new,
            Err(e) => return Ok(reject(&e.reason_code, e.message, e.field.as_deref())),
        };
        let mut delta = json!({"definition": new});
        if trigger_changed(self.definition, &delta["definition"]) {
            delta["state"] = Value::Object(self.fresh_trigger_state(&delta["definition"])?);
        }
        Ok(CommandDecision::Applied(delta))
    }

    /// The trigger state of a revised definition whose trigger changed.
    fn fresh_trigger_state(&self, revised: &Value) -> Result<Map<String, Value>, AutomationError> {
        let b = binding_of(revised);
        let source = self
            .triggers
            .get(&format!("{}@{}", b.source_id, b.source_version))
            .map_err(trigger_error)?;
        let fresh = source.initial_state(&b, &self.at).map_err(trigger_error)?;
        let rearmed = stored_object(
            "the trigger's rearmed state",
            source.rearm(&b, &fresh, &self.at).map_err(trigger_error)?,
        )?;
        let mut stored = super::definition::stored_trigger_state(&rearmed);
        // A fresh trigger state: every shared key, from the new source or
        // its initial value (a source that keeps none of them, a plugin,
        // starts from zero too).
        for (k, default) in [
            ("anchor", Value::Null),
            ("tick", json!(0)),
            ("scheduled_count", json!(0)),
            ("exhausted", json!(false)),
        ] {
            stored.entry(k).or_insert(default);
        }
        // The old source's own state does not carry over.
        if self.state.get("source_state").is_some_and(|s| !s.is_null())
            && !stored.contains_key("source_state")
        {
            stored.insert("source_state".into(), Value::Null);
        }
        Ok(stored)
    }
}

/// An observation to write: `(name, discriminator, fields)`.
pub type Observation = (&'static str, String, Map<String, Value>);

/// The observation an applied command adds, rebuilt from the run after its
/// decision: `(name, discriminator, fields)`. Pause: `automation.paused`;
/// resume (unless still paused): `automation.resumed {next_fire_at}`;
/// archive: `automation.archived {active_occurrence_run_id?}`; unarchive:
/// `automation.unarchived {status}`; revise: `automation.revised
/// {previous_revision, definition}` keyed by the new revision; run now and
/// stop current: none.
pub fn command_observation(
    run: &RunState,
    command_type: &str,
    command_id: &str,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
) -> Result<Option<Observation>, AutomationError> {
    let (definition, state) = definition_and_state(run)?;
    let fields = |v: Value| match v {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    Ok(match command_type {
        "automation.pause" => Some(("automation.paused", command_id.to_string(), Map::new())),
        "automation.resume" => {
            if truthy(state.get("paused")) {
                return Ok(None);
            }
            let b = binding_of(definition);
            let source = triggers
                .get(&format!("{}@{}", b.source_id, b.source_version))
                .map_err(trigger_error)?;
            let wait = source
                .prepare(&b, &trigger_state_of(state), &format_timestamp(now), &[])
                .map_err(trigger_error)?;
            let next = match wait {
                Wait::Until { until } => json!(until),
                _ => Value::Null,
            };
            Some((
                "automation.resumed",
                command_id.to_string(),
                fields(json!({"next_fire_at": next})),
            ))
        }
        "automation.archive" => {
            let pending = state.get("pending_occurrence").filter(|p| !p.is_null());
            let f = match pending {
                Some(p) => json!({"active_occurrence_run_id": p["run_id"]}),
                None => json!({}),
            };
            Some(("automation.archived", command_id.to_string(), fields(f)))
        }
        "automation.unarchive" => {
            let status = if truthy(state.get("paused")) {
                json!("paused")
            } else {
                Value::Null
            };
            Some((
                "automation.unarchived",
                command_id.to_string(),
                fields(json!({"status": status})),
            ))
        }
        "automation.revise" => {
            let revision = definition["revision"].as_i64().unwrap_or(0);
            Some((
                "automation.revised",
                revision.to_string(),
                fields(json!({"previous_revision": revision - 1, "definition": definition})),
            ))
        }
        _ => None,
    })
}

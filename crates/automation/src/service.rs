//! The automation service over a [`Runtime`]: create an automation, apply
//! commands, read it back. Every write goes through the controller run's
//! transaction (the same claim and version-checked commit as a step), so
//! commands, controller ticks and other processes on the same store never
//! clobber one another.

use crate::triggers::{TriggerRegistry, TriggersExt};
use std::path::Path;

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::commands::{command_digest, command_observation, command_type, decide_command};
use super::decision::{decide, observe, Transition};
use super::definition::{automation_status, build_definition, initial_state, trigger_failure};
use super::ids::{
    automation_id, automation_session_id, record_key, request_digest, wake_wait_key,
    CONTROLLER_WORKFLOW_ID,
};
use super::outcome::taken_occurrence_id;
use super::queries::{
    attention_page, automations_cursor, find_record, occurrence_page, parse_automations_cursor,
};
use super::time::format_timestamp;
use super::view::{automation_summary, get_automation};
use super::{AutomationError, CommandDecision};
use stepwell_runtime::core::config::StartOptions;
use stepwell_runtime::core::model::{RunState, RunStatus};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::store::RunIndexQuery;
use stepwell_runtime::Runtime;

/// What [`create_automation`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// The automation's id (= its controller run's id).
    pub automation_id: String,
    /// Its current revision (a replayed creation after revisions returns
    /// the current one).
    pub revision: u64,
    /// Whether this call created it (false: it existed with the same
    /// request).
    pub created: bool,
}

fn automation_error(reason_code: &str, field: Option<&str>, message: impl Into<String>) -> Error {
    Error::from(AutomationError::new(reason_code, field, message))
}

fn owner_of(request: &Value, principal: Option<&str>) -> String {
    if let Some(p) = principal.map(str::trim).filter(|p| !p.is_empty()) {
        return p.to_string();
    }
    let part = |k: &str| match request.get(k) {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        _ => "local".to_string(),
    };
    format!("{}:{}", part("tenant"), part("user"))
}

/// The reference's `str(request.get(key) or "local")`: a falsy value
/// (absent, null, false, 0, "", [], {}) is `local`, anything else Python's
/// `str()` of it.
fn id_part(request: &Value, key: &str) -> String {
    let falsy = match request.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => true,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(Value::Bool(true)) => false,
    };
    if falsy {
        return "local".into();
    }
    super::outcome::py_str(&request[key])
}

/// The most bytes (as JSON) an automation's `target.input_data` may take:
/// an occurrence's inputs are frozen into the controller's state, which
/// every controller step carries.
pub const MAX_INPUT_DATA_BYTES: usize = 1 << 20;

/// The `(workflow id, version)` every automation's target is pinned to
/// (archived ones too: they may be unarchived).
pub(crate) fn pinned_targets(rt: &Runtime) -> Result<Vec<(String, u32)>> {
    let rows = rt.store().list_run_index(&RunIndexQuery {
        role: Some(vec!["controller".into()]),
        ..Default::default()
    })?;
    let mut out = Vec::new();
    for row in rows {
        let Some(run) = rt.store().load_run(&row.run_id)? else {
            continue;
        };
        let target = &run.vars["_meta"]["automation"]["target"];
        if let (Some(id), Some(v)) = (target["workflow_id"].as_str(), target["version"].as_u64()) {
            if let Ok(v) = u32::try_from(v) {
                out.push((id.to_string(), v));
            }
        }
    }
    Ok(out)
}

/// Refuses a target pinned to a version of `workflow_id` the store does
/// not keep.
fn check_version(rt: &Runtime, workflow_id: &str, version: &Value) -> Result<()> {
    let Some(v) = version.as_u64().and_then(|v| u32::try_from(v).ok()) else {
        return Ok(());
    };
    if rt.store().workflow_version(workflow_id, Some(v))?.is_none() {
        return Err(automation_error(
            "invalid_definition",
            Some("target.version"),
            format!("workflow {workflow_id:?} has no deployed version {v} (stepwell workflows versions {workflow_id})"),
        ));
    }
    Ok(())
}

/// Refuses the bundle at `dir` if it defines a workflow id whose latest
/// version was deployed from another directory that still defines it: an
/// automation's `bundle_ref` deploys its bundle, and must not change the
/// code other automations' occurrences of that id run. (`stepwell deploy`
/// is how an operator changes a workflow's code on purpose.)
fn refuse_takeover(rt: &Runtime, dir: &Path) -> Result<()> {
    let kinds = rt.effects().kinds();
    let bundle = stepwell_runtime::flow::load_bundle(dir, rt.engine(), &kinds)?;
    for wf in &bundle.workflows {
        let Some(latest) = rt.store().workflow_version(&wf.workflow_id, None)? else {
            continue;
        };
        let Some(source) = latest.source.as_deref().map(Path::new) else {
            continue;
        };
        if source != bundle.dir && defines(source, &wf.workflow_id) {
            return Err(Error::Flow(stepwell_runtime::flow::FlowError {
                path: wf.source.clone(),
                field: "workflow_id".into(),
                message: format!(
                    "workflow {:?} is already defined by the bundle {} in this store (an automation's bundle cannot take it over; deploy it on purpose with `stepwell deploy`)",
                    wf.workflow_id,
                    source.display()
                ),
            }));
        }
    }
    Ok(())
}

/// Whether the bundle at `dir` still defines `workflow_id` (its flow files
/// are read, not loaded).
fn defines(dir: &Path, workflow_id: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(|e| e.ok()).any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        (name == stepwell_runtime::flow::MAIN_FLOW_FILE || name.ends_with(".flow.json"))
            && std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                .is_some_and(|d| d["workflow_id"] == workflow_id)
    })
}

/// Makes the target's workflow known to the runtime: `target.bundle_ref`
/// naming a bundle directory is loaded (and recorded in the store, so
/// every process finds it) and stored as an absolute path; any other
/// `bundle_ref` needs `target.workflow_id` known to the store already. The
/// inputs are bounded ([`MAX_INPUT_DATA_BYTES`]) and the controller itself
/// is no target.
fn resolve_target(rt: &Runtime, definition: &mut Value) -> Result<()> {
    resolve_workflow(rt, definition)?;
    let target = &definition["target"];
    check_version(
        rt,
        target["workflow_id"].as_str().unwrap_or_default(),
        &target["version"],
    )
}

/// [`resolve_target`]'s workflow: the bundle loaded or the id known.
fn resolve_workflow(rt: &Runtime, definition: &mut Value) -> Result<()> {
    let target = &mut definition["target"];
    let size = serde_json::to_vec(&target["input_data"]).map_or(0, |b| b.len());
    if size > MAX_INPUT_DATA_BYTES {
        return Err(automation_error(
            "invalid_definition",
            Some("target.input_data"),
            format!(
                "target.input_data takes {size} bytes of JSON, over the limit of {MAX_INPUT_DATA_BYTES} (every occurrence's inputs are frozen into the controller's state)"
            ),
        ));
    }
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let workflow_id = text(&target["workflow_id"]);
    let bundle_ref = text(&target["bundle_ref"]);
    if workflow_id == CONTROLLER_WORKFLOW_ID {
        return Err(automation_error(
            "invalid_definition",
            Some("target.workflow_id"),
            "an automation cannot target the automation controller itself",
        ));
    }
    let dir = Path::new(&bundle_ref);
    if dir.is_dir() {
        let flow_error = |e| match e {
            Error::Flow(f) => {
                let text = f.to_string();
                let text = text.strip_prefix("invalid_definition: ").unwrap_or(&text);
                automation_error("invalid_definition", Some("target.bundle_ref"), text)
            }
            other => other,
        };
        refuse_takeover(rt, dir).map_err(flow_error)?;
        let bundle = rt.load_bundle(dir).map_err(flow_error)?;
        if !bundle
            .workflows
            .iter()
            .any(|w| w.workflow_id == workflow_id)
        {
            let defined: Vec<&str> = bundle
                .workflows
                .iter()
                .map(|w| w.workflow_id.as_str())
                .collect();
            return Err(automation_error(
                "invalid_definition",
                Some("target.workflow_id"),
                format!(
                    "the bundle {} defines no workflow {workflow_id:?} (it defines {})",
                    bundle.dir.display(),
                    defined.join(", ")
                ),
            ));
        }
        target["bundle_ref"] = json!(bundle.dir.display().to_string());
        return Ok(());
    }
    match rt.workflow(&workflow_id) {
        Ok(_) => Ok(()),
        Err(Error::UnknownWorkflow { .. }) => Err(automation_error(
            "invalid_definition",
            Some("target.bundle_ref"),
            format!(
                "{bundle_ref:?} is not a bundle directory, and no loaded bundle defines workflow {workflow_id:?}"
            ),
        )),
        Err(Error::Flow(f)) => Err(automation_error(
            "invalid_definition",
            Some("target.bundle_ref"),
            format!("the bundle recorded for workflow {workflow_id:?} cannot be loaded: {f}"),
        )),
        Err(e) => Err(e),
    }
}

/// Creates the automation `request` asks for at `now`, or finds it: its id
/// is `uuid5(namespace, "<tenant>:<user>:<request_id>")`, and the same
/// request again returns the existing automation untouched (whatever
/// `now`); a different request under the same id is `identity_conflict`
/// (field `request_id`). The controller is created at its first node; the
/// driver (or [`drive_until_idle`]) runs it. `principal` (default
/// `"<tenant>:<user>"`) is the automation's owner.
pub fn create_automation(
    rt: &Runtime,
    request: &Value,
    now: DateTime<Utc>,
    principal: Option<&str>,
) -> Result<Created> {
    if !request.is_object() {
        return Err(automation_error(
            "invalid_definition",
            None,
            "the creation request must be a JSON object",
        ));
    }
    let id = automation_id(
        &id_part(request, "tenant"),
        &id_part(request, "user"),
        request
            .get("request_id")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    let triggers = rt.triggers()?;
    let mut definition = build_definition(request, &id, now, &triggers)?;
    let conflict = || {
        let mut shown = String::new();
        match request.get("request_id") {
            Some(Value::String(r)) => super::outcome::py_repr_str(r, &mut shown),
            other => shown = other.map(Value::to_string).unwrap_or_else(|| "None".into()),
        }
        automation_error(
            "identity_conflict",
            Some("request_id"),
            format!("request_id {shown} was already used for a different automation request"),
        )
    };
    // A replayed creation finds its automation before anything else is
    // looked at (its bundle may have moved since).
    let digest = request_digest(request);
    if let Some(existing) = rt.store().load_run(&id)? {
        taken_automation_id(&existing)?;
        if existing.vars["_meta"]["creation_digest"] != json!(digest) {
            return Err(conflict());
        }
        return Ok(existing_created(&existing));
    }
    bound_connection(rt, &triggers, &definition["trigger"])?;
    resolve_target(rt, &mut definition)?;
    let b = super::commands::binding_of(&definition);
    let source = triggers
        .get(&format!("{}@{}", b.source_id, b.source_version))
        .map_err(trigger_failure)?;
    let trigger_state = source
        .initial_state(&b, &format_timestamp(now))
        .map_err(trigger_failure)?;
    let state = initial_state(&definition, &trigger_state);
    let mut meta = Map::new();
    meta.insert("automation".into(), definition.clone());
    meta.insert("creation_digest".into(), json!(digest));
    meta.insert(
        "automation_owner".into(),
        json!(owner_of(request, principal)),
    );
    let mut vars = Map::new();
    vars.insert("_meta".into(), Value::Object(meta));
    vars.insert(
        "workspace_root".into(),
        definition["workspace_root"].clone(),
    );
    let mut runtime = Map::new();
    runtime.insert("automation".into(), state);
    let options = StartOptions {
        vars,
        run_id: Some(id.clone()),
        actor_id: principal.map(str::to_string),
        session_id: Some(automation_session_id(&id)),
        parent_run_id: None,
        runtime,
        ..StartOptions::default()
    };
    // The controller and its `automation.created` record are one commit:
    // the commit that creates the run (it fails if the run exists).
    let mut run = rt.new_run(CONTROLLER_WORKFLOW_ID, options)?;
    let at = definition["created_at"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut fields = Map::new();
    fields.insert("definition".into(), definition.clone());
    let t = Transition {
        name: "automation.created",
        discriminator: "1",
        fields,
        node_id: "create",
        command_id: None,
        at: &at,
    };
    let record = observe(&run, &[], &t)?.record;
    let mut txn = match rt.hold_new(&id) {
        Ok(txn) => txn,
        // Another thread of this process is creating it right now.
        Err(Error::Conflict { .. }) => {
            std::thread::sleep(std::time::Duration::from_millis(20));
            return create_automation(rt, request, now, principal);
        }
        Err(e) => return Err(e),
    };
    match txn.commit(record.into_iter().collect(), &mut run) {
        Ok(()) => Ok(Created {
            automation_id: id,
            revision: definition["revision"].as_u64().unwrap_or(1),
            created: true,
        }),
        // Created by another process meanwhile: the same request, or not.
        Err(Error::Conflict { .. }) => {
            drop(txn);
            match rt.store().load_run(&id)? {
                Some(existing) => {
                    taken_automation_id(&existing)?;
                    if existing.vars["_meta"]["creation_digest"] == json!(digest) {
                        Ok(existing_created(&existing))
                    } else {
                        Err(conflict())
                    }
                }
                None => Err(conflict()),
            }
        }
        Err(e) => Err(e),
    }
}

/// Refuses run `existing`, found under an automation's id, when it is not
/// an automation's controller (no controller run is ever a child, and only
/// a creation makes one): its id was taken by another run, so the
/// automation cannot be created under it; `identity_conflict` on
/// `request_id`, saying so (another `request_id`, `tenant` or `user` gives
/// another id).
fn taken_automation_id(existing: &RunState) -> Result<()> {
    if existing.workflow_id == CONTROLLER_WORKFLOW_ID && existing.parent_run_id.is_none() {
        return Ok(());
    }
    let started_by = match existing.parent_run_id.as_deref() {
        Some(parent) => format!("a child of run {parent}"),
        None => "a root run".to_string(),
    };
    Err(automation_error(
        "identity_conflict",
        Some("request_id"),
        format!(
            "the automation id {} is taken by a run that is not an automation ({started_by}, workflow {}): choose another request_id",
            existing.run_id, existing.workflow_id
        ),
    ))
}

/// What a replayed creation answers: the automation as it is now.
fn existing_created(run: &RunState) -> Created {
    Created {
        automation_id: run.run_id.clone(),
        revision: run.vars["_meta"]["automation"]["revision"]
            .as_u64()
            .unwrap_or(1),
        created: false,
    }
}

fn rejected(reason_code: &str, field: Option<&str>, message: &str) -> Value {
    let mut error = json!({"reason_code": reason_code, "message": message});
    if let Some(f) = field {
        error["field"] = json!(f);
    }
    json!({"status": "rejected", "duplicate": false, "error": error})
}

/// A command for [`apply_automation_command`].
#[derive(Debug, Clone, Default)]
pub struct Command<'a> {
    /// The automation.
    pub automation_id: &'a str,
    /// The caller's id for this command (idempotency: the same id and the
    /// same command is answered again as a duplicate).
    pub command_id: &'a str,
    /// `automation.pause` ... or the short name (`pause`).
    pub command_type: &'a str,
    /// The payload (`revise`: `{"changes": {...}}`); `None` reads as `{}`.
    pub payload: Option<&'a Value>,
    /// Who sends it (recorded).
    pub actor: Option<&'a str>,
    /// Refused with `revision_conflict` unless the automation is at this
    /// revision.
    pub expected_revision: Option<i64>,
}

/// Applies command `c` at `now`: `{status: "applied"|"rejected", error?,
/// duplicate}`. A command is decided from the controller's persisted
/// state under its run transaction and recorded (an
/// `automation.command_result` decision, rejected ones too, and the
/// command's observation) in one commit; then its follow-ups run (wake
/// the controller, cancel the occurrence's run tree, revive an unarchived
/// controller). The same command id with the same command returns the
/// recorded answer with `duplicate: true` (and runs the follow-ups again);
/// with a different command it is `identity_conflict` and nothing is
/// recorded. An unknown automation is rejected (`automation_not_found`,
/// not recorded); `Err` is for failures of the host (the store).
pub fn apply_automation_command(
    rt: &Runtime,
    c: &Command<'_>,
    now: DateTime<Utc>,
) -> Result<Value> {
    // Optimistic first: read, decide, and let the commit take the lease
    // (one store write). If another holder has the controller (a driver
    // ticking it) or it changed since it was read, decide again under a
    // claimed lease.
    match apply_held(rt, c, now, true) {
        Err(Error::Conflict { .. }) => apply_held(rt, c, now, false),
        other => other,
    }
}

fn apply_held(
    rt: &Runtime,
    c: &Command<'_>,
    now: DateTime<Utc>,
    optimistic: bool,
) -> Result<Value> {
    let (command_id, kind) = match validated(c) {
        Ok(valid) => valid,
        Err(refusal) => return Ok(refusal),
    };
    let not_found = || {
        rejected(
            "automation_not_found",
            None,
            &format!("Automation {} does not exist.", c.automation_id),
        )
    };
    let wait = rt.config().lease_wait;
    let held = if optimistic {
        rt.hold_taking(c.automation_id, wait, None)
    } else {
        rt.claim(c.automation_id, wait)
    };
    let (mut txn, mut run) = match held {
        Ok(held) => held,
        Err(Error::RunNotFound { .. }) => return Ok(not_found()),
        Err(e) => return Err(e),
    };
    if run.workflow_id != CONTROLLER_WORKFLOW_ID {
        return Ok(not_found());
    }
    let id = run.run_id.clone();
    let digest = command_digest(kind, c.payload, c.expected_revision);
    let key = record_key("automation.command_result", &id, command_id);
    let ledger = rt.find_records(&id, &key)?;
    if let Some(found) = find_record(&ledger, &key) {
        if found.payload["command_digest"] != json!(digest) {
            let mut shown = String::new();
            super::outcome::py_repr_str(command_id, &mut shown);
            let recorded = match &found.payload["type"] {
                Value::String(t) => t.clone(),
                other => other.to_string(),
            };
            return Ok(rejected(
                "identity_conflict",
                Some("command_id"),
                &format!(
                    "command_id {shown} was already used for a different command ({recorded})."
                ),
            ));
        }
        let reply = answer(found.payload, true);
        drop(txn);
        if reply["status"] == "applied" {
            follow_up(rt, &id, kind, command_id)?;
        }
        return Ok(reply);
    }
    let triggers = rt.triggers()?;
    let payload = c.payload.cloned().unwrap_or(json!({}));
    let decision = decide_command(
        &run,
        kind,
        &payload,
        command_id,
        now,
        c.expected_revision,
        &triggers,
    )?;
    let (status, delta, error) = settle(rt, &run, &triggers, decision)?;
    let mut fields = Map::new();
    fields.insert("command_id".into(), json!(command_id));
    fields.insert("type".into(), json!(kind));
    fields.insert("actor".into(), json!(c.actor));
    fields.insert("command_digest".into(), json!(digest));
    fields.insert("status".into(), json!(status));
    if let Some(e) = &error {
        fields.insert("error".into(), e.clone());
    }
    let at = format_timestamp(now);
    let t = Transition {
        name: "automation.command_result",
        discriminator: command_id,
        fields,
        node_id: "command",
        command_id: Some(command_id),
        at: &at,
    };
    let written = decide(&mut run, &ledger, &t, delta)?;
    let mut records: Vec<_> = written.record.into_iter().collect();
    if status == "applied" {
        if let Some((name, discriminator, fields)) =
            command_observation(&run, kind, command_id, now, &triggers)?
        {
            let key = record_key(name, &id, &discriminator);
            let ledger = rt.find_records(&id, &key)?;
            let t = Transition {
                name,
                discriminator: &discriminator,
                fields,
                node_id: "command",
                command_id: Some(command_id),
                at: &at,
            };
            records.extend(observe(&run, &ledger, &t)?.record);
        }
    }
    // The follow-up of most commands is to wake a controller parked on its
    // wake wait: that resume is committed with the command, caused by its
    // record (so a duplicate finds it done).
    let cause = record_key("automation.command_result", &id, command_id);
    let wake = wake_wait_key(&id);
    let pending = &run.vars["_runtime"]["automation"]["pending_occurrence"];
    let cancels = kind == "automation.stop_current" && pending["phase"] == "dispatched";
    let revives = kind == "automation.unarchive" && run.status == RunStatus::Completed;
    let special = cancels || revives;
    let parked = run.status == RunStatus::Waiting
        && run.waiting.as_ref().is_some_and(|w| w.wait_key == wake);
    if status == "applied" && !special && parked {
        records.push(rt.end_wait(&mut run, json!({"wake": kind}), "resumed", Some(&cause))?);
    }
    txn.commit(records, &mut run)?;
    drop(txn);
    if status == "applied" && special {
        // Recorded: a conflict from here on is not the command's (the
        // caller must not decide it again).
        follow_up(rt, &id, kind, command_id).map_err(|e| match e {
            Error::Conflict { .. } => automation_error(
                "conflict",
                None,
                format!("the command was recorded; its follow-up could not run yet (send it again): {e}"),
            ),
            other => other,
        })?;
    }
    Ok(answer(&written.payload, false))
}

/// What an applied decision becomes once the revised definition's target
/// and connection are checked: `(status, delta, error)`.
fn settle(
    rt: &Runtime,
    run: &RunState,
    triggers: &TriggerRegistry,
    decision: CommandDecision,
) -> Result<(&'static str, Value, Option<Value>)> {
    Ok(match decision {
        CommandDecision::Applied(mut delta) => {
            // A revised target names a bundle directory (loaded, stored
            // absolute) or a workflow the store knows, as at creation.
            let current = &run.vars["_meta"]["automation"]["target"];
            let trigger = &run.vars["_meta"]["automation"]["trigger"];
            // A revised event trigger names a connection that can be bound.
            let rebound = match delta.get("definition").filter(|d| d["trigger"] != *trigger) {
                Some(d) => match bound_connection(rt, triggers, &d["trigger"]) {
                    Ok(()) => None,
                    Err(e) => match e.extension::<super::AutomationError>() {
                        Some(a) => Some(a.clone()),
                        None => return Err(e),
                    },
                },
                None => None,
            };
            match delta
                .get_mut("definition")
                .filter(|d| d["target"] != *current)
            {
                _ if rebound.is_some() => (
                    "rejected",
                    json!({}),
                    rebound.map(|e: super::AutomationError| e.to_json()),
                ),
                Some(definition) => match resolve_target(rt, definition) {
                    Ok(()) => ("applied", delta, None),
                    Err(e) if e.extension::<super::AutomationError>().is_some() => {
                        let detail = e.extension::<super::AutomationError>().map(|a| a.to_json());
                        ("rejected", json!({}), detail)
                    }
                    Err(Error::Flow(e)) => (
                        "rejected",
                        json!({}),
                        Some(json!({"reason_code": "invalid_definition",
                                "message": e.to_string(), "field": "target.bundle_ref"})),
                    ),
                    Err(e) => return Err(e),
                },
                None => ("applied", delta, None),
            }
        }
        CommandDecision::Rejected(e) => ("rejected", json!({}), Some(e)),
    })
}

/// `(status, duplicate, error)` of command result `p`, the caller's answer.
fn answer(p: &Value, duplicate: bool) -> Value {
    let mut a = json!({"status": p["status"], "duplicate": duplicate});
    if let Some(e) = p.get("error").filter(|e| !e.is_null()) {
        a["error"] = e.clone();
    }
    a
}

/// The command's id (stripped) and full type, or the rejection a command
/// without an id, of an unknown type, or with a payload that is not an
/// object gets.
fn validated<'a>(c: &Command<'a>) -> std::result::Result<(&'a str, &'static str), Value> {
    let command_id = super::definition::py_strip(c.command_id);
    if command_id.is_empty() {
        return Err(rejected(
            "invalid_request",
            Some("command_id"),
            "command_id is required",
        ));
    }
    let Some(kind) = command_type(c.command_type) else {
        let mut shown = String::new();
        super::outcome::py_repr_str(c.command_type, &mut shown);
        return Err(rejected(
            "invalid_request",
            Some("type"),
            &format!(
                "unknown automation command type {shown} (one of: {})",
                super::commands::COMMAND_TYPES
                    .map(|t| t.trim_start_matches("automation."))
                    .join(", ")
            ),
        ));
    };
    if c.payload.is_some_and(|p| !p.is_null() && !p.is_object()) {
        return Err(rejected(
            "invalid_request",
            Some("payload"),
            "payload must be a JSON object",
        ));
    }
    Ok((command_id, kind))
}

/// What an applied command does after its commit (again on a duplicate,
/// where it finds what was done already):
/// `stop_current` cancels the occurrence's run tree, `unarchive` revives a
/// controller that ended archived, every other command wakes a controller
/// parked on its wake wait. Resumes do not tick: the driver runs the
/// controller.
fn follow_up(rt: &Runtime, id: &str, kind: &str, command_id: &str) -> Result<()> {
    // Resumes are caused by the command's record: a duplicate (or a
    // replay after a crash) never resumes the controller a second time.
    let cause = record_key("automation.command_result", id, command_id);
    let run = rt.get_state(id)?;
    let state = run
        .vars
        .get("_runtime")
        .and_then(|r| r.get("automation"))
        .cloned()
        .unwrap_or(Value::Null);
    let pending = state
        .get("pending_occurrence")
        .filter(|p| p.is_object())
        .cloned();
    if kind == "automation.stop_current" {
        if let Some(p) = pending
            .as_ref()
            .filter(|p| p["phase"] == "dispatched" && p["stop_requested"] == Value::Bool(true))
        {
            // The controller hears of its cancelled run as any parent of a
            // run that ended does (the driver resumes it with the run's
            // outcome), whichever process cancelled it. A run it did not
            // start (another run took the attempt's id) is left alone: the
            // controller sees that attempt failed, and stopped.
            let child = p["run_id"].as_str().unwrap_or_default().to_string();
            match rt.get_state(&child) {
                Ok(run) if taken_occurrence_id(id, &run).is_none() => cancel_tree(rt, &child)?,
                Ok(_) | Err(Error::RunNotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        // A stop that needed a wake had it committed with the command.
        return Ok(());
    }
    if kind == "automation.unarchive" {
        let definition = &run.vars["_meta"]["automation"];
        let archived = !definition["archived_at"].is_null();
        let exhausted = state["exhausted"] == Value::Bool(true);
        if run.status == RunStatus::Completed
            && !archived
            && !exhausted
            && state["paused"] == Value::Bool(true)
        {
            let (mut txn, mut run) = rt.claim(id, rt.config().lease_wait)?;
            if run.status == RunStatus::Completed {
                run.status = RunStatus::Running;
                run.current_node = Some("read_definition".into());
                run.waiting = None;
                run.output = None;
                run.error = None;
                txn.commit(Vec::new(), &mut run)?;
            }
        }
        // An unarchive that needed a wake had it committed with the command.
        return Ok(());
    }
    let wake = wake_wait_key(id);
    if run.status == RunStatus::Waiting && run.waiting.as_ref().is_some_and(|w| w.wait_key == wake)
    {
        match rt.resume_at(
            id,
            Some(&wake),
            json!({"wake": kind}),
            Some(&cause),
            0,
            false,
        ) {
            Ok(_) | Err(Error::StaleResume { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Checks the connection an event source's binding names
/// ([`crate::triggers::check_binding`]).
fn bound_connection(
    rt: &Runtime,
    triggers: &crate::triggers::TriggerRegistry,
    trigger: &Value,
) -> Result<()> {
    crate::triggers::check_binding(rt.store(), triggers, trigger).map_err(Error::from)
}

/// Cancels `root` and every unfinished run below it.
fn cancel_tree(rt: &Runtime, root: &str) -> Result<()> {
    let mut todo = vec![root.to_string()];
    while let Some(id) = todo.pop() {
        for child in rt.list_runs(&stepwell_runtime::RunQuery {
            parent_run_id: Some(id.clone()),
            ..Default::default()
        })? {
            todo.push(child.run_id);
        }
        let run = rt.get_state(&id)?;
        if !run.status.is_terminal() {
            rt.cancel_run_by(&id, Some("Stopped by automation.stop_current"), "command")?;
        }
    }
    Ok(())
}

pub(crate) fn controller_run(rt: &Runtime, id: &str) -> Result<RunState> {
    let not_found = || {
        automation_error(
            "automation_not_found",
            None,
            format!("Automation {id} does not exist."),
        )
    };
    match rt.get_state(id) {
        Ok(run) if run.workflow_id == CONTROLLER_WORKFLOW_ID => Ok(run),
        Ok(_) | Err(Error::RunNotFound { .. }) => Err(not_found()),
        Err(e) => Err(e),
    }
}

/// The automation `id` as a reader sees it at `now` (see
/// [`super::get_automation`]).
pub fn show_automation(rt: &Runtime, id: &str, now: DateTime<Utc>) -> Result<Value> {
    let run = controller_run(rt, id)?;
    let mut view = match get_automation(&run, now, &*rt.triggers()?) {
        Ok(view) => view,
        // A trigger source this host cannot call (a plugin it does not
        // have): the automation is still shown, with why it has no
        // next_fire_at.
        Err(e)
            if e.reason_code.starts_with("trigger")
                || e.reason_code == "unknown_trigger_source" =>
        {
            let mut view = super::view::automation_view(&run, Value::Null)?;
            view["error"] = e.to_json();
            view
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(held) = held(rt, id)? {
        view["held"] = held;
    }
    Ok(view)
}

/// Why the controller of automation `id` is held at its node, if the
/// driver could not move it the last time it tried (a trigger source that
/// fails, a store error): `{"error", "failures", "retry_at"}`, until the
/// controller's next commit. A stepwell addition: the reference has no
/// driver that keeps a controller it cannot move.
pub fn held(rt: &Runtime, id: &str) -> Result<Option<Value>> {
    let Some(d) = rt.store().deferral(id)? else {
        return Ok(None);
    };
    Ok(d.reason.map(|error| {
        json!({
            "error": error,
            "failures": d.count,
            "retry_at": format_timestamp(d.until),
        })
    }))
}

/// One page of the automations, newest first (by creation time, then id):
/// `{"items": [summary...], "next_cursor"}`. `status` keeps the summaries
/// with one of these statuses (comma-separated); `cursor` (`auto1:...`)
/// continues after the row it names.
pub fn list_automations(
    rt: &Runtime,
    status: Option<&str>,
    cursor: Option<&str>,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<Value> {
    let after = cursor.map(parse_automations_cursor).transpose()?;
    let wanted: Option<Vec<String>> = status.map(stepwell_runtime::store::filter_values);
    let rows = rt.store().list_run_index(&RunIndexQuery {
        role: Some(vec!["controller".into()]),
        ..Default::default()
    })?;
    let triggers = rt.triggers()?;
    let mut keyed: Vec<(String, String, RunState)> = Vec::new();
    for row in rows {
        let Some(run) = rt.store().load_run(&row.run_id)? else {
            continue;
        };
        if run.workflow_id != CONTROLLER_WORKFLOW_ID {
            continue;
        }
        let created = run.vars["_meta"]["automation"]["created_at"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        keyed.push((created, run.run_id.clone(), run));
    }
    keyed.sort_by(|a, b| (&b.0, &b.1).cmp(&(&a.0, &a.1)));
    let limit = limit.max(1) as usize;
    let mut items = Vec::new();
    let mut next = None;
    for (created, run_id, run) in keyed {
        if let Some((c, r)) = &after {
            if (&created, &run_id) >= (c, r) {
                continue;
            }
        }
        if let Some(w) = &wanted {
            if !w.iter().any(|s| s == automation_status(&run).as_str()) {
                continue;
            }
        }
        if items.len() == limit {
            next = items
                .last()
                .map(|(c, r, _): &(String, String, Value)| automations_cursor(c, r));
            break;
        }
        // One automation that cannot be summarised (its trigger source is
        // not loaded here, say) does not hide the others.
        let mut summary = match automation_summary(&run, now, &triggers) {
            Ok(s) => s,
            Err(e) => json!({
                "automation_id": run_id,
                "title": run.vars["_meta"]["automation"]["title"],
                "status": automation_status(&run).as_str(),
                "error": e.to_json(),
            }),
        };
        if let Some(held) = held(rt, &run_id)? {
            summary["held"] = held;
        }
        items.push((created, run_id, summary));
    }
    Ok(json!({
        "items": items.into_iter().map(|(_, _, s)| s).collect::<Vec<_>>(),
        "next_cursor": next,
    }))
}

/// One page of automation `id`'s occurrences, newest first (see
/// [`super::occurrence_page`]).
pub fn list_occurrences(rt: &Runtime, id: &str, cursor: Option<&str>, limit: i64) -> Result<Value> {
    controller_run(rt, id)?;
    let records = rt.get_ledger(id)?;
    Ok(occurrence_page(&records, cursor, limit)?)
}

/// One page of automation `id`'s attention items, oldest first (see
/// [`super::attention_page`]).
pub fn list_attention(
    rt: &Runtime,
    id: &str,
    after_seq: i64,
    cursor: Option<&str>,
    limit: i64,
) -> Result<Value> {
    controller_run(rt, id)?;
    let records = rt.get_ledger(id)?;
    Ok(attention_page(id, &records, after_seq, cursor, limit)?)
}

/// What [`drive_until_idle`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct IdleReport {
    /// Driver passes that moved something.
    pub passes: u64,
    /// Runs ticked, resumed or started over all passes (with repeats).
    pub moved: u64,
    /// Runs a pass could not move, with why (the last pass's).
    pub errors: Vec<stepwell_runtime::core::RunError>,
}

/// How long [`drive_until_idle`] waits for effects in flight to land.
const IDLE_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs driver passes until one moves nothing and no effect is in flight
/// (at most `max_passes`):
/// controllers admit and dispatch, occurrences run, parents hear of their
/// children, due waits resume.
pub fn drive_until_idle(rt: &Runtime, max_passes: u64) -> Result<IdleReport> {
    drive_until_idle_with(rt, max_passes, std::time::Duration::MAX, &mut |_| {})
}

/// [`drive_until_idle`], handing `progress` what it did so far after a
/// pass when `every` has passed since it last did (a large store takes many
/// passes, and a person waiting on a terminal is told).
pub fn drive_until_idle_with(
    rt: &Runtime,
    max_passes: u64,
    every: std::time::Duration,
    progress: &mut dyn FnMut(&IdleReport),
) -> Result<IdleReport> {
    let mut report = IdleReport::default();
    let mut told = std::time::Instant::now();
    for _ in 0..max_passes.max(1) {
        crate::triggers::feed_once(rt)?;
        let pass = rt.drive_once()?;
        report.errors = pass.errors.clone();
        if !pass.moved_anything() {
            // Effects in flight land and their runs go on by themselves;
            // once they have, another pass looks at what they left.
            if rt.in_flight() > 0 && rt.wait_in_flight(IDLE_FLIGHT_WAIT) {
                continue;
            }
            break;
        }
        report.passes += 1;
        report.moved += (pass.due_resumed.len()
            + pass.ticked.len()
            + pass.parents_resumed.len()
            + pass.orphans_cancelled.len()) as u64;
        if told.elapsed() >= every {
            progress(&report);
            told = std::time::Instant::now();
        }
    }
    Ok(report)
}

/// The kind of a run's wait on a person (`ask_user`, `tool_approval`,
/// `event`), or `None` when it waits on something else: an automation's
/// wake wait, a time, a child run, or an event without a prompt or choices.
fn wait_kind(run: &RunState) -> Option<&'static str> {
    let w = run
        .waiting
        .as_ref()
        .filter(|_| run.status == RunStatus::Waiting)?;
    if w.wait_key.starts_with("automation:") && w.wait_key.ends_with(":wake") {
        return None;
    }
    let details = w.details.as_ref().and_then(Value::as_object);
    match w.reason {
        stepwell_runtime::WaitReason::User => {
            let pause = w.wait_key == format!("pause:{}", run.run_id)
                || details.is_some_and(|d| d.get("kind") == Some(&json!("pause")));
            if pause {
                None
            } else if details.is_some_and(|d| d.get("mode") == Some(&json!("approval_required"))) {
                Some("tool_approval")
            } else {
                Some("ask_user")
            }
        }
        stepwell_runtime::WaitReason::Event => {
            let asks = w.prompt.as_deref().is_some_and(|p| !p.is_empty())
                || w.choices.as_ref().is_some_and(|c| !c.is_empty());
            if !asks {
                None
            } else if details.is_some_and(|d| d.get("mode") == Some(&json!("approval_required"))) {
                Some("tool_approval")
            } else {
                Some("event")
            }
        }
        _ => None,
    }
}

/// `{run_id, wait_key, kind, reason, prompt?, choices?, details?}` of a run
/// waiting on a person (the reference's `typed_wait`).
fn typed_wait(run: &RunState) -> Option<Value> {
    let kind = wait_kind(run)?;
    let w = run.waiting.as_ref()?;
    let mut item = json!({"run_id": run.run_id, "wait_key": w.wait_key, "kind": kind,
                          "reason": w.reason.as_str()});
    if let Some(p) = w.prompt.as_deref().filter(|p| !p.is_empty()) {
        item["prompt"] = json!(p);
    }
    if let Some(c) = w.choices.as_ref().filter(|c| !c.is_empty()) {
        item["choices"] = json!(c);
    }
    if kind == "tool_approval" {
        let calls: Vec<Value> = w
            .details
            .as_ref()
            .and_then(|d| d.get("tool_calls"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object)
            .map(|c| {
                let mut call = json!({
                    "name": c.get("name").and_then(Value::as_str).unwrap_or_default(),
                    "arguments": c.get("arguments").filter(|a| a.is_object()).cloned().unwrap_or(json!({})),
                });
                if let Some(id) = c.get("call_id").and_then(Value::as_str).filter(|i| !i.is_empty()) {
                    call["call_id"] = json!(id);
                }
                call
            })
            .collect();
        item["details"] = json!(calls);
    } else if kind == "event" {
        let scopes = [
            ("session", run.session_id.clone()),
            ("run", Some(run.run_id.clone())),
            ("workflow", Some(run.workflow_id.clone())),
            ("global", Some("global".to_string())),
        ];
        for (scope, scope_id) in scopes {
            let Some(scope_id) = scope_id.filter(|s| !s.is_empty()) else {
                continue;
            };
            let prefix = format!("evt:{scope}:{scope_id}:");
            if let Some(name) = w.wait_key.strip_prefix(&prefix).filter(|n| !n.is_empty()) {
                item["details"] = json!({"scope": scope, "name": name});
                break;
            }
        }
    }
    Some(item)
}

/// The waits on a person in automation `id`'s occurrence trees (the
/// occurrences and every run below them), oldest occurrence first, at most
/// `limit`: `{run_id, wait_key, kind: "ask_user" | "tool_approval" |
/// "event", reason, index, prompt?, choices?, details?}`. Live facts read
/// from the runs waiting now (the run index), never attention items.
/// Answer an `ask_user` wait with `stepwell resume RUN --payload
/// '{"text": ...}'`.
pub fn pending_waits(rt: &Runtime, id: &str, limit: usize) -> Result<Vec<Value>> {
    controller_run(rt, id)?;
    let mut rows = rt.store().list_run_index(&RunIndexQuery {
        status: Some(RunStatus::Waiting),
        automation_id: Some(vec![id.to_string()]),
        role: Some(vec!["occurrence".into(), "descendant".into()]),
        limit: Some(100_000),
        ..Default::default()
    })?;
    rows.sort_by(|a, b| {
        (a.occurrence_index.unwrap_or(-1), &a.created_at, &a.run_id).cmp(&(
            b.occurrence_index.unwrap_or(-1),
            &b.created_at,
            &b.run_id,
        ))
    });
    let mut out = Vec::new();
    for row in rows {
        if out.len() >= limit {
            break;
        }
        let Some(run) = rt.store().load_run(&row.run_id)? else {
            continue;
        };
        if let Some(mut item) = typed_wait(&run) {
            item["index"] = run.vars["_meta"]["occurrence"]["occurrence_index"].clone();
            out.push(item);
        }
    }
    Ok(out)
}

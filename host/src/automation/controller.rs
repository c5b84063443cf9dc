//! The controller's host effects: what its WASM nodes ask the host for
//! because it needs the store or the trigger source.
//!
//! - `automation.wait`: the trigger's `prepare` on the persisted cursor,
//!   then go on (`go`), end (`end`), or park on the wake wait
//!   (`automation:<id>:wake`, with the deadline when there is one; a wake
//!   goes on at `admit`, which decides again from persisted state).
//! - `automation.admit`: re-attaches to the occurrence in flight, or admits
//!   a new one (a queued run-now, or what the trigger's `admit` finds due),
//!   freezing its inputs; routes `prepare`, `dispatch` or `rearm`.
//! - `automation.dispatch`: records the dispatch of the current attempt and
//!   creates its child run under the deterministic occurrence id
//!   (create-if-absent, identity-checked); the controller waits on it.
//! - `automation.record_outcome`: reads the attempt's child run again and
//!   records what its end means (completed, cancelled, a retry after a
//!   backoff, failed); routes `next`, or `dispatch` to wait again.
//!
//! Each decision is an `automation.*` record committed in the same atomic
//! commit as the controller's step and its new state, so a crash leaves
//! both or neither. A failure of the host (a trigger that cannot be called,
//! a store error) is an `Err`: the step commits nothing, the controller
//! stays at its node, and the next tick tries again.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::commands::binding_of;
use super::decision::{decide, observe, Transition};
use super::definition::{trigger_failure, trigger_state_of};
use super::envelope::{
    ensure_cloudevent_attributes, occurrence_origin, occurrence_vars, prompt_header, to_cloudevent,
};
use super::ids::{occurrence_run_id, record_key, wake_wait_key, OccurrenceKind};
use super::occurrence::{plan_dispatch, plan_outcome, plan_wait, Planned, WaitPlan};
use super::outcome::complete_occurrence;
use super::time::{format_timestamp, parse_timestamp};
use super::AutomationError;
use crate::core::config::StartOptions;
use crate::core::model::{RunState, StepRecord, WaitReason, WaitState};
use crate::core::{Error, Result};
use crate::effects::subworkflow::{child_wait, OnChildFailure};
use crate::effects::{EffectClass, EffectCx, EffectHandler, HostChange, Outcome, Then};
use crate::triggers::{Envelope, TriggerRegistry};
use crate::wasm::WasmEngine;

/// Where the trigger sources come from: the built-in ones and the plugin
/// folder, loaded the first time an automation needs them.
pub struct TriggerCatalog {
    engine: WasmEngine,
    plugin_dir: Option<PathBuf>,
    loaded: OnceLock<std::result::Result<Arc<TriggerRegistry>, String>>,
}

impl std::fmt::Debug for TriggerCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TriggerCatalog")
            .field("plugin_dir", &self.plugin_dir)
            .finish_non_exhaustive()
    }
}

impl TriggerCatalog {
    /// The built-in sources and the plugins of `plugin_dir`, loaded with
    /// `engine` on first use.
    pub fn new(engine: WasmEngine, plugin_dir: Option<PathBuf>) -> Self {
        TriggerCatalog {
            engine,
            plugin_dir,
            loaded: OnceLock::new(),
        }
    }

    /// The loaded registry.
    pub fn registry(&self) -> Result<Arc<TriggerRegistry>> {
        self.loaded
            .get_or_init(|| {
                TriggerRegistry::load(&self.engine, self.plugin_dir.as_deref())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| Error::Automation(AutomationError::new("trigger_registry_error", None, e)))
    }
}

/// The controller's host effects, sharing `catalog`.
pub fn controller_effects(catalog: Arc<TriggerCatalog>) -> Vec<Arc<dyn EffectHandler>> {
    [Node::Wait, Node::Admit, Node::Dispatch, Node::RecordOutcome]
        .into_iter()
        .map(|node| {
            Arc::new(ControllerEffect {
                node,
                catalog: catalog.clone(),
            }) as Arc<dyn EffectHandler>
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Wait,
    Admit,
    Dispatch,
    RecordOutcome,
}

struct ControllerEffect {
    node: Node,
    catalog: Arc<TriggerCatalog>,
}

/// One controller step's view of the run: its state as the step changes
/// it, and the records to commit with it.
struct Turn<'a> {
    run: RunState,
    records: Vec<StepRecord>,
    now: DateTime<Utc>,
    at: String,
    cx: &'a EffectCx<'a>,
}

fn seam(message: impl Into<String>) -> Error {
    Error::Automation(AutomationError::new("controller_seam", None, message))
}

impl<'a> Turn<'a> {
    fn new(cx: &'a EffectCx<'a>) -> Self {
        Turn {
            run: cx.run.clone(),
            records: Vec::new(),
            now: cx.now,
            at: format_timestamp(cx.now),
            cx,
        }
    }

    fn id(&self) -> String {
        self.run.run_id.clone()
    }

    /// The object at `<top>.automation` of the controller's vars.
    fn part(&self, top: &str, what: &str) -> Result<Value> {
        self.run
            .vars
            .get(top)
            .and_then(|m| m.get("automation"))
            .filter(|d| d.is_object())
            .cloned()
            .ok_or_else(|| seam(format!("the controller has no {top}.automation {what}")))
    }

    fn definition(&self) -> Result<Value> {
        self.part("_meta", "definition")
    }

    fn state(&self) -> Result<Value> {
        self.part("_runtime", "state")
    }

    fn ledger_for(&self, name: &str, discriminator: &str) -> Result<Vec<StepRecord>> {
        let key = record_key(name, &self.run.run_id, discriminator);
        self.cx.runs.find_records(&self.run.run_id, &key)
    }

    fn decide(&mut self, node: &str, planned: Planned) -> Result<()> {
        let ledger = self.ledger_for(planned.name, &planned.discriminator)?;
        let at = self.at.clone();
        let t = Transition {
            name: planned.name,
            discriminator: &planned.discriminator,
            fields: planned.fields,
            node_id: node,
            command_id: None,
            at: &at,
        };
        let written = decide(&mut self.run, &ledger, &t, planned.delta)?;
        self.records.extend(written.record);
        Ok(())
    }

    fn observe(
        &mut self,
        node: &str,
        name: &str,
        discriminator: &str,
        fields: Map<String, Value>,
    ) -> Result<()> {
        let ledger = self.ledger_for(name, discriminator)?;
        let t = Transition {
            name,
            discriminator,
            fields,
            node_id: node,
            command_id: None,
            at: &self.at,
        };
        let written = observe(&self.run, &ledger, &t)?;
        self.records.extend(written.record);
        Ok(())
    }

    /// The step's answer: the changed state and definition, the records,
    /// the route and what follows.
    fn finish(self, route: &str, then: Then) -> Result<Outcome> {
        let state = self.state()?;
        let definition = self.definition()?;
        let mut state = state;
        // `active_revision` is derived from the definition on every save.
        state["active_revision"] = definition["revision"].clone();
        Ok(Outcome::HostChange(Box::new(HostChange {
            assign: vec![
                ("_runtime.automation".into(), state),
                ("_meta.automation".into(), definition),
            ],
            records: self.records,
            route: Some(route.to_string()),
            then,
        })))
    }
}

fn set(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

impl EffectHandler for ControllerEffect {
    fn kind(&self) -> &str {
        match self.node {
            Node::Wait => "automation.wait",
            Node::Admit => "automation.admit",
            Node::Dispatch => "automation.dispatch",
            Node::RecordOutcome => "automation.record_outcome",
        }
    }

    /// Executed again when a step is replayed: every decision is keyed and
    /// committed with the step, and the occurrence's child is created
    /// under its deterministic id (create-if-absent), so doing it again
    /// after a crash finds what the first try left, or nothing.
    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn owns_host_state(&self) -> bool {
        true
    }

    fn commits_first(&self) -> bool {
        // The child is created under the controller, which must exist
        // with its resume committed before.
        self.node == Node::Dispatch
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        _payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> Result<Outcome> {
        if cx.run.workflow_id != super::CONTROLLER_WORKFLOW_ID {
            return Ok(Outcome::Failed(crate::effects::Failure::permanent(
                "invalid_effect",
                format!(
                    "{} belongs to the automation controller ({}), not to workflow {}",
                    self.kind(),
                    super::CONTROLLER_WORKFLOW_ID,
                    cx.run.workflow_id
                ),
            )));
        }
        let turn = Turn::new(cx);
        match self.node {
            Node::Wait => self.wait(turn),
            Node::Admit => self.admit(turn),
            Node::Dispatch => dispatch(turn),
            Node::RecordOutcome => record_outcome(turn),
        }
    }
}

impl ControllerEffect {
    fn wait(&self, mut turn: Turn<'_>) -> Result<Outcome> {
        let definition = turn.definition()?;
        let state = turn.state()?;
        let triggers = self.catalog.registry()?;
        match plan_wait(&definition, &state, turn.now, &triggers)? {
            WaitPlan::Go => turn.finish("go", Then::Continue(Value::Null)),
            WaitPlan::End => {
                // A source that keeps no `exhausted` of its own (a plugin)
                // has it noted once it says it will never fire again.
                let nothing_pending =
                    state["pending_occurrence"].is_null() && state["manual_pending"].is_null();
                let archived = !definition["archived_at"].is_null();
                if nothing_pending && !archived && state["exhausted"] != Value::Bool(true) {
                    if let Some(s) = turn
                        .run
                        .vars
                        .get_mut("_runtime")
                        .and_then(|r| r.get_mut("automation"))
                        .and_then(Value::as_object_mut)
                    {
                        s.insert("exhausted".into(), Value::Bool(true));
                    }
                }
                turn.finish("end", Then::Continue(Value::Null))
            }
            WaitPlan::Park(until) => {
                let wait = WaitState {
                    reason: WaitReason::Event,
                    wait_key: wake_wait_key(&turn.run.run_id),
                    until,
                    resume_to_node: None,
                    result_key: None,
                    prompt: None,
                    choices: None,
                    details: None,
                };
                turn.finish("go", Then::Wait(Box::new(wait)))
            }
        }
    }

    fn admit(&self, mut turn: Turn<'_>) -> Result<Outcome> {
        let definition = turn.definition()?;
        let state = turn.state()?;
        let id = turn.id();
        if let Some(pending) = state.get("pending_occurrence").filter(|p| p.is_object()) {
            let phase = pending.get("phase").and_then(Value::as_str);
            if set(pending.get("stop_requested")) && phase != Some("dispatched") {
                let c = complete_occurrence(&definition, &state, "cancelled", None, &turn.at);
                let index = pending["index"].as_u64().unwrap_or(0);
                turn.decide(
                    "admit",
                    Planned {
                        name: "automation.completed",
                        discriminator: index.to_string(),
                        fields: into_map(c.fields),
                        delta: json!({"state": c.state}),
                    },
                )?;
                return turn.finish("rearm", Then::Continue(Value::Null));
            }
            let due = pending
                .get("retry_at")
                .and_then(Value::as_str)
                .and_then(|t| parse_timestamp(t, "retry_at").ok())
                .is_none_or(|t| t <= turn.now);
            if phase == Some("backoff") && !due {
                return turn.finish("rearm", Then::Continue(Value::Null));
            }
            return turn.finish("dispatch", Then::Continue(Value::Null));
        }
        let triggers = self.catalog.registry()?;
        let binding = binding_of(&definition);
        let index = state["next_index"].as_u64().filter(|i| *i > 0).unwrap_or(1);
        let revision = definition["revision"].as_u64().unwrap_or(1);
        let manual = state
            .get("manual_pending")
            .and_then(|m| m.get("command_id"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let mut trigger_update = Map::new();
        let mut coalesced = None;
        let (envelope, first_run_id, command_id) = match manual {
            Some(command_id) => {
                let source = triggers.get("manual@1").map_err(trigger_failure)?;
                let envelope = source
                    .normalize(
                        &binding,
                        &format!("manual:{command_id}"),
                        &turn.at,
                        &json!({"command_id": command_id}),
                    )
                    .map_err(trigger_failure)?;
                let first = occurrence_run_id(
                    &id,
                    OccurrenceKind::Manual {
                        command_id: &command_id,
                    },
                    1,
                );
                (envelope_json(envelope), first, Some(command_id))
            }
            None => {
                if set(state.get("paused")) || set(definition.get("archived_at")) {
                    return turn.finish("rearm", Then::Continue(Value::Null));
                }
                let name = format!("{}@{}", binding.source_id, binding.source_version);
                let source = triggers.get(&name).map_err(trigger_failure)?;
                let admitted = source
                    .admit(&binding, &trigger_state_of(&state), &turn.at)
                    .map_err(trigger_failure)?;
                let Some(admission) = admitted.admission else {
                    // A stale wake: nothing is due.
                    return turn.finish("rearm", Then::Continue(Value::Null));
                };
                coalesced = admission
                    .payload
                    .get("coalesced")
                    .and_then(Value::as_object)
                    .cloned();
                let envelope = source
                    .normalize(
                        &binding,
                        &admission.event_id,
                        &admission.fired_at,
                        &admission.payload,
                    )
                    .map_err(trigger_failure)?;
                trigger_update = super::definition::stored_trigger_state(&admitted.state);
                let first =
                    occurrence_run_id(&id, OccurrenceKind::Scheduled { revision, index }, 1);
                (envelope_json(envelope), first, None)
            }
        };
        let owner = turn
            .run
            .vars
            .get("_meta")
            .and_then(|m| m.get("automation_owner"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let prepared = build_prepared(
            &id,
            &definition,
            owner.as_deref(),
            index,
            &envelope,
            &first_run_id,
        )?;
        let event_id = envelope["event_id"].clone();
        let pending = json!({
            "run_id": first_run_id,
            "index": index,
            "attempt": 1,
            "event_id": event_id,
            "revision": revision,
            "envelope": envelope,
            "phase": "admitted",
            "command_id": command_id,
            "prepared": prepared,
            "retry": definition["policy"]["retry"],
            "session_kind": "occurrence",
            "stop_requested": false,
        });
        if let Some(c) = coalesced {
            let mut fields = c;
            fields.insert("event_id".into(), event_id.clone());
            let discriminator = event_id.as_str().unwrap_or_default().to_string();
            turn.observe("admit", "automation.coalesced", &discriminator, fields)?;
        }
        let mut delta = trigger_update;
        delta.insert("pending_occurrence".into(), pending);
        delta.insert("next_index".into(), json!(index + 1));
        delta.insert("manual_pending".into(), Value::Null);
        turn.decide(
            "admit",
            Planned {
                name: "automation.admitted",
                discriminator: index.to_string(),
                fields: into_map(json!({
                    "run_id": first_run_id,
                    "index": index,
                    "attempt": 1,
                    "event_id": event_id,
                    "trigger_envelope": envelope,
                    "prepared": prepared,
                })),
                delta: json!({"state": delta}),
            },
        )?;
        turn.finish("prepare", Then::Continue(Value::Null))
    }
}

fn into_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// An envelope with its CloudEvents attributes (every built-in source is
/// trusted; a plugin cannot say otherwise yet).
fn envelope_json(e: Envelope) -> Value {
    let mut m = into_map(json!({
        "event_id": e.event_id,
        "source_id": e.source_id,
        "source_version": e.source_version,
        "fired_at": super::time::respell(&e.fired_at),
        "payload": e.payload,
        "binding_id": e.binding_id,
    }));
    ensure_cloudevent_attributes(&mut m, "trusted");
    Value::Object(m)
}

/// The occurrence's frozen inputs (the reference's `build_prepared`, for
/// the independent context mode): the target's inputs with the prompt
/// header, the tool grant, the context receipt, the pre-authorised
/// recipients, the title and origin, the event in CloudEvents form and the
/// source's named inputs; the session is the attempt-1 run id.
pub fn build_prepared(
    automation_id: &str,
    definition: &Value,
    owner: Option<&str>,
    index: u64,
    envelope: &Value,
    first_run_id: &str,
) -> std::result::Result<Value, AutomationError> {
    let source_id = envelope["source_id"].as_str().unwrap_or_default();
    let source_version = envelope["source_version"].as_i64().unwrap_or(0);
    let fired_at = envelope["fired_at"].as_str().unwrap_or_default();
    let mut input = definition["target"]
        .get("input_data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(Value::String(prompt)) = input.get("prompt") {
        let header = prompt_header(source_id, source_version, index, fired_at);
        input.insert("prompt".into(), json!(format!("{header}{prompt}")));
    }
    let policy = &definition["policy"];
    let untrusted = set(definition.get("untrusted_origin"));
    let approval = policy["tool_approval"].as_str().unwrap_or("auto");
    let mut runtime = input
        .get("_runtime")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if approval == "auto" || untrusted {
        grant_tools(&mut input, &mut runtime, policy, untrusted, approval);
    }
    let mode = definition["context"]["mode"]
        .as_str()
        .unwrap_or("independent");
    if mode != "independent" {
        return Err(AutomationError::unsupported(
            "context.mode",
            format!("context mode {mode:?} is not supported yet (only \"independent\")"),
        ));
    }
    let target_use_context = ["use_context", "include_context"]
        .iter()
        .find_map(|k| input.get(*k).cloned())
        .unwrap_or(Value::Null);
    input.insert("use_context".into(), json!(false));
    if input.contains_key("include_context") {
        input.insert("include_context".into(), json!(false));
    }
    runtime.insert(
        "automation_context".into(),
        json!({"mode": mode, "use_context": false, "target_use_context": target_use_context}),
    );
    runtime.insert(
        "email_allowed_recipients".into(),
        policy
            .get("email_allowed_recipients")
            .cloned()
            .unwrap_or(json!(["self"])),
    );
    input.insert("_runtime".into(), Value::Object(runtime));
    let mut meta = input
        .get("_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.insert("automation_title".into(), definition["title"].clone());
    meta.insert(
        "origin".into(),
        occurrence_origin(
            source_id == "manual",
            owner,
            automation_id,
            envelope["event_id"].as_str().unwrap_or_default(),
            &format!("{source_id}@{source_version}"),
            index,
        ),
    );
    input.insert("_meta".into(), Value::Object(meta));
    input.insert("event".into(), to_cloudevent(envelope));
    if source_id == "schedule" {
        input.insert(
            "scheduled_at".into(),
            envelope["payload"]
                .get("scheduled_at")
                .cloned()
                .unwrap_or(Value::Null),
        );
        input.insert("occurrence".into(), json!(index));
    }
    Ok(json!({
        "workflow_id": definition["target"]["workflow_id"],
        "session_id": first_run_id,
        "workspace_root": definition["workspace_root"],
        "input_data": input,
    }))
}

/// The tool grant of an occurrence (`_runtime.tool_policy`). The
/// candidates are the target's `_runtime.allowed_tools` when it lists
/// them, else every tool of stepwell's tool table (none yet: tools come
/// with the LLM and tools work); no tool of stepwell sends messages, so
/// none is withheld. A trusted source under `auto` keeps a policy the
/// target set itself.
fn grant_tools(
    input: &mut Map<String, Value>,
    runtime: &mut Map<String, Value>,
    policy: &Value,
    untrusted: bool,
    approval: &str,
) {
    if !untrusted && runtime.contains_key("tool_policy") {
        return;
    }
    let mut candidates: Vec<String> = runtime
        .get("allowed_tools")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    candidates.sort();
    candidates.dedup();
    if !untrusted {
        runtime.insert(
            "tool_policy".into(),
            json!({"auto_approve_tools": candidates, "withheld_tools": [],
                   "source": "automation-policy"}),
        );
        return;
    }
    let named: Vec<String> = policy["untrusted_input_tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    let candidates: Vec<String> = candidates
        .into_iter()
        .filter(|t| !t.starts_with("mcp::"))
        .collect();
    let auto: Vec<&String> = candidates.iter().filter(|t| named.contains(t)).collect();
    let require: Vec<&String> = candidates.iter().filter(|t| !named.contains(t)).collect();
    let replaced = runtime.contains_key("tool_policy");
    let mut p = json!({"auto_approve_tools": if approval == "auto" { json!(auto) } else { json!([]) },
                       "withheld_tools": [], "source": "automation-policy",
                       "untrusted_input": true, "approval": approval,
                       "untrusted_input_tools": named, "replaced_target_policy": replaced});
    if approval != "auto" {
        p["require_approval_tools"] = json!(require);
    }
    runtime.insert("tool_policy".into(), p);
    runtime.insert("untrusted_input".into(), json!(true));
    if let Some(Value::Array(tools)) = input.get_mut("tools") {
        tools.retain(|t| !t.as_str().is_some_and(|s| s.starts_with("mcp::")));
    }
}

fn pending_of(state: &Value) -> Result<Value> {
    state
        .get("pending_occurrence")
        .filter(|p| p.is_object())
        .cloned()
        .ok_or_else(|| seam("no occurrence is pending here"))
}

fn dispatch(mut turn: Turn<'_>) -> Result<Outcome> {
    let id = turn.id();
    let state = turn.state()?;
    pending_of(&state)?;
    if let Some(planned) = plan_dispatch(&id, &state)? {
        turn.decide("dispatch", planned)?;
    }
    let pending = pending_of(&turn.state()?)?;
    let child_id = pending["run_id"].as_str().unwrap_or_default().to_string();
    let prepared = &pending["prepared"];
    let workflow_id = prepared["workflow_id"].as_str().unwrap_or_default();
    let Value::Object(mut vars) = occurrence_vars(&id, &pending) else {
        return Err(seam("the occurrence's vars are not an object"));
    };
    // The frozen `_runtime` inputs (context receipt, tool grant,
    // recipients) are the host's to set: they seed the child's `_runtime`.
    let mut runtime = match vars.remove("_runtime") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    runtime.insert(crate::core::keys::LINEAGE.into(), json!(1));
    runtime.insert(
        crate::core::keys::CASCADE_DEPTH.into(),
        json!(turn.cx.depth + 1),
    );
    let options = StartOptions {
        vars,
        run_id: Some(child_id.clone()),
        actor_id: turn.run.actor_id.clone(),
        session_id: prepared["session_id"].as_str().map(str::to_string),
        parent_run_id: Some(id.clone()),
        runtime,
    };
    let started = turn.cx.runs.start_run(workflow_id, options)?;
    if started != child_id {
        return Err(seam(format!(
            "the occurrence run was created as {started}, not under its id {child_id}"
        )));
    }
    // The controller waits on the attempt's run even if it has ended
    // already (a dispatch replayed after a crash, whose run went on): the
    // driver resumes a parent whose child ended, so a replay writes the
    // same records as a first try.
    let wait = child_wait(&child_id, workflow_id, true, OnChildFailure::Data);
    turn.finish("record_outcome", Then::Wait(Box::new(wait)))
}

fn record_outcome(mut turn: Turn<'_>) -> Result<Outcome> {
    let state = turn.state()?;
    let definition = turn.definition()?;
    let Some(pending) = state.get("pending_occurrence").filter(|p| p.is_object()) else {
        return turn.finish("next", Then::Continue(Value::Null));
    };
    if pending["phase"] != "dispatched" {
        return turn.finish("next", Then::Continue(Value::Null));
    }
    let run_id = pending["run_id"].as_str().unwrap_or_default().to_string();
    if let Some(sub) = turn
        .run
        .vars
        .get("_temp")
        .and_then(|t| t.get("automation_dispatch"))
        .and_then(|d| d.get("sub_run_id"))
        .and_then(Value::as_str)
    {
        if sub != run_id {
            return Err(seam(format!(
                "the dispatch answered for run {sub}, not for the occurrence's run {run_id}"
            )));
        }
    }
    let child = turn.cx.runs.get_run(&run_id)?;
    match plan_outcome(&definition, &state, &child, turn.now)? {
        None => turn.finish("dispatch", Then::Continue(Value::Null)),
        Some(planned) => {
            turn.decide("record_outcome", planned)?;
            turn.finish("next", Then::Continue(Value::Null))
        }
    }
}

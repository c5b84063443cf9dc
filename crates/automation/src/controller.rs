//! The controller's host effects: what its WASM nodes ask the host for
//! because it needs the store or a trigger source. The nodes decide every
//! transition (`stepwell_automation_core::node`); these effects only do
//! I/O ([`stepwell_automation_core::protocol`]):
//!
//! - `automation.trigger`: a call of the bound trigger source (`prepare`;
//!   `admit` and the `normalize` of its admission) or `manual@1`'s
//!   `normalize` of a run-now, on the persisted cursor; the answer goes
//!   back to the node that asked.
//! - `automation.read_occurrence`: the attempt's run, as the node sees it.
//! - `automation.commit`: the node's decisions and observations, each
//!   written once per key (`automation:<x>:<id>:<discriminator>`): the
//!   records and the changed `_runtime.automation` / `_meta.automation`
//!   are committed in the same atomic commit as the controller's step, so
//!   a crash leaves both or neither; then the node's route, or the wake
//!   wait on `automation:<id>:wake` (with the node's deadline) before it.
//! - `automation.start_occurrence`: creates the dispatched attempt's run
//!   under its deterministic id (create-if-absent, identity-checked) from
//!   the inputs frozen at admission; the controller waits on it.
//!
//! A failure of the host (a trigger that cannot be called, a store error)
//! is an `Err`: the step commits nothing, the controller stays at its
//! node, and the next tick tries again.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};
use stepwell_automation_core::protocol::{
    AdmissionFacts, Admitted, Basis, Commit, Entry, Facts, History, HistoryAsk, ToolFact,
    TriggerAnswer, TriggerCall, COMMIT_EFFECT, COMMON_FIELDS, READ_OCCURRENCE_EFFECT,
    START_OCCURRENCE_EFFECT, TRIGGER_EFFECT,
};

use super::commands::binding_of;
use super::decision::{decide, observe, Transition};
use super::definition::{trigger_failure, trigger_state_of};
use super::envelope::occurrence_vars;
use super::ids::{record_key, wake_wait_key};
use super::occurrence::trigger_wait;
use super::outcome::{occurrence_view, taken_occurrence_id};
use super::time::{format_timestamp, parse_timestamp};
use super::AutomationError;
use crate::triggers::{Envelope, SourceKind, TriggerRegistry, Wait};
use stepwell_runtime::core::config::StartOptions;
use stepwell_runtime::core::model::{RunState, WaitReason, WaitState};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::effects::subworkflow::{child_wait, OnChildFailure};
use stepwell_runtime::effects::{EffectClass, EffectCx, EffectHandler, HostChange, Outcome, Then};
use stepwell_runtime::store::Store;
use stepwell_runtime::wasm::WasmEngine;

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
            .map_err(|e| Error::from(AutomationError::new("trigger_registry_error", None, e)))
    }
}

/// The controller's host effects, sharing `catalog`.
pub fn controller_effects(
    catalog: Arc<TriggerCatalog>,
    tools: Arc<stepwell_tools::ToolCatalog>,
    store: Arc<dyn Store>,
) -> Vec<Arc<dyn EffectHandler>> {
    [
        Kind::Trigger,
        Kind::ReadOccurrence,
        Kind::Commit,
        Kind::StartOccurrence,
    ]
    .into_iter()
    .map(|kind| {
        Arc::new(ControllerEffect {
            kind,
            catalog: catalog.clone(),
            tools: tools.clone(),
            store: store.clone(),
        }) as Arc<dyn EffectHandler>
    })
    .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Trigger,
    ReadOccurrence,
    Commit,
    StartOccurrence,
}

struct ControllerEffect {
    kind: Kind,
    catalog: Arc<TriggerCatalog>,
    tools: Arc<stepwell_tools::ToolCatalog>,
    store: Arc<dyn Store>,
}

fn seam(message: impl Into<String>) -> Error {
    Error::from(AutomationError::new("controller_seam", None, message))
}

/// The object at `<top>.automation` of the controller's vars.
fn part<'a>(run: &'a RunState, top: &str, what: &str) -> Result<&'a Value> {
    run.vars
        .get(top)
        .and_then(|m| m.get("automation"))
        .filter(|d| d.is_object())
        .ok_or_else(|| seam(format!("the controller has no {top}.automation {what}")))
}

fn definition(run: &RunState) -> Result<&Value> {
    part(run, "_meta", "definition")
}

fn state(run: &RunState) -> Result<&Value> {
    part(run, "_runtime", "state")
}

/// The bound source's `prepare` on the persisted cursor of `state`, at
/// `now`.
pub(crate) fn prepare(
    definition: &Value,
    state: &Value,
    now: DateTime<Utc>,
    triggers: &TriggerRegistry,
    events: &[Value],
) -> std::result::Result<Wait, AutomationError> {
    let b = binding_of(definition);
    let source = triggers
        .get(&format!("{}@{}", b.source_id, b.source_version))
        .map_err(trigger_failure)?;
    source
        .prepare(&b, &trigger_state_of(state), &format_timestamp(now), events)
        .map_err(trigger_failure)
}

/// How many inbox records one read takes.
const EVENT_PAGE: usize = 256;

/// The records an event source is handed: those of its connection's stream
/// (`trigger:<config.connection_id>`) after the cursor of `state`
/// (`cursor_seq`), appended after its `since`, oldest first: at least one
/// more than its `max_batch` (so it can tell a full batch from the last
/// one) and at least a page of 256, within [`BATCH_BYTES`], each cut down
/// to what an occurrence may receive ([`slim_event`]). Empty for a source
/// of another kind.
pub(crate) fn source_events(
    store: &dyn Store,
    triggers: &TriggerRegistry,
    definition: &Value,
    state: &Value,
) -> Result<Vec<Value>> {
    let b = binding_of(definition);
    if triggers.kind(&format!("{}@{}", b.source_id, b.source_version)) != Some(SourceKind::Event) {
        return Ok(Vec::new());
    }
    let Some(connection_id) = b.config["connection_id"].as_str() else {
        return Err(seam(
            "an event source's binding has no config.connection_id",
        ));
    };
    let slice = trigger_state_of(state);
    let mut after = slice["cursor_seq"].as_u64().unwrap_or(0);
    let since = slice["since"]
        .as_str()
        .or(b.config["start_at"].as_str())
        .and_then(|t| parse_timestamp(t, "since").ok());
    // More than a batch, so that a source passing events over (a filter)
    // moves past a page of them at once; the byte budget bounds it.
    let want = (b.config["max_batch"].as_u64().unwrap_or(20) as usize + 1).max(EVENT_PAGE);
    let stream = stepwell_runtime::store::connection_stream(connection_id);
    let mut out = Vec::new();
    let mut bytes = 0;
    loop {
        let page = store.events_after(&stream, after, EVENT_PAGE)?;
        let full = page.len() == EVENT_PAGE;
        for mut e in page {
            after = e.seq;
            let fresh = match since {
                None => true,
                Some(since) => {
                    parse_timestamp(&e.appended_at, "appended_at").is_ok_and(|at| at > since)
                }
            };
            if !fresh {
                continue;
            }
            let size = slim_event(&mut e);
            // A batch stays within its byte budget (its first event always
            // goes): the rest waits for the next admission.
            if !out.is_empty() && bytes + size > BATCH_BYTES {
                return Ok(out);
            }
            bytes += size;
            out.push(e.to_source_record());
            if out.len() >= want {
                return Ok(out);
            }
        }
        if !full {
            return Ok(out);
        }
    }
}

/// The most bytes of event payloads (as JSON) one admission carries: an
/// occurrence's inputs hold them a few times over (the events, the named
/// inputs, the framed prompt), and all of it must stay within what the
/// controller's nodes may return.
pub(crate) const BATCH_BYTES: usize = 384 << 10;
/// The most bytes of one event's payload an occurrence receives.
pub(crate) const EVENT_BYTES: usize = 192 << 10;

/// How deep an event's data may nest in an occurrence (its frozen inputs
/// nest it a dozen levels further, within the host's limit of 64).
pub(crate) const EVENT_DEPTH: usize = 24;

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Keeps event `e` within what an occurrence may receive: a `data` field
/// nested deeper than [`EVENT_DEPTH`] is replaced by `{"omitted":
/// "too_deep", "bytes": N, "seq": S}`; then, while the event is over
/// [`EVENT_BYTES`] (as indented JSON, as the prompt's frame holds it), its
/// largest `data` fields, largest first (16 at most), and at last the
/// whole `data`, by `{"omitted": "too_large", ...}` (the whole event stays
/// in its stream: `stepwell connections events`). Returns its size.
fn slim_event(e: &mut stepwell_runtime::store::InboxEvent) -> usize {
    let size = |v: &Value| serde_json::to_string_pretty(v).map_or(0, |t| t.len());
    let seq = e.seq;
    let marker = |why: &str, v: &Value| json!({"omitted": why, "bytes": size(v), "seq": seq});
    match e.payload.get_mut("data") {
        Some(Value::Object(fields)) => {
            for v in fields.values_mut().filter(|v| depth(v) > EVENT_DEPTH) {
                *v = marker("too_deep", v);
            }
        }
        Some(data) if depth(data) > EVENT_DEPTH => *data = marker("too_deep", data),
        _ => {}
    }
    let mut total = size(&e.payload);
    if total <= EVENT_BYTES {
        return total;
    }
    if let Some(Value::Object(fields)) = e.payload.get_mut("data") {
        let mut by_size: Vec<(String, usize)> =
            fields.iter().map(|(k, v)| (k.clone(), size(v))).collect();
        by_size.sort_by_key(|f| std::cmp::Reverse(f.1));
        for (key, _) in by_size.into_iter().take(16) {
            if let Some(v) = fields.get_mut(&key) {
                *v = marker("too_large", v);
            }
            if size(&Value::Object(fields.clone())) + 4096 < EVENT_BYTES {
                break;
            }
        }
        total = size(&e.payload);
    }
    if total > EVENT_BYTES {
        if let Some(data) = e.payload.get_mut("data") {
            *data = marker("too_large", data);
        }
        total = size(&e.payload);
    }
    total
}

fn envelope_json(e: Envelope) -> Value {
    json!({
        "event_id": e.event_id,
        "source_id": e.source_id,
        "source_version": e.source_version,
        "fired_at": e.fired_at,
        "payload": e.payload,
        "binding_id": e.binding_id,
    })
}

/// `answer` with what it was asked on ([`Facts`]).
fn facts(cx: &EffectCx<'_>, answer: Value) -> Result<Value> {
    let basis = Basis::of(
        definition(cx.run)?,
        state(cx.run)?,
        &format_timestamp(cx.now),
    );
    Ok(json!(Facts { basis, answer }))
}

fn object_payload<T: serde::de::DeserializeOwned>(
    kind: &str,
    payload: &Map<String, Value>,
) -> std::result::Result<T, Outcome> {
    serde_json::from_value(Value::Object(payload.clone())).map_err(|e| {
        Outcome::Failed(stepwell_runtime::effects::Failure::permanent(
            "invalid_effect",
            format!("{kind}: the payload is not what the controller sends: {e}"),
        ))
    })
}

impl EffectHandler for ControllerEffect {
    fn kind(&self) -> &str {
        match self.kind {
            Kind::Trigger => TRIGGER_EFFECT,
            Kind::ReadOccurrence => READ_OCCURRENCE_EFFECT,
            Kind::Commit => COMMIT_EFFECT,
            Kind::StartOccurrence => START_OCCURRENCE_EFFECT,
        }
    }

    /// Executed again when a step is replayed: trigger sources and reads
    /// have no effect outside the step, every decision is keyed and
    /// committed with the step, and the occurrence's run is created under
    /// its deterministic id (create-if-absent), so doing it again after a
    /// crash finds what the first try left, or nothing.
    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn owns_host_state(&self) -> bool {
        self.kind == Kind::Commit
    }

    /// A commit's records hold its fields and deltas: the step's own
    /// records keep which records it wrote, and the rest of the payload.
    fn recorded_payload(&self, payload: &Value) -> Option<Value> {
        if self.kind != Kind::Commit {
            return None;
        }
        let mut kept = payload.as_object()?.clone();
        if let Some(Value::Array(entries)) = kept.get_mut("entries") {
            for e in entries.iter_mut().filter_map(Value::as_object_mut) {
                e.retain(|k, _| matches!(k.as_str(), "as" | "name" | "discriminator"));
            }
        }
        Some(Value::Object(kept))
    }

    /// A trigger answer's history (a growing automation's prior turns,
    /// frozen whole in the `automation.admitted` record the same step
    /// writes) is recorded as its report and the number of messages.
    fn recorded_result(&self, result: &Value) -> Option<Value> {
        if self.kind != Kind::Trigger {
            return None;
        }
        let history = result.pointer("/answer/context/history")?;
        let count = history.get("messages")?.as_array()?.len();
        let mut kept = result.clone();
        if let Some(h) = kept
            .pointer_mut("/answer/context/history")
            .and_then(Value::as_object_mut)
        {
            h.insert("messages".into(), json!([]));
            h.insert("messages_not_recorded".into(), json!(count));
        }
        Some(kept)
    }

    fn commits_first(&self) -> bool {
        // The child is created under the controller, which must exist
        // with its resume committed before.
        self.kind == Kind::StartOccurrence
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> Result<Outcome> {
        if cx.run.workflow_id != super::CONTROLLER_WORKFLOW_ID {
            return Ok(Outcome::Failed(
                stepwell_runtime::effects::Failure::permanent(
                    "invalid_effect",
                    format!(
                        "{} belongs to the automation controller ({}), not to workflow {}",
                        self.kind(),
                        super::CONTROLLER_WORKFLOW_ID,
                        cx.run.workflow_id
                    ),
                ),
            ));
        }
        match self.kind {
            Kind::Trigger => {
                let call = match object_payload::<TriggerCall>(self.kind(), payload) {
                    Ok(call) => call,
                    Err(refused) => return Ok(refused),
                };
                let answer = self.trigger(cx, call)?;
                let answer = serde_json::to_value(answer)
                    .map_err(|e| seam(format!("a trigger answer is not JSON: {e}")))?;
                Ok(Outcome::Completed(facts(cx, answer)?))
            }
            Kind::ReadOccurrence => {
                let run_id = payload.get("run_id").and_then(Value::as_str);
                let pending = state(cx.run)?["pending_occurrence"]["run_id"].as_str();
                match run_id {
                    Some(id) if Some(id) == pending => {
                        let child = cx.runs.get_run(id)?;
                        let view = occurrence_view(&cx.run.run_id, &child);
                        Ok(Outcome::Completed(facts(cx, json!(view))?))
                    }
                    _ => Err(seam(format!(
                        "{READ_OCCURRENCE_EFFECT} asked for run {run_id:?}, not for the pending occurrence's run {pending:?}"
                    ))),
                }
            }
            Kind::Commit => {
                let commit = match object_payload::<Commit>(self.kind(), payload) {
                    Ok(commit) => commit,
                    Err(refused) => return Ok(refused),
                };
                commit_decisions(cx, commit)
            }
            Kind::StartOccurrence => start_occurrence(cx, payload),
        }
    }
}

impl ControllerEffect {
    fn trigger(
        &self,
        cx: &EffectCx<'_>,
        call: TriggerCall,
    ) -> std::result::Result<TriggerAnswer, Error> {
        let triggers = self.catalog.registry()?;
        let definition = definition(cx.run)?;
        let state = state(cx.run)?;
        let binding = binding_of(definition);
        let now = format_timestamp(cx.now);
        Ok(match call {
            TriggerCall::Prepare => {
                let events = source_events(self.store.as_ref(), &triggers, definition, state)?;
                TriggerAnswer::Prepare {
                    wait: trigger_wait(prepare(definition, state, cx.now, &triggers, &events)?),
                }
            }
            TriggerCall::Admit { history } => {
                let name = format!("{}@{}", binding.source_id, binding.source_version);
                let source = triggers.get(&name).map_err(trigger_failure)?;
                let events = source_events(self.store.as_ref(), &triggers, definition, state)?;
                let admitted = source
                    .admit(&binding, &trigger_state_of(state), &now, &events)
                    .map_err(trigger_failure)?;
                // An event source's content was written by others.
                let untrusted = triggers.kind(&name) == Some(SourceKind::Event);
                let envelope = match &admitted.admission {
                    None => None,
                    Some(a) => Some(
                        source
                            .normalize(&binding, &a.event_id, &a.fired_at, &a.payload)
                            .map_err(trigger_failure)?,
                    ),
                };
                let context = match envelope {
                    Some(_) => Some(self.admission_facts(cx, history.as_ref())?),
                    None => None,
                };
                TriggerAnswer::Admit {
                    state: admitted.state,
                    admitted: admitted.admission.zip(envelope).map(|(a, e)| Admitted {
                        payload: a.payload,
                        envelope: envelope_json(e),
                        inputs: a.inputs,
                        untrusted,
                    }),
                    context,
                }
            }
            TriggerCall::Manual {
                command_id,
                fired_at,
                history,
            } => {
                let source = triggers.get("manual@1").map_err(trigger_failure)?;
                let envelope = source
                    .normalize(
                        &binding,
                        &format!("manual:{command_id}"),
                        &fired_at,
                        &json!({"command_id": command_id}),
                    )
                    .map_err(trigger_failure)?;
                TriggerAnswer::Manual {
                    envelope: envelope_json(envelope),
                    context: Some(self.admission_facts(cx, history.as_ref())?),
                }
            }
        })
    }

    /// What an admission needs of the host: the tool table (by name and
    /// class; an admission whose tools cannot be loaded fails) and, for a
    /// growing automation,
    /// its history, read strictly: a history that cannot be read fails the
    /// admission (`history_unavailable`), it is never replaced by none.
    fn admission_facts(
        &self,
        cx: &EffectCx<'_>,
        history: Option<&HistoryAsk>,
    ) -> std::result::Result<AdmissionFacts, Error> {
        // A grant over the table (auto, untrusted input, a named policy)
        // cannot be computed without it: that admission fails (and is
        // retried) rather than granting from nothing. An `ask` automation
        // computes no grant and does not need the table.
        let definition = definition(cx.run)?;
        let policy = &definition["policy"];
        let grants = policy["tool_approval"].as_str().unwrap_or("auto") == "auto"
            || policy.get("tool_policy").is_some_and(Value::is_object)
            || definition["untrusted_origin"] == Value::Bool(true);
        let tools = match self.tools.table() {
            Ok(table) => table
                .specs()
                .into_iter()
                .map(|s| ToolFact {
                    name: s.name.clone(),
                    class: s.class.as_str().to_string(),
                })
                .collect(),
            Err(e) if grants => {
                return Err(Error::from(AutomationError::new(
                    "tool_executor_missing",
                    None,
                    format!("the host's tools could not be loaded for the occurrence's grant: {e}"),
                )))
            }
            Err(_) => Vec::new(),
        };
        let history = match history {
            None => None,
            Some(ask) => {
                let replayed = crate::sessions::session_chat_messages(
                    cx.runs,
                    &ask.session_id,
                    &crate::sessions::HistoryOptions {
                        max_tokens: ask.max_tokens,
                        automation_id: ask.automation_id.clone(),
                        strict: true,
                        ..Default::default()
                    },
                )?;
                Some(History {
                    messages: replayed.messages,
                    report: replayed.report.to_json(),
                })
            }
        };
        Ok(AdmissionFacts { tools, history })
    }
}

/// The records each node may write: `(name, as a decision)`.
fn allowed(node: &str) -> &'static [(&'static str, bool)] {
    match node {
        "admit" => &[
            ("automation.admitted", true),
            ("automation.coalesced", false),
            ("automation.completed", true),
            ("automation.passed_over", true),
        ],
        "dispatch" => &[("automation.dispatched", true)],
        "record_outcome" => &[
            ("automation.completed", true),
            ("automation.retry_scheduled", true),
        ],
        _ => &[],
    }
}

fn refuse(message: String) -> Outcome {
    Outcome::Failed(stepwell_runtime::effects::Failure::permanent(
        "invalid_effect",
        format!("{COMMIT_EFFECT}: {message}"),
    ))
}

/// Writes `commit`'s records on the controller, applies the decisions'
/// deltas, and answers the step's change: the new state and definition and
/// the records; then the node's route, or the wake wait
/// (`automation:<id>:wake`, until the deadline the node chose) before it.
///
/// The host checks what it writes: each node writes only its own records
/// (`admit`: admitted, coalesced, a cancelled completion, events an event
/// source passed over; `dispatch`:
/// dispatched; `record_outcome`: completed, retry_scheduled), a delta
/// changes only state keys (never the definition), fields never set a
/// record's common keys, only `wait` parks or notes an exhausted source,
/// and a decision's key is new (one already written with a state that
/// does not show it means the node would loop).
fn commit_decisions(cx: &EffectCx<'_>, commit: Commit) -> Result<Outcome> {
    let mut run = cx.run.clone();
    let node = run.current_node.clone().unwrap_or_default();
    let at = match &commit.at {
        None => format_timestamp(cx.now),
        Some(t) => match parse_timestamp(t, "at") {
            Ok(t) if t <= cx.now => format_timestamp(t),
            _ => return Ok(refuse(format!("at {t:?} is not a time up to now"))),
        },
    };
    let mut records = Vec::new();
    for entry in commit.entries {
        let (name, discriminator, fields, delta) = match entry {
            Entry::Decision(p) => (p.name, p.discriminator, p.fields, Some(p.delta)),
            Entry::Observation(o) => (o.name, o.discriminator, o.fields, None),
        };
        if !allowed(&node).contains(&(name.as_str(), delta.is_some())) {
            let what = if delta.is_some() {
                "decision"
            } else {
                "observation"
            };
            return Ok(refuse(format!(
                "node {node:?} may not write the {what} {name:?}"
            )));
        }
        if let Some(k) = COMMON_FIELDS.iter().find(|k| fields.contains_key(**k)) {
            return Ok(refuse(format!(
                "{name}: the field {k:?} is the host's to set"
            )));
        }
        if let Some(delta) = &delta {
            let only_state = delta
                .as_object()
                .is_some_and(|d| d.len() == 1 && d.get("state").is_some_and(Value::is_object));
            if !only_state {
                return Ok(refuse(format!(
                    "{name}: a delta must be {{\"state\": {{...}}}} (the controller never changes the definition)"
                )));
            }
        }
        let key = record_key(&name, &run.run_id, &discriminator);
        let ledger = cx.runs.find_records(&run.run_id, &key)?;
        if delta.is_some() && !ledger.is_empty() {
            return Err(seam(format!(
                "{key} was decided before, but the controller's state does not show it"
            )));
        }
        let t = Transition {
            name: &name,
            discriminator: &discriminator,
            fields,
            node_id: &node,
            command_id: None,
            at: &at,
        };
        let written = match delta {
            Some(delta) => decide(&mut run, &ledger, &t, delta)?,
            None => observe(&run, &ledger, &t)?,
        };
        records.extend(written.record);
    }
    let mut state = state(&run)?.clone();
    let definition = definition(&run)?.clone();
    if (commit.note_exhausted || commit.park.is_some()) && node != "wait" {
        return Ok(refuse(format!(
            "node {node:?} may not park or note an exhausted source"
        )));
    }
    if commit.note_exhausted {
        let idle = state["pending_occurrence"].is_null()
            && state["manual_pending"].is_null()
            && definition["archived_at"].is_null();
        if !idle {
            return Ok(refuse(
                "a source is noted exhausted only when nothing is pending and the automation is not archived".into(),
            ));
        }
        state["exhausted"] = json!(true);
    }
    // `active_revision` is derived from the definition on every save.
    state["active_revision"] = definition["revision"].clone();
    let then = match commit.park {
        None => Then::Continue(Value::Null),
        Some(park) => {
            let until = match park.until.as_deref().map(|u| parse_timestamp(u, "until")) {
                None => None,
                Some(Ok(t)) => Some(format_timestamp(t)),
                Some(Err(e)) => return Ok(refuse(format!("park: {e}"))),
            };
            Then::Wait(Box::new(WaitState {
                reason: WaitReason::Event,
                wait_key: wake_wait_key(&run.run_id),
                until,
                resume_to_node: None,
                result_key: None,
                prompt: None,
                choices: None,
                details: None,
            }))
        }
    };
    Ok(Outcome::HostChange(Box::new(HostChange {
        assign: vec![
            ("_runtime.automation".into(), state),
            ("_meta.automation".into(), definition),
        ],
        records,
        route: None,
        then,
    })))
}

/// A start of the attempt's run `child_id` refused with `conflict`: when
/// the run under that id is not the controller's own child (another run
/// took the id), the controller does not wait on it and goes on to read the
/// attempt, which it sees failed ([`occurrence_view`]); any other conflict
/// stays an error of the host.
fn taken_start(cx: &EffectCx<'_>, child_id: &str, conflict: Error) -> Result<Outcome> {
    let existing = cx.runs.get_run(child_id)?;
    match taken_occurrence_id(&cx.run.run_id, &existing) {
        Some(error) => Ok(Outcome::Completed(json!({
            "sub_run_id": child_id,
            "status": "failed",
            "error": error,
            "taken": true,
        }))),
        None => Err(conflict),
    }
}

/// The trace a caller of the occurrence's trigger asked to continue: the
/// W3C `traceparent` header of the first of its webhook calls that sent
/// one (a call the host verified and recorded, `data.webhook_id`). The
/// occurrence's spans then join the caller's trace.
fn callers_trace(envelope: &Value) -> Option<stepwell_runtime::core::trace::SpanContext> {
    envelope["payload"]["events"]
        .as_array()?
        .iter()
        .filter(|e| e["data"]["webhook_id"].is_string())
        .filter_map(|e| e["data"]["headers"]["traceparent"].as_str())
        .find_map(stepwell_runtime::core::trace::SpanContext::from_traceparent)
}

/// Creates the dispatched attempt's run under its deterministic id (if
/// absent) from the inputs frozen at admission, and waits for it; an id
/// another run took is not waited on ([`taken_start`]).
fn start_occurrence(cx: &EffectCx<'_>, payload: &Map<String, Value>) -> Result<Outcome> {
    let id = cx.run.run_id.clone();
    let pending = state(cx.run)?
        .get("pending_occurrence")
        .filter(|p| p.is_object())
        .ok_or_else(|| seam("no occurrence is pending here"))?;
    if pending["phase"] != "dispatched" {
        return Err(seam("the pending occurrence is not dispatched yet"));
    }
    let child_id = pending["run_id"].as_str().unwrap_or_default().to_string();
    if payload.get("run_id").and_then(Value::as_str) != Some(child_id.as_str()) {
        return Err(seam(format!(
            "{START_OCCURRENCE_EFFECT} asked for run {:?}, not for the dispatched attempt's run {child_id}",
            payload.get("run_id")
        )));
    }
    let prepared = &pending["prepared"];
    let workflow_id = prepared["workflow_id"].as_str().unwrap_or_default();
    let Value::Object(mut vars) = occurrence_vars(&id, pending) else {
        return Err(seam("the occurrence's vars are not an object"));
    };
    // The frozen `_runtime` inputs (context receipt, tool grant,
    // recipients) are the host's to set: they seed the child's `_runtime`.
    let mut runtime = match vars.remove("_runtime") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    // The frozen workspace scope is the host's: an occurrence freezes its
    // own from its vars, whatever the target's inputs claimed to inherit.
    runtime.remove("workspace");
    runtime.insert(stepwell_runtime::core::keys::LINEAGE.into(), json!(1));
    runtime.insert(
        stepwell_runtime::core::keys::CASCADE_DEPTH.into(),
        json!(cx.depth + 1),
    );
    let options = StartOptions {
        vars,
        run_id: Some(child_id.clone()),
        actor_id: cx.run.actor_id.clone(),
        session_id: prepared["session_id"].as_str().map(str::to_string),
        parent_run_id: Some(id.clone()),
        runtime,
        // A target pinned to a version; else the latest at this moment.
        workflow_version: prepared["workflow_version"]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok()),
        trace_parent: cx
            .tracer
            .is_on()
            .then(|| callers_trace(&pending["envelope"]))
            .flatten(),
        ..StartOptions::default()
    };
    let started = match cx.runs.start_run(workflow_id, options) {
        Ok(started) => started,
        Err(e @ Error::IdentityConflict { .. }) => return taken_start(cx, &child_id, e),
        Err(e) => return Err(e),
    };
    if started != child_id {
        return Err(seam(format!(
            "the occurrence run was created as {started}, not under its id {child_id}"
        )));
    }
    // The controller waits on the attempt's run even if it has ended
    // already (a start replayed after a crash, whose run went on): the
    // driver resumes a parent whose child ended, so a replay writes the
    // same records as a first try.
    let wait = child_wait(&child_id, workflow_id, true, OnChildFailure::Data);
    Ok(Outcome::Waiting(Box::new(wait)))
}

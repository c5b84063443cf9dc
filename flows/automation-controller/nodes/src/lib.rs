//! The nodes of the automation controller
//! (`abstractframework.automation-controller@1.0.0:controller`): the
//! deciders. Each node reads the controller's vars (`host_vars: true` in
//! the flow: the definition in `_meta.automation`, the state in
//! `_runtime.automation`), the step's `now` and the answer of the host
//! effect it asked for on its previous visit, and decides
//! (`stepwell_automation_core::node`):
//!
//! - `start` goes on to `read_definition`.
//! - `read_definition` ends the controller when nothing is pending and the
//!   automation is archived or its trigger exhausted; else `continue`.
//! - `wait` goes on to `admit`, parks on the wake wait (on
//!   `automation:<id>:wake`, until the next due time), or ends; it asks the
//!   trigger source's `prepare` when the state alone does not say.
//! - `admit` admits an occurrence (a queued run-now, or what the trigger's
//!   `admit` finds due), cancels one stopped before its dispatch, or goes
//!   back to its backoff or its dispatch.
//! - `prepare_context` checks that an occurrence is pending.
//! - `dispatch` records the attempt's dispatch, then asks the host to start
//!   its run and waits for it.
//! - `record_outcome` reads the ended run and records what it means.
//! - `next` drops the dispatch's answer and loops back.
//!
//! What needs the store or a trigger source is a host effect
//! (`automation.trigger`, `automation.read_occurrence`, `automation.commit`,
//! `automation.start_occurrence`; `stepwell_automation_core::protocol`).
use serde_json::{Map, Value};
use stepwell_automation_core::node::{Controller, Step};
use stepwell_automation_core::protocol::{
    COMMIT_EFFECT, DISPATCH_KEY, FACTS_KEY, READ_OCCURRENCE_EFFECT, START_OCCURRENCE_EFFECT,
    TRIGGER_EFFECT,
};
use stepwell_automation_core::AutomationError;
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

fn part<'a>(input: &'a Input, path: &str, what: &str) -> Result<&'a Value, NodeError> {
    input
        .var_path(path)
        .filter(|v| v.is_object())
        .ok_or_else(|| NodeError::invalid(format!("the controller has no {path} {what}")))
}

fn failed(e: AutomationError) -> NodeError {
    NodeError::failed(e.to_string())
}

/// The `_temp` var without `key` (the last part of `_temp.<key>`), or
/// `None` when it has no such key.
fn temp_without(input: &Input, path: &str) -> Option<Value> {
    let key = path.strip_prefix("_temp.")?;
    let mut temp: Map<String, Value> = input.vars.get("_temp")?.as_object()?.clone();
    temp.remove(key)?;
    Some(if temp.is_empty() {
        Value::Null
    } else {
        Value::Object(temp)
    })
}

/// The plan of `step`: a question to the host comes back to this node
/// (route `again`) with its answer in `_automation_facts`; every other step
/// drops that answer.
fn plan(input: &Input, step: Step) -> Plan {
    let ask = |kind: &str, payload: Value| {
        Plan::goto("again").with_effect(Effect::new(kind, payload).result_key(FACTS_KEY))
    };
    let plan = match step {
        Step::AskTrigger(call) => {
            let payload = serde_json::to_value(call).unwrap_or(Value::Null);
            return ask(TRIGGER_EFFECT, payload);
        }
        Step::ReadOccurrence(run_id) => {
            return ask(
                READ_OCCURRENCE_EFFECT,
                serde_json::json!({"run_id": run_id}),
            );
        }
        Step::Route(route) => Plan::goto(route),
        Step::Commit(commit, route) => {
            let payload = serde_json::to_value(commit).unwrap_or(Value::Null);
            Plan::goto(route).with_effect(Effect::new(COMMIT_EFFECT, payload))
        }
        Step::StartOccurrence(run_id) => Plan::goto("record_outcome").with_effect(
            Effect::new(
                START_OCCURRENCE_EFFECT,
                serde_json::json!({"run_id": run_id}),
            )
            .result_key(DISPATCH_KEY),
        ),
    };
    if input.vars.contains_key(FACTS_KEY) {
        plan.set(FACTS_KEY, Value::Null)
    } else {
        plan
    }
}

fn nodes(input: Input) -> Result<Plan, NodeError> {
    let node = input.node_id.as_str();
    match node {
        "start" => return Ok(Plan::goto("read_definition")),
        "next" => {
            // The dispatch's answer is read; the loop starts again.
            let plan = Plan::goto("read_definition");
            return Ok(match temp_without(&input, DISPATCH_KEY) {
                Some(temp) => plan.set("_temp", temp),
                None => plan,
            });
        }
        _ => {}
    }
    let controller = Controller {
        id: &input.run_id,
        definition: part(&input, "_meta.automation", "definition")?,
        state: part(&input, "_runtime.automation", "state")?,
        owner: input
            .var_path("_meta.automation_owner")
            .and_then(Value::as_str),
        now: i64::try_from(input.now.seconds)
            .ok()
            .and_then(|s| chrono::DateTime::from_timestamp(s, input.now.nanoseconds))
            .ok_or_else(|| NodeError::invalid(format!("now {} is out of range", input.now)))?,
        facts: input.var_path(FACTS_KEY),
        dispatch: input.var_path(DISPATCH_KEY),
    };
    let step = match node {
        "read_definition" => controller.read_definition(),
        "wait" => controller.wait(),
        "admit" => controller.admit().map_err(failed)?,
        "prepare_context" => controller.prepare_context().map_err(failed)?,
        "dispatch" => controller.dispatch().map_err(failed)?,
        "record_outcome" => controller.record_outcome().map_err(failed)?,
        other => {
            return Err(NodeError::invalid(format!(
                "the automation controller has no node {other:?}"
            )))
        }
    };
    Ok(plan(&input, step))
}

export_node!(nodes);

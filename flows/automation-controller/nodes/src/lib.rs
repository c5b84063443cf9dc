//! The nodes of the automation controller
//! (`abstractframework.automation-controller@1.0.0:controller`).
//!
//! Each node decides from the controller's own vars what it can decide
//! alone, and asks the host for what needs the store or the trigger
//! source (one `automation.<node>` effect, whose answer picks the route):
//!
//! - `start` goes on to `read_definition`.
//! - `read_definition` ends the controller when nothing is pending and the
//!   automation is archived or its trigger exhausted; else goes on to `wait`.
//! - `wait`, `admit`, `dispatch` and `record_outcome` ask the host
//!   (`automation.wait`, `automation.admit`, `automation.dispatch`,
//!   `automation.record_outcome`): the trigger's answers, the decision
//!   records and the occurrence's child run live in the store.
//! - `prepare_context` checks that an occurrence is pending (its inputs were
//!   frozen at admission) and goes on to `dispatch`.
//! - `next` drops the dispatch answer and loops back to `read_definition`.
//!
//! The nodes see the host's vars (`host_vars: true` in the flow): the
//! definition in `_meta.automation`, the state in `_runtime.automation`.
use serde_json::{Map, Value};
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

fn set(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

fn state(input: &Input) -> Result<&Map<String, Value>, NodeError> {
    input
        .var_path("_runtime.automation")
        .and_then(Value::as_object)
        .ok_or_else(|| NodeError::invalid("the controller has no _runtime.automation state"))
}

fn definition(input: &Input) -> Result<&Map<String, Value>, NodeError> {
    input
        .var_path("_meta.automation")
        .and_then(Value::as_object)
        .ok_or_else(|| NodeError::invalid("the controller has no _meta.automation definition"))
}

fn host(kind: &str) -> Effect {
    Effect::new(kind, Value::Object(Map::new()))
}

fn nodes(input: Input) -> Result<Plan, NodeError> {
    match input.node_id.as_str() {
        "start" => Ok(Plan::goto("read_definition")),
        "read_definition" => {
            let state = state(&input)?;
            let definition = definition(&input)?;
            let pending = set(state.get("pending_occurrence"));
            let over = set(definition.get("archived_at")) || set(state.get("exhausted"));
            Ok(Plan::goto(if !pending && over {
                "end"
            } else {
                "continue"
            }))
        }
        "wait" => Ok(Plan::goto("go").with_effect(host("automation.wait"))),
        "admit" => Ok(Plan::goto("prepare").with_effect(host("automation.admit"))),
        "prepare_context" => {
            if !set(state(&input)?.get("pending_occurrence")) {
                return Err(NodeError::failed(
                    "prepare_context: no occurrence is pending (admit routes here only after admitting one)",
                ));
            }
            Ok(Plan::goto("dispatch"))
        }
        "dispatch" => Ok(Plan::follow()
            .with_effect(host("automation.dispatch").result_key("_temp.automation_dispatch"))),
        "record_outcome" => Ok(Plan::goto("next").with_effect(host("automation.record_outcome"))),
        "next" => {
            let mut temp = input
                .vars
                .get("_temp")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            temp.remove("automation_dispatch");
            let temp = if temp.is_empty() {
                Value::Null
            } else {
                Value::Object(temp)
            };
            Ok(Plan::goto("read_definition").set("_temp", temp))
        }
        other => Err(NodeError::invalid(format!(
            "the automation controller has no node {other:?}"
        ))),
    }
}

export_node!(nodes);

//! One link of a chain: counts the step in `vars.i` and follows the node's
//! `next` route; a node whose config says `{"last": true}` completes the run.
//! The same node is written in C, JavaScript and Python beside it
//! (`step-c/`, `step-js/`, `step-py/`): `stepwell bench` runs a chain of each.
use serde_json::json;
use stepwell_guest::{describe_node, export_node, Input, NodeError, Plan};

describe_node!(
    r#"{
    "description": "One link of a chain: counts itself in vars.i.",
    "vars": {"i": "the steps taken so far (a number, default 0)"},
    "config": {"last": "true on the chain's last node: complete the run"}
}"#
);

fn step(input: Input) -> Result<Plan, NodeError> {
    let i = input.vars.get("i").and_then(|v| v.as_u64()).unwrap_or(0) + 1;
    let last = input
        .config_field("last")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    if last {
        Ok(Plan::complete(json!({ "steps": i })))
    } else {
        Ok(Plan::follow().set("i", json!(i)))
    }
}

export_node!(step);

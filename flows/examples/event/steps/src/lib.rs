//! The `event` example: reports what the waiting run received.
use serde_json::json;
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn received(input: Input) -> Result<Plan, NodeError> {
    let event = input.vars.get("event").cloned().unwrap_or_default();
    Ok(Plan::complete(json!({ "received": event })))
}

export_node!(received);

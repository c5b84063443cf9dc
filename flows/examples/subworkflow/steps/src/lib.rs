//! The `subworkflow` example's child node: shouts `vars.text`.
use serde_json::json;
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn shout(input: Input) -> Result<Plan, NodeError> {
    let text = input
        .var_str("text")
        .ok_or_else(|| NodeError::invalid("vars.text (a string) is required"))?;
    Ok(Plan::complete(json!({ "shouted": text.to_uppercase() })))
}

export_node!(shout);

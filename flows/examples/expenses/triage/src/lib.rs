//! The `expenses` example's node (docs/nodes-rust.md):
//! pays an amount up to the configured limit at once, asks a person above it.
use serde_json::json;
use stepwell_guest::{describe_node, export_node, Effect, Input, NodeError, Plan};

describe_node!(
    r#"{
    "description": "Pays an amount up to config.limit at once, asks a person above it.",
    "vars": {"amount": "the amount to pay, a number (required)"},
    "config": {"limit": "the most paid without asking, a number (default 100)"},
    "routes": ["approved", "review"]
}"#
);

fn triage(input: Input) -> Result<Plan, NodeError> {
    let amount = input
        .vars
        .get("amount")
        .and_then(|v| v.as_f64())
        .ok_or_else(|| NodeError::invalid("vars.amount (a number) is required"))?;
    let limit = input
        .config_field("limit")
        .and_then(|v| v.as_f64())
        .unwrap_or(100.0);
    if amount <= limit {
        return Ok(Plan::goto("approved").set("checked_at", json!(input.now.to_rfc3339())));
    }
    Ok(Plan::goto("review")
        .with_effect(Effect::ask_user(format!("Approve {amount}?")).result_key("approval")))
}

export_node!(triage);

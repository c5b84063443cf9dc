//! The `ask-user` example's second node: greets the name the person answered.
use serde_json::json;
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn greet(input: Input) -> Result<Plan, NodeError> {
    let name = input
        .var_path("user_input.text")
        .and_then(|v| v.as_str())
        .unwrap_or("Unknown");
    Ok(Plan::complete(
        json!({ "greeting": format!("Hello, {name}!") }),
    ))
}

export_node!(greet);

//! The `hello` example's only node: greets `vars.name`.
use serde_json::json;
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn greet(input: Input) -> Result<Plan, NodeError> {
    let name = input.var_str("name").unwrap_or("World");
    Ok(Plan::complete(
        json!({ "message": format!("Hello, {name}!") }),
    ))
}

export_node!(greet);

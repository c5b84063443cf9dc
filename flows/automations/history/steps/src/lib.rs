//! `history`: an automation target that answers at once with
//! `{"response": "echo:" + prompt + " | history=" + N, "success": true}`,
//! where N is the number of messages in `vars.context.messages` (the
//! history a growing automation or a discussion hands it; 0 without one).
use serde_json::{json, Value};
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn answer(input: Input) -> Result<Plan, NodeError> {
    let prompt = input.var_str("prompt").unwrap_or_default();
    let history = input
        .vars
        .get("context")
        .and_then(|c| c.get("messages"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    Ok(Plan::complete(json!({
        "response": format!("echo:{prompt} | history={history}"),
        "success": true,
    })))
}

export_node!(answer);

//! `echo`: an automation target that answers at once with
//! `{"response": "echo:" + prompt, "success": true}`, passing the input
//! `notify` (when set) on in its output, where the automation reads it.
use serde_json::json;
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn echo(input: Input) -> Result<Plan, NodeError> {
    let prompt = input.var_str("prompt").unwrap_or_default();
    let mut out = json!({"response": format!("echo:{prompt}"), "success": true});
    if let Some(notify) = input.vars.get("notify") {
        out["notify"] = notify.clone();
    }
    Ok(Plan::complete(out))
}

export_node!(echo);

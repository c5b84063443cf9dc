//! `flaky`: an automation target that fails while its attempt
//! (`_meta.occurrence.attempt`, 1 when not run by an automation) is below
//! the input `fail_until` (`{"success": false, "error": "boom on attempt
//! <n>"}`), then answers like `echo`.
use serde_json::{json, Value};
use stepwell_guest::{export_node, Input, NodeError, Plan};

fn flaky(input: Input) -> Result<Plan, NodeError> {
    let attempt = input
        .var_path("_meta.occurrence.attempt")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let fail_until = match input.vars.get("fail_until") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| NodeError::invalid("vars.fail_until must be a whole number"))?,
    };
    if attempt < fail_until {
        return Ok(Plan::complete(
            json!({"success": false, "error": format!("boom on attempt {attempt}")}),
        ));
    }
    let prompt = input.var_str("prompt").unwrap_or_default();
    let mut out = json!({"response": format!("echo:{prompt}"), "success": true});
    if let Some(notify) = input.vars.get("notify") {
        out["notify"] = notify.clone();
    }
    Ok(Plan::complete(out))
}

export_node!(flaky);

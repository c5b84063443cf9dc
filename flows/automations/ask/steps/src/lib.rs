//! `ask`: an automation target that asks a person (`ask_user` with the
//! input `prompt`, default "Proceed?", and the input `choices`, default
//! yes / no) and completes with `{"response": <their answer>, "success":
//! true}`.
use serde_json::{json, Value};
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

fn ask(input: Input) -> Result<Plan, NodeError> {
    match input.node_id.as_str() {
        "ask" => {
            let prompt = input.var_str("prompt").unwrap_or("Proceed?").to_string();
            let choices = input
                .vars
                .get("choices")
                .filter(|c| c.is_array())
                .cloned()
                .unwrap_or(json!(["yes", "no"]));
            Ok(Plan::follow().with_effect(
                Effect::new("ask_user", json!({"prompt": prompt, "choices": choices}))
                    .result_key("answer"),
            ))
        }
        "done" => {
            let answer = match input.var_path("answer") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Object(m)) => ["response", "text", "answer"]
                    .iter()
                    .find_map(|k| m.get(*k).and_then(Value::as_str))
                    .unwrap_or_default()
                    .to_string(),
                _ => String::new(),
            };
            Ok(Plan::complete(json!({"response": answer, "success": true})))
        }
        other => Err(NodeError::invalid(format!("ask has no node {other:?}"))),
    }
}

export_node!(ask);

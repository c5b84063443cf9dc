//! A Rust node for the contract's behaviours: what it does is chosen by
//! `vars.mode` (tests/cli.rs runs each and checks the host's typed
//! outcome), as `flows/examples/contract-js` does in JavaScript.
use serde_json::{json, Value};
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

fn act(input: Input) -> Result<Plan, NodeError> {
    let value = input.vars.get("value").cloned();
    match input.var_str("mode").unwrap_or_default() {
        "complete" => Ok(Plan::complete(json!({
            "echo": value.unwrap_or(Value::Null),
            "node": input.node_id,
            "attempt": input.attempt,
            "now": input.now.to_rfc3339(),
        }))),
        "next" => Ok(Plan::goto("end").set("seen", value.unwrap_or(json!(true)))),
        "follow" => Ok(Plan::follow().set("seen", json!("followed"))),
        "ask" => {
            Ok(Plan::follow().with_effect(Effect::ask_user("Your name?").result_key("answer")))
        }
        "wait" => Ok(Plan::follow().with_effect(Effect::new("wait_until", json!({"seconds": 60})))),
        "invalid" => Err(NodeError::invalid("mode invalid: asked to refuse")),
        "throw" => Err(NodeError::failed("boom")),
        "trap" => panic!("a trap, as asked"),
        "spin" => spin(),
        "oom" => {
            let mut held: Vec<Vec<u8>> = Vec::new();
            loop {
                held.push(vec![1; 16 << 20]);
            }
        }
        "bad" => Ok(Plan::follow().set("_runtime", json!({}))),
        other => Err(NodeError::invalid(format!("unknown mode {other:?}"))),
    }
}

/// Runs until the host's time limit stops it.
fn spin() -> ! {
    let mut i: u64 = 0;
    loop {
        i = std::hint::black_box(i.wrapping_add(1));
    }
}

export_node!(act);

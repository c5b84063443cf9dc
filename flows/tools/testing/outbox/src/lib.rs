//! Test tools of the `comms` class: `send_message` and
//! `send_telegram_message` "send" a message to a recipient the model
//! chooses. It cannot reach a network (no tool can); it
//! answers what it would have sent, so a test sees whether the call ran.
//! Automation grants never pre-approve a tool of this class (docs/automations.md,
//! "Tool approval"): its calls wait for a person.
use serde_json::{json, Value};
use stepwell_guest::export_toolbox;
use stepwell_guest::tool::*;

struct Outbox;

impl Toolbox for Outbox {
    fn describe() -> Vec<ToolSpec> {
        let args = json!({
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "The recipient."},
                "body": {"type": "string", "description": "The message."}
            },
            "required": ["to", "body"]
        });
        vec![
            ToolSpec::new(
                "send_message",
                "Test-only: sends a message to a recipient (answers what it would send).",
                EffectClass::Comms,
                args.clone(),
            ),
            // A name the default approval list trusts: only a run policy
            // that withholds it makes it ask.
            ToolSpec::new(
                "send_telegram_message",
                "Test-only: sends a chat message (answers what it would send).",
                EffectClass::Comms,
                args,
            ),
        ]
    }

    fn invoke(call: ToolCall) -> Result<Value, ToolError> {
        match call.name.as_str() {
            "send_message" | "send_telegram_message" => {
                Ok(json!({"success": true, "sent": Value::Object(call.arguments)}))
            }
            other => Err(ToolError::invalid(format!("unknown tool {other}"))),
        }
    }
}

export_toolbox!(Outbox);

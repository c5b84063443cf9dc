//! `webhook.received@1`: runs an automation when an external system calls
//! its connection's signed endpoint (`POST /v1/hooks/<connection_id>` of
//! `stepwell serve`). The host verifies each call (Standard Webhooks) and
//! appends it to the connection's stream; this source admits the new calls
//! as one batch (`stepwell_guest::trigger::connection`). Each event's
//! `data` is `{webhook_id, content_type, body | body_text, headers}`,
//! written by the caller: untrusted.
//!
//! Named occurrence input `calls`: each `{id, received_at, headers, body}`
//! (`body`: the parsed JSON, or the text of a non-JSON body).
use serde_json::{json, Value};

/// The `calls` input of an admission's payload.
fn calls(payload: &Value) -> Option<Value> {
    let events = payload["events"].as_array()?;
    let calls: Vec<Value> = events
        .iter()
        .filter(|e| e.is_object())
        .map(|e| {
            let data = &e["data"];
            if data.get("webhook_id").is_some() {
                json!({
                    "id": data["webhook_id"],
                    "received_at": e["time"],
                    "headers": data.get("headers").cloned().unwrap_or_else(|| json!({})),
                    "body": data.get("body").or_else(|| data.get("body_text")).cloned().unwrap_or(Value::Null),
                })
            } else {
                // A test event (`stepwell connections send`).
                json!({"id": e["subject"], "received_at": e["time"], "headers": {}, "body": data})
            }
        })
        .collect();
    Some(json!({ "calls": calls }))
}

stepwell_guest::export_connection_source!("webhook.received", 1, "When a webhook is called", calls);

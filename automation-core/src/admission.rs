//! An admitted occurrence: its envelope and its frozen inputs.

use serde_json::{json, Map, Value};

use crate::envelope::{
    ensure_cloudevent_attributes, occurrence_origin, prompt_header, to_cloudevent,
};
use crate::time::respell;
use crate::{into_map, set, AutomationError};

/// The strings of a list (anything else in it, or a value that is not a
/// list, gives nothing).
fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A source's normalized envelope `{event_id, source_id, source_version,
/// fired_at, payload, binding_id}` as an occurrence keeps it: `fired_at`
/// in the automation layer's spelling, with its CloudEvents attributes
/// (every source is trusted; a plugin cannot say otherwise yet).
pub fn admitted_envelope(raw: &Value) -> Value {
    let mut m = into_map(json!({
        "event_id": raw["event_id"],
        "source_id": raw["source_id"],
        "source_version": raw["source_version"],
        "fired_at": raw["fired_at"].as_str().map_or(Value::Null, |t| json!(respell(t))),
        "payload": raw["payload"],
        "binding_id": raw["binding_id"],
    }));
    ensure_cloudevent_attributes(&mut m, "trusted");
    Value::Object(m)
}

/// The occurrence's frozen inputs (the reference's `build_prepared`, for
/// the independent context mode): the target's inputs with the prompt
/// header, the tool grant, the context receipt, the pre-authorised
/// recipients, the title and origin, the event in CloudEvents form and the
/// source's named inputs; the session is the attempt-1 run id.
pub fn build_prepared(
    automation_id: &str,
    definition: &Value,
    owner: Option<&str>,
    index: u64,
    envelope: &Value,
    first_run_id: &str,
) -> Result<Value, AutomationError> {
    let source_id = envelope["source_id"].as_str().unwrap_or_default();
    let source_version = envelope["source_version"].as_i64().unwrap_or(0);
    let fired_at = envelope["fired_at"].as_str().unwrap_or_default();
    let mut input = definition["target"]
        .get("input_data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(Value::String(prompt)) = input.get("prompt") {
        let header = prompt_header(source_id, source_version, index, fired_at);
        input.insert("prompt".into(), json!(format!("{header}{prompt}")));
    }
    let policy = &definition["policy"];
    let untrusted = set(definition.get("untrusted_origin"));
    let approval = policy["tool_approval"].as_str().unwrap_or("auto");
    let mut runtime = input
        .get("_runtime")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if approval == "auto" || untrusted {
        grant_tools(&mut input, &mut runtime, policy, untrusted, approval);
    }
    let mode = definition["context"]["mode"]
        .as_str()
        .unwrap_or("independent");
    if mode != "independent" {
        return Err(AutomationError::unsupported(
            "context.mode",
            format!("context mode {mode:?} is not supported yet (only \"independent\")"),
        ));
    }
    let target_use_context = ["use_context", "include_context"]
        .iter()
        .find_map(|k| input.get(*k).cloned())
        .unwrap_or(Value::Null);
    input.insert("use_context".into(), json!(false));
    if input.contains_key("include_context") {
        input.insert("include_context".into(), json!(false));
    }
    runtime.insert(
        "automation_context".into(),
        json!({"mode": mode, "use_context": false, "target_use_context": target_use_context}),
    );
    runtime.insert(
        "email_allowed_recipients".into(),
        policy
            .get("email_allowed_recipients")
            .cloned()
            .unwrap_or(json!(["self"])),
    );
    input.insert("_runtime".into(), Value::Object(runtime));
    let mut meta = input
        .get("_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.insert("automation_title".into(), definition["title"].clone());
    meta.insert(
        "origin".into(),
        occurrence_origin(
            source_id == "manual",
            owner,
            automation_id,
            envelope["event_id"].as_str().unwrap_or_default(),
            &format!("{source_id}@{source_version}"),
            index,
        ),
    );
    input.insert("_meta".into(), Value::Object(meta));
    input.insert("event".into(), to_cloudevent(envelope));
    if source_id == "schedule" {
        input.insert(
            "scheduled_at".into(),
            envelope["payload"]
                .get("scheduled_at")
                .cloned()
                .unwrap_or(Value::Null),
        );
        input.insert("occurrence".into(), json!(index));
    }
    Ok(json!({
        "workflow_id": definition["target"]["workflow_id"],
        "session_id": first_run_id,
        "workspace_root": definition["workspace_root"],
        "input_data": input,
    }))
}

/// The tool grant of an occurrence (`_runtime.tool_policy`). The
/// candidates are the target's `_runtime.allowed_tools` when it lists
/// them, else every tool of stepwell's tool table (none yet: tools come
/// with the LLM and tools work); no tool of stepwell sends messages, so
/// none is withheld. A trusted source under `auto` keeps a policy the
/// target set itself.
fn grant_tools(
    input: &mut Map<String, Value>,
    runtime: &mut Map<String, Value>,
    policy: &Value,
    untrusted: bool,
    approval: &str,
) {
    if !untrusted && runtime.contains_key("tool_policy") {
        return;
    }
    let mut candidates = strings(runtime.get("allowed_tools"));
    candidates.sort();
    candidates.dedup();
    if !untrusted {
        runtime.insert(
            "tool_policy".into(),
            json!({"auto_approve_tools": candidates, "withheld_tools": [],
                   "source": "automation-policy"}),
        );
        return;
    }
    let named = strings(policy.get("untrusted_input_tools"));
    let candidates: Vec<String> = candidates
        .into_iter()
        .filter(|t| !t.starts_with("mcp::"))
        .collect();
    let auto: Vec<&String> = candidates.iter().filter(|t| named.contains(t)).collect();
    let require: Vec<&String> = candidates.iter().filter(|t| !named.contains(t)).collect();
    let replaced = runtime.contains_key("tool_policy");
    let mut p = json!({"auto_approve_tools": if approval == "auto" { json!(auto) } else { json!([]) },
                       "withheld_tools": [], "source": "automation-policy",
                       "untrusted_input": true, "approval": approval,
                       "untrusted_input_tools": named, "replaced_target_policy": replaced});
    if approval != "auto" {
        p["require_approval_tools"] = json!(require);
    }
    runtime.insert("tool_policy".into(), p);
    runtime.insert("untrusted_input".into(), json!(true));
    if let Some(Value::Array(tools)) = input.get_mut("tools") {
        tools.retain(|t| !t.as_str().is_some_and(|s| s.starts_with("mcp::")));
    }
}

//! `agent`: a ReAct loop (llm-tools spec 4.1). The model is asked with the
//! conversation so far and the tools of the run; while it asks for tools,
//! the host runs them and their results join the conversation; when it
//! answers without asking for a tool, the run completes with the answer.
//!
//! One component serves every node of the flow (dispatch on the node id):
//!
//! - `init` refuses a missing or blank `vars.prompt`; `messages` = the
//!   prior conversation (`vars.context.messages`, through the history
//!   window; none when `include_context` or `use_context` is `false`) and
//!   the prompt as a user message; `iteration` 0;
//!   `turn_start` = the prompt's index; asks `tool_specs` → `toolset`.
//! - `reason` goes to `max_iterations` once `iteration` reaches
//!   `vars.max_iterations` (default 20); else counts the iteration and asks
//!   `llm_call` with the windowed messages and the tools → `llm`.
//! - `parse`: tool calls → an assistant message carrying them,
//!   `pending_tool_calls`, `act`; else the answer as an assistant message,
//!   `done`.
//! - `act` asks `tool_calls` with the pending calls → `tool_results` (write
//!   tools may make the run wait for a person's approval first).
//! - `observe` adds one `tool` message per result, updates `used_tools`,
//!   goes back to `reason`.
//! - `done` and `max_iterations` complete the run with `{answer,
//!   iterations, messages, used_tools}` (`stopped: "max_iterations"` for
//!   the second).
//!
//! Everything the nodes know is in the run's vars; they keep no state and
//! read no clock.
use std::collections::BTreeSet;

use serde_json::{json, Map, Value};
use stepwell_automation_core::history::{window_transcript, HISTORY_REPLAY_MAX_TOKENS};
use stepwell_guest::{export_node, Effect, Input, NodeError, Plan};

/// The iterations a run may take when `vars.max_iterations` is not set.
const DEFAULT_MAX_ITERATIONS: u64 = 20;

/// The largest whole number a float var is read as (2^53).
const MAX_EXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

/// The temperature of a call that offers tools, and of one that does not.
const TEMPERATURE_WITH_TOOLS: f64 = 0.2;
const TEMPERATURE_WITHOUT_TOOLS: f64 = 0.7;

fn agent(input: Input) -> Result<Plan, NodeError> {
    match input.node_id.as_str() {
        "init" => init(&input),
        "reason" => reason(&input),
        "parse" => parse(&input),
        "act" => act(&input),
        "observe" => observe(&input),
        "done" => Ok(Plan::complete(outcome(&input, None))),
        "max_iterations" => Ok(Plan::complete(outcome(&input, Some("max_iterations")))),
        other => Err(NodeError::invalid(format!("agent has no node {other:?}"))),
    }
}

export_node!(agent);

/// The var `key` as a whole number from `min`, `default` when it is absent
/// or `null`.
fn whole_number(input: &Input, key: &str, default: u64, min: u64) -> Result<u64, NodeError> {
    let value = match input.vars.get(key) {
        None | Some(Value::Null) => return Ok(default),
        Some(v) => v,
    };
    value
        .as_u64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= MAX_EXACT_FLOAT)
                .map(|f| f as u64)
        })
        .filter(|n| *n >= min)
        .ok_or_else(|| {
            NodeError::invalid(format!(
                "vars.{key} must be a whole number from {min}, got {value}"
            ))
        })
}

fn max_iterations(input: &Input) -> Result<u64, NodeError> {
    whole_number(input, "max_iterations", DEFAULT_MAX_ITERATIONS, 0)
}

fn history_max_tokens(input: &Input) -> Result<u64, NodeError> {
    whole_number(input, "history_max_tokens", HISTORY_REPLAY_MAX_TOKENS, 1)
}

/// The conversation so far (`vars.messages`).
fn messages(input: &Input) -> Vec<Value> {
    input
        .vars
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// A non-blank string var.
fn given_str<'a>(input: &'a Input, key: &str) -> Option<&'a str> {
    input.var_str(key).filter(|s| !s.trim().is_empty())
}

/// The run's `allowed_tools`, when it set them (the host checks the shape).
fn allowed_tools(input: &Input) -> Option<&Value> {
    input.vars.get("allowed_tools").filter(|v| !v.is_null())
}

/// The prior conversation: `vars.context.messages`, or none; none either
/// when the run says not to read it (`include_context`, or without it
/// `use_context`, is `false`: an automation's context mode decides this).
fn context_messages(input: &Input) -> Result<Vec<Value>, NodeError> {
    let read = input
        .vars
        .get("include_context")
        .or_else(|| input.vars.get("use_context"));
    if read == Some(&Value::Bool(false)) {
        return Ok(Vec::new());
    }
    let context = match input.vars.get("context") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(c)) => c,
        Some(_) => {
            return Err(NodeError::invalid(
                "vars.context must be an object ({\"messages\": [...]})",
            ))
        }
    };
    match context.get("messages") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => Ok(items.iter().filter(|m| m.is_object()).cloned().collect()),
        Some(_) => Err(NodeError::invalid(
            "vars.context.messages must be a list of messages",
        )),
    }
}

fn init(input: &Input) -> Result<Plan, NodeError> {
    let prompt = given_str(input, "prompt")
        .ok_or_else(|| NodeError::invalid("vars.prompt (a non-blank string) is required"))?
        .to_string();
    max_iterations(input)?;
    let budget = history_max_tokens(input)?;
    let prior = context_messages(input)?;
    let mut messages = if prior.is_empty() {
        prior
    } else {
        match window_transcript(&prior, budget, prior.len()) {
            Ok((kept, _)) => kept,
            Err(_) => prior,
        }
    };
    let turn_start = messages.len();
    messages.push(json!({"role": "user", "content": prompt}));
    let mut payload = Map::new();
    if let Some(allowed) = allowed_tools(input) {
        payload.insert("allowed_tools".into(), allowed.clone());
    }
    Ok(Plan::follow()
        .set("messages", Value::Array(messages))
        .set("iteration", json!(0))
        .set("turn_start", json!(turn_start))
        .with_effect(Effect::new("tool_specs", Value::Object(payload)).result_key("toolset")))
}

fn reason(input: &Input) -> Result<Plan, NodeError> {
    let iteration = input
        .vars
        .get("iteration")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if iteration >= max_iterations(input)? {
        return Ok(Plan::goto("max_iterations"));
    }
    let messages = messages(input);
    // Out of range (or absent), the window refuses, and the messages go as they are.
    let turn_start = input
        .vars
        .get("turn_start")
        .and_then(Value::as_u64)
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let sent = match window_transcript(&messages, history_max_tokens(input)?, turn_start) {
        Ok((kept, _)) => kept,
        Err(_) => messages,
    };
    let tools = input
        .var_path("toolset.tools")
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    let mut payload = Map::new();
    payload.insert("messages".into(), Value::Array(sent));
    if let Some(tools) = tools {
        payload.insert("tools".into(), tools.clone());
    }
    for key in ["system_prompt", "model", "provider"] {
        if let Some(value) = given_str(input, key) {
            payload.insert(key.into(), json!(value));
        }
    }
    let temperature = if tools.is_some() {
        TEMPERATURE_WITH_TOOLS
    } else {
        TEMPERATURE_WITHOUT_TOOLS
    };
    payload.insert("params".into(), json!({"temperature": temperature}));
    Ok(Plan::follow()
        .set("iteration", json!(iteration + 1))
        .with_effect(Effect::new("llm_call", Value::Object(payload)).result_key("llm")))
}

/// A call's id: its own, else its position from 1 (`"1"`, `"2"`, ...).
fn call_id(call: &Value, index: usize) -> String {
    match call.get("call_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => (index + 1).to_string(),
    }
}

fn parse(input: &Input) -> Result<Plan, NodeError> {
    let llm = input.vars.get("llm");
    let content = llm
        .and_then(|l| l.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let calls = llm
        .and_then(|l| l.get("tool_calls"))
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    let mut messages = messages(input);
    let Some(calls) = calls else {
        messages.push(json!({"role": "assistant", "content": content}));
        return Ok(Plan::goto("done").set("messages", Value::Array(messages)));
    };
    let mut pending = Vec::with_capacity(calls.len());
    let mut announced = Vec::with_capacity(calls.len());
    for (index, call) in calls.iter().enumerate() {
        let id = call_id(call, index);
        let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
        let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
        let arguments_text = match &arguments {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        announced.push(json!({
            "id": id,
            "type": "function",
            "function": {"name": name, "arguments": arguments_text},
        }));
        pending.push(json!({"name": name, "arguments": arguments, "call_id": id}));
    }
    messages.push(json!({"role": "assistant", "content": content, "tool_calls": announced}));
    Ok(Plan::goto("act")
        .set("messages", Value::Array(messages))
        .set("pending_tool_calls", Value::Array(pending)))
}

fn act(input: &Input) -> Result<Plan, NodeError> {
    let calls = input
        .vars
        .get("pending_tool_calls")
        .filter(|c| c.as_array().is_some_and(|a| !a.is_empty()))
        .ok_or_else(|| {
            NodeError::invalid("vars.pending_tool_calls (the calls `parse` found) is missing")
        })?;
    let mut payload = Map::new();
    payload.insert("tool_calls".into(), calls.clone());
    if let Some(allowed) = allowed_tools(input) {
        payload.insert("allowed_tools".into(), allowed.clone());
    }
    Ok(Plan::follow()
        .with_effect(Effect::new("tool_calls", Value::Object(payload)).result_key("tool_results")))
}

/// A value as message text: a string as it is, anything else as JSON.
fn as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn observe(input: &Input) -> Result<Plan, NodeError> {
    let results = input
        .var_path("tool_results.results")
        .and_then(Value::as_array)
        .ok_or_else(|| NodeError::invalid("vars.tool_results.results (a list) is missing"))?;
    let mut messages = messages(input);
    let mut used: BTreeSet<String> = input
        .vars
        .get("used_tools")
        .and_then(Value::as_array)
        .map(|names| {
            names
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for result in results {
        let call_id = ["call_id", "runtime_call_id"]
            .iter()
            .find_map(|k| result.get(*k).and_then(Value::as_str))
            .unwrap_or_default();
        let content = if result.get("success").and_then(Value::as_bool) == Some(true) {
            as_text(result.get("output").unwrap_or(&Value::Null))
        } else {
            let error = match result.get("error") {
                None | Some(Value::Null) => "Tool execution failed".to_string(),
                Some(e) => as_text(e),
            };
            format!("Error: {error}")
        };
        messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
        if let Some(name) = result
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        {
            used.insert(name.to_string());
        }
    }
    Ok(Plan::goto("reason")
        .set("messages", Value::Array(messages))
        .set("used_tools", json!(used))
        .set("pending_tool_calls", Value::Null))
}

/// The run's output: the last assistant message's content (or `""`), the
/// iterations taken, the conversation and the tools used.
fn outcome(input: &Input, stopped: Option<&str>) -> Value {
    let messages = messages(input);
    let answer = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let iterations = input
        .vars
        .get("iteration")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let used_tools = input
        .vars
        .get("used_tools")
        .filter(|u| u.is_array())
        .cloned()
        .unwrap_or_else(|| json!([]));
    let mut out = json!({
        "answer": answer,
        "iterations": iterations,
        "messages": messages,
        "used_tools": used_tools,
    });
    if let Some(reason) = stopped {
        out["stopped"] = json!(reason);
    }
    out
}

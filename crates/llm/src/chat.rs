//! An `llm_call` payload as a chat-completions request, and the answer as
//! the effect's result.

use serde_json::{json, Map, Value};

pub use stepwell_runtime::core::secrets::{redact, REDACTED};

/// A request ready to send, and what it was built from.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// The body (`model`, `messages`, ...).
    pub body: Value,
    /// The output budget asked for (`max_tokens`), if any.
    pub max_output_tokens: Option<u64>,
}

fn text(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.trim().is_empty())
}

/// Python's `int()` of a budget, when it is above 0: a whole number, a
/// float (truncated), or a string of digits; never a boolean.
pub fn positive(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite())
                .map(|f| f.trunc() as i64)
        }),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    }
    .filter(|n| *n > 0)
    .map(|n| n as u64)
}

/// The output budget of a payload, in the reference's order: the
/// candidate is `params.max_output_tokens` when `params` has that key,
/// else `params.max_tokens`; when that is absent or null, the payload's
/// `max_output_tokens`, else its `max_out_tokens`. A candidate that is not
/// above 0 ([`positive`]) gives `limit` (the run's
/// `_limits.max_output_tokens`).
pub fn output_budget(payload: &Map<String, Value>, limit: Option<u64>) -> Option<u64> {
    let params = payload.get("params").and_then(Value::as_object);
    let named = params.and_then(|p| {
        if p.contains_key("max_output_tokens") {
            p.get("max_output_tokens")
        } else {
            p.get("max_tokens")
        }
    });
    let candidate = named
        .filter(|v| !v.is_null())
        .or_else(|| payload.get("max_output_tokens").filter(|v| !v.is_null()))
        .or_else(|| payload.get("max_out_tokens").filter(|v| !v.is_null()));
    positive(candidate).or(limit)
}

/// The budget the truncation text names, as the reference writes it: the
/// `params.max_output_tokens` the call was made with, which is the
/// payload's own when it names one, the budget when `params` names
/// neither key, and nothing when it names only `max_tokens`.
pub fn attempted_budget(payload: &Map<String, Value>, budget: Option<u64>) -> String {
    let params = payload.get("params").and_then(Value::as_object);
    match params
        .and_then(|p| p.get("max_output_tokens"))
        .filter(|v| !v.is_null())
    {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None if params.is_some_and(|p| p.get("max_tokens").is_some_and(|v| !v.is_null())) => {
            String::new()
        }
        None => budget.map(|b| b.to_string()).unwrap_or_default(),
    }
}

/// A tool spec in the OpenAI form: a `{"type": "function", ...}` spec is
/// kept; a `{name, description, parameters}` spec becomes one, its
/// `parameters` a JSON Schema as they are, or (AbstractCore's map of
/// `param -> {type, description, default?}`) an object schema whose
/// required properties are those without a default.
fn tool_spec(tool: &Value) -> Option<Value> {
    if tool.get("type").and_then(Value::as_str) == Some("function")
        && tool.get("function").is_some()
    {
        return Some(tool.clone());
    }
    let name = text(tool.get("name"))?;
    let params = tool.get("parameters").cloned().unwrap_or(json!({}));
    let schema = if params.get("type").is_some() || params.get("properties").is_some() {
        params
    } else {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for (k, v) in params.as_object().into_iter().flatten() {
            let mut p = v.as_object().cloned().unwrap_or_default();
            if p.remove("default").is_none() {
                required.push(json!(k));
            }
            properties.insert(k.clone(), Value::Object(p));
        }
        json!({"type": "object", "properties": properties, "required": required})
    };
    Some(json!({"type": "function", "function": {
        "name": name,
        "description": tool.get("description").cloned().unwrap_or(json!("")),
        "parameters": schema,
    }}))
}

const SCHEMA_TYPES: [&str; 7] = [
    "object", "array", "string", "integer", "number", "boolean", "null",
];

/// Whether an object reads as a JSON Schema rather than a field map (the
/// reference's test): `$schema`, `$id`, `$ref`, `$defs`, `definitions`,
/// `oneOf`, `anyOf`, `allOf`, `enum`, `const`, `items`, a `required` list, a
/// `properties` object, or a `type` naming JSON Schema types.
fn looks_like_schema(m: &Map<String, Value>) -> bool {
    let keys = [
        "$schema",
        "$id",
        "$ref",
        "$defs",
        "definitions",
        "oneOf",
        "anyOf",
        "allOf",
        "enum",
        "const",
        "items",
    ];
    if keys.iter().any(|k| m.contains_key(*k)) {
        return true;
    }
    if m.get("required").is_some_and(Value::is_array)
        || m.get("properties").is_some_and(Value::is_object)
    {
        return true;
    }
    match m.get("type") {
        Some(Value::String(t)) => SCHEMA_TYPES.contains(&t.as_str()),
        Some(Value::Array(ts)) => {
            !ts.is_empty()
                && ts
                    .iter()
                    .all(|t| t.as_str().is_some_and(|t| SCHEMA_TYPES.contains(&t)))
        }
        _ => false,
    }
}

/// The reference's unwrapping of a pasted request: `response_format` /
/// `responseFormat`, then `{type: json_schema, json_schema: {schema}}`,
/// `{json_schema: {schema}}`, or `{schema}` when the object is not itself a
/// schema.
fn unwrap_schema(mut m: Map<String, Value>) -> Map<String, Value> {
    for key in ["response_format", "responseFormat"] {
        if let Some(Value::Object(inner)) = m.get(key) {
            m = inner.clone();
        }
    }
    if let Some(Value::Object(inner)) = m.get("json_schema").and_then(|j| j.get("schema")) {
        return inner.clone();
    }
    if let Some(Value::Object(inner)) = m.get("schema") {
        if !looks_like_schema(&m) {
            return inner.clone();
        }
    }
    m
}

/// An object as an object schema: a JSON Schema kept (`type: object`
/// added when it has `properties` and no type); else a field map, each key
/// (trimmed, blank ones skipped) a required property whose schema follows
/// its example value.
fn object_schema(m: &Map<String, Value>) -> Value {
    if looks_like_schema(m) {
        let mut out = m.clone();
        if out.get("properties").is_some_and(Value::is_object)
            && out.get("type").is_none_or(Value::is_null)
        {
            out.insert("type".into(), json!("object"));
        }
        return Value::Object(out);
    }
    let mut properties = Map::new();
    let mut required = Vec::new();
    for (k, v) in m {
        let key = k.trim();
        if key.is_empty() {
            continue;
        }
        required.push(json!(key));
        properties.insert(key.to_string(), infer(v));
    }
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema
}

/// A requested response schema as a JSON Schema (the reference's
/// normalisation): a JSON string is parsed (one that does not parse asks
/// for nothing); wrappers are unwrapped; an empty object asks for nothing.
fn response_schema(v: &Value) -> Option<Value> {
    let v = match v {
        Value::String(s) if !s.trim().is_empty() => serde_json::from_str(s).ok()?,
        other => other.clone(),
    };
    let m = v.as_object().filter(|m| !m.is_empty())?.clone();
    let m = unwrap_schema(m);
    if m.is_empty() {
        return None;
    }
    Some(object_schema(&m))
}

fn infer(example: &Value) -> Value {
    match example {
        Value::Bool(_) => json!({"type": "boolean"}),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({"type": "integer"}),
        Value::Number(_) => json!({"type": "number"}),
        Value::String(s) => json!({"type": "string", "description": s}),
        Value::Array(a) => {
            let item = a.iter().find(|x| !x.is_null()).map(|x| match x {
                Value::String(_) => json!({"type": "string"}),
                other => infer(other),
            });
            match item {
                Some(item) => json!({"type": "array", "items": item}),
                None => json!({"type": "array"}),
            }
        }
        Value::Object(m) => object_schema(m),
        Value::Null => json!({}),
    }
}

/// The JSON an answer's text holds, as the reference reads it: the text
/// itself, else inside a code fence, else the first object or array in it.
pub fn parse_json_text(text: &str) -> Result<Value, String> {
    let t = text.trim();
    let first = match serde_json::from_str::<Value>(t) {
        Ok(v) => return Ok(v),
        Err(e) => e.to_string(),
    };
    if let Some(rest) = t.strip_prefix("```") {
        let body = rest.split_once('\n').map_or("", |(_, b)| b);
        let body = body.trim_end();
        let body = body.strip_suffix("```").unwrap_or(body);
        if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
            return Ok(v);
        }
    }
    for (i, c) in t.char_indices() {
        if c == '{' || c == '[' {
            let mut stream = serde_json::Deserializer::from_str(&t[i..]).into_iter::<Value>();
            if let Some(Ok(v)) = stream.next() {
                return Ok(v);
            }
        }
    }
    Err(first)
}

/// The chat-completions request of an `llm_call` payload for `model`, with
/// output budget `budget` ([`output_budget`]):
///
/// - one system message: `system_prompt`, then the content of the leading
///   `system` messages, joined by a blank line (system messages that start
///   `Recent tool activity` are dropped);
/// - the other messages, with only `role`, `content`, `name`,
///   `tool_calls` and `tool_call_id`;
/// - `prompt` (or `text` when `prompt` is blank) as the last user message;
/// - `tools` in the OpenAI form with `tool_choice: auto`;
/// - `max_tokens`, and of `params` only `temperature`, `stop`, `seed` (a
///   whole number from 0), `frequency_penalty`, `presence_penalty`;
/// - `response_format` from `response_schema`;
/// - `stream: false`.
pub fn chat_request(payload: &Map<String, Value>, model: &str, budget: Option<u64>) -> ChatRequest {
    let mut system: Vec<String> = text(payload.get("system_prompt"))
        .map(str::to_string)
        .into_iter()
        .collect();
    let mut messages = Vec::new();
    let mut leading = true;
    for m in payload
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(o) = m.as_object() else { continue };
        let role = o.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = o.get("content").and_then(Value::as_str).unwrap_or_default();
        if role == "system" {
            if content.starts_with("Recent tool activity") {
                continue;
            }
            if leading {
                if !content.trim().is_empty() {
                    system.push(content.to_string());
                }
                continue;
            }
        }
        leading = false;
        let kept: Map<String, Value> = o
            .iter()
            .filter(|(k, _)| {
                matches!(
                    k.as_str(),
                    "role" | "content" | "name" | "tool_calls" | "tool_call_id"
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        messages.push(Value::Object(kept));
    }
    let mut wire = Vec::new();
    if !system.is_empty() {
        wire.push(json!({"role": "system", "content": system.join("\n\n")}));
    }
    wire.extend(messages);
    if let Some(prompt) = text(payload.get("prompt")).or_else(|| text(payload.get("text"))) {
        wire.push(json!({"role": "user", "content": prompt}));
    }
    let mut body = json!({"model": model, "messages": wire, "stream": false});
    let tools: Vec<Value> = payload
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(tool_spec)
        .collect();
    if !tools.is_empty() {
        body["tools"] = json!(tools);
        body["tool_choice"] = json!("auto");
    }
    if let Some(n) = budget {
        body["max_tokens"] = json!(n);
    }
    if let Some(params) = payload.get("params").and_then(Value::as_object) {
        if let Some(t) = params.get("temperature").and_then(Value::as_f64) {
            body["temperature"] = json!(t);
        }
        for k in ["stop", "frequency_penalty", "presence_penalty"] {
            if let Some(v) = params.get(k).filter(|v| !v.is_null()) {
                body[k] = v.clone();
            }
        }
        if let Some(seed) = params.get("seed").and_then(Value::as_u64) {
            body["seed"] = json!(seed);
        }
    }
    if let Some(schema) = requested_schema(payload) {
        let name = text(payload.get("response_schema_name")).unwrap_or("StructuredOutput");
        body["response_format"] = json!({"type": "json_schema",
                                         "json_schema": {"name": name, "schema": schema}});
    }
    ChatRequest {
        body,
        max_output_tokens: budget,
    }
}

/// Why `value` does not match JSON Schema `schema`, if it does not (the
/// common keywords: `type` (one or a list), `properties`, `required`,
/// `additionalProperties: false`, `items`, `enum`; others are not
/// checked). `at` names where `value` is (`$` at the top).
pub fn schema_mismatch(value: &Value, schema: &Value, at: &str) -> Option<String> {
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let is = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => true,
    };
    if !types.is_empty() && !types.iter().any(|t| is(t)) {
        return Some(format!(
            "{at}: expected {}, got {value}",
            types.join(" or ")
        ));
    }
    if let Some(Value::Array(allowed)) = schema.get("enum") {
        if !allowed.contains(value) {
            return Some(format!(
                "{at}: {value} is not one of {}",
                Value::Array(allowed.clone())
            ));
        }
    }
    if let Value::Object(m) = value {
        for key in schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !m.contains_key(key) {
                return Some(format!("{at}.{key}: required"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (k, v) in m {
            match properties.and_then(|p| p.get(k)) {
                Some(sub) => {
                    if let Some(why) = schema_mismatch(v, sub, &format!("{at}.{k}")) {
                        return Some(why);
                    }
                }
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Some(format!("{at}.{k}: not allowed"));
                }
                None => {}
            }
        }
    }
    if let (Value::Array(items), Some(sub)) = (value, schema.get("items")) {
        for (i, v) in items.iter().enumerate() {
            if let Some(why) = schema_mismatch(v, sub, &format!("{at}[{i}]")) {
                return Some(why);
            }
        }
    }
    None
}

/// The JSON Schema a payload's `response_schema` stands for, if it names one.
pub fn requested_schema(payload: &Map<String, Value>) -> Option<Value> {
    payload.get("response_schema").and_then(response_schema)
}

/// Whether a finish reason says the answer was cut (`length`,
/// `max_tokens`, `max_output_tokens`, in any case).
pub fn finish_is_truncation(reason: Option<&str>) -> bool {
    reason.is_some_and(|r| {
        matches!(
            r.to_ascii_lowercase().as_str(),
            "length" | "max_tokens" | "max_output_tokens"
        )
    })
}

/// The reference's text for a truncated answer, naming the budget
/// attempted ([`attempted_budget`]).
pub fn truncation_message(attempted: &str) -> String {
    format!(
        "LLM_CALL output was truncated (finish_reason=length). Attempted max_output_tokens: {attempted}. Increase max_output_tokens/max_out_tokens (or set allow_truncation=true)."
    )
}

fn normalize_tool_call(call: &Value) -> Option<Value> {
    let function = call.get("function");
    let name = text(call.get("name")).or_else(|| text(function.and_then(|f| f.get("name"))))?;
    let raw = call
        .get("arguments")
        .or_else(|| function.and_then(|f| f.get("arguments")))
        .cloned()
        .unwrap_or(json!({}));
    let arguments = match raw {
        Value::String(s) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(m)) => Value::Object(m),
            _ => json!({}),
        },
        Value::Object(m) => Value::Object(m),
        _ => json!({}),
    };
    let call_id = call
        .get("call_id")
        .or_else(|| call.get("id"))
        .cloned()
        .unwrap_or(Value::Null);
    Some(json!({"name": name, "arguments": arguments, "call_id": call_id}))
}

/// The `llm_call` result of chat-completions answer `body`: `{content,
/// reasoning, data, raw_response, tool_calls, usage, model, finish_reason,
/// metadata, trace_id, gen_time}`. Tool calls are `{name, arguments (an
/// object), call_id}` (none: `null`); the reasoning is the message's
/// `reasoning`, `reasoning_content`, `thinking` or `thinking_content`; the
/// usage gains `input_tokens` / `output_tokens`; with `structured`, `data`
/// is the content parsed as JSON (a non-object wrapped as `{"value": x}`).
/// A body without `choices[0]` completes with `content: null` and the body
/// as `data`.
pub fn normalize_response(body: Value, structured: bool, metadata: Value) -> Value {
    let choice = body.get("choices").and_then(|c| c.get(0)).cloned();
    let Some(choice) = choice else {
        return json!({"content": null, "reasoning": null, "data": body, "raw_response": body,
                      "tool_calls": null, "usage": null, "model": null, "finish_reason": null,
                      "metadata": metadata, "trace_id": null, "gen_time": null});
    };
    let message = choice.get("message").cloned().unwrap_or(json!({}));
    let content = message
        .get("content")
        .and_then(Value::as_str)
        .map(str::to_string);
    let reasoning = [
        "reasoning",
        "reasoning_content",
        "thinking",
        "thinking_content",
    ]
    .iter()
    .find_map(|k| message.get(*k).and_then(Value::as_str))
    .map(str::to_string);
    let calls: Vec<Value> = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(normalize_tool_call)
        .collect();
    let mut usage = body.get("usage").filter(|u| u.is_object()).cloned();
    if let Some(Value::Object(u)) = usage.as_mut() {
        for (alias, from) in [
            ("input_tokens", "prompt_tokens"),
            ("output_tokens", "completion_tokens"),
        ] {
            if !u.contains_key(alias) {
                if let Some(v) = u.get(from).cloned() {
                    u.insert(alias.into(), v);
                }
            }
        }
    }
    let data = if structured {
        body.get("data")
            .filter(|d| !d.is_null())
            .cloned()
            .or_else(|| {
                content
                    .as_deref()
                    .and_then(|c| parse_json_text(c).ok())
                    .map(|v| {
                        if v.is_object() {
                            v
                        } else {
                            json!({"value": v})
                        }
                    })
            })
    } else {
        None
    };
    json!({
        "content": content,
        "reasoning": reasoning,
        "data": data,
        "raw_response": body,
        "tool_calls": if calls.is_empty() { Value::Null } else { json!(calls) },
        "usage": usage,
        "model": body.get("model").cloned().unwrap_or(Value::Null),
        "finish_reason": choice.get("finish_reason").cloned().unwrap_or(Value::Null),
        "metadata": metadata,
        "trace_id": null,
        "gen_time": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_request_follows_the_reference() {
        let p = payload(json!({
            "prompt": "hello", "system_prompt": "sys",
            "messages": [{"role": "system", "content": "more"},
                         {"role": "user", "content": "before", "metadata": {"x": 1}},
                         {"role": "system", "content": "Recent tool activity: ..."}],
            "params": {"temperature": 0, "max_tokens": 5, "api_key": "sk-1", "seed": -1},
            "tools": [{"name": "read_file", "description": "Read",
                       "parameters": {"file_path": {"type": "string"}, "limit": {"type": "integer", "default": 10}}}]
        }));
        let budget = output_budget(&p, None);
        assert_eq!(budget, Some(5));
        let r = chat_request(&p, "m", budget);
        assert_eq!(
            r.body["messages"],
            json!([{"role": "system", "content": "sys\n\nmore"},
                   {"role": "user", "content": "before"},
                   {"role": "user", "content": "hello"}])
        );
        assert_eq!(r.body["temperature"], 0.0);
        assert_eq!(r.body["max_tokens"], 5);
        assert!(r.body.get("seed").is_none() && r.body.get("api_key").is_none());
        assert_eq!(r.body["tool_choice"], "auto");
        assert_eq!(
            r.body["tools"][0]["function"]["parameters"],
            json!({"type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}},
                   "required": ["file_path"]})
        );
    }

    #[test]
    fn the_output_budget_follows_the_reference() {
        let b = |v: Value, limit| output_budget(&payload(v), limit);
        assert_eq!(
            b(
                json!({"params": {"max_output_tokens": 0, "max_tokens": 5}}),
                Some(7)
            ),
            Some(7)
        );
        assert_eq!(
            b(
                json!({"params": {"max_tokens": 0}, "max_out_tokens": 10}),
                None
            ),
            None
        );
        assert_eq!(
            b(
                json!({"params": {"max_tokens": null}, "max_out_tokens": 10}),
                None
            ),
            Some(10)
        );
        assert_eq!(b(json!({"max_output_tokens": 12.7}), None), Some(12));
        assert_eq!(b(json!({"max_out_tokens": "100"}), None), Some(100));
        assert_eq!(b(json!({"max_out_tokens": true}), Some(3)), Some(3));
        let a = |v: Value, budget| attempted_budget(&payload(v), budget);
        assert_eq!(a(json!({"max_out_tokens": 10}), Some(10)), "10");
        assert_eq!(a(json!({"params": {"max_tokens": 5}}), Some(5)), "");
        assert_eq!(a(json!({"params": {"max_output_tokens": 8}}), Some(8)), "8");
    }

    #[test]
    fn tool_calls_and_usage_are_normalised() {
        let body = json!({"model": "m", "choices": [{"message": {"content": null, "reasoning_content": "think",
            "tool_calls": [{"id": "call_2", "type": "function",
                            "function": {"name": "fetch_url", "arguments": "{\"url\":\"https://example.com\"}"}},
                           {"id": "call_3", "function": {"arguments": "{}"}}]}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29}});
        let r = normalize_response(body, false, json!({}));
        assert_eq!(
            r["tool_calls"],
            json!([{"name": "fetch_url", "arguments": {"url": "https://example.com"}, "call_id": "call_2"}])
        );
        assert_eq!(r["reasoning"], "think");
        assert_eq!(r["usage"]["input_tokens"], 20);
        assert_eq!(r["usage"]["output_tokens"], 9);
        let s = normalize_response(
            json!({"choices": [{"message": {"content": "[1, 2]"}, "finish_reason": "stop"}]}),
            true,
            json!({}),
        );
        assert_eq!(s["data"], json!({"value": [1, 2]}));
    }

    #[test]
    fn schemas_are_normalised_as_the_reference_does() {
        let p = |v: Value| response_schema(&v);
        assert_eq!(
            p(json!({"type": "cat", "name": "Tom"})),
            Some(
                json!({"type": "object", "required": ["name", "type"], "properties": {
                "type": {"type": "string", "description": "cat"},
                "name": {"type": "string", "description": "Tom"}}})
            )
        );
        let any = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(p(any.clone()), Some(any));
        assert_eq!(p(json!({})), None);
        assert_eq!(p(json!("not json")), None);
        assert_eq!(
            p(json!({"type": "json_schema", "json_schema": {"name": "x",
                     "schema": {"properties": {"a": {"type": "string"}}}}})),
            Some(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
        );
        assert_eq!(
            p(json!({"json_schema": {"name": "x", "strict": true}})),
            Some(
                json!({"type": "object", "required": ["json_schema"], "properties": {"json_schema": {
                "type": "object", "required": ["name", "strict"],
                "properties": {"name": {"type": "string", "description": "x"},
                               "strict": {"type": "boolean"}}}}})
            )
        );
        assert_eq!(
            p(json!({"tags": ["a"], "none": []})),
            Some(
                json!({"type": "object", "required": ["none", "tags"], "properties": {
                "tags": {"type": "array", "items": {"type": "string"}}, "none": {"type": "array"}}})
            )
        );
        assert_eq!(
            parse_json_text("```json\n{\"a\": 1}\n```"),
            Ok(json!({"a": 1}))
        );
        assert_eq!(
            parse_json_text("Here you go: {\"a\": 2} thanks"),
            Ok(json!({"a": 2}))
        );
        assert!(parse_json_text("no json here").is_err());
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let v = json!({"params": {"api_key": "sk", "provider_api_key": "x", "session_token": "t",
                                  "token": "ghp", "Token": "t", "hf_token": "h", "private_key": "k",
                                  "accessToken": "a", "max_tokens": 3, "empty_token": "", "null_secret": null,
                                  "nested": [{"Authorization": "Bearer y"}]},
                       "tools": [{"name": "login", "parameters": {"password": {"type": "string"}}}]});
        assert_eq!(
            redact(&v),
            json!({"params": {"api_key": REDACTED, "provider_api_key": REDACTED, "session_token": REDACTED,
                              "token": REDACTED, "Token": REDACTED, "hf_token": REDACTED, "private_key": REDACTED,
                              "accessToken": REDACTED, "max_tokens": 3, "empty_token": "", "null_secret": null,
                              "nested": [{"Authorization": REDACTED}]},
                   "tools": [{"name": "login", "parameters": {"password": {"type": "string"}}}]})
        );
        assert!(finish_is_truncation(Some("LENGTH")) && !finish_is_truncation(Some("stop")));
        assert_eq!(
            truncation_message("10"),
            "LLM_CALL output was truncated (finish_reason=length). Attempted max_output_tokens: 10. Increase max_output_tokens/max_out_tokens (or set allow_truncation=true)."
        );
    }
}

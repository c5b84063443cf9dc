//! `llm_call`: one chat-completions request to an OpenAI-compatible
//! server, its answer written to the effect's `result_key`.
//!
//! An external effect: its outcome is recorded in the ledger ahead of the
//! step's commit, and a step replayed after a crash reuses it, so a paid
//! call is never made twice once its answer is recorded. Secrets in the
//! payload (`params.api_key` and the like) are recorded as `[redacted]`
//! and never sent in the body; the provider's key is looked up by name at
//! each call (in the settings the embedder gave; the `stepwell` binary's
//! are its environment).

use serde_json::{json, Map, Value};

use crate::{
    attempted_budget, chat_request, finish_is_truncation, normalize_response, output_budget,
    parse_json_text, positive, redact, requested_schema, schema_mismatch, shown_url,
    truncation_message, ChatRequest, Provider, Providers, Settings,
};
use stepwell_runtime::core::flight::Landing;
use stepwell_runtime::core::model::RunState;
use stepwell_runtime::core::trace::{Span, SpanKind};
use stepwell_runtime::core::Result;
use stepwell_runtime::effects::{EffectClass, EffectCx, EffectHandler, Failure, Outcome};

/// The environment variable the `stepwell` binary reads for a providers
/// file (JSON, see `docs/llm.md`).
pub const LLM_CONFIG_ENV: &str = "STEPWELL_LLM_CONFIG";

/// The `llm_call` handler over a set of providers.
#[derive(Debug, Clone)]
pub struct LlmCall {
    providers: std::result::Result<Providers, String>,
}

impl LlmCall {
    /// Calls `providers`.
    pub fn new(providers: Providers) -> Self {
        LlmCall {
            providers: Ok(providers),
        }
    }

    /// The providers `settings` configure: the providers file `file`
    /// (the binary's `STEPWELL_LLM_CONFIG`) over the built-in profiles, or
    /// the built-in profiles alone. A file that cannot be read fails every
    /// call with why.
    pub fn configured(file: Option<&std::path::Path>, settings: &Settings) -> Self {
        let providers = match file {
            Some(path) => Providers::load(path, settings),
            None => Ok(Providers::from_settings(settings)),
        };
        LlmCall { providers }
    }
}

/// Python-style truthiness of the reference's "bool-ish" flags: booleans,
/// non-zero numbers, and the strings `1`, `true`, `yes`, `y`, `on`.
fn boolish(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => {
            matches!(
                s.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "yes" | "y" | "on"
            )
        }
        _ => false,
    }
}

fn nonblank(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The reference's refusal of a payload with nothing to send.
fn no_input(node: Option<&str>) -> Failure {
    let at = node.map(|n| format!(" (node {n})")).unwrap_or_default();
    Failure::permanent(
        "invalid_effect",
        format!(
            "llm_call{at} requires payload.prompt or payload.messages; both were empty. Supply the flow's prompt input when starting the run (input_data.<prompt pin>), or connect/pin it in the flow."
        ),
    )
}

/// The payload with the run's workspace scope described at the end of its
/// system prompt, when the model is offered tools and the run has a scope
/// (the reference's workspace disclosure; once, whatever the prompt
/// already says). `None`: send the payload as it is. The recorded payload
/// is never changed.
fn disclose_workspace(run: &RunState, payload: &Map<String, Value>) -> Option<Map<String, Value>> {
    let offers_tools = payload
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if !offers_tools {
        return None;
    }
    // Described as frozen: its paths were made absolute (a `~` expanded)
    // when the run started, so no home folder is needed here.
    let scope = stepwell_tools::scope::WorkspaceScope::from_runtime(run.vars.get("_runtime"), None)
        .ok()
        .flatten()?;
    let authored = nonblank(payload.get("system_prompt")).unwrap_or_default();
    if authored.contains("Workspace access (") {
        return None;
    }
    let mut out = payload.clone();
    let text = if authored.is_empty() {
        scope.describe()
    } else {
        format!("{authored}\n\n{}", scope.describe())
    };
    out.insert("system_prompt".into(), Value::String(text));
    Some(out)
}

/// What is wrong with a structured answer, if anything: the metadata key
/// that says so and why (its content does not parse as JSON, or its data
/// does not match the schema).
fn structured_problem(result: &Value, schema: &Value) -> Option<(&'static str, String)> {
    let content = result["content"]
        .as_str()
        .map(str::trim)
        .unwrap_or_default();
    if result["data"].is_null() && !content.is_empty() {
        return parse_json_text(content)
            .err()
            .map(|e| ("_structured_output_parse_error", e.to_string()));
    }
    schema_mismatch(&result["data"], schema, "$")
        .map(|why| ("_structured_output_validation_error", why))
}

/// The reference's `_truncate_prompt_block`: trimmed, and cut to
/// `max_chars` with `...`.
fn truncate_block(text: &str, max_chars: usize) -> String {
    let text = text.trim();
    if text.chars().count() <= max_chars {
        return text.to_string();
    }
    let kept: String = text.chars().take(max_chars.saturating_sub(3)).collect();
    format!("{kept}...")
}

/// The reference's repair prompt for a structured answer that failed.
fn repair_prompt(task: &str, schema: &Value, invalid: &str, error: &str) -> String {
    let schema_text = serde_json::to_string_pretty(schema).unwrap_or_default();
    format!(
        "You returned structured output that does not satisfy the required JSON schema.\nReturn corrected JSON only.\n\nOriginal task:\n{}\n\nRequired JSON schema:\n{schema_text}\n\nPrevious invalid output:\n{}\n\nValidation error:\n{}\n\nReturn exactly one JSON object that satisfies the schema. Do not include markdown or explanation.",
        truncate_block(task, 4000),
        truncate_block(invalid, 4000),
        truncate_block(error, 2000),
    )
}

/// The user's text of a payload: its prompt, else its last user message.
fn user_text(payload: &Map<String, Value>) -> Option<String> {
    nonblank(payload.get("prompt"))
        .map(str::to_string)
        .or_else(|| {
            payload
                .get("messages")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .rev()
                .filter(|m| m["role"] == "user")
                .find_map(|m| nonblank(m.get("content")).map(str::to_string))
        })
}

/// Marks the answer of a generation the server aborted (the reference's
/// rule): no tool call, a usage block whose counters are all zero, and
/// some content or reasoning. Text cannot come from a completion that read
/// and wrote nothing: a tool call was likely lost mid-generation. The call
/// still completes; `metadata.generation_aborted`, `output_truncated`,
/// `truncation_kind: "aborted_generation"` and
/// `_runtime_observability.aborted_generation` say so, for the flow to
/// route on. A missing or empty usage block is no evidence either way.
fn mark_aborted(result: &mut Value) {
    let has_calls = result["tool_calls"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let Some(usage) = result["usage"].as_object().filter(|u| !u.is_empty()) else {
        return;
    };
    let counters: Vec<&Value> = [
        "input_tokens",
        "output_tokens",
        "total_tokens",
        "prompt_tokens",
        "completion_tokens",
    ]
    .iter()
    .filter_map(|k| usage.get(*k).filter(|v| !v.is_null()))
    .collect();
    let all_zero = !counters.is_empty()
        && counters
            .iter()
            .all(|v| v.as_f64() == Some(0.0) || **v == Value::Bool(false));
    let text = ["content", "reasoning"]
        .iter()
        .any(|k| nonblank(result.get(*k)).is_some());
    if has_calls || !all_zero || !text {
        return;
    }
    let preview: String = result["content"]
        .as_str()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    let seen = json!({"finish_reason": result["finish_reason"], "usage": result["usage"],
                      "content_preview": preview});
    if !result["metadata"].is_object() {
        result["metadata"] = json!({});
    }
    let meta = &mut result["metadata"];
    meta["generation_aborted"] = json!(true);
    if meta.get("output_truncated").is_none() {
        meta["output_truncated"] = json!(true);
    }
    if meta.get("truncation_kind").is_none() {
        meta["truncation_kind"] = json!("aborted_generation");
    }
    if !meta["_runtime_observability"].is_object() {
        meta["_runtime_observability"] = json!({});
    }
    meta["_runtime_observability"]["aborted_generation"] = seen;
}

impl EffectHandler for LlmCall {
    fn kind(&self) -> &str {
        "llm_call"
    }

    fn class(&self) -> EffectClass {
        EffectClass::External
    }

    fn recorded_payload(&self, payload: &Value) -> Option<Value> {
        Some(redact(payload))
    }

    /// `_limits.estimated_tokens_used`: the answer's input tokens
    /// (`input_tokens`, else `prompt_tokens`, else `total_tokens`; the last
    /// call's, not a sum). With `include_context` (or `use_context`), the
    /// turn is appended to `context.messages`: the user's text (the prompt,
    /// else the last user message) and the answer (its content, else its
    /// data as indented JSON), each with `metadata: {kind: "llm_turn",
    /// node_id}`; an empty text is skipped.
    fn after_completed(&self, run: &mut RunState, payload: &Map<String, Value>, result: &Value) {
        let usage = &result["usage"];
        let used = ["input_tokens", "prompt_tokens", "total_tokens"]
            .iter()
            .map(|k| &usage[*k])
            .find(|v| !v.is_null());
        if let Some(n) = used.and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64))) {
            let limits = run
                .vars
                .entry("_limits")
                .or_insert_with(|| Value::Object(Map::new()));
            if !limits.is_object() {
                *limits = Value::Object(Map::new());
            }
            limits["estimated_tokens_used"] = json!(n);
        }
        let asked = payload
            .get("include_context")
            .filter(|v| !v.is_null())
            .or(payload.get("use_context"));
        if !boolish(asked) {
            return;
        }
        let user = user_text(payload);
        let answer = nonblank(result.get("content"))
            .map(str::to_string)
            .or_else(|| {
                result
                    .get("data")
                    .filter(|d| d.is_object() || d.is_array())
                    .and_then(|d| serde_json::to_string_pretty(d).ok())
            });
        let node = run
            .current_node
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| "unknown".into());
        let context = run
            .vars
            .entry("context")
            .or_insert_with(|| Value::Object(Map::new()));
        if !context.is_object() {
            *context = Value::Object(Map::new());
        }
        if !context["messages"].is_array() {
            context["messages"] = json!([]);
        }
        let Some(messages) = context["messages"].as_array_mut() else {
            return;
        };
        for (role, text) in [("user", user), ("assistant", answer)] {
            if let Some(text) = text {
                messages.push(json!({"role": role, "content": text,
                                     "metadata": {"kind": "llm_turn", "node_id": node}}));
            }
        }
    }

    fn flies(&self) -> bool {
        true
    }

    fn own_executor(&self) -> bool {
        true
    }

    fn launch(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        _prepared: Option<&Value>,
        landing: Landing,
    ) -> Option<Landing> {
        let planned = match self.plan(cx, payload) {
            Ok(planned) => planned,
            Err(outcome) => {
                landing.land(outcome);
                return None;
            }
        };
        // What the call keeps while it is out: its request (the
        // conversation), once as the request and once as its body.
        landing.hold_bytes(2 * stepwell_runtime::core::flight::json_size(&planned.request.body));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        landing.cancel().on_cancel(move || {
            let _ = stop.send(());
        });
        let mut span = call_span(cx, &planned);
        crate::http::spawn(async move {
            tokio::select! {
                outcome = perform(planned) => {
                    measured(&mut span, &outcome);
                    drop(span);
                    landing.land(outcome)
                }
                // Dropping the call drops its request (and connection).
                _ = stopped => {
                    let outcome = Outcome::Failed(Failure::permanent(
                        "cancelled",
                        "the run was cancelled while its model call was in flight",
                    ));
                    measured(&mut span, &outcome);
                    drop(span);
                    landing.land(outcome)
                }
            }
        });
        None
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
        _prepared: Option<&Value>,
    ) -> Result<Outcome> {
        Ok(match self.plan(cx, payload) {
            Ok(planned) => {
                let mut span = call_span(cx, &planned);
                let outcome = crate::http::block_on(perform(planned));
                measured(&mut span, &outcome);
                outcome
            }
            Err(outcome) => outcome,
        })
    }
}

/// The span of a model call (OpenTelemetry's `gen_ai` names), under the
/// effect's.
fn call_span(cx: &EffectCx<'_>, planned: &Planned) -> Span {
    let mut span = cx.tracer.start("llm.call", None);
    span.kind(SpanKind::Client);
    span.attr_with("gen_ai.system", || planned.provider.name.clone());
    span.attr_with("gen_ai.request.model", || planned.model.clone());
    span.attr_with("stepwell.run_id", || cx.run.run_id.clone());
    span
}

/// What a model call's outcome adds to its span: the model that answered,
/// the tokens it counted, why it stopped, or why it failed.
fn measured(span: &mut Span, outcome: &Outcome) {
    if !span.is_on() {
        return;
    }
    let result = match outcome {
        Outcome::Completed(result) => result,
        Outcome::Failed(f) => return span.fail(f),
        _ => return,
    };
    if let Some(model) = result["model"].as_str() {
        span.attr("gen_ai.response.model", model);
    }
    for (attr, key) in [
        ("gen_ai.usage.input_tokens", "prompt_tokens"),
        ("gen_ai.usage.output_tokens", "completion_tokens"),
    ] {
        if let Some(n) = result["usage"][key].as_u64() {
            span.attr(attr, n);
        }
    }
    if let Some(reason) = result["finish_reason"].as_str() {
        span.attr("gen_ai.response.finish_reasons", reason);
    }
    let calls = result["tool_calls"].as_array().map_or(0, Vec::len);
    span.attr("stepwell.llm.tool_calls", calls as u64);
}

/// A model call planned from its payload and its run: everything
/// performing it needs, owned (it may be performed off the step), and no
/// more: one copy of the conversation (the request's body), not three.
struct Planned {
    providers: Providers,
    provider: Provider,
    model: String,
    budget: Option<u64>,
    request: ChatRequest,
    /// The answer's metadata, but for `_provider_request.payload` (the
    /// redacted body, made from `request` when the answer is in).
    metadata: Value,
    schema: Option<Value>,
    /// With `structured_output_fallback`: what the one repair call is made
    /// of.
    repair: Option<RepairBase>,
    /// `allow_truncation` (or `allow_truncated`).
    allow_truncation: bool,
    /// The output budget a truncation message names.
    attempted: String,
}

/// The payload of a repair call, but its prompt: the payload without its
/// messages and tools, and the user's text the prompt quotes.
struct RepairBase {
    payload: Map<String, Value>,
    task: String,
}

impl LlmCall {
    /// Plans the call `payload` asks for, or the outcome that refuses it.
    fn plan(
        &self,
        cx: &EffectCx<'_>,
        payload: &Map<String, Value>,
    ) -> std::result::Result<Planned, Outcome> {
        let has_messages = payload
            .get("messages")
            .and_then(Value::as_array)
            .is_some_and(|m| !m.is_empty());
        if nonblank(payload.get("prompt")).is_none()
            && nonblank(payload.get("text")).is_none()
            && !has_messages
        {
            return Err(Outcome::Failed(no_input(cx.run.current_node.as_deref())));
        }
        let providers = match &self.providers {
            Ok(p) => p,
            Err(e) => {
                return Err(Outcome::Failed(Failure::permanent(
                    "llm_unavailable",
                    e.clone(),
                )))
            }
        };
        let runtime = cx.run.vars.get("_runtime");
        let pick = |key: &str| {
            nonblank(payload.get(key)).or_else(|| nonblank(runtime.and_then(|r| r.get(key))))
        };
        let provider = match providers.resolve(pick("provider")) {
            Ok(p) => p,
            Err(e) => return Err(Outcome::Failed(Failure::permanent(e.code, e.message))),
        };
        let Some(model) = pick("model").or(provider.default_model.as_deref()) else {
            return Err(Outcome::Failed(Failure::permanent(
                "llm_unavailable",
                format!(
                    "no model: name one in payload.model, _runtime.model, or the default_model of provider {}",
                    provider.name
                ),
            )));
        };
        let limit = cx
            .run
            .vars
            .get("_limits")
            .and_then(|l| positive(l.get("max_output_tokens")));
        let budget = output_budget(payload, limit);
        let disclosed = disclose_workspace(cx.run, payload);
        let request = chat_request(disclosed.as_ref().unwrap_or(payload), model, budget);
        let metadata = json!({
            "_provider_request": {
                "url": shown_url(&format!("{}/chat/completions", provider.base_url.trim_end_matches('/'))),
            },
            "provider": provider.name,
            "effect_idempotency_key": cx.key,
            "attempt": cx.attempt,
        });
        let repair = boolish(payload.get("structured_output_fallback")).then(|| {
            let mut base = payload.clone();
            base.remove("messages");
            base.remove("tools");
            RepairBase {
                payload: base,
                task: user_text(payload).unwrap_or_default(),
            }
        });
        Ok(Planned {
            providers: providers.clone(),
            provider: provider.clone(),
            model: model.to_string(),
            budget,
            attempted: attempted_budget(payload, request.max_output_tokens),
            request,
            metadata,
            schema: requested_schema(payload),
            repair,
            allow_truncation: boolish(payload.get("allow_truncation"))
                || boolish(payload.get("allow_truncated")),
        })
    }
}

/// Performs a planned call (and its one repair call, if the payload asks
/// for it): the effect's outcome.
async fn perform(mut p: Planned) -> Outcome {
    let exchange = p.providers.exchange(&p.provider, &p.request.body);
    p.metadata["_provider_request"]["payload"] = redact(&p.request.body);
    let answer = match exchange.send().await {
        Ok(a) => a,
        Err(e) => return Outcome::Failed(e.into()),
    };
    let mut result = normalize_response(answer, p.schema.is_some(), p.metadata.clone());
    if let Some(schema) = &p.schema {
        // Checked: an answer that does not parse or does not match
        // completes, saying why in its metadata, unless the payload asks
        // for one repair call (`structured_output_fallback`).
        if let Some((key, why)) = structured_problem(&result, schema) {
            match &p.repair {
                None => result["metadata"][key] = json!(why),
                Some(base) => {
                    result = match repair(&p, base, schema, &result, &why).await {
                        Ok(repaired) => repaired,
                        Err(outcome) => return outcome,
                    };
                }
            }
        }
    }
    mark_aborted(&mut result);
    let truncated = finish_is_truncation(result["finish_reason"].as_str());
    if truncated && !p.allow_truncation {
        return Outcome::Failed(Failure::permanent(
            "llm_truncated",
            truncation_message(&p.attempted),
        ));
    }
    Outcome::Completed(result)
}

/// The one repair call for an answer that did not match `schema`.
async fn repair(
    p: &Planned,
    base: &RepairBase,
    schema: &Value,
    result: &Value,
    why: &str,
) -> std::result::Result<Value, Outcome> {
    let invalid = result["content"]
        .as_str()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| serde_json::to_string_pretty(&result["data"]).unwrap_or_default());
    let mut repair = base.payload.clone();
    repair.insert(
        "prompt".into(),
        json!(repair_prompt(&base.task, schema, &invalid, why)),
    );
    let request = chat_request(&repair, &p.model, p.budget);
    let exchange = p.providers.exchange(&p.provider, &request.body);
    let answer = exchange
        .send()
        .await
        .map_err(|e| Outcome::Failed(e.into()))?;
    let mut repaired = normalize_response(answer, true, p.metadata.clone());
    if let Some((_, why)) = structured_problem(&repaired, schema) {
        let content = repaired["content"].as_str().unwrap_or_default().trim();
        let shown = if content.is_empty() {
            String::new()
        } else {
            format!("; repair content={}", truncate_block(content, 400))
        };
        return Err(Outcome::Failed(Failure::permanent(
            "llm_structured_output",
            format!("LLM_CALL structured output repair failed: {why}{shown}"),
        )));
    }
    repaired["metadata"]["_structured_output_repair"] = json!({"used": true, "error": ""});
    Ok(repaired)
}

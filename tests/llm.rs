//! `llm_call` against a real HTTP server on loopback
//! (`support/llm_mock.rs`, an OpenAI-compatible chat-completions server
//! scripted per test, which counts what it got).

use std::sync::Arc;

use serde_json::{json, Value};
use stepwell::llm::LlmCall;
use stepwell::llm::{Provider, Providers, Settings};
use stepwell::{Clock, ManualClock, RunStatus, Runtime, RuntimeConfig};
use stepwell_tests::llm_mock::{completion, LlmMock, Reply};
use stepwell_tests::{vars, write_bundle};

/// A runtime whose default provider `mock` is `mock`, with its key in
/// environment variable `key_env`.
fn runtime(
    mock: &LlmMock,
    key_env: &str,
    config: RuntimeConfig,
) -> (Runtime, Arc<ManualClock>, tempfile::TempDir) {
    // The keys come from this test process's environment, as the binary's
    // do from its own.
    let providers = Providers::only(Provider {
        api_key_env: Some(key_env.into()),
        timeout_s: Some(1.0),
        ..Provider::new("mock", &mock.base_url, Some("mock-model"))
    })
    .with_keys(Settings::new(|name| std::env::var(name).ok()));
    runtime_over(providers, config)
}

/// A runtime whose LLM calls go to `providers`, with the flow `ask-llm`.
fn runtime_over(
    providers: Providers,
    config: RuntimeConfig,
) -> (Runtime, Arc<ManualClock>, tempfile::TempDir) {
    let clock = stepwell_tests::manual_clock();
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(stepwell::SqliteStore::open(dir.path().join("db.sqlite")).unwrap());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .clock(clock.clone() as Arc<dyn Clock>)
        .config(config)
        .effect(Arc::new(LlmCall::new(providers)))
        .build()
        .unwrap();
    let bundle = write_bundle(
        dir.path(),
        "ask-llm",
        &[(
            "flow.json",
            json!({"workflow_id": "ask-llm", "entry": "ask", "nodes": {
                "ask": {"effect": "llm_call", "payload": {"$var": "llm"}, "result_key": "answer", "next": "end"},
                "end": {"complete": {"answer": {"$var": "answer"}}}}}),
        )],
    );
    rt.load_bundle(&bundle).unwrap();
    (rt, clock, dir)
}

/// [`runtime`] with no API key and the default configuration.
fn keyless(mock: &LlmMock) -> (Runtime, Arc<ManualClock>, tempfile::TempDir) {
    runtime(mock, "STEPWELL_TEST_LLM_KEY_NONE", RuntimeConfig::default())
}

fn ask(rt: &Runtime, payload: Value) -> stepwell::RunState {
    rt.run(
        "ask-llm",
        stepwell::StartOptions {
            vars: vars(json!({"llm": payload})),
            ..Default::default()
        },
    )
    .unwrap()
}

/// `llm_call` tried once: an empty `retries` would take the Llm plugin's
/// default (three attempts).
fn no_retries() -> RuntimeConfig {
    let once = stepwell::RetryPolicy {
        max_attempts: 1,
        initial_backoff: std::time::Duration::from_secs(1),
        factor: 2.0,
        max_backoff: std::time::Duration::from_secs(1),
    };
    RuntimeConfig {
        retries: [("llm_call".to_string(), once)].into(),
        ..Default::default()
    }
}

#[test]
fn a_plain_answer_and_what_was_sent_and_recorded() {
    let mock = LlmMock::start(vec![Reply::text("Hi there")]);
    std::env::set_var("STEPWELL_TEST_LLM_KEY_PLAIN", "k-123");
    let (rt, _, _dir) = runtime(
        &mock,
        "STEPWELL_TEST_LLM_KEY_PLAIN",
        RuntimeConfig::default(),
    );
    let run = ask(
        &rt,
        json!({"prompt": "Hello", "system_prompt": "sys",
               "params": {"temperature": 0, "max_tokens": 5, "api_key": "sk-secret"}}),
    );
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    let answer = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(answer["content"], "Hi there");
    assert_eq!(answer["finish_reason"], "stop");
    assert_eq!(answer["model"], "mock-model");
    assert_eq!(answer["tool_calls"], Value::Null);
    assert_eq!(answer["usage"]["input_tokens"], 20);
    assert_eq!(answer["usage"]["output_tokens"], 9);
    let sent = mock.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(sent[0].header("authorization"), Some("Bearer k-123"));
    let body = &sent[0].body;
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "sys"}, {"role": "user", "content": "Hello"}])
    );
    assert_eq!(
        (&body["model"], &body["temperature"], &body["max_tokens"]),
        (&json!("mock-model"), &json!(0.0), &json!(5))
    );
    assert!(!body.to_string().contains("sk-secret"), "{body}");
    // The ledger keeps the call, never the secret.
    let ledger = serde_json::to_string(&rt.get_ledger(&run.run_id).unwrap()).unwrap();
    assert!(
        !ledger.contains("sk-secret") && !ledger.contains("k-123"),
        "{ledger}"
    );
    assert!(ledger.contains("[redacted]"));
}

#[test]
fn tool_calls_are_normalised() {
    let message = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_2", "type": "function",
         "function": {"name": "fetch_url", "arguments": "{\"url\":\"https://example.com\"}"}}]});
    let mock = LlmMock::start(vec![Reply::Json(completion(message, "tool_calls"))]);
    let (rt, _, _dir) = keyless(&mock);
    let run = ask(
        &rt,
        json!({"prompt": "fetch", "tools": [{"name": "fetch_url", "description": "Fetch a URL",
                                             "parameters": {"url": {"type": "string"}}}]}),
    );
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(
        run.output.unwrap()["answer"]["tool_calls"],
        json!([{"name": "fetch_url", "arguments": {"url": "https://example.com"}, "call_id": "call_2"}])
    );
    let body = &mock.requests()[0].body;
    assert_eq!(body["tool_choice"], "auto");
    assert_eq!(
        body["tools"][0]["function"]["parameters"]["required"],
        json!(["url"])
    );
    assert!(mock.requests()[0].header("authorization").is_none());
}

#[test]
fn a_truncated_answer_fails_once_unless_allowed() {
    let cut = || {
        Reply::Json(completion(
            json!({"role": "assistant", "content": "partial"}),
            "length",
        ))
    };
    let mock = LlmMock::start(vec![cut(), cut()]);
    let (rt, _, _dir) = keyless(&mock);
    let run = ask(&rt, json!({"prompt": "long", "max_out_tokens": 10}));
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.error.as_deref(),
        Some("llm_truncated: LLM_CALL output was truncated (finish_reason=length). Attempted max_output_tokens: 10. Increase max_output_tokens/max_out_tokens (or set allow_truncation=true).")
    );
    assert_eq!(mock.count(), 1, "never retried");
    assert_eq!(mock.requests()[0].body["max_tokens"], 10);
    let run = ask(
        &rt,
        json!({"prompt": "long", "max_out_tokens": 10, "allow_truncation": true}),
    );
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.output.unwrap()["answer"]["content"], "partial");
}

#[test]
fn a_payload_without_input_or_with_an_unknown_provider_calls_nothing() {
    let mock = LlmMock::start(vec![]);
    let (rt, _, _dir) = keyless(&mock);
    let run = ask(&rt, json!({"request": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(
        run.error.as_deref(),
        Some("invalid_effect: llm_call (node ask) requires payload.prompt or payload.messages; both were empty. Supply the flow's prompt input when starting the run (input_data.<prompt pin>), or connect/pin it in the flow.")
    );
    let run = ask(&rt, json!({"prompt": "Hello", "provider": "nope"}));
    assert_eq!(
        run.error.as_deref(),
        Some("llm_unavailable: Unknown provider: nope")
    );
    assert_eq!(mock.count(), 0);
}

#[test]
fn a_client_error_fails_at_once_and_a_server_error_is_retried() {
    let mock = LlmMock::start(vec![Reply::Status(
        400,
        json!({"error": {"message": "bad model", "type": "invalid_request_error"}}),
    )]);
    let (rt, clock, _dir) = keyless(&mock);
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.starts_with("llm_request_failed: API error (400) from http://127.0.0.1:"),
        "{error}"
    );
    assert!(
        error.ends_with("/v1/chat/completions: bad model"),
        "{error}"
    );
    assert_eq!(mock.count(), 1);

    mock.push(Reply::Status(503, json!({"error": {"message": "busy"}})));
    mock.push(Reply::text("after a retry"));
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(
        run.status,
        RunStatus::Waiting,
        "waits for its retry: {:?}",
        run.error
    );
    assert!(run
        .waiting
        .as_ref()
        .unwrap()
        .wait_key
        .starts_with("retry:ask:"));
    clock.advance(chrono::Duration::seconds(2));
    rt.drive_once().unwrap();
    // The driver's call flies: the run goes on when it lands.
    assert!(rt.wait_in_flight(std::time::Duration::from_secs(30)));
    let run = rt.get_state(&run.run_id).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.output.unwrap()["answer"]["content"], "after a retry");
    assert_eq!(mock.count(), 3);
}

#[test]
fn a_slow_or_silent_server_fails_the_call() {
    let mock = LlmMock::start(vec![
        Reply::Delay(
            std::time::Duration::from_secs(3),
            Box::new(Reply::text("late")),
        ),
        Reply::Close,
    ]);
    let (rt, _, _dir) = runtime(&mock, "STEPWELL_TEST_LLM_KEY_NONE", no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(
        run.error.as_deref().unwrap().starts_with("llm_timeout: "),
        "{:?}",
        run.error
    );
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(
        run.error
            .as_deref()
            .unwrap()
            .starts_with("llm_request_failed: "),
        "{:?}",
        run.error
    );
}

#[test]
fn usage_lands_in_limits_and_a_turn_in_the_context_when_asked() {
    let mut body = completion(json!({"role": "assistant", "content": " OK "}), "stop");
    body["usage"] = json!({"prompt_tokens": 1234, "total_tokens": 2000});
    let mock = LlmMock::start(vec![Reply::Json(body.clone()), Reply::Json(body)]);
    let (rt, _, _dir) = keyless(&mock);
    let run = ask(&rt, json!({"prompt": "Hello", "include_context": true}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.vars["_limits"]["estimated_tokens_used"], 1234);
    assert_eq!(
        run.vars["context"]["messages"],
        json!([{"role": "user", "content": "Hello", "metadata": {"kind": "llm_turn", "node_id": "ask"}},
               {"role": "assistant", "content": "OK", "metadata": {"kind": "llm_turn", "node_id": "ask"}}])
    );
    // The turn is written again from the recorded call: forks see it.
    stepwell_tests::assert_forkable(&rt, &run.run_id);
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert!(run.vars.get("context").is_none(), "only when asked");
}

/// `_absorb_failure`: the final failure (after the retries) is the effect's
/// result, and the run goes on; without it the run fails.
#[test]
fn an_absorbed_failure_is_the_result_and_the_run_goes_on() {
    let refused = || Reply::Status(400, json!({"error": {"message": "no"}}));
    let mock = LlmMock::start(vec![refused(), refused()]);
    let (rt, _, _dir) = keyless(&mock);
    let run = ask(&rt, json!({"prompt": "Hello", "_absorb_failure": true}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    let answer = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(answer["ok"], false);
    let error = answer["absorbed_failure"].as_str().unwrap();
    assert!(
        error.starts_with("llm_request_failed: API error (400)"),
        "{error}"
    );
    let ledger = rt.get_ledger(&run.run_id).unwrap();
    assert!(
        ledger
            .iter()
            .any(|r| r.status == stepwell::StepStatus::Failed && r.error.as_deref() == Some(error)),
        "the failure is recorded as a failure"
    );
    stepwell_tests::assert_forkable(&rt, &run.run_id);
    let run = ask(&rt, json!({"prompt": "Hello", "_absorb_failure": false}));
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(mock.count(), 2);
}

/// Structured output: the schema is sent as `response_format`, the answer
/// parsed into `data` and checked against it; a mismatch completes, saying
/// why in the metadata.
#[test]
fn structured_output_is_parsed_and_checked() {
    let answer = |content: &str| {
        Reply::Json(completion(
            json!({"role": "assistant", "content": content}),
            "stop",
        ))
    };
    let mock = LlmMock::start(vec![
        answer(r#"{"answer": "yes", "n": 2}"#),
        answer(r#"{"answer": "yes"}"#),
        answer("not json"),
    ]);
    let (rt, _, _dir) = keyless(&mock);
    let schema = json!({"answer": "the answer", "n": 1});
    let run = ask(&rt, json!({"prompt": "q", "response_schema": schema}));
    let out = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(out["data"], json!({"answer": "yes", "n": 2}));
    assert!(
        out["metadata"]
            .get("_structured_output_validation_error")
            .is_none(),
        "{out}"
    );
    assert_eq!(
        mock.requests()[0].body["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "StructuredOutput", "schema": {
            "type": "object", "required": ["answer", "n"],
            "properties": {"answer": {"type": "string", "description": "the answer"},
                           "n": {"type": "integer"}}}}})
    );
    let run = ask(&rt, json!({"prompt": "q", "response_schema": schema}));
    let out = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(
        out["metadata"]["_structured_output_validation_error"],
        "$.n: required"
    );
    let run = ask(&rt, json!({"prompt": "q", "response_schema": schema}));
    let out = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(out["data"], Value::Null);
    assert!(
        out["metadata"]["_structured_output_parse_error"].is_string(),
        "{out}"
    );
}

/// A redirect is not followed: the key goes only to the URL its profile
/// names.
#[test]
fn a_redirect_is_not_followed() {
    let elsewhere = LlmMock::start(vec![Reply::text("stolen")]);
    let mock = LlmMock::start(vec![Reply::Redirect(format!(
        "{}/chat/completions",
        elsewhere.base_url
    ))]);
    std::env::set_var("STEPWELL_TEST_LLM_KEY_REDIRECT", "k-secret");
    let (rt, _, _dir) = runtime(&mock, "STEPWELL_TEST_LLM_KEY_REDIRECT", no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    assert!(
        run.error
            .as_deref()
            .unwrap()
            .starts_with("llm_request_failed: API error (307)"),
        "{:?}",
        run.error
    );
    assert_eq!((mock.count(), elsewhere.count()), (1, 0));
}

/// #15: with tools offered and a workspace scope, the system prompt ends
/// with the scope described once (the same every time); without tools or
/// without a scope, it is the authored one; the recorded payload is the
/// authored one.
#[test]
fn the_workspace_is_disclosed_only_with_tools_and_a_scope() {
    let mock = LlmMock::always(Reply::text("ok"));
    let (rt, _, dir) = keyless(&mock);
    let ws = dir.path().join("ws");
    let tools = json!([{"name": "read_file", "description": "Read", "parameters": {"type": "object", "properties": {}}}]);
    let run = |payload: Value, scoped: bool| {
        let mut v = json!({"llm": payload});
        if scoped {
            v["workspace_root"] = json!(ws.to_str().unwrap());
        }
        rt.run(
            "ask-llm",
            stepwell::StartOptions {
                vars: vars(v),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let system = |i: usize| {
        mock.requests()[i].body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let with = json!({"prompt": "hi", "system_prompt": "sys", "tools": tools});
    let first = run(with.clone(), true);
    run(with.clone(), true);
    let s0 = system(0);
    assert!(s0.starts_with("sys\n\nWorkspace access ("), "{s0}");
    assert_eq!(s0.matches("Workspace access (").count(), 1);
    assert!(
        s0.contains(&format!(
            "Default working directory: \"{}\"",
            ws.canonicalize().unwrap().display()
        )),
        "{s0}"
    );
    assert_eq!(system(1), s0);
    let ledger = rt.get_ledger(&first.run_id).unwrap();
    let recorded = ledger.iter().find_map(|r| r.effect.as_ref()).unwrap();
    assert_eq!(recorded.payload["system_prompt"], "sys");
    run(json!({"prompt": "hi", "system_prompt": "sys"}), true);
    assert_eq!(system(2), "sys");
    run(with, false);
    assert_eq!(system(3), "sys");
}

/// An aborted generation (text, no tool call, an all-zero usage block)
/// completes, flagged in its metadata; a normal answer is not flagged, nor
/// one without usage.
#[test]
fn an_aborted_generation_is_flagged() {
    let aborted = completion(
        json!({"role": "assistant", "content": "I'll read the file now:"}),
        "stop",
    );
    let mut zero = aborted.clone();
    zero["usage"] = json!({"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0});
    let mut no_usage = aborted.clone();
    no_usage.as_object_mut().unwrap().remove("usage");
    let mock = LlmMock::start(vec![
        Reply::Json(zero),
        Reply::Json(no_usage),
        Reply::text("fine"),
    ]);
    let (rt, _, _dir) = keyless(&mock);
    let flagged = ask(&rt, json!({"prompt": "go"}));
    assert_eq!(flagged.status, stepwell::RunStatus::Completed);
    let meta = &flagged.output.as_ref().unwrap()["answer"]["metadata"];
    assert_eq!(meta["generation_aborted"], true, "{meta}");
    assert_eq!(meta["truncation_kind"], "aborted_generation");
    assert_eq!(
        meta["_runtime_observability"]["aborted_generation"]["content_preview"],
        "I'll read the file now:"
    );
    for _ in 0..2 {
        let run = ask(&rt, json!({"prompt": "go"}));
        let meta = &run.output.as_ref().unwrap()["answer"]["metadata"];
        assert!(meta.get("generation_aborted").is_none(), "{meta}");
    }
}

/// Structured output with `structured_output_fallback`: an answer that
/// does not match the schema gets one repair call (the reference's prompt,
/// no tools, no messages); a repaired answer completes with
/// `_structured_output_repair`; a repair that still fails fails the effect,
/// not retryable, after exactly two requests.
#[test]
fn a_structured_answer_is_repaired_once_when_asked() {
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let mock = LlmMock::start(vec![
        Reply::text("{\"n\": \"seven\"}"),
        Reply::text("{\"n\": 7}"),
        Reply::text("not json"),
        Reply::text("still not json"),
    ]);
    let (rt, _, _dir) = keyless(&mock);
    let payload = json!({"prompt": "count", "response_schema": schema,
                         "structured_output_fallback": true, "tools": [{"name": "t", "parameters": {}}]});
    let run = ask(&rt, payload.clone());
    assert_eq!(run.status, stepwell::RunStatus::Completed, "{run:?}");
    let answer = &run.output.as_ref().unwrap()["answer"];
    assert_eq!(answer["data"], json!({"n": 7}));
    assert_eq!(
        answer["metadata"]["_structured_output_repair"]["used"],
        true
    );
    let repair = &mock.requests()[1].body;
    let prompt = repair["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        prompt.starts_with(
            "You returned structured output that does not satisfy the required JSON schema."
        ),
        "{prompt}"
    );
    assert!(
        prompt.contains("Original task:\ncount") && prompt.contains("{\"n\": \"seven\"}"),
        "{prompt}"
    );
    assert!(repair.get("tools").is_none());

    let failed = ask(&rt, payload);
    assert_eq!(failed.status, stepwell::RunStatus::Failed);
    let e = failed.error.unwrap();
    assert!(
        e.contains("llm_structured_output: LLM_CALL structured output repair failed:"),
        "{e}"
    );
    assert!(e.contains("repair content=still not json"), "{e}");
    assert_eq!(
        mock.count(),
        4,
        "one call and one repair each, never retried"
    );
}

/// Settings holding only `pairs` (the binary's are its environment).
fn settings(pairs: &[(&str, String)]) -> Settings {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Settings::new(move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
}

/// The profile `mock` at `url`, its `proxy` as given, with the host's proxy
/// settings `host`.
fn proxied(url: &str, proxy: Option<&str>, host: &Settings) -> Providers {
    Providers::only(Provider {
        timeout_s: Some(5.0),
        proxy: proxy.map(str::to_string),
        ..Provider::new("mock", url, Some("mock-model"))
    })
    .with_proxies(host)
}

/// The host's `HTTP_PROXY` (with credentials) carries a call to a plain
/// HTTP provider in absolute form, with `Proxy-Authorization`; `NO_PROXY`
/// and a profile's `"proxy": "none"` send it straight to the provider.
#[test]
fn a_call_goes_through_the_hosts_proxy_unless_told_otherwise() {
    let proxy = stepwell_tests::proxy::Proxy::start(false);
    let mock = LlmMock::always(Reply::text("hello"));
    let with_creds = proxy.url.replace("http://", "http://ada:s%40cret@");
    let host = settings(&[("HTTP_PROXY", with_creds.clone())]);
    let (rt, _, _dir) = runtime_over(proxied(&mock.base_url, None, &host), no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(run.output.unwrap()["answer"]["content"], "hello");
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen[0].line,
        format!("POST {}/chat/completions HTTP/1.1", mock.base_url)
    );
    // base64 of "ada:s@cret" (the URL's %40 decoded).
    assert_eq!(seen[0].auth.as_deref(), Some("Basic YWRhOnNAY3JldA=="));
    assert_eq!(mock.count(), 1);
    // NO_PROXY names the provider's host: straight there.
    let host = settings(&[
        ("HTTP_PROXY", with_creds.clone()),
        ("NO_PROXY", "localhost, 127.0.0.1".into()),
    ]);
    let (rt, _, _dir) = runtime_over(proxied(&mock.base_url, None, &host), no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    // Credentials in the provider's URL never reach the proxy.
    let with_user = mock.base_url.replace("http://", "http://bob:basekey@");
    let host = settings(&[("HTTP_PROXY", proxy.url.clone())]);
    let (rt, _, _dir) = runtime_over(proxied(&with_user, None, &host), no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    let seen = proxy.seen();
    assert_eq!(
        seen[1].line,
        format!("POST {}/chat/completions HTTP/1.1", mock.base_url)
    );
    // A profile's own "none" wins over the host's settings.
    let host = settings(&[("http_proxy", with_creds)]);
    let (rt, _, _dir) = runtime_over(proxied(&mock.base_url, Some("none"), &host), no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    assert_eq!(proxy.seen().len(), 2, "{:?}", proxy.seen());
    assert_eq!(mock.count(), 4);
}

/// An HTTPS provider is reached through a `CONNECT` tunnel carrying the
/// proxy's credentials; a proxy that refuses it fails the call with a
/// message that names the proxy. A proxy that is not `http://` is refused
/// before anything is sent.
#[test]
fn an_https_call_tunnels_through_the_proxy_and_a_refusal_names_it() {
    let proxy = stepwell_tests::proxy::Proxy::start(true);
    let addr = proxy.url.trim_start_matches("http://").to_string();
    let host = settings(&[(
        "HTTPS_PROXY",
        proxy.url.replace("http://", "http://ada:pw@"),
    )]);
    let url = "https://models.example.test/v1";
    let (rt, _, _dir) = runtime_over(proxied(url, None, &host), no_retries());
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.starts_with("llm_request_failed: https://models.example.test/v1/chat/completions (through the proxy ")
            && error.contains(&addr),
        "{error}"
    );
    let seen = proxy.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].line, "CONNECT models.example.test:443 HTTP/1.1");
    assert_eq!(seen[0].auth.as_deref(), Some("Basic YWRhOnB3"));
    // A proxy named but not usable (a SOCKS one, a password with an
    // unencoded `/`, a URL that does not parse): refused, nothing sent,
    // nothing of it echoed.
    let mock = LlmMock::always(Reply::text("direct"));
    for bad in [
        "socks://127.0.0.1:1080",
        "http://ada:se/cret@127.0.0.1:3128",
        "http://ada:secret@bad host:3128",
    ] {
        let host = settings(&[("HTTP_PROXY", bad.to_string())]);
        let (rt, _, _dir) = runtime_over(proxied(&mock.base_url, None, &host), no_retries());
        let run = ask(&rt, json!({"prompt": "Hello"}));
        let error = run.error.unwrap();
        assert!(
            error.starts_with("llm_unavailable: HTTP_PROXY: "),
            "{bad}: {error}"
        );
        assert!(!error.contains("cret"), "{bad}: {error}");
    }
    assert_eq!(mock.count(), 0, "nothing went around the proxy");
    // A SOCKS proxy named by a profile: refused, nothing sent.
    let (rt, _, _dir) = runtime_over(
        proxied(url, Some("socks5://127.0.0.1:1080"), &Settings::default()),
        no_retries(),
    );
    let run = ask(&rt, json!({"prompt": "Hello"}));
    assert_eq!(run.status, RunStatus::Failed);
    let error = run.error.unwrap();
    assert!(
        error.starts_with(
            "llm_unavailable: profile mock: proxy: a socks5:// proxy is not supported"
        ),
        "{error}"
    );
}

//! Traces: `stepwell serve --otlp-endpoint` sends its spans to a real
//! OTLP/HTTP collector on loopback (`support/otlp.rs`, which decodes the
//! protobuf itself), and a caller's W3C `traceparent` is continued.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};
use stepwell_tests::llm_mock::{LlmMock, Reply};
use stepwell_tests::otlp::{Collector, Received};
use stepwell_tests::repo;
use stepwell_tests::served::Served;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const START_SPAN: &str = "b7ad6b7169203331";
const RESUME_SPAN: &str = "00f067aa0ba902b7";

/// `POST path` with `body`, the token and a `traceparent` of `span` in
/// [`TRACE`].
fn post_traced(s: &Served, path: &str, body: Value, span: &str) -> (u16, Value) {
    let mut r = s
        .agent
        .post(format!("{}{path}", s.url))
        .header("Authorization", format!("Bearer {}", s.token))
        .header("Content-Type", "application/json")
        .header("traceparent", format!("00-{TRACE}-{span}-01"))
        .send(body.to_string())
        .unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().unwrap_or(Value::Null))
}

/// The run once its status is no longer `from`.
fn settled(s: &Served, id: &str, from: &str) -> Value {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let run = s.ok(&format!("/v1/runs/{id}"));
        if run["status"] != from {
            return run;
        }
        assert!(std::time::Instant::now() < until, "still {from}: {run}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The spans by id, and a span's ancestors (nearest first).
struct Tree<'a> {
    by_id: HashMap<&'a str, &'a Received>,
}

impl<'a> Tree<'a> {
    fn new(spans: &'a [Received]) -> Tree<'a> {
        Tree {
            by_id: spans.iter().map(|s| (s.span_id.as_str(), s)).collect(),
        }
    }

    fn ancestors(&self, s: &'a Received) -> Vec<&'a Received> {
        let mut out = Vec::new();
        let mut at = s;
        while let Some(p) = at.parent.as_deref().and_then(|p| self.by_id.get(p)) {
            out.push(*p);
            at = p;
        }
        out
    }

    fn names_up(&self, s: &'a Received) -> Vec<&'a str> {
        self.ancestors(s).iter().map(|a| a.name.as_str()).collect()
    }
}

fn one<'a>(spans: &'a [Received], name: &str) -> &'a Received {
    let found: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "spans named {name}: {found:#?}");
    found[0]
}

/// The agent flow over HTTP, started and resumed with a caller's
/// `traceparent`: the model's call for `write_file` waits for approval,
/// the resume approves it, the model answers. Every span of the run is in
/// the caller's trace, under the caller's spans, with the attributes an
/// operator reads (model, tokens, tool, class, approval).
#[test]
fn an_agent_run_with_an_approved_tool_is_one_trace_from_the_callers_span() {
    let collector = Collector::start();
    let mock = LlmMock::start(vec![
        Reply::tool_call(
            "call_1",
            "write_file",
            json!({"file_path": "note.txt", "content": "traced\n"}),
        ),
        Reply::text("I wrote note.txt."),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let s = Served::start_with(
        dir,
        &["--otlp-endpoint", &collector.endpoint],
        &[
            ("OPENAI_BASE_URL", &mock.base_url),
            ("OPENAI_MODEL", "mock-model"),
            ("OTEL_SERVICE_NAME", "stepwell-under-test"),
        ],
    );
    let agent = repo().join("flows/agent");
    let (status, run) = post_traced(
        &s,
        "/v1/runs",
        json!({"bundle": agent.display().to_string(),
               "vars": {"prompt": "Write note.txt", "workspace_root": ws.display().to_string()}}),
        START_SPAN,
    );
    assert_eq!(status, 201, "{run}");
    let id = run["run_id"].as_str().unwrap().to_string();
    let run = settled(&s, &id, "running");
    assert_eq!(
        run["waiting"]["details"]["mode"], "approval_required",
        "{run}"
    );
    let (status, _) = post_traced(
        &s,
        &format!("/v1/runs/{id}/resume"),
        json!({"payload": {"approved": true}}),
        RESUME_SPAN,
    );
    // The batch runs in flight: accepted, the run waits until it lands.
    assert_eq!(status, 202);
    let done = settled(&s, &id, "waiting");
    // Then the agent's next model call flies too.
    let done = match done["status"].as_str() {
        Some("running") => settled(&s, &id, "running"),
        _ => done,
    };
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        std::fs::read_to_string(ws.join("note.txt")).unwrap(),
        "traced\n"
    );

    let spans = collector.wait(Duration::from_secs(15), |spans| {
        spans.iter().any(|s| s.name == "stepwell.run")
            && spans.iter().filter(|s| s.name == "llm.call").count() == 2
    });
    let spans: Vec<Received> = spans.into_iter().filter(|s| s.trace_id == TRACE).collect();
    let tree = Tree::new(&spans);
    for s in &spans {
        assert_eq!(s.resource["service.name"], "stepwell-under-test");
        assert_eq!(s.scope, "stepwell");
        assert!(s.end >= s.start && s.start > 0, "{s:?}");
    }
    // The start: a server span under the caller's, the run's span under it.
    let start = one(&spans, "POST /v1/runs");
    assert_eq!(start.parent.as_deref(), Some(START_SPAN));
    assert_eq!(start.kind, 2);
    assert_eq!(start.attr("http.response.status_code"), 201);
    assert_eq!(start.attr("http.route"), "/v1/runs");
    let whole = one(&spans, "stepwell.run");
    assert_eq!(whole.parent.as_deref(), Some(start.span_id.as_str()));
    assert_eq!(whole.attr("stepwell.run_id"), id.as_str());
    assert_eq!(whole.attr("stepwell.status"), "completed");
    assert_eq!(whole.attr("stepwell.workflow_id"), "agent");
    // The model calls: client spans in flight, under their effect's span,
    // under a step of a tick of this run.
    let calls: Vec<_> = spans.iter().filter(|s| s.name == "llm.call").collect();
    for call in &calls {
        assert_eq!(call.kind, 3);
        assert_eq!(call.attr("gen_ai.request.model"), "mock-model");
        assert_eq!(call.attr("gen_ai.response.model"), "mock-model");
        assert_eq!(call.attr("gen_ai.usage.input_tokens"), 20);
        assert_eq!(call.attr("gen_ai.usage.output_tokens"), 9);
        assert_eq!(call.attr("stepwell.run_id"), id.as_str());
        let up = tree.ancestors(call);
        assert_eq!(up[0].name, "stepwell.effect", "{:?}", tree.names_up(call));
        assert_eq!(up[0].attr("stepwell.effect.kind"), "llm_call");
        assert_eq!(up[0].attr("stepwell.effect.class"), "external");
        assert_eq!(up[0].attr("stepwell.effect.in_flight"), true);
        assert_eq!(up[1].name, "stepwell.step");
        assert_eq!(up[2].name, "stepwell.tick");
        assert_eq!(up[2].attr("stepwell.run_id"), id.as_str());
    }
    let finishes: Vec<&Value> = calls
        .iter()
        .map(|c| c.attr("gen_ai.response.finish_reasons"))
        .collect();
    assert!(finishes.contains(&&json!("tool_calls")), "{finishes:?}");
    // The first call was made inside the start's tick: under its span.
    assert!(calls.iter().any(|c| tree.ancestors(c).contains(&start)));
    // The approved tool call: under the span of the resume's work in
    // flight, under the resume's span, under the server span of the
    // caller's resume.
    let tool = one(&spans, "tool.call");
    assert_eq!(tool.attr("stepwell.tool.name"), "write_file");
    assert_eq!(tool.attr("stepwell.tool.class"), "write");
    assert_eq!(tool.attr("stepwell.tool.approval"), "approved");
    assert_eq!(tool.attr("stepwell.tool.call_id"), "call_1");
    assert_eq!(tool.status.0, 0, "{tool:?}");
    let up = tree.names_up(tool);
    assert_eq!(
        up,
        [
            "stepwell.effect",
            "stepwell.resume",
            "POST /v1/runs/{id}/resume"
        ],
        "{up:?}"
    );
    let resume = one(&spans, "POST /v1/runs/{id}/resume");
    assert_eq!(resume.parent.as_deref(), Some(RESUME_SPAN));
    // The guest calls, each under a step, naming its node; the commits.
    let guests: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "stepwell.guest")
        .collect();
    assert!(guests.len() >= 3, "{guests:#?}");
    for g in &guests {
        assert_eq!(tree.ancestors(g)[0].name, "stepwell.step");
        assert!(g.attr("stepwell.node_id").is_string());
    }
    assert!(
        spans
            .iter()
            .any(|s| s.name == "stepwell.commit"
                && tree.names_up(s).first() == Some(&"stepwell.step"))
    );
    // Every span of the run's work is in the caller's trace.
    let strays: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.attr("stepwell.run_id") == id.as_str() && s.trace_id != TRACE)
        .collect();
    assert!(strays.is_empty(), "{strays:#?}");
    let requests = collector.requests();
    assert!(requests
        .iter()
        .all(|r| r.starts_with("POST /v1/traces ") && r.ends_with("application/x-protobuf")));
}

/// Without `--otlp-endpoint` nothing is sent and a run keeps no trace.
#[test]
fn without_an_endpoint_no_span_is_made_and_nothing_is_kept() {
    let collector = Collector::start();
    let s = Served::start(&[]);
    let (status, run) = post_traced(
        &s,
        "/v1/runs",
        json!({"bundle": repo().join("flows/examples/hello").display().to_string()}),
        START_SPAN,
    );
    assert_eq!(status, 201, "{run}");
    assert_eq!(run["status"], "completed");
    assert!(run["vars"]["_runtime"].get("trace").is_none(), "{run}");
    std::thread::sleep(Duration::from_millis(1500));
    assert!(collector.requests().is_empty());
}

/// A run that its resume ends (an `ask_user` with no node after it) gets
/// its `stepwell.run` span, and a malformed `traceparent` starts a trace
/// of its own instead of failing the request.
#[test]
fn a_run_its_resume_ends_has_its_span_and_a_bad_traceparent_is_ignored() {
    let collector = Collector::start();
    let dir = tempfile::tempdir().unwrap();
    let bundle = stepwell_tests::write_bundle(
        dir.path(),
        "ask-once",
        &[(
            "flow.json",
            json!({"workflow_id": "ask-once", "entry": "ask", "nodes": {
                "ask": {"effect": "ask_user", "payload": {"prompt": "Name?"}, "result_key": "name"}}}),
        )],
    );
    let s = Served::start_with(dir, &["--otlp-endpoint", &collector.endpoint], &[]);
    let (status, run) = post_traced(
        &s,
        "/v1/runs",
        json!({"bundle": bundle.display().to_string()}),
        START_SPAN,
    );
    assert_eq!(
        (status, run["status"].as_str()),
        (201, Some("waiting")),
        "{run}"
    );
    let id = run["run_id"].as_str().unwrap().to_string();
    // Uppercase hex: not a traceparent W3C allows.
    let bad = "00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01";
    let mut r = s
        .agent
        .post(format!("{}/v1/runs/{id}/resume", s.url))
        .header("Authorization", format!("Bearer {}", s.token))
        .header("Content-Type", "application/json")
        .header("traceparent", bad)
        .send(json!({"payload": "Ada"}).to_string())
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let done: Value = r.body_mut().read_json().unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let spans = collector.wait(Duration::from_secs(15), |spans| {
        spans.iter().any(|s| s.name == "stepwell.run")
            && spans.iter().any(|s| s.name == "POST /v1/runs/{id}/resume")
    });
    let whole = one(&spans, "stepwell.run");
    assert_eq!(whole.trace_id, TRACE);
    assert_eq!(whole.attr("stepwell.status"), "completed");
    let resume = one(&spans, "POST /v1/runs/{id}/resume");
    assert_ne!(resume.trace_id, TRACE);
    assert_ne!(
        resume.trace_id.to_uppercase(),
        "0AF7651916CD43DD8448EB211C80319C"
    );
    assert_eq!(resume.parent, None);
    // The request's own trace holds the resume's work, linked to the run.
    let tree = Tree::new(&spans);
    let tick = spans
        .iter()
        .find(|s| s.name == "stepwell.tick" && s.trace_id == resume.trace_id)
        .expect("the resume's tick");
    assert!(tree.ancestors(tick).contains(&resume));
    let linked: Vec<_> = spans
        .iter()
        .filter(|s| s.trace_id == resume.trace_id && !s.links.is_empty())
        .collect();
    assert!(
        linked.iter().any(|s| s
            .links
            .contains(&(TRACE.to_string(), whole.span_id.clone()))),
        "{linked:#?}"
    );
}

//! The routes: the JSON API under `/v1`, the dashboard, `/openapi.json`
//! and `/metrics`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use stepwell::triggers::{Connections as _, Webhooks as _};

use axum::extract::{ConnectInfo, FromRequest, MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::listing::{flow_json, windowed_page, Window};
use super::Shared;
use stepwell::automation::{
    apply_automation_command, create_automation, list_attention, list_automations,
    list_occurrences, pending_waits, show_automation, start_discussion, Command, DiscussionRequest,
};
use stepwell::core::trace::{Span, SpanContext, SpanKind};
use stepwell::core::Error;
use stepwell::tools::ToolsExt;
use stepwell::triggers::TriggersExt;
use stepwell::{RunQuery, RunState, RunStatus, StartOptions, WaitReason};

type S = State<Arc<Shared>>;
pub(crate) type ApiResult<T = Response> = Result<T, ApiError>;

/// The pools the server's runtime calls queue in, each bounded on its own,
/// so that one kind of work never waits behind another: reads never queue
/// behind run execution, and webhook intake never behind starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pool {
    /// Reads: runs, ledgers, lists, metrics.
    Read,
    /// Calls that execute runs or change state: starts, resumes, cancels,
    /// commands.
    Work,
    /// Webhook intake.
    Webhook,
}

/// How long a call may queue for its pool before the server answers `503
/// server_busy` (with `Retry-After`) instead of hanging.
const QUEUE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

impl Pool {
    /// The pool's permits: a few per core. More would only contend for the
    /// store's write lock (SQLite retries a busy lock with growing sleeps,
    /// which makes the slowest caller very slow); queued here, callers are
    /// served in the order they came.
    fn permits(self) -> &'static tokio::sync::Semaphore {
        static POOLS: std::sync::OnceLock<[tokio::sync::Semaphore; 3]> = std::sync::OnceLock::new();
        let pools = POOLS.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            let work = (cores * 4).max(8);
            [
                tokio::sync::Semaphore::new(work * 2),
                tokio::sync::Semaphore::new(work),
                tokio::sync::Semaphore::new(work),
            ]
        });
        &pools[self as usize]
    }
}

/// Runs `f` on the blocking pool (the runtime's calls block: store
/// commits, guest calls) as a call of the [`Pool::Work`] pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> ApiResult<T> {
    blocking_in(Pool::Work, f).await
}

/// [`blocking`] as a read ([`Pool::Read`]).
pub(crate) async fn read<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> ApiResult<T> {
    blocking_in(Pool::Read, f).await
}

/// Runs `f` on the blocking pool as a call of `pool`, after at most
/// [`QUEUE_DEADLINE`] in its queue (else `503 server_busy`).
pub(crate) async fn blocking_in<T: Send + 'static>(
    pool: Pool,
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> ApiResult<T> {
    let permit = tokio::time::timeout(QUEUE_DEADLINE, pool.permits().acquire()).await;
    let _permit = match permit {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) => return Err(ApiError::internal("the server is shutting down")),
        Err(_) => {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                format!(
                    "every {} slot of the server stayed busy for {} s: try again shortly",
                    match pool {
                        Pool::Read => "read",
                        Pool::Work => "run",
                        Pool::Webhook => "webhook",
                    },
                    QUEUE_DEADLINE.as_secs()
                ),
            ))
        }
    };
    // The request's span is the parent of the spans of the work it does.
    let span = HTTP_SPAN.try_with(|c| *c).ok().flatten();
    let f = move || {
        let _scope = stepwell::core::trace::scope(span);
        f()
    };
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(e) => Err(ApiError::internal(format!("the call panicked: {e}"))),
    }
}

/// A JSON body, parsed strictly: an unknown field, a value of the wrong
/// type or an integer no 64-bit integer holds is `400 invalid_input` naming
/// it (`body.vars`), a body over the limit `413 payload_too_large`; read
/// under the server's deadline and budget for bodies (`408
/// request_timeout`, `503 server_busy`).
pub(crate) struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<Shared>> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<Shared>) -> Result<Self, ApiError> {
        let body = state.bodies.read(req.into_body()).await?;
        let bytes: &[u8] = if body.bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &body.bytes
        };
        if let Some(found) = std::str::from_utf8(bytes)
            .ok()
            .and_then(stepwell_flat_json::find_inexact_integer)
        {
            return Err(ApiError::invalid(
                &stepwell::core::config::inexact_field("body", &found.path),
                stepwell::core::config::inexact_message(&found.literal),
            ));
        }
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let value: T = serde_path_to_error::deserialize(&mut *de).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." || path == "?" || path.is_empty() {
                "body".to_string()
            } else {
                format!("body.{path}")
            };
            ApiError::invalid(&field, e.into_inner().to_string())
        })?;
        // One JSON value and nothing after it.
        de.end()
            .map_err(|e| ApiError::invalid("body", format!("text after the JSON value: {e}")))?;
        Ok(Body(value))
    }
}

/// Query parameters, with a typed error.
pub(crate) struct Params<T>(pub T);

impl<St: Send + Sync, T: DeserializeOwned> axum::extract::FromRequestParts<St> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &St,
    ) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| Params(q))
            .map_err(|e| ApiError::invalid("query", e.body_text()))
    }
}

/// A request's (method, route, status).
type RequestKind = (String, String, u16);

/// How many requests of a kind, and their total time in microseconds.
type RequestCount = (u64, u64);

/// Requests counted by route, method and status, and their time.
#[derive(Default)]
pub(crate) struct HttpCounters {
    counts: parking_lot::Mutex<BTreeMap<RequestKind, RequestCount>>,
}

impl HttpCounters {
    fn count(&self, method: &str, route: &str, status: u16, micros: u64) {
        let mut c = self.counts.lock();
        let e = c
            .entry((method.to_string(), route.to_string(), status))
            .or_default();
        e.0 += 1;
        e.1 += micros;
    }
}

/// The whole application.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.bodies.max_body_bytes;
    let open = Router::new()
        .route("/", get(dashboard_index))
        .route("/assets/app.js", get(dashboard_js))
        .route("/assets/app.css", get(dashboard_css))
        .route("/v1/health", get(health))
        .route("/openapi.json", get(openapi))
        // The signature is the credential: no token.
        .route("/v1/hooks/{connection_id}", post(receive_webhook));
    let guarded = Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/runs", get(list_runs).post(start_run))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/resume", post(resume_run))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/runs/{id}/ledger", get(run_ledger))
        .route("/v1/runs/{id}/flow", get(run_flow))
        .route("/v1/runs/{id}/export", get(export_run))
        .route("/v1/runs/{id}/fork", post(fork_run))
        .route("/v1/runs/{id}/fork-points", get(fork_points))
        .route("/v1/runs/{id}/evidence", get(run_evidence))
        .route("/v1/runs/{id}/ledger/verify", get(verify_ledger))
        .route(
            "/v1/runs/{id}/ledger/stream",
            get(super::stream::run_stream),
        )
        .route("/v1/runs/{id}/snapshots", post(create_snapshot))
        .route("/v1/stream", get(super::stream::store_stream))
        .route("/v1/waits", get(list_waits))
        .route("/v1/snapshots", get(list_snapshots))
        .route("/v1/snapshots/{id}/restore", post(restore_snapshot))
        .route("/v1/sessions/{id}/turns", get(session_turns))
        .route("/v1/sessions/{id}/history", get(session_history))
        .route(
            "/v1/automations",
            get(automations_list).post(automations_create),
        )
        .route("/v1/automations/{id}", get(automations_show))
        .route("/v1/automations/{id}/commands", post(automations_command))
        .route(
            "/v1/automations/{id}/occurrences",
            get(automations_occurrences),
        )
        .route("/v1/automations/{id}/waits", get(automations_waits))
        .route("/v1/automations/{id}/attention", get(automations_attention))
        .route("/v1/automations/{id}/runs", get(super::ahp::run_summaries))
        .route(
            "/v1/automations/{id}/discussions",
            post(automations_discuss),
        )
        .route("/v1/quarantined", get(quarantined_list))
        .route("/v1/workflows", get(workflows_list))
        .route("/v1/workflows/{id}/versions", get(workflow_versions))
        .route("/v1/deployments", post(deploy))
        .route("/v1/triggers", get(triggers_list))
        .route("/v1/triggers/{source}/validate", post(triggers_validate))
        .route("/v1/triggers/{source}/preview", post(triggers_preview))
        .route("/v1/tools", get(tools_list))
        .route(
            "/v1/connections",
            get(connections_list).post(connections_create),
        )
        .route("/v1/connections/{id}", get(connections_show))
        .route("/v1/connections/{id}/disable", post(connections_disable))
        .route("/v1/connections/{id}/enable", post(connections_enable))
        .route(
            "/v1/connections/{id}/rotate-secret",
            post(connections_rotate),
        )
        .route(
            "/v1/connections/{id}/events",
            get(connections_events).post(connections_send),
        )
        .route("/v1/ahp", get(super::ahp::upgrade))
        .route_layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            require_token,
        ));
    open.merge(guarded)
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take this method (see /openapi.json)",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            observe,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(shared)
}

tokio::task_local! {
    /// The span of the request a task serves (tracing on), for the work it
    /// hands to the blocking pool.
    static HTTP_SPAN: Option<stepwell::core::trace::SpanContext>;
}

/// The span of a request (nothing when tracing is off): a server span
/// that continues the caller's trace if it sent a W3C `traceparent`.
fn request_span(s: &Shared, req: &Request, method: &str, route: &str) -> Span {
    let tracer = s.rt.tracer();
    if !tracer.is_on() {
        return Span::none();
    }
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(SpanContext::from_traceparent);
    // A request without one starts a trace of its own.
    let mut span = tracer.start(format!("{method} {route}"), parent);
    span.kind(SpanKind::Server);
    if parent.is_some() {
        span.remote_parent();
    }
    span.attr("http.request.method", method);
    span.attr("http.route", route);
    span
}

/// Counts and logs every request, and adds the headers every answer
/// carries.
async fn observe(State(s): S, req: Request, next: Next) -> Response {
    let started = Instant::now();
    // Only the standard methods are counted and logged by name: any other
    // token is one label (a client cannot grow the counters or the log).
    let method = match req.method().as_str() {
        m @ ("GET" | "POST" | "PUT" | "DELETE" | "PATCH" | "HEAD" | "OPTIONS") => m.to_string(),
        _ => "OTHER".to_string(),
    };
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "(unmatched)".into());
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    let mut span = request_span(&s, &req, &method, &route);
    let mut response = HTTP_SPAN.scope(span.context(), next.run(req)).await;
    let status = response.status().as_u16();
    span.attr("http.response.status_code", status as i64);
    if status >= 500 {
        span.fail(format!("HTTP {status}"));
    }
    drop(span);
    let micros = started.elapsed().as_micros() as u64;
    s.http.count(&method, &route, status, micros);
    tracing::info!(%method, %route, status, micros, %peer, "request");
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// Compares in time independent of where the texts differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token, from `Authorization: Bearer <token>` or, for a
/// WebSocket (browsers cannot set its headers), the subprotocol
/// `bearer.<token>`.
fn presented_token(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        return v
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim().to_string());
    }
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    req.headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(',')
                .map(str::trim)
                .find_map(|p| p.strip_prefix("bearer."))
                .map(str::to_string)
        })
}

async fn require_token(State(s): S, req: Request, next: Next) -> Response {
    match presented_token(&req) {
        Some(t) if same_secret(t.as_bytes(), s.token.as_bytes()) => next.run(req).await,
        presented => {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                if presented.is_some() {
                    "the token is wrong"
                } else {
                    "send the token: Authorization: Bearer <token> (the server printed where it is)"
                },
            )
            .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"stepwell\""),
            );
            r
        }
    }
}

fn created(value: Value) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

fn ok(value: Value) -> Response {
    Json(value).into_response()
}

fn run_json(run: &RunState) -> Value {
    serde_json::to_value(run).unwrap_or(Value::Null)
}

// ---------------------------------------------------------------- static

/// The dashboard's file `name`: embedded in the binary, or read from the
/// server's dashboard folder at each request (for working on the dashboard
/// without rebuilding; the binary's `STEPWELL_DASHBOARD_DIR`).
fn dashboard_file(s: &Shared, name: &str, embedded: &'static str) -> String {
    match &s.dashboard_dir {
        Some(dir) => {
            std::fs::read_to_string(dir.join(name)).unwrap_or_else(|_| embedded.to_string())
        }
        None => embedded.to_string(),
    }
}

fn asset(content_type: &'static str, body: String) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
            ),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

async fn dashboard_index(State(s): S) -> Response {
    asset(
        "text/html; charset=utf-8",
        dashboard_file(&s, "index.html", include_str!("dashboard/index.html")),
    )
}

async fn dashboard_js(State(s): S) -> Response {
    asset(
        "text/javascript; charset=utf-8",
        dashboard_file(&s, "app.js", include_str!("dashboard/app.js")),
    )
}

async fn dashboard_css(State(s): S) -> Response {
    asset(
        "text/css; charset=utf-8",
        dashboard_file(&s, "app.css", include_str!("dashboard/app.css")),
    )
}

async fn health() -> Response {
    ok(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")}))
}

async fn openapi() -> Response {
    ok(super::openapi::openapi_document())
}

// ---------------------------------------------------------------- runs

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListRuns {
    status: Option<String>,
    wait_reason: Option<String>,
    workflow_id: Option<String>,
    parent_run_id: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
    view: Option<String>,
}

/// A run as a list shows it with `view=summary`: everything but its vars
/// and output, and of its wait only what says what it waits on (a tool
/// approval's call names, not their arguments). A page stays small
/// whatever the runs hold.
pub(crate) fn run_summary(run: &RunState) -> Value {
    let waiting = run.waiting.as_ref().map(|w| {
        let mut v = json!({"reason": w.reason.as_str(), "wait_key": w.wait_key});
        for (key, value) in [
            ("until", w.until.as_ref().map(|u| json!(u))),
            ("prompt", w.prompt.as_ref().map(|p| json!(p))),
            ("choices", w.choices.as_ref().map(|c| json!(c))),
        ] {
            if let Some(value) = value {
                v[key] = value;
            }
        }
        if let Some(d) = &w.details {
            let mut details = serde_json::Map::new();
            for key in ["mode", "sub_run_id"] {
                if let Some(x) = d.get(key) {
                    details.insert(key.into(), x.clone());
                }
            }
            if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
                let names: Vec<Value> = calls
                    .iter()
                    .map(|c| json!({"name": c["name"], "call_id": c["call_id"]}))
                    .collect();
                details.insert("tool_calls".into(), Value::Array(names));
            }
            v["details"] = Value::Object(details);
        }
        v
    });
    json!({
        "run_id": run.run_id,
        "workflow_id": run.workflow_id,
        "workflow_version": run.workflow_version,
        "status": run.status.as_str(),
        "version": run.version,
        "current_node": run.current_node,
        "waiting": waiting,
        "error": run.error,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "actor_id": run.actor_id,
        "session_id": run.session_id,
        "parent_run_id": run.parent_run_id,
    })
}

/// How a list shows each run: whole (`full`, the default, as `stepwell
/// list --json`) or as [`run_summary`].
fn run_view(view: Option<&str>) -> ApiResult<fn(&RunState) -> Value> {
    match view.unwrap_or("full") {
        "full" => Ok(run_json),
        "summary" => Ok(run_summary),
        other => Err(ApiError::invalid(
            "view",
            format!("{other:?} is not full or summary"),
        )),
    }
}

/// The most items one page holds.
const MAX_PAGE: usize = 500;

fn page_limit(limit: Option<usize>) -> ApiResult<usize> {
    match limit.unwrap_or(50) {
        0 => Err(ApiError::invalid("limit", "must be at least 1")),
        n if n > MAX_PAGE => Err(ApiError::invalid(
            "limit",
            format!("must be at most {MAX_PAGE}"),
        )),
        n => Ok(n),
    }
}

fn run_query(
    status: Option<&str>,
    wait_reason: Option<&str>,
    workflow_id: Option<String>,
) -> ApiResult<RunQuery> {
    Ok(RunQuery {
        status: status
            .map(|s| {
                RunStatus::parse(s).ok_or_else(|| {
                    ApiError::invalid(
                        "status",
                        format!(
                            "{s:?} is not one of running, waiting, completed, failed, cancelled"
                        ),
                    )
                })
            })
            .transpose()?,
        wait_reason: wait_reason
            .map(|r| {
                WaitReason::parse(r).ok_or_else(|| {
                    ApiError::invalid(
                        "wait_reason",
                        format!("{r:?} is not one of event, until, user, job, subworkflow"),
                    )
                })
            })
            .transpose()?,
        workflow_id,
        newest_first: true,
        ..RunQuery::default()
    })
}

/// A cursor that names no run is an error, not an empty page.
fn check_cursor(s: &Shared, query: &RunQuery) -> Result<(), Error> {
    if let Some(after) = &query.after_run_id {
        if s.rt.store().load_run(after)?.is_none() {
            return Err(Error::invalid(
                "cursor",
                format!("{after:?} is not a run of this store"),
            ));
        }
    }
    Ok(())
}

/// One page of runs, newest first, and the cursor of the next.
fn run_page(
    s: &Shared,
    mut query: RunQuery,
    limit: usize,
    show: fn(&RunState) -> Value,
) -> Result<Value, Error> {
    check_cursor(s, &query)?;
    query.limit = Some(limit + 1);
    let mut runs = s.rt.list_runs(&query)?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    let next = match runs.last() {
        Some(r) if more => json!(r.run_id),
        _ => Value::Null,
    };
    let items: Vec<Value> = runs.iter().map(show).collect();
    Ok(json!({"items": items, "next_cursor": next}))
}

async fn list_runs(State(s): S, Params(q): Params<ListRuns>) -> ApiResult {
    let limit = page_limit(q.limit)?;
    let show = run_view(q.view.as_deref())?;
    let mut query = run_query(q.status.as_deref(), q.wait_reason.as_deref(), q.workflow_id)?;
    query.parent_run_id = q.parent_run_id;
    query.after_run_id = q.cursor;
    match Window::parse(q.since.as_deref(), q.until.as_deref())? {
        Some(window) => read(move || {
            check_cursor(&s, &query)?;
            windowed_page(&s, query, limit, window, show)
        })
        .await
        .map(ok),
        None => read(move || run_page(&s, query, limit, show)).await.map(ok),
    }
}

/// The flow a run executes, for the dashboard's picture of it.
async fn run_flow(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || {
        let run = s.rt.get_state(&id)?;
        let wf = s.rt.workflow_of(&run)?;
        Ok(flow_json(&run, &wf))
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListWaits {
    limit: Option<usize>,
    cursor: Option<String>,
}

async fn list_waits(State(s): S, Params(q): Params<ListWaits>) -> ApiResult {
    let limit = page_limit(q.limit)?;
    let mut query = run_query(Some("waiting"), Some("user"), None)?;
    query.after_run_id = q.cursor;
    read(move || run_page(&s, query, limit, run_json))
        .await
        .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRun {
    bundle: Option<String>,
    workflow_id: Option<String>,
    #[serde(default)]
    vars: Map<String, Value>,
    run_id: Option<String>,
    runtime: Option<Map<String, Value>>,
    session_id: Option<String>,
    actor_id: Option<String>,
}

async fn start_run(State(s): S, Body(b): Body<StartRun>) -> ApiResult {
    stepwell::automation::check_caller_run(
        &b.vars,
        b.session_id.as_deref(),
        "body.vars",
        "body.session_id",
    )?;
    let runtime = match b.runtime {
        Some(r) => stepwell::core::config::operator_runtime(r)?,
        None => Map::new(),
    };
    let (existed, state) = blocking(move || {
        // An explicit id already taken by the same run: found again (200).
        let existed = match &b.run_id {
            Some(id) => s.rt.load_run_opt(id)?.is_some(),
            None => false,
        };
        let workflow =
            match (b.bundle, b.workflow_id) {
                (Some(dir), None) => {
                    s.rt.load_bundle(std::path::Path::new(&dir))?
                        .main_workflow_id
                }
                (None, Some(wf)) => wf,
                (Some(dir), Some(wf)) => {
                    s.rt.load_bundle(std::path::Path::new(&dir))?;
                    wf
                }
                (None, None) => return Err(Error::invalid(
                    "body",
                    "give the bundle directory (\"bundle\") or a known workflow (\"workflow_id\")",
                )),
            };
        let state = s.rt.run(
            &workflow,
            StartOptions {
                vars: b.vars,
                run_id: b.run_id,
                runtime,
                session_id: b.session_id,
                actor_id: b.actor_id,
                ..StartOptions::default()
            },
        )?;
        // Children it started, or the waits it set, are the driver's now.
        s.wake.wake();
        Ok((existed, state))
    })
    .await?;
    Ok(if existed {
        ok(run_json(&state))
    } else {
        created(run_json(&state))
    })
}

async fn get_run(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || {
        let run = s.rt.get_state(&id)?;
        Ok(marked(run_json(&run), s.rt.resuming(&id)))
    })
    .await
    .map(ok)
}

/// A run's JSON with `"resuming": true` while this server carries out the
/// work of its resume (an approved tool batch) in flight.
fn marked(mut run: Value, resuming: bool) -> Value {
    if resuming {
        run["resuming"] = Value::Bool(true);
    }
    run
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Resume {
    payload: Option<Value>,
    wait_key: Option<String>,
}

async fn resume_run(State(s): S, Path(id): Path<String>, Body(b): Body<Resume>) -> ApiResult {
    let payload = b
        .payload
        .ok_or_else(|| ApiError::invalid("body.payload", "missing: the answer to the wait"))?;
    blocking(move || {
        let state = match b.wait_key {
            Some(k) => s.rt.resume(&id, &k, payload)?,
            None => s.rt.respond(&id, payload)?,
        };
        s.wake.wake();
        // Still waiting while the work of the resume flies: accepted. Work
        // that flew and already landed: the run as it is now.
        let resuming = state.status == RunStatus::Waiting && s.rt.resuming(&id);
        let state = match state.status == RunStatus::Waiting && !resuming {
            true => s.rt.get_state(&id).unwrap_or(state),
            false => state,
        };
        Ok((resuming, marked(run_json(&state), resuming)))
    })
    .await
    .map(|(resuming, run)| match resuming {
        true => (StatusCode::ACCEPTED, Json(run)).into_response(),
        false => ok(run),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Cancel {
    reason: Option<String>,
}

async fn cancel_run(State(s): S, Path(id): Path<String>, Body(b): Body<Cancel>) -> ApiResult {
    blocking(move || {
        let state = s.rt.cancel_run_by(&id, b.reason.as_deref(), "http")?;
        s.wake.wake();
        Ok(state)
    })
    .await
    .map(|r| ok(run_json(&r)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LedgerQuery {
    after: Option<u64>,
    limit: Option<u64>,
}

/// The most records one page of `GET /v1/runs/{id}/ledger` holds.
const MAX_LEDGER_PAGE: u64 = 10 * stepwell::LEDGER_PAGE;

/// A ledger record as the API shows it: the record with its `seq`.
pub(crate) fn record_json(record: &stepwell::StepRecord, seq: u64) -> Value {
    let mut v = serde_json::to_value(record).unwrap_or(Value::Null);
    v["seq"] = json!(seq);
    v
}

/// `GET /v1/runs/{id}/ledger?after=&limit=`: a page of the run's records
/// after seq `after` (default 0), at most `limit` (default
/// [`stepwell::LEDGER_PAGE`], at most [`MAX_LEDGER_PAGE`]), and no more than
/// about [`LEDGER_PAGE_BYTES`] of JSON; a full page, or one cut short by
/// its size, carries a `Link: <...>; rel="next"` header to the next one.
async fn run_ledger(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<LedgerQuery>,
) -> ApiResult {
    let limit = match q.limit.unwrap_or(stepwell::LEDGER_PAGE) {
        0 => return Err(ApiError::invalid("limit", "must be at least 1")),
        n if n > MAX_LEDGER_PAGE => {
            return Err(ApiError::invalid(
                "limit",
                format!("must be at most {MAX_LEDGER_PAGE}"),
            ))
        }
        n => n,
    };
    let after = q.after.unwrap_or(0);
    let run_id = id.clone();
    let (body, next) = read(move || {
        s.rt.get_state(&id)?;
        let records = s.rt.ledger_page(&id, after, limit as usize)?;
        let items = records.iter().map(|(seq, r)| (*seq, record_json(r, *seq)));
        Ok(json_page(items, limit as usize, LEDGER_PAGE_BYTES))
    })
    .await?;
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response();
    if let Some(next) = next {
        let link = format!(
            "</v1/runs/{}/ledger?after={next}&limit={limit}>; rel=\"next\"",
            path_segment(&run_id),
        );
        if let Ok(v) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, v);
        }
    }
    Ok(response)
}

/// The most bytes of JSON a ledger page is built to (about): the records
/// past it are left to the next page (a page holds at least one record).
const LEDGER_PAGE_BYTES: usize = 4 << 20;

/// A page of `items` (seq and JSON, read with `limit`) as a JSON array,
/// cut after the item that takes it past `max_bytes`, and the seq the next
/// page starts after: given when the page was cut or is full.
fn json_page(
    items: impl ExactSizeIterator<Item = (u64, Value)>,
    limit: usize,
    max_bytes: usize,
) -> (String, Option<u64>) {
    let count = items.len();
    let mut body = String::from("[");
    let mut last = None;
    for (i, (seq, v)) in items.enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&v.to_string());
        last = Some(seq);
        if body.len() >= max_bytes && i + 1 < count {
            body.push(']');
            return (body, last);
        }
    }
    body.push(']');
    (body, last.filter(|_| count == limit))
}

/// `text` as one segment of a URL's path: bytes other than letters,
/// digits and `-._~` percent-encoded.
fn path_segment(text: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `GET /v1/runs/{id}/ledger/verify`: the chain checked a page at a time.
async fn verify_ledger(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || {
        let check = s.rt.check_ledger(&id)?;
        let count = check.records;
        Ok(match check.verdict {
            Ok(head) => {
                json!({"ok": true, "records": count, "head": head, "checkpoint": check.checkpoint})
            }
            Err(b) => json!({"ok": false, "records": count, "break": b}),
        })
    })
    .await
    .map(ok)
}

// ---------------------------------------------------------------- snapshots

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSnapshot {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tags: Vec<String>,
}

async fn create_snapshot(
    State(s): S,
    Path(id): Path<String>,
    Body(b): Body<NewSnapshot>,
) -> ApiResult {
    blocking(move || {
        let snap =
            s.rt.create_snapshot(&*s.snapshots, &id, &b.name, &b.description, b.tags)?;
        Ok(serde_json::to_value(snap).unwrap_or(Value::Null))
    })
    .await
    .map(created)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotSearch {
    run_id: Option<String>,
    tag: Option<String>,
    text: Option<String>,
    limit: Option<usize>,
}

async fn list_snapshots(State(s): S, Params(q): Params<SnapshotSearch>) -> ApiResult {
    let limit = page_limit(q.limit)?;
    read(move || {
        let found = s
            .snapshots
            .search_snapshots(&stepwell::store::SnapshotQuery {
                run_id: q.run_id,
                tag: q.tag,
                text: q.text,
                limit: Some(limit),
            })?;
        Ok(json!({"items": found}))
    })
    .await
    .map(ok)
}

async fn restore_snapshot(State(s): S, Path(id): Path<String>) -> ApiResult {
    let missing = id.clone();
    let restored = blocking(move || {
        if s.snapshots.load_snapshot(&id)?.is_none() {
            return Ok(None);
        }
        let run = s.rt.restore_snapshot(&*s.snapshots, &id)?;
        s.wake.wake();
        Ok(Some(run))
    })
    .await?;
    match restored {
        Some(r) => Ok(ok(run_json(&r))),
        None => {
            let mut e = ApiError::new(
                StatusCode::NOT_FOUND,
                "snapshot_not_found",
                format!("no snapshot with id {missing:?}"),
            );
            e.detail["field"] = json!("id");
            Err(e)
        }
    }
}

// ---------------------------------------------------------------- sessions

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnsQuery {
    automation_id: Option<String>,
    through_occurrence: Option<i64>,
    limit: Option<usize>,
}

async fn session_turns(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<TurnsQuery>,
) -> ApiResult {
    read(move || {
        let turns = stepwell::sessions::select_session_turns(
            &s.rt,
            &id,
            &stepwell::sessions::TurnsOptions {
                automation_id: q.automation_id,
                through_occurrence: q.through_occurrence,
                limit: q.limit.unwrap_or(50),
                ..Default::default()
            },
        )?;
        let items: Vec<Value> = turns
            .iter()
            .map(|t| stepwell::sessions::Turn::of(t).to_json())
            .collect();
        Ok(json!({"items": items}))
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    max_tokens: Option<u64>,
    automation_id: Option<String>,
    through_occurrence: Option<i64>,
}

async fn session_history(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<HistoryQuery>,
) -> ApiResult {
    read(move || {
        let mut options = stepwell::sessions::HistoryOptions {
            automation_id: q.automation_id,
            through_occurrence: q.through_occurrence,
            ..Default::default()
        };
        if let Some(m) = q.max_tokens {
            options.max_tokens = m;
        }
        let h = stepwell::sessions::session_chat_messages(&s.rt, &id, &options)?;
        Ok(json!({"messages": h.messages, "report": h.report.to_json()}))
    })
    .await
    .map(ok)
}

// ---------------------------------------------------------------- automations

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AutomationsQuery {
    status: Option<String>,
    cursor: Option<String>,
    limit: Option<i64>,
}

/// The statuses an automation can have.
const AUTOMATION_STATUSES: [&str; 5] = ["active", "paused", "completed", "failed", "archived"];

async fn automations_list(State(s): S, Params(q): Params<AutomationsQuery>) -> ApiResult {
    for status in q
        .status
        .as_deref()
        .map(stepwell::store::filter_values)
        .unwrap_or_default()
    {
        if !AUTOMATION_STATUSES.contains(&status.as_str()) {
            return Err(ApiError::invalid(
                "status",
                format!(
                    "{status:?} is not one of {}",
                    AUTOMATION_STATUSES.join(", ")
                ),
            ));
        }
    }
    read(move || {
        list_automations(
            &s.rt,
            q.status.as_deref(),
            q.cursor.as_deref(),
            q.limit.unwrap_or(50),
            s.rt.now(),
        )
    })
    .await
    .map(ok)
}

async fn automations_create(State(s): S, Body(request): Body<Value>) -> ApiResult {
    blocking(move || {
        let c = create_automation(&s.rt, &request, s.rt.now(), None)?;
        s.wake.wake();
        Ok(json!({"automation_id": c.automation_id, "revision": c.revision, "created": c.created}))
    })
    .await
    .map(|v| {
        if v["created"] == json!(true) {
            created(v)
        } else {
            ok(v)
        }
    })
}

async fn automations_show(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || show_automation(&s.rt, &id, s.rt.now()))
        .await
        .map(ok)
}

/// The body of `POST /v1/automations/{id}/commands`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CommandBody {
    #[serde(rename = "type")]
    kind: String,
    command_id: String,
    payload: Option<Value>,
    expected_revision: Option<i64>,
    actor: Option<String>,
}

impl CommandBody {
    /// `stop_current` of occurrence `index` with `command_id`, sent by an
    /// AHP client.
    pub(crate) fn stop_current(command_id: String, index: i64) -> Self {
        CommandBody {
            kind: "stop_current".into(),
            command_id,
            payload: Some(json!({"occurrence_index": index})),
            expected_revision: None,
            actor: Some("ahp".into()),
        }
    }
}

/// Applies an automation command: `200` with the answer when applied,
/// `422` with it when rejected (a rejection is an answer, recorded).
pub(crate) fn apply_command(
    s: &Shared,
    automation_id: &str,
    body: &CommandBody,
) -> Result<Value, Error> {
    let answer = apply_automation_command(
        &s.rt,
        &Command {
            automation_id,
            command_id: &body.command_id,
            command_type: &body.kind,
            payload: body.payload.as_ref(),
            actor: body.actor.as_deref(),
            expected_revision: body.expected_revision,
        },
        s.rt.now(),
    )?;
    s.wake.wake();
    Ok(answer)
}

async fn automations_command(
    State(s): S,
    Path(id): Path<String>,
    Body(b): Body<CommandBody>,
) -> ApiResult {
    let answer = blocking(move || apply_command(&s, &id, &b)).await?;
    // A rejection is an answer (recorded); its status says what kind:
    // no such automation 404, a lost revision race 409, a malformed command
    // 400, anything else the automation refused 422.
    let status = if answer["status"] == "applied" {
        StatusCode::OK
    } else {
        match answer["error"]["reason_code"].as_str().unwrap_or_default() {
            "automation_not_found" => StatusCode::NOT_FOUND,
            "revision_conflict" | "conflict" => StatusCode::CONFLICT,
            "invalid_request" | "invalid_input" => StatusCode::BAD_REQUEST,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        }
    };
    Ok((status, Json(answer)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    cursor: Option<String>,
    limit: Option<i64>,
}

async fn automations_occurrences(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<PageQuery>,
) -> ApiResult {
    read(move || list_occurrences(&s.rt, &id, q.cursor.as_deref(), q.limit.unwrap_or(50)))
        .await
        .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitQuery {
    limit: Option<usize>,
}

async fn automations_waits(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<LimitQuery>,
) -> ApiResult {
    let limit = page_limit(q.limit)?;
    read(move || pending_waits(&s.rt, &id, limit))
        .await
        .map(|items| ok(json!({"items": items})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AttentionQuery {
    after_seq: Option<i64>,
    cursor: Option<String>,
    limit: Option<i64>,
}

async fn automations_attention(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<AttentionQuery>,
) -> ApiResult {
    read(move || {
        list_attention(
            &s.rt,
            &id,
            q.after_seq.unwrap_or(0),
            q.cursor.as_deref(),
            q.limit.unwrap_or(50),
        )
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiscussBody {
    occurrence: i64,
    request_id: String,
    prompt: String,
    workspace: String,
    actor: Option<String>,
}

async fn automations_discuss(
    State(s): S,
    Path(id): Path<String>,
    Body(b): Body<DiscussBody>,
) -> ApiResult {
    blocking(move || {
        let started = start_discussion(
            &s.rt,
            &DiscussionRequest {
                automation_id: id,
                occurrence_index: b.occurrence,
                request_id: b.request_id,
                prompt: b.prompt,
                workspace_root: b.workspace,
                actor_id: b.actor,
            },
        )?;
        let state = s.rt.tick(&started.run_id)?;
        Ok(started.with_state(&state))
    })
    .await
    .map(created)
}

// ---------------------------------------------------------------- catalogues

async fn triggers_list(State(s): S) -> ApiResult {
    read(move || {
        let registry = s.rt.triggers()?;
        Ok(json!({"items": registry.entries()}))
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateBody {
    config: Value,
}

/// `POST /v1/triggers/{source}/validate` (`source` as `schedule@1`): the
/// config with its defaults filled in, as the source validates it now.
async fn triggers_validate(
    State(s): S,
    Path(source): Path<String>,
    Body(b): Body<ValidateBody>,
) -> ApiResult {
    blocking(move || {
        let registry = s.rt.triggers()?;
        Ok(registry.call(
            &source,
            "validate",
            &json!({"config": b.config}),
            s.rt.now(),
        )?)
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PreviewBody {
    config: Value,
    from: Option<String>,
    count: Option<usize>,
}

/// `POST /v1/triggers/{source}/preview`: the next fire times.
async fn triggers_preview(
    State(s): S,
    Path(source): Path<String>,
    Body(b): Body<PreviewBody>,
) -> ApiResult {
    let count = b.count.unwrap_or(5);
    if !(1..=100).contains(&count) {
        return Err(ApiError::invalid("body.count", "must be between 1 and 100"));
    }
    blocking(move || {
        let from = match &b.from {
            Some(t) => {
                stepwell::core::clock::parse_time(t).map_err(|m| Error::invalid("body.from", m))?
            }
            None => s.rt.now(),
        };
        let registry = s.rt.triggers()?;
        let preview = registry.preview(&source, &b.config, from, count)?;
        Ok(serde_json::to_value(preview).unwrap_or(Value::Null))
    })
    .await
    .map(ok)
}

/// `GET /v1/quarantined`: the runs set aside because they cannot be read
/// or committed, and why.
async fn quarantined_list(State(s): S) -> ApiResult {
    read(move || {
        let items: Vec<Value> =
            s.rt.store()
                .list_quarantined()?
                .into_iter()
                .map(|(id, why)| json!({"run_id": id, "reason": why}))
                .collect();
        Ok(json!({"items": items}))
    })
    .await
    .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportQuery {
    #[serde(default)]
    with_children: bool,
}

/// `GET /v1/runs/{id}/export`: the run's history as one file (`stepwell
/// export`), `application/zip`.
async fn export_run(
    State(s): S,
    Path(id): Path<String>,
    Query(q): Query<ExportQuery>,
) -> ApiResult {
    let bytes = read(move || s.rt.export_run(&id, q.with_children)).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/zip"),
        )],
        bytes,
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Fork {
    /// The record to start from (default: the run's first step).
    at: Option<u64>,
    /// A snapshot of the run to start from instead.
    snapshot_id: Option<String>,
    #[serde(default)]
    vars: serde_json::Map<String, Value>,
    workflow_version: Option<u32>,
}

/// `POST /v1/runs/{id}/fork`: a new run from a past point of the run
/// (`stepwell fork`), created for the driver to step; 201 with its state.
async fn fork_run(State(s): S, Path(id): Path<String>, Body(b): Body<Fork>) -> ApiResult {
    use stepwell::core::fork::{ForkFrom, ForkOptions};
    if b.at.is_some() && b.snapshot_id.is_some() {
        return Err(ApiError::invalid(
            "body.snapshot_id",
            "give `at` or `snapshot_id`, not both",
        ));
    }
    blocking(move || {
        let from = match (b.at, b.snapshot_id) {
            (Some(seq), _) => ForkFrom::Seq(seq),
            (None, Some(snap)) => {
                let found = s.snapshots.load_snapshot(&snap)?.ok_or_else(|| {
                    stepwell::Error::invalid("snapshot_id", format!("no snapshot with id {snap:?}"))
                })?;
                ForkFrom::Snapshot(Box::new(found))
            }
            (None, None) => ForkFrom::Start,
        };
        let options = ForkOptions {
            from,
            vars: b.vars,
            workflow_version: b.workflow_version,
        };
        let forked = s.rt.fork(&id, options)?;
        s.wake.wake();
        s.rt.get_state(&forked.run_id)
    })
    .await
    .map(|r| created(run_json(&r)))
}

/// `GET /v1/runs/{id}/fork-points`: the points of the run's history a
/// fork can start from.
async fn fork_points(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || Ok(json!({"items": s.rt.fork_points(&id)?})))
        .await
        .map(ok)
}

/// `GET /v1/runs/{id}/evidence`: the evidence the run's outside-world tool
/// calls left (`stepwell evidence`).
async fn run_evidence(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || Ok(json!({"items": stepwell::tools::evidence::list(&s.rt, &id)?})))
        .await
        .map(ok)
}

async fn workflows_list(State(s): S) -> ApiResult {
    read(move || Ok(json!({"items": s.rt.deployed_workflows()?})))
        .await
        .map(ok)
}

async fn workflow_versions(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || Ok(json!(s.rt.workflow_versions(&id)?)))
        .await
        .map(ok)
}

/// A deployment by path: a bundle directory or packed bundle the server
/// can read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployPath {
    path: String,
    deployed_by: Option<String>,
}

/// `POST /v1/deployments`: a packed bundle as the body (`Content-Type:
/// application/zip`), or `{"path": ...}` naming one the server can read.
async fn deploy(State(s): S, req: Request) -> ApiResult {
    let zip = req
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/zip"));
    let (deployed, warnings) = if zip {
        let body = s.bodies.read(req.into_body()).await?;
        blocking(move || {
            let d =
                s.rt.deploy_archive(&body.bytes, None, "POST /v1/deployments")?;
            Ok((d.workflows, d.warnings))
        })
        .await?
    } else {
        let Body(b) = Body::<DeployPath>::from_request(req, &s).await?;
        blocking(move || {
            let path = std::path::Path::new(&b.path);
            let by = b.deployed_by.as_deref();
            if path.is_file() {
                let bytes = stepwell::flow::pack::read_archive(path)
                    .map_err(|e| Error::invalid("body.path", e))?;
                let d = s.rt.deploy_archive(&bytes, by, &b.path)?;
                Ok((d.workflows, d.warnings))
            } else {
                // What loading noticed (a route its component does not
                // declare) is answered too.
                let d = s.rt.deploy(path, by)?;
                let warnings = d.bundle.warnings();
                Ok((d.workflows, warnings))
            }
        })
        .await?
    };
    let unchanged = deployed.iter().all(|d| d.unchanged);
    let items: Vec<Value> = deployed
        .iter()
        .map(|d| {
            json!({"workflow_id": d.version.workflow_id, "version": d.version,
                         "unchanged": d.unchanged})
        })
        .collect();
    let mut answer = json!({"unchanged": unchanged, "items": items});
    if !warnings.is_empty() {
        answer["warnings"] = json!(warnings);
    }
    Ok(if unchanged {
        ok(answer)
    } else {
        created(answer)
    })
}

async fn tools_list(State(s): S) -> ApiResult {
    read(move || {
        let table = s.rt.tools()?;
        Ok(json!({"items": table.entries()}))
    })
    .await
    .map(ok)
}

// ---------------------------------------------------------------- metrics

async fn metrics(State(s): S) -> ApiResult {
    let http: Vec<(RequestKind, RequestCount)> = s
        .http
        .counts
        .lock()
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let text = read(move || {
        let mut by_status = Vec::new();
        for status in [
            RunStatus::Running,
            RunStatus::Waiting,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ] {
            let n =
                s.rt.store()
                    .list_run_index(&stepwell::RunIndexQuery {
                        status: Some(status),
                        ..Default::default()
                    })?
                    .len();
            by_status.push((status.as_str(), n));
        }
        Ok(render_metrics(&s.rt.counters(), &by_status, &http))
    })
    .await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

fn render_metrics(
    c: &stepwell::core::metrics::Counters,
    by_status: &[(&str, usize)],
    http: &[(RequestKind, RequestCount)],
) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family("stepwell_runs", "gauge", "Runs in the store, by status.");
    let mut lines = String::new();
    for (status, n) in by_status {
        let _ = writeln!(lines, "stepwell_runs{{status=\"{status}\"}} {n}");
    }
    out.push_str(&lines);
    let mut simple = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    simple(
        "stepwell_steps_total",
        "counter",
        "Ledger records this process committed.",
        c.records.to_string(),
    );
    simple(
        "stepwell_resumes_total",
        "counter",
        "Waits this process resumed.",
        c.resumes.to_string(),
    );
    simple(
        "stepwell_guest_calls_total",
        "counter",
        "Node calls into guest components.",
        c.guest_calls.to_string(),
    );
    simple(
        "stepwell_guest_seconds_total",
        "counter",
        "Wall time spent in guest node calls.",
        format!("{:.6}", c.guest_us as f64 / 1e6),
    );
    simple(
        "stepwell_guest_instances_made_total",
        "counter",
        "Node instances a tick made (or tried to) when it needed one, and waited for.",
        c.instances_made.to_string(),
    );
    simple(
        "stepwell_guest_instances_ahead_total",
        "counter",
        "Node instances a run found made ahead, on the engine's worker thread.",
        c.instances_ahead.to_string(),
    );
    let _ = writeln!(
        out,
        "# HELP stepwell_store_commit_seconds Store commit latency of run transitions.\n# TYPE stepwell_store_commit_seconds histogram"
    );
    let mut cumulative = 0;
    for (i, bound) in stepwell::core::metrics::COMMIT_BUCKETS_US
        .iter()
        .enumerate()
    {
        cumulative += c.commit_buckets[i];
        let _ = writeln!(
            out,
            "stepwell_store_commit_seconds_bucket{{le=\"{}\"}} {cumulative}",
            *bound as f64 / 1e6
        );
    }
    let _ = writeln!(
        out,
        "stepwell_store_commit_seconds_bucket{{le=\"+Inf\"}} {}\nstepwell_store_commit_seconds_sum {:.6}\nstepwell_store_commit_seconds_count {}",
        c.commits,
        c.commit_us as f64 / 1e6,
        c.commits
    );
    let _ = writeln!(
        out,
        "# HELP stepwell_http_requests_total HTTP requests answered.\n# TYPE stepwell_http_requests_total counter"
    );
    for ((method, route, status), (n, _)) in http {
        let _ = writeln!(
            out,
            "stepwell_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP stepwell_http_request_seconds_total Time spent answering HTTP requests.\n# TYPE stepwell_http_request_seconds_total counter"
    );
    for ((method, route, status), (_, us)) in http {
        let _ = writeln!(
            out,
            "stepwell_http_request_seconds_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {:.6}",
            *us as f64 / 1e6
        );
    }
    out
}

/// `POST /v1/hooks/{connection_id}`: one Standard Webhooks call
/// ([`stepwell::Runtime::receive_webhook`]): 202 appended, 409 duplicate, 401
/// bad or stale signature, 404 unknown or disabled connection, 413 body
/// over 1 MiB, 415 neither JSON nor UTF-8 text. An appended call wakes the
/// driver at once.
async fn receive_webhook(
    State(s): S,
    Path(connection_id): Path<String>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> ApiResult {
    use stepwell::triggers::webhook::MAX_BODY_BYTES;
    use stepwell::triggers::Received;
    let answer = |r: Received| {
        let status = StatusCode::from_u16(r.http_status).unwrap_or(StatusCode::BAD_REQUEST);
        (status, Json(json!(r))).into_response()
    };
    // The connection first: a call to no connection costs no body read.
    let (rt, id) = (s.rt.clone(), connection_id.clone());
    if !blocking_in(Pool::Webhook, move || rt.accepts_webhooks(&id)).await? {
        return Ok(answer(Received::not_found()));
    }
    if axum::body::HttpBody::size_hint(&body).lower() as usize > MAX_BODY_BYTES {
        // A body declared over the limit is read on briefly (kept
        // nowhere) so that the sender, still sending, gets to read the 413.
        s.hook_bodies.drain(body, 16 * MAX_BODY_BYTES).await;
        return Ok(answer(Received::too_large()));
    }
    // The body keeps its share of the budget until the call is answered.
    let body = match s.hook_bodies.read(body).await {
        Ok(body) if body.bytes.len() <= MAX_BODY_BYTES => body,
        Ok(_) | Err(super::body::BodyRefusal::TooLarge) => {
            return Ok(answer(Received::too_large()))
        }
        Err(refusal) => return Err(refusal.into()),
    };
    let headers: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let value = std::str::from_utf8(v.as_bytes()).ok()?;
            Some((k.as_str().to_string(), value.to_string()))
        })
        .collect();
    let rt = s.rt.clone();
    let r = blocking_in(Pool::Webhook, move || {
        rt.receive_webhook(&connection_id, &headers, &body.bytes)
    })
    .await?;
    if r.status == "appended" {
        s.wake.wake();
    }
    Ok(answer(r))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewConnection {
    source: String,
    label: Option<String>,
    #[serde(default)]
    config: Option<Value>,
}

async fn connections_list(State(s): S) -> ApiResult {
    // `items`, as every other list of the API.
    read(move || Ok(json!({"items": s.rt.list_connections()?})))
        .await
        .map(ok)
}

/// Creates a connection; the answer is the only one that shows its secret.
async fn connections_create(State(s): S, Body(b): Body<NewConnection>) -> ApiResult {
    blocking(move || {
        let config = b.config.unwrap_or_else(|| json!({}));
        Ok(json!(s.rt.create_connection(
            &b.source,
            b.label.as_deref(),
            &config
        )?))
    })
    .await
    .map(created)
}

async fn connections_show(State(s): S, Path(id): Path<String>) -> ApiResult {
    read(move || Ok(stepwell::triggers::connection_view(&s.rt.connection(&id)?)))
        .await
        .map(ok)
}

async fn connections_disable(State(s): S, Path(id): Path<String>) -> ApiResult {
    blocking(move || s.rt.set_connection_status(&id, "disabled"))
        .await
        .map(ok)
}

async fn connections_enable(State(s): S, Path(id): Path<String>) -> ApiResult {
    blocking(move || s.rt.set_connection_status(&id, "active"))
        .await
        .map(ok)
}

async fn connections_rotate(State(s): S, Path(id): Path<String>) -> ApiResult {
    blocking(move || Ok(json!(s.rt.rotate_connection_secret(&id)?)))
        .await
        .map(ok)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendEvent {
    data: Value,
    subject: Option<String>,
}

/// Appends a test or plugin event to a connection's stream.
async fn connections_send(
    State(s): S,
    Path(id): Path<String>,
    Body(b): Body<SendEvent>,
) -> ApiResult {
    let wake = s.wake.clone();
    let out = blocking(move || {
        s.rt.send_connection_event(&id, b.data, b.subject.as_deref())
    })
    .await?;
    wake.wake();
    Ok(created(out))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<u64>,
    limit: Option<usize>,
}

async fn connections_events(
    State(s): S,
    Path(id): Path<String>,
    Params(q): Params<EventsQuery>,
) -> ApiResult {
    read(move || {
        let events =
            s.rt.connection_events(&id, q.after.unwrap_or(0), q.limit.unwrap_or(100).min(1000))?;
        Ok(json!({"events": events}))
    })
    .await
    .map(ok)
}

#[cfg(test)]
mod tests {
    use super::json_page;
    use serde_json::{json, Value};

    fn items(n: usize) -> impl ExactSizeIterator<Item = (u64, Value)> {
        (1..n + 1).map(|i| (i as u64, json!({"seq": i, "pad": "x".repeat(90)})))
    }

    #[test]
    fn a_ledger_page_ends_at_its_limit_or_its_size() {
        // Under the size: the whole page; a link only when it is full.
        let (body, next) = json_page(items(3), 3, 1 << 20);
        assert_eq!(serde_json::from_str::<Vec<Value>>(&body).unwrap().len(), 3);
        assert_eq!(next, Some(3));
        let (_, next) = json_page(items(2), 3, 1 << 20);
        assert_eq!(next, None, "a short page is the last");
        let (body, next) = json_page(items(0), 3, 1 << 20);
        assert_eq!((body.as_str(), next), ("[]", None));
        // Over the size: cut after the record that passes it, with a link.
        let (body, next) = json_page(items(10), 10, 250);
        let page: Vec<Value> = serde_json::from_str(&body).unwrap();
        assert_eq!(page.len(), 3, "{body}");
        assert_eq!(next, Some(3));
        // One record larger than the size still makes a page.
        let (body, next) = json_page(items(1), 5, 10);
        assert_eq!(serde_json::from_str::<Vec<Value>>(&body).unwrap().len(), 1);
        assert_eq!(next, None);
    }
}

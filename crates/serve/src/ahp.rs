//! The Agent Host Protocol's automation-run channel (seed 001) over a
//! WebSocket at `/v1/ahp`: each occurrence of an automation is the
//! resource `ahp-automation-run:/<automation id>/<occurrence index>`,
//! whose state is projected from the controller's ledger and the
//! occurrence's runs; a subscriber gets the state, then every change as an
//! action (`automationRun/lifecycleChanged`, `sessionSet`, `sessionRemoved`,
//! `primarySessionChanged`). `automationRun/cancelRequested` from a client
//! stops the occurrence (`automation.stop_current`). Framing: JSON-RPC 2.0
//! as AHP (`initialize`, `subscribe`, `unsubscribe`, `dispatchAction`,
//! `ping`; the server's `action` notifications). `docs/ahp.md` has the
//! mapping.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::api::blocking;
use super::error::ApiError;
use super::Shared;
use stepwell::automation::automation_records;
use stepwell::core::{Error, Result};
use stepwell::Runtime;

/// The AHP version this host speaks.
pub const AHP_PROTOCOL_VERSION: u64 = 1;

const RUN_SCHEME: &str = "ahp-automation-run:/";
const AUTOMATION_SCHEME: &str = "ahp-automation:/";
const SESSION_SCHEME: &str = "ahp-session:/";

/// The resource URI of occurrence `index` of `automation_id`.
pub fn run_uri(automation_id: &str, index: i64) -> String {
    format!("{RUN_SCHEME}{automation_id}/{index}")
}

fn parse_run_uri(uri: &str) -> Option<(String, i64)> {
    let rest = uri.strip_prefix(RUN_SCHEME)?;
    let (aid, index) = rest.rsplit_once('/')?;
    if aid.is_empty() || aid.contains('/') {
        return None;
    }
    // One spelling per occurrence: `.../1`, never `.../01`.
    let n: i64 = index.parse().ok()?;
    (n >= 1 && n.to_string() == index).then(|| (aid.to_string(), n))
}

/// What one occurrence's records say, gathered in ledger order.
#[derive(Default)]
struct Gathered {
    created_at: Option<String>,
    started_at: Option<String>,
    completed_at: Option<String>,
    status: Option<String>,
    error: Option<Value>,
    origin: Value,
    runs: Vec<String>,
    attempts: i64,
}

/// The `AutomationRunState` of every occurrence of `automation_id`, by
/// index, from its controller's ledger.
pub fn project_occurrences(rt: &Runtime, automation_id: &str) -> Result<BTreeMap<i64, Value>> {
    let not_found = || {
        Error::from(stepwell::automation::AutomationError::new(
            "automation_not_found",
            None,
            format!("no automation with id {automation_id:?}"),
        ))
    };
    let controller = rt.load_run_opt(automation_id)?.ok_or_else(not_found)?;
    if controller.workflow_id != stepwell::automation::CONTROLLER_WORKFLOW_ID {
        return Err(not_found());
    }
    let records = rt.get_ledger(automation_id)?;
    let names = [
        "automation.admitted",
        "automation.dispatched",
        "automation.completed",
    ];
    let mut found: BTreeMap<i64, Gathered> = BTreeMap::new();
    for rec in automation_records(&records, &names) {
        let p = rec.payload;
        let Some(index) = p.get("index").and_then(Value::as_i64) else {
            continue;
        };
        let at = p.get("at").and_then(Value::as_str).map(str::to_string);
        match rec.name {
            "automation.admitted" => {
                let g = found.entry(index).or_default();
                g.created_at = at;
                g.origin = origin_of(p.get("trigger_envelope").unwrap_or(&Value::Null));
            }
            "automation.dispatched" => {
                let Some(g) = found.get_mut(&index) else {
                    continue;
                };
                if g.started_at.is_none() {
                    g.started_at = at;
                }
                if let Some(run) = p.get("run_id").and_then(Value::as_str) {
                    if !g.runs.iter().any(|r| r == run) {
                        g.runs.push(run.to_string());
                    }
                }
                g.attempts = p.get("attempt").and_then(Value::as_i64).unwrap_or(1);
            }
            _ => {
                let Some(g) = found.get_mut(&index) else {
                    continue;
                };
                g.status = p.get("status").and_then(Value::as_str).map(str::to_string);
                g.completed_at = p
                    .get("finished_at")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or(at);
                g.error = p.get("error").filter(|e| !e.is_null()).cloned();
            }
        }
    }
    // A failed occurrence says why in its last attempt's run.
    for g in found.values_mut() {
        if g.status.as_deref() == Some("failed") && g.error.is_none() {
            if let Some(run) = g.runs.last() {
                // The run's error, else the error its output reports (a
                // target that completed with `success: false`).
                let why = rt.load_run_opt(run)?.and_then(|r| {
                    r.error.or_else(|| {
                        r.output?
                            .get("error")
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    })
                });
                if let Some(e) = why {
                    g.error = Some(error_info(&e));
                }
            }
        }
    }
    Ok(found
        .into_iter()
        .map(|(index, g)| (index, state_of(automation_id, index, &g)))
        .collect())
}

/// `{code, message}` from a run's error (`reason_code: message`).
fn error_info(error: &str) -> Value {
    match error.split_once(": ") {
        Some((code, message))
            if !code.is_empty() && code.chars().all(|c| c.is_ascii_lowercase() || c == '_') =>
        {
            json!({"code": code, "message": message})
        }
        _ => json!({"code": "occurrence_failed", "message": error}),
    }
}

/// The AHP origin of an occurrence from its trigger envelope: `manual` for
/// a run-now, else `trigger` with its binding, the fire time it was
/// scheduled for, and whether it was a catch-up.
fn origin_of(envelope: &Value) -> Value {
    let source = envelope
        .get("source_id")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if source == "manual" {
        return json!({"kind": "manual"});
    }
    let mut o = json!({
        "kind": "trigger",
        "triggerId": envelope.get("binding_id").cloned().unwrap_or(json!(source)),
    });
    if let Some(t) = envelope.get("fired_at").filter(|t| t.is_string()) {
        if source == "schedule" || source == "cron" {
            o["scheduledFor"] = t.clone();
        }
    }
    // Missed ticks coalesced into this one: a catch-up run.
    if envelope
        .pointer("/payload/coalesced")
        .is_some_and(|c| c.is_object())
    {
        o["catchUp"] = json!(true);
    }
    if source != "schedule" && source != "cron" {
        let mut event = Map::new();
        // An event source's provenance: its connection, subject, trust,
        // position in the stream, and the events it carried.
        for k in [
            "source_id",
            "source_version",
            "event_id",
            "fired_at",
            "connectionid",
            "subject",
            "abstracttrust",
            "sequence",
        ] {
            if let Some(v) = envelope.get(k).filter(|v| !v.is_null()) {
                event.insert(k.into(), v.clone());
            }
        }
        for k in ["count", "event_ids"] {
            if let Some(v) = envelope.pointer(&format!("/payload/{k}")) {
                event.insert(k.into(), v.clone());
            }
        }
        o["event"] = Value::Object(event);
    }
    o
}

fn state_of(automation_id: &str, index: i64, g: &Gathered) -> Value {
    let created = g.created_at.clone().unwrap_or_default();
    let mut lifecycle = match g.status.as_deref() {
        Some(s @ ("completed" | "failed" | "cancelled")) => {
            let mut l = json!({"status": s, "createdAt": created,
                               "completedAt": g.completed_at.clone().unwrap_or_default()});
            if s == "failed" {
                let message = match &g.error {
                    Some(Value::String(m)) => m.clone(),
                    Some(e) => e
                        .get("message")
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .unwrap_or_else(|| e.to_string()),
                    None => "the occurrence failed".into(),
                };
                let code = g
                    .error
                    .as_ref()
                    .and_then(|e| e.get("code").or_else(|| e.get("reason_code")))
                    .and_then(Value::as_str)
                    .unwrap_or("occurrence_failed");
                l["error"] = json!({"code": code, "message": message});
            }
            l
        }
        _ if g.started_at.is_some() => json!({"status": "running", "createdAt": created}),
        _ => json!({"status": "pending", "createdAt": created}),
    };
    if let Some(started) = &g.started_at {
        lifecycle["startedAt"] = json!(started);
    } else if lifecycle["status"] == "completed" {
        // Completed requires startedAt: an occurrence that completed
        // without a dispatch record started when it was created.
        lifecycle["startedAt"] = json!(created);
    }
    let sessions: Vec<String> = g
        .runs
        .iter()
        .map(|r| format!("{SESSION_SCHEME}{r}"))
        .collect();
    let mut state = json!({
        "resource": run_uri(automation_id, index),
        "automation": format!("{AUTOMATION_SCHEME}{automation_id}"),
        "origin": g.origin,
        "lifecycle": lifecycle,
        "sessions": sessions,
        "_meta": {"automation_id": automation_id, "occurrence_index": index,
                  "attempts": g.attempts, "run_ids": g.runs},
    });
    if let Some(last) = sessions.last() {
        state["primarySession"] = json!(last);
    }
    state
}

/// The `AutomationRunSummary` of a run state.
fn summary_of(state: &Value) -> Value {
    let mut s = json!({
        "resource": state["resource"],
        "automation": state["automation"],
        "origin": state["origin"],
        "lifecycle": state["lifecycle"],
        "sessionCount": state["sessions"].as_array().map_or(0, Vec::len),
        "_meta": state["_meta"],
    });
    if let Some(p) = state.get("primarySession") {
        s["primarySession"] = p.clone();
    }
    s
}

/// The actions that turn `old` into `new` (one run's state).
pub(crate) fn diff(old: &Value, new: &Value) -> Vec<Value> {
    let mut actions = Vec::new();
    let list = |v: &Value| -> Vec<String> {
        v["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let (was, now) = (list(old), list(new));
    for s in was.iter().filter(|s| !now.contains(s)) {
        actions.push(json!({"type": "automationRun/sessionRemoved", "session": s}));
    }
    for s in now.iter().filter(|s| !was.contains(s)) {
        actions.push(json!({"type": "automationRun/sessionSet", "session": s}));
    }
    if old.get("primarySession") != new.get("primarySession") {
        let mut a = json!({"type": "automationRun/primarySessionChanged"});
        if let Some(p) = new.get("primarySession") {
            a["primarySession"] = p.clone();
        }
        actions.push(a);
    }
    if old["lifecycle"] != new["lifecycle"] {
        // Every transition is an action: a run seen pending and then
        // ended (between two looks) went through running.
        let was = old["lifecycle"]["status"].as_str().unwrap_or_default();
        let now = new["lifecycle"]["status"].as_str().unwrap_or_default();
        let started = &new["lifecycle"]["startedAt"];
        if was == "pending" && now != "running" && now != "pending" && started.is_string() {
            actions.push(json!({"type": "automationRun/lifecycleChanged", "lifecycle": {
                "status": "running", "createdAt": new["lifecycle"]["createdAt"], "startedAt": started}}));
        }
        actions
            .push(json!({"type": "automationRun/lifecycleChanged", "lifecycle": new["lifecycle"]}));
    }
    actions
}

fn project_one(rt: &Runtime, uri: &str) -> Result<Value> {
    let (aid, index) = parse_run_uri(uri).ok_or_else(|| {
        Error::invalid(
            "resource",
            format!("{uri:?} is not an {RUN_SCHEME}<automation id>/<index> URI"),
        )
    })?;
    project_occurrences(rt, &aid)?
        .remove(&index)
        .ok_or_else(|| {
            Error::from(stepwell::automation::AutomationError::new(
                "occurrence_not_found",
                Some("resource"),
                format!("automation {aid} has no occurrence {index}"),
            ))
        })
}

/// `GET /v1/automations/{id}/runs`: the run summaries of an automation's
/// history, newest first.
pub(crate) async fn run_summaries(
    State(s): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> std::result::Result<Response, ApiError> {
    let items = blocking(move || {
        Ok(project_occurrences(&s.rt, &id)?
            .values()
            .rev()
            .map(summary_of)
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(axum::Json(json!({"items": items})).into_response())
}

/// `GET /v1/ahp`: the WebSocket.
pub(crate) async fn upgrade(State(s): State<Arc<Shared>>, ws: WebSocketUpgrade) -> Response {
    ws.protocols(["ahp.v1"])
        .max_message_size(1 << 20)
        .on_upgrade(move |socket| connection(s, socket))
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn rpc_error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let mut e = json!({"code": code, "message": message});
    if let Some(d) = data {
        e["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": e})
}

/// The JSON-RPC error of a library error: -32602 for bad parameters,
/// -32004 for an unknown resource, -32603 otherwise; `data` carries the
/// reason code.
fn rpc_error_of(id: &Value, e: &ApiError) -> Value {
    let code = match e.status.as_u16() {
        400 => -32602,
        404 => -32004,
        _ => -32603,
    };
    rpc_error(
        id,
        code,
        e.detail["message"].as_str().unwrap_or("error"),
        Some(e.detail.clone()),
    )
}

struct Conn {
    s: Arc<Shared>,
    client_id: String,
    server_seq: u64,
    subscriptions: BTreeMap<String, Value>,
}

impl Conn {
    fn envelope(&mut self, channel: &str, action: Value, origin: Value) -> Value {
        self.server_seq += 1;
        json!({"jsonrpc": "2.0", "method": "action", "params": {
            "channel": channel, "action": action, "serverSeq": self.server_seq, "origin": origin}})
    }

    async fn project(&self, uri: String) -> std::result::Result<Value, ApiError> {
        let s = self.s.clone();
        blocking(move || project_one(&s.rt, &uri)).await
    }

    async fn subscribe(&mut self, uri: &str) -> std::result::Result<Value, ApiError> {
        if !self.subscriptions.contains_key(uri) && self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            return Err(ApiError::invalid(
                "resource",
                format!("at most {MAX_SUBSCRIPTIONS} subscriptions per connection"),
            ));
        }
        let state = self.project(uri.to_string()).await?;
        self.subscriptions.insert(uri.to_string(), state.clone());
        Ok(json!({"resource": uri, "state": state, "fromSeq": self.server_seq}))
    }

    /// Handles one message; returns what to send back.
    async fn handle(&mut self, text: &str) -> Vec<Value> {
        let msg: Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return vec![rpc_error(
                    &Value::Null,
                    -32700,
                    &format!("parse error: {e}"),
                    None,
                )]
            }
        };
        if !msg.is_object() {
            return vec![rpc_error(
                &Value::Null,
                -32600,
                "send one JSON-RPC object per frame (batches are not supported)",
                None,
            )];
        }
        let id = msg.get("id").cloned();
        let method = msg
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let resource = params
            .get("resource")
            .or_else(|| params.get("channel"))
            .and_then(Value::as_str)
            .map(str::to_string);
        match (method, id) {
            ("initialize", Some(id)) => {
                self.client_id = params
                    .get("clientId")
                    .and_then(Value::as_str)
                    .unwrap_or("anonymous")
                    .to_string();
                let mut snapshots = Vec::new();
                for uri in params["initialSubscriptions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if let Ok(snap) = self.subscribe(uri).await {
                        snapshots.push(snap);
                    }
                }
                vec![rpc_result(
                    &id,
                    json!({"protocolVersion": AHP_PROTOCOL_VERSION, "serverSeq": self.server_seq,
                           "snapshots": snapshots,
                           "capabilities": {"automationRuns": {"runCancellation": true}}}),
                )]
            }
            ("ping", Some(id)) => vec![rpc_result(&id, json!({}))],
            ("subscribe", Some(id)) => match resource {
                None => vec![rpc_error(&id, -32602, "params.resource is required", None)],
                Some(uri) => match self.subscribe(&uri).await {
                    Ok(r) => vec![rpc_result(&id, r)],
                    Err(e) => vec![rpc_error_of(&id, &e)],
                },
            },
            ("listAutomationRuns", Some(id)) => {
                let Some(aid) = params
                    .get("automation")
                    .and_then(Value::as_str)
                    .and_then(|u| u.strip_prefix(AUTOMATION_SCHEME))
                    .map(str::to_string)
                else {
                    return vec![rpc_error(
                        &id,
                        -32602,
                        "params.automation must be an ahp-automation:/<id> URI",
                        None,
                    )];
                };
                let s = self.s.clone();
                match blocking(move || project_occurrences(&s.rt, &aid)).await {
                    Ok(all) => {
                        let items: Vec<Value> = all.values().rev().map(summary_of).collect();
                        vec![rpc_result(&id, json!({"items": items}))]
                    }
                    Err(e) => vec![rpc_error_of(&id, &e)],
                }
            }
            ("unsubscribe", id) => {
                if let Some(uri) = resource {
                    self.subscriptions.remove(&uri);
                }
                id.map(|id| vec![rpc_result(&id, json!({}))])
                    .unwrap_or_default()
            }
            ("dispatchAction", id) => {
                let mut out = self.dispatch(&params).await;
                if let Some(id) = id {
                    out.insert(0, rpc_result(&id, json!({})));
                }
                out
            }
            (_, Some(id)) => vec![rpc_error(
                &id,
                -32601,
                &format!("method not found: {method}"),
                None,
            )],
            _ => Vec::new(),
        }
    }

    /// A client's action: only `automationRun/cancelRequested` is
    /// dispatchable. The action comes back with its origin, and a
    /// `rejectionReason` when it was refused; its outcome arrives as a
    /// lifecycle action.
    async fn dispatch(&mut self, params: &Value) -> Vec<Value> {
        let channel = params
            .get("channel")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let client_seq = params.get("clientSeq").cloned().unwrap_or(Value::Null);
        let action = params.get("action").cloned().unwrap_or(Value::Null);
        let origin = json!({"clientId": self.client_id, "clientSeq": client_seq});
        let refusal = match action.get("type").and_then(Value::as_str) {
            Some("automationRun/cancelRequested") => self.cancel(&channel, &client_seq).await.err(),
            Some(other) => Some(format!("{other} is not a client-dispatchable action")),
            None => Some("the action has no type".to_string()),
        };
        let mut env = self.envelope(&channel, action, origin);
        if let Some(r) = refusal {
            env["params"]["rejectionReason"] = json!(r);
        }
        let mut out = vec![env];
        out.extend(self.refresh().await);
        out
    }

    async fn cancel(
        &mut self,
        channel: &str,
        client_seq: &Value,
    ) -> std::result::Result<(), String> {
        let (aid, index) = parse_run_uri(channel)
            .ok_or_else(|| format!("{channel:?} is not an automation run"))?;
        let state = self.project(channel.to_string()).await.map_err(|e| {
            e.detail["message"]
                .as_str()
                .unwrap_or("unknown run")
                .to_string()
        })?;
        let status = state["lifecycle"]["status"].as_str().unwrap_or_default();
        if status != "pending" && status != "running" {
            return Err(format!(
                "the run is {status}: only a pending or running run can be cancelled"
            ));
        }
        let s = self.s.clone();
        let seq = client_seq
            .as_u64()
            .map_or_else(|| "none".to_string(), |n| n.to_string());
        let client: String = self.client_id.chars().take(64).collect();
        let command_id = format!("ahp:{client}:{channel}:{seq}");
        let answer = blocking(move || {
            // stop_current stops the automation's current occurrence: the
            // command names this one, and is refused in the automation's
            // own transaction if another is current by then.
            super::api::apply_command(
                &s,
                &aid,
                &super::api::CommandBody::stop_current(command_id, index),
            )
        })
        .await
        .map_err(|e| e.detail["message"].as_str().unwrap_or("error").to_string())?;
        if answer["status"] == "applied" {
            Ok(())
        } else {
            Err(answer["error"]["message"]
                .as_str()
                .unwrap_or("the host refused to cancel")
                .to_string())
        }
    }

    /// Projects every subscription again (each automation once) and
    /// returns the actions of what changed.
    async fn refresh(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        let uris: Vec<String> = self.subscriptions.keys().cloned().collect();
        let automations: std::collections::BTreeSet<String> = uris
            .iter()
            .filter_map(|u| parse_run_uri(u).map(|(aid, _)| aid))
            .collect();
        let s = self.s.clone();
        let projected = blocking(move || {
            let mut all = BTreeMap::new();
            for aid in automations {
                if let Ok(states) = project_occurrences(&s.rt, &aid) {
                    all.insert(aid, states);
                }
            }
            Ok(all)
        })
        .await
        .unwrap_or_default();
        for uri in uris {
            let Some(now) = parse_run_uri(&uri)
                .and_then(|(aid, index)| projected.get(&aid)?.get(&index).cloned())
            else {
                continue;
            };
            let old = self.subscriptions.get(&uri).cloned().unwrap_or(Value::Null);
            for action in diff(&old, &now) {
                out.push(self.envelope(&uri, action, Value::Null));
            }
            self.subscriptions.insert(uri, now);
        }
        out
    }
}

/// The most subscriptions one connection holds.
const MAX_SUBSCRIPTIONS: usize = 100;

async fn connection(s: Arc<Shared>, mut socket: WebSocket) {
    let mut commits = s.commits.clone();
    // One timer for the connection: a chatty client cannot keep resetting
    // it (other processes' commits are seen only through it).
    let mut tick = tokio::time::interval(s.poll_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = s.shutdown.clone();
    let mut conn = Conn {
        s: s.clone(),
        client_id: "anonymous".into(),
        server_seq: 0,
        subscriptions: BTreeMap::new(),
    };
    loop {
        let out = tokio::select! {
            msg = socket.recv() => match msg {
                Some(Ok(Message::Text(t))) => conn.handle(t.as_str()).await,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => Vec::new(),
                Some(Ok(Message::Binary(_))) => vec![rpc_error(&Value::Null, -32600, "send JSON-RPC as text frames", None)],
                _ => return,
            },
            _ = commits.changed() => conn.refresh().await,
                        _ = tick.tick() => {
                if conn.subscriptions.is_empty() || s.has_feed { Vec::new() } else { conn.refresh().await }
            }
            _ = shutdown.changed() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
        };
        for m in out {
            if socket
                .send(Message::Text(m.to_string().into()))
                .await
                .is_err()
            {
                return;
            }
        }
    }
}

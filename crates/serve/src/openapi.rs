//! The OpenAPI 3.1 document of the API, served at `/openapi.json`. The
//! route table here is checked against the router by a test (every route
//! documented, every documented route answered).

use serde_json::{json, Map, Value};

/// One documented operation: method, path, summary, whether it needs the
/// token, its query parameters, whether it takes a JSON body, its success
/// status.
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    token: bool,
    query: &'static [&'static str],
    body: bool,
    ok: u16,
}

const fn op(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    query: &'static [&'static str],
    body: bool,
    ok: u16,
) -> Op {
    Op {
        method,
        path,
        summary,
        token: true,
        query,
        body,
        ok,
    }
}

const OPEN: bool = false;

const OPS: &[Op] = &[
    Op { token: OPEN, ..op("get", "/", "The dashboard's static shell (no data until the token is entered)", &[], false, 200) },
    Op { token: OPEN, ..op("get", "/assets/app.js", "The dashboard's script", &[], false, 200) },
    Op { token: OPEN, ..op("get", "/assets/app.css", "The dashboard's style sheet", &[], false, 200) },
    Op { token: OPEN, ..op("get", "/v1/health", "Liveness: {status, version}", &[], false, 200) },
    Op { token: OPEN, ..op("get", "/openapi.json", "This document", &[], false, 200) },
    op("get", "/metrics", "Prometheus metrics: runs by status, steps, resumes, guest time, commit latency, requests", &[], false, 200),
    op("get", "/v1/runs", "Runs, newest first, filtered (since/until: created in that RFC 3339 window; such a page may hold fewer than limit runs: follow next_cursor), one page", &["status", "wait_reason", "workflow_id", "parent_run_id", "since", "until", "limit", "cursor", "view"], false, 200),
    op("post", "/v1/runs", "Start a run of a bundle or a known workflow; answers its state after its first tick", &[], true, 201),
    op("get", "/v1/runs/{id}", "A run's state", &[], false, 200),
    op("post", "/v1/runs/{id}/resume", "Answer the run's wait (payload; wait_key optional); 202 with resuming: true while an approved tool batch runs in flight", &[], true, 200),
    op("post", "/v1/runs/{id}/cancel", "Cancel a run and its unfinished children", &[], true, 200),
    op("get", "/v1/runs/{id}/ledger", "A page of a run's ledger records, oldest first, each with its seq (Link: rel=next on a full page)", &["after", "limit"], false, 200),
    op("get", "/v1/runs/{id}/flow", "The flow the run executes: entry, current node, nodes with kind, effect, next and routes", &[], false, 200),
    op("get", "/v1/runs/{id}/ledger/verify", "Check the run's ledger hash chain", &[], false, 200),
    op("get", "/v1/runs/{id}/ledger/stream", "Server-Sent Events: record, state, end; resumable (after, Last-Event-ID)", &["after"], false, 200),
    op("post", "/v1/runs/{id}/snapshots", "Take a snapshot of a run", &[], true, 201),
    op("get", "/v1/stream", "Server-Sent Events of every commit of the store: record, run; resumable", &["after"], false, 200),
    op("get", "/v1/waits", "Runs waiting on a person (questions and tool approvals), newest first", &["limit", "cursor"], false, 200),
    op("get", "/v1/snapshots", "Search snapshots", &["run_id", "tag", "text", "limit"], false, 200),
    op("post", "/v1/snapshots/{id}/restore", "Make a snapshot's state the run's state again", &[], false, 200),
    op("get", "/v1/sessions/{id}/turns", "A session's turns", &["automation_id", "through_occurrence", "limit"], false, 200),
    op("get", "/v1/sessions/{id}/history", "A session's chat history as a model is handed it", &["max_tokens", "automation_id", "through_occurrence"], false, 200),
    op("get", "/v1/automations", "Automations, newest first", &["status", "cursor", "limit"], false, 200),
    op("post", "/v1/automations", "Create an automation (or find it again: 200 when it existed)", &[], true, 201),
    op("get", "/v1/automations/{id}", "An automation: definition, state, status, next fire time, current occurrence", &[], false, 200),
    op("post", "/v1/automations/{id}/commands", "Apply a command (pause, resume, run_now, revise, stop_current, archive, unarchive); 422 when rejected", &[], true, 200),
    op("get", "/v1/automations/{id}/occurrences", "An automation's occurrences, newest first", &["cursor", "limit"], false, 200),
    op("get", "/v1/automations/{id}/waits", "The waits on a person in an automation's occurrences", &["limit"], false, 200),
    op("get", "/v1/automations/{id}/attention", "Attention items (failures, notifications), oldest first; acknowledge by cursor", &["after_seq", "cursor", "limit"], false, 200),
    op("get", "/v1/automations/{id}/runs", "AHP run summaries of the automation's history, newest first", &[], false, 200),
    op("post", "/v1/automations/{id}/discussions", "Start (or find again) a discussion of an occurrence", &[], true, 201),
    op("get", "/v1/triggers", "Trigger sources with their descriptors and availability", &[], false, 200),
    op("get", "/v1/tools", "Tools with their class, origin and availability", &[], false, 200),
    op("post", "/v1/triggers/{source}/validate", "Validate a trigger config (source as schedule@1); answers it with its defaults", &[], true, 200),
    op("post", "/v1/triggers/{source}/preview", "The next fire times of a trigger config (config, from, count)", &[], true, 200),
    op("get", "/v1/quarantined", "Runs set aside because they cannot be read or committed, and why", &[], false, 200),
    op("post", "/v1/runs/{id}/fork", "A new run from a past point of the run (a ledger record `at`, or `snapshot_id`), with `vars` patched over the vars there; 201 with its state", &[], true, 201),
    op("get", "/v1/runs/{id}/fork-points", "The points of the run's history a fork can start from: {seq, node_id, started_at, reproducible}", &[], false, 200),
    op("get", "/v1/runs/{id}/evidence", "The evidence the run's outside-world tool calls left: {evidence_id, seq, record}", &[], false, 200),
    op("get", "/v1/runs/{id}/export", "The run's history as one self-verifying file (application/zip): state, ledger, artifacts, its version's files", &["with_children"], false, 200),
    op("get", "/v1/workflows", "Deployed workflows: each one's latest version and how many it has", &[], false, 200),
    op("get", "/v1/workflows/{id}/versions", "A workflow's versions, each with its runs by status", &[], false, 200),
    op("post", "/v1/deployments", "Deploy a packed bundle (body: application/zip) or {path, deployed_by?} the server can read: 201 new versions, 200 unchanged", &[], true, 201),
    op("get", "/v1/ahp", "WebSocket: the AHP automation-run channel (JSON-RPC 2.0)", &[], false, 101),
    Op { token: OPEN, ..op("post", "/v1/hooks/{connection_id}", "A Standard Webhooks call to a webhook.received@1 connection (the signature is the credential): 202 appended, 409 duplicate id, 401 bad or stale signature, 404 unknown or disabled connection, 413 over 1 MiB, 415 neither JSON nor UTF-8 text", &[], true, 202) },
    op("get", "/v1/connections", "Trigger connections (never their secrets)", &[], false, 200),
    op("post", "/v1/connections", "Create a connection {source, label?, config?}; the only answer that shows its secret", &[], true, 201),
    op("get", "/v1/connections/{id}", "A connection (never its secret)", &[], false, 200),
    op("post", "/v1/connections/{id}/disable", "Disable a connection (webhook calls get 404, feeds are not polled)", &[], false, 200),
    op("post", "/v1/connections/{id}/enable", "Enable a disabled connection", &[], false, 200),
    op("post", "/v1/connections/{id}/rotate-secret", "A new signing secret (shown once; the old one stops working)", &[], false, 200),
    op("get", "/v1/connections/{id}/events", "The events of a connection's stream after a seq", &["after", "limit"], false, 200),
    op("post", "/v1/connections/{id}/events", "Append a test or plugin event {data, subject?} to a connection's stream", &[], true, 201),
];

/// The (method, path) of every documented operation.
pub fn documented_routes() -> Vec<(&'static str, &'static str)> {
    OPS.iter().map(|o| (o.method, o.path)).collect()
}

/// The OpenAPI document.
pub fn openapi_document() -> Value {
    let mut paths = Map::new();
    for o in OPS {
        let mut params: Vec<Value> = o
            .query
            .iter()
            .map(|q| json!({"name": q, "in": "query", "required": false, "schema": {"type": "string"}}))
            .collect();
        for name in ["id", "source"] {
            if o.path.contains(&format!("{{{name}}}")) {
                params.insert(
                    0,
                    json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}),
                );
            }
        }
        let mut operation = json!({
            "summary": o.summary,
            "operationId": format!("{}{}", o.method, o.path.replace(['/', '{', '}', '.'], "_")),
            "parameters": params,
            "responses": {
                o.ok.to_string(): {"description": "success", "content": {"application/json": {"schema": {}}}},
                "default": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        });
        if o.token {
            operation["security"] = json!([{"bearer": []}]);
        } else {
            operation["security"] = json!([]);
        }
        if o.body {
            operation["requestBody"] = json!({"required": false, "content": {"application/json": {"schema": {"type": "object"}}}});
        }
        paths
            .entry(o.path.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("an object")
            .insert(o.method.to_string(), operation);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "stepwell",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The HTTP API of `stepwell serve`: runs, ledgers, live streams, automations, the AHP automation-run channel. See docs/http.md.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {"type": "object", "required": ["code", "message"], "properties": {
                        "code": {"type": "string", "description": "The library's reason code (run_not_found, stale_resume, invalid_input, ...)"},
                        "message": {"type": "string"},
                        "field": {"type": "string", "description": "The input at fault, when one is"},
                    }}},
                },
            },
        },
        "security": [{"bearer": []}],
    })
}

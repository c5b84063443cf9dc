//! Evidence: what a tool that reaches the outside world did, kept as
//! artifacts. After a `tool_calls` batch runs, each call of an `exec` or
//! `comms` tool (and of a tool named `execute_command`, `fetch_url` or
//! `web_search`, whatever its class) gets an evidence record: a JSON
//! artifact with the call, its outcome, its timing and the approval that
//! allowed it; a command's standard output and error are artifacts of their
//! own that it names. The call's result names its record
//! (`meta.evidence_id`), so the ledger is the index: [`list`] reads it, and
//! an export takes the records (and what they name) with the run.

use serde_json::{json, Map, Value};

use stepwell_runtime::core::secrets::redact;
use stepwell_runtime::effects::EffectCx;
use stepwell_runtime::store::artifacts::ArtifactStore;
use stepwell_runtime::{Result, Runtime};

use crate::ToolClass;

/// Tools whose calls leave evidence whatever their class (the reference's
/// default set).
pub const EVIDENCE_TOOL_NAMES: [&str; 3] = ["execute_command", "fetch_url", "web_search"];

/// Whether a call of tool `name`, of `class`, leaves evidence: it runs
/// commands or sends messages, or it is one of [`EVIDENCE_TOOL_NAMES`].
pub fn leaves_evidence(name: &str, class: Option<ToolClass>) -> bool {
    matches!(class, Some(ToolClass::Exec | ToolClass::Comms)) || EVIDENCE_TOOL_NAMES.contains(&name)
}

/// The approval a batch ran under: the wait it ended and the answer.
pub(crate) fn approval(wait_key: &str, payload: &Value, at: &str) -> Value {
    json!({"wait_key": wait_key, "answer": redact(payload), "answered_at": at})
}

/// What ran in a batch: each call's tool class and arguments, by call id.
pub(crate) struct Ran<'a> {
    /// The tool class of a tool name.
    pub class_of: &'a dyn Fn(&str) -> Option<ToolClass>,
    /// The calls that ran (`call_json` form: `name`, `call_id`,
    /// `arguments`).
    pub calls: &'a [Value],
    /// The approval they ran under, if one was asked.
    pub approval: Option<&'a Value>,
}

/// Records the evidence of the calls in `results` that leave it (see
/// [`leaves_evidence`]) and ran (a call refused or denied never reached
/// the outside world: no output, no success), under the run of `cx`, and
/// names each record in its result's `meta.evidence_id`. Best effort: a
/// store that fails leaves the call without evidence and says so in its
/// result (`meta.evidence_error`), and the batch goes on.
pub(crate) fn record(cx: &EffectCx<'_>, results: &mut [Value], ran: &Ran<'_>) {
    let Some(store) = cx.artifacts else {
        return;
    };
    let at = stepwell_runtime::core::clock::format_time(cx.now);
    for row in results.iter_mut() {
        let name = row["name"].as_str().unwrap_or_default().to_string();
        let class = (ran.class_of)(&name);
        let reached = !row["output"].is_null() || row["success"] == true;
        if !leaves_evidence(&name, class) || !reached {
            continue;
        }
        let call = ran
            .calls
            .iter()
            .find(|c| c["call_id"] == row["call_id"] && c["name"] == row["name"]);
        let arguments = call.map(|c| &c["arguments"]).unwrap_or(&Value::Null);
        let meta = match one(store, cx, row, (class, arguments), ran.approval, &at) {
            // The reference as a reference too: an export takes it.
            Ok(id) => json!({"evidence_id": id, "evidence": {"$artifact": id}}),
            Err(e) => json!({"evidence_error": e.to_string()}),
        };
        match row.get_mut("meta").and_then(Value::as_object_mut) {
            Some(m) => m.extend(meta.as_object().cloned().unwrap_or_default()),
            None => row["meta"] = meta,
        }
    }
}

/// Stores one call's evidence; its artifact id.
fn one(
    store: &dyn ArtifactStore,
    cx: &EffectCx<'_>,
    row: &Value,
    (class, arguments): (Option<ToolClass>, &Value),
    approval: Option<&Value>,
    at: &str,
) -> std::result::Result<String, stepwell_runtime::store::StoreError> {
    let run = cx.run;
    let output = &row["output"];
    let mut record = json!({
        "kind": "evidence",
        "tool_name": row["name"],
        "class": class.map(|c| c.as_str()),
        "call_id": row["call_id"],
        "runtime_call_id": row["runtime_call_id"],
        "success": row["success"] == true,
        "error": row["error"],
        "created_at": at,
        "run_id": run.run_id,
        "workflow_id": run.workflow_id,
        "node_id": run.current_node,
        "effect_key": cx.key,
        "arguments": redact(arguments),
        "approval": approval,
    });
    let mut artifacts = Map::new();
    if let Some(out) = output.as_object() {
        for field in [
            "command",
            "return_code",
            "duration_s",
            "working_directory",
            "platform",
            "stdout_truncated",
            "stderr_truncated",
        ] {
            if let Some(v) = out.get(field) {
                record[field] = v.clone();
            }
        }
        for field in ["stdout", "stderr"] {
            if let Some(text) = out
                .get(field)
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                let meta = store.put(
                    text.as_bytes(),
                    "text/plain; charset=utf-8",
                    Some(&run.run_id),
                    at,
                )?;
                artifacts.insert(field.into(), json!({"$artifact": meta.artifact_id}));
            }
        }
    }
    if artifacts.is_empty() && !output.is_null() {
        let bytes = serde_json::to_vec(output).unwrap_or_default();
        let meta = store.put(&bytes, "application/json", Some(&run.run_id), at)?;
        artifacts.insert("output".into(), json!({"$artifact": meta.artifact_id}));
    }
    record["artifacts"] = Value::Object(artifacts);
    let bytes = serde_json::to_vec(&record).unwrap_or_default();
    Ok(store
        .put(&bytes, "application/json", Some(&run.run_id), at)?
        .artifact_id)
}

/// One evidence record of a run, as [`list`] answers it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Evidence {
    /// The record's artifact id.
    pub evidence_id: String,
    /// The ledger record whose result names it.
    pub seq: u64,
    /// The record (see the module doc), or `None` when the artifact
    /// store no longer has it.
    pub record: Option<Value>,
}

/// The evidence records of `run_id`, oldest first: read from its ledger
/// (a page at a time), each loaded from the artifact store.
pub fn list(rt: &Runtime, run_id: &str) -> Result<Vec<Evidence>> {
    rt.get_state(run_id)?;
    let store = rt.artifact_store();
    let mut found = Vec::new();
    for page in rt.ledger_pages(run_id, 0) {
        for (seq, r) in page? {
            let rows = r.result.as_ref().and_then(|v| v["results"].as_array());
            for row in rows.into_iter().flatten() {
                let Some(id) = row["meta"]["evidence_id"].as_str() else {
                    continue;
                };
                let record: Option<Value> = match store {
                    Some(s) => s
                        .get(id)?
                        .and_then(|bytes| serde_json::from_slice(&bytes).ok()),
                    None => None,
                };
                // Only this run's own: a result that names another run's
                // record (a caller's, handed in) is not its evidence.
                if record.as_ref().is_some_and(|r| r["run_id"] != run_id) {
                    continue;
                }
                found.push(Evidence {
                    evidence_id: id.to_string(),
                    seq,
                    record,
                });
            }
        }
    }
    Ok(found)
}

/// `results` handed in by a caller (calls run outside) without the
/// evidence fields only the host writes.
pub(crate) fn strip(results: &mut [Value]) {
    for row in results {
        if let Some(meta) = row.get_mut("meta").and_then(Value::as_object_mut) {
            meta.retain(|k, _| !k.starts_with("evidence"));
        }
    }
}

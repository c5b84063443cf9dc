//! The parts of `tool_calls` that decide, without running anything: how a
//! batch is normalised and keyed, the ceiling of allowed tools across a run
//! tree, whether a batch needs a person's approval, how a tool's returned
//! value counts as a failure, and how results merge back by position (llm-
//! tools spec 3.2-3.8).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use stepwell_automation_core::ids::canonical_json_ascii as canonical_json;
use stepwell_runtime::core::model::RunState;

/// Tools that run without approval by default (the reference's safe set).
pub const DEFAULT_AUTO_APPROVE: [&str; 23] = [
    "list_files",
    "open_attachment",
    "skim_folders",
    "analyze_code",
    "read_file",
    "skim_files",
    "search_files",
    "web_search",
    "skim_websearch",
    "skim_url",
    "send_telegram_message",
    "send_telegram_artifact",
    "agora_whoami",
    "agora_check_inbox",
    "agora_ack_inbox",
    "agora_read_channel",
    "agora_read_message",
    "agora_post_message",
    "agora_send_dm",
    "channel_fs_read",
    "channel_fs_list",
    "channel_store_get",
    "local_helper_status",
];

/// Tools that always ask by default (unknown tools ask too).
pub const DEFAULT_REQUIRE_APPROVAL: [&str; 15] = [
    "fetch_url",
    "browser_probe",
    "write_file",
    "edit_file",
    "execute_command",
    "local_helper_start",
    "local_helper_stop",
    "shell_exec",
    "shell_write_stdin",
    "shell_close",
    "send_email",
    "send_whatsapp_message",
    "channel_fs_write",
    "channel_store_set",
    "execute_python",
];

/// Arguments as an object: an object as is, a JSON string parsed (a
/// non-object becomes `{}`), anything else `{}`.
pub fn arguments_object(raw: Option<&Value>) -> Map<String, Value> {
    match raw {
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) if !s.trim().is_empty() => match serde_json::from_str(s) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        },
        _ => Map::new(),
    }
}

/// One call in the flat form `{name, arguments, call_id?, ...}`: the
/// OpenAI form `{id, type: "function", function: {name, arguments}}` is
/// flattened (a stepwell extension).
fn flatten(call: &Map<String, Value>) -> Map<String, Value> {
    let mut out = call.clone();
    if let Some(f) = call.get("function").and_then(Value::as_object) {
        if out.get("name").and_then(Value::as_str).is_none() {
            if let Some(n) = f.get("name") {
                out.insert("name".into(), n.clone());
            }
        }
        if !out.contains_key("arguments") {
            if let Some(a) = f.get("arguments") {
                out.insert("arguments".into(), a.clone());
            }
        }
        out.remove("function");
        out.remove("type");
    }
    out
}

/// The payload as the reference hashes it: provider ids dropped from each
/// call, names trimmed, arguments parsed, `allowed_tools` sorted unique.
pub fn payload_for_key(payload: &Map<String, Value>) -> Value {
    let mut out = payload.clone();
    if let Some(calls) = payload.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| match c.as_object() {
                None => c.clone(),
                Some(m) => {
                    let mut m = flatten(m);
                    for k in [
                        "call_id",
                        "id",
                        "runtime_call_id",
                        "model_call_id",
                        "idempotency_key",
                    ] {
                        m.remove(k);
                    }
                    if let Some(n) = m.get("name").and_then(Value::as_str) {
                        let n = n.trim().to_string();
                        m.insert("name".into(), json!(n));
                    }
                    m.insert(
                        "arguments".into(),
                        Value::Object(arguments_object(m.get("arguments"))),
                    );
                    Value::Object(m)
                }
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(Value::Array(names)) = payload.get("allowed_tools") {
        out.insert("allowed_tools".into(), json!(sorted_names(names)));
    }
    Value::Object(out)
}

fn sorted_names(names: &[Value]) -> Vec<String> {
    names
        .iter()
        .filter_map(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The reference's effect digest (32 hex): SHA-256 of the canonical JSON
/// of `{run_id, node_id, effect_type, effect_payload, effect_seq}`, with
/// the run's effect counter before this effect. It names `runtime_call_id`s
/// and approval wait keys; stepwell's idempotency key stays
/// `<run_id>:<seq>`.
pub fn effect_digest(run: &RunState, seq: u64, payload: &Map<String, Value>) -> String {
    let doc = json!({
        "run_id": run.run_id,
        "node_id": run.current_node,
        "effect_type": "tool_calls",
        "effect_payload": payload_for_key(payload),
        "effect_seq": seq.saturating_sub(1),
    });
    let digest = Sha256::digest(canonical_json(&doc).as_bytes());
    hex::encode(digest)[..32].to_string()
}

/// A call after normalisation: its position, ids, name and arguments (or
/// why it is not a call at all).
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// Its position in the batch.
    pub index: usize,
    /// The call id (the provider's, else the runtime's).
    pub call_id: String,
    /// `rtcall_<digest>_<n>`: the id a worker should use as its own
    /// idempotency key.
    pub runtime_call_id: String,
    /// The tool's name, trimmed (`""` when missing).
    pub name: String,
    /// The arguments as an object.
    pub arguments: Map<String, Value>,
    /// Whether the entry was an object at all.
    pub valid: bool,
}

/// Normalises a batch (spec 3.2): ids filled in, names trimmed, arguments
/// parsed.
pub fn normalize(calls: &[Value], digest: &str) -> Vec<Call> {
    calls
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let runtime_call_id = format!("rtcall_{digest}_{}", index + 1);
            let Some(m) = c.as_object() else {
                return Call {
                    index,
                    call_id: String::new(),
                    runtime_call_id,
                    name: String::new(),
                    arguments: Map::new(),
                    valid: false,
                };
            };
            let m = flatten(m);
            let text = |k: &str| {
                m.get(k)
                    .and_then(Value::as_str)
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
            };
            let runtime_call_id = text("runtime_call_id").unwrap_or(runtime_call_id);
            Call {
                index,
                call_id: text("call_id")
                    .or_else(|| text("id"))
                    .unwrap_or_else(|| runtime_call_id.clone()),
                runtime_call_id,
                name: text("name").unwrap_or_default(),
                arguments: arguments_object(m.get("arguments")),
                valid: true,
            }
        })
        .collect()
}

/// The call as a wait's details and a worker show it.
pub fn call_json(c: &Call) -> Value {
    json!({"name": c.name, "arguments": c.arguments, "call_id": c.call_id,
           "runtime_call_id": c.runtime_call_id})
}

/// A result row.
pub fn result(c: &Call, success: bool, output: Value, error: Option<String>) -> Value {
    json!({"call_id": c.call_id, "runtime_call_id": c.runtime_call_id, "name": c.name,
           "success": success, "output": output, "error": error})
}

/// A failed result row with `error`.
pub fn failed(c: &Call, error: impl Into<String>) -> Value {
    result(c, false, Value::Null, Some(error.into()))
}

/// Intersects the `allowed_tools` of `local` (an effect payload) with the
/// run's and every ancestor's `_runtime.allowed_tools` (spec 3.8). `None`:
/// unrestricted. `parent` reads a run by id. Errors are the reference's
/// texts; an ancestry that cannot be verified fails closed.
pub fn resolve_ceiling(
    local: Option<&Map<String, Value>>,
    run: &RunState,
    parent: &dyn Fn(&str) -> Result<RunState, String>,
) -> Result<Option<BTreeSet<String>>, String> {
    let mut ceiling: Option<BTreeSet<String>> = None;
    let mut include = |scope: Option<&Value>| -> Result<(), String> {
        let Some(raw) = scope
            .and_then(Value::as_object)
            .and_then(|m| m.get("allowed_tools"))
        else {
            return Ok(());
        };
        let Value::Array(names) = raw else {
            return Err("allowed_tools must be a list when explicitly set".into());
        };
        let names: BTreeSet<String> = sorted_names(names).into_iter().collect();
        ceiling = Some(match ceiling.take() {
            None => names,
            Some(c) => c.intersection(&names).cloned().collect(),
        });
        Ok(())
    };
    if let Some(local) = local {
        include(Some(&Value::Object(local.clone())))?;
    }
    let mut current = run.clone();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for _ in 0..256 {
        if !seen.insert(current.run_id.clone()) {
            return Err("Cannot resolve tool scope: cyclic run ancestry".into());
        }
        include(current.vars.get("_runtime"))?;
        let Some(parent_id) = current.parent_run_id.clone().filter(|p| !p.is_empty()) else {
            return Ok(ceiling);
        };
        if parent_id.trim().is_empty() {
            return Err("Cannot resolve tool scope: invalid parent run id".into());
        }
        let p = parent(&parent_id)
            .map_err(|_| "Cannot resolve tool scope: parent run could not be read".to_string())?;
        if p.run_id != parent_id {
            return Err("Cannot resolve tool scope: parent run is missing or mismatched".into());
        }
        current = p;
    }
    Err("Cannot resolve tool scope: run ancestry exceeds 256 levels".into())
}

/// Who decided a batch's approval.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalPolicy {
    /// Tools that run without asking.
    pub auto: BTreeSet<String>,
    /// Tools that always ask.
    pub require: BTreeSet<String>,
    /// `run` when `_runtime.tool_policy` decided, else `static`.
    pub source: &'static str,
}

impl ApprovalPolicy {
    /// The run's policy (`_runtime.tool_policy` naming any tool, also
    /// only as withheld: an automation's grant that withholds everything
    /// still decides) or the default sets. A run that reads untrusted input
    /// (`_runtime.untrusted_input: true`, set by an automation's grant and
    /// inherited by its children) never falls back to the defaults: what
    /// its policy does not pre-approve asks.
    pub fn of(run: &RunState) -> ApprovalPolicy {
        let names = |v: Option<&Value>| -> Option<BTreeSet<String>> {
            v.and_then(Value::as_array)
                .map(|a| sorted_names(a).into_iter().collect())
        };
        let runtime = run.vars.get("_runtime");
        let untrusted = runtime.and_then(|r| r.get("untrusted_input")) == Some(&Value::Bool(true));
        let policy = runtime
            .and_then(|r| r.get("tool_policy"))
            .and_then(Value::as_object);
        let auto = names(policy.and_then(|p| p.get("auto_approve_tools")));
        let require = names(policy.and_then(|p| p.get("require_approval_tools")));
        let withheld = names(policy.and_then(|p| p.get("withheld_tools")));
        if untrusted
            || auto.as_ref().is_some_and(|a| !a.is_empty())
            || require.as_ref().is_some_and(|r| !r.is_empty())
            || withheld.as_ref().is_some_and(|w| !w.is_empty())
        {
            return ApprovalPolicy {
                auto: auto.unwrap_or_default(),
                require: require.unwrap_or_default(),
                source: "run",
            };
        }
        ApprovalPolicy {
            auto: DEFAULT_AUTO_APPROVE.iter().map(|s| s.to_string()).collect(),
            require: DEFAULT_REQUIRE_APPROVAL
                .iter()
                .map(|s| s.to_string())
                .collect(),
            source: "static",
        }
    }

    /// Whether a batch of these tools (name and class) needs approval: any
    /// blank name, any name on the require list, or any name not on the
    /// auto list. The default list trusts a name only for a tool that
    /// reads or sends messages: a tool that calls itself `read_file` but
    /// writes still asks. A run policy's names are the operator's choice.
    pub fn needs_approval<'a>(
        &self,
        tools: impl IntoIterator<Item = (&'a str, crate::ToolClass)>,
    ) -> bool {
        use crate::ToolClass;
        tools.into_iter().any(|(n, class)| {
            n.trim().is_empty()
                || self.require.contains(n)
                || !self.auto.contains(n)
                || (self.source == "static" && !matches!(class, ToolClass::Read | ToolClass::Comms))
        })
    }

    /// The policy as a wait's details show it.
    pub fn details(&self) -> Value {
        let mut out = json!({"kind": "tool_approval", "policy_source": self.source});
        if self.source == "run" {
            out["policy"] =
                json!({"auto_approve_tools": self.auto, "require_approval_tools": self.require});
        }
        out
    }
}

/// Whether a tool's returned value reports a failure, and its text (spec
/// 3.4, "failure detection").
pub fn reported_failure(value: &Value) -> Option<String> {
    fn from_map(m: &Map<String, Value>) -> Option<String> {
        let err = m
            .get("error")
            .filter(|v| !v.is_null() && *v != "")
            .or_else(|| m.get("message").filter(|v| !v.is_null() && *v != ""));
        let text = |v: &Value| match v {
            Value::String(s) => s.trim().to_string(),
            other => other.to_string(),
        };
        let declared = m.get("success") == Some(&Value::Bool(false))
            || m.get("ok") == Some(&Value::Bool(false))
            || m.get("status_hint")
                .and_then(Value::as_str)
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("error"));
        if declared {
            let t = err.map(text).unwrap_or_default();
            return Some(if t.is_empty() {
                "Tool reported failure".into()
            } else {
                t
            });
        }
        err.map(|e| {
            let t = text(e);
            if t.is_empty() {
                "Tool reported failure".into()
            } else {
                t
            }
        })
    }
    match value {
        Value::Object(m) => from_map(m),
        Value::String(s) => {
            let t = s.trim();
            if t.is_empty() {
                return None;
            }
            if t.starts_with('{') && t.ends_with('}') {
                if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(t) {
                    return from_map(&m);
                }
            }
            if let Some(rest) = t.strip_prefix("Error:") {
                let rest = rest.trim();
                return Some(if rest.is_empty() { t } else { rest }.to_string());
            }
            if t.starts_with(['❌', '🚫', '⏰']) {
                let mut cleaned = t.trim_start_matches(['❌', '🚫', '⏰']).trim();
                if let Some(rest) = cleaned.strip_prefix("Error:") {
                    cleaned = rest.trim();
                }
                return Some(if cleaned.is_empty() { t } else { cleaned }.to_string());
            }
            None
        }
        _ => None,
    }
}

/// A result row for a tool's returned value: a reported failure keeps an
/// object output and drops a string one.
pub fn from_output(c: &Call, output: Value) -> Value {
    match reported_failure(&output) {
        Some(error) => {
            let kept = if output.is_string() {
                Value::Null
            } else {
                output
            };
            result(c, false, kept, Some(error))
        }
        None => result(c, true, output, None),
    }
}

/// Merges a subset's results back into the full batch (spec 3.7): index `i`
/// takes `blocked[i]`, else the next subset result, else `Missing tool
/// result`.
pub fn merge(original_count: usize, blocked: &Map<String, Value>, results: &[Value]) -> Vec<Value> {
    let mut next = results.iter();
    (0..original_count)
        .map(|i| {
            blocked
                .get(&i.to_string())
                .cloned()
                .or_else(|| next.next().cloned())
                .unwrap_or_else(|| {
                    json!({"call_id": "", "runtime_call_id": null, "name": "", "success": false,
                           "output": null, "error": "Missing tool result"})
                })
        })
        .collect()
}

/// Canonicalises argument keys against a tool's JSON Schema properties
/// (spec 3.12): nested `{"name", "arguments"}` wrappers unwrapped (up to 4
/// levels), keys matched case-insensitively ignoring `_`, `-` and spaces,
/// the reference's synonyms (`path`, `filename`, `dir`, `query`, `regex`,
/// `start`, `end`, ...), never onto a `_`-prefixed parameter; keys the
/// schema does not name are dropped.
pub fn canonical_arguments(mut args: Map<String, Value>, schema: &Value) -> Map<String, Value> {
    for _ in 0..4 {
        let inner = match (args.get("name"), args.get("arguments")) {
            (Some(Value::String(_)), Some(Value::Object(inner))) if args.len() <= 3 => {
                inner.clone()
            }
            _ => break,
        };
        args = inner;
    }
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return args;
    };
    let squash = |k: &str| -> String {
        k.chars()
            .filter(|c| !matches!(c, '_' | '-' | ' '))
            .flat_map(char::to_lowercase)
            .collect()
    };
    const SYNONYMS: [(&str, &[&str]); 10] = [
        ("path", &["file_path", "directory_path", "path"]),
        ("filename", &["file_path"]),
        ("filepath", &["file_path"]),
        ("file", &["file_path"]),
        ("dir", &["directory_path", "path"]),
        ("directory", &["directory_path", "path"]),
        ("folder", &["directory_path", "path"]),
        ("query", &["pattern", "query"]),
        ("regex", &["pattern", "regex"]),
        ("start", &["start_line"]),
    ];
    let mut out = Map::new();
    for (k, v) in args {
        if props.contains_key(&k) {
            out.insert(k, v);
            continue;
        }
        let sk = squash(&k);
        let direct = props
            .keys()
            .find(|p| !p.starts_with('_') && squash(p) == sk)
            .cloned();
        let synonym = || {
            let cands: &[&str] = if sk == "end" {
                &["end_line"]
            } else {
                SYNONYMS.iter().find(|(s, _)| *s == sk).map(|(_, c)| *c)?
            };
            cands
                .iter()
                .find(|c| props.contains_key(**c))
                .map(|c| c.to_string())
        };
        if let Some(target) = direct.or_else(synonym) {
            out.entry(target).or_insert(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, parent: Option<&str>, allowed: Option<Value>) -> RunState {
        let mut vars = Map::new();
        if let Some(a) = allowed {
            vars.insert("_runtime".into(), json!({ "allowed_tools": a }));
        }
        RunState {
            version: 1,
            run_id: id.into(),
            workflow_id: "w".into(),
            workflow_version: None,
            status: stepwell_runtime::core::model::RunStatus::Running,
            current_node: Some("n".into()),
            vars,
            waiting: None,
            output: None,
            error: None,
            created_at: String::new(),
            updated_at: String::new(),
            actor_id: None,
            session_id: None,
            parent_run_id: parent.map(str::to_string),
        }
    }

    #[test]
    fn the_key_ignores_provider_ids_and_allowlist_order() {
        let a = json!({"tool_calls": [{"name": "t", "arguments": {"x": 1}, "call_id": "p1"}],
                       "allowed_tools": ["b", "a"]});
        let b = json!({"tool_calls": [{"name": " t ", "arguments": "{\"x\": 1}", "id": "p2"}],
                       "allowed_tools": ["a", "b", "a"]});
        let r = run("r", None, None);
        assert_eq!(
            effect_digest(&r, 1, a.as_object().unwrap()),
            effect_digest(&r, 1, b.as_object().unwrap())
        );
        assert_ne!(
            effect_digest(&r, 1, a.as_object().unwrap()),
            effect_digest(&r, 2, a.as_object().unwrap())
        );
    }

    #[test]
    fn canonical_json_is_pythons() {
        assert_eq!(
            canonical_json(&json!({"b": [1, "é"], "a": null})),
            r#"{"a":null,"b":[1,"\u00e9"]}"#
        );
        assert_eq!(canonical_json(&json!("😀")), r#""\ud83d\ude00""#);
    }

    #[test]
    fn normalisation_fills_ids_and_flattens_openai_calls() {
        let calls = vec![
            json!({"call_id": "provider_call_1", "name": "a", "arguments": {}}),
            json!({"name": "b"}),
            json!({"id": "call_2", "type": "function",
                   "function": {"name": "fetch_url", "arguments": "{\"url\":\"https://example.com\"}"}}),
            json!(3),
        ];
        let n = normalize(&calls, "d");
        assert_eq!(n[0].call_id, "provider_call_1");
        assert_eq!(n[0].runtime_call_id, "rtcall_d_1");
        assert_eq!(n[1].call_id, "rtcall_d_2");
        assert_eq!(n[2].name, "fetch_url");
        assert_eq!(n[2].call_id, "call_2");
        assert_eq!(n[2].arguments["url"], "https://example.com");
        assert!(!n[3].valid);
    }

    #[test]
    fn the_ceiling_intersects_the_tree() {
        let root = run("root", None, Some(json!(["alpha", "beta"])));
        let child = run(
            "child",
            Some("root"),
            Some(json!(["alpha", "beta", "gamma"])),
        );
        let local = json!({"allowed_tools": ["beta", "gamma"]});
        let get = |id: &str| {
            if id == "root" {
                Ok(root.clone())
            } else {
                Err("no".to_string())
            }
        };
        let c = resolve_ceiling(local.as_object(), &child, &get)
            .unwrap()
            .unwrap();
        assert_eq!(c.into_iter().collect::<Vec<_>>(), ["beta"]);
        assert_eq!(
            resolve_ceiling(None, &run("x", None, None), &get).unwrap(),
            None
        );
        assert!(
            resolve_ceiling(None, &run("x", None, Some(json!([]))), &get)
                .unwrap()
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            resolve_ceiling(None, &run("x", None, Some(json!("alpha"))), &get).unwrap_err(),
            "allowed_tools must be a list when explicitly set"
        );
        let orphan = run("o", Some("missing"), None);
        assert_eq!(
            resolve_ceiling(None, &orphan, &get).unwrap_err(),
            "Cannot resolve tool scope: parent run could not be read"
        );
        let cyc = run("root", Some("root"), None);
        let me = |_: &str| Ok(cyc.clone());
        assert_eq!(
            resolve_ceiling(None, &cyc, &me).unwrap_err(),
            "Cannot resolve tool scope: cyclic run ancestry"
        );
    }

    #[test]
    fn failure_detection_follows_the_reference() {
        assert_eq!(
            reported_failure(&json!("Error: Something went wrong")).unwrap(),
            "Something went wrong"
        );
        assert_eq!(
            reported_failure(&json!("❌ Permission denied: Cannot write")).unwrap(),
            "Permission denied: Cannot write"
        );
        assert_eq!(
            reported_failure(&json!(
                "{\"success\":false,\"status_hint\":\"error\",\"error\":\"requests is not installed\"}"
            ))
            .unwrap(),
            "requests is not installed"
        );
        assert_eq!(
            reported_failure(&json!({"ok": false})).unwrap(),
            "Tool reported failure"
        );
        assert_eq!(reported_failure(&json!("fine")), None);
        assert_eq!(
            reported_failure(&json!({"success": true, "error": null})),
            None
        );
    }

    #[test]
    fn approval_defaults_and_run_policy() {
        let r = run("r", None, None);
        use crate::ToolClass::{Read, Write};
        let p = ApprovalPolicy::of(&r);
        assert!(p.needs_approval([("write_file", Write)]));
        assert!(!p.needs_approval([("read_file", Read)]));
        assert!(p.needs_approval([("mystery", Read)]));
        assert!(p.needs_approval([("read_file", Read), ("", Read)]));
        // A writer that borrows a safe name still asks.
        assert!(p.needs_approval([("web_search", Write)]));
        let mut r = run("r", None, None);
        r.vars.insert(
            "_runtime".into(),
            json!({"tool_policy": {"auto_approve_tools": ["web_search"], "require_approval_tools": ["execute_command"]}}),
        );
        let p = ApprovalPolicy::of(&r);
        assert_eq!(p.source, "run");
        assert!(!p.needs_approval([("web_search", Read)]));
        assert!(p.needs_approval([("write_file", Write)]));
        r.vars
            .insert("_runtime".into(), json!({"tool_policy": "junk"}));
        assert_eq!(ApprovalPolicy::of(&r).source, "static");
    }

    #[test]
    fn arguments_are_canonicalised_against_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "file_path": {}, "start_line": {}, "end_line": {}, "_hidden": {}}});
        let args = json!({"name": "read_file", "arguments": {"filePath": "a", "start": 2, "end": 3,
                           "hidden": 1, "junk": 0}});
        let out = canonical_arguments(args.as_object().unwrap().clone(), &schema);
        assert_eq!(
            Value::Object(out),
            json!({"file_path": "a", "start_line": 2, "end_line": 3})
        );
    }

    #[test]
    fn merge_puts_results_back_by_position() {
        let mut blocked = Map::new();
        blocked.insert(
            "1".into(),
            json!({"name": "blocked_tool", "success": false}),
        );
        let merged = merge(3, &blocked, &[json!({"name": "a"})]);
        assert_eq!(merged[0]["name"], "a");
        assert_eq!(merged[1]["name"], "blocked_tool");
        assert_eq!(merged[2]["error"], "Missing tool result");
    }
}

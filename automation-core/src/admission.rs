//! An admitted occurrence: its envelope and its frozen inputs.

use serde_json::{json, Map, Value};

use crate::envelope::{
    ensure_cloudevent_attributes, occurrence_origin, prompt_header, to_cloudevent,
};
use crate::history::HISTORY_REPLAY_MAX_TOKENS;
use crate::ids::automation_session_id;
use crate::protocol::{AdmissionFacts, HistoryAsk, ToolFact};
use crate::time::respell;
use crate::{into_map, set, AutomationError};

/// The strings of a list (anything else in it, or a value that is not a
/// list, gives nothing).
fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A source's normalized envelope `{event_id, source_id, source_version,
/// fired_at, payload, binding_id}` as an occurrence keeps it: `fired_at`
/// in the automation layer's spelling, with its CloudEvents attributes.
/// `untrusted`: the source is an event source (its content was written by
/// others): `abstracttrust` is `untrusted`, and a connection's batch
/// (`payload.connection_id` and `events`) is described as the reference's
/// connection sources do: `source` = the connection
/// (`abstract://triggers/connections/<id>`), `connectionid`, `subject` =
/// the single event's subject or `batch:<first_seq>-<last_seq>`,
/// `sequence` = the last seq.
pub fn admitted_envelope(raw: &Value, untrusted: bool) -> Value {
    let mut m = into_map(json!({
        "event_id": raw["event_id"],
        "source_id": raw["source_id"],
        "source_version": raw["source_version"],
        "fired_at": raw["fired_at"].as_str().map_or(Value::Null, |t| json!(respell(t))),
        "payload": raw["payload"],
        "binding_id": raw["binding_id"],
    }));
    ensure_cloudevent_attributes(&mut m, if untrusted { "untrusted" } else { "trusted" });
    let payload = &raw["payload"];
    if let (true, Some(cid), Some(events)) = (
        untrusted,
        payload["connection_id"].as_str().filter(|c| !c.is_empty()),
        payload["events"].as_array(),
    ) {
        let subject = match events.as_slice() {
            [one] if one["subject"].as_str().is_some_and(|s| !s.is_empty()) => {
                one["subject"].as_str().unwrap_or_default().to_string()
            }
            _ => format!(
                "batch:{}-{}",
                py_text(&payload["first_seq"]),
                py_text(&payload["last_seq"])
            ),
        };
        m.insert("source".into(), json!(connection_source_uri(cid)));
        m.insert("connectionid".into(), json!(cid));
        m.insert("subject".into(), json!(subject));
        if let Some(seq) = payload["last_seq"].as_i64() {
            m.insert("sequence".into(), json!(seq));
        }
    }
    Value::Object(m)
}

/// `str(value)` as Python spells a JSON scalar.
fn py_text(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// CloudEvents `source` of a connection's events.
pub fn connection_source_uri(connection_id: &str) -> String {
    format!("abstract://triggers/connections/{connection_id}")
}

/// The context modes an input can be prepared for: an automation's
/// `independent` and `growing`, and a discussion's `discussion`.
pub const CONTEXT_MODES: [&str; 3] = ["growing", "independent", "discussion"];

/// Makes the context mode the one history control (the reference's
/// `apply_context_mode`): `growing` and `discussion` read the history they
/// are handed (`use_context: true`), `independent` has none to read
/// (`false`); `include_context` is set the same way when the inputs carry
/// it. Whatever the target's frozen inputs said is kept in the receipt
/// `_runtime.automation_context = {mode, use_context, target_use_context}`
/// (the target's `use_context`, else `include_context`, else null), which
/// is returned.
pub fn apply_context_mode(input: &mut Map<String, Value>, mode: &str) -> Value {
    let use_context = mode != "independent";
    let target_use_context = ["use_context", "include_context"]
        .iter()
        .find_map(|k| input.get(*k).cloned())
        .unwrap_or(Value::Null);
    input.insert("use_context".into(), json!(use_context));
    if input.contains_key("include_context") {
        input.insert("include_context".into(), json!(use_context));
    }
    let receipt =
        json!({"mode": mode, "use_context": use_context, "target_use_context": target_use_context});
    let mut runtime = object_at(input, "_runtime");
    runtime.insert("automation_context".into(), receipt.clone());
    input.insert("_runtime".into(), Value::Object(runtime));
    receipt
}

/// A copy of the object at `key` of `input` (empty when it is not one).
fn object_at(input: &Map<String, Value>, key: &str) -> Map<String, Value> {
    input
        .get(key)
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// Whether a growing automation runs its occurrences in another session
/// than its own `automation:<id>` (a wake in its caller's conversation).
pub fn runs_in_foreign_session(definition: &Value, automation_id: &str) -> bool {
    definition["context"]["mode"] == "growing"
        && definition["session_id"].as_str() != Some(&automation_session_id(automation_id))
}

/// The occurrence's `session_kind`: `chat` (a wake in its caller's
/// session), `automation` (growing) or `occurrence` (independent).
pub fn occurrence_session_kind(definition: &Value, automation_id: &str) -> &'static str {
    if runs_in_foreign_session(definition, automation_id) {
        "chat"
    } else if definition["context"]["mode"] == "growing" {
        "automation"
    } else {
        "occurrence"
    }
}

/// What a growing automation's admission must read: its session's prior
/// turns (only its own occurrences, unless it runs in its caller's
/// session), windowed to `context.growing.max_tokens`; `None` for the
/// independent mode.
pub fn history_ask(automation_id: &str, definition: &Value) -> Option<HistoryAsk> {
    if definition["context"]["mode"] != "growing" {
        return None;
    }
    let foreign = runs_in_foreign_session(definition, automation_id);
    Some(HistoryAsk {
        session_id: definition["session_id"]
            .as_str()
            .map_or_else(|| automation_session_id(automation_id), str::to_string),
        automation_id: (!foreign).then(|| automation_id.to_string()),
        max_tokens: definition["context"]["growing"]["max_tokens"]
            .as_u64()
            .unwrap_or(HISTORY_REPLAY_MAX_TOKENS),
    })
}

/// The occurrence's frozen inputs (the reference's `build_prepared`): the
/// target's inputs with the prompt header, the tool grant, the context
/// mode and its receipt, the history of a growing automation
/// (`context.messages`, with the window's report in
/// `_runtime.session_history`), the pre-authorised recipients, the title
/// and origin, the event in CloudEvents form and the source's named
/// inputs. The session is the attempt-1 run id (independent) or the
/// definition's `session_id` (growing).
///
/// `facts` are the host's: its tool table and, for a growing automation,
/// the history it read (strictly; without it the admission is refused).
pub fn build_prepared(
    automation_id: &str,
    definition: &Value,
    owner: Option<&str>,
    admitting: &Admitting<'_>,
    facts: &AdmissionFacts,
) -> Result<Value, AutomationError> {
    let Admitting {
        index,
        envelope,
        first_run_id,
        inputs,
    } = *admitting;
    let source_id = envelope["source_id"].as_str().unwrap_or_default();
    let source_version = envelope["source_version"].as_i64().unwrap_or(0);
    let fired_at = envelope["fired_at"].as_str().unwrap_or_default();
    let mut input = definition["target"]
        .get("input_data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(Value::String(prompt)) = input.get("prompt") {
        let header = prompt_header(source_id, source_version, index, fired_at);
        input.insert("prompt".into(), json!(format!("{header}{prompt}")));
    }
    // A connection's events reach a string prompt inside the fixed frame;
    // they are in `input_data.event.data.events` too.
    if let (Some(Value::String(prompt)), Some(events), true) = (
        input.get("prompt"),
        envelope["payload"]["events"].as_array(),
        envelope.get("connectionid").is_some_and(|c| c.is_string()),
    ) {
        if !events.is_empty() {
            let boundary = crate::event_frame::boundary(automation_id, index, events);
            let frame = crate::event_frame::connection_events_frame(
                &format!("{source_id}@{source_version}"),
                events,
                &boundary,
            );
            input.insert("prompt".into(), json!(format!("{prompt}\n\n{frame}")));
        }
    }
    // The source's named inputs (`calls`, `items`, ...): never one of the
    // keys the automation or the host sets (a plugin cannot replace the
    // framed prompt, the event, the grant or the bookkeeping vars).
    if let Some(Value::Object(named)) = inputs {
        for (k, v) in named {
            if !k.starts_with('_') && !RESERVED_INPUTS.contains(&k.as_str()) {
                input.insert(k.clone(), v.clone());
            }
        }
    }
    let policy = &definition["policy"];
    // An event source's content was written by others: the untrusted grant.
    let untrusted =
        set(definition.get("untrusted_origin")) || envelope["abstracttrust"] == "untrusted";
    let approval = policy["tool_approval"].as_str().unwrap_or("auto");
    let grant = Grant {
        tools: &facts.tools,
        untrusted,
    };
    if let Some(named) = policy.get("tool_policy").filter(|p| p.is_object()) {
        grant.apply_named(&mut input, named);
    } else if approval == "auto" || untrusted {
        let named = strings(policy.get("untrusted_input_tools"));
        let approval = if approval == "auto" { "auto" } else { "ask" };
        grant.apply(&mut input, &named, approval);
    }
    let mode = definition["context"]["mode"]
        .as_str()
        .unwrap_or("independent");
    if !matches!(mode, "independent" | "growing") {
        return Err(AutomationError::invalid(
            "context.mode",
            format!("unknown automation context mode {mode:?}"),
        ));
    }
    apply_context_mode(&mut input, mode);
    let session_id = if mode == "growing" {
        let history = facts.history.as_ref().ok_or_else(|| {
            AutomationError::new(
                "history_unavailable",
                Some("context.mode"),
                "a growing automation's occurrence needs its session's history, and the host did not read it",
            )
        })?;
        let mut context = object_at(&input, "context");
        context.insert("messages".into(), json!(history.messages));
        input.insert("context".into(), Value::Object(context));
        let mut receipt = into_map(history.report.clone());
        receipt.insert("strict".into(), json!(true));
        let kind = if runs_in_foreign_session(definition, automation_id) {
            "chat"
        } else {
            "automation"
        };
        receipt.insert("session_kind".into(), json!(kind));
        let mut runtime = object_at(&input, "_runtime");
        runtime.insert("session_history".into(), Value::Object(receipt));
        input.insert("_runtime".into(), Value::Object(runtime));
        definition["session_id"]
            .as_str()
            .map_or_else(|| automation_session_id(automation_id), str::to_string)
    } else {
        first_run_id.to_string()
    };
    let mut runtime = object_at(&input, "_runtime");
    runtime.insert(
        "email_allowed_recipients".into(),
        policy
            .get("email_allowed_recipients")
            .cloned()
            .unwrap_or(json!(["self"])),
    );
    input.insert("_runtime".into(), Value::Object(runtime));
    let mut meta = object_at(&input, "_meta");
    meta.insert("automation_title".into(), definition["title"].clone());
    meta.insert(
        "origin".into(),
        occurrence_origin(
            source_id == "manual",
            owner,
            automation_id,
            envelope["event_id"].as_str().unwrap_or_default(),
            &format!("{source_id}@{source_version}"),
            index,
        ),
    );
    input.insert("_meta".into(), Value::Object(meta));
    input.insert("event".into(), to_cloudevent(envelope));
    if source_id == "schedule" {
        input.insert(
            "scheduled_at".into(),
            envelope["payload"]
                .get("scheduled_at")
                .cloned()
                .unwrap_or(Value::Null),
        );
        input.insert("occurrence".into(), json!(index));
    }
    let mut prepared = json!({
        "workflow_id": definition["target"]["workflow_id"],
        "session_id": session_id,
        "workspace_root": definition["workspace_root"],
        "input_data": input,
    });
    // A pinned target: the occurrence starts on that deployed version.
    if let Some(v) = definition["target"].get("version").filter(|v| v.is_u64()) {
        prepared["workflow_version"] = v.clone();
    }
    Ok(prepared)
}

/// What is admitted: the occurrence's index, its normalized envelope, the
/// run id of its first attempt, and the source's named inputs (an event
/// source's `calls`, `items`, ...).
#[derive(Debug, Clone, Copy)]
pub struct Admitting<'a> {
    /// The occurrence's index.
    pub index: u64,
    /// Its envelope ([`admitted_envelope`]).
    pub envelope: &'a Value,
    /// The run id of its first attempt.
    pub first_run_id: &'a str,
    /// The source's named inputs, an object set on the inputs.
    pub inputs: Option<&'a Value>,
}

/// Input keys a source's named inputs never set.
pub const RESERVED_INPUTS: [&str; 12] = [
    "prompt",
    "event",
    "context",
    "messages",
    "tools",
    "allowed_tools",
    "workspace_root",
    "scheduled_at",
    "occurrence",
    "session_id",
    "use_context",
    "include_context",
];

/// The source of every grant an automation writes.
pub const GRANT_SOURCE: &str = "automation-policy";

/// An automation's tool grant at admission (the reference's
/// `grant_tool_approval` and `apply_named_tool_policy`), over the host's
/// tool table.
struct Grant<'a> {
    tools: &'a [ToolFact],
    untrusted: bool,
}

impl Grant<'_> {
    fn class(&self, name: &str) -> Option<&str> {
        self.tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.class.as_str())
    }

    /// A tool the grant never pre-approves: one that sends messages
    /// (`comms`), whatever the policy says.
    fn sends(&self, name: &str) -> bool {
        self.class(name) == Some("comms")
    }

    /// Never granted to a run reading untrusted input: a sending tool or
    /// an MCP tool.
    fn never_granted(&self, name: &str) -> bool {
        self.sends(name) || name.starts_with("mcp::")
    }

    /// What "allow all" pre-approves for untrusted input: tools that only
    /// read (no writes, commands, delegation or messages); a tool the table
    /// does not know is refused.
    fn harmless(&self, name: &str) -> bool {
        self.class(name) == Some("read")
    }

    /// Sets `_runtime.tool_policy` (see the module's docs, and the
    /// automations documentation's "Tool approval").
    fn apply(&self, input: &mut Map<String, Value>, named: &[String], approval: &str) {
        let mut runtime = object_at(input, "_runtime");
        let mut replaced = false;
        if runtime.contains_key("tool_policy") {
            if !self.untrusted {
                return;
            }
            replaced = true;
        }
        let mut mcp_withheld: Vec<String> = Vec::new();
        if self.untrusted {
            for (holder, key) in [(0, "tools"), (1, "allowed_tools")] {
                let list = if holder == 0 {
                    input.get_mut(key)
                } else {
                    runtime.get_mut(key)
                };
                if let Some(Value::Array(items)) = list {
                    items.retain(|t| match t.as_str() {
                        Some(name) if name.trim().starts_with("mcp::") => {
                            mcp_withheld.push(name.trim().to_string());
                            false
                        }
                        _ => true,
                    });
                }
            }
        }
        let mut candidates: Vec<String> = match runtime.get("allowed_tools") {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            _ => self.tools.iter().map(|t| t.name.clone()).collect(),
        };
        candidates.sort();
        candidates.dedup();
        let named: Vec<String> = named.iter().map(|n| n.trim().to_string()).collect();
        let withheld_by = |n: &String| -> bool {
            if !self.untrusted {
                self.sends(n)
            } else if approval == "ask" {
                self.never_granted(n) || !named.contains(n)
            } else {
                self.never_granted(n) || (!named.contains(n) && !self.harmless(n))
            }
        };
        let (mut withheld, tools): (Vec<String>, Vec<String>) =
            candidates.into_iter().partition(|n| withheld_by(n));
        mcp_withheld.sort();
        mcp_withheld.dedup();
        for m in mcp_withheld {
            if !withheld.contains(&m) {
                withheld.push(m);
            }
        }
        let mut policy = into_map(json!({
            "auto_approve_tools": tools,
            "withheld_tools": withheld,
            "source": GRANT_SOURCE,
        }));
        if self.untrusted {
            let mut named = named.clone();
            named.sort();
            named.dedup();
            policy.insert("untrusted_input".into(), json!(true));
            policy.insert("approval".into(), json!(approval));
            policy.insert("untrusted_input_tools".into(), json!(named));
            policy.insert("replaced_target_policy".into(), json!(replaced));
            if approval == "ask" {
                policy.insert("require_approval_tools".into(), json!(withheld));
            }
            runtime.insert("untrusted_input".into(), json!(true));
        }
        runtime.insert("tool_policy".into(), Value::Object(policy));
        input.insert("_runtime".into(), Value::Object(runtime));
    }

    /// The definition's named `policy.tool_policy`: any policy of the
    /// target is dropped, the grant is computed (`ask` for untrusted input,
    /// else `auto`, with the named auto tools), then only the named auto
    /// tools stay pre-approved and every other candidate requires approval.
    fn apply_named(&self, input: &mut Map<String, Value>, named_policy: &Value) {
        let requested_auto = strings(named_policy.get("auto_approve_tools"));
        let requested_require = strings(named_policy.get("require_approval_tools"));
        let mut runtime = object_at(input, "_runtime");
        runtime.remove("tool_policy");
        input.insert("_runtime".into(), Value::Object(runtime));
        let mut named: Vec<String> = requested_auto
            .iter()
            .filter(|n| !requested_require.contains(n))
            .cloned()
            .collect();
        named.sort();
        self.apply(input, &named, if self.untrusted { "ask" } else { "auto" });
        let Some(Value::Object(policy)) = input
            .get_mut("_runtime")
            .and_then(|r| r.get_mut("tool_policy"))
        else {
            return;
        };
        let granted = strings(policy.get("auto_approve_tools"));
        let mut candidates = granted.clone();
        candidates.extend(strings(policy.get("withheld_tools")));
        candidates.sort();
        candidates.dedup();
        let auto: Vec<String> = granted
            .into_iter()
            .filter(|n| requested_auto.contains(n) && !requested_require.contains(n))
            .collect();
        let require: Vec<String> = candidates
            .into_iter()
            .filter(|n| !auto.contains(n))
            .collect();
        policy.insert("auto_approve_tools".into(), json!(auto));
        policy.insert("require_approval_tools".into(), json!(require));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolFact> {
        [
            ("read_file", "read"),
            ("write_file", "write"),
            ("send_message", "comms"),
            ("execute_command", "exec"),
        ]
        .iter()
        .map(|(n, c)| ToolFact {
            name: n.to_string(),
            class: c.to_string(),
        })
        .collect()
    }

    fn input(v: Value) -> Map<String, Value> {
        into_map(v)
    }

    #[test]
    fn a_trusted_auto_grant_withholds_sending_tools_and_keeps_a_target_policy() {
        let table = tools();
        let g = Grant {
            tools: &table,
            untrusted: false,
        };
        let mut i = input(json!({"prompt": "p"}));
        g.apply(&mut i, &[], "auto");
        assert_eq!(
            i["_runtime"]["tool_policy"],
            json!({"auto_approve_tools": ["execute_command", "read_file", "write_file"],
                   "withheld_tools": ["send_message"], "source": GRANT_SOURCE})
        );
        let own = json!({"auto_approve_tools": ["x"]});
        let mut i = input(json!({"_runtime": {"tool_policy": own}}));
        g.apply(&mut i, &[], "auto");
        assert_eq!(i["_runtime"]["tool_policy"], own);
    }

    #[test]
    fn untrusted_input_is_granted_by_kind_and_never_mcp_or_sending() {
        let table = tools();
        let g = Grant {
            tools: &table,
            untrusted: true,
        };
        let named = vec!["execute_command".to_string(), "send_message".to_string()];
        let mut auto = input(json!({
            "tools": ["read_file", "mcp::srv::x"],
            "_runtime": {"allowed_tools": ["read_file", "write_file", "send_message",
                                           "execute_command", "mcp::srv::x"],
                         "tool_policy": {"auto_approve_tools": ["write_file"]}}}));
        g.apply(&mut auto, &named, "auto");
        let p = &auto["_runtime"]["tool_policy"];
        assert_eq!(
            p["auto_approve_tools"],
            json!(["execute_command", "read_file"])
        );
        assert_eq!(
            p["withheld_tools"],
            json!(["send_message", "write_file", "mcp::srv::x"])
        );
        assert_eq!(p["replaced_target_policy"], true);
        assert_eq!(
            p["untrusted_input_tools"],
            json!(["execute_command", "send_message"])
        );
        assert!(p.get("require_approval_tools").is_none());
        assert_eq!(auto["tools"], json!(["read_file"]));
        assert_eq!(auto["_runtime"]["untrusted_input"], true);
        let mut ask =
            input(json!({"_runtime": {"allowed_tools": ["read_file", "execute_command"]}}));
        g.apply(&mut ask, &named, "ask");
        let p = &ask["_runtime"]["tool_policy"];
        assert_eq!(p["auto_approve_tools"], json!(["execute_command"]));
        assert_eq!(p["require_approval_tools"], json!(["read_file"]));
        assert_eq!(p["approval"], "ask");
        assert_eq!(p["replaced_target_policy"], false);
    }

    #[test]
    fn a_named_policy_pre_approves_only_its_auto_tools() {
        let table = tools();
        let g = Grant {
            tools: &table,
            untrusted: false,
        };
        let mut i =
            input(json!({"_runtime": {"tool_policy": {"auto_approve_tools": ["write_file"]}}}));
        g.apply_named(
            &mut i,
            &json!({"auto_approve_tools": ["read_file", "send_message", "write_file"],
                    "require_approval_tools": ["write_file"]}),
        );
        let p = &i["_runtime"]["tool_policy"];
        assert_eq!(p["auto_approve_tools"], json!(["read_file"]));
        assert_eq!(
            p["require_approval_tools"],
            json!(["execute_command", "send_message", "write_file"])
        );
    }

    #[test]
    fn the_context_mode_decides_use_context() {
        let mut i = input(json!({"use_context": false, "include_context": false}));
        let receipt = apply_context_mode(&mut i, "growing");
        assert_eq!(
            receipt,
            json!({"mode": "growing", "use_context": true, "target_use_context": false})
        );
        assert_eq!(i["include_context"], true);
        let mut i = input(json!({"include_context": true}));
        apply_context_mode(&mut i, "independent");
        assert_eq!(i["use_context"], false);
        assert_eq!(
            i["_runtime"]["automation_context"]["target_use_context"],
            true
        );
    }
}

//! What an occurrence produced, and what its completion records: the
//! occurrence's answer read from its output by structure only, the
//! attention item it raises (a `notify` or a `failure`), and the
//! `automation.completed` decision.

use serde_json::{json, Map, Value};

use serde::{Deserialize, Serialize};

use crate::definition::{py_strip, validate_notify, NOTIFY_BODY_MAX, NOTIFY_TITLE_MAX};

/// What the controller sees of an occurrence attempt's run: the host reads
/// it from the store (`automation.read_occurrence`) and the controller's
/// `record_outcome` node decides from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildView {
    /// The run's id.
    pub run_id: String,
    /// Its status (`running`, `waiting`, `completed`, `failed`, `cancelled`).
    pub status: String,
    /// Its output, once completed.
    #[serde(default)]
    pub output: Option<Value>,
    /// Its error, once failed or cancelled.
    #[serde(default)]
    pub error: Option<String>,
}

impl ChildView {
    /// Whether the run has ended (completed, failed or cancelled).
    pub fn ended(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed" | "cancelled")
    }

    /// The view of a run whose output is `output`, keeping of it only what
    /// [`normalize_occurrence_output`] reads (`response`, `answer`,
    /// `notify`, `success`, `error`, and `result` when it is text, or those
    /// keys of it when it is an object): what the controller copies of an
    /// occurrence's run, however large the rest of its output.
    pub fn of(run_id: &str, status: &str, output: Option<&Value>, error: Option<&str>) -> Self {
        const READ: [&str; 5] = ["response", "answer", "notify", "success", "error"];
        let keep = |m: &Map<String, Value>| -> Map<String, Value> {
            READ.iter()
                .filter_map(|k| m.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect()
        };
        let output = output.map(|o| match o {
            Value::Object(m) => {
                let mut kept = keep(m);
                match m.get("result") {
                    Some(Value::String(s)) => {
                        kept.insert("result".into(), Value::String(s.clone()));
                    }
                    Some(Value::Object(r)) => {
                        kept.insert("result".into(), Value::Object(keep(r)));
                    }
                    _ => {}
                }
                Value::Object(kept)
            }
            // Not an object: read as `{}`.
            _ => Value::Object(Map::new()),
        });
        ChildView {
            run_id: run_id.to_string(),
            status: status.to_string(),
            output,
            error: error.map(str::to_string),
        }
    }
}

/// The body of a `notify: true` item is the answer cut to this many
/// characters.
pub const NOTIFY_DEFAULT_BODY_MAX: usize = 280;
/// A failure item's body is cut to this many characters.
const FAILURE_BODY_MAX: usize = 2000;

/// An occurrence's outcome, read from its terminal state.
#[derive(Debug, Clone, PartialEq)]
pub struct OccurrenceOutcome {
    /// Its answer (`response` or `answer`, else a string `result`; else "").
    pub answer: String,
    /// Whether it completed and nothing in its output says `success: false`.
    pub success: bool,
    /// What it asked to notify (`null` when it said nothing).
    pub notify: Value,
    /// Why it did not succeed (`None` when it did).
    pub error: Option<String>,
}

impl OccurrenceOutcome {
    /// `{answer, success, notify, error}`.
    pub fn to_json(&self) -> Value {
        json!({"answer": self.answer, "success": self.success, "notify": self.notify, "error": self.error})
    }
}

pub use stepwell_model::json::truthy;

/// Python's `repr` of a string (what `str()` of a container shows).
pub fn py_repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn py_repr(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => match n.as_f64() {
            Some(f) if !(n.is_i64() || n.is_u64()) => {
                out.push_str(&crate::ids::canonical_json(&Value::from(f)))
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => py_repr_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_repr_str(k, out);
                out.push_str(": ");
                py_repr(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `str()` of a JSON value: strings as they are, the rest as
/// their `repr` (`True`, `None`, `{'a': 1}`).
pub fn py_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => {
            let mut out = String::new();
            py_repr(other, &mut out);
            out
        }
    }
}

/// The first `n` characters of `s`.
fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// The outcome of the occurrence root `child` (terminal), by structure only:
/// the output (a non-object is `{}`) or, when its `result` is an object and
/// it has none of `response`, `answer`, `notify`, that `result`, is where
/// the answer, `success`, `error` and `notify` are read.
pub fn normalize_occurrence_output(child: &ChildView) -> OccurrenceOutcome {
    let empty = Map::new();
    let out = child
        .output
        .as_ref()
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let result = out.get("result");
    let payload = match result {
        Some(Value::Object(r))
            if !["response", "answer", "notify"]
                .iter()
                .any(|k| out.contains_key(*k)) =>
        {
            r
        }
        _ => out,
    };
    let answer = ["response", "answer"]
        .iter()
        .find_map(|k| payload.get(*k).and_then(Value::as_str))
        .or_else(|| result.and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let said_false = |m: &Map<String, Value>| m.get("success") == Some(&Value::Bool(false));
    let success = child.status == "completed" && !said_false(out) && !said_false(payload);
    let error = if success {
        None
    } else {
        let own = child.error.clone().map(Value::String);
        let first = [own.as_ref(), payload.get("error"), out.get("error")]
            .into_iter()
            .flatten()
            .find(|v| truthy(Some(v)));
        Some(first.map_or_else(|| child.status.as_str().to_string(), py_str))
    };
    let notify = if payload.contains_key("notify") {
        payload["notify"].clone()
    } else {
        out.get("notify").cloned().unwrap_or(Value::Null)
    };
    OccurrenceOutcome {
        answer,
        success,
        notify,
        error,
    }
}

/// The `{title, body}` of a notify value, or `None` (quiet): `true` gives
/// the automation's title and the answer (cut to 280 characters); an object
/// gives its stripped `title` (else the automation's) and its `body`, quiet
/// when both are blank; anything else is quiet.
pub fn notify_payload(raw: &Value, title: &str, answer: &str) -> Option<Value> {
    match raw {
        Value::Bool(true) => Some(json!({
            "title": cut(title, NOTIFY_TITLE_MAX),
            "body": cut(answer, NOTIFY_DEFAULT_BODY_MAX),
        })),
        Value::Object(m) => {
            let t = m
                .get("title")
                .and_then(Value::as_str)
                .map(py_strip)
                .unwrap_or("");
            let b = m.get("body").and_then(Value::as_str).unwrap_or("");
            if t.is_empty() && py_strip(b).is_empty() {
                return None;
            }
            let t = if t.is_empty() { title } else { t };
            Some(json!({"title": cut(t, NOTIFY_TITLE_MAX), "body": cut(b, NOTIFY_BODY_MAX)}))
        }
        _ => None,
    }
}

/// The `automation.completed` decision of the pending occurrence: its
/// record fields and its state delta.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The record's fields: `{run_id, index, status, attempts, finished_at,
    /// notify, attention}`.
    pub fields: Value,
    /// The state keys it sets: `pending_occurrence: null`, `last_outcome`,
    /// `attention_seq` (and `exhausted: true` for a one-shot definition).
    pub state: Value,
}

/// How the pending occurrence of a controller whose definition is
/// `definition` and state `state` completes with `status` (`completed`,
/// `failed`, `cancelled`) and `outcome`, at `now`. The attention item, if
/// any, takes the next attention sequence number: a completed occurrence
/// that asks to notify (or any completed one when `email` is a channel, or
/// `notify.always`) raises a `notify` item, a failed one a `failure` item,
/// a cancelled one none. The definition read is the current one.
pub fn complete_occurrence(
    definition: &Value,
    state: &Value,
    status: &str,
    outcome: Option<&OccurrenceOutcome>,
    now: &str,
) -> Completion {
    let pending = &state["pending_occurrence"];
    let title = definition["title"].as_str().unwrap_or("");
    let mut seq = state["attention_seq"].as_u64().unwrap_or(0);
    let delivery = match definition.get("notify") {
        None | Some(Value::Null) => json!({"channels": ["console"]}),
        Some(n) => validate_notify(Some(n)).unwrap_or_else(|_| json!({"channels": ["console"]})),
    };
    let channels = delivery["channels"].clone();
    let email_result = channels
        .as_array()
        .is_some_and(|c| c.iter().any(|ch| ch == "email"))
        && status == "completed";
    let mut notify = None;
    let mut attention = None;
    if status == "completed" {
        if let Some(outcome) = outcome {
            let raw = if email_result {
                Value::Bool(true)
            } else {
                outcome.notify.clone()
            };
            notify = notify_payload(&raw, title, &outcome.answer);
            if notify.is_none() && delivery["always"] == Value::Bool(true) {
                let answer = py_strip(&outcome.answer);
                let body = if answer.is_empty() {
                    delivery["body"].as_str().unwrap_or("")
                } else {
                    answer
                };
                let note_title = delivery["title"]
                    .as_str()
                    .filter(|t| !t.is_empty())
                    .unwrap_or(title);
                notify = notify_payload(&json!({"title": note_title, "body": body}), title, answer);
            }
            if let Some(n) = &notify {
                seq += 1;
                attention = Some(
                    json!({"kind": "notify", "seq": seq, "title": n["title"], "body": n["body"]}),
                );
            }
        }
    } else if status == "failed" {
        seq += 1;
        let error = outcome
            .and_then(|o| o.error.as_deref())
            .filter(|e| !e.is_empty())
            .unwrap_or("The occurrence failed.");
        attention = Some(json!({"kind": "failure", "seq": seq,
                                "title": format!("{title} failed"), "body": cut(error, FAILURE_BODY_MAX)}));
    }
    if let Some(item) = attention.as_mut() {
        item["channels"] = channels;
        if email_result {
            item["email_result"] = json!(outcome.map(|o| o.answer.as_str()).unwrap_or(""));
            item["recipients"] = delivery
                .get("recipients")
                .cloned()
                .unwrap_or(json!(["self"]));
        }
    }
    let index = pending["index"].as_u64().unwrap_or(0);
    let attempts = pending["attempt"].as_u64().unwrap_or(1);
    let last_outcome = json!({"run_id": pending["run_id"], "index": index, "status": status,
                              "attempts": attempts, "finished_at": now});
    let mut delta =
        json!({"pending_occurrence": null, "last_outcome": last_outcome, "attention_seq": seq});
    if definition["one_shot"] == Value::Bool(true) {
        delta["exhausted"] = json!(true);
    }
    Completion {
        fields: json!({"run_id": pending["run_id"], "index": index, "status": status, "attempts": attempts,
                       "finished_at": now, "notify": notify, "attention": attention}),
        state: delta,
    }
}

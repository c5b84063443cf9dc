//! Trigger envelopes in CloudEvents 1.0 names, the prompt header of an
//! occurrence, its origin, and the vars its run is created with.

use serde_json::{json, Map, Value};

/// CloudEvents `specversion`.
pub const SPECVERSION: &str = "1.0";
/// CloudEvents `datacontenttype` of every trigger event.
pub const DATACONTENTTYPE: &str = "application/json";
/// The extension attributes a structured event carries when the envelope has them.
const EXTENSIONS: [&str; 10] = [
    "bindingid",
    "connectionid",
    "correlationid",
    "dedupekey",
    "sequence",
    "recordedtime",
    "expirytime",
    "traceparent",
    "abstracttrust",
    "abstracttest",
];

/// CloudEvents `type` of a source's events: `abstract.<source_id>.v<version>`.
pub fn event_type(source_id: &str, source_version: i64) -> String {
    format!("abstract.{source_id}.v{source_version}")
}

/// CloudEvents `source` of an event no connection produced (a schedule tick,
/// a manual run): `abstract://triggers/<source_id>/bindings/<binding_id>`.
pub fn binding_source_uri(source_id: &str, binding_id: &str) -> String {
    format!("abstract://triggers/{source_id}/bindings/{binding_id}")
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Adds the CloudEvents attributes to an envelope its source normalized
/// without them (`schedule@1`, `manual@1`, plugins): `specversion`, `id`
/// (= event id), `type`, `source`, `time` (= fired at), `datacontenttype`,
/// `bindingid`, `recordedtime`, `abstracttrust` (`trusted` or `untrusted`),
/// `subject` (`tick:<n>`, `command:<id>`, else the event id) and
/// `dedupekey` (= the event id). An envelope that has them is left as it is.
pub fn ensure_cloudevent_attributes(envelope: &mut Map<String, Value>, trust: &str) {
    if envelope
        .get("specversion")
        .is_some_and(|v| !v.is_null() && v != "")
    {
        return;
    }
    let event_id = text(envelope.get("event_id"));
    let payload = envelope.get("payload").and_then(Value::as_object);
    let subject = match (
        payload.and_then(|p| p.get("tick")).filter(|t| !t.is_null()),
        payload
            .and_then(|p| p.get("command_id"))
            .filter(|c| !c.is_null() && *c != "" && *c != false),
    ) {
        (Some(tick), _) => format!("tick:{}", text(Some(tick))),
        (None, Some(command)) => format!("command:{}", text(Some(command))),
        (None, None) => event_id.clone(),
    };
    let source_id = text(envelope.get("source_id"));
    let version = envelope
        .get("source_version")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let binding = text(envelope.get("binding_id"));
    let fired_at = text(envelope.get("fired_at"));
    for (k, v) in [
        ("specversion", json!(SPECVERSION)),
        ("id", json!(event_id)),
        ("type", json!(event_type(&source_id, version))),
        ("source", json!(binding_source_uri(&source_id, &binding))),
        ("time", json!(fired_at)),
        ("datacontenttype", json!(DATACONTENTTYPE)),
        ("bindingid", json!(binding)),
        ("recordedtime", json!(fired_at)),
        ("abstracttrust", json!(trust)),
        ("subject", json!(subject)),
        ("dedupekey", json!(event_id)),
    ] {
        envelope.insert(k.into(), v);
    }
}

/// The structured CloudEvent of a trigger envelope (`data` = its payload),
/// what an occurrence receives as `input_data.event`.
pub fn to_cloudevent(envelope: &Value) -> Value {
    let get = |k: &str| envelope.get(k).filter(|v| !v.is_null() && *v != "");
    let source_id = text(envelope.get("source_id"));
    let binding = text(envelope.get("binding_id"));
    let version = envelope
        .get("source_version")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let mut out = Map::new();
    out.insert("specversion".into(), json!(SPECVERSION));
    out.insert(
        "id".into(),
        json!(text(get("id").or(envelope.get("event_id")))),
    );
    out.insert(
        "type".into(),
        json!(get("type").map_or_else(|| event_type(&source_id, version), |t| text(Some(t)))),
    );
    out.insert(
        "source".into(),
        json!(get("source").map_or_else(
            || binding_source_uri(&source_id, &binding),
            |s| text(Some(s))
        )),
    );
    out.insert(
        "time".into(),
        json!(text(get("time").or(envelope.get("fired_at")))),
    );
    out.insert(
        "datacontenttype".into(),
        json!(get("datacontenttype").map_or(DATACONTENTTYPE.to_string(), |d| text(Some(d)))),
    );
    for key in ["subject", "dataschema"] {
        if let Some(v) = envelope.get(key).filter(|v| !v.is_null()) {
            out.insert(key.into(), v.clone());
        }
    }
    out.insert(
        "bindingid".into(),
        json!(text(get("bindingid").or(envelope.get("binding_id")))),
    );
    for key in EXTENSIONS.iter().filter(|k| **k != "bindingid") {
        if let Some(v) = envelope.get(*key).filter(|v| !v.is_null()) {
            out.insert((*key).into(), v.clone());
        }
    }
    let data = envelope
        .get("payload")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    out.insert("data".into(), Value::Object(data));
    Value::Object(out)
}

/// The header an occurrence's prompt starts with:
/// `[Trigger <source>@<version> · occurrence <n> · fired <fired_at>]` and
/// a newline (source and version are the envelope's: a run-now reads
/// `manual@1`).
pub fn prompt_header(source_id: &str, source_version: i64, index: u64, fired_at: &str) -> String {
    format!("[Trigger {source_id}@{source_version} \u{b7} occurrence {index} \u{b7} fired {fired_at}]\n")
}

/// `_meta.origin` of an occurrence: `kind` `trigger` (scheduled) or `person`
/// (run now), the automation's owner as actor, client `automation` or
/// `automation.run_now`, and a ref to the automation, the event, its source
/// (`<id>@<version>`) and the occurrence index.
pub fn occurrence_origin(
    manual: bool,
    owner: Option<&str>,
    automation_id: &str,
    event_id: &str,
    source: &str,
    index: u64,
) -> Value {
    let owner = owner.map(str::trim).filter(|o| !o.is_empty());
    json!({
        "kind": if manual { "person" } else { "trigger" },
        "actor": owner,
        "client": if manual { "automation.run_now" } else { "automation" },
        "ref": {"automation_id": automation_id, "event_id": event_id, "source": source,
                "occurrence_index": index},
    })
}

/// The vars an occurrence attempt's run is created with, built only from
/// what was frozen at admission (`pending`, with its `prepared` inputs): a
/// replayed dispatch sends the same vars, so the same creation digest. They
/// are the prepared `input_data` with `_meta.occurrence` (`{automation_id,
/// occurrence_index, attempt, event_id, revision, role: "occurrence",
/// session_kind, fired_at, trigger_envelope}`) and `workspace_root`.
pub fn occurrence_vars(automation_id: &str, pending: &Value) -> Value {
    let prepared = &pending["prepared"];
    let mut vars = prepared
        .get("input_data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut meta = match vars.remove("_meta") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let envelope = &pending["envelope"];
    meta.insert(
        "occurrence".into(),
        json!({
            "automation_id": automation_id,
            "occurrence_index": pending["index"],
            "attempt": pending["attempt"],
            "event_id": pending["event_id"],
            "revision": pending["revision"],
            "role": "occurrence",
            "session_kind": pending["session_kind"],
            "fired_at": envelope["fired_at"],
            "trigger_envelope": envelope,
        }),
    );
    vars.insert("_meta".into(), Value::Object(meta));
    vars.insert(
        "workspace_root".into(),
        prepared
            .get("workspace_root")
            .cloned()
            .unwrap_or(Value::Null),
    );
    Value::Object(vars)
}

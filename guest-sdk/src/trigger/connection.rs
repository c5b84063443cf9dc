//! The shared logic of **connection-bound event sources** (`webhook.received@1`,
//! `feed.item@1`, and plugins written the same way), enabled with the
//! `connection` feature.
//!
//! A binding names a connection: `{connection_id, max_batch? = 20 (1..200),
//! start_at? = now}`. The host appends the connection's events to the
//! stream `trigger:<connection_id>` and hands the source the records after
//! the automation's cursor. Every event appended after `start_at` (and,
//! after a resume, after the resume) is admitted once, oldest first; one
//! admission carries every pending event up to `max_batch` (events that
//! arrive together become one occurrence); the rest waits for the next.
//!
//! The admission's payload is `{count, event_ids, events, first_seq,
//! last_seq, content_trust, connection_id}` (`events`: the CloudEvents
//! payloads as appended) and its event id
//! `<source>@<version>:<binding_id>:<32 hex digits of the SHA-256 of the
//! event ids, one per line>`. State (beside the shared keys):
//! `{cursor_seq, since, last_admitted_at?}`.
//!
//! ```ignore
//! use stepwell_guest::trigger::connection;
//! fn admit(b: &Binding, state: &Value, now: &str, events: &[Value])
//!     -> Result<(Option<Admission>, Value), TriggerError> {
//!     connection::admit(b, state, now, events, |_payload| None)
//! }
//! ```

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::{Admission, Binding, TriggerError, Wait};

/// `max_batch` when the config leaves it out.
pub const DEFAULT_MAX_BATCH: u64 = 20;
/// The largest `max_batch`.
pub const MAX_BATCH: u64 = 200;

/// The JSON Schema of a connection-bound binding's config.
pub fn binding_config_schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["connection_id"],
        "properties": {
            "connection_id": {"type": "string", "minLength": 1, "maxLength": 64},
            "max_batch": {"type": "integer", "minimum": 1, "maximum": MAX_BATCH, "default": DEFAULT_MAX_BATCH},
            "start_at": {"type": "string", "format": "date-time"},
        },
    })
}

/// The JSON Schema of a batch admission's payload.
pub fn batch_event_schema() -> Value {
    json!({
        "type": "object",
        "required": ["count", "event_ids", "events"],
        "properties": {
            "count": {"type": "integer", "minimum": 1},
            "event_ids": {"type": "array", "items": {"type": "string"}},
            "events": {"type": "array", "items": {"type": "object"}},
            "first_seq": {"type": "integer"},
            "last_seq": {"type": "integer"},
            "content_trust": {"type": "string", "enum": ["untrusted", "trusted"]},
            "connection_id": {"type": "string"},
        },
    })
}

/// Parses an RFC 3339 time with an explicit offset.
pub fn parse_time(field: &str, text: &str) -> Result<DateTime<Utc>, TriggerError> {
    DateTime::parse_from_rfc3339(text.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            TriggerError::invalid(
                field,
                format!("{text:?} is not an RFC 3339 time with an offset"),
            )
        })
}

/// The reference's spelling of a UTC time: `+00:00`, six fraction digits
/// only when there are microseconds.
pub fn format_time(t: DateTime<Utc>) -> String {
    let text = t.to_rfc3339_opts(SecondsFormat::Micros, false);
    match text.strip_suffix(".000000+00:00") {
        Some(whole) => format!("{whole}+00:00"),
        None => text,
    }
}

/// Whether `id` is a connection id: letters, digits, `_` or `-`, 1 to 64,
/// not starting with `_` or `-`.
pub fn is_connection_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-'))
}

/// Checks a binding config `{connection_id, max_batch?, start_at?}` and
/// fills in its defaults (`start_at` = `now`). Unknown fields are refused,
/// the first in sorted order named.
pub fn validate(config: Value, now: &str) -> Result<Value, TriggerError> {
    let Value::Object(map) = config else {
        return Err(TriggerError::invalid("trigger.config", "must be an object"));
    };
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    if let Some(k) = keys
        .into_iter()
        .find(|k| !matches!(k.as_str(), "connection_id" | "max_batch" | "start_at"))
    {
        return Err(TriggerError::invalid(
            format!("trigger.config.{k}"),
            "unknown field (a connection-bound source takes connection_id, max_batch and start_at)",
        ));
    }
    let id = match map.get("connection_id") {
        Some(Value::String(s)) if is_connection_id(s) => s.clone(),
        _ => {
            return Err(TriggerError::invalid(
                "trigger.config.connection_id",
                "must be a connection id (letters, digits, '_' or '-', at most 64)",
            ))
        }
    };
    let max_batch = match map.get("max_batch") {
        None | Some(Value::Null) => DEFAULT_MAX_BATCH,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_BATCH).contains(&n) => n,
            _ => {
                return Err(TriggerError::invalid(
                    "trigger.config.max_batch",
                    format!("must be an integer 1..{MAX_BATCH}"),
                ))
            }
        },
    };
    let start = match map.get("start_at") {
        None | Some(Value::Null) => parse_time("now", now)?,
        Some(Value::String(s)) => parse_time("trigger.config.start_at", s)?,
        Some(_) => {
            return Err(TriggerError::invalid(
                "trigger.config.start_at",
                "must be an RFC 3339 time",
            ))
        }
    };
    Ok(json!({"connection_id": id, "max_batch": max_batch, "start_at": format_time(start)}))
}

/// The state of a new binding: the shared keys and `{cursor_seq: 0,
/// since: start_at}`.
pub fn initial_state(binding: &Binding) -> Value {
    let start = binding.config["start_at"].clone();
    json!({
        "anchor": start,
        "tick": 0,
        "scheduled_count": 0,
        "exhausted": false,
        "cursor_seq": 0,
        "since": start,
    })
}

/// `(cursor_seq, since)` of a state (its own keys, or a nested
/// `source_state`).
fn cursor(state: &Value, binding: &Binding) -> (u64, Option<String>) {
    let get = |k: &str| {
        state
            .get(k)
            .or_else(|| state.get("source_state").and_then(|s| s.get(k)))
            .cloned()
    };
    let seq = get("cursor_seq").and_then(|v| v.as_u64()).unwrap_or(0);
    let since = get("since")
        .and_then(|v| v.as_str().map(str::to_string))
        .or_else(|| binding.config["start_at"].as_str().map(str::to_string));
    (seq, since)
}

fn seq_of(record: &Value) -> u64 {
    record["seq"].as_u64().unwrap_or(0)
}

/// The records of `events` this binding has yet to admit: of its
/// connection's stream, after its cursor, appended after `since`, with an
/// object payload; oldest first.
pub fn candidates<'a>(binding: &Binding, state: &Value, events: &'a [Value]) -> Vec<&'a Value> {
    let (cursor_seq, since) = cursor(state, binding);
    let since = since.and_then(|s| parse_time("since", &s).ok());
    let stream = format!(
        "trigger:{}",
        binding.config["connection_id"].as_str().unwrap_or_default()
    );
    let mut out: Vec<&Value> = events
        .iter()
        .filter(|r| seq_of(r) > cursor_seq && r["stream"].as_str() == Some(stream.as_str()))
        .filter(|r| match since {
            None => true,
            Some(since) => r["appended_at"]
                .as_str()
                .and_then(|t| parse_time("appended_at", t).ok())
                .is_some_and(|at| at > since),
        })
        .filter(|r| r["payload"].is_object())
        .collect();
    out.sort_by_key(|r| seq_of(r));
    out
}

/// `idle` when nothing is pending (the host wakes the automation when its
/// connection gets an event), else due now.
pub fn prepare(
    binding: &Binding,
    state: &Value,
    now: &str,
    events: &[Value],
) -> Result<Wait, TriggerError> {
    if candidates(binding, state, events).is_empty() {
        return Ok(Wait::Idle);
    }
    Ok(Wait::Until(format_time(parse_time("now", now)?)))
}

fn shared(state: &Value, advance: u64) -> Map<String, Value> {
    let count = |k: &str| state.get(k).and_then(Value::as_u64).unwrap_or(0);
    let mut out = Map::new();
    out.insert(
        "anchor".into(),
        state.get("anchor").cloned().unwrap_or(Value::Null),
    );
    out.insert("tick".into(), json!(count("tick") + advance));
    out.insert(
        "scheduled_count".into(),
        json!(count("scheduled_count") + advance),
    );
    out.insert("exhausted".into(), json!(false));
    out
}

/// Admits every pending event (up to `max_batch`) as one batch. `inputs`
/// builds the occurrence's named inputs from the admission's payload (the
/// source's own: `webhook.received@1`'s `calls`), or none.
pub fn admit(
    binding: &Binding,
    state: &Value,
    now: &str,
    events: &[Value],
    inputs: impl Fn(&Value) -> Option<Value>,
) -> Result<(Option<Admission>, Value), TriggerError> {
    admit_selected(binding, state, now, events, |_| true, inputs)
}

/// [`admit`] of the pending events `select` keeps (a plugin's filter,
/// given each record). The others are passed over for good: when none is
/// kept, nothing is admitted and the returned state's cursor moves past
/// every record examined (the controller commits it), so a run of events
/// the source never wants cannot stall the ones after it. [`prepare`]
/// says "due" while any record is pending, selected or not.
pub fn admit_selected(
    binding: &Binding,
    state: &Value,
    now: &str,
    events: &[Value],
    select: impl Fn(&Value) -> bool,
    inputs: impl Fn(&Value) -> Option<Value>,
) -> Result<(Option<Admission>, Value), TriggerError> {
    let examined = candidates(binding, state, events);
    if examined.is_empty() {
        return Ok((None, state.clone()));
    }
    let (cursor_seq, since) = cursor(state, binding);
    let past_all = events.iter().map(seq_of).fold(cursor_seq, u64::max);
    let cands: Vec<&Value> = examined.into_iter().filter(|r| select(r)).collect();
    if cands.is_empty() {
        let mut next = shared(state, 0);
        next.insert("cursor_seq".into(), json!(past_all));
        next.insert("since".into(), json!(since));
        if let Some(at) = state.get("last_admitted_at") {
            next.insert("last_admitted_at".into(), at.clone());
        }
        return Ok((None, Value::Object(next)));
    }
    let max_batch = binding.config["max_batch"]
        .as_u64()
        .unwrap_or(DEFAULT_MAX_BATCH) as usize;
    let batch = &cands[..cands.len().min(max_batch)];
    let last = seq_of(batch[batch.len() - 1]);
    let new_cursor = if cands.len() > batch.len() {
        last
    } else {
        past_all
    };
    let event_ids: Vec<String> = batch
        .iter()
        .map(|r| r["event_id"].as_str().unwrap_or_default().to_string())
        .collect();
    let digest = Sha256::digest(event_ids.join("\n").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let payloads: Vec<Value> = batch.iter().map(|r| r["payload"].clone()).collect();
    let trusted = payloads.iter().all(|p| p["abstracttrust"] == "trusted");
    let fired_at = format_time(parse_time("now", now)?);
    let payload = json!({
        "count": batch.len(),
        "event_ids": event_ids,
        "first_seq": seq_of(batch[0]),
        "last_seq": last,
        "content_trust": if trusted { "trusted" } else { "untrusted" },
        "connection_id": binding.config["connection_id"],
        "events": payloads,
    });
    let mut next = shared(state, 1);
    next.insert("cursor_seq".into(), json!(new_cursor));
    next.insert("since".into(), json!(since));
    next.insert("last_admitted_at".into(), json!(fired_at));
    let admission = Admission {
        event_id: format!(
            "{}@{}:{}:{hex}",
            binding.source_id, binding.source_version, binding.binding_id
        ),
        fired_at,
        inputs: inputs(&payload),
        payload,
    };
    Ok((Some(admission), Value::Object(next)))
}

/// Resuming: events up to `now` are never admitted (`since` = `now`).
pub fn rearm(binding: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
    let (cursor_seq, _) = cursor(state, binding);
    let mut next = shared(state, 0);
    next.insert("cursor_seq".into(), json!(cursor_seq));
    next.insert("since".into(), json!(format_time(parse_time("now", now)?)));
    Ok(Value::Object(next))
}

/// Exports a connection-bound event source `$id@$version` whose every
/// method is this module's, with `$inputs` (a `fn(&Value) -> Option<Value>`
/// over the admission's payload) building the occurrence's named inputs.
/// A source that needs more (its own config fields, a filter) implements
/// [`TriggerSource`](super::TriggerSource) itself and calls this module
/// (`flows/triggers/plugins/alert`).
///
/// ```ignore
/// stepwell_guest::export_connection_source!("webhook.received", 1, "When a webhook is called", calls);
/// ```
#[macro_export]
macro_rules! export_connection_source {
    ($id:literal, $version:literal, $label:literal, $inputs:path) => {
        const _: () = {
            use $crate::trigger::connection;
            use $crate::trigger::{Admission, Binding, Descriptor, Kind, TriggerError, Wait};

            struct __ConnectionSource;

            impl $crate::trigger::TriggerSource for __ConnectionSource {
                fn descriptor() -> Descriptor {
                    Descriptor {
                        config_schema: connection::binding_config_schema(),
                        event_schema: connection::batch_event_schema(),
                        ..Descriptor::new($id, $version, $label, Kind::Event)
                    }
                }
                fn validate(
                    config: serde_json::Value,
                    now: &str,
                ) -> Result<serde_json::Value, TriggerError> {
                    connection::validate(config, now)
                }
                fn initial_state(
                    binding: &Binding,
                    _: &str,
                ) -> Result<serde_json::Value, TriggerError> {
                    Ok(connection::initial_state(binding))
                }
                fn prepare(
                    b: &Binding,
                    state: &serde_json::Value,
                    now: &str,
                    events: &[serde_json::Value],
                ) -> Result<Wait, TriggerError> {
                    connection::prepare(b, state, now, events)
                }
                fn admit(
                    b: &Binding,
                    state: &serde_json::Value,
                    now: &str,
                    events: &[serde_json::Value],
                ) -> Result<(Option<Admission>, serde_json::Value), TriggerError> {
                    connection::admit(b, state, now, events, $inputs)
                }
                fn rearm(
                    b: &Binding,
                    state: &serde_json::Value,
                    now: &str,
                ) -> Result<serde_json::Value, TriggerError> {
                    connection::rearm(b, state, now)
                }
            }

            $crate::export_trigger_source!(__ConnectionSource);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(max_batch: u64) -> Binding {
        Binding {
            binding_id: "b".into(),
            source_id: "webhook.received".into(),
            source_version: 1,
            config: json!({"connection_id": "tc_1", "max_batch": max_batch, "start_at": "2026-12-01T10:00:00+00:00"}),
        }
    }

    fn event(seq: u64, at: &str) -> Value {
        json!({"seq": seq, "event_id": format!("trigger:tc_1:e{seq}"), "stream": "trigger:tc_1",
               "appended_at": at, "payload": {"id": format!("e{seq}"), "abstracttrust": "untrusted"}})
    }

    #[test]
    fn a_batch_admits_up_to_max_and_keeps_the_rest() {
        let b = binding(2);
        let state = initial_state(&b);
        let events: Vec<Value> = (1..=3)
            .map(|i| event(i, "2026-12-01T10:00:01+00:00"))
            .collect();
        let (a, state) = admit(&b, &state, "2026-12-01T10:00:02Z", &events, |_| None).unwrap();
        let a = a.unwrap();
        assert_eq!(a.payload["count"], 2);
        assert_eq!(state["cursor_seq"], 2);
        let (a, state) = admit(&b, &state, "2026-12-01T10:00:03Z", &events, |_| None).unwrap();
        assert_eq!(a.unwrap().payload["event_ids"], json!(["trigger:tc_1:e3"]));
        assert_eq!(state["cursor_seq"], 3);
        assert_eq!(state["tick"], 2);
        let (none, _) = admit(&b, &state, "2026-12-01T10:00:04Z", &events, |_| None).unwrap();
        assert!(none.is_none());
    }

    #[test]
    fn events_before_since_are_never_admitted() {
        let b = binding(20);
        let state = initial_state(&b);
        let events = vec![
            event(1, "2026-12-01T09:59:59+00:00"),
            event(2, "2026-12-01T10:00:00.500000+00:00"),
        ];
        let (a, _) = admit(&b, &state, "2026-12-01T10:01:00Z", &events, |_| None).unwrap();
        assert_eq!(a.unwrap().payload["event_ids"], json!(["trigger:tc_1:e2"]));
        let rearmed = rearm(&b, &state, "2026-12-01T11:00:00Z").unwrap();
        assert_eq!(
            prepare(&b, &rearmed, "2026-12-01T11:00:00Z", &events).unwrap(),
            Wait::Idle
        );
    }

    #[test]
    fn events_a_source_passes_over_move_the_cursor() {
        let b = binding(1);
        let state = initial_state(&b);
        let events: Vec<Value> = (1..=2)
            .map(|i| event(i, "2026-12-01T10:00:01+00:00"))
            .collect();
        let (none, next) = admit_selected(
            &b,
            &state,
            "2026-12-01T10:00:02Z",
            &events,
            |_| false,
            |_| None,
        )
        .unwrap();
        assert!(none.is_none());
        assert_eq!(next["cursor_seq"], 2);
        assert_eq!(next["tick"], 0);
        assert_eq!(
            prepare(&b, &next, "2026-12-01T10:00:02Z", &events).unwrap(),
            Wait::Idle
        );
    }

    #[test]
    fn the_config_is_checked() {
        assert!(validate(
            json!({"connection_id": "tc_1", "x": 1}),
            "2026-12-01T10:00:00Z"
        )
        .is_err());
        assert!(validate(json!({"connection_id": "-bad"}), "2026-12-01T10:00:00Z").is_err());
        assert!(validate(
            json!({"connection_id": "tc", "max_batch": 0}),
            "2026-12-01T10:00:00Z"
        )
        .is_err());
        let ok = validate(json!({"connection_id": "tc"}), "2026-12-01T10:00:00Z").unwrap();
        assert_eq!(ok["start_at"], "2026-12-01T10:00:00+00:00");
        assert_eq!(ok["max_batch"], 20);
    }
}

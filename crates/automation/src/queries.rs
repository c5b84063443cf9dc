//! Reads over an automation's controller ledger (pure: no store, no
//! writes): its `automation.*` records, its occurrences, its attention
//! items, and the cursors that page them.

use serde_json::{json, Map, Value};

use super::AutomationError;
use stepwell_runtime::core::model::{StepRecord, StepStatus};

/// The prefix of an occurrence cursor (`occ1:<index>`).
pub const OCCURRENCE_CURSOR_PREFIX: &str = "occ1:";
/// The prefix of an attention cursor (`att1:<seq>`).
pub const ATTENTION_CURSOR_PREFIX: &str = "att1:";
/// The prefix of an automations-list cursor.
pub const AUTOMATIONS_CURSOR_PREFIX: &str = "auto1:";
/// The most rows one page holds.
pub const MAX_PAGE: i64 = 500;

/// One `automation.*` ledger record: its name (`automation.admitted`), its
/// payload and its key.
#[derive(Debug, Clone, PartialEq)]
pub struct AutomationRecord<'a> {
    /// `automation.<x>`.
    pub name: &'a str,
    /// The record's payload (`{schema_version, automation_id, revision, at,
    /// state_version, delta, ...fields}`).
    pub payload: &'a Value,
    /// `automation:<x>:<automation id>:<discriminator>`.
    pub key: Option<&'a str>,
}

/// The automation record `r` is, if it is one: a completed `emit_event`
/// record whose event is named `automation.*` with an object payload.
pub fn automation_record(r: &StepRecord) -> Option<AutomationRecord<'_>> {
    let effect = r.effect.as_ref()?;
    if effect.kind != "emit_event" || r.status != StepStatus::Completed {
        return None;
    }
    let name = effect.payload.get("name")?.as_str()?;
    if !name.starts_with("automation.") {
        return None;
    }
    let payload = effect.payload.get("payload").filter(|p| p.is_object())?;
    Some(AutomationRecord {
        name,
        payload,
        key: r.idempotency_key.as_deref(),
    })
}

/// The automation records among `records`, in append order, named one of
/// `names` (all when empty).
pub fn automation_records<'a>(
    records: &'a [StepRecord],
    names: &[&str],
) -> Vec<AutomationRecord<'a>> {
    records
        .iter()
        .filter_map(automation_record)
        .filter(|r| names.is_empty() || names.contains(&r.name))
        .collect()
}

/// The record keyed exactly `key` (the oldest), if there is one.
pub fn find_record<'a>(records: &'a [StepRecord], key: &str) -> Option<AutomationRecord<'a>> {
    records
        .iter()
        .filter(|r| r.idempotency_key.as_deref() == Some(key))
        .find_map(automation_record)
}

fn bad_cursor(what: &str, cursor: &str) -> AutomationError {
    AutomationError::new(
        "invalid_request",
        Some("cursor"),
        format!("invalid {what} cursor {cursor:?}"),
    )
}

/// An integer as Python's `int()` reads text: surrounding whitespace, a
/// sign, ASCII digits (single underscores between digits allowed).
fn py_int(text: &str) -> Option<i64> {
    let t = text.trim();
    let (sign, digits) = match t.as_bytes().first()? {
        b'-' => (-1, &t[1..]),
        b'+' => (1, &t[1..]),
        _ => (1, t),
    };
    if digits.is_empty()
        || digits.starts_with('_')
        || digits.ends_with('_')
        || digits.contains("__")
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    // The magnitude is read wider than `i64`: `-9223372036854775808`
    // (`i64::MIN`) has no positive counterpart there.
    let n = digits.replace('_', "").parse::<i128>().ok()?;
    i64::try_from(sign * n).ok()
}

/// `occ1:<index>`.
pub fn occurrence_cursor(index: i64) -> String {
    format!("{OCCURRENCE_CURSOR_PREFIX}{index}")
}

/// The index an occurrence cursor stands for (`invalid_request` / `cursor`
/// if it is not one).
pub fn parse_occurrence_cursor(cursor: &str) -> Result<i64, AutomationError> {
    cursor
        .strip_prefix(OCCURRENCE_CURSOR_PREFIX)
        .and_then(py_int)
        .ok_or_else(|| bad_cursor("occurrence", cursor))
}

/// `att1:<seq>`.
pub fn attention_cursor(seq: i64) -> String {
    format!("{ATTENTION_CURSOR_PREFIX}{seq}")
}

/// The sequence number an attention cursor stands for.
pub fn parse_attention_cursor(cursor: &str) -> Result<i64, AutomationError> {
    cursor
        .strip_prefix(ATTENTION_CURSOR_PREFIX)
        .and_then(py_int)
        .ok_or_else(|| bad_cursor("attention", cursor))
}

/// JSON text as Python's `json.dumps` writes it with its default
/// `ensure_ascii`: every non-ASCII character as `\uXXXX` (surrogate pairs
/// beyond the BMP).
fn ascii_json(v: &Value) -> String {
    let text = v.to_string();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// URL-safe base64 with `=` padding (RFC 4648 section 5).
fn base64_url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The bytes of padded URL-safe base64, or `None` if `text` is not that.
fn base64_url_decode(text: &str) -> Option<Vec<u8>> {
    let bytes = text.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (q, quad) in bytes.chunks(4).enumerate() {
        let last = q == bytes.len() / 4 - 1;
        let pad = quad.iter().rev().take_while(|b| **b == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (i, b) in quad.iter().enumerate() {
            let v = if i >= 4 - pad {
                0
            } else {
                B64.iter().position(|c| c == b)? as u32
            };
            n = (n << 6) | v;
        }
        let decoded = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&decoded[..3 - pad]);
    }
    Some(out)
}

/// The automations-list cursor after the row `(created_at, run_id)`:
/// `auto1:` + URL-safe base64 (padded) of the JSON `[created_at, run_id]`.
pub fn automations_cursor(created_at: &str, run_id: &str) -> String {
    let text = ascii_json(&json!([created_at, run_id]));
    format!("{AUTOMATIONS_CURSOR_PREFIX}{}", base64_url(text.as_bytes()))
}

/// The `(created_at, run_id)` an automations-list cursor stands for.
pub fn parse_automations_cursor(cursor: &str) -> Result<(String, String), AutomationError> {
    let bad = || bad_cursor("automations", cursor);
    let encoded = cursor
        .strip_prefix(AUTOMATIONS_CURSOR_PREFIX)
        .ok_or_else(bad)?;
    let bytes = base64_url_decode(encoded).ok_or_else(bad)?;
    let pair: Vec<Value> = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let text = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match pair.as_slice() {
        [created_at, run_id] => Ok((text(created_at), text(run_id))),
        _ => Err(bad()),
    }
}

/// `limit` clamped to 1..=500.
fn page_size(limit: i64) -> usize {
    limit.clamp(1, MAX_PAGE) as usize
}

/// One page of an automation's occurrences, newest first, folded from its
/// controller's ledger `records` (`admitted` creates a row; `dispatched`,
/// `retry_scheduled` and `completed` update it): `{"items", "next_cursor"}`.
/// A row: `{index, run_id, run_ids, attempts, revision, event_id, fired_at,
/// trigger: {source_id, source_version}, user_turn, status, finished_at,
/// notify, attention}`, `status` one of `admitted`, `running`, `backoff`,
/// `completed`, `failed`, `cancelled`. `cursor` (`occ1:<n>`) keeps the
/// occurrences below index n; `limit` is clamped to 1..=500.
pub fn occurrence_page(
    records: &[StepRecord],
    cursor: Option<&str>,
    limit: i64,
) -> Result<Value, AutomationError> {
    let before = cursor.map(parse_occurrence_cursor).transpose()?;
    let mut rows: std::collections::BTreeMap<i64, Map<String, Value>> = Default::default();
    let names = [
        "automation.admitted",
        "automation.dispatched",
        "automation.retry_scheduled",
        "automation.completed",
    ];
    for rec in automation_records(records, &names) {
        let p = rec.payload;
        let Some(index) = p.get("index").and_then(Value::as_i64) else {
            continue;
        };
        if rec.name == "automation.admitted" {
            let envelope = p.get("trigger_envelope").cloned().unwrap_or(json!({}));
            let prompt = &p["prepared"]["input_data"]["prompt"];
            let row = json!({
                "index": index,
                "run_id": p["run_id"],
                "run_ids": [],
                "attempts": 1,
                "revision": p.get("revision").cloned().unwrap_or(Value::Null),
                "event_id": p.get("event_id").cloned().unwrap_or(Value::Null),
                "fired_at": envelope.get("fired_at").cloned().unwrap_or(Value::Null),
                "trigger": {"source_id": envelope.get("source_id").cloned().unwrap_or(Value::Null),
                            "source_version": envelope.get("source_version").cloned().unwrap_or(Value::Null)},
                "user_turn": if prompt.is_string() { prompt.clone() } else { Value::Null },
                "status": "admitted",
                "finished_at": null,
                "notify": null,
                "attention": null,
            });
            let Value::Object(row) = row else { continue };
            rows.insert(index, row);
            continue;
        }
        let Some(row) = rows.get_mut(&index) else {
            continue;
        };
        match rec.name {
            "automation.dispatched" => {
                row.insert("run_id".into(), p["run_id"].clone());
                row.insert("attempts".into(), p["attempt"].clone());
                row.insert("status".into(), json!("running"));
                if let Some(Value::Array(ids)) = row.get_mut("run_ids") {
                    if !ids.contains(&p["run_id"]) {
                        ids.push(p["run_id"].clone());
                    }
                }
            }
            "automation.retry_scheduled" => {
                row.insert("status".into(), json!("backoff"));
            }
            _ => {
                for (key, from) in [
                    ("status", "status"),
                    ("attempts", "attempts"),
                    ("finished_at", "finished_at"),
                    ("notify", "notify"),
                    ("attention", "attention"),
                ] {
                    row.insert(key.into(), p.get(from).cloned().unwrap_or(Value::Null));
                }
            }
        }
    }
    // Newest first.
    let ordered: Vec<(i64, Map<String, Value>)> = rows
        .into_iter()
        .rev()
        .filter(|(i, _)| before.is_none_or(|b| *i < b))
        .collect();
    let size = page_size(limit);
    let more = ordered.len() > size;
    let page: Vec<(i64, Map<String, Value>)> = ordered.into_iter().take(size).collect();
    let next_cursor = match page.last() {
        Some((i, _)) if more => json!(occurrence_cursor(*i)),
        _ => Value::Null,
    };
    let items: Vec<Value> = page.into_iter().map(|(_, r)| Value::Object(r)).collect();
    Ok(json!({"items": items, "next_cursor": next_cursor}))
}

/// One page of automation `automation_id`'s attention items with a sequence
/// number above `max(after_seq, cursor)`, oldest first, from its
/// controller's ledger `records`: `{"items", "next_cursor"}`. An item:
/// `{kind, automation_id, run_id, index, at, title, seq, cursor, body?,
/// channels, email_result?, recipients?}`. `next_cursor` is the last item's
/// cursor when more items follow: a client acknowledges only the cursor of
/// the last item it showed.
pub fn attention_page(
    automation_id: &str,
    records: &[StepRecord],
    after_seq: i64,
    cursor: Option<&str>,
    limit: i64,
) -> Result<Value, AutomationError> {
    let floor = after_seq.max(cursor.map(parse_attention_cursor).transpose()?.unwrap_or(0));
    let mut items: Vec<(i64, Value)> = Vec::new();
    // Newest first, stopping at the first item at or below the floor
    // (sequence numbers grow in append order).
    for rec in automation_records(records, &["automation.completed"])
        .into_iter()
        .rev()
    {
        let p = rec.payload;
        let Some(att) = p.get("attention").and_then(Value::as_object) else {
            continue;
        };
        let seq = att.get("seq").and_then(Value::as_i64).unwrap_or(0);
        if seq == 0 {
            continue;
        }
        if seq <= floor {
            break;
        }
        let at = match p.get("finished_at") {
            Some(v) if !v.is_null() && v != "" => v.clone(),
            _ => p.get("at").cloned().unwrap_or(Value::Null),
        };
        let mut item = json!({
            "kind": att.get("kind").cloned().unwrap_or(Value::Null),
            "automation_id": automation_id,
            "run_id": p.get("run_id").cloned().unwrap_or(Value::Null),
            "index": p.get("index").cloned().unwrap_or(Value::Null),
            "at": at,
            "title": att.get("title").cloned().unwrap_or(Value::Null),
            "seq": seq,
            "cursor": attention_cursor(seq),
        });
        if let Some(body) = att.get("body").filter(|b| !b.is_null() && *b != "") {
            item["body"] = body.clone();
        }
        item["channels"] = match att.get("channels") {
            Some(Value::Array(c)) if !c.is_empty() => Value::Array(c.clone()),
            _ => json!(["console"]),
        };
        if let Some(email) = att.get("email_result") {
            item["email_result"] = email.clone();
            item["recipients"] = match att.get("recipients") {
                Some(Value::Array(r)) if !r.is_empty() => Value::Array(r.clone()),
                _ => json!(["self"]),
            };
        }
        items.push((seq, item));
    }
    items.sort_by_key(|(seq, _)| *seq);
    let size = page_size(limit);
    let more = items.len() > size;
    let page: Vec<Value> = items.into_iter().take(size).map(|(_, i)| i).collect();
    let next_cursor = match page.last() {
        Some(last) if more => last["cursor"].clone(),
        _ => Value::Null,
    };
    Ok(json!({"items": page, "next_cursor": next_cursor}))
}

/// Property tests of the paging cursors: what a page hands out reads back,
/// and any text a client sends is read or refused with a typed error.
#[cfg(test)]
mod cursor_properties {
    use super::*;
    use proptest::prelude::*;

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// Any `i64`, its bounds and the small ones often.
    fn int() -> impl Strategy<Value = i64> {
        prop_oneof![any::<i64>(), Just(i64::MIN), Just(i64::MAX), -2i64..=2,]
    }

    /// Text a client may send as a cursor: any, or near one of the forms.
    fn cursor_text() -> impl Strategy<Value = String> {
        let prefix = prop::sample::select(vec![
            OCCURRENCE_CURSOR_PREFIX,
            ATTENTION_CURSOR_PREFIX,
            AUTOMATIONS_CURSOR_PREFIX,
            "",
        ]);
        let rest = prop_oneof![
            any::<String>(),
            "[ \\t]?[+-]?[0-9_]{0,24}[ \\n]?",
            "[A-Za-z0-9_=-]{0,24}",
            (".{0,6}", ".{0,6}")
                .prop_map(|(a, b)| { base64_url(json!([a, b]).to_string().as_bytes()) }),
        ];
        (prefix, rest).prop_map(|(p, r)| format!("{p}{r}"))
    }

    /// Whether `result` is a cursor read, or the typed refusal naming
    /// `text`.
    fn read_or_refused<T>(result: &Result<T, AutomationError>, text: &str) -> bool {
        match result {
            Ok(_) => true,
            Err(e) => {
                e.reason_code == "invalid_request"
                    && e.field.as_deref() == Some("cursor")
                    && e.message.contains(&format!("{text:?}"))
            }
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// Every cursor a page hands out reads back as what it stands for.
        #[test]
        fn a_cursor_reads_back_as_what_it_stands_for(
            n in int(),
            created_at in any::<String>(),
            run_id in any::<String>(),
        ) {
            prop_assert_eq!(parse_occurrence_cursor(&occurrence_cursor(n)), Ok(n));
            prop_assert_eq!(parse_attention_cursor(&attention_cursor(n)), Ok(n));
            let cursor = automations_cursor(&created_at, &run_id);
            prop_assert!(cursor.is_ascii());
            prop_assert_eq!(parse_automations_cursor(&cursor), Ok((created_at, run_id)));
        }

        /// Any text is read as a cursor or refused as `invalid_request`
        /// about `cursor`, naming it; what is read reads the same once
        /// written again.
        #[test]
        fn any_text_is_read_or_refused_with_a_typed_error(text in cursor_text()) {
            let occurrence = parse_occurrence_cursor(&text);
            prop_assert!(read_or_refused(&occurrence, &text), "{:?}", occurrence);
            if let Ok(n) = occurrence {
                prop_assert_eq!(parse_occurrence_cursor(&occurrence_cursor(n)), Ok(n));
            }
            let attention = parse_attention_cursor(&text);
            prop_assert!(read_or_refused(&attention, &text), "{:?}", attention);
            if let Ok(n) = attention {
                prop_assert_eq!(parse_attention_cursor(&attention_cursor(n)), Ok(n));
            }
            let automations = parse_automations_cursor(&text);
            prop_assert!(read_or_refused(&automations, &text), "{:?}", automations);
            if let Ok((a, b)) = automations {
                let again = automations_cursor(&a, &b);
                prop_assert_eq!(parse_automations_cursor(&again), Ok((a, b)));
            }
        }

        /// Base64 reads back what it wrote, of any bytes, and reads any
        /// text without a panic.
        #[test]
        fn base64_reads_back_any_bytes(
            bytes in prop::collection::vec(any::<u8>(), 0..40),
            text in "[A-Za-z0-9_=+/-]{0,16}",
        ) {
            let encoded = base64_url(&bytes);
            prop_assert_eq!(encoded.len() % 4, 0);
            prop_assert_eq!(base64_url_decode(&encoded), Some(bytes));
            if let Some(decoded) = base64_url_decode(&text) {
                prop_assert_eq!(decoded.len(), text.len() / 4 * 3 - text.matches('=').count());
            }
        }
    }
}

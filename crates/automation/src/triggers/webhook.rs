//! Webhook calls to a `webhook.received@1` connection, verified per
//! **Standard Webhooks** (<https://www.standardwebhooks.com>): three headers,
//!
//! ```text
//! webhook-id:        a unique message id (a retry reuses it)
//! webhook-timestamp: integer seconds since the epoch
//! webhook-signature: space-separated "v1,<base64 HMAC-SHA256>" entries
//! ```
//!
//! over `"<webhook-id>.<webhook-timestamp>.<raw body>"`, keyed with the
//! base64-decoded secret (`whsec_<base64>`). The host verifies (the secret
//! never enters a guest), then appends one event to the connection's
//! stream with the webhook id as its dedupe key: a replayed id is a
//! duplicate and never runs anything twice.

use super::connections::{Connections, ConnectionsInner};
use std::collections::HashMap;

use base64::Engine as _;
use chrono::{DateTime, TimeZone, Utc};
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::connections::{ConnectionEvent, WEBHOOK_SOURCE};
use stepwell_automation_core::time::format_timestamp as format_time;
use stepwell_runtime::core::Result;
use stepwell_runtime::Runtime;

/// The largest body a webhook call may have.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// The longest `webhook-id`, in characters.
pub const MAX_WEBHOOK_ID: usize = 256;
/// The most `webhook-signature` entries looked at (one per secret a
/// sender signs with while it rotates).
pub const MAX_SIGNATURES: usize = 16;
/// Headers never kept with a stored call.
pub const WITHHELD_HEADERS: [&str; 4] = [
    "webhook-signature",
    "authorization",
    "proxy-authorization",
    "cookie",
];

/// The HMAC key of a `whsec_<base64>` secret (at least 16 bytes).
pub fn secret_key(secret: &str) -> std::result::Result<Vec<u8>, String> {
    let raw = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|_| "the webhook secret is not base64 (whsec_<base64>)".to_string())?;
    if key.len() < 16 {
        return Err("the webhook secret must decode to at least 16 bytes".into());
    }
    Ok(key)
}

/// The `webhook-signature` value (`v1,<base64>`) a sender puts on a call.
pub fn sign(
    secret: &str,
    webhook_id: &str,
    timestamp: i64,
    body: &[u8],
) -> std::result::Result<String, String> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(&secret_key(secret)?).map_err(|e| e.to_string())?;
    mac.update(format!("{webhook_id}.{timestamp}.").as_bytes());
    mac.update(body);
    Ok(format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    ))
}

/// Why a call's signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// A header is missing (or the id is longer than 256).
    MissingHeaders,
    /// `webhook-timestamp` is not an integer.
    BadTimestamp,
    /// The timestamp is further from now than the tolerance.
    Stale,
    /// No `v1` signature matches.
    BadSignature,
}

/// A verified call: its id and timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// `webhook-id`.
    pub webhook_id: String,
    /// `webhook-timestamp`.
    pub timestamp: i64,
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Checks a call's Standard Webhooks signature: valid when one `v1`
/// signature matches (compared in constant time) and the timestamp is
/// within `tolerance_s` of `now` either way. Replays are the inbox's to
/// refuse (the dedupe key), not this function's.
pub fn verify(
    secret: &str,
    headers: &[(String, String)],
    body: &[u8],
    now: DateTime<Utc>,
    tolerance_s: i64,
) -> std::result::Result<Verified, (Refusal, Option<String>)> {
    let id = header(headers, "webhook-id");
    let (Some(id), Some(ts), Some(sigs)) = (
        id,
        header(headers, "webhook-timestamp"),
        header(headers, "webhook-signature"),
    ) else {
        return Err((Refusal::MissingHeaders, id.map(str::to_string)));
    };
    if id.chars().count() > MAX_WEBHOOK_ID {
        return Err((Refusal::MissingHeaders, None));
    }
    let refused = |r| Err((r, Some(id.to_string())));
    let Ok(timestamp) = ts.parse::<i64>() else {
        return refused(Refusal::BadTimestamp);
    };
    if now.timestamp().abs_diff(timestamp) > tolerance_s.unsigned_abs() {
        return refused(Refusal::Stale);
    }
    // The body is hashed once, whatever the number of entries (a caller
    // without the secret cannot make the host hash it again and again),
    // and at most MAX_SIGNATURES entries are looked at.
    let Ok(mut mac) = secret_key(secret)
        .and_then(|key| Hmac::<Sha256>::new_from_slice(&key).map_err(|e| e.to_string()))
    else {
        return refused(Refusal::BadSignature);
    };
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = mac.finalize().into_bytes();
    let b64 = base64::engine::general_purpose::STANDARD;
    for entry in sigs.split(' ').take(MAX_SIGNATURES) {
        let Some(("v1", value)) = entry.split_once(',') else {
            continue;
        };
        let Ok(given) = b64.decode(value) else {
            continue;
        };
        if given.len() == expected.len() && bool::from(given.as_slice().ct_eq(expected.as_slice()))
        {
            return Ok(Verified {
                webhook_id: id.to_string(),
                timestamp,
            });
        }
    }
    refused(Refusal::BadSignature)
}

/// The event `data` of a call's body: `{webhook_id, content_type, body}`
/// (JSON, any value; an empty body is `null`) or `{webhook_id,
/// content_type, body_text}` (UTF-8 text, and JSON holding an integer
/// beyond 64 bits, kept exactly as text); `None` for a body that is neither
/// (not UTF-8, or declared JSON and not JSON).
pub fn event_data(
    webhook_id: &str,
    body: &[u8],
    content_type: Option<&str>,
) -> Option<Map<String, Value>> {
    let ctype = content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let text = std::str::from_utf8(body).ok()?;
    let mut out = Map::new();
    out.insert("webhook_id".into(), json!(webhook_id));
    let json_declared = ctype.is_empty() || ctype == "application/json" || ctype.ends_with("+json");
    // JSON holding an integer beyond 64 bits is kept as its text, exactly,
    // rather than parsed with the integer rounded to a float.
    if json_declared && stepwell_flat_json::find_inexact_integer(text).is_none() {
        let parsed = if text.trim().is_empty() {
            Ok(Value::Null)
        } else {
            serde_json::from_str::<Value>(text)
        };
        match parsed {
            Ok(v) => {
                let ct = if ctype.is_empty() {
                    "application/json"
                } else {
                    &ctype
                };
                out.insert("content_type".into(), json!(ct));
                out.insert("body".into(), v);
                return Some(out);
            }
            Err(_) if !ctype.is_empty() => return None,
            Err(_) => {}
        }
    }
    let ct = if ctype.is_empty() {
        "text/plain"
    } else {
        &ctype
    };
    out.insert("content_type".into(), json!(ct));
    out.insert("body_text".into(), json!(text));
    Some(out)
}

fn subject_from(body: Option<&Value>, path: Option<&str>) -> Option<String> {
    let mut cur = body?;
    for part in path?.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// What a webhook call came to: the answer `stepwell serve` gives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Received {
    /// `appended`, `duplicate` or `refused`.
    pub status: &'static str,
    /// 202, 409, 401, 404, 413, 415, or 503 when the host cannot open the
    /// connection's secret.
    pub http_status: u16,
    /// Why it was refused (`missing_headers`, `bad_timestamp`, `stale`,
    /// `bad_signature`, `too_large`, `unsupported_body`,
    /// `connection_not_found`, `replayed_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
    /// The call's `webhook-id`, when it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_id: Option<String>,
    /// The stored event's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// The stored event's position in its stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

impl Received {
    /// The answer to a call to an unknown, disabled or non-webhook
    /// connection: 404 `connection_not_found`.
    pub fn not_found() -> Self {
        Self::refused(404, "connection_not_found", None)
    }

    /// The answer to a call whose body is over [`MAX_BODY_BYTES`]: 413
    /// `too_large`.
    pub fn too_large() -> Self {
        Self::refused(413, "too_large", None)
    }

    fn refused(http_status: u16, reason: &'static str, webhook_id: Option<String>) -> Self {
        Received {
            status: "refused",
            http_status,
            reason: Some(reason),
            webhook_id,
            event_id: None,
            seq: None,
        }
    }
}

fn refusal_name(r: Refusal) -> &'static str {
    match r {
        Refusal::MissingHeaders => "missing_headers",
        Refusal::BadTimestamp => "bad_timestamp",
        Refusal::Stale => "stale",
        Refusal::BadSignature => "bad_signature",
    }
}

/// Webhook calls a runtime receives for its connections (the triggers feature).
pub trait Webhooks {
    /// Receives one webhook call to connection `connection_id`: an unknown,
    /// disabled or non-webhook connection is 404 (`connection_not_found`),
    /// a body over [`MAX_BODY_BYTES`] 413, a bad or stale signature 401, a
    /// body that is neither JSON nor UTF-8 text 415, a `webhook-id` the
    /// stream already holds 409 (`duplicate`); else the call is appended
    /// (202) and the automations bound to the connection are woken.
    /// Refusals after the connection was found are recorded on it
    /// (`last_error`, at most once a minute per connection).
    fn receive_webhook(
        &self,
        connection_id: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Received>;

    /// Whether connection `connection_id` takes webhook calls now (it
    /// exists, is active and its source is the webhook): a server asks
    /// before it reads a call's body.
    fn accepts_webhooks(&self, connection_id: &str) -> Result<bool>;
}

impl Webhooks for Runtime {
    fn receive_webhook(
        &self,
        connection_id: &str,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Received> {
        let Some(c) = self.webhook_connection(connection_id)? else {
            return Ok(Received::not_found());
        };
        let now = self.now();
        let out = self.verified_call(&c, headers, body, now)?;
        // A refusal of the caller's call is noted on the connection (the
        // host's own failure, a 503, is in the log).
        if let Some(reason) = out
            .reason
            .filter(|_| out.status == "refused" && out.http_status != 503)
        {
            self.note_refusal(&c, reason, now);
        }
        Ok(out)
    }

    fn accepts_webhooks(&self, connection_id: &str) -> Result<bool> {
        Ok(self.webhook_connection(connection_id)?.is_some())
    }
}

/// What the rest of this feature reaches of a runtime beside [`Webhooks`].
pub(crate) trait WebhooksInner {
    /// Connection `connection_id` when it takes webhook calls now.
    fn webhook_connection(
        &self,
        connection_id: &str,
    ) -> Result<Option<stepwell_runtime::store::ConnectionRecord>>;

    fn verified_call(
        &self,
        c: &stepwell_runtime::store::ConnectionRecord,
        headers: &[(String, String)],
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Received>;

    /// Records a refused call on the connection (`last_error`, with how
    /// many calls were refused since the last write), at most once a minute
    /// per connection whatever the reason: a stream of forged calls costs
    /// no stream of writes. The count is kept in memory
    /// ([`RefusalThrottle`]); the stored `last_error` holds off the other
    /// processes on the store as well.
    fn note_refusal(
        &self,
        c: &stepwell_runtime::store::ConnectionRecord,
        reason: &str,
        now: DateTime<Utc>,
    );
}

impl WebhooksInner for Runtime {
    fn webhook_connection(
        &self,
        connection_id: &str,
    ) -> Result<Option<stepwell_runtime::store::ConnectionRecord>> {
        let c = match self.connection(connection_id) {
            Ok(c) => c,
            Err(e)
                if e.extension::<crate::AutomationError>()
                    .is_some_and(|a| a.reason_code == "connection_not_found") =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        Ok((c.status == "active" && c.source() == WEBHOOK_SOURCE).then_some(c))
    }

    fn verified_call(
        &self,
        c: &stepwell_runtime::store::ConnectionRecord,
        headers: &[(String, String)],
        body: &[u8],
        now: DateTime<Utc>,
    ) -> Result<Received> {
        if body.len() > MAX_BODY_BYTES {
            return Ok(Received::refused(413, "too_large", None));
        }
        // A secret that cannot be opened (a missing or unreadable key
        // file) is the host's fault: 503, the detail in the log only.
        let secret = match self.connection_secret(c) {
            Ok(Some(secret)) => secret,
            Ok(None) => return Ok(Received::refused(401, "bad_signature", None)),
            Err(e) => {
                tracing::error!(connection_id = %c.connection_id, error = %e, "webhook secret unavailable");
                return Ok(Received::refused(503, "unavailable", None));
            }
        };
        let tolerance = c.config["tolerance_s"].as_i64().unwrap_or(300);
        let v = match verify(&secret, headers, body, now, tolerance) {
            Ok(v) => v,
            Err((r, id)) => return Ok(Received::refused(401, refusal_name(r), id)),
        };
        let Some(mut data) = event_data(&v.webhook_id, body, header(headers, "content-type"))
        else {
            return Ok(Received::refused(
                415,
                "unsupported_body",
                Some(v.webhook_id),
            ));
        };
        let kept: Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .filter(|(k, _)| !WITHHELD_HEADERS.contains(&k.as_str()))
            .map(|(k, v)| (k, json!(v)))
            .collect();
        data.insert("headers".into(), Value::Object(kept));
        let subject = subject_from(data.get("body"), c.config["subject_path"].as_str())
            .unwrap_or_else(|| v.webhook_id.clone());
        let time = Utc.timestamp_opt(v.timestamp, 0).single().map(format_time);
        let digest = hex::encode(Sha256::digest(v.webhook_id.as_bytes()));
        let (appended, event_id) = self.append_connection_event(
            c,
            ConnectionEvent {
                id: format!("webhook:{}", &digest[..32]),
                data: Value::Object(data),
                time,
                subject: Some(subject),
                dedupe_key: v.webhook_id.clone(),
                trusted: false,
            },
        )?;
        Ok(if appended.duplicate {
            Received {
                status: "duplicate",
                http_status: 409,
                reason: Some("replayed_id"),
                webhook_id: Some(v.webhook_id),
                event_id: None,
                seq: Some(appended.seq),
            }
        } else {
            Received {
                status: "appended",
                http_status: 202,
                reason: None,
                webhook_id: Some(v.webhook_id),
                event_id: Some(event_id),
                seq: Some(appended.seq),
            }
        })
    }

    fn note_refusal(
        &self,
        c: &stepwell_runtime::store::ConnectionRecord,
        reason: &str,
        now: DateTime<Utc>,
    ) {
        let stored_recently = c.last_error.as_ref().is_some_and(|e| {
            e["code"]
                .as_str()
                .is_some_and(|c| c.starts_with("webhook_"))
                && e["at"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                    .is_some_and(|t| (now - t.with_timezone(&Utc)).num_seconds() < 60)
        });
        let Ok(state) = super::trigger_state(self) else {
            return;
        };
        let Some(count) = state.refusals.note(&c.connection_id, now, stored_recently) else {
            return;
        };
        let error = json!({
            "code": format!("webhook_{reason}"),
            "at": format_time(now),
            "cause": format!("A webhook call was refused ({reason})."),
            "fix": "Check the sender's signing secret and clock.",
            "refused_calls": count,
        });
        let _ = self.store().update_connection(&c.connection_id, &mut |c| {
            c.last_error = Some(error.clone());
            Ok(())
        });
    }
}

/// Refused webhook calls counted in memory, per connection, between the
/// writes that record them (at most one a minute per connection). Holds at
/// most [`RefusalThrottle::MAX_CONNECTIONS`] connections: past that the
/// oldest entries are forgotten (a connection forgotten may write once
/// more, early).
#[derive(Default)]
pub(crate) struct RefusalThrottle {
    by_connection: parking_lot::Mutex<HashMap<String, Refused>>,
}

/// One connection's refusals since its last write.
struct Refused {
    written: DateTime<Utc>,
    since: u64,
}

impl RefusalThrottle {
    /// The most connections counted at once.
    pub(crate) const MAX_CONNECTIONS: usize = 4096;

    /// Counts a refusal of `connection_id`'s call at `now`. Returns the
    /// number of refusals to write (this one included) when the connection
    /// is due a write: none in the last minute by this process, nor (per
    /// `stored_recently`) by another.
    fn note(&self, connection_id: &str, now: DateTime<Utc>, stored_recently: bool) -> Option<u64> {
        let mut map = self.by_connection.lock();
        if let Some(r) = map.get_mut(connection_id) {
            r.since += 1;
            if stored_recently || (now - r.written).num_seconds() < 60 {
                return None;
            }
            let count = r.since;
            *r = Refused {
                written: now,
                since: 0,
            };
            return Some(count);
        }
        if map.len() >= Self::MAX_CONNECTIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, r)| r.written)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                map.remove(&id);
            }
        }
        let (written, since, due) = if stored_recently {
            (now, 1, None)
        } else {
            (now, 0, Some(1))
        };
        map.insert(connection_id.to_string(), Refused { written, since });
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn refusals_are_written_once_a_minute_per_connection_and_counted() {
        let t = RefusalThrottle::default();
        let at = |s: i64| Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap();
        // The first refusal is written; the next ones in the minute are
        // counted, whatever their reason; the first after it writes them.
        assert_eq!(t.note("tc_a", at(0), false), Some(1));
        assert_eq!(t.note("tc_a", at(1), false), None);
        assert_eq!(t.note("tc_a", at(59), false), None);
        assert_eq!(t.note("tc_a", at(60), false), Some(3));
        // Another connection has its own minute.
        assert_eq!(t.note("tc_b", at(61), false), Some(1));
        // Another process wrote recently: this one holds off and counts.
        assert_eq!(t.note("tc_c", at(0), true), None);
        assert_eq!(t.note("tc_c", at(61), false), Some(2));
    }

    #[test]
    fn the_throttle_holds_a_bounded_number_of_connections() {
        let t = RefusalThrottle::default();
        let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        for i in 0..RefusalThrottle::MAX_CONNECTIONS + 100 {
            t.note(&format!("tc_{i}"), now, false);
        }
        assert_eq!(
            t.by_connection.lock().len(),
            RefusalThrottle::MAX_CONNECTIONS
        );
    }

    fn headers(id: &str, ts: i64, sig: &str) -> Vec<(String, String)> {
        vec![
            ("Webhook-Id".into(), id.into()),
            ("webhook-timestamp".into(), ts.to_string()),
            ("webhook-signature".into(), sig.into()),
        ]
    }

    #[test]
    fn a_signed_call_verifies_and_others_do_not() {
        let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let body = br#"{"a":1}"#;
        let sig = sign(SECRET, "msg_1", 1_700_000_000, body).unwrap();
        let ok = verify(
            SECRET,
            &headers("msg_1", 1_700_000_000, &sig),
            body,
            now,
            300,
        )
        .unwrap();
        assert_eq!(ok.webhook_id, "msg_1");
        // One of several signatures is enough.
        let two = format!("v1,AAAA {sig}");
        assert!(verify(
            SECRET,
            &headers("msg_1", 1_700_000_000, &two),
            body,
            now,
            300
        )
        .is_ok());
        let other = "whsec_dGhpcyBpcyBhbm90aGVyIHNlY3JldCE=";
        assert_eq!(
            verify(
                other,
                &headers("msg_1", 1_700_000_000, &sig),
                body,
                now,
                300
            )
            .unwrap_err()
            .0,
            Refusal::BadSignature
        );
        assert_eq!(
            verify(
                SECRET,
                &headers("msg_1", 1_700_000_000, &sig),
                b"{}",
                now,
                300
            )
            .unwrap_err()
            .0,
            Refusal::BadSignature
        );
        let old = now + chrono::Duration::seconds(600);
        assert_eq!(
            verify(
                SECRET,
                &headers("msg_1", 1_700_000_000, &sig),
                body,
                old,
                300
            )
            .unwrap_err()
            .0,
            Refusal::Stale
        );
        assert_eq!(
            verify(SECRET, &headers("msg_1", 0, "x")[..2], body, now, 300)
                .unwrap_err()
                .0,
            Refusal::MissingHeaders
        );
    }

    #[test]
    fn many_entries_and_far_timestamps_are_refused_cheaply() {
        let now = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let body = b"{}";
        let sig = sign(SECRET, "m", 1_700_000_000, body).unwrap();
        // The valid one among the first 16 entries is found...
        let few = format!("{} {sig}", vec!["v1,AAAA"; 15].join(" "));
        assert!(verify(SECRET, &headers("m", 1_700_000_000, &few), body, now, 300).is_ok());
        // ... and not after them.
        let many = format!("{} {sig}", vec!["v1,AAAA"; 10_000].join(" "));
        assert_eq!(
            verify(SECRET, &headers("m", 1_700_000_000, &many), body, now, 300)
                .unwrap_err()
                .0,
            Refusal::BadSignature
        );
        // A timestamp that would overflow a subtraction is stale.
        let far = sign(SECRET, "m", i64::MIN, body).unwrap();
        assert_eq!(
            verify(SECRET, &headers("m", i64::MIN, &far), body, now, 300)
                .unwrap_err()
                .0,
            Refusal::Stale
        );
        // 256 characters (not bytes) is the longest id.
        let id: String = "é".repeat(256);
        let sig = sign(SECRET, &id, 1_700_000_000, body).unwrap();
        assert!(verify(SECRET, &headers(&id, 1_700_000_000, &sig), body, now, 300).is_ok());
    }

    #[test]
    fn json_with_a_huge_integer_is_kept_as_text() {
        let text = r#"{"id":123456789012345678901234567890}"#;
        let d = event_data("i", text.as_bytes(), Some("application/json")).unwrap();
        assert_eq!(d["body_text"], text);
        assert_eq!(d["content_type"], "application/json");
        assert!(d.get("body").is_none());
        let d = event_data("i", br#"{"id":9223372036854775807}"#, None).unwrap();
        assert_eq!(d["body"]["id"], json!(9223372036854775807i64));
    }

    #[test]
    fn bodies_become_json_or_text_or_nothing() {
        let j = event_data(
            "i",
            br#"{"x":[1]}"#,
            Some("application/json; charset=utf-8"),
        )
        .unwrap();
        assert_eq!(j["body"], json!({"x": [1]}));
        let t = event_data("i", b"hello", Some("text/plain")).unwrap();
        assert_eq!(t["body_text"], "hello");
        assert_eq!(
            event_data("i", b"not json", None).unwrap()["content_type"],
            "text/plain"
        );
        assert!(event_data("i", b"not json", Some("application/json")).is_none());
        assert!(event_data("i", &[0xff, 0xfe], Some("text/plain")).is_none());
    }
}

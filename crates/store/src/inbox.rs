//! The durable event inbox and the trigger connections it serves.
//!
//! The **inbox** is append-only: each event belongs to a stream
//! (`trigger:<connection_id>` for a connection's events), gets a sequence
//! number that grows within its stream, and carries a dedupe key (the
//! webhook id, the feed item id; the event id when none is given): an event
//! whose key its stream already holds is a duplicate and is not stored
//! again. Readers keep their own cursor (an automation keeps it in its
//! trigger state) and read the events after it.
//!
//! A **connection** is one user's instance of an event source (this webhook
//! endpoint, this feed): its config, its status, its sealed secret (never
//! stored in clear: see the triggers feature's connections), and the feeder's
//! bookkeeping.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One event of the inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InboxEvent {
    /// Its position: grows within its stream.
    pub seq: u64,
    /// The stream it belongs to (`trigger:<connection_id>`).
    pub stream: String,
    /// Its id, unique within its stream (`<stream>:<id>`).
    pub event_id: String,
    /// What makes it unique within its stream.
    pub dedupe_key: String,
    /// When it was appended, RFC 3339 UTC.
    pub appended_at: String,
    /// The event (a CloudEvents 1.0 object for a connection's events).
    pub payload: Value,
}

impl InboxEvent {
    /// The record as a trigger source receives it: `{seq, event_id, stream,
    /// appended_at, payload}`.
    pub fn to_source_record(&self) -> Value {
        serde_json::json!({
            "seq": self.seq,
            "event_id": self.event_id,
            "stream": self.stream,
            "appended_at": self.appended_at,
            "payload": self.payload,
        })
    }
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EventAppend {
    /// The event's sequence number (the stored one's, for a duplicate).
    pub seq: u64,
    /// The stream already held the dedupe key: nothing was stored.
    pub duplicate: bool,
}

/// One trigger connection as stored. It never holds a secret in clear:
/// `sealed_secret` is the secret sealed with the store's key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectionRecord {
    /// `tc_` and 32 hex digits.
    pub connection_id: String,
    /// The source it is an instance of.
    pub source_id: String,
    /// The source's version.
    pub source_version: u32,
    /// A human label.
    pub label: String,
    /// `active` or `disabled`.
    pub status: String,
    /// The connection's config (no secret in it).
    pub config: Value,
    /// The secret, sealed (`v1.<base64 nonce>.<base64 ciphertext>`), if it
    /// has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_secret: Option<String>,
    /// When it was created.
    pub created_at: String,
    /// When it last changed.
    pub updated_at: String,
    /// When its last event was appended.
    #[serde(default)]
    pub last_event_at: Option<String>,
    /// The last refused call or failed poll `{code, at, cause, fix}`.
    #[serde(default)]
    pub last_error: Option<Value>,
    /// The feeder's own state (a feed's validators, next poll, seen ids).
    #[serde(default)]
    pub feeder_state: Value,
}

impl ConnectionRecord {
    /// The source it is an instance of, `id@version`.
    pub fn source(&self) -> String {
        format!("{}@{}", self.source_id, self.source_version)
    }

    /// The connection's inbox stream: `trigger:<connection_id>`.
    pub fn stream(&self) -> String {
        connection_stream(&self.connection_id)
    }
}

/// The inbox stream of connection `id`: `trigger:<id>`.
pub fn connection_stream(id: &str) -> String {
    format!("trigger:{id}")
}

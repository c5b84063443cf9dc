//! Trigger connections: one user's instance of an event source (this
//! webhook endpoint and its signing secret, this feed), registered once and
//! bound by any number of automations (`trigger.config.connection_id`).
//!
//! Each connection has one stream in the store's event inbox,
//! `trigger:<connection_id>`: feeders (the webhook endpoint of `stepwell
//! serve`, the feed poller of the driver, `stepwell connections send`)
//! append to it, and the automations bound to the connection read it after
//! their cursor (the automations' controller hands the records to the
//! source). After an append the idle automations bound to the connection
//! are woken ([`wake_consumers`]); a wake missed in a race is caught by the
//! driver's periodic sweep ([`feed_once`]).
//!
//! Secrets (a webhook's signing secret) are sealed with ChaCha20-Poly1305
//! under a key derived from a key file beside the database
//! (`connections.key`, 0600, created on first use), bound to the
//! connection's id: the store holds only the sealed text, and no response,
//! ledger or log holds the secret, which is shown once, when it is created.

use crate::triggers::TriggersExt;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use super::SourceKind;
use crate::AutomationError;
use stepwell_automation_core::time::format_timestamp as format_time;
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::store::{ConnectionRecord, InboxEvent, Store, StoreError};
use stepwell_runtime::Runtime;

/// The key file's name beside the database.
pub const KEY_FILE: &str = "connections.key";
/// `webhook.received@1`.
pub const WEBHOOK_SOURCE: &str = "webhook.received@1";
/// `feed.item@1`.
pub const FEED_SOURCE: &str = "feed.item@1";

/// Where a runtime's sealing key comes from.
#[derive(Clone)]
pub enum SealingKey {
    /// A key file (created 0600 with 32 random bytes when missing).
    File(PathBuf),
    /// A key held in memory (tests, the memory store).
    Memory([u8; 32]),
}

impl std::fmt::Debug for SealingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SealingKey::File(p) => f.debug_tuple("File").field(p).finish(),
            SealingKey::Memory(_) => f.write_str("Memory(..)"),
        }
    }
}

impl SealingKey {
    /// A random key held in memory.
    pub fn random() -> Self {
        SealingKey::Memory(rand::random())
    }

    /// The cipher; `create`: make the key file when it is missing (only
    /// to seal: opening never creates a key, which could not open what
    /// another key sealed).
    fn cipher(&self, create: bool) -> Result<ChaCha20Poly1305> {
        let key: [u8; 32] = match self {
            SealingKey::Memory(k) => *k,
            SealingKey::File(path) => {
                if !create && !path.exists() {
                    return Err(sealing(format!(
                        "the connections key file {} is missing: restore it from the backup of the database (or rotate every webhook connection's secret)",
                        path.display()
                    )));
                }
                let text = stepwell_runtime::core::config::load_or_create_secret_file(path)
                    .map_err(|e| sealing(format!("the connections key file: {e}")))?;
                Sha256::digest(format!("stepwell connections key\n{text}").as_bytes()).into()
            }
        };
        Ok(ChaCha20Poly1305::new(&key.into()))
    }

    /// `secret` sealed for connection `id`: `v1.<base64 nonce>.<base64
    /// ciphertext>`.
    pub fn seal(&self, id: &str, secret: &str) -> Result<String> {
        let nonce: [u8; 12] = rand::random();
        let sealed = self
            .cipher(true)?
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: id.as_bytes(),
                },
            )
            .map_err(|_| sealing("the secret could not be sealed"))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        Ok(format!("v1.{}.{}", b64.encode(nonce), b64.encode(sealed)))
    }

    /// The secret `sealed` for connection `id`.
    pub fn open(&self, id: &str, sealed: &str) -> Result<String> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let bad = || {
            sealing(format!("the sealed secret of connection {id} cannot be opened with this key (another key file, or altered)"))
        };
        let mut parts = sealed.split('.');
        let (Some("v1"), Some(nonce), Some(text), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let nonce = b64.decode(nonce).map_err(|_| bad())?;
        let text = b64.decode(text).map_err(|_| bad())?;
        if nonce.len() != 12 {
            return Err(bad());
        }
        let plain = self
            .cipher(false)?
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &text,
                    aad: id.as_bytes(),
                },
            )
            .map_err(|_| bad())?;
        String::from_utf8(plain).map_err(|_| bad())
    }
}

fn sealing(message: impl Into<String>) -> Error {
    Error::from(AutomationError::new(
        "connection_secret_unavailable",
        None,
        message,
    ))
}

/// A connection error with the reference's reason codes
/// (`connection_not_found`, `connection_required`,
/// `connection_source_mismatch`, `connection_disabled`,
/// `invalid_connection`).
pub fn connection_error(code: &str, field: Option<&str>, message: impl Into<String>) -> Error {
    Error::from(AutomationError::new(code, field, message))
}

fn not_found(id: &str) -> Error {
    connection_error(
        "connection_not_found",
        Some("connection_id"),
        format!("no trigger connection {id:?}"),
    )
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    connection_error("invalid_connection", Some(field), message)
}

/// `text`, or `sha256:` and its digest when it is over 200 bytes (an
/// identity or a subject a sender chose cannot make a record grow without
/// bound).
pub(crate) fn capped(text: &str) -> String {
    if text.len() <= 200 {
        text.to_string()
    } else {
        format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
    }
}

/// A new connection id: `tc_` and 32 hex digits.
pub fn new_connection_id() -> String {
    format!("tc_{}", uuid::Uuid::new_v4().simple())
}

/// A Standard Webhooks secret: `whsec_` and the base64 of 24 random bytes.
pub fn new_webhook_secret() -> String {
    let bytes: [u8; 24] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The connection as every reader sees it: never its secret; `path` (the
/// endpoint of `stepwell serve`) for a webhook, `stream`, and whether a
/// secret is set.
pub fn connection_view(c: &ConnectionRecord) -> Value {
    let mut v = json!({
        "connection_id": c.connection_id,
        "source_id": c.source_id,
        "source_version": c.source_version,
        "source": c.source(),
        "label": c.label,
        "status": c.status,
        "config": c.config,
        "stream": c.stream(),
        "has_secret": c.sealed_secret.is_some(),
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "last_event_at": c.last_event_at,
        "last_error": c.last_error,
    });
    if c.source() == WEBHOOK_SOURCE {
        v["path"] = json!(webhook_path(&c.connection_id));
    }
    v
}

/// `/v1/hooks/<connection_id>`.
pub fn webhook_path(id: &str) -> String {
    format!("/v1/hooks/{id}")
}

/// A connection just created, or its secret just rotated: the only
/// answers that carry the secret.
#[derive(Debug, Clone, Serialize)]
pub struct Created {
    /// The connection's id.
    pub connection_id: String,
    /// The signing secret, shown this once (`None` for a source without
    /// one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// The webhook endpoint's path (a webhook connection).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The connection as [`connection_view`] shows it.
    pub connection: Value,
}

fn object_config(config: &Value) -> Result<&Map<String, Value>> {
    config
        .as_object()
        .ok_or_else(|| invalid("config", "must be a JSON object"))
}

fn reject_unknown(config: &Map<String, Value>, allowed: &[&str]) -> Result<()> {
    let mut keys: Vec<&String> = config.keys().collect();
    keys.sort();
    match keys.into_iter().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(invalid(
            &format!("config.{k}"),
            format!("unknown field (this source takes {})", allowed.join(", ")),
        )),
        None => Ok(()),
    }
}

fn int_in(config: &Map<String, Value>, key: &str, default: u64, lo: u64, hi: u64) -> Result<u64> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_u64().filter(|n| (lo..=hi).contains(n)).ok_or_else(|| {
            invalid(
                &format!("config.{key}"),
                format!("must be an integer {lo}..{hi}"),
            )
        }),
    }
}

/// A webhook connection's config: `{subject_path?, tolerance_s? = 300
/// (60..3600), secret?}` (the secret is split off: it is sealed, never
/// kept in the config).
fn webhook_config(config: &Map<String, Value>) -> Result<(Value, Option<String>)> {
    reject_unknown(config, &["secret", "subject_path", "tolerance_s"])?;
    let mut out = Map::new();
    if let Some(p) = config.get("subject_path").filter(|p| !p.is_null()) {
        let ok = p.as_str().map(str::trim).filter(|p| {
            !p.is_empty() && p.len() <= 200 && p.split('.').all(|part| !part.is_empty())
        });
        let Some(p) = ok else {
            return Err(invalid(
                "config.subject_path",
                "must be a dotted path like data.id",
            ));
        };
        out.insert("subject_path".into(), json!(p));
    }
    out.insert(
        "tolerance_s".into(),
        json!(int_in(config, "tolerance_s", 300, 60, 3600)?),
    );
    let secret = match config.get("secret") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if super::webhook::secret_key(s).is_ok() => Some(s.clone()),
        Some(_) => {
            return Err(invalid(
                "config.secret",
                "must be whsec_<base64 of at least 16 bytes>",
            ))
        }
    };
    Ok((Value::Object(out), secret))
}

/// A feed connection's config: `{url, every? = "15m" (at least 60 s),
/// max_items? = 50 (1..200), initial_items? = "skip" | "deliver"}`.
fn feed_config(config: &Map<String, Value>) -> Result<Value> {
    reject_unknown(config, &["every", "initial_items", "max_items", "url"])?;
    let url = config
        .get("url")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|u| {
            (u.starts_with("http://") || u.starts_with("https://"))
                && u.len() > u.find("://").unwrap_or(0) + 3
                && !u.chars().any(char::is_whitespace)
        })
        .ok_or_else(|| invalid("config.url", "must be an http(s) address of a feed"))?;
    let every = match config.get("every") {
        None | Some(Value::Null) => "15m".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(invalid("config.every", "must be a duration like 15m")),
    };
    match super::feed::parse_every(&every) {
        Some(secs) if secs >= 60 => {}
        Some(_) => return Err(invalid("config.every", "must be at least 60s")),
        None => {
            return Err(invalid(
                "config.every",
                "must match ^[1-9][0-9]*[smhd]$ and be at most 366d",
            ))
        }
    }
    let initial = match config.get("initial_items") {
        None | Some(Value::Null) => "skip",
        Some(Value::String(s)) if s == "skip" || s == "deliver" => s.as_str(),
        Some(_) => {
            return Err(invalid(
                "config.initial_items",
                "must be one of [\"skip\", \"deliver\"]",
            ))
        }
    };
    Ok(json!({
        "url": url,
        "every": every,
        "max_items": int_in(config, "max_items", 50, 1, 200)?,
        "initial_items": initial,
    }))
}

fn check_label(label: Option<&str>, default: &str) -> Result<String> {
    let label = label.map(str::trim).unwrap_or(default).to_string();
    if label.chars().count() > 120 || label.chars().any(char::is_control) {
        return Err(invalid(
            "label",
            "must be at most 120 characters without control characters",
        ));
    }
    Ok(label)
}

/// Event connections of a runtime (the triggers feature): create, list, disable, rotate, send to and read them.
pub trait Connections {
    /// Creates a connection of event source `source` (`id@version`) with
    /// `config`. A webhook connection gets a signing secret (`config.secret`
    /// when given, else a new one), sealed; the answer is the only one that
    /// shows it.
    fn create_connection(
        &self,
        source: &str,
        label: Option<&str>,
        config: &Value,
    ) -> Result<Created>;

    /// Every connection, oldest first, as [`connection_view`] shows it.
    fn list_connections(&self) -> Result<Vec<Value>>;

    /// The stored connection `id` (`connection_not_found` when unknown).
    fn connection(&self, id: &str) -> Result<ConnectionRecord>;

    /// Sets connection `id`'s status: `active` or `disabled` (a disabled
    /// connection accepts no webhook call and is not polled; automations
    /// cannot be bound to it).
    fn set_connection_status(&self, id: &str, status: &str) -> Result<Value>;

    /// A new signing secret for webhook connection `id` (the old one stops
    /// working at once); the answer is the only one that shows it.
    fn rotate_connection_secret(&self, id: &str) -> Result<Created>;

    /// Appends `data` to connection `id`'s stream as a test or plugin event
    /// (subject `subject`, default `test`): what `stepwell connections
    /// send` and `POST /v1/connections/{id}/events` do. Bound automations
    /// admit it like any other event.
    fn send_connection_event(&self, id: &str, data: Value, subject: Option<&str>) -> Result<Value>;

    /// The events of connection `id`'s stream after `after`, at most
    /// `limit`.
    fn connection_events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<InboxEvent>>;

    /// Wakes the idle automations bound to connection `id` (every
    /// connection when `None`) that have events to admit: each controller
    /// parked on its wake wait whose source finds pending records is
    /// resumed (the driver then runs it). Returns the woken automations.
    fn wake_consumers(&self, connection_id: Option<&str>) -> Result<Vec<String>>;
}

impl Connections for Runtime {
    fn create_connection(
        &self,
        source: &str,
        label: Option<&str>,
        config: &Value,
    ) -> Result<Created> {
        let registry = self.triggers()?;
        if registry.kind(source) != Some(SourceKind::Event) {
            let known = registry.get(source).is_ok();
            return Err(connection_error(
                if known {
                    "invalid_connection"
                } else {
                    "unknown_trigger_source"
                },
                Some("source"),
                if known {
                    format!("{source} is not an event source: only event sources take connections")
                } else {
                    format!("no available trigger source {source}")
                },
            ));
        }
        let (source_id, version) = source.split_once('@').unwrap_or((source, "1"));
        let map = object_config(config)?;
        let (config, secret) = match source {
            WEBHOOK_SOURCE => {
                let (c, s) = webhook_config(map)?;
                (c, Some(s.unwrap_or_else(new_webhook_secret)))
            }
            FEED_SOURCE => (feed_config(map)?, None),
            _ => (config.clone(), None),
        };
        let id = new_connection_id();
        let now = format_time(self.now());
        let record = ConnectionRecord {
            connection_id: id.clone(),
            source_id: source_id.to_string(),
            source_version: version.parse().unwrap_or(1),
            label: check_label(label, source)?,
            status: "active".into(),
            config,
            sealed_secret: match &secret {
                Some(s) => Some(self.sealing_key()?.seal(&id, s)?),
                None => None,
            },
            created_at: now.clone(),
            updated_at: now,
            last_event_at: None,
            last_error: None,
            feeder_state: Value::Null,
        };
        self.store().create_connection(&record)?;
        Ok(created(&record, secret))
    }

    fn list_connections(&self) -> Result<Vec<Value>> {
        Ok(self
            .store()
            .list_connections()?
            .iter()
            .map(connection_view)
            .collect())
    }

    fn connection(&self, id: &str) -> Result<ConnectionRecord> {
        let found = if super::connection_id_ok(id) {
            self.store().get_connection(id)?
        } else {
            None
        };
        found.ok_or_else(|| not_found(id))
    }

    fn set_connection_status(&self, id: &str, status: &str) -> Result<Value> {
        if !matches!(status, "active" | "disabled") {
            return Err(invalid("status", "must be active or disabled"));
        }
        let now = format_time(self.now());
        let updated = self.update_connection(id, &mut |c| {
            c.status = status.to_string();
            c.updated_at = now.clone();
            Ok(())
        })?;
        Ok(connection_view(&updated))
    }

    fn rotate_connection_secret(&self, id: &str) -> Result<Created> {
        let c = self.connection(id)?;
        if c.sealed_secret.is_none() {
            return Err(invalid(
                "connection_id",
                format!("connection {id} ({}) has no secret", c.source()),
            ));
        }
        let secret = new_webhook_secret();
        let sealed = self.sealing_key()?.seal(id, &secret)?;
        let now = format_time(self.now());
        let updated = self.update_connection(id, &mut |c| {
            c.sealed_secret = Some(sealed.clone());
            c.updated_at = now.clone();
            Ok(())
        })?;
        Ok(created(&updated, Some(secret)))
    }

    fn send_connection_event(&self, id: &str, data: Value, subject: Option<&str>) -> Result<Value> {
        let c = self.connection(id)?;
        if c.status != "active" {
            return Err(connection_error(
                "connection_disabled",
                Some("connection_id"),
                format!("connection {id} is disabled"),
            ));
        }
        let eid = format!("test:{}", uuid::Uuid::new_v4().simple());
        let (appended, event_id) = self.append_connection_event(
            &c,
            ConnectionEvent {
                id: eid.clone(),
                data,
                time: None,
                subject: Some(subject.unwrap_or("test").to_string()),
                dedupe_key: eid,
                trusted: false,
            },
        )?;
        Ok(json!({"status": "appended", "event_id": event_id, "seq": appended.seq}))
    }

    fn connection_events(&self, id: &str, after: u64, limit: usize) -> Result<Vec<InboxEvent>> {
        let c = self.connection(id)?;
        Ok(self.store().events_after(&c.stream(), after, limit)?)
    }

    fn wake_consumers(&self, connection_id: Option<&str>) -> Result<Vec<String>> {
        let registry = self.triggers()?;
        // Read again as it is now: still idle at its wake wait (neither
        // paused nor archived), bound to this connection, on an event source.
        let wanted = |run: &stepwell_runtime::RunState| {
            let bound =
                crate::wakes_on(run).is_some_and(|c| connection_id.is_none_or(|id| c == id));
            let source = super::trigger_source(&run.vars["_meta"]["automation"]["trigger"]);
            bound
                && run.workflow_id == crate::CONTROLLER_WORKFLOW_ID
                && registry.kind(&source) == Some(SourceKind::Event)
        };
        let mut woken = Vec::new();
        // Only the controllers bound to the connection are read (an index
        // on SQLite), not every waiting run.
        for id in self.store().list_consumers(connection_id)? {
            let run = match self.get_state(&id) {
                Ok(run) => run,
                Err(Error::RunNotFound { .. }) => continue,
                // Left to the driver, which sets it aside.
                Err(e) if e.reason_code() == "store_corrupt" => continue,
                Err(e) => return Err(e),
            };
            if !wanted(&run) {
                continue;
            }
            let wake = stepwell_automation_core::ids::wake_wait_key(&run.run_id);
            let definition = &run.vars["_meta"]["automation"];
            let state = &run.vars["_runtime"]["automation"];
            let pending = crate::source_events(self.store(), &registry, definition, state)?;
            if pending.is_empty() {
                continue;
            }
            match self.resume_at(
                &run.run_id,
                Some(&wake),
                json!({"wake": "connection_event"}),
                None,
                0,
                false,
            ) {
                Ok(_) => woken.push(run.run_id.clone()),
                Err(Error::StaleResume { .. } | Error::Conflict { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(woken)
    }
}

/// What the rest of this feature reaches of a runtime beside [`Connections`].
pub(crate) trait ConnectionsInner {
    fn sealing_key(&self) -> Result<SealingKey>;

    /// The secret of connection `c`, opened.
    fn connection_secret(&self, c: &ConnectionRecord) -> Result<Option<String>>;

    /// Changes connection `id` atomically (`connection_not_found` when
    /// unknown).
    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut ConnectionRecord) -> std::result::Result<(), StoreError>,
    ) -> Result<ConnectionRecord>;

    /// Appends one event to connection `c`'s stream (CloudEvents 1.0
    /// attributes, `data` as given), deduplicated on `dedupe_key`, records
    /// `last_event_at`, and wakes the automations bound to it. Returns the
    /// append and the event's id.
    fn append_connection_event(
        &self,
        c: &ConnectionRecord,
        event: ConnectionEvent,
    ) -> Result<(stepwell_runtime::store::EventAppend, String)>;

    /// Whether the periodic sweep is due (and, if so, that it runs now).
    fn sweep_due(&self, now: DateTime<Utc>) -> bool;
}

impl ConnectionsInner for Runtime {
    fn sealing_key(&self) -> Result<SealingKey> {
        super::trigger_state(self)?.sealing.clone().ok_or_else(|| {
            sealing(
                "this runtime has no sealing key for connection secrets (Triggers::sealing_key; host::open_runtime gives a PostgreSQL store the key file in HostOptions::state_home, and none without it)",
            )
        })
    }

    fn connection_secret(&self, c: &ConnectionRecord) -> Result<Option<String>> {
        match &c.sealed_secret {
            None => Ok(None),
            Some(sealed) => self.sealing_key()?.open(&c.connection_id, sealed).map(Some),
        }
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut ConnectionRecord) -> std::result::Result<(), StoreError>,
    ) -> Result<ConnectionRecord> {
        if !super::connection_id_ok(id) {
            return Err(not_found(id));
        }
        self.store()
            .update_connection(id, change)?
            .ok_or_else(|| not_found(id))
    }

    fn append_connection_event(
        &self,
        c: &ConnectionRecord,
        event: ConnectionEvent,
    ) -> Result<(stepwell_runtime::store::EventAppend, String)> {
        let now = format_time(self.now());
        let stream = c.stream();
        let mut payload = json!({
            "kind": "trigger.connection_event",
            "specversion": "1.0",
            "id": event.id,
            "type": format!("abstract.{}.v{}", c.source_id, c.source_version),
            "source": format!("abstract://triggers/connections/{}", c.connection_id),
            "time": event.time.unwrap_or_else(|| now.clone()),
            "datacontenttype": "application/json",
            "connectionid": c.connection_id,
            "abstracttrust": if event.trusted { "trusted" } else { "untrusted" },
            "data": event.data,
        });
        if let Some(s) = &event.subject {
            payload["subject"] = json!(capped(s));
        }
        let dedupe_key = capped(&event.dedupe_key);
        payload["dedupekey"] = json!(dedupe_key);
        let event_id = format!("{stream}:{}", event.id);
        let appended = self.store().append_event(&InboxEvent {
            seq: 0,
            stream,
            event_id: event_id.clone(),
            dedupe_key,
            appended_at: now.clone(),
            payload,
        })?;
        if !appended.duplicate {
            // Bookkeeping only: the event is stored whatever happens here.
            let _ = self.store().update_connection(&c.connection_id, &mut |c| {
                c.last_event_at = Some(now.clone());
                c.last_error = None;
                Ok(())
            });
            // Best effort: the event is stored; a wake that fails is made
            // by the driver's sweep.
            if let Err(e) = self.wake_consumers(Some(&c.connection_id)) {
                tracing::warn!(connection_id = %c.connection_id, error = %e, "waking the bound automations");
            }
        }
        Ok((appended, event_id))
    }

    fn sweep_due(&self, now: DateTime<Utc>) -> bool {
        let Ok(state) = super::trigger_state(self) else {
            return false;
        };
        let mut last = state.last_sweep.lock();
        if last.is_some_and(|t| (now - t).num_seconds() < SWEEP_INTERVAL_SECS) {
            return false;
        }
        *last = Some(now);
        true
    }
}

fn created(c: &ConnectionRecord, secret: Option<String>) -> Created {
    let view = connection_view(c);
    Created {
        connection_id: c.connection_id.clone(),
        secret,
        path: view.get("path").and_then(Value::as_str).map(str::to_string),
        connection: view,
    }
}

/// One event for a connection's stream.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionEvent {
    /// The event's own id (the stored id is `<stream>:<id>`).
    pub id: String,
    /// Its `data`.
    pub data: Value,
    /// Its CloudEvents `time` (default: now).
    pub time: Option<String>,
    /// Its `subject`.
    pub subject: Option<String>,
    /// What makes it unique in the stream.
    pub dedupe_key: String,
    /// Written by the host's operator, not by others.
    pub trusted: bool,
}

/// Checks the connection a binding names, at automation create and revise
/// time: `connection_required` (no `config.connection_id`),
/// `connection_not_found`, `connection_source_mismatch`,
/// `connection_disabled`, each with field `trigger.config.connection_id`.
/// A binding of a source that is not an event source takes none.
pub fn check_binding(
    store: &dyn Store,
    triggers: &super::TriggerRegistry,
    trigger: &Value,
) -> std::result::Result<(), AutomationError> {
    if triggers.kind(&super::trigger_source(trigger)) != Some(SourceKind::Event) {
        return Ok(());
    }
    let field = Some("trigger.config.connection_id");
    let source = super::trigger_source(trigger);
    let Some(id) = trigger["config"]["connection_id"]
        .as_str()
        .filter(|s| !s.is_empty())
    else {
        return Err(AutomationError::new(
            "connection_required",
            field,
            format!("trigger {source} needs a connection: set config.connection_id"),
        ));
    };
    let found = store
        .get_connection(id)
        .map_err(|e| AutomationError::new(e.code, field, e.message))?;
    let Some(c) = found else {
        return Err(AutomationError::new(
            "connection_not_found",
            field,
            format!("no trigger connection {id:?}"),
        ));
    };
    let theirs = c.source();
    if theirs != source {
        return Err(AutomationError::new(
            "connection_source_mismatch",
            field,
            format!("connection {id:?} is a {theirs} connection, not {source}"),
        ));
    }
    if c.status == "disabled" {
        return Err(AutomationError::new(
            "connection_disabled",
            field,
            format!("connection {id:?} is disabled"),
        ));
    }
    Ok(())
}

/// The key file of a store's connections: beside the database.
pub fn key_file_beside(path: &Path) -> PathBuf {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(KEY_FILE)
}

/// What one [`feed_once`] pass did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FeedReport {
    /// Feed connections polled, with the number of items appended.
    pub polled: Vec<(String, usize)>,
    /// Feed connections whose poll failed, with why.
    pub failed: Vec<(String, String)>,
    /// Automations woken by the sweep.
    pub woken: Vec<String>,
}

/// How often the driver's sweep looks for idle automations with events to
/// admit (a wake lost in a race is caught then).
pub const SWEEP_INTERVAL_SECS: i64 = 30;

/// The feed connections due for a poll at `now` (none when the store
/// keeps no connections).
fn due_feeds(rt: &Runtime) -> Result<Vec<String>> {
    Ok(feeds(rt)?.0)
}

/// The active feed connections due for a poll, and whether there is any
/// active feed connection at all.
fn feeds(rt: &Runtime) -> Result<(Vec<String>, bool)> {
    let connections = match rt.store().list_connections() {
        Ok(c) => c,
        Err(e) if e.code == "store_unsupported" => return Ok((Vec::new(), false)),
        Err(e) => return Err(e.into()),
    };
    let now = rt.now();
    let active: Vec<_> = connections
        .into_iter()
        .filter(|c| c.status == "active" && c.source() == FEED_SOURCE)
        .collect();
    let any = !active.is_empty();
    let due = active
        .into_iter()
        .filter(|c| super::feed::due(c, now))
        .map(|c| c.connection_id)
        .collect();
    Ok((due, any))
}

/// How often a poller with no active feed connection looks for a new one.
pub const NO_FEEDS_LOOK_SECS: u32 = 5;

/// One pass of the feeders, returning when it is done: polls the due feed
/// connections, [`POLLS_AT_ONCE`] at a time (a slow feed holds only its
/// own poll), then [`sweep_once`]. What `stepwell drive --until-idle` and
/// `--once` do; the long-running loops poll in threads of their own
/// instead ([`run_feed_poller`]), so that a slow feed never holds the
/// driver.
pub fn feed_once(rt: &Runtime) -> Result<FeedReport> {
    let mut report = FeedReport::default();
    let due = due_feeds(rt)?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let outcomes: Mutex<Vec<(usize, Result<Option<usize>>)>> = Mutex::default();
    std::thread::scope(|scope| {
        for _ in 0..due.len().min(POLLS_AT_ONCE) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(id) = due.get(i) else {
                    return;
                };
                let outcome = super::feed::poll(rt, id, false);
                outcomes.lock().push((i, outcome));
            });
        }
    });
    let mut outcomes = outcomes.into_inner();
    outcomes.sort_by_key(|(i, _)| *i);
    for (i, outcome) in outcomes {
        let id = due[i].clone();
        match outcome {
            Ok(Some(n)) => report.polled.push((id, n)),
            Ok(None) => {}
            Err(e) => report.failed.push((id, e.to_string())),
        }
    }
    report.woken = sweep_once(rt)?;
    Ok(report)
}

/// Every [`SWEEP_INTERVAL_SECS`] (the first call at once): wakes the idle
/// automations that have events to admit (a wake lost in a race). Returns
/// the woken automations.
pub fn sweep_once(rt: &Runtime) -> Result<Vec<String>> {
    if !rt.sweep_due(rt.now()) {
        return Ok(Vec::new());
    }
    match rt.store().list_connections() {
        Ok(c) if c.is_empty() => Ok(Vec::new()),
        Err(e) if e.code == "store_unsupported" => Ok(Vec::new()),
        Err(e) => Err(e.into()),
        Ok(_) => rt.wake_consumers(None),
    }
}

/// How many feeds one poller fetches at once (each fetch holds a thread
/// blocked on its socket, at most [`super::feed::FETCH_TIMEOUT`]).
pub const POLLS_AT_ONCE: usize = 16;

/// Polls the due feed connections until `stop` is set, looking every
/// second (every [`NO_FEEDS_LOOK_SECS`] while there is no active feed
/// connection), each poll in a thread of its own (at most [`POLLS_AT_ONCE`] at
/// once; a poll is claimed in the store first, so pollers of several
/// processes never fetch one feed together). Failures are logged and
/// recorded on the connection.
pub fn run_feed_poller(rt: Runtime, stop: Arc<AtomicBool>) {
    let busy: Arc<Mutex<HashSet<String>>> = Arc::default();
    while !stop.load(Ordering::SeqCst) {
        // Every second while there are feeds; with none, a look every few
        // seconds keeps an idle host idle.
        let mut tenths = 10;
        match feeds(&rt) {
            Ok((ids, any)) => {
                if !any {
                    tenths = 10 * NO_FEEDS_LOOK_SECS;
                }
                for id in ids {
                    let mut held = busy.lock();
                    if held.len() >= POLLS_AT_ONCE || !held.insert(id.clone()) {
                        continue;
                    }
                    drop(held);
                    let (rt, held, polled) = (rt.clone(), busy.clone(), id.clone());
                    let spawned = std::thread::Builder::new()
                        .name("stepwell-feed".into())
                        .spawn(move || {
                            // The slot is given back however the poll ends
                            // (a panic included).
                            struct Slot(Arc<Mutex<HashSet<String>>>, String);
                            impl Drop for Slot {
                                fn drop(&mut self) {
                                    self.0.lock().remove(&self.1);
                                }
                            }
                            let _slot = Slot(held, id.clone());
                            if let Err(e) = super::feed::poll(&rt, &id, false) {
                                tracing::warn!(connection_id = %id, error = %e, "feed poll");
                            }
                        });
                    if spawned.is_err() {
                        busy.lock().remove(&polled);
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "listing the feed connections"),
        }
        for _ in 0..tenths {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

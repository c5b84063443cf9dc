//! Where runs and ledgers live. One [`Store`] trait, several backends:
//! [`MemoryStore`] (tests, embedding), [`JsonFileStore`] (a folder of JSON
//! files) and [`SqliteStore`] (the embedded default: one file, WAL).
//!
//! The trait is shaped for more than one host process: every write is either
//! a whole-run save, an atomic create-if-absent, or an append, and
//! [`Store::commit`] gives a backend one place to make a step's ledger records
//! and its run save atomic. A backend shared by several hosts (PostgreSQL with
//! per-run leases) implements the same calls.

pub mod artifacts;
pub mod commands;
mod json_files;
mod memory;
pub mod snapshots;
mod sqlite;

use std::fmt;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::core::model::{RunState, RunStatus, StepRecord, WaitReason};

pub use artifacts::{ArtifactMeta, ArtifactStore, FileArtifactStore, MemoryArtifactStore};
pub use commands::{
    AppendResult, CommandRecord, CommandStore, JsonlCommandStore, MemoryCommandStore,
};
pub use json_files::JsonFileStore;
pub use memory::MemoryStore;
pub use snapshots::{
    JsonSnapshotStore, MemorySnapshotStore, Snapshot, SnapshotQuery, SnapshotStore,
};
pub use sqlite::SqliteStore;

/// The store failed: an I/O or database error, corrupt data, or a schema this
/// version cannot read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    /// `store_io`, `store_corrupt` or `store_schema`.
    pub code: &'static str,
    /// What happened, naming the file (and line or row) where known.
    pub message: String,
}

impl StoreError {
    /// An I/O or database failure.
    pub fn io(message: impl Into<String>) -> Self {
        StoreError {
            code: "store_io",
            message: message.into(),
        }
    }

    /// Stored data that cannot be read back.
    pub fn corrupt(message: impl Into<String>) -> Self {
        StoreError {
            code: "store_corrupt",
            message: message.into(),
        }
    }

    /// The reason code.
    pub fn reason_code(&self) -> &'static str {
        self.code
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for StoreError {}

/// Filters for [`Store::list_runs`]. Every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only waiting runs with this wait reason.
    pub wait_reason: Option<WaitReason>,
    /// Only waiting runs with this wait key.
    pub wait_key: Option<String>,
    /// Only runs of this workflow.
    pub workflow_id: Option<String>,
    /// Only children of this run.
    pub parent_run_id: Option<String>,
    /// At most this many runs.
    pub limit: Option<usize>,
}

impl RunQuery {
    /// Whether `run` passes every filter (the limit aside).
    pub fn matches(&self, run: &RunState) -> bool {
        self.status.is_none_or(|s| run.status == s)
            && self
                .wait_reason
                .is_none_or(|r| run.waiting.as_ref().is_some_and(|w| w.reason == r))
            && self
                .wait_key
                .as_deref()
                .is_none_or(|k| run.waiting.as_ref().is_some_and(|w| w.wait_key == k))
            && self
                .workflow_id
                .as_deref()
                .is_none_or(|w| run.workflow_id == w)
            && self
                .parent_run_id
                .as_deref()
                .is_none_or(|p| run.parent_run_id.as_deref() == Some(p))
    }
}

/// Filters of [`Store::list_run_index`]. Every set field must match; the
/// three attribution filters match any of their values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunIndexQuery {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this workflow.
    pub workflow_id: Option<String>,
    /// Only runs of this session.
    pub session_id: Option<String>,
    /// Only turn roots: runs without a parent, except automation
    /// controllers, plus automation occurrences.
    pub root_only: bool,
    /// At most this many rows.
    pub limit: Option<usize>,
    /// Oldest first (default: newest first).
    pub oldest_first: bool,
    /// Only runs attributed to one of these automations.
    pub automation_id: Vec<String>,
    /// Only runs with one of these roles (`controller`, `occurrence`, ...).
    pub role: Vec<String>,
    /// Only runs with one of these session kinds.
    pub session_kind: Vec<String>,
}

/// A lightweight row of the run index: a run's identity, status and
/// attribution, without its vars.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunIndexRow {
    /// The run.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// Its status.
    pub status: RunStatus,
    /// Its parent, if it is a child run.
    pub parent_run_id: Option<String>,
    /// Its session.
    pub session_id: Option<String>,
    /// When it was created.
    pub created_at: String,
    /// When it was last saved.
    pub updated_at: String,
    /// `vars._meta.automation.automation_id`.
    pub automation_id: Option<String>,
    /// `vars._meta.automation.role`.
    pub role: Option<String>,
    /// `vars._meta.automation.occurrence_index`.
    pub occurrence_index: Option<u64>,
    /// `vars._meta.session_kind`.
    pub session_kind: Option<String>,
    /// The run's top-level `vars.workspace_root`, stripped (`None` when
    /// absent or empty).
    pub workspace_root: Option<String>,
}

impl RunIndexRow {
    /// The index row of `run`.
    pub fn of(run: &RunState) -> Self {
        let meta = run.vars.get("_meta");
        let auto = meta.and_then(|m| m.get("automation"));
        let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_string);
        RunIndexRow {
            run_id: run.run_id.clone(),
            workflow_id: run.workflow_id.clone(),
            status: run.status,
            parent_run_id: run.parent_run_id.clone(),
            session_id: run.session_id.clone(),
            created_at: run.created_at.clone(),
            updated_at: run.updated_at.clone(),
            automation_id: text(auto.and_then(|a| a.get("automation_id"))),
            role: text(auto.and_then(|a| a.get("role"))),
            occurrence_index: auto
                .and_then(|a| a.get("occurrence_index"))
                .and_then(|v| v.as_u64()),
            session_kind: text(meta.and_then(|m| m.get("session_kind"))),
            workspace_root: run
                .vars
                .get("workspace_root")
                .and_then(|v| v.as_str())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        }
    }

    /// Whether this run is a turn root (see [`RunIndexQuery::root_only`]).
    pub fn is_turn_root(&self) -> bool {
        match self.role.as_deref() {
            Some("controller") => false,
            Some("occurrence") => true,
            _ => self.parent_run_id.is_none(),
        }
    }
}

impl RunIndexQuery {
    /// Whether `row` passes every filter (the limit aside).
    pub fn matches(&self, row: &RunIndexRow) -> bool {
        let any = |wanted: &[String], value: &Option<String>| {
            wanted.is_empty() || value.as_ref().is_some_and(|v| wanted.contains(v))
        };
        self.status.is_none_or(|s| row.status == s)
            && self
                .workflow_id
                .as_ref()
                .is_none_or(|w| row.workflow_id == *w)
            && self
                .session_id
                .as_ref()
                .is_none_or(|s| row.session_id.as_ref() == Some(s))
            && (!self.root_only || row.is_turn_root())
            && any(&self.automation_id, &row.automation_id)
            && any(&self.role, &row.role)
            && any(&self.session_kind, &row.session_kind)
    }
}

/// Splits a comma-separated filter value (`"a,b"`) into its values.
pub fn filter_values(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// Runs, their ledgers, and the bundles their workflows come from.
pub trait Store: Send + Sync {
    /// The run with this id, if any.
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError>;

    /// Saves a run, replacing the stored copy. The commit point of every
    /// transition: a transition is true when this returns.
    fn save_run(&self, run: &RunState) -> Result<(), StoreError>;

    /// Creates `run` only if its id is free. Returns the stored run and
    /// whether this call created it; an existing run is returned untouched.
    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError>;

    /// The runs matching `query`, oldest first.
    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError>;

    /// Waiting runs whose time has come at `now`: `until` waits that are due,
    /// and event waits whose deadline has passed; the earliest due first.
    fn list_due_waits(&self, now: DateTime<Utc>) -> Result<Vec<RunState>, StoreError>;

    /// Appends records to their runs' ledgers, linking each into its run's
    /// hash chain ([`link`]): `prev_hash` and `record_hash` are set by the
    /// store, whatever the caller put there.
    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError>;

    /// A run's ledger, oldest first.
    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;

    /// The run's ledger records carrying `idempotency_key`, oldest first.
    fn find_records(
        &self,
        run_id: &str,
        idempotency_key: &str,
    ) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self
            .list_records(run_id)?
            .into_iter()
            .filter(|r| r.idempotency_key.as_deref() == Some(idempotency_key))
            .collect())
    }

    /// The run index: lightweight rows with attribution, filtered by
    /// `query`, newest first unless `oldest_first`. The default reads every
    /// run through [`Store::list_runs`]: the same answers on every backend.
    fn list_run_index(&self, query: &RunIndexQuery) -> Result<Vec<RunIndexRow>, StoreError> {
        let mut rows: Vec<RunIndexRow> = self
            .list_runs(&RunQuery {
                status: query.status,
                workflow_id: query.workflow_id.clone(),
                ..RunQuery::default()
            })?
            .iter()
            .map(RunIndexRow::of)
            .filter(|row| query.matches(row))
            .collect();
        if !query.oldest_first {
            rows.reverse();
        }
        rows.truncate(query.limit.unwrap_or(usize::MAX));
        Ok(rows)
    }

    /// Commits one transition: appends `records`, then saves `run`.
    ///
    /// The default does exactly that, in that order: a crash in between
    /// leaves the ledger ahead of the state, the recoverable direction. The
    /// replay that follows produces the same records again, so the default
    /// skips every record whose idempotency key and status are already in
    /// the run's ledger: effect records and terminal records land once. A
    /// backend that commits both atomically (SQLite, memory) can never be
    /// ahead and needs no such check.
    fn commit(&self, records: &[StepRecord], run: &RunState) -> Result<(), StoreError> {
        if !records.is_empty() {
            let fresh = without_replayed(self, records)?;
            self.append_records(&fresh)?;
        }
        self.save_run(run)
    }

    /// Remembers that `workflow_id` is defined by the bundle at `dir`, so
    /// another process can load it to resume the workflow's runs.
    fn put_bundle(&self, workflow_id: &str, dir: &std::path::Path) -> Result<(), StoreError>;

    /// The bundle directory that defines `workflow_id`, if one was recorded.
    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError>;
}

/// The hash of `record` in its run's chain: SHA-256 (hex) of its JSON with
/// `prev_hash` set to `prev` and `record_hash` empty.
pub fn chain_hash(prev: Option<&str>, record: &StepRecord) -> String {
    use sha2::{Digest, Sha256};
    let mut r = record.clone();
    r.prev_hash = prev.map(str::to_string);
    r.record_hash = None;
    let bytes = serde_json::to_vec(&r).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// Links `record` after `head` (the hash of the run's last record), moves
/// `head` to it, and returns the record's JSON as stored. Stores call this
/// as they append.
pub fn link(head: &mut Option<String>, record: &mut StepRecord) -> String {
    use sha2::{Digest, Sha256};
    record.prev_hash = head.clone();
    record.record_hash = None;
    let mut json = serde_json::to_string(&*record).unwrap_or_default();
    let hash = hex::encode(Sha256::digest(json.as_bytes()));
    // `record_hash` is the last field: the stored form is the hashed form
    // with it added, which saves serialising the record twice.
    if json.ends_with('}') {
        json.pop();
        json.push_str(&format!(",\"record_hash\":\"{hash}\"}}"));
    }
    record.record_hash = Some(hash.clone());
    *head = Some(hash);
    json
}

/// Where a ledger's hash chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainBreak {
    /// The 1-based position of the first bad record.
    pub index: usize,
    /// Its step id.
    pub step_id: String,
    /// `changed` (its content does not match its hash), `removed or reordered`
    /// (it does not follow the record before it), or `unchained` (it has no
    /// hash).
    pub problem: &'static str,
}

/// Checks a run's ledger, oldest first. Returns the hash of the last record
/// (the head), or the first record that was changed, removed or reordered.
/// Removing the newest records leaves a shorter valid chain: keep the head
/// somewhere else to detect that.
pub fn verify_chain(records: &[StepRecord]) -> Result<Option<String>, ChainBreak> {
    let mut head: Option<String> = None;
    for (i, r) in records.iter().enumerate() {
        let fail = |problem| ChainBreak {
            index: i + 1,
            step_id: r.step_id.clone(),
            problem,
        };
        let Some(hash) = &r.record_hash else {
            return Err(fail("unchained"));
        };
        if r.prev_hash != head {
            return Err(fail("removed or reordered"));
        }
        if chain_hash(r.prev_hash.as_deref(), r) != *hash {
            return Err(fail("changed"));
        }
        head = Some(hash.clone());
    }
    Ok(head)
}

/// `records` less those (keyed) whose run, idempotency key and status are
/// already in the store's ledger.
fn without_replayed<S: Store + ?Sized>(
    store: &S,
    records: &[StepRecord],
) -> Result<Vec<StepRecord>, StoreError> {
    let mut fresh = Vec::with_capacity(records.len());
    let mut seen: Option<(String, Vec<StepRecord>)> = None;
    for r in records {
        let Some(key) = &r.idempotency_key else {
            fresh.push(r.clone());
            continue;
        };
        if seen.as_ref().is_none_or(|(id, _)| *id != r.run_id) {
            seen = Some((r.run_id.clone(), store.list_records(&r.run_id)?));
        }
        let ledger = &seen.as_ref().expect("loaded above").1;
        let replayed = ledger
            .iter()
            .any(|old| old.idempotency_key.as_ref() == Some(key) && old.status == r.status);
        if !replayed {
            fresh.push(r.clone());
        }
    }
    Ok(fresh)
}

/// The due time of a run's wait, if it has one that the driver must watch.
pub(crate) fn wait_due_at(run: &RunState) -> Option<DateTime<Utc>> {
    let w = run.waiting.as_ref()?;
    if run.status != RunStatus::Waiting {
        return None;
    }
    match w.reason {
        WaitReason::Until | WaitReason::Event => w
            .until
            .as_deref()
            .and_then(|u| crate::core::clock::parse_time(u).ok()),
        _ => None,
    }
}

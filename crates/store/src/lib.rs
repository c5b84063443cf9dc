//! Where runs and ledgers live. One [`Store`] trait, several backends:
//! [`MemoryStore`] (tests, embedding), [`JsonFileStore`] (a folder of JSON
//! files), [`SqliteStore`] (the embedded default: one file, WAL) and
//! [`PostgresStore`] (one database shared by several hosts).
//!
//! The trait is shaped for more than one host process: every write is either
//! a whole-run save, an atomic create-if-absent, or an append, and
//! [`Store::commit`] gives a backend one place to make a step's ledger records
//! and its run save atomic, fenced by the version its writer read and the
//! lease it holds.
//!
//! This crate is the stores alone: it depends on the run model
//! (`stepwell-model`) and nothing of the runtime; `stepwell-runtime`
//! re-exports it as `stepwell_runtime::store` (and `stepwell::store`).

// Every public item says what it is; every unsafe operation sits in a
// block that says why it holds, also inside an `unsafe fn`.
#![deny(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]

pub mod artifacts;
pub mod bundles;
pub mod commands;
pub mod compaction;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod deployments;
pub mod inbox;
pub mod index;
mod json_files;
mod jsonl;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[doc(hidden)] // the file-privacy checks the sandbox and the host share
pub mod private;
pub mod snapshots;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "sqlite")]
mod sqlite_vfs;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use stepwell_model::model::{RunState, RunStatus, StepRecord, StepStatus, WaitReason};

pub use artifacts::{ArtifactMeta, ArtifactStore, FileArtifactStore, MemoryArtifactStore};
pub use commands::{
    AppendResult, CommandRecord, CommandStore, JsonlCommandStore, MemoryCommandStore,
};
pub use deployments::{Deployed, Deployment, VersionUse, WorkflowVersion};
pub use inbox::{connection_stream, ConnectionRecord, EventAppend, InboxEvent};
pub use index::{Attribution, PlainIndex, RunIndexer, TurnRoots};
pub use json_files::JsonFileStore;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStore, SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION};
pub use snapshots::{
    JsonSnapshotStore, MemorySnapshotStore, Snapshot, SnapshotQuery, SnapshotStore,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{
    configure as configure_sqlite, open_connection as open_sqlite_connection, SqliteStore,
    SCHEMA_VERSION as SQLITE_SCHEMA_VERSION,
};

/// Where the digests of compiled files are kept: the host loads a cached
/// file only if the SHA-256 of its bytes is the one recorded here when the
/// file was written. Keep it somewhere at least as well guarded as the cache
/// (the run store is: `SqliteStore` implements this).
pub trait CompiledDigests: Send + Sync + std::fmt::Debug {
    /// The digest recorded for the compiled file `name`, if any.
    fn vouched(&self, name: &str) -> Option<[u8; 32]>;
    /// Records `digest` for the compiled file `name` (a failure only costs
    /// a compilation later).
    fn vouch(&self, name: &str, digest: &[u8; 32]);
}

/// `url` without its password (for messages): the password of a URL's
/// user part (which ends at its last `@`) and any `password=` parameter
/// (of a URL's query or a libpq key/value string) become `***`; text that
/// has an `@` but no `://` (a mistyped URL) shows only its scheme.
pub fn redact_url(url: &str) -> String {
    let shown = match url.split_once("://") {
        Some((scheme, rest)) => {
            let rest = match rest.rfind('@') {
                Some(at) if rest[..at].contains(':') => {
                    let name = rest[..at].split(':').next().unwrap_or_default();
                    format!("{name}:***@{}", &rest[at + 1..])
                }
                _ => rest.to_string(),
            };
            format!("{scheme}://{rest}")
        }
        None if url.contains('@') => {
            let scheme = url.split(':').next().unwrap_or_default();
            return format!("{scheme}:***");
        }
        None => url.to_string(),
    };
    // `password=...` up to the next `&` or space (or quoted).
    let mut out = String::with_capacity(shown.len());
    let mut rest = shown.as_str();
    while let Some(at) = rest.to_ascii_lowercase().find("password=") {
        let (before, after) = rest.split_at(at + "password=".len());
        out.push_str(before);
        out.push_str("***");
        let end = if let Some(quoted) = after.strip_prefix('\'') {
            quoted.find('\'').map_or(after.len(), |q| q + 2)
        } else {
            after.find(['&', ' ']).unwrap_or(after.len())
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The store failed: an I/O or database error, corrupt data, a schema this
/// version cannot read, or a write whose fence no longer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreError {
    /// `store_io`, `store_corrupt`, `store_schema`, `store_unsafe`,
    /// `store_unsupported` or `conflict`.
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

    /// A file or folder of the store that another local user could have
    /// written or replaced (a symbolic link, another user's, writable by
    /// others): refused rather than used.
    pub fn unsafe_path(message: impl Into<String>) -> Self {
        StoreError {
            code: "store_unsafe",
            message: message.into(),
        }
    }

    /// A write whose [`Fence`] no longer holds: the run changed (or its
    /// lease passed to another holder) since the writer read it. Nothing was
    /// written.
    pub fn conflict(message: impl Into<String>) -> Self {
        StoreError {
            code: "conflict",
            message: message.into(),
        }
    }

    /// An operation this backend does not offer (it says which and what
    /// does).
    pub fn unsupported(message: impl Into<String>) -> Self {
        StoreError {
            code: "store_unsupported",
            message: message.into(),
        }
    }

    /// Whether this is a [`StoreError::conflict`].
    pub fn is_conflict(&self) -> bool {
        self.code == "conflict"
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

/// So the runtime's error converts it like any error below it (into its
/// `Store` variant).
impl stepwell_model::ExtensionError for StoreError {
    fn reason_code(&self) -> &'static str {
        self.code
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code, "message": self.message})
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A request for a run's lease: whoever executes a run's steps holds it, so
/// no other process (or runtime) executes them at the same time.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// Who asks (unique per runtime: host, process and a random part).
    pub holder: &'a str,
    /// The time of the request: a lease whose expiry is before it has
    /// lapsed and can be taken over.
    pub now: DateTime<Utc>,
    /// When the lease lapses unless it is renewed.
    pub until: DateTime<Utc>,
    /// A holder known to be dead (its process is gone): its lease is taken
    /// over at once instead of at its expiry. Only that holder's lease: if
    /// someone else took the run in between, the claim is busy.
    pub dead_holder: Option<&'a str>,
}

impl LeaseRequest<'_> {
    /// Whether a lease held by `holder` until `until` keeps this request
    /// out.
    pub fn blocked_by(&self, holder: &str, until: DateTime<Utc>) -> bool {
        holder != self.holder && until >= self.now && Some(holder) != self.dead_holder
    }

    /// [`Claim::Busy`] when a run's stored lease (its holder, and until
    /// when in microseconds) keeps this request out; `None` when the
    /// request may take the run. A lease time that cannot be read keeps it
    /// out.
    pub fn busy(&self, holder: Option<&str>, until_us: Option<i64>) -> Option<Claim> {
        let (holder, until_us) = (holder?, until_us?);
        let until = DateTime::from_timestamp_micros(until_us);
        until
            .is_none_or(|until| self.blocked_by(holder, until))
            .then(|| Claim::Busy {
                holder: Some(holder.to_string()),
                until: until.map(stepwell_model::clock::format_time),
            })
    }
}

/// What [`Store::claim`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// The lease is the caller's now. This is the run as stored; its
    /// `version` is the fence of the caller's next write.
    Held(Box<RunState>),
    /// Another holder has the lease and it has not lapsed.
    Busy {
        /// Who holds it, if the store knows.
        holder: Option<String>,
        /// Until when (RFC 3339), if the store knows.
        until: Option<String>,
    },
    /// The run is quarantined (see [`Store::quarantine`]): nobody executes it.
    Quarantined {
        /// Why.
        reason: String,
    },
    /// No run has this id.
    Missing,
}

/// The precondition of a write to one run: what its writer saw. A write
/// whose fence no longer holds changes nothing and fails with
/// [`StoreError::conflict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The version the writer read; 0 means the run must not exist yet (the
    /// write creates it).
    pub version: u64,
    /// The lease the writer holds (or takes, see [`Fence::take`]). `None`
    /// for a write that needs no lease (a cancel): it lands whoever holds
    /// the lease, and clears it.
    pub holder: Option<&'a str>,
    /// With a holder: the write takes the lease if it is free or lapsed at
    /// this time (or already the holder's), instead of requiring that the
    /// holder has it. A resume takes the lease with its first commit.
    pub take: Option<DateTime<Utc>>,
}

impl<'a> Fence<'a> {
    /// A write by the holder of the run's lease.
    pub fn held(version: u64, holder: &'a str) -> Self {
        Fence {
            version,
            holder: Some(holder),
            take: None,
        }
    }

    /// A write that takes the lease for `holder` if nobody else holds a
    /// live one at `now`.
    pub fn take(version: u64, holder: &'a str, now: DateTime<Utc>) -> Self {
        Fence {
            version,
            holder: Some(holder),
            take: Some(now),
        }
    }

    /// A write that needs no lease (it lands whoever holds it, and clears
    /// it).
    pub fn unleased(version: u64) -> Self {
        Fence {
            version,
            holder: None,
            take: None,
        }
    }

    /// Whether a run whose lease is `lease` (holder and expiry) lets this
    /// write land.
    pub fn admits(&self, lease: Option<(&str, DateTime<Utc>)>) -> bool {
        match (self.holder, self.take, lease) {
            (None, _, _) => true,
            (Some(h), _, Some((held_by, _))) if held_by == h => true,
            (Some(_), Some(_), None) => true,
            (Some(_), Some(now), Some((_, until))) => until < now,
            (Some(_), None, _) => false,
        }
    }
}

/// What a commit does with the writer's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAfter {
    /// Keep it, renewed until this time (the writer goes on executing).
    Renew(DateTime<Utc>),
    /// Give it up (the writer stops executing this run).
    Release,
}

/// What [`Store::delete_runs`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Deleted {
    /// The runs deleted, in the order asked.
    pub runs: Vec<String>,
    /// How many ledger records went with them.
    pub records: u64,
}

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
    /// List newest first (creation order reversed) instead of oldest first.
    pub newest_first: bool,
    /// Only the runs that come after this run in the listing order: the
    /// last run of a page is the cursor of the next one.
    pub after_run_id: Option<String>,
}

impl RunQuery {
    /// Orders `all` (every run, oldest first) as the query asks, applies
    /// its cursor (found among all runs: the cursor run need not match the
    /// filters any more), keeps the runs that `matches`, and applies the
    /// limit: the backends without an ordered index page with this.
    pub fn page<T>(
        &self,
        mut all: Vec<T>,
        run_id: impl Fn(&T) -> &str,
        matches: impl Fn(&T) -> bool,
    ) -> Vec<T> {
        if self.newest_first {
            all.reverse();
        }
        let start = match &self.after_run_id {
            Some(after) => all
                .iter()
                .position(|r| run_id(r) == after)
                .map_or(all.len(), |i| i + 1),
            None => 0,
        };
        all.into_iter()
            .skip(start)
            .filter(|r| matches(r))
            .take(self.limit.unwrap_or(usize::MAX))
            .collect()
    }

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
    /// Only turn roots, as the store's indexer says
    /// ([`RunIndexer::turn_roots`]; without one, the runs without a
    /// parent).
    pub root_only: bool,
    /// At most this many rows.
    pub limit: Option<usize>,
    /// Oldest first (default: newest first).
    pub oldest_first: bool,
    /// Only runs attributed to one of these automations (`None`: no
    /// filter; an empty list matches nothing, as in the reference).
    pub automation_id: Option<Vec<String>>,
    /// Only runs with one of these roles (the indexer's).
    pub role: Option<Vec<String>>,
    /// Only runs with one of these session kinds.
    pub session_kind: Option<Vec<String>>,
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
    /// The automation the run belongs to (see [`Attribution`]; the
    /// columns from here on are the store's [`RunIndexer`]'s).
    pub automation_id: Option<String>,
    /// `controller`, `occurrence`, `descendant`, `discussion` or
    /// `legacy_schedule`; `None` for a plain run.
    pub role: Option<String>,
    /// The occurrence the run belongs to, for occurrences, their
    /// descendants and discussions.
    pub occurrence_index: Option<i64>,
    /// `chat`, `automation`, `occurrence` or `discussion`.
    pub session_kind: Option<String>,
    /// The run's top-level `vars.workspace_root`, stripped (`None` when
    /// absent or empty).
    pub workspace_root: Option<String>,
}

impl RunIndexRow {
    /// The index row of `run`, its attribution by `indexer`.
    pub fn of(run: &RunState, indexer: &dyn RunIndexer) -> Self {
        let a = indexer.index(run);
        RunIndexRow {
            run_id: run.run_id.clone(),
            workflow_id: run.workflow_id.clone(),
            status: run.status,
            parent_run_id: run.parent_run_id.clone(),
            session_id: run.session_id.clone(),
            created_at: run.created_at.clone(),
            updated_at: run.updated_at.clone(),
            automation_id: a.automation_id,
            role: a.role,
            occurrence_index: a.occurrence_index,
            session_kind: a.session_kind,
            workspace_root: a.workspace_root,
        }
    }

    /// Whether this run is a turn root (see [`RunIndexQuery::root_only`])
    /// by the rule `roots` (the indexer's, [`RunIndexer::turn_roots`]).
    pub fn is_turn_root(&self, roots: &TurnRoots) -> bool {
        roots.is_root(self.role.as_deref(), self.parent_run_id.as_deref())
    }
}

impl RunIndexQuery {
    /// Whether `row` passes every filter (the limit aside), `roots` being
    /// the turn roots' rule of the store's indexer.
    pub fn matches(&self, row: &RunIndexRow, roots: &TurnRoots) -> bool {
        let any = |wanted: &Option<Vec<String>>, value: &Option<String>| match wanted {
            None => true,
            Some(w) => value.as_ref().is_some_and(|v| w.contains(v)),
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
            && (!self.root_only || row.is_turn_root(roots))
            && any(&self.automation_id, &row.automation_id)
            && any(&self.role, &row.role)
            && any(&self.session_kind, &row.session_kind)
    }
}

/// One entry of the store-wide change feed ([`Store::list_feed`]): run
/// `run_id` gained the ledger records `from_seq..=to_seq`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FeedEntry {
    /// The entry's position in the feed (increasing, not dense).
    pub seq: u64,
    /// The run.
    pub run_id: String,
    /// The seq of the first record appended.
    pub from_seq: u64,
    /// The seq of the last record appended.
    pub to_seq: u64,
}

/// Splits a comma-separated filter value (`"a,b"`) into its values.
pub fn filter_values(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// A run the driver set aside ([`Store::defer`]), until its next commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deferral {
    /// Kept off the driver's lists until then.
    pub until: DateTime<Utc>,
    /// Deferrals since the run's last commit.
    pub count: u32,
    /// Why the driver could not move it (`None`: it moved, and waits for
    /// its turn).
    pub reason: Option<String>,
}

/// Runs, their ledgers, and the bundles their workflows come from.
///
/// # The run transaction
///
/// Every change to a run goes through one protocol that holds across
/// threads, processes and (with a shared database) machines:
///
/// - each run has a `version` ([`RunState::version`]); every write names
///   the version it read in a [`Fence`] and lands only if the store still
///   holds it (compare-and-swap), bumping it by one. A writer that lost a
///   race gets [`StoreError::conflict`] and nothing it wrote is kept;
/// - whoever executes a run's steps first takes its lease ([`Store::claim`]),
///   renews it while it works ([`Store::renew`]) and gives it up with its
///   last commit ([`LeaseAfter::Release`]) or [`Store::release`]. A lease
///   held by a process that died lapses (at its expiry, or at once where the
///   backend can tell) and another holder takes the run over. A write fenced
///   with a holder lands only while that holder has the lease, so a holder
///   that stalled past its expiry cannot overwrite its successor.
///
/// The backends implement it with what each has: SQLite with `BEGIN
/// IMMEDIATE` transactions and lease columns, JSON files with advisory file
/// locks, memory under its locks. A backend shared by several machines
/// (PostgreSQL: row locks or a lease column with `SKIP LOCKED`) implements
/// the same calls. `tests/conformance.rs` holds every backend to them,
/// across OS processes where the backend persists.
pub trait Store: Send + Sync {
    /// The run with this id, if any.
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError>;

    /// The status of the run with this id, if any: what a runtime asks of
    /// each of its effects in flight every second (was it cancelled
    /// elsewhere?). Default: from [`Store::load_run`]; a backend that can
    /// read the status alone should.
    fn run_status(&self, run_id: &str) -> Result<Option<RunStatus>, StoreError> {
        Ok(self.load_run(run_id)?.map(|r| r.status))
    }

    /// Creates `run` (its `version` must be 1) only if its id is free.
    /// Returns the stored run and whether this call created it; an existing
    /// run is returned untouched.
    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError>;

    /// Takes the run's lease for `lease.holder` if it is free, lapsed, or
    /// already the holder's, and returns the run as stored. Never waits.
    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError>;

    /// Extends `holder`'s leases on `run_ids` until `until`. Runs whose lease
    /// is no longer the holder's are left alone (their next fenced write
    /// fails).
    fn renew(
        &self,
        holder: &str,
        run_ids: &[String],
        until: DateTime<Utc>,
    ) -> Result<(), StoreError>;

    /// Gives up `holder`'s lease on the run (nothing if it is not theirs).
    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError>;

    /// Commits one transition of a run, atomically where the backend can:
    /// appends `records` to the run's ledger and saves `run`, whose
    /// `version` must be `fence.version + 1`, if the stored run still has
    /// `fence.version` (and, with a holder, that holder's lease); with
    /// `fence.version == 0`, creates the run. Then does `lease` with the
    /// writer's lease. When the fence does not hold, nothing is written:
    /// [`StoreError::conflict`].
    ///
    /// A backend that cannot make the append and the save one atomic write
    /// (JSON files) appends first and saves after, with the save marking
    /// how much of the ledger it reflects: a crash in between leaves
    /// records no state reflects, which readers do not show and the next
    /// write cuts off.
    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError>;

    /// [`Store::commit`] with the records handed over: a store that keeps
    /// records as they are (the memory store) takes them without a copy.
    /// The default commits a borrow of them.
    fn commit_owned(
        &self,
        records: Vec<StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.commit(&records, run, fence, lease)
    }

    /// [`Store::commit_owned`] of a transition whose vars differ from the
    /// state the commit of `fence.version` wrote only in the top-level keys
    /// `changed` (set, replaced or removed); every other field of `run` may
    /// differ. The step loop vouches for this when the same hold wrote that
    /// version and only a step without an effect changed the run since, so
    /// a store that keeps the run as a value (the memory store) updates
    /// those keys rather than compare all the vars. The default ignores
    /// `changed`.
    fn commit_changed(
        &self,
        records: Vec<StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
        changed: &[String],
    ) -> Result<(), StoreError> {
        let _ = changed;
        self.commit_owned(records, run, fence, lease)
    }

    /// Appends records ahead of the commit that will make their transition
    /// true (an effect on other runs or on the outside world records what it
    /// did as soon as it did it), if `fence` still holds.
    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError>;

    /// Appends records without a fence: for evidence that belongs to no
    /// transition (tests, benchmarks, imports). Each record is linked into
    /// its run's hash chain ([`link`]). They are not ahead of the state: a
    /// run with nothing ahead counts them as committed (after records an
    /// effect appended ahead, they stay ahead with those until the next
    /// commit).
    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError>;

    /// A run's ledger, oldest first.
    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;

    /// A run's ledger records after the first `after` (seq `after + 1`
    /// onwards), oldest first: what a follower has not seen yet. The
    /// default reads the range from `after` on.
    fn list_records_after(&self, run_id: &str, after: u64) -> Result<Vec<StepRecord>, StoreError> {
        self.list_records_range(run_id, after, u64::MAX)
    }

    /// A run's ledger records with seqs `after + 1 ..= through`, oldest
    /// first (what one change-feed entry names, a page of a ledger read a
    /// page at a time). The default reads the whole ledger: a backend
    /// whose ledgers may be long reads only the range.
    fn list_records_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<StepRecord>, StoreError> {
        let mut records = self.list_records(run_id)?;
        records.truncate(usize::try_from(through).unwrap_or(usize::MAX));
        records.drain(
            ..usize::try_from(after)
                .unwrap_or(usize::MAX)
                .min(records.len()),
        );
        Ok(records)
    }

    /// Up to `limit` of a run's ledger records whose seq is over `after`,
    /// oldest first, each with its seq: a page of a ledger read a page at
    /// a time. A reader that asks again after the last seq it got reads
    /// every record there is, even where seqs are missing (a record
    /// removed by hand: the chain check then names it). The default numbers
    /// the records of [`Store::list_records_range`] by their position.
    fn list_records_page(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        let through = after.saturating_add(limit as u64);
        let records = self.list_records_range(run_id, after, through)?;
        Ok((after + 1..).zip(records).collect())
    }

    /// The store-wide change feed: up to `limit` entries after the entry
    /// `after` (0: from the start), in commit order across every process
    /// on the store; each names a run and the seqs of records it gained
    /// (one append, or on SQLite several of the run's in a row). `None`
    /// when the backend keeps no feed (memory and
    /// JSON files: a server then shows the commits of its own process).
    fn list_feed(&self, after: u64, limit: usize) -> Result<Option<Vec<FeedEntry>>, StoreError> {
        let _ = (after, limit);
        Ok(None)
    }

    /// The position of the newest entry of the change feed (`Some(0)`
    /// while it is empty; `None` when the backend keeps no feed).
    fn feed_head(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// The run's records appended after its last commit, oldest first:
    /// what an effect on other runs or the world recorded ahead of a commit
    /// that has not happened (yet, or ever: the process died). A step
    /// replayed after a crash finds its effect's outcome here.
    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;

    /// The run's ledger records carrying `idempotency_key`, oldest first.
    /// The default reads the whole ledger; SQLite answers keys of resumes
    /// another run's effect caused (`resumed-by:...`) from an index.
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

    /// Replaces the run's records with seqs up to `through` by
    /// `checkpoint` (made by [`compaction::checkpoint_record`]), which
    /// takes seq `through`, and appends its seal
    /// ([`compaction::seal_record`]) at the end, in one transaction: the
    /// records after it keep their seqs and hashes, the first following the
    /// checkpoint's `prev_hash` (the hash of the record it replaced at
    /// `through`). Refused (`conflict`, nothing changed) unless the record
    /// at `through` carries that hash and is not the run's last, and no
    /// record is ahead of the run's state. Returns how many records went
    /// (the one replaced included). The default: `store_unsupported`.
    fn compact_ledger(
        &self,
        run_id: &str,
        through: u64,
        checkpoint: &StepRecord,
    ) -> Result<u64, StoreError> {
        let _ = (run_id, through, checkpoint);
        Err(StoreError::unsupported(
            "this store does not compact ledgers (SQLite, PostgreSQL and memory stores do)",
        ))
    }

    /// Whether [`Store::compact_ledger`] is more than its default refusal.
    fn compacts_ledgers(&self) -> bool {
        false
    }

    /// The runs matching `query`, oldest first. Runs that cannot be read
    /// (corrupt) and quarantined runs are left out.
    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError>;

    /// Ids of waiting runs whose time has come at `now` (due `until` waits,
    /// event waits past their deadline), the earliest due first, at most
    /// `limit`. Quarantined runs and runs deferred past `now` are left out.
    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError>;

    /// Ids of `running` runs nobody holds a live lease on at `now` (new
    /// runs, async children, runs whose executor died), at most `limit`:
    /// never-deferred runs first, then those deferred longest ago, each
    /// group oldest first. A backend that cannot read a run may list it too,
    /// so that its claim reports the damage. Quarantined runs and runs
    /// deferred past `now` are left out.
    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError>;

    /// `(run, holder)` of `running` runs someone holds a lease on, at most
    /// `limit`: a driver takes over those whose holder it knows is dead.
    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError>;

    /// `(parent, child)` pairs of parents waiting (reason `subworkflow`) on
    /// a child that has ended or was quarantined, at most `limit`; parents
    /// deferred past now (by the system clock) are left out. The default
    /// reads every waiting parent and its child.
    fn list_ended_children(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let mut out = Vec::new();
        let quarantined = self.list_quarantined()?;
        for parent in self.list_runs(&RunQuery {
            status: Some(RunStatus::Waiting),
            wait_reason: Some(WaitReason::Subworkflow),
            ..RunQuery::default()
        })? {
            let Some(child) = parent
                .waiting
                .as_ref()
                .and_then(|w| w.wait_key.strip_prefix("subworkflow:"))
            else {
                continue;
            };
            let ended = quarantined.iter().any(|(id, _)| id == child)
                || matches!(self.load_run(child), Ok(Some(c)) if c.status.is_terminal());
            let deferred = self
                .deferred_until(&parent.run_id)?
                .is_some_and(|until| until > Utc::now());
            if ended && !deferred {
                out.push((parent.run_id.clone(), child.to_string()));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Ids of unfinished runs whose parent was cancelled (a crash between a
    /// parent's cancel and its children's), at most `limit`. The default
    /// reads every unfinished child and its parent.
    fn list_orphans(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        for status in [RunStatus::Running, RunStatus::Waiting] {
            for run in self.list_runs(&RunQuery {
                status: Some(status),
                ..RunQuery::default()
            })? {
                let Some(parent) = &run.parent_run_id else {
                    continue;
                };
                if self
                    .deferred_until(&run.run_id)?
                    .is_some_and(|until| until > Utc::now())
                {
                    continue;
                }
                if let Ok(Some(p)) = self.load_run(parent) {
                    if p.status == RunStatus::Cancelled {
                        out.push(run.run_id);
                        if out.len() >= limit {
                            return Ok(out);
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Sets the run aside with `reason`: it is no longer listed, claimed or
    /// driven (a run that cannot be read or committed must not stop the
    /// driver). Works on a run whose stored state cannot be decoded.
    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError>;

    /// Keeps a run the driver could not move (or has just served) off
    /// [`Store::list_due`] and [`Store::list_claimable`] for a while: adds
    /// one to the run's count of deferrals since its last commit, and sets
    /// it aside until `until(count)`, with `reason` (why it could not be
    /// moved; `None` for a run that moved and only waits for its turn).
    /// Returns the count (0: no such run). A commit clears all three.
    /// `list_claimable` lists the runs deferred longest ago (and those
    /// never deferred) first, so that a driver serving more runs than one
    /// pass takes rotates through all of them.
    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError>;

    /// The run's deferral ([`Store::defer`]) since its last commit, if it
    /// has one; a store that keeps no deferrals answers `None`.
    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        let _ = run_id;
        Ok(None)
    }

    /// Until when the run is deferred ([`Store::defer`]), if it is. The
    /// default lists of parents and orphans use it to leave deferred runs
    /// out.
    fn deferred_until(&self, run_id: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        Ok(self.deferral(run_id)?.map(|d| d.until))
    }

    /// Quarantined runs and why, in the order they were set aside.
    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError>;

    /// The indexer that fills the run index's attribution columns
    /// ([`index`]). The default is [`PlainIndex`], for a store that cannot
    /// be given another.
    fn indexer(&self) -> Arc<dyn RunIndexer> {
        Arc::new(PlainIndex)
    }

    /// Fills the run index with `indexer` from now on, and indexes again
    /// the rows no indexer attributed (no session kind). The runtime's
    /// builder calls it with the indexer of its features. The default
    /// refuses (`store_unsupported`): a store that keeps no indexer cannot
    /// answer a feature's listings.
    fn set_indexer(&self, indexer: Arc<dyn RunIndexer>) -> Result<(), StoreError> {
        let _ = indexer;
        Err(StoreError {
            code: "store_unsupported",
            message:
                "this store keeps no run indexer (implement Store::indexer and Store::set_indexer)"
                    .into(),
        })
    }

    /// Ids of the runs an event of the trigger connection `connection_id`
    /// (of any connection with `None`) would wake now
    /// ([`Attribution::wakes_on`]), oldest first. The default reads every
    /// waiting run; SQLite answers from an index of them.
    fn list_consumers(&self, connection_id: Option<&str>) -> Result<Vec<String>, StoreError> {
        let indexer = self.indexer();
        Ok(self
            .list_runs(&RunQuery {
                status: Some(RunStatus::Waiting),
                ..RunQuery::default()
            })?
            .into_iter()
            .filter(|run| {
                indexer
                    .index(run)
                    .wakes_on
                    .is_some_and(|c| connection_id.is_none_or(|id| c == id))
            })
            .map(|run| run.run_id)
            .collect())
    }

    /// Why the run was quarantined, if it was. The default reads the list
    /// of quarantined runs; SQLite reads the run's row.
    fn quarantined(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .list_quarantined()?
            .into_iter()
            .find(|(id, _)| id == run_id)
            .map(|(_, reason)| reason))
    }

    /// The run index: lightweight rows with attribution, filtered by
    /// `query`, newest first unless `oldest_first`. The default reads every
    /// run through [`Store::list_runs`]; SQLite answers from indexed
    /// columns without reading any run's vars.
    fn list_run_index(&self, query: &RunIndexQuery) -> Result<Vec<RunIndexRow>, StoreError> {
        let indexer = self.indexer();
        let roots = indexer.turn_roots();
        let mut rows: Vec<RunIndexRow> = self
            .list_runs(&RunQuery {
                status: query.status,
                workflow_id: query.workflow_id.clone(),
                ..RunQuery::default()
            })?
            .iter()
            .map(|run| RunIndexRow::of(run, indexer.as_ref()))
            .filter(|row| query.matches(row, &roots))
            .collect();
        if !query.oldest_first {
            rows.reverse();
        }
        rows.truncate(query.limit.unwrap_or(usize::MAX));
        Ok(rows)
    }

    /// The bundle directory an older stepwell recorded for `workflow_id`
    /// (before versions were deployed), if any: the runtime deploys it the
    /// first time it needs the workflow. The default: none.
    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        let _ = workflow_id;
        Ok(None)
    }

    /// Records `deployment` in one transaction: its files once per digest
    /// (written again if the kept ones were damaged), and for each of its
    /// workflow ids a new version unless that id's latest version has the
    /// same digest. Concurrent deployments (threads, processes, hosts) of
    /// one id get distinct, consecutive version numbers.
    fn deploy(&self, deployment: &Deployment<'_>) -> Result<Vec<Deployed>, StoreError>;

    /// Version `version` of `workflow_id` (`None`: its latest), if deployed.
    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<WorkflowVersion>, StoreError>;

    /// Every deployed version of `workflow_id` (of every id when `None`),
    /// by id, then version.
    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<WorkflowVersion>, StoreError>;

    /// The files kept under `digest`, in path order (none: no such
    /// digest). The caller checks them against it.
    fn bundle_files(&self, digest: &str) -> Result<Vec<crate::bundles::BundleFile>, StoreError>;

    /// Removes `versions` (each matched by id, number and digest), and the
    /// files of every digest no version names any more, in one
    /// transaction. Returns how many versions were removed.
    fn remove_versions(&self, versions: &[WorkflowVersion]) -> Result<usize, StoreError>;

    /// Deletes the runs of `run_ids` with their ledgers (and, where the
    /// store keeps one, their change-feed entries): all of them or none.
    /// If one of them has not ended (completed, failed or cancelled), none
    /// is deleted; an id that is not there is skipped. SQLite also keeps
    /// them all while one holds the store's newest ledger row (the change
    /// feed's position, which a deletion would give out again). Retention
    /// (`Runtime::prune`) decides which runs may go; this only deletes.
    /// Returns what went.
    fn delete_runs(&self, run_ids: &[String]) -> Result<Deleted, StoreError>;

    /// How many runs of `workflow_id` each version has, by status. The
    /// default reads every run of the workflow.
    fn version_use(&self, workflow_id: &str) -> Result<Vec<VersionUse>, StoreError> {
        let runs = self.list_runs(&RunQuery {
            workflow_id: Some(workflow_id.to_string()),
            ..RunQuery::default()
        })?;
        Ok(deployments::count(runs.iter().map(|r| {
            (r.workflow_version, r.status, r.updated_at.as_str())
        })))
    }

    /// Appends `event` to its stream (its `seq` is ignored and assigned)
    /// unless the stream already holds its `dedupe_key`: then nothing is
    /// stored and the stored event's seq is returned as a duplicate.
    fn append_event(&self, event: &InboxEvent) -> Result<EventAppend, StoreError> {
        let _ = event;
        Err(no_inbox())
    }

    /// The events of `stream` with `seq > after`, oldest first, at most
    /// `limit`.
    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<InboxEvent>, StoreError> {
        let _ = (stream, after, limit);
        Err(no_inbox())
    }

    /// Drops the payloads of the events of `stream` with seq up to
    /// `through` appended before `before`, keeping each one's seq and
    /// dedupe key: the same key
    /// appended again is still a duplicate, and no reader gets them any
    /// more ([`Store::events_after`] skips them). With `dry_run`, only
    /// counts them. Returns how many it dropped (not those dropped
    /// before). The default: `store_unsupported`.
    fn prune_events(
        &self,
        stream: &str,
        through: u64,
        before: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        let _ = (stream, through, before, dry_run);
        Err(StoreError::unsupported(
            "this store does not prune its event inbox (SQLite, PostgreSQL and memory stores do)",
        ))
    }

    /// Stores a new connection; a `conflict` when its id exists.
    fn create_connection(&self, connection: &ConnectionRecord) -> Result<(), StoreError> {
        let _ = connection;
        Err(no_inbox())
    }

    /// Changes connection `id` with `change`, atomically against every other
    /// writer; `Ok(None)` when there is no such connection. Nothing is
    /// written when `change` fails.
    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<ConnectionRecord>, StoreError> {
        let _ = (id, change);
        Err(no_inbox())
    }

    /// The connection with this id, if any.
    fn get_connection(&self, id: &str) -> Result<Option<ConnectionRecord>, StoreError> {
        let _ = id;
        Err(no_inbox())
    }

    /// Every connection, oldest first.
    fn list_connections(&self) -> Result<Vec<ConnectionRecord>, StoreError> {
        Err(no_inbox())
    }

    /// Whether [`Store::wait_for_work`] hears other processes (and hosts):
    /// a driver may then poll slowly, and wake when told.
    fn signals_work(&self) -> bool {
        false
    }

    /// Waits up to `timeout` for another process to signal new work (a run
    /// started, released or resumed, a child ended, a parent cancelled, an
    /// event or command appended); returns whether one did. The first call
    /// starts listening (a driver makes it with a zero timeout before its
    /// first pass); from then on a signal sent while nobody waited is kept
    /// for the next call. The default sleeps for `timeout` and returns
    /// `false`: its callers poll.
    fn wait_for_work(&self, timeout: std::time::Duration) -> bool {
        std::thread::sleep(timeout);
        false
    }

    /// When the store's earliest timed work falls due: a time wait, a
    /// deferral ending, a lease lapsing (time waits by `wait_now`, the
    /// runtime's clock, as [`Store::list_due`]; the rest by the system
    /// clock). A time may be early (a lower bound), never late. A driver of
    /// a store that [signals work](Store::signals_work) sleeps until then
    /// (or a signal) instead of polling. `None`: not known (the default);
    /// the driver polls.
    fn next_due(&self, wait_now: DateTime<Utc>) -> Result<Option<NextDue>, StoreError> {
        let _ = wait_now;
        Ok(None)
    }
}

/// The earliest timed work of a store ([`Store::next_due`]); `None` in a
/// field: none of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NextDue {
    /// When the earliest time wait (or a waiting run's deferral) ends, by
    /// the runtime's clock (which [`Store::list_due`] is given).
    pub wait: Option<DateTime<Utc>>,
    /// When the earliest running run becomes free to claim (its deferral
    /// ends, its lease lapses), or a deferred parent or orphan may be
    /// moved, by the system clock.
    pub claim: Option<DateTime<Utc>>,
}

/// How an SQL backend names its `runs` table's parameters and order: the
/// SQLite and PostgreSQL stores build [`RunQuery`] and [`RunIndexQuery`]
/// statements alike, each with its own marks (`?1`, `$1`) and the column
/// that gives creation order (`rowid`, `ord`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqlDialect {
    /// The mark of the n-th parameter (from 1).
    pub mark: fn(usize) -> String,
    /// The column of `runs` in creation order.
    pub order: &'static str,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl SqlDialect {
    /// `SELECT run_id, data, version FROM runs ...` for `query`, and its
    /// arguments (quarantined runs left out).
    pub(crate) fn run_query(&self, query: &RunQuery) -> (String, Vec<String>) {
        let mut sql =
            String::from("SELECT run_id, data, version FROM runs WHERE quarantine IS NULL");
        let mut args: Vec<String> = Vec::new();
        for (column, value) in [
            ("status", query.status.map(|s| s.as_str().to_string())),
            (
                "wait_reason",
                query.wait_reason.map(|r| r.as_str().to_string()),
            ),
            ("wait_key", query.wait_key.clone()),
            ("workflow_id", query.workflow_id.clone()),
            ("parent_run_id", query.parent_run_id.clone()),
        ] {
            if let Some(v) = value {
                args.push(v);
                sql.push_str(&format!(" AND {column} = {}", (self.mark)(args.len())));
            }
        }
        let (before_after, direction) = if query.newest_first {
            ("<", "DESC")
        } else {
            (">", "ASC")
        };
        let order = self.order;
        if let Some(after) = &query.after_run_id {
            args.push(after.clone());
            sql.push_str(&format!(
                " AND {order} {before_after} (SELECT {order} FROM runs WHERE run_id = {})",
                (self.mark)(args.len())
            ));
        }
        sql.push_str(&format!(" ORDER BY {order} {direction}"));
        if let Some(l) = query.limit {
            sql.push_str(&format!(" LIMIT {l}"));
        }
        (sql, args)
    }

    /// The run index's statement for `query` (the columns of
    /// [`RunIndexRow`], in its field order), and its arguments; `roots` is
    /// the indexer's rule of turn roots.
    pub(crate) fn run_index(
        &self,
        query: &RunIndexQuery,
        roots: &TurnRoots,
    ) -> (String, Vec<String>) {
        let mut sql = String::from(
            "SELECT run_id, workflow_id, status, parent_run_id, session_id, created_at,
                    updated_at, automation_id, role, occurrence_index, session_kind,
                    workspace_root
             FROM runs WHERE quarantine IS NULL",
        );
        let mut args: Vec<String> = Vec::new();
        for (column, value) in [
            ("status", query.status.map(|s| s.as_str().to_string())),
            ("workflow_id", query.workflow_id.clone()),
            ("session_id", query.session_id.clone()),
        ] {
            if let Some(v) = value {
                args.push(v);
                sql.push_str(&format!(" AND {column} = {}", (self.mark)(args.len())));
            }
        }
        for (column, wanted) in [
            ("automation_id", &query.automation_id),
            ("role", &query.role),
            ("session_kind", &query.session_kind),
        ] {
            let Some(values) = wanted else { continue };
            if values.is_empty() {
                sql.push_str(" AND 1 = 0");
                continue;
            }
            let mut marks = Vec::new();
            for v in values {
                args.push(v.clone());
                marks.push((self.mark)(args.len()));
            }
            sql.push_str(&format!(" AND {column} IN ({})", marks.join(", ")));
        }
        if query.root_only {
            // `TurnRoots::is_root`: a root role, or no parent and no role
            // that is never a root (the roles bound, not written in).
            let mut marks = |roles: &[String]| -> String {
                let mut marks = Vec::new();
                for r in roles {
                    args.push(r.clone());
                    marks.push((self.mark)(args.len()));
                }
                marks.join(", ")
            };
            let always = marks(&roots.roots);
            let never = marks(&roots.not_roots);
            let mut root = String::from("(parent_run_id IS NULL OR parent_run_id = '')");
            if !never.is_empty() {
                root = format!("({root} AND (role IS NULL OR role NOT IN ({never})))");
            }
            if !always.is_empty() {
                root = format!("(role IN ({always}) OR {root})");
            }
            sql.push_str(&format!(" AND {root}"));
        }
        let direction = if query.oldest_first { "" } else { " DESC" };
        sql.push_str(&format!(" ORDER BY {}{direction}", self.order));
        if let Some(l) = query.limit {
            sql.push_str(&format!(" LIMIT {l}"));
        }
        (sql, args)
    }
}

fn no_inbox() -> StoreError {
    StoreError {
        code: "store_unsupported",
        message: "this store keeps no event inbox or trigger connections".into(),
    }
}

/// Checks that `run.version` follows `fence.version`, as [`Store::commit`]
/// requires.
pub(crate) fn check_next_version(run: &RunState, fence: &Fence<'_>) -> Result<(), StoreError> {
    if run.version != fence.version + 1 {
        return Err(StoreError::conflict(format!(
            "run {}: a commit fenced at version {} must save version {}, not {}",
            run.run_id,
            fence.version,
            fence.version + 1,
            run.version
        )));
    }
    Ok(())
}

/// The hash of `record` in its run's chain: SHA-256 (hex) of its JSON with
/// `prev_hash` set to `prev` and `record_hash` empty.
pub fn chain_hash(prev: Option<&str>, record: &StepRecord) -> String {
    use sha2::{Digest, Sha256};
    let mut r = record.clone();
    r.prev_hash = prev.map(str::to_string);
    r.record_hash = None;
    let bytes = serde_json::to_vec(&r).unwrap_or_default();
    to_hex(&Sha256::digest(bytes))
}

/// Lower-case hex of `bytes`.
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// Links `record` after `head` (the hash of the run's last record), moves
/// `head` to it, and returns the record's JSON as stored. Stores call this
/// as they append.
pub fn link(head: &mut Option<String>, record: &mut StepRecord) -> String {
    use sha2::{Digest, Sha256};
    record.prev_hash = head.take();
    record.record_hash = None;
    let mut json = serde_json::to_string(&*record).unwrap_or_default();
    let hash = to_hex(&Sha256::digest(json.as_bytes()));
    // `record_hash` is the last field: the stored form is the hashed form
    // with it added, which saves serialising the record twice.
    if json.ends_with('}') {
        json.pop();
        json.push_str(",\"record_hash\":\"");
        json.push_str(&hash);
        json.push_str("\"}");
    }
    record.record_hash = Some(hash.clone());
    *head = Some(hash);
    json
}

/// `value` as JSON text, written into a buffer of `capacity` bytes first (a
/// run row or a ledger record would otherwise grow serde_json's 128 bytes
/// three times or more, a copy each).
pub(crate) fn json_text<T: Serialize + ?Sized>(
    value: &T,
    capacity: usize,
) -> serde_json::Result<String> {
    let mut buf = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut buf, value)?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8(buf).unwrap_or_default())
}

/// [`link`] without changing `record`: its JSON as stored after `head`
/// (the hash of the run's last record), with `head` moved to its hash. A
/// record that carries no hashes yet (what a commit appends) is serialised
/// once and not copied; the bytes are those [`link`] stores.
pub fn link_json(head: &mut Option<String>, record: &StepRecord) -> String {
    use sha2::{Digest, Sha256};
    let plain = record.prev_hash.is_none() && record.record_hash.is_none();
    // A head JSON writes as it is (a hash is hex); any other goes the long way.
    let verbatim = |h: &str| h.bytes().all(|b| b.is_ascii_alphanumeric());
    let mut json = match json_text(record, 1024) {
        Ok(json) if plain && json.ends_with('}') && head.as_deref().is_none_or(verbatim) => json,
        _ => return link(head, &mut record.clone()),
    };
    // `prev_hash` and `record_hash` are the last two fields and absent:
    // the hashed form is the record's with `prev_hash` added at the end.
    if let Some(prev) = head.as_deref() {
        json.pop();
        json.push_str(",\"prev_hash\":\"");
        json.push_str(prev);
        json.push_str("\"}");
    }
    let hash = to_hex(&Sha256::digest(json.as_bytes()));
    json.pop();
    json.push_str(",\"record_hash\":\"");
    json.push_str(&hash);
    json.push_str("\"}");
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
    /// (it does not follow the record before it), `unchained` (it has no
    /// hash), `misplaced checkpoint` (a checkpoint anywhere but first),
    /// `checkpoint unreadable` or `checkpoint inconsistent`
    /// ([`compaction::check_checkpoint`]), `unsealed checkpoint` (no later
    /// record of the chain seals it: [`compaction::seal_record`]), or (from
    /// a runtime's check, which knows the run) `checkpoint of a run never
    /// compacted`.
    pub problem: &'static str,
}

/// Checks a run's ledger, oldest first. Returns the hash of the last record
/// (the head), or the first record that was changed, removed or reordered.
/// A compacted ledger's first record is its checkpoint
/// ([`compaction`]): the records after it are checked from the hash of the
/// last record it replaced.
/// Removing the newest records leaves a shorter valid chain: keep the head
/// somewhere else to detect that. A ledger read in pages is checked with a
/// [`ChainVerifier`] instead, in memory bounded by a page.
pub fn verify_chain(records: &[StepRecord]) -> Result<Option<String>, ChainBreak> {
    let mut verifier = ChainVerifier::default();
    verifier.check(records)?;
    verifier.finish()?;
    Ok(verifier.head)
}

/// Checks a hash chain a page at a time: the pages, oldest first, go to
/// [`ChainVerifier::check`] one after another; what it keeps between them
/// is the last hash and a count.
#[derive(Debug, Default, Clone)]
pub struct ChainVerifier {
    head: Option<String>,
    checked: usize,
    /// The ledger's checkpoint (step id and hash) until a seal later in
    /// the chain names it.
    unsealed: Option<(String, String)>,
}

impl ChainVerifier {
    /// Checks the next records of the chain (they follow those checked
    /// before). The first bad one stops the check: its position counts from
    /// the first record of the whole chain.
    pub fn check(&mut self, records: &[StepRecord]) -> Result<(), ChainBreak> {
        for r in records {
            let fail = |problem| ChainBreak {
                index: self.checked + 1,
                step_id: r.step_id.clone(),
                problem,
            };
            let Some(hash) = &r.record_hash else {
                return Err(fail("unchained"));
            };
            if r.status == StepStatus::Checkpoint {
                // A compacted ledger's first record: the next record
                // follows the record it replaced, whose hash is its
                // `prev_hash`.
                if self.checked > 0 {
                    return Err(fail("misplaced checkpoint"));
                }
                compaction::check_checkpoint(r).map_err(fail)?;
                if chain_hash(r.prev_hash.as_deref(), r) != *hash {
                    return Err(fail("changed"));
                }
                self.head = r.prev_hash.clone();
                self.unsealed = Some((r.step_id.clone(), hash.clone()));
                self.checked += 1;
                continue;
            }
            if r.prev_hash != self.head {
                return Err(fail("removed or reordered"));
            }
            if chain_hash(r.prev_hash.as_deref(), r) != *hash {
                return Err(fail("changed"));
            }
            if self
                .unsealed
                .as_ref()
                .is_some_and(|(_, cp)| compaction::seals(r) == Some(cp.as_str()))
            {
                self.unsealed = None;
            }
            self.head = Some(hash.clone());
            self.checked += 1;
        }
        Ok(())
    }

    /// Ends the check once every page was checked: a checkpoint no later
    /// record of the chain seals (a checkpoint made, or changed, by hand)
    /// breaks it.
    pub fn finish(&self) -> Result<(), ChainBreak> {
        match &self.unsealed {
            Some((step_id, _)) => Err(ChainBreak {
                index: 1,
                step_id: step_id.clone(),
                problem: "unsealed checkpoint",
            }),
            None => Ok(()),
        }
    }

    /// The hash of the last record checked (`None` before the first).
    pub fn head(&self) -> Option<&str> {
        self.head.as_deref()
    }

    /// How many records were checked and found intact.
    pub fn checked(&self) -> usize {
        self.checked
    }
}

/// The due time of a run's wait, if it has one that the driver must watch.
pub fn wait_due_at(run: &RunState) -> Option<DateTime<Utc>> {
    let w = run.waiting.as_ref()?;
    if run.status != RunStatus::Waiting {
        return None;
    }
    match w.reason {
        WaitReason::Until | WaitReason::Event => w
            .until
            .as_deref()
            .and_then(|u| stepwell_model::clock::parse_time(u).ok()),
        _ => None,
    }
}

/// How hard a store works to keep the last commits through a power loss or
/// an OS crash (a killed process loses no committed step either way). Each
/// store has its own default: `Normal` for SQLite, `Full` for JSON files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// SQLite `synchronous=NORMAL`: commits are synced at WAL checkpoints
    /// only, so a power loss may roll back the last transactions (never
    /// corrupting the database, never reordering them). JSON files: no
    /// fsync, so a power loss may lose or reorder the last writes.
    Normal,
    /// SQLite `synchronous=FULL`: every commit is synced before it returns.
    /// JSON files: every run file and ledger append is synced before the
    /// rename (or link) that publishes it, and the folder after.
    Full,
}

impl Durability {
    /// Parses `normal` or `full`.
    pub fn parse(text: &str) -> Option<Durability> {
        match text {
            "normal" => Some(Durability::Normal),
            "full" => Some(Durability::Full),
            _ => None,
        }
    }
}

/// Property tests of the ledger's hash chain, on made-up records of any
/// content, linked as the stores link them and read back from their JSON.
#[cfg(test)]
mod chain_properties {
    use super::*;
    use proptest::prelude::*;
    use stepwell_model::model::EffectRecord;
    use stepwell_strategies::{config, value};

    /// Text of any characters, or of a few plain ones.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[a-z0-9:-]{0,12}", any::<String>()]
    }

    /// A record as a step appends it: no hashes yet, any content.
    fn record() -> impl Strategy<Value = StepRecord> {
        let status = prop::sample::select(vec![
            StepStatus::Started,
            StepStatus::Completed,
            StepStatus::Waiting,
            StepStatus::Failed,
            StepStatus::Cancelled,
        ]);
        let effect =
            (text(), value(), prop::option::of(text())).prop_map(|(kind, payload, result_key)| {
                EffectRecord {
                    kind,
                    payload,
                    result_key,
                }
            });
        (
            (text(), text(), prop::option::of(text()), status),
            (prop::option::of(effect), prop::option::of(value())),
            (prop::option::of(text()), text(), prop::option::of(text())),
            (any::<u32>(), prop::option::of(text())),
        )
            .prop_map(
                |(
                    (step_id, run_id, node_id, status),
                    (effect, result),
                    (error, started_at, ended_at),
                    (attempt, idempotency_key),
                )| StepRecord {
                    step_id,
                    run_id,
                    node_id,
                    status,
                    effect,
                    result,
                    error,
                    started_at,
                    ended_at,
                    attempt,
                    idempotency_key,
                    prev_hash: None,
                    record_hash: None,
                    vars: None,
                    input: None,
                },
            )
    }

    /// `records` linked into a chain as a store appends them, and read
    /// back from the JSON it stores: the records, their JSON, the head.
    fn chain(records: &[StepRecord]) -> (Vec<StepRecord>, Vec<String>, Option<String>) {
        let mut head = None;
        let texts: Vec<String> = records.iter().map(|r| link_json(&mut head, r)).collect();
        let read = texts
            .iter()
            .map(|t| serde_json::from_str(t).expect("a stored record reads back"))
            .collect();
        (read, texts, head)
    }

    proptest! {
        #![proptest_config(config())]

        /// A chain of any records verifies, whole or page by page, up to
        /// the head its appends left; the fast link writes what `link`
        /// writes.
        #[test]
        fn a_linked_chain_verifies(
            records in prop::collection::vec(record(), 1..8),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let (read, texts, head) = chain(&records);
            let mut slow_head = None;
            for (r, text) in records.iter().zip(&texts) {
                prop_assert_eq!(&link(&mut slow_head, &mut r.clone()), text);
            }
            prop_assert_eq!(&slow_head, &head);
            prop_assert_eq!(verify_chain(&read), Ok(head.clone()));
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(read.len() + 1)).collect();
            cuts.sort_unstable();
            let mut verifier = ChainVerifier::default();
            let mut from = 0;
            for to in cuts.into_iter().chain([read.len()]) {
                prop_assert_eq!(verifier.check(&read[from..to]), Ok(()));
                from = to;
            }
            prop_assert_eq!(verifier.head(), head.as_deref());
            prop_assert_eq!(verifier.checked(), read.len());
        }

        /// Any character of a stored record changed, where the record still
        /// reads and reads differently, breaks the chain at that record.
        #[test]
        fn a_flipped_character_is_found_where_it_is(
            records in prop::collection::vec(record(), 1..6),
            at in any::<prop::sample::Index>(),
            place in any::<prop::sample::Index>(),
            by in prop::char::ranges(vec!['a'..='z', '0'..='9'].into()),
        ) {
            let (mut read, texts, _) = chain(&records);
            let i = at.index(read.len());
            let text = &texts[i];
            let spots: Vec<usize> = text
                .char_indices()
                .filter(|(_, c)| c.is_ascii_alphanumeric() && *c != by)
                .map(|(k, _)| k)
                .collect();
            prop_assume!(!spots.is_empty());
            let k = spots[place.index(spots.len())];
            let flipped = format!("{}{by}{}", &text[..k], &text[k + 1..]);
            let Ok(changed) = serde_json::from_str::<StepRecord>(&flipped) else {
                return Ok(()); // no longer a record: the store refuses it
            };
            if changed == read[i] {
                return Ok(()); // a key no field reads: the same record
            }
            read[i] = changed;
            let broken = verify_chain(&read).expect_err("the change went unnoticed");
            prop_assert_eq!(broken.index, i + 1, "{:?} in {}", broken, flipped);
        }

        /// A record removed (but the last), repeated, or two swapped breaks
        /// the chain where the order goes wrong; the last removed leaves a
        /// shorter chain with another head.
        #[test]
        fn a_removed_repeated_or_swapped_record_is_found(
            records in prop::collection::vec(record(), 2..8),
            at in any::<prop::sample::Index>(),
            other in any::<prop::sample::Index>(),
            how in 0u8..3,
        ) {
            let (read, _, head) = chain(&records);
            let n = read.len();
            let (i, j) = (at.index(n), other.index(n));
            let mut changed = read.clone();
            let (index, problem) = match how {
                0 if i == n - 1 => {
                    changed.pop();
                    let shorter = verify_chain(&changed);
                    prop_assert_eq!(&shorter, &Ok(read[n - 2].record_hash.clone()));
                    prop_assert_ne!(shorter, Ok(head));
                    return Ok(());
                }
                0 => {
                    changed.remove(i);
                    (i + 1, "removed or reordered")
                }
                1 => {
                    changed.insert(i + 1, read[i].clone());
                    (i + 2, "removed or reordered")
                }
                _ => {
                    prop_assume!(i != j);
                    changed.swap(i, j);
                    (i.min(j) + 1, "removed or reordered")
                }
            };
            let broken = verify_chain(&changed).expect_err("the change went unnoticed");
            prop_assert_eq!((broken.index, broken.problem), (index, problem));
        }

        /// A record whose hash is gone is unchained; one whose hash or
        /// link to the one before is changed is found there.
        #[test]
        fn a_changed_hash_is_found_where_it_is(
            records in prop::collection::vec(record(), 1..6),
            at in any::<prop::sample::Index>(),
            how in 0u8..3,
        ) {
            let (mut read, _, _) = chain(&records);
            let i = at.index(read.len());
            let r = &mut read[i];
            let problem = match how {
                0 => {
                    r.record_hash = None;
                    "unchained"
                }
                1 => {
                    let hash = r.record_hash.as_mut().expect("linked");
                    let flipped = if hash.starts_with('0') { "1" } else { "0" };
                    hash.replace_range(..1, flipped);
                    "changed"
                }
                _ => {
                    r.prev_hash = match r.prev_hash.take() {
                        Some(_) => None,
                        None => Some("0".repeat(64)),
                    };
                    "removed or reordered"
                }
            };
            let broken = verify_chain(&read).expect_err("the change went unnoticed");
            prop_assert_eq!((broken.index, broken.problem), (i + 1, problem));
        }
    }
}

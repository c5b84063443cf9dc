//! The SQLite store: the embedded default. One database file in WAL mode.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction: it takes SQLite's write
//! lock before it reads, so two processes never both read a run and both
//! write it; a step's ledger records and its run save commit together, and
//! the run's `version` column is compared and bumped in the same statement
//! (the [`Store`] run transaction). Leases are two columns of the run's row
//! (`lease_holder`, `lease_until_us`).
//!
//! Process-crash safe: a committed step survives a killed process. With
//! [`Durability::Normal`] (the default, `synchronous=NORMAL`) a power loss
//! may roll back the last transactions but never corrupts the database;
//! with [`Durability::Full`] every commit is on disk when it returns.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::{Condvar, Mutex};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{
    check_next_version, link_json, wait_due_at, Attribution, Claim, Deferral, Durability,
    FeedEntry, Fence, LeaseAfter, LeaseRequest, NextDue, RunIndexQuery, RunIndexRow, RunIndexer,
    RunQuery, Store, StoreError,
};
use stepwell_model::model::{RunState, RunStatus, StepRecord};

/// The schema version this build writes. A database with a higher
/// `user_version` was written by a newer stepwell and is refused; an older
/// one is migrated when opened.
pub const SCHEMA_VERSION: i64 = 12;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    workflow_id   TEXT NOT NULL,
    status        TEXT NOT NULL,
    wait_reason   TEXT,
    wait_key      TEXT,
    wait_due_us   INTEGER,
    parent_run_id TEXT,
    session_id    TEXT,
    data          TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    data     TEXT NOT NULL,
    hash     TEXT,
    idem_key TEXT
);
CREATE TABLE IF NOT EXISTS commands (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id  TEXT NOT NULL UNIQUE,
    data        TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS command_cursors (
    consumer TEXT PRIMARY KEY,
    seq      INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bundles (
    workflow_id TEXT PRIMARY KEY,
    dir         TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS workflow_versions (
    workflow_id TEXT NOT NULL,
    version     INTEGER NOT NULL,
    digest      TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    deployed_by TEXT,
    source      TEXT,
    PRIMARY KEY (workflow_id, version)
);
CREATE TABLE IF NOT EXISTS bundle_files (
    digest  TEXT NOT NULL,
    path    TEXT NOT NULL,
    content BLOB NOT NULL,
    PRIMARY KEY (digest, path)
);
CREATE TABLE IF NOT EXISTS compiled_digests (
    name    TEXT PRIMARY KEY,
    sha256  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS inbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    stream      TEXT NOT NULL,
    dedupe_key  TEXT NOT NULL,
    data        TEXT NOT NULL,
    UNIQUE (stream, dedupe_key)
);
CREATE TABLE IF NOT EXISTS connections (
    connection_id TEXT PRIMARY KEY,
    data          TEXT NOT NULL
);
";

/// Columns added after schema 1, with their types: added to an older
/// database when it is opened.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("ledger", "hash", "TEXT"),
    ("ledger", "idem_key", "TEXT"),
    ("runs", "version", "INTEGER NOT NULL DEFAULT 1"),
    ("runs", "lease_holder", "TEXT"),
    ("runs", "lease_until_us", "INTEGER"),
    ("runs", "automation_id", "TEXT"),
    ("runs", "role", "TEXT"),
    ("runs", "occurrence_index", "INTEGER"),
    ("runs", "session_kind", "TEXT"),
    ("runs", "workspace_root", "TEXT"),
    ("runs", "created_at", "TEXT"),
    ("runs", "updated_at", "TEXT"),
    ("runs", "quarantine", "TEXT"),
    ("runs", "ledger_seq", "INTEGER"),
    ("runs", "defer_until_us", "INTEGER"),
    ("runs", "defer_count", "INTEGER"),
    ("runs", "defer_reason", "TEXT"),
    ("runs", "child_ended_us", "INTEGER"),
    ("runs", "orphan_us", "INTEGER"),
    ("runs", "wakes_on", "TEXT"),
];

const INDEXES: &str = "
CREATE INDEX IF NOT EXISTS runs_open ON runs(status, wait_reason, wait_key)
    WHERE status IN ('running', 'waiting');
CREATE INDEX IF NOT EXISTS runs_due ON runs(wait_due_us) WHERE wait_due_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_automation ON runs(automation_id, role, occurrence_index)
    WHERE automation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_session ON runs(session_id, role) WHERE session_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_quarantine ON runs(quarantine) WHERE quarantine IS NOT NULL;
DROP INDEX IF EXISTS ledger_caused;
DROP INDEX IF EXISTS ledger_automation;
CREATE UNIQUE INDEX IF NOT EXISTS ledger_run ON ledger(run_id, seq);
CREATE INDEX IF NOT EXISTS ledger_keyed ON ledger(run_id, idem_key)
    WHERE idem_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS inbox_stream ON inbox(stream, seq);
CREATE INDEX IF NOT EXISTS runs_child_ended ON runs(child_ended_us)
    WHERE child_ended_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_orphan ON runs(orphan_us) WHERE orphan_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_consumer ON runs(wakes_on) WHERE wakes_on IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_unindexed ON runs(session_kind) WHERE session_kind IS NULL;
";

/// The driver's markers of existing rows, set when a database older than
/// schema 9 is migrated: parents waiting on a child that has ended, and
/// unfinished children of cancelled parents (see [`SqliteStore::mark`]).
const MARK_EXISTING: &str = "
UPDATE runs SET child_ended_us = 0
 WHERE status = 'waiting' AND wait_reason = 'subworkflow' AND wait_key LIKE 'subworkflow:%'
   AND EXISTS (SELECT 1 FROM runs c WHERE c.run_id = substr(runs.wait_key, 13)
               AND (c.status IN ('completed', 'failed', 'cancelled') OR c.quarantine IS NOT NULL));
UPDATE runs SET orphan_us = 0
 WHERE status IN ('running', 'waiting') AND parent_run_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM runs p WHERE p.run_id = runs.parent_run_id AND p.status = 'cancelled');
";

// The driver's periodic queries. Each reads an index of what may be due
// (the markers narrow it; a join re-checks the other run by its key, so a
// marker left behind by a run that went back, a restored snapshot, moves
// nothing) (named:
// without statistics SQLite's planner may prefer another index and scan
// every open run), so a pass costs what is due, not what is stored. The
// form `status IN ('running', 'waiting') AND status = 'running'` repeats
// the partial index's own condition, which SQLite needs to use it.
// `tests::periodic_queries_read_only_what_is_due` holds them to it.

/// Due waits ([`Store::list_due`]): ?1 now, ?2 limit.
const DUE: &str = "SELECT run_id FROM runs INDEXED BY runs_due
    WHERE wait_due_us IS NOT NULL AND wait_due_us <= ?1 AND status = 'waiting'
      AND quarantine IS NULL AND COALESCE(defer_until_us, 0) <= ?1
    ORDER BY wait_due_us, rowid LIMIT ?2";

/// When the earliest timed work falls due ([`Store::next_due`]): ?1 the
/// runtime's now (time waits), ?2 the system's now (the rest). As
/// PostgreSQL's: a run counts from when nothing holds it back (its due
/// time, its deferral, a lease someone holds on it); what falls due later
/// by an index seek, a lower bound. (SQLite's `max` of a NULL is NULL, and
/// `min` over a union skips NULLs as `LEAST` does.)
const NEXT_DUE: &str = "SELECT
    (SELECT MIN(x) FROM (
      SELECT MIN(max(COALESCE(defer_until_us, 0),
                     COALESCE(CASE WHEN lease_holder IS NOT NULL THEN lease_until_us END, 0))) AS x
        FROM runs INDEXED BY runs_due
        WHERE wait_due_us IS NOT NULL AND wait_due_us <= ?1
          AND status = 'waiting' AND quarantine IS NULL
      UNION ALL
      SELECT MIN(wait_due_us) FROM runs INDEXED BY runs_due
        WHERE wait_due_us IS NOT NULL AND wait_due_us > ?1
          AND status = 'waiting' AND quarantine IS NULL)),
    (SELECT MIN(x) FROM (
      SELECT MIN(max(COALESCE(defer_until_us, 0),
                     COALESCE(CASE WHEN lease_holder IS NOT NULL THEN lease_until_us END, 0))) AS x
        FROM runs INDEXED BY runs_open
        WHERE status IN ('running', 'waiting') AND status = 'running' AND quarantine IS NULL
          AND COALESCE(defer_until_us, 0) <= ?2
      UNION ALL
      SELECT MIN(COALESCE(defer_until_us, 0)) FROM runs INDEXED BY runs_open
        WHERE status IN ('running', 'waiting') AND status = 'running' AND quarantine IS NULL
          AND COALESCE(defer_until_us, 0) > ?2
      UNION ALL
      SELECT MIN(max(COALESCE(p.defer_until_us, 0),
                     COALESCE(CASE WHEN p.lease_holder IS NOT NULL THEN p.lease_until_us END, 0)))
        FROM runs p JOIN runs c ON c.run_id = substr(p.wait_key, 13)
        WHERE p.child_ended_us IS NOT NULL AND p.status = 'waiting'
          AND p.wait_reason = 'subworkflow' AND p.wait_key LIKE 'subworkflow:%'
          AND p.quarantine IS NULL
          AND (c.status IN ('completed', 'failed', 'cancelled') OR c.quarantine IS NOT NULL)
      UNION ALL
      SELECT MIN(max(COALESCE(c.defer_until_us, 0),
                     COALESCE(CASE WHEN c.lease_holder IS NOT NULL THEN c.lease_until_us END, 0)))
        FROM runs c JOIN runs p ON p.run_id = c.parent_run_id
        WHERE c.orphan_us IS NOT NULL AND c.status IN ('running', 'waiting')
          AND c.quarantine IS NULL AND p.status = 'cancelled'))";

/// Running runs free to claim ([`Store::list_claimable`]): ?1 now, ?2 limit.
const CLAIMABLE: &str = "SELECT run_id FROM runs INDEXED BY runs_open
    WHERE status IN ('running', 'waiting') AND status = 'running'
      AND (lease_holder IS NULL OR lease_until_us < ?1) AND quarantine IS NULL
      AND COALESCE(defer_until_us, 0) <= ?1
    ORDER BY COALESCE(defer_until_us, 0), rowid LIMIT ?2";

/// Running runs with a lease ([`Store::list_leased`]): ?1 limit.
const LEASED: &str = "SELECT run_id, lease_holder FROM runs INDEXED BY runs_open
    WHERE status IN ('running', 'waiting') AND status = 'running'
      AND lease_holder IS NOT NULL AND quarantine IS NULL
    ORDER BY rowid LIMIT ?1";

/// Parents whose child ended ([`Store::list_ended_children`]): ?1 limit,
/// ?2 now.
const ENDED_CHILDREN: &str = "SELECT p.run_id, c.run_id FROM runs p INDEXED BY runs_child_ended
    JOIN runs c ON c.run_id = substr(p.wait_key, 13)
    WHERE p.child_ended_us IS NOT NULL AND p.status = 'waiting'
      AND p.wait_reason = 'subworkflow' AND p.wait_key LIKE 'subworkflow:%'
      AND p.quarantine IS NULL AND COALESCE(p.defer_until_us, 0) <= ?2
      AND (c.status IN ('completed', 'failed', 'cancelled') OR c.quarantine IS NOT NULL)
    ORDER BY p.child_ended_us, p.rowid LIMIT ?1";

/// Unfinished children of cancelled parents ([`Store::list_orphans`]):
/// ?1 limit, ?2 now.
const ORPHANS: &str = "SELECT c.run_id FROM runs c INDEXED BY runs_orphan
    JOIN runs p ON p.run_id = c.parent_run_id
    WHERE c.orphan_us IS NOT NULL AND c.status IN ('running', 'waiting')
      AND c.quarantine IS NULL AND COALESCE(c.defer_until_us, 0) <= ?2
      AND p.status = 'cancelled'
    ORDER BY c.orphan_us, c.rowid LIMIT ?1";

/// The controllers an event of a connection would wake
/// ([`Store::list_consumers`]): ?1 the connection.
const CONSUMERS_OF: &str = "SELECT run_id FROM runs INDEXED BY runs_consumer
    WHERE wakes_on = ?1 AND quarantine IS NULL ORDER BY rowid";

/// The controllers an event of any connection would wake.
const CONSUMERS: &str = "SELECT run_id FROM runs INDEXED BY runs_consumer
    WHERE wakes_on IS NOT NULL AND quarantine IS NULL ORDER BY rowid";

/// A run's ledger records with a key ([`Store::find_records`]): ?1 run,
/// ?2 key.
const KEYED: &str = "SELECT seq, data FROM ledger INDEXED BY ledger_keyed
    WHERE run_id = ?1 AND idem_key = ?2 ORDER BY id";

/// A run's last record (?1 the run): its seq and hash.
const LEDGER_HEAD: &str =
    "SELECT seq, hash FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1";

/// A run's records after seq ?2 (?1 the run), in order.
const RECORDS_AFTER: &str =
    "SELECT seq, data FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 AND seq > ?2 ORDER BY seq";

/// The change feed: the records after position ?1 (at most ?2), in the
/// order they were committed.
const FEED: &str = "SELECT id, run_id, seq FROM ledger WHERE id > ?1 ORDER BY id LIMIT ?2";

/// Marks the parent waiting on a child that ended: ?1 now, ?2 the child.
const MARK_PARENT: &str = "UPDATE runs INDEXED BY runs_open SET child_ended_us = ?1
    WHERE status IN ('running', 'waiting') AND status = 'waiting'
      AND wait_reason = 'subworkflow' AND wait_key = 'subworkflow:' || ?2
      AND child_ended_us IS NULL";

/// SQLite's marks (`?1`) and creation order (`rowid`, which an update
/// keeps).
const DIALECT: super::SqlDialect = super::SqlDialect {
    mark: |n| format!("?{n}"),
    order: "rowid",
};

/// The columns every statement on `runs` binds, as ?1 run_id,
/// ?2 workflow_id, ?3 status, ?4 wait_reason, ?5 wait_key, ?6 wait_due_us,
/// ?7 parent_run_id, ?8 session_id, ?9 data, ?10 version,
/// ?11 automation_id, ?12 role, ?13 occurrence_index, ?14 session_kind,
/// ?15 workspace_root, ?16 created_at, ?17 updated_at, ?18 lease_holder,
/// ?19 lease_until_us, ?20 the fenced version, ?21 the fence's holder,
/// ?22 the time a taking fence takes a lapsed lease at, ?23 the ledger's
/// last seq after the commit, ?24 wakes_on.
const INSERT_RUN: &str = "INSERT INTO runs (run_id, workflow_id, status, wait_reason, wait_key,
        wait_due_us, parent_run_id, session_id, data, version, automation_id, role,
        occurrence_index, session_kind, workspace_root, created_at, updated_at,
        lease_holder, lease_until_us, ledger_seq, wakes_on)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?23,
        ?24)
    ON CONFLICT(run_id) DO NOTHING";

/// A save that changes no indexed column sets only the data, version,
/// times and lease: no index page is written. A run's attribution columns
/// (?11..?14, ?24) are the indexer's: a save whose indexer gives no
/// session kind (a process without one) keeps those the row has, in both
/// updates.
const UPDATE_DATA: &str = "UPDATE runs SET data = ?9, version = ?10, updated_at = ?17,
        lease_holder = ?18, lease_until_us = ?19, ledger_seq = ?23, defer_until_us = NULL,
        defer_count = NULL, defer_reason = NULL
    WHERE run_id = ?1 AND version = ?20 AND (?21 IS NULL OR lease_holder = ?21
        OR (?22 IS NOT NULL AND (lease_holder IS NULL OR lease_until_us < ?22)))
      AND quarantine IS NULL
      AND workflow_id = ?2 AND status = ?3 AND wait_reason IS ?4 AND wait_key IS ?5
      AND wait_due_us IS ?6 AND parent_run_id IS ?7 AND session_id IS ?8
      AND workspace_root IS ?15 AND (?14 IS NULL OR (automation_id IS ?11 AND role IS ?12
        AND occurrence_index IS ?13 AND session_kind IS ?14 AND wakes_on IS ?24))";

const UPDATE_ALL: &str = "UPDATE runs SET workflow_id = ?2, status = ?3, wait_reason = ?4,
        wait_key = ?5, wait_due_us = ?6, parent_run_id = ?7, session_id = ?8, data = ?9,
        version = ?10, automation_id = CASE WHEN ?14 IS NULL THEN automation_id ELSE ?11 END,
        role = CASE WHEN ?14 IS NULL THEN role ELSE ?12 END,
        occurrence_index = CASE WHEN ?14 IS NULL THEN occurrence_index ELSE ?13 END,
        session_kind = COALESCE(?14, session_kind), workspace_root = ?15, updated_at = ?17,
        lease_holder = ?18,
        lease_until_us = ?19, ledger_seq = ?23, defer_until_us = NULL, defer_count = NULL,
        defer_reason = NULL, child_ended_us = NULL,
        orphan_us = CASE WHEN ?3 IN ('running', 'waiting') THEN orphan_us END,
        wakes_on = CASE WHEN ?14 IS NULL THEN wakes_on ELSE ?24 END
    WHERE run_id = ?1 AND version = ?20 AND (?21 IS NULL OR lease_holder = ?21
        OR (?22 IS NOT NULL AND (lease_holder IS NULL OR lease_until_us < ?22)))
      AND quarantine IS NULL";

/// A run as a `runs` row.
struct RunRow<'a> {
    run: &'a RunState,
    data: String,
    due: Option<i64>,
    attribution: Attribution,
}

impl<'a> RunRow<'a> {
    fn new(run: &'a RunState, indexer: &dyn RunIndexer) -> Result<Self, StoreError> {
        Ok(RunRow {
            run,
            data: super::json_text(run, 1024)
                .map_err(|e| StoreError::io(format!("run {}: cannot encode: {e}", run.run_id)))?,
            due: wait_due_at(run).map(|t| t.timestamp_micros()),
            attribution: indexer.index(run),
        })
    }

    fn execute(
        &self,
        conn: &Connection,
        sql: &str,
        lease: (Option<&str>, Option<i64>),
        fence: &Fence<'_>,
        ledger_seq: Option<i64>,
    ) -> rusqlite::Result<usize> {
        let (run, w, a) = (self.run, self.run.waiting.as_ref(), &self.attribution);
        let take = fence.take.map(|t| t.timestamp_micros());
        let values: [&dyn rusqlite::ToSql; 24] = [
            &run.run_id,
            &run.workflow_id,
            &run.status.as_str(),
            &w.map(|w| w.reason.as_str()),
            &w.map(|w| w.wait_key.as_str()),
            &self.due,
            &run.parent_run_id,
            &run.session_id,
            &self.data,
            &(run.version as i64),
            &a.automation_id,
            &a.role,
            &a.occurrence_index,
            &a.session_kind,
            &a.workspace_root,
            &run.created_at,
            &run.updated_at,
            &lease.0,
            &lease.1,
            &(fence.version as i64),
            &fence.holder,
            &take,
            &ledger_seq,
            &a.wakes_on,
        ];
        let mut st = conn.prepare_cached(sql)?;
        // Each statement uses the columns up to its highest parameter.
        let n = st.parameter_count();
        st.execute(rusqlite::params_from_iter(values.into_iter().take(n)))
    }
}

/// Why opening a database failed: busy (worth another try) or not.
enum SetupError {
    Busy(rusqlite::Error),
    Other(StoreError),
}

/// Runs and ledgers in one SQLite database file. Runs list in creation
/// order (the row id, which an update keeps).
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
    /// A second connection for reading runs (opened on first use): in WAL
    /// mode a reader does not wait for a writer, so an API read never
    /// queues behind the commits of runs being executed.
    reader: Mutex<Option<Connection>>,
    group: CommitQueue,
    heads: Mutex<LedgerHeads>,
    indexer: super::index::IndexerSlot,
}

/// Where the ledgers of the runs this store committed end, by run: a
/// commit takes its run's last `(seq, hash)` from here instead of reading
/// the ledger (a query that was a fifth of a SQLite step's instructions).
///
/// An end is kept with the run's version after the commit that wrote it,
/// and used only by a commit that starts from that version, which the
/// commit's fence then finds in the file in the same transaction: the
/// file holds that commit, so its ledger ends there or later (an online
/// restore or another writer that rolled the run back left an older
/// version, and the commit reads the real end). Later is caught by the
/// append: records take seqs one after another and `ledger_run` is unique,
/// so if another writer appended since (evidence, records ahead), the
/// record's seq is taken, its insert fails, and the append reads the real
/// end and links the record again. Ends are kept only once their
/// transaction committed (`staged` until then; a savepoint rolled back
/// drops its own), appends outside a commit forget the runs they touch,
/// and a run's end is forgotten when a commit finishes it. Bounded: past
/// [`LedgerHeads::MAX`] runs it starts again empty.
#[derive(Default)]
struct LedgerHeads {
    kept: std::collections::HashMap<String, KeptHead>,
    /// What the transaction under way appended, in order: an end to keep,
    /// or `None` to forget the run's.
    staged: Vec<(String, Option<KeptHead>)>,
}

/// A run's ledger end as its last commit left it.
struct KeptHead {
    seq: i64,
    hash: String,
    /// The run's version after that commit.
    version: u64,
    /// When the run was created: a run deleted (retention) and created
    /// again under its id starts at low versions again, and must not
    /// find the ledger end of the one before.
    created_at: String,
}

impl LedgerHeads {
    /// How many runs' ends are kept at most.
    const MAX: usize = 4096;

    /// The ledger end of `run_id` for a commit from `version`, if this
    /// store's last commit of the run left it at that version.
    fn get(&self, run_id: &str, version: u64, created_at: &str) -> Option<(i64, String)> {
        self.kept
            .get(run_id)
            .filter(|k| k.version == version && k.created_at == created_at)
            .map(|k| (k.seq, k.hash.clone()))
    }

    /// Keeps (or forgets) what the committed transaction appended.
    fn commit(&mut self) {
        if self.kept.len() + self.staged.len() > Self::MAX {
            self.kept.clear();
        }
        for (id, head) in self.staged.drain(..) {
            match (head, self.kept.get_mut(&id)) {
                (Some(head), Some(kept)) => *kept = head,
                (Some(head), None) => {
                    self.kept.insert(id, head);
                }
                (None, _) => {
                    self.kept.remove(&id);
                }
            }
        }
    }
}

/// Group commit: the run commits of this process's threads that arrive
/// while one is being written wait here, and whoever writes next writes
/// them all in one transaction (each in a savepoint of its own, so a fence
/// that does not hold undoes only its own commit). A lone commit is
/// written at once; under load the wait is at most one transaction, and
/// many steps share its write-ahead-log pages and its lock.
#[derive(Default)]
struct CommitQueue {
    state: Mutex<QueueState>,
    turn: Condvar,
    /// Commits written in a group with others, since the store was opened.
    grouped: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct QueueState {
    /// Whether a thread is writing a group now.
    writing: bool,
    /// The commits waiting for the next group, oldest first.
    waiting: Vec<Arc<Queued>>,
}

/// A commit waiting in the queue: its own copy of what it commits, and its
/// outcome once written.
struct Queued {
    records: Vec<StepRecord>,
    run: RunState,
    version: u64,
    holder: Option<String>,
    take: Option<DateTime<Utc>>,
    lease: LeaseAfter,
    outcome: Mutex<Option<Result<(), StoreError>>>,
}

impl Queued {
    fn fence(&self) -> Fence<'_> {
        Fence {
            version: self.version,
            holder: self.holder.as_deref(),
            take: self.take,
        }
    }
}

/// The thread writing a group. However it ends (a panic included), each
/// commit of the group has an outcome, and the next group may start.
struct Writing<'a> {
    store: &'a SqliteStore,
    group: Vec<Arc<Queued>>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        for q in &self.group {
            let mut outcome = q.outcome.lock();
            if outcome.is_none() {
                *outcome = Some(Err(StoreError::io(format!(
                    "{}: the thread writing this commit's group failed before its outcome was known (read the run again)",
                    self.store.path.display()
                ))));
            }
        }
        self.store.group.state.lock().writing = false;
        self.store.group.turn.notify_all();
    }
}

/// The most commits one group writes (the rest wait for the next).
const MAX_GROUP: usize = 64;

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish()
    }
}

fn db_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`, and its parent
    /// directory, with [`Durability::Normal`]. Refuses a database written by
    /// a newer schema; migrates an older one. The file is created `0600`
    /// (its `-wal` and `-shm` take its mode) and the folder `0700`; a
    /// database file that is a link, another user's or writable by others,
    /// or a folder that is neither this user's nor root's, or that others
    /// may write without its sticky bit, is refused (`store_unsafe`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(path, Durability::Normal)
    }

    /// [`SqliteStore::open`] with a durability setting.
    pub fn open_with(path: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        super::private::create_dir(dir).map_err(|e| db_err(dir, e))?;
        super::private::check_parent(dir)
            .map_err(|why| super::private::refused(dir, "the database's folder", &why))?;
        super::private::prepare_db_file(&path)?;
        // Several processes may open (and create, and migrate) one file at
        // the same moment: switching to WAL and the first schema need locks
        // that SQLite's busy handler does not always wait for, so the whole
        // setup is tried again while the file is busy.
        let started = std::time::Instant::now();
        loop {
            match Self::setup(&path, durability) {
                Err(SetupError::Busy(e)) if started.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(SetupError::Busy(e)) => return Err(db_err(&path, e)),
                Err(SetupError::Other(e)) => return Err(e),
                Ok(conn) => {
                    return Ok(SqliteStore {
                        path,
                        conn: Mutex::new(conn),
                        reader: Mutex::new(None),
                        group: CommitQueue::default(),
                        heads: Mutex::default(),
                        indexer: Default::default(),
                    })
                }
            }
        }
    }

    fn setup(path: &Path, durability: Durability) -> Result<Connection, SetupError> {
        let err = |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                SetupError::Busy(e)
            }
            _ => SetupError::Other(db_err(path, e)),
        };
        let mut conn = open_connection(path).map_err(err)?;
        configure(&conn, durability).map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if version > SCHEMA_VERSION {
            return Err(SetupError::Other(StoreError {
                code: "store_schema",
                message: format!(
                    "{}: written by a newer stepwell (schema {version}, this build reads up to {SCHEMA_VERSION}); refusing to open it",
                    path.display()
                ),
            }));
        }
        if version < SCHEMA_VERSION {
            migrate(&mut conn, version).map_err(err)?;
        }
        // Appends count on `ledger_run` being unique: it refuses a record
        // whose seq another writer took (where a store's kept ledger end
        // was behind). A database where it is not is refused.
        let unique: Option<bool> = conn
            .query_row(
                "SELECT \"unique\" FROM pragma_index_list('ledger') WHERE name = 'ledger_run'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(err)?;
        if unique != Some(true) {
            return Err(SetupError::Other(StoreError::corrupt(format!(
                "{}: the index ledger_run (ledger, by run_id and seq) is missing or not unique \
                 (stepwell creates it so: CREATE UNIQUE INDEX ledger_run ON ledger(run_id, seq))",
                path.display()
            ))));
        }
        Ok(conn)
    }

    /// `read` on the store's reading connection (opened on first use; the
    /// writer's if it cannot be opened).
    fn reading<T>(
        &self,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let mut reader = self.reader.lock();
        if reader.is_none() {
            *reader = open_reader(&self.path).ok();
        }
        match reader.as_ref() {
            Some(conn) => read(conn),
            None => {
                drop(reader);
                read(&self.conn.lock())
            }
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives the pages deleted runs left free back to the file system
    /// (SQLite's `VACUUM`, between two foldings of the write-ahead log into
    /// the file): the size of the file and its log before and after, in
    /// bytes. It rewrites the whole file and holds the write lock
    /// meanwhile: run it with the other processes on the store stopped. A
    /// process reading the store keeps the log from being folded in: that
    /// answers `conflict` (before the rewrite: nothing done; after it: the
    /// rewritten file is in the log, and the next fold shrinks the file).
    pub fn vacuum(&self) -> Result<(u64, u64), StoreError> {
        let len = |p: PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let size = || len(self.path.clone()) + len(PathBuf::from(&wal));
        let conn = self.conn.lock();
        let fold = |when: &str| -> Result<(), StoreError> {
            let busy: i64 = conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
                .map_err(|e| self.err(e))?;
            if busy != 0 {
                return Err(StoreError::conflict(format!(
                    "{}: another process is using the store, so its log could not be folded in {when}: stop the drivers and servers on it, then vacuum again",
                    self.path.display()
                )));
            }
            Ok(())
        };
        fold("before the rewrite")?;
        let before = size();
        conn.execute_batch("VACUUM").map_err(|e| self.err(e))?;
        fold("after the rewrite")?;
        Ok((before, size()))
    }

    /// How many run commits this store (this process) wrote in a group
    /// with others since it was opened: commits of several threads that
    /// were ready together share one transaction.
    pub fn grouped_commits(&self) -> u64 {
        self.group
            .grouped
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        db_err(&self.path, e)
    }

    fn decode_run(&self, run_id: &str, data: &str, version: i64) -> Result<RunState, StoreError> {
        let mut run: RunState = serde_json::from_str(data).map_err(|e| {
            StoreError::corrupt(format!("{}: runs row {run_id:?}: {e}", self.path.display()))
        })?;
        run.version = version as u64;
        Ok(run)
    }

    /// Runs one write transaction, taking SQLite's write lock first. What
    /// `f` wrote is rolled back if `f` fails or panics, or the commit
    /// fails.
    fn write<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.conn.lock();
        if !conn.is_autocommit() {
            // A transaction an earlier failure left open (its rollback
            // failed too): ended here rather than joined or refused.
            conn.execute_batch("ROLLBACK").map_err(|e| self.err(e))?;
        }
        // `BEGIN` and `COMMIT` as cached statements: parsing them again
        // for every transaction took about 1.5% of an ask/resume cycle's
        // time under `perf`.
        exec_cached(&conn, "BEGIN IMMEDIATE").map_err(|e| self.err(e))?;
        self.heads.lock().staged.clear();
        let open = OpenTransaction(&conn);
        let out = f(&conn)?;
        exec_cached(&conn, "COMMIT").map_err(|e| self.err(e))?;
        drop(open);
        self.heads.lock().commit();
        Ok(out)
    }

    /// Why a fenced write to `run_id` did not land.
    fn conflict(&self, conn: &Connection, run_id: &str, fence: &Fence<'_>) -> StoreError {
        let found: Option<(i64, Option<String>, Option<String>)> = conn
            .prepare_cached("SELECT version, lease_holder, quarantine FROM runs WHERE run_id = ?1")
            .and_then(|mut st| {
                st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .unwrap_or(None);
        StoreError::conflict(match found {
            None if fence.version == 0 => format!("run {run_id}: cannot be created"),
            None => format!("run {run_id} does not exist"),
            Some(_) if fence.version == 0 => format!("run {run_id} already exists"),
            Some((_, _, Some(q))) => format!("run {run_id} is quarantined: {q}"),
            Some((v, _, _)) if v as u64 != fence.version => format!(
                "run {run_id} is at version {v}, not {} (changed by another writer)",
                fence.version
            ),
            Some((_, holder, _)) => format!(
                "run {run_id} is leased by {}, not {}",
                holder.as_deref().unwrap_or("nobody"),
                fence.holder.unwrap_or("-")
            ),
        })
    }

    fn save(
        &self,
        tx: &Connection,
        run: &RunState,
        fence: &Fence<'_>,
        lease: LeaseAfter,
        ledger_seq: i64,
    ) -> Result<(), StoreError> {
        let row = RunRow::new(run, self.indexer.get().as_ref())?;
        let lease = match (lease, fence.holder) {
            (LeaseAfter::Renew(until), Some(h)) => (Some(h), Some(until.timestamp_micros())),
            _ => (None, None),
        };
        let seq = Some(ledger_seq);
        // Whether an indexed column (status, wait, ...) changed: only then
        // can the markers change.
        let (n, changed) = if fence.version == 0 {
            (row.execute(tx, INSERT_RUN, lease, fence, seq), true)
        } else {
            match row.execute(tx, UPDATE_DATA, lease, fence, seq) {
                Ok(0) => (row.execute(tx, UPDATE_ALL, lease, fence, seq), true),
                other => (other, false),
            }
        };
        if n.map_err(|e| self.err(e))? == 0 {
            return Err(self.conflict(tx, &run.run_id, fence));
        }
        if changed {
            self.mark(tx, run)?;
        }
        Ok(())
    }

    /// Keeps the driver's two markers true after `run` was saved (in the
    /// same transaction), so that its periodic queries read an index of
    /// what is due instead of every open run:
    ///
    /// - `child_ended_us` on a parent waiting (reason `subworkflow`) on a
    ///   child that has ended or was quarantined: set when the child ends,
    ///   or when the parent starts waiting on a child that already has;
    ///   cleared by the parent's next save that changes its wait, and when
    ///   the child is unfinished again (a restored snapshot);
    /// - `orphan_us` on an unfinished child of a cancelled parent: set when
    ///   the parent is cancelled, or when a child is saved unfinished under
    ///   a parent already cancelled; cleared when the child ends.
    ///
    /// Called when the save changed an indexed column (a new run, a new
    /// status or wait): a save that changes none cannot change a marker.
    fn mark(&self, tx: &Connection, run: &RunState) -> Result<(), StoreError> {
        let now = Utc::now().timestamp_micros();
        let exec = |sql: &str, args: &[&dyn rusqlite::ToSql]| {
            tx.prepare_cached(sql)
                .and_then(|mut st| st.execute(args))
                .map_err(|e| self.err(e))
        };
        if run.status != RunStatus::Cancelled {
            // Not (or no longer: a restored snapshot) cancelled: its
            // children are nobody's orphans.
            exec(
                "UPDATE runs SET orphan_us = NULL WHERE parent_run_id = ?1 AND orphan_us IS NOT NULL",
                &[&run.run_id],
            )?;
        }
        if run.status.is_terminal() {
            mark_parent(tx, &run.run_id, now).map_err(|e| self.err(e))?;
            if run.status == RunStatus::Cancelled {
                exec(
                    "UPDATE runs SET orphan_us = ?1 WHERE parent_run_id = ?2
                       AND status IN ('running', 'waiting') AND orphan_us IS NULL",
                    &[&now, &run.run_id],
                )?;
            }
            return Ok(());
        }
        // Unfinished (again, maybe): a parent marked for it is not due.
        exec(
            "UPDATE runs INDEXED BY runs_open SET child_ended_us = NULL
              WHERE status IN ('running', 'waiting') AND status = 'waiting'
                AND wait_reason = 'subworkflow' AND wait_key = 'subworkflow:' || ?1
                AND child_ended_us IS NOT NULL",
            &[&run.run_id],
        )?;
        let child = run
            .waiting
            .as_ref()
            .filter(|w| run.status == RunStatus::Waiting && w.reason.as_str() == "subworkflow")
            .and_then(|w| w.wait_key.strip_prefix("subworkflow:"));
        if let Some(child) = child {
            exec(
                "UPDATE runs SET child_ended_us = ?1 WHERE run_id = ?2 AND child_ended_us IS NULL
                   AND EXISTS (SELECT 1 FROM runs c WHERE c.run_id = ?3
                     AND (c.status IN ('completed', 'failed', 'cancelled')
                          OR c.quarantine IS NOT NULL))",
                &[&now, &run.run_id, &child],
            )?;
        }
        if let Some(parent) = &run.parent_run_id {
            exec(
                "UPDATE runs SET orphan_us = CASE WHEN EXISTS
                   (SELECT 1 FROM runs p WHERE p.run_id = ?3 AND p.status = 'cancelled')
                   THEN COALESCE(orphan_us, ?1) END
                 WHERE run_id = ?2",
                &[&now, &run.run_id, parent],
            )?;
        }
        Ok(())
    }

    /// Takes the writer's turn with the next group (the oldest waiting
    /// commits, at most [`MAX_GROUP`]); the turn ends when the returned
    /// guard is dropped.
    fn take_turn(&self, state: &mut QueueState) -> Writing<'_> {
        state.writing = true;
        let n = state.waiting.len().min(MAX_GROUP);
        Writing {
            store: self,
            group: state.waiting.drain(..n).collect(),
        }
    }

    /// Writes one group of run commits in one transaction: `own` (the
    /// writing thread's, borrowed) and `queued` (other threads', whose
    /// outcomes are set). Returns `own`'s outcome.
    fn write_group(
        &self,
        own: Option<(&[StepRecord], &RunState, &Fence<'_>, LeaseAfter)>,
        queued: &[Arc<Queued>],
    ) -> Result<(), StoreError> {
        if queued.is_empty() {
            // Alone: no savepoint needed, a failed fence rolls it all back.
            let Some((records, run, fence, lease)) = own else {
                return Ok(());
            };
            return self.write(|tx| self.commit_on(tx, records, run, fence, lease));
        }
        let members = queued.len() as u64 + u64::from(own.is_some());
        let written = self.write(|tx| {
            let mine = match own {
                Some((records, run, fence, lease)) => {
                    self.in_savepoint(tx, |tx| self.commit_on(tx, records, run, fence, lease))?
                }
                None => Ok(()),
            };
            let mut theirs = Vec::with_capacity(queued.len());
            for q in queued {
                theirs.push(self.in_savepoint(tx, |tx| {
                    self.commit_on(tx, &q.records, &q.run, &q.fence(), q.lease)
                })?);
            }
            Ok((mine, theirs))
        });
        match written {
            Ok((mine, theirs)) => {
                if members > 1 {
                    self.group
                        .grouped
                        .fetch_add(members, std::sync::atomic::Ordering::Relaxed);
                }
                for (q, outcome) in queued.iter().zip(theirs) {
                    *q.outcome.lock() = Some(outcome);
                }
                mine
            }
            // The transaction as a whole failed: none of it landed.
            Err(e) => {
                for q in queued {
                    *q.outcome.lock() = Some(Err(e.clone()));
                }
                Err(e)
            }
        }
    }

    /// Runs `f` in a savepoint: its writes are undone if it fails, the
    /// transaction's others kept. The outer error is the database's own
    /// failure (the transaction cannot go on); the inner one is `f`'s.
    fn in_savepoint(
        &self,
        tx: &Connection,
        f: impl FnOnce(&Connection) -> Result<(), StoreError>,
    ) -> Result<Result<(), StoreError>, StoreError> {
        let run = |sql: &str| exec_cached(tx, sql).map_err(|e| self.err(e));
        run("SAVEPOINT run_commit")?;
        let staged = self.heads.lock().staged.len();
        let outcome = f(tx);
        if outcome.is_err() {
            self.heads.lock().staged.truncate(staged);
            run("ROLLBACK TO run_commit")?;
        }
        run("RELEASE run_commit")?;
        Ok(outcome)
    }

    /// One run commit inside a transaction: the records, then the run
    /// with where its ledger now ends; a fence that does not hold fails
    /// it (the caller undoes what it wrote).
    fn commit_on(
        &self,
        tx: &Connection,
        records: &[StepRecord],
        run: &RunState,
        fence: &Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        let heads = self.append_on(
            tx,
            records,
            Some((&run.run_id, fence.version, &run.created_at)),
        )?;
        let seq = match heads.iter().find(|(id, _, _)| *id == run.run_id) {
            Some((_, seq, _)) => *seq,
            None => self.last_seq(tx, &run.run_id)?,
        };
        {
            // The run's end is kept for its next commit (from the version
            // this one writes) unless this commit finishes it; the ends of
            // other runs' records appended with it are forgotten.
            let mut kept = self.heads.lock();
            for (id, seq, hash) in heads {
                let keep = id == run.run_id && !run.status.is_terminal();
                let head = hash.filter(|_| keep).map(|hash| KeptHead {
                    seq,
                    hash,
                    version: run.version,
                    created_at: run.created_at.clone(),
                });
                kept.staged.push((id, head));
            }
        }
        self.save(tx, run, fence, lease, seq)
    }

    /// The seq of the run's last ledger record (0 for none).
    fn last_seq(&self, conn: &Connection, run_id: &str) -> Result<i64, StoreError> {
        self.ledger_head(conn, run_id).map(|(seq, _)| seq)
    }

    /// Checks `fence` for each run of `records` (appends ahead).
    fn check_fence(
        &self,
        tx: &Connection,
        records: &[StepRecord],
        fence: &Fence<'_>,
    ) -> Result<(), StoreError> {
        let mut checked: Vec<&str> = Vec::new();
        for r in records {
            if checked.contains(&r.run_id.as_str()) {
                continue;
            }
            let ok = tx
                .prepare_cached(
                    "SELECT 1 FROM runs WHERE run_id = ?1 AND version = ?2
                       AND (?3 IS NULL OR lease_holder = ?3
                         OR (?4 IS NOT NULL AND (lease_holder IS NULL OR lease_until_us < ?4)))
                       AND quarantine IS NULL",
                )
                .and_then(|mut st| {
                    st.exists(params![
                        r.run_id,
                        fence.version as i64,
                        fence.holder,
                        fence.take.map(|t| t.timestamp_micros())
                    ])
                })
                .map_err(|e| self.err(e))?;
            if !ok {
                return Err(self.conflict(tx, &r.run_id, fence));
            }
            checked.push(&r.run_id);
        }
        Ok(())
    }

    /// Appends `records`, linking each into its run's chain; returns each
    /// run's `(id, last seq, last hash)`. `commit`: the run a commit saves
    /// with them and the version it starts from, whose ledger end may be
    /// taken from `self.heads` (or, for a run the commit creates, taken as
    /// empty), checked by `ledger_run`.
    fn append_on(
        &self,
        conn: &Connection,
        records: &[StepRecord],
        commit: Option<(&str, u64, &str)>,
    ) -> Result<Vec<(String, i64, Option<String>)>, StoreError> {
        // Each run's (id, last seq, last hash, whether that end is a guess
        // rather than read from the ledger).
        let mut heads: Vec<(&str, i64, Option<String>, bool)> = Vec::new();
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO ledger (run_id, seq, data, hash, idem_key) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(|e| self.err(e))?;
        for r in records {
            let i = match heads.iter().position(|h| h.0 == r.run_id) {
                Some(i) => i,
                None => {
                    let guess = match commit {
                        Some((id, 0, _)) if id == r.run_id => Some((0, None)),
                        Some((id, version, created)) if id == r.run_id => self
                            .heads
                            .lock()
                            .get(id, version, created)
                            .map(|(seq, hash)| (seq, Some(hash))),
                        _ => None,
                    };
                    heads.push(match guess {
                        Some((seq, hash)) => (&r.run_id, seq, hash, true),
                        None => {
                            let (seq, hash) = self.ledger_head(conn, &r.run_id)?;
                            (&r.run_id, seq, hash, false)
                        }
                    });
                    heads.len() - 1
                }
            };
            let head = &mut heads[i];
            let mut hash = head.2.clone();
            let mut data = link_json(&mut hash, r);
            let mut written =
                insert.execute(params![r.run_id, head.1 + 1, data, hash, r.idempotency_key]);
            if head.3 && is_unique_violation(&written) {
                // Another writer appended after the end guessed here: read
                // the real one and link the record again.
                let (seq, real) = self.ledger_head(conn, &r.run_id)?;
                (head.1, head.2, head.3) = (seq, real, false);
                hash = head.2.clone();
                data = link_json(&mut hash, r);
                written =
                    insert.execute(params![r.run_id, head.1 + 1, data, hash, r.idempotency_key]);
            }
            written.map_err(|e| self.err(e))?;
            head.1 += 1;
            head.2 = hash;
            head.3 = false;
        }
        // The records' `id`s (the next after the largest, under the write
        // lock) are the store-wide change feed (`Store::list_feed`), in
        // commit order across processes. Retention deletes ledger rows but
        // never the newest: were it deleted, its id would be given again
        // (the table is not AUTOINCREMENT, which would cost a page per
        // commit).
        Ok(heads
            .into_iter()
            .map(|(id, seq, hash, _)| (id.to_string(), seq, hash))
            .collect())
    }

    /// Appends `records` outside any transition of their runs (evidence,
    /// a compaction's seal): a run with nothing ahead moves its committed
    /// mark past them.
    fn append_outside(&self, tx: &Connection, records: &[StepRecord]) -> Result<(), StoreError> {
        // Evidence outside any transition is not ahead of the state: a
        // run with nothing ahead moves its committed mark past it.
        let mut before = Vec::new();
        for id in records.iter().map(|r| r.run_id.as_str()) {
            if !before.iter().any(|(b, _)| *b == id) {
                before.push((id, self.last_seq(tx, id)?));
            }
        }
        let heads = self.append_on(tx, records, None)?;
        self.forget_heads(&heads);
        for (id, seq, _) in heads {
            let was = before.iter().find(|(b, _)| *b == id).map_or(0, |b| b.1);
            tx.execute(
                "UPDATE runs SET ledger_seq = ?2 WHERE run_id = ?1 AND COALESCE(ledger_seq, 0) = ?3",
                params![id, seq, was],
            )
            .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Forgets the ledger ends of the runs `heads` appended to, once the
    /// transaction commits (an append outside a commit).
    fn forget_heads(&self, heads: &[(String, i64, Option<String>)]) {
        let mut kept = self.heads.lock();
        for (id, _, _) in heads {
            kept.staged.push((id.clone(), None));
        }
    }

    /// The `(seq, hash)` of the run's last ledger record, read from the
    /// ledger (`(0, None)` for none).
    fn ledger_head(
        &self,
        conn: &Connection,
        run_id: &str,
    ) -> Result<(i64, Option<String>), StoreError> {
        conn.prepare_cached(LEDGER_HEAD)
            .and_then(|mut st| {
                st.query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()
            })
            .map(|head| head.unwrap_or((0, None)))
            .map_err(|e| self.err(e))
    }

    /// The records `sql` selects (`seq, data`) with `run_id` as `?1` and
    /// `args` after it.
    fn records(
        &self,
        run_id: &str,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<StepRecord>, StoreError> {
        self.read_records(run_id, sql, args, |_, r| r)
    }

    /// The records `sql` selects (`seq, data`), each with its seq.
    fn numbered_records(
        &self,
        run_id: &str,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        self.read_records(run_id, sql, args, |seq, r| (seq, r))
    }

    /// The records `sql` selects (`seq, data`), each as `keep` makes it.
    fn read_records<T>(
        &self,
        run_id: &str,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
        keep: impl Fn(u64, StepRecord) -> T,
    ) -> Result<Vec<T>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let mut all: Vec<&dyn rusqlite::ToSql> = vec![&run_id];
        all.extend_from_slice(args);
        let rows = st
            .query_map(&*all, |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, data) = row.map_err(|e| self.err(e))?;
            let record = serde_json::from_str(&data).map_err(|e| {
                StoreError::corrupt(format!(
                    "{}: ledger row {seq} of run {run_id}: {e}",
                    self.path.display()
                ))
            })?;
            out.push(keep(seq as u64, record));
        }
        Ok(out)
    }

    fn ids(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<String>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(args, |row| row.get::<_, String>(0))
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }
}

/// The columns of a `workflow_versions` row, as [`version_row`] reads them.
const VERSION_COLUMNS: &str =
    "SELECT workflow_id, version, digest, deployed_at, deployed_by, source
    FROM workflow_versions";

fn version_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<crate::WorkflowVersion> {
    Ok(crate::WorkflowVersion {
        workflow_id: r.get(0)?,
        version: r.get(1)?,
        digest: r.get(2)?,
        deployed_at: r.get(3)?,
        deployed_by: r.get(4)?,
        source: r.get(5)?,
    })
}

/// The latest version of `workflow_id`, if any.
fn latest_version(
    conn: &Connection,
    workflow_id: &str,
) -> rusqlite::Result<Option<crate::WorkflowVersion>> {
    conn.prepare_cached(&format!(
        "{VERSION_COLUMNS} WHERE workflow_id = ?1 ORDER BY version DESC LIMIT 1"
    ))?
    .query_row([workflow_id], version_row)
    .optional()
}

/// Keeps `files` under their digest, unless kept already and intact.
fn write_bundle_files(
    conn: &Connection,
    files: &crate::bundles::BundleFiles,
) -> rusqlite::Result<()> {
    let kept: Vec<crate::bundles::BundleFile> = conn
        .prepare_cached("SELECT path, content FROM bundle_files WHERE digest = ?1 ORDER BY path")?
        .query_map([&files.digest], |r| {
            Ok(crate::bundles::BundleFile {
                path: r.get(0)?,
                bytes: r.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    if kept == files.files {
        return Ok(());
    }
    conn.execute(
        "DELETE FROM bundle_files WHERE digest = ?1",
        [&files.digest],
    )?;
    let mut insert = conn
        .prepare_cached("INSERT INTO bundle_files (digest, path, content) VALUES (?1, ?2, ?3)")?;
    for f in &files.files {
        insert.execute(params![files.digest, f.path, f.bytes])?;
    }
    Ok(())
}

/// Brings a database of schema `from` to [`SCHEMA_VERSION`] in one
/// transaction: tables, added columns, their values for existing rows
/// (times from each run's data, idempotency keys from each ledger record),
/// indexes. Attribution is the indexer's ([`reindex`]).
fn migrate(conn: &mut Connection, from: i64) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(SCHEMA)?;
    for (table, column, decl) in ADDED_COLUMNS {
        let exists = tx
            .prepare(&format!(
                "SELECT 1 FROM pragma_table_info('{table}') WHERE name = '{column}'"
            ))?
            .exists([])?;
        if !exists {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
        }
    }
    if from > 0 && from < 3 {
        tx.execute_batch(
            "UPDATE ledger SET idem_key = json_extract(data, '$.idempotency_key')
             WHERE idem_key IS NULL AND json_valid(data);
             UPDATE runs SET ledger_seq = (SELECT MAX(seq) FROM ledger WHERE ledger.run_id = runs.run_id);",
        )?;
        // The attribution columns are left empty: the runtime's indexer
        // fills rows without a session kind when it is installed
        // (`Store::set_indexer`).
        let rows: Vec<(String, String)> = tx
            .prepare("SELECT run_id, data FROM runs")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut update =
            tx.prepare("UPDATE runs SET created_at = ?2, updated_at = ?3 WHERE run_id = ?1")?;
        for (id, data) in rows {
            // A row that does not decode keeps empty columns; its claim
            // reports it (and the driver quarantines it).
            if let Ok(run) = serde_json::from_str::<RunState>(&data) {
                update.execute(params![id, run.created_at, run.updated_at])?;
            }
        }
    }
    if from > 0 && from < 10 {
        rebuild_ledger(&tx)?;
    }
    tx.execute_batch(INDEXES)?;
    if from > 0 && from < 9 {
        tx.execute_batch(MARK_EXISTING)?;
        // The waiting runs an event would wake (`wakes_on`, new in
        // schema 9): indexed again when the runtime's indexer is installed.
        tx.execute_batch("UPDATE runs SET session_kind = NULL WHERE status = 'waiting'")?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()
}

/// How many rows [`reindex`] reads per transaction.
const REINDEX_BATCH: usize = 256;

/// Fills the attribution columns of up to `limit` rows no indexer
/// attributed (no session kind) after row `after`, where `indexer`
/// attributes them; a row that does not decode is left as it is (its
/// claim reports it). The last row read, if there may be more.
fn reindex(
    tx: &Connection,
    indexer: &dyn RunIndexer,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Option<i64>> {
    // A row whose data is not even text is read as no run.
    let rows: Vec<(i64, String, i64, Option<RunState>)> = tx
        .prepare_cached(
            "SELECT rowid, run_id, version, data FROM runs
             WHERE session_kind IS NULL AND rowid > ?1 ORDER BY rowid LIMIT ?2",
        )?
        .query_map(params![after, limit as i64], |r| {
            let run = r
                .get_ref(3)?
                .as_bytes()
                .ok()
                .and_then(|data| serde_json::from_slice::<RunState>(data).ok());
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, run))
        })?
        .collect::<rusqlite::Result<_>>()?;
    let mut update = tx.prepare_cached(
        "UPDATE runs SET automation_id = ?2, role = ?3, occurrence_index = ?4, session_kind = ?5,
            workspace_root = ?6, wakes_on = ?7
         WHERE run_id = ?1 AND version = ?8",
    )?;
    for (_, id, version, run) in &rows {
        let Some(run) = run else {
            continue;
        };
        let a = indexer.index(run);
        if a.session_kind.is_some() {
            update.execute(params![
                id,
                a.automation_id,
                a.role,
                a.occurrence_index,
                a.session_kind,
                a.workspace_root,
                a.wakes_on,
                version
            ])?;
        }
    }
    Ok((rows.len() == limit).then(|| rows.last().map_or(after, |r| r.0)))
}

/// Schema 10: the ledger becomes a table of `id`s in commit order (what
/// the separate `feed` table of one row per append was), with its
/// `(run_id, seq)` key as an index. Appending at the end of a table of
/// ids writes one page where the keyed table's splits wrote three, and the
/// feed's page is no longer written at all. The records keep their feed
/// order (records older than the feed first): a position a client held
/// before the upgrade reads no later than the same records now (it may
/// see some again, never miss one).
fn rebuild_ledger(tx: &Connection) -> rusqlite::Result<()> {
    let exists = |sql: &str| tx.prepare(sql)?.exists([]);
    if exists("SELECT 1 FROM pragma_table_info('ledger') WHERE name = 'id'")? {
        return Ok(());
    }
    // A view of the operator's on `ledger` must not stop the upgrade: the
    // legacy rename leaves it naming `ledger`, the new table by then.
    tx.execute_batch(
        "PRAGMA legacy_alter_table = ON;
         ALTER TABLE ledger RENAME TO ledger_v9;
         PRAGMA legacy_alter_table = OFF;",
    )?;
    tx.execute_batch(SCHEMA)?;
    let order = if exists("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'feed'")? {
        tx.execute_batch("CREATE INDEX feed_by_run ON feed(run_id, from_seq);")?;
        "COALESCE((SELECT f.seq FROM feed f WHERE f.run_id = l.run_id AND f.from_seq <= l.seq
                   ORDER BY f.from_seq DESC LIMIT 1), 0), l.run_id, l.seq"
    } else {
        "l.run_id, l.seq"
    };
    tx.execute_batch(&format!(
        "INSERT INTO ledger (run_id, seq, data, hash, idem_key)
           SELECT l.run_id, l.seq, l.data, l.hash, l.idem_key FROM ledger_v9 l ORDER BY {order};
         DROP TABLE ledger_v9;
         DROP TABLE IF EXISTS feed;"
    ))
}

/// Marks the parent waiting on `child` (if one does): its child has ended
/// or was set aside, and the driver's next pass resumes it.
fn mark_parent(conn: &Connection, child: &str, now: i64) -> rusqlite::Result<usize> {
    conn.prepare_cached(MARK_PARENT)?
        .execute(params![now, child])
}

/// Opens a connection to the database at `path` as the store does: through
/// the store's file layer ([`super::sqlite_vfs`]: a transaction's log
/// writes reach the kernel as one), not yet configured (see [`configure`]).
pub fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    super::sqlite_vfs::register().map_err(|e| {
        rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(e),
        )
    })?;
    let conn = Connection::open_with_flags_and_vfs(
        path,
        rusqlite::OpenFlags::default(),
        super::sqlite_vfs::VFS_NAME,
    )?;
    // Room for every statement the store runs (rusqlite keeps 16): a
    // driver's queries, the commits' and the transactions' own statements
    // stay prepared rather than evict each other.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// A read-only connection to the store's file (the store's writer opened
/// and migrated it already).
fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = open_connection(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "query_only", true)?;
    conn.pragma_update(None, "mmap_size", 32i64 << 20)?;
    Ok(conn)
}

/// How many prepared statements a store connection keeps.
const STATEMENT_CACHE: usize = 128;

/// Sets a connection up as the store's are: a 10 s busy timeout, WAL,
/// `synchronous` by `durability`, a checkpoint every 16,384 pages (64 MiB)
/// of WAL instead of every 1,000, a 32 MiB memory map. (`stepwell bench`
/// measures the raw commit ceiling with the same settings.)
pub fn configure(conn: &Connection, durability: Durability) -> rusqlite::Result<()> {
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match durability {
        Durability::Normal => "NORMAL",
        Durability::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "wal_autocheckpoint", 16384)?;
    conn.pragma_update(None, "mmap_size", 32i64 << 20)
}

impl Store for SqliteStore {
    fn indexer(&self) -> std::sync::Arc<dyn RunIndexer> {
        self.indexer.get()
    }

    fn set_indexer(&self, indexer: std::sync::Arc<dyn RunIndexer>) -> Result<(), StoreError> {
        self.indexer.set(indexer.clone());
        // Read first: every runtime built on the store installs its
        // indexer, and a store with nothing to index takes no write lock.
        let pending: bool = self
            .conn
            .lock()
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE session_kind IS NULL)")
            .and_then(|mut st| st.query_row([], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        if !pending {
            return Ok(());
        }
        let mut after = 0;
        loop {
            let pending = self.write(|tx| {
                reindex(tx, indexer.as_ref(), after, REINDEX_BATCH).map_err(|e| self.err(e))
            })?;
            match pending {
                Some(last) => after = last,
                None => return Ok(()),
            }
        }
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        let row: Option<(String, i64)> = self
            .reading(|conn| {
                conn.prepare_cached("SELECT data, version FROM runs WHERE run_id = ?1")?
                    .query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        row.map(|(d, v)| self.decode_run(run_id, &d, v)).transpose()
    }

    fn run_status(&self, run_id: &str) -> Result<Option<RunStatus>, StoreError> {
        let status: Option<String> = self
            .reading(|conn| {
                conn.prepare_cached("SELECT status FROM runs WHERE run_id = ?1")?
                    .query_row([run_id], |r| r.get(0))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        Ok(status.map(|s| RunStatus::parse(&s).unwrap_or(RunStatus::Failed)))
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.write(|tx| {
            let row = RunRow::new(run, self.indexer.get().as_ref())?;
            let created = row
                .execute(tx, INSERT_RUN, (None, None), &Fence::unleased(0), None)
                .map_err(|e| self.err(e))?;
            if created == 1 {
                self.mark(tx, run)?;
                return Ok((run.clone(), true));
            }
            let (data, version): (String, i64) = tx
                .prepare_cached("SELECT data, version FROM runs WHERE run_id = ?1")
                .and_then(|mut st| st.query_row([&run.run_id], |r| Ok((r.get(0)?, r.get(1)?))))
                .map_err(|e| self.err(e))?;
            Ok((self.decode_run(&run.run_id, &data, version)?, false))
        })
    }

    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        self.write(|tx| {
            type Found = (String, i64, Option<String>, Option<i64>, Option<String>);
            let found: Option<Found> = tx
                .prepare_cached(
                    "SELECT data, version, lease_holder, lease_until_us, quarantine
                     FROM runs WHERE run_id = ?1",
                )
                .and_then(|mut st| {
                    st.query_row([run_id], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })
                    .optional()
                })
                .map_err(|e| self.err(e))?;
            let Some((data, version, holder, until, quarantine)) = found else {
                return Ok(Claim::Missing);
            };
            if let Some(reason) = quarantine {
                return Ok(Claim::Quarantined { reason });
            }
            if let Some(busy) = lease.busy(holder.as_deref(), until) {
                return Ok(busy);
            }
            let run = self.decode_run(run_id, &data, version)?;
            tx.prepare_cached(
                "UPDATE runs SET lease_holder = ?2, lease_until_us = ?3 WHERE run_id = ?1",
            )
            .and_then(|mut st| {
                st.execute(params![
                    run_id,
                    lease.holder,
                    lease.until.timestamp_micros()
                ])
            })
            .map_err(|e| self.err(e))?;
            Ok(Claim::Held(Box::new(run)))
        })
    }

    fn renew(
        &self,
        holder: &str,
        run_ids: &[String],
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        if run_ids.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut st = tx
                .prepare_cached(
                    "UPDATE runs SET lease_until_us = ?3 WHERE run_id = ?1 AND lease_holder = ?2",
                )
                .map_err(|e| self.err(e))?;
            for id in run_ids {
                st.execute(params![id, holder, until.timestamp_micros()])
                    .map_err(|e| self.err(e))?;
            }
            Ok(())
        })
    }

    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        conn.prepare_cached(
            "UPDATE runs SET lease_holder = NULL, lease_until_us = NULL
             WHERE run_id = ?1 AND lease_holder = ?2",
        )
        .and_then(|mut st| st.execute(params![run_id, holder]))
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        check_next_version(run, &fence)?;
        let mut state = self.group.state.lock();
        if !state.writing {
            // Nobody is writing: this commit is written at once, with any
            // that queued behind the last group.
            let writing = self.take_turn(&mut state);
            drop(state);
            return self.write_group(Some((records, run, &fence, lease)), &writing.group);
        }
        // Another thread is writing: this commit joins the next group.
        let item = Arc::new(Queued {
            records: records.to_vec(),
            run: run.clone(),
            version: fence.version,
            holder: fence.holder.map(str::to_string),
            take: fence.take,
            lease,
            outcome: Mutex::new(None),
        });
        state.waiting.push(item.clone());
        loop {
            if let Some(outcome) = item.outcome.lock().take() {
                return outcome;
            }
            if !state.writing {
                // The last group is written and ours is not: write it.
                let writing = self.take_turn(&mut state);
                drop(state);
                // Outcomes are set, then the next group may start.
                let _ = self.write_group(None, &writing.group);
                drop(writing);
                state = self.group.state.lock();
                continue;
            }
            self.group.turn.wait(&mut state);
        }
    }

    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            self.check_fence(tx, records, &fence)?;
            let heads = self.append_on(tx, records, None)?;
            self.forget_heads(&heads);
            Ok(())
        })
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        self.write(|tx| self.append_outside(tx, records))
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 ORDER BY seq",
            &[],
        )
    }

    fn list_records_after(&self, run_id: &str, after: u64) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            RECORDS_AFTER,
            &[&(after.min(i64::MAX as u64) as i64)],
        )
    }

    fn list_records_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<StepRecord>, StoreError> {
        let clamp = |n: u64| n.min(i64::MAX as u64) as i64;
        self.records(
            run_id,
            "SELECT seq, data FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq",
            &[&clamp(after), &clamp(through)],
        )
    }

    fn list_records_page(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        let clamp = |n: u64| n.min(i64::MAX as u64) as i64;
        self.numbered_records(
            run_id,
            "SELECT seq, data FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            &[&clamp(after), &clamp(limit as u64)],
        )
    }

    fn feed_head(&self) -> Result<Option<u64>, StoreError> {
        let conn = self.conn.lock();
        conn.query_row("SELECT COALESCE(MAX(id), 0) FROM ledger", [], |row| {
            row.get::<_, i64>(0)
        })
        .map(|n| Some(n as u64))
        .map_err(|e| self.err(e))
    }

    /// The ledger read in `id` order: each run of consecutive records of
    /// one run is an entry, at the position of its last record.
    fn list_feed(&self, after: u64, limit: usize) -> Result<Option<Vec<FeedEntry>>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(FEED).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(
                params![after.min(i64::MAX as u64) as i64, limit as i64],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)? as u64,
                        row.get::<_, String>(1)?,
                        row.get::<_, i64>(2)? as u64,
                    ))
                },
            )
            .map_err(|e| self.err(e))?;
        let mut entries: Vec<FeedEntry> = Vec::new();
        for row in rows {
            let (id, run_id, seq) = row.map_err(|e| self.err(e))?;
            match entries.last_mut() {
                Some(e) if e.run_id == run_id && e.to_seq + 1 == seq => {
                    e.seq = id;
                    e.to_seq = seq;
                }
                _ => entries.push(FeedEntry {
                    seq: id,
                    run_id,
                    from_seq: seq,
                    to_seq: seq,
                }),
            }
        }
        Ok(Some(entries))
    }

    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger INDEXED BY ledger_run WHERE run_id = ?1 AND seq > COALESCE(
                                (SELECT ledger_seq FROM runs WHERE run_id = ?1), 0) ORDER BY seq",
            &[],
        )
    }

    fn find_records(
        &self,
        run_id: &str,
        idempotency_key: &str,
    ) -> Result<Vec<StepRecord>, StoreError> {
        // Every keyed record is indexed: a long-lived run (a listener
        // checked on every delivery, an automation controller on every
        // decision, an effect's resume) never reads its whole ledger.
        // (Named: without statistics the planner prefers the primary key,
        // which scans the run's whole ledger.)
        self.records(run_id, KEYED, &[&idempotency_key])
    }

    fn compacts_ledgers(&self) -> bool {
        true
    }

    fn compact_ledger(
        &self,
        run_id: &str,
        through: u64,
        checkpoint: &StepRecord,
    ) -> Result<u64, StoreError> {
        let stored = crate::compaction::stored_form(run_id, checkpoint)?;
        let through = i64::try_from(through)
            .map_err(|_| StoreError::conflict(format!("no record at seq {through}")))?;
        self.write(|conn| {
            let found: Option<(Option<String>, i64, i64)> = conn
                .query_row(
                    "SELECT l.hash, COALESCE((SELECT ledger_seq FROM runs WHERE run_id = ?1), 0),
                            (SELECT MAX(seq) FROM ledger WHERE run_id = ?1)
                     FROM ledger l WHERE l.run_id = ?1 AND l.seq = ?2",
                    params![run_id, through],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(|e| self.err(e))?;
            crate::compaction::admit(run_id, through, found, &stored.replaced)?;
            let removed = conn
                .execute(
                    "DELETE FROM ledger WHERE run_id = ?1 AND seq < ?2",
                    params![run_id, through],
                )
                .map_err(|e| self.err(e))?;
            conn.execute(
                "UPDATE ledger SET data = ?3, hash = ?4, idem_key = NULL
                 WHERE run_id = ?1 AND seq = ?2",
                params![run_id, through, stored.data, stored.hash],
            )
            .map_err(|e| self.err(e))?;
            self.append_outside(conn, std::slice::from_ref(&stored.seal))?;
            Ok(removed as u64 + 1)
        })
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let (sql, args) = DIALECT.run_query(query);
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(rusqlite::params_from_iter(args), |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                ))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, data, version) = row.map_err(|e| self.err(e))?;
            // A row that does not decode is left out: the rest of the store
            // stays readable (its claim reports it, the driver quarantines it).
            if let Ok(run) = self.decode_run(&id, &data, version) {
                out.push(run);
            }
        }
        Ok(out)
    }

    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(DUE, &[&now.timestamp_micros(), &(limit as i64)])
    }

    fn next_due(&self, wait_now: DateTime<Utc>) -> Result<Option<NextDue>, StoreError> {
        let now = Utc::now().timestamp_micros();
        let (wait, claim): (Option<i64>, Option<i64>) = self
            .reading(|conn| {
                conn.prepare_cached(NEXT_DUE)?
                    .query_row(params![wait_now.timestamp_micros(), now], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
            })
            .map_err(|e| self.err(e))?;
        Ok(Some(NextDue {
            wait: wait.and_then(DateTime::from_timestamp_micros),
            claim: claim.and_then(DateTime::from_timestamp_micros),
        }))
    }

    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(CLAIMABLE, &[&now.timestamp_micros(), &(limit as i64)])
    }

    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(LEASED).map_err(|e| self.err(e))?;
        let rows = st
            .query_map([limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn list_ended_children(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached(ENDED_CHILDREN)
            .map_err(|e| self.err(e))?;
        let now = Utc::now().timestamp_micros();
        let rows = st
            .query_map(params![limit as i64, now], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn list_orphans(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(ORPHANS, &[&(limit as i64), &Utc::now().timestamp_micros()])
    }

    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            let set = tx
                .prepare_cached(
                    "UPDATE runs SET quarantine = ?2, lease_holder = NULL, lease_until_us = NULL
                     WHERE run_id = ?1 AND quarantine IS NULL",
                )
                .and_then(|mut st| st.execute(params![run_id, reason]))
                .map_err(|e| self.err(e))?;
            if set > 0 {
                // A parent waiting on it learns that it was set aside.
                mark_parent(tx, run_id, Utc::now().timestamp_micros()).map_err(|e| self.err(e))?;
            }
            Ok(())
        })
    }

    fn list_consumers(&self, connection_id: Option<&str>) -> Result<Vec<String>, StoreError> {
        match connection_id {
            Some(id) => self.ids(CONSUMERS_OF, &[&id]),
            None => self.ids(CONSUMERS, &[]),
        }
    }

    fn quarantined(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        let conn = self.conn.lock();
        conn.prepare_cached("SELECT quarantine FROM runs WHERE run_id = ?1")
            .and_then(|mut st| {
                st.query_row([run_id], |r| r.get::<_, Option<String>>(0))
                    .optional()
            })
            .map(Option::flatten)
            .map_err(|e| self.err(e))
    }

    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        self.write(|tx| {
            let count: Option<i64> = tx
                .prepare_cached(
                    "UPDATE runs SET defer_count = COALESCE(defer_count, 0) + 1
                     WHERE run_id = ?1 RETURNING defer_count",
                )
                .and_then(|mut st| st.query_row([run_id], |r| r.get(0)).optional())
                .map_err(|e| self.err(e))?;
            let Some(count) = count else {
                return Ok(0);
            };
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            tx.prepare_cached(
                "UPDATE runs SET defer_until_us = ?2, defer_reason = ?3 WHERE run_id = ?1",
            )
            .and_then(|mut st| st.execute(params![run_id, until(count).timestamp_micros(), reason]))
            .map_err(|e| self.err(e))?;
            Ok(count)
        })
    }

    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        let conn = self.conn.lock();
        let row: Option<(Option<i64>, Option<i64>, Option<String>)> = conn
            .prepare_cached(
                "SELECT defer_until_us, defer_count, defer_reason FROM runs WHERE run_id = ?1",
            )
            .and_then(|mut st| {
                st.query_row([run_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()
            })
            .map_err(|e| self.err(e))?;
        Ok(row.and_then(|(until, count, reason)| {
            Some(Deferral {
                until: DateTime::from_timestamp_micros(until?)?,
                count: u32::try_from(count.unwrap_or(0)).unwrap_or(u32::MAX),
                reason,
            })
        }))
    }

    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached(
                "SELECT run_id, quarantine FROM runs INDEXED BY runs_quarantine
                 WHERE quarantine IS NOT NULL ORDER BY rowid",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn list_run_index(&self, query: &RunIndexQuery) -> Result<Vec<RunIndexRow>, StoreError> {
        let (sql, args) = DIALECT.run_index(query, &self.indexer.get().turn_roots());
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(&sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(rusqlite::params_from_iter(args.iter()), |r| {
                Ok(RunIndexRow {
                    run_id: r.get(0)?,
                    workflow_id: r.get(1)?,
                    status: RunStatus::parse(&r.get::<_, String>(2)?).unwrap_or(RunStatus::Failed),
                    parent_run_id: r.get(3)?,
                    session_id: r.get(4)?,
                    created_at: r.get::<_, Option<String>>(5)?.unwrap_or_default(),
                    updated_at: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
                    automation_id: r.get(7)?,
                    role: r.get(8)?,
                    occurrence_index: r.get(9)?,
                    session_kind: r.get(10)?,
                    workspace_root: r.get(11)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.err(e))
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        let conn = self.conn.lock();
        let dir: Option<String> = conn
            .prepare_cached("SELECT dir FROM bundles WHERE workflow_id = ?1")
            .and_then(|mut st| st.query_row([workflow_id], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        Ok(dir.map(PathBuf::from))
    }

    fn deploy(&self, d: &crate::Deployment<'_>) -> Result<Vec<crate::Deployed>, StoreError> {
        self.write(|conn| {
            let err = |e| self.err(e);
            write_bundle_files(conn, d.files).map_err(err)?;
            let mut out = Vec::with_capacity(d.workflow_ids.len());
            for id in d.workflow_ids {
                let latest = latest_version(conn, id).map_err(err)?;
                out.extend(crate::deployments::plan(
                    latest.as_slice(),
                    &crate::Deployment {
                        workflow_ids: std::slice::from_ref(id),
                        ..*d
                    },
                ));
            }
            for p in out.iter().filter(|p| !p.unchanged) {
                let v = &p.version;
                conn.prepare_cached(
                    "INSERT INTO workflow_versions
                       (workflow_id, version, digest, deployed_at, deployed_by, source)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        v.workflow_id,
                        v.version,
                        v.digest,
                        v.deployed_at,
                        v.deployed_by,
                        v.source
                    ])
                })
                .map_err(err)?;
            }
            Ok(out)
        })
    }

    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<crate::WorkflowVersion>, StoreError> {
        // On the writer's connection: a read on the reading connection
        // after another write pays for its cache (about 40 µs; a run's start
        // asks for its workflow's latest version, and an ask/resume cycle
        // ran at 6,400 a second instead of 9,000).
        let conn = self.conn.lock();
        match version {
            None => latest_version(&conn, workflow_id),
            Some(n) => conn
                .prepare_cached(&format!(
                    "{VERSION_COLUMNS} WHERE workflow_id = ?1 AND version = ?2"
                ))
                .and_then(|mut st| {
                    st.query_row(params![workflow_id, n], version_row)
                        .optional()
                }),
        }
        .map_err(|e| self.err(e))
    }

    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<crate::WorkflowVersion>, StoreError> {
        self.reading(|conn| {
            conn.prepare_cached(&format!(
                "{VERSION_COLUMNS} WHERE ?1 IS NULL OR workflow_id = ?1
                 ORDER BY workflow_id, version"
            ))?
            .query_map([workflow_id], version_row)?
            .collect()
        })
        .map_err(|e| self.err(e))
    }

    fn bundle_files(&self, digest: &str) -> Result<Vec<crate::bundles::BundleFile>, StoreError> {
        self.reading(|conn| {
            conn.prepare_cached(
                "SELECT path, content FROM bundle_files WHERE digest = ?1 ORDER BY path",
            )?
            .query_map([digest], |r| {
                Ok(crate::bundles::BundleFile {
                    path: r.get(0)?,
                    bytes: r.get(1)?,
                })
            })?
            .collect()
        })
        .map_err(|e| self.err(e))
    }

    fn delete_runs(&self, run_ids: &[String]) -> Result<crate::Deleted, StoreError> {
        self.write(|conn| {
            let mut out = crate::Deleted::default();
            // The ledger's ids are the change feed's positions, given as the
            // largest plus one: the row holding the largest stays (with its
            // runs) until newer records exist, or its id would be given
            // again behind a follower's position.
            let newest: Option<i64> = conn
                .query_row("SELECT MAX(id) FROM ledger", [], |r| r.get(0))
                .map_err(|e| self.err(e))?;
            let mut present = Vec::new();
            for id in run_ids {
                let row: Option<(String, Option<i64>)> = conn
                    .prepare_cached(
                        "SELECT status, (SELECT MAX(id) FROM ledger WHERE run_id = ?1)
                         FROM runs WHERE run_id = ?1",
                    )
                    .and_then(|mut st| st.query_row([id], |r| Ok((r.get(0)?, r.get(1)?))))
                    .optional()
                    .map_err(|e| self.err(e))?;
                let Some((status, last)) = row else {
                    continue;
                };
                let ended = matches!(status.as_str(), "completed" | "failed" | "cancelled");
                if !ended || (last.is_some() && last == newest) {
                    return Ok(out);
                }
                present.push(id);
            }
            for id in present {
                let records = conn
                    .prepare_cached("DELETE FROM ledger WHERE run_id = ?1")
                    .and_then(|mut st| st.execute([id]))
                    .map_err(|e| self.err(e))?;
                conn.prepare_cached("DELETE FROM runs WHERE run_id = ?1")
                    .and_then(|mut st| st.execute([id]))
                    .map_err(|e| self.err(e))?;
                self.heads.lock().staged.push((id.clone(), None));
                out.runs.push(id.clone());
                out.records += records as u64;
            }
            Ok(out)
        })
    }

    fn remove_versions(&self, versions: &[crate::WorkflowVersion]) -> Result<usize, StoreError> {
        self.write(|conn| {
            let mut removed = 0;
            for v in versions {
                removed += conn
                    .prepare_cached(
                        "DELETE FROM workflow_versions
                         WHERE workflow_id = ?1 AND version = ?2 AND digest = ?3",
                    )
                    .and_then(|mut st| st.execute(params![v.workflow_id, v.version, v.digest]))
                    .map_err(|e| self.err(e))?;
            }
            conn.execute(
                "DELETE FROM bundle_files WHERE digest NOT IN
                   (SELECT digest FROM workflow_versions)",
                [],
            )
            .map_err(|e| self.err(e))?;
            Ok(removed)
        })
    }

    fn version_use(&self, workflow_id: &str) -> Result<Vec<crate::VersionUse>, StoreError> {
        let rows: Vec<(Option<u32>, String, u64, String)> = self
            .reading(|conn| {
                conn.prepare_cached(
                    "SELECT json_extract(data, '$.workflow_version') AS v, status, COUNT(*),
                            COALESCE(MAX(updated_at), '')
                     FROM runs WHERE workflow_id = ?1 AND quarantine IS NULL
                     GROUP BY v, status ORDER BY v, status",
                )?
                .query_map([workflow_id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?
                .collect()
            })
            .map_err(|e| self.err(e))?;
        let mut uses: Vec<_> = rows
            .into_iter()
            .filter_map(|(version, status, runs, last_updated)| {
                Some(crate::VersionUse {
                    version,
                    status: RunStatus::parse(&status)?,
                    runs,
                    last_updated,
                })
            })
            .collect();
        crate::deployments::sort(&mut uses);
        Ok(uses)
    }

    fn append_event(&self, event: &super::InboxEvent) -> Result<super::EventAppend, StoreError> {
        self.inbox_append(event)
    }

    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::InboxEvent>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached(
                "SELECT seq, data FROM inbox WHERE stream = ?1 AND seq > ?2 AND data <> '' ORDER BY seq LIMIT ?3",
            )
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(
                params![stream, after as i64, limit.min(i64::MAX as usize) as i64],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
            )
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        rows.iter()
            .map(|(seq, data)| self.decode_event(*seq, data))
            .collect()
    }

    fn prune_events(
        &self,
        stream: &str,
        through: u64,
        before: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        let before = before.to_rfc3339();
        // A dropped event keeps its row (seq, stream, dedupe key) with no
        // data: what `events_after` skips. (Times compared as times: an
        // event's is stamped `+00:00`.)
        const WHERE: &str = "WHERE stream = ?1 AND seq <= ?2 AND data <> ''
                             AND julianday(CASE WHEN data <> '' THEN json_extract(data, '$.appended_at') END)
                                 < julianday(?3)";
        let through = through.min(i64::MAX as u64) as i64;
        if dry_run {
            let count = format!("SELECT COUNT(*) FROM inbox {WHERE}");
            return self
                .reading(|conn| {
                    conn.query_row(&count, params![stream, through, before], |r| {
                        r.get::<_, i64>(0)
                    })
                })
                .map(|n| n as u64)
                .map_err(|e| self.err(e));
        }
        self.write(|tx| {
            tx.execute(
                &format!("UPDATE inbox SET data = '' {WHERE}"),
                params![stream, through, before],
            )
            .map(|n| n as u64)
            .map_err(|e| self.err(e))
        })
    }

    fn create_connection(&self, connection: &super::ConnectionRecord) -> Result<(), StoreError> {
        let data = serde_json::to_string(connection).map_err(|e| self.err(e))?;
        self.write(|tx| {
            let n = tx
                .prepare_cached(
                    "INSERT INTO connections (connection_id, data) VALUES (?1, ?2)
                     ON CONFLICT (connection_id) DO NOTHING",
                )
                .and_then(|mut st| st.execute(params![connection.connection_id, data]))
                .map_err(|e| self.err(e))?;
            if n == 0 {
                return Err(StoreError::conflict(format!(
                    "connection {} already exists",
                    connection.connection_id
                )));
            }
            Ok(())
        })
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut super::ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<super::ConnectionRecord>, StoreError> {
        self.write(|tx| {
            let data: Option<String> = tx
                .prepare_cached("SELECT data FROM connections WHERE connection_id = ?1")
                .and_then(|mut st| st.query_row([id], |r| r.get(0)).optional())
                .map_err(|e| self.err(e))?;
            let Some(data) = data else {
                return Ok(None);
            };
            let mut record = self.decode_connection(id, &data)?;
            change(&mut record)?;
            let data = serde_json::to_string(&record).map_err(|e| self.err(e))?;
            tx.prepare_cached("UPDATE connections SET data = ?2 WHERE connection_id = ?1")
                .and_then(|mut st| st.execute(params![id, data]))
                .map_err(|e| self.err(e))?;
            Ok(Some(record))
        })
    }

    fn get_connection(&self, id: &str) -> Result<Option<super::ConnectionRecord>, StoreError> {
        let conn = self.conn.lock();
        let data: Option<String> = conn
            .prepare_cached("SELECT data FROM connections WHERE connection_id = ?1")
            .and_then(|mut st| st.query_row([id], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        data.map(|d| self.decode_connection(id, &d)).transpose()
    }

    fn list_connections(&self) -> Result<Vec<super::ConnectionRecord>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached("SELECT connection_id, data FROM connections ORDER BY rowid")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| self.err(e))?;
        rows.iter()
            .map(|(id, data)| self.decode_connection(id, data))
            .collect()
    }
}

impl SqliteStore {
    fn decode_event(&self, seq: i64, data: &str) -> Result<super::InboxEvent, StoreError> {
        let mut e: super::InboxEvent = serde_json::from_str(data).map_err(|e| {
            StoreError::corrupt(format!("{}: inbox row {seq}: {e}", self.path.display()))
        })?;
        e.seq = seq as u64;
        Ok(e)
    }

    fn decode_connection(
        &self,
        id: &str,
        data: &str,
    ) -> Result<super::ConnectionRecord, StoreError> {
        serde_json::from_str(data).map_err(|e| {
            StoreError::corrupt(format!("{}: connection {id:?}: {e}", self.path.display()))
        })
    }

    /// The inbox, the connections: [`Store`]'s event methods.
    fn inbox_append(&self, event: &super::InboxEvent) -> Result<super::EventAppend, StoreError> {
        self.write(|tx| {
            let found: Option<i64> = tx
                .prepare_cached("SELECT seq FROM inbox WHERE stream = ?1 AND dedupe_key = ?2")
                .and_then(|mut st| {
                    st.query_row([&event.stream, &event.dedupe_key], |r| r.get(0))
                        .optional()
                })
                .map_err(|e| self.err(e))?;
            if let Some(seq) = found {
                return Ok(super::EventAppend {
                    seq: seq as u64,
                    duplicate: true,
                });
            }
            let data = serde_json::to_string(event).map_err(|e| self.err(e))?;
            tx.prepare_cached("INSERT INTO inbox (stream, dedupe_key, data) VALUES (?1, ?2, ?3)")
                .and_then(|mut st| st.execute(params![event.stream, event.dedupe_key, data]))
                .map_err(|e| self.err(e))?;
            Ok(super::EventAppend {
                seq: tx.last_insert_rowid() as u64,
                duplicate: false,
            })
        })
    }
}

impl super::CommandStore for SqliteStore {
    fn append_command(
        &self,
        command: &super::CommandRecord,
    ) -> Result<super::AppendResult, StoreError> {
        self.write(|tx| {
            let existing: Option<i64> = tx
                .prepare_cached("SELECT seq FROM commands WHERE command_id = ?1")
                .and_then(|mut st| st.query_row([&command.command_id], |r| r.get(0)).optional())
                .map_err(|e| self.err(e))?;
            if let Some(seq) = existing {
                return Ok(super::AppendResult {
                    accepted: false,
                    duplicate: true,
                    seq: seq as u64,
                });
            }
            tx.prepare_cached("INSERT INTO commands (command_id, data) VALUES (?1, '')")
                .and_then(|mut st| st.execute([&command.command_id]))
                .map_err(|e| self.err(e))?;
            let seq = tx.last_insert_rowid() as u64;
            let data = serde_json::to_string(&super::CommandRecord {
                seq,
                ..command.clone()
            })
            .map_err(|e| self.err(e))?;
            tx.prepare_cached("UPDATE commands SET data = ?1 WHERE seq = ?2")
                .and_then(|mut st| st.execute(params![data, seq as i64]))
                .map_err(|e| self.err(e))?;
            Ok(super::AppendResult {
                accepted: true,
                duplicate: false,
                seq,
            })
        })
    }

    fn commands_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::CommandRecord>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached("SELECT seq, data FROM commands WHERE seq > ?1 ORDER BY seq LIMIT ?2")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map(params![after as i64, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, data) = row.map_err(|e| self.err(e))?;
            out.push(serde_json::from_str(&data).map_err(|e| {
                StoreError::corrupt(format!("{}: command {seq}: {e}", self.path.display()))
            })?);
        }
        Ok(out)
    }

    fn find_command(&self, command_id: &str) -> Result<Option<super::CommandRecord>, StoreError> {
        let conn = self.conn.lock();
        let data: Option<String> = conn
            .prepare_cached("SELECT data FROM commands WHERE command_id = ?1")
            .and_then(|mut st| st.query_row([command_id], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        data.map(|d| {
            serde_json::from_str(&d).map_err(|e| {
                StoreError::corrupt(format!(
                    "{}: command {command_id}: {e}",
                    self.path.display()
                ))
            })
        })
        .transpose()
    }

    fn cursor(&self, consumer: &str) -> Result<u64, StoreError> {
        let conn = self.conn.lock();
        let seq: Option<i64> = conn
            .prepare_cached("SELECT seq FROM command_cursors WHERE consumer = ?1")
            .and_then(|mut st| st.query_row([consumer], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        Ok(seq.unwrap_or(0) as u64)
    }

    fn set_cursor(&self, consumer: &str, seq: u64) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        conn.prepare_cached(
            "INSERT INTO command_cursors (consumer, seq) VALUES (?1, ?2)
             ON CONFLICT(consumer) DO UPDATE SET seq = excluded.seq",
        )
        .and_then(|mut st| st.execute(params![consumer, seq as i64]))
        .map_err(|e| self.err(e))?;
        Ok(())
    }
}

/// The digests of compiled components the engine cached: a cached file is
/// loaded only if its digest is the one this database recorded.
impl crate::CompiledDigests for SqliteStore {
    fn vouched(&self, name: &str) -> Option<[u8; 32]> {
        let conn = self.conn.lock();
        let text: String = conn
            .prepare_cached("SELECT sha256 FROM compiled_digests WHERE name = ?1")
            .and_then(|mut st| st.query_row([name], |r| r.get(0)).optional())
            .ok()??;
        hex::decode(text).ok()?.try_into().ok()
    }

    fn vouch(&self, name: &str, digest: &[u8; 32]) {
        let _ = self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO compiled_digests (name, sha256) VALUES (?1, ?2)
                 ON CONFLICT(name) DO UPDATE SET sha256 = excluded.sha256",
            )
            .and_then(|mut st| st.execute(params![name, hex::encode(digest)]))
            .map_err(|e| self.err(e))
        });
    }
}

/// Whether a write failed on a unique index (`ledger_run`: the seq is
/// taken).
fn is_unique_violation(written: &rusqlite::Result<usize>) -> bool {
    matches!(written, Err(rusqlite::Error::SqliteFailure(e, _))
        if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE)
}

/// Runs a statement without parameters or rows (`BEGIN`, `COMMIT`,
/// savepoints) from the connection's statement cache.
fn exec_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// A write transaction under way: rolled back when dropped unless it has
/// ended (committed, or rolled back by SQLite itself after an error).
struct OpenTransaction<'a>(&'a Connection);

impl Drop for OpenTransaction<'_> {
    fn drop(&mut self) {
        if !self.0.is_autocommit() {
            // Best effort: a connection that cannot roll back fails its
            // next BEGIN, which reports the error.
            let _ = self.0.execute_batch("ROLLBACK");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(id: &str, version: u64) -> RunState {
        serde_json::from_value(serde_json::json!({
            "run_id": id, "workflow_id": "w", "status": "running", "current_node": "a",
            "vars": {"n": version}, "created_at": "2026-11-30T09:00:00.000000Z",
            "updated_at": "2026-11-30T09:00:00.000000Z", "version": version,
        }))
        .unwrap()
    }

    fn record(id: &str, n: u64) -> StepRecord {
        serde_json::from_value(serde_json::json!({
            "step_id": format!("{id}-{n}"), "run_id": id, "node_id": "a",
            "status": "completed", "started_at": "2026-11-30T09:00:00.000000Z", "attempt": 1,
        }))
        .unwrap()
    }

    /// Commits record `n` of run `id` with the run from version `from`.
    fn commit_step(store: &SqliteStore, id: &str, n: u64, from: u64) -> Result<(), StoreError> {
        store.commit(
            &[record(id, n)],
            &run(id, from + 1),
            Fence::unleased(from),
            LeaseAfter::Release,
        )
    }

    /// A run deleted (retention) by another process and created again
    /// under its id: the ledger end this store kept of the first is not
    /// the second's, even at the same version (the run's creation time
    /// tells them apart), so the chain holds.
    #[test]
    fn a_run_created_again_after_a_deletion_does_not_link_after_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let (a, b) = (
            SqliteStore::open(&path).unwrap(),
            SqliteStore::open(&path).unwrap(),
        );
        commit_step(&a, "x", 1, 0).unwrap();
        commit_step(&a, "x", 2, 1).unwrap();
        assert!(a.heads.lock().kept.contains_key("x"), "a keeps x's end");
        // Another process finishes x, deletes it (a newer record elsewhere
        // lets it), and creates it again, up to the version a kept.
        let mut done = run("x", 3);
        done.status = RunStatus::Cancelled;
        b.commit(
            &[record("x", 3)],
            &done,
            Fence::unleased(2),
            LeaseAfter::Release,
        )
        .unwrap();
        b.append_records(&[record("other", 1)]).unwrap();
        assert_eq!(b.delete_runs(&["x".to_string()]).unwrap().runs, ["x"]);
        let mut again = run("x", 0);
        again.created_at = "2026-12-01T09:00:00.000000Z".into();
        let mut next = again.clone();
        next.version = 1;
        b.commit(
            &[record("x", 11)],
            &next,
            Fence::unleased(0),
            LeaseAfter::Release,
        )
        .unwrap();
        next.version = 2;
        b.commit(
            &[record("x", 12)],
            &next,
            Fence::unleased(1),
            LeaseAfter::Release,
        )
        .unwrap();
        // Now a commits the new x from version 2.
        next.version = 3;
        a.commit(
            &[record("x", 13)],
            &next,
            Fence::unleased(2),
            LeaseAfter::Release,
        )
        .unwrap();
        let ledger = a.list_records("x").unwrap();
        let steps: Vec<_> = ledger.iter().map(|r| r.step_id.as_str()).collect();
        assert_eq!(steps, ["x-11", "x-12", "x-13"]);
        crate::verify_chain(&ledger).unwrap();
    }

    /// A transaction's log writes reach the kernel together (several
    /// frames, two writes each, in one call), and a connection through
    /// SQLite's own VFS reading meanwhile (as the `sqlite3` shell would)
    /// only ever sees whole commits: every run it counts has its records.
    #[test]
    fn a_transactions_log_writes_are_one_write_and_readers_see_whole_commits() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = SqliteStore::open(&path).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, done) = (path.clone(), done.clone());
            std::thread::spawn(move || {
                let conn = rusqlite::Connection::open(&path).unwrap();
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) || reads == 0 {
                    // One read transaction: the runs and their records.
                    let (runs, missing): (i64, i64) = conn
                        .query_row(
                            "SELECT COUNT(*), COUNT(*) - (SELECT COUNT(DISTINCT run_id) FROM ledger
                                 WHERE run_id IN (SELECT run_id FROM runs)) FROM runs",
                            [],
                            |r| Ok((r.get(0)?, r.get(1)?)),
                        )
                        .unwrap();
                    assert_eq!(missing, 0, "{runs} runs, {missing} without records");
                    reads += 1;
                }
                reads
            })
        };
        let before = crate::sqlite_vfs::counts();
        for i in 0..200 {
            let id = format!("run-{i:04}");
            let records: Vec<StepRecord> = (1..=3).map(|n| record(&id, n)).collect();
            store
                .commit(
                    &records,
                    &run(&id, 1),
                    Fence::unleased(0),
                    LeaseAfter::Release,
                )
                .unwrap();
        }
        // A transaction larger than one write to the kernel carries (its
        // log writes are written in pieces), one of exactly 128 KiB of
        // record data, and one of 2 MiB.
        for (i, bytes) in [(0, 200_000), (1, 128 * 1024), (2, 2 << 20)] {
            let id = format!("big-{i}");
            let mut big = record(&id, 1);
            big.result = Some(serde_json::json!("z".repeat(bytes)));
            store
                .commit(
                    &[big],
                    &run(&id, 1),
                    Fence::unleased(0),
                    LeaseAfter::Release,
                )
                .unwrap();
            let back = store.list_records(&id).unwrap();
            assert_eq!(
                back[0]
                    .result
                    .as_ref()
                    .and_then(|v| v.as_str())
                    .map(str::len),
                Some(bytes)
            );
        }
        done.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        let after = crate::sqlite_vfs::counts();
        let (gathered, flushed) = (after.0 - before.0, after.1 - before.1);
        // Each commit writes a few frames (header and page each) and is
        // written once: at least four writes gathered per write made.
        assert!(flushed > 0, "nothing written through the layer");
        assert!(
            gathered >= 4 * flushed,
            "{gathered} log writes in {flushed} calls"
        );
        let conn = rusqlite::Connection::open(&path).unwrap();
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM ledger", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 603);
    }

    /// Commits of several threads that arrive while one is written are
    /// written together, each judged by its own fence: one whose fence no
    /// longer holds is refused and leaves nothing, the others land, and
    /// every ledger's chain holds.
    #[test]
    fn commits_ready_together_are_written_in_one_group() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(SqliteStore::open(dir.path().join("db.sqlite")).unwrap());
        for id in ["a", "b", "c", "d"] {
            store
                .commit(
                    &[record(id, 1)],
                    &run(id, 1),
                    Fence::unleased(0),
                    LeaseAfter::Release,
                )
                .unwrap();
        }
        // The connection is held (as by a long write) while four threads
        // commit: one waits for it to write, three queue behind it.
        let held = store.conn.lock();
        let threads: Vec<_> = ["a", "b", "c", "d"]
            .into_iter()
            .map(|id| {
                let store = store.clone();
                std::thread::spawn(move || {
                    // "d" commits from a version it did not read: refused.
                    let read = if id == "d" { 7 } else { 1 };
                    let mut next = run(id, read + 1);
                    next.vars.insert("n".into(), serde_json::json!(2));
                    store.commit(
                        &[record(id, 2)],
                        &next,
                        Fence::unleased(read),
                        LeaseAfter::Release,
                    )
                })
            })
            .collect();
        let queued = std::time::Instant::now();
        while store.group.state.lock().waiting.len() < 3 {
            assert!(queued.elapsed().as_secs() < 10, "the commits did not queue");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(held);
        let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            store.grouped_commits(),
            3,
            "the three queued commits, together"
        );
        for (id, outcome) in ["a", "b", "c", "d"].iter().zip(outcomes) {
            let stored = store.load_run(id).unwrap().unwrap();
            let ledger = store.list_records(id).unwrap();
            if *id == "d" {
                assert_eq!(outcome.unwrap_err().code, "conflict");
                assert_eq!(
                    (stored.version, ledger.len()),
                    (1, 1),
                    "nothing of it landed"
                );
            } else {
                outcome.unwrap();
                assert_eq!((stored.version, ledger.len()), (2, 2));
                assert_eq!(stored.vars["n"], 2);
            }
            assert!(crate::verify_chain(&ledger).is_ok(), "{id}");
        }
        // The refused commit's ledger head (its record was rolled back with
        // its savepoint) was not kept: "d"'s next record follows its first.
        commit_step(&store, "d", 2, 1).unwrap();
        let ledger = store.list_records("d").unwrap();
        assert_eq!(ledger.len(), 2);
        crate::verify_chain(&ledger).unwrap();
    }

    /// A store keeps where the ledgers of the runs it committed end and
    /// links a commit's records after that without reading the ledger, only
    /// for a commit from the version its own last commit wrote. When
    /// another writer (here a second store on the file, as another process
    /// would be) appended meanwhile, the record's seq is taken and the
    /// append reads the real end; when the file went back (an online
    /// restore), the commit starts from an older version and reads it too.
    #[test]
    fn a_commit_links_after_the_real_end_of_its_ledger() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let (a, b) = (
            SqliteStore::open(&path).unwrap(),
            SqliteStore::open(&path).unwrap(),
        );
        let commit =
            |store: &SqliteStore, n: u64, from: u64| commit_step(store, "r", n, from).unwrap();
        let kept =
            |store: &SqliteStore| store.heads.lock().kept.get("r").map(|k| (k.seq, k.version));
        commit(&a, 1, 0);
        assert_eq!(kept(&a), Some((1, 1)), "kept after its commit");
        // Evidence from another writer: `a`'s end is behind, and refused.
        b.append_records(&[record("r", 2), record("r", 3)]).unwrap();
        commit(&a, 4, 1);
        commit(&a, 5, 2);
        assert_eq!(kept(&a), Some((5, 3)));
        // The file goes back to before the last commit (as an online restore
        // of a backup would take it): the run's next commit starts from
        // version 2, and links after record 4, not after the kept 5.
        {
            let raw = Connection::open(&path).unwrap();
            raw.execute_batch(
                "DELETE FROM ledger WHERE run_id = 'r' AND seq = 5;
                 UPDATE runs SET version = 2, ledger_seq = 4 WHERE run_id = 'r';",
            )
            .unwrap();
        }
        commit(&a, 6, 2);
        let ledger = a.list_records("r").unwrap();
        let steps: Vec<_> = ledger.iter().map(|r| r.step_id.as_str()).collect();
        assert_eq!(steps, ["r-1", "r-2", "r-3", "r-4", "r-6"]);
        crate::verify_chain(&ledger).unwrap();
        let seqs: Vec<i64> = a
            .conn
            .lock()
            .prepare("SELECT seq FROM ledger WHERE run_id = 'r' ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        // The stored bytes are `link`'s, with and without a record before.
        let mut head = None;
        for stored in &ledger {
            let mut plain = stored.clone();
            (plain.prev_hash, plain.record_hash) = (None, None);
            let mut again = head.clone();
            let json = crate::link_json(&mut again, &plain);
            let mut copy = plain.clone();
            assert_eq!(json, crate::link(&mut head, &mut copy));
            assert_eq!(serde_json::from_str::<StepRecord>(&json).unwrap(), *stored);
            assert_eq!(again, head);
        }
        // A commit that finishes the run forgets its end; one that appends
        // outside a commit forgets what it touched.
        let mut done = run("r", 4);
        done.status = RunStatus::Completed;
        a.commit(
            &[record("r", 7)],
            &done,
            Fence::unleased(3),
            LeaseAfter::Release,
        )
        .unwrap();
        assert_eq!(kept(&a), None);
        commit_step(&a, "s", 1, 0).unwrap();
        assert!(a.heads.lock().kept.contains_key("s"));
        a.append_records(&[record("s", 2)]).unwrap();
        assert!(!a.heads.lock().kept.contains_key("s"));
        // A commit that creates a run takes its ledger as empty: records
        // another writer appended before are found the same way.
        b.append_records(&[record("n", 1)]).unwrap();
        commit_step(&a, "n", 2, 0).unwrap();
        let ledger = a.list_records("n").unwrap();
        assert_eq!(ledger.len(), 2);
        crate::verify_chain(&ledger).unwrap();
    }

    /// A database whose `ledger_run` is not unique (changed by hand) is
    /// refused at open, with the index named: appends count on it.
    #[test]
    fn a_database_whose_ledger_run_is_not_unique_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        drop(SqliteStore::open(&path).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch("DROP INDEX ledger_run; CREATE INDEX ledger_run ON ledger(run_id, seq);")
            .unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.code, "store_corrupt");
        assert!(err.message.contains("ledger_run"), "{}", err.message);
    }

    /// Each periodic query of the driver reads the index of what is due:
    /// no full scan of `runs`, and no walk of every open run (the
    /// `runs_open` index by status alone) where the query asks for waiting
    /// runs, of which there may be a hundred thousand parked.
    #[test]
    fn periodic_queries_read_only_what_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("db.sqlite")).unwrap();
        let conn = store.conn.lock();
        let plan = |sql: &str| -> String {
            let n = conn.prepare(sql).unwrap().parameter_count();
            let args = vec![0i64; n];
            let mut st = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let rows = st
                .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))
                .unwrap();
            rows.map(Result::unwrap).collect::<Vec<_>>().join("; ")
        };
        let cases = [
            (DUE, "runs_due"),
            (CLAIMABLE, "runs_open (status=?)"),
            (LEASED, "runs_open (status=?)"),
            (ENDED_CHILDREN, "runs_child_ended"),
            (ORPHANS, "runs_orphan"),
            (KEYED, "ledger_keyed (run_id=? AND idem_key=?)"),
            (LEDGER_HEAD, "ledger_run (run_id=?)"),
            (RECORDS_AFTER, "ledger_run (run_id=? AND seq>?)"),
            (FEED, "INTEGER PRIMARY KEY (rowid>?)"),
            (
                MARK_PARENT,
                "runs_open (status=? AND wait_reason=? AND wait_key=?)",
            ),
            (CONSUMERS_OF, "runs_consumer (wakes_on=?)"),
            (CONSUMERS, "runs_consumer"),
            (NEXT_DUE, "runs_open (status=?)"),
        ];
        for (sql, index) in cases {
            let plan = plan(sql);
            assert!(plan.contains(index), "{sql}\n reads {plan}, not {index}");
            assert!(
                // (A SELECT of subqueries alone "scans" its one row.)
                !plan
                    .split("; ")
                    .any(|step| step.starts_with("SCAN") && step != "SCAN CONSTANT ROW"),
                "{sql}\n scans: {plan}"
            );
            // A ledger read comes in its index's order: no sort of a long
            // run's records.
            if [KEYED, LEDGER_HEAD, RECORDS_AFTER, FEED].contains(&sql) {
                assert!(!plan.contains("TEMP B-TREE"), "{sql}\n sorts: {plan}");
            }
        }
    }
}

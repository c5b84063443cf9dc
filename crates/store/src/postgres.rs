//! The PostgreSQL store: several stepwell hosts on one database.
//!
//! The same run transaction as [`super::SqliteStore`], across machines:
//! every commit locks the run's row (`SELECT ... FOR UPDATE`), checks its
//! fence (the version it read, the lease it holds) and writes the ledger
//! records and the run together; a claim takes the run's lease (two
//! columns of its row) under the same row lock, so two hosts never both
//! execute a run. A host that dies leaves its leases to lapse; the next
//! claim after the expiry takes the run over, and a late commit of the
//! dead (or paused) host fails its fence.
//!
//! What SQLite gets from its one write lock, PostgreSQL gets from
//! transaction-scoped advisory locks, named by a hash of what they guard
//! ([`LockKey`]) and always taken in one statement, in key order:
//!
//! - a run's ledger: appends to one run's chain queue, so each record
//!   links the one before it;
//! - the driver's markers (which parent's child ended, which child is an
//!   orphan): a child ending and its parent starting to wait on it (or a
//!   parent's cancel and its child's save) take the same lock, so the one
//!   that commits second sees the first;
//! - an event stream and the command inbox: their sequence numbers are
//!   handed out and committed in order, so a reader that read up to `n`
//!   never misses a smaller one committed later.
//!
//! The store-wide change feed ([`Store::list_feed`]) numbers its entries
//! after they commit: a commit inserts an unnumbered entry, and a reader
//! numbers every committed unnumbered entry (under a lock) before it reads,
//! so the feed's order is the order in which commits became visible.
//!
//! Connections come from a small pool; a connection that broke is dropped
//! and the transaction, which did not commit, is tried again on a new one
//! (as is one that PostgreSQL chose as a deadlock victim).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use postgres::error::SqlState;
use postgres::fallible_iterator::FallibleIterator;
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Statement};

use super::{
    check_next_version, link_json, wait_due_at, Attribution, Claim, Deferral, FeedEntry, Fence,
    LeaseAfter, LeaseRequest, NextDue, RunIndexQuery, RunIndexRow, RunIndexer, RunQuery, Store,
    StoreError,
};
use crate::bundles::BundleFile;
use stepwell_model::model::{RunState, RunStatus, StepRecord};

/// The schema version this build writes. A database at a higher version
/// was written by a newer stepwell and is refused; an older one is migrated
/// when opened.
pub const SCHEMA_VERSION: i64 = 5;

/// Each migration brings the schema from its index to the next version.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1
    "
CREATE TABLE runs (
    run_id         TEXT PRIMARY KEY,
    ord            BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    workflow_id    TEXT NOT NULL,
    status         TEXT NOT NULL,
    wait_reason    TEXT,
    wait_key       TEXT,
    wait_due_us    BIGINT,
    parent_run_id  TEXT,
    session_id     TEXT,
    data           TEXT NOT NULL,
    version        BIGINT NOT NULL,
    lease_holder   TEXT,
    lease_until_us BIGINT,
    automation_id  TEXT,
    role           TEXT,
    occurrence_index BIGINT,
    session_kind   TEXT,
    workspace_root TEXT,
    created_at     TEXT,
    updated_at     TEXT,
    quarantine     TEXT,
    ledger_seq     BIGINT,
    defer_until_us BIGINT,
    defer_count    BIGINT,
    defer_reason   TEXT,
    child_ended_us BIGINT,
    orphan_us      BIGINT,
    wakes_on       TEXT,
    head_seq       BIGINT NOT NULL DEFAULT 0,
    head_hash      TEXT
);
CREATE INDEX runs_running ON runs (COALESCE(defer_until_us, 0), ord)
    WHERE status = 'running' AND quarantine IS NULL;
CREATE INDEX runs_wait ON runs (wait_key) WHERE status = 'waiting';
CREATE INDEX runs_due ON runs (wait_due_us, ord) WHERE wait_due_us IS NOT NULL;
CREATE INDEX runs_parent ON runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE INDEX runs_automation ON runs (automation_id, role, occurrence_index)
    WHERE automation_id IS NOT NULL;
CREATE INDEX runs_session ON runs (session_id, role) WHERE session_id IS NOT NULL;
CREATE INDEX runs_workflow ON runs (workflow_id, ord);
CREATE INDEX runs_status ON runs (status, ord);
CREATE INDEX runs_quarantine ON runs (ord) WHERE quarantine IS NOT NULL;
CREATE INDEX runs_child_ended ON runs (child_ended_us, ord) WHERE child_ended_us IS NOT NULL;
CREATE INDEX runs_orphan ON runs (orphan_us, ord) WHERE orphan_us IS NOT NULL;
CREATE INDEX runs_consumer ON runs (wakes_on, ord) WHERE wakes_on IS NOT NULL;
CREATE TABLE ledger (
    run_id   TEXT NOT NULL,
    seq      BIGINT NOT NULL,
    data     TEXT NOT NULL,
    hash     TEXT,
    idem_key TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE INDEX ledger_keyed ON ledger (run_id, idem_key) WHERE idem_key IS NOT NULL;
CREATE TABLE feed (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    seq      BIGINT UNIQUE,
    run_id   TEXT NOT NULL,
    from_seq BIGINT NOT NULL,
    to_seq   BIGINT NOT NULL
);
CREATE INDEX feed_unnumbered ON feed (id) WHERE seq IS NULL;
CREATE TABLE commands (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    command_id TEXT NOT NULL UNIQUE,
    data       TEXT NOT NULL
);
CREATE TABLE command_cursors (
    consumer TEXT PRIMARY KEY,
    seq      BIGINT NOT NULL
);
CREATE TABLE bundles (
    workflow_id TEXT PRIMARY KEY,
    dir         TEXT NOT NULL
);
CREATE TABLE compiled_digests (
    name   TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL
);
CREATE TABLE inbox (
    seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream     TEXT NOT NULL,
    dedupe_key TEXT NOT NULL,
    data       TEXT NOT NULL,
    UNIQUE (stream, dedupe_key)
);
CREATE INDEX inbox_stream ON inbox (stream, seq);
CREATE TABLE connections (
    connection_id TEXT PRIMARY KEY,
    ord           BIGINT GENERATED ALWAYS AS IDENTITY,
    data          TEXT NOT NULL
);
CREATE TABLE artifacts (
    artifact_id  TEXT PRIMARY KEY,
    content_type TEXT NOT NULL,
    size         BIGINT NOT NULL,
    run_id       TEXT,
    created_at   TEXT NOT NULL,
    content      BYTEA NOT NULL
);
CREATE TABLE snapshots (
    snapshot_id TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    data        TEXT NOT NULL
);
CREATE INDEX snapshots_run ON snapshots (run_id);
",
    // 1 -> 2: bundles' files, kept once per digest (every host runs what
    // the database keeps).
    "
ALTER TABLE bundles ADD COLUMN digest TEXT;
CREATE TABLE bundle_files (
    digest  TEXT NOT NULL,
    path    TEXT NOT NULL,
    content BYTEA NOT NULL,
    PRIMARY KEY (digest, path)
);
",
    // 2 -> 3: the rows no indexer attributed, which an installed indexer
    // fills (`Store::set_indexer`).
    "
CREATE INDEX IF NOT EXISTS runs_unindexed ON runs (ord) WHERE session_kind IS NULL;
",
    // 3 -> 4: deployed versions (a bundle kept before is version 1 of the
    // ids that named it).
    "
CREATE TABLE workflow_versions (
    workflow_id TEXT NOT NULL,
    version     INTEGER NOT NULL,
    digest      TEXT NOT NULL,
    deployed_at TEXT NOT NULL,
    deployed_by TEXT,
    source      TEXT,
    PRIMARY KEY (workflow_id, version)
);
INSERT INTO workflow_versions (workflow_id, version, digest, deployed_at, source)
    SELECT workflow_id, 1, digest,
           to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), dir
    FROM bundles WHERE digest IS NOT NULL;
DELETE FROM bundles WHERE digest IS NOT NULL;
",
    // 4 -> 5: when an artifact was last stored (microseconds since the
    // epoch; retention's sweep leaves what was stored lately). Rows from
    // before read as stored long ago.
    "
ALTER TABLE artifacts ADD COLUMN IF NOT EXISTS stored_us BIGINT;
",
];

/// A query of `workflow_versions` rows (as [`version_row`] reads them)
/// where the given condition holds.
macro_rules! versions_where {
    ($rest:literal) => {
        concat!(
            "SELECT workflow_id, version, digest, deployed_at, deployed_by, source
             FROM workflow_versions WHERE ",
            $rest
        )
    };
}

fn version_row(r: &postgres::Row) -> crate::WorkflowVersion {
    crate::WorkflowVersion {
        workflow_id: r.get(0),
        version: r.get::<_, i32>(1) as u32,
        digest: r.get(2),
        deployed_at: r.get(3),
        deployed_by: r.get(4),
        source: r.get(5),
    }
}

/// The lock every opening process takes while it reads (and migrates)
/// the schema: two hosts starting at once do not both migrate.
const MIGRATION_LOCK: i64 = 0x7374_6570_7765_6c6c; // "stepwell"

// The driver's periodic queries: each reads a partial index of what may be
// due and re-checks the other run by its key (see the SQLite store).

/// Due waits ([`Store::list_due`]): $1 now, $2 limit.
const DUE: &str = "SELECT run_id FROM runs
    WHERE wait_due_us IS NOT NULL AND wait_due_us <= $1 AND status = 'waiting'
      AND quarantine IS NULL AND COALESCE(defer_until_us, 0) <= $1
    ORDER BY wait_due_us, ord LIMIT $2";

/// Running runs free to claim ([`Store::list_claimable`]): $1 now, $2 limit.
const CLAIMABLE: &str = "SELECT run_id FROM runs
    WHERE status = 'running' AND quarantine IS NULL AND COALESCE(defer_until_us, 0) <= $1
      AND (lease_holder IS NULL OR lease_until_us < $1)
    ORDER BY COALESCE(defer_until_us, 0), ord LIMIT $2";

/// Running runs with a lease ([`Store::list_leased`]): $1 limit.
const LEASED: &str = "SELECT run_id, lease_holder FROM runs
    WHERE status = 'running' AND quarantine IS NULL AND lease_holder IS NOT NULL
    ORDER BY COALESCE(defer_until_us, 0), ord LIMIT $1";

/// Parents whose child ended ([`Store::list_ended_children`]): $1 limit,
/// $2 now.
const ENDED_CHILDREN: &str = "SELECT p.run_id, c.run_id FROM runs p
    JOIN runs c ON c.run_id = substr(p.wait_key, 13)
    WHERE p.child_ended_us IS NOT NULL AND p.status = 'waiting'
      AND p.wait_reason = 'subworkflow' AND p.wait_key LIKE 'subworkflow:%'
      AND p.quarantine IS NULL AND COALESCE(p.defer_until_us, 0) <= $2
      AND (c.status IN ('completed', 'failed', 'cancelled') OR c.quarantine IS NOT NULL)
    ORDER BY p.child_ended_us, p.ord LIMIT $1";

/// Unfinished children of cancelled parents ([`Store::list_orphans`]):
/// $1 limit, $2 now.
const ORPHANS: &str = "SELECT c.run_id FROM runs c
    JOIN runs p ON p.run_id = c.parent_run_id
    WHERE c.orphan_us IS NOT NULL AND c.status IN ('running', 'waiting')
      AND c.quarantine IS NULL AND COALESCE(c.defer_until_us, 0) <= $2
      AND p.status = 'cancelled'
    ORDER BY c.orphan_us, c.ord LIMIT $1";

/// When the earliest timed work falls due ([`Store::next_due`]), in
/// microseconds (NULL when none): first for time waits ($1: the runtime's
/// now), then for running runs, parents whose child ended and orphans ($2:
/// the system's now). A run counts from when nothing holds it back: its
/// due time, its deferral, and a lease someone holds on it (a claim waits
/// for it to lapse). What is already due is read whole (the same rows the
/// driver's queries read); what falls due later by an index seek, its
/// earliest due time a lower bound (a deferral may hold it longer: the
/// driver then wakes once for nothing).
const NEXT_DUE: &str = "SELECT
    LEAST(
      (SELECT MIN(GREATEST(COALESCE(defer_until_us, 0),
                           CASE WHEN lease_holder IS NOT NULL THEN lease_until_us END))
         FROM runs WHERE wait_due_us IS NOT NULL AND wait_due_us <= $1
           AND status = 'waiting' AND quarantine IS NULL),
      (SELECT MIN(wait_due_us) FROM runs
         WHERE wait_due_us IS NOT NULL AND wait_due_us > $1
           AND status = 'waiting' AND quarantine IS NULL)),
    LEAST(
      (SELECT MIN(GREATEST(COALESCE(defer_until_us, 0),
                           CASE WHEN lease_holder IS NOT NULL THEN lease_until_us END))
         FROM runs WHERE status = 'running' AND quarantine IS NULL
           AND COALESCE(defer_until_us, 0) <= $2),
      (SELECT MIN(COALESCE(defer_until_us, 0)) FROM runs
         WHERE status = 'running' AND quarantine IS NULL AND COALESCE(defer_until_us, 0) > $2),
      (SELECT MIN(GREATEST(COALESCE(p.defer_until_us, 0),
                           CASE WHEN p.lease_holder IS NOT NULL THEN p.lease_until_us END))
         FROM runs p JOIN runs c ON c.run_id = substr(p.wait_key, 13)
         WHERE p.child_ended_us IS NOT NULL AND p.status = 'waiting'
           AND p.wait_reason = 'subworkflow' AND p.wait_key LIKE 'subworkflow:%'
           AND p.quarantine IS NULL
           AND (c.status IN ('completed', 'failed', 'cancelled') OR c.quarantine IS NOT NULL)),
      (SELECT MIN(GREATEST(COALESCE(c.defer_until_us, 0),
                           CASE WHEN c.lease_holder IS NOT NULL THEN c.lease_until_us END))
         FROM runs c JOIN runs p ON p.run_id = c.parent_run_id
         WHERE c.orphan_us IS NOT NULL AND c.status IN ('running', 'waiting')
           AND c.quarantine IS NULL AND p.status = 'cancelled'))";

/// Marks the parent waiting on a child that ended: $1 now, $2 the child.
const MARK_PARENT: &str = "UPDATE runs SET child_ended_us = $1
    WHERE status = 'waiting' AND wait_key = 'subworkflow:' || $2
      AND wait_reason = 'subworkflow' AND child_ended_us IS NULL";

/// PostgreSQL's marks (`$1`) and creation order (`ord`).
const DIALECT: super::SqlDialect = super::SqlDialect {
    mark: |n| format!("${n}"),
    order: "ord",
};

/// A new run's row: the parameters of [`RunRow::values`], its chain's head
/// read from the ledger (records appended before it existed; the caller
/// holds the run's ledger lock).
const INSERT_RUN: &str = "INSERT INTO runs (run_id, workflow_id, status, wait_reason, wait_key,
        wait_due_us, parent_run_id, session_id, data, version, automation_id, role,
        occurrence_index, session_kind, workspace_root, created_at, updated_at,
        lease_holder, lease_until_us, ledger_seq, wakes_on, head_seq, head_hash)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
        $19, $20, $21, COALESCE((SELECT MAX(seq) FROM ledger WHERE run_id = $1), 0),
        (SELECT hash FROM ledger WHERE run_id = $1 ORDER BY seq DESC LIMIT 1))
    ON CONFLICT (run_id) DO NOTHING";

/// Where a new run's ledger ends (records appended before the run existed),
/// read after the run's ledger lock was taken: $1 the run.
const LEDGER_HEAD: &str =
    "SELECT seq, hash FROM ledger WHERE run_id = $1 ORDER BY seq DESC LIMIT 1";

/// A step's records and its run, in one statement: the ledger rows
/// ($23..$27), one feed entry per run and the chain heads of runs other
/// than this one ($28..$31: run, last seq, last hash, seq before), the run's
/// row ($1..$21, $22 whether its shape changed) with its own head ($32,
/// $33). A save whose indexer gives no session kind ($14, a process
/// without one) keeps the attribution columns the row has.
const COMMIT_UPDATE: &str = "WITH l AS (INSERT INTO ledger (run_id, seq, data, hash, idem_key)
        SELECT * FROM unnest($23::text[], $24::bigint[], $25::text[], $26::text[], $27::text[])),
    f AS (INSERT INTO feed (run_id, from_seq, to_seq)
        SELECT id, before + 1, seq
        FROM unnest($28::text[], $29::bigint[], $30::text[], $31::bigint[]) AS u(id, seq, hash, before)),
    h AS (UPDATE runs r SET head_seq = u.seq, head_hash = u.hash
        FROM unnest($28::text[], $29::bigint[], $30::text[], $31::bigint[]) AS u(id, seq, hash, before)
        WHERE r.run_id = u.id AND u.id <> $1)
    UPDATE runs SET workflow_id = $2, status = $3, wait_reason = $4,
        wait_key = $5, wait_due_us = $6, parent_run_id = $7, session_id = $8,
        data = $9, version = $10,
        automation_id = CASE WHEN $14::text IS NULL THEN automation_id ELSE $11 END,
        role = CASE WHEN $14::text IS NULL THEN role ELSE $12 END,
        occurrence_index = CASE WHEN $14::text IS NULL THEN occurrence_index ELSE $13 END,
        session_kind = COALESCE($14, session_kind), workspace_root = $15,
        created_at = $16, updated_at = $17, lease_holder = $18,
        lease_until_us = $19, ledger_seq = $20,
        wakes_on = CASE WHEN $14::text IS NULL THEN wakes_on ELSE $21 END,
        defer_until_us = NULL, defer_count = NULL, defer_reason = NULL,
        child_ended_us = CASE WHEN $22 THEN NULL ELSE child_ended_us END,
        orphan_us = CASE WHEN $3 IN ('running', 'waiting') THEN orphan_us END,
        head_seq = $32, head_hash = $33
    WHERE run_id = $1";

/// A new run's first commit, as [`COMMIT_UPDATE`] without `$22`: the
/// chain at $22..$30, its head at $31, $32.
const COMMIT_INSERT: &str = "WITH l AS (INSERT INTO ledger (run_id, seq, data, hash, idem_key)
        SELECT * FROM unnest($22::text[], $23::bigint[], $24::text[], $25::text[], $26::text[])),
    f AS (INSERT INTO feed (run_id, from_seq, to_seq)
        SELECT id, before + 1, seq
        FROM unnest($27::text[], $28::bigint[], $29::text[], $30::bigint[]) AS u(id, seq, hash, before)),
    h AS (UPDATE runs r SET head_seq = u.seq, head_hash = u.hash
        FROM unnest($27::text[], $28::bigint[], $29::text[], $30::bigint[]) AS u(id, seq, hash, before)
        WHERE r.run_id = u.id AND u.id <> $1)
    INSERT INTO runs (run_id, workflow_id, status, wait_reason, wait_key,
        wait_due_us, parent_run_id, session_id, data, version, automation_id, role,
        occurrence_index, session_kind, workspace_root, created_at, updated_at,
        lease_holder, lease_until_us, ledger_seq, wakes_on, head_seq, head_hash)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
        $19, $20, $21, $31, $32)
    ON CONFLICT (run_id) DO NOTHING";

/// Records appended outside a commit, in one statement: the ledger rows
/// ($1..$5), then per run its feed entry and new chain head ($6..$9: run,
/// last seq, last hash, seq before); with $10, a run whose ledger was
/// committed up to where this append began moves its mark past it.
const APPEND: &str = "WITH l AS (INSERT INTO ledger (run_id, seq, data, hash, idem_key)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[])),
    f AS (INSERT INTO feed (run_id, from_seq, to_seq)
        SELECT id, before + 1, seq
        FROM unnest($6::text[], $7::bigint[], $8::text[], $9::bigint[]) AS u(id, seq, hash, before))
    UPDATE runs r SET head_seq = u.seq, head_hash = u.hash,
        ledger_seq = CASE WHEN $10 AND COALESCE(r.ledger_seq, 0) = u.before THEN u.seq
                     ELSE r.ledger_seq END
    FROM unnest($6::text[], $7::bigint[], $8::text[], $9::bigint[]) AS u(id, seq, hash, before)
    WHERE r.run_id = u.id";

/// What a transaction serializes on (see the module's documentation): a
/// 64-bit key from the kind and the id, the same in every process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct LockKey(i64);

impl LockKey {
    fn new(kind: &str, id: &str) -> LockKey {
        // FNV-1a: stable across builds and machines (std's hashers are not).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in kind.bytes().chain([0]).chain(id.bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        LockKey(h as i64)
    }

    /// A run's ledger chain.
    fn ledger(run_id: &str) -> LockKey {
        LockKey::new("ledger", run_id)
    }

    /// The marker of the parent waiting on `child`.
    fn child(child: &str) -> LockKey {
        LockKey::new("child", child)
    }

    /// The orphan markers of `parent`'s children.
    fn parent(parent: &str) -> LockKey {
        LockKey::new("parent", parent)
    }
}

/// One pooled connection with its prepared statements.
struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl Conn {
    fn statement(&mut self, sql: &'static str) -> Result<Statement, postgres::Error> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.client.prepare(sql)?;
        self.statements.insert(sql, st.clone());
        Ok(st)
    }

    fn query(
        &mut self,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, postgres::Error> {
        let st = self.statement(sql)?;
        self.client.query(&st, args)
    }

    fn query_opt(
        &mut self,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, postgres::Error> {
        let st = self.statement(sql)?;
        self.client.query_opt(&st, args)
    }

    fn execute(
        &mut self,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, postgres::Error> {
        let st = self.statement(sql)?;
        self.client.execute(&st, args)
    }

    /// Takes the transaction-scoped advisory locks `keys`, in key order
    /// (every transaction takes its locks in the same order: no deadlock
    /// between two of them).
    fn lock(&mut self, keys: &mut Vec<LockKey>) -> Result<(), postgres::Error> {
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = keys.iter().map(|k| k.0).collect();
        self.query(
            "SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) AS k ORDER BY k",
            &[&ids],
        )?;
        Ok(())
    }
}

/// Why a transaction failed: the database's own error (retried when the
/// connection broke or PostgreSQL chose it as a deadlock victim), or the
/// store's verdict (a fence that did not hold).
enum TxError {
    Db(postgres::Error),
    Store(StoreError),
}

impl From<postgres::Error> for TxError {
    fn from(e: postgres::Error) -> Self {
        TxError::Db(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

/// Every connection's settings, whatever the server's defaults:
/// - `READ COMMITTED`: each statement sees what committed before it began,
///   which the lock handshakes rely on (a statement after a lock sees the
///   holder's commit);
/// - `lock_timeout`: no statement waits more than 5 s for a lock (a host
///   stalled inside a transaction holds its locks: the waiter gives up,
///   and its transaction is tried again or reported);
/// - `idle_in_transaction_session_timeout`: a host stalled inside a
///   transaction (paused, cut off) for 10 s loses it: the server rolls it
///   back and frees its locks; its late `COMMIT` fails, changing nothing.
///   (stepwell never keeps a transaction open while it does anything else.)
const SESSION: &str = "SET default_transaction_isolation = 'read committed';
    SET lock_timeout = '5s';
    SET idle_in_transaction_session_timeout = '10s'";

/// How many times a transaction is tried when the connection broke or it
/// lost a deadlock before it committed.
const ATTEMPTS: u32 = 5;

/// How long opening a store, or a transaction, waits for a server that
/// refuses connections (restarting) before it reports the failure.
const CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 16;

/// Runs, ledgers, the inboxes, artifacts and snapshots in one PostgreSQL
/// database (or one schema of it: the URL's `options=-csearch_path=...`),
/// shared by every host that opens it. Runs list in creation order.
pub struct PostgresStore {
    config: postgres::Config,
    /// The URL without its password, for messages.
    shown: String,
    /// The schema the URL names (`options=-csearch_path=NAME`), created
    /// when missing; `None`: the database's default (`public`).
    schema: Option<String>,
    idle: Mutex<Vec<Conn>>,
    /// The connection that listens for work signals, once one waited.
    listener: Mutex<Option<Client>>,
    /// The channel of this store's signals (`stepwell_<schema>`).
    channel: String,
    indexer: super::index::IndexerSlot,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .finish()
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://user:pass@host:port/db`,
    /// or any libpq key/value string), creates or migrates its schema, and
    /// refuses a database written by a newer stepwell.
    pub fn open(url: &str) -> Result<Self, StoreError> {
        let shown = super::redact_url(url);
        let mut config: postgres::Config = url.parse().map_err(|e| StoreError {
            code: "store_io",
            message: format!("{shown}: not a PostgreSQL connection string: {e}"),
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(10));
        }
        config.application_name("stepwell");
        // A server or network that vanished without a word is noticed in
        // about half a minute, not the kernel's two hours.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(15))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        let schema = search_path_schema(&config).map_err(|message| StoreError {
            code: "store_io",
            message: format!("{shown}: {message}"),
        })?;
        let channel = format!("stepwell_{}", schema.as_deref().unwrap_or("public"));
        let store = PostgresStore {
            config,
            shown,
            schema,
            idle: Mutex::new(Vec::new()),
            listener: Mutex::new(None),
            channel,
            indexer: Default::default(),
        };
        // A server that is restarting (or not up yet, as when hosts and
        // database start together) is waited for, up to CONNECT_PATIENCE.
        // So is one that restarts while the schema is read or migrated (in
        // one transaction: tried again whole).
        // An answer that no retry changes (an unknown role or database, a
        // wrong password) fails at once.
        let started = std::time::Instant::now();
        let patient = || started.elapsed() < CONNECT_PATIENCE;
        let mut said = false;
        let conn = loop {
            match store.try_connect() {
                Ok(mut conn) => match store.migrate(&mut conn) {
                    Ok(()) => break conn,
                    Err(_) if conn.client.is_closed() && patient() => {}
                    Err(e) => return Err(e),
                },
                Err((e, true)) if patient() => {
                    if !said {
                        said = true;
                        tracing::info!(
                            target: "stepwell::progress",
                            "{e}: trying again for up to {} s",
                            CONNECT_PATIENCE.as_secs()
                        );
                    }
                }
                Err((e, _)) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        store.idle.lock().push(conn);
        Ok(store)
    }

    /// The URL it was opened with, without the password.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The schema version of the database (after [`PostgresStore::open`]
    /// migrated it: [`SCHEMA_VERSION`]).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        self.read(|c| {
            let row = c.query_opt("SELECT version FROM stepwell_schema", &[])?;
            Ok(row.map_or(0, |r| r.get(0)))
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::io(format!("{}: {e}", self.shown))
    }

    /// A database error, with what PostgreSQL said when it said something,
    /// else the error and its causes (a refused connection, a timeout).
    fn db_err(&self, e: &postgres::Error) -> StoreError {
        if let Some(db) = e.as_db_error() {
            return self.err(format!("{} ({})", db.message(), db.code().code()));
        }
        let mut text = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        self.err(text)
    }

    fn connect(&self) -> Result<Conn, StoreError> {
        self.try_connect().map_err(|(e, _)| e)
    }

    /// A new connection, or why not and whether trying again may work.
    fn try_connect(&self) -> Result<Conn, (StoreError, bool)> {
        let failed = |e: postgres::Error| (self.db_err(&e), Self::may_pass(&e));
        let mut client = self.config.connect(NoTls).map_err(failed)?;
        client.batch_execute(SESSION).map_err(failed)?;
        Ok(Conn {
            client,
            statements: HashMap::new(),
        })
    }

    /// Whether a failed connection may work when tried again: the server
    /// could not be reached (refused, reset: not up yet, or restarting), or
    /// said it is starting, stopping or full. Any other answer (an unknown
    /// role or database, a wrong or missing password, TLS refused) is
    /// final.
    fn may_pass(e: &postgres::Error) -> bool {
        match e.code() {
            // No answer from the server: an I/O error (refused, reset, a
            // timeout, a name not resolved yet) may pass; a configuration,
            // TLS or authentication error (a password the server asked
            // for and the URL lacks) is final.
            None => {
                let mut cause = std::error::Error::source(e);
                while let Some(c) = cause {
                    if c.is::<std::io::Error>() {
                        return true;
                    }
                    cause = c.source();
                }
                false
            }
            Some(code) => [
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code),
        }
    }

    /// A new connection listening on this store's channel.
    fn listen(&self) -> Result<Client, StoreError> {
        let mut client = self.config.connect(NoTls).map_err(|e| self.db_err(&e))?;
        // A checked identifier (see `search_path_schema`).
        client
            .batch_execute(&format!("LISTEN \"{}\"", self.channel))
            .map_err(|e| self.db_err(&e))?;
        Ok(client)
    }

    fn checkout(&self) -> Result<Conn, StoreError> {
        loop {
            let Some(conn) = self.idle.lock().pop() else {
                return self.connect();
            };
            if !conn.client.is_closed() {
                return Ok(conn);
            }
        }
    }

    fn checkin(&self, conn: Conn) {
        if conn.client.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    /// Whether a failed transaction may be tried again: it did not commit
    /// (the connection broke before COMMIT was sent, or PostgreSQL undid it
    /// as a deadlock or serialization victim).
    fn retryable(e: &postgres::Error) -> bool {
        match e.code() {
            // Not the server's answer: the connection broke (I/O), so the
            // transaction did not commit.
            None => true,
            Some(code) => [
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::LOCK_NOT_AVAILABLE,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
            ]
            .contains(code),
        }
    }

    /// Runs `f` in one transaction (read committed), trying it again on a
    /// new connection when it failed before it committed.
    fn write<T>(&self, f: impl FnMut(&mut Conn) -> Result<T, TxError>) -> Result<T, StoreError> {
        self.attempt(true, f)
    }

    /// Runs `f` outside a transaction (one statement, or reads), trying it
    /// again on a new connection when the connection broke.
    fn read<T>(&self, f: impl FnMut(&mut Conn) -> Result<T, TxError>) -> Result<T, StoreError> {
        self.attempt(false, f)
    }

    /// Runs `f` (in a transaction, or not), up to [`ATTEMPTS`] times while
    /// it fails in a way that changed nothing ([`PostgresStore::retryable`]).
    fn attempt<T>(
        &self,
        transaction: bool,
        mut f: impl FnMut(&mut Conn) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        let mut attempt = 0;
        let started = std::time::Instant::now();
        loop {
            attempt += 1;
            let mut conn = match self.checkout() {
                Ok(c) => c,
                // The server refuses connections (restarting): wait for it.
                Err(_) if started.elapsed() < CONNECT_PATIENCE => {
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let outcome = if transaction {
                self.transaction(&mut conn, &mut f)
            } else {
                f(&mut conn)
            };
            match outcome {
                Ok(v) => {
                    self.checkin(conn);
                    return Ok(v);
                }
                Err(TxError::Store(e)) => {
                    self.checkin(conn);
                    return Err(e);
                }
                Err(TxError::Db(e)) if attempt < ATTEMPTS && Self::retryable(&e) => {
                    self.after_failure(conn, &e);
                    std::thread::sleep(Duration::from_millis(10 << attempt.min(5)));
                }
                Err(TxError::Db(e)) => {
                    self.after_failure(conn, &e);
                    return Err(self.db_err(&e));
                }
            }
        }
    }

    /// `f` between `BEGIN` and `COMMIT` (rolled back if it fails). A
    /// `COMMIT` sent with no answer leaves the outcome unknown: that is
    /// reported, never tried again.
    fn transaction<T>(
        &self,
        conn: &mut Conn,
        f: &mut impl FnMut(&mut Conn) -> Result<T, TxError>,
    ) -> Result<T, TxError> {
        conn.client
            .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")?;
        match f(conn) {
            Ok(v) => {
                conn.client.batch_execute("COMMIT").map_err(|e| {
                    if e.as_db_error().is_some() {
                        // The server answered: it rolled back.
                        return TxError::Db(e);
                    }
                    let cause = self.db_err(&e).message;
                    TxError::Store(StoreError::io(format!(
                        "{cause}: the commit's outcome is unknown; read the run again"
                    )))
                })?;
                Ok(v)
            }
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Puts a connection whose transaction failed back in the pool, unless
    /// the failure was the connection's own (then it and every idle one,
    /// likely as stale after a server restart, are dropped).
    fn after_failure(&self, conn: Conn, e: &postgres::Error) {
        if e.as_db_error().is_some() && !conn.client.is_closed() {
            self.checkin(conn);
        } else {
            self.idle.lock().clear();
        }
    }

    /// Creates the schema or brings it to [`SCHEMA_VERSION`], in one
    /// transaction under [`MIGRATION_LOCK`] (nothing when it is there).
    fn migrate(&self, conn: &mut Conn) -> Result<(), StoreError> {
        // Up to date (the common case): no lock, no DDL, so hosts whose
        // role may only read and write the tables open it too.
        let found = conn
            .client
            .query_opt("SELECT version FROM stepwell_schema", &[]);
        if let Ok(Some(row)) = &found {
            let version: i64 = row.get(0);
            if version == SCHEMA_VERSION {
                return Ok(());
            }
        }
        let run = |conn: &mut Conn| -> Result<(), TxError> {
            conn.client.batch_execute("BEGIN")?;
            conn.client
                .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
            if let Some(schema) = &self.schema {
                // A checked identifier (see `search_path_schema`).
                conn.client
                    .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))?;
            }
            conn.client.batch_execute(
                "CREATE TABLE IF NOT EXISTS stepwell_schema (
                     one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
                     version BIGINT NOT NULL)",
            )?;
            let version: i64 = conn
                .client
                .query_opt("SELECT version FROM stepwell_schema", &[])?
                .map_or(0, |r| r.get(0));
            if version > SCHEMA_VERSION {
                return Err(TxError::Store(StoreError {
                    code: "store_schema",
                    message: format!(
                        "{}: written by a newer stepwell (schema {version}, this build reads up to {SCHEMA_VERSION}); refusing to open it",
                        self.shown
                    ),
                }));
            }
            for (from, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                conn.client.batch_execute(sql)?;
                conn.client.execute(
                    "INSERT INTO stepwell_schema (version) VALUES ($1)
                     ON CONFLICT (one) DO UPDATE SET version = excluded.version",
                    &[&(from as i64 + 1)],
                )?;
            }
            conn.client.batch_execute("COMMIT")?;
            Ok(())
        };
        match run(conn) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = conn.client.batch_execute("ROLLBACK");
                Err(match e {
                    TxError::Store(e) => e,
                    TxError::Db(e) => self.db_err(&e),
                })
            }
        }
    }

    fn decode_run(&self, run_id: &str, data: &str, version: i64) -> Result<RunState, StoreError> {
        let mut run: RunState = serde_json::from_str(data).map_err(|e| {
            StoreError::corrupt(format!("{}: runs row {run_id:?}: {e}", self.shown))
        })?;
        run.version = version as u64;
        Ok(run)
    }

    fn ids(
        &self,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<String>, StoreError> {
        self.read(|c| Ok(c.query(sql, args)?.iter().map(|r| r.get(0)).collect()))
    }

    fn pairs(
        &self,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|c| {
            Ok(c.query(sql, args)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    /// The records `sql` selects (`seq, data`) with `run_id` as `$1` and
    /// `args` after it.
    fn records(
        &self,
        run_id: &str,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<StepRecord>, StoreError> {
        self.read_records(run_id, sql, args, |_, r| r)
    }

    /// The records `sql` selects (`seq, data`), each with its seq.
    fn numbered_records(
        &self,
        run_id: &str,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        self.read_records(run_id, sql, args, |seq, r| (seq, r))
    }

    /// The records `sql` selects (`seq, data`), each as `keep` makes it.
    fn read_records<T>(
        &self,
        run_id: &str,
        sql: &'static str,
        args: &[&(dyn ToSql + Sync)],
        keep: impl Fn(u64, StepRecord) -> T,
    ) -> Result<Vec<T>, StoreError> {
        let rows = self.read(|c| {
            let mut all: Vec<&(dyn ToSql + Sync)> = vec![&run_id];
            all.extend_from_slice(args);
            Ok(c.query(sql, &all)?)
        })?;
        rows.iter()
            .map(|row| {
                let (seq, data): (i64, &str) = (row.get(0), row.get(1));
                let record = serde_json::from_str(data).map_err(|e| {
                    StoreError::corrupt(format!(
                        "{}: ledger row {seq} of run {run_id}: {e}",
                        self.shown
                    ))
                })?;
                Ok(keep(seq as u64, record))
            })
            .collect()
    }

    /// Why a fenced write to `run_id` did not land, from its row (`None`:
    /// no such run).
    fn conflict(run_id: &str, fence: &Fence<'_>, found: Option<&Current>) -> StoreError {
        StoreError::conflict(match found {
            None if fence.version == 0 => format!("run {run_id}: cannot be created"),
            None => format!("run {run_id} does not exist"),
            Some(_) if fence.version == 0 => format!("run {run_id} already exists"),
            Some(Current {
                quarantine: Some(q),
                ..
            }) => format!("run {run_id} is quarantined: {q}"),
            Some(c) if c.version as u64 != fence.version => format!(
                "run {run_id} is at version {}, not {} (changed by another writer)",
                c.version, fence.version
            ),
            Some(c) => format!(
                "run {run_id} is leased by {}, not {}",
                c.lease_holder.as_deref().unwrap_or("nobody"),
                fence.holder.unwrap_or("-")
            ),
        })
    }

    /// The run's row, locked for this transaction, if it exists. A run's
    /// row lock is its ledger's lock too: every append to a run that has a
    /// row locks it, and reads where its chain ends from it (`head_seq`,
    /// `head_hash`: a locked row is the newest version, even if another
    /// transaction committed it after this statement began).
    fn current(conn: &mut Conn, run_id: &str) -> Result<Option<Current>, postgres::Error> {
        Ok(conn
            .query_opt(
                "SELECT version, lease_holder, lease_until_us, quarantine, status, wait_reason,
                        wait_key, parent_run_id, head_seq, head_hash, wait_due_us
                 FROM runs WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )?
            .map(|r| Current {
                version: r.get(0),
                lease_holder: r.get(1),
                lease_until_us: r.get(2),
                quarantine: r.get(3),
                status: r.get(4),
                wait_reason: r.get(5),
                wait_key: r.get(6),
                parent_run_id: r.get(7),
                head: (r.get(8), r.get(9)),
                due: r.get(10),
            }))
    }

    /// One run commit inside a transaction: the fence checked on the
    /// locked row, the records appended, the run saved with where its
    /// ledger now ends, and the driver's markers kept true.
    fn commit_on(
        &self,
        conn: &mut Conn,
        records: &[StepRecord],
        run: &RunState,
        fence: &Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), TxError> {
        let (current, head) = if fence.version == 0 {
            // A new run: records may have been appended before it existed.
            conn.lock(&mut vec![LockKey::ledger(&run.run_id)])?;
            (None, ledger_head(conn, &run.run_id)?)
        } else {
            let current = Self::current(conn, &run.run_id)?;
            match &current {
                Some(c) if c.admits(fence) => {}
                other => return Err(Self::conflict(&run.run_id, fence, other.as_ref()).into()),
            }
            let head = current.as_ref().map(|c| c.head.clone()).unwrap_or_default();
            (current, head)
        };
        // Only a save that changes the status, the wait or the parent can
        // change a marker.
        let changed = current.as_ref().is_none_or(|c| !c.same_shape(run));
        if changed {
            conn.lock(&mut marker_keys(run))?;
        }
        let chain = Chain::link(conn, records, vec![(run.run_id.clone(), head)])?;
        let (seq, hash) = chain.head_of(&run.run_id);
        let claimable = run.status == RunStatus::Running && lease == LeaseAfter::Release;
        let lease = match (lease, fence.holder) {
            (LeaseAfter::Renew(until), Some(h)) => (Some(h), Some(until.timestamp_micros())),
            _ => (None, None),
        };
        let row = RunRow::new(run, self.indexer.get().as_ref(), lease, Some(seq))?;
        let mut values = row.values();
        let n = if fence.version == 0 {
            values.extend(chain.params());
            values.push(&seq);
            values.push(&hash);
            conn.execute(COMMIT_INSERT, &values)?
        } else {
            values.push(&changed);
            values.extend(chain.params());
            values.push(&seq);
            values.push(&hash);
            conn.execute(COMMIT_UPDATE, &values)?
        };
        if n == 0 {
            let found = Self::current(conn, &run.run_id)?;
            return Err(Self::conflict(&run.run_id, fence, found.as_ref()).into());
        }
        if changed {
            mark(conn, run)?;
        }
        // Work for a driver: a run free to claim, or one whose end moves a
        // parent, or whose cancel orphans its children. (The end of a run
        // without a parent is no work: signalling it would wake every
        // host's driver for a pass that finds nothing.)
        // A new time wait, or one moved, too: idle drivers sleep until the
        // earliest they know of.
        let new_due = row.due.is_some() && current.as_ref().is_none_or(|c| c.due != row.due);
        let moves_others = run.parent_run_id.is_some() || run.status == RunStatus::Cancelled;
        if claimable || new_due || (changed && run.status.is_terminal() && moves_others) {
            signal(conn, &self.channel)?;
        }
        Ok(())
    }

    /// Numbers the committed feed entries that have no number yet, in the
    /// order they became visible (under a lock: one numberer at a time).
    fn number_feed(&self) -> Result<(), StoreError> {
        self.write(|c| {
            c.lock(&mut vec![LockKey::new("feed", "")])?;
            c.execute(
                "UPDATE feed f SET seq = n.base + n.rank
                 FROM (SELECT id, (SELECT COALESCE(MAX(seq), 0) FROM feed) AS base,
                              row_number() OVER (ORDER BY id) AS rank
                       FROM feed WHERE seq IS NULL) n
                 WHERE f.id = n.id",
                &[],
            )?;
            Ok(())
        })
    }
}

/// The schema a connection's `search_path` option names (its first
/// entry), if it sets one: `options=-csearch_path=NAME` in a URL (`%3D` for
/// the `=`), or `options='-c search_path=NAME'` in a key/value string. Only
/// letters, digits and `_` (a name that needs no quoting), at most
/// [`MAX_SCHEMA`] of them, in lower case as the server reads it.
fn search_path_schema(config: &postgres::Config) -> Result<Option<String>, String> {
    let Some(options) = config.get_options() else {
        return Ok(None);
    };
    let Some(at) = options.find("search_path=") else {
        return Ok(None);
    };
    let value = options[at + "search_path=".len()..]
        .split([' ', ','])
        .next()
        .unwrap_or_default();
    // The server folds an unquoted name to lower case; the signal channel
    // `stepwell_<name>` must fit PostgreSQL's 63 bytes.
    if value.is_empty()
        || value.len() > MAX_SCHEMA
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(format!(
            "search_path {value:?}: a stepwell schema name is 1 to {MAX_SCHEMA} letters, digits or _"
        ));
    }
    Ok(Some(value.to_ascii_lowercase()))
}

/// The longest schema name: `stepwell_` and it make a channel name of at
/// most 63 bytes.
const MAX_SCHEMA: usize = 63 - "stepwell_".len();

/// Signals new work to every host listening (delivered when the
/// transaction commits; several signals of one transaction are one).
fn signal(conn: &mut Conn, channel: &str) -> Result<(), postgres::Error> {
    conn.query("SELECT pg_notify($1, '')", &[&channel])?;
    Ok(())
}

/// The columns of a run's row a commit reads under its lock.
struct Current {
    version: i64,
    lease_holder: Option<String>,
    lease_until_us: Option<i64>,
    quarantine: Option<String>,
    status: String,
    wait_reason: Option<String>,
    wait_key: Option<String>,
    parent_run_id: Option<String>,
    /// The last seq and hash of its ledger (0 and none for none).
    head: (i64, Option<String>),
    /// When its time wait falls due (microseconds), if it has one.
    due: Option<i64>,
}

impl Current {
    /// Whether `fence` holds on this row.
    fn admits(&self, fence: &Fence<'_>) -> bool {
        let lease = match (&self.lease_holder, self.lease_until_us) {
            (Some(h), Some(u)) => Some((
                h.as_str(),
                DateTime::from_timestamp_micros(u).unwrap_or(DateTime::<Utc>::MAX_UTC),
            )),
            (Some(h), None) => Some((h.as_str(), DateTime::<Utc>::MIN_UTC)),
            _ => None,
        };
        self.quarantine.is_none() && self.version as u64 == fence.version && fence.admits(lease)
    }

    /// Whether `run` has this row's status, wait and parent (a save that
    /// cannot change a marker).
    fn same_shape(&self, run: &RunState) -> bool {
        let w = run.waiting.as_ref();
        self.status == run.status.as_str()
            && self.wait_reason.as_deref() == w.map(|w| w.reason.as_str())
            && self.wait_key.as_deref() == w.map(|w| w.wait_key.as_str())
            && self.parent_run_id == run.parent_run_id
    }
}

/// The marker locks a save of `run` that changes its shape takes.
fn marker_keys(run: &RunState) -> Vec<LockKey> {
    let mut keys = vec![LockKey::child(&run.run_id), LockKey::parent(&run.run_id)];
    if let Some(child) = waited_child(run) {
        keys.push(LockKey::child(child));
    }
    if let Some(parent) = &run.parent_run_id {
        keys.push(LockKey::parent(parent));
    }
    keys
}

/// The child `run` waits on, if it waits on one.
fn waited_child(run: &RunState) -> Option<&str> {
    run.waiting
        .as_ref()
        .filter(|w| run.status == RunStatus::Waiting && w.reason.as_str() == "subworkflow")
        .and_then(|w| w.wait_key.strip_prefix("subworkflow:"))
}

/// Where a run's ledger ends (seq and hash; 0 and none for none), read
/// from the ledger itself: for a run without a row, under its ledger lock.
fn ledger_head(conn: &mut Conn, run_id: &str) -> Result<(i64, Option<String>), postgres::Error> {
    Ok(conn
        .query_opt(LEDGER_HEAD, &[&run_id])?
        .map_or((0, None), |r| (r.get(0), r.get(1))))
}

/// Where a run's ledger ends, with the run's ledger locked for this
/// transaction: its row's lock and head, or, for a run without a row, its
/// ledger's advisory lock and the ledger's last record.
fn locked_head(conn: &mut Conn, run_id: &str) -> Result<(i64, Option<String>), postgres::Error> {
    const ROW: &str = "SELECT head_seq, head_hash FROM runs WHERE run_id = $1 FOR UPDATE";
    if let Some(row) = conn.query_opt(ROW, &[&run_id])? {
        return Ok((row.get(0), row.get(1)));
    }
    conn.lock(&mut vec![LockKey::ledger(run_id)])?;
    // Created meanwhile (its creator held the same lock)?
    if let Some(row) = conn.query_opt(ROW, &[&run_id])? {
        return Ok((row.get(0), row.get(1)));
    }
    ledger_head(conn, run_id)
}

/// Records linked into their runs' chains, as the arrays the append
/// statements insert.
#[derive(Default)]
struct Chain {
    ids: Vec<String>,
    seqs: Vec<i64>,
    datas: Vec<String>,
    hashes: Vec<Option<String>>,
    keys: Vec<Option<String>>,
    /// Per run appended to: its id, last seq and hash, and seq before.
    runs: Vec<String>,
    run_seqs: Vec<i64>,
    run_hashes: Vec<Option<String>>,
    befores: Vec<i64>,
    /// Heads known before linking (runs whose rows the caller locked).
    known: Vec<(String, (i64, Option<String>))>,
}

impl Chain {
    /// Links `records` into their runs' chains: the heads of the runs in
    /// `known` are given (their rows locked by the caller); the others are
    /// locked and read here.
    fn link(
        conn: &mut Conn,
        records: &[StepRecord],
        known: Vec<(String, (i64, Option<String>))>,
    ) -> Result<Chain, postgres::Error> {
        let mut chain = Chain {
            known,
            ..Chain::default()
        };
        for r in records {
            let i = match chain.runs.iter().position(|id| *id == r.run_id) {
                Some(i) => i,
                None => {
                    let head = match chain.known.iter().find(|(id, _)| *id == r.run_id) {
                        Some((_, head)) => head.clone(),
                        None => locked_head(conn, &r.run_id)?,
                    };
                    chain.runs.push(r.run_id.clone());
                    chain.run_seqs.push(head.0);
                    chain.run_hashes.push(head.1);
                    chain.befores.push(head.0);
                    chain.runs.len() - 1
                }
            };
            let data = link_json(&mut chain.run_hashes[i], r);
            chain.run_seqs[i] += 1;
            chain.ids.push(r.run_id.clone());
            chain.seqs.push(chain.run_seqs[i]);
            chain.datas.push(data);
            chain.hashes.push(chain.run_hashes[i].clone());
            chain.keys.push(r.idempotency_key.clone());
        }
        Ok(chain)
    }

    /// Where `run_id`'s ledger ends after this append.
    fn head_of(&self, run_id: &str) -> (i64, Option<String>) {
        match self.runs.iter().position(|id| id == run_id) {
            Some(i) => (self.run_seqs[i], self.run_hashes[i].clone()),
            None => self
                .known
                .iter()
                .find(|(id, _)| id == run_id)
                .map(|(_, head)| head.clone())
                .unwrap_or_default(),
        }
    }

    /// The ledger rows, then per run its new head and seq before (nine
    /// arrays, in the order of [`COMMIT_UPDATE`]'s and [`APPEND`]'s
    /// parameters).
    fn params(&self) -> [&(dyn ToSql + Sync); 9] {
        [
            &self.ids,
            &self.seqs,
            &self.datas,
            &self.hashes,
            &self.keys,
            &self.runs,
            &self.run_seqs,
            &self.run_hashes,
            &self.befores,
        ]
    }
}

/// Keeps the driver's two markers true after `run` was saved with a new
/// shape (its marker locks held): see `SqliteStore::mark`.
fn mark(conn: &mut Conn, run: &RunState) -> Result<(), postgres::Error> {
    let now = Utc::now().timestamp_micros();
    if run.status != RunStatus::Cancelled {
        conn.execute(
            "UPDATE runs SET orphan_us = NULL WHERE parent_run_id = $1 AND orphan_us IS NOT NULL",
            &[&run.run_id],
        )?;
    }
    if run.status.is_terminal() {
        conn.execute(MARK_PARENT, &[&now, &run.run_id])?;
        if run.status == RunStatus::Cancelled {
            conn.execute(
                "UPDATE runs SET orphan_us = $1 WHERE parent_run_id = $2
                   AND status IN ('running', 'waiting') AND orphan_us IS NULL",
                &[&now, &run.run_id],
            )?;
        }
        return Ok(());
    }
    conn.execute(
        "UPDATE runs SET child_ended_us = NULL
          WHERE status = 'waiting' AND wait_key = 'subworkflow:' || $1
            AND wait_reason = 'subworkflow' AND child_ended_us IS NOT NULL",
        &[&run.run_id],
    )?;
    if let Some(child) = waited_child(run) {
        conn.execute(
            "UPDATE runs SET child_ended_us = $1 WHERE run_id = $2 AND child_ended_us IS NULL
               AND EXISTS (SELECT 1 FROM runs c WHERE c.run_id = $3
                 AND (c.status IN ('completed', 'failed', 'cancelled')
                      OR c.quarantine IS NOT NULL))",
            &[&now, &run.run_id, &child],
        )?;
    }
    if let Some(parent) = &run.parent_run_id {
        conn.execute(
            "UPDATE runs SET orphan_us = CASE WHEN EXISTS
               (SELECT 1 FROM runs p WHERE p.run_id = $3 AND p.status = 'cancelled')
               THEN COALESCE(orphan_us, $1) END
             WHERE run_id = $2",
            &[&now, &run.run_id, parent],
        )?;
    }
    Ok(())
}

/// A run as a `runs` row.
struct RunRow<'a> {
    run: &'a RunState,
    status: &'static str,
    wait_reason: Option<&'a str>,
    wait_key: Option<&'a str>,
    data: String,
    due: Option<i64>,
    version: i64,
    attribution: Attribution,
    lease_holder: Option<&'a str>,
    lease_until_us: Option<i64>,
    ledger_seq: Option<i64>,
}

impl<'a> RunRow<'a> {
    /// The row of `run` with its lease and where its ledger ends.
    fn new(
        run: &'a RunState,
        indexer: &dyn RunIndexer,
        lease: (Option<&'a str>, Option<i64>),
        ledger_seq: Option<i64>,
    ) -> Result<Self, StoreError> {
        let w = run.waiting.as_ref();
        Ok(RunRow {
            run,
            status: run.status.as_str(),
            wait_reason: w.map(|w| w.reason.as_str()),
            wait_key: w.map(|w| w.wait_key.as_str()),
            data: serde_json::to_string(run)
                .map_err(|e| StoreError::io(format!("run {}: cannot encode: {e}", run.run_id)))?,
            due: wait_due_at(run).map(|t| t.timestamp_micros()),
            version: run.version as i64,
            attribution: indexer.index(run),
            lease_holder: lease.0,
            lease_until_us: lease.1,
            ledger_seq,
        })
    }

    /// `$1` run_id, then the columns in the order of [`INSERT_RUN`].
    fn values(&self) -> Vec<&(dyn ToSql + Sync)> {
        let (run, a) = (self.run, &self.attribution);
        vec![
            &run.run_id,
            &run.workflow_id,
            &self.status,
            &self.wait_reason,
            &self.wait_key,
            &self.due,
            &run.parent_run_id,
            &run.session_id,
            &self.data,
            &self.version,
            &a.automation_id,
            &a.role,
            &a.occurrence_index,
            &a.session_kind,
            &a.workspace_root,
            &run.created_at,
            &run.updated_at,
            &self.lease_holder,
            &self.lease_until_us,
            &self.ledger_seq,
            &a.wakes_on,
        ]
    }
}

/// Fills the attribution columns of up to [`REINDEX_BATCH`] rows no
/// indexer attributed (no session kind) after position `after`, where
/// `indexer` attributes them; a row that does not decode is left as it
/// is. The last position read, if there may be more.
fn reindex(c: &mut Conn, indexer: &dyn RunIndexer, after: i64) -> Result<Option<i64>, TxError> {
    let rows = c.query(
        "SELECT ord, run_id, version, data FROM runs
         WHERE session_kind IS NULL AND ord > $1 ORDER BY ord LIMIT $2",
        &[&after, &(REINDEX_BATCH as i64)],
    )?;
    for row in &rows {
        let Ok(run) = serde_json::from_str::<RunState>(row.get(3)) else {
            continue;
        };
        let a = indexer.index(&run);
        if a.session_kind.is_some() {
            let (id, version): (&str, i64) = (row.get(1), row.get(2));
            c.execute(
                "UPDATE runs SET automation_id = $2, role = $3, occurrence_index = $4,
                    session_kind = $5, workspace_root = $6, wakes_on = $7
                 WHERE run_id = $1 AND version = $8",
                &[
                    &id,
                    &a.automation_id,
                    &a.role,
                    &a.occurrence_index,
                    &a.session_kind,
                    &a.workspace_root,
                    &a.wakes_on,
                    &version,
                ],
            )?;
        }
    }
    Ok((rows.len() == REINDEX_BATCH).then(|| rows.last().map_or(after, |r| r.get(0))))
}

/// How many rows [`reindex`] reads per transaction.
const REINDEX_BATCH: usize = 256;

/// A `u64` position as a PostgreSQL `BIGINT`.
fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

impl Store for PostgresStore {
    fn indexer(&self) -> std::sync::Arc<dyn RunIndexer> {
        self.indexer.get()
    }

    fn set_indexer(&self, indexer: std::sync::Arc<dyn RunIndexer>) -> Result<(), StoreError> {
        self.indexer.set(indexer.clone());
        // Read first: a store with nothing to index takes no transaction.
        let pending = self.read(|c| {
            Ok(c.query_opt("SELECT 1 FROM runs WHERE session_kind IS NULL LIMIT 1", &[])?)
        })?;
        if pending.is_none() {
            return Ok(());
        }
        let mut after = 0;
        while let Some(last) = self.write(|c| reindex(c, indexer.as_ref(), after))? {
            after = last;
        }
        Ok(())
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        let row = self.read(|c| {
            Ok(c.query_opt(
                "SELECT data, version FROM runs WHERE run_id = $1",
                &[&run_id],
            )?)
        })?;
        row.map(|r| self.decode_run(run_id, r.get(0), r.get(1)))
            .transpose()
    }

    fn run_status(&self, run_id: &str) -> Result<Option<RunStatus>, StoreError> {
        let row = self
            .read(|c| Ok(c.query_opt("SELECT status FROM runs WHERE run_id = $1", &[&run_id])?))?;
        Ok(row.map(|r| RunStatus::parse(r.get(0)).unwrap_or(RunStatus::Failed)))
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        let row = RunRow::new(run, self.indexer.get().as_ref(), (None, None), None)?;
        self.write(|c| {
            let mut keys = marker_keys(run);
            keys.push(LockKey::ledger(&run.run_id));
            c.lock(&mut keys)?;
            if c.execute(INSERT_RUN, &row.values())? == 1 {
                mark(c, run)?;
                signal(c, &self.channel)?;
                return Ok((run.clone(), true));
            }
            let found = c
                .query_opt(
                    "SELECT data, version FROM runs WHERE run_id = $1",
                    &[&run.run_id],
                )?
                .ok_or_else(|| self.err(format!("run {}: vanished", run.run_id)))?;
            Ok((
                self.decode_run(&run.run_id, found.get(0), found.get(1))?,
                false,
            ))
        })
    }

    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        self.write(|c| {
            // Never waits: a row locked by another transaction (a host
            // committing, or one stalled inside its transaction) is busy.
            let found = c.query_opt(
                "SELECT data, version, lease_holder, lease_until_us, quarantine
                 FROM runs WHERE run_id = $1 FOR UPDATE NOWAIT",
                &[&run_id],
            );
            let found = match found {
                Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                    return Ok(Claim::Busy {
                        holder: None,
                        until: None,
                    })
                }
                other => other?,
            };
            let Some(row) = found else {
                return Ok(Claim::Missing);
            };
            let (holder, until, quarantine): (Option<String>, Option<i64>, Option<String>) =
                (row.get(2), row.get(3), row.get(4));
            if let Some(reason) = quarantine {
                return Ok(Claim::Quarantined { reason });
            }
            if let Some(busy) = lease.busy(holder.as_deref(), until) {
                return Ok(busy);
            }
            let run = self.decode_run(run_id, row.get(0), row.get(1))?;
            c.execute(
                "UPDATE runs SET lease_holder = $2, lease_until_us = $3 WHERE run_id = $1",
                &[&run_id, &lease.holder, &lease.until.timestamp_micros()],
            )?;
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
        self.read(|c| {
            c.execute(
                "UPDATE runs SET lease_until_us = $3
                 WHERE run_id = ANY($1::text[]) AND lease_holder = $2",
                &[&run_ids, &holder, &until.timestamp_micros()],
            )?;
            Ok(())
        })
    }

    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        self.write(|c| {
            let released = c.execute(
                "UPDATE runs SET lease_holder = NULL, lease_until_us = NULL
                 WHERE run_id = $1 AND lease_holder = $2",
                &[&run_id, &holder],
            )?;
            if released > 0 {
                signal(c, &self.channel)?;
            }
            Ok(())
        })
    }

    fn signals_work(&self) -> bool {
        true
    }

    fn next_due(&self, wait_now: DateTime<Utc>) -> Result<Option<NextDue>, StoreError> {
        let (wait_now, now) = (wait_now.timestamp_micros(), Utc::now().timestamp_micros());
        let row = self.read(|c| Ok(c.client.query_one(NEXT_DUE, &[&wait_now, &now])?))?;
        let at = |i: usize| {
            row.get::<_, Option<i64>>(i)
                .and_then(DateTime::from_timestamp_micros)
        };
        Ok(Some(NextDue {
            wait: at(0),
            claim: at(1),
        }))
    }

    fn wait_for_work(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        let left = || deadline.saturating_duration_since(std::time::Instant::now());
        let mut listener = self.listener.lock();
        // Whether a listening connection broke during this wait: signals
        // sent meanwhile are lost, so the caller is told to look.
        let mut broke = false;
        loop {
            if listener.as_ref().is_none_or(Client::is_closed) {
                match self.listen() {
                    Ok(client) => {
                        *listener = Some(client);
                        if broke {
                            return true;
                        }
                    }
                    Err(_) if left().is_zero() => return broke,
                    Err(_) => {
                        // The server is away: try again shortly.
                        std::thread::sleep(left().min(Duration::from_millis(500)));
                        continue;
                    }
                }
            }
            let Some(client) = listener.as_mut() else {
                return broke;
            };
            let first = client.notifications().timeout_iter(left()).next();
            match first {
                Ok(Some(_)) => {
                    // Signals that came together are one wake.
                    while let Ok(Some(_)) = client.notifications().iter().next() {}
                    return true;
                }
                Ok(None) => return false,
                Err(_) => {
                    // The connection broke (a server restart): listen anew
                    // on a new one, within this wait.
                    *listener = None;
                    broke = true;
                }
            }
        }
    }

    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        check_next_version(run, &fence)?;
        self.write(|c| self.commit_on(c, records, run, &fence, lease))
    }

    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(|c| {
            let mut known: Vec<(String, (i64, Option<String>))> = Vec::new();
            for r in records {
                if known.iter().any(|(id, _)| *id == r.run_id) {
                    continue;
                }
                let found = Self::current(c, &r.run_id)?;
                match found {
                    Some(f) if f.admits(&fence) => known.push((r.run_id.clone(), f.head)),
                    other => return Err(Self::conflict(&r.run_id, &fence, other.as_ref()).into()),
                }
            }
            let chain = Chain::link(c, records, known)?;
            let mut params = chain.params().to_vec();
            params.push(&false);
            c.execute(APPEND, &params)?;
            Ok(())
        })
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write(|c| {
            let chain = Chain::link(c, records, Vec::new())?;
            // Evidence outside any transition is not ahead of the state: a
            // run with nothing ahead moves its committed mark past it.
            let mut params = chain.params().to_vec();
            params.push(&true);
            c.execute(APPEND, &params)?;
            Ok(())
        })
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 ORDER BY seq",
            &[],
        )
    }

    fn list_records_after(&self, run_id: &str, after: u64) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 AND seq > $2 ORDER BY seq",
            &[&clamp(after)],
        )
    }

    fn list_records_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 AND seq > $2 AND seq <= $3
             ORDER BY seq",
            &[&clamp(after), &clamp(through)],
        )
    }

    fn list_records_page(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        self.numbered_records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            &[&clamp(after), &clamp(limit as u64)],
        )
    }

    fn feed_head(&self) -> Result<Option<u64>, StoreError> {
        self.number_feed()?;
        self.read(|c| {
            let n: i64 = c
                .query_opt("SELECT COALESCE(MAX(seq), 0) FROM feed", &[])?
                .map_or(0, |r| r.get(0));
            Ok(Some(n as u64))
        })
    }

    fn list_feed(&self, after: u64, limit: usize) -> Result<Option<Vec<FeedEntry>>, StoreError> {
        self.number_feed()?;
        self.read(|c| {
            let rows = c.query(
                "SELECT seq, run_id, from_seq, to_seq FROM feed
                 WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&clamp(after), &(limit.min(i64::MAX as usize) as i64)],
            )?;
            Ok(Some(
                rows.iter()
                    .map(|r| FeedEntry {
                        seq: r.get::<_, i64>(0) as u64,
                        run_id: r.get(1),
                        from_seq: r.get::<_, i64>(2) as u64,
                        to_seq: r.get::<_, i64>(3) as u64,
                    })
                    .collect(),
            ))
        })
    }

    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 AND seq > COALESCE(
                (SELECT ledger_seq FROM runs WHERE run_id = $1), 0) ORDER BY seq",
            &[],
        )
    }

    fn find_records(
        &self,
        run_id: &str,
        idempotency_key: &str,
    ) -> Result<Vec<StepRecord>, StoreError> {
        self.records(
            run_id,
            "SELECT seq, data FROM ledger WHERE run_id = $1 AND idem_key = $2 ORDER BY seq",
            &[&idempotency_key],
        )
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
        self.write(|c| {
            // Another compaction or a prune of the run waits on this lock,
            // a commit or an append on the row's: nothing lands between
            // the check below and the seal.
            c.lock(&mut vec![LockKey::ledger(run_id)])?;
            c.query_opt(
                "SELECT 1 FROM runs WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )?;
            let found = c
                .query_opt(
                    "SELECT l.hash, COALESCE((SELECT ledger_seq FROM runs WHERE run_id = $1), 0),
                            (SELECT MAX(seq) FROM ledger WHERE run_id = $1)
                     FROM ledger l WHERE l.run_id = $1 AND l.seq = $2",
                    &[&run_id, &through],
                )?
                .map(|r| (r.get(0), r.get(1), r.get(2)));
            crate::compaction::admit(run_id, through, found, &stored.replaced)?;
            let removed = c.execute(
                "DELETE FROM ledger WHERE run_id = $1 AND seq < $2",
                &[&run_id, &through],
            )?;
            c.execute(
                "UPDATE ledger SET data = $3, hash = $4, idem_key = NULL
                 WHERE run_id = $1 AND seq = $2",
                &[&run_id, &through, &stored.data, &stored.hash],
            )?;
            // The seal, committed with the rest (as `append_records`).
            let chain = Chain::link(c, std::slice::from_ref(&stored.seal), Vec::new())?;
            let mut params = chain.params().to_vec();
            params.push(&true);
            c.execute(APPEND, &params)?;
            Ok(removed + 1)
        })
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let (sql, args) = DIALECT.run_query(query);
        let rows = self.read(|c| {
            let params: Vec<&(dyn ToSql + Sync)> =
                args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            Ok(c.client.query(sql.as_str(), &params)?)
        })?;
        // A row that does not decode is left out: the rest of the store
        // stays readable (its claim reports it, the driver quarantines it).
        Ok(rows
            .iter()
            .filter_map(|r| self.decode_run(r.get(0), r.get(1), r.get(2)).ok())
            .collect())
    }

    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(DUE, &[&now.timestamp_micros(), &(limit as i64)])
    }

    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(CLAIMABLE, &[&now.timestamp_micros(), &(limit as i64)])
    }

    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.pairs(LEASED, &[&(limit as i64)])
    }

    fn list_ended_children(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.pairs(
            ENDED_CHILDREN,
            &[&(limit as i64), &Utc::now().timestamp_micros()],
        )
    }

    fn list_orphans(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.ids(ORPHANS, &[&(limit as i64), &Utc::now().timestamp_micros()])
    }

    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError> {
        self.write(|c| {
            c.lock(&mut vec![LockKey::child(run_id)])?;
            let set = c.execute(
                "UPDATE runs SET quarantine = $2, lease_holder = NULL, lease_until_us = NULL
                 WHERE run_id = $1 AND quarantine IS NULL",
                &[&run_id, &reason],
            )?;
            if set > 0 {
                // A parent waiting on it learns that it was set aside.
                c.execute(MARK_PARENT, &[&Utc::now().timestamp_micros(), &run_id])?;
            }
            Ok(())
        })
    }

    fn list_consumers(&self, connection_id: Option<&str>) -> Result<Vec<String>, StoreError> {
        match connection_id {
            Some(id) => self.ids(
                "SELECT run_id FROM runs WHERE wakes_on = $1 AND quarantine IS NULL ORDER BY ord",
                &[&id],
            ),
            None => self.ids(
                "SELECT run_id FROM runs WHERE wakes_on IS NOT NULL AND quarantine IS NULL
                 ORDER BY ord",
                &[],
            ),
        }
    }

    fn quarantined(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.read(|c| {
            Ok(
                c.query_opt("SELECT quarantine FROM runs WHERE run_id = $1", &[&run_id])?
                    .and_then(|r| r.get(0)),
            )
        })
    }

    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        self.write(|c| {
            let Some(row) = c.query_opt(
                "UPDATE runs SET defer_count = COALESCE(defer_count, 0) + 1
                 WHERE run_id = $1 RETURNING defer_count",
                &[&run_id],
            )?
            else {
                return Ok(0);
            };
            let count = u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX);
            c.execute(
                "UPDATE runs SET defer_until_us = $2, defer_reason = $3 WHERE run_id = $1",
                &[&run_id, &until(count).timestamp_micros(), &reason],
            )?;
            Ok(count)
        })
    }

    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        let row = self.read(|c| {
            Ok(c.query_opt(
                "SELECT defer_until_us, defer_count, defer_reason FROM runs WHERE run_id = $1",
                &[&run_id],
            )?)
        })?;
        Ok(row.and_then(|r| {
            let (until, count, reason): (Option<i64>, Option<i64>, Option<String>) =
                (r.get(0), r.get(1), r.get(2));
            Some(Deferral {
                until: DateTime::from_timestamp_micros(until?)?,
                count: u32::try_from(count.unwrap_or(0)).unwrap_or(u32::MAX),
                reason,
            })
        }))
    }

    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.pairs(
            "SELECT run_id, quarantine FROM runs WHERE quarantine IS NOT NULL ORDER BY ord",
            &[],
        )
    }

    fn list_run_index(&self, query: &RunIndexQuery) -> Result<Vec<RunIndexRow>, StoreError> {
        let (sql, args) = DIALECT.run_index(query, &self.indexer.get().turn_roots());
        let rows = self.read(|c| {
            let params: Vec<&(dyn ToSql + Sync)> =
                args.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            Ok(c.client.query(sql.as_str(), &params)?)
        })?;
        Ok(rows
            .iter()
            .map(|r| RunIndexRow {
                run_id: r.get(0),
                workflow_id: r.get(1),
                status: RunStatus::parse(r.get(2)).unwrap_or(RunStatus::Failed),
                parent_run_id: r.get(3),
                session_id: r.get(4),
                created_at: r.get::<_, Option<String>>(5).unwrap_or_default(),
                updated_at: r.get::<_, Option<String>>(6).unwrap_or_default(),
                automation_id: r.get(7),
                role: r.get(8),
                occurrence_index: r.get(9),
                session_kind: r.get(10),
                workspace_root: r.get(11),
            })
            .collect())
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        self.read(|c| {
            Ok(c.query_opt(
                "SELECT dir FROM bundles WHERE workflow_id = $1",
                &[&workflow_id],
            )?
            .map(|r| PathBuf::from(r.get::<_, String>(0))))
        })
    }

    fn deploy(&self, d: &crate::Deployment<'_>) -> Result<Vec<crate::Deployed>, StoreError> {
        self.write(|c| {
            // One deployment at a time: version numbers are consecutive,
            // and a prune's removal of unnamed files waits for it.
            c.lock(&mut vec![LockKey::new("bundles", "")])?;
            let kept: Vec<BundleFile> = c
                .query(
                    "SELECT path, content FROM bundle_files WHERE digest = $1 ORDER BY path",
                    &[&d.files.digest],
                )?
                .iter()
                .map(|r| BundleFile {
                    path: r.get(0),
                    bytes: r.get(1),
                })
                .collect();
            if kept != d.files.files {
                c.execute(
                    "DELETE FROM bundle_files WHERE digest = $1",
                    &[&d.files.digest],
                )?;
                for f in &d.files.files {
                    c.execute(
                        "INSERT INTO bundle_files (digest, path, content) VALUES ($1, $2, $3)",
                        &[&d.files.digest, &f.path, &f.bytes],
                    )?;
                }
            }
            let mut out = Vec::with_capacity(d.workflow_ids.len());
            for id in d.workflow_ids {
                let latest = c
                    .query_opt(
                        versions_where!("workflow_id = $1 ORDER BY version DESC LIMIT 1"),
                        &[id],
                    )?
                    .map(|r| version_row(&r));
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
                c.execute(
                    "INSERT INTO workflow_versions
                       (workflow_id, version, digest, deployed_at, deployed_by, source)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &v.workflow_id,
                        &(v.version as i32),
                        &v.digest,
                        &v.deployed_at,
                        &v.deployed_by,
                        &v.source,
                    ],
                )?;
            }
            Ok(out)
        })
    }

    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<crate::WorkflowVersion>, StoreError> {
        let version = version.map(|v| v as i32);
        self.read(|c| {
            Ok(c.query_opt(
                versions_where!(
                    "workflow_id = $1 AND ($2::INTEGER IS NULL OR version = $2)
                     ORDER BY version DESC LIMIT 1"
                ),
                &[&workflow_id, &version],
            )?
            .map(|r| version_row(&r)))
        })
    }

    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<crate::WorkflowVersion>, StoreError> {
        self.read(|c| {
            Ok(c.query(
                versions_where!(
                    "$1::TEXT IS NULL OR workflow_id = $1 ORDER BY workflow_id, version"
                ),
                &[&workflow_id],
            )?
            .iter()
            .map(version_row)
            .collect())
        })
    }

    fn bundle_files(&self, digest: &str) -> Result<Vec<BundleFile>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT path, content FROM bundle_files WHERE digest = $1 ORDER BY path",
                &[&digest],
            )?)
        })?;
        Ok(rows
            .iter()
            .map(|r| BundleFile {
                path: r.get(0),
                bytes: r.get(1),
            })
            .collect())
    }

    fn delete_runs(&self, run_ids: &[String]) -> Result<crate::Deleted, StoreError> {
        self.write(|c| {
            let mut out = crate::Deleted::default();
            let mut keys: Vec<LockKey> = run_ids.iter().map(|id| LockKey::ledger(id)).collect();
            c.lock(&mut keys)?;
            let mut present = Vec::new();
            for id in run_ids {
                let rows = c.query(
                    "SELECT status FROM runs WHERE run_id = $1 FOR UPDATE",
                    &[id],
                )?;
                let Some(row) = rows.first() else {
                    continue;
                };
                if !matches!(row.get::<_, &str>(0), "completed" | "failed" | "cancelled") {
                    return Ok(crate::Deleted::default());
                }
                present.push(id);
            }
            for id in present {
                out.records += c.execute("DELETE FROM ledger WHERE run_id = $1", &[id])?;
                c.execute("DELETE FROM feed WHERE run_id = $1", &[id])?;
                c.execute("DELETE FROM runs WHERE run_id = $1", &[id])?;
                out.runs.push(id.clone());
            }
            Ok(out)
        })
    }

    fn remove_versions(&self, versions: &[crate::WorkflowVersion]) -> Result<usize, StoreError> {
        self.write(|c| {
            c.lock(&mut vec![LockKey::new("bundles", "")])?;
            let mut removed = 0;
            for v in versions {
                removed += c.execute(
                    "DELETE FROM workflow_versions
                     WHERE workflow_id = $1 AND version = $2 AND digest = $3",
                    &[&v.workflow_id, &(v.version as i32), &v.digest],
                )? as usize;
            }
            c.execute(
                "DELETE FROM bundle_files f WHERE NOT EXISTS
                   (SELECT 1 FROM workflow_versions v WHERE v.digest = f.digest)",
                &[],
            )?;
            Ok(removed)
        })
    }

    fn version_use(&self, workflow_id: &str) -> Result<Vec<crate::VersionUse>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT (data::json ->> 'workflow_version')::BIGINT AS v, status, COUNT(*),
                        COALESCE(MAX(updated_at), '')
                 FROM runs WHERE workflow_id = $1 AND quarantine IS NULL
                 GROUP BY v, status ORDER BY v, status",
                &[&workflow_id],
            )?)
        })?;
        let mut uses: Vec<_> = rows
            .iter()
            .filter_map(|r| {
                Some(crate::VersionUse {
                    version: r.get::<_, Option<i64>>(0).map(|v| v as u32),
                    status: RunStatus::parse(r.get(1))?,
                    runs: r.get::<_, i64>(2) as u64,
                    last_updated: r.get(3),
                })
            })
            .collect();
        crate::deployments::sort(&mut uses);
        Ok(uses)
    }

    fn append_event(&self, event: &super::InboxEvent) -> Result<super::EventAppend, StoreError> {
        let data = serde_json::to_string(event).map_err(|e| self.err(e))?;
        self.write(|c| {
            // One appender per stream at a time: seqs commit in order.
            c.lock(&mut vec![LockKey::new("stream", &event.stream)])?;
            if let Some(row) = c.query_opt(
                "SELECT seq FROM inbox WHERE stream = $1 AND dedupe_key = $2",
                &[&event.stream, &event.dedupe_key],
            )? {
                return Ok(super::EventAppend {
                    seq: row.get::<_, i64>(0) as u64,
                    duplicate: true,
                });
            }
            signal(c, &self.channel)?;
            let row = c
                .query_opt(
                    "INSERT INTO inbox (stream, dedupe_key, data) VALUES ($1, $2, $3)
                     RETURNING seq",
                    &[&event.stream, &event.dedupe_key, &data],
                )?
                .ok_or_else(|| self.err("an insert returned no row"))?;
            Ok(super::EventAppend {
                seq: row.get::<_, i64>(0) as u64,
                duplicate: false,
            })
        })
    }

    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::InboxEvent>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT seq, data FROM inbox WHERE stream = $1 AND seq > $2 AND data <> ''
                 ORDER BY seq LIMIT $3",
                &[
                    &stream,
                    &clamp(after),
                    &(limit.min(i64::MAX as usize) as i64),
                ],
            )?)
        })?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                let mut e: super::InboxEvent = serde_json::from_str(r.get(1)).map_err(|e| {
                    StoreError::corrupt(format!("{}: inbox row {seq}: {e}", self.shown))
                })?;
                e.seq = seq as u64;
                Ok(e)
            })
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
        // data: what `events_after` skips.
        // (`CASE`: PostgreSQL may test the conditions in any order, and a
        // dropped event's data is no JSON.)
        let sql = if dry_run {
            "SELECT COUNT(*) FROM inbox WHERE stream = $1 AND seq <= $2 AND data <> ''
               AND CASE WHEN data <> '' THEN (data::json ->> 'appended_at')::timestamptz END
                   < $3::text::timestamptz"
        } else {
            "WITH d AS (UPDATE inbox SET data = '' WHERE stream = $1 AND seq <= $2 AND data <> ''
               AND CASE WHEN data <> '' THEN (data::json ->> 'appended_at')::timestamptz END
                   < $3::text::timestamptz
               RETURNING 1) SELECT COUNT(*) FROM d"
        };
        let n: i64 = self.write(|c| {
            Ok(c.query_opt(sql, &[&stream, &clamp(through), &before])?
                .map_or(0, |r| r.get(0)))
        })?;
        Ok(n as u64)
    }

    fn create_connection(&self, connection: &super::ConnectionRecord) -> Result<(), StoreError> {
        let data = serde_json::to_string(connection).map_err(|e| self.err(e))?;
        self.write(|c| {
            let n = c.execute(
                "INSERT INTO connections (connection_id, data) VALUES ($1, $2)
                 ON CONFLICT (connection_id) DO NOTHING",
                &[&connection.connection_id, &data],
            )?;
            if n == 0 {
                return Err(StoreError::conflict(format!(
                    "connection {} already exists",
                    connection.connection_id
                ))
                .into());
            }
            Ok(())
        })
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut super::ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<super::ConnectionRecord>, StoreError> {
        self.write(|c| {
            let Some(row) = c.query_opt(
                "SELECT data FROM connections WHERE connection_id = $1 FOR UPDATE",
                &[&id],
            )?
            else {
                return Ok(None);
            };
            let mut record = self.decode_connection(id, row.get(0))?;
            change(&mut record)?;
            let data = serde_json::to_string(&record).map_err(|e| self.err(e))?;
            c.execute(
                "UPDATE connections SET data = $2 WHERE connection_id = $1",
                &[&id, &data],
            )?;
            Ok(Some(record))
        })
    }

    fn get_connection(&self, id: &str) -> Result<Option<super::ConnectionRecord>, StoreError> {
        let row = self.read(|c| {
            Ok(c.query_opt(
                "SELECT data FROM connections WHERE connection_id = $1",
                &[&id],
            )?)
        })?;
        row.map(|r| self.decode_connection(id, r.get(0)))
            .transpose()
    }

    fn list_connections(&self) -> Result<Vec<super::ConnectionRecord>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT connection_id, data FROM connections ORDER BY ord",
                &[],
            )?)
        })?;
        rows.iter()
            .map(|r| self.decode_connection(r.get(0), r.get(1)))
            .collect()
    }
}

impl PostgresStore {
    fn decode_connection(
        &self,
        id: &str,
        data: &str,
    ) -> Result<super::ConnectionRecord, StoreError> {
        serde_json::from_str(data)
            .map_err(|e| StoreError::corrupt(format!("{}: connection {id:?}: {e}", self.shown)))
    }
}

impl super::CommandStore for PostgresStore {
    fn append_command(
        &self,
        command: &super::CommandRecord,
    ) -> Result<super::AppendResult, StoreError> {
        self.write(|c| {
            // One appender at a time: seqs commit in order.
            c.lock(&mut vec![LockKey::new("commands", "")])?;
            if let Some(row) = c.query_opt(
                "SELECT seq FROM commands WHERE command_id = $1",
                &[&command.command_id],
            )? {
                return Ok(super::AppendResult {
                    accepted: false,
                    duplicate: true,
                    seq: row.get::<_, i64>(0) as u64,
                });
            }
            signal(c, &self.channel)?;
            let seq: i64 = c
                .query_opt(
                    "INSERT INTO commands (command_id, data) VALUES ($1, '') RETURNING seq",
                    &[&command.command_id],
                )?
                .ok_or_else(|| self.err("an insert returned no row"))?
                .get(0);
            let data = serde_json::to_string(&super::CommandRecord {
                seq: seq as u64,
                ..command.clone()
            })
            .map_err(|e| self.err(e))?;
            c.execute(
                "UPDATE commands SET data = $1 WHERE seq = $2",
                &[&data, &seq],
            )?;
            Ok(super::AppendResult {
                accepted: true,
                duplicate: false,
                seq: seq as u64,
            })
        })
    }

    fn commands_after(
        &self,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::CommandRecord>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT seq, data FROM commands WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&clamp(after), &(limit.min(i64::MAX as usize) as i64)],
            )?)
        })?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.get(0);
                serde_json::from_str(r.get(1))
                    .map_err(|e| StoreError::corrupt(format!("{}: command {seq}: {e}", self.shown)))
            })
            .collect()
    }

    fn find_command(&self, command_id: &str) -> Result<Option<super::CommandRecord>, StoreError> {
        let row = self.read(|c| {
            Ok(c.query_opt(
                "SELECT data FROM commands WHERE command_id = $1",
                &[&command_id],
            )?)
        })?;
        row.map(|r| {
            serde_json::from_str(r.get(0)).map_err(|e| {
                StoreError::corrupt(format!("{}: command {command_id}: {e}", self.shown))
            })
        })
        .transpose()
    }

    fn cursor(&self, consumer: &str) -> Result<u64, StoreError> {
        self.read(|c| {
            Ok(c.query_opt(
                "SELECT seq FROM command_cursors WHERE consumer = $1",
                &[&consumer],
            )?
            .map_or(0, |r| r.get::<_, i64>(0) as u64))
        })
    }

    fn set_cursor(&self, consumer: &str, seq: u64) -> Result<(), StoreError> {
        self.read(|c| {
            c.execute(
                "INSERT INTO command_cursors (consumer, seq) VALUES ($1, $2)
                 ON CONFLICT (consumer) DO UPDATE SET seq = excluded.seq",
                &[&consumer, &clamp(seq)],
            )?;
            Ok(())
        })
    }
}

/// The digests of compiled components the engine cached on this host: a
/// cached file is loaded only if its digest is one the database recorded
/// (every host compiles for itself; a digest names a file's content).
impl crate::CompiledDigests for PostgresStore {
    fn vouched(&self, name: &str) -> Option<[u8; 32]> {
        let text: String = self
            .read(|c| {
                Ok(c.query_opt(
                    "SELECT sha256 FROM compiled_digests WHERE name = $1",
                    &[&name],
                )?
                .map(|r| r.get(0)))
            })
            .ok()??;
        hex::decode(text).ok()?.try_into().ok()
    }

    fn vouch(&self, name: &str, digest: &[u8; 32]) {
        let digest = hex::encode(digest);
        let _ = self.read(|c| {
            c.execute(
                "INSERT INTO compiled_digests (name, sha256) VALUES ($1, $2)
                 ON CONFLICT (name) DO UPDATE SET sha256 = excluded.sha256",
                &[&name, &digest],
            )?;
            Ok(())
        });
    }
}

/// Artifacts in the database (table `artifacts`), so that every host reads
/// what any host stored.
impl super::ArtifactStore for PostgresStore {
    fn put(
        &self,
        content: &[u8],
        content_type: &str,
        run_id: Option<&str>,
        created_at: &str,
    ) -> Result<super::ArtifactMeta, StoreError> {
        let id = super::artifacts::artifact_id(content);
        let size = content.len() as i64;
        self.read(|c| {
            // Stored again, it is renewed (its first metadata stays), by
            // the database's clock: every host's sweep reads the same one.
            c.execute(
                "INSERT INTO artifacts (artifact_id, content_type, size, run_id, created_at,
                    content, stored_us)
                 VALUES ($1, $2, $3, $4, $5, $6,
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
                 ON CONFLICT (artifact_id) DO UPDATE SET stored_us = excluded.stored_us",
                &[&id, &content_type, &size, &run_id, &created_at, &content],
            )?;
            Ok(())
        })?;
        self.meta(&id)?
            .ok_or_else(|| self.err(format!("artifact {id}: vanished after it was stored")))
    }

    fn get(&self, artifact_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|c| {
            Ok(c.query_opt(
                "SELECT content FROM artifacts WHERE artifact_id = $1",
                &[&artifact_id],
            )?
            .map(|r| r.get(0)))
        })
    }

    fn meta(&self, artifact_id: &str) -> Result<Option<super::ArtifactMeta>, StoreError> {
        self.read(|c| {
            Ok(c.query_opt(
                "SELECT artifact_id, content_type, size, run_id, created_at FROM artifacts
                 WHERE artifact_id = $1",
                &[&artifact_id],
            )?
            .map(|r| artifact_meta(&r)))
        })
    }

    fn list(&self) -> Result<Vec<super::ArtifactMeta>, StoreError> {
        self.read(|c| {
            Ok(c.query(
                "SELECT artifact_id, content_type, size, run_id, created_at FROM artifacts",
                &[],
            )?
            .iter()
            .map(artifact_meta)
            .collect())
        })
    }

    fn delete_unless_since(
        &self,
        artifact_id: &str,
        since: std::time::SystemTime,
    ) -> Result<bool, StoreError> {
        // How long ago `since` is, applied to the database's clock (the
        // one puts stamp with): hosts' clocks may differ.
        let now = std::time::SystemTime::now();
        let ago = match now.duration_since(since) {
            Ok(d) => d.as_micros().min(i64::MAX as u128) as i64,
            Err(e) => -(e.duration().as_micros().min(i64::MAX as u128) as i64),
        };
        // A put of the same content locks the row too: it renews it first
        // (it stays) or inserts it anew after.
        let n = self.write(|c| {
            Ok(c.execute(
                "DELETE FROM artifacts WHERE artifact_id = $1 AND COALESCE(stored_us, 0)
                   < (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - $2",
                &[&artifact_id, &ago],
            )?)
        })?;
        Ok(n > 0)
    }
}

/// An artifact's metadata from its row (`artifact_id, content_type, size,
/// run_id, created_at`).
fn artifact_meta(r: &postgres::Row) -> super::ArtifactMeta {
    super::ArtifactMeta {
        artifact_id: r.get(0),
        content_type: r.get(1),
        size: r.get::<_, i64>(2) as u64,
        run_id: r.get(3),
        created_at: r.get(4),
    }
}

/// Snapshots in the database (table `snapshots`).
impl super::SnapshotStore for PostgresStore {
    fn save_snapshot(&self, snapshot: &super::Snapshot) -> Result<(), StoreError> {
        let data = serde_json::to_string(snapshot).map_err(|e| self.err(e))?;
        self.read(|c| {
            c.execute(
                "INSERT INTO snapshots (snapshot_id, run_id, created_at, data)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (snapshot_id) DO UPDATE SET run_id = excluded.run_id,
                    created_at = excluded.created_at, data = excluded.data",
                &[
                    &snapshot.snapshot_id,
                    &snapshot.run_id,
                    &snapshot.created_at,
                    &data,
                ],
            )?;
            Ok(())
        })
    }

    fn load_snapshot(&self, snapshot_id: &str) -> Result<Option<super::Snapshot>, StoreError> {
        let row = self.read(|c| {
            Ok(c.query_opt(
                "SELECT data FROM snapshots WHERE snapshot_id = $1",
                &[&snapshot_id],
            )?)
        })?;
        row.map(|r| self.decode_snapshot(snapshot_id, r.get(0)))
            .transpose()
    }

    fn search_snapshots(
        &self,
        query: &super::SnapshotQuery,
    ) -> Result<Vec<super::Snapshot>, StoreError> {
        let rows = self.read(|c| {
            Ok(c.query(
                "SELECT snapshot_id, data FROM snapshots
                 WHERE ($1::text IS NULL OR run_id = $1)
                 ORDER BY created_at COLLATE \"C\" DESC, snapshot_id COLLATE \"C\" DESC",
                &[&query.run_id],
            )?)
        })?;
        let mut out = Vec::new();
        for r in &rows {
            let s = self.decode_snapshot(r.get(0), r.get(1))?;
            if query.matches(&s) {
                out.push(s);
                if query.limit.is_some_and(|l| out.len() >= l) {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, StoreError> {
        self.read(|c| {
            Ok(c.execute(
                "DELETE FROM snapshots WHERE snapshot_id = $1",
                &[&snapshot_id],
            )? > 0)
        })
    }
}

impl PostgresStore {
    fn decode_snapshot(&self, id: &str, data: &str) -> Result<super::Snapshot, StoreError> {
        serde_json::from_str(data)
            .map_err(|e| StoreError::corrupt(format!("{}: snapshot {id:?}: {e}", self.shown)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_read_from_the_search_path_option_and_checked() {
        let schema = |url: &str| search_path_schema(&url.parse().unwrap());
        assert_eq!(schema("postgres://u@h/db"), Ok(None));
        assert_eq!(
            schema("postgres://u@h/db?options=-csearch_path%3Dtenant_1"),
            Ok(Some("tenant_1".into()))
        );
        assert_eq!(
            schema("host=h user=u options='-c search_path=a,public'"),
            Ok(Some("a".into()))
        );
        // As the server folds it; 54 characters fit the signal channel.
        assert_eq!(
            schema("postgres://u@h/db?options=-csearch_path%3DMySchema"),
            Ok(Some("myschema".into()))
        );
        assert!(schema(&format!(
            "postgres://u@h/db?options=-csearch_path%3D{}",
            "a".repeat(54)
        ))
        .is_ok());
        // Quotes, semicolons and the like never reach an SQL statement.
        let too_long = format!(
            "postgres://u@h/db?options=-csearch_path%3D{}",
            "a".repeat(55)
        );
        for bad in [
            "postgres://u@h/db?options=-csearch_path%3D%22x%22%3Bdrop",
            "postgres://u@h/db?options=-csearch_path%3D",
            "postgres://u@h/db?options=-csearch_path%3Da-b",
            &too_long,
        ] {
            assert!(schema(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lock_keys_are_the_same_in_every_process_and_build() {
        // FNV-1a of "ledger\0r1" (checked with another implementation):
        // a changed function would make two
        // versions of stepwell on one database lock different keys.
        assert_eq!(LockKey::ledger("r1"), LockKey::new("ledger", "r1"));
        assert_eq!(LockKey::new("ledger", "r1").0, 8_370_542_640_591_350_441);
        assert_ne!(LockKey::child("r1"), LockKey::parent("r1"));
        assert_ne!(LockKey::new("ab", "c"), LockKey::new("a", "bc"));
    }
}

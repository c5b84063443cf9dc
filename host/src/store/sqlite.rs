//! The SQLite store: the embedded default. One database file in WAL mode; a
//! step's ledger records and its run save commit in one transaction.
//!
//! Process-crash safe (WAL with `synchronous=NORMAL`): a committed step
//! survives a killed process. A power loss may lose the last transactions
//! but never corrupts the database.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use rusqlite::{params, Connection, OptionalExtension};

use super::{link, wait_due_at, RunQuery, Store, StoreError};
use crate::core::model::{RunState, StepRecord};

/// The schema version this build writes. A database with a higher
/// `user_version` was written by a newer stepwell and is refused.
pub const SCHEMA_VERSION: i64 = 2;

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
CREATE INDEX IF NOT EXISTS runs_open ON runs(status, wait_reason, wait_key)
    WHERE status IN ('running', 'waiting');
CREATE INDEX IF NOT EXISTS runs_due ON runs(wait_due_us) WHERE wait_due_us IS NOT NULL;
CREATE INDEX IF NOT EXISTS runs_parent ON runs(parent_run_id) WHERE parent_run_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS ledger (
    run_id  TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    data    TEXT NOT NULL,
    hash    TEXT,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
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
";

/// A run as a `runs` row. Every statement on `runs` binds these columns as
/// ?1 run_id, ?2 workflow_id, ?3 status, ?4 wait_reason, ?5 wait_key,
/// ?6 wait_due_us, ?7 parent_run_id, ?8 session_id, ?9 data.
struct RunRow<'a> {
    run: &'a RunState,
    data: String,
    due: Option<i64>,
}

impl<'a> RunRow<'a> {
    fn new(run: &'a RunState) -> rusqlite::Result<Self> {
        Ok(RunRow {
            run,
            data: serde_json::to_string(run)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
            due: wait_due_at(run).map(|t| t.timestamp_micros()),
        })
    }

    fn execute(&self, conn: &Connection, sql: &str) -> rusqlite::Result<usize> {
        let (run, w) = (self.run, self.run.waiting.as_ref());
        conn.prepare_cached(sql)?.execute(params![
            run.run_id,
            run.workflow_id,
            run.status.as_str(),
            w.map(|w| w.reason.as_str()),
            w.map(|w| w.wait_key.as_str()),
            self.due,
            run.parent_run_id,
            run.session_id,
            self.data,
        ])
    }
}

/// Runs and ledgers in one SQLite database file. Runs list in creation
/// order (the row id, which an update keeps).
pub struct SqliteStore {
    path: PathBuf,
    conn: Mutex<Connection>,
}

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
    /// directory. Refuses a database written by a newer schema.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| db_err(dir, e))?;
        }
        let conn = Connection::open(&path).map_err(|e| db_err(&path, e))?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(|e| db_err(&path, e))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| db_err(&path, e))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|e| db_err(&path, e))?;
        // Checkpoint (and fsync) every ~16 MiB of WAL instead of every 4 MiB.
        conn.pragma_update(None, "wal_autocheckpoint", 16384)
            .map_err(|e| db_err(&path, e))?;
        conn.pragma_update(None, "mmap_size", 256i64 << 20)
            .map_err(|e| db_err(&path, e))?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| db_err(&path, e))?;
        if version > SCHEMA_VERSION {
            return Err(StoreError {
                code: "store_schema",
                message: format!(
                    "{}: written by a newer stepwell (schema {version}, this build reads up to {SCHEMA_VERSION}); refusing to open it",
                    path.display()
                ),
            });
        }
        conn.execute_batch(SCHEMA).map_err(|e| db_err(&path, e))?;
        // Version 1 had no hash column: add it (old records stay unchained).
        let has_hash: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('ledger') WHERE name = 'hash'")
            .and_then(|mut st| st.exists([]))
            .map_err(|e| db_err(&path, e))?;
        if !has_hash {
            conn.execute_batch("ALTER TABLE ledger ADD COLUMN hash TEXT")
                .map_err(|e| db_err(&path, e))?;
        }
        if version < SCHEMA_VERSION {
            conn.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(|e| db_err(&path, e))?;
        }
        Ok(SqliteStore {
            path,
            conn: Mutex::new(conn),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: impl std::fmt::Display) -> StoreError {
        db_err(&self.path, e)
    }

    fn decode_run(&self, run_id: &str, data: &str) -> Result<RunState, StoreError> {
        serde_json::from_str(data).map_err(|e| {
            StoreError::corrupt(format!("{}: runs row {run_id:?}: {e}", self.path.display()))
        })
    }

    fn upsert(&self, conn: &Connection, run: &RunState) -> Result<(), StoreError> {
        let row = RunRow::new(run).map_err(|e| self.err(e))?;
        // Most saves (a step of a running run) change only the data. Setting
        // only `data` when the indexed columns already hold the new values
        // leaves every index untouched: fewer pages written per commit.
        let unchanged = row
            .execute(
                conn,
                "UPDATE runs SET data = ?9 WHERE run_id = ?1 AND workflow_id = ?2
                 AND status = ?3 AND wait_reason IS ?4 AND wait_key IS ?5
                 AND wait_due_us IS ?6 AND parent_run_id IS ?7 AND session_id IS ?8",
            )
            .map_err(|e| self.err(e))?;
        if unchanged == 0 {
            row.execute(
                conn,
                "INSERT INTO runs (run_id, workflow_id, status, wait_reason, wait_key,
                                   wait_due_us, parent_run_id, session_id, data)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT(run_id) DO UPDATE SET
                    workflow_id = excluded.workflow_id, status = excluded.status,
                    wait_reason = excluded.wait_reason, wait_key = excluded.wait_key,
                    wait_due_us = excluded.wait_due_us, parent_run_id = excluded.parent_run_id,
                    session_id = excluded.session_id, data = excluded.data",
            )
            .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    fn append_on(&self, conn: &Connection, records: &[StepRecord]) -> Result<(), StoreError> {
        // Each run's last (seq, hash), read once per run and batch.
        let mut heads: Vec<(&str, i64, Option<String>)> = Vec::new();
        let mut last = conn
            .prepare_cached(
                "SELECT seq, hash FROM ledger WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1",
            )
            .map_err(|e| self.err(e))?;
        let mut insert = conn
            .prepare_cached("INSERT INTO ledger (run_id, seq, data, hash) VALUES (?1, ?2, ?3, ?4)")
            .map_err(|e| self.err(e))?;
        for r in records {
            let i = match heads.iter().position(|h| h.0 == r.run_id) {
                Some(i) => i,
                None => {
                    let (seq, hash) = last
                        .query_row([&r.run_id], |row| Ok((row.get(0)?, row.get(1)?)))
                        .optional()
                        .map_err(|e| self.err(e))?
                        .unwrap_or((0, None));
                    heads.push((&r.run_id, seq, hash));
                    heads.len() - 1
                }
            };
            let head = &mut heads[i];
            let mut r = r.clone();
            let data = link(&mut head.2, &mut r);
            head.1 += 1;
            insert
                .execute(params![r.run_id, head.1, data, head.2])
                .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    fn query_runs(
        &self,
        sql: &str,
        args: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<RunState>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        let rows = st
            .query_map(args, |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, data) = row.map_err(|e| self.err(e))?;
            out.push(self.decode_run(&id, &data)?);
        }
        Ok(out)
    }
}

impl Store for SqliteStore {
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        let conn = self.conn.lock();
        let data: Option<String> = conn
            .prepare_cached("SELECT data FROM runs WHERE run_id = ?1")
            .and_then(|mut st| st.query_row([run_id], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        data.map(|d| self.decode_run(run_id, &d)).transpose()
    }

    fn save_run(&self, run: &RunState) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        self.upsert(&conn, run)
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        let created = RunRow::new(run)
            .and_then(|row| {
                row.execute(
                    &tx,
                    "INSERT INTO runs (run_id, workflow_id, status, wait_reason, wait_key,
                                       wait_due_us, parent_run_id, session_id, data)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                     ON CONFLICT(run_id) DO NOTHING",
                )
            })
            .map_err(|e| self.err(e))?;
        if created == 1 {
            tx.commit().map_err(|e| self.err(e))?;
            return Ok((run.clone(), true));
        }
        let existing: String = tx
            .prepare_cached("SELECT data FROM runs WHERE run_id = ?1")
            .and_then(|mut st| st.query_row([&run.run_id], |r| r.get(0)))
            .map_err(|e| self.err(e))?;
        Ok((self.decode_run(&run.run_id, &existing)?, false))
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let mut sql = String::from("SELECT run_id, data FROM runs WHERE 1=1");
        let mut args: Vec<&dyn rusqlite::ToSql> = Vec::new();
        let status = query.status.map(|s| s.as_str());
        let reason = query.wait_reason.map(|r| r.as_str());
        if let Some(s) = &status {
            sql.push_str(&format!(" AND status = ?{}", args.len() + 1));
            args.push(s);
        }
        if let Some(r) = &reason {
            sql.push_str(&format!(" AND wait_reason = ?{}", args.len() + 1));
            args.push(r);
        }
        if let Some(k) = &query.wait_key {
            sql.push_str(&format!(" AND wait_key = ?{}", args.len() + 1));
            args.push(k);
        }
        if let Some(w) = &query.workflow_id {
            sql.push_str(&format!(" AND workflow_id = ?{}", args.len() + 1));
            args.push(w);
        }
        if let Some(p) = &query.parent_run_id {
            sql.push_str(&format!(" AND parent_run_id = ?{}", args.len() + 1));
            args.push(p);
        }
        sql.push_str(" ORDER BY rowid");
        let limit = query.limit.map(|l| l as i64);
        if let Some(l) = &limit {
            sql.push_str(&format!(" LIMIT ?{}", args.len() + 1));
            args.push(l);
        }
        self.query_runs(&sql, &args)
    }

    fn list_due_waits(&self, now: DateTime<Utc>) -> Result<Vec<RunState>, StoreError> {
        let now_us = now.timestamp_micros();
        self.query_runs(
            "SELECT run_id, data FROM runs WHERE wait_due_us IS NOT NULL AND wait_due_us <= ?1
             AND status = 'waiting' ORDER BY wait_due_us, rowid",
            &[&now_us],
        )
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        self.append_on(&tx, records)?;
        tx.commit().map_err(|e| self.err(e))
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let conn = self.conn.lock();
        let mut st = conn
            .prepare_cached("SELECT seq, data FROM ledger WHERE run_id = ?1 ORDER BY seq")
            .map_err(|e| self.err(e))?;
        let rows = st
            .query_map([run_id], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(|e| self.err(e))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, data) = row.map_err(|e| self.err(e))?;
            out.push(serde_json::from_str(&data).map_err(|e| {
                StoreError::corrupt(format!(
                    "{}: ledger row {seq} of run {run_id}: {e}",
                    self.path.display()
                ))
            })?);
        }
        Ok(out)
    }

    fn commit(&self, records: &[StepRecord], run: &RunState) -> Result<(), StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
        self.append_on(&tx, records)?;
        self.upsert(&tx, run)?;
        tx.commit().map_err(|e| self.err(e))
    }

    fn put_bundle(&self, workflow_id: &str, dir: &Path) -> Result<(), StoreError> {
        let conn = self.conn.lock();
        conn.prepare_cached(
            "INSERT INTO bundles (workflow_id, dir) VALUES (?1, ?2)
             ON CONFLICT(workflow_id) DO UPDATE SET dir = excluded.dir",
        )
        .and_then(|mut st| st.execute(params![workflow_id, dir.to_string_lossy()]))
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        let conn = self.conn.lock();
        let dir: Option<String> = conn
            .prepare_cached("SELECT dir FROM bundles WHERE workflow_id = ?1")
            .and_then(|mut st| st.query_row([workflow_id], |r| r.get(0)).optional())
            .map_err(|e| self.err(e))?;
        Ok(dir.map(PathBuf::from))
    }
}

impl super::CommandStore for SqliteStore {
    fn append_command(
        &self,
        command: &super::CommandRecord,
    ) -> Result<super::AppendResult, StoreError> {
        let mut conn = self.conn.lock();
        let tx = conn.transaction().map_err(|e| self.err(e))?;
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
        tx.commit().map_err(|e| self.err(e))?;
        Ok(super::AppendResult {
            accepted: true,
            duplicate: false,
            seq,
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

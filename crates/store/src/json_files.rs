//! The JSON-file store: one folder, `run_<id>.json` per run and
//! `ledger_<id>.jsonl` per ledger, readable with any text tool.
//!
//! - Every write to a run happens under an exclusive advisory lock
//!   (`flock`) on `run_<id>.lock`, taken by every process that writes the
//!   folder: the fence (the run's `version`, its lease) is checked, the
//!   ledger appended and the run file replaced while no other writer can
//!   interleave. The lock file also holds the run's lease (holder and
//!   expiry); losing it only makes the run claimable.
//! - A run is created only if its id is free: a fully written temp file is
//!   published with an atomic hard link, which never replaces an existing
//!   run file. Saves write a temp file and rename it over the run file.
//! - The run file ends with a `ledger_mark`: how many bytes of the ledger
//!   its state reflects (`committed`), how many were written on purpose
//!   (`end`: the committed ones and evidence appended ahead of the state
//!   since, such as an external effect's outcome) and the hash of the record
//!   ending there. The ledger is appended before the run file is replaced;
//!   a crash in between leaves bytes past `end` that no state ever
//!   reflected, and the next write cuts them off before it appends (as it
//!   does a line torn by a crash). Readers stop at `end`, so the ledger
//!   never shows a transition the state does not hold. A run file without
//!   a mark (written by hand or by stepwell 0.1) counts its whole ledger.
//! - With [`Durability::Full`] (the default of [`JsonFileStore::open`])
//!   each file is synced before the rename or link that makes it visible,
//!   and the folder after: a power loss cannot reverse the ledger-then-state
//!   order.
//! - A creation journal, `.runs_created.log`, lists run ids in creation
//!   order; several processes on one folder see each other's runs through it.
//! - `run_<id>.quarantine` sets a run aside (its content is the reason).
//! - Temp files a crash left behind are removed when the store opens.
//! - `stepwell-store.json` records the format version; a folder written by a
//!   newer stepwell is refused.
//! - The folder is this user's alone: created `0700`, refused when it is a
//!   symbolic link, another user's or writable by others (`store_unsafe`);
//!   its files are created `0600` ([`super::private`]).
//!
//! Listing and the due-wait scan read every run file: this backend is for
//! small deployments, inspection and tests; use SQLite for volume.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::{
    check_next_version, link, wait_due_at, Claim, Deferral, Durability, Fence, LeaseAfter,
    LeaseRequest, RunQuery, Store, StoreError,
};
use stepwell_model::model::{RunState, RunStatus, StepRecord};

use super::private::options as private_file;

/// The format version this build writes.
pub const FORMAT_VERSION: u64 = 1;
const META_FILE: &str = "stepwell-store.json";
const JOURNAL: &str = ".runs_created.log";
const BUNDLES: &str = "bundles.json";
/// The deployed versions of every workflow (one JSON array).
const VERSIONS: &str = "workflows.json";
/// The files of every deployed digest, one folder each.
const BUNDLE_FILES: &str = "bundle_files";
const STORE_LOCK: &str = ".store.lock";
const TMP_PREFIX: &str = ".tmp-";

/// A hook called at named points inside the store's writes
/// (`ledger-appended`, `run-temp-written`, `run-published`,
/// `lease-written`): the crash harness aborts the process there to prove
/// that a write torn at any point recovers.
pub type CrashPoints = Arc<dyn Fn(&'static str) + Send + Sync>;

/// What `run_<id>.lock` holds besides being the lock: the run's lease.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct LockData {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until_us: Option<i64>,
    /// Deferred until (see [`Store::defer`]), and how many times since the
    /// last commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    defer_until_us: Option<i64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    defer_count: u32,
    /// Why it was last deferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    defer_reason: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Where a run's ledger stood when its run file was written; kept in the
/// run file, so it changes with the state in one rename.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct LedgerMark {
    /// Bytes of the ledger the state reflects (the last commit).
    committed: u64,
    /// Bytes of the ledger written on purpose: the committed ones and
    /// evidence appended ahead of the state since. Anything past it is the
    /// residue of a write a crash cut short.
    end: u64,
    /// The hash of the record that ends at `end`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    head: Option<String>,
}

/// The name of the run file's last field.
const MARK_FIELD: &str = "\"ledger_mark\":";

/// A run file's bytes: the run's JSON with the mark as its last field.
fn run_file_bytes(run: &RunState, mark: &LedgerMark) -> Result<Vec<u8>, serde_json::Error> {
    let mut bytes = serde_json::to_vec(run)?;
    // A run serializes as an object with at least its version: splice the
    // mark in before the closing brace.
    bytes.pop();
    bytes.push(b',');
    bytes.extend_from_slice(MARK_FIELD.as_bytes());
    serde_json::to_writer(&mut bytes, mark)?;
    bytes.push(b'}');
    Ok(bytes)
}

/// The mark at the end of a run file's bytes, if it has one.
fn mark_in(bytes: &[u8]) -> Option<LedgerMark> {
    // The mark is the last field and holds no nested object: find it near
    // the end rather than parse the whole run.
    let tail_from = bytes.len().saturating_sub(512);
    let tail = &bytes[tail_from..];
    let at = tail
        .windows(MARK_FIELD.len())
        .rposition(|w| w == MARK_FIELD.as_bytes())?;
    let value = &tail[at + MARK_FIELD.len()..];
    let value = value.strip_suffix(b"}")?;
    serde_json::from_slice(value).ok()
}

/// Runs and ledgers as JSON files in one folder.
pub struct JsonFileStore {
    dir: PathBuf,
    durability: Durability,
    /// Serialises this object's writes (file locks exclude other processes
    /// and other store objects, not the threads sharing one).
    write: Mutex<()>,
    tmp_seq: AtomicU64,
    crash_points: Option<CrashPoints>,
    indexer: super::index::IndexerSlot,
}

impl std::fmt::Debug for JsonFileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonFileStore")
            .field("dir", &self.dir)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

/// Whether a run id can name a file (the runtime allows `[A-Za-z0-9_-]+`).
fn safe_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// An exclusive lock on a file, released when dropped (or when the process
/// dies).
struct Locked {
    file: File,
    path: PathBuf,
}

impl Locked {
    fn open(path: PathBuf) -> Result<Locked, StoreError> {
        let file = private_file()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        file.lock()
            .map_err(|e| io(&path, format!("cannot lock: {e}")))?;
        Ok(Locked { file, path })
    }

    fn read(&mut self) -> LockData {
        let mut text = String::new();
        let _ = self.file.seek(SeekFrom::Start(0));
        let _ = self.file.read_to_string(&mut text);
        // A lock file torn by a crash holds no lease.
        serde_json::from_str(&text).unwrap_or_default()
    }

    fn write(&mut self, data: &LockData) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(data).map_err(|e| io(&self.path, e))?;
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.write_all(&bytes))
            .and_then(|_| self.file.set_len(bytes.len() as u64))
            .map_err(|e| io(&self.path, e))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl JsonFileStore {
    /// Opens (creating if needed) the store folder `dir` with
    /// [`Durability::Full`]: checks its format version and removes temp
    /// files a crash left behind.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(dir, Durability::Full)
    }

    /// [`JsonFileStore::open`] with a durability setting.
    pub fn open_with(dir: impl AsRef<Path>, durability: Durability) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        super::private::open_dir(&dir, "the JSON store's folder")?;
        let meta = dir.join(META_FILE);
        match fs::read_to_string(&meta) {
            Ok(text) => {
                let version = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|v| v.get("version").and_then(|v| v.as_u64()))
                    .ok_or_else(|| {
                        StoreError::corrupt(format!(
                            "{}: not a stepwell store description",
                            meta.display()
                        ))
                    })?;
                if version > FORMAT_VERSION {
                    return Err(StoreError {
                        code: "store_schema",
                        message: format!(
                            "{}: written by a newer stepwell (format {version}, this build reads up to {FORMAT_VERSION}); refusing to open it",
                            dir.display()
                        ),
                    });
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Published whole, and only if absent: another process
                // opening the folder at the same moment never reads half a
                // description, and the first one wins.
                let text =
                    serde_json::json!({"format": "stepwell.json-files", "version": FORMAT_VERSION});
                let tmp = dir.join(format!(
                    "{TMP_PREFIX}{}-meta-{}",
                    std::process::id(),
                    uuid::Uuid::new_v4().simple()
                ));
                private_file()
                    .write(true)
                    .create_new(true)
                    .open(&tmp)
                    .and_then(|mut f| f.write_all(text.to_string().as_bytes()))
                    .map_err(|e| io(&tmp, e))?;
                let linked = fs::hard_link(&tmp, &meta);
                let _ = fs::remove_file(&tmp);
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(io(&meta, e)),
                }
            }
            Err(e) => return Err(io(&meta, e)),
        }
        let store = JsonFileStore {
            dir,
            durability,
            write: Mutex::new(()),
            tmp_seq: AtomicU64::new(0),
            crash_points: None,
            indexer: Default::default(),
        };
        // Temp files of writers that died (a live writer's are its own).
        for entry in fs::read_dir(&store.dir)
            .map_err(|e| io(&store.dir, e))?
            .flatten()
        {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(rest) = name.strip_prefix(TMP_PREFIX) {
                let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
                if pid.is_none_or(|p| !process_alive(p)) {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        Ok(store)
    }

    /// Calls `points` at named points inside every write (see
    /// [`CrashPoints`]). For crash tests.
    pub fn with_crash_points(mut self, points: CrashPoints) -> Self {
        self.crash_points = Some(points);
        self
    }

    /// The store folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn point(&self, name: &'static str) {
        if let Some(p) = &self.crash_points {
            p(name);
        }
    }

    fn run_path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("run_{run_id}.json"))
    }

    fn ledger_path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("ledger_{run_id}.jsonl"))
    }

    fn quarantine_path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("run_{run_id}.quarantine"))
    }

    /// What the run's lock file holds, read without taking the lock (a
    /// torn or missing file holds nothing).
    fn lock_data(&self, run_id: &str) -> LockData {
        fs::read(self.dir.join(format!("run_{run_id}.lock")))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    fn run_lock(&self, run_id: &str) -> Result<Locked, StoreError> {
        Locked::open(self.dir.join(format!("run_{run_id}.lock")))
    }

    fn store_lock(&self) -> Result<Locked, StoreError> {
        Locked::open(self.dir.join(STORE_LOCK))
    }

    fn sync(&self, file: &File, path: &Path) -> Result<(), StoreError> {
        if self.durability == Durability::Full {
            file.sync_data().map_err(|e| io(path, e))?;
        }
        Ok(())
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        if self.durability == Durability::Full {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io(&self.dir, e))?;
        }
        Ok(())
    }

    /// Writes `bytes` to a fresh temp file in the folder (synced with
    /// [`Durability::Full`]) and returns its path.
    fn temp(&self, bytes: &[u8]) -> Result<PathBuf, StoreError> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!(
            "{TMP_PREFIX}{}-{n}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let mut f = private_file()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(bytes).map_err(|e| io(&path, e))?;
        self.sync(&f, &path)?;
        Ok(path)
    }

    fn check_id(&self, run_id: &str) -> Result<(), StoreError> {
        if safe_id(run_id) {
            Ok(())
        } else {
            Err(StoreError::io(format!(
                "{}: run id {run_id:?} cannot name a file",
                self.dir.display()
            )))
        }
    }

    fn read_run(&self, path: &Path) -> Result<Option<RunState>, StoreError> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path, e)),
        }
    }

    /// The mark at the end of the run file: `None` when there is no run
    /// file, `Some(None)` when it has no mark (written by hand or by an
    /// older stepwell).
    fn stored_mark(&self, run_id: &str) -> Result<Option<Option<LedgerMark>>, StoreError> {
        let path = self.run_path(run_id);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(mark_in(&bytes))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        }
    }

    /// The mark to append after: the run file's, or for a run file
    /// without one (or no run file) the whole ledger up to a torn last
    /// line, as committed.
    fn write_mark(&self, run_id: &str) -> Result<LedgerMark, StoreError> {
        if let Some(Some(mark)) = self.stored_mark(run_id)? {
            return Ok(mark);
        }
        let ledger = self.ledger_path(run_id);
        let mut f = match File::open(&ledger) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(LedgerMark::default()),
            Err(e) => return Err(io(&ledger, e)),
        };
        let (records, end) = read_lines(&mut f, &ledger, 0, u64::MAX)?;
        Ok(LedgerMark {
            committed: end,
            end,
            head: records.last().and_then(|r| r.record_hash.clone()),
        })
    }

    /// The stored run's version (`None`: no run file), read from the start
    /// of the file where the runtime writes it.
    fn stored_version(&self, run_id: &str) -> Result<Option<u64>, StoreError> {
        let path = self.run_path(run_id);
        let mut head = [0u8; 48];
        let n = match File::open(&path) {
            Ok(mut f) => f.read(&mut head).map_err(|e| io(&path, e))?,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path, e)),
        };
        let text = std::str::from_utf8(&head[..n]).unwrap_or("");
        if let Some(rest) = text.strip_prefix("{\"version\":") {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let Ok(v) = digits.parse() {
                return Ok(Some(v));
            }
        }
        // Written by hand or by an older stepwell: read it whole.
        Ok(self.read_run(&path)?.map(|r| r.version))
    }

    /// Run ids in creation order, from the journal.
    fn created(&self) -> Result<Vec<String>, StoreError> {
        let path = self.dir.join(JOURNAL);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        let mut seen = HashMap::new();
        let mut ids = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if safe_id(line) && seen.insert(line.to_string(), ()).is_none() {
                ids.push(line.to_string());
            }
        }
        Ok(ids)
    }

    fn journal(&self, run_id: &str) -> Result<(), StoreError> {
        let path = self.dir.join(JOURNAL);
        let mut f = private_file()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(format!("{run_id}\n").as_bytes())
            .map_err(|e| io(&path, e))?;
        self.sync(&f, &path)
    }

    /// Every readable, unquarantined run in creation order; and the ids of
    /// those that cannot be read.
    fn scan(&self) -> Result<(Vec<RunState>, Vec<String>), StoreError> {
        let mut runs = Vec::new();
        let mut unreadable = Vec::new();
        for id in self.created()? {
            if self.quarantine_path(&id).exists() {
                continue;
            }
            match self.read_run(&self.run_path(&id)) {
                Ok(Some(run)) => runs.push(run),
                Ok(None) => {}
                Err(_) => unreadable.push(id),
            }
        }
        Ok((runs, unreadable))
    }

    /// Publishes a new run file for `run` (journal line first), failing if
    /// one exists.
    fn publish_new(&self, run: &RunState, mark: &LedgerMark) -> Result<bool, StoreError> {
        let path = self.run_path(&run.run_id);
        let bytes = run_file_bytes(run, mark).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        // Journal a new run before its file appears: a crash in between
        // leaves a journal line without a file (skipped), never a run that
        // listing cannot see.
        if !path.exists() {
            self.journal(&run.run_id)?;
        }
        self.point("run-temp-written");
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                self.sync_dir()?;
                self.point("run-published");
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io(&path, format!("cannot publish the run file: {e}"))),
        }
    }

    /// Replaces the run file of `run`.
    fn replace(&self, run: &RunState, mark: &LedgerMark) -> Result<(), StoreError> {
        let path = self.run_path(&run.run_id);
        let bytes = run_file_bytes(run, mark).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        self.point("run-temp-written");
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        self.sync_dir()?;
        self.point("run-published");
        Ok(())
    }

    /// Checks `fence` against the stored run, under its lock.
    fn check(&self, run_id: &str, lock: &LockData, fence: &Fence<'_>) -> Result<(), StoreError> {
        if self.quarantine_path(run_id).exists() {
            return Err(StoreError::conflict(format!("run {run_id} is quarantined")));
        }
        let stored = self.stored_version(run_id)?;
        match (fence.version, stored) {
            (0, None) => Ok(()),
            (0, Some(_)) => Err(StoreError::conflict(format!("run {run_id} already exists"))),
            (_, None) => Err(StoreError::conflict(format!("run {run_id} does not exist"))),
            (v, Some(s)) if s != v => Err(StoreError::conflict(format!(
                "run {run_id} is at version {s}, not {v} (changed by another writer)"
            ))),
            (_, Some(_)) => {
                let lease = match (&lock.holder, lock.until_us) {
                    (Some(h), Some(u)) => Some((
                        h.as_str(),
                        DateTime::from_timestamp_micros(u).unwrap_or(DateTime::<Utc>::MAX_UTC),
                    )),
                    _ => None,
                };
                if fence.admits(lease) {
                    Ok(())
                } else {
                    Err(StoreError::conflict(format!(
                        "run {run_id} is leased by {}, not {}",
                        lock.holder.as_deref().unwrap_or("nobody"),
                        fence.holder.unwrap_or("-")
                    )))
                }
            }
        }
    }

    /// Appends the records of one run under its lock, after the bytes
    /// `mark` vouches for: what lies beyond them (a write a crash cut short,
    /// or a torn line) is cut off first. Returns the mark's `end` and
    /// `head` after the append (`committed` is left to the caller).
    fn append_locked(
        &self,
        run_id: &str,
        mark: &LedgerMark,
        records: &[StepRecord],
    ) -> Result<LedgerMark, StoreError> {
        let path = self.ledger_path(run_id);
        let mut f = private_file()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let len = f.metadata().map_err(|e| io(&path, e))?.len();
        if len < mark.end {
            return Err(StoreError::corrupt(format!(
                "{}: the ledger holds {len} bytes, but run_{run_id}.json says {} were written",
                path.display(),
                mark.end
            )));
        }
        if len > mark.end {
            // Written by a commit that never landed: no state reflects it.
            f.set_len(mark.end).map_err(|e| io(&path, e))?;
        }
        let mut head = mark.head.clone();
        let mut text = String::new();
        for r in records {
            let mut r = r.clone();
            text.push_str(&link(&mut head, &mut r));
            text.push('\n');
        }
        if !text.is_empty() {
            f.write_all(text.as_bytes()).map_err(|e| io(&path, e))?;
            self.sync(&f, &path)?;
        }
        self.point("ledger-appended");
        Ok(LedgerMark {
            committed: mark.committed,
            end: mark.end + text.len() as u64,
            head,
        })
    }

    /// Appends evidence ahead of the state under the run's lock and moves
    /// the run file's mark past it (`commit_too`: as committed as well,
    /// when nothing else is ahead). A run without a run file gets its
    /// records appended as they are.
    fn append_evidence(
        &self,
        run_id: &str,
        records: &[StepRecord],
        commit_too: bool,
    ) -> Result<(), StoreError> {
        let run = self.read_run(&self.run_path(run_id))?;
        let mark = self.write_mark(run_id)?;
        let mut after = self.append_locked(run_id, &mark, records)?;
        let Some(run) = run else {
            // No run file to keep a mark in: the records stay as written.
            return Ok(());
        };
        if commit_too && mark.committed == mark.end {
            after.committed = after.end;
        }
        self.replace(&run, &after)
    }

    fn versions(&self) -> Result<Vec<crate::WorkflowVersion>, StoreError> {
        let path = self.dir.join(VERSIONS);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(&path, e)),
        }
    }

    /// Replaces the versions file (the caller holds the store lock).
    fn write_versions(&self, versions: &[crate::WorkflowVersion]) -> Result<(), StoreError> {
        let path = self.dir.join(VERSIONS);
        let bytes = serde_json::to_vec_pretty(versions).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        self.sync_dir()
    }

    fn bundles(&self) -> Result<HashMap<String, PathBuf>, StoreError> {
        let path = self.dir.join(BUNDLES);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(HashMap::new()),
            Err(e) => Err(io(&path, e)),
        }
    }
}

/// Reads ledger lines from byte `from` up to byte `to`: the records, and where the last
/// complete line ends (a final line without a newline is torn).
fn read_lines(
    f: &mut File,
    path: &Path,
    from: u64,
    to: u64,
) -> Result<(Vec<StepRecord>, u64), StoreError> {
    f.seek(SeekFrom::Start(from)).map_err(|e| io(path, e))?;
    let mut bytes = Vec::new();
    f.take(to.saturating_sub(from))
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, e))?;
    let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let mut out = Vec::new();
    for (n, line) in bytes[..complete].split(|b| *b == b'\n').enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.push(serde_json::from_slice(line).map_err(|e| {
            StoreError::corrupt(format!(
                "{}: record {} after byte {from}: {e}",
                path.display(),
                n + 1
            ))
        })?);
    }
    Ok((out, from + complete as u64))
}

/// The runs of `records`, each once, in order of first appearance.
fn run_ids(records: &[StepRecord]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for r in records {
        if !out.contains(&r.run_id.as_str()) {
            out.push(&r.run_id);
        }
    }
    out
}

/// Whether process `pid` is alive (on Linux; elsewhere, assumed alive).
fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new(&format!("/proc/{pid}")).exists()
    } else {
        true
    }
}

impl Store for JsonFileStore {
    fn indexer(&self) -> std::sync::Arc<dyn super::RunIndexer> {
        self.indexer.get()
    }

    /// Attribution is computed when listed: nothing to index again.
    fn set_indexer(
        &self,
        indexer: std::sync::Arc<dyn super::RunIndexer>,
    ) -> Result<(), StoreError> {
        self.indexer.set(indexer);
        Ok(())
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        if !safe_id(run_id) {
            return Ok(None);
        }
        self.read_run(&self.run_path(run_id))
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.check_id(&run.run_id)?;
        let _w = self.write.lock();
        let _lock = self.run_lock(&run.run_id)?;
        if self.publish_new(run, &LedgerMark::default())? {
            return Ok((run.clone(), true));
        }
        let existing = self
            .read_run(&self.run_path(&run.run_id))?
            .ok_or_else(|| io(&self.run_path(&run.run_id), "exists but vanished"))?;
        Ok((existing, false))
    }

    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        if !safe_id(run_id) {
            return Ok(Claim::Missing);
        }
        let _w = self.write.lock();
        let mut lock = self.run_lock(run_id)?;
        if let Ok(reason) = fs::read_to_string(self.quarantine_path(run_id)) {
            return Ok(Claim::Quarantined { reason });
        }
        let Some(run) = self.read_run(&self.run_path(run_id))? else {
            return Ok(Claim::Missing);
        };
        let mut data = lock.read();
        if let Some(busy) = lease.busy(data.holder.as_deref(), data.until_us) {
            return Ok(busy);
        }
        data.holder = Some(lease.holder.to_string());
        data.until_us = Some(lease.until.timestamp_micros());
        lock.write(&data)?;
        self.point("lease-written");
        Ok(Claim::Held(Box::new(run)))
    }

    fn renew(
        &self,
        holder: &str,
        run_ids: &[String],
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let _w = self.write.lock();
        for id in run_ids.iter().filter(|id| safe_id(id)) {
            let mut lock = self.run_lock(id)?;
            let mut data = lock.read();
            if data.holder.as_deref() == Some(holder) {
                data.until_us = Some(until.timestamp_micros());
                lock.write(&data)?;
            }
        }
        Ok(())
    }

    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        if !safe_id(run_id) {
            return Ok(());
        }
        let _w = self.write.lock();
        let mut lock = self.run_lock(run_id)?;
        let mut data = lock.read();
        if data.holder.as_deref() == Some(holder) {
            data.holder = None;
            data.until_us = None;
            lock.write(&data)?;
        }
        Ok(())
    }

    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.check_id(&run.run_id)?;
        check_next_version(run, &fence)?;
        if let Some(r) = records.iter().find(|r| r.run_id != run.run_id) {
            return Err(StoreError::io(format!(
                "a commit of run {} carries a record of run {}",
                run.run_id, r.run_id
            )));
        }
        let _w = self.write.lock();
        let mut lock = self.run_lock(&run.run_id)?;
        let mut data = lock.read();
        self.check(&run.run_id, &data, &fence)?;
        // A new run starts from an empty ledger (whatever a creation that
        // never landed wrote is cut off).
        let mark = if fence.version == 0 {
            LedgerMark::default()
        } else {
            self.write_mark(&run.run_id)?
        };
        let mut mark = self.append_locked(&run.run_id, &mark, records)?;
        mark.committed = mark.end;
        if fence.version == 0 {
            if !self.publish_new(run, &mark)? {
                return Err(StoreError::conflict(format!(
                    "run {} already exists",
                    run.run_id
                )));
            }
        } else {
            self.replace(run, &mark)?;
        }
        data.defer_until_us = None;
        data.defer_count = 0;
        data.defer_reason = None;
        match (lease, fence.holder) {
            (LeaseAfter::Renew(until), Some(h)) => {
                data.holder = Some(h.to_string());
                data.until_us = Some(until.timestamp_micros());
            }
            _ => {
                data.holder = None;
                data.until_us = None;
            }
        }
        lock.write(&data)?;
        self.point("lease-written");
        Ok(())
    }

    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        let _w = self.write.lock();
        let runs = run_ids(records);
        for run_id in runs {
            self.check_id(run_id)?;
            let mut lock = self.run_lock(run_id)?;
            let data = lock.read();
            self.check(run_id, &data, &fence)?;
            let mine: Vec<StepRecord> = records
                .iter()
                .filter(|r| r.run_id == run_id)
                .cloned()
                .collect();
            // Ahead of the state until the commit that makes them true; a
            // replay finds them through list_ahead.
            self.append_evidence(run_id, &mine, false)?;
        }
        Ok(())
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        let _w = self.write.lock();
        for run_id in run_ids(records) {
            self.check_id(run_id)?;
            let _lock = self.run_lock(run_id)?;
            let mine: Vec<StepRecord> = records
                .iter()
                .filter(|r| r.run_id == run_id)
                .cloned()
                .collect();
            // Evidence outside any transition: not ahead of the state
            // (unless evidence of a transition in flight is).
            self.append_evidence(run_id, &mine, true)?;
        }
        Ok(())
    }

    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        if !safe_id(run_id) {
            return Ok(Vec::new());
        }
        let Some(Some(mark)) = self.stored_mark(run_id)? else {
            // No run, or a run file without a mark: nothing is ahead.
            return Ok(Vec::new());
        };
        if mark.end == mark.committed {
            return Ok(Vec::new());
        }
        let path = self.ledger_path(run_id);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        Ok(read_lines(&mut f, &path, mark.committed, mark.end)?.0)
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.list_records_range(run_id, 0, u64::MAX)
    }

    /// Reads the ledger file from its start (records before `after` are
    /// skipped unparsed), so a page costs the read of the lines before it.
    fn list_records_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<StepRecord>, StoreError> {
        if !safe_id(run_id) {
            return Ok(Vec::new());
        }
        // Up to the mark's end: what lies past it no state reflects.
        let end = match self.stored_mark(run_id)? {
            Some(Some(mark)) => mark.end,
            _ => u64::MAX,
        };
        let path = self.ledger_path(run_id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        let mut out = Vec::new();
        let mut reader = BufReader::new(file.take(end));
        let mut line = String::new();
        let mut n = 0;
        let mut seq = 0u64;
        loop {
            line.clear();
            let read = reader.read_line(&mut line).map_err(|e| io(&path, e))?;
            if read == 0 || !line.ends_with('\n') {
                // The end, or a last line torn by a crash: not a record.
                break;
            }
            n += 1;
            if line.trim().is_empty() {
                continue;
            }
            seq += 1;
            if seq <= after {
                continue;
            }
            if seq > through {
                break;
            }
            out.push(
                serde_json::from_str(&line)
                    .map_err(|e| StoreError::corrupt(format!("{}:{n}: {e}", path.display())))?,
            );
        }
        Ok(out)
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let all = self.scan()?.0;
        Ok(query.page(all, |r| &r.run_id, |r| query.matches(r)))
    }

    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        let mut due: Vec<(DateTime<Utc>, String)> = self
            .scan()?
            .0
            .into_iter()
            .filter_map(|r| wait_due_at(&r).filter(|t| *t <= now).map(|t| (t, r.run_id)))
            .filter(|(_, id)| {
                self.lock_data(id)
                    .defer_until_us
                    .is_none_or(|u| u <= now.timestamp_micros())
            })
            .collect();
        due.sort_by_key(|(t, _)| *t); // stable: creation order among equals
        Ok(due.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        let (runs, unreadable) = self.scan()?;
        let now_us = now.timestamp_micros();
        let mut found = Vec::new();
        for run in runs.into_iter().filter(|r| r.status == RunStatus::Running) {
            let lease = self.lock_data(&run.run_id);
            let free = match (&lease.holder, lease.until_us) {
                (Some(_), Some(u)) => u < now_us,
                _ => true,
            };
            if free && lease.defer_until_us.is_none_or(|u| u <= now_us) {
                found.push((lease.defer_until_us, run.run_id));
            }
        }
        // Never deferred first, then deferred longest ago (stable: creation
        // order among equals).
        found.sort_by_key(|(defer, _)| *defer);
        let mut out: Vec<String> = found.into_iter().map(|(_, id)| id).collect();
        // Unreadable runs are listed too: their claim reports the damage.
        out.extend(unreadable);
        out.truncate(limit);
        Ok(out)
    }

    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let mut out = Vec::new();
        for run in self.scan()?.0 {
            if run.status != RunStatus::Running {
                continue;
            }
            if let Some(holder) = self.lock_data(&run.run_id).holder {
                out.push((run.run_id, holder));
                if out.len() >= limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        if !safe_id(run_id) {
            return Ok(0);
        }
        let _w = self.write.lock();
        let mut lock = self.run_lock(run_id)?;
        if !self.run_path(run_id).exists() {
            return Ok(0);
        }
        let mut data = lock.read();
        data.defer_count = data.defer_count.saturating_add(1);
        data.defer_until_us = Some(until(data.defer_count).timestamp_micros());
        data.defer_reason = reason.map(str::to_string);
        lock.write(&data)?;
        Ok(data.defer_count)
    }

    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        if !safe_id(run_id) {
            return Ok(None);
        }
        let data = self.lock_data(run_id);
        Ok(data
            .defer_until_us
            .and_then(DateTime::from_timestamp_micros)
            .map(|until| Deferral {
                until,
                count: data.defer_count,
                reason: data.defer_reason,
            }))
    }

    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError> {
        self.check_id(run_id)?;
        let _w = self.write.lock();
        let _lock = self.run_lock(run_id)?;
        let path = self.quarantine_path(run_id);
        if path.exists() {
            return Ok(());
        }
        let tmp = self.temp(reason.as_bytes())?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        self.sync_dir()
    }

    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut out = Vec::new();
        for id in self.created()? {
            if let Ok(reason) = fs::read_to_string(self.quarantine_path(&id)) {
                out.push((id, reason));
            }
        }
        Ok(out)
    }

    fn deploy(&self, d: &crate::Deployment<'_>) -> Result<Vec<crate::Deployed>, StoreError> {
        let _w = self.write.lock();
        let _store = self.store_lock()?;
        let root = self.dir.join(BUNDLE_FILES);
        // Written (or repaired) first: a version never names files that
        // are not there.
        d.files.materialise(&root).map_err(|e| io(&root, e))?;
        let mut versions = self.versions()?;
        let planned = crate::deployments::plan(&versions, d);
        if planned.iter().any(|p| !p.unchanged) {
            versions.extend(
                planned
                    .iter()
                    .filter(|p| !p.unchanged)
                    .map(|p| p.version.clone()),
            );
            self.write_versions(&versions)?;
        }
        Ok(planned)
    }

    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<crate::WorkflowVersion>, StoreError> {
        Ok(crate::deployments::pick(
            &self.versions()?,
            workflow_id,
            version,
        ))
    }

    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<crate::WorkflowVersion>, StoreError> {
        Ok(crate::deployments::select(&self.versions()?, workflow_id))
    }

    fn bundle_files(&self, digest: &str) -> Result<Vec<crate::bundles::BundleFile>, StoreError> {
        if !crate::bundles::is_digest(digest) {
            return Ok(Vec::new());
        }
        let root = self.dir.join(BUNDLE_FILES);
        Ok(crate::bundles::BundleFiles::read_kept(&root, digest).unwrap_or_default())
    }

    fn delete_runs(&self, run_ids: &[String]) -> Result<crate::Deleted, StoreError> {
        let _w = self.write.lock();
        let mut out = crate::Deleted::default();
        // Every run locked (in id order, as no other writer holds two) and
        // checked before any goes.
        let mut ids: Vec<&String> = run_ids.iter().filter(|id| safe_id(id)).collect();
        ids.sort();
        ids.dedup();
        let mut locks = Vec::new();
        let mut present = Vec::new();
        for id in ids {
            locks.push(self.run_lock(id)?);
            match self.read_run(&self.run_path(id))? {
                None => {}
                Some(r) if r.status.is_terminal() => present.push(id),
                Some(_) => return Ok(out),
            }
        }
        for id in present {
            let ledger = self.ledger_path(id);
            let records = fs::read(&ledger)
                .map(|b| b.iter().filter(|c| **c == b'\n').count() as u64)
                .unwrap_or(0);
            // The run's file first: once it is gone the run is, and a
            // crash before the rest leaves files no run names.
            let run = self.run_path(id);
            fs::remove_file(&run).map_err(|e| io(&run, e))?;
            for path in [ledger, self.quarantine_path(id)] {
                match fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&path, e)),
                    _ => {}
                }
            }
            out.runs.push(id.clone());
            out.records += records;
        }
        // The lock files stay: a process waiting on one must not lock a
        // file that another then creates afresh.
        drop(locks);
        Ok(out)
    }

    fn remove_versions(&self, gone: &[crate::WorkflowVersion]) -> Result<usize, StoreError> {
        let _w = self.write.lock();
        let _store = self.store_lock()?;
        let mut versions = self.versions()?;
        let removed = crate::deployments::remove(&mut versions, gone);
        if removed > 0 {
            self.write_versions(&versions)?;
        }
        let root = self.dir.join(BUNDLE_FILES);
        for r in gone {
            if !versions.iter().any(|v| v.digest == r.digest)
                && crate::bundles::is_digest(&r.digest)
            {
                let _ = fs::remove_dir_all(root.join(&r.digest));
            }
        }
        Ok(removed)
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        Ok(self.bundles()?.get(workflow_id).cloned())
    }

    fn append_event(&self, event: &super::InboxEvent) -> Result<super::EventAppend, StoreError> {
        let _w = self.write.lock();
        let _store = self.store_lock()?;
        let all = self.inbox()?;
        let mut last = 0;
        for e in all.iter().filter(|e| e.stream == event.stream) {
            if e.dedupe_key == event.dedupe_key {
                return Ok(super::EventAppend {
                    seq: e.seq,
                    duplicate: true,
                });
            }
            last = e.seq;
        }
        let seq = last + 1;
        let path = self.dir.join(INBOX);
        // Drop a torn last line (a crash during its append): that event was
        // never appended, and the next line must start on a line of its own.
        super::jsonl::drop_torn_tail(&path)?;
        let mut line = serde_json::to_vec(&super::InboxEvent {
            seq,
            ..event.clone()
        })
        .map_err(|e| io(&path, e))?;
        line.push(b'\n');
        let mut f = private_file()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(&line).map_err(|e| io(&path, e))?;
        self.sync(&f, &path)?;
        Ok(super::EventAppend {
            seq,
            duplicate: false,
        })
    }

    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::InboxEvent>, StoreError> {
        Ok(self
            .inbox()?
            .into_iter()
            .filter(|e| e.stream == stream && e.seq > after)
            .take(limit)
            .collect())
    }

    fn create_connection(&self, connection: &super::ConnectionRecord) -> Result<(), StoreError> {
        let _w = self.write.lock();
        let _store = self.store_lock()?;
        let mut all = self.connections()?;
        if all
            .iter()
            .any(|c| c.connection_id == connection.connection_id)
        {
            return Err(StoreError::conflict(format!(
                "connection {} already exists",
                connection.connection_id
            )));
        }
        all.push(connection.clone());
        self.save_connections(&all)
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut super::ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<super::ConnectionRecord>, StoreError> {
        let _w = self.write.lock();
        let _store = self.store_lock()?;
        let mut all = self.connections()?;
        let Some(slot) = all.iter_mut().find(|c| c.connection_id == id) else {
            return Ok(None);
        };
        change(slot)?;
        let out = slot.clone();
        self.save_connections(&all)?;
        Ok(Some(out))
    }

    fn get_connection(&self, id: &str) -> Result<Option<super::ConnectionRecord>, StoreError> {
        Ok(self
            .connections()?
            .into_iter()
            .find(|c| c.connection_id == id))
    }

    fn list_connections(&self) -> Result<Vec<super::ConnectionRecord>, StoreError> {
        self.connections()
    }
}

/// The event inbox of a JSON store: one event per line, every stream.
const INBOX: &str = "inbox.jsonl";
/// The trigger connections of a JSON store.
const CONNECTIONS: &str = "connections.json";

impl JsonFileStore {
    /// Every event of the inbox, oldest first (a torn last line, from a
    /// crash during its append, was never appended).
    fn inbox(&self) -> Result<Vec<super::InboxEvent>, StoreError> {
        super::jsonl::read_lines(&self.dir.join(INBOX))
    }

    fn connections(&self) -> Result<Vec<super::ConnectionRecord>, StoreError> {
        let path = self.dir.join(CONNECTIONS);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(&path, e)),
        }
    }

    fn save_connections(&self, all: &[super::ConnectionRecord]) -> Result<(), StoreError> {
        let path = self.dir.join(CONNECTIONS);
        let bytes = serde_json::to_vec_pretty(all).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        self.sync_dir()
    }
}

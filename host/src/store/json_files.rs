//! The JSON-file store: one folder, `run_<id>.json` per run and
//! `ledger_<id>.jsonl` per ledger, readable with any text tool.
//!
//! - A run is created only if its id is free: a fully written temp file is
//!   published with an atomic hard link, which never replaces an existing
//!   run file (a filesystem without hard links gets an error, never an
//!   overwrite). Saves write a temp file and rename it over the run file.
//! - A creation journal, `.runs_created.log`, lists run ids in creation
//!   order; several store objects (or processes) on one folder see each
//!   other's runs through it. One writer process per folder is supported.
//! - Temp files a crash left behind are removed when the store opens.
//! - A ledger line is appended with one `write` of the whole line; a line
//!   that does not parse is reported with its file and line number, and the
//!   rest of the store stays readable.
//! - `stepwell-store.json` records the format version; a folder written by a
//!   newer stepwell is refused.
//!
//! Process-crash safe (a completed write survives the process); no `fsync`,
//! so a power loss may lose the last writes. Listing and the due-wait scan
//! read every run file: this backend is for small deployments, inspection
//! and tests; use SQLite for volume.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use super::{link, wait_due_at, RunQuery, Store, StoreError};
use crate::core::model::{RunState, StepRecord};

/// The format version this build writes.
pub const FORMAT_VERSION: u64 = 1;
const META_FILE: &str = "stepwell-store.json";
const JOURNAL: &str = ".runs_created.log";
const BUNDLES: &str = "bundles.json";
const TMP_PREFIX: &str = ".tmp-";

/// Runs and ledgers as JSON files in one folder.
#[derive(Debug)]
pub struct JsonFileStore {
    dir: PathBuf,
    /// Serialises this object's writes (one writer process per folder), and
    /// remembers the hash of each ledger's last record.
    write: Mutex<HashMap<String, Option<String>>>,
    tmp_seq: AtomicU64,
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

impl JsonFileStore {
    /// Opens (creating if needed) the store folder `dir`: checks its format
    /// version and removes temp files a crash left behind.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
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
                let text =
                    serde_json::json!({"format": "stepwell.json-files", "version": FORMAT_VERSION});
                fs::write(&meta, text.to_string()).map_err(|e| io(&meta, e))?;
            }
            Err(e) => return Err(io(&meta, e)),
        }
        for entry in fs::read_dir(&dir).map_err(|e| io(&dir, e))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(JsonFileStore {
            dir,
            write: Mutex::new(HashMap::new()),
            tmp_seq: AtomicU64::new(0),
        })
    }

    /// The store folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn run_path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("run_{run_id}.json"))
    }

    fn ledger_path(&self, run_id: &str) -> PathBuf {
        self.dir.join(format!("ledger_{run_id}.jsonl"))
    }

    /// Writes `bytes` to a fresh temp file in the folder and returns its path.
    fn temp(&self, bytes: &[u8]) -> Result<PathBuf, StoreError> {
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let path = self
            .dir
            .join(format!("{TMP_PREFIX}{}-{n}", std::process::id()));
        fs::write(&path, bytes).map_err(|e| io(&path, e))?;
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
            if seen.insert(line.to_string(), ()).is_none() {
                ids.push(line.to_string());
            }
        }
        Ok(ids)
    }

    fn journal(&self, run_id: &str) -> Result<(), StoreError> {
        let path = self.dir.join(JOURNAL);
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        f.write_all(format!("{run_id}\n").as_bytes())
            .map_err(|e| io(&path, e))
    }

    fn all_runs(&self) -> Result<Vec<RunState>, StoreError> {
        let mut out = Vec::new();
        for id in self.created()? {
            if let Some(run) = self.read_run(&self.run_path(&id))? {
                out.push(run);
            }
        }
        Ok(out)
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

impl Store for JsonFileStore {
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        if !safe_id(run_id) {
            return Ok(None);
        }
        self.read_run(&self.run_path(run_id))
    }

    fn save_run(&self, run: &RunState) -> Result<(), StoreError> {
        self.check_id(&run.run_id)?;
        let _w = self.write.lock();
        let path = self.run_path(&run.run_id);
        // Journal a new run before its file appears: a crash in between
        // leaves a journal line without a file (skipped), never a run that
        // listing cannot see.
        if !path.exists() {
            self.journal(&run.run_id)?;
        }
        let bytes = serde_json::to_vec(run).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.check_id(&run.run_id)?;
        let _w = self.write.lock();
        let path = self.run_path(&run.run_id);
        let bytes = serde_json::to_vec(run).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        if !path.exists() {
            self.journal(&run.run_id)?;
        }
        let linked = fs::hard_link(&tmp, &path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok((run.clone(), true)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                let existing = self
                    .read_run(&path)?
                    .ok_or_else(|| io(&path, "exists but vanished while being read"))?;
                Ok((existing, false))
            }
            Err(e) => Err(io(&path, format!("cannot publish the run file: {e}"))),
        }
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        Ok(self
            .all_runs()?
            .into_iter()
            .filter(|r| query.matches(r))
            .take(query.limit.unwrap_or(usize::MAX))
            .collect())
    }

    fn list_due_waits(&self, now: DateTime<Utc>) -> Result<Vec<RunState>, StoreError> {
        let mut due: Vec<(DateTime<Utc>, RunState)> = self
            .all_runs()?
            .into_iter()
            .filter_map(|r| wait_due_at(&r).filter(|t| *t <= now).map(|t| (t, r)))
            .collect();
        due.sort_by_key(|(t, _)| *t); // stable: creation order among equals
        Ok(due.into_iter().map(|(_, r)| r).collect())
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        let mut heads = self.write.lock();
        let mut by_run: Vec<(&str, String)> = Vec::new();
        let mut pending: HashMap<&str, Option<String>> = HashMap::new();
        for r in records {
            self.check_id(&r.run_id)?;
            let head = match pending.get_mut(r.run_id.as_str()) {
                Some(h) => h,
                None => {
                    let known = match heads.get(&r.run_id) {
                        Some(h) => h.clone(),
                        None => self
                            .list_records(&r.run_id)?
                            .last()
                            .and_then(|l| l.record_hash.clone()),
                    };
                    pending.entry(r.run_id.as_str()).or_insert(known)
                }
            };
            let mut r2 = r.clone();
            let line = link(head, &mut r2);
            match by_run.iter_mut().find(|(id, _)| *id == r.run_id) {
                Some((_, buf)) => {
                    buf.push_str(&line);
                    buf.push('\n');
                }
                None => by_run.push((&r.run_id, format!("{line}\n"))),
            }
        }
        for (run_id, text) in by_run {
            let path = self.ledger_path(run_id);
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io(&path, e))?;
            f.write_all(text.as_bytes()).map_err(|e| io(&path, e))?;
            heads.insert(run_id.to_string(), pending.get(run_id).cloned().flatten());
        }
        Ok(())
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        if !safe_id(run_id) {
            return Ok(Vec::new());
        }
        let path = self.ledger_path(run_id);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&path, e)),
        };
        let mut out = Vec::new();
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| io(&path, e))?;
            if line.trim().is_empty() {
                continue;
            }
            out.push(
                serde_json::from_str(&line).map_err(|e| {
                    StoreError::corrupt(format!("{}:{}: {e}", path.display(), n + 1))
                })?,
            );
        }
        Ok(out)
    }

    fn put_bundle(&self, workflow_id: &str, dir: &Path) -> Result<(), StoreError> {
        let _w = self.write.lock();
        let mut map = self.bundles()?;
        map.insert(workflow_id.to_string(), dir.to_path_buf());
        let path = self.dir.join(BUNDLES);
        let bytes = serde_json::to_vec_pretty(&map).map_err(|e| io(&path, e))?;
        let tmp = self.temp(&bytes)?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        Ok(self.bundles()?.get(workflow_id).cloned())
    }
}

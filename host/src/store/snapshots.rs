//! Snapshots: named, searchable bookmarks of a run's state, for debugging
//! ("return to a known-good state"), inspection and experiments. Restoring
//! one writes its state back as the run's state (see
//! [`crate::Runtime::restore_snapshot`]); it cannot make that safe if the
//! workflow changed since.
//!
//! Backends: [`MemorySnapshotStore`] and [`JsonSnapshotStore`] (one
//! `snapshot_<id>.json` per snapshot in a folder).

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::StoreError;
use crate::core::model::RunState;

/// A named bookmark of a run's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The snapshot's id (a UUID).
    pub snapshot_id: String,
    /// The run it was taken of.
    pub run_id: String,
    /// The run's newest ledger record when it was taken, if any.
    pub step_id: Option<String>,
    /// A short name.
    pub name: String,
    /// A longer description.
    pub description: String,
    /// Tags to search by.
    pub tags: Vec<String>,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// The run's state at that moment.
    pub run_state: RunState,
}

/// Filters of [`SnapshotStore::search`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotQuery {
    /// Only snapshots of this run.
    pub run_id: Option<String>,
    /// Only snapshots with this tag.
    pub tag: Option<String>,
    /// Only snapshots whose name or description contains this text
    /// (case-insensitive).
    pub text: Option<String>,
    /// At most this many.
    pub limit: Option<usize>,
}

impl SnapshotQuery {
    /// Whether `s` passes every filter.
    pub fn matches(&self, s: &Snapshot) -> bool {
        let text = self.text.as_ref().map(|t| t.to_lowercase());
        self.run_id.as_ref().is_none_or(|r| s.run_id == *r)
            && self.tag.as_ref().is_none_or(|t| s.tags.contains(t))
            && text.is_none_or(|t| {
                s.name.to_lowercase().contains(&t) || s.description.to_lowercase().contains(&t)
            })
    }
}

/// Where snapshots are kept.
pub trait SnapshotStore: Send + Sync {
    /// Stores `snapshot` (replacing one with the same id).
    fn save_snapshot(&self, snapshot: &Snapshot) -> Result<(), StoreError>;
    /// The snapshot with this id.
    fn load_snapshot(&self, snapshot_id: &str) -> Result<Option<Snapshot>, StoreError>;
    /// Snapshots matching `query`, newest first.
    fn search_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>, StoreError>;
    /// Deletes a snapshot; whether it existed.
    fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, StoreError>;
}

fn newest_first(mut found: Vec<Snapshot>, query: &SnapshotQuery) -> Vec<Snapshot> {
    found.sort_by(|a, b| {
        b.created_at
            .cmp(&a.created_at)
            .then(b.snapshot_id.cmp(&a.snapshot_id))
    });
    found.truncate(query.limit.unwrap_or(usize::MAX));
    found
}

/// Snapshots in process memory.
#[derive(Debug, Default)]
pub struct MemorySnapshotStore {
    snapshots: Mutex<HashMap<String, Snapshot>>,
}

impl MemorySnapshotStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SnapshotStore for MemorySnapshotStore {
    fn save_snapshot(&self, snapshot: &Snapshot) -> Result<(), StoreError> {
        self.snapshots
            .lock()
            .insert(snapshot.snapshot_id.clone(), snapshot.clone());
        Ok(())
    }

    fn load_snapshot(&self, snapshot_id: &str) -> Result<Option<Snapshot>, StoreError> {
        Ok(self.snapshots.lock().get(snapshot_id).cloned())
    }

    fn search_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>, StoreError> {
        let found = self
            .snapshots
            .lock()
            .values()
            .filter(|s| query.matches(s))
            .cloned()
            .collect();
        Ok(newest_first(found, query))
    }

    fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, StoreError> {
        Ok(self.snapshots.lock().remove(snapshot_id).is_some())
    }
}

/// Snapshots as `snapshot_<id>.json` files in a folder.
#[derive(Debug)]
pub struct JsonSnapshotStore {
    dir: PathBuf,
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

impl JsonSnapshotStore {
    /// Opens (creating if needed) the folder.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(|e| io(&dir, e))?;
        Ok(JsonSnapshotStore { dir })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        let safe = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        safe.then(|| self.dir.join(format!("snapshot_{id}.json")))
    }

    fn read(path: &Path) -> Result<Option<Snapshot>, StoreError> {
        match fs::read(path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path, e)),
        }
    }
}

impl SnapshotStore for JsonSnapshotStore {
    fn save_snapshot(&self, snapshot: &Snapshot) -> Result<(), StoreError> {
        let path = self
            .path(&snapshot.snapshot_id)
            .ok_or_else(|| io(&self.dir, "a snapshot id cannot name a file"))?;
        let tmp = self.dir.join(format!(".tmp-{}", snapshot.snapshot_id));
        fs::write(
            &tmp,
            serde_json::to_vec_pretty(snapshot).map_err(|e| io(&path, e))?,
        )
        .map_err(|e| io(&tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, e))
    }

    fn load_snapshot(&self, snapshot_id: &str) -> Result<Option<Snapshot>, StoreError> {
        match self.path(snapshot_id) {
            Some(p) => Self::read(&p),
            None => Ok(None),
        }
    }

    fn search_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>, StoreError> {
        let mut found = Vec::new();
        for entry in fs::read_dir(&self.dir)
            .map_err(|e| io(&self.dir, e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("snapshot_") && name.ends_with(".json") {
                if let Some(s) = Self::read(&entry.path())? {
                    if query.matches(&s) {
                        found.push(s);
                    }
                }
            }
        }
        Ok(newest_first(found, query))
    }

    fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, StoreError> {
        let Some(path) = self.path(snapshot_id) else {
            return Ok(false);
        };
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io(&path, e)),
        }
    }
}

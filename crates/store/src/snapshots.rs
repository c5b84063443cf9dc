//! Snapshots: named, searchable bookmarks of a run's state, for debugging
//! ("return to a known-good state"), inspection and experiments. Restoring
//! one writes its state back as the run's state (see
//! `Runtime::restore_snapshot`); it cannot make that safe if the
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
use stepwell_model::model::RunState;

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
    /// [`SnapshotStore::search_snapshots`], with why each snapshot that
    /// could not be read was left out (a store of files leaves a bad file
    /// out rather than fail the whole search; the default has none).
    fn search_snapshots_reporting(
        &self,
        query: &SnapshotQuery,
    ) -> Result<(Vec<Snapshot>, Vec<StoreError>), StoreError> {
        Ok((self.search_snapshots(query)?, Vec::new()))
    }
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

/// Snapshots as `snapshot_<id>.json` files in a folder, each sealed by
/// this store: a `seal` beside the snapshot's fields, the HMAC-SHA256 of
/// the snapshot under a key kept in the folder (`seal.key`, `0600`). A
/// snapshot is read only if its seal is this store's: a file changed by
/// hand, by another user or copied from another store is refused
/// (`store_corrupt`, naming it), so a restore never takes a run's
/// host-owned vars (`_runtime`: its tool scope, its policy) from a file as
/// it is. The folder is this user's alone (`0700`, refused otherwise) and
/// the files `0600`.
pub struct JsonSnapshotStore {
    dir: PathBuf,
    key: Vec<u8>,
}

impl std::fmt::Debug for JsonSnapshotStore {
    /// The folder (never the key).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSnapshotStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// The file, in a snapshots folder, that holds the key of its seals.
pub const SEAL_KEY_FILE: &str = "seal.key";

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

impl JsonSnapshotStore {
    /// Opens (creating if needed, `0700`) the folder and its seal key;
    /// refuses a folder that is a symbolic link, another user's or
    /// writable by others, and a key file others may read
    /// (`store_unsafe`).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        super::private::open_dir(&dir, "the snapshots folder")?;
        let file = dir.join(SEAL_KEY_FILE);
        let key = super::private::load_or_create_secret_file(&file)
            .map_err(|why| StoreError::unsafe_path(format!("{}: {why}", file.display())))?;
        Ok(JsonSnapshotStore {
            dir,
            key: key.into_bytes(),
        })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        let safe = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        safe.then(|| self.dir.join(format!("snapshot_{id}.json")))
    }

    /// The seal of `snapshot`: the HMAC-SHA256 of its JSON.
    fn seal(
        &self,
        snapshot: &Snapshot,
        path: &Path,
    ) -> Result<hmac::Hmac<sha2::Sha256>, StoreError> {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(&serde_json::to_vec(snapshot).map_err(|e| io(path, e))?);
        Ok(mac)
    }

    fn read(&self, path: &Path) -> Result<Option<Snapshot>, StoreError> {
        use hmac::Mac;
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(path, e)),
        };
        let corrupt = |what: String| StoreError::corrupt(format!("{}: {what}", path.display()));
        let mut value: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let seal = value
            .as_object_mut()
            .and_then(|m| m.remove("seal"))
            .and_then(|s| hex::decode(s.as_str()?).ok())
            .ok_or_else(|| corrupt("the snapshot has no seal of this store: refusing it".into()))?;
        let snapshot: Snapshot =
            serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
        self.seal(&snapshot, path)?.verify_slice(&seal).map_err(|_| {
            corrupt(format!(
                "snapshot {}: its seal does not match its content (it was changed, or written by another store): refusing it",
                snapshot.snapshot_id
            ))
        })?;
        Ok(Some(snapshot))
    }
}

impl SnapshotStore for JsonSnapshotStore {
    fn save_snapshot(&self, snapshot: &Snapshot) -> Result<(), StoreError> {
        use hmac::Mac;
        let path = self
            .path(&snapshot.snapshot_id)
            .ok_or_else(|| io(&self.dir, "a snapshot id cannot name a file"))?;
        let seal = hex::encode(self.seal(snapshot, &path)?.finalize().into_bytes());
        let mut value = serde_json::to_value(snapshot).map_err(|e| io(&path, e))?;
        if let Some(m) = value.as_object_mut() {
            m.insert("seal".into(), seal.into());
        }
        let bytes = serde_json::to_vec_pretty(&value).map_err(|e| io(&path, e))?;
        super::private::write_synced(&path, &bytes).map_err(|e| io(&path, e))
    }

    fn load_snapshot(&self, snapshot_id: &str) -> Result<Option<Snapshot>, StoreError> {
        match self.path(snapshot_id) {
            Some(p) => self.read(&p),
            None => Ok(None),
        }
    }

    /// Snapshots matching `query`, newest first; a file that cannot be read
    /// or whose seal does not hold is left out (with a warning naming it),
    /// so one bad file does not hide the others.
    fn search_snapshots(&self, query: &SnapshotQuery) -> Result<Vec<Snapshot>, StoreError> {
        let (found, left_out) = self.search_snapshots_reporting(query)?;
        for e in left_out {
            tracing::warn!("snapshot left out of the listing: {e}");
        }
        Ok(found)
    }

    fn search_snapshots_reporting(
        &self,
        query: &SnapshotQuery,
    ) -> Result<(Vec<Snapshot>, Vec<StoreError>), StoreError> {
        let (mut found, mut left_out) = (Vec::new(), Vec::new());
        for entry in fs::read_dir(&self.dir)
            .map_err(|e| io(&self.dir, e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("snapshot_") && name.ends_with(".json")) {
                continue;
            }
            match self.read(&entry.path()) {
                Ok(Some(s)) if query.matches(&s) => found.push(s),
                Ok(_) => {}
                Err(e) => left_out.push(e),
            }
        }
        Ok((newest_first(found, query), left_out))
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

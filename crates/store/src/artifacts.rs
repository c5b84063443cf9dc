//! Artifacts: large values kept by reference. An artifact store holds bytes
//! content-addressed (the id is the SHA-256 of the content, so storing the
//! same content twice stores it once) with metadata; a reference in JSON is
//! `{"$artifact": "<id>"}`.
//!
//! The runtime uses it to keep run state and ledger records bounded: with an
//! artifact store and a threshold configured (`RuntimeBuilder::artifacts`),
//! every top-level var, effect payload or record result larger than the
//! threshold is stored as an artifact and replaced by its reference when
//! saved, and loaded back when read. Identity metadata (`vars._meta`) and the
//! host's own vars (`_limits`, `_runtime`) always stay inline.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::StoreError;

/// What an artifact store knows about an artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactMeta {
    /// The SHA-256 of the content, in hex.
    pub artifact_id: String,
    /// The content's media type (`application/json` for offloaded values).
    pub content_type: String,
    /// The content's size in bytes.
    pub size: u64,
    /// The run it was stored for, if any.
    pub run_id: Option<String>,
    /// When it was first stored (RFC 3339).
    pub created_at: String,
}

/// Where artifacts are kept.
pub trait ArtifactStore: Send + Sync {
    /// Stores `content` (once: the same content gets the same id) and
    /// returns its metadata.
    fn put(
        &self,
        content: &[u8],
        content_type: &str,
        run_id: Option<&str>,
        created_at: &str,
    ) -> Result<ArtifactMeta, StoreError>;
    /// The content of an artifact.
    fn get(&self, artifact_id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// The metadata of an artifact.
    fn meta(&self, artifact_id: &str) -> Result<Option<ArtifactMeta>, StoreError>;

    /// Every artifact's metadata, in no order (what retention's sweep
    /// looks through). The default: `store_unsupported`.
    fn list(&self) -> Result<Vec<ArtifactMeta>, StoreError> {
        Err(StoreError::unsupported(
            "this artifact store cannot list its artifacts",
        ))
    }

    /// Deletes an artifact, unless it was stored, or stored again (a
    /// [`ArtifactStore::put`] of the same content renews it), at or after
    /// `since`: whether it went. A put racing the deletion either renews it
    /// first (it stays) or stores it anew. The default: `store_unsupported`.
    fn delete_unless_since(
        &self,
        artifact_id: &str,
        since: std::time::SystemTime,
    ) -> Result<bool, StoreError> {
        let _ = (artifact_id, since);
        Err(StoreError::unsupported(
            "this artifact store cannot delete artifacts",
        ))
    }
}

/// The id of `content`.
pub fn artifact_id(content: &[u8]) -> String {
    hex::encode(Sha256::digest(content))
}

/// `{"$artifact": id}`.
pub fn artifact_ref(artifact_id: &str) -> Value {
    serde_json::json!({ "$artifact": artifact_id })
}

/// The artifact id, if `v` is exactly a reference.
pub fn as_artifact_ref(v: &Value) -> Option<&str> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get("$artifact").and_then(Value::as_str),
        _ => None,
    }
}

/// Artifacts in process memory.
#[derive(Debug, Default)]
pub struct MemoryArtifactStore {
    items: Mutex<HashMap<String, Kept>>,
}

/// An artifact in memory: its metadata, content, and when it was last
/// stored.
type Kept = (ArtifactMeta, Vec<u8>, SystemTime);

impl MemoryArtifactStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ArtifactStore for MemoryArtifactStore {
    fn put(
        &self,
        content: &[u8],
        content_type: &str,
        run_id: Option<&str>,
        created_at: &str,
    ) -> Result<ArtifactMeta, StoreError> {
        let id = artifact_id(content);
        let mut items = self.items.lock();
        let entry = items.entry(id.clone()).or_insert_with(|| {
            (
                ArtifactMeta {
                    artifact_id: id,
                    content_type: content_type.into(),
                    size: content.len() as u64,
                    run_id: run_id.map(str::to_string),
                    created_at: created_at.into(),
                },
                content.to_vec(),
                SystemTime::now(),
            )
        });
        entry.2 = SystemTime::now();
        Ok(entry.0.clone())
    }

    fn list(&self) -> Result<Vec<ArtifactMeta>, StoreError> {
        Ok(self.items.lock().values().map(|e| e.0.clone()).collect())
    }

    fn delete_unless_since(
        &self,
        artifact_id: &str,
        since: SystemTime,
    ) -> Result<bool, StoreError> {
        let mut items = self.items.lock();
        if items.get(artifact_id).is_some_and(|e| e.2 < since) {
            items.remove(artifact_id);
            return Ok(true);
        }
        Ok(false)
    }

    fn get(&self, artifact_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.items.lock().get(artifact_id).map(|e| e.1.clone()))
    }

    fn meta(&self, artifact_id: &str) -> Result<Option<ArtifactMeta>, StoreError> {
        Ok(self.items.lock().get(artifact_id).map(|e| e.0.clone()))
    }
}

/// Artifacts as files: `<dir>/<first two hex digits>/<id>` and `<id>.json`
/// (the metadata) beside it. Content is written to a temp file and renamed:
/// a crash never leaves a partial artifact under its id. The folders are
/// this user's alone (`0700`, refused otherwise, see
/// [`super::private`]) and the files `0600`; content is checked against
/// its id when read, so a file changed behind the store is refused
/// (`store_corrupt`, naming it) rather than returned.
#[derive(Debug)]
pub struct FileArtifactStore {
    dir: PathBuf,
}

fn io(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::io(format!("{}: {e}", path.display()))
}

impl FileArtifactStore {
    /// Opens (creating if needed, `0700`) the folder; refuses one that is a
    /// symbolic link, another user's or writable by others
    /// (`store_unsafe`).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        super::private::open_dir(&dir, "the artifacts folder")?;
        Ok(FileArtifactStore { dir })
    }

    fn path(&self, id: &str) -> Option<PathBuf> {
        let ok = id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit());
        ok.then(|| self.dir.join(&id[..2]).join(id))
    }

    fn write(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        super::private::write_synced(path, bytes).map_err(|e| io(path, e))
    }

    /// The store's lock (`<dir>/.lock`): shared by puts, held alone by a
    /// deletion, so that a put never renews an artifact a deletion is
    /// taking away. Released when the file closes.
    fn lock(&self, alone: bool) -> Result<fs::File, StoreError> {
        let path = self.dir.join(".lock");
        let file = super::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        let locked = if alone {
            file.lock()
        } else {
            file.lock_shared()
        };
        locked.map_err(|e| io(&path, format!("cannot lock: {e}")))?;
        Ok(file)
    }

    /// Marks the artifact at `path` stored now (its modification time):
    /// whether it is there.
    fn renew(path: &Path) -> bool {
        fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(SystemTime::now()))
            .is_ok()
    }
}

impl ArtifactStore for FileArtifactStore {
    fn put(
        &self,
        content: &[u8],
        content_type: &str,
        run_id: Option<&str>,
        created_at: &str,
    ) -> Result<ArtifactMeta, StoreError> {
        let id = artifact_id(content);
        let _shared = self.lock(false)?;
        let path = self.path(&id).expect("a SHA-256 names a file");
        if let Some(meta) = self.meta(&id)? {
            // Kept only if its content is there and is this content: a
            // missing or changed file is written again. Kept, it is
            // renewed: retention's sweep leaves what was stored lately.
            if matches!(self.get(&id), Ok(Some(_))) && Self::renew(&path) {
                return Ok(meta);
            }
        }
        let parent = path.parent().expect("a shard folder");
        super::private::open_dir(parent, "the artifacts shard folder")?;
        let meta = ArtifactMeta {
            artifact_id: id,
            content_type: content_type.into(),
            size: content.len() as u64,
            run_id: run_id.map(str::to_string),
            created_at: created_at.into(),
        };
        Self::write(&path, content)?;
        let meta_bytes = serde_json::to_vec(&meta).map_err(|e| io(&path, e))?;
        Self::write(&path.with_extension("json"), &meta_bytes)?;
        Ok(meta)
    }

    fn get(&self, artifact_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(path) = self.path(artifact_id) else {
            return Ok(None);
        };
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path, e)),
        };
        let found = self::artifact_id(&bytes);
        if !found.eq_ignore_ascii_case(artifact_id) {
            return Err(StoreError::corrupt(format!(
                "{}: artifact {artifact_id}: the file's content does not match its id (its SHA-256 is {found}): it was changed behind the store; refusing it",
                path.display()
            )));
        }
        Ok(Some(bytes))
    }

    fn list(&self) -> Result<Vec<ArtifactMeta>, StoreError> {
        let mut out = Vec::new();
        let shards = match fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io(&self.dir, e)),
        };
        for shard in shards {
            let shard = shard.map_err(|e| io(&self.dir, e))?.path();
            if !shard.is_dir() {
                continue;
            }
            for f in fs::read_dir(&shard).map_err(|e| io(&shard, e))? {
                let f = f.map_err(|e| io(&shard, e))?.path();
                let id = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                if f.extension().is_some_and(|x| x == "json") && self.path(id).is_some() {
                    out.extend(self.meta(id)?);
                }
            }
        }
        Ok(out)
    }

    fn delete_unless_since(
        &self,
        artifact_id: &str,
        since: SystemTime,
    ) -> Result<bool, StoreError> {
        let Some(path) = self.path(artifact_id) else {
            return Ok(false);
        };
        let _alone = self.lock(true)?;
        let stored = match fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(t) => t,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(&path, e)),
        };
        if stored >= since {
            return Ok(false);
        }
        // The content first: an artifact without its content is one a put
        // writes again.
        for p in [path.clone(), path.with_extension("json")] {
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io(&p, e)),
            }
        }
        Ok(true)
    }

    fn meta(&self, artifact_id: &str) -> Result<Option<ArtifactMeta>, StoreError> {
        let Some(path) = self.path(artifact_id).map(|p| p.with_extension("json")) else {
            return Ok(None);
        };
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| StoreError::corrupt(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        }
    }
}

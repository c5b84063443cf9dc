//! Artifacts: large values kept by reference. An artifact store holds bytes
//! content-addressed (the id is the SHA-256 of the content, so storing the
//! same content twice stores it once) with metadata; a reference in JSON is
//! `{"$artifact": "<id>"}`.
//!
//! The runtime uses it to keep run state and ledger records bounded: with an
//! artifact store and a threshold configured ([`crate::RuntimeBuilder::artifacts`]),
//! every top-level var, effect payload or record result larger than the
//! threshold is stored as an artifact and replaced by its reference when
//! saved, and loaded back when read. Identity metadata (`vars._meta`) and the
//! host's own vars (`_limits`, `_runtime`) always stay inline.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

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

/// The escaped value, if `v` is exactly `{"$literal": value}`.
fn as_literal(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get("$literal"),
        _ => None,
    }
}

/// Artifacts in process memory.
#[derive(Debug, Default)]
pub struct MemoryArtifactStore {
    items: Mutex<HashMap<String, (ArtifactMeta, Vec<u8>)>>,
}

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
            )
        });
        Ok(entry.0.clone())
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
        if let Some(meta) = self.meta(&id)? {
            // Kept only if its content is there and is this content: a
            // missing or changed file is written again.
            if matches!(self.get(&id), Ok(Some(_))) {
                return Ok(meta);
            }
        }
        let path = self.path(&id).expect("a SHA-256 names a file");
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

/// Offloads and loads back large values, for the runtime.
pub(crate) struct Offloader {
    pub store: std::sync::Arc<dyn ArtifactStore>,
    pub threshold: usize,
    /// The large vars offloaded last, by run and name: a fingerprint of
    /// their JSON and their reference. A var whose fingerprint has not
    /// changed keeps its reference, so a run carrying a large var does not
    /// copy, SHA-256 and look it up again on every step.
    pub recent: parking_lot::Mutex<RecentVars>,
}

/// Large vars offloaded last: run id → var name → (fingerprint, reference).
pub(crate) type RecentVars =
    std::collections::HashMap<String, std::collections::HashMap<String, (u128, Value)>>;

/// The most runs [`Offloader::recent`] remembers vars of (it is emptied
/// when full: a var missing from it is only stored again). An entry is a
/// few dozen bytes, whatever the var's size.
const RECENT_RUNS: usize = 4096;

/// Vars that always stay inline.
const INLINE_VARS: [&str; 3] = ["_meta", "_limits", "_runtime"];

/// A fresh fingerprint hasher: SipHash-1-3 with 128 bits of output, under
/// a key drawn at random once per process, so no input can be made to
/// collide with another on purpose.
fn fingerprint_hasher() -> siphasher::sip128::SipHasher13 {
    static KEY: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();
    let (k0, k1) = *KEY.get_or_init(|| {
        // Two random UUIDs: their fixed version and variant bits do not
        // line up, so each half of the key is random throughout.
        let (a, b) = uuid::Uuid::new_v4().as_u64_pair();
        let (c, d) = uuid::Uuid::new_v4().as_u64_pair();
        (a ^ d, b ^ c)
    });
    siphasher::sip128::SipHasher13::new_with_keys(k0, k1)
}

/// The fingerprint of JSON bytes.
fn fingerprint_bytes(bytes: &[u8]) -> u128 {
    use siphasher::sip128::Hasher128;
    use std::hash::Hasher;
    let mut hasher = fingerprint_hasher();
    hasher.write(bytes);
    hasher.finish128().into()
}

/// [`fingerprint_bytes`] of `value`'s JSON, fed to the hasher as it is
/// written, without a copy.
fn fingerprint(value: &Value) -> u128 {
    use siphasher::sip128::Hasher128;
    use std::hash::Hasher;
    struct Feed(siphasher::sip128::SipHasher13);
    impl std::io::Write for Feed {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut feed = Feed(fingerprint_hasher());
    // Writing a `Value` into memory cannot fail.
    let _ = serde_json::to_writer(&mut feed, value);
    feed.0.finish128().into()
}

impl Offloader {
    /// `value` as a reference if its JSON is larger than the threshold. A
    /// value of the caller's that looks like a reference (or like an escaped
    /// one) is stored escaped, `{"$literal": value}`, so it is never
    /// resolved: only references the host wrote are.
    fn offload(&self, value: &Value, run_id: &str, now: &str) -> Result<Option<Value>, StoreError> {
        Ok(self.offload_printed(value, run_id, now)?.map(|(r, _)| r))
    }

    /// [`Offloader::offload`], with the fingerprint of what it stored as an
    /// artifact (`None` for an escaped value).
    fn offload_printed(
        &self,
        value: &Value,
        run_id: &str,
        now: &str,
    ) -> Result<Option<(Value, Option<u128>)>, StoreError> {
        if as_artifact_ref(value).is_some() || as_literal(value).is_some() {
            return Ok(Some((serde_json::json!({ "$literal": value }), None)));
        }
        let bytes = serde_json::to_vec(value).map_err(|e| StoreError::io(e.to_string()))?;
        if bytes.len() <= self.threshold {
            return Ok(None);
        }
        let meta = self
            .store
            .put(&bytes, "application/json", Some(run_id), now)?;
        Ok(Some((
            artifact_ref(&meta.artifact_id),
            Some(fingerprint_bytes(&bytes)),
        )))
    }

    /// `value` loaded back if it is a reference (or unescaped).
    fn load(&self, value: &mut Value) -> Result<(), StoreError> {
        if let Some(inner) = as_literal(value) {
            *value = inner.clone();
            return Ok(());
        }
        if let Some(id) = as_artifact_ref(value).map(str::to_string) {
            let bytes = self.store.get(&id)?.ok_or_else(|| {
                StoreError::corrupt(format!("artifact {id} is referenced but missing"))
            })?;
            *value = serde_json::from_slice(&bytes)
                .map_err(|e| StoreError::corrupt(format!("artifact {id}: {e}")))?;
        }
        Ok(())
    }

    /// The run as it is stored: large top-level vars offloaded.
    pub fn offload_run(
        &self,
        run: &crate::core::model::RunState,
        now: &str,
    ) -> Result<Option<crate::core::model::RunState>, StoreError> {
        let mut out: Option<crate::core::model::RunState> = None;
        for (k, v) in &run.vars {
            if INLINE_VARS.contains(&k.as_str()) {
                continue;
            }
            let remembered = self
                .recent
                .lock()
                .get(&run.run_id)
                .and_then(|vars| vars.get(k))
                .cloned();
            let known = remembered
                .filter(|(print, _)| *print == fingerprint(v))
                .map(|(_, r)| r);
            let r = match known {
                Some(r) => Some(r),
                None => {
                    // Only a value stored as an artifact is worth
                    // remembering (a small one is cheap to measure).
                    let (r, print) = match self.offload_printed(v, &run.run_id, now)? {
                        Some((r, print)) => (Some(r), print),
                        None => (None, None),
                    };
                    let mut recent = self.recent.lock();
                    match (&r, print) {
                        (Some(r), Some(print)) => {
                            if recent.len() >= RECENT_RUNS && !recent.contains_key(&run.run_id) {
                                recent.clear();
                            }
                            recent
                                .entry(run.run_id.clone())
                                .or_default()
                                .insert(k.clone(), (print, r.clone()));
                        }
                        _ => {
                            if let Some(vars) = recent.get_mut(&run.run_id) {
                                vars.remove(k);
                            }
                        }
                    }
                    r
                }
            };
            if let Some(r) = r {
                out.get_or_insert_with(|| run.clone())
                    .vars
                    .insert(k.clone(), r);
            }
        }
        if let Some(output) = &run.output {
            if let Some(r) = self.offload(output, &run.run_id, now)? {
                out.get_or_insert_with(|| run.clone()).output = Some(r);
            }
        }
        Ok(out)
    }

    /// A stored run with its references loaded back.
    pub fn load_run(&self, run: &mut crate::core::model::RunState) -> Result<(), StoreError> {
        for (k, v) in run.vars.iter_mut() {
            if !INLINE_VARS.contains(&k.as_str()) {
                self.load(v)?;
            }
        }
        if let Some(o) = run.output.as_mut() {
            self.load(o)?;
        }
        Ok(())
    }

    /// The records as they are stored: large results and payloads offloaded.
    pub fn offload_records(
        &self,
        records: &[crate::core::model::StepRecord],
        now: &str,
    ) -> Result<Option<Vec<crate::core::model::StepRecord>>, StoreError> {
        let mut out: Option<Vec<crate::core::model::StepRecord>> = None;
        for (i, r) in records.iter().enumerate() {
            if let Some(v) = &r.result {
                if let Some(rf) = self.offload(v, &r.run_id, now)? {
                    out.get_or_insert_with(|| records.to_vec())[i].result = Some(rf);
                }
            }
            if let Some(e) = &r.effect {
                if let Some(rf) = self.offload(&e.payload, &r.run_id, now)? {
                    if let Some(eff) = out.get_or_insert_with(|| records.to_vec())[i]
                        .effect
                        .as_mut()
                    {
                        eff.payload = rf;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Stored records with their references loaded back.
    pub fn load_records(
        &self,
        records: &mut [crate::core::model::StepRecord],
    ) -> Result<(), StoreError> {
        for r in records {
            if let Some(v) = r.result.as_mut() {
                self.load(v)?;
            }
            if let Some(e) = r.effect.as_mut() {
                self.load(&mut e.payload)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// An artifact store that counts what it is asked to keep.
    struct Counting {
        inner: MemoryArtifactStore,
        puts: AtomicUsize,
    }

    impl ArtifactStore for Counting {
        fn put(
            &self,
            content: &[u8],
            content_type: &str,
            run_id: Option<&str>,
            created_at: &str,
        ) -> Result<ArtifactMeta, StoreError> {
            self.puts.fetch_add(1, Ordering::SeqCst);
            self.inner.put(content, content_type, run_id, created_at)
        }
        fn get(&self, artifact_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
            self.inner.get(artifact_id)
        }
        fn meta(&self, artifact_id: &str) -> Result<Option<ArtifactMeta>, StoreError> {
            self.inner.meta(artifact_id)
        }
    }

    /// A large var that did not change since the last commit keeps its
    /// reference without being encoded and stored again; a changed one is
    /// stored anew; the stored run loads back to the run.
    #[test]
    fn an_unchanged_large_var_is_not_stored_again() {
        let store = Arc::new(Counting {
            inner: MemoryArtifactStore::new(),
            puts: AtomicUsize::new(0),
        });
        let offloader = Offloader {
            store: store.clone(),
            threshold: 64,
            recent: Default::default(),
        };
        let mut run: crate::core::model::RunState = serde_json::from_value(serde_json::json!({
            "run_id": "r", "workflow_id": "w", "status": "running",
            "vars": {"big": "x".repeat(1000), "small": 1},
            "created_at": "2026-11-30T09:00:00Z", "updated_at": "2026-11-30T09:00:00Z",
        }))
        .unwrap();
        let now = "2026-11-30T09:00:00Z";
        let first = offloader.offload_run(&run, now).unwrap().unwrap();
        assert_eq!(store.puts.load(Ordering::SeqCst), 1);
        run.vars.insert("small".into(), serde_json::json!(2));
        let second = offloader.offload_run(&run, now).unwrap().unwrap();
        assert_eq!(
            store.puts.load(Ordering::SeqCst),
            1,
            "unchanged: not stored again"
        );
        assert_eq!(first.vars["big"], second.vars["big"]);
        run.vars
            .insert("big".into(), serde_json::json!("y".repeat(1000)));
        let mut third = offloader.offload_run(&run, now).unwrap().unwrap();
        assert_eq!(store.puts.load(Ordering::SeqCst), 2, "changed: stored");
        assert_ne!(third.vars["big"], second.vars["big"]);
        offloader.load_run(&mut third).unwrap();
        assert_eq!(third.vars, run.vars);
    }
}

//! Large vars offloaded to the artifact store and loaded back: a run keeps
//! a reference (`{"$artifact": id}`) where a var over the threshold was.

use serde_json::Value;

use crate::store::artifacts::{artifact_ref, as_artifact_ref, ArtifactStore};
use crate::store::StoreError;

/// The escaped value, if `v` is exactly `{"$literal": value}`.
fn as_literal(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(m) if m.len() == 1 => m.get("$literal"),
        _ => None,
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
        run: &stepwell_model::model::RunState,
        now: &str,
    ) -> Result<Option<stepwell_model::model::RunState>, StoreError> {
        let mut out: Option<stepwell_model::model::RunState> = None;
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
    pub fn load_run(&self, run: &mut stepwell_model::model::RunState) -> Result<(), StoreError> {
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

    /// The records as they are stored: large results, vars patches,
    /// inputs and payloads offloaded.
    pub fn offload_records(
        &self,
        records: &[stepwell_model::model::StepRecord],
        now: &str,
    ) -> Result<Option<Vec<stepwell_model::model::StepRecord>>, StoreError> {
        let mut out: Option<Vec<stepwell_model::model::StepRecord>> = None;
        for (i, r) in records.iter().enumerate() {
            if let Some(v) = &r.result {
                if let Some(rf) = self.offload(v, &r.run_id, now)? {
                    out.get_or_insert_with(|| records.to_vec())[i].result = Some(rf);
                }
            }
            if let Some(v) = &r.vars {
                if let Some(rf) = self.offload(v, &r.run_id, now)? {
                    out.get_or_insert_with(|| records.to_vec())[i].vars = Some(rf);
                }
            }
            if let Some(v) = &r.input {
                if let Some(rf) = self.offload(v, &r.run_id, now)? {
                    out.get_or_insert_with(|| records.to_vec())[i].input = Some(rf);
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
        records: &mut [stepwell_model::model::StepRecord],
    ) -> Result<(), StoreError> {
        for r in records {
            if let Some(v) = r.result.as_mut() {
                self.load(v)?;
            }
            if let Some(v) = r.vars.as_mut() {
                self.load(v)?;
            }
            if let Some(v) = r.input.as_mut() {
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
    use crate::store::artifacts::{ArtifactMeta, MemoryArtifactStore};
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
        let mut run: stepwell_model::model::RunState = serde_json::from_value(serde_json::json!({
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

//! A run's history as one portable, self-verifying file: its state, its
//! whole ledger with the hash chain, the artifacts its state and ledger
//! name, and the files of its workflow version (so it can run elsewhere),
//! with its children if asked. `stepwell export` writes it; `stepwell
//! import` reads it into any store after checking everything (every
//! file's SHA-256 against the manifest, every ledger's chain, every
//! bundle's digest, every artifact's id, every run's id and links) and
//! writes nothing if anything does not match, naming what (a store that
//! fails midway can leave part of it written).
//!
//! The file is a zip of stored entries (as a packed bundle, see
//! [`crate::flow::pack`]): `manifest.json`, `runs/<id>/state.json`,
//! `runs/<id>/ledger.jsonl`, `bundles/<digest>/<path>`, `artifacts/<id>`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::{Error, Result};
use super::runtime::Runtime;
use crate::flow::archive::{BundleFile, BundleFiles};
use crate::flow::pack::{read_zip, ManifestFile, ZipWriter};
use crate::store::{Fence, LeaseAfter, RunQuery};
use stepwell_model::model::{RunState, StepRecord};

/// The manifest's `format`.
pub const EXPORT_FORMAT: &str = "stepwell-run-export";

/// The most runs one export holds (each is two entries of the archive).
pub const MAX_EXPORTED_RUNS: usize = 2_000;

/// What `manifest.json` of an export says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportManifest {
    /// Always [`EXPORT_FORMAT`].
    pub format: String,
    /// The format's version: 1.
    pub format_version: u32,
    /// When it was written (RFC 3339).
    pub exported_at: String,
    /// The run exported (its children follow it in `runs`).
    pub root_run_id: String,
    /// Each run: parents before their children.
    pub runs: Vec<ExportedRun>,
    /// Each artifact's id and media type.
    pub artifacts: Vec<ExportedArtifact>,
    /// Every other entry of the archive: path, size, SHA-256.
    pub files: Vec<ManifestFile>,
}

/// One run of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedRun {
    /// Its id.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// The digest of its workflow version's files, if it is pinned.
    pub digest: Option<String>,
    /// How many ledger records.
    pub records: usize,
    /// The hash of its last record.
    pub head_hash: Option<String>,
}

/// One artifact of an export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedArtifact {
    /// Its id (the SHA-256 of its content).
    pub artifact_id: String,
    /// Its media type.
    pub content_type: String,
}

impl Runtime {
    /// The export of `run_id` (and, with `with_children`, of its children
    /// and theirs): a zip as the module describes. A run whose ledger does
    /// not verify is refused.
    pub fn export_run(&self, run_id: &str, with_children: bool) -> Result<Vec<u8>> {
        let mut ids = vec![run_id.to_string()];
        let mut seen: BTreeSet<String> = ids.iter().cloned().collect();
        let mut i = 0;
        while with_children && i < ids.len() {
            let children = self.store().list_runs(&RunQuery {
                parent_run_id: Some(ids[i].clone()),
                ..RunQuery::default()
            })?;
            // A run met again (parents that name each other) once only.
            for c in children {
                if seen.insert(c.run_id.clone()) {
                    ids.push(c.run_id);
                }
            }
            if ids.len() > MAX_EXPORTED_RUNS {
                return Err(Error::invalid(
                    "run_id",
                    format!("run {run_id} has over {MAX_EXPORTED_RUNS} runs below it: export them apart"),
                ));
            }
            i += 1;
        }
        let mut zip = Entries::default();
        let mut runs = Vec::new();
        let mut digests = BTreeSet::new();
        let mut artifacts = BTreeSet::new();
        for id in &ids {
            let run = self
                .store()
                .load_run(id)?
                .ok_or_else(|| Error::RunNotFound { run_id: id.clone() })?;
            let records = self.store().list_records(id)?;
            let head = crate::store::verify_chain(&records).map_err(|b| {
                Error::invalid(
                    "run_id",
                    format!(
                        "run {id}: its ledger does not verify (record {} {}): not exported",
                        b.index, b.problem
                    ),
                )
            })?;
            let digest = match run.workflow_version {
                Some(v) => self
                    .store()
                    .workflow_version(&run.workflow_id, Some(v))?
                    .map(|row| row.digest),
                None => None,
            };
            digests.extend(digest.clone());
            collect_refs(
                &serde_json::to_value(&run).unwrap_or_default(),
                &mut artifacts,
            );
            let mut ledger = Vec::new();
            for r in &records {
                collect_refs(&serde_json::to_value(r).unwrap_or_default(), &mut artifacts);
                ledger.extend(serde_json::to_vec(r).unwrap_or_default());
                ledger.push(b'\n');
            }
            zip.add(
                &format!("runs/{id}/state.json"),
                &serde_json::to_vec(&run).unwrap_or_default(),
            );
            zip.add(&format!("runs/{id}/ledger.jsonl"), &ledger);
            runs.push(ExportedRun {
                run_id: id.clone(),
                workflow_id: run.workflow_id.clone(),
                digest,
                records: records.len(),
                head_hash: head,
            });
        }
        for digest in &digests {
            for f in self.store().bundle_files(digest)? {
                zip.add(&format!("bundles/{digest}/{}", f.path), &f.bytes);
            }
        }
        let mut exported = Vec::new();
        let store = match self.artifact_store() {
            Some(store) => Some(store),
            None if artifacts.is_empty() => None,
            None => {
                return Err(Error::invalid(
                    "run_id",
                    "the runs name artifacts, and this runtime has no artifact store",
                ))
            }
        };
        if let Some(store) = store {
            // A JSON artifact may name others (an evidence record names a
            // command's output): they go too.
            let mut queue: std::collections::VecDeque<String> = artifacts.iter().cloned().collect();
            while let Some(id) = queue.pop_front() {
                let (Some(bytes), Some(meta)) = (store.get(&id)?, store.meta(&id)?) else {
                    return Err(Error::invalid(
                        "run_id",
                        format!("artifact {id}, which the runs name, is missing from the artifact store: not exported"),
                    ));
                };
                for n in refs_inside(&meta.content_type, &bytes) {
                    if artifacts.insert(n.clone()) {
                        queue.push_back(n);
                    }
                }
                zip.add(&format!("artifacts/{id}"), &bytes);
                exported.push(ExportedArtifact {
                    artifact_id: id.clone(),
                    content_type: meta.content_type,
                });
            }
        }
        let manifest = ExportManifest {
            format: EXPORT_FORMAT.into(),
            format_version: 1,
            exported_at: super::clock::format_time(self.now()),
            root_run_id: run_id.to_string(),
            runs,
            artifacts: exported,
            files: zip.listed.clone(),
        };
        let bytes = zip.finish(&manifest);
        if bytes.len() as u64 > crate::flow::pack::MAX_ARCHIVE_BYTES {
            return Err(Error::invalid(
                "run_id",
                format!(
                    "the export would be {} bytes, over the {} an archive may have",
                    bytes.len(),
                    crate::flow::pack::MAX_ARCHIVE_BYTES
                ),
            ));
        }
        Ok(bytes)
    }

    /// Imports an export ([`Runtime::export_run`]) into this runtime's
    /// store: everything is checked first, then the workflow versions are
    /// deployed (a version already latest with the same files is reused),
    /// the artifacts stored, and each run created with its ledger (its
    /// chain the same, record for record). A run id the store has already
    /// is refused before anything is written. Returns the runs' ids.
    pub fn import_runs(&self, archive: &[u8]) -> Result<Vec<String>> {
        let checked = check_export(archive).map_err(|why| Error::invalid("archive", why))?;
        // Everything that can be refused is, before anything is written:
        // ids, runs the store has, links, bundles that do not load here.
        let ids: BTreeSet<&str> = checked
            .runs
            .iter()
            .map(|(r, _)| r.run_id.as_str())
            .collect();
        for (run, _) in &checked.runs {
            self.importable(run, &ids)?;
        }
        // Only the bundles of the runs, each loaded (and its ids checked)
        // before any is deployed.
        let mut wanted: BTreeMap<&str, &BundleFiles> = BTreeMap::new();
        for r in &checked.manifest.runs {
            if let Some(d) = &r.digest {
                let files = &checked.bundles[d];
                let bundle = self.compile(files)?;
                if !bundle
                    .workflows
                    .iter()
                    .any(|w| w.workflow_id == r.workflow_id)
                {
                    return Err(Error::invalid(
                        "archive",
                        format!(
                            "run {}: its bundle does not define workflow {:?}",
                            r.run_id, r.workflow_id
                        ),
                    ));
                }
                for w in &bundle.workflows {
                    if let Some(why) = self.plugins_reserved(&w.workflow_id) {
                        return Err(Error::invalid("archive", why));
                    }
                }
                wanted.insert(d, files);
            }
        }
        if !checked.artifacts.is_empty() && self.artifact_store().is_none() {
            return Err(Error::invalid(
                "archive",
                "it holds artifacts, and this runtime has no artifact store",
            ));
        }
        // A version with the exported files is used where the store has one;
        // else they are deployed (and are then the latest).
        let mut versions: BTreeMap<(String, String), u32> = BTreeMap::new();
        for (digest, files) in wanted {
            for r in checked
                .manifest
                .runs
                .iter()
                .filter(|r| r.digest.as_deref() == Some(digest))
            {
                let found = self
                    .store()
                    .workflow_versions(Some(&r.workflow_id))?
                    .into_iter()
                    .filter(|v| v.digest == digest)
                    .max_by_key(|v| v.version);
                if let Some(v) = found {
                    versions.insert((r.workflow_id.clone(), digest.to_string()), v.version);
                }
            }
            let missing = checked.manifest.runs.iter().any(|r| {
                r.digest.as_deref() == Some(digest)
                    && !versions.contains_key(&(r.workflow_id.clone(), digest.to_string()))
            });
            if missing {
                for d in self.deploy_files(files, Some("import"), "import")? {
                    versions.insert(
                        (d.version.workflow_id, files.digest.clone()),
                        d.version.version,
                    );
                }
            }
        }
        if let Some(store) = self.artifact_store() {
            let now = super::clock::format_time(self.now());
            for (a, bytes) in &checked.artifacts {
                store.put(bytes, &a.content_type, None, &now)?;
            }
        }
        let mut out = Vec::new();
        for (mut run, records) in checked.runs {
            let digest = checked
                .manifest
                .runs
                .iter()
                .find(|r| r.run_id == run.run_id)
                .and_then(|r| r.digest.clone());
            // The version here with the exported version's files.
            run.workflow_version =
                digest.and_then(|d| versions.get(&(run.workflow_id.clone(), d)).copied());
            run.version = 1;
            let plain: Vec<StepRecord> = records
                .iter()
                .map(|r| StepRecord {
                    prev_hash: None,
                    record_hash: None,
                    ..r.clone()
                })
                .collect();
            self.store()
                .commit(&plain, &run, Fence::unleased(0), LeaseAfter::Release)?;
            let stored = self.store().list_records(&run.run_id)?;
            let same = stored.len() == records.len()
                && stored
                    .iter()
                    .zip(&records)
                    .all(|(a, b)| a.record_hash == b.record_hash);
            if !same {
                return Err(Error::invalid(
                    "archive",
                    format!(
                        "run {}: its ledger stored here does not hash as exported",
                        run.run_id
                    ),
                ));
            }
            out.push(run.run_id);
        }
        Ok(out)
    }
}

impl Runtime {
    /// Refuses `run` unless it can be created here as it is: a valid id,
    /// none in the store, not of a workflow a plugin reserved (automations
    /// are not imported: a copy would fire beside the original), a parent
    /// in the archive (`ids`) or the store, and a child it waits on too.
    fn importable(&self, run: &RunState, ids: &BTreeSet<&str>) -> Result<()> {
        let refuse = |why: String| {
            Err(Error::invalid(
                "archive",
                format!("run {:?}: {why}", run.run_id),
            ))
        };
        if !super::runtime::valid_run_id(&run.run_id) {
            return refuse("not a valid run id".into());
        }
        if self.store().load_run(&run.run_id)?.is_some() {
            return Err(Error::Conflict {
                run_id: run.run_id.clone(),
                reason: "a run with this id exists in this store: not imported".into(),
            });
        }
        let waiting = run.status == stepwell_model::model::RunStatus::Waiting;
        if waiting != run.waiting.is_some() {
            return refuse(format!(
                "its state is {} and {} a wait",
                run.status.as_str(),
                if run.waiting.is_some() {
                    "carries"
                } else {
                    "lacks"
                }
            ));
        }
        if self.plugins_reserved(&run.workflow_id).is_some() {
            return refuse(format!(
                "workflow {:?} is a plugin's own: not imported",
                run.workflow_id
            ));
        }
        let present = |id: &str| -> Result<bool> {
            Ok(ids.contains(id) || self.store().load_run(id)?.is_some())
        };
        if let Some(parent) = &run.parent_run_id {
            if parent == &run.run_id || !present(parent)? {
                return refuse(format!(
                    "its parent {parent} is neither in the archive nor in this store"
                ));
            }
        }
        let child = run
            .waiting
            .as_ref()
            .filter(|_| run.status == stepwell_model::model::RunStatus::Waiting)
            .and_then(|w| w.wait_key.strip_prefix("subworkflow:"));
        if let Some(child) = child {
            if !present(child)? {
                return refuse(format!("it waits on child {child}, which is not in the archive: export it --with-children"));
            }
        }
        Ok(())
    }
}

/// An export, checked.
struct Checked {
    manifest: ExportManifest,
    runs: Vec<(RunState, Vec<StepRecord>)>,
    bundles: BTreeMap<String, BundleFiles>,
    artifacts: Vec<(ExportedArtifact, Vec<u8>)>,
}

/// Reads and checks an export: every entry listed with its size and
/// SHA-256, every ledger's chain and head, every bundle's digest, every
/// artifact's id. Says what does not match.
fn check_export(archive: &[u8]) -> std::result::Result<Checked, String> {
    let entries = read_zip(archive)?;
    let mut manifest: Option<ExportManifest> = None;
    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    for (name, data) in entries {
        if name == "manifest.json" {
            manifest =
                Some(serde_json::from_slice(data).map_err(|e| format!("manifest.json: {e}"))?);
        } else {
            files.insert(name, data);
        }
    }
    let manifest = manifest.ok_or("no manifest.json")?;
    if manifest.format != EXPORT_FORMAT || manifest.format_version != 1 {
        return Err(format!(
            "manifest.json: format {:?} version {} (this build reads {EXPORT_FORMAT:?} version 1)",
            manifest.format, manifest.format_version
        ));
    }
    if manifest.files.len() != files.len() {
        return Err("the archive's entries are not those manifest.json lists".into());
    }
    for f in &manifest.files {
        let data = files
            .get(&f.path)
            .ok_or_else(|| format!("{}: listed in manifest.json, not in the archive", f.path))?;
        let sha = hex::encode(Sha256::digest(data));
        if data.len() as u64 != f.size || sha != f.sha256 {
            return Err(format!(
                "{}: changed (it is {} bytes with SHA-256 {sha}; manifest.json says {} bytes with {})",
                f.path,
                data.len(),
                f.size,
                f.sha256
            ));
        }
    }
    let mut runs = Vec::new();
    for r in &manifest.runs {
        let state = files
            .get(&format!("runs/{}/state.json", r.run_id))
            .ok_or_else(|| format!("run {}: no state", r.run_id))?;
        let run: RunState =
            serde_json::from_slice(state).map_err(|e| format!("run {}: state: {e}", r.run_id))?;
        if run.run_id != r.run_id || run.workflow_id != r.workflow_id {
            return Err(format!(
                "run {}: its state is of run {} of workflow {:?}",
                r.run_id, run.run_id, run.workflow_id
            ));
        }
        if runs
            .iter()
            .any(|(x, _): &(RunState, _)| x.run_id == r.run_id)
        {
            return Err(format!("run {}: listed twice", r.run_id));
        }
        let ledger = files
            .get(&format!("runs/{}/ledger.jsonl", r.run_id))
            .ok_or_else(|| format!("run {}: no ledger", r.run_id))?;
        let records: Vec<StepRecord> = ledger
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_slice(l)
                    .map_err(|e| format!("run {}: ledger record {}: {e}", r.run_id, i + 1))
            })
            .collect::<std::result::Result<_, _>>()?;
        let head = crate::store::verify_chain(&records).map_err(|b| {
            format!(
                "run {}: ledger record {} ({}) {}",
                r.run_id, b.index, b.step_id, b.problem
            )
        })?;
        if head != r.head_hash || records.len() != r.records {
            return Err(format!(
                "run {}: its ledger is not the one manifest.json names",
                r.run_id
            ));
        }
        if records.iter().any(|x| x.run_id != r.run_id) {
            return Err(format!(
                "run {}: its ledger holds another run's record",
                r.run_id
            ));
        }
        runs.push((run, records));
    }
    let mut bundles: BTreeMap<String, Vec<BundleFile>> = BTreeMap::new();
    for (name, data) in &files {
        if let Some(rest) = name.strip_prefix("bundles/") {
            let (digest, path) = rest
                .split_once('/')
                .ok_or_else(|| format!("{name}: not a bundle file"))?;
            bundles
                .entry(digest.to_string())
                .or_default()
                .push(BundleFile {
                    path: path.to_string(),
                    bytes: data.to_vec(),
                });
        }
    }
    let mut checked_bundles = BTreeMap::new();
    for (digest, kept) in bundles {
        let b = BundleFiles::new(kept).map_err(|e| format!("bundles/{digest}: {e}"))?;
        if b.digest != digest {
            return Err(format!(
                "bundles/{digest}: its files' digest is {}",
                b.digest
            ));
        }
        checked_bundles.insert(digest, b);
    }
    for r in &manifest.runs {
        if let Some(d) = &r.digest {
            if !checked_bundles.contains_key(d) {
                return Err(format!(
                    "run {}: the files of its version ({d}) are missing",
                    r.run_id
                ));
            }
        }
    }
    let mut artifacts = Vec::new();
    for a in &manifest.artifacts {
        let data = files
            .get(&format!("artifacts/{}", a.artifact_id))
            .ok_or_else(|| format!("artifact {}: missing", a.artifact_id))?;
        if crate::store::artifacts::artifact_id(data) != a.artifact_id {
            return Err(format!(
                "artifact {}: its content does not match its id",
                a.artifact_id
            ));
        }
        artifacts.push((a.clone(), data.to_vec()));
    }
    Ok(Checked {
        manifest,
        runs,
        bundles: checked_bundles,
        artifacts,
    })
}

/// The artifact ids a JSON artifact's content references (none for any
/// other content type): an evidence record names a command's output.
pub(crate) fn refs_inside(content_type: &str, bytes: &[u8]) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    if content_type.starts_with("application/json") {
        if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
            collect_refs(&v, &mut named);
        }
    }
    named
}

/// The artifact ids `value` references (`{"$artifact": id}`), anywhere.
pub(crate) fn collect_refs(value: &Value, out: &mut BTreeSet<String>) {
    if let Some(id) = crate::store::artifacts::as_artifact_ref(value) {
        out.insert(id.to_string());
        return;
    }
    match value {
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        Value::Object(m) => m.values().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// An export's entries as they are added, with their manifest lines.
#[derive(Default)]
struct Entries {
    zip: ZipWriter,
    listed: Vec<ManifestFile>,
}

impl Entries {
    fn add(&mut self, path: &str, data: &[u8]) {
        self.zip.add(path, data);
        self.listed.push(ManifestFile {
            path: path.to_string(),
            size: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
        });
    }

    /// The archive, its manifest last.
    fn finish(mut self, manifest: &ExportManifest) -> Vec<u8> {
        let text = serde_json::to_vec_pretty(manifest).unwrap_or_default();
        self.zip.add("manifest.json", &text);
        self.zip.finish()
    }
}

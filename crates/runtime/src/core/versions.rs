//! Deployments and versions: a bundle is deployed as a content-addressed
//! version kept in the store, a run is pinned to the version it started
//! on, and moving a run to another version is an explicit, checked,
//! recorded upgrade.
//!
//! Every host loads a version's code from the files the store keeps (never
//! from the directory it was deployed from), compiled once per digest.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use serde_json::json;

use super::error::{Error, Result};
use super::runtime::Runtime;
use crate::flow::{self, archive::BundleFiles, Bundle, Workflow};
use crate::store::{Deployed, Deployment as StoreDeployment, WorkflowVersion};
use stepwell_model::model::{RunState, RunStatus};

/// A loaded version: its digest and its workflow.
type Pinned = (String, Arc<Workflow>);

/// Compiled bundles by digest, and their digests in the order loaded.
type Bundles = (HashMap<String, Arc<Bundle>>, VecDeque<String>);

/// How many compiled bundles a runtime keeps at most; past it the one
/// loaded first is let go (and loaded again from the store if needed).
const MAX_LOADED_BUNDLES: usize = 64;

/// The versions this runtime has loaded: each digest's bundle compiled
/// once (at most [`MAX_LOADED_BUNDLES`], the oldest let go first), and the
/// workflows of each `(workflow id, version)` of those bundles.
#[derive(Default)]
pub(crate) struct Loaded {
    bundles: RwLock<Bundles>,
    pinned: RwLock<HashMap<(String, u32), Pinned>>,
}

impl Loaded {
    /// The compiled bundle of `digest`, if kept.
    fn bundle(&self, digest: &str) -> Option<Arc<Bundle>> {
        self.bundles.read().0.get(digest).cloned()
    }

    /// Keeps `bundle` as `digest`'s, letting the oldest go past the bound.
    fn keep(&self, digest: &str, bundle: &Arc<Bundle>) {
        let mut kept = self.bundles.write();
        let (map, order) = &mut *kept;
        if map.insert(digest.to_string(), bundle.clone()).is_none() {
            order.push_back(digest.to_string());
        }
        while order.len() > MAX_LOADED_BUNDLES {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
                self.pinned.write().retain(|_, (d, _)| *d != old);
            }
        }
    }
}

/// What [`Runtime::deploy`] recorded.
#[derive(Debug)]
pub struct Deployment {
    /// The bundle as loaded from its directory.
    pub bundle: Bundle,
    /// The digest of its files.
    pub digest: String,
    /// For each workflow id the bundle defines (the main one first), the
    /// version it now has and whether it was unchanged.
    pub workflows: Vec<Deployed>,
}

/// What [`Runtime::deploy_archive`] recorded, and what loading noticed.
#[derive(Debug)]
pub struct ArchiveDeployment {
    /// For each workflow id the bundle defines (the main one first), the
    /// version it now has and whether it was unchanged.
    pub workflows: Vec<Deployed>,
    /// What loading the bundle noticed that does not stop it (see
    /// [`flow::Bundle::warnings`]).
    pub warnings: Vec<String>,
}

impl Deployment {
    /// Whether nothing new was recorded (every id's latest version already
    /// had this content).
    pub fn unchanged(&self) -> bool {
        self.workflows.iter().all(|d| d.unchanged)
    }
}

/// The version [`Runtime::upgrade`] moves a run to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpgradeTo {
    /// The workflow's latest deployed version.
    Latest,
    /// This version.
    Version(u32),
}

/// What an upgrade did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Upgrade {
    /// The run.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// The version it was on (`None`: unpinned).
    pub from: Option<u32>,
    /// The version it is (or would be) on.
    pub to: u32,
    /// Whether the run was moved (false for a dry run, or when it was on
    /// that version already).
    pub moved: bool,
}

/// A deployed workflow: its latest version and how many it has.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WorkflowSummary {
    /// The workflow id.
    pub workflow_id: String,
    /// Its latest version.
    pub latest: WorkflowVersion,
    /// How many versions the store keeps.
    pub versions: usize,
}

/// One version of a workflow and its runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionRuns {
    /// The version.
    pub version: WorkflowVersion,
    /// Its runs by status (`waiting: 2`, ...).
    pub runs: BTreeMap<String, u64>,
}

/// Every version of a workflow with its runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionReport {
    /// The workflow id.
    pub workflow_id: String,
    /// Its versions, oldest first.
    pub versions: Vec<VersionRuns>,
    /// Its runs that name no version (started before versions were
    /// recorded), by status.
    pub unpinned_runs: BTreeMap<String, u64>,
}

/// How long an upgrade waits for a run another thread or host executes.
const UPGRADE_WAIT: Duration = Duration::from_secs(5);

impl Runtime {
    /// Deploys the bundle at `dir`: validates every flow file, compiles
    /// its components, and records its files (once per digest) and a new
    /// version of each workflow id it defines, unless that id's latest
    /// version has the same content (then nothing changes). Nothing is
    /// recorded if any file is invalid. `by` names who deploys.
    pub fn deploy(&self, dir: &Path, by: Option<&str>) -> Result<Deployment> {
        let kinds = self.effects().kinds();
        let bundle = flow::load_bundle(dir, self.engine(), &kinds)?;
        let files = flow::archive::collect(&bundle)?;
        let source = bundle.dir.to_string_lossy().into_owned();
        let workflows = self.deploy_files(&files, by, &source)?;
        Ok(Deployment {
            bundle,
            digest: files.digest,
            workflows,
        })
    }

    /// Deploys the packed bundle `archive` (a `.flow` file's bytes, see
    /// [`flow::pack`]); `source` says where it came from. The bundle is
    /// loaded from the archive's files, checked against their digest.
    pub fn deploy_archive(
        &self,
        archive: &[u8],
        by: Option<&str>,
        source: &str,
    ) -> Result<ArchiveDeployment> {
        let refused = |why: String| {
            Error::Flow(flow::FlowError {
                path: PathBuf::from(source),
                field: String::new(),
                message: why,
            })
        };
        let (manifest, files) = flow::pack::unpack(archive).map_err(refused)?;
        let bundle = self.compile(&files)?;
        let ids: Vec<&str> = bundle
            .workflows
            .iter()
            .map(|w| w.workflow_id.as_str())
            .collect();
        if manifest.workflows != ids {
            return Err(refused(format!(
                "manifest.json names the workflows {:?}, the bundle defines {ids:?}",
                manifest.workflows
            )));
        }
        let warnings = bundle.warnings();
        Ok(ArchiveDeployment {
            workflows: self.deploy_files(&files, by, source)?,
            warnings,
        })
    }

    /// Records `files` as a deployment: loaded (validated and compiled)
    /// from memory first, so what is stored is what was validated.
    pub(crate) fn deploy_files(
        &self,
        files: &BundleFiles,
        by: Option<&str>,
        source: &str,
    ) -> Result<Vec<Deployed>> {
        let kept = self.compile(files)?;
        for wf in &kept.workflows {
            if let Some(reserved) = self.plugins_reserved(&wf.workflow_id) {
                return Err(Error::Flow(flow::FlowError {
                    path: wf.source.clone(),
                    field: "workflow_id".into(),
                    message: reserved,
                }));
            }
        }
        let ids: Vec<String> = kept
            .workflows
            .iter()
            .map(|w| w.workflow_id.clone())
            .collect();
        let workflows = self.store().deploy(&StoreDeployment {
            workflow_ids: &ids,
            files,
            deployed_by: by,
            source: Some(source),
            deployed_at: &super::clock::format_time(self.now()),
        })?;
        self.inner.loaded.keep(&files.digest, &kept);
        for d in &workflows {
            self.pin(&d.version, &kept);
        }
        Ok(workflows)
    }

    /// The packed bundle (`.flow`, [`flow::pack`]) of the bundle at `dir`,
    /// validated and compiled first.
    pub fn pack_bundle(&self, dir: &Path) -> Result<Vec<u8>> {
        let kinds = self.effects().kinds();
        let bundle = flow::load_bundle(dir, self.engine(), &kinds)?;
        let files = flow::archive::collect(&bundle)?;
        let kept = self.compile(&files)?;
        let ids: Vec<String> = kept
            .workflows
            .iter()
            .map(|w| w.workflow_id.clone())
            .collect();
        Ok(flow::pack::pack(&files, &ids))
    }

    /// Deploys the bundle at `dir` ([`Runtime::deploy`]) and returns it as
    /// loaded from there.
    pub fn load_bundle(&self, dir: &Path) -> Result<Bundle> {
        Ok(self.deploy(dir, None)?.bundle)
    }

    /// The bundle of `files`: the one kept for their digest, else loaded
    /// (validated, compiled) from them, not kept yet.
    pub(crate) fn compile(&self, files: &BundleFiles) -> Result<Arc<Bundle>> {
        if let Some(b) = self.inner.loaded.bundle(&files.digest) {
            return Ok(b);
        }
        let label = PathBuf::from(format!("bundle:{}", &files.digest[..12]));
        let kinds = self.effects().kinds();
        Ok(Arc::new(flow::load_bundle_files(
            files,
            &label,
            self.engine(),
            &kinds,
        )?))
    }

    /// Remembers that `version` is its workflow in `bundle`.
    fn pin(&self, version: &WorkflowVersion, bundle: &Bundle) -> Option<Arc<Workflow>> {
        let wf = bundle
            .workflows
            .iter()
            .find(|w| w.workflow_id == version.workflow_id)?
            .clone();
        self.inner.loaded.pinned.write().insert(
            (version.workflow_id.clone(), version.version),
            (version.digest.clone(), wf.clone()),
        );
        Some(wf)
    }

    /// Version `version` of `workflow_id`, loaded from the files the store
    /// keeps for it (once per digest).
    pub fn workflow_version(&self, workflow_id: &str, version: u32) -> Result<Arc<Workflow>> {
        let key = (workflow_id.to_string(), version);
        if let Some((_, wf)) = self.inner.loaded.pinned.read().get(&key) {
            return Ok(wf.clone());
        }
        self.load_version(&self.version_row(workflow_id, version)?)
    }

    /// Version `version` of `workflow_id` as the store has it now (not as
    /// this runtime remembers it: it may have been removed since).
    fn version_row(&self, workflow_id: &str, version: u32) -> Result<WorkflowVersion> {
        self.store()
            .workflow_version(workflow_id, Some(version))?
            .ok_or_else(|| Error::UnknownVersion {
                workflow_id: workflow_id.to_string(),
                version,
            })
    }

    /// Loads `row` from the files the store keeps for its digest.
    fn load_version(&self, row: &WorkflowVersion) -> Result<Arc<Workflow>> {
        let key = (row.workflow_id.clone(), row.version);
        if let Some((_, wf)) = self.inner.loaded.pinned.read().get(&key) {
            return Ok(wf.clone());
        }
        let known = self.inner.loaded.bundle(&row.digest);
        let bundle = match known {
            Some(b) => b,
            None => {
                // Damaged files are the bundle's fault, not its runs':
                // reported as an invalid definition (the driver backs off),
                // never quarantined.
                let damaged = |why: String| {
                    Error::Flow(flow::FlowError {
                        path: PathBuf::from(format!("bundle_files/{}", row.digest)),
                        field: String::new(),
                        message: format!(
                            "the files the store keeps for version {} of workflow {:?} {why}",
                            row.version, row.workflow_id
                        ),
                    })
                };
                let kept = self.store().bundle_files(&row.digest)?;
                if kept.is_empty() {
                    return Err(damaged("are missing".into()));
                }
                let files =
                    BundleFiles::new(kept).map_err(|e| damaged(format!("cannot be used: {e}")))?;
                if !files.matches(&row.digest) {
                    return Err(damaged(format!(
                        "do not match their digest (they are {})",
                        files.digest
                    )));
                }
                let bundle = self.compile(&files)?;
                self.inner.loaded.keep(&row.digest, &bundle);
                bundle
            }
        };
        self.pin(row, &bundle).ok_or_else(|| {
            Error::Flow(flow::FlowError {
                path: bundle.dir.clone(),
                field: "workflow_id".into(),
                message: format!(
                    "the bundle of version {} of workflow {:?} does not define it",
                    row.version, row.workflow_id
                ),
            })
        })
    }

    /// The latest version of `workflow_id` and its number: a plugin's own
    /// (a reserved id, unversioned), one registered in code (unversioned),
    /// else the latest deployed version. A workflow an older stepwell
    /// recorded only by its directory is deployed from there first.
    pub(crate) fn latest_workflow(
        &self,
        workflow_id: &str,
    ) -> Result<(Arc<Workflow>, Option<u32>)> {
        if let Some(wf) = self.unversioned_workflow(workflow_id)? {
            return Ok((wf, None));
        }
        if let Some(row) = self.store().workflow_version(workflow_id, None)? {
            return Ok((self.load_version(&row)?, Some(row.version)));
        }
        if let Some(dir) = self.store().bundle_dir(workflow_id)? {
            if dir.is_dir() {
                self.deploy(&dir, Some("migrated"))?;
                if let Some(row) = self.store().workflow_version(workflow_id, None)? {
                    return Ok((self.load_version(&row)?, Some(row.version)));
                }
            }
        }
        Err(Error::UnknownWorkflow {
            workflow_id: workflow_id.to_string(),
        })
    }

    /// The workflow `workflow_id` at its latest version (see
    /// [`Runtime::latest_workflow`]).
    pub fn workflow(&self, workflow_id: &str) -> Result<Arc<Workflow>> {
        Ok(self.latest_workflow(workflow_id)?.0)
    }

    /// The code `run` executes: the version it is pinned to (the latest
    /// for an unpinned run).
    pub fn workflow_of(&self, run: &RunState) -> Result<Arc<Workflow>> {
        match run.workflow_version {
            Some(v) if self.unversioned_workflow(&run.workflow_id)?.is_none() => {
                self.workflow_version(&run.workflow_id, v)
            }
            _ => self.workflow(&run.workflow_id),
        }
    }

    /// The version a new run of `workflow_id` starts on: `version` if
    /// given; else, for a child of a parent pinned to a bundle that
    /// defines `workflow_id` too, that bundle's version of it; else the
    /// latest.
    pub(crate) fn starting_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
        parent: Option<(&str, u32)>,
    ) -> Result<(Arc<Workflow>, Option<u32>)> {
        if let Some(v) = version {
            if self.unversioned_workflow(workflow_id)?.is_none() {
                // Asked for by number: checked against the store, which may
                // have let it go since this runtime loaded it.
                let row = self.version_row(workflow_id, v)?;
                return Ok((self.load_version(&row)?, Some(v)));
            }
        }
        if let Some((parent_id, parent_version)) = parent {
            if let Some(found) = self.sibling_version(workflow_id, parent_id, parent_version)? {
                return Ok(found);
            }
        }
        self.latest_workflow(workflow_id)
    }

    /// `workflow_id` as the bundle of `parent_id`'s version defines it, if
    /// it does (and the store names a version of it with that digest).
    fn sibling_version(
        &self,
        workflow_id: &str,
        parent_id: &str,
        parent_version: u32,
    ) -> Result<Option<(Arc<Workflow>, Option<u32>)>> {
        if self.unversioned_workflow(workflow_id)?.is_some() {
            return Ok(None);
        }
        self.workflow_version(parent_id, parent_version)?;
        let digest = match self
            .inner
            .loaded
            .pinned
            .read()
            .get(&(parent_id.to_string(), parent_version))
        {
            Some((digest, _)) => digest.clone(),
            None => return Ok(None),
        };
        let row = self
            .store()
            .workflow_versions(Some(workflow_id))?
            .into_iter()
            .filter(|v| v.digest == digest)
            .max_by_key(|v| v.version);
        let ours = self
            .inner
            .loaded
            .bundle(&digest)
            .is_some_and(|b| b.workflows.iter().any(|w| w.workflow_id == workflow_id));
        match row {
            Some(row) => Ok(Some((self.load_version(&row)?, Some(row.version)))),
            // The parent's bundle defines it: never another bundle's code.
            None if ours => Err(Error::invalid(
                "workflow_id",
                format!(
                    "the bundle of version {parent_version} of {parent_id:?} defines {workflow_id:?}, but the store keeps no version of it from that bundle (removed by hand?)"
                ),
            )),
            None => Ok(None),
        }
    }

    /// Every deployed workflow with its latest version, by id.
    pub fn deployed_workflows(&self) -> Result<Vec<WorkflowSummary>> {
        let mut out: Vec<WorkflowSummary> = Vec::new();
        for v in self.store().workflow_versions(None)? {
            match out.last_mut() {
                Some(w) if w.workflow_id == v.workflow_id => {
                    w.versions += 1;
                    w.latest = v;
                }
                _ => out.push(WorkflowSummary {
                    workflow_id: v.workflow_id.clone(),
                    latest: v,
                    versions: 1,
                }),
            }
        }
        Ok(out)
    }

    /// Every version of `workflow_id` with its runs by status
    /// (`unknown_workflow` if none is deployed).
    pub fn workflow_versions(&self, workflow_id: &str) -> Result<VersionReport> {
        let versions = self.store().workflow_versions(Some(workflow_id))?;
        if versions.is_empty() {
            return Err(Error::UnknownWorkflow {
                workflow_id: workflow_id.to_string(),
            });
        }
        let uses = self.store().version_use(workflow_id)?;
        let runs_of = |v: Option<u32>| {
            uses.iter()
                .filter(|u| u.version == v)
                .map(|u| (u.status.as_str().to_string(), u.runs))
                .collect::<BTreeMap<_, _>>()
        };
        Ok(VersionReport {
            workflow_id: workflow_id.to_string(),
            versions: versions
                .into_iter()
                .map(|v| VersionRuns {
                    runs: runs_of(Some(v.version)),
                    version: v,
                })
                .collect(),
            unpinned_runs: runs_of(None),
        })
    }

    /// Moves `run_id` to another version of its workflow, under the run
    /// transaction: refused (`upgrade_incompatible`, naming what is
    /// missing) unless its current node and the node its wait resumes at
    /// exist in the new graph; recorded in the ledger as `upgraded {from,
    /// to}`. With `dry_run`, checks and says what it would do.
    pub fn upgrade(&self, run_id: &str, to: UpgradeTo, dry_run: bool) -> Result<Upgrade> {
        let (mut txn, mut run) = self.claim(run_id, UPGRADE_WAIT)?;
        if run.status.is_terminal() {
            return Err(Error::invalid(
                "run_id",
                format!(
                    "run {run_id} has ended ({}): only a running or waiting run moves",
                    run.status.as_str()
                ),
            ));
        }
        if self.unversioned_workflow(&run.workflow_id)?.is_some() {
            return Err(Error::invalid(
                "run_id",
                format!(
                    "workflow {:?} of run {run_id} is not deployed (it has no versions)",
                    run.workflow_id
                ),
            ));
        }
        let target = match to {
            UpgradeTo::Version(v) => v,
            UpgradeTo::Latest => {
                self.store()
                    .workflow_version(&run.workflow_id, None)?
                    .ok_or_else(|| Error::UnknownWorkflow {
                        workflow_id: run.workflow_id.clone(),
                    })?
                    .version
            }
        };
        let wf = self.load_version(&self.version_row(&run.workflow_id, target)?)?;
        // Records of an effect a crash cut short wait to be replayed by
        // the step that wrote them, on the code that wrote them.
        if !self.store().list_ahead(run_id)?.is_empty() {
            return Err(Error::UpgradeIncompatible {
                run_id: run_id.to_string(),
                to: target,
                missing: vec!["(an unsettled effect: let the run settle, then upgrade)".into()],
            });
        }
        let missing = missing_nodes(&run, &wf);
        if !missing.is_empty() {
            return Err(Error::UpgradeIncompatible {
                run_id: run_id.to_string(),
                to: target,
                missing,
            });
        }
        let from = run.workflow_version;
        let mut plan = Upgrade {
            run_id: run_id.to_string(),
            workflow_id: run.workflow_id.clone(),
            from,
            to: target,
            moved: false,
        };
        if dry_run || from == Some(target) {
            return Ok(plan);
        }
        let now = super::clock::format_time(self.now());
        let record = stepwell_model::model::StepRecord {
            result: Some(json!({ "upgraded": { "from": from, "to": target } })),
            ended_at: Some(now.clone()),
            ..self.record(&run, run.current_node.clone(), &now)
        };
        run.workflow_version = Some(target);
        run.updated_at = now;
        txn.commit(vec![record], &mut run)?;
        plan.moved = true;
        Ok(plan)
    }

    /// The runs of `workflow_id` that [`Runtime::upgrade`] would move with
    /// `from` (its runs on that version, or on any other than the target
    /// when `None`): running and waiting runs, oldest first.
    pub fn upgradable_runs(&self, workflow_id: &str, from: Option<u32>) -> Result<Vec<RunState>> {
        if self.store().workflow_version(workflow_id, None)?.is_none() {
            return Err(Error::UnknownWorkflow {
                workflow_id: workflow_id.to_string(),
            });
        }
        if let Some(v) = from {
            self.version_row(workflow_id, v)?;
        }
        let mut runs = Vec::new();
        for status in [RunStatus::Waiting, RunStatus::Running] {
            runs.extend(
                self.store()
                    .list_runs(&crate::store::RunQuery {
                        workflow_id: Some(workflow_id.to_string()),
                        status: Some(status),
                        ..Default::default()
                    })?
                    .into_iter()
                    .filter(|r| from.is_none() || r.workflow_version == from),
            );
        }
        runs.sort_by(|a, b| a.created_at.cmp(&b.created_at));
        Ok(runs)
    }

    /// Removes the versions (of `workflow_id`, or of every workflow) that
    /// are neither their workflow's latest nor the version of a run that
    /// is running or waiting, or that ended at or after `finished_since`
    /// (RFC 3339) when given; the files of a digest go with its last
    /// version. With `dry_run`, only lists them.
    pub fn prune_versions(
        &self,
        workflow_id: Option<&str>,
        finished_since: Option<&str>,
        dry_run: bool,
    ) -> Result<Vec<WorkflowVersion>> {
        let all = self.store().workflow_versions(None)?;
        let mut uses = HashMap::new();
        let mut ids: Vec<&str> = all.iter().map(|v| v.workflow_id.as_str()).collect();
        ids.dedup();
        for id in ids {
            uses.insert(id.to_string(), self.store().version_use(id)?);
        }
        let uses_of = |id: &str| uses.get(id).cloned().unwrap_or_default();
        let removable = crate::store::deployments::prunable(&all, &uses_of, finished_since);
        // A version in use keeps its whole bundle: the children its runs
        // start run their parent's bundle ([`Runtime::starting_version`]).
        let kept_digests: Vec<&str> = all
            .iter()
            .filter(|v| !removable.contains(v))
            .map(|v| v.digest.as_str())
            .collect();
        let mut pins = Vec::new();
        for plugin in self.inner.plugins.iter() {
            pins.extend(plugin.pinned_versions(self)?);
        }
        let gone: Vec<WorkflowVersion> = removable
            .into_iter()
            .filter(|v| workflow_id.is_none_or(|id| v.workflow_id == id))
            .filter(|v| !kept_digests.contains(&v.digest.as_str()))
            .filter(|v| {
                !pins
                    .iter()
                    .any(|(id, n)| *id == v.workflow_id && *n == v.version)
            })
            .cloned()
            .collect();
        if !dry_run && !gone.is_empty() {
            self.store().remove_versions(&gone)?;
            let mut pinned = self.inner.loaded.pinned.write();
            for v in &gone {
                pinned.remove(&(v.workflow_id.clone(), v.version));
            }
        }
        Ok(gone)
    }
}

/// The nodes `run` can be at or come back to that `wf` does not define:
/// its current node and the node its wait resumes at.
fn missing_nodes(run: &RunState, wf: &Workflow) -> Vec<String> {
    let mut wanted: Vec<&str> = run.current_node.iter().map(String::as_str).collect();
    if let Some(w) = &run.waiting {
        wanted.extend(w.resume_to_node.as_deref());
    }
    let mut missing: Vec<String> = wanted
        .into_iter()
        .filter(|n| !wf.nodes.contains_key(*n))
        .map(str::to_string)
        .collect();
    missing.dedup();
    missing
}

//! Deployed versions of workflows: which bundle (by the digest of its
//! files, see [`crate::bundles`]) defines each version of each workflow id.
//!
//! A deployment records a bundle once per digest and, for every workflow
//! id the bundle defines, a new version (1, 2, 3, ... per id) unless that
//! id's latest version already has the same digest (then nothing changes:
//! deploying unchanged content is a no-op). A run names the version it
//! started on; every host loads that version's files from the store.

use serde::{Deserialize, Serialize};

use crate::bundles::BundleFiles;
use stepwell_model::model::RunStatus;

/// One deployed version of a workflow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkflowVersion {
    /// The workflow id.
    pub workflow_id: String,
    /// Its version number: 1 for the first deployment of the id, then one
    /// more for each deployment that changed its bundle.
    pub version: u32,
    /// The digest of the bundle files that define it.
    pub digest: String,
    /// When it was deployed (RFC 3339, UTC).
    pub deployed_at: String,
    /// Who deployed it, if known.
    #[serde(default)]
    pub deployed_by: Option<String>,
    /// Where it was deployed from (a path on the deploying machine), for
    /// people: nothing loads from it.
    #[serde(default)]
    pub source: Option<String>,
}

/// A bundle to record as a deployment.
#[derive(Debug, Clone, Copy)]
pub struct Deployment<'a> {
    /// The workflow ids the bundle defines.
    pub workflow_ids: &'a [String],
    /// Its files and their digest.
    pub files: &'a BundleFiles,
    /// Who deploys it.
    pub deployed_by: Option<&'a str>,
    /// Where it comes from.
    pub source: Option<&'a str>,
    /// When (RFC 3339, UTC).
    pub deployed_at: &'a str,
}

/// What a deployment recorded for one workflow id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployed {
    /// The version the id now has (a new one, or the latest if unchanged).
    pub version: WorkflowVersion,
    /// Whether the latest version already had this content (nothing was
    /// recorded for this id).
    pub unchanged: bool,
}

/// How many runs of one version of a workflow are in one status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VersionUse {
    /// The version (`None`: runs started before versions were recorded, or
    /// of a workflow registered in code).
    pub version: Option<u32>,
    /// Their status.
    pub status: RunStatus,
    /// How many.
    pub runs: u64,
    /// The latest `updated_at` among them.
    pub last_updated: String,
}

/// The versions a deployment records, given the `existing` versions of
/// every id it names (for stores that keep versions in memory or in one
/// file; the SQL stores do the same in SQL).
pub fn plan(existing: &[WorkflowVersion], d: &Deployment<'_>) -> Vec<Deployed> {
    d.workflow_ids
        .iter()
        .map(|id| {
            let latest = existing
                .iter()
                .filter(|v| &v.workflow_id == id)
                .max_by_key(|v| v.version);
            match latest {
                Some(v) if v.digest == d.files.digest => Deployed {
                    version: v.clone(),
                    unchanged: true,
                },
                _ => Deployed {
                    version: WorkflowVersion {
                        workflow_id: id.clone(),
                        version: latest.map_or(1, |v| v.version + 1),
                        digest: d.files.digest.clone(),
                        deployed_at: d.deployed_at.to_string(),
                        deployed_by: d.deployed_by.map(str::to_string),
                        source: d.source.map(str::to_string),
                    },
                    unchanged: false,
                },
            }
        })
        .collect()
}

/// The versions among `versions` (of any ids) that may be removed: not
/// the latest of their id, and not the version of a run that is running
/// or waiting, or that ended at or after `finished_since` (RFC 3339) when
/// given. `uses` are the run counts of every id in `versions`, by id.
pub fn prunable<'a>(
    versions: &'a [WorkflowVersion],
    uses: &dyn Fn(&str) -> Vec<VersionUse>,
    finished_since: Option<&str>,
) -> Vec<&'a WorkflowVersion> {
    let mut out = Vec::new();
    let mut ids: Vec<&str> = versions.iter().map(|v| v.workflow_id.as_str()).collect();
    ids.dedup();
    for id in ids {
        let of_id: Vec<&WorkflowVersion> =
            versions.iter().filter(|v| v.workflow_id == id).collect();
        let latest = of_id.iter().map(|v| v.version).max();
        let used = uses(id);
        let in_use = |version: u32| {
            used.iter().any(|u| {
                u.version == Some(version)
                    && (!u.status.is_terminal()
                        || finished_since.is_some_and(|since| u.last_updated.as_str() >= since))
            })
        };
        out.extend(
            of_id
                .into_iter()
                .filter(|v| Some(v.version) != latest && !in_use(v.version)),
        );
    }
    out
}

/// Version `version` of `workflow_id` among `versions` (`None`: its
/// latest).
pub fn pick(
    versions: &[WorkflowVersion],
    workflow_id: &str,
    version: Option<u32>,
) -> Option<WorkflowVersion> {
    let mut of_id = versions.iter().filter(|v| v.workflow_id == workflow_id);
    match version {
        Some(n) => of_id.find(|v| v.version == n),
        None => of_id.max_by_key(|v| v.version),
    }
    .cloned()
}

/// The versions of `workflow_id` (of every id when `None`) among
/// `versions`, by id, then version.
pub fn select(versions: &[WorkflowVersion], workflow_id: Option<&str>) -> Vec<WorkflowVersion> {
    let mut out: Vec<_> = versions
        .iter()
        .filter(|v| workflow_id.is_none_or(|id| v.workflow_id == id))
        .cloned()
        .collect();
    out.sort_by(|a, b| (&a.workflow_id, a.version).cmp(&(&b.workflow_id, b.version)));
    out
}

/// Removes `gone` (each matched by id, number and digest) from
/// `versions`; returns how many were removed.
pub fn remove(versions: &mut Vec<WorkflowVersion>, gone: &[WorkflowVersion]) -> usize {
    let before = versions.len();
    versions.retain(|v| {
        !gone.iter().any(|r| {
            r.workflow_id == v.workflow_id && r.version == v.version && r.digest == v.digest
        })
    });
    before - versions.len()
}

/// Counts `runs` (of one workflow) by version and status.
pub fn count<'a>(runs: impl Iterator<Item = (Option<u32>, RunStatus, &'a str)>) -> Vec<VersionUse> {
    let mut out: Vec<VersionUse> = Vec::new();
    for (version, status, updated) in runs {
        match out
            .iter_mut()
            .find(|u| u.version == version && u.status == status)
        {
            Some(u) => {
                u.runs += 1;
                if updated > u.last_updated.as_str() {
                    u.last_updated = updated.to_string();
                }
            }
            None => out.push(VersionUse {
                version,
                status,
                runs: 1,
                last_updated: updated.to_string(),
            }),
        }
    }
    sort(&mut out);
    out
}

/// Puts `uses` in their listing order: by version (unpinned first), then
/// status name.
pub fn sort(uses: &mut [VersionUse]) {
    uses.sort_by(|a, b| (a.version, a.status.as_str()).cmp(&(b.version, b.status.as_str())));
}

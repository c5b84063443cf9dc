//! Retention: finished runs deleted once they are older than a policy
//! says, whole trees at a time, never what a live run still needs.
//!
//! A run goes with its root: a root (a run without a parent, or whose
//! parent is gone) that ended longer ago than its status's retention is
//! deleted with all its descendants, if every one of them has ended too.
//! A child of a live run is never deleted (its parent may still read it),
//! nor a run of a workflow a plugin reserved (an automation's controller),
//! except a child that plugin releases
//! ([`crate::core::plugin::Plugin::releases_child`]: an automation's ended
//! occurrences it will not read again), which is then a root of its own.

use std::time::Duration;

use serde::Serialize;

use super::model::{RunState, RunStatus};
use super::runtime::Runtime;
use super::{Error, Result};
use crate::store::{RunQuery, SnapshotQuery, SnapshotStore};

/// How long finished runs are kept, by how they ended (`None`: for ever).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Completed runs.
    pub completed: Option<Duration>,
    /// Failed runs.
    pub failed: Option<Duration>,
    /// Cancelled runs.
    pub cancelled: Option<Duration>,
}

impl Retention {
    /// Reads `completed=30d,failed=90d,cancelled=7d` (any of the three, in
    /// any order; a duration is a whole number of `s`, `m`, `h` or `d`).
    pub fn parse(text: &str) -> Result<Retention> {
        let mut r = Retention::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |why: &str| Error::invalid("retain", format!("{part:?}: {why}"));
            let (status, span) = part
                .split_once('=')
                .ok_or_else(|| bad("expected STATUS=DURATION, as completed=30d"))?;
            let span = parse_span(span.trim())
                .ok_or_else(|| bad("a duration is a whole number (at least 1, at most about 500 billion years) of s, m, h or d, as 30d"))?;
            let slot = match status.trim() {
                "completed" => &mut r.completed,
                "failed" => &mut r.failed,
                "cancelled" => &mut r.cancelled,
                _ => return Err(bad("the statuses are completed, failed and cancelled")),
            };
            if slot.replace(span).is_some() {
                return Err(bad("said twice"));
            }
        }
        if r == Retention::default() {
            return Err(Error::invalid(
                "retain",
                "nothing to retain by: give completed=, failed= or cancelled=",
            ));
        }
        Ok(r)
    }

    /// How long runs that ended with `status` are kept.
    fn of(&self, status: RunStatus) -> Option<Duration> {
        match status {
            RunStatus::Completed => self.completed,
            RunStatus::Failed => self.failed,
            RunStatus::Cancelled => self.cancelled,
            _ => None,
        }
    }
}

/// `30d`, `12h`, `90m`, `45s` as a duration.
fn parse_span(text: &str) -> Option<Duration> {
    let unit = text.chars().last()?;
    let digits = &text[..text.len() - unit.len_utf8()];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok().filter(|n| *n > 0)?;
    let secs = match unit {
        's' => n,
        'm' => n.checked_mul(60)?,
        'h' => n.checked_mul(3_600)?,
        'd' => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

/// What [`Runtime::prune`] is asked besides the policy.
#[derive(Default)]
pub struct PruneOptions<'a> {
    /// Only say what would go.
    pub dry_run: bool,
    /// Export each tree (`Runtime::export_run`, with its children) into
    /// this folder, as `<root run id>.zip`, before deleting it.
    pub archive: Option<&'a std::path::Path>,
    /// The snapshots of deleted runs go from here too.
    pub snapshots: Option<&'a dyn SnapshotStore>,
}

/// One tree [`Runtime::prune`] deleted (or would).
#[derive(Debug, Clone, Serialize)]
pub struct PrunedTree {
    /// The root run.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// How it ended.
    pub status: RunStatus,
    /// When it last changed (its end).
    pub ended_at: String,
    /// The runs of the tree, root first.
    pub runs: Vec<String>,
    /// Their ledger records.
    pub records: u64,
    /// The bytes of their states and ledgers, as JSON.
    pub bytes: u64,
}

/// What [`Runtime::prune`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PruneReport {
    /// Nothing was deleted: this is what would go.
    pub dry_run: bool,
    /// The trees deleted, oldest first.
    pub trees: Vec<PrunedTree>,
    /// Old enough, but kept, and why.
    pub kept: Vec<(String, String)>,
    /// Runs deleted.
    pub runs: u64,
    /// Ledger records deleted.
    pub records: u64,
    /// Bytes of state and ledger JSON deleted.
    pub bytes: u64,
    /// Snapshots deleted.
    pub snapshots: u64,
}

/// What a prune keeps of an old root while it looks for the others: no
/// vars.
struct Root {
    run_id: String,
    workflow_id: String,
    status: RunStatus,
    ended_at: String,
    ended: Option<chrono::DateTime<chrono::Utc>>,
    /// A child its parent's plugin released: it goes on its own.
    released: bool,
}

impl Root {
    fn of(run: &RunState, released: bool) -> Root {
        Root {
            run_id: run.run_id.clone(),
            workflow_id: run.workflow_id.clone(),
            status: run.status,
            ended_at: run.updated_at.clone(),
            ended: chrono::DateTime::parse_from_rfc3339(&run.updated_at)
                .map(|t| t.with_timezone(&chrono::Utc))
                .ok(),
            released,
        }
    }
}

/// Why a finished root must stay for something else: a turn of a
/// session (whose history reads it), a discussion of an automation.
fn owned_elsewhere(run: &RunState) -> Option<String> {
    let meta = run.vars.get("_meta");
    if meta
        .and_then(|m| m.get("discussion"))
        .is_some_and(|v| !v.is_null())
    {
        return Some("it is a discussion of an automation: it goes with its automation".into());
    }
    if let Some(session) = &run.session_id {
        return Some(format!(
            "it is a turn of session {session}, whose history reads it (sessions are not pruned yet)"
        ));
    }
    None
}

/// How many runs one listing page holds.
const PAGE: usize = 1_000;

impl Runtime {
    /// Deletes the finished runs that `policy` no longer keeps, whole trees
    /// at a time (see the module doc), with their ledgers (and snapshots,
    /// given `options.snapshots`); exports each first into
    /// `options.archive`. With `options.dry_run`, deletes nothing and says
    /// what would go. A tree that changed meanwhile (a run that is not
    /// finished any more) is left to the next prune.
    pub fn prune(&self, policy: &Retention, options: &PruneOptions<'_>) -> Result<PruneReport> {
        let now = self.now();
        let mut report = PruneReport {
            dry_run: options.dry_run,
            ..PruneReport::default()
        };
        for root in self.old_roots(policy, now)? {
            let tree = match self.tree_of(&root)? {
                Err(why) => {
                    report.kept.push((root.run_id.clone(), why));
                    continue;
                }
                Ok(tree) => self.measure(&root, tree)?,
            };
            if !options.dry_run {
                if let Err(why) = self.delete_tree(&tree, options, &mut report)? {
                    report.kept.push((root.run_id.clone(), why));
                    continue;
                }
            }
            report.runs += tree.runs.len() as u64;
            report.records += tree.records;
            report.bytes += tree.bytes;
            report.trees.push(tree);
        }
        Ok(report)
    }

    /// The finished roots older than `policy` keeps them, oldest first.
    fn old_roots(
        &self,
        policy: &Retention,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Root>> {
        let mut found = Vec::new();
        let mut after = None;
        // The parents of the runs looked at (an automation's controller, a
        // run with many children: read once).
        let mut parents = std::collections::HashMap::new();
        loop {
            let page = self.store().list_runs(&RunQuery {
                limit: Some(PAGE),
                after_run_id: after.take(),
                ..RunQuery::default()
            })?;
            let last = page.last().map(|r| r.run_id.clone());
            for run in page {
                let Some(keep) = policy.of(run.status) else {
                    continue;
                };
                let mut root = Root::of(&run, false);
                let old = root.ended.is_some_and(|t| {
                    now.signed_duration_since(t)
                        .to_std()
                        .is_ok_and(|age| age > keep)
                });
                if !old || self.plugins_reserved(&run.workflow_id).is_some() {
                    continue;
                }
                if let Some(released) = self.root_kind(&run, &mut parents)? {
                    root.released = released;
                    found.push(root);
                }
            }
            match last {
                Some(id) => after = Some(id),
                None => break,
            }
        }
        found.sort_by_key(|r| r.ended);
        Ok(found)
    }

    /// Whether `run` is a root: `Some(false)` when it has no parent or its
    /// parent is gone, `Some(true)` when its parent's plugin releases it,
    /// `None` when it goes with its parent.
    fn root_kind(
        &self,
        run: &RunState,
        parents: &mut std::collections::HashMap<String, Option<RunState>>,
    ) -> Result<Option<bool>> {
        let Some(parent_id) = &run.parent_run_id else {
            return Ok(Some(false));
        };
        if !parents.contains_key(parent_id) {
            let parent = self.store().load_run(parent_id)?;
            parents.insert(parent_id.clone(), parent);
        }
        Ok(match parents.get(parent_id).and_then(Option::as_ref) {
            None => Some(false),
            Some(parent) => self
                .inner
                .plugins
                .releases(self, parent, run)
                .then_some(true),
        })
    }

    /// The runs of `root`'s tree, root first; or why it must stay (a run
    /// in it has not ended).
    fn tree_of(&self, root: &Root) -> Result<std::result::Result<Vec<RunState>, String>> {
        let Some(state) = self.store().load_run(&root.run_id)? else {
            return Ok(Err("it is gone (another prune?)".into()));
        };
        // A released child's plugin vouched for its session too.
        if let Some(why) = owned_elsewhere(&state).filter(|_| !root.released) {
            return Ok(Err(why));
        }
        let mut tree = vec![state];
        let mut at = 0;
        while at < tree.len() {
            let children = self.store().list_runs(&RunQuery {
                parent_run_id: Some(tree[at].run_id.clone()),
                ..RunQuery::default()
            })?;
            for child in children {
                if !child.status.is_terminal() {
                    return Ok(Err(format!(
                        "its descendant {} is {}",
                        child.run_id,
                        child.status.as_str()
                    )));
                }
                tree.push(child);
            }
            at += 1;
        }
        Ok(Ok(tree))
    }

    /// The tree as a report line: its runs, records and bytes.
    fn measure(&self, root: &Root, tree: Vec<RunState>) -> Result<PrunedTree> {
        let mut records = 0;
        let mut bytes = 0;
        for run in &tree {
            bytes += serde_json::to_vec(run).map_or(0, |v| v.len() as u64);
            for page in self.ledger_pages(&run.run_id, 0) {
                for (_, r) in page? {
                    records += 1;
                    bytes += serde_json::to_vec(&r).map_or(0, |v| v.len() as u64);
                }
            }
        }
        Ok(PrunedTree {
            run_id: root.run_id.clone(),
            workflow_id: root.workflow_id.clone(),
            status: root.status,
            ended_at: root.ended_at.clone(),
            runs: tree.into_iter().map(|r| r.run_id).collect(),
            records,
            bytes,
        })
    }

    /// Archives (if asked) and deletes one tree, whole; or why it stays
    /// (its archive could not be written, or the store kept it).
    fn delete_tree(
        &self,
        tree: &PrunedTree,
        options: &PruneOptions<'_>,
        report: &mut PruneReport,
    ) -> Result<std::result::Result<(), String>> {
        if let Some(dir) = options.archive {
            if let Err(why) = self.archive(&tree.run_id, dir) {
                return Ok(Err(format!("not archived, so not deleted: {why}")));
            }
        }
        let ids: Vec<String> = tree.runs.iter().rev().cloned().collect();
        let deleted = self.store().delete_runs(&ids)?;
        if deleted.runs.is_empty() {
            return Ok(Err(
                "the store deleted none of it: a run of it changed meanwhile, or (SQLite) it holds the store's newest ledger row; the next prune looks again".into(),
            ));
        }
        if let Some(snapshots) = options.snapshots {
            for id in &deleted.runs {
                let query = SnapshotQuery {
                    run_id: Some(id.clone()),
                    ..SnapshotQuery::default()
                };
                for s in snapshots.search_snapshots(&query)? {
                    if snapshots.delete_snapshot(&s.snapshot_id)? {
                        report.snapshots += 1;
                    }
                }
            }
        }
        Ok(Ok(()))
    }
}

impl Runtime {
    /// Writes the export of `root` (with its children) into `dir` as
    /// `<root>-<time>.zip`: through a temporary file, synced, renamed,
    /// never over another file.
    fn archive(&self, root: &str, dir: &std::path::Path) -> std::result::Result<(), String> {
        use std::io::Write;
        let bytes = self.export_run(root, true).map_err(|e| e.to_string())?;
        let stamp = self.now().format("%Y%m%dT%H%M%S%.6fZ");
        let path = dir.join(format!("{root}-{stamp}.zip"));
        let tmp = dir.join(format!(".{root}-{stamp}.zip.part"));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(&bytes)?;
                f.sync_all()
            });
        // Under its name, or beside an archive of the same time (a clock
        // fixed by `--now`): never over it.
        let mut linked = written.map(|()| None);
        for n in 1..=100 {
            let Ok(None) = linked else { break };
            let name = match n {
                1 => path.clone(),
                n => dir.join(format!("{root}-{stamp}-{n}.zip")),
            };
            linked = match std::fs::hard_link(&tmp, &name) {
                Ok(()) => Ok(Some(name)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
                Err(e) => Err(e),
            };
        }
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!(
                "{}: a hundred archives of this time exist",
                path.display()
            )),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }
}

/// Applies `policy` every `every` until `stop` is set (the first prune at
/// once), handing each outcome to `told`: what `stepwell drive --retain`
/// and `stepwell serve --retain` run in a thread of their own. Several
/// hosts may run one on the same store: a store deletes only runs that
/// have ended, and a run deleted by one is not there for the others.
pub fn run_pruner(
    rt: &Runtime,
    policy: Retention,
    every: Duration,
    snapshots: Option<&dyn SnapshotStore>,
    stop: &std::sync::atomic::AtomicBool,
    told: &dyn Fn(Result<PruneReport>),
) {
    use std::sync::atomic::Ordering;
    let tick = Duration::from_millis(100);
    while !stop.load(Ordering::SeqCst) {
        let options = PruneOptions {
            snapshots,
            ..PruneOptions::default()
        };
        told(rt.prune(&policy, &options));
        let mut waited = Duration::ZERO;
        while waited < every && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(tick.min(every - waited));
            waited += tick;
        }
    }
}

/// Reads a prune interval: a whole number of `s`, `m`, `h` or `d`, at
/// least a second.
pub fn parse_every(text: &str) -> Result<Duration> {
    parse_span(text.trim())
        .filter(|d| d.as_secs() >= 1)
        .ok_or_else(|| {
            Error::invalid(
                "prune_every",
                format!("{text:?}: a whole number of s, m, h or d, at least 1s, as 1h"),
            )
        })
}

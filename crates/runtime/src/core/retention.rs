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

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use super::compaction::CompactedLedger;
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

    /// The longest span the policy keeps anything: how much of a
    /// never-ending run's history (an automation controller's ledger) a
    /// prune keeps.
    pub fn longest(&self) -> Option<Duration> {
        [self.completed, self.failed, self.cancelled]
            .into_iter()
            .flatten()
            .max()
    }

    /// The shortest span the policy keeps anything: how long an artifact
    /// of a deleted run stays after it was last stored.
    pub fn shortest(&self) -> Option<Duration> {
        [self.completed, self.failed, self.cancelled]
            .into_iter()
            .flatten()
            .min()
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

/// `30d`, `12h`, `90m`, `45s` as a duration (`None` for anything else,
/// zero included).
pub fn parse_span(text: &str) -> Option<Duration> {
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
    /// An artifact stored (or stored again) this recently, by the host's
    /// real clock, stays even when no run names it yet: a step may have
    /// stored it and not committed its reference. `None`:
    /// [`ARTIFACT_GRACE`].
    pub artifact_grace: Option<Duration>,
}

/// How recently stored an artifact stays whoever names it (see
/// [`PruneOptions::artifact_grace`]): ten minutes.
pub const ARTIFACT_GRACE: Duration = Duration::from_secs(600);

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
    /// Artifacts deleted (or that would be): stored for the runs this
    /// prune deleted (longer ago than the policy's shortest span), or named
    /// by the records its compactions replaced; and named by no run that
    /// is kept (nor by an artifact one names).
    pub artifacts: u64,
    /// Their bytes.
    pub artifact_bytes: u64,
    /// Events of the inbox whose payloads were dropped (or would be): older
    /// than the policy's longest span and read by every reader of their
    /// stream. Their seqs and dedupe keys stay.
    pub events: u64,
    /// Ledgers of runs that never end (automation controllers) compacted
    /// behind a checkpoint: their records older than the policy's longest
    /// span ([`Retention::longest`]).
    pub compacted: Vec<CompactedLedger>,
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
        let (roots, reserved) = self.old_roots(policy, now)?;
        for root in roots {
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
        // A span longer than the calendar reaches back keeps everything.
        let ago = |span: Duration| {
            chrono::Duration::from_std(span)
                .ok()
                .and_then(|d| now.checked_sub_signed(d))
        };
        // What cannot be read (a corrupt ledger row, a quarantined run,
        // an artifact changed behind the store) stops only its own part:
        // said as kept, and the rest goes on.
        if let Some(before) = policy.longest().and_then(ago) {
            for id in &reserved {
                if let Err(e) = self.compact_one(id, before, options, &mut report) {
                    report
                        .kept
                        .push((id.clone(), format!("its ledger was not compacted: {e}")));
                }
            }
            let mut dropped = 0;
            let done = self.prune_inbox(before, &reserved, options, &mut report.kept, &mut dropped);
            report.events = dropped;
            if let Err(e) = done {
                let why = format!("the inbox was pruned in part: {e}");
                report.kept.push(("inbox".into(), why));
            }
        }
        if let Some(before) = policy.shortest().and_then(ago) {
            if let Err(e) = self.sweep_artifacts(before, options, &mut report) {
                let why = format!("the artifact sweep stopped: {e}");
                report.kept.push(("artifacts".into(), why));
            }
        }
        Ok(report)
    }

    /// Deletes the artifacts stored for the runs this prune deleted, before
    /// `before`, or named by the records its compactions replaced (and not
    /// stored again within the grace), that no kept run names: in
    /// its vars or its ledger, or through a JSON artifact it names. Reads
    /// every run and ledger when there is such an artifact. Nothing when
    /// the runtime keeps no artifacts or its store cannot list them.
    fn sweep_artifacts(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        options: &PruneOptions<'_>,
        report: &mut PruneReport,
    ) -> Result<()> {
        let Some(artifacts) = self.artifact_store() else {
            return Ok(());
        };
        // Taken before the scan: an artifact stored again while it reads
        // stays.
        let grace = options.artifact_grace.unwrap_or(ARTIFACT_GRACE);
        let since = std::time::SystemTime::now() - grace;
        // The runs of this prune (still there in a dry run), and what the
        // records its compactions replaced named.
        let pruned_ids: Vec<String> = report
            .trees
            .iter()
            .flat_map(|t| t.runs.iter().cloned())
            .collect();
        let pruned: std::collections::HashSet<&str> =
            pruned_ids.iter().map(String::as_str).collect();
        let compacted: std::collections::BTreeSet<String> = report
            .compacted
            .iter()
            .flat_map(|c| c.artifacts.iter().cloned())
            .collect();
        if pruned.is_empty() && compacted.is_empty() {
            return Ok(());
        }
        let listed = match artifacts.list() {
            Ok(listed) => listed,
            Err(e) if e.code == "store_unsupported" => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let candidates: Vec<_> = listed
            .into_iter()
            .filter(|m| {
                let old =
                    chrono::DateTime::parse_from_rfc3339(&m.created_at).is_ok_and(|t| t < before);
                let of_pruned = m.run_id.as_deref().is_some_and(|r| pruned.contains(r));
                (old && of_pruned) || compacted.contains(&m.artifact_id)
            })
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        // In a dry run the compactions have not happened: their records
        // are read as if gone (what a checkpoint carries stays named).
        let planned: Vec<(String, u64)> = report
            .compacted
            .iter()
            .filter(|_| options.dry_run)
            .map(|c| (c.run_id.clone(), c.through_seq))
            .collect();
        let cut: std::collections::HashMap<&str, u64> =
            planned.iter().map(|(id, s)| (id.as_str(), *s)).collect();
        let named = self.named_artifacts(&pruned, &cut)?;
        for meta in candidates
            .into_iter()
            .filter(|m| !named.contains(&m.artifact_id))
        {
            // With `--archive`, what goes is kept there first (a ledger
            // archive names it). Counted as it goes: a failure leaves the
            // report true.
            if !options.dry_run {
                if let Some(dir) = options.archive {
                    save_artifact(artifacts, &meta.artifact_id, dir)?;
                }
                if !artifacts.delete_unless_since(&meta.artifact_id, since)? {
                    continue;
                }
            }
            report.artifacts += 1;
            report.artifact_bytes += meta.size;
        }
        Ok(())
    }

    /// Adds the artifacts `run` names, in its vars and its ledger records
    /// as stored, to `named`; with `cut`, the records up to that seq count
    /// only for what they would carry (a compaction a dry run planned).
    fn collect_run_refs(
        &self,
        run: &RunState,
        cut: Option<u64>,
        named: &mut std::collections::BTreeSet<String>,
    ) -> Result<()> {
        use super::export::collect_refs;
        collect_refs(&serde_json::Value::Object(run.vars.clone()), named);
        let mut seq = 0;
        loop {
            let records =
                self.store()
                    .list_records_page(&run.run_id, seq, super::LEDGER_PAGE as usize)?;
            let Some((end, _)) = records.last() else {
                return Ok(());
            };
            seq = *end;
            for (seq, r) in &records {
                let key = r.idempotency_key.as_deref().unwrap_or_default();
                let gone = cut.is_some_and(|through| *seq <= through);
                if gone && !self.inner.plugins.carries(key) {
                    continue;
                }
                collect_refs(&serde_json::to_value(r).unwrap_or_default(), named);
            }
        }
    }

    /// The artifacts every run of the store but `pruned` names, in its
    /// vars or ledger records as stored, and those the JSON artifacts among
    /// them name.
    fn named_artifacts(
        &self,
        pruned: &std::collections::HashSet<&str>,
        cut: &std::collections::HashMap<&str, u64>,
    ) -> Result<std::collections::BTreeSet<String>> {
        let mut named = std::collections::BTreeSet::new();
        let mut after = None;
        loop {
            let page = self.store().list_runs(&RunQuery {
                limit: Some(PAGE),
                after_run_id: after.take(),
                ..RunQuery::default()
            })?;
            let Some(last) = page.last().map(|r| r.run_id.clone()) else {
                break;
            };
            for run in page.iter().filter(|r| !pruned.contains(r.run_id.as_str())) {
                let through = cut.get(run.run_id.as_str()).copied();
                self.collect_run_refs(run, through, &mut named)?;
            }
            after = Some(last);
        }
        // Quarantined runs are set aside, not gone (listing leaves them
        // out); one that cannot be read stops the sweep.
        for (id, _) in self.store().list_quarantined()? {
            if let Some(run) = self.store().load_run(&id)? {
                self.collect_run_refs(&run, None, &mut named)?;
            }
        }
        let Some(artifacts) = self.artifact_store() else {
            return Ok(named);
        };
        let mut queue: Vec<String> = named.iter().cloned().collect();
        while let Some(id) = queue.pop() {
            // Only JSON artifacts name others: no other content is read.
            let Some(meta) = artifacts.meta(&id)? else {
                continue;
            };
            if !meta.content_type.starts_with("application/json") {
                continue;
            }
            let Some(bytes) = artifacts.get(&id)? else {
                continue;
            };
            for n in super::export::refs_inside(&meta.content_type, &bytes) {
                if named.insert(n.clone()) {
                    queue.push(n);
                }
            }
        }
        Ok(named)
    }

    /// Drops the payloads of the inbox's events appended before `before`
    /// that every reader of their stream (the runs of `reserved` that read
    /// one, [`crate::core::plugin::Plugin::event_cursors`]) has passed; a
    /// connection's stream nobody reads any more goes up to `before`.
    /// Returns how many. Nothing on a store that keeps no inbox.
    fn prune_inbox(
        &self,
        before: chrono::DateTime<chrono::Utc>,
        reserved: &[String],
        options: &PruneOptions<'_>,
        kept: &mut Vec<(String, String)>,
        dropped: &mut u64,
    ) -> Result<()> {
        let unsupported = |e: &crate::store::StoreError| e.code == "store_unsupported";
        let mut streams = std::collections::BTreeMap::new();
        match self.store().list_connections() {
            Ok(all) => {
                for c in all {
                    streams.insert(crate::store::connection_stream(&c.connection_id), u64::MAX);
                }
            }
            Err(e) if unsupported(&e) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        // Quarantined runs read too (set aside, not gone): listing runs
        // leaves them out.
        let quarantined = self.store().list_quarantined()?.into_iter().map(|q| q.0);
        for id in reserved.iter().cloned().chain(quarantined) {
            let Some(run) = self.store().load_run(&id)? else {
                continue;
            };
            for (stream, cursor) in self.inner.plugins.cursors(self, &run) {
                let through = streams.entry(stream).or_insert(u64::MAX);
                *through = (*through).min(cursor);
            }
        }
        for (stream, through) in streams {
            let count = match self.store().prune_events(&stream, through, before, true) {
                Ok(n) => n,
                Err(e) if unsupported(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            if count == 0 || options.dry_run {
                *dropped += count;
                continue;
            }
            if let Some(dir) = options.archive {
                if let Err(why) = self.archive_events(&stream, through, before, dir) {
                    kept.push((
                        stream,
                        format!("its events were not archived, so kept: {why}"),
                    ));
                    continue;
                }
            }
            *dropped += self.store().prune_events(&stream, through, before, false)?;
        }
        Ok(())
    }

    /// Compacts the ledger of `id`, a run of a reserved workflow, if its
    /// plugin lets it (archiving the records it replaces first, if asked).
    fn compact_one(
        &self,
        id: &str,
        before: chrono::DateTime<chrono::Utc>,
        options: &PruneOptions<'_>,
        report: &mut PruneReport,
    ) -> Result<()> {
        let Some(run) = self.store().load_run(id)? else {
            return Ok(());
        };
        let Some(rules) = self.inner.plugins.compaction(self, &run) else {
            return Ok(());
        };
        let Some(plan) = self.plan_compaction(id, before, &rules)? else {
            return Ok(());
        };
        if !options.dry_run {
            let mut archived = None;
            if let Some(dir) = options.archive {
                match self.archive_ledger(id, plan.report.through_seq, dir) {
                    Ok(path) => archived = Some(path),
                    Err(why) => {
                        let why = format!("its ledger was not archived, so not compacted: {why}");
                        report.kept.push((id.to_string(), why));
                        return Ok(());
                    }
                }
            }
            let applied = self.apply_compaction(&plan);
            if let (Err(_), Some(path)) = (&applied, &archived) {
                // Not compacted (another prune did): not an archive of
                // what went.
                let _ = std::fs::remove_file(path);
            }
            match applied {
                Err(Error::Store(e)) if e.is_conflict() => {
                    let why = format!("its ledger changed while it was compacted ({}); the next prune looks again", e.message);
                    report.kept.push((id.to_string(), why));
                    return Ok(());
                }
                done => done?,
            }
        }
        report.compacted.push(plan.report);
        Ok(())
    }

    /// The finished roots older than `policy` keeps them, oldest first;
    /// and the runs of reserved workflows (whose ledgers may be compacted).
    fn old_roots(
        &self,
        policy: &Retention,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(Vec<Root>, Vec<String>)> {
        let mut found = Vec::new();
        let mut reserved = Vec::new();
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
                if self.plugins_reserved(&run.workflow_id).is_some() {
                    reserved.push(run.run_id.clone());
                    continue;
                }
                let Some(keep) = policy.of(run.status) else {
                    continue;
                };
                let mut root = Root::of(&run, false);
                let old = root.ended.is_some_and(|t| {
                    now.signed_duration_since(t)
                        .to_std()
                        .is_ok_and(|age| age > keep)
                });
                if !old {
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
        Ok((found, reserved))
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
    /// `<root>-<time>.zip`.
    fn archive(&self, root: &str, dir: &std::path::Path) -> std::result::Result<(), String> {
        let bytes = self.export_run(root, true).map_err(|e| e.to_string())?;
        write_archive(dir, root, "zip", &self.now(), |f| f.write_all(&bytes)).map(drop)
    }

    /// Writes the events of `stream` that a prune drops (seq up to
    /// `through`, appended before `before`) into `dir` as
    /// `<stream>-events-<through>-<time>.jsonl`, an event a line.
    fn archive_events(
        &self,
        stream: &str,
        through: u64,
        before: chrono::DateTime<chrono::Utc>,
        dir: &std::path::Path,
    ) -> std::result::Result<(), String> {
        let stem = format!("{}-events-{through}", stream.replace(':', "-"));
        write_archive(dir, &stem, "jsonl", &self.now(), |f| {
            let mut after = 0;
            loop {
                let page = self
                    .store()
                    .events_after(stream, after, 256)
                    .map_err(std::io::Error::other)?;
                let Some(last) = page.last().map(|e| e.seq) else {
                    break;
                };
                after = last;
                for e in page.iter().filter(|e| e.seq <= through) {
                    let old = chrono::DateTime::parse_from_rfc3339(&e.appended_at)
                        .is_ok_and(|t| t < before);
                    if old {
                        serde_json::to_writer(&mut *f, e)?;
                        f.write_all(b"\n")?;
                    }
                }
                if last >= through {
                    break;
                }
            }
            Ok(())
        })
        .map(drop)
    }

    /// Writes the records of `run_id`'s ledger up to seq `through` into
    /// `dir` as `<run>-ledger-<through>-<time>.jsonl`, a record a line as
    /// stored (hashes included: the last one's hash is the checkpoint's
    /// `replaced_head`), a page at a time.
    fn archive_ledger(
        &self,
        run_id: &str,
        through: u64,
        dir: &std::path::Path,
    ) -> std::result::Result<std::path::PathBuf, String> {
        let stem = format!("{run_id}-ledger-{through}");
        write_archive(dir, &stem, "jsonl", &self.now(), |f| {
            let mut after = 0;
            while after < through {
                let page = self
                    .store()
                    .list_records_page(run_id, after, super::LEDGER_PAGE as usize)
                    .map_err(std::io::Error::other)?;
                let Some((last, _)) = page.last() else { break };
                after = *last;
                for (_, record) in page.iter().filter(|(seq, _)| *seq <= through) {
                    serde_json::to_writer(&mut *f, record)?;
                    f.write_all(b"\n")?;
                }
            }
            Ok(())
        })
    }
}

/// Copies artifact `id` into `dir/artifacts/<id>` (once) before a sweep
/// deletes it.
fn save_artifact(
    artifacts: &dyn crate::store::ArtifactStore,
    id: &str,
    dir: &std::path::Path,
) -> Result<()> {
    let folder = dir.join("artifacts");
    let path = folder.join(id);
    if path.exists() {
        return Ok(());
    }
    let Some(bytes) = artifacts.get(id)? else {
        return Ok(());
    };
    let failed = |e: std::io::Error| Error::invalid("archive", format!("{}: {e}", path.display()));
    std::fs::create_dir_all(&folder).map_err(failed)?;
    crate::store::private::write_synced(&path, &bytes).map_err(failed)
}

/// Writes `<stem>-<time>.<ext>` into `dir` with `fill`: through a
/// temporary file, synced, renamed, never over another file. Returns its
/// path.
fn write_archive(
    dir: &std::path::Path,
    stem: &str,
    ext: &str,
    now: &chrono::DateTime<chrono::Utc>,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::result::Result<std::path::PathBuf, String> {
    let stamp = now.format("%Y%m%dT%H%M%S%.6fZ");
    let path = dir.join(format!("{stem}-{stamp}.{ext}"));
    let tmp = dir.join(format!(".{stem}-{stamp}.{ext}.part"));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            fill(&mut w)?;
            w.into_inner().map_err(|e| e.into_error())?.sync_all()
        });
    // Under its name, or beside an archive of the same time (a clock
    // fixed by `--now`): never over it.
    let mut linked = written.map(|()| None);
    for n in 1..=100 {
        let Ok(None) = linked else { break };
        let name = match n {
            1 => path.clone(),
            n => dir.join(format!("{stem}-{stamp}-{n}.{ext}")),
        };
        linked = match std::fs::hard_link(&tmp, &name) {
            Ok(()) => Ok(Some(name)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(e),
        };
    }
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(Some(path)) => Ok(path),
        Ok(None) => Err(format!(
            "{}: a hundred archives of this time exist",
            path.display()
        )),
        Err(e) => Err(format!("{}: {e}", path.display())),
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

//! Compacting a long-lived run's ledger behind a checkpoint.
//!
//! A run that never ends (an automation's controller) keeps a record of
//! every decision it made. Retention replaces the oldest of them, those
//! older than the policy keeps and before anything still in progress, by
//! one checkpoint record ([`crate::store::compaction`]): the records after
//! it keep their seqs and hashes, so `ledger --verify` still proves them
//! against the run's head, and the checkpoint carries the hash of the
//! record it replaced last. The records the run's plugin still looks up by
//! key (an automation's command results, which answer a repeated command)
//! are carried inside the checkpoint ([`Runtime::find_records`] finds
//! them there), at most [`CARRY_LIMIT`] of them, the newest.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::model::StepRecord;
use super::plugin::LedgerCompaction;
use super::runtime::Runtime;
use super::{Result, LEDGER_PAGE};
use crate::store::compaction::{checkpoint_body, checkpoint_record, CheckpointBody};

/// How many keys (a command's result with the resumes it caused count as
/// one) one checkpoint carries the records of at most: the newest. An
/// older command id is then forgotten: repeated, it runs again.
pub const CARRY_LIMIT: usize = 1_000;

/// The key `record` is carried under: its idempotency key, less the
/// `resumed-by:` of a resume the keyed record caused.
fn carry_group(record: &StepRecord) -> &str {
    let key = record.idempotency_key.as_deref().unwrap_or_default();
    key.strip_prefix("resumed-by:").unwrap_or(key)
}

/// The records of the newest [`CARRY_LIMIT`] keys of `carried`, oldest
/// first.
fn newest_keys(carried: VecDeque<StepRecord>) -> VecDeque<StepRecord> {
    let mut keys = std::collections::HashSet::new();
    let mut kept: VecDeque<StepRecord> = VecDeque::new();
    for r in carried.into_iter().rev() {
        if keys.len() < CARRY_LIMIT || keys.contains(carry_group(&r)) {
            keys.insert(carry_group(&r).to_string());
            kept.push_front(r);
        }
    }
    kept
}

/// One ledger a prune compacted (or would).
#[derive(Debug, Clone, Serialize)]
pub struct CompactedLedger {
    /// The run.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// The seq of the checkpoint: every record up to it was replaced.
    pub through_seq: u64,
    /// Records replaced by this compaction (an earlier checkpoint
    /// included).
    pub records: u64,
    /// Their bytes, as JSON.
    pub bytes: u64,
    /// Records the checkpoint carries.
    pub carried: usize,
    /// The artifacts the replaced records named (the carried ones'
    /// aside): retention deletes those no kept run names.
    #[serde(skip)]
    pub artifacts: Vec<String>,
}

/// A compaction worked out, not done yet.
pub(crate) struct CompactionPlan {
    /// What it replaces.
    pub(crate) report: CompactedLedger,
    /// The record that takes their place.
    pub(crate) checkpoint: StepRecord,
    /// The hash of the ledger's first record when it was planned (a
    /// compaction meanwhile changes it).
    first: Option<String>,
}

/// What a scan of the ledger found may go.
#[derive(Default)]
struct Cut {
    /// The last record that goes: its seq and hash.
    through: Option<(u64, String)>,
    /// The earlier checkpoint, if the ledger starts with one.
    earlier: Option<CheckpointBody>,
    /// The hash of the first record.
    first: Option<String>,
    /// Records that go (the earlier checkpoint not counted) and bytes.
    records: u64,
    bytes: u64,
    /// Of those, the ones retention did not write (seals of earlier
    /// compactions): a compaction replaces at least one.
    worth: u64,
    carried: VecDeque<StepRecord>,
    /// The artifacts the records that go (not carried) name.
    artifacts: std::collections::BTreeSet<String>,
}

impl Cut {
    /// Adds `record` at `seq` to what goes.
    fn take(&mut self, seq: u64, record: StepRecord, rules: &LedgerCompaction) {
        self.bytes += serde_json::to_vec(&record).map_or(0, |b| b.len() as u64);
        self.through = Some((seq, record.record_hash.clone().unwrap_or_default()));
        if self.first.is_none() {
            self.first = record.record_hash.clone();
        }
        if let Some(body) = checkpoint_body(&record) {
            self.carried.extend(body.carried.iter().cloned());
            self.earlier = Some(body);
        } else {
            self.records += 1;
            if crate::store::compaction::seals(&record).is_none() {
                self.worth += 1;
            }
            let key = record.idempotency_key.as_deref().unwrap_or_default();
            if !key.is_empty() && rules.carry_prefixes.iter().any(|p| key.starts_with(p)) {
                self.carried.push_back(record);
            } else {
                let value = serde_json::to_value(&record).unwrap_or_default();
                super::export::collect_refs(&value, &mut self.artifacts);
            }
        }
        if self.carried.len() > 4 * CARRY_LIMIT {
            self.carried = newest_keys(std::mem::take(&mut self.carried));
        }
    }
}

/// Whether `record` may go: it ended before `before` and carries none of
/// the keys that keep it (a checkpoint always may: it is as old as what it
/// replaced).
fn may_go(record: &StepRecord, before: DateTime<Utc>, rules: &LedgerCompaction) -> bool {
    if checkpoint_body(record).is_some() {
        return true;
    }
    let key = record.idempotency_key.as_deref();
    if key.is_some_and(|k| rules.keep_from_keys.iter().any(|keep| keep == k)) {
        return false;
    }
    let at = record.ended_at.as_deref().unwrap_or(&record.started_at);
    DateTime::parse_from_rfc3339(at).is_ok_and(|t| t.with_timezone(&Utc) < before)
}

impl Runtime {
    /// Replaces the records of `run_id`'s ledger that ended before
    /// `before`, up to the first that must stay (one of `rules`' keys, a
    /// younger one, the last), by a checkpoint; with `dry_run`, only says
    /// what would go. `None` when nothing would: too young, or a step of
    /// the run is in flight (records ahead of its state).
    pub fn compact_ledger(
        &self,
        run_id: &str,
        before: DateTime<Utc>,
        rules: &LedgerCompaction,
        dry_run: bool,
    ) -> Result<Option<CompactedLedger>> {
        let Some(plan) = self.plan_compaction(run_id, before, rules)? else {
            return Ok(None);
        };
        if !dry_run {
            self.apply_compaction(&plan)?;
        }
        Ok(Some(plan.report))
    }

    /// What [`Runtime::compact_ledger`] would do: the report and the
    /// checkpoint.
    pub(crate) fn plan_compaction(
        &self,
        run_id: &str,
        before: DateTime<Utc>,
        rules: &LedgerCompaction,
    ) -> Result<Option<CompactionPlan>> {
        let Some(run) = self.store().load_run(run_id)? else {
            return Ok(None);
        };
        if !self.store().compacts_ledgers() || !self.store().list_ahead(run_id)?.is_empty() {
            return Ok(None);
        }
        let cut = self.scan_for_cut(run_id, before, rules)?;
        let Some((through, replaced_head)) = cut.through.clone().filter(|_| cut.worth > 0) else {
            return Ok(None);
        };
        let report = CompactedLedger {
            run_id: run_id.to_string(),
            workflow_id: run.workflow_id,
            through_seq: through,
            records: cut.records,
            bytes: cut.bytes,
            carried: 0,
            artifacts: cut.artifacts.iter().cloned().collect(),
        };
        let carried = newest_keys(cut.carried);
        let report = CompactedLedger {
            carried: carried.len(),
            ..report
        };
        let body = CheckpointBody {
            through_seq: through,
            replaced_records: cut.records + cut.earlier.map_or(0, |b| b.replaced_records),
            replaced_head,
            compacted_at: super::clock::format_time(self.now()),
            carried: carried.into(),
        };
        Ok(Some(CompactionPlan {
            checkpoint: checkpoint_record(run_id, &body),
            report,
            first: cut.first,
        }))
    }

    /// Puts `plan`'s checkpoint in place of the records it replaces: a
    /// `conflict` when the ledger was compacted since it was planned.
    pub(crate) fn apply_compaction(&self, plan: &CompactionPlan) -> Result<()> {
        let r = &plan.report;
        let first = self.store().list_records_page(&r.run_id, 0, 1)?;
        if first.first().and_then(|(_, f)| f.record_hash.clone()) != plan.first {
            return Err(crate::store::StoreError::conflict(format!(
                "the ledger of run {} was compacted since it was read",
                r.run_id
            ))
            .into());
        }
        self.store()
            .compact_ledger(&r.run_id, r.through_seq, &plan.checkpoint)?;
        Ok(())
    }

    /// Reads the ledger a page at a time, oldest first, up to the first
    /// record that must stay: what goes before it (never the last record).
    fn scan_for_cut(
        &self,
        run_id: &str,
        before: DateTime<Utc>,
        rules: &LedgerCompaction,
    ) -> Result<Cut> {
        let mut cut = Cut::default();
        // The record read last, which goes once a record follows it.
        let mut last: Option<(u64, StepRecord)> = None;
        let mut after = 0;
        loop {
            let page = self
                .store()
                .list_records_page(run_id, after, LEDGER_PAGE as usize)?;
            let Some((end, _)) = page.last() else {
                return Ok(cut);
            };
            after = *end;
            for (seq, record) in page {
                if let Some((s, r)) = last.take() {
                    cut.take(s, r, rules);
                }
                if !may_go(&record, before, rules) {
                    return Ok(cut);
                }
                last = Some((seq, record));
            }
        }
    }

    /// The records of `run_id`'s ledger carrying `idempotency_key`, oldest
    /// first: those in the ledger, or, when none is, the ledger was
    /// compacted and a plugin carries such keys
    /// ([`crate::core::plugin::Plugin::carries_key`]), those its checkpoint
    /// carries.
    pub fn find_records(&self, run_id: &str, idempotency_key: &str) -> Result<Vec<StepRecord>> {
        let found = self.store().find_records(run_id, idempotency_key)?;
        if !found.is_empty() || !self.inner.plugins.carries(idempotency_key) {
            return Ok(found);
        }
        let first = self.store().list_records_page(run_id, 0, 1)?;
        Ok(first
            .into_iter()
            .filter_map(|(_, r)| checkpoint_body(&r))
            .flat_map(|b| b.carried)
            .filter(|r| r.idempotency_key.as_deref() == Some(idempotency_key))
            .collect())
    }
}

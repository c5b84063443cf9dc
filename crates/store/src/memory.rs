//! The in-memory store: for tests and for embedding hosts that persist
//! elsewhere. Nothing survives the process. It keeps the same run
//! transaction as the persistent stores (versions, fences, leases), so code
//! tested on it behaves the same on them.
//!
//! Its ledgers are hash-chained like every store's, but lazily: records are
//! linked (their `prev_hash` and `record_hash` computed, in order) the first
//! time they are read, not on the hot path of a commit. Nothing outside
//! the process can change them in between, so the chain is the same.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use parking_lot::Mutex;

use super::{
    check_next_version, link, wait_due_at, Claim, Deferral, Fence, LeaseAfter, LeaseRequest,
    RunQuery, Store, StoreError,
};
use stepwell_model::clock::format_time;
use stepwell_model::model::{EffectRecord, RunState, RunStatus, StepRecord, StepStatus};

/// One stored run: creation order, state, lease.
#[derive(Debug)]
struct Slot {
    seq: u64,
    run: RunState,
    lease: Option<(String, DateTime<Utc>)>,
    /// The length of the run's ledger at its last commit.
    committed: usize,
    /// Deferred until, and how many times since the last commit.
    defer: Option<(DateTime<Utc>, u32)>,
    /// Why it was last deferred.
    defer_reason: Option<String>,
}

/// A table keyed by run id. Hashed with foldhash (seeded per process)
/// rather than SipHash: a step looks a run up three or four times, and
/// SipHash over a 36-character id was about 3% of an in-memory step's
/// instructions. foldhash resists crafted keys less than SipHash; run ids
/// are made by the host (UUIDs) or checked ids of its callers, and the
/// seed is random per process.
type ByRun<V> = HashMap<String, V, foldhash::fast::RandomState>;

/// Deployed versions and the files of their digests.
#[derive(Debug, Default)]
struct Deployments {
    versions: Vec<crate::WorkflowVersion>,
    files: HashMap<String, Vec<crate::bundles::BundleFile>>,
}

#[derive(Debug, Default)]
struct Tables {
    runs: ByRun<Slot>,
    ledgers: ByRun<Ledger>,
    quarantined: Vec<(String, String)>,
    next_seq: u64,
}

/// Runs and ledgers in process memory. One lock guards everything, so every
/// commit is atomic.
#[derive(Debug, Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
    deployments: Mutex<Deployments>,
    inbox: Mutex<HashMap<String, Vec<super::InboxEvent>>>,
    connections: Mutex<Vec<super::ConnectionRecord>>,
    indexer: super::index::IndexerSlot,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// A commit of records it may keep as they are.
    fn commit_records(
        &self,
        records: impl IntoIterator<Item = StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
        changed: Option<&[String]>,
    ) -> Result<(), StoreError> {
        check_next_version(run, &fence)?;
        let mut t = self.tables.lock();
        t.check(&run.run_id, &fence)?;
        let renew = match (lease, fence.holder) {
            (LeaseAfter::Renew(until), Some(h)) => Some((h, until)),
            _ => None,
        };
        append_owned(&mut t.ledgers, records);
        let committed = t.ledgers.get(&run.run_id).map_or(0, |l| l.len);
        match t.runs.get_mut(&run.run_id) {
            Some(slot) => {
                update_run(&mut slot.run, run, changed);
                slot.committed = committed;
                slot.defer = None;
                slot.defer_reason = None;
                match (renew, slot.lease.as_mut()) {
                    (Some((h, until)), Some(held)) if held.0 == h => held.1 = until,
                    (Some((h, until)), _) => slot.lease = Some((h.to_string(), until)),
                    (None, _) => slot.lease = None,
                }
            }
            None => {
                let lease = renew.map(|(h, until)| (h.to_string(), until));
                t.insert_slot(run, lease, committed);
            }
        }
        Ok(())
    }
}

/// Records per chunk of a ledger: a ledger grows by whole chunks, so a long
/// one is never copied to grow.
const CHUNK: usize = 256;

/// When a kept record ended.
#[derive(Debug)]
enum Ended {
    /// A `started` record: not yet.
    Open,
    /// At its `started_at` (most records: a node step takes no time on the
    /// clock the ledger is written with).
    AtStart,
    /// At this time.
    At(Box<str>),
}

/// A kept result: `serde_json` text (`float_roundtrip`: read back equal),
/// or the value itself when it nests too deep for the parser to read back
/// (serde_json reads at most 128 levels).
#[derive(Debug)]
enum KeptValue {
    Text(Box<str>),
    Value(Box<serde_json::Value>),
    /// `{"next_node": <this>}`: the result of most node steps, kept as
    /// its one string (no JSON to write or read).
    NextNode(Box<str>),
}

/// Levels of nesting above which a value is kept as it is.
const TEXT_DEPTH: usize = 100;

/// Whether `v` nests more than `limit` levels deep.
fn deeper_than(v: &serde_json::Value, limit: usize) -> bool {
    use serde_json::Value;
    match v {
        _ if limit == 0 => matches!(v, Value::Array(_) | Value::Object(_)),
        Value::Array(a) => a.iter().any(|x| deeper_than(x, limit - 1)),
        Value::Object(o) => o.values().any(|x| deeper_than(x, limit - 1)),
        _ => false,
    }
}

impl KeptValue {
    fn keep(v: serde_json::Value) -> KeptValue {
        let v = match v {
            serde_json::Value::Object(mut map) if map.len() == 1 => {
                // Taken out in place: removing it from the map costs more
                // than the rest of keeping the record.
                if let Some((key, serde_json::Value::String(node))) = map.iter_mut().next() {
                    if key == "next_node" {
                        return KeptValue::NextNode(std::mem::take(node).into_boxed_str());
                    }
                }
                serde_json::Value::Object(map)
            }
            v => v,
        };
        if deeper_than(&v, TEXT_DEPTH) {
            return KeptValue::Value(Box::new(v));
        }
        match serde_json::to_string(&v) {
            Ok(text) => KeptValue::Text(text.into_boxed_str()),
            Err(_) => KeptValue::Value(Box::new(v)),
        }
    }

    fn value(&self) -> serde_json::Value {
        match self {
            KeptValue::Value(v) => (**v).clone(),
            // Written by serde_json from a value at most TEXT_DEPTH deep:
            // it reads back.
            KeptValue::Text(t) => serde_json::from_str(t).expect("kept JSON text reads back"),
            KeptValue::NextNode(n) => {
                let mut map = serde_json::Map::new();
                map.insert("next_node".into(), serde_json::Value::String(n.to_string()));
                serde_json::Value::Object(map)
            }
        }
    }
}

/// A ledger record as the memory store keeps it: about a quarter of a
/// [`StepRecord`]'s memory (the run id is the ledger's, text is boxed
/// without spare capacity, the result is kept as JSON text, an `ended_at`
/// equal to `started_at` is not kept twice). Every step of every run stays
/// in memory, so this is what an in-memory step costs in fresh pages.
#[derive(Debug)]
struct Kept {
    step_id: Box<str>,
    node_id: Option<Box<str>>,
    status: StepStatus,
    attempt: u32,
    effect: Option<Box<EffectRecord>>,
    /// The result, most often as JSON text.
    result: Option<KeptValue>,
    /// The step's vars patch and the run's input, most often as JSON text.
    vars: Option<KeptValue>,
    /// Boxed: only a run's first step and a restore carry one.
    input: Option<Box<KeptValue>>,
    error: Option<Box<str>>,
    started_at: Box<str>,
    ended_at: Ended,
    idempotency_key: Option<Box<str>>,
    /// Set when the record is linked; its `prev_hash` is the record
    /// before's `record_hash`.
    record_hash: Option<Box<str>>,
}

impl Kept {
    fn keep(r: StepRecord) -> Kept {
        let ended_at = match r.ended_at {
            None => Ended::Open,
            Some(t) if t == r.started_at => Ended::AtStart,
            Some(t) => Ended::At(t.into_boxed_str()),
        };
        Kept {
            step_id: r.step_id.into_boxed_str(),
            node_id: r.node_id.map(String::into_boxed_str),
            status: r.status,
            attempt: r.attempt,
            effect: r.effect.map(Box::new),
            result: r.result.map(KeptValue::keep),
            vars: r.vars.map(KeptValue::keep),
            input: r.input.map(|v| Box::new(KeptValue::keep(v))),
            error: r.error.map(String::into_boxed_str),
            started_at: r.started_at.into_boxed_str(),
            ended_at,
            idempotency_key: r.idempotency_key.map(String::into_boxed_str),
            record_hash: r.record_hash.map(String::into_boxed_str),
        }
    }

    /// The record of run `run_id`, following a record whose hash is
    /// `prev_hash`.
    fn record(&self, run_id: &str, prev_hash: Option<&str>) -> StepRecord {
        StepRecord {
            step_id: self.step_id.to_string(),
            run_id: run_id.to_string(),
            node_id: self.node_id.as_deref().map(str::to_string),
            status: self.status,
            effect: self.effect.as_deref().cloned(),
            result: self.result.as_ref().map(KeptValue::value),
            vars: self.vars.as_ref().map(KeptValue::value),
            input: self.input.as_deref().map(KeptValue::value),
            error: self.error.as_deref().map(str::to_string),
            started_at: self.started_at.to_string(),
            ended_at: match &self.ended_at {
                Ended::Open => None,
                Ended::AtStart => Some(self.started_at.to_string()),
                Ended::At(t) => Some(t.to_string()),
            },
            attempt: self.attempt,
            idempotency_key: self.idempotency_key.as_deref().map(str::to_string),
            prev_hash: prev_hash.map(str::to_string),
            record_hash: self.record_hash.as_deref().map(str::to_string),
        }
    }
}

/// One run's ledger: its records in chunks, the first `linked` of which
/// carry their hashes.
#[derive(Debug, Default)]
struct Ledger {
    chunks: Vec<Vec<Kept>>,
    len: usize,
    linked: usize,
    /// The seqs before the first record's (compacted away: the first
    /// record is then their checkpoint, at seq `base + 1`).
    base: u64,
    /// A compacted ledger's checkpoint's `prev_hash`: the hash its first
    /// two records follow (the checkpoint, and the record after it).
    anchor: Option<Box<str>>,
}

impl Ledger {
    fn push(&mut self, record: StepRecord) {
        self.push_kept(Kept::keep(record));
    }

    fn push_kept(&mut self, record: Kept) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(record),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(record);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    fn get(&self, i: usize) -> &Kept {
        &self.chunks[i / CHUNK][i % CHUNK]
    }

    /// The `prev_hash` of the record at position `i` (linked up to it).
    fn prev_of(&self, i: usize) -> Option<&str> {
        match (i, self.anchor.as_deref()) {
            (0 | 1, Some(anchor)) => Some(anchor),
            (0, None) => None,
            _ => self.get(i - 1).record_hash.as_deref(),
        }
    }

    /// The position of seq `seq` (`None` before the first record).
    fn position(&self, seq: u64) -> Option<usize> {
        seq.checked_sub(self.base + 1)
            .map(|p| usize::try_from(p).unwrap_or(usize::MAX))
    }

    /// Replaces the records through seq `through` by `checkpoint` (see
    /// [`Store::compact_ledger`]); `committed` is the run's committed
    /// length, moved with the positions. Returns how many records went.
    fn compact(
        &mut self,
        run_id: &str,
        through: u64,
        checkpoint: &StepRecord,
        committed: &mut usize,
    ) -> Result<u64, StoreError> {
        let stored = crate::compaction::stored_form(run_id, checkpoint)?;
        let replaced = stored.replaced.as_str();
        self.read_range(run_id, self.len, self.len);
        let at = self.position(through).filter(|p| *p < self.len);
        let found = at.map(|p| {
            let hash = self.get(p).record_hash.as_deref().map(str::to_string);
            let seq = |n: usize| (self.base + n as u64) as i64;
            (hash, seq(*committed), seq(self.len))
        });
        crate::compaction::admit(run_id, through as i64, found, replaced)?;
        let at = at.unwrap_or_default();
        let kept: Vec<Kept> = std::mem::take(&mut self.chunks)
            .into_iter()
            .flatten()
            .skip(at + 1)
            .collect();
        self.len = 0;
        self.push(checkpoint.clone());
        for k in kept {
            self.push_kept(k);
        }
        self.linked = self.len;
        self.base = through - 1;
        self.anchor = Some(replaced.into());
        *committed -= at;
        // The seal, linked when next read; committed with the rest.
        if *committed == self.len {
            *committed += 1;
        }
        self.push(stored.seal);
        Ok(at as u64 + 1)
    }

    /// Links the records not linked yet, and returns those from `from` on
    /// (of run `run_id`).
    fn read_from(&mut self, run_id: &str, from: usize) -> Vec<StepRecord> {
        self.read_range(run_id, from, usize::MAX)
    }

    /// Links the records not linked yet, and returns those at positions
    /// `from..to` (of run `run_id`).
    fn read_range(&mut self, run_id: &str, from: usize, to: usize) -> Vec<StepRecord> {
        let mut head: Option<String> = match self.linked {
            0 => None,
            n => self.get(n - 1).record_hash.as_deref().map(str::to_string),
        };
        for i in self.linked..self.len {
            let mut record = self.get(i).record(run_id, None);
            link(&mut head, &mut record);
            self.chunks[i / CHUNK][i % CHUNK].record_hash =
                record.record_hash.map(String::into_boxed_str);
        }
        self.linked = self.len;
        (from..to.min(self.len))
            .map(|i| self.get(i).record(run_id, self.prev_of(i)))
            .collect()
    }
}

fn append_chained(ledgers: &mut ByRun<Ledger>, records: &[StepRecord]) {
    append_owned(ledgers, records.iter().cloned());
}

fn append_owned(ledgers: &mut ByRun<Ledger>, records: impl IntoIterator<Item = StepRecord>) {
    for r in records {
        match ledgers.get_mut(&r.run_id) {
            Some(ledger) => ledger.push(r),
            None => {
                let mut ledger = Ledger::default();
                let id = r.run_id.clone();
                ledger.push(r);
                ledgers.insert(id, ledger);
            }
        }
    }
}

/// Makes `stored` equal to `run`, reusing what it already holds: a commit
/// usually changes a few vars of a run, and copying the rest again would
/// cost most of an in-memory step.
fn update_run(stored: &mut RunState, run: &RunState, changed: Option<&[String]>) {
    // Every field, by name: a field added to RunState must be added here.
    let RunState {
        version,
        run_id,
        workflow_id,
        workflow_version,
        status,
        current_node,
        vars,
        waiting,
        output,
        error,
        created_at,
        updated_at,
        actor_id,
        session_id,
        parent_run_id,
    } = run;
    stored.version = *version;
    stored.run_id.clone_from(run_id);
    stored.workflow_id.clone_from(workflow_id);
    stored.workflow_version = *workflow_version;
    stored.status = *status;
    stored.current_node.clone_from(current_node);
    match changed {
        None => update_map(&mut stored.vars, vars),
        Some(keys) => {
            for k in keys {
                match (stored.vars.get_mut(k), vars.get(k)) {
                    (Some(d), Some(s)) => update_value(d, s),
                    (None, Some(s)) => {
                        stored.vars.insert(k.clone(), s.clone());
                    }
                    (Some(_), None) => {
                        stored.vars.remove(k);
                    }
                    (None, None) => {}
                }
            }
        }
    }
    stored.waiting.clone_from(waiting);
    match (&mut stored.output, output) {
        (Some(d), Some(s)) => update_value(d, s),
        (d, s) => d.clone_from(s),
    }
    stored.error.clone_from(error);
    stored.created_at.clone_from(created_at);
    stored.updated_at.clone_from(updated_at);
    stored.actor_id.clone_from(actor_id);
    stored.session_id.clone_from(session_id);
    stored.parent_run_id.clone_from(parent_run_id);
}

fn update_map(
    dst: &mut serde_json::Map<String, serde_json::Value>,
    src: &serde_json::Map<String, serde_json::Value>,
) {
    // Usually the same keys: one pass over both (sorted) maps, no lookups.
    if dst.len() == src.len() {
        let mut same = true;
        for ((dk, dv), (sk, sv)) in dst.iter_mut().zip(src) {
            if dk != sk {
                same = false;
                break;
            }
            update_value(dv, sv);
        }
        if same {
            return;
        }
    }
    dst.retain(|k, _| src.contains_key(k));
    for (k, v) in src {
        match dst.get_mut(k) {
            Some(d) => update_value(d, v),
            None => {
                dst.insert(k.clone(), v.clone());
            }
        }
    }
}

fn update_value(dst: &mut serde_json::Value, src: &serde_json::Value) {
    use serde_json::Value;
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => update_map(d, s),
        (d, s) => {
            if *d != *s {
                *d = s.clone();
            }
        }
    }
}

impl Tables {
    /// Stores a new run, after every run stored before it.
    fn insert_slot(
        &mut self,
        run: &RunState,
        lease: Option<(String, DateTime<Utc>)>,
        committed: usize,
    ) {
        self.next_seq += 1;
        let slot = Slot {
            seq: self.next_seq,
            run: run.clone(),
            lease,
            committed,
            defer: None,
            defer_reason: None,
        };
        self.runs.insert(run.run_id.clone(), slot);
    }

    fn quarantine_reason(&self, run_id: &str) -> Option<&str> {
        self.quarantined
            .iter()
            .find(|(id, _)| id == run_id)
            .map(|(_, why)| why.as_str())
    }

    /// Checks `fence` against the stored run `run_id`.
    fn check(&self, run_id: &str, fence: &Fence<'_>) -> Result<(), StoreError> {
        if let Some(reason) = self.quarantine_reason(run_id) {
            return Err(StoreError::conflict(format!(
                "run {run_id} is quarantined: {reason}"
            )));
        }
        let slot = self.runs.get(run_id);
        match (fence.version, slot) {
            (0, None) => Ok(()),
            (0, Some(_)) => Err(StoreError::conflict(format!("run {run_id} already exists"))),
            (_, None) => Err(StoreError::conflict(format!("run {run_id} does not exist"))),
            (v, Some(slot)) => {
                if slot.run.version != v {
                    return Err(StoreError::conflict(format!(
                        "run {run_id} is at version {}, not {v}",
                        slot.run.version
                    )));
                }
                let lease = slot.lease.as_ref().map(|(h, u)| (h.as_str(), *u));
                if !fence.admits(lease) {
                    return Err(StoreError::conflict(format!(
                        "run {run_id} is leased by {}, not {}",
                        lease.map_or("nobody", |l| l.0),
                        fence.holder.unwrap_or("-")
                    )));
                }
                Ok(())
            }
        }
    }
}

impl Store for MemoryStore {
    fn indexer(&self) -> std::sync::Arc<dyn super::RunIndexer> {
        self.indexer.get()
    }

    /// Attribution is computed when listed: nothing to index again.
    fn set_indexer(
        &self,
        indexer: std::sync::Arc<dyn super::RunIndexer>,
    ) -> Result<(), StoreError> {
        self.indexer.set(indexer);
        Ok(())
    }

    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        Ok(self.tables.lock().runs.get(run_id).map(|s| s.run.clone()))
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        let mut t = self.tables.lock();
        if let Some(slot) = t.runs.get(&run.run_id) {
            return Ok((slot.run.clone(), false));
        }
        t.insert_slot(run, None, 0);
        Ok((run.clone(), true))
    }

    fn claim(&self, run_id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        let mut t = self.tables.lock();
        if let Some(reason) = t.quarantine_reason(run_id) {
            return Ok(Claim::Quarantined {
                reason: reason.to_string(),
            });
        }
        let Some(slot) = t.runs.get_mut(run_id) else {
            return Ok(Claim::Missing);
        };
        if let Some((holder, until)) = &slot.lease {
            if lease.blocked_by(holder, *until) {
                return Ok(Claim::Busy {
                    holder: Some(holder.clone()),
                    until: Some(format_time(*until)),
                });
            }
        }
        slot.lease = Some((lease.holder.to_string(), lease.until));
        Ok(Claim::Held(Box::new(slot.run.clone())))
    }

    fn renew(
        &self,
        holder: &str,
        run_ids: &[String],
        until: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let mut t = self.tables.lock();
        for id in run_ids {
            if let Some(slot) = t.runs.get_mut(id) {
                if let Some((h, u)) = slot.lease.as_mut() {
                    if h == holder {
                        *u = until;
                    }
                }
            }
        }
        Ok(())
    }

    fn release(&self, run_id: &str, holder: &str) -> Result<(), StoreError> {
        let mut t = self.tables.lock();
        if let Some(slot) = t.runs.get_mut(run_id) {
            if slot.lease.as_ref().is_some_and(|(h, _)| h == holder) {
                slot.lease = None;
            }
        }
        Ok(())
    }

    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.commit_records(records.iter().cloned(), run, fence, lease, None)
    }

    fn commit_owned(
        &self,
        records: Vec<StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.commit_records(records, run, fence, lease, None)
    }

    /// Updates only the `changed` vars of the stored run: the fence has
    /// just found it at `fence.version`, the state whose vars differ from
    /// `run`'s only there.
    fn commit_changed(
        &self,
        records: Vec<StepRecord>,
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
        changed: &[String],
    ) -> Result<(), StoreError> {
        self.commit_records(records, run, fence, lease, Some(changed))
    }

    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        let mut t = self.tables.lock();
        for r in records {
            t.check(&r.run_id, &fence)?;
        }
        append_chained(&mut t.ledgers, records);
        Ok(())
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        let mut t = self.tables.lock();
        let t = &mut *t;
        // Evidence outside any transition is not ahead of the state: a run
        // with nothing ahead moves its committed mark past it.
        let before: Vec<(String, usize)> = records
            .iter()
            .map(|r| {
                let len = t.ledgers.get(&r.run_id).map_or(0, |l| l.len);
                (r.run_id.clone(), len)
            })
            .collect();
        append_chained(&mut t.ledgers, records);
        for (id, len) in before {
            let now = t.ledgers.get(&id).map_or(0, |l| l.len);
            if let Some(slot) = t.runs.get_mut(&id) {
                if slot.committed == len {
                    slot.committed = now;
                }
            }
        }
        Ok(())
    }

    fn list_ahead(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let mut t = self.tables.lock();
        let from = t.runs.get(run_id).map_or(0, |s| s.committed);
        Ok(t.ledgers
            .get_mut(run_id)
            .map(|l| l.read_from(run_id, from))
            .unwrap_or_default())
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self
            .tables
            .lock()
            .ledgers
            .get_mut(run_id)
            .map(|l| l.read_from(run_id, 0))
            .unwrap_or_default())
    }

    fn list_records_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> Result<Vec<StepRecord>, StoreError> {
        let mut t = self.tables.lock();
        let Some(l) = t.ledgers.get_mut(run_id) else {
            return Ok(Vec::new());
        };
        let at = |seq: u64| l.position(seq.saturating_add(1)).unwrap_or_default();
        let (from, to) = (at(after), at(through));
        Ok(l.read_range(run_id, from, to))
    }

    fn list_records_page(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, StepRecord)>, StoreError> {
        let mut t = self.tables.lock();
        let Some(l) = t.ledgers.get_mut(run_id) else {
            return Ok(Vec::new());
        };
        let from = l.position(after.saturating_add(1)).unwrap_or_default();
        let first = l.base + from as u64 + 1;
        let page = l.read_range(run_id, from, from.saturating_add(limit));
        Ok((first..).zip(page).collect())
    }

    fn compacts_ledgers(&self) -> bool {
        true
    }

    fn compact_ledger(
        &self,
        run_id: &str,
        through: u64,
        checkpoint: &StepRecord,
    ) -> Result<u64, StoreError> {
        let mut t = self.tables.lock();
        let t = &mut *t;
        let (Some(ledger), Some(slot)) = (t.ledgers.get_mut(run_id), t.runs.get_mut(run_id)) else {
            return Err(StoreError::conflict(format!(
                "run {run_id} has no ledger to compact"
            )));
        };
        ledger.compact(run_id, through, checkpoint, &mut slot.committed)
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let t = self.tables.lock();
        let mut found: Vec<&Slot> = t
            .runs
            .values()
            .filter(|s| t.quarantine_reason(&s.run.run_id).is_none())
            .collect();
        found.sort_by_key(|s| s.seq);
        Ok(query
            .page(found, |s| &s.run.run_id, |s| query.matches(&s.run))
            .into_iter()
            .map(|s| s.run.clone())
            .collect())
    }

    /// Built from the runs in memory without copying them (the default
    /// copies every run first).
    fn list_run_index(
        &self,
        query: &super::RunIndexQuery,
    ) -> Result<Vec<super::RunIndexRow>, StoreError> {
        let indexer = self.indexer.get();
        let roots = indexer.turn_roots();
        let t = self.tables.lock();
        let mut found: Vec<(u64, super::RunIndexRow)> = t
            .runs
            .values()
            .filter(|s| {
                query.status.is_none_or(|st| s.run.status == st)
                    && query
                        .workflow_id
                        .as_ref()
                        .is_none_or(|w| s.run.workflow_id == *w)
                    && query
                        .session_id
                        .as_ref()
                        .is_none_or(|id| s.run.session_id.as_ref() == Some(id))
                    && t.quarantine_reason(&s.run.run_id).is_none()
            })
            .map(|s| (s.seq, super::RunIndexRow::of(&s.run, indexer.as_ref())))
            .filter(|(_, row)| query.matches(row, &roots))
            .collect();
        found.sort_by_key(|(seq, _)| *seq);
        if !query.oldest_first {
            found.reverse();
        }
        Ok(found
            .into_iter()
            .take(query.limit.unwrap_or(usize::MAX))
            .map(|(_, row)| row)
            .collect())
    }

    fn list_due(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        let t = self.tables.lock();
        let mut due: Vec<(DateTime<Utc>, u64, &str)> = t
            .runs
            .values()
            .filter(|s| t.quarantine_reason(&s.run.run_id).is_none())
            .filter(|s| s.defer.is_none_or(|(until, _)| until <= now))
            .filter_map(|s| {
                wait_due_at(&s.run)
                    .filter(|at| *at <= now)
                    .map(|at| (at, s.seq, s.run.run_id.as_str()))
            })
            .collect();
        due.sort();
        Ok(due
            .into_iter()
            .take(limit)
            .map(|(_, _, id)| id.to_string())
            .collect())
    }

    fn list_claimable(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<String>, StoreError> {
        let t = self.tables.lock();
        let mut found: Vec<&Slot> = t
            .runs
            .values()
            .filter(|s| {
                s.run.status == RunStatus::Running
                    && s.lease.as_ref().is_none_or(|(_, until)| *until < now)
                    && t.quarantine_reason(&s.run.run_id).is_none()
                    && s.defer.is_none_or(|(until, _)| until <= now)
            })
            .collect();
        found.sort_by_key(|s| (s.defer.map(|(until, _)| until), s.seq));
        Ok(found
            .into_iter()
            .take(limit)
            .map(|s| s.run.run_id.clone())
            .collect())
    }

    fn list_leased(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        let t = self.tables.lock();
        let mut found: Vec<(u64, String, String)> = t
            .runs
            .values()
            .filter(|s| {
                s.run.status == RunStatus::Running && t.quarantine_reason(&s.run.run_id).is_none()
            })
            .filter_map(|s| {
                s.lease
                    .as_ref()
                    .map(|(h, _)| (s.seq, s.run.run_id.clone(), h.clone()))
            })
            .collect();
        found.sort();
        Ok(found
            .into_iter()
            .take(limit)
            .map(|(_, id, h)| (id, h))
            .collect())
    }

    fn defer(
        &self,
        run_id: &str,
        reason: Option<&str>,
        until: &dyn Fn(u32) -> DateTime<Utc>,
    ) -> Result<u32, StoreError> {
        let mut t = self.tables.lock();
        let Some(slot) = t.runs.get_mut(run_id) else {
            return Ok(0);
        };
        let count = slot.defer.map_or(0, |(_, n)| n).saturating_add(1);
        slot.defer = Some((until(count), count));
        slot.defer_reason = reason.map(str::to_string);
        Ok(count)
    }

    fn deferral(&self, run_id: &str) -> Result<Option<Deferral>, StoreError> {
        Ok(self.tables.lock().runs.get(run_id).and_then(|s| {
            s.defer.map(|(until, count)| Deferral {
                until,
                count,
                reason: s.defer_reason.clone(),
            })
        }))
    }

    fn quarantine(&self, run_id: &str, reason: &str) -> Result<(), StoreError> {
        let mut t = self.tables.lock();
        if t.quarantine_reason(run_id).is_none() {
            t.quarantined.push((run_id.to_string(), reason.to_string()));
        }
        Ok(())
    }

    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        Ok(self.tables.lock().quarantined.clone())
    }

    fn deploy(&self, d: &crate::Deployment<'_>) -> Result<Vec<crate::Deployed>, StoreError> {
        let mut kept = self.deployments.lock();
        let planned = crate::deployments::plan(&kept.versions, d);
        if kept.files.get(&d.files.digest) != Some(&d.files.files) {
            kept.files
                .insert(d.files.digest.clone(), d.files.files.clone());
        }
        for p in planned.iter().filter(|p| !p.unchanged) {
            kept.versions.push(p.version.clone());
        }
        Ok(planned)
    }

    fn workflow_version(
        &self,
        workflow_id: &str,
        version: Option<u32>,
    ) -> Result<Option<crate::WorkflowVersion>, StoreError> {
        let kept = self.deployments.lock();
        Ok(crate::deployments::pick(
            &kept.versions,
            workflow_id,
            version,
        ))
    }

    fn workflow_versions(
        &self,
        workflow_id: Option<&str>,
    ) -> Result<Vec<crate::WorkflowVersion>, StoreError> {
        let kept = self.deployments.lock();
        Ok(crate::deployments::select(&kept.versions, workflow_id))
    }

    fn bundle_files(&self, digest: &str) -> Result<Vec<crate::bundles::BundleFile>, StoreError> {
        Ok(self
            .deployments
            .lock()
            .files
            .get(digest)
            .cloned()
            .unwrap_or_default())
    }

    fn delete_runs(&self, run_ids: &[String]) -> Result<crate::Deleted, StoreError> {
        let mut t = self.tables.lock();
        let mut out = crate::Deleted::default();
        if run_ids
            .iter()
            .any(|id| t.runs.get(id).is_some_and(|s| !s.run.status.is_terminal()))
        {
            return Ok(out);
        }
        for id in run_ids {
            if !t.runs.contains_key(id) {
                continue;
            }
            t.runs.remove(id);
            if let Some(ledger) = t.ledgers.remove(id) {
                out.records += ledger.len as u64;
            }
            t.quarantined.retain(|(q, _)| q != id);
            out.runs.push(id.clone());
        }
        Ok(out)
    }

    fn remove_versions(&self, versions: &[crate::WorkflowVersion]) -> Result<usize, StoreError> {
        let mut kept = self.deployments.lock();
        let removed = crate::deployments::remove(&mut kept.versions, versions);
        let Deployments { versions, files } = &mut *kept;
        files.retain(|digest, _| versions.iter().any(|v| &v.digest == digest));
        Ok(removed)
    }

    fn append_event(&self, event: &super::InboxEvent) -> Result<super::EventAppend, StoreError> {
        let mut inbox = self.inbox.lock();
        let stream = inbox.entry(event.stream.clone()).or_default();
        if let Some(found) = stream.iter().find(|e| e.dedupe_key == event.dedupe_key) {
            return Ok(super::EventAppend {
                seq: found.seq,
                duplicate: true,
            });
        }
        let seq = stream.last().map_or(0, |e| e.seq) + 1;
        stream.push(super::InboxEvent {
            seq,
            ..event.clone()
        });
        Ok(super::EventAppend {
            seq,
            duplicate: false,
        })
    }

    fn events_after(
        &self,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<super::InboxEvent>, StoreError> {
        let inbox = self.inbox.lock();
        Ok(inbox
            .get(stream)
            .map(|events| {
                let start = events.partition_point(|e| e.seq <= after);
                events[start..]
                    .iter()
                    .filter(|e| !e.appended_at.is_empty())
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    fn prune_events(
        &self,
        stream: &str,
        through: u64,
        before: DateTime<Utc>,
        dry_run: bool,
    ) -> Result<u64, StoreError> {
        let old = |at: &str| DateTime::parse_from_rfc3339(at).is_ok_and(|t| t < before);
        let mut inbox = self.inbox.lock();
        let mut dropped = 0;
        // A dropped event keeps its seq and key, with no time (what
        // `events_after` skips) and no payload.
        for e in inbox.get_mut(stream).into_iter().flatten() {
            if e.seq <= through && !e.appended_at.is_empty() && old(&e.appended_at) {
                dropped += 1;
                if !dry_run {
                    e.appended_at.clear();
                    e.payload = serde_json::Value::Null;
                }
            }
        }
        Ok(dropped)
    }

    fn create_connection(&self, connection: &super::ConnectionRecord) -> Result<(), StoreError> {
        let mut all = self.connections.lock();
        if all
            .iter()
            .any(|c| c.connection_id == connection.connection_id)
        {
            return Err(StoreError::conflict(format!(
                "connection {} already exists",
                connection.connection_id
            )));
        }
        all.push(connection.clone());
        Ok(())
    }

    fn update_connection(
        &self,
        id: &str,
        change: &mut dyn FnMut(&mut super::ConnectionRecord) -> Result<(), StoreError>,
    ) -> Result<Option<super::ConnectionRecord>, StoreError> {
        let mut all = self.connections.lock();
        let Some(slot) = all.iter_mut().find(|c| c.connection_id == id) else {
            return Ok(None);
        };
        let mut next = slot.clone();
        change(&mut next)?;
        *slot = next.clone();
        Ok(Some(next))
    }

    fn get_connection(&self, id: &str) -> Result<Option<super::ConnectionRecord>, StoreError> {
        Ok(self
            .connections
            .lock()
            .iter()
            .find(|c| c.connection_id == id)
            .cloned())
    }

    fn list_connections(&self) -> Result<Vec<super::ConnectionRecord>, StoreError> {
        Ok(self.connections.lock().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use stepwell_model::model::EffectRecord;

    fn record(n: u32, ended: Option<&str>, result: Option<serde_json::Value>) -> StepRecord {
        StepRecord {
            step_id: format!("step-{n}"),
            run_id: "run-1".into(),
            node_id: n.is_multiple_of(2).then(|| format!("n{n}")),
            status: if ended.is_some() {
                StepStatus::Completed
            } else {
                StepStatus::Started
            },
            effect: n.is_multiple_of(3).then(|| EffectRecord {
                kind: "wait_event".into(),
                payload: json!({ "event": "e", "n": n }),
                result_key: Some("got".into()),
            }),
            result,
            error: (n == 4).then(|| "effect_failed: no".into()),
            started_at: "2026-11-30T09:00:00.000000Z".into(),
            ended_at: ended.map(str::to_string),
            attempt: n,
            idempotency_key: n.is_multiple_of(3).then(|| format!("run-1:{n}")),
            prev_hash: None,
            record_hash: None,
            vars: None,
            input: None,
        }
    }

    /// What the store keeps reads back as what was committed, hashes chained.
    #[test]
    fn kept_records_read_back_equal_and_chained() {
        let records = vec![
            record(
                1,
                Some("2026-11-30T09:00:00.000000Z"),
                Some(json!({"next_node": "n2"})),
            ),
            record(2, None, None),
            record(3, Some("2026-11-30T09:00:01.500000Z"), Some(json!(null))),
            record(
                4,
                Some("2026-11-30T09:00:00.000000Z"),
                Some(
                    json!({"x": [1.5, -0.1, 1e300, 18446744073709551615u64, -9223372036854775808i64, "é\u{0}"]}),
                ),
            ),
            record(
                6,
                Some("2026-11-30T09:00:02.000000Z"),
                Some(json!({"b": 1, "a": {"z": true}})),
            ),
        ];
        // `next_node` results of other shapes than the one kept compactly.
        for (n, result) in [
            (10, json!({"next_node": 5})),
            (11, json!({"next_node": "n2", "x": 1})),
            (12, json!({"next_node": {"n": "n2"}})),
            (13, json!({"next_node": ""})),
        ] {
            let mut ledgers = ByRun::default();
            let r = record(n, Some("2026-11-30T09:00:00.000000Z"), Some(result));
            append_owned(&mut ledgers, vec![r.clone()]);
            let back = ledgers.get_mut("run-1").unwrap().read_from("run-1", 0);
            assert_eq!(back[0].result, r.result);
            assert!(crate::verify_chain(&back).is_ok());
        }
        let mut ledgers = ByRun::default();
        append_owned(&mut ledgers, records.clone());
        let ledger = ledgers.get_mut("run-1").unwrap();
        let back = ledger.read_from("run-1", 0);
        assert_eq!(back.len(), records.len());
        for (a, b) in records.iter().zip(&back) {
            let mut b = b.clone();
            b.prev_hash = None;
            b.record_hash = None;
            assert_eq!(*a, b);
        }
        assert!(back.iter().all(|r| r.record_hash.is_some()));
        assert_eq!(back[0].prev_hash, None);
        assert_eq!(back[3].prev_hash, back[2].record_hash);
        assert!(crate::verify_chain(&back).is_ok());
        // Records added after a read link on to the chain.
        append_owned(&mut ledgers, vec![record(7, None, None)]);
        let ledger = ledgers.get_mut("run-1").unwrap();
        let tail = ledger.read_from("run-1", 4);
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0], back[4]);
        assert_eq!(tail[1].prev_hash, back[4].record_hash);
        assert!(crate::verify_chain(&ledger.read_from("run-1", 0)).is_ok());
        // Results nested deeper than serde_json reads back from text.
        let deep = |levels: usize| (0..levels).fold(json!(1), |v, _| json!([v]));
        append_owned(
            &mut ledgers,
            vec![
                record(8, None, Some(deep(130))),
                record(9, None, Some(deep(100))),
            ],
        );
        let ledger = ledgers.get_mut("run-1").unwrap();
        let all = ledger.read_from("run-1", 0);
        assert_eq!(all[6].result, Some(deep(130)));
        assert_eq!(all[7].result, Some(deep(100)));
        assert!(crate::verify_chain(&all).is_ok());
    }

    /// Every in-memory step keeps one of these: it stays well below a
    /// StepRecord (what the store kept before), or memory-store runs get
    /// slower by the fresh pages they touch.
    #[test]
    fn kept_records_are_compact() {
        let kept = std::mem::size_of::<Kept>();
        let full = std::mem::size_of::<StepRecord>();
        assert!(kept * 2 <= full, "Kept {kept} bytes, StepRecord {full}");
    }
}

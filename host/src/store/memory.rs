//! The in-memory store: for tests and for embedding hosts that persist
//! elsewhere. Nothing survives the process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use parking_lot::RwLock;

use super::{link, wait_due_at, RunQuery, Store, StoreError};
use crate::core::model::{RunState, StepRecord};

/// Runs and ledgers in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: RwLock<HashMap<String, (u64, RunState)>>,
    ledgers: RwLock<HashMap<String, Vec<StepRecord>>>,
    bundles: RwLock<HashMap<String, PathBuf>>,
    next_seq: RwLock<u64>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn seq(&self) -> u64 {
        let mut s = self.next_seq.write();
        *s += 1;
        *s
    }
}

fn append_chained(ledgers: &mut HashMap<String, Vec<StepRecord>>, records: &[StepRecord]) {
    for r in records {
        let ledger = ledgers.entry(r.run_id.clone()).or_default();
        let mut head = ledger.last().and_then(|l| l.record_hash.clone());
        let mut r = r.clone();
        link(&mut head, &mut r);
        ledger.push(r);
    }
}

impl Store for MemoryStore {
    fn load_run(&self, run_id: &str) -> Result<Option<RunState>, StoreError> {
        Ok(self.runs.read().get(run_id).map(|(_, r)| r.clone()))
    }

    fn save_run(&self, run: &RunState) -> Result<(), StoreError> {
        let seq = self.seq();
        let mut runs = self.runs.write();
        match runs.get_mut(&run.run_id) {
            Some(slot) => slot.1 = run.clone(),
            None => {
                runs.insert(run.run_id.clone(), (seq, run.clone()));
            }
        }
        Ok(())
    }

    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        let seq = self.seq();
        let mut runs = self.runs.write();
        if let Some((_, existing)) = runs.get(&run.run_id) {
            return Ok((existing.clone(), false));
        }
        runs.insert(run.run_id.clone(), (seq, run.clone()));
        Ok((run.clone(), true))
    }

    fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        let runs = self.runs.read();
        let mut found: Vec<&(u64, RunState)> =
            runs.values().filter(|(_, r)| query.matches(r)).collect();
        found.sort_by_key(|(seq, _)| *seq);
        Ok(found
            .into_iter()
            .take(query.limit.unwrap_or(usize::MAX))
            .map(|(_, r)| r.clone())
            .collect())
    }

    fn list_due_waits(&self, now: DateTime<Utc>) -> Result<Vec<RunState>, StoreError> {
        let runs = self.runs.read();
        let mut due: Vec<(DateTime<Utc>, u64, &RunState)> = runs
            .values()
            .filter_map(|(seq, r)| wait_due_at(r).filter(|t| *t <= now).map(|t| (t, *seq, r)))
            .collect();
        due.sort_by_key(|(t, seq, _)| (*t, *seq));
        Ok(due.into_iter().map(|(_, _, r)| r.clone()).collect())
    }

    fn append_records(&self, records: &[StepRecord]) -> Result<(), StoreError> {
        append_chained(&mut self.ledgers.write(), records);
        Ok(())
    }

    fn commit(&self, records: &[StepRecord], run: &RunState) -> Result<(), StoreError> {
        // Atomic: both locks are held, so nobody sees the ledger ahead.
        let mut ledgers = self.ledgers.write();
        let mut runs = self.runs.write();
        append_chained(&mut ledgers, records);
        match runs.get_mut(&run.run_id) {
            Some(slot) => slot.1 = run.clone(),
            None => {
                drop(runs);
                drop(ledgers);
                return self.save_run(run);
            }
        }
        Ok(())
    }

    fn list_records(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        Ok(self.ledgers.read().get(run_id).cloned().unwrap_or_default())
    }

    fn put_bundle(&self, workflow_id: &str, dir: &Path) -> Result<(), StoreError> {
        self.bundles
            .write()
            .insert(workflow_id.to_string(), dir.to_path_buf());
        Ok(())
    }

    fn bundle_dir(&self, workflow_id: &str) -> Result<Option<PathBuf>, StoreError> {
        Ok(self.bundles.read().get(workflow_id).cloned())
    }
}

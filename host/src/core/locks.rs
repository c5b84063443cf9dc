//! Per-run locks: `tick` holds its run's lock for the whole tick, `resume`
//! for its check and commit, so a wait is resumed at most once and a tick
//! never overwrites a concurrent change. Re-entrant, so a tick that resumes
//! other runs (an event) or runs a child (a subworkflow) can meet its own run
//! again without deadlocking. The table belongs to one [`Runtime`] (share
//! the runtime, it is cheap to clone); several runtimes or processes on one
//! store need leases (see docs/storage.md).
//!
//! [`Runtime`]: crate::Runtime

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::lock_api::ArcReentrantMutexGuard;
use parking_lot::{Mutex, RawMutex, RawThreadId, ReentrantMutex};

type Slot = Arc<ReentrantMutex<()>>;

/// The lock table of one runtime.
#[derive(Debug, Default)]
pub struct RunLocks {
    table: Mutex<HashMap<String, Slot>>,
}

/// Holds one run's lock until dropped.
pub struct RunLockGuard<'a> {
    locks: &'a RunLocks,
    run_id: String,
    guard: Option<ArcReentrantMutexGuard<RawMutex, RawThreadId, ()>>,
}

impl RunLocks {
    /// Locks `run_id`, blocking while another thread holds it.
    pub fn lock(&self, run_id: &str) -> RunLockGuard<'_> {
        let slot = self
            .table
            .lock()
            .entry(run_id.to_string())
            .or_default()
            .clone();
        RunLockGuard {
            locks: self,
            run_id: run_id.to_string(),
            guard: Some(slot.lock_arc()),
        }
    }
}

impl Drop for RunLockGuard<'_> {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let slot = ArcReentrantMutexGuard::remutex(&guard).clone();
        drop(guard);
        let mut table = self.locks.table.lock();
        // The table's Arc plus ours: nobody else holds or waits for this run.
        if Arc::strong_count(&slot) == 2 {
            table.remove(&self.run_id);
        }
    }
}

//! The in-process fast path of the run transaction: one lock per run inside
//! a [`Runtime`], taken before the run's store lease, so threads of one
//! process queue on a mutex instead of polling the store. The store's
//! version check and lease are the guarantee; this table only saves work.
//!
//! A thread that already holds a run's lock and asks for it again gets an
//! error, not a deadlock (no effect may re-enter the run that is executing
//! it).
//!
//! [`Runtime`]: crate::Runtime

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::lock_api::ArcReentrantMutexGuard;
use parking_lot::{Mutex, RawMutex, RawThreadId, ReentrantMutex};

/// The `bool` says whether a guard of this thread is alive.
type Slot = Arc<ReentrantMutex<Cell<bool>>>;

/// The lock table of one runtime.
#[derive(Debug, Default)]
pub struct RunLocks {
    table: Mutex<HashMap<String, Slot>>,
}

/// Holds one run's lock until dropped.
pub struct RunLockGuard<'a> {
    locks: &'a RunLocks,
    run_id: String,
    guard: Option<ArcReentrantMutexGuard<RawMutex, RawThreadId, Cell<bool>>>,
}

/// Why [`RunLocks::lock`] did not lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockRefused {
    /// Another thread held it for the whole wait.
    Busy,
    /// This thread holds it already.
    Reentered,
}

impl RunLocks {
    /// Locks `run_id`, waiting at most `wait` while another thread holds it.
    pub fn lock(&self, run_id: &str, wait: Duration) -> Result<RunLockGuard<'_>, LockRefused> {
        let slot = self
            .table
            .lock()
            .entry(run_id.to_string())
            .or_default()
            .clone();
        let guard = if wait.is_zero() {
            slot.try_lock_arc()
        } else {
            slot.try_lock_arc_for(wait)
        };
        let mut out = RunLockGuard {
            locks: self,
            run_id: run_id.to_string(),
            guard: None,
        };
        let Some(guard) = guard else {
            drop(slot);
            // Drop cleans the table entry up.
            return Err(LockRefused::Busy);
        };
        if guard.get() {
            // Re-entry: release this second hold at once.
            drop(guard);
            drop(slot);
            return Err(LockRefused::Reentered);
        }
        guard.set(true);
        out.guard = Some(guard);
        drop(slot);
        Ok(out)
    }
}

impl Drop for RunLockGuard<'_> {
    fn drop(&mut self) {
        let mut table = self.locks.table.lock();
        if let Some(guard) = self.guard.take() {
            guard.set(false);
            drop(guard);
        }
        // The table's Arc alone: nobody else holds or waits for this run.
        if table
            .get(&self.run_id)
            .is_some_and(|slot| Arc::strong_count(slot) == 1)
        {
            table.remove(&self.run_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_hold_of_one_thread_is_refused_and_the_table_empties() {
        let locks = RunLocks::default();
        let a = locks.lock("r", Duration::ZERO).unwrap();
        assert_eq!(
            locks.lock("r", Duration::from_millis(5)).err(),
            Some(LockRefused::Reentered)
        );
        let other = std::thread::scope(|s| {
            s.spawn(|| locks.lock("r", Duration::from_millis(20)).err())
                .join()
                .unwrap()
        });
        assert_eq!(other, Some(LockRefused::Busy));
        drop(a);
        assert!(locks.table.lock().is_empty());
        let b = locks.lock("r", Duration::ZERO).unwrap();
        drop(b);
        assert!(locks.table.lock().is_empty());
    }
}

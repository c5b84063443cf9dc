//! Ledger subscriptions: records handed to in-process subscribers as this
//! runtime commits them.

use super::model::StepRecord;
use super::runtime::Runtime;

pub(crate) struct Subscriber {
    run_id: Option<String>,
    sender: std::sync::mpsc::Sender<StepRecord>,
}

impl Runtime {
    /// Subscribes to ledger records as this runtime commits them: every
    /// record of `run_id`, or of every run with `None`, in commit order,
    /// delivered after the commit returned. Records committed by other
    /// runtimes or processes are not seen (poll the store for those, as
    /// `stepwell ledger --follow` does). Dropping the receiver unsubscribes.
    pub fn subscribe_ledger(&self, run_id: Option<&str>) -> std::sync::mpsc::Receiver<StepRecord> {
        let (sender, receiver) = std::sync::mpsc::channel();
        self.inner.subscribers.lock().push(Subscriber {
            run_id: run_id.map(str::to_string),
            sender,
        });
        receiver
    }

    /// The run's ledger records after its first `after` (seq `after + 1`
    /// onwards), offloaded values loaded back: what a follower of the run
    /// has not seen yet, committed by any process.
    pub fn ledger_after(&self, run_id: &str, after: u64) -> crate::Result<Vec<StepRecord>> {
        self.loaded_records(self.store().list_records_after(run_id, after)?)
    }

    /// The run's ledger records with seqs `after + 1 ..= through`,
    /// offloaded values loaded back (one change-feed entry's records).
    pub fn ledger_range(
        &self,
        run_id: &str,
        after: u64,
        through: u64,
    ) -> crate::Result<Vec<StepRecord>> {
        self.loaded_records(self.store().list_records_range(run_id, after, through)?)
    }

    /// Whether anyone follows the records as they are committed.
    pub(crate) fn has_subscribers(&self) -> bool {
        !self.inner.subscribers.lock().is_empty()
    }

    pub(crate) fn publish(&self, records: &[StepRecord]) {
        let mut subscribers = self.inner.subscribers.lock();
        if !subscribers.is_empty() {
            subscribers.retain(|s| {
                records
                    .iter()
                    .filter(|r| s.run_id.as_deref().is_none_or(|id| id == r.run_id))
                    .all(|r| s.sender.send(r.clone()).is_ok())
            });
        }
    }
}

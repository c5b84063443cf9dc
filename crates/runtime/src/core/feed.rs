//! Ledger subscriptions: records handed to in-process subscribers as this
//! runtime commits them.

use super::model::StepRecord;
use super::runtime::Runtime;
use crate::store::{ChainBreak, ChainVerifier};

/// How many records a ledger read takes from the store at a time
/// ([`Runtime::ledger_pages`], [`Runtime::check_ledger`], the API's
/// ledger routes): memory held by a read is bounded by a page, whatever
/// the ledger's length.
pub const LEDGER_PAGE: u64 = 1000;

/// What [`Runtime::check_ledger`] found.
#[derive(Debug, Clone)]
pub struct LedgerCheck {
    /// How many records the ledger holds.
    pub records: usize,
    /// The hash of its newest record (`None` when empty), or the first
    /// record that was changed, removed or reordered.
    pub verdict: Result<Option<String>, ChainBreak>,
    /// What the ledger's checkpoint says, when retention compacted it: the
    /// chain is proven from the record it replaced last.
    pub checkpoint: Option<crate::store::compaction::CheckpointBody>,
}

/// A run's ledger read a page at a time ([`Runtime::ledger_pages`]): each
/// page holds records with their seqs.
pub struct LedgerPages<'a> {
    rt: &'a Runtime,
    run_id: String,
    after: u64,
    done: bool,
}

impl Iterator for LedgerPages<'_> {
    type Item = crate::Result<Vec<(u64, StepRecord)>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let page = self
            .rt
            .ledger_page(&self.run_id, self.after, LEDGER_PAGE as usize);
        match &page {
            Ok(records) => match records.last() {
                Some((seq, _)) => {
                    self.after = *seq;
                    self.done = (records.len() as u64) < LEDGER_PAGE;
                }
                None => {
                    self.done = true;
                    return None;
                }
            },
            Err(_) => self.done = true,
        }
        Some(page)
    }
}

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

    /// Up to `limit` of the run's ledger records whose seq is over
    /// `after`, oldest first, each with its seq, offloaded values loaded
    /// back ([`crate::Store::list_records_page`]).
    pub fn ledger_page(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> crate::Result<Vec<(u64, StepRecord)>> {
        let page = self.store().list_records_page(run_id, after, limit)?;
        let (seqs, records): (Vec<u64>, Vec<StepRecord>) = page.into_iter().unzip();
        Ok(seqs
            .into_iter()
            .zip(self.loaded_records(records)?)
            .collect())
    }

    /// The run's ledger records whose seq is over `after`, a page of
    /// [`LEDGER_PAGE`] records at a time, oldest first, each with its seq,
    /// offloaded values loaded back: a reader of a ledger of any length
    /// holds one page.
    pub fn ledger_pages(&self, run_id: &str, after: u64) -> LedgerPages<'_> {
        LedgerPages {
            rt: self,
            run_id: run_id.to_string(),
            after,
            done: false,
        }
    }

    /// Checks the run's ledger hash chain a page at a time (the stored
    /// records, which the chain covers) and counts its records: memory
    /// bounded by a page whatever the ledger's length. A record removed
    /// from the middle is found (the next one does not follow the one
    /// before it), however many seqs are missing.
    pub fn check_ledger(&self, run_id: &str) -> crate::Result<LedgerCheck> {
        let run = self.get_state(run_id)?;
        let mut verifier = ChainVerifier::default();
        let mut broken = None;
        let (mut after, mut records) = (0, 0usize);
        let mut checkpoint = None;
        loop {
            let page = self
                .store()
                .list_records_page(run_id, after, LEDGER_PAGE as usize)?;
            let Some((last, _)) = page.last() else {
                break;
            };
            if after == 0 {
                let first = page.first().and_then(|(seq, r)| {
                    crate::store::compaction::checkpoint_body(r).map(|b| (*seq, r, b))
                });
                if let Some((seq, r, mut body)) = first {
                    // A checkpoint stands at the seq of what it replaced,
                    // in the ledger of a run retention compacts.
                    if self.inner.plugins.compaction(self, &run).is_none() {
                        broken = Some(ChainBreak {
                            index: 1,
                            step_id: r.step_id.clone(),
                            problem: "checkpoint of a run never compacted",
                        });
                    } else if seq != body.through_seq {
                        broken = Some(ChainBreak {
                            index: 1,
                            step_id: r.step_id.clone(),
                            problem: "checkpoint inconsistent",
                        });
                    }
                    body.carried.clear();
                    checkpoint = Some(body);
                }
            }
            after = *last;
            records += page.len();
            if broken.is_none() {
                let page: Vec<StepRecord> = page.into_iter().map(|(_, r)| r).collect();
                broken = verifier.check(&page).err();
            }
        }
        if broken.is_none() {
            broken = verifier.finish().err();
        }
        Ok(LedgerCheck {
            records,
            verdict: match broken {
                Some(b) => Err(b),
                None => Ok(verifier.head().map(str::to_string)),
            },
            checkpoint,
        })
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

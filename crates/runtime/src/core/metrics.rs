//! Counters an operator scrapes (`GET /metrics` of `stepwell serve`):
//! steps committed, resumes, store commit latency (a [`Runtime`]'s own,
//! [`Metrics`]) and guest calls (its engine's, [`GuestCounts`]). Each is a
//! relaxed atomic: counting costs a few nanoseconds on the step loop and
//! takes no lock. Two runtimes in one process count apart, unless they are
//! given the same [`Metrics`] (`RuntimeBuilder::metrics`) or engine.
//!
//! [`Runtime`]: crate::Runtime

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use crate::wasm::GuestCounts;

/// The upper bounds (microseconds) of the commit-latency histogram's
/// buckets; the last bucket is everything above.
pub const COMMIT_BUCKETS_US: [u64; 10] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000,
];

/// What a runtime counts of its commits and resumes.
#[derive(Debug, Default)]
pub struct Metrics {
    records: AtomicU64,
    commits: AtomicU64,
    commit_us: AtomicU64,
    commit_histogram: [AtomicU64; COMMIT_BUCKETS_US.len() + 1],
    resumes: AtomicU64,
}

/// What a runtime and its engine counted since they were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Ledger records committed.
    pub records: u64,
    /// Store commits of run transitions.
    pub commits: u64,
    /// Their total time, in microseconds.
    pub commit_us: u64,
    /// How many commits took at most each bound of [`COMMIT_BUCKETS_US`]
    /// (not cumulative), and above the last one.
    pub commit_buckets: Vec<u64>,
    /// Waits resumed.
    pub resumes: u64,
    /// Node calls into guest components (the engine's).
    pub guest_calls: u64,
    /// Their total wall time, in microseconds.
    pub guest_us: u64,
    /// Node instances a tick made (or tried to) when it needed one, and
    /// waited for.
    pub instances_made: u64,
    /// Node instances a run found made ahead (`warm.rs`).
    pub instances_ahead: u64,
}

impl Metrics {
    /// Counts one commit of `records` records that took `took`.
    pub(crate) fn commit(&self, records: usize, took: Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        self.records.fetch_add(records as u64, Ordering::Relaxed);
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_us.fetch_add(us, Ordering::Relaxed);
        let bucket = COMMIT_BUCKETS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(COMMIT_BUCKETS_US.len());
        self.commit_histogram[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one resumed wait.
    pub(crate) fn resume(&self) {
        self.resumes.fetch_add(1, Ordering::Relaxed);
    }

    /// These counters now, with the guest counts `guests`.
    pub fn counters(&self, guests: GuestCounts) -> Counters {
        Counters {
            records: self.records.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            commit_us: self.commit_us.load(Ordering::Relaxed),
            commit_buckets: self
                .commit_histogram
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            resumes: self.resumes.load(Ordering::Relaxed),
            guest_calls: guests.calls,
            guest_us: guests.us,
            instances_made: guests.instances_made,
            instances_ahead: guests.instances_ahead,
        }
    }
}

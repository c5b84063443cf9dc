//! Process-wide counters an operator scrapes (`GET /metrics` of
//! `stepwell serve`): steps committed, resumes, guest time, store commit
//! latency. Each is a relaxed atomic: counting costs a few nanoseconds on
//! the step loop and takes no lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds (microseconds) of the commit-latency histogram's
/// buckets; the last bucket is everything above.
pub const COMMIT_BUCKETS_US: [u64; 10] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000,
];

static RECORDS: AtomicU64 = AtomicU64::new(0);
static COMMITS: AtomicU64 = AtomicU64::new(0);
static COMMIT_US: AtomicU64 = AtomicU64::new(0);
static COMMIT_HISTOGRAM: [AtomicU64; COMMIT_BUCKETS_US.len() + 1] =
    [const { AtomicU64::new(0) }; COMMIT_BUCKETS_US.len() + 1];
static RESUMES: AtomicU64 = AtomicU64::new(0);
static GUEST_CALLS: AtomicU64 = AtomicU64::new(0);
static GUEST_US: AtomicU64 = AtomicU64::new(0);
static INSTANCES_MADE: AtomicU64 = AtomicU64::new(0);
static INSTANCES_AHEAD: AtomicU64 = AtomicU64::new(0);

/// What this process counted since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Ledger records this process committed.
    pub records: u64,
    /// Store commits of run transitions.
    pub commits: u64,
    /// Their total time, in microseconds.
    pub commit_us: u64,
    /// How many commits took at most each bound of [`COMMIT_BUCKETS_US`]
    /// (not cumulative), and above the last one.
    pub commit_buckets: Vec<u64>,
    /// Waits resumed by this process.
    pub resumes: u64,
    /// Node calls into guest components.
    pub guest_calls: u64,
    /// Their total wall time, in microseconds.
    pub guest_us: u64,
    /// Node instances a tick made (or tried to) when it needed one, and
    /// waited for.
    pub instances_made: u64,
    /// Node instances a run found made ahead (`warm.rs`).
    pub instances_ahead: u64,
}

/// Counts one commit of `records` records that took `took`.
pub(crate) fn commit(records: usize, took: Duration) {
    let us = took.as_micros().min(u64::MAX as u128) as u64;
    RECORDS.fetch_add(records as u64, Ordering::Relaxed);
    COMMITS.fetch_add(1, Ordering::Relaxed);
    COMMIT_US.fetch_add(us, Ordering::Relaxed);
    let bucket = COMMIT_BUCKETS_US
        .iter()
        .position(|b| us <= *b)
        .unwrap_or(COMMIT_BUCKETS_US.len());
    COMMIT_HISTOGRAM[bucket].fetch_add(1, Ordering::Relaxed);
}

/// Counts one node instance a run needed: made ahead, or made then.
pub(crate) fn instance(ahead: bool) {
    if ahead {
        INSTANCES_AHEAD.fetch_add(1, Ordering::Relaxed);
    } else {
        INSTANCES_MADE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts one resumed wait.
pub(crate) fn resume() {
    RESUMES.fetch_add(1, Ordering::Relaxed);
}

/// Counts one guest call that took `took`.
pub(crate) fn guest_call(took: Duration) {
    GUEST_CALLS.fetch_add(1, Ordering::Relaxed);
    GUEST_US.fetch_add(
        took.as_micros().min(u64::MAX as u128) as u64,
        Ordering::Relaxed,
    );
}

/// The counters now.
pub fn counters() -> Counters {
    Counters {
        records: RECORDS.load(Ordering::Relaxed),
        commits: COMMITS.load(Ordering::Relaxed),
        commit_us: COMMIT_US.load(Ordering::Relaxed),
        commit_buckets: COMMIT_HISTOGRAM
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect(),
        resumes: RESUMES.load(Ordering::Relaxed),
        guest_calls: GUEST_CALLS.load(Ordering::Relaxed),
        guest_us: GUEST_US.load(Ordering::Relaxed),
        instances_made: INSTANCES_MADE.load(Ordering::Relaxed),
        instances_ahead: INSTANCES_AHEAD.load(Ordering::Relaxed),
    }
}

//! Runs of workflows this runtime does not have: a plugin's, on a host
//! built without it (a kernel-only embedder beside `stepwell serve` on one
//! store meets the automations' controllers), or one registered in another
//! process only. The driver leaves them to the hosts that have their
//! workflow: it writes nothing to them (a run set aside in the store would
//! be held for every host), and lists past them for a while.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long the driver passes a run it found foreign before it looks again
/// (its workflow may have been registered since).
pub(crate) const FOREIGN_FOR: Duration = Duration::from_secs(30);

/// The most runs a runtime remembers as foreign (what a store full of
/// other hosts' runs can make it hold). Past that, the driver meets the
/// others again in its listings.
const MAX_FOREIGN: usize = 4096;

/// The runs this runtime's driver found foreign, each until when.
#[derive(Default)]
pub(crate) struct Foreign {
    runs: parking_lot::Mutex<HashMap<String, Instant>>,
}

impl Foreign {
    /// Remembers `run_id` as foreign for [`FOREIGN_FOR`].
    pub(crate) fn note(&self, run_id: &str) {
        let now = Instant::now();
        let mut runs = self.runs.lock();
        if runs.len() >= MAX_FOREIGN {
            runs.retain(|_, until| *until > now);
        }
        if runs.len() < MAX_FOREIGN {
            runs.insert(run_id.to_string(), now + FOREIGN_FOR);
        }
    }

    /// How many runs are foreign now: a listing asks for that many more,
    /// so that they cannot fill it.
    pub(crate) fn count(&self) -> usize {
        let now = Instant::now();
        let mut runs = self.runs.lock();
        runs.retain(|_, until| *until > now);
        runs.len()
    }

    /// Whether `run_id` is foreign now.
    pub(crate) fn contains(&self, run_id: &str) -> bool {
        let now = Instant::now();
        self.runs
            .lock()
            .get(run_id)
            .is_some_and(|until| *until > now)
    }

    /// `ids` without the foreign runs, at most `limit` of them (one look at
    /// the set for the whole listing).
    pub(crate) fn past(&self, mut ids: Vec<String>, limit: usize) -> Vec<String> {
        let now = Instant::now();
        let runs = self.runs.lock();
        ids.retain(|id| runs.get(id).is_none_or(|until| *until <= now));
        drop(runs);
        ids.truncate(limit);
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_runs_are_passed_and_bounded() {
        let f = Foreign::default();
        f.note("a");
        assert!(f.contains("a") && !f.contains("b"));
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(f.past(ids(&["a", "b", "c"]), 1), ids(&["b"]));
        for i in 0..MAX_FOREIGN + 10 {
            f.note(&i.to_string());
        }
        assert_eq!(f.count(), MAX_FOREIGN, "no more than the bound");
    }
}

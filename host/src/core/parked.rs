//! The states of runs this runtime parked a moment ago, so that a resume
//! that follows (an application's `run` then `resume`, a person answering
//! in the dashboard) does not read the run back from the store first.
//!
//! A remembered state is only a guess: the resume's first commit carries
//! its version as the write's fence, so if anyone (another process, another
//! runtime) changed the run since, that commit changes nothing and the
//! resume starts again from the stored state, as if nothing had been
//! remembered. Nothing the resume decided from the guess (an error, a
//! refused key) stands either: it is decided again from the store.
//!
//! Bounded: at most [`KEEP`] states, each of at most about [`MAX_BYTES`]
//! of vars and output; a resume takes its run's state out. A parked run
//! costs the driver nothing here: only states this runtime just committed
//! are kept, and the oldest go first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use super::model::{RunState, RunStatus};

/// How many parked states a runtime keeps.
pub(crate) const KEEP: usize = 16;

/// States whose vars and output take more than about this many bytes (as
/// JSON) are not kept.
pub(crate) const MAX_BYTES: usize = 64 << 10;

/// Whether `run`'s vars and output take at most about `limit` bytes as
/// JSON (strings, keys and scalars counted; punctuation not): a walk that
/// stops as soon as the count passes the limit.
fn small(run: &RunState, limit: usize) -> bool {
    let mut left = limit;
    let mut stack: Vec<&Value> = run.vars.values().collect();
    for key in run.vars.keys() {
        left = match left.checked_sub(key.len()) {
            Some(l) => l,
            None => return false,
        };
    }
    stack.extend(run.output.as_ref());
    while let Some(v) = stack.pop() {
        let cost = match v {
            Value::String(s) => s.len(),
            Value::Array(items) => {
                stack.extend(items);
                1
            }
            Value::Object(map) => {
                stack.extend(map.values());
                map.keys().map(String::len).sum()
            }
            _ => 8,
        };
        left = match left.checked_sub(cost) {
            Some(l) => l,
            None => return false,
        };
    }
    true
}

/// The states (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Parked {
    states: parking_lot::Mutex<VecDeque<RunState>>,
    /// How many states are kept: a commit of a run that does not park
    /// looks here first, and takes the lock only if something is kept.
    kept: AtomicUsize,
}

impl Parked {
    /// Notes `run` as just committed at its version, as stored
    /// (`as_stored`: the store holds exactly this state): kept if it waits
    /// and is small, forgotten otherwise.
    pub(crate) fn committed(&self, run: &RunState, as_stored: bool) {
        let keep = as_stored && run.status == RunStatus::Waiting && small(run, MAX_BYTES);
        if !keep && self.kept.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut states = self.states.lock();
        states.retain(|s| s.run_id != run.run_id);
        if keep {
            if states.len() == KEEP {
                states.pop_front();
            }
            states.push_back(run.clone());
        }
        self.kept.store(states.len(), Ordering::Relaxed);
    }

    /// Takes the state kept for `run_id`, if any.
    pub(crate) fn take(&self, run_id: &str) -> Option<RunState> {
        if self.kept.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut states = self.states.lock();
        let i = states.iter().position(|s| s.run_id == run_id)?;
        let state = states.remove(i);
        self.kept.store(states.len(), Ordering::Relaxed);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(id: &str, status: &str, text: usize) -> RunState {
        serde_json::from_value(json!({
            "version": 3, "run_id": id, "workflow_id": "w", "status": status,
            "current_node": "n", "vars": {"a": {"b": ["x".repeat(text)]}},
            "waiting": null, "output": null, "error": null,
            "created_at": "t", "updated_at": "t",
        }))
        .unwrap()
    }

    #[test]
    fn waiting_states_are_kept_until_taken_or_replaced() {
        let parked = Parked::default();
        parked.committed(&run("a", "waiting", 10), true);
        parked.committed(&run("b", "waiting", 10), true);
        assert_eq!(parked.take("a").map(|s| s.run_id), Some("a".into()));
        assert!(parked.take("a").is_none(), "a state is taken once");
        // A later commit of the run that does not wait forgets it.
        parked.committed(&run("b", "running", 10), true);
        assert!(parked.take("b").is_none());
        // Large states are not kept, nor states the store holds otherwise
        // (values kept as artifacts).
        parked.committed(&run("c", "waiting", MAX_BYTES), true);
        assert!(parked.take("c").is_none());
        parked.committed(&run("c", "waiting", MAX_BYTES - 10), true);
        assert!(parked.take("c").is_some());
        parked.committed(&run("d", "waiting", 10), false);
        assert!(parked.take("d").is_none());
        assert_eq!(parked.kept.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn at_most_keep_states_are_kept_the_oldest_go_first() {
        let parked = Parked::default();
        for i in 0..KEEP + 3 {
            parked.committed(&run(&format!("r{i}"), "waiting", 0), true);
        }
        assert_eq!(parked.states.lock().len(), KEEP);
        assert!(parked.take("r0").is_none());
        assert!(parked.take("r2").is_none());
        assert!(parked.take("r3").is_some());
        assert!(parked.take(&format!("r{}", KEEP + 2)).is_some());
        // The same run parked again replaces its state.
        parked.committed(&run("x", "waiting", 0), true);
        let mut newer = run("x", "waiting", 0);
        newer.version = 9;
        parked.committed(&newer, true);
        assert_eq!(parked.take("x").map(|s| s.version), Some(9));
        assert!(parked.take("x").is_none());
    }
}

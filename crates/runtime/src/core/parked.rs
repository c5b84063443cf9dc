//! The states of runs this runtime parked a moment ago, so that a resume
//! that follows (an application's `run` then `resume`, a person answering
//! in the dashboard) does not read the run back from the store first.
//!
//! A remembered state is only a guess: the resume's first commit carries
//! its version as the write's fence, so if anyone (another process, another
//! runtime) changed the run since, that commit changes nothing and the
//! resume starts again from the stored state, as if nothing had been
//! remembered. A refusal decided from the guess (a wrong key, a run not
//! waiting) stands only if the stored version is still the guess's; a
//! store error stands as it is (a commit whose outcome is unknown is not
//! done again). See `Runtime::resume_at`.
//!
//! Bounded: at most [`KEEP`] states of runs waiting for an answer (a
//! person's, an event's, a job's), each of at most about [`MAX_BYTES`] of
//! vars, output, wait and error; a resume takes its run's state out. A
//! parked run costs the driver nothing here: only states this runtime just
//! committed are kept, and the oldest go first.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

use super::model::{RunState, RunStatus, WaitReason};

/// How many parked states a runtime keeps.
pub(crate) const KEEP: usize = 16;

/// States whose vars, output, wait and error take more than about this
/// many bytes (as JSON) are not kept.
pub(crate) const MAX_BYTES: usize = 64 << 10;

/// Whether `run`'s vars, output, wait and error take at most about `limit`
/// bytes as JSON (strings, keys and scalars counted; punctuation not): a
/// walk that stops as soon as the count passes the limit.
fn small(run: &RunState, limit: usize) -> bool {
    let mut left = limit;
    let mut spend = |n: usize| match left.checked_sub(n) {
        Some(l) => {
            left = l;
            true
        }
        None => false,
    };
    let mut values: Vec<&Value> = Vec::new();
    for (key, v) in &run.vars {
        if !spend(key.len()) {
            return false;
        }
        values.push(v);
    }
    values.extend(run.output.as_ref());
    let mut texts: Vec<&str> = run.error.as_deref().into_iter().collect();
    if let Some(w) = &run.waiting {
        texts.push(&w.wait_key);
        texts.extend(w.until.as_deref());
        texts.extend(w.resume_to_node.as_deref());
        texts.extend(w.result_key.as_deref());
        texts.extend(w.prompt.as_deref());
        texts.extend(w.choices.iter().flatten().map(String::as_str));
        values.extend(w.details.as_ref());
    }
    if !texts.into_iter().all(|t| spend(t.len())) {
        return false;
    }
    while let Some(v) = values.pop() {
        let cost = match v {
            Value::String(s) => s.len(),
            Value::Array(items) => {
                values.extend(items);
                1
            }
            Value::Object(map) => {
                values.extend(map.values());
                map.keys().map(String::len).sum()
            }
            _ => 8,
        };
        if !spend(cost) {
            return false;
        }
    }
    true
}

/// Whether a resume through the API may follow a wait of this kind soon:
/// a person's answer, an event or a job's result. A time, a retry's backoff
/// or a child run is resumed by the driver, later.
fn answered_soon(run: &RunState) -> bool {
    run.waiting.as_ref().is_some_and(|w| {
        matches!(
            w.reason,
            WaitReason::User | WaitReason::Event | WaitReason::Job
        )
    })
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
    /// for an answer and is small, forgotten otherwise.
    pub(crate) fn committed(&self, run: &RunState, as_stored: bool) {
        let keep = as_stored
            && run.status == RunStatus::Waiting
            && answered_soon(run)
            && small(run, MAX_BYTES);
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
        waiting(id, status, "user", text, json!(null))
    }

    fn waiting(id: &str, status: &str, reason: &str, text: usize, details: Value) -> RunState {
        serde_json::from_value(json!({
            "version": 3, "run_id": id, "workflow_id": "w", "status": status,
            "current_node": "n", "vars": {"a": {"b": ["x".repeat(text)]}},
            "waiting": {"reason": reason, "wait_key": "k", "prompt": "?", "details": details},
            "output": null, "error": null,
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
        parked.committed(&run("c", "waiting", MAX_BYTES - 20), true);
        assert!(parked.take("c").is_some());
        parked.committed(&run("d", "waiting", 10), false);
        assert!(parked.take("d").is_none());
        // The wait counts: a large `details` (a tool call's arguments) too.
        let big = json!({"args": ["y".repeat(MAX_BYTES)]});
        parked.committed(&waiting("e", "waiting", "user", 10, big), true);
        assert!(parked.take("e").is_none());
        // Waits the driver resumes later are not kept.
        for reason in ["until", "subworkflow"] {
            parked.committed(&waiting("f", "waiting", reason, 10, json!(null)), true);
            assert!(parked.take("f").is_none(), "{reason}");
        }
        for reason in ["user", "event", "job"] {
            parked.committed(&waiting("g", "waiting", reason, 10, json!(null)), true);
            assert!(parked.take("g").is_some(), "{reason}");
        }
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

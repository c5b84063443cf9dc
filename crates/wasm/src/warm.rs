//! Warm instances: a node component's next instance is made ahead of its
//! use, and a used one is dropped, on a background thread of the engine.
//!
//! Instantiating a component (a store, its WASI context, the instance's
//! memories and tables from the pool) and dropping it again (the pool
//! resets the pages the guest touched) took about a fifth of an ask/resume
//! cycle's time, all of it on the thread that resumed the run. Neither
//! needs to be there: a warm instance was never called, so it is exactly
//! what an instantiation at the call would have made (the guest sees no
//! time, and its random stream is seeded at each call, `prepare_call`);
//! a used one only has to go. Both are done by one worker thread per
//! engine, so the thread that runs a step finds its instance ready and
//! leaves the clean-up behind.
//!
//! Bounds: at most [`MAX_WARM`] components of an engine hold a warm
//! instance (the one whose instance was made least recently gives its up
//! first), each at most one, and only components that were used: each
//! session, when it ends, asks for the next instance. The worker's queue
//! holds [`QUEUE`] jobs; when it is full, an instance is dropped where it
//! is and none is made ahead (nothing waits for the worker). Instances
//! count in the engine's live guest memory
//! ([`SandboxLimits::total_memory_bytes`](super::SandboxLimits)) and in its
//! pool of instances until they are dropped, warm ones too: only instances
//! of at most [`MAX_WARM_MEMORY`] are dropped on the worker or kept warm, a
//! component whose fresh instance is larger or took over [`SLOW_TO_MAKE`]
//! to make is never made ahead again, and an instantiation at the call that
//! fails drops every instance the worker holds and tries once more
//! ([`Worker::release_all`]). An instance whose call failed is dropped
//! where it is, before the step is tried again. The worker's thread ends
//! after [`IDLE`] without work.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::node::{NodeComponent, NodeInstance};

/// The most components of one engine holding a warm instance at once.
pub(crate) const MAX_WARM: usize = 4;

/// The most jobs waiting for the worker.
const QUEUE: usize = 8;

/// The most linear memory an instance the worker drops, or keeps warm, may
/// hold. A larger one is dropped where its session ends (its memory counts
/// in the engine's live guest memory until then), and a component whose
/// fresh instance holds more is not made ahead again: a guest cannot keep
/// much of the shared budget by being made ahead.
pub(crate) const MAX_WARM_MEMORY: usize = 8 << 20;

/// A component whose instance took longer than this to make is not made
/// ahead again (a guest whose start-up runs long would keep the worker
/// from the others).
const SLOW_TO_MAKE: Duration = Duration::from_millis(250);

/// How long the worker waits for a job before its thread ends (the next
/// job starts another): an idle engine holds no thread for this.
const IDLE: Duration = Duration::from_secs(2);

/// What the worker does when a session ends: drop its instance, then make
/// the component's next one (one job, so one wake-up of the worker).
struct Job {
    /// The session's instance (`None`: dropped where the session ended).
    used: Option<Box<NodeInstance>>,
    component: Weak<NodeComponent>,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    /// The components holding a warm instance, least recently made first.
    holders: VecDeque<Weak<NodeComponent>>,
    /// Whether the worker's thread is running.
    running: bool,
}

struct Queue {
    state: Mutex<State>,
    more: Condvar,
    /// [`MAX_WARM_MEMORY`] (lowered by tests).
    max_memory: AtomicUsize,
    /// [`SLOW_TO_MAKE`] in microseconds (lowered by tests).
    slow_us: AtomicU64,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            state: Mutex::default(),
            more: Condvar::new(),
            max_memory: AtomicUsize::new(MAX_WARM_MEMORY),
            slow_us: AtomicU64::new(SLOW_TO_MAKE.as_micros() as u64),
        }
    }
}

/// The engine's worker: a thread started at the first job, which ends
/// after [`IDLE`] without one.
#[derive(Default)]
pub(super) struct Worker {
    queue: Arc<Queue>,
}

impl Worker {
    /// A session of `component` ended with `used`: drops it on the worker
    /// (one holding more than [`MAX_WARM_MEMORY`] here) and has the
    /// component's next instance made ahead. If the queue is full or no
    /// thread can be started, drops it here and makes nothing ahead.
    pub(super) fn session_ended(&self, used: Box<NodeInstance>, component: Weak<NodeComponent>) {
        let used = if used.memory_bytes() <= self.queue.max_memory.load(Ordering::Relaxed) {
            Some(used)
        } else {
            drop(used);
            None
        };
        let job = Job { used, component };
        let mut state = self.queue.state.lock();
        if state.jobs.len() >= QUEUE {
            drop(state);
            drop(job);
            return;
        }
        state.jobs.push_back(job);
        if state.running {
            self.queue.more.notify_one();
            return;
        }
        let queue = self.queue.clone();
        let started = std::thread::Builder::new()
            .name("stepwell-warm".into())
            .spawn(move || work(&queue));
        match started {
            Ok(_) => state.running = true,
            Err(_) => {
                let job = state.jobs.pop_back();
                drop(state);
                drop(job);
            }
        }
    }

    /// Lowers the bounds on a warm instance's memory and on the time to
    /// make one, for tests of what happens past them.
    #[cfg(test)]
    fn set_bounds(&self, max_memory: usize, slow: Duration) {
        self.queue.max_memory.store(max_memory, Ordering::Relaxed);
        self.queue
            .slow_us
            .store(slow.as_micros() as u64, Ordering::Relaxed);
    }

    /// Drops every instance the worker holds, made ahead or waiting to be
    /// dropped: what a failed instantiation does before it tries again
    /// (the pool or the shared memory budget may be full of them). Whether
    /// there was any.
    pub(super) fn release_all(&self) -> bool {
        let (jobs, holders) = {
            let mut state = self.queue.state.lock();
            (
                std::mem::take(&mut state.jobs),
                std::mem::take(&mut state.holders),
            )
        };
        let mut any = false;
        for job in jobs {
            any |= job.used.is_some();
        }
        for holder in holders.iter().filter_map(Weak::upgrade) {
            any |= holder.take_warm().is_some();
        }
        any
    }
}

fn work(queue: &Queue) {
    loop {
        let Job { used, component } = {
            let mut state = queue.state.lock();
            loop {
                if let Some(job) = state.jobs.pop_front() {
                    break job;
                }
                if queue.more.wait_for(&mut state, IDLE).timed_out() && state.jobs.is_empty() {
                    state.running = false;
                    return;
                }
            }
        };
        drop(used);
        make_ahead(queue, component);
    }
}

/// Makes `weak`'s next instance, if it has none and may have one.
fn make_ahead(queue: &Queue, weak: Weak<NodeComponent>) {
    let Some(component) = weak.upgrade() else {
        return;
    };
    if component.is_cold() {
        return;
    }
    let evicted: Vec<Arc<NodeComponent>> = {
        let mut state = queue.state.lock();
        state
            .holders
            .retain(|h| h.strong_count() > 0 && !h.ptr_eq(&weak));
        if component.has_warm() {
            state.holders.push_back(weak);
            return;
        }
        let mut evicted = Vec::new();
        while state.holders.len() >= MAX_WARM {
            evicted.extend(state.holders.pop_front().and_then(|h| h.upgrade()));
        }
        evicted
    };
    for oldest in evicted {
        drop(oldest.take_warm());
    }
    let started = Instant::now();
    let max_memory = queue.max_memory.load(Ordering::Relaxed);
    let slow = Duration::from_micros(queue.slow_us.load(Ordering::Relaxed));
    match component.instantiate() {
        Ok(instance) if instance.memory_bytes() <= max_memory && started.elapsed() <= slow => {
            component.put_warm(instance);
            queue.state.lock().holders.push_back(weak);
        }
        // Large, or slow to make: made at the call from now on.
        Ok(_) => component.make_cold(),
        // Perhaps for a moment (the pool or the shared memory budget is
        // full): the call makes one, and reports why if it cannot.
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{EngineConfig, NodeCall, SandboxLimits, WasmEngine};

    fn engine() -> WasmEngine {
        engine_with(SandboxLimits::default())
    }

    fn engine_with(limits: SandboxLimits) -> WasmEngine {
        WasmEngine::new(EngineConfig {
            cache_dir: None,
            limits,
            digests: None,
        })
        .unwrap()
    }

    /// The hostile test component, or a copy of it made distinct by a
    /// custom section (`copy`), under `dir`.
    fn hostile(dir: &std::path::Path, copy: Option<u8>) -> PathBuf {
        let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../flows/examples/runaway/hostile.wasm");
        let Some(copy) = copy else {
            return built;
        };
        let mut bytes = std::fs::read(&built).unwrap();
        // A custom section named "x" holding one byte.
        bytes.extend_from_slice(&[0, 3, 1, b'x', copy]);
        let path = dir.join(format!("hostile-{copy}.wasm"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Calls `session` with `config`: the plan's vars.
    fn call(session: &mut crate::NodeSession, config: &str) -> serde_json::Value {
        let config = config.to_string();
        let vars = "{}".to_string();
        let plan = session
            .call(&NodeCall {
                run_id: "r",
                workflow_id: "w",
                node_id: "n",
                config_json: Some(&config),
                vars_json: &vars,
                now: chrono::Utc::now(),
                attempt: 1,
                seed: 1,
            })
            .unwrap();
        serde_json::Value::Object(plan.vars.unwrap_or_default())
    }

    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(30), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    const COUNT: &str = r#"{"mode": "count", "key": "n"}"#;

    #[test]
    fn a_used_components_next_instance_is_made_ahead_and_never_called() {
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        let mut first = c.session().unwrap();
        assert_eq!(call(&mut first, COUNT)["n"], 1);
        assert_eq!(call(&mut first, COUNT)["n"], 2);
        // Nothing is made ahead before a session ends.
        assert!(!c.has_warm());
        drop(first);
        wait_for("the next instance made ahead", || c.has_warm());
        let mut second = c.session().unwrap();
        assert!(!c.has_warm(), "the session took it");
        // A fresh instance: not the one the first session left at 2.
        assert_eq!(call(&mut second, COUNT)["n"], 1);
        drop(second);
        wait_for("made ahead again", || c.has_warm());
        assert!(!c.is_cold());
    }

    #[test]
    fn at_most_four_components_hold_an_instance_made_ahead() {
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let components: Vec<Arc<NodeComponent>> = (0..=MAX_WARM as u8)
            .map(|i| engine.load_node(&hostile(dir.path(), Some(i))).unwrap())
            .collect();
        for c in &components {
            let mut s = c.session().unwrap();
            call(&mut s, COUNT);
            drop(s);
            // In turn, so that the order they were asked for is known.
            wait_for("made ahead", || c.has_warm());
        }
        let warm: Vec<bool> = components.iter().map(|c| c.has_warm()).collect();
        // The first one, asked for least recently, gave its up.
        assert_eq!(warm, [false, true, true, true, true], "{warm:?}");
        // Used again, it is the most recent: the second one gives way.
        drop(components[0].session().unwrap());
        wait_for("made ahead", || components[0].has_warm());
        let warm: Vec<bool> = components.iter().map(|c| c.has_warm()).collect();
        assert_eq!(warm, [true, false, true, true, true], "{warm:?}");
    }

    #[test]
    fn a_large_instance_is_dropped_where_its_session_ends() {
        let engine = engine();
        let live = engine.live_memory();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        let mut s = c.session().unwrap();
        let leak = format!(r#"{{"mode": "leak", "bytes": {}}}"#, 32 << 20);
        call(&mut s, &leak);
        assert!(live.load(Ordering::Relaxed) > 32 << 20);
        drop(s);
        // Given back at once, not when the worker gets to it (an instance
        // made ahead meanwhile holds less than MAX_WARM_MEMORY).
        assert!(live.load(Ordering::Relaxed) <= MAX_WARM_MEMORY);
        // The component's fresh instances are small: made ahead all the same.
        wait_for("made ahead", || c.has_warm());
        assert!(c.take_warm().unwrap().memory_bytes() <= MAX_WARM_MEMORY);
    }

    #[test]
    fn a_component_marked_cold_is_not_made_ahead() {
        // What a component whose fresh instance failed or was too large
        // is marked (no test guest starts that large): the worker passes
        // it over.
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        c.make_cold();
        drop(c.session().unwrap());
        // The worker has done the job once the next one is done.
        let other = engine.load_node(&hostile(dir.path(), Some(9))).unwrap();
        drop(other.session().unwrap());
        wait_for("the other made ahead", || other.has_warm());
        assert!(!c.has_warm());
    }

    #[test]
    fn a_call_that_cannot_get_an_instance_takes_back_those_made_ahead() {
        // The engine's live guests may hold one fresh instance and a half:
        // with one made ahead for one component, another component's
        // instance fits only once that one is dropped.
        let dir = tempfile::tempdir().unwrap();
        let fresh = {
            let engine = engine();
            let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
            c.instantiate().unwrap().memory_bytes()
        };
        let engine = engine_with(SandboxLimits {
            total_memory_bytes: fresh + fresh / 2,
            ..SandboxLimits::default()
        });
        let first = engine.load_node(&hostile(dir.path(), Some(1))).unwrap();
        let second = engine.load_node(&hostile(dir.path(), Some(2))).unwrap();
        drop(first.session().unwrap());
        wait_for("made ahead", || first.has_warm());
        // Made at the call: fails for the budget, drops the one made
        // ahead, and succeeds.
        let mut s = second.session().unwrap();
        assert!(!first.has_warm());
        assert_eq!(call(&mut s, COUNT)["n"], 1);
        s.discard();
    }

    #[test]
    fn a_discarded_session_gives_its_memory_back_at_once() {
        let engine = engine();
        let live = engine.live_memory();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        let mut s = c.session().unwrap();
        // Under MAX_WARM_MEMORY: a session that ends normally would leave
        // it to the worker.
        let leak = format!(r#"{{"mode": "leak", "bytes": {}}}"#, 4 << 20);
        call(&mut s, &leak);
        let before = live.load(Ordering::Relaxed);
        assert!(before > 4 << 20);
        s.discard();
        assert!(live.load(Ordering::Relaxed) <= before - (4 << 20));
        // And nothing is made ahead for it.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!c.has_warm());
    }

    #[test]
    fn a_component_whose_fresh_instance_is_large_or_slow_to_make_goes_cold() {
        // No test guest starts that large or that slow: the bounds are
        // lowered instead, below what any fresh instance holds (its
        // memory's first page) and takes.
        for (max_memory, slow) in [(1, Duration::from_secs(60)), (usize::MAX, Duration::ZERO)] {
            let engine = engine();
            engine.worker().set_bounds(max_memory, slow);
            let dir = tempfile::tempdir().unwrap();
            let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
            assert!(!c.is_cold());
            drop(c.session().unwrap());
            wait_for("the component went cold", || c.is_cold());
            assert!(!c.has_warm(), "{max_memory} {slow:?}");
            // From now on its instances are made at the call, and none ahead.
            let mut s = c.session().unwrap();
            assert_eq!(call(&mut s, COUNT)["n"], 1);
            drop(s);
            std::thread::sleep(Duration::from_millis(50));
            assert!(!c.has_warm());
        }
    }

    #[test]
    fn with_the_workers_queue_full_a_session_drops_its_instance_where_it_ends() {
        let engine = engine();
        let live = engine.live_memory();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        // A queue full of jobs no thread takes (it is marked running).
        let queue = engine.worker().queue.clone();
        {
            let mut state = queue.state.lock();
            state.running = true;
            for _ in 0..QUEUE {
                state.jobs.push_back(Job {
                    used: None,
                    component: Weak::new(),
                });
            }
        }
        let mut s = c.session().unwrap();
        let leak = format!(r#"{{"mode": "leak", "bytes": {}}}"#, 4 << 20);
        call(&mut s, &leak);
        let before = live.load(Ordering::Relaxed);
        drop(s);
        // Dropped here (under MAX_WARM_MEMORY, it would have been queued),
        // and nothing was queued or made ahead.
        assert!(live.load(Ordering::Relaxed) <= before - (4 << 20));
        assert_eq!(queue.state.lock().jobs.len(), QUEUE);
        assert!(!c.has_warm());
        let mut state = queue.state.lock();
        state.jobs.clear();
        state.running = false;
    }

    #[test]
    fn the_workers_thread_ends_when_idle_and_starts_again() {
        let engine = engine();
        let dir = tempfile::tempdir().unwrap();
        let c = engine.load_node(&hostile(dir.path(), None)).unwrap();
        drop(c.session().unwrap());
        wait_for("made ahead", || c.has_warm());
        assert!(engine.worker().queue.state.lock().running);
        wait_for("the thread ended", || {
            !engine.worker().queue.state.lock().running
        });
        // The next job starts a thread again.
        drop(c.session().unwrap());
        wait_for("made ahead again", || c.has_warm());
    }
}

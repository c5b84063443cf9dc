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
//! instance (the least recently asked for gives its up first), each at
//! most one, and only components that were used: each session, when it
//! ends, asks for the next instance. The worker's queue holds [`QUEUE`]
//! jobs; when it is full, an instance is dropped where it is and no
//! instance is made ahead (nothing waits for the worker). Instances count
//! in the engine's live guest memory
//! ([`SandboxLimits::total_memory_bytes`](super::SandboxLimits)) until
//! they are dropped, warm ones too: only instances of at most
//! [`MAX_WARM_MEMORY`] are dropped on the worker or kept warm, and a
//! component whose fresh instance fails or is larger is never made ahead
//! again.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{OnceLock, Weak};

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

/// What the worker does when a session ends: drop its instance, then make
/// the component's next one (one job, so one wake-up of the worker).
struct Job {
    /// The session's instance (`None`: dropped where the session ended).
    used: Option<Box<NodeInstance>>,
    component: Weak<NodeComponent>,
}

/// The engine's worker thread, started at its first job. It ends when the
/// engine is dropped (its queue's sender goes with it).
#[derive(Default)]
pub(super) struct Worker {
    queue: OnceLock<Option<SyncSender<Job>>>,
}

impl Worker {
    fn queue(&self) -> Option<&SyncSender<Job>> {
        self.queue
            .get_or_init(|| {
                let (tx, rx) = sync_channel(QUEUE);
                std::thread::Builder::new()
                    .name("stepwell-warm".into())
                    .spawn(move || work(rx))
                    .ok()
                    .map(|_| tx)
            })
            .as_ref()
    }

    /// A session of `component` ended with `used`: drops it on the worker
    /// (one holding more than [`MAX_WARM_MEMORY`] here) and has the
    /// component's next instance made ahead. If the worker is busy, drops
    /// it here and makes nothing ahead.
    pub(super) fn session_ended(&self, used: Box<NodeInstance>, component: Weak<NodeComponent>) {
        let used = if used.memory_bytes() <= MAX_WARM_MEMORY {
            Some(used)
        } else {
            drop(used);
            None
        };
        let Some(queue) = self.queue() else {
            return;
        };
        match queue.try_send(Job { used, component }) {
            Ok(()) => {}
            Err(TrySendError::Full(job) | TrySendError::Disconnected(job)) => drop(job),
        }
    }
}

fn work(jobs: Receiver<Job>) {
    // The components holding a warm instance, least recently asked for
    // first.
    let mut holders: VecDeque<Weak<NodeComponent>> = VecDeque::new();
    while let Ok(Job { used, component }) = jobs.recv() {
        drop(used);
        let weak = component;
        holders.retain(|h| h.strong_count() > 0 && !h.ptr_eq(&weak));
        let Some(component) = weak.upgrade() else {
            continue;
        };
        if component.is_cold() {
            continue;
        }
        if !component.has_warm() {
            while holders.len() >= MAX_WARM {
                if let Some(oldest) = holders.pop_front().and_then(|h| h.upgrade()) {
                    drop(oldest.take_warm());
                }
            }
            // An instantiation that fails is left to the call, which
            // instantiates again and reports why; a large fresh instance
            // is not kept. Either way, none is made ahead again.
            match component.instantiate() {
                Ok(instance) if instance.memory_bytes() <= MAX_WARM_MEMORY => {
                    component.put_warm(instance)
                }
                Ok(_) | Err(_) => {
                    component.make_cold();
                    continue;
                }
            }
        }
        holders.push_back(weak);
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::wasm::{EngineConfig, NodeCall, SandboxLimits, WasmEngine};

    fn engine() -> WasmEngine {
        WasmEngine::new(EngineConfig {
            cache_dir: None,
            limits: SandboxLimits::default(),
            digests: None,
        })
        .unwrap()
    }

    /// The hostile test component, or a copy of it made distinct by a
    /// custom section (`copy`), under `dir`.
    fn hostile(dir: &std::path::Path, copy: Option<u8>) -> PathBuf {
        let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../flows/examples/runaway/hostile.wasm");
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
    fn call(session: &mut crate::wasm::NodeSession, config: &str) -> serde_json::Value {
        let config = config.to_string();
        let vars = "{}".to_string();
        let plan = session
            .call(&NodeCall {
                run_id: "r",
                workflow_id: "w",
                node_id: "n",
                config_json: &config,
                vars_json: &vars,
                now: "2026-12-02T00:00:00Z",
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
}

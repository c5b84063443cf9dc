//! `crash-host`: a stepwell host for the crash harness (`tests/crash.rs`).
//!
//! ```text
//! crash-host STORE SCENARIO [CRASH_AT PHASE]
//! ```
//!
//! Runs SCENARIO (`chain`, `ask`, `subworkflow`, `event`) on STORE (`sqlite:PATH` or
//! `json:DIR`) the way a host recovering from a crash would: every start uses
//! an explicit id (create-if-absent), a parked run is resumed only if it still
//! waits, and the driver moves whatever is left. With CRASH_AT = n, the
//! process aborts (no destructors, no flushing: like `kill -9`) at the n-th
//! persistence call: `before` it reaches the store, `after` it returned, or
//! `mid`-commit (after the ledger append, before the run save). It prints
//! `{"points": N}`, the number of persistence calls, when it completes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;
use stepwell::host::StoreSpec;
use stepwell::{
    Claim, EngineConfig, Error, Fence, LeaseAfter, LeaseRequest, RunQuery, RunState, RunStatus,
    Runtime, StartOptions, StepRecord, Store, StoreError, WasmEngine,
};

#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Before,
    After,
    Mid,
}

struct FaultStore {
    inner: Arc<dyn Store>,
    calls: AtomicUsize,
    crash_at: Option<(usize, Phase)>,
}

impl FaultStore {
    /// Counts a persistence call; aborts if it is the chosen one and `phase`
    /// is the chosen phase.
    fn point(&self, phase: Phase) -> usize {
        let n = if phase == Phase::Before {
            self.calls.fetch_add(1, Ordering::SeqCst) + 1
        } else {
            self.calls.load(Ordering::SeqCst)
        };
        if self.crash_at == Some((n, phase)) {
            std::process::abort();
        }
        n
    }

    fn write<T>(&self, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.point(Phase::Before);
        let out = f()?;
        self.point(Phase::After);
        Ok(out)
    }
}

impl Store for FaultStore {
    fn load_run(&self, id: &str) -> Result<Option<RunState>, StoreError> {
        self.inner.load_run(id)
    }
    fn create_if_absent(&self, run: &RunState) -> Result<(RunState, bool), StoreError> {
        self.write(|| self.inner.create_if_absent(run))
    }
    fn claim(&self, id: &str, lease: &LeaseRequest<'_>) -> Result<Claim, StoreError> {
        self.write(|| self.inner.claim(id, lease))
    }
    fn renew(
        &self,
        holder: &str,
        ids: &[String],
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), StoreError> {
        // Renewals come from a timer thread: not a numbered point.
        self.inner.renew(holder, ids, until)
    }
    fn release(&self, id: &str, holder: &str) -> Result<(), StoreError> {
        self.write(|| self.inner.release(id, holder))
    }
    fn commit(
        &self,
        records: &[StepRecord],
        run: &RunState,
        fence: Fence<'_>,
        lease: LeaseAfter,
    ) -> Result<(), StoreError> {
        self.point(Phase::Before);
        if matches!(self.crash_at, Some((_, Phase::Mid))) {
            // A non-atomic commit torn in the middle: the ledger is written,
            // the run is not.
            let n = self.calls.load(Ordering::SeqCst);
            if self.crash_at == Some((n, Phase::Mid)) && fence.version > 0 {
                self.inner.append_ahead(records, fence)?;
                std::process::abort();
            }
        }
        self.inner.commit(records, run, fence, lease)?;
        self.point(Phase::After);
        Ok(())
    }
    fn append_ahead(&self, records: &[StepRecord], fence: Fence<'_>) -> Result<(), StoreError> {
        self.write(|| self.inner.append_ahead(records, fence))
    }
    fn append_records(&self, r: &[StepRecord]) -> Result<(), StoreError> {
        self.write(|| self.inner.append_records(r))
    }
    fn list_records(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_records(id)
    }
    fn list_ahead(&self, id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.list_ahead(id)
    }
    fn find_records(&self, id: &str, key: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.find_records(id, key)
    }
    fn list_runs(&self, q: &RunQuery) -> Result<Vec<RunState>, StoreError> {
        self.inner.list_runs(q)
    }
    fn list_due(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_due(now, limit)
    }
    fn list_claimable(
        &self,
        now: chrono::DateTime<chrono::Utc>,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.inner.list_claimable(now, limit)
    }
    fn list_ended_children(&self, limit: usize) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_ended_children(limit)
    }
    fn list_orphans(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        self.inner.list_orphans(limit)
    }
    fn quarantine(&self, id: &str, reason: &str) -> Result<(), StoreError> {
        self.write(|| self.inner.quarantine(id, reason))
    }
    fn list_quarantined(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.list_quarantined()
    }
    fn put_bundle(&self, w: &str, d: &Path) -> Result<(), StoreError> {
        self.write(|| self.inner.put_bundle(w, d))
    }
    fn bundle_dir(&self, w: &str) -> Result<Option<PathBuf>, StoreError> {
        self.inner.bundle_dir(w)
    }
}

fn start(rt: &Runtime, wf: &str, id: &str, vars: serde_json::Value) -> Result<(), Error> {
    rt.start(
        wf,
        StartOptions {
            vars: serde_json::from_value(vars).unwrap(),
            run_id: Some(id.into()),
            ..StartOptions::default()
        },
    )
    .map(|_| ())
}

fn settle(rt: &Runtime) -> Result<(), Error> {
    for _ in 0..10 {
        if !rt.drive_once()?.moved_anything() {
            break;
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (spec, scenario) = (StoreSpec::parse(&args[0])?, args[1].as_str());
    let crash_at = match (args.get(2), args.get(3).map(String::as_str)) {
        (Some(n), Some(phase)) => Some((
            n.parse()?,
            match phase {
                "before" => Phase::Before,
                "after" => Phase::After,
                _ => Phase::Mid,
            },
        )),
        _ => None,
    };
    let store = Arc::new(FaultStore {
        inner: spec.open(None)?,
        calls: AtomicUsize::new(0),
        crash_at,
    });
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let engine = WasmEngine::new(EngineConfig {
        cache_dir: Some(repo.join("target/stepwell-test-cache")),
        ..EngineConfig::default()
    })?;
    let rt = Runtime::builder(store.clone()).engine(engine).build()?;
    let examples = repo.join("flows/examples");
    match scenario {
        "chain" => {
            rt.load_bundle(&examples.join("chain"))?;
            start(&rt, "chain", "crash-chain", json!({}))?;
            rt.tick("crash-chain")?;
        }
        "ask" => {
            rt.load_bundle(&examples.join("ask-user"))?;
            start(&rt, "ask-user", "crash-ask", json!({}))?;
            let state = rt.tick("crash-ask")?;
            if let (RunStatus::Waiting, Some(w)) = (state.status, state.waiting) {
                match rt.resume("crash-ask", &w.wait_key, json!({"text": "Bob"})) {
                    Ok(_) | Err(Error::StaleResume { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        "subworkflow" => {
            rt.load_bundle(&examples.join("subworkflow"))?;
            start(
                &rt,
                "subworkflow",
                "crash-sub",
                json!({"text": "hi", "child_run_id": "crash-child"}),
            )?;
            rt.tick("crash-sub")?;
        }
        "event" => {
            rt.load_bundle(&examples.join("event"))?;
            start(&rt, "event", "crash-waiter", json!({}))?;
            rt.tick("crash-waiter")?;
            start(
                &rt,
                "event.emitter",
                "crash-emitter",
                json!({"payload": {"order": 7}}),
            )?;
            rt.tick("crash-emitter")?;
        }
        other => return Err(format!("unknown scenario {other}").into()),
    }
    settle(&rt)?;
    println!("{}", json!({"points": store.calls.load(Ordering::SeqCst)}));
    Ok(())
}

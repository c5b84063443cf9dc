//! Effects in flight: an effect that reaches the outside world and takes
//! its time (a model's answer, a tool batch) is recorded as started, then
//! executed off its run's step, so that whoever stepped the run (a driver
//! pass, an API call) moves on at once.
//!
//! While an effect flies, its run keeps its store lease (the runtime's
//! lease keeper renews it) and no other thread of this runtime may take the
//! run, but a cancel lands at once and reaches the effect through its
//! [`Cancel`]. When the effect lands ([`Landing::land`]), one of the
//! runtime's settling threads takes the run again and replays the step: the
//! node is asked for its plan once more (the step's seed is pinned), and
//! the landed outcome is settled exactly as an outcome executed inside the
//! step would be: recorded ahead of the commit, committed with the run's
//! transition, and the run continued under the driver's budget.
//!
//! Crash semantics are those of an effect executed inside its step: the
//! `started` record is written before the effect leaves; an outcome that
//! landed but was not recorded yet dies with the process, and the step is
//! replayed by whoever takes the run over (the effect executes again, with
//! the same idempotency key).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::runtime::{Inner, Runtime};
use super::txn::lease_now;
use super::{Error, Result};
use crate::effects::{Failure, Outcome};

/// Tells an effect in flight that its run was cancelled: it should stop
/// (drop its request, interrupt its instance, kill its process) and land
/// whatever it likes; the outcome of a cancelled run is not recorded.
#[derive(Default)]
pub struct Cancel {
    cancelled: AtomicBool,
    hooks: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Cancel {
    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Calls `hook` when the run is cancelled (at once, if it was).
    pub fn on_cancel(&self, hook: impl FnOnce() + Send + 'static) {
        let mut hooks = self.hooks.lock();
        if self.is_cancelled() {
            drop(hooks);
            hook();
        } else {
            hooks.push(Box::new(hook));
        }
    }

    /// Cancels: sets the flag and calls every hook once.
    pub(crate) fn fire(&self) {
        let hooks = {
            let mut hooks = self.hooks.lock();
            self.cancelled.store(true, Ordering::SeqCst);
            std::mem::take(&mut *hooks)
        };
        for hook in hooks {
            hook();
        }
    }
}

/// Where an effect in flight reports its outcome, once, from any thread.
/// Dropping it without landing lands a retryable `effect_lost` failure.
pub struct Landing {
    inner: Weak<Inner>,
    run_id: String,
    cancel: Arc<Cancel>,
    landed: bool,
    /// The effect's span: it ends when the effect lands.
    span: super::trace::Span,
}

impl std::fmt::Debug for Landing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landing")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Landing {
    /// The run whose effect this is.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's cancel signal.
    pub fn cancel(&self) -> &Arc<Cancel> {
        &self.cancel
    }

    /// Counts `bytes` more as held by this effect until its outcome is
    /// settled, against [`crate::RuntimeConfig::max_in_flight_bytes`]: an
    /// executor reports what it keeps while the effect is out (a request
    /// body, a copy of the run's state).
    pub fn hold_bytes(&self, bytes: usize) {
        if let Some(inner) = self.inner.upgrade() {
            inner.flights.add_bytes(&self.run_id, bytes);
        }
    }

    /// The effect's span, if tracing is on: spans of the work the effect
    /// does (a model call, a tool call) are its children.
    pub fn span_context(&self) -> Option<super::trace::SpanContext> {
        self.span.context()
    }

    /// Reports the effect's outcome: the run's step is settled with it by
    /// one of the runtime's settling threads. Returns at once.
    pub fn land(mut self, outcome: Outcome) {
        self.finish(Ok(outcome));
    }

    /// Reports a failure of the host itself (the store) while executing:
    /// nothing is recorded, and the run is set aside and tried again, as
    /// after such a failure inside a step.
    pub fn land_error(mut self, error: Error) {
        self.finish(Err(error));
    }

    fn finish(&mut self, outcome: Result<Outcome>) {
        self.landed = true;
        match &outcome {
            Ok(Outcome::Failed(f)) => self.span.fail(f),
            Err(e) => self.span.fail(e),
            Ok(_) => {}
        }
        std::mem::take(&mut self.span).end();
        if let Some(inner) = self.inner.upgrade() {
            inner.flights.landed(&self.run_id, outcome);
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.landed {
            self.finish(Ok(Outcome::Failed(Failure::retryable(
                "effect_lost",
                "the effect in flight ended without an outcome",
            ))));
        }
    }
}

/// Which effect of a step takes off.
pub(crate) struct Flight<'a> {
    pub now: chrono::DateTime<chrono::Utc>,
    pub kind: &'a str,
    pub key: &'a str,
    pub attempt: u32,
    /// For the work of a resume (an approved tool batch): the wait it
    /// ends and the resume's payload. The run waits while it flies.
    pub resume: Option<Resumed>,
}

/// The resume whose work is in flight: the wait it ends, its payload.
#[derive(Clone)]
pub(crate) struct Resumed {
    pub wait_key: String,
    pub payload: serde_json::Value,
}

/// An outcome that landed, waiting for its run's settling.
pub(crate) struct Landed {
    /// The time of the step that took off: its replay plans at the same
    /// time (with its pinned seed, the node plans the same effect).
    pub now: chrono::DateTime<chrono::Utc>,
    pub kind: String,
    pub key: String,
    pub attempt: u32,
    pub outcome: Result<Outcome>,
    /// Set for the work of a resume: settled by resuming again.
    pub resume: Option<Resumed>,
}

struct Slot {
    now: chrono::DateTime<chrono::Utc>,
    kind: String,
    key: String,
    attempt: u32,
    cancel: Arc<Cancel>,
    landed: Option<Result<Outcome>>,
    resume: Option<Resumed>,
    /// What the effect holds, as its executor and its outcome report.
    bytes: usize,
}

#[derive(Default)]
struct State {
    slots: HashMap<String, Slot>,
    /// Landed outcomes sent to the settling threads and not settled yet.
    settling: usize,
    /// Runs whose resume's work landed and is being settled: still
    /// `resuming` until the resume commits.
    settling_resumes: std::collections::HashSet<String>,
}

/// The effects of one runtime in flight, and its settling threads.
/// An effect to execute on one of the runtime's flight threads.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
pub(crate) struct Flights {
    state: Mutex<State>,
    quiet: Condvar,
    queue: Mutex<Option<mpsc::Sender<String>>>,
    /// The flight threads' queue (started on first use).
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// Jobs given to the flight threads and not finished.
    thread_jobs: std::sync::atomic::AtomicUsize,
    /// The bytes the slots hold, in all.
    bytes: std::sync::atomic::AtomicUsize,
}

impl Flights {
    /// How many effects are in flight (landed and not settled included).
    pub fn count(&self) -> usize {
        self.state.lock().slots.len()
    }

    /// How many effects are out and have not landed: what
    /// [`crate::RuntimeConfig::max_in_flight`] bounds.
    pub fn out(&self) -> usize {
        self.state
            .lock()
            .slots
            .values()
            .filter(|s| s.landed.is_none())
            .count()
    }

    /// The bytes the effects in flight hold, as reported: what
    /// [`crate::RuntimeConfig::max_in_flight_bytes`] bounds.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::SeqCst)
    }

    /// Counts `bytes` more for `run_id`'s flight (none: nothing).
    fn add_bytes(&self, run_id: &str, bytes: usize) {
        let mut state = self.state.lock();
        if let Some(slot) = state.slots.get_mut(run_id) {
            slot.bytes = slot.bytes.saturating_add(bytes);
            self.bytes.fetch_add(bytes, Ordering::SeqCst);
        }
    }

    /// Whether an effect of `run_id` is in flight.
    pub fn flying(&self, run_id: &str) -> bool {
        self.state.lock().slots.contains_key(run_id)
    }

    /// Records a new flight of `run_id`'s effect `key`, `attempt`.
    fn insert(&self, run_id: &str, flight: &Flight<'_>) -> Arc<Cancel> {
        let cancel = Arc::new(Cancel::default());
        self.state.lock().slots.insert(
            run_id.to_string(),
            Slot {
                now: flight.now,
                kind: flight.kind.to_string(),
                key: flight.key.to_string(),
                attempt: flight.attempt,
                cancel: cancel.clone(),
                landed: None,
                resume: flight.resume.clone(),
                bytes: 0,
            },
        );
        cancel
    }

    /// Tells `run_id`'s effect in flight, if any, that the run was
    /// cancelled.
    pub fn cancel(&self, run_id: &str) {
        let cancel = self
            .state
            .lock()
            .slots
            .get(run_id)
            .map(|s| s.cancel.clone());
        if let Some(cancel) = cancel {
            cancel.fire();
        }
    }

    /// How many effects hold (or wait for) a flight thread.
    pub fn thread_jobs(&self) -> usize {
        self.thread_jobs.load(Ordering::SeqCst)
    }

    /// Whether the work of a resume of `run_id` (an approved tool batch)
    /// is in flight: the run still waits, and its resume is under way.
    pub fn resuming(&self, run_id: &str) -> bool {
        let state = self.state.lock();
        state.settling_resumes.contains(run_id)
            || state.slots.get(run_id).is_some_and(|s| s.resume.is_some())
    }

    /// Ends the settling of `run_id`'s resume ([`Flights::resuming`]).
    pub(crate) fn resume_settled(&self, run_id: &str) {
        self.state.lock().settling_resumes.remove(run_id);
    }

    /// The runs whose effects fly and have not landed, with the status
    /// their runs keep while they fly (`running`; `waiting` for the work
    /// of a resume).
    pub fn airborne(&self) -> Vec<(String, Arc<Cancel>, super::model::RunStatus)> {
        self.state
            .lock()
            .slots
            .iter()
            .filter(|(_, s)| s.landed.is_none())
            .map(|(id, s)| {
                let keeps = match s.resume {
                    Some(_) => super::model::RunStatus::Waiting,
                    None => super::model::RunStatus::Running,
                };
                (id.clone(), s.cancel.clone(), keeps)
            })
            .collect()
    }

    fn landed(&self, run_id: &str, outcome: Result<Outcome>) {
        {
            let mut state = self.state.lock();
            let Some(slot) = state.slots.get_mut(run_id) else {
                return;
            };
            if slot.landed.is_some() {
                return;
            }
            // A landed outcome is held until it is settled.
            let size = match &outcome {
                Ok(Outcome::Completed(v)) => json_size(v),
                _ => 0,
            };
            slot.bytes = slot.bytes.saturating_add(size);
            self.bytes.fetch_add(size, Ordering::SeqCst);
            slot.landed = Some(outcome);
            state.settling += 1;
        }
        let sent = self
            .queue
            .lock()
            .as_ref()
            .is_some_and(|q| q.send(run_id.to_string()).is_ok());
        if !sent {
            // No settling thread (the runtime is going away): the run is
            // given up, and another executor replays the step.
            self.take(run_id);
            self.settled();
        }
    }

    /// Takes `run_id`'s landed outcome (and ends its flight).
    pub fn take(&self, run_id: &str) -> Option<Landed> {
        let mut state = self.state.lock();
        // Not landed yet: it stays in flight.
        state.slots.get(run_id)?.landed.as_ref()?;
        let slot = state.slots.remove(run_id)?;
        self.bytes.fetch_sub(slot.bytes, Ordering::SeqCst);
        if slot.resume.is_some() {
            state.settling_resumes.insert(run_id.to_string());
        }
        Some(Landed {
            now: slot.now,
            kind: slot.kind,
            key: slot.key,
            attempt: slot.attempt,
            outcome: slot.landed?,
            resume: slot.resume,
        })
    }

    /// Puts a landed outcome back, to be settled again later (its
    /// settling failed on something a later try may not meet).
    fn put_back(&self, run_id: &str, landed: Landed) {
        // The outcome it holds counts again until it is settled.
        let bytes = match &landed.outcome {
            Ok(Outcome::Completed(v)) => json_size(v),
            _ => 0,
        };
        self.bytes.fetch_add(bytes, Ordering::SeqCst);
        let mut state = self.state.lock();
        state.slots.insert(
            run_id.to_string(),
            Slot {
                now: landed.now,
                kind: landed.kind,
                key: landed.key,
                attempt: landed.attempt,
                cancel: Arc::new(Cancel::default()),
                landed: Some(landed.outcome),
                resume: landed.resume,
                bytes,
            },
        );
        state.settling += 1;
    }

    /// Queues `run_id`'s landed outcome for settling again after `pause`.
    fn settle_later(weak: Weak<Inner>, run_id: String, pause: Duration) {
        let _ = std::thread::Builder::new()
            .name("stepwell-settle-retry".into())
            .spawn(move || {
                std::thread::sleep(pause);
                if let Some(inner) = weak.upgrade() {
                    let sent = inner
                        .flights
                        .queue
                        .lock()
                        .as_ref()
                        .is_some_and(|q| q.send(run_id.clone()).is_ok());
                    if !sent {
                        inner.flights.take(&run_id);
                        inner.flights.settled();
                    }
                }
            });
    }

    fn settled(&self) {
        let mut state = self.state.lock();
        state.settling = state.settling.saturating_sub(1);
        if state.slots.is_empty() && state.settling == 0 {
            self.quiet.notify_all();
        }
    }

    /// Waits until no effect is in flight and every landed one is settled,
    /// at most `timeout`. Returns whether that happened.
    pub fn wait_quiet(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut state = self.state.lock();
        while !(state.slots.is_empty() && state.settling == 0) {
            if self.quiet.wait_until(&mut state, until).timed_out() {
                return state.slots.is_empty() && state.settling == 0;
            }
        }
        true
    }
}

/// The size of `value` as compact JSON, counted without building it.
pub fn json_size(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

impl Runtime {
    /// How many effects of this runtime are in flight.
    pub fn in_flight(&self) -> usize {
        self.inner.flights.count()
    }

    /// Waits until none of this runtime's effects is in flight and every
    /// run whose effect landed was continued (as far as its driver budget
    /// goes), at most `timeout`. Returns whether that happened.
    pub fn wait_in_flight(&self, timeout: Duration) -> bool {
        self.inner.flights.wait_quiet(timeout)
    }

    /// Records a flight of `run_id`'s effect and the landing its outcome
    /// comes back through; starts the settling threads on first use.
    pub(crate) fn take_off(
        &self,
        run_id: &str,
        flight: &Flight<'_>,
        span: super::trace::Span,
    ) -> Landing {
        self.start_settling();
        let cancel = self.inner.flights.insert(run_id, flight);
        Landing {
            inner: Arc::downgrade(&self.inner),
            run_id: run_id.to_string(),
            cancel,
            landed: false,
            span,
        }
    }

    /// Executes `job` on one of the runtime's flight threads
    /// ([`crate::RuntimeConfig::flight_threads`], started on first use): a
    /// bounded pool for effects that hold a thread while they run (tool
    /// instances, commands). A step holds its effect back rather than queue
    /// past the pool ([`crate::effects::EffectHandler::own_executor`]).
    pub(crate) fn fly_job(&self, job: Job) {
        let mut jobs = self.inner.flights.jobs.lock();
        if jobs.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..self.config().flight_threads.max(1) {
                let rx = rx.clone();
                let _ = std::thread::Builder::new()
                    .name(format!("stepwell-flight-{i}"))
                    .spawn(move || loop {
                        let next = rx.lock().recv();
                        match next {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    });
            }
            *jobs = Some(tx);
        }
        if let Some(tx) = jobs.as_ref() {
            let flights = Arc::downgrade(&self.inner);
            self.inner
                .flights
                .thread_jobs
                .fetch_add(1, Ordering::SeqCst);
            // A send fails only once the runtime is going away: the job
            // (its landing) is dropped, and lands `effect_lost`.
            let _ = tx.send(Box::new(move || {
                job();
                if let Some(inner) = flights.upgrade() {
                    inner.flights.thread_jobs.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
    }

    fn start_settling(&self) {
        let mut queue = self.inner.flights.queue.lock();
        if queue.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel::<String>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..self.config().drive_workers.max(2) {
            let (weak, rx) = (Arc::downgrade(&self.inner), rx.clone());
            let _ = std::thread::Builder::new()
                .name(format!("stepwell-settle-{i}"))
                .spawn(move || settle_loop(&weak, &rx));
        }
        let weak = Arc::downgrade(&self.inner);
        let _ = std::thread::Builder::new()
            .name("stepwell-flight-watch".into())
            .spawn(move || watch_loop(&weak));
        *queue = Some(tx);
    }

    /// Continues `run_id`, whose effect landed: the step is replayed with
    /// the landed outcome, and the run goes on under the driver's budget.
    /// A failure a later try may not meet (the store away) puts the
    /// outcome back and tries again a second later: the effect is not
    /// executed again for it.
    fn settle_landed(&self, run_id: &str) -> Result<()> {
        // The thread the effect took off from drops its hold at once; it
        // is the only one that may hold the run's lock meanwhile.
        let guard = loop {
            match self.locks().lock(run_id, Duration::from_secs(10)) {
                Ok(guard) => break guard,
                Err(super::locks::LockRefused::Busy) => continue,
                Err(super::locks::LockRefused::Reentered) => {
                    return Err(Error::Conflict {
                        run_id: run_id.to_string(),
                        reason: "the run is already executing in this thread".into(),
                    })
                }
            }
        };
        let Some(landed) = self.inner.flights.take(run_id) else {
            return Ok(());
        };
        if landed.resume.is_some() {
            let settled = self.settle_resume(run_id, guard, landed);
            self.inner.flights.resume_settled(run_id);
            return settled;
        }
        let (mut txn, run) = match self.claim_locked(run_id, Duration::ZERO, guard) {
            Ok(held) => held,
            Err(
                e
                @ (Error::Conflict { .. } | Error::RunNotFound { .. } | Error::Quarantined { .. }),
            ) => {
                // Not ours any more (taken over, gone, set aside): stop
                // renewing the lease it held while it flew.
                self.keeper_drop_hold(run_id);
                return Err(e);
            }
            Err(e) => {
                self.retry_settling(run_id, landed, &e);
                return Ok(());
            }
        };
        let kept = landed.kept();
        txn.landed = Some(landed);
        txn.fly = true;
        txn.stop_after(self.config().drive_time_per_run);
        let budget = self.config().drive_steps_per_run.max(1);
        let after = match self.run_steps(&mut txn, run, budget, Vec::new(), 0) {
            Ok(after) => after,
            Err(e @ Error::Conflict { .. }) => return Err(e),
            Err(e) => {
                let Some(kept) = kept else {
                    return Err(e);
                };
                // The lease stays held (renewed), and the outcome is
                // settled again later (if it was recorded meanwhile, the
                // replay reuses the record instead).
                txn.detach();
                drop(txn);
                self.retry_settling(run_id, kept, &e);
                return Ok(());
            }
        };
        if !txn.flew && after.status == super::model::RunStatus::Running {
            // Used its budget: behind the runs that wait for theirs.
            let later = later(&txn);
            drop(txn);
            self.store().defer(run_id, None, &|_| lease_now() + later)?;
        }
        Ok(())
    }

    /// Puts `landed` back and settles it again a second later (`why`: what
    /// failed this time).
    pub(super) fn retry_settling(&self, run_id: &str, landed: Landed, why: &Error) {
        tracing::warn!(run_id = %run_id, error = %why, "settling an effect that landed: trying again in 1 s");
        self.inner.flights.put_back(run_id, landed);
        Flights::settle_later(
            Arc::downgrade(&self.inner),
            run_id.to_string(),
            Duration::from_secs(1),
        );
    }
}

impl Landed {
    /// A copy to settle again if this settling fails (a host failure that
    /// landed is not kept: the effect is executed again, as inside a step).
    pub(super) fn kept(&self) -> Option<Landed> {
        let outcome = self.outcome.as_ref().ok()?.clone();
        Some(Landed {
            now: self.now,
            kind: self.kind.clone(),
            key: self.key.clone(),
            attempt: self.attempt,
            outcome: Ok(outcome),
            resume: self.resume.clone(),
        })
    }
}

/// How long a run held back for want of a flight waits before a driver
/// takes it again.
const HOLD_BACK: Duration = Duration::from_millis(250);

/// When a run left running by `txn` is taken again: at once, or after
/// [`HOLD_BACK`] if its effect could not fly.
pub(crate) fn later(txn: &super::txn::RunTxn<'_>) -> chrono::Duration {
    if txn.held_back {
        chrono::Duration::milliseconds(HOLD_BACK.as_millis() as i64)
    } else {
        chrono::Duration::zero()
    }
}

/// How often the runs of effects in flight are looked at for a cancel
/// made elsewhere (another process, another host).
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Fires the cancel of every effect in flight whose run was cancelled (or
/// otherwise moved on) by another process: a cancel in this runtime fires
/// at once; one made elsewhere is seen here within [`WATCH_EVERY`].
fn watch_loop(weak: &Weak<Inner>) {
    loop {
        std::thread::sleep(WATCH_EVERY);
        let Some(inner) = weak.upgrade() else {
            return;
        };
        for (run_id, cancel, keeps) in inner.flights.airborne() {
            let over = match inner.store_ref().run_status(&run_id) {
                Ok(Some(status)) => status != keeps,
                Ok(None) => true,
                Err(_) => false,
            };
            if over {
                cancel.fire();
            }
        }
    }
}

fn settle_loop(weak: &Weak<Inner>, rx: &Mutex<mpsc::Receiver<String>>) {
    loop {
        let next = rx.lock().recv();
        let Ok(run_id) = next else {
            return;
        };
        let Some(inner) = weak.upgrade() else {
            return;
        };
        let rt = Runtime { inner };
        match super::panics::catch(|| rt.settle_landed(&run_id)) {
            Ok(Ok(())) => {}
            Ok(Err(
                Error::Conflict { .. } | Error::RunNotFound { .. } | Error::Quarantined { .. },
            )) => {}
            Ok(Err(e)) => {
                tracing::warn!(run_id = %run_id, error = %e, "settling an effect that landed");
                rt.set_aside(&run_id, e);
            }
            Err(panic) => {
                // The thread goes on; the run's lease is given up, and the
                // step replayed by whoever takes the run.
                tracing::error!(run_id = %run_id, panic = %panic, "settling an effect that landed");
                rt.inner.flights.take(&run_id);
                rt.keeper_drop_hold(&run_id);
                let _ = rt.store().release(&run_id, rt.holder_id());
            }
        }
        rt.inner.flights.settled();
    }
}

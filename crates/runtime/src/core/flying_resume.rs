//! The work of a resume in flight: a person approves a tool batch, and the
//! batch (seconds, minutes) runs off the call that approved it.
//!
//! The resume's `started` record (`<effect key>:resumed`) is written ahead,
//! the run keeps its lease and stays `waiting`, and the work runs on one of
//! the runtime's flight threads. When it lands, a settling thread claims the
//! run again and does the same resume once more under that lease: the
//! resume hook finds the landed answer, records it ahead and the resume
//! commits as one executed inside the call would. A cancel reaches the work
//! through its [`Cancel`](super::flight::Cancel); a crash while it runs
//! leaves the `started` record, and the same resume given again runs the
//! work again (the documented window, as for any effect).

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::flight::{Flight, Landed, Resumed};
use super::locks::RunLockGuard;
use super::model::{RunState, WaitState};
use super::runtime::{Hold, Resume, Runtime};
use super::{Error, Result};
use crate::effects::{EffectCx, EffectHandler, Outcome};

/// What leaves in flight when a resume's work flies: the hook's effect,
/// the wait it ends, and that effect's key.
pub(crate) struct ResumeWork {
    pub handler: Arc<dyn EffectHandler>,
    pub wait: WaitState,
    pub key: String,
}

/// The hook's answer as a landing carries it: `[written]`, or `[]` for
/// "write the payload as it is".
fn landed_of(written: Option<Value>) -> Outcome {
    Outcome::Completed(Value::Array(written.into_iter().collect()))
}

/// The hook's answer back from a landed outcome ([`landed_of`]).
pub(crate) fn written_of(outcome: Outcome) -> Result<Option<Value>> {
    match outcome {
        Outcome::Completed(Value::Array(mut a)) if a.len() <= 1 => Ok(a.pop()),
        _ => Err(Error::invalid(
            "payload",
            "the work of the resume landed without an answer",
        )),
    }
}

impl Runtime {
    /// Whether this runtime is carrying out a resume of `run_id` in flight
    /// (an approved tool batch): the run still waits, and its wait ends
    /// when the work lands.
    pub fn resuming(&self, run_id: &str) -> bool {
        self.inner.flights.resuming(run_id)
    }

    /// Whether the work of a resume by `handler` with `payload` flies
    /// ([`EffectHandler::resume_flies`]): `Err(Busy)` when it would, but
    /// [`crate::RuntimeConfig::max_in_flight`] effects are out (or their
    /// bytes reach [`crate::RuntimeConfig::max_in_flight_bytes`]): the
    /// resume is refused, nothing written, rather than run inside the call.
    /// A job waits for a free flight thread (with its cancel armed).
    pub(super) fn resume_room(
        &self,
        handler: &dyn EffectHandler,
        wait: &WaitState,
        payload: &Value,
    ) -> Result<bool> {
        let config = self.config();
        if !handler.resume_flies(wait, payload) || config.max_in_flight == 0 {
            return Ok(false);
        }
        if self.inner.flights.out() < config.max_in_flight && self.bytes_room() {
            return Ok(true);
        }
        Err(Error::Busy {
            reason: format!(
                "{} effects are in flight on this host, as many as it allows: answer again shortly",
                self.inner.flights.out()
            ),
        })
    }

    /// Whether the effects in flight hold less than
    /// [`crate::RuntimeConfig::max_in_flight_bytes`] (or none is out: one
    /// always may fly).
    pub(super) fn bytes_room(&self) -> bool {
        let flights = &self.inner.flights;
        flights.out() == 0 || flights.bytes() < self.config().max_in_flight_bytes
    }

    /// What a resume hook is told: the effect `key` that started the wait.
    pub(super) fn resume_cx<'a>(
        &'a self,
        run: &'a RunState,
        key: &'a str,
        cancel: Option<&'a Arc<super::flight::Cancel>>,
    ) -> EffectCx<'a> {
        let seq = run
            .vars
            .get("_runtime")
            .and_then(|r| r.get("effect_seq"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        EffectCx {
            cancel,
            ..self.cx_at(run, seq, key, self.now(), 1, 0)
        }
    }

    /// Sends the work of `run`'s resume with `payload` off on a flight
    /// thread. The caller detaches its hold: the lease stays this
    /// runtime's until the work lands and the resume is settled.
    pub(super) fn fly_resume(&self, run: &RunState, payload: &Value, work: ResumeWork) {
        let ResumeWork { handler, wait, key } = work;
        let resumed_key = format!("{key}:resumed");
        let flight = Flight {
            now: self.now(),
            kind: handler.kind(),
            key: &resumed_key,
            attempt: 1,
            resume: Some(Resumed {
                wait_key: wait.wait_key.clone(),
                payload: payload.clone(),
            }),
        };
        let mut span = self.inner.tracer.start("stepwell.effect", None);
        span.attr_with("stepwell.effect.kind", || handler.kind().to_string());
        span.attr("stepwell.effect.in_flight", true);
        span.attr("stepwell.effect.resume", true);
        let landing = self.take_off(&run.run_id, &flight, span);
        let (rt, run, payload) = (self.clone(), run.clone(), payload.clone());
        landing.hold_bytes(super::flight::json_size(&run.vars) + super::flight::json_size(&wait));
        self.fly_job(Box::new(move || {
            let cancel = landing.cancel().clone();
            let _scope = super::trace::scope(landing.span_context());
            let cx = rt.resume_cx(&run, &key, Some(&cancel));
            match super::panics::catch(|| handler.on_resume(&cx, &wait, &payload)) {
                Ok(Ok(written)) => landing.land(landed_of(written)),
                Ok(Err(e)) => landing.land_error(e),
                Err(panic) => landing.land(Outcome::Failed(crate::effects::Failure::permanent(
                    "host_panic",
                    format!("the host failed while carrying out the resume: {panic}"),
                ))),
            }
        }));
    }

    /// Settles the landed work of a resume of `run_id`: the same resume
    /// again, under the lease it kept, taking the landed answer. Work that
    /// failed on the host (the store, a panic) gives the run up: it still
    /// waits, its `started` record says the work began, and the same
    /// resume given again does it again. A store failure while settling
    /// keeps the answer and tries again a second later.
    pub(super) fn settle_resume(
        &self,
        run_id: &str,
        guard: RunLockGuard<'_>,
        landed: Landed,
    ) -> Result<()> {
        let Some(resumed) = landed.resume.clone() else {
            return Ok(());
        };
        let failed = match &landed.outcome {
            Err(e) => Some(e.to_string()),
            Ok(Outcome::Failed(f)) => Some(format!("{}: {}", f.code, f.message)),
            Ok(_) => None,
        };
        if let Some(why) = failed {
            tracing::warn!(run_id = %run_id, error = %why, "the work of a resume failed on the host; the run still waits");
            self.give_up(run_id);
            return Ok(());
        }
        let (mut txn, run) = match self.claim_locked(run_id, Duration::ZERO, guard) {
            Ok(held) => held,
            // The store away: the lease stays held (renewed) and the
            // answer is settled again a second later.
            Err(e @ Error::Store(_)) => {
                self.retry_settling(run_id, landed, &e);
                return Ok(());
            }
            // Not ours any more (cancelled and taken, gone, set aside):
            // nothing is recorded.
            Err(_) => {
                self.keeper_drop_hold(run_id);
                return Ok(());
            }
        };
        let kept = landed.kept();
        txn.landed = Some(landed);
        txn.keep = true;
        let resume = Resume {
            run_id,
            wait_key: Some(&resumed.wait_key),
            size: serde_json::to_vec(&resumed.payload).map_or(0, |b| b.len()),
            cause: None,
            depth: 0,
            tick: true,
        };
        let hold = Hold::Claimed(Box::new((txn, run)));
        match self.resume_held(resume, resumed.payload, hold) {
            Ok(_) => Ok(()),
            // Cancelled or otherwise moved on meanwhile: the answer is
            // not recorded.
            Err(Error::StaleResume { .. } | Error::Conflict { .. } | Error::Quarantined { .. }) => {
                self.keeper_drop_hold(run_id);
                Ok(())
            }
            // The store away: its hold gave the lease up, which the retry
            // claims again (the batch's results, once recorded ahead, are
            // reused by any resume of the wait).
            Err(e @ Error::Store(_)) => {
                if let Some(kept) = kept {
                    self.retry_settling(run_id, kept, &e);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Stops holding `run_id` for its work in flight: its lease is given
    /// up.
    fn give_up(&self, run_id: &str) {
        self.keeper_drop_hold(run_id);
        let _ = self.store().release(run_id, self.holder_id());
    }
}

//! The driver: one pass moves along everything that is due. Any number of
//! drivers (threads, processes, machines) may run passes on one store at
//! once: each run is claimed before it is touched, so a due wait is
//! resumed once, a running run is ticked by one driver at a time, and a
//! finished child's parent is resumed once.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::clock::format_time;
use super::keys::terminal_key;
use super::model::{RunState, RunStatus, StepRecord, StepStatus};
use super::runtime::Runtime;
use super::txn::{holder_is_dead, lease_now};
use super::{Error, Result};
use crate::effects::subworkflow::{self, OnChildFailure};
use crate::effects::Outcome;

/// A run a driver pass could not move, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunError {
    /// The run.
    pub run_id: String,
    /// Why (a reason code, then what happened).
    pub error: String,
}

/// What one [`Runtime::drive_once`] pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DriveReport {
    /// Runs whose due time wait or event deadline was resolved.
    pub due_resumed: Vec<String>,
    /// Running runs that were ticked (new and async children, runs whose
    /// executor died).
    pub ticked: Vec<String>,
    /// Parents resumed (or failed) because their child ended.
    pub parents_resumed: Vec<String>,
    /// Unfinished children of cancelled parents, cancelled now.
    pub orphans_cancelled: Vec<String>,
    /// Runs another executor holds: left to it.
    pub busy: Vec<String>,
    /// Runs set aside because they cannot be read, with why.
    pub quarantined: Vec<RunError>,
    /// Runs the pass could not move, with why.
    pub errors: Vec<RunError>,
    /// Runs of workflows this runtime does not have (a plugin's it was
    /// built without): left untouched to the hosts that have them.
    pub foreign: Vec<String>,
}

impl DriveReport {
    /// Adds what `other` (a part of the same pass) did.
    fn merge(&mut self, other: DriveReport) {
        self.due_resumed.extend(other.due_resumed);
        self.ticked.extend(other.ticked);
        self.parents_resumed.extend(other.parents_resumed);
        self.orphans_cancelled.extend(other.orphans_cancelled);
        self.busy.extend(other.busy);
        self.quarantined.extend(other.quarantined);
        self.errors.extend(other.errors);
        self.foreign.extend(other.foreign);
    }

    /// Whether the pass moved anything.
    pub fn moved_anything(&self) -> bool {
        !(self.due_resumed.is_empty()
            && self.ticked.is_empty()
            && self.parents_resumed.is_empty()
            && self.orphans_cancelled.is_empty()
            && self.quarantined.is_empty())
    }
}

/// The longest an idle driver of a store that signals work waits between
/// passes ([`Runtime::idle_pause`]): the safety net for a lost signal, and
/// for runs whose executor died on this host (taken over by the next pass).
pub const IDLE_POLL: Duration = Duration::from_secs(5);

/// How soon an idle driver looks again when something is due already.
const DUE_NOW_PAUSE: Duration = Duration::from_millis(20);

/// The longest a run the driver cannot move is set aside for.
const MAX_BACK_OFF_SECS: i64 = 300;

/// Why the pass took a run on.
#[derive(Clone, Copy, PartialEq)]
enum Why {
    Due,
    Running,
}

impl Runtime {
    /// One pass of the driver: cancels orphans of cancelled parents,
    /// resolves due time waits and event deadlines, resumes (or fails)
    /// parents whose child ended, and ticks running runs nobody holds. Each
    /// run gets at most [`crate::RuntimeConfig::drive_steps_per_run`] steps
    /// per pass; each part takes at most
    /// [`crate::RuntimeConfig::drive_batch`] runs. A run that cannot be read
    /// is quarantined and reported; errors of single runs are collected in
    /// the report; only a failing store stops the pass.
    pub fn drive_once(&self) -> Result<DriveReport> {
        let started = std::time::Instant::now();
        let mut report = DriveReport::default();
        let batch = self.config().drive_batch.max(1);
        for id in self.store().list_orphans(batch)? {
            match self.cancel_run_by(&id, Some("its parent run was cancelled"), "driver") {
                Ok(_) => report.orphans_cancelled.push(id),
                Err(e) => self.not_moved(&id, Why::Running, e, &mut report)?,
            }
        }
        // Listed past the runs found foreign, which cannot fill a batch.
        let foreign = &self.inner.foreign;
        let wider = batch.saturating_add(foreign.count());
        let due = foreign.past(self.store().list_due(self.now(), wider)?, batch);
        self.drive_runs(&due, Why::Due, &mut report, None)?;
        let mut ended = self.store().list_ended_children(wider)?;
        ended.retain(|(parent, _)| !foreign.contains(parent));
        ended.truncate(batch);
        for (parent, child) in ended {
            match self.resume_parent(&parent, &child) {
                Ok(true) => report.parents_resumed.push(parent),
                Ok(false) => {}
                Err(Error::Conflict { .. }) => report.busy.push(parent),
                Err(e) => self.not_moved(&parent, Why::Running, e, &mut report)?,
            }
        }
        let mut claimable = foreign.past(self.store().list_claimable(lease_now(), wider)?, batch);
        // Hosts sharing a store list the same runs: each starts at a point
        // of its own in the list, so that they do not walk it in step,
        // each losing the claims the others just won.
        if claimable.len() > 1 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as usize);
            let start = nanos % claimable.len();
            claimable.rotate_left(start);
        }
        let until = started + self.config().drive_pass_time;
        self.drive_runs(&claimable, Why::Running, &mut report, Some(until))?;
        // Runs whose executor died on this host: taken over at once, not at
        // the end of its lease. (Checking a holder is cheap: look further
        // than one batch.)
        for (id, holder) in self.store().list_leased(batch.saturating_mul(16))? {
            if holder_is_dead(&holder) {
                self.drive_run(&id, Why::Running, &mut report)?;
            }
        }
        Ok(report)
    }

    /// How long a driver whose last pass moved nothing may wait for a
    /// signal before its next pass. A store that
    /// [signals work](crate::store::Store::signals_work) (PostgreSQL) tells
    /// of new runs, resumes, events and commands; what falls due with time
    /// (a time wait, a deferral, a lapsing lease) is asked of it
    /// ([`crate::store::Store::next_due`]): the pause lasts until the
    /// earliest, at most [`IDLE_POLL`] (or `interval`, if longer) as a
    /// safety net. A store that does not signal but knows what falls due
    /// (SQLite) is polled every `interval`, or sooner when something falls
    /// due before that; any other store every `interval`.
    pub fn idle_pause(&self, interval: Duration) -> Duration {
        let signals = self.store().signals_work();
        let next = match self.store().next_due(self.now()) {
            Ok(Some(next)) => next,
            Ok(None) => return interval,
            Err(e) => {
                tracing::warn!(error = %e, "asking the store what falls due next");
                return interval;
            }
        };
        let until = |at: Option<DateTime<Utc>>, now: DateTime<Utc>| {
            at.map(|at| (at - now).to_std().unwrap_or(Duration::ZERO))
        };
        let soonest = [until(next.wait, self.now()), until(next.claim, lease_now())]
            .into_iter()
            .flatten()
            .min();
        // Polled: never past the interval. Signalled: the interval, or
        // the safety net if longer.
        let cap = if signals {
            interval.max(IDLE_POLL)
        } else {
            interval
        };
        match soonest {
            None => cap,
            // Due already, yet the pass left it: it fell due after the
            // pass listed it (a timer: looked at again very soon), or the
            // pass cannot move it (taken by another driver, a workflow this
            // runtime does not have: the next look costs a few queries).
            Some(d) if d.is_zero() => interval.min(DUE_NOW_PAUSE),
            // Just after it falls due (the store keeps microseconds).
            Some(d) => (d + Duration::from_millis(1)).min(cap),
        }
    }

    /// Moves `ids` along, each by one of
    /// [`crate::RuntimeConfig::drive_workers`] threads (the pass's order
    /// with one), the first always, the others only before `until`. A
    /// failing store stops them all.
    fn drive_runs(
        &self,
        ids: &[String],
        why: Why,
        report: &mut DriveReport,
        until: Option<std::time::Instant>,
    ) -> Result<()> {
        // Past `until`, not counting the time this thread spent compiling
        // components since `since` (a cold cache does not shorten a pass).
        let late = |i: usize, since: Duration| {
            i > 0
                && until.is_some_and(|u| {
                    std::time::Instant::now() >= u + (crate::wasm::time_compiling() - since)
                })
        };
        let workers = self.config().drive_workers.clamp(1, ids.len().max(1));
        if workers == 1 {
            let since = crate::wasm::time_compiling();
            for (i, id) in ids.iter().enumerate() {
                if late(i, since) {
                    break;
                }
                self.drive_run(id, why, report)?;
            }
            return Ok(());
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let reports: Vec<Result<DriveReport>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let since = crate::wasm::time_compiling();
                        let mut mine = DriveReport::default();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if i >= ids.len()
                                || late(i, since)
                                || failed.load(std::sync::atomic::Ordering::Relaxed)
                            {
                                return Ok(mine);
                            }
                            if let Err(e) = self.drive_run(&ids[i], why, &mut mine) {
                                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        for part in reports {
            report.merge(part?);
        }
        Ok(())
    }

    /// Claims `id` without waiting and moves it along.
    fn drive_run(&self, id: &str, why: Why, report: &mut DriveReport) -> Result<()> {
        let (mut txn, mut run) = match self.claim(id, Duration::ZERO) {
            Ok(held) => held,
            Err(Error::Conflict { .. }) => {
                report.busy.push(id.to_string());
                return Ok(());
            }
            Err(Error::RunNotFound { .. } | Error::Quarantined { .. }) => return Ok(()),
            Err(e) => return self.not_moved(id, why, e, report),
        };
        if self.is_foreign(&run) {
            drop(txn);
            self.inner.foreign.note(id);
            report.foreign.push(id.to_string());
            return Ok(());
        }
        let mut pending = Vec::new();
        match (why, run.status) {
            (Why::Due, RunStatus::Waiting) => match self.resolve_due(&mut run) {
                Ok(Some(record)) => pending.push(record),
                // Resumed by someone else since it was listed.
                Ok(None) => return Ok(()),
                Err(e) => return self.not_moved(id, why, e, report),
            },
            (Why::Running, RunStatus::Running) => {}
            _ => return Ok(()),
        }
        let budget = self.config().drive_steps_per_run.max(1);
        txn.stop_after(self.config().drive_time_per_run);
        txn.fly = true;
        match self.run_steps(&mut txn, run, budget, pending, 0) {
            Ok(after) => {
                match why {
                    Why::Due => report.due_resumed.push(id.to_string()),
                    Why::Running => report.ticked.push(id.to_string()),
                }
                if after.status == RunStatus::Running && !txn.flew {
                    // Used its steps for this pass: behind the runs that
                    // wait for theirs in the next one (held back for want
                    // of a flight: a moment later).
                    let later = super::flight::later(&txn);
                    drop(txn);
                    self.store().defer(id, None, &|_| lease_now() + later)?;
                }
            }
            Err(Error::Conflict { .. }) => report.busy.push(id.to_string()),
            Err(e) => {
                drop(txn);
                self.not_moved(id, why, e, report)?;
            }
        }
        Ok(())
    }

    /// A run this runtime could not move outside a pass (a landed effect
    /// whose settling failed): quarantined, or set aside for a while, as a
    /// pass would.
    pub(crate) fn set_aside(&self, id: &str, e: Error) {
        let reason = e.to_string();
        let mut report = DriveReport::default();
        let done = match self.quarantine_or_report(id, e, &mut report) {
            Ok(true) => self.back_off(id, Why::Running, &reason),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            tracing::warn!(run_id = %id, error = %e, "setting a run aside");
        }
    }

    /// Whether `run` is of a workflow this runtime does not have: none
    /// registered, embedded by its plugins or recorded in the store (a
    /// recorded bundle it cannot load is an error of the run, not this).
    fn is_foreign(&self, run: &RunState) -> bool {
        matches!(self.workflow_of(run), Err(Error::UnknownWorkflow { .. }))
    }

    /// A run the pass took on but could not move: quarantined, or reported
    /// and set aside for a while.
    fn not_moved(&self, id: &str, why: Why, e: Error, report: &mut DriveReport) -> Result<()> {
        let reason = e.to_string();
        if self.quarantine_or_report(id, e, report)? {
            self.back_off(id, why, &reason)?;
        }
        Ok(())
    }

    /// Sets a run the pass could not move aside for a while, longer each
    /// time it fails again (1 s, 2 s, 4 s, ... up to 5 minutes), so that a
    /// few broken runs never fill every pass. A commit of the run (a resume
    /// from elsewhere, say) ends the back-off.
    fn back_off(&self, id: &str, why: Why, reason: &str) -> Result<()> {
        // Due waits are listed by the runtime's clock, running runs by the
        // system clock.
        let now = match why {
            Why::Due => self.now(),
            Why::Running => lease_now(),
        };
        self.store().defer(id, Some(reason), &|failures| {
            let secs = 1i64 << failures.saturating_sub(1).min(9);
            now + chrono::Duration::seconds(secs.min(MAX_BACK_OFF_SECS))
        })?;
        Ok(())
    }

    /// A run the pass could not move: quarantined when its stored state
    /// cannot be read (it would stop every pass), else reported (returns
    /// `true`). A store that fails as a whole stops the pass.
    fn quarantine_or_report(&self, id: &str, e: Error, report: &mut DriveReport) -> Result<bool> {
        match e.reason_code() {
            "store_corrupt" => {
                let reason = e.to_string();
                self.store().quarantine(id, &reason)?;
                report.quarantined.push(RunError {
                    run_id: id.to_string(),
                    error: reason,
                });
                Ok(false)
            }
            "store_schema" => Err(e),
            _ => {
                report.errors.push(RunError {
                    run_id: id.to_string(),
                    error: e.to_string(),
                });
                Ok(true)
            }
        }
    }

    /// Resumes (or fails) `parent` with the outcome of `child`, which has
    /// ended, if the parent still waits on it. Returns whether it did.
    fn resume_parent(&self, parent: &str, child_id: &str) -> Result<bool> {
        // A quarantined child may not even be readable: its parent learns
        // that it was set aside.
        let quarantined = self.store().quarantined(child_id)?;
        let (child, quarantined) = match quarantined {
            Some(reason) => (None, Some(reason)),
            None => match self.get_state(child_id) {
                Ok(child) => (Some(child), None),
                // The child cannot be read: it is set aside, not its
                // parent, which learns that it was.
                Err(e) if e.reason_code() == "store_corrupt" => {
                    let reason = e.to_string();
                    self.store().quarantine(child_id, &reason)?;
                    (None, Some(reason))
                }
                Err(e) => return Err(e),
            },
        };
        // A child that is not over (listed from a stale index, or gone back
        // by a restored snapshot) resumes nobody.
        if child
            .as_ref()
            .is_some_and(|c| !c.status.is_terminal() && quarantined.is_none())
        {
            return Ok(false);
        }
        let (mut txn, mut run) = self.claim(parent, Duration::ZERO)?;
        if self.is_foreign(&run) {
            self.inner.foreign.note(parent);
            return Ok(false);
        }
        let key = subworkflow::wait_key(child_id);
        let Some(wait) = run
            .waiting
            .clone()
            .filter(|w| run.status == RunStatus::Waiting && w.wait_key == key)
        else {
            return Ok(false);
        };
        let policy = OnChildFailure::of_wait(&wait);
        let outcome = match (&child, &quarantined) {
            (Some(child), _) => subworkflow::ended_child(child, policy),
            (None, reason) => {
                subworkflow::quarantined_child(child_id, reason.as_deref().unwrap_or(""), policy)
            }
        };
        match outcome {
            Outcome::Failed(failure) => {
                self.fail_waiting(&mut txn, &mut run, failure.to_string())?;
            }
            Outcome::Completed(data) => {
                self.workflow_of(&run)?;
                let record = self.end_wait(&mut run, data, "resumed", None)?;
                let budget = self.config().drive_steps_per_run.max(1);
                txn.stop_after(self.config().drive_time_per_run);
                txn.fly = true;
                match self.run_steps(&mut txn, run, budget, vec![record], 0) {
                    Err(Error::Conflict { .. }) if txn.commits == 0 => return Ok(false),
                    Err(Error::Conflict { .. }) => {}
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
            Outcome::Waiting(_) | Outcome::HostChange(_) => return Ok(false),
        }
        Ok(true)
    }

    /// Fails a held, waiting run with `message` (its wait ends unresumed).
    fn fail_waiting(
        &self,
        txn: &mut super::txn::RunTxn<'_>,
        run: &mut RunState,
        message: String,
    ) -> Result<()> {
        let now = format_time(self.now());
        let record = StepRecord {
            status: StepStatus::Failed,
            error: Some(message.clone()),
            ended_at: Some(now.clone()),
            idempotency_key: Some(terminal_key(run)),
            ..self.record(run, run.current_node.clone(), &now)
        };
        run.waiting = None;
        run.status = RunStatus::Failed;
        run.error = Some(message);
        run.updated_at = now;
        txn.keep = false;
        txn.commit(vec![record], run)?;
        self.trace_run_end(run);
        Ok(())
    }
}

//! The run transaction as the runtime drives it: a [`RunTxn`] is one
//! runtime's hold on one run (the in-process lock, the store lease, the
//! version it last saw), and every change the runtime makes to a run goes
//! through one. The [`LeaseKeeper`] renews the leases a runtime holds while
//! it works.

use std::collections::HashSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::error::Error;
use super::locks::{LockRefused, RunLockGuard};
use super::model::{RunState, RunStatus, StepRecord};
use super::runtime::Runtime;
use super::Result;
use crate::store::{Claim, Fence, LeaseAfter, LeaseRequest, Store, StoreError};

/// Leases are about real time (is the holder still alive?), whatever clock
/// the runtime shows its runs: they always use the system clock.
pub(crate) fn lease_now() -> DateTime<Utc> {
    Utc::now()
}

/// A holder id unique to this runtime:
/// `<host>:<pid>:<start>:<context>:<random>`, where `<start>` is when the
/// process started (in clock ticks since boot) and `<context>` a digest of
/// the boot and the PID namespace: together they tell a dead holder from a
/// live one in another container, and from a new process that got its pid.
pub(crate) fn new_holder_id() -> String {
    let pid = std::process::id();
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!(
        "{}:{pid}:{}:{}:{}",
        this_host(),
        process_start(pid).unwrap_or(0),
        this_context(),
        &random[..8]
    )
}

/// Whether `holder` (see [`new_holder_id`]) names a process that no longer
/// runs. Only a holder of this host, booted the same and seeing the same
/// PIDs, can be known dead: its pid is gone, or belongs to a process that
/// started at another time. Any other lease lapses at its expiry.
pub fn holder_is_dead(holder: &str) -> bool {
    if !cfg!(target_os = "linux") {
        return false;
    }
    let mut parts = holder.rsplitn(5, ':');
    let (Some(_), Some(context), Some(start), Some(pid), Some(host)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else {
        return false;
    };
    if host != this_host() || context != this_context() || start == 0 {
        return false;
    }
    match process_start(pid) {
        None => true,
        Some(now) => now != start,
    }
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`); `None` if there is no such process (or no /proc).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// A digest of this boot and this PID namespace: two processes with the
/// same one see the same pids.
fn this_context() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let namespace = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in boot.trim().bytes().chain([0]).chain(namespace.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{:08x}", h as u32)
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(system_hostname)
        .map(|h| h.trim().replace(':', "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// The host name the system gives (where `/proc` is not there).
fn system_hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes and the result is read up to its first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The leases a runtime holds, renewed by a background thread every third
/// of their lifetime until the runtime is dropped.
pub(crate) struct LeaseKeeper {
    pub holder: String,
    pub ttl: Duration,
    held: Mutex<HashSet<String>>,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl LeaseKeeper {
    /// A keeper for `holder`, and its renewing thread on `store`.
    pub fn start(holder: String, ttl: Duration, store: Arc<dyn Store>) -> Arc<LeaseKeeper> {
        let keeper = Arc::new(LeaseKeeper {
            holder,
            ttl,
            held: Mutex::new(HashSet::new()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let k = keeper.clone();
        let period = ttl / 3;
        let _ = std::thread::Builder::new()
            .name("stepwell-leases".into())
            .spawn(move || {
                let mut stop = k.stop.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    let (s, _) = k
                        .wake
                        .wait_timeout(stop, period)
                        .unwrap_or_else(|e| e.into_inner());
                    stop = s;
                    if *stop {
                        break;
                    }
                    let ids: Vec<String> = k
                        .held
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .iter()
                        .cloned()
                        .collect();
                    if !ids.is_empty() {
                        // A failed renewal is not fatal here: the holder's
                        // next fenced write tells it the lease is gone.
                        let _ = store.renew(&k.holder, &ids, lease_now() + k.ttl);
                    }
                }
            });
        keeper
    }

    /// Stops the renewing thread.
    pub fn shutdown(&self) {
        *self.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.wake.notify_all();
    }

    fn hold(&self, run_id: &str) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(run_id.to_string());
    }

    fn drop_hold(&self, run_id: &str) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(run_id);
    }

    fn until(&self) -> DateTime<Utc> {
        lease_now() + self.ttl
    }
}

/// One runtime's hold on one run. Dropping it gives the lease up. It
/// commits only its own run (and that run's records): the lock and the
/// fence it holds are that run's.
#[doc(hidden)] // for features built on the kernel; not a stable API
pub struct RunTxn<'a> {
    rt: &'a Runtime,
    run_id: String,
    /// The version the store holds as far as this hold knows (0: the run
    /// does not exist yet; the first commit creates it).
    version: u64,
    /// Whether the store lease is this runtime's.
    leased: bool,
    /// Without the lease: whether the next commit takes it (if nobody else
    /// holds a live one) instead of failing.
    take: bool,
    /// Whether the next commit keeps the lease (more steps follow) or gives
    /// it up.
    pub keep: bool,
    /// Commits made through this hold.
    pub commits: u32,
    /// When the steps taken through this hold stop (after the step under
    /// way), if they do: how the driver gives every run its turn. Set with
    /// [`RunTxn::stop_after`].
    pub(crate) deadline: Option<Deadline>,
    /// Whether a failing step commits nothing and returns the error (the
    /// workflow's `steps_never_fail`), set by the step.
    pub(crate) steps_never_fail: bool,
    /// Whether an effect that [flies](crate::effects::EffectHandler::flies)
    /// may leave the step (set by the driver and the settling threads;
    /// direct calls by [`crate::RuntimeConfig::calls_in_flight`]).
    pub(crate) fly: bool,
    /// Whether a step's effect left in flight: the hold is detached (the
    /// lease stays the runtime's, renewed, and this hold gives nothing up).
    pub(crate) flew: bool,
    /// Whether a step's effect would have flown but every flight was
    /// taken: the step committed nothing, and the run waits for room.
    pub(crate) held_back: bool,
    /// An outcome that landed for this run, settled by the replayed step.
    pub(crate) landed: Option<super::flight::Landed>,
    _guard: RunLockGuard<'a>,
}

fn lock_refused(run_id: &str, why: LockRefused) -> Error {
    Error::Conflict {
        run_id: run_id.to_string(),
        reason: match why {
            LockRefused::Busy => "another thread of this host is executing the run".into(),
            LockRefused::Reentered => {
                "the run is already executing in this thread (an effect cannot re-enter its own run)"
                    .into()
            }
        },
    }
}

impl Runtime {
    /// Takes `run_id` for executing: the in-process lock, then the store
    /// lease, waiting at most `wait` while another thread or process holds
    /// either. Returns the hold and the run as stored (offloaded values
    /// loaded back).
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn claim(&self, run_id: &str, wait: Duration) -> Result<(RunTxn<'_>, RunState)> {
        let guard = self
            .locks()
            .lock(run_id, wait)
            .map_err(|why| lock_refused(run_id, why))?;
        self.refuse_flying(run_id)?;
        self.claim_locked(run_id, wait, guard)
    }

    /// A conflict if an effect of `run_id` is in flight: its run is the
    /// flight's until it lands.
    fn refuse_flying(&self, run_id: &str) -> Result<()> {
        if self.inner.flights.flying(run_id) {
            return Err(Error::Conflict {
                run_id: run_id.to_string(),
                reason: "an effect of the run is in flight on this host".into(),
            });
        }
        Ok(())
    }

    /// Stops renewing the lease of `run_id` (held while its effect flew).
    pub(crate) fn keeper_drop_hold(&self, run_id: &str) {
        self.keeper().drop_hold(run_id);
    }

    /// [`Runtime::claim`] under the run's in-process lock, taken already.
    pub(crate) fn claim_locked<'a>(
        &'a self,
        run_id: &str,
        wait: Duration,
        guard: RunLockGuard<'a>,
    ) -> Result<(RunTxn<'a>, RunState)> {
        let deadline = Instant::now() + wait;
        let keeper = self.keeper();
        let mut pause = Duration::from_millis(1);
        let mut dead: Option<String> = None;
        loop {
            let now = lease_now();
            let request = LeaseRequest {
                holder: &keeper.holder,
                now,
                until: now + keeper.ttl,
                dead_holder: dead.as_deref(),
            };
            match self.store().claim(run_id, &request)? {
                Claim::Held(run) => {
                    keeper.hold(run_id);
                    let mut run = *run;
                    let txn = RunTxn {
                        rt: self,
                        run_id: run_id.to_string(),
                        version: run.version,
                        leased: true,
                        take: false,
                        keep: false,
                        commits: 0,
                        deadline: None,
                        steps_never_fail: false,
                        fly: false,
                        flew: false,
                        held_back: false,
                        landed: None,
                        _guard: guard,
                    };
                    self.load_offloaded(&mut run)?;
                    return Ok((txn, run));
                }
                Claim::Missing => {
                    return Err(Error::RunNotFound {
                        run_id: run_id.to_string(),
                    })
                }
                Claim::Quarantined { reason } => {
                    return Err(Error::Quarantined {
                        run_id: run_id.to_string(),
                        reason,
                    })
                }
                Claim::Busy { holder, until } => {
                    if let Some(h) = holder.as_deref().filter(|h| holder_is_dead(h)) {
                        if dead.as_deref() != Some(h) {
                            // Its process is gone: take the run over now.
                            dead = Some(h.to_string());
                            continue;
                        }
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::Conflict {
                            run_id: run_id.to_string(),
                            reason: format!(
                                "the run is being executed by {} (lease until {})",
                                holder.as_deref().unwrap_or("another holder"),
                                until.as_deref().unwrap_or("unknown")
                            ),
                        });
                    }
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
            }
        }
    }

    /// A hold on `run_id` without its lease yet: the hold's first commit
    /// takes the lease (if nobody else holds a live one; else that commit
    /// is a conflict), and so does a commit before any effect on other
    /// runs or the world. For a resume, whose first step is usually its
    /// only one: one store write instead of two. Returns the hold and the
    /// run as stored.
    ///
    /// From `remembered` (a state of the run this runtime committed) rather
    /// than the stored state if given: the first commit's fence is its
    /// version, so if the run changed since, that commit changes nothing.
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn hold_taking(
        &self,
        run_id: &str,
        wait: Duration,
        remembered: Option<RunState>,
    ) -> Result<(RunTxn<'_>, RunState)> {
        let guard = self
            .locks()
            .lock(run_id, wait)
            .map_err(|why| lock_refused(run_id, why))?;
        self.refuse_flying(run_id)?;
        let run = match remembered {
            Some(run) if run.run_id != run_id => {
                return Err(Error::invalid(
                    "run_id",
                    format!(
                        "a hold on run {run_id} cannot start from run {}",
                        run.run_id
                    ),
                ))
            }
            Some(run) => run,
            None => self.get_state(run_id)?,
        };
        Ok((
            RunTxn {
                rt: self,
                run_id: run_id.to_string(),
                version: run.version,
                leased: false,
                take: true,
                keep: false,
                commits: 0,
                deadline: None,
                steps_never_fail: false,
                fly: false,
                flew: false,
                held_back: false,
                landed: None,
                _guard: guard,
            },
            run,
        ))
    }

    /// A hold on a run that does not exist yet: its first commit creates
    /// it (and takes the lease if the run goes on).
    #[doc(hidden)] // for features built on the kernel; not a stable API
    pub fn hold_new(&self, run_id: &str) -> Result<RunTxn<'_>> {
        let guard = self
            .locks()
            .lock(run_id, Duration::ZERO)
            .map_err(|why| lock_refused(run_id, why))?;
        Ok(RunTxn {
            rt: self,
            run_id: run_id.to_string(),
            version: 0,
            leased: false,
            take: false,
            keep: false,
            commits: 0,
            deadline: None,
            steps_never_fail: false,
            fly: false,
            flew: false,
            held_back: false,
            landed: None,
            _guard: guard,
        })
    }
}

/// When a hold's steps stop: `at`, moved later by the time this thread
/// spent compiling components since `compiling` (its count then).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    compiling: Duration,
}

impl Deadline {
    /// Whether it has passed, not counting the time this thread spent
    /// compiling components (or reading them from the cache) since it was
    /// set: how far a pass gets does not depend on a cold cache.
    pub(crate) fn passed(&self) -> bool {
        Instant::now() >= self.at + (crate::wasm::time_compiling() - self.compiling)
    }
}

impl RunTxn<'_> {
    /// Stops the steps taken through this hold after the step under way
    /// once `budget` has passed (time spent compiling not counted).
    pub(crate) fn stop_after(&mut self, budget: Duration) {
        self.deadline = Some(Deadline {
            at: Instant::now() + budget,
            compiling: crate::wasm::time_compiling(),
        });
    }

    /// Whether the hold has the run's lease.
    pub(crate) fn leased(&self) -> bool {
        self.leased
    }

    /// Leaves the run to its effect in flight: the lease stays this
    /// runtime's (renewed by its keeper until the effect lands), and
    /// dropping this hold gives nothing up.
    pub(crate) fn detach(&mut self) {
        self.leased = false;
        self.flew = true;
    }

    /// Whether the run exists in the store yet.
    pub fn exists(&self) -> bool {
        self.version > 0
    }

    fn fence(&self) -> Fence<'_> {
        let holder = &self.rt.keeper().holder;
        if self.take && !self.leased {
            Fence::take(self.version, holder, lease_now())
        } else {
            Fence::held(self.version, holder)
        }
    }

    fn conflict(&self, e: StoreError) -> Error {
        if e.is_conflict() {
            Error::Conflict {
                run_id: self.run_id.clone(),
                reason: e.message,
            }
        } else {
            Error::Store(e)
        }
    }

    /// Commits `records` and `run` (whose version becomes the next one),
    /// keeping the lease if [`RunTxn::keep`] is set and the run goes on
    /// running, else giving it up. A fence that no longer holds (another
    /// writer got there first) is [`Error::Conflict`], and nothing was
    /// written.
    pub fn commit(&mut self, records: Vec<StepRecord>, run: &mut RunState) -> Result<()> {
        self.commit_with(records, run, None)
    }

    /// [`RunTxn::commit`] of a run whose vars changed, since this hold's
    /// last commit, only in the top-level keys `changed`
    /// ([`crate::store::Store::commit_changed`]).
    pub(crate) fn commit_changed(
        &mut self,
        records: Vec<StepRecord>,
        run: &mut RunState,
        changed: &[String],
    ) -> Result<()> {
        self.commit_with(records, run, Some(changed))
    }

    fn commit_with(
        &mut self,
        records: Vec<StepRecord>,
        run: &mut RunState,
        changed: Option<&[String]>,
    ) -> Result<()> {
        // A hold commits its own run: the lock and the fence are that run's.
        if run.run_id != self.run_id || records.iter().any(|r| r.run_id != self.run_id) {
            return Err(Error::invalid(
                "run_id",
                format!(
                    "a hold on run {} cannot commit run {}",
                    self.run_id, run.run_id
                ),
            ));
        }
        let keep = self.keep && run.status == RunStatus::Running;
        let keeper = self.rt.keeper();
        let after = if keep {
            LeaseAfter::Renew(keeper.until())
        } else {
            LeaseAfter::Release
        };
        run.version = self.version + 1;
        if let Err(e) = self
            .rt
            .store_commit(records, run, self.fence(), after, changed)
        {
            run.version = self.version;
            return Err(match e {
                Error::Store(e) => self.conflict(e),
                other => other,
            });
        }
        self.version += 1;
        self.commits += 1;
        match (keep, self.leased) {
            (true, false) => keeper.hold(&self.run_id),
            (false, true) => keeper.drop_hold(&self.run_id),
            _ => {}
        }
        self.leased = keep;
        self.take = false;
        Ok(())
    }

    /// Appends records ahead of this hold's next commit, if its fence still
    /// holds.
    pub fn append_ahead(&self, records: &[StepRecord]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        if let Some(r) = records.iter().find(|r| r.run_id != self.run_id) {
            return Err(Error::invalid(
                "run_id",
                format!(
                    "a hold on run {} cannot append to run {}",
                    self.run_id, r.run_id
                ),
            ));
        }
        self.rt
            .store_append_ahead(records, self.fence())
            .map_err(|e| match e {
                Error::Store(e) => self.conflict(e),
                other => other,
            })
    }
}

impl Drop for RunTxn<'_> {
    fn drop(&mut self) {
        if self.leased {
            let keeper = self.rt.keeper();
            keeper.drop_hold(&self.run_id);
            // Best effort: a lease that is not given up lapses.
            let _ = self.rt.store().release(&self.run_id, &keeper.holder);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_dead_only_when_this_host_can_tell() {
        let me = new_holder_id();
        assert!(!holder_is_dead(&me), "this process is alive: {me}");
        let parts: Vec<&str> = me.split(':').collect();
        let (host, pid, start, context) = (parts[0], parts[1], parts[2], parts[3]);
        if !cfg!(target_os = "linux") {
            return;
        }
        // A pid no process has (above the kernel's pid_max).
        let gone = format!("{host}:4194305:{start}:{context}:abcd1234");
        assert!(holder_is_dead(&gone));
        // This pid, started at another time: a process that used it before.
        let reused = format!("{host}:{pid}:1:{context}:abcd1234");
        assert!(holder_is_dead(&reused));
        // Another boot or PID namespace, another host, an older format: only
        // the lease's expiry can tell.
        assert!(!holder_is_dead(&format!(
            "{host}:4194305:{start}:00000000:abcd1234"
        )));
        assert!(!holder_is_dead(&format!(
            "elsewhere:4194305:{start}:{context}:abcd1234"
        )));
        assert!(!holder_is_dead(&format!("{host}:4194305:abcd1234")));
    }
}

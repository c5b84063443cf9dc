//! `stepwell drive`: the driver, once, until idle, or until stopped. It
//! prints as it goes: a report a pass, through the sink.

use std::time::Duration;

use stepwell::{DriveReport, Error, Runtime};

use super::render::{Report, Sink};

/// What `stepwell drive` was asked.
#[derive(clap::Args)]
pub(crate) struct DriveArgs {
    /// Do one pass and exit.
    #[arg(long)]
    once: bool,
    /// Do passes until one moves nothing, then exit (controllers admit
    /// and dispatch, occurrences run, parents resume).
    #[arg(long, conflicts_with = "once")]
    until_idle: bool,
    /// Pause between passes, in milliseconds.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    /// Apply this retention policy while driving (as `stepwell prune
    /// --retain`: completed=30d,failed=90d,cancelled=7d), every
    /// --prune-every, in a thread of its own.
    #[arg(long, conflicts_with_all = ["once", "until_idle"])]
    retain: Option<String>,
    /// How often --retain prunes (`s`, `m`, `h`, `d`).
    #[arg(long, default_value = "1h", requires = "retain")]
    prune_every: String,
}

/// `stepwell drive`: passes until idle, one pass, or passes until stopped.
pub(crate) fn run(
    rt: &Runtime,
    spec: &stepwell::host::StoreSpec,
    args: DriveArgs,
    sink: &Sink,
) -> Result<Report, Error> {
    let DriveArgs {
        once,
        until_idle,
        interval_ms,
        retain,
        prune_every,
    } = args;
    if let Some(policy) = retain {
        super::retention::spawn_pruner(rt, spec, &policy, &prune_every, sink.json())?;
    }
    if until_idle {
        self::until_idle(rt, sink)
    } else {
        passes(rt, once, interval_ms, sink)
    }
}

/// `stepwell drive --until-idle`: passes until one moves nothing (exit
/// status 1 when something could not move).
fn until_idle(rt: &Runtime, sink: &Sink) -> Result<Report, Error> {
    // A long drive says how far it got (on a terminal only).
    let mut tell = |so_far: &stepwell::automation::IdleReport| {
        super::render::progress(
            sink,
            format_args!(
                "driving: {} passes, {} runs moved so far...",
                so_far.passes, so_far.moved
            ),
        )
    };
    let report = stepwell::automation::drive_until_idle_with(rt, 1000, PROGRESS_EVERY, &mut tell)?;
    sink.show(
        &Report::compact(&report).line(format!("passes {}  moved {}", report.passes, report.moved)),
    );
    for e in &report.errors {
        sink.note(format_args!("  {}: {}", e.run_id, e.error));
    }
    // Something could not move: say so in the exit status.
    Ok(Report::default().failed_if(!report.errors.is_empty()))
}

/// How often `drive --until-idle` says how far it got.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// One pass as printed: its JSON, or (when it moved anything, had errors,
/// or is the only one) a line of counts and its errors on stderr.
fn pass(report: &DriveReport, once: bool) -> Report {
    let mut out = Report::compact(report);
    if !(report.moved_anything() || !report.errors.is_empty() || once) {
        return out;
    }
    out.push(format!(
        "due resumed {}  ticked {}  parents resumed {}  orphans cancelled {}  busy {}  quarantined {}  errors {}",
        report.due_resumed.len(),
        report.ticked.len(),
        report.parents_resumed.len(),
        report.orphans_cancelled.len(),
        report.busy.len(),
        report.quarantined.len(),
        report.errors.len()
    ));
    for q in &report.quarantined {
        out.push_err(format!("  {}: quarantined: {}", q.run_id, q.error));
    }
    for e in &report.errors {
        out.push_err(format!("  {}: {}", e.run_id, e.error));
    }
    out
}

/// How long `drive --once` waits for the effects its pass left in flight.
const ONCE_FLIGHT_WAIT: Duration = Duration::from_secs(600);

/// `stepwell drive` (`--once`: one pass): the driver's passes, with the
/// feeds polled and lost wakes swept, every `interval_ms` when idle.
fn passes(rt: &Runtime, once: bool, interval_ms: u64, sink: &Sink) -> Result<Report, Error> {
    // The loop's feeds are polled in their own thread, never in the
    // driver's way (it runs until the process ends).
    if !once {
        // Listen for other processes' signals before the first pass,
        // so that none sent after it is missed.
        rt.store().wait_for_work(Duration::ZERO);
        let (rt, stop) = (rt.clone(), std::sync::Arc::default());
        std::thread::spawn(move || stepwell::triggers::run_feed_poller(rt, stop));
    }
    loop {
        if once {
            // One pass: the due feeds are polled here, first.
            for (id, e) in &stepwell::triggers::feed_once(rt)?.failed {
                sink.note(format_args!("  connection {id}: {e}"));
            }
        } else if let Err(e) = stepwell::triggers::sweep_once(rt) {
            // The driver sweeps for lost wakes; a store that is
            // away (a database restarting) is tried again.
            sink.note(format_args!("error: the sweep failed: {e}"));
        }
        let report = match rt.drive_once() {
            Ok(report) => report,
            Err(e) if once => return Err(e),
            Err(e) => {
                // A long-running driver outlives a store outage:
                // it says so and tries again after its pause.
                sink.note(format_args!("error: the driver's pass failed: {e}"));
                std::thread::sleep(Duration::from_millis(interval_ms.min(5000)));
                continue;
            }
        };
        sink.show(&pass(&report, once));
        sink.flush();
        if once {
            // The pass's effects in flight land, and their runs go on,
            // before the process ends (else they wait for their leases).
            if rt.in_flight() > 0 && !rt.wait_in_flight(ONCE_FLIGHT_WAIT) {
                sink.note(format_args!(
                    "  {} effects still in flight after {} s: their runs are taken over when their leases lapse",
                    rt.in_flight(),
                    ONCE_FLIGHT_WAIT.as_secs()
                ));
            }
            return Ok(Report::default());
        }
        // A pass that moved something may have left more ready (a
        // chain of controller steps); otherwise wait for a signal
        // from another process (PostgreSQL) or the next poll.
        if !report.moved_anything() {
            let pause = rt.idle_pause(Duration::from_millis(interval_ms));
            rt.store().wait_for_work(pause);
        }
    }
}

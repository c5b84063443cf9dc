//! `stepwell drive`: the driver, once, until idle, or until stopped.

use std::time::Duration;

use stepwell::{Error, Runtime};

use super::render::note_failure;

/// `stepwell drive --until-idle`: passes until one moves nothing.
pub(crate) fn until_idle(rt: &Runtime, json: bool) -> Result<(), Error> {
    let report = stepwell::automation::drive_until_idle(rt, 1000)?;
    if json {
        println!("{}", serde_json::to_string(&report).unwrap_or_default());
    } else {
        println!("passes {}  moved {}", report.passes, report.moved);
    }
    for e in &report.errors {
        eprintln!("  {}: {}", e.run_id, e.error);
    }
    if !report.errors.is_empty() {
        // Something could not move: say so in the exit status.
        note_failure();
    }
    Ok(())
}

/// `stepwell drive` (`--once`: one pass): the driver's passes, with the
/// feeds polled and lost wakes swept, every `interval_ms` when idle.
pub(crate) fn passes(rt: &Runtime, once: bool, interval_ms: u64, json: bool) -> Result<(), Error> {
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
                eprintln!("  connection {id}: {e}");
            }
        } else if let Err(e) = stepwell::triggers::sweep_once(rt) {
            // The driver sweeps for lost wakes; a store that is
            // away (a database restarting) is tried again.
            eprintln!("error: the sweep failed: {e}");
        }
        let report = match rt.drive_once() {
            Ok(report) => report,
            Err(e) if once => return Err(e),
            Err(e) => {
                // A long-running driver outlives a store outage:
                // it says so and tries again after its pause.
                eprintln!("error: the driver's pass failed: {e}");
                std::thread::sleep(Duration::from_millis(interval_ms.min(5000)));
                continue;
            }
        };
        if json {
            println!("{}", serde_json::to_string(&report).unwrap_or_default());
        } else if report.moved_anything() || !report.errors.is_empty() || once {
            println!(
            "due resumed {}  ticked {}  parents resumed {}  orphans cancelled {}  busy {}  quarantined {}  errors {}",
            report.due_resumed.len(),
            report.ticked.len(),
            report.parents_resumed.len(),
            report.orphans_cancelled.len(),
            report.busy.len(),
            report.quarantined.len(),
            report.errors.len()
        );
            for q in &report.quarantined {
                eprintln!("  {}: quarantined: {}", q.run_id, q.error);
            }
            for e in &report.errors {
                eprintln!("  {}: {}", e.run_id, e.error);
            }
        }
        std::io::Write::flush(&mut std::io::stdout()).ok();
        if once {
            break;
        }
        // A pass that moved something may have left more ready (a
        // chain of controller steps); otherwise wait for a signal
        // from another process (PostgreSQL) or the next poll.
        if !report.moved_anything() {
            let pause = rt.idle_pause(Duration::from_millis(interval_ms));
            rt.store().wait_for_work(pause);
        }
    }
    Ok(())
}

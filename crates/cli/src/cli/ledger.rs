//! `stepwell ledger`: a run's ledger printed, followed or checked a page
//! at a time ([`stepwell::LEDGER_PAGE`] records), so a ledger of a million
//! records costs the memory of a page.

use std::time::Duration;

use stepwell::{Error, Result, Runtime};

use super::render::{JsonArray, Report, Sink};

/// What `stepwell ledger` was asked.
#[derive(clap::Args)]
pub(crate) struct LedgerArgs {
    /// The run.
    run_id: String,
    /// Check the hash chain instead: report the first record that was
    /// changed, removed or reordered (exit status 1 when one was).
    #[arg(long)]
    verify: bool,
    /// Keep printing new records as they are appended (by any process),
    /// until the run ends.
    #[arg(long, conflicts_with = "verify")]
    follow: bool,
    /// With --follow: how often to look, in milliseconds.
    #[arg(long, default_value_t = 200)]
    poll_ms: u64,
    /// Print each record whole: on a terminal, lines are otherwise cut to
    /// its width (`--json`, or a pipe, always has them whole).
    #[arg(long)]
    full: bool,
}

/// `stepwell ledger`: the records as one JSON array (`--json`), a line
/// each (a JSON object a line with `--json --follow`), or the chain's
/// verdict (`--verify`).
pub(crate) fn run(rt: &Runtime, args: LedgerArgs, sink: &Sink) -> Result<Report> {
    let LedgerArgs {
        run_id,
        verify,
        follow,
        poll_ms,
        full,
    } = args;
    if verify {
        return self::verify(rt, &run_id);
    }
    rt.get_state(&run_id)?;
    // Followed, records are printed a JSON object a line.
    let array = if follow { None } else { sink.json_array() };
    match array {
        Some(array) => json_array(rt, &run_id, array),
        None => {
            let width = if full { None } else { terminal_width() };
            let poll = Duration::from_millis(poll_ms);
            lines(rt, &run_id, follow, poll, width, sink)
        }
    }
}

/// `stepwell ledger RUN --verify`: checks the hash chain; the verdict,
/// failing with an error naming the first bad record.
fn verify(rt: &Runtime, run_id: &str) -> Result<Report> {
    let check = rt.check_ledger(run_id)?;
    let count = check.records;
    Ok(match check.verdict {
        Ok(head) => {
            let mut line = format!(
                "ok: {count} records, chain intact (head {})",
                head.as_deref().unwrap_or("-")
            );
            if let Some(c) = &check.checkpoint {
                line.push_str(&format!(
                    "\n  from the checkpoint at seq {}: {} older records compacted on {}, the last with hash {}",
                    c.through_seq, c.replaced_records, c.compacted_at, c.replaced_head
                ));
            }
            let checkpoint = &check.checkpoint;
            Report::compact(&serde_json::json!({
                "ok": true, "records": count, "head": head, "checkpoint": checkpoint
            }))
            .line(line)
        }
        Err(b) => {
            let error = Error::Store(stepwell::StoreError::corrupt(format!(
                "the ledger of run {run_id} fails verification at record {} ({})",
                b.index, b.problem
            )));
            let line = format!(
                "broken: record {} of {count} ({}) was {}",
                b.index, b.step_id, b.problem
            );
            Report::compact(&serde_json::json!({"ok": false, "records": count, "break": b}))
                .line(line)
                .failing(error)
        }
    })
}

/// `stepwell ledger RUN --json`: the records as one JSON array, written a
/// page at a time.
fn json_array(rt: &Runtime, run_id: &str, mut array: JsonArray) -> Result<Report> {
    for page in rt.ledger_pages(run_id, 0) {
        for (_, r) in page? {
            if !array.push(&r) {
                // The reader went away (a closed pipe): nothing more to do.
                return Ok(Report::default());
            }
        }
    }
    array.finish();
    Ok(Report::default())
}

/// `stepwell ledger RUN [--follow]`: a line a record (a JSON object a line
/// with `--json`), oldest first; with `follow`, new records as any process
/// appends them, until the run ends.
fn lines(
    rt: &Runtime,
    run_id: &str,
    follow: bool,
    poll: Duration,
    width: Option<usize>,
    sink: &Sink,
) -> Result<Report> {
    let mut shown = 0u64;
    let show_new = |shown: &mut u64| -> Result<()> {
        for page in rt.ledger_pages(run_id, *shown) {
            for (seq, r) in page? {
                sink.show(&Report::record(seq, &r).cut_to(width));
                *shown = seq;
            }
        }
        Ok(())
    };
    loop {
        show_new(&mut shown)?;
        if !follow || rt.get_state(run_id)?.status.is_terminal() {
            // One more look: records of the final commit.
            show_new(&mut shown)?;
            return Ok(Report::default());
        }
        sink.flush();
        std::thread::sleep(poll);
    }
}

/// The width of the terminal standard output is, if it is one (`COLUMNS`
/// when the terminal does not say).
fn terminal_width() -> Option<usize> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        return None;
    }
    #[cfg(unix)]
    {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct given,
        // which lives for the call; fd 1 is this process's stdout.
        let asked = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut size) };
        if asked == 0 && size.ws_col > 0 {
            return Some(usize::from(size.ws_col));
        }
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .filter(|c: &usize| *c > 0)
}

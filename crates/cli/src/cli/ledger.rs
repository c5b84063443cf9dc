//! `stepwell ledger`: a run's ledger printed, followed or checked a page
//! at a time ([`stepwell::LEDGER_PAGE`] records), so a ledger of a million
//! records costs the memory of a page.

use std::io::Write;
use std::time::Duration;

use stepwell::{Error, Result, Runtime, StepRecord};

/// `stepwell ledger RUN --verify`: checks the hash chain, prints the
/// verdict, and returns an error naming the first bad record.
pub fn verify(rt: &Runtime, run_id: &str, json: bool) -> Result<()> {
    let check = rt.check_ledger(run_id)?;
    let count = check.records;
    match check.verdict {
        Ok(head) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": true, "records": count, "head": head})
                );
            } else {
                println!(
                    "ok: {count} records, chain intact (head {})",
                    head.as_deref().unwrap_or("-")
                );
            }
            Ok(())
        }
        Err(b) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "records": count, "break": b})
                );
            } else {
                println!(
                    "broken: record {} of {count} ({}) was {}",
                    b.index, b.step_id, b.problem
                );
            }
            Err(Error::Store(stepwell::StoreError::corrupt(format!(
                "the ledger of run {run_id} fails verification at record {} ({})",
                b.index, b.problem
            ))))
        }
    }
}

/// `stepwell ledger RUN --json`: the records as one JSON array (indented
/// as `serde_json::to_string_pretty` indents a list), written a page at a
/// time.
pub fn print_json_array(rt: &Runtime, run_id: &str) -> Result<()> {
    rt.get_state(run_id)?;
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut first = true;
    for page in rt.ledger_pages(run_id, 0) {
        for (_, r) in page? {
            let text = serde_json::to_string_pretty(&r).unwrap_or_default();
            let sep = if first { "[\n" } else { ",\n" };
            first = false;
            if write!(out, "{sep}  {}", text.replace('\n', "\n  ")).is_err() {
                // The reader went away (a closed pipe): nothing more to do.
                return Ok(());
            }
        }
    }
    let _ = writeln!(out, "{}", if first { "[]" } else { "\n]" });
    let _ = out.flush();
    Ok(())
}

/// `stepwell ledger RUN [--follow]`: a line a record (a JSON object a line
/// with `--json`), oldest first; with `follow`, new records as any process
/// appends them, until the run ends.
pub fn print_lines(
    rt: &Runtime,
    run_id: &str,
    follow: bool,
    poll: Duration,
    json: bool,
    print: fn(&StepRecord, bool),
) -> Result<()> {
    rt.get_state(run_id)?;
    let mut shown = 0u64;
    let show_new = |shown: &mut u64| -> Result<()> {
        for page in rt.ledger_pages(run_id, *shown) {
            for (seq, r) in page? {
                print(&r, json);
                *shown = seq;
            }
        }
        Ok(())
    };
    loop {
        show_new(&mut shown)?;
        if !follow || rt.get_state(run_id)?.status.is_terminal() {
            // One more look: records of the final commit.
            return show_new(&mut shown);
        }
        std::io::stdout().flush().ok();
        std::thread::sleep(poll);
    }
}

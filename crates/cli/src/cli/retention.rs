//! `stepwell prune`: finished runs deleted once the retention policy no
//! longer keeps them, whole trees at a time, optionally archived first.

use std::path::PathBuf;

use stepwell::core::retention::{PruneOptions, Retention};
use stepwell::host::StoreSpec;
use stepwell::{Error, Runtime};

use super::render::{Report, Sink};

/// What `stepwell prune` was asked.
#[derive(clap::Args)]
pub(crate) struct PruneArgs {
    /// How long finished runs are kept, by how they ended:
    /// `completed=30d,failed=90d,cancelled=7d` (any of the three; `s`,
    /// `m`, `h`, `d`). A status not named is kept for ever. The longest
    /// span named is how much of an automation controller's ledger and of
    /// the event inbox is kept; artifacts of deleted runs no kept run names
    /// go after the shortest.
    #[arg(long)]
    retain: String,
    /// Say what would go (runs, records, bytes; ledgers compacted,
    /// artifacts, inbox events), delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Export each tree into this folder (`<root run id>-<time>.zip`, as
    /// `stepwell export --with-children`) before deleting it; the records a
    /// compaction replaces (`<run>-ledger-<seq>-<time>.jsonl`) and the
    /// inbox events dropped (`trigger-<connection>-events-<seq>-<time>.jsonl`)
    /// too.
    #[arg(long)]
    archive: Option<PathBuf>,
}

/// `stepwell prune`: a line per tree deleted (or that would be), the
/// trees kept and why, and the totals.
pub(crate) fn prune(rt: &Runtime, spec: &StoreSpec, args: PruneArgs) -> Result<Report, Error> {
    let policy = Retention::parse(&args.retain)?;
    if let Some(dir) = args.archive.as_ref().filter(|_| !args.dry_run) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::invalid("--archive", format!("{}: {e}", dir.display())))?;
    }
    let snapshots = spec.snapshots()?;
    let report = rt.prune(
        &policy,
        &PruneOptions {
            dry_run: args.dry_run,
            archive: args.archive.as_deref(),
            snapshots: Some(&*snapshots),
            ..PruneOptions::default()
        },
    )?;
    Ok(lines(&report))
}

/// A prune's report: a line per tree, the trees kept and why, the totals.
fn lines(report: &stepwell::core::retention::PruneReport) -> Report {
    let mut out = Report::pretty(report);
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    for t in &report.trees {
        out.push(format!(
            "{verb} {}  {}  {}  ended {}  {} runs, {} records, {} bytes",
            t.run_id,
            t.workflow_id,
            t.status.as_str(),
            t.ended_at,
            t.runs.len(),
            t.records,
            t.bytes
        ));
    }
    let compacted = if report.dry_run {
        "would compact"
    } else {
        "compacted"
    };
    for c in &report.compacted {
        out.push(format!(
            "{compacted} the ledger of {}  {}  through seq {}: {} records, {} bytes, behind a checkpoint carrying {}",
            c.run_id, c.workflow_id, c.through_seq, c.records, c.bytes, c.carried
        ));
    }
    if report.artifacts > 0 {
        out.push(format!(
            "{verb} {} artifacts of deleted runs that no kept run names ({} bytes)",
            report.artifacts, report.artifact_bytes
        ));
    }
    if report.events > 0 {
        let dropped = if report.dry_run {
            "would drop"
        } else {
            "dropped"
        };
        out.push(format!(
            "{dropped} the payloads of {} inbox events every reader has passed (their ids stay, so a repeat is still a duplicate)",
            report.events
        ));
    }
    for (id, why) in &report.kept {
        out.push(format!("kept {id}: {why}"));
    }
    out.push(format!(
        "{verb} {} runs ({} records, {} bytes of state and ledger){}",
        report.runs,
        report.records,
        report.bytes,
        if report.snapshots > 0 {
            format!(", {} snapshots", report.snapshots)
        } else {
            String::new()
        }
    ));
    out
}

/// Starts applying `policy` every `every` in a thread of its own (`drive
/// --retain`, `serve --retain`), each prune printed as `prune` prints it
/// when it deleted or kept something, or failed. The policy and the
/// interval are checked here, before the thread starts.
pub(crate) fn spawn_pruner(
    rt: &Runtime,
    spec: &StoreSpec,
    policy: &str,
    every: &str,
    json: bool,
) -> Result<(), Error> {
    let policy = Retention::parse(policy)?;
    let every = stepwell::core::retention::parse_every(every)?;
    let snapshots = spec.snapshots()?;
    let rt = rt.clone();
    std::thread::Builder::new()
        .name("stepwell-prune".into())
        .spawn(move || {
            let sink = Sink::new(json);
            let stop = std::sync::atomic::AtomicBool::new(false);
            let told = |done: Result<stepwell::core::retention::PruneReport, Error>| match done {
                Ok(r)
                    if r.runs > 0
                        || r.events > 0
                        || r.artifacts > 0
                        || !r.kept.is_empty()
                        || !r.compacted.is_empty() =>
                {
                    sink.show(&lines(&r));
                    sink.flush();
                }
                Ok(_) => {}
                Err(e) => sink.note(format_args!("error: the prune failed: {e}")),
            };
            let snapshots = Some(&*snapshots);
            stepwell::core::retention::run_pruner(&rt, policy, every, snapshots, &stop, &told);
        })
        .map_err(|e| Error::invalid("retain", format!("cannot start the pruner: {e}")))?;
    Ok(())
}

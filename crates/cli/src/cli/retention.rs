//! `stepwell prune`: finished runs deleted once the retention policy no
//! longer keeps them, whole trees at a time, optionally archived first.

use std::path::PathBuf;

use stepwell::core::retention::{PruneOptions, Retention};
use stepwell::host::StoreSpec;
use stepwell::{Error, Runtime};

use super::render::Report;

/// What `stepwell prune` was asked.
#[derive(clap::Args)]
pub(crate) struct PruneArgs {
    /// How long finished runs are kept, by how they ended:
    /// `completed=30d,failed=90d,cancelled=7d` (any of the three; `s`,
    /// `m`, `h`, `d`). A status not named is kept for ever.
    #[arg(long)]
    retain: String,
    /// Say what would go (runs, records, bytes), delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Export each tree into this folder (`<root run id>.zip`, as `stepwell
    /// export --with-children`) before deleting it.
    #[arg(long)]
    archive: Option<PathBuf>,
}

/// `stepwell prune`: a line per tree deleted (or that would be), the
/// trees kept and why, and the totals.
pub(crate) fn prune(rt: &Runtime, spec: &StoreSpec, args: PruneArgs) -> Result<Report, Error> {
    let policy = Retention::parse(&args.retain)?;
    if let Some(dir) = &args.archive {
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
        },
    )?;
    let mut out = Report::pretty(&report);
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
    Ok(out)
}

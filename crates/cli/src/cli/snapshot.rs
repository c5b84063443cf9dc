//! `stepwell snapshot`: named copies of a run's state, and restoring one.

use clap::Subcommand;
use stepwell::host::StoreSpec;
use stepwell::{Error, Runtime};

use super::render::Report;

/// The `snapshot` subcommands.
#[derive(Subcommand)]
pub(crate) enum SnapshotCommand {
    /// Take a snapshot of a run's current state.
    Create {
        /// The run.
        run_id: String,
        /// A short name.
        #[arg(long)]
        name: String,
        /// A longer description.
        #[arg(long, default_value = "")]
        description: String,
        /// A tag (repeat for several).
        #[arg(long = "tag")]
        tags: Vec<String>,
    },
    /// List snapshots, newest first.
    List {
        /// Only snapshots of this run.
        #[arg(long)]
        run: Option<String>,
        /// Only snapshots with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// Only snapshots whose name or description contains this text.
        #[arg(long)]
        text: Option<String>,
    },
    /// Make a snapshot's state the run's state again.
    Restore {
        /// The snapshot.
        snapshot_id: String,
    },
}

/// Creates, lists or restores snapshots in `spec`'s snapshot store.
pub(crate) fn run(
    rt: &Runtime,
    spec: &StoreSpec,
    command: SnapshotCommand,
) -> Result<Report, Error> {
    let snapshots = spec.snapshots()?;
    match command {
        SnapshotCommand::Create {
            run_id,
            name,
            description,
            tags,
        } => {
            let s = rt.create_snapshot(&*snapshots, &run_id, &name, &description, tags)?;
            Ok(Report::pretty(&s).line(format!(
                "snapshot {}  {}  of run {} ({})",
                s.snapshot_id,
                s.name,
                s.run_id,
                s.run_state.status.as_str()
            )))
        }
        SnapshotCommand::List { run, tag, text } => {
            let (found, left_out) =
                snapshots.search_snapshots_reporting(&stepwell::store::SnapshotQuery {
                    run_id: run,
                    tag,
                    text,
                    limit: None,
                })?;
            let mut report = Report::pretty(&found);
            for e in left_out {
                report.note(format!("warning: snapshot left out: {e}"));
            }
            for s in found {
                report.push(format!(
                    "{}  {}  run {}  {}  [{}]  {}",
                    s.snapshot_id,
                    s.created_at,
                    s.run_id,
                    s.name,
                    s.tags.join(","),
                    s.run_state.status.as_str()
                ));
            }
            Ok(report)
        }
        SnapshotCommand::Restore { snapshot_id } => Ok(Report::run(
            &rt.restore_snapshot(&*snapshots, &snapshot_id)?,
        )),
    }
}

//! `stepwell snapshot`: named copies of a run's state, and restoring one.

use stepwell::host::StoreSpec;
use stepwell::{Error, Runtime};

use super::render::print_run;
use crate::SnapshotCommand;

/// Creates, lists or restores snapshots in `spec`'s snapshot store.
pub(crate) fn run(
    rt: &Runtime,
    spec: &StoreSpec,
    command: SnapshotCommand,
    json: bool,
) -> Result<(), Error> {
    let snapshots = spec.snapshots()?;
    match command {
        SnapshotCommand::Create {
            run_id,
            name,
            description,
            tags,
        } => {
            let s = rt.create_snapshot(&*snapshots, &run_id, &name, &description, tags)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                println!(
                    "snapshot {}  {}  of run {} ({})",
                    s.snapshot_id,
                    s.name,
                    s.run_id,
                    s.run_state.status.as_str()
                );
            }
        }
        SnapshotCommand::List { run, tag, text } => {
            let (found, left_out) =
                snapshots.search_snapshots_reporting(&stepwell::store::SnapshotQuery {
                    run_id: run,
                    tag,
                    text,
                    limit: None,
                })?;
            for e in left_out {
                eprintln!("warning: snapshot left out: {e}");
            }
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&found).unwrap_or_default()
                );
            } else {
                for s in found {
                    println!(
                        "{}  {}  run {}  {}  [{}]  {}",
                        s.snapshot_id,
                        s.created_at,
                        s.run_id,
                        s.name,
                        s.tags.join(","),
                        s.run_state.status.as_str()
                    );
                }
            }
        }
        SnapshotCommand::Restore { snapshot_id } => {
            print_run(&rt.restore_snapshot(&*snapshots, &snapshot_id)?, json)
        }
    }
    Ok(())
}

//! A run's history as one file: `stepwell export` and `stepwell import`.

use std::path::PathBuf;

use serde_json::json;
use stepwell::{Error, Runtime};

use super::render::Report;

/// What `stepwell export` was asked.
#[derive(clap::Args)]
pub(crate) struct ExportArgs {
    /// The run.
    run_id: String,
    /// Its children (and theirs) too.
    #[arg(long)]
    with_children: bool,
    /// The file to write.
    #[arg(short, long)]
    output: PathBuf,
}

/// `stepwell export`: the run's state, ledger, artifacts and workflow
/// version's files in one self-verifying file.
pub(crate) fn export(rt: &Runtime, args: ExportArgs) -> Result<Report, Error> {
    let bytes = rt.export_run(&args.run_id, args.with_children)?;
    std::fs::write(&args.output, &bytes)
        .map_err(|e| Error::invalid("output", format!("{}: {e}", args.output.display())))?;
    Ok(
        Report::pretty(&json!({"run_id": args.run_id, "bytes": bytes.len(),
                              "output": args.output.display().to_string()}))
        .line(format!(
            "exported run {} ({} bytes) into {}",
            args.run_id,
            bytes.len(),
            args.output.display()
        )),
    )
}

/// What `stepwell import` was asked.
#[derive(clap::Args)]
pub(crate) struct ImportArgs {
    /// The file `stepwell export` wrote.
    file: PathBuf,
}

/// `stepwell import`: checks an export whole, then writes its runs (and
/// the versions and artifacts they need) into this store.
pub(crate) fn import(rt: &Runtime, args: ImportArgs) -> Result<Report, Error> {
    let bytes =
        stepwell::flow::pack::read_archive(&args.file).map_err(|e| Error::invalid("file", e))?;
    let ids = rt.import_runs(&bytes)?;
    let mut report = Report::pretty(&json!({"imported": ids}));
    for id in &ids {
        report.push(format!("imported run {id}"));
    }
    Ok(report)
}

//! A run's history: as one file (`stepwell export`, `stepwell import`),
//! forked from a past point (`stepwell fork`), and the evidence its tool
//! calls left (`stepwell evidence`).

use std::path::PathBuf;

use serde_json::{json, Map};
use stepwell::core::fork::{ForkFrom, ForkOptions};
use stepwell::host::StoreSpec;
use stepwell::store::{Snapshot, SnapshotQuery};
use stepwell::{Error, RunStatus, Runtime};

use super::input::parse_object;
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

/// What `stepwell fork` was asked.
#[derive(clap::Args)]
pub(crate) struct ForkArgs {
    /// The run to fork.
    run_id: String,
    /// Start from this ledger record (the seq `stepwell ledger` prints;
    /// `--list` shows which records a fork can start from). Default: the
    /// run's first step.
    #[arg(long, conflicts_with = "snapshot")]
    at: Option<u64>,
    /// Start from this snapshot of the run (its id or name; the newest of
    /// that name).
    #[arg(long)]
    snapshot: Option<String>,
    /// A patch over the vars at that point, a JSON object (`null` removes
    /// a var).
    #[arg(long)]
    vars: Option<String>,
    /// Run this deployed version of the workflow instead of the source's.
    #[arg(long)]
    version: Option<u32>,
    /// Only list the points a fork can start from.
    #[arg(long, conflicts_with_all = ["at", "snapshot", "vars", "version"])]
    list: bool,
    /// Create the fork without stepping it (the driver will).
    #[arg(long)]
    no_tick: bool,
}

/// `stepwell fork`: a new run from a past point of a run, ticked until it
/// waits or ends (exit status 1 when it failed); or, with `--list`, the
/// points it can start from.
pub(crate) fn fork(rt: &Runtime, spec: &StoreSpec, args: ForkArgs) -> Result<Report, Error> {
    if args.list {
        return fork_points(rt, &args.run_id);
    }
    let from = match (&args.snapshot, args.at) {
        (Some(name), _) => ForkFrom::Snapshot(Box::new(find_snapshot(spec, &args.run_id, name)?)),
        (None, Some(seq)) => ForkFrom::Seq(seq),
        (None, None) => ForkFrom::Start,
    };
    let vars = match &args.vars {
        Some(v) => parse_object("--vars", v)?,
        None => Map::new(),
    };
    stepwell::automation::check_caller_run(&vars, None, "--vars", "--session")?;
    let forked = rt.fork(
        &args.run_id,
        ForkOptions {
            from,
            vars,
            workflow_version: args.version,
        },
    )?;
    let state = if args.no_tick {
        rt.get_state(&forked.run_id)?
    } else {
        rt.tick(&forked.run_id)?
    };
    let at = match (forked.seq, &forked.snapshot_id) {
        (Some(seq), _) => format!("record {seq}"),
        (None, Some(s)) => format!("snapshot {s}"),
        (None, None) => "its start".into(),
    };
    let mut report = Report::run(&state).failed_if(state.status == RunStatus::Failed);
    report.push(format!(
        "forked from run {} at {at} (node {})",
        forked.source_run_id, forked.node_id
    ));
    Ok(report)
}

/// `stepwell fork RUN --list`: the points a fork can start from.
fn fork_points(rt: &Runtime, run_id: &str) -> Result<Report, Error> {
    let points = rt.fork_points(run_id)?;
    let mut report = Report::pretty(&points);
    for p in &points {
        report.push(format!(
            "{:>6}  {}  {}{}",
            p.seq,
            super::render::utc_micros(&p.started_at),
            p.node_id,
            if p.reproducible {
                ""
            } else {
                "  (vars not in the ledger)"
            }
        ));
    }
    if points.is_empty() {
        report.push(format!("run {run_id} has no point to fork from"));
    }
    Ok(report)
}

/// The snapshot of `run_id` with this id, or the newest with this name.
fn find_snapshot(spec: &StoreSpec, run_id: &str, name: &str) -> Result<Snapshot, Error> {
    let snapshots = spec.snapshots()?;
    if let Some(s) = snapshots.load_snapshot(name)? {
        return Ok(s);
    }
    let found = snapshots.search_snapshots(&SnapshotQuery {
        run_id: Some(run_id.to_string()),
        tag: None,
        text: Some(name.to_string()),
        limit: None,
    })?;
    found.into_iter().find(|s| s.name == name).ok_or_else(|| {
        Error::invalid(
            "--snapshot",
            format!("run {run_id} has no snapshot with id or name {name:?}"),
        )
    })
}

/// `stepwell evidence RUN`: the evidence the run's outside-world tool calls
/// left (a command's exit status, output and timing, the approval that
/// allowed it), oldest first.
pub(crate) fn evidence(rt: &Runtime, run_id: &str) -> Result<Report, Error> {
    let found = stepwell::tools::evidence::list(rt, run_id)?;
    let mut report = Report::pretty(&found);
    for e in &found {
        let r = e.record.as_ref().unwrap_or(&serde_json::Value::Null);
        let what = match r["command"].as_str() {
            Some(c) => format!("{c:?} exit {}", r["return_code"]),
            None => r["tool_name"].as_str().unwrap_or("?").to_string(),
        };
        let approved = match &r["approval"] {
            serde_json::Value::Null => "ran without asking".to_string(),
            a => format!("approved at {}", a["answered_at"].as_str().unwrap_or("?")),
        };
        report.push(match &e.record {
            Some(_) => format!(
                "{:>5}  {}  {}  {}  {what}  {approved}",
                e.seq,
                r["created_at"].as_str().unwrap_or("-"),
                r["tool_name"].as_str().unwrap_or("?"),
                if r["success"] == true { "ok" } else { "failed" },
            ),
            None => format!(
                "{:>5}  evidence {} is missing from the artifact store",
                e.seq, e.evidence_id
            ),
        });
    }
    if found.is_empty() {
        report.push(format!("run {run_id} has no evidence"));
    }
    Ok(report)
}

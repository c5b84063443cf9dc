//! Deployments and versions: `stepwell deploy`, `stepwell workflows
//! list|show|versions|prune`, `stepwell upgrade`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use stepwell::core::versions::UpgradeTo;
use stepwell::{Error, Runtime};

use super::render::Report;

/// What `stepwell deploy` was asked.
#[derive(clap::Args)]
pub(crate) struct DeployArgs {
    /// The bundle directory (holding flow.json), or a packed bundle
    /// (`stepwell bundle pack`).
    path: PathBuf,
    /// Who deploys (recorded with the version).
    #[arg(long, env = "USER", hide_env_values = true)]
    by: Option<String>,
}

/// `stepwell deploy`: records the bundle (a directory, or a packed
/// `.flow` file) as a new version of each workflow it defines (nothing
/// when its content is unchanged).
pub(crate) fn deploy(rt: &Runtime, args: DeployArgs) -> Result<Report, Error> {
    let by = args.by.as_deref();
    let (deployed, digest, warnings) = if args.path.is_file() {
        let bytes = read_archive(&args.path)?;
        let source = args.path.to_string_lossy();
        let d = rt.deploy_archive(&bytes, by, &source)?;
        let digest = d
            .workflows
            .first()
            .map(|w| w.version.digest.clone())
            .unwrap_or_default();
        (d.workflows, digest, d.warnings)
    } else {
        let d = rt.deploy(&args.path, by)?;
        let warnings = d.bundle.warnings();
        (d.workflows, d.digest, warnings)
    };
    let mut report = deployed_report(&deployed, &digest);
    for w in warnings {
        report.note(format!("warning: {w}"));
    }
    Ok(report)
}

/// The bytes of the packed bundle at `path` (bounded).
fn read_archive(path: &std::path::Path) -> Result<Vec<u8>, Error> {
    stepwell::flow::pack::read_archive(path).map_err(|e| Error::invalid("path", e))
}

/// What a deployment recorded, as a report.
fn deployed_report(deployed: &[stepwell::store::Deployed], digest: &str) -> Report {
    let workflows: Vec<_> = deployed
        .iter()
        .map(|w| {
            json!({"workflow_id": w.version.workflow_id, "version": w.version.version,
                         "unchanged": w.unchanged})
        })
        .collect();
    let unchanged = deployed.iter().all(|w| w.unchanged);
    let mut report = Report::pretty(&json!({
        "digest": digest,
        "unchanged": unchanged,
        "workflows": workflows,
    }));
    for w in deployed {
        report.push(format!(
            "{}  version {}{}",
            w.version.workflow_id,
            w.version.version,
            if w.unchanged {
                "  (unchanged: the latest version has this content already)"
            } else {
                "  (new)"
            }
        ));
    }
    report.push(format!("digest {digest}"));
    report
}

/// The `bundle` subcommands.
#[derive(Subcommand)]
pub(crate) enum BundleCommand {
    /// Pack a bundle directory into one file (a zip of a manifest and the
    /// files a deployment keeps), to deploy where there is no checkout.
    Pack {
        /// The bundle directory.
        dir: PathBuf,
        /// The file to write (NAME.flow).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Unpack a packed bundle into a new directory.
    Unpack {
        /// The packed bundle.
        file: PathBuf,
        /// The directory to create.
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// Packs or unpacks a bundle.
pub(crate) fn bundle(rt: &Runtime, command: BundleCommand) -> Result<Report, Error> {
    let io = |path: &std::path::Path, e: std::io::Error| {
        Error::invalid("output", format!("{}: {e}", path.display()))
    };
    match command {
        BundleCommand::Pack { dir, output } => {
            let bytes = rt.pack_bundle(&dir)?;
            let (manifest, _) =
                stepwell::flow::pack::unpack(&bytes).map_err(|e| Error::invalid("dir", e))?;
            std::fs::write(&output, &bytes).map_err(|e| io(&output, e))?;
            Ok(Report::pretty(&manifest).line(format!(
                "packed {} ({} files, {} bytes, digest {}) into {}",
                manifest.workflows.join(", "),
                manifest.files.len(),
                bytes.len(),
                manifest.digest,
                output.display()
            )))
        }
        BundleCommand::Unpack { file, output } => {
            let bytes = read_archive(&file)?;
            let (manifest, files) = stepwell::flow::pack::unpack(&bytes)
                .map_err(|e| Error::invalid("file", format!("{}: {e}", file.display())))?;
            // A new directory: nothing of someone else's is overwritten.
            std::fs::create_dir(&output).map_err(|e| io(&output, e))?;
            for f in &files.files {
                let path = output.join(&f.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
                }
                std::fs::write(&path, &f.bytes).map_err(|e| io(&path, e))?;
            }
            Ok(Report::pretty(&manifest).line(format!(
                "unpacked {} ({} files, digest {}) into {}",
                manifest.workflows.join(", "),
                files.files.len(),
                manifest.digest,
                output.display()
            )))
        }
    }
}

/// The `workflows` subcommands.
#[derive(Subcommand)]
pub(crate) enum WorkflowCommand {
    /// Every deployed workflow: its latest version and how many versions.
    List,
    /// One workflow: its latest version and its runs by version.
    Show {
        /// The workflow id.
        workflow_id: String,
    },
    /// Every version of a workflow, with its runs by status.
    Versions {
        /// The workflow id.
        workflow_id: String,
    },
    /// Remove versions that are neither latest nor the version of a run
    /// that is running or waiting (or that ended within --keep-finished).
    Prune {
        /// Only this workflow's versions.
        #[arg(long)]
        workflow: Option<String>,
        /// Also keep the versions of runs that ended within this many
        /// hours.
        #[arg(long, value_name = "HOURS")]
        keep_finished_hours: Option<u32>,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Lists, shows or prunes deployed versions.
pub(crate) fn run(rt: &Runtime, command: WorkflowCommand) -> Result<Report, Error> {
    match command {
        WorkflowCommand::List => list(rt),
        WorkflowCommand::Show { workflow_id } | WorkflowCommand::Versions { workflow_id } => {
            versions(rt, &workflow_id)
        }
        WorkflowCommand::Prune {
            workflow,
            keep_finished_hours,
            dry_run,
        } => {
            // Past the clock's range: every finished run is kept.
            let since = keep_finished_hours.map(|h| {
                let back = chrono::Duration::try_hours(i64::from(h))
                    .and_then(|d| rt.now().checked_sub_signed(d))
                    .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
                stepwell::core::clock::format_time(back)
            });
            let gone = rt.prune_versions(workflow.as_deref(), since.as_deref(), dry_run)?;
            let verb = if dry_run { "would remove" } else { "removed" };
            let mut report = Report::pretty(&json!({"dry_run": dry_run, "removed": gone}));
            for v in &gone {
                report.push(format!("{verb} {} version {}", v.workflow_id, v.version));
            }
            report.push(format!("{verb} {} version(s)", gone.len()));
            Ok(report)
        }
    }
}

/// `workflows list`.
fn list(rt: &Runtime) -> Result<Report, Error> {
    let all = rt.deployed_workflows()?;
    let mut report = Report::pretty(&all);
    for w in &all {
        report.push(format!(
            "{}  latest version {} (deployed {}{})  {} version(s)",
            w.workflow_id,
            w.latest.version,
            w.latest.deployed_at,
            by(&w.latest),
            w.versions
        ));
    }
    if all.is_empty() {
        report.push("no workflow is deployed (stepwell deploy PATH)");
    }
    Ok(report)
}

/// ` by NAME`, or nothing.
fn by(v: &stepwell::store::WorkflowVersion) -> String {
    v.deployed_by
        .as_deref()
        .map(|b| format!(" by {b}"))
        .unwrap_or_default()
}

/// `workflows versions ID` (and `show ID`).
fn versions(rt: &Runtime, workflow_id: &str) -> Result<Report, Error> {
    let r = rt.workflow_versions(workflow_id)?;
    let mut report = Report::pretty(&r);
    for v in &r.versions {
        report.push(format!(
            "{} version {}  digest {}  deployed {}{}  runs: {}",
            r.workflow_id,
            v.version.version,
            &v.version.digest[..12],
            v.version.deployed_at,
            by(&v.version),
            counts(&v.runs)
        ));
    }
    if !r.unpinned_runs.is_empty() {
        report.push(format!(
            "unpinned runs (the latest): {}",
            counts(&r.unpinned_runs)
        ));
    }
    Ok(report)
}

/// `n status, ...`, or `none`.
fn counts(m: &std::collections::BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `stepwell upgrade` was asked.
#[derive(clap::Args)]
pub(crate) struct UpgradeArgs {
    /// The run to move (or --workflow for every run of a workflow).
    #[arg(required_unless_present = "workflow", conflicts_with = "workflow")]
    run_id: Option<String>,
    /// Move every running or waiting run of this workflow.
    #[arg(long)]
    workflow: Option<String>,
    /// With --workflow: only its runs on this version.
    #[arg(long, requires = "workflow")]
    from: Option<u32>,
    /// The version: `latest` or a number.
    #[arg(long)]
    to: String,
    /// Check and say what would move; move nothing.
    #[arg(long)]
    dry_run: bool,
}

/// `stepwell upgrade`: moves runs to another version after checking that
/// the nodes they are at and come back to exist there.
pub(crate) fn upgrade(rt: &Runtime, args: UpgradeArgs) -> Result<Report, Error> {
    let to = match args.to.as_str() {
        "latest" => UpgradeTo::Latest,
        n => UpgradeTo::Version(n.parse().map_err(|_| {
            Error::invalid(
                "--to",
                format!("{n:?} is neither `latest` nor a version number"),
            )
        })?),
    };
    let Some(workflow) = args.workflow else {
        let run_id = args.run_id.unwrap_or_default();
        let u = rt.upgrade(&run_id, to, args.dry_run)?;
        return Ok(Report::pretty(&u).line(upgrade_line(&u, args.dry_run)));
    };
    let mut results = Vec::new();
    let mut lines = Vec::new();
    let mut refused = 0;
    for run in rt.upgradable_runs(&workflow, args.from)? {
        match rt.upgrade(&run.run_id, to, args.dry_run) {
            Ok(u) => {
                lines.push(upgrade_line(&u, args.dry_run));
                results.push(json!({"run_id": run.run_id, "upgrade": u}));
            }
            Err(e) => {
                refused += 1;
                lines.push(format!("{}: {e}", run.run_id));
                results.push(json!({"run_id": run.run_id, "error": e.to_string(),
                                    "reason_code": e.reason_code()}));
            }
        }
    }
    lines.push(format!(
        "{} run(s), {refused} refused{}",
        results.len(),
        if args.dry_run { " (dry run)" } else { "" }
    ));
    Ok(Report::pretty(&results).lines(lines).failed_if(refused > 0))
}

/// One upgrade as a line.
fn upgrade_line(u: &stepwell::core::versions::Upgrade, dry_run: bool) -> String {
    let from = u.from.map_or("unpinned".into(), |v| format!("version {v}"));
    let what = match (u.moved, dry_run) {
        (true, _) => "moved",
        (false, true) if u.from != Some(u.to) => "would move (dry run)",
        _ => "stays (already there)",
    };
    format!(
        "run {}  {} {from} -> version {}: {what}",
        u.run_id, u.workflow_id, u.to
    )
}

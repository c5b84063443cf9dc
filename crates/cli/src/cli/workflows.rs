//! Deployments and versions: `stepwell deploy`, `stepwell workflows
//! list|show|versions|prune`, `stepwell upgrade`.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;
use stepwell::core::versions::UpgradeTo;
use stepwell::store::WorkflowVersion;
use stepwell::{Error, Runtime};

use super::render::Report;

/// What `stepwell deploy` was asked.
#[derive(clap::Args)]
pub(crate) struct DeployArgs {
    /// The bundle directory (holding flow.json).
    path: PathBuf,
    /// Who deploys (recorded with the version).
    #[arg(long, env = "USER", hide_env_values = true)]
    by: Option<String>,
}

/// `stepwell deploy`: records the bundle as a new version of each
/// workflow it defines (nothing when its content is unchanged).
pub(crate) fn deploy(rt: &Runtime, args: DeployArgs) -> Result<Report, Error> {
    let d = rt.deploy(&args.path, args.by.as_deref())?;
    let workflows: Vec<_> = d
        .workflows
        .iter()
        .map(|w| {
            json!({"workflow_id": w.version.workflow_id, "version": w.version.version,
                         "unchanged": w.unchanged})
        })
        .collect();
    let mut report = Report::pretty(&json!({
        "digest": d.digest,
        "unchanged": d.unchanged(),
        "workflows": workflows,
    }));
    for w in &d.workflows {
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
    report.push(format!("digest {}", d.digest));
    Ok(report)
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
            let since = keep_finished_hours.map(|h| {
                stepwell::core::clock::format_time(rt.now() - chrono::Duration::hours(i64::from(h)))
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
    let all = rt.store().workflow_versions(None)?;
    let mut rows: Vec<(&WorkflowVersion, usize)> = Vec::new();
    for v in &all {
        match rows.last_mut() {
            Some((latest, n)) if latest.workflow_id == v.workflow_id => {
                *latest = v;
                *n += 1;
            }
            _ => rows.push((v, 1)),
        }
    }
    let json: Vec<_> = rows
        .iter()
        .map(|(v, n)| json!({"workflow_id": v.workflow_id, "latest": v, "versions": n}))
        .collect();
    let mut report = Report::pretty(&json);
    for (v, n) in &rows {
        report.push(format!(
            "{}  latest version {} (deployed {}{})  {n} version(s)",
            v.workflow_id,
            v.version,
            v.deployed_at,
            v.deployed_by
                .as_deref()
                .map(|b| format!(" by {b}"))
                .unwrap_or_default()
        ));
    }
    if rows.is_empty() {
        report.push("no workflow is deployed (stepwell deploy PATH)");
    }
    Ok(report)
}

/// `workflows versions ID` (and `show ID`).
fn versions(rt: &Runtime, workflow_id: &str) -> Result<Report, Error> {
    let versions = rt.store().workflow_versions(Some(workflow_id))?;
    if versions.is_empty() {
        return Err(Error::UnknownWorkflow {
            workflow_id: workflow_id.to_string(),
        });
    }
    let uses = rt.store().version_use(workflow_id)?;
    let runs_of = |v: Option<u32>| {
        let mut m = serde_json::Map::new();
        for u in uses.iter().filter(|u| u.version == v) {
            m.insert(u.status.as_str().into(), json!(u.runs));
        }
        m
    };
    let mut json = Vec::new();
    let mut lines = Vec::new();
    for v in &versions {
        let runs = runs_of(Some(v.version));
        json.push(json!({"version": v, "runs": runs}));
        lines.push(format!(
            "{} version {}  digest {}  deployed {}{}  runs: {}",
            v.workflow_id,
            v.version,
            &v.digest[..12],
            v.deployed_at,
            v.deployed_by
                .as_deref()
                .map(|b| format!(" by {b}"))
                .unwrap_or_default(),
            counts(&runs)
        ));
    }
    let unpinned = runs_of(None);
    if !unpinned.is_empty() {
        lines.push(format!("unpinned runs (the latest): {}", counts(&unpinned)));
    }
    let doc = json!({"workflow_id": workflow_id, "versions": json, "unpinned_runs": unpinned});
    Ok(Report::pretty(&doc).lines(lines))
}

/// `status: n, ...`, or `none`.
fn counts(m: &serde_json::Map<String, serde_json::Value>) -> String {
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

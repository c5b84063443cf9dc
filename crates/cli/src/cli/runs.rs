//! The commands on one run or on the list of runs: `run`, `resume`,
//! `status`, `cancel`, `list`.

use std::path::PathBuf;

use serde_json::{Map, Value};
use stepwell::{Error, RunQuery, RunState, RunStatus, Runtime, StartOptions, WaitReason};

use super::input::{parse_json, parse_object};
use super::render::Report;

/// How many runs `stepwell list` shows without `--limit`.
const DEFAULT_LIST_LIMIT: usize = 100;

/// What `stepwell run` was asked (its arguments, docs/cli.md).
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// A bundle directory (holding flow.json; deployed first), or the id
    /// of a deployed workflow (its latest version).
    pub(crate) flow_dir: PathBuf,
    /// Start this deployed version instead of the latest.
    #[arg(long)]
    pub(crate) version: Option<u32>,
    /// The run's initial vars, a JSON object.
    #[arg(long)]
    pub(crate) vars: Option<String>,
    /// Run this workflow of the bundle instead of the main one.
    #[arg(long)]
    pub(crate) workflow: Option<String>,
    /// An explicit run id (created only if free).
    #[arg(long)]
    pub(crate) run_id: Option<String>,
    /// The operator's policy for the run, a JSON object merged into
    /// `vars._runtime` (only the keys of docs/tools.md, "Run policy":
    /// allowed_tools, tool_policy, tool_executor, tool_timeout_s,
    /// workspace_read_only, workspace_read_only_paths, ...).
    #[arg(long)]
    pub(crate) runtime: Option<String>,
    /// Start the run as a turn of this session (a discussion's session:
    /// the run is anchored to the discussion's root, its workspace and
    /// read-only mount).
    #[arg(long)]
    pub(crate) session: Option<String>,
    /// Hand the run the session's history as `vars.context.messages`
    /// (its completed turns within the 50,000-token window, read
    /// strictly; with --session).
    #[arg(long, requires = "session")]
    pub(crate) history: bool,
}

/// `stepwell run`: loads the bundle, starts the run and ticks it until it
/// waits or ends (exit status 1 when it failed).
pub(crate) fn run(rt: &Runtime, args: RunArgs) -> Result<Report, Error> {
    let RunArgs {
        flow_dir,
        vars,
        workflow,
        run_id,
        runtime,
        session,
        history,
        version,
    } = args;
    // A directory is deployed (a no-op when unchanged); anything else
    // names a deployed workflow.
    let mut warnings = Vec::new();
    let main = if flow_dir.is_dir() {
        let bundle = rt.load_bundle(&flow_dir)?;
        warnings = bundle
            .warnings()
            .iter()
            .map(|w| format!("warning: {w}"))
            .collect();
        bundle.main_workflow_id
    } else {
        flow_dir.to_string_lossy().into_owned()
    };
    let mut vars = match vars {
        Some(v) => parse_object("--vars", &v)?,
        None => Map::new(),
    };
    // Attribution is the host's, and an automation's own session
    // holds only its occurrences.
    stepwell::automation::check_caller_run(&vars, session.as_deref(), "--vars", "--session")?;
    if let (true, Some(s)) = (history, &session) {
        let replayed = stepwell::sessions::session_chat_messages(
            rt,
            s,
            &stepwell::sessions::HistoryOptions {
                strict: true,
                ..Default::default()
            },
        )?;
        let mut context = vars
            .get("context")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        context.insert("messages".into(), Value::from(replayed.messages));
        vars.insert("context".into(), Value::Object(context));
    }
    let runtime = match runtime {
        Some(r) => stepwell::core::config::operator_runtime(parse_object("--runtime", &r)?)?,
        None => Map::new(),
    };
    let wf = workflow.unwrap_or(main);
    let state = rt.run(
        &wf,
        StartOptions {
            vars,
            run_id,
            runtime,
            session_id: session,
            workflow_version: version,
            ..StartOptions::default()
        },
    )?;
    let mut report = finished(&state);
    for w in warnings {
        report.note(w);
    }
    Ok(report)
}

/// A run that `run` or `resume` executed: exit status 1 when it failed.
fn finished(state: &stepwell::RunState) -> Report {
    Report::run(state).failed_if(state.status == RunStatus::Failed)
}

/// What `stepwell resume` was asked.
#[derive(clap::Args)]
pub(crate) struct ResumeArgs {
    /// The run.
    run_id: String,
    /// The payload, JSON (for ask_user: {"text": "..."}).
    #[arg(long)]
    payload: String,
    /// The wait key (default: the key the run waits on now).
    #[arg(long)]
    wait_key: Option<String>,
}

/// `stepwell resume`: resumes the wait `wait_key` (default: whatever the
/// run waits on now) with `payload` (exit status 1 when the run failed).
pub(crate) fn resume(rt: &Runtime, args: ResumeArgs) -> Result<Report, Error> {
    let ResumeArgs {
        run_id,
        payload,
        wait_key,
    } = args;
    let payload = parse_json("--payload", &payload)?;
    // Without a key: whatever the run waits on now, checked and
    // resumed in one transaction.
    let state = match wait_key {
        Some(k) => rt.resume(&run_id, &k, payload)?,
        None => rt.respond(&run_id, payload)?,
    };
    Ok(finished(&state))
}

/// `stepwell list --quarantined`: the runs the driver set aside.
fn list_quarantined(rt: &Runtime) -> Result<Report, Error> {
    let found = rt.store().list_quarantined()?;
    let rows: Vec<Value> = found
        .iter()
        .map(|(id, why)| serde_json::json!({"run_id": id, "reason": why}))
        .collect();
    let mut report = Report::pretty(&rows);
    for (id, why) in found {
        report.push(format!("{id}  quarantined  {why}"));
    }
    Ok(report)
}

/// What `stepwell list` was asked.
#[derive(clap::Args)]
pub(crate) struct ListArgs {
    /// Only runs with this status (running, waiting, completed, failed, cancelled).
    #[arg(long)]
    status: Option<String>,
    /// Only waiting runs with this reason (event, until, user, job, subworkflow).
    #[arg(long)]
    wait_reason: Option<String>,
    /// Only runs of this workflow.
    #[arg(long)]
    workflow: Option<String>,
    /// Only runs created since this time: an RFC 3339 time, or a span back
    /// from now (`90m`, `12h`, `7d`).
    #[arg(long)]
    since: Option<String>,
    /// At most this many runs (default 100; when more match, a line on
    /// standard error says how to see the next ones).
    #[arg(long)]
    limit: Option<usize>,
    /// Only the runs listed after this one (the last run of the page
    /// before).
    #[arg(long)]
    after: Option<String>,
    /// List the quarantined runs (set aside because they cannot be
    /// read or committed) and why, instead.
    #[arg(long)]
    quarantined: bool,
}

/// `stepwell list`: a page of runs, newest first, and the cursor of the
/// next page on stderr (`--quarantined`: the runs set aside).
pub(crate) fn list(rt: &Runtime, args: ListArgs) -> Result<Report, Error> {
    let ListArgs {
        status,
        wait_reason,
        workflow,
        since,
        limit,
        after,
        quarantined,
    } = args;
    // The next page's command repeats the filters given.
    let given = [
        ("--status", status.clone()),
        ("--wait-reason", wait_reason.clone()),
        ("--workflow", workflow.clone()),
        ("--since", since.clone()),
        ("--limit", limit.map(|n| n.to_string())),
    ];
    let since = since.map(|s| parse_since(&s, rt.now())).transpose()?;
    let shown = match limit {
        Some(0) => {
            return Err(Error::InvalidInput {
                field: "--limit".into(),
                message: "must be at least 1".into(),
            })
        }
        // What a store can be asked (an SQL integer), and more than any
        // page anyone reads.
        Some(n) => n.min(MAX_LIST_LIMIT),
        None => DEFAULT_LIST_LIMIT,
    };
    if quarantined {
        return list_quarantined(rt);
    }
    let query = RunQuery {
        status: status
            .map(|s| {
                RunStatus::parse(&s).ok_or_else(|| Error::InvalidInput {
                    field: "--status".into(),
                    message: format!(
                        "{s:?} is not one of running, waiting, completed, failed, cancelled"
                    ),
                })
            })
            .transpose()?,
        wait_reason: wait_reason
            .map(|r| {
                WaitReason::parse(&r).ok_or_else(|| Error::InvalidInput {
                    field: "--wait-reason".into(),
                    message: format!("{r:?} is not one of event, until, user, job, subworkflow"),
                })
            })
            .transpose()?,
        workflow_id: workflow,
        // One more than shown: whether there are more.
        limit: Some(shown + 1),
        // Newest first, as the API and the dashboard list them: `--limit`
        // keeps the newest.
        newest_first: true,
        after_run_id: after,
        ..RunQuery::default()
    };
    if let Some(after) = &query.after_run_id {
        // An unknown cursor is an error, not an empty page.
        rt.get_state(after)?;
    }
    let mut runs = match since {
        Some(since) => created_since(rt, query, since)?,
        None => rt.list_runs(&query)?,
    };
    let more = runs.len() > shown;
    runs.truncate(shown);
    let mut report = Report::pretty(&runs);
    if let (true, Some(last)) = (more, runs.last()) {
        let mut options: Vec<(&str, Option<&str>)> =
            given.iter().map(|(n, v)| (*n, v.as_deref())).collect();
        options.push(("--after", Some(last.run_id.as_str())));
        report.note(format!(
            "more runs: {} (or more at once with a larger --limit)",
            super::render::command_hint("list", &options)
        ));
    }
    let id_width = runs.iter().map(|r| r.run_id.len()).max().unwrap_or(0);
    let wf_width = runs.iter().map(|r| r.workflow_id.len()).max().unwrap_or(0);
    for r in runs {
        let wait = r
            .waiting
            .as_ref()
            .map(|w| format!("  {} {}", w.reason.as_str(), w.wait_key))
            .unwrap_or_default();
        report.push(format!(
            "{:id_width$}  {:wf_width$}  {:9}  {}  {}  {:>8}{wait}",
            r.run_id,
            r.workflow_id,
            r.status.as_str(),
            short_time(&r.created_at),
            short_time(&r.updated_at),
            took(&r),
        ));
    }
    Ok(report)
}

/// The runs `query` lists that were created since `since`, up to its
/// limit. The listing is in creation order, which a creation time need not
/// follow (a run made with `--now`, an imported one), so pages are read
/// until the limit is reached or the runs end.
fn created_since(
    rt: &Runtime,
    mut query: RunQuery,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<RunState>, Error> {
    let wanted = query.limit.unwrap_or(usize::MAX);
    query.limit = Some(SINCE_PAGE);
    let mut found = Vec::new();
    loop {
        let page = rt.list_runs(&query)?;
        let last = page.last().map(|r| r.run_id.clone());
        let full = page.len() == SINCE_PAGE;
        found.extend(
            page.into_iter()
                .filter(|r| utc(&r.created_at).is_none_or(|c| c >= since)),
        );
        if found.len() >= wanted || !full {
            found.truncate(wanted);
            return Ok(found);
        }
        query.after_run_id = last;
    }
}

/// The page `--since` reads the runs by.
const SINCE_PAGE: usize = 500;

/// The most runs `list --limit` shows.
const MAX_LIST_LIMIT: usize = 1_000_000;

/// A run's RFC 3339 time (`created_at`, `updated_at`) in UTC.
fn utc(t: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::parse_from_rfc3339(t)
        .ok()
        .map(|d| d.with_timezone(&chrono::Utc))
}

/// `--since`: an RFC 3339 time, or a span back from `now` (the runtime's
/// clock: `--now` moves it).
fn parse_since(
    text: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<chrono::DateTime<chrono::Utc>, Error> {
    if let Some(span) = stepwell::core::retention::parse_span(text) {
        let span = chrono::Duration::from_std(span).unwrap_or(chrono::Duration::MAX);
        return Ok(now
            .checked_sub_signed(span)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC));
    }
    stepwell::core::clock::parse_time(text).map_err(|_| Error::InvalidInput {
        field: "--since".into(),
        message: format!(
            "{text:?} is neither an RFC 3339 time (2026-12-01T09:00:00Z) nor a span back from now (90m, 12h, 7d)"
        ),
    })
}

/// An RFC 3339 time as `2026-12-05 13:50:12` (UTC, whole seconds).
fn short_time(t: &str) -> String {
    utc(t).map_or_else(
        || t.to_string(),
        |d| d.format("%Y-%m-%d %H:%M:%S").to_string(),
    )
}

/// How long a run took from its creation to its last change (its end, for
/// an ended run): `0.012s`, `42s`, `3m20s`, `2h05m`, `4d03h`.
fn took(run: &RunState) -> String {
    let (Some(a), Some(b)) = (utc(&run.created_at), utc(&run.updated_at)) else {
        return "-".into();
    };
    let ms = (b - a).num_milliseconds().max(0);
    let s = ms / 1000;
    match s {
        0..=9 => format!("{}.{:03}s", s, ms % 1000),
        10..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

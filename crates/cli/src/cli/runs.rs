//! The commands on one run or on the list of runs: `run`, `resume`,
//! `status`, `cancel`, `list`.

use std::path::PathBuf;

use serde_json::{Map, Value};
use stepwell::{Error, RunQuery, RunStatus, Runtime, StartOptions, WaitReason};

use super::input::{parse_json, parse_object};
use super::render::{note_outcome, print_run};

/// How many runs `stepwell list` shows without `--limit`.
const DEFAULT_LIST_LIMIT: usize = 100;

/// What `stepwell run` was asked (its arguments, docs/cli.md).
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The bundle directory (holding flow.json).
    pub(crate) flow_dir: PathBuf,
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
/// waits or ends.
pub(crate) fn run(rt: &Runtime, args: RunArgs, json: bool) -> Result<(), Error> {
    let RunArgs {
        flow_dir,
        vars,
        workflow,
        run_id,
        runtime,
        session,
        history,
    } = args;
    let bundle = rt.load_bundle(&flow_dir)?;
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
    let wf = workflow.unwrap_or(bundle.main_workflow_id);
    let state = rt.run(
        &wf,
        StartOptions {
            vars,
            run_id,
            runtime,
            session_id: session,
            ..StartOptions::default()
        },
    )?;
    print_run(&state, json);
    note_outcome(&state);
    Ok(())
}

/// `stepwell resume`: resumes the wait `wait_key` (default: whatever the
/// run waits on now) with `payload`.
pub(crate) fn resume(
    rt: &Runtime,
    run_id: &str,
    payload: &str,
    wait_key: Option<&str>,
    json: bool,
) -> Result<(), Error> {
    let payload = parse_json("--payload", payload)?;
    // Without a key: whatever the run waits on now, checked and
    // resumed in one transaction.
    let state = match wait_key {
        Some(k) => rt.resume(run_id, k, payload)?,
        None => rt.respond(run_id, payload)?,
    };
    print_run(&state, json);
    note_outcome(&state);
    Ok(())
}

/// `stepwell list --quarantined`: the runs the driver set aside.
pub(crate) fn list_quarantined(rt: &Runtime, json: bool) -> Result<(), Error> {
    let found = rt.store().list_quarantined()?;
    if json {
        let rows: Vec<Value> = found
            .iter()
            .map(|(id, why)| serde_json::json!({"run_id": id, "reason": why}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    } else {
        for (id, why) in found {
            println!("{id}  quarantined  {why}");
        }
    }
    Ok(())
}

/// What `stepwell list` was asked.
pub(crate) struct ListArgs {
    pub(crate) status: Option<String>,
    pub(crate) wait_reason: Option<String>,
    pub(crate) workflow: Option<String>,
    pub(crate) limit: Option<usize>,
    pub(crate) after: Option<String>,
}

/// `stepwell list`: a page of runs, newest first, and the cursor of the
/// next page on stderr.
pub(crate) fn list(rt: &Runtime, args: ListArgs, json: bool) -> Result<(), Error> {
    let ListArgs {
        status,
        wait_reason,
        workflow,
        limit,
        after,
    } = args;
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
        limit: Some(limit.unwrap_or(DEFAULT_LIST_LIMIT).saturating_add(1)),
        after_run_id: after,
        ..RunQuery::default()
    };
    if let Some(after) = &query.after_run_id {
        // An unknown cursor is an error, not an empty page.
        rt.get_state(after)?;
    }
    let mut runs = rt.list_runs(&query)?;
    let shown = limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if runs.len() > shown {
        runs.truncate(shown);
        if let Some(last) = runs.last() {
            eprintln!(
                "more runs: the next with --after {}, or more at once with --limit",
                last.run_id
            );
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&runs).unwrap_or_default()
        );
    } else {
        for r in runs {
            let wait = r
                .waiting
                .as_ref()
                .map(|w| format!("{} {}", w.reason.as_str(), w.wait_key))
                .unwrap_or_default();
            println!(
                "{}  {:20} {:10} {}",
                r.run_id,
                r.workflow_id,
                r.status.as_str(),
                wait
            );
        }
    }
    Ok(())
}

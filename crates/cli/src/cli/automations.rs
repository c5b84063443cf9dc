//! `stepwell automations ...`: create, list, show and command automations,
//! and read their occurrences and attention items.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::{json, Value};
use stepwell::automation::{
    apply_automation_command, create_automation, list_attention, list_automations,
    list_occurrences, pending_waits, show_automation, start_discussion, Command, DiscussionRequest,
};
use stepwell::{Error, Runtime};

use super::render::Report;

/// The `automations` subcommands.
#[derive(Subcommand)]
pub enum AutomationCommand {
    /// Create an automation (or find it: the same request again is
    /// answered with the existing one). Prints `{automation_id, revision,
    /// created}`.
    #[command(
        after_help = r#"Example (flows/automations/hourly.json; docs/automations.md has every field):
  stepwell automations create --request '{"request_id": "memory-watch", "title": "Memory watch",
    "target": {"workflow_id": "echo", "bundle_ref": "flows/automations/echo", "flow_id": "echo",
               "input_data": {"prompt": "check memory", "notify": true}},
    "trigger": {"source_id": "schedule", "source_version": 1, "config": {"every": "1h"}},
    "workspace_root": "/tmp"}'
  stepwell automations create --request @flows/automations/hourly.json"#
    )]
    Create {
        /// The creation request: JSON text, or @FILE.
        #[arg(long)]
        request: String,
    },
    /// List automations, newest first.
    List {
        /// Only these statuses (active, paused, completed, failed,
        /// archived; comma-separated).
        #[arg(long)]
        status: Option<String>,
        /// Continue after this cursor (`auto1:...`).
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Show one automation: definition, state, status, next fire time,
    /// current occurrence.
    Show {
        /// The automation id.
        id: String,
    },
    /// Apply a command: pause, resume, run_now, revise, stop_current,
    /// archive, unarchive (or the full name, automation.pause ...). A
    /// rejected command exits 1.
    Command {
        /// The automation id.
        id: String,
        /// The command type.
        #[arg(value_name = "TYPE")]
        kind: String,
        /// Your id for this command: sending it again is answered as a
        /// duplicate. Without it one is made up (and printed on stderr, to
        /// send the command again safely).
        #[arg(long)]
        command_id: Option<String>,
        /// The payload, JSON (revise: {"changes": {...}}).
        #[arg(long)]
        payload: Option<String>,
        /// Refuse unless the automation is at this revision.
        #[arg(long)]
        expected_revision: Option<i64>,
        /// Who sends it (recorded).
        #[arg(long)]
        actor: Option<String>,
    },
    /// An automation's occurrences, newest first.
    Occurrences {
        /// The automation id.
        id: String,
        /// Continue after this cursor (`occ1:<n>`).
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many (1..500).
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// The waits on a person in an automation's occurrences (live: the
    /// runs waiting now), oldest occurrence first.
    Waits {
        /// The automation id.
        id: String,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// An automation's attention items (failures, notifications), oldest
    /// first.
    Attention {
        /// The automation id.
        id: String,
        /// Only items after this sequence number.
        #[arg(long, default_value_t = 0)]
        after_seq: i64,
        /// Continue after this cursor (`att1:<seq>`).
        #[arg(long)]
        cursor: Option<String>,
        /// At most this many (1..500).
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Start (or find again) a discussion of one occurrence: a new run of
    /// the occurrence's workflow, seeded with the automation's timeline
    /// through it, in its own session and its own writable workspace, the
    /// automation's workspace mounted read-only. Ticks it like `run` and
    /// prints `{session_id, run_id, session_kind, status, output}`.
    Discuss {
        /// The automation id.
        id: String,
        /// The occurrence discussed.
        #[arg(long)]
        occurrence: i64,
        /// Your id for this discussion: the same request again finds it.
        #[arg(long)]
        request_id: String,
        /// The first message.
        #[arg(long)]
        prompt: String,
        /// The discussion's own workspace (absolute; not the automation's).
        #[arg(long)]
        workspace: String,
        /// Who starts it (recorded on the run).
        #[arg(long)]
        actor: Option<String>,
    },
}

fn json_arg(field: &str, text: &str) -> Result<Value, Error> {
    let text = match text.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| Error::InvalidInput {
            field: field.into(),
            message: format!("cannot read {path}: {e}"),
        })?,
        None => text.to_string(),
    };
    stepwell::core::config::check_exact_integers(field, &text)?;
    serde_json::from_str(&text).map_err(|e| Error::InvalidInput {
        field: field.into(),
        message: format!("not valid JSON: {e}"),
    })
}

/// Runs one `automations` subcommand at `now` (exit status 1 when a
/// command was rejected or a discussion's run failed).
pub(crate) fn run(
    rt: &Runtime,
    command: AutomationCommand,
    now: DateTime<Utc>,
) -> Result<Report, Error> {
    Ok(match command {
        AutomationCommand::Create { request } => {
            let c = create_automation(rt, &json_arg("--request", &request)?, now, None)?;
            let out = serde_json::json!({
                "automation_id": c.automation_id,
                "revision": c.revision,
                "created": c.created,
            });
            let created = if c.created { "created" } else { "existed" };
            Report::compact(&out).line(format!(
                "automation {}  revision {}  {created}",
                c.automation_id, c.revision
            ))
        }
        AutomationCommand::List {
            status,
            cursor,
            limit,
        } => page(
            list_automations(rt, status.as_deref(), cursor.as_deref(), limit, now)?,
            automation_lines,
        ),
        AutomationCommand::Show { id } => Report::value(&show_automation(rt, &id, now)?),
        AutomationCommand::Command {
            id,
            kind,
            command_id,
            payload,
            expected_revision,
            actor,
        } => {
            let payload = payload.map(|p| json_arg("--payload", &p)).transpose()?;
            let made_up = command_id.is_none();
            let command_id = command_id.unwrap_or_else(|| {
                let made = made_up_command_id();
                eprintln!("command id: {made} (made up: send the command again with --command-id {made} to have it answered as a duplicate)");
                made
            });
            let command = Command {
                automation_id: &id,
                command_id: &command_id,
                command_type: &kind,
                payload: payload.as_ref(),
                actor: actor.as_deref(),
                expected_revision,
            };
            let mut answer = apply_automation_command(rt, &command, now)?;
            if made_up {
                // For a script: the id to send it again under.
                answer["command_id"] = json!(command_id);
            }
            answered(answer)
        }
        AutomationCommand::Discuss {
            id,
            occurrence,
            request_id,
            prompt,
            workspace,
            actor,
        } => discuss(
            rt,
            &DiscussionRequest {
                automation_id: id,
                occurrence_index: occurrence,
                request_id,
                prompt,
                workspace_root: workspace,
                actor_id: actor,
            },
        )?,
        AutomationCommand::Occurrences { id, cursor, limit } => {
            occurrences(rt, list_occurrences(rt, &id, cursor.as_deref(), limit)?)
        }
        AutomationCommand::Waits { id, limit } => {
            let waits = pending_waits(rt, &id, limit)?;
            Report::compact(&waits).lines(waits.iter().map(wait_line))
        }
        AutomationCommand::Attention {
            id,
            after_seq,
            cursor,
            limit,
        } => page(
            list_attention(rt, &id, after_seq, cursor.as_deref(), limit)?,
            attention_lines,
        ),
    })
}

/// A page of `automations occurrences` as a table. An occurrence in
/// progress whose run waits (on a person, a time, ...) shows as waiting,
/// and on what; the JSON keeps the controller's `running`.
fn occurrences(rt: &Runtime, found: Value) -> Report {
    let rows: Vec<Vec<String>> = found["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let run_id = o["run_id"].as_str().unwrap_or_default();
            let status = o["status"].as_str().unwrap_or_default();
            // Only an occurrence in progress has a run worth reading.
            let waiting = (status == "running")
                .then(|| rt.get_state(run_id).ok().and_then(|r| r.waiting))
                .flatten();
            let shown = match waiting {
                Some(w) => format!("waiting ({})", w.reason.as_str()),
                None => status.to_string(),
            };
            let attempts = o["attempts"].as_u64().unwrap_or(0);
            vec![
                format!("#{}", o["index"]),
                shown,
                format!("{attempts} attempt{}", if attempts == 1 { "" } else { "s" }),
                format!("fired {}", shown_time(&o["fired_at"])),
                format!("run {run_id}"),
            ]
        })
        .collect();
    let more = found["next_cursor"]
        .as_str()
        .map(|c| format!("more: --cursor {c}"));
    Report::compact(&found)
        .lines(super::render::table(&rows))
        .lines(more)
}

/// A wait on a person of `automations waits`, as a line.
fn wait_line(w: &Value) -> String {
    format!(
        "#{}  {}  run {}  key {}  {}",
        w["index"],
        w["kind"].as_str().unwrap_or_default(),
        w["run_id"].as_str().unwrap_or_default(),
        w["wait_key"].as_str().unwrap_or_default(),
        w["prompt"].as_str().unwrap_or_default(),
    )
}

/// An attention item of `automations attention`, as a line (its body on
/// it).
fn attention_lines(a: &Value) -> Vec<String> {
    vec![format!(
        "{}  {}  #{}  {}: {}",
        a["cursor"].as_str().unwrap_or_default(),
        a["kind"].as_str().unwrap_or_default(),
        a["index"],
        a["title"].as_str().unwrap_or_default(),
        a["body"].as_str().unwrap_or_default().replace('\n', " "),
    )]
}

/// A page (`{items, next_cursor}`): on one line with `--json`; as text,
/// the lines `item` makes of each item, then how to see the next page.
fn page(page: Value, item: impl Fn(&Value) -> Vec<String>) -> Report {
    let lines: Vec<String> = page["items"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(item)
        .collect();
    let more = page["next_cursor"]
        .as_str()
        .map(|c| format!("more: --cursor {c}"));
    Report::compact(&page).lines(lines).lines(more)
}

/// An automation of `automations list`: its line, and why it is held.
fn automation_lines(item: &Value) -> Vec<String> {
    let mut lines = vec![format!(
        "{}  {:9}  next {}  occurrences {}  {}",
        item["automation_id"].as_str().unwrap_or_default(),
        item["status"].as_str().unwrap_or_default(),
        shown_time(&item["next_fire_at"]),
        item["occurrence_count"],
        item["title"].as_str().unwrap_or_default(),
    )];
    if let Some(held) = item.get("held") {
        lines.push(format!(
            "  held after {} failed tries, next try {}: {}",
            held["failures"],
            shown_time(&held["retry_at"]),
            held["error"].as_str().unwrap_or_default(),
        ));
    }
    lines
}

/// A command's answer: applied, or rejected and why (exit status 1).
fn answered(answer: Value) -> Report {
    let dup = if answer["duplicate"] == Value::Bool(true) {
        " (duplicate)"
    } else {
        ""
    };
    let line = match answer["status"].as_str() {
        Some("applied") => format!("applied{dup}"),
        _ => format!(
            "rejected{dup}: {}: {}{}",
            answer["error"]["reason_code"].as_str().unwrap_or_default(),
            answer["error"]["field"]
                .as_str()
                .map(|f| format!("{f}: "))
                .unwrap_or_default(),
            answer["error"]["message"].as_str().unwrap_or_default()
        ),
    };
    let rejected = answer["status"] != "applied";
    Report::compact(&answer).line(line).failed_if(rejected)
}

/// Starts (or finds) a discussion and ticks its run like `run` (exit
/// status 1 when the run failed).
fn discuss(rt: &Runtime, request: &DiscussionRequest) -> Result<Report, Error> {
    let started = start_discussion(rt, request)?;
    let state = rt.tick(&started.run_id)?;
    let mut report = Report::compact(&started.with_state(&state)).line(format!(
        "discussion {}  run {}  status {}",
        started.session_id,
        started.run_id,
        state.status.as_str()
    ));
    if let Some(w) = &state.waiting {
        report.push(format!(
            "waiting: {}  key {}",
            w.prompt.as_deref().unwrap_or_default(),
            w.wait_key
        ));
    }
    if let Some(o) = &state.output {
        report.push(format!("output: {o}"));
    }
    Ok(report.failed_if(state.status == stepwell::RunStatus::Failed))
}

/// A command id for a command sent without one: the time in nanoseconds
/// and this process's id (two commands of one process are made in turn).
fn made_up_command_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cli-{nanos:x}-{}", std::process::id())
}

/// A time of the controller's state (written `+00:00`, as the reference
/// writes it) in the CLI's one style, the ledger's: UTC with `Z`; `-` for
/// none.
fn shown_time(t: &Value) -> String {
    let Some(text) = t.as_str() else {
        return "-".into();
    };
    DateTime::parse_from_rfc3339(text).map_or_else(
        |_| text.to_string(),
        |d| {
            d.with_timezone(&Utc)
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        },
    )
}

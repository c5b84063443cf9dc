//! `stepwell automations ...`: create, list, show and command automations,
//! and read their occurrences and attention items.

use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::Value;
use stepwell::automation::{
    apply_automation_command, create_automation, list_attention, list_automations,
    list_occurrences, pending_waits, show_automation, start_discussion, Command, DiscussionRequest,
};
use stepwell::{Error, Runtime};

/// The `automations` subcommands.
#[derive(Subcommand)]
pub enum AutomationCommand {
    /// Create an automation (or find it: the same request again is
    /// answered with the existing one). Prints `{automation_id, revision,
    /// created}`.
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
        /// duplicate.
        #[arg(long)]
        command_id: String,
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

fn print(value: &Value, json: bool) {
    if json {
        println!("{value}");
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    }
}

/// Runs one `automations` subcommand at `now`; `Ok(false)` when a command
/// was rejected (the binary then exits 1).
pub fn run(
    rt: &Runtime,
    command: AutomationCommand,
    now: DateTime<Utc>,
    json: bool,
) -> Result<bool, Error> {
    match command {
        AutomationCommand::Create { request } => {
            let request = json_arg("--request", &request)?;
            let c = create_automation(rt, &request, now, None)?;
            let out = serde_json::json!({
                "automation_id": c.automation_id,
                "revision": c.revision,
                "created": c.created,
            });
            if json {
                println!("{out}");
            } else {
                println!(
                    "automation {}  revision {}  {}",
                    c.automation_id,
                    c.revision,
                    if c.created { "created" } else { "existed" }
                );
            }
        }
        AutomationCommand::List {
            status,
            cursor,
            limit,
        } => {
            let page = list_automations(rt, status.as_deref(), cursor.as_deref(), limit, now)?;
            if json {
                println!("{page}");
            } else {
                for item in page["items"].as_array().into_iter().flatten() {
                    println!(
                        "{}  {:9}  next {}  occurrences {}  {}",
                        item["automation_id"].as_str().unwrap_or_default(),
                        item["status"].as_str().unwrap_or_default(),
                        item["next_fire_at"].as_str().unwrap_or("-"),
                        item["occurrence_count"],
                        item["title"].as_str().unwrap_or_default(),
                    );
                    if let Some(held) = item.get("held") {
                        println!(
                            "  held after {} failed tries, next try {}: {}",
                            held["failures"],
                            held["retry_at"].as_str().unwrap_or_default(),
                            held["error"].as_str().unwrap_or_default(),
                        );
                    }
                }
                if let Some(c) = page["next_cursor"].as_str() {
                    println!("more: --cursor {c}");
                }
            }
        }
        AutomationCommand::Show { id } => print(&show_automation(rt, &id, now)?, json),
        AutomationCommand::Command {
            id,
            kind,
            command_id,
            payload,
            expected_revision,
            actor,
        } => {
            let payload = payload.map(|p| json_arg("--payload", &p)).transpose()?;
            let answer = apply_automation_command(
                rt,
                &Command {
                    automation_id: &id,
                    command_id: &command_id,
                    command_type: &kind,
                    payload: payload.as_ref(),
                    actor: actor.as_deref(),
                    expected_revision,
                },
                now,
            )?;
            if json {
                println!("{answer}");
            } else {
                let dup = if answer["duplicate"] == Value::Bool(true) {
                    " (duplicate)"
                } else {
                    ""
                };
                match answer["status"].as_str() {
                    Some("applied") => println!("applied{dup}"),
                    _ => println!(
                        "rejected{dup}: {}: {}{}",
                        answer["error"]["reason_code"].as_str().unwrap_or_default(),
                        answer["error"]["field"]
                            .as_str()
                            .map(|f| format!("{f}: "))
                            .unwrap_or_default(),
                        answer["error"]["message"].as_str().unwrap_or_default()
                    ),
                }
            }
            return Ok(answer["status"] == "applied");
        }
        AutomationCommand::Discuss {
            id,
            occurrence,
            request_id,
            prompt,
            workspace,
            actor,
        } => {
            let started = start_discussion(
                rt,
                &DiscussionRequest {
                    automation_id: id,
                    occurrence_index: occurrence,
                    request_id,
                    prompt,
                    workspace_root: workspace,
                    actor_id: actor,
                },
            )?;
            let state = rt.tick(&started.run_id)?;
            if json {
                println!("{}", started.with_state(&state));
            } else {
                println!(
                    "discussion {}  run {}  status {}",
                    started.session_id,
                    started.run_id,
                    state.status.as_str()
                );
                if let Some(w) = &state.waiting {
                    println!(
                        "waiting: {}  key {}",
                        w.prompt.as_deref().unwrap_or_default(),
                        w.wait_key
                    );
                }
                if let Some(o) = &state.output {
                    println!("output: {o}");
                }
            }
            return Ok(state.status != stepwell::RunStatus::Failed);
        }
        AutomationCommand::Occurrences { id, cursor, limit } => {
            let page = list_occurrences(rt, &id, cursor.as_deref(), limit)?;
            if json {
                println!("{page}");
            } else {
                for o in page["items"].as_array().into_iter().flatten() {
                    println!(
                        "#{}  {:9}  attempts {}  fired {}  run {}",
                        o["index"],
                        o["status"].as_str().unwrap_or_default(),
                        o["attempts"],
                        o["fired_at"].as_str().unwrap_or("-"),
                        o["run_id"].as_str().unwrap_or_default(),
                    );
                }
                if let Some(c) = page["next_cursor"].as_str() {
                    println!("more: --cursor {c}");
                }
            }
        }
        AutomationCommand::Waits { id, limit } => {
            let waits = pending_waits(rt, &id, limit)?;
            if json {
                println!("{}", Value::Array(waits));
            } else {
                for w in &waits {
                    println!(
                        "#{}  {}  run {}  key {}  {}",
                        w["index"],
                        w["kind"].as_str().unwrap_or_default(),
                        w["run_id"].as_str().unwrap_or_default(),
                        w["wait_key"].as_str().unwrap_or_default(),
                        w["prompt"].as_str().unwrap_or_default(),
                    );
                }
            }
        }
        AutomationCommand::Attention {
            id,
            after_seq,
            cursor,
            limit,
        } => {
            let page = list_attention(rt, &id, after_seq, cursor.as_deref(), limit)?;
            if json {
                println!("{page}");
            } else {
                for a in page["items"].as_array().into_iter().flatten() {
                    println!(
                        "{}  {}  #{}  {}: {}",
                        a["cursor"].as_str().unwrap_or_default(),
                        a["kind"].as_str().unwrap_or_default(),
                        a["index"],
                        a["title"].as_str().unwrap_or_default(),
                        a["body"].as_str().unwrap_or_default().replace('\n', " "),
                    );
                }
                if let Some(c) = page["next_cursor"].as_str() {
                    println!("more: --cursor {c}");
                }
            }
        }
    }
    Ok(true)
}

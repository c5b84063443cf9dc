//! `stepwell sessions ...`: the turns of a conversation and the history a
//! model is handed again.

use clap::Subcommand;
use serde_json::Value;
use stepwell::sessions::{
    select_session_turns, session_chat_messages, HistoryOptions, Turn, TurnsOptions,
};
use stepwell::{Error, Runtime};

use super::render::Report;

/// The `sessions` subcommands.
#[derive(Subcommand)]
pub enum SessionCommand {
    /// The turns of a session, oldest first: its runs without a parent and
    /// its automation occurrences (a retried occurrence once, its newest
    /// attempt), never their children or the automation's controller.
    Turns {
        /// The session id (`automation:<id>` for a growing automation).
        session: String,
        /// Keep only this automation's occurrences, from every session.
        #[arg(long)]
        automation_id: Option<String>,
        /// The turns as they stood when occurrence N ran.
        #[arg(long)]
        through_occurrence: Option<i64>,
        /// The newest this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// The session's history as a model is handed it: completed turns as
    /// user/assistant messages, the most recent whole turns within the
    /// token budget, and the window's report.
    History {
        /// The session id.
        session: String,
        /// The window's budget in estimated tokens.
        #[arg(long, default_value_t = 50_000)]
        max_tokens: u64,
        /// Keep only this automation's occurrences, from every session.
        #[arg(long)]
        automation_id: Option<String>,
        /// The history as it stood when occurrence N ran.
        #[arg(long)]
        through_occurrence: Option<i64>,
    },
}

/// Runs one `sessions` subcommand.
pub(crate) fn run(rt: &Runtime, command: SessionCommand) -> Result<Report, Error> {
    Ok(match command {
        SessionCommand::Turns {
            session,
            automation_id,
            through_occurrence,
            limit,
        } => {
            let turns = select_session_turns(
                rt,
                &session,
                &TurnsOptions {
                    automation_id,
                    through_occurrence,
                    limit,
                    ..TurnsOptions::default()
                },
            )?;
            let turns: Vec<Turn> = turns.iter().map(Turn::of).collect();
            let items: Vec<Value> = turns.iter().map(Turn::to_json).collect();
            let mut report = Report::compact(&Value::Array(items));
            for t in &turns {
                let occurrence = t
                    .occurrence
                    .as_ref()
                    .map(|(_, i)| format!("  occurrence {i}"))
                    .unwrap_or_default();
                report.push(format!(
                    "{}  {:9}  {}  {}{occurrence}",
                    t.run_id,
                    t.status.as_str(),
                    t.created_at,
                    t.workflow_id
                ));
            }
            report
        }
        SessionCommand::History {
            session,
            max_tokens,
            automation_id,
            through_occurrence,
        } => {
            let history = session_chat_messages(
                rt,
                &session,
                &HistoryOptions {
                    max_tokens,
                    automation_id,
                    through_occurrence,
                    ..HistoryOptions::default()
                },
            )?;
            let out = serde_json::json!({
                "messages": history.messages,
                "report": history.report.to_json(),
            });
            let mut report = Report::compact(&out);
            for m in &history.messages {
                report.push(format!(
                    "{}: {}",
                    m["role"].as_str().unwrap_or_default(),
                    m["content"].as_str().unwrap_or_default()
                ));
            }
            report.line(format!(
                "({} message(s) replayed, {} dropped)",
                history.report.replayed_messages, history.report.dropped_messages
            ))
        }
    })
}

//! Sessions: which runs are the turns of a conversation, and what of it is
//! sent to a model again.
//!
//! A session is the runs that share a `session_id`. Its **turns** are its
//! turn roots ([`select_session_turns`]): runs without a parent and
//! automation occurrences, never their children, automation controllers,
//! the runtime's internal runs (a workflow id that starts and ends with
//! `__`) or legacy scheduled wrappers. A retried occurrence is one turn,
//! its newest attempt.
//!
//! Its **history** ([`session_chat_messages`]) is the completed turns with
//! a prompt and an answer, as `[user, assistant]` pairs, folded into the
//! history window of [`stepwell_automation_core::history`]: the most recent
//! whole turns within a token budget. In a discussion session the seed the
//! discussion was started with (the automation's occurrences, see
//! [`crate::start_discussion`]) is the oldest history, dropped
//! first.
//!
//! The selection and the texts are the reference implementation's
//! (abstractruntime 0.13.0, `session_turns.py`, `session_history.py`,
//! `history_bundle.py`). A turn's answer is read from its run's output
//! (`response`, `answer`, `message`, `text` or `content`, or the same keys
//! under `result` / `output`); the reference also falls back to a flow-end
//! record of the ledger, which stepwell does not need: a completed run's
//! output is always stored with it.
//!
//! ```
//! # fn main() -> Result<(), stepwell_runtime::Error> {
//! use std::sync::Arc;
//! use stepwell_automation::sessions::{select_session_turns, session_chat_messages, HistoryOptions, TurnsOptions};
//! use stepwell_runtime::{MemoryStore, Runtime};
//!
//! let rt = stepwell_runtime::Runtime::builder(Arc::new(MemoryStore::new())).build()?;
//! // A session nobody has talked in has no turns and no history.
//! let turns = select_session_turns(&rt, "chat-1", &TurnsOptions::default())?;
//! assert!(turns.is_empty());
//! let history = session_chat_messages(&rt, "chat-1", &HistoryOptions::default())?;
//! assert!(history.messages.is_empty());
//! # Ok(()) }
//! ```

use std::collections::{BTreeSet, HashMap};

use serde_json::{json, Value};
use stepwell_automation_core::history::{
    announce_dropped, fold_sizes, message_tokens, WindowReport, HISTORY_REPLAY_MAX_TOKENS,
};
use stepwell_automation_core::AutomationError;

use stepwell_runtime::core::model::{RunState, RunStatus};
use stepwell_runtime::core::{Error, Result};
use stepwell_runtime::effects::RunPort;
use stepwell_runtime::store::{RunIndexQuery, RunIndexRow, RunIndexer};

/// The prefix of the gateway's legacy scheduled wrapper workflows (never
/// turns).
pub const LEGACY_SCHEDULED_WORKFLOW_PREFIX: &str = "scheduled:";

/// The `kind` of a replayed session turn's message metadata.
pub const SESSION_TURN_KIND: &str = "session_turn";

/// How many turns the history reads first (doubled until the window is
/// full or the session read).
const FIRST_TURN_FETCH: usize = 32;

/// As good as unbounded, for reads that must see a whole session.
const ALL: usize = 1_000_000;

fn error(reason: &str, field: Option<&str>, message: impl Into<String>) -> Error {
    Error::from(AutomationError::new(reason, field, message))
}

/// Options of [`select_session_turns`].
#[derive(Debug, Clone)]
pub struct TurnsOptions {
    /// Include automation occurrences (default `true`).
    pub include_occurrences: bool,
    /// Only turns created at or before this instant (epoch milliseconds).
    pub until_ms: Option<i64>,
    /// Keep only this automation's occurrences (other turns stay),
    /// gathered from every session: an independent automation runs each
    /// occurrence in a session of its own.
    pub automation_id: Option<String>,
    /// The history as it stood when occurrence N ran: occurrences after N
    /// and every turn created after N's newest attempt are dropped. A
    /// session without occurrence N is refused (`occurrence_not_found`).
    pub through_occurrence: Option<i64>,
    /// Include draft-test runs (`vars._run_lifecycle.purpose ==
    /// "draft_test"`; default `false`).
    pub include_drafts: bool,
    /// The newest this many turns (default 50; 0 gives none).
    pub limit: usize,
}

impl Default for TurnsOptions {
    fn default() -> Self {
        TurnsOptions {
            include_occurrences: true,
            until_ms: None,
            automation_id: None,
            through_occurrence: None,
            include_drafts: false,
            limit: 50,
        }
    }
}

/// Epoch milliseconds of an RFC 3339 time (`None` when it is not one).
fn iso_ms(raw: &str) -> Option<i64> {
    let text = raw.trim();
    if text.is_empty() {
        return None;
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// The order of turns: creation time (milliseconds), then its raw text
/// (finer than a millisecond), then the run id.
fn order_key(row: &RunIndexRow) -> (i64, String, String) {
    for raw in [&row.created_at, &row.updated_at] {
        if let Some(ms) = iso_ms(raw) {
            return (ms, raw.clone(), row.run_id.clone());
        }
    }
    (0, String::new(), row.run_id.clone())
}

/// The runtime's reserved workflow ids: they start **and** end with `__`.
pub fn is_internal_workflow_id(workflow_id: &str) -> bool {
    workflow_id.starts_with("__") && workflow_id.ends_with("__")
}

/// A legacy scheduled wrapper: role `legacy_schedule`, or a workflow id
/// with the `scheduled:` prefix.
pub fn is_legacy_scheduled(row: &RunIndexRow) -> bool {
    row.role.as_deref() == Some("legacy_schedule")
        || row
            .workflow_id
            .starts_with(LEGACY_SCHEDULED_WORKFLOW_PREFIX)
}

/// Whether an index row that says it is an automation's occurrence is
/// one: a child of that automation's controller (whose run id is the
/// automation's id). A run anyone started with a forged
/// `_meta.occurrence` is not, and is no turn of any session: it could
/// otherwise stand in for an occurrence in a growing automation's history.
fn genuine_occurrence(row: &RunIndexRow) -> bool {
    row.automation_id.is_some() && row.parent_run_id == row.automation_id
}

fn index(port: &dyn RunPort, query: RunIndexQuery) -> Result<Vec<RunIndexRow>> {
    port.list_run_index(&query)
}

/// The order key of occurrence `n` (its newest attempt), found in the
/// index directly: across sessions for an automation, else in the
/// session. Refused with `occurrence_not_found` when there is none.
fn occurrence_cutoff(
    port: &dyn RunPort,
    session_id: &str,
    automation_id: Option<&str>,
    n: i64,
) -> Result<(i64, String, String)> {
    let mut query = RunIndexQuery {
        role: Some(vec!["occurrence".into()]),
        limit: Some(ALL),
        ..RunIndexQuery::default()
    };
    match automation_id {
        Some(a) => query.automation_id = Some(vec![a.to_string()]),
        None => query.session_id = Some(session_id.to_string()),
    }
    index(port, query)?
        .iter()
        .filter(|r| r.occurrence_index == Some(n) && genuine_occurrence(r))
        .map(order_key)
        .max()
        .ok_or_else(|| {
            let of = automation_id
                .map(|a| format!(" of automation {a}"))
                .unwrap_or_default();
            error(
                "occurrence_not_found",
                Some("occurrence_index"),
                format!("session {session_id} has no occurrence {n}{of}"),
            )
        })
}

/// Whether `run` is a draft test (`vars._run_lifecycle.purpose ==
/// "draft_test"`), never a turn unless asked.
pub fn is_draft(run: &RunState) -> bool {
    run.vars
        .get("_run_lifecycle")
        .and_then(|l| l.get("purpose"))
        .and_then(Value::as_str)
        .is_some_and(|p| p.trim() == "draft_test")
}

/// Whether a turn is chat-like: an occurrence, or a run whose vars carry a
/// `context.messages` list.
fn chat_like(run: &RunState, row: &RunIndexRow) -> bool {
    row.role.as_deref() == Some("occurrence")
        || run
            .vars
            .get("context")
            .and_then(|c| c.get("messages"))
            .is_some_and(Value::is_array)
}

/// The turns of `session_id`, oldest first, the newest `options.limit`
/// (see the module's docs and [`TurnsOptions`]). When any selected turn is
/// chat-like (an occurrence, or a run with `context.messages`), plain
/// workflow runs are left out.
pub fn select_session_turns(
    port: &dyn RunPort,
    session_id: &str,
    options: &TurnsOptions,
) -> Result<Vec<RunState>> {
    if session_id.trim().is_empty() || options.limit == 0 {
        return Ok(Vec::new());
    }
    let rows = turn_rows(port, session_id, options)?;
    let mut cache = Loads::default();
    let turns = newest_turns(port, &rows, options, &mut cache)?;
    Ok(turns
        .into_iter()
        .filter_map(|id| cache.remove(&id).flatten().map(|l| l.run))
        .collect())
}

/// A turn's run as the history needs it, loaded once per read.
struct Loaded {
    run: RunState,
    chat_like: bool,
}

/// Runs loaded so far (`None`: gone since the index was read, or a draft
/// left out).
type Loads = HashMap<String, Option<Loaded>>;

/// The index rows of a session's turns, oldest first, every selection rule
/// and bound applied (see [`select_session_turns`]); nothing is loaded.
fn turn_rows(
    port: &dyn RunPort,
    session_id: &str,
    options: &TurnsOptions,
) -> Result<Vec<RunIndexRow>> {
    let sid = session_id.trim();
    let limit = options.limit;
    let automation = options.automation_id.as_deref();
    // A bound must be applied before the newest-first window: bounded reads
    // read the whole session's index rows.
    let cutoff = match options.through_occurrence {
        Some(n) => Some(occurrence_cutoff(port, sid, automation, n)?),
        None => None,
    };
    let bounded = options.through_occurrence.is_some() || options.until_ms.is_some();
    let mut rows = index(
        port,
        RunIndexQuery {
            session_id: Some(sid.to_string()),
            root_only: true,
            limit: Some(if bounded {
                ALL
            } else {
                limit.min(ALL).saturating_mul(5).max(1000)
            }),
            ..RunIndexQuery::default()
        },
    )?;
    if let (Some(a), true) = (automation, options.include_occurrences) {
        rows.extend(index(
            port,
            RunIndexQuery {
                automation_id: Some(vec![a.to_string()]),
                role: Some(vec!["occurrence".into()]),
                limit: Some(ALL),
                ..RunIndexQuery::default()
            },
        )?);
    }
    let roots = crate::AutomationIndex.turn_roots();
    let mut by_id: HashMap<String, RunIndexRow> = HashMap::new();
    type Key = (i64, String, String);
    let mut newest_attempt: HashMap<(Option<String>, Option<i64>), (Key, String)> = HashMap::new();
    for row in rows {
        let rid = row.run_id.trim().to_string();
        if rid.is_empty() || by_id.contains_key(&rid) {
            continue;
        }
        let occurrence = row.role.as_deref() == Some("occurrence");
        let in_session = row.session_id.as_deref().map(str::trim) == Some(sid);
        let of_automation =
            occurrence && automation.is_some() && row.automation_id.as_deref() == automation;
        if !(in_session || of_automation)
            || !row.is_turn_root(&roots)
            || is_internal_workflow_id(&row.workflow_id)
            || is_legacy_scheduled(&row)
        {
            continue;
        }
        if occurrence {
            if !genuine_occurrence(&row) {
                continue;
            }
            if !options.include_occurrences
                || automation.is_some_and(|a| row.automation_id.as_deref() != Some(a))
            {
                continue;
            }
            // One turn per occurrence: its newest attempt.
            let key = (row.automation_id.clone(), row.occurrence_index);
            let order = order_key(&row);
            if let Some((prior_order, prior_id)) = newest_attempt.get(&key) {
                if *prior_order >= order {
                    continue;
                }
                by_id.remove(prior_id.trim());
            }
            newest_attempt.insert(key, (order, row.run_id.clone()));
        }
        by_id.insert(rid, row);
    }
    let mut selected: Vec<RunIndexRow> = by_id.into_values().collect();
    selected.sort_by_cached_key(order_key);
    if let (Some(cut), Some(n)) = (&cutoff, options.through_occurrence) {
        selected.retain(|r| {
            order_key(r) <= *cut
                && !(r.role.as_deref() == Some("occurrence")
                    && r.occurrence_index.is_some_and(|i| i > n))
        });
    }
    if let Some(until) = options.until_ms {
        selected.retain(|r| {
            iso_ms(&r.created_at)
                .or_else(|| iso_ms(&r.updated_at))
                .is_none_or(|ms| ms <= until)
        });
    }
    Ok(selected)
}

/// The ids of the newest `options.limit` turns among `rows` (oldest
/// first): only the newest window of rows is loaded (into `cache`, so a
/// longer read later loads each run once); when any of them is chat-like,
/// the others are left out.
fn newest_turns(
    port: &dyn RunPort,
    rows: &[RunIndexRow],
    options: &TurnsOptions,
    cache: &mut Loads,
) -> Result<Vec<String>> {
    let limit = options.limit;
    let window = limit.saturating_mul(3).max(limit.saturating_add(8));
    let start = rows.len().saturating_sub(window);
    let mut loaded: Vec<(&str, bool)> = Vec::new();
    for row in &rows[start..] {
        if !cache.contains_key(&row.run_id) {
            let entry = match port.get_run(&row.run_id) {
                Ok(run) if !options.include_drafts && is_draft(&run) => None,
                Ok(run) => Some(Loaded {
                    chat_like: chat_like(&run, row),
                    run,
                }),
                Err(Error::RunNotFound { .. }) => None,
                Err(e) => return Err(e),
            };
            cache.insert(row.run_id.clone(), entry);
        }
        if let Some(Some(l)) = cache.get(&row.run_id) {
            loaded.push((row.run_id.as_str(), l.chat_like));
        }
    }
    if loaded.iter().any(|(_, chat)| *chat) {
        loaded.retain(|(_, chat)| *chat);
    }
    let skip = loaded.len().saturating_sub(limit);
    Ok(loaded
        .into_iter()
        .skip(skip)
        .map(|(id, _)| id.to_string())
        .collect())
}

/// Splits a leading `<runtime_metadata>...</runtime_metadata>` envelope off
/// `text` (case-insensitive): the text after it, stripped.
fn strip_runtime_metadata(text: &str) -> String {
    let raw = text.trim();
    let lower = raw.to_ascii_lowercase();
    const OPEN: &str = "<runtime_metadata>";
    const CLOSE: &str = "</runtime_metadata>";
    if lower.starts_with(OPEN) {
        if let Some(end) = lower.find(CLOSE) {
            return raw[end + CLOSE.len()..].trim().to_string();
        }
    }
    raw.to_string()
}

fn nonblank(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.trim().is_empty())
}

/// A turn's prompt as people read it: `prompt`, `message` or `task` of its
/// vars, or `task` / `message` of `context`, else the latest user message
/// of `context.messages`, each without a runtime-metadata envelope.
pub fn turn_prompt(vars: &serde_json::Map<String, Value>) -> String {
    let ctx = vars.get("context").and_then(Value::as_object);
    let candidates = [
        vars.get("prompt"),
        vars.get("message"),
        vars.get("task"),
        ctx.and_then(|c| c.get("task")),
        ctx.and_then(|c| c.get("message")),
    ];
    if let Some(text) = candidates.into_iter().find_map(nonblank) {
        return strip_runtime_metadata(text);
    }
    ctx.and_then(|c| c.get("messages"))
        .and_then(Value::as_array)
        .and_then(|messages| {
            messages.iter().rev().find_map(|m| {
                (m.get("role").and_then(Value::as_str).map(str::trim) == Some("user"))
                    .then(|| nonblank(m.get("content")))
                    .flatten()
            })
        })
        .map(strip_runtime_metadata)
        .unwrap_or_default()
}

/// The turn's user message exactly as it was sent (with its envelope), when
/// a transcript of the run holds one whose stripped text is `display`;
/// empty when the display form already is the exact text.
fn prompt_verbatim(run: &RunState, display: &str) -> String {
    let wanted = display.trim();
    if wanted.is_empty() {
        return String::new();
    }
    let mut lanes: Vec<&Vec<Value>> = Vec::new();
    if let Some(m) = run
        .vars
        .get("context")
        .and_then(|c| c.get("messages"))
        .and_then(Value::as_array)
    {
        lanes.push(m);
    }
    if let Some(out) = run.output.as_ref().and_then(Value::as_object) {
        if let Some(m) = out
            .get("scratchpad")
            .and_then(|s| s.get("messages"))
            .and_then(Value::as_array)
        {
            lanes.push(m);
        }
        if let Some(m) = out.get("messages").and_then(Value::as_array) {
            lanes.push(m);
        }
    }
    for lane in lanes {
        for m in lane.iter().rev() {
            if m.get("role").and_then(Value::as_str).map(str::trim) != Some("user") {
                continue;
            }
            let Some(content) = nonblank(m.get("content")) else {
                continue;
            };
            if strip_runtime_metadata(content).trim() != wanted {
                continue;
            }
            return if content.trim() != wanted {
                content.to_string()
            } else {
                String::new()
            };
        }
    }
    String::new()
}

/// A turn's answer: the first non-blank `response`, `answer`, `message`,
/// `text` or `content` of its output, else of its output's `result` (or
/// `output`) object; stripped.
pub fn turn_answer(output: Option<&Value>) -> String {
    let Some(out) = output.and_then(Value::as_object) else {
        return String::new();
    };
    const KEYS: [&str; 5] = ["response", "answer", "message", "text", "content"];
    let nested = out
        .get("result")
        .filter(|v| v.is_object())
        .or_else(|| out.get("output").filter(|v| v.is_object()));
    KEYS.iter()
        .map(|k| out.get(*k))
        .chain(KEYS.iter().map(|k| nested.and_then(|n| n.get(*k))))
        .find_map(nonblank)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// One turn of a session as the history reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The turn's run.
    pub run_id: String,
    /// Its workflow.
    pub workflow_id: String,
    /// Its status.
    pub status: RunStatus,
    /// When it was created.
    pub created_at: String,
    /// When it was last saved.
    pub updated_at: String,
    /// Its prompt as people read it ([`turn_prompt`]).
    pub prompt: String,
    /// Its prompt as it was sent, when that differs.
    pub prompt_verbatim: String,
    /// Its answer ([`turn_answer`]).
    pub answer: String,
    /// The automation and occurrence, for an occurrence.
    pub occurrence: Option<(String, i64)>,
}

impl Turn {
    /// The turn of `run`.
    pub fn of(run: &RunState) -> Turn {
        let prompt = turn_prompt(&run.vars);
        let occurrence = run
            .vars
            .get("_meta")
            .and_then(|m| m.get("occurrence"))
            .filter(|o| o.get("role").and_then(Value::as_str) == Some("occurrence"))
            .map(|o| {
                (
                    o["automation_id"].as_str().unwrap_or_default().to_string(),
                    o["occurrence_index"].as_i64().unwrap_or(0),
                )
            });
        Turn {
            run_id: run.run_id.clone(),
            workflow_id: run.workflow_id.clone(),
            status: run.status,
            created_at: run.created_at.clone(),
            updated_at: run.updated_at.clone(),
            prompt_verbatim: prompt_verbatim(run, &prompt),
            prompt,
            answer: turn_answer(run.output.as_ref()),
            occurrence,
        }
    }

    /// The turn as JSON (what `stepwell sessions turns --json` prints).
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "run_id": self.run_id,
            "workflow_id": self.workflow_id,
            "status": self.status.as_str(),
            "created_at": self.created_at,
            "prompt": (!self.prompt.is_empty()).then_some(&self.prompt),
            "answer": (!self.answer.is_empty()).then_some(&self.answer),
        });
        if let Some((a, i)) = &self.occurrence {
            v["automation_id"] = json!(a);
            v["occurrence_index"] = json!(i);
        }
        v
    }

    /// The turn as a `[user, assistant]` pair, when it completed with a
    /// prompt and an answer (the prompt as it was sent).
    fn pair(&self) -> Option<Vec<Value>> {
        if self.status != RunStatus::Completed {
            return None;
        }
        let (prompt, answer) = (self.prompt.trim(), self.answer.trim());
        if prompt.is_empty() || answer.is_empty() {
            return None;
        }
        let verbatim = self.prompt_verbatim.trim();
        let prompt = if verbatim.is_empty() {
            prompt
        } else {
            verbatim
        };
        let ts = [&self.created_at, &self.updated_at]
            .into_iter()
            .map(|t| t.trim())
            .find(|t| !t.is_empty());
        let mut meta = json!({"kind": SESSION_TURN_KIND, "run_id": self.run_id});
        if let Some(ts) = ts {
            meta["ts"] = json!(ts);
        }
        Some(vec![
            json!({"role": "user", "content": prompt, "metadata": meta}),
            json!({"role": "assistant", "content": answer, "metadata": meta}),
        ])
    }
}

/// Options of [`session_chat_messages`].
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    /// The window's budget in estimated tokens (default 50,000).
    pub max_tokens: u64,
    /// Only turns created at or before this instant (epoch milliseconds).
    pub until_ms: Option<i64>,
    /// Runs left out (the run being prepared, for example).
    pub exclude_run_ids: BTreeSet<String>,
    /// See [`TurnsOptions::automation_id`].
    pub automation_id: Option<String>,
    /// See [`TurnsOptions::through_occurrence`].
    pub through_occurrence: Option<i64>,
    /// Refuse (`history_unavailable`) instead of degrading: a missing
    /// occurrence, or a discussion whose root or seed is missing or
    /// malformed. Automation admissions and discussions read strictly.
    pub strict: bool,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        HistoryOptions {
            max_tokens: HISTORY_REPLAY_MAX_TOKENS,
            until_ms: None,
            exclude_run_ids: BTreeSet::new(),
            automation_id: None,
            through_occurrence: None,
            strict: false,
        }
    }
}

/// A session's history: chat messages, oldest first, and the window's
/// report.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayedHistory {
    /// `user` / `assistant` messages in whole pairs, each with metadata
    /// `{kind: "session_turn", run_id, ts}` (a discussion's seed keeps its
    /// own metadata, with `discussion_seed: true`).
    pub messages: Vec<Value>,
    /// What the window kept and dropped.
    pub report: WindowReport,
}

fn history_error(message: impl Into<String>) -> Error {
    error("history_unavailable", None, message)
}

/// `session_id`'s prior conversation as chat messages (see the module's
/// docs): its completed turns with a prompt and an answer as whole
/// `[user, assistant]` pairs, a discussion's seed first, folded into the
/// most recent `max_tokens` of whole turns. When older turns were dropped,
/// the oldest kept message starts with the `[#TRUNCATION: ...]` notice and
/// its metadata says `replay_truncated: true` with the window's report.
///
/// Turns are read newest first in doubling batches, and the read stops as
/// soon as the window is full.
pub fn session_chat_messages(
    port: &dyn RunPort,
    session_id: &str,
    options: &HistoryOptions,
) -> Result<ReplayedHistory> {
    let budget = options.max_tokens;
    if budget == 0 {
        return Err(error(
            "invalid_request",
            Some("max_tokens"),
            "history window max_tokens must be a positive int, got 0",
        ));
    }
    let sid = session_id.trim();
    if sid.is_empty() {
        return Ok(ReplayedHistory {
            messages: Vec::new(),
            report: WindowReport::empty(budget),
        });
    }
    let seed = seed_pairs(
        discussion_seed_messages(port, sid, options.strict)?,
        options.strict,
    )?;
    let mut fetch = FIRST_TURN_FETCH;
    let mut cache = Loads::default();
    // Each turn's pair and its size, built once however often the read
    // grows.
    let mut pairs_of: HashMap<String, Option<SizedPair>> = HashMap::new();
    let seed_sizes: Vec<(u64, u64)> = seed.iter().map(|p| pair_size(p)).collect();
    let mut rows: Option<(usize, Vec<RunIndexRow>)> = None;
    let (kept, report) = loop {
        let turns_options = TurnsOptions {
            include_occurrences: true,
            until_ms: options.until_ms,
            automation_id: options.automation_id.clone(),
            through_occurrence: options.through_occurrence,
            include_drafts: false,
            limit: fetch,
        };
        // The index is read again only when a longer read reads more of it.
        let index_limit = fetch.saturating_mul(5).max(1000);
        if rows.as_ref().is_none_or(|(read, _)| *read < index_limit) {
            match turn_rows(port, sid, &turns_options) {
                Ok(r) => rows = Some((index_limit, r)),
                Err(e)
                    if e.extension::<AutomationError>()
                        .is_some_and(|a| a.reason_code == "occurrence_not_found") =>
                {
                    if options.strict {
                        let message = e.extension::<AutomationError>().map(|a| a.message.clone());
                        return Err(history_error(message.unwrap_or_default()));
                    }
                    return Ok(ReplayedHistory {
                        messages: Vec::new(),
                        report: WindowReport::empty(budget),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        let all_rows = rows.as_ref().map(|(_, r)| r.as_slice()).unwrap_or_default();
        let turns = newest_turns(port, all_rows, &turns_options, &mut cache)?;
        let older_unread = turns.len() >= fetch;
        // Which pairs (seed or turn), oldest first, and their sizes.
        let mut order: Vec<Result<usize, &String>> = Vec::new();
        let mut sizes: Vec<(u64, u64)> = Vec::new();
        if !older_unread {
            order.extend((0..seed.len()).map(Ok));
            sizes.extend(seed_sizes.iter().copied());
        }
        for id in &turns {
            if options.exclude_run_ids.contains(id.trim()) {
                continue;
            }
            if !pairs_of.contains_key(id) {
                let pair = cache
                    .get(id)
                    .and_then(Option::as_ref)
                    .and_then(|l| Turn::of(&l.run).pair())
                    .map(|p| {
                        let size = pair_size(&p);
                        (p, size)
                    });
                pairs_of.insert(id.clone(), pair);
            }
        }
        for id in &turns {
            if options.exclude_run_ids.contains(id.trim()) {
                continue;
            }
            if let Some(Some((_, size))) = pairs_of.get(id) {
                order.push(Err(id));
                sizes.push(*size);
            }
        }
        let (start, report) = fold_sizes(&sizes, budget, older_unread).map_err(history_error)?;
        if !older_unread || start > 0 {
            // The kept pairs, moved out (the read is over).
            let ids: Vec<Result<usize, String>> = order[start..]
                .iter()
                .map(|o| o.map_err(|id| id.clone()))
                .collect();
            let kept: Vec<Vec<Value>> = ids
                .into_iter()
                .filter_map(|o| match o {
                    Ok(i) => Some(seed[i].clone()),
                    Err(id) => pairs_of.remove(&id).flatten().map(|(p, _)| p),
                })
                .collect();
            break (kept, report);
        }
        fetch *= 2;
    };
    let mut messages: Vec<Value> = kept.into_iter().flatten().collect();
    announce_dropped(&mut messages, &report, true);
    Ok(ReplayedHistory { messages, report })
}

/// The root of a discussion session and its `_meta.discussion`, validated:
/// every discussion run of the session names the same root, which is a
/// run of this session without a parent, carrying `seed_messages`.
/// Anything else is refused (`session_attribution_failed`): a planted or
/// foreign root is never followed. `None` when the session holds no
/// discussion run.
pub fn discussion_root(port: &dyn RunPort, session_id: &str) -> Result<Option<RunState>> {
    let sid = session_id.trim();
    let rows = index(
        port,
        RunIndexQuery {
            session_id: Some(sid.to_string()),
            role: Some(vec!["discussion".into()]),
            limit: Some(ALL),
            ..RunIndexQuery::default()
        },
    )?;
    if rows.is_empty() {
        return Ok(None);
    }
    let fail = |m: String| {
        error(
            "session_attribution_failed",
            None,
            format!("discussion session {sid}: {m}"),
        )
    };
    let mut members: HashMap<String, RunState> = HashMap::new();
    let mut roots: BTreeSet<String> = BTreeSet::new();
    for row in rows {
        let run = port.get_run(&row.run_id)?;
        let root = run
            .vars
            .get("_meta")
            .and_then(|m| m.get("discussion"))
            .and_then(|d| d.get("discussion_root_run_id"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| fail(format!("run {} has no discussion_root_run_id", row.run_id)))?;
        roots.insert(root);
        members.insert(row.run_id.clone(), run);
    }
    if roots.len() != 1 {
        // Python's repr of the sorted list, as the reference says it.
        let shown: Vec<String> = roots
            .iter()
            .map(|r| {
                let mut out = String::new();
                stepwell_automation_core::outcome::py_repr_str(r, &mut out);
                out
            })
            .collect();
        return Err(fail(format!(
            "members disagree on the discussion root ([{}])",
            shown.join(", ")
        )));
    }
    let root_id = roots.into_iter().next().unwrap_or_default();
    let root = members
        .remove(&root_id)
        .ok_or_else(|| fail(format!("root run {root_id} is not a run of this session")))?;
    let valid = root
        .parent_run_id
        .as_deref()
        .is_none_or(|p| p.trim().is_empty())
        && root.session_id.as_deref().map(str::trim) == Some(sid)
        && root
            .vars
            .get("_meta")
            .and_then(|m| m.get("discussion"))
            .is_some_and(|d| d.get("seed_messages").is_some());
    if !valid {
        return Err(fail(format!("{root_id} is not a valid discussion root")));
    }
    Ok(Some(root))
}

/// The seed messages of a discussion session (none for any other
/// session). A missing, malformed or unresolvable seed is refused
/// (`history_unavailable`) when `strict`, else gives none.
pub fn discussion_seed_messages(
    port: &dyn RunPort,
    session_id: &str,
    strict: bool,
) -> Result<Vec<Value>> {
    let sid = session_id.trim();
    let fail = |m: String| -> Result<Vec<Value>> {
        if strict {
            Err(history_error(format!("discussion session {sid}: {m}")))
        } else {
            Ok(Vec::new())
        }
    };
    let root = match discussion_root(port, sid) {
        Ok(Some(root)) => root,
        Ok(None) => return Ok(Vec::new()),
        Err(e) => match e.extension::<AutomationError>() {
            Some(a) => return fail(a.message.clone()),
            None => return Err(e),
        },
    };
    let seed = &root.vars["_meta"]["discussion"]["seed_messages"];
    let well_formed = seed.as_array().is_some_and(|s| {
        s.iter().all(|m| {
            matches!(
                m.get("role").and_then(Value::as_str),
                Some("user" | "assistant")
            ) && m.get("content").is_some_and(Value::is_string)
        })
    });
    if !well_formed {
        return fail(format!("seed_messages of {} are malformed", root.run_id));
    }
    Ok(seed.as_array().cloned().unwrap_or_default())
}

/// A `[user, assistant]` pair and its `(messages, estimated tokens)`.
type SizedPair = (Vec<Value>, (u64, u64));

/// A pair's `(messages, estimated tokens)`.
fn pair_size(pair: &[Value]) -> (u64, u64) {
    (pair.len() as u64, pair.iter().map(message_tokens).sum())
}

/// Seed messages as whole `[user, assistant]` pairs, each message's
/// metadata marked `discussion_seed: true`.
fn seed_pairs(seed: Vec<Value>, strict: bool) -> Result<Vec<Vec<Value>>> {
    let mut pairs = Vec::new();
    for chunk in seed.chunks(2) {
        let [user, assistant] = chunk else {
            if strict {
                return Err(history_error(
                    "discussion seed_messages end with an unpaired message",
                ));
            }
            continue;
        };
        if user["role"] != "user" || assistant["role"] != "assistant" {
            if strict {
                return Err(history_error(
                    "discussion seed_messages are not user/assistant pairs",
                ));
            }
            continue;
        }
        let pair = [user, assistant]
            .into_iter()
            .map(|m| {
                let mut meta = m
                    .get("metadata")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                meta.insert("discussion_seed".into(), json!(true));
                json!({"role": m["role"], "content": m["content"], "metadata": meta})
            })
            .collect();
        pairs.push(pair);
    }
    Ok(pairs)
}

/// The workspace keys a later turn of a discussion takes from its root's
/// frozen scope.
const ANCHORED_SCOPE_KEYS: [&str; 7] = [
    "workspace_root",
    "workspace_access_mode",
    "workspace_allowed_paths",
    "workspace_builtin_allow",
    "workspace_read_only",
    "workspace_ignored_paths",
    "workspace_builtin_deny_prefixes",
];

/// Anchors a root run started in a discussion session to the discussion's
/// validated root: the run gets the root's `_meta.discussion` (without the
/// seed) and the root's workspace policy as the root's frozen scope holds
/// it (`workspace_root`, `workspace_access_mode`, `workspace_allowed_paths`,
/// its exact `workspace_builtin_allow`, `workspace_read_only` when the root
/// has it) and its read-only mounts, over whatever the caller passed. The
/// caller may add mounts or ask for read-only, never widen: writable
/// exceptions and an inherited scope are dropped (a root run inherits
/// none). The discussion's root itself (its session is
/// `discussion-session:<its id>`) and other sessions are left as they are.
/// A session whose root does not validate refuses the start
/// (`session_attribution_failed`).
pub fn anchor_discussion(
    port: &dyn RunPort,
    session_id: &str,
    run_id: Option<&str>,
    vars: &mut serde_json::Map<String, Value>,
    runtime: &mut serde_json::Map<String, Value>,
) -> Result<()> {
    if run_id.is_some_and(|id| session_id == format!("discussion-session:{id}")) {
        return Ok(());
    }
    let Some(root) = discussion_root(port, session_id)? else {
        return Ok(());
    };
    if run_id == Some(root.run_id.as_str()) {
        return Ok(());
    }
    let root_runtime = root.vars.get("_runtime").and_then(Value::as_object);
    let scope = root_runtime
        .and_then(|r| r.get("workspace"))
        .and_then(Value::as_object);
    let Some(scope) = scope.filter(|s| {
        s.get("workspace_root")
            .and_then(Value::as_str)
            .is_some_and(|w| !w.trim().is_empty())
    }) else {
        return Err(error(
            "session_attribution_failed",
            None,
            format!(
                "discussion session {session_id}: root {} has no workspace_root",
                root.run_id
            ),
        ));
    };
    let mut discussion = root.vars["_meta"]["discussion"].clone();
    if let Some(d) = discussion.as_object_mut() {
        d.remove("seed_messages");
    }
    let mut meta = vars
        .get("_meta")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    meta.insert("discussion".into(), discussion);
    vars.insert("_meta".into(), Value::Object(meta));
    for key in ANCHORED_SCOPE_KEYS {
        match scope.get(key) {
            Some(v) => {
                vars.insert(key.into(), v.clone());
            }
            // The root's exact allow list, also when it has none.
            None if key == "workspace_builtin_allow" => {
                vars.remove(key);
            }
            None => {}
        }
    }
    vars.remove("workspace_writable_paths");
    runtime.remove("workspace_writable_paths");
    runtime.remove("workspace");
    let mut mounts: Vec<Value> = root_runtime
        .and_then(|r| r.get("workspace_read_only_paths"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for m in runtime
        .get("workspace_read_only_paths")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if !mounts.contains(m) {
            mounts.push(m.clone());
        }
    }
    runtime.insert("workspace_read_only_paths".into(), json!(mounts));
    if root_runtime.and_then(|r| r.get("workspace_read_only")) == Some(&Value::Bool(true)) {
        runtime.insert("workspace_read_only".into(), json!(true));
    }
    Ok(())
}

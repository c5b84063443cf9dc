//! The history window: which earlier messages of a conversation are sent to
//! a model again (llm-tools spec 4.3 and 4.5).
//!
//! One rule for every replay: session replay, an automation's growing
//! context, a discussion's seed and the agent flow's own transcript. The
//! window keeps the most recent **whole turns** whose estimated tokens fit
//! [`HISTORY_REPLAY_MAX_TOKENS`] (or the caller's budget), newest first,
//! and stops at the first turn that does not fit, so the kept history has
//! no hole. A total of exactly the budget fits. No message is ever cut: when
//! the newest turn alone is over the budget it is kept whole and alone
//! (`oversize_turn_kept`). When older turns were dropped, the oldest kept
//! message says so in a `[#TRUNCATION: ...]` notice, and the window's
//! receipt is a [`WindowReport`].
//!
//! Tokens are estimated as the reference estimates them without a
//! tokenizer: a quarter of the characters (Unicode code points), at least
//! 1 for non-empty text ([`estimate_tokens`]); a message is estimated as
//! `"<role>: <content>"`, media parts at a flat [`MEDIA_PART_TOKEN_ESTIMATE`]
//! ([`message_tokens`]).
//!
//! The behaviour and the texts are the reference implementation's
//! (abstractruntime 0.13.0, `session_history.py` and
//! `memory/token_budget.py`).
//!
//! ```
//! use serde_json::json;
//! use stepwell_automation_core::history::window_transcript;
//!
//! let messages = vec![
//!     json!({"role": "user", "content": "x".repeat(400)}),
//!     json!({"role": "assistant", "content": "old answer"}),
//!     json!({"role": "user", "content": "What next?"}),
//! ];
//! let (kept, report) = window_transcript(&messages, 10, 2).unwrap();
//! assert_eq!(kept.len(), 1);
//! assert_eq!(report.dropped_messages, 2);
//! assert!(kept[0]["content"].as_str().unwrap().starts_with("[#TRUNCATION: 2 earlier message(s)"));
//! ```

use serde_json::{json, Map, Value};

use crate::definition::py_strip;
use crate::ids::canonical_json;
use crate::outcome::{py_str, truthy};

/// The default window: the most recent 50,000 estimated tokens of whole
/// turns (the reference's `HISTORY_REPLAY_MAX_TOKENS`).
pub const HISTORY_REPLAY_MAX_TOKENS: u64 = 50_000;

/// The flat estimate for one media part of a message (an image, audio, a
/// file), whatever the size of its data.
pub const MEDIA_PART_TOKEN_ESTIMATE: u64 = 512;

/// The content-part types counted at [`MEDIA_PART_TOKEN_ESTIMATE`]; every
/// other part is counted by its text.
pub const MEDIA_PART_TYPES: [&str; 6] = [
    "image_url",
    "image",
    "input_image",
    "input_audio",
    "audio",
    "file",
];

/// The window's policy, as its report names it.
pub const HISTORY_WINDOW_POLICY: &str = "most_recent_whole_turns";

/// The estimator, as the window's report names it (the reference's name of
/// its message estimator, whose fallback stepwell implements).
pub const TOKEN_ESTIMATOR: &str = "abstractruntime.memory.token_budget.estimate_message_tokens";

/// The estimated tokens of `text`: a quarter of its characters (Unicode
/// code points), rounded down, at least 1 for non-empty text; 0 for empty
/// text.
pub fn estimate_tokens(text: &str) -> u64 {
    let chars = text.chars().count() as u64;
    if chars == 0 {
        0
    } else {
        (chars / 4).max(1)
    }
}

/// The estimated tokens of a chat message: [`estimate_tokens`] of
/// `"<role>: <content>"` (the content alone when the role is missing or
/// blank). A content-part list counts the text of its text parts (a part
/// with a string `text` whose `type` contains `text`, or is missing) and of
/// plain string parts, joined with newlines; [`MEDIA_PART_TOKEN_ESTIMATE`]
/// per media part ([`MEDIA_PART_TYPES`]); a `text` part without a string
/// text counts nothing; any other part counts as its JSON text. Content
/// that is neither text nor a list counts as Python's `str()` of it. Only
/// `role` and `content` count (not `tool_calls`, not `metadata`); anything
/// but an object is 0.
pub fn message_tokens(message: &Value) -> u64 {
    let Some(m) = message.as_object() else {
        return 0;
    };
    let role = match m.get("role") {
        Some(v) if truthy(Some(v)) => py_strip(&py_str(v)).to_string(),
        _ => String::new(),
    };
    let mut media = 0u64;
    let content = match m.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::Array(parts)) => {
            let mut texts: Vec<String> = Vec::new();
            for part in parts {
                match part {
                    Value::String(s) => texts.push(s.clone()),
                    Value::Object(p) => {
                        let kind_text = p.get("type").filter(|v| truthy(Some(v))).map(py_str);
                        let text = p.get("text").and_then(Value::as_str);
                        match text {
                            Some(t) if kind_text.as_deref().unwrap_or("text").contains("text") => {
                                texts.push(t.to_string())
                            }
                            _ if kind_text
                                .as_deref()
                                .is_some_and(|k| MEDIA_PART_TYPES.contains(&k)) =>
                            {
                                media += 1
                            }
                            _ if p.get("type").and_then(Value::as_str) == Some("text") => {}
                            _ => texts.push(py_json_dumps(part)),
                        }
                    }
                    other => texts.push(py_json_dumps(other)),
                }
            }
            texts.join("\n")
        }
        Some(other) => py_str(other),
    };
    let text = if role.is_empty() {
        content
    } else {
        format!("{role}: {content}")
    };
    estimate_tokens(&text) + media * MEDIA_PART_TOKEN_ESTIMATE
}

/// The window's receipt, recorded by hosts in the run
/// (`vars._runtime.session_history`). [`WindowReport::to_json`] gives the
/// reference's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowReport {
    /// Always [`HISTORY_WINDOW_POLICY`].
    pub policy: String,
    /// The budget, in estimated tokens.
    pub max_tokens: u64,
    /// Always [`TOKEN_ESTIMATOR`].
    pub token_estimator: String,
    /// How many messages were kept.
    pub replayed_messages: u64,
    /// Their estimated tokens (over `max_tokens` only with
    /// `oversize_turn_kept`).
    pub replayed_tokens: u64,
    /// How many older messages were dropped.
    pub dropped_messages: u64,
    /// Their estimated tokens.
    pub dropped_tokens: u64,
    /// False when the caller stopped reading before the conversation's
    /// beginning and something was dropped: the dropped counts are then a
    /// lower bound.
    pub dropped_counts_complete: bool,
    /// True when the newest turn alone was over the budget and was kept
    /// whole, alone.
    pub oversize_turn_kept: bool,
}

impl WindowReport {
    /// The report of a window that kept and dropped nothing.
    pub fn empty(max_tokens: u64) -> Self {
        WindowReport {
            policy: HISTORY_WINDOW_POLICY.to_string(),
            max_tokens,
            token_estimator: TOKEN_ESTIMATOR.to_string(),
            replayed_messages: 0,
            replayed_tokens: 0,
            dropped_messages: 0,
            dropped_tokens: 0,
            dropped_counts_complete: true,
            oversize_turn_kept: false,
        }
    }

    /// The report as the reference writes it: `{policy, max_tokens,
    /// token_estimator, replayed_messages, replayed_tokens,
    /// dropped_messages, dropped_tokens, dropped_counts_complete,
    /// oversize_turn_kept}`.
    pub fn to_json(&self) -> Value {
        json!({
            "policy": self.policy,
            "max_tokens": self.max_tokens,
            "token_estimator": self.token_estimator,
            "replayed_messages": self.replayed_messages,
            "replayed_tokens": self.replayed_tokens,
            "dropped_messages": self.dropped_messages,
            "dropped_tokens": self.dropped_tokens,
            "dropped_counts_complete": self.dropped_counts_complete,
            "oversize_turn_kept": self.oversize_turn_kept,
        })
    }
}

/// The reference's refusal of a budget that is not a positive whole number.
fn validated(max_tokens: u64) -> Result<u64, String> {
    if max_tokens == 0 {
        return Err(format!(
            "history window max_tokens must be a positive int, got {max_tokens}"
        ));
    }
    Ok(max_tokens)
}

/// The fold itself: the newest whole `turns` (oldest first, each a list of
/// whole messages) that fit `max_tokens`, oldest first, and the report.
/// Nothing is announced in the messages (see [`window_turns`]).
///
/// `older_unread` says the caller stopped reading before the
/// conversation's beginning: when something was dropped the report then
/// says `dropped_counts_complete: false`. A `max_tokens` of 0 is refused
/// with the reference's text (`history window max_tokens must be a
/// positive int, got 0`).
pub fn fold_history_window(
    turns: &[Vec<Value>],
    max_tokens: u64,
    older_unread: bool,
) -> Result<(Vec<Vec<Value>>, WindowReport), String> {
    let sized: Vec<(u64, u64)> = turns
        .iter()
        .map(|turn| {
            (
                turn.len() as u64,
                turn.iter().map(message_tokens).sum::<u64>(),
            )
        })
        .collect();
    let (start, report) = fold_sizes(&sized, max_tokens, older_unread)?;
    Ok((turns[start..].to_vec(), report))
}

/// The fold over turns known only by size: `(messages, estimated tokens)`
/// of each turn, oldest first. Returns the index of the oldest kept turn
/// (every turn from it on is kept) and the report: the same decision as
/// [`fold_history_window`], for a caller that keeps the sizes of the turns
/// it has read and does not want to copy them to fold again.
pub fn fold_sizes(
    turns: &[(u64, u64)],
    max_tokens: u64,
    older_unread: bool,
) -> Result<(usize, WindowReport), String> {
    let budget = validated(max_tokens)?;
    let mut kept_tokens = 0u64;
    let mut oversize = false;
    let mut stop = turns.len();
    for i in (0..turns.len()).rev() {
        let tokens = turns[i].1;
        if kept_tokens + tokens > budget {
            if stop == turns.len() {
                // The newest turn alone is over the window: kept whole, alone.
                oversize = true;
                kept_tokens += tokens;
                stop = i;
            }
            break;
        }
        kept_tokens += tokens;
        stop = i;
    }
    let (dropped, kept) = turns.split_at(stop);
    let report = WindowReport {
        replayed_messages: kept.iter().map(|t| t.0).sum(),
        replayed_tokens: kept_tokens,
        dropped_messages: dropped.iter().map(|t| t.0).sum(),
        dropped_tokens: dropped.iter().map(|t| t.1).sum(),
        dropped_counts_complete: !older_unread || dropped.is_empty(),
        oversize_turn_kept: oversize,
        ..WindowReport::empty(budget)
    };
    Ok((stop, report))
}

/// The labeled drop notice of `report`:
/// `[#TRUNCATION: <n> earlier message(s) of this session (~<t> tokens)[ (and
/// older turns not counted)] were dropped from replay by the history window
/// (the most recent <max> tokens, whole turns;
/// abstractruntime.session_history); this history starts mid-conversation]`.
pub fn truncation_notice(report: &WindowReport) -> String {
    let more = if report.dropped_counts_complete {
        ""
    } else {
        " (and older turns not counted)"
    };
    format!(
        "[#TRUNCATION: {} earlier message(s) of this session (~{} tokens){more} were dropped \
         from replay by the history window (the most recent {} tokens, whole turns; \
         abstractruntime.session_history); this history starts mid-conversation]",
        report.dropped_messages, report.dropped_tokens, report.max_tokens
    )
}

/// Writes the drop notice of `report` into the oldest kept message
/// (`messages[0]`), in place; nothing when the report dropped nothing.
///
/// - Text content (or none): the notice is a line of its own in front of
///   it, after the message's own leading `<runtime_metadata>...</runtime_metadata>`
///   envelope when it has one.
/// - A content-part list: the notice is one `{"type": "text"}` part, first;
///   with an envelope heading the first text part, that part is split
///   into the envelope, the notice part, and the rest of its text (when
///   any), every other part kept as it is.
/// - Any other content is left as it is.
///
/// With `stamp_metadata` the message's `metadata` (an object, kept) also
/// gets `replay_truncated: true` and `history_window: <report>`.
pub fn announce_dropped(messages: &mut [Value], report: &WindowReport, stamp_metadata: bool) {
    if report.dropped_messages == 0 {
        return;
    }
    let Some(head) = messages.first_mut().and_then(Value::as_object_mut) else {
        return;
    };
    if stamp_metadata {
        let mut meta = match head.get("metadata") {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        meta.insert("replay_truncated".into(), Value::Bool(true));
        meta.insert("history_window".into(), report.to_json());
        head.insert("metadata".into(), Value::Object(meta));
    }
    let notice = truncation_notice(report);
    let content = match head.get("content") {
        Some(Value::Array(parts)) => Value::Array(notice_into_parts(parts, &notice)),
        None | Some(Value::Null) => Value::String(format!("{notice}\n")),
        Some(Value::String(text)) => Value::String(match head_envelope(text) {
            Some(envelope) => {
                let rest = &text[envelope.len()..];
                let sep = if envelope.ends_with('\n') { "" } else { "\n" };
                format!("{envelope}{sep}{notice}\n{}", rest.trim_start_matches('\n'))
            }
            None => format!("{notice}\n{text}"),
        }),
        // An unknown shape: rewriting it could corrupt it.
        Some(_) => return,
    };
    head.insert("content".into(), content);
}

/// The newest whole `turns` (oldest first) that fit `max_tokens`, as one
/// list of messages, oldest first, and the window's report.
///
/// The fold goes newest first and stops at the first turn that does not
/// fit; a total of exactly `max_tokens` fits; a newest turn over the budget
/// on its own is kept whole (`oversize_turn_kept`). When anything was
/// dropped, the oldest kept message carries the `#TRUNCATION` notice and
/// its metadata `replay_truncated: true`, `history_window: <report>`
/// ([`announce_dropped`]). A `max_tokens` of 0 is refused
/// ([`fold_history_window`]).
pub fn window_turns(
    turns: &[Vec<Value>],
    max_tokens: u64,
) -> Result<(Vec<Value>, WindowReport), String> {
    let (kept, report) = fold_history_window(turns, max_tokens, false)?;
    let mut out: Vec<Value> = kept.into_iter().flatten().collect();
    announce_dropped(&mut out, &report, true);
    Ok((out, report))
}

/// The history window over a transcript a flow holds (the agent's
/// messages, a conversation passed in as context).
///
/// The messages before `current_turn_start` are grouped into turns: a turn
/// starts at each `user` message, and the messages before the first user
/// message (a leading `system` message, for example) form a turn of their
/// own, the oldest, dropped first. Everything from `current_turn_start` on
/// is one turn, the newest, always kept whole however many user messages
/// it holds; `messages.len()` means there is none. Entries that are not
/// objects are left out. The kept messages are copies; the notice goes in
/// as [`announce_dropped`] writes it, without metadata (plain messages for
/// the model client). A `current_turn_start` past the end is refused
/// (`current_turn_start must be an index into the <n> messages, got <i>`),
/// before the budget is checked.
pub fn window_transcript(
    messages: &[Value],
    max_tokens: u64,
    current_turn_start: usize,
) -> Result<(Vec<Value>, WindowReport), String> {
    if current_turn_start > messages.len() {
        return Err(format!(
            "current_turn_start must be an index into the {} messages, got {current_turn_start}",
            messages.len()
        ));
    }
    let (older, current) = messages.split_at(current_turn_start);
    let mut turns: Vec<Vec<Value>> = Vec::new();
    for message in older.iter().filter(|m| m.is_object()) {
        if message.get("role").and_then(Value::as_str) == Some("user") || turns.is_empty() {
            turns.push(Vec::new());
        }
        if let Some(turn) = turns.last_mut() {
            turn.push(message.clone());
        }
    }
    let current_turn: Vec<Value> = current.iter().filter(|m| m.is_object()).cloned().collect();
    if !current_turn.is_empty() {
        turns.push(current_turn);
    }
    let (kept, report) = fold_history_window(&turns, max_tokens, false)?;
    let mut out: Vec<Value> = kept.into_iter().flatten().collect();
    announce_dropped(&mut out, &report, false);
    Ok((out, report))
}

// ---------------------------------------------------------------- helpers

/// Python's `json.dumps(value, ensure_ascii=False)`: separators `, ` and
/// `: `, non-ASCII kept, numbers as Python writes them.
fn py_json_dumps(value: &Value) -> String {
    match value {
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(py_json_dumps).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| {
                    format!(
                        "{}: {}",
                        canonical_json(&Value::String(k.clone())),
                        py_json_dumps(v)
                    )
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        scalar => canonical_json(scalar),
    }
}

/// Python's `str.isspace()` (what `\s` and `strip()` match).
fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn lstrip(s: &str) -> &str {
    s.trim_start_matches(is_space)
}

/// Python's `str.splitlines()`: the line boundaries of `str`, `\r\n` as
/// one, no empty last line after a final boundary.
fn splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(
            c,
            '\n' | '\r'
                | '\u{0b}'
                | '\u{0c}'
                | '\u{1c}'
                | '\u{1d}'
                | '\u{1e}'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        ) {
            lines.push(&s[start..i]);
            start = i + c.len_utf8();
            if c == '\r' && matches!(chars.peek(), Some((_, '\n'))) {
                chars.next();
                start += 1;
            }
        }
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

const ENVELOPE_OPEN: &str = "<runtime_metadata>";
const ENVELOPE_CLOSE: &str = "</runtime_metadata>";

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn find_ci(s: &str, needle: &str) -> Option<usize> {
    let (h, n) = (s.as_bytes(), needle.as_bytes());
    if h.len() < n.len() {
        return None;
    }
    (0..=h.len() - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Where the reference's envelope pattern
/// `^\s*<runtime_metadata>\s*.*?\s*</runtime_metadata>\s*` (case-insensitive,
/// across lines) ends in `text`, if it matches.
fn envelope_end(text: &str) -> Option<usize> {
    let start = text.len() - lstrip(text).len();
    if !starts_with_ci(&text[start..], ENVELOPE_OPEN) {
        return None;
    }
    let body = start + ENVELOPE_OPEN.len();
    let close = body + find_ci(&text[body..], ENVELOPE_CLOSE)?;
    let end = close + ENVELOPE_CLOSE.len();
    Some(text.len() - lstrip(&text[end..]).len())
}

/// A small matcher over the characters of a string.
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl Cursor<'_> {
    fn eat(&mut self, pred: impl Fn(char) -> bool) -> bool {
        match self.s[self.i..].chars().next() {
            Some(c) if pred(c) => {
                self.i += c.len_utf8();
                true
            }
            _ => false,
        }
    }

    fn eat_n(&mut self, n: usize, pred: impl Fn(char) -> bool) -> bool {
        (0..n).all(|_| self.eat(&pred))
    }

    fn eat_spaces(&mut self) -> usize {
        let mut n = 0;
        while self.eat(is_space) {
            n += 1;
        }
        n
    }

    fn eat_ci(&mut self, word: &str) -> bool {
        if starts_with_ci(&self.s[self.i..], word) {
            self.i += word.len();
            true
        } else {
            false
        }
    }

    fn at_end(&self) -> bool {
        self.i == self.s.len()
    }
}

fn digit(c: char) -> bool {
    c.is_ascii_digit()
}

/// Where a chat-template time header
/// `[YYYY-MM-DD HH:MM(:SS) CC]` (`-` or `/` between the date's parts,
/// followed by a whitespace or the end) ends at the start of `s`, if it is
/// one.
fn time_header_end(s: &str) -> Option<usize> {
    let mut c = Cursor { s, i: 0 };
    let date_sep = |x: char| x == '-' || x == '/';
    let ok = c.eat(|x| x == '[')
        && c.eat_n(4, digit)
        && c.eat(date_sep)
        && c.eat_n(2, digit)
        && c.eat(date_sep)
        && c.eat_n(2, digit)
        && c.eat_spaces() > 0
        && c.eat_n(2, digit)
        && c.eat(|x| x == ':')
        && c.eat_n(2, digit);
    if !ok {
        return None;
    }
    let before_seconds = c.i;
    if !(c.eat(|x| x == ':') && c.eat_n(2, digit)) {
        c.i = before_seconds;
    }
    let ok = c.eat_spaces() > 0 && c.eat_n(2, |x| x.is_ascii_alphabetic()) && c.eat(|x| x == ']');
    if ok && (c.eat(is_space) || c.at_end()) {
        Some(c.i)
    } else {
        None
    }
}

/// Whether `line` is a legacy `Grounding: YYYY/MM/DD|HH:MM|CC` header.
fn legacy_header(line: &str) -> bool {
    let mut c = Cursor { s: line, i: 0 };
    let slash = |x: char| x == '/';
    let bar = |x: char| x == '|';
    if !c.eat_ci("Grounding:") {
        return false;
    }
    c.eat_spaces();
    c.eat_n(4, digit)
        && c.eat(slash)
        && c.eat_n(2, digit)
        && c.eat(slash)
        && c.eat_n(2, digit)
        && c.eat(bar)
        && c.eat_n(2, digit)
        && c.eat(|x| x == ':')
        && c.eat_n(2, digit)
        && c.eat(bar)
        && c.eat_n(2, |x| x.is_ascii_alphabetic())
        && c.at_end()
}

/// `text` without the runtime's grounding prefixes (envelopes, time
/// headers, legacy `Grounding:` lines), left-stripped; `""` when nothing
/// else is left.
fn strip_grounding_prefix(text: &str) -> String {
    let mut raw = text.to_string();
    while !py_strip(&raw).is_empty() {
        let stripped = lstrip(&raw);
        if let Some(end) = envelope_end(stripped).or_else(|| time_header_end(stripped)) {
            raw = lstrip(&stripped[end..]).to_string();
            continue;
        }
        let lines = splitlines(stripped);
        if lines.first().is_some_and(|l| legacy_header(py_strip(l))) {
            raw = lstrip(&lines[1..].join("\n")).to_string();
            continue;
        }
        return stripped.to_string();
    }
    String::new()
}

/// The message's own leading `<runtime_metadata>` envelope (with the
/// whitespace around it), if `text` starts with exactly one and nothing
/// the runtime stamps is stacked behind it.
fn head_envelope(text: &str) -> Option<&str> {
    if py_strip(text).is_empty() {
        return None;
    }
    let end = envelope_end(text)?;
    let rest = &text[end..];
    if strip_grounding_prefix(rest) != py_strip(rest) {
        return None;
    }
    Some(&text[..end])
}

/// Whether a content part is a text part (`type` `text`, any case).
fn is_text_part(part: &Value) -> bool {
    part.as_object().is_some_and(|p| {
        let kind = p
            .get("type")
            .filter(|v| truthy(Some(v)))
            .map(py_str)
            .unwrap_or_default();
        py_strip(&kind).to_lowercase() == "text"
    })
}

/// A content-part list with the notice as one text part (see
/// [`announce_dropped`]).
fn notice_into_parts(parts: &[Value], notice: &str) -> Vec<Value> {
    let notice_part = json!({"type": "text", "text": notice});
    if let Some(first) = parts.iter().position(is_text_part) {
        let text = parts[first].get("text").and_then(Value::as_str);
        if let Some((text, envelope)) = text.and_then(|t| head_envelope(t).map(|e| (t, e))) {
            let with_text = |t: &str| {
                let mut part = parts[first].clone();
                if let Some(p) = part.as_object_mut() {
                    p.insert("text".into(), Value::String(t.to_string()));
                }
                part
            };
            let tail = text[envelope.len()..].trim_start_matches('\n');
            let mut out = parts[..first].to_vec();
            out.push(with_text(envelope.trim_end_matches('\n')));
            out.push(notice_part);
            if !tail.is_empty() {
                out.push(with_text(tail));
            }
            out.extend_from_slice(&parts[first + 1..]);
            return out;
        }
    }
    let mut out = vec![notice_part];
    out.extend_from_slice(parts);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message content whose estimate, with `role`, is exactly `tokens`.
    fn text_with_tokens(role: &str, tokens: u64) -> String {
        let chars = (tokens * 4) as usize - role.len() - 2;
        "the history window keeps whole turns "
            .chars()
            .cycle()
            .take(chars)
            .collect()
    }

    fn msg(role: &str, content: &str) -> Value {
        json!({"role": role, "content": content})
    }

    fn pair(user: &str, assistant: &str) -> Vec<Value> {
        vec![msg("user", user), msg("assistant", assistant)]
    }

    const NOTICE_9_OF_10: &str = "[#TRUNCATION: 2 earlier message(s) of this session (~9 tokens) \
        were dropped from replay by the history window (the most recent 10 tokens, whole turns; \
        abstractruntime.session_history); this history starts mid-conversation]";

    fn report_9_of_10() -> WindowReport {
        WindowReport {
            dropped_messages: 2,
            dropped_tokens: 9,
            ..WindowReport::empty(10)
        }
    }

    fn announced(content: Value) -> Value {
        let mut messages = vec![json!({"role": "user", "content": content})];
        announce_dropped(&mut messages, &report_9_of_10(), false);
        messages[0]["content"].clone()
    }

    #[test]
    fn tokens_are_a_quarter_of_the_code_points() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("a"), 1);
        assert_eq!(estimate_tokens("abcdefg"), 1);
        assert_eq!(estimate_tokens("abcdefgh"), 2);
        // Code points, not bytes: 8 × "é" is 16 bytes, 4 crabs are 16 bytes.
        assert_eq!(estimate_tokens(&"é".repeat(8)), 2);
        assert_eq!(estimate_tokens("🦀🦀🦀🦀"), 1);
        assert_eq!(estimate_tokens("日本語のテキスト"), 2);
    }

    #[test]
    fn a_message_counts_its_role_and_content() {
        assert_eq!(message_tokens(&msg("user", "hello world")), 4); // "user: hello world"
        assert_eq!(message_tokens(&json!({"role": " ", "content": "abcd"})), 1);
        assert_eq!(message_tokens(&json!({"role": "user"})), 1); // "user: "
        assert_eq!(message_tokens(&json!("user: hello world")), 0);
        // Only role and content count.
        let call = json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "1", "function": {"name": "read_file", "arguments": "{}"}}],
            "metadata": {"k": "v"}});
        assert_eq!(message_tokens(&call), estimate_tokens("assistant: "));
        // Content that is not text: Python's str() of it.
        assert_eq!(
            message_tokens(&json!({"role": "user", "content": {"a": 1}})),
            3
        );
        assert_eq!(message_tokens(&json!({"role": "user", "content": true})), 2);
    }

    #[test]
    fn media_parts_count_flat_and_other_parts_by_their_text() {
        let image = json!({"type": "image_url", "image_url": {
            "url": format!("data:image/png;base64,{}", "A".repeat(200_000))}});
        let look = json!({"role": "user", "content": [{"type": "text", "text": "look"}, image]});
        assert_eq!(
            message_tokens(&look),
            estimate_tokens("user: look") + MEDIA_PART_TOKEN_ESTIMATE
        );
        // `input_text` is text, a string part is text, a text part without
        // text counts nothing, `input_audio` is media ("user: abcd\nefgh").
        let mixed = json!({"role": "user", "content": [
            {"type": "input_text", "text": "abcd"}, "efgh", {"type": "text"},
            {"type": "input_audio", "input_audio": {}}]});
        assert_eq!(message_tokens(&mixed), 3 + MEDIA_PART_TOKEN_ESTIMATE);
        // Any other part by its JSON text: `{"type": "tool_result", "content": "abc"}`.
        let tool = json!({"role": "user", "content": [{"type": "tool_result", "content": "abc"}]});
        assert_eq!(message_tokens(&tool), 11);
        let odd = json!({"role": "user", "content": [1.5, null, [1, "é"]]});
        assert_eq!(message_tokens(&odd), 5); // "user: 1.5\nnull\n[1, \"é\"]"
        let upper = json!({"role": "user", "content": [{"type": "TEXT"}]});
        assert_eq!(message_tokens(&upper), 5); // "user: {\"type\": \"TEXT\"}"
    }

    #[test]
    fn exactly_the_budget_fits_and_a_full_window_drops_the_older_turn() {
        // Checkable behaviour 35: 20k + 30k tokens, both replayed at exactly 50,000.
        let older = pair(
            &text_with_tokens("user", 10_000),
            &text_with_tokens("assistant", 10_000),
        );
        let newest = pair(
            &text_with_tokens("user", 15_000),
            &text_with_tokens("assistant", 15_000),
        );
        let turns = vec![older.clone(), newest.clone()];
        let (kept, report) = window_turns(&turns, HISTORY_REPLAY_MAX_TOKENS).unwrap();
        assert_eq!(report.replayed_tokens, 50_000);
        assert_eq!(report.replayed_messages, 4);
        assert_eq!(report.dropped_messages, 0);
        assert!(!report.oversize_turn_kept);
        assert_eq!(kept, [older.clone(), newest.clone()].concat());

        // One more tiny, older turn cannot join the full window.
        let one_more = vec![pair("x", "y"), older.clone(), newest.clone()];
        let (kept, report) = window_turns(&one_more, HISTORY_REPLAY_MAX_TOKENS).unwrap();
        assert_eq!(report.dropped_messages, 2);
        assert_eq!(report.dropped_tokens, 4); // "user: x" 1 + "assistant: y" 3
        assert_eq!(report.replayed_tokens, 50_000);
        assert_eq!(kept.len(), 4);
        assert_eq!(
            kept[1..],
            [older[1].clone(), newest[0].clone(), newest[1].clone()]
        );
        let head = kept[0]["content"].as_str().unwrap();
        assert_eq!(
            head,
            format!(
                "[#TRUNCATION: 2 earlier message(s) of this session (~4 tokens) were dropped \
                 from replay by the history window (the most recent 50000 tokens, whole turns; \
                 abstractruntime.session_history); this history starts mid-conversation]\n{}",
                older[0]["content"].as_str().unwrap()
            )
        );
        assert_eq!(kept[0]["metadata"]["replay_truncated"], json!(true));
        assert_eq!(kept[0]["metadata"]["history_window"], report.to_json());

        // One token over: the older turn falls out whole.
        let over = vec![
            vec![
                msg("user", &text_with_tokens("user", 10_001)),
                older[1].clone(),
            ],
            newest.clone(),
        ];
        let (folded, report) =
            fold_history_window(&over, HISTORY_REPLAY_MAX_TOKENS, false).unwrap();
        assert_eq!(folded, vec![newest.clone()]);
        assert_eq!(report.dropped_messages, 2);
        assert_eq!(report.dropped_tokens, 20_001);
        assert_eq!(report.replayed_tokens, 30_000);
    }

    #[test]
    fn an_oversize_newest_turn_is_kept_whole_and_alone() {
        let huge = "token ".repeat(60_000);
        let turns = vec![pair("q0", "a0"), pair("q1", huge.trim())];
        let (kept, report) = window_turns(&turns, HISTORY_REPLAY_MAX_TOKENS).unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[1]["content"], json!(huge.trim()));
        assert!(report.oversize_turn_kept);
        assert!(report.replayed_tokens > 50_000);
        assert_eq!(report.dropped_messages, 2);
        let head = kept[0]["content"].as_str().unwrap();
        assert!(
            head.starts_with("[#TRUNCATION: 2 earlier message(s)"),
            "{head}"
        );
        assert!(head.ends_with("]\nq1"), "{head}");
        assert_eq!(report.to_json()["oversize_turn_kept"], json!(true));
    }

    #[test]
    fn the_report_has_the_reference_keys() {
        let (_, report) = window_turns(&[pair("q", "a")], 1000).unwrap();
        assert_eq!(
            report.to_json(),
            json!({
                "policy": "most_recent_whole_turns",
                "max_tokens": 1000,
                "token_estimator": "abstractruntime.memory.token_budget.estimate_message_tokens",
                "replayed_messages": 2,
                "replayed_tokens": 4, // "user: q" 1 + "assistant: a" 3
                "dropped_messages": 0,
                "dropped_tokens": 0,
                "dropped_counts_complete": true,
                "oversize_turn_kept": false,
            })
        );
        let (_, partial) = fold_history_window(&[pair("q", "a"), pair("r", "b")], 4, true).unwrap();
        assert!(!partial.dropped_counts_complete);
        assert!(
            truncation_notice(&partial).contains(" (~4 tokens) (and older turns not counted) were")
        );
        let (_, whole) = fold_history_window(&[pair("q", "a")], 4, true).unwrap();
        assert!(whole.dropped_counts_complete);
    }

    #[test]
    fn a_zero_budget_is_refused() {
        assert_eq!(
            window_turns(&[], 0).unwrap_err(),
            "history window max_tokens must be a positive int, got 0"
        );
        assert!(window_transcript(&[msg("user", "q")], 0, 0).is_err());
    }

    #[test]
    fn the_notice_goes_after_a_leading_envelope() {
        let envelope =
            "<runtime_metadata>{\"display\":\"[2026-09-22 03:32:27]\"}</runtime_metadata>\n";
        assert_eq!(
            announced(json!(format!("{envelope}hello"))),
            json!(format!("{envelope}{NOTICE_9_OF_10}\nhello"))
        );
        assert_eq!(
            announced(json!("  <RUNTIME_METADATA>{}</runtime_metadata>hello")),
            json!(format!(
                "  <RUNTIME_METADATA>{{}}</runtime_metadata>\n{NOTICE_9_OF_10}\nhello"
            ))
        );
        assert_eq!(
            announced(json!("<runtime_metadata>{}</runtime_metadata>")),
            json!(format!(
                "<runtime_metadata>{{}}</runtime_metadata>\n{NOTICE_9_OF_10}\n"
            ))
        );
        // As the reference: an envelope with another stamp stacked behind it,
        // or text ending in whitespace, is not the message's own envelope.
        for stacked in [
            "<runtime_metadata>{}</runtime_metadata>\n<runtime_metadata>{}</runtime_metadata>\nhi",
            "<runtime_metadata>{}</runtime_metadata>\n[2026-09-22 03:32 FR] hi",
            "<runtime_metadata>{}</runtime_metadata>\nGrounding: 2026/09/22|03:32|FR\nhi",
            "<runtime_metadata>{}</runtime_metadata>\nhi\n",
        ] {
            assert_eq!(
                announced(json!(stacked)),
                json!(format!("{NOTICE_9_OF_10}\n{stacked}"))
            );
        }
        assert_eq!(
            announced(json!("hello")),
            json!(format!("{NOTICE_9_OF_10}\nhello"))
        );
        assert_eq!(announced(json!("")), json!(format!("{NOTICE_9_OF_10}\n")));
        assert_eq!(announced(Value::Null), json!(format!("{NOTICE_9_OF_10}\n")));
        assert_eq!(announced(json!(5)), json!(5));
    }

    #[test]
    fn list_content_gains_one_notice_part() {
        let image =
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let notice = json!({"type": "text", "text": NOTICE_9_OF_10});
        assert_eq!(
            announced(json!([{"type": "text", "text": "what is this?"}, image])),
            json!([notice, {"type": "text", "text": "what is this?"}, image])
        );
        assert_eq!(announced(json!([image])), json!([notice, image]));
        assert_eq!(
            announced(json!([
                {"type": "text", "text": "<runtime_metadata>{}</runtime_metadata>\nlook"},
                image
            ])),
            json!([
                {"type": "text", "text": "<runtime_metadata>{}</runtime_metadata>"},
                notice,
                {"type": "text", "text": "look"},
                image
            ])
        );
    }

    #[test]
    fn stamped_metadata_keeps_its_keys() {
        let mut messages = vec![
            json!({"role": "user", "content": "x", "metadata": {"k": 1}}),
            msg("assistant", "y"),
        ];
        let report = report_9_of_10();
        announce_dropped(&mut messages, &report, true);
        assert_eq!(
            messages[0]["metadata"],
            json!({"k": 1, "replay_truncated": true, "history_window": report.to_json()})
        );
        assert_eq!(messages[1], msg("assistant", "y"));
        // Nothing dropped, nothing written.
        let mut untouched = vec![msg("user", "x")];
        announce_dropped(&mut untouched, &WindowReport::empty(10), true);
        assert_eq!(untouched, vec![msg("user", "x")]);
    }

    #[test]
    fn a_transcript_is_grouped_at_user_messages() {
        let messages = vec![
            msg("system", &"sys ".repeat(100)),
            msg("assistant", "pre"),
            msg("user", "q1"),
            msg("assistant", "a1"),
            msg("user", "q2"),
            msg("assistant", "a2"),
        ];
        // The leading system message and what follows it up to the first
        // user message are the oldest turn, dropped first.
        let (kept, report) = window_transcript(&messages, 10, 4).unwrap();
        assert_eq!(report.dropped_messages, 2);
        assert_eq!(report.dropped_tokens, 105);
        assert_eq!(report.replayed_tokens, 10);
        assert_eq!(kept.len(), 4);
        assert_eq!(
            kept[0],
            msg(
                "user",
                "[#TRUNCATION: 2 earlier message(s) of this session (~105 tokens) were dropped \
                 from replay by the history window (the most recent 10 tokens, whole turns; \
                 abstractruntime.session_history); this history starts mid-conversation]\nq1"
            )
        );
        assert_eq!(kept[1..], messages[3..]);
        // Plain messages: no metadata is stamped.
        assert!(kept[0].get("metadata").is_none());
        // The input is not changed.
        assert_eq!(messages[2], msg("user", "q1"));

        let (all, report) = window_transcript(&messages, 1000, messages.len()).unwrap();
        assert_eq!(all, messages);
        assert_eq!(report.replayed_tokens, 115);

        assert_eq!(
            window_transcript(&messages, 1000, 7).unwrap_err(),
            "current_turn_start must be an index into the 6 messages, got 7"
        );
        // The index is checked before the budget.
        assert!(window_transcript(&messages, 0, 7)
            .unwrap_err()
            .starts_with("current_turn_start"));
    }

    #[test]
    fn the_current_turn_is_one_turn_kept_whole() {
        let big = "tide ".repeat(8000); // 10,000 tokens
        let older = pair("old", "a");
        let current = vec![
            msg("user", &format!("QUESTION {}", big.repeat(3))),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "t"}]}),
            json!({"role": "tool", "tool_call_id": "t", "content": big.repeat(3)}),
            msg("user", "[User response]: section 2"),
        ];
        let messages = [older.clone(), current.clone()].concat();
        // Grouped at every user message, the last answer alone is the newest turn.
        let (split, _) =
            window_transcript(&messages, HISTORY_REPLAY_MAX_TOKENS, messages.len()).unwrap();
        assert!(split.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .ends_with("section 2"));
        assert!(!split
            .iter()
            .any(|m| m["content"].as_str().unwrap_or("").contains("QUESTION")));
        // From the turn's start it is one turn: kept whole, reported oversize.
        let (whole, report) = window_transcript(&messages, HISTORY_REPLAY_MAX_TOKENS, 2).unwrap();
        assert_eq!(whole.len(), 4);
        assert_eq!(whole[1..], current[1..]);
        assert!(whole[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("[#TRUNCATION: 2 earlier"));
        assert!(report.oversize_turn_kept);
        assert_eq!(report.dropped_messages, 2);
    }
}

//! `edit_file`: find/replace (literal or regex, optionally within a line
//! range), line-range replace, or a single-file unified diff, shown as a
//! numbered diff with a post-edit excerpt (reference: abstractcore
//! `edit_file` and its helpers, common_tools.py 11605-11870, 12442-13418).

use std::cell::RefCell;
use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use regex::{Captures, Regex, RegexBuilder};
use serde_json::json;
use stepwell_guest::tool::{EffectClass, ToolError, ToolSpec};

use crate::args::Args;
use crate::difflib::{
    append_post_edit_excerpt, merge_line_ranges, numbered_excerpt, render_edit_diff,
};
use crate::patch::{apply_unified_diff, is_suffix_path, parse_unified_diff};
use crate::pyre::Template;
use crate::reerror::Refusal;
use crate::text::{
    display_path, io_error_text, py_lstrip, py_rstrip, py_splitlines, py_strip, thousands,
    MAX_READ_BYTES,
};

/// How the reference's outer `except` words an unexpected failure (no lint
/// notice follows it).
const ERROR_EDITING: &str = "❌ Error editing file: ";

/// The note added when an over-escaped pattern matched only after
/// unescaping.
const ESCAPE_NOTE: &str = "the PATTERN matched only after unescaping literal \\n/\\t/\\r to control characters (your pattern appears over-escaped); the replacement was written VERBATIM (a literal backslash-n in the replacement is kept as-is).";

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "edit_file",
        "Surgically edit a text file via small find/replace (literal/regex), a line-range replace, or a single-file unified diff patch.\n\nWhen to use: Use for small, precise edits. Prefer a small unique pattern; whole-file rewrites use write_file(). Different files: batch several edit_file calls in one turn. Several changes in one file: one diff-mode call.",
        EffectClass::Write,
        json!({
            "type": "object",
            "properties": {
                "file_path": {
                    "type": "string",
                    "description": "Path to the file to edit."
                },
                "pattern": {
                    "type": "string",
                    "description": "Text or regex pattern to find. With replacement omitted (null), a single-file unified diff to apply. Empty with start_line + end_line + replacement: replace those lines."
                },
                "replacement": {
                    "type": "string", "default": null,
                    "description": "Text to replace matches with (regex mode: \\1 or \\g<name> insert groups). Omit (null) for unified diff mode."
                },
                "use_regex": {
                    "type": "boolean", "default": false,
                    "description": "Whether to treat pattern as a regex (multi-line, `.` matches newlines; no look-around or backreferences) (default: false)."
                },
                "max_replacements": {
                    "type": "integer", "default": null,
                    "description": "How many matches to replace. Omitted: exactly ONE match is required (multiple matches fail and ask for more context). -1 (or 0): replace ALL occurrences. N >= 1: the first N occurrences."
                },
                "start_line": {
                    "type": "integer", "default": null,
                    "description": "First line of the search scope (1-based, inclusive). Omit to search the whole file."
                },
                "end_line": {
                    "type": "integer", "default": null,
                    "description": "Last line of the search scope (1-based, inclusive). Omit or pass -1 to search through end of file."
                },
                "preview_only": {
                    "type": "boolean", "default": false,
                    "description": "Show what would be changed without applying it (default: false)."
                }
            },
            "required": ["file_path", "pattern"]
        }),
    )
}

/// What one call asks for.
#[derive(Debug, Clone)]
struct EditRequest {
    file_path: String,
    pattern: String,
    /// `None` (absent or `null`): unified diff mode.
    replacement: Option<String>,
    use_regex: bool,
    max_replacements: Option<i64>,
    start_line: Option<i64>,
    end_line: Option<i64>,
    preview_only: bool,
    encoding: String,
    flexible_whitespace: bool,
}

/// Runs a call.
pub fn run(args: &Args) -> Result<String, ToolError> {
    let req = EditRequest {
        file_path: args.required_string("file_path")?,
        pattern: args.string("pattern")?.unwrap_or_default(),
        replacement: args.string("replacement")?,
        use_regex: args.bool_or("use_regex", false)?,
        max_replacements: args.int_opt("max_replacements")?,
        start_line: args.int_opt("start_line")?,
        end_line: args.int_opt("end_line")?,
        preview_only: args.bool_or("preview_only", false)?,
        encoding: args.string_or("encoding", "utf-8")?,
        flexible_whitespace: args.bool_or("flexible_whitespace", true)?,
    };
    Ok(edit_file(&req))
}

/// Whether `encoding` names UTF-8 (the only encoding supported).
fn is_utf8_name(encoding: &str) -> bool {
    let e = encoding.trim().to_lowercase().replace('_', "-");
    matches!(e.as_str(), "utf-8" | "utf8" | "u8" | "utf")
}

/// Replaces literal `\n`, `\t`, `\r` escapes by the control characters.
fn normalize_escape_sequences(text: &str) -> String {
    if text.contains("\\n") || text.contains("\\t") || text.contains("\\r") {
        text.replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\r", "\r")
    } else {
        text.to_string()
    }
}

/// The number of non-overlapping occurrences of `pattern` in `text`.
fn count_occurrences(text: &str, pattern: &str) -> usize {
    if pattern.is_empty() {
        return 0;
    }
    text.matches(pattern).count()
}

/// The 1-based line of byte offset `offset` in `text`.
fn line_of_offset(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Whether whitespace-flexible matching applies to a literal pattern: it
/// spans lines, or it is indented.
fn flexible_applies(pattern: &str) -> bool {
    let stripped = py_lstrip(pattern);
    pattern.contains('\n') || (stripped != pattern && !stripped.is_empty())
}

/// The leading whitespace of `line`.
fn indent_of(line: &str) -> &str {
    &line[..line.len() - py_lstrip(line).len()]
}

/// Matches `pattern` line by line ignoring each line's indentation
/// (anchored at line starts) and replaces matches with `replacement`
/// re-indented like the matched lines. `max` is -1 for all. Returns the new
/// text, the replacements made and the starting line of every match, or
/// `None` when nothing matches.
fn flexible_whitespace_match(
    pattern: &str,
    replacement: &str,
    content: &str,
    max: i64,
) -> Option<(String, usize, Vec<usize>)> {
    let pattern_n = pattern.replace("\r\n", "\n");
    let content_n = content.replace("\r\n", "\n");
    let pattern_lines: Vec<&str> = pattern_n.split('\n').collect();
    let parts: Vec<String> = pattern_lines
        .iter()
        .map(|line| {
            let stripped = py_lstrip(line);
            if stripped.is_empty() {
                "[ \\t]*".to_string()
            } else {
                format!("[ \\t]*{}", regex::escape(stripped))
            }
        })
        .collect();
    let flexible = format!("^{}", parts.join("\\r?\\n"));
    let re = RegexBuilder::new(&flexible).multi_line(true).build().ok()?;
    let starts: Vec<usize> = re
        .find_iter(&content_n)
        .map(|m| line_of_offset(&content_n, m.start()))
        .collect();
    if starts.is_empty() {
        return None;
    }
    let repl_n = replacement.replace("\r\n", "\n");
    let pattern_last_indent = pattern_lines
        .last()
        .map_or(0, |l| indent_of(l).chars().count());
    let adjust = |caps: &Captures| -> String {
        let matched_lines: Vec<&str> = caps[0].split('\n').collect();
        repl_n
            .split('\n')
            .enumerate()
            .map(|(j, repl_line)| {
                let repl_stripped = py_lstrip(repl_line);
                match matched_lines.get(j) {
                    Some(matched) => format!("{}{repl_stripped}", indent_of(matched)),
                    None => {
                        let base = matched_lines.last().map_or("", |l| indent_of(l));
                        let repl_indent = indent_of(repl_line).chars().count();
                        let extra = repl_indent.saturating_sub(pattern_last_indent);
                        format!("{base}{}{repl_stripped}", " ".repeat(extra))
                    }
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let limit = if max == -1 { 0 } else { max as usize };
    let mut updated = re.replacen(&content_n, limit, adjust).into_owned();
    let count = if max == -1 {
        starts.len()
    } else {
        starts.len().min(max as usize)
    };
    if content.contains("\r\n") && !updated.contains("\r\n") {
        updated = updated.replace('\n', "\r\n");
    }
    Some((updated, count, starts))
}

/// A literal replace that does not repeat an insertion: when the
/// replacement is the pattern plus a suffix (or a prefix plus the pattern),
/// matches already followed (preceded) by it are left alone. `None` when
/// the replacement is not of that shape.
fn idempotent_insert_replace(
    search: &str,
    pattern: &str,
    replacement: &str,
    max: i64,
) -> Option<(String, usize)> {
    if pattern.is_empty() || replacement == pattern {
        return None;
    }
    let (insert, is_suffix) = if let Some(suffix) = replacement.strip_prefix(pattern) {
        (suffix, true)
    } else if let Some(prefix) = replacement.strip_suffix(pattern) {
        (prefix, false)
    } else {
        return None;
    };
    if insert.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(search.len());
    let mut i = 0;
    let mut replaced = 0usize;
    while let Some(off) = search[i..].find(pattern) {
        let pos = i + off;
        out.push_str(&search[i..pos]);
        let after = pos + pattern.len();
        let already = if is_suffix {
            search[after..].starts_with(insert)
        } else {
            search[..pos].ends_with(insert)
        };
        if already || (max != -1 && replaced as i64 >= max) {
            out.push_str(pattern);
        } else {
            out.push_str(replacement);
            replaced += 1;
        }
        i = after;
    }
    out.push_str(&search[i..]);
    Some((out, replaced))
}

/// Identifier-like tokens of a pattern for no-match diagnostics: at least
/// three characters, common keywords dropped, longest first, at most 6.
fn diagnostic_tokens(pattern: &str) -> Vec<String> {
    const STOP: &[&str] = &[
        "self", "this", "true", "false", "null", "none", "return", "class", "def", "import", "from",
    ];
    let chars: Vec<char> = pattern.chars().collect();
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_';
    let is_cont = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut ordered: Vec<String> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_start(chars[i]) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < chars.len() && is_cont(chars[j]) {
            j += 1;
        }
        if j - i < 3 {
            i += 1;
            continue;
        }
        let token: String = chars[i..j].iter().collect();
        let lower = token.to_lowercase();
        if !STOP.contains(&lower.as_str()) && !ordered.iter().any(|t| t.to_lowercase() == lower) {
            ordered.push(token);
        }
        i = j;
    }
    let mut ranked: Vec<(usize, String)> = ordered.into_iter().enumerate().collect();
    ranked.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(6).map(|(_, t)| t).collect()
}

/// The diagnostics appended to a no-match error: the lines sharing the most
/// tokens with the pattern, and a small numbered excerpt around them.
fn no_match_diagnostics(content: &str, pattern: &str) -> String {
    let tokens = diagnostic_tokens(pattern);
    if tokens.is_empty() || content.is_empty() {
        return String::new();
    }
    let lines = py_splitlines(content, false);
    let lowered: Vec<String> = tokens.iter().map(|t| t.to_lowercase()).collect();
    let mut scored: Vec<(usize, &str, usize)> = lines
        .iter()
        .enumerate()
        .filter_map(|(idx, line)| {
            let line_l = line.to_lowercase();
            let score = lowered
                .iter()
                .filter(|t| line_l.contains(t.as_str()))
                .count();
            (score > 0).then_some((idx + 1, *line, score))
        })
        .collect();
    if scored.is_empty() {
        return String::new();
    }
    scored.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    scored.truncate(5);
    let truncate = |line: &str| -> String {
        let s = line.replace('\t', "    ");
        if s.chars().count() <= 200 {
            s
        } else {
            let head: String = s.chars().take(199).collect();
            format!("{head}… (truncated)")
        }
    };
    let mut out = vec![format!(
        "Closest lines (token match: {}):",
        tokens
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    )];
    for (ln, text, _) in &scored {
        out.push(format!("  {ln}: {}", truncate(text)));
    }
    let total = lines.len();
    let ranges: Vec<(usize, usize)> = scored
        .iter()
        .take(3)
        .map(|(ln, _, _)| (ln.saturating_sub(2).max(1), (ln + 2).min(total)))
        .collect();
    let merged = merge_line_ranges(&ranges, 2);
    let excerpt_lines: usize = merged.iter().map(|(s, e)| e - s + 1).sum();
    if !merged.is_empty() && excerpt_lines <= 60 {
        out.push("Excerpt:".to_string());
        for (start, end) in merged {
            out.push(format!("  lines {start}-{end}:"));
            let excerpt = numbered_excerpt(&lines, start, end);
            out.extend(
                py_splitlines(&excerpt, false)
                    .into_iter()
                    .map(|l| format!("    {l}")),
            );
        }
    }
    format!("\n{}", out.join("\n"))
}

/// The JSON parse error of `text` (`line L column C: message`, in Python
/// `json`'s words and places), if any.
fn json_error_detail(text: &str) -> Option<String> {
    crate::pyjson::error_detail(text)
}

/// The file being edited, as read.
struct Doc {
    /// The path as shown.
    shown: String,
    /// The text with line endings normalized to `\n`.
    content: String,
    /// The file's dominant line ending is `\r\n`.
    crlf: bool,
    crlf_count: usize,
    bare_lf_count: usize,
    /// A `.json` file that parsed before the edit (so the edit must keep it
    /// parsing).
    json_guard: bool,
    /// The text the lint notice is about once an edit is rendered (the
    /// edited text, written or previewed); else the current text.
    linted: RefCell<Option<String>>,
}

impl Doc {
    /// `text` with the file's dominant line ending.
    fn restore_newlines(&self, text: &str) -> String {
        if self.crlf {
            text.replace('\n', "\r\n")
        } else {
            text.to_string()
        }
    }

    /// `message` with a note on mixed line endings, when the file had them.
    fn with_mixed_endings_note(&self, message: &str) -> String {
        if self.crlf_count == 0 || self.bare_lf_count == 0 {
            return message.to_string();
        }
        let style = if self.crlf {
            "normalized to CRLF (dominant style)."
        } else {
            "normalized to LF (dominant style)."
        };
        format!(
            "{}\n\nNote: file had mixed line endings ({} CRLF / {} LF); {style}",
            py_rstrip(message),
            self.crlf_count,
            self.bare_lf_count
        )
    }

    /// The rendered diff from the current text to `after`, with the
    /// post-edit excerpt.
    fn render(&self, after: &str) -> String {
        let rendered = render_edit_diff(&self.shown, &self.content, after);
        append_post_edit_excerpt(&rendered, &self.shown, after)
    }

    /// The refusal for an edit that would make a valid JSON file invalid.
    fn guard_refusal(&self, updated: &str) -> Option<String> {
        if !self.json_guard {
            return None;
        }
        let detail = json_error_detail(updated)?;
        let preview = self.render(updated).replacen("Edited ", "Preview ", 1);
        Some(
            py_rstrip(&format!(
                "❌ Refused: edit would introduce a JSON syntax error.\n{detail}\n\n{preview}"
            ))
            .to_string(),
        )
    }

    /// Writes `updated` (with the file's line endings) unless previewing,
    /// and returns `rendered` (as a preview when previewing).
    fn finish(
        &self,
        path: &Path,
        updated: &str,
        rendered: String,
        preview_only: bool,
        write_error_prefix: &str,
    ) -> String {
        self.linted.replace(Some(updated.to_string()));
        if preview_only {
            return rendered.replacen("Edited ", "Preview ", 1);
        }
        match fs::write(path, self.restore_newlines(updated)) {
            Ok(()) => rendered,
            Err(e) => format!("{write_error_prefix}{}", io_error_text(&e)),
        }
    }
}

/// Runs `edit_file`, returning the text for the model.
fn edit_file(req: &EditRequest) -> String {
    let raw_path = py_strip(&req.file_path);
    let shown = display_path(raw_path);
    let input_line = if !raw_path.is_empty() && !raw_path.starts_with('/') {
        format!("\nInput: {raw_path}")
    } else {
        String::new()
    };
    let path = Path::new(raw_path);
    if stepwell_abstractignore::refuses_write(path) {
        return format!(
            "❌ Refused: Path '{shown}' is ignored by .abstractignore policy{input_line}"
        );
    }
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return format!("❌ File not found: {shown}{input_line}");
        }
        Err(e) => return format!("{ERROR_EDITING}{}", io_error_text(&e)),
    };
    if !meta.is_file() {
        return format!("❌ Path is not a file: {shown}{input_line}");
    }
    if !is_utf8_name(&req.encoding) {
        return format!(
            "❌ Error reading file: unsupported encoding '{}' (only UTF-8 files can be edited)",
            req.encoding
        );
    }
    if meta.len() > MAX_READ_BYTES {
        return format!(
            "❌ Error reading file: the file is too large to edit ({} bytes; the limit is {} bytes)",
            thousands(meta.len()),
            thousands(MAX_READ_BYTES)
        );
    }
    let raw = match fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(_) => {
                return format!(
                    "❌ Cannot decode file with encoding '{}'. File may be binary.",
                    req.encoding
                )
            }
        },
        Err(e) => return format!("❌ Error reading file: {}", io_error_text(&e)),
    };
    let crlf_count = raw.matches("\r\n").count();
    let bare_lf_count = raw.matches('\n').count() - crlf_count;
    let content = raw.replace("\r\n", "\n").replace('\r', "\n");
    let is_json = path
        .extension()
        .is_some_and(|e| e.to_string_lossy().eq_ignore_ascii_case("json"));
    let doc = Doc {
        shown,
        json_guard: is_json && json_error_detail(&content).is_none(),
        content,
        crlf: crlf_count > bare_lf_count,
        crlf_count,
        bare_lf_count,
        linted: RefCell::new(None),
    };
    let result = match &req.replacement {
        None => diff_mode(&doc, path, req),
        Some(replacement) => replace_mode(&doc, path, req, replacement),
    };
    // Every answer about a file that was read carries its lint notice, but
    // an unexpected failure (the reference's outer `except`).
    if result.starts_with(ERROR_EDITING) {
        return result;
    }
    let linted = doc.linted.take().unwrap_or_else(|| doc.content.clone());
    crate::lint::with_notice(path, result, &linted)
}

/// Unified diff mode: applies the diff in `req.pattern`.
fn diff_mode(doc: &Doc, path: &Path, req: &EditRequest) -> String {
    let diff = match parse_unified_diff(&req.pattern) {
        Ok(diff) => diff,
        Err(e) => return format!("❌ Error: {e}"),
    };
    if let Some(header) = diff
        .header_path
        .as_deref()
        .filter(|h| !is_suffix_path(h, &doc.shown))
    {
        return format!(
            "❌ Error: Patch file header does not match the provided path.\nPatch header: {header}\nTarget path:  {}\nGenerate a unified diff targeting the exact file you want to edit.",
            doc.shown
        );
    }
    let (updated, notes) =
        match apply_unified_diff(&doc.content, &diff.hunks, req.flexible_whitespace) {
            Ok(applied) => applied,
            Err(e) => return format!("❌ Error: Patch did not apply cleanly: {e}"),
        };
    if updated == doc.content {
        return "No changes applied (patch resulted in identical content).".to_string();
    }
    if let Some(refusal) = doc.guard_refusal(&updated) {
        return refusal;
    }
    let mut rendered = doc.render(&updated);
    if !notes.is_empty() {
        rendered = format!(
            "{}\n\nNote (patch anchoring): {}.",
            py_rstrip(&rendered),
            notes.join("; ")
        );
    }
    let rendered = doc.with_mixed_endings_note(&rendered);
    doc.finish(path, &updated, rendered, req.preview_only, ERROR_EDITING)
}

/// The outcome of matching in find/replace mode.
struct Replaced {
    /// The searched text after replacement.
    updated: String,
    /// Replacements made.
    made: usize,
    /// Matches found in the searched text.
    total: usize,
}

/// Find/replace and range-replace mode.
fn replace_mode(doc: &Doc, path: &Path, req: &EditRequest, replacement: &str) -> String {
    let shown = &doc.shown;
    let content = &doc.content;
    let mut pattern = req.pattern.clone();
    let mut replacement = replacement.to_string();
    let mut use_regex = req.use_regex;
    let mut require_unique = req.max_replacements.is_none();
    let mut max_repl: i64 = match req.max_replacements {
        None => 1,
        Some(n) if n <= 0 => -1,
        Some(n) => n,
    };
    let mut escape_note: Option<&str> = None;

    // Line-range scope.
    let mut start_line = req.start_line;
    let mut end_line = req.end_line;
    let ranged = start_line.is_some() || end_line.is_some();
    let mut search_content = content.clone();
    let mut line_offset = 0usize;
    let mut scope: Option<(usize, usize)> = None;
    let mut range_notes: Vec<String> = Vec::new();
    if ranged {
        let lines = py_splitlines(content, true);
        let total = lines.len() as i64;
        let mut problems: Vec<String> = Vec::new();
        if let Some(s) = start_line {
            if s == 0 {
                start_line = Some(1);
                range_notes
                    .push("start_line 0 is treated as line 1 (line numbers are 1-based)".into());
            } else if s < 0 {
                problems.push(format!("start_line {s} is invalid; use a value between 1 and {total}, or omit it to search from the start of the file"));
            } else if s > total {
                problems.push(format!("start_line {s} is beyond the end of the file ({total} lines); the line numbers may be stale — re-read the file, or omit start_line/end_line"));
            }
        }
        if let Some(e) = end_line {
            if e == -1 {
                end_line = Some(total);
            } else if e == 0 {
                problems.push(format!("end_line 0 is ambiguous (line numbers are 1-based, so there is no line 0); use a value between 1 and {total}, pass -1 for end of file, or omit end_line to search through the end of the file"));
            } else if e < -1 {
                problems.push(format!("end_line {e} is invalid; use a value between 1 and {total}, pass -1 for end of file, or omit it"));
            } else if e > total {
                range_notes.push(format!(
                    "end_line {e} exceeds the file and is treated as {total} (end of file)"
                ));
                end_line = Some(total);
            }
        }
        if let (true, Some(s), Some(e)) = (problems.is_empty(), start_line, end_line) {
            if s > e {
                problems.push(format!(
                    "start_line ({s}) is greater than end_line ({e}); the range is empty"
                ));
            }
        }
        if !problems.is_empty() {
            let problem_lines: Vec<String> = problems.iter().map(|p| format!("- {p}")).collect();
            let note_lines = if range_notes.is_empty() {
                String::new()
            } else {
                let notes: Vec<String> =
                    range_notes.iter().map(|n| format!("Note: {n}.")).collect();
                format!("\n{}", notes.join("\n"))
            };
            return format!(
                "❌ Invalid line range for '{shown}' ({total} lines):\n{}{note_lines}\nOmit start_line/end_line to search the whole file (recommended when the pattern is unique).",
                problem_lines.join("\n")
            );
        }
        let start_idx = start_line.map_or(0, |s| (s - 1) as usize);
        let end_idx = end_line.map_or(lines.len(), |e| e as usize);
        search_content = lines[start_idx.min(end_idx)..end_idx].concat();
        line_offset = start_idx;
        scope = Some((start_idx + 1, end_idx));
    }
    let range_info = scope.map_or(String::new(), |(a, b)| format!(" (lines {a}-{b})"));
    let scope_note = if range_notes.is_empty() {
        String::new()
    } else {
        format!("Note (line range): {}.", range_notes.join("; "))
    };

    // Range-replace mode: an empty pattern replaces the scoped lines.
    let mut range_replace = false;
    if py_strip(&pattern).is_empty() {
        let (Some(_), Some(end)) = (start_line, end_line) else {
            if start_line.is_none() && end_line.is_none() {
                return "❌ Invalid pattern: pattern must be a non-empty string.\nTo replace a specific block by line numbers, provide start_line + end_line + replacement.".to_string();
            }
            return "❌ Invalid range replace: start_line and end_line are both required when pattern is empty.".to_string();
        };
        if content.contains("\r\n") {
            replacement = replacement.replace("\r\n", "\n").replace('\n', "\r\n");
        }
        let eol = if search_content.ends_with("\r\n") {
            "\r\n"
        } else if search_content.ends_with('\n') {
            "\n"
        } else {
            ""
        };
        if !eol.is_empty() && !replacement.is_empty() && !replacement.ends_with(eol) {
            let has_suffix = (end as usize) < py_splitlines(content, true).len();
            if has_suffix || content.ends_with(eol) {
                replacement.push_str(eol);
            }
        }
        range_replace = true;
        pattern = search_content.clone();
        use_regex = false;
        max_repl = 1;
        require_unique = false;
    }

    if !use_regex && pattern == replacement {
        let mut snippet = pattern.replace("\r\n", "\n").replace('\n', "\\n");
        let chars = snippet.chars().count();
        if chars > 200 {
            let head: String = snippet.chars().take(200).collect();
            snippet = format!("{head}… (truncated; {chars} chars total)");
        }
        return format!(
            "❌ Error: `edit_file` called with identical `pattern` and `replacement` (no-op).\nSet `replacement` to the new text you want to write.\n\n`pattern`/`replacement` preview: {snippet}\n\nHow to use `edit_file`:\n- Find/replace: provide `pattern` + `replacement`.\n- Regex replace: set `use_regex=True`.\n- Range replace: set `start_line` + `end_line` + `replacement` with `pattern=\"\"`.\n- Unified diff mode: set `replacement=None` and pass a single-file unified diff in `pattern`.\n\nCommon args: `file_path`, `pattern`, `replacement`, `use_regex`, `max_replacements`, `start_line`, `end_line`, `preview_only`."
        );
    }

    let flexible = req.flexible_whitespace;
    // An over-escaped literal pattern (`\\n` for a newline) is unescaped
    // only when the raw pattern matches nothing and the unescaped one does.
    if !use_regex && !range_replace && !pattern.is_empty() {
        let normalized = normalize_escape_sequences(&pattern);
        if normalized != pattern {
            let has_match = |pat: &str| {
                count_occurrences(&search_content, pat) > 0
                    || (flexible
                        && flexible_applies(pat)
                        && flexible_whitespace_match(pat, &replacement, &search_content, max_repl)
                            .is_some())
            };
            if !has_match(&pattern) && has_match(&normalized) {
                pattern = normalized;
                escape_note = Some(ESCAPE_NOTE);
            }
        }
    }

    let scope_disclosure = if scope_note.is_empty() {
        String::new()
    } else {
        format!("\n\n{scope_note}")
    };
    let escape_disclosure = escape_note.map_or(String::new(), |n| {
        format!("\n\nNote (escape handling): {n}")
    });
    let ambiguous = |kind: &str, total: usize, match_lines: &[usize]| -> String {
        let listed: Vec<String> = match_lines.iter().take(8).map(|n| n.to_string()).collect();
        let more = if total > listed.len() {
            format!(" and {} more", total - listed.len())
        } else {
            String::new()
        };
        let at = if listed.is_empty() {
            String::new()
        } else {
            format!(" at line(s) {}{more}", listed.join(", "))
        };
        format!(
            "❌ Ambiguous pattern: {total} matches for {kind} '{pattern}' in '{shown}'{range_info}{at}.\nFile left unchanged. By default edit_file replaces exactly ONE match, so the pattern must be unique. Fix one of these ways:\n- Add more surrounding context to the pattern so it matches only the intended site (recommended)\n- Scope the edit with start_line/end_line around the intended match\n- Pass max_replacements=-1 (or 0) explicitly to replace ALL {total} occurrences\n- Pass max_replacements=N to replace the first N occurrence(s){scope_disclosure}{escape_disclosure}"
        )
    };
    let scoped_hint = |re: Option<&Regex>| -> String {
        let Some((lo, hi)) = scope else {
            return String::new();
        };
        let (found, first_line) = match re {
            Some(re) => {
                let starts: Vec<usize> = re.find_iter(content).map(|m| m.start()).collect();
                (
                    starts.len(),
                    starts.first().map(|s| line_of_offset(content, *s)),
                )
            }
            None => {
                let found = count_occurrences(content, &pattern);
                if found > 0 {
                    (
                        found,
                        content
                            .find(pattern.as_str())
                            .map(|p| line_of_offset(content, p)),
                    )
                } else if flexible && flexible_applies(&pattern) {
                    match flexible_whitespace_match(&pattern, &replacement, content, -1) {
                        Some((_, _, lines)) => (lines.len(), lines.first().copied()),
                        None => (0, None),
                    }
                } else {
                    (0, None)
                }
            }
        };
        if found > 0 {
            let first = first_line.map_or("None".to_string(), |l| l.to_string());
            format!("\nHint: not found in lines {lo}-{hi}, but {found} match(es) exist outside this range (first at line {first}); the line numbers may be stale — re-read the file, or omit start_line/end_line (recommended when the pattern is unique).")
        } else {
            format!("\nHint: the pattern was not found anywhere in the file (the whole file was probed, not just lines {lo}-{hi}); fix the pattern rather than the line range.")
        }
    };
    let scope_line = if scope_note.is_empty() {
        String::new()
    } else {
        format!("\n{scope_note}")
    };
    let lines_of = |offsets: &[usize]| -> Vec<usize> {
        offsets
            .iter()
            .map(|o| line_of_offset(&search_content, *o) + line_offset)
            .collect()
    };

    let mut regex: Option<Regex> = None;
    let replaced = if use_regex {
        match crate::reerror::python_refusal(&pattern) {
            Some(r @ Refusal::Other(_)) => {
                return format!("{ERROR_EDITING}{}", r.text(&pattern));
            }
            Some(r) => {
                return format!("❌ Invalid regex pattern '{pattern}': {}", r.text(&pattern));
            }
            None => {}
        }
        let re = match RegexBuilder::new(&pattern)
            .multi_line(true)
            .dot_matches_new_line(true)
            .build()
        {
            Ok(re) => re,
            Err(e) => {
                let why = crate::reerror::crate_reason(&pattern, &e);
                return format!("❌ Invalid regex pattern '{pattern}': {why}");
            }
        };
        let starts: Vec<usize> = re.find_iter(&search_content).map(|m| m.start()).collect();
        if starts.is_empty() {
            let diag = no_match_diagnostics(content, &pattern);
            return format!(
                "❌ No matches found for regex pattern '{pattern}' in '{shown}'{range_info}{}{scope_line}{diag}",
                scoped_hint(Some(&re))
            );
        }
        if require_unique && starts.len() > 1 {
            return ambiguous("regex pattern", starts.len(), &lines_of(&starts));
        }
        let template = match Template::for_regex(&replacement, &re) {
            Ok(t) => t,
            Err(e) => return format!("{ERROR_EDITING}{e}"),
        };
        let limit = if max_repl == -1 { 0 } else { max_repl as usize };
        let updated = re
            .replacen(&search_content, limit, |caps: &Captures| {
                template.expand(caps)
            })
            .into_owned();
        let total = starts.len();
        regex = Some(re);
        Replaced {
            updated,
            made: if max_repl == -1 {
                total
            } else {
                total.min(max_repl as usize)
            },
            total,
        }
    } else {
        let count = count_occurrences(&search_content, &pattern);
        if count == 0 {
            let flex = if flexible && flexible_applies(&pattern) {
                flexible_whitespace_match(&pattern, &replacement, &search_content, max_repl)
            } else {
                None
            };
            let Some((updated, made, flex_lines)) = flex else {
                let diag = no_match_diagnostics(content, &pattern);
                return format!(
                    "❌ No occurrences of '{pattern}' found in '{shown}'{range_info}{}{scope_line}{diag}",
                    scoped_hint(None)
                );
            };
            if require_unique && flex_lines.len() > 1 {
                let lines: Vec<usize> = flex_lines.iter().map(|n| n + line_offset).collect();
                return ambiguous(
                    "pattern (whitespace-flexible match)",
                    flex_lines.len(),
                    &lines,
                );
            }
            Replaced {
                updated,
                made,
                total: flex_lines.len(),
            }
        } else {
            if require_unique && count > 1 {
                let offsets: Vec<usize> = search_content
                    .match_indices(pattern.as_str())
                    .map(|(i, _)| i)
                    .collect();
                return ambiguous("pattern", count, &lines_of(&offsets));
            }
            let (updated, made) = match idempotent_insert_replace(
                &search_content,
                &pattern,
                &replacement,
                max_repl,
            ) {
                Some(result) => result,
                None if max_repl == -1 => (
                    search_content.replace(pattern.as_str(), &replacement),
                    count,
                ),
                None => (
                    search_content.replacen(pattern.as_str(), &replacement, max_repl as usize),
                    count.min(max_repl as usize),
                ),
            };
            Replaced {
                updated,
                made,
                total: count,
            }
        }
    };

    let updated_content = if ranged {
        let lines = py_splitlines(content, true);
        let start_idx = start_line.map_or(0, |s| (s - 1) as usize);
        let end_idx = end_line.map_or(lines.len(), |e| e as usize);
        format!(
            "{}{}{}",
            lines[..start_idx].concat(),
            replaced.updated,
            lines[end_idx.max(start_idx)..].concat()
        )
    } else {
        replaced.updated
    };

    if let Some(refusal) = doc.guard_refusal(&updated_content) {
        return match escape_note {
            Some(note) => format!("{}\n\nNote (escape handling): {note}", py_rstrip(&refusal)),
            None => refusal,
        };
    }

    if updated_content == *content {
        let mut rendered = if req.preview_only {
            "No changes would be applied.".to_string()
        } else {
            "No changes applied (resulted in identical content).".to_string()
        };
        rendered.push_str(&scope_disclosure);
        rendered.push_str(&escape_disclosure);
        return rendered;
    }

    let rendered = render_edit_diff(shown, content, &updated_content);
    let mut rendered_lines: Vec<String> = py_splitlines(&rendered, false)
        .into_iter()
        .map(str::to_string)
        .collect();
    if let Some(first) = rendered_lines.first_mut() {
        if replaced.total > 0 {
            first.push_str(&format!(
                " replacements={}/{}",
                replaced.made, replaced.total
            ));
        } else {
            first.push_str(&format!(" replacements={}", replaced.made));
        }
        if let (Some((a, b)), false) = (scope, range_replace) {
            first.push_str(&format!(" (searched lines {a}-{b})"));
        }
    }
    let rendered = py_rstrip(&rendered_lines.join("\n")).to_string();
    let mut rendered = append_post_edit_excerpt(&rendered, shown, &updated_content);
    if replaced.total > 0 && replaced.made < replaced.total && max_repl != -1 {
        rendered.push_str(&format!(
            "\n\nNote: {} more match(es) remain. Next step: re-run edit_file with a higher max_replacements, or target the remaining occurrence(s) with start_line/end_line — re-read first: this edit may have shifted line numbers.",
            replaced.total - replaced.made
        ));
    }
    if let (Some((a, b)), false) = (scope, range_replace) {
        let whole_total = match &regex {
            Some(re) => re.find_iter(content).count(),
            None => count_occurrences(content, &pattern),
        };
        let outside = whole_total.saturating_sub(replaced.total);
        if outside > 0 {
            rendered.push_str(&format!(
                "\n\nNote: the search was scoped to lines {a}-{b}; {outside} match(es) outside this range were NOT considered. Re-run without start_line/end_line to reach them."
            ));
        }
    }
    if !scope_note.is_empty() {
        rendered = format!("{}\n\n{scope_note}", py_rstrip(&rendered));
    }
    if let Some(note) = escape_note {
        rendered = format!("{}\n\nNote (escape handling): {note}", py_rstrip(&rendered));
    }
    let rendered = doc.with_mixed_endings_note(&rendered);
    doc.finish(
        path,
        &updated_content,
        rendered,
        req.preview_only,
        "❌ Write failed: ",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_normalized() {
        assert_eq!(normalize_escape_sequences("a\\nb\\t"), "a\nb\t");
        assert_eq!(normalize_escape_sequences("plain"), "plain");
    }

    #[test]
    fn flexible_matching_reindents() {
        let content = "def f():\n        x = 1\n        y = 2\n";
        let (updated, made, lines) =
            flexible_whitespace_match("x = 1\ny = 2", "x = 10\ny = 20\nz = 30", content, 1)
                .unwrap();
        assert_eq!(
            updated,
            "def f():\n        x = 10\n        y = 20\n        z = 30\n"
        );
        assert_eq!((made, lines), (1, vec![2]));
        assert!(flexible_whitespace_match("nothing", "x", content, 1).is_none());
        assert!(flexible_applies("a\nb"));
        assert!(flexible_applies("  indented"));
        assert!(!flexible_applies("plain"));
        assert!(!flexible_applies("   "));
    }

    #[test]
    fn insertions_are_idempotent() {
        // Suffix insertion already present: nothing is added again.
        assert_eq!(
            idempotent_insert_replace("a\nb\n", "a\n", "a\nb\n", 1),
            Some(("a\nb\n".to_string(), 0))
        );
        assert_eq!(
            idempotent_insert_replace("a\nc\n", "a\n", "a\nb\n", 1),
            Some(("a\nb\nc\n".to_string(), 1))
        );
        // Prefix insertion.
        assert_eq!(
            idempotent_insert_replace("x y", "y", "x y", -1),
            Some(("x y".to_string(), 0))
        );
        assert_eq!(idempotent_insert_replace("abc", "b", "z", 1), None);
    }

    #[test]
    fn diagnostics_tokens() {
        assert_eq!(
            diagnostic_tokens("self.render_frame(ctx, pygame.draw)"),
            vec!["render_frame", "pygame", "draw", "ctx"]
        );
        assert!(diagnostic_tokens("a = 1").is_empty());
    }

    #[test]
    fn diagnostics_show_closest_lines() {
        let content = "import os\n\ndef render_frame(ctx):\n    return ctx\n";
        assert_eq!(
            no_match_diagnostics(content, "def render_frames(context)"),
            ""
        );
        assert_eq!(
            no_match_diagnostics(content, "def render_frame(context, ctx)"),
            "\nClosest lines (token match: render_frame, context, ctx):\n  3: def render_frame(ctx):\n  4:     return ctx\nExcerpt:\n  lines 1-4:\n    1: import os\n    2: \n    3: def render_frame(ctx):\n    4:     return ctx"
        );
    }

    #[test]
    fn json_errors_have_positions() {
        assert_eq!(json_error_detail("{\"a\": 1}"), None);
        let detail = json_error_detail("{\"a\": 1,}").unwrap();
        assert!(detail.starts_with("line 1 column "), "{detail}");
    }

    #[test]
    fn utf8_names() {
        assert!(is_utf8_name("UTF-8"));
        assert!(is_utf8_name("utf_8"));
        assert!(!is_utf8_name("latin-1"));
    }
}

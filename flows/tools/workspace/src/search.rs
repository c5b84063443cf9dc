//! `search_files`: searches file contents for a regular expression and
//! returns the matching lines, grouped by file (reference: abstractcore
//! `search_files`, common_tools.py 2726-3391).

use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Instant;

use regex::{Regex, RegexBuilder};
use serde_json::json;
use stepwell_guest::tool::{EffectClass, ToolError, ToolSpec};

use crate::args::Args;
use crate::glob::GlobSet;
use crate::reerror::Refusal;
use crate::text::{
    char_index, decode_ignore, display_path, io_error_text, json_dumps, looks_binary,
    normalize_newlines, py_repr, py_rstrip, thousands, LineReader, MAX_READ_BYTES,
};
use crate::walk::{Walker, MAX_WALK_ENTRIES};
use stepwell_abstractignore::Policy;

/// How much of one file a multiline search reads.
const MAX_MULTILINE_BYTES: u64 = 16 * 1024 * 1024;
/// The longest excerpt of a matching line.
const MAX_MATCH_LINE_CHARS: usize = 400;
/// Candidate files examined past `max_hits` to count the remaining
/// matching files exactly.
const REMAINDER_BUDGET: usize = 500;
/// How much of a file's start is checked for binary content.
const SNIFF_BYTES: u64 = 8192;
/// Directory names never searched (beside hidden ones and the built-in
/// ignore policy).
const DEFAULT_IGNORES: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    "node_modules",
    "dist",
    "build",
    "target",
    ".DS_Store",
    ".Trash",
    ".cache",
    ".venv",
    "venv",
    "env",
    ".env",
    ".cursor",
    "Library",
    "Applications",
    "System",
    "Volumes",
];

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "search_files",
        "Search inside file contents for a regex pattern (case-insensitive by default) and return matching lines with line numbers; supports context_lines and files_with_matches/count output modes.\n\nWhen to use: Locate where something appears across files (max_hits files, head_limit lines each). Options: output_mode=content|files_with_matches|count (content is the default), context_lines=N, case_sensitive, multiline for cross-line regex.",
        EffectClass::Read,
        json!({
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": "Regular expression pattern to search for (no look-around or backreferences)."
                },
                "path": {
                    "type": "string", "default": ".",
                    "description": "File or directory path to search in (default: current directory)."
                },
                "file_pattern": {
                    "type": "string", "default": "*",
                    "description": "Glob pattern(s) for files to search. Use \"|\" to separate multiple patterns (default: \"*\" for all files)."
                },
                "head_limit": {
                    "type": "integer", "default": 10,
                    "description": "Max matching lines returned per file (default: 10; null or 0 for no per-file limit)."
                },
                "offset": {
                    "type": "integer", "default": 0,
                    "description": "Matches of each file to skip before showing any (for paging; default: 0)."
                },
                "max_hits": {
                    "type": "integer", "default": 8,
                    "description": "Max number of matching files to return (default: 8; null or 0 for no file limit)."
                },
                "multiline": {
                    "type": "boolean", "default": false,
                    "description": "Enable multiline matching where the pattern can span lines (default: false); reads whole files (bounded)."
                },
                "include_hidden": {
                    "type": "boolean", "default": false,
                    "description": "Include hidden files/directories (default: false)."
                },
                "output_mode": {
                    "type": "string", "default": "content",
                    "description": "\"content\" (line-numbered matches), \"files_with_matches\" (just the matching file paths) or \"count\" (match count per file)."
                },
                "context_lines": {
                    "type": "integer", "default": 0,
                    "description": "Lines of context around each match (0-10, default 0); context lines use \"-\" instead of \":\", groups are split by \"--\". Not with multiline."
                },
                "case_sensitive": {
                    "type": "boolean", "default": false,
                    "description": "Match case-sensitively (default: false)."
                },
                "ignore_dirs": {
                    "type": "string", "default": null,
                    "description": "Comma-separated directory names to skip (added to the default ignore set)."
                }
            },
            "required": ["pattern"]
        }),
    )
}

/// What one call asks for.
#[derive(Debug, Clone)]
struct SearchRequest {
    pattern: String,
    /// The path as given.
    path: String,
    file_pattern: String,
    /// `None`: no limit (Python's `None`); values <= 0 also mean no limit.
    head_limit: Option<i64>,
    offset: i64,
    /// `None`: no limit; values <= 0 also mean no limit.
    max_hits: Option<i64>,
    multiline: bool,
    include_hidden: bool,
    output_mode: String,
    context_lines: i64,
    case_sensitive: bool,
    ignore_dirs: Vec<String>,
}

/// Runs a call.
pub fn run(args: &Args) -> Result<String, ToolError> {
    let req = SearchRequest {
        pattern: args.required_string("pattern")?,
        path: args.string_or("path", ".")?,
        file_pattern: args.string_or("file_pattern", "*")?,
        head_limit: args.limit("head_limit", 10)?,
        offset: args.int_or("offset", 0)?,
        max_hits: args.limit("max_hits", 8)?,
        multiline: args.bool_or("multiline", false)?,
        include_hidden: args.bool_or("include_hidden", false)?,
        output_mode: args.string_or("output_mode", "content")?,
        context_lines: args.int_or("context_lines", 0)?,
        case_sensitive: args.bool_or("case_sensitive", false)?,
        ignore_dirs: args.name_list("ignore_dirs")?,
    };
    Ok(search_files(&req))
}

/// The canonical output mode for `mode` (trimmed, lowercased, with the
/// reference's closed set of synonyms); an unknown mode comes back as the
/// error, normalized.
fn canonical_output_mode(mode: &str) -> Result<&'static str, String> {
    let m = mode.trim().to_lowercase();
    let m = if m.is_empty() {
        "content".to_string()
    } else {
        m
    };
    match m.as_str() {
        "content" | "lines" | "line" | "context" | "context_lines" | "matches" | "text" => {
            Ok("content")
        }
        "files_with_matches" | "files" | "paths" | "filenames" | "files_only" => {
            Ok("files_with_matches")
        }
        "count" => Ok("count"),
        _ => Err(m),
    }
}

/// A positive limit, or `None` for "no limit" (absent, `null` or <= 0).
fn positive(limit: Option<i64>) -> Option<usize> {
    limit.filter(|n| *n > 0).map(|n| n as usize)
}

/// Shortens a matching line to at most 400 characters (trailing
/// whitespace dropped), keeping the match (at char index `match_start`)
/// visible and marking cuts with `…`.
fn bounded_excerpt(text: &str, match_start: Option<usize>) -> String {
    let s: Vec<char> = py_rstrip(text).chars().collect();
    let limit = MAX_MATCH_LINE_CHARS;
    if s.len() <= limit {
        return s.into_iter().collect();
    }
    let Some(ms) = match_start else {
        let head: String = s[..limit - 1].iter().collect();
        return format!("{}…", py_rstrip(&head));
    };
    let ms = ms.min(s.len() - 1);
    let window = |content_limit: usize| {
        let start = ms.saturating_sub(content_limit / 2);
        let end = (start + content_limit).min(s.len());
        let start = end.saturating_sub(content_limit);
        (start, end)
    };
    let mut content_limit = limit - 2;
    let (mut start, mut end) = window(content_limit);
    let ellipses = usize::from(start > 0) + usize::from(end < s.len());
    if limit - ellipses != content_limit {
        content_limit = limit - ellipses;
        (start, end) = window(content_limit);
    }
    let prefix = if start > 0 { "…" } else { "" };
    let suffix = if end < s.len() { "…" } else { "" };
    let body: String = s[start..end].iter().collect();
    format!("{prefix}{body}{suffix}")
}

/// Opens a file for searching: `None` when it cannot be opened or its first
/// 8 KiB look binary (a NUL byte, or bytes that are not UTF-8).
fn open_text(path: &Path) -> Option<File> {
    let mut file = File::open(path).ok()?;
    let mut sample = Vec::new();
    (&mut file)
        .take(SNIFF_BYTES)
        .read_to_end(&mut sample)
        .ok()?;
    if looks_binary(&sample) {
        return None;
    }
    file.seek(SeekFrom::Start(0)).ok()?;
    Some(file)
}

/// The lines of `file` (at most 64 MiB of it), split on universal
/// newlines and decoded leniently.
fn text_lines(file: File) -> impl Iterator<Item = io::Result<String>> {
    LineReader::new(BufReader::new(file.take(MAX_READ_BYTES)))
        .map(|line| line.map(|l| decode_ignore(&l.bytes)))
}

/// The first 16 MiB of `file` with newlines normalized to `\n`, and
/// whether the file was longer.
fn read_multiline(file: File) -> io::Result<(String, bool)> {
    let mut buf = Vec::new();
    file.take(MAX_MULTILINE_BYTES + 1).read_to_end(&mut buf)?;
    let truncated = buf.len() as u64 > MAX_MULTILINE_BYTES;
    buf.truncate(MAX_MULTILINE_BYTES as usize);
    Ok((normalize_newlines(&decode_ignore(&buf)), truncated))
}

/// Whether any line of the file at `path` matches (binary files never do).
fn file_has_line_match(path: &Path, re: &Regex) -> bool {
    let Some(file) = open_text(path) else {
        return false;
    };
    for line in text_lines(file) {
        match line {
            Ok(line) if re.is_match(&line) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// The files a search reads: the one file asked for, or a lazy walk of a
/// directory's files in `os.walk` order, pruning hidden and ignored
/// directories and keeping regular files whose names match.
struct Candidates {
    single: Option<PathBuf>,
    walker: Option<Walker>,
    queue: VecDeque<PathBuf>,
    include_hidden: bool,
    /// `None` when the file pattern is `*`.
    file_globs: Option<GlobSet>,
    ignore_set: HashSet<String>,
    /// The `.abstractignore` policy of the searched path.
    policy: Policy,
}

impl Candidates {
    /// Whether the directory walk stopped at its entry budget.
    fn budget_exhausted(&self) -> bool {
        self.walker.as_ref().is_some_and(|w| w.budget.exhausted)
    }
}

impl Iterator for Candidates {
    type Item = PathBuf;

    /// The next file to search.
    fn next(&mut self) -> Option<PathBuf> {
        if let Some(path) = self.single.take() {
            return Some(path);
        }
        loop {
            if let Some(path) = self.queue.pop_front() {
                return Some(path);
            }
            let walker = self.walker.as_mut()?;
            let listing = walker.next_dir()?;
            let kept: Vec<_> = listing
                .dirs
                .into_iter()
                .filter(|d| {
                    (self.include_hidden || !d.name.starts_with('.'))
                        && !self.ignore_set.contains(&d.name)
                        && !self
                            .policy
                            .is_ignored_entry(&d.path, d.is_dir, d.is_symlink)
                })
                .collect();
            for f in listing.files {
                if !self.include_hidden && f.name.starts_with('.') {
                    continue;
                }
                if self
                    .file_globs
                    .as_ref()
                    .is_some_and(|g| !g.matches(&f.name))
                {
                    continue;
                }
                if self.policy.is_ignored(&f.path, false) {
                    continue;
                }
                if f.is_file && !f.is_symlink {
                    self.queue.push_back(f.path);
                }
            }
            walker.descend(&kept);
        }
    }
}

/// Emits content-mode lines for one file: the file header before the first
/// line, `--` between non-adjacent groups when context is on, and
/// `N: text` (match) or `N- text` (context) rows.
struct Emitter<'a> {
    header: String,
    context_n: usize,
    header_added: bool,
    last_emitted: usize,
    out: &'a mut Vec<String>,
}

impl Emitter<'_> {
    /// Emits line `ln`.
    fn emit(&mut self, ln: usize, text: &str, is_match: bool, match_start: Option<usize>) {
        if !self.header_added {
            self.out.push(self.header.clone());
            self.header_added = true;
        } else if self.context_n > 0 && self.last_emitted > 0 && ln > self.last_emitted + 1 {
            self.out.push("    --".to_string());
        }
        let sep = if is_match { ":" } else { "-" };
        self.out.push(format!(
            "    {ln}{sep} {}",
            bounded_excerpt(text, match_start)
        ));
        self.last_emitted = ln;
    }
}

/// What scanning one file produced.
struct FileScan {
    /// Whether anything of the file was shown.
    header_added: bool,
    /// Matching lines shown.
    added: usize,
    /// The last line number shown.
    last_line: usize,
}

/// One search in progress.
struct Search<'a> {
    req: &'a SearchRequest,
    re: Regex,
    head: Option<usize>,
    offset: usize,
    context_n: usize,
}

impl Search<'_> {
    /// Scans `file` line by line (with context lines when asked), appending
    /// its rows to `out`.
    fn scan_lines(&self, file: File, shown: &str, out: &mut Vec<String>) -> io::Result<FileScan> {
        let mut em = Emitter {
            header: format!("\n📄 {shown}:"),
            context_n: self.context_n,
            header_added: false,
            last_emitted: 0,
            out,
        };
        let mut before: VecDeque<(usize, String)> = VecDeque::new();
        let mut after_remaining = 0usize;
        let mut added = 0usize;
        let mut seen = 0usize;
        for (idx, line) in text_lines(file).enumerate() {
            let line_num = idx + 1;
            let line = line?;
            let capped = self.head.is_some_and(|h| added >= h);
            if capped && after_remaining == 0 {
                break;
            }
            if let Some(m) = self.re.find(&line) {
                if capped {
                    break;
                }
                seen += 1;
                if seen <= self.offset {
                    continue;
                }
                if self.context_n > 0 {
                    for (bn, bt) in before.drain(..) {
                        if bn > em.last_emitted {
                            em.emit(bn, &bt, false, None);
                        }
                    }
                }
                em.emit(line_num, &line, true, Some(char_index(&line, m.start())));
                added += 1;
                after_remaining = self.context_n;
                continue;
            }
            if after_remaining > 0 {
                em.emit(line_num, &line, false, None);
                after_remaining -= 1;
            }
            if self.context_n > 0 {
                before.push_back((line_num, line));
                if before.len() > self.context_n {
                    before.pop_front();
                }
            }
        }
        Ok(FileScan {
            header_added: em.header_added,
            added,
            last_line: em.last_emitted,
        })
    }

    /// Scans `file` as one text (multiline mode), appending the lines where
    /// matches start to `out`.
    fn scan_multiline(
        &self,
        file: File,
        shown: &str,
        out: &mut Vec<String>,
    ) -> io::Result<FileScan> {
        let none = FileScan {
            header_added: false,
            added: 0,
            last_line: 0,
        };
        let (content, truncated) = read_multiline(file)?;
        if !self.re.is_match(&content) {
            return Ok(none);
        }
        let newline_positions: Vec<usize> = content
            .bytes()
            .enumerate()
            .filter(|(_, b)| *b == b'\n')
            .map(|(i, _)| i)
            .collect();
        let lines: Vec<&str> = content.split('\n').collect();
        let mut selected: Vec<(usize, usize)> = Vec::new();
        let mut seen_lines: HashSet<usize> = HashSet::new();
        let mut seen = 0usize;
        for m in self.re.find_iter(&content) {
            let line_num = newline_positions.partition_point(|&p| p <= m.start()) + 1;
            if !seen_lines.insert(line_num) {
                continue;
            }
            seen += 1;
            if seen <= self.offset {
                continue;
            }
            selected.push((line_num, m.start()));
            if self.head.is_some_and(|h| selected.len() >= h) {
                break;
            }
        }
        if selected.is_empty() {
            return Ok(none);
        }
        out.push(format!("\n📄 {shown}:"));
        let mut added = 0usize;
        let mut last_line = 0usize;
        for (line_num, start) in selected {
            let Some(line) = lines.get(line_num - 1) else {
                continue;
            };
            let line_start = if line_num <= 1 {
                0
            } else {
                newline_positions[line_num - 2] + 1
            };
            let in_line = char_index(line, start.saturating_sub(line_start));
            out.push(format!(
                "    {line_num}: {}",
                bounded_excerpt(line, Some(in_line))
            ));
            added += 1;
            last_line = line_num;
            if self.head.is_some_and(|h| added >= h) {
                break;
            }
        }
        if truncated {
            out.push(format!(
                "    #TRUNCATION: file scanned only up to {} chars for multiline matching; matches beyond this point may be missed.",
                thousands(MAX_MULTILINE_BYTES)
            ));
        }
        Ok(FileScan {
            header_added: true,
            added,
            last_line,
        })
    }

    /// The paging notice under a file whose matches hit `head_limit`: the
    /// exact next call, the call for all matches, and how to size them.
    fn paging_notice(&self, shown: &str, added: usize, last_line: usize, head: usize) -> String {
        let req = self.req;
        let next_offset = self.offset + added;
        let mut extras = String::new();
        if req.case_sensitive {
            extras.push_str(", case_sensitive=True");
        }
        if req.multiline {
            extras.push_str(", multiline=True");
        }
        if req.context_lines != 0 {
            extras.push_str(&format!(", context_lines={}", req.context_lines));
        }
        if req.include_hidden {
            extras.push_str(", include_hidden=True");
        }
        let pattern = py_repr(&req.pattern);
        let path = py_repr(shown);
        format!(
            "    #TRUNCATION: matches {}-{next_offset} of this file shown; head_limit={head} stopped the scan at line {last_line}, further matches exist below it.\n    Next {head}: search_files(pattern={pattern}, path={path}, head_limit={head}, offset={next_offset}{extras})\n    All of them: search_files(pattern={pattern}, path={path}, head_limit=None{extras})\n    Too many? refine `pattern`, then size it with search_files(pattern=..., path={path}, output_mode='count').",
            self.offset + 1
        )
    }
}

/// The note added when the walk stopped at [`MAX_WALK_ENTRIES`].
fn walk_budget_note() -> String {
    format!(
        "Note: the search stopped after examining {} directory entries — the tree is large and was not fully scanned. Narrow `path` or `file_pattern` to search faster.",
        thousands(MAX_WALK_ENTRIES as u64)
    )
}

/// " in 1.2s" for a measured duration, or nothing when the guest's clock
/// does not move.
fn elapsed_text(seconds: f64) -> String {
    if seconds > 0.0 {
        format!(" in {seconds:.1}s")
    } else {
        String::new()
    }
}

/// Runs `search_files`, returning the text for the model.
fn search_files(req: &SearchRequest) -> String {
    let output_mode = match canonical_output_mode(&req.output_mode) {
        Ok(mode) => mode,
        Err(got) => {
            return format!(
                "Error: output_mode must be one of content|files_with_matches|count (got {}).",
                py_repr(&got)
            )
        }
    };
    let shown_root = display_path(&req.path);
    let root = PathBuf::from(&req.path);
    let policy = Policy::for_path(&root);
    if policy.is_ignored(&root, root.is_dir()) {
        return format!("Error: Path '{shown_root}' is ignored by .abstractignore policy");
    }
    // What Python's `re` refuses is refused in its words; what only the
    // `regex` crate refuses, in the crate's.
    match crate::reerror::python_refusal(&req.pattern) {
        Some(r @ Refusal::Other(_)) => {
            return format!("Error performing search: {}", r.text(&req.pattern))
        }
        Some(r) => {
            let why = r.text(&req.pattern);
            return format!("Error: Invalid regex pattern '{}': {why}", req.pattern);
        }
        None => {}
    }
    let re = match RegexBuilder::new(&req.pattern)
        .case_insensitive(!req.case_sensitive)
        .multi_line(req.multiline)
        .dot_matches_new_line(req.multiline)
        .build()
    {
        Ok(re) => re,
        Err(e) => {
            let why = crate::reerror::crate_reason(&req.pattern, &e);
            return format!("Error: Invalid regex pattern '{}': {why}", req.pattern);
        }
    };

    let meta = std::fs::metadata(&root).ok();
    let mut ignore_set: HashSet<String> = DEFAULT_IGNORES.iter().map(|s| s.to_string()).collect();
    ignore_set.extend(req.ignore_dirs.iter().cloned());
    let mut candidates = Candidates {
        single: None,
        walker: None,
        queue: VecDeque::new(),
        include_hidden: req.include_hidden,
        file_globs: (req.file_pattern != "*").then(|| GlobSet::new(&req.file_pattern)),
        ignore_set,
        policy,
    };
    match &meta {
        Some(m) if m.is_file() => candidates.single = Some(root.clone()),
        Some(m) if m.is_dir() => candidates.walker = Some(Walker::new(&root, MAX_WALK_ENTRIES)),
        _ => return format!("Error: Path '{shown_root}' does not exist"),
    }

    let search = Search {
        req,
        re,
        head: positive(req.head_limit),
        offset: req.offset.max(0) as usize,
        context_n: req.context_lines.clamp(0, 10) as usize,
    };
    let max_hits = positive(req.max_hits);

    if output_mode != "content" {
        return alternate_modes(&search, output_mode, &mut candidates, &shown_root, max_hits);
    }

    let started = Instant::now();
    let mut results: Vec<String> = Vec::new();
    let mut matching_files = 0usize;
    let mut scanned_files = 0usize;
    let mut stopped_at_max_hits = false;
    let mut pending: Option<PathBuf> = None;
    for file_path in candidates.by_ref() {
        if max_hits.is_some_and(|m| matching_files >= m) {
            stopped_at_max_hits = true;
            pending = Some(file_path);
            break;
        }
        let Some(file) = open_text(&file_path) else {
            continue;
        };
        scanned_files += 1;
        let shown = display_path(&file_path.to_string_lossy());
        let scan = if req.multiline {
            search.scan_multiline(file, &shown, &mut results)
        } else {
            search.scan_lines(file, &shown, &mut results)
        };
        match scan {
            Ok(scan) => {
                if let Some(head) = search
                    .head
                    .filter(|h| scan.header_added && scan.added >= *h)
                {
                    results.push(search.paging_notice(&shown, scan.added, scan.last_line, head));
                }
                if scan.header_added {
                    matching_files += 1;
                }
            }
            Err(e) => results.push(format!(
                "\n⚠️  Error reading {shown}: {}",
                io_error_text(&e)
            )),
        }
    }

    // Count the remaining matching files exactly, within a budget.
    let mut total_matching_files: Option<usize> = None;
    if stopped_at_max_hits && !req.multiline {
        let mut more_matching = 0usize;
        let mut exhausted = true;
        for (examined, path) in pending.into_iter().chain(candidates.by_ref()).enumerate() {
            if examined >= REMAINDER_BUDGET {
                exhausted = false;
                break;
            }
            if file_has_line_match(&path, &search.re) {
                more_matching += 1;
            }
        }
        if exhausted && !candidates.budget_exhausted() {
            total_matching_files = Some(matching_files + more_matching);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let slow_or_large = scanned_files >= 200 || elapsed >= 2.0;
    let budget_hit = candidates.budget_exhausted();
    let pattern = &req.pattern;

    if results.is_empty() {
        let mut base = format!("No matches found for pattern '{pattern}'");
        if slow_or_large {
            base.push_str(&format!(
                "\n\nNote: scanned {scanned_files} file(s){}. Narrow `path` or `file_pattern` to search faster.",
                elapsed_text(elapsed)
            ));
            if req.include_hidden {
                base.push_str(" (include_hidden=True walks hidden dirs like .git-siblings — drop it unless you need them.)");
            }
        }
        if budget_hit {
            base.push_str(&format!("\n\n{}", walk_budget_note()));
        }
        return base;
    }

    let header = match total_matching_files {
        Some(total) if total != matching_files => format!(
            "Search results for pattern '{pattern}' under '{shown_root}' (showing {matching_files} of {total} matching files):"
        ),
        _ => format!(
            "Search results for pattern '{pattern}' under '{shown_root}' in {matching_files} files:"
        ),
    };
    let mut out = format!("{header}\n{}", results.join("\n"));

    if let (true, Some(max)) = (stopped_at_max_hits, max_hits) {
        let head_repr = search
            .head
            .map_or_else(|| "None".to_string(), |h| h.to_string());
        let mut rerun = format!(
            "If you want to see more results, re-run: search_files(pattern={}, path={}, file_pattern={}, head_limit={head_repr}, max_hits={}",
            json_dumps(pattern),
            json_dumps(&req.path),
            json_dumps(&req.file_pattern),
            max * 2
        );
        if req.multiline {
            rerun.push_str(", multiline=True");
        }
        if req.include_hidden {
            rerun.push_str(", include_hidden=True");
        }
        rerun.push(')');
        match total_matching_files {
            Some(total) => {
                let remaining = total.saturating_sub(matching_files);
                if remaining > 0 {
                    out.push_str(&format!(
                        "\n\nNote: {remaining} more matching files available (increase max_hits to see more results or set max_hits=None to show all results).\n{rerun}"
                    ));
                }
            }
            None => {
                out.push_str(&format!(
                    "\n\nNote: search stopped after reaching max_hits={max} (more matching files may exist; increase max_hits or set max_hits=None to show all).\n{rerun}"
                ));
                if req.include_hidden {
                    out.push_str("\n(Large tree: narrow `path`/`file_pattern` or drop include_hidden=True to search faster.)");
                }
            }
        }
    } else {
        if slow_or_large {
            out.push_str(&format!(
                "\n\nNote: scanned {scanned_files} file(s){}. Narrow `path` or `file_pattern` to search faster.",
                elapsed_text(elapsed)
            ));
            if req.include_hidden {
                out.push_str(
                    " (include_hidden=True walks hidden dirs — drop it unless you need them.)",
                );
            }
        }
        if budget_hit {
            out.push_str(&format!("\n\n{}", walk_budget_note()));
        }
    }
    out
}

/// The `files_with_matches` and `count` output modes: matching paths, or
/// match counts per file.
fn alternate_modes(
    search: &Search,
    mode: &str,
    candidates: &mut Candidates,
    shown_root: &str,
    max_hits: Option<usize>,
) -> String {
    let req = search.req;
    let mut matched: Vec<(String, usize)> = Vec::new();
    let mut capped = false;
    let mut multiline_truncated = false;
    for path in candidates.by_ref() {
        if max_hits.is_some_and(|m| matched.len() >= m) {
            capped = true;
            break;
        }
        let Some(file) = open_text(&path) else {
            continue;
        };
        let count = if req.multiline {
            match read_multiline(file) {
                Ok((content, truncated)) => {
                    multiline_truncated |= truncated;
                    search.re.find_iter(&content).count()
                }
                Err(_) => continue,
            }
        } else {
            let mut count = 0usize;
            let mut failed = false;
            for line in text_lines(file) {
                match line {
                    Ok(line) if search.re.is_match(&line) => {
                        count += 1;
                        if mode == "files_with_matches" {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                continue;
            }
            count
        };
        if count > 0 {
            matched.push((display_path(&path.to_string_lossy()), count));
        }
    }
    let cap_text = thousands(MAX_MULTILINE_BYTES);
    let pattern = &req.pattern;
    if matched.is_empty() {
        let mut base = format!("No matches found for pattern '{pattern}'");
        if multiline_truncated {
            base.push_str(&format!("\n\n#TRUNCATION: multiline scanning was capped at {cap_text} chars per file; a match past the cap would be missed here."));
        }
        if candidates.budget_exhausted() {
            base.push_str(&format!("\n\n{}", walk_budget_note()));
        }
        return base;
    }
    let n = matched.len();
    let (header, body) = if mode == "files_with_matches" {
        (
            format!("Files matching pattern '{pattern}' under '{shown_root}' ({n} file(s)):"),
            matched
                .iter()
                .map(|(p, _)| p.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        )
    } else {
        (
            format!("Match counts for pattern '{pattern}' under '{shown_root}' ({n} file(s)):"),
            matched
                .iter()
                .map(|(p, c)| format!("{c}\t{p}"))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    };
    let mut out = format!("{header}\n{body}");
    if multiline_truncated {
        out.push_str(&format!("\n\n#TRUNCATION: multiline scanning was capped at {cap_text} chars per file; counts may undercount and matches past the cap may be missed."));
    }
    if let (true, Some(max)) = (capped, max_hits) {
        out.push_str(&format!("\n\nNote: stopped at max_hits={max} (more matching files may exist; increase max_hits or set max_hits=None to show all)."));
    } else if candidates.budget_exhausted() {
        out.push_str(&format!("\n\n{}", walk_budget_note()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_modes() {
        assert_eq!(canonical_output_mode("content"), Ok("content"));
        assert_eq!(canonical_output_mode(" Lines "), Ok("content"));
        assert_eq!(canonical_output_mode(""), Ok("content"));
        assert_eq!(canonical_output_mode("paths"), Ok("files_with_matches"));
        assert_eq!(canonical_output_mode("count"), Ok("count"));
        assert_eq!(
            canonical_output_mode("count_files"),
            Err("count_files".into())
        );
    }

    #[test]
    fn limits() {
        assert_eq!(positive(Some(10)), Some(10));
        assert_eq!(positive(Some(0)), None);
        assert_eq!(positive(Some(-1)), None);
        assert_eq!(positive(None), None);
    }

    #[test]
    fn short_lines_are_kept() {
        assert_eq!(bounded_excerpt("  let x = 1;  \n", Some(2)), "  let x = 1;");
    }

    #[test]
    fn long_lines_keep_the_match_visible() {
        let line = format!("{}NEEDLE{}", "a".repeat(1000), "b".repeat(1000));
        let out = bounded_excerpt(&line, Some(1000));
        assert_eq!(out.chars().count(), 400);
        assert!(out.starts_with('…') && out.ends_with('…'));
        assert!(out.contains("NEEDLE"));
        // A match at the start keeps the beginning and one ellipsis.
        let out = bounded_excerpt(&line, Some(0));
        assert_eq!(out.chars().count(), 400);
        assert!(out.starts_with("aaa") && out.ends_with('…'));
        // Without a match position the line is cut at 399 characters.
        let out = bounded_excerpt(&line, None);
        assert_eq!(out.chars().count(), 400);
        assert!(out.ends_with('…'));
    }

    #[test]
    fn elapsed_is_hidden_when_clock_stands_still() {
        assert_eq!(elapsed_text(0.0), "");
        assert_eq!(elapsed_text(2.26), " in 2.3s");
    }
}

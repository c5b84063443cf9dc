//! `list_files`: lists files and directories whose names match glob
//! patterns, newest first (reference: abstractcore `list_files`,
//! common_tools.py 2021-2374).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::json;
use stepwell_guest::tool::{EffectClass, ToolError, ToolSpec};

use crate::args::Args;
use crate::glob::{split_patterns, GlobSet};
use crate::text::{display_path, io_error_text, json_dumps, py_list_repr, thousands};
use crate::walk::{read_entries, relative_display, Budget, Walker, MAX_WALK_ENTRIES};
use stepwell_abstractignore::Policy;

/// Matched entries collected beyond `head_limit` before the listing stops
/// and reports "many" instead of an exact count (the reference's
/// `REMAINDER_BUDGET`).
const REMAINDER_BUDGET: usize = 500;

/// The tool's spec.
pub fn spec() -> ToolSpec {
    ToolSpec::new(
        "list_files",
        "List files/directories by name/path using glob patterns (case-insensitive). Does NOT search file contents; head_limit defaults to 10 results.\n\nWhen to use: Use to find files by filename/path; prefer narrow patterns like '*.py|*.md' (avoid '*') and raise head_limit if needed. For file contents, use search_files().",
        EffectClass::Read,
        json!({
            "type": "object",
            "properties": {
                "directory_path": {
                    "type": "string", "default": ".",
                    "description": "Path to the directory to list files from (default: \".\" for current directory)."
                },
                "pattern": {
                    "type": "string", "default": "*",
                    "description": "Glob pattern(s) matched case-insensitively against entry names. Use \"|\" to separate multiple patterns (default: \"*\")."
                },
                "recursive": {
                    "type": "boolean", "default": false,
                    "description": "Whether to search recursively in subdirectories (default: false)."
                },
                "include_hidden": {
                    "type": "boolean", "default": false,
                    "description": "Whether to include hidden files/directories starting with '.' (default: false)."
                },
                "head_limit": {
                    "type": "integer", "default": 10,
                    "description": "Maximum number of entries to return (default: 10; null or 0 for unlimited)."
                }
            },
            "required": []
        }),
    )
}

/// What one call asks for.
#[derive(Debug, Clone)]
struct ListRequest {
    directory_path: String,
    pattern: String,
    recursive: bool,
    include_hidden: bool,
    /// `None` means no limit.
    head_limit: Option<i64>,
}

/// Runs a call.
pub fn run(args: &Args) -> Result<String, ToolError> {
    let req = ListRequest {
        directory_path: args.string_or("directory_path", ".")?,
        pattern: args.string_or("pattern", "*")?,
        recursive: args.bool_or("recursive", false)?,
        include_hidden: args.bool_or("include_hidden", false)?,
        head_limit: args.limit("head_limit", 10)?,
    };
    Ok(list_files(&req))
}

/// Matched entries gathered while walking, with the counts for the
/// composition summary.
struct Collector {
    /// Where the listing starts (for relative paths).
    base: PathBuf,
    /// Stop collecting after this many entries (`None`: no limit).
    cap: Option<usize>,
    recursive: bool,
    /// `(path, is_dir)` in walk order.
    collected: Vec<(PathBuf, bool)>,
    /// Whether every matched entry was collected.
    exhausted: bool,
    ext_counts: HashMap<String, usize>,
    subfolder_counts: HashMap<String, usize>,
}

impl Collector {
    /// Takes a matched entry; returns `false` (and collects nothing) once
    /// the cap is reached, which ends the walk.
    fn offer(&mut self, path: &Path, is_dir: bool, name: &str) -> bool {
        if self.cap.is_some_and(|cap| self.collected.len() >= cap) {
            self.exhausted = false;
            return false;
        }
        self.collected.push((path.to_path_buf(), is_dir));
        if !is_dir && name.contains('.') && !name.starts_with('.') {
            let ext = name.rsplit('.').next().unwrap_or_default().to_lowercase();
            *self.ext_counts.entry(ext).or_insert(0) += 1;
        }
        if self.recursive {
            if let Ok(rel) = path.strip_prefix(&self.base) {
                let mut parts = rel.components();
                if let (Some(top), Some(_)) = (parts.next(), parts.next()) {
                    let top = top.as_os_str().to_string_lossy().into_owned();
                    *self.subfolder_counts.entry(top).or_insert(0) += 1;
                }
            }
        }
        true
    }
}

/// A path's modification time (following links); the epoch when it cannot
/// be read.
fn mtime(path: &Path) -> SystemTime {
    fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Sorts `(path, is_dir)` entries newest first, keeping the walk order of
/// entries with equal times.
fn sort_newest_first(entries: &mut [(PathBuf, bool)]) {
    entries.sort_by_cached_key(|(p, _)| Reverse(mtime(p)));
}

/// The `count .ext` / `name/ count` items of the composition summary:
/// highest counts first, then by name, at most `max` of them.
fn top_counts(counts: &HashMap<String, usize>, max: usize) -> Vec<(String, usize)> {
    let mut items: Vec<(String, usize)> = counts.iter().map(|(k, v)| (k.clone(), *v)).collect();
    items.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    items.truncate(max);
    items
}

/// The composition line shown under a truncated listing.
fn composition_line(
    ext_counts: &HashMap<String, usize>,
    subfolder_counts: &HashMap<String, usize>,
    complete: bool,
) -> String {
    let scope = if complete {
        "total"
    } else {
        "of what was scanned"
    };
    let exts: Vec<String> = top_counts(ext_counts, 8)
        .into_iter()
        .map(|(e, n)| format!("{n} .{e}"))
        .collect();
    let subs: Vec<String> = top_counts(subfolder_counts, 6)
        .into_iter()
        .map(|(name, n)| format!("{name}/ {n}"))
        .collect();
    let mut line = format!("Composition ({scope}): {}", exts.join("; "));
    if !subs.is_empty() {
        line.push_str(&format!(" | subfolders: {}", subs.join("; ")));
    }
    line
}

/// The note added when the walk stopped at [`MAX_WALK_ENTRIES`].
fn walk_budget_note() -> String {
    format!(
        "Note: the listing stopped after examining {} directory entries — the tree is large and was not fully scanned. Narrow with a subfolder (directory_path=...) or a more specific pattern (e.g. '*.py').",
        thousands(MAX_WALK_ENTRIES as u64)
    )
}

/// Whether `dir` has any entry, and any non-hidden one (hidden entries
/// count as visible when `include_hidden`).
fn probe_entries(dir: &Path, include_hidden: bool) -> (bool, bool) {
    let mut any = false;
    let Ok(iter) = fs::read_dir(dir) else {
        return (false, false);
    };
    for item in iter.take(MAX_WALK_ENTRIES).flatten() {
        if crate::walk::is_excluded(&item.path()) {
            continue;
        }
        any = true;
        if include_hidden || !item.file_name().to_string_lossy().starts_with('.') {
            return (true, true);
        }
    }
    (any, false)
}

/// Runs `list_files`, returning the text for the model.
fn list_files(req: &ListRequest) -> String {
    let shown_dir = display_path(&req.directory_path);
    let directory = PathBuf::from(&req.directory_path);
    let policy = Policy::for_path(&directory);
    if policy.is_ignored(&directory, true) {
        return format!("Error: Directory '{shown_dir}' is ignored by .abstractignore policy");
    }
    let meta = match fs::metadata(&directory) {
        Ok(m) => m,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            return format!("Error: Directory '{shown_dir}' does not exist");
        }
        Err(e) => return format!("Error listing files: {}", io_error_text(&e)),
    };
    if !meta.is_dir() {
        return format!("Error: '{shown_dir}' is not a directory");
    }
    let (has_any_entries, has_any_visible_entries) = probe_entries(&directory, req.include_hidden);

    let patterns = split_patterns(&req.pattern);
    let path_shaped: Vec<String> = patterns
        .iter()
        .filter(|p| p.contains('/'))
        .cloned()
        .collect();
    if !path_shaped.is_empty() {
        return format!(
            "Error: list_files matches file/directory NAMES only, not path segments — pattern(s) {} contain '/'. To list a subdirectory, set directory_path to it (e.g. directory_path=\"src\", pattern=\"*.py\") and add recursive=True to descend. To find files by content or path across a tree, use search_files(...).",
            py_list_repr(&path_shaped)
        );
    }
    let globs = GlobSet::new(&req.pattern);

    let effective_head = req.head_limit.filter(|h| *h > 0).map(|h| h as usize);
    let mut collector = Collector {
        base: directory.clone(),
        cap: effective_head.map(|h| h + REMAINDER_BUDGET),
        recursive: req.recursive,
        collected: Vec::new(),
        exhausted: true,
        ext_counts: HashMap::new(),
        subfolder_counts: HashMap::new(),
    };
    let mut hidden_match_seen = false;

    let budget_hit = if req.recursive {
        let mut walker = Walker::new(&directory, MAX_WALK_ENTRIES);
        'walk: while let Some(listing) = walker.next_dir() {
            let mut kept = Vec::new();
            for d in listing.dirs {
                if !req.include_hidden && d.name.starts_with('.') {
                    hidden_match_seen |= globs.matches(&d.name);
                    continue;
                }
                if !policy.is_ignored_entry(&d.path, d.is_dir, d.is_symlink) {
                    kept.push(d);
                }
            }
            for d in &kept {
                if globs.matches(&d.name) && !collector.offer(&d.path, true, &d.name) {
                    break 'walk;
                }
            }
            for f in &listing.files {
                if !req.include_hidden && f.name.starts_with('.') {
                    hidden_match_seen |= globs.matches(&f.name);
                    continue;
                }
                if !globs.matches(&f.name)
                    || policy.is_ignored_entry(&f.path, f.is_dir, f.is_symlink)
                {
                    continue;
                }
                if !collector.offer(&f.path, false, &f.name) {
                    break 'walk;
                }
            }
            walker.descend(&kept);
        }
        walker.budget.exhausted
    } else {
        let mut budget = Budget::new(MAX_WALK_ENTRIES);
        let entries = read_entries(&directory, &mut budget).unwrap_or_default();
        for e in entries {
            if !req.include_hidden && e.name.starts_with('.') {
                hidden_match_seen |= globs.matches(&e.name);
                continue;
            }
            if !globs.matches(&e.name) || policy.is_ignored_entry(&e.path, e.is_dir, e.is_symlink) {
                continue;
            }
            if !collector.offer(&e.path, e.is_dir, &e.name) {
                break;
            }
        }
        budget.exhausted
    };
    if budget_hit {
        collector.exhausted = false;
    }

    let pattern = &req.pattern;
    if collector.collected.is_empty() {
        let message = if !has_any_entries {
            format!("Directory '{shown_dir}' exists but is empty")
        } else if !req.include_hidden && !has_any_visible_entries {
            format!("Directory '{shown_dir}' exists but contains only hidden entries (use include_hidden=True)")
        } else if !req.include_hidden && hidden_match_seen {
            format!("Directory '{shown_dir}' exists but no VISIBLE entries match pattern '{pattern}' — matching hidden entries exist; use include_hidden=True to see them")
        } else {
            format!("Directory '{shown_dir}' exists but no entries match pattern '{pattern}'")
        };
        if budget_hit {
            return format!("{message}\n\n{}", walk_budget_note());
        }
        return message;
    }

    let stream_exhausted = collector.exhausted;
    let mut entries = std::mem::take(&mut collector.collected);
    let total_files = if stream_exhausted {
        sort_newest_first(&mut entries);
        Some(entries.len())
    } else {
        None
    };

    let mut is_truncated = false;
    let mut more_is_lower_bound = false;
    let mut limit_note = String::new();
    if let Some(head) = effective_head.filter(|h| entries.len() > *h) {
        entries.truncate(head);
        match total_files {
            Some(total) => limit_note = format!(" (showing {head} of {total} entries)"),
            None => {
                sort_newest_first(&mut entries);
                more_is_lower_bound = true;
                limit_note = format!(" (showing {head} of many entries)");
            }
        }
        is_truncated = true;
    }

    let hidden_note = if req.include_hidden {
        ""
    } else {
        " (hidden entries excluded)"
    };
    let mut output = vec![format!(
        "Entries in '{shown_dir}' matching '{pattern}'{hidden_note}{limit_note}:"
    )];
    for (path, _) in &entries {
        let shown = relative_display(path, &directory);
        match fs::metadata(path) {
            Ok(m) if m.is_file() => {
                output.push(format!("  {shown} ({} bytes)", thousands(m.len())));
            }
            Ok(m) if m.is_dir() => {
                let suffix = if shown.ends_with('/') { "" } else { "/" };
                output.push(format!("  {shown}{suffix}"));
            }
            _ => {}
        }
    }

    if let (true, Some(head)) = (is_truncated, effective_head) {
        let suggested = match total_files {
            Some(total) if !more_is_lower_bound => {
                output.push(format!(
                    "\nNote: {} more entries available (increase head_limit to see more results or set head_limit=None to show all results).",
                    total - head
                ));
                total.min(head * 2)
            }
            _ => {
                output.push(format!(
                    "\nNote: more entries exist beyond the {head} shown — the tree is large and was not fully scanned. Narrow with a subfolder (directory_path=...), a more specific pattern (e.g. '*.py'), or a tighter regex; or set head_limit higher to see more."
                ));
                head * 2
            }
        };
        if suggested != head {
            let mut rerun = format!(
                "If you want to see more results, re-run: list_files(directory_path={}, pattern={}, head_limit={suggested}",
                json_dumps(&req.directory_path),
                json_dumps(pattern)
            );
            if req.recursive {
                rerun.push_str(", recursive=True");
            }
            if req.include_hidden {
                rerun.push_str(", include_hidden=True");
            }
            rerun.push(')');
            output.push(rerun);
        }
    }

    if is_truncated && (!collector.ext_counts.is_empty() || !collector.subfolder_counts.is_empty())
    {
        output.push(format!(
            "\n{}",
            composition_line(
                &collector.ext_counts,
                &collector.subfolder_counts,
                stream_exhausted
            )
        ));
    }

    if budget_hit && !is_truncated {
        output.push(format!("\n{}", walk_budget_note()));
    }

    output.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composition_orders_by_count_then_name() {
        let mut exts = HashMap::new();
        exts.insert("py".to_string(), 3);
        exts.insert("md".to_string(), 3);
        exts.insert("rs".to_string(), 5);
        let mut subs = HashMap::new();
        subs.insert("src".to_string(), 4);
        assert_eq!(
            composition_line(&exts, &subs, true),
            "Composition (total): 5 .rs; 3 .md; 3 .py | subfolders: src/ 4"
        );
        assert_eq!(
            composition_line(&exts, &HashMap::new(), false),
            "Composition (of what was scanned): 5 .rs; 3 .md; 3 .py"
        );
    }

    #[test]
    fn spec_is_an_object_schema() {
        let s = spec();
        assert_eq!(s.name, "list_files");
        assert_eq!(s.parameters["type"], "object");
        assert_eq!(s.parameters["properties"]["head_limit"]["default"], 10);
    }
}

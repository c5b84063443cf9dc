//! Single-file unified diffs for `edit_file`'s diff mode: parsing, and
//! applying hunks by anchoring their context in the file (header line
//! numbers are hints only), after the reference's `_parse_unified_diff`
//! and `_apply_unified_diff` (common_tools.py 11866-12169).

use crate::difflib::parse_hunk_header;
use crate::text::{py_repr, py_splitlines, py_strip};

/// How far (in lines) from the header position an ambiguous context may be
/// resolved to its only nearby match.
const CONTEXT_OFFSET_TOLERANCE: usize = 200;

/// One hunk of a unified diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The header's old start line (1-based; 0 for an insertion at the top).
    pub old_start: usize,
    /// The header's old length (1 when absent).
    pub old_len: usize,
    /// The hunk's body lines, as written.
    pub lines: Vec<String>,
}

/// A parsed diff: the file its headers name (if any) and its hunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    /// The `+++` path (without `a/`/`b/`), when headers are present.
    pub header_path: Option<String>,
    /// The hunks, in order.
    pub hunks: Vec<Hunk>,
}

/// A path of a `---`/`+++` header: trimmed, without a tab- or
/// space-separated suffix (a timestamp), without an `a/` or `b/` prefix.
fn normalize_diff_path(raw: &str) -> String {
    let raw = py_strip(raw);
    let raw = py_strip(raw.split('\t').next().unwrap_or_default());
    let raw = py_strip(raw.split(' ').next().unwrap_or_default());
    raw.strip_prefix("a/")
        .or_else(|| raw.strip_prefix("b/"))
        .unwrap_or(raw)
        .to_string()
}

/// Whether the path `candidate` (from a diff header) names the end of the
/// absolute path `target`, component by component.
pub fn is_suffix_path(candidate: &str, target: &str) -> bool {
    let normalized = candidate.replace('\\', "/");
    let candidate_parts: Vec<&str> = normalized
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if candidate_parts.is_empty() {
        return false;
    }
    let target_parts: Vec<&str> = target.split('/').collect();
    candidate_parts.len() <= target_parts.len()
        && target_parts[target_parts.len() - candidate_parts.len()..] == candidate_parts[..]
}

/// Parses a single-file unified diff. Errors are the reference's texts.
pub fn parse_unified_diff(patch: &str) -> Result<Diff, String> {
    let lines = py_splitlines(patch, false);
    let mut header_path: Option<String> = None;
    let mut hunks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(old) = line.strip_prefix("--- ") {
            let old_path = normalize_diff_path(old);
            i += 1;
            let Some(new) = lines.get(i).and_then(|l| l.strip_prefix("+++ ")) else {
                return Err("Invalid unified diff: missing '+++ ' header after '--- '".into());
            };
            let new_path = normalize_diff_path(new);
            if old_path != "/dev/null" && new_path != "/dev/null" {
                if header_path.is_none() {
                    header_path = Some(new_path);
                } else if header_path.as_deref() != Some(new_path.as_str()) {
                    return Err("Unified diff appears to reference multiple files".into());
                }
            }
            i += 1;
            continue;
        }
        if line.starts_with("@@") {
            let Some((old_start, old_len, _, _)) = parse_hunk_header(line, true) else {
                return Err(format!("Invalid hunk header: {line}"));
            };
            let old_len = old_len.unwrap_or(1);
            i += 1;
            let mut body = Vec::new();
            let mut old_seen = 0usize;
            while i < lines.len() {
                let next = lines[i];
                if next.starts_with("@@") || next.starts_with("diff --git ") {
                    break;
                }
                if next.starts_with("--- ") && old_seen >= old_len {
                    break;
                }
                body.push(next.to_string());
                if next.is_empty() || next.starts_with([' ', '-']) {
                    old_seen += 1;
                }
                i += 1;
            }
            hunks.push(Hunk {
                old_start,
                old_len,
                lines: body,
            });
            continue;
        }
        i += 1;
    }
    if hunks.is_empty() {
        return Err("No hunks found in diff (missing '@@ ... @@' sections)".into());
    }
    Ok(Diff { header_path, hunks })
}

/// The `(prefix, text)` pairs of a hunk body: `\ No newline at end of
/// file` markers dropped, empty lines read as blank context.
fn normalize_hunk_body(lines: &[String]) -> Result<Vec<(char, String)>, String> {
    let mut body = Vec::new();
    for line in lines {
        if line == "\\ No newline at end of file" {
            continue;
        }
        let mut chars = line.chars();
        let Some(prefix) = chars.next() else {
            body.push((' ', String::new()));
            continue;
        };
        if !matches!(prefix, ' ' | '-' | '+') {
            return Err(format!(
                "invalid diff line prefix {} (expected one of ' ', '+', '-')",
                py_repr(&prefix.to_string())
            ));
        }
        body.push((prefix, chars.as_str().to_string()));
    }
    Ok(body)
}

/// How a hunk's context was matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    /// Line for line.
    Exact,
    /// Ignoring leading and trailing whitespace.
    Flexible,
}

/// The positions `>= start` where `old` occurs in `lines` under `eq`.
fn find_positions(
    lines: &[&str],
    old: &[&str],
    start: usize,
    eq: fn(&str, &str) -> bool,
) -> Vec<usize> {
    let (n, k) = (lines.len(), old.len());
    if k > n {
        return Vec::new();
    }
    (start..=n - k)
        .filter(|&i| old.iter().enumerate().all(|(j, o)| eq(lines[i + j], o)))
        .collect()
}

/// Exact line equality.
fn exact_eq(a: &str, b: &str) -> bool {
    a == b
}

/// Equality ignoring leading and trailing whitespace.
fn flex_eq(a: &str, b: &str) -> bool {
    py_strip(a) == py_strip(b)
}

/// Where a hunk's old block (context and removals) sits in the file, at or
/// after `min_idx`: a unique match anywhere; among several, the header
/// position or the only one within 200 lines of it; with `flexible`, a
/// whitespace-insensitive match when no exact one exists. Errors explain
/// How two lines are compared: exactly, or ignoring whitespace.
type LineEq = fn(&str, &str) -> bool;

/// the failure.
fn find_hunk_anchor(
    lines: &[&str],
    old: &[&str],
    hint_idx: usize,
    min_idx: usize,
    flexible: bool,
) -> Result<(usize, Tier), String> {
    let mut tiers: Vec<(Tier, LineEq)> = vec![(Tier::Exact, exact_eq)];
    if flexible {
        tiers.push((Tier::Flexible, flex_eq));
    }
    for (tier, eq) in tiers {
        let positions = find_positions(lines, old, min_idx, eq);
        if positions.is_empty() {
            continue;
        }
        if positions.len() == 1 {
            return Ok((positions[0], tier));
        }
        if positions.contains(&hint_idx) {
            return Ok((hint_idx, tier));
        }
        let near: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|p| p.abs_diff(hint_idx) <= CONTEXT_OFFSET_TOLERANCE)
            .collect();
        if near.len() == 1 {
            return Ok((near[0], tier));
        }
        let locs = line_list(&positions[..positions.len().min(6)]);
        let more = if positions.len() > 6 {
            format!(" (and {} more)", positions.len() - 6)
        } else {
            String::new()
        };
        return Err(format!(
            "context is ambiguous: it matches at lines {locs}{more} and the hunk header (line {}) does not match any of them exactly. Add more context lines to the hunk to make the target unique.",
            hint_idx + 1
        ));
    }
    let mut earlier = find_positions(lines, old, 0, exact_eq);
    if flexible && earlier.is_empty() {
        earlier = find_positions(lines, old, 0, flex_eq);
    }
    if !earlier.is_empty() && earlier.iter().all(|p| *p < min_idx) {
        return Err(format!(
            "context only matches earlier in the file (line {}), in a region already consumed by a previous hunk. Hunks must be ordered top-to-bottom and must not overlap.",
            line_list(&earlier[..earlier.len().min(6)])
        ));
    }
    let got = lines.get(hint_idx).copied().unwrap_or("<end of file>");
    let expected_first = old.first().copied().unwrap_or("");
    Err(format!(
        "context not found in the file. Expected the hunk's first context/removal line {}; the header points at line {}, where the file has {}. Re-read the file and regenerate the patch from its current content, or use find/replace mode.",
        py_repr(expected_first),
        hint_idx + 1,
        py_repr(got)
    ))
}

/// 0-based positions as 1-based line numbers, comma-separated.
fn line_list(positions: &[usize]) -> String {
    positions
        .iter()
        .map(|p| (p + 1).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Applies `hunks` to `original` (LF text). Returns the new text and notes
/// on hunks applied away from their header line or by flexible matching.
pub fn apply_unified_diff(
    original: &str,
    hunks: &[Hunk],
    flexible: bool,
) -> Result<(String, Vec<String>), String> {
    let lines = py_splitlines(original, false);
    let mut out: Vec<String> = Vec::new();
    let mut cursor = 0usize;
    let mut notes = Vec::new();
    for (number, hunk) in hunks.iter().enumerate() {
        let number = number + 1;
        let mut body =
            normalize_hunk_body(&hunk.lines).map_err(|e| format!("hunk #{number}: {e}"))?;
        let blank = (' ', String::new());
        let lead_blanks = body.iter().take_while(|l| **l == blank).count();
        let mut body = body.split_off(lead_blanks);
        while body.last() == Some(&blank) {
            body.pop();
        }
        let old: Vec<&str> = body
            .iter()
            .filter(|(p, _)| *p != '+')
            .map(|(_, t)| t.as_str())
            .collect();
        let mut hint_idx = hunk.old_start.saturating_sub(1) + lead_blanks;
        let mut tier = Tier::Exact;
        let pos = if old.is_empty() {
            if hunk.old_len == 0 {
                hint_idx = hunk.old_start + lead_blanks;
            }
            if hint_idx > lines.len() {
                return Err(format!(
                    "hunk #{number}: pure insertion at line {} is beyond the end of the file ({} lines) and the hunk has no context lines to anchor on",
                    hunk.old_start,
                    lines.len()
                ));
            }
            hint_idx.max(cursor)
        } else {
            let (pos, found) = find_hunk_anchor(&lines, &old, hint_idx, cursor, flexible)
                .map_err(|why| format!("hunk #{number}: {why}"))?;
            tier = found;
            pos
        };
        if pos != hint_idx {
            notes.push(format!(
                "hunk #{number} applied at line {} (header pointed at line {}; offset {:+})",
                pos + 1,
                hint_idx + 1,
                pos as i64 - hint_idx as i64
            ));
        }
        if tier == Tier::Flexible {
            notes.push(format!(
                "hunk #{number} matched context ignoring leading/trailing whitespace"
            ));
        }
        out.extend(lines[cursor.min(pos)..pos].iter().map(|l| l.to_string()));
        cursor = pos;
        for (prefix, text) in &body {
            match prefix {
                ' ' => {
                    let Some(line) = lines.get(cursor) else {
                        return Err(format!(
                            "hunk #{number}: context runs past the end of the file"
                        ));
                    };
                    out.push((*line).to_string());
                    cursor += 1;
                }
                '-' => cursor += 1,
                _ => out.push(text.clone()),
            }
        }
    }
    if cursor < lines.len() {
        out.extend(lines[cursor..].iter().map(|l| l.to_string()));
    }
    let mut new_text = out.join("\n");
    if original.ends_with('\n') && !new_text.ends_with('\n') {
        new_text.push('\n');
    }
    if original.contains("\r\n") && !new_text.contains("\r\n") {
        new_text = new_text.replace('\n', "\r\n");
    }
    Ok((new_text, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and applies `patch` to `text` with flexible matching.
    fn apply(text: &str, patch: &str) -> Result<(String, Vec<String>), String> {
        let diff = parse_unified_diff(patch)?;
        apply_unified_diff(text, &diff.hunks, true)
    }

    #[test]
    fn applies_a_simple_patch() {
        let patch = "--- a/app.py\n+++ b/app.py\n@@ -1,2 +1,2 @@\n print('hello')\n-print('world')\n+print('there')\n";
        let diff = parse_unified_diff(patch).unwrap();
        assert_eq!(diff.header_path.as_deref(), Some("app.py"));
        assert_eq!(
            apply("print('hello')\nprint('world')\n", patch).unwrap(),
            ("print('hello')\nprint('there')\n".to_string(), vec![])
        );
    }

    #[test]
    fn drifted_hunks_are_anchored_with_a_note() {
        let text = "a\nb\nc\nd\ne\n";
        let patch = "@@ -1,2 +1,2 @@\n d\n-e\n+E\n";
        assert_eq!(
            apply(text, patch).unwrap(),
            (
                "a\nb\nc\nd\nE\n".to_string(),
                vec!["hunk #1 applied at line 4 (header pointed at line 1; offset +3)".to_string()]
            )
        );
    }

    #[test]
    fn flexible_context_keeps_file_lines() {
        let text = "fn x() {\n    let a = 1;\n}\n";
        let patch = "@@ -1,3 +1,3 @@\n fn x() {\n-  let a = 1;\n+    let a = 2;\n }\n";
        let (out, notes) = apply(text, patch).unwrap();
        assert_eq!(out, "fn x() {\n    let a = 2;\n}\n");
        assert_eq!(
            notes,
            vec!["hunk #1 matched context ignoring leading/trailing whitespace"]
        );
    }

    #[test]
    fn pure_insertions_use_the_header() {
        let text = "a\nb\n";
        assert_eq!(apply(text, "@@ -1,0 +2 @@\n+x\n").unwrap().0, "a\nx\nb\n");
        assert_eq!(
            apply(text, "@@ -0,0 +1 @@\n+top\n").unwrap().0,
            "top\na\nb\n"
        );
        assert_eq!(
            apply(text, "@@ -9,0 +10 @@\n+x\n").unwrap_err(),
            "hunk #1: pure insertion at line 9 is beyond the end of the file (2 lines) and the hunk has no context lines to anchor on"
        );
    }

    #[test]
    fn errors_match_the_reference() {
        assert_eq!(
            parse_unified_diff("just text").unwrap_err(),
            "No hunks found in diff (missing '@@ ... @@' sections)"
        );
        assert_eq!(
            parse_unified_diff("--- a/x\n@@ -1 +1 @@\n").unwrap_err(),
            "Invalid unified diff: missing '+++ ' header after '--- '"
        );
        assert_eq!(
            parse_unified_diff("@@ -x +1 @@\n").unwrap_err(),
            "Invalid hunk header: @@ -x +1 @@"
        );
        assert_eq!(
            parse_unified_diff(
                "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n"
            )
            .unwrap_err(),
            "Unified diff appears to reference multiple files"
        );
        assert_eq!(
            apply("a\nb\n", "@@ -1 +1 @@\n-zzz\n+y\n").unwrap_err(),
            "hunk #1: context not found in the file. Expected the hunk's first context/removal line 'zzz'; the header points at line 1, where the file has 'a'. Re-read the file and regenerate the patch from its current content, or use find/replace mode."
        );
        assert_eq!(
            apply("x\nx\n", "@@ -5 +5 @@\n-x\n+y\n").unwrap_err(),
            "hunk #1: context is ambiguous: it matches at lines 1, 2 and the hunk header (line 5) does not match any of them exactly. Add more context lines to the hunk to make the target unique."
        );
        assert_eq!(
            apply("a\n", "@@ -1 +1 @@\n*a\n").unwrap_err(),
            "hunk #1: invalid diff line prefix '*' (expected one of ' ', '+', '-')"
        );
    }

    #[test]
    fn sql_comment_deletions_are_not_headers() {
        let text = "-- note\nselect 1;\n";
        let patch = "@@ -1,2 +1,1 @@\n--- note\n select 1;\n";
        assert_eq!(apply(text, patch).unwrap().0, "select 1;\n");
    }

    #[test]
    fn suffix_paths() {
        assert!(is_suffix_path("src/app.py", "/w/proj/src/app.py"));
        assert!(is_suffix_path("./app.py", "/w/app.py"));
        assert!(!is_suffix_path("other.py", "/w/app.py"));
        assert!(!is_suffix_path("", "/w/app.py"));
        assert_eq!(normalize_diff_path(" b/src/x.rs\t2024-01-01 "), "src/x.rs");
    }
}

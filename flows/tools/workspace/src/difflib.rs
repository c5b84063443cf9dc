//! A port of the parts of Python's `difflib` that `edit_file` shows:
//! `SequenceMatcher` (with its "popular line" autojunk heuristic) and the
//! hunk grouping of `unified_diff`, plus the reference's compact rendering
//! of a diff with line numbers and its post-edit excerpt.

use std::collections::HashMap;

use crate::text::{py_rstrip, py_splitlines};

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// `a[i1..i2] == b[j1..j2]`.
    Equal,
    /// `a[i1..i2]` is replaced by `b[j1..j2]`.
    Replace,
    /// `a[i1..i2]` is deleted.
    Delete,
    /// `b[j1..j2]` is inserted at `a[i1]`.
    Insert,
}

/// One `get_opcodes()` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcode {
    /// What it does.
    pub tag: Tag,
    /// Start in `a`.
    pub i1: usize,
    /// End in `a`.
    pub i2: usize,
    /// Start in `b`.
    pub j1: usize,
    /// End in `b`.
    pub j2: usize,
}

/// The ids of `lines`, equal lines getting equal ids (new lines get the
/// next free id of `ids`).
fn intern<'s>(ids: &mut HashMap<&'s str, usize>, lines: &[&'s str]) -> Vec<usize> {
    lines
        .iter()
        .map(|s| {
            let next = ids.len();
            *ids.entry(*s).or_insert(next)
        })
        .collect()
}

/// `difflib.SequenceMatcher(None, a, b)` over lines (interned as ids).
struct Matcher {
    a: Vec<usize>,
    b: Vec<usize>,
    /// For each non-popular element of `b`, its indices in `b`, ascending.
    b2j: HashMap<usize, Vec<usize>>,
}

impl Matcher {
    /// Builds the matcher, dropping "popular" elements of `b` (more than
    /// 1% + 1 of a sequence of at least 200) from the index, as
    /// `autojunk=True` does.
    fn new<'s>(a: &[&'s str], b: &[&'s str]) -> Self {
        let mut ids: HashMap<&'s str, usize> = HashMap::new();
        let a = intern(&mut ids, a);
        let b = intern(&mut ids, b);
        let mut b2j: HashMap<usize, Vec<usize>> = HashMap::new();
        for (j, elt) in b.iter().enumerate() {
            b2j.entry(*elt).or_default().push(j);
        }
        let n = b.len();
        if n >= 200 {
            let ntest = n / 100 + 1;
            b2j.retain(|_, idxs| idxs.len() <= ntest);
        }
        Matcher { a, b, b2j }
    }

    /// `find_longest_match(alo, ahi, blo, bhi)`: the longest matching block
    /// in the ranges (earliest in `a`, then in `b`, on ties), extended over
    /// popular elements at both ends. Returns `(i, j, size)`.
    fn find_longest_match(
        &self,
        alo: usize,
        ahi: usize,
        blo: usize,
        bhi: usize,
    ) -> (usize, usize, usize) {
        let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
        let mut j2len: HashMap<usize, usize> = HashMap::new();
        let nothing: Vec<usize> = Vec::new();
        for (offset, elt) in self.a[alo..ahi].iter().enumerate() {
            let i = alo + offset;
            let mut newj2len: HashMap<usize, usize> = HashMap::new();
            for &j in self.b2j.get(elt).unwrap_or(&nothing) {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let k = j
                    .checked_sub(1)
                    .and_then(|p| j2len.get(&p))
                    .copied()
                    .unwrap_or(0)
                    + 1;
                newj2len.insert(j, k);
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
            j2len = newj2len;
        }
        while besti > alo && bestj > blo && self.a[besti - 1] == self.b[bestj - 1] {
            besti -= 1;
            bestj -= 1;
            bestsize += 1;
        }
        while besti + bestsize < ahi
            && bestj + bestsize < bhi
            && self.a[besti + bestsize] == self.b[bestj + bestsize]
        {
            bestsize += 1;
        }
        (besti, bestj, bestsize)
    }

    /// `get_matching_blocks()`: the matching blocks in order, adjacent ones
    /// merged, ending with the sentinel `(len(a), len(b), 0)`.
    fn matching_blocks(&self) -> Vec<(usize, usize, usize)> {
        let (la, lb) = (self.a.len(), self.b.len());
        let mut queue = vec![(0, la, 0, lb)];
        let mut blocks = Vec::new();
        while let Some((alo, ahi, blo, bhi)) = queue.pop() {
            let (i, j, k) = self.find_longest_match(alo, ahi, blo, bhi);
            if k > 0 {
                blocks.push((i, j, k));
                if alo < i && blo < j {
                    queue.push((alo, i, blo, j));
                }
                if i + k < ahi && j + k < bhi {
                    queue.push((i + k, ahi, j + k, bhi));
                }
            }
        }
        blocks.sort_unstable();
        let (mut i1, mut j1, mut k1) = (0, 0, 0);
        let mut merged = Vec::new();
        for (i2, j2, k2) in blocks {
            if i1 + k1 == i2 && j1 + k1 == j2 {
                k1 += k2;
            } else {
                if k1 > 0 {
                    merged.push((i1, j1, k1));
                }
                (i1, j1, k1) = (i2, j2, k2);
            }
        }
        if k1 > 0 {
            merged.push((i1, j1, k1));
        }
        merged.push((la, lb, 0));
        merged
    }

    /// `get_opcodes()`.
    fn opcodes(&self) -> Vec<Opcode> {
        let (mut i, mut j) = (0, 0);
        let mut out = Vec::new();
        for (ai, bj, size) in self.matching_blocks() {
            let tag = match (i < ai, j < bj) {
                (true, true) => Some(Tag::Replace),
                (true, false) => Some(Tag::Delete),
                (false, true) => Some(Tag::Insert),
                (false, false) => None,
            };
            if let Some(tag) = tag {
                out.push(Opcode {
                    tag,
                    i1: i,
                    i2: ai,
                    j1: j,
                    j2: bj,
                });
            }
            i = ai + size;
            j = bj + size;
            if size > 0 {
                out.push(Opcode {
                    tag: Tag::Equal,
                    i1: ai,
                    i2: i,
                    j1: bj,
                    j2: j,
                });
            }
        }
        out
    }
}

/// `get_grouped_opcodes(n)`: the hunks of a unified diff with `n` lines of
/// context.
pub fn grouped_opcodes(a: &[&str], b: &[&str], n: usize) -> Vec<Vec<Opcode>> {
    let mut codes = Matcher::new(a, b).opcodes();
    if codes.is_empty() {
        codes.push(Opcode {
            tag: Tag::Equal,
            i1: 0,
            i2: 1,
            j1: 0,
            j2: 1,
        });
    }
    if let Some(first) = codes.first_mut().filter(|c| c.tag == Tag::Equal) {
        first.i1 = first.i1.max(first.i2.saturating_sub(n));
        first.j1 = first.j1.max(first.j2.saturating_sub(n));
    }
    if let Some(last) = codes.last_mut().filter(|c| c.tag == Tag::Equal) {
        last.i2 = last.i2.min(last.i1 + n);
        last.j2 = last.j2.min(last.j1 + n);
    }
    let nn = n + n;
    let mut groups = Vec::new();
    let mut group = Vec::new();
    for mut code in codes {
        if code.tag == Tag::Equal && code.i2 - code.i1 > nn {
            group.push(Opcode {
                tag: Tag::Equal,
                i1: code.i1,
                i2: code.i2.min(code.i1 + n),
                j1: code.j1,
                j2: code.j2.min(code.j1 + n),
            });
            groups.push(std::mem::take(&mut group));
            code.i1 = code.i1.max(code.i2.saturating_sub(n));
            code.j1 = code.j1.max(code.j2.saturating_sub(n));
        }
        group.push(code);
    }
    if !group.is_empty() && (group.len() != 1 || group[0].tag != Tag::Equal) {
        groups.push(group);
    }
    groups
}

/// `difflib._format_range_unified(start, stop)`: `1`, `3,4` or `2,0`.
pub fn format_range_unified(start: usize, stop: usize) -> String {
    let beginning = start + 1;
    let length = stop - start;
    match length {
        1 => beginning.to_string(),
        0 => format!("{},0", beginning - 1),
        _ => format!("{beginning},{length}"),
    }
}

/// The reference's `_render_edit_file_diff`: `Edited <path> (+A -R)`, then
/// each hunk of a one-line-context unified diff with old and new line
/// numbers (`-12      | old`, `+   13 | new`, ` 14 15 | same`).
pub fn render_edit_diff(shown: &str, before: &str, after: &str) -> String {
    let old_lines = py_splitlines(before, false);
    let new_lines = py_splitlines(after, false);
    let groups = grouped_opcodes(&old_lines, &new_lines, 1);
    let width = old_lines
        .len()
        .max(new_lines.len())
        .max(1)
        .to_string()
        .len();
    let blank = " ".repeat(width);
    let (mut added, mut removed) = (0usize, 0usize);
    let mut kept: Vec<String> = Vec::new();
    for group in &groups {
        let (first, last) = (group[0], group[group.len() - 1]);
        let old_range = format_range_unified(first.i1, last.i2);
        let new_range = format_range_unified(first.j1, last.j2);
        kept.push(format!("@@ -{old_range} +{new_range} @@"));
        let mut old_no = leading_number(&old_range);
        let mut new_no = leading_number(&new_range);
        for code in group {
            if code.tag == Tag::Equal {
                for text in &old_lines[code.i1..code.i2] {
                    kept.push(format!(" {old_no:>width$} {new_no:>width$} | {text}"));
                    old_no += 1;
                    new_no += 1;
                }
                continue;
            }
            if matches!(code.tag, Tag::Replace | Tag::Delete) {
                for text in &old_lines[code.i1..code.i2] {
                    kept.push(format!("-{old_no:>width$} {blank} | {text}"));
                    old_no += 1;
                    removed += 1;
                }
            }
            if matches!(code.tag, Tag::Replace | Tag::Insert) {
                for text in &new_lines[code.j1..code.j2] {
                    kept.push(format!("+{blank} {new_no:>width$} | {text}"));
                    new_no += 1;
                    added += 1;
                }
            }
        }
    }
    let body = kept.join("\n");
    let body = body.trim_end_matches('\n');
    let rendered = format!("Edited {shown} (+{added} -{removed})\n{body}");
    py_rstrip(&rendered).to_string()
}

/// The number before any comma of a unified-diff range (`12,3` -> 12).
fn leading_number(range: &str) -> usize {
    range
        .split(',')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Parses a unified-diff hunk header `@@ -o[,oc] +n[,nc] @@` (with
/// optional whitespace around the ranges when `lenient`). Returns
/// `(old_start, old_len, new_start, new_len)`; absent lengths are `None`.
pub fn parse_hunk_header(
    line: &str,
    lenient: bool,
) -> Option<(usize, Option<usize>, usize, Option<usize>)> {
    /// Skips any whitespace when lenient, else exactly one space.
    fn gap(s: &str, lenient: bool) -> Option<&str> {
        if lenient {
            Some(s.trim_start())
        } else {
            s.strip_prefix(' ')
        }
    }
    /// A run of ASCII digits and the rest.
    fn number(s: &str) -> Option<(usize, &str)> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        if end == 0 {
            return None;
        }
        Some((s[..end].parse().ok()?, &s[end..]))
    }
    /// `n[,m]` and the rest.
    fn range(s: &str) -> Option<(usize, Option<usize>, &str)> {
        let (start, rest) = number(s)?;
        match rest.strip_prefix(',') {
            Some(after) => {
                let (len, rest) = number(after)?;
                Some((start, Some(len), rest))
            }
            None => Some((start, None, rest)),
        }
    }
    let rest = line.strip_prefix("@@")?;
    let rest = gap(rest, lenient)?.strip_prefix('-')?;
    let (old_start, old_len, rest) = range(rest)?;
    let rest = gap(rest, lenient)?.strip_prefix('+')?;
    let (new_start, new_len, rest) = range(rest)?;
    gap(rest, lenient)?
        .starts_with("@@")
        .then_some((old_start, old_len, new_start, new_len))
}

/// The new-file line ranges `(start, end)` (1-based, inclusive) of the
/// hunks of a rendered diff.
fn new_ranges(rendered: &str) -> Vec<(usize, usize)> {
    py_splitlines(rendered, false)
        .into_iter()
        .filter(|l| l.starts_with("@@"))
        .filter_map(|l| parse_hunk_header(l, false))
        .map(|(_, _, start, count)| {
            let count = count.unwrap_or(1);
            let end = if count == 0 { start } else { start + count - 1 };
            let start = start.max(1);
            (start, end.max(start))
        })
        .collect()
}

/// Merges inclusive line ranges separated by at most `gap` lines.
pub fn merge_line_ranges(ranges: &[(usize, usize)], gap: usize) -> Vec<(usize, usize)> {
    let mut cleaned: Vec<(usize, usize)> = ranges
        .iter()
        .map(|&(s, e)| {
            let s = s.max(1);
            (s, e.max(s))
        })
        .collect();
    cleaned.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (start, end) in cleaned {
        match merged.last_mut() {
            Some(prev) if start <= prev.1 + gap + 1 => prev.1 = prev.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Lines `start..=end` of `lines` numbered like `read_file` does.
pub fn numbered_excerpt(lines: &[&str], start_line: usize, end_line: usize) -> String {
    let total = lines.len();
    let start = start_line.max(1);
    let end = if total > 0 {
        end_line.min(total)
    } else {
        end_line.max(1)
    };
    let end = end.max(start);
    let width = end.to_string().len();
    (start..=end)
        .map(|i| {
            let text = lines.get(i - 1).copied().unwrap_or("");
            format!("{i:>width$}: {text}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The reference's `_append_edit_file_post_edit_excerpt`: the edited
/// regions of `after` (3 lines of context, nearby regions merged) under a
/// rendered diff, or a note when they span more than 220 lines.
pub fn append_post_edit_excerpt(rendered: &str, shown: &str, after: &str) -> String {
    let ranges = new_ranges(rendered);
    if ranges.is_empty() {
        return rendered.to_string();
    }
    let lines = py_splitlines(after, false);
    let total = lines.len();
    if total == 0 {
        return rendered.to_string();
    }
    let expanded: Vec<(usize, usize)> = ranges
        .iter()
        .map(|&(s, e)| (s.saturating_sub(3).max(1), (e + 3).min(total)))
        .collect();
    let merged = merge_line_ranges(&expanded, 20);
    if merged.is_empty() {
        return rendered.to_string();
    }
    let excerpt_lines: usize = merged.iter().map(|(s, e)| e - s + 1).sum();
    let head = py_rstrip(rendered);
    if excerpt_lines > 220 {
        return format!(
            "{head}\n\nPost-edit excerpt omitted: the modified region spans {excerpt_lines} lines (excerpt bound: 220). The diff above is complete; use read_file(start_line/end_line) to inspect the region."
        );
    }
    let mut blocks = vec!["Post-edit excerpt (to avoid an extra read_file):".to_string()];
    for (start, end) in merged {
        blocks.push(format!("File: {shown} (lines {start}-{end})"));
        blocks.push(String::new());
        blocks.push(numbered_excerpt(&lines, start, end));
        blocks.push(String::new());
    }
    if blocks.last().is_some_and(|b| b.trim().is_empty()) {
        blocks.pop();
    }
    format!("{head}\n\n{}", py_rstrip(&blocks.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders a unified diff's body like `difflib.unified_diff(n=...)`,
    /// without the file header lines.
    fn unified(a: &[&str], b: &[&str], n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for group in grouped_opcodes(a, b, n) {
            let (first, last) = (group[0], group[group.len() - 1]);
            out.push(format!(
                "@@ -{} +{} @@",
                format_range_unified(first.i1, last.i2),
                format_range_unified(first.j1, last.j2)
            ));
            for c in group {
                match c.tag {
                    Tag::Equal => out.extend(a[c.i1..c.i2].iter().map(|l| format!(" {l}"))),
                    _ => {
                        out.extend(a[c.i1..c.i2].iter().map(|l| format!("-{l}")));
                        out.extend(b[c.j1..c.j2].iter().map(|l| format!("+{l}")));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn ranges_format_like_difflib() {
        assert_eq!(format_range_unified(0, 1), "1");
        assert_eq!(format_range_unified(2, 5), "3,3");
        assert_eq!(format_range_unified(3, 3), "3,0");
        assert_eq!(format_range_unified(0, 0), "0,0");
    }

    #[test]
    fn unified_diff_matches_python() {
        // Expected output from Python 3.11 difflib.unified_diff(n=1).
        let a = ["a", "b", "c", "d", "e", "f", "g"];
        let b = ["a", "B", "c", "d", "e", "f", "g", "h"];
        assert_eq!(
            unified(&a, &b, 1),
            vec![
                "@@ -1,3 +1,3 @@",
                " a",
                "-b",
                "+B",
                " c",
                "@@ -7 +7,2 @@",
                " g",
                "+h"
            ]
        );
        let a = ["x", "y"];
        let b: [&str; 0] = [];
        assert_eq!(unified(&a, &b, 1), vec!["@@ -1,2 +0,0 @@", "-x", "-y"]);
        let a = ["same"];
        assert!(unified(&a, &a, 1).is_empty());
    }

    #[test]
    fn rendering_numbers_lines() {
        let before = "one\ntwo\nthree\n";
        let after = "one\n2\nthree\nfour\n";
        assert_eq!(
            render_edit_diff("/w/f.txt", before, after),
            "Edited /w/f.txt (+2 -1)\n@@ -1,3 +1,4 @@\n 1 1 | one\n-2   | two\n+  2 | 2\n 3 3 | three\n+  4 | four"
        );
    }

    #[test]
    fn hunk_headers() {
        assert_eq!(
            parse_hunk_header("@@ -1,2 +3,4 @@", false),
            Some((1, Some(2), 3, Some(4)))
        );
        assert_eq!(
            parse_hunk_header("@@ -7 +7,2 @@ fn x", false),
            Some((7, None, 7, Some(2)))
        );
        assert_eq!(parse_hunk_header("@@-1,2 +3,4@@", false), None);
        assert_eq!(
            parse_hunk_header("@@-1,2 +3,4@@", true),
            Some((1, Some(2), 3, Some(4)))
        );
        assert_eq!(parse_hunk_header("@@ -a +1 @@", true), None);
    }

    #[test]
    fn merging_and_excerpts() {
        assert_eq!(
            merge_line_ranges(&[(10, 12), (1, 3), (5, 6)], 1),
            vec![(1, 6), (10, 12)]
        );
        let lines = ["a", "b", "c"];
        assert_eq!(numbered_excerpt(&lines, 2, 9), "2: b\n3: c");
        let out = append_post_edit_excerpt(
            "Edited /w/f (+1 -1)\n@@ -2 +2 @@\n-2   | b\n+  2 | B",
            "/w/f",
            "a\nB\nc\n",
        );
        assert_eq!(
            out,
            "Edited /w/f (+1 -1)\n@@ -2 +2 @@\n-2   | b\n+  2 | B\n\nPost-edit excerpt (to avoid an extra read_file):\nFile: /w/f (lines 1-3)\n\n1: a\n2: B\n3: c"
        );
    }
}

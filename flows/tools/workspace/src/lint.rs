//! The notice the reference appends to `write_file` and `edit_file` results
//! for code files: a delimiter balance check for JavaScript/TypeScript and
//! R (strings and comments skipped), line checks for HTML (`lang`, `alt`,
//! `rel=noopener`, duplicate ids), and for Python the `ruff` line. A
//! component cannot run processes: without a ruff program on the host the
//! line is the reference's for a missing ruff; with one (the host's `_ruff`
//! argument) the file is handed back to the host, which runs ruff and
//! appends the notice ([`take_ruff_request`]).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

use regex::Regex;

use crate::text::{py_repr, py_splitlines, py_strip};

/// The most issues listed in a notice.
const MAX_ISSUES: usize = 10;

/// The reference's notice for Python files when `ruff` cannot be run.
const RUFF_UNAVAILABLE: &str = "Notice: lint (python/ruff) unavailable: ruff not installed";

/// A language the notice covers, by file extension.
#[derive(Clone, Copy, PartialEq)]
enum Lang {
    /// `.py`.
    Python,
    /// `.js`, `.jsx`, `.ts`, `.tsx`, `.mjs`, `.cjs`.
    JavaScript,
    /// `.r`, `.rmd`.
    R,
    /// `.html`, `.htm`, `.xhtml`.
    Html,
}

/// The language of `path` from its extension (case-insensitive).
fn lang_of(path: &Path) -> Option<Lang> {
    let ext = path.extension()?.to_string_lossy().to_lowercase();
    match ext.as_str() {
        "py" => Some(Lang::Python),
        "js" | "jsx" | "ts" | "tsx" | "mjs" | "cjs" => Some(Lang::JavaScript),
        "r" | "rmd" => Some(Lang::R),
        "html" | "htm" | "xhtml" => Some(Lang::Html),
        _ => None,
    }
}

thread_local! {
    /// The host runs ruff for this call.
    static RUFF: Cell<bool> = const { Cell::new(false) };
    /// The Python file (and the text, unless the file on disk) the host is
    /// to lint for this call.
    static RUFF_REQUEST: RefCell<Option<(String, Option<String>)>> = const { RefCell::new(None) };
}

/// Whether the host runs ruff for this call (its `_ruff` argument).
pub fn set_ruff(on: bool) {
    RUFF.with(|r| r.set(on));
    RUFF_REQUEST.with(|r| r.borrow_mut().take());
}

/// The request for the host to lint a Python file with ruff, if this call
/// made one: `{"path", "content"}` (`content` null: the file on disk).
pub fn take_ruff_request() -> Option<serde_json::Value> {
    let (path, content) = RUFF_REQUEST.with(|r| r.borrow_mut().take())?;
    Some(serde_json::json!({"path": path, "content": content}))
}

/// The lint notice for `content` as the text of `path`, if there is one
/// (for Python, when the host runs ruff: none, and the request is kept).
pub fn notice(path: &Path, content: &str) -> Option<String> {
    python_or(path, Some(content), || notice_of(path, content))
}

/// For a Python file, the ruff line or request (`content` `None`: the file
/// on disk); for another, `other()`.
fn python_or(
    path: &Path,
    content: Option<&str>,
    other: impl FnOnce() -> Option<String>,
) -> Option<String> {
    if lang_of(path) != Some(Lang::Python) {
        return other();
    }
    if RUFF.with(Cell::get) {
        let request = (
            path.to_string_lossy().into_owned(),
            content.map(str::to_owned),
        );
        RUFF_REQUEST.with(|r| *r.borrow_mut() = Some(request));
        return None;
    }
    Some(RUFF_UNAVAILABLE.to_string())
}

/// The notice for a file that is not Python.
fn notice_of(path: &Path, content: &str) -> Option<String> {
    let lang = lang_of(path)?;
    let (name, issues) = match lang {
        Lang::Python => return None,
        Lang::JavaScript => ("javascript", delimiter_issues(content, lang)),
        Lang::R => ("r", delimiter_issues(content, lang)),
        Lang::Html => {
            let issues = html_issues(content);
            if issues.is_empty() {
                return None;
            }
            return Some(format!(
                "Notice: lint (html) issues:\n{}",
                issues.join("\n")
            ));
        }
    };
    if issues.is_empty() {
        return None;
    }
    Some(format!(
        "Notice: lint ({name}) delimiter issues:\n{}",
        issues.join("\n")
    ))
}

/// `message`, followed by the lint notice for the file at `path` as it is
/// on disk (an unreadable file gets none but Python's).
pub fn with_notice_on_disk(path: &Path, message: String) -> String {
    let notice = python_or(path, None, || {
        notice_of(path, &std::fs::read_to_string(path).ok()?)
    });
    match notice {
        Some(n) => format!("{message}\n\n{n}"),
        None => message,
    }
}

/// `message`, followed by the lint notice for `content` when there is one.
pub fn with_notice(path: &Path, message: String, content: &str) -> String {
    match notice(path, content) {
        Some(n) => format!("{message}\n\n{n}"),
        None => message,
    }
}

/// The string or comment the scanner is inside.
#[derive(Clone, Copy, PartialEq)]
enum Inside {
    /// Code.
    Code,
    /// A string closed by this quote (`'`, `"` or a backtick).
    Quote(char),
    /// A JavaScript `/* ... */` comment.
    Block,
}

/// The first [`MAX_ISSUES`] delimiter issues of `content`: closers without
/// an opener, closers of the wrong kind, and openers left open at the end
/// (innermost first), positions as `line:column` counted in characters.
fn delimiter_issues(content: &str, lang: Lang) -> Vec<String> {
    let mut stack: Vec<(char, usize, usize)> = Vec::new();
    let mut issues = Vec::new();
    let mut inside = Inside::Code;
    for (n, line) in py_splitlines(content, false).iter().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut j = 0;
        while j < chars.len() {
            let ch = chars[j];
            let next = chars.get(j + 1).copied();
            match inside {
                Inside::Block => {
                    if ch == '*' && next == Some('/') {
                        inside = Inside::Code;
                        j += 1;
                    }
                }
                Inside::Quote(q) => {
                    if ch == '\\' {
                        j += 1;
                    } else if ch == q {
                        inside = Inside::Code;
                    }
                }
                Inside::Code => {
                    let js = lang == Lang::JavaScript;
                    if js && ch == '/' && next == Some('*') {
                        inside = Inside::Block;
                        j += 1;
                    } else if (js && ch == '/' && next == Some('/')) || (!js && ch == '#') {
                        break;
                    } else if matches!(ch, '\'' | '"' | '`') {
                        inside = Inside::Quote(ch);
                    } else {
                        check_delimiter(ch, (n + 1, j + 1), &mut stack, &mut issues);
                    }
                }
            }
            j += 1;
        }
    }
    for (opener, line, col) in stack.iter().rev() {
        issues.push(format!(
            "  - unclosed_delimiter: opened '{opener}' at {line}:{col} (reached EOF)"
        ));
    }
    issues.truncate(MAX_ISSUES);
    issues
}

/// Pushes an opener at `at`, or matches a closer against the stack.
fn check_delimiter(
    ch: char,
    at: (usize, usize),
    stack: &mut Vec<(char, usize, usize)>,
    issues: &mut Vec<String>,
) {
    let (line, col) = at;
    let expected = match ch {
        '{' | '(' | '[' => {
            stack.push((ch, line, col));
            return;
        }
        '}' => '{',
        ')' => '(',
        ']' => '[',
        _ => return,
    };
    match stack.pop() {
        None => issues.push(format!("  - unmatched_closing '{ch}' at {line}:{col}")),
        Some((opener, ol, oc)) if opener != expected => issues.push(format!(
            "  - mismatched_delimiter: opened '{opener}' at {ol}:{oc}, closed '{ch}' at {line}:{col}"
        )),
        Some(_) => {}
    }
}

/// The regular expressions of the HTML checks (the reference's, with its
/// `(?P=q)` back-reference spelled as one alternative per quote).
struct HtmlRes {
    html: Regex,
    lang: Regex,
    id: Regex,
    script_open: Regex,
    script_close: Regex,
    style_open: Regex,
    style_close: Regex,
    img: Regex,
    alt: Regex,
    anchor: Regex,
    target: Regex,
    rel: Regex,
}

/// An attribute `name="value"` or `name='value'` (a value holding neither
/// quote; empty only when `empty`), case-insensitive.
fn attribute(name: &str, empty: bool) -> Regex {
    let n = if empty { "*" } else { "+" };
    Regex::new(&format!(
        r#"(?i)\b{name}\s*=\s*(?:"([^"']{n})"|'([^"']{n})')"#
    ))
    .expect("attribute regex")
}

fn html_res() -> &'static HtmlRes {
    static RES: OnceLock<HtmlRes> = OnceLock::new();
    RES.get_or_init(|| {
        let re = |p: &str| Regex::new(&format!("(?i){p}")).expect("html regex");
        HtmlRes {
            html: re(r"<html\b"),
            lang: attribute("lang", false),
            id: attribute("id", false),
            script_open: re(r"<script\b"),
            script_close: re(r"</script\b"),
            style_open: re(r"<style\b"),
            style_close: re(r"</style\b"),
            img: re(r"<img\b"),
            alt: attribute("alt", true),
            anchor: re(r"<a\b"),
            target: attribute("target", false),
            rel: attribute("rel", false),
        }
    })
}

/// The attribute value an [`attribute`] match captured.
fn value<'a>(c: &regex::Captures<'a>) -> &'a str {
    c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str())
}

/// The reference's HTML line checks (`_scan_html_lint_issues`): comments
/// and script/style bodies skipped; the first `<html>` without `lang`,
/// `<img>` without `alt`, `target="_blank"` without `noopener` or
/// `noreferrer`, then ids used on several lines; at most [`MAX_ISSUES`]
/// (the first two checks stop the scan when the list is full).
fn html_issues(content: &str) -> Vec<String> {
    let res = html_res();
    let mut issues: Vec<String> = Vec::new();
    let record = |issues: &mut Vec<String>, msg: String| {
        if issues.len() < MAX_ISSUES {
            issues.push(msg);
        }
    };
    // Ids in order of first use, each with the lines using it.
    let mut ids: Vec<(String, Vec<usize>)> = Vec::new();
    let mut id_index: HashMap<String, usize> = HashMap::new();
    let (mut in_comment, mut in_script, mut in_style, mut saw_html) = (false, false, false, false);
    for (n, raw) in py_splitlines(content, false).iter().enumerate() {
        let i = n + 1;
        if py_strip(raw).is_empty() {
            continue;
        }
        if in_comment {
            if raw.contains("-->") {
                in_comment = false;
            }
            continue;
        }
        if raw.contains("<!--") {
            if !raw.contains("-->") {
                in_comment = true;
            }
            continue;
        }
        if in_script {
            if res.script_close.is_match(raw) {
                in_script = false;
            }
            continue;
        }
        if in_style {
            if res.style_close.is_match(raw) {
                in_style = false;
            }
            continue;
        }
        if !saw_html && res.html.is_match(raw) {
            saw_html = true;
            if !res.lang.is_match(raw) {
                record(&mut issues, format!("  - html_missing_lang at line {i}"));
                if issues.len() >= MAX_ISSUES {
                    return issues;
                }
            }
        }
        for c in res.id.captures_iter(raw) {
            let v = value(&c).to_string();
            let k = *id_index.entry(v.clone()).or_insert_with(|| {
                ids.push((v, Vec::new()));
                ids.len() - 1
            });
            ids[k].1.push(i);
        }
        if res.script_open.is_match(raw) {
            if !res.script_close.is_match(raw) {
                in_script = true;
            }
            continue;
        }
        if res.style_open.is_match(raw) {
            if !res.style_close.is_match(raw) {
                in_style = true;
            }
            continue;
        }
        if res.img.is_match(raw) {
            if !res.alt.is_match(raw) {
                record(&mut issues, format!("  - img_missing_alt at line {i}"));
                if issues.len() >= MAX_ISSUES {
                    return issues;
                }
            }
            continue;
        }
        if res.anchor.is_match(raw) {
            let blank = res
                .target
                .captures(raw)
                .is_some_and(|c| py_strip(value(&c)).to_lowercase() == "_blank");
            if blank {
                let rel = res
                    .rel
                    .captures(raw)
                    .map_or(String::new(), |c| value(&c).to_lowercase());
                if !rel.contains("noopener") && !rel.contains("noreferrer") {
                    record(
                        &mut issues,
                        format!("  - target_blank_missing_noopener at line {i}"),
                    );
                }
            }
            continue;
        }
    }
    // Python's stable sort by the lowercased id.
    ids.sort_by_key(|(id, _)| id.to_lowercase());
    for (id, lines) in ids {
        if lines.len() <= 1 {
            continue;
        }
        let shown: Vec<String> = lines.iter().take(10).map(usize::to_string).collect();
        let more = if lines.len() > 10 {
            format!(
                ", …(+{} more locations, see the id in the source)",
                lines.len() - 10
            )
        } else {
            String::new()
        };
        record(
            &mut issues,
            format!(
                "  - duplicate_id {} at lines {}{more}",
                py_repr(&id),
                shown.join(", ")
            ),
        );
    }
    issues
}

#[cfg(test)]
mod tests {
    use super::notice;
    use std::path::Path;

    /// The notice for `content` in a file named `name`.
    fn of(name: &str, content: &str) -> Option<String> {
        notice(Path::new(name), content)
    }

    /// The reference's texts (abstractcore 2.30.0, its own delimiter check).
    #[test]
    fn javascript_delimiters() {
        assert_eq!(
            of("app.js", "function f() {\n  return 1;\n").as_deref(),
            Some("Notice: lint (javascript) delimiter issues:\n  - unclosed_delimiter: opened '{' at 1:14 (reached EOF)")
        );
        assert_eq!(
            of("a.TS", "const a = [1, 2);\n}\n").as_deref(),
            Some("Notice: lint (javascript) delimiter issues:\n  - mismatched_delimiter: opened '[' at 1:11, closed ')' at 1:16\n  - unmatched_closing '}' at 2:1")
        );
        assert_eq!(
            of("ok.js", "const s = \"{(\"; // )\n/* [ */ f(`}`);\n"),
            None
        );
    }

    /// R skips `#` comments and its three quotes.
    #[test]
    fn r_delimiters() {
        assert_eq!(
            of("x.R", "f <- function(x) { # }\n  x + 'a)'\n").as_deref(),
            Some("Notice: lint (r) delimiter issues:\n  - unclosed_delimiter: opened '{' at 1:18 (reached EOF)")
        );
    }

    /// Python gets the reference's line for a missing `ruff`; other
    /// files get nothing.
    #[test]
    fn python_and_others() {
        assert_eq!(
            of("m.py", "x = 1\n").as_deref(),
            Some("Notice: lint (python/ruff) unavailable: ruff not installed")
        );
        assert_eq!(of("notes.txt", "{"), None);
        assert_eq!(of("page.html", "<html lang=\"en\">"), None);
    }

    /// HTML: the reference's texts (abstractcore 2.30.0) for the same pages.
    #[test]
    fn html_checks() {
        let page = "<!doctype html>\n<html>\n<body>\n<img src=\"a.png\">\n<a href=\"x\" target=\"_blank\">x</a>\n<div id=\"a\"></div>\n<p id='a'>t</p>\n</body>\n</html>\n";
        assert_eq!(
            of("index.html", page).as_deref(),
            Some("Notice: lint (html) issues:\n  - html_missing_lang at line 2\n  - img_missing_alt at line 4\n  - target_blank_missing_noopener at line 5\n  - duplicate_id 'a' at lines 6, 7")
        );
        let skipped = "<html>\n<!-- <img src=x> -->\n<script>\nvar s = '<img src=y>';\n</script>\n<style>\n</style><img src=z>\n";
        assert_eq!(
            of("page.xhtml", skipped).as_deref(),
            Some("Notice: lint (html) issues:\n  - html_missing_lang at line 1")
        );
        let ok = "<html lang=\"en\">\n<img src=\"a.png\" alt=\"\">\n<a target=\"_blank\" rel=\"noopener\">x</a>\n</html>\n";
        assert_eq!(of("ok.HTM", ok), None);
        let mut dups: String = (0..12).map(|n| format!("<i id=\"x\">{n}</i>\n")).collect();
        dups.push_str("<b id=\"Y\"></b><b id='y'></b>\n<b id=\"y\"></b>\n");
        assert_eq!(
            of("dups.html", &dups).as_deref(),
            Some("Notice: lint (html) issues:\n  - duplicate_id 'x' at lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, …(+2 more locations, see the id in the source)\n  - duplicate_id 'y' at lines 13, 14")
        );
        let many = "<img src=a>\n".repeat(12);
        let n = of("many.html", &many).unwrap();
        assert_eq!(n.lines().count(), 11);
        assert!(n.ends_with("  - img_missing_alt at line 10"), "{n}");
    }

    /// At most ten issues are listed.
    #[test]
    fn ten_issues_at_most() {
        let n = of("many.js", &"}".repeat(12)).unwrap();
        assert_eq!(n.lines().count(), 11);
    }
}

//! The notice the reference appends to `write_file` and `edit_file` results
//! for code files: a delimiter balance check for JavaScript/TypeScript and
//! R (strings and comments skipped), and for Python the `ruff` line, which
//! here always says ruff is unavailable (a component cannot run processes).
//! HTML's line checks are not reproduced (no notice for `.html` files).

use std::path::Path;

use crate::text::py_splitlines;

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
}

/// The language of `path` from its extension (case-insensitive).
fn lang_of(path: &Path) -> Option<Lang> {
    let ext = path.extension()?.to_string_lossy().to_lowercase();
    match ext.as_str() {
        "py" => Some(Lang::Python),
        "js" | "jsx" | "ts" | "tsx" | "mjs" | "cjs" => Some(Lang::JavaScript),
        "r" | "rmd" => Some(Lang::R),
        _ => None,
    }
}

/// The lint notice for `content` as the text of `path`, if there is one.
pub fn notice(path: &Path, content: &str) -> Option<String> {
    let lang = lang_of(path)?;
    let (name, issues) = match lang {
        Lang::Python => return Some(RUFF_UNAVAILABLE.to_string()),
        Lang::JavaScript => ("javascript", delimiter_issues(content, lang)),
        Lang::R => ("r", delimiter_issues(content, lang)),
    };
    if issues.is_empty() {
        return None;
    }
    Some(format!(
        "Notice: lint ({name}) delimiter issues:\n{}",
        issues.join("\n")
    ))
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
        assert_eq!(of("page.html", "<html>"), None);
    }

    /// At most ten issues are listed.
    #[test]
    fn ten_issues_at_most() {
        let n = of("many.js", &"}".repeat(12)).unwrap();
        assert_eq!(n.lines().count(), 11);
    }
}

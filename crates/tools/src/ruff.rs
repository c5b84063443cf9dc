//! The reference's Python lint notice with `ruff`, for the built-in
//! `write_file` and `edit_file` when the operator gives a ruff program
//! ([`Tools::ruff`](crate::Tools::ruff), the binary's `--ruff`).
//!
//! A component cannot run processes, so a built-in told that ruff is there
//! (its `_ruff` argument) hands the Python file back instead of its notice:
//! `{"text": <its answer>, "ruff": {"path": <file>, "content": <text or
//! null>}}`. The host runs `ruff check --no-cache --output-format json`
//! on the file (`content` null: `write_file` lints the file written) or on
//! the text through stdin (`--stdin-filename`: `edit_file` lints the edited
//! text), in the file's folder, for at most 10 seconds, and appends the
//! reference's notice (abstractcore `_run_ruff_check`,
//! `_lint_notice_for_content`): `Notice: lint (python/ruff) found N
//! issue(s) (F fixable)` and up to 20 findings, `... error: <why>`, or
//! nothing when ruff finds nothing. A program that cannot be found gives
//! the line the reference gives without ruff.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use stepwell_model::json::truthy;

use crate::exec::ExecEnv;

/// How long ruff may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The most findings listed.
const MAX_MESSAGES: usize = 20;
/// The notice without ruff (the reference's, when ruff is not installed).
pub const UNAVAILABLE: &str = "Notice: lint (python/ruff) unavailable: ruff not installed";

/// What a ruff run found (the reference's report dict).
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    available: bool,
    error: Option<String>,
    total: usize,
    fixable: usize,
    messages: Vec<String>,
}

impl Report {
    fn failed(error: impl Into<String>) -> Report {
        Report {
            available: true,
            error: Some(error.into()),
            ..Report::default()
        }
    }
}

/// Python's `str(x or "")` for a JSON value.
fn text_or_empty(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) if n.as_f64() == Some(0.0) => String::new(),
        Some(Value::Bool(true)) => "True".into(),
        Some(other) => other.to_string(),
    }
}

/// `int(x or 0)` for a location's row or column.
fn int_or_zero(v: Option<&Value>) -> i64 {
    v.and_then(|v| v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)))
        .unwrap_or(0)
}

/// The report for ruff's output (`code` its exit code).
fn report(stdout: &str, stderr: &str, code: Option<i32>) -> Report {
    let (stdout, stderr) = (stdout.trim(), stderr.trim());
    if stdout.is_empty() {
        if !matches!(code, Some(0 | 1)) {
            let why = if stderr.is_empty() {
                match code {
                    Some(c) => format!("ruff failed (exit {c})"),
                    None => "ruff failed (exit None)".into(),
                }
            } else {
                stderr.to_string()
            };
            return Report::failed(why);
        }
        return Report {
            available: true,
            ..Report::default()
        };
    }
    let or_stderr = |default: &str| {
        if stderr.is_empty() {
            default.to_string()
        } else {
            stderr.to_string()
        }
    };
    let data = match serde_json::from_str::<Value>(stdout) {
        Ok(Value::Array(items)) => items,
        Ok(_) => return Report::failed(or_stderr("ruff returned unexpected JSON shape")),
        Err(_) => return Report::failed(or_stderr("ruff returned non-JSON output")),
    };
    let fixable = data.iter().filter(|i| truthy(i.get("fix"))).count();
    let messages = data
        .iter()
        .take(MAX_MESSAGES)
        .map(|item| {
            let code = text_or_empty(item.get("code")).trim().to_string();
            let msg = text_or_empty(item.get("message")).trim().to_string();
            let loc = item.get("location");
            let row = int_or_zero(loc.and_then(|l| l.get("row")));
            let col = int_or_zero(loc.and_then(|l| l.get("column")));
            let fix = if truthy(item.get("fix")) {
                " (fixable)"
            } else {
                ""
            };
            let at = match (row, col) {
                (0, _) => "?".to_string(),
                (r, 0) => r.to_string(),
                (r, c) => format!("{r}:{c}"),
            };
            format!("  - {at} {code}: {msg}{fix}")
                .trim_end()
                .to_string()
        })
        .collect();
    Report {
        available: true,
        error: None,
        total: data.len(),
        fixable,
        messages,
    }
}

/// Runs `program` on the file `path` (`content` `None`) or on `content`
/// as that file's text, in the file's folder, with the environment `env`.
fn run(program: &Path, path: &Path, content: Option<&str>, env: &ExecEnv) -> Report {
    let mut cmd = Command::new(program);
    cmd.args(["check", "--no-cache", "--output-format", "json"]);
    match content {
        None => cmd.arg(path),
        Some(_) => cmd.arg("--stdin-filename").arg(path).arg("-"),
    };
    cmd.env_clear()
        .envs(env.vars().iter().map(|(k, v)| (k, v)))
        .stdin(if content.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(dir) = path.parent().filter(|d| d.is_dir()) {
        cmd.current_dir(dir);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Report {
                available: false,
                error: Some("ruff not installed".into()),
                ..Report::default()
            }
        }
        Err(e) => return Report::failed(e.to_string()),
    };
    let input = content.map(str::to_owned);
    let stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let (Some(mut stdin), Some(text)) = (stdin, input) {
            let _ = stdin.write_all(text.as_bytes());
        }
    });
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = pipe(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = pipe(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Report::failed(e.to_string()),
        }
    };
    let _ = writer.join();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        None => Report::failed("ruff timed out"),
        Some(status) => report(&stdout, &stderr, status.code()),
    }
}

/// The reference's notice for a report on `path`, if any.
fn notice(r: &Report, path: &Path) -> Option<String> {
    if !r.available {
        let why = r.error.as_deref().unwrap_or("ruff unavailable").trim();
        return Some(format!("Notice: lint (python/ruff) unavailable: {why}"));
    }
    if let Some(e) = &r.error {
        let e = e.trim();
        return Some(if e.is_empty() {
            "Notice: lint (python/ruff) error".into()
        } else {
            format!("Notice: lint (python/ruff) error: {e}")
        });
    }
    if r.total == 0 {
        return None;
    }
    let mut header = format!("Notice: lint (python/ruff) found {} issue(s)", r.total);
    if r.fixable > 0 {
        header.push_str(&format!(" ({} fixable)", r.fixable));
    }
    let messages: Vec<&String> = r.messages.iter().filter(|m| !m.trim().is_empty()).collect();
    let mut body = messages
        .iter()
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string();
    if r.total > messages.len() && !messages.is_empty() {
        let more = r.total - messages.len();
        if !body.is_empty() {
            body.push('\n');
        }
        body.push_str(&format!(
            "  - ... ({more} more) #TRUNCATION — {more} further findings exist; run: ruff check {}",
            path.display()
        ));
    }
    if body.is_empty() {
        Some(header)
    } else {
        Some(format!("{header}\n{body}").trim_end().to_string())
    }
}

/// A built-in's answer that asks for ruff (`{"text", "ruff": {"path",
/// "content"}}`) made the text the model reads: ruff run with `program`
/// and its notice appended. Any other output is returned as it is.
pub fn finish(output: Value, program: &Path, env: &ExecEnv) -> Value {
    let (Some(text), Some(request)) = (
        output.get("text").and_then(Value::as_str),
        output.get("ruff").filter(|r| r.is_object()),
    ) else {
        return output;
    };
    let Some(path) = request.get("path").and_then(Value::as_str) else {
        return output;
    };
    let path = Path::new(path);
    let content = request.get("content").and_then(Value::as_str);
    let r = run(program, path, content, env);
    Value::String(match notice(&r, path) {
        Some(n) => format!("{text}\n\n{n}"),
        None => text.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn notice_of(stdout: &str, stderr: &str, code: i32) -> Option<String> {
        notice(&report(stdout, stderr, Some(code)), Path::new("/w/m.py"))
    }

    /// The reference's texts for ruff's answers.
    #[test]
    fn notices_follow_the_reference() {
        let findings = json!([
            {"code": "F401", "message": "`os` imported but unused", "location": {"row": 1, "column": 8},
             "fix": {"applicability": "safe"}},
            {"code": "E711", "message": "Comparison to `None` should be `cond is None`",
             "location": {"row": 3, "column": 6}, "fix": null},
            {"code": null, "message": "SyntaxError: Expected an expression", "location": {"row": 4, "column": 0}}
        ]);
        assert_eq!(
            notice_of(&findings.to_string(), "", 1).as_deref(),
            Some("Notice: lint (python/ruff) found 3 issue(s) (1 fixable)\n  - 1:8 F401: `os` imported but unused (fixable)\n  - 3:6 E711: Comparison to `None` should be `cond is None`\n  - 4 : SyntaxError: Expected an expression")
        );
        assert_eq!(notice_of("[]", "", 0), None);
        assert_eq!(notice_of("", "", 0), None);
        assert_eq!(
            notice_of("", "error: bad config", 2).as_deref(),
            Some("Notice: lint (python/ruff) error: error: bad config")
        );
        assert_eq!(
            notice_of("", "", 2).as_deref(),
            Some("Notice: lint (python/ruff) error: ruff failed (exit 2)")
        );
        assert_eq!(
            notice_of("oops", "", 1).as_deref(),
            Some("Notice: lint (python/ruff) error: ruff returned non-JSON output")
        );
        assert_eq!(
            notice_of("{}", "", 1).as_deref(),
            Some("Notice: lint (python/ruff) error: ruff returned unexpected JSON shape")
        );
        let many: Vec<Value> = (1..=22)
            .map(|n| json!({"code": "E501", "message": "Line too long", "location": {"row": n, "column": 89}}))
            .collect();
        let n = notice_of(&Value::Array(many).to_string(), "", 1).unwrap();
        assert_eq!(n.lines().count(), 22);
        assert!(
            n.ends_with(
                "  - ... (2 more) #TRUNCATION — 2 further findings exist; run: ruff check /w/m.py"
            ),
            "{n}"
        );
    }

    /// A program that is not there gives the reference's line without
    /// ruff; a request is answered in place, other outputs pass.
    #[test]
    fn a_missing_program_is_unavailable() {
        let out = finish(
            json!({"text": "done", "ruff": {"path": "/nonexistent-sw/m.py", "content": "x = 1\n"}}),
            Path::new("/nonexistent-sw/bin/ruff"),
            &ExecEnv::default(),
        );
        assert_eq!(out, json!(format!("done\n\n{UNAVAILABLE}")));
        assert_eq!(
            finish(json!("plain"), Path::new("/x"), &ExecEnv::default()),
            json!("plain")
        );
    }
}

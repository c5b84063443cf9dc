//! The tools called natively on a scratch workspace, against the texts the
//! reference's tools (abstractcore 2.30.0, ruff not installed) gave for the
//! same calls on the same files: ignore files, lint notices, invalid
//! regular expressions and edits that would break a JSON file.

use std::fs;
use std::path::PathBuf;

use serde_json::{json, Value};
use stepwell_guest::tool::{ToolCall, Toolbox};

use crate::Workspace;

/// A fresh scratch directory named `name`, with an `.abstractignore`
/// hiding `*.key` (except `keep.key`) and `private/`.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tool-workspace-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("sub")).unwrap();
    fs::create_dir_all(dir.join("private")).unwrap();
    let files = [
        (".abstractignore", "# secrets\n*.key\n!keep.key\nprivate/\n"),
        ("api.key", "token\n"),
        ("keep.key", "token\n"),
        ("sub/deep.key", "token\n"),
        ("private/p.txt", "token\n"),
        ("data.json", "{\n  \"a\": 1,\n  \"b\": 2\n}\n"),
        ("app.js", "const a = 1;\n"),
    ];
    for (path, text) in files {
        fs::write(dir.join(path), text).unwrap();
    }
    dir
}

/// The text `tool` returns for `args`, with the scratch path shown as `<d>`.
fn call(dir: &std::path::Path, tool: &str, args: Value) -> String {
    let out = Workspace::invoke(ToolCall {
        call_id: "c1".into(),
        name: tool.into(),
        arguments: args.as_object().unwrap().clone(),
    })
    .unwrap();
    out.as_str().unwrap().replace(dir.to_str().unwrap(), "<d>")
}

#[test]
fn ignore_files_hide_and_refuse() {
    let d = scratch("ignore");
    let p = |rel: &str| d.join(rel).to_str().unwrap().to_string();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "list_files",
            json!({"directory_path": p("sub")}),
            "Directory '<d>/sub' exists but no entries match pattern '*'",
        ),
        (
            "list_files",
            json!({"directory_path": p("."), "recursive": true, "pattern": "*.key"}),
            "Entries in '<d>' matching '*.key' (hidden entries excluded):\n  keep.key (6 bytes)",
        ),
        (
            "search_files",
            json!({"pattern": "token", "path": p("."), "output_mode": "files_with_matches"}),
            "Files matching pattern 'token' under '<d>' (1 file(s)):\n<d>/keep.key",
        ),
        (
            "read_file",
            json!({"file_path": p("api.key")}),
            "Error: File '<d>/api.key' is ignored by .abstractignore policy",
        ),
        (
            "list_files",
            json!({"directory_path": p("private")}),
            "Error: Directory '<d>/private' is ignored by .abstractignore policy",
        ),
        (
            "search_files",
            json!({"pattern": "token", "path": p("private")}),
            "Error: Path '<d>/private' is ignored by .abstractignore policy",
        ),
        (
            "write_file",
            json!({"file_path": p("new.key"), "content": "x"}),
            "❌ Refused: Path '<d>/new.key' is ignored by .abstractignore policy",
        ),
        (
            "write_file",
            json!({"file_path": p("private/q.txt"), "content": "x"}),
            "❌ Refused: Path '<d>/private/q.txt' is ignored by .abstractignore policy",
        ),
        (
            "edit_file",
            json!({"file_path": p("api.key"), "pattern": "token", "replacement": "t"}),
            "❌ Refused: Path '<d>/api.key' is ignored by .abstractignore policy",
        ),
    ];
    for (tool, args, want) in cases {
        assert_eq!(call(&d, tool, args.clone()), want, "{tool} {args}");
    }
    assert!(!d.join("new.key").exists());
    let _ = fs::remove_dir_all(&d);
}

#[test]
fn error_texts_and_lint_notices() {
    let d = scratch("texts");
    let p = |rel: &str| d.join(rel).to_str().unwrap().to_string();
    let cases: Vec<(&str, Value, &str)> = vec![
        ("search_files", json!({"pattern": "(abc", "path": p(".")}),
         "Error: Invalid regex pattern '(abc': missing ), unterminated subpattern at position 0"),
        ("edit_file", json!({"file_path": p("data.json"), "pattern": "[abc", "replacement": "x", "use_regex": true}),
         "❌ Invalid regex pattern '[abc': unterminated character set at position 0"),
        ("edit_file", json!({"file_path": p("data.json"), "pattern": "\"a\": 1,", "replacement": "\"a\": 1"}),
         "❌ Refused: edit would introduce a JSON syntax error.\nline 3 column 3: Expecting ',' delimiter\n\nPreview <d>/data.json (+1 -1)\n@@ -1,3 +1,3 @@\n 1 1 | {\n-2   |   \"a\": 1,\n+  2 |   \"a\": 1\n 3 3 |   \"b\": 2\n\nPost-edit excerpt (to avoid an extra read_file):\nFile: <d>/data.json (lines 1-4)\n\n1: {\n2:   \"a\": 1\n3:   \"b\": 2\n4: }"),
        ("write_file", json!({"file_path": p("bad.js"), "content": "function f() {\n  return 1;\n"}),
         "✅ Successfully written to '<d>/bad.js' (27 bytes, 2 lines)\n\nNotice: lint (javascript) delimiter issues:\n  - unclosed_delimiter: opened '{' at 1:14 (reached EOF)"),
        ("write_file", json!({"file_path": p("w.py"), "content": "y = 2\n"}),
         "✅ Successfully written to '<d>/w.py' (6 bytes, 1 lines)\n\nNotice: lint (python/ruff) unavailable: ruff not installed"),
        ("edit_file", json!({"file_path": p("app.js"), "pattern": "const a = 1;", "replacement": "const a = [1;"}),
         "Edited <d>/app.js (+1 -1) replacements=1/1\n@@ -1 +1 @@\n-1   | const a = 1;\n+  1 | const a = [1;\n\nPost-edit excerpt (to avoid an extra read_file):\nFile: <d>/app.js (lines 1-1)\n\n1: const a = [1;\n\nNotice: lint (javascript) delimiter issues:\n  - unclosed_delimiter: opened '[' at 1:11 (reached EOF)"),
        ("edit_file", json!({"file_path": p("w.py"), "pattern": "y = 2", "replacement": "y = 3"}),
         "Edited <d>/w.py (+1 -1) replacements=1/1\n@@ -1 +1 @@\n-1   | y = 2\n+  1 | y = 3\n\nPost-edit excerpt (to avoid an extra read_file):\nFile: <d>/w.py (lines 1-1)\n\n1: y = 3\n\nNotice: lint (python/ruff) unavailable: ruff not installed"),
    ];
    for (tool, args, want) in cases {
        assert_eq!(call(&d, tool, args.clone()), want, "{tool} {args}");
    }
    let _ = fs::remove_dir_all(&d);
}

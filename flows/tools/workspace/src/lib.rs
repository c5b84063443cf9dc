//! The built-in workspace tools as one tool component (the `tool` world):
//! `list_files`, `search_files`, `read_file` (effect class `read`) and
//! `write_file`, `edit_file` (effect class `write`), with AbstractCore's
//! semantics and output texts.
//!
//! The host preopens the directories a call may touch under their absolute
//! host paths and rewrites path arguments to absolute paths inside them, so
//! the tools use `std::fs` on the paths as given. Every tool returns a JSON
//! string for the model; failures the model should see are strings starting
//! with `Error:` or `❌` (the host counts those as failed calls), and
//! arguments that cannot be coerced to their declared types are refused as
//! invalid arguments.

mod args;
mod difflib;
mod edit;
mod glob;
mod lint;
mod list;
mod patch;
mod pyjson;
mod pyre;
mod read;
mod reerror;
#[cfg(test)]
mod reference_texts;
mod search;
mod text;
mod walk;
mod write;

use serde_json::Value;
use stepwell_guest::tool::{ToolCall, ToolError, ToolSpec, Toolbox};

use crate::args::Args;

/// The workspace tools.
pub struct Workspace;

impl Toolbox for Workspace {
    /// The five tools' specs.
    fn describe() -> Vec<ToolSpec> {
        vec![
            list::spec(),
            search::spec(),
            read::spec(),
            write::spec(),
            edit::spec(),
        ]
    }

    /// Runs one call of one of the tools.
    fn invoke(call: ToolCall) -> Result<Value, ToolError> {
        let paths = |key: &str| -> Vec<std::path::PathBuf> {
            call.arguments
                .get(key)
                .and_then(serde_json::Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(serde_json::Value::as_str)
                        .map(std::path::PathBuf::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        walk::set_excluded(paths("_exclude"), paths("_include"));
        lint::set_ruff(call.arguments.get("_ruff") == Some(&Value::Bool(true)));
        let args = Args::new(&call.name, &call.arguments);
        let output = match call.name.as_str() {
            "list_files" => list::run(&args)?,
            "search_files" => search::run(&args)?,
            "read_file" => read::run(&args)?,
            "write_file" => write::run(&args)?,
            "edit_file" => edit::run(&args)?,
            other => return Err(ToolError::invalid(format!("unknown tool '{other}'"))),
        };
        // A Python file for the host to lint with ruff: the answer and the
        // file, which the host makes one text (stepwell_tools::ruff).
        if let Some(request) = lint::take_ruff_request() {
            return Ok(serde_json::json!({"text": output, "ruff": request}));
        }
        Ok(Value::String(output))
    }
}

#[cfg(target_arch = "wasm32")]
stepwell_guest::export_toolbox!(Workspace);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn describes_five_tools() {
        let specs = Workspace::describe();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "list_files",
                "search_files",
                "read_file",
                "write_file",
                "edit_file"
            ]
        );
        for spec in &specs {
            assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
            let props = spec.parameters["properties"].as_object().unwrap();
            for required in spec.parameters["required"].as_array().unwrap() {
                assert!(
                    props.contains_key(required.as_str().unwrap()),
                    "{}",
                    spec.name
                );
            }
            for (name, prop) in props {
                assert!(prop["type"].is_string(), "{}.{name}", spec.name);
                assert!(prop["description"].is_string(), "{}.{name}", spec.name);
            }
        }
    }

    /// With `_ruff`, a Python file written or edited is handed back for
    /// the host to lint (the file on disk after a write, the edited text
    /// after an edit); other files keep their own notices.
    #[test]
    fn python_files_go_back_to_the_host_for_ruff() {
        let dir = std::env::temp_dir().join(format!("tool-workspace-ruff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let py = dir.join("m.py");
        let call = |name: &str, args: Value| {
            Workspace::invoke(ToolCall {
                call_id: "c1".into(),
                name: name.into(),
                arguments: args.as_object().unwrap().clone(),
            })
            .unwrap()
        };
        let p = py.to_str().unwrap();
        let out = call(
            "write_file",
            json!({"file_path": p, "content": "x = 1\n", "_ruff": true}),
        );
        assert_eq!(out["ruff"], json!({"path": p, "content": null}));
        assert!(out["text"]
            .as_str()
            .unwrap()
            .starts_with("✅ Successfully written"));
        let out = call(
            "edit_file",
            json!({"file_path": p, "pattern": "x = 1", "replacement": "x = 2", "_ruff": true}),
        );
        assert_eq!(out["ruff"], json!({"path": p, "content": "x = 2\n"}));
        let out = call(
            "edit_file",
            json!({"file_path": p, "pattern": "x = 2", "replacement": "x = 3"}),
        );
        assert!(out
            .as_str()
            .unwrap()
            .ends_with("\n\nNotice: lint (python/ruff) unavailable: ruff not installed"));
        let js = dir.join("a.js");
        let out = call(
            "write_file",
            json!({"file_path": js.to_str().unwrap(), "content": "f(\n", "_ruff": true}),
        );
        assert!(out
            .as_str()
            .unwrap()
            .ends_with("unclosed_delimiter: opened '(' at 1:2 (reached EOF)"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_tools_and_bad_arguments_are_refused() {
        let call = |name: &str, args: Value| ToolCall {
            call_id: "c1".into(),
            name: name.into(),
            arguments: args.as_object().unwrap().clone(),
        };
        assert_eq!(
            Workspace::invoke(call("nope", json!({}))),
            Err(ToolError::invalid("unknown tool 'nope'"))
        );
        assert_eq!(
            Workspace::invoke(call("read_file", json!({}))),
            Err(ToolError::invalid("read_file requires file_path"))
        );
        assert_eq!(
            Workspace::invoke(call("list_files", json!({"recursive": "sometimes"}))),
            Err(ToolError::invalid(
                "argument 'recursive': expected a boolean but got 'sometimes'; use one of true/false/1/0/yes/no/on/off"
            ))
        );
    }
}

//! `stepwell inspect`: what a component file is and what it expects, read
//! without compiling it or opening a store.

use std::path::PathBuf;

use serde_json::Value;
use stepwell::wasm::{inspect, ComponentInfo};
use stepwell::{Error, Result};

use super::render::Report;

/// What `stepwell inspect` was asked.
#[derive(clap::Args)]
pub(crate) struct InspectArgs {
    /// The component file (`.wasm`).
    component: PathBuf,
}

/// The largest file read: more than any component this host loads.
const MAX_FILE: u64 = 1 << 30;

/// `stepwell inspect COMPONENT`: its encoding and size, the world it
/// implements, the contract version it was built against, its imports and
/// exports, and the vars, config and routes its author declared.
pub(crate) fn run(args: InspectArgs) -> Result<Report> {
    let path = args.component;
    let field = path.display().to_string();
    let size = std::fs::metadata(&path)
        .map_err(|e| Error::invalid(&field, format!("cannot read it: {e}")))?
        .len();
    if size > MAX_FILE {
        return Err(Error::invalid(
            &field,
            format!("{size} bytes: larger than any component (1 GiB)"),
        ));
    }
    let bytes =
        std::fs::read(&path).map_err(|e| Error::invalid(&field, format!("cannot read it: {e}")))?;
    let info = inspect(&bytes).map_err(|e| Error::invalid(&field, e))?;
    let mut report = Report::pretty(&info);
    report.push(field);
    for line in lines(&info) {
        report.push(line);
    }
    Ok(report)
}

/// The text lines: a label column, then the value.
fn lines(info: &ComponentInfo) -> Vec<String> {
    let mut out = vec![format!(
        "  encoding  {}, {} bytes ({:.1} MiB)",
        info.encoding,
        info.size,
        info.size as f64 / (1u64 << 20) as f64
    )];
    out.push(format!(
        "  world     {}",
        match info.world {
            Some(w) => format!("{w} (exports {})", info.exports.join(", ")),
            None if info.exports.is_empty() => "none: it exports nothing".into(),
            None => format!("none of this host's (exports {})", info.exports.join(", ")),
        }
    ));
    let ours = stepwell::wasm::CONTRACT;
    out.push(format!(
        "  contract  {}",
        match (&info.contract, info.contract_matches) {
            (Some(v), Some(true)) => format!("stepwell:flow@{v} (this host's)"),
            (Some(v), _) =>
                format!("stepwell:flow@{v} (this host implements {ours}: it does not load)"),
            (None, _) => "none named: it imports nothing from stepwell:flow".into(),
        }
    ));
    for (i, import) in info.imports.iter().enumerate() {
        let label = if i == 0 { "imports" } else { "" };
        out.push(format!("  {label:8}  {import}"));
    }
    if info.imports.is_empty() {
        out.push("  imports   none".into());
    }
    out.extend(declared(info));
    out
}

/// What the author declared, or how to declare it.
fn declared(info: &ComponentInfo) -> Vec<String> {
    if let Some(e) = &info.description_error {
        return vec![format!("  declared  unreadable: {e}")];
    }
    let Some(d) = &info.description else {
        return vec![
            "  declared  nothing (in Rust: stepwell_guest::describe_node!, see docs/wit.md)".into(),
        ];
    };
    let mut out = vec![format!(
        "  declared  {}",
        d["description"].as_str().unwrap_or("(no description)")
    )];
    for key in ["vars", "config"] {
        if let Some(fields) = d[key].as_object() {
            for (i, (name, what)) in fields.iter().enumerate() {
                let label = if i == 0 { key } else { "" };
                out.push(format!("    {label:6}  {name}: {}", text(what)));
            }
        }
    }
    if let Some(routes) = d["routes"].as_array() {
        let names: Vec<String> = routes.iter().map(text).collect();
        out.push(format!("    routes  {}", names.join(", ")));
    }
    out
}

/// A declared value as text: a string as it is, anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

//! `stepwell inspect`: what a component file is and what it expects, read
//! without compiling it or opening a store.

use std::path::{Path, PathBuf};

use serde_json::Value;
use stepwell::wasm::{inspect, ComponentInfo};
use stepwell::{Error, Result};

use super::render::Report;

/// What `stepwell inspect` was asked.
#[derive(clap::Args)]
pub(crate) struct InspectArgs {
    /// The component file (`.wasm`).
    component: PathBuf,
    /// Declare what the component expects: write it, with this JSON
    /// object (description, vars, config, routes) as its `stepwell:node`
    /// section, to --output, then inspect that. For components of
    /// toolchains without `describe_node!`.
    #[arg(long, value_name = "JSON_FILE", requires = "output")]
    declare: Option<PathBuf>,
    /// Where --declare writes the component (not the file it reads).
    #[arg(long, short = 'o', requires = "declare")]
    output: Option<PathBuf>,
}

/// The largest file read (an 18 MiB Python component is a large one).
const MAX_FILE: u64 = 1 << 30;

/// `stepwell inspect COMPONENT`: its encoding and size, the world it
/// implements, the contract version it was built against, its imports and
/// exports, and the vars, config and routes its author declared.
pub(crate) fn run(args: InspectArgs) -> Result<Report> {
    let (path, bytes) = read(args.component)?;
    let (path, bytes) = match (args.declare, args.output) {
        (Some(json), Some(out)) => declare(&path, &bytes, &json, out)?,
        _ => (path, bytes),
    };
    let field = shown(&path.display().to_string());
    let info = inspect(&bytes).map_err(|e| Error::invalid(&field, e))?;
    let mut report = Report::pretty(&info);
    report.push(field);
    for line in lines(&info) {
        report.push(line);
    }
    Ok(report)
}

/// Writes `bytes` (read from `path`) with the description in `json` to
/// `out`, and gives that file back.
fn declare(path: &Path, bytes: &[u8], json: &Path, out: PathBuf) -> Result<(PathBuf, Vec<u8>)> {
    let field = json.display().to_string();
    if out == path {
        return Err(Error::invalid(
            "--output",
            "is the file read: write the declared component elsewhere",
        ));
    }
    let text =
        std::fs::read(json).map_err(|e| Error::invalid(&field, format!("cannot read it: {e}")))?;
    let description: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::invalid(&field, format!("not JSON: {e}")))?;
    let declared = stepwell::wasm::inspect::with_description(bytes, &description)
        .map_err(|e| Error::invalid(shown(&path.display().to_string()), e))?;
    std::fs::write(&out, &declared)
        .map_err(|e| Error::invalid("--output", format!("cannot write {}: {e}", out.display())))?;
    Ok((out, declared))
}

/// The component file at `path`: a regular file (not a device or a pipe,
/// which could be read forever), at most [`MAX_FILE`] bytes.
fn read(path: PathBuf) -> Result<(PathBuf, Vec<u8>)> {
    use std::io::Read;
    let field = shown(&path.display().to_string());
    let cannot = |e: std::io::Error| Error::invalid(&field, format!("cannot read it: {e}"));
    let meta = std::fs::metadata(&path).map_err(cannot)?;
    if !meta.is_file() {
        return Err(Error::invalid(&field, "not a regular file"));
    }
    if meta.len() > MAX_FILE {
        return Err(Error::invalid(
            &field,
            format!("{} bytes: more than the 1 GiB read", meta.len()),
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .map_err(cannot)?
        .take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(Error::invalid(&field, "grew past the 1 GiB read"));
    }
    Ok((path, bytes))
}

/// `text` safe to print: control characters (a terminal's escape
/// sequences, line breaks) written as `\u{..}` escapes. A component's
/// description is its author's text, and inspect is for components of
/// unknown origin.
fn shown(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `bytes` in KiB under a MiB (a C component is some 20 KiB), else in MiB.
fn human_size(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The text lines: a label column, then the value.
fn lines(info: &ComponentInfo) -> Vec<String> {
    let mut out = vec![format!(
        "  encoding  {}, {} bytes ({})",
        info.encoding,
        info.size,
        human_size(info.size)
    )];
    if info.encoding != "component" {
        out.push(
            "  world     none: a core module, not a component (this host loads components only)"
                .into(),
        );
        return out;
    }
    out.push(format!(
        "  world     {}",
        match info.world {
            Some(w) => format!("{w} (exports {})", shown(&info.exports.join(", "))),
            None if info.exports.is_empty() => "none: it exports nothing".into(),
            None => format!(
                "none of this host's (exports {})",
                shown(&info.exports.join(", "))
            ),
        }
    ));
    let ours = stepwell::wasm::CONTRACT;
    out.push(format!(
        "  contract  {}",
        match (&info.contract, info.contract_matches) {
            (Some(v), Some(true)) => format!("stepwell:flow@{v} (this host's)"),
            (Some(v), _) => format!(
                "stepwell:flow@{} (this host implements {ours}: built against another version)",
                shown(v)
            ),
            (None, _) => "no version named by its stepwell:flow imports".into(),
        }
    ));
    for (i, import) in info.imports.iter().enumerate() {
        let label = if i == 0 { "imports" } else { "" };
        out.push(format!("  {label:8}  {}", shown(import)));
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
        return vec![format!("  declared  unreadable: {}", shown(e))];
    }
    let Some(d) = &info.description else {
        return vec![if info.world == Some("node") {
            "  declared  nothing (a one-line describe in every SDK, inspect --declare for any component: docs/nodes.md)".into()
        } else {
            "  declared  nothing".into()
        }];
    };
    let mut out = vec![format!(
        "  declared  {}",
        shown(d["description"].as_str().unwrap_or("(no description)"))
    )];
    for key in ["vars", "config"] {
        if let Some(fields) = d[key].as_object() {
            for (i, (name, what)) in fields.iter().enumerate() {
                let label = if i == 0 { key } else { "" };
                out.push(format!(
                    "    {label:6}  {}: {}",
                    shown(name),
                    shown(&text(what))
                ));
            }
        }
    }
    if let Some(routes) = d["routes"].as_array() {
        let names: Vec<String> = routes.iter().map(text).collect();
        out.push(format!("    routes  {}", shown(&names.join(", "))));
    }
    out
}

/// A declared value as text: a string as it is, anything else as JSON.
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

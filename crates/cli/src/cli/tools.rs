//! `stepwell tools list`: the tools `tool_calls` may run.

use clap::Subcommand;
use stepwell::tools::ToolsExt;
use stepwell::{Error, Runtime};

use super::render::Report;

/// The `tools` subcommands.
#[derive(Subcommand)]
pub(crate) enum ToolCommand {
    /// List every tool with its class, origin and availability.
    List,
}

/// Runs a `tools` subcommand.
pub(crate) fn run(rt: &Runtime, command: ToolCommand) -> Result<Report, Error> {
    match command {
        ToolCommand::List => list(rt),
    }
}

/// Lists the tools: name, class, origin, and why one is unavailable.
fn list(rt: &Runtime) -> Result<Report, Error> {
    let table = rt.tools()?;
    let mut report = Report::pretty(table.entries());
    for e in table.entries() {
        let class = e.spec.as_ref().map_or("-", |s| s.class.as_str());
        let origin = match &e.origin {
            stepwell::tools::Origin::Builtin => "builtin".to_string(),
            stepwell::tools::Origin::Host => "host (not sandboxed)".to_string(),
            stepwell::tools::Origin::File(p) => p.display().to_string(),
        };
        report.push(match &e.reason {
            None => format!("{:<16} {:<7} {origin}", e.name, class),
            Some(why) => format!("{:<16} {:<7} {origin}  UNAVAILABLE: {why}", e.name, class),
        });
    }
    Ok(report)
}

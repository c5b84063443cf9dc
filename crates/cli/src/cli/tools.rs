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
    let mut rows = Vec::new();
    for e in table.entries() {
        let class = e.spec.as_ref().map_or("-", |s| s.class.as_str());
        let origin = match &e.origin {
            stepwell::tools::Origin::Builtin => "builtin".to_string(),
            stepwell::tools::Origin::Host => "host (not sandboxed)".to_string(),
            stepwell::tools::Origin::File(p) => p.display().to_string(),
        };
        // Why one is unavailable (any length) last: it pads no column.
        let mut row = vec![e.name.clone(), class.to_string(), origin];
        row.extend(e.reason.as_ref().map(|why| format!("UNAVAILABLE: {why}")));
        rows.push(row);
    }
    Ok(Report::pretty(table.entries()).lines(super::render::table(&rows)))
}

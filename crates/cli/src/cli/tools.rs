//! `stepwell tools list`: the tools `tool_calls` may run.

use stepwell::tools::ToolsExt;
use stepwell::{Error, Runtime};

/// Lists the tools: name, class, origin, and why one is unavailable.
pub(crate) fn list(rt: &Runtime, json: bool) -> Result<(), Error> {
    let table = rt.tools()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(table.entries()).unwrap_or_default()
        );
    } else {
        for e in table.entries() {
            let class = e.spec.as_ref().map_or("-", |s| s.class.as_str());
            let origin = match &e.origin {
                stepwell::tools::Origin::Builtin => "builtin".to_string(),
                stepwell::tools::Origin::Host => "host (not sandboxed)".to_string(),
                stepwell::tools::Origin::File(p) => p.display().to_string(),
            };
            match &e.reason {
                None => println!("{:<16} {:<7} {origin}", e.name, class),
                Some(why) => {
                    println!("{:<16} {:<7} {origin}  UNAVAILABLE: {why}", e.name, class)
                }
            }
        }
    }
    Ok(())
}

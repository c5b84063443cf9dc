//! `stepwell triggers`: the trigger sources, without a store.

use std::path::PathBuf;

use serde_json::Value;
use stepwell::{Error, SandboxLimits};

use super::input::{parse_json, parse_time_arg};
use crate::TriggerCommand;

/// Lists, validates, previews or calls the trigger sources (the built-in
/// ones and `dir`'s), compiled into `cache_dir`.
pub(crate) fn run(
    cache_dir: Option<PathBuf>,
    limits: SandboxLimits,
    dir: Option<PathBuf>,
    command: TriggerCommand,
    now: Option<String>,
    json: bool,
) -> Result<(), Error> {
    let engine = stepwell::WasmEngine::new(stepwell::EngineConfig {
        cache_dir,
        limits,
        digests: None,
    })?;
    let registry = stepwell::triggers::TriggerRegistry::load(&engine, dir.as_deref())?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    match command {
        TriggerCommand::List => {
            if json {
                println!("{}", pretty(&serde_json::json!(registry.entries())));
            } else {
                for e in registry.entries() {
                    let origin = match &e.origin {
                        stepwell::triggers::Origin::Builtin => "builtin".to_string(),
                        stepwell::triggers::Origin::Plugin(p) => p.display().to_string(),
                    };
                    let label = e
                        .descriptor
                        .as_ref()
                        .map(|d| d.label.as_str())
                        .unwrap_or("-");
                    match &e.reason {
                        None => println!("{:16} available    {label}  ({origin})", e.name),
                        Some(r) => println!("{:16} unavailable  {r}  ({origin})", e.name),
                    }
                }
            }
        }
        TriggerCommand::Validate { source, config } => {
            let now = parse_time_arg("--now", now)?;
            let config = parse_json("--config", &config)?;
            let out = registry.call(
                &source,
                "validate",
                &serde_json::json!({"config": config}),
                now,
            )?;
            println!("{}", if json { out.to_string() } else { pretty(&out) });
        }
        TriggerCommand::Preview {
            source,
            config,
            from,
            count,
        } => {
            let from = parse_time_arg("--from", from)?;
            let preview =
                registry.preview(&source, &parse_json("--config", &config)?, from, count)?;
            if json {
                println!("{}", pretty(&serde_json::json!(preview)));
            } else {
                for f in &preview.fires {
                    println!("{}  {}  {}", f.fired_at, f.event_id, f.payload);
                }
                println!(
                    "({} fire times; ends: {})",
                    preview.fires.len(),
                    preview.end
                );
            }
        }
        TriggerCommand::Call {
            source,
            method,
            input,
        } => {
            let out = registry.call(
                &source,
                &method,
                &parse_json("--input", &input)?,
                chrono::Utc::now(),
            )?;
            println!("{}", if json { out.to_string() } else { pretty(&out) });
        }
    }
    Ok(())
}

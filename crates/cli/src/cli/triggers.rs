//! `stepwell triggers`: the trigger sources, without a store.

use std::path::PathBuf;

use clap::Subcommand;
use stepwell::{Error, SandboxLimits};

use super::input::{parse_json, parse_time_arg};
use super::render::Report;

/// The `triggers` subcommands.
#[derive(Subcommand)]
pub(crate) enum TriggerCommand {
    /// List every source with its descriptor and availability.
    List,
    /// Validate a config; prints it with its defaults filled in.
    Validate {
        /// SOURCE@VERSION, for example schedule@1.
        source: String,
        /// The config, a JSON object. The creation time is the global
        /// `--now` (default: the current time).
        #[arg(long)]
        config: String,
    },
    /// Print the next fire times, as the source computes them.
    Preview {
        /// SOURCE@VERSION.
        source: String,
        /// The config, a JSON object.
        #[arg(long)]
        config: String,
        /// Start from this time (default: now), RFC 3339.
        #[arg(long)]
        from: Option<String>,
        /// How many fire times.
        #[arg(long, default_value_t = 5)]
        count: usize,
    },
    /// Call one method (validate, initial-state, prepare, admit, rearm,
    /// normalize) with its arguments as one JSON object; print the result.
    Call {
        /// SOURCE@VERSION.
        source: String,
        /// The method.
        method: String,
        /// The arguments, for example {"binding": {...}, "state": {...}, "now": "..."}.
        #[arg(long)]
        input: String,
    },
}

/// Lists, validates, previews or calls the trigger sources (the built-in
/// ones and `dir`'s), compiled into `cache_dir`.
pub(crate) fn run(
    cache_dir: Option<PathBuf>,
    limits: SandboxLimits,
    dir: Option<PathBuf>,
    command: TriggerCommand,
    now: Option<String>,
) -> Result<Report, Error> {
    let engine = stepwell::WasmEngine::new(stepwell::EngineConfig {
        cache_dir,
        limits,
        digests: None,
    })?;
    let registry = stepwell::triggers::TriggerRegistry::load(&engine, dir.as_deref())?;
    Ok(match command {
        TriggerCommand::List => {
            let mut rows = Vec::new();
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
                let (state, what) = match &e.reason {
                    None => ("available", label.to_string()),
                    Some(r) => ("unavailable", r.to_string()),
                };
                // The text of any length (a label, why it is unavailable)
                // last: it pads no other column.
                rows.push(vec![e.name.clone(), state.into(), origin, what]);
            }
            Report::pretty(&serde_json::json!(registry.entries()))
                .lines(super::render::table(&rows))
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
            Report::value(&out)
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
            let mut report = Report::pretty(&serde_json::json!(preview));
            for f in &preview.fires {
                report.push(format!("{}  {}  {}", f.fired_at, f.event_id, f.payload));
            }
            report.line(format!(
                "({} fire times; ends: {})",
                preview.fires.len(),
                preview.end
            ))
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
            Report::value(&out)
        }
    })
}

//! The host a command runs on: the store the flags name, the sandbox's
//! bounds, the durability, the clock, and the options the environment adds
//! (docs/cli.md).

use std::path::PathBuf;
use std::time::Duration;

use stepwell::host::{HostOptions, StoreSpec, DEFAULT_DB};
use stepwell::{Durability, Error, RuntimeConfig, SandboxLimits};

use crate::{Cli, Command};

/// What [`host`] made of the flags.
pub(crate) struct Host {
    /// The store.
    pub(crate) spec: StoreSpec,
    /// How the runtime is set up over it.
    pub(crate) options: HostOptions,
    /// The server's token file (`serve` only), out of every tool's reach.
    pub(crate) serve_token: Option<PathBuf>,
}

/// Reads the global flags (and the environment) into a [`Host`].
pub(crate) fn host(cli: &Cli) -> Result<Host, Error> {
    let spec = match &cli.store {
        Some(text) => StoreSpec::parse(text)?,
        None => StoreSpec::Sqlite(cli.db.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DB))),
    };
    let limits = limits(cli)?;
    let durability = cli
        .durability
        .as_deref()
        .map(|d| {
            Durability::parse(d).ok_or_else(|| Error::InvalidInput {
                field: "--durability".into(),
                message: format!("{d:?} is not normal or full"),
            })
        })
        .transpose()?;
    let fixed_now = fixed_now(cli)?;
    // The server's token file, wherever it is, is out of every tool's
    // reach (a tool that read it would put it in a ledger).
    let state_home = super::environment::state_home();
    let serve_token = match &cli.command {
        Command::Serve(args) => {
            let path = match &args.token_file {
                Some(path) => path.clone(),
                None => spec
                    .token_file(state_home.as_deref())
                    .map_err(|e| match e {
                        Error::InvalidInput { message, .. } => Error::InvalidInput {
                            field: "--token-file".into(),
                            message: format!(
                                "{message}: name the file, or set XDG_STATE_HOME or HOME (the user's state folder)"
                            ),
                        },
                        other => other,
                    })?,
            };
            Some(std::path::absolute(&path).unwrap_or(path))
        }
        _ => None,
    };
    let options = HostOptions {
        limits,
        durability,
        config: RuntimeConfig {
            lease_ttl: Duration::from_millis(cli.lease_ttl_ms),
            tool_deny_paths: serve_token.iter().cloned().collect(),
            drive_workers: RuntimeConfig::host_drive_workers(),
            // The server's calls never wait on a model or a tool: the run
            // is answered `running`, and goes on when the effect lands.
            calls_in_flight: matches!(cli.command, Command::Serve(_)),
            ..RuntimeConfig::default()
        },
        clock: fixed_now.map(|t| {
            std::sync::Arc::new(stepwell::ManualClock::new(t))
                as std::sync::Arc<dyn stepwell::Clock>
        }),
        tool_dir: cli.tool_dir.clone(),
        trigger_dir: super::environment::trigger_dir(),
        enable_exec: cli.enable_exec || super::environment::exec_enabled(),
        exec_env: super::environment::exec_env(),
        ruff: cli.ruff.clone(),
        home: super::environment::home(),
        cache_home: super::environment::cache_home(),
        state_home,
        effects: vec![super::environment::llm_call()],
        tracer: super::environment::tracer(cli.otlp_endpoint.as_deref())?,
    };
    Ok(Host {
        spec,
        options,
        serve_token,
    })
}

/// The bounds of one guest call the `--guest-*` flags set.
fn limits(cli: &Cli) -> Result<SandboxLimits, Error> {
    if !(1..=65_536).contains(&cli.guest_memory_mib) {
        return Err(Error::InvalidInput {
            field: "--guest-memory-mib".into(),
            message: format!("{} is not between 1 and 65536", cli.guest_memory_mib),
        });
    }
    if cli.guest_time_ms == 0 {
        return Err(Error::InvalidInput {
            field: "--guest-time-ms".into(),
            message: "must be at least 1".into(),
        });
    }
    let memory_limit_bytes = cli.guest_memory_mib << 20;
    Ok(SandboxLimits {
        time_limit: Duration::from_millis(cli.guest_time_ms),
        memory_limit_bytes,
        // All live guests together: at least 1 GiB, and room for four at
        // the guest limit.
        total_memory_bytes: SandboxLimits::default()
            .total_memory_bytes
            .max(memory_limit_bytes.saturating_mul(4)),
        ..SandboxLimits::default()
    })
}

/// The time `--now` fixes the clock at, if given (RFC 3339, not before
/// 1970).
fn fixed_now(cli: &Cli) -> Result<Option<chrono::DateTime<chrono::Utc>>, Error> {
    cli.now
        .as_deref()
        .map(|t| {
            // The field is named once, by the error (not again in its
            // message).
            let t = stepwell::automation::parse_timestamp(t, "the time").map_err(|e| {
                Error::InvalidInput {
                    field: "--now".into(),
                    message: e.message,
                }
            })?;
            if t.timestamp() < 0 {
                // Guests count time from 1970 (wit.md, `node-input.now`).
                return Err(Error::InvalidInput {
                    field: "--now".into(),
                    message: format!("{} is before 1970", stepwell::core::clock::format_time(t)),
                });
            }
            Ok(t)
        })
        .transpose()
}

//! The `stepwell` binary: argument parsing and printing over the library.

mod cli;

/// The binary's allocator: mimalloc (the default feature `mimalloc`;
/// `--no-default-features` keeps the system's). A step allocates and frees
/// a few dozen small values (strings, JSON maps); glibc's malloc and free
/// took a tenth of an in-memory step's instructions for them
/// (docs/performance.md, "The allocator"). The library leaves the choice
/// to the application that embeds it.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{Map, Value};
use stepwell::host::{open_runtime, HostOptions, StoreSpec, DB_ENV, DEFAULT_DB};
use stepwell::{
    Durability, Error, RunQuery, RunState, RunStatus, RuntimeConfig, SandboxLimits, StartOptions,
    WaitReason,
};

/// stepwell: a durable, WebAssembly-sandboxed workflow host.
#[derive(Parser)]
#[command(name = "stepwell", version, about)]
struct Cli {
    /// The SQLite database (default .stepwell/stepwell.sqlite under the current directory).
    #[arg(long, global = true, env = DB_ENV)]
    db: Option<PathBuf>,
    /// The store: memory, sqlite:PATH, json:DIR or a PostgreSQL URL
    /// (postgres://user@host:port/db; several hosts may share it)
    /// (overrides --db).
    #[arg(long, global = true, env = "STEPWELL_STORE")]
    store: Option<String>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Wall-time limit of one guest call, in milliseconds.
    #[arg(long, global = true, default_value_t = 2000)]
    guest_time_ms: u64,
    /// Memory limit of one guest instance, in MiB.
    #[arg(long, global = true, default_value_t = 256)]
    guest_memory_mib: usize,
    /// What a commit survives: normal (a killed process; the SQLite
    /// default) or full (also a power loss; the JSON-file default).
    #[arg(long, global = true, env = "STEPWELL_DURABILITY")]
    durability: Option<String>,
    /// Fix the clock at this time (RFC 3339) for this one command: the
    /// runtime, the driver's due waits and automations read it (tests,
    /// previews, what-ifs).
    #[arg(long, global = true)]
    now: Option<String>,
    /// How long a run's lease lasts unless renewed, in milliseconds: after a
    /// host dies, its runs wait this long before another host takes them.
    #[arg(long, global = true, default_value_t = 30_000)]
    lease_ttl_ms: u64,
    /// A folder of third-party tool components (*.wasm) that `tool_calls`
    /// may run beside the built-in workspace tools.
    #[arg(long, global = true, env = stepwell::tools::TOOL_DIR_ENV)]
    tool_dir: Option<PathBuf>,
    /// Offer the host tool execute_command: shell commands run with this
    /// process's rights, each after a person's approval (also
    /// STEPWELL_ENABLE_EXEC=1).
    #[arg(long, global = true)]
    enable_exec: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a run of a flow bundle and tick it until it waits or ends.
    Run {
        /// The bundle directory (holding flow.json).
        flow_dir: PathBuf,
        /// The run's initial vars, a JSON object.
        #[arg(long)]
        vars: Option<String>,
        /// Run this workflow of the bundle instead of the main one.
        #[arg(long)]
        workflow: Option<String>,
        /// An explicit run id (created only if free).
        #[arg(long)]
        run_id: Option<String>,
        /// The operator's policy for the run, a JSON object merged into
        /// `vars._runtime` (only the keys of docs/tools.md, "Run policy":
        /// allowed_tools, tool_policy, tool_executor, tool_timeout_s,
        /// workspace_read_only, workspace_read_only_paths, ...).
        #[arg(long)]
        runtime: Option<String>,
        /// Start the run as a turn of this session (a discussion's session:
        /// the run is anchored to the discussion's root, its workspace and
        /// read-only mount).
        #[arg(long)]
        session: Option<String>,
        /// Hand the run the session's history as `vars.context.messages`
        /// (its completed turns within the 50,000-token window, read
        /// strictly; with --session).
        #[arg(long, requires = "session")]
        history: bool,
    },
    /// Resume a waiting run with a payload.
    Resume {
        /// The run.
        run_id: String,
        /// The payload, JSON (for ask_user: {"text": "..."}).
        #[arg(long)]
        payload: String,
        /// The wait key (default: the key the run waits on now).
        #[arg(long)]
        wait_key: Option<String>,
    },
    /// Print a run's state.
    Status {
        /// The run.
        run_id: String,
    },
    /// Print a run's ledger, oldest record first.
    Ledger {
        /// The run.
        run_id: String,
        /// Check the hash chain instead: report the first record that was
        /// changed, removed or reordered (exit status 1 when one was).
        #[arg(long)]
        verify: bool,
        /// Keep printing new records as they are appended (by any process),
        /// until the run ends.
        #[arg(long, conflicts_with = "verify")]
        follow: bool,
        /// With --follow: how often to look, in milliseconds.
        #[arg(long, default_value_t = 200)]
        poll_ms: u64,
    },
    /// List runs.
    List {
        /// Only runs with this status (running, waiting, completed, failed, cancelled).
        #[arg(long)]
        status: Option<String>,
        /// Only waiting runs with this reason (event, until, user, job, subworkflow).
        #[arg(long)]
        wait_reason: Option<String>,
        /// Only runs of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// At most this many runs (default 100; when more match, a line on
        /// standard error says how to see the next ones).
        #[arg(long)]
        limit: Option<usize>,
        /// Only the runs listed after this one (the last run of the page
        /// before).
        #[arg(long)]
        after: Option<String>,
        /// List the quarantined runs (set aside because they cannot be
        /// read or committed) and why, instead.
        #[arg(long)]
        quarantined: bool,
    },
    /// Cancel a run and its unfinished children.
    Cancel {
        /// The run.
        run_id: String,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// The driver: resume due time waits and deadlines, tick running runs,
    /// resume the parents of finished children. Loops until interrupted.
    /// Any number of drivers may run on one store.
    Drive {
        /// Do one pass and exit.
        #[arg(long)]
        once: bool,
        /// Do passes until one moves nothing, then exit (controllers admit
        /// and dispatch, occurrences run, parents resume).
        #[arg(long, conflicts_with = "once")]
        until_idle: bool,
        /// Pause between passes, in milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
    },
    /// Automations: a workflow fired again and again by a trigger.
    Automations {
        #[command(subcommand)]
        command: cli::automations::AutomationCommand,
    },
    /// Trigger connections: a webhook endpoint and its signing secret, a
    /// feed; their events; a test event.
    Connections {
        #[command(subcommand)]
        command: cli::connections::ConnectionCommand,
    },
    /// Sessions: the turns of a conversation and the history a model is
    /// handed again.
    Sessions {
        #[command(subcommand)]
        command: cli::sessions::SessionCommand,
    },
    /// Snapshots: named bookmarks of a run's state.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// Trigger sources: list them, validate a config, preview fire times,
    /// call one method.
    Triggers {
        /// A folder of third-party trigger-source components (*.wasm).
        #[arg(long, global = true, env = stepwell::triggers::PLUGIN_DIR_ENV)]
        trigger_dir: Option<PathBuf>,
        #[command(subcommand)]
        command: TriggerCommand,
    },
    /// The store's schema: create it or bring it to this build's version.
    Db {
        #[command(subcommand)]
        command: DbCommand,
    },
    /// Tools: list what `tool_calls` can run.
    Tools {
        #[command(subcommand)]
        command: ToolCommand,
    },
    /// Serve the HTTP API (runs, ledgers, live streams, automations), the
    /// AHP automation-run channel and the web dashboard, and drive the
    /// store (as `stepwell drive`) in the same process. Prints the URL and
    /// where the bearer token is; stops on SIGTERM or Ctrl-C.
    Serve {
        /// The address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// The bearer token's file (default: serve-token beside the
        /// database; created with a random token, mode 0600, when missing).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The driver's pause between passes, in milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
        /// Only answer the API: leave moving runs to `stepwell drive`
        /// processes.
        #[arg(long)]
        no_drive: bool,
        /// Log lines as text or json (filtered by RUST_LOG, default info).
        #[arg(long, default_value = "text")]
        log_format: String,
        /// The largest request body, in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        max_body_bytes: usize,
        /// The most connections served at once (more wait to be accepted).
        #[arg(long, default_value_t = 1024)]
        max_connections: usize,
        /// How long a client may take to send a request's headers, in
        /// milliseconds (slower, the connection is closed).
        #[arg(long, default_value_t = 15_000)]
        header_timeout_ms: u64,
        /// How long a write to a client may wait for it to read, in
        /// milliseconds (longer, the connection is closed).
        #[arg(long, default_value_t = 15_000)]
        write_timeout_ms: u64,
        /// How long a client may take to send a request's body, in
        /// milliseconds (slower, it is answered 408 and the connection
        /// closed).
        #[arg(long, default_value_t = 10_000)]
        body_timeout_ms: u64,
        /// The bytes that request bodies being read may hold across all
        /// connections (a request over it is answered 503 at once).
        #[arg(long, default_value_t = 32 << 20)]
        max_body_bytes_in_flight: usize,
    },
    /// Measure the host and print the figures (medians). Uses its own scratch
    /// stores and the default guest limits: --db and the --guest-* flags do
    /// not apply.
    Bench {
        /// The repository's flows/ directory.
        #[arg(long, default_value = "flows")]
        flows: PathBuf,
        /// Fewer samples: a quick look, not a measurement.
        #[arg(long)]
        quick: bool,
        /// Run only the benchmarks whose figure names contain this text.
        #[arg(long)]
        only: Option<String>,
        /// Measure scale instead: one driver pass among 1,000 and 100,000
        /// parked runs, the driver's memory, bytes per parked run, 1,000
        /// automations ticking at once, the raw SQLite commit ceiling.
        #[arg(long)]
        scale: bool,
    },
    /// One process of a multi-process benchmark (started by `bench`).
    #[command(hide = true)]
    BenchWorker {
        /// `resume-all`.
        task: String,
        /// Its input file.
        file: PathBuf,
        /// Who the process is.
        who: String,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Take a snapshot of a run's current state.
    Create {
        /// The run.
        run_id: String,
        /// A short name.
        #[arg(long)]
        name: String,
        /// A longer description.
        #[arg(long, default_value = "")]
        description: String,
        /// A tag (repeat for several).
        #[arg(long = "tag")]
        tags: Vec<String>,
    },
    /// List snapshots, newest first.
    List {
        /// Only snapshots of this run.
        #[arg(long)]
        run: Option<String>,
        /// Only snapshots with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// Only snapshots whose name or description contains this text.
        #[arg(long)]
        text: Option<String>,
    },
    /// Make a snapshot's state the run's state again.
    Restore {
        /// The snapshot.
        snapshot_id: String,
    },
}

#[derive(Subcommand)]
enum DbCommand {
    /// Create the store's schema or migrate it to this build's version
    /// (opening a store does too; this does only that, and prints the
    /// version). Refused when the store was written by a newer stepwell.
    Migrate,
}

#[derive(Subcommand)]
enum ToolCommand {
    /// List every tool with its class, origin and availability.
    List,
}

#[derive(Subcommand)]
enum TriggerCommand {
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

fn parse_time_arg(
    field: &str,
    text: Option<String>,
) -> Result<chrono::DateTime<chrono::Utc>, Error> {
    match text {
        None => Ok(chrono::Utc::now()),
        Some(t) => stepwell::core::clock::parse_time(&t).map_err(|m| Error::InvalidInput {
            field: field.into(),
            message: m,
        }),
    }
}

fn parse_json(field: &str, text: &str) -> Result<Value, Error> {
    stepwell::core::config::check_exact_integers(field, text)?;
    serde_json::from_str(text).map_err(|e| Error::InvalidInput {
        field: field.into(),
        message: format!("is not JSON: {e}"),
    })
}

fn triggers(
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

fn parse_object(field: &str, text: &str) -> Result<Map<String, Value>, Error> {
    stepwell::core::config::check_exact_integers(field, text)?;
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Error::InvalidInput {
            field: field.into(),
            message: "must be a JSON object".into(),
        }),
        Err(e) => Err(Error::InvalidInput {
            field: field.into(),
            message: format!("is not JSON: {e}"),
        }),
    }
}

fn print_record(r: &stepwell::StepRecord, json: bool) {
    if json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
        return;
    }
    let what = match (&r.effect, &r.result) {
        (Some(e), _) => e.kind.clone(),
        (None, Some(v)) if v.get("resumed").is_some() => "resume".into(),
        (None, Some(v)) if v.get("due").is_some() => "due".into(),
        _ => "node".into(),
    };
    let detail = r
        .error
        .clone()
        .or_else(|| r.result.as_ref().map(|v| v.to_string()))
        .unwrap_or_default();
    println!(
        "{}  {:10} {:16} {:18} {}",
        r.started_at,
        r.status.as_str(),
        r.node_id.as_deref().unwrap_or("-"),
        what,
        detail
    );
}

fn print_run(run: &RunState, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(run).unwrap_or_default());
        return;
    }
    println!(
        "run {}  workflow {}  status {}",
        run.run_id,
        run.workflow_id,
        run.status.as_str()
    );
    if let Some(w) = &run.waiting {
        println!("waiting: {}  key {}", w.reason.as_str(), w.wait_key);
        if let Some(p) = &w.prompt {
            println!("prompt: {p}");
        }
        if let Some(u) = &w.until {
            println!("until: {u}");
        }
        let approval = w
            .details
            .as_ref()
            .is_some_and(|d| d["mode"] == "approval_required");
        match w.reason {
            WaitReason::User if approval => println!(
                "approve with: stepwell resume {id} --payload '{{\"approved\": true}}'  (or {{\"approved\": false, \"reason\": \"...\"}})",
                id = run.run_id
            ),
            WaitReason::User => println!(
                "resume with: stepwell resume {} --payload '{{\"text\": \"...\"}}'",
                run.run_id
            ),
            WaitReason::Until => println!("the driver resumes it when due: stepwell drive"),
            WaitReason::Subworkflow => {
                println!("the driver resumes it when the child ends: stepwell drive")
            }
            _ => println!("resume with: stepwell resume {} --payload JSON", run.run_id),
        }
    }
    if let Some(out) = &run.output {
        println!("output: {out}");
    }
    if let Some(err) = &run.error {
        println!("error: {err}");
    }
}

/// Prints benchmark figures: one JSON object, or a line each.
fn print_figures(figures: &serde_json::Value, json: bool) {
    if json {
        println!("{figures}");
    } else {
        for (k, v) in figures.as_object().into_iter().flatten() {
            println!("{k:32} {v}");
        }
    }
}

fn execute(cli: Cli) -> Result<(), Error> {
    if let Command::Bench {
        flows,
        quick,
        only,
        scale: true,
    } = &cli.command
    {
        let mut options = cli::bench_scale::ScaleOptions {
            flows_dir: flows.clone(),
            only: only.clone(),
            ..Default::default()
        };
        if *quick {
            options.parked = [200, 2_000];
            options.passes = 3;
            options.automations = 50;
        }
        let figures = cli::bench_scale::run(&options)?;
        print_figures(&figures, cli.json);
        return Ok(());
    }
    if let Command::Bench {
        flows, quick, only, ..
    } = &cli.command
    {
        let mut options = cli::bench::BenchOptions {
            flows_dir: flows.clone(),
            only: only.clone(),
            // `--store postgres://...` adds the PostgreSQL figures.
            postgres: cli
                .store
                .clone()
                .filter(|s| matches!(StoreSpec::parse(s), Ok(StoreSpec::Postgres(_)))),
            ..Default::default()
        };
        if *quick {
            options.dispatch_samples = 500;
            options.chain_repeats = 1;
            options.cycles_per_batch = 50;
            options.cycle_batches = 1;
            options.race_waits = 50;
            options.drive_runs = 30;
            options.hostile_rounds = 5;
            options.automation_occurrences = 20;
            options.automation_commands = 40;
            options.automation_batches = 1;
            options.http.starts = 100;
            options.http.webhooks = 100;
            options.http.resumes = 40;
            options.http.subscribers = 3;
        }
        let figures = cli::bench::run(&options)?;
        print_figures(&figures, cli.json);
        return Ok(());
    }
    let spec = match &cli.store {
        Some(text) => StoreSpec::parse(text)?,
        None => StoreSpec::Sqlite(cli.db.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DB))),
    };
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
    let limits = SandboxLimits {
        time_limit: Duration::from_millis(cli.guest_time_ms),
        memory_limit_bytes,
        // All live guests together: at least 1 GiB, and room for four at
        // the guest limit.
        total_memory_bytes: SandboxLimits::default()
            .total_memory_bytes
            .max(memory_limit_bytes.saturating_mul(4)),
        ..SandboxLimits::default()
    };
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
    let fixed_now = cli
        .now
        .as_deref()
        .map(|t| {
            let t = stepwell::automation::parse_timestamp(t, "--now").map_err(|e| {
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
        .transpose()?;
    // The server's token file, wherever it is, is out of every tool's
    // reach (a tool that read it would put it in a ledger).
    let serve_token = match &cli.command {
        Command::Serve { token_file, .. } => {
            let path = token_file.clone().unwrap_or_else(|| spec.token_file());
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
            ..RuntimeConfig::default()
        },
        clock: fixed_now.map(|t| {
            std::sync::Arc::new(stepwell::ManualClock::new(t))
                as std::sync::Arc<dyn stepwell::Clock>
        }),
        tool_dir: cli.tool_dir.clone(),
        trigger_dir: cli::environment::trigger_dir(),
        enable_exec: cli.enable_exec || cli::environment::exec_enabled(),
        cache_home: cli::environment::cache_home(),
        effects: vec![cli::environment::llm_call()],
    };
    if let Command::Triggers {
        trigger_dir,
        command,
    } = cli.command
    {
        let cache = spec.cache_dir(options.cache_home.as_deref());
        return triggers(cache, limits, trigger_dir, command, cli.now, cli.json);
    }
    if let Command::Db {
        command: DbCommand::Migrate,
    } = cli.command
    {
        let version = spec.migrate(durability)?;
        if cli.json {
            println!(
                "{}",
                serde_json::json!({"store": spec.to_string(), "schema_version": version})
            );
        } else {
            match version {
                Some(v) => println!("{spec}: schema version {v}"),
                None => println!("{spec}: keeps no schema"),
            }
        }
        return Ok(());
    }
    let rt = open_runtime(&spec, &options)?;
    match cli.command {
        Command::BenchWorker { task, file, who } => match task.as_str() {
            "resume-all" => println!("{}", cli::bench::resume_all(&rt, &file, &who)?),
            other => {
                return Err(Error::InvalidInput {
                    field: "task".into(),
                    message: format!("{other:?} is not a bench task"),
                })
            }
        },
        Command::Run {
            flow_dir,
            vars,
            workflow,
            run_id,
            runtime,
            session,
            history,
        } => {
            let bundle = rt.load_bundle(&flow_dir)?;
            let mut vars = match vars {
                Some(v) => parse_object("--vars", &v)?,
                None => Map::new(),
            };
            // Attribution is the host's, and an automation's own session
            // holds only its occurrences.
            stepwell::core::config::check_caller_run(
                &vars,
                session.as_deref(),
                "--vars",
                "--session",
            )?;
            if let (true, Some(s)) = (history, &session) {
                let replayed = stepwell::sessions::session_chat_messages(
                    &rt,
                    s,
                    &stepwell::sessions::HistoryOptions {
                        strict: true,
                        ..Default::default()
                    },
                )?;
                let mut context = vars
                    .get("context")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                context.insert("messages".into(), Value::from(replayed.messages));
                vars.insert("context".into(), Value::Object(context));
            }
            let runtime = match runtime {
                Some(r) => {
                    stepwell::core::config::operator_runtime(parse_object("--runtime", &r)?)?
                }
                None => Map::new(),
            };
            let wf = workflow.unwrap_or(bundle.main_workflow_id);
            let state = rt.run(
                &wf,
                StartOptions {
                    vars,
                    run_id,
                    runtime,
                    session_id: session,
                    ..StartOptions::default()
                },
            )?;
            print_run(&state, cli.json);
            note_outcome(&state);
        }
        Command::Resume {
            run_id,
            payload,
            wait_key,
        } => {
            let payload = parse_json("--payload", &payload)?;
            // Without a key: whatever the run waits on now, checked and
            // resumed in one transaction.
            let state = match wait_key {
                Some(k) => rt.resume(&run_id, &k, payload)?,
                None => rt.respond(&run_id, payload)?,
            };
            print_run(&state, cli.json);
            note_outcome(&state);
        }
        Command::Status { run_id } => print_run(&rt.get_state(&run_id)?, cli.json),
        Command::Ledger {
            run_id,
            verify: true,
            ..
        } => cli::ledger::verify(&rt, &run_id, cli.json)?,
        Command::Ledger {
            run_id,
            follow: false,
            ..
        } if cli.json => cli::ledger::print_json_array(&rt, &run_id)?,
        Command::Ledger {
            run_id,
            follow,
            poll_ms,
            ..
        } => cli::ledger::print_lines(
            &rt,
            &run_id,
            follow,
            Duration::from_millis(poll_ms),
            cli.json,
            print_record,
        )?,
        Command::List {
            quarantined: true, ..
        } => {
            let found = rt.store().list_quarantined()?;
            if cli.json {
                let rows: Vec<Value> = found
                    .iter()
                    .map(|(id, why)| serde_json::json!({"run_id": id, "reason": why}))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else {
                for (id, why) in found {
                    println!("{id}  quarantined  {why}");
                }
            }
        }
        Command::List {
            status,
            wait_reason,
            workflow,
            limit,
            after,
            quarantined: false,
        } => {
            let query = RunQuery {
                status: status
                    .map(|s| {
                        RunStatus::parse(&s).ok_or_else(|| Error::InvalidInput {
                            field: "--status".into(),
                            message: format!("{s:?} is not one of running, waiting, completed, failed, cancelled"),
                        })
                    })
                    .transpose()?,
                wait_reason: wait_reason
                    .map(|r| {
                        WaitReason::parse(&r).ok_or_else(|| Error::InvalidInput {
                            field: "--wait-reason".into(),
                            message: format!("{r:?} is not one of event, until, user, job, subworkflow"),
                        })
                    })
                    .transpose()?,
                workflow_id: workflow,
                // One more than shown: whether there are more.
                limit: Some(limit.unwrap_or(DEFAULT_LIST_LIMIT).saturating_add(1)),
                after_run_id: after,
                ..RunQuery::default()
            };
            if let Some(after) = &query.after_run_id {
                // An unknown cursor is an error, not an empty page.
                rt.get_state(after)?;
            }
            let mut runs = rt.list_runs(&query)?;
            let shown = limit.unwrap_or(DEFAULT_LIST_LIMIT);
            if runs.len() > shown {
                runs.truncate(shown);
                if let Some(last) = runs.last() {
                    eprintln!(
                        "more runs: the next with --after {}, or more at once with --limit",
                        last.run_id
                    );
                }
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&runs).unwrap_or_default()
                );
            } else {
                for r in runs {
                    let wait = r
                        .waiting
                        .as_ref()
                        .map(|w| format!("{} {}", w.reason.as_str(), w.wait_key))
                        .unwrap_or_default();
                    println!(
                        "{}  {:20} {:10} {}",
                        r.run_id,
                        r.workflow_id,
                        r.status.as_str(),
                        wait
                    );
                }
            }
        }
        Command::Cancel { run_id, reason } => print_run(
            &rt.cancel_run_by(&run_id, reason.as_deref(), "cli")?,
            cli.json,
        ),
        Command::Automations { command } => {
            if !cli::automations::run(&rt, command, rt.now(), cli.json)? {
                RUN_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Command::Sessions { command } => cli::sessions::run(&rt, command, cli.json)?,
        Command::Connections { command } => cli::connections::run(&rt, command, cli.json)?,
        Command::Drive {
            until_idle: true, ..
        } => {
            let report = stepwell::automation::drive_until_idle(&rt, 1000)?;
            if cli.json {
                println!("{}", serde_json::to_string(&report).unwrap_or_default());
            } else {
                println!("passes {}  moved {}", report.passes, report.moved);
            }
            for e in &report.errors {
                eprintln!("  {}: {}", e.run_id, e.error);
            }
            if !report.errors.is_empty() {
                // Something could not move: say so in the exit status.
                RUN_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Command::Drive {
            once, interval_ms, ..
        } => {
            // The loop's feeds are polled in their own thread, never in the
            // driver's way (it runs until the process ends).
            if !once {
                // Listen for other processes' signals before the first pass,
                // so that none sent after it is missed.
                rt.store().wait_for_work(Duration::ZERO);
                let (rt, stop) = (rt.clone(), std::sync::Arc::default());
                std::thread::spawn(move || stepwell::triggers::run_feed_poller(rt, stop));
            }
            loop {
                if once {
                    // One pass: the due feeds are polled here, first.
                    for (id, e) in &stepwell::triggers::feed_once(&rt)?.failed {
                        eprintln!("  connection {id}: {e}");
                    }
                } else if let Err(e) = stepwell::triggers::sweep_once(&rt) {
                    // The driver sweeps for lost wakes; a store that is
                    // away (a database restarting) is tried again.
                    eprintln!("error: the sweep failed: {e}");
                }
                let report = match rt.drive_once() {
                    Ok(report) => report,
                    Err(e) if once => return Err(e),
                    Err(e) => {
                        // A long-running driver outlives a store outage:
                        // it says so and tries again after its pause.
                        eprintln!("error: the driver's pass failed: {e}");
                        std::thread::sleep(Duration::from_millis(interval_ms.min(5000)));
                        continue;
                    }
                };
                if cli.json {
                    println!("{}", serde_json::to_string(&report).unwrap_or_default());
                } else if report.moved_anything() || !report.errors.is_empty() || once {
                    println!(
                    "due resumed {}  ticked {}  parents resumed {}  orphans cancelled {}  busy {}  quarantined {}  errors {}",
                    report.due_resumed.len(),
                    report.ticked.len(),
                    report.parents_resumed.len(),
                    report.orphans_cancelled.len(),
                    report.busy.len(),
                    report.quarantined.len(),
                    report.errors.len()
                );
                    for q in &report.quarantined {
                        eprintln!("  {}: quarantined: {}", q.run_id, q.error);
                    }
                    for e in &report.errors {
                        eprintln!("  {}: {}", e.run_id, e.error);
                    }
                }
                std::io::Write::flush(&mut std::io::stdout()).ok();
                if once {
                    break;
                }
                // A pass that moved something may have left more ready (a
                // chain of controller steps); otherwise wait for a signal
                // from another process (PostgreSQL) or the next poll.
                if !report.moved_anything() {
                    let pause = rt.idle_pause(Duration::from_millis(interval_ms));
                    rt.store().wait_for_work(pause);
                }
            }
        }
        Command::Tools {
            command: ToolCommand::List,
        } => {
            let table = stepwell::tools::ToolsExt::tools(&rt)?;
            if cli.json {
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
        }
        Command::Snapshot { command } => {
            let snapshots = spec.snapshots()?;
            match command {
                SnapshotCommand::Create {
                    run_id,
                    name,
                    description,
                    tags,
                } => {
                    let s = rt.create_snapshot(&*snapshots, &run_id, &name, &description, tags)?;
                    if cli.json {
                        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
                    } else {
                        println!(
                            "snapshot {}  {}  of run {} ({})",
                            s.snapshot_id,
                            s.name,
                            s.run_id,
                            s.run_state.status.as_str()
                        );
                    }
                }
                SnapshotCommand::List { run, tag, text } => {
                    let (found, left_out) =
                        snapshots.search_snapshots_reporting(&stepwell::store::SnapshotQuery {
                            run_id: run,
                            tag,
                            text,
                            limit: None,
                        })?;
                    for e in left_out {
                        eprintln!("warning: snapshot left out: {e}");
                    }
                    if cli.json {
                        println!(
                            "{}",
                            serde_json::to_string_pretty(&found).unwrap_or_default()
                        );
                    } else {
                        for s in found {
                            println!(
                                "{}  {}  run {}  {}  [{}]  {}",
                                s.snapshot_id,
                                s.created_at,
                                s.run_id,
                                s.name,
                                s.tags.join(","),
                                s.run_state.status.as_str()
                            );
                        }
                    }
                }
                SnapshotCommand::Restore { snapshot_id } => {
                    print_run(&rt.restore_snapshot(&*snapshots, &snapshot_id)?, cli.json)
                }
            }
        }
        Command::Serve {
            listen,
            token_file: _, // resolved above (serve_token)
            interval_ms,
            no_drive,
            log_format,
            max_body_bytes,
            max_connections,
            header_timeout_ms,
            body_timeout_ms,
            max_body_bytes_in_flight,
            write_timeout_ms,
        } => {
            init_logs(&log_format)?;
            // A long-running server handles a closed connection per
            // connection, not by dying.
            #[cfg(unix)]
            // SAFETY: setting a signal's disposition before the server's
            // threads start.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            let token_file = serve_token.clone().unwrap_or_else(|| spec.token_file());
            let mut options = stepwell_serve::ServeOptions::new(token_file.clone());
            options.listen = listen;
            options.drive_interval = Duration::from_millis(interval_ms.max(1));
            options.drive = !no_drive;
            options.max_body_bytes = max_body_bytes;
            options.max_connections = max_connections;
            options.header_read_timeout = Duration::from_millis(header_timeout_ms.max(1));
            options.body_read_timeout = Duration::from_millis(body_timeout_ms.max(1));
            options.write_stall_timeout = Duration::from_millis(write_timeout_ms.max(1));
            options.max_body_bytes_in_flight = max_body_bytes_in_flight;
            options.snapshots = Some(std::sync::Arc::from(spec.snapshots()?));
            options.dashboard_dir = cli::environment::dashboard_dir();
            let server = stepwell_serve::Server::bind(rt, options)?;
            let url = format!("http://{}/", server.local_addr());
            if !server.local_addr().ip().is_loopback() {
                eprintln!(
                    "warning: listening beyond loopback: the token travels in cleartext; put a TLS proxy in front"
                );
            }
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({"url": url, "token_file": token_file.display().to_string()})
                );
            } else {
                println!("stepwell serve: {url}");
                println!("token file: {}", token_file.display());
                println!(
                    "try: curl -H \"Authorization: Bearer $(cat {})\" {url}v1/runs",
                    token_file.display()
                );
            }
            std::io::Write::flush(&mut std::io::stdout()).ok();
            server.run()?;
        }
        Command::Bench { .. } | Command::Triggers { .. } | Command::Db { .. } => {
            unreachable!("handled above")
        }
    }
    Ok(())
}

/// Starts the `tracing` subscriber of `serve`: text or JSON lines on
/// stderr, filtered by RUST_LOG (default `info`).
fn init_logs(format: &str) -> Result<(), Error> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        "text" => builder.try_init(),
        "json" => builder.json().try_init(),
        other => {
            return Err(Error::InvalidInput {
                field: "--log-format".into(),
                message: format!("{other:?} is not text or json"),
            })
        }
    }
    .map_err(|e| Error::InvalidInput {
        field: "--log-format".into(),
        message: e.to_string(),
    })
}

/// How many runs `stepwell list` shows without `--limit`.
const DEFAULT_LIST_LIMIT: usize = 100;

/// Whether a run this command executed ended `failed` (the command then
/// exits 1, having printed the run as usual).
static RUN_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes how a run that `run` or `resume` executed ended.
fn note_outcome(state: &RunState) {
    if state.status == RunStatus::Failed {
        RUN_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn main() -> ExitCode {
    // Panics inside a run's step fail that run (host_panic) and stay off
    // stderr; any other panic is reported as usual.
    stepwell::core::panics::install_quiet_hook();
    // Output piped into a reader that stops early (`stepwell list | head`)
    // ends the process quietly, as it does other command-line tools,
    // instead of failing a print. (A long-running server would keep the
    // signal ignored and handle the error per connection.)
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to the default at start, before
    // any thread is spawned.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A write past the file-size limit (`ulimit -f`) fails with EFBIG and
    // is reported (`store_io`, naming the file) instead of the process
    // being killed by SIGXFSZ without a word.
    #[cfg(unix)]
    // SAFETY: as above: a disposition set at start, before any thread.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    let cli = Cli::parse();
    cli::environment::apply_profiling();
    let json = cli.json;
    match execute(cli) {
        Ok(()) if RUN_FAILED.load(std::sync::atomic::Ordering::Relaxed) => ExitCode::FAILURE,
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                let detail = match (&e, e.extension::<stepwell::automation::AutomationError>()) {
                    // An automation's own code, not the API's family of it.
                    (_, Some(a)) => {
                        let mut d = a.to_json();
                        d["code"] = serde_json::json!(a.reason_code);
                        d
                    }
                    (Error::Extension(x), None) => x.to_json(),
                    _ => serde_json::json!({ "code": e.reason_code(), "message": e.to_string() }),
                };
                eprintln!("{}", serde_json::json!({ "error": detail }));
            } else {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

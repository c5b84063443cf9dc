//! The `stepwell` binary: argument parsing and dispatch. Each command is a
//! module of `cli/` that returns a `Report`; `cli::render` prints it as
//! text or JSON and gives the exit status.

// Every unsafe block says why it holds (a `SAFETY:` comment).
#![deny(clippy::undocumented_unsafe_blocks)]

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

use clap::{Parser, Subcommand};
use stepwell::host::{open_runtime, DB_ENV};
use stepwell::{Error, Runtime};

use cli::render::{Report, Sink};
use cli::setup::Host;

/// stepwell: a durable, WebAssembly-sandboxed workflow host.
#[derive(Parser)]
#[command(
    name = "stepwell",
    version,
    about,
    next_help_heading = "Global options"
)]
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
    /// Lint Python files after the built-in write_file and edit_file with
    /// this ruff program (the reference's notice; without it, the notice
    /// says ruff is not installed).
    #[arg(long, global = true, env = stepwell::tools::RUFF_ENV)]
    ruff: Option<PathBuf>,
    /// Send traces (a span per tick, step, guest call, effect, model and
    /// tool call, commit and HTTP request) to this OpenTelemetry
    /// collector, over OTLP/HTTP (`/v1/traces` is added; also
    /// OTEL_EXPORTER_OTLP_ENDPOINT). Off when unset.
    #[arg(long, global = true)]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a run and tick it until it waits or ends: of a bundle
    /// directory (deployed first) or of a deployed workflow id.
    #[command(after_help = "Examples:
  stepwell run flows/examples/hello --vars '{\"name\": \"Alice\"}'
  stepwell run flows/examples/ask-user --run-id ask-1      # waits for a person
  stepwell run ask-user --version 1                        # a deployed workflow")]
    Run(cli::runs::RunArgs),
    /// Deploy a bundle directory: record it as a new version of each
    /// workflow it defines (nothing when its content is unchanged).
    Deploy(cli::workflows::DeployArgs),
    /// Deployed workflows and their versions; prune unused versions.
    Workflows {
        #[command(subcommand)]
        command: cli::workflows::WorkflowCommand,
    },
    /// Move runs to another version of their workflow, checked and
    /// recorded (`upgraded` in the ledger).
    Upgrade(cli::workflows::UpgradeArgs),
    /// Write a run's history (state, ledger, artifacts, its workflow
    /// version's files) into one self-verifying file.
    Export(cli::history::ExportArgs),
    /// Read a file `export` wrote into this store, after checking it whole.
    Import(cli::history::ImportArgs),
    /// Start a new run from a past point of a run (a ledger record or a
    /// snapshot), with the vars as they were there and a patch over them.
    Fork(cli::history::ForkArgs),
    /// The evidence a run's outside-world tool calls left: a command's
    /// exit status, output and timing, the approval that allowed it.
    Evidence {
        /// The run.
        run_id: String,
    },
    /// Delete finished runs the retention policy no longer keeps (whole
    /// trees, with their ledgers and snapshots), optionally archived first.
    Prune(cli::retention::PruneArgs),
    /// Pack a bundle directory into one file, or unpack one.
    Bundle {
        #[command(subcommand)]
        command: cli::workflows::BundleCommand,
    },
    /// Resume a waiting run with a payload.
    #[command(after_help = "Examples:
  stepwell resume ask-1 --payload '{\"text\": \"Bob\"}'            # answer a question
  stepwell resume RUN --payload '{\"approved\": true}'             # approve tool calls
  stepwell resume RUN --wait-key KEY --payload '{}'               # a wait named by its key")]
    Resume(cli::runs::ResumeArgs),
    /// Print a run's state.
    Status {
        /// The run.
        run_id: String,
    },
    /// Print a run's ledger, oldest record first.
    Ledger(cli::ledger::LedgerArgs),
    /// List runs.
    List(cli::runs::ListArgs),
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
    Drive(cli::drive::DriveArgs),
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
        command: cli::snapshot::SnapshotCommand,
    },
    /// Trigger sources: list them, validate a config, preview fire times,
    /// call one method.
    Triggers {
        /// A folder of third-party trigger-source components (*.wasm).
        #[arg(long, global = true, env = stepwell::triggers::PLUGIN_DIR_ENV)]
        trigger_dir: Option<PathBuf>,
        #[command(subcommand)]
        command: cli::triggers::TriggerCommand,
    },
    /// The store's schema: create it or bring it to this build's version.
    Db {
        #[command(subcommand)]
        command: cli::db::DbCommand,
    },
    /// Tools: list what `tool_calls` can run.
    Tools {
        #[command(subcommand)]
        command: cli::tools::ToolCommand,
    },
    /// Serve the HTTP API (runs, ledgers, live streams, automations), the
    /// AHP automation-run channel and the web dashboard, and drive the
    /// store (as `stepwell drive`) in the same process. Prints the URL and
    /// where the bearer token is; stops on SIGTERM or Ctrl-C.
    Serve(cli::serve::ServeArgs),
    /// What a component file is and expects, read without compiling it:
    /// its world, the contract version it was built against, its imports
    /// and exports, and the vars, config and routes its author declared.
    #[command(after_help = "Examples:
  stepwell inspect flows/examples/expenses/triage.wasm
  stepwell inspect flows/examples/hello-py/greet.wasm --json
  stepwell inspect greet.wasm --declare greet.json -o greet.declared.wasm")]
    Inspect(cli::inspect::InspectArgs),
    /// Measure the host and print the figures (medians). Uses its own scratch
    /// stores and the default guest limits: --db and the --guest-* flags do
    /// not apply.
    Bench(cli::bench::BenchArgs),
}

/// Runs the command `cli` names; what it returns is printed by `sink`
/// (those that print as they go print through it too).
/// The command line's matches, or the process ends with clap's error; a
/// mistyped command is answered with the nearest one (clap's own
/// suggestions miss a swap of two letters, `rnu` for `run`).
fn parse_or_exit() -> clap::ArgMatches {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let command = <Cli as clap::CommandFactory>::command();
    let mut e = match command.clone().try_get_matches() {
        Ok(matches) => return matches,
        Err(e) => e,
    };
    if e.kind() == ErrorKind::InvalidSubcommand && e.get(ContextKind::SuggestedSubcommand).is_none()
    {
        if let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidSubcommand) {
            // Among the commands of the one the typo follows
            // (`automations lsit`: the automations' commands).
            let mut parent = &command;
            for arg in std::env::args().skip(1) {
                if let Some(sub) = parent.find_subcommand(&arg) {
                    parent = sub;
                }
            }
            let names = parent.get_subcommands().map(|c| c.get_name().to_string());
            if let Some(near) = cli::render::nearest(typed, names) {
                e.insert(ContextKind::SuggestedSubcommand, ContextValue::String(near));
            }
        }
    }
    e.exit()
}

/// The store flags given on the command line.
struct StoreFlags {
    db: Option<PathBuf>,
    store: Option<String>,
}

fn execute(cli: Cli, flags: &StoreFlags, sink: &Sink) -> Result<Report, Error> {
    if let Command::Bench(args) = cli.command {
        return Err(cli::bench::forward(args, cli.json, cli.store));
    }
    if let Command::Inspect(args) = cli.command {
        // A file, not a store: nothing is opened or created.
        return cli::inspect::run(args);
    }
    if let Command::Serve(args) = &cli.command {
        // Before the store is opened: its wait for a database starting up
        // is logged too.
        cli::serve::init_logs(&args.log_format)?;
    }
    let host = cli::setup::host(&cli)?;
    cli::render::set_store(
        host.spec.to_string(),
        flags.db.as_deref(),
        flags.store.as_deref(),
    );
    match cli.command {
        Command::Triggers {
            trigger_dir,
            command,
        } => {
            let cache = host.spec.cache_dir(host.options.cache_home.as_deref());
            cli::triggers::run(cache, host.options.limits, trigger_dir, command, cli.now)
        }
        Command::Db { command } => cli::db::run(&host, command),
        command => {
            let rt = open_runtime(&host.spec, &host.options)?;
            let done = on_runtime(rt.clone(), &host, command, sink);
            // The spans of what the command did reach the collector before
            // the process ends.
            rt.tracer().flush();
            if let Some(warning) = cli::environment::tracing_warning() {
                eprintln!("{warning}");
            }
            done
        }
    }
}

/// The commands that act through a runtime over the store.
fn on_runtime(rt: Runtime, host: &Host, command: Command, sink: &Sink) -> Result<Report, Error> {
    match command {
        Command::Run(args) => cli::runs::run(&rt, args),
        Command::Deploy(args) => cli::workflows::deploy(&rt, args),
        Command::Workflows { command } => cli::workflows::run(&rt, command),
        Command::Upgrade(args) => cli::workflows::upgrade(&rt, args),
        Command::Bundle { command } => cli::workflows::bundle(&rt, command),
        Command::Export(args) => cli::history::export(&rt, args),
        Command::Import(args) => cli::history::import(&rt, args),
        Command::Fork(args) => cli::history::fork(&rt, &host.spec, args),
        Command::Evidence { run_id } => cli::history::evidence(&rt, &run_id),
        Command::Prune(args) => cli::retention::prune(&rt, &host.spec, args),
        Command::Resume(args) => cli::runs::resume(&rt, args),
        Command::Status { run_id } => Ok(Report::run(&rt.get_state(&run_id)?)),
        Command::Ledger(args) => cli::ledger::run(&rt, args, sink),
        Command::List(args) => cli::runs::list(&rt, args),
        Command::Cancel { run_id, reason } => Ok(Report::run(&rt.cancel_run_by(
            &run_id,
            reason.as_deref(),
            "cli",
        )?)),
        Command::Automations { command } => cli::automations::run(&rt, command, rt.now()),
        Command::Sessions { command } => cli::sessions::run(&rt, command),
        Command::Connections { command } => cli::connections::run(&rt, command),
        Command::Drive(args) => cli::drive::run(&rt, &host.spec, args, sink),
        Command::Tools { command } => cli::tools::run(&rt, command),
        Command::Snapshot { command } => cli::snapshot::run(&rt, &host.spec, command),
        Command::Serve(args) => cli::serve::run(rt, host, args, sink),
        Command::Bench(_) | Command::Inspect(_) | Command::Triggers { .. } | Command::Db { .. } => {
            unreachable!("handled by execute")
        }
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
    // SAFETY: signal(2) takes no pointers, and SIG_DFL installs no handler,
    // so no code runs in signal context. Done at start, before any thread:
    // no other code has set a disposition for SIGPIPE it relies on.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A write past the file-size limit (`ulimit -f`) fails with EFBIG and
    // is reported (`store_io`, naming the file) instead of the process
    // being killed by SIGXFSZ without a word.
    #[cfg(unix)]
    // SAFETY: as above: no pointers, no handler (SIG_IGN), set at start,
    // before any thread.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    stepwell::host::raise_open_files();
    let matches = parse_or_exit();
    let cli =
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // The store flags as typed (not from the environment): the hints a
    // command prints repeat them.
    let typed = |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    // A `--db` that a store named in the environment overrides is not the
    // store used: not repeated.
    let flags = StoreFlags {
        db: cli
            .db
            .clone()
            .filter(|_| typed("db") && cli.store.is_none()),
        store: cli.store.clone().filter(|_| typed("store")),
    };
    cli::environment::apply_profiling();
    // `serve` has logs of its own (which show these lines too).
    if !cli.json && !matches!(cli.command, Command::Serve(_)) {
        cli::render::show_progress_on_terminal();
    }
    let sink = Sink::new(cli.json);
    let result = execute(cli, &flags, &sink);
    sink.finish(result)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every option and argument of every command says what it is for.
    #[test]
    fn every_option_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                let described = arg
                    .get_help()
                    .is_some_and(|h| !h.to_string().trim().is_empty());
                if !described && id != "help" && id != "version" {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "stepwell", &mut missing);
        assert!(
            missing.is_empty(),
            "options without a description: {missing:?}"
        );
    }

    /// The commands a newcomer types first show examples in their help.
    #[test]
    fn the_first_commands_show_examples() {
        let cli = super::Cli::command();
        for path in [
            &["run"][..],
            &["resume"],
            &["automations", "create"],
            &["connections", "create"],
        ] {
            let mut cmd = &cli;
            for name in path {
                cmd = cmd.find_subcommand(name).expect(name);
            }
            let after = cmd
                .get_after_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(
                after.starts_with("Example") && after.contains("stepwell "),
                "{path:?}"
            );
        }
    }
}

//! The `stepwell` binary: argument parsing and printing over the library.

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
use std::time::Duration;

use clap::{Parser, Subcommand};
use stepwell::host::{open_runtime, DB_ENV};
use stepwell::{Error, Runtime};

use cli::render::{note_failure, print_record, print_run};
use cli::runs::ListArgs;
use cli::setup::Host;

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
    /// Lint Python files after the built-in write_file and edit_file with
    /// this ruff program (the reference's notice; without it, the notice
    /// says ruff is not installed).
    #[arg(long, global = true, env = stepwell::tools::RUFF_ENV)]
    ruff: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a run of a flow bundle and tick it until it waits or ends.
    Run(cli::runs::RunArgs),
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
    Serve(cli::serve::ServeArgs),
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

fn execute(cli: Cli) -> Result<(), Error> {
    if cli::benchmarks::run(&cli)? {
        return Ok(());
    }
    let host = cli::setup::host(&cli)?;
    let json = cli.json;
    match cli.command {
        Command::Triggers {
            trigger_dir,
            command,
        } => {
            let cache = host.spec.cache_dir(host.options.cache_home.as_deref());
            cli::triggers::run(
                cache,
                host.options.limits,
                trigger_dir,
                command,
                cli.now,
                json,
            )
        }
        Command::Db {
            command: DbCommand::Migrate,
        } => cli::db::migrate(&host, json),
        command => on_runtime(
            open_runtime(&host.spec, &host.options)?,
            &host,
            command,
            json,
        ),
    }
}

/// The commands that act through a runtime over the store.
fn on_runtime(rt: Runtime, host: &Host, command: Command, json: bool) -> Result<(), Error> {
    match command {
        Command::BenchWorker { task, file, who } => match task.as_str() {
            "resume-all" => println!("{}", cli::bench::resume_all(&rt, &file, &who)?),
            other => {
                return Err(Error::invalid(
                    "task",
                    format!("{other:?} is not a bench task"),
                ))
            }
        },
        Command::Run(args) => cli::runs::run(&rt, args, json)?,
        Command::Resume {
            run_id,
            payload,
            wait_key,
        } => cli::runs::resume(&rt, &run_id, &payload, wait_key.as_deref(), json)?,
        Command::Status { run_id } => print_run(&rt.get_state(&run_id)?, json),
        Command::Ledger {
            run_id,
            verify: true,
            ..
        } => cli::ledger::verify(&rt, &run_id, json)?,
        Command::Ledger {
            run_id,
            follow: false,
            ..
        } if json => cli::ledger::print_json_array(&rt, &run_id)?,
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
            json,
            print_record,
        )?,
        Command::List {
            quarantined: true, ..
        } => cli::runs::list_quarantined(&rt, json)?,
        Command::List {
            status,
            wait_reason,
            workflow,
            limit,
            after,
            quarantined: false,
        } => {
            let args = ListArgs {
                status,
                wait_reason,
                workflow,
                limit,
                after,
            };
            cli::runs::list(&rt, args, json)?
        }
        Command::Cancel { run_id, reason } => {
            print_run(&rt.cancel_run_by(&run_id, reason.as_deref(), "cli")?, json)
        }
        Command::Automations { command } => {
            if !cli::automations::run(&rt, command, rt.now(), json)? {
                note_failure();
            }
        }
        Command::Sessions { command } => cli::sessions::run(&rt, command, json)?,
        Command::Connections { command } => cli::connections::run(&rt, command, json)?,
        Command::Drive {
            until_idle: true, ..
        } => cli::drive::until_idle(&rt, json)?,
        Command::Drive {
            once, interval_ms, ..
        } => cli::drive::passes(&rt, once, interval_ms, json)?,
        Command::Tools {
            command: ToolCommand::List,
        } => cli::tools::list(&rt, json)?,
        Command::Snapshot { command } => cli::snapshot::run(&rt, &host.spec, command, json)?,
        Command::Serve(args) => cli::serve::run(rt, host, args, json)?,
        Command::Bench { .. } | Command::Triggers { .. } | Command::Db { .. } => {
            unreachable!("handled by execute")
        }
    }
    Ok(())
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
    let cli = Cli::parse();
    cli::environment::apply_profiling();
    let json = cli.json;
    match execute(cli) {
        Ok(()) if cli::render::failed() => ExitCode::FAILURE,
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

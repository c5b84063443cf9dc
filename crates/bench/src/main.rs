//! The `stepwell-bench` binary: the benchmarks behind `stepwell bench`, in
//! a binary of their own so the product's code path carries none of them.
//! `stepwell bench ...` runs this binary (the one beside it) with the same
//! options; it starts `stepwell` processes (the one beside it) for the
//! multi-process figures, and itself as the race's workers.

// Every unsafe block says why it holds (a `SAFETY:` comment).
#![deny(clippy::undocumented_unsafe_blocks)]

mod bench;
mod fanout;
mod http;
mod languages;
mod scale;
mod traced;

/// The allocator of the `stepwell` binary (mimalloc), so that the figures
/// measured in this process are the product's.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use stepwell::host::StoreSpec;
use stepwell::Error;

/// Measure the host and print the figures (medians). Uses its own scratch
/// stores and the default guest limits (docs/cli.md, `bench`).
#[derive(Parser)]
#[command(name = "stepwell-bench", version, about)]
struct Cli {
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
    /// Measure slow work instead: 1,000 runs each waiting 2 s on a model
    /// (a loopback server), with timers and API reads meanwhile; the wall
    /// time, timer lateness, read latency and memory per call in flight;
    /// then the same with a `stepwell serve` killed (SIGKILL) as the answers
    /// come in, and started again.
    #[arg(long)]
    fanout: bool,
    /// A PostgreSQL URL (postgres://...) adds the PostgreSQL figures; any
    /// other store is ignored.
    #[arg(long, env = "STEPWELL_STORE")]
    store: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    worker: Option<Worker>,
}

/// One process of a multi-process benchmark (started by the benchmark).
#[derive(Subcommand)]
enum Worker {
    /// Resume every run listed in FILE, each once, and print how many
    /// resumes won and how many were conflicts.
    #[command(hide = true)]
    ResumeAll {
        /// The SQLite file.
        #[arg(long)]
        db: PathBuf,
        /// The runs, one id a line.
        file: PathBuf,
        /// Who the process is.
        who: String,
    },
    /// Serve chat completions on loopback, each after a delay, counting
    /// them (`GET /count`).
    #[command(hide = true)]
    ModelServer {
        /// How long each answer takes.
        #[arg(long)]
        delay_ms: u64,
        /// Where the address it listens on is written.
        #[arg(long)]
        addr_file: PathBuf,
    },
}

/// Runs the benchmarks `cli` asks for, or one worker, and prints what they
/// return.
fn execute(cli: Cli) -> Result<(), Error> {
    if let Some(Worker::ResumeAll { db, file, who }) = &cli.worker {
        println!(
            "{}",
            bench::resume_all(&bench::cli_runtime(db)?, file, who)?
        );
        return Ok(());
    }
    if let Some(Worker::ModelServer {
        delay_ms,
        addr_file,
    }) = &cli.worker
    {
        return fanout::model_server(std::time::Duration::from_millis(*delay_ms), addr_file);
    }
    // On a terminal, the figures of the main benchmarks are printed as
    // they are measured (a full run takes minutes).
    let live = !cli.json && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut live_shown = false;
    let figures = if cli.fanout {
        let mut options = fanout::FanoutOptions::default();
        if cli.quick {
            options.calls = 200;
            options.timers = 20;
        }
        let dir = std::env::temp_dir().join(format!("stepwell-fanout-{}", std::process::id()));
        let figures = fanout::run(&options, &dir.join("live")).and_then(|mut figures| {
            figures.extend(fanout::kill_run(&options, &dir.join("killed"))?);
            figures.extend(fanout::cancel_run(&dir.join("cancelled"))?);
            Ok(figures)
        });
        let _ = std::fs::remove_dir_all(&dir);
        serde_json::Value::Object(figures?)
    } else if cli.scale {
        let mut options = scale::ScaleOptions {
            flows_dir: cli.flows,
            only: cli.only,
            ..Default::default()
        };
        if cli.quick {
            options.parked = [200, 2_000];
            options.passes = 3;
            options.automations = 50;
        }
        scale::run(&options)?
    } else {
        let mut options = bench::BenchOptions {
            flows_dir: cli.flows,
            only: cli.only,
            // `--store postgres://...` adds the PostgreSQL figures.
            postgres: cli
                .store
                .filter(|s| matches!(StoreSpec::parse(s), Ok(StoreSpec::Postgres(_)))),
            live,
            ..Default::default()
        };
        if cli.quick {
            options.quick();
        }
        live_shown = live;
        bench::run(&options)?
    };
    if cli.json {
        println!("{figures}");
    } else if live_shown {
        // Printed as they were measured.
    } else {
        for (k, v) in figures.as_object().into_iter().flatten() {
            println!("{k:32} {v}");
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // As the `stepwell` binary: panics inside a run's step (the hostile
    // guests) fail that run and stay off stderr.
    stepwell::core::panics::install_quiet_hook();
    #[cfg(unix)]
    // SAFETY: signal(2) takes no pointers, and SIG_DFL installs no handler,
    // so no code runs in signal context. Done at start, before any thread:
    // no other code has set a disposition for SIGPIPE it relies on.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A write past the file-size limit (`ulimit -f`) fails with EFBIG and
    // is reported instead of the process being killed by SIGXFSZ.
    #[cfg(unix)]
    // SAFETY: as above: no pointers, no handler (SIG_IGN), set at start,
    // before any thread.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
    stepwell::host::raise_open_files();
    let cli = Cli::parse();
    // Guests' perf map, for profiling the benchmarks (docs/performance.md).
    if std::env::var("STEPWELL_WASM_PERFMAP").is_ok_and(|v| v.trim() == "1") {
        stepwell::wasm::write_perf_map();
    }
    let json = cli.json;
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                eprintln!(
                    "{}",
                    serde_json::json!({ "error": stepwell::host::error_json(&e) })
                );
            } else {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

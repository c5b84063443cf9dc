//! The `stepwell` binary: argument parsing and printing over the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use serde_json::{Map, Value};
use stepwell::host::{open_runtime, StoreSpec, DB_ENV, DEFAULT_DB};
use stepwell::{Error, RunQuery, RunState, RunStatus, SandboxLimits, StartOptions, WaitReason};

/// stepwell: a durable, WebAssembly-sandboxed workflow host.
#[derive(Parser)]
#[command(name = "stepwell", version, about)]
struct Cli {
    /// The SQLite database (default .stepwell/stepwell.sqlite under the current directory).
    #[arg(long, global = true, env = DB_ENV)]
    db: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Wall-time limit of one guest call, in milliseconds.
    #[arg(long, global = true, default_value_t = 2000)]
    guest_time_ms: u64,
    /// Memory limit of one guest instance, in MiB.
    #[arg(long, global = true, default_value_t = 256)]
    guest_memory_mib: usize,
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
        /// At most this many runs.
        #[arg(long)]
        limit: Option<usize>,
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
    Drive {
        /// Do one pass and exit.
        #[arg(long)]
        once: bool,
        /// Pause between passes, in milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
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
    },
}

fn parse_object(field: &str, text: &str) -> Result<Map<String, Value>, Error> {
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
        match w.reason {
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

fn execute(cli: Cli) -> Result<(), Error> {
    if let Command::Bench { flows, quick, only } = &cli.command {
        let mut options = stepwell::bench::BenchOptions {
            flows_dir: flows.clone(),
            only: only.clone(),
            ..Default::default()
        };
        if *quick {
            options.dispatch_samples = 500;
            options.chain_repeats = 1;
            options.cycles_per_batch = 50;
            options.cycle_batches = 1;
        }
        let figures = stepwell::bench::run(&options)?;
        if cli.json {
            println!("{figures}");
        } else {
            for (k, v) in figures.as_object().into_iter().flatten() {
                println!("{k:32} {v}");
            }
        }
        return Ok(());
    }
    let spec = StoreSpec::Sqlite(cli.db.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_DB)));
    let limits = SandboxLimits {
        time_limit: Duration::from_millis(cli.guest_time_ms),
        memory_limit_bytes: cli.guest_memory_mib << 20,
        ..SandboxLimits::default()
    };
    let rt = open_runtime(&spec, limits)?;
    match cli.command {
        Command::Run {
            flow_dir,
            vars,
            workflow,
            run_id,
        } => {
            let bundle = rt.load_bundle(&flow_dir)?;
            let vars = match vars {
                Some(v) => parse_object("--vars", &v)?,
                None => Map::new(),
            };
            let wf = workflow.unwrap_or(bundle.main_workflow_id);
            let state = rt.run(
                &wf,
                StartOptions {
                    vars,
                    run_id,
                    ..StartOptions::default()
                },
            )?;
            print_run(&state, cli.json);
        }
        Command::Resume {
            run_id,
            payload,
            wait_key,
        } => {
            let payload: Value =
                serde_json::from_str(&payload).map_err(|e| Error::InvalidInput {
                    field: "--payload".into(),
                    message: format!("is not JSON: {e}"),
                })?;
            let key = match wait_key {
                Some(k) => k,
                None => {
                    let run = rt.get_state(&run_id)?;
                    match run.waiting {
                        Some(w) if run.status == RunStatus::Waiting => w.wait_key,
                        _ => {
                            return Err(Error::StaleResume {
                                run_id,
                                reason: format!(
                                    "Run is not waiting (status {})",
                                    run.status.as_str()
                                ),
                            })
                        }
                    }
                }
            };
            print_run(&rt.resume(&run_id, &key, payload)?, cli.json);
        }
        Command::Status { run_id } => print_run(&rt.get_state(&run_id)?, cli.json),
        Command::Ledger { run_id } => {
            let records = rt.get_ledger(&run_id)?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&records).unwrap_or_default()
                );
            } else {
                for r in records {
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
            }
        }
        Command::List {
            status,
            wait_reason,
            workflow,
            limit,
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
                limit,
                ..RunQuery::default()
            };
            let runs = rt.list_runs(&query)?;
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
        Command::Cancel { run_id, reason } => {
            print_run(&rt.cancel_run(&run_id, reason.as_deref())?, cli.json)
        }
        Command::Drive { once, interval_ms } => loop {
            let report = rt.drive_once()?;
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "due_resumed": report.due_resumed,
                        "ticked": report.ticked,
                        "parents_resumed": report.parents_resumed,
                        "errors": report.errors.iter().map(|(id, e)| serde_json::json!({"run_id": id, "error": e})).collect::<Vec<_>>(),
                    })
                );
            } else if report.moved_anything() || !report.errors.is_empty() || once {
                println!(
                    "due resumed {}  ticked {}  parents resumed {}  errors {}",
                    report.due_resumed.len(),
                    report.ticked.len(),
                    report.parents_resumed.len(),
                    report.errors.len()
                );
                for (id, e) in &report.errors {
                    eprintln!("  {id}: {e}");
                }
            }
            if once {
                break;
            }
            std::thread::sleep(Duration::from_millis(interval_ms));
        },
        Command::Bench { .. } => unreachable!("handled above"),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                eprintln!(
                    "{}",
                    serde_json::json!({ "error": { "code": e.reason_code(), "message": e.to_string() } })
                );
            } else {
                eprintln!("error: {e}");
            }
            ExitCode::FAILURE
        }
    }
}

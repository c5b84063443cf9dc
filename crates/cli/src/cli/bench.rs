//! `stepwell bench`: the benchmarks are a binary of their own,
//! `stepwell-bench` (crates/bench), kept out of the product's code path;
//! this command runs the one beside this binary with the same options.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use stepwell::Error;

/// What `stepwell bench` was asked (docs/cli.md, `bench`).
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
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
}

/// The name of the benchmarks' binary.
const BENCH_BINARY: &str = "stepwell-bench";

/// Runs `stepwell-bench` (beside this binary) with the options of `args`,
/// `--json` and the `--store` given (a PostgreSQL one adds figures); it
/// inherits standard input, output and error, and its exit status is this
/// command's. Returns only when it could not be started.
pub(crate) fn forward(args: BenchArgs, json: bool, store: Option<String>) -> Error {
    let exe = match std::env::current_exe() {
        Ok(me) => me.with_file_name(format!("{BENCH_BINARY}{}", std::env::consts::EXE_SUFFIX)),
        Err(e) => return not_started(format!("cannot find this binary: {e}")),
    };
    if !exe.is_file() {
        return not_started(format!(
            "the benchmarks are a binary of their own, {} is not built: build it with `cargo build --release -p {BENCH_BINARY}`",
            exe.display()
        ));
    }
    let mut command = Command::new(&exe);
    command.args(options(args, json, store));
    let failed = run(command);
    not_started(format!("cannot run {}: {failed}", exe.display()))
}

/// The options `stepwell-bench` is given (`--name=value`: a value may
/// start with a dash).
fn options(args: BenchArgs, json: bool, store: Option<String>) -> Vec<OsString> {
    let BenchArgs {
        flows,
        quick,
        only,
        scale,
    } = args;
    let mut flows_arg = OsString::from("--flows=");
    flows_arg.push(flows);
    let mut out = vec![flows_arg];
    out.extend(quick.then(|| "--quick".into()));
    out.extend(only.map(|o| format!("--only={o}").into()));
    out.extend(scale.then(|| "--scale".into()));
    out.extend(store.map(|s| format!("--store={s}").into()));
    out.extend(json.then(|| "--json".into()));
    out
}

/// Replaces this process with `command` (Unix): it returns only the error
/// that kept it from starting.
#[cfg(unix)]
fn run(mut command: Command) -> std::io::Error {
    std::os::unix::process::CommandExt::exec(&mut command)
}

/// Runs `command` and exits with its status (elsewhere than Unix): it
/// returns only the error that kept it from starting.
#[cfg(not(unix))]
fn run(mut command: Command) -> std::io::Error {
    match command.status() {
        Ok(status) => std::process::exit(status.code().unwrap_or(1)),
        Err(e) => e,
    }
}

/// The error of a `stepwell bench` that could not start the benchmarks.
fn not_started(message: String) -> Error {
    Error::InvalidInput {
        field: "bench".into(),
        message,
    }
}

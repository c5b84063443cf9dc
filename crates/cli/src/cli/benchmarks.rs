//! `stepwell bench`: the benchmarks, with their quick settings.

use stepwell::host::StoreSpec;
use stepwell::Error;

use crate::{Cli, Command};

/// Runs `stepwell bench` and prints its figures; `false` when the command
/// is not `bench`.
pub(crate) fn run(cli: &Cli) -> Result<bool, Error> {
    if let Command::Bench {
        flows,
        quick,
        only,
        scale: true,
    } = &cli.command
    {
        let mut options = super::bench_scale::ScaleOptions {
            flows_dir: flows.clone(),
            only: only.clone(),
            ..Default::default()
        };
        if *quick {
            options.parked = [200, 2_000];
            options.passes = 3;
            options.automations = 50;
        }
        let figures = super::bench_scale::run(&options)?;
        super::render::print_figures(&figures, cli.json);
        return Ok(true);
    }
    if let Command::Bench {
        flows, quick, only, ..
    } = &cli.command
    {
        let mut options = super::bench::BenchOptions {
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
        let figures = super::bench::run(&options)?;
        super::render::print_figures(&figures, cli.json);
        return Ok(true);
    }
    Ok(false)
}

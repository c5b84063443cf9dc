//! `stepwell bench --scale`: what a host costs with much stored and little
//! due. It builds its own large SQLite stores through the store API (no CLI
//! call per run) and measures one driver pass among many parked runs, the
//! driver's memory, the bytes a parked run takes, a thousand automations
//! ticking at once, and the raw commit ceiling of SQLite on this machine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Duration, Utc};
use serde_json::{json, Map, Value};

use stepwell::store::{Fence, LeaseAfter, SqliteStore};
use stepwell::{ManualClock, Result, RunStatus, Runtime, StartOptions};

use super::bench::{bench_err, median, raw_commits, stepwell_exe, Scratch};

/// What `--scale` measures with.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// The repository's `flows/` directory.
    pub flows_dir: PathBuf,
    /// The two store sizes compared (parked ask-user runs).
    pub parked: [usize; 2],
    /// Due timers among the parked runs in each measured pass.
    pub due_timers: usize,
    /// Measured passes per store size (the median is reported).
    pub passes: usize,
    /// Automations of `automations_1k_admit_per_s`.
    pub automations: usize,
    /// Run only the figures whose names contain this text.
    pub only: Option<String>,
    /// The `stepwell` binary whose memory is measured (default: the one
    /// beside this binary).
    pub exe: Option<PathBuf>,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        ScaleOptions {
            flows_dir: PathBuf::from("flows"),
            parked: [1_000, 100_000],
            due_timers: 10,
            passes: 7,
            automations: 1_000,
            only: None,
            exe: None,
        }
    }
}

/// The benchmark clock's start (the stores are built at this time).
const T0: &str = "2026-01-01T00:00:00Z";

fn t0() -> DateTime<Utc> {
    T0.parse().expect("a valid time")
}

/// A runtime on the SQLite file `db` with a clock the benchmark moves, its
/// driver as `stepwell drive` sets it up (a worker per core, at most 4).
fn world(db: &Path) -> Result<(Runtime, Arc<ManualClock>)> {
    let clock = Arc::new(ManualClock::new(t0()));
    let rt = stepwell::builder(Arc::new(SqliteStore::open(db)?))
        .config(stepwell::RuntimeConfig {
            drive_workers: stepwell::RuntimeConfig::host_drive_workers(),
            ..Default::default()
        })
        .clock(clock.clone())
        .build()?;
    Ok((rt, clock))
}

/// One parked run (or family of runs) to copy: each run's state and
/// ledger as JSON, and its id.
struct Template(Vec<(String, String, String)>);

impl Template {
    /// `runs` as they are stored now.
    fn of(rt: &Runtime, runs: &[&stepwell::RunState]) -> Result<Self> {
        let mut out = Vec::new();
        for run in runs {
            let state = rt.get_state(&run.run_id)?;
            out.push((
                run.run_id.clone(),
                serde_json::to_string(&state).map_err(|e| bench_err(e.to_string()))?,
                serde_json::to_string(&rt.store().list_records(&run.run_id)?)
                    .map_err(|e| bench_err(e.to_string()))?,
            ));
        }
        Ok(Template(out))
    }

    /// Commits a copy of every run under new ids (each as its own new run,
    /// as a start would), the ids they name one another by replaced too.
    fn copy(&self, rt: &Runtime) -> Result<()> {
        let ids: Vec<(String, String)> = self
            .0
            .iter()
            .map(|(id, _, _)| (id.clone(), uuid::Uuid::now_v7().to_string()))
            .collect();
        let renamed = |text: &str| {
            ids.iter()
                .fold(text.to_string(), |t, (old, new)| t.replace(old, new))
        };
        for (_, state, records) in &self.0 {
            let run: stepwell::RunState =
                serde_json::from_str(&renamed(state)).map_err(|e| bench_err(e.to_string()))?;
            let mut copied: Vec<stepwell::StepRecord> =
                serde_json::from_str(&renamed(records)).map_err(|e| bench_err(e.to_string()))?;
            for r in &mut copied {
                r.step_id = uuid::Uuid::now_v7().to_string();
            }
            let run = stepwell::RunState { version: 1, ..run };
            let fence = Fence::unleased(0);
            rt.store()
                .commit(&copied, &run, fence, LeaseAfter::Release)?;
        }
        Ok(())
    }
}

/// A bundle whose `parent` starts an `asker` child (which asks a person)
/// and waits for it.
fn parent_and_child(dir: &Path) -> Result<PathBuf> {
    let bundle = dir.join("parent-child");
    std::fs::create_dir_all(&bundle).map_err(|e| bench_err(e.to_string()))?;
    let write = |name: &str, doc: Value| {
        std::fs::write(bundle.join(name), doc.to_string()).map_err(|e| bench_err(e.to_string()))
    };
    write(
        "flow.json",
        json!({"workflow_id": "scale.parent", "entry": "start", "nodes": {
            "start": {"effect": "start_subworkflow",
                      "payload": {"workflow_id": "scale.asker", "async": true, "wait": true},
                      "result_key": "child", "next": "done"},
            "done": {"complete": {"$var": "child.status"}}}}),
    )?;
    write(
        "asker.flow.json",
        json!({"workflow_id": "scale.asker", "entry": "ask", "nodes": {
            "ask": {"effect": "ask_user", "payload": {"prompt": "Go?"}}}}),
    )?;
    Ok(bundle)
}

/// Parks `n` runs on the runtime's store, as a busy host has them: nine in
/// ten wait on a person (`ask_user`), one in ten is a parent waiting on a
/// child that waits on a person (the pair counts as two). Each kind is
/// made once through the runtime, then copied.
fn park(rt: &Runtime, flows: &Path, scratch: &Path, n: usize) -> Result<()> {
    let bundle = rt.load_bundle(&flows.join("examples/ask-user"))?;
    let asker = rt.run(&bundle.main_workflow_id, StartOptions::default())?;
    rt.load_bundle(&parent_and_child(scratch)?)?;
    let parent = rt.run("scale.parent", StartOptions::default())?;
    rt.drive_once()?;
    let child = parent
        .waiting
        .as_ref()
        .and_then(|w| w.wait_key.strip_prefix("subworkflow:"))
        .map(|c| rt.get_state(c))
        .transpose()?;
    let (Some(child), RunStatus::Waiting, RunStatus::Waiting) =
        (child, asker.status, parent.status)
    else {
        return Err(bench_err("the parked templates did not park"));
    };
    if child.status != RunStatus::Waiting {
        return Err(bench_err("the child template did not park"));
    }
    let one = Template::of(rt, &[&asker])?;
    let pair = Template::of(rt, &[&parent, &child])?;
    let mut parked = 3;
    while parked < n {
        if parked % 10 == 0 && parked + 2 <= n {
            pair.copy(rt)?;
            parked += 2;
        } else {
            one.copy(rt)?;
            parked += 1;
        }
    }
    Ok(())
}

/// The database file and its write-ahead log, in bytes, after a checkpoint.
fn db_bytes(db: &Path) -> Result<u64> {
    let conn = rusqlite::Connection::open(db).map_err(|e| bench_err(e.to_string()))?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(|e| bench_err(e.to_string()))?;
    drop(conn);
    let size = |p: PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    Ok(size(db.to_path_buf()) + size(PathBuf::from(wal)))
}

/// One measured driver pass: `timers` wait-until runs parked a minute
/// ahead, the clock moved past them, one `drive_once` timed. Every timer
/// must be resumed and completed by that one pass.
fn timed_pass(rt: &Runtime, clock: &ManualClock, timers: usize, at: DateTime<Utc>) -> Result<f64> {
    clock.set(at);
    let mut ids = Vec::with_capacity(timers);
    for _ in 0..timers {
        let run = rt.run(
            "wait-until",
            StartOptions {
                vars: json!({ "seconds": 60 })
                    .as_object()
                    .cloned()
                    .unwrap_or_default(),
                ..Default::default()
            },
        )?;
        if run.status != RunStatus::Waiting {
            return Err(bench_err("wait-until did not park"));
        }
        ids.push(run.run_id);
    }
    clock.set(at + Duration::seconds(120));
    let t = Instant::now();
    let report = rt.drive_once()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if report.due_resumed.len() != timers || !report.errors.is_empty() {
        return Err(bench_err(format!(
            "the pass resumed {} of {timers} due timers (errors: {:?})",
            report.due_resumed.len(),
            report.errors
        )));
    }
    for id in &ids {
        if rt.get_state(id)?.status != RunStatus::Completed {
            return Err(bench_err(format!("timer run {id} did not complete")));
        }
    }
    Ok(ms)
}

/// The peak resident memory, in MiB, of a `stepwell drive` process on
/// `db` after two seconds of passes (every 50 ms), read from the kernel's
/// high-water mark of the process (`VmHWM`), which starts afresh at its
/// exec: not what the benchmark process itself holds.
fn driver_rss_mib(exe: &Path, db: &Path) -> Result<f64> {
    let mut child = std::process::Command::new(exe)
        .arg("--db")
        .arg(db)
        .args(["drive", "--interval-ms", "50"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| bench_err(format!("{}: {e}", exe.display())))?;
    std::thread::sleep(std::time::Duration::from_secs(2));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    let exited = child.try_wait().ok().flatten();
    let _ = child.kill();
    let _ = child.wait();
    if let Some(code) = exited {
        return Err(bench_err(format!("the driver process ended early: {code}")));
    }
    let status = status.map_err(|e| bench_err(format!("the driver's /proc status: {e}")))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| bench_err("no VmHWM in the driver's /proc status"))?;
    Ok(kib / 1024.0)
}

/// `automations_1k_admit_per_s`: `n` automations on a one-minute grid; the
/// clock moves one minute, and driver passes run until nothing moves. Each
/// automation must have admitted exactly one occurrence, completed. Returns
/// (occurrences per second, seconds from the tick to the last completion).
fn automations_admit(flows: &Path, n: usize, dir: &Path) -> Result<(f64, f64)> {
    use stepwell::automation::{create_automation, drive_until_idle};
    let (rt, clock) = world(&dir.join("automations.sqlite"))?;
    let echo = flows.join("automations/echo");
    let echo = echo
        .canonicalize()
        .map_err(|e| bench_err(format!("{}: {e}", echo.display())))?;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let request = json!({
            "request_id": format!("scale-{i}"), "title": format!("Scale {i}"),
            "target": {"workflow_id": "echo", "bundle_ref": echo.display().to_string(),
                       "flow_id": "echo", "input_data": {"prompt": "tick"}},
            "trigger": {"source_id": "schedule", "source_version": 1,
                        "config": {"start_at": T0, "every": "1m"}},
            "workspace_root": "/tmp/automation-ws",
        });
        ids.push(create_automation(&rt, &request, t0(), None)?.automation_id);
    }
    // The first occurrence of each (at T0) runs before the measured tick.
    drive_until_idle(&rt, 10_000)?;
    clock.set(t0() + Duration::minutes(1));
    let t = Instant::now();
    let idle = drive_until_idle(&rt, 10_000)?;
    let secs = t.elapsed().as_secs_f64();
    if !idle.errors.is_empty() {
        return Err(bench_err(format!("automation errors: {:?}", idle.errors)));
    }
    for id in &ids {
        let state = rt.get_state(id)?.vars["_runtime"]["automation"].clone();
        // Occurrences 1 (T0) and 2 (T0 + 1 min) admitted: the next is 3.
        if state["next_index"] != json!(3) || state["last_outcome"]["status"] != "completed" {
            return Err(bench_err(format!(
                "automation {id}: next_index {} last outcome {}",
                state["next_index"], state["last_outcome"]
            )));
        }
    }
    Ok((n as f64 / secs, secs))
}

/// Runs the scale benchmarks and returns their figures as one JSON object.
pub fn run(options: &ScaleOptions) -> Result<Value> {
    let scratch = Scratch::new("scale")?;
    let want = |key: &str| options.only.as_deref().is_none_or(|o| key.contains(o));
    let round = |x: f64, d: i32| (x * 10f64.powi(d)).round() / 10f64.powi(d);
    let mut figures = Map::new();
    let exe = match &options.exe {
        Some(p) => p.clone(),
        None => stepwell_exe()?,
    };
    if want("sqlite_raw_commit_per_s") {
        let rate = raw_commits(1_000, 7, &scratch.0.join("raw.sqlite"))?;
        figures.insert("sqlite_raw_commit_per_s".into(), json!(round(rate, 0)));
    }
    // The figures of the parked stores, by their full names.
    let mut pass_figures = vec!["store_bytes_per_parked_run".to_string()];
    for n in options.parked {
        let label = size_label(n);
        pass_figures.push(format!("drive_pass_ms_{label}_parked"));
        pass_figures.push(format!("driver_rss_mib_{label}_parked"));
    }
    if pass_figures.iter().any(|f| want(f)) {
        let mut bytes = Vec::new();
        for n in options.parked {
            let label = size_label(n);
            let db = scratch.0.join(format!("parked-{label}.sqlite"));
            let (rt, clock) = world(&db)?;
            rt.load_bundle(&options.flows_dir.join("examples/wait-until"))?;
            park(&rt, &options.flows_dir, &scratch.0, n)?;
            bytes.push((n, db_bytes(&db)?));
            // The first pass loads the component: not measured.
            let mut at = t0() + Duration::hours(1);
            timed_pass(&rt, &clock, options.due_timers, at)?;
            let mut samples = Vec::new();
            for _ in 0..options.passes.max(1) {
                at += Duration::hours(1);
                samples.push(timed_pass(&rt, &clock, options.due_timers, at)?);
            }
            drop(rt);
            let pass = format!("drive_pass_ms_{label}_parked");
            if want(&pass) {
                figures.insert(pass, json!(round(median(samples), 2)));
            }
            if want(&format!("driver_rss_mib_{label}_parked")) {
                figures.insert(
                    format!("driver_rss_mib_{label}_parked"),
                    json!(round(driver_rss_mib(&exe, &db)?, 1)),
                );
            }
            if std::env::var_os("STEPWELL_BENCH_KEEP").is_none() {
                std::fs::remove_file(&db).ok();
            }
        }
        if let [(n1, b1), (n2, b2)] = bytes[..] {
            if n2 > n1 {
                figures.insert(
                    "store_bytes_per_parked_run".into(),
                    json!(round((b2 as f64 - b1 as f64) / (n2 - n1) as f64, 0)),
                );
            }
        }
    }
    let label = size_label(options.automations);
    let (rate_name, secs_name) = (
        format!("automations_{label}_admit_per_s"),
        format!("automations_{label}_admit_s"),
    );
    if want(&rate_name) || want(&secs_name) {
        let dir = scratch.0.join("automations");
        std::fs::create_dir_all(&dir).map_err(|e| bench_err(e.to_string()))?;
        let (rate, secs) = automations_admit(&options.flows_dir, options.automations, &dir)?;
        figures.insert(rate_name, json!(round(rate, 1)));
        figures.insert(secs_name, json!(round(secs, 2)));
    }
    figures.insert("machine_cpus".into(), json!(num_cpus()));
    Ok(Value::Object(figures))
}

/// `1k` for 1,000, `100k` for 100,000, else the number: how the figures
/// name their sizes.
fn size_label(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

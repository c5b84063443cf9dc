//! `store-worker`: one OS process of the store conformance suite's
//! cross-process cases (`tests/conformance.rs`, module `processes`).
//!
//! ```text
//! store-worker STORE MODE RUN_ID N [GO_FILE]
//! ```
//!
//! Adds 1 to `vars.count` of run RUN_ID, N times, each time with one ledger
//! record, on STORE (`sqlite:PATH` or `json:DIR`), the way a runtime
//! would:
//!
//! - `lease`: claims the run's lease (retrying while another holder has
//!   it), reads the run, commits with a fence on the version and the lease,
//!   and gives the lease up with the commit;
//! - `cas`: reads the run and commits with a fence on the version alone,
//!   reading again and retrying when another writer got there first.
//!
//! - `events`: appends N events to the inbox stream RUN_ID, with the
//!   dedupe keys `k0` .. `k<N-1>` (the same keys in every worker), and
//!   prints `{"stored": S, "duplicates": D}`.
//!
//! - `full-disk` (SQLite only): commits one small record, then, with the
//!   process's file size limit (`RLIMIT_FSIZE`) set N KiB past the end of
//!   the database and its write-ahead log, one record of 2 MiB, which must
//!   fail (the log cannot grow that far: the store's file layer meets the
//!   limit in the middle of the transaction's gathered log writes), then one
//!   more small record, which must land (it fits). Prints `{"big": {"code",
//!   "message"}}`, the big commit's error.
//!
//! - `compile` (STORE is a cache directory, RUN_ID a component file): loads
//!   the component on a fresh engine caching compiled code there, and
//!   prints where its code came from (`Compiled` or `DiskCache`).
//!
//! With GO_FILE, it starts only once that file exists (so that several
//! workers start together). Prints `{"conflicts": C, "busy": B}`: the
//! commits that lost a race (and changed nothing), and the claims that
//! found the lease held.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use stepwell::host::StoreSpec;
use stepwell::{Claim, Fence, LeaseAfter, LeaseRequest, RunState, StepRecord, StepStatus};

fn record(run: &RunState, n: u64, holder: &str) -> StepRecord {
    StepRecord {
        step_id: uuid(),
        run_id: run.run_id.clone(),
        node_id: Some("count".into()),
        status: StepStatus::Completed,
        effect: None,
        result: Some(json!({ "count": n, "by": holder })),
        error: None,
        started_at: "2026-11-30T09:00:00.000000Z".into(),
        ended_at: None,
        attempt: 1,
        idempotency_key: None,
        prev_hash: None,
        record_hash: None,
        vars: None,
        input: None,
    }
}

fn uuid() -> String {
    format!(
        "{:x}-{:x}",
        std::process::id(),
        Utc::now().timestamp_nanos_opt().unwrap_or(0)
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, run_id, n): (&str, &str, u64) = (&args[1], &args[2], args[3].parse()?);
    let wait_for_go = || {
        if let Some(go) = args.get(4) {
            while !std::path::Path::new(go).exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    if mode == "compile" {
        let engine = stepwell::WasmEngine::new(stepwell::EngineConfig {
            cache_dir: Some(args[0].clone().into()),
            ..stepwell::EngineConfig::default()
        })?;
        wait_for_go();
        let node = engine.load_node(std::path::Path::new(run_id))?;
        println!("{:?}", node.origin());
        return Ok(());
    }
    let store = StoreSpec::parse(&args[0])?.open(None)?;
    wait_for_go();
    if mode == "full-disk" {
        let path = args[0]
            .strip_prefix("sqlite:")
            .ok_or("full-disk needs sqlite:PATH")?;
        let big = full_disk(&*store, path, run_id, n)?;
        println!("{}", json!({ "big": big }));
        return Ok(());
    }
    if mode == "events" {
        let (mut stored, mut duplicates) = (0u64, 0u64);
        for i in 0..n {
            let appended = store.append_event(&stepwell::store::InboxEvent {
                seq: 0,
                stream: run_id.to_string(),
                event_id: format!("{run_id}:k{i}"),
                dedupe_key: format!("k{i}"),
                appended_at: Utc::now().to_rfc3339(),
                payload: json!({"by": std::process::id(), "i": i}),
            })?;
            if appended.duplicate {
                duplicates += 1;
            } else {
                stored += 1;
            }
        }
        println!("{}", json!({ "stored": stored, "duplicates": duplicates }));
        return Ok(());
    }
    let holder = format!("worker-{}", std::process::id());
    let (mut conflicts, mut busy) = (0u64, 0u64);
    let mut done = 0;
    while done < n {
        let now = Utc::now();
        let mut run = if mode == "lease" {
            let lease = LeaseRequest {
                holder: &holder,
                now,
                until: now + chrono::Duration::seconds(30),
                dead_holder: None,
            };
            match store.claim(run_id, &lease)? {
                Claim::Held(run) => *run,
                Claim::Busy { .. } => {
                    busy += 1;
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                other => return Err(format!("claim: {other:?}").into()),
            }
        } else {
            store.load_run(run_id)?.ok_or("no run")?
        };
        // Work between the read and the write, as a step does: the window
        // in which the other worker gets in (SQLite's lock is not fair; a
        // worker that never pauses would take every turn).
        std::thread::sleep(Duration::from_micros(300));
        let count = run.vars["count"].as_u64().unwrap_or(0) + 1;
        run.vars.insert("count".into(), json!(count));
        let read = run.version;
        run.version = read + 1;
        let fence = if mode == "lease" {
            Fence::held(read, &holder)
        } else {
            Fence::unleased(read)
        };
        match store.commit(
            &[record(&run, count, &holder)],
            &run,
            fence,
            LeaseAfter::Release,
        ) {
            Ok(()) => {
                done += 1;
                // Elsewhere for a moment (a driver moves on to other runs),
                // or this worker would claim again before the other looks.
                std::thread::sleep(Duration::from_micros(300));
            }
            Err(e) if e.is_conflict() => conflicts += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!("{}", json!({ "conflicts": conflicts, "busy": busy }));
    Ok(())
}

/// One unleased commit of a record to `run_id` (`text` in its result).
fn commit_one(
    store: &dyn stepwell::Store,
    run_id: &str,
    text: String,
) -> Result<(), stepwell::store::StoreError> {
    let mut run = store.load_run(run_id)?.expect("the run exists");
    let read = run.version;
    run.version = read + 1;
    let mut rec = record(&run, read, "full-disk");
    rec.result = Some(json!({ "text": text }));
    store.commit(&[rec], &run, Fence::unleased(read), LeaseAfter::Release)
}

/// The `full-disk` mode: returns the big commit's error (code and message).
fn full_disk(
    store: &dyn stepwell::Store,
    path: &str,
    run_id: &str,
    kib: u64,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    commit_one(store, run_id, "before".into())?;
    let size = |p: &str| std::fs::metadata(p).map_or(0, |m| m.len());
    let end = size(path).max(size(&format!("{path}-wal")));
    // SAFETY: plain libc calls on a local struct. A write past the limit
    // then fails with EFBIG instead of the process being killed by SIGXFSZ.
    // The hard limit stays as it is (a user may lower the soft one only).
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) != 0 {
            return Err(format!("getrlimit: {}", std::io::Error::last_os_error()).into());
        }
        let wanted = end + kib * 1024;
        if limit.rlim_max != libc::RLIM_INFINITY && limit.rlim_max < wanted {
            return Err(format!(
                "the hard file size limit {} is below {wanted}",
                limit.rlim_max
            )
            .into());
        }
        limit.rlim_cur = wanted;
        if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
            return Err(format!("setrlimit: {}", std::io::Error::last_os_error()).into());
        }
    }
    let big = match commit_one(store, run_id, "x".repeat(2 << 20)) {
        Ok(()) => return Err("a 2 MiB commit landed past the file size limit".into()),
        Err(e) => json!({ "code": e.code, "message": e.message }),
    };
    commit_one(store, run_id, "after".into())?;
    Ok(big)
}

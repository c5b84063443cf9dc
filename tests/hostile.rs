//! Hostile input through the `stepwell` binary, as a new user would try it:
//! flows that recurse, loop or wait for ever, and every misbehaviour of the
//! hostile guest. Each ends with a failed run carrying a typed error, exit
//! status 1, nothing on stderr that looks like a crash, within 60 s, with
//! the process's peak memory under 1 GiB; and the store stays usable
//! (`drive --once` exits 0, a new `hello` run completes).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stepwell_tests::{component, example, scratch_home, stepwell_binary, write_bundle};

/// How a `stepwell` process ended.
struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Peak resident memory of the process, in KiB.
    max_rss_kib: i64,
}

/// Runs `stepwell ARGS` in `dir` (its own `.stepwell` database), killing it
/// (and failing) if it takes 60 s.
// The child is reaped with wait4 (which also reports its peak memory).
#[allow(clippy::zombie_processes)]
fn stepwell(dir: &Path, args: &[&str]) -> Ended {
    let mut child = scratch_home(&mut Command::new(stepwell_binary()), dir)
        .args(args)
        .current_dir(dir)
        .env_remove("STEPWELL_DB")
        .env_remove("STEPWELL_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let readers = (
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut out, &mut s).unwrap();
            s
        }),
        std::thread::spawn(move || {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut err, &mut s).unwrap();
            s
        }),
    );
    let started = Instant::now();
    let (status, usage) = loop {
        let mut status = 0;
        // SAFETY: `rusage` is plain integers and `timeval`s, for which all
        // zero bytes are a valid value (wait4 overwrites it).
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `status` and `usage` are live locals of the types wait4
        // writes; `pid` is our own child, not yet reaped (this loop reaps
        // it), so the call waits for no other process.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break (status, usage);
        }
        assert!(got == 0, "wait4 failed");
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("stepwell {args:?} was still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ended {
        code,
        stdout: readers.0.join().unwrap(),
        stderr: readers.1.join().unwrap(),
        max_rss_kib: usage.ru_maxrss,
    }
}

/// Checks what every hostile case must show of the process that ran it.
fn contained(what: &str, ended: &Ended) {
    for crash in [
        "panicked",
        "overflowed",
        "abort",
        "RUST_BACKTRACE",
        "SIGSEGV",
    ] {
        assert!(
            !ended.stderr.contains(crash),
            "{what}: {crash} on stderr: {}",
            ended.stderr
        );
    }
    assert!(
        ended.max_rss_kib < 1 << 20,
        "{what}: the host grew to {} MiB",
        ended.max_rss_kib >> 10
    );
}

/// The store in `dir` still works: a driver pass exits 0 and a new `hello`
/// run completes.
fn still_usable(what: &str, dir: &Path) {
    let drive = stepwell(dir, &["drive", "--once"]);
    contained(what, &drive);
    assert_eq!(
        drive.code,
        Some(0),
        "{what}: drive --once: {}",
        drive.stderr
    );
    let hello = example("hello");
    let run = stepwell(
        dir,
        &[
            "--json",
            "run",
            hello.to_str().unwrap(),
            "--vars",
            r#"{"name": "after"}"#,
        ],
    );
    assert_eq!(run.code, Some(0), "{what}: hello after: {}", run.stderr);
    let state: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        state["output"],
        json!({"message": "Hello, after!"}),
        "{what}"
    );
}

/// Runs the bundle `files` with `stepwell run` (and `extra` global flags):
/// the run fails with an error that starts with (or, for failures passed
/// up from a child, contains) `code`.
fn fails_with(name: &str, files: &[(&str, Value)], extra: &[&str], code: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let bundle = write_bundle(dir.path(), name, files);
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["--json", "run", bundle.to_str().unwrap()]);
    let ended = stepwell(dir.path(), &args);
    contained(name, &ended);
    assert_eq!(
        ended.code,
        Some(1),
        "{name}: {}{}",
        ended.stdout,
        ended.stderr
    );
    let state: Value = serde_json::from_str(&ended.stdout)
        .unwrap_or_else(|e| panic!("{name}: {e}: {}", ended.stdout));
    assert_eq!(state["status"], "failed", "{name}: {state}");
    let error = state["error"].as_str().unwrap().to_string();
    assert!(error.contains(code), "{name}: expected {code}, got {error}");
    still_usable(name, dir.path());
    error
}

fn hostile(mode: &str, config: Value) -> Vec<(&'static str, Value)> {
    let mut config = config;
    config["mode"] = json!(mode);
    vec![(
        "flow.json",
        json!({"workflow_id": format!("hostile-{mode}"), "entry": "node", "nodes": {
            "node": {"component": component("runaway/hostile.wasm"), "config": config, "next": "end"},
            "end": {"complete": "reached the end"}}}),
    )]
}

#[test]
fn a_flow_that_starts_itself_synchronously() {
    let error = fails_with(
        "selfstart",
        &[(
            "flow.json",
            json!({"workflow_id": "selfstart", "entry": "again", "nodes": {
                "again": {"effect": "start_subworkflow", "payload": {"workflow_id": "selfstart"},
                          "result_key": "child", "next": "done"},
                "done": {"complete": {}}}}),
        )],
        &[],
        "limit_exceeded",
    );
    assert!(error.starts_with("subworkflow_failed"), "{error}");
}

#[test]
fn two_workflows_that_start_each_other() {
    let start = |me: &str, other: &str| {
        json!({"workflow_id": me, "entry": "go", "nodes": {
            "go": {"effect": "start_subworkflow", "payload": {"workflow_id": other},
                   "result_key": "child", "next": "done"},
            "done": {"complete": {}}}})
    };
    fails_with(
        "mutual",
        &[
            ("flow.json", start("ping", "pong")),
            ("pong.flow.json", start("pong", "ping")),
        ],
        &[],
        "limit_exceeded",
    );
}

#[test]
fn a_wait_until_ten_trillion_seconds_away() {
    let error = fails_with(
        "far",
        &[(
            "flow.json",
            json!({"workflow_id": "far", "entry": "w", "nodes": {
                "w": {"effect": "wait_until", "payload": {"seconds": 1e13}, "next": "done"},
                "done": {"complete": {}}}}),
        )],
        &[],
        "invalid_effect",
    );
    assert!(error.contains("year 9999"), "{error}");
}

#[test]
fn a_node_that_loops_without_a_wait() {
    let error = fails_with(
        "loop",
        &[(
            "flow.json",
            json!({"workflow_id": "loop", "entry": "n0", "nodes": {
                "n0": {"component": component("chain/step.wasm"), "next": "n0"}}}),
        )],
        &[],
        "limit_exceeded",
    );
    assert!(error.contains("100000 node steps"), "{error}");
}

#[test]
fn listeners_that_answer_an_event_with_itself() {
    // Twenty runs answer "ping" with "ping". The run that kicks it off
    // completes (its own step did nothing wrong); the chain fails the
    // listeners it reaches past the nesting limit, within a few driver
    // passes, and the store stays small and usable.
    let dir = tempfile::tempdir().unwrap();
    let bundle = write_bundle(dir.path(), "echo", &stepwell_tests::echo_flows());
    let bundle = bundle.to_str().unwrap();
    for _ in 0..20 {
        assert_eq!(stepwell(dir.path(), &["run", bundle]).code, Some(0));
    }
    let kick = stepwell(dir.path(), &["run", bundle, "--workflow", "kick"]);
    contained("kick", &kick);
    assert_eq!(kick.code, Some(0), "{}", kick.stderr);
    for _ in 0..10 {
        let pass = stepwell(dir.path(), &["drive", "--once"]);
        contained("drive", &pass);
        assert_eq!(pass.code, Some(0));
    }
    let list = stepwell(dir.path(), &["--json", "list"]);
    let runs: Vec<Value> = serde_json::from_str(&list.stdout).unwrap();
    let failed: Vec<&Value> = runs.iter().filter(|r| r["status"] == "failed").collect();
    assert!(!failed.is_empty());
    for r in &failed {
        assert!(
            r["error"].as_str().unwrap().starts_with("limit_exceeded"),
            "{r}"
        );
    }
    assert!(
        runs.iter().all(|r| r["status"] != "running"),
        "the storm ended"
    );
    still_usable("echo", dir.path());
}

// The hostile guest's misbehaviours (a 500 ms time limit keeps `loop` short).

#[test]
fn a_guest_that_never_returns() {
    fails_with(
        "loop",
        &hostile("loop", json!({})),
        &["--guest-time-ms", "500"],
        "guest_timeout",
    );
}

#[test]
fn a_guest_that_sleeps_an_hour() {
    fails_with("sleep", &hostile("sleep", json!({})), &[], "guest_blocked");
}

#[test]
fn a_guest_that_polls_a_pollable_an_hour_away() {
    fails_with("poll", &hostile("poll", json!({})), &[], "guest_blocked");
}

#[test]
fn a_guest_that_allocates_without_bound() {
    fails_with(
        "alloc",
        &hostile("alloc", json!({})),
        &[],
        "guest_memory_limit",
    );
}

#[test]
fn a_guest_that_recurses_without_bound() {
    fails_with("stack", &hostile("stack", json!({})), &[], "guest_trap");
}

#[test]
fn a_guest_that_traps_or_panics() {
    fails_with("trap", &hostile("trap", json!({})), &[], "guest_trap");
    fails_with("panic", &hostile("panic", json!({})), &[], "guest_trap");
}

#[test]
fn a_guest_whose_output_does_not_parse() {
    fails_with(
        "bad_json",
        &hostile("bad_json", json!({})),
        &[],
        "guest_bad_output",
    );
    fails_with(
        "bad_vars",
        &hostile("bad_vars", json!({})),
        &[],
        "guest_bad_output",
    );
}

#[test]
fn a_guest_that_returns_far_too_much() {
    // 64 MiB of output, over the 8 MiB limit.
    let error = fails_with(
        "big_output",
        &hostile("big_output", json!({})),
        &[],
        "output_too_large",
    );
    assert!(error.contains("8388608"), "{error}");
    // 200 MiB: the guest builds it within its memory limit; the host stops
    // copying it out past the limit, and stays small.
    fails_with(
        "big_output_200",
        &hostile("big_output", json!({"bytes": 200u64 << 20})),
        &[],
        "output_too_large",
    );
    // 1 GiB: the guest cannot even build it within its memory limit.
    fails_with(
        "big_output_1g",
        &hostile("big_output", json!({"bytes": 1u64 << 30})),
        &[],
        "guest_memory_limit",
    );
}

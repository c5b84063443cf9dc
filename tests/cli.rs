//! The `stepwell` binary, run as a new user would: each command in its own
//! process, on the embedded SQLite default.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use stepwell_tests::example;

fn binary() -> PathBuf {
    // target/<profile>/deps/cli-<hash> -> target/<profile>/stepwell
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("stepwell");
    assert!(
        bin.is_file(),
        "{} not built: run `scripts/setup` (or `cargo build --release`) first",
        bin.display()
    );
    bin
}

struct Cli {
    cwd: tempfile::TempDir,
    /// The user's state and cache folders, apart from the working
    /// directory.
    home: tempfile::TempDir,
}

impl Cli {
    fn new() -> Cli {
        Cli {
            cwd: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(binary());
        stepwell_tests::scratch_home(&mut c, self.home.path())
            .args(args)
            .current_dir(self.cwd.path())
            .env_remove("STEPWELL_DB");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs and expects success; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "stepwell {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    /// Runs and expects failure (exit status 1); returns stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(out.status.code(), Some(1), "stepwell {args:?} should fail");
        String::from_utf8(out.stderr).unwrap()
    }
}

fn ex(name: &str) -> String {
    example(name).display().to_string()
}

/// Whether the components at `paths` (under `flows/examples/`) are built.
/// Outside CI a missing one skips the test with a line naming it (the
/// JavaScript and C toolchains are optional there: scripts/build-js-guest
/// and build-c-guest say so and build nothing); in CI (`CI=true`, as
/// scripts/test checks) it fails the test.
fn built(paths: &[&str]) -> bool {
    let missing: Vec<_> = paths
        .iter()
        .map(|p| example(p))
        .filter(|p| !p.exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "not built: {missing:?} (scripts/build-guests)"
    );
    eprintln!("skipped: not built: {missing:?} (scripts/build-guests)");
    false
}

#[test]
fn hello_runs_on_the_embedded_default_store() {
    let cli = Cli::new();
    let out = cli.ok(&["run", &ex("hello"), "--vars", r#"{"name": "Alice"}"#]);
    assert!(out.contains("status completed"), "{out}");
    assert!(
        out.contains(r#"output: {"message":"Hello, Alice!"}"#),
        "{out}"
    );
    assert!(cli.cwd.path().join(".stepwell/stepwell.sqlite").is_file());
    assert!(
        cli.cwd.path().join(".stepwell/cache").is_dir(),
        "compiled components are cached"
    );
    let listed = cli.json(&["list"]);
    assert_eq!(listed.as_array().unwrap().len(), 1);
}

/// The memory store keeps nothing beside a database: its compiled
/// components go to the user's cache folder (`$XDG_CACHE_HOME/stepwell`,
/// else `~/.cache/stepwell`), and the working directory stays as it was.
#[test]
fn a_memory_store_writes_nothing_in_the_working_directory() {
    let cli = Cli::new();
    let home = tempfile::tempdir().unwrap();
    let run = |env: (&str, &Path)| {
        let out = cli
            .cmd(&[
                "--store",
                "memory",
                "run",
                &ex("hello"),
                "--vars",
                r#"{"name": "M"}"#,
            ])
            .env_remove("XDG_CACHE_HOME")
            .env(env.0, env.1)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            text.contains(r#"output: {"message":"Hello, M!"}"#),
            "{text}"
        );
    };
    let xdg = home.path().join("xdg");
    run(("XDG_CACHE_HOME", &xdg));
    let cached = |dir: &Path| std::fs::read_dir(dir).map_or(0, |d| d.count());
    assert!(cached(&xdg.join("stepwell/cache")) > 0, "nothing cached");
    run(("HOME", home.path()));
    assert!(cached(&home.path().join(".cache/stepwell/cache")) > 0);
    let left: Vec<_> = std::fs::read_dir(cli.cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "the working directory got {left:?}");
}

/// Guests count time from 1970 (`node-input.now` is a `datetime`): a fixed
/// clock before it is refused at the door, and nothing is started.
#[test]
fn a_clock_fixed_before_1970_is_refused() {
    let cli = Cli::new();
    let err = cli.fails(&["--now", "1960-01-01T00:00:00Z", "run", &ex("hello")]);
    assert!(
        err.contains("invalid_input: --now: 1960-01-01T00:00:00.000000Z is before 1970"),
        "{err}"
    );
    let out = cli.ok(&["--now", "1970-01-01T00:00:00Z", "run", &ex("hello")]);
    assert!(out.contains("status completed"), "{out}");
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `stepwell run ... | head -0`: the reader is gone before the first
    // line; the process ends without a panic or a backtrace.
    let cli = Cli::new();
    let mut child = cli
        .cmd(&["run", &ex("hello"), "--vars", r#"{"name": "Pipe"}"#])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    // The run itself completed: the output was the only casualty.
    let listed = cli.json(&["list"]);
    assert_eq!(listed[0]["status"], json!("completed"), "{listed}");
}

#[test]
fn ask_user_is_parked_by_one_process_and_resumed_by_another() {
    let cli = Cli::new();
    let parked = cli.json(&["run", &ex("ask-user")]);
    assert_eq!(parked["status"], "waiting");
    assert_eq!(parked["waiting"]["prompt"], "What is your name?");
    let id = parked["run_id"].as_str().unwrap().to_string();

    let waiting = cli.json(&["list", "--status", "waiting", "--wait-reason", "user"]);
    assert_eq!(waiting[0]["run_id"], id.as_str());

    let err = cli.fails(&[
        "resume",
        &id,
        "--payload",
        r#"{"text": "Bob"}"#,
        "--wait-key",
        "wrong",
    ]);
    assert!(err.contains("stale_resume"), "{err}");
    assert_eq!(
        cli.json(&["status", &id])["status"],
        "waiting",
        "a wrong key changes nothing"
    );

    let done = cli.json(&["resume", &id, "--payload", r#"{"text": "Bob"}"#]);
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"], json!({"greeting": "Hello, Bob!"}));

    let err = cli.fails(&["resume", &id, "--payload", r#"{"text": "Eve"}"#]);
    assert!(
        err.contains("stale_resume") && err.contains("Run is not waiting"),
        "{err}"
    );

    let ledger = cli.json(&["ledger", &id]);
    let statuses: Vec<_> = ledger
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["started", "waiting", "completed", "completed"]);
    let text = cli.ok(&["ledger", &id]);
    assert_eq!(text.lines().count(), 4, "{text}");
}

#[test]
fn the_database_can_be_chosen_by_flag_or_environment() {
    let cli = Cli::new();
    let db = cli.cwd.path().join("elsewhere/x.sqlite");
    cli.ok(&["--db", db.to_str().unwrap(), "run", &ex("hello")]);
    assert!(db.is_file());
    let env_db = cli.cwd.path().join("env.sqlite");
    let out = cli
        .cmd(&["run", &ex("hello"), "--json"])
        .env("STEPWELL_DB", &env_db)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(env_db.is_file());
    assert!(!cli.cwd.path().join(".stepwell/stepwell.sqlite").exists());
}

#[test]
fn errors_are_typed_and_name_what_is_wrong() {
    let cli = Cli::new();
    let bad = cli.cwd.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("flow.json"),
        r#"{"workflow_id": "bad", "entry": "a", "nodes": {"a": {"complete": 1, "next": "zz"}}}"#,
    )
    .unwrap();
    let err = cli.fails(&["run", bad.to_str().unwrap()]);
    assert!(
        err.contains("invalid_definition")
            && err.contains("bad/flow.json")
            && err.contains("nodes.a"),
        "{err}"
    );
    assert!(
        cli.json(&["list"]).as_array().unwrap().is_empty(),
        "nothing was started"
    );

    let err = cli.fails(&["resume", "no-such-run", "--payload", "{}"]);
    assert!(err.contains("run_not_found"), "{err}");
    let err = cli.fails(&["run", &ex("hello"), "--vars", "[1]"]);
    assert!(
        err.contains("invalid_input: --vars: must be a JSON object"),
        "{err}"
    );
    let err = cli.fails(&["status", "nope", "--json"]);
    let v: Value = serde_json::from_str(err.trim()).unwrap();
    assert_eq!(v["error"]["code"], "run_not_found");
}

#[test]
fn drive_resumes_a_due_wait() {
    let cli = Cli::new();
    let parked = cli.json(&["run", &ex("wait-until"), "--vars", r#"{"seconds": 0.3}"#]);
    assert_eq!(parked["status"], "waiting");
    assert_eq!(parked["waiting"]["reason"], "until");
    let id = parked["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(std::time::Duration::from_millis(400));
    let report = cli.json(&["drive", "--once"]);
    assert_eq!(report["due_resumed"], json!([id]));
    let done = cli.json(&["status", &id]);
    assert_eq!(done["output"], json!({"ok": true}));
}

#[test]
fn subworkflows_events_and_the_python_javascript_and_c_nodes_work_from_the_cli() {
    let cli = Cli::new();
    let sub = cli.json(&["run", &ex("subworkflow"), "--vars", r#"{"text": "hey"}"#]);
    assert_eq!(sub["output"], json!({"shouted": "HEY"}));

    let waiter = cli.json(&["run", &ex("event")]);
    assert_eq!(
        waiter["waiting"]["wait_key"],
        "evt:global:global:order.paid"
    );
    let emitted = cli.json(&[
        "run",
        &ex("event"),
        "--workflow",
        "event.emitter",
        "--vars",
        r#"{"payload": {"order": 7}}"#,
    ]);
    assert_eq!(emitted["output"]["delivered"], 1);
    let resumed = cli.json(&["status", waiter["run_id"].as_str().unwrap()]);
    assert_eq!(
        resumed["output"]["received"]["payload"],
        json!({"order": 7})
    );

    let py = cli.json(&["run", &ex("hello-py"), "--vars", r#"{"name": "Ada"}"#]);
    assert_eq!(
        py["output"],
        json!({"message": "Hello, Ada!", "language": "python"})
    );
    if !built(&[
        "hello-js/greet.wasm",
        "hello-ts/greet.wasm",
        "hello-c/greet.wasm",
    ]) {
        return;
    }
    let ts = cli.json(&["run", &ex("hello-ts"), "--vars", r#"{"name": "Ada"}"#]);
    assert_eq!(
        ts["output"],
        json!({"message": "Hello, Ada!", "language": "typescript"})
    );
    let js = cli.json(&["run", &ex("hello-js"), "--vars", r#"{"name": "Ada"}"#]);
    assert_eq!(
        js["output"],
        json!({"message": "Hello, Ada!", "language": "javascript"})
    );
    let c = cli.json(&["run", &ex("hello-c"), "--vars", r#"{"name": "Ada \u00e9"}"#]);
    assert_eq!(
        c["output"],
        json!({"message": "Hello, Ada \u{e9}!", "language": "c"})
    );
    // The C SDK reads a string of any length whole (no character cut in
    // half), and refuses one holding a NUL, which C text cannot.
    let long = "\u{e9}".repeat(300);
    let vars = json!({ "name": long }).to_string();
    let c = cli.json(&["run", &ex("hello-c"), "--vars", &vars]);
    assert_eq!(c["output"]["message"], format!("Hello, {long}!"), "{c}");
    let c = cli.json(&["run", &ex("hello-c"), "--vars", r#"{"name": "a\u0000b"}"#]);
    assert_eq!(c["output"]["message"], "Hello, World!", "{c}");
}

#[test]
fn the_runaway_example_fails_within_the_time_limit() {
    let cli = Cli::new();
    let t = std::time::Instant::now();
    // The run fails (exit status 1), and is printed as usual.
    let out = cli.run(&["--guest-time-ms", "300", "--json", "run", &ex("runaway")]);
    assert_eq!(out.status.code(), Some(1));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["status"], "failed");
    assert!(
        run["error"].as_str().unwrap().starts_with("guest_timeout"),
        "{run}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // The store is fine afterwards.
    assert_eq!(cli.json(&["run", &ex("hello")])["status"], "completed");
}

#[test]
fn bench_prints_every_figure() {
    let cli = Cli::new();
    let flows: &Path = &stepwell_tests::repo().join("flows");
    let figures = cli.json(&["bench", "--quick", "--flows", flows.to_str().unwrap()]);
    for key in [
        "node_dispatch_us_p50",
        "chain_steps_per_s_memory",
        "chain_steps_per_s_sqlite",
        "chain_steps_per_s_json",
        "ledger_append_per_s_sqlite",
        "trigger_prepare_us_p50",
        "ask_resume_cycles_per_s_sqlite",
        "resume_conflicts_per_s_sqlite",
        "drive_runs_per_s_sqlite_3procs",
        "node_instantiate_us_p50",
        "hostile_contained_per_s",
        "sqlite_raw_commit_per_s",
        "http_start_runs_per_s",
        "http_resume_p99_ms",
        "webhook_accept_per_s",
    ] {
        let v = figures[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing in {figures}"));
        assert!(v > 0.0, "{key} = {v}");
    }
}

#[test]
fn triggers_list_validate_preview_and_call() {
    let cli = Cli::new();
    let plugins = stepwell_tests::repo().join("flows/triggers/plugins");
    let listed = cli.json(&[
        "triggers",
        "list",
        "--trigger-dir",
        plugins.to_str().unwrap(),
    ]);
    let names: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["available"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("schedule@1".to_string(), true),
            ("manual@1".to_string(), true),
            ("webhook.received@1".to_string(), true),
            ("feed.item@1".to_string(), true),
            ("alert@1".to_string(), true),
            ("cron@1".to_string(), true)
        ]
    );
    assert_eq!(listed[2]["descriptor"]["kind"], "event");
    assert_eq!(listed[5]["descriptor"]["kind"], "time");

    // A broken plugin beside cron: listed unavailable, cron still works.
    let dir = cli.cwd.path().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(plugins.join("cron.wasm"), dir.join("cron.wasm")).unwrap();
    std::fs::write(dir.join("broken.wasm"), b"\0asm garbage").unwrap();
    let out = cli
        .cmd(&["triggers", "list", "--json"])
        .env("STEPWELL_TRIGGER_DIR", &dir)
        .output()
        .unwrap();
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let broken = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "broken.wasm")
        .unwrap();
    assert_eq!(broken["available"], false);
    assert!(broken["reason"]
        .as_str()
        .unwrap()
        .contains("not a valid WebAssembly component"));
    let preview = cli.json(&[
        "triggers",
        "preview",
        "cron@1",
        "--trigger-dir",
        dir.to_str().unwrap(),
        "--config",
        r#"{"expression": "0 9 * * 1-5", "timezone": "Europe/Paris"}"#,
        "--from",
        "2026-11-27T00:00:00Z",
        "--count",
        "2",
    ]);
    let at: Vec<_> = preview["fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["payload"]["local_time"].as_str().unwrap())
        .collect();
    assert_eq!(
        at,
        ["2026-11-27T09:00:00+01:00", "2026-11-30T09:00:00+01:00"]
    );

    let validated = cli.json(&[
        "triggers",
        "validate",
        "schedule@1",
        "--config",
        r#"{"every": "1h"}"#,
        "--now",
        "2026-11-30T09:00:00Z",
    ]);
    assert_eq!(validated["start_at"], "2026-11-30T09:00:00+00:00");
    let err = cli.fails(&[
        "triggers",
        "validate",
        "schedule@1",
        "--config",
        r#"{"every": "1x"}"#,
        "--json",
    ]);
    let err: Value = serde_json::from_str(err.trim()).unwrap();
    assert_eq!(err["error"]["code"], "invalid_definition");
    assert_eq!(err["error"]["field"], "trigger.config.every");

    let text = cli.ok(&[
        "triggers",
        "preview",
        "schedule@1",
        "--config",
        r#"{"every": "15m"}"#,
        "--from",
        "2026-11-30T09:00:00Z",
        "--count",
        "3",
    ]);
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(
        text.lines()
            .nth(1)
            .unwrap()
            .starts_with("2026-11-30T09:15:00+00:00"),
        "{text}"
    );

    let admitted = cli.json(&[
        "triggers", "call", "schedule@1", "admit", "--input",
        r#"{"binding": {"binding_id": "b", "config": {"start_at": "2026-11-30T09:00:00Z", "every": "1h"}}, "state": {"tick": 0, "scheduled_count": 0}, "now": "2026-11-30T11:00:00Z"}"#,
    ]);
    assert_eq!(admitted["admission"]["event_id"], "schedule@1:b:2");
    let err = cli.fails(&["triggers", "call", "cron@1", "prepare", "--input", "{}"]);
    assert!(
        err.contains("unknown_trigger_source"),
        "cron is only a plugin: {err}"
    );
}

#[test]
fn ledger_verify_finds_the_first_tampered_record() {
    let cli = Cli::new();
    let parked = cli.json(&["run", &ex("ask-user")]);
    let id = parked["run_id"].as_str().unwrap().to_string();
    cli.ok(&["resume", &id, "--payload", r#"{"text": "Bob"}"#]);
    let ok = cli.ok(&["ledger", &id, "--verify"]);
    assert!(ok.starts_with("ok: 4 records, chain intact"), "{ok}");
    let report = cli.json(&["ledger", &id, "--verify"]);
    assert_eq!(report["ok"], true);

    // Change the third record behind the host's back.
    let db = cli.cwd.path().join(".stepwell/stepwell.sqlite");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let data: String = conn
        .query_row(
            "SELECT data FROM ledger WHERE run_id = ?1 AND seq = 3",
            [&id],
            |r| r.get(0),
        )
        .unwrap();
    let forged = data.replace("Bob", "Eve");
    assert_ne!(forged, data);
    conn.execute(
        "UPDATE ledger SET data = ?1 WHERE run_id = ?2 AND seq = 3",
        rusqlite::params![forged, id],
    )
    .unwrap();
    drop(conn);
    let out = cli.run(&["ledger", &id, "--verify"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("broken: record 3 of 4") && text.contains("changed"),
        "{text}"
    );

    // Remove the second record: the third no longer follows the first.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute(
        "UPDATE ledger SET data = ?1 WHERE run_id = ?2 AND seq = 3",
        rusqlite::params![data, id],
    )
    .unwrap();
    conn.execute("DELETE FROM ledger WHERE run_id = ?1 AND seq = 2", [&id])
        .unwrap();
    drop(conn);
    let out = cli.run(&["ledger", &id, "--verify", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["break"]["index"], 2);
    assert_eq!(v["break"]["problem"], "removed or reordered");
}

#[test]
fn the_store_can_be_json_files_or_memory() {
    let cli = Cli::new();
    let dir = cli.cwd.path().join("json-store");
    let spec = format!("json:{}", dir.display());
    let parked = cli.json(&["--store", &spec, "run", &ex("ask-user")]);
    let id = parked["run_id"].as_str().unwrap().to_string();
    assert!(dir.join(format!("run_{id}.json")).is_file());
    let done = cli.json(&[
        "--store",
        &spec,
        "resume",
        &id,
        "--payload",
        r#"{"text": "Jo"}"#,
    ]);
    assert_eq!(done["output"], json!({"greeting": "Hello, Jo!"}));
    assert!(cli
        .ok(&["--store", &spec, "ledger", &id, "--verify"])
        .starts_with("ok: 4 records"));
    let mem = cli.json(&["--store", "memory", "run", &ex("hello")]);
    assert_eq!(mem["status"], "completed");
    let err = cli.fails(&["--store", "redis://x", "list"]);
    assert!(err.contains("--store"), "{err}");
    // A PostgreSQL server that is not there: the store says so, naming it
    // without its password.
    let err = cli.fails(&[
        "--store",
        "postgres://me:hunter2@127.0.0.1:1/db?connect_timeout=2",
        "list",
    ]);
    assert!(
        err.contains("store_io") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(!cli.cwd.path().join(".stepwell/stepwell.sqlite").exists());
}

#[test]
fn ledger_follow_streams_records_until_the_run_ends() {
    let cli = Cli::new();
    let parked = cli.json(&["run", &ex("ask-user")]);
    let id = parked["run_id"].as_str().unwrap().to_string();
    let mut follower = cli
        .cmd(&["ledger", &id, "--follow", "--poll-ms", "50"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        follower.try_wait().unwrap().is_none(),
        "still following a waiting run"
    );
    cli.ok(&["resume", &id, "--payload", r#"{"text": "Bob"}"#]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while follower.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            follower.kill().unwrap();
            panic!("--follow did not stop after the run ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = follower.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[3].contains("greet") && lines[3].contains("Hello, Bob!"),
        "{text}"
    );
}

#[test]
fn snapshots_are_created_listed_and_restored() {
    let cli = Cli::new();
    let parked = cli.json(&["run", &ex("ask-user")]);
    let id = parked["run_id"].as_str().unwrap().to_string();
    let snap = cli.json(&[
        "snapshot", "create", &id, "--name", "asked", "--tag", "demo",
    ]);
    let snap_id = snap["snapshot_id"].as_str().unwrap().to_string();
    assert!(cli
        .cwd
        .path()
        .join(format!(".stepwell/snapshots/snapshot_{snap_id}.json"))
        .is_file());
    cli.ok(&["resume", &id, "--payload", r#"{"text": "Bob"}"#]);
    let listed = cli.json(&["snapshot", "list", "--run", &id, "--tag", "demo"]);
    assert_eq!(listed[0]["snapshot_id"], snap_id.as_str());
    assert!(cli
        .json(&["snapshot", "list", "--text", "nothing-like-this"])
        .as_array()
        .unwrap()
        .is_empty());
    let restored = cli.json(&["snapshot", "restore", &snap_id]);
    assert_eq!(restored["status"], "waiting");
    let done = cli.json(&["resume", &id, "--payload", r#"{"text": "Eve"}"#]);
    assert_eq!(done["output"], json!({"greeting": "Hello, Eve!"}));
    assert!(cli.ok(&["ledger", &id, "--verify"]).starts_with("ok: "));
}

/// The packages `cargo tree` lists for a workspace package's normal
/// dependencies (names only, each once).
fn dependency_names(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "tree",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
            "-p",
        ])
        .arg(package)
        .current_dir(stepwell_tests::repo())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// An application that embeds only the step loop on SQLite
/// (`examples/embed-sqlite`: `default-features = false, features =
/// ["sqlite"]`) carries no server, database client, HTTP client or CLI
/// parser, and its program parks a run in one runtime and resumes it in
/// another. (tokio stays: wasmtime-wasi, the sandbox's WASI, needs it.)
#[test]
fn an_embedder_of_the_kernel_on_sqlite_takes_no_feature_it_did_not_ask_for() {
    let names = dependency_names("stepwell-embed-sqlite");
    assert!(names.iter().any(|n| n == "rusqlite"), "{names:?}");
    assert!(names.iter().any(|n| n == "wasmtime"), "{names:?}");
    for unwanted in [
        "hyper",
        "axum",
        "tower",
        "postgres",
        "tokio-postgres",
        "ureq",
        "rustls",
        "ring",
        "feed-rs",
        "clap",
        "tracing-subscriber",
        "regex",
        "chacha20poly1305",
        "mimalloc",
        "stepwell-serve",
    ] {
        assert!(
            !names.iter().any(|n| n == unwanted),
            "{unwanted} is in the embedder's tree"
        );
    }
    // The whole binary has them (the check above can fail).
    let full = dependency_names("stepwell-cli");
    for wanted in ["axum", "postgres", "ureq", "clap", "feed-rs"] {
        assert!(
            full.iter().any(|n| n == wanted),
            "{wanted} not in the CLI's tree"
        );
    }
    assert!(
        names.len() < full.len(),
        "{} vs {}",
        names.len(),
        full.len()
    );

    let exe = binary().with_file_name("embed-sqlite");
    assert!(exe.is_file(), "{} not built", exe.display());
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("asks: What is your name?"), "{text}");
    assert!(text.contains("completed"), "{text}");
    assert!(text.contains("Hello, Bob"), "{text}");
}

/// `drive --retain` prunes as it drives: an old finished run goes, from a
/// driver process, while a waiting one stays.
#[test]
fn a_driver_with_a_retention_policy_prunes_old_runs() {
    let cli = Cli::new();
    let old = cli.json(&["--now", "2026-01-01T00:00:00Z", "run", &ex("hello")]);
    let waiting = cli.json(&["--now", "2026-01-01T00:00:00Z", "run", &ex("ask-user")]);
    let old_id = old["run_id"].as_str().unwrap().to_string();
    let mut driver = cli
        .cmd(&["drive", "--retain", "completed=30d", "--prune-every", "1s"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    stepwell_tests::wait_for(
        "the old run pruned",
        std::time::Duration::from_secs(30),
        || cli.run(&["status", &old_id]).status.code() == Some(1),
    );
    driver.kill().unwrap();
    let out = driver.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("deleted {old_id}  hello  completed")),
        "{text}"
    );
    let err = cli.fails(&["status", &old_id]);
    assert!(err.contains("run_not_found"), "{err}");
    assert_eq!(
        cli.json(&["status", waiting["run_id"].as_str().unwrap()])["status"],
        "waiting"
    );
    let bad = cli.fails(&["drive", "--retain", "completed=30d", "--prune-every", "0s"]);
    assert!(bad.contains("prune_every"), "{bad}");
}

/// Traces from a command: sent to the collector the flag (or the standard
/// variable) names, the command's spans delivered before it exits; a
/// collector that is not there costs the run nothing but a warning; bad
/// OpenTelemetry settings are refused naming the variable.
#[test]
fn a_command_sends_its_spans_and_survives_a_missing_collector() {
    let cli = Cli::new();
    let collector = stepwell_tests::otlp::Collector::start();
    let run = cli.json(&["--otlp-endpoint", &collector.endpoint, "run", &ex("hello")]);
    assert_eq!(run["status"], "completed");
    let id = run["run_id"].as_str().unwrap();
    // Delivered before the process ended: no waiting here.
    let spans = collector.spans();
    let whole = spans
        .iter()
        .find(|s| s.name == "stepwell.run" && s.attr("stepwell.run_id") == id)
        .expect("the run's span arrived before the command exited");
    assert_eq!(whole.attr("stepwell.workflow_id"), "hello");
    assert!(spans.iter().any(|s| s.name == "stepwell.guest"));
    // The standard variable does the same.
    let out = cli
        .cmd(&["run", &ex("hello")])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.endpoint)
        .env("OTEL_SERVICE_NAME", "from-env")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(collector
        .spans()
        .iter()
        .any(|s| s.resource["service.name"] == "from-env"));
    // Nobody listens on port 9 of loopback: the run completes, and the
    // command says its spans were not delivered.
    let out = cli
        .cmd(&["--otlp-endpoint", "http://127.0.0.1:9", "run", &ex("hello")])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trace spans were not delivered to the OTLP collector"),
        "{err}"
    );
    let out = cli
        .cmd(&["--otlp-endpoint", &collector.endpoint, "run", &ex("hello")])
        .env("OTEL_EXPORTER_OTLP_HEADERS", "bad header=x")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid_input: OTEL_EXPORTER_OTLP_HEADERS")
            && err.contains("is not a header name"),
        "{err}"
    );
    let err = cli.fails(&["--otlp-endpoint", "ftp://x", "run", &ex("hello")]);
    assert!(err.contains("invalid_input: otlp_endpoint"), "{err}");
}

/// The hints a command prints repeat the store flags the user typed, so a
/// pasted hint works on the same store; a run not found says which store
/// was looked in; a mistyped command gets the nearest one.
#[test]
fn hints_keep_the_store_and_mistakes_get_the_nearest_command() {
    let cli = Cli::new();
    let out = cli.ok(&["--db", "scratch dir/x.sqlite", "run", &ex("ask-user")]);
    let hint = out
        .lines()
        .find(|l| l.starts_with("resume with: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        hint.starts_with("resume with: stepwell --db 'scratch dir/x.sqlite' resume "),
        "{hint}"
    );
    // The hint, pasted (its `...` answered), resumes the run.
    let id = hint
        .split(" resume ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap();
    let done = cli.ok(&[
        "--db",
        "scratch dir/x.sqlite",
        "resume",
        id,
        "--payload",
        r#"{"text": "Ada"}"#,
    ]);
    assert!(done.contains("status completed"), "{done}");
    // Without the flag: another store, and the error says which.
    let err = cli.fails(&["status", id]);
    assert!(
        err.contains("run_not_found") && err.contains("looked in sqlite:.stepwell/stepwell.sqlite"),
        "{err}"
    );
    // An empty answer says so (on stderr: stdout stays empty for scripts).
    let out = cli.run(&["list", "--workflow", "no-such-workflow"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "nothing to show\n");
    // The flag is named once in its error.
    let err = cli.fails(&["--now", "yesterday", "list"]);
    assert_eq!(err.matches("--now").count(), 1, "{err}");
    let out = cli.run(&["rnu"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a similar subcommand exists: 'run'"), "{err}");
    // A typo after a command: among that command's own.
    let out = cli.run(&["automations", "lsit"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a similar subcommand exists: 'list'"), "{err}");
    let out = cli.run(&["automations", "rnu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("'run'"), "{err}");
    // A command's help lists its own options apart from the global ones.
    let help = cli.ok(&["status", "--help"]);
    let (own, global) = help.split_once("Global options:").expect(&help);
    assert!(
        own.contains("<RUN_ID>") && !own.contains("--enable-exec"),
        "{help}"
    );
    assert!(
        global.contains("--db") && global.contains("--enable-exec"),
        "{help}"
    );
    // A --db that a store named in the environment overrides is not
    // repeated; a path that starts with '-' is.
    let out = cli
        .cmd(&["--db", "typed.sqlite", "run", &ex("ask-user")])
        .env("STEPWELL_STORE", "sqlite:env.sqlite")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("resume with: stepwell resume "), "{text}");
    let text = cli.ok(&["--db=-dash.sqlite", "run", &ex("ask-user")]);
    assert!(
        text.contains("resume with: stepwell --db=-dash.sqlite resume "),
        "{text}"
    );
}

/// `list` is newest first, `--limit` keeps the newest, and each line says
/// when the run was created and how long it took.
#[test]
fn list_is_newest_first_with_times() {
    let cli = Cli::new();
    let first = cli.json(&["run", &ex("hello")]);
    let second = cli.json(&["run", &ex("ask-user"), "--run-id", "later"]);
    let listed = cli.json(&["list"]);
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            second["run_id"].as_str().unwrap(),
            first["run_id"].as_str().unwrap()
        ]
    );
    let text = cli.ok(&["list", "--limit", "1"]);
    let line = text.lines().next().unwrap();
    assert!(line.starts_with("later "), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    let created = second["created_at"].as_str().unwrap();
    assert!(line.contains(&created[..10]), "{line}");
    assert!(line.contains("s  user ask_user:later:1"), "{line}");
}

/// `stepwell ARGS` on a terminal (a pseudo-terminal `script(1)` opens),
/// from `cli`'s folders: what the terminal showed.
fn on_a_terminal(cli: &Cli, args: &[&str]) -> String {
    on_a_terminal_after(cli, "", args)
}

/// As [`on_a_terminal`], after the shell commands `before` (`stty cols
/// 60; ` sets the terminal's width).
fn on_a_terminal_after(cli: &Cli, before: &str, args: &[&str]) -> String {
    let quoted: Vec<String> = std::iter::once(binary().display().to_string())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let mut c = Command::new("script");
    stepwell_tests::scratch_home(&mut c, cli.home.path())
        .args([
            "-qec",
            &format!("{before}{}", quoted.join(" ")),
            "/dev/null",
        ])
        .current_dir(cli.cwd.path())
        .env_remove("STEPWELL_DB");
    let out = c.output().expect("script(1) runs");
    String::from_utf8_lossy(&out.stdout).replace('\r', "")
}

#[test]
fn a_first_compile_says_so_on_a_terminal_and_nowhere_else() {
    // The Python node: its interpreter inside, 18 MB, seconds to compile.
    let cli = Cli::new();
    let shown = on_a_terminal(&cli, &["run", &ex("hello-py")]);
    assert!(shown.contains("compiling greet.wasm ("), "{shown}");
    assert!(shown.contains("compiled greet.wasm in "), "{shown}");
    assert!(shown.contains("status completed"), "{shown}");
    // Compiled once: the next run reads the cache and says nothing.
    let again = on_a_terminal(&cli, &["run", &ex("hello-py")]);
    assert!(!again.contains("compil"), "{again}");
    // A small component compiles in milliseconds: not announced.
    let small = on_a_terminal(&cli, &["run", &ex("hello")]);
    assert!(
        !small.contains("compil") && small.contains("completed"),
        "{small}"
    );
    // Through a pipe, and with --json on a terminal: nothing added.
    let piped = Cli::new();
    let out = piped.run(&["run", &ex("hello")]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("compil"), "{all}");
    let json = on_a_terminal(&Cli::new(), &["--json", "run", &ex("hello")]);
    assert!(!json.contains("compil"), "{json}");
}

#[test]
fn a_component_that_is_not_wasm_is_named_on_one_line() {
    let cli = Cli::new();
    let dir = cli.cwd.path().join("bad");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("n.wasm"), "not wasm at all").unwrap();
    std::fs::write(
        dir.join("flow.json"),
        r#"{"workflow_id": "bad", "entry": "a", "nodes": {"a": {"component": "n.wasm"}}}"#,
    )
    .unwrap();
    let err = cli.fails(&["run", "bad"]);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("n.wasm: not a valid WebAssembly component: ")
            && err.contains("magic header not detected"),
        "{err}"
    );
}

#[test]
fn a_database_that_refuses_the_role_fails_at_once() {
    if stepwell_tests::postgres_skipped() {
        return;
    }
    let url = std::env::var(stepwell_tests::POSTGRES_URL_ENV).unwrap();
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    let wrong = format!("{scheme}://nobody-{}@{host}", std::process::id());
    let cli = Cli::new();
    let started = std::time::Instant::now();
    let shown = on_a_terminal(&cli, &["--store", &wrong, "list"]);
    // No retry (the server answered: no such role), so no word of one;
    // a retry would take 10 s.
    assert!(shown.contains("does not exist (28000)"), "{shown}");
    assert!(!shown.contains("trying again"), "{shown}");
    assert!(started.elapsed() < std::time::Duration::from_secs(8));
}

#[test]
fn lists_line_up_their_columns() {
    let cli = Cli::new();
    let plugins = stepwell_tests::repo().join("flows/triggers/plugins");
    let out = cli.ok(&[
        "triggers",
        "list",
        "--trigger-dir",
        plugins.to_str().unwrap(),
    ]);
    let state_at: Vec<usize> = out
        .lines()
        .map(|l| l.find(" available").expect("every source is available") + 1)
        .collect();
    assert!(state_at.len() >= 6, "{out}");
    assert!(state_at.iter().all(|&c| c == state_at[0]), "{out}");
    let tools = cli.ok(&["tools", "list"]);
    // Where the second column starts: after the name and its padding.
    let second = |l: &str| {
        let name_end = l.find(' ').unwrap();
        name_end + l[name_end..].find(|c: char| c != ' ').unwrap()
    };
    let class_at: Vec<usize> = tools.lines().map(second).collect();
    assert!(class_at.iter().all(|&c| c == class_at[0]), "{tools}");
}

#[test]
fn list_since_keeps_the_runs_created_since_then() {
    let cli = Cli::new();
    let old = ["--now", "2026-01-01T00:00:00Z"];
    let new = ["--now", "2026-01-03T00:00:00Z"];
    cli.ok(&[old[0], old[1], "run", &ex("hello"), "--run-id", "old"]);
    cli.ok(&[new[0], new[1], "run", &ex("hello"), "--run-id", "new"]);
    let ids = |args: &[&str]| -> Vec<String> {
        cli.json(args)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let at = ["--now", "2026-01-03T12:00:00Z"];
    assert_eq!(ids(&[at[0], at[1], "list", "--since", "1d"]), ["new"]);
    assert_eq!(
        ids(&[at[0], at[1], "list", "--since", "3d"]),
        ["new", "old"]
    );
    assert_eq!(ids(&["list", "--since", "2026-01-02T00:00:00Z"]), ["new"]);
    // Each line: created, updated (both UTC, to the second), duration.
    let text = cli.ok(&["list", "--since", "2026-01-02T00:00:00Z"]);
    assert!(
        text.starts_with("new  hello  completed  2026-01-03 00:00:00  2026-01-03 00:00:00"),
        "{text}"
    );
    let err = cli.fails(&["list", "--since", "yesterday"]);
    assert!(
        err.contains("--since") && err.contains("90m, 12h, 7d"),
        "{err}"
    );
    // Listed last but created long before: --since reads past it, and
    // the next page's command repeats the filters.
    cli.ok(&[
        "--now",
        "2020-01-01T00:00:00Z",
        "run",
        &ex("hello"),
        "--run-id",
        "ancient",
    ]);
    let out = cli.run(&[at[0], at[1], "list", "--since", "3d", "--limit", "1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("new "), "{text}");
    let hint = String::from_utf8_lossy(&out.stderr);
    assert!(
        hint.contains("stepwell list --since 3d --limit 1 --after new"),
        "{hint}"
    );
    let zero = cli.fails(&["list", "--limit", "0"]);
    assert!(zero.contains("--limit: must be at least 1"), "{zero}");
    let huge = cli.json(&["list", "--limit", "18446744073709551615"]);
    assert_eq!(huge.as_array().unwrap().len(), 3, "{huge}");
}

#[test]
fn ledger_lines_fit_the_terminal_unless_asked_whole() {
    let cli = Cli::new();
    cli.ok(&["run", &ex("ask-user"), "--run-id", "long"]);
    let cut = on_a_terminal_after(&cli, "stty cols 80; ", &["ledger", "long"]);
    let lines: Vec<&str> = cut.lines().collect();
    assert_eq!(lines.len(), 2, "{cut}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{cut}");
    assert!(lines[1].ends_with('…'), "{cut}");
    // The first record has no result: only padding, which is not cut.
    assert!(!lines[0].ends_with('…'), "{cut}");
    let whole = on_a_terminal_after(&cli, "stty cols 80; ", &["ledger", "long", "--full"]);
    assert!(
        whole.contains(r#""wait_key":"ask_user:long:1"}}"#),
        "{whole}"
    );
    // A pipe gets whole lines.
    let piped = cli.ok(&["ledger", "long"]);
    assert!(
        piped.contains(r#""wait_key":"ask_user:long:1"}}"#),
        "{piped}"
    );
}

#[test]
fn bench_on_a_terminal_prints_each_figure_once() {
    let cli = Cli::new();
    let flows = stepwell_tests::repo().join("flows");
    let args = [
        "bench",
        "--quick",
        "--only",
        "node_",
        "--flows",
        flows.to_str().unwrap(),
    ];
    let shown = on_a_terminal(&cli, &args);
    for name in ["node_dispatch_us_p50", "node_instantiate_us_p50"] {
        assert_eq!(shown.matches(name).count(), 1, "{shown}");
    }
}

/// `inspect` reads a component file without a store: the world and
/// contract of the `expenses` node and what its author declared; a
/// declaration that is not JSON is named; a file that is not WebAssembly
/// is an error on one line naming it. Nothing is created where it runs.
#[test]
fn inspect_shows_what_a_component_expects_without_a_store() {
    let cli = Cli::new();
    let triage = stepwell_tests::repo().join("flows/examples/expenses/triage.wasm");
    let info = cli.json(&["inspect", triage.to_str().unwrap()]);
    assert_eq!(info["encoding"], "component");
    assert_eq!(info["world"], "node");
    assert_eq!(
        (&info["contract"], &info["contract_matches"]),
        (&json!("0.2.0"), &json!(true))
    );
    assert_eq!(info["exports"], json!(["handle"]));
    assert!(info["imports"]
        .as_array()
        .unwrap()
        .contains(&json!("stepwell:flow/types@0.2.0")));
    assert_eq!(info["description"]["routes"], json!(["approved", "review"]));
    assert!(info["description"]["vars"]["amount"].is_string());
    let text = cli.ok(&["inspect", triage.to_str().unwrap()]);
    assert!(text.contains("  world     node (exports handle)"), "{text}");
    assert!(text.contains("    routes  approved, review"), "{text}");
    // A custom section appended to a component that declares nothing:
    // id 0, its size, the name's size and name, then what is not JSON.
    let mut bytes =
        std::fs::read(stepwell_tests::repo().join("flows/examples/hello/greet.wasm")).unwrap();
    let name = b"stepwell:node";
    let data = b"{not json";
    bytes.push(0);
    bytes.push((1 + name.len() + data.len()) as u8);
    bytes.push(name.len() as u8);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(data);
    let odd = cli.cwd.path().join("odd.wasm");
    std::fs::write(&odd, &bytes).unwrap();
    let info = cli.json(&["inspect", odd.to_str().unwrap()]);
    assert_eq!(info["world"], "node");
    assert!(
        info["description_error"]
            .as_str()
            .unwrap()
            .contains("is not JSON"),
        "{info}"
    );
    let flow = stepwell_tests::repo().join("flows/examples/expenses/flow.json");
    let err = cli.fails(&["inspect", flow.to_str().unwrap()]);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("flow.json: not WebAssembly"), "{err}");
    let names: Vec<_> = std::fs::read_dir(cli.cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["odd.wasm"],
        "inspect wrote into the working directory"
    );
}

/// A flow routing on a label its component does not declare loads, with a
/// warning naming the file, the node, the label and what is declared; a
/// flow that uses the declared routes loads without one.
#[test]
fn a_route_the_component_does_not_declare_is_warned_about() {
    let cli = Cli::new();
    stepwell_tests::misspelt_expenses(cli.cwd.path());
    let expenses = stepwell_tests::repo().join("flows/examples/expenses");
    let out = cli.run(&["run", "typo", "--vars", r#"{"amount": 5}"#]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: ")
            && err.contains("nodes.triage.routes.reveiw: ")
            && err.contains("declares the routes approved, review and not \"reveiw\""),
        "{err}"
    );
    let out = cli.run(&["deploy", expenses.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );
}

/// `inspect --declare` writes a component of any toolchain with a
/// description (here the Python contract node, which declares nothing):
/// the copy declares it and still runs; a component that declares already
/// (the Python `hello` node), and writing over the file read, are refused.
#[test]
fn a_component_of_any_language_can_be_given_a_declaration() {
    let cli = Cli::new();
    let dir = cli.cwd.path().join("py");
    std::fs::create_dir_all(&dir).unwrap();
    let example = stepwell_tests::repo().join("flows/examples/contract-py");
    std::fs::copy(example.join("flow.json"), dir.join("flow.json")).unwrap();
    let json = cli.cwd.path().join("greet.json");
    std::fs::write(
        &json,
        r#"{"description": "Does what vars.mode says.", "vars": {"mode": "what to do"}}"#,
    )
    .unwrap();
    let declare = |from: &Path, to: &Path| {
        let args = [
            "inspect",
            from.to_str().unwrap(),
            "--declare",
            json.to_str().unwrap(),
            "-o",
            to.to_str().unwrap(),
        ];
        cli.run(&args)
    };
    let err = |out: Output| {
        assert!(!out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let out = declare(&example.join("node.wasm"), &dir.join("node.wasm"));
    assert!(out.status.success(), "{out:?}");
    let info = cli.json(&["inspect", dir.join("node.wasm").to_str().unwrap()]);
    assert_eq!(
        info["description"]["description"],
        "Does what vars.mode says."
    );
    assert_eq!(info["world"], "node");
    let vars = r#"{"mode": "complete", "value": "Py"}"#;
    let ran = cli.json(&["run", "py", "--vars", vars]);
    assert_eq!(ran["output"]["echo"], "Py", "{ran}");
    let hello = stepwell_tests::repo().join("flows/examples/hello-py/greet.wasm");
    let declared = err(declare(&hello, &cli.cwd.path().join("hello.wasm")));
    assert!(
        declared.contains("has a stepwell:node section already"),
        "{declared}"
    );
    let again = dir.join("node.wasm");
    let twice = err(declare(&again, &cli.cwd.path().join("twice.wasm")));
    assert!(
        twice.contains("has a stepwell:node section already"),
        "{twice}"
    );
    let over = err(declare(&again, &again));
    assert!(over.contains("--output: is the file read"), "{over}");
}

/// The contract's behaviours, each asked of the contract node of one
/// language (`flows/examples/contract-<language>`: a node doing what
/// `vars.mode` says), and the typed outcome the host must give for each:
/// vars in and out, the next node, completion, effects, the node's own
/// refusals, a thrown error, a trap, a timeout, memory exhaustion and bad
/// output.
fn contract_suite(cli: &Cli, example: &str) {
    let run = |mode: &str| -> Value {
        let vars = json!({"mode": mode, "value": 7}).to_string();
        let out = cli.run(&[
            "--guest-time-ms",
            "1500",
            "--json",
            "run",
            &ex(example),
            "--vars",
            &vars,
        ]);
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{example} {mode}: {e}: {out:?}"))
    };
    let completed = run("complete");
    assert_eq!(completed["status"], "completed", "{completed}");
    let output = &completed["output"];
    assert_eq!(
        (&output["echo"], &output["node"], &output["attempt"]),
        (&json!(7), &json!("act"), &json!(1))
    );
    assert!(output["now"].as_str().unwrap().ends_with('Z'), "{output}");
    for (mode, seen) in [("next", json!(7)), ("follow", json!("followed"))] {
        let r = run(mode);
        assert_eq!(r["output"]["seen"], seen, "{example} {mode}: {r}");
    }
    for (mode, reason) in [("ask", "user"), ("wait", "until")] {
        let r = run(mode);
        assert_eq!(
            (&r["status"], &r["waiting"]["reason"]),
            (&json!("waiting"), &json!(reason)),
            "{example} {mode}: {r}"
        );
    }
    let asked = run("ask");
    let id = asked["run_id"].as_str().unwrap();
    let answered = cli.json(&["resume", id, "--payload", r#"{"text": "Ada"}"#]);
    assert_eq!(
        answered["output"]["answer"],
        json!({"text": "Ada"}),
        "{answered}"
    );
    for (mode, error) in [
        (
            "invalid",
            "node_invalid_input: mode invalid: asked to refuse",
        ),
        ("throw", "node_failed: "),
        ("trap", "guest_trap: "),
        ("spin", "guest_timeout: "),
        ("oom", "guest_memory_limit: "),
        ("bad", "guest_bad_output: "),
    ] {
        let r = run(mode);
        assert_eq!(r["status"], "failed", "{example} {mode}: {r}");
        let got = r["error"].as_str().unwrap();
        assert!(got.starts_with(error), "{example} {mode}: {got}");
    }
}

/// The JavaScript node meets the contract (scripts/build-js-guest builds it).
#[test]
fn a_javascript_node_meets_the_contract() {
    if !built(&["contract-js/node.wasm"]) {
        return;
    }
    contract_suite(&Cli::new(), "contract-js");
}

/// The C node meets the contract (scripts/build-c-guest builds it).
#[test]
fn a_c_node_meets_the_contract() {
    if !built(&["contract-c/node.wasm"]) {
        return;
    }
    contract_suite(&Cli::new(), "contract-c");
}

/// The Rust node meets the contract (scripts/build-guests builds it).
#[test]
fn a_rust_node_meets_the_contract() {
    contract_suite(&Cli::new(), "contract-rust");
}

/// The Python node meets the contract (scripts/build-python-guest builds
/// it).
#[test]
fn a_python_node_meets_the_contract() {
    if !built(&["contract-py/node.wasm"]) {
        return;
    }
    contract_suite(&Cli::new(), "contract-py");
}

/// What a build script runs on a node's declaration: `scripts/check-declared`
/// refuses a section the host could not read (an unknown key) and passes a
/// good one; the JavaScript and Python readers refuse a second `describe`
/// and a dict that is not a literal, naming the file.
#[test]
fn a_declaration_the_host_cannot_read_fails_the_build() {
    // node and the C components come with the JavaScript and C toolchains.
    if !built(&["hello-c/greet.wasm", "hello-js/greet.wasm"]) {
        return;
    }
    let repo = stepwell_tests::repo();
    let dir = tempfile::tempdir().unwrap();
    let tool = |program: &str, args: &[&Path]| {
        std::process::Command::new(program)
            .args(args)
            .current_dir(&repo)
            .output()
            .unwrap()
    };
    let check = repo.join("scripts/check-declared");
    let good = repo.join("flows/examples/hello-c/greet.wasm");
    let src = Path::new("node.c");
    let out = tool("python3", &[&check, src, &good]);
    assert!(out.status.success(), "{out:?}");
    let mut bytes = std::fs::read(repo.join("flows/examples/hello/greet.wasm")).unwrap();
    let (name, data) = (b"stepwell:node", br#"{"route": ["a"]}"#);
    bytes.extend([0, (1 + name.len() + data.len()) as u8, name.len() as u8]);
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(data);
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, &bytes).unwrap();
    let out = tool("python3", &[&check, src, &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("node.c: ") && err.contains("unknown key 'route'"),
        "{err}"
    );

    let sdk = repo.join("guest-sdk-js/stepwell.js");
    let js = dir.path().join("node.js");
    let twice = format!(
        "import {{ describe }} from '{}';\ndescribe({{}});\ndescribe({{}});\n",
        sdk.display()
    );
    std::fs::write(&js, twice).unwrap();
    let declare = repo.join("guest-sdk-js/declare.mjs");
    let out = tool("node", &[&declare, &js, &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("describe() is called once per node"),
        "{err}"
    );

    let py = dir.path().join("app.py");
    std::fs::write(&py, "from stepwell import describe\ndescribe(dict(a=1))\n").unwrap();
    let declare = repo.join("guest-sdk-py/declare.py");
    let out = tool("python3", &[&declare, &py, &bad]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        err.contains("app.py:2: describe() needs a literal dict"),
        "{err}"
    );
}

/// The chain's step, written in each language with its SDK, declares what
/// it expects in one line (`inspect` reads it back) and runs a chain of
/// three nodes to `{"steps": 3}`; the hello examples declare their var.
#[test]
fn every_language_declares_its_node_and_runs_the_chain_step() {
    let steps = [
        "chain/step-c.wasm",
        "chain/step-js.wasm",
        "chain/step-py.wasm",
    ];
    let hellos = [
        "hello-c/greet.wasm",
        "hello-js/greet.wasm",
        "hello-ts/greet.wasm",
        "hello-py/greet.wasm",
    ];
    if !built(&steps) || !built(&hellos) {
        return;
    }
    let cli = Cli::new();
    let chain = stepwell_tests::repo().join("flows/examples/chain");
    for step in ["step", "step-c", "step-js", "step-py"] {
        let component = chain.join(format!("{step}.wasm"));
        let info = cli.json(&["inspect", component.to_str().unwrap()]);
        let declared = &info["description"];
        assert_eq!(
            declared["description"], "One link of a chain: counts itself in vars.i.",
            "{step}: {info}"
        );
        assert!(declared["vars"]["i"].is_string(), "{step}: {info}");
        assert!(declared["config"]["last"].is_string(), "{step}: {info}");
        let dir = cli.cwd.path().join(step);
        std::fs::create_dir_all(&dir).unwrap();
        let node = |next: Value| {
            let mut n = json!({"component": component});
            match next {
                Value::Null => n["config"] = json!({"last": true}),
                next => n["next"] = next,
            }
            n
        };
        let flow = json!({
            "workflow_id": format!("chain-{step}"),
            "entry": "a",
            "nodes": {"a": node(json!("b")), "b": node(json!("c")), "c": node(Value::Null)},
        });
        std::fs::write(dir.join("flow.json"), flow.to_string()).unwrap();
        let run = cli.json(&["run", dir.to_str().unwrap()]);
        assert_eq!(run["output"], json!({"steps": 3}), "{step}: {run}");
    }
    for hello in [
        "hello-c/greet",
        "hello-js/greet",
        "hello-ts/greet",
        "hello-py/greet",
    ] {
        let component = stepwell_tests::repo().join(format!("flows/examples/{hello}.wasm"));
        let info = cli.json(&["inspect", component.to_str().unwrap()]);
        assert!(
            info["description"]["vars"]["name"].is_string(),
            "{hello}: {info}"
        );
    }
}

//! `tool_calls` with real WebAssembly tool components: the built-in
//! workspace tools and the hostile test tool (`flows/tools/testing`), in a
//! real workspace on disk. The llm-tools spec's checkable behaviours are
//! named by their number (#17, #21, ...).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use stepwell::tools::ToolsExt;

use serde_json::{json, Map, Value};
use stepwell::{ArtifactStore, RunState, RunStatus, Runtime, StartOptions, WaitReason};
use stepwell_tests::{repo, vars, write_bundle};

/// A runtime over SQLite with the hostile tools in its tool folder, and a
/// bundle `tools` whose node runs `tool_calls` with the payload in var
/// `batch`, writing its result to `out`.
fn runtime() -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime_at(dir.path(), &dir.path().join("db.sqlite"));
    (rt, dir)
}

/// [`runtime`] with its store at `db` and its tool folder and bundle in
/// `dir`; the store's files are protected from tools as the binary does.
fn runtime_at(dir: &Path, db: &Path) -> Runtime {
    runtime_with(dir, db, |t| t)
}

/// [`runtime`] with `config`.
fn runtime_configured(config: stepwell::RuntimeConfig) -> (Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let rt = runtime_with_config(dir.path(), &dir.path().join("db.sqlite"), config);
    (rt, dir)
}

/// [`runtime_at`] with `config` (its tool deny paths set as the binary's).
fn runtime_with_config(dir: &Path, db: &Path, config: stepwell::RuntimeConfig) -> Runtime {
    build_runtime(dir, db, config, |t| t)
}

/// [`runtime_at`] with the tools plugin set up further by `setup`.
fn runtime_with(
    dir: &Path,
    db: &Path,
    setup: impl FnOnce(stepwell::tools::Tools) -> stepwell::tools::Tools,
) -> Runtime {
    build_runtime(dir, db, stepwell::RuntimeConfig::default(), setup)
}

/// The runtime of [`runtime_with`], with `config`.
fn build_runtime(
    dir: &Path,
    db: &Path,
    config: stepwell::RuntimeConfig,
    setup: impl FnOnce(stepwell::tools::Tools) -> stepwell::tools::Tools,
) -> Runtime {
    let tools = dir.join("tool-dir");
    std::fs::create_dir_all(&tools).unwrap();
    let hostile = repo().join("flows/tools/testing/hostile.wasm");
    assert!(hostile.is_file(), "run scripts/build-guests first");
    std::fs::copy(&hostile, tools.join("hostile.wasm")).unwrap();
    let store = Arc::new(stepwell::SqliteStore::open(db).unwrap());
    let config = stepwell::RuntimeConfig {
        tool_deny_paths: stepwell::host::StoreSpec::Sqlite(db.to_path_buf())
            .protected_paths(None, None),
        ..config
    };
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .config(config)
        .plugin(std::sync::Arc::new(setup(
            stepwell::tools::Tools::new().dir(&tools),
        )))
        .build()
        .unwrap();
    let bundle = write_bundle(
        dir,
        "tools",
        &[
            (
                "flow.json",
                json!({"workflow_id": "tools", "entry": "act", "nodes": {
                    "act": {"effect": "tool_calls", "payload": {"$var": "batch"}, "result_key": "out", "next": "end"},
                    "end": {"complete": {"out": {"$var": "out"}}}}}),
            ),
            (
                "parent.flow.json",
                json!({"workflow_id": "tools.parent", "entry": "spawn", "nodes": {
                    "spawn": {"effect": "start_subworkflow",
                              "payload": {"workflow_id": "tools", "vars": {"$var": "childvars"}},
                              "result_key": "child", "next": "end"},
                    "end": {"complete": {"$var": "child"}}}}),
            ),
        ],
    );
    rt.load_bundle(&bundle).unwrap();
    rt
}

/// Starts a run of `tools` with `batch`, the run's vars `extra` and the
/// operator policy `runtime`.
fn start(rt: &Runtime, batch: Value, extra: Value, runtime: Value) -> RunState {
    let mut v = vars(extra);
    v.insert("batch".into(), batch);
    rt.run(
        "tools",
        StartOptions {
            vars: v,
            runtime: stepwell::core::config::operator_runtime(vars(runtime)).unwrap(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn ws_vars(ws: &Path) -> Value {
    json!({"workspace_root": ws.to_str().unwrap()})
}

fn call(name: &str, args: Value) -> Value {
    json!({"name": name, "arguments": args})
}

fn results(run: &RunState) -> Vec<Value> {
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    run.output.as_ref().unwrap()["out"]["results"]
        .as_array()
        .cloned()
        .unwrap()
}

fn workspace(dir: &tempfile::TempDir) -> PathBuf {
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "alpha\nbeta\n").unwrap();
    ws.canonicalize().unwrap()
}

#[test]
fn a_read_runs_at_once_in_the_workspace() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let run = start(
        &rt,
        json!({"tool_calls": [
            {"name": "read_file", "arguments": {"file_path": "a.txt"}, "call_id": "c1"},
            {"name": "list_files", "arguments": {}},
        ]}),
        ws_vars(&ws),
        json!({}),
    );
    let r = results(&run);
    assert_eq!(r[0]["success"], true, "{r:?}");
    assert_eq!(r[0]["call_id"], "c1");
    assert_eq!(r[0]["name"], "read_file");
    let out = r[0]["output"].as_str().unwrap();
    assert!(out.contains("alpha") && out.contains("beta"), "{out}");
    assert!(
        out.starts_with(&format!("File: {}", ws.join("a.txt").display())),
        "{out}"
    );
    let rt_id = r[1]["runtime_call_id"].as_str().unwrap();
    assert!(
        rt_id.starts_with("rtcall_") && rt_id.ends_with("_2"),
        "{rt_id}"
    );
    assert_eq!(r[1]["call_id"], r[1]["runtime_call_id"]);
    assert!(r[1]["output"].as_str().unwrap().contains("a.txt"), "{r:?}");
    // The scope the tools used is the one frozen at start.
    let state = rt.get_state(&run.run_id).unwrap();
    assert_eq!(
        state.vars["_runtime"]["workspace"]["workspace_root"],
        ws.to_str().unwrap()
    );
}

#[test]
fn a_write_waits_for_approval_and_runs_once_approved() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let batch = json!({"tool_calls": [call("write_file", json!({"file_path": "new.txt", "content": "hi\n"}))]});
    let run = start(&rt, batch.clone(), ws_vars(&ws), json!({}));
    // #21: write_file asks; nothing is written before the answer.
    assert_eq!(run.status, RunStatus::Waiting);
    let wait = run.waiting.clone().unwrap();
    assert_eq!(wait.reason, WaitReason::User);
    assert!(
        wait.wait_key
            .starts_with(&format!("tool_approval:{}:act:", run.run_id)),
        "{}",
        wait.wait_key
    );
    let details = wait.details.clone().unwrap();
    assert_eq!(details["mode"], "approval_required");
    assert_eq!(details["executor"]["kind"], "tool_approval");
    assert_eq!(details["tool_calls"][0]["name"], "write_file");
    // The path the person approves is the resolved one.
    assert_eq!(
        details["tool_calls"][0]["arguments"]["file_path"],
        ws.join("new.txt").to_str().unwrap()
    );
    assert!(!ws.join("new.txt").exists());
    // A resume that is not an approval is refused and changes nothing.
    let e = rt.respond(&run.run_id, json!({"text": "yes"})).unwrap_err();
    assert!(e.to_string().contains("payload.approved"), "{e}");
    assert_eq!(
        rt.get_state(&run.run_id).unwrap().status,
        RunStatus::Waiting
    );
    // #22: approved, it runs.
    let done = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    let r = results(&done);
    assert_eq!(r[0]["success"], true, "{r:?}");
    assert_eq!(r[0]["name"], "write_file");
    assert_eq!(std::fs::read_to_string(ws.join("new.txt")).unwrap(), "hi\n");
    // The approved batch is in the ledger once, under the effect's key.
    let ledger = rt.get_ledger(&run.run_id).unwrap();
    let approved: Vec<_> = ledger
        .iter()
        .filter(|r| {
            r.idempotency_key
                .as_deref()
                .is_some_and(|k| k.ends_with(":resumed"))
                && r.status == stepwell::StepStatus::Completed
        })
        .collect();
    assert_eq!(approved.len(), 1, "{ledger:#?}");
    stepwell_tests::assert_forkable(&rt, &run.run_id);

    // #22: denied, every call fails with the reason and nothing is written.
    let run = start(&rt, batch, ws_vars(&dir.path().join("ws2")), json!({}));
    let done = rt.respond(&run.run_id, json!({"approved": false})).unwrap();
    let r = results(&done);
    assert_eq!(r[0]["success"], false);
    assert_eq!(r[0]["error"], "Denied by user");
    assert!(!dir.path().join("ws2/new.txt").exists());
}

#[test]
fn approval_keys_differ_per_issuance_and_a_run_policy_decides() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let batch =
        json!({"tool_calls": [call("write_file", json!({"file_path": "x.txt", "content": "x"}))]});
    // #23: two runs, same batch and node: distinct keys (the run id is in
    // the digest and the key).
    let a = start(&rt, batch.clone(), ws_vars(&ws), json!({}));
    let b = start(&rt, batch.clone(), ws_vars(&ws), json!({}));
    assert_ne!(a.waiting.unwrap().wait_key, b.waiting.unwrap().wait_key);
    // #24: a run policy that auto-approves write_file runs it at once,
    // and one that requires read_file makes a read ask, with
    // policy_source "run".
    let run = start(
        &rt,
        batch,
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["write_file"]}}),
    );
    assert_eq!(results(&run)[0]["success"], true);
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))]}),
        ws_vars(&ws),
        json!({"tool_policy": {"require_approval_tools": ["read_file"]}}),
    );
    let details = run.waiting.unwrap().details.unwrap();
    assert_eq!(details["executor"]["policy_source"], "run");
}

#[test]
fn the_ceiling_blocks_by_position() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    // #17 (the run's and the node's lists intersected; ancestry is in the
    // unit tests): calls gamma, alpha, read_file under run
    // [alpha, read_file] and node [read_file, gamma].
    let run = start(
        &rt,
        json!({"tool_calls": [
                  {"name": "gamma", "arguments": {}, "call_id": "c0"},
                  {"name": "alpha", "arguments": {}, "call_id": "c1"},
                  {"name": "read_file", "arguments": {"file_path": "a.txt"}, "call_id": "c2"}],
               "allowed_tools": ["read_file", "gamma"]}),
        ws_vars(&ws),
        json!({"allowed_tools": ["alpha", "read_file"]}),
    );
    let r = results(&run);
    let got: Vec<(Value, Value, Value)> = r
        .iter()
        .map(|x| {
            (
                x["name"].clone(),
                x["success"].clone(),
                x["call_id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (json!("gamma"), json!(false), json!("c0")),
            (json!("alpha"), json!(false), json!("c1")),
            (json!("read_file"), json!(true), json!("c2")),
        ]
    );
    assert_eq!(
        r[0]["error"],
        "Tool 'gamma' is not allowed for this node or run"
    );
    // #18: [] denies everything; a non-list fails the effect.
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))]}),
        ws_vars(&ws),
        json!({"allowed_tools": []}),
    );
    assert_eq!(results(&run)[0]["success"], false);
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))], "allowed_tools": "alpha"}),
        ws_vars(&ws),
        json!({}),
    );
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run
        .error
        .as_deref()
        .unwrap()
        .contains("tool_scope: allowed_tools must be a list when explicitly set"));
    // An unknown tool, a non-object entry, and a missing tool_calls list.
    let run = start(
        &rt,
        json!({"tool_calls": [call("nope", json!({})), 7]}),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["nope"]}}),
    );
    let r = results(&run);
    assert_eq!(r[0]["error"], "Tool 'nope' not found");
    assert_eq!(r[1]["error"], "Invalid tool call (expected an object)");
    let run = start(&rt, json!({"calls": []}), ws_vars(&ws), json!({}));
    assert!(run
        .error
        .as_deref()
        .unwrap()
        .contains("tool_calls requires payload.tool_calls (list)"));
}

#[test]
fn read_only_workspaces_and_mounts() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    // #27: a read-only workspace refuses writes before any path check;
    // reads run; nothing is written.
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("write_file", json!({"file_path": "w.txt", "content": "no"})),
            call("read_file", json!({"file_path": "a.txt"})),
        ]}),
        json!({"workspace_root": ws.to_str().unwrap(), "workspace_read_only": true}),
        json!({}),
    );
    let r = results(&run);
    assert!(
        r[0]["error"].as_str().unwrap().contains("read-only"),
        "{r:?}"
    );
    assert_eq!(r[1]["success"], true);
    assert!(!ws.join("w.txt").exists());
    // #28: read-only without a root fails the effect; a missing
    // read-only root is never created.
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))]}),
        json!({"workspace_read_only": true}),
        json!({}),
    );
    assert!(run.error.as_deref().unwrap().contains(
        "workspace_policy: workspace_read_only is set but the run has no workspace_root"
    ));
    let missing = dir.path().join("missing");
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))]}),
        json!({"workspace_root": missing.to_str().unwrap(), "workspace_read_only": true}),
        json!({}),
    );
    assert!(run.error.as_deref().unwrap().contains("does not exist"));
    assert!(!missing.exists());
    // #29: a read-only mount (named through a symlink) refuses writes into
    // it, allows reads in it, and the own root stays writable.
    let mount = dir.path().join("automation-ws");
    std::fs::create_dir_all(&mount).unwrap();
    std::fs::write(mount.join("notes.txt"), "keep\n").unwrap();
    std::os::unix::fs::symlink(&mount, dir.path().join("mount-link")).unwrap();
    let own = dir.path().join("own");
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("write_file", json!({"file_path": mount.join("notes.txt").to_str().unwrap(), "content": "changed"})),
            call("read_file", json!({"file_path": mount.join("notes.txt").to_str().unwrap()})),
            call("write_file", json!({"file_path": "mine.txt", "content": "ok"})),
        ]}),
        json!({"workspace_root": own.to_str().unwrap(),
               "workspace_access_mode": "workspace_or_allowed",
               "workspace_allowed_paths": [mount.to_str().unwrap()]}),
        json!({"workspace_read_only_paths": [dir.path().join("mount-link").to_str().unwrap()],
               "tool_policy": {"auto_approve_tools": ["write_file", "read_file"]}}),
    );
    let r = results(&run);
    let e = r[0]["error"].as_str().unwrap();
    assert!(
        e.starts_with("Tool 'write_file' is refused") && e.contains("read-only mount"),
        "{e}"
    );
    assert_eq!(r[1]["success"], true, "{r:?}");
    assert_eq!(r[2]["success"], true, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(mount.join("notes.txt")).unwrap(),
        "keep\n"
    );
    assert_eq!(std::fs::read_to_string(own.join("mine.txt")).unwrap(), "ok");
}

#[test]
fn escapes_and_outside_paths_are_refused_by_the_scope() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("read_file", json!({"file_path": "../secret.txt"})),
            call("read_file", json!({"file_path": "/etc/passwd"})),
        ]}),
        ws_vars(&ws),
        json!({}),
    );
    let r = results(&run);
    assert_eq!(
        r[0]["error"],
        "Path escapes workspace_root: '../secret.txt'"
    );
    assert!(r[1]["error"]
        .as_str()
        .unwrap()
        .starts_with("Path escapes workspace_root: '/etc/passwd'"));
    // No workspace at all: file tools reach nothing.
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "/etc/passwd"}))]}),
        json!({}),
        json!({}),
    );
    assert!(results(&run)[0]["error"]
        .as_str()
        .unwrap()
        .contains("needs a workspace"));
}

/// The hostile tool, run at once (its calls are auto-approved by the run
/// policy): every attempt fails inside the sandbox, the run goes on, and
/// the file system is unchanged.
#[test]
fn a_hostile_tool_is_contained() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
    let mount = dir.path().join("mount");
    std::fs::create_dir_all(&mount).unwrap();
    std::fs::write(mount.join("keep.txt"), "keep").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let names = [
        "hostile_read_passwd",
        "hostile_write_outside",
        "hostile_write_mount",
        "hostile_socket",
        "hostile_env",
    ];
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("hostile_read_passwd", json!({})),
            call("hostile_write_outside", json!({"outside": outside.join("pwned.txt").to_str().unwrap(),
                                                 "workspace": ws.to_str().unwrap()})),
            call("hostile_write_mount", json!({"mount_file": mount.join("keep.txt").to_str().unwrap()})),
            call("hostile_socket", json!({"port": port})),
            call("hostile_env", json!({})),
        ]}),
        json!({"workspace_root": ws.to_str().unwrap(),
               "workspace_access_mode": "workspace_or_allowed",
               "workspace_allowed_paths": [mount.to_str().unwrap()]}),
        json!({"workspace_read_only_paths": [mount.to_str().unwrap()],
               "tool_policy": {"auto_approve_tools": names}}),
    );
    let r = results(&run);
    for (i, name) in names.iter().take(4).enumerate() {
        assert_eq!(r[i]["name"], *name);
        assert_eq!(r[i]["success"], false, "{name} got through: {}", r[i]);
    }
    assert!(
        r[0]["error"].as_str().unwrap().starts_with("blocked"),
        "{}",
        r[0]
    );
    // Every attempt failed (not just one of them): the ../ and symlink
    // escapes and every change to the mount are refused by the preopens.
    for x in &r[1..3] {
        let attempts = x["output"]["attempts"].as_array().unwrap();
        assert!(attempts.len() >= 3, "{x}");
        for a in attempts {
            assert_eq!(a["ok"], false, "{a}");
        }
    }
    // Sockets are not linked: the call traps inside the sandbox.
    assert!(
        r[3]["error"]
            .as_str()
            .unwrap()
            .contains("is not available to stepwell guests"),
        "{}",
        r[3]
    );
    let env = &r[4]["output"];
    assert_eq!(env["env_count"], 0, "{env}");
    assert_eq!(env["clock_unix_secs"], 0, "{env}");
    assert_eq!(env["fs_root"]["ok"], false, "{env}");
    assert!(
        listener.accept().is_err(),
        "the tool reached the host's socket"
    );
    assert!(!outside.join("pwned.txt").exists());
    assert!(!outside.join("escaped.txt").exists());
    assert!(!dir.path().join("escaped.txt").exists());
    assert_eq!(
        std::fs::read_to_string(mount.join("keep.txt")).unwrap(),
        "keep"
    );
    assert!(!mount.join("hostile-created.txt").exists());
    assert!(!mount.join("hostile-renamed.txt").exists());
}

#[test]
fn a_spinning_or_hungry_tool_is_stopped_and_the_run_goes_on() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let started = std::time::Instant::now();
    // #30: a timeout fails only that call, keeping its call id.
    let policy = |timeout: f64| {
        json!({"tool_timeout_s": timeout,
               "tool_policy": {"auto_approve_tools": ["hostile_spin", "hostile_alloc", "read_file"]}})
    };
    let run = start(
        &rt,
        json!({"tool_calls": [
            {"name": "hostile_spin", "arguments": {}, "call_id": "spin-1"},
            {"name": "read_file", "arguments": {"file_path": "a.txt"}, "call_id": "r"},
        ]}),
        ws_vars(&ws),
        policy(0.5),
    );
    let r = results(&run);
    assert_eq!(r[0]["success"], false);
    assert_eq!(r[0]["output"], Value::Null);
    assert_eq!(r[0]["call_id"], "spin-1");
    assert_eq!(r[0]["error"], "Tool execution timed out after 0.5s");
    assert_eq!(r[1]["success"], true);
    // The memory limit stops a hungry tool (with time to reach it however
    // busy the machine), and the next call runs.
    let run = start(
        &rt,
        json!({"tool_calls": [
            {"name": "hostile_alloc", "arguments": {}, "call_id": "alloc-1"},
            {"name": "read_file", "arguments": {"file_path": "a.txt"}, "call_id": "r"},
        ]}),
        ws_vars(&ws),
        policy(30.0),
    );
    let r = results(&run);
    assert_eq!(r[0]["success"], false);
    assert_eq!(r[0]["call_id"], "alloc-1");
    assert!(
        r[0]["error"].as_str().unwrap().contains("memory"),
        "{}",
        r[0]
    );
    assert_eq!(r[1]["success"], true);
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

#[test]
fn reads_run_together_and_keep_their_order() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    for i in 0..6 {
        std::fs::write(ws.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let calls: Vec<Value> = (0..6)
        .map(|i| call("read_file", json!({"file_path": format!("f{i}.txt")})))
        .collect();
    let run = start(&rt, json!({"tool_calls": calls}), ws_vars(&ws), json!({}));
    let r = results(&run);
    for (i, x) in r.iter().enumerate() {
        assert!(
            x["output"].as_str().unwrap().contains(&format!("file {i}")),
            "{x}"
        );
    }
}

#[test]
fn passthrough_hands_the_calls_out_and_merges_them_back() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    // #19: the blocked call stays in place; the caller runs the rest.
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"})),
                              call("blocked_tool", json!({}))],
               "allowed_tools": ["read_file"]}),
        ws_vars(&ws),
        json!({"tool_executor": "passthrough"}),
    );
    let wait = run.waiting.unwrap();
    assert_eq!(wait.reason, WaitReason::Event);
    let d = wait.details.unwrap();
    assert_eq!(d["tool_calls"].as_array().unwrap().len(), 1);
    assert_eq!(d["original_call_count"], 2);
    assert_eq!(d["blocked_by_index"]["1"]["name"], "blocked_tool");
    let done = rt
        .respond(
            &run.run_id,
            json!({"mode": "executed", "results": [{"name": "read_file", "success": true, "output": "x"}]}),
        )
        .unwrap();
    let r = results(&done);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["output"], "x");
    assert!(r[1]["error"].as_str().unwrap().contains("not allowed"));
}

#[test]
fn the_tool_table_lists_builtins_and_the_folder() {
    let (rt, _dir) = runtime();
    let table = rt.tools().unwrap();
    let names: Vec<&str> = table.entries().iter().map(|e| e.name.as_str()).collect();
    for n in [
        "list_files",
        "search_files",
        "read_file",
        "write_file",
        "edit_file",
        "hostile_spin",
    ] {
        assert!(names.contains(&n), "{names:?}");
    }
    let classes: Map<String, Value> = table
        .specs()
        .iter()
        .map(|s| (s.name.clone(), json!(s.class.as_str())))
        .collect();
    assert_eq!(classes["read_file"], "read");
    assert_eq!(classes["write_file"], "write");
}

/// A runtime over SQLite whose default model is the loopback `mock`, with
/// the agent flow (`flows/agent`) loaded, and a workspace.
fn agent_runtime(
    mock: &stepwell_tests::llm_mock::LlmMock,
) -> (Runtime, tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let providers = stepwell::llm::Providers::only(stepwell::llm::Provider {
        timeout_s: Some(5.0),
        ..stepwell::llm::Provider::new("mock", &mock.base_url, Some("mock-model"))
    });
    let store = Arc::new(stepwell::SqliteStore::open(dir.path().join("db.sqlite")).unwrap());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .effect(Arc::new(stepwell::llm::LlmCall::new(providers)))
        .build()
        .unwrap();
    let agent = repo().join("flows/agent");
    assert!(
        agent.join("nodes.wasm").is_file(),
        "run scripts/build-guests"
    );
    rt.load_bundle(&agent).unwrap();
    (rt, dir, ws)
}

/// The agent flow (`flows/agent`) against the loopback model server: the
/// model asks for `read_file`, gets the file's lines back as a tool
/// message, then for `write_file`, which waits for approval; approved, the
/// model answers and the run completes.
#[test]
fn the_agent_reads_writes_after_approval_and_answers() {
    use stepwell_tests::llm_mock::{LlmMock, Reply};
    let tool_call = Reply::tool_call;
    let mock = LlmMock::start(vec![
        tool_call("call_1", "read_file", json!({"file_path": "a.txt"})),
        tool_call(
            "call_2",
            "write_file",
            json!({"file_path": "summary.txt", "content": "alpha, beta\n"}),
        ),
        Reply::text("The file lists alpha and beta; I wrote summary.txt."),
    ]);
    let (rt, _dir, ws) = agent_runtime(&mock);
    let run = rt
        .run(
            "agent",
            StartOptions {
                vars: vars(json!({"prompt": "Summarise a.txt into summary.txt",
                                  "workspace_root": ws.to_str().unwrap()})),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(run.status, RunStatus::Waiting, "{run:?}");
    let wait = run.waiting.clone().unwrap();
    assert_eq!(wait.details.unwrap()["tool_calls"][0]["name"], "write_file");
    assert!(!ws.join("summary.txt").exists());
    let done = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    assert_eq!(done.status, RunStatus::Completed, "{done:?}");
    let out = done.output.unwrap();
    assert_eq!(
        out["answer"],
        "The file lists alpha and beta; I wrote summary.txt."
    );
    assert_eq!(out["iterations"], 3);
    assert_eq!(out["used_tools"], json!(["read_file", "write_file"]));
    assert_eq!(
        std::fs::read_to_string(ws.join("summary.txt")).unwrap(),
        "alpha, beta\n"
    );
    // What the model saw: the tools offered, then its call and the tool's
    // answer as native messages.
    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    let offered: Vec<&str> = seen[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        offered.contains(&"read_file") && offered.contains(&"write_file"),
        "{offered:?}"
    );
    let second = seen[1].body["messages"].as_array().unwrap();
    let tool_msg = second.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool_msg["tool_call_id"], "call_1");
    assert!(
        tool_msg["content"].as_str().unwrap().contains("alpha"),
        "{tool_msg}"
    );
    let asked = second.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(asked["tool_calls"][0]["id"], "call_1");
    stepwell_tests::assert_forkable(&rt, &run.run_id);
}

/// The library reads no environment: `STEPWELL_ENABLE_EXEC=1` and
/// `STEPWELL_TOOL_DIR` in an embedding application's environment change
/// nothing (only the `stepwell` binary maps them onto the builder).
#[test]
fn the_environment_does_not_turn_exec_on_in_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tool-dir");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        repo().join("flows/tools/testing/hostile.wasm"),
        tools.join("hostile.wasm"),
    )
    .unwrap();
    // Nothing else in this process reads these (the library never does).
    std::env::set_var("STEPWELL_ENABLE_EXEC", "1");
    std::env::set_var("STEPWELL_TOOL_DIR", &tools);
    let rt = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
        .engine(stepwell_tests::engine())
        .build()
        .unwrap();
    let table = rt.tools().unwrap();
    assert!(table.get("execute_command").is_none());
    assert!(table.get("hostile_env").is_none());
    assert!(table.get("read_file").is_some());
}

/// `execute_command` is off by default, always asks (even when a run
/// policy auto-approves it), runs in the workspace root with the
/// environment the application gave and nothing of the host process's,
/// and is refused in a read-only workspace.
#[test]
fn execute_command_is_opt_in_always_asked_and_refused_read_only() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let batch = json!({"tool_calls": [call("execute_command",
        json!({"command": "echo made > made.txt; echo \"done $MARK ${HOME:-none}\""}))]});
    let off = start(&rt, batch.clone(), ws_vars(&ws), json!({}));
    assert_eq!(
        results(&off)[0]["error"],
        "Tool 'execute_command' not found"
    );

    let store = Arc::new(stepwell::SqliteStore::open(dir.path().join("exec.sqlite")).unwrap());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .artifacts(Arc::new(stepwell::MemoryArtifactStore::new()), 1 << 20)
        .plugin(std::sync::Arc::new(
            stepwell::tools::Tools::new()
                .enable_exec(true)
                .exec_env(stepwell::tools::exec::ExecEnv::default().var("MARK", "given")),
        ))
        .build()
        .unwrap();
    assert!(
        std::env::var_os("HOME").is_some(),
        "the test process has a HOME"
    );
    rt.load_bundle(&dir.path().join("tools")).unwrap();
    let run = start(
        &rt,
        batch.clone(),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["execute_command"]}}),
    );
    assert_eq!(run.status, RunStatus::Waiting, "{run:?}");
    assert!(!ws.join("made.txt").exists());
    let done = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    let r = results(&done);
    assert_eq!(r[0]["success"], true, "{r:?}");
    assert_eq!(r[0]["output"]["stdout"], "done given none\n");
    assert_eq!(r[0]["output"]["working_directory"], ws.to_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(ws.join("made.txt")).unwrap(),
        "made\n"
    );
    evidence_of_the_command(&rt, &done);

    let run = start(
        &rt,
        batch,
        json!({"workspace_root": ws.to_str().unwrap(), "workspace_read_only": true}),
        json!({}),
    );
    let r = results(&run);
    assert!(
        r[0]["error"]
            .as_str()
            .unwrap()
            .contains("cannot run commands or code"),
        "{r:?}"
    );
}

/// The command's evidence: its record (command, exit status, timing, the
/// approval), its output as an artifact, named by the call's result; and
/// the same after the run is exported and imported elsewhere.
fn evidence_of_the_command(rt: &Runtime, done: &RunState) {
    let found = stepwell::tools::evidence::list(rt, &done.run_id).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(
        results(done)[0]["meta"]["evidence_id"],
        e.evidence_id.as_str()
    );
    let r = e.record.as_ref().unwrap();
    assert_eq!(r["kind"], "evidence");
    assert_eq!(
        (&r["tool_name"], &r["class"]),
        (&json!("execute_command"), &json!("exec"))
    );
    assert_eq!(r["return_code"], 0);
    assert_eq!(r["success"], true);
    assert!(r["duration_s"].as_f64().is_some(), "{r}");
    assert!(r["command"].as_str().unwrap().contains("echo made"), "{r}");
    assert_eq!(r["arguments"]["command"], r["command"], "{r}");
    assert_eq!(r["approval"]["answer"], json!({"approved": true}), "{r}");
    assert!(
        r["approval"]["wait_key"]
            .as_str()
            .unwrap()
            .starts_with("tool_approval:"),
        "{r}"
    );
    let stdout = stepwell_tests::artifact_text(rt, &r["artifacts"]["stdout"]);
    assert_eq!(stdout, "done given none\n");
    // Results handed in by whoever resumes name no evidence: another run
    // cannot show this record as its own.
    let batch = json!({"tool_calls": [call("execute_command", json!({"command": "true"}))]});
    let other = start(
        rt,
        batch,
        json!({"workspace_root": r["working_directory"]}),
        json!({}),
    );
    let forged = json!({"mode": "executed", "results": [{"name": "execute_command", "call_id": "c1",
        "success": true, "output": {"command": "never ran"},
        "meta": {"evidence_id": e.evidence_id, "evidence": {"$artifact": e.evidence_id}}}]});
    let other = rt.respond(&other.run_id, forged).unwrap();
    assert!(
        results(&other)[0]["meta"].get("evidence_id").is_none(),
        "{other:?}"
    );
    assert!(stepwell::tools::evidence::list(rt, &other.run_id)
        .unwrap()
        .is_empty());
    // Exported with the run, and listed the same where it is imported.
    let archive = rt.export_run(&done.run_id, false).unwrap();
    let there = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
        .engine(stepwell_tests::engine())
        .artifacts(Arc::new(stepwell::MemoryArtifactStore::new()), 1 << 20)
        .plugin(Arc::new(stepwell::tools::Tools::new().enable_exec(true)))
        .build()
        .unwrap();
    there.import_runs(&archive).unwrap();
    let moved = stepwell::tools::evidence::list(&there, &done.run_id).unwrap();
    assert_eq!(moved[0].record, e.record);
    let r = moved[0].record.as_ref().unwrap();
    assert_eq!(
        stepwell_tests::artifact_text(&there, &r["artifacts"]["stdout"]),
        "done given none\n"
    );
}

/// #34: an operator's iteration ceiling is enforced at start, and limits
/// are seeded key by key.
#[test]
fn the_iteration_ceiling_refuses_at_start() {
    let (rt, _dir) = runtime();
    let start_with = |limits: Value| {
        rt.start(
            "tools",
            StartOptions {
                vars: vars(json!({"_limits": limits, "batch": {"tool_calls": []}})),
                ..Default::default()
            },
        )
    };
    let e = start_with(json!({"max_iterations": 200, "max_iterations_ceiling": 100})).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("max_iterations=200")
            && text.contains("ceiling 100")
            && text.contains("refusing at start"),
        "{text}"
    );
    assert!(start_with(json!({"max_iterations": "50", "max_iterations_ceiling": 10.0})).is_err());
    let id = start_with(json!({"max_iterations_ceiling": 10})).unwrap();
    let limits = rt.get_state(&id).unwrap().vars["_limits"].clone();
    assert_eq!(limits["max_iterations"], 10);
    assert_eq!(
        limits["max_tokens"], 32768,
        "other defaults are seeded: {limits}"
    );
    let id = start_with(json!({"max_iterations_ceiling": 100})).unwrap();
    assert_eq!(
        rt.get_state(&id).unwrap().vars["_limits"]["max_iterations"],
        20
    );
    let id = start_with(json!({"max_iterations": 0, "max_iterations_ceiling": 100})).unwrap();
    assert_eq!(
        rt.get_state(&id).unwrap().vars["_limits"]["max_iterations"],
        0
    );
}

/// A tool folder with a component of another world and a file that is not
/// WebAssembly: both are listed unavailable with why, and every other tool
/// still works.
#[test]
fn broken_tool_components_are_listed_and_isolated() {
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tool-dir");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        repo().join("flows/triggers/builtin/manual.wasm"),
        tools.join("a-trigger.wasm"),
    )
    .unwrap();
    std::fs::write(tools.join("b-junk.wasm"), b"not wasm").unwrap();
    std::fs::copy(
        repo().join("flows/tools/testing/hostile.wasm"),
        tools.join("c-hostile.wasm"),
    )
    .unwrap();
    let table =
        stepwell::tools::ToolTable::load(&stepwell_tests::engine(), Some(&tools), false).unwrap();
    let find = |n: &str| table.entries().iter().find(|e| e.name == n).unwrap();
    let trigger = find("a-trigger.wasm");
    assert!(!trigger.available);
    assert!(
        trigger
            .reason
            .as_deref()
            .unwrap()
            .contains("stepwell:flow/tool world"),
        "{trigger:?}"
    );
    let junk = find("b-junk.wasm");
    assert!(!junk.available);
    assert!(find("hostile_spin").available);
    assert!(table.get("read_file").is_some());
}

/// A child run inherits its parent's scope and can only narrow it: a guest
/// that starts a child with a wider root fails that step, and a child in a
/// narrower root reaches only that.
#[test]
fn a_child_run_can_only_narrow_the_scope() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    std::fs::write(dir.path().join("outside.txt"), "secret").unwrap();
    let read = |path: &str| json!({"tool_calls": [call("read_file", json!({"file_path": path}))]});
    let spawn = |childvars: Value| {
        rt.run(
            "tools.parent",
            StartOptions {
                vars: vars(json!({"workspace_root": ws.to_str().unwrap(), "childvars": childvars})),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let outside = dir.path().join("outside.txt");
    let wide = spawn(json!({"workspace_root": "/", "batch": read(outside.to_str().unwrap())}));
    assert_eq!(wide.status, RunStatus::Failed, "{wide:?}");
    let e = wide.error.unwrap();
    assert!(
        e.contains("vars.workspace_root") && e.contains("only narrow"),
        "{e}"
    );
    let wider_mode = spawn(json!({"workspace_access_mode": "all_except_ignored",
                                  "batch": read(outside.to_str().unwrap())}));
    assert_eq!(wider_mode.status, RunStatus::Failed);
    // Inherited as it is: the child reads in the parent's root, not outside.
    let same = spawn(json!({"batch": {"tool_calls": [
        call("read_file", json!({"file_path": "a.txt"})),
        call("read_file", json!({"file_path": outside.to_str().unwrap()}))]}}));
    assert_eq!(same.status, RunStatus::Completed, "{same:?}");
    let r = same.output.unwrap()["output"]["out"]["results"].clone();
    assert_eq!(r[0]["success"], true, "{r}");
    assert!(r[1]["error"]
        .as_str()
        .unwrap()
        .starts_with("Path escapes workspace_root"));
}

/// Recursive listings and searches never show what the scope excludes
/// inside the root (ignored paths, host deny prefixes); a write through a
/// symlink whose target does not exist yet is checked at its target.
#[test]
fn exclusions_hold_in_walks_and_through_dangling_links() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    for sub in ["ign", "deny", "ro"] {
        std::fs::create_dir_all(ws.join(sub)).unwrap();
        std::fs::write(ws.join(sub).join("key.txt"), "password=hunter2").unwrap();
    }
    std::os::unix::fs::symlink(ws.join("ro/new.txt"), ws.join("link")).unwrap();
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("search_files", json!({"pattern": "password"})),
            call("list_files", json!({"recursive": true, "head_limit": 100})),
            call("write_file", json!({"file_path": "link", "content": "planted"})),
        ]}),
        json!({"workspace_root": ws.to_str().unwrap(),
               "workspace_ignored_paths": ["ign"],
               "workspace_builtin_deny_prefixes": [ws.join("deny").to_str().unwrap()],
               "workspace_read_only_paths": [ws.join("ro").to_str().unwrap()]}),
        json!({"tool_policy": {"auto_approve_tools": ["search_files", "list_files", "write_file"]}}),
    );
    let r = results(&run);
    let found = r[0]["output"].as_str().unwrap_or_default().to_string()
        + r[0]["error"].as_str().unwrap_or_default();
    assert!(
        !found.contains("ign/") && !found.contains("deny/"),
        "{found}"
    );
    assert!(found.contains("ro/key.txt"), "{found}");
    let listed = r[1]["output"].as_str().unwrap();
    assert!(
        !listed.contains("ign") && !listed.contains("deny"),
        "{listed}"
    );
    let e = r[2]["error"].as_str().unwrap();
    assert!(e.contains("read-only mount"), "{e}");
    assert!(!ws.join("ro/new.txt").exists());
}

/// `all_except_ignored` reaches every file but the host's own: the plain
/// files beside the store are read (once they "did not exist": their folder
/// was split around the store), while the store itself is refused to the
/// built-ins by the host's checks and to a hostile tool by the sandbox,
/// whatever it tries (a link to it, a hard link, a rename of its folder).
#[test]
fn beside_the_store_everything_is_reachable_but_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let proj = base.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    let db = proj.join("store.sqlite");
    let rt = runtime_at(&base, &db);
    let notes = proj.join("notes.txt");
    std::fs::write(&notes, "beside the store\n").unwrap();
    let ws = base.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::os::unix::fs::symlink(&db, ws.join("link")).unwrap();
    let text = |p: &Path| p.to_str().unwrap().to_string();
    let names = ["read_file", "list_files", "hostile_store"];
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("read_file", json!({"file_path": text(&notes)})),
            call("read_file", json!({"file_path": text(&db)})),
            call("list_files", json!({"directory_path": text(&proj)})),
            call("hostile_store", json!({"store": text(&db), "link": text(&ws.join("link")),
                                         "beside": text(&notes)})),
        ]}),
        json!({"workspace_root": text(&ws), "workspace_access_mode": "all_except_ignored"}),
        json!({"tool_policy": {"auto_approve_tools": names}}),
    );
    let r = results(&run);
    assert_eq!(r[0]["success"], true, "{}", r[0]);
    assert!(
        r[0]["output"]
            .as_str()
            .unwrap()
            .contains("beside the store"),
        "{}",
        r[0]
    );
    let e = r[1]["error"].as_str().unwrap_or_default();
    assert!(
        e.starts_with("Path is not accessible (protected by the host)"),
        "{}",
        r[1]
    );
    let listed = r[2]["output"].as_str().unwrap();
    assert!(
        listed.contains("notes.txt") && !listed.contains("store.sqlite"),
        "{listed}"
    );
    let attempts = r[3]["output"]["attempts"]
        .as_array()
        .expect("an attempts report");
    assert_eq!(attempts.len(), 9, "{}", r[3]);
    for a in attempts {
        let through = a["ok"] == true;
        assert_eq!(through, a["op"] == "read-beside", "{a}");
        if !through {
            assert!(
                a["error"].as_str().unwrap().contains("ermission denied"),
                "{a}"
            );
        }
    }
    for gone in ["stolen", "renamed"] {
        assert!(!proj.join(gone).exists(), "{gone} was made");
    }
    assert!(!base.join("proj.moved").exists());
    assert!(std::fs::metadata(&db).unwrap().len() > 0);
    // The store is whole: the run that ran the calls reads back.
    assert_eq!(
        rt.get_state(&run.run_id).unwrap().status,
        RunStatus::Completed
    );
}

/// #33: with an artifact store, an `execute_command` stdout over the inline
/// limit goes to an attachment of the run (its field emptied, its id and a
/// hint in `rendered`), a small one stays; a read over the limit becomes a
/// handle `open_attachment` reads back in bounded excerpts; over the
/// retention cap nothing is stored and the output says so.
#[test]
fn large_outputs_become_attachments_read_back_in_excerpts() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let big: String = (1..=400).map(|i| format!("line {i}\n")).collect();
    std::fs::write(ws.join("big.txt"), &big).unwrap();
    let store = Arc::new(stepwell::SqliteStore::open(dir.path().join("db.sqlite")).unwrap());
    let artifacts = Arc::new(stepwell::MemoryArtifactStore::new());
    let rt = stepwell::builder(store)
        .engine(stepwell_tests::engine())
        .artifacts(artifacts.clone(), 1 << 20)
        .plugin(std::sync::Arc::new(
            stepwell::tools::Tools::new().enable_exec(true),
        ))
        .build()
        .unwrap();
    let (_, bundle_dir) = runtime();
    rt.load_bundle(&bundle_dir.path().join("tools")).unwrap();
    let policy = json!({"max_inline_bytes": 1024,
                        "tool_policy": {"auto_approve_tools": ["execute_command", "read_file", "open_attachment"]}});
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("execute_command", json!({"command": "yes X | tr -d '[:space:]' | head -c 5000"})),
            call("execute_command", json!({"command": "echo hi"})),
            call("read_file", json!({"file_path": "big.txt"})),
        ]}),
        ws_vars(&ws),
        policy.clone(),
    );
    assert_eq!(
        run.status,
        RunStatus::Waiting,
        "execute_command always asks"
    );
    let done = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    let r = results(&done);
    let out = &r[0]["output"];
    assert_eq!(out["stdout"], "", "{out}");
    let id = out["stdout_offloaded_artifact_id"].as_str().unwrap();
    let stored: Value = serde_json::from_slice(&artifacts.get(id).unwrap().unwrap()).unwrap();
    assert_eq!(stored["run_id"], json!(done.run_id));
    assert!(
        stored["text"] == "X".repeat(5000),
        "stored {}",
        stored["text"]
    );
    let rendered = out["rendered"].as_str().unwrap();
    assert!(
        rendered.contains("open_attachment") && rendered.contains(id),
        "{rendered}"
    );
    assert_eq!(r[1]["output"]["stdout"], "hi\n");
    let handle = r[2]["output_offloaded_artifact_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        r[2]["output"].as_str().unwrap().starts_with("(Output was "),
        "{}",
        r[2]
    );

    let read = start(
        &rt,
        json!({"tool_calls": [call("open_attachment", json!({"artifact_id": handle, "start_line": 3, "end_line": 5}))]}),
        ws_vars(&ws),
        policy.clone(),
    );
    // The attachment belongs to the first run: another run cannot read it.
    assert!(results(&read)[0]["error"]
        .as_str()
        .unwrap()
        .contains("not found for this run"));
    // Over the retention cap: nothing stored, a notice instead.
    let capped = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "big.txt"}))], "max_attachment_bytes": 2000}),
        ws_vars(&ws),
        policy,
    );
    let r = results(&capped);
    assert!(
        r[0]["output"]
            .as_str()
            .unwrap()
            .contains("exceeding the 2000-byte retention limit"),
        "{}",
        r[0]
    );
    assert!(r[0].get("output_offloaded_artifact_id").is_none());
}

/// #20: a delegated executor hands the calls to a worker (wait reason
/// `job`, its key and details).
#[test]
fn a_delegated_executor_waits_for_the_worker() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let run = start(
        &rt,
        json!({"tool_calls": [call("read_file", json!({"file_path": "a.txt"}))]}),
        ws_vars(&ws),
        json!({"tool_executor": {"mode": "delegated", "wait_key": "job_123", "wait_reason": "job",
                                 "details": {"worker": "w1"}}}),
    );
    let wait = run.waiting.unwrap();
    assert_eq!(wait.reason, WaitReason::Job);
    assert_eq!(wait.wait_key, "job_123");
    let d = wait.details.unwrap();
    assert_eq!(d["mode"], "delegated");
    assert_eq!(d["executor"]["worker"], "w1");
}

/// #4 and #23 through the agent: the model asks for the same append three
/// times at node `act`; each issuance waits on its own approval key
/// (`tool_approval:<run>:act:<digest>`), each approved batch runs (the
/// file gets three lines), and the run completes.
#[test]
fn the_same_batch_at_one_node_runs_each_time_under_its_own_key() {
    use stepwell_tests::llm_mock::{completion, LlmMock, Reply};
    let append = || {
        Reply::Json(completion(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "same", "type": "function",
                "function": {"name": "write_file",
                             "arguments": json!({"file_path": "log.txt", "content": "x\n", "mode": "a"}).to_string()}}]}),
            "tool_calls",
        ))
    };
    let mock = LlmMock::start(vec![append(), append(), append(), Reply::text("done")]);
    let (rt, _dir, ws) = agent_runtime(&mock);
    let mut state = rt
        .run(
            "agent",
            StartOptions {
                vars: vars(json!({"prompt": "append x three times",
                                  "workspace_root": ws.to_str().unwrap()})),
                ..Default::default()
            },
        )
        .unwrap();
    let mut keys = Vec::new();
    while state.status == RunStatus::Waiting {
        let key = state.waiting.clone().unwrap().wait_key;
        assert!(
            key.starts_with(&format!("tool_approval:{}:act:", state.run_id)),
            "{key}"
        );
        keys.push(key.clone());
        state = rt
            .resume(&state.run_id, &key, json!({"approved": true}))
            .unwrap();
    }
    assert_eq!(state.status, RunStatus::Completed, "{state:?}");
    assert_eq!(keys.len(), 3);
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 3, "each issuance has its own key");
    assert_eq!(
        std::fs::read_to_string(ws.join("log.txt")).unwrap(),
        "x\nx\nx\n"
    );
}

/// A run cancelled while its batch runs: the calls not started yet never
/// start (a write after a slow call does not happen), and the run stays
/// cancelled.
#[test]
fn a_cancel_stops_the_rest_of_a_batch() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let rt2 = rt.clone();
    let ws2 = ws.clone();
    let worker = std::thread::spawn(move || {
        rt2.run(
            "tools",
            StartOptions {
                vars: vars(json!({"workspace_root": ws2.to_str().unwrap(),
                    "batch": {"tool_calls": [
                        call("hostile_spin", json!({})),
                        call("write_file", json!({"file_path": "after.txt", "content": "late"}))]}})),
                runtime: stepwell::core::config::operator_runtime(vars(json!({
                    "tool_timeout_s": 1.5,
                    "tool_policy": {"auto_approve_tools": ["hostile_spin", "write_file"]}})))
                .unwrap(),
                ..Default::default()
            },
        )
    });
    // Wait for the run to exist (committed before its external effect).
    let mut id = None;
    for _ in 0..200 {
        if let Some(r) = rt
            .list_runs(&stepwell::RunQuery::default())
            .unwrap()
            .first()
        {
            id = Some(r.run_id.clone());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let id = id.expect("the run was created");
    rt.cancel_run(&id, Some("stop")).unwrap();
    let _ = worker.join().unwrap();
    assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Cancelled);
    assert!(
        !ws.join("after.txt").exists(),
        "a call started after the cancel"
    );
}

/// A symbolic link planted on the workspace root after the run started (it
/// waits for an approval meanwhile) does not move the scope: the approved
/// batch is refused, and nothing is written where the link points.
#[test]
fn a_link_planted_on_the_root_after_start_is_refused() {
    let (rt, dir) = runtime();
    let root = dir.path().canonicalize().unwrap().join("later");
    let outside = dir.path().canonicalize().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let run = start(
        &rt,
        json!({"tool_calls": [call("write_file", json!({"file_path": "x.txt", "content": "moved"}))]}),
        json!({"workspace_root": root.to_str().unwrap()}),
        json!({}),
    );
    assert_eq!(run.status, RunStatus::Waiting);
    std::fs::remove_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&outside, &root).unwrap();
    let done = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    let r = results(&done);
    let e = r[0]["error"].as_str().unwrap();
    assert!(e.contains("now resolves to"), "{e}");
    assert!(!outside.join("x.txt").exists());
}

/// #43: through the sandbox, the built-in tools obey `.abstractignore` and
/// give the reference's texts for a refused read, a lint notice and an
/// invalid regex (the texts abstractcore 2.30.0 gave for the same calls).
#[test]
fn ignore_files_lint_notices_and_error_texts_match_the_reference() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    std::fs::write(ws.join(".abstractignore"), "*.key\n").unwrap();
    std::fs::write(ws.join("api.key"), "alpha secret\n").unwrap();
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("list_files", json!({"recursive": true})),
            call("search_files", json!({"pattern": "alpha", "output_mode": "files_with_matches"})),
            call("read_file", json!({"file_path": "api.key"})),
            call("write_file", json!({"file_path": "bad.js", "content": "function f() {\n  return 1;\n"})),
            call("search_files", json!({"pattern": "(abc"})),
        ]}),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["list_files", "search_files", "read_file", "write_file"]}}),
    );
    let r = results(&run);
    let text = |i: usize| {
        let v = &r[i];
        v["output"]
            .as_str()
            .or(v["error"].as_str())
            .unwrap()
            .replace(ws.to_str().unwrap(), "<ws>")
    };
    assert_eq!(
        text(0),
        "Entries in '<ws>' matching '*' (hidden entries excluded):\n  a.txt (11 bytes)"
    );
    assert_eq!(
        text(1),
        "Files matching pattern 'alpha' under '<ws>' (1 file(s)):\n<ws>/a.txt"
    );
    // A failed call's `error` is the tool's text without its `Error: `.
    assert_eq!(r[2]["success"], false);
    assert_eq!(
        text(2),
        "File '<ws>/api.key' is ignored by .abstractignore policy"
    );
    assert_eq!(
        text(3),
        "✅ Successfully written to '<ws>/bad.js' (27 bytes, 2 lines)\n\nNotice: lint (javascript) delimiter issues:\n  - unclosed_delimiter: opened '{' at 1:14 (reached EOF)"
    );
    assert_eq!(
        text(4),
        "Invalid regex pattern '(abc': missing ), unterminated subpattern at position 0"
    );
}

/// Each result's output, or its error, with the workspace `ws` shown as
/// `<ws>`.
fn texts(run: &RunState, ws: &Path) -> Vec<String> {
    results(run)
        .iter()
        .map(|v| {
            v["output"]
                .as_str()
                .or(v["error"].as_str())
                .unwrap()
                .replace(ws.to_str().unwrap(), "<ws>")
        })
        .collect()
}

/// #43: a negated built-in rule (`!build/`) shows the folder, a
/// third-party tool's path argument is held to `.abstractignore` by the
/// host, HTML gets the reference's lint notice, Python its ruff line, and
/// a pattern Python refuses is refused in its words even where the regex
/// crate would accept it (abstractcore 2.30.0's texts).
#[test]
fn ignore_files_reach_third_party_tools_and_more_reference_texts() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    std::fs::write(ws.join(".abstractignore"), "*.key\n!build/\n").unwrap();
    std::fs::write(ws.join("api.key"), "alpha secret\n").unwrap();
    std::fs::create_dir_all(ws.join("build")).unwrap();
    std::fs::write(ws.join("build/out.js"), "f();\n").unwrap();
    let page = "<html>\n<img src=\"a.png\">\n<a target=\"_blank\" href=\"x\">x</a>\n";
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("list_files", json!({"directory_path": "build"})),
            call("hostile_cat", json!({"file_path": "api.key"})),
            call("hostile_cat", json!({"file_path": "a.txt"})),
            call("write_file", json!({"file_path": "index.html", "content": page})),
            call("write_file", json!({"file_path": "m.py", "content": "import os\n"})),
            call("search_files", json!({"pattern": "a**"})),
            call("search_files", json!({"pattern": "a\n(b"})),
        ]}),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["list_files", "search_files", "write_file", "hostile_cat"]}}),
    );
    let r = results(&run);
    let t = texts(&run, &ws);
    let text = |i: usize| t[i].clone();
    assert_eq!(
        text(0),
        "Entries in '<ws>/build' matching '*' (hidden entries excluded):\n  out.js (5 bytes)"
    );
    assert_eq!(r[1]["success"], false);
    assert_eq!(
        text(1),
        "Path '<ws>/api.key' is ignored by .abstractignore policy"
    );
    assert_eq!(text(2), "alpha\nbeta\n");
    assert_eq!(
        text(3),
        "✅ Successfully written to '<ws>/index.html' (59 bytes, 3 lines)\n\nNotice: lint (html) issues:\n  - html_missing_lang at line 1\n  - img_missing_alt at line 2\n  - target_blank_missing_noopener at line 3"
    );
    assert_eq!(
        text(4),
        "✅ Successfully written to '<ws>/m.py' (10 bytes, 1 lines)\n\nNotice: lint (python/ruff) unavailable: ruff not installed"
    );
    assert_eq!(
        text(5),
        "Invalid regex pattern 'a**': multiple repeat at position 2"
    );
    assert_eq!(
        text(6),
        "Invalid regex pattern 'a\n(b': missing ), unterminated subpattern at position 2 (line 2, column 1)"
    );
}

/// #43: with a ruff program, the host lints a Python file written (on
/// disk) or edited (the edited text through stdin) in the file's folder
/// and appends the reference's notice; a program that is not there gives
/// the line for a missing ruff. The program here is a stand-in that
/// answers one finding naming how it was called.
#[test]
fn ruff_runs_on_the_host_for_python_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ruff = dir.path().join("fake-ruff");
    std::fs::write(
        &ruff,
        "#!/bin/sh\nin=''\nwhile IFS= read -r line; do in=\"$in$line\"; done\nprintf '[{\"code\": \"F401\", \"message\": \"%s | %s | %s\", \"location\": {\"row\": 1, \"column\": 8}, \"fix\": {\"applicability\": \"safe\"}}]' \"$*\" \"${PWD##*/}\" \"$in\"\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&ruff, std::fs::Permissions::from_mode(0o755)).unwrap();
    let with = |program: PathBuf, db: &str| {
        runtime_with(dir.path(), &dir.path().join(db), move |t| t.ruff(program))
    };
    let ws = workspace(&dir);
    let rt = with(ruff.clone(), "db1.sqlite");
    let run = start(
        &rt,
        json!({"tool_calls": [
            call("write_file", json!({"file_path": "m.py", "content": "import os\n"})),
            call("edit_file", json!({"file_path": "m.py", "pattern": "import os", "replacement": "import re"})),
            call("write_file", json!({"file_path": "a.js", "content": "f(\n"})),
        ]}),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["write_file", "edit_file"]}}),
    );
    let t = texts(&run, &ws);
    assert_eq!(
        t[0],
        "✅ Successfully written to '<ws>/m.py' (10 bytes, 1 lines)\n\nNotice: lint (python/ruff) found 1 issue(s) (1 fixable)\n  - 1:8 F401: check --no-cache --output-format json <ws>/m.py | ws | (fixable)"
    );
    assert!(
        t[1].ends_with("\n\nNotice: lint (python/ruff) found 1 issue(s) (1 fixable)\n  - 1:8 F401: check --no-cache --output-format json --stdin-filename <ws>/m.py - | ws | import re (fixable)"),
        "{}",
        t[1]
    );
    assert!(t[2].ends_with("unclosed_delimiter: opened '(' at 1:2 (reached EOF)"));
    let rt = with(dir.path().join("no-such-ruff"), "db2.sqlite");
    let run = start(
        &rt,
        json!({"tool_calls": [call("write_file", json!({"file_path": "n.py", "content": "x = 1\n"}))]}),
        ws_vars(&ws),
        json!({"tool_policy": {"auto_approve_tools": ["write_file"]}}),
    );
    assert_eq!(
        texts(&run, &ws)[0],
        "✅ Successfully written to '<ws>/n.py' (6 bytes, 1 lines)\n\nNotice: lint (python/ruff) unavailable: ruff not installed"
    );
}

/// Runs `ops` through `hostile_fsguard` (raw `wasi:filesystem` calls) in
/// an `all_except_ignored` scope rooted at `ws`; each op's report.
fn raw_calls(rt: &Runtime, ws: &Path, ops: Vec<Value>) -> Vec<Value> {
    let run = start(
        rt,
        json!({"tool_calls": [call("hostile_fsguard", json!({"ops": ops}))]}),
        json!({"workspace_root": ws.to_str().unwrap(), "workspace_access_mode": "all_except_ignored"}),
        json!({"tool_policy": {"auto_approve_tools": ["hostile_fsguard"]}}),
    );
    let r = results(&run);
    r[0]["output"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("{}", r[0]))
}

/// A store in `proj/` beside a workspace `ws/`, with an artifact and a
/// token file: (the temporary folder, its path, proj, ws, the runtime).
fn store_beside_workspace() -> (tempfile::TempDir, PathBuf, PathBuf, PathBuf, Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let proj = base.join("proj");
    std::fs::create_dir_all(proj.join("artifacts")).unwrap();
    std::fs::write(proj.join("artifacts/a1"), "ARTIFACT").unwrap();
    std::fs::write(proj.join("serve-token"), "SECRET-TOKEN").unwrap();
    let rt = runtime_at(&base, &proj.join("store.sqlite"));
    let ws = base.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    (dir, base, proj, ws, rt)
}

/// A component making raw calls cannot truncate or create the store's
/// files through a link it made (the link's target is checked, and a file
/// is truncated only once it is known not to be refused).
#[test]
fn raw_calls_cannot_truncate_the_store_through_a_link() {
    let (_dir, _, proj, ws, rt) = store_beside_workspace();
    let p = |s: &str| ws.join(s).to_str().unwrap().to_string();
    let r = raw_calls(
        &rt,
        &ws,
        vec![
            json!({"op": "symlink", "target": "../proj/serve-token", "path": p("tlink")}),
            json!({"op": "read", "path": p("tlink")}),
            json!({"op": "open_trunc", "path": p("tlink"), "create": false}),
            json!({"op": "open_trunc", "path": p("tlink"), "create": true}),
            json!({"op": "symlink", "target": "../proj/cache", "path": p("clink")}),
            json!({"op": "open_trunc", "path": p("clink"), "create": true}),
            json!({"op": "open_trunc", "path": p("mine.txt"), "create": true}),
        ],
    );
    let oks: Vec<bool> = r.iter().map(|x| x["ok"] == true).collect();
    assert_eq!(
        oks,
        [true, false, false, false, true, false, true],
        "{r:#?}"
    );
    assert_eq!(
        std::fs::read_to_string(proj.join("serve-token")).unwrap(),
        "SECRET-TOKEN"
    );
    assert!(!proj.join("cache").exists(), "a file squats cache/");
    assert!(ws.join("mine.txt").is_file());
}

/// A path too long for the system to resolve (two links into folders 4 KiB
/// deep, then `../` back out) is refused, not checked as written only: the
/// store cannot be hard-linked, read, overwritten or moved that way (before,
/// every one of these got through).
#[test]
fn raw_calls_through_a_path_too_deep_to_resolve_are_refused() {
    let (_dir, _, proj, ws, rt) = store_beside_workspace();
    let seg = "a".repeat(255);
    let w = ws.to_str().unwrap().to_string();
    let mut ops = Vec::new();
    let mut path = w.clone();
    for _ in 0..8 {
        path = format!("{path}/{seg}");
        ops.push(json!({"op": "mkdir", "path": path}));
    }
    let eight = [seg.as_str(); 8].join("/");
    ops.push(json!({"op": "symlink", "target": eight, "path": format!("{w}/S1")}));
    let mut path = format!("{w}/S1");
    for _ in 0..9 {
        path = format!("{path}/{seg}");
        ops.push(json!({"op": "mkdir", "path": path}));
    }
    let nine = [seg.as_str(); 9].join("/");
    ops.push(json!({"op": "symlink", "target": nine, "path": format!("{w}/S1/S2")}));
    let made = ops.len();
    let via = |x: &str| format!("{w}/S1/S2/{}proj/{x}", "../".repeat(18));
    ops.extend([
        json!({"op": "stat", "path": via("store.sqlite")}),
        json!({"op": "read", "path": via("store.sqlite")}),
        json!({"op": "link", "old": via("store.sqlite"), "new": format!("{w}/stolen.sqlite")}),
        json!({"op": "link", "old": via("serve-token"), "new": format!("{w}/tok")}),
        json!({"op": "rename", "old": via("artifacts"), "new": format!("{w}/moved")}),
        json!({"op": "open_trunc", "path": via("serve-token")}),
    ]);
    let r = raw_calls(&rt, &ws, ops);
    // The first folders are made; the deepest are already refused (their
    // folder cannot be resolved), and so is everything after.
    for x in &r[..8] {
        assert_eq!(x["ok"], true, "setting up: {x}");
    }
    assert!(r[8..made].iter().any(|x| x["ok"] == false), "{r:#?}");
    for x in &r[made..] {
        assert_eq!(x["ok"], false, "got through: {x}");
    }
    assert!(!ws.join("stolen.sqlite").exists() && !ws.join("tok").exists());
    assert!(proj.join("artifacts/a1").is_file());
    assert_eq!(
        std::fs::read_to_string(proj.join("serve-token")).unwrap(),
        "SECRET-TOKEN"
    );
}

/// A store named through a link or a `..` is refused where it really is;
/// a listing of its folder still works, and the metadata hash of a refused
/// file tells nothing of it (made from the name: the same for one that
/// does not exist).
#[test]
fn the_store_is_refused_wherever_it_was_named_from() {
    for variant in ["alias", "dotdot"] {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let real = base.join("real");
        std::fs::create_dir_all(&real).unwrap();
        std::fs::create_dir_all(base.join("other")).unwrap();
        std::os::unix::fs::symlink("real", base.join("alias")).unwrap();
        let db = match variant {
            "alias" => base.join("alias/store.sqlite"),
            _ => base.join("other/../real/store.sqlite"),
        };
        let rt = runtime_at(&base, &db);
        let ws = base.join("ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(real.join("notes.txt"), "n").unwrap();
        let at = |name: &str| real.join(name).to_str().unwrap().to_string();
        let r = raw_calls(
            &rt,
            &ws,
            vec![
                json!({"op": "read", "path": at("store.sqlite")}),
                json!({"op": "read", "path": db.to_str().unwrap()}),
                json!({"op": "read", "path": at("notes.txt")}),
                json!({"op": "list", "path": real.to_str().unwrap()}),
                json!({"op": "hash", "path": at("artifacts/x")}),
                json!({"op": "hash", "path": "/proc/self/environ"}),
            ],
        );
        let oks: Vec<bool> = r.iter().map(|x| x["ok"] == true).collect();
        assert_eq!(
            oks,
            [false, false, true, true, true, true],
            "{variant}: {r:#?}"
        );
    }
}

/// A refused file is known by its identity too (a hard link to it made
/// before, under a name of the workspace), a trailing `/` follows a link
/// to a refused folder, and names made, moved and removed in folders of the
/// workspace still work (they are made inside the folder, opened first).
#[test]
fn the_store_is_known_by_identity_and_work_beside_it_goes_on() {
    let (_dir, _, proj, ws, rt) = store_beside_workspace();
    std::fs::hard_link(proj.join("serve-token"), ws.join("hard")).unwrap();
    std::fs::create_dir_all(ws.join("sub/inner")).unwrap();
    std::fs::write(ws.join("sub/inner/f.txt"), "f").unwrap();
    let p = |s: &str| ws.join(s).to_str().unwrap().to_string();
    let r = raw_calls(
        &rt,
        &ws,
        vec![
            json!({"op": "read", "path": p("hard")}),
            json!({"op": "symlink", "target": "../proj/artifacts", "path": p("al")}),
            json!({"op": "stat", "path": format!("{}/", p("al")), "follow": false}),
            json!({"op": "stat", "path": format!("{}/.", p("al")), "follow": false}),
            json!({"op": "mkdir", "path": p("sub/inner/new")}),
            json!({"op": "rename", "old": p("sub/inner/f.txt"), "new": p("sub/g.txt")}),
            json!({"op": "link", "old": p("sub/g.txt"), "new": p("sub/inner/h.txt")}),
            json!({"op": "unlink", "path": p("sub/inner/h.txt")}),
            json!({"op": "rmdir", "path": p("sub/inner/new")}),
            json!({"op": "symlink", "target": "g.txt", "path": p("sub/l")}),
            json!({"op": "open_trunc", "path": p("sub/g.txt"), "create": false}),
            json!({"op": "read", "path": p("sub/l")}),
        ],
    );
    let oks: Vec<bool> = r.iter().map(|x| x["ok"] == true).collect();
    let expected = [
        false, true, false, false, true, true, true, true, true, true, true, true,
    ];
    assert_eq!(oks, expected, "{r:#?}");
    assert!(ws.join("sub/g.txt").is_file() && !ws.join("sub/inner/f.txt").exists());
    assert_eq!(std::fs::read_to_string(ws.join("sub/g.txt")).unwrap(), "");
    assert_eq!(
        std::fs::read_to_string(proj.join("serve-token")).unwrap(),
        "SECRET-TOKEN"
    );
}

/// Two runs racing: one swaps a link `d` between a decoy folder and the
/// store's folder while the other hard-links `d/store.sqlite` over and
/// over. A link is made inside the folder the check saw (opened first), so
/// none of them is the store (before, about one in seven was).
#[test]
fn a_link_swapped_by_another_run_does_not_reach_the_store() {
    use std::os::unix::fs::MetadataExt;
    let (_dir, _, proj, ws, rt) = store_beside_workspace();
    std::fs::create_dir_all(ws.join("decoy")).unwrap();
    std::fs::write(ws.join("decoy/store.sqlite"), "decoy").unwrap();
    std::os::unix::fs::symlink("decoy", ws.join("d")).unwrap();
    let p = |s: &str| ws.join(s).to_str().unwrap().to_string();
    let swaps: Vec<Value> = (0..150)
        .flat_map(|_| {
            [
                json!({"op": "symlink", "target": "decoy", "path": p(".swap")}),
                json!({"op": "rename", "old": p(".swap"), "new": p("d")}),
                json!({"op": "symlink", "target": "../proj", "path": p(".swap")}),
                json!({"op": "rename", "old": p(".swap"), "new": p("d")}),
            ]
        })
        .collect();
    let links: Vec<Value> = (0..300)
        .map(|i| json!({"op": "link", "old": p("d/store.sqlite"), "new": p(&format!("s{i}"))}))
        .collect();
    let store = std::fs::metadata(proj.join("store.sqlite")).unwrap().ino();
    let mut overlapped = 0;
    for _ in 0..3 {
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let swapper = {
            let (rt, ws, swaps, barrier) = (rt.clone(), ws.clone(), swaps.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                raw_calls(&rt, &ws, swaps)
            })
        };
        barrier.wait();
        let made = raw_calls(&rt, &ws, links.clone());
        swapper.join().unwrap();
        let oks = made.iter().filter(|x| x["ok"] == true).count();
        overlapped += usize::from(oks > 0 && oks < made.len());
        for i in 0..300 {
            if let Ok(m) = std::fs::metadata(ws.join(format!("s{i}"))) {
                assert_ne!(m.ino(), store, "s{i} is a hard link to the store");
                std::fs::remove_file(ws.join(format!("s{i}"))).unwrap();
            }
        }
    }
    eprintln!("rounds where the swaps overlapped the links: {overlapped} of 3");
}

/// A tool batch the driver starts flies (its pass moves on), and a cancel
/// of its run interrupts the tool: a spinning tool with a minute's timeout
/// lands at once, and nothing of it is recorded.
#[test]
fn a_cancel_interrupts_a_tool_in_flight() {
    let (rt, dir) = runtime();
    let ws = workspace(&dir);
    let mut v = vars(ws_vars(&ws));
    v.insert(
        "batch".into(),
        json!({"tool_calls": [{"name": "hostile_spin", "arguments": {}, "call_id": "spin"}]}),
    );
    let id = rt
        .start(
            "tools",
            StartOptions {
                vars: v,
                runtime: stepwell::core::config::operator_runtime(vars(json!({
                    "tool_timeout_s": 60,
                    "tool_policy": {"auto_approve_tools": ["hostile_spin"]}})))
                .unwrap(),
                ..Default::default()
            },
        )
        .unwrap();
    let pass = rt.drive_once().unwrap();
    assert_eq!(pass.ticked, vec![id.clone()]);
    assert_eq!(rt.in_flight(), 1, "the batch flies");
    // Spinning by now (its instance is made in a few milliseconds).
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(rt.in_flight(), 1);
    rt.cancel_run(&id, None).unwrap();
    assert!(
        rt.wait_in_flight(std::time::Duration::from_secs(20)),
        "the tool was not interrupted (its timeout is 60 s)"
    );
    assert_eq!(rt.get_state(&id).unwrap().status, RunStatus::Cancelled);
    let ledger = rt.get_ledger(&id).unwrap();
    assert!(
        ledger
            .iter()
            .all(|r| r.status != stepwell::core::model::StepStatus::Completed),
        "{ledger:?}"
    );
}

/// With every flight thread taken, a tool batch the driver meets is held
/// back (not executed in the pass, not queued): it flies once a thread is
/// free.
#[test]
fn tool_batches_past_the_flight_threads_are_held_back() {
    let (rt, dir) = runtime_configured(stepwell::RuntimeConfig {
        flight_threads: 1,
        ..Default::default()
    });
    let ws = workspace(&dir);
    let spin = |id: &str| {
        let mut v = vars(ws_vars(&ws));
        v.insert(
            "batch".into(),
            json!({"tool_calls": [{"name": "hostile_spin", "arguments": {}, "call_id": id}]}),
        );
        rt.start(
            "tools",
            StartOptions {
                vars: v,
                runtime: stepwell::core::config::operator_runtime(vars(json!({
                    "tool_timeout_s": 1,
                    "tool_policy": {"auto_approve_tools": ["hostile_spin"]}})))
                .unwrap(),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let (first, second) = (spin("a"), spin("b"));
    let pass = rt.drive_once().unwrap();
    assert_eq!(pass.ticked.len(), 2, "{pass:?}");
    assert_eq!(rt.in_flight(), 1, "one batch flies, the other is held back");
    // Both end: the held-back batch flies once the thread is free.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while [&first, &second]
        .iter()
        .any(|id| rt.get_state(id).unwrap().status != RunStatus::Completed)
    {
        assert!(std::time::Instant::now() < until, "the batches never ended");
        rt.drive_once().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for id in [&first, &second] {
        let run = rt.get_state(id).unwrap();
        assert_eq!(
            results(&run)[0]["error"],
            "Tool execution timed out after 1.0s",
            "{run:?}"
        );
    }
}

/// A run of `tools` that asks approval for `hostile_spin` with a timeout of
/// `timeout_s`, on a runtime whose calls fly (as under `stepwell serve`).
fn spin_awaiting_approval(timeout_s: u64) -> (Runtime, tempfile::TempDir, RunState) {
    let (rt, dir) = runtime_configured(stepwell::RuntimeConfig {
        calls_in_flight: true,
        ..Default::default()
    });
    let ws = workspace(&dir);
    let run = start(
        &rt,
        json!({"tool_calls": [{"name": "hostile_spin", "arguments": {}, "call_id": "spin"}]}),
        ws_vars(&ws),
        json!({"tool_timeout_s": timeout_s,
               "tool_policy": {"require_approval_tools": ["hostile_spin"]}}),
    );
    // The batch flies to find it needs approval, then the run waits.
    assert!(rt.wait_in_flight(std::time::Duration::from_secs(20)));
    let run = rt.get_state(&run.run_id).unwrap();
    assert_eq!(run.status, RunStatus::Waiting, "{run:?}");
    (rt, dir, run)
}

/// An approved batch runs in flight when calls fly: the approval returns
/// at once with the run still waiting (its resume under way), a second
/// answer meanwhile is refused, and the batch's results end the wait once
/// it lands: recorded once.
#[test]
fn an_approved_batch_runs_in_flight_and_its_results_end_the_wait() {
    let (rt, _dir, run) = spin_awaiting_approval(1);
    let wait_key = run.waiting.as_ref().unwrap().wait_key.clone();
    let answered = rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    assert_eq!(answered.status, RunStatus::Waiting, "{answered:?}");
    assert!(rt.resuming(&run.run_id), "the batch runs in flight");
    // Another answer while the batch runs: refused, nothing changes.
    let e = rt
        .respond(&run.run_id, json!({"approved": false}))
        .unwrap_err();
    assert_eq!(e.reason_code(), "conflict", "{e}");
    assert!(
        rt.wait_in_flight(std::time::Duration::from_secs(60)),
        "the batch never landed"
    );
    assert!(!rt.resuming(&run.run_id));
    let done = rt.get_state(&run.run_id).unwrap();
    assert_eq!(
        results(&done)[0]["error"],
        "Tool execution timed out after 1.0s",
        "{done:?}"
    );
    let ledger = rt.get_ledger(&run.run_id).unwrap();
    let resumed: Vec<_> = ledger
        .iter()
        .filter(|r| {
            r.result
                .as_ref()
                .is_some_and(|v| v["resumed"]["wait_key"] == wait_key.as_str())
        })
        .collect();
    assert_eq!(resumed.len(), 1, "{ledger:#?}");
    assert_eq!(
        resumed[0].result.as_ref().unwrap()["resumed"]["payload"],
        json!({"approved": true})
    );
}

/// With as many effects in flight as the host allows, an approval is
/// refused (`busy`), nothing written, rather than run inside the call; it
/// is taken once there is room.
#[test]
fn an_approval_without_room_in_flight_is_refused_not_run_inline() {
    let (rt, dir) = runtime_configured(stepwell::RuntimeConfig {
        calls_in_flight: true,
        max_in_flight: 1,
        ..Default::default()
    });
    let ws = workspace(&dir);
    let asking = |timeout: u64| {
        let run = start(
            &rt,
            json!({"tool_calls": [{"name": "hostile_spin", "arguments": {}, "call_id": "spin"}]}),
            ws_vars(&ws),
            json!({"tool_timeout_s": timeout,
                   "tool_policy": {"require_approval_tools": ["hostile_spin"]}}),
        );
        assert!(rt.wait_in_flight(std::time::Duration::from_secs(20)));
        run.run_id
    };
    let (a, b) = (asking(1), asking(1));
    rt.respond(&a, json!({"approved": true})).unwrap();
    assert!(rt.resuming(&a));
    let before = rt.get_ledger(&b).unwrap().len();
    let e = rt.respond(&b, json!({"approved": true})).unwrap_err();
    assert_eq!(e.reason_code(), "busy", "{e}");
    assert_eq!(rt.get_ledger(&b).unwrap().len(), before, "nothing written");
    assert_eq!(rt.get_state(&b).unwrap().status, RunStatus::Waiting);
    assert!(rt.wait_in_flight(std::time::Duration::from_secs(30)));
    rt.respond(&b, json!({"approved": true})).unwrap();
    assert!(rt.wait_in_flight(std::time::Duration::from_secs(30)));
    for id in [&a, &b] {
        let run = rt.get_state(id).unwrap();
        assert_eq!(
            results(&run)[0]["error"],
            "Tool execution timed out after 1.0s",
            "{run:?}"
        );
    }
}

/// A cancel reaches an approved batch in flight: the spinning tool (a
/// minute's timeout) is interrupted, the run is cancelled, and no result
/// of the batch is recorded.
#[test]
fn a_cancel_interrupts_an_approved_batch_in_flight() {
    let (rt, _dir, run) = spin_awaiting_approval(60);
    rt.respond(&run.run_id, json!({"approved": true})).unwrap();
    assert!(rt.resuming(&run.run_id));
    // Spinning by now (its instance is made in a few milliseconds).
    std::thread::sleep(std::time::Duration::from_millis(300));
    rt.cancel_run(&run.run_id, None).unwrap();
    assert!(
        rt.wait_in_flight(std::time::Duration::from_secs(20)),
        "the tool was not interrupted (its timeout is 60 s)"
    );
    assert_eq!(
        rt.get_state(&run.run_id).unwrap().status,
        RunStatus::Cancelled
    );
    let ledger = rt.get_ledger(&run.run_id).unwrap();
    assert!(
        ledger
            .iter()
            .all(|r| r.result.as_ref().is_none_or(|v| v.get("resumed").is_none())),
        "{ledger:#?}"
    );
}

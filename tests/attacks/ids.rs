//! A guest naming run ids it does not own (attacks-369e311, F3): a
//! sandboxed node asks for `start_subworkflow` children under ids the host
//! derives for others (an automation's controller, its occurrences, another
//! run's default child). A named child lives under its parent, so none of
//! them is taken.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use stepwell::automation::{automation_id, occurrence_run_id, OccurrenceKind};
use stepwell::effects::subworkflow::{default_child_id, named_child_id};
use stepwell::host::{open_runtime, HostOptions, StoreSpec};
use stepwell::{RunStatus, Runtime};
use stepwell_tests::{component, repo, stepwell_binary, write_bundle};

/// A store driven by the `stepwell` binary, one process per command.
struct Shell {
    dir: tempfile::TempDir,
}

impl Shell {
    fn new() -> Shell {
        Shell {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("db.sqlite")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(stepwell_binary())
            .arg("--db")
            .arg(self.db())
            .args(args)
            .current_dir(repo())
            .env_remove("STEPWELL_DB")
            .env_remove("STEPWELL_STORE")
            .env_remove("STEPWELL_TRIGGER_DIR")
            .output()
            .unwrap()
    }

    /// Runs with `--json` and parses what it prints; panics unless it
    /// exits 0.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(&[&["--json"], args].concat());
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `drive --until-idle` at `now`; asserts it met no error.
    fn drive(&self, now: &str) {
        let report = self.json(&["--now", now, "drive", "--until-idle"]);
        assert_eq!(report["errors"], json!([]), "drive at {now}: {report}");
    }

    /// Creates the automation of `request` at `now`.
    fn create(&self, request: &Value, now: &str) -> Output {
        let request = request.to_string();
        self.run(&[
            "--json",
            "--now",
            now,
            "automations",
            "create",
            "--request",
            &request,
        ])
    }

    /// The store, as another process opens it.
    fn runtime(&self) -> Runtime {
        open_runtime(&StoreSpec::Sqlite(self.db()), &HostOptions::default()).unwrap()
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const T1: &str = "2026-01-01T00:00:00Z";

/// An hourly automation of the `echo` target, created as `request_id`.
fn hourly_echo(request_id: &str, workspace: &Path, policy: Option<Value>) -> Value {
    let mut r = json!({
        "request_id": request_id,
        "title": request_id,
        "target": {"workflow_id": "echo", "bundle_ref": "flows/automations/echo", "flow_id": "echo",
                   "input_data": {"prompt": "hi"}},
        "trigger": {"source_id": "schedule", "source_version": 1,
                    "config": {"start_at": T1, "every": "1h"}},
        "workspace_root": workspace.display().to_string(),
    });
    if let Some(p) = policy {
        r["policy"] = p;
    }
    r
}

fn scheduled(automation: &str, index: u64, attempt: u32) -> String {
    occurrence_run_id(
        automation,
        OccurrenceKind::Scheduled { revision: 1, index },
        attempt,
    )
}

/// The attacker's bundle: its guest (`hostile.wasm`, mode `effect`) asks,
/// node after node, for an async `start_subworkflow` child under each of
/// `ids`; the child waits on a person for ever.
fn squatter_bundle(root: &Path, ids: &[String]) -> PathBuf {
    let hostile = component("runaway/hostile.wasm");
    let mut nodes = serde_json::Map::new();
    for (k, id) in ids.iter().enumerate() {
        let next = if k + 1 < ids.len() {
            format!("g{}", k + 1)
        } else {
            "done".into()
        };
        nodes.insert(
            format!("g{k}"),
            json!({"component": hostile, "next": next, "config": {"mode": "effect", "patch": {},
                   "effect": {"kind": "start_subworkflow",
                              "payload": {"workflow_id": "squat.child", "run_id": id, "async": true},
                              "result_key": format!("r{k}")}}}),
        );
    }
    nodes.insert("done".into(), json!({"complete": {"ok": true}}));
    write_bundle(
        root,
        "squat",
        &[
            (
                "flow.json",
                json!({"workflow_id": "squat", "entry": "g0", "nodes": nodes}),
            ),
            (
                "child.flow.json",
                json!({"workflow_id": "squat.child", "entry": "w",
                       "nodes": {"w": {"effect": "ask_user", "payload": {"prompt": "squatting"}}}}),
            ),
        ],
    )
}

/// The issue's attack, with real processes: a guest starts children under
/// an automation's future controller id, another automation's first three
/// occurrence ids and another run's default child id. Each child is
/// confined under the attacker's run; both automations are created and run
/// their occurrences, and the other run's subworkflow completes.
#[test]
fn a_guest_cannot_take_ids_the_host_derives_for_others() {
    let sh = Shell::new();
    let nightly = automation_id("local", "local", "nightly");
    let nightly2 = automation_id("local", "local", "nightly2");
    let victim_child = default_child_id("victim:1");
    let mut targets = vec![nightly.clone()];
    targets.extend((1..=3).map(|i| scheduled(&nightly2, i, 1)));
    targets.push(victim_child.clone());
    let bundle = squatter_bundle(sh.dir.path(), &targets);

    let attacker = sh.json(&["run", bundle.to_str().unwrap(), "--run-id", "attacker"]);
    assert_eq!(attacker["status"], "completed", "{attacker}");
    sh.drive(T1);
    let rt = sh.runtime();
    for (k, id) in targets.iter().enumerate() {
        let confined = named_child_id("attacker", id);
        assert_eq!(
            attacker["vars"][format!("r{k}")]["sub_run_id"],
            json!(confined),
            "{attacker}"
        );
        let child = rt.get_state(&confined).unwrap();
        assert_eq!(child.parent_run_id.as_deref(), Some("attacker"));
        assert_eq!(child.status, RunStatus::Waiting);
        assert!(
            !sh.run(&["status", id]).status.success(),
            "{id} was taken: {}",
            text(&sh.run(&["status", id]))
        );
        println!("asked for {id} -> child {confined} (parent attacker)");
    }

    // The automations created afterwards work.
    let ws = sh.dir.path().join("ws");
    let out = sh.create(&hourly_echo("nightly", &ws, None), T1);
    assert!(out.status.success(), "{}", text(&out));
    let created: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        created,
        json!({"automation_id": nightly, "revision": 1, "created": true})
    );
    let out = sh.create(&hourly_echo("nightly2", &ws, None), T1);
    assert!(out.status.success(), "{}", text(&out));
    for now in [T1, "2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"] {
        sh.drive(now);
    }
    for (id, count) in [(&nightly, 3), (&nightly2, 3)] {
        let shown = sh.json(&["--now", "2026-01-01T02:00:00Z", "automations", "show", id]);
        assert_eq!(shown["status"], "active", "{shown}");
        assert_eq!(shown["current_occurrence"], Value::Null, "{shown}");
        assert_eq!(shown["state"]["scheduled_count"], count, "{shown}");
        let page = sh.json(&["automations", "occurrences", id]);
        let items = page["items"].as_array().unwrap();
        assert_eq!(items.len(), count as usize, "{page}");
        for item in items {
            assert_eq!(item["status"], "completed", "{item}");
        }
        println!(
            "automation {id}: {} occurrences, statuses {:?}",
            items.len(),
            items
                .iter()
                .map(|i| i["status"].as_str().unwrap())
                .collect::<Vec<_>>()
        );
    }
    for i in 1..=3 {
        let occurrence = rt.get_state(&scheduled(&nightly2, i, 1)).unwrap();
        assert_eq!(occurrence.parent_run_id.as_deref(), Some(nightly2.as_str()));
        assert_eq!(occurrence.status, RunStatus::Completed);
    }

    // The other run's default subworkflow completes.
    let example = repo().join("flows/examples/subworkflow");
    let victim = sh.json(&[
        "run",
        example.to_str().unwrap(),
        "--run-id",
        "victim",
        "--vars",
        r#"{"text":"hi"}"#,
    ]);
    assert_eq!(victim["status"], "completed", "{victim}");
    assert_eq!(victim["output"], json!({"shouted": "HI"}));
    assert_eq!(victim["vars"]["child"]["sub_run_id"], json!(victim_child));
    println!(
        "victim: {} output {} (child {victim_child})",
        victim["status"], victim["output"]
    );
}

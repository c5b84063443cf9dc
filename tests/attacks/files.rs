//! Another local user beside the store's files, and a process under
//! `ulimit -f`: each test runs the real binary (`target/release/stepwell`)
//! through `sh`, with a umask or a limit set there, and forges or hands
//! over files on disk as that user would.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};
use stepwell_tests::{example, stepwell_binary};

/// Runs `stepwell --db <db> <args>` from `sh -c '<prelude>; exec ...'` (a
/// umask, a file-size limit), with its output.
fn stepwell_sh(prelude: &str, db: &Path, args: &[&str]) -> Output {
    let mut script = format!("{prelude}; exec \"$0\" --db \"$1\"");
    for i in 0..args.len() {
        script.push_str(&format!(" \"${}\"", i + 2));
    }
    stepwell_tests::scratch_home(&mut Command::new("sh"), db.parent().unwrap())
        .arg("-c")
        .arg(script)
        .arg(stepwell_binary())
        .arg(db)
        .args(args)
        .env_remove("STEPWELL_DB")
        .env_remove("STEPWELL_STORE")
        .output()
        .expect("run sh")
}

fn stepwell(db: &Path, args: &[&str]) -> Output {
    stepwell_sh("umask 022", db, args)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The JSON the command printed (`--json`), asserting it succeeded.
fn ok_json(out: Output) -> Value {
    assert!(out.status.success(), "failed: {}", stderr(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// Starts `stepwell serve` on `db` from `sh -c '<prelude>; exec ...'`,
/// runs `hello` as `run_id` through it with a name large enough to be kept
/// as an artifact (too large for a command line), and stops it.
fn hello_with_artifact(prelude: &str, db: &Path, run_id: &str) {
    let mut child = stepwell_tests::scratch_home(&mut Command::new("sh"), db.parent().unwrap())
        .arg("-c")
        .arg(format!(
            "{prelude}; exec \"$0\" --db \"$1\" serve --listen 127.0.0.1:0"
        ))
        .arg(stepwell_binary())
        .arg(db)
        .env_remove("STEPWELL_DB")
        .env_remove("STEPWELL_STORE")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut line = || lines.next().expect("serve prints").unwrap();
    let (first, second) = (line(), line());
    let url = first
        .strip_prefix("stepwell serve: ")
        .unwrap()
        .trim_end_matches('/');
    let token = std::fs::read_to_string(second.strip_prefix("token file: ").unwrap()).unwrap();
    let body = json!({"bundle": example("hello"), "run_id": run_id,
                      "vars": {"name": "x".repeat(300_000)}});
    let sent = ureq::post(format!("{url}/v1/runs"))
        .header("Authorization", format!("Bearer {}", token.trim()))
        .send_json(&body);
    let _ = child.kill();
    let _ = child.wait();
    sent.expect("the run started");
}

/// The files below `dir`, recursively.
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Under umask 022 (and 000), the database, its `-wal` and `-shm`, the
/// artifacts, the snapshots and their key are created owner-only: folders
/// `0700`, files `0600`; nobody else can read a var out of the WAL.
#[test]
fn store_files_are_private_whatever_the_umask() {
    for umask in ["022", "000"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("store/x.sqlite");
        let prelude = format!("umask {umask}");
        hello_with_artifact(&prelude, &db, "r1");
        let out = stepwell_sh(&prelude, &db, &["snapshot", "create", "r1", "--name", "s"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let store = db.parent().unwrap();
        assert_eq!(mode(store), 0o700, "umask {umask}: {}", store.display());
        for sub in ["artifacts", "snapshots", "cache"] {
            let d = store.join(sub);
            assert_eq!(mode(&d), 0o700, "umask {umask}: {}", d.display());
        }
        let mut files = files_below(store);
        files.retain(|f| !f.starts_with(store.join("cache")));
        let names: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(store).unwrap().display().to_string())
            .collect();
        for expected in ["x.sqlite", "snapshots/seal.key"] {
            assert!(names.iter().any(|n| n == expected), "{names:?}");
        }
        assert!(
            names.iter().any(|n| n.starts_with("artifacts/")),
            "{names:?}"
        );
        assert!(
            names.iter().any(|n| n.starts_with("snapshots/snapshot_")),
            "{names:?}"
        );
        for f in &files {
            assert_eq!(mode(f), 0o600, "umask {umask}: {}", f.display());
        }
        for d in files.iter().filter_map(|f| f.parent()) {
            assert_eq!(mode(d), 0o700, "umask {umask}: {}", d.display());
        }
    }
}

/// An offloaded var whose artifact file was replaced (by another user who
/// could write the folder, or by hand) is refused, `store_corrupt` naming
/// the artifact, instead of being shown as the run's var.
#[test]
fn a_forged_artifact_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite");
    hello_with_artifact("umask 022", &db, "victim");
    // Every artifact forged: the var's, and the first step's record's
    // (its input, offloaded as large too).
    let contents: Vec<_> = files_below(&dir.path().join("artifacts"))
        .into_iter()
        .filter(|f| f.extension().is_none())
        .collect();
    assert!(!contents.is_empty(), "an artifact");
    let mut ids = Vec::new();
    for content in &contents {
        ids.push(content.file_name().unwrap().to_str().unwrap().to_string());
        std::fs::write(content, "\"FORGED by another user\"").unwrap();
    }
    for args in [
        &["--json", "status", "victim"][..],
        &["--json", "ledger", "victim"],
    ] {
        let out = stepwell(&db, args);
        let text = format!("{}{}", stderr(&out), String::from_utf8_lossy(&out.stdout));
        assert!(!text.contains("FORGED"), "the forged var was shown: {text}");
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains("store_corrupt")
                && ids
                    .iter()
                    .any(|id| text.contains(&format!("artifact {id}"))),
            "{text}"
        );
    }
}

/// A snapshot file rewritten to widen the run's tool scope (its host-owned
/// `_runtime`) is refused at restore (its seal no longer holds); a listing
/// leaves it and a garbage file out and still shows the others.
#[test]
fn a_forged_snapshot_is_refused_and_hides_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite");
    let ask = example("ask-user");
    ok_json(stepwell(
        &db,
        &["--json", "run", ask.to_str().unwrap(), "--run-id", "asker"],
    ));
    let snap = |name: &str| {
        ok_json(stepwell(
            &db,
            &["--json", "snapshot", "create", "asker", "--name", name],
        ))["snapshot_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (forged, kept) = (snap("forged"), snap("kept"));
    let file = dir.path().join(format!("snapshots/snapshot_{forged}.json"));
    let mut s: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    s["run_state"]["vars"]["_runtime"]["workspace"] =
        json!({"workspace_root": "/", "workspace_access_mode": "all_except_ignored"});
    s["run_state"]["vars"]["_runtime"]["tool_policy"] =
        json!({"auto_approve_tools": ["write_file", "read_file"]});
    std::fs::write(&file, serde_json::to_vec_pretty(&s).unwrap()).unwrap();
    std::fs::write(dir.path().join("snapshots/snapshot_zzz.json"), "garbage").unwrap();

    let out = stepwell(&db, &["snapshot", "restore", &forged]);
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "the forged snapshot was restored: {err}"
    );
    assert!(
        err.contains("store_corrupt") && err.contains(&format!("snapshot {forged}")),
        "{err}"
    );
    let run = ok_json(stepwell(&db, &["--json", "status", "asker"]));
    assert!(
        run["vars"]["_runtime"].get("tool_policy").is_none(),
        "{run}"
    );

    let out = stepwell(&db, &["--json", "snapshot", "list"]);
    let err = stderr(&out);
    for bad in [forged.as_str(), "zzz"] {
        let line = format!(
            "warning: snapshot left out: store_corrupt: {}",
            dir.path().display()
        );
        assert!(
            err.contains(&line) && err.contains(&format!("snapshot_{bad}.json")),
            "{err}"
        );
    }
    let listed = ok_json(out);
    let ids: Vec<&str> = listed
        .as_array()
        .or_else(|| listed["items"].as_array())
        .unwrap()
        .iter()
        .filter_map(|s| s["snapshot_id"].as_str())
        .collect();
    assert_eq!(ids, [kept.as_str()], "{listed}");
    // The one left alone restores.
    ok_json(stepwell(&db, &["--json", "snapshot", "restore", &kept]));
}

/// What a test does to a folder to spoil it.
type Spoil = fn(&Path);

/// Folders beside the database that another user made first, or that
/// others may write, are refused (`store_unsafe`, naming the folder)
/// before anything is read from or written to them.
#[test]
fn foreign_or_open_store_folders_are_refused() {
    let hello = example("hello");
    let cases: [(&str, Spoil); 3] = [
        ("artifacts", |d| {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o775)).unwrap()
        }),
        ("snapshots", |d| {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap()
        }),
        ("artifacts", |d| {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap()
        }),
    ];
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    for (i, (sub, spoil)) in cases.into_iter().enumerate() {
        if i == 2 && !root {
            continue; // only root can give a folder away
        }
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.sqlite");
        let folder = dir.path().join(sub);
        std::fs::create_dir(&folder).unwrap();
        spoil(&folder);
        let args = match sub {
            "artifacts" => vec!["run", hello.to_str().unwrap()],
            _ => vec!["snapshot", "list"],
        };
        let out = stepwell(&db, &args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{sub} accepted: {err}");
        assert!(
            err.contains("store_unsafe") && err.contains(&folder.display().to_string()),
            "{err}"
        );
        let why = if i == 2 {
            "belongs to user 65534"
        } else {
            "writable by others"
        };
        assert!(err.contains(why), "{err}");
    }
}

/// Under `ulimit -f`, a write past the limit is a `store_io` error naming
/// the file, exit status 1, not a death by SIGXFSZ without a word.
#[test]
fn a_file_size_limit_is_an_error_not_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite");
    let hello = example("hello");
    let hello = hello.to_str().unwrap();
    let out = stepwell(&db, &["run", hello]);
    assert!(out.status.success(), "{}", stderr(&out));
    let vars = json!({"name": "x".repeat(120_000)}).to_string();
    let out = stepwell_sh("ulimit -f 64", &db, &["run", hello, "--vars", &vars]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{:?}: {err}", out.status);
    assert!(
        err.contains("error: store_io: ") && err.contains(&db.display().to_string()),
        "{err}"
    );
}

/// An integer no 64-bit integer holds is refused at the door, naming the
/// field, rather than stored as the nearest float.
#[test]
fn integers_beyond_64_bits_are_refused_not_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite");
    let hello = example("hello");
    let big = "123456789012345678901234567890";
    let vars = format!(r#"{{"name": "Ada", "ids": [1, {big}]}}"#);
    let out = stepwell(&db, &["run", hello.to_str().unwrap(), "--vars", &vars]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("invalid_input: --vars.ids[1]") && err.contains(big),
        "{err}"
    );
    // A float written as one stays a float, on purpose.
    let vars = r#"{"name": "Ada", "f": 1.2345678901234568e29}"#;
    let run = ok_json(stepwell(
        &db,
        &["--json", "run", hello.to_str().unwrap(), "--vars", vars],
    ));
    assert_eq!(run["vars"]["f"], json!(1.2345678901234568e29));
    // A literal in a flow file is refused at load, naming file and field.
    let flow = json!({"workflow_id": "big", "entry": "a",
                      "nodes": {"a": {"complete": {"n": 1}}}})
    .to_string()
    .replace("\"n\":1", &format!("\"n\":{big}"));
    let bundle = dir.path().join("big");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("flow.json"), flow).unwrap();
    let out = stepwell(&db, &["run", bundle.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("invalid_definition") && err.contains(big),
        "{err}"
    );
    assert!(err.contains("nodes.a.complete.n"), "{err}");
    // So is one in an automation request given to the CLI.
    let request = format!(r#"{{"request_id": "big", "input_data": {{"n": {big}}}}}"#);
    let out = stepwell(&db, &["automations", "create", "--request", &request]);
    let err = stderr(&out);
    assert!(
        err.contains("invalid_input: --request.input_data.n") && err.contains(big),
        "{err}"
    );
}

//! A run's history as one file: exported from SQLite, imported into every
//! store with its chain intact, run on there; a changed archive refused,
//! naming what changed. Forks from a past point, their vars rebuilt from
//! the ledger.

use std::process::Command;
use std::sync::Arc;

use serde_json::json;
use stepwell::core::fork::{ForkFrom, ForkOptions, Forked};
use stepwell::{RunStatus, StartOptions};
use stepwell_tests::{example, store_tests, Backend, Host};

/// `archive` rewritten by Python's zipfile (stored entries) with
/// `edit(name, bytes) -> bytes` applied, as a script fragment.
fn rewrite(archive: &[u8], dir: &std::path::Path, edit: &str) -> Vec<u8> {
    let (src, dst) = (dir.join("in.zip"), dir.join("out.zip"));
    std::fs::write(&src, archive).unwrap();
    let script = format!(
        "import zipfile,sys,json,hashlib\n\
         src=zipfile.ZipFile(sys.argv[1]); out=zipfile.ZipFile(sys.argv[2],'w',zipfile.ZIP_STORED)\n\
         def edit(name, data):\n{edit}\n\
         for i in src.infolist():\n  out.writestr(i.filename, edit(i.filename, src.read(i.filename)))\n\
         out.close()\n"
    );
    let st = Command::new("python3")
        .args(["-c", &script])
        .arg(&src)
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::read(dst).unwrap()
}

/// A SQLite host with an ask-user run parked, and the run's export.
fn exported() -> (Host, stepwell::RunState, Vec<u8>) {
    let source = Host::new(Backend::Sqlite);
    let bundle = source.rt.load_bundle(&example("ask-user")).unwrap();
    let parked = source
        .rt
        .run(&bundle.main_workflow_id, StartOptions::default())
        .unwrap();
    let archive = source.rt.export_run(&parked.run_id, false).unwrap();
    (source, parked, archive)
}

fn an_exported_run_is_imported_whole_and_runs_on(b: Backend) {
    let (source, parked, archive) = exported();
    let target = Host::new(b);
    let ids = target.rt.import_runs(&archive).unwrap();
    assert_eq!(ids, std::slice::from_ref(&parked.run_id));
    let there = target.store.list_records(&parked.run_id).unwrap();
    let here = source.store.list_records(&parked.run_id).unwrap();
    let hashes =
        |r: &[stepwell::StepRecord]| r.iter().map(|x| x.record_hash.clone()).collect::<Vec<_>>();
    assert_eq!(
        hashes(&there),
        hashes(&here),
        "the same chain, record for record"
    );
    assert!(stepwell::store::verify_chain(&there).is_ok());
    let run = target.rt.get_state(&parked.run_id).unwrap();
    assert_eq!(run.workflow_version, Some(1));
    let key = run.waiting.unwrap().wait_key;
    let done = target
        .rt
        .resume(&parked.run_id, &key, json!({"text": "Eve"}))
        .unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Eve!"})));
    // Once there, the same archive is refused.
    let e = target.rt.import_runs(&archive).unwrap_err();
    assert_eq!(e.reason_code(), "conflict", "{e}");
}

store_tests!(
    an_exported_run_is_imported_whole_and_runs_on,
    a_fork_from_the_middle_completes_with_another_var,
    prune_deletes_old_finished_trees_and_keeps_what_is_needed,
    prune_keeps_sessions_and_says_why
);

/// A changed ledger is refused, naming what changed, and nothing is
/// written: as an entry whose SHA-256 is not the manifest's, and (the
/// manifest changed to match) as a record whose content is not its hash.
#[test]
fn a_changed_archive_is_refused_naming_what_changed() {
    let (source, parked, archive) = exported();
    let target = Host::new(Backend::Memory);
    // A byte of the ledger changed: CRC and all rewritten by a zip tool.
    let forged = "  if name.endswith('ledger.jsonl'):\n    return data.replace(b'What is your name', b'What is your game')\n  return data";
    let changed = rewrite(&archive, source.dir.path(), forged);
    let e = target.rt.import_runs(&changed).unwrap_err();
    assert!(e.to_string().contains("ledger.jsonl: changed"), "{e}");
    // The manifest's SHA-256 changed to match: the chain says which record.
    let both = "  if name.endswith('ledger.jsonl'):\n    return data.replace(b'What is your name', b'What is your game')\n  if name == 'manifest.json':\n    m = json.loads(data)\n    for f in m['files']:\n      if f['path'].endswith('ledger.jsonl'):\n        d = src.read(f['path']).replace(b'What is your name', b'What is your game')\n        f['sha256'] = hashlib.sha256(d).hexdigest()\n    return json.dumps(m).encode()\n  return data";
    let changed = rewrite(&archive, source.dir.path(), both);
    let e = target.rt.import_runs(&changed).unwrap_err();
    assert!(e.to_string().contains("changed"), "{e}");
    assert!(e.to_string().contains("ledger record 1 ("), "{e}");
    assert!(target.store.load_run(&parked.run_id).unwrap().is_none());
    assert!(target.store.workflow_versions(None).unwrap().is_empty());
    // A state that says completed but still waits (its hash in the
    // manifest made to match): refused, nothing written.
    let odd = r#"  def fix(d):
    return d.replace(b'"status":"waiting"', b'"status":"completed"')
  if name.endswith('state.json'):
    return fix(data)
  if name == 'manifest.json':
    m = json.loads(data)
    for f in m['files']:
      if f['path'].endswith('state.json'):
        d = fix(src.read(f['path']))
        f['sha256'] = hashlib.sha256(d).hexdigest()
        f['size'] = len(d)
    return json.dumps(m).encode()
  return data"#;
    let changed = rewrite(&archive, source.dir.path(), odd);
    let e = target.rt.import_runs(&changed).unwrap_err();
    assert!(
        e.to_string().contains("completed and carries a wait"),
        "{e}"
    );
    assert!(target.store.load_run(&parked.run_id).unwrap().is_none());
}

/// A parent waiting on its child: exported alone it is refused (it would
/// wait for ever there); with its children it imports, and once the child
/// is answered there the driver finishes the parent.
#[test]
fn a_waiting_parent_goes_with_its_children() {
    let source = Host::new(Backend::Sqlite);
    let parent = json!({"workflow_id": "fam", "entry": "child", "nodes": {
        "child": {"effect": "start_subworkflow", "payload": {"workflow_id": "fam.kid"},
                  "result_key": "kid", "next": "done"},
        "done": {"complete": {"$var": "kid.output"}}}});
    let kid = json!({"workflow_id": "fam.kid", "entry": "ask", "nodes": {
        "ask": {"effect": "ask_user", "payload": {"prompt": "?"}, "result_key": "a", "next": "end"},
        "end": {"complete": {"kid": "done"}}}});
    let dir = stepwell_tests::write_bundle(
        source.dir.path(),
        "fam",
        &[("flow.json", parent), ("kid.flow.json", kid)],
    );
    source.rt.deploy(&dir, None).unwrap();
    let run = source.rt.run("fam", StartOptions::default()).unwrap();
    assert_eq!(run.status, RunStatus::Waiting, "{run:?}");
    let target = Host::new(Backend::Json);
    let alone = source.rt.export_run(&run.run_id, false).unwrap();
    let e = target.rt.import_runs(&alone).unwrap_err();
    assert!(e.to_string().contains("--with-children"), "{e}");
    assert!(
        target.store.workflow_versions(None).unwrap().is_empty(),
        "nothing written"
    );
    let whole = source.rt.export_run(&run.run_id, true).unwrap();
    let ids = target.rt.import_runs(&whole).unwrap();
    assert_eq!(ids.len(), 2);
    let child = &ids[1];
    let waiting = target.rt.get_state(child).unwrap();
    let key = waiting.waiting.unwrap().wait_key;
    target
        .rt
        .resume(child, &key, json!({"text": "ok"}))
        .unwrap();
    target.rt.drive_once().unwrap();
    let done = target.rt.get_state(&run.run_id).unwrap();
    assert_eq!(done.output, Some(json!({"kid": "done"})), "{done:?}");
}

/// A bundle of ten chain links (`n0` to `n9`): each counts itself in
/// `vars.i`, the last completes with `{"steps": i}`.
fn ten_links(h: &Host) -> String {
    let mut nodes = serde_json::Map::new();
    let step = stepwell_tests::component("chain/step.wasm");
    for i in 0..10 {
        let node = match i {
            9 => json!({"component": step, "config": {"last": true}}),
            _ => json!({"component": step, "next": format!("n{}", i + 1)}),
        };
        nodes.insert(format!("n{i}"), node);
    }
    let flow = json!({"workflow_id": "ten", "entry": "n0", "nodes": nodes});
    h.load_scratch("ten", &[("flow.json", flow)])
}

fn fork_at(
    h: &Host,
    run_id: &str,
    from: ForkFrom,
    vars: serde_json::Value,
) -> stepwell::Result<Forked> {
    h.rt.fork(
        run_id,
        ForkOptions {
            from,
            vars: stepwell_tests::vars(vars),
            workflow_version: None,
        },
    )
}

/// A fork from the middle of a ten-step run runs the rest again with
/// another var; the points the ledger offers are the ten steps, and a
/// record that is none is refused, naming the nearest.
fn a_fork_from_the_middle_completes_with_another_var(b: Backend) {
    let h = Host::new(b);
    let wf = ten_links(&h);
    let options = StartOptions {
        vars: stepwell_tests::vars(json!({"i": 0, "label": "first",
                                          "service": {"api_key": "sk-kept-out"}})),
        ..StartOptions::default()
    };
    let source = h.rt.run(&wf, options).unwrap();
    assert_eq!(source.output, Some(json!({"steps": 10})));
    let ledger = serde_json::to_string(&h.store.list_records(&source.run_id).unwrap()).unwrap();
    assert!(
        !ledger.contains("sk-kept-out"),
        "the ledger keeps no secret: {ledger}"
    );
    let points = h.rt.fork_points(&source.run_id).unwrap();
    let seqs: Vec<u64> = points.iter().map(|p| p.seq).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    assert!(points.iter().all(|p| p.reproducible), "{points:?}");
    assert_eq!(points[5].node_id, "n5");

    let forked = fork_at(&h, &source.run_id, ForkFrom::Seq(6), json!({"i": 100})).unwrap();
    assert_ne!(forked.run_id, source.run_id);
    assert_eq!((forked.seq, forked.node_id.as_str()), (Some(6), "n5"));
    let done = h.rt.tick(&forked.run_id).unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.output, Some(json!({"steps": 105})), "i was 100 at n5");
    assert_eq!(
        done.vars["label"], "first",
        "the vars of that point, patched"
    );
    assert_eq!(
        done.vars["service"]["api_key"], "sk-kept-out",
        "secrets from the source"
    );
    let ledger = h.store.list_records(&forked.run_id).unwrap();
    let from = &ledger[0].result.as_ref().unwrap()["forked_from"];
    assert_eq!(from["run"], source.run_id.as_str());
    assert_eq!(
        (from["seq"].clone(), from["node"].clone()),
        (json!(6), json!("n5"))
    );
    assert_eq!(done.vars["_meta"]["forked_from"], *from);
    let nodes: Vec<_> = ledger[1..]
        .iter()
        .filter_map(|r| r.node_id.clone())
        .collect();
    assert_eq!(nodes, ["n5", "n6", "n7", "n8", "n9"]);
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
    // The source is untouched; the fork of the start runs it all again.
    assert_eq!(h.store.list_records(&source.run_id).unwrap().len(), 10);
    let again = fork_at(&h, &source.run_id, ForkFrom::Start, json!({})).unwrap();
    let again = h.rt.tick(&again.run_id).unwrap();
    assert_eq!(again.output, Some(json!({"steps": 10})));

    for (seq, says) in [(0, "records 1 to 10"), (11, "records 1 to 10")] {
        let e = fork_at(&h, &source.run_id, ForkFrom::Seq(seq), json!({})).unwrap_err();
        assert_eq!(e.reason_code(), "not_forkable", "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    let e = fork_at(
        &h,
        &source.run_id,
        ForkFrom::Seq(3),
        json!({"_runtime": {}}),
    )
    .unwrap_err();
    assert_eq!(e.reason_code(), "invalid_input", "{e}");
}

/// The vars a fork starts with come from the ledger across a wait and its
/// resume, a snapshot restored and a child's output; a point between an
/// effect's records is refused, naming the points around it.
#[test]
fn a_fork_rebuilds_vars_across_waits_restores_and_children() {
    let h = Host::new(Backend::Sqlite);
    let wf = h.load("ask-user");
    let parked = h.rt.run(&wf, StartOptions::default()).unwrap();
    let snaps = stepwell::store::MemorySnapshotStore::new();
    let snap =
        h.rt.create_snapshot(&snaps, &parked.run_id, "asked", "", vec![])
            .unwrap();
    let key = parked.waiting.as_ref().unwrap().wait_key.clone();
    h.rt.resume(&parked.run_id, &key, json!({"text": "Ann"}))
        .unwrap();
    h.rt.restore_snapshot(&snaps, &snap.snapshot_id).unwrap();
    let done =
        h.rt.resume(&parked.run_id, &key, json!({"text": "Eve"}))
            .unwrap();
    assert_eq!(done.output, Some(json!({"greeting": "Hello, Eve!"})));

    let points = h.rt.fork_points(&parked.run_id).unwrap();
    let at: Vec<(u64, &str)> = points.iter().map(|p| (p.seq, p.node_id.as_str())).collect();
    assert_eq!(at, [(1, "ask"), (4, "greet"), (7, "greet")]);
    assert!(points.iter().all(|p| p.reproducible), "{points:?}");
    // At each greet, the name of the resume before it.
    for (seq, name) in [(4, "Ann"), (7, "Eve")] {
        let f = fork_at(&h, &parked.run_id, ForkFrom::Seq(seq), json!({})).unwrap();
        let out = h.rt.tick(&f.run_id).unwrap().output.unwrap();
        assert_eq!(out["greeting"], format!("Hello, {name}!"));
    }
    let e = fork_at(&h, &parked.run_id, ForkFrom::Seq(2), json!({})).unwrap_err();
    assert_eq!(e.reason_code(), "not_forkable");
    assert!(
        e.to_string().contains("1 (node ask) and 4 (node greet)"),
        "{e}"
    );
    // From the snapshot: the run asks again.
    let f = fork_at(
        &h,
        &parked.run_id,
        ForkFrom::Snapshot(Box::new(snap)),
        json!({}),
    )
    .unwrap();
    let again = h.rt.tick(&f.run_id).unwrap();
    assert_eq!(again.status, RunStatus::Waiting);
    assert!(f.snapshot_id.is_some());

    // A parent's vars hold its child's output, rebuilt from the resume.
    let parent = h.load("subworkflow");
    let options = StartOptions {
        vars: stepwell_tests::vars(json!({"text": "hi"})),
        ..StartOptions::default()
    };
    let run = h.rt.run(&parent, options).unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{:?}", run.error);
    let points = h.rt.fork_points(&run.run_id).unwrap();
    assert!(points.iter().all(|p| p.reproducible), "{points:?}");
    let last = points.last().unwrap();
    assert_eq!(last.node_id, "done");
    let f = fork_at(&h, &run.run_id, ForkFrom::Seq(last.seq), json!({})).unwrap();
    assert_eq!(h.rt.tick(&f.run_id).unwrap().output, run.output);
}

/// A ledger that does not explain the run's vars (as an older stepwell
/// wrote it: no `vars` on its records) offers no point, and a fork is
/// refused; a version that lacks the node is refused too.
#[test]
fn a_fork_refuses_what_the_ledger_cannot_rebuild() {
    let h = Host::new(Backend::Sqlite);
    let wf = ten_links(&h);
    let source = h.rt.run(&wf, StartOptions::default()).unwrap();
    // The same run as an older stepwell left it.
    let mut old = source.clone();
    old.run_id = "written-before-forks".into();
    old.version = 1;
    let records: Vec<_> = h
        .store
        .list_records(&source.run_id)
        .unwrap()
        .into_iter()
        .map(|mut r| {
            r.run_id = old.run_id.clone();
            r.vars = None;
            r.prev_hash = None;
            r.record_hash = None;
            r
        })
        .collect();
    h.store.create_if_absent(&old).unwrap();
    h.store.append_records(&records).unwrap();
    let points = h.rt.fork_points(&old.run_id).unwrap();
    assert_eq!(points.len(), 10);
    assert!(points.iter().all(|p| !p.reproducible), "{points:?}");
    let e = fork_at(&h, &old.run_id, ForkFrom::Seq(5), json!({})).unwrap_err();
    assert_eq!(e.reason_code(), "not_forkable", "{e}");
    assert!(e.to_string().contains("does not reproduce its vars"), "{e}");

    // Version 2 has no n5.
    let flow = json!({"workflow_id": "ten", "entry": "n0", "nodes": {
        "n0": {"component": stepwell_tests::component("chain/step.wasm"), "config": {"last": true}}}});
    h.load_scratch("ten-v2", &[("flow.json", flow)]);
    let e =
        h.rt.fork(
            &source.run_id,
            ForkOptions {
                from: ForkFrom::Seq(6),
                vars: Default::default(),
                workflow_version: Some(2),
            },
        )
        .unwrap_err();
    assert_eq!(e.reason_code(), "upgrade_incompatible", "{e}");
    let f =
        h.rt.fork(
            &source.run_id,
            ForkOptions {
                from: ForkFrom::Start,
                vars: Default::default(),
                workflow_version: Some(2),
            },
        )
        .unwrap();
    let done = h.rt.tick(&f.run_id).unwrap();
    assert_eq!(
        (done.workflow_version, done.output),
        (Some(2), Some(json!({"steps": 1})))
    );
}

/// A patch the host refused (a host-owned var) is not the step's: the
/// failed run can be forked from the step that tried it, with a patch of
/// its own, and a fork of an automation's controller or of nothing is
/// refused.
#[test]
fn a_refused_patch_is_not_rebuilt_and_the_failed_step_can_be_forked() {
    let h = Host::new(Backend::Sqlite);
    let hostile = stepwell_tests::component("runaway/hostile.wasm");
    let flow = json!({"workflow_id": "h", "entry": "n0", "nodes": {
        "n0": {"component": hostile, "config": {"mode": "patch", "patch": {"x": 1}}, "next": "n1"},
        "n1": {"component": hostile, "config": {"mode": "patch", "patch": {"y": 2, "_meta": {}}}, "next": "n2"},
        "n2": {"component": hostile, "config": {"mode": "echo_vars"}}}});
    let wf = h.load_scratch("h", &[("flow.json", flow)]);
    let run = h.rt.run(&wf, StartOptions::default()).unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    assert!(run.vars.get("y").is_none(), "{:?}", run.vars);
    stepwell_tests::assert_forkable(&h.rt, &run.run_id);
    let points = h.rt.fork_points(&run.run_id).unwrap();
    assert_eq!(points.last().unwrap().node_id, "n1");
    let seq = points.last().unwrap().seq;
    let f = fork_at(&h, &run.run_id, ForkFrom::Seq(seq), json!({"z": 3})).unwrap();
    let forked = h.rt.get_state(&f.run_id).unwrap();
    assert_eq!(
        (forked.vars["x"].clone(), forked.vars["z"].clone()),
        (json!(1), json!(3))
    );
    assert!(forked.vars.get("y").is_none());
}

/// Retention: old finished trees go whole (a parent with its child), with
/// their ledgers; a waiting run, the finished child of a parent still
/// waiting, a failed run the policy keeps longer and a recent run stay; a
/// dry run deletes nothing and says the same.
fn prune_deletes_old_finished_trees_and_keeps_what_is_needed(b: Backend) {
    use stepwell::core::retention::{PruneOptions, Retention};
    let clock = stepwell_tests::manual_clock();
    let h = Host::with_clock(b, clock.clone());
    let start = |wf: &str, vars: serde_json::Value| {
        let options = StartOptions {
            vars: stepwell_tests::vars(vars),
            ..StartOptions::default()
        };
        h.rt.run(wf, options).unwrap()
    };
    let hello = start(&h.load("hello"), json!({"name": "old"}));
    let parent = start(&h.load("subworkflow"), json!({"text": "old"}));
    assert_eq!(parent.status, RunStatus::Completed, "{:?}", parent.error);
    let child = parent.vars["child"]["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let asking = start(&h.load("ask-user"), json!({}));
    let flow = json!({"workflow_id": "waits-after-child", "entry": "child", "nodes": {
        "child": {"effect": "start_subworkflow", "payload": {"workflow_id": "hello", "vars": {}},
                  "result_key": "child", "next": "ask"},
        "ask": {"effect": "ask_user", "payload": {"prompt": "go on?"}, "next": "end"},
        "end": {"complete": {}}}});
    let waiting_parent = start(&h.load_scratch("w", &[("flow.json", flow)]), json!({}));
    assert_eq!(waiting_parent.status, RunStatus::Waiting);
    let kept_child = waiting_parent.vars["child"]["sub_run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let failed = start(&h.load("subworkflow"), json!({}));
    assert_eq!(failed.status, RunStatus::Failed);
    clock.advance(chrono::Duration::days(31));
    let recent = start(&h.load("hello"), json!({"name": "new"}));

    let policy = Retention::parse("completed=30d,failed=90d").unwrap();
    let dry =
        h.rt.prune(
            &policy,
            &PruneOptions {
                dry_run: true,
                ..PruneOptions::default()
            },
        )
        .unwrap();
    let roots: Vec<&str> = dry.trees.iter().map(|t| t.run_id.as_str()).collect();
    assert_eq!(
        roots,
        [hello.run_id.as_str(), parent.run_id.as_str()],
        "{dry:?}"
    );
    assert_eq!(dry.trees[1].runs, [parent.run_id.clone(), child.clone()]);
    assert_eq!(dry.runs, 3);
    assert!(dry.records >= 4 && dry.bytes > 0, "{dry:?}");
    assert!(
        h.rt.get_state(&hello.run_id).is_ok(),
        "a dry run deletes nothing"
    );

    let done = h.rt.prune(&policy, &PruneOptions::default()).unwrap();
    assert_eq!(
        (done.runs, done.records, done.bytes),
        (dry.runs, dry.records, dry.bytes)
    );
    for gone in [&hello.run_id, &parent.run_id, &child] {
        let e = h.rt.get_state(gone).unwrap_err();
        assert_eq!(e.reason_code(), "run_not_found", "{gone}: {e}");
        assert!(h.store.list_records(gone).unwrap().is_empty(), "{gone}");
    }
    for kept in [
        &asking.run_id,
        &waiting_parent.run_id,
        &kept_child,
        &failed.run_id,
        &recent.run_id,
    ] {
        h.rt.get_state(kept).unwrap();
        assert!(stepwell::store::verify_chain(&h.store.list_records(kept).unwrap()).is_ok());
    }
    // Nothing more to do.
    let again = h.rt.prune(&policy, &PruneOptions::default()).unwrap();
    assert_eq!(again.runs, 0, "{again:?}");
    // The store deletes all or none: a run that has not ended keeps the
    // others.
    let both = [asking.run_id.clone(), kept_child.clone()];
    assert!(h.store.delete_runs(&both).unwrap().runs.is_empty());
    h.rt.get_state(&kept_child).unwrap();
}

/// A turn of a session stays (its history reads it); on SQLite, the run
/// holding the store's newest ledger row stays until a newer one exists,
/// and the report says why; an archive is written beside, never over,
/// another.
fn prune_keeps_sessions_and_says_why(b: Backend) {
    use stepwell::core::retention::{PruneOptions, Retention};
    let clock = stepwell_tests::manual_clock();
    let h = Host::with_clock(b, clock.clone());
    let hello = h.load("hello");
    let in_session = StartOptions {
        session_id: Some("chat-1".into()),
        ..StartOptions::default()
    };
    let turn = h.rt.run(&hello, in_session).unwrap();
    let plain = h.rt.run(&hello, StartOptions::default()).unwrap();
    clock.advance(chrono::Duration::days(2));
    let policy = Retention::parse("completed=1d").unwrap();
    let archive = h.dir.path().join("archive");
    std::fs::create_dir_all(&archive).unwrap();
    let options = PruneOptions {
        archive: Some(&archive),
        ..PruneOptions::default()
    };
    let report = h.rt.prune(&policy, &options).unwrap();
    let said = |id: &str, what: &str| {
        report
            .kept
            .iter()
            .any(|(k, why)| k == id && why.contains(what))
    };
    assert!(said(&turn.run_id, "session chat-1"), "{report:?}");
    h.rt.get_state(&turn.run_id).unwrap();
    let archived = || std::fs::read_dir(&archive).unwrap().count();
    if b == Backend::Sqlite {
        // `plain` holds the newest row: kept, and said so.
        assert_eq!(report.runs, 0, "{report:?}");
        assert!(said(&plain.run_id, "newest ledger row"), "{report:?}");
        h.rt.get_state(&plain.run_id).unwrap();
        h.rt.run(&hello, StartOptions::default()).unwrap();
        let again = h.rt.prune(&policy, &options).unwrap();
        assert_eq!(again.runs, 1, "{again:?}");
        assert_eq!(archived(), 2, "the second archive beside the first");
    } else {
        assert_eq!(report.runs, 1, "{report:?}");
        assert_eq!(archived(), 1);
    }
    let e = h.rt.get_state(&plain.run_id).unwrap_err();
    assert_eq!(e.reason_code(), "run_not_found");
}

/// Retention deletes the artifacts of the runs it deleted (values large
/// enough to be kept by reference), but not one a kept run names too (the
/// same content, stored once), nor anything while the policy says nothing
/// is old; a dry run counts them and deletes none.
#[test]
fn prune_deletes_the_artifacts_only_deleted_runs_named() {
    use stepwell::core::retention::{PruneOptions, Retention};
    use stepwell::store::{ArtifactStore, FileArtifactStore};
    let clock = stepwell_tests::manual_clock();
    let h = Host::with_clock(Backend::Sqlite, clock.clone());
    let files = Arc::new(FileArtifactStore::open(h.dir.path().join("artifacts")).unwrap());
    let rt = stepwell::builder(h.store.clone())
        .engine(h.rt.engine().clone())
        .clock(clock.clone() as Arc<dyn stepwell::Clock>)
        .artifacts(files.clone(), 64)
        .build()
        .unwrap();
    let hello = rt.load_bundle(&example("hello")).unwrap().main_workflow_id;
    let start = |name: &str, big: &str| {
        let options = StartOptions {
            vars: stepwell_tests::vars(json!({"name": name, "big": big.repeat(100)})),
            ..StartOptions::default()
        };
        let run = rt.run(&hello, options).unwrap();
        assert_eq!(run.status, RunStatus::Completed);
        run.run_id
    };
    let only_old = start("a", "x");
    let shared = start("b", "y");
    let stored = |id: &str| -> Vec<String> {
        files
            .list()
            .unwrap()
            .into_iter()
            .filter(|m| m.run_id.as_deref() == Some(id))
            .map(|m| m.artifact_id)
            .collect()
    };
    let (x, y) = (stored(&only_old), stored(&shared));
    assert!(
        !x.is_empty() && !y.is_empty(),
        "the big vars went by reference"
    );
    clock.advance(chrono::Duration::days(31));
    let kept = start("c", "y");
    let policy = Retention::parse("completed=30d").unwrap();
    let now = PruneOptions {
        artifact_grace: Some(std::time::Duration::ZERO),
        ..PruneOptions::default()
    };
    let dry = rt
        .prune(
            &policy,
            &PruneOptions {
                dry_run: true,
                ..now
            },
        )
        .unwrap();
    assert_eq!(dry.runs, 2, "{dry:?}");
    assert!(
        files.get(&x[0]).unwrap().is_some(),
        "a dry run deletes nothing"
    );
    let archive = h.dir.path().join("archive");
    std::fs::create_dir_all(&archive).unwrap();
    let done = rt
        .prune(
            &policy,
            &PruneOptions {
                archive: Some(&archive),
                ..now
            },
        )
        .unwrap();
    assert_eq!(done.runs, 2, "{done:?}");
    for id in &x {
        let saved = std::fs::read(archive.join("artifacts").join(id)).unwrap();
        assert_eq!(
            stepwell::store::artifacts::artifact_id(&saved),
            *id,
            "archived before it went"
        );
    }
    assert_eq!(
        (done.artifacts, done.artifact_bytes),
        (dry.artifacts, dry.artifact_bytes),
        "the dry run said what would go"
    );
    // What the kept run names, as stored: its state and its ledger.
    let mut raw = serde_json::to_string(&h.store.load_run(&kept).unwrap().unwrap()).unwrap();
    raw += &serde_json::to_string(&h.store.list_records(&kept).unwrap()).unwrap();
    let mut shared = 0;
    for id in x.iter().chain(&y) {
        let named = raw.contains(&format!("{{\"$artifact\":\"{id}\"}}"));
        shared += usize::from(named);
        assert_eq!(
            files.get(id).unwrap().is_some(),
            named,
            "{id}: stays only if the kept run names it"
        );
    }
    assert!(
        shared > 0,
        "the kept run's big var is the deleted one's content"
    );
    assert_eq!(done.artifacts as usize, x.len() + y.len() - shared);
    // The kept run reads its value back whole.
    let state = rt.get_state(&kept).unwrap();
    assert_eq!(state.vars["big"], json!("y".repeat(100)));
    let again = rt.prune(&policy, &now).unwrap();
    assert_eq!(again.artifacts, 0, "{again:?}");
}

/// A checkpoint in the ledger of a run retention never compacts (any run
/// but an automation's controller) is refused by the runtime's check,
/// sealed or not: removing a run's oldest records still breaks its chain.
#[test]
fn a_checkpoint_on_a_run_never_compacted_does_not_verify() {
    use stepwell::store::compaction::{checkpoint_record, CheckpointBody};
    let h = Host::new(Backend::Sqlite);
    let wf = ten_links(&h);
    let run = h.rt.run(&wf, StartOptions::default()).unwrap();
    let records = h.store.list_records(&run.run_id).unwrap();
    assert!(records.len() > 3);
    let body = CheckpointBody {
        through_seq: 2,
        replaced_records: 2,
        replaced_head: records[1].record_hash.clone().unwrap(),
        compacted_at: "2026-12-06T00:00:00.000000+00:00".into(),
        carried: vec![],
    };
    let checkpoint = checkpoint_record(&run.run_id, &body);
    h.store.compact_ledger(&run.run_id, 2, &checkpoint).unwrap();
    assert!(stepwell::store::verify_chain(&h.store.list_records(&run.run_id).unwrap()).is_ok());
    let check = h.rt.check_ledger(&run.run_id).unwrap();
    let b = check.verdict.unwrap_err();
    assert_eq!(
        (b.index, b.problem),
        (1, "checkpoint of a run never compacted")
    );
}

//! A run's history as one file: exported from SQLite, imported into every
//! store with its chain intact, run on there; a changed archive refused,
//! naming what changed.

use std::process::Command;

use serde_json::json;
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

store_tests!(an_exported_run_is_imported_whole_and_runs_on);

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

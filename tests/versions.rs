//! Deployments and versions on every store: a run keeps the code it
//! started with, whatever is deployed since and whatever its bundle
//! directory holds; children of its bundle run its version; upgrades are
//! checked and recorded; prune removes only what nothing needs.

use serde_json::{json, Value};
use stepwell::core::versions::UpgradeTo;
use stepwell::{RunStatus, StartOptions};
use stepwell_tests::{store_tests, write_bundle, Backend, Host};

/// A flow that asks a person at `ask`, then completes at `done` with
/// `{"v": tag}`.
fn asker(tag: u32) -> Value {
    json!({"workflow_id": "pinned", "entry": "ask", "nodes": {
        "ask": {"effect": "ask_user", "payload": {"prompt": "go?"}, "result_key": "answer",
                "next": "done"},
        "done": {"complete": {"v": tag}}}})
}

/// The same flow without its `ask` node (it starts at `done`).
fn without_ask() -> Value {
    json!({"workflow_id": "pinned", "entry": "done", "nodes": {
        "done": {"complete": {"v": 3}}}})
}

fn start(h: &Host) -> stepwell::RunState {
    let run = h.rt.run("pinned", StartOptions::default()).unwrap();
    assert_eq!(run.status, RunStatus::Waiting);
    run
}

fn answer(rt: &stepwell::Runtime, run: &stepwell::RunState) -> stepwell::RunState {
    let key = run.waiting.as_ref().unwrap().wait_key.clone();
    rt.resume(&run.run_id, &key, json!({"text": "yes"}))
        .unwrap()
}

fn resumes_run_the_version_their_run_started_on(b: Backend) {
    let h = Host::new(b);
    let dir = write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(1))]);
    let d1 = h.rt.deploy(&dir, Some("test")).unwrap();
    assert_eq!(d1.workflows[0].version.version, 1);
    assert!(h.rt.deploy(&dir, None).unwrap().unchanged(), "no-op");
    let parked: Vec<_> = (0..3).map(|_| start(&h)).collect();
    assert!(parked.iter().all(|r| r.workflow_version == Some(1)));
    // v2 changes the second node; the directory now holds it.
    write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(2))]);
    assert_eq!(
        h.rt.deploy(&dir, None).unwrap().workflows[0]
            .version
            .version,
        2
    );
    // This runtime, and another process's (nothing loaded), resume on v1.
    let done = answer(&h.rt, &parked[0]);
    assert_eq!(
        (done.output.clone().unwrap(), done.workflow_version),
        (json!({"v": 1}), Some(1))
    );
    let other = h.runtime(None, Default::default());
    assert_eq!(answer(&other, &parked[1]).output.unwrap(), json!({"v": 1}));
    // The directory edited again, then gone: still v1.
    write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(9))]);
    std::fs::remove_dir_all(&dir).unwrap();
    let third = h.runtime(None, Default::default());
    assert_eq!(answer(&third, &parked[2]).output.unwrap(), json!({"v": 1}));
    // A new run starts on the latest: v2.
    let new = start(&h);
    assert_eq!(new.workflow_version, Some(2));
    assert_eq!(answer(&other, &new).output.unwrap(), json!({"v": 2}));
}

fn upgrades_are_checked_and_recorded(b: Backend) {
    let h = Host::new(b);
    let dir = write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(1))]);
    h.rt.deploy(&dir, None).unwrap();
    let (a, c) = (start(&h), start(&h));
    write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(2))]);
    h.rt.deploy(&dir, None).unwrap();
    write_bundle(h.dir.path(), "pinned", &[("flow.json", without_ask())]);
    h.rt.deploy(&dir, None).unwrap();
    // v3 has no `ask`: refused, dry or not, naming it; nothing changes.
    for dry in [true, false] {
        let e = h.rt.upgrade(&a.run_id, UpgradeTo::Latest, dry).unwrap_err();
        assert_eq!(e.reason_code(), "upgrade_incompatible", "{e}");
        assert!(e.to_string().contains("ask"), "{e}");
    }
    assert_eq!(h.rt.get_state(&a.run_id).unwrap().version, a.version);
    let dry =
        h.rt.upgrade(&a.run_id, UpgradeTo::Version(2), true)
            .unwrap();
    assert_eq!((dry.from, dry.to, dry.moved), (Some(1), 2, false));
    assert_eq!(h.rt.get_state(&a.run_id).unwrap().workflow_version, Some(1));
    let moved =
        h.rt.upgrade(&a.run_id, UpgradeTo::Version(2), false)
            .unwrap();
    assert!(moved.moved);
    let ledger = h.rt.get_ledger(&a.run_id).unwrap();
    let last = ledger.last().unwrap();
    assert_eq!(last.result, Some(json!({"upgraded": {"from": 1, "to": 2}})));
    let after = h.rt.get_state(&a.run_id).unwrap();
    assert_eq!(after.workflow_version, Some(2));
    assert_eq!(answer(&h.rt, &after).output.unwrap(), json!({"v": 2}));
    // An ended run and an unknown version are refused.
    let e =
        h.rt.upgrade(&a.run_id, UpgradeTo::Version(1), false)
            .unwrap_err();
    assert_eq!(e.reason_code(), "invalid_input", "{e}");
    let e =
        h.rt.upgrade(&c.run_id, UpgradeTo::Version(7), false)
            .unwrap_err();
    assert_eq!(e.reason_code(), "unknown_version", "{e}");
    // Runs per version: c waits on v1, a completed on v2.
    let uses = h.store.version_use("pinned").unwrap();
    let got: Vec<_> = uses.iter().map(|u| (u.version, u.status, u.runs)).collect();
    assert_eq!(
        got,
        [
            (Some(1), RunStatus::Waiting, 1),
            (Some(2), RunStatus::Completed, 1)
        ]
    );
    // Prune: v1 is c's, v3 the latest; v2 only a finished run's.
    let kept_recent =
        h.rt.prune_versions(Some("pinned"), Some("2000-01-01T00:00:00Z"), true);
    assert!(
        kept_recent.unwrap().is_empty(),
        "v2 ended within the retention"
    );
    let gone = h.rt.prune_versions(Some("pinned"), None, false).unwrap();
    assert_eq!(gone.iter().map(|v| v.version).collect::<Vec<_>>(), [2]);
    let left: Vec<u32> = h
        .store
        .workflow_versions(Some("pinned"))
        .unwrap()
        .iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(left, [1, 3]);
    assert_eq!(answer(&h.rt, &c).output.unwrap(), json!({"v": 1}));
}

fn children_of_the_bundle_run_their_parents_version(b: Backend) {
    let h = Host::new(b);
    let parent = json!({"workflow_id": "parent", "entry": "ask", "nodes": {
        "ask": {"effect": "ask_user", "payload": {"prompt": "go?"}, "next": "child"},
        "child": {"effect": "start_subworkflow", "payload": {"workflow_id": "kid"},
                  "result_key": "kid", "next": "done"},
        "done": {"complete": {"$var": "kid.output"}}}});
    let kid = |tag: u32| {
        json!({"workflow_id": "kid", "entry": "end", "nodes": {
        "end": {"complete": {"kid": tag}}}})
    };
    let dir = write_bundle(
        h.dir.path(),
        "family",
        &[("flow.json", parent.clone()), ("kid.flow.json", kid(1))],
    );
    h.rt.deploy(&dir, None).unwrap();
    let run = h.rt.run("parent", StartOptions::default()).unwrap();
    write_bundle(h.dir.path(), "family", &[("kid.flow.json", kid(2))]);
    let d2 = h.rt.deploy(&dir, None).unwrap();
    assert!(d2.workflows.iter().all(|w| w.version.version == 2));
    // The child's v1 has no run, but its bundle is the waiting parent's:
    // a prune keeps it, and the child started next runs it.
    let gone = h.rt.prune_versions(None, None, false).unwrap();
    assert!(gone.is_empty(), "{gone:?}");
    let done = answer(&h.rt, &run);
    assert_eq!(done.output, Some(json!({"kid": 1})), "{done:?}");
    let child = h
        .store
        .list_runs(&stepwell::RunQuery {
            parent_run_id: Some(run.run_id.clone()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(child.len(), 1);
    assert_eq!(child[0].workflow_version, Some(1));
    assert_eq!(child[0].output, Some(json!({"kid": 1})));
    // A new parent (v2) starts a v2 child.
    let run = h.rt.run("parent", StartOptions::default()).unwrap();
    answer(&h.rt, &run);
    let kids = h
        .store
        .list_runs(&stepwell::RunQuery {
            parent_run_id: Some(run.run_id.clone()),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(kids[0].workflow_version, Some(2));
    assert_eq!(kids[0].output, Some(json!({"kid": 2})));
}

fn a_snapshot_restores_its_version_and_says_so(b: Backend) {
    let h = Host::new(b);
    let snapshots = stepwell::store::MemorySnapshotStore::default();
    let dir = write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(1))]);
    h.rt.deploy(&dir, None).unwrap();
    let run = start(&h);
    let snap =
        h.rt.create_snapshot(&snapshots, &run.run_id, "before", "", vec![])
            .unwrap();
    write_bundle(h.dir.path(), "pinned", &[("flow.json", asker(2))]);
    h.rt.deploy(&dir, None).unwrap();
    h.rt.upgrade(&run.run_id, UpgradeTo::Version(2), false)
        .unwrap();
    // Back to the snapshot: version 1 again, and the record says so.
    let restored =
        h.rt.restore_snapshot(&snapshots, &snap.snapshot_id)
            .unwrap();
    assert_eq!(restored.workflow_version, Some(1));
    let last = h.rt.get_ledger(&run.run_id).unwrap().pop().unwrap();
    assert_eq!(
        last.result.unwrap()["restored"]["workflow_version"],
        json!({"from": 2, "to": 1})
    );
    // With version 1 gone from the store, the restore is refused.
    h.rt.upgrade(&run.run_id, UpgradeTo::Version(2), false)
        .unwrap();
    let v1 = h
        .store
        .workflow_version("pinned", Some(1))
        .unwrap()
        .unwrap();
    h.store.remove_versions(&[v1]).unwrap();
    let e =
        h.rt.restore_snapshot(&snapshots, &snap.snapshot_id)
            .unwrap_err();
    assert_eq!(e.reason_code(), "unknown_version", "{e}");
    assert_eq!(
        h.rt.get_state(&run.run_id).unwrap().workflow_version,
        Some(2)
    );
}

store_tests!(
    a_snapshot_restores_its_version_and_says_so,
    resumes_run_the_version_their_run_started_on,
    upgrades_are_checked_and_recorded,
    children_of_the_bundle_run_their_parents_version,
);

//! The checks of the suite, one public function each. Each takes the
//! [`Harness`] of the backend under test and a fresh, empty directory, and
//! panics on the first promise the store breaks; [`super::run`] names the
//! check and the backend in the failure.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::fixtures::{
    at, command, event, fence, indexed, lease, record, run, save, waiting, ColumnsIndex, RootsIndex,
};
use super::{Harness, Verdict};
use crate::{Claim, LeaseAfter, LeaseRequest, RunQuery, StoreError};
use stepwell_model::model::{RunState, RunStatus, StepRecord, StepStatus, WaitReason};

fn ids(runs: Vec<RunState>) -> Vec<String> {
    runs.into_iter().map(|r| r.run_id).collect()
}

/// The error of a write the store must refuse as a conflict.
fn refused<T: std::fmt::Debug>(write: Result<T, StoreError>) -> StoreError {
    let err = write.expect_err("the store accepted a write it must refuse");
    assert_eq!(err.code, "conflict", "{err}");
    err
}

/// The verdict on a check of what the store says it does not keep (the
/// event inbox and the trigger connections are optional).
fn unsupported(e: StoreError) -> Verdict {
    Verdict::Skipped(format!("the store says: {e}"))
}

fn no_command_store() -> Verdict {
    Verdict::Skipped("the harness has no command store (Harness::commands)".into())
}

/// A created run loads back as it was; a commit replaces it with the next
/// version, and the run is listed.
pub fn runs_load_and_commit(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    assert_eq!(store.load_run("r1").unwrap(), None);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    assert_eq!(store.load_run("r1").unwrap(), Some(r.clone()));
    r.status = RunStatus::Completed;
    r.output = Some(json!({"ok": true}));
    r.current_node = None;
    save(&*store, &[], &mut r, 1);
    assert_eq!(store.load_run("r1").unwrap(), Some(r.clone()));
    assert_eq!(store.load_run("r1").unwrap().unwrap().version, 2);
    assert_eq!(ids(store.list_runs(&RunQuery::default()).unwrap()), ["r1"]);
    Verdict::Passed
}

/// `create_if_absent` creates a run once: creating the same id again
/// returns the stored run untouched.
pub fn create_if_absent_never_overwrites(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let first = run("r1", "wf");
    let (stored, created) = store.create_if_absent(&first).unwrap();
    assert!(created);
    assert_eq!(stored, first);
    let mut other = run("r1", "another");
    other.vars.insert("n".into(), json!(2));
    let (stored, created) = store.create_if_absent(&other).unwrap();
    assert!(!created);
    assert_eq!(stored, first, "the existing run is returned untouched");
    assert_eq!(store.load_run("r1").unwrap(), Some(first));
    Verdict::Passed
}

/// A commit lands only on the version its fence read, and saves the next
/// one; a writer that lost writes nothing, neither its run nor its records;
/// version 0 creates, once; appends ahead are fenced the same way.
pub fn a_commit_lands_only_on_the_version_it_read(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    r.current_node = Some("b".into());
    save(&*store, &[record("r1", 1, None)], &mut r, 1);
    // A second writer that also read version 1 loses, and writes nothing:
    // neither its run nor its records.
    let mut late = run("r1", "wf");
    late.current_node = Some("z".into());
    late.version = 2;
    let err = refused(store.commit(
        &[record("r1", 2, Some("r1:terminal"))],
        &late,
        fence(1, None),
        LeaseAfter::Release,
    ));
    assert!(err.message.contains("version 2"), "{err}");
    assert_eq!(store.load_run("r1").unwrap(), Some(r.clone()));
    assert_eq!(store.list_records("r1").unwrap().len(), 1);
    // A commit must save the next version.
    let mut skip = r.clone();
    skip.version = 9;
    refused(store.commit(&[], &skip, fence(2, None), LeaseAfter::Release));
    // Version 0 creates, and only once.
    let mut fresh = run("r2", "wf");
    store
        .commit(
            &[record("r2", 1, None)],
            &fresh,
            fence(0, None),
            LeaseAfter::Release,
        )
        .unwrap();
    assert_eq!(store.load_run("r2").unwrap().unwrap().version, 1);
    fresh.current_node = Some("again".into());
    refused(store.commit(
        &[record("r2", 2, None)],
        &fresh,
        fence(0, None),
        LeaseAfter::Release,
    ));
    assert_eq!(store.list_records("r2").unwrap().len(), 1);
    // Appends ahead are fenced the same way.
    refused(store.append_ahead(&[record("r1", 5, None)], fence(1, None)));
    store
        .append_ahead(&[record("r1", 5, None)], fence(2, None))
        .unwrap();
    assert_eq!(store.list_records("r1").unwrap().len(), 2);
    Verdict::Passed
}

/// A lease keeps other holders' claims and writes out until it lapses, is
/// released, or its holder is known dead; a holder stalled past its lease
/// can no longer write.
pub fn a_lease_excludes_other_holders_until_it_lapses(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    let t0 = "2026-11-30T09:00:00Z";
    let t1 = "2026-11-30T09:00:30Z";
    let held = store.claim("r1", &lease("A", t0, t1)).unwrap();
    assert!(
        matches!(held, Claim::Held(ref run) if run.version == 1),
        "{held:?}"
    );
    // B is kept out while A's lease lives; A may claim again.
    match store.claim("r1", &lease("B", t0, t1)).unwrap() {
        Claim::Busy { holder, until } => {
            assert_eq!(holder.as_deref(), Some("A"));
            assert!(until.unwrap().starts_with("2026-11-30T09:00:30"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.claim("r1", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A write fenced with B's name does not land; A's does, and keeps the
    // lease renewed.
    r.version = 2;
    refused(store.commit(&[], &r, fence(1, Some("B")), LeaseAfter::Release));
    store
        .commit(
            &[record("r1", 1, None)],
            &r,
            fence(1, Some("A")),
            LeaseAfter::Renew(at(t1)),
        )
        .unwrap();
    assert!(matches!(
        store.claim("r1", &lease("B", t0, t1)).unwrap(),
        Claim::Busy { .. }
    ));
    // Renewing by someone else changes nothing; A's lease lapses at t1 and
    // B takes the run over.
    store
        .renew("B", &["r1".into()], at("2026-11-30T10:00:00Z"))
        .unwrap();
    let later = "2026-11-30T09:00:31Z";
    assert!(matches!(
        store
            .claim("r1", &lease("B", later, "2026-11-30T09:01:00Z"))
            .unwrap(),
        Claim::Held(_)
    ));
    // A, stalled past its lease, can no longer write: not its run, not
    // ahead of it.
    r.version = 3;
    refused(store.commit(
        &[record("r1", 2, None)],
        &r,
        fence(2, Some("A")),
        LeaseAfter::Release,
    ));
    refused(store.append_ahead(&[record("r1", 2, None)], fence(2, Some("A"))));
    assert_eq!(store.list_records("r1").unwrap().len(), 1);
    // Releasing by a non-holder does nothing; B's release frees the run.
    store.release("r1", "A").unwrap();
    assert!(matches!(
        store.claim("r1", &lease("C", later, later)).unwrap(),
        Claim::Busy { .. }
    ));
    store.release("r1", "B").unwrap();
    assert!(matches!(
        store.claim("r1", &lease("C", later, later)).unwrap(),
        Claim::Held(_)
    ));
    assert!(matches!(
        store.claim("nobody", &lease("C", later, later)).unwrap(),
        Claim::Missing
    ));
    // A holder known to be dead loses its lease at once, and only it.
    let dead_c = LeaseRequest {
        dead_holder: Some("C"),
        ..lease("D", later, later)
    };
    assert!(matches!(
        store.claim("r1", &dead_c).unwrap(),
        Claim::Held(_)
    ));
    assert!(
        matches!(store.claim("r1", &dead_c).unwrap(), Claim::Held(_)),
        "D holds it now"
    );
    let dead_x = LeaseRequest {
        dead_holder: Some("X"),
        ..lease("E", later, later)
    };
    assert!(matches!(
        store.claim("r1", &dead_x).unwrap(),
        Claim::Busy { .. }
    ));
    Verdict::Passed
}

/// An unleased write (a cancel) lands whoever holds the lease, and clears
/// it: the holder's next write fails.
pub fn a_fence_without_a_holder_lands_and_clears_the_lease(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    let (t0, t1) = ("2026-11-30T09:00:00Z", "2026-11-30T09:00:30Z");
    assert!(matches!(
        store.claim("r1", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A cancel: lands whoever holds the lease, and clears it.
    r.status = RunStatus::Cancelled;
    save(&*store, &[], &mut r, 1);
    assert!(matches!(
        store.claim("r1", &lease("B", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A's next write fails.
    let mut a = r.clone();
    a.version = 3;
    refused(store.commit(&[], &a, fence(2, Some("A")), LeaseAfter::Release));
    Verdict::Passed
}

/// `run_status` is the stored run's status (none for an unknown run), a
/// cancel included.
pub fn run_status_is_the_stored_status(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    assert_eq!(store.run_status("r1").unwrap(), None);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    assert_eq!(store.run_status("r1").unwrap(), Some(RunStatus::Running));
    r.status = RunStatus::Cancelled;
    save(&*store, &[], &mut r, 1);
    assert_eq!(store.run_status("r1").unwrap(), Some(RunStatus::Cancelled));
    Verdict::Passed
}

/// `list_runs` keeps the creation order and filters by status, wait reason,
/// wait key, workflow and parent, up to a limit.
pub fn list_runs_filters_orders_and_limits(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut child = run("c", "wf.child");
    child.parent_run_id = Some("a".into());
    let all = [
        run("a", "wf"),
        waiting(run("b", "wf"), WaitReason::User, "ask:1", None),
        child,
        waiting(run("d", "other"), WaitReason::Event, "order.paid", None),
        waiting(run("e", "wf"), WaitReason::Event, "other.key", None),
    ];
    for r in &all {
        store.create_if_absent(r).unwrap();
    }
    // An update keeps the creation order.
    let mut a = all[0].clone();
    a.status = RunStatus::Completed;
    save(&*store, &[], &mut a, 1);
    let q = |q: RunQuery| ids(store.list_runs(&q).unwrap());
    assert_eq!(q(RunQuery::default()), ["a", "b", "c", "d", "e"]);
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Waiting),
            ..Default::default()
        }),
        ["b", "d", "e"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Completed),
            ..Default::default()
        }),
        ["a"]
    );
    assert_eq!(
        q(RunQuery {
            wait_reason: Some(WaitReason::Event),
            ..Default::default()
        }),
        ["d", "e"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Waiting),
            wait_reason: Some(WaitReason::Event),
            wait_key: Some("order.paid".into()),
            ..Default::default()
        }),
        ["d"]
    );
    assert_eq!(
        q(RunQuery {
            workflow_id: Some("wf".into()),
            ..Default::default()
        }),
        ["a", "b", "e"]
    );
    assert_eq!(
        q(RunQuery {
            parent_run_id: Some("a".into()),
            ..Default::default()
        }),
        ["c"]
    );
    assert_eq!(
        q(RunQuery {
            limit: Some(2),
            ..Default::default()
        }),
        ["a", "b"]
    );
    assert_eq!(
        q(RunQuery {
            status: Some(RunStatus::Cancelled),
            ..Default::default()
        }),
        Vec::<String>::new()
    );
    Verdict::Passed
}

/// `list_due` lists the waits whose time has come, time waits and event
/// waits with a deadline, earliest first; a run that stopped waiting is no
/// longer due.
pub fn due_waits_include_deadline_carrying_event_waits(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let runs = [
        waiting(
            run("late-until", "wf"),
            WaitReason::Until,
            "until:x",
            Some("2026-11-30T10:00:00.000000Z"),
        ),
        waiting(
            run("early-until", "wf"),
            WaitReason::Until,
            "until:y",
            Some("2026-11-30T08:00:00.000000Z"),
        ),
        waiting(
            run("event-deadline", "wf"),
            WaitReason::Event,
            "k",
            Some("2026-11-30T09:00:00.000000Z"),
        ),
        waiting(run("event-open", "wf"), WaitReason::Event, "k", None),
        waiting(run("user", "wf"), WaitReason::User, "ask", None),
        waiting(
            run("future", "wf"),
            WaitReason::Until,
            "until:z",
            Some("2026-12-01T00:00:00.000000Z"),
        ),
    ];
    for r in &runs {
        store.create_if_absent(r).unwrap();
    }
    let now = at("2026-11-30T10:00:00Z");
    assert_eq!(
        store.list_due(now, 100).unwrap(),
        ["early-until", "event-deadline", "late-until"]
    );
    assert_eq!(
        store.list_due(now, 2).unwrap(),
        ["early-until", "event-deadline"]
    );
    // A run that stopped waiting is no longer due.
    let mut moved = runs[1].clone();
    moved.status = RunStatus::Running;
    moved.waiting = None;
    save(&*store, &[], &mut moved, 1);
    assert_eq!(
        store.list_due(now, 100).unwrap(),
        ["event-deadline", "late-until"]
    );
    Verdict::Passed
}

/// `list_claimable` lists the running runs no live lease holds;
/// `list_leased` lists the leased ones with their holders.
pub fn claimable_runs_are_running_and_unleased(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    for r in [
        run("free", "wf"),
        run("held", "wf"),
        run("lapsed", "wf"),
        waiting(run("parked", "wf"), WaitReason::User, "k", None),
    ] {
        store.create_if_absent(&r).unwrap();
    }
    let now = "2026-11-30T09:00:00Z";
    store
        .claim("held", &lease("A", now, "2026-11-30T09:10:00Z"))
        .unwrap();
    store
        .claim("lapsed", &lease("A", now, "2026-11-30T09:00:05Z"))
        .unwrap();
    assert_eq!(
        store
            .list_claimable(at("2026-11-30T09:00:10Z"), 100)
            .unwrap(),
        ["free", "lapsed"]
    );
    assert_eq!(store.list_claimable(at(now), 100).unwrap(), ["free"]);
    assert_eq!(
        store.list_claimable(at(now), 0).unwrap(),
        Vec::<String>::new()
    );
    let leased = |id: &str| (id.to_string(), "A".to_string());
    assert_eq!(
        store.list_leased(100).unwrap(),
        [leased("held"), leased("lapsed")]
    );
    assert_eq!(store.list_leased(1).unwrap(), [leased("held")]);
    Verdict::Passed
}

/// A deferred run is not listed before its time, and after it comes after
/// the runs never deferred; deferrals are counted, keep the last reason,
/// and end with the run's next commit.
pub fn deferred_runs_are_listed_after_their_time_and_last(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    for r in [
        run("a", "wf"),
        run("b", "wf"),
        run("c", "wf"),
        waiting(
            run("due", "wf"),
            WaitReason::Until,
            "u",
            Some("2026-11-30T08:00:00Z"),
        ),
    ] {
        store.create_if_absent(&r).unwrap();
    }
    let now = at("2026-11-30T09:00:00Z");
    let later = at("2026-11-30T09:05:00Z");
    // Set aside for five minutes: not listed before then.
    let count = store
        .defer("a", None, &|n| {
            later + chrono::Duration::seconds(n as i64 - 1)
        })
        .unwrap();
    assert_eq!(count, 1);
    let first = store.deferral("a").unwrap().unwrap();
    assert_eq!((first.until, first.count, first.reason), (later, 1, None));
    assert_eq!(
        store
            .defer("a", Some("boom: the trigger"), &|_| later)
            .unwrap(),
        2,
        "counted"
    );
    // The reason is the last deferral's.
    let held = store.deferral("a").unwrap().unwrap();
    assert_eq!(held.count, 2);
    assert_eq!(held.reason.as_deref(), Some("boom: the trigger"));
    assert_eq!(store.deferred_until("a").unwrap(), Some(later));
    assert_eq!(store.defer("due", None, &|_| later).unwrap(), 1);
    assert_eq!(store.defer("nobody", None, &|_| later).unwrap(), 0);
    assert_eq!(store.deferral("nobody").unwrap(), None);
    assert_eq!(store.deferral("c").unwrap(), None);
    assert_eq!(store.list_claimable(now, 100).unwrap(), ["b", "c"]);
    assert!(store.list_due(now, 100).unwrap().is_empty());
    // After its time, a deferred run comes after the never-deferred ones,
    // and among deferred ones the earliest first.
    store.defer("b", None, &|_| now).unwrap();
    assert_eq!(store.list_claimable(later, 100).unwrap(), ["c", "b", "a"]);
    assert_eq!(store.list_due(later, 100).unwrap(), ["due"]);
    // A commit ends the deferral, its count and its reason.
    let mut a = run("a", "wf");
    save(&*store, &[], &mut a, 1);
    assert_eq!(store.deferral("a").unwrap(), None);
    assert_eq!(store.list_claimable(now, 100).unwrap(), ["a", "c", "b"]);
    assert_eq!(store.defer("a", None, &|_| now).unwrap(), 1);
    assert_eq!(store.deferral("a").unwrap().unwrap().reason, None);
    Verdict::Passed
}

/// A quarantined run is listed only by `list_quarantined` (with its first
/// reason); a claim answers `Quarantined` and a commit is refused.
pub fn quarantined_runs_are_set_aside(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    for r in [
        run("sick", "wf"),
        run("well", "wf"),
        waiting(
            run("due", "wf"),
            WaitReason::Until,
            "u",
            Some("2026-11-30T08:00:00Z"),
        ),
    ] {
        store.create_if_absent(&r).unwrap();
    }
    store
        .quarantine("sick", "store_corrupt: cannot read")
        .unwrap();
    store.quarantine("due", "too big").unwrap();
    store.quarantine("due", "again").unwrap();
    let now = at("2026-11-30T09:00:00Z");
    assert_eq!(store.list_claimable(now, 10).unwrap(), ["well"]);
    assert!(store.list_due(now, 10).unwrap().is_empty());
    assert_eq!(
        ids(store.list_runs(&RunQuery::default()).unwrap()),
        ["well"]
    );
    assert_eq!(
        store.list_quarantined().unwrap(),
        [
            ("sick".to_string(), "store_corrupt: cannot read".to_string()),
            ("due".to_string(), "too big".to_string())
        ]
    );
    match store
        .claim(
            "sick",
            &lease("A", "2026-11-30T09:00:00Z", "2026-11-30T09:01:00Z"),
        )
        .unwrap()
    {
        Claim::Quarantined { reason } => assert_eq!(reason, "store_corrupt: cannot read"),
        other => panic!("{other:?}"),
    }
    let mut sick = run("sick", "wf");
    sick.version = 2;
    refused(store.commit(&[], &sick, fence(1, None), LeaseAfter::Release));
    Verdict::Passed
}

/// `list_ended_children` pairs the parents waiting on a subworkflow with
/// their ended children; `list_orphans` finds the running children of ended
/// parents.
pub fn ended_children_and_orphans_are_found(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut done = run("child-done", "wf");
    done.status = RunStatus::Completed;
    done.parent_run_id = Some("parent".into());
    let mut open = run("child-open", "wf");
    open.parent_run_id = Some("other-parent".into());
    let mut orphan = run("orphan", "wf");
    orphan.parent_run_id = Some("cancelled".into());
    let mut cancelled = run("cancelled", "wf");
    cancelled.status = RunStatus::Cancelled;
    let mut early = run("early-child", "wf");
    early.status = RunStatus::Failed;
    for r in [
        // Ended before its parent waited on it.
        early,
        waiting(
            run("late-parent", "wf"),
            WaitReason::Subworkflow,
            "subworkflow:early-child",
            None,
        ),
        waiting(
            run("parent", "wf"),
            WaitReason::Subworkflow,
            "subworkflow:child-done",
            None,
        ),
        waiting(
            run("other-parent", "wf"),
            WaitReason::Subworkflow,
            "subworkflow:child-open",
            None,
        ),
        done,
        open,
        cancelled,
        orphan,
    ] {
        store.create_if_absent(&r).unwrap();
    }
    let mut ended = store.list_ended_children(10).unwrap();
    ended.sort();
    assert_eq!(
        ended,
        [
            ("late-parent".to_string(), "early-child".to_string()),
            ("parent".to_string(), "child-done".to_string())
        ]
    );
    assert_eq!(store.list_orphans(10).unwrap(), ["orphan"]);
    // A parent that stops waiting is no longer listed.
    let mut parent = store.load_run("parent").unwrap().unwrap();
    parent.status = RunStatus::Running;
    parent.waiting = None;
    save(&*store, &[], &mut parent, 1);
    assert_eq!(
        store.list_ended_children(10).unwrap(),
        [("late-parent".to_string(), "early-child".to_string())]
    );
    Verdict::Passed
}

/// An automation controller as the store sees it: waiting at its wake
/// wait, bound to `connection` (an event source), maybe paused.
fn controller(id: &str, connection: &str, paused: bool) -> RunState {
    let r = waiting(
        run(id, "controller"),
        WaitReason::Event,
        &format!("{id}:wake"),
        None,
    );
    let mut columns = json!({"session_kind": "automation", "role": "controller"});
    if !paused {
        columns["wakes_on"] = json!(connection);
    }
    indexed(r, columns)
}

/// `list_consumers` lists the waiting runs whose indexer says an event of
/// the connection wakes them, and follows them as they are committed.
pub fn consumers_are_the_controllers_an_event_would_wake(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    if let Err(e) = store.set_indexer(Arc::new(ColumnsIndex)) {
        return unsupported(e);
    }
    let mut busy = controller("busy", "c1", false);
    busy.status = RunStatus::Running;
    busy.waiting = None;
    for r in [
        controller("idle-1", "c1", false),
        controller("paused-1", "c1", true),
        controller("idle-2", "c2", false),
        busy,
        waiting(run("asker", "wf"), WaitReason::User, "ask", None),
    ] {
        store.create_if_absent(&r).unwrap();
    }
    assert_eq!(store.list_consumers(Some("c1")).unwrap(), ["idle-1"]);
    assert_eq!(store.list_consumers(Some("c3")).unwrap(), [] as [&str; 0]);
    assert_eq!(store.list_consumers(None).unwrap(), ["idle-1", "idle-2"]);
    // Its indexer no longer says so: no longer woken; says so again: woken.
    let mut idle = store.load_run("idle-1").unwrap().unwrap();
    idle.vars["_index"]["wakes_on"] = serde_json::Value::Null;
    save(&*store, &[], &mut idle, 1);
    assert_eq!(store.list_consumers(Some("c1")).unwrap(), [] as [&str; 0]);
    let mut paused = store.load_run("paused-1").unwrap().unwrap();
    paused.vars["_index"]["wakes_on"] = json!("c1");
    save(&*store, &[], &mut paused, 1);
    assert_eq!(store.list_consumers(Some("c1")).unwrap(), ["paused-1"]);
    Verdict::Passed
}

/// A record whose result is JSON `null` keeps it, apart from a record with
/// no result, and the hash chain holds (after a reopen too, where the
/// store reopens).
pub fn a_null_result_is_kept_and_its_hash_holds(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut null = record("r1", 1, None);
    null.result = Some(json!(null));
    let none = StepRecord {
        result: None,
        ..record("r1", 2, None)
    };
    store.append_records(&[null, none]).unwrap();
    let stored = store.list_records("r1").unwrap();
    assert_eq!(stored[0].result, Some(json!(null)));
    assert_eq!(stored[1].result, None);
    assert!(crate::verify_chain(&stored).is_ok());
    if let Some(again) = h.reopens().then(|| h.open(dir)) {
        let reread = again.list_records("r1").unwrap();
        assert_eq!(reread[0].result, Some(json!(null)));
        assert!(crate::verify_chain(&reread).is_ok());
    }
    Verdict::Passed
}

/// Records append in order, per run, as they were given, and the store
/// chains them: each names the hash of the one before.
pub fn ledgers_append_in_order_per_run(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    store
        .append_records(&[
            record("r1", 1, None),
            record("r2", 1, None),
            record("r1", 2, None),
        ])
        .unwrap();
    store
        .append_records(&[record("r1", 3, Some("r1:1"))])
        .unwrap();
    let steps = |id: &str| -> Vec<String> {
        store
            .list_records(id)
            .unwrap()
            .into_iter()
            .map(|r| r.step_id)
            .collect()
    };
    assert_eq!(steps("r1"), ["r1-step-1", "r1-step-2", "r1-step-3"]);
    assert_eq!(steps("r2"), ["r2-step-1"]);
    assert!(steps("nobody").is_empty());
    let stored = store.list_records("r1").unwrap();
    let mut plain = stored[2].clone();
    (plain.prev_hash, plain.record_hash) = (None, None);
    assert_eq!(plain, record("r1", 3, Some("r1:1")));
    // The store chained them: each record names the one before it.
    assert_eq!(stored[0].prev_hash, None);
    assert_eq!(stored[1].prev_hash, stored[0].record_hash);
    assert_eq!(stored[2].prev_hash, stored[1].record_hash);
    assert!(crate::verify_chain(&stored).is_ok());
    Verdict::Passed
}

/// A node that loops to itself commits records that differ only in
/// their ids and times: every one of them is a step and lands.
pub fn identical_records_of_successive_commits_all_land(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    for v in 1..=5u64 {
        let mut same = record("r1", 1, None);
        same.step_id = format!("visit-{v}");
        save(&*store, &[same], &mut r, v);
    }
    let ledger = store.list_records("r1").unwrap();
    assert_eq!(ledger.len(), 5, "{ledger:?}");
    assert!(crate::verify_chain(&ledger).is_ok());
    assert!(store.list_ahead("r1").unwrap().is_empty());
    Verdict::Passed
}

/// An effect's records land ahead of its commit; the step that commits
/// after them (perhaps replayed, with another outcome) adds its own: the
/// evidence stays, in order, and is no longer ahead.
pub fn evidence_appended_ahead_stays_through_the_next_commit(
    h: &dyn Harness,
    dir: &Path,
) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    let mut started = record("r1", 1, Some("r1:effect"));
    started.status = StepStatus::Started;
    let done = record("r1", 2, Some("r1:effect"));
    store
        .append_ahead(&[started, done], fence(1, None))
        .unwrap();
    assert_eq!(store.list_ahead("r1").unwrap().len(), 2);
    r.status = RunStatus::Completed;
    save(&*store, &[record("r1", 3, Some("r1:terminal"))], &mut r, 1);
    let ledger = store.list_records("r1").unwrap();
    let steps: Vec<&str> = ledger.iter().map(|x| x.step_id.as_str()).collect();
    assert_eq!(steps, ["r1-step-1", "r1-step-2", "r1-step-3"]);
    assert!(store.list_ahead("r1").unwrap().is_empty());
    assert!(crate::verify_chain(&ledger).is_ok());
    Verdict::Passed
}

/// `list_ahead` lists the records appended since the run's last commit; the
/// next commit makes them part of its history.
pub fn records_appended_since_the_last_commit_are_ahead(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    assert!(store.list_ahead("r1").unwrap().is_empty());
    save(&*store, &[record("r1", 1, None)], &mut r, 1);
    assert!(store.list_ahead("r1").unwrap().is_empty(), "committed");
    store
        .append_ahead(
            &[record("r1", 2, Some("r1:2")), record("r1", 3, Some("r1:2"))],
            fence(2, None),
        )
        .unwrap();
    store.append_records(&[record("r1", 4, None)]).unwrap();
    let steps = |records: Vec<StepRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.step_id).collect()
    };
    assert_eq!(
        steps(store.list_ahead("r1").unwrap()),
        ["r1-step-2", "r1-step-3", "r1-step-4"]
    );
    save(&*store, &[record("r1", 5, None)], &mut r, 2);
    assert!(
        store.list_ahead("r1").unwrap().is_empty(),
        "a commit makes them true"
    );
    assert_eq!(store.list_records("r1").unwrap().len(), 5);
    assert!(store.list_ahead("nobody").unwrap().is_empty());
    // Evidence outside any transition, with nothing ahead, is not ahead.
    store.append_records(&[record("r1", 6, None)]).unwrap();
    assert!(store.list_ahead("r1").unwrap().is_empty());
    assert_eq!(store.list_records("r1").unwrap().len(), 6);
    Verdict::Passed
}

/// A deployment records a new version per workflow id (1, 2, 3...), keeps
/// the bundle's files once per digest, and is a no-op for content equal to
/// the latest version's; versions are read back by number and as latest.
pub fn deployments_are_versioned(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::bundles::{BundleFile, BundleFiles};
    use crate::Deployment;
    let store = h.open(dir);
    let file = |path: &str, bytes: &[u8]| BundleFile {
        path: path.into(),
        bytes: bytes.to_vec(),
    };
    let v1 = BundleFiles::new(vec![file("flow.json", b"{}"), file("s/a.wasm", b"\0asm1")]).unwrap();
    let v2 = BundleFiles::new(vec![file("flow.json", b"{}"), file("s/a.wasm", b"\0asm2")]).unwrap();
    let ids = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let deploy = |store: &dyn crate::Store, ids: &[String], files: &BundleFiles| {
        store
            .deploy(&Deployment {
                workflow_ids: ids,
                files,
                deployed_by: Some("ops"),
                source: Some("/src/b"),
                deployed_at: "2026-12-05T09:00:00.000000Z",
            })
            .unwrap()
    };
    assert_eq!(store.workflow_version("wf", None).unwrap(), None);
    let first = deploy(&*store, &ids(&["wf", "wf2"]), &v1);
    assert_eq!(first.len(), 2);
    assert!(first.iter().all(|d| !d.unchanged && d.version.version == 1));
    assert_eq!(first[0].version.digest, v1.digest);
    assert_eq!(first[0].version.deployed_by.as_deref(), Some("ops"));
    assert_eq!(first[0].version.source.as_deref(), Some("/src/b"));
    // The same content again changes nothing.
    let again = deploy(&*store, &ids(&["wf", "wf2"]), &v1);
    assert!(again.iter().all(|d| d.unchanged && d.version.version == 1));
    assert_eq!(store.bundle_files(&v1.digest).unwrap(), v1.files);
    // New content is version 2 of the ids it names, and only of those.
    let second = deploy(&*store, &ids(&["wf"]), &v2);
    assert_eq!((second[0].version.version, second[0].unchanged), (2, false));
    let latest = store.workflow_version("wf", None).unwrap().unwrap();
    assert_eq!(
        (latest.version, latest.digest.as_str()),
        (2, v2.digest.as_str())
    );
    let old = store.workflow_version("wf", Some(1)).unwrap().unwrap();
    assert_eq!(old.digest, v1.digest);
    assert_eq!(store.workflow_version("wf", Some(3)).unwrap(), None);
    assert_eq!(
        store
            .workflow_version("wf2", None)
            .unwrap()
            .unwrap()
            .version,
        1
    );
    // Back to the first content: a new version (3), not a no-op.
    let third = deploy(&*store, &ids(&["wf"]), &v1);
    assert_eq!((third[0].version.version, third[0].unchanged), (3, false));
    let all = store.workflow_versions(None).unwrap();
    let listed: Vec<(&str, u32)> = all
        .iter()
        .map(|v| (v.workflow_id.as_str(), v.version))
        .collect();
    assert_eq!(listed, [("wf", 1), ("wf", 2), ("wf", 3), ("wf2", 1)]);
    assert_eq!(store.workflow_versions(Some("wf2")).unwrap().len(), 1);
    assert!(store.bundle_files(&"0".repeat(64)).unwrap().is_empty());
    Verdict::Passed
}

/// Removing versions removes exactly them, and the files of a digest only
/// once no version names it.
pub fn removed_versions_let_go_of_their_files(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::bundles::{BundleFile, BundleFiles};
    use crate::Deployment;
    let store = h.open(dir);
    let files = |tag: &[u8]| {
        BundleFiles::new(vec![BundleFile {
            path: "flow.json".into(),
            bytes: tag.to_vec(),
        }])
        .unwrap()
    };
    let (a, b) = (files(b"a"), files(b"b"));
    for (ids, f) in [(&["wf", "wf2"][..], &a), (&["wf"][..], &b)] {
        let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
        store
            .deploy(&Deployment {
                workflow_ids: &ids,
                files: f,
                deployed_by: None,
                source: None,
                deployed_at: "2026-12-05T09:00:00.000000Z",
            })
            .unwrap();
    }
    let wf1 = store.workflow_version("wf", Some(1)).unwrap().unwrap();
    // A version named with another digest is not removed.
    let mut wrong = wf1.clone();
    wrong.digest = b.digest.clone();
    assert_eq!(store.remove_versions(&[wrong]).unwrap(), 0);
    assert_eq!(
        store.remove_versions(std::slice::from_ref(&wf1)).unwrap(),
        1
    );
    assert_eq!(store.workflow_version("wf", Some(1)).unwrap(), None);
    // wf2 v1 still names a's files.
    assert_eq!(store.bundle_files(&a.digest).unwrap(), a.files);
    let wf2 = store.workflow_version("wf2", Some(1)).unwrap().unwrap();
    assert_eq!(store.remove_versions(&[wf2]).unwrap(), 1);
    assert!(store.bundle_files(&a.digest).unwrap().is_empty());
    assert_eq!(store.bundle_files(&b.digest).unwrap(), b.files);
    assert_eq!(
        store.workflow_version("wf", None).unwrap().unwrap().version,
        2
    );
    Verdict::Passed
}

/// Deployments from two handles at once (two processes, where the store
/// can be opened twice) get distinct, consecutive versions, and every
/// version names files the store keeps.
pub fn concurrent_deployments_get_distinct_versions(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::bundles::{BundleFile, BundleFiles};
    use crate::Deployment;
    let store = h.open(dir);
    let other = if h.reopens() {
        h.open(dir)
    } else {
        store.clone()
    };
    let ids = vec!["wf".to_string()];
    std::thread::scope(|s| {
        for (side, store) in [(0u8, &store), (1u8, &other)] {
            let ids = &ids;
            s.spawn(move || {
                for i in 0..10u8 {
                    let files = BundleFiles::new(vec![BundleFile {
                        path: "flow.json".into(),
                        bytes: vec![side, i],
                    }])
                    .unwrap();
                    store
                        .deploy(&Deployment {
                            workflow_ids: ids,
                            files: &files,
                            deployed_by: None,
                            source: None,
                            deployed_at: "2026-12-05T09:00:00.000000Z",
                        })
                        .unwrap();
                }
            });
        }
    });
    let versions = store.workflow_versions(Some("wf")).unwrap();
    let numbers: Vec<u32> = versions.iter().map(|v| v.version).collect();
    assert_eq!(numbers, (1..=20).collect::<Vec<_>>());
    for v in &versions {
        assert!(
            !store.bundle_files(&v.digest).unwrap().is_empty(),
            "v{}",
            v.version
        );
    }
    Verdict::Passed
}

/// Runs are counted by the version they name and their status.
pub fn runs_are_counted_by_version(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut a = super::fixtures::run("a", "wf");
    a.workflow_version = Some(1);
    let mut b = super::fixtures::run("b", "wf");
    b.workflow_version = Some(1);
    let mut c = super::fixtures::run("c", "wf");
    c.workflow_version = Some(2);
    c.status = RunStatus::Completed;
    c.current_node = None;
    c.updated_at = "2026-11-30T10:00:00.000000Z".into();
    let legacy = super::fixtures::run("d", "wf");
    let other = super::fixtures::run("e", "other");
    for r in [&a, &b, &c, &legacy, &other] {
        store.create_if_absent(r).unwrap();
    }
    let used = store.version_use("wf").unwrap();
    let got: Vec<(Option<u32>, RunStatus, u64)> =
        used.iter().map(|u| (u.version, u.status, u.runs)).collect();
    assert_eq!(
        got,
        [
            (None, RunStatus::Running, 1),
            (Some(1), RunStatus::Running, 2),
            (Some(2), RunStatus::Completed, 1)
        ]
    );
    assert_eq!(used[2].last_updated, "2026-11-30T10:00:00.000000Z");
    assert_eq!(
        store.load_run("a").unwrap().unwrap().workflow_version,
        Some(1)
    );
    Verdict::Passed
}

/// `delete_runs` deletes the runs asked, each with its whole ledger, all
/// or none: a run still going among them keeps them all; an id not there
/// is skipped; the others' ledgers keep their chains. Deleted, a run id is
/// free again.
pub fn only_ended_runs_are_deleted(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut done = super::fixtures::run("done", "wf");
    done.status = RunStatus::Completed;
    done.current_node = None;
    let going = super::fixtures::run("going", "wf");
    let mut last = super::fixtures::run("last", "wf");
    last.status = RunStatus::Failed;
    last.current_node = None;
    for r in [&done, &going, &last] {
        store.create_if_absent(r).unwrap();
    }
    for (id, n) in [("done", 3), ("going", 2), ("last", 1)] {
        let records: Vec<_> = (1..=n)
            .map(|i| super::fixtures::record(id, i, None))
            .collect();
        store.append_records(&records).unwrap();
    }
    // All or none: a run still going keeps the others.
    let asked = ["done", "going", "missing"].map(String::from);
    let deleted = store.delete_runs(&asked).unwrap();
    assert!(deleted.runs.is_empty(), "{deleted:?}");
    assert!(store.load_run("done").unwrap().is_some());
    let asked = ["done", "missing"].map(String::from);
    let deleted = store.delete_runs(&asked).unwrap();
    assert_eq!(deleted.runs, ["done"]);
    assert_eq!(deleted.records, 3);
    assert!(store.load_run("done").unwrap().is_none());
    assert!(store.list_records("done").unwrap().is_empty());
    assert!(store.load_run("going").unwrap().is_some());
    let going_ledger = store.list_records("going").unwrap();
    assert_eq!(going_ledger.len(), 2);
    assert!(crate::verify_chain(&going_ledger).is_ok());
    let listed: Vec<String> = store
        .list_runs(&crate::RunQuery::default())
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(listed, ["going", "last"]);
    // The id is free again: a new run of it starts a new ledger.
    let (again, created) = store
        .create_if_absent(&super::fixtures::run("done", "wf"))
        .unwrap();
    assert!(created, "{again:?}");
    store
        .append_records(&[super::fixtures::record("done", 1, None)])
        .unwrap();
    let fresh = store.list_records("done").unwrap();
    assert_eq!(fresh.len(), 1);
    assert!(crate::verify_chain(&fresh).is_ok());
    Verdict::Passed
}

/// A store that signals work tells idle drivers when its earliest timed
/// work falls due: a time wait, counted from when a deferral or someone's
/// lease lets it go, a running run's deferral or lease; never "now" for
/// runs held back, however many there are. The others do not know.
pub fn next_due_is_when_the_earliest_timed_work_falls_due(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::NextDue;
    let store = h.open(dir);
    let now = chrono::Utc::now();
    let t = |secs: i64| {
        (now + chrono::Duration::seconds(secs)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    let next = || store.next_due(chrono::Utc::now()).unwrap();
    let Some(empty) = next() else {
        assert!(!store.signals_work());
        return Verdict::Passed;
    };
    assert_eq!(empty, NextDue::default());
    let timer = |id: &str, due: i64| {
        store
            .create_if_absent(&waiting(
                run(id, "wf"),
                WaitReason::Until,
                id,
                Some(&t(due)),
            ))
            .unwrap();
    };
    // Seventy timers due a second ago, each deferred for 40 s (a driver
    // could not move them).
    for i in 0..70 {
        let id = format!("held{i}");
        timer(&id, -1);
        store.defer(&id, Some("broken"), &|_| at(&t(40))).unwrap();
    }
    assert_eq!(next().unwrap().wait, Some(at(&t(40))));
    timer("w1", 10);
    assert_eq!(next().unwrap().wait, Some(at(&t(10))));
    // Due already, but another host holds it for 5 s more.
    timer("w2", -1);
    assert!(matches!(
        store.claim("w2", &lease("other", &t(0), &t(5))).unwrap(),
        Claim::Held(_)
    ));
    assert_eq!(
        next().unwrap(),
        NextDue {
            wait: Some(at(&t(5))),
            claim: None
        }
    );
    // Running runs: seventy held by another host for 60 s, one deferred
    // for 7 s.
    for i in 0..70 {
        let id = format!("busy{i}");
        store.create_if_absent(&run(&id, "wf")).unwrap();
        store.claim(&id, &lease("other", &t(0), &t(60))).unwrap();
    }
    assert_eq!(next().unwrap().claim, Some(at(&t(60))));
    store.create_if_absent(&run("r1", "wf")).unwrap();
    store.defer("r1", None, &|_| at(&t(7))).unwrap();
    assert_eq!(
        next().unwrap(),
        NextDue {
            wait: Some(at(&t(5))),
            claim: Some(at(&t(7)))
        }
    );
    // One free to claim: due now.
    store.create_if_absent(&run("r2", "wf")).unwrap();
    assert!(next().unwrap().claim.unwrap() <= chrono::Utc::now());
    Verdict::Passed
}

/// A store opened again has the runs, records and bundles written before,
/// and two handles on one store see each other's runs and leases (skipped
/// where [`Harness::reopens`] is false).
pub fn a_reopened_store_has_everything(h: &dyn Harness, dir: &Path) -> Verdict {
    if !h.reopens() {
        return Verdict::Skipped("the store does not survive a reopen (Harness::reopens)".into());
    }
    let store = h.open(dir);
    store
        .create_if_absent(&waiting(run("r1", "wf"), WaitReason::User, "k", None))
        .unwrap();
    store.append_records(&[record("r1", 1, None)]).unwrap();
    let files = crate::bundles::BundleFiles::new(vec![crate::bundles::BundleFile {
        path: "flow.json".into(),
        bytes: b"{}".to_vec(),
    }])
    .unwrap();
    store
        .deploy(&crate::Deployment {
            workflow_ids: &["wf".to_string()],
            files: &files,
            deployed_by: None,
            source: None,
            deployed_at: "2026-12-05T09:00:00.000000Z",
        })
        .unwrap();
    let again = h.open(dir);
    assert_eq!(again.load_run("r1").unwrap(), store.load_run("r1").unwrap());
    assert_eq!(again.list_records("r1").unwrap().len(), 1);
    assert_eq!(
        again.workflow_version("wf", None).unwrap().unwrap().digest,
        files.digest
    );
    assert_eq!(again.bundle_files(&files.digest).unwrap(), files.files);
    // Two objects on one store see each other's new runs, and each other's
    // leases.
    again.create_if_absent(&run("r2", "wf")).unwrap();
    assert_eq!(
        ids(store.list_runs(&RunQuery::default()).unwrap()),
        ["r1", "r2"]
    );
    let (t0, t1) = ("2026-11-30T09:00:00Z", "2026-11-30T09:00:30Z");
    assert!(matches!(
        again.claim("r2", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    assert!(matches!(
        store.claim("r2", &lease("B", t0, t1)).unwrap(),
        Claim::Busy { .. }
    ));
    Verdict::Passed
}

/// `verify_chain` over the records the store chained finds the first
/// changed, removed or reordered one.
pub fn the_ledger_chain_reports_the_first_tampered_record(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let batch: Vec<_> = (1..=5).map(|n| record("r1", n, None)).collect();
    store.append_records(&batch[..2]).unwrap();
    store.append_records(&batch[2..]).unwrap();
    let good = store.list_records("r1").unwrap();
    let head = crate::verify_chain(&good).unwrap();
    assert_eq!(head, good[4].record_hash);

    let mut changed = good.clone();
    changed[2].result = Some(json!({"n": 999}));
    let b3 = crate::verify_chain(&changed).unwrap_err();
    assert_eq!((b3.index, b3.problem), (3, "changed"));

    let mut removed = good.clone();
    removed.remove(1);
    let b2 = crate::verify_chain(&removed).unwrap_err();
    assert_eq!(
        (b2.index, b2.problem, b2.step_id.as_str()),
        (2, "removed or reordered", "r1-step-3")
    );

    let mut reordered = good.clone();
    reordered.swap(3, 4);
    let b4 = crate::verify_chain(&reordered).unwrap_err();
    assert_eq!((b4.index, b4.problem), (4, "removed or reordered"));
    Verdict::Passed
}

/// A compaction replaces a ledger's oldest records by one checkpoint at
/// the seq of the last it replaced, and seals it at the end of the chain:
/// the rest keep their seqs and hashes, the chain verifies (a checkpoint
/// changed or made by hand does not), pages read by seq, keys of replaced
/// records are not found, commits go on after it, and a compaction of the
/// wrong record, of the last one, or while records are ahead of the state
/// is refused. (A store that does not compact says so: skipped.)
pub fn a_compacted_ledger_keeps_its_seqs_and_chain(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::compaction::{checkpoint_record, CheckpointBody};
    let store = h.open(dir);
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    let keyed = |n: u32| {
        let key = format!("key-{n}");
        record("r1", n, n.is_multiple_of(2).then_some(key.as_str()))
    };
    save(&*store, &(1..=6).map(keyed).collect::<Vec<_>>(), &mut r, 1);
    store.append_ahead(&[keyed(7)], fence(2, None)).unwrap();
    let body = |through: u64, head: &StepRecord, carried: Vec<StepRecord>| CheckpointBody {
        through_seq: through,
        replaced_records: through,
        replaced_head: head.record_hash.clone().unwrap(),
        compacted_at: "2026-12-06T00:00:00.000000+00:00".into(),
        carried,
    };
    let ahead = store.list_records("r1").unwrap();
    let early = checkpoint_record("r1", &body(3, &ahead[2], vec![]));
    match store.compact_ledger("r1", 3, &early) {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        refused_ahead => assert_eq!(refused_ahead.unwrap_err().code, "conflict"),
    }
    save(&*store, &[keyed(8)], &mut r, 2);
    let before = store.list_records("r1").unwrap();
    // A checkpoint at `through` that says it replaced the record at `of`.
    let cut_of =
        |through: u64, of: usize| checkpoint_record("r1", &body(through, &before[of - 1], vec![]));
    let cut = |through: u64| cut_of(through, through as usize);
    assert_eq!(store.compact_ledger("r1", 3, &cut(3)).unwrap(), 3);
    let steps = |records: &[StepRecord]| -> Vec<String> {
        records.iter().map(|r| r.step_id.clone()).collect()
    };
    let after = store.list_records("r1").unwrap();
    assert_eq!(
        steps(&after),
        [
            "checkpoint:3",
            "r1-step-4",
            "r1-step-5",
            "r1-step-6",
            "r1-step-7",
            "r1-step-8",
            "sealed:checkpoint:3"
        ]
    );
    assert_eq!(after[1..6], before[3..], "the kept records are unchanged");
    assert_eq!(
        after[6].prev_hash, before[7].record_hash,
        "the seal follows the old head"
    );
    assert_eq!(crate::verify_chain(&after).unwrap(), after[6].record_hash);
    let mut forged = after.clone();
    forged[0].result.as_mut().unwrap()["replaced_records"] = json!(1);
    let b = crate::verify_chain(&forged).unwrap_err();
    assert_eq!((b.index, b.problem), (1, "changed"));
    forged[0] = checkpoint_record("r1", &body(3, &before[2], vec![keyed(2)]));
    let b = crate::verify_chain(&forged).unwrap_err();
    assert_eq!(
        (b.index, b.problem),
        (1, "unsealed checkpoint"),
        "a checkpoint made by hand"
    );
    let b = crate::verify_chain(&after[..6]).unwrap_err();
    assert_eq!(b.problem, "unsealed checkpoint", "the seal removed");
    let seqs =
        |page: Vec<(u64, StepRecord)>| -> Vec<u64> { page.into_iter().map(|p| p.0).collect() };
    assert_eq!(seqs(store.list_records_page("r1", 0, 2).unwrap()), [3, 4]);
    assert_eq!(
        seqs(store.list_records_page("r1", 4, 9).unwrap()),
        [5, 6, 7, 8, 9]
    );
    assert_eq!(
        steps(&store.list_records_range("r1", 0, 4).unwrap()),
        ["checkpoint:3", "r1-step-4"]
    );
    assert_eq!(
        steps(&store.list_records_range("r1", 4, 5).unwrap()),
        ["r1-step-5"]
    );
    assert!(store.find_records("r1", "key-2").unwrap().is_empty());
    assert_eq!(
        steps(&store.find_records("r1", "key-4").unwrap()),
        ["r1-step-4"]
    );
    assert!(
        store.list_ahead("r1").unwrap().is_empty(),
        "the seal is committed"
    );

    // Refused, nothing changed: a record that is not the one replaced, one
    // already gone, the last one.
    refused(store.compact_ledger("r1", 5, &cut_of(5, 4)));
    refused(store.compact_ledger("r1", 2, &cut(2)));
    let last = store.list_records("r1").unwrap();
    let at_seal = checkpoint_record("r1", &body(9, &last[6], vec![]));
    refused(store.compact_ledger("r1", 9, &at_seal));
    assert_eq!(store.list_records("r1").unwrap(), after);

    // Again, further (the first seal stays, naming a checkpoint gone);
    // then a commit goes on after the head.
    assert_eq!(store.compact_ledger("r1", 5, &cut(5)).unwrap(), 3);
    save(&*store, &[record("r1", 10, None)], &mut r, 3);
    let last = store.list_records("r1").unwrap();
    assert_eq!(
        steps(&last),
        [
            "checkpoint:5",
            "r1-step-6",
            "r1-step-7",
            "r1-step-8",
            "sealed:checkpoint:3",
            "sealed:checkpoint:5",
            "r1-step-10"
        ]
    );
    assert_eq!(crate::verify_chain(&last).unwrap(), last[6].record_hash);
    assert_eq!(
        seqs(store.list_records_page("r1", 0, 99).unwrap()),
        [5, 6, 7, 8, 9, 10, 11]
    );
    assert!(store.list_ahead("r1").unwrap().is_empty());
    if h.reopens() {
        drop(store);
        assert_eq!(h.open(dir).list_records("r1").unwrap(), last);
    }
    Verdict::Passed
}

/// Retention drops the payloads of a stream's old events up to a seq:
/// readers no longer get them, their keys still make a repeat a
/// duplicate, newer events, later ones and other streams stay. (A store
/// that keeps no inbox, or does not prune it, says so: skipped.)
pub fn pruned_events_keep_their_keys_and_are_skipped(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let s = &store;
    let on = |key: &str, n: u64, day: u32| {
        let mut e = event("trigger:a", key, n);
        e.appended_at = format!("2026-12-0{day}T10:00:00.000000+00:00");
        e
    };
    let seqs: Vec<u64> = match s.append_event(&on("k1", 1, 1)) {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        first => std::iter::once(first.unwrap().seq)
            .chain((2..=4).map(|n| {
                s.append_event(&on(&format!("k{n}"), n, n as u32))
                    .unwrap()
                    .seq
            }))
            .collect(),
    };
    let other = s.append_event(&event("trigger:b", "k1", 9)).unwrap();
    let before = at("2026-12-03T00:00:00Z");
    // Up to k3 and before day 3: k1 and k2.
    match s.prune_events("trigger:a", seqs[2], before, true) {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        n => assert_eq!(n.unwrap(), 2, "a dry run counts"),
    }
    assert_eq!(
        s.events_after("trigger:a", 0, 10).unwrap().len(),
        4,
        "and drops nothing"
    );
    assert_eq!(
        s.prune_events("trigger:a", seqs[2], before, false).unwrap(),
        2
    );
    assert_eq!(
        s.prune_events("trigger:a", u64::MAX, before, false)
            .unwrap(),
        0,
        "dropped once"
    );
    let keys = |after: u64| -> Vec<String> {
        s.events_after("trigger:a", after, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.dedupe_key)
            .collect()
    };
    assert_eq!(keys(0), ["k3", "k4"]);
    assert_eq!(keys(seqs[0]), ["k3", "k4"]);
    assert_eq!(
        s.events_after("trigger:a", 0, 1).unwrap()[0].dedupe_key,
        "k3",
        "a page skips them"
    );
    let again = s.append_event(&on("k1", 7, 5)).unwrap();
    assert_eq!(
        (again.duplicate, again.seq),
        (true, seqs[0]),
        "the key stays"
    );
    let next = s.append_event(&on("k5", 5, 5)).unwrap();
    assert!(!next.duplicate && next.seq > seqs[3]);
    assert_eq!(keys(0), ["k3", "k4", "k5"]);
    assert_eq!(
        s.events_after("trigger:b", 0, 10).unwrap()[0].seq,
        other.seq
    );
    if let Some(again) = h.reopens().then(|| h.open(dir)) {
        let read: Vec<String> = again
            .events_after("trigger:a", 0, 10)
            .unwrap()
            .into_iter()
            .map(|e| e.dedupe_key)
            .collect();
        assert_eq!(read, ["k3", "k4", "k5"]);
        assert!(again.append_event(&on("k2", 8, 6)).unwrap().duplicate);
    }
    Verdict::Passed
}

/// The command inbox ([`Harness::commands`]) numbers commands in order,
/// accepts a retried command id once, keeps a cursor per consumer, and
/// (where the store reopens) keeps them all across a reopen.
pub fn the_command_inbox_is_idempotent_and_ordered(h: &dyn Harness, dir: &Path) -> Verdict {
    let Some(inbox) = h.commands(dir) else {
        return no_command_store();
    };
    let a = inbox.append_command(&command("c1", "pause")).unwrap();
    assert_eq!((a.accepted, a.duplicate, a.seq), (true, false, 1));
    let b2 = inbox.append_command(&command("c2", "run_now")).unwrap();
    assert_eq!(b2.seq, 2);
    // A retried append is recognised, never applied twice.
    let again = inbox.append_command(&command("c1", "pause")).unwrap();
    assert_eq!(
        (again.accepted, again.duplicate, again.seq),
        (false, true, 1)
    );
    let all = inbox.commands_after(0, 10).unwrap();
    assert_eq!(
        all.iter()
            .map(|c| (c.command_id.as_str(), c.seq))
            .collect::<Vec<_>>(),
        [("c1", 1), ("c2", 2)]
    );
    assert_eq!(all[1].payload, json!({"why": "run_now"}));
    assert_eq!(inbox.commands_after(1, 10).unwrap().len(), 1);
    assert_eq!(inbox.commands_after(0, 1).unwrap().len(), 1);
    assert_eq!(inbox.find_command("c2").unwrap().unwrap().kind, "run_now");
    assert_eq!(inbox.find_command("nope").unwrap(), None);
    assert_eq!(inbox.cursor("worker").unwrap(), 0);
    inbox.set_cursor("worker", 1).unwrap();
    assert_eq!(inbox.cursor("worker").unwrap(), 1);
    assert_eq!(inbox.cursor("other").unwrap(), 0);
    if h.reopens() {
        drop(inbox);
        let reopened = h.commands(dir).expect("the command store, reopened");
        assert_eq!(reopened.cursor("worker").unwrap(), 1);
        assert_eq!(
            reopened
                .append_command(&command("c2", "run_now"))
                .unwrap()
                .seq,
            2
        );
        assert_eq!(
            reopened
                .append_command(&command("c3", "resume"))
                .unwrap()
                .seq,
            3
        );
    }
    Verdict::Passed
}

/// Eight threads appending one command at once: one of them is accepted,
/// and all get its number.
pub fn concurrent_retries_are_accepted_once(h: &dyn Harness, dir: &Path) -> Verdict {
    let Some(inbox) = h.commands(dir) else {
        return no_command_store();
    };
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let inbox = inbox.clone();
            std::thread::spawn(move || inbox.append_command(&command("same", "pause")).unwrap())
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.accepted).count(), 1);
    assert!(results.iter().all(|r| r.seq == 1));
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 1);
    Verdict::Passed
}

/// The event inbox stores a dedupe key once per stream and reads each
/// stream in order (after a reopen too, where the store reopens); skipped
/// for a store that keeps none (`store_unsupported`).
pub fn the_event_inbox_dedupes_per_stream_and_reads_in_order(
    h: &dyn Harness,
    dir: &Path,
) -> Verdict {
    let store = h.open(dir);
    let s = &store;
    let a = match s.append_event(&event("trigger:a", "w1", 1)) {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        a => a.unwrap(),
    };
    let b1 = s.append_event(&event("trigger:b", "w1", 2)).unwrap();
    let a2 = s.append_event(&event("trigger:a", "w2", 3)).unwrap();
    assert!(
        !a.duplicate && !b1.duplicate && !a2.duplicate,
        "the same key in another stream is new"
    );
    assert!(a2.seq > a.seq);
    let again = s.append_event(&event("trigger:a", "w1", 9)).unwrap();
    assert_eq!((again.duplicate, again.seq), (true, a.seq));
    let read = s.events_after("trigger:a", 0, 10).unwrap();
    assert_eq!(
        read.iter()
            .map(|e| (e.dedupe_key.as_str(), e.payload["n"].as_u64().unwrap()))
            .collect::<Vec<_>>(),
        [("w1", 1), ("w2", 3)],
        "the duplicate stored nothing"
    );
    assert_eq!(read[0].seq, a.seq);
    assert_eq!(s.events_after("trigger:a", a.seq, 10).unwrap().len(), 1);
    assert_eq!(s.events_after("trigger:a", 0, 1).unwrap().len(), 1);
    assert!(s.events_after("trigger:none", 0, 10).unwrap().is_empty());
    if let Some(again) = h.reopens().then(|| h.open(dir)) {
        assert_eq!(again.events_after("trigger:a", 0, 10).unwrap(), read);
        assert!(
            again
                .append_event(&event("trigger:a", "w2", 4))
                .unwrap()
                .duplicate
        );
    }
    Verdict::Passed
}

fn connection(id: &str) -> crate::ConnectionRecord {
    crate::ConnectionRecord {
        connection_id: id.into(),
        source_id: "webhook.received".into(),
        source_version: 1,
        label: "l".into(),
        status: "active".into(),
        config: json!({"tolerance_s": 300}),
        sealed_secret: Some("v1.x.y".into()),
        created_at: "2026-12-01T10:00:00+00:00".into(),
        updated_at: "2026-12-01T10:00:00+00:00".into(),
        last_event_at: None,
        last_error: None,
        feeder_state: serde_json::Value::Null,
    }
}

/// Trigger connections are created once and changed atomically: a change
/// that fails writes nothing, and concurrent changes lose none; skipped
/// for a store that keeps none (`store_unsupported`).
pub fn connections_are_created_once_and_changed_atomically(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let s = &store;
    match s.create_connection(&connection("tc_1")) {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        created => created.unwrap(),
    }
    s.create_connection(&connection("tc_2")).unwrap();
    assert!(s
        .create_connection(&connection("tc_1"))
        .unwrap_err()
        .is_conflict());
    let changed = s
        .update_connection("tc_1", &mut |c| {
            c.status = "disabled".into();
            Ok(())
        })
        .unwrap()
        .unwrap();
    assert_eq!(changed.status, "disabled");
    // A change that fails writes nothing.
    let refused = s.update_connection("tc_1", &mut |c| {
        c.label = "changed".into();
        Err(StoreError::conflict("no"))
    });
    assert!(refused.is_err());
    assert_eq!(s.get_connection("tc_1").unwrap().unwrap().label, "l");
    assert!(s
        .update_connection("tc_9", &mut |_| Ok(()))
        .unwrap()
        .is_none());
    assert_eq!(s.get_connection("tc_9").unwrap(), None);
    let ids: Vec<String> = s
        .list_connections()
        .unwrap()
        .into_iter()
        .map(|c| c.connection_id)
        .collect();
    assert_eq!(ids, ["tc_1", "tc_2"]);
    // Concurrent changes of one connection: none is lost.
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                s.update_connection("tc_2", &mut |c| {
                    let mut seen = c.feeder_state["seen"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    seen.push(json!(i));
                    c.feeder_state["seen"] = json!(seen);
                    Ok(())
                })
                .unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let seen = &s.get_connection("tc_2").unwrap().unwrap().feeder_state["seen"];
    assert_eq!(seen.as_array().unwrap().len(), 8, "{seen}");
    if let Some(again) = h.reopens().then(|| h.open(dir)) {
        assert_eq!(
            again.get_connection("tc_1").unwrap().unwrap().status,
            "disabled"
        );
    }
    Verdict::Passed
}

fn attributed(id: &str, parent: Option<&str>, columns: serde_json::Value) -> RunState {
    let mut r = indexed(run(id, "wf"), columns);
    r.parent_run_id = parent.map(str::to_string);
    r
}

/// The run index carries the columns the store's indexer gives each run
/// (rows written before the indexer was installed too), filters and
/// orders by them, and follows a run as it is committed.
pub fn the_run_index_carries_attribution_and_filters(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let mut plain = attributed("plain", None, json!({"session_kind": "chat"}));
    plain.session_id = Some("s1".into());
    plain
        .vars
        .insert("workspace_root".into(), json!("  /work/x  "));
    let occurrence = |index: i64, role: &str| {
        json!({"automation_id": "ctl", "occurrence_index": index, "role": role,
            "session_kind": "automation"})
    };
    let runs = [
        plain,
        attributed(
            "ctl",
            None,
            json!({"automation_id": "ctl", "role": "controller", "session_kind": "automation"}),
        ),
        attributed("occ-1", Some("ctl"), occurrence(1, "occurrence")),
        attributed("occ-2", Some("ctl"), occurrence(2, "occurrence")),
        attributed("desc", Some("occ-1"), occurrence(1, "descendant")),
        attributed(
            "disc",
            None,
            json!({"automation_id": "a2", "role": "discussion", "occurrence_index": 4,
                "session_kind": "discussion"}),
        ),
        attributed(
            "legacy",
            None,
            json!({"role": "legacy_schedule", "session_kind": "automation"}),
        ),
        attributed(
            "odd",
            None,
            json!({"automation_id": "7", "role": "occurrence", "session_kind": "occurrence"}),
        ),
        attributed("tool-child", Some("occ-1"), json!({"session_kind": "chat"})),
    ];
    for r in runs {
        store.create_if_absent(&r).unwrap();
    }
    // Without an indexer the store indexes the workspace root only; the
    // indexer, once installed, indexes the rows written before it too.
    let plain_rows = store.list_run_index(&Default::default()).unwrap();
    assert!(plain_rows
        .iter()
        .all(|r| r.role.is_none() && r.session_kind.is_none()));
    assert!(plain_rows
        .iter()
        .any(|r| r.workspace_root.as_deref() == Some("/work/x")));
    if let Err(e) = store.set_indexer(Arc::new(ColumnsIndex)) {
        return unsupported(e);
    }
    let q = |q: crate::RunIndexQuery| -> Vec<String> {
        store
            .list_run_index(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    use crate::RunIndexQuery as Q;
    index_filters(&q);
    let rows = store
        .list_run_index(&Q {
            oldest_first: true,
            ..Q::default()
        })
        .unwrap();
    index_columns(&rows);
    let row = |id: &str| rows.iter().find(|r| r.run_id == id).unwrap().clone();
    // The index follows the run as it is committed.
    let mut moved = attributed("occ-2", Some("ctl"), occurrence(2, "occurrence"));
    moved.status = RunStatus::Completed;
    save(&*store, &[], &mut moved, 1);
    assert_eq!(row("occ-2").status, RunStatus::Running, "(the old rows)");
    assert_eq!(
        q(Q {
            status: Some(RunStatus::Completed),
            ..Q::default()
        }),
        ["occ-2"]
    );
    Verdict::Passed
}

/// The filters of [`the_run_index_carries_attribution_and_filters`]'s runs,
/// listed through `q`.
fn index_filters(q: &dyn Fn(crate::RunIndexQuery) -> Vec<String>) {
    use crate::RunIndexQuery as Q;
    let all = [
        "plain",
        "ctl",
        "occ-1",
        "occ-2",
        "desc",
        "disc",
        "legacy",
        "odd",
        "tool-child",
    ];
    assert_eq!(
        q(Q {
            oldest_first: true,
            ..Q::default()
        }),
        all
    );
    assert_eq!(q(Q::default())[0], "tool-child", "newest first by default");
    assert_eq!(
        q(Q {
            root_only: true,
            oldest_first: true,
            ..Q::default()
        }),
        ["plain", "occ-1", "occ-2", "disc", "legacy", "odd"]
    );
    assert_eq!(
        q(Q {
            automation_id: Some(vec!["ctl".into()]),
            oldest_first: true,
            ..Q::default()
        }),
        ["ctl", "occ-1", "occ-2", "desc"]
    );
    assert_eq!(
        q(Q {
            automation_id: Some(crate::filter_values("ctl, a2")),
            role: Some(vec!["occurrence".into(), "discussion".into()]),
            oldest_first: true,
            ..Q::default()
        }),
        ["occ-1", "occ-2", "disc"]
    );
    assert_eq!(
        q(Q {
            session_kind: Some(vec!["discussion".into()]),
            ..Q::default()
        }),
        ["disc"]
    );
    assert_eq!(
        q(Q {
            session_kind: Some(vec!["chat".into()]),
            oldest_first: true,
            ..Q::default()
        }),
        ["plain", "tool-child"]
    );
    assert_eq!(
        q(Q {
            role: Some(Vec::new()),
            ..Q::default()
        }),
        Vec::<String>::new(),
        "a filter that ends empty matches nothing"
    );
    assert_eq!(
        q(Q {
            session_id: Some("s1".into()),
            ..Q::default()
        }),
        ["plain"]
    );
    assert_eq!(
        q(Q {
            root_only: true,
            limit: Some(2),
            ..Q::default()
        }),
        ["odd", "legacy"]
    );
}

/// The attribution columns of [`the_run_index_carries_attribution_and_filters`]'s
/// runs, as listed (`rows`).
fn index_columns(rows: &[crate::RunIndexRow]) {
    let row = |id: &str| rows.iter().find(|r| r.run_id == id).unwrap().clone();
    let attribution = |id: &str| {
        let r = row(id);
        (r.automation_id, r.role, r.occurrence_index, r.session_kind)
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(row("plain").workspace_root, s("/work/x"));
    assert_eq!(attribution("plain"), (None, None, None, s("chat")));
    assert_eq!(
        attribution("ctl"),
        (s("ctl"), s("controller"), None, s("automation"))
    );
    assert_eq!(
        attribution("occ-2"),
        (s("ctl"), s("occurrence"), Some(2), s("automation"))
    );
    assert_eq!(
        attribution("desc"),
        (s("ctl"), s("descendant"), Some(1), s("automation"))
    );
    assert_eq!(
        attribution("disc"),
        (s("a2"), s("discussion"), Some(4), s("discussion"))
    );
    assert_eq!(
        attribution("legacy"),
        (None, s("legacy_schedule"), None, s("automation"))
    );
    assert_eq!(
        attribution("odd"),
        (s("7"), s("occurrence"), None, s("occurrence"))
    );
    assert_eq!(attribution("tool-child"), (None, None, None, s("chat")));
}

/// The turn roots a store lists (`root_only`) are those of its indexer's
/// rule ([`RunIndexer::turn_roots`](crate::RunIndexer::turn_roots)),
/// whatever the roles are called, and a row says the same
/// ([`RunIndexRow::is_turn_root`](crate::RunIndexRow::is_turn_root)).
pub fn turn_roots_are_the_indexers(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    let role = |role: &str| json!({"role": role, "session_kind": "chat"});
    for r in [
        attributed("top", None, json!({"session_kind": "chat"})),
        attributed("child", Some("top"), json!({"session_kind": "chat"})),
        attributed("hub", None, role("hub")),
        attributed("spoke", Some("hub"), role("spoke")),
        attributed("controller", None, role("controller")),
        attributed("occurrence", Some("top"), role("occurrence")),
    ] {
        store.create_if_absent(&r).unwrap();
    }
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for (rule, expected) in [
        (
            crate::TurnRoots {
                roots: strings(&["spoke"]),
                not_roots: strings(&["hub"]),
            },
            vec!["top", "spoke", "controller"],
        ),
        (
            crate::TurnRoots::default(),
            vec!["top", "hub", "controller"],
        ),
        (
            crate::TurnRoots {
                roots: strings(&["spoke", "occurrence"]),
                not_roots: Vec::new(),
            },
            vec!["top", "hub", "spoke", "controller", "occurrence"],
        ),
    ] {
        if let Err(e) = store.set_indexer(Arc::new(RootsIndex(rule.clone()))) {
            return unsupported(e);
        }
        let roots: Vec<String> = store
            .list_run_index(&crate::RunIndexQuery {
                root_only: true,
                oldest_first: true,
                ..Default::default()
            })
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(roots, expected, "the turn roots of {rule:?}");
        let rows = store.list_run_index(&Default::default()).unwrap();
        assert_eq!(rows.len(), 6);
        for row in rows {
            assert_eq!(
                row.is_turn_root(&rule),
                expected.contains(&row.run_id.as_str()),
                "{} by {rule:?}",
                row.run_id
            );
        }
    }
    Verdict::Passed
}

/// `find_records` finds a run's records by their idempotency key, in
/// order.
pub fn ledger_records_are_found_by_idempotency_key(h: &dyn Harness, dir: &Path) -> Verdict {
    let store = h.open(dir);
    store
        .append_records(&[
            record("r1", 1, Some("r1:1")),
            record("r1", 2, None),
            record("r1", 3, Some("r1:1")),
            record("r1", 4, Some("r1:2")),
        ])
        .unwrap();
    let found: Vec<_> = store
        .find_records("r1", "r1:1")
        .unwrap()
        .into_iter()
        .map(|r| r.step_id)
        .collect();
    assert_eq!(found, ["r1-step-1", "r1-step-3"]);
    assert!(store.find_records("r1", "r1:9").unwrap().is_empty());
    assert!(store.find_records("nobody", "r1:1").unwrap().is_empty());
    Verdict::Passed
}

fn snapshot(id: &str, run_id: &str, name: &str, tags: &[&str], at: &str) -> crate::Snapshot {
    crate::Snapshot {
        snapshot_id: id.into(),
        run_id: run_id.into(),
        step_id: None,
        name: name.into(),
        description: format!("{name} description"),
        tags: tags.iter().map(|t| t.to_string()).collect(),
        created_at: at.into(),
        run_state: run(run_id, "wf"),
    }
}

/// The snapshot store ([`Harness::snapshots`]) searches by run, tag and
/// text, newest first, loads and deletes; an id that is a path finds
/// nothing.
pub fn snapshot_stores_search_by_run_tag_and_text(h: &dyn Harness, dir: &Path) -> Verdict {
    use crate::SnapshotQuery as Q;
    let Some(store) = h.snapshots(dir) else {
        return Verdict::Skipped("the harness has no snapshot store (Harness::snapshots)".into());
    };
    store
        .save_snapshot(&snapshot(
            "s1",
            "r1",
            "Before deploy",
            &["prod"],
            "2026-11-30T09:00:00Z",
        ))
        .unwrap();
    store
        .save_snapshot(&snapshot(
            "s2",
            "r1",
            "after",
            &["prod", "ok"],
            "2026-11-30T10:00:00Z",
        ))
        .unwrap();
    store
        .save_snapshot(&snapshot(
            "s3",
            "r2",
            "other run",
            &[],
            "2026-11-30T11:00:00Z",
        ))
        .unwrap();
    let ids = |q: Q| -> Vec<String> {
        store
            .search_snapshots(&q)
            .unwrap()
            .into_iter()
            .map(|s| s.snapshot_id)
            .collect()
    };
    assert_eq!(ids(Q::default()), ["s3", "s2", "s1"], "newest first");
    assert_eq!(
        ids(Q {
            run_id: Some("r1".into()),
            ..Q::default()
        }),
        ["s2", "s1"]
    );
    assert_eq!(
        ids(Q {
            tag: Some("ok".into()),
            ..Q::default()
        }),
        ["s2"]
    );
    assert_eq!(
        ids(Q {
            text: Some("DEPLOY".into()),
            ..Q::default()
        }),
        ["s1"]
    );
    assert_eq!(
        ids(Q {
            text: Some("description".into()),
            limit: Some(2),
            ..Q::default()
        }),
        ["s3", "s2"]
    );
    assert_eq!(store.load_snapshot("s2").unwrap().unwrap().name, "after");
    assert!(store.delete_snapshot("s2").unwrap());
    assert!(!store.delete_snapshot("s2").unwrap());
    assert_eq!(store.load_snapshot("s2").unwrap(), None);
    assert_eq!(store.load_snapshot("../etc/passwd").unwrap(), None);
    Verdict::Passed
}

/// An artifact store ([`Harness::artifacts`]) lists its artifacts and
/// deletes one unless it was stored, or stored again, since the time
/// given; one deleted is stored anew by the next put of its content. (A
/// store that cannot says so: skipped.)
pub fn artifacts_are_deleted_unless_stored_lately(h: &dyn Harness, dir: &Path) -> Verdict {
    use std::time::{Duration, SystemTime};
    let Some(store) = h.artifacts(dir) else {
        return Verdict::Skipped("the harness has no artifact store (Harness::artifacts)".into());
    };
    let put = |bytes: &[u8]| {
        store
            .put(bytes, "text/plain", Some("r1"), "2026-11-30T09:00:00Z")
            .unwrap()
            .artifact_id
    };
    let (a, b) = (put(b"old"), put(b"renewed"));
    let mut listed: Vec<String> = match store.list() {
        Err(e) if e.code == "store_unsupported" => return unsupported(e),
        listed => listed.unwrap().into_iter().map(|m| m.artifact_id).collect(),
    };
    listed.sort();
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    assert_eq!(listed, both);
    std::thread::sleep(Duration::from_millis(20));
    let mark = SystemTime::now();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(put(b"renewed"), b);
    assert!(
        store.delete_unless_since(&a, mark).unwrap(),
        "stored before the mark"
    );
    assert!(
        !store.delete_unless_since(&b, mark).unwrap(),
        "stored again since"
    );
    assert!(
        !store.delete_unless_since(&a, mark).unwrap(),
        "gone already"
    );
    assert_eq!(
        (store.get(&a).unwrap(), store.meta(&a).unwrap()),
        (None, None)
    );
    let left: Vec<String> = store
        .list()
        .unwrap()
        .into_iter()
        .map(|m| m.artifact_id)
        .collect();
    assert_eq!(left, std::slice::from_ref(&b));
    assert_eq!(store.get(&b).unwrap().as_deref(), Some(&b"renewed"[..]));
    assert_eq!(put(b"old"), a);
    assert_eq!(
        store.get(&a).unwrap().as_deref(),
        Some(&b"old"[..]),
        "stored anew"
    );
    Verdict::Passed
}

/// The artifact store ([`Harness::artifacts`]) is content-addressed: the
/// same bytes are stored once, with their first metadata; an unknown or
/// path-like id finds nothing.
pub fn artifact_store_is_content_addressed(h: &dyn Harness, dir: &Path) -> Verdict {
    let Some(store) = h.artifacts(dir) else {
        return Verdict::Skipped("the harness has no artifact store (Harness::artifacts)".into());
    };
    let a = store
        .put(
            b"{\"big\":true}",
            "application/json",
            Some("r1"),
            "2026-11-30T09:00:00Z",
        )
        .unwrap();
    let again = store
        .put(
            b"{\"big\":true}",
            "application/json",
            Some("r2"),
            "2026-11-30T10:00:00Z",
        )
        .unwrap();
    assert_eq!(
        a, again,
        "the same content is stored once, with its first metadata"
    );
    assert_eq!(
        a.artifact_id,
        crate::artifacts::artifact_id(b"{\"big\":true}")
    );
    assert_eq!((a.size, a.run_id.as_deref()), (12, Some("r1")));
    assert_eq!(
        store.get(&a.artifact_id).unwrap().unwrap(),
        b"{\"big\":true}"
    );
    assert_eq!(store.meta(&a.artifact_id).unwrap().unwrap(), a);
    let other = store
        .put(b"other", "text/plain", None, "2026-11-30T09:00:00Z")
        .unwrap();
    assert_ne!(other.artifact_id, a.artifact_id);
    assert_eq!(store.get(&"0".repeat(64)).unwrap(), None);
    assert_eq!(store.get("../../etc/passwd").unwrap(), None);
    Verdict::Passed
}

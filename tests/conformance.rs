//! One store contract, one conformance suite: the same calls return the same
//! answers on the memory, SQLite and JSON-file stores.

use std::sync::Arc;

use serde_json::json;
use stepwell::{
    Claim, Fence, JsonFileStore, LeaseAfter, LeaseRequest, RunQuery, RunState, RunStatus,
    SqliteStore, StepRecord, StepStatus, Store, WaitReason, WaitState,
};
use stepwell_tests::{store_tests, Backend};

struct Fixture {
    store: Arc<dyn Store>,
    dir: tempfile::TempDir,
    backend: Backend,
}

fn open(backend: Backend, dir: &std::path::Path) -> Arc<dyn Store> {
    stepwell_tests::open_store(backend, dir)
}

fn fixture(backend: Backend) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    Fixture {
        store: open(backend, dir.path()),
        dir,
        backend,
    }
}

fn run(id: &str, workflow: &str) -> RunState {
    RunState {
        version: 1,
        run_id: id.into(),
        workflow_id: workflow.into(),
        status: RunStatus::Running,
        current_node: Some("a".into()),
        vars: serde_json::from_value(json!({"n": 1})).unwrap(),
        waiting: None,
        output: None,
        error: None,
        created_at: "2026-11-30T09:00:00.000000Z".into(),
        updated_at: "2026-11-30T09:00:00.000000Z".into(),
        actor_id: None,
        session_id: None,
        parent_run_id: None,
    }
}

fn waiting(mut r: RunState, reason: WaitReason, key: &str, until: Option<&str>) -> RunState {
    r.status = RunStatus::Waiting;
    r.waiting = Some(WaitState {
        reason,
        wait_key: key.into(),
        until: until.map(str::to_string),
        resume_to_node: Some("b".into()),
        result_key: Some("r".into()),
        prompt: None,
        choices: None,
        details: None,
    });
    r
}

fn record(run_id: &str, n: u32, key: Option<&str>) -> StepRecord {
    StepRecord {
        step_id: format!("{run_id}-step-{n}"),
        run_id: run_id.into(),
        node_id: Some(format!("n{n}")),
        status: StepStatus::Completed,
        effect: None,
        result: Some(json!({"n": n})),
        error: None,
        started_at: "2026-11-30T09:00:00.000000Z".into(),
        ended_at: None,
        attempt: 1,
        idempotency_key: key.map(str::to_string),
        prev_hash: None,
        record_hash: None,
    }
}

fn ids(runs: Vec<RunState>) -> Vec<String> {
    runs.into_iter().map(|r| r.run_id).collect()
}

fn at(text: &str) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&chrono::Utc)
}

fn fence(version: u64, holder: Option<&str>) -> Fence<'_> {
    Fence {
        version,
        holder,
        take: None,
    }
}

/// Commits `r` as the next version after `from`, without a lease.
fn save(store: &dyn Store, r: &mut RunState, from: u64) {
    r.version = from + 1;
    store
        .commit(&[], r, fence(from, None), LeaseAfter::Release)
        .unwrap();
}

fn lease<'a>(holder: &'a str, now: &str, until: &str) -> LeaseRequest<'a> {
    LeaseRequest {
        holder,
        now: at(now),
        until: at(until),
        dead_holder: None,
    }
}

fn runs_load_and_commit(b: Backend) {
    let f = fixture(b);
    assert_eq!(f.store.load_run("r1").unwrap(), None);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r.clone()));
    r.status = RunStatus::Completed;
    r.output = Some(json!({"ok": true}));
    r.current_node = None;
    save(&*f.store, &mut r, 1);
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r.clone()));
    assert_eq!(f.store.load_run("r1").unwrap().unwrap().version, 2);
    assert_eq!(
        ids(f.store.list_runs(&RunQuery::default()).unwrap()),
        ["r1"]
    );
}

fn create_if_absent_never_overwrites(b: Backend) {
    let f = fixture(b);
    let first = run("r1", "wf");
    let (stored, created) = f.store.create_if_absent(&first).unwrap();
    assert!(created);
    assert_eq!(stored, first);
    let mut other = run("r1", "another");
    other.vars.insert("n".into(), json!(2));
    let (stored, created) = f.store.create_if_absent(&other).unwrap();
    assert!(!created);
    assert_eq!(stored, first, "the existing run is returned untouched");
    assert_eq!(f.store.load_run("r1").unwrap(), Some(first));
}

fn a_commit_lands_only_on_the_version_it_read(b: Backend) {
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    r.current_node = Some("b".into());
    r.version = 2;
    f.store
        .commit(
            &[record("r1", 1, None)],
            &r,
            fence(1, None),
            LeaseAfter::Release,
        )
        .unwrap();
    // A second writer that also read version 1 loses, and writes nothing:
    // neither its run nor its records.
    let mut late = run("r1", "wf");
    late.current_node = Some("z".into());
    late.version = 2;
    let err = f
        .store
        .commit(
            &[record("r1", 2, Some("r1:terminal"))],
            &late,
            fence(1, None),
            LeaseAfter::Release,
        )
        .unwrap_err();
    assert_eq!(err.code, "conflict", "{err}");
    assert!(err.message.contains("version 2"), "{err}");
    assert_eq!(f.store.load_run("r1").unwrap(), Some(r.clone()));
    assert_eq!(f.store.list_records("r1").unwrap().len(), 1);
    // A commit must save the next version.
    let mut skip = r.clone();
    skip.version = 9;
    assert_eq!(
        f.store
            .commit(&[], &skip, fence(2, None), LeaseAfter::Release)
            .unwrap_err()
            .code,
        "conflict"
    );
    // Version 0 creates, and only once.
    let mut fresh = run("r2", "wf");
    f.store
        .commit(
            &[record("r2", 1, None)],
            &fresh,
            fence(0, None),
            LeaseAfter::Release,
        )
        .unwrap();
    assert_eq!(f.store.load_run("r2").unwrap().unwrap().version, 1);
    fresh.current_node = Some("again".into());
    assert_eq!(
        f.store
            .commit(
                &[record("r2", 2, None)],
                &fresh,
                fence(0, None),
                LeaseAfter::Release
            )
            .unwrap_err()
            .code,
        "conflict"
    );
    assert_eq!(f.store.list_records("r2").unwrap().len(), 1);
    // Appends ahead are fenced the same way.
    assert_eq!(
        f.store
            .append_ahead(&[record("r1", 5, None)], fence(1, None))
            .unwrap_err()
            .code,
        "conflict"
    );
    f.store
        .append_ahead(&[record("r1", 5, None)], fence(2, None))
        .unwrap();
    assert_eq!(f.store.list_records("r1").unwrap().len(), 2);
}

fn a_lease_excludes_other_holders_until_it_lapses(b: Backend) {
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    let t0 = "2026-11-30T09:00:00Z";
    let t1 = "2026-11-30T09:00:30Z";
    let held = f.store.claim("r1", &lease("A", t0, t1)).unwrap();
    assert!(
        matches!(held, Claim::Held(ref run) if run.version == 1),
        "{held:?}"
    );
    // B is kept out while A's lease lives; A may claim again.
    match f.store.claim("r1", &lease("B", t0, t1)).unwrap() {
        Claim::Busy { holder, until } => {
            assert_eq!(holder.as_deref(), Some("A"));
            assert!(until.unwrap().starts_with("2026-11-30T09:00:30"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        f.store.claim("r1", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A write fenced with B's name does not land; A's does, and keeps the
    // lease renewed.
    r.version = 2;
    assert_eq!(
        f.store
            .commit(&[], &r, fence(1, Some("B")), LeaseAfter::Release)
            .unwrap_err()
            .code,
        "conflict"
    );
    f.store
        .commit(
            &[record("r1", 1, None)],
            &r,
            fence(1, Some("A")),
            LeaseAfter::Renew(at(t1)),
        )
        .unwrap();
    assert!(matches!(
        f.store.claim("r1", &lease("B", t0, t1)).unwrap(),
        Claim::Busy { .. }
    ));
    // Renewing by someone else changes nothing; A's lease lapses at t1 and
    // B takes the run over.
    f.store
        .renew("B", &["r1".into()], at("2026-11-30T10:00:00Z"))
        .unwrap();
    let later = "2026-11-30T09:00:31Z";
    assert!(matches!(
        f.store
            .claim("r1", &lease("B", later, "2026-11-30T09:01:00Z"))
            .unwrap(),
        Claim::Held(_)
    ));
    // A, stalled past its lease, can no longer write: not its run, not
    // ahead of it.
    r.version = 3;
    assert_eq!(
        f.store
            .commit(
                &[record("r1", 2, None)],
                &r,
                fence(2, Some("A")),
                LeaseAfter::Release
            )
            .unwrap_err()
            .code,
        "conflict"
    );
    assert_eq!(
        f.store
            .append_ahead(&[record("r1", 2, None)], fence(2, Some("A")))
            .unwrap_err()
            .code,
        "conflict"
    );
    assert_eq!(f.store.list_records("r1").unwrap().len(), 1);
    // Releasing by a non-holder does nothing; B's release frees the run.
    f.store.release("r1", "A").unwrap();
    assert!(matches!(
        f.store.claim("r1", &lease("C", later, later)).unwrap(),
        Claim::Busy { .. }
    ));
    f.store.release("r1", "B").unwrap();
    assert!(matches!(
        f.store.claim("r1", &lease("C", later, later)).unwrap(),
        Claim::Held(_)
    ));
    assert!(matches!(
        f.store.claim("nobody", &lease("C", later, later)).unwrap(),
        Claim::Missing
    ));
    // A holder known to be dead loses its lease at once, and only it.
    let dead_c = LeaseRequest {
        dead_holder: Some("C"),
        ..lease("D", later, later)
    };
    assert!(matches!(
        f.store.claim("r1", &dead_c).unwrap(),
        Claim::Held(_)
    ));
    assert!(
        matches!(f.store.claim("r1", &dead_c).unwrap(), Claim::Held(_)),
        "D holds it now"
    );
    let dead_x = LeaseRequest {
        dead_holder: Some("X"),
        ..lease("E", later, later)
    };
    assert!(matches!(
        f.store.claim("r1", &dead_x).unwrap(),
        Claim::Busy { .. }
    ));
}

fn a_fence_without_a_holder_lands_and_clears_the_lease(b: Backend) {
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    let (t0, t1) = ("2026-11-30T09:00:00Z", "2026-11-30T09:00:30Z");
    assert!(matches!(
        f.store.claim("r1", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A cancel: lands whoever holds the lease, and clears it.
    r.status = RunStatus::Cancelled;
    save(&*f.store, &mut r, 1);
    assert!(matches!(
        f.store.claim("r1", &lease("B", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    // A's next write fails.
    let mut a = r.clone();
    a.version = 3;
    assert_eq!(
        f.store
            .commit(&[], &a, fence(2, Some("A")), LeaseAfter::Release)
            .unwrap_err()
            .code,
        "conflict"
    );
}

fn list_runs_filters_orders_and_limits(b: Backend) {
    let f = fixture(b);
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
        f.store.create_if_absent(r).unwrap();
    }
    // An update keeps the creation order.
    let mut a = all[0].clone();
    a.status = RunStatus::Completed;
    save(&*f.store, &mut a, 1);
    let q = |q: RunQuery| ids(f.store.list_runs(&q).unwrap());
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
}

fn due_waits_include_deadline_carrying_event_waits(b: Backend) {
    let f = fixture(b);
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
        f.store.create_if_absent(r).unwrap();
    }
    let now = at("2026-11-30T10:00:00Z");
    assert_eq!(
        f.store.list_due(now, 100).unwrap(),
        ["early-until", "event-deadline", "late-until"]
    );
    assert_eq!(
        f.store.list_due(now, 2).unwrap(),
        ["early-until", "event-deadline"]
    );
    // A run that stopped waiting is no longer due.
    let mut moved = runs[1].clone();
    moved.status = RunStatus::Running;
    moved.waiting = None;
    save(&*f.store, &mut moved, 1);
    assert_eq!(
        f.store.list_due(now, 100).unwrap(),
        ["event-deadline", "late-until"]
    );
}

fn claimable_runs_are_running_and_unleased(b: Backend) {
    let f = fixture(b);
    for r in [
        run("free", "wf"),
        run("held", "wf"),
        run("lapsed", "wf"),
        waiting(run("parked", "wf"), WaitReason::User, "k", None),
    ] {
        f.store.create_if_absent(&r).unwrap();
    }
    let now = "2026-11-30T09:00:00Z";
    f.store
        .claim("held", &lease("A", now, "2026-11-30T09:10:00Z"))
        .unwrap();
    f.store
        .claim("lapsed", &lease("A", now, "2026-11-30T09:00:05Z"))
        .unwrap();
    assert_eq!(
        f.store
            .list_claimable(at("2026-11-30T09:00:10Z"), 100)
            .unwrap(),
        ["free", "lapsed"]
    );
    assert_eq!(f.store.list_claimable(at(now), 100).unwrap(), ["free"]);
    assert_eq!(
        f.store.list_claimable(at(now), 0).unwrap(),
        Vec::<String>::new()
    );
    let leased = |id: &str| (id.to_string(), "A".to_string());
    assert_eq!(
        f.store.list_leased(100).unwrap(),
        [leased("held"), leased("lapsed")]
    );
    assert_eq!(f.store.list_leased(1).unwrap(), [leased("held")]);
}

fn deferred_runs_are_listed_after_their_time_and_last(b: Backend) {
    let f = fixture(b);
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
        f.store.create_if_absent(&r).unwrap();
    }
    let now = at("2026-11-30T09:00:00Z");
    let later = at("2026-11-30T09:05:00Z");
    // Set aside for five minutes: not listed before then.
    let count = f
        .store
        .defer("a", None, &|n| {
            later + chrono::Duration::seconds(n as i64 - 1)
        })
        .unwrap();
    assert_eq!(count, 1);
    let first = f.store.deferral("a").unwrap().unwrap();
    assert_eq!((first.until, first.count, first.reason), (later, 1, None));
    assert_eq!(
        f.store
            .defer("a", Some("boom: the trigger"), &|_| later)
            .unwrap(),
        2,
        "counted"
    );
    // The reason is the last deferral's.
    let held = f.store.deferral("a").unwrap().unwrap();
    assert_eq!(held.count, 2);
    assert_eq!(held.reason.as_deref(), Some("boom: the trigger"));
    assert_eq!(f.store.deferred_until("a").unwrap(), Some(later));
    assert_eq!(f.store.defer("due", None, &|_| later).unwrap(), 1);
    assert_eq!(f.store.defer("nobody", None, &|_| later).unwrap(), 0);
    assert_eq!(f.store.deferral("nobody").unwrap(), None);
    assert_eq!(f.store.deferral("c").unwrap(), None);
    assert_eq!(f.store.list_claimable(now, 100).unwrap(), ["b", "c"]);
    assert!(f.store.list_due(now, 100).unwrap().is_empty());
    // After its time, a deferred run comes after the never-deferred ones,
    // and among deferred ones the earliest first.
    f.store.defer("b", None, &|_| now).unwrap();
    assert_eq!(f.store.list_claimable(later, 100).unwrap(), ["c", "b", "a"]);
    assert_eq!(f.store.list_due(later, 100).unwrap(), ["due"]);
    // A commit ends the deferral, its count and its reason.
    let mut a = run("a", "wf");
    save(&*f.store, &mut a, 1);
    assert_eq!(f.store.deferral("a").unwrap(), None);
    assert_eq!(f.store.list_claimable(now, 100).unwrap(), ["a", "c", "b"]);
    assert_eq!(f.store.defer("a", None, &|_| now).unwrap(), 1);
    assert_eq!(f.store.deferral("a").unwrap().unwrap().reason, None);
}

fn quarantined_runs_are_set_aside(b: Backend) {
    let f = fixture(b);
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
        f.store.create_if_absent(&r).unwrap();
    }
    f.store
        .quarantine("sick", "store_corrupt: cannot read")
        .unwrap();
    f.store.quarantine("due", "too big").unwrap();
    f.store.quarantine("due", "again").unwrap();
    let now = at("2026-11-30T09:00:00Z");
    assert_eq!(f.store.list_claimable(now, 10).unwrap(), ["well"]);
    assert!(f.store.list_due(now, 10).unwrap().is_empty());
    assert_eq!(
        ids(f.store.list_runs(&RunQuery::default()).unwrap()),
        ["well"]
    );
    assert_eq!(
        f.store.list_quarantined().unwrap(),
        [
            ("sick".to_string(), "store_corrupt: cannot read".to_string()),
            ("due".to_string(), "too big".to_string())
        ]
    );
    match f
        .store
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
    assert_eq!(
        f.store
            .commit(&[], &sick, fence(1, None), LeaseAfter::Release)
            .unwrap_err()
            .code,
        "conflict"
    );
}

fn ended_children_and_orphans_are_found(b: Backend) {
    let f = fixture(b);
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
        f.store.create_if_absent(&r).unwrap();
    }
    let mut ended = f.store.list_ended_children(10).unwrap();
    ended.sort();
    assert_eq!(
        ended,
        [
            ("late-parent".to_string(), "early-child".to_string()),
            ("parent".to_string(), "child-done".to_string())
        ]
    );
    assert_eq!(f.store.list_orphans(10).unwrap(), ["orphan"]);
    // A parent that stops waiting is no longer listed.
    let mut parent = f.store.load_run("parent").unwrap().unwrap();
    parent.status = RunStatus::Running;
    parent.waiting = None;
    save(&*f.store, &mut parent, 1);
    assert_eq!(
        f.store.list_ended_children(10).unwrap(),
        [("late-parent".to_string(), "early-child".to_string())]
    );
}

/// An automation controller as the store sees it: waiting at its wake
/// wait, bound to `connection` (an event source), maybe paused.
fn controller(id: &str, connection: &str, paused: bool) -> RunState {
    let mut r = waiting(
        run(id, "automation.controller"),
        WaitReason::Event,
        &format!("automation:{id}:wake"),
        None,
    );
    r.vars = serde_json::from_value(json!({
        "_meta": {"automation": {"trigger": {"source_id": "webhook.received", "source_version": 1,
                                              "config": {"connection_id": connection}},
                                 "archived_at": null}},
        "_runtime": {"automation": {"paused": paused}},
    }))
    .unwrap();
    r
}

fn consumers_are_the_controllers_an_event_would_wake(b: Backend) {
    let f = fixture(b);
    f.store
        .set_indexer(Arc::new(stepwell::automation::AutomationIndex))
        .unwrap();
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
        f.store.create_if_absent(&r).unwrap();
    }
    assert_eq!(f.store.list_consumers(Some("c1")).unwrap(), ["idle-1"]);
    assert_eq!(f.store.list_consumers(Some("c3")).unwrap(), [] as [&str; 0]);
    assert_eq!(f.store.list_consumers(None).unwrap(), ["idle-1", "idle-2"]);
    // Paused: no longer woken; resumed: woken again.
    let mut idle = f.store.load_run("idle-1").unwrap().unwrap();
    idle.vars["_runtime"]["automation"]["paused"] = json!(true);
    save(&*f.store, &mut idle, 1);
    assert_eq!(f.store.list_consumers(Some("c1")).unwrap(), [] as [&str; 0]);
    let mut paused = f.store.load_run("paused-1").unwrap().unwrap();
    paused.vars["_runtime"]["automation"]["paused"] = json!(false);
    save(&*f.store, &mut paused, 1);
    assert_eq!(f.store.list_consumers(Some("c1")).unwrap(), ["paused-1"]);
}

fn a_null_result_is_kept_and_its_hash_holds(b: Backend) {
    let f = fixture(b);
    let mut null = record("r1", 1, None);
    null.result = Some(json!(null));
    let none = StepRecord {
        result: None,
        ..record("r1", 2, None)
    };
    f.store.append_records(&[null, none]).unwrap();
    let stored = f.store.list_records("r1").unwrap();
    assert_eq!(stored[0].result, Some(json!(null)));
    assert_eq!(stored[1].result, None);
    assert!(stepwell::store::verify_chain(&stored).is_ok());
    if let Some(again) = (f.backend != Backend::Memory).then(|| open(f.backend, f.dir.path())) {
        let reread = again.list_records("r1").unwrap();
        assert_eq!(reread[0].result, Some(json!(null)));
        assert!(stepwell::store::verify_chain(&reread).is_ok());
    }
}

fn ledgers_append_in_order_per_run(b: Backend) {
    let f = fixture(b);
    f.store
        .append_records(&[
            record("r1", 1, None),
            record("r2", 1, None),
            record("r1", 2, None),
        ])
        .unwrap();
    f.store
        .append_records(&[record("r1", 3, Some("r1:1"))])
        .unwrap();
    let steps = |id: &str| -> Vec<String> {
        f.store
            .list_records(id)
            .unwrap()
            .into_iter()
            .map(|r| r.step_id)
            .collect()
    };
    assert_eq!(steps("r1"), ["r1-step-1", "r1-step-2", "r1-step-3"]);
    assert_eq!(steps("r2"), ["r2-step-1"]);
    assert!(steps("nobody").is_empty());
    let stored = f.store.list_records("r1").unwrap();
    let mut plain = stored[2].clone();
    (plain.prev_hash, plain.record_hash) = (None, None);
    assert_eq!(plain, record("r1", 3, Some("r1:1")));
    // The store chained them: each record names the one before it.
    assert_eq!(stored[0].prev_hash, None);
    assert_eq!(stored[1].prev_hash, stored[0].record_hash);
    assert_eq!(stored[2].prev_hash, stored[1].record_hash);
    assert!(stepwell::store::verify_chain(&stored).is_ok());
}

fn identical_records_of_successive_commits_all_land(b: Backend) {
    // A node that loops to itself commits records that differ only in
    // their ids and times: every one of them is a step and lands.
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    for v in 1..=5u64 {
        let mut same = record("r1", 1, None);
        same.step_id = format!("visit-{v}");
        r.version = v + 1;
        f.store
            .commit(&[same], &r, fence(v, None), LeaseAfter::Release)
            .unwrap();
    }
    let ledger = f.store.list_records("r1").unwrap();
    assert_eq!(ledger.len(), 5, "{ledger:?}");
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
    assert!(f.store.list_ahead("r1").unwrap().is_empty());
}

fn evidence_appended_ahead_stays_through_the_next_commit(b: Backend) {
    // An effect's records land ahead of its commit; the step that commits
    // after them (perhaps replayed, with another outcome) adds its own: the
    // evidence stays, in order, and is no longer ahead.
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    let mut started = record("r1", 1, Some("r1:effect"));
    started.status = StepStatus::Started;
    let done = record("r1", 2, Some("r1:effect"));
    f.store
        .append_ahead(&[started, done], fence(1, None))
        .unwrap();
    assert_eq!(f.store.list_ahead("r1").unwrap().len(), 2);
    r.status = RunStatus::Completed;
    r.version = 2;
    f.store
        .commit(
            &[record("r1", 3, Some("r1:terminal"))],
            &r,
            fence(1, None),
            LeaseAfter::Release,
        )
        .unwrap();
    let ledger = f.store.list_records("r1").unwrap();
    let steps: Vec<&str> = ledger.iter().map(|x| x.step_id.as_str()).collect();
    assert_eq!(steps, ["r1-step-1", "r1-step-2", "r1-step-3"]);
    assert!(f.store.list_ahead("r1").unwrap().is_empty());
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

fn records_appended_since_the_last_commit_are_ahead(b: Backend) {
    let f = fixture(b);
    let mut r = run("r1", "wf");
    f.store.create_if_absent(&r).unwrap();
    assert!(f.store.list_ahead("r1").unwrap().is_empty());
    r.version = 2;
    f.store
        .commit(
            &[record("r1", 1, None)],
            &r,
            fence(1, None),
            LeaseAfter::Release,
        )
        .unwrap();
    assert!(f.store.list_ahead("r1").unwrap().is_empty(), "committed");
    f.store
        .append_ahead(
            &[record("r1", 2, Some("r1:2")), record("r1", 3, Some("r1:2"))],
            fence(2, None),
        )
        .unwrap();
    f.store.append_records(&[record("r1", 4, None)]).unwrap();
    let steps = |records: Vec<StepRecord>| -> Vec<String> {
        records.into_iter().map(|r| r.step_id).collect()
    };
    assert_eq!(
        steps(f.store.list_ahead("r1").unwrap()),
        ["r1-step-2", "r1-step-3", "r1-step-4"]
    );
    r.version = 3;
    f.store
        .commit(
            &[record("r1", 5, None)],
            &r,
            fence(2, None),
            LeaseAfter::Release,
        )
        .unwrap();
    assert!(
        f.store.list_ahead("r1").unwrap().is_empty(),
        "a commit makes them true"
    );
    assert_eq!(f.store.list_records("r1").unwrap().len(), 5);
    assert!(f.store.list_ahead("nobody").unwrap().is_empty());
    // Evidence outside any transition, with nothing ahead, is not ahead.
    f.store.append_records(&[record("r1", 6, None)]).unwrap();
    assert!(f.store.list_ahead("r1").unwrap().is_empty());
    assert_eq!(f.store.list_records("r1").unwrap().len(), 6);
}

fn bundles_are_recorded(b: Backend) {
    let f = fixture(b);
    assert_eq!(f.store.bundle_dir("wf").unwrap(), None);
    f.store.put_bundle("wf", "/a/b".as_ref()).unwrap();
    f.store.put_bundle("wf", "/c/d".as_ref()).unwrap();
    f.store.put_bundle("other", "/e".as_ref()).unwrap();
    assert_eq!(f.store.bundle_dir("wf").unwrap(), Some("/c/d".into()));
}

/// A store several machines share keeps each bundle's files, once per
/// digest, and lets go of files no workflow names any more; the others
/// record the path only.
fn bundle_files_are_kept_once_per_digest(b: Backend) {
    use stepwell::flow::archive::{BundleFile, BundleFiles};
    let f = fixture(b);
    let file = |path: &str, bytes: &[u8]| BundleFile {
        path: path.into(),
        bytes: bytes.to_vec(),
    };
    let v1 = BundleFiles::new(vec![file("flow.json", b"{}"), file("s/a.wasm", b"\0asm1")]).unwrap();
    let v2 = BundleFiles::new(vec![file("flow.json", b"{}"), file("s/a.wasm", b"\0asm2")]).unwrap();
    let ids = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    f.store
        .put_bundle_files(&ids(&["wf", "wf2"]), "/a".as_ref(), &v1)
        .unwrap();
    assert_eq!(f.store.bundle_dir("wf").unwrap(), Some("/a".into()));
    assert_eq!(f.store.bundle_dir("wf2").unwrap(), Some("/a".into()));
    if !f.store.keeps_bundle_files() {
        assert_eq!(f.store.bundle_digest("wf").unwrap(), None);
        assert!(f.store.bundle_files(&v1.digest).unwrap().is_empty());
        return;
    }
    assert_eq!(
        f.store.bundle_digest("wf").unwrap(),
        Some(v1.digest.clone())
    );
    let kept = f.store.bundle_files(&v1.digest).unwrap();
    assert_eq!(kept, v1.files, "the same paths and bytes, in path order");
    // A new version of one workflow: the old files stay while another
    // workflow names them...
    f.store
        .put_bundle_files(&ids(&["wf"]), "/a".as_ref(), &v2)
        .unwrap();
    assert_eq!(
        f.store.bundle_digest("wf").unwrap(),
        Some(v2.digest.clone())
    );
    assert_eq!(f.store.bundle_files(&v1.digest).unwrap(), v1.files);
    // ...and go when none does.
    f.store
        .put_bundle_files(&ids(&["wf2"]), "/a".as_ref(), &v2)
        .unwrap();
    assert!(f.store.bundle_files(&v1.digest).unwrap().is_empty());
    assert_eq!(f.store.bundle_files(&v2.digest).unwrap(), v2.files);
    // Recording a path only forgets the files.
    f.store.put_bundle("wf", "/b".as_ref()).unwrap();
    assert_eq!(f.store.bundle_digest("wf").unwrap(), None);
    assert_eq!(f.store.bundle_dir("wf").unwrap(), Some("/b".into()));
    // Loads of two versions at once, each from its own connection, never
    // leave a workflow naming files the store let go of.
    let other = open(f.backend, f.dir.path());
    std::thread::scope(|s| {
        for (store, version) in [(&f.store, &v1), (&other, &v2)] {
            s.spawn(move || {
                for _ in 0..20 {
                    store
                        .put_bundle_files(&ids(&["wf", "wf2"]), "/a".as_ref(), version)
                        .unwrap();
                }
            });
        }
    });
    for id in ["wf", "wf2"] {
        let digest = f.store.bundle_digest(id).unwrap().unwrap();
        assert!(!f.store.bundle_files(&digest).unwrap().is_empty(), "{id}");
    }
}

/// A store that signals work tells idle drivers when its earliest timed
/// work falls due: a time wait, counted from when a deferral or someone's
/// lease lets it go, a running run's deferral or lease; never "now" for
/// runs held back, however many there are. The others do not know.
fn next_due_is_when_the_earliest_timed_work_falls_due(b: Backend) {
    use stepwell::store::NextDue;
    let f = fixture(b);
    let now = chrono::Utc::now();
    let t = |secs: i64| {
        (now + chrono::Duration::seconds(secs)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    };
    let next = || f.store.next_due(chrono::Utc::now()).unwrap();
    let Some(empty) = next() else {
        assert!(!f.store.signals_work());
        return;
    };
    assert_eq!(empty, NextDue::default());
    let timer = |id: &str, due: i64| {
        f.store
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
        f.store.defer(&id, Some("broken"), &|_| at(&t(40))).unwrap();
    }
    assert_eq!(next().unwrap().wait, Some(at(&t(40))));
    timer("w1", 10);
    assert_eq!(next().unwrap().wait, Some(at(&t(10))));
    // Due already, but another host holds it for 5 s more.
    timer("w2", -1);
    assert!(matches!(
        f.store.claim("w2", &lease("other", &t(0), &t(5))).unwrap(),
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
        f.store.create_if_absent(&run(&id, "wf")).unwrap();
        f.store.claim(&id, &lease("other", &t(0), &t(60))).unwrap();
    }
    assert_eq!(next().unwrap().claim, Some(at(&t(60))));
    f.store.create_if_absent(&run("r1", "wf")).unwrap();
    f.store.defer("r1", None, &|_| at(&t(7))).unwrap();
    assert_eq!(
        next().unwrap(),
        NextDue {
            wait: Some(at(&t(5))),
            claim: Some(at(&t(7)))
        }
    );
    // One free to claim: due now.
    f.store.create_if_absent(&run("r2", "wf")).unwrap();
    assert!(next().unwrap().claim.unwrap() <= chrono::Utc::now());
}

fn a_reopened_store_has_everything(b: Backend) {
    let f = fixture(b);
    if f.backend == Backend::Memory {
        return; // nothing survives by design
    }
    f.store
        .create_if_absent(&waiting(run("r1", "wf"), WaitReason::User, "k", None))
        .unwrap();
    f.store.append_records(&[record("r1", 1, None)]).unwrap();
    f.store.put_bundle("wf", "/x".as_ref()).unwrap();
    let again = open(f.backend, f.dir.path());
    assert_eq!(
        again.load_run("r1").unwrap(),
        f.store.load_run("r1").unwrap()
    );
    assert_eq!(again.list_records("r1").unwrap().len(), 1);
    assert_eq!(again.bundle_dir("wf").unwrap(), Some("/x".into()));
    // Two objects on one store see each other's new runs, and each other's
    // leases.
    again.create_if_absent(&run("r2", "wf")).unwrap();
    assert_eq!(
        ids(f.store.list_runs(&RunQuery::default()).unwrap()),
        ["r1", "r2"]
    );
    let (t0, t1) = ("2026-11-30T09:00:00Z", "2026-11-30T09:00:30Z");
    assert!(matches!(
        again.claim("r2", &lease("A", t0, t1)).unwrap(),
        Claim::Held(_)
    ));
    assert!(matches!(
        f.store.claim("r2", &lease("B", t0, t1)).unwrap(),
        Claim::Busy { .. }
    ));
}

store_tests!(
    runs_load_and_commit,
    create_if_absent_never_overwrites,
    a_commit_lands_only_on_the_version_it_read,
    a_lease_excludes_other_holders_until_it_lapses,
    a_fence_without_a_holder_lands_and_clears_the_lease,
    list_runs_filters_orders_and_limits,
    due_waits_include_deadline_carrying_event_waits,
    claimable_runs_are_running_and_unleased,
    deferred_runs_are_listed_after_their_time_and_last,
    quarantined_runs_are_set_aside,
    ended_children_and_orphans_are_found,
    consumers_are_the_controllers_an_event_would_wake,
    ledgers_append_in_order_per_run,
    a_null_result_is_kept_and_its_hash_holds,
    identical_records_of_successive_commits_all_land,
    evidence_appended_ahead_stays_through_the_next_commit,
    records_appended_since_the_last_commit_are_ahead,
    bundles_are_recorded,
    bundle_files_are_kept_once_per_digest,
    next_due_is_when_the_earliest_timed_work_falls_due,
    a_reopened_store_has_everything,
);

#[test]
fn json_files_are_named_per_run_and_crash_leftovers_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    store.create_if_absent(&run("r1", "wf")).unwrap();
    store.append_records(&[record("r1", 1, None)]).unwrap();
    assert!(path.join("run_r1.json").is_file());
    assert!(path.join("ledger_r1.jsonl").is_file());
    std::fs::write(path.join(".tmp-2147483647-1"), b"half a run").unwrap();
    drop(store);
    JsonFileStore::open(&path).unwrap();
    assert!(
        !path.join(".tmp-2147483647-1").exists(),
        "temp files are removed at open"
    );
}

/// A JSON store whose writes panic at the named point once armed (and
/// only once), and its trigger.
fn json_store_torn_at(
    path: &std::path::Path,
    point: &'static str,
) -> (JsonFileStore, Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let armed = Arc::new(AtomicBool::new(false));
    let trigger = armed.clone();
    let store = JsonFileStore::open(path)
        .unwrap()
        .with_crash_points(Arc::new(move |name| {
            if name == point && armed.swap(false, Ordering::SeqCst) {
                panic!("torn at {name}");
            }
        }));
    (store, trigger)
}

#[test]
fn a_json_commit_torn_before_its_run_file_leaves_no_trace() {
    // The commit of "Bob" dies after its ledger append, before the run file
    // is replaced: no state reflects it. Readers do not show its records,
    // and the next commit ("Eve", another turn) cuts them off: the ledger
    // holds one terminal record, the state's.
    for point in ["ledger-appended", "run-temp-written"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store");
        let (store, armed) = json_store_torn_at(&path, point);
        let mut r = run("r1", "wf");
        store.create_if_absent(&r).unwrap();
        r.version = 2;
        store
            .commit(
                &[record("r1", 1, None)],
                &r,
                fence(1, None),
                LeaseAfter::Release,
            )
            .unwrap();
        let mut bob = record("r1", 2, Some("r1:terminal"));
        bob.result = Some(json!({"complete_output": "Hello, Bob!"}));
        let mut done = r.clone();
        done.status = RunStatus::Completed;
        done.version = 3;
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let torn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            store.commit(&[bob.clone()], &done, fence(2, None), LeaseAfter::Release)
        }));
        assert!(torn.is_err(), "{point}: the commit was torn");
        assert_eq!(store.load_run("r1").unwrap().unwrap().version, 2);
        assert_eq!(store.list_records("r1").unwrap().len(), 1, "{point}");
        assert!(store.list_ahead("r1").unwrap().is_empty(), "{point}");

        let mut eve = bob.clone();
        eve.step_id = "eve".into();
        eve.result = Some(json!({"complete_output": "Hello, Eve!"}));
        let again = JsonFileStore::open(&path).unwrap();
        again
            .commit(&[eve], &done, fence(2, None), LeaseAfter::Release)
            .unwrap();
        let ledger = again.list_records("r1").unwrap();
        let steps: Vec<&str> = ledger.iter().map(|x| x.step_id.as_str()).collect();
        assert_eq!(steps, ["r1-step-1", "eve"], "{point}");
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        let text = std::fs::read_to_string(path.join("ledger_r1.jsonl")).unwrap();
        assert!(!text.contains("Bob"), "{point}: cut off the file too");
    }
}

#[test]
fn a_json_run_file_without_a_mark_counts_its_whole_ledger() {
    // A folder written by hand (or an older stepwell): no mark in the run
    // file. Its ledger counts as committed, and the next commit appends.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    let mut r = run("r1", "wf");
    store.create_if_absent(&r).unwrap();
    r.version = 2;
    store
        .commit(
            &[record("r1", 1, None), record("r1", 2, None)],
            &r,
            fence(1, None),
            LeaseAfter::Release,
        )
        .unwrap();
    std::fs::write(path.join("run_r1.json"), serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!(store.list_records("r1").unwrap().len(), 2);
    assert!(store.list_ahead("r1").unwrap().is_empty());
    r.version = 3;
    store
        .commit(
            &[record("r1", 3, None)],
            &r,
            fence(2, None),
            LeaseAfter::Release,
        )
        .unwrap();
    let ledger = store.list_records("r1").unwrap();
    assert_eq!(ledger.len(), 3);
    assert!(stepwell::store::verify_chain(&ledger).is_ok());
}

#[test]
fn corrupt_json_files_are_reported_with_path_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = JsonFileStore::open(&path).unwrap();
    for id in ["good", "bad"] {
        store.create_if_absent(&run(id, "wf")).unwrap();
        store
            .append_records(&[record(id, 1, None), record(id, 2, None)])
            .unwrap();
    }
    std::fs::write(path.join("run_bad.json"), b"{not json").unwrap();
    let ledger = path.join("ledger_bad.jsonl");
    let text = std::fs::read_to_string(&ledger).unwrap();
    let first = text.lines().next().unwrap();
    std::fs::write(&ledger, format!("{first}\n{{broken line\n")).unwrap();

    let err = store.load_run("bad").unwrap_err();
    assert_eq!(err.code, "store_corrupt");
    assert!(err.message.contains("run_bad.json"), "{err}");
    let err = store.list_records("bad").unwrap_err();
    assert!(
        err.message.contains("ledger_bad.jsonl:2"),
        "names the line: {err}"
    );
    // The rest of the store stays readable.
    assert!(store.load_run("good").unwrap().is_some());
    assert_eq!(store.list_records("good").unwrap().len(), 2);
}

#[test]
fn a_json_store_from_a_newer_format_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    std::fs::create_dir_all(&path).unwrap();
    let meta = r#"{"format": "stepwell.json-files", "version": 7}"#;
    std::fs::write(path.join("stepwell-store.json"), meta).unwrap();
    let err = JsonFileStore::open(&path).unwrap_err();
    assert_eq!(err.code, "store_schema");
    assert_eq!(
        std::fs::read_to_string(path.join("stepwell-store.json")).unwrap(),
        meta
    );
}

fn the_ledger_chain_reports_the_first_tampered_record(b: Backend) {
    let f = fixture(b);
    let batch: Vec<_> = (1..=5).map(|n| record("r1", n, None)).collect();
    f.store.append_records(&batch[..2]).unwrap();
    f.store.append_records(&batch[2..]).unwrap();
    let good = f.store.list_records("r1").unwrap();
    let head = stepwell::store::verify_chain(&good).unwrap();
    assert_eq!(head, good[4].record_hash);

    let mut changed = good.clone();
    changed[2].result = Some(json!({"n": 999}));
    let b3 = stepwell::store::verify_chain(&changed).unwrap_err();
    assert_eq!((b3.index, b3.problem), (3, "changed"));

    let mut removed = good.clone();
    removed.remove(1);
    let b2 = stepwell::store::verify_chain(&removed).unwrap_err();
    assert_eq!(
        (b2.index, b2.problem, b2.step_id.as_str()),
        (2, "removed or reordered", "r1-step-3")
    );

    let mut reordered = good.clone();
    reordered.swap(3, 4);
    let b4 = stepwell::store::verify_chain(&reordered).unwrap_err();
    assert_eq!((b4.index, b4.problem), (4, "removed or reordered"));
}

mod chain {
    use super::*;
    #[test]
    fn memory() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Memory)
    }
    #[test]
    fn sqlite() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Sqlite)
    }
    #[test]
    fn json() {
        the_ledger_chain_reports_the_first_tampered_record(Backend::Json)
    }
}

fn inbox(b: Backend, dir: &std::path::Path) -> Arc<dyn stepwell::CommandStore> {
    match b {
        Backend::Memory => Arc::new(stepwell::MemoryCommandStore::new()),
        Backend::Sqlite => Arc::new(SqliteStore::open(dir.join("db.sqlite")).unwrap()),
        Backend::Json => Arc::new(stepwell::JsonlCommandStore::open(dir.join("inbox")).unwrap()),
        Backend::Postgres => Arc::new(stepwell_tests::open_postgres(dir)),
    }
}

fn command(id: &str, kind: &str) -> stepwell::CommandRecord {
    stepwell::CommandRecord {
        command_id: id.into(),
        seq: 0,
        kind: kind.into(),
        target: Some("auto-1".into()),
        payload: json!({"why": kind}),
        created_at: "2026-11-30T09:00:00Z".into(),
    }
}

fn the_command_inbox_is_idempotent_and_ordered(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let inbox = inbox(b, dir.path());
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
    if b != Backend::Memory {
        drop(inbox);
        let reopened = inbox_reopen(b, dir.path());
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
}

fn inbox_reopen(b: Backend, dir: &std::path::Path) -> Arc<dyn stepwell::CommandStore> {
    inbox(b, dir)
}

fn concurrent_retries_are_accepted_once(b: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let inbox = inbox(b, dir.path());
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let inbox = inbox.clone();
            std::thread::spawn(move || inbox.append_command(&command("same", "pause")).unwrap())
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.accepted).count(), 1);
    assert!(results.iter().all(|r| r.seq == 1));
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 1);
}

mod commands {
    use super::*;
    store_tests!(
        the_command_inbox_is_idempotent_and_ordered,
        concurrent_retries_are_accepted_once
    );
}

fn event(stream: &str, key: &str, n: u64) -> stepwell::store::InboxEvent {
    stepwell::store::InboxEvent {
        seq: 0,
        stream: stream.into(),
        event_id: format!("{stream}:{key}"),
        dedupe_key: key.into(),
        appended_at: "2026-12-01T10:00:00+00:00".into(),
        payload: json!({"n": n}),
    }
}

fn the_event_inbox_dedupes_per_stream_and_reads_in_order(b: Backend) {
    let f = fixture(b);
    let s = &f.store;
    let a = s.append_event(&event("trigger:a", "w1", 1)).unwrap();
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
    if let Some(again) = (f.backend != Backend::Memory).then(|| open(f.backend, f.dir.path())) {
        assert_eq!(again.events_after("trigger:a", 0, 10).unwrap(), read);
        assert!(
            again
                .append_event(&event("trigger:a", "w2", 4))
                .unwrap()
                .duplicate
        );
    }
}

fn connection(id: &str) -> stepwell::store::ConnectionRecord {
    stepwell::store::ConnectionRecord {
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

fn connections_are_created_once_and_changed_atomically(b: Backend) {
    let f = fixture(b);
    let s = &f.store;
    s.create_connection(&connection("tc_1")).unwrap();
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
        Err(stepwell::StoreError::conflict("no"))
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
    if let Some(again) = (f.backend != Backend::Memory).then(|| open(f.backend, f.dir.path())) {
        assert_eq!(
            again.get_connection("tc_1").unwrap().unwrap().status,
            "disabled"
        );
    }
}

/// A JSON store's inbox whose last line was torn by a crash: the torn
/// event was never appended, the next one is, and every stream still reads.
#[test]
fn a_torn_json_inbox_line_is_dropped_by_the_next_append() {
    let f = fixture(Backend::Json);
    f.store.append_event(&event("trigger:a", "w1", 1)).unwrap();
    let path = f.dir.path().join("store").join("inbox.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(
        &mut file,
        br#"{"seq":2,"stream":"trigger:a","event_id":"torn"#,
    )
    .unwrap();
    drop(file);
    assert_eq!(f.store.events_after("trigger:a", 0, 10).unwrap().len(), 1);
    let next = f.store.append_event(&event("trigger:a", "w2", 2)).unwrap();
    assert!(!next.duplicate);
    let read = f.store.events_after("trigger:a", 0, 10).unwrap();
    assert_eq!(
        read.iter()
            .map(|e| e.dedupe_key.as_str())
            .collect::<Vec<_>>(),
        ["w1", "w2"]
    );
    // A whole line whose newline was not written is torn too: never read,
    // dropped by the next append (no event is read and then lost).
    let text = std::fs::read_to_string(&path).unwrap();
    let line = serde_json::to_string(&stepwell::store::InboxEvent {
        seq: 3,
        ..event("trigger:a", "w3", 3)
    })
    .unwrap();
    std::fs::write(&path, format!("{text}{line}")).unwrap();
    assert_eq!(f.store.events_after("trigger:a", 0, 10).unwrap().len(), 2);
    let w4 = f.store.append_event(&event("trigger:a", "w4", 4)).unwrap();
    assert_eq!(w4.seq, 3);
    assert_eq!(f.store.events_after("trigger:a", 0, 10).unwrap().len(), 3);
}

mod inbox {
    use super::*;
    store_tests!(
        the_event_inbox_dedupes_per_stream_and_reads_in_order,
        connections_are_created_once_and_changed_atomically
    );
}

fn attributed(id: &str, parent: Option<&str>, meta: serde_json::Value) -> RunState {
    let mut r = run(id, "wf");
    r.parent_run_id = parent.map(str::to_string);
    r.vars.insert("_meta".into(), meta);
    r
}

fn the_run_index_carries_attribution_and_filters(b: Backend) {
    let f = fixture(b);
    let mut plain = run("plain", "wf");
    plain.session_id = Some("s1".into());
    plain
        .vars
        .insert("workspace_root".into(), json!("  /work/x  "));
    let occurrence = |index: i64, role: &str| {
        json!({"occurrence": {"automation_id": "ctl", "occurrence_index": index,
            "role": role, "session_kind": "automation"}})
    };
    let runs = [
        plain,
        attributed("ctl", None, json!({"automation": {"title": "daily"}})),
        attributed("occ-1", Some("ctl"), occurrence(1, "occurrence")),
        attributed("occ-2", Some("ctl"), occurrence(2, "occurrence")),
        attributed("desc", Some("occ-1"), occurrence(1, "descendant")),
        attributed(
            "disc",
            None,
            json!({"discussion": {"automation_id": "a2", "occurrence_index": 4}}),
        ),
        attributed(
            "legacy",
            None,
            json!({"schedule": {"kind": "scheduled_run"}}),
        ),
        attributed(
            "odd",
            None,
            json!({"occurrence": {"automation_id": 7, "occurrence_index": true,
                "role": "boss", "session_kind": "weird"}}),
        ),
        attributed("tool-child", Some("occ-1"), json!({})),
    ];
    for r in runs {
        f.store.create_if_absent(&r).unwrap();
    }
    // Without an indexer the store indexes the workspace root only; the
    // automations' indexer, once installed, attributes the rows written
    // before it too.
    let plain = f.store.list_run_index(&Default::default()).unwrap();
    assert!(plain
        .iter()
        .all(|r| r.role.is_none() && r.session_kind.is_none()));
    assert!(plain
        .iter()
        .any(|r| r.workspace_root.as_deref() == Some("/work/x")));
    f.store
        .set_indexer(Arc::new(stepwell::automation::AutomationIndex))
        .unwrap();
    let q = |q: stepwell::RunIndexQuery| -> Vec<String> {
        f.store
            .list_run_index(&q)
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect()
    };
    use stepwell::RunIndexQuery as Q;
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
            automation_id: Some(stepwell::store::filter_values("ctl, a2")),
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
    let rows = f
        .store
        .list_run_index(&Q {
            oldest_first: true,
            ..Q::default()
        })
        .unwrap();
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
    // The index follows the run as it is committed.
    let mut moved = attributed("occ-2", Some("ctl"), occurrence(2, "occurrence"));
    moved.status = RunStatus::Completed;
    save(&*f.store, &mut moved, 1);
    assert_eq!(row("occ-2").status, RunStatus::Running, "(the old rows)");
    assert_eq!(
        q(Q {
            status: Some(RunStatus::Completed),
            ..Q::default()
        }),
        ["occ-2"]
    );
}

fn ledger_records_are_found_by_idempotency_key(b: Backend) {
    let f = fixture(b);
    f.store
        .append_records(&[
            record("r1", 1, Some("r1:1")),
            record("r1", 2, None),
            record("r1", 3, Some("r1:1")),
            record("r1", 4, Some("r1:2")),
        ])
        .unwrap();
    let found: Vec<_> = f
        .store
        .find_records("r1", "r1:1")
        .unwrap()
        .into_iter()
        .map(|r| r.step_id)
        .collect();
    assert_eq!(found, ["r1-step-1", "r1-step-3"]);
    assert!(f.store.find_records("r1", "r1:9").unwrap().is_empty());
    assert!(f.store.find_records("nobody", "r1:1").unwrap().is_empty());
}

mod index {
    use super::*;
    store_tests!(
        the_run_index_carries_attribution_and_filters,
        ledger_records_are_found_by_idempotency_key
    );
}

fn snapshot(
    id: &str,
    run_id: &str,
    name: &str,
    tags: &[&str],
    at: &str,
) -> stepwell::store::Snapshot {
    stepwell::store::Snapshot {
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

fn snapshot_stores_search_by_run_tag_and_text(b: Backend) {
    use stepwell::store::{SnapshotQuery as Q, SnapshotStore};
    let dir = tempfile::tempdir().unwrap();
    let store: Box<dyn SnapshotStore> = match b {
        Backend::Json => {
            Box::new(stepwell::store::JsonSnapshotStore::open(dir.path().join("snaps")).unwrap())
        }
        Backend::Postgres => Box::new(stepwell_tests::open_postgres(dir.path())),
        _ => Box::new(stepwell::store::MemorySnapshotStore::new()),
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
}

#[test]
fn memory_snapshots_search() {
    snapshot_stores_search_by_run_tag_and_text(Backend::Memory);
}

#[test]
fn json_snapshots_search() {
    snapshot_stores_search_by_run_tag_and_text(Backend::Json);
}

#[test]
fn postgres_snapshots_search() {
    if !stepwell_tests::postgres_skipped() {
        snapshot_stores_search_by_run_tag_and_text(Backend::Postgres);
    }
}

fn artifact_store_is_content_addressed(b: Backend) {
    use stepwell::ArtifactStore;
    let dir = tempfile::tempdir().unwrap();
    let store: Box<dyn ArtifactStore> = match b {
        Backend::Json => {
            Box::new(stepwell::FileArtifactStore::open(dir.path().join("artifacts")).unwrap())
        }
        Backend::Postgres => Box::new(stepwell_tests::open_postgres(dir.path())),
        _ => Box::new(stepwell::MemoryArtifactStore::new()),
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
        stepwell::store::artifacts::artifact_id(b"{\"big\":true}")
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
    if b == Backend::Json {
        let shard = dir.path().join("artifacts").join(&a.artifact_id[..2]);
        let names: Vec<_> = std::fs::read_dir(&shard)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "content and metadata: {names:?}");
    }
}

#[test]
fn memory_artifacts() {
    artifact_store_is_content_addressed(Backend::Memory);
}

#[test]
fn file_artifacts() {
    artifact_store_is_content_addressed(Backend::Json);
}

#[test]
fn postgres_artifacts() {
    if !stepwell_tests::postgres_skipped() {
        artifact_store_is_content_addressed(Backend::Postgres);
    }
}

#[test]
fn a_torn_last_command_line_is_dropped_not_fatal() {
    use stepwell::CommandStore;
    let dir = tempfile::tempdir().unwrap();
    let inbox = stepwell::JsonlCommandStore::open(dir.path()).unwrap();
    inbox.append_command(&command("c1", "pause")).unwrap();
    let file = dir.path().join("commands.jsonl");
    let mut text = std::fs::read_to_string(&file).unwrap();
    text.push_str("{\"command_id\":\"c2\",\"se");
    std::fs::write(&file, text).unwrap();
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 1);
    let r = inbox.append_command(&command("c2", "resume")).unwrap();
    assert_eq!((r.accepted, r.seq), (true, 2));
    assert_eq!(inbox.commands_after(0, 10).unwrap().len(), 2);
}

/// The run transaction across OS processes: two `store-worker` processes
/// each add 1 to one run's counter 200 times, on one SQLite file or one
/// JSON folder. With leases no commit ever loses (the lease excludes the
/// other process); with versions alone some lose and retry. Either way no
/// update is lost and none lands twice: the counter ends at 400, the ledger
/// holds 400 records in an intact chain, and the version counts every
/// commit.
mod processes {
    use super::*;

    fn worker() -> std::path::PathBuf {
        env!("CARGO_BIN_EXE_store-worker").into()
    }

    /// Starts `n` workers with `args`, all at once (behind a file in `dir`),
    /// and returns what each printed.
    fn workers(dir: &std::path::Path, n: usize, args: &[&str]) -> Vec<serde_json::Value> {
        let go = dir.join("go");
        let children: Vec<_> = (0..n)
            .map(|_| {
                std::process::Command::new(worker())
                    .args(args)
                    .arg(&go)
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::fs::write(&go, b"go").unwrap();
        children
            .into_iter()
            .map(|c| {
                let out = c.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                serde_json::from_slice(&out.stdout).unwrap()
            })
            .collect()
    }

    /// The `--store` text of `open(backend, dir)`'s store, for a worker.
    fn spec_of(backend: Backend, dir: &std::path::Path) -> String {
        stepwell_tests::store_spec(backend, dir)
    }

    /// A disk that fills in the middle of a transaction: another process's
    /// commit of 2 MiB fails when its write-ahead-log writes (gathered by
    /// the store's file layer) meet the file size limit, and its next,
    /// small commit lands. The database is whole, holds both small commits
    /// and nothing of the big one, the chain is intact, and the file takes
    /// new commits after the limit is gone.
    #[test]
    fn sqlite_a_commit_that_meets_a_full_disk_fails_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (
            open(Backend::Sqlite, dir.path()),
            spec_of(Backend::Sqlite, dir.path()),
        );
        let r = run("filled", "wf");
        store.create_if_absent(&r).unwrap();
        let out = std::process::Command::new(worker())
            .args([spec.as_str(), "full-disk", "filled", "256"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let big = &report["big"];
        let message = big["message"].as_str().unwrap();
        // SQLite's words for a write the file system refused.
        assert!(
            big["code"] == "store_io"
                && (message.ends_with("disk I/O error")
                    || message.ends_with("database or disk is full")),
            "the big commit failed for another reason: {big}"
        );
        let ledger = store.list_records("filled").unwrap();
        let texts: Vec<&str> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["before", "after"], "nothing of the failed commit");
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        assert_eq!(store.load_run("filled").unwrap().unwrap().version, 3);
        let db = spec.strip_prefix("sqlite:").unwrap();
        let check = rusqlite::Connection::open(db).unwrap();
        let integrity: String = check
            .query_row("PRAGMA integrity_check", [], |row| row.get(0))
            .unwrap();
        assert_eq!(integrity, "ok");
        // Without the limit, this process commits on the same file.
        let mut run = store.load_run("filled").unwrap().unwrap();
        run.version = 4;
        store
            .commit(&[], &run, Fence::unleased(3), LeaseAfter::Release)
            .unwrap();
        assert_eq!(store.load_run("filled").unwrap().unwrap().version, 4);
    }

    fn race(backend: Backend, mode: &str) -> Vec<serde_json::Value> {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (open(backend, dir.path()), spec_of(backend, dir.path()));
        let mut r = run("counted", "wf");
        r.vars.insert("count".into(), json!(0));
        store.create_if_absent(&r).unwrap();
        // Both start at once, behind a file.
        let reports = workers(dir.path(), 2, &[spec.as_str(), mode, "counted", "200"]);
        let done = store.load_run("counted").unwrap().unwrap();
        assert_eq!(done.vars["count"], json!(400), "no update lost or doubled");
        assert_eq!(done.version, 401);
        let ledger = store.list_records("counted").unwrap();
        assert_eq!(ledger.len(), 400);
        let counts: Vec<u64> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["count"].as_u64().unwrap())
            .collect();
        assert_eq!(
            counts,
            (1..=400).collect::<Vec<_>>(),
            "one record per commit, in order"
        );
        assert!(stepwell::store::verify_chain(&ledger).is_ok());
        // The two really overlapped: their commits interleave.
        let by: Vec<&str> = ledger
            .iter()
            .map(|r| r.result.as_ref().unwrap()["by"].as_str().unwrap())
            .collect();
        let switches = by.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(
            switches >= 2,
            "the workers ran one after the other: {switches} switches"
        );
        reports
    }

    /// Four processes append the same 100 dedupe keys to one stream at
    /// once: each key is stored once, in one place of the stream.
    fn events_race(backend: Backend) {
        let dir = tempfile::tempdir().unwrap();
        let (store, spec) = (open(backend, dir.path()), spec_of(backend, dir.path()));
        let reports = workers(
            dir.path(),
            4,
            &[spec.as_str(), "events", "trigger:race", "100"],
        );
        let stored: u64 = reports.iter().map(|r| r["stored"].as_u64().unwrap()).sum();
        assert_eq!(stored, 100, "{reports:?}");
        let events = store.events_after("trigger:race", 0, 1000).unwrap();
        let mut keys: Vec<&str> = events.iter().map(|e| e.dedupe_key.as_str()).collect();
        keys.sort();
        keys.dedup();
        assert_eq!((events.len(), keys.len()), (100, 100));
        assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    }

    #[test]
    fn sqlite_event_appends_from_processes_store_each_key_once() {
        events_race(Backend::Sqlite);
    }

    #[test]
    fn json_event_appends_from_processes_store_each_key_once() {
        events_race(Backend::Json);
    }

    /// A host stalled inside a transaction (paused, cut off) holds its
    /// row locks: a claim of that run answers busy at once instead of
    /// waiting behind it.
    #[test]
    fn postgres_a_claim_never_waits_behind_a_stalled_transaction() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = open(Backend::Postgres, dir.path());
        store.create_if_absent(&run("stalled", "wf")).unwrap();
        let url = stepwell_tests::store_spec(Backend::Postgres, dir.path());
        let mut stalled = ::postgres::Client::connect(&url, ::postgres::NoTls).unwrap();
        let mut tx = stalled.transaction().unwrap();
        tx.query(
            "SELECT 1 FROM runs WHERE run_id = 'stalled' FOR UPDATE",
            &[],
        )
        .unwrap();
        let t = std::time::Instant::now();
        let now = chrono::Utc::now();
        let lease = LeaseRequest {
            holder: "h2",
            now,
            until: now + chrono::Duration::seconds(30),
            dead_holder: None,
        };
        let claim = store.claim("stalled", &lease).unwrap();
        assert!(matches!(claim, Claim::Busy { .. }), "{claim:?}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(4),
            "{:?}",
            t.elapsed()
        );
        tx.rollback().unwrap();
        // Let go, the run is claimed.
        let claim = store.claim("stalled", &lease).unwrap();
        assert!(matches!(claim, Claim::Held(_)), "{claim:?}");
    }

    #[test]
    fn postgres_event_appends_from_processes_store_each_key_once() {
        if !stepwell_tests::postgres_skipped() {
            events_race(Backend::Postgres);
        }
    }

    #[test]
    fn postgres_leases_exclude_another_process() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let reports = race(Backend::Postgres, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn postgres_versions_refuse_a_stale_write_from_another_process() {
        if stepwell_tests::postgres_skipped() {
            return;
        }
        let reports = race(Backend::Postgres, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }

    #[test]
    fn sqlite_leases_exclude_another_process() {
        let reports = race(Backend::Sqlite, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn sqlite_versions_refuse_a_stale_write_from_another_process() {
        let reports = race(Backend::Sqlite, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }

    #[test]
    fn json_leases_exclude_another_process() {
        let reports = race(Backend::Json, "lease");
        assert!(reports.iter().all(|r| r["conflicts"] == 0), "{reports:?}");
        let busy: u64 = reports.iter().map(|r| r["busy"].as_u64().unwrap()).sum();
        assert!(busy > 0, "a claim found the other's lease: {reports:?}");
    }

    #[test]
    fn json_versions_refuse_a_stale_write_from_another_process() {
        let reports = race(Backend::Json, "cas");
        let lost: u64 = reports
            .iter()
            .map(|r| r["conflicts"].as_u64().unwrap())
            .sum();
        assert!(lost > 0, "a stale write was refused: {reports:?}");
    }
}

//! Building blocks of the checks, public for a backend's own tests beside
//! the suite: runs, records, fences and leases with fixed, round times.

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::{
    Attribution, CommandRecord, Fence, InboxEvent, LeaseAfter, LeaseRequest, RunIndexer, Store,
    TurnRoots,
};
use stepwell_model::model::{RunState, RunStatus, StepRecord, StepStatus, WaitReason, WaitState};

/// A running run `id` of `workflow`, version 1, at node `a`, with the vars
/// `{"n": 1}`, created at 2026-11-30T09:00:00Z.
pub fn run(id: &str, workflow: &str) -> RunState {
    RunState {
        version: 1,
        run_id: id.into(),
        workflow_id: workflow.into(),
        workflow_version: None,
        status: RunStatus::Running,
        current_node: Some("a".into()),
        vars: serde_json::from_value(json!({"n": 1})).expect("an object"),
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

/// `r`, waiting for `reason` under `key` (until `until`, an RFC 3339 time,
/// where given), to resume at node `b` with the result in `r`.
pub fn waiting(mut r: RunState, reason: WaitReason, key: &str, until: Option<&str>) -> RunState {
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

/// The completed record `<run_id>-step-<n>` of node `n<n>`, with the
/// result `{"n": n}` and the idempotency key `key`, unchained.
pub fn record(run_id: &str, n: u32, key: Option<&str>) -> StepRecord {
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
        vars: None,
        input: None,
    }
}

/// The time an RFC 3339 `text` names (panics on anything else).
pub fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .with_timezone(&Utc)
}

/// A fence on `version`, held by `holder` (none: an unleased write).
pub fn fence(version: u64, holder: Option<&str>) -> Fence<'_> {
    Fence {
        version,
        holder,
        take: None,
    }
}

/// Commits `records` and `r` as the next version after `from`, without a
/// lease (panics if the store refuses).
pub fn save(store: &dyn Store, records: &[StepRecord], r: &mut RunState, from: u64) {
    r.version = from + 1;
    store
        .commit(records, r, fence(from, None), LeaseAfter::Release)
        .unwrap_or_else(|e| panic!("commit of {} on version {from}: {e}", r.run_id));
}

/// A lease request of `holder` at `now` until `until` (RFC 3339 times).
pub fn lease<'a>(holder: &'a str, now: &str, until: &str) -> LeaseRequest<'a> {
    LeaseRequest {
        holder,
        now: at(now),
        until: at(until),
        dead_holder: None,
    }
}

/// An event for `stream` with the dedupe key `key` and the payload
/// `{"n": n}`, not yet numbered.
pub fn event(stream: &str, key: &str, n: u64) -> InboxEvent {
    InboxEvent {
        seq: 0,
        stream: stream.into(),
        event_id: format!("{stream}:{key}"),
        dedupe_key: key.into(),
        appended_at: "2026-12-01T10:00:00+00:00".into(),
        payload: json!({"n": n}),
    }
}

/// A command `id` of `kind` for the target `auto-1`, with the payload
/// `{"why": kind}`, not yet numbered.
pub fn command(id: &str, kind: &str) -> CommandRecord {
    CommandRecord {
        command_id: id.into(),
        seq: 0,
        kind: kind.into(),
        target: Some("auto-1".into()),
        payload: json!({"why": kind}),
        created_at: "2026-11-30T09:00:00Z".into(),
    }
}

/// The indexer of the run-index checks: a run's columns are what its
/// `vars._index` object says (`automation_id`, `role`, `occurrence_index`,
/// `session_kind`, and `wakes_on` for a waiting run), its workspace root
/// the top-level `vars.workspace_root`. Its turn roots: a run of the role
/// `occurrence` always is one, of the role `controller` never. The suite
/// checks that a store keeps, filters on and follows what its indexer
/// says, not any feature's rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct ColumnsIndex;

impl RunIndexer for ColumnsIndex {
    fn turn_roots(&self) -> TurnRoots {
        TurnRoots {
            roots: vec!["occurrence".into()],
            not_roots: vec!["controller".into()],
        }
    }

    fn index(&self, run: &RunState) -> Attribution {
        let columns = run.vars.get("_index");
        let text = |k: &str| {
            columns
                .and_then(|c| c.get(k))
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        Attribution {
            automation_id: text("automation_id"),
            role: text("role"),
            occurrence_index: columns
                .and_then(|c| c.get("occurrence_index"))
                .and_then(|v| v.as_i64()),
            session_kind: text("session_kind"),
            workspace_root: crate::index::workspace_root(run),
            wakes_on: text("wakes_on").filter(|_| run.status == RunStatus::Waiting),
        }
    }
}

/// [`ColumnsIndex`]'s columns with the turn roots it holds.
#[derive(Debug, Clone, Default)]
pub struct RootsIndex(pub TurnRoots);

impl RunIndexer for RootsIndex {
    fn index(&self, run: &RunState) -> Attribution {
        ColumnsIndex.index(run)
    }

    fn turn_roots(&self) -> TurnRoots {
        self.0.clone()
    }
}

/// `r` with the index columns `columns` for [`ColumnsIndex`].
pub fn indexed(mut r: RunState, columns: serde_json::Value) -> RunState {
    r.vars.insert("_index".into(), columns);
    r
}

//! The run model: the durable records a run is made of.
//!
//! Names follow the reference runtime: a [`RunState`] is the durable checkpoint
//! of a run, a [`WaitState`] says what a waiting run waits for, and a
//! [`StepRecord`] is one entry of the run's append-only ledger.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Created or resumed, and not yet parked: a tick will execute its next node.
    Running,
    /// Parked on a [`WaitState`]; only a resume (or a due deadline) moves it on.
    Waiting,
    /// Finished with an output.
    Completed,
    /// Finished with an error.
    Failed,
    /// Stopped by `cancel_run`.
    Cancelled,
}

impl RunStatus {
    /// The status name as stored and printed (`running`, `waiting`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Waiting => "waiting",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Whether the run has ended (`completed`, `failed` or `cancelled`).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// Parses a status name.
    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "running" => RunStatus::Running,
            "waiting" => RunStatus::Waiting,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }
}

/// Why a run waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitReason {
    /// An event delivered under the wait key (`wait_event`), optionally with a deadline.
    Event,
    /// A point in time (`wait_until`).
    Until,
    /// A person's answer (`ask_user`).
    User,
    /// An external job (reserved for host-wired effects).
    Job,
    /// A child run (`start_subworkflow` with `wait`).
    Subworkflow,
}

impl WaitReason {
    /// The reason name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Event => "event",
            WaitReason::Until => "until",
            WaitReason::User => "user",
            WaitReason::Job => "job",
            WaitReason::Subworkflow => "subworkflow",
        }
    }

    /// Parses a reason name.
    pub fn parse(s: &str) -> Option<WaitReason> {
        Some(match s {
            "event" => WaitReason::Event,
            "until" => WaitReason::Until,
            "user" => WaitReason::User,
            "job" => WaitReason::Job,
            "subworkflow" => WaitReason::Subworkflow,
            _ => return None,
        })
    }
}

/// What a waiting run waits for, and where it goes when the wait ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitState {
    /// Why the run waits.
    pub reason: WaitReason,
    /// The key a resume must present. Every wait has one.
    pub wait_key: String,
    /// For `until` waits: the due time; for `event` waits: an optional deadline
    /// after which the wait resolves with `{"timed_out": true}`. RFC 3339, UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The node the run continues from when resumed; `None` completes the run
    /// with the payload as its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_to_node: Option<String>,
    /// Where in the vars the resume payload is written (a dotted path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
    /// For `user` waits: the question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// For `user` waits: the offered answers, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Vec<String>>,
    /// Anything else a client needs to render the wait (for example the child
    /// run id of a subworkflow wait).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// The durable checkpoint of a run. The run store's copy is the truth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// How many times the run was committed (1 once created). Every commit
    /// names the version it read and lands only if the store still holds
    /// that version (compare-and-swap): a writer that lost a race changes
    /// nothing. Serialised first, so a store can read it cheaply.
    #[serde(default = "first_version")]
    pub version: u64,
    /// The run's id (`[A-Za-z0-9_-]+`).
    pub run_id: String,
    /// The workflow the run executes.
    pub workflow_id: String,
    /// The deployed version of that workflow the run executes: set when
    /// the run starts, changed only by an explicit upgrade. `None`: a run
    /// started before versions were recorded, or of a workflow registered
    /// in code; it runs the workflow's latest version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_version: Option<u32>,
    /// Where the run is in its lifecycle.
    pub status: RunStatus,
    /// The node executed next (running), the node that issued the wait
    /// (waiting), or the node where a failed or cancelled run stopped; `None`
    /// once the run has completed.
    pub current_node: Option<String>,
    /// The run's variables: a JSON object.
    pub vars: Map<String, Value>,
    /// Set while the run waits.
    pub waiting: Option<WaitState>,
    /// The output of a completed run.
    pub output: Option<Value>,
    /// Why a run failed (or was cancelled), prefixed with a reason code.
    pub error: Option<String>,
    /// When the run was created (RFC 3339, UTC).
    pub created_at: String,
    /// When the run was last saved (RFC 3339, UTC).
    pub updated_at: String,
    /// Who started the run, if known.
    pub actor_id: Option<String>,
    /// The session the run belongs to, if any.
    pub session_id: Option<String>,
    /// The run that started this one as a subworkflow, if any.
    pub parent_run_id: Option<String>,
}

fn first_version() -> u64 {
    1
}

/// The status of one ledger record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// An effect started executing.
    Started,
    /// A node step or an effect finished.
    Completed,
    /// An effect parked the run.
    Waiting,
    /// A node step or an effect failed; the run failed.
    Failed,
    /// The run was cancelled.
    Cancelled,
    /// Stands for the records it replaced: the first record of a ledger
    /// compacted by retention. Its `prev_hash` is the hash of the last
    /// record it replaced (the one the next record follows); its `result`
    /// says what it replaced and carries the records still looked up by
    /// key ([`LEDGER_CHECKPOINT_STEP`]).
    Checkpoint,
}

/// The `step_id` prefix of a ledger checkpoint record
/// ([`StepStatus::Checkpoint`]): `checkpoint:<seq>`.
pub const LEDGER_CHECKPOINT_STEP: &str = "checkpoint:";

impl StepStatus {
    /// The status name as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Started => "started",
            StepStatus::Completed => "completed",
            StepStatus::Waiting => "waiting",
            StepStatus::Failed => "failed",
            StepStatus::Cancelled => "cancelled",
            StepStatus::Checkpoint => "checkpoint",
        }
    }
}

/// An optional field that is there, whatever it holds (`null` included):
/// `Some`. (A missing field is `None` through `#[serde(default)]`.)
fn present_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// The effect a ledger record is about, as it was requested.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    /// The effect kind (`ask_user`, `wait_until`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The effect's payload.
    pub payload: Value,
    /// Where the result is written in the vars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_key: Option<String>,
}

/// One entry of a run's append-only ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// A unique id for this record.
    pub step_id: String,
    /// The run the record belongs to.
    pub run_id: String,
    /// The node that was executing (`None` for run-level records such as a cancel).
    pub node_id: Option<String>,
    /// What happened.
    pub status: StepStatus,
    /// The effect, for effect records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<EffectRecord>,
    /// What the step produced: the routing decision of a node step, an
    /// effect's result, the wait of a waiting record, a resume's payload.
    /// A result of JSON `null` is kept as `Some(Null)` (written `"result":
    /// null` and read back the same, so the record's hash holds).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present_value"
    )]
    pub result: Option<Value>,
    /// The vars patch a node step applied (secrets read `[redacted]`): with
    /// `input`, results and resume payloads, the ledger alone rebuilds a
    /// run's vars before any step (forks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vars: Option<Value>,
    /// The run's user vars before its first step (on that step's record),
    /// or as a restore left them (on its record); secrets redacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// Why the step failed, prefixed with a reason code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When the step started (RFC 3339, UTC).
    pub started_at: String,
    /// When the step ended (RFC 3339, UTC); `None` for `started` records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// 1 for a first attempt.
    pub attempt: u32,
    /// For effect records: a key that is the same every time this effect of
    /// this run is attempted (`<run_id>:<effect_seq>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The `record_hash` of the run's previous ledger record (`None` for the
    /// first). Set by the store when it appends the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_hash: Option<String>,
    /// SHA-256 (hex) of this record with `prev_hash` set and `record_hash`
    /// empty: the tamper-evident chain (`stepwell::store::verify_chain`). Set
    /// by the store when it appends the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_hash: Option<String>,
}

/// What a node decided: the Rust form of the WIT `step-plan`, parsed and
/// checked by the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    /// A shallow patch of the vars: each key replaces the key of the same
    /// name; `Null` removes it.
    pub vars: Option<Map<String, Value>>,
    /// An effect to execute before moving on.
    pub effect: Option<EffectRequest>,
    /// The next node (a node id or a route label of the current node).
    pub next_node: Option<String>,
    /// Finish the run with this output.
    pub complete_output: Option<Value>,
    /// Bytes of guest output the plan was parsed from (0 for a plan the
    /// host made): counted against the run's data budget.
    pub output_bytes: usize,
}

/// An effect as a node requests it.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectRequest {
    /// The effect kind (`ask_user`, ...).
    pub kind: String,
    /// The payload: a JSON object whose fields depend on the kind.
    pub payload: Value,
    /// Where the result is written in the vars.
    pub result_key: Option<String>,
}

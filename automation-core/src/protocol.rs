//! What the controller's nodes ask of the host, and what it answers.
//!
//! The nodes decide; the host does what needs the store or a trigger
//! source, through four effects only the controller may ask for:
//!
//! - [`TRIGGER_EFFECT`] (`automation.trigger`, payload [`TriggerCall`]): a
//!   call of the bound trigger source (`prepare`, or `admit` and
//!   `normalize` of its admission) or `manual@1`'s `normalize` of a
//!   run-now; the [`TriggerAnswer`] lands in [`FACTS_KEY`] (as [`Facts`])
//!   and the node runs again with it.
//! - [`READ_OCCURRENCE_EFFECT`] (`automation.read_occurrence`, payload
//!   `{"run_id"}`): the attempt's run as a [`crate::ChildView`] (its output
//!   cut to what an outcome reads), in [`FACTS_KEY`].
//!
//! An answer carries its [`Basis`]: the state version and revision it was
//! asked on, and when. A node uses it only while both still hold (a
//! command in between, which always moves the state version, makes it ask
//! again), and decides as of the time it asked: one turn, one `now`, as
//! when the question and the decision were one step.
//! - [`COMMIT_EFFECT`] (`automation.commit`, payload [`Commit`]): the
//!   decisions and observations, each written once per key, committed with
//!   the step (the record and the changed `_runtime.automation` /
//!   `_meta.automation` in one atomic commit), then the node's route, or
//!   the wake wait (`wait_event` on `automation:<id>:wake`, with the
//!   deadline when there is one) before it.
//! - [`START_OCCURRENCE_EFFECT`] (`automation.start_occurrence`, payload
//!   `{"run_id"}`): creates the dispatched attempt's run under its
//!   deterministic id (if absent) from the inputs frozen at admission, and
//!   waits for it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The trigger call effect.
pub const TRIGGER_EFFECT: &str = "automation.trigger";
/// The occurrence read effect.
pub const READ_OCCURRENCE_EFFECT: &str = "automation.read_occurrence";
/// The decision commit effect.
pub const COMMIT_EFFECT: &str = "automation.commit";
/// The occurrence start effect.
pub const START_OCCURRENCE_EFFECT: &str = "automation.start_occurrence";
/// Every controller effect.
pub const EFFECTS: [&str; 4] = [
    TRIGGER_EFFECT,
    READ_OCCURRENCE_EFFECT,
    COMMIT_EFFECT,
    START_OCCURRENCE_EFFECT,
];
/// Where a read effect's answer lands in the controller's vars (the node
/// that asked runs again with it, and drops it when it decides): a var of
/// its own, so that dropping it sends nothing else back.
pub const FACTS_KEY: &str = "_automation_facts";
/// Where the dispatch's wait writes the ended attempt's summary.
pub const DISPATCH_KEY: &str = "_temp.automation_dispatch";

/// The keys every automation record has beside its own fields (the host
/// sets them; a node's fields may not).
pub const COMMON_FIELDS: [&str; 7] = [
    "schema_version",
    "automation_id",
    "revision",
    "at",
    "state_version",
    "delta",
    "command_id",
];

/// What an answer was asked on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Basis {
    /// The controller's `state_version` then.
    pub state_version: u64,
    /// The definition's `revision` then.
    pub revision: u64,
    /// When it was asked (the host's clock, the automation layer's
    /// spelling): the time the node decides as of.
    pub asked_at: String,
}

impl Basis {
    /// The basis of an answer asked at `asked_at` on the controller whose
    /// definition and state these are (a `state_version` or `revision` that
    /// is not a whole number reads as 0).
    pub fn of(definition: &Value, state: &Value, asked_at: &str) -> Basis {
        Basis {
            state_version: state["state_version"].as_u64().unwrap_or(0),
            revision: definition["revision"].as_u64().unwrap_or(0),
            asked_at: asked_at.to_string(),
        }
    }
}

/// An answer of the host, with its basis (what lands in [`FACTS_KEY`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Facts {
    /// What it was asked on.
    pub basis: Basis,
    /// A [`TriggerAnswer`] or a [`crate::ChildView`].
    pub answer: Value,
}

/// A decision the controller is about to write: its name, discriminator,
/// fields and delta (committed by the host with its record).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Planned {
    /// `automation.<x>`.
    pub name: String,
    /// What makes its key unique.
    pub discriminator: String,
    /// The record's fields.
    pub fields: Map<String, Value>,
    /// `{"state": {...}}`, and `definition` when it changes.
    pub delta: Value,
}

/// A fact to record without changing the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observed {
    /// `automation.<x>`.
    pub name: String,
    /// What makes its key unique.
    pub discriminator: String,
    /// The record's fields.
    pub fields: Map<String, Value>,
}

/// One record of a commit, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "as", rename_all = "lowercase")]
pub enum Entry {
    /// A decision (the state changes).
    Decision(Planned),
    /// An observation (the state does not change).
    Observation(Observed),
}

/// What `automation.commit` writes in one step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Commit {
    /// The time the decision is made as of (the [`Basis::asked_at`] of the
    /// answer it rests on), in the automation layer's spelling; absent, the
    /// step's own time.
    #[serde(default)]
    pub at: Option<String>,
    /// The records, in order; a key written before is not written again.
    #[serde(default)]
    pub entries: Vec<Entry>,
    /// Note `exhausted: true` in the state without a record: a source that
    /// keeps none of its own (a plugin) says so by ending. (The host also
    /// refreshes `active_revision` from the definition on every commit.)
    #[serde(default)]
    pub note_exhausted: bool,
    /// After the commit, park on the wake wait (`automation:<id>:wake`)
    /// instead of going on at once; the route is followed when it ends.
    #[serde(default)]
    pub park: Option<Park>,
}

/// The wake wait: a command, or the deadline, ends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Park {
    /// The deadline (the next due time or the retry time, in the
    /// automation layer's spelling), if there is one.
    pub until: Option<String>,
}

/// A trigger call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TriggerCall {
    /// The bound source's `prepare` on the persisted cursor.
    Prepare,
    /// The bound source's `admit` on the persisted cursor, and `normalize`
    /// of what it admits.
    Admit {
        /// The growing context's history to read with an admission.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history: Option<HistoryAsk>,
    },
    /// `manual@1`'s `normalize` of run-now command `command_id`, fired at
    /// `fired_at`.
    Manual {
        /// The run-now command's id.
        command_id: String,
        /// When it fires (the node's `now`).
        fired_at: String,
        /// The growing context's history to read with the admission.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history: Option<HistoryAsk>,
    },
}

/// The history a growing automation's occurrence is admitted with: the
/// prior turns of `session_id` (of `automation_id`'s occurrences when
/// set), read strictly and folded into a window of `max_tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryAsk {
    /// The session whose turns are read.
    pub session_id: String,
    /// Keep only this automation's occurrences (`None`: a wake in its
    /// caller's session reads the whole conversation).
    pub automation_id: Option<String>,
    /// The window's budget in estimated tokens.
    pub max_tokens: u64,
}

/// What the host knows at an admission, beside the trigger's answer: its
/// tool table (what an `auto` grant may pre-approve) and, when asked, the
/// history.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionFacts {
    /// Every tool of the host's table, by name, with its effect class
    /// (`read`, `write`, `exec`, `delegate`, `comms`, `memory-write`).
    #[serde(default)]
    pub tools: Vec<ToolFact>,
    /// The history, when the call asked for it.
    #[serde(default)]
    pub history: Option<History>,
}

/// A tool of the host's table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFact {
    /// Its name.
    pub name: String,
    /// Its effect class.
    pub class: String,
}

/// A session's history as chat messages and the window's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// `[user, assistant]` pairs, oldest first.
    pub messages: Vec<Value>,
    /// The window's report ([`crate::history::WindowReport::to_json`]).
    pub report: Value,
}

/// What a source's `prepare` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum TriggerWait {
    /// Nothing fires before `until`.
    Until {
        /// An RFC 3339 time.
        until: String,
    },
    /// No deadline: only a command moves it.
    Idle,
    /// It never fires again.
    Exhausted,
}

/// An admission and its envelope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Admitted {
    /// The admission's payload (`coalesced` says what it folded).
    pub payload: Value,
    /// Its normalized envelope `{event_id, source_id, source_version,
    /// fired_at, payload, binding_id}`.
    pub envelope: Value,
    /// An event source's named inputs for the occurrence (an object set on
    /// its `input_data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Value>,
    /// The source delivers content written by others (an event source):
    /// the envelope says `abstracttrust: untrusted` and the occurrence gets
    /// the untrusted tool grant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub untrusted: bool,
}

/// The answer of a [`TriggerCall`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum TriggerAnswer {
    /// The answer of [`TriggerCall::Prepare`].
    Prepare {
        /// When it fires.
        wait: TriggerWait,
    },
    /// The answer of [`TriggerCall::Admit`].
    Admit {
        /// The source's state after the call.
        state: Value,
        /// What it admitted (`None`: nothing is due, a stale wake).
        admitted: Option<Admitted>,
        /// The host's facts for the admission (absent when nothing was
        /// admitted).
        #[serde(default)]
        context: Option<AdmissionFacts>,
    },
    /// The answer of [`TriggerCall::Manual`].
    Manual {
        /// The normalized envelope.
        envelope: Value,
        /// The host's facts for the admission.
        #[serde(default)]
        context: Option<AdmissionFacts>,
    },
}

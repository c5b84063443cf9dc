//! The built-in effects: what the host does when a node's plan asks for one.
//! One module per family: [`waits`] (`ask_user`, `answer_user`,
//! `wait_event`, `wait_until`), [`events`] (`emit_event`), [`subworkflow`]
//! (`start_subworkflow`) and [`vars_query`].
//!
//! An effect either completes at once with a result (written to the
//! effect's `result_key`), parks the run on a [`WaitState`], or fails the
//! run with a message that starts with a reason code.

pub mod events;
pub mod subworkflow;
pub mod vars_query;
pub mod waits;

use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::core::model::{EffectRequest, RunState, WaitState};
use crate::core::runtime::Runtime;
use crate::core::Result;

/// Every effect kind the host executes.
pub const EFFECT_KINDS: &[&str] = &[
    "ask_user",
    "answer_user",
    "wait_event",
    "wait_until",
    "emit_event",
    "start_subworkflow",
    "vars_query",
];

/// What executing an effect led to.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done; this is the result.
    Completed(Value),
    /// The run must wait (the runtime fills in `resume_to_node` and `result_key`).
    Waiting(Box<WaitState>),
    /// The effect failed; the message starts with a reason code.
    Failed(String),
}

/// What an effect handler gets besides the effect itself.
pub(crate) struct EffectContext<'a> {
    pub runtime: &'a Runtime,
    pub run: &'a RunState,
    /// The effect's sequence number in its run (1 for the first effect).
    pub seq: u64,
    pub now: DateTime<Utc>,
    /// The effect's `started` ledger record, for handlers that append it
    /// themselves (ahead of the step's commit).
    pub started: &'a crate::core::model::StepRecord,
}

/// Executes `effect` for the run in `ctx`. `Err` is kept for failures of the
/// host itself (the store); anything wrong with the effect is an
/// [`Outcome::Failed`].
pub(crate) fn execute(ctx: &EffectContext<'_>, effect: &EffectRequest) -> Result<Outcome> {
    let Some(payload) = effect.payload.as_object() else {
        return Ok(Outcome::Failed(format!(
            "invalid_effect: {}.payload: must be a JSON object",
            effect.kind
        )));
    };
    match effect.kind.as_str() {
        "ask_user" => Ok(waits::ask_user(ctx, payload)),
        "answer_user" => Ok(waits::answer_user(payload)),
        "wait_event" => Ok(waits::wait_event(ctx, payload)),
        "wait_until" => Ok(waits::wait_until(ctx, payload)),
        "emit_event" => events::emit_event(ctx, payload),
        "start_subworkflow" => subworkflow::start_subworkflow(ctx, payload),
        "vars_query" => Ok(vars_query::vars_query(ctx, payload)),
        other => Ok(Outcome::Failed(format!(
            "unsupported_feature: unknown effect {other:?} (known: {})",
            EFFECT_KINDS.join(", ")
        ))),
    }
}

/// An `invalid_effect` failure naming the payload field.
pub(crate) fn invalid(kind: &str, field: &str, message: &str) -> Outcome {
    Outcome::Failed(format!("invalid_effect: {kind}.payload.{field}: {message}"))
}

/// The optional string field `key` of a payload.
pub(crate) fn opt_str<'a>(
    kind: &str,
    payload: &'a Map<String, Value>,
    key: &str,
) -> std::result::Result<Option<&'a str>, Outcome> {
    match payload.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(invalid(kind, key, "must be a string")),
    }
}

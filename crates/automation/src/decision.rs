//! Decisions and observations: how every transition of an automation is
//! written.
//!
//! A **decision** changes the automation's state: its ledger record (key
//! `automation:<x>:<id>:<discriminator>`) carries `state_version = n + 1`
//! and the full `delta`, and the same delta is applied to the controller
//! run (`_runtime.automation` keys replaced, `_meta.automation` replaced
//! when the delta has a `definition`). An **observation** records a fact
//! and changes nothing (`delta: {}`, the current `state_version`). Both are
//! written once per key: a key already in the ledger returns its payload
//! and writes nothing.
//!
//! The reference writes a decision in three steps (save an intent, append
//! the record, apply and save) and reconciles an intent left by a crash.
//! In stepwell the record and the changed run are one atomic commit
//! (the run transaction's commit, on every store), so a crash leaves
//! both or neither, and `intent` stays `null`: [`decide`] and [`observe`]
//! build the record and change the run in memory; the caller commits them
//! together.

use serde_json::{json, Map, Value};

use super::ids::{record_key, RECORD_SCHEMA_VERSION};
use super::queries::find_record;
use super::AutomationError;
use stepwell_runtime::core::model::{EffectRecord, RunState, StepRecord, StepStatus};

/// One transition to record.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition<'a> {
    /// `automation.<x>`.
    pub name: &'a str,
    /// What makes its key unique (an index, a run id, a command id).
    pub discriminator: &'a str,
    /// The record's own fields (beside the common ones).
    pub fields: Map<String, Value>,
    /// The node (or `create`, `command`) that writes it.
    pub node_id: &'a str,
    /// The command it answers, if any.
    pub command_id: Option<&'a str>,
    /// When it happens (the reference's timestamp spelling).
    pub at: &'a str,
}

/// What writing a transition gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The record's payload (the earlier one if the key was written before).
    pub payload: Value,
    /// The record to commit with the run, `None` if the key was written
    /// before (nothing to commit, the run unchanged).
    pub record: Option<StepRecord>,
}

fn state_of(run: &RunState) -> Result<&Map<String, Value>, AutomationError> {
    run.vars
        .get("_runtime")
        .and_then(|r| r.get("automation"))
        .and_then(Value::as_object)
        .ok_or_else(|| not_an_automation(run))
}

fn not_an_automation(run: &RunState) -> AutomationError {
    AutomationError::new(
        "automation_not_found",
        None,
        format!("run {} is not an automation", run.run_id),
    )
}

fn revision_of(definition: Option<&Value>) -> Option<u64> {
    definition?.get("revision")?.as_u64()
}

fn payload(
    run: &RunState,
    t: &Transition<'_>,
    revision: u64,
    state_version: u64,
    delta: Value,
) -> Value {
    let mut p = Map::new();
    p.insert("schema_version".into(), json!(RECORD_SCHEMA_VERSION));
    p.insert("automation_id".into(), json!(run.run_id));
    p.insert("revision".into(), json!(revision));
    p.insert("at".into(), json!(t.at));
    p.insert("state_version".into(), json!(state_version));
    p.insert("delta".into(), delta);
    for (k, v) in &t.fields {
        p.insert(k.clone(), v.clone());
    }
    if let Some(c) = t.command_id {
        p.insert("command_id".into(), json!(c));
    }
    Value::Object(p)
}

fn record(run: &RunState, t: &Transition<'_>, key: String, payload: &Value) -> StepRecord {
    StepRecord {
        step_id: key.clone(),
        run_id: run.run_id.clone(),
        node_id: Some(t.node_id.to_string()),
        status: StepStatus::Completed,
        effect: Some(EffectRecord {
            kind: "emit_event".into(),
            payload: json!({"name": t.name, "payload": payload}),
            result_key: None,
        }),
        result: Some(json!({"name": t.name, "state_version": payload["state_version"]})),
        error: None,
        started_at: t.at.to_string(),
        ended_at: Some(t.at.to_string()),
        attempt: 1,
        idempotency_key: Some(key),
        prev_hash: None,
        record_hash: None,
        vars: None,
        input: None,
    }
}

/// `t`'s key and the run's current `state_version` when `t` is not in
/// `ledger` yet; else (as `Err`) what was written for it.
#[allow(clippy::type_complexity)]
fn unwritten(
    run: &RunState,
    ledger: &[StepRecord],
    t: &Transition<'_>,
) -> Result<Result<(String, u64), Written>, AutomationError> {
    let key = record_key(t.name, &run.run_id, t.discriminator);
    if let Some(found) = find_record(ledger, &key) {
        return Ok(Err(Written {
            payload: found.payload.clone(),
            record: None,
        }));
    }
    let version = state_of(run)?
        .get("state_version")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(Ok((key, version)))
}

/// Decides `t` with `delta` (`{"state": {...}, "definition"?: {...}}`) on
/// controller `run`, whose ledger so far is `ledger`: builds the record and
/// applies the delta to `run` (state keys replaced, the definition replaced,
/// `state_version` + 1, `intent` null). The caller commits the record and
/// the run together.
pub fn decide(
    run: &mut RunState,
    ledger: &[StepRecord],
    t: &Transition<'_>,
    delta: Value,
) -> Result<Written, AutomationError> {
    let (key, version) = match unwritten(run, ledger, t)? {
        Err(written) => return Ok(written),
        Ok((key, version)) => (key, version + 1),
    };
    let revision = revision_of(delta.get("definition"))
        .or_else(|| revision_of(run.vars.get("_meta").and_then(|m| m.get("automation"))))
        .ok_or_else(|| not_an_automation(run))?;
    let payload = payload(run, t, revision, version, delta.clone());
    let record = record(run, t, key, &payload);
    if let Some(definition) = delta.get("definition") {
        let meta = run
            .vars
            .entry("_meta")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(m) = meta {
            m.insert("automation".into(), definition.clone());
        }
    }
    let state = run
        .vars
        .get_mut("_runtime")
        .and_then(|r| r.get_mut("automation"))
        .and_then(Value::as_object_mut)
        .expect("checked above");
    if let Some(Value::Object(changes)) = delta.get("state") {
        for (k, v) in changes {
            state.insert(k.clone(), v.clone());
        }
    }
    state.insert("state_version".into(), json!(version));
    state.insert("intent".into(), Value::Null);
    Ok(Written {
        payload,
        record: Some(record),
    })
}

/// Observes `t` on controller `run`: a record with `delta: {}` and the
/// current `state_version`; the run is unchanged.
pub fn observe(
    run: &RunState,
    ledger: &[StepRecord],
    t: &Transition<'_>,
) -> Result<Written, AutomationError> {
    let (key, version) = match unwritten(run, ledger, t)? {
        Err(written) => return Ok(written),
        Ok(found) => found,
    };
    let revision = revision_of(run.vars.get("_meta").and_then(|m| m.get("automation")))
        .ok_or_else(|| not_an_automation(run))?;
    let payload = payload(run, t, revision, version, json!({}));
    let record = record(run, t, key, &payload);
    Ok(Written {
        payload,
        record: Some(record),
    })
}

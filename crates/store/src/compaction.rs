//! Ledger checkpoints: what stands in a ledger for the records retention
//! compacted away ([`crate::Store::compact_ledger`]).
//!
//! A compacted ledger starts with one [`StepStatus::Checkpoint`] record at
//! the seq of the last record it replaced; the records after it keep their
//! seqs and their hashes. Its `prev_hash` is the hash of that replaced
//! record, which the next record names as its own `prev_hash`, so the
//! chain of everything kept still verifies ([`crate::ChainVerifier`]).
//!
//! The same transaction appends a **seal** at the end of the chain
//! ([`seal_record`]): an ordinary, chained record naming the checkpoint's
//! hash. A checkpoint no seal names does not verify: one changed by hand
//! (what it carries), moved, or cut off from its seal breaks the chain.
//! What this cannot prove: the chain has no key, so whoever can write the
//! store can also do what a compaction does (remove the oldest records,
//! write a checkpoint and append its seal), and on a run that retention
//! compacts that looks like a compaction; the runtime refuses a checkpoint
//! on any other run. What the checkpoint says about the records it replaced
//! (how many, the hash they ended on) can be matched against an archive of
//! them (`prune --archive`).

use serde::{Deserialize, Serialize};
use stepwell_model::model::{StepRecord, StepStatus, LEDGER_CHECKPOINT_STEP};

use crate::{link, StoreError};

/// What a checkpoint record says (its `result`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointBody {
    /// The seq of the last record it replaced (and its own seq).
    pub through_seq: u64,
    /// How many records it stands for (over every compaction of the
    /// ledger: an earlier checkpoint's count is carried on).
    pub replaced_records: u64,
    /// The `record_hash` of the record at `through_seq`: the hash the next
    /// record follows.
    pub replaced_head: String,
    /// When the ledger was compacted (RFC 3339, UTC).
    pub compacted_at: String,
    /// The replaced records that are still looked up by idempotency key (a
    /// command's result, so a repeated command is answered as before),
    /// oldest first, as they were stored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carried: Vec<StepRecord>,
}

/// The checkpoint record of `run_id` for `body`, linked: `prev_hash` is
/// `body.replaced_head`, `record_hash` its hash after it.
pub fn checkpoint_record(run_id: &str, body: &CheckpointBody) -> StepRecord {
    let mut record = retention_record(
        format!("{LEDGER_CHECKPOINT_STEP}{}", body.through_seq),
        run_id,
        StepStatus::Checkpoint,
        serde_json::to_value(body).unwrap_or_default(),
        &body.compacted_at,
    );
    let mut head = Some(body.replaced_head.clone());
    link(&mut head, &mut record);
    record
}

/// The `step_id` prefix of a checkpoint's seal: `sealed:checkpoint:<seq>`.
pub const SEAL_STEP: &str = "sealed:checkpoint:";

/// The seal of `checkpoint` (made by [`checkpoint_record`] for `body`),
/// not linked yet: the record a store appends at the end of the ledger in
/// the transaction that puts the checkpoint in place.
pub fn seal_record(run_id: &str, checkpoint: &StepRecord, body: &CheckpointBody) -> StepRecord {
    let sealed = serde_json::json!({"sealed_checkpoint": {
        "through_seq": body.through_seq,
        "checkpoint_hash": checkpoint.record_hash,
        "replaced_head": body.replaced_head,
        "replaced_records": body.replaced_records,
        "compacted_at": body.compacted_at,
    }});
    let step_id = format!("{SEAL_STEP}{}", body.through_seq);
    retention_record(
        step_id,
        run_id,
        StepStatus::Completed,
        sealed,
        &body.compacted_at,
    )
}

/// A run-level record retention writes at `at`, not linked.
fn retention_record(
    step_id: String,
    run_id: &str,
    status: StepStatus,
    result: serde_json::Value,
    at: &str,
) -> StepRecord {
    StepRecord {
        step_id,
        run_id: run_id.to_string(),
        node_id: None,
        status,
        effect: None,
        result: Some(result),
        vars: None,
        input: None,
        error: None,
        started_at: at.to_string(),
        ended_at: Some(at.to_string()),
        attempt: 1,
        idempotency_key: None,
        prev_hash: None,
        record_hash: None,
    }
}

/// The hash of the checkpoint `record` seals, if it is a seal.
pub fn seals(record: &StepRecord) -> Option<&str> {
    if !record.step_id.starts_with(SEAL_STEP) {
        return None;
    }
    record.result.as_ref()?["sealed_checkpoint"]["checkpoint_hash"].as_str()
}

/// What `record` says, if it is a checkpoint that reads as one.
pub fn checkpoint_body(record: &StepRecord) -> Option<CheckpointBody> {
    if record.status != StepStatus::Checkpoint {
        return None;
    }
    serde_json::from_value(record.result.clone()?).ok()
}

/// Checks a checkpoint the way the chain's first record is checked: its
/// step id and body agree with its hashes. `Err` names what does not.
pub fn check_checkpoint(record: &StepRecord) -> Result<(), &'static str> {
    let body = checkpoint_body(record).ok_or("checkpoint unreadable")?;
    if record.step_id != format!("{LEDGER_CHECKPOINT_STEP}{}", body.through_seq)
        || record.prev_hash.as_deref() != Some(body.replaced_head.as_str())
    {
        return Err("checkpoint inconsistent");
    }
    Ok(())
}

/// A checkpoint as a store writes it.
pub(crate) struct Stored {
    /// Its JSON.
    pub(crate) data: String,
    /// Its hash.
    pub(crate) hash: String,
    /// The hash of the record it replaces.
    pub(crate) replaced: String,
    /// Its seal, to append in the same transaction.
    pub(crate) seal: StepRecord,
}

/// `checkpoint` as a store writes it, refused unless it is a checkpoint of
/// `run_id` that checks.
pub(crate) fn stored_form(run_id: &str, checkpoint: &StepRecord) -> Result<Stored, StoreError> {
    let bad = |why: &str| StoreError::corrupt(format!("not a ledger checkpoint: {why}"));
    check_checkpoint(checkpoint).map_err(bad)?;
    if checkpoint.run_id != run_id {
        return Err(bad("it is another run's"));
    }
    let body = checkpoint_body(checkpoint).ok_or_else(|| bad("unreadable"))?;
    let (Some(hash), Some(replaced)) = (&checkpoint.record_hash, &checkpoint.prev_hash) else {
        return Err(bad("it is not linked"));
    };
    let data = serde_json::to_string(checkpoint).map_err(|e| bad(&e.to_string()))?;
    Ok(Stored {
        data,
        hash: hash.clone(),
        replaced: replaced.clone(),
        seal: seal_record(run_id, checkpoint, &body),
    })
}

/// Whether a store may put a checkpoint at seq `through` of `run_id`'s
/// ledger, given what it found there (`None`: no record): the hash of the
/// record at `through`, the run's committed seq and its last seq.
pub(crate) fn admit(
    run_id: &str,
    through: i64,
    found: Option<(Option<String>, i64, i64)>,
    replaced: &str,
) -> Result<(), StoreError> {
    let Some((hash, committed, last)) = found else {
        return Err(StoreError::conflict(format!(
            "run {run_id} has no ledger record at seq {through} to compact through"
        )));
    };
    if hash.as_deref() != Some(replaced) {
        return Err(StoreError::conflict(format!(
            "the record at seq {through} of run {run_id} is not the one the checkpoint replaces (compacted meanwhile?)"
        )));
    }
    if through >= last {
        return Err(StoreError::conflict(format!(
            "seq {through} is the last record of run {run_id}: a compaction keeps it"
        )));
    }
    if committed != last {
        return Err(StoreError::conflict(format!(
            "run {run_id} has records ahead of its state (committed through seq {committed} of {last}): a step is in flight"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_is_linked_after_what_it_replaced() {
        let body = CheckpointBody {
            through_seq: 7,
            replaced_records: 7,
            replaced_head: "ab".repeat(32),
            compacted_at: "2026-12-06T00:00:00.000000+00:00".into(),
            carried: vec![],
        };
        let r = checkpoint_record("run-1", &body);
        assert_eq!(r.step_id, "checkpoint:7");
        assert_eq!(r.prev_hash.as_deref(), Some(body.replaced_head.as_str()));
        assert_eq!(
            r.record_hash.as_deref(),
            Some(crate::chain_hash(r.prev_hash.as_deref(), &r).as_str())
        );
        assert_eq!(checkpoint_body(&r), Some(body));
        assert_eq!(check_checkpoint(&r), Ok(()));
        let mut moved = r.clone();
        moved.step_id = "checkpoint:6".into();
        assert_eq!(check_checkpoint(&moved), Err("checkpoint inconsistent"));
    }
}

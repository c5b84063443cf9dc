//! Property tests of what checks untrusted records: the ledger's hash
//! chain, on a ledger the runtime wrote. (The flat JSON reader's and the
//! integer scan's properties are unit tests of `stepwell-flat-json`, the
//! chain's on made-up records unit tests of the store.)

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use serde_json::{Map, Value};
use stepwell::{RunStatus, StartOptions, StepRecord};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A ledger the runtime wrote: `ask-user` asked and answered.
fn ledger() -> &'static Vec<StepRecord> {
    static LEDGER: OnceLock<Vec<StepRecord>> = OnceLock::new();
    LEDGER.get_or_init(|| {
        let rt = stepwell::builder(Arc::new(stepwell::MemoryStore::new()))
            .engine(stepwell_tests::engine())
            .build()
            .unwrap();
        rt.load_bundle(&stepwell_tests::example("ask-user"))
            .unwrap();
        let parked = rt.run("ask-user", StartOptions::default()).unwrap();
        let key = parked.waiting.unwrap().wait_key;
        let done = rt
            .resume(&parked.run_id, &key, serde_json::json!({"text": "Ann"}))
            .unwrap();
        assert_eq!(done.status, RunStatus::Completed);
        rt.get_ledger(&parked.run_id).unwrap()
    })
}

proptest! {
    #![proptest_config(config())]

    /// Any change to any field of any record of a ledger the runtime wrote
    /// breaks its chain at that record or before, and so does removing one
    /// (but the last) or swapping two.
    #[test]
    fn a_changed_ledger_breaks_its_chain(
        at in any::<prop::sample::Index>(),
        other in any::<prop::sample::Index>(),
        change in 0u8..6,
        text in "[a-z]{1,8}",
    ) {
        let mut records = ledger().clone();
        prop_assert!(stepwell::store::verify_chain(&records).is_ok());
        let (n, i) = (records.len(), at.index(records.len()));
        let j = other.index(n);
        match change {
            0 => records[i].node_id = Some(text.clone()),
            1 => {
                let changed = Map::from_iter([(text.clone(), Value::Null)]);
                records[i].result = Some(Value::Object(changed));
            }
            2 => records[i].attempt += 1,
            3 => records[i].idempotency_key = Some(text.clone()),
            4 if i + 1 < n => {
                records.remove(i);
            }
            _ if j != i => records.swap(i, j),
            _ => records[i].step_id = text.clone(),
        }
        let broken = stepwell::store::verify_chain(&records);
        prop_assert!(broken.is_err(), "change {} at {} went unnoticed", change, i);
        prop_assert!(broken.unwrap_err().index <= i.max(j) + 1);
    }
}

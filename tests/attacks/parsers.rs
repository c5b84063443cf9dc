//! Property tests of what reads untrusted text or checks untrusted records:
//! the flat JSON reader a guest's vars patch goes through, the scan for
//! integers beyond 64 bits every door runs, and the ledger's hash chain.
//! Random inputs, each compared with an oracle (serde_json, Rust's own
//! integer parsing, a ledger the runtime wrote).

use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use serde_json::{Map, Value};
use stepwell::{RunStatus, StartOptions, StepRecord};
use stepwell_flat_json::{find_inexact_integer, read_flat_object};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A JSON scalar as text: integers at and past the 64-bit bounds, floats,
/// strings with escapes and non-ASCII, and the literals.
fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        "-?[0-9]{15,30}",
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        "-?[0-9]{1,4}\\.[0-9]{1,6}",
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
        "[a-zA-Zé€ \\\\\"/\\t]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap()),
        "\"[a-z]{0,4}(\\\\u00[0-9a-f]{2}|\\\\n)?\"",
    ]
}

/// A flat object as text (keys may repeat), then maybe damaged: cut short,
/// or a byte replaced.
fn object_text() -> impl Strategy<Value = String> {
    let pair = ("[a-z_]{0,6}", scalar(), "[ \\n]{0,2}");
    (
        prop::collection::vec(pair, 0..8),
        0u8..4,
        any::<prop::sample::Index>(),
        "[{}\\[\\],:\"0-9a ]",
    )
        .prop_map(|(pairs, damage, at, byte)| {
            let body: Vec<String> = pairs
                .iter()
                .map(|(k, v, ws)| format!("{ws}\"{k}\"{ws}:{ws}{v}{ws}"))
                .collect();
            let text = format!("{{{}}}", body.join(","));
            let cut = at.index(text.len().max(1));
            let cut = (0..=cut)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            match damage {
                0 => text[..cut].to_string(),
                1 => format!("{}{byte}{}", &text[..cut], &text[cut..]),
                _ => text,
            }
        })
}

/// A JSON array of integer literals of any length, as text.
fn integers() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("-?[1-9][0-9]{0,24}|0", 1..6)
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

    /// Whatever the flat reader takes, serde_json reads the same object
    /// from the same text; what it declines is left to serde_json.
    #[test]
    fn the_flat_reader_agrees_with_serde_json(text in object_text()) {
        if let Some(flat) = read_flat_object(&text) {
            let full: Value = serde_json::from_str(&text)
                .map_err(|e| TestCaseError::fail(format!("took {text:?}, serde_json: {e}")))?;
            prop_assert_eq!(Value::Object(flat), full, "{}", text);
        }
    }

    /// The scan finds an integer literal exactly when one fits neither
    /// i64 nor u64, and names the first such.
    #[test]
    fn the_integer_scan_finds_exactly_what_does_not_fit(ints in integers()) {
        let text = format!("{{\"a\":[{}],\"b\":1.5e300}}", ints.join(","));
        let inexact: Vec<&String> = ints
            .iter()
            .filter(|n| n.parse::<i64>().is_err() && n.parse::<u64>().is_err())
            .collect();
        let found = find_inexact_integer(&text);
        prop_assert_eq!(found.is_some(), !inexact.is_empty(), "{}", text);
        if let Some(found) = found {
            prop_assert_eq!(&found.literal, inexact[0]);
        }
    }

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

//! Random inputs for the property tests of stepwell's crates (proptest
//! strategies), shared by the modules that test with them: a
//! dev-dependency only.

use proptest::prelude::*;
use serde_json::{Map, Value};

/// 256 cases a property, and no regression files in the source tree (a
/// failure prints its smallest input).
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A JSON scalar: the literals, integers across both 64-bit ranges,
/// finite floats, any text.
pub fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        any::<String>().prop_map(Value::String),
    ]
}

/// A JSON value nested up to four levels: `leaf` values in arrays and
/// objects whose keys `key` draws.
pub fn value_from(
    leaf: BoxedStrategy<Value>,
    key: BoxedStrategy<String>,
) -> impl Strategy<Value = Value> {
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A JSON value nested up to four levels, of any scalars and keys.
pub fn value() -> impl Strategy<Value = Value> {
    value_from(scalar().boxed(), any::<String>().boxed())
}

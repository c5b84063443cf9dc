//! A trigger plugin with an invalid descriptor (version 0, an id with a
//! space, a schema that is not JSON): listed unavailable with the reason.
//! Its `prepare` loops forever, for the tests of calls under the time limit.
use serde_json::Value;
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::*;

struct Bad;

impl TriggerSource for Bad {
    fn descriptor() -> Descriptor {
        Descriptor::new("bad source", 0, "Bad", Kind::Time)
    }
    fn validate(config: Value, _: &str) -> Result<Value, TriggerError> {
        Ok(config)
    }
    fn initial_state(_: &Binding, _: &str) -> Result<Value, TriggerError> {
        Ok(Value::Null)
    }
    fn prepare(_: &Binding, _: &Value, _: &str, _: &[Value]) -> Result<Wait, TriggerError> {
        let mut i: u64 = 0;
        loop {
            i = std::hint::black_box(i.wrapping_add(1));
        }
    }
    fn admit(
        _: &Binding,
        s: &Value,
        _: &str,
        _: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        Ok((None, s.clone()))
    }
    fn rearm(_: &Binding, s: &Value, _: &str) -> Result<Value, TriggerError> {
        Ok(s.clone())
    }
}

export_trigger_source!(Bad);

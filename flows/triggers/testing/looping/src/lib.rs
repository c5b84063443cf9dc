//! A trigger plugin whose descriptor never returns: the registry must list it
//! unavailable (time limit) and keep every other source working.
use serde_json::Value;
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::*;

struct Looping;

impl TriggerSource for Looping {
    fn descriptor() -> Descriptor {
        let mut i: u64 = 0;
        loop {
            i = std::hint::black_box(i.wrapping_add(1));
        }
    }
    fn validate(config: Value, _: &str) -> Result<Value, TriggerError> {
        Ok(config)
    }
    fn initial_state(_: &Binding, _: &str) -> Result<Value, TriggerError> {
        Ok(Value::Null)
    }
    fn prepare(_: &Binding, _: &Value, _: &str, _: &[Value]) -> Result<Wait, TriggerError> {
        Ok(Wait::Idle)
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

export_trigger_source!(Looping);

//! Waits: `ask_user`, `wait_event`, `wait_until`, and `answer_user` (which
//! shows a person a message without waiting).

use chrono::Duration;
use serde_json::{json, Map, Value};

use super::{invalid, opt_str, EffectContext, Outcome};
use crate::core::clock::{format_time, parse_time};
use crate::core::model::{WaitReason, WaitState};

fn wait(reason: WaitReason, wait_key: String) -> WaitState {
    WaitState {
        reason,
        wait_key,
        until: None,
        resume_to_node: None,
        result_key: None,
        prompt: None,
        choices: None,
        details: None,
    }
}

/// `ask_user {prompt, choices?, wait_key?, details?}`: waits (reason `user`)
/// for a person's answer. The resume payload (conventionally `{"text": ...}`)
/// is written to the effect's `result_key`.
pub(crate) fn ask_user(ctx: &EffectContext<'_>, p: &Map<String, Value>) -> Outcome {
    let k = "ask_user";
    let prompt = match opt_str(k, p, "prompt") {
        Ok(Some(s)) => s.to_string(),
        Ok(None) => return invalid(k, "prompt", "is required"),
        Err(o) => return o,
    };
    let choices = match p.get("choices") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                match item.as_str() {
                    Some(s) => out.push(s.to_string()),
                    None => return invalid(k, "choices", "must be an array of strings"),
                }
            }
            Some(out)
        }
        Some(_) => return invalid(k, "choices", "must be an array of strings"),
    };
    let key = match opt_str(k, p, "wait_key") {
        Ok(Some(s)) => s.to_string(),
        Ok(None) => format!("ask_user:{}:{}", ctx.run.run_id, ctx.seq),
        Err(o) => return o,
    };
    let mut w = wait(WaitReason::User, key);
    w.prompt = Some(prompt);
    w.choices = choices;
    w.details = p.get("details").cloned();
    Outcome::Waiting(Box::new(w))
}

/// `answer_user {message}`: shows a message to a person; does not wait. The
/// result is `{"message": ...}`, and the ledger keeps it.
pub(crate) fn answer_user(p: &Map<String, Value>) -> Outcome {
    match opt_str("answer_user", p, "message") {
        Ok(Some(m)) => Outcome::Completed(json!({ "message": m })),
        Ok(None) => invalid("answer_user", "message", "is required"),
        Err(o) => o,
    }
}

/// `wait_event {wait_key | name, until?, details?}`: waits (reason `event`)
/// until a resume or an `emit_event` delivers a payload under the key. With
/// `until`, the wait resolves with `{"timed_out": true}` once the deadline
/// passes.
pub(crate) fn wait_event(ctx: &EffectContext<'_>, p: &Map<String, Value>) -> Outcome {
    let k = "wait_event";
    let key = match (opt_str(k, p, "wait_key"), opt_str(k, p, "name")) {
        (Err(o), _) | (_, Err(o)) => return o,
        (Ok(Some(key)), _) | (Ok(None), Ok(Some(key))) => key.to_string(),
        (Ok(None), Ok(None)) => return invalid(k, "wait_key", "is required"),
    };
    let mut w = wait(WaitReason::Event, key);
    match opt_str(k, p, "until") {
        Err(o) => return o,
        Ok(None) => {}
        Ok(Some(s)) => match parse_time(s) {
            Ok(t) if t <= ctx.now => return Outcome::Completed(json!({ "timed_out": true })),
            Ok(t) => w.until = Some(format_time(t)),
            Err(e) => return invalid(k, "until", &e),
        },
    }
    w.details = p.get("details").cloned();
    Outcome::Waiting(Box::new(w))
}

/// `wait_until {until | seconds}`: waits (reason `until`) until an RFC 3339
/// time, or `seconds` after now. A time already past completes at once. When
/// the wait ends, `{"until": ...}` is written to the `result_key`.
pub(crate) fn wait_until(ctx: &EffectContext<'_>, p: &Map<String, Value>) -> Outcome {
    let k = "wait_until";
    let until = match (opt_str(k, p, "until"), p.get("seconds")) {
        (Err(o), _) => return o,
        (Ok(Some(s)), _) => match parse_time(s) {
            Ok(t) => t,
            Err(e) => return invalid(k, "until", &e),
        },
        (Ok(None), Some(v)) => match v.as_f64().filter(|s| *s >= 0.0 && s.is_finite()) {
            Some(s) => ctx.now + Duration::microseconds((s * 1e6) as i64),
            None => return invalid(k, "seconds", "must be a number >= 0"),
        },
        (Ok(None), None) => return invalid(k, "until", "is required (or give seconds)"),
    };
    let until_s = format_time(until);
    if until <= ctx.now {
        return Outcome::Completed(json!({ "until": until_s }));
    }
    let mut w = wait(WaitReason::Until, format!("until:{until_s}"));
    w.until = Some(until_s);
    Outcome::Waiting(Box::new(w))
}

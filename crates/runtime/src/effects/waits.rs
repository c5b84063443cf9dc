//! Waits: `ask_user`, `wait_event`, `wait_until`, and `answer_user` (which
//! shows a person a message without waiting). All pure.

use chrono::{DateTime, Utc};
use serde_json::{json, Map, Value};

use super::{opt_str, EffectClass, EffectCx, EffectHandler, Outcome};
use crate::core::clock::{format_time, parse_time};
use crate::core::model::{WaitReason, WaitState};
use crate::core::Result;

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

/// The latest time a wait may end at: stored times are RFC 3339 with a
/// four-digit year.
pub fn latest_time() -> DateTime<Utc> {
    use chrono::TimeZone;
    Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59)
        .single()
        .expect("a valid date")
}

/// A time from an `until` field: RFC 3339 with an offset, no later than
/// year 9999.
fn until_field(kind: &str, field: &str, text: &str) -> std::result::Result<DateTime<Utc>, Outcome> {
    let t = parse_time(text).map_err(|e| Outcome::invalid(kind, field, &e))?;
    if t > latest_time() {
        return Err(Outcome::invalid(kind, field, "is after the year 9999"));
    }
    Ok(t)
}

/// `ask_user {prompt, choices?, wait_key?, details?}`: waits (reason `user`)
/// for a person's answer. The resume payload (conventionally `{"text": ...}`)
/// is written to the effect's `result_key`.
pub struct AskUser;

impl EffectHandler for AskUser {
    fn kind(&self) -> &str {
        "ask_user"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        let k = "ask_user";
        let prompt = match opt_str(k, p, "prompt") {
            Ok(Some(s)) => s.to_string(),
            Ok(None) => return Ok(Outcome::invalid(k, "prompt", "is required")),
            Err(o) => return Ok(o),
        };
        let choices = match p.get("choices") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    match item.as_str() {
                        Some(s) => out.push(s.to_string()),
                        None => {
                            return Ok(Outcome::invalid(
                                k,
                                "choices",
                                "must be an array of strings",
                            ))
                        }
                    }
                }
                Some(out)
            }
            Some(_) => {
                return Ok(Outcome::invalid(
                    k,
                    "choices",
                    "must be an array of strings",
                ))
            }
        };
        let key = match opt_str(k, p, "wait_key") {
            Ok(Some(s)) => s.to_string(),
            Ok(None) => format!("ask_user:{}:{}", cx.run.run_id, cx.seq),
            Err(o) => return Ok(o),
        };
        let mut w = wait(WaitReason::User, key);
        w.prompt = Some(prompt);
        w.choices = choices;
        w.details = p.get("details").cloned();
        Ok(Outcome::Waiting(Box::new(w)))
    }
}

/// `answer_user {message}`: shows a message to a person; does not wait. The
/// result is `{"message": ...}`, and the ledger keeps it.
pub struct AnswerUser;

impl EffectHandler for AnswerUser {
    fn kind(&self) -> &str {
        "answer_user"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        _: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        Ok(match opt_str("answer_user", p, "message") {
            Ok(Some(m)) => Outcome::Completed(json!({ "message": m })),
            Ok(None) => Outcome::invalid("answer_user", "message", "is required"),
            Err(o) => o,
        })
    }
}

/// The wait key of an event `name` in `scope`, as the reference runtime
/// builds it: `evt:<scope>:<scope id>:<name>`, where the scope id is the
/// session (`session`: the given session, else the run's session, else the
/// run's own id), the run's workflow (`workflow`), the run itself (`run`)
/// or the literal `global` (`global`).
pub fn event_wait_key(
    scope: &str,
    name: &str,
    session_id: Option<&str>,
    run: &crate::core::model::RunState,
) -> std::result::Result<String, String> {
    let scope = scope.trim().to_ascii_lowercase();
    let name = name.trim();
    if name.is_empty() {
        return Err("event name is required".into());
    }
    let id = match scope.as_str() {
        "session" => session_id
            .or(run.session_id.as_deref())
            .unwrap_or(&run.run_id)
            .trim()
            .to_string(),
        "workflow" => run.workflow_id.clone(),
        "run" => run.run_id.clone(),
        "global" => "global".to_string(),
        other => {
            return Err(format!(
                "unknown event scope {other:?} (session, workflow, run or global)"
            ))
        }
    };
    if id.is_empty() {
        return Err(format!("missing scope id for scope {scope:?}"));
    }
    Ok(format!(
        "{EVENT_KEY_PREFIX}{scope}:{}:{}",
        key_part(&id),
        key_part(name)
    ))
}

/// How every event wait key starts. A flow cannot wait on such a key by
/// giving it as `wait_key`: only a name and a scope lead there.
pub const EVENT_KEY_PREFIX: &str = "evt:";

/// A scope id or name as a part of an event key: `%` and `:` are
/// percent-encoded, so that no id and name can make the key of another
/// scope (a workflow `a` emitting `b:c` must not reach workflow `a:b`'s
/// wait on `c`). Parts without either (all the reference runtime's usual
/// names) are unchanged.
fn key_part(part: &str) -> std::borrow::Cow<'_, str> {
    if part.contains([':', '%']) {
        part.replace('%', "%25").replace(':', "%3A").into()
    } else {
        part.into()
    }
}

/// `wait_event {wait_key | name, scope?, session_id?, until?, details?}`:
/// waits (reason `event`) until a resume or an `emit_event` delivers a
/// payload under the key. `wait_key` is used as it is (only an explicit
/// resume reaches it; a key starting with `evt:` is refused, so that no
/// flow can listen in on another scope's events); `name` (or `event_name`)
/// is keyed by scope (default
/// `session`) as [`event_wait_key`] says, which is what `emit_event` of the
/// same name and scope reaches. With `until`, the wait resolves with
/// `{"timed_out": true}` once the deadline passes.
pub struct WaitEvent;

impl EffectHandler for WaitEvent {
    fn kind(&self) -> &str {
        "wait_event"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        let k = "wait_event";
        let field = |f: &str| opt_str(k, p, f);
        let key = match (field("wait_key"), field("name"), field("event_name")) {
            (Err(o), _, _) | (_, Err(o), _) | (_, _, Err(o)) => return Ok(o),
            (Ok(Some(key)), _, _) if key.starts_with(EVENT_KEY_PREFIX) => {
                return Ok(Outcome::invalid(
                    k,
                    "wait_key",
                    "must not start with \"evt:\": the keys of named events belong to emit_event (wait with name and scope instead)",
                ))
            }
            (Ok(Some(key)), _, _) => key.to_string(),
            (Ok(None), Ok(Some(name)), _) | (Ok(None), Ok(None), Ok(Some(name))) => {
                let scope = match field("scope") {
                    Ok(s) => s.unwrap_or("session"),
                    Err(o) => return Ok(o),
                };
                let session = match field("session_id") {
                    Ok(s) => s,
                    Err(o) => return Ok(o),
                };
                match event_wait_key(scope, name, session, cx.run) {
                    Ok(key) => key,
                    Err(e) => return Ok(Outcome::invalid(k, "scope", &e)),
                }
            }
            (Ok(None), Ok(None), Ok(None)) => {
                return Ok(Outcome::invalid(
                    k,
                    "wait_key",
                    "is required (or give name)",
                ))
            }
        };
        let mut w = wait(WaitReason::Event, key);
        match field("until") {
            Err(o) => return Ok(o),
            Ok(None) => {}
            Ok(Some(s)) => match until_field(k, "until", s) {
                Ok(t) if t <= cx.now => {
                    return Ok(Outcome::Completed(json!({ "timed_out": true })))
                }
                Ok(t) => w.until = Some(format_time(t)),
                Err(o) => return Ok(o),
            },
        }
        w.details = p.get("details").cloned();
        Ok(Outcome::Waiting(Box::new(w)))
    }
}

/// `wait_until {until | seconds}`: waits (reason `until`) until an RFC 3339
/// time, or `seconds` after now. A time already past completes at once. When
/// the wait ends, `{"until": ...}` is written to the `result_key`. A time
/// after the year 9999 is `invalid_effect`.
pub struct WaitUntil;

impl EffectHandler for WaitUntil {
    fn kind(&self) -> &str {
        "wait_until"
    }

    fn class(&self) -> EffectClass {
        EffectClass::Pure
    }

    fn execute(
        &self,
        cx: &EffectCx<'_>,
        p: &Map<String, Value>,
        _: Option<&Value>,
    ) -> Result<Outcome> {
        let k = "wait_until";
        let until = match (opt_str(k, p, "until"), p.get("seconds")) {
            (Err(o), _) => return Ok(o),
            (Ok(Some(s)), _) => match until_field(k, "until", s) {
                Ok(t) => t,
                Err(o) => return Ok(o),
            },
            (Ok(None), Some(v)) => {
                let Some(secs) = v.as_f64().filter(|s| *s >= 0.0 && s.is_finite()) else {
                    return Ok(Outcome::invalid(k, "seconds", "must be a number >= 0"));
                };
                // Saturating: 1e13 s is far past the year 9999 either way.
                let micros = (secs * 1e6).min(i64::MAX as f64) as i64;
                let later = cx
                    .now
                    .checked_add_signed(chrono::Duration::microseconds(micros))
                    .filter(|t| *t <= latest_time());
                match later {
                    Some(t) => t,
                    None => return Ok(Outcome::invalid(k, "seconds", "ends after the year 9999")),
                }
            }
            (Ok(None), None) => {
                return Ok(Outcome::invalid(
                    k,
                    "until",
                    "is required (or give seconds)",
                ))
            }
        };
        let until_s = format_time(until);
        if until <= cx.now {
            return Ok(Outcome::Completed(json!({ "until": until_s })));
        }
        let mut w = wait(WaitReason::Until, format!("until:{until_s}"));
        w.until = Some(until_s);
        Ok(Outcome::Waiting(Box::new(w)))
    }
}

//! `schedule@1`: fires on a fixed grid `anchor + k * every` (k = 0, 1, ...)
//! of UTC instants. Ticks never drift; missed ticks are coalesced into one
//! admission for the latest due tick; `rearm` skips the past.
//!
//! Config: `{start_at?, every?, until?, count?, anchor?}`:
//! - timestamps are RFC 3339 with an explicit offset;
//! - `every` matches `^[1-9][0-9]*[smhd]$`, at most 366d, fixed UTC lengths;
//! - `start_at` defaults to the creation time (`now` of `validate`), `anchor`
//!   to `start_at`, and must equal it;
//! - `until` is exclusive and after `start_at`;
//! - `count` (1..=1,000,000) counts scheduled admissions; `count > 1` needs
//!   `every`; without `every` the source fires once.
//!
//! State: `{"next_tick": k, "admitted": n}`.
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::*;

const MAX_EVERY_S: i64 = 366 * 86_400;
const MAX_COUNT: u64 = 1_000_000;
const FIELDS: [&str; 5] = ["start_at", "every", "until", "count", "anchor"];

/// A validated config, in microseconds since the Unix epoch.
struct Config {
    anchor: i64,
    every: Option<i64>,
    until: Option<i64>,
    count: Option<u64>,
}

fn field(name: &str) -> String {
    format!("trigger.config.{name}")
}

fn parse_time(name: &str, text: &str) -> Result<i64, TriggerError> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_micros())
        .map_err(|e| {
            TriggerError::invalid(
                name,
                format!("{text:?} is not an RFC 3339 timestamp with an explicit offset ({e})"),
            )
        })
}

fn format_time(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        .unwrap_or_else(|| us.to_string())
}

/// `every` in seconds, if the text is a valid duration.
fn parse_every(text: &str) -> Result<i64, TriggerError> {
    let bad = || {
        TriggerError::invalid(
            field("every"),
            format!("{text:?} must match ^[1-9][0-9]*[smhd]$ (for example 30s, 5m, 24h, 7d)"),
        )
    };
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    let n: i64 = digits.parse().map_err(|_| bad())?;
    match n.checked_mul(unit) {
        Some(s) if s <= MAX_EVERY_S => Ok(s),
        _ => Err(TriggerError::invalid(
            field("every"),
            format!("{text:?} is longer than 366d"),
        )),
    }
}

fn str_field<'a>(map: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, TriggerError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(TriggerError::invalid(field(name), "must be a string")),
    }
}

fn config_of(binding: &Binding) -> Result<Config, TriggerError> {
    let map = binding
        .config
        .as_object()
        .ok_or_else(|| TriggerError::invalid("binding.config", "must be an object"))?;
    let anchor = match str_field(map, "anchor")?.or(str_field(map, "start_at")?) {
        Some(t) => parse_time(&field("anchor"), t)?,
        None => {
            return Err(TriggerError::invalid(
                "binding.config.start_at",
                "missing: pass the config through validate first",
            ))
        }
    };
    Ok(Config {
        anchor,
        every: str_field(map, "every")?
            .map(parse_every)
            .transpose()?
            .map(|s| s * 1_000_000),
        until: str_field(map, "until")?
            .map(|t| parse_time(&field("until"), t))
            .transpose()?,
        count: map.get("count").and_then(Value::as_u64),
    })
}

#[derive(Clone, Copy)]
struct State {
    next_tick: u64,
    admitted: u64,
}

fn state_of(v: &Value) -> Result<State, TriggerError> {
    let get = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| TriggerError::invalid(format!("state.{k}"), "must be a whole number"))
    };
    Ok(State {
        next_tick: get("next_tick")?,
        admitted: get("admitted")?,
    })
}

fn state_value(s: State) -> Value {
    json!({ "next_tick": s.next_tick, "admitted": s.admitted })
}

impl Config {
    /// The instant of tick `k`, if it exists (on the grid, before `until`).
    fn tick(&self, k: u64) -> Option<i64> {
        let t = match self.every {
            None if k == 0 => self.anchor,
            None => return None,
            Some(every) => i64::try_from(k)
                .ok()?
                .checked_mul(every)?
                .checked_add(self.anchor)?,
        };
        match self.until {
            Some(until) if t >= until => None,
            _ => Some(t),
        }
    }

    /// The last tick at or before `now` (None before the first tick).
    fn last_at_or_before(&self, now: i64) -> Option<u64> {
        if now < self.anchor {
            return None;
        }
        let k = match self.every {
            None => 0,
            Some(every) => ((now - self.anchor) / every) as u64,
        };
        // Clamp to the last tick before `until`.
        let mut k = k;
        if let (Some(until), Some(every)) = (self.until, self.every) {
            let last = ((until - self.anchor - 1) / every) as u64;
            k = k.min(last);
        }
        Some(k)
    }

    fn exhausted(&self, s: State) -> bool {
        self.count.is_some_and(|c| s.admitted >= c) || self.tick(s.next_tick).is_none()
    }
}

fn now_of(now: &str) -> Result<i64, TriggerError> {
    parse_time("now", now)
}

struct Schedule;

impl TriggerSource for Schedule {
    fn descriptor() -> Descriptor {
        Descriptor {
            config_schema: json!({
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "start_at": {"type": "string", "format": "date-time"},
                    "every": {"type": "string", "pattern": "^[1-9][0-9]*[smhd]$"},
                    "until": {"type": "string", "format": "date-time"},
                    "count": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT},
                    "anchor": {"type": "string", "format": "date-time"}
                }
            }),
            event_schema: json!({
                "type": "object",
                "required": ["tick", "scheduled_at"],
                "properties": {
                    "tick": {"type": "integer", "minimum": 0},
                    "scheduled_at": {"type": "string", "format": "date-time"},
                    "coalesced": {
                        "type": "object",
                        "required": ["first_tick", "last_tick", "missed_count"]
                    }
                }
            }),
            ..Descriptor::new("schedule", 1, "Schedule (fixed UTC intervals)", Kind::Time)
        }
    }

    fn validate(config: Value, now: &str) -> Result<Value, TriggerError> {
        let map = match config {
            Value::Null => Map::new(),
            Value::Object(m) => m,
            _ => return Err(TriggerError::invalid("trigger.config", "must be an object")),
        };
        if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(TriggerError::invalid(
                field(k),
                format!("unknown field (known: {})", FIELDS.join(", ")),
            ));
        }
        let start_at = match str_field(&map, "start_at")? {
            Some(t) => parse_time(&field("start_at"), t)?,
            None => now_of(now)?,
        };
        let every = str_field(&map, "every")?;
        let every_s = every.map(parse_every).transpose()?;
        let until = str_field(&map, "until")?
            .map(|t| parse_time(&field("until"), t))
            .transpose()?;
        if let Some(u) = until {
            if u <= start_at {
                return Err(TriggerError::invalid(
                    field("until"),
                    "must be after start_at (until is exclusive)",
                ));
            }
        }
        let count = match map.get("count") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if (1..=MAX_COUNT).contains(&n) => Some(n),
                _ => {
                    return Err(TriggerError::invalid(
                        field("count"),
                        format!("must be a whole number from 1 to {MAX_COUNT}"),
                    ))
                }
            },
        };
        if count.is_some_and(|c| c > 1) && every_s.is_none() {
            return Err(TriggerError::invalid(
                field("count"),
                "count greater than 1 requires every",
            ));
        }
        let anchor = match str_field(&map, "anchor")? {
            Some(t) => parse_time(&field("anchor"), t)?,
            None => start_at,
        };
        if anchor != start_at {
            return Err(TriggerError::unsupported(
                field("anchor"),
                "anchor must equal start_at in schedule@1",
            ));
        }
        let mut out = Map::new();
        out.insert("start_at".into(), json!(format_time(start_at)));
        out.insert("anchor".into(), json!(format_time(anchor)));
        if let Some(e) = every {
            out.insert("every".into(), json!(e));
        }
        if let Some(u) = until {
            out.insert("until".into(), json!(format_time(u)));
        }
        if let Some(c) = count {
            out.insert("count".into(), json!(c));
        }
        Ok(Value::Object(out))
    }

    fn initial_state(binding: &Binding, _now: &str) -> Result<Value, TriggerError> {
        config_of(binding)?;
        Ok(state_value(State {
            next_tick: 0,
            admitted: 0,
        }))
    }

    fn prepare(binding: &Binding, state: &Value, _now: &str) -> Result<Wait, TriggerError> {
        let cfg = config_of(binding)?;
        let s = state_of(state)?;
        if cfg.exhausted(s) {
            return Ok(Wait::Exhausted);
        }
        let t = cfg.tick(s.next_tick).expect("not exhausted");
        Ok(Wait::Until(format_time(t)))
    }

    fn admit(
        binding: &Binding,
        state: &Value,
        now: &str,
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        let cfg = config_of(binding)?;
        let s = state_of(state)?;
        let now_us = now_of(now)?;
        if cfg.exhausted(s) || cfg.tick(s.next_tick).is_none_or(|t| t > now_us) {
            return Ok((None, state_value(s)));
        }
        let first = s.next_tick;
        let last = cfg
            .last_at_or_before(now_us)
            .expect("a tick is due")
            .max(first);
        let scheduled_at = cfg.tick(last).expect("the latest due tick exists");
        let mut payload = json!({ "tick": last, "scheduled_at": format_time(scheduled_at) });
        if last > first {
            payload["coalesced"] = json!({
                "first_tick": first,
                "last_tick": last,
                "missed_count": last - first,
            });
        }
        let admission = Admission {
            event_id: format!("schedule@1:{}:{last}", binding.binding_id),
            fired_at: format_time(now_us),
            payload,
        };
        let next = State {
            next_tick: last + 1,
            admitted: s.admitted + 1,
        };
        Ok((Some(admission), state_value(next)))
    }

    fn rearm(binding: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
        let cfg = config_of(binding)?;
        let mut s = state_of(state)?;
        if let Some(k) = cfg.last_at_or_before(now_of(now)?) {
            s.next_tick = s.next_tick.max(k + 1);
        }
        Ok(state_value(s))
    }
}

export_trigger_source!(Schedule);

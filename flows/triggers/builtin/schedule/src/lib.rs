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
//! State (the reference's trigger slice): `{"anchor", "tick", "scheduled_count",
//! "exhausted"}`: the grid's anchor, the next tick that may fire, the
//! scheduled admissions so far, and whether none ever will again. An
//! admission's `fired_at` is the admitted tick's time.
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

/// The latest instant the reference can write (9999-12-31T23:59:59.999999Z).
const LAST_US: i64 = 253_402_300_799_999_999;
/// The earliest (0001-01-01T00:00:00Z).
const FIRST_US: i64 = -62_135_596_800_000_000;

fn parse_time(name: &str, text: &str) -> Result<i64, TriggerError> {
    use chrono::Timelike;
    let t = DateTime::parse_from_rfc3339(text.trim())
        .map(|t| (t.timestamp_micros(), t.nanosecond()))
        .map_err(|e| {
            let naive =
                chrono::NaiveDateTime::parse_from_str(text.trim(), "%Y-%m-%dT%H:%M:%S%.f").is_ok();
            let why = if naive {
                "must carry a UTC offset (e.g. 'Z')".to_string()
            } else {
                format!("is not an RFC 3339 timestamp with an explicit offset ({e})")
            };
            TriggerError::invalid(name, format!("{text:?} {why}"))
        })?;
    match t {
        (_, nanos) if nanos >= 1_000_000_000 => Err(TriggerError::invalid(
            name,
            format!("{text:?} is a leap second, which is not a valid time"),
        )),
        (us, _) if !(FIRST_US..=LAST_US).contains(&us) => Err(TriggerError::invalid(
            name,
            format!("{text:?} is outside the years 0001 to 9999 (UTC)"),
        )),
        (us, _) => Ok(us),
    }
}

/// The reference's spelling of an instant: UTC, `+00:00`, and exactly six
/// fraction digits when the microseconds are not zero
/// (`2026-01-01T00:02:00+00:00`, `2026-01-01T00:00:00.500000+00:00`).
fn format_time(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| {
            let spelled = if us.rem_euclid(1_000_000) == 0 {
                SecondsFormat::Secs
            } else {
                SecondsFormat::Micros
            };
            t.to_rfc3339_opts(spelled, false)
        })
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
    if !text.is_ascii() {
        return Err(bad());
    }
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
        count: match map.get("count") {
            None | Some(Value::Null) => None,
            Some(c) => {
                Some(c.as_u64().ok_or_else(|| {
                    TriggerError::invalid(field("count"), "must be a whole number")
                })?)
            }
        },
    })
}

/// The trigger-owned slice of an automation's state, as the reference
/// keeps it: `{anchor, tick, scheduled_count, exhausted}`.
#[derive(Clone, Copy)]
struct State {
    /// The grid's anchor (microseconds).
    anchor: i64,
    /// The next tick that may fire.
    tick: u64,
    /// Scheduled admissions so far (a coalesced admission counts once).
    scheduled_count: u64,
    /// No tick will fire again.
    exhausted: bool,
}

/// The state in `v`; a missing field takes its initial value, a missing
/// anchor the config's.
fn state_of(cfg: &Config, v: &Value) -> Result<State, TriggerError> {
    let count = |k: &str| match v.get(k) {
        None | Some(Value::Null) => Ok(0),
        Some(n) => n
            .as_u64()
            .ok_or_else(|| TriggerError::invalid(format!("state.{k}"), "must be a whole number")),
    };
    Ok(State {
        anchor: match str_field_of(v, "anchor")? {
            Some(t) => parse_time("state.anchor", t)?,
            None => cfg.anchor,
        },
        tick: count("tick")?,
        scheduled_count: count("scheduled_count")?,
        exhausted: v.get("exhausted").and_then(Value::as_bool).unwrap_or(false),
    })
}

fn str_field_of<'a>(v: &'a Value, name: &str) -> Result<Option<&'a str>, TriggerError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(TriggerError::invalid(
            format!("state.{name}"),
            "must be a string",
        )),
    }
}

fn state_value(s: State) -> Value {
    json!({
        "anchor": format_time(s.anchor),
        "tick": s.tick,
        "scheduled_count": s.scheduled_count,
        "exhausted": s.exhausted,
    })
}

impl Config {
    /// `T_k = anchor + k * every` (one-shot: `T_0 = anchor`).
    /// `None` past the year 9999, which no timestamp can spell: a grid that
    /// gets there is exhausted.
    fn time(&self, anchor: i64, k: i64) -> Option<i64> {
        match self.every {
            None => Some(anchor),
            Some(every) => k.checked_mul(every)?.checked_add(anchor),
        }
        .filter(|t| (FIRST_US..=LAST_US).contains(t))
    }

    /// The largest k with `T_k <= t` (-1 before the first tick).
    fn floor(&self, anchor: i64, t: i64) -> i64 {
        match self.every {
            _ if t < anchor => -1,
            None => 0,
            Some(every) => (t - anchor).div_euclid(every),
        }
    }

    /// The largest k with `T_k < until`: `ceil((until - anchor) / every) - 1`
    /// (None when unbounded).
    fn last_eligible(&self, anchor: i64) -> Option<i64> {
        let (every, until) = (self.every?, self.until?);
        let span = i128::from(until) - i128::from(anchor);
        let k = -((-span).div_euclid(i128::from(every))) - 1;
        Some(k.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
    }

    /// The next tick that may fire, at or after `s.tick` (None: exhausted).
    fn next_tick(&self, s: &State) -> Option<u64> {
        if s.exhausted || self.count.is_some_and(|c| s.scheduled_count >= c) {
            return None;
        }
        if self.every.is_none() {
            return (s.tick == 0).then_some(0);
        }
        match self.last_eligible(s.anchor) {
            Some(last) if i128::from(s.tick) > i128::from(last) => None,
            _ => i64::try_from(s.tick)
                .ok()
                .and_then(|k| self.time(s.anchor, k))
                .map(|_| s.tick),
        }
    }

    /// `s` with `exhausted` recomputed.
    fn settle(&self, mut s: State) -> State {
        s.exhausted = false;
        s.exhausted = self.next_tick(&s).is_none();
        s
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
            Value::Object(m) => m,
            _ => return Err(TriggerError::invalid("trigger.config", "must be an object")),
        };
        if let Some(k) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(TriggerError::invalid(
                field(k),
                format!("unknown field (known: {})", FIELDS.join(", ")),
            ));
        }
        // The reference's order: now, start_at, anchor, every, count, until.
        let now_us = now_of(now)?;
        let start_at = match str_field(&map, "start_at")? {
            Some(t) => parse_time(&field("start_at"), t)?,
            None => now_us,
        };
        let anchor = match str_field(&map, "anchor")? {
            Some(t) => parse_time(&field("anchor"), t)?,
            None => start_at,
        };
        if anchor != start_at {
            return Err(TriggerError::unsupported(
                field("anchor"),
                "schedule@1 requires anchor == start_at (a separate anchor is not supported in v1)",
            ));
        }
        let every = str_field(&map, "every")?;
        every.map(parse_every).transpose()?;
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
        if count.is_some_and(|c| c != 1) && every.is_none() {
            return Err(TriggerError::invalid(
                field("count"),
                "count > 1 requires every",
            ));
        }
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
        let mut out = Map::new();
        out.insert("start_at".into(), json!(format_time(start_at)));
        out.insert("anchor".into(), json!(format_time(anchor)));
        if let Some(e) = every {
            out.insert("every".into(), json!(e));
        }
        if let Some(c) = count {
            out.insert("count".into(), json!(c));
        }
        if let Some(u) = until {
            out.insert("until".into(), json!(format_time(u)));
        }
        Ok(Value::Object(out))
    }

    fn initial_state(binding: &Binding, _now: &str) -> Result<Value, TriggerError> {
        let cfg = config_of(binding)?;
        Ok(state_value(State {
            anchor: cfg.anchor,
            tick: 0,
            scheduled_count: 0,
            exhausted: false,
        }))
    }

    fn prepare(
        binding: &Binding,
        state: &Value,
        _now: &str,
        _: &[Value],
    ) -> Result<Wait, TriggerError> {
        let cfg = config_of(binding)?;
        let s = state_of(&cfg, state)?;
        Ok(match cfg.next_tick(&s) {
            None => Wait::Exhausted,
            Some(k) => match i64::try_from(k).ok().and_then(|k| cfg.time(s.anchor, k)) {
                Some(t) => Wait::Until(format_time(t)),
                None => Wait::Exhausted,
            },
        })
    }

    fn admit(
        binding: &Binding,
        state: &Value,
        now: &str,
        _: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        let cfg = config_of(binding)?;
        let s = state_of(&cfg, state)?;
        let now_us = now_of(now)?;
        let none = || Ok((None, state.clone()));
        let Some(first) = cfg.next_tick(&s) else {
            return none();
        };
        let fired: u64 = if cfg.every.is_none() {
            if s.anchor > now_us {
                return none();
            }
            0
        } else {
            let mut fired = cfg.floor(s.anchor, now_us);
            if fired < 0 {
                return none();
            }
            if let Some(last) = cfg.last_eligible(s.anchor) {
                fired = fired.min(last);
            }
            match u64::try_from(fired) {
                Ok(f) if f >= first => f,
                _ => return none(),
            }
        };
        let Some(at) = i64::try_from(fired)
            .ok()
            .and_then(|k| cfg.time(s.anchor, k))
        else {
            return none();
        };
        // The tick's own time, not the moment of the call: a late admission
        // still says when it was due.
        let fired_at = format_time(at);
        let mut payload = json!({ "tick": fired, "scheduled_at": fired_at });
        if fired > first {
            payload["coalesced"] = json!({
                "first_tick": first,
                "last_tick": fired,
                "missed_count": fired - first,
            });
        }
        let next = cfg.settle(State {
            anchor: s.anchor,
            tick: fired + 1,
            scheduled_count: s.scheduled_count.saturating_add(1),
            exhausted: false,
        });
        let admission = Admission {
            inputs: None,
            event_id: format!("schedule@1:{}:{fired}", binding.binding_id),
            fired_at,
            payload,
        };
        Ok((Some(admission), state_value(next)))
    }

    fn rearm(binding: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
        let cfg = config_of(binding)?;
        let mut s = state_of(&cfg, state)?;
        let now_us = now_of(now)?;
        if cfg.every.is_none() {
            // The single tick passed while paused: it never fires late.
            if s.tick == 0 && s.anchor <= now_us {
                s.tick = 1;
            }
        } else if let Ok(passed) = u64::try_from(cfg.floor(s.anchor, now_us)) {
            // The first tick strictly after now.
            s.tick = s.tick.max(passed + 1);
        }
        Ok(state_value(cfg.settle(s)))
    }

    fn normalize(
        binding: &Binding,
        event_id: &str,
        fired_at: &str,
        payload: Value,
    ) -> Result<Envelope, TriggerError> {
        Envelope::checked(binding, event_id, fired_at, payload).map(|e| e.as_source("schedule", 1))
    }
}

export_trigger_source!(Schedule);

//! `cron@1`: a third-party trigger source, loaded through the plugin folder.
//! Fires on a 5-field cron expression evaluated in an IANA time zone:
//! "every weekday at 09:00 Europe/Paris" is `{"expression": "0 9 * * 1-5",
//! "timezone": "Europe/Paris"}`, which `schedule@1` cannot express.
//!
//! Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or
//! JAN-DEC), day of week (0-7 or SUN-SAT, 0 and 7 are Sunday); each a `*`, a
//! value, a range `a-b`, a step `*/n` or `a-b/n`, or a comma list of those.
//! As in Vixie cron, when both day fields are restricted a day matching
//! either fires; when one is `*`, the other decides.
//!
//! Daylight saving, in local wall time:
//! - a local time that does not exist (the spring-forward gap) fires once at
//!   the first instant after the gap (02:30 on the last Sunday of March in
//!   Europe/Paris fires at 03:00 CEST);
//! - a local time that occurs twice (the fall-back repeat) fires once, at its
//!   first occurrence; an expression that fires every few minutes therefore
//!   pauses during the repeated hour.
//!
//! Config: `{expression, timezone? = "UTC", start_at? = creation time,
//! until?, count?}` with the same rules as `schedule@1` for the last three.
//! Ticks are numbered from 0 (the first firing at or after `start_at`); event
//! ids are `cron@1:<binding_id>:<tick>`, and missed firings are coalesced into
//! one admission for the latest due one, as `schedule@1` does. State:
//! `{"next_tick", "next_at" (RFC 3339, or null when none is left), "admitted"}`.
use chrono::{
    DateTime, Datelike, Days, LocalResult, NaiveDate, NaiveDateTime, SecondsFormat, TimeZone,
    Timelike, Utc,
};
use chrono_tz::Tz;
use serde_json::{json, Map, Value};
use stepwell_guest::export_trigger_source;
use stepwell_guest::trigger::*;

const FIELDS: [&str; 5] = ["expression", "timezone", "start_at", "until", "count"];
const MAX_COUNT: u64 = 1_000_000;
/// How far ahead a match is searched for (8 years covers February 29th).
const SEARCH_DAYS: u64 = 366 * 8;
/// At most this many missed firings are counted in one call.
const MAX_STEPS: u64 = 1_000_000;
const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

fn field(name: &str) -> String {
    format!("trigger.config.{name}")
}

/// A parsed expression: one bit per allowed value.
struct Cron {
    minutes: u64,
    hours: u32,
    dom: u32,
    months: u16,
    dow: u8,
    dom_star: bool,
    dow_star: bool,
}

fn parse_value(text: &str, names: &[&str], base: u32) -> Option<u32> {
    if let Ok(n) = text.parse::<u32>() {
        return Some(n);
    }
    let upper = text.to_ascii_uppercase();
    names
        .iter()
        .position(|n| *n == upper)
        .map(|i| i as u32 + base)
}

fn parse_field(
    what: &str,
    text: &str,
    min: u32,
    max: u32,
    names: &[&str],
    name_base: u32,
) -> Result<u64, TriggerError> {
    let bad = |why: String| {
        TriggerError::invalid(field("expression"), format!("{what} field {text:?}: {why}"))
    };
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => match s.parse::<u32>() {
                Ok(n) if n >= 1 => (r, n),
                _ => {
                    return Err(bad(format!(
                        "step {s:?} must be a whole number of at least 1"
                    )))
                }
            },
            None => (part, 1),
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            let a = parse_value(a, names, name_base)
                .ok_or_else(|| bad(format!("{a:?} is not a value")))?;
            let b = parse_value(b, names, name_base)
                .ok_or_else(|| bad(format!("{b:?} is not a value")))?;
            (a, b)
        } else {
            let v = parse_value(range, names, name_base)
                .ok_or_else(|| bad(format!("{range:?} is not a value")))?;
            (v, if step > 1 { max } else { v })
        };
        if lo < min || hi > max || lo > hi {
            return Err(bad(format!("{lo}-{hi} is outside {min}-{max}")));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

impl Cron {
    fn parse(expr: &str) -> Result<Cron, TriggerError> {
        let parts: Vec<&str> = expr.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(TriggerError::invalid(
                field("expression"),
                format!("{expr:?} must have 5 fields (minute hour day-of-month month day-of-week)"),
            ));
        }
        let mut dow = parse_field("day-of-week", parts[4], 0, 7, &DAYS, 0)?;
        if dow & (1 << 7) != 0 {
            dow = (dow | 1) & !(1 << 7);
        }
        Ok(Cron {
            minutes: parse_field("minute", parts[0], 0, 59, &[], 0)?,
            hours: parse_field("hour", parts[1], 0, 23, &[], 0)? as u32,
            dom: parse_field("day-of-month", parts[2], 1, 31, &[], 0)? as u32,
            months: parse_field("month", parts[3], 1, 12, &MONTHS, 1)? as u16,
            dow: dow as u8,
            dom_star: parts[2].starts_with('*'),
            dow_star: parts[4].starts_with('*'),
        })
    }

    fn day_matches(&self, d: NaiveDate) -> bool {
        if self.months & (1 << d.month()) == 0 {
            return false;
        }
        let dom = self.dom & (1 << d.day()) != 0;
        let dow = self.dow & (1 << d.weekday().num_days_from_sunday()) != 0;
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first firing strictly after `t` (microseconds), if any within
    /// the search horizon.
    fn next_after(&self, t: i64, tz: Tz) -> Option<i64> {
        let local = DateTime::<Utc>::from_timestamp_micros(t)?.with_timezone(&tz);
        let first_day = local.date_naive();
        for offset in 0..SEARCH_DAYS {
            let day = first_day.checked_add_days(Days::new(offset))?;
            if !self.day_matches(day) {
                continue;
            }
            // On the first day, earlier wall times cannot fire after `t`.
            let (h0, m0) = if offset == 0 {
                (local.hour(), local.minute())
            } else {
                (0, 0)
            };
            for h in h0..24 {
                if self.hours & (1 << h) == 0 {
                    continue;
                }
                let from = if h == h0 { m0 } else { 0 };
                for m in from..60 {
                    if self.minutes & (1 << m) == 0 {
                        continue;
                    }
                    let at = resolve(day.and_hms_opt(h, m, 0)?, tz)?;
                    if at > t {
                        return Some(at);
                    }
                }
            }
        }
        None
    }
}

/// The instant of a local wall time: its first occurrence when it occurs
/// twice, the first instant after the gap when it does not occur.
fn resolve(naive: NaiveDateTime, tz: Tz) -> Option<i64> {
    let mut n = naive;
    for _ in 0..=(26 * 60) {
        match tz.from_local_datetime(&n) {
            LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => {
                return Some(t.timestamp_micros())
            }
            LocalResult::None => n += chrono::Duration::minutes(1),
        }
    }
    None
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
        .unwrap_or_default()
}

fn format_local(us: i64, tz: Tz) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .map(|t| {
            t.with_timezone(&tz)
                .to_rfc3339_opts(SecondsFormat::AutoSi, false)
        })
        .unwrap_or_default()
}

struct Config {
    cron: Cron,
    tz: Tz,
    start_at: i64,
    until: Option<i64>,
    count: Option<u64>,
}

fn str_field<'a>(map: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, TriggerError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(TriggerError::invalid(field(name), "must be a string")),
    }
}

fn parse_tz(text: &str) -> Result<Tz, TriggerError> {
    text.parse::<Tz>().map_err(|_| {
        TriggerError::invalid(
            field("timezone"),
            format!("{text:?} is not an IANA time zone (for example Europe/Paris)"),
        )
    })
}

fn config_of(binding: &Binding) -> Result<Config, TriggerError> {
    let map = binding
        .config
        .as_object()
        .ok_or_else(|| TriggerError::invalid("binding.config", "must be an object"))?;
    let expr = str_field(map, "expression")?.ok_or_else(|| {
        TriggerError::invalid(
            "binding.config.expression",
            "missing: pass the config through validate first",
        )
    })?;
    let start = str_field(map, "start_at")?.ok_or_else(|| {
        TriggerError::invalid(
            "binding.config.start_at",
            "missing: pass the config through validate first",
        )
    })?;
    Ok(Config {
        cron: Cron::parse(expr)?,
        tz: parse_tz(str_field(map, "timezone")?.unwrap_or("UTC"))?,
        start_at: parse_time(&field("start_at"), start)?,
        until: str_field(map, "until")?
            .map(|t| parse_time(&field("until"), t))
            .transpose()?,
        count: map.get("count").and_then(Value::as_u64),
    })
}

struct State {
    next_tick: u64,
    next_at: Option<i64>,
    admitted: u64,
}

fn state_of(v: &Value) -> Result<State, TriggerError> {
    let num = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| TriggerError::invalid(format!("state.{k}"), "must be a whole number"))
    };
    let next_at = match v.get("next_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(parse_time("state.next_at", s)?),
        Some(_) => {
            return Err(TriggerError::invalid(
                "state.next_at",
                "must be a timestamp or null",
            ))
        }
    };
    Ok(State {
        next_tick: num("next_tick")?,
        next_at,
        admitted: num("admitted")?,
    })
}

fn state_value(s: &State) -> Value {
    json!({ "next_tick": s.next_tick, "next_at": s.next_at.map(format_time), "admitted": s.admitted })
}

impl Config {
    /// The firing after `t`, if it exists and is before `until`.
    fn after(&self, t: i64) -> Option<i64> {
        self.cron
            .next_after(t, self.tz)
            .filter(|n| self.until.is_none_or(|u| *n < u))
    }

    fn exhausted(&self, s: &State) -> bool {
        self.count.is_some_and(|c| s.admitted >= c) || s.next_at.is_none()
    }

    /// Moves `s` past every firing at or before `now`; returns the last one
    /// passed (tick, instant) and how many were passed.
    fn pass(&self, s: &mut State, now: i64) -> Option<(u64, i64, u64)> {
        let mut last = None;
        let mut passed = 0;
        while let Some(at) = s.next_at.filter(|at| *at <= now) {
            last = Some((s.next_tick, at));
            passed += 1;
            s.next_tick += 1;
            s.next_at = if passed >= MAX_STEPS {
                self.after(now)
            } else {
                self.after(at)
            };
        }
        last.map(|(k, at)| (k, at, passed))
    }
}

struct CronSource;

impl TriggerSource for CronSource {
    fn descriptor() -> Descriptor {
        Descriptor {
            config_schema: json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["expression"],
                "properties": {
                    "expression": {"type": "string", "description": "minute hour day-of-month month day-of-week"},
                    "timezone": {"type": "string", "description": "an IANA time zone, default UTC"},
                    "start_at": {"type": "string", "format": "date-time"},
                    "until": {"type": "string", "format": "date-time"},
                    "count": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT}
                }
            }),
            event_schema: json!({
                "type": "object",
                "required": ["tick", "scheduled_at", "local_time"],
                "properties": {
                    "tick": {"type": "integer"},
                    "scheduled_at": {"type": "string", "format": "date-time"},
                    "local_time": {"type": "string", "format": "date-time"},
                    "coalesced": {"type": "object"}
                }
            }),
            ..Descriptor::new("cron", 1, "Cron expression in a time zone", Kind::Time)
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
        let expr = str_field(&map, "expression")?
            .ok_or_else(|| TriggerError::invalid(field("expression"), "is required"))?;
        Cron::parse(expr)?;
        let tz = str_field(&map, "timezone")?.unwrap_or("UTC");
        parse_tz(tz)?;
        let start_at = match str_field(&map, "start_at")? {
            Some(t) => parse_time(&field("start_at"), t)?,
            None => parse_time("now", now)?,
        };
        let until = str_field(&map, "until")?
            .map(|t| parse_time(&field("until"), t))
            .transpose()?;
        if until.is_some_and(|u| u <= start_at) {
            return Err(TriggerError::invalid(
                field("until"),
                "must be after start_at (until is exclusive)",
            ));
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
        let mut out = Map::new();
        out.insert("expression".into(), json!(expr));
        out.insert("timezone".into(), json!(tz));
        out.insert("start_at".into(), json!(format_time(start_at)));
        if let Some(u) = until {
            out.insert("until".into(), json!(format_time(u)));
        }
        if let Some(c) = count {
            out.insert("count".into(), json!(c));
        }
        Ok(Value::Object(out))
    }

    fn initial_state(binding: &Binding, _now: &str) -> Result<Value, TriggerError> {
        let cfg = config_of(binding)?;
        let first = cfg.after(cfg.start_at - 1);
        Ok(state_value(&State {
            next_tick: 0,
            next_at: first,
            admitted: 0,
        }))
    }

    fn prepare(
        binding: &Binding,
        state: &Value,
        _now: &str,
        _: &[Value],
    ) -> Result<Wait, TriggerError> {
        let cfg = config_of(binding)?;
        let s = state_of(state)?;
        Ok(match s.next_at {
            Some(at) if !cfg.exhausted(&s) => Wait::Until(format_time(at)),
            _ => Wait::Exhausted,
        })
    }

    fn admit(
        binding: &Binding,
        state: &Value,
        now: &str,
        _: &[Value],
    ) -> Result<(Option<Admission>, Value), TriggerError> {
        let cfg = config_of(binding)?;
        let mut s = state_of(state)?;
        let now_us = parse_time("now", now)?;
        if cfg.exhausted(&s) {
            return Ok((None, state_value(&s)));
        }
        let first = s.next_tick;
        let Some((last, at, _)) = cfg.pass(&mut s, now_us) else {
            return Ok((None, state_value(&s)));
        };
        let mut payload = json!({
            "tick": last,
            "scheduled_at": format_time(at),
            "local_time": format_local(at, cfg.tz),
        });
        if last > first {
            payload["coalesced"] =
                json!({ "first_tick": first, "last_tick": last, "missed_count": last - first });
        }
        s.admitted += 1;
        let admission = Admission {
            inputs: None,
            event_id: format!("cron@1:{}:{last}", binding.binding_id),
            fired_at: format_time(at),
            payload,
        };
        Ok((Some(admission), state_value(&s)))
    }

    fn rearm(binding: &Binding, state: &Value, now: &str) -> Result<Value, TriggerError> {
        let cfg = config_of(binding)?;
        let mut s = state_of(state)?;
        cfg.pass(&mut s, parse_time("now", now)?);
        Ok(state_value(&s))
    }
}

export_trigger_source!(CronSource);

//! Timestamps and durations as the automation layer spells them.
//!
//! Every instant the automation layer writes is UTC in Python's
//! `isoformat()` spelling: `YYYY-MM-DDTHH:MM:SS+00:00`, or with exactly six
//! fraction digits when the microseconds are not zero. Never `Z`, never
//! three or nine digits. Inputs are RFC 3339 with an offset (`Z`, `z` or
//! `±HH:MM`); a timestamp without one is refused.

use chrono::{DateTime, Datelike, Duration, SecondsFormat, Timelike, Utc};

use crate::AutomationError;

/// The longest duration accepted: 366 days, in seconds.
pub const MAX_DURATION_SECONDS: i64 = 366 * 86_400;

/// A time a trigger source wrote (a plugin may write `Z`) in the
/// automation layer's spelling; text that is not a time is kept as it is.
pub fn respell(t: &str) -> String {
    parse_timestamp(t, "time").map_or_else(|_| t.to_string(), format_timestamp)
}

/// `t` in the reference's spelling (`2026-01-01T00:02:00+00:00`,
/// `2026-01-01T00:02:00.250000+00:00`). Sub-microsecond digits are dropped.
pub fn format_timestamp(t: DateTime<Utc>) -> String {
    if !(0..=9999).contains(&t.year()) {
        // Out of the reference's range (Python datetimes stop at 9999).
        return t.to_rfc3339_opts(SecondsFormat::Micros, false);
    }
    let micros = t.nanosecond() % 1_000_000_000 / 1_000;
    let mut out = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    if micros != 0 {
        out.push_str(&format!(".{micros:06}"));
    }
    out.push_str("+00:00");
    out
}

/// An RFC 3339 timestamp with an offset, as UTC (sub-microsecond digits
/// dropped). `field` names the input in the error (`invalid_definition`).
pub fn parse_timestamp(value: &str, field: &str) -> Result<DateTime<Utc>, AutomationError> {
    let raw = value.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c));
    if raw.is_empty() {
        return Err(AutomationError::invalid(
            field,
            format!("{field} must be an RFC3339 timestamp"),
        ));
    }
    let t = DateTime::parse_from_rfc3339(raw).map_err(|_| {
        let naive = chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S%.f").is_ok();
        if naive {
            AutomationError::invalid(
                field,
                format!("{field} must carry a UTC offset (e.g. 'Z'): {value:?}"),
            )
        } else {
            AutomationError::invalid(
                field,
                format!("{field} is not an RFC3339 timestamp: {value:?}"),
            )
        }
    })?;
    if t.nanosecond() >= 1_000_000_000 {
        return Err(AutomationError::invalid(
            field,
            format!("{field} is a leap second, which is not a valid time: {value:?}"),
        ));
    }
    let t = t.with_timezone(&Utc);
    if !(1..=9999).contains(&t.year()) {
        return Err(AutomationError::invalid(
            field,
            format!("{field} is outside the years 0001 to 9999 (UTC): {value:?}"),
        ));
    }
    let micros = t.timestamp_subsec_micros();
    Ok(t.with_nanosecond(micros * 1_000).unwrap_or(t))
}

/// A duration `^[1-9][0-9]*[smhd]$` (s = 1, m = 60, h = 3,600, d = 86,400
/// seconds), at most 366 days.
pub fn parse_duration(value: &str, field: &str) -> Result<Duration, AutomationError> {
    let bad = || {
        AutomationError::invalid(
            field,
            format!(
                "{field} must match ^[1-9][0-9]*[smhd]$ (whole seconds, minutes, hours or days), got {value:?}"
            ),
        )
    };
    let Some(unit) = value.chars().last() else {
        return Err(bad());
    };
    let digits = &value[..value.len() - unit.len_utf8()];
    let unit: i64 = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => return Err(bad()),
    };
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let seconds = digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|s| *s <= MAX_DURATION_SECONDS)
        .ok_or_else(|| {
            AutomationError::invalid(
                field,
                format!("{field} must be at most 366d, got {value:?}"),
            )
        })?;
    Ok(Duration::seconds(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_take_the_reference_spelling() {
        let t = |s: &str| parse_timestamp(s, "now").unwrap();
        assert_eq!(
            format_timestamp(t("2026-01-01T00:00:00Z")),
            "2026-01-01T00:00:00+00:00"
        );
        assert_eq!(
            format_timestamp(t("2026-01-01T02:00:00.5+02:00")),
            "2026-01-01T00:00:00.500000+00:00"
        );
        assert_eq!(
            format_timestamp(t("2026-01-01T00:00:00.123456789z")),
            "2026-01-01T00:00:00.123456+00:00"
        );
        let e = parse_timestamp("2026-01-01T00:00:00", "trigger.config.start_at").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("trigger.config.start_at"));
        assert!(e.message.contains("UTC offset"), "{e}");
        assert!(parse_timestamp("yesterday", "now").is_err());
        assert!(parse_timestamp("2026-12-31T23:59:60Z", "now").is_err());
        assert!(parse_timestamp("9999-12-31T23:59:59-01:00", "now").is_err());
        assert!(parse_timestamp("0001-01-01T00:00:00+01:00", "now").is_err());
        assert_eq!(
            format_timestamp(t("\u{1f} 9999-12-31T23:59:59.999999Z")),
            "9999-12-31T23:59:59.999999+00:00"
        );
        assert!(parse_timestamp(" ", "now").is_err());
    }

    #[test]
    fn durations_follow_the_pattern_and_the_cap() {
        let secs = |s: &str| parse_duration(s, "every").map(|d| d.num_seconds());
        assert_eq!(secs("30s"), Ok(30));
        assert_eq!(secs("2m"), Ok(120));
        assert_eq!(secs("24h"), Ok(86_400));
        assert_eq!(secs("366d"), Ok(MAX_DURATION_SECONDS));
        for bad in [
            "1w",
            "30",
            "0m",
            "367d",
            "",
            "m",
            "05m",
            "-5m",
            "5 m",
            "99999999999999999999s",
            "5é",
        ] {
            let e = parse_duration(bad, "every").unwrap_err();
            assert_eq!(e.reason_code, "invalid_definition", "{bad}");
            assert_eq!(e.field.as_deref(), Some("every"), "{bad}");
        }
    }
}

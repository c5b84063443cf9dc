//! Time as the runtime sees it. Guests never read a clock: the host passes the
//! time in, from a [`Clock`], so tests can drive time by hand.

use std::sync::Mutex;

use chrono::{DateTime, SecondsFormat, Utc};

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that only moves when told to: for tests and simulations.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    /// A clock that reads `start` until moved.
    pub fn new(start: DateTime<Utc>) -> Self {
        ManualClock {
            now: Mutex::new(start),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: chrono::Duration) {
        let mut now = self.now.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Sets the clock to `to`.
    pub fn set(&self, to: DateTime<Utc>) {
        *self.now.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Formats a time the way stepwell stores it: RFC 3339, UTC, microseconds, `Z`
/// (`2026-11-30T09:00:00.000000Z`). Years outside 0..=9999 take chrono's
/// form (a sign and more digits).
pub fn format_time(t: DateTime<Utc>) -> String {
    use chrono::{Datelike, Timelike};
    let year = t.year();
    // A leap second (nanoseconds past 1e9) takes chrono's form too.
    if !(0..=9999).contains(&year) || t.nanosecond() >= 1_000_000_000 {
        return t.to_rfc3339_opts(SecondsFormat::Micros, true);
    }
    // Called for every step: written digit by digit, not through a format
    // string.
    fn digits(out: &mut String, n: u32, width: u32) {
        for i in (0..width).rev() {
            out.push(char::from(b'0' + (n / 10u32.pow(i) % 10) as u8));
        }
    }
    let mut out = String::with_capacity(27);
    digits(&mut out, year as u32, 4);
    out.push('-');
    digits(&mut out, t.month(), 2);
    out.push('-');
    digits(&mut out, t.day(), 2);
    out.push('T');
    digits(&mut out, t.hour(), 2);
    out.push(':');
    digits(&mut out, t.minute(), 2);
    out.push(':');
    digits(&mut out, t.second(), 2);
    out.push('.');
    digits(&mut out, t.nanosecond() / 1_000, 6);
    out.push('Z');
    out
}

/// Parses an RFC 3339 timestamp that carries an explicit offset.
pub fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 timestamp with an offset: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn times_are_written_as_chrono_writes_them() {
        for t in [
            Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).unwrap() + chrono::Duration::microseconds(7),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap()
                + chrono::Duration::nanoseconds(999_999_999),
            Utc.with_ymd_and_hms(2024, 2, 29, 12, 34, 56).unwrap()
                + chrono::Duration::microseconds(123_456),
        ] {
            assert_eq!(
                format_time(t),
                t.to_rfc3339_opts(SecondsFormat::Micros, true)
            );
        }
        let far = Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(
            format_time(far),
            far.to_rfc3339_opts(SecondsFormat::Micros, true)
        );
    }
}

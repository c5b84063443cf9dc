//! Time as the runtime sees it. Guests never read a clock: the host passes the
//! time in, from a [`Clock`], so tests can drive time by hand.

use std::sync::Mutex;

use chrono::{DateTime, NaiveDate, SecondsFormat, Utc};

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
    // The fields of the UTC date and time, read from the naive value
    // (`DateTime`'s own accessors apply the offset again for each).
    let naive = t.naive_utc();
    let (date, time) = (naive.date(), naive.time());
    let year = date.year();
    // A leap second (nanoseconds past 1e9) takes chrono's form too.
    if !(0..=9999).contains(&year) || time.nanosecond() >= 1_000_000_000 {
        return t.to_rfc3339_opts(SecondsFormat::Micros, true);
    }
    // Called for every step (and its ledger record): the digits are written
    // into a fixed buffer, not through a format string, and the part up to
    // the second is kept for the next call in the same second.
    fn digits(buf: &mut [u8], mut n: u32) {
        for b in buf.iter_mut().rev() {
            *b = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    thread_local! {
        /// The last second formatted (its date and second of the day) and
        /// its text up to the `.`.
        static LAST: std::cell::Cell<(NaiveDate, u32, [u8; 20])> =
            const { std::cell::Cell::new((NaiveDate::MIN, u32::MAX, [0; 20])) };
    }
    let second = time.num_seconds_from_midnight();
    let mut buf = *b"0000-00-00T00:00:00.000000Z";
    let (last_date, last_second, prefix) = LAST.get();
    if last_date == date && last_second == second {
        buf[..20].copy_from_slice(&prefix);
    } else {
        digits(&mut buf[0..4], year as u32);
        digits(&mut buf[5..7], date.month());
        digits(&mut buf[8..10], date.day());
        digits(&mut buf[11..13], time.hour());
        digits(&mut buf[14..16], time.minute());
        digits(&mut buf[17..19], time.second());
        let mut prefix = [0; 20];
        prefix.copy_from_slice(&buf[..20]);
        LAST.set((date, second, prefix));
    }
    digits(&mut buf[20..26], time.nanosecond() / 1_000);
    // Only ASCII digits and separators were written: valid UTF-8.
    String::from_utf8(buf.to_vec()).unwrap_or_default()
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
            // The same second again (its prefix kept), the same second of
            // another day, and the next second.
            Utc.with_ymd_and_hms(2024, 2, 29, 12, 34, 56).unwrap()
                + chrono::Duration::microseconds(999_999),
            Utc.with_ymd_and_hms(2024, 3, 1, 12, 34, 56).unwrap(),
            Utc.with_ymd_and_hms(2024, 3, 1, 12, 34, 57).unwrap()
                + chrono::Duration::microseconds(5),
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

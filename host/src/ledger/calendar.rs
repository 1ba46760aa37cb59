//! Calendar periods in UTC — the day, the ISO week (from Monday), the month —
//! as plain functions of a time in ms, for usage answers and budgets that
//! reset "at the start of the month" the way a person reads it.
//!
//! UTC, always: replicas in different zones must agree on when a day ends,
//! and a budget must not move when a server's zone does.

use serde::Serialize;

const DAY_MS: u64 = 86_400_000;

/// A calendar period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// From 00:00 UTC.
    Day,
    /// From Monday 00:00 UTC.
    Week,
    /// From the 1st, 00:00 UTC.
    Month,
}

/// Every period, in the order meters keep them.
pub const PERIODS: [Period; 3] = [Period::Day, Period::Week, Period::Month];

impl Period {
    /// The period named `name` (`day`, `week`, `month`).
    pub fn named(name: &str) -> Option<Period> {
        PERIODS.into_iter().find(|p| p.name() == name)
    }

    /// Its name (`day`, `week`, `month`).
    pub fn name(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        }
    }

    /// When the period holding `now_ms` began, and when the next one begins.
    pub fn around(self, now_ms: u64) -> (u64, u64) {
        let day = now_ms / DAY_MS;
        match self {
            Period::Day => (day * DAY_MS, (day + 1) * DAY_MS),
            Period::Week => {
                // Day 0 (1970-01-01) was a Thursday: Monday is 3 days later.
                let monday = day.saturating_sub((day + 3) % 7);
                (monday * DAY_MS, (monday + 7) * DAY_MS)
            }
            Period::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                let next = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                (days_from_civil(y, m, 1) as u64 * DAY_MS, days_from_civil(next.0, next.1, 1) as u64 * DAY_MS)
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub use poolgate_wire::ratelimit::civil_from_days;

/// A time as an operator writes it in a query: ms since the epoch, a date
/// (`2026-12-01`, its 00:00 UTC) or RFC 3339 (`2026-12-01T09:30:00Z`).
pub fn parse_time(s: &str) -> Option<u64> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    let date: Vec<&str> = s.split('-').collect();
    if let [y, m, d] = date[..]
        && y.len() == 4
        && let (Ok(y), Ok(m), Ok(d)) = (y.parse::<i64>(), m.parse::<u32>(), d.parse::<u32>())
        && (1..=12).contains(&m)
        && (1..=31).contains(&d)
    {
        return u64::try_from(days_from_civil(y, m, d)).ok().map(|days| days * DAY_MS);
    }
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a time in ms (to the second).
pub fn rfc3339(ms: u64) -> String {
    poolgate_wire::ratelimit::rfc3339(ms / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_begin_where_a_person_says_they_do() {
        let now = parse_time("2026-12-07T02:30:00Z").unwrap(); // a Monday
        let at = |p: Period| {
            let (a, b) = p.around(now);
            (rfc3339(a), rfc3339(b))
        };
        assert_eq!(at(Period::Day), ("2026-12-07T00:00:00Z".into(), "2026-12-08T00:00:00Z".into()));
        assert_eq!(at(Period::Week), ("2026-12-07T00:00:00Z".into(), "2026-12-14T00:00:00Z".into()));
        assert_eq!(at(Period::Month), ("2026-12-01T00:00:00Z".into(), "2027-01-01T00:00:00Z".into()));
        let sunday = parse_time("2026-12-06T23:59:59Z").unwrap();
        assert_eq!(rfc3339(Period::Week.around(sunday).0), "2026-11-30T00:00:00Z");
        let leap = parse_time("2028-02-29").unwrap();
        assert_eq!(rfc3339(Period::Month.around(leap).1), "2028-03-01T00:00:00Z");
    }

    #[test]
    fn times_parse_as_ms_dates_or_rfc3339() {
        assert_eq!(parse_time("1764547200000"), Some(1_764_547_200_000));
        assert_eq!(parse_time("2025-12-01"), Some(1_764_547_200_000));
        assert_eq!(parse_time("2025-12-01T00:00:01Z"), Some(1_764_547_201_000));
        assert_eq!(parse_time("2025-13-01"), None);
        assert_eq!(parse_time("yesterday"), None);
        for day in [-1000, 0, 59, 10_000, 20_000] {
            let (y, m, d) = civil_from_days(day);
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }
}

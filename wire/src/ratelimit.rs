//! A quota reading rendered as Anthropic's rate-limit response headers.
//!
//! The gateway ranks accounts by what these headers say: the
//! `anthropic-ratelimit-unified-*` family on subscription (OAuth) traffic and the
//! `anthropic-ratelimit-{requests,tokens,…}-*` family on API-key traffic. A
//! [`Quota`] is one answer's reading; [`Quota::headers`] writes it with those
//! exact names and formats: utilizations as fractions (`0.03`, `1.0`), unified
//! resets as epoch seconds, API-key resets as RFC 3339.
//!
//! Every field is optional and a header is sent only for a field that is set,
//! so the mock can reproduce the partial or odd header sets seen in the wild;
//! the simulator fills in what its ledger says.

use std::time::{SystemTime, UNIX_EPOCH};

/// The prefix of the unified family.
pub const UNIFIED: &str = "anthropic-ratelimit-unified-";

/// An account's quota as one answer reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quota {
    /// `anthropic-ratelimit-unified-status`: `"allowed"`, `"allowed_warning"` or `"rejected"`.
    pub status: Option<String>,
    /// `anthropic-ratelimit-unified-reset`, epoch seconds: reset of the binding window.
    pub reset_s: Option<u64>,
    /// `anthropic-ratelimit-unified-representative-claim`, e.g. `"five_hour"` (see [`claim`]).
    pub representative_claim: Option<String>,
    /// The `5h-utilization`, `5h-status` and `5h-reset` headers.
    pub five_hour: Option<Window>,
    /// The `7d-utilization`, `7d-status` and `7d-reset` headers.
    pub seven_day: Option<Window>,
    /// Per-model weekly buckets: `("oi", w)` renders `7d_oi-utilization`, `7d_oi-status`
    /// and `7d_oi-reset`.
    pub buckets: Vec<(String, Window)>,
    /// `anthropic-ratelimit-unified-overage-status`.
    pub overage_status: Option<String>,
    /// `anthropic-ratelimit-unified-overage-disabled-reason`.
    pub overage_disabled_reason: Option<String>,
    /// Any other header, sent verbatim (name, value), after the unified family.
    pub extra: Vec<(String, String)>,
}

/// One rate-limit window of the unified family.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    /// Fraction used: `0.03` is 3%. May exceed `1.0`.
    pub utilization: f64,
    /// `"allowed"`, `"allowed_warning"`, `"rejected"`, …
    pub status: String,
    /// When the window resets, epoch seconds.
    pub reset_s: u64,
}

impl Window {
    /// A window with the given utilization, status and reset.
    pub fn new(utilization: f64, status: &str, reset_s: u64) -> Window {
        Window { utilization, status: status.to_owned(), reset_s }
    }

    /// An `"allowed"` window.
    pub fn allowed(utilization: f64, reset_s: u64) -> Window {
        Window::new(utilization, "allowed", reset_s)
    }
}

impl Quota {
    /// A typical subscription reading as of now (the system clock); see
    /// [`Quota::unified_at`].
    pub fn unified(five_hour: f64, seven_day: f64) -> Quota {
        Quota::unified_at(five_hour, seven_day, now_s())
    }

    /// A typical subscription reading at `now_s`: unified status `allowed` (or
    /// `rejected` once a window is full), claim `five_hour`, both windows at the
    /// given utilizations, resetting 5 hours and 7 days later.
    pub fn unified_at(five_hour: f64, seven_day: f64, now_s: u64) -> Quota {
        let reset_5h = now_s + 5 * 3600;
        let window = |u: f64, reset: u64| Window::new(u, if u >= 1.0 { "rejected" } else { "allowed" }, reset);
        Quota {
            status: Some(if five_hour >= 1.0 || seven_day >= 1.0 { "rejected" } else { "allowed" }.to_owned()),
            reset_s: Some(reset_5h),
            representative_claim: Some(claim("5h")),
            five_hour: Some(window(five_hour, reset_5h)),
            seven_day: Some(window(seven_day, now_s + 7 * 86400)),
            ..Quota::default()
        }
    }

    /// Adds `anthropic-ratelimit-unified-fallback-percentage` (a fraction, e.g. `0.5`).
    pub fn with_fallback_percentage(mut self, fraction: f64) -> Quota {
        self.extra.push((format!("{UNIFIED}fallback-percentage"), format_fraction(fraction)));
        self
    }

    /// Adds the API-key family for one limit `kind` (`"requests"`, `"tokens"`,
    /// `"input-tokens"` or `"output-tokens"`): `anthropic-ratelimit-<kind>-limit`,
    /// `-remaining` and `-reset` (RFC 3339, from `reset_s` epoch seconds).
    pub fn with_api_limit(mut self, kind: &str, limit: u64, remaining: u64, reset_s: u64) -> Quota {
        let name = |suffix: &str| format!("anthropic-ratelimit-{kind}-{suffix}");
        self.extra.push((name("limit"), limit.to_string()));
        self.extra.push((name("remaining"), remaining.to_string()));
        self.extra.push((name("reset"), rfc3339(reset_s)));
        self
    }

    /// The headers this quota renders to (name, value), in the order they are
    /// sent: status, reset, claim, then each window's utilization, status and
    /// reset (5h, 7d, buckets), the overage pair, and `extra`.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut put = |suffix: &str, value: String| out.push((format!("{UNIFIED}{suffix}"), value));
        if let Some(status) = &self.status {
            put("status", status.clone());
        }
        if let Some(reset) = self.reset_s {
            put("reset", reset.to_string());
        }
        if let Some(claim) = &self.representative_claim {
            put("representative-claim", claim.clone());
        }
        let mut window = |label: &str, w: &Window| {
            put(&format!("{label}-utilization"), format_fraction(w.utilization));
            put(&format!("{label}-status"), w.status.clone());
            put(&format!("{label}-reset"), w.reset_s.to_string());
        };
        if let Some(w) = &self.five_hour {
            window("5h", w);
        }
        if let Some(w) = &self.seven_day {
            window("7d", w);
        }
        for (bucket, w) in &self.buckets {
            window(&format!("7d_{bucket}"), w);
        }
        if let Some(s) = &self.overage_status {
            put("overage-status", s.clone());
        }
        if let Some(r) = &self.overage_disabled_reason {
            put("overage-disabled-reason", r.clone());
        }
        out.extend(self.extra.iter().cloned());
        out
    }
}

/// The representative claim that names the window labelled `window` (`5h`,
/// `7d`, `7d_<bucket>`): `five_hour`, `seven_day`, `seven_day_<bucket>`, except
/// that `7d_oi`, included-overage credit, is `seven_day_overage_included`.
pub fn claim(window: &str) -> String {
    match window {
        "5h" => "five_hour".into(),
        "7d" => "seven_day".into(),
        "7d_oi" => "seven_day_overage_included".into(),
        other => format!("seven_day_{}", other.trim_start_matches("7d_")),
    }
}

/// Seconds since the Unix epoch, by the system clock.
pub fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Formats epoch seconds as RFC 3339 UTC, e.g. `2026-11-20T12:00:00Z`, the format of the
/// API-key family's `-reset` headers.
pub fn rfc3339(epoch_s: u64) -> String {
    let days = (epoch_s / 86400) as i64;
    let secs = epoch_s % 86400;
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The date (year, month, day) of a day counted from 1970-01-01: Howard
/// Hinnant's days-to-civil algorithm, which avoids a date crate.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Anthropic sends fractions like `0.03` and `1.0`; `{:?}` gives the shortest exact form
/// and keeps the `.0` on whole numbers, as a float parser on the other side expects.
fn format_fraction(f: f64) -> String {
    format!("{f:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_003_199), "2026-11-18T11:59:59Z");
    }

    #[test]
    fn headers_render_unified_family_names_and_formats_in_order() {
        let q = Quota {
            status: Some("allowed".into()),
            reset_s: Some(100),
            representative_claim: Some("five_hour".into()),
            five_hour: Some(Window::allowed(0.03, 100)),
            seven_day: Some(Window::new(1.0, "rejected", 200)),
            buckets: vec![("oi".into(), Window::allowed(0.5, 300))],
            overage_status: Some("rejected".into()),
            overage_disabled_reason: Some("org_level_disabled".into()),
            extra: vec![("x-extra".into(), "1".into())],
        }
        .with_fallback_percentage(0.5)
        .with_api_limit("tokens", 1000, 10, 1_795_003_199);
        let h: Vec<String> = q.headers().iter().map(|(k, v)| format!("{k}: {v}")).collect();
        assert_eq!(
            h,
            [
                "anthropic-ratelimit-unified-status: allowed",
                "anthropic-ratelimit-unified-reset: 100",
                "anthropic-ratelimit-unified-representative-claim: five_hour",
                "anthropic-ratelimit-unified-5h-utilization: 0.03",
                "anthropic-ratelimit-unified-5h-status: allowed",
                "anthropic-ratelimit-unified-5h-reset: 100",
                "anthropic-ratelimit-unified-7d-utilization: 1.0",
                "anthropic-ratelimit-unified-7d-status: rejected",
                "anthropic-ratelimit-unified-7d-reset: 200",
                "anthropic-ratelimit-unified-7d_oi-utilization: 0.5",
                "anthropic-ratelimit-unified-7d_oi-status: allowed",
                "anthropic-ratelimit-unified-7d_oi-reset: 300",
                "anthropic-ratelimit-unified-overage-status: rejected",
                "anthropic-ratelimit-unified-overage-disabled-reason: org_level_disabled",
                "x-extra: 1",
                "anthropic-ratelimit-unified-fallback-percentage: 0.5",
                "anthropic-ratelimit-tokens-limit: 1000",
                "anthropic-ratelimit-tokens-remaining: 10",
                "anthropic-ratelimit-tokens-reset: 2026-11-18T11:59:59Z",
            ]
        );
        assert!(Quota::default().headers().is_empty(), "only what is set is sent");
    }

    #[test]
    fn a_typical_reading_rejects_once_a_window_is_full() {
        let q = Quota::unified_at(0.2, 1.0, 1_000);
        assert_eq!(q.status.as_deref(), Some("rejected"));
        assert_eq!((q.reset_s, q.representative_claim.as_deref()), (Some(1_000 + 18_000), Some("five_hour")));
        assert_eq!(q.five_hour, Some(Window::allowed(0.2, 19_000)));
        assert_eq!(q.seven_day, Some(Window::new(1.0, "rejected", 1_000 + 604_800)));
        assert_eq!(Quota::unified_at(0.2, 0.1, 0).status.as_deref(), Some("allowed"));
    }

    #[test]
    fn claims_name_the_window() {
        let claims: Vec<String> = ["5h", "7d", "7d_oi", "7d_opus"].into_iter().map(claim).collect();
        assert_eq!(claims, ["five_hour", "seven_day", "seven_day_overage_included", "seven_day_opus"]);
    }
}

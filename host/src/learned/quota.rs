//! Reading the quota signal from upstream response headers.
//!
//! Anthropic reports subscription quota in the `anthropic-ratelimit-unified-*`
//! family (see `shared/references/seed-systems.md` §0) and API-key limits in
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`. This
//! module turns whatever a response carried into one [`QuotaReading`] — a pure
//! function of the headers and the clock — which the account state then merges.
//!
//! Rules every reference system converged on, encoded here:
//! - utilizations are fractions and may exceed 1.0 (`1.02`);
//! - per-model buckets are discovered by pattern (`7d_<bucket>-utilization`), not
//!   from a fixed list, so a new bucket (`7d_oi` for Fable) is seen on day one;
//! - resets are epoch seconds, but a value above 4,102,444,800 is already in
//!   milliseconds (neurolink's guard);
//! - the top-level `status` is authoritative and kept separately from the windows
//!   — except that a `rejected` the headers attribute to one per-model bucket
//!   (by the representative claim, `seven_day_opus`, or, without a claim, by
//!   the only exhausted window being such a bucket) is that bucket's, not the
//!   account's: it gates that family and leaves the others serving (dario
//!   #1385). See [`QuotaReading::rejected_bucket`];
//! - a utilization that is negative or not a number is no reading
//!   (`poolgate_sdk::quota::utilization`).

use http::HeaderMap;

use crate::account::{Status, WindowReading};

const UNIFIED: &str = "anthropic-ratelimit-unified-";

/// Everything one response said about its account's quota.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuotaReading {
    /// Top-level unified status.
    pub status: Option<Status>,
    /// Unified reset (ms since the epoch).
    pub reset_ms: Option<u64>,
    /// The binding window (`five_hour`, `seven_day`, ...).
    pub representative_claim: Option<String>,
    /// Windows by name ("5h", "7d", "7d_oi", "overage", "requests", "tokens", ...).
    pub windows: Vec<WindowReading>,
    /// `overage-status`.
    pub overage_status: Option<Status>,
    /// `overage-disabled-reason`.
    pub overage_disabled_reason: Option<String>,
    /// `fallback-percentage`.
    pub fallback_percentage: Option<f64>,
    /// `anthropic-organization-id`.
    pub organization_id: Option<String>,
    /// `retry-after`, in ms from now.
    pub retry_after_ms: Option<u64>,
    /// The per-model window (`7d_opus`) a top-level `rejected` is attributed
    /// to, if it is: then the rejection is that bucket's (its window reads
    /// `rejected`) and the account as a whole is not refused.
    pub rejected_bucket: Option<String>,
}

impl QuotaReading {
    /// Whether the response carried any unified quota header.
    pub fn has_unified(&self) -> bool {
        self.status.is_some()
            || self.windows.iter().any(|w| w.name == "5h" || w.name == "7d" || w.name.starts_with("7d_"))
    }

    /// Whether the response carried any quota information worth storing.
    pub fn is_empty(&self) -> bool {
        self.status.is_none() && self.windows.is_empty() && self.overage_status.is_none()
    }

    /// The window named `name`.
    pub fn window(&self, name: &str) -> Option<&WindowReading> {
        self.windows.iter().find(|w| w.name == name)
    }

    /// Whether the answer carrying this reading was billed as extra usage:
    /// the binding window is `overage`, or the 5h or 7d window is used up
    /// while overage admits (the request went through on credits).
    pub fn billed_as_overage(&self, now_ms: u64) -> bool {
        use poolgate_sdk::quota::{Exhaustion, exhaustion};
        let spent = |name: &str| {
            self.window(name).is_some_and(|w| {
                exhaustion(w.status == Status::Rejected, w.utilization, w.resets_at_ms, now_ms) != Exhaustion::Open
            })
        };
        self.representative_claim.as_deref().is_some_and(|c| c.eq_ignore_ascii_case("overage"))
            || (self.overage_status == Some(Status::Allowed) && (spent("5h") || spent("7d")))
    }

    /// When the subscription windows that pushed the answer into overage
    /// reset: the latest future reset of a spent 5h/7d window, else the
    /// unified reset.
    pub fn subscription_reset_ms(&self, now_ms: u64) -> Option<u64> {
        let spent = ["5h", "7d"]
            .iter()
            .filter_map(|n| self.window(n))
            .filter(|w| w.status == Status::Rejected || w.utilization >= 1.0)
            .filter_map(|w| w.resets_at_ms)
            .filter(|&r| r > now_ms)
            .max();
        spent.or(self.reset_ms.filter(|&r| r > now_ms))
    }
}

/// Epoch seconds (or, above year 2100 in seconds, already milliseconds) to ms.
pub fn epoch_to_ms(v: u64) -> u64 {
    if v > 4_102_444_800 { v } else { v.saturating_mul(1000) }
}

fn number(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A utilization header's value: finite and not negative.
fn utilization(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().and_then(poolgate_sdk::quota::utilization)
}

/// The API-key limit families: header infix and window name.
const KEY_FAMILIES: [(&str, &str); 4] = [
    ("requests-", "requests"),
    ("tokens-", "tokens"),
    ("input-tokens-", "input_tokens"),
    ("output-tokens-", "output_tokens"),
];

/// A unified window seen in the headers, before it is known to have a utilization.
#[derive(Default)]
struct Unified<'a> {
    name: &'a str,
    utilization: Option<f64>,
    reset: Option<&'a str>,
    status: Option<&'a str>,
}

/// One API-key family's `limit`, `remaining` and `reset`.
#[derive(Default, Clone, Copy)]
struct Keyed<'a> {
    limit: Option<&'a str>,
    remaining: Option<&'a str>,
    reset: Option<&'a str>,
}

fn set<'a>(slot: &mut Option<&'a str>, value: &'a str) {
    // The first value of a repeated header wins, as `HeaderMap::get` would.
    slot.get_or_insert(value);
}

/// Parses `retry-after`: delta seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then_some((secs * 1000.0) as u64);
    }
    let at = httpdate::parse_http_date(value).ok()?;
    let at_ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
    Some(at_ms.saturating_sub(now_ms))
}

/// Parses an RFC 3339 timestamp (API-key `*-reset` headers) to epoch ms.
fn parse_rfc3339_ms(value: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(value.trim()).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64)
}

/// Reads every quota header of a response observed at `now_ms`, in one pass
/// over the headers (this runs on every upstream answer).
pub fn parse(headers: &HeaderMap, now_ms: u64) -> QuotaReading {
    let mut seen = Seen::default();
    for (name, value) in headers {
        let Some(value) = value.to_str().ok().map(str::trim).filter(|v| !v.is_empty()) else { continue };
        let name = name.as_str();
        if let Some(rest) = name.strip_prefix(UNIFIED) {
            seen.unified(rest, value);
        } else if let Some(rest) = name.strip_prefix("anthropic-ratelimit-") {
            seen.keyed(rest, value);
        } else if name == "retry-after" {
            set(&mut seen.retry, value);
        } else if name == "anthropic-organization-id" {
            set(&mut seen.org, value);
        }
    }
    seen.reading(now_ms)
}

/// The quota headers of one response, as seen (borrowed, not yet parsed).
#[derive(Default)]
struct Seen<'a> {
    status: Option<&'a str>,
    reset: Option<&'a str>,
    claim: Option<&'a str>,
    overage: Option<&'a str>,
    reason: Option<&'a str>,
    fallback: Option<&'a str>,
    org: Option<&'a str>,
    retry: Option<&'a str>,
    unified: Vec<Unified<'a>>,
    keyed: [Keyed<'a>; 4],
}

impl<'a> Seen<'a> {
    /// An `anthropic-ratelimit-unified-<rest>` header.
    fn unified(&mut self, rest: &'a str, value: &'a str) {
        match rest {
            "status" => set(&mut self.status, value),
            "reset" => set(&mut self.reset, value),
            "representative-claim" => set(&mut self.claim, value),
            "overage-status" => set(&mut self.overage, value),
            "overage-disabled-reason" => set(&mut self.reason, value),
            "fallback-percentage" => set(&mut self.fallback, value),
            _ => {}
        }
        // Every `<window>-utilization` is a window (5h, 7d, overage, any
        // 7d_<bucket>); its `-reset` and `-status` are companions.
        let (window, part) = if let Some(w) = rest.strip_suffix("-utilization") {
            (w, Part::Utilization)
        } else if let Some(w) = rest.strip_suffix("-reset") {
            (w, Part::Reset)
        } else if let Some(w) = rest.strip_suffix("-status") {
            (w, Part::Status)
        } else {
            return;
        };
        if window.is_empty() || !window.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return;
        }
        let u = match self.unified.iter().position(|u| u.name == window) {
            Some(i) => &mut self.unified[i],
            None => {
                self.unified.push(Unified { name: window, ..Default::default() });
                self.unified.last_mut().expect("just pushed")
            }
        };
        match part {
            Part::Utilization => {
                if u.utilization.is_none() {
                    u.utilization = utilization(value);
                }
            }
            Part::Reset => set(&mut u.reset, value),
            Part::Status => set(&mut u.status, value),
        }
    }

    /// An `anthropic-ratelimit-<family>-<limit|remaining|reset>` header.
    fn keyed(&mut self, rest: &'a str, value: &'a str) {
        for (k, (infix, _)) in KEY_FAMILIES.iter().enumerate() {
            match rest.strip_prefix(infix) {
                Some("limit") => set(&mut self.keyed[k].limit, value),
                Some("remaining") => set(&mut self.keyed[k].remaining, value),
                Some("reset") => set(&mut self.keyed[k].reset, value),
                _ => {}
            }
        }
    }

    /// What the headers said, parsed.
    fn reading(self, now_ms: u64) -> QuotaReading {
        let mut r = QuotaReading {
            status: self.status.map(Status::parse),
            reset_ms: self.reset.and_then(|v| v.parse::<u64>().ok()).map(epoch_to_ms),
            representative_claim: self.claim.map(str::to_string),
            windows: Vec::with_capacity(self.unified.len()),
            overage_status: self.overage.map(Status::parse),
            overage_disabled_reason: self.reason.map(str::to_string),
            fallback_percentage: self.fallback.and_then(number),
            organization_id: self.org.map(str::to_string),
            retry_after_ms: self.retry.and_then(|v| parse_retry_after(v, now_ms)),
            rejected_bucket: None,
        };
        for u in self.unified {
            let Some(utilization) = u.utilization else { continue };
            r.windows.push(WindowReading {
                name: u.name.to_string(),
                utilization,
                resets_at_ms: u.reset.and_then(|v| v.parse::<u64>().ok()).map(epoch_to_ms),
                status: u.status.map_or(Status::Unknown, Status::parse),
                observed_at_ms: Some(now_ms),
            });
        }
        // API-key accounts: limit/remaining/reset per family; utilization = 1 − remaining/limit.
        for (Keyed { limit, remaining, reset }, (_, family)) in self.keyed.into_iter().zip(KEY_FAMILIES) {
            let (Some(limit), Some(remaining)) = (limit.and_then(number), remaining.and_then(number)) else {
                continue;
            };
            if limit <= 0.0 {
                continue;
            }
            let utilization = (1.0 - remaining / limit).max(0.0);
            r.windows.push(WindowReading {
                name: family.to_string(),
                utilization,
                resets_at_ms: reset.and_then(parse_rfc3339_ms),
                status: if remaining <= 0.0 { Status::Rejected } else { Status::Allowed },
                observed_at_ms: Some(now_ms),
            });
        }
        r.windows.sort_by(|a, b| a.name.cmp(&b.name));
        attribute(&mut r, now_ms);
        r
    }
}

/// Attributes a top-level `rejected` to the per-model bucket that caused it,
/// if the headers say which: the representative claim names one
/// (`seven_day_opus` → `7d_opus`), or — without a claim that names a window —
/// the 5h and 7d windows admit and exactly one per-model bucket is used up.
/// The bucket's window then reads `rejected` (created from the unified reset
/// if the response did not carry it), so every plugin sees the same thing the
/// host gates on.
fn attribute(r: &mut QuotaReading, now_ms: u64) {
    use poolgate_sdk::quota::{Exhaustion, bucket_of, claimed_window, exhaustion};
    if r.status != Some(Status::Rejected) {
        return;
    }
    let used_up = |w: &WindowReading| {
        exhaustion(w.status == Status::Rejected, w.utilization, w.resets_at_ms, now_ms) != Exhaustion::Open
    };
    let bucket = match r.representative_claim.as_deref().and_then(claimed_window) {
        Some(window) => bucket_of(&window).is_some().then_some(window),
        None => {
            let account_wide = ["5h", "7d"].iter().any(|n| r.window(n).is_some_and(used_up));
            let mut spent = r.windows.iter().filter(|w| bucket_of(&w.name).is_some() && used_up(w));
            match (spent.next(), spent.next()) {
                (Some(w), None) if !account_wide => Some(w.name.clone()),
                _ => None,
            }
        }
    };
    let Some(bucket) = bucket else { return };
    match r.windows.iter_mut().find(|w| w.name == bucket) {
        Some(w) => {
            w.status = Status::Rejected;
            w.resets_at_ms = w.resets_at_ms.or(r.reset_ms);
        }
        None => {
            r.windows.push(WindowReading {
                name: bucket.clone(),
                utilization: 1.0,
                resets_at_ms: r.reset_ms,
                status: Status::Rejected,
                observed_at_ms: Some(now_ms),
            });
            r.windows.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }
    r.rejected_bucket = Some(bucket);
}

/// Which companion of a unified window a header is.
enum Part {
    Utilization,
    Reset,
    Status,
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const NOW: u64 = 1_760_000_000_000;

    #[test]
    fn reads_the_unified_family_with_fractions_and_second_resets() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-status", "allowed_warning"),
            ("anthropic-ratelimit-unified-reset", "1760003600"),
            ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
            ("anthropic-ratelimit-unified-5h-utilization", "1.02"),
            ("anthropic-ratelimit-unified-5h-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-reset", "1760003600"),
            ("anthropic-ratelimit-unified-7d-utilization", "0.03"),
            ("anthropic-ratelimit-unified-7d-status", "allowed"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "0.9"),
            ("anthropic-ratelimit-unified-7d_oi-status", "allowed"),
            ("anthropic-ratelimit-unified-7d_oi-reset", "1760500000"),
            ("anthropic-ratelimit-unified-overage-status", "rejected"),
            ("anthropic-ratelimit-unified-overage-disabled-reason", "org_level_disabled"),
            ("anthropic-organization-id", "org-123"),
        ]);
        let r = parse(&h, NOW);
        assert_eq!(r.status, Some(Status::AllowedWarning));
        assert_eq!(r.reset_ms, Some(1_760_003_600_000));
        assert_eq!(r.representative_claim.as_deref(), Some("five_hour"));
        let five = r.window("5h").unwrap();
        assert_eq!(five.utilization, 1.02);
        assert_eq!(five.status, Status::Rejected);
        assert_eq!(r.window("7d").unwrap().utilization, 0.03);
        let oi = r.window("7d_oi").unwrap();
        assert_eq!((oi.utilization, oi.resets_at_ms), (0.9, Some(1_760_500_000_000)));
        assert_eq!(r.overage_status, Some(Status::Rejected));
        assert_eq!(r.organization_id.as_deref(), Some("org-123"));
        assert!(r.has_unified());
    }

    #[test]
    fn companions_may_come_before_their_window_and_the_first_repeat_wins() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-7d_oi-reset", "1760500000"),
            ("anthropic-ratelimit-unified-7d_oi-status", "rejected"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "1.01"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "0.2"),
            ("anthropic-ratelimit-unified-5h-reset", "1760003600"),
            ("retry-after", "7"),
            ("retry-after", "99"),
        ]);
        let r = parse(&h, NOW);
        let oi = r.window("7d_oi").unwrap();
        assert_eq!((oi.utilization, oi.status, oi.resets_at_ms), (1.01, Status::Rejected, Some(1_760_500_000_000)));
        assert!(r.window("5h").is_none(), "a reset without a utilization is no window");
        assert_eq!(r.retry_after_ms, Some(7_000));
    }

    #[test]
    fn a_bare_429_carries_no_unified_signal() {
        let r = parse(&headers(&[("request-id", "req_1")]), NOW);
        assert!(!r.has_unified());
        assert!(r.is_empty());
    }

    #[test]
    fn retry_after_in_seconds_or_http_date() {
        assert_eq!(parse_retry_after("30", NOW), Some(30_000));
        assert_eq!(parse_retry_after("0.5", NOW), Some(500));
        let date = httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_millis(NOW + 90_000));
        assert_eq!(parse_retry_after(&date, NOW), Some(90_000));
        assert_eq!(parse_retry_after("soon", NOW), None);
    }

    #[test]
    fn resets_already_in_milliseconds_are_kept() {
        assert_eq!(epoch_to_ms(1_760_000_000), 1_760_000_000_000);
        assert_eq!(epoch_to_ms(1_760_000_000_123), 1_760_000_000_123);
    }

    #[test]
    fn api_key_limits_become_windows() {
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "10"),
            ("anthropic-ratelimit-requests-reset", "2025-10-09T08:53:20Z"),
            ("anthropic-ratelimit-input-tokens-limit", "1000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
        ]);
        let r = parse(&h, NOW);
        let req = r.window("requests").unwrap();
        assert!((req.utilization - 0.8).abs() < 1e-9);
        assert_eq!(req.resets_at_ms, Some(1_760_000_000_000));
        assert_eq!(r.window("input_tokens").unwrap().status, Status::Rejected);
        assert!(!r.has_unified());
    }

    #[test]
    fn a_rejection_claimed_by_a_bucket_is_the_buckets() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", "1760500000"),
            ("anthropic-ratelimit-unified-representative-claim", "seven_day_opus"),
            ("anthropic-ratelimit-unified-5h-utilization", "0.2"),
            ("anthropic-ratelimit-unified-7d-utilization", "0.3"),
        ]);
        let r = parse(&h, NOW);
        assert_eq!(r.rejected_bucket.as_deref(), Some("7d_opus"));
        let opus = r.window("7d_opus").expect("the claimed bucket becomes a window");
        assert_eq!(
            (opus.status, opus.utilization, opus.resets_at_ms),
            (Status::Rejected, 1.0, Some(1_760_500_000_000))
        );
        // An account-wide claim stays the account's.
        let h = headers(&[
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-representative-claim", "five_hour"),
            ("anthropic-ratelimit-unified-7d_opus-utilization", "1.0"),
        ]);
        assert_eq!(parse(&h, NOW).rejected_bucket, None);
    }

    #[test]
    fn without_a_claim_the_only_spent_bucket_takes_the_rejection() {
        let base = [
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-5h-utilization", "0.2"),
            ("anthropic-ratelimit-unified-7d-utilization", "0.3"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "1.0"),
            ("anthropic-ratelimit-unified-7d_oi-reset", "1760500000"),
        ];
        assert_eq!(parse(&headers(&base), NOW).rejected_bucket.as_deref(), Some("7d_oi"));
        // Two spent buckets, or a spent 7d: no single bucket to blame.
        let two = [&base[..], &[("anthropic-ratelimit-unified-7d_opus-utilization", "1.0")]].concat();
        assert_eq!(parse(&headers(&two), NOW).rejected_bucket, None);
        let mut wide = base;
        wide[2] = ("anthropic-ratelimit-unified-7d-utilization", "1.0");
        assert_eq!(parse(&headers(&wide), NOW).rejected_bucket, None);
    }

    #[test]
    fn negative_utilizations_are_no_reading() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-5h-utilization", "-0.5"),
            ("anthropic-ratelimit-unified-7d-utilization", "-inf"),
            ("anthropic-ratelimit-unified-7d_oi-utilization", "0.4"),
        ]);
        let r = parse(&h, NOW);
        assert_eq!(r.windows.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["7d_oi"]);
    }

    #[test]
    fn garbage_values_are_ignored() {
        let h = headers(&[
            ("anthropic-ratelimit-unified-5h-utilization", "lots"),
            ("anthropic-ratelimit-unified-7d-utilization", "NaN"),
            ("anthropic-ratelimit-unified-status", "weird"),
        ]);
        let r = parse(&h, NOW);
        assert!(r.windows.is_empty());
        assert_eq!(r.status, Some(Status::Unknown));
    }
}

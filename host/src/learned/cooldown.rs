//! What an upstream answer means for its account: a cooldown by cause, each with
//! its own expiry — a pure function of the answer, the quota it carried and the
//! account's recent streaks.
//!
//! The causes and their ladder follow neurolink's `planCooldownFor429` and dario
//! #1264/#1385, which all three reference systems converged on after production
//! incidents:
//! - a window that says exhausted parks the account until that window's reset
//!   (bounded by a per-cause ceiling, so a bogus reset cannot strand a seat);
//! - a per-model bucket that says exhausted gates only that model family;
//! - a unified `rejected` without an exhausted window cools for `retry-after`, or
//!   a default;
//! - a bare 429 (no unified headers) is a burst limit: a short cooldown;
//! - 529 and 5xx back off briefly and exponentially; 401/403 back off
//!   exponentially, escalating only when not already cooling (burst-safe), and any
//!   2xx clears them.

use serde::Serialize;

use poolgate_sdk::Buckets;
use poolgate_sdk::quota::{Exhaustion, bucket_of, exhaustion};

use super::quota::QuotaReading;
use crate::account::{CooldownReason, Status, WindowReading};

pub use crate::config::CooldownConfig;

/// How an attempt on an account ended, as far as cooldowns care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// An HTTP status from the upstream.
    Status(u16),
    /// The connection failed before any response.
    ConnectFailed,
}

/// The account's recent failure streaks (consecutive counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Streaks {
    /// Consecutive 401/403 answers.
    pub auth: u32,
    /// Consecutive 529 answers.
    pub overloaded: u32,
    /// Consecutive 5xx answers or connection failures.
    pub upstream_error: u32,
    /// Consecutive answers cut after their first byte (a 2xx at its start
    /// does not reset this; only an answer that ends whole does).
    pub stream_cuts: u32,
}

/// What to do to the account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing changes.
    Keep,
    /// Cool the whole account until `until_ms`.
    Cool {
        /// End of the cooldown.
        until_ms: u64,
        /// Its cause.
        reason: CooldownReason,
    },
    /// Gate one model family until `until_ms`; the account serves other families.
    GateModel {
        /// The family.
        family: String,
        /// End of the gate.
        until_ms: u64,
    },
    /// A healthy answer proved quota-based cooldowns stale: lift them — and
    /// gate the families whose buckets the same answer reports exhausted.
    Clear {
        /// (family, until) for each exhausted bucket the answer reported.
        gates: Vec<(String, u64)>,
    },
}

impl Plan {
    /// A `Clear` that gates nothing.
    pub fn clear() -> Plan {
        Plan::Clear { gates: Vec::new() }
    }
}

/// Whether window `w` says used up at `now` (the SDK's one definition,
/// `poolgate_sdk::quota`), and its reset if it says until when. The host holds
/// an actual answer here, so a used-up window without a reset counts too: the
/// caller cools for a configured fallback.
fn exhausted(w: Option<&WindowReading>, now: u64) -> Option<Option<u64>> {
    let w = w?;
    match exhaustion(w.status == Status::Rejected, w.utilization, w.resets_at_ms, now) {
        Exhaustion::Open => None,
        Exhaustion::Until(r) => Some(Some(r)),
        Exhaustion::ResetUnknown => Some(None),
    }
}

/// The family a per-model window binds (`7d_oi` → `fable`, `7d_opus` → `opus`),
/// by the SDK's default bucket map — the same the built-ins use.
fn bucket_family(window: &str) -> Option<String> {
    let bucket = bucket_of(window)?;
    Some(Buckets::default().family(bucket).to_ascii_lowercase())
}

/// The exhausted per-model bucket a 429 is about, and its reset: the one the
/// top-level rejection is attributed to, else one bound to the request's
/// family, else any.
fn exhausted_bucket<'r>(r: &'r QuotaReading, family: Option<&str>, now: u64) -> Option<(&'r str, Option<u64>)> {
    let buckets = || r.windows.iter().filter(|w| bucket_of(&w.name).is_some());
    let spent = |w: &'r WindowReading| exhausted(Some(w), now).map(|reset| (w.name.as_str(), reset));
    if let Some(name) = &r.rejected_bucket
        && let Some(found) = r.window(name).and_then(spent)
    {
        return Some(found);
    }
    let bound = buckets().filter(|w| family.is_some() && bucket_family(&w.name).as_deref() == family);
    bound.filter_map(spent).next().or_else(|| buckets().filter_map(spent).next())
}

fn until(now: u64, reset: Option<u64>, fallback_ms: u64, ceiling_ms: u64) -> u64 {
    // Saturating: `retry-after` is the upstream's word, and an absurd one
    // (1e94 seconds reads as u64::MAX ms) wrapped round to a cooldown that
    // had already ended, or panicked in a debug build.
    let target = reset.filter(|r| *r > now).unwrap_or(now.saturating_add(fallback_ms));
    target.min(now.saturating_add(ceiling_ms))
}

fn backoff(base: u64, max: u64, streak: u32) -> u64 {
    base.saturating_mul(1u64 << streak.saturating_sub(1).min(20)).min(max)
}

/// Plans the cooldown for one answer. `streaks` are the account's streaks
/// *including* this answer; `already_auth_cooling` tells whether an auth cooldown
/// was in force when the answer arrived.
pub fn plan(
    answer: Answer,
    reading: &QuotaReading,
    family: Option<&str>,
    streaks: Streaks,
    cfg: &CooldownConfig,
    now: u64,
) -> Plan {
    let upstream_error = || Plan::Cool {
        until_ms: now.saturating_add(backoff(cfg.upstream_error_ms, cfg.upstream_error_max_ms, streaks.upstream_error)),
        reason: CooldownReason::UpstreamError,
    };
    match answer {
        Answer::Status(429) => rate_limited(reading, family, cfg, now),
        Answer::Status(529) => Plan::Cool {
            until_ms: now.saturating_add(backoff(cfg.overloaded_ms, cfg.overloaded_max_ms, streaks.overloaded)),
            reason: CooldownReason::Overloaded,
        },
        Answer::Status(401 | 403) => Plan::Cool {
            until_ms: now.saturating_add(backoff(cfg.auth_ms, cfg.auth_max_ms, streaks.auth)),
            reason: CooldownReason::Auth,
        },
        Answer::Status(s) if s >= 500 => upstream_error(),
        Answer::ConnectFailed => upstream_error(),
        Answer::Status(s) if (200..300).contains(&s) => succeeded(reading, cfg, now),
        Answer::Status(_) => Plan::Keep,
    }
}

/// A 429: the most specific cause the headers support — a spent weekly or
/// session window, a per-model bucket, a unified rejection — else transient.
fn rate_limited(reading: &QuotaReading, family: Option<&str>, cfg: &CooldownConfig, now: u64) -> Plan {
    let overage_usable = reading.overage_status == Some(Status::Allowed);
    let window_fallback = reading.retry_after_ms.unwrap_or(cfg.window_without_reset_ms);
    if let Some(reset) = exhausted(reading.window("7d"), now) {
        return Plan::Cool {
            until_ms: until(now, reset, window_fallback, cfg.weekly_ceiling_ms),
            reason: CooldownReason::WeeklyExhausted,
        };
    }
    if !overage_usable && let Some(reset) = exhausted(reading.window("5h"), now) {
        return Plan::Cool {
            until_ms: until(now, reset, window_fallback, cfg.session_ceiling_ms),
            reason: CooldownReason::SessionExhausted,
        };
    }
    // A per-model bucket exhausted while the account-wide windows admit:
    // gate only the family that bucket binds (dario #1385).
    if let Some((window, reset)) = exhausted_bucket(reading, family, now)
        && let Some(gated) = bucket_family(window)
    {
        return Plan::GateModel { family: gated, until_ms: until(now, reset, window_fallback, cfg.model_ceiling_ms) };
    }
    if reading.status == Some(Status::Rejected) && !overage_usable {
        let fallback = reading.retry_after_ms.unwrap_or(cfg.unified_ms);
        let reset = reading.retry_after_ms.is_none().then_some(reading.reset_ms).flatten();
        return Plan::Cool {
            until_ms: until(now, reset, fallback, cfg.unified_ceiling_ms),
            reason: CooldownReason::UnifiedRejected,
        };
    }
    let ms = reading.retry_after_ms.map_or(cfg.transient_ms, |r| r.clamp(1_000, cfg.transient_max_ms));
    Plan::Cool { until_ms: now.saturating_add(ms), reason: CooldownReason::Transient }
}

/// A success: it lifts quota cooldowns, unless it still reports a spent
/// window (with a reset) — then the account cools proactively, so the next
/// request does not spend a round trip to learn it. A spent per-model bucket
/// (with a reset) gates its family the same way.
fn succeeded(reading: &QuotaReading, cfg: &CooldownConfig, now: u64) -> Plan {
    let overage_usable = reading.overage_status == Some(Status::Allowed);
    if let Some(reset) = exhausted(reading.window("7d"), now).filter(|r| r.is_some()) {
        return Plan::Cool {
            until_ms: until(now, reset, cfg.window_without_reset_ms, cfg.weekly_ceiling_ms),
            reason: CooldownReason::WeeklyExhausted,
        };
    }
    if !overage_usable && let Some(reset) = exhausted(reading.window("5h"), now).filter(|r| r.is_some()) {
        return Plan::Cool {
            until_ms: until(now, reset, cfg.window_without_reset_ms, cfg.session_ceiling_ms),
            reason: CooldownReason::SessionExhausted,
        };
    }
    let gates = reading
        .windows
        .iter()
        .filter_map(|w| {
            let reset = exhausted(Some(w), now).flatten()?;
            Some((bucket_family(&w.name)?, until(now, Some(reset), cfg.window_without_reset_ms, cfg.model_ceiling_ms)))
        })
        .collect();
    Plan::Clear { gates }
}

/// The cooldown after an answer was cut mid-way, with `streaks` including
/// this cut: none below `[cooldowns] stream_cuts` in a row, then the
/// `upstream_error` backoff, escalating per further cut.
pub fn after_cut(streaks: Streaks, cfg: &CooldownConfig, now: u64) -> Plan {
    if cfg.stream_cuts == 0 || streaks.stream_cuts < cfg.stream_cuts {
        return Plan::Keep;
    }
    let over = streaks.stream_cuts - cfg.stream_cuts + 1;
    Plan::Cool {
        until_ms: now.saturating_add(backoff(cfg.upstream_error_ms, cfg.upstream_error_max_ms, over)),
        reason: CooldownReason::UpstreamError,
    }
}

/// Whether a status makes the gateway try the next account (before the first
/// byte reached the client): rate limits, overload, server errors, and refused
/// credentials (another account's credential may well work).
pub fn fails_over(status: u16) -> bool {
    matches!(status, 401 | 403 | 429 | 529) || status >= 500
}

/// Whether a cooldown of `reason` is quota-based, and so lifted by a success
/// that reports quota again.
pub fn lifted_by_success(reason: CooldownReason) -> bool {
    matches!(
        reason,
        CooldownReason::WeeklyExhausted
            | CooldownReason::SessionExhausted
            | CooldownReason::UnifiedRejected
            | CooldownReason::Transient
            | CooldownReason::Overloaded
            | CooldownReason::UpstreamError
            | CooldownReason::Auth
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;
    const HOUR: u64 = 60 * MINUTE;
    use crate::account::WindowReading;

    const NOW: u64 = 1_760_000_000_000;

    fn window(name: &str, u: f64, status: Status, reset: Option<u64>) -> WindowReading {
        WindowReading { name: name.into(), utilization: u, resets_at_ms: reset, status, observed_at_ms: Some(NOW) }
    }

    fn reading(windows: Vec<WindowReading>, status: Option<Status>) -> QuotaReading {
        QuotaReading { windows, status, ..Default::default() }
    }

    fn plan429(r: &QuotaReading, family: Option<&str>) -> Plan {
        plan(Answer::Status(429), r, family, Streaks::default(), &CooldownConfig::default(), NOW)
    }

    #[test]
    fn weekly_exhaustion_parks_until_the_7d_reset() {
        let r = reading(vec![window("7d", 1.0, Status::Rejected, Some(NOW + 3 * HOUR))], Some(Status::Rejected));
        assert_eq!(plan429(&r, None), Plan::Cool { until_ms: NOW + 3 * HOUR, reason: CooldownReason::WeeklyExhausted });
    }

    #[test]
    fn a_reset_beyond_the_ceiling_is_clamped() {
        let r = reading(vec![window("5h", 1.0, Status::Rejected, Some(NOW + 100 * HOUR))], Some(Status::Rejected));
        let Plan::Cool { until_ms, reason } = plan429(&r, None) else { panic!() };
        assert_eq!(reason, CooldownReason::SessionExhausted);
        assert_eq!(until_ms, NOW + 5 * HOUR + 15 * MINUTE);
    }

    #[test]
    fn a_scoped_bucket_gates_only_the_requests_family() {
        let r = reading(
            vec![
                window("5h", 0.1, Status::Allowed, Some(NOW + HOUR)),
                window("7d", 0.2, Status::Allowed, Some(NOW + 24 * HOUR)),
                window("7d_oi", 1.0, Status::Rejected, Some(NOW + 48 * HOUR)),
            ],
            Some(Status::Rejected),
        );
        assert_eq!(plan429(&r, Some("fable")), Plan::GateModel { family: "fable".into(), until_ms: NOW + 48 * HOUR });
    }

    #[test]
    fn a_bucket_gates_the_family_it_binds_not_the_requests() {
        let r = reading(
            vec![
                window("5h", 0.1, Status::Allowed, Some(NOW + HOUR)),
                window("7d_opus", 1.0, Status::Rejected, Some(NOW + 48 * HOUR)),
            ],
            Some(Status::Rejected),
        );
        assert_eq!(plan429(&r, Some("sonnet")), Plan::GateModel { family: "opus".into(), until_ms: NOW + 48 * HOUR });
    }

    #[test]
    fn a_success_reporting_a_spent_bucket_gates_its_family() {
        let cfg = CooldownConfig::default();
        let r = reading(
            vec![
                window("5h", 0.1, Status::Allowed, Some(NOW + HOUR)),
                window("7d_oi", 1.0, Status::Rejected, Some(NOW + 48 * HOUR)),
                window("7d_opus", 0.4, Status::Allowed, Some(NOW + 48 * HOUR)),
            ],
            Some(Status::Allowed),
        );
        assert_eq!(
            plan(Answer::Status(200), &r, Some("sonnet"), Streaks::default(), &cfg, NOW),
            Plan::Clear { gates: vec![("fable".into(), NOW + 48 * HOUR)] }
        );
    }

    #[test]
    fn unified_rejected_without_windows_uses_retry_after_or_the_default() {
        let mut r = reading(vec![window("5h", 0.5, Status::Allowed, None)], Some(Status::Rejected));
        assert_eq!(
            plan429(&r, None),
            Plan::Cool { until_ms: NOW + 15 * MINUTE, reason: CooldownReason::UnifiedRejected }
        );
        r.retry_after_ms = Some(120_000);
        assert_eq!(plan429(&r, None), Plan::Cool { until_ms: NOW + 120_000, reason: CooldownReason::UnifiedRejected });
    }

    /// Found by fuzzing (`fuzz/corpus/quota_headers/regress-retry-after-overflow`):
    /// a rejection whose `retry-after` is 1e94 seconds (u64::MAX ms once read)
    /// overflowed `now + retry-after` — a panic in a debug build, and in a
    /// release one a cooldown that had already ended.
    #[test]
    fn an_absurd_retry_after_is_held_to_the_ceiling() {
        let r = QuotaReading { status: Some(Status::Rejected), retry_after_ms: Some(u64::MAX), ..Default::default() };
        let cfg = CooldownConfig::default();
        assert_eq!(
            plan429(&r, None),
            Plan::Cool { until_ms: NOW + cfg.unified_ceiling_ms, reason: CooldownReason::UnifiedRejected }
        );
    }

    #[test]
    fn a_bare_429_is_a_short_transient_cooldown() {
        let r = QuotaReading::default();
        assert_eq!(plan429(&r, None), Plan::Cool { until_ms: NOW + 10_000, reason: CooldownReason::Transient });
        let r = QuotaReading { retry_after_ms: Some(3_600_000), ..Default::default() };
        assert_eq!(plan429(&r, None), Plan::Cool { until_ms: NOW + 15 * MINUTE, reason: CooldownReason::Transient });
    }

    #[test]
    fn overload_and_auth_back_off_exponentially_with_a_cap() {
        let cfg = CooldownConfig::default();
        let r = QuotaReading::default();
        let at = |answer, streaks| match plan(answer, &r, None, streaks, &cfg, NOW) {
            Plan::Cool { until_ms, .. } => until_ms - NOW,
            p => panic!("{p:?}"),
        };
        assert_eq!(at(Answer::Status(529), Streaks { overloaded: 1, ..Default::default() }), 1_000);
        assert_eq!(at(Answer::Status(529), Streaks { overloaded: 3, ..Default::default() }), 4_000);
        assert_eq!(at(Answer::Status(529), Streaks { overloaded: 30, ..Default::default() }), 30_000);
        assert_eq!(at(Answer::Status(401), Streaks { auth: 1, ..Default::default() }), MINUTE);
        assert_eq!(at(Answer::Status(403), Streaks { auth: 2, ..Default::default() }), 2 * MINUTE);
        assert_eq!(at(Answer::Status(401), Streaks { auth: 9, ..Default::default() }), 30 * MINUTE);
        assert_eq!(at(Answer::ConnectFailed, Streaks { upstream_error: 1, ..Default::default() }), 2_000);
    }

    #[test]
    fn a_success_lifts_quota_cooldowns_unless_it_reports_exhaustion() {
        let cfg = CooldownConfig::default();
        let ok = reading(vec![window("5h", 0.2, Status::Allowed, Some(NOW + HOUR))], Some(Status::Allowed));
        assert_eq!(plan(Answer::Status(200), &ok, None, Streaks::default(), &cfg, NOW), Plan::clear());
        let spent = reading(vec![window("5h", 1.0, Status::Rejected, Some(NOW + HOUR))], Some(Status::Allowed));
        assert_eq!(
            plan(Answer::Status(200), &spent, None, Streaks::default(), &cfg, NOW),
            Plan::Cool { until_ms: NOW + HOUR, reason: CooldownReason::SessionExhausted }
        );
    }

    #[test]
    fn repeated_cuts_cool_with_the_upstream_error_backoff() {
        let cfg = CooldownConfig::default();
        let cuts = |n| Streaks { stream_cuts: n, ..Default::default() };
        assert_eq!(after_cut(cuts(2), &cfg, NOW), Plan::Keep);
        assert_eq!(
            after_cut(cuts(3), &cfg, NOW),
            Plan::Cool { until_ms: NOW + 2_000, reason: CooldownReason::UpstreamError }
        );
        assert_eq!(
            after_cut(cuts(5), &cfg, NOW),
            Plan::Cool { until_ms: NOW + 8_000, reason: CooldownReason::UpstreamError }
        );
        let never = CooldownConfig { stream_cuts: 0, ..cfg };
        assert_eq!(after_cut(cuts(50), &never, NOW), Plan::Keep);
    }

    #[test]
    fn client_errors_change_nothing_and_do_not_fail_over() {
        let cfg = CooldownConfig::default();
        assert_eq!(
            plan(Answer::Status(400), &QuotaReading::default(), None, Streaks::default(), &cfg, NOW),
            Plan::Keep
        );
        assert!(!fails_over(400));
        assert!(!fails_over(404));
        assert!(fails_over(429) && fails_over(529) && fails_over(503) && fails_over(401));
    }
}

//! The answer when no account could serve a request: what stood in each
//! account's way, and the one answer that tells the client what to do about it.
//!
//! A client acts on the status, so the status must name the real cause:
//!
//! - **quota** (an account cooling for a spent window, a model gate, a unified
//!   rejection or a 429 burst limit) → 429 `rate_limit_error` with
//!   `retry-after` = the soonest recovery: waiting is what helps;
//! - **auth** (401/403 from the upstream, or cooling for `auth`) → 503
//!   `api_error` naming the accounts to re-authenticate — never the upstream's
//!   401, which a client reads as *its own* key being wrong (Claude Code then
//!   exits with "Invalid API key");
//! - **upstream** (5xx, 529, no connection, or cooling for `upstream_error` /
//!   `overloaded`) → 502 when this request's attempts all failed upstream, 503
//!   with `retry-after` when every account was already cooling.
//!
//! With mixed causes the most actionable wins, in that order: a quota-parked
//! account recovers by itself at a known time, a refused credential needs a
//! person, an outage needs neither. `docs/errors.md` lists every local answer.

use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use super::errors::{ErrorType, error, rate_limited};
use super::record::{Attempt, Ending};
pub use super::record::{Blocked, Cause};
use crate::account::{AccountSnapshot, CooldownReason};
use crate::gateway::generation::Generation;

/// The plan-limit window a cooldown or gate stands for, as the
/// `anthropic-ratelimit-unified-representative-claim` values Claude Code
/// reads; `None` for what is not a plan limit (a burst 429, an outage, a
/// refused credential). `Some("")`: a plan limit whose window is not known.
fn plan_window(reason: CooldownReason) -> Option<&'static str> {
    match reason {
        CooldownReason::SessionExhausted => Some("five_hour"),
        CooldownReason::WeeklyExhausted => Some("seven_day"),
        CooldownReason::UnifiedRejected | CooldownReason::Overage | CooldownReason::ModelExhausted => Some(""),
        _ => None,
    }
}

/// A per-model gate's window, by family (`seven_day_opus`, …).
fn gate_window(family: &str) -> &'static str {
    match family {
        "opus" => "seven_day_opus",
        "sonnet" => "seven_day_sonnet",
        _ => "",
    }
}

/// The cause of a cooldown.
fn cooling_cause(reason: CooldownReason) -> Cause {
    match reason {
        CooldownReason::WeeklyExhausted
        | CooldownReason::SessionExhausted
        | CooldownReason::ModelExhausted
        | CooldownReason::UnifiedRejected
        | CooldownReason::Transient
        // The overage guard rests a seat until its windows reset: a quota.
        | CooldownReason::Overage => Cause::Quota,
        // Disabled (an OAuth seat that needs a login) is, like a refused
        // credential, for a person to act on.
        CooldownReason::Auth | CooldownReason::Disabled => Cause::Auth,
        CooldownReason::Overloaded | CooldownReason::UpstreamError => Cause::Upstream,
    }
}

/// The cause of an upstream answer that failed over (`None`: no answer).
fn attempt_cause(status: Option<u16>) -> Cause {
    match status {
        Some(429) => Cause::Quota,
        Some(401 | 403) => Cause::Auth,
        _ => Cause::Upstream,
    }
}

/// What stands in one account's way at `now`: its cooldown or model gate, else
/// how this request's attempt on it failed; `None` if it could serve.
pub fn blocked_by(snapshot: &AccountSnapshot, family: Option<&str>, attempts: &[Attempt], now: u64) -> Option<Blocked> {
    let account = snapshot.id.clone();
    let tried = attempts.iter().rev().find(|a| a.account.as_deref() == Some(&account));
    let answered = tried.map(|t| t.status.map_or_else(|| "no answer".to_string(), |s| format!("HTTP {s}")));
    let (cause, until_ms, state, plan_limit) = if let Some(c) = snapshot.active_cooldown(now) {
        let cause = cooling_cause(c.reason);
        (cause, Some(c.until_ms), Some(format!("cooling: {}", c.reason.as_str())), plan_window(c.reason))
    } else if let Some(g) = snapshot.active_gate(family, now) {
        let window = Some(gate_window(&g.family));
        (Cause::Quota, Some(g.until_ms), Some(format!("model family `{}` gated", g.family)), window)
    } else {
        (attempt_cause(tried?.status), None, None, None)
    };
    let detail = [answered, state].into_iter().flatten().collect::<Vec<_>>().join(", ");
    Some(Blocked { account, cause, detail, until_ms, plan_limit })
}

/// Every account of `generation` that could not serve a request for `family`.
/// The second value: whether any account is still usable (an attempt limit ran
/// out before it was tried).
pub fn survey(generation: &Generation, family: Option<&str>, attempts: &[Attempt], now: u64) -> (Vec<Blocked>, bool) {
    let mut usable = false;
    let mut blocked = Vec::new();
    // An account an operator disabled is out of the pool, as one the file
    // disables: nothing about it is for the client to wait out.
    for a in generation.accounts.iter().filter(|a| !a.state.is_runtime_disabled()) {
        match blocked_by(&a.state.snapshot(&a.config, now), family, attempts, now) {
            Some(b) => blocked.push(b),
            None => usable = true,
        }
    }
    (blocked, usable)
}

/// The answer to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// 429: some account waits out a quota; retry after `retry_after_ms`.
    Parked {
        /// Until the soonest recovery.
        retry_after_ms: u64,
        /// Accounts whose credential was refused meanwhile.
        refused: Vec<String>,
        /// When the soonest recovery is a plan limit's reset: the pool is out
        /// of plan quota until then, and the answer says so as Anthropic's
        /// would ([`PoolLimit`]).
        limit: Option<PoolLimit>,
    },
    /// 503: credentials were refused; re-authenticate these accounts.
    AuthRefused {
        /// The accounts refused.
        refused: Vec<String>,
        /// The accounts failing upstream meanwhile.
        failing: Vec<String>,
    },
    /// 502: this request's attempts all failed upstream.
    UpstreamFailed {
        /// `account (what happened)`, per account.
        failed: Vec<String>,
    },
    /// 503: every account is cooling after upstream failures.
    UpstreamCooling {
        /// The accounts cooling.
        cooling: Vec<String>,
        /// Until the soonest recovery.
        retry_after_ms: u64,
    },
    /// 503: nothing was tried and nothing stands in the way (the chain left no account).
    NoAccount,
}

/// The pool out of plan quota: when it comes back, and which window binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLimit {
    /// When the first account's window resets (ms since the epoch).
    pub reset_ms: u64,
    /// That window, as Claude Code names it (empty when unknown).
    pub claim: &'static str,
}

/// Whether the pool is out of plan quota: no account usable, and the one that
/// recovers first (of those that recover by themselves) is waiting out a
/// spent window — not a burst limit or an outage, after which a retry soon
/// succeeds. Claude Code tells the two apart by the unified headers on a 429:
/// with them it shows the limit and its reset; without them it backs off and
/// retries, which is right for a throttle.
fn pool_limit(blocked: &[Blocked], usable: bool) -> Option<PoolLimit> {
    if usable {
        return None;
    }
    let first = blocked.iter().filter(|b| b.cause != Cause::Auth).min_by_key(|b| b.until_ms.unwrap_or(0))?;
    Some(PoolLimit { reset_ms: first.until_ms?, claim: first.plan_limit? })
}

/// Decides the answer from what blocked each account. `attempted`: whether
/// this request reached any upstream; `usable`: whether an account could still
/// serve (the attempt limit ran out first).
pub fn verdict(blocked: &[Blocked], usable: bool, attempted: bool, now: u64) -> Verdict {
    let ids = |cause: Cause| -> Vec<String> {
        blocked.iter().filter(|b| b.cause == cause).map(|b| format!("`{}`", b.account)).collect()
    };
    let soonest = |causes: &[Cause]| -> u64 {
        let until = blocked.iter().filter(|b| causes.contains(&b.cause)).filter_map(|b| b.until_ms);
        let soonest = if usable { Some(now) } else { until.min() };
        soonest.map_or(1_000, |t| t.saturating_sub(now))
    };
    let (quota, refused, upstream) = (ids(Cause::Quota), ids(Cause::Auth), ids(Cause::Upstream));
    if !quota.is_empty() {
        let limit = pool_limit(blocked, usable);
        return Verdict::Parked { retry_after_ms: soonest(&[Cause::Quota, Cause::Upstream]), refused, limit };
    }
    if !refused.is_empty() {
        return Verdict::AuthRefused { refused, failing: upstream };
    }
    if upstream.is_empty() {
        return Verdict::NoAccount;
    }
    if attempted {
        let failed = blocked.iter().map(|b| format!("`{}` ({})", b.account, b.detail)).collect();
        return Verdict::UpstreamFailed { failed };
    }
    Verdict::UpstreamCooling { cooling: upstream, retry_after_ms: soonest(&[Cause::Upstream]) }
}

impl Verdict {
    /// How the request ended, for the record.
    pub fn ending(&self) -> Ending {
        match self {
            Verdict::Parked { .. } => Ending::Parked,
            Verdict::AuthRefused { .. } => Ending::AuthRefused,
            Verdict::UpstreamFailed { .. } => Ending::UpstreamFailed,
            Verdict::UpstreamCooling { .. } => Ending::UpstreamCooling,
            Verdict::NoAccount => Ending::NoAccount,
        }
    }

    /// The response, in Anthropic's error shape, with `x-poolgate-pool` naming
    /// the cause. `last_why` is what broke the last attempt without an answer.
    pub fn response(&self, last_why: Option<&str>) -> Response {
        let mut r = match self {
            Verdict::Parked { retry_after_ms, refused, limit } => {
                let mut msg = String::from(
                    "poolgate: every account is cooling down (rate limited or exhausted); retry after the time given",
                );
                if !refused.is_empty() {
                    msg.push_str(&format!("; re-authenticate account {} (credential refused)", refused.join(", ")));
                }
                let mut r = rate_limited(&msg, *retry_after_ms);
                if let Some(limit) = limit {
                    unified_headers(r.headers_mut(), limit);
                }
                r
            }
            Verdict::AuthRefused { refused, failing } => {
                let mut msg = format!(
                    "poolgate: every upstream account was refused its credential: re-authenticate account {}",
                    refused.join(", ")
                );
                if !failing.is_empty() {
                    msg.push_str(&format!(" (account {} failing upstream)", failing.join(", ")));
                }
                error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, &msg)
            }
            Verdict::UpstreamFailed { failed } => {
                let mut msg = format!("poolgate: every upstream attempt failed: {}", failed.join(", "));
                if let Some(why) = last_why {
                    msg.push_str(&format!("; last: {why}"));
                }
                error(StatusCode::BAD_GATEWAY, ErrorType::Api, &msg)
            }
            Verdict::UpstreamCooling { cooling, retry_after_ms } => {
                let msg = format!(
                    "poolgate: every upstream account is cooling down after upstream failures ({}); retry after the time given",
                    cooling.join(", ")
                );
                let mut r = error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, &msg);
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_ms.div_ceil(1000).max(1)));
                r
            }
            Verdict::NoAccount => error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorType::Overloaded,
                "poolgate: no account could take the request",
            ),
        };
        r.headers_mut().insert("x-poolgate-pool", HeaderValue::from_static(self.ending().as_str()));
        r
    }
}

/// The `anthropic-ratelimit-unified-*` headers of a pool out of plan quota:
/// `rejected`, the soonest reset (epoch seconds) and the window that binds,
/// so that Claude Code shows the limit and when it lifts as it would for one
/// account.
fn unified_headers(h: &mut http::HeaderMap, limit: &PoolLimit) {
    h.insert("anthropic-ratelimit-unified-status", HeaderValue::from_static("rejected"));
    h.insert("anthropic-ratelimit-unified-reset", HeaderValue::from(limit.reset_ms.div_ceil(1000)));
    if !limit.claim.is_empty() {
        h.insert("anthropic-ratelimit-unified-representative-claim", HeaderValue::from_static(limit.claim));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000;

    fn b(account: &str, cause: Cause, until_ms: Option<u64>) -> Blocked {
        Blocked { account: account.into(), cause, detail: "x".into(), until_ms, plan_limit: None }
    }

    #[test]
    fn quota_wins_then_auth_then_upstream() {
        let quota = b("q", Cause::Quota, Some(NOW + 60_000));
        let auth = b("a", Cause::Auth, Some(NOW + 1_000));
        let down = b("d", Cause::Upstream, Some(NOW + 5_000));
        let v = verdict(&[auth.clone(), quota, down.clone()], false, false, NOW);
        // The soonest recovery among accounts that recover by themselves: not
        // the refused one, whose retry would be refused again.
        assert_eq!(v, Verdict::Parked { retry_after_ms: 5_000, refused: vec!["`a`".into()], limit: None });
        let v = verdict(&[down.clone(), auth], false, true, NOW);
        assert_eq!(v, Verdict::AuthRefused { refused: vec!["`a`".into()], failing: vec!["`d`".into()] });
        assert_eq!(verdict(std::slice::from_ref(&down), false, false, NOW).ending(), Ending::UpstreamCooling);
        assert_eq!(verdict(&[down], false, true, NOW).ending(), Ending::UpstreamFailed);
        assert_eq!(verdict(&[], false, false, NOW), Verdict::NoAccount);
    }

    #[test]
    fn an_account_still_usable_means_retry_at_once() {
        let v = verdict(&[b("q", Cause::Quota, Some(NOW + 60_000))], true, true, NOW);
        assert_eq!(v, Verdict::Parked { retry_after_ms: 0, refused: vec![], limit: None });
    }

    #[test]
    fn a_pool_out_of_plan_quota_says_so_in_the_unified_headers() {
        let spent = |account: &str, until: u64, window: &'static str| Blocked {
            plan_limit: Some(window),
            ..b(account, Cause::Quota, Some(NOW + until))
        };
        // Both spent: the soonest reset and its window.
        let v = verdict(&[spent("w", 90_000, "seven_day"), spent("s", 60_000, "five_hour")], false, true, NOW);
        let limit = PoolLimit { reset_ms: NOW + 60_000, claim: "five_hour" };
        assert_eq!(v, Verdict::Parked { retry_after_ms: 60_000, refused: vec![], limit: Some(limit) });
        let r = v.response(None);
        let h = |n: &str| r.headers().get(n).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(h("anthropic-ratelimit-unified-status").as_deref(), Some("rejected"));
        assert_eq!(h("anthropic-ratelimit-unified-reset"), Some((NOW + 60_000).div_ceil(1000).to_string()));
        assert_eq!(h("anthropic-ratelimit-unified-representative-claim").as_deref(), Some("five_hour"));
        assert_eq!(h("retry-after").as_deref(), Some("60"));
        // A burst limit (or an outage) recovers first: a throttle, no unified headers.
        let burst = b("t", Cause::Quota, Some(NOW + 5_000));
        let v = verdict(&[spent("w", 90_000, "seven_day"), burst], false, true, NOW);
        assert!(v.response(None).headers().get("anthropic-ratelimit-unified-status").is_none());
        // An account still usable: retry at once, no plan limit.
        assert!(matches!(
            verdict(&[spent("w", 90_000, "seven_day")], true, true, NOW),
            Verdict::Parked { limit: None, .. }
        ));
    }

    #[test]
    fn every_cooldown_reason_has_a_cause() {
        assert_eq!(cooling_cause(CooldownReason::Transient), Cause::Quota);
        assert_eq!(cooling_cause(CooldownReason::Auth), Cause::Auth);
        assert_eq!(cooling_cause(CooldownReason::Overloaded), Cause::Upstream);
        assert_eq!(attempt_cause(Some(403)), Cause::Auth);
        assert_eq!(attempt_cause(Some(529)), Cause::Upstream);
        assert_eq!(attempt_cause(None), Cause::Upstream);
    }
}

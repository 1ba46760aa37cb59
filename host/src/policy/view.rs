//! What a plugin sees of the pool: the account model ([`crate::account`]) turned
//! into the records of `wit/policy.wit`, here and nowhere else.
//!
//! The conversion applies the rules every ranker relies on:
//! - a window whose reset has passed reads as fresh: 0 used, `allowed`
//!   (neurolink's reset-freshening; dario v6.0.46), and so does an account-level
//!   `rejected` whose reset has passed — so a stale reading never strands a seat;
//! - `usable` = not cooling, not disabled, and not gated for the request's model
//!   family, unless the snapshot overrides it; a model gate shows as a cooldown
//!   for that request only;
//! - `quota-freshness` follows the newest reading against `freshness_ms`.

use std::borrow::Borrow;

use super::bindings as wit;
use super::chain::Candidates;
use super::names;
use crate::account::{AccountSnapshot, Cooldown, CooldownReason, Status, WindowReading};

/// The candidates of a request for model `family` at `now`: each account with
/// its pool index, in pool order.
pub fn candidates<A: Borrow<AccountSnapshot>>(
    accounts: impl IntoIterator<Item = (u32, A)>,
    family: Option<&str>,
    now: u64,
    freshness_ms: u64,
) -> Candidates {
    let mut windows = Vec::new();
    let accounts = accounts
        .into_iter()
        .map(|(i, a)| {
            let a = a.borrow();
            account(a, &a.windows, i, family, now, freshness_ms, &mut windows)
        })
        .collect();
    Candidates { accounts, windows }
}

/// The pool entry `configure` receives for an account.
pub fn pool_entry(id: &str, alias: &str, primary: bool) -> wit::AccountInfo {
    wit::AccountInfo { id: id.to_string(), alias: alias.to_string(), primary }
}

/// The record of pool index `index`, as a request for `family` at `now` sees
/// it; the account's windows (`readings`: the snapshot's own windows are not
/// read) are appended to `windows`.
pub fn account<'r>(
    a: &AccountSnapshot,
    readings: impl IntoIterator<Item = &'r WindowReading>,
    index: u32,
    family: Option<&str>,
    now: u64,
    freshness_ms: u64,
    windows: &mut Vec<wit::QuotaWindow>,
) -> wit::Account {
    let mut newest: Option<u64> = None;
    for w in readings {
        let observed = w.observed_at_ms.unwrap_or(now);
        newest = Some(newest.map_or(observed, |n: u64| n.max(observed)));
        let rolled_over = w.resets_at_ms.is_some_and(|r| r <= now);
        windows.push(wit::QuotaWindow {
            account: index,
            kind: window_kind(&w.name),
            name: names::intern(&w.name),
            utilization: if rolled_over { 0.0 } else { w.utilization },
            resets_at_ms: w.resets_at_ms,
            status: if rolled_over { wit::WindowStatus::Allowed } else { status(w.status) },
            observed_at_ms: observed,
        });
    }
    let top = match a.resets_at_ms {
        Some(r) if r <= now && a.status == Status::Rejected => Status::Allowed,
        _ => a.status,
    };
    let cooling = a.active_cooldown(now).or_else(|| {
        a.active_gate(family, now).map(|g| Cooldown { until_ms: g.until_ms, reason: CooldownReason::ModelExhausted })
    });
    wit::Account {
        id: index,
        primary: a.primary,
        usable: a.usable(family, now),
        cooldown: cooling.map(|c| wit::Cooldown { until_ms: c.until_ms, reason: reason(c.reason) }),
        in_flight: a.in_flight,
        max_in_flight: a.max_in_flight,
        status: status(top),
        resets_at_ms: a.resets_at_ms,
        quota_freshness: match newest {
            None => wit::Freshness::Unknown,
            Some(t) if now.saturating_sub(t) <= freshness_ms => wit::Freshness::Fresh,
            Some(_) => wit::Freshness::Stale,
        },
    }
}

fn status(s: Status) -> wit::WindowStatus {
    match s {
        Status::Allowed => wit::WindowStatus::Allowed,
        Status::AllowedWarning => wit::WindowStatus::AllowedWarning,
        Status::Rejected => wit::WindowStatus::Rejected,
        Status::Unknown => wit::WindowStatus::Unknown,
    }
}

fn reason(r: CooldownReason) -> wit::CooldownReason {
    use wit::CooldownReason as W;
    match r {
        CooldownReason::WeeklyExhausted => W::WeeklyExhausted,
        CooldownReason::SessionExhausted => W::SessionExhausted,
        CooldownReason::ModelExhausted => W::ModelExhausted,
        CooldownReason::UnifiedRejected => W::UnifiedRejected,
        CooldownReason::Transient => W::Transient,
        CooldownReason::Overloaded => W::Overloaded,
        CooldownReason::UpstreamError => W::UpstreamError,
        CooldownReason::Auth => W::Auth,
        // The WIT has no reason of its own for it (0.1.x cannot grow the
        // enum): an account resting on the overage guard reads as refused
        // by its unified status, which is what it would be without overage.
        CooldownReason::Overage => W::UnifiedRejected,
        CooldownReason::Disabled => W::Disabled,
    }
}

/// The kind of a window by its name.
pub fn window_kind(name: &str) -> wit::WindowKind {
    use wit::WindowKind as K;
    match name {
        "5h" => K::FiveHour,
        "7d" => K::SevenDay,
        "overage" => K::Overage,
        "requests" => K::Requests,
        "tokens" | "input_tokens" | "output_tokens" | "input-tokens" | "output-tokens" => K::Tokens,
        n if n.starts_with("7d_") => K::SevenDayModel,
        _ => K::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{DEFAULT_FRESHNESS_MS, ModelGate, WindowReading};

    fn window(name: &str, u: f64, reset: Option<u64>, status: Status) -> WindowReading {
        WindowReading { name: name.into(), utilization: u, resets_at_ms: reset, status, observed_at_ms: Some(0) }
    }

    fn one(a: &AccountSnapshot, family: Option<&str>, now: u64, freshness: u64) -> Candidates {
        candidates([(0, a)], family, now, freshness)
    }

    #[test]
    fn a_window_past_its_reset_reads_fresh() {
        let a = AccountSnapshot {
            id: "a".into(),
            windows: vec![
                window("5h", 1.02, Some(100), Status::Rejected),
                window("7d", 0.5, Some(10_000), Status::Allowed),
            ],
            status: Status::Rejected,
            resets_at_ms: Some(100),
            ..Default::default()
        };
        let c = one(&a, None, 100, DEFAULT_FRESHNESS_MS);
        assert_eq!(c.windows[0].utilization, 0.0);
        assert_eq!(c.windows[0].status, wit::WindowStatus::Allowed);
        assert_eq!(c.windows[1].utilization, 0.5);
        assert_eq!(c.accounts[0].status, wit::WindowStatus::Allowed);
        let before = one(&a, None, 99, DEFAULT_FRESHNESS_MS);
        assert_eq!(before.windows[0].utilization, 1.02);
        assert_eq!(before.accounts[0].status, wit::WindowStatus::Rejected);
    }

    #[test]
    fn a_model_gate_is_a_cooldown_for_its_family_only() {
        let a = AccountSnapshot {
            id: "a".into(),
            model_gates: vec![ModelGate { family: "fable".into(), until_ms: 1000 }],
            ..Default::default()
        };
        let gated = one(&a, Some("fable"), 500, DEFAULT_FRESHNESS_MS);
        assert_eq!(gated.accounts[0].cooldown.map(|c| c.reason), Some(wit::CooldownReason::ModelExhausted));
        assert!(!gated.accounts[0].usable);
        assert!(one(&a, Some("opus"), 500, DEFAULT_FRESHNESS_MS).accounts[0].usable);
    }

    #[test]
    fn freshness_follows_the_newest_reading() {
        let mut a = AccountSnapshot { id: "a".into(), ..Default::default() };
        let fresh = |a: &AccountSnapshot, now| one(a, None, now, 1000).accounts[0].quota_freshness;
        assert_eq!(fresh(&a, 0), wit::Freshness::Unknown);
        a.windows.push(window("5h", 0.1, None, Status::Allowed));
        assert_eq!(fresh(&a, 1000), wit::Freshness::Fresh);
        assert_eq!(fresh(&a, 1001), wit::Freshness::Stale);
    }

    #[test]
    fn window_kinds_by_name() {
        assert_eq!(window_kind("7d_oi"), wit::WindowKind::SevenDayModel);
        assert_eq!(window_kind("5h"), wit::WindowKind::FiveHour);
        assert_eq!(window_kind("weird"), wit::WindowKind::Other);
    }
}

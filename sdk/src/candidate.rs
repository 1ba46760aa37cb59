//! One candidate as a ranker reads it: the account record, its quota windows, and
//! its pool entry — plus the reads every ranker needs.

use std::ops::Deref;

use crate::quota::{Exhaustion, exhaustion, is_fresh, used};
use crate::{Account, AccountInfo, Freshness, QuotaWindow, WindowKind, WindowStatus};

/// A candidate account with its windows. Dereferences to the [`Account`] record.
#[derive(Clone, Copy)]
pub struct Candidate<'c> {
    /// Its position in the list this stage received (what a ranking refers to).
    pub position: u32,
    /// The account record.
    pub account: &'c Account,
    /// Its quota windows.
    pub windows: &'c [QuotaWindow],
    /// Its pool entry (string id, alias).
    pub info: &'c AccountInfo,
    /// How old a reading may be and still count as fresh, ms (the pool's,
    /// [`crate::Pool::freshness_ms`]).
    pub freshness_ms: u64,
}

impl Deref for Candidate<'_> {
    type Target = Account;
    fn deref(&self) -> &Account {
        self.account
    }
}

impl<'c> Candidate<'c> {
    /// The first window of `kind`, if the account reported one.
    pub fn window(&self, kind: WindowKind) -> Option<&'c QuotaWindow> {
        self.windows.iter().find(|w| w.kind == kind)
    }

    /// The window with the full name `name` ("5h", "7d_oi", ...).
    pub fn window_named(&self, name: &str) -> Option<&'c QuotaWindow> {
        self.windows.iter().find(|w| crate::host::window_name(w.name) == name)
    }

    /// The utilization of the first window of `kind` (fraction, may exceed 1.0).
    pub fn utilization(&self, kind: WindowKind) -> Option<f64> {
        self.window(kind).map(|w| w.utilization)
    }

    /// Five-hour (session) utilization, if known.
    pub fn session_used(&self) -> Option<f64> {
        self.utilization(WindowKind::FiveHour)
    }

    /// Seven-day (weekly) utilization, if known.
    pub fn weekly_used(&self) -> Option<f64> {
        self.utilization(WindowKind::SevenDay)
    }

    /// `1 − max(5h, 7d, requests, tokens)` used (as [`crate::quota::used`]
    /// reads a window: a `rejected` one is all used): the subscription
    /// windows, and an API key's per-minute `requests` and token limits (its
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`
    /// headers), so a key near its per-minute limit ranks accordingly. Every
    /// reading counts, stale ones at their last value (see [`crate::quota`]);
    /// an unreported window counts as unused, so an account that never
    /// reported quota has headroom 1.0.
    pub fn headroom(&self) -> f64 {
        let most = self.windows.iter().filter(|w| Self::account_wide(w.kind)).fold(0.0f64, |m, w| m.max(used(w)));
        1.0 - most
    }

    /// Whether windows of `kind` bind every model of the account: 5h, 7d, and
    /// an API key's per-minute limits (not per-model buckets, not overage).
    fn account_wide(kind: WindowKind) -> bool {
        matches!(kind, WindowKind::FiveHour | WindowKind::SevenDay | WindowKind::Requests | WindowKind::Tokens)
    }

    /// The per-model (`7d_<bucket>`) windows with their bucket names (`"oi"`,
    /// `"opus"`, ...).
    pub fn model_windows(&self) -> impl Iterator<Item = (&'static str, &'c QuotaWindow)> {
        self.windows.iter().filter(|w| w.kind == WindowKind::SevenDayModel).map(|w| {
            let name = crate::host::window_name(w.name);
            (name.strip_prefix("7d_").unwrap_or(name), w)
        })
    }

    /// Whether the host would send the request to this account now.
    pub fn is_usable(&self) -> bool {
        self.account.usable
    }

    /// What window `w` says at `now_ms` (see [`crate::quota`]), if its reading
    /// is fresh; a stale reading excludes nothing ([`Exhaustion::Open`]),
    /// though it still orders.
    pub fn window_exhaustion(&self, w: &QuotaWindow, now_ms: u64) -> Exhaustion {
        if !is_fresh(w.observed_at_ms, now_ms, self.freshness_ms) {
            return Exhaustion::Open;
        }
        exhaustion(w.status == WindowStatus::Rejected, w.utilization, w.resets_at_ms, now_ms)
    }

    /// What says the account is exhausted for every model at `now_ms`, and
    /// until when: a fresh top-level `rejected` with a reset ahead
    /// (`"unified"`), or a fresh 5h, 7d, or API-key `requests`/tokens window
    /// exhausted (its name). Per-model buckets are for
    /// [`crate::Buckets::exhausted`], which knows the family.
    pub fn exhausted(&self, now_ms: u64) -> Option<(&'static str, u64)> {
        if self.quota_freshness == Freshness::Fresh
            && let Some(until) =
                exhaustion(self.status == WindowStatus::Rejected, 0.0, self.resets_at_ms, now_ms).until()
        {
            return Some(("unified", until));
        }
        self.windows
            .iter()
            .filter(|w| Self::account_wide(w.kind))
            .find_map(|w| self.window_exhaustion(w, now_ms).until().map(|t| (crate::host::window_name(w.name), t)))
    }

    /// Whether [`Candidate::exhausted`] says anything at `now_ms`.
    pub fn is_exhausted(&self, now_ms: u64) -> bool {
        self.exhausted(now_ms).is_some()
    }

    /// The cooldown's end, if cooling.
    pub fn cooling_until(&self) -> Option<u64> {
        self.account.cooldown.map(|c| c.until_ms)
    }
}

//! Per-model weekly buckets (`7d_<bucket>`) and the model family each one binds.
//!
//! The upstream names a bucket after a model family (`7d_opus`, `7d_sonnet`) or
//! after something else entirely (`7d_oi`, the included-overage credit that binds
//! Fable, per dario #1264). Buckets are found generically by name; this map says
//! which family a bucket whose name is not a family belongs to.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::quota::{says_used_up, used};
use crate::{Candidate, QuotaWindow};

/// Which model family each per-model bucket binds. A bucket not in the map binds
/// the family of its own name (`7d_opus` → `opus`).
#[derive(Debug, Clone)]
pub struct Buckets {
    /// bucket → family, lowercase. A handful of entries: a list beats a hash map.
    map: Vec<(String, String)>,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets { map: vec![("oi".into(), "fable".into())] }
    }
}

impl Buckets {
    /// The default map (`oi → fable`) with `extra` bindings merged over it; names
    /// are compared case-insensitively.
    pub fn new(extra: HashMap<String, String>) -> Self {
        let mut map: Vec<(String, String)> =
            extra.into_iter().map(|(b, f)| (b.to_ascii_lowercase(), f.to_ascii_lowercase())).collect();
        // A HashMap's order is random; sort so that nothing downstream depends on it.
        map.sort();
        for (b, f) in Buckets::default().map {
            if !map.iter().any(|(have, _)| *have == b) {
                map.push((b, f));
            }
        }
        Buckets { map }
    }

    /// The family `bucket` binds.
    pub fn family<'b>(&'b self, bucket: &'b str) -> &'b str {
        self.map.iter().find(|(b, _)| b.eq_ignore_ascii_case(bucket)).map_or(bucket, |(_, f)| f.as_str())
    }

    /// The windows of `account` that bind model `family`, fresh or not.
    pub fn windows_for<'c>(&self, account: &Candidate<'c>, family: &str) -> impl Iterator<Item = &'c QuotaWindow> {
        account
            .model_windows()
            .filter(move |(bucket, _)| self.family(bucket).eq_ignore_ascii_case(family))
            .map(|(_, w)| w)
    }

    /// The bucket that binds `family` on `account` at `now_ms`, for ordering:
    /// of every window bound to the family, stale ones included (see
    /// [`crate::quota`]), the one that constrains it most — by
    /// `binds_harder`, a function of the readings alone, so the order the
    /// upstream listed them in never matters.
    pub fn binding<'c>(&self, account: &Candidate<'c>, family: &str, now_ms: u64) -> Option<&'c QuotaWindow> {
        self.binding_among(account, family, now_ms, |_| true)
    }

    /// As [`Buckets::binding`], among the windows `keep` accepts (a ranker
    /// that reads only some readings, as the neurolink ladder reads only
    /// windows whose reset is ahead).
    pub fn binding_among<'c>(
        &self,
        account: &Candidate<'c>,
        family: &str,
        now_ms: u64,
        keep: impl Fn(&QuotaWindow) -> bool,
    ) -> Option<&'c QuotaWindow> {
        self.windows_for(account, family).filter(|w| keep(w)).max_by(|a, b| binds_harder(a, b, now_ms))
    }

    /// What says `account` cannot serve a request of model `family` at
    /// `now_ms`, and until when: the account-wide reasons of
    /// [`Candidate::exhausted`], or a bucket bound to the family that is
    /// exhausted by a fresh reading (by the one definition of
    /// [`crate::quota`]) — of several, the one that keeps the family
    /// unavailable longest.
    pub fn exhausted(&self, account: &Candidate, family: Option<&str>, now_ms: u64) -> Option<(&'static str, u64)> {
        if let Some(found) = account.exhausted(now_ms) {
            return Some(found);
        }
        self.windows_for(account, family?)
            .filter_map(|w| Some((crate::host::window_name(w.name), account.window_exhaustion(w, now_ms).until()?)))
            .max_by(|(an, at), (bn, bt)| at.cmp(bt).then_with(|| bn.cmp(an)))
    }

    /// dario's headroom for a request of model `family` at `now_ms`:
    /// `1 − max(5h, 7d, every bucket bound to the family)`, each as
    /// [`crate::quota::used`] reads it (a `rejected` window is all used). A
    /// bucket counts once the account has reported it, at its last reading
    /// until its window resets (the host reads one whose reset has passed as
    /// unused); an unreported window counts as unused. The most used bucket,
    /// not the binding one: between spent buckets the binding one is the one
    /// that lasts longest (see `binds_harder`), and a spent bucket with a
    /// later reset at 100% must not lift headroom above a 102% one's.
    pub fn headroom(&self, account: &Candidate, family: Option<&str>, now_ms: u64) -> f64 {
        let h = account.headroom();
        let Some(family) = family else { return h };
        // The host reads a window whose reset has passed as unused; so does a
        // hand-built input here.
        let live = |w: &&QuotaWindow| w.resets_at_ms.is_none_or(|r| r > now_ms);
        self.windows_for(account, family).filter(live).fold(h, |h, w| h.min(1.0 - used(w)))
    }
}

/// Whether window `a` constrains a family harder than `b` at `now_ms`
/// (`Greater`: it does), by content alone:
///
/// 1. A window that says used up ([`says_used_up`]: `rejected`, or 100%)
///    binds before one that does not, whatever its number: a rejected bucket
///    at 20% is spent, a 90% one is not.
/// 2. Between used-up windows, the one that keeps the family unavailable
///    longest: a known reset still ahead beats an unknown one (a known reset
///    is evidence of how long; an unknown one is none, and a filter fails open
///    on it), and of two known, the later.
/// 3. Then the most used ([`used`]).
/// 4. Then the later reset (a known one before an unknown one): it holds the
///    family longer at that level.
/// 5. Then the newer reading, then the name: two windows that still tie say
///    the same, and either may bind; the choice is still the same in any order.
pub fn binds_harder(a: &QuotaWindow, b: &QuotaWindow, now_ms: u64) -> Ordering {
    let ahead = |w: &QuotaWindow| w.resets_at_ms.filter(|&r| r > now_ms);
    let (a_up, b_up) = (says_used_up(a), says_used_up(b));
    a_up.cmp(&b_up)
        .then_with(|| match (a_up && b_up, ahead(a), ahead(b)) {
            (true, x, y) => x.is_some().cmp(&y.is_some()).then(x.cmp(&y)),
            (false, ..) => Ordering::Equal,
        })
        .then_with(|| used(a).total_cmp(&used(b)))
        .then_with(|| a.resets_at_ms.is_some().cmp(&b.resets_at_ms.is_some()).then(a.resets_at_ms.cmp(&b.resets_at_ms)))
        .then_with(|| a.observed_at_ms.cmp(&b.observed_at_ms))
        .then_with(|| crate::host::window_name(b.name).cmp(crate::host::window_name(a.name)))
}

//! Per-model weekly buckets (`7d_<bucket>`) and the model family each one binds.
//!
//! The upstream names a bucket after a model family (`7d_opus`, `7d_sonnet`) or
//! after something else entirely (`7d_oi`, the included-overage credit that binds
//! Fable, per dario #1264). Buckets are found generically by name; this map says
//! which family a bucket whose name is not a family belongs to.

use std::collections::HashMap;

use crate::quota::{DEFAULT_FRESHNESS_MS, is_fresh};
use crate::{Candidate, QuotaWindow, WindowStatus};

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

    /// The bucket that binds `family` on `account` at `now_ms`: of the fresh
    /// windows bound to the family, the most used (a `rejected` one counts as
    /// at least 100% used). Every bound bucket counts, so a spent `7d_oi` is
    /// not hidden behind a 30% `7d_fable` listed first; a stale one counts for
    /// nothing (see [`crate::quota`]).
    pub fn binding<'c>(&self, account: &Candidate<'c>, family: &str, now_ms: u64) -> Option<&'c QuotaWindow> {
        let used = |w: &QuotaWindow| {
            let u = if w.utilization.is_finite() { w.utilization } else { 0.0 };
            if w.status == WindowStatus::Rejected { u.max(1.0) } else { u }
        };
        self.windows_for(account, family).filter(|w| is_fresh(w.observed_at_ms, now_ms, DEFAULT_FRESHNESS_MS)).fold(
            None::<&QuotaWindow>,
            |best, w| match best {
                Some(b) if used(b) >= used(w) => Some(b),
                _ => Some(w),
            },
        )
    }

    /// What says `account` cannot serve a request of model `family` at
    /// `now_ms`, and until when: the account-wide reasons of
    /// [`Candidate::exhausted`], or an exhausted bucket bound to the family (by
    /// the one definition of [`crate::quota`]).
    pub fn exhausted(&self, account: &Candidate, family: Option<&str>, now_ms: u64) -> Option<(&'static str, u64)> {
        if let Some(found) = account.exhausted(now_ms) {
            return Some(found);
        }
        let w = self.binding(account, family?, now_ms)?;
        let until = account.window_exhaustion(w, now_ms).until()?;
        Some((crate::host::window_name(w.name), until))
    }

    /// dario's headroom for a request of model `family` at `now_ms`:
    /// `1 − max(5h, 7d, the bucket that binds the family)`. A bucket counts only
    /// once the account has reported it, and only while that reading is fresh;
    /// an unreported window counts as unused.
    pub fn headroom(&self, account: &Candidate, family: Option<&str>, now_ms: u64) -> f64 {
        let h = account.headroom();
        match family.and_then(|f| self.binding(account, f, now_ms)) {
            Some(w) if w.utilization.is_finite() => h.min(1.0 - w.utilization),
            _ => h,
        }
    }
}

//! Per-model weekly buckets (`7d_<bucket>`) and the model family each one binds.
//!
//! The upstream names a bucket after a model family (`7d_opus`, `7d_sonnet`) or
//! after something else entirely (`7d_oi`, the included-overage credit that binds
//! Fable, per dario #1264). Buckets are found generically by name; this map says
//! which family a bucket whose name is not a family belongs to.

use std::collections::HashMap;

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

    /// The windows of `account` that bind model `family`.
    pub fn windows_for<'c>(&self, account: &Candidate<'c>, family: &str) -> impl Iterator<Item = &'c QuotaWindow> {
        account
            .model_windows()
            .filter(move |(bucket, _)| self.family(bucket).eq_ignore_ascii_case(family))
            .map(|(_, w)| w)
    }

    /// dario's headroom for a request of model `family`:
    /// `1 − max(5h, 7d, every bucket bound to the family)`. A bucket counts only
    /// once the account has reported it; an unreported window counts as unused.
    pub fn headroom(&self, account: &Candidate, family: Option<&str>) -> f64 {
        let mut h = account.headroom();
        if let Some(family) = family {
            for w in self.windows_for(account, family) {
                h = h.min(1.0 - w.utilization);
            }
        }
        h
    }
}

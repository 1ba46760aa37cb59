//! `builtin:expiry-first` — neurolink's default quota ranking: spend the
//! soonest-expiring weekly allowance first.
//!
//! Ladder (the first rung that tells two accounts apart decides, and names the
//! reason): availability → quota evidence (fresh and stale-known, then
//! refresh-due, then unknown) → session soft-limit saturation → per-model
//! saturation → soonest weekly reset → soonest session-reset bucket (for two
//! saturated accounts the session bucket comes first) → per-model utilization →
//! weekly utilization (higher first) → configured primary → pool index. Two
//! unusable accounts compare by the sooner cooldown end. The rungs live in the
//! SDK (`poolgate_sdk::metrics`) because the precedence modifiers must judge
//! usability and saturation exactly as this ranking does.

use std::collections::HashMap;

use poolgate_sdk::metrics::{compare_expiry_first, rank_by};
use poolgate_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// 5h utilization at or above which an account is demoted, in (0, 1].
    session_soft_limit: Option<f64>,
    /// Session resets in the same bucket of this width count as equal, ms.
    session_reset_tolerance_ms: Option<u64>,
    /// Extra bucket → model family bindings, merged over the default `oi → fable`.
    #[serde(default)]
    buckets: HashMap<String, String>,
}

/// The expiry-first ranker.
pub struct ExpiryFirst {
    ladder: Ladder,
}

impl Ranker for ExpiryFirst {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let o: Options = config.parse_into()?;
        Ok(ExpiryFirst { ladder: Ladder::new(o.session_soft_limit, o.session_reset_tolerance_ms, o.buckets)? })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let metrics = self.ladder.metrics(req, candidates);
        Ok(rank_by(candidates, &metrics, compare_expiry_first))
    }
}

poolgate_sdk::export_ranker!(ExpiryFirst);

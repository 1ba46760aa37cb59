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

use poolgate_sdk::metrics::{compare_expiry_first, rank_by};
use poolgate_sdk::prelude::*;

/// The expiry-first ranker.
pub struct ExpiryFirst {
    ladder: Ladder,
}

impl Ranker for ExpiryFirst {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        let ladder = Ladder::new(
            // 5h utilization at or above which an account is demoted, in (0, 1].
            o.f64("session_soft_limit")?,
            // Session resets in the same bucket of this width count as equal, ms.
            o.u64("session_reset_tolerance_ms")?,
            // Extra bucket → model family bindings, merged over the default `oi → fable`.
            o.string_map("buckets")?.unwrap_or_default(),
        )?;
        o.done()?;
        Ok(ExpiryFirst { ladder })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let metrics = self.ladder.metrics(req, candidates);
        Ok(rank_by(candidates, &metrics, compare_expiry_first))
    }
}

poolgate_sdk::export_ranker!(ExpiryFirst);

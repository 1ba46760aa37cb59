//! `builtin:headroom-first` — neurolink's `headroom-first` ranking: the account
//! with the most room in both its session and its week first.
//!
//! Ladder: availability → quota evidence → session soft-limit saturation →
//! per-model saturation → highest `min(1 − session used, 1 − weekly used)`
//! (unknown headroom last) → soonest weekly reset → configured primary → pool
//! index; two unusable accounts compare by the sooner cooldown end. Windows whose
//! reset is unknown or has passed read as unused (neurolink's reset-freshening).
//!
//! Unlike dario's `headroom`, the per-model bucket is not part of the headroom:
//! it only demotes an account once it reaches the soft limit (`scoped_headroom`).

use poolgate_sdk::metrics::{compare_headroom_first, rank_by};
use poolgate_sdk::prelude::*;

/// The headroom-first ranker.
pub struct HeadroomFirst {
    ladder: Ladder,
}

impl Ranker for HeadroomFirst {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        // 5h utilization at or above which an account is demoted, in (0, 1], and
        // extra bucket → model family bindings, merged over the default `oi → fable`.
        let ladder = Ladder::new(o.f64("session_soft_limit")?, None, o.string_map("buckets")?.unwrap_or_default())?;
        o.done()?;
        Ok(HeadroomFirst { ladder })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let metrics = self.ladder.metrics(req, candidates);
        Ok(rank_by(candidates, &metrics, compare_headroom_first))
    }
}

poolgate_sdk::export_ranker!(HeadroomFirst);

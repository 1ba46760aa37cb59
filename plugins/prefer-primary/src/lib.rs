//! `builtin:prefer-primary` — neurolink's `prefer-primary`: the operator's primary
//! account goes first while it is usable and not saturated.
//!
//! Without this stage the primary is only a ranking's final tie-break
//! (`configured_primary`), which in neurolink's telemetry decided 0 of 37k
//! requests. When an earlier stage bound the request to its session
//! (`session_affinity`), the binding keeps the head and the primary goes second:
//! neurolink's precedence `[bound, primary, …rest]`, whichever of the two stages
//! runs first.

use poolgate_sdk::prelude::*;

/// The prefer-primary modifier.
pub struct PreferPrimary {
    ladder: Ladder,
}

impl Ranker for PreferPrimary {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        // 5h utilization at or above which the primary is saturated, in (0, 1], and
        // extra bucket → model family bindings, merged over the default `oi → fable`.
        let ladder = Ladder::new(o.f64("session_soft_limit")?, None, o.string_map("buckets")?.unwrap_or_default())?;
        o.done()?;
        Ok(PreferPrimary { ladder })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        // Several accounts marked primary: the first in configuration order.
        let Some(primary) = candidates.iter().filter(|c| c.primary).min_by_key(|c| c.id) else {
            return Ok(candidates.unchanged("").with_detail("prefer-primary skipped: no primary among the candidates"));
        };
        let metrics = self.ladder.metrics_of(&primary, model_family(&req.model), req.now_ms);
        if let Some(why) = metrics.precedence_skip() {
            return Ok(candidates.unchanged("").with_detail(format!("prefer-primary skipped: {why}")));
        }
        if req.decided_by.as_deref() != Some("session_affinity") {
            return Ok(candidates.with_front(primary.position, "preferred_primary"));
        }
        if primary.position == 0 {
            return Ok(candidates.unchanged("").with_detail("the primary is the session's bound account"));
        }
        let mut order = vec![0, primary.position];
        order.extend((1..candidates.len() as u32).filter(|&i| i != primary.position));
        Ok(Ranking::new(order, "").with_detail("primary placed behind the session binding"))
    }
}

poolgate_sdk::export_ranker!(PreferPrimary);

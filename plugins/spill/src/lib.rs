//! `builtin:spill` — neurolink's `spill-inflight`: spread a burst of new
//! conversations instead of stacking them on one account.
//!
//! If the head already has `spill_inflight` or more requests in flight, the first
//! account after it that is usable, not saturated and below that count moves to
//! the front (the old head goes second). 0 turns it off. A request whose head was
//! decided by `session_affinity` or `preferred_primary` is left alone: spill never
//! splits a bound session or overrides the operator's primary. The spill target
//! may itself be at its `max_in_flight`; admission is the host's gate, which then
//! moves on to the next account.

use poolgate_sdk::prelude::*;

/// Reasons that mean the head is pinned on purpose.
const PINNED: [&str; 2] = ["session_affinity", "preferred_primary"];

/// The spill modifier.
pub struct Spill {
    threshold: u32,
    ladder: Ladder,
}

impl Ranker for Spill {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        // In-flight count at which the head spills (0 = off).
        let threshold = check_range("spill_inflight", o.u32("spill_inflight")?.unwrap_or(0), 0, 100)?;
        // 5h utilization at or above which a target is saturated, in (0, 1], and
        // extra bucket → model family bindings, merged over the default `oi → fable`.
        let ladder = Ladder::new(o.f64("session_soft_limit")?, None, o.string_map("buckets")?.unwrap_or_default())?;
        o.done()?;
        Ok(Spill { threshold, ladder })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let n = self.threshold;
        if n == 0 || candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        if let Some(by) = req.decided_by.as_deref().filter(|r| PINNED.contains(r)) {
            return Ok(candidates.unchanged("").with_detail(format!("spill skipped: the head is pinned by {by}")));
        }
        let head = candidates.get(0);
        if head.in_flight < n {
            return Ok(candidates.unchanged(""));
        }
        let family = model_family(&req.model);
        let target = candidates
            .iter()
            .skip(1)
            .find(|c| c.in_flight < n && self.ladder.metrics_of(c, family, req.now_ms).precedence_skip().is_none());
        let Some(target) = target else {
            return Ok(candidates
                .unchanged("")
                .with_detail(format!("spill skipped: no eligible account below {n} in flight")));
        };
        let mut order = vec![target.position, 0];
        order.extend((1..candidates.len() as u32).filter(|&i| i != target.position));
        let detail = format!(
            "spilled from `{}` ({} in flight, threshold {n}) to `{}`",
            head.info.id, head.in_flight, target.info.id
        );
        Ok(Ranking::new(order, "spill_inflight").with_detail(detail))
    }
}

poolgate_sdk::export_ranker!(Spill);

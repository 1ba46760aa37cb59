//! `builtin:skip-exhausted` — drop the accounts whose quota already says they will
//! refuse, so no request (and no failover attempt) is spent on a doomed probe.
//!
//! An account is dropped only on evidence strong enough to act on: a fresh reading
//! in which the 5h window, the 7d window, the bucket that binds the request's
//! model family or the unified status is exhausted (`rejected`, or used ≥ 100%)
//! until a reset that is still in the future — the SDK's one definition
//! (`poolgate_sdk::quota`, `Buckets::exhausted`), which the ladders and the
//! host's cooldowns share. Freshness is per window. Everything weaker fails open — no reading, a stale one, a
//! window whose reset is unknown or has passed, a utilization that is not a
//! number — because a wrong "exhausted" costs a usable seat while a wrong "fine"
//! costs one probe. And it never drops the last way out: when no usable candidate
//! would survive, the whole input order is kept and the upstream decides.
//!
//! The readings are the account's own (keyed by its pool entry, never by a token
//! or a process), so one account's exhaustion can never be pinned on another.
//! It never claims the head: its reason is empty and its detail names what it
//! dropped.

use poolgate_sdk::prelude::*;

/// The skip-exhausted filter.
pub struct SkipExhausted {
    buckets: Buckets,
}

impl Ranker for SkipExhausted {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        // Extra bucket → model family bindings, merged over the default `oi → fable`.
        let buckets = Buckets::new(o.string_map("buckets")?.unwrap_or_default());
        o.done()?;
        Ok(SkipExhausted { buckets })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let family = model_family(&req.model);
        let mut kept = Vec::with_capacity(candidates.len());
        let mut dropped = Vec::new();
        for c in candidates.iter() {
            match self.buckets.exhausted(&c, family, req.now_ms) {
                Some((window, until)) => dropped.push(format!("`{}` ({window} exhausted until {until})", c.info.id)),
                None => kept.push(c.position),
            }
        }
        if dropped.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let had_usable = candidates.iter().any(|c| c.usable);
        let keeps_usable = kept.iter().any(|&p| candidates.get(p).usable);
        if kept.is_empty() || (had_usable && !keeps_usable) {
            return Ok(candidates.unchanged("").with_detail(format!(
                "kept every candidate: dropping {} would leave no usable account",
                dropped.join(", ")
            )));
        }
        Ok(Ranking::new(kept, "").with_detail(format!("dropped {}", dropped.join(", "))))
    }
}

poolgate_sdk::export_ranker!(SkipExhausted);

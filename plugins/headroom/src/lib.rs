//! `builtin:headroom` — dario's default strategy: send each request to the account
//! with the most headroom left.
//!
//! headroom = 1 − max(5h, 7d, the request's per-model 7d bucket when the account has
//! reported one). Per-model buckets are found generically (`7d_<bucket>`); a bucket
//! binds the model family of the same name (`7d_opus` → opus) or the family the
//! `buckets` option maps it to (default `oi → fable`, per dario #1264).
//!
//! Order: eligible accounts above the floor by headroom (highest first), then
//! eligible accounts at or below the floor (drained: they still serve when nothing
//! else can), then ineligible ones by soonest recovery (dario's pre-v6 all-parked
//! fallback: the earliest reset). Remaining ties go to pool order — dario's
//! single pass keeps the first seat it meets — so the result never depends on the
//! order this stage received.

use std::cmp::Ordering;
use std::collections::HashMap;

use poolgate_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Headroom at or below which an account counts as drained (fraction).
    #[serde(default = "default_floor")]
    floor: f64,
    /// Extra bucket → model family bindings, merged over the default `oi → fable`.
    #[serde(default)]
    buckets: HashMap<String, String>,
}

/// 1 − 0.98 is 0.020000000000000018 in f64: "at the floor" must include it.
const FLOOR_EPSILON: f64 = 1e-9;

fn default_floor() -> f64 {
    0.02
}

/// The headroom ranker.
pub struct Headroom {
    floor: f64,
    buckets: Buckets,
}

/// Where an account lands, best first.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Healthy,
    Drained,
    Ineligible,
}

struct Key {
    tier: Tier,
    headroom: f64,
    /// For ineligible accounts: when they can serve again (unknown = never).
    recovery: u64,
    id: u32,
}

impl Headroom {
    fn key(&self, a: &Candidate, family: Option<&str>, now: u64) -> Key {
        let headroom = self.buckets.headroom(a, family);
        let rejected = a.status == WindowStatus::Rejected && a.resets_at_ms.is_none_or(|r| r > now);
        let tier = if !a.usable || rejected {
            Tier::Ineligible
        } else if headroom <= self.floor + FLOOR_EPSILON {
            Tier::Drained
        } else {
            Tier::Healthy
        };
        let recovery = match (&a.cooldown, rejected) {
            (Some(c), _) => c.until_ms,
            (None, true) => a.resets_at_ms.unwrap_or(u64::MAX),
            (None, false) => u64::MAX,
        };
        Key { tier, headroom, recovery, id: a.id }
    }
}

fn compare(a: &Key, b: &Key) -> Ordering {
    let recovery = if a.tier == Tier::Ineligible { a.recovery.cmp(&b.recovery) } else { Ordering::Equal };
    a.tier
        .cmp(&b.tier)
        .then(recovery)
        .then_with(|| (b.headroom + 0.0).total_cmp(&(a.headroom + 0.0)))
        .then(a.id.cmp(&b.id))
}

impl Ranker for Headroom {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let opts: Options = config.parse_into()?;
        check_range("floor", opts.floor, 0.0, 1.0)?;
        Ok(Headroom { floor: opts.floor, buckets: Buckets::new(opts.buckets) })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let family = model_family(&req.model);
        if candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let keys: Vec<Key> = candidates.iter().map(|a| self.key(&a, family, req.now_ms)).collect();
        let mut order = candidates.input_order();
        order.sort_by(|&a, &b| compare(&keys[a as usize], &keys[b as usize]));
        let head = &keys[order[0] as usize];
        let ranking = Ranking::new(order, "headroom");
        Ok(match head.tier {
            Tier::Healthy => ranking,
            Tier::Drained => ranking.with_detail("every eligible account is at or below the floor"),
            Tier::Ineligible => ranking.with_detail("no eligible account"),
        })
    }
}

poolgate_sdk::export_ranker!(Headroom);

//! `builtin:fill-first` — dario's `--pool-strategy=fill-first`: primary/backup seat
//! semantics, where the operator's alias naming picks the fill order.
//!
//! New requests concentrate on the lexicographically first eligible alias until its
//! headroom drains to the floor (default 2%), then spill to the next alias. When
//! every eligible seat is at the floor, the order falls back to max headroom (the
//! terminal state dario's two strategies share), so a drained pool still serves.
//!
//! Alias order, not insertion order: the operator names seats `1-main`,
//! `2-overflow` to set it (dario loads seats from a readdir whose order the OS does
//! not guarantee). Aliases compare byte-wise, like dario's JavaScript `<`, so
//! `B` sorts before `a` and `10-x` before `2-y`.
//!
//! Failover keeps the order: the host leaves the accounts already tried out of the
//! candidates, so attempt n is served by the next alias in line, not by the seat
//! with the most headroom — one 429 does not defeat the concentration.

use std::cmp::Ordering;
use std::collections::HashMap;

use poolgate_sdk::prelude::*;
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    /// Headroom at or below which a seat counts as drained (fraction).
    #[serde(default = "default_floor")]
    floor: f64,
    /// Extra bucket → model family bindings, merged over the default `oi → fable`.
    #[serde(default)]
    buckets: HashMap<String, String>,
}

fn default_floor() -> f64 {
    0.02
}

/// 1 − 0.98 is 0.020000000000000018 in f64: "at the floor" must include it.
const FLOOR_EPSILON: f64 = 1e-9;

/// The fill-first ranker.
pub struct FillFirst {
    floor: f64,
    buckets: Buckets,
}

/// Where a seat lands, best first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    /// Eligible and above the floor: ordered by alias.
    Filling,
    /// Eligible but at or below the floor: ordered by headroom.
    Drained,
    /// Rate-limited or not usable: ordered by soonest recovery.
    Ineligible,
}

struct Key<'c> {
    tier: Tier,
    alias: &'c str,
    headroom: f64,
    recovery: u64,
    id: u32,
}

impl FillFirst {
    fn key<'c>(&self, a: &Candidate<'c>, family: Option<&str>, now: u64) -> Key<'c> {
        let headroom = self.buckets.headroom(a, family);
        let rejected = a.status == WindowStatus::Rejected && a.resets_at_ms.is_none_or(|r| r > now);
        let tier = if !a.usable || rejected {
            Tier::Ineligible
        } else if headroom <= self.floor + FLOOR_EPSILON {
            Tier::Drained
        } else {
            Tier::Filling
        };
        let recovery = match (&a.cooldown, rejected) {
            (Some(c), _) => c.until_ms,
            (None, true) => a.resets_at_ms.unwrap_or(u64::MAX),
            (None, false) => u64::MAX,
        };
        Key { tier, alias: a.info.alias.as_str(), headroom, recovery, id: a.id }
    }
}

fn compare(a: &Key, b: &Key) -> Ordering {
    let more_headroom = || (b.headroom + 0.0).total_cmp(&(a.headroom + 0.0));
    a.tier
        .cmp(&b.tier)
        .then_with(|| match a.tier {
            Tier::Filling => a.alias.as_bytes().cmp(b.alias.as_bytes()),
            Tier::Drained => more_headroom(),
            Tier::Ineligible => a.recovery.cmp(&b.recovery).then_with(more_headroom),
        })
        .then(a.id.cmp(&b.id))
}

impl Ranker for FillFirst {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let opts: Options = config.parse_into()?;
        check_range("floor", opts.floor, 0.0, 1.0)?;
        Ok(FillFirst { floor: opts.floor, buckets: Buckets::new(opts.buckets) })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        if candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let family = model_family(&req.model);
        let keys: Vec<Key> = candidates.iter().map(|a| self.key(&a, family, req.now_ms)).collect();
        let mut order = candidates.input_order();
        order.sort_by(|&a, &b| compare(&keys[a as usize], &keys[b as usize]));
        let head = &keys[order[0] as usize];
        let detail = match head.tier {
            Tier::Filling => format!("filling `{}`", head.alias),
            Tier::Drained => "every eligible seat is at or below the floor: most headroom first".into(),
            Tier::Ineligible => "no eligible seat".into(),
        };
        Ok(Ranking::new(order, "fill_first").with_detail(detail))
    }
}

poolgate_sdk::export_ranker!(FillFirst);

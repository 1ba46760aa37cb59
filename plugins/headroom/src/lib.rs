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
//! else can), then ineligible ones. Ties keep the input order, so the ranking is
//! stable and chains compose.

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
    /// bucket → family; a handful of entries, so a list beats a hash map.
    buckets: Vec<(String, String)>,
}

/// Where an account lands, best first.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Healthy,
    Drained,
    Ineligible,
}

impl Headroom {
    /// The family a `7d_<bucket>` window binds.
    fn bucket_family<'b>(&'b self, bucket: &'b str) -> &'b str {
        self.buckets.iter().find(|(b, _)| b == bucket).map_or(bucket, |(_, f)| f.as_str())
    }

    /// Headroom of `account` for a request of model `family`.
    fn headroom(&self, account: &Candidate, family: Option<&str>) -> f64 {
        let mut h = account.headroom();
        if let Some(family) = family {
            for (bucket, w) in account.model_windows() {
                if self.bucket_family(bucket) == family {
                    h = h.min(1.0 - w.utilization);
                }
            }
        }
        h
    }

    fn tier(&self, account: &Candidate, headroom: f64, now: u64) -> Tier {
        let rejected = account.status == WindowStatus::Rejected
            && account.resets_at_ms.is_none_or(|r| r > now);
        if !account.usable || rejected {
            Tier::Ineligible
        } else if headroom <= self.floor + FLOOR_EPSILON {
            Tier::Drained
        } else {
            Tier::Healthy
        }
    }
}

impl Ranker for Headroom {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let opts: Options = config.parse_into()?;
        check_range("floor", opts.floor, 0.0, 1.0)?;
        let mut buckets: Vec<(String, String)> = opts
            .buckets
            .into_iter()
            .map(|(b, f)| (b.to_ascii_lowercase(), f.to_ascii_lowercase()))
            .collect();
        if !buckets.iter().any(|(b, _)| b == "oi") {
            buckets.push(("oi".into(), "fable".into()));
        }
        Ok(Headroom {
            floor: opts.floor,
            buckets,
        })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let family = model_family(&req.model);
        if candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let keyed: Vec<(Tier, f64)> = candidates
            .iter()
            .map(|a| {
                let h = self.headroom(&a, family);
                (self.tier(&a, h, req.now_ms), h)
            })
            .collect();
        let mut order = candidates.input_order();
        order.sort_by(|&a, &b| {
            let (ta, ha) = &keyed[a as usize];
            let (tb, hb) = &keyed[b as usize];
            ta.cmp(tb)
                .then_with(|| hb.partial_cmp(ha).unwrap_or(Ordering::Equal))
        });
        let head = &keyed[order[0] as usize];
        let ranking = Ranking::new(order, "headroom");
        Ok(match head.0 {
            Tier::Healthy => ranking,
            Tier::Drained => ranking.with_detail("every eligible account is at or below the floor"),
            Tier::Ineligible => ranking.with_detail("no eligible account"),
        })
    }
}

poolgate_sdk::export_ranker!(Headroom);

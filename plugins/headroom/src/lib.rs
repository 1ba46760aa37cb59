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

fn default_floor() -> f64 {
    0.02
}

/// The headroom ranker.
pub struct Headroom {
    floor: f64,
    buckets: HashMap<String, String>,
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
        self.buckets.get(bucket).map(String::as_str).unwrap_or(bucket)
    }

    /// Headroom of `account` for a request of model `family`.
    fn headroom(&self, account: &Account, family: Option<&str>) -> f64 {
        let mut h = account.headroom();
        if let Some(family) = family {
            for (bucket, w) in account.model_windows() {
                if self.bucket_family(&bucket) == family {
                    h = h.min(1.0 - w.utilization);
                }
            }
        }
        h
    }

    fn tier(&self, account: &Account, headroom: f64, now: u64) -> Tier {
        let rejected = account.status == WindowStatus::Rejected
            && account.resets_at_ms.is_none_or(|r| r > now);
        if !account.usable || rejected {
            Tier::Ineligible
        } else if headroom <= self.floor {
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
        let mut buckets = HashMap::from([("oi".to_string(), "fable".to_string())]);
        buckets.extend(
            opts.buckets
                .into_iter()
                .map(|(b, f)| (b.to_ascii_lowercase(), f.to_ascii_lowercase())),
        );
        Ok(Headroom {
            floor: opts.floor,
            buckets,
        })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let family = model_family(&req.model);
        let keyed: Vec<(Tier, f64)> = candidates
            .accounts()
            .iter()
            .map(|a| {
                let h = self.headroom(a, family);
                (self.tier(a, h, req.now_ms), h)
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

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

use poolgate_sdk::prelude::*;

/// The headroom ranker.
pub struct Headroom {
    floor: Floor,
}

struct Key {
    seat: Seat,
    id: u32,
}

fn compare(a: &Key, b: &Key) -> Ordering {
    let (x, y) = (&a.seat, &b.seat);
    let recovery = if x.standing == Standing::Ineligible { x.recovery.cmp(&y.recovery) } else { Ordering::Equal };
    x.standing
        .cmp(&y.standing)
        .then(recovery)
        .then_with(|| (y.headroom + 0.0).total_cmp(&(x.headroom + 0.0)))
        .then(a.id.cmp(&b.id))
}

impl Ranker for Headroom {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        Ok(Headroom { floor: Floor::configure(&config)? })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let family = model_family(&req.model);
        if candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let keys: Vec<Key> =
            candidates.iter().map(|a| Key { seat: self.floor.seat(&a, family, req.now_ms), id: a.id }).collect();
        let mut order = candidates.input_order();
        order.sort_by(|&a, &b| compare(&keys[a as usize], &keys[b as usize]));
        let head = &keys[order[0] as usize];
        let ranking = Ranking::new(order, "headroom");
        Ok(match head.seat.standing {
            Standing::AboveFloor => ranking,
            Standing::Drained => ranking.with_detail("every eligible account is at or below the floor"),
            Standing::Ineligible => ranking.with_detail("no eligible account"),
        })
    }
}

poolgate_sdk::export_ranker!(Headroom);

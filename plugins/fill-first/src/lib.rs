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

use poolgate_sdk::prelude::*;

/// The fill-first ranker.
pub struct FillFirst {
    floor: Floor,
}

/// Seats above the floor are ordered by alias, drained ones by headroom,
/// ineligible ones by soonest recovery.
struct Key<'c> {
    seat: Seat,
    alias: &'c str,
    id: u32,
}

fn compare(a: &Key, b: &Key) -> Ordering {
    let (x, y) = (&a.seat, &b.seat);
    let more_headroom = || (y.headroom + 0.0).total_cmp(&(x.headroom + 0.0));
    x.standing
        .cmp(&y.standing)
        .then_with(|| match x.standing {
            Standing::AboveFloor => a.alias.as_bytes().cmp(b.alias.as_bytes()),
            Standing::Drained => more_headroom(),
            Standing::Ineligible => x.recovery.cmp(&y.recovery).then_with(more_headroom),
        })
        .then(a.id.cmp(&b.id))
}

impl Ranker for FillFirst {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        Ok(FillFirst { floor: Floor::configure(&config)? })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        if candidates.is_empty() {
            return Ok(candidates.unchanged(""));
        }
        let family = model_family(&req.model);
        let keys: Vec<Key> = candidates
            .iter()
            .map(|a| Key { seat: self.floor.seat(&a, family, req.now_ms), alias: a.info.alias.as_str(), id: a.id })
            .collect();
        let mut order = candidates.input_order();
        order.sort_by(|&a, &b| compare(&keys[a as usize], &keys[b as usize]));
        let head = &keys[order[0] as usize];
        let detail = match head.seat.standing {
            Standing::AboveFloor => format!("filling `{}`", head.alias),
            Standing::Drained => "every eligible seat is at or below the floor: most headroom first".into(),
            Standing::Ineligible => "no eligible seat".into(),
        };
        Ok(Ranking::new(order, "fill_first").with_detail(detail))
    }
}

poolgate_sdk::export_ranker!(FillFirst);

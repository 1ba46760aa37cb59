//! reset-soonest, in Rust: prefer the accounts whose 5h window resets soonest,
//! skip any whose 5h utilization is above `max_utilization`.
//!
//! The reference for the Python, JavaScript and C versions next to this
//! directory; all four pass `../fixtures`. Options (the stage's `config` table):
//!
//! - `max_utilization` (0–1, default 0.9): skip accounts whose 5h window is used
//!   beyond this fraction;
//! - `sort` (default true): order the rest by 5h reset, soonest first; when false
//!   the stage only filters and leaves the head to a later stage;
//! - `rate_limit_penalty_ms` (default 0, off): after a 429 on an account, skip it
//!   for this long. Kept in the host's state store, so it outlives instances.

use poolgate_sdk::prelude::*;

struct ResetSoonest {
    max_utilization: f64,
    sort: bool,
    penalty_ms: u64,
}

/// The state key remembering a 429 on `account` (its operator id: stable
/// across configuration generations, unlike the pool index).
fn penalty_key(account: &AccountInfo) -> String {
    format!("429:{}", account.id)
}

impl Ranker for ResetSoonest {
    fn configure(config: Config, pool: &Pool) -> Result<Self, String> {
        // Each read refuses a value of the wrong type by the option's name;
        // `done` refuses any option not read (a misspelling, say).
        let mut o = config.options();
        let max_utilization = check_range("max_utilization", o.f64("max_utilization")?.unwrap_or(0.9), 0.0, 1.0)?;
        let sort = o.bool("sort")?.unwrap_or(true);
        let penalty_ms = o.u64("rate_limit_penalty_ms")?.unwrap_or(0);
        o.done()?;
        log::debug(&format!("reset-soonest (rust) configured for {} accounts", pool.len()));
        Ok(ResetSoonest { max_utilization, sort, penalty_ms })
    }

    fn rank(&mut self, _req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let (mut keep, skipped): (Vec<Candidate>, Vec<Candidate>) = candidates.iter().partition(|c| {
            let hot = c.session_used().is_some_and(|u| u > self.max_utilization);
            let limited = self.penalty_ms > 0 && state::get(&penalty_key(c.info)).is_some();
            !(hot || limited)
        });
        if keep.is_empty() {
            return Ok(candidates.unchanged("").with_detail("every candidate is over the limit; order left as is"));
        }
        if self.sort {
            // Stable: equal keys keep the order the previous stage chose.
            keep.sort_by_key(|c| {
                let reset = c.window(WindowKind::FiveHour).and_then(|w| w.resets_at_ms).unwrap_or(u64::MAX);
                (!c.usable, reset)
            });
        }
        let order = keep.iter().map(|c| c.position).collect();
        let ranking = Ranking::new(order, if self.sort { "reset_soonest" } else { "" });
        Ok(if skipped.is_empty() {
            ranking
        } else {
            let ids: Vec<&str> = skipped.iter().map(|c| c.info.id.as_str()).collect();
            ranking.with_detail(format!("skipped: {}", ids.join(", ")))
        })
    }

    fn observe(&mut self, _req: &Request, account: &AccountInfo, outcome: &Outcome) {
        if self.penalty_ms > 0 && matches!(outcome, Outcome::RateLimited(_)) {
            state::set(&penalty_key(account), "1", Some(self.penalty_ms));
        }
    }
}

poolgate_sdk::export_ranker!(ResetSoonest);

//! `builtin:affinity` — neurolink's session affinity: keep a session on the
//! account that served it, so its prompt cache stays warm.
//!
//! A session binds to the account that actually served its last successful
//! response (reported through `observe`), not to the account a ranking proposed:
//! binding the proposal is what let a transient cooldown bounce a session
//! A → B → A. The binding lasts `idle_ttl_ms` after that response; ranking reads
//! it without refreshing it, so only served traffic keeps a session alive. The
//! bound account goes to the front while it is usable and not saturated;
//! otherwise the earlier order stands and the detail says why
//! (`affinity skipped: unusable | session_saturated | expired | no_session`).
//!
//! Bindings live in the host's state store (`<account id>|<served at ms>` under
//! the session id), so they survive instance replacement and a hot swap.

use poolgate_sdk::prelude::*;

/// The affinity modifier.
pub struct Affinity {
    idle_ttl_ms: u64,
    ladder: Ladder,
}

fn skipped(candidates: &Candidates, why: String) -> Ranking {
    candidates.unchanged("").with_detail(format!("affinity skipped: {why}"))
}

impl Ranker for Affinity {
    fn configure(config: Config, _pool: &Pool) -> Result<Self, String> {
        let mut o = config.options();
        // How long a binding outlives the last response it served, ms.
        let idle_ttl_ms = check_range("idle_ttl_ms", o.u64("idle_ttl_ms")?.unwrap_or(3_600_000), 60_000, 86_400_000)?;
        // Most sessions remembered; the least recently served are forgotten first.
        let max_sessions = check_range("max_sessions", o.u32("max_sessions")?.unwrap_or(5_000), 1, 1_000_000)?;
        // 5h utilization at or above which the bound account is saturated, in (0, 1],
        // and extra bucket → model family bindings, merged over the default `oi → fable`.
        let ladder = Ladder::new(o.f64("session_soft_limit")?, None, o.string_map("buckets")?.unwrap_or_default())?;
        o.done()?;
        state::limit(max_sessions);
        Ok(Affinity { idle_ttl_ms, ladder })
    }

    fn rank(&mut self, req: &Request, candidates: &Candidates) -> Result<Ranking, String> {
        let Some(session) = req.session.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(skipped(candidates, "no_session".into()));
        };
        let binding = state::get(session);
        let Some((id, served_at)) = binding.as_deref().and_then(parse) else {
            return Ok(skipped(candidates, "expired".into()));
        };
        // The store's TTL is a backstop; this is the exact boundary: a binding
        // is still live at exactly `idle_ttl_ms` and gone 1 ms later.
        if req.now_ms.saturating_sub(served_at) > self.idle_ttl_ms {
            return Ok(skipped(candidates, "expired".into()));
        }
        let position = candidates.pool().index_of(id).and_then(|i| candidates.position_of(i));
        let Some(position) = position else {
            // Tried already on this request, dropped by an earlier stage, or no
            // longer in the pool.
            return Ok(skipped(candidates, format!("unusable (`{id}` is not a candidate)")));
        };
        let bound = candidates.get(position);
        let metrics = self.ladder.metrics_of(&bound, model_family(&req.model), req.now_ms);
        if let Some(why) = metrics.precedence_skip() {
            return Ok(skipped(candidates, format!("{why} (`{id}`)")));
        }
        Ok(candidates.with_front(position, "session_affinity").with_detail(format!("session bound to `{id}`")))
    }

    fn observe(&mut self, req: &Request, account: &AccountInfo, outcome: &Outcome) {
        let Some(session) = req.session.as_deref().filter(|s| !s.is_empty()) else {
            return;
        };
        if matches!(outcome, Outcome::Success) {
            let value = format!("{}|{}", account.id, req.now_ms);
            state::set(session, &value, Some(self.idle_ttl_ms + 1));
        }
    }
}

/// `<account id>|<served at ms>`; the id may itself contain `|`.
fn parse(value: &str) -> Option<(&str, u64)> {
    let (id, at) = value.rsplit_once('|')?;
    Some((id, at.parse().ok()?))
}

poolgate_sdk::export_ranker!(Affinity);

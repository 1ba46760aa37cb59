//! What the chain sees of an account: a snapshot, or — for a request's
//! ranking — a view read under the account's lock without copying it.

use super::{AccountState, Learned, with_seat};
use crate::account::{AccountSnapshot, WindowReading};
use crate::config::AccountConfig;
use crate::oauth::Seat;

impl AccountState {
    /// The chain's view of the account at `now_ms`.
    pub fn snapshot(&self, config: &AccountConfig, now_ms: u64) -> AccountSnapshot {
        let seat = self.seat();
        let l = self.learned.lock();
        AccountSnapshot {
            id: self.id.clone(),
            alias: config.alias.clone(),
            windows: l.windows.values().cloned().collect(),
            ..self.bare(config, &l, seat.as_deref(), now_ms)
        }
    }

    /// What [`snapshot`](Self::snapshot) says, for a request's ranking:
    /// `f` gets the snapshot without its id, alias and windows, and the
    /// windows as they are, under the lock. A ranking reads neither id nor
    /// alias, and copying them and every window (with its name) cost a few
    /// allocations per account per request (#30).
    pub fn with_view<R>(
        &self,
        config: &AccountConfig,
        now_ms: u64,
        f: impl FnOnce(&AccountSnapshot, std::collections::btree_map::Values<'_, String, WindowReading>) -> R,
    ) -> R {
        let seat = self.seat();
        let l = self.learned.lock();
        f(&self.bare(config, &l, seat.as_deref(), now_ms), l.windows.values())
    }

    /// The snapshot without id, alias and windows: what both share. The
    /// seat is read before the learned lock is taken, as everywhere.
    fn bare(&self, config: &AccountConfig, l: &Learned, seat: Option<&Seat>, now_ms: u64) -> AccountSnapshot {
        AccountSnapshot {
            id: String::new(),
            alias: None,
            primary: config.primary,
            usable: None,
            disabled: !config.enabled || seat.is_some_and(|s| s.needs_login()),
            cooldown: with_seat(l.cooldown, seat.and_then(|s| s.unusable_until(now_ms))),
            model_gates: l.model_gates.clone(),
            in_flight: self.in_flight(),
            max_in_flight: config.max_in_flight,
            status: l.status,
            resets_at_ms: l.reset_ms,
            windows: Vec::new(),
        }
    }
}

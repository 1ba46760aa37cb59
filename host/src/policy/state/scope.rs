//! One scope of plugin state: its entries, their write order and what they
//! are charged ([`super::cost`]).
//!
//! Each key is held once, in an `Arc<str>` shared by the key index and the
//! write order: a second copy of every key was a third of what a tiny entry
//! took. Both are B-trees, not hash maps: a hash map's resize or tombstone
//! clean-up rehashes every entry at once — 23 to 39 ms for a full scope
//! (150,000 entries) in a release build, inside one `state-set`, under the
//! store's lock — where a B-tree's every insert and remove is O(log n) (at
//! most 0.2 ms in the same measurement, for the same mean cost per call).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{DEFAULT_LIMIT, EVICT_PER_CALL, cost};

/// An expiry that never comes: what `expires_at` holds for an entry without
/// a TTL (a `u64`, not an `Option<u64>`: eight bytes less in each of the
/// index's node slots, which every entry pays for).
const NEVER: u64 = u64::MAX;

/// One entry, beside its key.
pub(super) struct Entry {
    pub(super) value: Box<str>,
    /// When it expires (ms since the epoch), [`NEVER`] without a TTL.
    expires_at: u64,
    /// Its place in the write order.
    seq: u64,
    /// When it was written (the writer's `now`): what a write from another
    /// replica is compared with.
    pub(super) written: u64,
}

impl Entry {
    /// When it expires, if it does.
    pub(super) fn expires_at(&self) -> Option<u64> {
        (self.expires_at != NEVER).then_some(self.expires_at)
    }

    /// Whether it is live at `now`.
    pub(super) fn live_at(&self, now: u64) -> bool {
        self.expires_at > now
    }
}

pub(super) struct Scope {
    /// Key → entry.
    pub(super) entries: BTreeMap<Arc<str>, Entry>,
    /// Write order: seq → key. The first entry is the least recently written.
    order: BTreeMap<u64, Arc<str>>,
    pub(super) limit: u32,
    next_seq: u64,
    /// Bytes charged: the scope's own ([`cost::scope`]) and its entries'.
    pub(super) bytes: usize,
}

impl Scope {
    /// An empty scope named `name`, charged what it costs empty.
    pub(super) fn new(name: &str) -> Self {
        Scope {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            limit: DEFAULT_LIMIT,
            next_seq: 0,
            bytes: cost::scope(name),
        }
    }

    /// Adds `key` (not held: remove it first); the bytes it is charged.
    pub(super) fn add(&mut self, key: &str, value: &str, expires_at: Option<u64>, written: u64) -> usize {
        let charge = cost::entry(key, value);
        let key: Arc<str> = Arc::from(key);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, key.clone());
        let entry = Entry { value: value.into(), expires_at: expires_at.unwrap_or(NEVER), seq, written };
        self.entries.insert(key, entry);
        self.bytes += charge;
        charge
    }

    /// Removes `key`; the bytes it freed.
    pub(super) fn remove(&mut self, key: &str) -> usize {
        match self.entries.remove_entry(key) {
            Some((k, e)) => {
                self.order.remove(&e.seq);
                self.freed(&k, &e)
            }
            None => 0,
        }
    }

    /// Evicts up to [`EVICT_PER_CALL`] of the oldest entries past the entry
    /// limit; the bytes freed.
    pub(super) fn evict_over_limit(&mut self) -> usize {
        let excess = self.entries.len().saturating_sub(self.limit as usize).min(EVICT_PER_CALL);
        (0..excess).map(|_| self.evict_oldest()).sum()
    }

    /// Evicts the oldest entry; the bytes it freed (0 when empty).
    pub(super) fn evict_oldest(&mut self) -> usize {
        let Some((_, key)) = self.order.pop_first() else { return 0 };
        match self.entries.remove(&key) {
            Some(e) => self.freed(&key, &e),
            None => 0,
        }
    }

    fn freed(&mut self, key: &str, e: &Entry) -> usize {
        let charge = cost::entry(key, &e.value);
        self.bytes -= charge;
        charge
    }
}

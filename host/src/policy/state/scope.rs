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
use std::mem::size_of;
use std::sync::Arc;

use super::{DEFAULT_LIMIT, EVICT_PER_CALL, cost};

// What a scope and an entry are charged: the allocator and B-tree model of
// `cost`, applied to this module's own types.

/// The key index (`Arc<str>` → [`Entry`]).
const INDEX: (usize, usize) = (size_of::<Arc<str>>(), size_of::<Entry>());
/// The write order (sequence number → `Arc<str>`).
const ORDER: (usize, usize) = (size_of::<u64>(), size_of::<Arc<str>>());

/// What every entry costs in nodes of the key index and the write order,
/// whatever its key and value.
pub const ENTRY_NODES: usize = cost::btree_per_element(INDEX.0, INDEX.1) + cost::btree_per_element(ORDER.0, ORDER.1);

/// What one scope costs before its name and entries: its slots in the scopes'
/// hash table (at most four per scope, each the `(name, Scope)` pair and a
/// control byte; and, charged to every scope though the table has them once,
/// its group of 16 trailing control bytes and its chunk's rounding) and the
/// roots of its two B-trees.
pub const SCOPE_FIXED: usize = 4 * (size_of::<(Box<str>, Scope)>() + 1)
    + 16
    + 32
    + cost::btree_fixed(INDEX.0, INDEX.1)
    + cost::btree_fixed(ORDER.0, ORDER.1);

/// Bytes an entry is charged: its key (held once, with an `Arc`'s two
/// counts), its value and its share of the nodes.
pub const fn entry_cost(key: &str, value: &str) -> usize {
    cost::heap(2 * size_of::<usize>() + key.len()) + cost::heap(value.len()) + ENTRY_NODES
}

/// Bytes a scope named `name` is charged while it exists, entries aside.
pub const fn scope_cost(name: &str) -> usize {
    cost::heap(name.len()) + SCOPE_FIXED
}

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
    /// Bytes charged: the scope's own ([`scope_cost`]) and its entries'.
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
            bytes: scope_cost(name),
        }
    }

    /// Adds `key` (not held: remove it first); the bytes it is charged.
    pub(super) fn add(&mut self, key: &str, value: &str, expires_at: Option<u64>, written: u64) -> usize {
        let charge = entry_cost(key, value);
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
        let charge = entry_cost(key, &e.value);
        self.bytes -= charge;
        charge
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_entry_is_charged_what_its_allocations_and_nodes_take() {
        // The figures the docs give (docs/configuration.md, `[policy.state]`).
        assert_eq!(size_of::<Entry>(), 40);
        assert_eq!(ENTRY_NODES, 193);
        assert_eq!(entry_cost("k", "v"), 32 + 32 + 193);
        assert_eq!(entry_cost("k", ""), 32 + 193);
        assert_eq!(entry_cost(&"k".repeat(1024), &"v".repeat(65536)), cost::heap(1040) + cost::heap(65536) + 193);
        assert_eq!(SCOPE_FIXED, 1460, "about 1.5 KiB, as the docs say");
    }
}

//! Plugin state shared between replicas: the same bounded in-process store a
//! single gateway uses ([`MemoryState`]), whose writes are also queued for
//! the shared backend — never waited for. A plugin's `state-get` reads this
//! replica's store only; another replica's writes arrive in it from the
//! backend, each applied unless the key was written here later (last writer
//! by write time wins, whatever the order of arrival).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::policy::{MemoryState, StateEntry, StateLimits, StateStore};

/// One write to share: a value, or a delete when `value` is `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginWrite {
    /// The plugin's scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The value; `None` deletes.
    pub value: Option<String>,
    /// When it expires (ms since the epoch).
    pub expires_at: Option<u64>,
    /// When it was written.
    pub written: u64,
}

/// The most writes queued while the backend is away, and the most bytes
/// they may hold; past either the oldest go, and the whole store is written
/// back when it returns.
pub const OUTBOX_MAX: usize = 50_000;
/// See [`OUTBOX_MAX`].
pub const OUTBOX_BYTES: usize = 64 << 20;

/// What a queued write takes, as the store counts its entries
/// (`policy::state::cost`): its slot in the queue (twice, for the queue's
/// spare capacity) and its strings as allocated.
fn size(w: &PluginWrite) -> usize {
    use crate::policy::state::cost::heap;
    2 * std::mem::size_of::<PluginWrite>()
        + heap(w.scope.len())
        + heap(w.key.len())
        + w.value.as_deref().map_or(0, |v| heap(v.len()))
}

/// Writes waiting for the backend.
#[derive(Default)]
pub struct Outbox {
    queue: Mutex<(VecDeque<PluginWrite>, usize)>,
    overflowed: std::sync::atomic::AtomicBool,
    /// Wakes the writer.
    pub notify: Notify,
}

impl Outbox {
    /// Queues `w` (O(1), under a short lock: this runs inside plugin calls).
    pub fn push(&self, w: PluginWrite) {
        let mut guard = self.queue.lock();
        let (q, bytes) = &mut *guard;
        *bytes += size(&w);
        q.push_back(w);
        while q.len() > OUTBOX_MAX || *bytes > OUTBOX_BYTES {
            let Some(old) = q.pop_front() else { break };
            *bytes -= size(&old);
            self.overflowed.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Takes up to `n` queued writes.
    pub fn take(&self, n: usize) -> Vec<PluginWrite> {
        let mut guard = self.queue.lock();
        let (q, bytes) = &mut *guard;
        let n = n.min(q.len());
        let taken: Vec<PluginWrite> = q.drain(..n).collect();
        *bytes -= taken.iter().map(size).sum::<usize>();
        taken
    }

    /// Puts writes that could not be sent back at the front, in order.
    pub fn put_back(&self, writes: Vec<PluginWrite>) {
        let mut guard = self.queue.lock();
        let (q, bytes) = &mut *guard;
        for w in writes.into_iter().rev() {
            if q.len() >= OUTBOX_MAX || *bytes + size(&w) > OUTBOX_BYTES {
                self.overflowed.store(true, std::sync::atomic::Ordering::Release);
                break;
            }
            *bytes += size(&w);
            q.push_front(w);
        }
    }

    /// Whether writes were dropped since the last call (then the whole store
    /// must be written back).
    pub fn take_overflowed(&self) -> bool {
        self.overflowed.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Writes queued now.
    pub fn len(&self) -> usize {
        self.queue.lock().0.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Plugin state whose writes are shared.
pub struct SharedPluginState {
    local: Arc<MemoryState>,
    outbox: Arc<Outbox>,
    /// The scopes the running chain uses: another replica's writes to any
    /// other scope are not this replica's business.
    scopes: RwLock<Option<HashSet<String>>>,
    /// Stamps a delete (a write is stamped with the time it is given).
    clock: crate::clock::Clock,
}

impl SharedPluginState {
    /// Shares the writes to `local` through `outbox`.
    pub fn new(local: Arc<MemoryState>, outbox: Arc<Outbox>, clock: crate::clock::Clock) -> Self {
        SharedPluginState { local, outbox, scopes: RwLock::new(None), clock }
    }

    /// Whether writes to `scope` from other replicas are taken.
    pub fn wants(&self, scope: &str) -> bool {
        self.scopes.read().as_ref().is_none_or(|s| s.contains(scope))
    }

    /// Applies another replica's write; whether it changed anything.
    pub fn apply(&self, w: &PluginWrite, now: u64) -> bool {
        if !self.wants(&w.scope) {
            return false;
        }
        match &w.value {
            Some(v) => self.local.merge_write(&w.scope, &w.key, v, w.expires_at, w.written, now),
            None => self.local.merge_delete(&w.scope, &w.key, w.written),
        }
    }

    /// Every live entry, as writes (to write back after the backend was away
    /// and writes were dropped from the queue).
    pub fn everything(&self, now: u64) -> Vec<PluginWrite> {
        let mut all = Vec::new();
        for scope in self.local.scope_names() {
            for (key, value, expires_at, written) in self.local.entries(&scope, now) {
                all.push(PluginWrite { scope: scope.clone(), key, value: Some(value), expires_at, written });
            }
        }
        all
    }
}

impl StateStore for SharedPluginState {
    fn get(&self, scope: &str, key: &str, now_ms: u64) -> Option<String> {
        self.local.get(scope, key, now_ms)
    }

    fn set(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64) {
        // A write the local store refused (too large, or no room) is not
        // shared: the replicas' stores hold to the same bounds.
        if !self.local.write(scope, key, value, ttl_ms, now_ms) {
            return;
        }
        self.outbox.push(PluginWrite {
            scope: scope.to_string(),
            key: key.to_string(),
            value: Some(value.to_string()),
            expires_at: ttl_ms.map(|t| now_ms.saturating_add(t)),
            written: now_ms,
        });
    }

    fn delete(&self, scope: &str, key: &str) {
        self.local.delete(scope, key);
        self.outbox.push(PluginWrite {
            scope: scope.to_string(),
            key: key.to_string(),
            value: None,
            expires_at: None,
            written: self.clock.now_ms(),
        });
    }

    fn limit(&self, scope: &str, max_entries: u32) {
        self.local.limit(scope, max_entries);
    }

    fn len(&self, scope: &str) -> usize {
        self.local.len(scope)
    }

    fn bytes(&self, scope: &str) -> usize {
        self.local.bytes(scope)
    }

    fn retain_scopes(&self, keep: &[&str]) {
        *self.scopes.write() = Some(keep.iter().map(|s| s.to_string()).collect());
        self.local.retain_scopes(keep);
    }

    fn set_limits(&self, limits: StateLimits) {
        self.local.set_limits(limits);
    }

    fn changes(&self) -> u64 {
        self.local.changes()
    }

    fn dump(&self, now: u64, max_bytes: usize) -> Vec<StateEntry> {
        self.local.dump(now, max_bytes)
    }

    /// Into this replica's store only: the backend gets every entry when it
    /// connects anyway (`redis::sync`, everything written back).
    fn restore(&self, entry: &StateEntry, now: u64) -> bool {
        self.local.restore(entry, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_queued_and_a_later_local_write_beats_an_earlier_remote_one() {
        let outbox = Arc::new(Outbox::default());
        let st = SharedPluginState::new(
            Arc::new(MemoryState::default()),
            outbox.clone(),
            crate::clock::Clock::manual(1_000),
        );
        st.set("builtin:affinity", "s1", "a|1", Some(1_000), 100);
        assert_eq!(outbox.take(10).len(), 1);
        let earlier = PluginWrite {
            scope: "builtin:affinity".into(),
            key: "s1".into(),
            value: Some("b|0".into()),
            expires_at: Some(5_000),
            written: 99,
        };
        assert!(!st.apply(&earlier, 100));
        assert_eq!(st.get("builtin:affinity", "s1", 100).as_deref(), Some("a|1"));
        let later = PluginWrite { written: 101, ..earlier };
        assert!(st.apply(&later, 101));
        assert_eq!(st.get("builtin:affinity", "s1", 101).as_deref(), Some("b|0"));
        assert!(outbox.is_empty(), "another replica's write is not sent back");
    }

    #[test]
    fn writes_to_scopes_the_chain_does_not_use_are_ignored() {
        let st = SharedPluginState::new(
            Arc::new(MemoryState::default()),
            Arc::new(Outbox::default()),
            crate::clock::Clock::manual(1_000),
        );
        st.retain_scopes(&["builtin:affinity"]);
        let w = PluginWrite {
            scope: "file:/x.wasm".into(),
            key: "k".into(),
            value: Some("v".into()),
            expires_at: None,
            written: 1,
        };
        assert!(!st.apply(&w, 1));
        assert_eq!(st.len("file:/x.wasm"), 0);
    }
}

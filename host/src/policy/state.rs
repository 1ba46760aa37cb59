//! Plugin state: a small key-value store per plugin scope, with TTLs and bounds.
//!
//! Rankers are instantiated many times and replaced at will, so what must outlive
//! an instance (affinity bindings) lives here, keyed by the plugin's scope (its
//! name). Time is the request's `now-ms`, never the wall clock, so a fixture that
//! says "1 ms past the TTL" means exactly that.
//!
//! A plugin writes here on every request, so everything is bounded: entries per
//! scope (the plugin's own `state-limit`), bytes per scope, and bytes across all
//! scopes. Past a bound the least recently written entries of the scope being
//! written go first — the plugin that floods pays, no other plugin's state is
//! touched — and a write that cannot fit even then is dropped. Scopes that no
//! stage of the running configuration uses are dropped on reload.
//!
//! Every call does a bounded amount of work under the store's one lock, which
//! every plugin's state calls share: lowering a scope's entry limit (a plugin's
//! `state-limit`) evicts at most [`EVICT_PER_CALL`] entries at once, and the
//! rest of the excess goes as many at a time with the scope's next writes and
//! limit calls. Measured in a release build, evicting a full scope (150,000
//! entries) in one call held the lock for 55 ms; a call now holds it about a
//! millisecond. A write that needs room for its bytes evicts what it needs,
//! which a value's bound (64 KiB) keeps to a few hundred entries. Entries are
//! kept in B-trees, whose every insert and remove costs O(log n), never a
//! rehash of the whole scope.
//!
//! Scopes are named by the chain (see `PluginRef::default_scope`): a built-in's
//! is `builtin:<name>`, a file's `file:<its absolute path>`, so two different
//! plugins never share state unless the operator gives them one `scope`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Default entry limit of a scope until the plugin sets its own.
pub const DEFAULT_LIMIT: u32 = 10_000;
/// The most entries a plugin may ask for.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest key accepted; longer writes are dropped (and logged).
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest value accepted.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// What one entry costs beyond its key and value (map nodes, bookkeeping), so
/// that a million tiny entries count for what they hold.
pub const ENTRY_OVERHEAD: usize = 96;
/// Default bytes one scope may hold, MiB.
pub const DEFAULT_SCOPE_MB: usize = 16;
/// Default bytes all scopes together may hold, MiB.
pub const DEFAULT_TOTAL_MB: usize = 128;
/// The most entries one call evicts to honour a lowered entry limit (about
/// 0.3 ms of work); the rest of the excess goes with the following calls.
pub const EVICT_PER_CALL: usize = 1024;

/// What one entry costs in a dump beyond its scope, key and value (its
/// framing when written out as JSON), so that many tiny entries count for
/// what they take.
pub const DUMP_ENTRY_OVERHEAD: usize = 64;

/// The byte bounds of a state store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLimits {
    /// Bytes one scope may hold.
    pub scope_bytes: usize,
    /// Bytes all scopes together may hold.
    pub total_bytes: usize,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits { scope_bytes: DEFAULT_SCOPE_MB << 20, total_bytes: DEFAULT_TOTAL_MB << 20 }
    }
}

/// One live entry, as kept across a restart (the gateway's state file) or
/// written back to a shared backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateEntry {
    /// The plugin's scope.
    pub scope: String,
    /// The key.
    pub key: String,
    /// The value.
    pub value: String,
    /// When it expires (ms since the epoch), if it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// When it was written (the writer's `now`).
    pub written: u64,
}

/// Where plugin state is kept. The in-process [`MemoryState`] is the default.
pub trait StateStore: Send + Sync {
    /// The live value of `key` in `scope` at `now_ms`.
    fn get(&self, scope: &str, key: &str, now_ms: u64) -> Option<String>;
    /// Writes `key`; with `ttl_ms` it is live while `now < written + ttl` .
    fn set(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64);
    /// Removes `key`.
    fn delete(&self, scope: &str, key: &str);
    /// Sets the scope's entry limit.
    fn limit(&self, scope: &str, max_entries: u32);
    /// How many entries `scope` holds (expired ones may still count until evicted).
    fn len(&self, scope: &str) -> usize;
    /// Bytes `scope` holds, as counted against its bound.
    fn bytes(&self, _scope: &str) -> usize {
        0
    }
    /// Drops every scope not in `keep` (scopes no stage uses any more).
    fn retain_scopes(&self, _keep: &[&str]) {}
    /// Replaces the byte bounds.
    fn set_limits(&self, _limits: StateLimits) {}
    /// Counts the writes and deletes so far: a change shows as a new number
    /// (what tells the gateway's state file that it has something to write).
    fn changes(&self) -> u64 {
        0
    }
    /// The live entries at `now`, in every scope, up to `max_bytes` (each
    /// entry's scope, key and value, plus [`DUMP_ENTRY_OVERHEAD`]: about what
    /// it takes written out); past it the rest is left out.
    fn dump(&self, _now: u64, _max_bytes: usize) -> Vec<StateEntry> {
        Vec::new()
    }
    /// Takes an entry back (read from the state file after a restart): kept
    /// unless it has expired or the key was written later. Whether it was.
    fn restore(&self, _entry: &StateEntry, _now: u64) -> bool {
        false
    }
}

struct Entry {
    value: String,
    expires_at: Option<u64>,
    seq: u64,
    /// When it was written (the writer's `now`): what a write from another
    /// replica is compared with.
    written: u64,
}

fn cost(key: &str, value: &str) -> usize {
    key.len() + value.len() + ENTRY_OVERHEAD
}

struct Scope {
    /// A B-tree, not a hash map: a hash map's resize or tombstone clean-up
    /// rehashes every entry at once — 23 to 39 ms for a full scope (150,000
    /// entries) in a release build, inside one `state-set`, under the lock —
    /// where a B-tree's every insert and remove is O(log n) (at most 0.2 ms in
    /// the same measurement, for the same mean cost per call).
    entries: BTreeMap<String, Entry>,
    /// Write order: seq → key. The first entry is the least recently written.
    order: BTreeMap<u64, String>,
    limit: u32,
    next_seq: u64,
    bytes: usize,
}

impl Default for Scope {
    fn default() -> Self {
        Scope { entries: BTreeMap::new(), order: BTreeMap::new(), limit: DEFAULT_LIMIT, next_seq: 0, bytes: 0 }
    }
}

impl Scope {
    /// Removes `key`; the bytes it freed.
    fn remove(&mut self, key: &str) -> usize {
        match self.entries.remove_entry(key) {
            Some((k, e)) => {
                self.order.remove(&e.seq);
                let freed = cost(&k, &e.value);
                self.bytes -= freed;
                freed
            }
            None => 0,
        }
    }

    /// Evicts up to [`EVICT_PER_CALL`] of the oldest entries past the entry
    /// limit; the bytes freed.
    fn evict_over_limit(&mut self) -> usize {
        let excess = self.entries.len().saturating_sub(self.limit as usize).min(EVICT_PER_CALL);
        (0..excess).map(|_| self.evict_oldest()).sum()
    }

    /// Evicts the oldest entry; the bytes it freed (0 when empty).
    fn evict_oldest(&mut self) -> usize {
        match self.order.pop_first() {
            Some((_, key)) => match self.entries.remove(&key) {
                Some(e) => {
                    let freed = cost(&key, &e.value);
                    self.bytes -= freed;
                    freed
                }
                None => 0,
            },
            None => 0,
        }
    }
}

struct Inner {
    scopes: HashMap<String, Scope>,
    total: usize,
    limits: StateLimits,
    dropped_writes: u64,
}

/// Plugin state held in this process.
pub struct MemoryState {
    inner: Mutex<Inner>,
    /// Writes and deletes so far ([`StateStore::changes`]).
    changes: AtomicU64,
}

impl Default for MemoryState {
    fn default() -> Self {
        Self::with_limits(StateLimits::default())
    }
}

impl MemoryState {
    /// An empty store with these bounds.
    pub fn with_limits(limits: StateLimits) -> Self {
        MemoryState {
            inner: Mutex::new(Inner { scopes: HashMap::new(), total: 0, limits, dropped_writes: 0 }),
            changes: AtomicU64::new(0),
        }
    }

    /// Bytes held across all scopes.
    pub fn total_bytes(&self) -> usize {
        self.inner.lock().total
    }

    /// Writes refused because they could not fit.
    pub fn dropped_writes(&self) -> u64 {
        self.inner.lock().dropped_writes
    }

    /// Takes a write another replica made: applied unless this store holds
    /// the key from a later write, or it has expired. Whether it was applied.
    pub fn merge_write(
        &self,
        scope: &str,
        key: &str,
        value: &str,
        expires_at: Option<u64>,
        written: u64,
        now: u64,
    ) -> bool {
        if expires_at.is_some_and(|t| t <= now) {
            return false;
        }
        self.insert(scope, key, value, expires_at, written, true)
    }

    /// Takes a delete another replica made at `written`: applied unless the
    /// key was written here later.
    pub fn merge_delete(&self, scope: &str, key: &str, written: u64) -> bool {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let Some(s) = inner.scopes.get_mut(scope) else { return false };
        if s.entries.get(key).is_none_or(|e| e.written > written) {
            return false;
        }
        inner.total -= s.remove(key);
        self.changes.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Every live entry of `scope` at `now`: key, value, expiry, write time
    /// (what a replica writes back to a shared backend that was away).
    pub fn entries(&self, scope: &str, now: u64) -> Vec<(String, String, Option<u64>, u64)> {
        let inner = self.inner.lock();
        let Some(s) = inner.scopes.get(scope) else { return Vec::new() };
        s.entries
            .iter()
            .filter(|(_, e)| e.expires_at.is_none_or(|t| t > now))
            .map(|(k, e)| (k.clone(), e.value.clone(), e.expires_at, e.written))
            .collect()
    }

    /// The live entries at `now` among the next `n` keys of `scope` after
    /// `after` (from the first, with `None`), in key order, and the key to go
    /// on from (`None`: the scope is done) — a bounded piece of work under the
    /// lock, so that copying out a full scope never holds up the plugin calls
    /// that share it.
    pub fn entries_after(
        &self,
        scope: &str,
        after: Option<&str>,
        n: usize,
        now: u64,
    ) -> (Vec<StateEntry>, Option<String>) {
        use std::ops::Bound;
        let inner = self.inner.lock();
        let Some(s) = inner.scopes.get(scope) else { return (Vec::new(), None) };
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let batch: Vec<(&String, &Entry)> = s.entries.range::<str, _>((from, Bound::Unbounded)).take(n).collect();
        let next = if batch.len() == n { batch.last().map(|(k, _)| (*k).clone()) } else { None };
        let live = batch
            .into_iter()
            .filter(|(_, e)| e.expires_at.is_none_or(|t| t > now))
            .map(|(k, e)| StateEntry {
                scope: scope.to_string(),
                key: k.clone(),
                value: e.value.clone(),
                expires_at: e.expires_at,
                written: e.written,
            })
            .collect();
        (live, next)
    }

    /// The scopes held now.
    pub fn scope_names(&self) -> Vec<String> {
        self.inner.lock().scopes.keys().cloned().collect()
    }

    /// Writes `key` to expire at `expires_at` (absolute), as written at
    /// `written`; with `only_if_newer`, not over an entry written later (a
    /// write from another replica that arrives after a newer local one).
    /// Whether it was written.
    fn insert(
        &self,
        scope: &str,
        key: &str,
        value: &str,
        expires_at: Option<u64>,
        written: u64,
        only_if_newer: bool,
    ) -> bool {
        if key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            // Counted, and logged at powers of two: a plugin writing oversized
            // entries in a loop must not flood the log.
            let mut inner = self.inner.lock();
            inner.dropped_writes += 1;
            if inner.dropped_writes.is_power_of_two() {
                tracing::warn!(
                    scope,
                    key_len = key.len(),
                    value_len = value.len(),
                    dropped = inner.dropped_writes,
                    "plugin state write too large (key ≤ 1 KiB, value ≤ 64 KiB); dropped"
                );
            }
            return false;
        }
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let limits = inner.limits;
        let s = match inner.scopes.get_mut(scope) {
            Some(s) => s,
            None => inner.scopes.entry(scope.to_string()).or_default(),
        };
        if only_if_newer && s.entries.get(key).is_some_and(|e| e.written > written) {
            return false;
        }
        inner.total -= s.remove(key);
        let need = cost(key, value);
        // Make room in this scope: its entry limit (an excess left by a lowered
        // limit drains a batch per call), then its byte bound and the total
        // (each eviction frees at least `ENTRY_OVERHEAD`, so a write of at most
        // 65 KiB evicts a few hundred entries at most).
        inner.total -= s.evict_over_limit();
        if s.entries.len() >= s.limit as usize {
            inner.total -= s.evict_oldest();
        }
        while !s.entries.is_empty() && (s.bytes + need > limits.scope_bytes || inner.total + need > limits.total_bytes)
        {
            inner.total -= s.evict_oldest();
        }
        if s.bytes + need > limits.scope_bytes || inner.total + need > limits.total_bytes {
            inner.dropped_writes += 1;
            if inner.dropped_writes.is_power_of_two() {
                tracing::warn!(scope, dropped = inner.dropped_writes, "plugin state is full; write dropped");
            }
            return false;
        }
        let seq = s.next_seq;
        s.next_seq += 1;
        s.order.insert(seq, key.to_string());
        s.entries.insert(key.to_string(), Entry { value: value.to_string(), expires_at, seq, written });
        s.bytes += need;
        inner.total += need;
        self.changes.fetch_add(1, Ordering::Relaxed);
        true
    }
}

impl StateStore for MemoryState {
    fn get(&self, scope: &str, key: &str, now_ms: u64) -> Option<String> {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let s = inner.scopes.get_mut(scope)?;
        let e = s.entries.get(key)?;
        if e.expires_at.is_some_and(|t| now_ms >= t) {
            inner.total -= s.remove(key);
            return None;
        }
        Some(e.value.clone())
    }

    fn set(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64) {
        self.insert(scope, key, value, ttl_ms.map(|t| now_ms.saturating_add(t)), now_ms, false);
    }

    fn delete(&self, scope: &str, key: &str) {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        if let Some(s) = inner.scopes.get_mut(scope) {
            inner.total -= s.remove(key);
            self.changes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn limit(&self, scope: &str, max_entries: u32) {
        let mut inner = self.inner.lock();
        let inner = &mut *inner;
        let s = match inner.scopes.get_mut(scope) {
            Some(s) => s,
            None => inner.scopes.entry(scope.to_string()).or_default(),
        };
        s.limit = max_entries.clamp(1, MAX_LIMIT);
        inner.total -= s.evict_over_limit();
    }

    fn len(&self, scope: &str) -> usize {
        self.inner.lock().scopes.get(scope).map_or(0, |s| s.entries.len())
    }

    fn bytes(&self, scope: &str) -> usize {
        self.inner.lock().scopes.get(scope).map_or(0, |s| s.bytes)
    }

    fn retain_scopes(&self, keep: &[&str]) {
        let dropped: Vec<Scope> = {
            let mut inner = self.inner.lock();
            let inner = &mut *inner;
            let gone: Vec<String> = inner.scopes.keys().filter(|n| !keep.contains(&n.as_str())).cloned().collect();
            let dropped = gone.iter().filter_map(|n| inner.scopes.remove(n)).collect();
            inner.total = inner.scopes.values().map(|s| s.bytes).sum();
            dropped
        };
        // Freed outside the lock: a full scope is 100,000 entries and more.
        if !dropped.is_empty() {
            tracing::info!(dropped = dropped.len(), "plugin state of scopes no stage uses was dropped");
        }
    }

    fn set_limits(&self, limits: StateLimits) {
        self.inner.lock().limits = limits;
    }

    fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    fn dump(&self, now: u64, max_bytes: usize) -> Vec<StateEntry> {
        let mut all = Vec::new();
        let mut bytes = 0;
        for scope in self.scope_names() {
            let mut after: Option<String> = None;
            loop {
                let (batch, next) = self.entries_after(&scope, after.as_deref(), EVICT_PER_CALL, now);
                for e in batch {
                    bytes += e.scope.len() + e.key.len() + e.value.len() + DUMP_ENTRY_OVERHEAD;
                    if bytes > max_bytes {
                        return all;
                    }
                    all.push(e);
                }
                match next {
                    Some(k) => after = Some(k),
                    None => break,
                }
            }
        }
        all
    }

    fn restore(&self, e: &StateEntry, now: u64) -> bool {
        self.merge_write(&e.scope, &e.key, &e.value, e.expires_at, e.written, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_measured_against_request_time() {
        let st = MemoryState::default();
        st.set("p", "k", "v", Some(100), 1_000);
        assert_eq!(st.get("p", "k", 1_099).as_deref(), Some("v"));
        assert_eq!(st.get("p", "k", 1_100), None);
    }

    #[test]
    fn lru_evicts_least_recently_written() {
        let st = MemoryState::default();
        st.limit("p", 2);
        st.set("p", "a", "1", None, 0);
        st.set("p", "b", "2", None, 0);
        st.set("p", "a", "1b", None, 0); // rewrite makes `a` the newest
        st.set("p", "c", "3", None, 0);
        assert_eq!(st.get("p", "b", 0), None);
        assert_eq!(st.get("p", "a", 0).as_deref(), Some("1b"));
        assert_eq!(st.get("p", "c", 0).as_deref(), Some("3"));
    }

    #[test]
    fn scopes_are_separate() {
        let st = MemoryState::default();
        st.set("p", "k", "v", None, 0);
        assert_eq!(st.get("q", "k", 0), None);
        st.delete("p", "k");
        assert_eq!(st.get("p", "k", 0), None);
        assert_eq!(st.total_bytes(), 0);
    }

    #[test]
    fn a_scope_is_bounded_in_bytes_and_the_flooder_pays() {
        let st = MemoryState::with_limits(StateLimits { scope_bytes: 1 << 20, total_bytes: 3 << 19 });
        st.limit("flood", MAX_LIMIT);
        st.set("quiet", "binding", "acct-1", None, 0);
        let big = "x".repeat(60 * 1024);
        for i in 0..1000 {
            st.set("flood", &format!("k{i}"), &big, None, 0);
        }
        assert!(st.bytes("flood") <= 1 << 20, "{}", st.bytes("flood"));
        assert!(st.get("flood", "k999", 0).is_some(), "the newest writes are kept");
        assert_eq!(st.get("flood", "k0", 0), None, "the oldest went first");
        assert_eq!(st.get("quiet", "binding", 0).as_deref(), Some("acct-1"), "another scope is untouched");
        // A second flooding scope meets the total bound and evicts only itself.
        st.limit("flood2", MAX_LIMIT);
        for i in 0..1000 {
            st.set("flood2", &format!("k{i}"), &big, None, 0);
        }
        assert!(st.total_bytes() <= 3 << 19);
        assert!(st.bytes("flood") > 900 * 1024, "the first flooder's entries stay");
        assert_eq!(st.get("quiet", "binding", 0).as_deref(), Some("acct-1"));
    }

    #[test]
    fn many_tiny_entries_count_their_overhead() {
        let st = MemoryState::with_limits(StateLimits { scope_bytes: 100 * ENTRY_OVERHEAD, total_bytes: usize::MAX });
        st.limit("p", MAX_LIMIT);
        for i in 0..10_000 {
            st.set("p", &i.to_string(), "", None, 0);
        }
        assert!(st.len("p") < 100, "{}", st.len("p"));
    }

    #[test]
    fn lowering_the_limit_of_a_full_scope_costs_a_bounded_batch_per_call() {
        let st = MemoryState::default();
        st.limit("p", MAX_LIMIT);
        let n = 10 * EVICT_PER_CALL;
        for i in 0..n {
            st.set("p", &format!("k{i}"), "", None, 0);
        }
        st.limit("p", 1);
        assert_eq!(st.len("p"), n - EVICT_PER_CALL, "one call evicted one batch");
        assert_eq!(st.get("p", "k0", 0), None, "the oldest went first");
        assert!(st.get("p", &format!("k{}", n - 1), 0).is_some());
        // Every later write drains another batch, and the scope reaches its
        // limit again.
        for i in 0..10 {
            st.set("p", &format!("new{i}"), "", None, 0);
        }
        assert_eq!(st.len("p"), 1);
        assert_eq!(st.get("p", "new9", 0).as_deref(), Some(""));
        assert_eq!(st.bytes("p"), cost("new9", ""));
        assert_eq!(st.total_bytes(), cost("new9", ""));
    }

    #[test]
    fn a_dump_copies_a_full_scope_a_batch_at_a_time_and_stops_at_its_bound() {
        let st = MemoryState::default();
        st.limit("p", MAX_LIMIT);
        let n = 3 * EVICT_PER_CALL + 7;
        for i in 0..n {
            st.set("p", &format!("k{i:05}"), "v", if i % 2 == 0 { Some(10) } else { None }, 0);
        }
        st.set("q", "k", "v", None, 0);
        let all = st.dump(20, usize::MAX);
        assert_eq!(all.len(), n / 2 + 1, "every live entry once, the expired ones left out");
        let (first, next) = st.entries_after("p", None, EVICT_PER_CALL, 20);
        assert_eq!((first.len(), next.as_deref()), (EVICT_PER_CALL / 2, Some("k01023")));
        let cost = |e: &StateEntry| e.scope.len() + e.key.len() + e.value.len() + DUMP_ENTRY_OVERHEAD;
        let bound = 10 * (1 + 6 + DUMP_ENTRY_OVERHEAD);
        let bytes: usize = st.dump(20, bound).iter().map(cost).sum();
        assert!(bytes <= bound && bytes > bound - (1 + 6 + DUMP_ENTRY_OVERHEAD), "up to the bound: {bytes}");
        assert_eq!(st.changes(), n as u64 + 1);
    }

    #[test]
    fn unused_scopes_are_dropped() {
        let st = MemoryState::default();
        st.set("old", "k", "v", None, 0);
        st.set("kept", "k", "v", None, 0);
        st.retain_scopes(&["kept"]);
        assert_eq!(st.get("old", "k", 0), None);
        assert_eq!(st.get("kept", "k", 0).as_deref(), Some("v"));
        assert_eq!(st.total_bytes(), cost("k", "v"));
    }
}

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
//! kept in B-trees (`scope`), whose every insert and remove costs O(log n),
//! never a rehash of the whole scope.
//!
//! The bytes counted against the bounds are what the store really takes on
//! the heap, at worst ([`cost`]): an entry's key (held once) and value as
//! allocated, its share of the B-trees' nodes (193 bytes), and each scope's
//! own structures — so a 1-byte key with a 1-byte value counts 257 bytes, and
//! the bounds hold for any mix of entry sizes and any number of scopes
//! (`heap_tests` measures it).
//!
//! Scopes are named by the chain (see `PluginRef::default_scope`): a built-in's
//! is `builtin:<name>`, a file's `file:<its absolute path>`, so two different
//! plugins never share state unless the operator gives them one `scope`.

pub mod cost;
mod scope;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use scope::{Entry, Scope};

/// Default entry limit of a scope until the plugin sets its own.
pub const DEFAULT_LIMIT: u32 = 10_000;
/// The most entries a plugin may ask for.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest key accepted; longer writes are dropped (and logged).
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest value accepted.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// What one entry is charged beyond its key and value as allocated: its share
/// of the store's B-tree nodes, at worst (see [`cost`]).
pub const ENTRY_OVERHEAD: usize = scope::ENTRY_NODES;
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

struct Inner {
    scopes: HashMap<Box<str>, Scope>,
    total: usize,
    limits: StateLimits,
    dropped_writes: u64,
}

/// The scope `name`, made (and charged to `total`) if it is new.
fn scope_of<'a>(scopes: &'a mut HashMap<Box<str>, Scope>, total: &mut usize, name: &str) -> &'a mut Scope {
    if !scopes.contains_key(name) {
        let s = Scope::new(name);
        *total += s.bytes;
        scopes.insert(name.into(), s);
    }
    scopes.get_mut(name).expect("just made")
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

    /// Bytes held across all scopes, as counted against the total bound
    /// (what they take on the heap, at worst: see [`cost`]).
    pub fn total_bytes(&self) -> usize {
        self.inner.lock().total
    }

    /// Writes refused because they could not fit.
    pub fn dropped_writes(&self) -> u64 {
        self.inner.lock().dropped_writes
    }

    /// [`StateStore::set`], and whether the write was kept: `false` when it
    /// was too large or could not fit (what a replica must not share).
    pub fn write(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64) -> bool {
        self.insert(scope, key, value, ttl_ms.map(|t| now_ms.saturating_add(t)), now_ms, false)
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
            .filter(|(_, e)| e.live_at(now))
            .map(|(k, e)| (k.to_string(), e.value.to_string(), e.expires_at(), e.written))
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
        let batch: Vec<(&std::sync::Arc<str>, &Entry)> =
            s.entries.range::<str, _>((from, Bound::Unbounded)).take(n).collect();
        let next = if batch.len() == n { batch.last().map(|(k, _)| k.to_string()) } else { None };
        let live = batch
            .into_iter()
            .filter(|(_, e)| e.live_at(now))
            .map(|(k, e)| StateEntry {
                scope: scope.to_string(),
                key: k.to_string(),
                value: e.value.to_string(),
                expires_at: e.expires_at(),
                written: e.written,
            })
            .collect();
        (live, next)
    }

    /// The scopes held now.
    pub fn scope_names(&self) -> Vec<String> {
        self.inner.lock().scopes.keys().map(|n| n.to_string()).collect()
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
        let s = scope_of(&mut inner.scopes, &mut inner.total, scope);
        if only_if_newer && s.entries.get(key).is_some_and(|e| e.written > written) {
            return false;
        }
        inner.total -= s.remove(key);
        let need = scope::entry_cost(key, value);
        // Make room in this scope: its entry limit (an excess left by a lowered
        // limit drains a batch per call), then its byte bound and the total
        // (each eviction frees more than `ENTRY_OVERHEAD`, so a write of at most
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
        inner.total += s.add(key, value, expires_at, written);
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
        if !e.live_at(now_ms) {
            inner.total -= s.remove(key);
            return None;
        }
        Some(e.value.to_string())
    }

    fn set(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64) {
        self.write(scope, key, value, ttl_ms, now_ms);
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
        let s = scope_of(&mut inner.scopes, &mut inner.total, scope);
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
            let gone: Vec<Box<str>> = inner.scopes.keys().filter(|n| !keep.contains(&&***n)).cloned().collect();
            let dropped = gone.iter().filter_map(|n| inner.scopes.remove(n)).collect();
            // The table's slots are charged per scope: give back those of the
            // scopes gone.
            inner.scopes.shrink_to_fit();
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
mod heap_tests;
#[cfg(test)]
mod tests;

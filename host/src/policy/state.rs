//! Plugin state: a small key-value store per plugin scope, with TTLs and an LRU cap.
//!
//! Rankers are instantiated many times and replaced at will, so what must outlive
//! an instance (affinity bindings) lives here, keyed by the plugin's scope (its
//! name). Time is the request's `now-ms`, never the wall clock, so a fixture that
//! says "1 ms past the TTL" means exactly that.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

/// Default entry limit of a scope until the plugin sets its own.
pub const DEFAULT_LIMIT: u32 = 10_000;
/// The most entries a plugin may ask for.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest key and value accepted; longer writes are dropped (and logged).
pub const MAX_KEY_BYTES: usize = 1024;
/// Longest value accepted.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

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
}

struct Entry {
    value: String,
    expires_at: Option<u64>,
    seq: u64,
}

struct Scope {
    entries: HashMap<String, Entry>,
    /// Write order: seq → key. The first entry is the least recently written.
    order: BTreeMap<u64, String>,
    limit: u32,
    next_seq: u64,
}

impl Default for Scope {
    fn default() -> Self {
        Scope { entries: HashMap::new(), order: BTreeMap::new(), limit: DEFAULT_LIMIT, next_seq: 0 }
    }
}

impl Scope {
    fn remove(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            self.order.remove(&e.seq);
        }
    }

    fn evict_to(&mut self, limit: usize) {
        while self.entries.len() > limit {
            let Some((_, key)) = self.order.pop_first() else { break };
            self.entries.remove(&key);
        }
    }
}

/// Plugin state held in this process.
#[derive(Default)]
pub struct MemoryState {
    scopes: Mutex<HashMap<String, Scope>>,
}

impl StateStore for MemoryState {
    fn get(&self, scope: &str, key: &str, now_ms: u64) -> Option<String> {
        let mut scopes = self.scopes.lock();
        let s = scopes.get_mut(scope)?;
        let e = s.entries.get(key)?;
        if e.expires_at.is_some_and(|t| now_ms >= t) {
            s.remove(key);
            return None;
        }
        Some(e.value.clone())
    }

    fn set(&self, scope: &str, key: &str, value: &str, ttl_ms: Option<u64>, now_ms: u64) {
        if key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES {
            tracing::warn!(
                scope,
                key_len = key.len(),
                value_len = value.len(),
                "plugin state write too large; dropped"
            );
            return;
        }
        let mut scopes = self.scopes.lock();
        let s = scopes.entry(scope.to_string()).or_default();
        s.remove(key);
        let seq = s.next_seq;
        s.next_seq += 1;
        s.order.insert(seq, key.to_string());
        s.entries.insert(
            key.to_string(),
            Entry { value: value.to_string(), expires_at: ttl_ms.map(|t| now_ms.saturating_add(t)), seq },
        );
        let limit = s.limit as usize;
        s.evict_to(limit);
    }

    fn delete(&self, scope: &str, key: &str) {
        if let Some(s) = self.scopes.lock().get_mut(scope) {
            s.remove(key);
        }
    }

    fn limit(&self, scope: &str, max_entries: u32) {
        let mut scopes = self.scopes.lock();
        let s = scopes.entry(scope.to_string()).or_default();
        s.limit = max_entries.clamp(1, MAX_LIMIT);
        let limit = s.limit as usize;
        s.evict_to(limit);
    }

    fn len(&self, scope: &str) -> usize {
        self.scopes.lock().get(scope).map_or(0, |s| s.entries.len())
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
    }
}

//! The memory a plugin instance may hold, counted across everything it owns.
//!
//! A component is many core instances, each of which may declare several linear
//! memories and tables; a cap checked per memory lets a component with 64
//! memories hold 64 times the cap. Here every memory and table of one instance
//! (one store) draws from one budget, and their number is capped too.
//!
//! The limits on what one host call may carry live here too: the sandbox
//! enforces them and a fault's message names them.

use wasmtime::ResourceLimiter;

/// The most bytes one call may pass from the guest to the host: every string
/// and list of its arguments (or of the answer of a `rank`, `observe` or
/// `configure`) together. Fifteen times the largest legitimate payload — a
/// state value (64 KiB) with its key, a 64 KiB stdout write (what `check-write`
/// allows) — and small enough that copying it costs under 0.1 ms.
pub const MAX_HOSTCALL_BYTES: usize = 1 << 20;
/// The most bytes one `get-random-bytes` or `get-insecure-random-bytes` call may
/// ask for. WebCrypto's `getRandomValues` has the same quota, so JavaScript
/// runtimes already ask for no more; CPython asks for 256 bytes at a time.
/// Generating them costs about 0.2 ms.
pub const MAX_RANDOM_BYTES: u64 = 64 << 10;

/// Linear memories one plugin instance may have. componentize-py and
/// componentize-js components use a handful; 16 leaves room without letting a
/// component multiply its cap.
pub const MAX_MEMORIES: usize = 16;
/// Tables one plugin instance may have.
pub const MAX_TABLES: usize = 64;
/// Core instances one plugin instance may have (componentize-py needs 38).
pub const MAX_CORE_INSTANCES: usize = 64;
/// What one table element is counted as, in bytes (a function reference).
const TABLE_ELEMENT_BYTES: usize = 8;

/// Caps one instance's memories and tables together; remembers a refused growth
/// so the trap that usually follows is reported as `oom`.
pub struct Limiter {
    cap: usize,
    used: usize,
    pub(crate) denied: bool,
}

impl Limiter {
    /// A limiter allowing `cap` bytes across all memories and tables.
    pub fn new(cap: usize) -> Self {
        Limiter { cap, used: 0, denied: false }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used
    }

    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let after = self.used.saturating_sub(current).saturating_add(desired);
        if after > self.cap {
            self.denied = true;
            return false;
        }
        self.used = after;
        true
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let bytes = |n: usize| n.saturating_mul(TABLE_ELEMENT_BYTES);
        Ok(self.grow(bytes(current), bytes(desired)))
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }
    fn tables(&self) -> usize {
        MAX_TABLES
    }
    fn memories(&self) -> usize {
        MAX_MEMORIES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_memory_draws_from_one_budget() {
        let mut l = Limiter::new(100);
        assert!(l.memory_growing(0, 60, None).unwrap());
        assert!(!l.memory_growing(0, 60, None).unwrap(), "a second memory shares the cap");
        assert!(l.denied);
        assert!(l.memory_growing(60, 90, None).unwrap(), "growing the first counts only the difference");
        assert_eq!(l.used(), 90);
        assert!(!l.table_growing(0, 2, None).unwrap(), "tables count too");
        assert!(l.table_growing(0, 1, None).unwrap());
    }
}

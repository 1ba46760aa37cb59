//! The bounds hold on the real heap: a counting allocator measures what the
//! store takes while mixes of tiny and large entries are written across 1 to
//! 64 scopes, and the measure must stay within what the store charges, and so
//! within the configured total.
//!
//! The allocator is the global allocator of the lib's unit tests (only under
//! `cfg(test)`; the binary keeps the system allocator). It passes everything
//! to the system allocator and counts, per thread, the bytes of each chunk as
//! glibc's malloc holds it (`malloc_usable_size` and its 8-byte header) — the
//! figure resident memory grows by, not the sizes asked for. Counting per
//! thread keeps tests running beside each other out of one another's figures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use super::*;

struct Counting;

thread_local! {
    /// Bytes allocated and not freed by this thread.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The most `LIVE` reached since it was last reset.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

/// The bytes of the chunk at `p`, header included.
///
/// # Safety
/// `p` must be a live allocation of the system allocator.
unsafe fn chunk(p: *mut u8) -> isize {
    // SAFETY: as the caller promises, `p` came from malloc and is live.
    (unsafe { libc::malloc_usable_size(p.cast()) } + 8) as isize
}

fn count(delta: isize) {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is passed to `System` as it came; only counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's promises are System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            // SAFETY: just allocated.
            count(unsafe { chunk(p) });
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            // SAFETY: just allocated.
            count(unsafe { chunk(p) });
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: `p` is live until freed below.
        count(-unsafe { chunk(p) });
        // SAFETY: the caller's promises are System's.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `p` is live until reallocated.
        let old = unsafe { chunk(p) };
        // SAFETY: the caller's promises are System's.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            // SAFETY: just allocated (or kept).
            count(unsafe { chunk(q) } - old);
        }
        q
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// Runs `f` and returns the most the heap grew above `base` while it ran.
fn peak_during(base: isize, f: impl FnOnce()) -> isize {
    PEAK.with(|p| p.set(live()));
    f();
    PEAK.with(Cell::get) - base
}

/// splitmix64: a reproducible stream of numbers, so that a failing mix can be
/// run again by its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let out = crate::random::splitmix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        out
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// What one mix writes: its entries' sizes and how it spreads them.
#[derive(Debug, Clone, Copy)]
struct Mix {
    seed: u64,
    scopes: usize,
    scope_mb: usize,
    total_mb: usize,
    /// Percent of writes with a 64 KiB value (the rest: 0 to 2 bytes, and
    /// now and then a mid-sized one).
    large: u64,
    /// Whether deletes, TTLs and lowered limits come between the writes
    /// (without: a plain flood).
    churn: bool,
}

/// Bytes the heap may exceed the configured total by: each scope's own
/// structures when they are made in a full store (a new scope is never
/// refused; the writer that filled the store evicts to make room for it with
/// its next write), and 4 KiB for the scopes' hash table's rounding.
fn slack(m: &Mix) -> isize {
    (m.scopes * scope::scope_cost("scope-63") + 4096) as isize
}

/// Writes the mix's entries (three times the total's worth of charges) with
/// deletes, reads past TTLs, lowered and raised limits, replicated writes and
/// a reload that drops scopes between them, checking after every call that
/// the heap holds no more than the store charges and the store no more than
/// the bounds allow. The most the heap grew, and what the store charged at the
/// end.
fn run(m: Mix) -> (isize, usize) {
    let mut rng = Rng(m.seed);
    let limits = StateLimits { scope_bytes: m.scope_mb << 20, total_bytes: m.total_mb << 20 };
    let names: Vec<String> = (0..m.scopes).map(|i| format!("scope-{i}")).collect();
    let big = "v".repeat(MAX_VALUE_BYTES);
    let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_";
    let long_key = "k".repeat(MAX_KEY_BYTES);
    let base = live();
    let st = MemoryState::with_limits(limits);
    let bound = (limits.total_bytes as isize) + slack(&m);
    let mut written = 0usize;
    let mut most = 0isize;
    let mut now = 1_000u64;
    while written < 3 * limits.total_bytes {
        // A few scopes take most writes, as a flooding plugin would.
        let scope = &names[if rng.chance(70) {
            rng.range(0, (m.scopes as u64 - 1).min(2))
        } else {
            rng.range(0, m.scopes as u64 - 1)
        } as usize];
        let mut buf = [0u8; 8];
        let len = rng.range(1, 8) as usize;
        for b in &mut buf[..len] {
            *b = alphabet[rng.range(0, 63) as usize];
        }
        let tiny_key = std::str::from_utf8(&buf[..len]).expect("ascii");
        let key = if rng.chance(1) { &long_key[..rng.range(9, MAX_KEY_BYTES as u64) as usize] } else { tiny_key };
        let value = match rng.range(0, 99) {
            p if p < m.large => &big[..],
            p if p < m.large + 5 => &big[..rng.range(3, 2048) as usize],
            _ => &big[..rng.range(0, 2) as usize],
        };
        let op = if m.churn { rng.range(0, 99) } else { 0 };
        let grew = peak_during(base, || match op {
            0..=89 => st.set(scope, key, value, None, now),
            90..=93 => st.delete(scope, key),
            94..=95 => {
                // Tiny: what a read returns is a copy, which must not count.
                st.set(scope, key, &big[..rng.range(0, 2) as usize], Some(rng.range(1, 50)), now);
                now += rng.range(0, 60);
                drop(st.get(scope, key, now));
            }
            96 => {
                let limit = if rng.chance(30) { rng.range(1, 64) as u32 } else { MAX_LIMIT };
                st.limit(scope, limit);
            }
            _ => {
                st.merge_write(scope, key, value, None, now.saturating_sub(rng.range(0, 5)), now);
            }
        });
        written += scope::entry_cost(key, value);
        if written > limits.total_bytes && written - scope::entry_cost(key, value) <= limits.total_bytes {
            // A reload that keeps half of the scopes.
            let keep: Vec<&str> = names.iter().step_by(2).map(String::as_str).collect();
            st.retain_scopes(&keep);
        }
        most = most.max(grew);
        let held = live() - base;
        assert!(
            held <= st.total_bytes() as isize + 4096,
            "{m:?}: the heap holds {held} bytes, {} charged",
            st.total_bytes()
        );
        assert!(grew <= bound, "{m:?}: the heap grew {grew} bytes in one call, past {bound}");
    }
    let charged = st.total_bytes();
    drop(st);
    assert!(live() - base <= 0, "{m:?}: {} bytes not freed with the store", live() - base);
    (most, charged)
}

#[test]
fn any_mix_of_entries_and_scopes_stays_within_the_configured_total() {
    let mut rng = Rng(22);
    let mut mixes = vec![
        // Tiny entries only, across 1, 8 and 64 scopes; then large values.
        Mix { seed: 1, scopes: 1, scope_mb: 1, total_mb: 1, large: 0, churn: false },
        Mix { seed: 2, scopes: 8, scope_mb: 1, total_mb: 2, large: 0, churn: false },
        Mix { seed: 3, scopes: 64, scope_mb: 1, total_mb: 2, large: 0, churn: false },
        Mix { seed: 4, scopes: 8, scope_mb: 1, total_mb: 2, large: 60, churn: false },
    ];
    for seed in 5..17 {
        let total_mb = rng.range(1, 2) as usize;
        mixes.push(Mix {
            seed,
            scopes: rng.range(1, 64) as usize,
            scope_mb: rng.range(1, total_mb as u64) as usize,
            total_mb,
            large: [0, 1, 10, 50][rng.range(0, 3) as usize],
            churn: rng.chance(50),
        });
    }
    for m in mixes {
        let (most, charged) = run(m);
        let bound = ((m.total_mb << 20) as isize) + slack(&m);
        assert!(most <= bound, "{m:?}: the heap grew {most} bytes, past {bound}");
        // The charges bound the heap without inflating it much (and a
        // counting allocator that counted nothing would fail here).
        assert!(most as f64 >= 0.5 * charged as f64, "{m:?}: the heap grew {most} bytes for {charged} charged");
        eprintln!("{m:?}: heap grew at most {most} bytes; {charged} charged at the end");
    }
}

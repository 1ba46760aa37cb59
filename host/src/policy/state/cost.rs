//! What plugin state costs in memory: the bytes one entry and one scope are
//! charged against `[policy.state]`'s bounds.
//!
//! A charge is a bound on the heap the store really takes, not an estimate:
//! the bounds are the operator's promise about the gateway's memory, and a
//! store charged at a third of its cost (a fixed 96 bytes per entry, each key
//! held twice, the B-trees' nodes not counted) let eight scopes under a 128 MiB
//! total take 407 MB. What is charged, and why:
//!
//! - **the key**, held once in an `Arc<str>` (its 16-byte count header, its
//!   bytes) shared by the key index and the write order;
//! - **the value**, in a `Box<str>` (nothing for an empty one);
//! - **its share of the two B-trees' nodes** (the key index and the write
//!   order). A std B-tree node holds up to [`BTREE_CAPACITY`] elements, and
//!   every node but the root at least [`BTREE_MIN_LEN`] — its splits and
//!   removals keep it so — so at worst a node is shared by five entries, and
//!   its inner nodes (one per six children at most) add a sixth of that;
//! - every allocation as the allocator takes it ([`heap`]: glibc's malloc,
//!   the system allocator poolgate runs on, puts an 8-byte header before each
//!   chunk and rounds to 16 bytes, at least 32).
//!
//! A scope is charged its name, its slot in the scopes' hash table (at most
//! four slots per scope: the table doubles past seven eighths full and starts
//! at four), and the root nodes of its two B-trees (see `SCOPE_FIXED`).
//!
//! Charging the worst case means a store usually holds less than its bound
//! (measured: about four fifths of it for tiny entries); the other way, the
//! bound would not hold. The unit test `heap_tests` measures the real heap with
//! a counting allocator against these charges for mixes of tiny and large
//! entries across up to 64 scopes.

/// Elements one node of a std B-tree holds (`alloc::collections::btree`'s
/// `CAPACITY`).
pub const BTREE_CAPACITY: usize = 11;
/// The fewest elements a node other than the root holds (its `MIN_LEN`).
pub const BTREE_MIN_LEN: usize = 5;

/// Bytes the allocator takes for a request of `n` bytes (glibc malloc on a
/// 64-bit target: an 8-byte chunk header, rounded up to 16, at least 32);
/// nothing for `n == 0`, which is never allocated.
pub const fn heap(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let chunk = (n + 8 + 15) & !15;
    if chunk < 32 { 32 } else { chunk }
}

/// Bytes of a B-tree leaf node with keys of `k` and values of `v` bytes: its
/// parent pointer, parent index and length, then the keys and values.
const fn leaf_node(k: usize, v: usize) -> usize {
    (8 + 2 + 2 + BTREE_CAPACITY * (k + v)).next_multiple_of(8)
}

/// Bytes of an inner node: a leaf and its `CAPACITY + 1` child pointers.
const fn inner_node(k: usize, v: usize) -> usize {
    leaf_node(k, v) + (BTREE_CAPACITY + 1) * 8
}

/// The most bytes of nodes a B-tree of `K → V` takes per element. With `N`
/// nodes, `I` of them inner: `n ≥ 1 + MIN_LEN·(N − 1)` elements, and
/// `N − 1 ≥ 2 + 6·(I − 1)` child edges, so the nodes take at most
/// `N·leaf + I·(inner − leaf) ≤ (n/5 + 1)·(leaf + (inner − leaf)/6) +
/// (inner − leaf)/2`: this per element, [`btree_fixed`] for the rest.
pub const fn btree_per_element(k: usize, v: usize) -> usize {
    let (leaf, inner) = (heap(leaf_node(k, v)), heap(inner_node(k, v)));
    (6 * leaf + (inner - leaf)).div_ceil(6 * BTREE_MIN_LEN)
}

/// The bytes of a B-tree's nodes not covered per element (see
/// [`btree_per_element`]): its root, however few elements it holds.
pub const fn btree_fixed(k: usize, v: usize) -> usize {
    let (leaf, inner) = (heap(leaf_node(k, v)), heap(inner_node(k, v)));
    leaf + (inner - leaf).div_ceil(6) + (inner - leaf).div_ceil(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_model_is_glibc_on_64_bits() {
        assert_eq!((heap(0), heap(1), heap(24), heap(25), heap(40), heap(41)), (0, 32, 32, 48, 48, 64));
    }
}

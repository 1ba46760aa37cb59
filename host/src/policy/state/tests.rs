//! The store's behaviour: TTLs, eviction order, bounds, dumps.

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
    assert_eq!(st.total_bytes(), scope::scope_cost("p"), "an empty scope counts its own structures");
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
    let scope_bytes = scope::scope_cost("p") + 100 * ENTRY_OVERHEAD;
    let st = MemoryState::with_limits(StateLimits { scope_bytes, total_bytes: usize::MAX });
    st.limit("p", MAX_LIMIT);
    for i in 0..10_000 {
        st.set("p", &i.to_string(), "", None, 0);
    }
    assert!(st.len("p") < 100, "{}", st.len("p"));
    assert!(st.bytes("p") <= scope_bytes);
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
    assert_eq!(st.bytes("p"), scope::scope_cost("p") + scope::entry_cost("new9", ""));
    assert_eq!(st.total_bytes(), scope::scope_cost("p") + scope::entry_cost("new9", ""));
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
    assert_eq!(st.total_bytes(), scope::scope_cost("kept") + scope::entry_cost("k", "v"));
}

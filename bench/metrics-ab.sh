#!/usr/bin/env bash
# The cost of the metrics a request updates, hand-written (the exposition code
# poolgate had until it moved to prometheus-client) against prometheus-client,
# in one run: the same four updates per request (chain duration, upstream
# latency, attempt, request) over four accounts, and one scrape's render.
#
#   bench/metrics-ab.sh [old-rev]     (default: bcf2ef5, the last hand-written one)
#
# Builds a throwaway crate in a temp dir from `git show <old-rev>:…metrics.rs`
# and the working tree's metrics.rs; prints ns per request and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
old_rev=${1:-bcf2ef5}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<'TOML'
[package]
name = "metrics-ab"
version = "0.1.0"
edition = "2024"
[dependencies]
parking_lot = "0.12"
prometheus-client = "0.24"
[workspace]
TOML
strip() { sed 's/crate::policy::Phase/crate::Phase/g' | sed '/#\[cfg(test)\]/,$d'; }
git show "$old_rev:host/src/gateway/metrics.rs" | strip > "$dir/src/old.rs"
strip < host/src/gateway/metrics.rs > "$dir/src/new.rs"
cat > "$dir/src/main.rs" <<'RS'
#![allow(dead_code, reason = "both implementations carry what the gateway uses")]
mod new;
mod old;
use std::time::Instant;
#[derive(Clone, Copy)]
pub enum Phase { Rank, Observe }
impl Phase {
    pub fn as_str(self) -> &'static str { match self { Phase::Rank => "rank", Phase::Observe => "observe" } }
}
fn main() {
    let n = 2_000_000u64;
    let accounts = ["acct-0", "acct-1", "acct-2", "acct-3"];
    for round in 1..=3 {
        let o = old::Metrics::default();
        let t = Instant::now();
        for i in 0..n {
            let a = accounts[(i % 4) as usize];
            o.chain_duration(0.00001); o.upstream_latency(a, 0.2); o.attempt(a, Some(200)); o.request(a, 200);
        }
        let old_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let m = new::Metrics::default();
        let t = Instant::now();
        for i in 0..n {
            let a = accounts[(i % 4) as usize];
            m.chain_duration(0.00001); m.upstream_latency(a, 0.2); m.attempt(a, Some(200)); m.request(a, 200);
        }
        let new_ns = t.elapsed().as_nanos() as f64 / n as f64;
        let t = Instant::now();
        for _ in 0..1000 { std::hint::black_box(o.render(&[])); }
        let old_render = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        for _ in 0..1000 { std::hint::black_box(m.render(&[])); }
        let new_render = t.elapsed().as_secs_f64() * 1e3;
        println!(
            "round {round}: per request: hand-written {old_ns:.0} ns, prometheus-client {new_ns:.0} ns (ratio {:.2}); \
             one scrape: {old_render:.1} µs vs {new_render:.1} µs",
            new_ns / old_ns
        );
    }
}
RS
CARGO_TARGET_DIR="$dir/target" cargo build --release --quiet --manifest-path "$dir/Cargo.toml"
"$dir/target/release/metrics-ab"

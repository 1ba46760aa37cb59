#!/usr/bin/env bash
# What poolgate adds on top of a direct call, measured in one run against the
# mock upstream, beside two other hops in front of the same mock: HAProxy (when
# on PATH; Debian: apt-get install haproxy) and poolgate-passthrough, a bare
# hyper pass-through (the floor of any hyper-based proxy). Every figure is shown
# absolute and as a ratio to HAProxy and to the pass-through:
# - JSON requests: latency at c=1, throughput at c=32, CPU per request at both;
# - streams of realistic Anthropic SSE (50 and 500 text deltas of ~36 B): CPU
#   per streamed request at c=32, CPU per relayed event, added time to first
#   byte at c=1;
# - memory with 1,000 and 10,000 open streams (HTTP/2 from the client, 100 per
#   connection): RSS idle, at the height, and --settle (120) s after they close.
# Requests are shaped like Claude Code's (about 20 headers, a session in
# metadata); `--bare-request` sends the three-header request of the first
# version. Quote the ratios beside any absolute CPU figure, which moves 4x
# between VMs. `--quick` for a short run (~1 min); a full run takes ~10 min.
#
# Usage: bench/overhead.sh [--quick] [--no-json] [--no-stream] [--no-memory]
#                          [--chain a,b,c] [--no-ledger] [--tracing]
#                          [--streams 1000,10000] [--settle S] [--deltas 50,500]
#                          [--delta-gap-ms 1] [--haproxy-no-delay]
#                          [--bare-request] [--no-haproxy] [--sse] …
#                          (poolgate-loadgen --help lists them all)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p poolgate -p poolgate-mock-upstream -p poolgate-loadgen
exec "$target/release/poolgate-loadgen" --bin "$target/release" --mock-bin "$target/release" "$@"

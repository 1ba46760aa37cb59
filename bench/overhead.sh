#!/usr/bin/env bash
# What poolgate adds on top of a direct call, measured in one run against the
# mock upstream and, when `haproxy` is on PATH (Debian: apt-get install haproxy),
# against a plain HAProxy hop: latency at concurrency 1, throughput at 32, CPU
# per request of each hop at c=1 and c=32 apart, and memory with 1,000 open SSE
# streams. Requests are shaped like Claude Code's (about 20 headers, a session
# in metadata); `--bare-request` sends the three-header request of the first
# version. Figures go in docs/benchmarks.md: quote the ratio to HAProxy beside
# any absolute CPU figure, which moves 4x between VMs.
#
# Usage: bench/overhead.sh [--sse] [--requests N] [--seconds S] [--streams N]
#                          [--chain a,b] [--bare-request] [--no-haproxy]
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p poolgate -p poolgate-mock-upstream -p poolgate-loadgen
exec "$target/release/poolgate-loadgen" --bin "$target/release" "$@"

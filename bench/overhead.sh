#!/usr/bin/env bash
# What poolgate adds on top of a direct call, measured in one run against the
# mock upstream: latency at concurrency 1, throughput at 32, CPU per request and
# memory with 1,000 open SSE streams. Figures go in docs/benchmarks.md.
#
# Usage: bench/overhead.sh [--sse] [--requests N] [--seconds S] [--streams N]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p poolgate -p poolgate-mock-upstream -p poolgate-loadgen
exec target/release/poolgate-loadgen --bin target/release "$@"

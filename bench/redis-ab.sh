#!/usr/bin/env bash
# What sharing state through Redis costs a request, against the embedded
# backend, in one run: the same load (bench/overhead.sh's) through a gateway
# with `[state] backend = "memory"` and one with `backend = "redis"` (a
# redis-server of its own on a free loopback port), interleaved
# memory, redis, memory, redis so drift on a shared machine hits both; then
# once more each with `max_in_flight` set, so every request also takes and
# gives back a lease in Redis. Figures go in docs/benchmarks.md.
#
# Usage: bench/redis-ab.sh [loadgen options, e.g. --seconds 6 --requests 2000]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p poolgate -p poolgate-mock-upstream -p poolgate-loadgen
command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
url="redis://127.0.0.1:$port"
run() {
    local label=$1; shift
    local before after
    before=$(awk '{print $14+$15}' /proc/$redis_pid/stat)
    echo "== $label"
    target/release/poolgate-loadgen --bin target/release --streams 200 "$@" | grep -E 'added|ratio|per request|^\{'
    after=$(awk '{print $14+$15}' /proc/$redis_pid/stat)
    echo "   redis-server CPU during the run: $(( (after - before) * 10 )) ms"
}
for round in 1 2; do
    run "memory (round $round)" "$@"
    run "redis (round $round)" --redis "$url" "$@"
done
run "memory, max_in_flight 64" --max-in-flight 64 "$@"
run "redis, max_in_flight 64 (a lease per request)" --redis "$url" --max-in-flight 64 "$@"

#!/usr/bin/env bash
# Instructions the gateway executes per request, counted by valgrind's
# callgrind: unlike CPU time, the count holds on a busy or shared machine, so
# two builds compare within a percent where the loadgen's CPU figure moves by
# ±30 % from run to run.
#
#   bench/instructions.sh <bin dir A> <bin dir B> [requests] [body bytes]
#
# Each bin dir holds release builds of `poolgate` and `poolgate-mock-upstream`
# (e.g. target/release, or a copy of an older build's). For each, it starts
# the mock upstream and `poolgate serve` under callgrind (8 accounts,
# skip-exhausted → headroom, as bench/loadgen's `--chain`), sends 100 warm-up
# requests, zeroes the counters, sends <requests> (default 1000) Messages
# requests with a <body bytes> body (default: a small one), one connection,
# keep-alive, and prints instructions per request for A and B and B/A.
# Needs valgrind and python3. Loopback only.
#
# EXTRA_A / EXTRA_B: TOML appended to A's / B's config, to compare one build
# with a setting off and on. `@WORK@` in it is the run's scratch directory.
# What the usage ledger costs per request:
#
#   EXTRA_A=$'[ledger]\nfile = ""' EXTRA_B=$'[ledger]\nfile = "@WORK@/ledger.sqlite"' \
#     bench/instructions.sh target/release target/release 1000
#
# MOCK_ARGS: more arguments for the mock upstream, e.g. `--utilization 0.3`
# (it then sends the unified quota headers an Anthropic answer carries, which
# the gateway reads, learns from and pools into the client's answer).
#
# SETTLE_S: seconds to wait after the last request before reading the count,
# so work the requests left behind (spans still to export) is counted.
#
# The gateway runs with POOLGATE_EPOCH_TICK_MS=50 (host/src/policy/engine.rs):
# under valgrind code runs some 50 times slower, and with the native 1 ms tick
# most plugin calls would yield (730 of 1,200 calls measured) — a path a native
# run almost never takes — so the count would be valgrind's, not the request
# path's. A build that does not know the variable ignores it: compare builds
# that both do (docs/benchmarks.md says which baseline).
set -euo pipefail
a=${1:?bin dir A}
b=${2:?bin dir B}
n=${3:-1000}
body_bytes=${4:-0}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

send() { # port count
    python3 - "$1" "$2" "$body_bytes" <<'PY'
import http.client, json, sys
port, count, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
text = "hello" if size == 0 else ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64,
                   "messages": [{"role": "user", "content": text}]})
c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
for _ in range(count):
    c.request("POST", "/v1/messages", body, {"content-type": "application/json",
              "anthropic-version": "2023-06-01", "x-api-key": "bench-client"})
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status
PY
}

measure() { # bin dir, extra TOML -> instructions per request
    local bin=$1 extra=${2:-} mock_port gw_port
    mock_port=$(free_port)
    "$bin/poolgate-mock-upstream" --listen "127.0.0.1:$mock_port" --accept-any ${MOCK_ARGS:-} >"$work/mock.log" 2>&1 &
    local mock=$!
    gw_port=$(free_port)
    {
        echo "[server]"
        echo "listen = \"127.0.0.1:$gw_port\""
        echo "[state]"
        echo "file = \"\""
        for i in 0 1 2 3 4 5 6 7; do
            printf '[[accounts]]\nid = "acct-%s"\napi_key_env = "BENCH_KEY"\nbase_url = "http://127.0.0.1:%s"\n' "$i" "$mock_port"
        done
        printf '[[policy.chain]]\nplugin = "builtin:skip-exhausted"\n[[policy.chain]]\nplugin = "builtin:headroom"\n'
        printf '%s\n' "${extra//@WORK@/$work}"
    } >"$work/poolgate.toml"
    # An older build may not know `[state] file`: drop it if the file is refused.
    if ! BENCH_KEY=k "$bin/poolgate" check --config "$work/poolgate.toml" >/dev/null 2>&1; then
        sed -i '/^\[state\]$/,/^file = ""$/d' "$work/poolgate.toml"
    fi
    XDG_STATE_HOME="$work/state" BENCH_KEY=k POOLGATE_LOG=warn POOLGATE_EPOCH_TICK_MS=${POOLGATE_EPOCH_TICK_MS:-50} valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" \
        "$bin/poolgate" serve --config "$work/poolgate.toml" >"$work/gw.log" 2>&1 &
    local gw=$!
    for _ in $(seq 600); do
        grep -q "listening on" "$work/gw.log" && break
        sleep 0.5
    done
    grep -q "listening on" "$work/gw.log" || { cat "$work/gw.log" >&2; exit 1; }
    send "$gw_port" 100
    callgrind_control -z "$gw" >/dev/null 2>&1
    send "$gw_port" "$n"
    # Work the requests leave behind (a batch of spans still to export) is
    # theirs too: SETTLE_S seconds for it before the count is read.
    sleep "${SETTLE_S:-0}"
    callgrind_control -d "$gw" >/dev/null 2>&1
    local total
    total=$(for f in "$work"/cg."$gw".*; do sed -n 's/^summary: //p' "$f"; done | awk '{s+=$1} END {printf "%.0f", s}')
    kill "$gw" "$mock" 2>/dev/null || true
    wait "$gw" "$mock" 2>/dev/null || true
    [ -n "${KEEP_CALLGRIND:-}" ] && cp "$work"/cg."$gw".* "$KEEP_CALLGRIND/" 2>/dev/null
    rm -f "$work"/cg.*
    echo $((total / n))
}

ia=$(measure "$a" "${EXTRA_A:-}")
ib=$(measure "$b" "${EXTRA_B:-}")
echo "instructions per request ($n requests, body ${body_bytes:-small} bytes):"
echo "  A $a: $ia"
echo "  B $b: $ib"
python3 -c "print(f'  B/A: {$ib/$ia:.3f}')"

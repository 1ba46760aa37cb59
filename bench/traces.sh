#!/usr/bin/env bash
# What tracing costs a request: instructions per request (callgrind, through
# bench/instructions.sh: 8 accounts, skip-exhausted → headroom, 1,000 JSON
# Messages requests) with `[telemetry]` off, on at 100 % sampling and on at
# 1 %, each against off in the same run.
#
#   bench/traces.sh <bin dir> [requests]
#
# Tracing on exports to a sink on a free loopback port that takes every
# OTLP/HTTP export (a 200 with an empty ExportTraceServiceResponse) — the
# gateway's side of it is all that is counted: building the spans, the queue,
# batching, protobuf encoding and the HTTP export. Each run waits 2 s after
# its last request, so the last batch is exported inside the count.
# For the tracing-off path against a build without tracing, use
# bench/instructions.sh <old bin dir> <new bin dir> directly.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:?bin dir}
n=${2:-1000}
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
python3 - "$port" <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
sink=$!
trap 'kill $sink 2>/dev/null || true' EXIT
on() { printf '[telemetry]\nendpoint = "http://127.0.0.1:%s"\nsampling = %s\n' "$port" "$1"; }
export SETTLE_S=2
echo "== tracing off (A) vs on, 100 % sampled (B)"
EXTRA_A="" EXTRA_B="$(on 1.0)" "$here/instructions.sh" "$bin" "$bin" "$n"
echo "== tracing off (A) vs on, 1 % sampled (B)"
EXTRA_A="" EXTRA_B="$(on 0.01)" "$here/instructions.sh" "$bin" "$bin" "$n"

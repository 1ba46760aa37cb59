#!/usr/bin/env bash
# Where a streamed request's time goes in poolgate: runs the loadgen's streams
# phase (500 realistic text deltas per stream, c=32) and samples the gateway
# that serves the 500-delta streams with `perf record --call-graph dwarf` for
# the whole run, then splits its CPU (self time) into the kernel, hyper +
# tokio (and the rest of the HTTP stack), the allocator and libc, and
# poolgate's own code, and lists the top functions by self and by inclusive time.
#
#   bench/loadgen/scripts/profile-streams.sh <poolgate bin dir> [loadgen bin dir] [out dir]
#
# The loadgen dir must hold poolgate-loadgen, poolgate-passthrough and a
# poolgate-mock-upstream with --stream-deltas (default: $CARGO_TARGET_DIR/release).
set -euo pipefail
bin=${1:?poolgate bin dir}
lg=${2:-${CARGO_TARGET_DIR:-target}/release}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
"$lg/poolgate-loadgen" --bin "$bin" --mock-bin "$lg" --no-json --no-memory --no-haproxy \
  --rounds 3 --stream-seconds 5 --ttfb-requests 40 >"$out/loadgen.out" 2>&1 &
lgpid=$!
pid=""
for _ in $(seq 1 300); do
  for p in $(pgrep -P "$lgpid" -x poolgate || true); do
    if tr '\0' ' ' <"/proc/$p/cmdline" | grep -q '/hi/poolgate.toml'; then pid=$p; fi
  done
  [ -n "$pid" ] && break
  sleep 0.1
done
[ -n "$pid" ] || { echo "no 500-delta gateway found"; kill "$lgpid"; exit 1; }
echo "profiling poolgate pid $pid; load average $(cut -d' ' -f1-3 /proc/loadavg)"
perf record -F 999 --call-graph dwarf,8192 -p "$pid" -o "$out/perf.data" 2>"$out/perf.err" &
perfpid=$!
wait "$lgpid"
wait "$perfpid" || true
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
grep -E "CPU per|relayed" "$out/loadgen.out" | grep -v "÷" || true
perf report --no-inline -i "$out/perf.data" --no-children --sort dso,sym --stdio -g none --percent-limit 0 2>/dev/null >"$out/self.txt"
perf report --no-inline -i "$out/perf.data" --children --sort sym --stdio -g none --percent-limit 1 2>/dev/null >"$out/children.txt"
python3 - "$out/self.txt" <<'PY'
import re, sys
groups = {}
top = []
for line in open(sys.argv[1]):
    m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
    if not m:
        continue
    pct, dso, kind, sym = float(m[1]), m[2], m[3], m[4].strip()
    if kind == "k":
        g = "kernel (syscalls, TCP, wakeups)"
    elif re.match(r"(<?)(&?)(mut )?(hyper|h2|hyper_util|tokio|mio|http|http_body|http_body_util|httparse|atomic_waker|bytes|futures_\w+|tower\w*|axum|axum_core)::", sym):
        g = "hyper + tokio + HTTP stack"
    elif re.match(r"(<?)(poolgate\w*)::", sym) or "poolgate" in sym.split("::")[0]:
        g = "poolgate's own code"
    elif re.match(r"(<?)(wasmtime|cranelift|wasmtime_\w+)", sym) or "wasm" in dso:
        g = "plugins (wasmtime)"
    elif re.match(r"(<?)(serde|serde_json|memchr|simd_json)", sym):
        g = "serde / JSON / memchr"
    elif re.match(r"(<?)(opentelemetry|tracing\w*|rusqlite|sqlite|libsqlite)", sym) or "sqlite" in sym:
        g = "ledger / tracing"
    elif "libc" in dso or re.match(r"(__)?(malloc|free|cfree|realloc|_int_|mem(cpy|move|set|cmp)|__memcpy|__memmove|__memset|__libc)", sym):
        g = "libc (malloc, memcpy)"
    elif re.match(r"(<?)(core|alloc|std)::", sym):
        g = "Rust std / core / alloc"
    else:
        g = "other: " + dso
    groups[g] = groups.get(g, 0) + pct
    top.append((pct, g, sym[:110]))
print("\nself time by group (% of the gateway's samples):")
for g, p in sorted(groups.items(), key=lambda x: -x[1]):
    print(f"  {p:6.1f}%  {g}")
print("\ntop 30 functions by self time:")
for pct, g, sym in sorted(top, reverse=True)[:30]:
    print(f"  {pct:5.2f}%  [{g.split(' ')[0]}]  {sym}")
PY
echo
echo "top inclusive (children) entries over 1 %: $out/children.txt"
grep -E "^\s+[0-9.]+%" "$out/children.txt" | grep -E "poolgate" | head -25

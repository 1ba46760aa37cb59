#!/usr/bin/env bash
# poolgate next to HAProxy, LiteLLM's proxy and Portkey's gateway, on one mock
# upstream, from a fresh clone: installs what is missing (cached, pinned),
# builds poolgate unless --bin is given, and runs bench/peers/peers.py.
#
#   bench/peers/run.sh                       # full run: 3 rounds x 5 s per phase
#   bench/peers/run.sh --quick               # smoke test: 1 round x 1 s
#   bench/peers/run.sh --only poolgate,haproxy --seconds 10 --out /tmp/p
#   bench/peers/run.sh --bin target/release  # skip the cargo build
#
# Everything the peers need lives under ~/.cache/poolgate/peers/ (override with
# POOLGATE_PEERS_CACHE); see bench/peers/README.md.
set -euo pipefail

# Pinned versions: change here, and the cache directories change with them.
LITELLM_VERSION=1.106.12
PORTKEY_VERSION=1.15.2
MATPLOTLIB_VERSION=3.11.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${POOLGATE_PEERS_CACHE:-$HOME/.cache/poolgate/peers}"
out="$repo/target/peers"
bin=""
py_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$(cd "$2" && pwd)"; shift 2 ;;
    --out) mkdir -p "$2"; out="$(cd "$2" && pwd)"; shift 2 ;;
    --quick) py_args+=(--seconds 1 --rounds 1 --warmup 1); shift ;;
    --seconds|--rounds|--warmup|--only|--litellm-workers) py_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 1 ;;
  esac
done

log() { echo "[peers] $*" >&2; }

# Debian packages: the client (wrk) and the plain-proxy reference (HAProxy).
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v haproxy >/dev/null && [ -x "$(command -v haproxy)" ] || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v node >/dev/null || { echo "node (Node.js) is needed for Portkey's gateway" >&2; exit 1; }

# LiteLLM's proxy (and the plotting library) in a venv of their own.
venv="$cache/litellm-$LITELLM_VERSION"
if [ ! -f "$venv/.installed-mpl-$MATPLOTLIB_VERSION" ]; then
  log "installing litellm[proxy]==$LITELLM_VERSION and matplotlib==$MATPLOTLIB_VERSION into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION" "matplotlib==$MATPLOTLIB_VERSION"
  touch "$venv/.installed-mpl-$MATPLOTLIB_VERSION"
fi

# Portkey's gateway from npm, run with the machine's Node.js.
portkey="$cache/portkey-$PORTKEY_VERSION"
if [ ! -f "$portkey/node_modules/@portkey-ai/gateway/build/start-server.js" ]; then
  log "installing @portkey-ai/gateway@$PORTKEY_VERSION into $portkey"
  mkdir -p "$portkey"
  [ -f "$portkey/package.json" ] || echo '{"private": true}' >"$portkey/package.json"
  (cd "$portkey" && npm install --no-audit --no-fund --silent "@portkey-ai/gateway@$PORTKEY_VERSION")
fi

# poolgate and the mock upstream, release builds.
pg_source="--bin $bin"
if [ -z "$bin" ]; then
  log "cargo build --release -p poolgate -p poolgate-mock-upstream"
  (cd "$repo" && cargo build --release -q -p poolgate -p poolgate-mock-upstream)
  bin="${CARGO_TARGET_DIR:-$repo/target}/release"
  pg_source="built from $(git -C "$repo" rev-parse --short HEAD)"
  case "$bin" in /*) ;; *) bin="$repo/$bin" ;; esac
fi

mkdir -p "$out"
versions="$out/versions.json"
"$venv/bin/python" - "$versions" "$bin" "$portkey" "$pg_source" <<'EOF'
import json, subprocess, sys
from importlib.metadata import version
out, bindir, portkey, source = sys.argv[1:]
def first_line(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
pg = first_line([f"{bindir}/poolgate", "--version"])
pk = json.load(open(f"{portkey}/node_modules/@portkey-ai/gateway/package.json"))["version"]
json.dump({
    "poolgate": pg.split()[-1] + f" ({source})",
    "HAProxy": first_line(["haproxy", "-v"]).split()[2],
    "LiteLLM": version("litellm"),
    "Portkey gateway": pk,
    "Node.js": first_line(["node", "--version"]),
    "Python": sys.version.split()[0],
    "wrk": first_line(["dpkg-query", "-W", "-f=${Version}\\n", "wrk"]),
    "matplotlib": version("matplotlib"),
}, open(out, "w"), indent=1)
EOF

cd "$repo"
exec "$venv/bin/python" "$here/peers.py" --bin "$bin" --litellm-venv "$venv" --portkey-prefix "$portkey" \
  --versions "$versions" --out "$out" "${py_args[@]}"

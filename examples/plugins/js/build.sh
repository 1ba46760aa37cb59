#!/usr/bin/env bash
# Builds the JavaScript example into a component. Usage: build.sh [out-dir]
# (default: <repo>/target/examples/js). Prints the component's path last.
#
# Needs: Node.js 20+ and this directory's pinned packages (`npm ci` here).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../../target/examples/js}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

if ! command -v node >/dev/null; then
    echo "error: Node.js is not installed; install it with: apt-get install -y nodejs npm" >&2
    exit 127
fi
if [ ! -d "$here/node_modules/@bytecodealliance/componentize-js" ]; then
    echo "error: componentize-js is not installed; install it with: npm ci --prefix examples/plugins/js" >&2
    exit 127
fi
node "$here/build.mjs" "$out/reset-soonest-js.wasm" | tail -n 1

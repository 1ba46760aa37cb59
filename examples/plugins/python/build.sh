#!/usr/bin/env bash
# Builds the Python example into a component. Usage: build.sh [out-dir]
# (default: <repo>/target/examples/python). Prints the component's path last.
#
# Needs: componentize-py 0.25.1 (`pip install componentize-py==0.25.1`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../../target/examples/python}"
wit="${POOLGATE_WIT:-$here/../../../wit}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

# The console script, or the module when the script is not on PATH (a pyenv
# without a rehash, a user install).
if command -v componentize-py >/dev/null; then
    cpy() { componentize-py "$@"; }
elif python3 -c 'import componentize_py' 2>/dev/null; then
    cpy() { python3 -c 'import sys; from componentize_py import script; sys.argv[0] = "componentize-py"; sys.exit(script())' "$@"; }
else
    echo "error: componentize-py is not installed; install it with: pip install componentize-py==0.25.1" >&2
    exit 127
fi
# --stub-wasi: the component imports no WASI at all (a "pure" component), so it
# needs nothing from the host but poolgate's own interface.
PYTHONDONTWRITEBYTECODE=1 cpy --quiet -d "$wit" -w policy \
    componentize app -p "$here" -o "$out/reset-soonest-python.wasm" --stub-wasi
echo "$out/reset-soonest-python.wasm"

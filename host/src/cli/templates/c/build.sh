#!/usr/bin/env bash
# Builds build/{{name}}.wasm. Needs: zig (pip install ziglang==0.17.1) and the
# poolgate binary, which writes the bindings and wraps the component (it is on
# PATH, or POOLGATE names it; `poolgate plugin build` sets POOLGATE). What this
# writes is untested: `poolgate plugin build .` runs it, then the fixtures, and
# only then puts the component in dist/ (or --out). No -s: the function names
# stay, so a trap says which function it happened in.
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "error: zig is not installed; install it with: pip install ziglang==0.17.1" >&2
    exit 127
fi
poolgate="${POOLGATE:-$(command -v poolgate || true)}"
if [ -z "$poolgate" ]; then
    echo "error: the poolgate binary is not on PATH; put it there or set POOLGATE=<path to poolgate>" >&2
    exit 127
fi
mkdir -p build
"$poolgate" plugin bindings c --out build/gen >/dev/null
python3 -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -Ibuild/gen \
    -o build/core.wasm ranker.c build/gen/policy.c build/gen/policy_component_type.o
"$poolgate" plugin wrap build/core.wasm -o "build/{{name}}.wasm" >/dev/null
echo "$PWD/build/{{name}}.wasm"

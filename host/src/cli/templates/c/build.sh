#!/usr/bin/env bash
# Builds target/{{name}}.wasm. Needs: zig (pip install ziglang==0.17.1) and the
# poolgate binary, which writes the bindings and wraps the component (it is on
# PATH, or POOLGATE names it; `poolgate plugin build` sets POOLGATE).
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
mkdir -p target
"$poolgate" plugin bindings c --out target/gen >/dev/null
python3 -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -s -Itarget/gen \
    -o target/core.wasm ranker.c target/gen/policy.c target/gen/policy_component_type.o
"$poolgate" plugin wrap target/core.wasm -o "target/{{name}}.wasm" >/dev/null
echo "$PWD/target/{{name}}.wasm"

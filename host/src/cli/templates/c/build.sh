#!/usr/bin/env bash
# Builds target/{{name}}.wasm. Needs: pip install ziglang==0.17.1, and
# poolgate-witgen (set POOLGATE_WITGEN, put it on PATH, or set POOLGATE_ROOT to
# a poolgate checkout to build it there).
set -euo pipefail
cd "$(dirname "$0")"
if ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "error: zig is not installed; install it with: pip install ziglang==0.17.1" >&2
    exit 127
fi
root="${POOLGATE_ROOT:-{{poolgate_root}}}"
witgen="${POOLGATE_WITGEN:-$(command -v poolgate-witgen || true)}"
if [ -z "$witgen" ] && [ -n "$root" ] && [ -f "$root/tools/witgen/Cargo.toml" ]; then
    cargo build --quiet --manifest-path "$root/Cargo.toml" --bin poolgate-witgen
    witgen="${CARGO_TARGET_DIR:-$root/target}/debug/poolgate-witgen"
fi
if [ -z "$witgen" ]; then
    echo "error: poolgate-witgen not found; install it with: cargo install --path <poolgate checkout>/tools/witgen" >&2
    echo "       (or use wit-bindgen c + wasm-tools component new, as docs/writing-plugins.md shows)" >&2
    exit 127
fi
mkdir -p target
"$witgen" c --wit wit --world policy --out target/gen >/dev/null
python3 -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -s -Itarget/gen \
    -o target/core.wasm ranker.c target/gen/policy.c target/gen/policy_component_type.o
"$witgen" component target/core.wasm -o "target/{{name}}.wasm" >/dev/null
echo "$PWD/target/{{name}}.wasm"

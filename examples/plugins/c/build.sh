#!/usr/bin/env bash
# Builds the C example into a component. Usage: build.sh [out-dir]
# (default: <repo>/target/examples/c). Prints the component's path last.
#
# Needs: zig from PyPI (`pip install ziglang==0.17.1`) as the wasm32-wasi C
# compiler, and poolgate-witgen (this repository's tools/witgen, built here with
# cargo; elsewhere set POOLGATE_WITGEN to an installed one) for the C bindings and
# the component wrapping.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$root/target/examples/c}"
wit="${POOLGATE_WIT:-$root/wit}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

if ! python3 -m ziglang version >/dev/null 2>&1; then
    echo "error: zig is not installed; install it with: pip install ziglang==0.17.1" >&2
    exit 127
fi
witgen="${POOLGATE_WITGEN:-}"
if [ -z "$witgen" ]; then
    # The default members, as the test build selects them: the same dependency
    # features, so nothing the tests built is built again.
    cargo build --quiet --manifest-path "$root/Cargo.toml" --bin poolgate-witgen
    witgen="${CARGO_TARGET_DIR:-$root/target}/debug/poolgate-witgen"
fi

# 1. C bindings for the policy world, generated from the WIT (never committed).
"$witgen" c --wit "$wit" --world policy --out "$out/gen" >/dev/null
# 2. A reactor core module: no main, exports only. -s strips DWARF (~1 MB → ~60 KB).
python3 -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -s \
    -I"$out/gen" -o "$out/core.wasm" \
    "$here/ranker.c" "$out/gen/policy.c" "$out/gen/policy_component_type.o"
# 3. Wrap it into a component (adds the WASI adapter only if the module needs it).
"$witgen" component "$out/core.wasm" -o "$out/reset-soonest-c.wasm" >/dev/null
echo "$out/reset-soonest-c.wasm"

#!/usr/bin/env bash
# Builds the Rust example into a component. Usage: build.sh [out-dir]
# (default: <repo>/target/examples/rust). Prints the component's path last.
#
# Needs: the wasm32-wasip2 target (`rustup target add wasm32-wasip2`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/../../../target/examples/rust}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx wasm32-wasip2; then
    echo "error: the wasm32-wasip2 Rust target is missing; install it with: rustup target add wasm32-wasip2" >&2
    exit 127
fi
# Its own target dir: a plugin build never waits on the gateway's build lock.
CARGO_TARGET_DIR="$out/cargo" cargo build --quiet --release \
    --manifest-path "$here/Cargo.toml" --target wasm32-wasip2
cp "$out/cargo/wasm32-wasip2/release/reset_soonest.wasm" "$out/reset-soonest-rust.wasm"
echo "$out/reset-soonest-rust.wasm"

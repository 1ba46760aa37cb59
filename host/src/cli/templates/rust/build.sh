#!/usr/bin/env bash
# Builds build/{{name}}.wasm. Needs: rustup target add wasm32-wasip2
# What this writes is untested: `poolgate plugin build .` runs it, then the
# fixtures, and only then puts the component in dist/ (or --out).
set -euo pipefail
cd "$(dirname "$0")"
cargo build --quiet --release --target wasm32-wasip2
mkdir -p build
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" "build/{{name}}.wasm"
echo "$PWD/build/{{name}}.wasm"

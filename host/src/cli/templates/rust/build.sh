#!/usr/bin/env bash
# Builds target/{{name}}.wasm. Needs: rustup target add wasm32-wasip2
set -euo pipefail
cd "$(dirname "$0")"
cargo build --quiet --release --target wasm32-wasip2
mkdir -p target
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" "target/{{name}}.wasm"
echo "$PWD/target/{{name}}.wasm"

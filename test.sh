#!/usr/bin/env bash
# The whole test suite, on a fresh machine, in one command: installs what is
# missing, then checks formatting and lints and runs every test once.
#
#   Rust (stable) + wasm32-wasip2 rustup, from rust-toolchain.toml
#   cargo-nextest                 crates.io (cargo install), when not on PATH
#   plugin toolchains             .ci/setup: componentize-py and ziglang (PyPI),
#                                 componentize-js and jco (npm), node if missing
#   the Anthropic Python SDK      PyPI: the end-to-end tests drive the gateway with it
#
# Every service a test needs it starts itself, on a free loopback port. Extra
# arguments go to `cargo nextest run` (e.g. ./test.sh -E 'binary(failover)').
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s\n' "$*"; }

if ! command -v cargo >/dev/null; then
    echo "test.sh needs Rust's rustup and cargo first: https://rustup.rs" >&2
    exit 1
fi

step "Rust toolchain (rust-toolchain.toml)"
# Installs the pinned toolchain, its wasm target and components if missing.
rustup toolchain install
rustup show active-toolchain

step "cargo-nextest"
if ! cargo nextest --version >/dev/null 2>&1; then
    cargo install --locked cargo-nextest@0.9.143
fi
cargo nextest --version | head -1

step "plugin toolchains"
bash .ci/setup

step "Anthropic Python SDK"
want=2.14.0
have=$(python3 -m pip show anthropic 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$have" != "$want" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "anthropic==$want"
fi
echo "anthropic $want"

step "OpenAI Python SDK"
want=2.14.0
have=$(python3 -m pip show openai 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$have" != "$want" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "openai==$want"
fi
echo "openai $want"

step "format"
cargo fmt --all --check

step "lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
exec cargo nextest run --workspace --locked --no-fail-fast "$@"

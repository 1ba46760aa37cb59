#!/usr/bin/env bash
# The whole test suite, on a fresh machine, in one command: installs what is
# missing, then checks formatting and lints and runs every test once.
#
#   Rust (stable) + wasm32-wasip2 rustup, from rust-toolchain.toml
#   cargo-nextest                 crates.io (cargo install), when not on PATH
#   plugin toolchains             .ci/setup: componentize-py and ziglang (PyPI),
#                                 componentize-js and jco (npm), node if missing
#   the Anthropic Python SDK      PyPI: the end-to-end tests drive the gateway with it
#   the Claude Code CLI           npm: the gateway-contract test drives the real CLI
#   redis-server, redis-cli       Debian's packages: the replica tests share state through it
#   postgresql                    Debian's package: the shared usage ledger's tests run it
#   chromium                      Debian's package: the web page's test drives it headless
#   playwright-core               npm (tests/e2e/ui/package-lock.json): what drives Chromium
#
# Every service a test needs it starts itself, on a free loopback port. Extra
# arguments go to `cargo nextest run` (e.g. ./test.sh -E 'test(/^failover::/)').
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

# A pinned PyPI package, installed only when another version (or none) is there.
pip_pinned() {
    local have
    have=$(python3 -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p' || true)
    if [ "$have" != "$2" ]; then
        python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "$1==$2"
    fi
    echo "$1 $2"
}

step "Anthropic and OpenAI Python SDKs"
pip_pinned anthropic 2.14.0
pip_pinned openai 2.14.0

step "Claude Code CLI (npm)"
# host/tests/all/claude_code/ drives the real CLI through the gateway and compares
# bytes; installed once into the cache, at the version the contract was
# checked against (docs/claude-code.md).
cc_version=2.1.332
cc_dir="${XDG_CACHE_HOME:-$HOME/.cache}/poolgate/claude-code-$cc_version"
cc_bin="$cc_dir/node_modules/@anthropic-ai/claude-code/bin/claude.exe"
if ! "$cc_bin" --version >/dev/null 2>&1; then
    npm install --prefix "$cc_dir" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$cc_version"
    # Its postinstall puts the native binary in place; run it if npm did not.
    "$cc_bin" --version >/dev/null 2>&1 || (cd "$cc_dir/node_modules/@anthropic-ai/claude-code" && node install.cjs)
fi
"$cc_bin" --version
export POOLGATE_CLAUDE="$cc_bin" POOLGATE_REQUIRE_CLAUDE=1

step "redis-server (Debian)"
# The replica tests start their own servers on free loopback ports.
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends redis-server redis-tools
    # The package starts a system service on 6379; the tests need none.
    $sudo_ systemctl disable --now redis-server >/dev/null 2>&1 || $sudo_ service redis-server stop >/dev/null 2>&1 || true
fi
redis-server --version

step "postgresql (Debian)"
# The ledger tests start their own servers (initdb, pg_ctl) on free loopback
# ports; Debian keeps the programs off PATH, under /usr/lib/postgresql/*/bin.
pg_initdb() { command -v initdb || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -1; }
if [ -z "$(pg_initdb)" ]; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends postgresql
    # The package starts a system cluster on 5432; the tests need none.
    $sudo_ systemctl disable --now postgresql >/dev/null 2>&1 || $sudo_ service postgresql stop >/dev/null 2>&1 || true
fi
"$(pg_initdb)" --version

step "Chromium (Debian) and playwright-core (npm)"
# host/tests/all/ui.rs drives the web page in a real browser; never a
# browser downloaded by the test tool, always the distribution's.
if [ ! -x /usr/bin/chromium ]; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && sudo_="sudo"
    $sudo_ apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends chromium
fi
/usr/bin/chromium --version
ui_lock=$(sha256sum tests/e2e/ui/package-lock.json | cut -d' ' -f1)
if [ "$(cat tests/e2e/ui/node_modules/.installed-lock.sha256 2>/dev/null)" != "$ui_lock" ]; then
    npm ci --prefix tests/e2e/ui --no-audit --no-fund --loglevel=error
    echo "$ui_lock" > tests/e2e/ui/node_modules/.installed-lock.sha256
fi
export POOLGATE_REQUIRE_BROWSER=1

step "format"
cargo fmt --all --check

step "lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests"
exec cargo nextest run --workspace --locked --no-fail-fast "$@"

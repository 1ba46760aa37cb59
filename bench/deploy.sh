#!/usr/bin/env bash
# What deploying a plugin costs, per language: `plugin new`, then
# `plugin build --config <a gateway config> --out <deployed path>` three times —
#   first      build, compile into the gateway's cache, fixtures, deploy
#   unchanged  the same sources again (no build, no compile: the goal is ≤ 1 s)
#   edited     one line changed (build + compile again: ≤ the language's compile)
# — and, as the baseline measured in the same run, the language's own build
# after one more such edit (build.sh alone) and a cold compile of what it wrote
# (`plugin inspect` into an empty cache): `edited` should cost about their sum.
#
#   bench/deploy.sh [path/to/poolgate] [languages…]    (default: target/release/poolgate, rust python js c)
#
# Needs the plugin toolchains (.ci/setup installs them); runs offline, outside
# the checkout. Prints one table, seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
poolgate=$(realpath "${1:-target/release/poolgate}")
shift || true
langs=("$@")
[ ${#langs[@]} -eq 0 ] && langs=(rust python js c)
export POOLGATE_JS_TOOLCHAIN=${POOLGATE_JS_TOOLCHAIN:-$repo/examples/plugins/js/node_modules}
unset CARGO_TARGET_DIR POOLGATE_CONFIG
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

secs() { python3 -c "import time; print(time.monotonic())"; }
took() { python3 -c "print(f'{$2 - $1:.2f}')"; }
reason_of() { case $1 in rust) echo src/lib.rs ;; python) echo app.py ;; js) echo ranker.js ;; c) echo ranker.c ;; esac; }

printf '%-7s %9s %9s %9s %10s %9s %9s\n' lang build.sh compile first unchanged edited unit
for lang in "${langs[@]}"; do
    dir=$work/$lang
    mkdir -p "$dir" && cd "$dir"
    cat > gateway.toml <<TOML
[policy]
cache_dir = "$dir/cache"
[[accounts]]
id = "a"
api_key_env = "KEY_A"
base_url = "http://127.0.0.1:9"
TOML
    "$poolgate" plugin new ranker --lang "$lang" >/dev/null
    cd ranker
    build() {
        "$poolgate" plugin build . --config ../gateway.toml --out "$dir/plugins/ranker.wasm" >"$dir/out.$1" 2>&1 \
            || { echo "$lang: plugin build ($1) failed:" >&2; cat "$dir/out.$1" >&2; exit 1; }
    }
    t0=$(secs); build first; t1=$(secs)
    build unchanged; t2=$(secs)
    grep -q "unchanged since its last build" "$dir/out.unchanged" || { cat "$dir/out.unchanged"; exit 1; }
    src=$(reason_of "$lang")
    sed -i "s/\"ranker\"/\"ranker2\"/; s/'ranker'/'ranker2'/" "$src"
    sed -i 's/"reason": "ranker"/"reason": "ranker2"/' fixtures/basic.json
    t3=$(secs); build edited; t4=$(secs)
    # "deployed <path>", not "already deployed": the edit reached the gateway's file.
    grep -q "^deployed " "$dir/out.edited" || { cat "$dir/out.edited"; exit 1; }
    # Baselines: the language's own build after the same one-line edit, and a
    # cold compile of what it wrote.
    sed -i "s/\"ranker2\"/\"ranker3\"/; s/'ranker2'/'ranker3'/" "$src"
    t5=$(secs); POOLGATE=$poolgate bash build.sh >/dev/null; t6=$(secs)
    t7=$(secs); XDG_CACHE_HOME=$dir/cold "$poolgate" plugin inspect build/ranker.wasm >/dev/null 2>&1; t8=$(secs)
    printf '%-7s %9s %9s %9s %10s %9s %9s\n' "$lang" "$(took "$t5" "$t6")" "$(took "$t7" "$t8")" \
        "$(took "$t0" "$t1")" "$(took "$t1" "$t2")" "$(took "$t3" "$t4")" s
    cd "$repo"
done

#!/usr/bin/env bash
# The long version of the fuzzing CI runs short (docs/fuzzing.md): each
# target of fuzz/ under libFuzzer for N seconds, one at a time, one job,
# nice'd (the machine is shared), then its corpus minimised in place to
# what reaches every edge the run reached (`cargo fuzz cmin`). Files with
# names of their own — the seeds taken from real examples and the
# regression inputs, `regress-*` — are kept whatever they add; what libFuzzer
# found is named by its hash. Prints one line per target: seconds,
# executions, the coverage libFuzzer reached (cov, ft), the corpus kept, and
# crashes.
#
# No nightly needed: `--sanitizer none` builds with the pinned stable
# toolchain (safe Rust needs no AddressSanitizer to find its panics), with
# debug assertions and overflow checks on, as the debug test binary has.
# A crash's input lands in fuzz/artifacts/<target>/; replay it with
# `cargo fuzz run -s none -a <target> <file>`.
#
# Usage: bench/fuzz.sh [seconds-per-target (default 240)] [target…]
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-240}
shift || true
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# Its own target directory by default: the instrumented build shares
# nothing with the workspace's.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
export RUSTFLAGS="${RUSTFLAGS:-} -Coverflow-checks=on"
flags=(--sanitizer none --debug-assertions)
cargo fuzz build "${flags[@]}"

# Crash, out-of-memory and timeout inputs libFuzzer kept for target $1.
found() {
    find "artifacts/$1" -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'timeout-*' \) | wc -l
}

summary=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    crashes_before=$(found "$t")
    echo "== $t: ${seconds}s"
    # -jobs=1 -workers=1: one fuzzing process (its output in fuzz-0.log).
    nice -n 10 cargo fuzz run "${flags[@]}" "$t" -- \
        -max_total_time="$seconds" -jobs=1 -workers=1 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 || true
    log=fuzz-0.log
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    execs=$(grep -oE 'Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' || echo "?")
    took=$(grep -oE 'runs in [0-9]+ second' "$log" | grep -oE '[0-9]+' || echo "?")
    cov=$(grep -oE 'cov: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo "?")
    ft=$(grep -oE 'ft: [0-9]+' <<<"$last" | grep -oE '[0-9]+' || echo "?")
    mv "$log" "artifacts/$t/last-run.log"
    # Minimise, keeping the named inputs (libFuzzer names its own by SHA-1).
    keep=$(mktemp -d)
    find "corpus/$t" -maxdepth 1 -type f ! -regex '.*/[0-9a-f]\{40\}' -exec mv {} "$keep/" \;
    # -use_counters=0: keep what reaches every edge, not every hit count of
    # one (thousands of files more for the repository, little more to learn).
    nice -n 10 cargo fuzz cmin "${flags[@]}" "$t" -- -use_counters=0 >/dev/null 2>&1 ||
        echo "   (cmin failed; corpus left as the run grew it)"
    find "$keep" -maxdepth 1 -type f -exec mv {} "corpus/$t/" \;
    rmdir "$keep"
    files=$(find "corpus/$t" -type f | wc -l)
    bytes=$(du -sb "corpus/$t" | cut -f1)
    crashes=$(found "$t")
    summary+=("$(printf '%-16s %6ss %12s execs  cov %6s  ft %6s  corpus %4s files %8s B  crashes %s (new %s)' \
        "$t" "$took" "$execs" "$cov" "$ft" "$files" "$bytes" "$crashes" "$(( crashes - crashes_before ))")")
done
echo
printf '%s\n' "${summary[@]}"

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for a fixed number of inputs,
# starting from the seed corpus in tests/fuzz/corpus/<target>/.
#
# Usage: scripts/fuzz.sh [RUNS]      RUNS inputs per target (default 20000; by hand try 1000000,
#                                    or -1 to run until a crash or Ctrl-C)
# Environment:
#   FUZZ_BUILD_DIR  build directory (default: build-fuzz)
#   FUZZ_TARGETS    targets to run (default: "url_fuzz identifier_fuzz sql_builder_fuzz")
#   FUZZ_MAX_TOTAL_TIME  seconds per target at most (default 0: no limit)
#   JOBS            parallel build jobs (default: nproc)
# New interesting inputs go to a scratch directory, not into the committed corpus; crash inputs
# are written to $FUZZ_BUILD_DIR/artifacts/<target>/ and the script fails.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$REPO_ROOT"

RUNS=${1:-20000}
FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_TARGETS=${FUZZ_TARGETS:-"url_fuzz identifier_fuzz sql_builder_fuzz"}
FUZZ_MAX_TOTAL_TIME=${FUZZ_MAX_TOTAL_TIME:-0}
JOBS=${JOBS:-$(nproc)}

msg() { printf '\n==> %s\n' "$*" >&2; }
# shellcheck source=scripts/ccache.sh
. "$REPO_ROOT/scripts/ccache.sh"

msg "configuring ($FUZZ_BUILD_DIR, clang++)"
cmake -S . -B "$FUZZ_BUILD_DIR" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDBLOCK_FUZZ=ON -DDBLOCK_TESTS=OFF -DDBLOCK_EXAMPLES=OFF -DDBLOCK_BENCH=OFF \
    -DDBLOCK_CLI=OFF -DDBLOCK_PROMETHEUS=OFF "${CCACHE_CMAKE_ARGS[@]}" >/dev/null
msg "building"
# shellcheck disable=SC2086
cmake --build "$FUZZ_BUILD_DIR" -j"$JOBS" --target $FUZZ_TARGETS

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
for target in $FUZZ_TARGETS; do
    corpus="$REPO_ROOT/tests/fuzz/corpus/$target"
    scratch=$(mktemp -d "${TMPDIR:-/tmp}/dblock-fuzz-$target.XXXXXX")
    artifacts="$FUZZ_BUILD_DIR/artifacts/$target"
    mkdir -p "$artifacts"
    msg "$target: $RUNS runs (seeds: $(find "$corpus" -type f | wc -l))"
    t=$SECONDS
    if "$FUZZ_BUILD_DIR/tests/fuzz/$target" -runs="$RUNS" -max_len=4096 \
        -max_total_time="$FUZZ_MAX_TOTAL_TIME" -print_final_stats=1 \
        -artifact_prefix="$artifacts/" "$scratch" "$corpus" 2>"$scratch.log"; then
        grep -E '^(#[0-9]+.*DONE|Done|stat::number_of_executed_units)' "$scratch.log" || true
        msg "$target: ok in $((SECONDS - t))s"
    else
        tail -n 60 "$scratch.log"
        msg "$target: FAILED after $((SECONDS - t))s (crash input in $artifacts/)"
        status=1
    fi
    rm -rf "$scratch" "$scratch.log"
done
exit "$status"

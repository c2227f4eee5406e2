#!/usr/bin/env bash
# Sanitizer runs against throwaway servers, each in its own build directory:
#   asan: the whole suite (unit, all three backends, faults) built with
#         AddressSanitizer + UndefinedBehaviorSanitizer (-DDBLOCK_ASAN=ON -DDBLOCK_UBSAN=ON),
#         but for the multi-process tests of the backend entries (tests/CMakeLists.txt: their
#         workers run the library code the threaded tests run; the CLI's tests stay);
#         the example programs and dblock-bench (-DDBLOCK_BENCH=OFF) and their tests are left
#         out: they are clients of the library the suite already runs under ASan (the watchdog
#         tests renew a thousand leases in batches from two threads, as the bench's watchdog row
#         does), and building them instrumented costs CI minutes;
#   tsan: in two processes side by side (PostgreSQL's tests, the rest), the threaded tests
#         (the standard-lock adapters and the in-memory backend, watchdog,
#         reaper, pools, row locks, admin, the election's monitor
#         thread, semaphores, read-write locks, lock sets) built with
#         ThreadSanitizer (-DDBLOCK_TSAN=ON), third-party frames suppressed by
#         tests/tsan.supp (never dblock's own code).
#
# Usage: scripts/sanitizers.sh [asan|tsan|all]   (default: all)
#
# Environment:
#   ASAN_BUILD_DIR  build directory of the ASan+UBSan build (default: build-asan)
#   TSAN_BUILD_DIR  build directory of the TSan build (default: build-tsan)
#   TSAN_TAGS       Catch2 tag expression of the TSan run (default: the threaded tests below)
#   JOBS            parallel build jobs (default: nproc)
# Exit status is non-zero when a build fails, a test fails or a sanitizer reports anything.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$REPO_ROOT"

WHAT=${1:-all}
ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
TSAN_BUILD_DIR=${TSAN_BUILD_DIR:-build-tsan}
JOBS=${JOBS:-$(nproc)}
# Tests whose bodies run dblock code on several threads (watchdog and reaper threads, pools shared
# by threads, concurrent acquirers); the multi-process variants add nothing for TSan.
# The CLI's tests (and the coordination primitives' example tests) run other processes only.
TSAN_TAGS=${TSAN_TAGS:-"[idioms],[memory],[lease]~[process],[waiting]~[process]~[cli],[id_generator]~[process]~[cli],[reaper]~[process],[rowlock]~[process],[optimistic]~[process],[admin],[database],[election]~[processes]~[cli],[lock_set]~[processes]~[cli],[rwlock]~[processes]~[cli]~[examples],[semaphore]~[process]~[cli]~[examples],[watchdog]"}

msg() { printf '\n==> %s\n' "$*" >&2; }
# shellcheck source=scripts/stages.sh
. "$REPO_ROOT/scripts/stages.sh"
# shellcheck source=scripts/ccache.sh
. "$REPO_ROOT/scripts/ccache.sh"
T0=$SECONDS
elapsed() { printf '%ds' $((SECONDS - T0)); }

# A sanitizer report fails the run at once (exit status non-zero, no "recover and go on").
# verify_asan_link_order=0: the clock-skew tests start workers with LD_PRELOAD=libfaketime, which
# then comes before the ASan runtime in the library list; ASan would refuse to start them.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1:verify_asan_link_order=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$REPO_ROOT/tests/lsan.supp}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$REPO_ROOT/tests/tsan.supp}

build_asan() {
    msg "ASan+UBSan: configuring ($ASAN_BUILD_DIR)"
    # -O1 -g1: instrumented code compiles much faster than at -O2 -g and still names every frame.
    cmake -S . -B "$ASAN_BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DDBLOCK_TESTS=ON \
        -DDBLOCK_EXAMPLES=OFF -DDBLOCK_BENCH=OFF -DDBLOCK_ASAN=ON -DDBLOCK_UBSAN=ON \
        "${CCACHE_CMAKE_ARGS[@]}" >/dev/null || return
    msg "ASan+UBSan: building"
    cmake --build "$ASAN_BUILD_DIR" -j"$JOBS"
}

run_asan() {
    stage "ASan+UBSan build" build_asan
    stage "ASan+UBSan suite" run_asan_suite
}

# Three entries at a time, as the main suite (scripts/test.sh): they mostly wait.
run_asan_suite() {
    local t=$SECONDS
    # The consumer tests build separate projects against the installed (instrumented) library
    # without sanitizer flags (consumer_shared builds a plain shared library of its own); they
    # check packaging, not memory safety. The serial fault entries (server restarts, delayed
    # replies, renewal blackholes, clock jumps) run in the plain build only: they are about
    # timing windows, which ASan's slowdown distorts, and they would add minutes; every other
    # fault scenario and the hostile-input tests run here. The topology entries (the suite once
    # more through PgBouncer, the Galera and failover scenarios) are about the deployment, not
    # memory safety, and run in the plain build only.
    local log status=0 summary
    log=$(mktemp "${TMPDIR:-/tmp}/dblock-asan.XXXXXX")
    # The failed test cases, a line each, for the end of the CI log (tests/support/main.cpp).
    summary=$(mktemp -d "${TMPDIR:-/tmp}/dblock-asan-summary.XXXXXX")
    DBLOCK_TEST_SUMMARY_DIR=$summary "$REPO_ROOT/scripts/test-servers.sh" run -- \
        ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -j3 --timeout 1800 \
        -E '^(consumer.*|faults_serial_.*|pgbouncer|topology_.*)$' 2>&1 | tee "$log" ||
        status=${PIPESTATUS[0]}
    "$REPO_ROOT/scripts/repeat-failures.sh" "$log" "ASan+UBSan suite"
    brief_failed_tests "$summary" "ASan+UBSan suite"
    rm -rf "$log" "$summary"
    [ "$status" -eq 0 ] || return "$status"
    msg "ASan+UBSan: suite passed in $((SECONDS - t))s"
}

build_tsan() {
    msg "TSan: configuring ($TSAN_BUILD_DIR)"
    cmake -S . -B "$TSAN_BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DDBLOCK_TESTS=ON \
        -DDBLOCK_EXAMPLES=OFF -DDBLOCK_BENCH=OFF -DDBLOCK_TSAN=ON "${CCACHE_CMAKE_ARGS[@]}" \
        >/dev/null || return
    msg "TSan: building"
    cmake --build "$TSAN_BUILD_DIR" -j"$JOBS" --target dblock_tests dblock
}

run_tsan() {
    stage "TSan build" build_tsan
    stage "TSan threaded tests" run_tsan_tests
}

run_tsan_tests() {
    msg "TSan: running $TSAN_TAGS"
    local t=$SECONDS
    # The threaded tests use the plain servers only: no Galera cluster or PgBouncer. Two
    # processes side by side, PostgreSQL's tests in one and the rest in the other (the tests
    # spend much of their time waiting on the database and on TTLs, which TSan does not slow).
    local summary status=0
    summary=$(mktemp -d "${TMPDIR:-/tmp}/dblock-tsan-summary.XXXXXX")
    DBLOCK_TEST_SUMMARY_DIR=$summary DBLOCK_TEST_TOPOLOGIES=0 \
        "$REPO_ROOT/scripts/test-servers.sh" run -- \
        bash "$REPO_ROOT/scripts/sanitizers.sh" tsan-run "$TSAN_BUILD_DIR/tests/dblock_tests" ||
        status=$?
    brief_failed_tests "$summary" "TSan threaded tests"
    rm -rf "$summary"
    [ "$status" -eq 0 ] || return "$status"
    msg "TSan: threaded tests passed in $((SECONDS - t))s"
}

# tsan-run BINARY (inside test-servers.sh run): the TSan tags in two processes at once, one for
# PostgreSQL's tests and one for the rest; fails when either fails.
run_tsan_split() {
    local bin=$1 term pg=() rest=() status=0 pid_pg pid_rest
    IFS=, read -r -a terms <<<"$TSAN_TAGS"
    for term in "${terms[@]}"; do
        pg+=("$term[postgresql]")
        rest+=("$term~[postgresql]")
    done
    local pg_spec rest_spec
    pg_spec=$(IFS=,; echo "${pg[*]}")
    rest_spec=$(IFS=,; echo "${rest[*]}")
    # (-w NoTests fails a term that matches nothing: some, such as [memory], have no
    # PostgreSQL tests, so that process is checked for having run tests below instead.)
    "$bin" "$pg_spec" > "$TSAN_LOG_DIR/tsan-postgresql.log" 2>&1 &
    pid_pg=$!
    "$bin" "$rest_spec" -w NoTests > "$TSAN_LOG_DIR/tsan-rest.log" 2>&1 &
    pid_rest=$!
    local st_pg=0 st_rest=0
    wait "$pid_pg" || st_pg=$?
    wait "$pid_rest" || st_rest=$?
    if ! grep -Eq 'in [1-9][0-9]* test cases' "$TSAN_LOG_DIR/tsan-postgresql.log"; then
        [ "$st_pg" -ne 0 ] || st_pg=4 # it ran no test: a failure
    fi
    # A failed process's whole output (its failures and any TSan report), else its summary.
    for f in postgresql:$st_pg rest:$st_rest; do
        printf '\n==> TSan, %s tests (exit %s):\n' "${f%%:*}" "${f#*:}" >&2
        if [ "${f#*:}" -ne 0 ]; then
            cat "$TSAN_LOG_DIR/tsan-${f%%:*}.log" >&2
            "$REPO_ROOT/scripts/repeat-failures.sh" "$TSAN_LOG_DIR/tsan-${f%%:*}.log" \
                "TSan, ${f%%:*} tests" >/dev/null
            note_failure "TSan, ${f%%:*} tests: exit ${f#*:} (its log is above in this run)"
            note_brief "[TSan, ${f%%:*} tests] exit ${f#*:}"
            status=1
        else
            tail -n 3 "$TSAN_LOG_DIR/tsan-${f%%:*}.log" >&2
        fi
    done
    return "$status"
}

case "$WHAT" in
    tsan-run)
        TSAN_LOG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dblock-tsan.XXXXXX")
        run_tsan_split "$2"
        exit $?
        ;;
    asan) run_asan ;;
    tsan) run_tsan ;;
    # Not "run_asan && run_tsan": bash ignores set -e inside a function called from an && list,
    # which would let a failed run pass.
    all)
        run_asan
        run_tsan
        ;;
    *)
        echo "usage: $0 [asan|tsan|all]" >&2
        exit 2
        ;;
esac
msg "sanitizers ($WHAT): all passed in $(elapsed)"

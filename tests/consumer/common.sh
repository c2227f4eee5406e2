# shellcheck shell=bash
# Shared by the consumer tests (run.sh, shared.sh, fetchcontent.sh), sourced with the test's name
# as its argument: the compiler, the temporary directory $work (removed on exit), and say, fail
# and run_logged, which speak in the test's name.
consumer_test=$1
export CXX=${CXX:-c++}
# (DBLOCK_CONSUMER_TMP: tests/CMakeLists.txt passes the build tree, where a compiler cache finds
# the same relative paths on every run.)
work=$(mktemp -d "${DBLOCK_CONSUMER_TMP:-${TMPDIR:-/tmp}}/dblock-${consumer_test#consumer_}.XXXXXX")
trap 'rm -rf "$work"' EXIT

say() { echo "$consumer_test: $*"; }
fail() {
    echo "$consumer_test: FAIL: $*" >&2
    exit 1
}
# run_logged LOG WHAT COMMAND...: runs COMMAND with its output in LOG; on failure shows LOG.
run_logged() {
    local log=$1 what=$2
    shift 2
    if ! "$@" >"$log" 2>&1; then
        echo "$consumer_test: FAIL: $what; its output (last 80 lines of $log):" >&2
        tail -n 80 "$log" >&2
        exit 1
    fi
}

#!/usr/bin/env bash
# The one test command: install dependencies, build, start throwaway
# PostgreSQL + MariaDB servers, run the whole suite, print per-backend totals.
#
# Usage: scripts/test.sh [CTEST_ARGS...]      e.g. scripts/test.sh -R sqlite
#
# Against a MySQL or MariaDB server of your own instead (a MySQL 8.4 from docker/compose.yaml,
# say): DBLOCK_TEST_EXTERNAL_MYSQL_URL=mysql://user:password@host:port/db scripts/test.sh
# builds, then runs there the MySQL tests of the main and the fault suite, without session
# leases when the server is MySQL 8 (which refuses them), and with no throwaway servers: tests
# that need to stop, restart or administer the server skip, and are counted as skipped
# (DBLOCK_TEST_MYSQL_ADMIN_URL, a root URL of that server, runs those that only administer it).
# Not with CI=true, which requires every backend.
#
# After the suite passes, the Debian packages are built, installed, used and removed
# (scripts/package-test.sh, as root), the fuzzers run for a fixed number of inputs (scripts/fuzz.sh) and
# the suite runs again under ASan+UBSan and its threaded tests under TSan
# (scripts/sanitizers.sh). DBLOCK_QUICK=1 or CTEST_ARGS skip those (not allowed with CI=true).
#
# Environment:
#   BUILD_DIR   build directory (default: build, relative to the repo root)
#   DBLOCK_FUZZ_RUNS  inputs per fuzz target (default 20000)
#   CI=true     strict mode: every backend (postgresql, mysql, sqlite) must
#               have passing tests and none may be skipped
#   DBLOCK_SUMMARIZE_ONLY=DIR
#               skip install/build/tests and only evaluate the summary files
#               in DIR (for debugging this script)
#
# Exit status is non-zero if the build or ctest failed, if any test failed on
# any backend, or (CI=true) if a backend did not run or had skipped tests.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$REPO_ROOT"

BUILD_DIR=${BUILD_DIR:-build}
# The backends the suite must cover; the test binary reports under these names.
BACKENDS=(postgresql mysql sqlite)
# The deployment topologies (docs/deployment.md) the suite must cover under CI=true; their ctest
# entries report under "<topology>:<backend>".
TOPOLOGIES=(pgbouncer:postgresql galera:mysql pgpair:postgresql)
# The server flavors run by a switch (docs/mysql.md: the MySQL 8 flavor on MariaDB), required
# the same way; their entries report under "<flavor>:<backend>".
FLAVORS=(mysql8:mysql)
# The least number of tests each ctest entry must pass under CI=true (its filter matching fewer,
# by a mistake in a tag or a filter, fails the run; `-w NoTests` catches a filter matching none).
# About 90% of what each entry runs today: raise them as the suite grows.
MIN_TESTS=(unit:24 postgresql:215 mysql:200 sqlite:190 pgbouncer:190 faults_unit:3
    faults_postgresql:26 faults_mysql:25 faults_sqlite:15 faults_serial_postgresql:9
    faults_serial_mysql:5 faults_serial_sqlite:2 topology_galera:4 topology_pgpair:4
    mysql_flavor:38 faults_mysql_flavor:6 faults_serial_mysql_flavor:5)
T0=$SECONDS
if [ -n "${DBLOCK_TEST_EXTERNAL_MYSQL_URL:-}" ] && [ "${CI:-}" = true ]; then
    echo "test.sh: CI=true tests every backend on throwaway servers: unset DBLOCK_TEST_EXTERNAL_MYSQL_URL" >&2
    exit 2
fi
# shellcheck source=scripts/stages.sh
. "$REPO_ROOT/scripts/stages.sh"
# Run alone (not from .ci/run, which prints them at the very end of its log), this script prints
# its own stages and failures when it ends.
if [ -z "${DBLOCK_STAGE_LOG:-}" ]; then
    DBLOCK_STAGE_LOG=$(mktemp "${TMPDIR:-/tmp}/dblock-stages.XXXXXX")
    DBLOCK_FAILURE_LOG=$(mktemp "${TMPDIR:-/tmp}/dblock-failures.XXXXXX")
    DBLOCK_STAGE_T0=$(date +%s)
    export DBLOCK_STAGE_LOG DBLOCK_FAILURE_LOG DBLOCK_STAGE_T0
    own_stage_log=1
fi

msg() { printf '\n==> %s\n' "$*" >&2; }

is_ci() { [ "${CI:-}" = true ]; }

wall_time() {
    local s=$((SECONDS - T0))
    printf '%dm%02ds' $((s / 60)) $((s % 60))
}

banner() { # a message nobody scrolls past
    local line
    printf '\n%s\n' "################################################################################"
    for line in "$@"; do printf '##  %s\n' "$line"; done
    printf '%s\n\n' "################################################################################"
}

# summarize DIR CTEST_STATUS: add up the "backend=B passed=N failed=N
# skipped=N" lines of all files in DIR (one file per test process), print a
# table and return non-zero if the run must count as failed.
summarize() {
    local dir=$1 ctest_status=$2 totals backend passed failed skipped entries entry
    local fail=0 problems=()

    # awk does the parsing: keys may come in any order, unknown keys and
    # malformed lines are reported (not silently ignored).
    totals=$(find "$dir" -type f -name 'catch-*.txt' -print0 | sort -z | xargs -0 -r awk '
        NF == 0 { next }
        {
            b = ""; p = ""; f = ""; s = ""
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "backend") b = kv[2]
                else if (kv[1] == "passed") p = kv[2]
                else if (kv[1] == "failed") f = kv[2]
                else if (kv[1] == "skipped") s = kv[2]
            }
            if (b == "" || p !~ /^[0-9]+$/ || f !~ /^[0-9]+$/ || s !~ /^[0-9]+$/) {
                printf "WARNING: ignoring malformed summary line in %s: %s\n", FILENAME, $0 > "/dev/stderr"
                next
            }
            if (!(b in seen)) { seen[b] = 1; order[++n] = b }
            P[b] += p; F[b] += f; S[b] += s
        }
        END { for (i = 1; i <= n; i++) print order[i], P[order[i]], F[order[i]], S[order[i]] }
    ')

    # Passed tests per ctest entry (the "entry=" key; lines without one are not counted).
    entries=$(find "$dir" -type f -name 'catch-*.txt' -print0 | sort -z | xargs -0 -r awk '
        {
            e = ""; p = ""
            for (i = 1; i <= NF; i++) {
                split($i, kv, "=")
                if (kv[1] == "entry") e = kv[2]
                else if (kv[1] == "passed") p = kv[2]
            }
            if (e != "" && p ~ /^[0-9]+$/) { if (!(e in E)) order[++n] = e; E[e] += p }
        }
        END { for (i = 1; i <= n; i++) print order[i], E[order[i]] }
    ')
    local -A EP=()
    while read -r entry passed; do
        [ -n "$entry" ] && EP[$entry]=$passed
    done <<<"$entries"

    # Table: the required backends first (also when missing), then any
    # others the binary reported (e.g. "none" for backend-independent tests).
    local -A P=() F=() S=()
    local others=()
    while read -r backend passed failed skipped; do
        [ -n "$backend" ] || continue
        P[$backend]=$passed F[$backend]=$failed S[$backend]=$skipped
        case " ${BACKENDS[*]} " in
            *" $backend "*) ;;
            *) others+=("$backend") ;;
        esac
    done <<<"$totals"

    local tp=0 tf=0 ts=0
    printf '\n%-20s %8s %8s %8s\n' backend passed failed skipped
    printf '%-20s %8s %8s %8s\n' -------------------- -------- -------- --------
    for backend in "${BACKENDS[@]}" "${others[@]}"; do
        if [ -z "${P[$backend]+set}" ]; then
            printf '%-20s %8s %8s %8s\n' "$backend" - - -
            continue
        fi
        printf '%-20s %8d %8d %8d\n' "$backend" "${P[$backend]}" "${F[$backend]}" "${S[$backend]}"
        tp=$((tp + P[$backend])) tf=$((tf + F[$backend])) ts=$((ts + S[$backend]))
    done
    printf '%-20s %8s %8s %8s\n' -------------------- -------- -------- --------
    printf '%-20s %8d %8d %8d\n' total "$tp" "$tf" "$ts"
    # The count of the plain suite, for the last line of the CI log (scripts/stages.sh).
    if [ -n "${DBLOCK_STAGE_LOG:-}" ]; then
        printf 'tests: %d passed, %d failed, %d skipped\n' "$tp" "$tf" "$ts" >"$DBLOCK_STAGE_LOG.count"
    fi

    if [ "$ctest_status" -ne 0 ]; then
        problems+=("ctest (or the test servers) failed with exit status $ctest_status")
        fail=1
    fi
    for backend in "${BACKENDS[@]}" "${others[@]}"; do
        if [ "${F[$backend]:-0}" -gt 0 ]; then
            problems+=("$backend: ${F[$backend]} test(s) FAILED")
            fail=1
        fi
    done
    # Which ones (tests/support/main.cpp writes "backend<TAB>name" per failed test case).
    local name where
    while IFS=$'\t' read -r backend name where; do
        [ -n "$name" ] && problems+=("  FAILED <$backend> $name" "    ${where:-(no failed assertion: an exception?)}")
    done < <(find "$dir" -type f -name 'failed-*.txt' -print0 | sort -z | xargs -0 -r cat)

    # A backend that silently did not run (server unreachable, tests
    # filtered out, binary crashed before writing its summary) would make a
    # green run meaningless. In CI that is an error; locally it is allowed
    # (e.g. "-R sqlite") but must be impossible to overlook.
    local gaps=()
    for backend in "${BACKENDS[@]}"; do
        if [ "${P[$backend]:-0}" -eq 0 ]; then
            gaps+=("$backend: no test passed (backend did not run?)")
        fi
        if [ "${S[$backend]:-0}" -gt 0 ]; then
            gaps+=("$backend: ${S[$backend]} test(s) SKIPPED")
        fi
    done
    # Any other label (tests without a backend, "none") must not skip either.
    for backend in "${others[@]}"; do
        if [ "${S[$backend]:-0}" -gt 0 ]; then
            gaps+=("$backend: ${S[$backend]} test(s) SKIPPED")
        fi
    done
    local want name least
    for want in "${MIN_TESTS[@]}"; do
        name=${want%%:*} least=${want##*:}
        if [ "${EP[$name]:-0}" -lt "$least" ]; then
            gaps+=("ctest entry $name: ${EP[$name]:-0} test(s) passed, at least $least expected (filter or tags wrong?)")
        fi
    done
    local kind
    for backend in "${TOPOLOGIES[@]}" "${FLAVORS[@]}"; do
        kind=topology
        case " ${FLAVORS[*]} " in *" $backend "*) kind=flavor ;; esac
        if [ "${P[$backend]:-0}" -eq 0 ]; then
            gaps+=("$kind $backend: no test passed ($([ "$kind" = topology ] &&
                echo 'not started? DBLOCK_TEST_TOPOLOGIES=0?' || echo 'its entries did not run?'))")
        fi
        if [ "${S[$backend]:-0}" -gt 0 ]; then
            gaps+=("$kind $backend: ${S[$backend]} test(s) SKIPPED")
        fi
    done
    if [ "${#gaps[@]}" -gt 0 ]; then
        if is_ci; then
            problems+=("${gaps[@]}" "(CI=true: every backend must run completely)")
            fail=1
        else
            banner "WARNING: NOT ALL BACKENDS WERE FULLY TESTED" "${gaps[@]}" \
                "(with CI=true this would fail the run)"
        fi
    fi

    if [ "$fail" -ne 0 ]; then
        banner "TESTS FAILED" "${problems[@]}"
        note_failure "main suite:" "${problems[@]}"
        brief_failed_tests "$dir" "main suite"
        if [ "${#gaps[@]}" -gt 0 ] && is_ci; then
            local gap
            for gap in "${gaps[@]}"; do note_brief "[main suite] $gap"; done
        fi
        return 1
    fi
    printf '\nAll tests passed.\n'
}

if [ -n "${DBLOCK_SUMMARIZE_ONLY:-}" ]; then
    summarize "$DBLOCK_SUMMARIZE_ONLY" 0
    exit
fi

msg "checking dependencies"
stage "install dependencies" bash "$REPO_ROOT/scripts/install-deps.sh"
# shellcheck source=scripts/ccache.sh
. "$REPO_ROOT/scripts/ccache.sh"

build_plain() {
    msg "configuring ($BUILD_DIR)"
    # -g1 (line tables: every frame of a crash is still named) instead of -g: a third less
    # compile time and a quarter of the object size, so the links are faster too.
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DDBLOCK_TESTS=ON \
        -DDBLOCK_EXAMPLES=ON "${CCACHE_CMAKE_ARGS[@]}" || return
    msg "building"
    cmake --build "$BUILD_DIR" -j"$(nproc)"
}
stage "build (plain)" build_plain
BUILD_TIME=$(wall_time)

# The product a MySQL URL's server names itself by: "MySQL" or "MariaDB" (its @@version_comment
# and @@version, read with the mariadb client).
mysql_product() {
    python3 - "$1" <<'PY'
import os, subprocess, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
if u.scheme not in ("mysql", "mariadb") or not u.hostname:
    sys.exit("not a mysql://user:password@host:port/database URL: " + sys.argv[1])
env = dict(os.environ, MYSQL_PWD=urllib.parse.unquote(u.password or ""))
cmd = ["mariadb", "--batch", "--skip-column-names", "--connect-timeout=10",
       "-h", u.hostname, "-P", str(u.port or 3306), "-u", urllib.parse.unquote(u.username or ""),
       "-e", "SELECT CONCAT(@@version, ' ', @@version_comment)"]
r = subprocess.run(cmd, env=env, capture_output=True, text=True)
if r.returncode != 0:
    sys.exit("cannot reach " + u.hostname + ":" + str(u.port or 3306) + ": " + r.stderr.strip())
print("MariaDB" if "mariadb" in r.stdout.lower() else "MySQL")
PY
}

# The MySQL tests against DBLOCK_TEST_EXTERNAL_MYSQL_URL (see the top of this file).
external_mysql_suite() {
    local url=$DBLOCK_TEST_EXTERNAL_MYSQL_URL product tail="" status=0
    product=$(mysql_product "$url") || return 1
    # The MySQL 8 flavor (a MySQL 8 server, or MariaDB under the test-only flavor switch)
    # refuses session leases: their tests are left out, as in CI's flavor entries.
    if [ "$product" = MySQL ] || [ "${DBLOCK_TEST_MYSQL_FLAVOR:-}" = mysql ]; then
        tail="~[session_lease]"
    fi
    msg "the MySQL tests against a $product server of your own${tail:+ (no session leases: MySQL 8 flavor)}"
    DBLOCK_TEST_MYSQL_URL=$url DBLOCK_TEST_ENTRY=mysql \
        "$BUILD_DIR/tests/dblock_tests" "[mysql]$tail" || status=$?
    DBLOCK_TEST_MYSQL_URL=$url DBLOCK_TEST_ENTRY=faults_mysql \
        "$BUILD_DIR/tests/faults/dblock_fault_tests" "[faults][mysql]~[topology]$tail" || status=$?
    return "$status"
}

# Each test process drops its per-backend counts here (see tests/support).
# Fresh per run so that results of earlier runs cannot be counted.
DBLOCK_TEST_SUMMARY_DIR=$(mktemp -d "${TMPDIR:-/tmp}/dblock-summary.XXXXXX")
export DBLOCK_TEST_SUMMARY_DIR
on_exit() {
    local st=$?
    rm -rf "$DBLOCK_TEST_SUMMARY_DIR"
    if [ "${own_stage_log:-0}" = 1 ]; then
        stage_report
        rm -f "$DBLOCK_STAGE_LOG" "$DBLOCK_STAGE_LOG.count" "$DBLOCK_FAILURE_LOG" "$DBLOCK_FAILURE_LOG.brief"
    fi
    return "$st"
}
trap on_exit EXIT

# As root the package test below builds the library shared, checks its SONAME and links
# consumers to it with find_package and pkg-config: consumer_shared (the same for users who
# cannot install packages) would repeat it, and its build would compete with the timing of the
# tests beside it.
skip_entries=()
if [ "$(id -u)" = 0 ] && [ "${DBLOCK_QUICK:-}" != 1 ] && [ "$#" -eq 0 ]; then
    skip_entries=(-E '^consumer_shared$')
fi

if [ -n "${DBLOCK_TEST_EXTERNAL_MYSQL_URL:-}" ]; then
    ext_status=0
    stage "MySQL tests against your server" external_mysql_suite || ext_status=$?
    # Only the mysql row is required here; the minimum counts are CI's.
    BACKENDS=(mysql) TOPOLOGIES=() FLAVORS=() MIN_TESTS=()
    summarize "$DBLOCK_TEST_SUMMARY_DIR" "$ext_status"
    exit
fi

msg "running tests against throwaway servers"
ctest_status=0
ctest_log="$DBLOCK_TEST_SUMMARY_DIR/ctest.log"
# Three entries at a time: the entries spend most of their time waiting (TTLs, rings, the
# servers), not computing (13% of two cores at -j3), so a third one beside them cost none of the
# others any time and took the suite from 1,122 s to 888 s on a 2-core machine (serial entries
# still run alone). The per-entry timeout is a hang detector, not a pace: the mysql entry takes
# about 350 s on a quiet 2-core machine, 846 s beside two CPU hogs and a compile, and ran past
# the former 900 s beside two hogs, a build and a second test run (soak of 2026-12-07).
main_suite() {
    "$REPO_ROOT/scripts/test-servers.sh" run -- \
        ctest --test-dir "$BUILD_DIR" --output-on-failure -j3 --timeout 1800 "${skip_entries[@]}" "$@" \
        2>&1 | tee "$ctest_log" || return "${PIPESTATUS[0]}"
}
stage "main suite (all backends, topologies)" main_suite "$@" || ctest_status=$?
"$REPO_ROOT/scripts/repeat-failures.sh" "$ctest_log" "main suite"

status=0
summarize "$DBLOCK_TEST_SUMMARY_DIR" "$ctest_status" || status=$?
printf '\nWall time: %s (install + build: %s)\n' "$(wall_time)" "$BUILD_TIME"
case "$ctest_status" in
    # Ctrl-C / kill: keep the conventional status so callers see the interrupt.
    130 | 143)
        echo "Interrupted." >&2
        exit "$ctest_status"
        ;;
esac
[ "$status" -eq 0 ] || exit "$status"

# The same suite again under the sanitizers, and the fuzzers for a fixed number of inputs.
# DBLOCK_QUICK=1 skips them (for quick local iterations only; CI always runs them). Extra
# arguments (a ctest filter) also skip them: they are for running a part of the suite.
if [ "${DBLOCK_QUICK:-}" = 1 ] || [ "$#" -gt 0 ]; then
    if is_ci; then
        echo "test.sh: CI=true runs the whole suite: DBLOCK_QUICK and ctest filters are refused" >&2
        exit 2
    fi
    banner "Skipped: fuzzers and sanitizer runs (DBLOCK_QUICK=1 or a ctest filter was given)."
    exit 0
fi
if [ "$(id -u)" = 0 ]; then
    msg "packages: libdblock0, libdblock-dev and dblock built, installed, used and removed"
    stage "package test" env PACKAGE_BUILD_TYPE=Quick bash "$REPO_ROOT/scripts/package-test.sh"
elif is_ci; then
    echo "test.sh: CI=true runs the package test, which installs packages: run it as root" >&2
    exit 1
else
    banner "Skipped: the package test (scripts/package-test.sh installs packages: run as root)."
fi
msg "fuzzers: ${DBLOCK_FUZZ_RUNS:-20000} inputs each, under ASan+UBSan"
stage "fuzzers" bash "$REPO_ROOT/scripts/fuzz.sh" "${DBLOCK_FUZZ_RUNS:-20000}"
msg "sanitizers: the whole suite under ASan+UBSan, the threaded tests under TSan"
bash "$REPO_ROOT/scripts/sanitizers.sh" all
printf '\nWall time with fuzzers and sanitizers: %s\n' "$(wall_time)"

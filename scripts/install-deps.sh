#!/usr/bin/env bash
# Install the Debian 12 packages needed to build and test dblock.
#
# Idempotent: when everything is already installed it only runs dpkg-query
# and exits immediately, so test.sh can call it unconditionally on every run.
# Only when something is missing does it need root (for apt-get).
set -euo pipefail

# Everything the build, the tests and the helper scripts need.
# Add new packages here; nothing else in this file has to change.
PACKAGES=(
    build-essential
    g++
    cmake
    pkg-config
    libsoci-dev
    libboost-dev
    libpq-dev
    libmariadb-dev
    libsqlite3-dev
    sqlite3
    catch2
    libyaml-cpp-dev
    libcli11-dev
    nlohmann-json3-dev
    prometheus-cpp-dev
    liburiparser-dev
    libhiredis-dev
    postgresql
    mariadb-server
    mariadb-client
    # scripts/topologies.sh: the test topologies (3-node Galera cluster with mariabackup state
    # transfer, PostgreSQL primary + standby uses postgresql itself, PgBouncer in front of it)
    galera-4
    mariadb-backup
    pgbouncer
    socat
    faketime
    clang-format
    doxygen
    # scripts/ccache.sh: CI builds the same sources with four sets of flags, and a machine that
    # built them before compiles only what changed
    ccache
    # the dblock(1) man page of the dblock package, written from `dblock --help`
    # (cmake/packaging.cmake, scripts/package-test.sh)
    help2man
    # scripts/package-test.sh checks that `man -w dblock` finds the installed page
    man-db
    # scripts/markdown.py: the link check (scripts/check-links.sh) and the docs' Doxygen filter
    python3
    # tests/sql_api/: the SQL API called from Python as users do (docs/sql-api.md), through
    # Debian's own drivers for PostgreSQL and MariaDB
    python3-psycopg2
    python3-mysqldb
    # scripts/structure-check.sh: the function-size rule
    clang-tidy
    # scripts/fuzz.sh: clang++ with -fsanitize=fuzzer needs the compiler-rt archives
    # (libclang_rt.fuzzer*, asan, ubsan) of libclang-rt-14-dev, which clang only recommends;
    # llvm provides llvm-symbolizer for readable sanitizer stacks.
    clang
    libclang-rt-14-dev
    llvm
    procps
    iproute2
    # the test harness prints every thread's backtrace of a worker process that hangs
    gdb
)

# `install-deps.sh --bench` adds what the benchmark's optional parts use: a throwaway Redis to
# compare against, and gnuplot for `dblock-bench --plot`.
if [ "${1:-}" = --bench ]; then
    PACKAGES+=(redis-server redis-tools gnuplot-nox)
fi

log() { printf 'install-deps: %s\n' "$*" >&2; }

missing=()
for pkg in "${PACKAGES[@]}"; do
    # A package that dpkg has never heard of makes dpkg-query fail; one that
    # was removed but not purged reports "deinstall ok config-files". Both
    # count as missing: only "... ok installed" is good enough.
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    case "$status" in
        *" ok installed") ;;
        *) missing+=("$pkg") ;;
    esac
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all ${#PACKAGES[@]} required packages are already installed."
    exit 0
fi

log "missing packages: ${missing[*]}"

if [ "$(id -u)" -ne 0 ]; then
    log "ERROR: installing packages needs root. Re-run as root or with sudo:"
    log "    sudo $0"
    exit 1
fi

# postgresql and mariadb-server would start system-wide daemons from their
# postinst scripts. We never use those (tests run private throwaway servers,
# see scripts/test-servers.sh), and on machines without systemd starting them
# can fail or hang. A policy-rc.d that exits 101 tells invoke-rc.d "not
# allowed", so the packages install without starting anything. Only remove
# the file afterwards if it was ours: an existing one (e.g. in Docker images)
# belongs to the system.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        rm -f "$POLICY"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# Temporary, created by dblock scripts/install-deps.sh\nexit 101\n' >"$POLICY"
    chmod 755 "$POLICY"
    created_policy=1
fi

export DEBIAN_FRONTEND=noninteractive
log "running apt-get update"
apt-get update
log "installing: ${missing[*]}"
apt-get install -y --no-install-recommends "${missing[@]}"
log "done."

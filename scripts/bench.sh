#!/usr/bin/env bash
# The benchmark suite on all three backends in one run: builds dblock, starts the throwaway
# PostgreSQL and MariaDB servers of the tests (and a throwaway redis-server when one is
# installed), runs dblock-bench, and writes bench/results/<UTC date>-<host>.json and .svg.
#
# Usage: scripts/bench.sh [DBLOCK_BENCH_ARGS...]    e.g. scripts/bench.sh --seconds 5
# Environment: BUILD_DIR (default build), BENCH_OUT (default bench/results).
# Not part of the test suite: speed is measured here, never in timed tests.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
out=${BENCH_OUT:-$root/bench/results}

bash "$root/scripts/install-deps.sh" --bench
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDBLOCK_BENCH=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target dblock-bench >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/dblock-bench.XXXXXX")
redis_pid=
cleanup() {
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

redis_args=()
if command -v redis-server >/dev/null; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # In memory only, loopback only, no persistence: a throwaway server like the others.
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$work" --logfile "$work/redis.log" &
    redis_pid=$!
    for _ in $(seq 50); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    redis_args=(--redis "127.0.0.1:$port")
else
    echo "bench: redis-server is not installed: the Redis comparison is skipped" >&2
fi

mkdir -p "$out"
stamp="$(date -u +%Y-%m-%dT%H%M%SZ)-$(hostname -s)"
plot_args=()
command -v gnuplot >/dev/null && plot_args=(--plot "$out/$stamp.svg")

# shellcheck disable=SC2016 # expanded by the inner shell, after test-servers.sh exported them
"$root/scripts/test-servers.sh" run -- bash -c '
    exec "$0" --url "$DBLOCK_TEST_POSTGRESQL_URL" --url "$DBLOCK_TEST_MYSQL_URL" \
        --url "sqlite://$DBLOCK_TEST_SERVERS_DIR/bench.db" "$@"' \
    "$build/bench/dblock-bench" "${redis_args[@]}" --output "$out/$stamp.json" "${plot_args[@]}" "$@"
echo "bench: results in $out/$stamp.json" >&2

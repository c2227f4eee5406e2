#!/usr/bin/env bash
# The PostgreSQL part of the suite once more, through PgBouncer in transaction mode (started by
# scripts/test-servers.sh, DBLOCK_TEST_PGBOUNCER_URL) with dblock's pooler=transaction. Tests
# tagged [direct] need a direct server connection (they end server sessions, set session-level
# settings or check a session's isolation level) and are left out. Results are counted under
# "pgbouncer:postgresql", which scripts/test.sh requires under CI=true.
#
# Usage: pgbouncer.sh DBLOCK_TESTS_BINARY
set -euo pipefail
bin=$1
if [ -z "${DBLOCK_TEST_PGBOUNCER_URL:-}" ]; then
    echo "pgbouncer: DBLOCK_TEST_PGBOUNCER_URL is not set (scripts/test-servers.sh starts" \
        "PgBouncer unless DBLOCK_TEST_TOPOLOGIES=0)" >&2
    exit 77 # skipped; under CI=true scripts/test.sh fails the run for the missing topology
fi
url=$DBLOCK_TEST_PGBOUNCER_URL
case $url in
    *\?*) url="$url&pooler=transaction" ;;
    *) url="$url?pooler=transaction" ;;
esac
DBLOCK_TEST_POSTGRESQL_URL=$url DBLOCK_TEST_SUMMARY_LABEL=pgbouncer \
    exec "$bin" "[postgresql]~[direct]" -w NoTests --durations yes

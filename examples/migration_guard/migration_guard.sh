#!/usr/bin/env bash
# Migration guard: N "deploy hosts" start at the same moment and each runs
#
#     dblock exec --lock migrations/<app> --wait 30s -- ./migrate-once.sh
#
# migrate-once.sh applies the migrations the shared marker file does not list yet (a slow
# check-then-act). Under the lock exactly one host applies them; the others wait for the lock,
# then find the work done and skip. The point is the lock across hosts, not the SQL: the guarded
# work writes to files in a shared directory, so this runs the same on every backend.
#
# Checked at the end: every host exited 0, and the migration log has exactly one entry per
# migration. Exit status 0 only then (1 when broken, 2 on a usage or setup error).
# --no-lock runs migrate-once.sh on every host without dblock: the negative control, which
# applies migrations twice (and exits 1).
#
# Usage: migration_guard.sh [--dblock BIN] [--url URL] [--table-prefix mg_] [--hosts 5]
#                           [--app shop] [--keep] [--no-lock]
# Environment: DBLOCK_BIN (default: `dblock` on PATH, else the build tree's), DBLOCK_URL (default:
# a SQLite file in the temporary directory), MIGRATION_SECONDS (default 0.2).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DBLOCK=${DBLOCK_BIN:-}
URL=${DBLOCK_URL:-}
PREFIX=mg_
HOSTS=5
APP=shop
KEEP=0
USE_LOCK=1
export MIGRATIONS="0001_create_customers 0002_add_email_to_customers 0003_create_orders"
export MIGRATION_SECONDS=${MIGRATION_SECONDS:-0.2}

usage() {
    sed -n '/^# Usage:/,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}
die() {
    echo "migration_guard: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
        --dblock) DBLOCK=${2:?}; shift 2 ;;
        --url) URL=${2:?}; shift 2 ;;
        --table-prefix) PREFIX=${2:?}; shift 2 ;;
        --hosts) HOSTS=${2:?}; shift 2 ;;
        --app) APP=${2:?}; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --no-lock) USE_LOCK=0; shift ;;
        -h | --help) usage ;;
        *) echo "migration_guard: unknown argument: $1" >&2; usage ;;
    esac
done
case "$HOSTS" in '' | *[!0-9]*) die "--hosts must be a number" ;; esac
if [ "$HOSTS" -lt 1 ] || [ "$HOSTS" -gt 64 ]; then die "--hosts must be in 1..64"; fi

if [ -z "$DBLOCK" ]; then
    if command -v dblock >/dev/null 2>&1; then
        DBLOCK=$(command -v dblock)
    elif [ -x "$HERE/../../build/dblock" ]; then
        DBLOCK=$HERE/../../build/dblock
    fi
fi
if [ "$USE_LOCK" -eq 1 ]; then
    if [ -z "$DBLOCK" ] || [ ! -x "$DBLOCK" ]; then
        die "no dblock binary: set DBLOCK_BIN or pass --dblock"
    fi
fi

# The shared directory the deploy hosts write to (think: the database they migrate).
STATE=$(mktemp -d "${TMPDIR:-/tmp}/migration_guard.XXXXXX")
if [ "$KEEP" -eq 1 ]; then
    echo "keeping $STATE"
else
    trap 'rm -rf -- "$STATE"' EXIT
fi
export MIGRATION_STATE_DIR=$STATE
[ -n "$URL" ] || URL="sqlite://$STATE/migration_guard.db"

if [ "$USE_LOCK" -eq 1 ]; then
    echo "migration guard: $HOSTS deploy hosts, lock migrations/$APP, $(echo "$MIGRATIONS" | wc -w) migrations"
    # Once per database (safe to repeat, and to run concurrently): dblock's own table.
    "$DBLOCK" migrate --url "$URL" --table-prefix "$PREFIX" >"$STATE/dblock-migrate.out" 2>&1 ||
        { cat "$STATE/dblock-migrate.out" >&2; die "dblock migrate failed"; }
else
    echo "migration guard WITHOUT the lock (negative control): $HOSTS deploy hosts"
fi

# All hosts start together.
pids=()
for i in $(seq 1 "$HOSTS"); do
    if [ "$USE_LOCK" -eq 1 ]; then
        DEPLOY_HOST=host$i "$DBLOCK" exec --url "$URL" --table-prefix "$PREFIX" \
            --lock "migrations/$APP" --ttl 10s --wait 30s -- "$HERE/migrate-once.sh" \
            >"$STATE/host$i.out" 2>&1 &
    else
        DEPLOY_HOST=host$i "$HERE/migrate-once.sh" >"$STATE/host$i.out" 2>&1 &
    fi
    pids+=($!)
done

failed=0
printf '\n%-8s %6s %6s %8s %8s\n' host status fence applied skipped
for i in $(seq 1 "$HOSTS"); do
    status=0
    wait "${pids[$((i - 1))]}" || status=$?
    line=$(grep -E "^host$i: fence" "$STATE/host$i.out" || true)
    fence=$(sed -nE 's/.*fence ([^,]+),.*/\1/p' <<<"$line")
    applied=$(sed -nE 's/.*applied ([0-9]+),.*/\1/p' <<<"$line")
    skipped=$(sed -nE 's/.*skipped ([0-9]+)$/\1/p' <<<"$line")
    printf '%-8s %6s %6s %8s %8s\n' "host$i" "$status" "${fence:--}" "${applied:--}" "${skipped:--}"
    if [ "$status" -ne 0 ]; then
        failed=$((failed + 1))
        sed 's/^/    /' "$STATE/host$i.out"
    fi
done

# The migration log: exactly one entry per migration.
touch "$STATE/migration.log"
printf '\n%-30s %7s  %s\n' migration entries "applied by"
broken=0
for m in $MIGRATIONS; do
    n=$(grep -c -- "^$m " "$STATE/migration.log" || true)
    by=$(grep -- "^$m " "$STATE/migration.log" | awk '{ printf "%s%s (%s)", sep, $2, $3; sep = ", " }')
    printf '%-30s %7s  %s\n' "$m" "$n" "${by:--}"
    [ "$n" -eq 1 ] || broken=$((broken + 1))
done
total=$(wc -l <"$STATE/migration.log")
expected=$(echo "$MIGRATIONS" | wc -w)

echo
if [ "$failed" -eq 0 ] && [ "$broken" -eq 0 ] && [ "$total" -eq "$expected" ]; then
    echo "invariant held: every migration applied exactly once ($expected migrations, $total log entries, $HOSTS hosts)"
    exit 0
fi
echo "invariant BROKEN: $total log entries for $expected migrations, $broken migration(s) not applied exactly once, $failed host(s) failed"
[ "$USE_LOCK" -eq 1 ] || echo "(expected without the lock: every host saw the migrations pending)"
exit 1

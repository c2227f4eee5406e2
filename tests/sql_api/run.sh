#!/usr/bin/env bash
# The SQL API's snippets of docs/sql-api.md, run as users run them: psql and Python (psycopg2,
# MySQLdb, sqlite3; Debian's /usr/bin/python3 and its packages) against the test servers and a
# SQLite file, with the library on the other side through the dblock CLI. For each backend:
# while `dblock exec` holds the lease, the snippet is refused it ("another process holds"); once
# it is free, the snippet takes it, checks its fence in its transaction and releases it; then
# the library takes it again at a higher fence (`dblock status --all --json`). Each run uses a
# table prefix of its own: the snippets' table and routine names get it.
#
# Usage: run.sh DBLOCK_CLI DOCS_SQL_API_MD
# Environment: DBLOCK_TEST_POSTGRESQL_URL, DBLOCK_TEST_MYSQL_URL (scripts/test-servers.sh).
set -euo pipefail
cli=$1
doc=$2
py=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="sqlapi$$_"

fail() {
    echo "sql_api: FAILED: $*" >&2
    exit 1
}

# extract TAG OUT: the fenced block of the doc whose first line is "# sql-api: TAG", with the
# prefix added to dblock's table and routine names.
extract() {
    "$py" - "$doc" "$1" "$prefix" >"$2" <<'PY'
import re, sys
doc, tag, prefix = sys.argv[1:4]
for block in re.findall(r"```(?:python|sh)\n(.*?)```", open(doc).read(), re.S):
    if block.startswith("# sql-api: " + tag + "\n"):
        block = re.sub(r"\b(dblock_(?:acquire|renew|release|check_fence)|resource_lock"
                       r"(?:_fence_floor)?)\b", prefix + r"\1", block)
        print(block, end="")
        break
else:
    sys.exit("docs/sql-api.md has no block tagged '# sql-api: " + tag + "'")
PY
}

# fence_of URL: the fence of nightly-report, as the library's status reports it.
fence_of() {
    "$cli" status --url "$1" --table-prefix "$prefix" --all --json |
        "$py" -c 'import json, sys
rows = [r for r in json.load(sys.stdin)["locks"] if r["name"] == "nightly-report"]
print(rows[0]["fence"] if rows else 0)'
}

# check BACKEND URL RUN...: the protocol above, RUN being the snippet's command line.
check() {
    local backend=$1 url=$2
    shift 2
    "$cli" migrate --url "$url" --table-prefix "$prefix" >/dev/null
    # Held by the library: refused.
    "$cli" exec --url "$url" --table-prefix "$prefix" --lock nightly-report --ttl 30s -- \
        sleep 3 &
    local holder=$!
    sleep 1
    local out
    out=$("$@" 2>&1) || true
    grep -q "another process holds nightly-report" <<<"$out" ||
        fail "$backend: not refused while the library held the lease: $out"
    wait "$holder" || fail "$backend: dblock exec failed"
    local before after
    before=$(fence_of "$url")
    # Free: taken, checked, released.
    out=$("$@" 2>&1) || fail "$backend: the snippet failed: $out"
    # The library takes it again, at a higher fence than the snippet's.
    "$cli" exec --url "$url" --table-prefix "$prefix" --lock nightly-report -- true ||
        fail "$backend: the library could not take the lease after the snippet released it"
    after=$(fence_of "$url")
    [ "$after" -ge $((before + 2)) ] ||
        fail "$backend: fences went $before -> $after (the snippet's grant and the library's)"
    echo "sql_api: $backend ok (fences $before -> $after)"
}

pg=${DBLOCK_TEST_POSTGRESQL_URL:?DBLOCK_TEST_POSTGRESQL_URL is not set (scripts/test-servers.sh)}
my=${DBLOCK_TEST_MYSQL_URL:?DBLOCK_TEST_MYSQL_URL is not set (scripts/test-servers.sh)}

extract postgresql "$work/pg.py"
extract psql "$work/psql.sh"
check postgresql "$pg" env DATABASE_URL="${pg%%\?*}" "$py" "$work/pg.py"
check psql "$pg" env DATABASE_URL="${pg%%\?*}" bash "$work/psql.sh"

extract mysql "$work/my.py"
# mysql://user:password@host:port/db
rest=${my#mysql://}
rest=${rest%%\?*}
cred=${rest%@*}
where=${rest##*@}
hostport=${where%%/*}
check mysql "$my" env MYSQL_USER="${cred%%:*}" MYSQL_PASSWORD="${cred#*:}" \
    MYSQL_HOST="${hostport%%:*}" MYSQL_PORT="${hostport##*:}" MYSQL_DATABASE="${where#*/}" \
    "$py" "$work/my.py"

extract sqlite "$work/lite.py"
check sqlite "sqlite://$work/lite.db" env SQLITE_PATH="$work/lite.db" "$py" "$work/lite.py"
echo "sql_api: all snippets ran"

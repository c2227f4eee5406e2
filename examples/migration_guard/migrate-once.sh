#!/usr/bin/env bash
# The guarded work of migration_guard.sh: "applies" every migration named in $MIGRATIONS that
# the marker file does not list yet, appending one line per applied migration to the migration
# log. It is a check-then-act with a slow step in the middle, so it is only correct when one
# host at a time runs it: that is what `dblock exec --lock migrations/<app>` is for.
#
# Environment: MIGRATION_STATE_DIR (the shared directory: marker file "applied" and
# "migration.log"), MIGRATIONS (space-separated names, in order), MIGRATION_SECONDS (how long one
# migration takes, default 0.2), DEPLOY_HOST (a name for the output), and from dblock exec
# DBLOCK_FENCE / DBLOCK_LOCK (recorded in the log; "none" when run without the lock).
set -euo pipefail

state=${MIGRATION_STATE_DIR:?MIGRATION_STATE_DIR is not set}
host=${DEPLOY_HOST:-$(hostname)}
fence=${DBLOCK_FENCE:-none}
marker=$state/applied
log=$state/migration.log
touch "$marker"

applied=0
skipped=0
for m in ${MIGRATIONS:?MIGRATIONS is not set}; do
    if grep -qxF -- "$m" "$marker"; then
        skipped=$((skipped + 1)) # another host already did it
        continue
    fi
    sleep "${MIGRATION_SECONDS:-0.2}" # the ALTER TABLE takes a while (and widens the race)
    printf '%s %s fence=%s\n' "$m" "$host" "$fence" >>"$log"
    printf '%s\n' "$m" >>"$marker"
    applied=$((applied + 1))
done
echo "$host: fence $fence, applied $applied, skipped $skipped"

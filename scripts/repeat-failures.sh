#!/usr/bin/env bash
# Prints the failed checks of a test run's log again, whole, at its end: a long run's log is
# often read from its two ends only, and the failure sits in the middle. With DBLOCK_FAILURE_LOG
# set (.ci/run), they are also added to that record, which .ci/run prints at the very end.
# Usage: scripts/repeat-failures.sh LOG [STAGE]
set -euo pipefail
log=$1
stage=${2:-}
[ -f "$log" ] || exit 0
pattern=': FAILED:|FAILED:$|ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer|ERROR: LeakSanitizer'
n=$(grep -c -E "$pattern|The following tests FAILED:" "$log" || true)
[ "$n" -gt 0 ] || exit 0
out=$(
    printf '\n==== %s failure(s)%s, repeated from the log above ====\n' "$n" "${stage:+ in stage \"$stage\"}"
    # Catch's console reporter: the test's name (between dashed rules), its file, then the check.
    grep -n -B14 -A12 -E "$pattern" "$log" | head -n 400
    # ctest's own list (an entry that timed out or crashed has no Catch failure above).
    sed -n '/The following tests FAILED:/,/^Errors while running CTest/p' "$log"
    printf '==== end of the repeated failures ====\n'
)
printf '%s\n' "$out"
if [ -n "${DBLOCK_FAILURE_LOG:-}" ]; then
    printf '%s\n' "$out" >>"$DBLOCK_FAILURE_LOG"
    # The brief list (scripts/stages.sh): each failed ctest entry with its outcome (an entry that
    # crashed or timed out has no failed test case of its own) and each sanitizer report's
    # headline. The failed test cases themselves come from the binary's failed-*.txt.
    {
        sed -n '/The following tests FAILED:/,/^Errors while running CTest/p' "$log" |
            grep -E '^[[:space:]]*[0-9]+ - ' | sed -E "s/^[[:space:]]*[0-9]+ - /[${stage:-tests}] ctest entry /"
        grep -E 'ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer|ERROR: LeakSanitizer|^SUMMARY: ' "$log" |
            head -n 6 | sed "s/^/[${stage:-tests}] /"
    } | awk '!seen[$0]++' | cut -c1-300 >>"$DBLOCK_FAILURE_LOG.brief" || true
fi

#!/usr/bin/env bash
# Prints the failed checks of a test run's log again, whole, at its end: a long run's log is
# often read from its two ends only, and the failure sits in the middle.
# Usage: scripts/repeat-failures.sh LOG
set -euo pipefail
log=$1
[ -f "$log" ] || exit 0
n=$(grep -c -E ': FAILED:|FAILED:$|ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer' "$log" || true)
[ "$n" -gt 0 ] || exit 0
printf '\n==== %s failure(s) in this run, repeated from the log above ====\n' "$n"
# Catch's console reporter: the test's name (between dashed rules), its file, then the check.
grep -n -B14 -A12 -E ': FAILED:|FAILED:$|ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer' \
    "$log" | head -n 400
printf '==== end of the repeated failures ====\n'

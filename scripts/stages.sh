# shellcheck shell=bash
# The CI log's record of its stages (sourced by .ci/run and scripts/test.sh): each stage's name,
# its elapsed time and its outcome go to $DBLOCK_STAGE_LOG, each failed check whole to
# $DBLOCK_FAILURE_LOG; stage_report prints both, so that the end of a long log (what a run's
# record keeps) names every failure, the stage it failed in and where the time went.

# stage NAME CMD...: runs CMD as the stage NAME and records it; returns CMD's status.
stage() {
    local name=$1 t=$SECONDS status=0
    shift
    printf '\n==> stage: %s\n' "$name" >&2
    "$@" || status=$?
    if [ -n "${DBLOCK_STAGE_LOG:-}" ]; then
        printf '%s\t%d\t%d\n' "$name" $((SECONDS - t)) "$status" >>"$DBLOCK_STAGE_LOG"
    fi
    return "$status"
}

# note_failure TEXT...: adds lines to the failure record (printed again at the end of the log).
note_failure() {
    [ -n "${DBLOCK_FAILURE_LOG:-}" ] || return 0
    printf '%s\n' "$@" >>"$DBLOCK_FAILURE_LOG"
}

# note_brief TEXT...: adds lines to the brief failure list, a line per failed check, printed
# last before the stage table: a run's record may keep only the last few dozen lines of its log.
note_brief() {
    [ -n "${DBLOCK_FAILURE_LOG:-}" ] || return 0
    printf '%s\n' "$@" >>"$DBLOCK_FAILURE_LOG.brief"
}

# brief_failed_tests DIR STAGE: the failed test cases the test binary recorded in DIR
# (tests/support/main.cpp writes "backend<TAB>name<TAB>file:line: first failed check" per failed
# test case to failed-*.txt where DBLOCK_TEST_SUMMARY_DIR points) into the brief list.
brief_failed_tests() {
    local dir=$1 stage=$2 backend name where
    while IFS=$'\t' read -r backend name where; do
        [ -n "$name" ] || continue
        note_brief "[$stage] <$backend> $name" \
            "    ${where:-(no failed assertion: an exception or a crash?)}"
    done < <(find "$dir" -type f -name 'failed-*.txt' -print0 2>/dev/null | sort -z | xargs -0 -r cat)
}

# stage_report: the failures, whole, then one line per stage (seconds, outcome) and the total.
stage_report() {
    local name secs status total=0 failed=0
    if [ -s "${DBLOCK_FAILURE_LOG:-/nonexistent}" ]; then
        printf '\n==================== failed checks of this run ====================\n'
        cat "$DBLOCK_FAILURE_LOG"
        printf '==================== end of the failed checks ====================\n'
    fi
    if [ -s "${DBLOCK_FAILURE_LOG:-/nonexistent}.brief" ]; then
        printf '\nfailed checks, in brief ([stage] <backend> test case, then where and what):\n'
        head -n 24 "$DBLOCK_FAILURE_LOG.brief"
        local more
        more=$(($(wc -l <"$DBLOCK_FAILURE_LOG.brief") - 24))
        [ "$more" -le 0 ] || printf '... and %d more lines (the failed checks above)\n' "$more"
    fi
    [ -s "${DBLOCK_STAGE_LOG:-/nonexistent}" ] || return 0
    printf '\n%-44s %8s  %s\n' stage elapsed outcome
    printf '%-44s %8s  %s\n' -------------------------------------------- -------- -------
    while IFS=$'\t' read -r name secs status; do
        total=$((total + secs))
        if [ "$status" -eq 0 ]; then
            printf '%-44s %5dm%02ds  ok\n' "$name" $((secs / 60)) $((secs % 60))
        else
            failed=$((failed + 1))
            printf '%-44s %5dm%02ds  FAILED (exit %s)\n' "$name" $((secs / 60)) $((secs % 60)) "$status"
        fi
    done <"$DBLOCK_STAGE_LOG"
    printf '%-44s %5dm%02ds  %s\n' "sum of the stages" $((total / 60)) $((total % 60)) \
        "$([ "$failed" -eq 0 ] && echo 'all stages passed' || echo "$failed stage(s) failed")"
    # The wall time since the run began (the stages' sum leaves out the time between them).
    if [ -n "${DBLOCK_STAGE_T0:-}" ]; then
        local wall=$(($(date +%s) - DBLOCK_STAGE_T0))
        printf '%-44s %5dm%02ds\n' "wall time" $((wall / 60)) $((wall % 60))
    fi
    # The plain suite's count (scripts/test.sh), last.
    if [ -s "$DBLOCK_STAGE_LOG.count" ]; then
        printf '\n'
        cat "$DBLOCK_STAGE_LOG.count"
    fi
}

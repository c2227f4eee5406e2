#!/usr/bin/env bash
# The proof that CI is green under load: `.ci/run` N times in a row in fresh clones of HEAD, each
# with CPU hogs beside it (`yes > /dev/null`, HOGS of them), as a shared CI machine may be. Each
# run's log is kept; a summary line per run (outcome, minutes) and at the end the failed checks of
# every failed run (their logs end with them, scripts/stages.sh).
#
# Each hog runs in a session of its own (setsid), as a second job on the machine would. A hog in
# the suite's own session is another load altogether on kernels with autogroup scheduling
# (/proc/sys/kernel/sched_autogroup_enabled = 1, Debian's default): the servers, which run in
# sessions of their own, then get almost no CPU while runnable (measured: mariadbd with 26
# runnable threads got under 0.1 s of CPU in 20 s, and connections waited 30 s for its greeting),
# whatever their nice value; with autogroup off, the same hogs slow nothing down. SOAK_SAME_SESSION=1
# starts the hogs in the suite's session to show it.
#
# Run 1 is a fresh clone of HEAD, built under the hogs; runs 2..N run `.ci/run` again in that
# clone, whose five build trees are then up to date (a build is deterministic, the tests are what
# load can break, and a fresh build per run would make ten runs take some fifteen hours on a
# 2-core machine). SOAK_FRESH=1 clones and builds afresh for every run.
#
# Usage: scripts/ci-soak.sh [RUNS]        (default 10)
# Environment: HOGS (default 2), SOAK_DIR (default /tmp/dblock-soak): the clone and the logs.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
runs=${1:-10}
hogs=${HOGS:-2}
dir=${SOAK_DIR:-/tmp/dblock-soak}
mkdir -p "$dir"
hog_pids=()
stop_hogs() {
    [ "${#hog_pids[@]}" -eq 0 ] || kill "${hog_pids[@]}" 2>/dev/null || true
    hog_pids=()
}
trap stop_hogs EXIT
summary=()
failed=0
for i in $(seq 1 "$runs"); do
    clone=$dir/clone
    if [ "$i" -eq 1 ] || [ "${SOAK_FRESH:-0}" = 1 ]; then
        rm -rf "$clone"
        git clone -q "$REPO_ROOT" "$clone"
    fi
    for _ in $(seq 1 "$hogs"); do
        if [ "${SOAK_SAME_SESSION:-0}" = 1 ]; then
            yes >/dev/null &
        else
            setsid yes >/dev/null &
        fi
        hog_pids+=($!)
    done
    t=$SECONDS
    status=0
    (cd "$clone" && CI=true bash .ci/run </dev/null) >"$dir/run-$i.log" 2>&1 || status=$?
    stop_hogs
    line=$(printf 'run %2d: %s in %dm%02ds (%s)' "$i" \
        "$([ "$status" -eq 0 ] && echo passed || echo "FAILED, exit $status")" \
        $(((SECONDS - t) / 60)) $(((SECONDS - t) % 60)) "$dir/run-$i.log")
    echo "$line"
    summary+=("$line")
    [ "$status" -eq 0 ] || failed=$((failed + 1))
done
rm -rf "$clone"
printf '\n%s\n' "${summary[@]}"
echo "$((runs - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Build the documentation site (HTML) with Doxygen, per the Doxyfile at the repository root: the
# public API reference of include/dblock/ and the Markdown documents (README.md, docs/, ...) as
# one site. Any Doxygen warning (an undocumented public entry, a bad @param or reference, a link
# that does not resolve in the site, ...) fails the run. `cmake --build build --target docs`
# runs this script. Installs nothing: doxygen comes from scripts/install-deps.sh.
#
# Usage: scripts/docs.sh [OUTDIR]
#
#   OUTDIR  where to write (HTML in OUTDIR/html, which is replaced). Default: $DBLOCK_DOCS_DIR,
#           else $BUILD_DIR/docs (BUILD_DIR default: build). A relative OUTDIR argument is taken
#           from the current directory; the environment variables from the repository root,
#           like BUILD_DIR in the other scripts.
#
# Exit status: 0 when the documentation built without a warning, 1 otherwise, 2 for bad usage.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
esac
if [ "$#" -gt 1 ]; then
    usage >&2
    exit 2
fi

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

out=${1:-}
if [ -n "$out" ]; then
    out=$(realpath -m -- "$out")
fi
cd "$REPO_ROOT"
if [ -z "$out" ]; then
    out=$(realpath -m -- "${DBLOCK_DOCS_DIR:-${BUILD_DIR:-build}/docs}")
fi

if ! command -v doxygen >/dev/null 2>&1; then
    echo "docs: ERROR: doxygen not found; install it with scripts/install-deps.sh (Debian package doxygen)" >&2
    exit 1
fi
if [ ! -f Doxyfile ]; then
    echo "docs: ERROR: no Doxyfile in $REPO_ROOT" >&2
    exit 1
fi
case "$out" in
    *'"'* | *$'\n'*)
        echo "docs: ERROR: OUTDIR must not contain a double quote or a newline: $out" >&2
        exit 2
        ;;
esac

mkdir -p "$out"
rm -rf "$out/html" # no pages of entries that no longer exist
log=$(mktemp "${TMPDIR:-/tmp}/dblock-docs.XXXXXX")
trap 'rm -f "$log"' EXIT

# The Doxyfile as is, with the output directory replaced (a later setting wins).
status=0
{
    cat Doxyfile
    printf 'OUTPUT_DIRECTORY = "%s"\n' "$out"
} | doxygen - 2>"$log" || status=$?

# Doxygen prints warnings on stderr and, with WARN_AS_ERROR = FAIL_ON_WARNINGS, exits non-zero
# after the run. Anything on stderr counts, so a Doxyfile edit that drops that setting cannot
# make warnings pass silently.
if [ -s "$log" ]; then
    cat "$log" >&2
    count=$(grep -c -E '(warning|error):' "$log" || true)
    echo "docs: FAILED: doxygen reported ${count} warning(s) (see above); fix the doc comments in include/dblock/ or the Markdown named" >&2
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "docs: FAILED: doxygen exited with status $status" >&2
    exit 1
fi
echo "docs: API reference built without warnings: $out/html/index.html"

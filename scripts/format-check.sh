#!/usr/bin/env bash
# Check that all tracked C++ sources are formatted per .clang-format.
# Changes nothing; lists the offending files and exits non-zero if any.
# Fix them with: clang-format -i FILE...
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$REPO_ROOT"

# Source directories to check; missing ones are simply skipped.
DIRS=(include src tests examples bench tools)

if ! command -v clang-format >/dev/null 2>&1; then
    echo "format-check: ERROR: clang-format not found; run scripts/install-deps.sh" >&2
    exit 1
fi
if [ ! -f .clang-format ]; then
    # Without it clang-format silently falls back to LLVM style, which would
    # check against rules nobody chose.
    echo "format-check: ERROR: no .clang-format in $REPO_ROOT" >&2
    exit 1
fi

existing=()
for d in "${DIRS[@]}"; do
    if [ -d "$d" ]; then existing+=("$d"); fi
done

# Only files git tracks: build trees, generated and scratch files are not
# ours to judge.
files=()
if [ "${#existing[@]}" -gt 0 ]; then
    while IFS= read -r -d '' f; do
        case "$f" in
            *.cpp | *.hpp | *.h) files+=("$f") ;;
        esac
    done < <(git ls-files -z -- "${existing[@]}")
fi

if [ "${#files[@]}" -eq 0 ]; then
    echo "format-check: no tracked C++ files found; nothing to check."
    exit 0
fi

# One file per clang-format call, so each offender is known by name without
# parsing diagnostics. Fast enough: a few ms per file.
bad=()
for f in "${files[@]}"; do
    if ! out=$(clang-format --dry-run --Werror "$f" 2>&1); then
        if [[ "$out" == *clang-format-violations* ]]; then
            bad+=("$f")
        else
            # Not a formatting difference but clang-format itself failing
            # (e.g. an option in .clang-format this version does not know):
            # say so instead of blaming every file.
            echo "format-check: ERROR: clang-format failed on $f:" >&2
            printf '%s\n' "$out" | head -n 20 >&2
            exit 1
        fi
    fi
done

if [ "${#bad[@]}" -gt 0 ]; then
    echo "format-check: ${#bad[@]} of ${#files[@]} files are not clang-formatted ($(clang-format --version | head -n 1)):" >&2
    printf '    %s\n' "${bad[@]}" >&2
    echo "format-check: fix with:  clang-format -i ${bad[*]}" >&2
    exit 1
fi
echo "format-check: all ${#files[@]} tracked C++ files are clang-formatted."

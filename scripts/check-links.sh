#!/usr/bin/env bash
# Checks the Markdown files of the repository (every *.md that git tracks or would track, that
# is, not ignored):
#   - every relative link ([text](path), ![alt](path), [label]: path) resolves to a file or
#     directory inside the repository, and a `#anchor` to a heading of the target Markdown file
#     (GitHub's anchor style: lower case, punctuation dropped, spaces to hyphens, -1, -2, ... for
#     repeated headings; <a id="..."> and <a name="..."> count too);
#   - no link leaves the repository and none is absolute (a path starting with /);
#   - no file names a path outside the repository (../shared, /work/);
#   - README.md has at most 200 lines;
#   - every Markdown file is an INPUT of the Doxyfile (a page of the documentation site).
# Links inside fenced code blocks and inline code are not links and are skipped; so are URLs with
# a scheme (https:, mailto:, ...).
#
# The reading of Markdown (code blocks, GitHub's anchors) is scripts/markdown.py's, which the
# API reference's Doxygen filter shares.
#
# Usage: scripts/check-links.sh
# Exit status: 0 when everything resolves, 1 with the list of problems on stderr, 2 when the
# checker cannot run (no git work tree, no python3).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
cd "$REPO_ROOT"

if ! command -v python3 >/dev/null 2>&1; then
    echo "check-links: python3 is needed (Debian: python3)" >&2
    exit 2
fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "check-links: $REPO_ROOT is not a git work tree" >&2
    exit 2
fi

git ls-files -z --cached --others --exclude-standard -- '*.md' | python3 scripts/markdown.py check

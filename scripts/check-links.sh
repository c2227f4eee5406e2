#!/usr/bin/env bash
# Checks the Markdown files of the repository (every *.md that git tracks or would track, that
# is, not ignored):
#   - every relative link ([text](path), ![alt](path), [label]: path) resolves to a file or
#     directory inside the repository, and a `#anchor` to a heading of the target Markdown file
#     (GitHub's anchor style: lower case, punctuation dropped, spaces to hyphens, -1, -2, ... for
#     repeated headings; <a id="..."> and <a name="..."> count too);
#   - no link leaves the repository and none is absolute (a path starting with /);
#   - no file names a path outside the repository (../shared, /work/);
#   - README.md has at most 200 lines.
# Links inside fenced code blocks and inline code are not links and are skipped; so are URLs with
# a scheme (https:, mailto:, ...).
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

# shellcheck disable=SC2016  # the argument of python3 -c is Python, not shell
git ls-files -z --cached --others --exclude-standard -- '*.md' | python3 -c '
import os, re, sys, unicodedata

README_MAX_LINES = 200
root = os.path.realpath(".")
files = sorted({f for f in sys.stdin.read().split("\0") if f and os.path.isfile(f)})
problems = []

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|\x27[^\x27]*\x27|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:name|id)\s*=\s*\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
OUTSIDE = re.compile(r"\.\./shared|/work/")

def strip_code_spans(line):
    # Inline code: a run of n backticks up to the next run of exactly n backticks.
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            j = i
            while j < len(line) and line[j] == "`":
                j += 1
            ticks = line[i:j]
            end = re.compile(r"(?<!`)" + ticks + r"(?!`)").search(line, j)
            if end:
                out.append(" " * (end.end() - i))
                i = end.end()
                continue
            out.append(ticks)
            i = j
            continue
        out.append(line[i])
        i += 1
    return "".join(out)

def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            m = FENCE.match(line)
            if fence is None and m:
                fence = m.group(1)[0] * len(m.group(1))
                continue
            if fence is not None:
                s = line.strip()
                if s.startswith(fence) and set(s) <= {fence[0]}:
                    fence = None
                continue
            yield n, line

def heading_text(raw):
    """The text GitHub renders for a heading: link texts, no HTML tags, no code or emphasis
    markers (underscores are kept: write emphasis in headings with *)."""
    t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    t = re.sub(r"<[^>]+>", "", t)
    return t.replace("`", "").replace("*", "")

def slug(text):
    text = heading_text(text).strip().lower()
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_ " or cat[0] in "LMN" or cat == "Pc":
            kept.append(ch)
    return "".join(kept).replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, found = {}, set()
        for _, line in prose_lines(path):
            for a in HTML_ANCHOR.findall(line):
                found.add(a)
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            found.add(base if k == 0 else "%s-%d" % (base, k))
        anchor_cache[path] = found
    return anchor_cache[path]

def check_target(src, n, target):
    target = target.strip()
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    if not target or SCHEME.match(target):
        return
    path, _, frag = target.partition("#")
    path = path.split("?", 1)[0]
    where = "%s:%d" % (src, n)
    if path.startswith("/"):
        problems.append("%s: absolute link %s (make it relative)" % (where, target))
        return
    if path:
        full = os.path.realpath(os.path.join(os.path.dirname(src) or ".", path))
        if full != root and not full.startswith(root + os.sep):
            problems.append("%s: %s leaves the repository" % (where, target))
            return
        if not os.path.exists(full):
            problems.append("%s: %s does not exist" % (where, target))
            return
    else:
        full = os.path.realpath(src)
    if frag and full.endswith(".md") and os.path.isfile(full):
        if frag not in anchors(os.path.relpath(full, root)):
            problems.append("%s: %s: no heading with the anchor #%s in %s"
                            % (where, target, frag, os.path.relpath(full, root)))

for f in files:
    with open(f, encoding="utf-8") as fh:
        text = fh.read()
    for n, line in enumerate(text.split("\n"), 1):
        if OUTSIDE.search(line):
            problems.append("%s:%d: names a path outside the repository: %s"
                            % (f, n, OUTSIDE.search(line).group(0)))
    for n, line in prose_lines(f):
        code_free = strip_code_spans(line)
        for m in INLINE_LINK.finditer(code_free):
            check_target(f, n, m.group(2))
        m = REF_DEF.match(code_free)
        if m:
            check_target(f, n, m.group(1))
    if f == "README.md":
        lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        if lines > README_MAX_LINES:
            problems.append("README.md: %d lines, at most %d allowed" % (lines, README_MAX_LINES))

if problems:
    sys.stderr.write("check-links: %d problem(s) in %d Markdown files:\n" % (len(problems), len(files)))
    for p in problems:
        sys.stderr.write("  " + p + "\n")
    sys.exit(1)
print("check-links: %d Markdown files, every relative link resolves; README.md within %d lines"
      % (len(files), README_MAX_LINES))
'

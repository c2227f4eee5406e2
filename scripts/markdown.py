#!/usr/bin/env python3
"""dblock's Markdown files, read the way GitHub renders them.

    python3 scripts/markdown.py check < NUL-separated list of files   (scripts/check-links.sh)
    python3 scripts/markdown.py doxygen-filter FILE                    (the Doxyfile's filter)

`check`: every relative link resolves inside the repository (to a file, and a #anchor to a
heading of the target, in GitHub's anchor style), none is absolute or leaves the repository, no
file names a path outside it, README.md has at most 200 lines.

`doxygen-filter`: FILE as Doxygen should read it for the one site of the API reference and the
docs (scripts/docs.sh): each heading but the page title gets an explicit label made of the
file's path and its GitHub anchor, and every link to a #anchor (of the same page or of another
Markdown file) is written to that label, so that a link that works on GitHub works in the site.
"""
import os
import re
import sys
import unicodedata

README_MAX_LINES = 200
root = os.path.realpath(".")

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


def headings(path):
    """(line number, level, GitHub anchor) of every heading of `path`, in order."""
    seen, out = {}, []
    for n, line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.append((n, len(m.group(1)), base if k == 0 else "%s-%d" % (base, k)))
    return out

anchor_cache = {}


def anchors(path):
    if path not in anchor_cache:
        found = {a for _, _, a in headings(path)}
        for _, line in prose_lines(path):
            for a in HTML_ANCHOR.findall(line):
                found.add(a)
        anchor_cache[path] = found
    return anchor_cache[path]



def label(rel, anchor):
    """A Doxygen label for `anchor` of the Markdown file `rel` (letters, digits, _)."""
    text = rel + "_" + anchor
    return "md_" + "".join(c if c.isascii() and c.isalnum() else "_%x_" % ord(c) for c in text)


def title_anchor(rel):
    """The anchor of the page title (the first heading, when it is of level 1)."""
    hs = headings(rel)
    return hs[0][2] if hs and hs[0][1] == 1 else None


def doxygen_filter(path):
    rel = os.path.relpath(os.path.realpath(path), root)
    by_line = {n: (level, a) for n, level, a in headings(rel)}
    title = title_anchor(rel)
    prose = dict(prose_lines(rel))
    sub_readme = os.path.basename(rel) == "README.md" and rel != "README.md"

    def rewrite(target):
        bare = target[1:-1] if target.startswith("<") and target.endswith(">") else target
        if SCHEME.match(bare):
            return target
        p, _, frag = bare.partition("#")
        dest = os.path.relpath(os.path.realpath(os.path.join(os.path.dirname(rel), p)), root)
        dest = dest if p else rel
        if not dest.endswith(".md"):
            return target
        titled = os.path.basename(dest) == "README.md" and dest != "README.md"
        if not frag or frag == title_anchor(dest):
            # The page itself: by its file name, or by its title's label where it has one.
            return "#" + label(dest, title_anchor(dest)) if titled else (p or target)
        return "#" + label(dest, frag)

    out = []
    with open(rel, encoding="utf-8") as fh:
        for n, line in enumerate(fh.read().split("\n"), 1):
            if n in prose:
                code_free = strip_code_spans(line)
                pieces, last = [], 0
                for m in INLINE_LINK.finditer(code_free):
                    pieces.append(line[last:m.start(2)])
                    pieces.append(rewrite(m.group(2)))
                    last = m.end(2)
                pieces.append(line[last:])
                line = "".join(pieces)
                if n in by_line and sub_readme and by_line[n][1] == title:
                    # A README.md below the top is an explicit page: Doxygen takes every other
                    # README.md for the main page.
                    line = "@page %s %s" % (label(rel, title), HEADING.match(line).group(2))
                elif n in by_line and by_line[n][1] != title:
                    if sub_readme:  # under an explicit @page, "##" is a section: one level up
                        line = line.replace("#", "", 1)
                    line = line.rstrip() + " {#" + label(rel, by_line[n][1]) + "}"
            out.append(line)
    sys.stdout.write("\n".join(out))


def doxyfile_inputs():
    """The INPUT entries of the Doxyfile at the repository root."""
    with open("Doxyfile", encoding="utf-8") as fh:
        text = fh.read().replace("\\\n", " ")
    m = re.search(r"(?m)^INPUT\s*=(.*)$", text)
    return m.group(1).split() if m else []


def check(files):
    problems = []

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

    # Every Markdown file is a page of the documentation site too (Doxyfile INPUT).
    inputs = doxyfile_inputs()
    for f in files:
        if not any(f == i or f.startswith(i.rstrip("/") + "/") for i in inputs):
            problems.append("%s: not in the Doxyfile's INPUT (the documentation site)" % f)

    if problems:
        sys.stderr.write("check-links: %d problem(s) in %d Markdown files:\n" % (len(problems), len(files)))
        for p in problems:
            sys.stderr.write("  " + p + "\n")
        sys.exit(1)
    print("check-links: %d Markdown files, every relative link resolves; README.md within %d lines"
          % (len(files), README_MAX_LINES))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "check":
        check(sorted({f for f in sys.stdin.read().split("\0") if f and os.path.isfile(f)}))
    elif len(sys.argv) == 3 and sys.argv[1] == "doxygen-filter":
        doxygen_filter(sys.argv[2])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)

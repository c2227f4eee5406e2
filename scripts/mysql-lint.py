#!/usr/bin/env python3
"""The MySQL 8 lint: MariaDB-only SQL in what the MySQL 8 flavor runs.

Reads the migrations of the MySQL 8 flavor (migrations/mysql/*.sql, less each shared file that a
NNNN_*.mysql.sql file replaces there) and the C++ string literals of the sources whose statement
texts run on MySQL 8 (src/dialect/mysql/, src/dialect/*.cpp, src/storage/), and reports every
construct of the list below, which MariaDB understands and MySQL 8.0 does not document. A C++
region between the comments `// MariaDB flavor only (begin)` and `// MariaDB flavor only (end)`
is skipped: code the MySQL 8 flavor never runs (session leases, refused there).

Usage: scripts/mysql-lint.py [REPO_ROOT]      lint the tree; exit 1 when anything is reported
       scripts/mysql-lint.py --self-test      the control: a clean text reports nothing, and one
                                              injected construct per rule is reported by it
"""
import glob
import os
import re
import sys

# Each rule: its name, what it stands for, a pattern (case-insensitive, on SQL text) and one
# construct the self-test injects.
RULES = [
    ("sequence", "SEQUENCE objects and their functions",
     r"\b(?:CREATE|ALTER|DROP)\s+(?:TEMPORARY\s+)?SEQUENCE\b|\b(?:NEXTVAL|SETVAL|LASTVAL)\s*\(|"
     r"\bNEXT\s+VALUE\s+FOR\b|\bPREVIOUS\s+VALUE\s+FOR\b",
     "SELECT NEXTVAL(s)"),
    ("returning", "RETURNING on INSERT, REPLACE or DELETE",
     r"\bRETURNING\b", "DELETE FROM t WHERE id = 1 RETURNING id"),
    ("or-replace", "CREATE OR REPLACE",
     r"\bCREATE\s+OR\s+REPLACE\b", "CREATE OR REPLACE TABLE t (id INT)"),
    ("if-exists", "IF [NOT] EXISTS on ALTER TABLE, indexes or routines",
     r"\bALTER\s+TABLE\b[^;]*?\bIF\s+(?:NOT\s+)?EXISTS\b|"
     r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+IF\s+NOT\s+EXISTS\b|\bDROP\s+INDEX\s+IF\s+EXISTS\b|"
     r"\bCREATE\s+(?:DEFINER\s*=\s*\S+\s+)?(?:PROCEDURE|FUNCTION|TRIGGER|EVENT)\s+IF\s+NOT\s+EXISTS\b",
     "ALTER TABLE t ADD COLUMN IF NOT EXISTS c INT"),
    ("set-statement", "SET STATEMENT ... FOR",
     r"\bSET\s+STATEMENT\b", "SET STATEMENT max_statement_time = 1 FOR SELECT 1"),
    ("wait-clause", "WAIT n on a locking read or DDL",
     r"\bFOR\s+UPDATE\s+WAIT\s+\d|\bLOCK\s+IN\s+SHARE\s+MODE\s+WAIT\s+\d|\bWAIT\s+\d+\s*$",
     "SELECT 1 FROM t FOR UPDATE WAIT 5"),
    ("mariadb-function", "functions and columns of MariaDB alone",
     r"\b(?:NVL2|DECODE_ORACLE|ADD_MONTHS|SYS_GUID|JSON_DETAILED|JSON_LOOSE|JSON_COMPACT|"
     r"JSON_EXISTS|JSON_QUERY|COLUMN_CREATE|COLUMN_GET|NATURAL_SORT_KEY|SFORMAT|"
     r"WSREP_LAST_SEEN_GTID)\s*\(|\bTIME_MS\b|\bLIMIT\s+ROWS\s+EXAMINED\b",
     "SELECT NVL2(a, 1, 2)"),
    ("mariadb-catalog", "information_schema tables MySQL 8 removed",
     r"\binformation_schema\s*\.\s*(?:GLOBAL|SESSION)_(?:VARIABLES|STATUS)\b",
     "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES"),
    # Not MariaDB-only syntax, but what MySQL 8's default binary log refuses a user without SUPER
    # (error 1419, unless log_bin_trust_function_creators=1): dblock's routines there are
    # procedures.
    ("stored-function", "CREATE FUNCTION or TRIGGER (SUPER needed where the binary log is on)",
     r"\bCREATE\s+(?:DEFINER\s*=\s*\S+\s+)?(?:AGGREGATE\s+)?(?:FUNCTION|TRIGGER)\s+[\w{}`]",
     "CREATE FUNCTION f() RETURNS INT NO SQL RETURN 1"),
]
COMPILED = [(n, w, re.compile(p, re.IGNORECASE | re.MULTILINE), x) for n, w, p, x in RULES]

BEGIN_SKIP = "// MariaDB flavor only (begin)"
END_SKIP = "// MariaDB flavor only (end)"


def sql_without_comments(text):
    """SQL text with -- and /* */ comments blanked (line numbers kept)."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"--[^\n]*", "", text)


LITERAL = re.compile(r'R"([^(\s]*)\((.*?)\)\1"|"((?:[^"\\\n]|\\.)*)"', re.S)


def cpp_literals(text):
    """(line, text) of each string literal outside comments and skipped regions; adjacent
    literals (C++ joins them) are joined too."""
    out = []
    skipping = False
    lines = text.split("\n")
    kept = []
    for line in lines:
        if BEGIN_SKIP in line:
            skipping = True
        if skipping:
            kept.append("")
        else:
            kept.append(line)
        if END_SKIP in line:
            skipping = False
    code = "\n".join(kept)
    # Comments out (keeping literals and line numbers): a small scanner.
    res, i, n = [], 0, len(code)
    while i < n:
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
            continue
        if code.startswith("/*", i):
            j = code.find("*/", i + 2)
            j = n if j < 0 else j + 2
            res.append(re.sub(r"[^\n]", " ", code[i:j]))
            i = j
            continue
        m = LITERAL.match(code, i)
        if m and (code[i] == '"' or code[i] == "R"):
            res.append(m.group(0))
            i = m.end()
            continue
        if code[i] == "'":  # a character literal or a digit separator
            m2 = re.compile(r"'(?:[^'\\\n]|\\.)'").match(code, i)
            if m2:
                res.append(" " * len(m2.group(0)))
                i = m2.end()
                continue
        res.append(code[i])
        i += 1
    code = "".join(res)
    prev_end, prev = -1, None
    for m in LITERAL.finditer(code):
        body = m.group(2) if m.group(2) is not None else m.group(3)
        body = body.replace('\\"', '"').replace("\\n", "\n")
        line = code.count("\n", 0, m.start()) + 1
        if prev is not None and code[prev_end:m.start()].strip() == "":
            prev = (prev[0], prev[1] + body)
            out[-1] = prev
        else:
            prev = (line, body)
            out.append(prev)
        prev_end = m.end()
    return out


def report(where, text):
    found = []
    for name, what, rx, _ in COMPILED:
        for m in rx.finditer(text):
            found.append("%s: [%s] %s: %s" % (where, name, what, " ".join(m.group(0).split())))
    return found


def mysql_migrations(root):
    files = sorted(glob.glob(os.path.join(root, "migrations/mysql/*.sql")))
    replaced = {os.path.basename(f)[:4] for f in files if f.endswith(".mysql.sql")}
    return [f for f in files
            if f.endswith(".mysql.sql") or os.path.basename(f)[:4] not in replaced
            or os.path.basename(f) == "bootstrap.sql"]


def sources(root):
    pats = ["src/dialect/mysql/*.cpp", "src/dialect/mysql/*.hpp", "src/dialect/*.cpp",
            "src/storage/*.cpp"]
    return sorted(f for p in pats for f in glob.glob(os.path.join(root, p)))


def lint(root):
    found = []
    migs = mysql_migrations(root)
    for f in migs:
        text = sql_without_comments(open(f, encoding="utf-8").read())
        for stmt_line, stmt in statements_with_lines(text):
            found += report("%s:%d" % (os.path.relpath(f, root), stmt_line), stmt)
    srcs = sources(root)
    for f in srcs:
        for line, lit in cpp_literals(open(f, encoding="utf-8").read()):
            found += report("%s:%d" % (os.path.relpath(f, root), line), lit)
    return found, len(migs), len(srcs)


def statements_with_lines(text):
    """Each ';'-separated piece of a migration with the line it starts on."""
    out, start, line = [], 0, 1
    for m in re.finditer(r";", text):
        piece = text[start:m.start()]
        lead = len(piece) - len(piece.lstrip())
        out.append((line + piece[:lead].count("\n"), piece))
        line += piece.count("\n")
        start = m.end()
    piece = text[start:]
    lead = len(piece) - len(piece.lstrip())
    out.append((line + piece[:lead].count("\n"), piece))
    return out


def self_test():
    clean = ("INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = LAST_INSERT_ID(a + 1);\n"
             "SELECT GET_LOCK('k', 0), UTC_TIMESTAMP(6) FROM t FOR UPDATE SKIP LOCKED;\n"
             "CREATE TABLE IF NOT EXISTS t (id INT);\n"
             "DROP PROCEDURE IF EXISTS p;\n")
    bad = 0
    if report("clean", clean):
        print("mysql-lint self-test: the clean text was reported:", report("clean", clean))
        bad += 1
    for name, _, _, example in COMPILED:
        hits = [h for h in report("injected", clean + example + ";\n") if "[%s]" % name in h]
        if not hits:
            print("mysql-lint self-test: rule %s did not report its construct: %s" % (name, example))
            bad += 1
    # The same through a C++ literal, as the sources are read.
    for name, _, _, example in COMPILED:
        src = 'std::string s = "%s";\n' % example.replace('"', '\\"')
        hits = [h for _, lit in cpp_literals(src) for h in report("x.cpp", lit)
                if "[%s]" % name in h]
        if not hits:
            print("mysql-lint self-test: rule %s missed its construct in a C++ literal" % name)
            bad += 1
    if bad:
        return 1
    print("mysql-lint self-test: ok, the clean text passes and each of the %d rules reports "
          "its injected construct (in SQL and in a C++ literal)" % len(COMPILED))
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        return self_test()
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found, migs, srcs = lint(root)
    if found:
        print("%d MariaDB-only construct(s) in what the MySQL 8 flavor runs:" % len(found))
        for f in found:
            print("    " + f)
        return 1
    print("ok: no MariaDB-only construct in %d migration(s) and the literals of %d source file(s) "
          "of the MySQL 8 flavor" % (migs, srcs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

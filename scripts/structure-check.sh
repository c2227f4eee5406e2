#!/usr/bin/env bash
# Structure rules for the sources under src/ (*.cpp and *.hpp). Changes nothing; lists every
# offender and exits non-zero if there is one.
#
# Usage: scripts/structure-check.sh BUILD_DIR [--only-size]
#
#   BUILD_DIR    a configured build directory of this source tree: its compile_commands.json
#                (CMAKE_EXPORT_COMPILE_COMMANDS is on in CMakeLists.txt) must list every
#                src/**/*.cpp, so configure it with the CLI and dblock::prometheus enabled (the
#                defaults when their packages are installed). Nothing needs to be built.
#   --only-size  run only rules (a) and (b)
#
# Rules:
#   (a) File size: no src/**/*.cpp or src/**/*.hpp has more than 500 lines.
#   (b) Function size: no function is longer than 60 lines, as clang-tidy's
#       readability-function-size counts them (the lines from the opening to the closing brace,
#       whitespace and comments included; a lambda's lines count towards the function that holds
#       it). clang-tidy runs with only that check enabled and
#       LineThreshold 60 (its other thresholds keep their defaults) on every src/**/*.cpp, two
#       files at a time, with the header filter set to src/, so that functions defined in
#       src/**/*.hpp are checked too (each is reported once). Any warning or error of clang-tidy
#       fails the check.
#   (c) Transaction control: outside src/storage/ and src/dialect/, no C++ string literal
#       whose text, after leading white space, starts with the upper-case word BEGIN, COMMIT or
#       ROLLBACK followed by the end of the literal, white space or ';'. So `"COMMIT"`,
#       `<< "ROLLBACK"` and `"BEGIN IMMEDIATE"` are offenders; "the connection broke during
#       COMMIT" (not at the start), "commit" (lower case) and " (COMMIT)" are not.
#   (d) SQL on dblock's own tables: outside src/storage/ and src/dialect/, no line that has a
#       C++ string literal and, in its code outside literals and comments, a reference to a
#       table name member: tables.lock, tables.floor, tables.audit, tables.migrations, t.lock,
#       t.floor, t.audit or t.migrations (as whole words, so `impl->tables.lock`,
#       `dbi().tables.audit` and `<< t.lock <<` count, `result.lock` does not); and no string
#       literal that contains resource_lock. The rule is per line: a statement that names the
#       table on a line without a literal (e.g. `return impl_->tables.lock;`) is not an offender.
#   (e) Backend differences live in the dialect: outside src/dialect/, no code (outside literals
#       and comments) that asks a statement text whether it is empty (`.text.empty()`: a
#       capability is a typed question, vocabulary::can()) or compares a backend name
#       (`backend ==`, `backend !=`).
#   (f) One folder per layer: no *.cpp or *.hpp directly in src/ (ARCHITECTURE.md names the
#       folders).
#   (g) Includes go down the layers: a source file includes headers of its own folder or of a
#       lower layer only, in this order (ARCHITECTURE.md):
#           core < dialect < storage < wake < lease < kinds, data < ops < cli, prometheus
#       (folders on one level, kinds and data, cli and prometheus, never include each other). So
#       storage includes no lease/, wake/ or kinds/ header, dialect no storage/ header, and
#       nothing includes cli/. Headers under include/dblock/ are the public API, open to all.
#       One named exception: src/core/database.cpp, the public handle's constructor, which wires
#       a handle's layers together (its storage and its wake-up hub).
#   (i) Native client code lives in the dialect: outside src/dialect/, no include of a C
#       client's header or of a SOCI backend's (<libpq-fe.h>, <libpq/...>, <mysql.h>,
#       <mysql/...>, <mariadb/...>, <errmsg.h>, <mysqld_error.h>, <sqlite3.h>,
#       <soci/postgresql/...>, <soci/mysql/...>, <soci/sqlite3/...>) and no call (outside
#       literals and comments) of a C client function: PQ..., lo_..., mysql_... and sqlite3_...
#       followed by '(' (dblock's own mysql_dialect() excepted). Its control runs first: a sample
#       with one such include and one such call must give exactly those two reports.
#   (h) MySQL 8: no MariaDB-only SQL (SEQUENCE, RETURNING, CREATE OR REPLACE, IF [NOT] EXISTS on
#       ALTER TABLE, indexes or routines, SET STATEMENT, WAIT n, MariaDB's own functions and
#       catalog tables) in the migrations of the MySQL 8 flavor or in the string literals of the
#       sources whose statements run there (scripts/mysql-lint.py, which lists the rules); its
#       control runs first: one injected construct per rule must be reported.
#
# For (c), (d), (e) and (i) the sources are read by a small tokenizer (perl, below), not a compiler: it
# knows "..." literals with escapes (any prefix: L, u8, ...), raw literals R"d(...)d" (also over
# several lines), character literals, digit separators and // and /* */ comments, so text in
# comments never counts. It does not expand macros, nor join literals across lines.
#
# Exit status: 0 all rules hold, 1 some rule is broken (offenders listed), 2 usage or set-up
# error (no build directory, no compile_commands.json, clang-tidy missing, a source file that the
# compile database does not list).
#
# Environment: CLANG_TIDY (default clang-tidy), STRUCTURE_CHECK_JOBS (parallel clang-tidy runs,
# default 2).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)

MAX_FILE_LINES=500
MAX_FUNCTION_LINES=60
# Directories (under src/) where SQL and transaction control belong.
SQL_DIRS_RE='^src/(storage|dialect)/'

CLANG_TIDY=${CLANG_TIDY:-clang-tidy}
JOBS=${STRUCTURE_CHECK_JOBS:-2}

msg() { printf 'structure-check: %s\n' "$*" >&2; }
usage() {
    sed -n '/^# Usage:/,/^#   --only-size/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

BUILD_DIR=
ONLY_SIZE=0
for arg in "$@"; do
    case "$arg" in
        --only-size) ONLY_SIZE=1 ;;
        -h | --help) usage ;;
        -*)
            msg "unknown option: $arg"
            usage
            ;;
        *)
            [ -z "$BUILD_DIR" ] || usage
            BUILD_DIR=$arg
            ;;
    esac
done
[ -n "$BUILD_DIR" ] || usage
[ -d "$BUILD_DIR" ] || {
    msg "ERROR: build directory $BUILD_DIR does not exist"
    exit 2
}
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
COMPILE_DB=$BUILD_DIR/compile_commands.json
[ -f "$COMPILE_DB" ] || {
    msg "ERROR: no $COMPILE_DB (configure the build directory with cmake first)"
    exit 2
}
command -v "$CLANG_TIDY" >/dev/null 2>&1 || {
    msg "ERROR: $CLANG_TIDY not found; run scripts/install-deps.sh"
    exit 2
}

cd "$REPO_ROOT"
[ -d src ] || {
    msg "ERROR: no src/ in $REPO_ROOT"
    exit 2
}

# All sources, repository-relative, sorted (LC_ALL=C: the same order everywhere).
mapfile -t SOURCES < <(find src -type f \( -name '*.cpp' -o -name '*.hpp' \) | LC_ALL=C sort)
mapfile -t CPP_FILES < <(printf '%s\n' "${SOURCES[@]}" | grep '\.cpp$' || true)
[ "${#SOURCES[@]}" -gt 0 ] || {
    msg "ERROR: no *.cpp or *.hpp under src/"
    exit 2
}

failed=()

# ---------------------------------------------------------------------------
# (a) file size

check_file_size() {
    local f n bad=()
    for f in "${SOURCES[@]}"; do
        # awk counts a last line without a newline too (wc -l would not).
        n=$(awk 'END { print NR }' "$f")
        if [ "$n" -gt "$MAX_FILE_LINES" ]; then bad+=("$(printf '%6d  %s' "$n" "$f")"); fi
    done
    if [ "${#bad[@]}" -gt 0 ]; then
        echo "(a) ${#bad[@]} file(s) over $MAX_FILE_LINES lines:"
        printf '    %s\n' "${bad[@]}"
        failed+=(a)
    else
        echo "(a) ok: all ${#SOURCES[@]} files under src/ have at most $MAX_FILE_LINES lines"
    fi
}

# ---------------------------------------------------------------------------
# (b) function size

check_function_size() {
    local f missing=() tmp header_re config
    for f in "${CPP_FILES[@]}"; do
        # CMake writes "file": "/absolute/path" for every translation unit.
        if ! grep -qF "\"file\": \"$REPO_ROOT/$f\"" "$COMPILE_DB"; then missing+=("$f"); fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        msg "ERROR: $COMPILE_DB does not list these sources (a build directory of another" \
            "source tree, or one configured without them):"
        printf '    %s\n' "${missing[@]}" >&2
        exit 2
    fi

    tmp=$(mktemp -d "${TMPDIR:-/tmp}/structure-check.XXXXXX")
    # shellcheck disable=SC2064 # expand $tmp now
    trap "rm -rf '$tmp'" EXIT
    # The header filter is a regular expression: escape the repository path.
    header_re="^$(printf '%s' "$REPO_ROOT" | sed 's/[][\.*^$+?(){}|/]/\\&/g')/src/"
    # YAML for clang-tidy --config; its quotes are meant literally.
    # shellcheck disable=SC2089,SC2090
    config="{Checks: '-*,readability-function-size', CheckOptions: [{key: readability-function-size.LineThreshold, value: $MAX_FUNCTION_LINES}]}"

    # One clang-tidy per file, $JOBS at a time; each writes FILE.out and FILE.rc in $tmp.
    # shellcheck disable=SC2090
    export CLANG_TIDY BUILD_DIR header_re config tmp
    # shellcheck disable=SC2016 # expanded by the inner shell
    printf '%s\0' "${CPP_FILES[@]}" | xargs -0 -n 1 -P "$JOBS" bash -c '
        out="$tmp/$(printf "%s" "$1" | tr / _)"
        rc=0
        "$CLANG_TIDY" -p "$BUILD_DIR" --quiet --config="$config" --header-filter="$header_re" \
            "$1" >"$out.out" 2>&1 || rc=$?
        echo "$rc" >"$out.rc"
    ' structure-check-tidy

    # Findings: "file:line:col: warning: ... [readability-function-size]" with its notes
    # ("N lines including whitespace and comments (threshold 60)") joined onto one line, paths
    # relative to the repository; a header's findings come once per including file: sort -u.
    local findings others out broken=()
    findings=$(cat "$tmp"/*.out | awk '
        /: warning: .*\[readability-function-size\]$/ {
            if (cur != "") print cur
            loc = $0; sub(/: warning: .*/, "", loc)
            text = $0; sub(/^.*: warning: /, "", text); sub(/ \[readability-function-size\]$/, "", text)
            cur = loc ": " text; want = loc; next
        }
        / note: / {
            loc = $0; sub(/: note: .*/, "", loc)
            if (cur != "" && loc == want) { note = $0; sub(/^.*: note: /, "", note); cur = cur "; " note }
            next
        }
        END { if (cur != "") print cur }
    ' | sed "s|^$REPO_ROOT/||" | LC_ALL=C sort -u -t: -k1,1 -k2,2n)
    # A file clang-tidy could not parse (status non-zero) is not checked at all: it fails, with
    # the start of clang-tidy's output. Any other warning or error of a file that was parsed
    # fails too (other checks are off, but say so if one ever shows up).
    others=""
    for f in "${CPP_FILES[@]}"; do
        out="$tmp/$(printf '%s' "$f" | tr / _)"
        if [ "$(cat "$out.rc")" != 0 ]; then
            broken+=("$f")
        else
            others+=$(grep -E ': (warning|error): ' "$out.out" | grep -v '\[readability-function-size\]$' || true)$'\n'
        fi
    done
    others=$(printf '%s' "$others" | sed -e "s|^$REPO_ROOT/||" -e '/^$/d' | LC_ALL=C sort -u)

    if [ -n "$findings" ]; then
        echo "(b) $(printf '%s\n' "$findings" | wc -l) function(s) over $MAX_FUNCTION_LINES lines:"
        printf '%s\n' "$findings" | sed 's/^/    /'
    fi
    if [ -n "$others" ] || [ "${#broken[@]}" -gt 0 ]; then
        echo "(b) clang-tidy failed or reported other problems:"
        [ -z "$others" ] || printf '%s\n' "$others" | sed 's/^/    /'
        for f in "${broken[@]}"; do
            out="$tmp/$(printf '%s' "$f" | tr / _)"
            echo "    $f: clang-tidy exited with status $(cat "$out.rc"); the start of its output:"
            grep -v ' generated\.$' "$out.out" | sed "s|^$REPO_ROOT/||" | head -n 20 | sed 's/^/        /'
        done
    fi
    if [ -n "$findings" ] || [ -n "$others" ] || [ "${#broken[@]}" -gt 0 ]; then
        failed+=(b)
    else
        echo "(b) ok: no function over $MAX_FUNCTION_LINES lines in ${#CPP_FILES[@]} files (and the src/ headers they include)"
    fi
    rm -rf "$tmp"
    trap - EXIT
}

# ---------------------------------------------------------------------------
# (c) and (d): string literals outside src/storage/ and src/dialect/

# Prints "RULE<TAB>file:line: source line" for every offending line of the given files: rules
# (c) and (d), or with SCAN_RULE=e rule (e), with SCAN_RULE=i rule (i).
scan_sql() {
    perl -e '
use strict; use warnings;
my $rule_e = ($ENV{SCAN_RULE} // "") eq "e";
my $rule_i = ($ENV{SCAN_RULE} // "") eq "i";
my $native = qr{^\s*#\s*include\s*<(?:libpq-fe\.h|libpq/|mysql\.h|mysql/|mariadb/|errmsg\.h|mysqld_error\.h|sqlite3\.h|soci/(?:postgresql|mysql|sqlite3)/)|\b(?:PQ[A-Za-z]+|lo_[a-z]+|mysql_(?!dialect\b)[a-z_]+|sqlite3_[a-z0-9_]+)\s*\(};
my $backend_test = qr/\.text\s*\.\s*empty\s*\(\s*\)|\bbackend\s*[!=]=/;
my $txn = qr/^\s*(?:BEGIN|COMMIT|ROLLBACK)(?:$|[\s;])/;
my $table_ref = qr/\b(?:tables|t)\.(?:lock|floor|audit|migrations)\b/;
for my $file (@ARGV) {
    open(my $fh, "<", $file) or die "$file: $!";
    my @lines = <$fh>;
    close $fh;
    my $in_block = 0;          # inside /* */
    my $raw_end;               # inside a raw literal: its closing )delim"
    my ($raw_text, $raw_line);
    my %lits; my %code;        # line number -> literals / code outside literals and comments
    for my $n (1 .. @lines) {
        my $s = $lines[$n - 1];
        chomp $s;
        my $i = 0; my $len = length $s;
        $code{$n} = "";
        while ($i < $len) {
            if ($in_block) {
                my $e = index($s, "*/", $i);
                if ($e < 0) { $i = $len; next; }
                $i = $e + 2; $in_block = 0; next;
            }
            if (defined $raw_end) {
                my $e = index($s, $raw_end, $i);
                if ($e < 0) { $raw_text .= substr($s, $i) . "\n"; $i = $len; next; }
                $raw_text .= substr($s, $i, $e - $i);
                push @{$lits{$raw_line}}, $raw_text;
                $i = $e + length $raw_end; undef $raw_end; next;
            }
            my $c = substr($s, $i, 1);
            my $two = substr($s, $i, 2);
            if ($two eq "//") { last; }
            if ($two eq "/*") { $in_block = 1; $i += 2; next; }
            if ($c eq "R" && substr($s, $i + 1, 1) eq "\"" &&
                ($i == 0 || substr($s, $i - 1, 1) =~ /[^A-Za-z0-9_]|[LuU8]/)) {
                my $open = index($s, "(", $i + 2);
                if ($open >= 0) {
                    $raw_end = ")" . substr($s, $i + 2, $open - $i - 2) . "\"";
                    $raw_text = ""; $raw_line = $n; $i = $open + 1; next;
                }
            }
            if ($c eq "\"") {
                my $j = $i + 1; my $text = "";
                while ($j < $len) {
                    my $d = substr($s, $j, 1);
                    if ($d eq "\\") { $text .= substr($s, $j, 2); $j += 2; next; }
                    last if $d eq "\"";
                    $text .= $d; $j++;
                }
                push @{$lits{$n}}, $text;
                $code{$n} .= " \"\" ";
                $i = $j + 1; next;
            }
            if ($c eq "\x27") {
                # A digit separator (1'\''000) follows a digit or letter; a character literal
                # does not.
                if ($i > 0 && substr($s, $i - 1, 1) =~ /[0-9A-Za-z_]/) { $i++; next; }
                my $j = $i + 1;
                while ($j < $len) {
                    my $d = substr($s, $j, 1);
                    if ($d eq "\\") { $j += 2; next; }
                    last if $d eq "\x27";
                    $j++;
                }
                $i = $j + 1; next;
            }
            $code{$n} .= $c; $i++;
        }
    }
    for my $n (1 .. @lines) {
        if ($rule_i) {
            my $src = $lines[$n - 1]; chomp $src; $src =~ s/^\s+//;
            print "i\t$file:$n: $src\n" if $code{$n} =~ $native;
            next;
        }
        if ($rule_e) {
            my $src = $lines[$n - 1]; chomp $src; $src =~ s/^\s+//;
            print "e\t$file:$n: $src\n" if $code{$n} =~ $backend_test;
            next;
        }
        my @l = @{$lits{$n} // []};
        next unless @l;
        my $src = $lines[$n - 1]; chomp $src; $src =~ s/^\s+//;
        print "c\t$file:$n: $src\n" if grep { $_ =~ $txn } @l;
        print "d\t$file:$n: $src\n"
            if $code{$n} =~ $table_ref || grep { /resource_lock/ } @l;
    }
}
' "$@"
}

check_sql() {
    local files=() f out c d
    for f in "${SOURCES[@]}"; do
        [[ "$f" =~ $SQL_DIRS_RE ]] || files+=("$f")
    done
    out=$(scan_sql "${files[@]}")
    c=$(printf '%s\n' "$out" | sed -n 's/^c\t//p')
    d=$(printf '%s\n' "$out" | sed -n 's/^d\t//p')
    if [ -n "$c" ]; then
        echo "(c) $(printf '%s\n' "$c" | wc -l) transaction-control literal(s) (BEGIN, COMMIT, ROLLBACK) outside src/storage/ and src/dialect/:"
        printf '%s\n' "$c" | sed 's/^/    /'
        failed+=(c)
    else
        echo "(c) ok: no transaction-control literal outside src/storage/ and src/dialect/"
    fi
    if [ -n "$d" ]; then
        echo "(d) $(printf '%s\n' "$d" | wc -l) line(s) of SQL on dblock's tables outside src/storage/ and src/dialect/:"
        printf '%s\n' "$d" | sed 's/^/    /'
        failed+=(d)
    else
        echo "(d) ok: no SQL on dblock's tables outside src/storage/ and src/dialect/"
    fi
}

check_backend_tests() {
    local files=() f e
    for f in "${SOURCES[@]}"; do
        [[ "$f" == src/dialect/* ]] || files+=("$f")
    done
    e=$(SCAN_RULE=e scan_sql "${files[@]}" | sed -n 's/^e\t//p')
    if [ -n "$e" ]; then
        echo "(e) $(printf '%s\n' "$e" | wc -l) backend test(s) outside src/dialect/ (an empty statement text as a capability, or a backend name compared):"
        printf '%s\n' "$e" | sed 's/^/    /'
        failed+=(e)
    else
        echo "(e) ok: no empty-text capability test and no backend name compared outside src/dialect/"
    fi
}

check_native_clients() {
    local files=() f out tmp control
    # The control: a sample with one native include and one C client call (and lookalikes that
    # are not: a comment, a literal, dblock's mysql_dialect()) gives exactly those two reports.
    tmp=$(mktemp -d)
    cat > "$tmp/sample.cpp" <<'SAMPLE'
#include <libpq-fe.h>
// mysql_real_query(c, q, n) in a comment
const char* t = "PQexec(c, q) in a literal";
const auto& d = mysql_dialect();
int n = mysql_errno(conn);
SAMPLE
    control=$(SCAN_RULE=i scan_sql "$tmp/sample.cpp" | sed -n 's/^i\t[^:]*://p' | cut -d: -f1 | tr '\n' ' ')
    rm -rf "$tmp"
    if [ "$control" != "1 5 " ]; then
        echo "(i) the control failed: the sample's lines 1 and 5 are the offenders, reported: ${control:-none}"
        failed+=(i)
        return
    fi
    for f in "${SOURCES[@]}"; do
        [[ "$f" == src/dialect/* ]] || files+=("$f")
    done
    out=$(SCAN_RULE=i scan_sql "${files[@]}" | sed -n 's/^i\t//p')
    if [ -n "$out" ]; then
        echo "(i) $(printf '%s\n' "$out" | wc -l) native client include(s) or call(s) outside src/dialect/:"
        printf '%s\n' "$out" | sed 's/^/    /'
        failed+=(i)
    else
        echo "(i) ok: no native client header or call outside src/dialect/ (control: its sample's two offenders reported)"
    fi
}

check_layer_folders() {
    local flat=() f
    for f in "${SOURCES[@]}"; do
        [[ "$f" == src/*/* ]] || flat+=("$f")
    done
    if [ "${#flat[@]}" -gt 0 ]; then
        echo "(f) ${#flat[@]} source file(s) directly in src/, outside any layer folder:"
        printf '    %s\n' "${flat[@]}"
        failed+=(f)
    else
        echo "(f) ok: every source file is in a layer folder"
    fi
}

# The layer of each folder under src/ (rule g).
layer_of() {
    case "$1" in
        core) echo 0 ;;
        dialect) echo 1 ;;
        storage) echo 2 ;;
        wake) echo 3 ;;
        lease) echo 4 ;;
        kinds | data) echo 5 ;;
        ops) echo 6 ;;
        cli | prometheus) echo 7 ;;
        *) echo -1 ;;
    esac
}

check_include_layers() {
    local bad=() f dir inc to from_l to_l line
    for f in "${SOURCES[@]}"; do
        [ "$f" = src/core/database.cpp ] && continue # the named exception (see rule g)
        dir=${f#src/}
        dir=${dir%%/*}
        from_l=$(layer_of "$dir")
        while IFS= read -r line; do
            inc=$(printf '%s' "$line" | sed -n 's/^[0-9]*:[[:space:]]*#[[:space:]]*include[[:space:]]*"\([a-z_]*\)\/.*/\1/p')
            [ -n "$inc" ] || continue
            [ "$inc" = "$dir" ] && continue
            [ "$inc" = dblock ] && continue
            to_l=$(layer_of "$inc")
            [ "$to_l" -ge 0 ] || continue # not a folder of src/ (a system or test header)
            if [ "$from_l" -lt 0 ] || [ "$to_l" -ge "$from_l" ]; then
                to=$(printf '%s' "$line" | sed 's/^\([0-9]*\):[[:space:]]*/\1: /')
                bad+=("$f:$to")
            fi
        done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$REPO_ROOT/$f" || true)
    done
    if [ "${#bad[@]}" -gt 0 ]; then
        echo "(g) ${#bad[@]} include(s) of a header in the same or a higher layer of another folder:"
        printf '    %s\n' "${bad[@]}"
        failed+=(g)
    else
        echo "(g) ok: every include goes down the layers (core < dialect < storage < wake < lease < kinds, data < ops < cli, prometheus)"
    fi
}

check_mysql_lint() {
    local out control
    if ! control=$(python3 "$REPO_ROOT/scripts/mysql-lint.py" --self-test); then
        echo "(h) the MySQL 8 lint's control failed (a rule does not report its construct):"
        printf '%s\n' "$control" | sed 's/^/    /'
        failed+=(h)
        return
    fi
    if out=$(python3 "$REPO_ROOT/scripts/mysql-lint.py" "$REPO_ROOT"); then
        echo "(h) $out (control: each rule reports its injected construct)"
    else
        echo "(h) $out"
        failed+=(h)
    fi
}

check_file_size
check_function_size
if [ "$ONLY_SIZE" -eq 0 ]; then
    check_sql
    check_backend_tests
    check_native_clients
    check_layer_folders
    check_include_layers
    check_mysql_lint
fi

if [ "${#failed[@]}" -gt 0 ]; then
    msg "FAILED: rule(s) ${failed[*]} (see scripts/structure-check.sh for the rules)"
    exit 1
fi
msg "all rules hold"

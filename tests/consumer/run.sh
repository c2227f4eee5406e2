#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The consumer test: installs the build BUILD_DIR into a temporary prefix and uses it as a
# user would, on fresh SQLite files (no server needed).
#   1. CMake: tests/consumer with find_package(dblock) while prometheus-cpp cannot be found
#      (CMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp), plus every C++ block of README.md and
#      docs/*.md as extracted by readme_snippets.sh (compiled and linked); runs the consumer.
#      Before it, a control: a block that uses `db` without `// assumes:` must not compile.
#   2. find_package(dblock COMPONENTS prometheus): when dblock was built with it, builds and
#      runs consumer_prometheus, builds the C++ blocks that need it, and checks that the
#      component fails with its reason when prometheus-cpp cannot be found; when built without,
#      checks that it fails saying so.
#   3. pkg-config: builds the consumer with one compiler command and dblock.pc's flags
#      (`--static` for libdblock.a), runs it.
# For a shared build (shared.sh) the consumers must also need libdblock.so.0.
#
# Usage: run.sh BUILD_DIR CONSUMER_DIR README.md
# Environment: CXX, the compiler (default c++), also used for the CMake projects; CONSUMER_JOBS,
# parallel build jobs (default 1: ctest runs this beside a timing-sensitive test).
set -euo pipefail

if [ $# -ne 3 ]; then
    echo "usage: $0 BUILD_DIR CONSUMER_DIR README.md" >&2
    exit 2
fi
build_dir=$(readlink -f "$1") src_dir=$(readlink -f "$2") readme=$3
here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
# shellcheck source=common.sh
. "$here/common.sh" consumer
prefix=$work/prefix

# expect_output WHAT EXPECTED COMMAND...: runs COMMAND, which must succeed and print EXPECTED.
expect_output() {
    local what=$1 expected=$2 out
    shift 2
    out=$("$@" 2>&1) || fail "$what exited with status $?; output: $out"
    [ "$out" = "$expected" ] || fail "$what printed '$out', expected '$expected'"
    say "$what: $out"
}
# needs_shared_dblock WHAT BINARY: in a shared build, BINARY must need libdblock.so.0.
needs_shared_dblock() {
    if [ "$shared" = 1 ]; then
        readelf -d "$2" | grep 'NEEDED.*\[libdblock\.so\.0\]' >/dev/null ||
            fail "$1 ($2) does not need libdblock.so.0: $(readelf -d "$2" | grep NEEDED)"
    fi
}
configure_consumer() { # DIR ARGS...: configures tests/consumer against the prefix
    local dir=$1
    shift
    cmake -S "$src_dir" -B "$dir" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$CXX" "$@"
}

t0=$SECONDS
if ! cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" 2>&1; then
    tail -n 20 "$work/install.log" >&2
    fail "cmake --install $build_dir failed: build everything it installs first" \
        "(cmake --build $build_dir)"
fi
pc=$(find "$prefix" -name dblock.pc -path '*/pkgconfig/*' -print -quit)
[ -n "$pc" ] || fail "the install has no pkgconfig/dblock.pc"
libdir=$(dirname "$(dirname "$pc")")
cfgdir=$libdir/cmake/dblock
[ -f "$cfgdir/dblockConfig.cmake" ] || fail "the install has no $cfgdir/dblockConfig.cmake"
if [ -e "$libdir/libdblock.so" ]; then shared=1 kind=shared; else shared=0 kind=static; fi
[ "$shared" = 1 ] || [ -f "$libdir/libdblock.a" ] || fail "neither libdblock.so nor .a in $libdir"
say "installed a $kind dblock into $prefix"

# 0. The snippets' convention works: a fragment that uses `db` without `// assumes:` does not
# compile (it once did: the script declared db for every block), and with the line it does.
# Checked on a copy of the README's quick start beside two one-line fragments, syntax only.
control=$work/snippet-control
mkdir -p "$control/examples/quickstart"
cp "$(dirname "$readme")/examples/quickstart/main.cpp" "$control/examples/quickstart/main.cpp"
{
    echo '```cpp'
    cat "$control/examples/quickstart/main.cpp"
    cat <<'EOF'
```

```cpp
#include <dblock/dblock.hpp>

dblock::lease_lock lock(db, "x");
```

```cpp
#include <dblock/dblock.hpp>

// assumes: dblock::database db;

dblock::lease_lock lock(db, "x");
```
EOF
} >"$control/README.md"
bash "$here/readme_snippets.sh" "$control/README.md" "$control/out" >"$control/extract.log" 2>&1 ||
    fail "readme_snippets.sh failed on the control README: $(cat "$control/extract.log")"
syntax_check() { "$CXX" -std=c++17 -fsyntax-only -I"$prefix/include" "$1" >"$2" 2>&1; }
if syntax_check "$control/out/snippet_2.cpp" "$control/undeclared.log"; then
    fail "a snippet that uses db without '// assumes: dblock::database db;' compiled"
fi
# (GCC quotes the name with ‘’ in a UTF-8 locale, '' in C; Clang says "undeclared identifier".)
grep -Eq "db.{1,3} was not declared|undeclared identifier .db." "$control/undeclared.log" ||
    fail "a snippet without its assumes line failed for another reason: $(cat "$control/undeclared.log")"
syntax_check "$control/out/snippet_3.cpp" "$control/declared.log" ||
    fail "a snippet with '// assumes: dblock::database db;' did not compile: $(cat "$control/declared.log")"
say "snippet control: db without '// assumes:' fails ('db' was not declared), with it compiles"

# 1. find_package(dblock) without prometheus-cpp; the C++ blocks of README.md and docs/*.md.
bash "$here/readme_snippets.sh" "$readme" "$work/snippets"
run_logged "$work/cmake.log" "configuring tests/consumer (find_package(dblock), prometheus-cpp not findable)" \
    configure_consumer "$work/cmake" -DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON \
    -DCONSUMER_SNIPPETS_DIR="$work/snippets"
run_logged "$work/build.log" "building tests/consumer and the C++ blocks of README.md and docs/" \
    cmake --build "$work/cmake" -j"${CONSUMER_JOBS:-1}"
say "C++ blocks of README.md and docs/: compiled and linked"
expect_output "consumer (CMake)" "consumer fence 1" "$work/cmake/consumer" "sqlite://$work/cmake.db"
needs_shared_dblock "consumer (CMake)" "$work/cmake/consumer"

# 2. COMPONENTS prometheus, and the snippets that need it.
prometheus_snippets=$(find "$work/snippets/prometheus" -name 'snippet_*.cpp' | wc -l)
if [ -f "$cfgdir/dblockPrometheusTargets.cmake" ]; then
    run_logged "$work/prom.log" "configuring tests/consumer with COMPONENTS prometheus" \
        configure_consumer "$work/prom" -DCONSUMER_PROMETHEUS=ON \
        -DCONSUMER_SNIPPETS_DIR="$work/snippets"
    run_logged "$work/prom-build.log" "building consumer_prometheus" \
        cmake --build "$work/prom" -j"${CONSUMER_JOBS:-1}" --target consumer_prometheus
    expect_output "consumer_prometheus" 'dblock_acquired_total{backend="sqlite"} 1' \
        "$work/prom/consumer_prometheus" "sqlite://$work/prom.db"
    if [ "$prometheus_snippets" -gt 0 ]; then
        run_logged "$work/prom-snippets.log" "building the $prometheus_snippets C++ blocks that need dblock::prometheus" \
            cmake --build "$work/prom" -j"${CONSUMER_JOBS:-1}" --target readme_snippets_prometheus
        say "snippets that need dblock::prometheus: compiled and linked"
    fi
    expected_reason="component prometheus: it needs prometheus-cpp"
    disable=(-DCMAKE_DISABLE_FIND_PACKAGE_prometheus-cpp=ON)
else
    say "dblock was built without dblock::prometheus: its $prometheus_snippets C++ block(s) of" \
        "the docs are NOT compiled here"
    expected_reason="component prometheus: dblock was built without it"
    disable=()
fi
if configure_consumer "$work/noprom" -DCONSUMER_PROMETHEUS=ON "${disable[@]}" \
    >"$work/noprom.log" 2>&1; then
    fail "find_package(dblock REQUIRED COMPONENTS prometheus) succeeded without prometheus-cpp"
fi
grep -q "$expected_reason" "$work/noprom.log" || {
    tail -n 30 "$work/noprom.log" >&2
    fail "find_package(dblock REQUIRED COMPONENTS prometheus) failed without saying '$expected_reason'"
}
say "COMPONENTS prometheus without it fails: $expected_reason"

# 3. pkg-config, with a plain compiler command.
export PKG_CONFIG_PATH=$libdir/pkgconfig
command -v pkg-config >/dev/null || fail "pkg-config not found (Debian: pkg-config)"
pkg-config --exists --print-errors dblock || fail "pkg-config cannot use $pc"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build_dir/CMakeCache.txt")
[ "$(pkg-config --modversion dblock)" = "$version" ] ||
    fail "dblock.pc says version $(pkg-config --modversion dblock), the build $version"
if [ "$shared" = 1 ]; then
    libs=$(pkg-config --libs dblock)
    extra=("-Wl,-rpath,$libdir")
else
    libs=$(pkg-config --static --libs dblock)
    extra=()
fi
# shellcheck disable=SC2046,SC2086  # pkg-config's flags are meant to be word-split
run_logged "$work/pc.log" "compiling the consumer with pkg-config's flags" \
    "$CXX" -std=c++17 "$src_dir/main.cpp" $(pkg-config --cflags dblock) -o "$work/consumer_pc" \
    $libs "${extra[@]}"
say "pkg-config consumer built with: $CXX -std=c++17 main.cpp $(pkg-config --cflags dblock) $libs ${extra[*]}"
expect_output "consumer (pkg-config)" "consumer fence 1" "$work/consumer_pc" "sqlite://$work/pc.db"
needs_shared_dblock "consumer (pkg-config)" "$work/consumer_pc"
say "passed ($kind dblock) in $((SECONDS - t0))s"

#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The consumer_shared test: builds dblock with -DBUILD_SHARED_LIBS=ON in a temporary directory
# (the libraries only: no tests, examples, benchmarks or CLI; -O0 without debug information,
# since only the packaging is checked), checks the SONAMEs and the symlink chains
# (libdblock.so -> libdblock.so.0 -> libdblock.so.0.1.0, the same for libdblock_prometheus when
# it is built), then runs run.sh on that build: CMake and pkg-config consumers linked against
# the installed shared library, and the README's snippets.
#
# Usage: shared.sh SOURCE_DIR
# Environment: CXX, the compiler (default c++); CONSUMER_JOBS, parallel build jobs (default 1:
# ctest runs this beside a timing-sensitive test, on one core of its own).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 SOURCE_DIR" >&2
    exit 2
fi
src=$(readlink -f "$1")
soversion=0 # SOVERSION of dblock_lib and dblock_prometheus in CMakeLists.txt
# shellcheck source=common.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh" consumer_shared
build=$work/build

# check_soname NAME: lib<NAME>.so -> lib<NAME>.so.$soversion -> lib<NAME>.so.$version,
# the SONAME being lib<NAME>.so.$soversion.
check_soname() {
    local name=lib$1.so soname real
    real=$build/$name.$version
    if [ ! -f "$real" ] || [ -L "$real" ]; then
        fail "no shared library $real ($build has: $(cd "$build" && echo libdblock*))"
    fi
    [ "$(readlink "$build/$name")" = "$name.$soversion" ] ||
        fail "$name is not a symlink to $name.$soversion"
    [ "$(readlink "$build/$name.$soversion")" = "$name.$version" ] ||
        fail "$name.$soversion is not a symlink to $name.$version"
    soname=$(readelf -d "$real" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
    [ "$soname" = "$name.$soversion" ] || fail "the SONAME of $real is '$soname', not $name.$soversion"
    echo "consumer_shared: $name -> $name.$soversion -> $name.$version, SONAME $soname"
}

t0=$SECONDS
run_logged "$work/configure.log" "configuring dblock with -DBUILD_SHARED_LIBS=ON" \
    cmake -S "$src" -B "$build" -DCMAKE_CXX_COMPILER="$CXX" -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
    -DDBLOCK_TESTS=OFF -DDBLOCK_EXAMPLES=OFF -DDBLOCK_BENCH=OFF -DDBLOCK_CLI=OFF
run_logged "$work/build.log" "building the shared libraries" cmake --build "$build" -j"${CONSUMER_JOBS:-1}"
echo "consumer_shared: built in $((SECONDS - t0))s"
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ -n "$version" ] || fail "no CMAKE_PROJECT_VERSION in $build/CMakeCache.txt"
check_soname dblock
if grep -q '^DBLOCK_PROMETHEUS:BOOL=ON$' "$build/CMakeCache.txt"; then
    check_soname dblock_prometheus
fi
bash "$src/tests/consumer/run.sh" "$build" "$src/tests/consumer" "$src/README.md"
echo "consumer_shared: passed in $((SECONDS - t0))s"

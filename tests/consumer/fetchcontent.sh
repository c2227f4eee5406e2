#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The consumer_fetchcontent test: tests/consumer/fetchcontent, a project that builds dblock
# inside itself with FetchContent_Declare(dblock SOURCE_DIR SOURCE_DIR), configured with only the
# library's dependencies findable: CLI11, nlohmann-json, Catch2, yaml-cpp, prometheus-cpp and
# pkg-config (hiredis) are hidden with CMAKE_DISABLE_FIND_PACKAGE_*. Its configure step checks
# that dblock defines no tool, test, example or benchmark target; this script then builds it
# (-O0 without debug information: only the build is checked), runs the consumer on a fresh
# SQLite file, checks that nothing but the library and the consumer was built, and that
# `cmake --install` installs the consumer alone (dblock's install rules are off).
#
# Usage: fetchcontent.sh SOURCE_DIR
# Environment: CXX, the compiler (default c++); CONSUMER_JOBS, parallel build jobs (default 1:
# ctest runs this beside a timing-sensitive test, on one core of its own).
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 SOURCE_DIR" >&2
    exit 2
fi
src=$(readlink -f "$1")
# shellcheck source=common.sh
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh" consumer_fetchcontent
build=$work/build

t0=$SECONDS
hidden=()
for pkg in CLI11 nlohmann_json Catch2 yaml-cpp prometheus-cpp PkgConfig; do
    hidden+=("-DCMAKE_DISABLE_FIND_PACKAGE_$pkg=ON")
done
run_logged "$work/configure.log" "configuring tests/consumer/fetchcontent" \
    cmake -S "$src/tests/consumer/fetchcontent" -B "$build" -DDBLOCK_SOURCE_DIR="$src" \
    -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 "${hidden[@]}"
say "configured without CLI11, nlohmann-json, Catch2, yaml-cpp, prometheus-cpp and pkg-config"
run_logged "$work/build.log" "building the consumer and dblock" cmake --build "$build" -j"${CONSUMER_JOBS:-1}"
say "built in $((SECONDS - t0))s"

out=$("$build/consumer" "sqlite://$work/consumer.db" 2>&1) || fail "consumer failed: $out"
[ "$out" = "consumer fence 1" ] || fail "consumer printed '$out', expected 'consumer fence 1'"
say "consumer: $out"

# What was built: executables and libraries other than the consumer and libdblock.a.
built=$(cd "$build" && find . -type f \( -perm -u+x -o -name '*.a' -o -name '*.so*' \) \
    ! -path '*/CMakeFiles/*' ! -name consumer ! -name libdblock.a | sort)
[ -z "$built" ] || fail "the build made more than the consumer and libdblock.a: $built"
[ -f "$build/_deps/dblock-build/libdblock.a" ] || fail "no _deps/dblock-build/libdblock.a"

run_logged "$work/install.log" "cmake --install" cmake --install "$build" --prefix "$work/prefix"
installed=$(cd "$work/prefix" && find . ! -type d | sort)
[ "$installed" = "./bin/consumer" ] || fail "cmake --install installed more than bin/consumer: $installed"
say "cmake --install installed bin/consumer only"
say "passed in $((SECONDS - t0))s"

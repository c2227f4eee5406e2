#!/usr/bin/env bash
# The Debian packages, made and used as a user would (cmake/packaging.cmake):
#   1. configures a shared Release build installing into /usr (PACKAGE_BUILD_DIR), builds it and
#      runs `cpack -G DEB`: libdblock0, libdblock-dev and dblock, whose contents and Depends
#      (dpkg-shlibdeps) are checked;
#   2. installs the three with `apt-get install ./*.deb`, runs `dblock --version`, checks that
#      the tool uses the packaged libdblock.so.0, the library's SONAME and symlink chain, and
#      that `man -w dblock` finds its man page;
#   3. builds the quick start (examples/quickstart/main.cpp; examples/smoke/main.cpp while there
#      is none) against the installed packages, with find_package(dblock) in a CMake project of
#      its own and with pkg-config, and runs both on a fresh SQLite file (it must print a fence);
#   4. removes the packages, and any package their installation pulled in, with apt-get purge:
#      the machine is left with the packages it had before (checked). Also on failure.
#
# Usage: scripts/package-test.sh          (as root: it installs and removes packages)
# Environment: PACKAGE_BUILD_DIR (default build-deb), JOBS (default nproc), CXX (default c++),
#   PACKAGE_BUILD_TYPE (default Release; scripts/test.sh passes Quick: -O0 without debug
#   information, since the test checks the packaging, not the code, and it saves CI a minute).
# Needs what scripts/install-deps.sh installs (dpkg-dev, help2man, man-db among it).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
build=${PACKAGE_BUILD_DIR:-$root/build-deb}
jobs=${JOBS:-$(nproc)}
export CXX=${CXX:-c++}
packages=(libdblock0 libdblock-dev dblock)

T0=$SECONDS
step_t=$SECONDS
summary=()
say() { echo "package-test: $*"; }
fail() {
    echo "package-test: FAIL: $*" >&2
    exit 1
}
step() { # WHAT: ends the current step, noting its time for the summary
    summary+=("$(printf '%-44s %4ds' "$1" $((SECONDS - step_t)))")
    say "$1 ($((SECONDS - step_t))s)"
    step_t=$SECONDS
}
run_logged() { # LOG WHAT COMMAND...
    local log=$1 what=$2
    shift 2
    if ! "$@" >"$log" 2>&1; then
        echo "package-test: FAIL: $what; its output (last 60 lines of $log):" >&2
        tail -n 60 "$log" >&2
        exit 1
    fi
}
installed_packages() { dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" { print $2 }' | sort; }

[ "$(id -u)" -eq 0 ] || fail "installing packages needs root: run it as root or with sudo"
for tool in cpack dpkg-deb dpkg-shlibdeps help2man man pkg-config; do
    command -v "$tool" >/dev/null || fail "$tool not found: run scripts/install-deps.sh"
done
for p in "${packages[@]}"; do
    if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep '^ii' >/dev/null; then
        fail "$p is installed already: remove it first (this test leaves the machine as it found it)"
    fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/dblock-package.XXXXXX")
chmod 755 "$work" # apt's _apt user reads the .deb files from here
before=$work/packages-before
installed_packages >"$before"
installed=0
# Purges what the test installed: the three packages and whatever their installation pulled in;
# then the installed packages must be those of before.
remove_packages() {
    local added
    mapfile -t added < <(installed_packages | comm -13 "$before" -)
    installed=0
    say "removing ${added[*]}"
    if ! DEBIAN_FRONTEND=noninteractive apt-get purge -y "${added[@]}" >"$work/remove.log" 2>&1; then
        tail -n 30 "$work/remove.log" >&2
        echo "package-test: FAIL: apt-get purge ${added[*]} failed" >&2
        return 1
    fi
    if ! installed_packages | cmp -s "$before" -; then
        echo "package-test: FAIL: the installed packages differ from before the test:" >&2
        installed_packages | diff "$before" - >&2 || true
        return 1
    fi
}
cleanup() {
    local status=$?
    if [ "$installed" = 1 ]; then remove_packages || status=1; fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

# 1. Build and package.
build_type=${PACKAGE_BUILD_TYPE:-Release}
type_flags=(-DCMAKE_BUILD_TYPE="$build_type")
if [ "$build_type" = Quick ]; then
    type_flags=(-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O0)
fi
# shellcheck source=scripts/ccache.sh
. "$root/scripts/ccache.sh"
say "configuring a shared $build_type build in $build"
run_logged "$work/configure.log" "configuring $build" \
    cmake -S "$root" -B "$build" "${type_flags[@]}" -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_CXX_COMPILER="$CXX" -DDBLOCK_CLI=ON -DDBLOCK_INSTALL=ON \
    -DDBLOCK_TESTS=OFF -DDBLOCK_EXAMPLES=OFF -DDBLOCK_BENCH=OFF -DDBLOCK_PROMETHEUS=OFF \
    "${CCACHE_CMAKE_ARGS[@]}"
grep -q '^DBLOCK_HELP2MAN:FILEPATH=/' "$build/CMakeCache.txt" || fail "CMake did not find help2man"
run_logged "$work/build.log" "building $build" cmake --build "$build" -j"$jobs"
step "configured and built"
run_logged "$work/cpack.log" "cpack -G DEB" \
    cpack --config "$build/CPackConfig.cmake" -G DEB -B "$work/debs"
mapfile -t debs < <(find "$work/debs" -maxdepth 1 -name '*.deb' | sort)
[ "${#debs[@]}" -eq 3 ] || fail "cpack made ${#debs[@]} .deb files, not 3: ${debs[*]}"
chmod 644 "${debs[@]}"
chmod 755 "$work/debs"
declare -A deb
for f in "${debs[@]}"; do
    deb[$(dpkg-deb -f "$f" Package)]=$f
done
for p in "${packages[@]}"; do
    [ -n "${deb[$p]:-}" ] || fail "cpack made no package $p (it made ${debs[*]##*/})"
    say "$(basename "${deb[$p]}"): Depends: $(dpkg-deb -f "${deb[$p]}" Depends)"
done

# contains PACKAGE REGEX...: the package has a file matching each (extended) regex.
contains() {
    local p=$1 re
    shift
    dpkg-deb -c "${deb[$p]}" | awk '{ print $6 }' >"$work/$p.files"
    for re in "$@"; do
        grep -Eq "$re" "$work/$p.files" || fail "$p has no file matching $re; it has: $(tr '\n' ' ' <"$work/$p.files")"
    done
}
# depends PACKAGE NAME...: its Depends names each package.
depends() {
    local p=$1 d n
    shift
    d=$(dpkg-deb -f "${deb[$p]}" Depends)
    for n in "$@"; do
        [[ ", $d," == *", $n"[\ ,]* ]] || fail "$p does not depend on $n: Depends: $d"
    done
}
lib='\./usr/lib/[a-z0-9_]+-linux-gnu'
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
contains libdblock0 "$lib/libdblock\.so\.0$" "$lib/libdblock\.so\.$version$"
contains libdblock-dev '\./usr/include/dblock/dblock\.hpp$' "$lib/libdblock\.so$" "$lib/libdblock\.a$" \
    "$lib/cmake/dblock/dblockConfig\.cmake$" "$lib/cmake/dblock/dblockTargets\.cmake$" \
    "$lib/pkgconfig/dblock\.pc$" '\./usr/share/dblock/migrations/postgresql/0001_.*\.sql$'
contains dblock '\./usr/bin/dblock$' '\./usr/share/man/man1/dblock\.1\.gz$'
if grep -Eq 'prometheus|bench' "$work/libdblock0.files" "$work/libdblock-dev.files" "$work/dblock.files"; then
    fail "a package holds dblock::prometheus or the benchmarks"
fi
depends libdblock0 libc6 libstdc++6 libsoci-core4.0 libsoci-postgresql4.0 libsoci-mysql4.0 \
    libsoci-sqlite3-4.0 libsqlite3-0 liburiparser1
depends libdblock-dev libdblock0 libsoci-dev libboost-dev libpq-dev libmariadb-dev libsqlite3-dev liburiparser-dev
depends dblock libdblock0 libc6 libstdc++6
if dpkg-deb -f "${deb[dblock]}" Depends | grep hiredis >/dev/null; then fail "dblock depends on hiredis"; fi
step "packaged (${#debs[@]} .deb)"

# 2. Install; the tool and its man page.
installed=1
run_logged "$work/install.log" "apt-get install ./*.deb" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${debs[@]}"
say "installed: $(installed_packages | comm -13 "$before" - | tr '\n' ' ')"
step "installed with apt-get install ./*.deb"
out=$(dblock --version 2>&1) || fail "dblock --version exited with status $?: $out"
[ "$out" = "dblock $version" ] || fail "dblock --version printed '$out', expected 'dblock $version'"
say "dblock --version: $out"
tool=$(command -v dblock)
[ "$tool" = /usr/bin/dblock ] || fail "dblock is $tool, not /usr/bin/dblock"
# (/lib is /usr/lib on Debian 12, merged /usr: the loader's cache may name either.) No `grep -q`
# on a pipe in this script: under pipefail, a grep that stops at the first match can leave the
# writer killed by SIGPIPE, and the pipeline fails on a match (seen: this check, under load).
ldd "$tool" | grep -E 'libdblock\.so\.0 => (/usr)?/lib/[a-z0-9_]+-linux-gnu/libdblock\.so\.0 ' >/dev/null ||
    fail "dblock does not use the packaged libdblock.so.0: $(ldd "$tool" | grep dblock)"
# The shared library's SONAME and symlink chain, as installed: libdblock.so (libdblock-dev) ->
# libdblock.so.0 -> libdblock.so.$version (libdblock0), the SONAME being libdblock.so.0.
libdir=$(dirname "$(ldd "$tool" | sed -n 's/.*libdblock\.so\.0 => \([^ ]*\) .*/\1/p')")
[ "$(readlink "$libdir/libdblock.so")" = libdblock.so.0 ] ||
    fail "$libdir/libdblock.so is not a symlink to libdblock.so.0"
[ "$(readlink "$libdir/libdblock.so.0")" = "libdblock.so.$version" ] ||
    fail "$libdir/libdblock.so.0 is not a symlink to libdblock.so.$version"
soname=$(readelf -d "$libdir/libdblock.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
[ "$soname" = libdblock.so.0 ] || fail "the SONAME of libdblock.so.$version is '$soname', not libdblock.so.0"
say "libdblock.so -> libdblock.so.0 -> libdblock.so.$version, SONAME $soname"
man_page=$(man -w dblock 2>&1) || fail "man -w dblock: $man_page"
[ "$man_page" = /usr/share/man/man1/dblock.1.gz ] || fail "man -w dblock found $man_page"
zcat "$man_page" | grep 'migrate' >/dev/null || fail "the man page does not mention migrate"
say "man -w dblock: $man_page"

# 3. The quick start against the installed packages.
quickstart=$root/examples/quickstart/main.cpp
[ -f "$quickstart" ] || quickstart=$root/examples/smoke/main.cpp
mkdir -p "$work/quickstart" "$work/run"
cp "$quickstart" "$work/quickstart/main.cpp"
cat >"$work/quickstart/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(quickstart LANGUAGES CXX)
find_package(dblock 0.1 REQUIRED)
add_executable(quickstart main.cpp)
target_link_libraries(quickstart PRIVATE dblock::dblock)
EOF
run_logged "$work/qs-configure.log" "configuring the quick start with find_package(dblock)" \
    cmake -S "$work/quickstart" -B "$work/quickstart/build" -DCMAKE_CXX_COMPILER="$CXX"
dblock_dir=$(sed -n 's/^dblock_DIR:PATH=//p' "$work/quickstart/build/CMakeCache.txt")
[[ "$dblock_dir" == /usr/lib/*-linux-gnu/cmake/dblock ]] || fail "find_package(dblock) found $dblock_dir"
run_logged "$work/qs-build.log" "building the quick start" cmake --build "$work/quickstart/build"
# shellcheck disable=SC2046 # pkg-config's flags are meant to be word-split
run_logged "$work/qs-pc.log" "compiling the quick start with pkg-config's flags" \
    "$CXX" -std=c++17 "$work/quickstart/main.cpp" -o "$work/quickstart/quickstart_pc" \
    $(pkg-config --cflags --libs dblock)
for exe in quickstart/build/quickstart quickstart/quickstart_pc; do
    ldd "$work/$exe" | grep -E 'libdblock\.so\.0 => (/usr)?/lib/' >/dev/null ||
        fail "$exe does not use the packaged libdblock.so.0: $(ldd "$work/$exe" 2>&1 | grep -i dblock || echo 'ldd names no libdblock')"
    rm -f "$work/run/"*.db*
    out=$(cd "$work/run" && "$work/$exe" "sqlite://$work/run/quickstart.db" 2>&1) ||
        fail "$exe exited with status $?: $out"
    grep -qi 'fence' <<<"$out" || fail "$exe printed no fence: $out"
    say "$exe ($(basename "$(dirname "$quickstart")")/main.cpp): $(grep -i -m1 fence <<<"$out")"
done
step "quick start built (CMake, pkg-config) and run"

# 4. Remove: the machine has the packages it had before.
remove_packages || exit 1
step "removed the packages"

echo
echo "package-test: summary"
printf '  %s\n' "${summary[@]}"
echo "package-test: passed in $((SECONDS - T0))s"

# shellcheck shell=bash
# Compiler caching for the build scripts (sourced by scripts/test.sh, sanitizers.sh, fuzz.sh and
# package-test.sh): when ccache is installed (scripts/install-deps.sh installs it), every build
# tree compiles through it, and CCACHE_CMAKE_ARGS holds the CMake arguments that say so.
#
# Why it pays: CI builds the same sources four times with different flags (plain, ASan+UBSan,
# TSan, the fuzzers, plus the package build), and a machine that ran a build before keeps its
# cache, so an unchanged file is compiled once per set of flags. The cache is keyed on the
# preprocessed source and the flags, and paths under the checkout are made relative
# (CCACHE_BASEDIR, CCACHE_NOHASHDIR), so a fresh clone in another folder hits the same entries.
# Precompiled headers (Catch2, tests/CMakeLists.txt) need the sloppiness below, as ccache's
# manual says. DBLOCK_CCACHE=0 turns it off.
CCACHE_CMAKE_ARGS=()
if [ "${DBLOCK_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
    export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}
    export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
    export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-5G}
    CCACHE_CMAKE_ARGS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

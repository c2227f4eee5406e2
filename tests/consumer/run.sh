#!/usr/bin/env bash
# Installs the build into a temporary prefix, builds tests/consumer against it with
# find_package(dblock), and runs it on a fresh SQLite file.
set -euo pipefail
build_dir=$1 src_dir=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$src_dir" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
out=$("$work/build/consumer" "sqlite://$work/consumer.db")
echo "$out"
[ "$out" = "consumer fence 1" ]

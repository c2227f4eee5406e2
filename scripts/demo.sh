#!/usr/bin/env bash
# README command (a): install what is missing, build, and run the demo on an embedded SQLite
# file. Safe to run again: the second run skips apt and rebuilds only what changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target dblock_smoke dblock >/dev/null
db="$build/demo/dblock-demo.db"
mkdir -p "$(dirname "$db")"
echo "== dblock demo on sqlite://$db"
"$build/examples/dblock_smoke" "sqlite://$db"

#!/usr/bin/env bash
# README command (a): install what is missing, build, and run the flash-sale demo on an
# embedded SQLite file: 8 processes buy from a stock of 100 with each strategy in turn (no lock,
# lease lock, FOR UPDATE, optimistic, CAS), and the table shows which ones kept the invariant.
# Safe to run again: the second run skips apt and rebuilds only what changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
echo "== building (first time: about a minute)" >&2
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target flash_sale dblock >/dev/null
mkdir -p "$build/demo"
rm -f "$build/demo/flash_sale.db" "$build/demo/flash_sale.db-wal" "$build/demo/flash_sale.db-shm"
"$build/examples/flash_sale/flash_sale" --url "sqlite://$build/demo/flash_sale.db" "$@"

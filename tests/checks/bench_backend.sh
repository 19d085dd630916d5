#!/usr/bin/env bash
# `kvmem bench --json --quick --backend B backend` prints one flat JSON line
# for the Vulkan aabb_score kernel (GFLOP/s from device timestamps beside a
# plain CPU loop) where the Vulkan backend runs, and nothing on the CPU
# backend, which has no such kernel. Args: SRC BIN LIBKVMEM KVMEM_CLI CC SANITIZE
set -euo pipefail
bin=$2 lib=$3 cli=$4
grep -q '^KVMEM_BUILD_BENCH:BOOL=ON' "$bin/CMakeCache.txt" || { echo "skipped: benchmarks not built (KVMEM_BUILD_BENCH=OFF)"; exit 77; }
export KVMEM_BACKEND_PATH="$(dirname "$lib")"
out=$("$cli" bench --json --quick --backend cpu backend)
[ -z "$out" ] || { echo "FAIL: the CPU backend has no aabb_score kernel, yet the suite printed: $out"; exit 1; }
if grep -q '^vulkan  *available' <<<"$("$cli" backends)"; then
  out=$("$cli" bench --json --quick --backend vulkan backend)
  echo "$out"
  n=$(grep -c '^{"suite":"backend","backend":"vulkan".*"op":"aabb_score".*}$' <<<"$out" || true)
  [ "$n" -eq 1 ] || { echo "FAIL: expected 1 aabb_score JSON line for vulkan, got $n"; exit 1; }
  # device times come from timestamps, so they are positive numbers
  grep -q '"device_ms":[0-9]' <<<"$out" || { echo "FAIL: no device time"; exit 1; }
  grep -q '"gflops":[0-9]' <<<"$out" || { echo "FAIL: no GFLOP/s"; exit 1; }
else
  echo "vulkan part skipped: $("$cli" backends | grep '^vulkan')"
fi
echo ok

#!/usr/bin/env bash
# `kvmem bench --json --quick --backend B backend` prints one flat JSON line
# per op for the CPU backend and, where it runs, the Vulkan backend (device
# times from timestamp queries). Args: SRC BIN LIBKVMEM KVMEM_CLI CC SANITIZE
set -euo pipefail
bin=$2 lib=$3 cli=$4
grep -q '^KVMEM_BUILD_BENCH:BOOL=ON' "$bin/CMakeCache.txt" || { echo "skipped: benchmarks not built (KVMEM_BUILD_BENCH=OFF)"; exit 77; }
export KVMEM_BACKEND_PATH="$(dirname "$lib")"
check() { # backend, expected lines
  out=$("$cli" bench --json --quick --backend "$1" backend)
  echo "$out"
  # convert x5, aabb_build, quantize and dequantize x (q8, q4)
  outn=$(echo "$out" | grep -v '"op":"aabb_score"' || true)
  n=$(echo "$outn" | grep -c '^{"suite":"backend","backend":"'"$1"'".*"gbps":[0-9].*}$' || true)
  [ "$n" -eq 10 ] || { echo "FAIL: expected 10 JSON lines for backend $1, got $n"; exit 1; }
  for op in quantize dequantize; do for dt in q8 q4; do
    grep -q '"op":"'$op'","dtype":"'$dt'"' <<<"$out" || { echo "FAIL: no $op $dt line for backend $1"; exit 1; }
  done; done
}
check cpu
if grep -q '^vulkan  *available' <<<"$("$cli" backends)"; then
  check vulkan
  # device times come from timestamps, so they are positive numbers
  grep -q '"device_ms":[0-9]' <<<"$out" || { echo "FAIL: no device time"; exit 1; }
  grep -q '"op":"aabb_score".*"gflops":[0-9]' <<<"$out" || { echo "FAIL: no aabb_score line"; exit 1; }
else
  echo "vulkan part skipped: $("$cli" backends | grep '^vulkan')"
fi
echo ok

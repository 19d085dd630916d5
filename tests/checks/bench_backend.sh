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
  out6=$(echo "$out" | grep -v '"op":"aabb_score"' || true)
  n=$(echo "$out6" | grep -c '^{"suite":"backend","backend":"'"$1"'".*"gbps":[0-9].*}$' || true)
  [ "$n" -eq 6 ] || { echo "FAIL: expected 6 JSON lines for backend $1, got $n"; exit 1; }
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

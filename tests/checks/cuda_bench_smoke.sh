#!/usr/bin/env bash
# `kvmem bench --json --quick cuda` runs everywhere: with a GPU it prints the
# device, selection, attend and gather_rope lines; without one a single
# "skipped" line with the reason, and exit 0 either way.
# Args: SRC BIN LIBKVMEM CLI CC SANITIZE
set -uo pipefail
cli=$4
out=$("$cli" bench --json --quick cuda 2>/tmp/kvmem_cuda_smoke.$$)
rc=$?
err=$(cat /tmp/kvmem_cuda_smoke.$$); rm -f /tmp/kvmem_cuda_smoke.$$
if echo "$err" | grep -q "this build has no benchmarks"; then
  echo "skipped: this build has no benchmarks (KVMEM_BUILD_BENCH=OFF)"
  exit 77
fi
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: exit $rc"; exit 1; }
if echo "$out" | grep -q '"skipped"'; then
  echo "$out" | grep -q '"suite":"cuda","skipped":"backend .cuda. is unusable here: .\+"' ||
    { echo "FAIL: the skip line gives no reason"; exit 1; }
  exit 0
fi
for c in device selection attend gather_rope; do
  echo "$out" | grep -q "\"case\":\"$c\"" || { echo "FAIL: no $c line"; exit 1; }
done

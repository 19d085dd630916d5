#!/usr/bin/env bash
# The PyTorch baseline of the CUDA benchmark skips cleanly where torch (or a
# GPU) is missing: one JSON line saying why, exit 77, no traceback.
# Args: SRC BIN LIBKVMEM CLI CC SANITIZE
set -uo pipefail
src=$1
command -v python3 >/dev/null || { echo "skipped: python3 not installed"; exit 77; }
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "skipped: torch with a GPU is present here (scripts/gpu-check.sh runs the baseline)"
  exit 77
fi
out=$(python3 "$src/bench/cuda_torch_baseline.py" --quick 2>/tmp/kvmem_torch_err.$$)
rc=$?
err=$(cat /tmp/kvmem_torch_err.$$); rm -f /tmp/kvmem_torch_err.$$
echo "$out"
[ "$rc" = 77 ] || { echo "FAIL: exit $rc, expected 77"; exit 1; }
echo "$out" | grep -q '"skipped"' || { echo "FAIL: no skipped line"; exit 1; }
echo "$err" | grep -q Traceback && { echo "FAIL: traceback: $err"; exit 1; }
echo "ok: $err"

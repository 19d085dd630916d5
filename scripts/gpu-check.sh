#!/usr/bin/env bash
# Everything the CUDA backend needs checked on a machine with an NVIDIA GPU,
# in one command:
#   1. build with the CUDA backend (Release, warnings as errors)
#   2. every ctest test; the CUDA conformance suite must run, not skip
#   3. compute-sanitizer memcheck over the conformance suite
#   4. `kvmem bench --json cuda` and the PyTorch baselines on the same GPU
# Results (JSON lines and logs) go to $KVMEM_GPU_BUILD (default build/gpu)
# and, when set, to $OUT. Exit 77 ("skipped") where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${KVMEM_GPU_BUILD:-build/gpu}
JOBS=$(nproc 2>/dev/null || echo 2)
mkdir -p "$B"
log() { echo "gpu-check: $*" >&2; }

if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && ! command -v nvidia-smi >/dev/null; then
  echo "skipped: no NVIDIA driver (libcuda.so.1) on this machine"
  exit 77
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$B/device.txt" || true

log "configure and build ($B)"
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKVMEM_CUDA=ON -DKVMEM_WERROR=ON >"$B/configure.log"
cmake --build "$B" -j "$JOBS" >"$B/build.log" 2>&1 || { tail -50 "$B/build.log"; exit 1; }

log "backends"
"$B/tools/kvmem" backends | tee "$B/backends.txt"

log "ctest"
(cd "$B" && ctest --output-on-failure -j "$JOBS") | tee "$B/ctest.log"

log "conformance (must not skip)"
export KVMEM_BACKEND_PATH="$PWD/$B/core"
"$B/tests/test_cuda_conformance" 2>&1 | tee "$B/conformance.log"
if grep -q "skipped: no CUDA device" "$B/conformance.log"; then
  log "FAIL: the conformance suite skipped on a machine with a driver: $(grep -m1 skipped "$B/conformance.log")"
  exit 1
fi

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -n "$SAN" ]; then
  log "compute-sanitizer memcheck"
  "$SAN" --tool memcheck --error-exitcode 1 --leak-check full "$B/tests/test_cuda_conformance" 2>&1 | tee "$B/memcheck.log"
else
  log "skipped: compute-sanitizer not found (install cuda-sanitizer) — memcheck NOT run"
  echo "skipped: compute-sanitizer not found" >"$B/memcheck.log"
fi

log "benchmarks"
"$B/tools/kvmem" bench --json cuda | tee "$B/bench.jsonl"
rc=0
python3 bench/cuda_torch_baseline.py | tee -a "$B/bench.jsonl" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || { log "torch baseline failed ($rc)"; exit 1; }

if [ -n "${OUT:-}" ]; then
  cp "$B"/*.log "$B"/*.txt "$B"/bench.jsonl "$OUT"/ 2>/dev/null || true
fi
log "done: $B/bench.jsonl"

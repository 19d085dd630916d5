#!/usr/bin/env bash
# Everything the CUDA backend needs checked on a machine with an NVIDIA GPU,
# in one command:
#   1. build with the CUDA backend (Release, warnings as errors)
#   2. every ctest test; then every conformance program for "cuda"
#      (tests/backend/test_backend*.c: the table entries against the CPU
#      backend) and test_cuda_conformance, which must run, not skip
#   3. compute-sanitizer memcheck (and racecheck, synccheck) over all of them
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

# from here on a failure is recorded and the next step still runs, so one
# session on a GPU machine brings back every result; the exit status says
fail=0
log "ctest"
(cd "$B" && ctest --output-on-failure -j "$JOBS") >"$B/ctest.log" 2>&1 || { fail=1; log "FAIL: ctest (log: $B/ctest.log)"; }
tail -n 30 "$B/ctest.log"

log "conformance (must not skip)"
export KVMEM_BACKEND_PATH="$PWD/$B/core"
# test_cuda_conformance: the plugin's procs and entries; test_backend*: the
# shared conformance programs, run for the backend named "cuda"
progs=("$B/tests/test_cuda_conformance")
for p in "$B"/tests/test_backend*; do [ -x "$p" ] && progs+=("$p cuda"); done
: >"$B/conformance.log"
for pc in "${progs[@]}"; do
  log "  $pc"
  # shellcheck disable=SC2086
  $pc >"$B/run.log" 2>&1 || { fail=1; log "FAIL: $pc"; }
  cat "$B/run.log" >>"$B/conformance.log"
  if grep -q "skipped: " "$B/run.log"; then
    log "FAIL: $pc skipped on a machine with a driver: $(grep -m1 'skipped: ' "$B/run.log")"
    fail=1
  fi
done
tail -n 40 "$B/conformance.log"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -n "$SAN" ]; then
  log "compute-sanitizer memcheck"
  : >"$B/memcheck.log"
  for pc in "${progs[@]}"; do
    log "  memcheck $pc"
    # shellcheck disable=SC2086
    "$SAN" --tool memcheck --error-exitcode 1 --leak-check full $pc >>"$B/memcheck.log" 2>&1 ||
      { log "FAIL: memcheck $pc (log: $B/memcheck.log)"; fail=1; }
  done
  # shared-memory races and barrier misuse in the kernels
  for tool in racecheck synccheck; do
    log "compute-sanitizer $tool"
    : >"$B/$tool.log"
    for pc in "${progs[@]}"; do
      # shellcheck disable=SC2086
      "$SAN" --tool $tool --error-exitcode 1 $pc >>"$B/$tool.log" 2>&1 ||
        { log "FAIL: $tool $pc (log: $B/$tool.log)"; fail=1; }
    done
  done
else
  log "skipped: compute-sanitizer not found (install cuda-sanitizer) — memcheck NOT run"
  echo "skipped: compute-sanitizer not found" >"$B/memcheck.log"
fi

log "benchmarks"
"$B/tools/kvmem" bench --json cuda | tee "$B/bench.jsonl" || { fail=1; log "FAIL: kvmem bench cuda"; }
rc=0
python3 bench/cuda_torch_baseline.py | tee -a "$B/bench.jsonl" || rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || { log "torch baseline failed ($rc)"; fail=1; }

if [ -n "${OUT:-}" ]; then
  cp "$B"/*.log "$B"/*.txt "$B"/bench.jsonl "$OUT"/ 2>/dev/null || true
fi
if [ "$fail" != 0 ]; then
  log "FAILED (logs in $B)"
  exit 1
fi
log "done: every step passed; numbers in $B/bench.jsonl"

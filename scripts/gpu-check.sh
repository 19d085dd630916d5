#!/usr/bin/env bash
# Everything the GPU backends need checked on a machine with an NVIDIA GPU,
# in one command:
#   1. build with the CUDA backend (Release, warnings as errors), unless
#      KVMEM_GPU_PREBUILT=1 names a tree built elsewhere (a GPU lease is short;
#      the build can be made on any machine with nvcc, for sm_90 here)
#   2. the CUDA conformance programs (test_cuda_conformance and every
#      tests/backend/test_backend*.c run for "cuda"), which must run, not skip;
#      the same programs for "vulkan" where a Vulkan GPU driver is present
#   3. `kvmem bench --json cuda` (selection at 14k/128k tokens, decode
#      attention and gather against the measured copy bandwidth) and the
#      PyTorch baselines on the same GPU; the public API's decode step on
#      --backend cuda (retrieval suite)
#   4. the Python CUDA tests (DLPack, kvmem.torch, device tensors) where
#      python3 has a CUDA torch
#   5. every ctest test, then compute-sanitizer memcheck/racecheck/synccheck
#      over the conformance programs
# Each step has a time limit (KVMEM_GPU_STEP_S, default 240 s) so one lease
# brings back every result; a failure is recorded and the next step runs.
# Knobs for a short lease: KVMEM_GPU_DEADLINE_S (the whole run), KVMEM_GPU_CTEST_ARGS
# (e.g. -R to run the tests a GPU changes), KVMEM_GPU_VULKAN=0, KVMEM_GPU_BENCH=0, KVMEM_GPU_API_BENCH=0,
# KVMEM_GPU_SANITIZER=0 or KVMEM_GPU_SANITIZER_TOOLS="memcheck"; a step not
# run is reported as a failure, never as a pass.
# Results (JSON lines and logs) go to $KVMEM_GPU_BUILD (default build/gpu)
# and, when set, to $OUT. Exit 77 ("skipped") where there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
B=${KVMEM_GPU_BUILD:-build/gpu}
STEP_S=${KVMEM_GPU_STEP_S:-240}
JOBS=$(nproc 2>/dev/null || echo 2)
mkdir -p "$B"
log() { echo "gpu-check: $*" >&2; }
# logs and numbers so far into $OUT (one archive, refreshed after each step)
save() { [ -n "${OUT:-}" ] && (cd "$B" && tar czf "$OUT/gpu-check-logs.tgz" ./*.log ./*.txt ./*.jsonl 2>/dev/null); true; }

if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && ! command -v nvidia-smi >/dev/null; then
  echo "skipped: no NVIDIA driver (libcuda.so.1) on this machine"
  exit 77
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$B/device.txt"

if [ "${KVMEM_GPU_PREBUILT:-0}" != 1 ]; then
  log "configure and build ($B)"
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DKVMEM_CUDA=ON -DKVMEM_WERROR=ON >"$B/configure.log" || exit 1
  cmake --build "$B" -j "$JOBS" >"$B/build.log" 2>&1 || { tail -50 "$B/build.log"; exit 1; }
fi
[ -x "$B/tools/kvmem" ] && [ -e "$B/core/libkvmem-cuda.so" ] || { log "no CUDA build in $B"; exit 1; }
export KVMEM_BACKEND_PATH="$PWD/$B/core"

fail=0
# step NAME LOG CMD...: run with the step limit (and within the whole run's
# KVMEM_GPU_DEADLINE_S, when set), record a failure by name
DEADLINE=${KVMEM_GPU_DEADLINE_S:-0}
step() {
  local name=$1 out=$2 lim=$STEP_S
  shift 2
  if [ "$DEADLINE" -gt 0 ]; then
    local left=$((DEADLINE - SECONDS))
    if [ $left -lt 10 ]; then
      log "NOT RUN: $name (past KVMEM_GPU_DEADLINE_S=$DEADLINE)"
      echo "not run: past the deadline" >"$out"
      fail=1
      return 1
    fi
    [ $left -lt "$lim" ] && lim=$left
  fi
  log "$name"
  timeout -k 5 "$lim" "$@" >"$out" 2>&1
  local rc=$?
  save
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    log "FAIL: $name ran past ${lim}s"
    fail=1
  elif [ $rc != 0 ]; then
    log "FAIL: $name (exit $rc, log: $out)"
    fail=1
  fi
  return $rc
}

"$B/tools/kvmem" backends | tee "$B/backends.txt"

# ---- conformance: CUDA must run; Vulkan where a GPU driver is present ----
progs=("$B/tests/test_cuda_conformance")
for p in "$B"/tests/test_backend*; do [ -x "$p" ] && progs+=("$p cuda"); done
: >"$B/conformance.log"
for pc in "${progs[@]}"; do
  # shellcheck disable=SC2086
  step "conformance: $pc" "$B/run.log" $pc
  cat "$B/run.log" >>"$B/conformance.log"
  if grep -q "skipped: " "$B/run.log"; then
    log "FAIL: $pc skipped on a machine with a driver: $(grep -m1 'skipped: ' "$B/run.log")"
    fail=1
  fi
done
grep -E "PASSED|FAILED|SKIPPED|\[  FAILED|skipped:" "$B/conformance.log" | tail -n 40
if [ "${KVMEM_GPU_VULKAN:-1}" != 1 ]; then
  log "Vulkan on the GPU: not run (KVMEM_GPU_VULKAN=0)"
elif grep -E '^vulkan +available' "$B/backends.txt" | grep -qvi llvmpipe; then
  : >"$B/vulkan.log"
  for p in "$B"/tests/test_backend* "$B/tests/test_device_tensors"; do
    [ -x "$p" ] || continue
    arg=vulkan
    [ "${p##*/}" = test_device_tensors ] && arg=
    # shellcheck disable=SC2086
    step "vulkan on the GPU: $p" "$B/run.log" "$p" $arg
    cat "$B/run.log" >>"$B/vulkan.log"
  done
  grep -E "PASSED|FAILED|skipped:" "$B/vulkan.log" | tail -n 20
else
  log "skipped: Vulkan on the GPU: no NVIDIA Vulkan driver seen by kvmem backends"
fi
save

# ---- benchmarks ----
if [ "${KVMEM_GPU_BENCH:-1}" = 1 ]; then
  step "kvmem bench --json cuda" "$B/bench_cuda.log" "$B/tools/kvmem" bench --json cuda
  cp "$B/bench_cuda.log" "$B/bench.jsonl"
  cat "$B/bench.jsonl"
  rc=0
  timeout "$STEP_S" python3 bench/cuda_torch_baseline.py >>"$B/bench.jsonl" 2>"$B/torch.log" || rc=$?
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || { log "torch baseline failed ($rc)"; fail=1; }
  tail -n 4 "$B/bench.jsonl"
  save
else
  log "benchmarks: not run (KVMEM_GPU_BENCH=0)"
fi
if [ "${KVMEM_GPU_API_BENCH:-1}" = 1 ]; then
  step "kvmem bench --json --backend cuda retrieval" "$B/bench_api.log" \
    "$B/tools/kvmem" bench --json --backend cuda retrieval
  grep -h '"backend"' "$B/bench_api.log" >>"$B/bench.jsonl"
  save
fi

# ---- Python: CUDA tensors through DLPack, kvmem.torch, device tensors ----
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  KVMEM_LIBRARY="$PWD/$B/core/libkvmem.so" PYTHONPATH="$PWD/bindings/python" \
    step "python CUDA tests" "$B/python.log" python3 -m pytest -q -rs -p no:cacheprovider \
    bindings/python/tests/test_dlpack_cuda.py bindings/python/tests/test_device_tensors.py \
    bindings/python/tests/test_dlpack.py
  tail -n 15 "$B/python.log"
else
  log "skipped: python CUDA tests: python3 has no CUDA torch"
fi
save

# ---- every ctest test ----
# shellcheck disable=SC2086
step "ctest" "$B/ctest.log" ctest --test-dir "$B" --output-on-failure -j "$JOBS" ${KVMEM_GPU_CTEST_ARGS:-}
tail -n 25 "$B/ctest.log"
save

# ---- compute-sanitizer over the conformance programs ----
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
if [ -n "$SAN" ] && [ "${KVMEM_GPU_SANITIZER:-1}" = 1 ]; then
  for tool in ${KVMEM_GPU_SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
    : >"$B/$tool.log"
    extra=()
    # the conformance programs ask for impossible allocations on purpose (the
    # refusal is what they test): those API errors are expected, memory errors are not
    [ $tool = memcheck ] && extra=(--leak-check full --report-api-errors no)
    for pc in "${progs[@]}"; do
      # shellcheck disable=SC2086
      step "compute-sanitizer $tool $pc" "$B/run.log" "$SAN" --tool $tool --error-exitcode 1 "${extra[@]}" $pc
      cat "$B/run.log" >>"$B/$tool.log"
    done
    grep -h "ERROR SUMMARY" "$B/$tool.log" | sort | uniq -c
  done
else
  log "skipped: compute-sanitizer not found or KVMEM_GPU_SANITIZER=0 — sanitizers NOT run"
  echo "skipped: compute-sanitizer not run" >"$B/memcheck.log"
fi
save
if [ "$fail" != 0 ]; then
  log "FAILED (logs in $B)"
  exit 1
fi
log "done: every step passed; numbers in $B/bench.jsonl"

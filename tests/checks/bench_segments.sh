#!/usr/bin/env bash
# Runs `kvmem bench --json --quick segments` and checks its keys and the
# properties the model guarantees: KEEP invalidates fewer tokens per update
# than fixed blocks on the trace, and the balanced load plan never idles
# more than the plain pipeline.
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler, $6 sanitizers.
set -u
tool="$4"
if [ ! -x "$tool" ]; then
  echo "skipped: kvmem tool not found at '$tool'"
  exit 77
fi
out="$("$tool" bench --json --quick segments 2>&1)"
rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q "has no benchmarks"; then
  echo "skipped: this build has no benchmarks (KVMEM_BUILD_BENCH=OFF)"
  exit 77
fi
if [ $rc -ne 0 ]; then
  echo "FAIL: kvmem bench segments exited $rc:"
  printf '%s\n' "$out"
  exit 1
fi
printf '%s\n' "$out"
fail=0
num() { # num LINE KEY -> the numeric value, or empty
  printf '%s' "$1" | sed -n "s/.*\"$2\":\(-\{0,1\}[0-9][0-9.eE+-]*\).*/\1/p"
}
trace="$(printf '%s\n' "$out" | grep '"case":"embodied_trace"')"
plans="$(printf '%s\n' "$out" | grep '"case":"load_plan"')"
timing="$(printf '%s\n' "$out" | grep '"case":"timing"')"
[ -n "$trace" ] || { echo "FAIL: no embodied_trace line"; fail=1; }
[ -n "$timing" ] || { echo "FAIL: no timing line"; fail=1; }
[ "$(printf '%s\n' "$plans" | grep -c .)" -ge 2 ] || { echo "FAIL: expected load_plan lines for several bandwidths"; fail=1; }
for k in steps updates invalidated_tokens_fixed invalidated_tokens_keep fixed_over_keep kmeans_room_purity; do
  [ -n "$(num "$trace" "$k")" ] || { echo "FAIL: embodied_trace lacks numeric '$k'"; fail=1; }
done
fx="$(num "$trace" invalidated_tokens_fixed)"
kp="$(num "$trace" invalidated_tokens_keep)"
if [ -n "$fx" ] && [ -n "$kp" ]; then
  awk -v f="$fx" -v k="$kp" 'BEGIN { exit !(k > 0 && k < f) }' ||
    { echo "FAIL: invalidated_tokens_keep $kp not below invalidated_tokens_fixed $fx"; fail=1; }
fi
while IFS= read -r line; do
  [ -n "$line" ] || continue
  for k in n_layers n_kv_heads head_dim bandwidth_gbps idle_naive_ms idle_balanced_ms compute_idle_naive_ms \
           compute_idle_balanced_ms makespan_naive_ms makespan_balanced_ms loads; do
    [ -n "$(num "$line" "$k")" ] || { echo "FAIL: load_plan lacks numeric '$k'"; fail=1; }
  done
  [ "$(num "$line" n_layers)" = "48" ] || { echo "FAIL: load_plan is not Qwen2.5-14B's 48 layers"; fail=1; }
  a="$(num "$line" compute_idle_naive_ms)"; b="$(num "$line" compute_idle_balanced_ms)"
  awk -v a="$a" -v b="$b" 'BEGIN { exit !(b <= a * (1 + 1e-5) + 1e-9) }' ||
    { echo "FAIL: balanced compute idle $b exceeds naive $a"; fail=1; }
done <<< "$plans"
for k in multihop_us load_plan_us kmeans_ms read_bw_gbps; do
  [ -n "$(num "$timing" "$k")" ] || { echo "FAIL: timing lacks numeric '$k'"; fail=1; }
done
[ $fail -eq 0 ] && echo "bench_segments: ok"
exit $fail

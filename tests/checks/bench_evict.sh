#!/usr/bin/env bash
# Smoke check of `kvmem bench --json --quick evict`: the suite runs and
# prints every documented key with a sane value. Timing values are not
# judged (shared machines); the structural ones are.
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler, $6 sanitizers.
set -u
tool="$4"
if [ -n "${6:-}" ]; then
  echo "skipped: benchmarks are not built with sanitizers ($6)"
  exit 77
fi
if ! "$tool" bench 2>&1 | grep -q '^  evict '; then
  echo "skipped: this kvmem tool was built without benchmarks"
  exit 77
fi
out="$("$tool" bench --json --quick evict)" || { echo "FAIL: kvmem bench --json --quick evict exited $?"; exit 1; }
echo "$out"
fail=0
need() { # $1 case, $2 key
  if ! echo "$out" | grep "\"case\":\"$1\"" | grep -q "\"$2\":"; then
    echo "FAIL: case $1 lacks key $2"
    fail=1
  fi
}
for k in qmem_score_ms snapkv_score_ms ratio qmem_read_gbps snapkv_gflops n_tokens; do need score "$k"; done
for k in evict_positions_per_s compact_positions_per_s n_positions; do need apply "$k"; done
need prefix prefix_slots_shared_after_evict
for k in layout k_dtype qmem_ms_1thread qmem_to_read_bw_1thread snapkv_to_peak_1thread qmem_vs_contiguous snapkv_vs_contiguous; do need layout "$k"; done
# every line is one flat JSON object
if command -v python3 >/dev/null 2>&1; then
  echo "$out" | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
for r in rows:
    assert r["suite"] == "evict", r
    for k, v in r.items():
        assert not isinstance(v, (dict, list)), (k, v)
score = [r for r in rows if r["case"] == "score"]
assert score and all(r["qmem_score_ms"] > 0 and r["snapkv_score_ms"] > 0 for r in score)
assert all(abs(r["ratio"] - r["snapkv_score_ms"] / r["qmem_score_ms"]) < 1e-3 * r["ratio"] for r in score)
dead = [r for r in rows if r["case"] == "prefix" and r["path"] == "dead_slot"]
comp = [r for r in rows if r["case"] == "prefix" and r["path"] == "compact"]
assert dead and dead[0]["prefix_slots_shared_after_evict"] == 1.0, dead
assert comp and comp[0]["prefix_slots_shared_after_evict"] < 0.5, comp
lay = [r for r in rows if r["case"] == "layout"]
assert sorted((r["layout"], r["k_dtype"]) for r in lay) == [("contiguous", "f16"), ("contiguous", "f32"), ("head_major", "f16"), ("head_major", "f32")], lay
assert all(r["qmem_vs_contiguous"] == 1 for r in lay if r["layout"] == "contiguous"), lay
assert all("qmem_f16_over_f32_per_byte" in r for r in lay if r["k_dtype"] == "f16"), lay
' || { echo "FAIL: JSON structure or values"; fail=1; }
fi
exit $fail

#!/usr/bin/env bash
# tinyllm on the real test model: the demo runs in two processes (the second
# reloads the saved agent and must reproduce the logits), and the fidelity
# harness (--quick) prints its table and valid JSON in which full context
# agrees with itself. Skips (77) without the model.
set -euo pipefail
src=$1
bin=$2
model=${KVMEM_TEST_MODEL:-$src/../shared/models/stories260K.bin}
if [ ! -f "$model" ]; then
  echo "skipped: model not found at $model (set KVMEM_TEST_MODEL)"
  exit 77
fi
exe=$bin/examples/tinyllm/tinyllm
if [ ! -x "$exe" ]; then
  echo "skipped: $exe not built"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$exe" demo "$model" --state "$tmp" --phase 1 > "$tmp/p1.txt"
cat "$tmp/p1.txt"
grep -q "turn 4:" "$tmp/p1.txt"
if grep -q "saved the agent" "$tmp/p1.txt"; then
  "$exe" demo "$model" --state "$tmp" --phase 2 | tee "$tmp/p2.txt"
  grep -q "logits identical (max difference 0)" "$tmp/p2.txt"
fi
# sanitizer builds ($6) run one budget: the same code, a fraction of the time
extra=()
if [ -n "${6:-}" ]; then extra=(--budgets 32); fi
"$exe" eval "$model" --quick "${extra[@]}" --json "$tmp/eval.json" --md "$tmp/eval.md"
cat "$tmp/eval.md"
python3 - "$tmp/eval.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {(r["method"], r["budget"]): r for r in d["results"]}
full = rows[("full", 0)]
assert full["top1"] == 1.0 and full["kl"] < 1e-6, full
for r in d["results"]:
    assert 0.0 <= r["top1"] <= 1.0 and r["kl"] >= 0.0, r
    assert r["memory_rows"] <= (r["budget"] or 10**9) + 1e-9, r
print(len(d["results"]), "results; full context agrees with itself")
PY
# bad input: a missing model and an unknown flag fail cleanly
if "$exe" eval /nonexistent/model.bin --quick 2>/dev/null; then exit 1; fi
if "$exe" eval "$model" --bogus 2>/dev/null; then exit 1; fi
echo "tinyllm check passed"

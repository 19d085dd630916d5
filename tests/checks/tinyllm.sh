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
# the story demo: text in and out, in two processes; the last session asks for
# the girl named in session 1, which kvmem's retrieved memory holds
"$exe" demo "$model" --state "$tmp" --phase 1 > "$tmp/p1.txt"
cat "$tmp/p1.txt"
grep -q "^session 4 " "$tmp/p1.txt"
grep -q "saved the agent" "$tmp/p1.txt"
"$exe" demo "$model" --state "$tmp" --phase 2 | tee "$tmp/p2.txt"
grep -q "logits identical to phase 1 (max difference 0)" "$tmp/p2.txt"
grep -q 'retrieved block .*named Su' "$tmp/p2.txt" || { echo "FAIL: the last session did not retrieve session 1"; exit 1; }
grep -q 'continued with kvmem memory: *"Sue' "$tmp/p2.txt" || { echo "FAIL: kvmem's continuation does not name Sue"; exit 1; }
# bad input is refused before any work
if "$exe" demo "$model" --phase 3 2>/dev/null; then echo "FAIL: --phase 3 accepted"; exit 1; fi
if "$exe" demo "$model" --state /nonexistent/dir 2>/dev/null; then echo "FAIL: missing --state dir accepted"; exit 1; fi
# the tour: every method in token ids, also across a restart
"$exe" tour "$model" --state "$tmp" --phase 1 > "$tmp/t1.txt"
cat "$tmp/t1.txt"
grep -q "turn 4:" "$tmp/t1.txt"
if grep -q "saved the agent" "$tmp/t1.txt"; then
  "$exe" tour "$model" --state "$tmp" --phase 2 | tee "$tmp/t2.txt"
  grep -q "logits identical (max difference 0)" "$tmp/t2.txt"
fi
# sanitizer builds ($6) run one budget: the same code, a fraction of the time
extra=()
if [ -n "${6:-}" ]; then extra=(--budgets 32); fi
"$exe" eval "$model" --quick "${extra[@]}" --recall "$src/examples/tinyllm/recall-stories.txt" \
  --json "$tmp/eval.json" --md "$tmp/eval.md" --quiet
cat "$tmp/eval.md"
python3 - "$tmp/eval.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {(r["method"], r["budget"], r["budget_share"]): r for r in d["results"]}
full = rows[("full", 0, 0.0)]
assert full["top1"] == 1.0 and full["kl"] < 1e-6, full
md = d["memdep"]
assert 0 <= md["memdep_positions"] <= md["positions"], md
# on memory-dependent positions full context's next-token log-probability
# beats the window's by at least the threshold, on average too
if md["memdep_positions"]:
    assert md["logprob_full_mean"] - md["logprob_window_mean"] >= md["nats"] - 1e-6, md
assert full["n_memdep"] == md["memdep_positions"] and full["positions"] == md["positions"], full
for r in d["results"]:
    assert 0.0 <= r["top1"] <= 1.0 and r["kl"] >= 0.0, r
    assert r["memory_rows"] <= (r["budget"] or 10**9) + 1e-9, r
    assert r["n_memdep"] == md["memdep_positions"], r
    assert 0.0 <= r["top1_memdep"] <= 1.0 and r["kl_memdep"] >= 0.0, r
    if r["method"].startswith("memart") and r["budget"]:
        assert abs(r["local_rows"] + r["retrieved_rows"] - r["memory_rows"]) < 1e-6, r
rec = d["recall"]
assert rec["cases"] >= 40, rec["cases"]
methods = {r["method"] for r in d["results"]}
assert methods == {r["method"] for r in rec["rows"]}, "every method runs the recall suite"
for r in rec["rows"]:
    assert r["n_cases"] == rec["cases"] and 0.0 <= r["recall_top1"] <= 1.0 and r["recall_rank_mean"] >= 1.0, r
    assert sum(b["n"] for b in r["by_distance"]) == r["n_cases"], r
    assert r["recall_logprob_mean"] <= 0.0, r
print(len(d["results"]), "results; full context agrees with itself;", md["memdep_positions"],
      "memory-dependent positions;", rec["cases"], "recall cases")
PY
# bad input: a missing model and an unknown flag fail cleanly
if "$exe" eval /nonexistent/model.bin --quick 2>/dev/null; then exit 1; fi
if "$exe" eval "$model" --bogus 2>/dev/null; then exit 1; fi
echo "tinyllm check passed"

#!/usr/bin/env bash
# `kvmem demo` runs, and its --json output parses as JSON lines; the
# one-question view (what the browser demo shows, compared there) is
# consistent with itself: top-k by its own scores, contiguous new positions,
# recall from its own sets; bad settings are refused.
set -euo pipefail
tool=$4
"$tool" demo >/dev/null
"$tool" demo --json | python3 -c 'import sys, json; rows=[json.loads(l) for l in sys.stdin if l.strip()]; assert rows, "no output"; print(len(rows), "JSON lines")'
for args in "--agent alice --turn 7 --mode rr-sum --k 8 --block-size 16" "--agent bob --turn 9 --mode softmax-max --k 5 --block-size 32 --tau-s 0.1 --tau-d 0.01"; do
  # shellcheck disable=SC2086
  "$tool" demo --json $args | python3 -c '
import sys, json
v = json.loads(sys.stdin.read())
n, k = v["history_blocks"], v["top_k"]
for key in ("aabb_scores", "exact_scores", "block_topic", "block_first", "block_tokens"):
    assert len(v[key]) == n, key
for sel, sc in (("aabb_selected", "aabb_scores"), ("exact_selected", "exact_scores")):
    s = v[sel]
    assert s == sorted(s) and 0 in s and len(s) == min(k, n), sel
    chosen = [v[sc][b] for b in s if b != 0]
    rest = [v[sc][b] for b in range(1, n) if b not in s]
    assert not rest or min(chosen) >= max(rest), sel + ": not the top by score"
hits = len(set(v["aabb_selected"]) & set(v["exact_selected"]))
assert v["hits"] == hits and abs(v["recall"] - hits / len(v["exact_selected"])) < 1e-4
at = 0
for b, (p0, p1) in zip(v["aabb_selected"], v["new_positions"]):
    assert p0 == at and p1 - p0 + 1 == v["block_tokens"][b]
    at = p1 + 1
assert at == v["memory_tokens"]
a = v["art"]
assert sorted(a["order"]) == list(range(n)) and len(a["scale_change"]) == n and len(a["direction_change"]) == n
assert 0 < a["tiles_visited"] <= a["tiles_total"] and a["streams"] == 2
print("view", v["agent"], v["turn"], v["mode"], "consistent")'
done
if "$tool" demo --json --agent alice --turn 3 2>/dev/null; then echo "turn 3 is not a question: must fail"; exit 1; fi
if "$tool" demo --json --agent alice --turn 7 --mode nearest 2>/dev/null; then echo "unknown mode accepted"; exit 1; fi
"$tool" backends

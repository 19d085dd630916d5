#!/usr/bin/env bash
# bench/peers.py (kvmem against PyTorch on the same work): with numpy and torch
# it runs its small geometry and every row says both sides agree (same blocks,
# outputs within tolerance, files round-trip) with the documented keys; where
# torch is missing it prints one "skipped" line and exits 77, no traceback.
# Timings are not judged here (shared machines).
# Args: SRC BIN LIBKVMEM CLI CC SANITIZE
set -uo pipefail
src=$1 lib=$3 cli=$4 san=${6:-}
if [ -n "$san" ]; then echo "skipped: peers.py loads the plain library into Python (this build: $san)"; exit 77; fi
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import numpy, torch' 2>/dev/null; then py=$p; break; fi
done
err=$(mktemp)
trap 'rm -f "$err"' EXIT
if [ -z "$py" ]; then
  command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
  out=$(KVMEM_LIBRARY="$lib" python3 "$src/bench/peers.py" --quick 2>"$err"); rc=$?
  echo "$out"
  [ "$rc" = 77 ] || { echo "FAIL: without torch: exit $rc, expected 77"; exit 1; }
  grep -q '"skipped"' <<<"$out" || { echo "FAIL: no skipped line"; exit 1; }
  grep -q Traceback "$err" && { echo "FAIL: traceback: $(cat "$err")"; exit 1; }
  echo "skipped: numpy and torch are not installed for any python3 here (the skip path itself checked: $(cat "$err"))"
  exit 77
fi
out=$(KVMEM_LIBRARY="$lib" KVMEM_CLI="$cli" "$py" "$src/bench/peers.py" --quick --threads 1 --rounds 1 2>"$err"); rc=$?
[ "$rc" = 0 ] || { echo "FAIL: peers.py exited $rc: $(cat "$err")"; echo "$out"; exit 1; }
printf '%s\n' "$out" | "$py" -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin if l.strip()]
head, rows = rows[0], rows[1:]
assert head.get("blas"), head
ops = {r["op"] for r in rows}
want = {"aabb_select", "exact_select", "attend", "snapkv_score", "rule_score", "save", "load"}
assert want <= ops, "missing rows: %s" % (want - ops)
for r in rows:
    for k in ("kvmem_ms", "peer_ms", "ratio", "limit", "kvmem_share", "peer_share", "match", "check", "blas", "layout", "threads",
              "peer_blas_threads"):
        assert k in r, "row lacks %s: %s" % (k, r)
    assert r["match"] is True, "the two sides disagree: %s" % r
    assert r["kvmem_ms"] > 0 and r["peer_ms"] > 0, r
    # a BLAS with its own threads runs the peer on the thread count of the row
    if r["peer_blas_threads"] is not None:
        assert r["peer_blas_threads"] == r["threads"], "the peer BLAS ran %s threads in a %d-thread row: %s" % (
            r["peer_blas_threads"], r["threads"], r)
layouts = {(r["op"], r["layout"]) for r in rows}
for op in ("attend", "snapkv_score", "rule_score", "aabb_select"):
    assert (op, "contiguous") in layouts and (op, "head_major") in layouts, op
print("peers smoke: %d rows, both sides agree on every one" % len(rows))
' || { echo "$out"; exit 1; }

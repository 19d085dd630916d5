#!/usr/bin/env bash
# tinyllm eval --beyond on stories15M, two short cases of the project's suite
# (the name in the first session; one unrelated session before it): every
# method's window fits the model's 256 tokens with the cue and the name; the
# tokens each method ran through the model add up (MemArt: the probe and the
# cue; text: BOS + chunks + live text + cue; eviction: the cue); MemArt's
# blocks are distinct whole blocks from the history within its memory share,
# and its selection holds a block naming the character (with the name in the
# first session, the block of its first mention); the name is
# top-1 when the introduction fits the window (the control) and ranks better
# with the name's block before the live context than in the recent window.
# Skips (77) without stories15M.
set -euo pipefail
src=$1
bin=$2
dir=${KVMEM_TEST_MODELS:-$src/../shared/models}
model=$dir/stories15M.bin
tok=$dir/tokenizer.bin
for f in "$model" "$tok"; do
  if [ ! -f "$f" ]; then
    echo "skipped: $f not found (set KVMEM_TEST_MODELS to the folder with stories15M.bin and tokenizer.bin)"
    exit 77
  fi
done
exe=$bin/examples/tinyllm/tinyllm
if [ ! -x "$exe" ]; then
  echo "skipped: $exe not built"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$exe" eval "$model" --tokenizer "$tok" --beyond "$src/examples/tinyllm/beyond-stories.txt" --quick \
  --recall-cases 2 --threads 2 --place score,bos,0.25 --json "$tmp/b.json" --md "$tmp/b.md" --quiet
python3 - "$tmp/b.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
W, B = d["window"], d["block"]
assert W == 256 and d["cases"] == 2, (W, d["cases"])
cases = d["cases_detail"]
assert [c["before"] > 0 for c in cases] == [False, True], "one case per group"
P = {c["prompt"] for c in cases}
R = max(c["prompt"] + c["name_tokens"] for c in cases)
assert len(P) == 1, P  # one cue length: per-method means are exact sums
P = P.pop()
for c in cases:
    assert c["history"] > W and c["distance"] > W, c  # the name is out of the window's reach
    assert c["name_block"] == c["name_at"] // B, c
by = {}
for m in d["methods"]:
    by.setdefault((m["name"], m["mem_frac"]), m)
    if m["kind"] != "full_past":
        assert m["memory_rows_mean"] + m["live_rows_mean"] + R <= W, m
    if m["kind"] == "memart" and m["group"] != "restart":
        assert m["prefill_mean"] == 2 * P, m  # the probe and the cue, nothing re-prefilled
    elif m["kind"] in ("bm25", "recent_text", "control_intro", "control_window"):
        assert m["prefill_mean"] == m["memory_rows_mean"] + m["live_rows_mean"] + P, m
    elif m["kind"] in ("recent", "streamingllm", "h2o", "snapkv", "intentkv", "full_past"):
        assert m["prefill_mean"] == P, m
for c in cases:
    for w in ("deployed", "default"):
        s = c[w]
        bl = s["blocks"]
        assert len(set(bl)) == len(bl) and all(0 <= b < c["history"] // B for b in bl), (c["id"], w, bl)
        assert len(bl) * B == s["memory_rows"] and s["memory_rows"] <= W // 4, (c["id"], w, s)
        assert s["prefill"] == 2 * P, s
        # the retrieval finds the introduction: a block naming the character is in the window, and with
        # the name in the first session, the very block of its first mention
        assert s["selected"] == 1, (c["id"], w, s)
        if c["before"] == 0:
            assert c["name_block"] in bl, (c["id"], w, c["name_block"], bl)
    assert c["default"]["live_rows"] == W // 4, c  # --place ...,0.25
ctrl = next(m for m in d["methods"] if m["kind"] == "control_intro")
assert ctrl["top1"] == 1.0, ctrl
recent = next(m for m in d["methods"] if m["kind"] == "recent")
near = by[("oracle block before the live context", 0.25)]
assert near["rank_mean"] < recent["rank_mean"], (near["rank_mean"], recent["rank_mean"])
tables = d["tables"]
assert tables and tables[0]["mem_frac"] == 0.25
rows = {r["name"]: r for r in tables[0]["rows"]}
for name, r in rows.items():
    m = by.get((name, 0.25)) or by[(name, 0)]
    assert r["top1"] == m["top1"] and r["prefill_mean"] == round(m["prefill_mean"], 1), (r, m)
print("stories15M beyond the window: %d methods, accounting and MemArt's selection hold on %d cases"
      % (len(d["methods"]), len(cases)))
PY

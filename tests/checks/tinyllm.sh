#!/usr/bin/env bash
# tinyllm on the real test model: text in, text out (greedy from BOS prints
# English, a prompt's continuation agrees with its ids, the tokenizer agrees
# with a plain Python encoder written here on random strings); the CLI refuses
# bad arguments up front, naming them (issue 17); the demo runs in two
# processes (the second reloads the saved agent and must reproduce the
# logits), and the fidelity harness (--quick) prints its table and valid JSON
# in which full context agrees with itself. Skips (77) without the model.
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

# ---- bad arguments: refused before any work, with the argument named ----
fails=0
# expect_refused WHAT NEEDLE -- COMMAND...: COMMAND exits non-zero, prints nothing on
# stdout, and says NEEDLE on stderr
expect_refused() {
  local what=$1 needle=$2
  shift 3
  local rc=0
  "$@" > "$tmp/out.txt" 2> "$tmp/err.txt" || rc=$?
  if [ "$rc" -eq 0 ] || [ -s "$tmp/out.txt" ] || ! grep -qF -- "$needle" "$tmp/err.txt"; then
    echo "FAIL: $what: exit $rc, stdout $(wc -c < "$tmp/out.txt") bytes, stderr: $(head -c 300 "$tmp/err.txt")"
    fails=$((fails + 1))
  else
    echo "ok: $what: $(head -n 1 "$tmp/err.txt")"
  fi
}
# a safetensors file given as the model (a kvmem agent's memory is one)
python3 - "$tmp/agent.safetensors" <<'PY'
import json, struct, sys
h = json.dumps({"__metadata__": {"format": "kvmem"}, "k": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<4f", 1, 2, 3, 4))
PY
expect_refused "demo --phase 3" "--phase '3'" -- "$exe" demo "$model" --phase 3 --state "$tmp"
expect_refused "demo --state at a missing directory (up front)" "--state '$tmp/none': No such file" -- \
  "$exe" demo "$model" --state "$tmp/none" --phase 1
expect_refused "demo --state at a file" "not a directory" -- "$exe" demo "$model" --state "$model"
expect_refused "demo without a model" "MODEL is missing" -- "$exe" demo --phase 1
expect_refused "a missing model says why" "No such file or directory" -- "$exe" generate "$tmp/nope.bin" --ids
expect_refused "demo: a missing model says why" "No such file or directory" -- \
  "$exe" demo "$tmp/nope.bin" --state "$tmp" --phase 1
expect_refused "a directory as the model" "directory" -- "$exe" generate "$tmp" --ids
expect_refused "a safetensors file as the model" "not a llama2.c or GGUF file" -- \
  "$exe" generate "$tmp/agent.safetensors" --ids
expect_refused "demo on a safetensors file" "not a llama2.c or GGUF file" -- \
  "$exe" demo "$tmp/agent.safetensors" --state "$tmp" --phase 1
expect_refused "generate -n 0" "-n '0'" -- "$exe" generate "$model" -n 0
expect_refused "generate -n abc" "-n 'abc'" -- "$exe" generate "$model" -n abc
expect_refused "generate -n past the context" "-n 100000" -- "$exe" generate "$model" -n 100000
expect_refused "generate --seed -1" "--seed '-1'" -- "$exe" generate "$model" --seed -1
expect_refused "generate --seed 2^64" "--seed '18446744073709551616'" -- \
  "$exe" generate "$model" --seed 18446744073709551616
expect_refused "generate --temp nan" "--temp 'nan'" -- "$exe" generate "$model" --temp nan
expect_refused "generate --temp -1" "--temp '-1'" -- "$exe" generate "$model" --temp -1
expect_refused "generate --temp 0.5x" "--temp '0.5x'" -- "$exe" generate "$model" --temp 0.5x
expect_refused "generate --bogus" "unknown option --bogus" -- "$exe" generate "$model" --bogus
expect_refused "generate --prompt without a value" "--prompt needs a value" -- "$exe" generate "$model" --prompt
expect_refused "generate with two models" "unexpected argument" -- "$exe" generate "$model" "$model" --ids
expect_refused "generate --tokenizer that is not one" "--tokenizer: $model: token" -- \
  "$exe" generate "$model" --tokenizer "$model" --prompt hi
expect_refused "a prompt longer than -n" "leaves no room" -- \
  "$exe" generate "$model" -n 4 --prompt "Once upon a time there was a girl"
mkdir "$tmp/alone"
cp "$model" "$tmp/alone/model.bin"
expect_refused "text without a tokenizer" "no tokenizer" -- \
  env KVMEM_TEST_TOKENIZER= "$exe" generate "$tmp/alone/model.bin" -n 8
# ids need none
env KVMEM_TEST_TOKENIZER= "$exe" generate "$tmp/alone/model.bin" -n 8 --ids > /dev/null
if [ "$fails" -ne 0 ]; then
  echo "$fails bad-argument checks failed"
  exit 1
fi

# ---- text in, text out ----
tok=${KVMEM_TEST_TOKENIZER:-$(dirname "$model")/tok512.bin}
if [ -f "$tok" ]; then
  # greedy from BOS on the canonical model is English; the same detector calls
  # decoded random ids noise (so it can fail)
  "$exe" generate "$model" --temp 0 -n 160 --tokenizer "$tok" > "$tmp/greedy.txt"
  "$exe" generate "$model" --temp 0 -n 160 > "$tmp/greedy2.txt" # tok512.bin found beside the model
  cmp "$tmp/greedy.txt" "$tmp/greedy2.txt"
  python3 -c 'import random; r = random.Random(5); print(" ".join(str(r.randrange(3, 512)) for _ in range(160)))' |
    "$exe" tokenize "$model" --tokenizer "$tok" --decode > "$tmp/noise.txt"
  python3 - "$tmp/greedy.txt" "$tmp/noise.txt" <<'PY'
import re, sys
def english(b):
    text = b.decode("utf-8", "replace")
    words = text.split()
    plain = [w for w in words if re.fullmatch(r"[\"'(]*[A-Za-z]+(?:'[A-Za-z]+)?[.,!?;:\"')]*", w)]
    ascii_ok = sum(1 for c in b if 32 <= c < 127 or c in (9, 10)) / max(1, len(b))
    common = {"the", "a", "was", "to", "and", "she", "he", "her", "his", "it", "in", "day"}
    hits = len(common & {w.strip(".,!?\"'").lower() for w in plain})
    return len(words) >= 30 and len(plain) / len(words) >= 0.9 and ascii_ok >= 0.98 and hits >= 4, \
        (len(words), round(len(plain) / max(1, len(words)), 3), round(ascii_ok, 3), hits)
good = open(sys.argv[1], "rb").read()
noise = open(sys.argv[2], "rb").read()
ok, stats = english(good)
print("greedy from BOS:", good[:160].decode("utf-8", "replace").replace("\n", " "), "...")
print("  words, plain-word ratio, ASCII ratio, common words:", stats)
assert ok, "greedy output is not English"
ok, stats = english(noise)
print("  decoded random ids:", stats)
assert not ok, "the English detector accepted random tokens"
PY
  # a prompt's continuation: the text printed is the decoding of the ids generated after it
  prompt='Once upon a time, there was a boy named Tim. He had a red ball.'
  "$exe" generate "$model" --prompt "$prompt" -n 100 --temp 0.8 --seed 7 > "$tmp/cont.txt"
  "$exe" generate "$model" --prompt "$prompt" -n 100 --temp 0.8 --seed 7 --ids > "$tmp/cont.ids"
  "$exe" tokenize "$model" "$prompt" > "$tmp/prompt.ids"
  "$exe" tokenize "$model" --decode < "$tmp/cont.ids" > "$tmp/all.txt"
  python3 - "$tmp/cont.txt" "$tmp/cont.ids" "$tmp/prompt.ids" "$tmp/all.txt" "$prompt" <<'PY'
import sys
cont, ids, pids, alltext = (open(p, "rb").read() for p in sys.argv[1:5])
prompt = sys.argv[5].encode()
ids, pids = ids.split(), pids.split()
assert ids[:len(pids)] == pids, "the ids do not begin with the prompt's"
assert len(ids) == 100, len(ids)
assert alltext.startswith(prompt), "decoding the ids does not give the prompt back"
gen = cont.rstrip(b"\n")
assert len(gen) > 20 and alltext[len(prompt):].startswith(gen), (gen[:80], alltext[len(prompt):][:80])
print("prompt continuation:", gen[:120].decode("utf-8", "replace").replace("\n", " "), "...")
PY
  # the tokenizer against a plain Python encoder (run.c's algorithm: the best-scoring
  # pair by rescanning, pieces looked up by their text in the whole vocabulary)
  n_strings=150
  if [ -n "${6:-}" ]; then n_strings=40; fi
  python3 - "$exe" "$model" "$tok" "$n_strings" <<'PY'
import random, struct, subprocess, sys
exe, model, tok, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
d = open(tok, "rb").read()
pieces, scores, o = [], [], 4
while o < len(d):
    s, n = struct.unpack_from("<fi", d, o)
    pieces.append(d[o + 8:o + 8 + n]); scores.append(s); o += 8 + n
index = {}
for i, p in enumerate(pieces):
    index.setdefault(p, i)

def chars(b):  # valid UTF-8 characters; any other byte alone
    i, out = 0, []
    while i < len(b):
        k = next((k for k in (1, 2, 3, 4) if b[i:i + k].decode("utf-8", "ignore") and
                  len(b[i:i + k].decode("utf-8", "ignore").encode()) == k), 1)
        out.append(b[i:i + k]); i += k
    return out

def encode(text):
    ids = []
    for c in chars(b" " + text if text else b""):
        ids.extend([index[c]] if c in index else [3 + x for x in c])
    while True:
        best = at = None
        for i in range(len(ids) - 1):
            j = index.get(pieces[ids[i]] + pieces[ids[i + 1]])
            if j is not None and (best is None or scores[j] > scores[best]):
                best, at = j, i
        if best is None:
            return [1] + ids
        ids[at:at + 2] = [best]

fixed = [b"Once upon a time, there was a little girl named Lily.", b"",
         "naïve café — 中文 😀".encode(), b"\x01\x7f\xff bad \xc3(", b"  two  spaces\n"]
rng = random.Random(11)
words = "Once upon a time there was little girl named Lily She loved to play park the was Tim".split()
alpha = [b" ", b"  ", b"\n", b"\t", b"\x00", b"\x7f", "é".encode(), "中".encode(), "😀".encode(), "™".encode(),
         b"\x80", b"\xc3", b"\xff", b"\xe2\x82", b"<0x41>", b"<s>", b".", b",", b"\"", b"!"]
cases = fixed + [b"".join(rng.choice(words).encode() if rng.random() < 0.6 else rng.choice(alpha)
                          for _ in range(rng.randrange(0, 25))) for _ in range(count)]
bad = 0
for t in cases:
    want = encode(t)
    out = subprocess.run([exe, "tokenize", model, "--tokenizer", tok], input=t, capture_output=True, check=True)
    got = [int(x) for x in out.stdout.split()]
    back = subprocess.run([exe, "tokenize", model, "--tokenizer", tok, "--decode"], input=out.stdout,
                          capture_output=True, check=True).stdout
    if got != want or back != t:
        bad += 1
        print("MISMATCH", t, "python", want, "tinyllm", got, "decoded", back)
print(len(cases), "strings: tinyllm's ids equal the Python encoder's and decode back;", bad, "differ")
assert bad == 0
PY
else
  echo "note: no tokenizer at $tok: the text checks are skipped"
fi
# the story demo, in two processes: the sessions go in, the second process
# reloads the agent and gets phase 1's logits, and shows the last session
# continued on each of the four contexts (its claims on stories15M:
# tests/checks/demo_story.sh)
if [ -f "$tok" ]; then
"$exe" demo "$model" --state "$tmp" --phase 1 > "$tmp/p1.txt"
cat "$tmp/p1.txt"
grep -q "^  session 16, " "$tmp/p1.txt"
grep -q "saved the agent" "$tmp/p1.txt"
"$exe" demo "$model" --state "$tmp" --phase 2 | tee "$tmp/p2.txt"
grep -q "logits identical to phase 1 (max difference 0)" "$tmp/p2.txt"
grep -q '^    block ' "$tmp/p2.txt" || { echo "FAIL: the last session retrieved no block"; exit 1; }
[ "$(grep -c "^    \(kvmem's memory\|text RAG\|the recent\|the whole history\) .*\"" "$tmp/p2.txt")" -eq 4 ] ||
  { echo "FAIL: the last session is not continued on the four contexts"; exit 1; }
fi
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
min_cases=40
if [ -n "${6:-}" ]; then extra=(--budgets 32 --turns 3 --recall-cases 6); min_cases=6; fi
recall=()
if [ -f "$tok" ]; then recall=(--recall "$src/examples/tinyllm/recall-stories.txt" --tokenizer "$tok"); fi
"$exe" eval "$model" --quick "${extra[@]}" ${recall[@]+"${recall[@]}"} \
  --json "$tmp/eval.json" --md "$tmp/eval.md" --quiet
cat "$tmp/eval.md"
python3 - "$tmp/eval.json" "$min_cases" <<'PY'
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
rec = d.get("recall")
if rec is None:
    print("note: no tokenizer, the recall suite was not run"); sys.exit(0)
assert rec["cases"] >= int(sys.argv[2]), rec["cases"]
methods = {r["method"] for r in d["results"]}
assert methods == {r["method"] for r in rec["rows"]}, "every method runs the recall suite"
for r in rec["rows"]:
    assert r["n_cases"] == rec["cases"] and 0.0 <= r["recall_top1"] <= 1.0 and r["recall_rank_mean"] >= 1.0, r
    assert sum(b["n"] for b in r["by_distance"]) == r["n_cases"], r
    assert r["recall_logprob_mean"] <= 0.0, r
print(len(d["results"]), "results; full context agrees with itself;", md["memdep_positions"],
      "memory-dependent positions;", rec["cases"], "recall cases")
PY
# the beyond-the-window harness (--quick: the first cases, memory 25%): every
# method in the same window, the reports consistent with what each method ran
if [ -f "$tok" ]; then
  bcases=2
  if [ -n "${6:-}" ]; then bcases=1; fi
  "$exe" eval "$model" --tokenizer "$tok" --beyond "$src/examples/tinyllm/beyond-stories.txt" --quick \
    --recall-cases "$bcases" --json "$tmp/beyond.json" --md "$tmp/beyond.md" --quiet
  head -n 40 "$tmp/beyond.md"
  python3 - "$tmp/beyond.json" "$bcases" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
W, cases = d["window"], int(sys.argv[2])
assert d["cases"] == cases, d["cases"]
assert d["history_tokens"]["min"] > W, "the histories run past the window"
kinds = {m["kind"] for m in d["methods"]}
for k in ("recent", "streamingllm", "h2o", "snapkv", "intentkv", "full_past", "recent_text", "memart", "bm25",
          "control_intro", "control_window"):
    assert k in kinds, k
oracles = {(m["kind"], m["oracle"]) for m in d["methods"]}
for o in ("only", "in_set", "near"):
    assert ("memart", o) in oracles and ("bm25", o) in oracles, o
for m in d["methods"]:
    assert m["n"] == cases and 0 <= m["top1"] <= 1 and m["rank_mean"] >= 1 and m["logprob_mean"] <= 0, m
    assert sum(b["n"] for b in m["by_distance"]) == cases, m
    assert m["n_first"] + m["n_before"] == cases, m
    if m["kind"] == "full_past":
        assert m["memory_rows_mean"] > W, m  # told to run past the window
        continue
    # every other method stays inside the window: memory + live context + the cue
    assert m["memory_rows_mean"] + m["live_rows_mean"] <= W, m
    if m["kind"] == "memart":
        if m["oracle"] == "none" and m["top_k"] == 0:
            assert m["memory_rows_mean"] <= m["mem_frac"] * W + (1 if m["sink"] == "bos" else 0), m
        if m["oracle"] != "none":
            assert m["selected"] == 1.0, m  # the oracle's block is in the window
    if m["kind"] == "bm25" and m["oracle"] != "none":
        assert m["selected"] == 1.0, m
    if m["kind"] in ("bm25", "recent_text"):
        assert m["prefill_mean"] >= m["memory_rows_mean"] + m["live_rows_mean"], m  # text is re-prefilled
print(len(d["methods"]), "methods on", cases, "beyond-window cases; every one inside the window but the one told not to")
PY
fi
# bad input: a missing model and an unknown flag fail cleanly
if "$exe" eval /nonexistent/model.bin --quick 2>/dev/null; then exit 1; fi
if "$exe" eval "$model" --bogus 2>/dev/null; then exit 1; fi
echo "tinyllm check passed"

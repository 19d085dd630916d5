#!/usr/bin/env bash
# make demo's story (scripts/demo.sh, `tinyllm demo`) on stories15M, whose
# window is 256 tokens: phase 1 reads a story of 16 sessions, several
# windows long, into a kvmem agent and saves it; phase 2, a new process,
# loads it (the next prompt's logits equal phase 1's) and continues the last
# session, whose next word in a TinyStories story is the girl named in
# session 1. What the demo claims, read from its output: the history is
# more than three windows long; kvmem's retrieved blocks hold session 1's
# "named Sue" and its continuation begins with her name; the recent window
# and the whole history (past the window) never say it; text RAG's chunks
# are not session 1's and its continuation does not begin with her name;
# each context's token count adds up from its parts. The model comes from
# ../shared/models, else the fetch script's cache (never downloaded here:
# make demo fetches it); skipped without either.
set -euo pipefail
src=$1
bin=$2
if [ -n "${6:-}" ]; then
  echo "skipped: the same code runs on stories260K in the tinyllm check under the sanitizers"
  exit 77
fi
exe=$bin/examples/tinyllm/tinyllm
models=$(dirname "${KVMEM_TEST_MODEL:-$src/../shared/models/stories260K.bin}")
if [ ! -f "$models/stories15M.bin" ] || [ ! -f "$models/tokenizer.bin" ]; then
  models=$(python3 "$src/scripts/fetch-model.py" --check 2>/dev/null) || {
    echo "skipped: no stories15M.bin and tokenizer.bin in $models or in the fetch script's cache (make demo fetches them)"
    exit 77
  }
fi
[ -x "$exe" ] || { echo "skipped: $exe not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVMEM_BUILD_DIR=$bin DEMO_MODEL=$models/stories15M.bin DEMO_TOKENIZER=$models/tokenizer.bin \
  bash "$src/scripts/demo.sh" > "$tmp/out.txt"
cat "$tmp/out.txt"
python3 - "$tmp/out.txt" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
def one(pattern, what):
    m = re.search(pattern, out, re.M)
    assert m, f"not in the demo's output: {what} ({pattern})"
    return m
sessions = re.findall(r"^  session +(\d+), +(\d+) tokens \(history +(\d+),", out, re.M)
assert [int(s[0]) for s in sessions] == list(range(1, 17)), sessions
first_len = int(sessions[0][1])
assert all(int(b[2]) == int(a[2]) + int(b[1]) for a, b in zip(sessions, sessions[1:])), "histories add up"
history = int(one(r"^saved the agent \((\d+) tokens", "the saved agent").group(1))
assert history == int(sessions[-1][2]) and history > 3 * 256, history
one(r"a new process loaded the agent 'story-agent' \(%d tokens\)" % history, "phase 2 loads phase 1's agent")
one(r"logits identical to phase 1 \(max difference 0\)", "the reloaded agent gives phase 1's logits")
blocks = re.findall(r'^    block +\d+  tokens +(\d+)-(\d+) +"(.*)"$', out, re.M)
assert blocks and any("named Sue" in t and int(a) < first_len for a, b, t in blocks), blocks
chunks = [(int(a), int(b)) for a, b in re.findall(r'^ {15}tokens +(\d+)-(\d+) +"', out, re.M)]
assert chunks and all(a >= first_len for a, b in chunks), f"text RAG's chunks {chunks}"
live = int(one(r"^  both end with the live context, the newest (\d+) tokens", "the live context").group(1))
rows = {k: one(r"^    %s +(\d+): [^\"]*(\".*\")$" % k, k) for k in
        ("kvmem's memory", "text RAG", r"the recent +\d+ tokens", "the whole history")}
cont = {k: m.group(2) for k, m in rows.items()}
n = {k: int(m.group(1)) for k, m in rows.items()}
assert re.match(r'" Sue\b', cont["kvmem's memory"]), cont
for k in (r"the recent +\d+ tokens", "the whole history"):
    assert "Sue" not in cont[k], (k, cont[k])
assert not re.match(r'" Sue\b', cont["text RAG"]), cont
np_ = n[r"the recent +\d+ tokens"]
assert n["kvmem's memory"] == 2 * np_ and n["the whole history"] == np_, n
assert n["text RAG"] == 1 + sum(b - a + 1 for a, b in chunks) + live + np_, (n, chunks, live)
print(f"demo check: {history} tokens of history; kvmem names Sue from blocks {[int(a) // 16 for a, b, t in blocks]}, "
      f"text RAG ({n['text RAG']} tokens), the recent window and the whole history do not")
PY

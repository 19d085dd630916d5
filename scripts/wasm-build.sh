#!/usr/bin/env bash
# Builds the WebAssembly module, the JavaScript API and the demo page into
# build/wasm/www (Emscripten; not part of the native build), and puts the
# real model beside the page (www/models/) when there is one:
# $KVMEM_TEST_MODEL, else ../shared/models/stories260K.bin; its tokenizer
# $KVMEM_TEST_TOKENIZER, else tok512.bin beside the model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v emcmake >/dev/null; then
  echo "emcmake not found: install emscripten (scripts/install-deps.sh)" >&2
  exit 77
fi
# Debian's emcc runs acorn through node and finds it only here.
export NODE_PATH=${NODE_PATH:-/usr/share/nodejs}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
emcmake cmake -S "$root/wasm" -B "$root/build/wasm" >/dev/null
cmake --build "$root/build/wasm" -j "$jobs"
www=$root/build/wasm/www
rm -rf "$www/models"
model=${KVMEM_TEST_MODEL:-$root/../shared/models/stories260K.bin}
if [ -f "$model" ]; then
  tok=${KVMEM_TEST_TOKENIZER:-$(dirname "$model")/tok512.bin}
  mkdir -p "$www/models"
  cp "$model" "$www/models/"
  tok_json=null
  if [ -f "$tok" ]; then
    cp "$tok" "$www/models/"
    tok_json="\"$(basename "$tok")\""
  fi
  printf '{"name":"%s","model":"%s","tokenizer":%s}\n' "$(basename "$model")" "$(basename "$model")" "$tok_json" \
    > "$www/models/models.json"
  echo "wasm: the page serves the model $(basename "$model") (tokenizer: $tok_json) from www/models/"
else
  echo "wasm: no model at $model (set KVMEM_TEST_MODEL): the page's real-model mode asks for files"
fi
echo "wasm: $(du -b "$root/build/wasm/www/kvmem_wasm.wasm" | cut -f1) bytes, $(gzip -9c "$root/build/wasm/www/kvmem_wasm.wasm" | wc -c) gzipped -> build/wasm/www"

#!/usr/bin/env bash
# Builds the WebAssembly module, the JavaScript API and the demo page into
# build/wasm/www (Emscripten; not part of the native build).
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
echo "wasm: $(du -b "$root/build/wasm/www/kvmem_wasm.wasm" | cut -f1) bytes, $(gzip -9c "$root/build/wasm/www/kvmem_wasm.wasm" | wc -c) gzipped -> build/wasm/www"

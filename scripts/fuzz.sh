#!/usr/bin/env bash
# Build and run the libFuzzer harness over the strict safetensors reader, the
# JSON reader and the agent-file loader (tests/fuzz: CMake's `fuzz` preset,
# clang with -fsanitize=fuzzer-no-link,address,undefined, built in parallel),
# starting from a seed corpus of valid files generated now.
# Usage: scripts/fuzz.sh [SECONDS] (default 60).
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/fuzz"
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cc=""
for c in clang-14 clang; do command -v "$c" >/dev/null && { cc=$(command -v "$c"); break; }; done
if [ -z "$cc" ]; then echo "fuzz: skipped: no clang/libFuzzer"; exit 0; fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe/probe.c"
if ! "$cc" -fsanitize=fuzzer "$probe/probe.c" -o "$probe/probe" 2>/dev/null; then
  echo "fuzz: skipped: no clang/libFuzzer ($cc cannot link -fsanitize=fuzzer)"; exit 0
fi
echo "fuzz: building with $cc (cmake --preset fuzz)"
cd "$root"
cmake --preset fuzz -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build --preset fuzz -j "$jobs"
rm -rf "$out/seeds" "$out/corpus"
mkdir -p "$out/seeds" "$out/corpus"
"$out/tests/fuzz/fuzz_seeds" "$out/seeds"
echo "fuzz: $(ls "$out/seeds" | wc -l) seeds; running for ${secs}s"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$out/tests/fuzz/fuzz_loader" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus" "$out/seeds" 2>&1 | tail -25
echo "fuzz: no crash in ${secs}s"

#!/usr/bin/env bash
# Build and run the libFuzzer harness over the strict safetensors reader, the
# JSON reader and the agent-file loader (clang with
# -fsanitize=fuzzer,address,undefined), starting from a seed
# corpus of valid files generated now. Usage: scripts/fuzz.sh [SECONDS] (default 60).
set -euo pipefail
secs=${1:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/build/fuzz"
cc=""
for c in clang-14 clang; do command -v "$c" >/dev/null && { cc=$c; break; }; done
if [ -z "$cc" ]; then echo "fuzz: skipped: no clang/libFuzzer"; exit 0; fi
mkdir -p "$out"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$out/probe.c"
if ! "$cc" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" 2>/dev/null; then
  echo "fuzz: skipped: no clang/libFuzzer ($cc cannot link -fsanitize=fuzzer)"; exit 0
fi
# KVMEM_EXPERIMENTAL: the core defines the experimental section too (as core/CMakeLists.txt)
common=(-std=c11 -g -O1 -D_POSIX_C_SOURCE=200809L -DKVMEM_EXPERIMENTAL -I"$root/include" -I"$root/core" -I"$root/tests/fuzz"
        -fno-omit-frame-pointer)
core=()
simd=()
for f in "$root"/core/*.c "$root"/core/*/*.c "$root"/core/*/*/*/*.c; do
  # *_wasm128.c: WebAssembly SIMD, only for the Emscripten build (as in core/CMakeLists.txt)
  case "$f" in *_wasm128.c) ;; *_avx2.c|*_avx512.c) simd+=("$f");; *) core+=("$f");; esac
done
arch=()
if [ "$(uname -m)" = x86_64 ]; then arch=(-DKVMEM_HAVE_AVX2 -DKVMEM_HAVE_AVX512); fi
objs=()
build_objs() { # $1 = tag, rest = flags
  local tag=$1; shift
  objs=()
  mkdir -p "$out/$tag"
  for f in "${core[@]}"; do
    o="$out/$tag/$(echo "${f#$root/}" | tr / _).o"
    "$cc" "${common[@]}" "${arch[@]}" "$@" -c "$f" -o "$o"; objs+=("$o")
  done
  if [ ${#arch[@]} -gt 0 ]; then
    for f in "${simd[@]}"; do
      o="$out/$tag/$(echo "${f#$root/}" | tr / _).o"
      case "$f" in *_avx2.c) fl=(-mavx2 -mfma -mf16c);; *) fl=(-mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c);; esac
      "$cc" "${common[@]}" "${arch[@]}" "$@" "${fl[@]}" -c "$f" -o "$o"; objs+=("$o")
    done
  fi
}
echo "fuzz: building with $cc"
build_objs seedgen -fsanitize=address
"$cc" "${common[@]}" -fsanitize=address "$root/tests/fuzz/fuzz_seeds.c" "${objs[@]}" -lm -lpthread -o "$out/fuzz_seeds"
build_objs harness -fsanitize=fuzzer-no-link,address,undefined
"$cc" "${common[@]}" -fsanitize=fuzzer,address,undefined "$root/tests/fuzz/fuzz_loader.c" "${objs[@]}" -lm -lpthread \
  -o "$out/fuzz_loader"
rm -rf "$out/seeds" "$out/corpus"
mkdir -p "$out/seeds" "$out/corpus"
"$out/fuzz_seeds" "$out/seeds"
echo "fuzz: $(ls "$out/seeds" | wc -l) seeds; running for ${secs}s"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  "$out/fuzz_loader" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$out/" -print_final_stats=1 "$out/corpus" "$out/seeds" 2>&1 | tail -25
echo "fuzz: no crash in ${secs}s"

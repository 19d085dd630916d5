#!/usr/bin/env bash
# tests/checks/include_graph.sh catches what it is there to catch: run on a
# copy of core/ (and stores/, include/) with one rule broken on purpose, it
# fails and names the break; run on the untouched copy it passes. The
# breaks: a circle among core's folders (the CPU kernels' header includes
# the pool's, which includes them), a SIMD kernel file outside core/cpu, a
# second ISA dispatcher, and a persistence room that reaches the pool.
# Args: SOURCE_DIR (the others of tests/CMakeLists.txt are ignored).
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
check="$src/tests/checks/include_graph.sh"
tmp=$(mktemp -d /tmp/kvmem-graph-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

fresh() { # a clean copy of the tree the check reads
  rm -rf "$tmp/t"
  mkdir -p "$tmp/t"
  cp -r "$src/core" "$src/include" "$tmp/t/"
  [ -d "$src/stores" ] && cp -r "$src/stores" "$tmp/t/"
}

# expect NAME PATTERN: the check fails on the copy, printing PATTERN
expect() {
  local out
  out=$(bash "$check" "$tmp/t" 2>&1)
  local rc=$?
  if [ $rc -eq 0 ]; then
    echo "FAIL: $1: the check passed"
    fail=1
  elif ! grep -q -- "$2" <<<"$out"; then
    echo "FAIL: $1: the check failed without saying '$2':"
    echo "$out" | sed 's/^/  | /'
    fail=1
  else
    echo "ok: $1: $(grep -m1 -- "$2" <<<"$out")"
  fi
}

fresh
if ! out=$(bash "$check" "$tmp/t" 2>&1); then
  echo "FAIL: the untouched copy does not pass:"
  echo "$out" | sed 's/^/  | /'
  exit 1
fi

# a folder circle: the kernels' header reaches the pool, which includes the CPU's headers
fresh
sed -i '0,/^#include "/s//#include "..\/pool\/pool.h"\n#include "/' "$tmp/t/core/cpu/kernels.h"
expect "core/cpu includes core/pool" "a circle among core folders.*core/cpu/kernels.h includes core/pool/pool.h"

# a SIMD kernel outside core/cpu
fresh
printf '#include <immintrin.h>\nvoid kvm_x(void);\nvoid kvm_x(void) {}\n' >"$tmp/t/core/retrieve/x_avx2.c"
expect "an AVX2 file in core/retrieve" "core/retrieve/x_avx2.c: a CPU kernel outside core/cpu"

# a second dispatcher
fresh
printf '#if defined(KVMEM_HAVE_AVX2)\n#endif\n' >>"$tmp/t/core/attend/attend.c"
expect "a build test in core/attend" "core/attend/attend.c: KVMEM_HAVE_AVX2 outside core/cpu/dispatch.c"

# a persistence room reaching the pool
fresh
sed -i '0,/^#include "/s//#include "..\/pool\/pool.h"\n#include "/' "$tmp/t/core/format/json.c"
expect "core/format includes core/pool" "core/format/json.c reaches a pool header"

[ $fail -eq 0 ] && echo "include_graph.sh fails on each break and passes the untouched tree"
exit $fail

#!/usr/bin/env bash
# include/kvmem.h compiles alone as strict C99 and as C++11, warning-free.
set -euo pipefail
src=$1 cc=$5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf '#include "kvmem.h"\nint main(void) { kvmem_tensor t; (void)t; return kvmem_version_number() > 0 ? 0 : 1; }\n' >"$tmp/c99.c"
"$cc" -std=c99 -pedantic -Wall -Wextra -Werror -I"$src/include" -c "$tmp/c99.c" -o "$tmp/c99.o"
echo "C99 -pedantic: ok"
cxx=""
for c in c++ g++ clang++; do command -v "$c" >/dev/null 2>&1 && { cxx=$c; break; }; done
if [ -z "$cxx" ]; then echo "skipped: no C++ compiler for the C++11 check"; exit 77; fi
printf '#include "kvmem.h"\n#include <cstdio>\nint main() { kvmem_status s = KVMEM_OK; std::printf("%%s\\n", kvmem_status_str(s)); return 0; }\n' >"$tmp/cxx.cpp"
"$cxx" -std=c++11 -pedantic -Wall -Wextra -Werror -I"$src/include" -c "$tmp/cxx.cpp" -o "$tmp/cxx.o"
echo "C++11 -pedantic: ok"

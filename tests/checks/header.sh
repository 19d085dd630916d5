#!/usr/bin/env bash
# include/kvmem.h compiles alone as strict C99 and as C++11, warning-free,
# with and without its experimental section (KVMEM_EXPERIMENTAL); the
# experimental families are declared only inside that section; section
# titles describe the API, not work items.
set -euo pipefail
src=$1 cc=$5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# the inline kvmem_*_default_params() are compiled (and called) in each mode
printf '#include "kvmem.h"\nint main(void) { kvmem_tensor t; kvmem_attend_params p = kvmem_attend_default_params(); (void)t; return kvmem_version_number() > 0 && p.struct_size ? 0 : 1; }\n' >"$tmp/c99.c"
for def in "" -DKVMEM_EXPERIMENTAL; do
  "$cc" -std=c99 -pedantic -Wall -Wextra -Werror $def -I"$src/include" -c "$tmp/c99.c" -o "$tmp/c99.o"
  echo "C99 -pedantic ${def:-(stable only)}: ok"
done

# The parts kvmem.h's "Experimental" section lists, by name: none may be
# declared outside it, and the section may hold nothing else.
experimental='^kvmem_(qmem_head_|streaming_keep$|h2o_|snapkv_|segments_|cluster_kmeans$|kmeans_|multihop_|load_plan|agent_open_file$|context_transfer_|pool_device_stats$|arrange$|window_split$|tensor_init_device$|context_vulkan_device$)'
stable=$(bash "$src/tests/util/api_names.sh" "$src" "$cc" stable)
all=$(bash "$src/tests/util/api_names.sh" "$src" "$cc" all)
section=$(comm -13 <(echo "$stable") <(echo "$all"))
leaked=$(echo "$stable" | grep -E "$experimental" || true)
[ -z "$leaked" ] || { echo "experimental functions declared outside the KVMEM_EXPERIMENTAL section:"; echo "$leaked"; exit 1; }
strays=$(echo "$section" | grep -vE "$experimental" || true)
[ -z "$strays" ] || { echo "functions in the experimental section that header.sh does not list as experimental:"; echo "$strays"; exit 1; }
[ -n "$section" ] || { echo "the KVMEM_EXPERIMENTAL section declares nothing"; exit 1; }
echo "$(echo "$stable" | wc -l) stable functions, $(echo "$section" | wc -l) experimental (KVMEM_EXPERIMENTAL)"
# a stable-only includer cannot call an experimental function
printf '#include "kvmem.h"\nint main(void) { return kvmem_segments_create(0, 0, 0, 0); }\n' >"$tmp/exp.c"
if "$cc" -std=c99 -Werror=implicit-function-declaration -I"$src/include" -c "$tmp/exp.c" -o "$tmp/exp.o" 2>/dev/null; then
  echo "kvmem_segments_create is declared without KVMEM_EXPERIMENTAL"; exit 1
fi

# title lines: "/* ---- Title ----- */" and the boxed "/* Title      */"
titles=$(grep -nE '^/\* (---- .*-+ |[A-Z].* {2,})\*/$' "$src/include/kvmem.h" | grep -iE 'issue|todo|work item' || true)
[ -z "$titles" ] || { echo "section titles naming work items instead of the API:"; echo "$titles"; exit 1; }

cxx=""
for c in c++ g++ clang++; do command -v "$c" >/dev/null 2>&1 && { cxx=$c; break; }; done
if [ -z "$cxx" ]; then echo "skipped: no C++ compiler for the C++11 check"; exit 77; fi
printf '#include "kvmem.h"\n#include <cstdio>\nint main() { kvmem_status s = KVMEM_OK; kvmem_retrieve_params p = kvmem_retrieve_default_params(); std::printf("%%s %%zu\\n", kvmem_status_str(s), p.struct_size); return 0; }\n' >"$tmp/cxx.cpp"
for def in "" -DKVMEM_EXPERIMENTAL; do
  "$cxx" -std=c++11 -pedantic -Wall -Wextra -Werror $def -I"$src/include" -c "$tmp/cxx.cpp" -o "$tmp/cxx.o"
  echo "C++11 -pedantic ${def:-(stable only)}: ok"
done

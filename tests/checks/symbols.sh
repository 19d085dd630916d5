#!/usr/bin/env bash
# Every symbol libkvmem.so exports starts with kvmem_, it exports exactly the
# functions include/kvmem.h declares (the stable ones and those of the
# KVMEM_EXPERIMENTAL section: the library always exports both), and it has
# a SONAME on the major version.
set -euo pipefail
src=$1 lib=$3 cc=$5
command -v nm >/dev/null || { echo "skipped: nm not installed (binutils)"; exit 77; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | grep -v '^kvmem_' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' || true)
if [ -n "$bad" ]; then echo "exported symbols without the kvmem_ prefix:"; echo "$bad"; exit 1; fi
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}' | grep '^kvmem_' | sort -u)
n=$(echo "$exported" | grep -c . || true)
[ "$n" -ge 20 ] || { echo "too few exported functions ($n): visibility broken?"; exit 1; }

stable=$(bash "$src/tests/util/api_names.sh" "$src" "$cc" stable)
all=$(bash "$src/tests/util/api_names.sh" "$src" "$cc" all)
experimental=$(comm -13 <(echo "$stable") <(echo "$all"))
missing=$(comm -23 <(echo "$all") <(echo "$exported"))
[ -z "$missing" ] || { echo "declared in kvmem.h but not exported:"; echo "$missing"; exit 1; }
undeclared=$(comm -13 <(echo "$all") <(echo "$exported"))
[ -z "$undeclared" ] || { echo "exported but declared nowhere in kvmem.h:"; echo "$undeclared"; exit 1; }
echo "$n exported functions, all kvmem_* and all declared in kvmem.h:"
echo "  stable ($(echo "$stable" | grep -c .)): $(echo $stable)"
echo "  experimental, under KVMEM_EXPERIMENTAL ($(echo "$experimental" | grep -c .)): $(echo $experimental)"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "SONAME $soname"
[[ "$soname" =~ ^libkvmem\.so\.[0-9]+$ ]] || { echo "SONAME should be libkvmem.so.<major>"; exit 1; }
# the core links nothing but libc, libm, pthreads (and the loader)
deps=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -v -E '^(libc|libm|libpthread|libdl|ld-linux.*|libasan|libubsan|libtsan|libgcc_s)\.so' || true)
if [ -n "$deps" ]; then echo "unexpected dependencies: $deps"; exit 1; fi

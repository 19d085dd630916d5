#!/usr/bin/env bash
# Every symbol libkvmem.so exports starts with kvmem_, and it has a SONAME on
# the major version.
set -euo pipefail
lib=$3
command -v nm >/dev/null || { echo "skipped: nm not installed (binutils)"; exit 77; }
bad=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}' | grep -v '^kvmem_' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start)$' || true)
if [ -n "$bad" ]; then echo "exported symbols without the kvmem_ prefix:"; echo "$bad"; exit 1; fi
n=$(nm -D --defined-only "$lib" | awk '$2 == "T"' | grep -c '^.* kvmem_' || true)
echo "$n exported functions, all kvmem_*"
[ "$n" -ge 20 ] || { echo "too few exported functions: visibility broken?"; exit 1; }
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
echo "SONAME $soname"
[[ "$soname" =~ ^libkvmem\.so\.[0-9]+$ ]] || { echo "SONAME should be libkvmem.so.<major>"; exit 1; }
# the core links nothing but libc, libm, pthreads (and the loader)
deps=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -v -E '^(libc|libm|libpthread|libdl|ld-linux.*|libasan|libubsan|libtsan|libgcc_s)\.so' || true)
if [ -n "$deps" ]; then echo "unexpected dependencies: $deps"; exit 1; fi

#!/usr/bin/env bash
# cmake --install puts the header, libraries, CMake package and kvmem.pc in a
# prefix; a tiny consumer builds against it with find_package(kvmem) and with
# pkg-config (shared and static), and runs.
set -euo pipefail
src=$1 build=$2 cc=$5 san=${6:-}
if [ -n "$san" ]; then echo "skipped: install check runs in the plain build, not under sanitizers"; exit 77; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
for f in include/kvmem.h lib/libkvmem.so lib/libkvmem.a lib/pkgconfig/kvmem.pc lib/cmake/kvmem/kvmemConfig.cmake; do
  [ -e "$tmp/prefix/$f" ] || { echo "missing after install: $f"; exit 1; }
done
cp "$src/tests/install/consumer.c" "$src/tests/install/CMakeLists.txt" "$tmp/"
# 1) CMake package
cmake -S "$tmp" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$tmp/b" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/b/consumer" | grep -q "consumer ok"
"$tmp/b/consumer_static" | grep -q "consumer ok"
echo "find_package(kvmem): shared and static consumers run"
# 2) pkg-config
command -v pkg-config >/dev/null || { echo "skipped: pkg-config not installed"; exit 77; }
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
"$cc" "$tmp/consumer.c" -o "$tmp/pc_shared" $(pkg-config --cflags --libs kvmem)
LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/pc_shared" | grep -q "consumer ok"
"$cc" "$tmp/consumer.c" -o "$tmp/pc_static" $(pkg-config --cflags kvmem) "$tmp/prefix/lib/libkvmem.a" $(pkg-config --static --libs-only-l kvmem | sed 's/-lkvmem//')
"$tmp/pc_static" | grep -q "consumer ok"
echo "pkg-config kvmem: shared and static consumers run"

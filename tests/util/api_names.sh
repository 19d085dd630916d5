#!/usr/bin/env bash
# The functions include/kvmem.h declares with KVMEM_API, one per line, sorted:
#   api_names.sh SRC CC stable   those declared without KVMEM_EXPERIMENTAL
#   api_names.sh SRC CC all      those declared with it (the whole section)
# Read from the preprocessed header, so #ifdef KVMEM_EXPERIMENTAL decides.
# Used by tests/checks/header.sh and tests/checks/symbols.sh.
set -euo pipefail
src=$1 cc=$2 which=$3
defs=(-DKVMEM_API=KVMEM_API_MARK)
[ "$which" = all ] && defs+=(-DKVMEM_EXPERIMENTAL)
"$cc" -E -P "${defs[@]}" "$src/include/kvmem.h" | tr '\n' ' ' |
  grep -oE 'KVMEM_API_MARK[^;(]*\(' | grep -oE 'kvmem_[A-Za-z0-9_]+ *\($' | tr -d ' (' | sort -u

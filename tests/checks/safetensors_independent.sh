#!/usr/bin/env bash
# A file kvmem writes is read correctly by an independent safetensors reader
# (Python standard library only: json + struct), not kvmem's code path.
# Args: SOURCE_DIR BINARY_DIR LIBKVMEM CLI CC SANITIZE
set -euo pipefail
src=$1 bin=$2 lib=$3 cc=$5 san=${6:-}
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=()
[ -n "$san" ] && flags+=("-fsanitize=${san//;/,}")
"$cc" -std=c11 -O1 "${flags[@]}" -I"$src/include" "$src/tests/checks/st_writer.c" -o "$work/writer" \
  "$lib" -Wl,-rpath,"$(dirname "$lib")" -lm
"$work/writer" "$work"
python3 "$src/tests/checks/st_reader.py" "$work"/*.safetensors

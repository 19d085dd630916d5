#!/usr/bin/env bash
# The kvmem tool's output for scripts:
#  - `kvmem --version` and `kvmem version` print the version the library
#    itself reports (kvmem_version(), called through ctypes here);
#  - `kvmem inspect --json` is typed: read back by Python's json module, the
#    numbers are numbers (format_version, block_size, n_tokens, n_blocks,
#    bytes), the model spec is an object of kvmem_model_spec's fields, and
#    every value equals what the program below saved (an unusual spec:
#    partial rotary, GPT-J, llama3 scaling, per-layer windows).
# Args: SOURCE_DIR BINARY_DIR LIBKVMEM CLI CC SANITIZE
set -uo pipefail
src=$1 lib=$3 cli=$4 cc=$5 san=${6:-}
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0

# --version: the same line as `kvmem version`, naming the library's version
v1=$("$cli" --version) || { echo "FAIL: kvmem --version exited $?"; fail=1; }
v2=$("$cli" version) || { echo "FAIL: kvmem version exited $?"; fail=1; }
[ "$v1" = "$v2" ] || { echo "FAIL: kvmem --version printed '$v1', kvmem version '$v2'"; fail=1; }
if [ -z "$san" ]; then # a sanitizer build's library cannot be loaded into python3 alone
  want=$(python3 -c 'import ctypes, sys; f = ctypes.CDLL(sys.argv[1]).kvmem_version; f.restype = ctypes.c_char_p; print(f().decode())' "$lib")
  grep -qx "kvmem $want (header [0-9.]*)" <<<"$v1" || { echo "FAIL: kvmem --version printed '$v1', the library says $want"; fail=1; }
fi
"$cli" --version extra >/dev/null 2>"$work/err" && { echo "FAIL: kvmem --version took an argument"; fail=1; }
grep -q "takes no arguments, got 'extra'" "$work/err" || { echo "FAIL: kvmem --version extra: $(cat "$work/err")"; fail=1; }
"$cli" --help | grep -q -- "--version" || { echo "FAIL: kvmem --help does not mention --version"; fail=1; }

cat >"$work/save.c" <<'EOF'
#include <kvmem.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    kvmem_context *ctx;
    kvmem_pool *pool;
    kvmem_agent *a;
    static const int32_t window[3] = {0, 128, 0};
    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = 3, spec.n_q_heads = 4, spec.n_kv_heads = 2, spec.head_dim = 16, spec.rotary_dim = 8;
    spec.rope_style = KVMEM_ROPE_GPTJ;
    spec.rope_theta = 500000.0;
    spec.rope_scaling = KVMEM_ROPE_SCALING_LLAMA3;
    spec.rope_factor = 8.0, spec.rope_low_freq_factor = 1.0, spec.rope_high_freq_factor = 4.0;
    spec.rope_original_max_pos = 8192;
    spec.layer_window = window;
    snprintf(spec.model_id, sizeof spec.model_id, "typed-json");
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 16;
    pp.storage_dtype = KVMEM_Q4;
    enum { T = 96 };
    static float k[3 * T * 2 * 16], v[3 * T * 2 * 16];
    for (int i = 0; i < 3 * T * 2 * 16; i++) k[i] = (float)(i % 13) - 6.0f, v[i] = (float)(i % 5);
    int64_t shape[4] = {3, T, 2, 16};
    kvmem_tensor kt, vt;
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    if (kvmem_context_create(NULL, &ctx) || kvmem_pool_create(ctx, &spec, &pp, &pool) ||
        kvmem_agent_open(pool, "typed", &a) || kvmem_agent_append(a, &kt, &vt, NULL) || kvmem_agent_save(a, argv[1])) {
        fprintf(stderr, "save.c: %s\n", kvmem_last_error());
        return 1;
    }
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    return 0;
}
EOF
flags=()
[ -n "$san" ] && flags+=("-fsanitize=${san//;/,}")
"$cc" -std=c11 -O1 "${flags[@]}" -I"$src/include" "$work/save.c" -o "$work/save" "$lib" -Wl,-rpath,"$(dirname "$lib")" \
  || { echo "FAIL: save.c did not build"; exit 1; }
"$work/save" "$work/typed.safetensors" || { echo "FAIL: save.c"; exit 1; }
"$cli" inspect --json "$work/typed.safetensors" >"$work/out.json" || { echo "FAIL: inspect --json exited $?"; cat "$work/out.json"; fail=1; }
python3 - "$work/out.json" "$work/typed.safetensors" <<'PY' || fail=1
import json, struct, sys
d = json.load(open(sys.argv[1]))
raw = open(sys.argv[2], "rb").read()
meta = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])["__metadata__"]

def same(key, want, typ):
    got = d[key]
    assert type(got) is typ and got == want, f"{key}: {got!r} ({type(got).__name__}), want {want!r} ({typ.__name__})"

same("format", "kvmem-agent", str)
same("format_version", 2, int)
same("agent_id", "typed", str)
same("model_id", "typed-json", str)
same("storage_dtype", "q4", str)
same("block_size", 16, int)
same("n_tokens", 96, int)
same("n_blocks", 6, int)
same("bytes", len(raw), int)
same("valid", True, bool)
same("checksum_ok", True, bool)
same("checksum", meta["checksum"], str)
spec = d["model_spec"]
assert type(spec) is dict, f"model_spec is a {type(spec).__name__}: {spec!r}"
want = {"n_layers": 3, "n_q_heads": 4, "n_kv_heads": 2, "head_dim": 16, "rotary_dim": 8, "rope_style": 1,
        "rope_theta": 500000.0, "rope_scaling": 2, "rope_factor": 8.0, "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0, "rope_original_max_pos": 8192, "layer_window": [0, 128, 0]}
for key, value in want.items():
    got = spec.get(key)
    assert got == value and isinstance(got, type(value)) or (type(value) is float and type(got) in (int, float) and got == value), \
        f"model_spec.{key}: {got!r}, want {value!r}"
# every field the file holds, and no other: the file's own string, split here
fields = dict(kv.split("=", 1) for kv in meta["model_spec"].split(";"))
assert set(spec) == set(fields), (sorted(spec), sorted(fields))
for key, text in fields.items():
    if key != "layer_window":
        assert spec[key] == float(text) and not isinstance(spec[key], (str, bool)), (key, spec[key], text)
for t in d["tensors"]:
    assert type(t["bytes"]) is int and all(type(x) is int for x in t["shape"]), t
print("inspect --json: typed, and equal to what was saved")
PY

# a spec string that is not key=value pieces, and numbers that are not
# numbers: null, and still JSON
python3 - "$work/typed.safetensors" "$work/odd.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["__metadata__"]["model_spec"] = "n_layers=3;garbage"
h["__metadata__"]["block_size"] = "16x"
h["__metadata__"]["n_tokens"] = "1e999"
hdr = json.dumps(h, separators=(",", ":")).encode()
hdr += b" " * (-len(hdr) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(hdr)) + hdr + b[8 + n:])
PY
"$cli" inspect --json "$work/odd.safetensors" >"$work/odd.json" 2>/dev/null
python3 - "$work/odd.json" <<'PY' || fail=1
import json, sys
d = json.load(open(sys.argv[1]))
assert d["model_spec"] is None and d["block_size"] is None and d["n_tokens"] is None and d["valid"] is False, d
print("inspect --json: values that are not numbers are null")
PY
exit $fail

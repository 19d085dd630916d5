#!/usr/bin/env bash
# Smoke check of the store suite's lines for agents opened in place
# (`kvmem bench --quick --json store`, "config":"mapped_*"): both dtypes run,
# the agent really is 4 times the pool's capacity while the pool counts no
# more than it, and the documented keys are there (cold ones, or the reason
# they were skipped).
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler,
# $6 sanitizer list. Exit 77 = skipped.
set -u
tool="$4"
if [ ! -x "$tool" ]; then
    echo "skipped: kvmem tool not built at $tool"
    exit 77
fi
if ! "$tool" bench 2>&1 | grep -q "store"; then
    echo "skipped: this build has no benchmarks (KVMEM_BUILD_BENCH=OFF)"
    exit 77
fi
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
out=$(KVMEM_BENCH_DIR="$dir" "$tool" bench --quick --json store) || { echo "FAIL: kvmem bench --quick --json store exited $?"; exit 1; }
fail=0
for cfg in mapped_llama8b_f16 mapped_llama8b_q4; do
    line=$(printf '%s\n' "$out" | grep "\"config\":\"$cfg\"" | head -1)
    if [ -z "$line" ]; then echo "FAIL: no line with \"config\":\"$cfg\""; fail=1; continue; fi
    for key in file_bytes capacity_bytes resident_bytes file_over_capacity gathered_tokens memory_ms mapped_warm_ms warm_over_memory; do
        printf '%s' "$line" | grep -Eq "\"$key\":-?[0-9]" || { echo "FAIL: $cfg lacks \"$key\": $line"; fail=1; }
    done
    if ! printf '%s' "$line" | grep -Eq '"mapped_cold_ms":[0-9]|"cold_skipped":"'; then
        echo "FAIL: $cfg has neither cold figures nor the reason they were skipped: $line"; fail=1
    fi
    num() { printf '%s' "$line" | grep -Eo "\"$1\":[^,}]*" | cut -d: -f2; }
    file=$(num file_bytes) cap=$(num capacity_bytes) res=$(num resident_bytes)
    if [ -n "$file" ] && [ -n "$cap" ] && [ -n "$res" ]; then
        awk -v f="$file" -v c="$cap" -v r="$res" 'BEGIN { exit !(f >= 4 * c - 4 && r <= c && r > 0) }' ||
            { echo "FAIL: $cfg: file $file, capacity $cap, resident $res (want file >= 4 x capacity >= 4 x resident)"; fail=1; }
    fi
done
[ ! -e "$dir/mapped.safetensors" ] || { echo "FAIL: the bench left its agent file behind"; fail=1; }
[ $fail -eq 0 ] && echo "ok: mapped store lines present and within capacity"
exit $fail

#!/usr/bin/env bash
# scripts/bench-ab.c, the in-process A/B of two libkvmem builds: it compiles
# against today's header, runs --quick with this build's library as both A
# and B, prints one JSON line per row with numeric timings, finds the two
# builds' results equal (the same library: they must be) and leaves no agent
# file behind.
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler,
# $6 sanitizer list. Exit 77 = skipped.
set -u
src=$1 lib=$3 cc=$5 san=${6:-}
if [ -n "$san" ]; then echo "skipped: a timing harness, run in the plain build (this one is $san)"; exit 77; fi
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
"$cc" -O2 -Wall -Wextra -Werror -I"$src/include" "$src/scripts/bench-ab.c" -o "$dir/bench-ab" -ldl ||
    { echo "FAIL: scripts/bench-ab.c does not compile"; exit 1; }
out=$(TMPDIR="$dir" "$dir/bench-ab" --quick --json "$lib" "$lib") || { echo "FAIL: bench-ab exited $?"; exit 1; }
fail=0
n=$(printf '%s\n' "$out" | grep -c '"suite":"ab"')
[ "$n" -eq 11 ] || { echo "FAIL: $n rows, want 11"; fail=1; }
while IFS= read -r line; do
    for key in a_ms b_ms b_over_a paired_b_over_a; do
        printf '%s' "$line" | grep -Eq "\"$key\":[0-9]+\\.[0-9]+" || { echo "FAIL: no number for $key: $line"; fail=1; }
    done
    printf '%s' "$line" | grep -q '"outputs_equal":1' || { echo "FAIL: one build against itself differs: $line"; fail=1; }
done <<< "$out"
printf '%s\n' "$out" | grep -q '"source":"mapped"' || { echo "FAIL: no row from a mapped agent"; fail=1; }
for op in slotmap_evict slotmap_compact; do
    printf '%s\n' "$out" | grep -q "\"op\":\"$op\"" || { echo "FAIL: no $op row"; fail=1; }
done
left=$(find "$dir" -name 'bench-ab-*.safetensors' | wc -l)
[ "$left" -eq 0 ] || { echo "FAIL: $left agent files left behind"; fail=1; }
"$dir/bench-ab" "$lib" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || { echo "FAIL: one library given: exit $rc, want 2 (usage)"; fail=1; }
[ $fail -eq 0 ] && echo "ok: bench-ab ran both builds, 11 rows, outputs equal"

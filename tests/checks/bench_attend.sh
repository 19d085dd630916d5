#!/usr/bin/env bash
# Smoke check of `kvmem bench --quick --json attend`: it runs and prints the
# documented keys (plain, detector, sweep, defaults and layout lines).
# Args: $1 source dir, $2 build dir, $3 libkvmem.so, $4 kvmem tool, $5 C compiler,
# $6 sanitizer list. Exit 77 = skipped.
set -u
tool="$4"
if [ ! -x "$tool" ]; then
    echo "skipped: kvmem tool not built at $tool"
    exit 77
fi
if ! "$tool" bench 2>&1 | grep -q "attend"; then
    echo "skipped: this build has no benchmarks (KVMEM_BUILD_BENCH=OFF)"
    exit 77
fi
out=$("$tool" bench --quick --json attend) || { echo "FAIL: kvmem bench --quick --json attend exited $?"; exit 1; }
fail=0
need() { # kind, keys...
    local kind="$1"; shift
    local line
    line=$(printf '%s\n' "$out" | grep "\"kind\":\"$kind\"" | head -1)
    if [ -z "$line" ]; then echo "FAIL: no line with \"kind\":\"$kind\""; fail=1; return; fi
    for key in "$@"; do
        if ! printf '%s' "$line" | grep -Eq "\"$key\":(-?[0-9]|null|\")"; then
            echo "FAIL: $kind line lacks \"$key\": $line"; fail=1
        fi
    done
}
need plain read_bw_gbps kv_gbps kv_to_read_bw kv_gbps_1thread tokens n_q_heads n_kv_heads head_dim
need detector detector_overhead detector_overhead_wall detector_overhead_hot
need sweep tau_s tau_d patience tiles_visited_frac speedup rel_err probe_oracle_agreement
need defaults tau_s tau_d patience tiles_visited_frac speedup rel_err probe_oracle_agreement
need layout layout order tokens ms_1thread ms vs_contiguous read_bw_gbps max_abs_diff
# both layouts, every order; head-major gives the contiguous layout's output (the same values)
for l in contiguous head_major; do for ord in full recent scored; do
    if ! printf '%s\n' "$out" | grep '"kind":"layout"' | grep "\"layout\":\"$l\"" | grep -q "\"order\":\"$ord\""; then
        echo "FAIL: no layout line for $l, $ord"; fail=1
    fi
done; done
if ! printf '%s\n' "$out" | grep '"kind":"layout"' | grep '"order":"full"' | grep -q '"kv_to_read_bw_1thread":'; then
    echo "FAIL: full-attention layout lines lack kv_to_read_bw_1thread"; fail=1
fi
bad=$(printf '%s\n' "$out" | grep '"kind":"layout"' | grep -Eo '"max_abs_diff":[^,}]*' | awk -F: '$2 > 1e-5' | head -1)
if [ -n "$bad" ]; then echo "FAIL: head-major output differs from contiguous: $bad"; fail=1; fi
# every line is one flat JSON object of suite attend
if printf '%s\n' "$out" | grep -v '^{"suite":"attend".*}$' | grep -q .; then
    echo "FAIL: a line is not a JSON object of suite attend"; fail=1
fi
# sweep fractions are fractions
bad=$(printf '%s\n' "$out" | grep '"kind":"sweep"' | grep -Eo '"tiles_visited_frac":[^,}]*' | awk -F: '$2 <= 0 || $2 > 1' | head -1)
if [ -n "$bad" ]; then echo "FAIL: $bad outside (0, 1]"; fail=1; fi
[ $fail -eq 0 ] && echo "ok: bench attend keys present ($(printf '%s\n' "$out" | wc -l) lines)"
exit $fail

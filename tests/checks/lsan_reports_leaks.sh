#!/usr/bin/env bash
# The ASan stage keeps the Vulkan driver resident (the plugin holds one
# instance for the process), so no driver block turns into a "leak" from an
# unloaded module, and no suppression is needed. This proves the stage still
# reports real leaks with the driver loaded: one in a program, one of
# libkvmem's own objects, and none when everything is freed.
# Args: SRC BIN LIBKVMEM KVMEM_CLI CC SANITIZE
set -uo pipefail
bin=$2 lib=$3 san=${6:-}
case "$san" in *address*) ;; *) echo "skipped: not an AddressSanitizer build"; exit 77 ;; esac
prog="$bin/tests/lsan_leak"
[ -x "$prog" ] || { echo "FAIL: $prog not built"; exit 1; }
export KVMEM_BACKEND_PATH="$(dirname "$lib")"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=23
fail=0

out=$("$prog" none 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: 'none' exited $rc (a leak or error with everything freed)"; fail=1; }
grep -q 'context vulkan: backend vulkan' <<<"$out" ||
  echo "note: no Vulkan device here, so the driver part is not exercised"

out=$("$prog" program 2>&1); rc=$?
echo "$out" | tail -n 12
[ $rc -eq 23 ] || { echo "FAIL: 'program' exited $rc, expected LeakSanitizer's 23"; fail=1; }
grep -q 'detected memory leaks' <<<"$out" || { echo "FAIL: no LeakSanitizer report"; fail=1; }
grep -q '4096 byte(s) in 1 object(s)' <<<"$out" || { echo "FAIL: the 4096-byte leak is not reported"; fail=1; }
grep -q 'leak_on_purpose' <<<"$out" || { echo "FAIL: the leak's stack does not name leak_on_purpose"; fail=1; }
if grep -q 'unknown module' <<<"$out"; then echo "FAIL: a leak from an unloaded module"; fail=1; fi

out=$("$prog" library 2>&1); rc=$?
echo "$out" | grep -E 'leak of|SUMMARY|kvmem_pool_create|kvmem_context_create' | head -n 12
[ $rc -eq 23 ] || { echo "FAIL: 'library' exited $rc, expected LeakSanitizer's 23"; fail=1; }
grep -q 'kvmem_pool_create' <<<"$out" || { echo "FAIL: the leaked pool is not reported"; fail=1; }
grep -q 'kvmem_context_create' <<<"$out" || { echo "FAIL: the leaked context is not reported"; fail=1; }
if grep -q 'unknown module' <<<"$out"; then echo "FAIL: a leak from an unloaded module"; fail=1; fi

[ $fail -eq 0 ] && echo "ok: LeakSanitizer reports the program's and the library's leaks, and none else"
exit $fail

#!/usr/bin/env bash
# The Vulkan plugin links no Vulkan library at build time (volk opens the
# loader at run time), exports only its init symbol, sits beside libkvmem.so
# where the registry looks, and `kvmem backends` reports on it plainly.
# Args: SRC BIN LIBKVMEM KVMEM_CLI CC SANITIZE
set -euo pipefail
bin=$2 lib=$3 cli=$4
grep -q '^KVMEM_VULKAN:BOOL=ON' "$bin/CMakeCache.txt" || { echo "skipped: Vulkan backend not built (KVMEM_VULKAN=OFF)"; exit 77; }
plugin="$(dirname "$lib")/libkvmem-vulkan.so"
[ -f "$plugin" ] || { echo "FAIL: $plugin missing (must be beside libkvmem.so)"; exit 1; }
command -v readelf >/dev/null || { echo "skipped: readelf not installed (binutils)"; exit 77; }

needed=$(readelf -d "$plugin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "NEEDED: $needed"
if grep -qi vulkan <<<"$needed"; then echo "FAIL: plugin links a Vulkan library at build time"; exit 1; fi
if grep -qi vulkan <<<"$(ldd "$plugin")"; then echo "FAIL: ldd shows a Vulkan library"; ldd "$plugin"; exit 1; fi

exports=$(nm -D --defined-only "$plugin" | awk '$2 ~ /^[TW]$/ {print $3}' | grep -v '^_' | sort | tr '\n' ' ')
echo "exported functions: $exports"
[ "$exports" = "kvmem_backend_plugin_init " ] || { echo "FAIL: plugin must export only kvmem_backend_plugin_init"; exit 1; }

# The tool links the core statically and finds plugins through its run path;
# under ASan the dlopen interceptor is the caller (its run path is searched),
# so sanitizer builds name the directory explicitly.
[ -n "${6:-}" ] && export KVMEM_BACKEND_PATH="$(dirname "$lib")"
out=$("$cli" backends)
echo "$out"
line=$(echo "$out" | grep '^vulkan') || { echo "FAIL: kvmem backends has no vulkan line"; exit 1; }
# Either usable with a device description, or unusable with a plain reason.
if grep -q ' available ' <<<"$line"; then
  grep -q 'Vulkan [0-9]' <<<"$line" || { echo "FAIL: no device description"; exit 1; }
else
  echo "$line" | grep -Eq 'no Vulkan loader|no device' || { echo "FAIL: unclear reason: $line"; exit 1; }
fi
# With no driver visible to the loader, the reason says "no device".
line=$(VK_ICD_FILENAMES=/nonexistent/icd.json VK_DRIVER_FILES=/nonexistent/icd.json "$cli" backends | grep '^vulkan')
echo "without drivers: $line"
cache=$(ldconfig -p 2>/dev/null || true) # (not piped into grep -q: SIGPIPE under pipefail)
if grep -q 'libvulkan.so.1' <<<"$cache"; then
  grep -q 'unavailable.*no device' <<<"$line" || { echo "FAIL: expected 'no device' without drivers"; exit 1; }
else
  grep -q 'unavailable.*no Vulkan loader (libvulkan.so.1)' <<<"$line" || { echo "FAIL: expected 'no Vulkan loader'"; exit 1; }
fi
# With no loadable loader (here: a broken libvulkan.so.1 found first), the
# reason names the missing loader.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/libvulkan.so.1"
line=$(LD_LIBRARY_PATH="$tmp" "$cli" backends | grep '^vulkan')
echo "without a loader: $line"
grep -q 'unavailable.*no Vulkan loader (libvulkan.so.1)' <<<"$line" || { echo "FAIL: expected 'no Vulkan loader'"; exit 1; }
echo "ok"

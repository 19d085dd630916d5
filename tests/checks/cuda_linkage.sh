#!/usr/bin/env bash
# libkvmem.so never links a CUDA library (the CUDA backend is a dlopened
# plugin), and the plugin carries cudart statically: no dynamic dependency on
# libcudart, only on the driver it loads at run time.
# Args: SRC BIN LIBKVMEM CLI CC SANITIZE
set -euo pipefail
bin=$2
lib=$3
command -v readelf >/dev/null || { echo "skipped: readelf not installed (binutils)"; exit 77; }
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }

core=$(needed "$lib")
echo "libkvmem.so needs: $(echo $core)"
if echo "$core" | grep -Eqi 'cuda|cublas|nvrtc|vulkan'; then
  echo "FAIL: libkvmem.so links a GPU library" >&2
  exit 1
fi

plugin="$bin/core/libkvmem-cuda.so"
if [ ! -f "$plugin" ]; then
  echo "skipped: the CUDA plugin is not built (KVMEM_CUDA=OFF) — libkvmem.so checked"
  exit 77
fi
deps=$(needed "$plugin")
echo "libkvmem-cuda.so needs: $(echo $deps)"
if echo "$deps" | grep -Eqi 'cudart|libcuda\.so'; then
  echo "FAIL: the plugin links libcudart or libcuda dynamically (cudart must be static, the driver dlopened)" >&2
  exit 1
fi
# exactly one exported kvmem symbol: the init entry point
exported=$(nm -D --defined-only "$plugin" | awk '{print $3}' | grep -v '^_' || true)
if [ "$exported" != "kvmem_backend_plugin_init" ]; then
  echo "FAIL: the plugin exports: $exported" >&2
  exit 1
fi
# cudart is inside (statically linked)
n_rt=$(nm "$plugin" 2>/dev/null | grep -c ' cudaGetDeviceCount$' || true)
if [ "$n_rt" = 0 ]; then
  echo "FAIL: no CUDA runtime inside the plugin" >&2
  exit 1
fi
echo "ok: core free of CUDA, plugin with static cudart"

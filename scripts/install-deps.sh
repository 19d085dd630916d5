#!/usr/bin/env bash
# Installs what kvmem's build and tests need on Debian 12, and nothing more.
# As root it runs apt-get; otherwise it prints the exact command and stops.
#
# Usage: scripts/install-deps.sh [GROUP...]   (no GROUP: every group but bench)
#   build     the C build: compiler, CMake, cmocka (required)
#   test      what the C test suites use besides: the Vulkan backend's
#             toolchain and Mesa's lavapipe, hiredis and redis-server (required)
#   fuzz      the libFuzzer harness: clang and its fuzzer runtime (required)
#   web       the WebAssembly build and its browser test: emscripten,
#             node-acorn for Debian's emcc, chromium, nodejs, then
#             playwright-core from wasm/package-lock.json with npm (which
#             ships with the nodejs package where that comes from NodeSource:
#             Debian's own `npm` package is installed only when no npm is
#             present). Optional: without root it is reported and `make
#             test-web` skips with the reason.
#   bindings  the Python, Node and Go toolchains and what packaging them
#             needs (Debian's setuptools, wheel, build, venv), then koffi and
#             TypeScript from bindings/node/package-lock.json. Optional:
#             `make test-bindings` skips a language without its toolchain.
#   bench     what bench/peers.py's PyTorch peer needs to be a fair one:
#             OpenBLAS (libopenblas0-pthread; Debian's default libblas.so.3
#             is the reference BLAS, about 40x slower). Installing it makes it
#             the system's libblas.so.3 unless the alternative was set by
#             hand; `LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread`
#             picks it for one run. Optional: peers.py names the BLAS it ran.
# `make build` and `make demo` install the build group, each `make test-*`
# stage its own, `make test` every group.
set -euo pipefail

groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=(build test fuzz web bindings)
want() { local g; for g in "${groups[@]}"; do [ "$g" = "$1" ] && return 0; done; return 1; }
for g in "${groups[@]}"; do
  case "$g" in build|test|fuzz|web|bindings|bench) ;; *) echo "install-deps: unknown group '$g' (build, test, fuzz, web, bindings, bench)" >&2; exit 2 ;; esac
done

pkgs=()
# python3 and ca-certificates also fetch make demo's model over HTTPS (scripts/fetch-model.py)
want build && pkgs+=(build-essential cmake pkgconf libcmocka-dev binutils python3 ca-certificates)
# Vulkan backend: headers and loader, volk, the shader compiler and
# validator, and Mesa's lavapipe (Vulkan on the CPU) for the conformance run.
want test && pkgs+=(libvulkan-dev libvulkan-volk-dev glslang-tools spirv-tools mesa-vulkan-drivers)
# The Redis store plugin (libhiredis-dev) and its tests (redis-server and
# redis-tools: tests/checks/redis_store.sh starts a server on loopback).
want test && pkgs+=(libhiredis-dev redis-server redis-tools)
# The libFuzzer harness (make fuzz): clang and its fuzzer runtime.
want fuzz && pkgs+=(clang-14 libclang-rt-14-dev)
# bench/peers.py's PyTorch peer: an optimised BLAS
want bench && pkgs+=(libopenblas0-pthread)
web_pkgs=(emscripten node-acorn chromium nodejs)

missing_of() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

install() {
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $*"
  if [ "$(id -u)" -ne 0 ]; then
    echo "Run as root:  $cmd" >&2
    return 1
  fi
  echo "installing: $*" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

missing=()
[ ${#pkgs[@]} -eq 0 ] || mapfile -t missing < <(missing_of "${pkgs[@]}")
if [ ${#missing[@]} -gt 0 ]; then
  echo "kvmem needs these Debian packages: ${missing[*]}" >&2
  install "${missing[@]}" || exit 1
fi

root=$(cd "$(dirname "$0")/.." && pwd)
if want web; then
  mapfile -t web_missing < <(missing_of "${web_pkgs[@]}")
  command -v npm >/dev/null || web_missing+=(npm)
  if [ ${#web_missing[@]} -gt 0 ]; then
    echo "the WebAssembly build and browser test need: ${web_missing[*]}" >&2
    install "${web_missing[@]}" || echo "(optional: make test-web skips without them)" >&2
  fi

  # playwright-core, pinned by wasm/package-lock.json (it drives Debian's
  # chromium; it downloads no browser of its own).
  if command -v npm >/dev/null && [ ! -f "$root/wasm/node_modules/playwright-core/package.json" ]; then
    (cd "$root/wasm" && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "npm ci in wasm/ failed (optional: make test-web skips without playwright-core)" >&2
  fi
fi
want bindings || exit 0
# The bindings' toolchains count as present when the tool works, however it
# was installed (a NodeSource nodejs ships its own npm).
bind_missing=()
/usr/bin/python3 -c 'import pytest' 2>/dev/null || bind_missing+=(python3-pytest)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || bind_missing+=(python3-numpy)
# the Python package's build and its install test in a fresh venv, offline:
# setuptools and wheel (pip install --no-build-isolation), build (python3 -m
# build --no-isolation --wheel), venv (with Debian's pip inside)
/usr/bin/python3 -c 'import setuptools' 2>/dev/null || bind_missing+=(python3-setuptools)
/usr/bin/python3 -c 'import wheel' 2>/dev/null || bind_missing+=(python3-wheel)
/usr/bin/python3 -c 'import build' 2>/dev/null || bind_missing+=(python3-build)
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || bind_missing+=(python3-venv)
/usr/bin/python3 -c 'import torch' 2>/dev/null || bind_missing+=(python3-torch)  # kvmem.torch, examples/python/torch_agent.py
command -v node >/dev/null || bind_missing+=(nodejs)
command -v npm >/dev/null || bind_missing+=(npm)
command -v go >/dev/null || bind_missing+=(golang-go)
if [ ${#bind_missing[@]} -gt 0 ]; then
  echo "the Python, Node and Go bindings' tests need: ${bind_missing[*]}" >&2
  install "${bind_missing[@]}" || echo "(optional: make test-bindings skips a language without them)" >&2
fi

# koffi, the Node binding's FFI, and TypeScript with Node's types (the check of
# index.d.ts), pinned by bindings/node/package-lock.json
if command -v npm >/dev/null && { [ ! -d "$root/bindings/node/node_modules/koffi" ] ||
                                  [ ! -d "$root/bindings/node/node_modules/typescript" ]; }; then
  (cd "$root/bindings/node" && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "npm ci in bindings/node failed (optional: the Node binding's tests skip without koffi)" >&2
fi
exit 0

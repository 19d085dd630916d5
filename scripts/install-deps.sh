#!/usr/bin/env bash
# Installs what kvmem's build and tests need on Debian 12, and nothing more.
# As root it runs apt-get; otherwise it prints the exact command and stops.
# The bindings' toolchains are optional: without them their tests print
# "skipped: <why>"; as root they are installed too, and koffi (the Node FFI)
# comes from the npm registry through bindings/node/package-lock.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

pkgs=(build-essential cmake pkgconf libcmocka-dev binutils python3)
# Vulkan backend: headers and loader, volk, the shader compiler and
# validator, and Mesa's lavapipe (Vulkan on the CPU) for the conformance run.
pkgs+=(libvulkan-dev libvulkan-volk-dev glslang-tools spirv-tools mesa-vulkan-drivers)

missing_in() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(missing_in "${pkgs[@]}")
# binding toolchains count as present when the tool works, however installed
# (a NodeSource nodejs ships its own npm and conflicts with Debian's)
missing_b=()
/usr/bin/python3 -c 'import pytest' 2>/dev/null || missing_b+=(python3-pytest)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || missing_b+=(python3-numpy)
command -v node >/dev/null || missing_b+=(nodejs)
command -v npm >/dev/null || missing_b+=(npm)
command -v go >/dev/null || missing_b+=(golang-go)

if [ ${#missing[@]} -gt 0 ] || [ ${#missing_b[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    if [ ${#missing[@]} -gt 0 ]; then
      echo "kvmem needs these Debian packages: ${missing[*]}" >&2
      echo "Run as root:  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]} ${missing_b[*]}" >&2
      exit 1
    fi
    echo "note: the bindings' tests need ${missing_b[*]} (they will print skipped without them)" >&2
  else
    echo "installing: ${missing[*]} ${missing_b[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" "${missing_b[@]}"
  fi
fi

# koffi for the Node binding, pinned by package-lock.json
if command -v npm >/dev/null && [ ! -d "$root/bindings/node/node_modules/koffi" ]; then
  (cd "$root/bindings/node" && npm ci --no-audit --no-fund --loglevel=error) ||
    echo "note: npm ci in bindings/node failed (no registry?): the Node tests will print skipped" >&2
fi
exit 0

#!/usr/bin/env bash
# Installs what kvmem's build and tests need on Debian 12, and nothing more.
# As root it runs apt-get; otherwise it prints the exact command and stops.
set -euo pipefail

pkgs=(build-essential cmake pkgconf libcmocka-dev binutils python3)
# Vulkan backend: headers and loader, volk, the shader compiler and
# validator, and Mesa's lavapipe (Vulkan on the CPU) for the conformance run.
pkgs+=(libvulkan-dev libvulkan-volk-dev glslang-tools spirv-tools mesa-vulkan-drivers)
# The libFuzzer harness (make fuzz): clang and its fuzzer runtime.
pkgs+=(clang-14 libclang-rt-14-dev)
# The Redis store plugin (libhiredis-dev) and its tests (redis-server and
# redis-tools: tests/checks/redis_store.sh starts a server on loopback).
pkgs+=(libhiredis-dev redis-server redis-tools)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "kvmem needs these Debian packages: ${missing[*]}" >&2
  echo "Run as root:  $cmd" >&2
  exit 1
fi
echo "installing: ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"

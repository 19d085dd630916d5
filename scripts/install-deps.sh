#!/usr/bin/env bash
# Installs what kvmem's build and tests need on Debian 12, and nothing more.
# As root it runs apt-get; otherwise it prints the exact command and stops.
set -euo pipefail

# clang-14 + libclang-rt-14-dev: the libFuzzer harness (make fuzz); python3: the
# independent safetensors reader check (and other checks).
# libhiredis-dev: the Redis store plugin; redis-server + redis-tools: its tests
# (tests/checks/redis_store.sh starts a server on loopback).
pkgs=(build-essential cmake pkgconf libcmocka-dev binutils python3 clang-14 libclang-rt-14-dev
      libhiredis-dev redis-server redis-tools)

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

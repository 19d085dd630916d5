#!/usr/bin/env bash
# The load-and-fault runs of docs/reliability.md, against both services:
# loadfault.js (N clients x M agents, without faults, then with kill -9 of
# the service, of Redis and of clients, and SIGTERM) on a directory and a
# Redis store, then flood.js (one client floods, another's latency and the
# service's RSS are watched). Not part of make test: about 30 minutes.
#   scripts/loadfault/run.sh [OUT_DIR]
#   env: BUILD (build/default), SECONDS_PER_RUN (60), CLIENTS (8), AGENTS (8),
#        PHASE_SECONDS (15), ROUNDS (3), BUDGET (Node 512M, Go 256M), SERVICES ("node go"),
#        STORES ("dir redis")
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${BUILD:-$root/build/default}" && pwd)
out=${1:-$(mktemp -d "${TMPDIR:-/tmp}/kvmem-loadfault-XXXXXX")}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for tool in node go redis-server; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done
export KVMEM_LIBRARY="$build/core/libkvmem.so.0"
[ -f "$KVMEM_LIBRARY" ] || { echo "run.sh: $KVMEM_LIBRARY is missing: run make build" >&2; exit 1; }

# the Go service against the build tree, as scripts/test-bindings.sh builds it
(cd "$root/examples/go/memsvc" &&
  export PKG_CONFIG_PATH="$build${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" &&
  CGO_ENABLED=1 CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" \
  GOCACHE=${GOCACHE:-$build/bindings/gocache} GOPATH=${GOPATH:-$build/bindings/gopath} GOPROXY=off \
  go build -o "$out/memsvc" .)

# the Node service requires 'kvmem' as a package: link the checkout's binding, as
# npm links its file: dependency (and as scripts/test-bindings.sh does)
mkdir -p "$root/examples/node/memory-service/node_modules"
ln -sfn "$root/bindings/node" "$root/examples/node/memory-service/node_modules/kvmem"

echo "run.sh: results in $out" >&2
for svc in ${SERVICES:-node go}; do
  for store in ${STORES:-dir redis}; do
    echo "=== load $svc $store" >&2
    node "$root/scripts/loadfault/loadfault.js" --service "$svc" --store "$store" --seconds "${SECONDS_PER_RUN:-60}" \
      --clients "${CLIENTS:-8}" --agents "${AGENTS:-8}" --go-bin "$out/memsvc" --out "$out/steady-$svc-$store" >/dev/null
    echo "=== loadfault $svc $store" >&2
    node "$root/scripts/loadfault/loadfault.js" --service "$svc" --store "$store" --faults --seconds "${SECONDS_PER_RUN:-60}" \
      --clients "${CLIENTS:-8}" --agents "${AGENTS:-8}" --go-bin "$out/memsvc" --out "$out/fault-$svc-$store" >/dev/null
  done
done
for svc in ${SERVICES:-node go}; do
  for store in ${STORES:-dir redis}; do
    echo "=== flood $svc $store" >&2
    # budgets that leave each service's pool a few tens of MB (Node 72, Go 56), so the flood fills it
    budget=${BUDGET:-$([ "$svc" = node ] && echo 512M || echo 256M)}
    node "$root/scripts/loadfault/flood.js" --service "$svc" --store "$store" --budget "$budget" \
      --phase-seconds "${PHASE_SECONDS:-15}" --rounds "${ROUNDS:-3}" --go-bin "$out/memsvc" --out "$out/flood-$svc-$store" >/dev/null
  done
done
node "$root/scripts/loadfault/report.js" "$out" | tee "$out/summary.md"

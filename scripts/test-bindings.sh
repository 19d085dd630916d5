#!/usr/bin/env bash
# Runs the Python, Node and Go binding suites (and their examples' tests)
# against a built tree: scripts/test-bindings.sh [BUILD_DIR]   (default build/default)
#
# A missing toolchain prints "skipped: <why>" and does not fail; a suite that
# ran zero tests fails. Each runner's own summary line is printed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build/default}" 2>/dev/null && pwd) || { echo "test-bindings: no build dir ${1:-build/default}: run make build" >&2; exit 1; }
lib="$build/core/libkvmem.so.0"
fixture="$build/bindings/scenario.json"
for f in "$lib" "$fixture"; do
  [ -f "$f" ] || { echo "test-bindings: $f is missing: run make build" >&2; exit 1; }
done
export KVMEM_LIBRARY="$lib" KVMEM_FIXTURE="$fixture"

failed=() ran=() skipped=()
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

# run NAME COUNT COMMAND...: runs the command, shows its output, and fails it
# when it ran zero tests. COUNT is a regex whose matches' numbers are summed,
# or "lines:REGEX" to count the matching lines.
run() {
  local name=$1 count_re=$2
  shift 2
  echo "=== bindings: $name: $*"
  "$@" 2>&1 | tee "$log/$name.out"
  local rc=${PIPESTATUS[0]}
  local n
  if [[ $count_re == lines:* ]]; then
    n=$(grep -Ec "${count_re#lines:}" "$log/$name.out")
  else
    n=$(grep -Eo "$count_re" "$log/$name.out" | grep -Eo '[0-9]+' | awk '{s+=$1} END {print s+0}')
  fi
  if [ "$rc" -ne 0 ]; then
    failed+=("$name (exit $rc)")
  elif [ "$n" -eq 0 ]; then
    failed+=("$name (ran zero tests)")
  else
    ran+=("$name ($n tests)")
  fi
}
skip() { echo "=== bindings: $1: skipped: $2"; skipped+=("$1: $2"); }

# ---- Python: Debian's interpreter, which has python3-pytest and python3-numpy
py=${KVMEM_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then
  skip python "$py not found (apt-get install python3)"
elif ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
  skip python "$py cannot import pytest and numpy (apt-get install python3-pytest python3-numpy)"
else
  # -rs: a skipped test says why (kvmem.torch's without torch, the model's without the model)
  run python '[0-9]+ passed' "$py" -m pytest -p no:cacheprovider -q -rs "$root/bindings/python/tests" "$root/examples/python"
fi

# ---- Node: node >= 18 (node:test) and koffi from bindings/node/node_modules
if ! command -v node >/dev/null; then
  skip node "node not found (apt-get install nodejs npm)"
elif [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 18 ]; then
  skip node "node $(node --version) is older than 18 (node:test)"
elif [ ! -d "$root/bindings/node/node_modules/koffi" ]; then
  skip node "koffi is not installed (scripts/install-deps.sh, or: cd bindings/node && npm ci)"
else
  run node '^# pass [0-9]+' node --test "$root/bindings/node/test/" "$root/examples/node/"
fi

# ---- Go: cgo against the build tree
if ! command -v go >/dev/null; then
  skip go "go not found (apt-get install golang-go)"
elif ! command -v "${CC:-cc}" >/dev/null; then
  skip go "no C compiler for cgo"
else
  export CGO_ENABLED=1 CGO_CFLAGS="-I$root/include" \
         CGO_LDFLAGS="-L$build/core -Wl,-rpath,$build/core" GOFLAGS=-count=1
  export GOCACHE=${GOCACHE:-$build/bindings/gocache} GOPATH=${GOPATH:-$build/bindings/gopath} GOPROXY=off
  run go 'lines:^--- PASS' bash -c "cd '$root/bindings/go' && go vet ./... && go test -v ./... && cd '$root/examples/go/memsvc' && go vet ./... && go test -v ./..."
fi

echo "=== bindings summary"
for r in "${ran[@]}"; do echo "  passed: $r"; done
for s in "${skipped[@]}"; do echo "  skipped: $s"; done
for f in "${failed[@]}"; do echo "  FAILED: $f"; done
[ ${#failed[@]} -eq 0 ]

#!/usr/bin/env bash
# Runs the Python, Node and Go binding suites (and their examples' tests)
# against a built tree, then installs each binding as a user would and runs
# its README example (scripts/test-packages.sh):
#   scripts/test-bindings.sh [BUILD_DIR]   (default build/default)
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
failed=() ran=() skipped=()
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
# The scenario fixture is exact for one kernel table: run with KVMEM_CPU set
# (as an AVX2-only machine would run), the suites compare with a fixture the
# same kernels computed, as that machine's own build would have made it.
if [ -n "${KVMEM_CPU:-}" ]; then
  "$build/bindings/kvmem_scenario_fixture" "$log/scenario-env.json" >/dev/null || { echo "test-bindings: the fixture program failed" >&2; exit 1; }
  fixture=$log/scenario-env.json
fi
export KVMEM_LIBRARY="$lib" KVMEM_FIXTURE="$fixture"

# run NAME COUNT COMMAND...: runs the command, shows its output, and fails it
# when it ran zero tests. COUNT is a regex whose matches' numbers are summed,
# or "lines:REGEX" to count the matching lines.
run() {
  local name=$1 count_re=$2
  shift 2
  echo "=== bindings: $name: $*"
  "$@" 2>&1 | tee "$log/$name.out"
  tally "$name" "$count_re" "${PIPESTATUS[0]}"
}
# start NAME COMMAND...: runs the command in the background, its output kept;
# finish NAME COUNT: waits for it, then shows and counts its output as run does.
# For suites independent of each other (own environment, own files), so the
# two cores are both busy while one suite waits on a subprocess or a file.
declare -A started=()
start() {
  local name=$1
  shift
  echo "=== bindings: $name: started in the background: $*"
  "$@" >"$log/$name.out" 2>&1 &
  started[$name]=$!
}
finish() {
  local name=$1 count_re=$2 rc=0
  wait "${started[$name]}" || rc=$?
  echo "=== bindings: $name: its output"
  cat "$log/$name.out"
  tally "$name" "$count_re" "$rc"
}
# tally NAME COUNT RC: records NAME as failed, empty or passed
tally() {
  local name=$1 count_re=$2 rc=$3
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

# The packages (scripts/test-packages.sh): installed as a user would, outside
# the repository. Node and Go share one Release build of the library alone,
# kept in the build tree so a later run rebuilds only what changed; npm pack
# and cmake --install reuse it through KVMEM_BUILD_DIR (same configuration as
# bindings/node/scripts/build.js). pip builds as a user's pip does, with no
# environment variable (in bindings/python/build/cmake, reused the same way).
pkglib="$build/packages/libkvmem"
pkglib_state=""
pkglib_build() {
  if [ -z "$pkglib_state" ]; then
    echo "=== bindings: packages: libkvmem (Release, KVMEM_LIBRARY_ONLY) in $pkglib"
    if cmake -S "$root" -B "$pkglib" -DCMAKE_BUILD_TYPE=Release -DKVMEM_LIBRARY_ONLY=ON -DKVMEM_CUDA=OFF \
         -DKVMEM_VULKAN=OFF -DKVMEM_BUILD_TESTS=OFF -DKVMEM_BUILD_TOOLS=OFF -DKVMEM_BUILD_BENCH=OFF >"$log/pkglib.out" 2>&1 &&
       cmake --build "$pkglib" --target kvmem kvmem_static -j "$(nproc 2>/dev/null || echo 2)" >>"$log/pkglib.out" 2>&1; then
      pkglib_state=ok
    else
      cat "$log/pkglib.out"
      pkglib_state=failed
      failed+=("packages: the library build in $pkglib")
    fi
  fi
  [ "$pkglib_state" = ok ]
}
# package NAME LANG: scripts/test-packages.sh LANG, its "ok:" lines counted
package() {
  local name=$1 lang=$2
  pkglib_build || return 0
  echo "=== bindings: $name: scripts/test-packages.sh $lang"
  "$root/scripts/test-packages.sh" "$lang" "$pkglib" 2>&1 | tee "$log/$name.out"
  local rc=${PIPESTATUS[0]}
  local n
  n=$(grep -c '^ok: ' "$log/$name.out" || true)
  if [ "$rc" -eq 77 ]; then
    skipped+=("$name: $(sed -n 's/^skipped: //p' "$log/$name.out" | head -1)")
  elif [ "$rc" -ne 0 ]; then
    failed+=("$name (exit $rc)")
  elif [ "$n" -eq 0 ]; then
    failed+=("$name (ran zero checks)")
  else
    ran+=("$name ($n checks)")
  fi
}

# ---- Python: Debian's interpreter, which has python3-pytest and python3-numpy
py=${KVMEM_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then
  skip python "$py not found (apt-get install python3)"
elif ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
  skip python "$py cannot import pytest and numpy (apt-get install python3-pytest python3-numpy)"
else
  # Both kvmem's kernels and PyTorch's pick their code by this CPU, so a suite that
  # passed here can fail on CI's other machine: run it again as an AVX2-only machine
  # would and on the plain kernels (each setting falls back to what the CPU has). The
  # scenario fixture is exact for one kernel table, so each run computes its own.
  # The three runs share no file (pytest's tmp_path is per session): the two
  # reruns go in the background beside the first.
  for isa in avx2:avx2 scalar:default; do
    KVMEM_CPU=${isa%%:*} "$build/bindings/kvmem_scenario_fixture" "$log/scenario-${isa%%:*}.json" >/dev/null
    start "python-${isa%%:*}" env KVMEM_CPU="${isa%%:*}" ATEN_CPU_CAPABILITY="${isa#*:}" \
      KVMEM_FIXTURE="$log/scenario-${isa%%:*}.json" \
      "$py" -m pytest -p no:cacheprovider -q "$root/bindings/python/tests" "$root/examples/python"
  done
  # -rs: a skipped test says why (kvmem.torch's without torch, the model's without the model)
  run python '[0-9]+ passed' "$py" -m pytest -p no:cacheprovider -q -rs "$root/bindings/python/tests" "$root/examples/python"
  finish python-avx2 '[0-9]+ passed'
  finish python-scalar '[0-9]+ passed'
  KVMEM_PYTHON=$py package python-package python
fi

# ---- Node: node >= 18 (node:test) and koffi from bindings/node/node_modules
if ! command -v node >/dev/null; then
  skip node "node not found (apt-get install nodejs npm)"
elif [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 18 ]; then
  skip node "node $(node --version) is older than 18 (node:test)"
elif [ ! -d "$root/bindings/node/node_modules/koffi" ]; then
  skip node "koffi is not installed (scripts/install-deps.sh, or: cd bindings/node && npm ci)"
else
  # the example service requires 'kvmem' as an installed package: node_modules/kvmem
  # links to the checkout's binding, as npm links a file: dependency
  mkdir -p "$root/examples/node/memory-service/node_modules"
  ln -sfn "$root/bindings/node" "$root/examples/node/memory-service/node_modules/kvmem"
  run node '^# pass [0-9]+' node --test "$root/bindings/node/test/" "$root/examples/node/"
  package node-package node
fi

# ---- Go: cgo against the build tree
if ! command -v go >/dev/null; then
  skip go "go not found (apt-get install golang-go)"
elif ! command -v "${CC:-cc}" >/dev/null; then
  skip go "no C compiler for cgo"
elif ! command -v pkg-config >/dev/null; then
  skip go "pkg-config not found (apt-get install pkgconf): the binding finds kvmem with it"
elif [ ! -f "$build/kvmem-uninstalled.pc" ]; then
  skip go "$build has no kvmem-uninstalled.pc (configured before it existed: re-run cmake)"
else
  # `#cgo pkg-config: kvmem` finds the build tree's kvmem-uninstalled.pc
  # the binding's one link recipe (bindings/go/README.md): pkg-config's libdir as the rpath
  export PKG_CONFIG_PATH="$build${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export CGO_ENABLED=1 CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" GOFLAGS=-count=1
  export GOCACHE=${GOCACHE:-$build/bindings/gocache} GOPATH=${GOPATH:-$build/bindings/gopath} GOPROXY=off
  run go 'lines:^--- PASS' bash -c "cd '$root/bindings/go' && go vet ./... && go test -v ./... && go vet -tags kvmem_static ./... && cd '$root/examples/go/memsvc' && go vet ./... && go test -v ./..."
  package go-package go
fi

echo "=== bindings summary"
for r in "${ran[@]}"; do echo "  passed: $r"; done
for s in "${skipped[@]}"; do echo "  skipped: $s"; done
for f in "${failed[@]}"; do echo "  FAILED: $f"; done
[ ${#failed[@]} -eq 0 ]

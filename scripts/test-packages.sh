#!/usr/bin/env bash
# The bindings as a user installs them, outside the repository, each
# language's README example run with no environment variable at all:
#   scripts/test-packages.sh python|node|go LIBBUILD
# LIBBUILD is a CMake build of the library alone (KVMEM_LIBRARY_ONLY, Release,
# targets kvmem and kvmem_static) that the packagers reuse through
# KVMEM_BUILD_DIR (scripts/test-bindings.sh makes it once per build tree).
#   python: pip install --no-index ./bindings/python (in-tree backend, nothing
#           to download) into plain venvs of the PATH's python3 and of
#           /usr/bin/python3: import kvmem, the kvmem tool, python -m kvmem; the
#           wheel's tag and contents; --no-build-isolation into a venv with
#           Debian's numpy: the README example and examples/python copied out
#           of the tree; KVMEM_LIBRARY still overrides
#   node:   npm pack, npm install of the tarball into a fresh project (offline:
#           koffi is packed from bindings/node/node_modules): the README example,
#           every name of index.d.ts imported as an ES module and required as
#           CommonJS, examples/node/memory-service copied out of the tree
#   go:     cmake --install into a prefix, its pkg-config files; the module as
#           `go get` fetches it once tagged bindings/go/vX.Y.Z (a file:// module
#           proxy), a fresh module's README program built shared (rpath) and
#           -tags kvmem_static, examples/go/memsvc copied out of the tree (the
#           prefix and Go's caches sit beside LIBBUILD, reused)
# Prints "ok: ..." per check; exit 77 with "skipped: <why>" without a tool.
set -euo pipefail
lang=$1
libbuild=$(cd "$2" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
skip() { echo "skipped: $*"; exit 77; }
ok() { echo "ok: $lang package: $*"; }
fail() { echo "FAILED: $lang package: $*" >&2; exit 1; }
# the first ```LANG block of a README
example() { python3 - "$1" "$2" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
m = re.search(r"```" + sys.argv[2] + r"\n(.*?)```", text, re.S)
sys.exit(f"no {sys.argv[2]} block in {sys.argv[1]}") if not m else sys.stdout.write(m.group(1))
EOF
}
# a clean environment: no KVMEM_*, no PYTHONPATH, no NODE_PATH, no CGO flags
clean() { env -i PATH="$1" HOME="$tmp" "${@:2}"; }
export KVMEM_BUILD_DIR=$libbuild
unset KVMEM_LIBRARY KVMEM_FIXTURE

python_package() {
  local py=${KVMEM_PYTHON:-/usr/bin/python3}
  "$py" -c 'import ensurepip' 2>/dev/null || skip "python: no venv with pip (apt-get install python3-venv)"
  command -v cmake >/dev/null || skip "python: cmake not found (the package builds libkvmem with it)"
  mkdir -p "$tmp/run" && cd "$tmp/run"
  local want
  want=$(sed -n 's/^#define KVMEM_VERSION_STRING "\(.*\)"/\1/p' "$root/include/kvmem.h")
  # 1) the README's install command in a plain venv (no system packages, no wheel,
  #    no index: offline) of the PATH's python3 and of Debian's, with no environment
  #    variable; the CMake build lands in bindings/python/build/cmake and is reused
  local pys=() p
  for p in "$(command -v python3 || true)" /usr/bin/python3; do
    [ -n "$p" ] && [ -x "$p" ] && "$p" -c 'import ensurepip' 2>/dev/null && pys+=("$p")
  done
  local i=0 venv
  for p in "${pys[@]}"; do
    i=$((i + 1)); venv=$tmp/plain$i
    "$p" -m venv "$venv"
    ! "$venv/bin/python" -c 'import wheel' 2>/dev/null || echo "note: $venv has the wheel package"
    clean "/usr/bin:/bin" "$venv/bin/pip" install --no-index "$root/bindings/python" >"$tmp/pip$i.log" 2>&1 ||
      { cat "$tmp/pip$i.log"; fail "pip install --no-index ./bindings/python in a plain venv of $p"; }
    local where
    where=$(clean /usr/bin:/bin "$venv/bin/python" -c 'import kvmem; print(kvmem.LIBRARY_PATH)') || fail "import kvmem ($p)"
    [[ $where == "$venv/lib/"*"/site-packages/kvmem/libkvmem.so.0" ]] || fail "loaded $where, not the packaged library"
    # the kvmem tool: on the venv's PATH, the library's version
    local ver=--version
    grep -q -- '--version' "$root/tools/main.c" || ver=version  # `--version` comes with tools/ of this tree or later
    clean "$venv/bin:/usr/bin:/bin" kvmem $ver >ver.txt 2>&1 || { cat ver.txt; fail "kvmem $ver from the venv ($p)"; }
    grep -q "$want" ver.txt || { cat ver.txt; fail "kvmem $ver does not say $want"; }
    clean /usr/bin:/bin "$venv/bin/python" -m kvmem >self.txt 2>&1 && grep -q '^self-check ok$' self.txt ||
      { cat self.txt; fail "python -m kvmem ($p)"; }
    ok "pip install --no-index ./bindings/python in a plain venv of $p ($("$p" --version 2>&1)): import kvmem, kvmem $ver, python -m kvmem, no environment variable"
  done
  [ "$i" -ge 1 ] || skip "python: no python3 with venv"
  # 2) the wheel: platform tag from the binaries' glibc needs, contents, LICENSE
  clean /usr/bin:/bin "$tmp/plain1/bin/pip" wheel --no-index --no-deps -w "$tmp/dist" "$root/bindings/python" >"$tmp/wheel.log" 2>&1 ||
    { cat "$tmp/wheel.log"; fail "pip wheel ./bindings/python"; }
  local whl
  whl=$(ls "$tmp"/dist/kvmem-*.whl)
  "$py" - "$whl" "$root/bindings/python/backend" <<'PYEOF' || fail "the wheel $whl"
import re, sys, tempfile, zipfile
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import kvmem_backend as b
whl = Path(sys.argv[1])
z = zipfile.ZipFile(whl)
names = set(z.namelist())
need = {"kvmem/__init__.py", "kvmem/py.typed", "kvmem/libkvmem.so.0", "kvmem-0.1.0.data/scripts/kvmem",
        "kvmem-0.1.0.dist-info/LICENSE", "kvmem-0.1.0.dist-info/METADATA", "kvmem-0.1.0.dist-info/RECORD"}
missing = need - names
assert not missing, f"missing {missing}"
assert "MIT License" in z.read("kvmem-0.1.0.dist-info/LICENSE").decode()
assert "License: MIT" in z.read("kvmem-0.1.0.dist-info/METADATA").decode()
with tempfile.TemporaryDirectory() as d:
    needs = []
    for n in ("kvmem/libkvmem.so.0", "kvmem-0.1.0.data/scripts/kvmem"):
        z.extract(n, d)
        needs += b.glibc_needs(Path(d) / n)
m = re.search(r"-py3-none-(manylinux_(\d+)_(\d+)_x86_64|linux_\w+)\.whl$", whl.name)
assert m, whl.name
if m.group(2):
    assert max(needs) == (int(m.group(2)), int(m.group(3))), (whl.name, max(needs))
print(f"{whl.name}: glibc >= {max(needs)[0]}.{max(needs)[1]} (the newest symbol version the binaries need)")
PYEOF
  ok "$(basename "$whl"): kvmem/, py.typed, libkvmem.so.0, the kvmem tool, LICENSE; tagged by the glibc its binaries need"
  # 3) without build isolation, in a venv seeing Debian's numpy: the README example
  #    and the examples copied out of the tree
  "$py" -c 'import numpy' 2>/dev/null || { echo "skipped: python examples: $py has no numpy (apt-get install python3-numpy)"; return 0; }
  "$py" -m venv --system-site-packages "$tmp/venv"
  "$tmp/venv/bin/pip" install -q --no-build-isolation --no-index "$root/bindings/python" >"$tmp/pip.log" 2>&1 ||
    { cat "$tmp/pip.log"; fail "pip install --no-build-isolation --no-index ./bindings/python"; }
  example "$root/bindings/python/README.md" python >example.py
  clean /usr/bin:/bin "$tmp/venv/bin/python" example.py >out.txt 2>&1 || { cat out.txt; fail "README example"; }
  grep -q '^AgentInfo(n_tokens=96, ' out.txt && grep -q '^96 tokens back$' out.txt || { cat out.txt; fail "README example printed the wrong memory"; }
  # KVMEM_LIBRARY still overrides, and a wrong one is an error naming it
  where=$(clean /usr/bin:/bin env KVMEM_LIBRARY="$libbuild/core/libkvmem.so.0" "$tmp/venv/bin/python" -c 'import kvmem; print(kvmem.LIBRARY_PATH)')
  [ "$where" = "$libbuild/core/libkvmem.so.0" ] || fail "KVMEM_LIBRARY did not override: $where"
  if clean /usr/bin:/bin env KVMEM_LIBRARY="$tmp/none.so" "$tmp/venv/bin/python" -c 'import kvmem' >err.txt 2>&1 ||
     ! grep -q "$tmp/none.so (no such file)" err.txt; then
    cat err.txt; fail "a missing KVMEM_LIBRARY should fail the import, naming it"
  fi
  ok "pip install --no-build-isolation: the README example runs with no environment variable; KVMEM_LIBRARY overrides"
  mkdir "$tmp/ex" && cp "$root/examples/python/agent_loop.py" "$root/examples/python/torch_agent.py" "$tmp/ex/"
  cd "$tmp/ex"
  clean /usr/bin:/bin "$tmp/venv/bin/python" agent_loop.py >loop.txt 2>&1 || { cat loop.txt; fail "examples/python/agent_loop.py outside the tree"; }
  grep -q 'memory: 52 tokens in 6 blocks' loop.txt && grep -q 'allergic to peanuts' loop.txt || { cat loop.txt; fail "agent_loop.py printed the wrong memory"; }
  ok "examples/python/agent_loop.py copied out of the tree runs on the installed package"
  local model=${KVMEM_TEST_MODEL:-$root/../shared/models/stories260K.bin}
  if ! "$tmp/venv/bin/python" -c 'import torch' 2>/dev/null; then
    echo "skipped: examples/python/torch_agent.py: no torch (apt-get install python3-torch)"
  elif [ ! -f "$model" ] || [ ! -f "$(dirname "$model")/tok512.bin" ]; then
    echo "skipped: examples/python/torch_agent.py: no model at $model"
  else
    clean /usr/bin:/bin "$tmp/venv/bin/python" torch_agent.py --model "$model" --state "$tmp/ex" >torch.txt 2>&1 ||
      { cat torch.txt; fail "examples/python/torch_agent.py outside the tree"; }
    grep -q 'logits identical to phase 1' torch.txt || { cat torch.txt; fail "torch_agent.py: the reloaded agent's logits differ"; }
    ok "examples/python/torch_agent.py copied out of the tree runs on the installed package and the real model"
  fi
}

node_package() {
  command -v npm >/dev/null || skip "node: npm not found (apt-get install npm)"
  [ -d "$root/bindings/node/node_modules/koffi" ] || skip "node: koffi is not installed (cd bindings/node && npm ci)"
  local npmq=(--no-audit --no-fund --loglevel=error)
  # npm pack runs prepack: the library (from KVMEM_BUILD_DIR) and the C sources go in
  (cd "$root/bindings/node" && npm pack "${npmq[@]}" --pack-destination "$tmp" >"$tmp/pack.log" 2>&1) ||
    { cat "$tmp/pack.log"; fail "npm pack"; }
  local tgz
  tgz=$(ls "$tmp"/kvmem-*.tgz)
  tar tzf "$tgz" >"$tmp/tgz.txt"
  grep -q '^package/prebuilds/.*/libkvmem.so.0$' "$tmp/tgz.txt" || fail "$tgz has no prebuilt library"
  grep -q '^package/csrc/core/CMakeLists.txt$' "$tmp/tgz.txt" || fail "$tgz has no C sources for other platforms"
  [ ! -e "$root/bindings/node/csrc" ] || fail "npm pack left bindings/node/csrc behind"
  ok "npm pack: $(basename "$tgz") with a prebuilt library and the C sources"
  # offline: koffi comes from bindings/node/node_modules, packed
  (cd "$tmp" && npm pack "${npmq[@]}" "$root/bindings/node/node_modules/koffi" >/dev/null 2>&1) || fail "npm pack koffi"
  mkdir "$tmp/proj" && cd "$tmp/proj"
  npm init -y >/dev/null
  npm install --offline "${npmq[@]}" "$tmp"/koffi-*.tgz "$tgz" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "npm install $tgz into a fresh project"; }
  ok "npm install of the tarball into a fresh project (offline)"
  example "$root/bindings/node/README.md" js >example.js
  local nodebin
  nodebin=$(dirname "$(command -v node)")
  clean "$nodebin:/usr/bin:/bin" node example.js >out.txt 2>&1 || { cat out.txt; fail "README example"; }
  cat out.txt
  grep -q "nTokens: 96, nBlocks: 6, nSealed: 6" out.txt && [ -s alice.safetensors ] || fail "README example printed the wrong memory"
  local where
  where=$(clean "$nodebin:/usr/bin:/bin" node -p "require('kvmem').libraryPath")
  [[ $where == "$tmp/proj/node_modules/kvmem/prebuilds/"*"/libkvmem.so.0" ]] || fail "loaded $where, not the packaged library"
  ok "the README example runs with no environment variable, on the packaged $where"
  # every value index.d.ts declares, imported by name as an ES module and required as CommonJS
  clean "$nodebin:/usr/bin:/bin" node -e '
    const fs = require("fs");
    const dts = fs.readFileSync("node_modules/kvmem/index.d.ts", "utf8").replace(/\/\*[\s\S]*?\*\//g, "");
    const names = new Set();
    for (const m of dts.matchAll(/^export (?:declare )?(?:abstract )?(?:class|function) (\w+)/gm)) names.add(m[1]);
    for (const m of dts.matchAll(/^export const ([^;]+);/gm))
      for (const p of m[1].split(/,(?![^{]*})/)) names.add(p.trim().split(":")[0].trim());
    fs.writeFileSync("names.json", JSON.stringify([...names]));
    fs.writeFileSync("all.mjs", `import kvmem, { ${[...names].join(", ")} } from "kvmem";\n` +
      `const v = [${[...names].join(", ")}];\nif (v.some((x, i) => x === undefined || x !== kvmem[${JSON.stringify([...names])}[i]])) throw new Error("mismatch");\n` +
      "console.log(\"esm: \" + v.length + \" names\");\n");' || fail "reading the installed index.d.ts"
  clean "$nodebin:/usr/bin:/bin" node all.mjs >esm.txt 2>&1 || { cat esm.txt; fail "import { ...every declared name } from 'kvmem' (ESM)"; }
  clean "$nodebin:/usr/bin:/bin" node -e '
    const k = require("kvmem"), names = require("./names.json");
    const miss = names.filter((n) => k[n] === undefined);
    if (miss.length || names.length !== Object.keys(k).length) throw new Error(`require: missing ${miss}, ${Object.keys(k).length} keys`);
    console.log(`cjs: ${names.length} names`);' >cjs.txt 2>&1 || { cat cjs.txt; fail "require('kvmem') (CommonJS)"; }
  grep -q '^esm: 108 names$' esm.txt && grep -q '^cjs: 108 names$' cjs.txt || { cat esm.txt cjs.txt; fail "not 108 names both ways"; }
  grep -q '^package/LICENSE$' "$tmp/tgz.txt" && [ ! -e "$root/bindings/node/LICENSE" ] || fail "the tarball has no LICENSE (or npm pack left bindings/node/LICENSE behind)"
  ok "the 108 names of index.d.ts import by name as an ES module and require as CommonJS; LICENSE in the tarball"
  # the example service copied out of the tree, on the installed package
  mkdir "$tmp/svc" && cp -r "$root/examples/node/memory-service/server.js" "$root/examples/node/memory-service/package.json" "$root/examples/node/memory-service/lib" "$tmp/svc/"
  cd "$tmp/svc"
  npm install --offline "${npmq[@]}" "$tmp"/koffi-*.tgz "$tgz" >"$tmp/svc-install.log" 2>&1 ||
    { cat "$tmp/svc-install.log"; fail "npm install in the copied examples/node/memory-service"; }
  serve "Node memory-service" env -i PATH="$nodebin:/usr/bin:/bin" HOME="$tmp" PORT=0 node server.js
  ok "examples/node/memory-service copied out of the tree serves requests on the installed package"
}

# serve WHAT CMD...: starts a service that prints "listening on http://HOST:PORT"
# (PORT=0), checks it answers from its kvmem pool (the agent list, a 404 for an
# unknown agent), and stops it. CMD is a program, not a shell function: a
# function would run in a subshell whose kill leaves the service running.
serve() {
  local what=$1
  shift
  "$@" >"$tmp/serve.log" 2>&1 &
  local pid=$! url="" i
  for i in $(seq 1 100); do
    url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.log" | head -1 || true)
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  [ -n "$url" ] || { kill "$pid" 2>/dev/null; cat "$tmp/serve.log"; fail "$what did not start"; }
  local rc=0
  node -e '
    const url = process.argv[1];
    (async () => {
      const list = await fetch(`${url}/agents`);
      const body = await list.json();
      if (list.status !== 200 || !Array.isArray(body.agents)) throw new Error(`GET /agents: ${list.status} ${JSON.stringify(body)}`);
      const none = await fetch(`${url}/agents/nobody`);
      const err = await none.text();
      if (none.status !== 404 || !/not.?found|no agent/i.test(err)) throw new Error(`GET /agents/nobody: ${none.status} ${err}`);
      console.log(`${url}: GET /agents ${list.status}, GET /agents/nobody ${none.status}`);
    })().catch((e) => { console.error(e.message); process.exit(1); });' "$url" || rc=$?
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  [ "$rc" -eq 0 ] || { cat "$tmp/serve.log"; fail "$what at $url"; }
}

go_package() {
  command -v go >/dev/null || skip "go: go not found (apt-get install golang-go)"
  command -v "${CC:-cc}" >/dev/null || skip "go: no C compiler for cgo"
  command -v pkg-config >/dev/null || skip "go: pkg-config not found (apt-get install pkgconf)"
  # A prefix and a Go build cache of their own, at fixed places beside the
  # library build: Go 1.19 caches the binding's cgo link flags without the
  # pkg-config output they came from, so a prefix at a new path each run (or
  # the build tree's flags from the in-repo suite) would be linked stale.
  local prefix=$libbuild/../prefix
  rm -rf "$prefix"
  cmake --install "$libbuild" --prefix "$prefix" >/dev/null
  prefix=$(cd "$prefix" && pwd)
  export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
  local want
  want=$(sed -n 's/^#define KVMEM_VERSION_STRING "\(.*\)"/\1/p' "$root/include/kvmem.h")
  [ "$(pkg-config --modversion kvmem)" = "$want" ] || fail "kvmem.pc says $(pkg-config --modversion kvmem), the header $want"
  local libdir inc
  libdir=$(cd "$(pkg-config --variable=libdir kvmem)" && pwd)
  inc=$(pkg-config --cflags-only-I kvmem | sed 's/^-I//; s/ *$//')
  [ "$libdir" = "$prefix/lib" ] && [ -f "$inc/kvmem.h" ] && [ -f "$libdir/libkvmem.so.0" ] || fail "kvmem.pc points at $libdir and $inc"
  pkg-config --libs kvmem | grep -q -- '-lkvmem' || fail "pkg-config --libs kvmem: $(pkg-config --libs kvmem)"
  pkg-config --static --libs kvmem | grep -q -- '-ldl' || fail "pkg-config --static --libs kvmem lacks -ldl"
  [ -f "$(pkg-config --libs kvmem-static | awk '{print $1}')" ] || fail "kvmem-static.pc: $(pkg-config --libs kvmem-static)"
  ok "cmake --install: kvmem.pc and kvmem-static.pc name the prefix's header and libraries (version $want)"
  # The module as `go get` fetches it once the repository is tagged bindings/go/vX.Y.Z:
  # a file:// module proxy holding what the go command makes of that tag (the files
  # of bindings/go, and the repository's LICENSE, which it adds to a nested module)
  local proxy=$tmp/goproxy mpath=github.com/kvmem/kvmem/bindings/go
  python3 - "$root" "$proxy" "$mpath" "v$want" <<'PYEOF' || fail "making the module zip"
import json, os, sys, zipfile
root, proxy, mpath, ver = sys.argv[1:]
d = os.path.join(proxy, mpath, "@v")
os.makedirs(d)
src = os.path.join(root, "bindings", "go")
with zipfile.ZipFile(os.path.join(d, ver + ".zip"), "w") as z:
    for name in sorted(os.listdir(src)):
        if os.path.isfile(os.path.join(src, name)) and not os.path.islink(os.path.join(src, name)):
            z.write(os.path.join(src, name), f"{mpath}@{ver}/{name}")
    if not os.path.exists(os.path.join(src, "LICENSE")):
        z.write(os.path.join(root, "LICENSE"), f"{mpath}@{ver}/LICENSE")
open(os.path.join(d, ver + ".mod"), "w").write(open(os.path.join(src, "go.mod")).read())
json.dump({"Version": ver, "Time": "2026-01-01T00:00:00Z"}, open(os.path.join(d, ver + ".info"), "w"))
open(os.path.join(d, "list"), "w").write(ver + "\n")
PYEOF
  unset CGO_CFLAGS CGO_LDFLAGS
  export GOFLAGS=-mod=mod GOPROXY=file://$proxy GOSUMDB=off CGO_ENABLED=1
  export GOCACHE=$libbuild/../gocache GOPATH=$libbuild/../gopath
  go clean -modcache  # this run's binding, not one fetched by an earlier run at the same version
  # a module of its own outside the repository: the README's program, `go get` of the tagged module
  mkdir "$tmp/mod" && cd "$tmp/mod"
  printf 'module example.com/kvmemuser\n\ngo 1.19\n' >go.mod
  example "$root/bindings/go/README.md" go >main.go
  go get "$mpath@v$want" >get.log 2>&1 || { cat get.log; fail "go get $mpath@v$want from the module proxy"; }
  grep -q "^require $mpath v$want" go.mod && python3 -m zipfile -l "$proxy/$mpath/@v/v$want.zip" | grep -q "@v$want/LICENSE " ||
    { cat go.mod; fail "go.mod does not require $mpath v$want, or the module has no LICENSE"; }
  ok "go get $mpath@v$want (tag bindings/go/v$want) into a fresh module, through a module proxy"
  # the one link recipe: pkg-config finds kvmem, its libdir goes into the rpath
  CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" go build -o app-shared . || fail "go build against the installed prefix"
  go build -tags kvmem_static -o app-static . || fail "go build -tags kvmem_static"
  local app
  for app in app-shared app-static; do
    rm -f alice.safetensors
    clean /usr/bin:/bin "./$app" >out.txt 2>&1 || { cat out.txt; fail "$app"; }
    grep -q '{NTokens:96 NBlocks:6 NSealed:6 ' out.txt && [ -s alice.safetensors ] || { cat out.txt; fail "$app printed the wrong memory"; }
  done
  cat out.txt
  if command -v readelf >/dev/null; then
    readelf -d app-shared >shared.txt
    readelf -d app-static >static.txt
    grep -q 'NEEDED.*\[libkvmem.so.0\]' shared.txt || fail "app-shared does not link libkvmem.so.0"
    local rpath
    rpath=$(sed -n 's/.*(R[UN]*PATH).*\[\(.*\)\]/\1/p' shared.txt | head -1)
    [ -n "$rpath" ] && [ "$(cd "$rpath" 2>/dev/null && pwd)" = "$libdir" ] || fail "app-shared's rpath '$rpath' is not $libdir"
    ! grep -q 'NEEDED.*libkvmem' static.txt || fail "app-static still needs libkvmem.so"
  fi
  ok "a fresh module's README program runs with no environment variable, shared (rpath) and -tags kvmem_static"
  # examples/go/memsvc copied out of the tree: its replace (the checkout) dropped, the tagged module fetched
  mkdir "$tmp/memsvc" && cd "$tmp/memsvc"
  local f
  for f in "$root"/examples/go/memsvc/*.go "$root/examples/go/memsvc/go.mod"; do
    [[ $f == *_test.go ]] || cp "$f" .
  done
  go mod edit -dropreplace="$mpath" -require="$mpath@v$want"
  go mod tidy >tidy.log 2>&1 || { cat tidy.log; fail "go mod tidy in the copied memsvc"; }
  CGO_LDFLAGS="-Wl,-rpath,$(pkg-config --variable=libdir kvmem)" go build -o memsvc . || fail "go build of the copied memsvc"
  serve "Go memsvc" env -i PATH=/usr/bin:/bin HOME="$tmp" PORT=0 ./memsvc
  ok "examples/go/memsvc copied out of the tree builds on the fetched module and serves requests"
}

case $lang in
  python) python_package ;;
  node) node_package ;;
  go) go_package ;;
  *) echo "usage: $0 python|node|go LIBBUILD" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The README's examples run as written (section "Examples"; the Python and
# Node.js ones are run by their binding suites, examples/python/test_readme.py
# and examples/node/test/readme.test.js, the WebAssembly one by
# scripts/test-web.sh):
#  - C: the README holds examples/c/quickstart.c verbatim; the built example
#    prints what the README says it prints;
#  - Go: the README's program, as a module of its own outside the tree, built
#    with cgo against this build (its kvmem-uninstalled.pc) with the README's
#    link recipe as written (CGO_LDFLAGS=...$(pkg-config ...), the one
#    bindings/go/README.md gives), and with -tags kvmem_static, prints the same.
#    Skipped, saying why, without go or pkg-config, and in sanitizer builds
#    (a Go program cannot load an ASan/TSan libkvmem on its own).
# Args: SOURCE_DIR BINARY_DIR LIBKVMEM CLI CC SANITIZE
set -euo pipefail
src=$1 build=$2 san=${6:-}
want="recalled blocks 1 and 2: 32 tokens of memory"
python3 - "$src" "$want" <<'PY'
import sys, pathlib
src, want = pathlib.Path(sys.argv[1]), sys.argv[2]
readme = (src / "README.md").read_text()
example = (src / "examples/c/quickstart.c").read_text().strip()
if f"```c\n{example}\n```" not in readme:
    sys.exit("README.md does not contain examples/c/quickstart.c verbatim")
if f"`{want}`" not in readme:
    sys.exit(f"README.md no longer says the examples print '{want}': update this check with it")
PY
out=$("$build/examples/kvmem_quickstart")
echo "$out"
grep -qx "$want" <<<"$out"
grep -q "^refused: .*is invalid" <<<"$out"

if [ -n "$san" ]; then echo "Go example skipped: a sanitizer build ($san)"; exit 0; fi
command -v go >/dev/null || { echo "Go example skipped: go not found (apt-get install golang-go)"; exit 0; }
command -v pkg-config >/dev/null || { echo "Go example skipped: pkg-config not found"; exit 0; }
[ -f "$build/kvmem-uninstalled.pc" ] || { echo "Go example skipped: $build has no kvmem-uninstalled.pc"; exit 0; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$src/README.md" >"$work/main.go" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
sys.stdout.write(re.search(r"```go\n(.*?)```", s[s.index("## Examples"):], re.S).group(1))
PY
mod=$(sed -n 's/^module //p' "$src/bindings/go/go.mod")
printf 'module example.com/readme\n\ngo 1.19\n\nrequire %s v0.0.0\n\nreplace %s => %s\n' "$mod" "$mod" "$src/bindings/go" >"$work/go.mod"
bad=$(gofmt -l "$work/main.go") && [ -z "$bad" ] || { echo "FAIL: the README's Go example is not gofmt-formatted"; gofmt -d "$work/main.go"; exit 1; }
# The README's recipe, evaluated as a shell would (its $(pkg-config ...) against
# this build tree), must be the Go binding's own; the Go caches are the binding
# suite's (Go 1.19 caches cgo link flags without the pkg-config output they came from)
recipe=$(python3 - "$src/README.md" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
go = s[s.index("### Go"):s.index("```go")]
m = re.search(r"`CGO_LDFLAGS=([^`]*)`", go)
sys.exit("README.md's Go section gives no `CGO_LDFLAGS=...` recipe") if not m else print(m.group(1))
PY
)
grep -qF "CGO_LDFLAGS=\"$recipe\"" "$src/bindings/go/README.md" ||
  { echo "FAIL: the README's link recipe CGO_LDFLAGS=$recipe is not bindings/go/README.md's"; exit 1; }
grep -qF -- "-tags kvmem_static" <<<"$(sed -n '/^### Go/,/^```go/p' "$src/README.md")" ||
  { echo "FAIL: the README's Go section does not give -tags kvmem_static"; exit 1; }
export PKG_CONFIG_PATH="$build"
ldflags=$(bash -c "printf '%s' $recipe")
[ "$ldflags" = "-Wl,-rpath,$build/core" ] || { echo "FAIL: CGO_LDFLAGS=$recipe gives '$ldflags' for this build tree"; exit 1; }
gorun() { (cd "$work" && CGO_ENABLED=1 GOFLAGS=-mod=mod GOPROXY=off \
  GOCACHE="$build/bindings/gocache" GOPATH="$build/bindings/gopath" "$@"); }
out=$(CGO_LDFLAGS=$ldflags gorun go run .)
echo "Go (CGO_LDFLAGS=$recipe): $out"
[ "$out" = "$want" ]
[ -f "$build/kvmem-static-uninstalled.pc" ] || { echo "Go -tags kvmem_static skipped: $build has no kvmem-static-uninstalled.pc"; exit 0; }
out=$(gorun go run -tags kvmem_static .)
echo "Go (-tags kvmem_static): $out"
[ "$out" = "$want" ]

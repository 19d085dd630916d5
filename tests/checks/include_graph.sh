#!/usr/bin/env bash
# The shape of core/ stays as drawn (../shared/DESIGN.md, "Layout" and
# "Backend interface"). Reads the #include "..." lines of core/ and stores/,
# resolves them like the compiler (the including file's folder, then core/,
# then include/), and fails on
#  1. a cycle among the persistence rooms pool, store and format (edges: a
#     file of one room includes a header of another);
#  2. a file of core/store, core/format or stores/ that reaches a core/pool
#     header through any chain of includes;
#  3. a core/pool file that includes a core/store header other than store.h;
#  4. a circle among core's folders (each directory of core/ is a folder,
#     core/ itself the base, core/cpu/arch/* part of core/cpu), naming the
#     edges of one, unless every edge of it is listed in ALLOWED_EDGES below;
#  5. CPU kernels outside core/cpu: a file elsewhere in core/ that includes
#     a SIMD intrinsics header or is named like an instruction set's file
#     (name_avx2.c, name_avx512.c, name_wasm128.c, name_neon.c);
#  6. a second ISA dispatcher: a file of core/ other than core/cpu/dispatch.c
#     that tests what this build compiled (KVMEM_HAVE_AVX2 / _AVX512),
#     detects the CPU (__builtin_cpu_supports / _init) or reads KVMEM_CPU.
# tests/checks/include_graph_catches.sh runs this on copies of the tree with
# each rule broken on purpose and expects each failure.
# Args: SOURCE_DIR (the others of tests/CMakeLists.txt are ignored).
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$src" || exit 1
[ -d core/pool ] && [ -d core/store ] || { echo "FAIL: no core/pool or core/store under $src"; exit 1; }

declare -A deps # file -> space-separated resolved includes (paths from $src)
files=$(find core stores -name '*.[ch]' 2>/dev/null | sort)
# resolved like the compiler: the including file's folder, then core/, then include/
while IFS=$'\t' read -r f list; do deps[$f]=$list; done < <(python3 - $files <<'PYEOF'
import os, re, sys
inc = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]*)"', re.M)
for f in sys.argv[1:]:
    out = []
    for name in inc.findall(open(f, encoding='utf-8', errors='replace').read()):
        for cand in (os.path.join(os.path.dirname(f), name), os.path.join('core', name), os.path.join('include', name)):
            if os.path.isfile(cand):
                out.append(os.path.normpath(cand))
                break
    print(f + '\t' + ' '.join(out))
PYEOF
)
room() { case "$1" in core/pool/*) room=pool ;; core/store/*) room=store ;; core/format/*) room=format ;; *) room="" ;; esac; }

fail=0
# 1. room graph among pool, store, format
declare -A edge why
for f in $files; do
  room "$f"
  a=$room
  [ -n "$a" ] || continue
  for d in ${deps[$f]}; do
    room "$d"
    b=$room
    if [ -n "$b" ] && [ "$a" != "$b" ]; then
      edge["$a $b"]=1
      why["$a $b"]="$f includes $d"
    fi
  done
done
echo "room edges: $(for e in "${!edge[@]}"; do echo "${e/ / -> }"; done | sort | paste -sd, -)"
for a in pool store format; do
  for b in pool store format; do
    [ "$a" \< "$b" ] || continue
    # a cycle of three rooms holds a cycle of two or passes all three
    if [ -n "${edge["$a $b"]:-}" ] && [ -n "${edge["$b $a"]:-}" ]; then
      echo "FAIL: $a and $b include each other: ${why["$a $b"]}; ${why["$b $a"]}"
      fail=1
    fi
  done
done
for cyc in "pool store format" "pool format store"; do
  set -- $cyc
  if [ -n "${edge["$1 $2"]:-}" ] && [ -n "${edge["$2 $3"]:-}" ] && [ -n "${edge["$3 $1"]:-}" ]; then
    echo "FAIL: cycle $1 -> $2 -> $3 -> $1: ${why["$1 $2"]}; ${why["$2 $3"]}; ${why["$3 $1"]}"
    fail=1
  fi
done

# 2. nothing below the pool reaches a pool header, through any chain
for f in $files; do
  case "$f" in core/store/* | core/format/* | stores/*) ;; *) continue ;; esac
  declare -A seen=()
  declare -A from=()
  queue=("$f")
  seen[$f]=1
  while [ ${#queue[@]} -gt 0 ]; do
    cur=${queue[0]}
    queue=("${queue[@]:1}")
    for d in ${deps[$cur]:-}; do
      [ -n "${seen[$d]:-}" ] && continue
      seen[$d]=1
      from[$d]=$cur
      if [[ $d == core/pool/* ]]; then
        chain=$d
        c=$d
        while [ "${from[$c]:-}" ]; do c=${from[$c]}; chain="$c -> $chain"; done
        echo "FAIL: $f reaches a pool header: $chain"
        fail=1
        continue
      fi
      queue+=("$d")
    done
  done
  unset seen from
done

# 3. the pool sees a store through the byte-store interface only
for f in $files; do
  [[ $f == core/pool/* ]] || continue
  for d in ${deps[$f]}; do
    if [[ $d == core/store/* && $d != core/store/store.h ]]; then
      echo "FAIL: $f includes $d: the pool uses stores through core/store/store.h only"
      fail=1
    fi
  done
done

# Folder edges still allowed in a circle, "from -> to" per line (core's
# folders as above). None today: every folder of core/ includes downward.
ALLOWED_EDGES=""

# 4.-6. (one pass in Python over the resolved includes above)
dump=$(for f in $files; do printf '%s\t%s\n' "$f" "${deps[$f]}"; done)
python3 - "$ALLOWED_EDGES" <<PYEOF || fail=1
import re, sys
allowed = {tuple(x.strip() for x in line.split('->')) for line in sys.argv[1].splitlines() if '->' in line}
deps = {}
for line in """$dump""".splitlines():
    f, _, d = line.partition('\t')
    deps[f] = d.split()
def folder(path):
    parts = path.split('/')
    if parts[0] != 'core': return None
    d = '/'.join(parts[:-1])
    return 'core/cpu' if d.startswith('core/cpu/arch') else d
edges = {}
for f, ds in deps.items():
    a = folder(f)
    for d in ds:
        b = folder(d)
        if a and b and a != b: edges.setdefault((a, b), f + ' includes ' + d)
nodes = sorted({n for e in edges for n in e})
adj = {n: sorted(b for (a, b) in edges if a == n) for n in nodes}
# strongly connected components (Tarjan, iterative)
index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]
for root in nodes:
    if root in index: continue
    work = [(root, 0)]
    while work:
        v, i = work.pop()
        if i == 0:
            index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
        if i < len(adj[v]):
            work.append((v, i + 1))
            w = adj[v][i]
            if w not in index: work.append((w, 0))
            elif w in on: low[v] = min(low[v], index[w])
            continue
        for w in adj[v]:
            if w in on: low[v] = min(low[v], low[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            comps.append(sorted(comp))
bad = 0
for comp in comps:
    if len(comp) < 2: continue
    inner = [(a, b) for (a, b) in edges if a in comp and b in comp]
    left = [e for e in inner if e not in allowed]
    if not left: continue
    bad = 1
    print('FAIL: a circle among core folders ' + ', '.join(comp) + ': ' +
          '; '.join(edges[e] for e in sorted(left)))
for e in sorted(allowed):
    if e not in edges: print('note: allowed edge ' + ' -> '.join(e) + ' is gone: take it out of ALLOWED_EDGES')
# 5. kernels only under core/cpu
simd_hdr = re.compile(r'^\s*#\s*include\s*<(immintrin|x86intrin|[a-z]*mmintrin|wasm_simd128|arm_neon)\.h>', re.M)
isa_name = re.compile(r'_(avx2|avx512|wasm128|neon)\.(c|inc)$')
isa_dispatch = re.compile(r'KVMEM_HAVE_AVX(2|512)|__builtin_cpu_(supports|init)|"KVMEM_CPU"')
for f in sorted(deps):
    if not f.startswith('core/'): continue
    text = open(f, encoding='utf-8', errors='replace').read()
    if not f.startswith('core/cpu/'):
        if isa_name.search(f) or simd_hdr.search(text):
            bad = 1
            print('FAIL: ' + f + ': a CPU kernel outside core/cpu (SIMD intrinsics or an instruction set\'s file name)')
    # 6. one ISA dispatcher
    if f != 'core/cpu/dispatch.c':
        m = isa_dispatch.search(text)
        if m:
            bad = 1
            print('FAIL: ' + f + ': ' + m.group(0) + ' outside core/cpu/dispatch.c, the one place that picks the kernels')
print('core folders: %d, folder edges: %d, allowed: %d' % (len(nodes), len(edges), len(allowed)))
sys.exit(bad)
PYEOF

[ $fail -eq 0 ] && echo "include graph: pool -> format, pool -> store, one way; no circle among core's folders; kernels only in core/cpu, one dispatcher"
exit $fail

#!/usr/bin/env bash
# The persistence rooms include each other one way only (issue 21, item 6):
# the pool owns the agent file format and uses the strict reader
# (core/format) and the byte stores (core/store); neither of those reaches
# back into the pool, and the pool reaches a store through store.h alone.
# Reads the #include "..." lines of core/ and stores/, resolves them like the
# compiler (the including file's folder, then core/, then include/), and fails on
#  1. a cycle among the rooms pool, store and format (edges: a file of one
#     room includes a header of another);
#  2. a file of core/store, core/format or stores/ that reaches a core/pool
#     header through any chain of includes;
#  3. a core/pool file that includes a core/store header other than store.h.
# Args: SOURCE_DIR (the others of tests/CMakeLists.txt are ignored).
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$src" || exit 1
[ -d core/pool ] && [ -d core/store ] || { echo "FAIL: no core/pool or core/store under $src"; exit 1; }

declare -A deps # file -> space-separated resolved includes (paths from $src)
files=$(find core stores -name '*.[ch]' 2>/dev/null | sort)
resolve() { # $1 = including file, $2 = include text
  local dir cand
  dir=$(dirname "$1")
  for cand in "$dir/$2" "core/$2" "include/$2"; do
    if [ -f "$cand" ]; then realpath -m --relative-to="$src" "$cand"; return; fi
  done
}
for f in $files; do
  list=""
  while IFS= read -r inc; do
    r=$(resolve "$f" "$inc")
    [ -n "$r" ] && list+="$r "
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
  deps[$f]=$list
done
room() { case "$1" in core/pool/*) echo pool ;; core/store/*) echo store ;; core/format/*) echo format ;; *) echo "" ;; esac; }

fail=0
# 1. room graph among pool, store, format
declare -A edge why
for f in $files; do
  a=$(room "$f")
  [ -n "$a" ] || continue
  for d in ${deps[$f]}; do
    b=$(room "$d")
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

[ $fail -eq 0 ] && echo "include graph: pool -> format, pool -> store, one way"
exit $fail

#!/usr/bin/env bash
# Backend plugins see the core through the backend interface only (issue 21,
# item 2): the headers of core/backend/ (the table, the device kernels'
# argument checks, checked size arithmetic) and include/kvmem.h. Fails on
#  1. a plugin build (backends/<name>/CMakeLists.txt, target_include_directories)
#     that puts a project folder on its include path other than its own
#     folders, core/backend and include, so the compiler itself would let a
#     plugin reach core internals;
#  2. a file under backends/ that includes a file of the project outside
#     its plugin's folder and the interface (so no chain through the
#     plugin's own files reaches the core either), or a "..." include that
#     resolves to no file. Includes are
#     resolved like the compiler: "..." from the including file's folder
#     first, then (like <...>) the plugin's include dirs in their order
#     (the union of the plugin's targets, read from its CMakeLists.txt);
#  3. an interface header that includes a project header other than another
#     interface header or include/kvmem.h;
#  4. an interface header whose code (comments and string literals left out)
#     names a type the core defines in its own headers: a struct, union or
#     enum tag with a body, or a typedef name, in core/**/*.h outside
#     core/backend (kvmem_pool, kvmem_agent, kvm_score_desc, kvm_attend_plan,
#     ...), so backends see buffers and op descriptors, never pool or agent
#     internals. The exceptions are kvmem_context, the owning context each
#     backend carries as an opaque handle and never reads, and kvmem_buffer,
#     the handle whose body each backend defines (the CPU backend's too).
# The interface is the headers directly in core/backend; its subfolders
# (core/backend/route: the core's router and context) are core internals.
# Args: SOURCE_DIR (the others of tests/CMakeLists.txt are ignored).
set -uo pipefail
src=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
cd "$src" || exit 1
[ -d backends ] || { echo "FAIL: no backends/ under $src"; exit 1; }
iface_dir=core/backend

in_iface() { [[ ( $1 == $iface_dir/*.h && $1 != $iface_dir/*/* ) || $1 == include/kvmem.h ]]; }

# resolve FILE TEXT KIND DIRS...: the repository path the compiler would open
# (KIND q: "..." searches FILE's folder first), empty when none
resolve() {
  local f=$1 inc=$2 kind=$3 d
  shift 3
  local dirs=("$@")
  [ "$kind" = q ] && dirs=("$(dirname "$f")" "${dirs[@]}")
  for d in "${dirs[@]}"; do
    if [ -f "$d/$inc" ]; then realpath -m --relative-to="$src" "$d/$inc"; return; fi
  done
}
# includes FILE: lines "q TEXT" and "a TEXT"
includes() {
  sed -n -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/q \1/p' \
         -e 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/a \1/p' "$1"
}

fail=0
for cm in backends/*/CMakeLists.txt; do
  be=$(dirname "$cm")
  # 1. the include dirs of the plugin's targets, in order, as repository paths
  dirs=()
  while IFS= read -r tok; do
    case "$tok" in
      '${CMAKE_CURRENT_SOURCE_DIR}'*) d=$be${tok#'${CMAKE_CURRENT_SOURCE_DIR}'} ;;
      '${PROJECT_SOURCE_DIR}'*) d=${tok#'${PROJECT_SOURCE_DIR}'}; d=${d#/}; d=${d:-.} ;;
      *) continue ;; # a system folder (the Vulkan headers, volk)
    esac
    d=$(realpath -m --relative-to="$src" "$d")
    [[ " ${dirs[*]} " == *" $d "* ]] && continue
    dirs+=("$d")
    if [[ $d != "$be" && $d != "$be"/* && $d != "$iface_dir" && $d != include ]]; then
      echo "FAIL: $cm puts $d on a plugin's include path: plugins see $iface_dir and include/ only"
      fail=1
    fi
  done < <(awk '/target_include_directories[[:space:]]*\(/ { on = 1 } on { print; if (index($0, ")")) on = 0 }' "$cm" |
             grep -o '\${\(CMAKE_CURRENT_SOURCE_DIR\|PROJECT_SOURCE_DIR\)}[^[:space:])]*')
  echo "$be: include path ${dirs[*]}"

  # 2. each include of each plugin file (a chain through the plugin's own
  # files ends in one of these edges, and 3. closes the interface)
  n_files=0
  while IFS= read -r f; do
    n_files=$((n_files + 1))
    while read -r kind inc; do
      r=$(resolve "$f" "$inc" "$kind" "${dirs[@]}")
      if [ -z "$r" ]; then
        # <...> not in the project: a system or toolkit header
        [ "$kind" = q ] && { echo "FAIL: $f includes \"$inc\", which is no file on $be's include path"; fail=1; }
      elif [[ $r != "$be"/* ]] && ! in_iface "$r"; then
        echo "FAIL: $f includes $r, outside the backend interface ($iface_dir/*.h, include/kvmem.h)"
        fail=1
      fi
    done < <(includes "$f")
  done < <(find "$be" -type f \( -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.inc' \) | sort)
  echo "$be: $n_files files checked"
done

# 3. the interface includes nothing of the core but itself (resolved with
# every include dir a core or plugin build uses)
n_iface=0
for f in "$iface_dir"/*.h; do
  [ -f "$f" ] || continue
  n_iface=$((n_iface + 1))
  while read -r kind inc; do
    r=$(resolve "$f" "$inc" "$kind" "$iface_dir" core include)
    if [ -n "$r" ] && ! in_iface "$r"; then
      echo "FAIL: $f includes $r: the interface includes only its own headers and include/kvmem.h"
      fail=1
    fi
  done < <(includes "$f")
done
[ "$n_iface" -gt 0 ] || { echo "FAIL: no interface headers in $iface_dir"; fail=1; }

# 4. no core-internal type in the interface's code. The core's type names:
# tags of struct/union/enum bodies and typedef names (the identifier after a
# typedef's body, or before its ";", or "(*name)" of a function-pointer typedef).
strip_code() { # FILE: its code without comments and string/char literals
  perl -0777 -pe 's{/\*.*?\*/}{ }gs; s{//[^\n]*}{}g; s{"(?:\\.|[^"\\])*"}{""}g; s{\x27(?:\\.|[^\x27\\])*\x27}{\x27\x27}g' "$1"
}
core_types=$(find core -name '*.h' ! -regex "$iface_dir/[^/]*\.h" -print0 | sort -z |
  while IFS= read -r -d '' h; do strip_code "$h"; done |
  perl -0777 -ne '
    while (/\b(?:struct|union|enum)\s+([A-Za-z_]\w*)\s*\{/g) { print "$1\n" }
    while (/\btypedef\b([^;{]*(?:\{(?:[^{}]|\{[^{}]*\})*\}[^;]*)?);/g) {
      my $t = $1;
      $t =~ s/^.*\}//s; # a body: the name follows it
      if ($t =~ /\(\s*\*\s*([A-Za-z_]\w*)\s*\)/) { print "$1\n" }
      elsif ($t =~ /([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$/) { print "$1\n" }
    }' | grep -vx -e 'kvmem_context' -e 'kvmem_buffer' | sort -u)
[ -n "$core_types" ] || { echo "FAIL: found no type definitions in core/ (the rule would check nothing)"; fail=1; }
for f in "$iface_dir"/*.h; do
  [ -f "$f" ] || continue
  hits=$(strip_code "$f" | grep -owE '[A-Za-z_][A-Za-z0-9_]*' | sort -u | grep -Fxf <(printf '%s\n' "$core_types") | tr '\n' ' ')
  if [ -n "$hits" ]; then
    echo "FAIL: $f names core-internal types: $hits(backends see buffers and op descriptors only)"
    fail=1
  fi
done

[ $fail -eq 0 ] && echo "backend plugins include only the backend interface ($n_iface headers in $iface_dir, naming none of the core's $(wc -l <<<"$core_types") internal types)"
exit $fail

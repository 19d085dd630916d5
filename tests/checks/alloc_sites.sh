#!/usr/bin/env bash
# Every allocation in core/ goes through core/alloc.h (kvm_malloc, kvm_calloc,
# kvm_realloc, kvm_strdup, kvm_strndup, kvm_aligned_alloc, kvm_huge_alloc,
# kvm_free), so
# tests/oom can fail each one. A plain malloc/free there would escape the
# allocation-failure test (and a kvm_malloc'd block freed with free() would
# unbalance its leak count).
set -euo pipefail
src=$1
cd "$src"
bad=$(grep -rnE '(^|[^A-Za-z0-9_>.])(malloc|calloc|realloc|free|strdup|strndup|aligned_alloc|posix_memalign|reallocarray)[[:space:]]*\(' \
        core --include='*.c' --include='*.h' --include='*.inc' |
      grep -v -E '^core/alloc\.[ch]:' |
      grep -v -E '^[^:]+:[0-9]+:[[:space:]]*(/?\*|//)' || true)
if [ -n "$bad" ]; then
  echo "allocation calls that bypass core/alloc.h:"
  echo "$bad"
  exit 1
fi
sites=$(grep -rhoE 'kvm_(malloc|calloc|realloc|strdup|strndup|aligned_alloc|huge_alloc)\(' core --include='*.c' | wc -l)
lines=$(grep -rlE 'kvm_(malloc|calloc|realloc|strdup|strndup|aligned_alloc|huge_alloc)\(' core --include='*.c' | xargs grep -nE 'kvm_(malloc|calloc|realloc|strdup|strndup|aligned_alloc|huge_alloc)\(' | grep -v '^core/alloc\.c' | wc -l)
echo "$sites allocation calls on $lines source lines, all through core/alloc.h"

#!/usr/bin/env bash
# The README's API tour is examples/c/quickstart.c, verbatim: this check
# fails when they drift, then compiles and runs the example.
set -euo pipefail
src=$1 build=$2 cc=$5
python3 - "$src" <<'PY'
import sys, pathlib
src = pathlib.Path(sys.argv[1])
readme = (src / "README.md").read_text()
example = (src / "examples/c/quickstart.c").read_text().strip()
if example not in readme:
    sys.exit("README.md does not contain examples/c/quickstart.c verbatim")
PY
out=$("$build/examples/kvmem_quickstart")
echo "$out"
grep -q "20 tokens in 2 blocks (1 sealed)" <<<"$out"
grep -q "refused: .*is invalid" <<<"$out"

#!/usr/bin/env bash
# `kvmem demo` runs, and its --json output parses as JSON lines.
set -euo pipefail
tool=$4
"$tool" demo >/dev/null
"$tool" demo --json | python3 -c 'import sys, json; rows=[json.loads(l) for l in sys.stdin if l.strip()]; assert rows, "no output"; print(len(rows), "JSON lines")'
"$tool" backends

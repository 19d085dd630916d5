#!/usr/bin/env bash
# Every file, link, path, make target and countable number named in README.md
# and docs/*.md exists in the tree (tests/checks/docs_refs.py says what is
# checked). Then the checker itself: a copy of the README with one broken
# reference of each kind must fail, naming it, and so must a 250-line one.
# Args: SOURCE_DIR BINARY_DIR LIBKVMEM CLI CC SANITIZE
set -uo pipefail
src=$1
command -v python3 >/dev/null || { echo "skipped: no python3"; exit 77; }
checker=$src/tests/checks/docs_refs.py
python3 "$checker" "$src" || exit 1

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
cp "$src/README.md" "$work/README.md"
python3 "$checker" "$src" "$work/README.md=README.md" >/dev/null || { echo "FAIL: the unmodified copy does not pass"; exit 1; }
# broken LINE FRAGMENT: the README with LINE appended fails, saying FRAGMENT
broken() {
  { cat "$src/README.md"; printf '\n%s\n' "$1"; } >"$work/README.md"
  if python3 "$checker" "$src" "$work/README.md=README.md" >"$work/out"; then
    echo "FAIL: the checker passed a README with: $1"
    fail=1
  elif ! grep -qF -- "$2" "$work/out"; then
    echo "FAIL: for '$1' the checker said: $(grep FAIL "$work/out") (want '$2')"
    fail=1
  fi
}
broken 'See [the guide](docs/guide.md).' "link to docs/guide.md: docs/guide.md does not exist"
broken 'See [retrieval](docs/retrieval.md#no-such-part).' "docs/retrieval.md has no heading #no-such-part"
broken 'See [below](#no-such-part).' "link to #no-such-part: no such heading in README.md"
broken 'The check is `tests/checks/nosuch.sh`.' "names tests/checks/nosuch.sh, which is not in the tree"
broken 'Run `./scripts/install-everything.sh` first.' "names scripts/install-everything.sh, which is not in the tree"
broken 'Numbers: NUMBERS.md.' "names NUMBERS.md, which is neither at the root"
broken 'Then `make benchmark`.' "names \`make benchmark\`, which the Makefile does not have"
broken 'It comes with three example services.' "says 'three example services': the tree has"
broken 'There are four bindings.' "says 'four bindings': the tree has"
broken 'See [up](../outside.md).' "link to ../outside.md leaves the repository"
# a README padded to 250 lines
{ cat "$src/README.md"; yes '' | head -n $((250 - $(wc -l <"$src/README.md"))); } >"$work/README.md"
if python3 "$checker" "$src" "$work/README.md=README.md" >"$work/out"; then
  echo "FAIL: the checker passed a README of $(wc -l <"$work/README.md") lines"; fail=1
elif ! grep -qF "README.md: 250 lines" "$work/out"; then
  echo "FAIL: for a 250-line README the checker said: $(grep FAIL "$work/out")"; fail=1
fi
[ $fail -eq 0 ] && echo "the checker fails on each of 10 broken references and on a 250-line README"
exit $fail

#!/usr/bin/env python3
"""What README.md and docs/*.md name exists, and the counts they state match the tree.

    docs_refs.py ROOT                 check ROOT/README.md and ROOT/docs/*.md
    docs_refs.py ROOT FILE=AS ...     check FILE as if it were ROOT/AS (the self-test)

Checked, in prose and in code blocks alike:
  - every relative link and image ([x](path), [x](path#anchor), [x](#anchor)): the file
    exists, and an anchor is a heading of that Markdown file (GitHub's slugs);
  - every path into the tree (`core/...`, `tests/checks/x.sh`, `./bindings/python`, globs
    such as `tests/backend/test_backend*.c`) and every bare `NAME.md`: it exists;
  - every `make TARGET`: the Makefile has that target;
  - the counts of things the tree can count (bindings, example services, the bindings'
    test suites, recall stories, allocation source lines in core/): equal to the count;
  - README.md is under 250 lines.
Exit 1 listing each broken reference, with its file and line.
"""
import glob
import os
import re
import sys

# Top-level entries of the tree that a path in the docs starts with. build/ and
# ../shared are not in the tree: what they hold is made or fetched, not checked here.
TREE_DIRS = ("core", "include", "tools", "tests", "bench", "bindings", "examples", "wasm", "scripts", "docs",
             "backends", "stores", "cmake", ".ci")
# Paths the docs name that a build or a user makes, not the tree; the Go module's
# release tags (bindings/go/vX.Y.Z) look like paths and are not.
MADE = (re.compile(r".*\.tgz$"), re.compile(r".*\.safetensors$"), re.compile(r"bindings/go/v(\d|X)"))

# The README is read in five minutes; the rest lives in docs/.
README_LINES = 250

WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def number(word):
    w = word.lower().replace(",", "")
    return int(w) if w.isdigit() else WORDS.get(w)


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(path):
    out, fence = set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def tree_count(root):
    """What the tree can count, by the phrase the docs use for it."""
    bindings = [d for d in sorted(glob.glob(os.path.join(root, "bindings", "*", "")))
                if any(os.path.exists(os.path.join(d, f)) for f in ("pyproject.toml", "package.json", "go.mod"))]
    suites = [d for d in bindings
              if os.path.isdir(os.path.join(d, "tests")) or os.path.isdir(os.path.join(d, "test"))
              or glob.glob(os.path.join(d, "*_test.go"))]
    server = re.compile(r"http\.createServer|http\.Server\{|ListenAndServe|HTTPServer\(")
    services = set()
    for f in glob.glob(os.path.join(root, "examples", "**", "*"), recursive=True):
        if (os.path.isfile(f) and f.endswith((".js", ".go", ".py")) and "node_modules" not in f
                and not re.search(r"(_test\.go|\.test\.js|/test_[^/]*\.py)$", f)
                and server.search(open(f, encoding="utf-8", errors="replace").read())):
            services.add(os.path.dirname(f))
    stories = sum(1 for line in open(os.path.join(root, "examples", "tinyllm", "recall-stories.txt"), encoding="utf-8")
                  if line.startswith("intro "))
    alloc = re.compile(r"kvm_(malloc|calloc|realloc|strdup|strndup|aligned_alloc|huge_alloc)\(")
    alloc_lines = 0
    for f in glob.glob(os.path.join(root, "core", "**", "*.c"), recursive=True):
        if os.path.relpath(f, root) != os.path.join("core", "alloc.c"):
            alloc_lines += sum(1 for line in open(f, encoding="utf-8", errors="replace") if alloc.search(line))
    return [
        (re.compile(r"\b(\w+) bindings\b", re.I), len(bindings), "bindings (bindings/*/ with a package file)"),
        (re.compile(r"\ball (\w+) test suites\b", re.I), len(suites), "the bindings' test suites"),
        (re.compile(r"\b(\w+) example services\b", re.I), len(services), "example services (examples/ with an HTTP server)"),
        (re.compile(r"\b(\d+) multi-session stories\b"), stories, "recall stories (examples/tinyllm/recall-stories.txt)"),
        (re.compile(r"\bof the (\d+) allocation source lines\b"), alloc_lines, "allocation source lines in core/"),
    ]


def make_targets(root):
    return {m.group(1) for m in re.finditer(r"(?m)^([A-Za-z0-9_.-]+)\s*:", open(os.path.join(root, "Makefile")).read())}


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PATH = re.compile(r"(?:^|(?<=[\s`'\"(=]))(?:\./)?((?:%s)/[A-Za-z0-9_.*/{}+-]*)" % "|".join(re.escape(d) for d in TREE_DIRS))
BARE_MD = re.compile(r"(?:^|(?<=[\s`'\"(]))([A-Za-z0-9_-]+\.md)\b")
MAKE = re.compile(r"\bmake ([a-z][a-z0-9-]*)")


def check(root, text, rel, counts, targets, report):
    here = os.path.dirname(rel)
    own = set()
    fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            own.add(slug(line.lstrip("#")))
    n = {"links": 0, "paths": 0, "targets": 0, "counts": 0}
    in_code = False
    for i, line in enumerate(text.splitlines(), 1):
        where = f"{rel}:{i}"
        if line.startswith("```"):
            in_code = not in_code
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            n["links"] += 1
            path, _, anchor = target.partition("#")
            if not path:
                if anchor not in own:
                    report(where, f"link to #{anchor}: no such heading in {rel}")
                continue
            full = os.path.normpath(os.path.join(root, here, path))
            inside = os.path.relpath(full, root)
            if inside.startswith(".."):
                report(where, f"link to {target} leaves the repository")
            elif not os.path.exists(full):
                report(where, f"link to {target}: {inside} does not exist")
            elif anchor and full.endswith(".md") and anchor not in headings(full):
                report(where, f"link to {target}: {inside} has no heading #{anchor}")
        for m in PATH.finditer(line):
            p = re.sub(r"(::\w+|:\d+)$", "", m.group(1).rstrip(".,;:"))
            if "{" in p or any(r.match(p) for r in MADE):
                continue
            n["paths"] += 1
            if not glob.glob(os.path.join(root, p)):
                report(where, f"names {p}, which is not in the tree")
        for m in BARE_MD.finditer("" if in_code else line):  # in code: a command's output file
            name = m.group(1)
            n["paths"] += 1
            if not (os.path.exists(os.path.join(root, name)) or os.path.exists(os.path.join(root, here, name))):
                report(where, f"names {name}, which is neither at the root nor beside {rel}")
        for m in MAKE.finditer(line):
            n["targets"] += 1
            if m.group(1) not in targets:
                report(where, f"names `make {m.group(1)}`, which the Makefile does not have")
        for rx, want, what in counts:
            for m in rx.finditer(line):
                got = number(m.group(1))
                if got is None:
                    continue
                n["counts"] += 1
                if got != want:
                    report(where, f"says '{m.group(0)}': the tree has {want} {what}")
    return n


def main():
    root = os.path.abspath(sys.argv[1])
    if len(sys.argv) > 2:
        files = [(a.split("=", 1)[0], a.split("=", 1)[1]) for a in sys.argv[2:]]
    else:
        files = [(os.path.join(root, "README.md"), "README.md")]
        files += [(f, os.path.relpath(f, root)) for f in sorted(glob.glob(os.path.join(root, "docs", "*.md")))]
    counts, targets = tree_count(root), make_targets(root)
    errors = []
    for path, rel in files:
        lines = open(path, encoding="utf-8").read().count("\n")
        if rel == "README.md" and lines >= README_LINES:
            errors.append(f"README.md: {lines} lines: a newcomer's five minutes are under {README_LINES}; move detail to docs/")
    total = {"links": 0, "paths": 0, "targets": 0, "counts": 0}
    for path, rel in files:
        n = check(root, open(path, encoding="utf-8").read(), rel, counts, targets,
                  lambda where, msg: errors.append(f"{where}: {msg}"))
        for k in total:
            total[k] += n[k]
    for e in errors:
        print("FAIL:", e)
    print(f"{len(files)} files: {total['links']} links, {total['paths']} paths, {total['targets']} make targets, "
          f"{total['counts']} counts checked; {len(errors)} broken")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

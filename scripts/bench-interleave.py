#!/usr/bin/env python3
"""Two builds of kvmem measured against each other, interleaved in one run.

  scripts/bench-interleave.py --a OLD_TREE --b NEW_TREE --rounds 3 --out DIR
      [--suites retrieval,store,attend,evict,peers] [--quick] [--build release]
  scripts/bench-interleave.py ... --first-round 3 --rounds 4 --out DIR   (more rounds)
  scripts/bench-interleave.py --out DIR --table [--name-a OLD --name-b NEW]

Each tree is a checkout with its own build (build/BUILD). For each suite in
turn (its rounds complete before the next suite starts, so a run cut short
still leaves whole suites), each round runs `kvmem bench --json --threads 1
SUITE` of both trees, the first tree alternating (a b, b a, a b, ...), so a
change in the machine's load hits both alike. "peers" runs each tree's own
bench/peers.py (one thread, on its own library and Python binding, the
PyTorch side on OpenBLAS when installed). Lines land in
DIR/SUITE-round-R-X.jsonl, one line per run in DIR/log.txt (time, load).
--table reads DIR back: one row per timing field (`*_ms`, `ms_*`, `*_ms_*`)
of each line, keyed by the line's text fields and sizes, with each tree's
median over the rounds that hold the row in both trees (suites run for
different numbers of rounds can share one DIR), b / a, b / a of each of
those rounds and their median (the paired estimate: a round's two processes
ran back to back, so a slow spell of the machine moves both), and each
tree's fastest round against the other's (a process on these guests lands
in a slow or a fast mode, a third apart, by chance: interference only adds
time, so the fastest rounds compare the code)."""
import argparse
import glob
import json
import math
import os
import statistics
import subprocess
import sys
import time

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread"
KEY_NUMS = ("tokens", "n", "layers", "blocks", "threads", "top_k", "n_tokens", "query_tokens", "bits",
            "tau", "tile", "budget", "keep", "segments")


def run_one(args, suite, r, x):
    tree = args.a if x == "a" else args.b
    build = os.path.join(tree, "build", args.build)
    cli = os.path.join(build, "tools", "kvmem")
    if suite == "peers":
        env = dict(os.environ, KVMEM_LIBRARY=os.path.join(build, "core", "libkvmem.so"))
        if os.path.isdir(OPENBLAS):  # the peer's side on OpenBLAS, not the reference BLAS (peers.py)
            env["LD_LIBRARY_PATH"] = OPENBLAS
        cmd = ["/usr/bin/python3", os.path.join(tree, "bench", "peers.py"), "--threads", "1",
               "--rounds", str(args.peer_rounds), "--kvmem-cli", cli]
        if args.peers_only:
            cmd += ["--only", args.peers_only]
    else:
        env = None
        cmd = [cli, "bench", "--json", "--threads", "1", suite]
    if args.quick:
        cmd.append("--quick")
    t0 = time.time()
    with open(os.path.join(args.out, "%s-round-%d-%s.jsonl" % (suite, r, x)), "w") as f:
        subprocess.run(cmd, stdout=f, stderr=subprocess.DEVNULL, env=env, check=False)
    with open(os.path.join(args.out, "log.txt"), "a") as lg:
        lg.write("%s %s round %d %s %.0f s, load %s\n" % (time.strftime("%H:%M:%S"), suite, r, x, time.time() - t0,
                                                      open("/proc/loadavg").read().strip()))


def timing_fields(o):
    for k, v in o.items():
        if isinstance(v, (int, float)) and (k.endswith("_ms") or k.startswith("ms_") or "_ms_" in k):
            yield k, float(v)


def row_key(o):
    parts = []
    for k, v in o.items():
        if isinstance(v, str) and k not in ("kernels", "blas", "torch", "kvmem", "check", "limit"):
            parts.append("%s=%s" % (k, v))
        elif k in KEY_NUMS and isinstance(v, (int, float)):
            parts.append("%s=%s" % (k, v))
    return " ".join(parts)


def load(path):
    rows = {}
    for line in open(path):
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if not isinstance(o, dict):
            continue
        base = row_key(o)
        for k, v in timing_fields(o):
            key = base + " :" + k
            while key in rows:  # the same key twice in one run: number them
                key += "'"
            rows[key] = v
    return rows


def table(args):
    runs = {"a": [], "b": []}
    for x in runs:
        rounds = {}
        for p in sorted(glob.glob(os.path.join(args.out, "*-round-*-%s.jsonl" % x))):
            r = int(p.rsplit("-round-", 1)[1].split("-")[0])
            rounds.setdefault(r, {}).update(load(p))
        runs[x] = [rounds[r] for r in sorted(rounds)]
    # every row any round of b has, over the rounds where both trees have it
    keys = list(dict.fromkeys(k for r in runs["b"] for k in r))
    print("| row | rounds | %s | %s | b / a | b / a per round | median of those | best b / best a |" % (args.name_a, args.name_b))
    print("|---|---|---|---|---|---|---|---|")
    ratios, paired, best = [], [], []
    for k in keys:
        both = [(ra[k], rb[k]) for ra, rb in zip(runs["a"], runs["b"]) if k in ra and k in rb]
        if not both:
            continue
        va, vb = [a for a, _ in both], [b for _, b in both]
        ma, mb = statistics.median(va), statistics.median(vb)
        if ma <= 0 or mb <= 0:
            continue
        ratios.append(mb / ma)
        pr = [b / a for a, b in zip(va, vb) if a > 0]
        paired.append(statistics.median(pr) if pr else mb / ma)
        best.append(min(vb) / min(va) if min(va) > 0 else mb / ma)
        per = " ".join("%.2f" % x for x in pr)
        print("| %s | %d | %.4g | %.4g | %.3f | %s | %.3f | %.3f |" % (k, len(va), ma, mb, mb / ma, per, paired[-1], best[-1]))
    if ratios:
        print("\n%d rows" % len(ratios))
    for what, xs in (("b / a", ratios), ("median of the rounds' b / a", paired), ("best rounds", best)):
        if xs:
            g = math.exp(sum(math.log(x) for x in xs) / len(xs))
            print("%s: geometric mean %.3f; > 1.05: %d; < 0.95: %d" %
                  (what, g, sum(x > 1.05 for x in xs), sum(x < 0.95 for x in xs)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", help="the old tree")
    ap.add_argument("--b", help="the new tree")
    ap.add_argument("--name-a", default="a")
    ap.add_argument("--name-b", default="b")
    ap.add_argument("--build", default="release")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--first-round", type=int, default=0, help="number the rounds from here (more rounds into a DIR)")
    ap.add_argument("--suites", default="retrieval,attend,evict,store,peers", help="kvmem bench suites; peers: bench/peers.py")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peers-only", default=None, help="peers.py --only")
    ap.add_argument("--peer-rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--table", action="store_true", help="print the table of DIR, run nothing")
    args = ap.parse_args()
    if args.table:
        table(args)
        return 0
    os.makedirs(args.out, exist_ok=True)
    for suite in args.suites.split(","):  # each suite's rounds complete before the next starts
        for r in range(args.first_round, args.first_round + args.rounds):
            for x in (("a", "b") if r % 2 == 0 else ("b", "a")):
                run_one(args, suite, r, x)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Checks what make demo's story (`tinyllm demo`) prints against values computed here.

usage: demo_story.py OUTPUT TOKENIZER STORY_C

Independently of the engine: the sessions' text is read from story.c's
source, encoded with llama2.c's algorithm over tokenizer.bin (written here),
so each session's token count and the history's length are known; text RAG's
chunks are recomputed (16-token spans of the history, Okapi BM25 against the
last session's text, the best that fit the memory's share of the window and
end before the live context); kvmem's blocks are decoded from the history and
must hold what the demo prints; every context's token count adds up from its
parts; the verdict line agrees with the continuations as printed.
"""
import math
import re
import struct
import sys

BLOCK = 16  # the agent's block size and text RAG's chunk size
K1, B = 1.2, 0.75


def load_tokenizer(path):
    data = open(path, "rb").read()
    off = 4  # max_token_length
    pieces, scores = [], []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        pieces.append(data[off:off + n])
        scores.append(score)
        off += n
    return pieces, scores, {p: i for i, p in reversed(list(enumerate(pieces)))}


def encode(tok, text, bos):
    """llama2.c's encode: a dummy-prefix space, one token per UTF-8 character
    (its bytes + 3 when it has none), then the best-scored merge, leftmost
    on ties, until none is in the vocabulary."""
    pieces, scores, ids = tok
    out = []
    for ch in (" " + text if text else ""):
        b = ch.encode()
        out += [ids[b]] if b in ids else [x + 3 for x in b]
    while True:
        best, at = None, -1
        for i in range(len(out) - 1):
            m = ids.get(pieces[out[i]] + pieces[out[i + 1]])
            if m is not None and (best is None or scores[m] > scores[best]):
                best, at = m, i
        if best is None:
            break
        out[at:at + 2] = [best]
    return ([1] if bos else []) + out


def piece_bytes(tok, i):
    p = tok[0][i]
    m = re.fullmatch(rb"<0x([0-9A-F]{2})>", p)
    return bytes([int(m.group(1), 16)]) if m else p


def words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def bm25(docs, query):
    n_docs = len(docs)
    avgdl = sum(len(d) for d in docs) / n_docs
    df = {}
    for d in docs:
        for w in set(d):
            df[w] = df.get(w, 0) + 1
    out = []
    for d in docs:
        s, norm = 0.0, K1 * (1 - B + B * len(d) / avgdl)
        for w in set(query):
            tf = d.count(w)
            if tf:
                s += math.log(1 + (n_docs - df[w] + 0.5) / (df[w] + 0.5)) * tf * (K1 + 1) / (tf + norm)
        out.append(f32(s))
    return out


def c_sessions(src):
    """k_sessions[] from story.c: its adjacent string literals joined."""
    body = re.search(r"k_sessions\[\] = \{(.*?)\n\};", src, re.S).group(1)
    items = []
    for entry in re.split(r'",\s*\n', body):
        lits = re.findall(r'"((?:[^"\\]|\\.)*)"?', entry)
        items.append("".join(re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), l) for l in lits))
    return [s for s in items if s]


def main(out_path, tok_path, story_path):
    out = open(out_path).read()
    src = open(story_path).read()
    tok = load_tokenizer(tok_path)
    name = re.search(r'k_name\[\] = "(\w+)";', src).group(1)
    texts = c_sessions(src)

    def one(pattern, what):
        m = re.search(pattern, out, re.M)
        assert m, f"not in the demo's output: {what} ({pattern})"
        return m

    # the window and its shares
    m = one(r"trained on a window of (\d+) tokens", "the window")
    W = int(m.group(1))
    m = one(r"read in one window: (\d+) tokens of retrieved blocks, the newest (\d+) tokens", "the split")
    memory, live_share = int(m.group(1)), int(m.group(2))
    assert memory % BLOCK == 0 and 0 < memory + live_share < W, (memory, live_share, W)

    # phase 1: every session's tokens, computed here
    enc = [encode(tok, t, i == 0) for i, t in enumerate(texts)]
    history = [t for e in enc[:-1] for t in e]
    sessions = re.findall(r'^  session +(\d+), +(\d+) tokens \(history +(\d+), ([\d.]+) windows\) "(.*)"$', out,
                          re.M)
    assert [int(s[0]) for s in sessions] == list(range(1, len(texts))), sessions
    at = 0
    for (k, n, h, w, shown), e, t in zip(sessions, enc, texts):
        at += len(e)
        assert int(n) == len(e) and int(h) == at, f"session {k}: {n} tokens, history {h}; computed {len(e)}, {at}"
        assert f"{at / W:.1f}" == w, (k, w, at / W)
        assert t.startswith(shown.removesuffix(" ...")), (k, shown)
    N = len(history)
    assert N > 3 * W, f"the history is {N} tokens, not several windows of {W}"
    one(r"^saved the agent \(%d tokens, %.1f windows" % (N, N / W), "the saved agent")
    probes = sum(len(e) for e in enc[1:-1])  # every session after the first probes its own text
    one(r"kvmem ran %d tokens through the model \(%d of text, %d of probes\); a text agent re-reading its history "
        r"each session: %d$" % (N + probes, N, probes,
                                sum(sum(len(x) for x in enc[:i + 1]) for i in range(len(enc) - 1))),
        "phase 1's token counts")
    one(r"a new process loaded the agent 'story-agent' \(%d tokens\)" % N, "phase 2 loads phase 1's agent")
    one(r"logits identical to phase 1 \(max difference 0\)", "the reloaded agent gives phase 1's logits")
    one(r"^session %d \(history %d tokens, %.1f windows of the model\)" % (len(texts), N, N / W), "the last session")

    def text_of(first, n):
        # control tokens (unknown, BOS, EOS) have no text
        return b"".join(piece_bytes(tok, i) for i in history[first:first + n] if i > 2).decode("utf-8", "replace")

    # kvmem's blocks: whole blocks of the history, within the memory's share, session 1's name among them
    blocks = [(int(a), int(b), t) for a, b, t in re.findall(r'^    block +\d+  tokens +(\d+)-(\d+) +"(.*)"$', out, re.M)]
    assert blocks and len(blocks) * BLOCK <= memory, blocks
    for a, b, t in blocks:
        assert a % BLOCK == 0 and b == a + BLOCK - 1 and b < N, (a, b)
        assert words(t) == words(text_of(a, BLOCK)), (a, t, text_of(a, BLOCK))
    first_len = len(enc[0])
    assert any(re.search(r"\b%s\b" % name, t) and a < first_len for a, b, t in blocks), \
        f"no block of session 1 names {name}: {blocks}"

    # the live context: the newest tokens from a block boundary
    live = int(one(r"^  both end with the live context, the newest (\d+) tokens", "the live context").group(1))
    live_first = N - live
    assert 0 < live <= live_share and live_first % BLOCK == 0, (live, live_share)

    # text RAG: BM25 over every 16-token chunk (BOS left out), the best that fit memory - 1 (BOS) tokens and end
    # before the live context, in the history's order
    spans = [(max(c, 1), min(c + BLOCK, N) - max(c, 1)) for c in range(0, N, BLOCK)]
    scores = bm25([words(text_of(a, n)) for a, n in spans], words(texts[-1]))
    used, want = 0, []
    for c in sorted(range(len(spans)), key=lambda c: (-scores[c], c)):
        a, n = spans[c]
        if scores[c] > 0 and a + n <= live_first and used + n <= memory - 1:
            used += n
            want.append(c)
    want = sorted(spans[c] for c in want)
    chunks = [(int(a), int(b) - int(a) + 1, t) for a, b, t in re.findall(r'^ {15}tokens +(\d+)-(\d+) +"(.*)"$', out, re.M)]
    assert [(a, n) for a, n, t in chunks] == want, f"text RAG's chunks {chunks}, computed {want}"
    for a, n, t in chunks:
        assert words(t) == words(text_of(a, n)), (a, t)

    # the four continuations and the tokens each ran through the model
    np_ = len(enc[-1])
    rows = {k: one(r"^    %s +(\d+): [^\"]*\"(.*)\"$" % k, k) for k in
            ("kvmem's memory", "text RAG", r"the recent +\d+ tokens", "the whole history")}
    n = [int(m.group(1)) for m in rows.values()]
    cont = [m.group(2) for m in rows.values()]
    assert n == [2 * np_, 1 + used + live + np_, np_, np_], (n, np_, used, live)
    one(r"^    the recent +%d tokens" % min(N, memory + live_share), "the recent window's size")
    one(r"the whole history, %d tokens, is past the model's window of %d; re-read as text: %d tokens" % (N, W, N + np_),
        "the whole history")

    # the verdict agrees with the continuations; the story's point: kvmem recalls her and nothing else does
    named = [bool(re.search(r"\b%s\b" % name, c)) for c in cont]
    who = ["kvmem's memory", "text RAG", "the recent window", "the whole history"]
    yes = [w for w, v in zip(who, named) if v]
    no = [w for w, v in zip(who, named) if not v]
    verdict = "Recall of %s, named in session 1, %.1f windows back: " % (name, N / W)
    parts = [", ".join(yes) + (" says it" if len(yes) == 1 else " say it")] if yes else []
    parts += [", ".join(no) + (" does not" if len(no) == 1 else " do not")] if no else []
    verdict += "; ".join(parts) + "."
    one("^" + re.escape(verdict) + "$", "the verdict " + verdict)
    assert named == [True, False, False, False], dict(zip(who, named))
    print(f"demo check: {N} tokens of history ({N / W:.1f} windows); kvmem names {name} from blocks "
          f"{[a // BLOCK for a, b, t in blocks]}; text RAG's chunks {[(a, n) for a, n in want]} as computed here "
          f"({n[1]} tokens), the recent window and the whole history do not name her")


if __name__ == "__main__":
    main(*sys.argv[1:4])

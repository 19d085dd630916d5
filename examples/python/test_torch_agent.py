"""examples/python/torch_agent.py against the C engine on the real model:
its tokenizer gives tinyllm's ids, its full-context logits and pre-RoPE
queries (QueryCapture) are tinyllm's to float rounding, and the agent run in
two processes prints what the C story demo prints of kvmem's part (its
sessions, the window's retrieved blocks and live context, kvmem's continuation,
the reload check), with the last prompt's logits over kvmem memory equal to
the C demo's and agent files holding the same tokens.
Skips, saying why, without torch, the model or the C programs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="skipped: torch not installed (apt-get install python3-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "bindings", "python"))
MODEL = os.environ.get("KVMEM_TEST_MODEL") or os.path.join(ROOT, "..", "shared", "models", "stories260K.bin")
TOKENIZER = os.path.join(os.path.dirname(MODEL), "tok512.bin")
if not (os.path.isfile(MODEL) and os.path.isfile(TOKENIZER)):
    pytest.skip(f"skipped: model not found at {MODEL} (set KVMEM_TEST_MODEL)", allow_module_level=True)


def build_dir() -> str:
    """The build the suite runs against (scripts/test-bindings.sh sets KVMEM_LIBRARY to BUILD/core/...)."""
    lib = os.environ.get("KVMEM_LIBRARY")
    if lib and os.path.basename(os.path.dirname(lib)) == "core":
        return os.path.dirname(os.path.dirname(os.path.abspath(lib)))
    return os.path.join(ROOT, "build", "default")


TINYLLM = os.path.join(build_dir(), "examples", "tinyllm", "tinyllm")
DUMP = os.path.join(build_dir(), "examples", "tinyllm", "tinyllm-dump")
if not (os.access(TINYLLM, os.X_OK) and os.access(DUMP, os.X_OK)):
    pytest.skip(f"skipped: {TINYLLM} and tinyllm-dump are not built (make build)", allow_module_level=True)

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402
import torch_agent as ta  # noqa: E402


@pytest.fixture(scope="module")
def model():
    return ta.load_llama2c(MODEL)


@pytest.fixture(scope="module")
def tok(model):
    return ta.Tokenizer(TOKENIZER, model.cfg.vocab)


def run(*cmd, cwd=None) -> str:
    # the checkout's package, as an installed one would be found
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "bindings", "python"))
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    assert r.returncode == 0, f"{cmd[:3]} exited {r.returncode}: {r.stderr[-2000:]}"
    return r.stdout


def test_tokenizer_gives_tinyllms_ids(tok):
    texts = ta.SESSIONS + ["naïve café — 中文 😀", "  two  spaces\nand a line", "x"]
    for text in texts:
        for bos in (True, False):
            c_ids = [int(x) for x in run(TINYLLM, "tokenize", MODEL, *([] if bos else ["--no-bos"]), text).split()]
            assert tok.encode(text, bos) == c_ids, text
            assert tok.decode(c_ids) == run(TINYLLM, "tokenize", MODEL, "--decode", " ".join(map(str, c_ids)))


def test_full_context_logits_and_queries_are_tinyllms(model, tok):
    ids = tok.encode(" ".join(ta.SESSIONS[:4]), True)  # within the model's window
    assert 150 < len(ids) <= model.cfg.seq_len
    ref = json.loads(run(DUMP, MODEL, *map(str, ids)))
    assert ref["tokens"] == ids
    cache = ta.KVCache(model.cfg, len(ids))
    spec = kvmem.ModelSpec(n_layers=model.cfg.n_layers, n_q_heads=model.cfg.n_heads,
                           n_kv_heads=model.cfg.n_kv_heads, head_dim=model.cfg.head_dim)
    with kt.QueryCapture(model) as cap:
        logits = model(ids, range(len(ids)), cache)
        q = cap.queries(spec)
    want = torch.tensor(ref["logits"])
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(logits.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(q, torch.tensor(ref["q_raw"]).view(q.shape), rtol=1e-4, atol=1e-4)


def c_sessions() -> list:
    """story.c's k_sessions as its C string literals say them."""
    with open(os.path.join(ROOT, "examples", "tinyllm", "story.c"), encoding="utf-8") as f:
        src = f.read()
    body = src[src.index("k_sessions[] = {"):]
    body = body[body.index("{") + 1:body.index("};")]
    out, at = [], None
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', body):
        lit = re.sub(r"\\(.)", r"\1", m.group(1))  # \" and \\ are the only escapes there
        if at is None or "," in body[at:m.start()]:
            out.append(lit)
        else:  # adjacent literals: one string
            out[-1] += lit
        at = m.end()
    return out


def test_sessions_are_the_c_demos():
    assert ta.SESSIONS == c_sessions()
    assert len(ta.SESSIONS) == 17 and ta.SESSIONS[-1] == "The next morning,"


# the lines both agents print about kvmem's part of the story (the C demo adds text RAG, the recent
# window and the whole history)
KEEP = ("phase 1:", "  session ", "saved the agent", "kvmem ran ", "phase 2:", "  the next session's prompt",
        "session ", "  (the next word", "  kvmem retrieved", "    block ", "  both end with the live context",
        "  it ends with the live context", "    kvmem's memory")


def lines(out: str, state) -> list:
    # the C demo's live context ends kvmem's and text RAG's windows ("both"), the example's kvmem's ("it")
    return [re.sub(r"^  (both end|it ends) with the live context", "  LIVE", ln.replace(str(state), "STATE"))
            for ln in out.splitlines() if ln.startswith(KEEP)]


def test_agent_runs_as_the_c_story_demo_in_two_processes(model, tmp_path):
    c_dir, py_dir = tmp_path / "c", tmp_path / "py"
    c_dir.mkdir()
    py_dir.mkdir()
    c_out = py_out = ""
    for phase in ("1", "2"):
        c_out += run(TINYLLM, "demo", MODEL, "--state", str(c_dir), "--phase", phase)
        py_out += run(sys.executable, os.path.join(HERE, "torch_agent.py"), "--model", MODEL, "--state",
                      str(py_dir), "--phase", phase)
    want, got = lines(c_out, c_dir), lines(py_out, py_dir)
    assert sum(ln.startswith(("  session ", "session ")) for ln in want) == len(ta.SESSIONS)
    assert sum(ln.startswith("    block ") for ln in want) >= 4, "the comparison would say little"
    assert any(ln.startswith("  LIVE") for ln in want) and any(ln.startswith("    kvmem's memory") for ln in want)
    assert got == want, "\n".join(f"C:  {w}\npy: {g}" for w, g in zip(want, got) if w != g) or (want, got)
    assert "logits identical to phase 1" in py_out
    # the last prompt's logits over kvmem memory, before saving: the C demo's to float rounding
    c_exp = np.fromfile(c_dir / "story-expect.bin", np.float32)
    py_exp = np.fromfile(py_dir / "story-expect.bin", np.float32)
    assert c_exp.shape == py_exp.shape and c_exp.size > 0
    np.testing.assert_allclose(py_exp, c_exp, rtol=1e-4, atol=1e-3)
    # the agent files: the same token ids, KV equal to f16 rounding (both engines stored their own K/V)
    held = []
    with kvmem.Context("cpu", 1) as ctx:
        for d in (c_dir, py_dir):  # a file loads into an agent of its own name: one pool each
            pool = ctx.pool_create(ta.kvmem_spec(model.cfg), block_size=16, storage_dtype="f16")
            held.append(pool.agent_open("story-agent"))
            held[-1].load(str(d / "story-agent.safetensors"))
        a, b = held
        assert a.tokens() == b.tokens() and len(a.tokens()) > 250
        for x, y in zip(a.read(), b.read()):
            np.testing.assert_allclose(y, x, rtol=2e-3, atol=2e-3)

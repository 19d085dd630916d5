"""Runs examples/python/agent_loop.py as a user would and checks what it recalled."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bindings", "python"))
from kvmem import _lib  # noqa: E402


def test_agent_loop_recalls_the_relevant_turn():
    # the checkout's package, as an installed one would be found
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "..", "bindings", "python"))
    r = subprocess.run([sys.executable, os.path.join(HERE, "agent_loop.py")], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    turns = re.split(r"^turn \d+: ", out, flags=re.M)[1:]
    assert len(turns) == 6, out
    assert "memory: 52 tokens in 6 blocks" in out
    if not _lib.has_function("kvmem_retrieve"):
        assert "(this libkvmem has no kvmem_retrieve yet)" in turns[1]
        return
    # the question about the sister's food recalls the allergy turn,
    # the question about the mountains recalls the trip turn
    assert "retrieved block 1" in turns[4] and "allergic to peanuts" in turns[4], turns[4]
    assert "retrieved block 0" in turns[5] and "hiking trip to the mountains" in turns[5], turns[5]
    assert "gathered 10 tokens" in turns[5]

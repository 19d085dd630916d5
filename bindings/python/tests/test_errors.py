"""Every error the binding raises is a KvmemError: shape and dtype errors (and
every other argument the binding refuses before C) used to be plain
ValueError / TypeError, which ``except kvmem.KvmemError`` missed. They are
InvalidArgumentError (a ValueError) and InvalidTypeError (a TypeError), so
code catching the builtin classes keeps working."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import kvmem

L, HQ, HKV, D = 2, 4, 2, 8
PKG = Path(kvmem.__file__).resolve().parent


@pytest.fixture
def agent():
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(dict(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D), block_size=4)
    yield pool.agent_open("alice")
    ctx.close()


def caught_both_ways(call, builtin, cls):
    try:
        call()
    except kvmem.KvmemError as e:
        assert isinstance(e, cls) and isinstance(e, builtin), repr(e)
        assert e.status == -1 and e.name == "KVMEM_ERR_INVALID_ARG"
    else:
        pytest.fail("no error")
    with pytest.raises(builtin):
        call()


def test_shape_errors_are_kvmem_errors_and_value_errors(agent):
    k = np.zeros((L, 4, HKV, D + 1), np.float32)
    caught_both_ways(lambda: agent.append(k, k), ValueError, kvmem.InvalidArgumentError)
    q = np.zeros((1, L, HQ + 1, D), np.float32)
    caught_both_ways(lambda: agent.retrieve(q), ValueError, kvmem.InvalidArgumentError)
    caught_both_ways(lambda: agent.append(np.zeros(7, np.float32), np.zeros(7, np.float32)), ValueError,
                     kvmem.InvalidArgumentError)
    caught_both_ways(lambda: agent.append(np.zeros((L, 1, HKV, D), np.float32), np.zeros((L, 1, HKV, D), np.float32),
                                          token_ids=[1, 2]), ValueError, kvmem.InvalidArgumentError)
    assert agent.get_info().n_tokens == 0


def test_dtype_and_type_errors_are_kvmem_errors_and_type_errors(agent):
    k64 = np.zeros((L, 4, HKV, D), np.float64)
    caught_both_ways(lambda: agent.append(k64, k64), TypeError, kvmem.InvalidTypeError)
    k = np.zeros((L, 4, HKV, D), np.float32)
    caught_both_ways(lambda: agent.append(k, k, dtype="int8"), TypeError, kvmem.InvalidTypeError)
    caught_both_ways(lambda: agent.append([1.0], [1.0]), TypeError, kvmem.InvalidTypeError)
    caught_both_ways(lambda: agent.append(k, k, token_ids=np.zeros(4, np.int64)), TypeError, kvmem.InvalidTypeError)
    caught_both_ways(lambda: agent.append(k, k, token_ids=[1.5, 2, 3, 4]), TypeError, kvmem.InvalidTypeError)
    caught_both_ways(lambda: kvmem.ModelSpec(rope_theta="high"), TypeError, kvmem.InvalidTypeError)
    assert agent.get_info().n_tokens == 0


def test_a_misspelt_keyword_is_the_languages_type_error_naming_it(agent):
    """The options are real keyword parameters, so an editor flags topk= and
    Python refuses it naming the keyword, before any kvmem code runs."""
    q = np.zeros((1, L, HQ, D), np.float32)
    with pytest.raises(TypeError, match="unexpected keyword argument 'topk'"):
        agent.retrieve(q, topk=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_layer'"):
        kvmem.ModelSpec(n_layer=2)


def test_the_package_raises_no_bare_builtin_error():
    """A source scan: every `raise` in kvmem/ names a KvmemError subclass (or
    re-raises); ImportError for kvmem.torch without PyTorch, and the exceptions Python's
    protocols require (AttributeError from __setattr__/a module's __getattr__, IndexError from
    a sequence's __getitem__) are the exceptions."""
    builtins = {"TypeError", "ValueError", "IndexError", "KeyError", "OverflowError", "RuntimeError",
                "AttributeError", "MemoryError", "LookupError", "Exception"}
    bad = []
    for path in sorted(PKG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                # ModelSpec.__setattr__: spec.n_layer = 2 is an AttributeError, as on any object;
                # kvmem.torch's module __getattr__ likewise; KvmemCache[i] is a sequence's IndexError
                if isinstance(exc, ast.Name) and exc.id in builtins and (path.name, exc.id) not in {
                        ("_objects.py", "AttributeError"), ("torch.py", "AttributeError"),
                        ("hf.py", "IndexError")}:
                    bad.append(f"{path.name}:{node.lineno}: raise {exc.id}")
    assert not bad, "\n".join(bad)

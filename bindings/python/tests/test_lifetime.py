"""Ownership: idempotent close, context managers, owners closing what they
own, finalizers, errors from closed handles; library lookup; no numpy."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest

import kvmem

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spec():
    return kvmem.ModelSpec(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4)


def test_close_is_idempotent_and_closed_handles_raise():
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(spec())
    a = pool.agent_open("x")
    a.close()
    a.close()
    with pytest.raises(kvmem.ClosedError, match="Agent 'x' is closed"):
        a.flush()
    b = pool.agent_open("x")   # the agent can be opened again once closed
    assert b.id == "x"
    with pytest.raises(kvmem.ExistsError):
        pool.agent_open("x")
    ctx.close()                 # closes the pool, which closes b
    assert pool.closed and b.closed
    with pytest.raises(kvmem.ClosedError):
        pool.get_info()
    ctx.close()


def test_finalizers_free_unclosed_objects():
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(spec())
    a = pool.agent_open("y")
    fin = a._fin
    del a
    gc.collect()
    assert not fin.alive
    b = pool.agent_open("y")    # the handle was closed by the finalizer
    b.close()


def test_pool_params_and_spec_validation():
    with kvmem.Context("cpu", 1) as ctx:
        with pytest.raises(kvmem.InvalidArgumentError, match="block"):
            ctx.pool_create(spec(), block_size=3)
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            ctx.pool_create(spec(), blocksize=4)
        bad = kvmem.ModelSpec(n_layers=1, n_q_heads=3, n_kv_heads=2, head_dim=4)
        with pytest.raises(kvmem.InvalidArgumentError) as ei:
            bad.validate()
        assert ei.value.message and "n_q_heads" in ei.value.message
        with pytest.raises(TypeError, match="'n_layer'"):
            kvmem.ModelSpec(n_layer=1)
        w = kvmem.ModelSpec(n_layers=2, n_q_heads=2, n_kv_heads=1, head_dim=4, layer_window=[0, 8])
        with ctx.pool_create(w) as pool:
            got = pool.get_spec()
            assert [got.layer_window[i] for i in range(2)] == [0, 8]


def test_unknown_backend_error():
    with pytest.raises(kvmem.NotFoundError) as ei:
        kvmem.Context("nonsense")
    assert "nonsense" in ei.value.message and ei.value.status == -4


def test_misc_free_functions():
    assert kvmem.version() == "0.1.0" and kvmem.version_number() == 1000
    assert kvmem.status_str(-6) == "KVMEM_ERR_CLOSED"
    assert kvmem.dtype_name(kvmem.F16) == "f16"
    assert kvmem.agent_id_valid("a.b-c_1") and not kvmem.agent_id_valid(".x")
    assert any(b["name"] == "cpu" and b["available"] for b in kvmem.backends())
    with pytest.raises(kvmem.KvmemError):
        kvmem.Context("nonsense")
    assert "nonsense" in kvmem.last_error()


def test_log_callback_can_be_set_and_cleared():
    got = []
    kvmem.log_set(lambda lvl, msg: got.append((lvl, msg)))
    with kvmem.Context("cpu", 1):
        pass
    kvmem.log_set(None)
    assert all(isinstance(m, str) for _, m in got)


def run_py(code, env=None):
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = PKG
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e,
                          capture_output=True, text=True, timeout=60)


def test_library_lookup_error_lists_places():
    r = run_py("import kvmem", {"KVMEM_LIBRARY": "/nonexistent/libkvmem.so"})
    assert r.returncode != 0
    assert "KVMEM_LIBRARY" in r.stderr and "/nonexistent/libkvmem.so (no such file)" in r.stderr


def test_works_without_numpy():
    r = run_py("""
        import sys, array
        sys.modules["numpy"] = None          # import numpy now fails
        import kvmem
        with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(kvmem.ModelSpec(
                n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4), storage_dtype="f32") as pool:
            a = pool.agent_open("n")
            a.append(array.array("f", range(8)), bytes(array.array("f", range(8, 16))), dtype="f32")
            k, v = a.read()
            assert isinstance(k, memoryview) and k.shape == (1, 2, 1, 4), k
            assert k.tolist() == [[[[0, 1, 2, 3]], [[4, 5, 6, 7]]]]
            mn, mx = a.block_aabb(0) if a.get_info().n_sealed else (None, None)
            print("ok", v.tolist()[0][1][0])
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "[12.0,", "13.0,", "14.0,", "15.0]"]


def test_finalizers_at_interpreter_exit_are_safe():
    r = run_py("""
        import kvmem
        ctx = kvmem.Context("cpu", 1)
        pool = ctx.pool_create(kvmem.ModelSpec(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=4))
        agents = [pool.agent_open(f"a{i}") for i in range(3)]
        print("bye")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "bye" and r.stderr == ""

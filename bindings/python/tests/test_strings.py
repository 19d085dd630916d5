"""Ids and paths with a NUL are refused before C sees them (C would read up
to the NUL: agent_open("alice\\x00-evil") used to open agent "alice"), with
InvalidArgumentError (a ValueError); a value of the wrong type (bytes for an
id) is a TypeError, not an AttributeError. Nothing is created, opened,
removed or written by a refused call."""
from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

import kvmem

L, H, D = 1, 1, 8


def make_pool(**params):
    ctx = kvmem.Context("cpu", 1)
    return ctx, ctx.pool_create(kvmem.ModelSpec(n_layers=L, n_q_heads=2, n_kv_heads=H, head_dim=D),
                                block_size=4, **params)


def refused(call, what):
    with pytest.raises(ValueError) as ei:
        call()
    assert isinstance(ei.value, kvmem.InvalidArgumentError)
    assert "NUL" in str(ei.value) and what in str(ei.value), str(ei.value)


def test_agent_ids_with_nul_are_refused():
    ctx, pool = make_pool()
    for bad in ("alice\x00-evil", "\x00", "alice\x00"):
        refused(lambda: pool.agent_open(bad), "agent id")
    assert pool.agent_ids() == []                 # "alice" was not created
    a = pool.agent_open("alice")
    a.close()
    refused(lambda: pool.remove_agent("alice\x00-evil"), "agent id")
    assert pool.agent_ids() == ["alice"]          # and not removed either
    assert kvmem.agent_id_valid("alice") and not kvmem.agent_id_valid("alice\x00-evil")
    ctx.close()


@pytest.mark.parametrize("bad", [b"alice", bytearray(b"alice"), None, 7, pathlib.Path("alice")])
def test_ids_of_the_wrong_type_raise_type_error(bad):
    ctx, pool = make_pool()
    with pytest.raises(TypeError, match="agent id must be a str"):
        pool.agent_open(bad)
    with pytest.raises(TypeError, match="agent id must be a str"):
        pool.remove_agent(bad)
    with pytest.raises(TypeError):
        kvmem.agent_id_valid(bad)
    assert pool.agent_ids() == []
    ctx.close()


def test_paths_with_nul_are_refused_and_nothing_is_written(tmp_path):
    ctx, pool = make_pool(storage_dtype="f32")
    a = pool.agent_open("alice")
    k = np.arange(L * 5 * H * D, dtype=np.float32).reshape(L, 5, H, D)
    a.append(k, -k)
    target = tmp_path / "alice.kvm"
    for bad in (str(target) + "\x00.bak", os.fsencode(str(target)) + b"\x00.bak"):
        refused(lambda: a.save(bad), "path")
    assert os.listdir(tmp_path) == []             # "alice.kvm" was not written
    # the path forms the os module takes work: str, bytes, os.PathLike
    a.save(target)
    a.load(os.fsencode(str(target)))
    a.load(str(target))
    np.testing.assert_array_equal(a.read()[1], -k)
    refused(lambda: a.load(str(target) + "\x00"), "path")
    with pytest.raises(TypeError, match="path must be a str, bytes or os.PathLike"):
        a.load(42)
    refused(lambda: make_pool(store_dir=str(tmp_path) + "\x00/elsewhere"), "store_dir")
    ctx.close()


def test_other_names_with_nul_are_refused():
    refused(lambda: kvmem.Context("cpu\x00cuda"), "backend")
    refused(lambda: kvmem.ModelSpec(n_layers=1, model_id="llama\x00-other"), "model_id")
    refused(lambda: kvmem.ModelSpec(n_layers=1, model_id=b"llama\x00-other"), "model_id")
    ctx, pool = make_pool()
    refused(lambda: pool.segments_create("robot\x00x"), "owner")
    assert pool.agent_ids() == []                 # no segment store reserved agents
    segs = pool.segments_create("robot")
    refused(lambda: segs.add("tool\x00s", 0), "segment name")
    segs.add("tools", 0)
    refused(lambda: segs.find("tools\x00x"), "segment name")
    assert segs.find("tools") == 0
    segs.close()
    ctx.close()
    if kvmem.has_function("kvmem_qmem_store_create"):
        refused(lambda: kvmem.QmemHead("/tmp/head\x00.safetensors"), "path")
        with kvmem.QmemStore(kvmem.ModelSpec(n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=8), capacity=2) as store:
            refused(lambda: store.session_key(session_id="chat-1\x00x"), "session_id")
            k = store.session_key(session_id="chat-1")
            assert k.kind == kvmem.SESSION_EXPLICIT

"""Persistence through the binding: save/load round trip, store_dir, sync,
truncate, prefix match, batch merge/extract, errors with messages."""
from __future__ import annotations

import os

import numpy as np
import pytest

import kvmem

L, H, D = 2, 2, 8


def setup(tmp_path, **params):
    ctx = kvmem.Context("cpu", 1)
    pool = ctx.pool_create(kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D),
                           block_size=4, **params)
    return ctx, pool


def test_save_load_round_trip(tmp_path):
    ctx, pool = setup(tmp_path, storage_dtype="f32")
    a = pool.agent_open("alice")
    k = np.random.default_rng(0).standard_normal((L, 7, H, D)).astype(np.float32)
    text = "hello world"
    a.append(k, k * 2, token_ids=list(range(7)), text=text, token_text_offsets=[0, 1, 2, 4, 6, 8, 10])
    path = str(tmp_path / "alice.safetensors")
    a.save(path)
    assert os.path.getsize(path) > 0
    b = pool.agent_open("bob")
    with pytest.raises(kvmem.MismatchError) as ei:
        b.load(path)                      # the file belongs to alice
    assert "alice" in ei.value.message or "agent" in ei.value.message
    a.truncate(3)
    assert a.get_info().n_tokens == 3 and a.text() == "hell"   # cut at token 3's offset
    a.load(path)
    rk, rv = a.read()
    np.testing.assert_array_equal(rk, k)
    np.testing.assert_array_equal(rv, k * 2)
    assert a.tokens() == list(range(7)) and a.text() == text
    m = a.prefix_match("hello world, again")
    assert m["kind"] == kvmem.PREFIX_EXTEND and m["reuse_tokens"] == 7
    m = a.prefix_match("hello there")
    assert m["kind"] == kvmem.PREFIX_DIVERGE
    with open(path, "r+b") as f:          # corrupt one data byte
        f.seek(-3, os.SEEK_END)
        c = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([c[0] ^ 0xFF]))
    with pytest.raises(kvmem.KvmemError) as ei:
        a.load(path)
    assert ei.value.status in (-10, -11) and ei.value.message
    assert a.get_info().n_tokens == 7     # a failed load changes nothing
    ctx.close()


def test_store_dir_and_sync(tmp_path):
    ctx, pool = setup(tmp_path, store_dir=str(tmp_path))
    a = pool.agent_open("carol")
    a.append(np.ones((L, 5, H, D), np.float32), np.ones((L, 5, H, D), np.float32))
    a.close()
    pool.sync()
    assert os.path.exists(tmp_path / "carol.safetensors")
    ctx.close()
    with pytest.raises(kvmem.NotFoundError):
        ctx2, pool2 = setup(tmp_path)
        try:
            pool2.agent_open("x").save()      # no store, no path
        finally:
            ctx2.close()


def test_batch_merge_and_extract(tmp_path):
    ctx, pool = setup(tmp_path, storage_dtype="f32")
    a, b = pool.agent_open("a"), pool.agent_open("b")
    ka = np.random.default_rng(1).standard_normal((L, 5, H, D)).astype(np.float32)
    kb = np.random.default_rng(2).standard_normal((L, 3, H, D)).astype(np.float32)
    a.append(ka, ka)
    b.append(kb, kb)
    k, v, lengths = kvmem.batch_merge([a, b], layer=1)
    assert lengths == [5, 3] and k.shape == (2, H, 5, D)
    np.testing.assert_array_equal(k[1, :, 2:, :], kb[1].transpose(1, 0, 2))
    assert (k[1, :, :2, :] == 0).all()    # left padding
    row = kvmem.batch_extract(k, 1, 3, 0, 3)
    np.testing.assert_array_equal(row, kb[1])
    with pytest.raises(kvmem.InvalidArgumentError):
        kvmem.batch_merge([a, b], layer=5)
    ctx.close()


def test_agent_open_file_reads_in_place(tmp_path):
    """A saved agent opened in place (experimental) reads back what the same
    file loaded gives, fits a pool smaller than the file, and is read-only."""
    ctx, pool = setup(tmp_path, storage_dtype="q4")
    a = pool.agent_open("dora")
    k = np.random.default_rng(1).standard_normal((L, 64 * 4 + 1, H, D)).astype(np.float32)
    a.append(k, -k, token_ids=list(range(k.shape[1])))
    path = tmp_path / "dora.safetensors"
    a.save(path)
    ref_k, ref_v = a.read()
    a.close()
    pool.remove_agent("dora")
    size = os.path.getsize(path)
    small = ctx.pool_create(kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D),
                            block_size=4, storage_dtype="q4", capacity_bytes=size // 2)
    m = small.agent_open_file(path)
    assert m.id == "dora" and m.get_info().n_tokens == k.shape[1]
    assert small.get_info().used_bytes <= size // 2
    mk, mv = m.read()
    np.testing.assert_array_equal(mk, ref_k)
    np.testing.assert_array_equal(mv, ref_v)
    with pytest.raises(kvmem.UnsupportedError) as ei:
        m.append(k[:, :1], k[:, :1])
    assert "read-only" in ei.value.message
    with pytest.raises(kvmem.ExistsError):
        small.agent_open_file(path, verify=False)
    with pytest.raises(kvmem.NotFoundError):
        small.agent_open_file(tmp_path / "missing.safetensors")
    m.close()
    ctx.close()

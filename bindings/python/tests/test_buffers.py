"""Tensors cross without copies: strided numpy views, f16, bf16 bits, plain
buffers; wrong dtypes and layouts get a clear TypeError before any C call."""
from __future__ import annotations

import array
import gc

import numpy as np
import pytest

import kvmem

L, H, D = 2, 2, 8


@pytest.fixture
def agent():
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(
            kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D),
            block_size=4, storage_dtype="f32") as pool, pool.agent_open("t") as a:
        yield a


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_strided_input_is_read_in_place(agent):
    big = rnd(L, 6, H, 2 * D)
    k = big[:, :, :, ::2]          # every other element: strides, no copy
    v = big[:, ::-1, :, 1::2].copy()
    assert not k.flags.c_contiguous
    agent.append(k, v)
    rk, rv = agent.read()
    np.testing.assert_array_equal(rk, k)
    np.testing.assert_array_equal(rv, v)


def test_read_into_strided_output_writes_in_place(agent):
    k, v = rnd(L, 5, H, D, seed=1), rnd(L, 5, H, D, seed=2)
    agent.append(k, v)
    buf = np.full((L, 5, H, 2 * D), 7.0, dtype=np.float32)
    out = buf[..., D:]
    rk, _ = agent.read(k_out=out, values=False)
    assert rk is out
    np.testing.assert_array_equal(buf[..., D:], k)
    assert (buf[..., :D] == 7.0).all()  # nothing written beside the view


def test_f16_in_and_out(agent):
    k = rnd(L, 3, H, D, seed=3).astype(np.float16)
    agent.append(k, k)
    rk, rv = agent.read(dtype="f16")
    assert rk.dtype == np.float16
    np.testing.assert_array_equal(rk, k)


def test_bf16_as_uint16_bits(agent):
    k = rnd(L, 3, H, D, seed=4)
    bits = (k.view(np.uint32) >> 16).astype(np.uint16)   # truncation is a valid bf16
    agent.append(bits, bits, dtype="bf16")
    rk, _ = agent.read(values=False)
    np.testing.assert_array_equal(rk, (bits.astype(np.uint32) << 16).view(np.float32))
    rb, _ = agent.read(dtype="bf16", values=False)
    assert rb.dtype == np.uint16
    np.testing.assert_array_equal(rb, bits)


def test_uint16_without_dtype_is_refused(agent):
    x = np.zeros((L, 1, H, D), np.uint16)
    with pytest.raises(TypeError, match="dtype='bf16'"):
        agent.append(x, x)


def test_wrong_dtype_and_layout(agent):
    with pytest.raises(TypeError, match="float32"):
        agent.append(np.zeros((L, 1, H, D)), np.zeros((L, 1, H, D)))          # float64
    with pytest.raises(TypeError, match="strides"):
        x = rnd(L, 4, H, D)[:, ::-1]
        agent.append(x, x)                                                     # negative stride
    with pytest.raises(TypeError, match="big-endian"):
        x = rnd(L, 1, H, D).astype(">f4")
        agent.append(x, x)
    with pytest.raises(TypeError, match="buffer"):
        agent.append([1.0] * 32, [1.0] * 32)                                  # a list is no buffer
    with pytest.raises(ValueError, match="shape"):
        agent.append(rnd(L, 2, H, D + 1), rnd(L, 2, H, D + 1))
    with pytest.raises(TypeError, match="writable"):
        agent.append(rnd(L, 1, H, D), rnd(L, 1, H, D))
        agent.read(k_out=bytes(4 * L * H * D), values=False)
    assert agent.get_info().n_tokens == 1


def test_flat_buffers_take_the_pool_shape(agent):
    k = rnd(L, 3, H, D, seed=5)
    agent.append(array.array("f", k.ravel()), memoryview(k.tobytes()), dtype="f32")
    rk, rv = agent.read()
    np.testing.assert_array_equal(rk, k)
    np.testing.assert_array_equal(rv, k)
    with pytest.raises(ValueError, match="whole tensor"):
        agent.append(array.array("f", [0.0] * 7), array.array("f", [0.0] * 7))


def test_buffer_exports_are_released(agent):
    buf = bytearray(4 * L * 2 * H * D)
    agent.append(buf, buf, dtype="f32")
    buf.extend(b"1234")   # a held export would make bytearray refuse to resize
    with pytest.raises(TypeError):
        agent.append(np.zeros(3, np.float64), buf)
    buf.extend(b"1234")


def test_no_copy_on_input(agent, monkeypatch):
    """The tensor handed to C points into the caller's array."""
    seen = {}
    real = kvmem._lib.kvmem_agent_append

    def spy(h, kt, vt, ap):
        seen["k"] = kt._obj.data
        return real(h, kt, vt, ap)
    monkeypatch.setattr(kvmem._lib, "kvmem_agent_append", spy)
    k = rnd(L, 2, H, D)
    agent.append(k, k)
    assert seen["k"] == k.ctypes.data
    gc.collect()

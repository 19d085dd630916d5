"""kvmem.torch takes any DLPack exporter (numpy arrays, capsules, other
libraries' tensors) as a view of the producer's own memory: the pointer and
strides C receives are the producer's, the producer stays alive as long as
the view, a capsule is consumed once, and dtypes, strides and devices kvmem
cannot take are refused before anything consumes the export or reaches C."""
from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="skipped: torch not installed (apt-get install python3-torch)")
from torch.utils import dlpack as tdl  # noqa: E402

import kvmem  # noqa: E402
import kvmem.torch as kt  # noqa: E402
from kvmem import _dlpack  # noqa: E402

L, HQ, HKV, D, BS = 2, 4, 2, 16, 4

if not hasattr(np, "from_dlpack"):  # numpy < 1.22
    pytest.skip("skipped: numpy < 1.22 has no DLPack", allow_module_level=True)


@pytest.fixture
def agent():
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D)
    with kvmem.Context("cpu", 1) as ctx, ctx.pool_create(spec, block_size=BS, storage_dtype="f32") as pool, \
            pool.agent_open("d") as a:
        yield a


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def kvmem_order(layers, b=0):
    """numpy [batch, heads, seq, dim] per layer -> [layers][seq][heads][dim] of row b, float32."""
    return np.stack([np.asarray(x, dtype=np.float32)[b].transpose(1, 0, 2) for x in layers])


class Producer:
    """A DLPack exporter that is neither torch nor numpy (as CuPy or JAX arrays
    are): it hands over a capsule of memory it owns, on the device it says."""

    def __init__(self, t, device=(1, 0)):
        self.t, self.device, self.exports = t, device, 0

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.exports += 1
        return tdl.to_dlpack(self.t)


# ---- views of the producer's memory --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numpy_caches_are_viewed_in_place_with_their_strides(agent, dtype):
    K, V = rand(L, 3, HKV, 10, D, seed=1, dtype=dtype), rand(L, 3, HKV, 10, D, seed=2, dtype=dtype)
    cache = tuple((K[i], V[i]) for i in range(L))  # head-major [batch, heads, seq, dim] per layer
    kv, vv = kt.kv_views(cache, batch_index=2, start=3, stop=9)
    isz = K.itemsize
    assert kv.data == K.ctypes.data + (2 * K.strides[1] + 3 * K.strides[3])  # row 2, token 3 of layer 0
    assert vv.data == V.ctypes.data + (2 * V.strides[1] + 3 * V.strides[3])
    assert not kv.copied and not vv.copied
    assert kv.shape == (L, 6, HKV, D)
    assert kv.strides == (K.strides[0] // isz, K.strides[3] // isz, K.strides[2] // isz, 1)
    assert kt.append(agent, cache, batch_index=2, start=3, stop=9) is True
    rk, rv = agent.read()
    np.testing.assert_array_equal(rk, kvmem_order([K[i][:, :, 3:9] for i in range(L)], 2))
    np.testing.assert_array_equal(rv, kvmem_order([V[i][:, :, 3:9] for i in range(L)], 2))


def test_non_contiguous_numpy_slices_keep_their_strides(agent):
    # HF computes k as [batch, seq, heads, dim] and transposes it: a view whose seq stride is
    # heads * dim; every other token of it is a slice with twice that stride
    base = rand(L, 1, 12, HKV, D, seed=3)
    layers = [base[i].transpose(0, 2, 1, 3)[:, :, ::2] for i in range(L)]
    kv, _ = kt.kv_views(tuple((k, k) for k in layers))
    assert kv.data == base.ctypes.data and not kv.copied
    assert kv.strides == (base.strides[0] // 4, 2 * HKV * D, D, 1)
    kt.append(agent, tuple((k, k) for k in layers))
    np.testing.assert_array_equal(agent.read()[0], kvmem_order(layers))


def test_queries_and_gather_outputs_cross_by_dlpack(agent):
    kt.append(agent, tuple((rand(1, HKV, 16, D, seed=10 + i), rand(1, HKV, 16, D)) for i in range(L)))
    agent.flush()
    Q = rand(L, 1, HQ, 3, D, seed=4)  # HF query states per layer, one numpy storage
    qv = kt.query_view(list(Q), agent.pool.spec)
    assert qv.data == Q.ctypes.data and qv.shape == (3, L, HQ, D) and not qv.copied
    want = agent.retrieve(np.ascontiguousarray(Q[:, 0].transpose(2, 0, 1, 3)), top_k=2).get()
    got = kt.retrieve(agent, list(Q), top_k=2).get()
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    # gather writes straight into a caller's numpy cache (layers slices of one array)
    ok, ov = (np.full((L, 1, HKV, 12, D), 7.0, dtype=np.float32) for _ in range(2))
    kt.gather(agent, [1, 3], base_position=5, out=tuple((ok[i], ov[i]) for i in range(L)), out_start=2)
    nk, nv = agent.gather([1, 3], 5)
    np.testing.assert_array_equal(ok[:, 0, :, 2:10], nk.transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(ov[:, 0, :, 2:10], nv.transpose(0, 2, 1, 3))
    for o in (ok, ov):
        assert (o[:, :, :, :2] == 7).all() and (o[:, :, :, 10:] == 7).all()


def test_other_exporters_and_bf16_are_viewed_in_place(agent):
    t = torch.randn(L, 1, HKV, 6, D, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    prods = [Producer(t[i]) for i in range(L)]
    kv, _ = kt.kv_views(tuple((p, p) for p in prods))
    assert kv.data == t.data_ptr() and not kv.copied and kv.c.dtype == kvmem.BF16
    kt.append(agent, tuple((p, p) for p in prods))
    back = kt.read(agent, dtype=torch.bfloat16)
    for i in range(L):
        assert torch.equal(back[i][0], t[i])


def test_the_producer_stays_alive_while_its_view_does():
    arr = rand(1, HKV, 4, D, seed=6)
    ref = weakref.ref(arr)
    kv, _ = kt.kv_views(((arr, arr),) * L)
    del arr
    gc.collect()
    assert ref() is not None and kv.data == ref().ctypes.data
    del kv, _
    gc.collect()
    assert ref() is None


# ---- capsules: consumed once ---------------------------------------------------------------------

def test_a_capsule_is_consumed_once_and_a_used_one_is_refused(agent):
    t = torch.randn(1, HKV, 4, D)
    cap = tdl.to_dlpack(t)
    # one capsule several times in one call: imported once, no copy
    kv, vv = kt.kv_views(((cap, cap),) * L)
    assert kv.data == vv.data == t.data_ptr()
    del kv, vv
    with pytest.raises(ValueError, match="capsule was already consumed"):
        kt.append(agent, ((cap, cap),) * L)
    used = tdl.to_dlpack(t)
    tdl.from_dlpack(used)  # consumed by torch itself
    with pytest.raises(ValueError, match="capsule was already consumed"):
        kt.retrieve(agent, used)
    assert agent.get_info().n_tokens == 0
    fresh = [tdl.to_dlpack(t) for _ in range(2 * L)]
    kt.append(agent, tuple((fresh[2 * i], fresh[2 * i + 1]) for i in range(L)))
    np.testing.assert_array_equal(agent.read()[0], kvmem_order([t.numpy()] * L))


def _fake_capsule(device_type, dtype=(2, 32), strides=None, shape=(1, HKV, 4, D)):
    """A DLPack capsule over host memory that says what we tell it; nothing may consume it."""
    buf = (ctypes.c_float * 512)()
    shp = (ctypes.c_int64 * len(shape))(*shape)
    st = (ctypes.c_int64 * len(shape))(*strides) if strides else None
    m = _dlpack._DLManagedTensor()
    m.dl_tensor.data = ctypes.addressof(buf)
    m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = device_type, 1
    m.dl_tensor.ndim = len(shape)
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = dtype[0], dtype[1], 1
    m.dl_tensor.shape = shp
    if st is not None:
        m.dl_tensor.strides = st
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    cap = new(ctypes.addressof(m), b"dltensor", None)
    return cap, (buf, shp, st, m)  # the second item keeps the memory alive


# ---- refusals: before anything is consumed or reaches C ------------------------------------------

def test_device_exports_are_refused_naming_the_device_before_they_export(agent):
    p = Producer(torch.zeros(1, HKV, 4, D), device=(10, 0))
    with pytest.raises(kvmem.UnsupportedError, match=r"cache layer 0 k is on rocm:0.*move it to the CPU first"):
        kt.append(agent, ((p, p),) * L)
    assert p.exports == 0  # refused on __dlpack_device__, never exported
    with pytest.raises(kvmem.UnsupportedError, match="queries is on rocm:3"):
        kt.retrieve(agent, Producer(torch.zeros(2, L, HQ, D), device=(10, 3)))
    cap, keep = _fake_capsule(10)  # a capsule (no __dlpack_device__) read before torch takes it
    with pytest.raises(kvmem.UnsupportedError, match="is on rocm:1"):
        kt.append(agent, ((cap, cap),) * L)
    assert _dlpack._is_valid(cap, b"dltensor")  # not consumed
    assert agent.get_info().n_tokens == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="skipped: this torch has CUDA, so it imports CUDA exports")
def test_cuda_exports_a_cpu_only_torch_cannot_import_are_refused_before_they_export(agent):
    p = Producer(torch.zeros(1, HKV, 4, D), device=(2, 0))
    with pytest.raises(kvmem.UnsupportedError, match=r"cache layer 0 k is on cuda:0 but this torch has no CUDA"):
        kt.append(agent, ((p, p),) * L)
    assert p.exports == 0
    cap, keep = _fake_capsule(2)
    with pytest.raises(kvmem.UnsupportedError, match=r"is on cuda:1 but this torch has no CUDA.*DeviceTensor.from_dlpack"):
        kt.append(agent, ((cap, cap),) * L)
    assert _dlpack._is_valid(cap, b"dltensor")
    assert agent.get_info().n_tokens == 0


def test_dtypes_strides_and_shapes_kvmem_cannot_take_are_refused(agent):
    good = rand(1, HKV, 4, D)
    cases = [
        (good.astype(np.int32), TypeError, r"cache layer 0 k is int32 \(DLPack\); kvmem takes float32"),
        (good.astype(np.float64), TypeError, r"is float64 \(DLPack\)"),
        # PyTorch 1.13's importer aborts the process on negative strides: refused before it sees them
        (good[:, :, ::-1], ValueError, r"strides \(.*-16.*\) \(elements\) are negative"),
        (good[0], ValueError, r"expected \[batch, n_kv_heads, seq, head_dim\]"),
    ]
    ro = good.copy()
    ro.flags.writeable = False  # numpy cannot say read-only in DLPack, so it refuses to export
    cases.append((ro, TypeError, r"DLPack export \(__dlpack__\) failed"))
    for bad, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            kt.append(agent, ((bad, good),) * L)
    cap, keep = _fake_capsule(1, dtype=(5, 64))
    with pytest.raises(TypeError, match=r"is complex64 \(DLPack\)"):
        kt.append(agent, ((cap, cap),) * L)
    cap, keep = _fake_capsule(1, strides=(64, 32, 8, -1))
    with pytest.raises(ValueError, match="are negative"):
        kt.append(agent, ((cap, cap),) * L)
    with pytest.raises(TypeError, match="must be a torch.Tensor or an object exporting DLPack"):
        kt.append(agent, ((memoryview(b"x"), good),) * L)
    assert agent.get_info().n_tokens == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device (torch here is CPU-only)")
def test_cuda_tensors_through_dlpack(agent):  # pragma: no cover - needs a GPU
    # CUDA memory goes to C as a device tensor, directly as through DLPack: the CPU context
    # refuses it with the C library's message, and nothing is copied behind the caller's back.
    k = torch.randn(1, HKV, 4, D, device="cuda")
    for x in (k, Producer(k, device=k.__dlpack_device__())):
        with pytest.raises(kvmem.UnsupportedError, match="K is in CUDA device memory but the context runs on cpu"):
            kt.append(agent, ((x, x),) * L)
    assert agent.get_info().n_tokens == 0

"""CUDA tensors cross by DLPack without a copy (kvmem/_dlpack.py): a kDLCUDA
export becomes a DeviceTensor of kind "cuda" whose descriptor is the
producer's own pointer, offset, device and stream; the capsule is consumed
and its deleter runs once, when the view goes; other devices are refused
naming them before anything is exported or consumed. The exports here are
made up with ctypes over addresses nothing dereferences: a CPU context
refuses device memory before reading it. Real CUDA memory is tested where
torch sees a GPU (skipped otherwise, with the reason)."""
from __future__ import annotations

import ctypes
import gc
import itertools
import weakref

import numpy as np
import pytest

import kvmem
from kvmem import _dlpack

L, H, D, TMAX, T = 2, 2, 8, 8, 4
FAKE = 0x7F3A_0000_0000  # a made-up device address: never read
DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new = ctypes.pythonapi.PyCapsule_New
_new.restype, _new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Fake:
    """A DLManagedTensor built by hand and a capsule over it; counts its deleter's calls."""

    def __init__(self, device_type=2, device_id=1, shape=(L, T, H, D), strides=None, dtype=(2, 16),
                 byte_offset=256, data=FAKE):
        self.shape_arr = (ctypes.c_int64 * len(shape))(*shape)
        self.strides_arr = (ctypes.c_int64 * len(shape))(*strides) if strides is not None else None
        self.m = m = _dlpack._DLManagedTensor()
        t = m.dl_tensor
        t.data, t.byte_offset = data, byte_offset
        t.device.device_type, t.device.device_id = device_type, device_id
        t.ndim = len(shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = dtype[0], dtype[1], 1
        t.shape = self.shape_arr
        if self.strides_arr is not None:
            t.strides = self.strides_arr
        self.deleted = []
        self.cb = DELETER(lambda p: self.deleted.append(p))
        m.deleter = ctypes.cast(self.cb, ctypes.c_void_p).value
        self.capsule = _new(ctypes.addressof(m), b"dltensor", None)

    @property
    def address(self):
        return ctypes.addressof(self.m)


class Producer:
    """An exporter (as CuPy's arrays are): says its device, hands over a fresh capsule per export."""

    def __init__(self, device=(2, 0), **kw):
        self.device, self.kw, self.fakes, self.streams = device, kw, [], []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        f = Fake(device_type=self.device[0], device_id=self.device[1], **self.kw)
        self.fakes.append(f)
        return f.capsule


def span_bytes(shape, strides, itemsize):
    """One past the farthest byte the view reaches, from element 0: every index visited."""
    far = max(sum(i * s for i, s in zip(idx, strides)) for idx in itertools.product(*map(range, shape)))
    return (far + 1) * itemsize


def used(capsule):
    return bool(_dlpack._is_valid(capsule, b"used_dltensor"))


HEAD_MAJOR = (H * TMAX * D, D, TMAX * D, 1)  # [L][H][TMAX][D] memory seen as [L][T][H][D]


def test_a_cuda_capsule_is_a_device_tensor_over_the_producers_memory():
    f = Fake(strides=HEAD_MAJOR, device_id=1, byte_offset=256)
    dt = kvmem.DeviceTensor.from_dlpack(f.capsule, stream=0x5000)
    mem, t = dt._mem, dt._t
    assert mem.kind == 1 and mem.device == 1  # KVMEM_MEMORY_CUDA on the export's device
    assert mem.handle == FAKE and mem.offset == 256
    assert mem.size == 256 + span_bytes((L, T, H, D), HEAD_MAJOR, 2)
    assert mem.stream == 0x5000
    assert t.dtype == 1 | 0x100  # f16 | KVMEM_DTYPE_DEVICE
    assert t.data == ctypes.addressof(mem)
    assert tuple(t.shape[:t.ndim]) == (L, T, H, D) and tuple(t.strides[:t.ndim]) == HEAD_MAJOR
    # consumed as a DLPack consumer does, deleted once when the view goes
    assert used(f.capsule) and f.deleted == []
    with pytest.raises(kvmem.InvalidArgumentError, match="already consumed"):
        kvmem.DeviceTensor.from_dlpack(f.capsule)
    del dt
    gc.collect()
    assert f.deleted == [f.address]


def test_null_strides_managed_memory_and_views_smaller_than_row_major():
    f = Fake(device_type=13, device_id=0, dtype=(4, 16), byte_offset=0)  # cuda_managed, bf16, NULL strides
    dt = kvmem.DeviceTensor.from_dlpack(f.capsule)
    rm = (T * H * D, H * D, D, 1)
    assert dt._mem.kind == 1 and dt._mem.stream is None  # the legacy default stream
    assert tuple(dt._t.strides[:4]) == rm and dt._t.dtype == 2 | 0x100
    assert dt._mem.size == span_bytes((L, T, H, D), rm, 2) == L * T * H * D * 2
    # K expanded over the heads (stride 0, as GQA's repeat_kv views are): it spans less than
    # its row-major size, and the descriptor says exactly that
    bcast = (T * D, D, 0, 1)
    g = Fake(strides=bcast, dtype=(2, 32), byte_offset=64)
    dg = kvmem.DeviceTensor.from_dlpack(g.capsule)
    assert dg._mem.size == 64 + span_bytes((L, T, H, D), bcast, 4) == 64 + L * T * D * 4
    assert tuple(dg._t.strides[:4]) == bcast


def test_an_exporter_gets_the_consumers_stream_and_stays_alive_with_the_view():
    p = Producer(device=(2, 3), strides=HEAD_MAJOR)
    dt = kvmem.DeviceTensor.from_dlpack(p, stream=2)  # the per-thread default stream
    assert p.streams == [2] and dt._mem.stream == 2 and dt._mem.device == 3
    f = p.fakes[0]
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is not None and f.deleted == []
    del dt
    gc.collect()
    assert ref() is None and f.deleted == [f.address]
    q = Producer()
    kvmem.DeviceTensor.from_dlpack(q)  # no stream given: not passed, the legacy default stream
    kvmem.DeviceTensor.from_dlpack(q, stream=-1)  # -1: the producer does not synchronise
    assert q.streams == [None, -1]
    for bad in (0, -2, 1 << 64, 1.5, True):
        with pytest.raises(kvmem.InvalidArgumentError, match="stream"):
            kvmem.DeviceTensor.from_dlpack(q, stream=bad)
    assert len(q.streams) == 2


def test_other_devices_host_memory_and_dtypes_are_refused_before_anything_is_consumed():
    for dev, err, msg in (((10, 0), kvmem.UnsupportedError, r"rocm:0 \(DLPack device type 10\)"),
                          ((7, 0), kvmem.UnsupportedError, r"vulkan:0 \(DLPack device type 7\)"),
                          ((1, 0), kvmem.InvalidTypeError, r"host memory \(cpu\)"),
                          ((3, 0), kvmem.InvalidTypeError, r"host memory \(cuda_host:0\)")):
        p = Producer(device=dev)
        with pytest.raises(err, match=msg):
            kvmem.DeviceTensor.from_dlpack(p)
        assert p.streams == []  # never exported
        f = Fake(device_type=dev[0], device_id=dev[1])
        with pytest.raises(err, match=msg):
            kvmem.DeviceTensor.from_dlpack(f.capsule)
        assert not used(f.capsule) and f.deleted == []
    f = Fake(dtype=(0, 32))
    with pytest.raises(kvmem.InvalidTypeError, match=r"int32 \(DLPack\)"):
        kvmem.DeviceTensor.from_dlpack(f.capsule)
    assert not used(f.capsule) and f.deleted == []


def test_a_cpu_context_refuses_cuda_exports_with_the_c_librarys_message_and_nothing_changes():
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D)
    with kvmem.Context("cpu") as ctx, ctx.pool_create(spec, block_size=4) as pool, pool.agent_open("a") as a:
        v = np.zeros((L, T, H, D), np.float32)
        k = np.ones((L, T, H, D), np.float32)
        a.append(k, v)
        before = a.read()
        p = Producer(device=(2, 0), strides=HEAD_MAJOR, dtype=(2, 32))
        with pytest.raises(kvmem.UnsupportedError,
                           match=r"K is in CUDA device memory but the context runs on cpu: create the context "
                                 r"with backend \"cuda\""):
            a.append(p, v)  # an exporter straight into a call: taken as a DeviceTensor
        assert len(p.fakes) == 1
        gc.collect()
        assert p.fakes[0].deleted == [p.fakes[0].address]  # the call's view is gone, and with it the capsule
        f = Fake(strides=HEAD_MAJOR, dtype=(2, 32))
        with pytest.raises(kvmem.UnsupportedError, match="V is in CUDA device memory"):
            a.append(k, f.capsule)
        assert a.get_info().n_tokens == T
        for x, y in zip(a.read(), before):
            np.testing.assert_array_equal(x, y)
        with pytest.raises(kvmem.InvalidTypeError, match=r"host memory \(cpu\)"):
            a.append(Producer(device=(1, 0)), v)  # a host exporter without the buffer protocol
        assert a.get_info().n_tokens == T


def _torch_cuda():
    torch = pytest.importorskip("torch", reason="skipped: torch not installed (apt-get install python3-torch)")
    if not torch.cuda.is_available():
        pytest.skip("skipped: no CUDA device (torch.cuda.is_available() is False)")
    return torch


def test_torch_cuda_tensors_through_dlpack_on_a_gpu():  # pragma: no cover - needs a GPU
    torch = _torch_cuda()
    x = torch.randn(L, H, TMAX, D, device="cuda", dtype=torch.float16).transpose(1, 2)[:, :T]
    s = torch.cuda.Stream()
    dt = kvmem.DeviceTensor.from_dlpack(x, stream=s.cuda_stream)
    assert dt._mem.handle + dt._mem.offset == x.data_ptr() and dt._mem.device == x.device.index
    assert dt._mem.stream == s.cuda_stream
    assert tuple(dt._t.strides[:4]) == x.stride()


def test_kvmem_torch_passes_cuda_tensors_as_device_tensors_on_a_gpu():  # pragma: no cover - needs a GPU
    torch = _torch_cuda()
    import kvmem.torch as kt
    k = torch.randn(L, 1, H, TMAX, D, device="cuda")
    v = torch.randn(L, 1, H, TMAX, D, device="cuda")
    cache = tuple((k[i], v[i]) for i in range(L))
    kv, vv = kt.kv_views(cache, start=1, stop=1 + T)
    assert kv.c.dtype == 0 | 0x100 and not kv.copied
    mem = kv.c._kvmem_keep._mem
    assert mem.handle == k[0, 0, 0, 1].data_ptr() and mem.device == k.device.index
    assert mem.stream == (torch.cuda.current_stream().cuda_stream or None)
    spec = kvmem.ModelSpec(n_layers=L, n_q_heads=4, n_kv_heads=H, head_dim=D)
    with kvmem.Context("cpu") as ctx, ctx.pool_create(spec, block_size=4) as pool, pool.agent_open("a") as a:
        with pytest.raises(kvmem.UnsupportedError, match="K is in CUDA device memory but the context runs on cpu"):
            kt.append(a, cache)
        assert a.get_info().n_tokens == 0
    try:
        ctx = kvmem.Context("cuda")
    except kvmem.KvmemError as e:
        pytest.skip(f"skipped: backend cuda: {e}")
    with ctx, ctx.pool_create(spec, block_size=4, storage_dtype="f32") as pool, pool.agent_open("a") as a:
        kt.append(a, cache, start=1, stop=1 + T)
        rk, rv = a.read()
        np.testing.assert_array_equal(rk, k[:, 0, :, 1:1 + T].transpose(1, 2).cpu().numpy())
        np.testing.assert_array_equal(rv, v[:, 0, :, 1:1 + T].transpose(1, 2).cpu().numpy())


def test_a_cuda_context_fed_cuda_tensors_equals_the_cpu_path_on_a_gpu():  # pragma: no cover - needs a GPU
    """The whole memory loop on CUDA tensors as an HF cache holds them (head-major,
    the history longer than a window): append, retrieve with a CUDA query, gather
    written into CUDA tensors in place. The CPU context fed the same numbers from
    host memory is the reference: the same blocks, the same gathered KV."""
    torch = _torch_cuda()
    import kvmem.torch as kt
    try:
        cu = kvmem.Context("cuda")
    except kvmem.KvmemError as e:
        pytest.skip(f"skipped: backend cuda: {e}")
    nl, hq, hkv, d, n, bs = 2, 4, 2, 32, 1024, 16
    g = torch.Generator(device="cpu").manual_seed(7)
    k = torch.randn(nl, 1, hkv, n, d, generator=g).to("cuda")
    v = torch.randn(nl, 1, hkv, n, d, generator=g).to("cuda")
    q = [torch.randn(1, hq, 3, d, generator=g).to("cuda") for _ in range(nl)]  # HF query_states per layer
    cache = tuple((k[i], v[i]) for i in range(nl))
    host = tuple((k[i].cpu(), v[i].cpu()) for i in range(nl))
    spec = kvmem.ModelSpec(n_layers=nl, n_q_heads=hq, n_kv_heads=hkv, head_dim=d)
    got = {}
    with kvmem.Context("cpu") as cpu:
        for name, ctx, c, qq in (("cuda", cu, cache, q), ("cpu", cpu, host, [x.cpu() for x in q])):
            with ctx.pool_create(spec, block_size=bs, storage_dtype="f32") as pool, pool.agent_open("a") as a:
                kt.append(a, c)
                r = kt.retrieve(a, qq, top_k=8)
                blocks, _ = r.get()
                dev = "cuda" if name == "cuda" else None
                out = kt.gather(a, list(blocks), base_position=5, device=dev)
                if name == "cuda":
                    assert out[0][0].is_cuda and out[0][0].data_ptr() != 0
                got[name] = (list(blocks), [(x.cpu(), y.cpu()) for x, y in out])
    cu.close()
    assert got["cuda"][0] == got["cpu"][0] and len(got["cpu"][0]) == 8
    for (gk, gv), (hk, hv) in zip(got["cuda"][1], got["cpu"][1]):
        torch.testing.assert_close(gv, hv, rtol=0, atol=0)  # values are copied, not computed
        torch.testing.assert_close(gk, hk, rtol=1e-5, atol=1e-5)  # RoPE on the device vs the CPU

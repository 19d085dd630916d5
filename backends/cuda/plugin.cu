// libkvmem-cuda.so: the CUDA backend plugin. The core dlopens it and calls
// kvmem_backend_plugin_init; cudart is linked statically, so the core and a
// machine without CUDA never need any CUDA library. Buffers come from a
// caching allocator over cudaMalloc; transfers of pageable host memory go
// through two pinned staging buffers on a copy stream that overlaps the
// compute stream.
#include "backend_impl.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <mutex>

static const size_t kStagingChunk = (size_t)8 << 20;
static const size_t kMaxCached = (size_t)4 << 30;


// ---- allocator callbacks ----
static void *raw_alloc(void *user, size_t size) {
    (void)user;
    void *p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
        (void)cudaGetLastError(); // out of memory is not sticky: clear it
        return nullptr;
    }
    return p;
}
static void raw_free(void *user, void *p) {
    (void)user;
    cudaFree(p);
}

void *cu_scratch(kvm_cu_backend *b, size_t bytes, kvmem_status *st) {
    if (*st != KVMEM_OK) return nullptr;
    if (bytes <= b->scratch_granted && b->scratch) return b->scratch;
    // the old workspace may still be read by queued kernels: its block goes
    // back to the cache, and an upload into it (a buffer allocated from that
    // block) must not overtake them: order the copy stream behind the compute
    // stream, as buffer_free does
    if (b->scratch) {
        cudaEventRecord(b->free_done, b->stream);
        cudaStreamWaitEvent(b->copy_stream, b->free_done, 0);
        kvm_cu_release(b->alloc, b->scratch, b->scratch_granted);
    }
    b->scratch = kvm_cu_alloc(b->alloc, bytes, &b->scratch_granted);
    if (!b->scratch) {
        b->scratch_granted = 0;
        *st = kvm_cu_fail(KVMEM_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes of workspace", bytes);
    }
    return b->scratch;
}

// ---- backend table ----
static void cu_free(kvmem_backend *be) {
    if (!be) return;
    kvm_cu_backend *b = cu_impl(be);
    if (b) {
        cudaSetDevice(b->device);
        cudaStreamSynchronize(b->stream);
        cudaStreamSynchronize(b->copy_stream);
        if (b->scratch) kvm_cu_release(b->alloc, b->scratch, b->scratch_granted);
        kvm_cu_allocator_free(b->alloc);
        for (int i = 0; i < 2; i++) {
            if (b->pinned[i]) cudaFreeHost(b->pinned[i]);
            if (b->slot_ev[i]) cudaEventDestroy(b->slot_ev[i]);
        }
        if (b->copy_done) cudaEventDestroy(b->copy_done);
        if (b->compute_done) cudaEventDestroy(b->compute_done);
        if (b->free_done) cudaEventDestroy(b->free_done);
        if (b->stream) cudaStreamDestroy(b->stream);
        if (b->copy_stream) cudaStreamDestroy(b->copy_stream);
        pthread_mutex_destroy(&b->lock);
        free(b);
    }
    free(be);
}

static kvmem_status cu_buffer_alloc(kvmem_backend *be, size_t size, kvmem_buffer **out) {
    kvm_cu_backend *b = cu_impl(be);
    if (!out) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda buffer_alloc: out is NULL");
    *out = nullptr;
    cudaSetDevice(b->device);
    kvmem_buffer *buf = static_cast<kvmem_buffer *>(malloc(sizeof *buf));
    if (!buf) return kvm_cu_fail(KVMEM_ERR_NOMEM, "cuda backend: out of host memory");
    buf->dev = kvm_cu_alloc(b->alloc, size, &buf->granted);
    if (!buf->dev) {
        free(buf);
        return kvm_cu_fail(KVMEM_ERR_NOMEM, "cuda backend: cannot allocate %zu bytes of device memory", size);
    }
    buf->size = size;
    buf->borrowed = 0;
    *out = buf;
    return KVMEM_OK;
}

// A caller's device memory (kvmem.h, "Device tensors"): checked against this
// backend's device (host/wrap.c), then ordered after the caller's stream so
// every kernel and copy of the call sees what the caller's queued work wrote.
static kvmem_status cu_buffer_wrap(kvmem_backend *be, const kvmem_device_memory *mem, kvmem_buffer **out) {
    kvm_cu_backend *b = cu_impl(be);
    if (!out) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda buffer_wrap: out is NULL");
    *out = nullptr;
    cudaSetDevice(b->device);
    int is_dev = 0, dev = -1;
    if (mem && mem->handle) {
        cudaPointerAttributes pa;
        if (cudaPointerGetAttributes(&pa, reinterpret_cast<const void *>(static_cast<uintptr_t>(mem->handle))) ==
            cudaSuccess) {
            is_dev = pa.type == cudaMemoryTypeDevice || pa.type == cudaMemoryTypeManaged;
            dev = pa.device;
        } else {
            (void)cudaGetLastError(); // an unknown pointer is not sticky
        }
    }
    kvmem_status st = kvm_cu_wrap_check(mem, b->device, dev, is_dev);
    if (st != KVMEM_OK) return st;
    cudaStream_t user = static_cast<cudaStream_t>(mem->stream);
    if ((st = cu_check(cudaEventRecord(b->compute_done, user), "ordering after the tensor's stream")) != KVMEM_OK ||
        (st = cu_check(cudaStreamWaitEvent(b->stream, b->compute_done, 0), "ordering after the tensor's stream")) !=
            KVMEM_OK ||
        (st = cu_check(cudaStreamWaitEvent(b->copy_stream, b->compute_done, 0), "ordering after the tensor's stream")) !=
            KVMEM_OK)
        return st;
    kvmem_buffer *buf = static_cast<kvmem_buffer *>(malloc(sizeof *buf));
    if (!buf) return kvm_cu_fail(KVMEM_ERR_NOMEM, "cuda backend: out of host memory");
    buf->dev = reinterpret_cast<void *>(static_cast<uintptr_t>(mem->handle));
    buf->size = static_cast<size_t>(mem->size);
    buf->granted = 0;
    buf->borrowed = 1;
    *out = buf;
    return KVMEM_OK;
}

static void cu_buffer_free(kvmem_backend *be, kvmem_buffer *buf) {
    if (!buf) return;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    if (buf->borrowed) {
        // the call ends here: the caller's memory is written and no kernel
        // of this backend reads it any more when the call returns
        cudaStreamSynchronize(b->stream);
        cudaStreamSynchronize(b->copy_stream);
        free(buf);
        return;
    }
    // a later upload into a block reused from this one must not overtake
    // kernels still reading it: order the copy stream behind the compute stream
    cudaEventRecord(b->free_done, b->stream);
    cudaStreamWaitEvent(b->copy_stream, b->free_done, 0);
    kvm_cu_release(b->alloc, buf->dev, buf->granted);
    free(buf);
}

static kvmem_status cu_upload(kvmem_backend *be, kvmem_buffer *dst, size_t off, const void *src, size_t n) {
    kvm_cu_backend *b = cu_impl(be);
    if (!dst || !kvm_cu_in_range(dst->size, off, n))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "upload of %zu bytes at %zu outside the buffer", n, off);
    if (n == 0) return KVMEM_OK;
    if (!src) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "upload: source is NULL");
    cudaSetDevice(b->device);
    unsigned char *d = static_cast<unsigned char *>(dst->dev) + off;
    const unsigned char *s = static_cast<const unsigned char *>(src);
    const size_t nc = kvm_cu_staging_n_chunks(n, b->pinned_size);
    for (size_t i = 0; i < nc; i++) {
        kvm_cu_chunk c = kvm_cu_staging_chunk(n, b->pinned_size, i);
        // the slot's previous transfer must have left the pinned buffer
        kvmem_status st = cu_check(cudaEventSynchronize(b->slot_ev[c.slot]), "upload");
        if (st != KVMEM_OK) return st;
        memcpy(b->pinned[c.slot], s + c.offset, c.size);
        st = cu_check(cudaMemcpyAsync(d + c.offset, b->pinned[c.slot], c.size, cudaMemcpyHostToDevice, b->copy_stream),
                      "upload");
        if (st != KVMEM_OK) return st;
        cudaEventRecord(b->slot_ev[c.slot], b->copy_stream);
    }
    // kernels queued after this call see the data; the call itself returns
    // once the source was consumed, while the last chunks are still in flight
    cudaEventRecord(b->copy_done, b->copy_stream);
    return cu_check(cudaStreamWaitEvent(b->stream, b->copy_done, 0), "upload");
}

static kvmem_status cu_download(kvmem_backend *be, const kvmem_buffer *src, size_t off, void *dst, size_t n) {
    kvm_cu_backend *b = cu_impl(be);
    if (!src || !kvm_cu_in_range(src->size, off, n))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "download of %zu bytes at %zu outside the buffer", n, off);
    if (n == 0) return KVMEM_OK;
    if (!dst) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "download: destination is NULL");
    cudaSetDevice(b->device);
    const unsigned char *s = static_cast<const unsigned char *>(src->dev) + off;
    unsigned char *d = static_cast<unsigned char *>(dst);
    cudaEventRecord(b->compute_done, b->stream);
    cudaStreamWaitEvent(b->copy_stream, b->compute_done, 0);
    const size_t nc = kvm_cu_staging_n_chunks(n, b->pinned_size);
    kvmem_status st = KVMEM_OK;
    // chunk i is in flight while chunk i-1 is copied out of its pinned buffer
    for (size_t i = 0; i <= nc && st == KVMEM_OK; i++) {
        if (i < nc) {
            kvm_cu_chunk c = kvm_cu_staging_chunk(n, b->pinned_size, i);
            st = cu_check(cudaMemcpyAsync(b->pinned[c.slot], s + c.offset, c.size, cudaMemcpyDeviceToHost, b->copy_stream),
                          "download");
            if (st != KVMEM_OK) break;
            cudaEventRecord(b->slot_ev[c.slot], b->copy_stream);
        }
        if (i > 0) {
            kvm_cu_chunk p = kvm_cu_staging_chunk(n, b->pinned_size, i - 1);
            st = cu_check(cudaEventSynchronize(b->slot_ev[p.slot]), "download");
            if (st == KVMEM_OK) memcpy(d + p.offset, b->pinned[p.slot], p.size);
        }
    }
    return st;
}

static void *cu_host_ptr(kvmem_backend *be, kvmem_buffer *buf) {
    (void)be;
    (void)buf;
    return nullptr; // device memory is not host-visible
}

static kvmem_status cu_sync(kvmem_backend *be) {
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    kvmem_status st = cu_check(cudaStreamSynchronize(b->copy_stream), "synchronize");
    if (st != KVMEM_OK) return st;
    return cu_check(cudaStreamSynchronize(b->stream), "synchronize");
}

// ---- table entries: failures reach kvmem_last_error() ----
// The ops record their message with kvm_cu_fail (thread-local, also read by
// the KVMEM_CUDA_PROC_LAST_ERROR hatch); the core set be->fail after init,
// so every entry hands a failure's message on through it.
// Holds the backend's lock for one table call (backend_impl.h, lock).
struct CuLock {
    pthread_mutex_t *m;
    explicit CuLock(kvmem_backend *be) : m(be && be->impl ? &cu_impl(be)->lock : nullptr) {
        if (m) pthread_mutex_lock(m);
    }
    ~CuLock() {
        if (m) pthread_mutex_unlock(m);
    }
    CuLock(const CuLock &) = delete;
    CuLock &operator=(const CuLock &) = delete;
};

static kvmem_status cu_ret(kvmem_backend *be, kvmem_status st) {
    if (st != KVMEM_OK && be && be->fail) return be->fail(st, "%s", kvm_cu_last_error());
    return st;
}

static void e_buffer_free(kvmem_backend *be, kvmem_buffer *buf) {
    CuLock g(be);
    cu_buffer_free(be, buf);
}
static kvmem_status e_buffer_alloc(kvmem_backend *be, size_t size, kvmem_buffer **out) {
    CuLock g(be);
    return cu_ret(be, cu_buffer_alloc(be, size, out));
}
static kvmem_status e_upload(kvmem_backend *be, kvmem_buffer *dst, size_t off, const void *src, size_t n) {
    CuLock g(be);
    return cu_ret(be, cu_upload(be, dst, off, src, n));
}
static kvmem_status e_download(kvmem_backend *be, const kvmem_buffer *src, size_t off, void *dst, size_t n) {
    CuLock g(be);
    return cu_ret(be, cu_download(be, src, off, dst, n));
}
static kvmem_status e_buffer_wrap(kvmem_backend *be, const kvmem_device_memory *mem, kvmem_buffer **out) {
    CuLock g(be);
    return cu_ret(be, cu_buffer_wrap(be, mem, out));
}
static kvmem_status e_dev_score(kvmem_backend *be, const kvm_dev_score_args *a) { CuLock g(be); return cu_ret(be, kvm_cu_dev_score(be, a)); }
static kvmem_status e_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a) {
    CuLock g(be);
    return cu_ret(be, kvm_cu_dev_score_reduce(be, a));
}
static kvmem_status e_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a) { CuLock g(be); return cu_ret(be, kvm_cu_dev_topk(be, a)); }
static kvmem_status e_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a) {
    CuLock g(be);
    return cu_ret(be, kvm_cu_dev_gather_rope(be, a));
}
static kvmem_status e_dev_attend(kvmem_backend *be, const kvm_dev_attend_args *a) { CuLock g(be); return cu_ret(be, kvm_cu_dev_attend(be, a)); }
static kvmem_status e_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    CuLock g(be);
    return cu_ret(be, kvm_cu_dev_qmem_score(be, a));
}

// ---- procs: the ops beyond the table, and diagnostics ----
static const char *cu_last_error(void) { return kvm_cu_last_error(); }
static kvmem_status cu_synchronize(kvmem_backend *be) {
    if (!be) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "synchronize: be is NULL");
    return cu_sync(be);
}

static kvmem_status cu_device_info(kvmem_backend *be, kvmem_cuda_device_info *out) {
    if (!be || !out) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "device_info: NULL argument");
    kvm_cu_backend *b = cu_impl(be);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%.127s", b->props.name);
    out->cc_major = b->props.major;
    out->cc_minor = b->props.minor;
    out->n_sms = b->props.multiProcessorCount;
    out->total_mem = b->props.totalGlobalMem;
    out->smem_per_block_optin = b->props.sharedMemPerBlockOptin;
    int v = 0;
    cudaDriverGetVersion(&v);
    out->driver_version = v;
    cudaRuntimeGetVersion(&v);
    out->runtime_version = v;
    return KVMEM_OK;
}

static kvmem_status cu_copy_gbps(kvmem_backend *be, size_t bytes, int32_t reps, double *gbps) {
    if (!be || !gbps || bytes == 0 || reps < 1)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "copy_gbps: bad argument");
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    size_t g1 = 0, g2 = 0;
    void *x = kvm_cu_alloc(b->alloc, bytes, &g1), *y = kvm_cu_alloc(b->alloc, bytes, &g2);
    kvmem_status st = (x && y) ? KVMEM_OK : kvm_cu_fail(KVMEM_ERR_NOMEM, "copy_gbps: cannot allocate 2 x %zu bytes", bytes);
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    float ms[64];
    int n_ms = 0;
    if (reps > 64) reps = 64;
    if (st == KVMEM_OK) st = cu_check(cudaEventCreate(&e0), "copy_gbps");
    if (st == KVMEM_OK) st = cu_check(cudaEventCreate(&e1), "copy_gbps");
    if (st == KVMEM_OK) st = cu_check(cudaMemsetAsync(x, 1, bytes, b->stream), "copy_gbps");
    for (int r = -2; r < reps && st == KVMEM_OK; r++) { // two warm-up copies
        cudaEventRecord(e0, b->stream);
        st = cu_check(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice, b->stream), "copy_gbps");
        cudaEventRecord(e1, b->stream);
        if (st == KVMEM_OK) st = cu_check(cudaEventSynchronize(e1), "copy_gbps");
        float t = 0;
        if (st == KVMEM_OK && r >= 0 && cudaEventElapsedTime(&t, e0, e1) == cudaSuccess) ms[n_ms++] = t;
    }
    if (st == KVMEM_OK && n_ms > 0) {
        std::sort(ms, ms + n_ms);
        *gbps = 2.0 * (double)bytes / (ms[n_ms / 2] * 1e-3) / 1e9;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    kvm_cu_release(b->alloc, x, g1);
    kvm_cu_release(b->alloc, y, g2);
    return st;
}

static void *cu_proc(kvmem_backend *be, const char *name) {
    (void)be;
    if (!name) return nullptr;
    static const struct {
        const char *name;
        void *fn;
    } procs[] = {
        {KVMEM_CUDA_PROC_LAST_ERROR, (void *)cu_last_error},
        {KVMEM_CUDA_PROC_SYNCHRONIZE, (void *)cu_synchronize},
        {KVMEM_CUDA_PROC_DEVICE_INFO, (void *)cu_device_info},
        {KVMEM_CUDA_PROC_COPY_GBPS, (void *)cu_copy_gbps},
        {KVMEM_CUDA_PROC_SCORE_BLOCKS, (void *)kvm_cu_op_score_blocks},
        {KVMEM_CUDA_PROC_AABB_SCORE, (void *)kvm_cu_op_aabb_score},
        {KVMEM_CUDA_PROC_TOPK, (void *)kvm_cu_op_topk},
        {KVMEM_CUDA_PROC_GATHER_ROPE, (void *)kvm_cu_op_gather_rope},
        {KVMEM_CUDA_PROC_QMEM_SCORE, (void *)kvm_cu_op_qmem_score},
        {KVM_PROC_BUFFER_WRAP, (void *)e_buffer_wrap},
    };
    for (const auto &p : procs)
        if (strcmp(p.name, name) == 0) return p.fn;
    return nullptr;
}

static kvmem_backend_iface cu_iface = [] {
    kvmem_backend_iface t;
    memset(&t, 0, sizeof t);
    t.name = "cuda"; /* what contexts and device tensors are matched by; the device is in detail */
    t.free = cu_free;
    t.buffer_alloc = e_buffer_alloc;
    t.buffer_free = e_buffer_free;
    t.buffer_upload = e_upload;
    t.buffer_download = e_download;
    t.buffer_host_ptr = cu_host_ptr;
    t.dev_score = e_dev_score;
    t.dev_score_reduce = e_dev_score_reduce;
    t.dev_topk = e_dev_topk;
    t.dev_gather_rope = e_dev_gather_rope;
    t.dev_attend = e_dev_attend;
    t.dev_qmem_score = e_dev_qmem_score;
    t.supports_op = kvm_cu_supports_op;
    t.get_proc_address = cu_proc;
    return t;
}();

// ---- init ----
static kvmem_status refuse(char *why, size_t why_size, kvmem_status st, const char *msg) {
    if (why && why_size) snprintf(why, why_size, "%s", msg);
    return st;
}

extern "C" __attribute__((visibility("default"))) kvmem_status
kvmem_backend_plugin_init(uint32_t api_version, kvmem_context *ctx, kvmem_backend **out, char *why, size_t why_size) {
    char msg[256];
    if (!out) return refuse(why, why_size, KVMEM_ERR_INVALID_ARG, "cuda: out is NULL");
    *out = nullptr;
    if (api_version != KVMEM_BACKEND_API_VERSION) {
        snprintf(msg, sizeof msg, "libkvmem-cuda.so implements backend API %u, the core needs %u",
                 KVMEM_BACKEND_API_VERSION, api_version);
        return refuse(why, why_size, KVMEM_ERR_UNSUPPORTED, msg);
    }
    // cudart would load the driver itself; probing first gives a plain reason
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!drv) return refuse(why, why_size, KVMEM_ERR_UNSUPPORTED, "no NVIDIA driver (libcuda.so.1 not found)");
    dlclose(drv);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0))
        return refuse(why, why_size, KVMEM_ERR_UNSUPPORTED, "no CUDA device");
    if (e != cudaSuccess) {
        snprintf(msg, sizeof msg, "%s: %s", e == cudaErrorInsufficientDriver ? "NVIDIA driver too old for this CUDA runtime" : "CUDA unusable",
                 cudaGetErrorString(e));
        return refuse(why, why_size, KVMEM_ERR_UNSUPPORTED, msg);
    }
    int dev = 0;
    const char *env = getenv("KVMEM_CUDA_DEVICE");
    if (env && *env) {
        char *end = nullptr;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v >= n) {
            snprintf(msg, sizeof msg, "KVMEM_CUDA_DEVICE=%.32s: expected a device index in [0, %d)", env, n);
            return refuse(why, why_size, KVMEM_ERR_INVALID_ARG, msg);
        }
        dev = (int)v;
    }
    kvm_cu_backend *b = static_cast<kvm_cu_backend *>(calloc(1, sizeof *b));
    kvmem_backend *be = static_cast<kvmem_backend *>(calloc(1, sizeof *be));
    if (!b || !be) {
        free(b);
        free(be);
        return refuse(why, why_size, KVMEM_ERR_NOMEM, "cuda: out of memory");
    }
    be->iface = &cu_iface;
    be->impl = b;
    be->ctx = ctx;
    pthread_mutex_init(&b->lock, nullptr);
    b->device = dev;
    const char *step = "cudaSetDevice";
    e = cudaSetDevice(dev);
    if (e == cudaSuccess) step = "cudaGetDeviceProperties", e = cudaGetDeviceProperties(&b->props, dev);
    if (e == cudaSuccess) step = "cudaStreamCreate", e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b->copy_stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) step = "cudaEventCreate", e = cudaEventCreateWithFlags(&b->copy_done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->compute_done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->free_done, cudaEventDisableTiming);
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaEventCreateWithFlags(&b->slot_ev[i], cudaEventDisableTiming);
    b->pinned_size = kStagingChunk;
    if (e == cudaSuccess) step = "cudaMallocHost";
    for (int i = 0; i < 2 && e == cudaSuccess; i++) e = cudaMallocHost(&b->pinned[i], b->pinned_size);
    if (e == cudaSuccess) {
        b->alloc = kvm_cu_allocator_create(raw_alloc, raw_free, nullptr, kMaxCached);
        if (!b->alloc) e = cudaErrorMemoryAllocation, step = "allocator";
    }
    if (e != cudaSuccess) {
        snprintf(msg, sizeof msg, "cuda: %s failed on device %d: %s", step, dev, cudaGetErrorString(e));
        cu_free(be);
        return refuse(why, why_size, KVMEM_ERR_BACKEND, msg);
    }
    snprintf(b->detail, sizeof b->detail, "%.120s (sm_%d%d, %d SMs, %.0f GiB)", b->props.name, b->props.major,
             b->props.minor, b->props.multiProcessorCount, (double)b->props.totalGlobalMem / (1024.0 * 1024 * 1024));
    be->detail = b->detail;
    *out = be;
    return KVMEM_OK;
}

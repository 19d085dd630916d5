/* Device tensors (kvmem.h, "Device tensors"): K, V, queries and outputs in
 * a caller's device memory.
 *
 * Everywhere (no device needed):
 *  - the descriptor and kvmem_tensor_init_device refuse what cannot name
 *    device memory (NULL, host kind, handle 0, elements past the stated
 *    size, CUDA fields on Vulkan memory, a bad struct_size);
 *  - on a "cpu" context every call that takes them refuses a Vulkan or a
 *    CUDA tensor with KVMEM_ERR_UNSUPPORTED naming the kind of memory and
 *    the context's backend, and calls that take host memory only say so;
 *    the handles are never dereferenced (they are made up), the agent is
 *    unchanged, the outputs untouched.
 * On a stand-in "cuda" backend (a second CPU backend under that name, whose
 * buffer_wrap takes host memory as the "device pointer": no GPU here), the
 * core's routing of CUDA tensors: append downloads K and V once, another
 * device ordinal and Vulkan memory are refused with the backend's / the
 * core's message, gather writes in place (d2h 0, the host-tensor gather's
 * d2h its whole output, the same uploads, equal bits), attention reads K/V
 * in place (its uploads exactly K and V fewer, equal output), and every
 * wrapper is released by the end of each call.
 * On "vulkan" (lavapipe here; skipped with the reason where it cannot run),
 * with VkBuffers the test creates on the context's own VkDevice
 * (kvmem_context_vulkan_device), and an agent fed the same data from host
 * memory beside it on the same context as the reference:
 *  - append from VkBuffers stores exactly what the host append stores (read
 *    back bit for bit) and moves K and V down once: d2h = their bytes, h2d 0;
 *  - gather into f32 VkBuffers (dense, and with padded layers) equals the
 *    host-tensor gather bit for bit and brings nothing back (d2h 0; the host
 *    gather's d2h is the whole output), uploading only the slot ids and the
 *    keys' cos/sin; an f16 output takes one counted upload of its bytes;
 *  - attention over K/V in VkBuffers (f32 and f16, RECENT with the stop
 *    rule, the device path) equals the host-K/V call bit for bit with the
 *    same statistics, and uploads q, the slot map and the tile order only:
 *    never K or V (the host call's h2d includes them); SCORED (which orders
 *    tiles from K on the host) reads them down once and still equals;
 *  - a query in a VkBuffer retrieves the same blocks and scores; q and out
 *    of an attention in VkBuffers: q down once, out up once, equal output;
 *  - a CUDA tensor on this context, a span past the buffer, and a device
 *    tensor given to a host-only call are refused, nothing written. */
#include "testutil.h"
#include "cpu/half.h"
#include "internal.h"
#include "backend/route/context.h"
#include "cpu/cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(KVMEM_TEST_VOLK)
#include <volk.h>
#endif

enum { L = 2, HQ = 4, H = 2, D = 32, BS = 16, T = 200 };

/* ---- descriptors ---- */

static void test_descriptor_refusals(void **state) {
    (void)state;
    kvmem_device_memory m = kvmem_device_memory_default();
    assert_true(m.struct_size == sizeof m && m.kind == KVMEM_MEMORY_HOST && m.handle == 0);
    kvmem_tensor t, before;
    memset(&t, 0x5a, sizeof t);
    before = t;
    int64_t sh[2] = {4, 8};
    m = kvmem_device_memory_default();
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "is not KVMEM_MEMORY_CUDA");
    m.kind = KVMEM_MEMORY_VULKAN;
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "handle is 0");
    m.handle = 0x1234;
    m.size = 4 * 8 * 4 - 1; /* one byte short */
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "reaches past");
    m.size = 4 * 8 * 4;
    m.offset = 4;
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "reaches past");
    m.offset = 0;
    m.device = 1;
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "for CUDA memory");
    m.device = 0;
    assert_status(kvmem_tensor_init_device(&t, NULL, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_tensor_init_device(&t, &m, KVMEM_Q4, 2, sh), KVMEM_ERR_INVALID_ARG, "dtype");
    kvmem_device_memory bad = m;
    bad.struct_size = 0;
    assert_status(kvmem_tensor_init_device(&t, &bad, KVMEM_F32, 2, sh), KVMEM_ERR_INVALID_ARG, "");
    assert_memory_equal(&t, &before, sizeof t); /* nothing written on a refusal */
    assert_ok(kvmem_tensor_init_device(&t, &m, KVMEM_F16, 2, sh));
    assert_true(t.data == (void *)&m && t.dtype == (kvmem_dtype)(KVMEM_F16 | KVMEM_DTYPE_DEVICE));
    assert_true(t.ndim == 2 && t.shape[0] == 4 && t.shape[1] == 8 && t.strides[0] == 8 && t.strides[1] == 1);
    m.kind = KVMEM_MEMORY_CUDA;
    m.device = 3;
    assert_ok(kvmem_tensor_init_device(&t, &m, KVMEM_F32, 2, sh));
}

/* K, V [L][n][H][D] of a history whose blocks point in distinct
 * directions (well separated retrieval scores). */
static void make_kv(float *k, float *v, int n, uint64_t *rng) {
    for (size_t l = 0; l < L; l++)
        for (int t = 0; t < n; t++)
            for (size_t h = 0; h < H; h++)
                for (size_t d = 0; d < D; d++) {
                    size_t i = ((l * (size_t)n + (size_t)t) * H + h) * D + d;
                    uint64_t bs = (uint64_t)(t / BS) * 1000003u + l * 31u + h * 7u + d;
                    float dir = (float)((bs * 2654435761u >> 7) % 2001) / 1000.0f - 1.0f;
                    k[i] = 0.3f * tu_normal(rng) + 1.5f * dir;
                    v[i] = tu_normal(rng);
                }
}

/* Device tensors on a CPU context: refused, naming the memory and the
 * context, with every input and output left alone. */
static void test_cpu_context_refuses(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool *pool = NULL;
    kvmem_agent *ag = NULL;
    assert_ok(kvmem_pool_create(ctx, &sp, NULL, &pool));
    assert_ok(kvmem_agent_open(pool, "a", &ag));
    static float k[L * 32 * H * D], v[L * 32 * H * D];
    uint64_t rng = 3;
    make_kv(k, v, 32, &rng);
    int64_t sh[4] = {L, 32, H, D};
    kvmem_tensor hk, hv;
    assert_ok(kvmem_tensor_init(&hk, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&hv, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ag, &hk, &hv, NULL));

    kvmem_device_memory vm = kvmem_device_memory_default(), cm = kvmem_device_memory_default();
    vm.kind = KVMEM_MEMORY_VULKAN;
    vm.handle = 0xdead0000; /* made up: a refusal must never touch it */
    vm.size = 1 << 20;
    cm.kind = KVMEM_MEMORY_CUDA;
    cm.handle = 0xbeef0000;
    cm.size = 1 << 20;
    kvmem_tensor vk, ck;
    assert_ok(kvmem_tensor_init_device(&vk, &vm, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init_device(&ck, &cm, KVMEM_F32, 4, sh));
    assert_status(kvmem_agent_append(ag, &vk, &hv, NULL), KVMEM_ERR_UNSUPPORTED, "K is in Vulkan device memory but the context runs on cpu");
    assert_status(kvmem_agent_append(ag, &hk, &ck, NULL), KVMEM_ERR_UNSUPPORTED, "V is in CUDA device memory but the context runs on cpu");
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(ag, &info));
    assert_true(info.n_tokens == 32);

    int64_t qsh[4] = {1, L, HQ, D};
    kvmem_tensor dq;
    assert_ok(kvmem_tensor_init_device(&dq, &vm, KVMEM_F32, 4, qsh));
    kvmem_retrieval *r = NULL;
    assert_ok(kvmem_retrieval_create(&r));
    assert_status(kvmem_retrieve(ag, &dq, NULL, r), KVMEM_ERR_UNSUPPORTED, "query is in Vulkan device memory");
    assert_true(kvmem_retrieval_n_sets(r) == 0);

    int32_t blocks[2] = {0, 1};
    kvmem_tensor gk;
    assert_ok(kvmem_tensor_init_device(&gk, &cm, KVMEM_F32, 4, sh));
    static float vout[L * 32 * H * D];
    for (size_t i = 0; i < sizeof vout / 4; i++) vout[i] = -7.0f;
    kvmem_tensor hvo;
    assert_ok(kvmem_tensor_init(&hvo, vout, KVMEM_F32, 4, sh));
    assert_status(kvmem_gather(ag, blocks, 2, 0, &gk, &hvo), KVMEM_ERR_UNSUPPORTED, "k_out is in CUDA device memory");
    for (size_t i = 0; i < sizeof vout / 4; i++) assert_true(vout[i] == -7.0f);

    int64_t ash[3] = {32, H, D}, aq[3] = {1, HQ, D};
    kvmem_tensor ak, av, at_q, at_o;
    float q[HQ * D], o[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = tu_normal(&rng), o[i] = 5.0f;
    assert_ok(kvmem_tensor_init_device(&ak, &vm, KVMEM_F16, 3, ash));
    assert_ok(kvmem_tensor_init(&av, v, KVMEM_F32, 3, ash));
    assert_ok(kvmem_tensor_init(&at_q, q, KVMEM_F32, 3, aq));
    assert_ok(kvmem_tensor_init(&at_o, o, KVMEM_F32, 3, aq));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &ak;
    src.v = &av;
    assert_status(kvmem_attend(ctx, &at_q, &src, NULL, &at_o, NULL), KVMEM_ERR_UNSUPPORTED, "source k is in Vulkan device memory");
    kvmem_tensor dout;
    assert_ok(kvmem_tensor_init_device(&dout, &cm, KVMEM_F32, 3, aq));
    src.k = &av;
    assert_status(kvmem_attend(ctx, &at_q, &src, NULL, &dout, NULL), KVMEM_ERR_UNSUPPORTED, "out is in CUDA device memory");
    for (int i = 0; i < HQ * D; i++) assert_true(o[i] == 5.0f);

    /* calls that take host memory only */
    assert_status(kvmem_agent_read(ag, 0, 32, &vk, NULL), KVMEM_ERR_UNSUPPORTED, "host memory only");
    kvmem_retrieval_free(r);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

static void stats(kvmem_context *ctx, uint64_t *h, uint64_t *d) { assert_ok(kvmem_context_transfer_stats(ctx, h, d)); }

/* ---- the core's device-tensor routing, on a stand-in "cuda" backend ----
 * No GPU here: a second CPU backend named "cuda" stands in for the plugin
 * (a device whose buffers the core cannot view, so it stages and counts as
 * for a GPU), with a buffer_wrap that makes a buffer of the "device
 * pointer" (host memory here) and refuses another device ordinal as the
 * plugin does. What runs is the core's side: the memory kind matched with
 * the context, the wrap, the in-place gather and attention, the transfer
 * counts, the refusals. */
static const kvmem_backend_iface *g_cpu_iface;
static kvmem_backend_iface g_fake_iface;
static kvmem_buffer *g_wrapped[16];
static int g_n_wrapped, g_wraps;

static kvmem_status fake_wrap(kvmem_backend *be, const kvmem_device_memory *m, kvmem_buffer **out) {
    (void)be;
    if (m->kind != KVMEM_MEMORY_CUDA || m->device != 0)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "stand-in cuda: the tensor is on CUDA device %d, the context on device 0",
                        m->device);
    kvmem_buffer *b = malloc(sizeof *b);
    assert_non_null(b);
    kvm_cpu_buffer_view(b, (const void *)(uintptr_t)m->handle, (size_t)m->size);
    assert_true(g_n_wrapped < 16);
    g_wrapped[g_n_wrapped++] = b;
    g_wraps++;
    *out = b;
    return KVMEM_OK;
}

static void fake_buffer_free(kvmem_backend *be, kvmem_buffer *b) {
    for (int i = 0; i < g_n_wrapped; i++)
        if (g_wrapped[i] == b) { /* the caller's memory: only the wrapper goes */
            g_wrapped[i] = g_wrapped[--g_n_wrapped];
            free(b);
            return;
        }
    g_cpu_iface->buffer_free(be, b);
}

static void *fake_proc(kvmem_backend *be, const char *name) {
    if (name && strcmp(name, KVM_PROC_BUFFER_WRAP) == 0) {
        kvm_buffer_wrap_fn f = fake_wrap;
        void *p;
        memcpy(&p, &f, sizeof p);
        return p;
    }
    return g_cpu_iface->get_proc_address ? g_cpu_iface->get_proc_address(be, name) : NULL;
}

static kvmem_context *fake_cuda_context(void) {
    kvmem_context *ctx = tu_context(2);
    kvmem_backend *be = NULL;
    assert_ok(kvm_cpu_backend_create(ctx, kvm_cpu_backend_tp(ctx->cpu), &be));
    g_cpu_iface = be->iface;
    g_fake_iface = *be->iface;
    g_fake_iface.name = "cuda";
    g_fake_iface.buffer_free = fake_buffer_free;
    g_fake_iface.get_proc_address = fake_proc;
    be->iface = &g_fake_iface;
    ctx->backend = be; /* kvmem_context_free frees it */
    snprintf(ctx->backend_name, sizeof ctx->backend_name, "cuda");
    return ctx;
}

static kvmem_device_memory cuda_mem(void *p, size_t size, int32_t device) {
    kvmem_device_memory m = kvmem_device_memory_default();
    m.kind = KVMEM_MEMORY_CUDA;
    m.handle = (uint64_t)(uintptr_t)p;
    m.size = size;
    m.device = device;
    return m;
}

static void test_cuda_routing_on_a_stand_in(void **state) {
    (void)state;
    kvmem_context *ctx = fake_cuda_context();
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    kvmem_pool *pool = NULL;
    kvmem_agent *ah = NULL, *ad = NULL;
    assert_ok(kvmem_pool_create(ctx, &sp, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "host", &ah));
    assert_ok(kvmem_agent_open(pool, "dev", &ad));
    const size_t n_kv = (size_t)L * T * H * D, kv_bytes = n_kv * 4;
    float *k = malloc(kv_bytes), *v = malloc(kv_bytes), *dkm = malloc(kv_bytes), *dvm = malloc(kv_bytes);
    uint64_t rng = 23;
    make_kv(k, v, T, &rng);
    memcpy(dkm, k, kv_bytes);
    memcpy(dvm, v, kv_bytes);
    int64_t sh[4] = {L, T, H, D};
    kvmem_tensor hk, hv, dk, dv;
    assert_ok(kvmem_tensor_init(&hk, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&hv, v, KVMEM_F32, 4, sh));
    kvmem_device_memory mk = cuda_mem(dkm, kv_bytes, 0), mv = cuda_mem(dvm, kv_bytes, 0);
    assert_ok(kvmem_tensor_init_device(&dk, &mk, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init_device(&dv, &mv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ah, &hk, &hv, NULL));
    uint64_t h0, d0, h1, d1;
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_agent_append(ad, &dk, &dv, NULL));
    stats(ctx, &h1, &d1);
    assert_true(d1 == 2 * kv_bytes && h1 == 0 && g_wraps == 2 && g_n_wrapped == 0); /* unwrapped after the call */
    assert_ok(kvmem_agent_flush(ah));
    assert_ok(kvmem_agent_flush(ad));

    /* another device ordinal: the backend's refusal, with its message */
    kvmem_device_memory m1 = cuda_mem(dkm, kv_bytes, 1);
    kvmem_tensor d1t;
    assert_ok(kvmem_tensor_init_device(&d1t, &m1, KVMEM_F32, 4, sh));
    assert_status(kvmem_agent_append(ad, &d1t, &dv, NULL), KVMEM_ERR_UNSUPPORTED, "on CUDA device 1, the context on device 0");
    /* Vulkan memory on a "cuda" context */
    kvmem_device_memory vm = kvmem_device_memory_default();
    vm.kind = KVMEM_MEMORY_VULKAN;
    vm.handle = 0xdead0000;
    vm.size = kv_bytes;
    kvmem_tensor vt;
    assert_ok(kvmem_tensor_init_device(&vt, &vm, KVMEM_F32, 4, sh));
    assert_status(kvmem_agent_append(ad, &vt, &dv, NULL), KVMEM_ERR_UNSUPPORTED, "K is in Vulkan device memory but the context runs on cuda");
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(ad, &info));
    assert_true(info.n_tokens == T && g_n_wrapped == 0);

    /* gather: in place into "device" memory, nothing comes back */
    const int32_t blocks[3] = {1, 4, 9};
    const int64_t M = 3 * BS;
    const size_t gb = (size_t)L * (size_t)M * H * D * 4;
    int64_t gsh[4] = {L, M, H, D};
    float *gk = malloc(gb), *gv = malloc(gb), *dgk = malloc(gb), *dgv = malloc(gb);
    kvmem_tensor tgk, tgv, dgkt, dgvt;
    assert_ok(kvmem_tensor_init(&tgk, gk, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_tensor_init(&tgv, gv, KVMEM_F32, 4, gsh));
    kvmem_device_memory mgk = cuda_mem(dgk, gb, 0), mgv = cuda_mem(dgv, gb, 0);
    assert_ok(kvmem_tensor_init_device(&dgkt, &mgk, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_tensor_init_device(&dgvt, &mgv, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_gather(ah, blocks, 3, 5, &tgk, &tgv)); /* the mirrors go up */
    assert_ok(kvmem_gather(ad, blocks, 3, 5, &tgk, &tgv));
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_gather(ah, blocks, 3, 5, &tgk, &tgv));
    stats(ctx, &h0, &d0);
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_gather(ad, blocks, 3, 5, &dgkt, &dgvt));
    stats(ctx, &h1, &d1);
    assert_true(d0 == gb * 2 && d1 == 0 && h1 == h0);
    assert_memory_equal(dgk, gk, gb);
    assert_memory_equal(dgv, gv, gb);

    /* attention over "device" K/V: in place, q and out through the host */
    int64_t s3[3] = {T, H, D}, qs[3] = {1, HQ, D};
    float q[HQ * D], oh[HQ * D], od[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = tu_normal(&rng);
    kvmem_tensor tq, ak, av, adk, adv, toh, tod;
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&ak, k, KVMEM_F32, 3, s3)); /* layer 0 of the history */
    assert_ok(kvmem_tensor_init(&av, v, KVMEM_F32, 3, s3));
    kvmem_device_memory mak = cuda_mem(dkm, kv_bytes, 0), mav = cuda_mem(dvm, kv_bytes, 0);
    assert_ok(kvmem_tensor_init_device(&adk, &mak, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init_device(&adv, &mav, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init(&toh, oh, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&tod, od, KVMEM_F32, 3, qs));
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.order = KVMEM_ATTEND_RECENT;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &ak;
    src.v = &av;
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &toh, NULL));
    stats(ctx, &h0, &d0);
    src.k = &adk;
    src.v = &adv;
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &tod, NULL));
    stats(ctx, &h1, &d1);
    assert_memory_equal(oh, od, sizeof oh);
    assert_true(h0 - h1 == 2ull * T * H * D * 4 && d0 == d1); /* K and V did not go up */
    assert_true(g_n_wrapped == 0);

    free(gk), free(gv), free(dgk), free(dgv), free(k), free(v), free(dkm), free(dvm);
    kvmem_agent_close(ah);
    kvmem_agent_close(ad);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}

/* ---- Vulkan: caller-owned VkBuffers ---- */

#if defined(KVMEM_TEST_VOLK)
typedef struct vkbuf {
    VkBuffer buf;
    VkDeviceMemory mem;
    void *map;
    size_t size;
} vkbuf;

static VkDevice g_dev;
static VkPhysicalDevice g_phys;

/* The context's device, for volk's entry points; 0 with *why when the
 * context or the loader is not there. */
static kvmem_context *vk_context(char *why, size_t n) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "vulkan";
    cp.n_threads = 2;
    kvmem_context *ctx = NULL;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        snprintf(why, n, "backend vulkan: %s", kvmem_last_error());
        return NULL;
    }
    kvmem_vulkan_device vd;
    memset(&vd, 0, sizeof vd);
    vd.struct_size = sizeof vd;
    assert_ok(kvmem_context_vulkan_device(ctx, &vd));
    assert_non_null(vd.instance);
    assert_non_null(vd.device);
    assert_non_null(vd.queue);
    if (volkInitialize() != VK_SUCCESS) {
        snprintf(why, n, "the Vulkan loader cannot be opened by the test");
        kvmem_context_free(ctx);
        return NULL;
    }
    volkLoadInstanceOnly((VkInstance)vd.instance);
    volkLoadDevice((VkDevice)vd.device);
    g_dev = (VkDevice)vd.device;
    g_phys = (VkPhysicalDevice)vd.physical_device;
    return ctx;
}

/* The Vulkan context of a test, or the test skipped saying why. */
static kvmem_context *vk_context_or_skip(void) {
    char why[512];
    kvmem_context *ctx = vk_context(why, sizeof why);
    if (!ctx) {
        TU_SKIP("%s", why);
    }
    return ctx;
}

/* A host-visible buffer (so the test can fill and read it) of n bytes. */
static void vkbuf_create(vkbuf *b, size_t n) {
    memset(b, 0, sizeof *b);
    b->size = n;
    VkBufferCreateInfo bci = {VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, NULL, 0, n,
                              VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                  VK_BUFFER_USAGE_TRANSFER_DST_BIT,
                              VK_SHARING_MODE_EXCLUSIVE, 0, NULL};
    assert_true(vkCreateBuffer(g_dev, &bci, NULL, &b->buf) == VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(g_dev, b->buf, &req);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(g_phys, &mp);
    const VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = UINT32_MAX;
    for (uint32_t i = 0; i < mp.memoryTypeCount && type == UINT32_MAX; i++)
        if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & want) == want) type = i;
    assert_true(type != UINT32_MAX);
    VkMemoryAllocateInfo mai = {VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, NULL, req.size, type};
    assert_true(vkAllocateMemory(g_dev, &mai, NULL, &b->mem) == VK_SUCCESS);
    assert_true(vkBindBufferMemory(g_dev, b->buf, b->mem, 0) == VK_SUCCESS);
    assert_true(vkMapMemory(g_dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map) == VK_SUCCESS);
}

static void vkbuf_destroy(vkbuf *b) {
    vkUnmapMemory(g_dev, b->mem);
    vkDestroyBuffer(g_dev, b->buf, NULL);
    vkFreeMemory(g_dev, b->mem, NULL);
}

static kvmem_device_memory vk_mem(const vkbuf *b, size_t offset) {
    kvmem_device_memory m = kvmem_device_memory_default();
    m.kind = KVMEM_MEMORY_VULKAN;
    m.handle = (uint64_t)(uintptr_t)b->buf;
    m.offset = offset;
    m.size = b->size;
    return m;
}


static void test_vulkan_buffers(void **state) {
    (void)state;
    kvmem_context *ctx = vk_context_or_skip();
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    kvmem_pool *pool = NULL;
    kvmem_agent *ah = NULL, *ad = NULL; /* fed from host memory / from VkBuffers */
    assert_ok(kvmem_pool_create(ctx, &sp, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "host", &ah));
    assert_ok(kvmem_agent_open(pool, "dev", &ad));
    const size_t n_kv = (size_t)L * T * H * D, kv_bytes = n_kv * 4;
    float *k = malloc(kv_bytes), *v = malloc(kv_bytes);
    uint64_t rng = 11;
    make_kv(k, v, T, &rng);
    int64_t sh[4] = {L, T, H, D};
    kvmem_tensor hk, hv;
    assert_ok(kvmem_tensor_init(&hk, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&hv, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_append(ah, &hk, &hv, NULL));

    /* append from VkBuffers, K at an offset into its buffer */
    vkbuf bk, bv;
    vkbuf_create(&bk, kv_bytes + 256);
    vkbuf_create(&bv, kv_bytes);
    memcpy((char *)bk.map + 256, k, kv_bytes);
    memcpy(bv.map, v, kv_bytes);
    kvmem_device_memory mk = vk_mem(&bk, 256), mv = vk_mem(&bv, 0);
    kvmem_tensor dk, dv;
    assert_ok(kvmem_tensor_init_device(&dk, &mk, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init_device(&dv, &mv, KVMEM_F32, 4, sh));
    uint64_t h0, d0, h1, d1;
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_agent_append(ad, &dk, &dv, NULL));
    stats(ctx, &h1, &d1);
    assert_true(d1 == 2 * kv_bytes && h1 == 0); /* K and V down once, nothing up */
    assert_ok(kvmem_agent_flush(ah));
    assert_ok(kvmem_agent_flush(ad));
    float *rk = malloc(kv_bytes), *rv = malloc(kv_bytes), *rk2 = malloc(kv_bytes), *rv2 = malloc(kv_bytes);
    kvmem_tensor tk, tv, tk2, tv2;
    assert_ok(kvmem_tensor_init(&tk, rk, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&tv, rv, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&tk2, rk2, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&tv2, rv2, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_read(ah, 0, T, &tk, &tv));
    assert_ok(kvmem_agent_read(ad, 0, T, &tk2, &tv2));
    assert_memory_equal(rk, rk2, kv_bytes);
    assert_memory_equal(rv, rv2, kv_bytes);

    /* a query from a VkBuffer retrieves what the host query does */
    float q[L * HQ * D];
    for (size_t i = 0; i < sizeof q / 4; i++) q[i] = tu_normal(&rng);
    int64_t qsh[4] = {1, L, HQ, D};
    vkbuf bq;
    vkbuf_create(&bq, sizeof q);
    memcpy(bq.map, q, sizeof q);
    kvmem_device_memory mq = vk_mem(&bq, 0);
    kvmem_tensor hq, dq;
    assert_ok(kvmem_tensor_init(&hq, q, KVMEM_F32, 4, qsh));
    assert_ok(kvmem_tensor_init_device(&dq, &mq, KVMEM_F32, 4, qsh));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 4;
    kvmem_retrieval *r1 = NULL, *r2 = NULL;
    assert_ok(kvmem_retrieval_create(&r1));
    assert_ok(kvmem_retrieval_create(&r2));
    assert_ok(kvmem_retrieve(ah, &hq, &rp, r1));
    assert_ok(kvmem_retrieve(ad, &dq, &rp, r2));
    const int32_t *b1, *b2;
    const float *s1, *s2;
    int32_t n1, n2;
    assert_ok(kvmem_retrieval_get(r1, 0, &b1, &s1, &n1));
    assert_ok(kvmem_retrieval_get(r2, 0, &b2, &s2, &n2));
    assert_true(n1 == 4 && n2 == 4);
    assert_memory_equal(b1, b2, 4 * sizeof *b1);
    assert_memory_equal(s1, s2, 4 * sizeof *s1);

    /* gather into VkBuffers: f32 dense (K), f32 with padded layers (V) */
    int64_t M = 0;
    assert_ok(kvmem_retrieval_n_tokens(r1, 0, &M));
    const size_t row = (size_t)H * D, lb = (size_t)M * row * 4, pad = 64;
    int64_t gsh[4] = {L, M, H, D};
    float *gk = malloc(L * lb), *gv = malloc(L * lb);
    kvmem_tensor tgk, tgv;
    assert_ok(kvmem_tensor_init(&tgk, gk, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_tensor_init(&tgv, gv, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_gather(ah, b1, n1, 7, &tgk, &tgv)); /* syncs the host agent's mirror */
    assert_ok(kvmem_gather(ad, b2, n2, 7, &tgk, &tgv)); /* and the device-fed one's */
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_gather(ah, b1, n1, 7, &tgk, &tgv));
    stats(ctx, &h0, &d0);
    const uint64_t up = (uint64_t)M * 4 + 2ull * (uint64_t)M * (D / 2) * 4; /* slot ids, cos/sin */
    assert_true(d0 == 2ull * L * lb && h0 == up);
    vkbuf bgk, bgv;
    vkbuf_create(&bgk, L * lb);
    vkbuf_create(&bgv, L * (lb + pad * 4));
    memset(bgk.map, 0xff, L * lb);
    memset(bgv.map, 0xff, L * (lb + pad * 4));
    kvmem_device_memory mgk = vk_mem(&bgk, 0), mgv = vk_mem(&bgv, 0);
    kvmem_tensor dgk, dgv;
    assert_ok(kvmem_tensor_init_device(&dgk, &mgk, KVMEM_F32, 4, gsh));
    assert_ok(kvmem_tensor_init_device(&dgv, &mgv, KVMEM_F32, 4, gsh));
    dgv.strides[0] = (int64_t)(M * row + pad);
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_gather(ad, b2, n2, 7, &dgk, &dgv));
    stats(ctx, &h1, &d1);
    if (!(d1 == 0 && h1 == up)) fail_msg("gather into VkBuffers moved h2d %llu (want %llu), d2h %llu (want 0)", (unsigned long long)h1, (unsigned long long)up, (unsigned long long)d1);
    assert_memory_equal(bgk.map, gk, L * lb);
    for (size_t l = 0; l < L; l++) {
        const char *base = (const char *)bgv.map + l * (lb + pad * 4);
        assert_memory_equal(base, (const char *)gv + l * lb, lb);
        for (size_t i = 0; i < pad * 4; i++) assert_true((unsigned char)base[lb + i] == 0xff); /* gaps untouched */
    }
    /* f16 output: the host path's result, one counted upload of its bytes */
    uint16_t *gk16 = malloc(L * lb / 2);
    kvmem_tensor tgk16, dgk16;
    assert_ok(kvmem_tensor_init(&tgk16, gk16, KVMEM_F16, 4, gsh));
    assert_ok(kvmem_gather(ah, b1, n1, 7, &tgk16, NULL));
    assert_ok(kvmem_tensor_init_device(&dgk16, &mgk, KVMEM_F16, 4, gsh));
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_gather(ad, b2, n2, 7, &dgk16, NULL));
    stats(ctx, &h1, &d1);
    assert_true(h1 == (uint64_t)M * 4 + 2ull * (uint64_t)M * (D / 2) * 4 + L * lb / 2);
    assert_true(d1 == L * lb); /* the kernel's f32 rows of K come back to be converted on the host */
    assert_memory_equal(bgk.map, gk16, L * lb / 2);

    kvmem_retrieval_free(r1);
    kvmem_retrieval_free(r2);
    free(gk16);
    free(gk);
    free(gv);
    free(rk);
    free(rv);
    free(rk2);
    free(rv2);
    free(k);
    free(v);
    vkbuf_destroy(&bk);
    vkbuf_destroy(&bv);
    vkbuf_destroy(&bq);
    vkbuf_destroy(&bgk);
    vkbuf_destroy(&bgv);
    kvmem_agent_close(ah);
    kvmem_agent_close(ad);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}
/* One attention over [T][H][D] K/V given from host memory and from
 * VkBuffers on ctx: outputs and statistics equal bit for bit; returns the
 * transfers of each call. */
static void attend_both(kvmem_context *ctx, const void *k, const void *v, kvmem_dtype dt, kvmem_attend_order order,
                        uint64_t hd[2][2]) {
    const size_t es = dt == KVMEM_F16 ? 2 : 4, ab = (size_t)T * H * D * es;
    int64_t s3[3] = {T, H, D}, qs[3] = {1, HQ, D};
    uint64_t rng = 99;
    float q[HQ * D], oh[HQ * D], od[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = tu_normal(&rng), oh[i] = od[i] = 0;
    vkbuf bk, bv;
    vkbuf_create(&bk, ab);
    vkbuf_create(&bv, ab + 12);
    memcpy(bk.map, k, ab);
    memcpy((char *)bv.map + 12, v, ab); /* V 12 bytes into its buffer */
    kvmem_device_memory mk = vk_mem(&bk, 0), mv = vk_mem(&bv, 12);
    kvmem_tensor tq, tk, tv, dk, dv, toh, tod;
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&tk, (void *)(uintptr_t)k, dt, 3, s3));
    assert_ok(kvmem_tensor_init(&tv, (void *)(uintptr_t)v, dt, 3, s3));
    assert_ok(kvmem_tensor_init_device(&dk, &mk, dt, 3, s3));
    assert_ok(kvmem_tensor_init_device(&dv, &mv, dt, 3, s3));
    assert_ok(kvmem_tensor_init(&toh, oh, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&tod, od, KVMEM_F32, 3, qs));
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = order;
    p.tile_size = 16;
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    kvmem_attend_stats sh, sd;
    for (int dev = 0; dev < 2; dev++) {
        src.k = dev ? &dk : &tk;
        src.v = dev ? &dv : &tv;
        assert_ok(kvmem_context_transfer_reset(ctx));
        assert_ok(kvmem_attend(ctx, &tq, &src, &p, dev ? &tod : &toh, dev ? &sd : &sh));
        stats(ctx, &hd[dev][0], &hd[dev][1]);
    }
    assert_memory_equal(oh, od, sizeof oh);
    assert_memory_equal(&sh, &sd, sizeof sh);
    vkbuf_destroy(&bk);
    vkbuf_destroy(&bv);
}

static void test_vulkan_attend(void **state) {
    (void)state;
    kvmem_context *ctx = vk_context_or_skip();
    const size_t n = (size_t)T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    uint16_t *k16 = malloc(n * 2), *v16 = malloc(n * 2);
    uint64_t rng = 5;
    for (size_t i = 0; i < n; i++) {
        k[i] = tu_normal(&rng);
        v[i] = tu_normal(&rng);
        k16[i] = kvm_f32_to_f16(k[i]);
        v16[i] = kvm_f32_to_f16(v[i]);
    }
    const uint64_t q_bytes = HQ * D * 4, tiles = (T + 15) / 16, down = HQ * D * 4 + H * 4;
    uint64_t hd[2][2];
    for (int f16 = 0; f16 < 2; f16++) {
        const uint64_t ab = (uint64_t)n * (f16 ? 2 : 4);
        /* RECENT with the stop rule: the device path, K and V read in place */
        attend_both(ctx, f16 ? (void *)k16 : (void *)k, f16 ? (void *)v16 : (void *)v, f16 ? KVMEM_F16 : KVMEM_F32,
                    KVMEM_ATTEND_RECENT, hd);
        assert_true(hd[0][0] == q_bytes + T * 4 + tiles * 4 + 2 * ab && hd[0][1] == down);
        assert_true(hd[1][0] == q_bytes + T * 4 + tiles * 4 && hd[1][1] == down); /* no K or V */
        /* SCORED: the device orders each stream's tiles itself, K and V
         * read in place; no tile list goes up, two counts per stream come
         * down */
        attend_both(ctx, f16 ? (void *)k16 : (void *)k, f16 ? (void *)v16 : (void *)v, f16 ? KVMEM_F16 : KVMEM_F32,
                    KVMEM_ATTEND_SCORED, hd);
        assert_true(hd[0][0] == q_bytes + T * 4 + 2 * ab && hd[0][1] == down + H * 4);
        assert_true(hd[1][0] == q_bytes + T * 4 && hd[1][1] == down + H * 4); /* no K or V */
    }
    free(k);
    free(v);
    free(k16);
    free(v16);
    kvmem_context_free(ctx);
}

/* q and out in VkBuffers (K and V on the host): q comes down once, out goes
 * up once after the call, the output equals the host call's. */
static void test_vulkan_q_out(void **state) {
    (void)state;
    kvmem_context *ctx = vk_context_or_skip();
    const size_t n = (size_t)T * H * D, qb = HQ * D * 4;
    float *k = malloc(n * 4), *v = malloc(n * 4), q[HQ * D], oh[HQ * D];
    uint64_t rng = 41;
    for (size_t i = 0; i < n; i++) k[i] = tu_normal(&rng), v[i] = tu_normal(&rng);
    for (int i = 0; i < HQ * D; i++) q[i] = tu_normal(&rng);
    vkbuf bq, bo;
    vkbuf_create(&bq, qb);
    vkbuf_create(&bo, qb);
    memcpy(bq.map, q, qb);
    memset(bo.map, 0x7f, qb);
    int64_t s3[3] = {T, H, D}, qs[3] = {1, HQ, D};
    kvmem_tensor tk, tv, tq, toh, dq, dout;
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&toh, oh, KVMEM_F32, 3, qs));
    kvmem_device_memory mq = vk_mem(&bq, 0), mo = vk_mem(&bo, 0);
    assert_ok(kvmem_tensor_init_device(&dq, &mq, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init_device(&dout, &mo, KVMEM_F32, 3, qs));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &tk;
    src.v = &tv;
    kvmem_attend_params p = kvmem_attend_default_params();
    p.order = KVMEM_ATTEND_RECENT;
    uint64_t h0, d0, h1, d1;
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_attend(ctx, &tq, &src, &p, &toh, NULL));
    stats(ctx, &h0, &d0);
    assert_ok(kvmem_context_transfer_reset(ctx));
    assert_ok(kvmem_attend(ctx, &dq, &src, &p, &dout, NULL));
    stats(ctx, &h1, &d1);
    assert_memory_equal(bo.map, oh, qb);
    assert_true(h1 == h0 + qb && d1 == d0 + qb);
    vkbuf_destroy(&bq);
    vkbuf_destroy(&bo);
    free(k);
    free(v);
    kvmem_context_free(ctx);
}

/* Refusals on a Vulkan context: CUDA memory, a span past the buffer,
 * host-only calls; nothing written. */
static void test_vulkan_refusals(void **state) {
    (void)state;
    kvmem_context *ctx = vk_context_or_skip();
    kvmem_model_spec sp = tu_spec(L, D);
    kvmem_pool *pool = NULL;
    kvmem_agent *ag = NULL;
    assert_ok(kvmem_pool_create(ctx, &sp, NULL, &pool));
    assert_ok(kvmem_agent_open(pool, "a", &ag));
    int64_t sh[4] = {L, 16, H, D};
    const size_t bytes = (size_t)L * 16 * H * D * 4;
    vkbuf b;
    vkbuf_create(&b, bytes);
    memset(b.map, 0x3c, bytes);
    kvmem_device_memory cm = kvmem_device_memory_default();
    cm.kind = KVMEM_MEMORY_CUDA;
    cm.handle = 0xbeef0000;
    cm.size = bytes;
    kvmem_tensor ck, vk;
    assert_ok(kvmem_tensor_init_device(&ck, &cm, KVMEM_F32, 4, sh));
    kvmem_device_memory m = vk_mem(&b, 0);
    assert_ok(kvmem_tensor_init_device(&vk, &m, KVMEM_F32, 4, sh));
    assert_status(kvmem_agent_append(ag, &ck, &vk, NULL), KVMEM_ERR_UNSUPPORTED,
                  "K is in CUDA device memory but the context runs on vulkan");
    m.size = bytes - 4; /* the descriptor changed after init: checked again at the call */
    assert_status(kvmem_agent_append(ag, &vk, &vk, NULL), KVMEM_ERR_INVALID_ARG, "reaches past its Vulkan memory");
    m.size = bytes;
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(ag, &info));
    assert_true(info.n_tokens == 0);
    assert_ok(kvmem_agent_append(ag, &vk, &vk, NULL));
    assert_ok(kvmem_agent_get_info(ag, &info));
    assert_true(info.n_tokens == 16);
    assert_status(kvmem_agent_read(ag, 0, 16, &vk, NULL), KVMEM_ERR_UNSUPPORTED, "host memory only");
    for (size_t i = 0; i < bytes; i++) assert_true(((unsigned char *)b.map)[i] == 0x3c);
    vkbuf_destroy(&b);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
}
#else
static void test_vulkan_attend(void **state) {
    (void)state;
    TU_SKIP("built without the Vulkan plugin (no VkBuffer to make)");
}
static void test_vulkan_refusals(void **state) {
    (void)state;
    TU_SKIP("built without the Vulkan plugin (no VkBuffer to make)");
}
static void test_vulkan_q_out(void **state) {
    (void)state;
    TU_SKIP("built without the Vulkan plugin (no VkBuffer to make)");
}
static void test_vulkan_buffers(void **state) {
    (void)state;
    TU_SKIP("built without the Vulkan plugin (no VkBuffer to make)");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptor_refusals),
        cmocka_unit_test(test_cpu_context_refuses),
        cmocka_unit_test(test_cuda_routing_on_a_stand_in),
        cmocka_unit_test(test_vulkan_buffers),
        cmocka_unit_test(test_vulkan_attend),
        cmocka_unit_test(test_vulkan_q_out),
        cmocka_unit_test(test_vulkan_refusals),
    };
    return tu_group_result(cmocka_run_group_tests(tests, NULL, NULL), sizeof tests / sizeof tests[0]);
}

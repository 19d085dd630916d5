/* The CPU backend: buffers are host memory, ops run the kernel table chosen
 * at run time (scalar / AVX2 / AVX-512) on the context's worker pool. */
#include "../backend/backend.h"
#include "../context.h"
#include "../internal.h"
#include "../attend/attend.h"
#include "half.h"
#include "kernels.h"
#include "scratch.h"
#include "../retrieve/score.h" /* retrieval ops */
#include "../qmem/qmem_internal.h" /* eviction: qmem_score */
#include "../quant/quant.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

struct kvmem_buffer {
    size_t size;
    unsigned char *data;
};

static void cpu_free(kvmem_backend *be) {
    if (!be) return;
    kvm_scratch_free(be->impl);
    kvm_free(be);
}

static kvmem_status cpu_buffer_alloc(kvmem_backend *be, size_t size, kvmem_buffer **out) {
    (void)be;
    kvmem_buffer *b = kvm_malloc(sizeof *b);
    void *d = kvm_aligned_alloc(size);
    if (!b || !d) {
        kvm_free(b);
        kvm_aligned_free(d);
        return kvm_fail(KVMEM_ERR_NOMEM, "cpu backend: out of memory for a %zu-byte buffer", size);
    }
    b->size = size;
    b->data = d;
    *out = b;
    return KVMEM_OK;
}

static void cpu_buffer_free(kvmem_backend *be, kvmem_buffer *b) {
    (void)be;
    if (!b) return;
    kvm_aligned_free(b->data);
    kvm_free(b);
}

static int in_range(const kvmem_buffer *b, size_t off, size_t n) {
    return b && off <= b->size && n <= b->size - off;
}

static kvmem_status cpu_upload(kvmem_backend *be, kvmem_buffer *dst, size_t off, const void *src,
                               size_t n) {
    (void)be;
    if (!in_range(dst, off, n))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "upload of %zu bytes at %zu outside the buffer", n, off);
    if (n) memcpy(dst->data + off, src, n);
    return KVMEM_OK;
}

static kvmem_status cpu_download(kvmem_backend *be, const kvmem_buffer *src, size_t off, void *dst,
                                 size_t n) {
    (void)be;
    if (!in_range(src, off, n))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "download of %zu bytes at %zu outside the buffer", n, off);
    if (n) memcpy(dst, src->data + off, n);
    return KVMEM_OK;
}

/* backend.h: for the CPU reference entries of the device kernels. */
void *kvm_cpu_buffer_span(const kvmem_buffer *b, size_t *size) {
    *size = b->size;
    return b->data;
}

static void *cpu_host_ptr(kvmem_backend *be, kvmem_buffer *b) {
    (void)be;
    return b ? b->data : NULL;
}

static kvmem_status cpu_sync(kvmem_backend *be) {
    (void)be;
    return KVMEM_OK;
}

static kvmem_status cpu_convert(kvmem_backend *be, kvmem_buffer *dst, size_t dst_off,
                                kvmem_dtype ddt, const kvmem_buffer *src, size_t src_off,
                                kvmem_dtype sdt, size_t n) {
    (void)be;
    size_t ds = kvm_dtype_size(ddt), ss = kvm_dtype_size(sdt), db, sb;
    if (!ds || !ss) return kvm_fail(KVMEM_ERR_INVALID_ARG, "convert: dtype must be f32, f16 or bf16");
    if (!kvm_mul_size(n, ds, &db) || !kvm_mul_size(n, ss, &sb) || !in_range(dst, dst_off, db) ||
        !in_range(src, src_off, sb))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "convert: %zu elements outside the buffers", n);
    kvm_convert_host(dst->data + dst_off, ddt, src->data + src_off, sdt, n);
    return KVMEM_OK;
}

typedef struct {
    const float *keys;
    size_t group_stride, n_rows, dim;
    float *mn, *mx;
} aabb_job;

static void aabb_task(void *arg, size_t b, size_t e) {
    const aabb_job *j = arg;
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    for (size_t g = b; g < e; g++)
        k->minmax_rows(j->keys + g * j->group_stride, j->n_rows, j->dim, j->dim, j->mn + g * j->dim,
                       j->mx + g * j->dim);
}

static kvmem_status cpu_aabb_build(kvmem_backend *be, const kvmem_buffer *keys, size_t keys_off,
                                   size_t n_groups, size_t group_stride, size_t n_rows, size_t dim,
                                   kvmem_buffer *out_min, kvmem_buffer *out_max, size_t out_off) {
    if (n_rows == 0 || dim == 0 || n_groups == 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "aabb_build: empty input");
    size_t in_bytes, out_bytes;
    if (!kvm_mul_size((n_groups - 1) * group_stride + n_rows * dim, 4, &in_bytes) ||
        !kvm_mul_size(n_groups * dim, 4, &out_bytes) || !in_range(keys, keys_off, in_bytes) ||
        !in_range(out_min, out_off, out_bytes) || !in_range(out_max, out_off, out_bytes))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "aabb_build: ranges outside the buffers");
    aabb_job j = {(const float *)(keys->data + keys_off), group_stride, n_rows, dim,
                  (float *)(out_min->data + out_off), (float *)(out_max->data + out_off)};
    kvm_parallel_for(be->ctx ? be->ctx->tp : NULL, n_groups, 8, aabb_task, &j);
    return KVMEM_OK;
}

/* -- persistence -- */

/* backend.h: bytes [off, off + n) of a CPU buffer, NULL outside or unaligned. */
void *kvm_cpu_buf_at(const kvmem_buffer *b, size_t off, size_t n) {
    return in_range(b, off, n) && off % 4 == 0 ? b->data + off : NULL;
}

static kvmem_status check_quant(kvmem_dtype dt, int which, size_t n, size_t dim, const char *op) {
    if (!kvm_is_quant_dtype(dt)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: dtype %s is not Q8, Q4 or Q4_KIVI", op, kvmem_dtype_name(dt));
    if (which != 0 && which != 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: which must be 0 (keys) or 1 (values)", op);
    if (n == 0 || dim == 0 || dim > 1024 || n > ((size_t)1 << 24))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %zu rows of %zu: need 1..2^24 rows of 1..1024", op, n, dim);
    return KVMEM_OK;
}

static kvmem_status cpu_quantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src, size_t src_off,
                                 size_t n, size_t dim, kvmem_buffer *dst, size_t dst_off) {
    (void)be;
    kvmem_status st = check_quant(dt, which, n, dim, "quantize");
    if (st != KVMEM_OK) return st;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    if (!in_range(src, src_off, n * dim * 4) || !in_range(dst, dst_off, q.bytes) || src_off % 4 || dst_off % 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "quantize: ranges outside the buffers or misaligned");
    const float *x = (const float *)(const void *)(src->data + src_off);
    float mm[2 * 1024];
    if (q.per_channel) kvm_cpu_kernels_get()->minmax_rows(x, n, dim, dim, mm, mm + 1024);
    for (size_t i = 0; i < n * dim; i++)
        if (!(fabsf(x[i]) <= KVM_QUANT_LIMIT))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "quantize: value %g at %zu is not finite within +-65504", x[i], i);
    /* whole section zeroed first: every padding byte is 0 (kvm_quant_section
     * leaves Q8's pad between scales and codes alone), as on the devices */
    memset(dst->data + dst_off, 0, q.bytes);
    kvm_quant_section(dt, which, x, n, dim, mm, mm + 1024, dst->data + dst_off);
    return KVMEM_OK;
}

static kvmem_status cpu_dequantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src, size_t src_off,
                                   size_t n, size_t dim, size_t row0, size_t cnt, kvmem_buffer *dst, size_t dst_off) {
    (void)be;
    kvmem_status st = check_quant(dt, which, n, dim, "dequantize");
    if (st != KVMEM_OK) return st;
    kvm_qsection q = kvm_qsection_layout(dt, which, n, dim);
    if (row0 > n || cnt > n - row0 || !in_range(src, src_off, q.bytes) || !in_range(dst, dst_off, cnt * dim * 4) ||
        src_off % 4 || dst_off % 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "dequantize: ranges outside the buffers or misaligned");
    kvm_dequant_section(dt, which, src->data + src_off, n, dim, row0, cnt, (float *)(void *)(dst->data + dst_off));
    return KVMEM_OK;
}

static void *cpu_proc(kvmem_backend *be, const char *name) {
    (void)be;
    (void)name;
    return NULL;
}

static const kvmem_backend_iface cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .buffer_upload = cpu_upload,
    .buffer_download = cpu_download,
    .buffer_host_ptr = cpu_host_ptr,
    .synchronize = cpu_sync,
    .convert = cpu_convert,
    .aabb_build = cpu_aabb_build,
    /* -- retrieval -- */
    .aabb_score = kvm_cpu_aabb_score,
    .topk = kvm_cpu_topk,
    .gather = kvm_cpu_gather,
    .dev_score = kvm_cpu_dev_score,
    .dev_score_reduce = kvm_cpu_dev_score_reduce,
    .dev_topk = kvm_cpu_dev_topk,
    .dev_gather_rope = kvm_cpu_dev_gather_rope,

    /* -- eviction -- */
    .qmem_score = kvm_cpu_qmem_score,
    .dev_qmem_score = kvm_cpu_dev_qmem_score,

    /* -- attention -- */
    .attend = kvm_attend_cpu,
    .dev_attend = kvm_attend_dev_cpu,

    /* -- persistence -- */
    .quantize = cpu_quantize,
    .dequantize = cpu_dequantize,

    .get_proc_address = cpu_proc,
};

kvmem_status kvm_cpu_backend_create(kvmem_context *ctx, kvmem_backend **out) {
    kvmem_backend *be = kvm_calloc(1, sizeof *be);
    kvm_scratch *sc = kvm_scratch_create(); /* impl: the cache of per-call work memory */
    if (!be || !sc) {
        kvm_free(be);
        kvm_scratch_free(sc);
        return KVMEM_ERR_NOMEM;
    }
    be->impl = sc;
    be->iface = &cpu_iface;
    be->ctx = ctx;
    *out = be;
    return KVMEM_OK;
}

/* Host conversion between tensor dtypes through the chosen kernel table. */
void kvm_convert_host(void *dst, kvmem_dtype ddt, const void *src, kvmem_dtype sdt, size_t n) {
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    if (ddt == sdt) {
        memcpy(dst, src, n * kvm_dtype_size(ddt));
    } else if (sdt == KVMEM_F32) {
        if (ddt == KVMEM_F16) k->f32_to_f16(src, dst, n);
        else k->f32_to_bf16(src, dst, n);
    } else if (ddt == KVMEM_F32) {
        if (sdt == KVMEM_F16) k->f16_to_f32(src, dst, n);
        else k->bf16_to_f32(src, dst, n);
    } else { /* f16 <-> bf16 through f32, in chunks on the stack */
        float tmp[256];
        const uint16_t *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i += 256) {
            size_t c = KVM_MIN(n - i, (size_t)256);
            kvm_convert_host(tmp, KVMEM_F32, s + i, sdt, c);
            kvm_convert_host(d + i, ddt, tmp, KVMEM_F32, c);
        }
    }
}

/* The CPU backend's rule score (its dev_qmem_score entry): for each (layer,
 * KV head) the G query heads of the group read the same key rows once (one
 * register-tiled pass), then a
 * softmax per query head over all candidates is accumulated into a partial
 * score. Work is split into a fixed number of chunks, each with its own
 * partial sum, reduced in chunk order, so the result does not depend on
 * the thread count. */
#include "cpu_backend.h"
#include "kernels.h"
#include "tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define QS_MAX_CHUNKS 16
#define QS_TILE 64      /* most key rows per kernel call */
#define QS_MAX_GROUP 64 /* query heads per kernel call */

typedef struct {
    const kvmem_tensor *k;
    const float *mem;
    const kvm_attend_kernels *ak; /* the q.k kernels over f32 / f16 / bf16 rows (the attention family) */
    const kvm_qk_kernels *kk;     /* softmax_acc */
    size_t L, Hq, Hkv, G, D, N, n_chunks, n_workers;
    float scale;
    kvmem_dtype rows_dt; /* the rows as the kernel reads them: K's dtype, or F32 when converted */
    int head_major;      /* a head's rows adjacent ([L][Hkv][N][D] viewed as [L][N][Hkv][D]: HF caches) */
    size_t hm_tile;      /* head-major K: rows per step and prefetch distance, 16 KiB (f16: 64 rows,
                            6.4 ms against 7.7 with 32 for 8 layers at 8k) */
    size_t pm_tile;      /* position-major K: positions per tile, all heads of a tile 16 KiB (f32) or 32 KiB */
    float *partial;      /* [n_chunks][N] */
    float *logits;       /* [n_workers][Hq][N] */
    float *conv;         /* [n_workers][QS_TILE][D]: rows converted (K's last stride is not 1), or NULL */
    int32_t bad[QS_MAX_CHUNKS]; /* per chunk: 1 + the first layer with a non-finite logit, or 0 */
} qs_job;

/* Prefetch K[l][j0 .. j0 + n)[g] while the current rows compute: the
 * hardware prefetcher of the machine measured does not follow these reads
 * (a head's rows are a page apart in the usual layout), so ask, in
 * ascending addresses (BENCHMARKS.md, "evict"). */
static void k_prefetch(const kvmem_tensor *k, size_t l, size_t g, size_t j0, size_t n, size_t D) {
    const size_t es = kvm_dtype_size(k->dtype);
    const size_t bytes = (size_t)((int64_t)(D - 1) * k->strides[3] + 1) * es;
    const char *base = (const char *)k->data +
                       (size_t)((int64_t)l * k->strides[0] + (int64_t)j0 * k->strides[1] + (int64_t)g * k->strides[2]) * es;
    if ((size_t)k->strides[1] * es == bytes) { /* the rows make one run */
        for (size_t x = 0; x < n * bytes; x += 64) __builtin_prefetch(base + x, 0, 3);
        return;
    }
    for (size_t i = 0; i < n; i++)
        for (size_t x = 0; x < bytes; x += 64) __builtin_prefetch(base + i * (size_t)k->strides[1] * es + x, 0, 3);
}

/* Position-major K whose tiles are one run (the heads of a position
 * adjacent, positions adjacent): slice `part` of `parts` of the next tile's
 * run, ascending, before head `part`'s rows compute, so the requests spread
 * over the tile and each line is asked for once (per head, the requests
 * took a 512-byte piece of every position: f32 8k, one thread, 0.57 of the
 * read limit against 0.50). Returns 0 when the rows are not one run. */
static int pm_prefetch_slice(const kvmem_tensor *k, size_t l, size_t j0, size_t n, size_t part, size_t parts) {
    const size_t es = kvm_dtype_size(k->dtype), D = (size_t)k->shape[3], H = (size_t)k->shape[2];
    if (k->strides[3] != 1 || (size_t)k->strides[2] != D || (size_t)k->strides[1] != H * D) return 0;
    const char *base = (const char *)k->data + (size_t)((int64_t)l * k->strides[0] + (int64_t)j0 * k->strides[1]) * es;
    const size_t run = n * H * D * es, a = (run * part / parts) & ~(size_t)63, b = run * (part + 1) / parts;
    for (size_t x = a; x < b; x += 64) __builtin_prefetch(base + x, 0, 3);
    return 1;
}

/* logits[g * G + i][j0 .. j0 + n) of layer l: the G query rows of KV head g
 * against its key rows at positions [j0, j0 + n), read in place (f16 and
 * bf16 converted in registers) or converted into conv. */
static void qk_rows(const qs_job *q, size_t l, size_t g, size_t j0, size_t n, float *conv, float *lg) {
    const kvmem_tensor *k = q->k;
    const size_t es = kvm_dtype_size(k->dtype);
    const void *rows[QS_TILE];
    const float *qv[QS_MAX_GROUP];
    for (size_t i = 0; i < n; i++) {
        const int64_t off = (int64_t)l * k->strides[0] + (int64_t)(j0 + i) * k->strides[1] + (int64_t)g * k->strides[2];
        if (conv) {
            kvm_tensor_read_f32(k, off, conv + i * q->D, q->D);
            rows[i] = conv + i * q->D;
        } else {
            rows[i] = (const unsigned char *)k->data + (size_t)off * es;
        }
    }
    for (size_t g0 = 0; g0 < q->G; g0 += QS_MAX_GROUP) {
        const size_t ng = KVM_MIN(q->G - g0, (size_t)QS_MAX_GROUP);
        for (size_t i = 0; i < ng; i++) qv[i] = q->mem + (l * q->Hq + g * q->G + g0 + i) * q->D;
        float *out = lg + (g * q->G + g0) * q->N + j0;
        if (q->rows_dt == KVMEM_F16)
            q->ak->qk_f16(qv, ng, (const uint16_t *const *)rows, n, q->D, q->scale, out, q->N);
        else if (q->rows_dt == KVMEM_BF16)
            q->ak->qk_bf16(qv, ng, (const uint16_t *const *)rows, n, q->D, q->scale, out, q->N);
        else
            q->ak->qk(qv, ng, (const float *const *)rows, n, q->D, q->scale, out, q->N);
    }
}

/* One chunk (a range of layers) into its partial sum, with one worker's
 * logits buffer. Within a layer the key rows are swept once: position-major
 * K in tiles of pm_tile positions, every KV head of a tile before the next
 * tile (one token's keys of all heads are contiguous, so memory is read in
 * order; a tile and the next one prefetched stay in L1: tiles of 128 KiB
 * ran at half the speed), head-major K one head at a time (its rows are one
 * run), hm_tile rows (16 KiB) per step. */
static void qs_chunk(qs_job *q, size_t c, float *lg, float *conv) {
    float *acc = q->partial + c * q->N;
    memset(acc, 0, q->N * sizeof *acc);
    const size_t l0 = c * q->L / q->n_chunks, l1 = (c + 1) * q->L / q->n_chunks;
    for (size_t l = l0; l < l1; l++) {
        if (q->head_major) {
            for (size_t g = 0; g < q->Hkv; g++)
                for (size_t j0 = 0; j0 < q->N; j0 += q->hm_tile) {
                    const size_t n = KVM_MIN(q->N - j0, q->hm_tile), nn = KVM_MIN(q->N - j0 - n, q->hm_tile);
                    k_prefetch(q->k, l, g, j0 + n, nn, q->D);
                    qk_rows(q, l, g, j0, n, conv, lg);
                }
        } else {
            for (size_t j0 = 0; j0 < q->N; j0 += q->pm_tile) {
                const size_t n = KVM_MIN(q->N - j0, q->pm_tile), nn = KVM_MIN(q->N - j0 - n, q->pm_tile);
                for (size_t g = 0; g < q->Hkv; g++) {
                    if (!pm_prefetch_slice(q->k, l, j0 + n, nn, g, q->Hkv)) k_prefetch(q->k, l, g, j0 + n, nn, q->D);
                    qk_rows(q, l, g, j0, n, conv, lg);
                }
            }
        }
        /* a non-finite K (or an overflowing logit) would be ignored by
         * the max and clamped by SIMD exp into a plausible score: refuse
         * it; the logits are 1/head_dim of K, so the check is cheap */
        if (kvm_cpu_kernels_get()->count_nonfinite(lg, q->Hq * q->N)) {
            q->bad[c] = (int32_t)l + 1;
            return;
        }
        for (size_t h = 0; h < q->Hq; h++) q->kk->softmax_acc(lg + h * q->N, q->N, acc);
    }
}

/* Worker w takes chunks w, w + n_workers, ...: the chunks (and so the
 * result) do not depend on the thread count, the buffers are per worker. */
static void qs_task(void *arg, size_t b, size_t e) {
    qs_job *q = arg;
    for (size_t w = b; w < e; w++)
        for (size_t c = w; c < q->n_chunks; c += q->n_workers)
            qs_chunk(q, c, q->logits + w * q->Hq * q->N, q->conv ? q->conv + w * QS_TILE * q->D : NULL);
}

typedef struct {
    const float *partial;
    size_t n_chunks, N;
    float *out;
} qs_reduce;

static void qs_reduce_task(void *arg, size_t b, size_t e) {
    const qs_reduce *r = arg;
    for (size_t j = b; j < e; j++) {
        float s = 0.0f;
        for (size_t c = 0; c < r->n_chunks; c++) s += r->partial[c * r->N + j];
        r->out[j] = s;
    }
}

kvmem_status kvm_cpu_qmem_score(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                                const kvmem_tensor *k, float *scores) {
    static const char fn[] = "kvmem_qmem_score";
    qs_job q;
    memset(&q, 0, sizeof q);
    q.k = k;
    q.mem = memory;
    q.ak = kvm_cpu_kernels_get()->attend;
    q.kk = kvm_cpu_kernels_get()->qk;
    q.Hq = (size_t)spec->n_q_heads;
    q.Hkv = (size_t)spec->n_kv_heads;
    q.G = q.Hq / q.Hkv;
    q.D = (size_t)spec->head_dim;
    q.N = (size_t)k->shape[1];
    q.L = (size_t)spec->n_layers;
    q.n_chunks = KVM_MIN(q.L, (size_t)QS_MAX_CHUNKS);
    q.scale = (float)(1.0 / sqrt((double)q.D));
    q.rows_dt = k->strides[3] == 1 || q.D == 1 ? k->dtype : KVMEM_F32;
    q.head_major = q.Hkv > 1 && k->strides[2] > k->strides[1];
    /* f32 tiles of 16 KiB, 16-bit ones of 32 KiB (16 positions of Qwen3-8B's
     * heads): with the faster q.k kernel, 16 KiB f16 tiles ran 7.0-8.3 ms
     * where 32 KiB ran 6.0-6.7 (8 layers, 8k), f32 tiles of 32 KiB 15-16
     * ms against 12-13 */
    const size_t es = kvm_dtype_size(q.rows_dt), tile_bytes = es == 4 ? 16384 : 32768;
    q.hm_tile = KVM_MAX((size_t)4, KVM_MIN((size_t)QS_TILE, (size_t)16384 / (q.D * es)));
    q.pm_tile = KVM_MAX((size_t)4, KVM_MIN((size_t)QS_TILE, (tile_bytes / (q.Hkv * q.D * es)) & ~(size_t)3));
    kvm_threadpool *tp = kvm_cpu_backend_tp(be);
    q.n_workers = KVM_MIN(q.n_chunks, (size_t)kvm_threadpool_size(tp));
    size_t np, nl, nc = 0;
    if (!kvm_mul_size(q.n_chunks, q.N, &np) || !kvm_mul_size(q.n_workers * q.Hq, q.N, &nl) || nl > SIZE_MAX / 8 ||
        np > SIZE_MAX / 8)
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %zu candidates (its size overflows)", fn, q.N);
    if (k->strides[3] != 1 && q.D > 1) nc = q.n_workers * QS_TILE * q.D; /* rows converted */
    /* work memory from the context's cache: nothing allocated per call once warm */
    kvm_scratch *sc = kvm_cpu_backend_scratch(be);
    q.partial = kvm_scratch_take(sc, np * sizeof(float));
    q.logits = kvm_scratch_take(sc, nl * sizeof(float));
    if (nc) q.conv = kvm_scratch_take(sc, nc * sizeof(float));
    kvmem_status st = KVMEM_OK;
    if (!q.partial || !q.logits || (nc && !q.conv)) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of N = %zu candidates", fn, q.N);
        goto done;
    }
    kvm_parallel_for(tp, q.n_workers, 1, qs_task, &q);
    for (size_t c = 0; c < q.n_chunks; c++)
        if (q.bad[c]) { /* scores are untouched */
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K at layer %d holds a non-finite value (or a logit overflows)", fn,
                          q.bad[c] - 1);
            goto done;
        }
    qs_reduce r = {q.partial, q.n_chunks, q.N, scores};
    kvm_parallel_for(tp, q.N, 4096, qs_reduce_task, &r);
done:
    kvm_scratch_give(sc, q.partial);
    kvm_scratch_give(sc, q.logits);
    kvm_scratch_give(sc, q.conv);
    return st;
}

/* The table's entry: the buffer-level form, or the caller's K in place. */
kvmem_status kvm_cpu_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    static const char op[] = "dev_qmem_score";
    if (!a) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: args is NULL", op);
    if (a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1 || a->n < 1 ||
        a->n_q_heads % a->n_kv_heads)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: need n_layers, n_q_heads, n_kv_heads, head_dim, n >= 1 and n_q_heads a multiple of "
                        "n_kv_heads (got %d, %d, %d, %d, %d)",
                        op, a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n);
    size_t L = (size_t)a->n_layers, Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads, D = (size_t)a->head_dim,
           N = (size_t)a->n, mb, kb;
    if (a->mem_off % 4 || a->k_off % 4 || a->scores_off % 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: offsets must be multiples of 4 bytes", op);
    const float *mem = NULL, *k = NULL;
    float *scores = NULL;
    if (kvm_mul_size(L * Hq, D * 4, &mb) && kvm_mul_size(L * N, Hkv, &kb) && kvm_mul_size(kb, D * 4, &kb)) {
        mem = kvm_cpu_buf_at(a->mem, a->mem_off, mb);
        k = a->k_view ? NULL : kvm_cpu_buf_at(a->k, a->k_off, kb);
        scores = kvm_cpu_buf_at(a->scores, a->scores_off, N * 4);
    }
    if (a->k_view) { /* the host-side form: the caller's K in place, any dtype and strides */
        const kvmem_tensor *v = a->k_view;
        if (v->ndim != 4 || v->shape[0] != a->n_layers || v->shape[1] != a->n || v->shape[2] != a->n_kv_heads ||
            v->shape[3] != a->head_dim)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: k_view is not [n_layers][n][n_kv_heads][head_dim]", op);
        k = (const float *)v->data;
    }
    if (!mem || !k || !scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ranges outside the buffers", op);
    kvmem_model_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_layers = a->n_layers;
    spec.n_q_heads = a->n_q_heads;
    spec.n_kv_heads = a->n_kv_heads;
    spec.head_dim = a->head_dim;
    kvmem_tensor kt;
    memset(&kt, 0, sizeof kt);
    kt.data = (void *)(uintptr_t)k; /* read only */
    kt.dtype = KVMEM_F32;
    kt.ndim = 4;
    int64_t shape[4] = {a->n_layers, a->n, a->n_kv_heads, a->head_dim};
    int64_t stride = 1;
    for (int d = 3; d >= 0; d--) {
        kt.shape[d] = shape[d];
        kt.strides[d] = stride;
        stride *= shape[d];
    }
    return kvm_cpu_qmem_score(be, &spec, mem, a->k_view ? a->k_view : &kt, scores);
}

/* Validation and launch parameters of the CUDA backend (plain C). */
#include "cuda_host.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_err[512];

kvmem_status kvm_cu_fail(kvmem_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

const char *kvm_cu_last_error(void) { return g_err; }

bool kvm_cu_in_range(size_t size, size_t off, size_t n) { return off <= size && n <= size - off; }

bool kvm_cu_tensor_bytes(kvmem_dtype dt, size_t n, size_t *bytes) {
    size_t es = dt == KVMEM_F32 ? 4 : (dt == KVMEM_F16 || dt == KVMEM_BF16) ? 2 : 0;
    if (!es || (n != 0 && es > SIZE_MAX / n)) return false;
    *bytes = n * es;
    return true;
}

bool kvm_cu_head_dim_supported(int32_t d) { return d == 64 || d == 128 || d == 256; }

kvm_cu_grid kvm_cu_grid_1d(size_t n, uint32_t threads, uint32_t max_blocks) {
    kvm_cu_grid g = {0, threads ? threads : 256};
    if (n == 0) return g;
    size_t b = (n + g.threads - 1) / g.threads;
    if (max_blocks == 0) max_blocks = 1;
    g.blocks = b > max_blocks ? max_blocks : (uint32_t)b;
    return g;
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static int32_t pow2_at_least(int32_t n) {
    int32_t p = 1;
    while (p < n) p <<= 1;
    return p;
}

kvmem_status kvm_cu_score_plan_make(const kvm_cu_score_shape *s, size_t smem_limit,
                                    kvm_cu_score_plan *plan) {
    if (!s || !plan) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "aabb_score plan: NULL argument");
    if (s->n_layers < 1 || s->n_q_heads < 1 || s->n_kv_heads < 1 || s->n_q_heads % s->n_kv_heads)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG,
                           "aabb_score: %d layers, %d query heads, %d KV heads: need >= 1 and query heads a multiple of KV heads",
                           s->n_layers, s->n_q_heads, s->n_kv_heads);
    if (!kvm_cu_head_dim_supported(s->head_dim))
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "aabb_score: head_dim %d has no CUDA kernel (64, 128, 256)",
                           s->head_dim);
    if (s->n_q < 1 || s->n_q > KVM_CU_SCORE_MAX_Q)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "aabb_score: %d query tokens: must be in [1, %d]", s->n_q,
                           KVM_CU_SCORE_MAX_Q);
    if (s->n_blocks < 1 || s->n_blocks > (1 << 24))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "aabb_score: %d blocks: must be in [1, 2^24]", s->n_blocks);
    kvm_cu_score_plan p;
    memset(&p, 0, sizeof p);
    p.nb_pad = (s->n_blocks + 15) / 16 * 16;
    p.sort_len = s->norm_rr ? pow2_at_least(s->n_blocks) : 0;
    const int32_t group = s->n_q_heads / s->n_kv_heads;
    const size_t k2 = 2 * (size_t)s->head_dim, sort = (size_t)p.sort_len * 8; /* (key, index) pairs */
    /* The most heads per CTA whose scores stay in shared memory; when none
     * does, the most whose query operand fits (the scores go to the workspace). */
    int32_t hp = 0;
    for (int pass = 0; pass < 2 && !hp; pass++)
        for (int32_t d = group; d >= 1 && !hp; d--) {
            if (group % d) continue;
            const size_t rows = ((size_t)d * s->n_q + 15) / 16 * 16;
            const size_t qp_tile = rows * k2 * 2, scores = rows * (size_t)p.nb_pad * 4;
            if (pass == 0 ? qp_tile + scores + sort <= smem_limit : qp_tile <= smem_limit) hp = d;
        }
    if (!hp)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "aabb_score: %d query tokens of head_dim %d need more than %zu bytes of shared memory",
                           s->n_q, s->head_dim, smem_limit);
    p.heads_per_cta = hp;
    p.rows_pad = (hp * s->n_q + 15) / 16 * 16;
    const size_t n_cta = (size_t)s->n_layers * (size_t)(s->n_q_heads / hp);
    const size_t qp_tile = (size_t)p.rows_pad * k2 * 2;            /* one CTA's query operand */
    const size_t scores = (size_t)p.rows_pad * (size_t)p.nb_pad * 4; /* one CTA's scores */
    p.qp_bytes = n_cta * qp_tile;
    p.blk_bytes = (size_t)s->n_layers * (size_t)s->n_kv_heads * (size_t)p.nb_pad * k2 * 2;
    p.in_smem = qp_tile + scores + sort <= smem_limit;
    p.smem_bytes = p.in_smem ? qp_tile + scores + sort : qp_tile;
    p.ws_bytes = round_up(p.qp_bytes, 256);
    if (!p.in_smem) p.ws_bytes += round_up(n_cta * (scores + sort), 256);
    *plan = p;
    return KVMEM_OK;
}

kvmem_status kvm_cu_topk_plan_make(int64_t n, int32_t k, kvm_cu_topk_plan *plan) {
    if (!plan) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "topk plan: NULL argument");
    if (n < 1 || n > INT32_MAX)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "topk: %lld candidates: must be in [1, 2^31)", (long long)n);
    if (k < 1 || k > KVM_CU_TOPK_MAX_K)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "topk: k = %d: must be in [1, %d]", k, KVM_CU_TOPK_MAX_K);
    plan->k = (int64_t)k < n ? k : (int32_t)n;
    plan->sort_len = pow2_at_least(plan->k);
    /* 256-bin histogram + (index, score) pairs to sort */
    plan->smem_bytes = 256 * 4 + (size_t)plan->sort_len * 8 + 64;
    return KVMEM_OK;
}

size_t kvm_cu_staging_n_chunks(size_t bytes, size_t chunk) {
    if (bytes == 0 || chunk == 0) return 0;
    return bytes / chunk + (bytes % chunk != 0);
}

kvm_cu_chunk kvm_cu_staging_chunk(size_t bytes, size_t chunk, size_t i) {
    kvm_cu_chunk c = {0, 0, 0};
    if (chunk == 0 || i >= kvm_cu_staging_n_chunks(bytes, chunk)) return c;
    c.offset = i * chunk;
    c.size = bytes - c.offset < chunk ? bytes - c.offset : chunk;
    c.slot = (int32_t)(i & 1);
    return c;
}

/* Retrieval kernels: the table's device kernels dev_score (aabb_score's GEMM
 * then score_reduce), dev_score_reduce (score_sets), dev_topk (radix select)
 * and dev_gather_rope, and the standalone aabb_score / gather_rope still
 * reached by name (vk_ops.h).
 * Arguments are checked by the same code as the CPU reference
 * (core/backend/dev_args.h): bad input gets a status and a message and
 * nothing runs. */
#include "vk_internal.h"
#include "vk_ops.h"
#include "arith.h"
#include "dev_args.h"

#include <stdlib.h>
#include <string.h>

/* base + (c1-1)*s1 + (c2-1)*s2 + tail elements, overflow-checked (c1, c2 >= 1). */
static int extent(size_t *out, size_t base, size_t c1, size_t s1, size_t c2, size_t s2, size_t tail) {
    size_t a, b;
    return kvm_mul_size(c1 - 1, s1, &a) && kvm_mul_size(c2 - 1, s2, &b) && kvm_add_size(base, a, out) &&
           kvm_add_size(*out, b, out) && kvm_add_size(*out, tail, out);
}

/* The buffer holds `el` f32 elements (from its start) and the shaders can
 * index them with 32-bit indices. */
static int holds(const kvmem_buffer *b, size_t el) {
    return b && el <= UINT32_MAX && el <= b->size / 4;
}

static kvm_vk *impl(kvmem_backend *be) { return be->impl; }

static kvmem_status vk_aabb_score(kvmem_backend *be, const kvm_vk_aabb_score_args *a) {
    kvm_vk *v = impl(be);
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: args is NULL");
    if (!a->n_q || !a->n_blocks || !a->dim || !a->batch || !a->s_div)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: empty input (n_q %zu, n_blocks %zu, dim %zu, batch %zu, s_div %zu)",
                           a->n_q, a->n_blocks, a->dim, a->batch, a->s_div);
    if (a->q_off % 4 || a->s_off % 4 || a->out_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: offsets must be multiples of 4 bytes");
    size_t qe, se, oe;
    if (!extent(&qe, a->q_off / 4, a->batch, a->q_bs, a->n_q, a->q_rs, a->dim) ||
        !extent(&se, a->s_off / 4, (a->batch - 1) / a->s_div + 1, a->s_bs, a->n_blocks, a->s_rs, a->dim) ||
        !extent(&oe, a->out_off / 4, a->batch, a->o_bs, a->n_q, a->o_rs, a->n_blocks) || !holds(a->q, qe) ||
        !holds(a->s_min, se) || !holds(a->s_max, se) || !holds(a->out, oe))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: ranges outside the buffers");
    if (a->q_rs < a->dim || a->s_rs < a->dim || a->o_rs < a->n_blocks)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "aabb_score: row strides shorter than the rows");
    const uint32_t *lim = v->props.limits.maxComputeWorkGroupCount;
    uint32_t g[3] = {(uint32_t)((a->n_blocks + 15) / 16), (uint32_t)((a->n_q + 15) / 16), (uint32_t)a->batch};
    if ((a->n_blocks + 15) / 16 > lim[0] || (a->n_q + 15) / 16 > lim[1] || a->batch > lim[2])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "aabb_score: %zu x %zu x %zu exceeds this device's dispatch limits",
                           a->n_q, a->n_blocks, a->batch);
    uint32_t push[15] = {(uint32_t)a->n_q,   (uint32_t)a->n_blocks, (uint32_t)a->dim,     (uint32_t)a->batch,
                         (uint32_t)a->s_div, (uint32_t)(a->q_off / 4), (uint32_t)a->q_bs, (uint32_t)a->q_rs,
                         (uint32_t)(a->s_off / 4), (uint32_t)a->s_bs, (uint32_t)a->s_rs, (uint32_t)(a->out_off / 4),
                         (uint32_t)a->o_bs, (uint32_t)a->o_rs, 0u /* f32 boxes */};
    const kvmem_buffer *bufs[4] = {a->q, a->s_min, a->s_max, a->out};
    return kvm_vk_run(v, "aabb_score", KVM_VK_AABB_SCORE, bufs, 4, push, sizeof push, 0, g);
}

static size_t vk_size(const kvmem_buffer *b) { return b->size; }

/* Buffers bound whole must fit the device's storage buffer range. */
static kvmem_status check_bind(kvm_vk *v, const char *op, const kvmem_buffer *const *bufs, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (bufs[i]->cap > v->props.limits.maxStorageBufferRange)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                               "vulkan %s: a buffer of %llu bytes exceeds this device's storage buffer range (%u)", op,
                               (unsigned long long)bufs[i]->cap, v->props.limits.maxStorageBufferRange);
    return KVMEM_OK;
}

/* dev_gather_rope: the gather_rope shader. */
kvmem_status kvm_vk_dev_gather_rope(kvmem_backend *be, const kvm_dev_gather_args *a) {
    kvm_vk *v = impl(be);
    char msg[256];
    kvmem_status st = kvm_dev_gather_check(a, vk_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_vk_fail(v, st, "%s", msg);
    size_t row = a->n_heads * a->head_dim, se, oe; /* products checked above */
    const size_t sesz = a->src_dtype == KVMEM_F16 ? 2 : 4; /* src offsets and strides in its elements */
    if (!extent(&se, a->src_off / sesz, a->n_src, a->src_rs, 1, 0, row) ||
        !extent(&oe, a->out_off / 4, a->n_out, row, 1, 0, row) || se > UINT32_MAX ||
        oe > UINT32_MAX - ((size_t)1 << 20) /* grid-stride loop headroom */ || a->idx_off / 4 + a->n_out > UINT32_MAX ||
        a->cs_off / 4 + a->n_out * a->rotary_dim > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_gather_rope: sizes exceed the shaders' 32-bit indices");
    float af = a->attn_factor;
    uint32_t afb;
    memcpy(&afb, &af, 4);
    uint32_t push[13] = {(uint32_t)a->n_out,  (uint32_t)a->n_heads, (uint32_t)a->head_dim, (uint32_t)a->rotary_dim,
                         (uint32_t)a->gptj,   afb,                   (uint32_t)(a->src_off / sesz), (uint32_t)a->src_rs,
                         (uint32_t)(a->out_off / 4), (uint32_t)a->n_src, (uint32_t)(a->idx_off / 4),
                         (uint32_t)(a->cs_off / 4), a->src_dtype == KVMEM_F16};
    /* rotary_dim 0 reads no cos/sin: any buffer fills the binding */
    const kvmem_buffer *bufs[4] = {a->src, a->idx, a->rotary_dim ? a->cs : a->src, a->out};
    return kvm_vk_run(v, "dev_gather_rope", KVM_VK_GATHER_ROPE, bufs, 4, push, sizeof push, (uint64_t)a->n_out * row,
                      NULL);
}

/* ---- dev_score: aabb_score into a scratch buffer, then score_reduce ---- */

/* Scratch per chunk of query tokens: scores [L*Hq][tokens][n_blocks] and
 * softmax stats [rows][2], at most this many bytes (or the device's storage
 * buffer range) unless one token needs more. KVMEM_VULKAN_SCORE_SCRATCH_BYTES
 * lowers it (tests use it to reach several chunks and submissions). */
#define DEV_SCORE_SCRATCH_BYTES ((size_t)64 << 20)

static size_t score_scratch_bytes(void) {
    const char *e = getenv("KVMEM_VULKAN_SCORE_SCRATCH_BYTES");
    char *end = NULL;
    unsigned long long x = e ? strtoull(e, &end, 10) : 0;
    return e && end && *end == 0 && x > 0 && x < DEV_SCORE_SCRATCH_BYTES ? (size_t)x : DEV_SCORE_SCRATCH_BYTES;
}

/* Descriptor sets per submission (vk_device.c's pool) / sets per chunk (the
 * GEMM's, score_reduce's). */
#define DEV_SCORE_CHUNKS_PER_SUBMIT 5
#define EXACT_LAYERS_PER_SUBMIT 8 /* exact_score.comp's sets (3 buffers each) */

/* Loop iterations of score_reduce.comp per invocation, each loop at its
 * largest trip count plus one for the exit test: phase 0 per row (the row
 * loop, two passes over the row's 128-block tiles, two workgroup
 * reductions); phase 2 per 128-block tile of a rank range (the tile loop,
 * 128 comparisons); phase 1 per token (the aggregation loop). */
static uint64_t score_row_iters(uint64_t jt, uint64_t wg_red) { return 1 + 2 * (jt + 1) + 2 * wg_red + 4; }
#define SCORE_RANK_TILE_ITERS (2u + KVM_VK_WG)
#define SCORE_ITEM_FIXED 4u /* per work item of phases 1 and 2, outside their loops */

kvmem_status kvm_vk_dev_score(kvmem_backend *be, const kvm_dev_score_args *a) {
    kvm_vk *v = impl(be);
    char msg[256];
    kvmem_status st = kvm_dev_score_check(a, vk_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_vk_fail(v, st, "%s", msg);
    const size_t L = (size_t)a->n_layers, Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads;
    const size_t D = (size_t)a->head_dim, NB = (size_t)a->n_blocks, NQ = (size_t)a->n_q, batch = L * Hq;
    const int rr = a->norm == KVMEM_NORM_RR, exact = a->mode == KVMEM_RETRIEVE_EXACT;
    if (exact && !a->key_rows)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_score: vulkan reads EXACT's keys from key_rows only");
    /* element extents (their byte sizes were checked against the buffers) */
    const int half = a->box_layout == KVM_BOXES_SPLIT_F16;
    const size_t s_el = a->s_off / (half ? 2 : 4); /* the boxes' offset in their elements */
    const size_t box_el = exact ? a->s_off / (a->key_f16 ? 2 : 4) + NB * (size_t)a->block_rows * Hkv * D
                                : s_el + NB * L * Hkv * D;
    if (a->q_off / 4 + NQ * batch * D > UINT32_MAX || box_el > UINT32_MAX || a->out_off / 4 + batch * NB > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_score: sizes exceed the shaders' 32-bit indices");
    const kvmem_buffer *in[4] = {a->q, exact ? a->q : a->s_min, exact ? a->q : a->s_max, a->out};
    if ((st = check_bind(v, "dev_score", in, 4)) != KVMEM_OK) return st;
    for (size_t l = 0; exact && l < L; l++)
        if ((st = check_bind(v, "dev_score", &a->key_rows[l], 1)) != KVMEM_OK) return st;
    /* EXACT: rows of a block per dispatch of exact_score.comp (D + 1
     * iterations each, and the row loop's) */
    const uint64_t exact_rows = KVM_MAX((uint64_t)1, (kvm_vk_loop_budget() - 2) / (D + 2));
    size_t cap = KVM_MIN(score_scratch_bytes(), (size_t)v->props.limits.maxStorageBufferRange);
    /* scratch per token: scores [batch][NB], stats [batch][2], RR ranks [batch][NB] */
    size_t per_tok, t;
    if (!kvm_mul_size(batch, (rr ? 2 * NB : NB) + 2, &t) || !kvm_mul_size(t, 4, &per_tok) ||
        per_tok > (size_t)v->props.limits.maxStorageBufferRange || t > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_score: %zu blocks x %zu query-head slices exceed this device's storage buffer range (%u bytes)",
                           NB, batch, v->props.limits.maxStorageBufferRange);
    const uint32_t *lim = v->props.limits.maxComputeWorkGroupCount;
    const uint64_t lim_x = KVM_MIN(lim[0], 65535u), jt = (NB + KVM_VK_WG - 1) / KVM_VK_WG;
    /* the loop budget bounds the rows of a chunk: phase 0 takes
     * ceil(rows / lim_x) rows per workgroup, phase 2 ceil(rows jt / lim_x)
     * (row, tile) items, each counting at least one tile per dispatch.
     * Only the full budget can refuse (a lowered one is a test's). */
    const uint32_t budget = kvm_vk_loop_budget();
    const uint64_t wg_red = v->subgroup_ops ? KVM_VK_WG / v->subgroup_size + 1 : 8;
    const uint64_t item_iters = rr ? SCORE_ITEM_FIXED + SCORE_RANK_TILE_ITERS : score_row_iters(jt, wg_red);
    const uint64_t per_group = KVM_MAX((uint64_t)1, (budget - 1) / item_iters);
    const uint64_t rows_max = rr ? per_group * lim_x / jt : per_group * lim_x;
    if ((KVM_VK_LOOP_BUDGET - 1) / item_iters == 0 || batch > KVM_MAX(rows_max, (uint64_t)1))
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_score: %zu blocks x %zu query-head slices exceed what vulkan dispatches may loop over",
                           NB, batch);
    size_t tn = KVM_MAX((size_t)1, KVM_MIN(NQ, cap / per_tok));
    tn = KVM_MAX((size_t)1, KVM_MIN(tn, (size_t)(rows_max / batch)));
    if ((NB + 15) / 16 > lim[0] || (tn + 15) / 16 > lim[1] || batch > lim[2])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_score: %zu tokens x %zu blocks x %zu slices exceed this device's dispatch limits",
                           tn, NB, batch);
    /* phase 1: tokens per dispatch */
    const uint64_t g1 = KVM_MIN(batch * jt, lim_x), per_g1 = (batch * jt + g1 - 1) / g1;
    const uint64_t nt1 = budget / per_g1 > SCORE_ITEM_FIXED + 1 ? budget / per_g1 - SCORE_ITEM_FIXED : 1;
    kvmem_buffer *scratch = NULL;
    if ((st = kvm_vk_buffer_create(v, tn * per_tok, 1, &scratch)) != KVMEM_OK) return st;
    const kvm_vk_kernel reduce = v->subgroup_ops ? KVM_VK_SCORE_REDUCE_SG : KVM_VK_SCORE_REDUCE;
    float tau = a->tau, rr_c = a->rr_c;
    uint32_t taub, rrb;
    memcpy(&taub, &tau, 4);
    memcpy(&rrb, &rr_c, 4);
    VkResult r = VK_SUCCESS;
    double seconds = 0;
    int timed = 1;
    pthread_mutex_lock(&v->mu);
    for (size_t t0 = 0; t0 < NQ && r == VK_SUCCESS;) {
        /* EXACT: the relevance of the next chunk's tokens, layer by layer
         * (a set per layer: EXACT_LAYERS_PER_SUBMIT sets to a submission) */
        for (size_t l0 = 0; exact && l0 < L && r == VK_SUCCESS; l0 += EXACT_LAYERS_PER_SUBMIT) {
            if ((r = kvm_vk_begin(v)) != VK_SUCCESS) break;
            const size_t tc = KVM_MIN(tn, NQ - t0), items = Hq * tc * NB;
            const uint64_t per = (uint64_t)lim_x * KVM_VK_WG;
            for (size_t l = l0; l < KVM_MIN(L, l0 + EXACT_LAYERS_PER_SUBMIT) && r == VK_SUCCESS; l++) {
                const kvmem_buffer *eb[3] = {a->q, a->key_rows[l], scratch};
                uint32_t ep[16] = {(uint32_t)tc, (uint32_t)NB, (uint32_t)D, (uint32_t)Hq, (uint32_t)(Hq / Hkv),
                                   (uint32_t)Hkv, (uint32_t)(a->q_off / 4 + t0 * batch * D), (uint32_t)(batch * D),
                                   (uint32_t)(a->s_off / (a->key_f16 ? 2 : 4)), (uint32_t)a->block_rows,
                                   (uint32_t)a->key_f16, (uint32_t)l, (uint32_t)(tc * NB), 0u, 0u, 0u};
                r = kvm_vk_bind(v, KVM_VK_EXACT_SCORE, eb, 3, sizeof ep);
                for (uint64_t r0 = 0; r == VK_SUCCESS && r0 < (uint64_t)a->block_rows; r0 += exact_rows)
                    for (uint64_t i0 = 0; r == VK_SUCCESS && i0 < items; i0 += per) {
                        const uint64_t n = KVM_MIN(per, items - i0);
                        ep[13] = (uint32_t)i0;
                        ep[14] = (uint32_t)r0;
                        ep[15] = (uint32_t)KVM_MIN((uint64_t)a->block_rows, r0 + exact_rows);
                        r = kvm_vk_dispatch(v, KVM_VK_EXACT_SCORE, ep, sizeof ep,
                                            (uint32_t)((n + KVM_VK_WG - 1) / KVM_VK_WG), 1, 1);
                    }
            }
            if (r != VK_SUCCESS) {
                v->vk.vkEndCommandBuffer(v->cmd);
            } else if ((r = kvm_vk_submit_wait(v, 1)) == VK_SUCCESS) {
                if (v->last_op_seconds >= 0) seconds += v->last_op_seconds;
                else timed = 0;
            }
        }
        if (r != VK_SUCCESS || (r = kvm_vk_begin(v)) != VK_SUCCESS) break;
        for (int c = 0; c < (exact ? 1 : DEV_SCORE_CHUNKS_PER_SUBMIT) && t0 < NQ && r == VK_SUCCESS; c++) {
            const size_t tc = KVM_MIN(tn, NQ - t0), rows = batch * tc;
            uint32_t gemm[15] = {(uint32_t)tc, (uint32_t)NB, (uint32_t)D, (uint32_t)batch, (uint32_t)(Hq / Hkv),
                                 (uint32_t)(a->q_off / 4 + t0 * batch * D), (uint32_t)D, (uint32_t)(batch * D),
                                 (uint32_t)s_el, (uint32_t)D, (uint32_t)(L * Hkv * D), 0u,
                                 (uint32_t)(tc * NB), (uint32_t)NB, (uint32_t)half};
            const kvmem_buffer *gb[4] = {a->q, a->s_min, a->s_max, scratch};
            if (!exact)
                r = kvm_vk_record_dispatch3(v, KVM_VK_AABB_SCORE, gb, 4, gemm, sizeof gemm, (uint32_t)((NB + 15) / 16),
                                        (uint32_t)((tc + 15) / 16), (uint32_t)batch);
            uint32_t red[16] = {0u, (uint32_t)NB, (uint32_t)batch, (uint32_t)tc, (uint32_t)rr,
                                a->agg == KVMEM_AGG_SUM, taub, rrb, (uint32_t)(a->out_off / 4), 0u,
                                (uint32_t)(rows * NB), 0u, 0u, 0u, 0u, (uint32_t)(rows * NB + 2 * rows)};
            const kvmem_buffer *rb[2] = {scratch, a->out};
            if (r == VK_SUCCESS) r = kvm_vk_bind(v, reduce, rb, 2, sizeof red);
            if (r == VK_SUCCESS && !rr)
                r = kvm_vk_dispatch(v, reduce, red, sizeof red, (uint32_t)KVM_MIN(rows, lim_x), 1, 1);
            if (rr) { /* ranks over ranges of blocks */
                const uint64_t g2 = KVM_MIN(rows * jt, lim_x), per_g2 = (rows * jt + g2 - 1) / g2;
                const uint64_t room = (budget - 1) / per_g2;
                const uint64_t tiles = room > SCORE_ITEM_FIXED + SCORE_RANK_TILE_ITERS
                                           ? (room - SCORE_ITEM_FIXED) / SCORE_RANK_TILE_ITERS
                                           : 1;
                red[0] = 2u;
                for (uint64_t i0 = 0; r == VK_SUCCESS && i0 < NB; i0 += tiles * KVM_VK_WG) {
                    red[13] = (uint32_t)i0;
                    red[14] = (uint32_t)KVM_MIN((uint64_t)NB, i0 + tiles * KVM_VK_WG);
                    r = kvm_vk_dispatch(v, reduce, red, sizeof red, (uint32_t)g2, 1, 1);
                }
            }
            red[0] = 1u;
            for (uint64_t u0 = 0; r == VK_SUCCESS && u0 < tc; u0 += nt1) {
                red[9] = t0 == 0 && u0 == 0;
                red[11] = (uint32_t)u0;
                red[12] = (uint32_t)KVM_MIN((uint64_t)tc, u0 + nt1);
                r = kvm_vk_dispatch(v, reduce, red, sizeof red, (uint32_t)g1, 1, 1);
            }
            t0 += tc;
        }
        if (r == VK_SUCCESS) {
            if ((r = kvm_vk_submit_wait(v, 1)) == VK_SUCCESS) {
                if (v->last_op_seconds >= 0) seconds += v->last_op_seconds;
                else timed = 0;
            }
        } else {
            v->vk.vkEndCommandBuffer(v->cmd);
        }
    }
    if (r == VK_SUCCESS) v->last_op_seconds = timed ? seconds : -1;
    kvm_vk_buffer_destroy(v, scratch);
    pthread_mutex_unlock(&v->mu);
    return r == VK_SUCCESS ? KVMEM_OK : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_score failed (%s)", kvm_vk_result_str(r));
}

/* ---- dev_score_reduce: per-set sums (shaders/score_sets.comp) ---- */

/* Loop iterations of score_sets.comp per invocation outside the per-layer
 * loop (its exit test, the rest), and per layer (the head loop and its exit
 * test, plus one for the layer loop's). */
#define SETS_FIXED 4u

kvmem_status kvm_vk_dev_score_reduce(kvmem_backend *be, const kvm_dev_score_reduce_args *a) {
    kvm_vk *v = impl(be);
    char msg[256];
    kvmem_status st = kvm_dev_score_reduce_check(a, vk_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_vk_fail(v, st, "%s", msg);
    const uint64_t L = (uint64_t)a->n_layers, Hn = (uint64_t)a->n_heads, n = (uint64_t)a->n;
    const uint64_t items = (uint64_t)a->n_sets * n, per = L / (uint64_t)a->n_sets;
    if (a->in_off / 4 + L * Hn * n > UINT32_MAX || a->out_off / 4 + items > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_score_reduce: sizes exceed the shaders' 32-bit indices");
    const kvmem_buffer *bufs[2] = {a->in, a->out};
    if ((st = check_bind(v, "dev_score_reduce", bufs, 2)) != KVMEM_OK) return st;
    /* a dispatch adds whole layers (the contract's order needs each layer's
     * sum in one register): as many as the loop budget allows, at least
     * one; only the full budget refuses (a lowered one is a test's) */
    if (SETS_FIXED + Hn + 2 > KVM_VK_LOOP_BUDGET)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                           "dev_score_reduce: %d heads per layer exceed what a vulkan invocation may loop over",
                           a->n_heads);
    const uint32_t budget = kvm_vk_loop_budget();
    const uint64_t layers = budget > SETS_FIXED + Hn + 2 ? (budget - SETS_FIXED) / (Hn + 2) : 1;
    const uint64_t max_groups = KVM_MIN((uint64_t)v->props.limits.maxComputeWorkGroupCount[0], (uint64_t)65535);
    const uint64_t range = max_groups * KVM_VK_WG; /* items per dispatch, one per invocation */
    uint32_t push[9] = {(uint32_t)n,   (uint32_t)items, (uint32_t)per, (uint32_t)Hn, (uint32_t)(a->in_off / 4),
                        (uint32_t)(a->out_off / 4), 0, 0, 0};
    pthread_mutex_lock(&v->mu);
    VkResult r = kvm_vk_begin(v);
    if (r == VK_SUCCESS) r = kvm_vk_bind(v, KVM_VK_SCORE_SETS, bufs, 2, sizeof push);
    for (uint64_t u0 = 0; r == VK_SUCCESS && u0 < per; u0 += layers)
        for (uint64_t i0 = 0; r == VK_SUCCESS && i0 < items; i0 += range) {
            push[6] = (uint32_t)u0;
            push[7] = (uint32_t)KVM_MIN(per, u0 + layers);
            push[8] = (uint32_t)i0;
            const uint64_t groups = (KVM_MIN(range, items - i0) + KVM_VK_WG - 1) / KVM_VK_WG;
            r = kvm_vk_dispatch(v, KVM_VK_SCORE_SETS, push, sizeof push, (uint32_t)groups, 1, 1);
        }
    if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    else v->vk.vkEndCommandBuffer(v->cmd);
    pthread_mutex_unlock(&v->mu);
    return r == VK_SUCCESS ? KVMEM_OK
                           : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_score_reduce failed (%s)", kvm_vk_result_str(r));
}

/* ---- dev_topk: radix select and compaction (shaders/topk.comp) ---- */

enum { TOPK_INIT, TOPK_HIST, TOPK_SELECT, TOPK_COUNT, TOPK_SCAN, TOPK_WRITE };
#define TOPK_STATE_WORDS (8u + 256u) /* then 2 words per chunk */
#define TOPK_CHUNK 1024u

kvmem_status kvm_vk_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a) {
    kvm_vk *v = impl(be);
    char msg[256];
    kvmem_status st = kvm_dev_topk_check(a, vk_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_vk_fail(v, st, "%s", msg);
    if (a->n == 0 || a->k == 0) {
        *a->n_out = 0;
        return KVMEM_OK;
    }
    const size_t n = (size_t)a->n, k = (size_t)a->k;
    if (a->scores_off / 4 + n > UINT32_MAX || a->idx_off / 4 + KVM_MIN(k, n) > UINT32_MAX)
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "dev_topk: sizes exceed the shaders' 32-bit indices");
    const kvmem_buffer *in[2] = {a->scores, a->idx};
    if ((st = check_bind(v, "dev_topk", in, 2)) != KVMEM_OK) return st;
    const uint32_t n_chunks = (uint32_t)((n + TOPK_CHUNK - 1) / TOPK_CHUNK);
    kvmem_buffer *state = NULL;
    if ((st = kvm_vk_buffer_create(v, ((size_t)TOPK_STATE_WORDS + 2 * (size_t)n_chunks) * 4, 1, &state)) != KVMEM_OK)
        return st;
    const uint32_t chunk_groups = KVM_MIN(n_chunks, KVM_MIN(v->props.limits.maxComputeWorkGroupCount[0], 65535u));
    const kvmem_buffer *bufs[3] = {a->scores, state, a->idx};
    uint32_t push[7] = {0, 0, (uint32_t)n, (uint32_t)k, (uint32_t)(a->scores_off / 4), (uint32_t)(a->idx_off / 4),
                        n_chunks};
    uint32_t res[5] = {0};
    pthread_mutex_lock(&v->mu);
    VkResult r = kvm_vk_begin(v);
#define TOPK_STEP(ph, rnd, ...)                                                                    \
    do {                                                                                           \
        push[0] = (ph);                                                                            \
        push[1] = (rnd);                                                                           \
        if (r == VK_SUCCESS) r = __VA_ARGS__;                                                      \
    } while (0)
    TOPK_STEP(TOPK_INIT, 0, kvm_vk_record_dispatch3(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, 1, 1, 1));
    for (uint32_t rd = 0; rd < 4; rd++) {
        TOPK_STEP(TOPK_HIST, rd, kvm_vk_record_dispatch(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, n));
        TOPK_STEP(TOPK_SELECT, rd, kvm_vk_record_dispatch3(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, 1, 1, 1));
    }
    TOPK_STEP(TOPK_COUNT, 0, kvm_vk_record_dispatch3(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, chunk_groups, 1, 1));
    TOPK_STEP(TOPK_SCAN, 0, kvm_vk_record_dispatch3(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, 1, 1, 1));
    TOPK_STEP(TOPK_WRITE, 0, kvm_vk_record_dispatch3(v, KVM_VK_TOPK, bufs, 3, push, sizeof push, chunk_groups, 1, 1));
#undef TOPK_STEP
    if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    else v->vk.vkEndCommandBuffer(v->cmd);
    if (r == VK_SUCCESS) st = kvm_vk_download(v, state, 0, res, sizeof res);
    kvm_vk_buffer_destroy(v, state);
    pthread_mutex_unlock(&v->mu);
    if (r != VK_SUCCESS)
        return kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_topk failed (%s)", kvm_vk_result_str(r));
    if (st != KVMEM_OK) return st;
    /* res: prefix, rem, non-NaN total, take_all, selected */
    if (res[4] != KVM_MIN(k, (size_t)res[2]))
        return kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan dev_topk: selected %u of min(k %zu, %u non-NaN): a device fault",
                           res[4], k, res[2]);
    *a->n_out = (int32_t)res[4];
    return KVMEM_OK;
}

void *kvm_vk_retrieval_proc(const char *name) {
    void *p = NULL;
    if (strcmp(name, KVM_VK_PROC_AABB_SCORE) == 0) {
        kvm_vk_aabb_score_fn f = vk_aabb_score;
        memcpy(&p, &f, sizeof p);
    }
    return p;
}

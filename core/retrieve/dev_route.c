/* Retrieval on a device backend (the router's choice: core/backend/route):
 * dev_score / dev_gather_rope read the agent's
 * blocks from its device-resident mirror (core/pool/resident.h), so a call
 * uploads only its query (scoring) or its slot list and cos/sin (gather) and
 * reads back the per-set block scores (dev_score_reduce sums them on the
 * device) or the gathered rows. Where the mirror cannot serve (blocks not
 * contiguous) the host packs the blocks into transient buffers; candidates
 * that are not one run of blocks are gathered from the mirror on the device. A device failure returns its status with the
 * backend's message (the router's policy: only KVMEM_ERR_UNSUPPORTED goes on
 * to the CPU). */
#include "score.h"
#include "../backend/route/route.h"
#include "../backend/route/devtensor.h"
#include "../pool/resident.h"
#include "../cpu/tensor.h"
#include "../rope/rope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Candidates that are not one run of blocks (an exclude list, a window
 * with holes): their boxes are gathered on the device from the mirror into
 * the work arrays mn / mx (f32 split), one plain dev_gather_rope per run of
 * consecutive blocks reading ids from the mirror's slot map (0, 1, 2, ...),
 * so nothing goes up; past KVM_MAX_RUNS runs the candidate ids go up once
 * (4 bytes a block) and one gather per array reads them. */
#define KVM_MAX_RUNS 64
static kvmem_status gather_boxes(kvmem_backend *be, const kvm_score_desc *d, const kvm_resident *res,
                                 kvmem_buffer *mn, kvmem_buffer *mx) {
    const kvmem_pool *p = d->pool;
    const size_t row = (size_t)p->spec.n_layers * p->row_elems, D = (size_t)p->spec.head_dim;
    int32_t runs = 1;
    for (int32_t j = 1; j < d->n_cand; j++) runs += d->cand[j] != d->cand[j - 1] + 1;
    kvm_dev_gather_args a = {res->smax, res->ident, NULL, mx, 0, 0, 0, 0, (size_t)res->cap_blocks, row, 0, row / D, D,
                             0, 0, 1.0f, NULL, NULL, 0, 0, 0, res->box_dtype};
    kvmem_status st = KVMEM_OK;
    if (runs > KVM_MAX_RUNS) {
        kvm_stage ids = {KVM_STAGE_IN, (void *)(uintptr_t)d->cand, (size_t)d->n_cand * 4, NULL, NULL, {0, NULL}};
        if ((st = kvm_stage_begin(be, "kvmem_retrieve", &ids, 1)) != KVMEM_OK) return st;
        a.idx = ids.buf;
        a.n_out = (size_t)d->n_cand;
        for (int x = 0; x < 2 && st == KVMEM_OK; x++) {
            a.src = x ? res->smin : res->smax;
            a.out = x ? mn : mx;
            st = be->iface->dev_gather_rope(be, &a);
        }
        return kvm_stage_end(be, "kvmem_retrieve", &ids, 1, st);
    }
    for (int32_t j0 = 0, j = 1; j <= d->n_cand && st == KVMEM_OK; j++) {
        if (j < d->n_cand && d->cand[j] == d->cand[j - 1] + 1) continue;
        a.idx_off = (size_t)d->cand[j0] * 4;
        a.out_off = (size_t)j0 * row * 4;
        a.n_out = (size_t)(j - j0);
        for (int x = 0; x < 2 && st == KVMEM_OK; x++) {
            a.src = x ? res->smin : res->smax;
            a.out = x ? mn : mx;
            st = be->iface->dev_gather_rope(be, &a);
        }
        j0 = j;
    }
    return st;
}

kvmem_status kvm_dev_aabb_score(kvmem_backend *be, const kvm_score_desc *d) {
    static const char *op = "kvmem_retrieve";
    const kvmem_pool *p = d->pool;
    const size_t L = (size_t)p->spec.n_layers, Hq = (size_t)p->spec.n_q_heads, H = (size_t)p->spec.n_kv_heads;
    const size_t D = (size_t)p->spec.head_dim, nc = (size_t)d->n_cand, nq = (size_t)d->n_q, ns = (size_t)d->n_sets;
    if (nc == 0 || nq == 0) return KVMEM_OK;
    size_t qb, sb, ob;
    if (!kvm_mul_size(nq * L * Hq, D * 4, &qb) || !kvm_mul_size(nc * L * H, D * 4, &sb) ||
        !kvm_mul_size(L * Hq, nc * 4, &ob) || nc > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: problem too large for backend %s", op, be->iface->name);
    /* resident AABBs: read in place for candidates that are one run of
     * blocks (the default: every sealed block, or a recency window), else
     * gathered on the device from the mirror (gather_boxes) */
    kvm_resident *res = NULL;
    kvmem_status st = kvm_resident_sync(p, (kvm_agent_mem *)(uintptr_t)d->mem /* a cache: the agent is taken */, be, &res);
    if (st == KVMEM_ERR_UNSUPPORTED) st = KVMEM_OK;
    if (st != KVMEM_OK) return st;
    if (res && d->cand[nc - 1] >= res->n_blocks) res = NULL; /* not resident (cannot happen: sealed blocks only) */
    const int run = d->cand[nc - 1] - d->cand[0] + 1 == (int32_t)nc;
    const int in_place = res && run, gathered = res && !run;
    /* EXACT reads the candidates' raw keys where the mirror holds them:
     * one run of full blocks, so block j's rows are block_size rows on from
     * the first candidate's; anything else is the CPU's (it reads the host) */
    const int exact = d->mode == KVMEM_RETRIEVE_EXACT;
    const int32_t bs = p->params.block_size;
    if (exact && !in_place) return KVMEM_ERR_UNSUPPORTED;
    for (size_t j = 0; exact && j < nc; j++)
        if (d->mem->blocks[d->cand[j]].n_tokens != bs) return KVMEM_ERR_UNSUPPORTED;
    float *mn = res ? NULL : kvm_malloc(sb), *mx = res ? NULL : kvm_malloc(sb);
    if (!res && (!mn || !mx)) {
        kvm_free(mn);
        kvm_free(mx);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %zu candidate AABBs", op, nc);
    }
    /* The agent keeps [block][layer][KV head][s_max; s_min]; the kernel
     * takes s_min and s_max as two [block][layer][KV head][head_dim] arrays. */
    float box[4 * KVM_ROPE_MAX_PAIRS];
    for (size_t j = 0; !res && j < nc; j++)
        for (size_t l = 0; l < L; l++)
            for (size_t g = 0; g < H; g++) {
                kvm_block_aabb_f32(p, d->mem, d->cand[j], (int32_t)l, (int32_t)g, box);
                memcpy(mx + ((j * L + l) * H + g) * D, box, D * sizeof(float));
                memcpy(mn + ((j * L + l) * H + g) * D, box + D, D * sizeof(float));
            }
    /* [layer][query head][cand] summed on the device into [set][cand]: the
     * only bytes that come back are the scores the result holds */
    const kvm_stage_dir box_dir = gathered ? KVM_STAGE_WORK : KVM_STAGE_IN;
    kvm_stage s[5] = {{KVM_STAGE_IN, (void *)(uintptr_t)d->q, qb, NULL, NULL, {0, NULL}},
                      {box_dir, mn, sb, in_place ? res->smin : NULL, NULL, {0, NULL}},
                      {box_dir, mx, sb, in_place ? res->smax : NULL, NULL, {0, NULL}},
                      {KVM_STAGE_WORK, NULL, ob, NULL, NULL, {0, NULL}},
                      {KVM_STAGE_OUT, d->out, ns * nc * 4, NULL, NULL, {0, NULL}}};
    st = kvm_stage_begin(be, op, s, 5);
    if (st == KVMEM_OK) {
        const int half = in_place && res->box_dtype == KVMEM_F16;
        const size_t s_off = in_place ? (size_t)d->cand[0] * L * H * D * (half ? 2 : 4) : 0;
        kvm_dev_score_args a = {s[0].buf,         s[1].buf,         s[2].buf,          s[3].buf, 0, s_off, 0,
                                d->n_q,           (int32_t)nc,      p->spec.n_layers,  p->spec.n_q_heads,
                                p->spec.n_kv_heads, p->spec.head_dim, d->norm,          d->agg,   d->tau,
                                d->rr_c,          0,                half ? KVM_BOXES_SPLIT_F16 : KVM_BOXES_SPLIT_F32,
                                NULL,             KVMEM_RETRIEVE_AABB, NULL, NULL, 0, 0};
        if (exact) { /* the raw keys of every layer (the mirror's dtype), rows from the first candidate's first token */
            a.mode = KVMEM_RETRIEVE_EXACT;
            a.key_rows = (const kvmem_buffer *const *)res->k;
            a.block_rows = bs;
            a.key_f16 = res->dtype == KVMEM_F16;
            a.s_off = (size_t)d->mem->blocks[d->cand[0]].first_token * H * D * (a.key_f16 ? 2 : 4);
        }
        kvm_dev_score_reduce_args ra = {s[3].buf, s[4].buf, 0, 0, p->spec.n_layers, p->spec.n_q_heads, (int32_t)nc,
                                        d->n_sets};
        if ((gathered && (st = gather_boxes(be, d, res, s[1].buf, s[2].buf)) != KVMEM_OK) ||
            (st = be->iface->dev_score(be, &a)) != KVMEM_OK || (st = be->iface->dev_score_reduce(be, &ra)) != KVMEM_OK)
            st = kvm_route_failed(be, op, st);
        st = kvm_stage_end(be, op, s, 5, st);
    }
    kvm_free(mn);
    kvm_free(mx);
    return st;
}

kvmem_status kvm_dev_gather(kvmem_backend *be, const kvm_gather_desc *d) {
    static const char *op = "kvmem_gather";
    const kvmem_pool *p = d->pool;
    const size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    const size_t M = (size_t)d->first[d->n_blocks], np = (size_t)p->rope.n_pairs, row = H * D;
    if (M == 0) return KVMEM_OK;
    size_t lb;
    if (!kvm_mul_size(M, row * sizeof(float), &lb))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %zu rows too large for backend %s", op, M, be->iface->name);
    /* Outputs in the device's memory as f32 rows of [n_kv_heads][head_dim]
     * are written in place (kvmem.h, "Device tensors"); the others' results
     * of every layer are held until all succeeded: a failed call leaves the
     * caller's host tensors unchanged. */
    int64_t lstride[2] = {0, 0};
    const int direct[2] = {d->k_dev && d->k_out && kvm_devt_rows_dense(d->k_dev, KVMEM_F32, &lstride[0]),
                           d->v_dev && d->v_out && kvm_devt_rows_dense(d->v_dev, KVMEM_F32, &lstride[1])};
    const size_t n_outs = (d->k_out != NULL && !direct[0]) + (d->v_out != NULL && !direct[1]);
    size_t rb;
    if (!kvm_mul_size(lb, L * n_outs, &rb))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %zu rows too large for backend %s", op, M, be->iface->name);
    /* resident K/V: the kernel reads the blocks' slots in place; else the
     * rows are staged in output order and gathered by the identity */
    kvm_resident *mir = NULL;
    kvmem_status st = kvm_resident_sync(p, (kvm_agent_mem *)(uintptr_t)d->mem /* a cache: the agent is taken */, be, &mir);
    if (st == KVMEM_ERR_UNSUPPORTED) st = KVMEM_OK;
    if (st != KVMEM_OK) return st;
    float *stage = mir ? NULL : kvm_malloc(lb), *res = kvm_malloc(rb ? rb : 4);
    float *tmp = mir ? NULL : kvm_malloc((size_t)p->params.block_size * D * sizeof(float));
    float *cs = d->k_out ? kvm_malloc(2 * M * np * sizeof(float)) : NULL;
    uint32_t *idx = kvm_malloc(M * sizeof *idx);
    if ((!mir && (!stage || !tmp)) || !res || !idx || (d->k_out && !cs)) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %zu rows", op, M);
        goto done;
    }
    for (int32_t i = 0; i < d->n_blocks; i++) {
        const kvm_block *blk = &d->mem->blocks[d->blocks[i]];
        for (int32_t r = 0; r < blk->n_tokens; r++)
            idx[d->first[i] + r] = mir ? (uint32_t)(blk->first_token + r) : (uint32_t)(d->first[i] + r);
    }
    if (cs) {
        float c[KVM_ROPE_MAX_PAIRS], sn[KVM_ROPE_MAX_PAIRS];
        for (size_t i = 0; i < M; i++) {
            kvm_rope_cos_sin(&p->rope, (double)(d->base + (int64_t)i), c, sn);
            memcpy(cs + i * np, c, np * sizeof(float));
            memcpy(cs + (M + i) * np, sn, np * sizeof(float));
        }
    }
    /* the rows of a layer go up (or are resident) and come back one layer
     * at a time through src and out */
    kvm_stage s[4] = {{KVM_STAGE_IN, idx, M * 4, NULL, NULL, {0, NULL}},
                      {cs ? KVM_STAGE_IN : KVM_STAGE_WORK, cs, cs ? 2 * M * np * 4 : 4, NULL, NULL, {0, NULL}},
                      {KVM_STAGE_WORK, NULL, mir ? 4 : lb, NULL, NULL, {0, NULL}},
                      {KVM_STAGE_WORK, NULL, n_outs ? lb : 4, NULL, NULL, {0, NULL}}};
    if ((st = kvm_stage_begin(be, op, s, 4)) != KVMEM_OK) goto done;
    for (size_t l = 0; l < L && st == KVMEM_OK; l++)
        for (int which = 0; which < 2 && st == KVMEM_OK; which++) {
            const kvmem_tensor *t = which ? d->v_out : d->k_out;
            if (!t) continue;
            float *dst = res + ((which && d->k_out && !direct[0] ? L : 0) + l) * M * row;
            kvm_devt *dt = which ? d->v_dev : d->k_dev;
            for (int32_t i = 0; !mir && i < d->n_blocks; i++) {
                const kvm_block *blk = &d->mem->blocks[d->blocks[i]];
                const size_t n = (size_t)blk->n_tokens, r0 = (size_t)d->first[i];
                for (size_t h = 0; h < H; h++) {
                    kvm_block_read_f32(p, blk, which, (int32_t)l, (int32_t)h, 0, blk->n_tokens, tmp);
                    for (size_t r = 0; r < n; r++) memcpy(stage + ((r0 + r) * H + h) * D, tmp + r * D, D * sizeof(float));
                }
            }
            const kvmem_buffer *src = mir ? (which ? mir->v[l] : mir->k[l]) : s[2].buf;
            kvm_dev_gather_args a = {src, s[0].buf, which ? NULL : s[1].buf, s[3].buf, 0, 0, 0, 0,
                                     mir ? (size_t)mir->cap_tok : M, row, M, H, D,
                                     which ? 0 : (size_t)p->rope.rotary_dim, p->rope.style == KVMEM_ROPE_GPTJ,
                                     which ? 1.0f : (float)p->rope.attn_factor, NULL, NULL, 0, 0, 0,
                                     mir ? mir->dtype : KVMEM_F32};
            if (direct[which]) {
                a.out = dt->buf;
                a.out_off = dt->off + (size_t)l * (size_t)lstride[which] * sizeof(float);
            }
            if ((!mir && (st = kvm_be_upload(be, s[2].buf, 0, stage, lb)) != KVMEM_OK) ||
                (st = be->iface->dev_gather_rope(be, &a)) != KVMEM_OK ||
                (!direct[which] && (st = kvm_be_download(be, s[3].buf, 0, dst, lb)) != KVMEM_OK))
                st = kvm_route_failed(be, op, st);
        }
    st = kvm_stage_end(be, op, s, 4, st);
    for (size_t l = 0; st == KVMEM_OK && l < L; l++) {
        if (d->k_out && !direct[0]) kvm_gather_write_layer(d->k_out, (int64_t)l, res + l * M * row, M, H, D);
        if (d->v_out && !direct[1])
            kvm_gather_write_layer(d->v_out, (int64_t)l, res + ((d->k_out && !direct[0] ? L : 0) + l) * M * row, M, H, D);
    }
    if (st == KVMEM_OK)
        for (int x = 0; x < 2; x++)
            if (direct[x]) (x ? d->v_dev : d->k_dev)->in_place = 1;
done:
    kvm_free(stage);
    kvm_free(res);
    kvm_free(tmp);
    kvm_free(cs);
    kvm_free(idx);
    return st;
}

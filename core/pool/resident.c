/* The device-resident mirror of an agent's sealed blocks (resident.h). */
#include "resident.h"
#include "mapped.h"

#include <stdio.h>
#include <string.h>

kvmem_backend *kvm_resident_backend(const kvmem_pool *p) {
    kvmem_backend *be = p->ctx->backend;
    if (!be || be == p->ctx->cpu || !be->iface->dev_score || !be->iface->dev_gather_rope) return NULL;
    return be;
}

static void free_bufs(kvm_resident *r) {
    kvmem_backend *be = r->be;
    kvmem_buffer *one[4] = {r->smax, r->smin, r->ident, r->recent};
    for (int i = 0; i < 4; i++)
        if (one[i]) be->iface->buffer_free(be, one[i]);
    for (int32_t l = 0; l < r->n_layers; l++) {
        if (r->k && r->k[l]) be->iface->buffer_free(be, r->k[l]);
        if (r->v && r->v[l]) be->iface->buffer_free(be, r->v[l]);
        if (r->krot && r->krot[l]) be->iface->buffer_free(be, r->krot[l]);
    }
    kvm_free(r->k);
    kvm_free(r->v);
    kvm_free(r->krot);
    kvm_free(r->rot_n);
    kvm_free(r->rot_base);
}

void kvm_resident_drop(kvm_agent_mem *m) {
    if (!m->res) return;
    free_bufs(m->res);
    kvm_free(m->res);
    m->res = NULL;
}

/* Prefix the backend's message with what the mirror was doing. */
static kvmem_status dev_failed(kvmem_backend *be, const char *what, kvmem_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvmem_last_error());
    return kvm_fail(st, "resident blocks on backend %s: %s: %s", be->iface->name, what, msg);
}

/* A fresh, empty mirror with room for cap_blocks blocks and cap_tok slots. */
static kvmem_status create(const kvmem_pool *p, kvmem_backend *be, int32_t cap_blocks, int64_t cap_tok,
                           kvm_resident **out) {
    const size_t L = (size_t)p->spec.n_layers, row = p->row_elems;
    kvm_resident *r = kvm_calloc(1, sizeof *r);
    if (!r) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror");
    r->be = be;
    r->n_layers = (int32_t)L;
    r->cap_blocks = cap_blocks;
    r->cap_tok = cap_tok;
    r->k = kvm_calloc(L, sizeof *r->k);
    r->v = kvm_calloc(L, sizeof *r->v);
    r->krot = kvm_calloc(L, sizeof *r->krot);
    r->rot_n = kvm_calloc(L, sizeof *r->rot_n);
    r->rot_base = kvm_calloc(L, sizeof *r->rot_base);
    uint32_t *ident = kvm_malloc((size_t)cap_tok * sizeof *ident);
    kvmem_status st = KVMEM_OK;
    if (!r->k || !r->v || !r->krot || !r->rot_n || !r->rot_base || !ident) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror's tables of %zu layers", L);
        goto fail;
    }
    size_t ab, kb;
    if (!kvm_mul_size((size_t)cap_blocks, L * row * sizeof(float), &ab) ||
        !kvm_mul_size((size_t)cap_tok, row * sizeof(float), &kb)) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror of %lld tokens on backend %s (size overflows)",
                      (long long)cap_tok, be->iface->name);
        goto fail;
    }
    const kvmem_backend_iface *f = be->iface;
    if ((st = f->buffer_alloc(be, ab, &r->smax)) != KVMEM_OK || (st = f->buffer_alloc(be, ab, &r->smin)) != KVMEM_OK ||
        (st = f->buffer_alloc(be, (size_t)cap_tok * 4, &r->ident)) != KVMEM_OK) {
        st = dev_failed(be, "allocating the AABB buffers", st);
        goto fail;
    }
    for (size_t l = 0; l < L; l++)
        if ((st = f->buffer_alloc(be, kb, &r->k[l])) != KVMEM_OK || (st = f->buffer_alloc(be, kb, &r->v[l])) != KVMEM_OK ||
            (st = f->buffer_alloc(be, kb, &r->krot[l])) != KVMEM_OK) {
            st = dev_failed(be, "allocating the K/V buffers", st);
            goto fail;
        }
    for (int64_t i = 0; i < cap_tok; i++) ident[i] = (uint32_t)i;
    if ((st = kvm_be_upload(be, r->ident, 0, ident, (size_t)cap_tok * 4)) != KVMEM_OK) {
        st = dev_failed(be, "uploading the slot map", st);
        goto fail;
    }
    kvm_free(ident);
    *out = r;
    return KVMEM_OK;
fail:
    kvm_free(ident);
    free_bufs(r);
    kvm_free(r);
    return st;
}

/* Upload sealed block j (AABBs of every layer and KV head, K and V rows of
 * every layer) into its slots. */
static kvmem_status upload_block(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t j, float *stage,
                                 float *tmp) {
    kvmem_backend *be = r->be;
    const size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    const kvm_block *blk = &m->blocks[j];
    const size_t n = (size_t)blk->n_tokens, row = H * D;
    kvmem_status st;
    /* AABBs: the pool keeps [L][H][s_max; s_min]; the kernel takes two arrays */
    float *mx = stage, *mn = stage + L * row;
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < H; h++) {
            kvm_block_aabb_f32(p, m, j, (int32_t)l, (int32_t)h, tmp);
            memcpy(mx + (l * H + h) * D, tmp, D * sizeof(float));
            memcpy(mn + (l * H + h) * D, tmp + D, D * sizeof(float));
        }
    const size_t aoff = (size_t)j * L * row * sizeof(float);
    if ((st = kvm_be_upload(be, r->smax, aoff, mx, L * row * sizeof(float))) != KVMEM_OK ||
        (st = kvm_be_upload(be, r->smin, aoff, mn, L * row * sizeof(float))) != KVMEM_OK)
        return dev_failed(be, "uploading AABBs", st);
    /* K and V: the block is head-major, the buffers token-major */
    const size_t koff = (size_t)blk->first_token * row * sizeof(float);
    for (size_t l = 0; l < L; l++)
        for (int which = 0; which < 2; which++) {
            for (size_t h = 0; h < H; h++) {
                kvm_block_read_f32(p, blk, which, (int32_t)l, (int32_t)h, 0, blk->n_tokens, tmp);
                for (size_t t = 0; t < n; t++) memcpy(stage + (t * H + h) * D, tmp + t * D, D * sizeof(float));
            }
            if ((st = kvm_be_upload(be, which ? r->v[l] : r->k[l], koff, stage, n * row * sizeof(float))) != KVMEM_OK)
                return dev_failed(be, "uploading K/V rows", st);
        }
    /* a mapped agent's rows come from its file: a failed read left zeros,
     * which must not become resident (the block is not counted then) */
    return kvm_mapped_check(m, KVMEM_OK, "device upload of a mapped agent's block");
}

kvmem_status kvm_resident_sync(const kvmem_pool *p, kvm_agent_mem *m, kvmem_backend *be, kvm_resident **out) {
    *out = NULL;
    /* the pool moved to another context, or blocks went away without a drop */
    if (m->res && (m->res->be != be || m->res->n_blocks > m->n_sealed)) kvm_resident_drop(m);
    const int64_t sealed_tok = m->n_tokens - m->tail_n;
    {
        int64_t t = 0;
        for (int32_t j = m->res ? m->res->n_blocks : 0; j < m->n_sealed; j++) {
            if (j == 0) t = 0;
            else t = m->blocks[j - 1].first_token + m->blocks[j - 1].n_tokens;
            if (m->blocks[j].first_token != t) return KVMEM_ERR_UNSUPPORTED;
        }
    }
    const int32_t BS = p->params.block_size;
    const int64_t need_tok = sealed_tok + BS; /* the tail's slots too */
    if (m->res && (m->n_sealed > m->res->cap_blocks || need_tok > m->res->cap_tok)) kvm_resident_drop(m);
    if (!m->res) {
        size_t cb, ct;
        if (!kvm_grow_cap(0, (size_t)m->n_sealed, 64, INT32_MAX, 1, &cb) ||
            !kvm_grow_cap(0, (size_t)need_tok, 64 * (size_t)BS, INT32_MAX, 1, &ct))
            return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror of %lld tokens (beyond 2^31 slots)",
                            (long long)need_tok);
        /* room to grow: doubling keeps the re-uploads amortised */
        cb = KVM_MAX(cb, 2 * (size_t)m->n_sealed);
        ct = KVM_MAX(ct, 2 * (size_t)need_tok);
        kvmem_status st = create(p, be, (int32_t)KVM_MIN(cb, (size_t)INT32_MAX), (int64_t)KVM_MIN(ct, (size_t)INT32_MAX),
                                 &m->res);
        if (st != KVMEM_OK) return st;
    }
    kvm_resident *r = m->res;
    if (r->n_blocks < m->n_sealed) {
        const size_t L = (size_t)p->spec.n_layers, row = p->row_elems, D = (size_t)p->spec.head_dim;
        float *stage = kvm_malloc(KVM_MAX((size_t)BS, 2 * L) * row * sizeof(float));
        float *tmp = kvm_malloc(KVM_MAX((size_t)BS, (size_t)2) * D * sizeof(float));
        kvmem_status st = KVMEM_OK;
        if (!stage || !tmp)
            st = kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for staging one block");
        while (st == KVMEM_OK && r->n_blocks < m->n_sealed) {
            st = upload_block(p, m, r, r->n_blocks, stage, tmp);
            if (st == KVMEM_OK) r->n_tok += m->blocks[r->n_blocks++].n_tokens;
        }
        kvm_free(stage);
        kvm_free(tmp);
        if (st != KVMEM_OK) return st;
    }
    *out = r;
    return KVMEM_OK;
}

/* Rotate slots [s0, s0 + n) of k[l] into krot[l] at positions base + slot
 * (dev_gather_rope over the identity slot list; only cos/sin go up). */
static kvmem_status rotate(const kvmem_pool *p, kvm_resident *r, int32_t l, int64_t base, int64_t s0, int64_t n) {
    if (n <= 0) return KVMEM_OK;
    kvmem_backend *be = r->be;
    const size_t np = (size_t)p->rope.n_pairs, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    float *cs = np ? kvm_malloc(2 * (size_t)n * np * sizeof(float)) : NULL;
    if (np && !cs) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for %lld positions' cos/sin", (long long)n);
    kvmem_buffer *bcs = NULL;
    kvmem_status st = KVMEM_OK;
    if (np) {
        float c[KVM_ROPE_MAX_PAIRS], s[KVM_ROPE_MAX_PAIRS];
        for (int64_t i = 0; i < n; i++) {
            kvm_rope_cos_sin(&p->rope, (double)(base + s0 + i), c, s);
            memcpy(cs + (size_t)i * np, c, np * sizeof(float));
            memcpy(cs + ((size_t)n + (size_t)i) * np, s, np * sizeof(float));
        }
        if ((st = be->iface->buffer_alloc(be, 2 * (size_t)n * np * 4, &bcs)) != KVMEM_OK ||
            (st = kvm_be_upload(be, bcs, 0, cs, 2 * (size_t)n * np * 4)) != KVMEM_OK)
            st = dev_failed(be, "uploading cos/sin", st);
    }
    if (st == KVMEM_OK) {
        kvm_dev_gather_args a = {r->k[l], r->ident, bcs, r->krot[l], 0, (size_t)s0 * 4, 0, (size_t)s0 * H * D * 4,
                                 (size_t)r->cap_tok, H * D, (size_t)n, H, D, (size_t)p->rope.rotary_dim,
                                 p->rope.style == KVMEM_ROPE_GPTJ, (float)p->rope.attn_factor, NULL, NULL, 0, 0, 0};
        if ((st = be->iface->dev_gather_rope(be, &a)) != KVMEM_OK) st = dev_failed(be, "rotating keys", st);
    }
    if (bcs) be->iface->buffer_free(be, bcs);
    kvm_free(cs);
    return st;
}

kvmem_status kvm_resident_attend_keys(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t l,
                                      int64_t base) {
    kvmem_status st;
    if (r->rot_base[l] != base || r->rot_n[l] > r->n_tok) {
        r->rot_base[l] = base;
        r->rot_n[l] = 0;
    }
    if ((st = rotate(p, r, l, base, r->rot_n[l], r->n_tok - r->rot_n[l])) != KVMEM_OK) return st;
    r->rot_n[l] = r->n_tok;
    if (m->tail_n == 0) return KVMEM_OK;
    /* the tail: its f32 rows are head-major [H][BS][D]; the slots token-major */
    const size_t H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim, n = (size_t)m->tail_n;
    float *stage = kvm_malloc(n * H * D * sizeof(float));
    if (!stage) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the unsealed tail's rows");
    st = KVMEM_OK;
    for (int which = 0; which < 2 && st == KVMEM_OK; which++) {
        for (size_t h = 0; h < H; h++) {
            const float *src = kvm_tail_rows(p, m, which, l, (int32_t)h);
            for (size_t t = 0; t < n; t++) memcpy(stage + (t * H + h) * D, src + t * D, D * sizeof(float));
        }
        if ((st = kvm_be_upload(r->be, which ? r->v[l] : r->k[l], (size_t)r->n_tok * H * D * 4, stage,
                                n * H * D * sizeof(float))) != KVMEM_OK)
            st = dev_failed(r->be, "uploading the unsealed tail", st);
    }
    kvm_free(stage);
    if (st == KVMEM_OK) st = rotate(p, r, l, base, r->n_tok, (int64_t)n);
    return st;
}

/* Upload the values a RECENT buffer of recent_cap ids holds at [at, at + n)
 * when unpatched: recent_cap - 1 - i at i. */
static kvmem_status put_descending(kvm_resident *r, int32_t at, int32_t n) {
    if (n <= 0) return KVMEM_OK;
    int32_t *v = kvm_malloc((size_t)n * sizeof *v);
    if (!v) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for %d tile ids", n);
    for (int32_t i = 0; i < n; i++) v[i] = r->recent_cap - 1 - (at + i);
    kvmem_status st = kvm_be_upload(r->be, r->recent, (size_t)at * 4, v, (size_t)n * 4);
    kvm_free(v);
    return st == KVMEM_OK ? KVMEM_OK : dev_failed(r->be, "uploading the RECENT tile order", st);
}

kvmem_status kvm_resident_recent_order(const kvmem_pool *p, kvm_resident *r, int32_t n_tiles, int32_t n_sink,
                                       const kvmem_buffer **buf, size_t *off) {
    kvmem_status st;
    if (!r->recent) { /* room for any n_tiles + n_sink of this mirror */
        const int64_t cap = 2 * (r->cap_tok / p->params.block_size + 2);
        if (cap > INT32_MAX) return KVMEM_ERR_UNSUPPORTED;
        if ((st = r->be->iface->buffer_alloc(r->be, (size_t)cap * 4, &r->recent)) != KVMEM_OK)
            return dev_failed(r->be, "allocating the RECENT tile order", st);
        r->recent_cap = (int32_t)cap;
        r->recent_at = 0;
        r->recent_s = 0;
        if ((st = put_descending(r, 0, r->recent_cap)) != KVMEM_OK) {
            r->be->iface->buffer_free(r->be, r->recent);
            r->recent = NULL;
            return st;
        }
    }
    if (n_sink < 0 || n_sink >= n_tiles || n_tiles + n_sink > r->recent_cap) return KVMEM_ERR_UNSUPPORTED;
    const int32_t at = r->recent_cap - n_tiles - n_sink; /* the newest tile's id sits at at + n_sink */
    if (at != r->recent_at || n_sink != r->recent_s) {
        /* put the last sinks' slots back, then write these sinks; a failure
         * leaves the patch unknown: none is recorded, the next call starts over */
        const int32_t old_at = r->recent_at, old_s = r->recent_s;
        r->recent_s = -1;
        if (old_s < 0) {
            if ((st = put_descending(r, 0, r->recent_cap)) != KVMEM_OK) return st;
        } else if ((st = put_descending(r, old_at, old_s)) != KVMEM_OK) {
            return st;
        }
        if (n_sink > 0) {
            int32_t *v = kvm_malloc((size_t)n_sink * sizeof *v);
            if (!v) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for %d tile ids", n_sink);
            for (int32_t i = 0; i < n_sink; i++) v[i] = i;
            st = kvm_be_upload(r->be, r->recent, (size_t)at * 4, v, (size_t)n_sink * 4);
            kvm_free(v);
            if (st != KVMEM_OK) return dev_failed(r->be, "uploading the RECENT tile order", st);
        }
        r->recent_at = at;
        r->recent_s = n_sink;
    }
    *buf = r->recent;
    *off = (size_t)at * 4;
    return KVMEM_OK;
}

/* The device-resident mirror of an agent's sealed blocks (resident.h). */
#include "resident.h"
#include "mapped.h"
#include "../cpu/half.h"

#include <stdio.h>
#include <string.h>

kvmem_backend *kvm_resident_backend(const kvmem_pool *p) {
    kvmem_backend *be = p->ctx->backend;
    if (!be || be == p->ctx->cpu || !be->iface->dev_score || !be->iface->dev_gather_rope) return NULL;
    return be;
}

static void free_bufs(kvm_resident *r) {
    kvmem_backend *be = r->be;
    kvmem_buffer *one[7] = {r->smax, r->smin, r->ident, r->recent, r->tk, r->tv, r->cs};
    for (int i = 0; i < 7; i++)
        if (one[i]) be->iface->buffer_free(be, one[i]);
    for (int32_t l = 0; l < r->n_layers; l++) {
        if (r->k && r->k[l]) be->iface->buffer_free(be, r->k[l]);
        if (r->v && r->v[l]) be->iface->buffer_free(be, r->v[l]);
    }
    kvm_free(r->k);
    kvm_free(r->v);
}

void kvm_resident_drop(kvm_agent_mem *m) {
    if (!m->res) return;
    if (m->res->pool) atomic_fetch_sub(&m->res->pool->dev_bytes, m->res->bytes);
    free_bufs(m->res);
    kvm_free(m->res);
    m->res = NULL;
}

void kvm_resident_truncate(kvm_agent_mem *m, int32_t keep_blocks) {
    kvm_resident *r = m->res;
    if (!r || keep_blocks >= r->n_blocks) return;
    r->n_blocks = keep_blocks < 0 ? 0 : keep_blocks;
    r->n_tok = r->n_blocks ? m->blocks[r->n_blocks - 1].first_token + m->blocks[r->n_blocks - 1].n_tokens : 0;
}

/* Prefix the backend's message with what the mirror was doing. */
static kvmem_status dev_failed(kvmem_backend *be, const char *what, kvmem_status st) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvmem_last_error());
    return kvm_fail(st, "resident blocks on backend %s: %s: %s", be->iface->name, what, msg);
}

/* The mirror's element types for p (resident.h): the host's own bits where
 * f16 holds them exactly. f16 rows start at even elements (head_dim even)
 * so every offset the kernels take is a whole 4-byte word. */
static kvmem_dtype kv_dtype(const kvmem_pool *p) {
    return p->params.storage_dtype == KVMEM_F16 && p->row_elems % 2 == 0 ? KVMEM_F16 : KVMEM_F32;
}
static kvmem_dtype box_dtype(const kvmem_pool *p) {
    return kvm_aabb_esize(p) == 2 && p->row_elems % 2 == 0 ? KVMEM_F16 : KVMEM_F32;
}

/* Room for `bytes` more device bytes in p's mirrors (counted when it says 1):
 * within device_capacity_bytes after evicting closed agents' mirrors, least
 * recently used first. self (whose mirror this is for) is never evicted;
 * neither is an open agent's, which a call on another thread may be reading. */
static int admit(kvmem_pool *p, const kvm_agent_mem *self, uint64_t bytes) {
    const uint64_t cap = p->params.device_capacity_bytes;
    if (!cap) {
        atomic_fetch_add(&p->dev_bytes, bytes);
        return 1;
    }
    if (bytes > cap) return 0;
    int ok = 0;
    pthread_mutex_lock(&p->mu); /* closed agents change only under it; admissions are serialised */
    for (;;) {
        const uint64_t used = atomic_load(&p->dev_bytes);
        if (used <= cap && bytes <= cap - used) {
            atomic_fetch_add(&p->dev_bytes, bytes);
            ok = 1;
            break;
        }
        kvm_agent_mem *lru = NULL;
        for (int32_t i = 0; i < p->n_agents; i++) {
            kvm_agent_mem *a = p->agents[i];
            /* handle first: an open agent's res is its own thread's to change; a spilling one's is its spill's */
            if (a != self && !a->handle && !a->spilling && a->res && (!lru || a->lru_tick < lru->lru_tick)) lru = a;
        }
        if (!lru) break;
        kvm_resident_drop(lru);
        atomic_fetch_add(&p->dev_evictions, 1);
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

static kvmem_status alloc(kvm_resident *r, size_t bytes, kvmem_buffer **out) {
    kvmem_status st = r->be->iface->buffer_alloc(r->be, bytes, out);
    if (st == KVMEM_OK) r->bytes += bytes;
    return st;
}

/* A fresh, empty mirror of m with room for cap_blocks blocks and cap_tok
 * slots; KVMEM_ERR_UNSUPPORTED (no message) when it does not fit the
 * pool's device capacity. */
static kvmem_status create(const kvmem_pool *p, const kvm_agent_mem *m, kvmem_backend *be, int32_t cap_blocks,
                           int64_t cap_tok, kvm_resident **out) {
    const size_t L = (size_t)p->spec.n_layers, row = p->row_elems, BS = (size_t)p->params.block_size;
    const size_t rot = (size_t)p->rope.rotary_dim;
    kvmem_pool *pool = (kvmem_pool *)(uintptr_t)p; /* its mirror accounting only */
    size_t want = 0;
    kvm_resident *r = kvm_calloc(1, sizeof *r);
    if (!r) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror");
    r->be = be;
    r->dtype = kv_dtype(p);
    r->box_dtype = box_dtype(p);
    r->n_layers = (int32_t)L;
    r->cap_blocks = cap_blocks;
    r->cap_tok = cap_tok;
    r->k = kvm_calloc(L, sizeof *r->k);
    r->v = kvm_calloc(L, sizeof *r->v);
    uint32_t *ident = kvm_malloc((size_t)cap_tok * sizeof *ident);
    kvmem_status st = KVMEM_OK;
    if (!r->k || !r->v || !ident) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror's tables of %zu layers", L);
        goto fail;
    }
    size_t ab, kb, cb, kv;
    const size_t small = (size_t)cap_tok * 4 + 2 * BS * row * sizeof(float); /* ident, tk, tv */
    if (!kvm_mul_size((size_t)cap_blocks, L * row * kvm_dtype_size(r->box_dtype), &ab) ||
        !kvm_mul_size((size_t)cap_tok, row * kvm_dtype_size(r->dtype), &kb) ||
        !kvm_mul_size((size_t)cap_tok + 1, rot * sizeof(float), &cb) || !kvm_mul_size(2 * L, kb, &kv) ||
        !kvm_add_size(kv, 2 * ab, &want) || !kvm_add_size(want, small + (rot ? cb : 0), &want)) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for the mirror of %lld tokens on backend %s (size overflows)",
                      (long long)cap_tok, be->iface->name);
        goto fail;
    }
    /* the buffers below, counted against the pool's device capacity first */
    if (!admit(pool, m, want)) {
        st = KVMEM_ERR_UNSUPPORTED;
        goto fail;
    }
    r->pool = pool;
    if ((st = alloc(r, ab, &r->smax)) != KVMEM_OK || (st = alloc(r, ab, &r->smin)) != KVMEM_OK ||
        (st = alloc(r, (size_t)cap_tok * 4, &r->ident)) != KVMEM_OK ||
        (st = alloc(r, BS * row * sizeof(float), &r->tk)) != KVMEM_OK ||
        (st = alloc(r, BS * row * sizeof(float), &r->tv)) != KVMEM_OK || (rot && (st = alloc(r, cb, &r->cs)) != KVMEM_OK)) {
        st = dev_failed(be, "allocating the AABB, tail and RoPE buffers", st);
        goto fail;
    }
    for (size_t l = 0; l < L; l++)
        if ((st = alloc(r, kb, &r->k[l])) != KVMEM_OK || (st = alloc(r, kb, &r->v[l])) != KVMEM_OK) {
            st = dev_failed(be, "allocating the K/V buffers", st);
            goto fail;
        }
    for (int64_t i = 0; i < cap_tok; i++) ident[i] = (uint32_t)i;
    if ((st = kvm_be_upload(be, r->ident, 0, ident, (size_t)cap_tok * 4)) != KVMEM_OK) {
        st = dev_failed(be, "uploading the slot map", st);
        goto fail;
    }
    kvm_free(ident);
    if (r->bytes != want) /* the count admitted is the buffers' bytes, kept exact */
        atomic_fetch_add(&pool->dev_bytes, (uint64_t)r->bytes - (uint64_t)want);
    *out = r;
    return KVMEM_OK;
fail:
    if (r->pool) atomic_fetch_sub(&r->pool->dev_bytes, want);
    kvm_free(ident);
    free_bufs(r);
    kvm_free(r);
    return st;
}

/* n f32 values as dt (F32: as they are; F16: exact for values that came
 * from f16) at dst. */
static void put_elems(kvmem_dtype dt, void *dst, size_t at, const float *src, size_t n) {
    if (dt == KVMEM_F32) {
        memcpy((float *)dst + at, src, n * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)dst + at;
    for (size_t i = 0; i < n; i++) o[i] = kvm_f32_to_f16(src[i]);
}

/* Upload sealed block j (AABBs of every layer and KV head, K and V rows of
 * every layer) into its slots. */
static kvmem_status upload_block(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t j, void *stage,
                                 float *tmp) {
    kvmem_backend *be = r->be;
    const size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    const kvm_block *blk = &m->blocks[j];
    const size_t n = (size_t)blk->n_tokens, row = H * D, bes = kvm_dtype_size(r->box_dtype);
    const size_t es = kvm_dtype_size(r->dtype);
    kvmem_status st;
    /* AABBs: the pool keeps [L][H][s_max; s_min]; the kernel takes two arrays */
    const size_t half = L * row; /* s_min's elements start there */
    for (size_t l = 0; l < L; l++)
        for (size_t h = 0; h < H; h++) {
            kvm_block_aabb_f32(p, m, j, (int32_t)l, (int32_t)h, tmp);
            put_elems(r->box_dtype, stage, (l * H + h) * D, tmp, D);
            put_elems(r->box_dtype, stage, half + (l * H + h) * D, tmp + D, D);
        }
    const size_t aoff = (size_t)j * L * row * bes;
    if ((st = kvm_be_upload(be, r->smax, aoff, stage, L * row * bes)) != KVMEM_OK ||
        (st = kvm_be_upload(be, r->smin, aoff, (unsigned char *)stage + half * bes, L * row * bes)) != KVMEM_OK)
        return dev_failed(be, "uploading AABBs", st);
    /* K and V: the block is head-major, the buffers token-major */
    const size_t koff = (size_t)blk->first_token * row * es;
    for (size_t l = 0; l < L; l++)
        for (int which = 0; which < 2; which++) {
            for (size_t h = 0; h < H; h++) {
                kvm_block_read_f32(p, blk, which, (int32_t)l, (int32_t)h, 0, blk->n_tokens, tmp);
                for (size_t t = 0; t < n; t++) put_elems(r->dtype, stage, (t * H + h) * D, tmp + t * D, D);
            }
            if ((st = kvm_be_upload(be, which ? r->v[l] : r->k[l], koff, stage, n * row * es)) != KVMEM_OK)
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
        kvmem_status st = create(p, m, be, (int32_t)KVM_MIN(cb, (size_t)INT32_MAX),
                                 (int64_t)KVM_MIN(ct, (size_t)INT32_MAX), &m->res);
        /* short of device capacity: the exact size, without room to grow */
        if (st == KVMEM_ERR_UNSUPPORTED) st = create(p, m, be, KVM_MAX(m->n_sealed, 1), need_tok, &m->res);
        if (st == KVMEM_ERR_UNSUPPORTED) /* served from the host copy this call */
            atomic_fetch_add(&((kvmem_pool *)(uintptr_t)p)->dev_unmirrored, 1);
        if (st != KVMEM_OK) return st;
    }
    kvm_resident *r = m->res;
    if (r->n_blocks < m->n_sealed) {
        const size_t L = (size_t)p->spec.n_layers, row = p->row_elems, D = (size_t)p->spec.head_dim;
        void *stage = kvm_malloc(KVM_MAX((size_t)BS, 2 * L) * row * sizeof(float));
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

/* Upload cos/sin rows [row0, row0 + n) of the RoPE table: row 0 for
 * position `base`, row 1 + i for position i (resident.h). */
static kvmem_status put_cs(const kvmem_pool *p, kvm_resident *r, int64_t row0, int64_t n, int64_t base) {
    const size_t np = (size_t)p->rope.n_pairs, rot = 2 * np;
    float *cs = kvm_malloc((size_t)n * rot * sizeof(float));
    if (!cs) return kvm_fail(KVMEM_ERR_NOMEM, "resident blocks: out of memory for %lld positions' cos/sin", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const int64_t row = row0 + i;
        kvm_rope_cos_sin(&p->rope, (double)(row == 0 ? base : row - 1), cs + (size_t)i * rot, cs + (size_t)i * rot + np);
    }
    kvmem_status st = kvm_be_upload(r->be, r->cs, (size_t)row0 * rot * sizeof(float), cs, (size_t)n * rot * sizeof(float));
    kvm_free(cs);
    return st == KVMEM_OK ? KVMEM_OK : dev_failed(r->be, "uploading cos/sin", st);
}

kvmem_status kvm_resident_attend_keys(const kvmem_pool *p, const kvm_agent_mem *m, kvm_resident *r, int32_t l,
                                      int64_t base) {
    kvmem_status st;
    const int64_t n_pos = r->n_tok + m->tail_n;
    if (r->cs) {
        if (!r->cs_base_ok || r->cs_base != base) {
            r->cs_base_ok = 0;
            if ((st = put_cs(p, r, 0, 1, base)) != KVMEM_OK) return st;
            r->cs_base = base;
            r->cs_base_ok = 1;
        }
        if (r->cs_n < n_pos) {
            if ((st = put_cs(p, r, 1 + r->cs_n, n_pos - r->cs_n, 0)) != KVMEM_OK) return st;
            r->cs_n = n_pos;
        }
    }
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
        if ((st = kvm_be_upload(r->be, which ? r->tv : r->tk, 0, stage, n * H * D * sizeof(float))) != KVMEM_OK)
            st = dev_failed(r->be, "uploading the unsealed tail", st);
    }
    kvm_free(stage);
    return st;
}

void kvm_resident_attend_args(const kvmem_pool *p, const kvm_agent_mem *m, const kvm_resident *r, int32_t l,
                              kvm_dev_attend_args *a) {
    a->k = r->k[l];
    a->v = r->v[l];
    a->dtype = r->dtype;
    a->slot_map = r->ident; /* position p is slot p */
    a->n_slots = r->n_tok + m->tail_n;
    a->k_tail = r->tk;
    a->v_tail = r->tv;
    a->tail_off = 0;
    a->tail_slot = r->n_tok;
    a->rope_cs = r->cs;
    a->rope_off = 0;
    a->rotary_dim = r->cs ? p->rope.rotary_dim : 0;
    a->gptj = p->rope.style == KVMEM_ROPE_GPTJ;
    a->attn_factor = (float)p->rope.attn_factor;
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
        /* past the device capacity the caller uploads its order per call */
        if (!r->pool || !admit(r->pool, NULL, (uint64_t)cap * 4)) return KVMEM_ERR_UNSUPPORTED;
        if ((st = alloc(r, (size_t)cap * 4, &r->recent)) != KVMEM_OK) {
            atomic_fetch_sub(&r->pool->dev_bytes, (uint64_t)cap * 4);
            return dev_failed(r->be, "allocating the RECENT tile order", st);
        }
        r->recent_cap = (int32_t)cap;
        r->recent_at = 0;
        r->recent_s = 0;
        if ((st = put_descending(r, 0, r->recent_cap)) != KVMEM_OK) {
            r->be->iface->buffer_free(r->be, r->recent);
            r->recent = NULL;
            r->bytes -= (size_t)cap * 4;
            atomic_fetch_sub(&r->pool->dev_bytes, (uint64_t)cap * 4);
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

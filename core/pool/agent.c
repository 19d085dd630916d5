/* Agents: appending KV (de-rotating post-RoPE keys), sealing blocks with
 * their AABB, and reading memory back. */
#include "pool.h"
#include "mapped.h"
#include "resident.h"
#include "../backend/route/devtensor.h"
#include "../cpu/kernels.h"
#include "../cpu/tensor.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kvmem_status kvmem_append_params_init(kvmem_append_params *params, size_t struct_size) {
    kvmem_append_params p;
    memset(&p, 0, sizeof p);
    return KVM_PARAMS_INIT(kvmem_append_params, params, struct_size, &p, "kvmem_append_params_init");
}

/* Largest magnitude the storage dtype holds without turning into Inf. */
static float storage_limit(kvmem_dtype dt) {
    switch (dt) {
    case KVMEM_F16: return 65504.0f;
    case KVMEM_BF16: return 3.3895313e38f; /* largest finite bf16 */
    case KVMEM_Q8:
    case KVMEM_Q4:
    case KVMEM_Q4_KIVI: return KVM_QUANT_LIMIT; /* scales and biases are f16 */
    default: return FLT_MAX;
    }
}

typedef struct append_job {
    const kvmem_pool *p;
    const kvmem_tensor *k, *v;
    int64_t t0;          /* first token (of the input) in this chunk */
    int32_t n;           /* tokens in this chunk */
    const float *cs;     /* [n][2][n_pairs] cos then sin, or NULL for raw keys */
    float *tail;         /* staging; rows written at slot tail_at */
    int32_t tail_at;
    /* validation results, one slot per layer */
    int32_t *bad_layer_token; /* -1 = ok, else the token (input index) */
    int32_t *bad_is_v;
    float *bad_value;
    float limit;
    int write; /* 0: validate only, 1: write to staging */
} append_job;

static void append_task(void *arg, size_t lb, size_t le) {
    append_job *j = arg;
    const kvmem_pool *p = j->p;
    const int32_t H = p->spec.n_kv_heads, D = p->spec.head_dim, BS = p->params.block_size;
    const int32_t np = p->rope.n_pairs;
    const size_t L = (size_t)p->spec.n_layers;
    float row[1024];
    for (size_t l = lb; l < le; l++) {
        j->bad_layer_token[l] = -1;
        for (int32_t tt = 0; tt < j->n && j->bad_layer_token[l] < 0; tt++) {
            int64_t t = j->t0 + tt;
            for (int32_t which = 0; which < 2; which++) {
                const kvmem_tensor *src = which ? j->v : j->k;
                for (int32_t h = 0; h < H; h++) {
                    int64_t idx[3] = {(int64_t)l, t, h};
                    kvm_tensor_read_f32(src, kvm_tensor_row_offset(src, idx), row, (size_t)D);
                    if (!which && j->cs)
                        kvm_rope_rotate(&p->rope, row, j->cs + (size_t)tt * 2 * np,
                                        j->cs + (size_t)tt * 2 * np + np, 1);
                    if (!j->write) {
                        for (int32_t d = 0; d < D; d++) {
                            if (!(fabsf(row[d]) <= j->limit)) { /* also catches NaN */
                                j->bad_layer_token[l] = (int32_t)t;
                                j->bad_is_v[l] = which;
                                j->bad_value[l] = row[d];
                                break;
                            }
                        }
                        continue;
                    }
                    float *dst = j->tail + ((((size_t)which * L + l) * (size_t)H + (size_t)h) * (size_t)BS +
                                            (size_t)(j->tail_at + tt)) * (size_t)D;
                    memcpy(dst, row, (size_t)D * sizeof(float));
                }
            }
        }
    }
}

typedef struct seal_job {
    const kvmem_pool *p;
    const float *tail;
    int32_t n;   /* rows to seal */
    void *kv;    /* destination block storage [2][L][H][n][D] */
    void *aabb;  /* [L][H][2][D] in the pool's AABB element type */
} seal_job;

static void seal_task(void *arg, size_t b, size_t e) {
    seal_job *j = arg;
    const kvmem_pool *p = j->p;
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    const size_t L = (size_t)p->spec.n_layers, H = (size_t)p->spec.n_kv_heads, D = (size_t)p->spec.head_dim;
    const size_t BS = (size_t)p->params.block_size, n = (size_t)j->n;
    const kvmem_dtype dt = p->params.storage_dtype;
    const size_t kb = kvm_block_section_bytes(p, 0, j->n), vb = kvm_block_section_bytes(p, 1, j->n);
    const kvm_qblock qb = kvm_block_qlayout(p, j->n);
    float f32box[2 * 2 * KVM_ROPE_MAX_PAIRS]; /* head_dim <= 2 * KVM_ROPE_MAX_PAIRS (pool_create) */
    for (size_t g = b; g < e; g++) { /* g = (which * L + l) * H + h */
        const float *rows = j->tail + g * BS * D;
        float *box = NULL;
        if (g < L * H) { /* keys: the AABB from the unquantized rows, exact in f32 for KIVI's scales */
            box = f32box;
            k->minmax_rows(rows, n, D, D, box + D, box);
            kvm_aabb_store(p, box, (unsigned char *)j->aabb + g * 2 * D * kvm_aabb_esize(p));
        }
        int which = g >= L * H;
        size_t off = which ? L * H * kb + (g - L * H) * vb : g * kb;
        if (kvm_is_quant_dtype(dt))
            kvm_quant_parts(dt, which, rows, n, D, box ? box + D : NULL, box,
                            kvm_qblock_parts(&qb, j->kv, which, which ? g - L * H : g));
        else
            kvm_convert_host((unsigned char *)j->kv + off, dt, rows, KVMEM_F32, n * D);
    }
}

/* Seal the first n rows of the tail into a new block. kv and aabb are
 * pre-allocated by the caller so sealing cannot fail. */
static void seal_into(kvmem_pool *p, const float *tail, int32_t n, void *kv, void *aabb) {
    seal_job j = {p, tail, n, kv, aabb};
    size_t groups = 2 * (size_t)p->spec.n_layers * (size_t)p->spec.n_kv_heads;
    kvm_parallel_for(p->ctx->tp, groups, 4, seal_task, &j);
}

size_t kvm_tail_bytes(const kvmem_pool *p) {
    return 2 * (size_t)p->spec.n_layers * p->layer_elems_bs * sizeof(float);
}

/* Grow the block table and AABB array to hold `need` sealed blocks. */
int kvm_agent_grow_blocks(kvmem_pool *p, kvm_agent_mem *m, int32_t need) {
    if (need <= m->cap_blocks) return 1;
    size_t per = kvm_aabb_block_bytes(p), nc, ab, got = 0;
    if (need < 0 || !kvm_grow_cap((size_t)m->cap_blocks, (size_t)need, 16, INT32_MAX, sizeof(kvm_block), &nc) ||
        !kvm_mul_size(nc, per, &ab))
        return 0;
    void *na = kvm_aabb_take(p, ab, &got);
    if (na) nc = KVM_MIN(got / per, (size_t)INT32_MAX); /* all of it: later growth fits */
    else if (!(na = kvm_aligned_alloc(ab))) return 0;
    kvm_block *nb = kvm_realloc(m->blocks, nc * sizeof *nb);
    if (!nb) {
        kvm_agent_mem tmp;
        memset(&tmp, 0, sizeof tmp);
        tmp.aabb = na;
        tmp.cap_blocks = (int32_t)nc;
        kvm_agent_mem_release(p, &tmp); /* back to the spare slot */
        return 0;
    }
    m->blocks = nb;
    if (m->n_sealed) memcpy(na, m->aabb, (size_t)m->n_sealed * per);
    kvm_aligned_free(m->aabb);
    m->aabb = na;
    m->cap_blocks = (int32_t)nc;
    return 1;
}

int kvm_agent_grow_tokens(kvm_agent_mem *m, int64_t need) {
    if (need <= m->cap_tokens) return 1;
    size_t nc;
    if (need < 0 || !kvm_grow_cap((size_t)m->cap_tokens, (size_t)need, 256, INT32_MAX, sizeof(int64_t), &nc)) return 0;
    int32_t *ni = kvm_realloc(m->token_ids, nc * sizeof *ni);
    if (!ni) return 0;
    m->token_ids = ni;
    int64_t *no = kvm_realloc(m->token_text_off, nc * sizeof *no);
    if (!no) return 0;
    m->token_text_off = no;
    m->cap_tokens = (int64_t)nc;
    return 1;
}

int kvm_agent_grow_text(kvm_agent_mem *m, size_t need) {
    if (need <= m->text_cap) return 1;
    size_t nc;
    if (!kvm_grow_cap(m->text_cap, need, 1024, PTRDIFF_MAX, 1, &nc)) return 0;
    char *nt = kvm_realloc(m->text, nc);
    if (!nt) return 0;
    m->text = nt;
    m->text_cap = nc;
    return 1;
}

static kvmem_status agent_append_taken(kvmem_agent *a, const kvmem_tensor *k, const kvmem_tensor *v,
                                const kvmem_append_params *params) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_append");
    if (st != KVMEM_OK) return st;
    if ((st = kvm_mapped_refuse(a->mem, "kvmem_agent_append")) != KVMEM_OK) return st;
    kvmem_pool *p = a->pool;
    kvm_agent_mem *m = a->mem;
    const int32_t L = p->spec.n_layers, H = p->spec.n_kv_heads, D = p->spec.head_dim;
    const int32_t BS = p->params.block_size;
    const char *dims = "[n_layers][T][n_kv_heads][head_dim]";
    if (!k || !v) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_append: %s is NULL", k ? "V" : "K");
    if (k->ndim != 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_append: K has %d dims, expected 4 %s", k->ndim, dims);
    int64_t T = k->shape[1];
    if (T < 0 || T > INT32_MAX) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_append: T = %lld out of range", (long long)T);
    int64_t shape[4] = {L, T, H, D};
    if ((st = kvm_tensor_expect(k, "K", dims, 4, shape)) != KVMEM_OK) return st;
    if ((st = kvm_tensor_expect(v, "V", dims, 4, shape)) != KVMEM_OK) return st;
    kvmem_append_params ap = kvmem_append_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_append_params, &ap, params, "kvmem_agent_append")) != KVMEM_OK) return st;
    if ((st = kvm_params_reserved(ap.reserved, "kvmem_append_params", "kvmem_agent_append")) != KVMEM_OK) return st;
    if (ap.keys_rotated != 0 && ap.keys_rotated != 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "keys_rotated must be 0 or 1, got %d", ap.keys_rotated);
    if (ap.keys_rotated && T > 0 && !ap.positions)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "keys_rotated is 1 but positions is NULL: kvmem needs each key's position to de-rotate it");
    if (!ap.keys_rotated && ap.positions)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "positions given but keys_rotated is 0: say whether K is post-RoPE");
    if (ap.text_len > 0 && !ap.text) return kvm_fail(KVMEM_ERR_INVALID_ARG, "text is NULL with text_len %zu", ap.text_len);
    if (ap.text_len > (size_t)PTRDIFF_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "text_len %zu is larger than any object can be", ap.text_len);
    if (ap.token_text_offsets) {
        if (!ap.text && ap.text_len == 0 && T > 0)
            for (int64_t i = 0; i < T; i++)
                if (ap.token_text_offsets[i] != 0)
                    return kvm_fail(KVMEM_ERR_INVALID_ARG, "token_text_offsets given without text");
        for (int64_t i = 0; i < T; i++) {
            int32_t o = ap.token_text_offsets[i];
            if (o < 0 || (size_t)o > ap.text_len || (i > 0 && o < ap.token_text_offsets[i - 1]))
                return kvm_fail(KVMEM_ERR_INVALID_ARG,
                                "token_text_offsets[%lld] = %d: offsets must be non-decreasing and within text_len %zu",
                                (long long)i, o, ap.text_len);
        }
    }
    if (p->params.max_tokens_per_agent > 0 && m->n_tokens + T > p->params.max_tokens_per_agent)
        return kvm_fail(KVMEM_ERR_CAPACITY, "agent '%s' holds %lld tokens; %lld more exceed max_tokens_per_agent %d",
                        m->id, (long long)m->n_tokens, (long long)T, p->params.max_tokens_per_agent);
    if (m->n_tokens + T > INT32_MAX)
        return kvm_fail(KVMEM_ERR_CAPACITY, "agent '%s': more than 2^31-1 tokens", m->id);

    const int32_t np = p->rope.n_pairs;
    int32_t *bad_tok = kvm_malloc((size_t)L * sizeof(int32_t) * 2 + (size_t)L * sizeof(float));
    float *cs = kvm_malloc((size_t)BS * 2 * (size_t)(np ? np : 1) * sizeof(float));
    if (!bad_tok || !cs) {
        kvm_free(bad_tok);
        kvm_free(cs);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_append: out of memory for the validation scratch");
    }
    append_job job = {p, k, v, 0, 0, NULL, m->tail, 0, bad_tok, bad_tok + L, (float *)(bad_tok + 2 * L),
                      storage_limit(p->params.storage_dtype), 0};

    /* Pass 1: every value finite and storable, checked before anything changes. */
    for (int64_t t = 0; t < T; t += BS) {
        job.t0 = t;
        job.n = (int32_t)KVM_MIN((int64_t)BS, T - t);
        if (ap.keys_rotated) {
            for (int32_t i = 0; i < job.n; i++)
                kvm_rope_cos_sin(&p->rope, ap.positions[t + i], cs + (size_t)i * 2 * np, cs + (size_t)i * 2 * np + np);
            job.cs = cs;
        }
        kvm_parallel_for(p->ctx->tp, (size_t)L, 1, append_task, &job);
        for (int32_t l = 0; l < L; l++) {
            if (job.bad_layer_token[l] >= 0) {
                float bv = job.bad_value[l];
                int tok = job.bad_layer_token[l], isv = job.bad_is_v[l];
                kvm_free(bad_tok);
                kvm_free(cs);
                if (isfinite(bv))
                    return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s at layer %d, token %d: value %g exceeds the %s storage range",
                                    isv ? "V" : "K", l, tok, bv, kvmem_dtype_name(p->params.storage_dtype));
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s at layer %d, token %d: non-finite value (%g)",
                                isv ? "V" : "K", l, tok, bv);
            }
        }
    }

    /* Allocate everything that can fail, then reserve the bytes (which may
     * spill closed agents to the store: only once nothing else can fail). */
    int64_t total = (int64_t)m->tail_n + T;
    int32_t n_new = (int32_t)(total / BS);
    uint64_t need = (uint64_t)n_new * kvm_block_bytes(p, BS);
    int need_tail = m->tail == NULL && T > 0;
    if (need_tail) need += kvm_tail_bytes(p);
    void **kvs = kvm_calloc((size_t)(n_new ? n_new : 1), sizeof *kvs);
    float *new_tail = need_tail ? kvm_aligned_alloc(kvm_tail_bytes(p)) : NULL;
    size_t text_need;
    int ok = kvs != NULL && (!need_tail || new_tail) && kvm_add_size(m->text_len, ap.text_len, &text_need) &&
             kvm_agent_grow_blocks(p, m, m->n_sealed + n_new) && kvm_agent_grow_tokens(m, m->n_tokens + T) &&
             kvm_agent_grow_text(m, text_need);
    for (int32_t i = 0; ok && i < n_new; i++) ok = (kvs[i] = kvm_block_alloc(p, BS)) != NULL;
    st = ok ? kvm_pool_reserve(p, need)
            : kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_append: out of memory for %lld tokens (%d new blocks)", (long long)T, n_new);
    if (st != KVMEM_OK) {
        for (int32_t i = 0; kvs && i < n_new; i++) {
            kvm_block b = {0, BS, 0, kvs[i], NULL};
            kvm_block_free(p, &b, 1);
        }
        kvm_free(kvs);
        kvm_aligned_free(new_tail);
        kvm_free(bad_tok);
        kvm_free(cs);
        return st;
    }
    if (need_tail) m->tail = new_tail;

    /* Pass 2: stage rows and seal each block that fills. Cannot fail. */
    job.write = 1;
    job.tail = m->tail;
    int32_t sealed = 0;
    for (int64_t t = 0; t < T;) {
        job.t0 = t;
        job.tail_at = m->tail_n;
        job.n = (int32_t)KVM_MIN((int64_t)(BS - m->tail_n), T - t);
        job.cs = NULL;
        if (ap.keys_rotated) {
            for (int32_t i = 0; i < job.n; i++)
                kvm_rope_cos_sin(&p->rope, ap.positions[t + i], cs + (size_t)i * 2 * np, cs + (size_t)i * 2 * np + np);
            job.cs = cs;
        }
        kvm_parallel_for(p->ctx->tp, (size_t)L, 1, append_task, &job);
        m->tail_n += job.n;
        t += job.n;
        if (m->tail_n == BS) {
            int32_t b = m->n_sealed + sealed;
            seal_into(p, m->tail, BS, kvs[sealed], kvm_block_aabb(p, m, b, 0, 0));
            m->blocks[b].first_token = m->n_tokens + t - BS;
            m->blocks[b].n_tokens = BS;
            m->blocks[b].reserved = 0;
            m->blocks[b].kv = kvs[sealed];
            m->blocks[b].map = NULL;
            sealed++;
            m->tail_n = 0;
        }
    }
    for (int64_t i = 0; i < T; i++) {
        m->token_ids[m->n_tokens + i] = ap.token_ids ? ap.token_ids[i] : -1;
        m->token_text_off[m->n_tokens + i] =
            ap.token_text_offsets ? (int64_t)m->text_len + ap.token_text_offsets[i] : -1;
    }
    if (ap.text_len) memcpy(m->text + m->text_len, ap.text, ap.text_len);
    m->text_len += ap.text_len;
    m->n_sealed += sealed;
    m->n_tokens += T;
    m->bytes += need;
    if (T > 0) m->dirty = 1;
    kvm_free(kvs);
    kvm_free(bad_tok);
    kvm_free(cs);
    return KVMEM_OK;
}

/* K or V in device memory (kvmem.h, "Device tensors"): the pool keeps its
 * blocks in host memory, so each comes down once and the host path runs. */
static kvmem_status agent_append_device(kvmem_agent *a, const kvmem_tensor *k, const kvmem_tensor *v,
                                        const kvmem_append_params *params) {
    static const char *fn = "kvmem_agent_append";
    kvmem_status st = kvm_agent_check(a, fn);
    if (st != KVMEM_OK) return st;
    kvm_devt dev[2];
    memset(dev, 0, sizeof dev);
    kvmem_context *ctx = a->pool->ctx;
    if ((st = kvm_devt_open(ctx, k, fn, "K", &dev[0])) == KVMEM_OK && (st = kvm_devt_open(ctx, v, fn, "V", &dev[1])) == KVMEM_OK &&
        (st = kvm_devt_read(&dev[0], fn)) == KVMEM_OK && (st = kvm_devt_read(&dev[1], fn)) == KVMEM_OK)
        st = agent_append_taken(a, kvm_devt_view(&dev[0]), kvm_devt_view(&dev[1]), params);
    kvm_devt_close_all(dev, 2);
    return st;
}

kvmem_status kvmem_agent_append(kvmem_agent *a, const kvmem_tensor *k, const kvmem_tensor *v,
                                const kvmem_append_params *params) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_append");
    if (st != KVMEM_OK) return st;
    st = kvm_devt_is_device(k) || kvm_devt_is_device(v) ? agent_append_device(a, k, v, params)
                                                         : agent_append_taken(a, k, v, params);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_flush_taken(kvmem_agent *a) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_flush");
    if (st != KVMEM_OK) return st;
    if ((st = kvm_mapped_refuse(a->mem, "kvmem_agent_flush")) != KVMEM_OK) return st;
    kvmem_pool *p = a->pool;
    kvm_agent_mem *m = a->mem;
    if (m->tail_n == 0) return KVMEM_OK;
    uint64_t need = kvm_block_bytes(p, m->tail_n);
    kvm_block nb = {m->n_tokens - m->tail_n, m->tail_n, 0, kvm_block_alloc(p, m->tail_n), NULL};
    if (!nb.kv || !kvm_agent_grow_blocks(p, m, m->n_sealed + 1)) {
        kvm_block_free(p, &nb, 1);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_flush: out of memory for a block of %d tokens", m->tail_n);
    }
    if ((st = kvm_pool_reserve(p, need)) != KVMEM_OK) { /* after allocating: a spill is the last thing done */
        kvm_block_free(p, &nb, 1);
        return st;
    }
    void *kv = nb.kv;
    int32_t b = m->n_sealed;
    seal_into(p, m->tail, m->tail_n, kv, kvm_block_aabb(p, m, b, 0, 0));
    m->blocks[b].first_token = m->n_tokens - m->tail_n;
    m->blocks[b].n_tokens = m->tail_n;
    m->blocks[b].reserved = 0;
    m->blocks[b].kv = kv;
    m->blocks[b].map = NULL;
    m->n_sealed++;
    m->tail_n = 0;
    m->bytes += need;
    m->dirty = 1;
    return KVMEM_OK;
}

kvmem_status kvmem_agent_flush(kvmem_agent *a) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_flush");
    if (st != KVMEM_OK) return st;
    st = agent_flush_taken(a);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_get_info_taken(kvmem_agent *a, kvmem_agent_info *out) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_get_info");
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_get_info: out is NULL");
    const kvm_agent_mem *m = a->mem;
    memset(out, 0, sizeof *out);
    out->n_tokens = m->n_tokens;
    out->n_sealed = m->n_sealed;
    out->n_blocks = m->n_sealed + (m->tail_n > 0);
    out->bytes = m->bytes;
    out->text_bytes = m->text_len;
    return KVMEM_OK;
}

kvmem_status kvmem_agent_get_info(kvmem_agent *a, kvmem_agent_info *out) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_get_info");
    if (st != KVMEM_OK) return st;
    st = agent_get_info_taken(a, out);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_block_info_taken(kvmem_agent *a, int32_t block, kvmem_block_info *out) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_block_info");
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_block_info: out is NULL");
    const kvm_agent_mem *m = a->mem;
    int32_t nb = m->n_sealed + (m->tail_n > 0);
    if (block < 0 || block >= nb)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "block %d outside [0, %d) of agent '%s'", block, nb, m->id);
    memset(out, 0, sizeof *out);
    if (block < m->n_sealed) {
        out->first_token = m->blocks[block].first_token;
        out->n_tokens = m->blocks[block].n_tokens;
        out->sealed = 1;
    } else {
        out->first_token = m->n_tokens - m->tail_n;
        out->n_tokens = m->tail_n;
        out->sealed = 0;
    }
    return KVMEM_OK;
}

kvmem_status kvmem_agent_block_info(kvmem_agent *a, int32_t block, kvmem_block_info *out) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_block_info");
    if (st != KVMEM_OK) return st;
    st = agent_block_info_taken(a, block, out);
    kvm_agent_leave(a);
    return st;
}

void kvm_block_read_f32(const kvmem_pool *p, const kvm_block *b, int which, int32_t l, int32_t h,
                        int32_t row0, int32_t n, float *dst) {
    const size_t D = (size_t)p->spec.head_dim;
    const kvmem_dtype dt = p->params.storage_dtype;
    if (!b->kv) {
        kvm_mapped_read_f32(p, b, which, l, h, row0, n, dst);
        return;
    }
    if (kvm_is_quant_dtype(dt)) {
        const kvm_qblock qb = kvm_block_qlayout(p, b->n_tokens);
        const size_t g = (size_t)l * (size_t)p->spec.n_kv_heads + (size_t)h;
        kvm_dequant_parts(dt, which, kvm_qblock_parts(&qb, b->kv, which, g), (size_t)b->n_tokens, D, (size_t)row0,
                          (size_t)n, dst);
        return;
    }
    const unsigned char *rows = kvm_block_rows(p, b, which, l, h);
    kvm_convert_host(dst, KVMEM_F32, rows + (size_t)row0 * D * kvm_dtype_size(dt), dt, (size_t)n * D);
}

/* Index of the sealed block holding token t, or n_sealed for the tail. */
static int32_t block_of(const kvm_agent_mem *m, int64_t t) {
    int32_t lo = 0, hi = m->n_sealed - 1, ans = m->n_sealed;
    if (t >= m->n_tokens - m->tail_n) return m->n_sealed;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (m->blocks[mid].first_token <= t) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

/* "[first, first + n)" for a message, the end computed where it fits int64
 * and written as a sum where it does not (a caller may pass any values). */
static const char *range_text(char *buf, size_t size, int64_t first, int64_t n) {
    if ((n > 0 && first > INT64_MAX - n) || (n < 0 && first < INT64_MIN - n))
        snprintf(buf, size, "[%lld, %lld + %lld)", (long long)first, (long long)first, (long long)n);
    else
        snprintf(buf, size, "[%lld, %lld)", (long long)first, (long long)(first + n));
    return buf;
}

static kvmem_status agent_read_taken(kvmem_agent *a, int64_t first, int64_t T, const kvmem_tensor *k_out,
                              const kvmem_tensor *v_out) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_read");
    if (st != KVMEM_OK) return st;
    const kvmem_pool *p = a->pool;
    const kvm_agent_mem *m = a->mem;
    const int32_t L = p->spec.n_layers, H = p->spec.n_kv_heads, D = p->spec.head_dim;
    const int32_t BS = p->params.block_size;
    if (first < 0 || T < 0 || first > m->n_tokens || T > m->n_tokens - first)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_read: tokens %s outside [0, %lld)",
                        range_text((char[64]){0}, 64, first, T), (long long)m->n_tokens);
    const char *dims = "[n_layers][T][n_kv_heads][head_dim]";
    int64_t shape[4] = {L, T, H, D};
    if (k_out && (st = kvm_tensor_expect(k_out, "k_out", dims, 4, shape)) != KVMEM_OK) return st;
    if (v_out && (st = kvm_tensor_expect(v_out, "v_out", dims, 4, shape)) != KVMEM_OK) return st;
    /* block by block, each (K/V, layer, head) a run of rows read (and
     * converted) at once: the outputs' rows of one head are adjacent in
     * head-major tensors (HF caches), a position's heads in position-major
     * ones; a block's rows stay in cache either way */
    float rows[8192];
    const int64_t chunk = KVM_MAX((int64_t)1, (int64_t)(sizeof rows / sizeof rows[0]) / D);
    for (int64_t t = first; t < first + T;) {
        const int32_t b = block_of(m, t);
        const int64_t bt0 = b < m->n_sealed ? m->blocks[b].first_token : m->n_tokens - m->tail_n;
        const int64_t bt1 = b < m->n_sealed ? bt0 + m->blocks[b].n_tokens : m->n_tokens;
        const int64_t e = KVM_MIN(KVM_MIN(bt1, first + T), t + chunk);
        const int32_t n = (int32_t)(e - t);
        for (int32_t which = 0; which < 2; which++) {
            const kvmem_tensor *dst = which ? v_out : k_out;
            if (!dst) continue;
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < H; h++) {
                    const float *src;
                    if (b < m->n_sealed) {
                        kvm_block_read_f32(p, &m->blocks[b], which, l, h, (int32_t)(t - bt0), n, rows);
                        src = rows;
                    } else {
                        src = m->tail + ((((size_t)which * (size_t)L + (size_t)l) * (size_t)H + (size_t)h) * (size_t)BS +
                                         (size_t)(t - bt0)) * (size_t)D;
                    }
                    for (int32_t i = 0; i < n; i++) {
                        int64_t idx[3] = {l, t - first + i, h};
                        kvm_tensor_write_f32(dst, kvm_tensor_row_offset(dst, idx), src + (size_t)i * (size_t)D, (size_t)D);
                    }
                }
        }
        t = e;
    }
    return KVMEM_OK;
}

kvmem_status kvmem_agent_read(kvmem_agent *a, int64_t first, int64_t T, const kvmem_tensor *k_out,
                              const kvmem_tensor *v_out) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_read");
    if (st != KVMEM_OK) return st;
    st = agent_read_taken(a, first, T, k_out, v_out);
    if (a->mem) st = kvm_mapped_check(a->mem, st, "kvmem_agent_read");
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_block_aabb_taken(kvmem_agent *a, int32_t block, float *out_min, float *out_max) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_block_aabb");
    if (st != KVMEM_OK) return st;
    const kvmem_pool *p = a->pool;
    const kvm_agent_mem *m = a->mem;
    if (!out_min || !out_max)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_block_aabb: %s is NULL", out_min ? "out_max" : "out_min");
    if (block < 0 || block >= m->n_sealed)
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "block %d is not a sealed block of agent '%s' (%d sealed)", block,
                        m->id, m->n_sealed);
    const size_t D = (size_t)p->spec.head_dim;
    float box[4 * KVM_ROPE_MAX_PAIRS];
    for (int32_t l = 0; l < p->spec.n_layers; l++)
        for (int32_t h = 0; h < p->spec.n_kv_heads; h++) {
            kvm_block_aabb_f32(p, m, block, l, h, box);
            size_t o = ((size_t)l * (size_t)p->spec.n_kv_heads + (size_t)h) * D;
            memcpy(out_max + o, box, D * sizeof(float));
            memcpy(out_min + o, box + D, D * sizeof(float));
        }
    return KVMEM_OK;
}

kvmem_status kvmem_agent_block_aabb(kvmem_agent *a, int32_t block, float *out_min, float *out_max) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_block_aabb");
    if (st != KVMEM_OK) return st;
    st = agent_block_aabb_taken(a, block, out_min, out_max);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_tokens_taken(kvmem_agent *a, int64_t first, int64_t n, int32_t *out) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_tokens");
    if (st != KVMEM_OK) return st;
    const kvm_agent_mem *m = a->mem;
    if (first < 0 || n < 0 || first > m->n_tokens || n > m->n_tokens - first)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_tokens: %s outside [0, %lld)",
                        range_text((char[64]){0}, 64, first, n), (long long)m->n_tokens);
    if (n > 0 && !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_tokens: out is NULL");
    if (n > 0) memcpy(out, m->token_ids + first, (size_t)n * sizeof *out);
    return KVMEM_OK;
}

kvmem_status kvmem_agent_tokens(kvmem_agent *a, int64_t first, int64_t n, int32_t *out) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_tokens");
    if (st != KVMEM_OK) return st;
    st = agent_tokens_taken(a, first, n, out);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_text_taken(kvmem_agent *a, const char **text, size_t *len) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_text");
    if (st != KVMEM_OK) return st;
    if (!text || !len) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_text: %s is NULL", text ? "len" : "text");
    *text = a->mem->text ? a->mem->text : "";
    *len = a->mem->text_len;
    return KVMEM_OK;
}

kvmem_status kvmem_agent_text(kvmem_agent *a, const char **text, size_t *len) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_text");
    if (st != KVMEM_OK) return st;
    st = agent_text_taken(a, text, len);
    kvm_agent_leave(a);
    return st;
}

static kvmem_status agent_truncate_taken(kvmem_agent *a, int64_t n) {
    kvmem_status st = kvm_agent_check(a, "kvmem_agent_truncate");
    if (st != KVMEM_OK) return st;
    if ((st = kvm_mapped_refuse(a->mem, "kvmem_agent_truncate")) != KVMEM_OK) return st;
    kvmem_pool *p = a->pool;
    kvm_agent_mem *m = a->mem;
    if (n < 0 || n > m->n_tokens)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_agent_truncate: %lld tokens outside [0, %lld]", (long long)n,
                        (long long)m->n_tokens);
    if (n == m->n_tokens) return KVMEM_OK;
    const int32_t L = p->spec.n_layers, H = p->spec.n_kv_heads, BS = p->params.block_size;
    const size_t D = (size_t)p->spec.head_dim;
    int64_t tail_first = m->n_tokens - m->tail_n;
    int32_t keep_blocks = m->n_sealed; /* sealed blocks kept whole */
    int32_t reopen = -1;               /* block re-opened as the tail */
    int32_t new_tail_n;
    if (n >= tail_first) {
        new_tail_n = (int32_t)(n - tail_first);
    } else {
        int32_t b = block_of(m, n);
        keep_blocks = b;
        new_tail_n = 0;
        if (m->blocks[b].first_token < n) {
            reopen = b;
            new_tail_n = (int32_t)(n - m->blocks[b].first_token);
        }
    }
    /* the only allocation: a tail buffer for a re-opened block */
    int alloc_tail = reopen >= 0 && !m->tail;
    if (alloc_tail) {
        float *tail = kvm_aligned_alloc(kvm_tail_bytes(p));
        if (!tail)
            return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_agent_truncate: out of memory for the unsealed block (%zu bytes)",
                            kvm_tail_bytes(p));
        if ((st = kvm_pool_reserve(p, kvm_tail_bytes(p))) != KVMEM_OK) {
            kvm_aligned_free(tail);
            return st;
        }
        m->tail = tail;
        m->bytes += kvm_tail_bytes(p);
    }
    if (reopen >= 0) {
        const kvm_block *blk = &m->blocks[reopen];
        for (int which = 0; which < 2; which++)
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < H; h++)
                    kvm_block_read_f32(p, blk, which, l, h, 0, new_tail_n,
                                       m->tail + (((size_t)which * (size_t)L + (size_t)l) * (size_t)H + (size_t)h) *
                                                     (size_t)BS * D);
    }
    uint64_t freed = 0;
    for (int32_t i = keep_blocks; i < m->n_sealed; i++) freed += kvm_block_bytes(p, m->blocks[i].n_tokens);
    kvm_pool_unreserve(p, freed); /* first: the spare list's bound follows the bytes held */
    kvm_resident_truncate(m, keep_blocks); /* the kept blocks stay resident */
    kvm_block_free(p, m->blocks + keep_blocks, m->n_sealed - keep_blocks);
    m->n_sealed = keep_blocks;
    m->tail_n = new_tail_n;
    int64_t cut = m->token_text_off[n];
    /* text of the dropped tokens goes too; unknown boundary: the text no longer
     * describes the memory, so it is dropped rather than kept wrong */
    m->text_len = cut >= 0 && (size_t)cut <= m->text_len ? (size_t)cut : 0;
    m->n_tokens = n;
    m->bytes -= freed;
    m->dirty = 1;
    return KVMEM_OK;
}

kvmem_status kvmem_agent_truncate(kvmem_agent *a, int64_t n) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_agent_truncate");
    if (st != KVMEM_OK) return st;
    st = agent_truncate_taken(a, n);
    kvm_agent_leave(a);
    return st;
}

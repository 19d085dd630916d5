/* kvmem_retrieve and the kvmem_retrieval result object. */
#include "score.h"
#include "../backend/route/route.h"
#include "../backend/route/devtensor.h"
#include "../cpu/tensor.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define KVM_RETRIEVAL_MAGIC 0x72747276u /* "rtrv" */

struct kvmem_retrieval {
    uint32_t magic;
    int32_t n_sets;
    int32_t n_blocks; /* sealed blocks at retrieval time */
    int32_t cap;      /* entries per set in blocks/scores */
    int32_t *count;   /* [n_sets] */
    int32_t *blocks;  /* [n_sets][cap] */
    float *scores;    /* [n_sets][cap] */
    int64_t *tokens;  /* [n_sets] */
    float *all;       /* [n_sets][n_blocks] */
    /* Memory kept between calls, so a retrieval in steady state allocates
     * nothing: the current result's arrays (res), the next one's (spare,
     * swapped in at commit), the call's query copy and candidate lists
     * (call); the scoring op's working memory is the CPU backend's cache. */
    kvm_workbuf res, spare, call;
};

kvmem_status kvmem_retrieve_params_init(kvmem_retrieve_params *params, size_t struct_size) {
    kvmem_retrieve_params p;
    memset(&p, 0, sizeof p);
    p.top_k = 8;
    p.mode = KVMEM_RETRIEVE_AABB;
    p.norm = KVMEM_NORM_SOFTMAX;
    p.agg = KVMEM_AGG_MAX;
    p.scope = KVMEM_SCOPE_GLOBAL;
    return KVM_PARAMS_INIT(kvmem_retrieve_params, params, struct_size, &p, "kvmem_retrieve_params_init");
}

static void release(kvmem_retrieval *r) {
    kvm_workbuf_release(&r->res);
    kvm_workbuf_release(&r->spare);
    kvm_workbuf_release(&r->call);
}

kvmem_status kvmem_retrieval_create(kvmem_retrieval **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_create: out is NULL");
    kvmem_retrieval *r = kvm_calloc(1, sizeof *r);
    if (!r) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieval_create: out of memory for the result object");
    r->magic = KVM_RETRIEVAL_MAGIC;
    *out = r;
    return KVMEM_OK;
}

void kvmem_retrieval_free(kvmem_retrieval *r) {
    if (!r || r->magic != KVM_RETRIEVAL_MAGIC) return;
    release(r);
    r->magic = 0;
    kvm_free(r);
}

static kvmem_status check_result(const kvmem_retrieval *r, const char *fn) {
    if (!r) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: retrieval result is NULL", fn);
    if (r->magic != KVM_RETRIEVAL_MAGIC) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: not a kvmem_retrieval", fn);
    return KVMEM_OK;
}

static kvmem_status check_set(const kvmem_retrieval *r, int32_t set, const char *fn) {
    kvmem_status st = check_result(r, fn);
    if (st != KVMEM_OK) return st;
    if (r->n_sets == 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: the result is empty (no successful kvmem_retrieve yet)", fn);
    if (set < 0 || set >= r->n_sets)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: set %d outside [0, %d)", fn, set, r->n_sets);
    return KVMEM_OK;
}

int32_t kvmem_retrieval_n_sets(const kvmem_retrieval *r) {
    return r && r->magic == KVM_RETRIEVAL_MAGIC ? r->n_sets : 0;
}

kvmem_status kvmem_retrieval_get(const kvmem_retrieval *r, int32_t set, const int32_t **blocks, const float **scores,
                                 int32_t *n) {
    kvmem_status st = check_set(r, set, "kvmem_retrieval_get");
    if (st != KVMEM_OK) return st;
    if (!n) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_get: n is NULL");
    if (blocks) *blocks = r->blocks + (size_t)set * (size_t)r->cap;
    if (scores) *scores = r->scores + (size_t)set * (size_t)r->cap;
    *n = r->count[set];
    return KVMEM_OK;
}

kvmem_status kvmem_retrieval_copy(const kvmem_retrieval *r, int32_t set, int32_t *blocks, float *scores,
                                  int32_t capacity, int32_t *n) {
    kvmem_status st = check_set(r, set, "kvmem_retrieval_copy");
    if (st != KVMEM_OK) return st;
    if (!n) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_copy: n is NULL");
    if (capacity < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_copy: capacity %d < 0", capacity);
    int32_t c = KVM_MIN(capacity, r->count[set]);
    if (c > 0 && blocks) memcpy(blocks, r->blocks + (size_t)set * (size_t)r->cap, (size_t)c * sizeof *blocks);
    if (c > 0 && scores) memcpy(scores, r->scores + (size_t)set * (size_t)r->cap, (size_t)c * sizeof *scores);
    *n = r->count[set];
    return KVMEM_OK;
}

kvmem_status kvmem_retrieval_block_scores(const kvmem_retrieval *r, int32_t set, const float **scores,
                                          int32_t *n_blocks) {
    kvmem_status st = check_set(r, set, "kvmem_retrieval_block_scores");
    if (st != KVMEM_OK) return st;
    if (!scores || !n_blocks)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_block_scores: %s is NULL", scores ? "n_blocks" : "scores");
    *scores = r->all + (size_t)set * (size_t)r->n_blocks;
    *n_blocks = r->n_blocks;
    return KVMEM_OK;
}

kvmem_status kvmem_retrieval_n_tokens(const kvmem_retrieval *r, int32_t set, int64_t *n_tokens) {
    kvmem_status st = check_set(r, set, "kvmem_retrieval_n_tokens");
    if (st != KVMEM_OK) return st;
    if (!n_tokens) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieval_n_tokens: n_tokens is NULL");
    *n_tokens = r->tokens[set];
    return KVMEM_OK;
}

static kvmem_status check_ids(const int32_t *ids, int32_t n, int32_t n_sealed, const char *what) {
    if (n < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: n_%s = %d < 0", what, n);
    if (n > 0 && !ids) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: %s is NULL with n_%s = %d", what, what, n);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_sealed)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: %s[%d] = %d is not a sealed block (agent has %d)",
                            what, i, ids[i], n_sealed);
    return KVMEM_OK;
}

static kvmem_status check_params(const kvmem_retrieve_params *p, int32_t n_sealed) {
    if (p->top_k < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: top_k %d < 0", p->top_k);
    if (p->mode != KVMEM_RETRIEVE_AABB && p->mode != KVMEM_RETRIEVE_EXACT)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: mode %d is not AABB or EXACT", (int)p->mode);
    if (p->norm != KVMEM_NORM_SOFTMAX && p->norm != KVMEM_NORM_RR)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: norm %d is not SOFTMAX or RR", (int)p->norm);
    if (p->agg != KVMEM_AGG_MAX && p->agg != KVMEM_AGG_SUM)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: agg %d is not MAX or SUM", (int)p->agg);
    if (p->scope != KVMEM_SCOPE_GLOBAL && p->scope != KVMEM_SCOPE_PER_LAYER)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: scope %d is not GLOBAL or PER_LAYER", (int)p->scope);
    if (!isfinite(p->tau) || p->tau < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: tau %g must be finite and >= 0 (0 = 1/sqrt(head_dim))", (double)p->tau);
    if (!isfinite(p->rr_c) || p->rr_c < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: rr_c %g must be finite and >= 0 (0 = 60)", (double)p->rr_c);
    if (p->recent_window < 0 || p->skip_recent < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: recent_window %d and skip_recent %d must be >= 0",
                        p->recent_window, p->skip_recent);
    kvmem_status st = check_ids(p->exclude, p->n_exclude, n_sealed, "exclude");
    if (st == KVMEM_OK) st = check_ids(p->always_include, p->n_always_include, n_sealed, "always_include");
    if (st != KVMEM_OK) return st;
    for (int32_t i = 0; i < p->n_always_include; i++)
        for (int32_t e = 0; e < p->n_exclude; e++)
            if (p->always_include[i] == p->exclude[e])
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: block %d is both excluded and always included",
                                p->exclude[e]);
    return KVMEM_OK;
}

/* Check the query's shape: n_q rows of [n_layers][n_q_heads][head_dim]. */
static kvmem_status check_query(const kvmem_tensor *q, const kvmem_model_spec *s, int32_t *n_q) {
    if (!q) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: query is NULL");
    const char *dims = "[n_q][n_layers][n_q_heads][head_dim]";
    if (q->ndim != 4)
        return kvm_fail(KVMEM_ERR_MISMATCH, "kvmem_retrieve: query has %d dims, expected 4 %s", q->ndim, dims);
    if (q->shape[1] != s->n_layers || q->shape[2] != s->n_q_heads || q->shape[3] != s->head_dim)
        return kvm_fail(KVMEM_ERR_MISMATCH,
                        "kvmem_retrieve: query shape [%lld][%lld][%lld][%lld] does not match the pool's model spec "
                        "[n_q][%d][%d][%d] %s",
                        (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[2], (long long)q->shape[3],
                        s->n_layers, s->n_q_heads, s->head_dim, dims);
    if (q->shape[0] < 1 || q->shape[0] > 65536)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: n_q = %lld outside [1, 65536]", (long long)q->shape[0]);
    int64_t shape[4] = {q->shape[0], s->n_layers, s->n_q_heads, s->head_dim};
    kvmem_status st = kvm_tensor_expect(q, "query", dims, 4, shape);
    if (st != KVMEM_OK) return st;
    *n_q = (int32_t)shape[0];
    return KVMEM_OK;
}

/* Read the query into a contiguous f32 copy f (n_q * n_layers * n_q_heads *
 * head_dim floats), rejecting non-finite values. Rows are read in the
 * order they lie in memory: HF hands query states per layer as
 * [n_q_heads][n_q][head_dim], where one token's rows are 8 KiB apart. A
 * non-finite value is then looked up in f in index order, so the message
 * names the first one whatever the layout. */
static kvmem_status load_query(const kvmem_tensor *q, const kvmem_model_spec *s, int32_t n_q, float *f) {
    const size_t D = (size_t)s->head_dim, L = (size_t)s->n_layers, NQ = (size_t)s->n_q_heads;
    const int tokens_inner = q->strides[0] < q->strides[2]; /* per (layer, head): the tokens' rows adjacent */
    const size_t outer = tokens_inner ? L * NQ : (size_t)n_q, inner = tokens_inner ? (size_t)n_q : L * NQ;
    for (size_t a = 0; a < outer; a++)
        for (size_t b = 0; b < inner; b++) {
            const size_t t = tokens_inner ? b : a, lh = tokens_inner ? a : b;
            int64_t idx[3] = {(int64_t)t, (int64_t)(lh / NQ), (int64_t)(lh % NQ)};
            kvm_tensor_read_f32(q, kvm_tensor_row_offset(q, idx), f + (t * L * NQ + lh) * D, D);
        }
    /* one vector pass over the copy (a scalar test per element is a
     * measurable share of a decode call) */
    if (!kvm_cpu_kernels_get()->count_nonfinite(f, (size_t)n_q * L * NQ * D)) return KVMEM_OK;
    size_t i = 0;
    while (isfinite(f[i])) i++;
    const size_t row = i / D;
    return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: query[%zu][%zu][%zu][%zu] = %g is not finite", row / (L * NQ),
                    row / NQ % L, row % NQ, i % D, (double)f[i]);
}


/* Keys of the agent's blocks for the score op's EXACT mode (callbacks of
 * kvm_dev_keys): F16 and F32 blocks in memory in place, the rest decoded. */
typedef struct agent_keys {
    const kvmem_pool *p;
    const kvm_agent_mem *m;
} agent_keys;

static const void *key_rows(void *ctx, int32_t b, int32_t l, int32_t g, int32_t *n, kvmem_dtype *dt) {
    const agent_keys *a = ctx;
    const kvm_block *blk = &a->m->blocks[b];
    *n = blk->n_tokens;
    *dt = a->p->params.storage_dtype;
    return blk->kv && (*dt == KVMEM_F16 || *dt == KVMEM_F32) ? kvm_block_rows(a->p, blk, 0, l, g) : NULL;
}

static void key_read(void *ctx, int32_t b, int32_t l, int32_t g, float *dst, int32_t *n) {
    const agent_keys *a = ctx;
    const kvm_block *blk = &a->m->blocks[b];
    *n = blk->n_tokens;
    kvm_block_read_f32(a->p, blk, 0, l, g, 0, blk->n_tokens, dst);
}

/* The CPU backend's dev_score on the agent's boxes (or keys) in place. */
static kvmem_status score_on_cpu(kvmem_backend *be, const kvm_score_desc *d) {
    const kvmem_pool *p = d->pool;
    const kvm_agent_mem *m = d->mem;
    const size_t L = (size_t)p->spec.n_layers, Hq = (size_t)p->spec.n_q_heads, D = (size_t)p->spec.head_dim;
    int32_t max_rows = 1;
    for (int32_t j = 0; d->mode == KVMEM_RETRIEVE_EXACT && j < d->n_cand; j++)
        max_rows = KVM_MAX(max_rows, m->blocks[d->cand[j]].n_tokens);
    agent_keys ak = {p, m};
    const kvm_dev_keys keys = {&ak, max_rows, key_rows, key_read};
    kvmem_buffer vq, vbox, vout;
    kvm_dev_score_args a;
    memset(&a, 0, sizeof a);
    a.q = kvm_cpu_buffer_view(&vq, d->q, (size_t)d->n_q * L * Hq * D * sizeof(float));
    a.s_max = kvm_cpu_buffer_view(&vbox, m->aabb, (size_t)m->n_sealed * kvm_aabb_block_bytes(p));
    a.out = kvm_cpu_buffer_view(&vout, d->out, (size_t)d->n_sets * (size_t)d->n_cand * sizeof(float));
    a.n_q = d->n_q;
    a.n_blocks = d->n_cand;
    a.n_layers = p->spec.n_layers;
    a.n_q_heads = p->spec.n_q_heads;
    a.n_kv_heads = p->spec.n_kv_heads;
    a.head_dim = p->spec.head_dim;
    a.norm = d->norm;
    a.agg = d->agg;
    a.tau = d->tau;
    a.rr_c = d->rr_c;
    a.n_sets = d->n_sets;
    a.box_layout = kvm_aabb_esize(p) == 2 ? KVM_BOXES_PAIRED_F16 : KVM_BOXES_PAIRED_F32;
    a.blocks = d->cand;
    a.mode = d->mode;
    a.keys = &keys;
    return be->iface->dev_score(be, &a);
}

/* score.h */
kvmem_status kvm_score_overflow(const kvm_score_desc *d) {
    const kvmem_model_spec *s = &d->pool->spec;
    const size_t n = (size_t)d->n_q * (size_t)s->n_layers * (size_t)s->n_q_heads * (size_t)s->head_dim;
    float big = 0.0f;
    for (size_t i = 0; i < n; i++) big = fabsf(d->q[i]) > big ? fabsf(d->q[i]) : big;
    return kvm_fail(KVMEM_ERR_INVALID_ARG,
                    "kvmem_retrieve: a block's relevance to the query overflows f32 (the query's largest magnitude is "
                    "%g): scale the query down",
                    (double)big);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The working lists of one call. */
typedef struct call_mem {
    float *q;            /* the query, f32 contiguous */
    unsigned char *flag; /* per sealed block: 1 candidate, 2 always included (scored too) */
    int32_t *cand, *idx;
    float *set_s, *out;  /* ranking scores of one set; set scores [n_sets][nc] */
} call_mem;

static void call_layout(kvm_carve *g, call_mem *c, size_t q_floats, size_t nb, size_t n_sets) {
    c->q = kvm_carve_take(g, q_floats, sizeof(float));
    c->flag = kvm_carve_take(g, nb + 1, 1);
    c->cand = kvm_carve_take(g, nb + 1, sizeof(int32_t));
    c->idx = kvm_carve_take(g, nb + 1, sizeof(int32_t));
    c->set_s = kvm_carve_take(g, nb + 1, sizeof(float));
    c->out = kvm_carve_take(g, n_sets * nb + 1, sizeof(float));
}

/* The result's arrays in one scratch block. */
static void result_layout(kvm_carve *g, kvmem_retrieval *r, size_t n_sets, size_t cap, size_t nb) {
    r->count = kvm_carve_take(g, n_sets, sizeof(int32_t));
    r->tokens = kvm_carve_take(g, n_sets, sizeof(int64_t));
    r->blocks = kvm_carve_take(g, n_sets * cap, sizeof(int32_t));
    r->scores = kvm_carve_take(g, n_sets * cap, sizeof(float));
    r->all = kvm_carve_take(g, n_sets * nb + 1, sizeof(float));
}

static kvmem_status retrieve_taken(kvmem_agent *agent, const kvmem_tensor *query, const kvmem_retrieve_params *params,
                            kvmem_retrieval *result) {
    kvmem_status st = kvm_agent_check(agent, "kvmem_retrieve");
    if (st != KVMEM_OK) return st;
    if ((st = check_result(result, "kvmem_retrieve")) != KVMEM_OK) return st;
    const kvmem_pool *p = agent->pool;
    const kvm_agent_mem *m = agent->mem;
    kvmem_retrieve_params prm = kvmem_retrieve_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_retrieve_params, &prm, params, "kvmem_retrieve")) != KVMEM_OK) return st;
    if ((st = kvm_params_reserved(prm.reserved, "kvmem_retrieve_params", "kvmem_retrieve")) != KVMEM_OK) return st;
    const int32_t nb = m->n_sealed, L = p->spec.n_layers;
    if ((st = check_params(&prm, nb)) != KVMEM_OK) return st;
    int32_t n_q = 0;
    if ((st = check_query(query, &p->spec, &n_q)) != KVMEM_OK) return st;
    const int32_t n_sets = prm.scope == KVMEM_SCOPE_GLOBAL ? 1 : L;
    const size_t q_floats = (size_t)n_q * (size_t)L * (size_t)p->spec.n_q_heads * (size_t)p->spec.head_dim;

    call_mem c;
    kvm_carve g = {NULL, 0, 0};
    call_layout(&g, &c, q_floats, (size_t)nb, (size_t)n_sets);
    void *base = g.overflow ? NULL : kvm_workbuf_get(&result->call, g.off);
    if (!base)
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for the query and the candidate lists of %d blocks", nb);
    g = (kvm_carve){base, 0, 0};
    call_layout(&g, &c, q_floats, (size_t)nb, (size_t)n_sets);
    if ((st = load_query(query, &p->spec, n_q, c.q)) != KVMEM_OK) return st;

    memset(c.flag, 0, (size_t)nb + 1);
    {
        int32_t lo = prm.recent_window > 0 ? KVM_MAX(0, nb - prm.recent_window) : 0;
        int32_t hi = nb - KVM_MIN(nb, prm.skip_recent);
        for (int32_t b = lo; b < hi; b++) c.flag[b] = 1;
        for (int32_t i = 0; i < prm.n_exclude; i++) c.flag[prm.exclude[i]] = 0;
        for (int32_t i = 0; i < prm.n_always_include; i++) c.flag[prm.always_include[i]] = 2;
    }
    int32_t nc = 0, n_forced = 0;
    for (int32_t b = 0; b < nb; b++)
        if (c.flag[b]) {
            c.cand[nc++] = b;
            n_forced += c.flag[b] == 2;
        }

    kvmem_retrieval nr;
    memset(&nr, 0, sizeof nr);
    nr.cap = KVM_MAX(1, KVM_MIN(nc, KVM_MAX(prm.top_k, n_forced)));
    g = (kvm_carve){NULL, 0, 0};
    result_layout(&g, &nr, (size_t)n_sets, (size_t)nr.cap, (size_t)nb);
    base = g.overflow ? NULL : kvm_workbuf_get(&result->spare, g.off);
    if (!base) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for the result of %d candidate blocks", nc);
    g = (kvm_carve){base, 0, 0};
    result_layout(&g, &nr, (size_t)n_sets, (size_t)nr.cap, (size_t)nb);

    if (nc > 0) {
        kvm_score_desc d;
        memset(&d, 0, sizeof d);
        d.pool = p;
        d.mem = m;
        d.q = c.q;
        d.n_q = n_q;
        d.cand = c.cand;
        d.n_cand = nc;
        d.mode = prm.mode;
        d.norm = prm.norm;
        d.agg = prm.agg;
        d.tau = prm.tau > 0 ? prm.tau : 1.0f / sqrtf((float)p->spec.head_dim);
        d.rr_c = prm.rr_c > 0 ? prm.rr_c : 60.0f;
        d.n_sets = n_sets;
        d.out = c.out;
        /* the router's choice: a device that takes the op scores there,
         * EXACT from the agent's resident keys (kvm_dev_aabb_score passes
         * them as key_rows: the shape says so with a placeholder) */
        static const kvmem_buffer *const resident_keys[1] = {NULL};
        kvm_dev_score_args shape;
        memset(&shape, 0, sizeof shape);
        shape.n_q = n_q;
        shape.n_blocks = nc;
        shape.n_layers = L;
        shape.n_q_heads = p->spec.n_q_heads;
        shape.n_kv_heads = p->spec.n_kv_heads;
        shape.head_dim = p->spec.head_dim;
        shape.norm = d.norm;
        shape.agg = d.agg;
        shape.tau = d.tau;
        shape.rr_c = d.rr_c;
        shape.mode = d.mode;
        if (d.mode == KVMEM_RETRIEVE_EXACT) {
            shape.key_rows = resident_keys;
            shape.block_rows = p->params.block_size;
        }
        kvmem_backend *cpu = p->ctx->cpu, *be = kvm_route(p->ctx, KVM_OP_SCORE, &shape);
        st = be != cpu ? kvm_dev_aabb_score(be, &d) : KVMEM_OK;
        if (be == cpu || kvm_route_to_cpu(st)) st = score_on_cpu(cpu, &d);
        if ((st = kvm_mapped_check(m, st, "kvmem_retrieve")) != KVMEM_OK) return st; /* before the commit */
        /* every backend: scores are finite, or the call is refused */
        if (kvm_cpu_kernels_get()->count_nonfinite(c.out, (size_t)n_sets * (size_t)nc)) return kvm_score_overflow(&d);
    }
    for (int32_t s = 0; s < n_sets; s++) {
        float *all = nr.all + (size_t)s * (size_t)nb;
        const float *so = c.out + (size_t)s * (size_t)nc;
        for (int32_t b = 0; b < nb; b++) all[b] = NAN;
        for (int32_t j = 0; j < nc; j++) {
            all[c.cand[j]] = so[j];
            c.set_s[j] = c.flag[c.cand[j]] == 2 ? NAN : so[j]; /* forced blocks are not ranked */
        }
        int32_t *sel = nr.blocks + (size_t)s * (size_t)nr.cap;
        float *ssc = nr.scores + (size_t)s * (size_t)nr.cap;
        int32_t n_sel = 0, n_top = 0;
        for (int32_t j = 0; j < nc; j++)
            if (c.flag[c.cand[j]] == 2) sel[n_sel++] = c.cand[j];
        kvmem_buffer vs, vi;
        kvmem_backend *cpu = p->ctx->cpu;
        kvm_dev_topk_args ta = {kvm_cpu_buffer_view(&vs, c.set_s, (size_t)nc * sizeof(float)),
                                kvm_cpu_buffer_view(&vi, c.idx, ((size_t)nb + 1) * sizeof(int32_t)),
                                0, 0, nc, KVM_MAX(0, prm.top_k - n_forced), &n_top};
        if ((st = cpu->iface->dev_topk(cpu, &ta)) != KVMEM_OK) return st;
        for (int32_t i = 0; i < n_top; i++) sel[n_sel++] = c.cand[c.idx[i]];
        qsort(sel, (size_t)n_sel, sizeof *sel, cmp_i32);
        int64_t tok = 0;
        for (int32_t i = 0; i < n_sel; i++) {
            ssc[i] = all[sel[i]];
            tok += m->blocks[sel[i]].n_tokens;
        }
        nr.count[s] = n_sel;
        nr.tokens[s] = tok;
    }
    /* Commit: only now does the result change (the arrays just filled
     * become the result's, its old ones the spare for the next call). */
    kvm_workbuf old = result->res;
    result->res = result->spare;
    result->spare = old;
    result->n_sets = n_sets;
    result->n_blocks = nb;
    result->cap = nr.cap;
    result->count = nr.count;
    result->blocks = nr.blocks;
    result->scores = nr.scores;
    result->tokens = nr.tokens;
    result->all = nr.all;
    return KVMEM_OK;
}

kvmem_status kvmem_retrieve(kvmem_agent *agent, const kvmem_tensor *query, const kvmem_retrieve_params *params,
                            kvmem_retrieval *result) {
    kvmem_status st = kvm_agent_enter(agent, "kvmem_retrieve");
    if (st != KVMEM_OK) return st;
    if (kvm_devt_is_device(query)) {
        /* a query in device memory (kvmem.h, "Device tensors") comes down
         * once: retrieval checks it on the host and scores it where it routes */
        kvm_devt dq;
        st = kvm_agent_check(agent, "kvmem_retrieve");
        if (st == KVMEM_OK && (st = kvm_devt_open(agent->pool->ctx, query, "kvmem_retrieve", "query", &dq)) == KVMEM_OK) {
            if ((st = kvm_devt_read(&dq, "kvmem_retrieve")) == KVMEM_OK)
                st = retrieve_taken(agent, kvm_devt_view(&dq), params, result);
            kvm_devt_close(&dq);
        }
    } else {
        st = retrieve_taken(agent, query, params, result);
    }
    kvm_agent_leave(agent);
    return st;
}

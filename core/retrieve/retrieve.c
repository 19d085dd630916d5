/* kvmem_retrieve and the kvmem_retrieval result object. */
#include "score.h"
#include "../tensor.h"

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
    kvm_free(r->count);
    kvm_free(r->blocks);
    kvm_free(r->scores);
    kvm_free(r->tokens);
    kvm_free(r->all);
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

/* Read the query into a contiguous f32 copy, rejecting non-finite values. */
static kvmem_status load_query(const kvmem_tensor *q, const kvmem_model_spec *s, float **out, int32_t *n_q) {
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
    size_t rows = (size_t)shape[0] * (size_t)s->n_layers * (size_t)s->n_q_heads, D = (size_t)s->head_dim, bytes;
    if (!kvm_mul_size(rows * D, sizeof(float), &bytes))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_retrieve: query too large");
    float *f = kvm_aligned_alloc(bytes);
    if (!f) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for a %zu-byte query", bytes);
    for (int64_t t = 0; t < shape[0]; t++)
        for (int64_t l = 0; l < shape[1]; l++)
            for (int64_t h = 0; h < shape[2]; h++) {
                int64_t idx[3] = {t, l, h};
                float *dst = f + (((size_t)t * (size_t)shape[1] + (size_t)l) * (size_t)shape[2] + (size_t)h) * D;
                kvm_tensor_read_f32(q, kvm_tensor_row_offset(q, idx), dst, D);
                for (size_t d = 0; d < D; d++)
                    if (!isfinite(dst[d])) {
                        float bad = dst[d];
                        kvm_aligned_free(f);
                        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                                        "kvmem_retrieve: query[%lld][%lld][%lld][%zu] = %g is not finite", (long long)t,
                                        (long long)l, (long long)h, d, (double)bad);
                    }
            }
    *out = f;
    *n_q = (int32_t)shape[0];
    return KVMEM_OK;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
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
    const int32_t nb = m->n_sealed, L = p->spec.n_layers, H = p->spec.n_kv_heads;
    if ((st = check_params(&prm, nb)) != KVMEM_OK) return st;
    float *q = NULL;
    int32_t n_q = 0;
    if ((st = load_query(query, &p->spec, &q, &n_q)) != KVMEM_OK) return st;

    const int32_t n_sets = prm.scope == KVMEM_SCOPE_GLOBAL ? 1 : L;
    /* Candidate flags: 1 candidate, 2 always included (scored too). */
    unsigned char *flag = kvm_calloc((size_t)nb + 1, 1);
    int32_t *cand = kvm_malloc(((size_t)nb + 1) * sizeof *cand);
    int32_t *idx = kvm_malloc(((size_t)nb + 1) * sizeof *idx);
    float *out = NULL, *set_s = kvm_malloc(((size_t)nb + 1) * sizeof *set_s);
    kvmem_retrieval nr;
    memset(&nr, 0, sizeof nr);
    nr.count = kvm_calloc((size_t)n_sets, sizeof *nr.count);
    nr.tokens = kvm_calloc((size_t)n_sets, sizeof *nr.tokens);
    nr.all = kvm_malloc(((size_t)n_sets * (size_t)nb + 1) * sizeof *nr.all);
    if (!flag || !cand || !idx || !set_s || !nr.count || !nr.tokens || !nr.all) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for the candidate lists of %d blocks", nb);
        goto done;
    }
    {
        int32_t lo = prm.recent_window > 0 ? KVM_MAX(0, nb - prm.recent_window) : 0;
        int32_t hi = nb - KVM_MIN(nb, prm.skip_recent);
        for (int32_t b = lo; b < hi; b++) flag[b] = 1;
        for (int32_t i = 0; i < prm.n_exclude; i++) flag[prm.exclude[i]] = 0;
        for (int32_t i = 0; i < prm.n_always_include; i++) flag[prm.always_include[i]] = 2;
    }
    int32_t nc = 0, n_forced = 0;
    for (int32_t b = 0; b < nb; b++)
        if (flag[b]) {
            cand[nc++] = b;
            n_forced += flag[b] == 2;
        }
    const size_t n_out = (size_t)L * (size_t)H * (size_t)nc;
    out = kvm_malloc((n_out + 1) * sizeof *out);
    nr.cap = KVM_MAX(1, KVM_MIN(nc, KVM_MAX(prm.top_k, n_forced)));
    nr.blocks = kvm_malloc((size_t)n_sets * (size_t)nr.cap * sizeof *nr.blocks);
    nr.scores = kvm_malloc((size_t)n_sets * (size_t)nr.cap * sizeof *nr.scores);
    if (!out || !nr.blocks || !nr.scores) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "kvmem_retrieve: out of memory for %d candidate blocks", nc);
        goto done;
    }
    if (nc > 0) {
        kvm_score_desc d;
        memset(&d, 0, sizeof d);
        d.pool = p;
        d.mem = m;
        d.q = q;
        d.n_q = n_q;
        d.cand = cand;
        d.n_cand = nc;
        d.mode = prm.mode;
        d.norm = prm.norm;
        d.agg = prm.agg;
        d.tau = prm.tau > 0 ? prm.tau : 1.0f / sqrtf((float)p->spec.head_dim);
        d.rr_c = prm.rr_c > 0 ? prm.rr_c : 60.0f;
        d.out = out;
        /* AABB scoring runs on a device backend that has the kernel; EXACT
         * reads every key and stays on the CPU. */
        kvmem_backend *dev = p->ctx->backend, *be = p->ctx->cpu;
        if (dev && dev != be && dev->iface->dev_score && d.mode == KVMEM_RETRIEVE_AABB)
            st = kvm_dev_aabb_score(dev, &d);
        else
            st = be->iface->aabb_score(be, &d);
        if (st != KVMEM_OK) goto done;
    }
    for (int32_t s = 0; s < n_sets; s++) {
        float *all = nr.all + (size_t)s * (size_t)nb;
        for (int32_t b = 0; b < nb; b++) all[b] = NAN;
        /* GLOBAL: sum over layers and KV heads; PER_LAYER: over the layer's heads. */
        int32_t l0 = n_sets == 1 ? 0 : s, l1 = n_sets == 1 ? L : s + 1;
        for (int32_t j = 0; j < nc; j++) {
            double acc = 0;
            for (int32_t l = l0; l < l1; l++)
                for (int32_t g = 0; g < H; g++) acc += out[((size_t)l * (size_t)H + (size_t)g) * (size_t)nc + (size_t)j];
            all[cand[j]] = (float)acc;
            set_s[j] = flag[cand[j]] == 2 ? NAN : (float)acc; /* forced blocks are not ranked */
        }
        int32_t *sel = nr.blocks + (size_t)s * (size_t)nr.cap;
        float *ssc = nr.scores + (size_t)s * (size_t)nr.cap;
        int32_t n_sel = 0, n_top = 0;
        for (int32_t j = 0; j < nc; j++)
            if (flag[cand[j]] == 2) sel[n_sel++] = cand[j];
        kvmem_backend *be = p->ctx->cpu;
        if ((st = be->iface->topk(be, set_s, nc, KVM_MAX(0, prm.top_k - n_forced), idx, &n_top)) != KVMEM_OK) goto done;
        for (int32_t i = 0; i < n_top; i++) sel[n_sel++] = cand[idx[i]];
        qsort(sel, (size_t)n_sel, sizeof *sel, cmp_i32);
        int64_t tok = 0;
        for (int32_t i = 0; i < n_sel; i++) {
            ssc[i] = all[sel[i]];
            tok += m->blocks[sel[i]].n_tokens;
        }
        nr.count[s] = n_sel;
        nr.tokens[s] = tok;
    }
    /* Commit: only now does the result change. */
    nr.magic = KVM_RETRIEVAL_MAGIC;
    nr.n_sets = n_sets;
    nr.n_blocks = nb;
    release(result);
    *result = nr;
    memset(&nr, 0, sizeof nr);
    st = KVMEM_OK;
done:
    release(&nr);
    kvm_free(flag);
    kvm_free(cand);
    kvm_free(idx);
    kvm_free(out);
    kvm_free(set_s);
    kvm_aligned_free(q);
    return st;
}

kvmem_status kvmem_retrieve(kvmem_agent *agent, const kvmem_tensor *query, const kvmem_retrieve_params *params,
                            kvmem_retrieval *result) {
    kvmem_status st = kvm_agent_enter(agent, "kvmem_retrieve");
    if (st != KVMEM_OK) return st;
    st = retrieve_taken(agent, query, params, result);
    kvm_agent_leave(agent);
    return st;
}

/* QueryMemory: the LRU store of session memories, session keys, the
 * per-turn update and the public rule-score entry point. */
#include "qmem_internal.h"
#include "../cpu/cpu_backend.h"

#include "../backend/route/route.h"
#include "../cpu/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct qm_entry {
    kvmem_session_key key;
    uint64_t stamp; /* last use; the smallest is evicted first */
    float *m;       /* [n_layers][n_q_heads][head_dim] */
} qm_entry;

struct kvmem_qmem_store {
    kvmem_model_spec spec; /* geometry only: layer_window is NULL */
    kvmem_qmem_params params;
    size_t mem_elems;
    pthread_mutex_t mu; /* entries, n, clock */
    qm_entry *e;
    int32_t n;
    uint64_t clock;
};

kvmem_status kvmem_qmem_params_init(kvmem_qmem_params *params, size_t struct_size) {
    kvmem_qmem_params p;
    memset(&p, 0, sizeof p);
    p.capacity = 1024;
    p.prefix_tokens = 256;
    p.lambda = 0.5;
    return KVM_PARAMS_INIT(kvmem_qmem_params, params, struct_size, &p, "kvmem_qmem_params_init");
}

kvmem_status kvmem_qmem_store_create(const kvmem_model_spec *spec, const kvmem_qmem_params *params,
                                     kvmem_qmem_store **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_store_create: out is NULL");
    if (!spec) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_store_create: spec is NULL");
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    kvmem_qmem_params p = kvmem_qmem_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_qmem_params, &p, params, "kvmem_qmem_store_create")) != KVMEM_OK) return st;
    if (p.capacity < 1 || p.capacity > (1 << 24))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "qmem capacity %d: must be in [1, %d]", p.capacity, 1 << 24);
    if (p.prefix_tokens < 1)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "qmem prefix_tokens %d: must be >= 1", p.prefix_tokens);
    if (!(p.lambda >= 0.0) || !isfinite(p.lambda))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "qmem lambda %g: must be finite and >= 0", p.lambda);
    kvmem_qmem_store *s = kvm_calloc(1, sizeof *s);
    if (!s) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_qmem_store_create: out of memory for the store");
    s->e = kvm_calloc((size_t)p.capacity, sizeof *s->e);
    if (!s->e || pthread_mutex_init(&s->mu, NULL) != 0) {
        kvm_free(s->e);
        kvm_free(s);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_qmem_store_create: out of memory for %d memories", p.capacity);
    }
    s->spec = *spec;
    s->spec.layer_window = NULL;
    s->params = p;
    s->mem_elems = (size_t)spec->n_layers * (size_t)spec->n_q_heads * (size_t)spec->head_dim;
    *out = s;
    return KVMEM_OK;
}

void kvmem_qmem_store_free(kvmem_qmem_store *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n; i++) kvm_free(s->e[i].m);
    kvm_free(s->e);
    pthread_mutex_destroy(&s->mu);
    kvm_free(s);
}

int32_t kvmem_qmem_count(const kvmem_qmem_store *s) {
    if (!s) return 0;
    kvmem_qmem_store *w = (kvmem_qmem_store *)(uintptr_t)s; /* the lock only */
    pthread_mutex_lock(&w->mu);
    int32_t n = w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}

/* 128-bit key: two independently seeded 64-bit multiply-xor streams with
 * the kind folded into the seed, so a session id and a token span never
 * collide by construction. Token ids are fed as little-endian bytes, so keys
 * agree across hosts. */
typedef struct {
    uint64_t a, b, n;
} h128;

static void h_init(h128 *h, uint32_t kind) {
    h->a = 0xcbf29ce484222325ull ^ kind;
    h->b = 0x84222325cbf29ce4ull ^ ((uint64_t)kind << 32);
    h->n = 0;
}

static void h_byte(h128 *h, unsigned char c) {
    h->a = (h->a ^ c) * 0x100000001b3ull;
    h->b = (h->b ^ c) * 0x9e3779b97f4a7c15ull;
    h->b ^= h->b >> 29;
    h->n++;
}

static void h_fin(h128 *h, uint64_t *hi, uint64_t *lo) {
    uint64_t a = h->a ^ h->n, b = h->b ^ (h->n * 0xbf58476d1ce4e5b9ull);
    a = (a ^ (a >> 30)) * 0xbf58476d1ce4e5b9ull;
    a = (a ^ (a >> 27)) * 0x94d049bb133111ebull;
    b = (b ^ (b >> 31)) * 0x94d049bb133111ebull;
    *hi = a ^ (a >> 31);
    *lo = b ^ (b >> 29);
}

static void hash_bytes(const char *p, size_t n, uint32_t kind, uint64_t *hi, uint64_t *lo) {
    h128 h;
    h_init(&h, kind);
    for (size_t i = 0; i < n; i++) h_byte(&h, (unsigned char)p[i]);
    h_fin(&h, hi, lo);
}

static void hash_tokens(const int32_t *t, int64_t n, uint32_t kind, uint64_t *hi, uint64_t *lo) {
    h128 h;
    h_init(&h, kind);
    for (int64_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)t[i];
        for (int s = 0; s < 32; s += 8) h_byte(&h, (unsigned char)(v >> s));
    }
    h_fin(&h, hi, lo);
}

static _Atomic uint64_t g_local_counter = 1;

kvmem_status kvmem_session_key_derive(const kvmem_qmem_store *s, const kvmem_session_source *src,
                                      kvmem_session_key *out) {
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: store is NULL");
    if (!src) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: src is NULL");
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: out is NULL");
    if (src->n_tokens < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: n_tokens %lld is negative",
                        (long long)src->n_tokens);
    if (src->n_tokens > 0 && !src->token_ids)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: token_ids is NULL with n_tokens %lld",
                        (long long)src->n_tokens);
    int marked = src->mark_end != src->mark_begin;
    if (marked && (src->mark_begin < 0 || src->mark_end < src->mark_begin || src->mark_end > src->n_tokens))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_session_key_derive: marked span [%lld, %lld) outside [0, %lld)",
                        (long long)src->mark_begin, (long long)src->mark_end, (long long)src->n_tokens);
    kvmem_session_key k;
    memset(&k, 0, sizeof k);
    if (src->session_id && src->session_id[0]) {
        k.kind = KVMEM_SESSION_EXPLICIT;
        hash_bytes(src->session_id, strlen(src->session_id), (uint32_t)k.kind, &k.hi, &k.lo);
    } else if (marked) {
        k.kind = KVMEM_SESSION_MARKED;
        hash_tokens(src->token_ids + src->mark_begin, src->mark_end - src->mark_begin, (uint32_t)k.kind, &k.hi,
                    &k.lo);
    } else if (src->n_tokens >= s->params.prefix_tokens) {
        k.kind = KVMEM_SESSION_PREFIX;
        hash_tokens(src->token_ids, s->params.prefix_tokens, (uint32_t)k.kind, &k.hi, &k.lo);
    } else {
        k.kind = KVMEM_SESSION_LOCAL;
        k.hi = atomic_fetch_add(&g_local_counter, 1);
        k.lo = 0x4c4f43414cull; /* "LOCAL" */
    }
    *out = k;
    return KVMEM_OK;
}

static kvmem_status check_key(const char *fn, const kvmem_session_key *key) {
    if (!key) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: key is NULL", fn);
    if (key->kind < KVMEM_SESSION_EXPLICIT || key->kind > KVMEM_SESSION_LOCAL)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: key kind %d is not a kvmem_session_kind", fn, (int)key->kind);
    return KVMEM_OK;
}

static int key_eq(const kvmem_session_key *a, const kvmem_session_key *b) {
    return a->kind == b->kind && a->hi == b->hi && a->lo == b->lo;
}

/* Index of key in the store, or -1. Called with the lock held. */
static int32_t find(const kvmem_qmem_store *s, const kvmem_session_key *key) {
    if (key->kind == KVMEM_SESSION_LOCAL) return -1;
    for (int32_t i = 0; i < s->n; i++)
        if (key_eq(&s->e[i].key, key)) return i;
    return -1;
}

kvmem_status kvmem_qmem_update(kvmem_qmem_store *s, const kvmem_session_key *key, const kvmem_tensor *q,
                               int64_t span_begin, int64_t span_end, float *memory_out) {
    static const char fn[] = "kvmem_qmem_update";
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: store is NULL", fn);
    kvmem_status st = check_key(fn, key);
    if (st != KVMEM_OK) return st;
    if (!q) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q is NULL", fn);
    if (q->ndim != 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q has %d dims, expected 4 [n_q][n_layers][n_q_heads][head_dim]",
                        fn, q->ndim);
    const kvmem_model_spec *sp = &s->spec;
    int64_t shape[4] = {q->shape[0], sp->n_layers, sp->n_q_heads, sp->head_dim};
    st = kvm_tensor_expect(q, "q", "[n_q][n_layers][n_q_heads][head_dim]", 4, shape);
    if (st != KVMEM_OK) return st;
    if (span_begin < 0 || span_end <= span_begin || span_end > q->shape[0])
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: query span [%lld, %lld) is empty or outside [0, %lld)", fn,
                        (long long)span_begin, (long long)span_end, (long long)q->shape[0]);

    const size_t L = (size_t)sp->n_layers, H = (size_t)sp->n_q_heads, D = (size_t)sp->head_dim;
    const size_t E = s->mem_elems;
    double *acc = kvm_calloc(E, sizeof *acc);
    float *row = kvm_malloc(D * sizeof *row), *m = kvm_malloc(E * sizeof *m);
    if (!acc || !row || !m) {
        kvm_free(acc);
        kvm_free(row);
        kvm_free(m);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the new memory (%zu floats)", fn, E);
    }
    /* Enc: the mean of the span's rows, in double so long spans do not drift. */
    for (int64_t t = span_begin; t < span_end; t++)
        for (size_t l = 0; l < L; l++)
            for (size_t h = 0; h < H; h++) {
                int64_t idx[3] = {t, (int64_t)l, (int64_t)h};
                kvm_tensor_read_f32(q, kvm_tensor_row_offset(q, idx), row, D);
                double *a = acc + (l * H + h) * D;
                for (size_t d = 0; d < D; d++) {
                    if (!isfinite(row[d])) {
                        kvm_free(acc);
                        kvm_free(row);
                        kvm_free(m);
                        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q[%lld][%zu][%zu][%zu] is not finite", fn,
                                        (long long)t, l, h, d);
                    }
                    a[d] += row[d];
                }
            }
    const double inv_n = 1.0 / (double)(span_end - span_begin);
    const double decay = exp(-s->params.lambda);
    kvm_free(row);

    pthread_mutex_lock(&s->mu);
    int32_t i = find(s, key);
    const float *prev = i >= 0 ? s->e[i].m : NULL;
    for (size_t r = 0; r < L * H; r++) {
        double *a = acc + r * D, nrm = 0.0;
        for (size_t d = 0; d < D; d++) {
            a[d] = a[d] * inv_n + (prev ? decay * (double)prev[r * D + d] : 0.0);
            nrm += a[d] * a[d];
        }
        nrm = sqrt(nrm);
        for (size_t d = 0; d < D; d++) m[r * D + d] = (float)(nrm > 0.0 ? a[d] / nrm : 0.0);
    }
    kvm_free(acc);
    if (memory_out) memcpy(memory_out, m, E * sizeof *m);
    if (key->kind == KVMEM_SESSION_LOCAL) {
        pthread_mutex_unlock(&s->mu);
        kvm_free(m);
        return KVMEM_OK;
    }
    if (i >= 0) {
        kvm_free(s->e[i].m);
    } else if (s->n < s->params.capacity) {
        i = s->n++;
    } else { /* evict the least recently used */
        i = 0;
        for (int32_t j = 1; j < s->n; j++)
            if (s->e[j].stamp < s->e[i].stamp) i = j;
        kvm_free(s->e[i].m);
    }
    s->e[i].key = *key;
    s->e[i].m = m;
    s->e[i].stamp = ++s->clock;
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}

kvmem_status kvmem_qmem_get(kvmem_qmem_store *s, const kvmem_session_key *key, float *out) {
    static const char fn[] = "kvmem_qmem_get";
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: store is NULL", fn);
    kvmem_status st = check_key(fn, key);
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: out is NULL", fn);
    pthread_mutex_lock(&s->mu);
    int32_t i = find(s, key);
    if (i < 0) {
        pthread_mutex_unlock(&s->mu);
        return kvm_fail(KVMEM_ERR_NOT_FOUND, "%s: no memory for this session (never updated, evicted, or local)", fn);
    }
    memcpy(out, s->e[i].m, s->mem_elems * sizeof *out);
    s->e[i].stamp = ++s->clock;
    pthread_mutex_unlock(&s->mu);
    return KVMEM_OK;
}

kvmem_status kvm_qmem_check_k(const char *fn, const kvmem_model_spec *spec, const kvmem_tensor *k,
                              int64_t *n) {
    if (!spec) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: spec is NULL", fn);
    kvmem_status st = kvmem_model_spec_validate(spec);
    if (st != KVMEM_OK) return st;
    if (!k) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K is NULL", fn);
    if (k->ndim != 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K has %d dims, expected 4 [n_layers][N][n_kv_heads][head_dim]",
                        fn, k->ndim);
    if (k->shape[1] < 1 || k->shape[1] > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K has N = %lld candidates, expected [1, INT32_MAX]", fn,
                        (long long)k->shape[1]);
    int64_t shape[4] = {spec->n_layers, k->shape[1], spec->n_kv_heads, spec->head_dim};
    st = kvm_tensor_expect(k, "K", "[n_layers][N][n_kv_heads][head_dim]", 4, shape);
    if (st != KVMEM_OK) return st;
    *n = k->shape[1];
    return KVMEM_OK;
}

/* The rule score on a device backend (dev_qmem_score): K converted to a
 * contiguous f32 host array [L][N][Hkv][D] (any dtype and strides), memory
 * and K uploaded, the scores read back into a scratch copy so a failure
 * leaves the caller's array unchanged. */
static kvmem_status qmem_score_device(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                                      const kvmem_tensor *k, size_t N, float *scores) {
    static const char fn[] = "kvmem_qmem_score";
    const size_t L = (size_t)spec->n_layers, Hq = (size_t)spec->n_q_heads, Hkv = (size_t)spec->n_kv_heads,
                 D = (size_t)spec->head_dim;
    size_t mb = L * Hq * D * sizeof(float), kb, rows;
    if (!kvm_mul_size(L * N, Hkv, &rows) || !kvm_mul_size(rows, D * sizeof(float), &kb) || N > INT32_MAX)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED, "%s: K too large for the device path", fn);
    float *kh = kvm_malloc(kb), *out = kvm_malloc(N * sizeof *out);
    if (!kh || !out) {
        kvm_free(kh);
        kvm_free(out);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %zu bytes to stage K", fn, kb);
    }
    for (size_t l = 0; l < L; l++)
        for (size_t j = 0; j < N; j++)
            for (size_t g = 0; g < Hkv; g++) {
                int64_t idx[3] = {(int64_t)l, (int64_t)j, (int64_t)g};
                kvm_tensor_read_f32(k, kvm_tensor_row_offset(k, idx), kh + ((l * N + j) * Hkv + g) * D, D);
            }
    /* the staged copy is scanned (a pass over what is uploaded anyway): a
     * device's exp may turn a NaN logit into a plausible score */
    if (kvm_cpu_kernels_get()->count_nonfinite(kh, rows * D)) {
        kvm_free(kh);
        kvm_free(out);
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K holds a non-finite value", fn);
    }
    kvm_stage s[3] = {{KVM_STAGE_IN, (void *)(uintptr_t)memory, mb, NULL, NULL, {0, NULL}},
                      {KVM_STAGE_IN, kh, kb, NULL, NULL, {0, NULL}},
                      {KVM_STAGE_OUT, out, N * sizeof(float), NULL, NULL, {0, NULL}}};
    kvmem_status st = kvm_stage_begin(be, fn, s, 3);
    if (st == KVMEM_OK) {
        kvm_dev_qmem_args a = {s[0].buf, s[1].buf, s[2].buf, 0, 0, 0, spec->n_layers, spec->n_q_heads, spec->n_kv_heads,
                               spec->head_dim, (int32_t)N, NULL};
        st = be->iface->dev_qmem_score(be, &a);
        if (st != KVMEM_OK) st = kvm_route_failed(be, fn, st);
        st = kvm_stage_end(be, fn, s, 3, st);
    }
    if (st == KVMEM_OK) memcpy(scores, out, N * sizeof(float));
    kvm_free(kh);
    kvm_free(out);
    return st;
}

static kvmem_status qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec, const float *memory,
                               const kvmem_tensor *k, float *scores) {
    static const char fn[] = "kvmem_qmem_score";
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t n;
    kvmem_status st = kvm_qmem_check_k(fn, spec, k, &n);
    if (st != KVMEM_OK) return st;
    if (!memory) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: memory is NULL", fn);
    if (!scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores is NULL", fn);
    size_t E = (size_t)spec->n_layers * (size_t)spec->n_q_heads * (size_t)spec->head_dim;
    for (size_t i = 0; i < E; i++)
        if (!isfinite(memory[i]))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: memory[%zu] is not finite", fn, i);
    /* the CPU backend's form: the caller's K in place (a device's: K packed) */
    kvmem_buffer vm, vs;
    kvm_dev_qmem_args a = {kvm_cpu_buffer_view(&vm, memory, E * sizeof(float)), NULL,
                           kvm_cpu_buffer_view(&vs, scores, (size_t)n * sizeof(float)), 0, 0, 0, spec->n_layers,
                           spec->n_q_heads, spec->n_kv_heads, spec->head_dim, (int32_t)n, NULL};
    kvmem_backend *be = kvm_route(ctx, KVM_OP_QMEM_SCORE, &a);
    if (be != ctx->cpu) {
        st = qmem_score_device(be, spec, memory, k, (size_t)n, scores);
        if (!kvm_route_to_cpu(st)) return st;
    }
    a.k_view = k;
    return ctx->cpu->iface->dev_qmem_score(ctx->cpu, &a);
}

kvmem_status kvmem_qmem_score(kvmem_context *ctx, const kvmem_model_spec *spec, const float *memory,
                              const kvmem_tensor *k, float *scores) {
    int own = ctx ? kvm_err_begin(&ctx->err) : 0; /* failures are the context's last error too */
    kvmem_status st = qmem_score(ctx, spec, memory, k, scores);
    kvm_err_end(own);
    return st;
}

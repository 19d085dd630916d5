/* QueryMemory store: session keys in DESIGN.md's order, the per-turn update
 * against a double-precision reference, LRU order, session isolation, bad
 * input leaving the store unchanged, concurrent use. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define L 2
#define HQ 4
#define D 8
#define E (L * HQ * D)

static kvmem_qmem_store *mkstore(int32_t cap) {
    kvmem_model_spec s = tu_spec(L, D);
    kvmem_qmem_params p = kvmem_qmem_default_params();
    p.capacity = cap;
    p.prefix_tokens = 4;
    kvmem_qmem_store *st = NULL;
    assert_ok(kvmem_qmem_store_create(&s, &p, &st));
    return st;
}

static kvmem_session_key named(kvmem_qmem_store *st, const char *id) {
    kvmem_session_source src = {id, NULL, 0, 0, 0};
    kvmem_session_key k;
    assert_ok(kvmem_session_key_derive(st, &src, &k));
    return k;
}

/* q: [T][L][HQ][D] */
static void update(kvmem_qmem_store *st, const kvmem_session_key *k, float *q, int64_t T, int64_t b, int64_t e,
                   float *out) {
    kvmem_tensor t;
    int64_t shape[4] = {T, L, HQ, D};
    assert_ok(kvmem_tensor_init(&t, q, KVMEM_F32, 4, shape));
    assert_ok(kvmem_qmem_update(st, k, &t, b, e, out));
}

static void defaults_are_the_papers(void **state) {
    (void)state;
    kvmem_qmem_params p = kvmem_qmem_default_params();
    assert_int_equal(p.capacity, 1024);
    assert_int_equal(p.prefix_tokens, 256);
    assert_true(p.lambda == 0.5);
}

static void key_order_explicit_then_marked_then_prefix_then_local(void **state) {
    (void)state;
    kvmem_qmem_store *st = mkstore(8);
    int32_t toks[6] = {5, 6, 7, 8, 9, 10}, toks2[6] = {5, 6, 7, 8, 1, 2}, other[6] = {1, 6, 7, 8, 9, 10};
    kvmem_session_key a, b, c;
    /* explicit id wins over everything else */
    kvmem_session_source s1 = {"alice", toks, 6, 1, 3};
    assert_ok(kvmem_session_key_derive(st, &s1, &a));
    assert_int_equal(a.kind, KVMEM_SESSION_EXPLICIT);
    kvmem_session_source s2 = {"alice", other, 6, 0, 0};
    assert_ok(kvmem_session_key_derive(st, &s2, &b));
    assert_true(a.hi == b.hi && a.lo == b.lo); /* depends on the id only */
    s2.session_id = "bob";
    assert_ok(kvmem_session_key_derive(st, &s2, &b));
    assert_false(a.hi == b.hi && a.lo == b.lo);
    /* marked span next: same span content, different rest -> same key */
    kvmem_session_source m1 = {NULL, toks, 6, 1, 3}, m2 = {"", other, 6, 1, 3};
    assert_ok(kvmem_session_key_derive(st, &m1, &a));
    assert_ok(kvmem_session_key_derive(st, &m2, &b));
    assert_int_equal(a.kind, KVMEM_SESSION_MARKED);
    assert_true(a.kind == b.kind && a.hi == b.hi && a.lo == b.lo);
    /* prefix of P = 4 tokens next */
    kvmem_session_source p1 = {NULL, toks, 6, 0, 0}, p2 = {NULL, toks2, 6, 0, 0}, p3 = {NULL, other, 6, 0, 0};
    assert_ok(kvmem_session_key_derive(st, &p1, &a));
    assert_ok(kvmem_session_key_derive(st, &p2, &b));
    assert_ok(kvmem_session_key_derive(st, &p3, &c));
    assert_int_equal(a.kind, KVMEM_SESSION_PREFIX);
    assert_true(a.hi == b.hi && a.lo == b.lo);   /* same first 4 ids */
    assert_false(a.hi == c.hi && a.lo == c.lo);  /* first id differs */
    /* a marked span with the same ids as a prefix is still a different key */
    kvmem_session_source m3 = {NULL, toks, 6, 0, 4};
    assert_ok(kvmem_session_key_derive(st, &m3, &b));
    assert_false(a.kind == b.kind && a.hi == b.hi && a.lo == b.lo);
    /* too short for a prefix: request-local, unique every time */
    kvmem_session_source l1 = {NULL, toks, 3, 0, 0};
    assert_ok(kvmem_session_key_derive(st, &l1, &a));
    assert_ok(kvmem_session_key_derive(st, &l1, &b));
    assert_int_equal(a.kind, KVMEM_SESSION_LOCAL);
    assert_false(a.hi == b.hi && a.lo == b.lo);
    kvmem_qmem_store_free(st);
}

/* Reference of one update in double. */
static void ref_update(const double *prev, const float *q, int64_t b, int64_t e, double lambda, double *out) {
    for (int r = 0; r < L * HQ; r++) {
        double nrm = 0;
        for (int d = 0; d < D; d++) {
            double s = 0;
            for (int64_t t = b; t < e; t++) s += q[(size_t)t * E + (size_t)r * D + (size_t)d];
            double v = s / (double)(e - b) + (prev ? exp(-lambda) * prev[r * D + d] : 0.0);
            out[r * D + d] = v;
            nrm += v * v;
        }
        nrm = sqrt(nrm);
        for (int d = 0; d < D; d++) out[r * D + d] = nrm > 0 ? out[r * D + d] / nrm : 0.0;
    }
}

static void update_is_decayed_mean_projected_to_unit_norm(void **state) {
    (void)state;
    uint64_t rng = 11;
    kvmem_qmem_store *st = mkstore(4);
    kvmem_session_key k = named(st, "s");
    enum { T = 6 };
    float q1[T * E], q2[T * E], got[E];
    for (int i = 0; i < T * E; i++) {
        q1[i] = tu_normal(&rng);
        q2[i] = tu_normal(&rng) + 0.5f;
    }
    double m1[E], m2[E];
    ref_update(NULL, q1, 1, 4, 0.5, m1);
    update(st, &k, q1, T, 1, 4, got);
    for (int i = 0; i < E; i++) assert_true(fabs(got[i] - m1[i]) < 1e-6);
    double m1f[E];
    for (int i = 0; i < E; i++) m1f[i] = got[i]; /* the stored memory is f32 */
    ref_update(m1f, q2, 2, 6, 0.5, m2);
    update(st, &k, q2, T, 2, 6, NULL);
    assert_ok(kvmem_qmem_get(st, &k, got));
    for (int i = 0; i < E; i++) assert_true(fabs(got[i] - m2[i]) < 1e-6);
    for (int r = 0; r < L * HQ; r++) {
        double n = 0;
        for (int d = 0; d < D; d++) n += (double)got[r * D + d] * got[r * D + d];
        assert_true(fabs(n - 1.0) < 1e-5);
    }
    /* the hand case: one row, M_1 = e1, Enc = e2 -> (e^-0.5 e1 + e2) / norm */
    float a[E] = {0}, b[E] = {0};
    for (int r = 0; r < L * HQ; r++) {
        a[r * D + 0] = 3.0f;
        b[r * D + 1] = 2.0f;
    }
    kvmem_session_key h = named(st, "hand");
    update(st, &h, a, 1, 0, 1, got);
    assert_true(got[0] == 1.0f && got[1] == 0.0f);
    update(st, &h, b, 1, 0, 1, got);
    double w = exp(-0.5), nn = sqrt(w * w + 4.0);
    assert_true(fabs(got[0] - w / nn) < 1e-7 && fabs(got[1] - 2.0 / nn) < 1e-7);
    /* a zero encoding stays zero, no division by zero */
    float z[E] = {0};
    kvmem_session_key zk = named(st, "zero");
    update(st, &zk, z, 1, 0, 1, got);
    for (int i = 0; i < E; i++) assert_true(got[i] == 0.0f);
    kvmem_qmem_store_free(st);
}

static void f16_queries_and_strided_views(void **state) {
    (void)state;
    uint64_t rng = 5;
    kvmem_qmem_store *st = mkstore(4);
    kvmem_session_key k = named(st, "x");
    enum { T = 3 };
    float q[T * E], got[E];
    uint16_t h[T * E];
    for (int i = 0; i < T * E; i++) q[i] = tu_normal(&rng);
    /* values that are multiples of 1/64 below 8 are exact in f16: encode by hand */
    for (int i = 0; i < T * E; i++) q[i] = roundf(q[i] * 64.0f) / 64.0f;
    for (int i = 0; i < T * E; i++) {
        /* q is a multiple of 1/64 below 8 in magnitude: exact in f16 */
        float a = fabsf(q[i]);
        int e = 0;
        float m = frexpf(a, &e);
        uint16_t sign = q[i] < 0 ? 0x8000 : 0;
        if (a == 0.0f) h[i] = sign;
        else {
            int ex = e - 1 + 15;
            uint16_t mant = (uint16_t)lroundf((m * 2.0f - 1.0f) * 1024.0f);
            h[i] = (uint16_t)(sign | (ex << 10) | mant);
        }
    }
    kvmem_tensor t;
    int64_t shape[4] = {T, L, HQ, D};
    assert_ok(kvmem_tensor_init(&t, h, KVMEM_F16, 4, shape));
    assert_ok(kvmem_qmem_update(st, &k, &t, 0, T, got));
    double ref[E];
    ref_update(NULL, q, 0, T, 0.5, ref);
    for (int i = 0; i < E; i++) assert_true(fabs(got[i] - ref[i]) < 1e-6);
    /* a padded, strided f32 view of the same rows gives the same memory */
    enum { P = D + 3 };
    float *pad = calloc((size_t)T * L * HQ * P, sizeof *pad);
    assert_non_null(pad);
    for (int t2 = 0; t2 < T; t2++)
        for (int r = 0; r < L * HQ; r++)
            for (int d = 0; d < D; d++) pad[((size_t)t2 * L * HQ + (size_t)r) * P + (size_t)d] = q[t2 * E + r * D + d];
    kvmem_tensor sv;
    assert_ok(kvmem_tensor_init(&sv, pad, KVMEM_F32, 4, shape));
    sv.strides[2] = P;
    sv.strides[1] = (int64_t)HQ * P;
    sv.strides[0] = (int64_t)L * HQ * P;
    kvmem_session_key k2 = named(st, "y");
    float got2[E];
    assert_ok(kvmem_qmem_update(st, &k2, &sv, 0, T, got2));
    for (int i = 0; i < E; i++) assert_true(fabs(got2[i] - ref[i]) < 1e-6);
    free(pad);
    kvmem_qmem_store_free(st);
}

static void lru_drops_the_least_recently_used(void **state) {
    (void)state;
    kvmem_qmem_store *st = mkstore(3);
    float q[E], got[E];
    for (int i = 0; i < E; i++) q[i] = (float)(i % 5) - 2.0f;
    kvmem_session_key a = named(st, "a"), b = named(st, "b"), c = named(st, "c"), d = named(st, "d");
    update(st, &a, q, 1, 0, 1, NULL);
    update(st, &b, q, 1, 0, 1, NULL);
    update(st, &c, q, 1, 0, 1, NULL);
    assert_int_equal(kvmem_qmem_count(st), 3);
    assert_ok(kvmem_qmem_get(st, &a, got)); /* a is now the most recent; b the least */
    update(st, &d, q, 1, 0, 1, NULL);
    assert_int_equal(kvmem_qmem_count(st), 3);
    assert_status(kvmem_qmem_get(st, &b, got), KVMEM_ERR_NOT_FOUND, "no memory");
    assert_ok(kvmem_qmem_get(st, &a, got));
    assert_ok(kvmem_qmem_get(st, &c, got));
    assert_ok(kvmem_qmem_get(st, &d, got));
    /* order now (old -> new): a, c, d ... get(a), get(c), get(d) -> a oldest */
    kvmem_session_key e = named(st, "e");
    update(st, &e, q, 1, 0, 1, NULL);
    assert_status(kvmem_qmem_get(st, &a, got), KVMEM_ERR_NOT_FOUND, "no memory");
    /* an evicted session starts again from zero: no decayed ghost of the old memory */
    float q2[E];
    for (int i = 0; i < E; i++) q2[i] = (i % 3 == 0) ? 1.0f : 0.0f;
    update(st, &b, q2, 1, 0, 1, got);
    double ref[E];
    ref_update(NULL, q2, 0, 1, 0.5, ref);
    for (int i = 0; i < E; i++) assert_true(fabs(got[i] - ref[i]) < 1e-7);
    kvmem_qmem_store_free(st);
}

static void sessions_never_share_a_memory(void **state) {
    (void)state;
    uint64_t rng = 3;
    kvmem_qmem_store *st = mkstore(8);
    kvmem_session_key a = named(st, "a"), b = named(st, "b");
    float qa[E], qb[E], ga[E], gb[E], ref_a[E];
    for (int i = 0; i < E; i++) {
        qa[i] = tu_normal(&rng);
        qb[i] = tu_normal(&rng);
    }
    update(st, &a, qa, 1, 0, 1, ref_a);
    for (int t = 0; t < 5; t++) update(st, &b, qb, 1, 0, 1, NULL);
    assert_ok(kvmem_qmem_get(st, &a, ga));
    assert_memory_equal(ga, ref_a, sizeof ga); /* b's turns never touched a */
    assert_ok(kvmem_qmem_get(st, &b, gb));
    assert_memory_not_equal(ga, gb, sizeof ga);
    /* local keys are never stored and never found */
    int32_t toks[2] = {1, 2};
    kvmem_session_source src = {NULL, toks, 2, 0, 0};
    kvmem_session_key l1;
    assert_ok(kvmem_session_key_derive(st, &src, &l1));
    int32_t before = kvmem_qmem_count(st);
    float gl[E];
    update(st, &l1, qb, 1, 0, 1, gl);
    assert_int_equal(kvmem_qmem_count(st), before);
    assert_status(kvmem_qmem_get(st, &l1, ga), KVMEM_ERR_NOT_FOUND, "local");
    /* a second update of the same local key does not decay into the first */
    float gl2[E];
    update(st, &l1, qa, 1, 0, 1, gl2);
    assert_memory_equal(gl2, ref_a, sizeof gl2);
    kvmem_qmem_store_free(st);
}

static void bad_input_changes_nothing(void **state) {
    (void)state;
    kvmem_model_spec s = tu_spec(L, D);
    kvmem_qmem_params p = kvmem_qmem_default_params();
    kvmem_qmem_store *st = NULL;
    assert_status(kvmem_qmem_store_create(NULL, &p, &st), KVMEM_ERR_INVALID_ARG, "spec is NULL");
    assert_status(kvmem_qmem_store_create(&s, &p, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    p.capacity = 0;
    assert_status(kvmem_qmem_store_create(&s, &p, &st), KVMEM_ERR_INVALID_ARG, "capacity 0");
    p = kvmem_qmem_default_params();
    p.lambda = -1;
    assert_status(kvmem_qmem_store_create(&s, &p, &st), KVMEM_ERR_INVALID_ARG, "lambda");
    p.lambda = NAN;
    assert_status(kvmem_qmem_store_create(&s, &p, &st), KVMEM_ERR_INVALID_ARG, "lambda");
    p = kvmem_qmem_default_params();
    p.prefix_tokens = 0;
    assert_status(kvmem_qmem_store_create(&s, &p, &st), KVMEM_ERR_INVALID_ARG, "prefix_tokens");
    kvmem_model_spec bad = s;
    bad.n_q_heads = 3;
    assert_status(kvmem_qmem_store_create(&bad, NULL, &st), KVMEM_ERR_INVALID_ARG, NULL);
    assert_null(st);
    kvmem_qmem_store_free(NULL);
    assert_int_equal(kvmem_qmem_count(NULL), 0);

    st = mkstore(4);
    kvmem_session_key k = named(st, "k"), out = {7, 7, KVMEM_SESSION_EXPLICIT, 0}, keep = out;
    int32_t toks[3] = {1, 2, 3};
    kvmem_session_source src = {NULL, toks, 3, 2, 5};
    assert_status(kvmem_session_key_derive(st, &src, &out), KVMEM_ERR_INVALID_ARG, "marked span");
    src.mark_begin = -1;
    src.mark_end = 1;
    assert_status(kvmem_session_key_derive(st, &src, &out), KVMEM_ERR_INVALID_ARG, "marked span");
    kvmem_session_source neg = {NULL, toks, -1, 0, 0}, nul = {NULL, NULL, 3, 0, 0};
    assert_status(kvmem_session_key_derive(st, &neg, &out), KVMEM_ERR_INVALID_ARG, "negative");
    assert_status(kvmem_session_key_derive(st, &nul, &out), KVMEM_ERR_INVALID_ARG, "token_ids is NULL");
    assert_status(kvmem_session_key_derive(NULL, &nul, &out), KVMEM_ERR_INVALID_ARG, "store is NULL");
    assert_status(kvmem_session_key_derive(st, NULL, &out), KVMEM_ERR_INVALID_ARG, "src is NULL");
    assert_status(kvmem_session_key_derive(st, &src, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_memory_equal(&out, &keep, sizeof out);

    float q[2 * E], m0[E], m1[E];
    for (int i = 0; i < 2 * E; i++) q[i] = (float)(i % 7) - 3.0f;
    update(st, &k, q, 2, 0, 2, m0);
    kvmem_tensor t;
    int64_t shape[4] = {2, L, HQ, D};
    assert_ok(kvmem_tensor_init(&t, q, KVMEM_F32, 4, shape));
    assert_status(kvmem_qmem_update(st, &k, &t, 1, 1, NULL), KVMEM_ERR_INVALID_ARG, "span");
    assert_status(kvmem_qmem_update(st, &k, &t, 0, 3, NULL), KVMEM_ERR_INVALID_ARG, "span");
    assert_status(kvmem_qmem_update(st, &k, &t, -1, 1, NULL), KVMEM_ERR_INVALID_ARG, "span");
    assert_status(kvmem_qmem_update(st, &k, NULL, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "q is NULL");
    assert_status(kvmem_qmem_update(NULL, &k, &t, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "store is NULL");
    assert_status(kvmem_qmem_update(st, NULL, &t, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "key is NULL");
    kvmem_session_key wrong = k;
    wrong.kind = (kvmem_session_kind)9;
    assert_status(kvmem_qmem_update(st, &wrong, &t, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "kind 9");
    kvmem_tensor t3 = t;
    t3.shape[2] = HQ + 1;
    assert_status(kvmem_qmem_update(st, &k, &t3, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "does not match");
    t3 = t;
    t3.ndim = 3;
    assert_status(kvmem_qmem_update(st, &k, &t3, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "3 dims");
    t3 = t;
    t3.dtype = KVMEM_Q4;
    assert_status(kvmem_qmem_update(st, &k, &t3, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "dtype");
    q[E + 3] = INFINITY;
    assert_status(kvmem_qmem_update(st, &k, &t, 0, 2, NULL), KVMEM_ERR_INVALID_ARG, "not finite");
    assert_ok(kvmem_qmem_get(st, &k, m1));
    assert_memory_equal(m0, m1, sizeof m0); /* nothing changed */
    assert_int_equal(kvmem_qmem_count(st), 1);
    assert_status(kvmem_qmem_get(st, &k, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_status(kvmem_qmem_get(NULL, &k, m1), KVMEM_ERR_INVALID_ARG, "store is NULL");
    assert_status(kvmem_qmem_get(st, &wrong, m1), KVMEM_ERR_INVALID_ARG, "kind");
    kvmem_qmem_store_free(st);
}

typedef struct {
    kvmem_qmem_store *st;
    int id;
} worker_arg;

static void *worker(void *p) {
    worker_arg *w = p;
    float q[E], got[E];
    for (int i = 0; i < E; i++) q[i] = (float)((i + w->id) % 5) - 2.0f;
    char name[16];
    for (int r = 0; r < 200; r++) {
        name[0] = (char)('a' + (r + w->id) % 12);
        name[1] = '\0';
        kvmem_session_source src = {name, NULL, 0, 0, 0};
        kvmem_session_key k;
        if (kvmem_session_key_derive(w->st, &src, &k) != KVMEM_OK) return NULL;
        kvmem_tensor t;
        int64_t shape[4] = {1, L, HQ, D};
        kvmem_tensor_init(&t, q, KVMEM_F32, 4, shape);
        if (kvmem_qmem_update(w->st, &k, &t, 0, 1, NULL) != KVMEM_OK) return NULL;
        kvmem_qmem_get(w->st, &k, got); /* may be evicted by another thread meanwhile */
    }
    return p;
}

static void one_store_serves_threads(void **state) {
    (void)state;
    kvmem_qmem_store *st = mkstore(8);
    pthread_t th[4];
    worker_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i].st = st;
        a[i].id = i;
        assert_int_equal(pthread_create(&th[i], NULL, worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        assert_non_null(r);
    }
    assert_int_equal(kvmem_qmem_count(st), 8);
    kvmem_qmem_store_free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_are_the_papers),
        cmocka_unit_test(key_order_explicit_then_marked_then_prefix_then_local),
        cmocka_unit_test(update_is_decayed_mean_projected_to_unit_norm),
        cmocka_unit_test(f16_queries_and_strided_views),
        cmocka_unit_test(lru_drops_the_least_recently_used),
        cmocka_unit_test(sessions_never_share_a_memory),
        cmocka_unit_test(bad_input_changes_nothing),
        cmocka_unit_test(one_store_serves_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

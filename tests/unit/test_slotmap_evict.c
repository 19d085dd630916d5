/* Slot maps over the paged KV store: eviction by redirection (kept rows
 * never move), alias-aware free (protected prefix, siblings, evicting
 * twice), compaction with re-rotation, gather, the sentinel hazard, bad
 * input leaving everything unchanged. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define L 2
#define HKV 2
#define D 8
#define ROW (L * HKV * D)

typedef struct {
    kvmem_model_spec spec;
    kvmem_kvstore *store;
} fixture;

static void fx_init(fixture *f, int32_t page_slots, int64_t max_slots) {
    f->spec = tu_spec(L, D);
    kvmem_kvstore_params p = kvmem_kvstore_default_params();
    p.page_slots = page_slots;
    p.max_slots = max_slots;
    f->store = NULL;
    assert_ok(kvmem_kvstore_create(&f->spec, &p, &f->store));
}

/* K, V [L][T][HKV][D] for tokens with values tagged by (position, l, h, d). */
static void make_kv(int64_t pos0, int64_t T, float *k, float *v) {
    for (int l = 0; l < L; l++)
        for (int64_t t = 0; t < T; t++)
            for (int h = 0; h < HKV; h++)
                for (int d = 0; d < D; d++) {
                    size_t i = (((size_t)l * T + t) * HKV + h) * D + d;
                    float base = (float)(pos0 + t) * 0.01f + (float)l * 0.1f + (float)h * 0.2f;
                    k[i] = sinf(base * 7.0f + (float)d);
                    v[i] = cosf(base * 3.0f - (float)d);
                }
}

static void append(kvmem_slotmap *m, int64_t pos0, int64_t T) {
    float *k = malloc((size_t)L * T * HKV * D * 4), *v = malloc((size_t)L * T * HKV * D * 4);
    make_kv(pos0, T, k, v);
    kvmem_tensor kt, vt;
    int64_t shape[4] = {L, T, HKV, D};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_slotmap_append(m, &kt, &vt));
    free(k);
    free(v);
}

/* The expected slot row (store layout [L][HKV][D]) of the token at pos. */
static void expect_row(int64_t pos, float *k, float *v) {
    float kk[ROW], vv[ROW];
    make_kv(pos, 1, kk, vv);
    memcpy(k, kk, sizeof kk); /* [L][1][HKV][D] == [L][HKV][D] */
    memcpy(v, vv, sizeof vv);
}

static const int32_t *slots_of(const kvmem_slotmap *m, int64_t *len) {
    const int32_t *s;
    int32_t dead = -1;
    assert_ok(kvmem_slotmap_slots(m, &s, len, &dead));
    assert_int_equal(dead, KVMEM_DEAD_SLOT);
    return s;
}

static int64_t used(kvmem_kvstore *st) {
    kvmem_kvstore_info i;
    assert_ok(kvmem_kvstore_get_info(st, &i));
    return i.n_used;
}

static int32_t refs(kvmem_kvstore *st, int32_t s) {
    int32_t r = -1;
    assert_ok(kvmem_kvstore_slot_refs(st, s, &r));
    return r;
}

static void store_has_sentinel_and_rows_round_trip(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 4, 0);
    float k[ROW], v[ROW], ek[ROW], ev[ROW];
    assert_ok(kvmem_kvstore_read_slot(f.store, KVMEM_DEAD_SLOT, k, v));
    for (int i = 0; i < ROW; i++) assert_true(k[i] == -1.0e4f && v[i] == 0.0f);
    assert_int_equal(used(f.store), 1);
    kvmem_slotmap *m = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &m));
    append(m, 0, 5);
    append(m, 5, 6); /* across pages of 4 slots */
    int64_t len;
    const int32_t *s = slots_of(m, &len);
    assert_int_equal(len, 11);
    for (int64_t j = 0; j < len; j++) {
        assert_true(s[j] != KVMEM_DEAD_SLOT);
        for (int64_t i = 0; i < j; i++) assert_true(s[i] != s[j]);
        assert_ok(kvmem_kvstore_read_slot(f.store, s[j], k, v));
        expect_row(j, ek, ev);
        assert_memory_equal(k, ek, sizeof k);
        assert_memory_equal(v, ev, sizeof v);
        assert_int_equal(refs(f.store, s[j]), 1);
    }
    assert_int_equal(used(f.store), 12);
    kvmem_slotmap_free(m);
    assert_int_equal(used(f.store), 1);
    kvmem_slotmap_free(NULL);
    kvmem_kvstore_free(f.store);
    kvmem_kvstore_free(NULL);
}

static void evict_redirects_and_never_moves_kept_rows(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 8, 0);
    kvmem_slotmap *m = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &m));
    append(m, 0, 10);
    int64_t len;
    int32_t before[10];
    memcpy(before, slots_of(m, &len), sizeof before);
    int32_t kept[4] = {0, 3, 4, 9};
    int64_t freed = -1;
    assert_ok(kvmem_slotmap_evict(m, kept, 4, &freed));
    assert_int_equal(freed, 6);
    const int32_t *s = slots_of(m, &len);
    assert_int_equal(len, 10); /* logical positions stay */
    for (int j = 0; j < 10; j++) {
        int is_kept = j == 0 || j == 3 || j == 4 || j == 9;
        assert_int_equal(s[j], is_kept ? before[j] : KVMEM_DEAD_SLOT);
        if (!is_kept) assert_int_equal(refs(f.store, before[j]), 0); /* back in the allocator */
    }
    float k[ROW], v[ROW], ek[ROW], ev[ROW];
    assert_ok(kvmem_kvstore_read_slot(f.store, s[3], k, v)); /* kept row untouched, same phase */
    expect_row(3, ek, ev);
    assert_memory_equal(k, ek, sizeof k);
    kvmem_slotmap_info info;
    assert_ok(kvmem_slotmap_get_info(m, &info));
    assert_int_equal(info.n_live, 4);
    assert_int_equal(used(f.store), 1 + 4);
    /* evicting twice: the same kept set again is a no-op */
    assert_ok(kvmem_slotmap_evict(m, kept, 4, &freed));
    assert_int_equal(freed, 0);
    assert_int_equal(used(f.store), 1 + 4);
    /* then a smaller set drops only what is still live */
    int32_t kept2[2] = {3, 9};
    assert_ok(kvmem_slotmap_evict(m, kept2, 2, &freed));
    assert_int_equal(freed, 2);
    assert_int_equal(used(f.store), 1 + 2);
    /* freed slots are reused by the next append */
    append(m, 10, 2);
    s = slots_of(m, &len);
    assert_true(s[10] == before[0] || s[10] == before[4] || s[10] == before[1]);
    kvmem_slotmap_free(m);
    assert_int_equal(used(f.store), 1);
    kvmem_kvstore_free(f.store);
}

static void siblings_share_slots_until_the_last_reference(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 8, 0);
    kvmem_slotmap *a = NULL, *b = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &a));
    append(a, 0, 8);
    assert_ok(kvmem_slotmap_fork(a, 6, &b));
    append(b, 6, 3); /* b's own suffix */
    int64_t la, lb;
    int32_t sa[8];
    memcpy(sa, slots_of(a, &la), sizeof sa);
    const int32_t *sb = slots_of(b, &lb);
    assert_int_equal(lb, 9);
    for (int j = 0; j < 6; j++) {
        assert_int_equal(sb[j], sa[j]);
        assert_int_equal(refs(f.store, sa[j]), 2);
    }
    assert_true(sb[6] != sa[6] && sb[7] != sa[7]);
    /* a drops 1, 2 (shared) and 7 (its own): only 7 is freed */
    int32_t ka[5] = {0, 3, 4, 5, 6};
    int64_t freed;
    assert_ok(kvmem_slotmap_evict(a, ka, 5, &freed));
    assert_int_equal(freed, 1);
    assert_int_equal(refs(f.store, sa[1]), 1);
    assert_int_equal(refs(f.store, sa[2]), 1);
    assert_int_equal(refs(f.store, sa[7]), 0);
    sb = slots_of(b, &lb);
    assert_int_equal(sb[1], sa[1]); /* b still reads its row */
    float k[ROW], ek[ROW], ev[ROW];
    assert_ok(kvmem_kvstore_read_slot(f.store, sb[1], k, NULL));
    expect_row(1, ek, ev);
    assert_memory_equal(k, ek, sizeof k);
    /* b drops 2 as well: now the last reference is gone */
    int32_t kb[8] = {0, 1, 3, 4, 5, 6, 7, 8};
    assert_ok(kvmem_slotmap_evict(b, kb, 8, &freed));
    assert_int_equal(freed, 1);
    assert_int_equal(refs(f.store, sa[2]), 0);
    /* a fork of a map with dead positions: they stay dead, no reference */
    kvmem_slotmap *c = NULL;
    assert_ok(kvmem_slotmap_fork(a, 8, &c));
    const int32_t *sc = slots_of(c, &la);
    assert_int_equal(sc[1], KVMEM_DEAD_SLOT);
    assert_int_equal(refs(f.store, sa[0]), 3);
    kvmem_slotmap_free(a);
    kvmem_slotmap_free(c);
    assert_int_equal(refs(f.store, sa[0]), 1);
    kvmem_slotmap_free(b);
    assert_int_equal(used(f.store), 1);
    kvmem_kvstore_free(f.store);
}

static void protected_prefix_slots_are_parked_not_freed(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 8, 0);
    kvmem_slotmap *m = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &m));
    append(m, 0, 8);
    assert_ok(kvmem_slotmap_set_protected(m, 4));
    int64_t len;
    int32_t s0[8];
    memcpy(s0, slots_of(m, &len), sizeof s0);
    int32_t kept[3] = {0, 5, 7}; /* drops 1, 2, 3 (protected) and 4, 6 */
    int64_t freed;
    assert_ok(kvmem_slotmap_evict(m, kept, 3, &freed));
    assert_int_equal(freed, 2);
    const int32_t *s = slots_of(m, &len);
    for (int j = 1; j < 4; j++) {
        assert_int_equal(s[j], KVMEM_DEAD_SLOT);
        assert_int_equal(refs(f.store, s0[j]), 1); /* still allocated: a prefix cache may hold it */
    }
    kvmem_slotmap_info info;
    assert_ok(kvmem_slotmap_get_info(m, &info));
    assert_int_equal(info.n_parked, 3);
    assert_int_equal(info.protect, 4);
    assert_int_equal(used(f.store), 1 + 3 + 3);
    /* the sentinel itself is never freed or counted */
    assert_int_equal(refs(f.store, KVMEM_DEAD_SLOT), 1);
    kvmem_slotmap_free(m);
    assert_int_equal(used(f.store), 1);
    assert_int_equal(refs(f.store, KVMEM_DEAD_SLOT), 1);
    kvmem_kvstore_free(f.store);
}

/* NEOX RoPE of one head vector at pos, in double (theta 10000, rotary = D). */
static void rope_ref(const float *x, double pos, double *out) {
    int h = D / 2;
    for (int i = 0; i < h; i++) {
        double a = pos * pow(10000.0, -2.0 * i / D), c = cos(a), s = sin(a);
        out[i] = x[i] * c - x[i + h] * s;
        out[i + h] = x[i] * s + x[i + h] * c;
    }
}

static void compaction_moves_rows_and_rerotates_keys(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 4, 0);
    /* raw keys r_p; the store holds R_p r_p, as an engine would append them */
    enum { N = 9 };
    float raw[N][ROW], kr[L * N * HKV * D], v[L * N * HKV * D];
    uint64_t rng = 5;
    for (int p = 0; p < N; p++)
        for (int i = 0; i < ROW; i++) raw[p][i] = tu_normal(&rng);
    for (int l = 0; l < L; l++)
        for (int p = 0; p < N; p++)
            for (int h = 0; h < HKV; h++) {
                double rot[D];
                rope_ref(&raw[p][(l * HKV + h) * D], p, rot);
                for (int d = 0; d < D; d++) {
                    kr[(((size_t)l * N + p) * HKV + h) * D + d] = (float)rot[d];
                    v[(((size_t)l * N + p) * HKV + h) * D + d] = (float)(p * 100 + l * 10 + h) + 0.001f * (float)d;
                }
            }
    kvmem_slotmap *m = NULL, *sib = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &m));
    kvmem_tensor kt, vt;
    int64_t shape[4] = {L, N, HKV, D};
    assert_ok(kvmem_tensor_init(&kt, kr, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_slotmap_append(m, &kt, &vt));
    assert_ok(kvmem_slotmap_fork(m, N, &sib));
    int64_t len;
    int32_t s0[N];
    memcpy(s0, slots_of(m, &len), sizeof s0);
    int32_t kept[5] = {0, 1, 4, 6, 8};
    int64_t freed;
    assert_ok(kvmem_slotmap_compact(m, kept, 5, &freed));
    assert_int_equal(freed, 0); /* the sibling holds every old slot */
    const int32_t *s = slots_of(m, &len);
    assert_int_equal(len, 5);
    assert_int_equal(s[0], s0[0]); /* unmoved rows keep their slot */
    assert_int_equal(s[1], s0[1]);
    for (int i = 2; i < 5; i++) assert_true(s[i] != s0[kept[i]]); /* moved rows are copies */
    for (int i = 0; i < 5; i++) {
        float k[ROW], vv[ROW];
        assert_ok(kvmem_kvstore_read_slot(f.store, s[i], k, vv));
        for (int r = 0; r < L * HKV; r++) {
            double want[D];
            rope_ref(&raw[kept[i]][r * D], i, want); /* the raw key rotated at its new position */
            for (int d = 0; d < D; d++) {
                assert_true(fabs(k[r * D + d] - want[d]) < 2e-5);
                int l = r / HKV, h = r % HKV;
                assert_true(vv[r * D + d] == v[(((size_t)l * N + kept[i]) * HKV + h) * D + d]);
            }
        }
    }
    /* inside a protected prefix: a dropped and two moved rows are all parked */
    kvmem_slotmap *pm = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &pm));
    assert_ok(kvmem_slotmap_append(pm, &kt, &vt));
    assert_ok(kvmem_slotmap_set_protected(pm, 4));
    int32_t pk[4] = {0, 2, 3, 5}, ps0[N];
    memcpy(ps0, slots_of(pm, &len), sizeof ps0);
    assert_ok(kvmem_slotmap_compact(pm, pk, 4, &freed));
    assert_int_equal(freed, 5); /* 4, 6, 7, 8 dropped and 5 moved: own slots outside the prefix */
    kvmem_slotmap_info pinfo;
    assert_ok(kvmem_slotmap_get_info(pm, &pinfo));
    assert_int_equal(pinfo.n_parked, 3); /* 1 dropped, 2 and 3 moved */
    assert_int_equal(pinfo.length, 4);
    assert_int_equal(pinfo.protect, 4);
    for (int j = 1; j < 4; j++) assert_int_equal(refs(f.store, ps0[j]), 1);
    kvmem_slotmap_free(pm);
    for (int j = 0; j < N; j++) assert_int_equal(refs(f.store, ps0[j]), 0);
    /* sibling untouched */
    const int32_t *ss = slots_of(sib, &len);
    assert_memory_equal(ss, s0, sizeof s0);
    kvmem_slotmap_free(sib);
    kvmem_slotmap_free(m);
    assert_int_equal(used(f.store), 1);
    kvmem_kvstore_free(f.store);
}

/* softmax(q.k / sqrt(D)) v over the given rows, one head, in double. */
static void attend_ref(const float *q, const float *ks, const float *vs, int n, double *out) {
    double mx = -INFINITY, *lg = malloc((size_t)n * sizeof *lg), sum = 0;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int d = 0; d < D; d++) s += (double)q[d] * ks[i * D + d];
        lg[i] = s / sqrt((double)D);
        mx = lg[i] > mx ? lg[i] : mx;
    }
    for (int d = 0; d < D; d++) out[d] = 0;
    for (int i = 0; i < n; i++) {
        double p = exp(lg[i] - mx);
        sum += p;
        for (int d = 0; d < D; d++) out[d] += p * vs[i * D + d];
    }
    for (int d = 0; d < D; d++) out[d] /= sum;
    free(lg);
}

static void sentinel_hazard_and_the_safe_gather(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 8, 0);
    kvmem_slotmap *m = NULL;
    assert_ok(kvmem_slotmap_create(f.store, &m));
    enum { N = 12 };
    append(m, 0, N);
    int32_t kept[5] = {0, 2, 5, 7, 11};
    assert_ok(kvmem_slotmap_evict(m, kept, 5, NULL));
    int64_t len;
    int32_t dead;
    const int32_t *s;
    assert_ok(kvmem_slotmap_slots(m, &s, &len, &dead));
    /* a query with sum(q) < 0, layer 1, kv head 1 */
    float q[D];
    for (int d = 0; d < D; d++) q[d] = (d % 2 ? 0.3f : -0.5f);
    double sq = 0;
    for (int d = 0; d < D; d++) sq += q[d];
    assert_true(sq < 0);
    const int l = 1, h = 1, off = (l * HKV + h) * D;
    /* the truth: attention over the kept positions only, from the rows as appended */
    float kk[5 * D], vk[5 * D];
    for (int i = 0; i < 5; i++) {
        float ek[ROW], ev[ROW];
        expect_row(kept[i], ek, ev);
        memcpy(kk + i * D, ek + off, D * 4);
        memcpy(vk + i * D, ev + off, D * 4);
    }
    double truth[D];
    attend_ref(q, kk, vk, 5, truth);
    /* an external kernel that reads every slot of the array, sentinel included */
    float *ka = malloc((size_t)len * D * 4), *va = malloc((size_t)len * D * 4);
    for (int64_t j = 0; j < len; j++) {
        float rk[ROW], rv[ROW];
        assert_ok(kvmem_kvstore_read_slot(f.store, s[j], rk, rv));
        memcpy(ka + j * D, rk + off, D * 4);
        memcpy(va + j * D, rv + off, D * 4);
    }
    double naive[D], err = 0, mag = 0;
    attend_ref(q, ka, va, (int)len, naive);
    for (int d = 0; d < D; d++) {
        err += fabs(naive[d] - truth[d]);
        mag += fabs(truth[d]);
    }
    /* logit of the sentinel = -1e4 * sum(q) / sqrt(D) > 0: all weight on V = 0 */
    assert_true(mag > 0.1);
    assert_true(err > 0.9 * mag);
    for (int d = 0; d < D; d++) assert_true(fabs(naive[d]) < 1e-6);
    /* kvmem's own path: gather skips dead slots */
    kvmem_slotmap_info info;
    assert_ok(kvmem_slotmap_get_info(m, &info));
    assert_int_equal(info.n_live, 5);
    float gk[L * 5 * HKV * D], gv[L * 5 * HKV * D];
    int32_t pos[5];
    kvmem_tensor kt, vt;
    int64_t shape[4] = {L, 5, HKV, D};
    assert_ok(kvmem_tensor_init(&kt, gk, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&vt, gv, KVMEM_F32, 4, shape));
    assert_ok(kvmem_slotmap_gather(m, &kt, &vt, pos));
    assert_memory_equal(pos, kept, sizeof kept);
    float gk1[5 * D], gv1[5 * D];
    for (int i = 0; i < 5; i++) {
        memcpy(gk1 + i * D, gk + (((size_t)l * 5 + i) * HKV + h) * D, D * 4);
        memcpy(gv1 + i * D, gv + (((size_t)l * 5 + i) * HKV + h) * D, D * 4);
    }
    double safe[D];
    attend_ref(q, gk1, gv1, 5, safe);
    for (int d = 0; d < D; d++) assert_true(safe[d] == truth[d]); /* the same rows, the same sums */
    /* and with sum(q) > 0 the sentinel happens to be harmless: the caveat is sign-dependent */
    for (int d = 0; d < D; d++) q[d] = -q[d];
    attend_ref(q, kk, vk, 5, truth);
    attend_ref(q, ka, va, (int)len, naive);
    for (int d = 0; d < D; d++) assert_true(fabs(naive[d] - truth[d]) < 1e-9);
    /* f16 output through strided views works too */
    uint16_t hk[L * 5 * HKV * D];
    kvmem_tensor ht;
    assert_ok(kvmem_tensor_init(&ht, hk, KVMEM_F16, 4, shape));
    assert_ok(kvmem_slotmap_gather(m, &ht, NULL, NULL));
    free(ka);
    free(va);
    kvmem_slotmap_free(m);
    kvmem_kvstore_free(f.store);
}

static void capacity_and_bad_input_change_nothing(void **state) {
    (void)state;
    fixture f;
    kvmem_kvstore *st = NULL;
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_kvstore_params p = kvmem_kvstore_default_params();
    assert_int_equal(p.page_slots, 256);
    p.page_slots = 3;
    assert_status(kvmem_kvstore_create(&spec, &p, &st), KVMEM_ERR_INVALID_ARG, "power of two");
    p.page_slots = 4;
    p.max_slots = 1;
    assert_status(kvmem_kvstore_create(&spec, &p, &st), KVMEM_ERR_INVALID_ARG, "max_slots 1");
    assert_status(kvmem_kvstore_create(NULL, NULL, &st), KVMEM_ERR_INVALID_ARG, "spec is NULL");
    assert_status(kvmem_kvstore_create(&spec, NULL, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_null(st);

    fx_init(&f, 4, 8); /* the sentinel + 7 */
    kvmem_slotmap *m = NULL;
    assert_status(kvmem_slotmap_create(NULL, &m), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_slotmap_create(f.store, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_ok(kvmem_slotmap_create(f.store, &m));
    append(m, 0, 5);
    int64_t len;
    int32_t s0[5];
    memcpy(s0, slots_of(m, &len), sizeof s0);
    kvmem_kvstore_info i0, i1;
    assert_ok(kvmem_kvstore_get_info(f.store, &i0));
    /* capacity */
    float k[L * 3 * HKV * D], v[L * 3 * HKV * D];
    make_kv(5, 3, k, v);
    kvmem_tensor kt, vt;
    int64_t shape[4] = {L, 3, HKV, D};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape));
    assert_status(kvmem_slotmap_append(m, &kt, &vt), KVMEM_ERR_CAPACITY, "at most 8");
    /* bad shapes, dtype, values */
    kvmem_tensor bad = kt;
    bad.shape[2] = 1;
    assert_status(kvmem_slotmap_append(m, &bad, &vt), KVMEM_ERR_INVALID_ARG, "does not match");
    bad = vt;
    bad.dtype = KVMEM_Q4;
    assert_status(kvmem_slotmap_append(m, &kt, &bad), KVMEM_ERR_INVALID_ARG, "dtype");
    assert_status(kvmem_slotmap_append(m, NULL, &vt), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_slotmap_append(NULL, &kt, &vt), KVMEM_ERR_INVALID_ARG, "map is NULL");
    int64_t shape1[4] = {L, 1, HKV, D};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape1));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape1));
    v[3] = NAN;
    assert_status(kvmem_slotmap_append(m, &kt, &vt), KVMEM_ERR_INVALID_ARG, "not finite");
    /* eviction and compaction input */
    int32_t unsorted[2] = {3, 1}, dup[2] = {2, 2}, out_of[1] = {5};
    assert_status(kvmem_slotmap_evict(m, unsorted, 2, NULL), KVMEM_ERR_INVALID_ARG, "ascending");
    assert_status(kvmem_slotmap_evict(m, dup, 2, NULL), KVMEM_ERR_INVALID_ARG, "unique");
    assert_status(kvmem_slotmap_evict(m, out_of, 1, NULL), KVMEM_ERR_INVALID_ARG, "kept[0] = 5");
    assert_status(kvmem_slotmap_evict(m, NULL, 1, NULL), KVMEM_ERR_INVALID_ARG, "kept is NULL");
    assert_status(kvmem_slotmap_evict(m, out_of, 6, NULL), KVMEM_ERR_INVALID_ARG, "n_kept 6");
    assert_status(kvmem_slotmap_evict(NULL, out_of, 1, NULL), KVMEM_ERR_INVALID_ARG, "map is NULL");
    assert_status(kvmem_slotmap_compact(m, unsorted, 2, NULL), KVMEM_ERR_INVALID_ARG, "ascending");
    assert_status(kvmem_slotmap_compact(m, out_of, 1, NULL), KVMEM_ERR_INVALID_ARG, "outside");
    /* compaction that needs fresh slots past max_slots fails whole */
    int32_t keep_last[2] = {3, 4};
    append(m, 5, 2); /* 7 + sentinel = 8 used: full */
    memcpy(s0, slots_of(m, &len), sizeof s0);
    assert_ok(kvmem_kvstore_get_info(f.store, &i0));
    assert_status(kvmem_slotmap_compact(m, keep_last, 2, NULL), KVMEM_ERR_CAPACITY, "more slots");
    assert_status(kvmem_slotmap_set_protected(m, 8), KVMEM_ERR_INVALID_ARG, "outside [0, length 7]");
    assert_status(kvmem_slotmap_set_protected(m, -1), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_slotmap_set_protected(NULL, 1), KVMEM_ERR_INVALID_ARG, "NULL");
    kvmem_slotmap *c = NULL;
    assert_status(kvmem_slotmap_fork(m, 8, &c), KVMEM_ERR_INVALID_ARG, "prefix 8");
    assert_status(kvmem_slotmap_fork(m, -1, &c), KVMEM_ERR_INVALID_ARG, "prefix -1");
    assert_status(kvmem_slotmap_fork(NULL, 1, &c), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_null(c);
    const int32_t *sp;
    assert_status(kvmem_slotmap_slots(m, NULL, &len, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_slotmap_slots(NULL, &sp, &len, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    kvmem_slotmap_info info;
    assert_status(kvmem_slotmap_get_info(m, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_slotmap_get_info(NULL, &info), KVMEM_ERR_INVALID_ARG, "NULL");
    float g[L * 3 * HKV * D];
    kvmem_tensor gt;
    int64_t gs[4] = {L, 3, HKV, D};
    assert_ok(kvmem_tensor_init(&gt, g, KVMEM_F32, 4, gs));
    assert_status(kvmem_slotmap_gather(m, &gt, NULL, NULL), KVMEM_ERR_INVALID_ARG, "does not match");
    assert_status(kvmem_slotmap_gather(NULL, &gt, NULL, NULL), KVMEM_ERR_INVALID_ARG, "map is NULL");
    float row[ROW];
    assert_status(kvmem_kvstore_read_slot(f.store, 99, row, NULL), KVMEM_ERR_INVALID_ARG, "not allocated");
    assert_status(kvmem_kvstore_read_slot(f.store, -1, row, NULL), KVMEM_ERR_INVALID_ARG, "not allocated");
    assert_status(kvmem_kvstore_read_slot(NULL, 1, row, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    int32_t r;
    assert_status(kvmem_kvstore_slot_refs(f.store, 99, &r), KVMEM_ERR_INVALID_ARG, "outside");
    assert_status(kvmem_kvstore_slot_refs(f.store, 1, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_kvstore_get_info(NULL, &i1), KVMEM_ERR_INVALID_ARG, "NULL");
    /* nothing above changed the map or the store */
    assert_ok(kvmem_kvstore_get_info(f.store, &i1));
    assert_memory_equal(&i0, &i1, sizeof i0);
    const int32_t *s1 = slots_of(m, &len);
    assert_int_equal(len, 7);
    assert_memory_equal(s1, s0, sizeof s0);
    assert_ok(kvmem_slotmap_get_info(m, &info));
    assert_int_equal(info.n_live, 7);
    assert_int_equal(info.n_parked, 0);
    /* after eviction the freed slots make room again */
    assert_ok(kvmem_slotmap_evict(m, keep_last, 2, NULL));
    append(m, 7, 3);
    kvmem_slotmap_free(m);
    kvmem_kvstore_free(f.store);
}

typedef struct {
    kvmem_kvstore *st;
    int ok;
} th_arg;

static void *th_main(void *p) {
    th_arg *a = p;
    kvmem_slotmap *m = NULL;
    if (kvmem_slotmap_create(a->st, &m) != KVMEM_OK) return NULL;
    float k[L * 4 * HKV * D], v[L * 4 * HKV * D];
    make_kv(0, 4, k, v);
    kvmem_tensor kt, vt;
    int64_t shape[4] = {L, 4, HKV, D};
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    for (int r = 0; r < 50; r++) {
        if (kvmem_slotmap_append(m, &kt, &vt) != KVMEM_OK) return NULL;
        int32_t keep[2];
        int64_t len;
        const int32_t *s;
        kvmem_slotmap_slots(m, &s, &len, NULL);
        keep[0] = 0;
        keep[1] = (int32_t)len - 1;
        if (kvmem_slotmap_evict(m, keep, 2, NULL) != KVMEM_OK) return NULL;
        kvmem_slotmap *c = NULL;
        if (kvmem_slotmap_fork(m, len, &c) != KVMEM_OK) return NULL;
        kvmem_slotmap_free(c);
    }
    kvmem_slotmap_free(m);
    a->ok = 1;
    return p;
}

static void maps_of_one_store_on_several_threads(void **state) {
    (void)state;
    fixture f;
    fx_init(&f, 4, 0);
    pthread_t t[3];
    th_arg a[3];
    for (int i = 0; i < 3; i++) {
        a[i].st = f.store;
        a[i].ok = 0;
        assert_int_equal(pthread_create(&t[i], NULL, th_main, &a[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        assert_true(a[i].ok);
    }
    assert_int_equal(used(f.store), 1);
    kvmem_kvstore_free(f.store);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(store_has_sentinel_and_rows_round_trip),
        cmocka_unit_test(evict_redirects_and_never_moves_kept_rows),
        cmocka_unit_test(siblings_share_slots_until_the_last_reference),
        cmocka_unit_test(protected_prefix_slots_are_parked_not_freed),
        cmocka_unit_test(compaction_moves_rows_and_rerotates_keys),
        cmocka_unit_test(sentinel_hazard_and_the_safe_gather),
        cmocka_unit_test(capacity_and_bad_input_change_nothing),
        cmocka_unit_test(maps_of_one_store_on_several_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* KEEP layer-balanced load plan: a hand-computed two-segment case, the plan
 * invariants on random monotone recompute sets (every needed KV loaded once,
 * before its layer, never before it is known not to be recomputed), the
 * plain pipeline against an independent simulation, and bad input. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* cmocka's assert_float_equal compares floats; these checks need doubles. */
#define assert_near(a, b, tol)                                                                 \
    do {                                                                                       \
        double a_ = (a), b_ = (b);                                                             \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s = %.17g, expected %.17g", #a, a_, b_);     \
    } while (0)

/* A (never recomputed) and B (recomputed at layer 0 only); layer 0 is slow,
 * so the balanced plan pulls A's layer-2 KV into the gap before B's layer-1
 * KV is released. Times worked out by hand in the comments. */
static void hand_computed_two_segments(void **state) {
    (void)state;
    double comp[3] = {3.0, 0.5, 0.5};
    uint64_t bytes[2] = {1000000, 1000000}; /* 1 ms each at 1 GB/s */
    uint8_t rec[3 * 2] = {0, 1, 0, 0, 0, 0};
    kvmem_load_plan_params p = kvmem_load_plan_default_params();
    p.bandwidth_gbps = 1.0;
    kvmem_load_item it[8];
    size_t n = 0;
    double start[3];
    kvmem_load_plan_stats st;
    assert_ok(kvmem_load_plan(&p, comp, 3, bytes, 2, rec, it, 8, &n, start, &st));
    /* naive: A0 0-1 | c0 1-4 | A1 1-2, B1 4-5 | c1 5-5.5 | A2 5-6, B2 6-7 | c2 7-7.5 */
    assert_near(st.naive_makespan_ms, 7.5, 1e-9);
    assert_near(st.naive_compute_idle_ms, 3.5, 1e-9);
    assert_near(st.naive_load_idle_ms, 2.0, 1e-9);
    /* balanced: A0 0-1 | c0 1-4 | A1 1-2, A2 2-3 (gap), B1 4-5 | c1 5-5.5 | B2 5-6 | c2 6-6.5 */
    assert_near(st.balanced_makespan_ms, 6.5, 1e-9);
    assert_near(st.balanced_compute_idle_ms, 2.5, 1e-9);
    assert_near(st.balanced_load_idle_ms, 1.0, 1e-9);
    assert_near(st.compute_ms, 4.0, 1e-12);
    assert_near(st.load_ms, 5.0, 1e-12);
    assert_int_equal(st.n_loads, 5);
    assert_int_equal(n, 5);
    const int32_t seg[5] = {0, 0, 0, 1, 1}, lay[5] = {0, 1, 2, 1, 2}, issue[5] = {-1, 0, 0, 0, 1};
    const double t0[5] = {0, 1, 2, 4, 5};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(it[i].segment, seg[i]);
        assert_int_equal(it[i].layer, lay[i]);
        assert_int_equal(it[i].issue_layer, issue[i]);
        assert_near(it[i].start_ms, t0[i], 1e-9);
        assert_near(it[i].end_ms, t0[i] + 1.0, 1e-9);
    }
    assert_near(start[0], 1.0, 1e-9);
    assert_near(start[1], 5.0, 1e-9);
    assert_near(start[2], 6.0, 1e-9);
    /* the sizing call agrees; a too-small buffer is refused untouched */
    size_t n2 = 0;
    assert_ok(kvmem_load_plan(&p, comp, 3, bytes, 2, rec, NULL, 0, &n2, NULL, NULL));
    assert_int_equal(n2, 5);
    memset(it, 0x5A, sizeof it);
    assert_status(kvmem_load_plan(&p, comp, 3, bytes, 2, rec, it, 4, &n2, NULL, NULL), KVMEM_ERR_CAPACITY, "5 loads");
    unsigned char *raw = (unsigned char *)it;
    for (size_t i = 0; i < sizeof it; i++) assert_int_equal(raw[i], 0x5A);
}

/* The plain next-layer pipeline, simulated independently: layer by layer,
 * each layer's loads in order of release time, then decision layer, then
 * segment. */
static double ref_naive(int L, int n, const double *comp, const double *dur, const uint8_t *rec, double *load_idle) {
    double *cst = calloc((size_t)L, sizeof *cst), *cen = calloc((size_t)L, sizeof *cen);
    int *first = calloc((size_t)n, sizeof *first);
    for (int j = 0; j < n; j++) {
        int e = 0;
        while (e < L && rec[e * n + j]) e++;
        first[j] = e;
    }
    double tl = 0, idle = 0, prev_end = 0;
    char *done = calloc((size_t)n, 1);
    for (int i = 0; i < L; i++) {
        double gate = i ? cst[i - 1] : 0, last = 0;
        memset(done, 0, (size_t)n);
        for (;;) {
            int pick = -1;
            double best = 0;
            for (int j = 0; j < n; j++) {
                if (done[j] || first[j] > i) continue;
                double rel = first[j] == 0 ? 0 : cen[first[j] - 1];
                double a = rel > gate ? rel : gate;
                if (pick < 0 || a < best || (a == best && first[j] < first[pick])) {
                    pick = j;
                    best = a;
                }
            }
            if (pick < 0) break;
            done[pick] = 1;
            double s = best > tl ? best : tl;
            idle += s - tl;
            tl = s + dur[pick];
            last = tl;
        }
        cst[i] = prev_end > last ? prev_end : last;
        cen[i] = prev_end = cst[i] + comp[i];
    }
    *load_idle = idle;
    double mk = cen[L - 1];
    free(cst), free(cen), free(first), free(done);
    return mk;
}

static void random_plans_keep_every_invariant(void **state) {
    (void)state;
    uint64_t rng = 2024;
    for (int trial = 0; trial < 300; trial++) {
        int L = 1 + (int)(tu_next(&rng) % 12), n = (int)(tu_next(&rng) % 10);
        double *comp = malloc((size_t)L * sizeof *comp), *start = malloc((size_t)L * sizeof *start);
        for (int i = 0; i < L; i++) comp[i] = tu_uniform(&rng, 0.0f, 3.0f);
        uint64_t *bytes = malloc((size_t)(n ? n : 1) * sizeof *bytes);
        double *dur = malloc((size_t)(n ? n : 1) * sizeof *dur);
        uint8_t *rec = malloc((size_t)(L * (n ? n : 1)));
        kvmem_load_plan_params p = kvmem_load_plan_default_params();
        p.bandwidth_gbps = 2.0;
        p.max_ahead = (int32_t)(tu_next(&rng) % 3);
        size_t need = 0;
        for (int j = 0; j < n; j++) {
            bytes[j] = 1 + tu_next(&rng) % 4000000;
            dur[j] = (double)bytes[j] / 2e9 * 1e3;
            int e = (int)(tu_next(&rng) % (uint64_t)(L + 1)); /* first layer not recomputed */
            for (int i = 0; i < L; i++) rec[i * n + j] = i < e;
            need += (size_t)(L - e);
        }
        kvmem_load_item *it = malloc((need ? need : 1) * sizeof *it);
        size_t ni = 0;
        kvmem_load_plan_stats st;
        assert_ok(kvmem_load_plan(&p, comp, L, bytes, n, rec, need ? it : NULL, need, &ni, start, &st));
        assert_int_equal(ni, need);
        assert_int_equal(st.n_loads, need);
        /* every needed (segment, layer) exactly once, nothing else */
        char *seen = calloc((size_t)(L * (n ? n : 1)), 1);
        double prev_end = 0;
        for (size_t k = 0; k < ni; k++) {
            int j = it[k].segment, i = it[k].layer;
            assert_true(j >= 0 && j < n && i >= 0 && i < L);
            assert_int_equal(rec[i * n + j], 0);
            assert_int_equal(seen[i * n + j], 0);
            seen[i * n + j] = 1;
            /* one load at a time, at the bandwidth */
            assert_true(it[k].start_ms >= prev_end - 1e-9);
            assert_near(it[k].end_ms - it[k].start_ms, dur[j], 1e-9);
            prev_end = it[k].end_ms;
            /* loaded before its layer computes */
            assert_true(it[k].end_ms <= start[i] + 1e-9);
            /* not before it is known not to be recomputed */
            int e = 0;
            while (e < L && rec[e * n + j]) e++;
            if (e > 0) assert_true(it[k].start_ms >= start[e - 1] + comp[e - 1] - 1e-9);
            /* within the look-ahead window */
            if (p.max_ahead > 0 && i - p.max_ahead >= 0)
                assert_true(it[k].start_ms >= start[i - p.max_ahead] - 1e-9);
            /* issue_layer: the last layer that started by then */
            int issue = -1;
            while (issue + 1 < L && start[issue + 1] <= it[k].start_ms) issue++;
            assert_int_equal(it[k].issue_layer, issue);
        }
        assert_true(ni == need);
        /* compute: in order, each layer after the previous one */
        for (int i = 1; i < L; i++) assert_true(start[i] >= start[i - 1] + comp[i - 1] - 1e-9);
        assert_near(st.balanced_makespan_ms, start[L - 1] + comp[L - 1], 1e-9);
        /* the plain pipeline matches the independent simulation */
        double li = 0, mk = ref_naive(L, n, comp, dur, rec, &li);
        assert_near(st.naive_makespan_ms, mk, 1e-9);
        assert_near(st.naive_load_idle_ms, li, 1e-9);
        /* balancing never makes it worse */
        assert_true(st.balanced_makespan_ms <= st.naive_makespan_ms + 1e-9);
        assert_true(st.balanced_compute_idle_ms <= st.naive_compute_idle_ms + 1e-9);
        free(comp), free(start), free(bytes), free(dur), free(rec), free(it), free(seen);
    }
}

static void bad_input_writes_nothing(void **state) {
    (void)state;
    double comp[2] = {1, 1}, start[2] = {-7, -7};
    uint64_t bytes[2] = {10, 10};
    uint8_t rec[4] = {1, 0, 1, 0};
    kvmem_load_item it[4];
    size_t n = 99;
    kvmem_load_plan_stats st;
    memset(&st, 0x33, sizeof st);
    kvmem_load_plan_stats st0 = st;
    kvmem_load_plan_params p = kvmem_load_plan_default_params();
    assert_true(p.bandwidth_gbps > 0);
    assert_status(kvmem_load_plan(&p, NULL, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "compute_ms is NULL");
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, NULL, start, &st), KVMEM_ERR_INVALID_ARG, "n_items is NULL");
    assert_status(kvmem_load_plan(&p, comp, 0, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "n_layers");
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, -1, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "n_segments");
    assert_status(kvmem_load_plan(&p, comp, 2, NULL, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "load_bytes is NULL");
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, NULL, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "recompute is NULL");
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, NULL, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "items is NULL");
    p.bandwidth_gbps = 0;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "bandwidth");
    p.bandwidth_gbps = INFINITY;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "bandwidth");
    p = kvmem_load_plan_default_params();
    p.max_ahead = -2;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "max_ahead");
    p = kvmem_load_plan_default_params();
    comp[1] = -1;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "compute_ms[1]");
    comp[1] = NAN;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "compute_ms[1]");
    comp[1] = 1;
    rec[1] = 3;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "0 or 1");
    /* segment 1 not recomputed at layer 0 but recomputed at layer 1 */
    rec[1] = 0;
    rec[3] = 1;
    assert_status(kvmem_load_plan(&p, comp, 2, bytes, 2, rec, it, 4, &n, start, &st), KVMEM_ERR_INVALID_ARG, "shrink");
    assert_int_equal(n, 99);
    assert_true(start[0] == -7 && start[1] == -7);
    assert_memory_equal(&st, &st0, sizeof st);
    /* zero segments: no loads, makespan = total compute */
    rec[3] = 0;
    assert_ok(kvmem_load_plan(&p, comp, 2, NULL, 0, NULL, NULL, 0, &n, start, &st));
    assert_int_equal(n, 0);
    assert_near(st.naive_makespan_ms, 2.0, 1e-12);
    assert_near(st.balanced_compute_idle_ms, 0.0, 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hand_computed_two_segments),
        cmocka_unit_test(random_plans_keep_every_invariant),
        cmocka_unit_test(bad_input_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* KEEP multi-hop importance: a hand-built "locked door -> key -> table"
 * chain, an independent reference on random graphs, the iteration bound,
 * monotonicity across layers, the ratio schedule, and bad input. */
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

enum { DOOR, KEY, TABLE, D1, D2, D3, D4, D5, NSEG };

/* Rows are probability distributions (sum 1). The query names the door;
 * distractors look superficially relevant and attend to everything evenly;
 * the door's memory attends to the key ("the key opens the door"), the
 * key's to the table ("the key is on the table"). */
static void door_key_table(float *q2s, float *s2s) {
    const float q[NSEG] = {0.50f, 0.03f, 0.02f, 0.09f, 0.09f, 0.09f, 0.09f, 0.09f};
    memcpy(q2s, q, sizeof q);
    for (int a = 0; a < NSEG; a++)
        for (int b = 0; b < NSEG; b++) s2s[a * NSEG + b] = 1.0f / NSEG; /* distractors */
    for (int b = 0; b < NSEG; b++) {
        s2s[DOOR * NSEG + b] = b >= D1 ? 0.02f : 0.0f;
        s2s[KEY * NSEG + b] = 0.1f / 6;
        s2s[TABLE * NSEG + b] = 0.3f / 7;
    }
    s2s[DOOR * NSEG + DOOR] = 0.3f;
    s2s[DOOR * NSEG + KEY] = 0.6f;
    s2s[KEY * NSEG + KEY] = 0.3f;
    s2s[KEY * NSEG + TABLE] = 0.6f;
    s2s[TABLE * NSEG + TABLE] = 0.7f;
}

static void table_is_found_only_through_the_key(void **state) {
    (void)state;
    float q2s[NSEG], s2s[NSEG * NSEG], imp[NSEG];
    door_key_table(q2s, s2s);
    uint8_t sel[NSEG];
    kvmem_multihop_params p = kvmem_multihop_default_params();
    p.ratio = 3.0f / 8.0f; /* m = 3 */
    kvmem_multihop_result r;

    /* one round from the query alone: door and two distractors */
    p.max_iters = 0;
    assert_ok(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r));
    assert_int_equal(r.n_selected, 3);
    assert_true(sel[DOOR] && sel[D1] && sel[D2]);
    assert_false(sel[KEY] || sel[TABLE]);
    assert_int_equal(r.converged, 0);

    /* one hop reaches the key but not yet the table */
    p.max_iters = 1;
    assert_ok(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r));
    assert_true(sel[DOOR] && sel[KEY]);
    assert_false(sel[TABLE]);

    /* enough hops: door, key, table, and a fixed point */
    p.max_iters = 8;
    assert_ok(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r));
    for (int j = 0; j < NSEG; j++) assert_int_equal(sel[j], j == DOOR || j == KEY || j == TABLE);
    assert_int_equal(r.converged, 1);
    assert_int_equal(r.iters, 3); /* {door,d1,d2} -> {key,door,d1} -> {key,table,door} -> same */
    /* importance = mean attention from the final set, checked by hand */
    double want_table = (0.0 + 0.6 + 0.7) / 3.0, want_d1 = (0.02 + 0.1 / 6 + 0.3 / 7) / 3.0;
    assert_near(imp[TABLE], want_table, 1e-6);
    assert_near(imp[D1], want_d1, 1e-6);
    /* the query alone would never rank the table in the top 3 */
    int better = 0;
    for (int j = 0; j < NSEG; j++) better += q2s[j] > q2s[TABLE];
    assert_true(better >= 3);
}

/* Independent reference: double precision, selection by repeated argmax. */
static int ref_select(const float *q2s, int nq, const float *s2s, int n, const uint8_t *cand, int m, int max_iters,
                      uint8_t *sel, int *iters) {
    double *imp = malloc((size_t)n * sizeof *imp);
    uint8_t *nx = malloc((size_t)n);
    for (int j = 0; j < n; j++) {
        imp[j] = 0;
        for (int q = 0; q < nq; q++) imp[j] += q2s[q * n + j];
        imp[j] /= nq;
    }
    int nc = 0;
    for (int j = 0; j < n; j++) nc += cand ? cand[j] : 1;
    if (m > nc) m = nc;
    for (int round = 0;; round++) {
        memset(nx, 0, (size_t)n);
        for (int t = 0; t < m; t++) {
            int best = -1;
            for (int j = 0; j < n; j++)
                if ((!cand || cand[j]) && !nx[j] && (best < 0 || imp[j] > imp[best])) best = j;
            nx[best] = 1;
        }
        if (round > 0 && memcmp(nx, sel, (size_t)n) == 0) {
            *iters = round;
            break;
        }
        memcpy(sel, nx, (size_t)n);
        if (round == max_iters || m == 0 || m == nc) {
            *iters = (m == 0 || m == nc) ? 0 : round;
            break;
        }
        for (int j = 0; j < n; j++) {
            imp[j] = 0;
            for (int a = 0; a < n; a++)
                if (sel[a]) imp[j] += s2s[a * n + j];
            imp[j] /= m;
        }
    }
    free(imp);
    free(nx);
    return m;
}

static void random_row(uint64_t *rng, float *row, int n) {
    double s = 0;
    for (int j = 0; j < n; j++) {
        float u = tu_uniform(rng, 0, 1);
        row[j] = u * u * u; /* peaky, like attention */
        s += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = (float)(row[j] / s);
}

/* Matches the reference on random graphs, within max_iters, and a converged
 * answer is a fixed point: one more round from it changes nothing. */
static void matches_reference_and_respects_the_bound(void **state) {
    (void)state;
    uint64_t rng = 7;
    for (int trial = 0; trial < 200; trial++) {
        int n = 2 + (int)(tu_next(&rng) % 40), nq = 1 + (int)(tu_next(&rng) % 6);
        int m = (int)(tu_next(&rng) % (uint64_t)(n + 1));
        int max_iters = (int)(tu_next(&rng) % 6);
        float *q2s = malloc((size_t)(nq * n) * sizeof *q2s), *s2s = malloc((size_t)(n * n) * sizeof *s2s);
        for (int q = 0; q < nq; q++) random_row(&rng, q2s + q * n, n);
        for (int a = 0; a < n; a++) random_row(&rng, s2s + a * n, n);
        uint8_t *cand = malloc((size_t)n), *sel = malloc((size_t)n), *ref = malloc((size_t)n);
        int use_cand = trial % 2;
        for (int j = 0; j < n; j++) cand[j] = (uint8_t)(tu_next(&rng) % 4 != 0);
        kvmem_multihop_params p = kvmem_multihop_default_params();
        p.ratio = (float)m / (float)n;
        p.max_iters = max_iters;
        kvmem_multihop_result r;
        assert_ok(kvmem_multihop_select(&p, q2s, nq, s2s, n, use_cand ? cand : NULL, sel, NULL, &r));
        int iters = 0;
        int mm = ref_select(q2s, nq, s2s, n, use_cand ? cand : NULL, m, max_iters, ref, &iters);
        assert_int_equal(r.n_selected, mm);
        assert_memory_equal(sel, ref, (size_t)n);
        assert_true(r.iters <= max_iters);
        assert_int_equal(r.iters, iters);
        for (int j = 0; j < n; j++)
            if (use_cand && !cand[j]) assert_int_equal(sel[j], 0);
        if (r.converged && mm > 0 && r.iters > 0) {
            /* fixed point: the top-m of the importance from sel is sel */
            double *imp = calloc((size_t)n, sizeof *imp);
            for (int j = 0; j < n; j++)
                for (int a = 0; a < n; a++)
                    if (sel[a]) imp[j] += s2s[a * n + j] / mm;
            for (int j = 0; j < n; j++)
                for (int k = 0; k < n; k++)
                    if (sel[j] && !sel[k] && (!use_cand || cand[k]))
                        assert_true(imp[j] > imp[k] || (imp[j] == imp[k] && j < k));
            free(imp);
        }
        free(q2s), free(s2s), free(cand), free(sel), free(ref);
    }
}

/* A two-cycle (A attends only to B, B only to A, m = 1) never settles: the
 * call stops after max_iters and says it did not converge. */
static void oscillation_stops_at_the_bound(void **state) {
    (void)state;
    float q2s[2] = {1, 0}, s2s[4] = {0, 1, 1, 0};
    uint8_t sel[2];
    kvmem_multihop_params p = kvmem_multihop_default_params();
    p.ratio = 0.5f;
    for (int it = 0; it <= 7; it++) {
        p.max_iters = it;
        kvmem_multihop_result r;
        assert_ok(kvmem_multihop_select(&p, q2s, 1, s2s, 2, NULL, sel, NULL, &r));
        assert_int_equal(r.iters, it);
        assert_int_equal(r.converged, 0);
        assert_int_equal(sel[0], it % 2 == 0); /* A, B, A, ... */
        assert_int_equal(sel[1], it % 2 == 1);
    }
}

/* Driving layers with the schedule and R_{i-1} as candidates: sets shrink,
 * sizes follow ceil(r_i n), r_1 = 1 recomputes everything. */
static void layers_are_monotone_and_follow_the_schedule(void **state) {
    (void)state;
    const int L = 12, n = 30;
    float ratios[12];
    assert_ok(kvmem_multihop_schedule(L, 0.4f, ratios));
    uint64_t rng = 99;
    uint8_t prev[30], cur[30];
    memset(prev, 1, sizeof prev);
    float q2s[2 * 30], s2s[30 * 30];
    for (int l = 0; l < L; l++) {
        for (int q = 0; q < 2; q++) random_row(&rng, q2s + q * n, n);
        for (int a = 0; a < n; a++) random_row(&rng, s2s + a * n, n);
        kvmem_multihop_params p = kvmem_multihop_default_params();
        p.ratio = ratios[l];
        kvmem_multihop_result r;
        assert_ok(kvmem_multihop_select(&p, q2s, 2, s2s, n, l ? prev : NULL, cur, NULL, &r));
        int cnt = 0;
        for (int j = 0; j < n; j++) {
            cnt += cur[j];
            if (!prev[j]) assert_int_equal(cur[j], 0); /* never back */
        }
        int want = (int)ceil((double)ratios[l] * n - 1e-4);
        assert_int_equal(cnt, want);
        if (l == 0) assert_int_equal(cnt, n);
        memcpy(prev, cur, sizeof cur);
    }
}

static void schedule_starts_at_one_falls_and_averages_r(void **state) {
    (void)state;
    const int Ls[] = {1, 2, 3, 12, 48, 80};
    const float avgs[] = {0.05f, 0.1f, 0.3f, 0.5f, 0.7f, 0.95f, 1.0f};
    for (size_t a = 0; a < sizeof Ls / sizeof Ls[0]; a++)
        for (size_t b = 0; b < sizeof avgs / sizeof avgs[0]; b++) {
            int L = Ls[a];
            float avg = avgs[b];
            float r[80];
            kvmem_status st = kvmem_multihop_schedule(L, avg, r);
            if (avg < 1.0f / L - 1e-6f) {
                assert_int_equal(st, KVMEM_ERR_INVALID_ARG);
                continue;
            }
            assert_int_equal(st, KVMEM_OK);
            double sum = 0;
            assert_true(r[0] == 1.0f);
            for (int i = 0; i < L; i++) {
                assert_true(r[i] >= 0.0f && r[i] <= 1.0f);
                if (i) assert_true(r[i] <= r[i - 1] + 1e-7f);
                sum += r[i];
            }
            if (L > 1) assert_near(sum / L, avg, 1e-5);
        }
}

static void bad_input_writes_nothing(void **state) {
    (void)state;
    float q2s[NSEG], s2s[NSEG * NSEG], imp[NSEG];
    door_key_table(q2s, s2s);
    uint8_t sel[NSEG], cand[NSEG];
    memset(sel, 0xAA, sizeof sel);
    memset(imp, 0, sizeof imp);
    memset(cand, 1, sizeof cand);
    kvmem_multihop_params p = kvmem_multihop_default_params();
    kvmem_multihop_result r = {0};
    assert_status(kvmem_multihop_select(&p, NULL, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "q2s is NULL");
    assert_status(kvmem_multihop_select(&p, q2s, 1, NULL, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "s2s is NULL");
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, NULL, imp, &r), KVMEM_ERR_INVALID_ARG, "selected is NULL");
    assert_status(kvmem_multihop_select(&p, q2s, 0, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "n_query");
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, 0, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "n_segments");
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, 70000, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "n_segments");
    p.ratio = 1.5f;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "ratio");
    p.ratio = NAN;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "ratio");
    p = kvmem_multihop_default_params();
    p.max_iters = -1;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "max_iters");
    p.max_iters = 8;
    q2s[3] = -0.1f;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "q2s[3]");
    q2s[3] = 0.09f;
    s2s[9] = INFINITY;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, NULL, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "s2s[9]");
    s2s[9] = 0.1f;
    cand[2] = 2;
    assert_status(kvmem_multihop_select(&p, q2s, 1, s2s, NSEG, cand, sel, imp, &r), KVMEM_ERR_INVALID_ARG, "candidates[2]");
    for (int j = 0; j < NSEG; j++) {
        assert_int_equal(sel[j], 0xAA);
        assert_true(imp[j] == 0.0f);
    }
    assert_int_equal(r.iters, 0);
    assert_int_equal(r.n_selected, 0);
    float rr[4] = {9, 9, 9, 9};
    assert_status(kvmem_multihop_schedule(4, 0.5f, NULL), KVMEM_ERR_INVALID_ARG, "ratios is NULL");
    assert_status(kvmem_multihop_schedule(0, 0.5f, rr), KVMEM_ERR_INVALID_ARG, "n_layers");
    assert_status(kvmem_multihop_schedule(4, 0.2f, rr), KVMEM_ERR_INVALID_ARG, "1/n_layers");
    assert_status(kvmem_multihop_schedule(4, 1.2f, rr), KVMEM_ERR_INVALID_ARG, "avg");
    assert_status(kvmem_multihop_schedule(4, NAN, rr), KVMEM_ERR_INVALID_ARG, "avg");
    for (int i = 0; i < 4; i++) assert_true(rr[i] == 9.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(table_is_found_only_through_the_key),
        cmocka_unit_test(matches_reference_and_respects_the_bound),
        cmocka_unit_test(oscillation_stops_at_the_bound),
        cmocka_unit_test(layers_are_monotone_and_follow_the_schedule),
        cmocka_unit_test(schedule_starts_at_one_falls_and_averages_r),
        cmocka_unit_test(bad_input_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The stop rule: it stops exactly when the remaining tiles carry no value,
 * its truncation error obeys the mass-decay bound, tau = 0 never stops,
 * compare mode reports the oracle without changing the output. */
#include "testutil.h"
#include "attend_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct setup {
    int Hq, H, D;
    int64_t T;
    float *q, *k, *v, *out;
    kvmem_tensor tq, tk, tv, to;
    kvmem_attend_source src;
} setup;

static void setup_init(setup *s, int Hq, int H, int D, int64_t T) {
    s->Hq = Hq, s->H = H, s->D = D, s->T = T;
    s->q = calloc((size_t)(Hq * D), sizeof(float));
    s->k = calloc((size_t)T * (size_t)(H * D), sizeof(float));
    s->v = calloc((size_t)T * (size_t)(H * D), sizeof(float));
    s->out = calloc((size_t)(Hq * D), sizeof(float));
    assert_non_null(s->q), assert_non_null(s->k), assert_non_null(s->v), assert_non_null(s->out);
    int64_t qs[3] = {1, Hq, D}, ks[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&s->tq, s->q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&s->to, s->out, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&s->tk, s->k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&s->tv, s->v, KVMEM_F32, 3, ks));
    memset(&s->src, 0, sizeof s->src);
    s->src.kind = KVMEM_ATTEND_SRC_TENSORS;
    s->src.k = &s->tk;
    s->src.v = &s->tv;
}

static void setup_free(setup *s) {
    free(s->q), free(s->k), free(s->v), free(s->out);
}

/* The two newest tiles hold the real keys; every older tile has keys far
 * opposite the query (weight exp(-170) = 0 in float) and zero values. */
static void build_zero_tail(setup *s, uint64_t seed) {
    uint64_t rng = seed;
    const int D = s->D;
    float u[64];
    for (int d = 0; d < D; d++) u[d] = tu_normal(&rng);
    for (int h = 0; h < s->Hq; h++)
        for (int d = 0; d < D; d++) s->q[h * D + d] = u[d];
    for (int64_t t = 0; t < s->T; t++)
        for (int d = 0; d < D; d++) {
            const int far = t < s->T - 128;
            s->k[t * D + d] = far ? -30.0f * u[d] / (float)sqrt(D) * 5.0f : tu_normal(&rng);
            s->v[t * D + d] = far ? 0.0f : tu_normal(&rng);
        }
}

static void stops_exactly_when_the_rest_carries_no_value(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    setup s;
    setup_init(&s, 2, 1, 32, 640); /* 10 tiles of 64 */
    build_zero_tail(&s, 1);
    double ref[64];
    ref_attend(s.q, 1, 2, 1, 32, s.k, s.v, s.T, NULL, 1.0 / sqrt(32.0), ref_all_visible, NULL, ref);
    /* RECENT reaches the two real tiles first by position; SCORED by their
     * logits (the old tiles score lowest), after reading every K row once */
    const kvmem_attend_order orders[2] = {KVMEM_ATTEND_RECENT, KVMEM_ATTEND_SCORED};
    for (int oi = 0; oi < 2; oi++) {
        kvmem_attend_params ap = kvmem_attend_default_params();
        ap.order = orders[oi];
        ap.n_sink = 0;
        ap.tile_size = 64;
        ap.patience = 2;
        ap.compare = 1;
        kvmem_attend_stats st;
        assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &st));
        assert_int_equal(st.n_streams, 1);
        assert_int_equal(st.tiles_total, 10);
        assert_int_equal(st.stopped_early, 1);
        assert_int_equal(st.streams_stopped, 1);
        /* two real tiles, then at most one changing and `patience` stable ones */
        assert_true(st.tiles_visited >= 3 && st.tiles_visited <= 5);
        assert_true(st.oracle_tiles >= 3 && st.oracle_tiles <= 5);
        /* compare = 1 reads on to the later of the two stops; a plain run reads its own */
        ap.compare = 0;
        assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &st));
        /* SCORED: K once in the scan, then V of the tiles it visits: half a row each */
        assert_true(st.positions_read == (oi ? st.tiles_visited * 64 / 2 + 640 / 2 : st.tiles_visited * 64));
        double e = ref_max_err(s.out, ref, 64);
        if (!(e <= 2e-5)) fail_msg("order %d: early stop changed the result: %g", oi, e);

        /* tau = 0: the same data is read to the end */
        ap.tau_s = ap.tau_d = 0;
        assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &st));
        assert_int_equal(st.stopped_early, 0);
        assert_int_equal(st.tiles_visited, 10);
        /* a patience longer than the tiles never stops either */
        ap = kvmem_attend_default_params();
        ap.order = orders[oi];
        ap.n_sink = 0;
        ap.tile_size = 64;
        ap.patience = 10;
        assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &st));
        assert_int_equal(st.tiles_visited, 10);
        assert_int_equal(st.stopped_early, 0);
    }
    setup_free(&s);
    kvmem_context_free(ctx);
}

/* Paper's assumption: the attention mass of tiles decays along the
 * traversal. Tile age a (0 = newest) gets logits -lambda * a + noise. When
 * the rule stops after t tiles, the unvisited mass fraction eps bounds the
 * error: o_t - o = eps (o_t - r), r a convex mix of the unvisited values, so
 * |o_t - o| <= 2 eps max_j |v_j|. */
static void truncation_error_obeys_the_mass_decay_bound(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    const int D = 32, n_tiles = 40, TS = 64;
    const double lambdas[3] = {0.5, 1.0, 2.0};
    for (int li = 0; li < 3; li++) {
        setup s;
        setup_init(&s, 1, 1, D, (int64_t)n_tiles * TS);
        uint64_t rng = 100 + (uint64_t)li;
        float u[32];
        double nn = 0;
        for (int d = 0; d < D; d++) u[d] = tu_normal(&rng), nn += (double)u[d] * u[d];
        for (int d = 0; d < D; d++) u[d] = (float)(u[d] / sqrt(nn)), s.q[d] = u[d] * (float)sqrt(D);
        double vmax = 0;
        for (int64_t t = 0; t < s.T; t++) {
            int age = n_tiles - 1 - (int)(t / TS);
            float logit = (float)(-lambdas[li] * age) + 0.3f * tu_normal(&rng);
            double vn = 0;
            for (int d = 0; d < D; d++) {
                s.k[t * D + d] = logit * u[d]; /* scale * q.k = logit */
                s.v[t * D + d] = tu_normal(&rng);
                vn += (double)s.v[t * D + d] * s.v[t * D + d];
            }
            vmax = fmax(vmax, sqrt(vn));
        }
        double ref[32];
        ref_attend(s.q, 1, 1, 1, D, s.k, s.v, s.T, NULL, 1.0 / sqrt(D), ref_all_visible, NULL, ref);
        kvmem_attend_params ap = kvmem_attend_default_params();
        ap.order = KVMEM_ATTEND_RECENT; /* the traversal the bound below assumes */
        ap.n_sink = 0;
        ap.tile_size = TS;
        kvmem_attend_stats st;
        assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &st));
        assert_int_equal(st.stopped_early, 1);
        const int64_t t = st.tiles_visited;
        assert_true(t < n_tiles);
        /* unvisited mass: tiles older than the t newest */
        double mass = 0, rest = 0;
        for (int64_t j = 0; j < s.T; j++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += (double)s.q[d] * s.k[j * D + d];
            double w = exp(dot / sqrt(D));
            mass += w;
            if (j < s.T - t * TS) rest += w;
        }
        double eps = rest / mass, err = 0;
        for (int d = 0; d < D; d++) err += (s.out[d] - ref[d]) * (s.out[d] - ref[d]);
        err = sqrt(err);
        if (!(err <= 2 * eps * vmax + 1e-5))
            fail_msg("lambda %g: stopped after %lld tiles, error %g above the bound 2 * %g * %g", lambdas[li],
                     (long long)t, err, eps, vmax);
        setup_free(&s);
    }
    kvmem_context_free(ctx);
}

/* compare = 1 only adds the oracle's verdict: the output is bit for bit the
 * same; with N = G * head_dim <= 32 the probe is the whole vector, so both
 * rules agree everywhere. */
static void compare_mode_reports_the_oracle_without_changing_output(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    setup s;
    setup_init(&s, 8, 2, 64, 2000);
    uint64_t rng = 3;
    for (int i = 0; i < 8 * 64; i++) s.q[i] = tu_normal(&rng);
    for (int64_t i = 0; i < s.T * 2 * 64; i++) s.k[i] = tu_normal(&rng), s.v[i] = tu_normal(&rng);
    for (int64_t t = s.T - 100; t < s.T; t++) /* a recent burst of strong keys */
        for (int h = 0; h < 2; h++)
            for (int d = 0; d < 64; d++) s.k[(t * 2 + h) * 64 + d] = 2.0f * s.q[(h * 4) * 64 + d];
    float a[8 * 64];
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = 0.05f;
    ap.tau_d = 0.01f;
    ap.patience = 1;
    kvmem_attend_stats s1, s2;
    assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &s1));
    memcpy(a, s.out, sizeof a);
    ap.compare = 1;
    assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &s2));
    assert_memory_equal(a, s.out, sizeof a);
    assert_int_equal(s1.tiles_visited, s2.tiles_visited);
    assert_int_equal(s1.oracle_tiles, 0);
    assert_true(s2.oracle_tiles >= s2.n_streams && s2.oracle_tiles <= s2.tiles_total);
    assert_true(s2.oracle_agree >= 0 && s2.oracle_agree <= s2.n_streams);
    assert_true(s2.positions_read >= s1.positions_read);
    /* ORACLE as the rule itself: compare agrees with itself */
    ap.probe = KVMEM_ATTEND_PROBE_ORACLE;
    assert_ok(kvmem_attend(ctx, &s.tq, &s.src, &ap, &s.to, &s2));
    assert_int_equal(s2.oracle_agree, s2.n_streams);
    assert_int_equal(s2.oracle_tiles, s2.tiles_visited);
    setup_free(&s);

    setup w;
    setup_init(&w, 2, 2, 16, 500); /* G * D = 16 <= 32 */
    for (int i = 0; i < 32; i++) w.q[i] = tu_normal(&rng);
    for (int64_t i = 0; i < w.T * 32; i++) w.k[i] = tu_normal(&rng), w.v[i] = tu_normal(&rng);
    ap = kvmem_attend_default_params();
    ap.compare = 1;
    ap.tau_s = 0.05f;
    ap.tau_d = 0.05f;
    ap.patience = 1;
    assert_ok(kvmem_attend(ctx, &w.tq, &w.src, &ap, &w.to, &s2));
    assert_int_equal(s2.oracle_agree, s2.n_streams);
    assert_int_equal(s2.oracle_tiles, s2.tiles_visited);
    setup_free(&w);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stops_exactly_when_the_rest_carries_no_value),
        cmocka_unit_test(truncation_error_obeys_the_mass_decay_bound),
        cmocka_unit_test(compare_mode_reports_the_oracle_without_changing_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

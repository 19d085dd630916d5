/* Cosine k-means: recovers separable clusters (up to relabelling), is a
 * Lloyd fixed point checked by a double-precision reference, is
 * deterministic for a seed and independent of row scale, and refuses bad
 * input without writing. */
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

/* n points around k random unit directions in dim dimensions, cluster of
 * point i = i % k, scaled by a random positive factor (cosine ignores it). */
static float *blobs(uint64_t *rng, int n, int k, int dim, float noise, int *truth) {
    float *dir = malloc((size_t)(k * dim) * sizeof *dir), *x = malloc((size_t)(n * dim) * sizeof *x);
    for (int c = 0; c < k; c++) {
        double s = 0;
        for (int d = 0; d < dim; d++) {
            dir[c * dim + d] = tu_normal(rng);
            s += (double)dir[c * dim + d] * dir[c * dim + d];
        }
        for (int d = 0; d < dim; d++) dir[c * dim + d] = (float)(dir[c * dim + d] / sqrt(s));
    }
    for (int i = 0; i < n; i++) {
        int c = i % k;
        truth[i] = c;
        float scale = tu_uniform(rng, 0.5f, 20.0f);
        for (int d = 0; d < dim; d++) x[i * dim + d] = scale * (dir[c * dim + d] + noise * tu_normal(rng));
    }
    free(dir);
    return x;
}

/* Same partition up to a relabelling (a bijection between labels). */
static void assert_same_partition(const int32_t *a, const int *b, int n, int k) {
    int map[64], back[64];
    for (int c = 0; c < k; c++) map[c] = back[c] = -1;
    for (int i = 0; i < n; i++) {
        assert_true(a[i] >= 0 && a[i] < k);
        if (map[a[i]] < 0 && back[b[i]] < 0) {
            map[a[i]] = b[i];
            back[b[i]] = a[i];
        }
        assert_int_equal(map[a[i]], b[i]);
        assert_int_equal(back[b[i]], a[i]);
    }
}

static void recovers_separable_clusters(void **state) {
    (void)state;
    uint64_t rng = 11;
    const int ks[] = {2, 3, 5, 8};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        int k = ks[t], n = 40 * k, dim = 32;
        int *truth = malloc((size_t)n * sizeof *truth);
        float *x = blobs(&rng, n, k, dim, 0.05f, truth);
        int32_t *lab = malloc((size_t)n * sizeof *lab), iters = 0;
        float *cent = malloc((size_t)(k * dim) * sizeof *cent);
        kvmem_kmeans_params p = kvmem_kmeans_default_params();
        p.k = k;
        assert_ok(kvmem_cluster_kmeans(x, (size_t)n, (size_t)dim, &p, lab, cent, &iters));
        assert_same_partition(lab, truth, n, k);
        assert_true(iters >= 1 && iters <= p.max_iters);

        /* reference in double: centroids are the normalised means of the
         * rows the labels give, and every row is nearest its own centroid */
        double *ref = calloc((size_t)(k * dim), sizeof *ref);
        for (int i = 0; i < n; i++) {
            double nn = 0;
            for (int d = 0; d < dim; d++) nn += (double)x[i * dim + d] * x[i * dim + d];
            for (int d = 0; d < dim; d++) ref[lab[i] * dim + d] += x[i * dim + d] / sqrt(nn);
        }
        for (int c = 0; c < k; c++) {
            double nn = 0;
            for (int d = 0; d < dim; d++) nn += ref[c * dim + d] * ref[c * dim + d];
            for (int d = 0; d < dim; d++) {
                ref[c * dim + d] /= sqrt(nn);
                assert_near(cent[c * dim + d], ref[c * dim + d], 1e-5);
            }
        }
        for (int i = 0; i < n; i++) {
            double best = -2, own = 0;
            for (int c = 0; c < k; c++) {
                double s = 0;
                for (int d = 0; d < dim; d++) s += ref[c * dim + d] * x[i * dim + d];
                if (c == lab[i]) own = s;
                if (s > best) best = s;
            }
            assert_true(own >= best - 1e-6 * fabs(best));
        }
        free(truth), free(x), free(lab), free(cent), free(ref);
    }
}

static void deterministic_and_scale_free(void **state) {
    (void)state;
    uint64_t rng = 5;
    int n = 200, k = 6, dim = 16;
    int truth[200];
    float *x = blobs(&rng, n, k, dim, 0.6f, truth); /* overlapping: the answer depends on the start */
    int32_t a[200], b[200], c[200];
    kvmem_kmeans_params p = kvmem_kmeans_default_params();
    p.k = k;
    assert_ok(kvmem_cluster_kmeans(x, (size_t)n, (size_t)dim, &p, a, NULL, NULL));
    assert_ok(kvmem_cluster_kmeans(x, (size_t)n, (size_t)dim, &p, b, NULL, NULL));
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < n * dim; i++) x[i] *= 4.0f; /* a power of two: exact */
    assert_ok(kvmem_cluster_kmeans(x, (size_t)n, (size_t)dim, &p, c, NULL, NULL));
    assert_memory_equal(a, c, sizeof a);
    /* every cluster is used */
    int used[6] = {0};
    for (int i = 0; i < n; i++) used[a[i]] = 1;
    for (int j = 0; j < k; j++) assert_true(used[j]);
    /* k = n: every point its own cluster; k = 1: one cluster */
    int32_t lab[5];
    float small[5 * 2] = {1, 0, 0, 1, -1, 0, 0, -1, 1, 1};
    p.k = 5;
    assert_ok(kvmem_cluster_kmeans(small, 5, 2, &p, lab, NULL, NULL));
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < i; j++) assert_int_not_equal(lab[i], lab[j]);
    p.k = 1;
    assert_ok(kvmem_cluster_kmeans(small, 5, 2, &p, lab, NULL, NULL));
    for (int i = 0; i < 5; i++) assert_int_equal(lab[i], 0);
    /* duplicates: more clusters than distinct points still fills every label */
    float dup[4 * 2] = {1, 0, 1, 0, 1, 0, 0, 1};
    int32_t dl[4];
    p.k = 3;
    assert_ok(kvmem_cluster_kmeans(dup, 4, 2, &p, dl, NULL, NULL));
    for (int i = 0; i < 4; i++) assert_true(dl[i] >= 0 && dl[i] < 3);
    free(x);
}

static void bad_input_writes_nothing(void **state) {
    (void)state;
    float x[4 * 2] = {1, 0, 0, 1, 1, 1, -1, 0};
    int32_t lab[4] = {-9, -9, -9, -9}, iters = -9;
    float cent[2 * 2] = {7, 7, 7, 7};
    kvmem_kmeans_params p = kvmem_kmeans_default_params();
    assert_int_equal(p.k, 8);
    p.k = 2;
    assert_status(kvmem_cluster_kmeans(NULL, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "emb is NULL");
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, NULL, cent, &iters), KVMEM_ERR_INVALID_ARG, "labels is NULL");
    assert_status(kvmem_cluster_kmeans(x, 0, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "n = 0");
    assert_status(kvmem_cluster_kmeans(x, 4, 0, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "dim = 0");
    assert_status(kvmem_cluster_kmeans(x, SIZE_MAX / 2, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "n =");
    assert_status(kvmem_cluster_kmeans(x, 4, (size_t)1 << 21, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "dim =");
    p.k = 0;
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "k = 0");
    p.k = 5;
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "k = 5");
    p.k = 2;
    p.max_iters = 0;
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "max_iters");
    p.max_iters = 10;
    x[5] = NAN;
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "emb[2][1]");
    x[5] = 1;
    x[6] = 0;
    x[7] = 0;
    assert_status(kvmem_cluster_kmeans(x, 4, 2, &p, lab, cent, &iters), KVMEM_ERR_INVALID_ARG, "row 3 is all zeros");
    for (int i = 0; i < 4; i++) assert_int_equal(lab[i], -9);
    for (int i = 0; i < 4; i++) assert_true(cent[i] == 7.0f);
    assert_int_equal(iters, -9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(recovers_separable_clusters),
        cmocka_unit_test(deterministic_and_scale_free),
        cmocka_unit_test(bad_input_writes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

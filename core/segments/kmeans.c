/* Cosine k-means, the grouping helper for KEEP segments: spherical Lloyd
 * iterations from a seeded k-means++ start. Sizes are small (hundreds to
 * thousands of memories), so plain double-accumulating loops suffice and
 * keep the result independent of thread count and SIMD level. */
#include "../internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kvmem_status kvmem_kmeans_params_init(kvmem_kmeans_params *params, size_t struct_size) {
    kvmem_kmeans_params p;
    memset(&p, 0, sizeof p);
    p.k = 8;
    p.max_iters = 100;
    p.seed = 42;
    return KVM_PARAMS_INIT(kvmem_kmeans_params, params, struct_size, &p, "kvmem_kmeans_params_init");
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 bits. */
static double uniform01(uint64_t *x) { return (double)(splitmix(x) >> 11) * (1.0 / 9007199254740992.0); }

static double dot(const float *a, const float *b, size_t dim) {
    double s = 0;
    for (size_t d = 0; d < dim; d++) s += (double)a[d] * (double)b[d];
    return s;
}

/* Nearest centroid by cosine (ties: lower cluster), and that similarity. */
static int32_t nearest(const float *x, const float *cent, int32_t k, size_t dim, double *sim) {
    int32_t best = 0;
    double bs = -INFINITY;
    for (int32_t c = 0; c < k; c++) {
        double v = dot(x, cent + (size_t)c * dim, dim);
        if (v > bs) {
            bs = v;
            best = c;
        }
    }
    *sim = bs;
    return best;
}

static void normalise(float *x, size_t dim) {
    double n = sqrt(dot(x, x, dim));
    if (n > 0)
        for (size_t d = 0; d < dim; d++) x[d] = (float)(x[d] / n);
}

kvmem_status kvmem_cluster_kmeans(const float *emb, size_t n, size_t dim, const kvmem_kmeans_params *params,
                                  int32_t *labels, float *centroids, int32_t *iters) {
    const char *fn = "kvmem_cluster_kmeans";
    if (!emb || !labels) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, emb ? "labels" : "emb");
    if (n == 0 || n > (size_t)INT32_MAX) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n = %zu must be in [1, 2^31-1]", fn, n);
    if (dim == 0 || dim > ((size_t)1 << 20)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: dim = %zu must be in [1, 2^20]", fn, dim);
    kvmem_kmeans_params p = kvmem_kmeans_default_params();
    kvmem_status st = KVM_PARAMS_IN(kvmem_kmeans_params, &p, params, fn);
    if (st != KVMEM_OK) return st;
    if (p.k < 1 || (size_t)p.k > n) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: k = %d must be in [1, n = %zu]", fn, p.k, n);
    if (p.max_iters < 1 || p.max_iters > 10000)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: max_iters = %d must be in [1, 10000]", fn, p.max_iters);
    size_t total, kd;
    if (!kvm_mul_size(n, dim, &total) || total > SIZE_MAX / sizeof(float))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n * dim overflows", fn);
    kd = (size_t)p.k * dim;
    for (size_t i = 0; i < n; i++) {
        double ss = 0;
        for (size_t d = 0; d < dim; d++) {
            float v = emb[i * dim + d];
            if (!isfinite(v)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: emb[%zu][%zu] is not finite", fn, i, d);
            ss += (double)v * v;
        }
        if (!(ss > 0)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: row %zu is all zeros: cosine is undefined", fn, i);
    }
    const int32_t k = p.k;
    float *x = kvm_malloc(total * sizeof *x);
    float *cent = kvm_malloc(kd * sizeof *cent);
    double *acc = kvm_malloc(kd * sizeof *acc);
    double *dist = kvm_malloc(n * sizeof *dist);
    int32_t *lab = kvm_malloc(n * sizeof *lab);
    int32_t *cnt = kvm_malloc((size_t)k * sizeof *cnt);
    if (!x || !cent || !acc || !dist || !lab || !cnt) {
        kvm_free(x), kvm_free(cent), kvm_free(acc), kvm_free(dist), kvm_free(lab), kvm_free(cnt);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of %zu points", fn, n);
    }
    memcpy(x, emb, total * sizeof *x);
    for (size_t i = 0; i < n; i++) normalise(x + i * dim, dim);

    /* k-means++ with D(x) = 1 - cos (>= 0 on unit vectors), drawn with
     * probability proportional to D^2. */
    uint64_t rng = p.seed;
    size_t first = (size_t)(uniform01(&rng) * (double)n);
    if (first >= n) first = n - 1;
    memcpy(cent, x + first * dim, dim * sizeof *cent);
    for (size_t i = 0; i < n; i++) {
        double dd = 1.0 - dot(x + i * dim, cent, dim);
        dist[i] = dd > 0 ? dd * dd : 0;
    }
    for (int32_t c = 1; c < k; c++) {
        double sum = 0;
        for (size_t i = 0; i < n; i++) sum += dist[i];
        size_t pick = 0;
        if (sum > 0) {
            double r = uniform01(&rng) * sum, run = 0;
            pick = n - 1;
            for (size_t i = 0; i < n; i++) {
                run += dist[i];
                if (dist[i] > 0 && run > r) {
                    pick = i;
                    break;
                }
            }
            while (dist[pick] <= 0 && pick > 0) pick--; /* rounding at the end of the walk */
        } else {
            pick = (size_t)c % n; /* every point coincides with a centre: any point will do */
        }
        float *cc = cent + (size_t)c * dim;
        memcpy(cc, x + pick * dim, dim * sizeof *cc);
        for (size_t i = 0; i < n; i++) {
            double dd = 1.0 - dot(x + i * dim, cc, dim);
            dd = dd > 0 ? dd * dd : 0;
            if (dd < dist[i]) dist[i] = dd;
        }
    }

    for (size_t i = 0; i < n; i++) lab[i] = -1;
    int32_t it = 0;
    for (; it < p.max_iters; it++) {
        int changed = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t b = nearest(x + i * dim, cent, k, dim, &dist[i]);
            if (b != lab[i]) {
                lab[i] = b;
                changed = 1;
            }
        }
        if (!changed) break;
        memset(acc, 0, kd * sizeof *acc);
        memset(cnt, 0, (size_t)k * sizeof *cnt);
        for (size_t i = 0; i < n; i++) {
            cnt[lab[i]]++;
            for (size_t d = 0; d < dim; d++) acc[(size_t)lab[i] * dim + d] += x[i * dim + d];
        }
        for (int32_t c = 0; c < k; c++) {
            float *cc = cent + (size_t)c * dim;
            double nn = 0;
            for (size_t d = 0; d < dim; d++) nn += acc[(size_t)c * dim + d] * acc[(size_t)c * dim + d];
            if (cnt[c] > 0 && nn > 0) {
                nn = sqrt(nn);
                for (size_t d = 0; d < dim; d++) cc[d] = (float)(acc[(size_t)c * dim + d] / nn);
                continue;
            }
            /* Emptied (or cancelled-out) cluster: re-seed it with the point
             * least similar to its own centroid, taken from a cluster with
             * more than one point so no other cluster empties. */
            size_t far = n;
            for (size_t i = 0; i < n; i++)
                if (cnt[lab[i]] > 1 && (far == n || dist[i] < dist[far])) far = i;
            if (far == n) far = 0;
            cnt[lab[far]]--;
            cnt[c] = 1;
            lab[far] = c;
            dist[far] = 1.0;
            memcpy(cc, x + far * dim, dim * sizeof *cc);
        }
    }
    if (it < p.max_iters) it++; /* the round that saw no change counts */
    memcpy(labels, lab, n * sizeof *labels);
    if (centroids) memcpy(centroids, cent, kd * sizeof *centroids);
    if (iters) *iters = it;
    kvm_free(x), kvm_free(cent), kvm_free(acc), kvm_free(dist), kvm_free(lab), kvm_free(cnt);
    return KVMEM_OK;
}

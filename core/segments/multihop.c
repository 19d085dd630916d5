/* KEEP multi-hop importance selection and the per-layer ratio schedule.
 * A memory can matter to the query only through another memory (the query
 * names the locked door, the door's memory attends to the key, the key's to
 * the table): importance is propagated from the query over the
 * segment->segment attention graph until the top set stops changing. */
#include "../internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MH_MAX_SEGMENTS 65536
#define MH_MAX_QUERY (1 << 24)

kvmem_status kvmem_multihop_params_init(kvmem_multihop_params *params, size_t struct_size) {
    kvmem_multihop_params p;
    memset(&p, 0, sizeof p);
    p.ratio = 1.0f;
    p.max_iters = 8;
    return KVM_PARAMS_INIT(kvmem_multihop_params, params, struct_size, &p, "kvmem_multihop_params_init");
}

typedef struct mh_item {
    double v;
    int32_t i;
} mh_item;

static int item_cmp(const void *pa, const void *pb) {
    const mh_item *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Mark in `sel` the top m candidates by imp (ties: lower index). */
static void top_m(const double *imp, const int32_t *cand, int32_t nc, int32_t m, mh_item *tmp, uint8_t *sel,
                  int32_t n) {
    for (int32_t c = 0; c < nc; c++) tmp[c] = (mh_item){imp[cand[c]], cand[c]};
    qsort(tmp, (size_t)nc, sizeof *tmp, item_cmp);
    memset(sel, 0, (size_t)n);
    for (int32_t c = 0; c < m; c++) sel[tmp[c].i] = 1;
}

static kvmem_status check_probs(const float *a, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!(a[i] >= 0.0f) || !isfinite(a[i]))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_multihop_select: %s[%zu] = %g: attention must be finite and >= 0",
                            what, i, (double)a[i]);
    return KVMEM_OK;
}

kvmem_status kvmem_multihop_select(const kvmem_multihop_params *params, const float *q2s, int32_t n_query,
                                   const float *s2s, int32_t n, const uint8_t *candidates, uint8_t *selected,
                                   float *importance, kvmem_multihop_result *result) {
    const char *fn = "kvmem_multihop_select";
    if (!q2s || !s2s || !selected)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, !q2s ? "q2s" : !s2s ? "s2s" : "selected");
    if (n_query < 1 || n_query > MH_MAX_QUERY)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_query = %d must be in [1, %d]", fn, n_query, MH_MAX_QUERY);
    if (n < 1 || n > MH_MAX_SEGMENTS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_segments = %d must be in [1, %d]", fn, n, MH_MAX_SEGMENTS);
    kvmem_multihop_params p = kvmem_multihop_default_params();
    kvmem_status st = KVM_PARAMS_IN(kvmem_multihop_params, &p, params, fn);
    if (st != KVMEM_OK) return st;
    if (!(p.ratio >= 0.0f && p.ratio <= 1.0f))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ratio = %g must be in [0, 1]", fn, (double)p.ratio);
    if (p.max_iters < 0 || p.max_iters > 1000)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: max_iters = %d must be in [0, 1000]", fn, p.max_iters);
    if ((st = check_probs(q2s, (size_t)n_query * (size_t)n, "q2s")) != KVMEM_OK) return st;
    if ((st = check_probs(s2s, (size_t)n * (size_t)n, "s2s")) != KVMEM_OK) return st;
    int32_t nc = 0;
    for (int32_t j = 0; j < n; j++) {
        if (candidates && candidates[j] > 1)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: candidates[%d] = %u must be 0 or 1", fn, j, candidates[j]);
        nc += candidates ? candidates[j] : 1;
    }
    /* m = ceil(ratio * n), with a relative tolerance so that a float ratio
     * like 0.3f (0.30000001) still means 30%. */
    double want = ceil((double)p.ratio * n - 1e-6 * n);
    int32_t m = want < 0 ? 0 : (int32_t)want;
    if (m > nc) m = nc;

    double *imp = kvm_malloc((size_t)n * sizeof *imp);
    int32_t *cand = kvm_malloc((size_t)n * sizeof *cand);
    mh_item *tmp = kvm_malloc((size_t)n * sizeof *tmp);
    uint8_t *cur = kvm_malloc((size_t)n), *next = kvm_malloc((size_t)n);
    if (!imp || !cand || !tmp || !cur || !next) {
        kvm_free(imp), kvm_free(cand), kvm_free(tmp), kvm_free(cur), kvm_free(next);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of %d segments", fn, n);
    }
    nc = 0;
    for (int32_t j = 0; j < n; j++)
        if (!candidates || candidates[j]) cand[nc++] = j;

    /* round 0: mean attention from the query tokens */
    for (int32_t j = 0; j < n; j++) imp[j] = 0;
    for (int32_t q = 0; q < n_query; q++)
        for (int32_t j = 0; j < n; j++) imp[j] += q2s[(size_t)q * (size_t)n + (size_t)j];
    for (int32_t j = 0; j < n; j++) imp[j] /= n_query;
    top_m(imp, cand, nc, m, tmp, cur, n);

    int32_t it = 0, converged = 1;
    if (m > 0 && m < nc) {
        converged = 0;
        while (it < p.max_iters) {
            for (int32_t j = 0; j < n; j++) imp[j] = 0;
            for (int32_t a = 0; a < n; a++) {
                if (!cur[a]) continue;
                const float *row = s2s + (size_t)a * (size_t)n;
                for (int32_t j = 0; j < n; j++) imp[j] += row[j];
            }
            for (int32_t j = 0; j < n; j++) imp[j] /= m;
            top_m(imp, cand, nc, m, tmp, next, n);
            it++;
            int same = memcmp(cur, next, (size_t)n) == 0;
            uint8_t *t = cur;
            cur = next;
            next = t;
            if (same) {
                converged = 1;
                break;
            }
        }
    }
    memcpy(selected, cur, (size_t)n);
    if (importance)
        for (int32_t j = 0; j < n; j++) importance[j] = (float)imp[j];
    if (result) {
        memset(result, 0, sizeof *result);
        result->n_selected = m;
        result->iters = it;
        result->converged = converged;
    }
    kvm_free(imp), kvm_free(cand), kvm_free(tmp), kvm_free(cur), kvm_free(next);
    return KVMEM_OK;
}

kvmem_status kvmem_multihop_schedule(int32_t n_layers, float avg, float *ratios) {
    const char *fn = "kvmem_multihop_schedule";
    if (!ratios) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ratios is NULL", fn);
    if (n_layers < 1 || n_layers > 65536)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_layers = %d must be in [1, 65536]", fn, n_layers);
    double lo = 1.0 / n_layers;
    if (!(avg >= lo - 1e-6 && avg <= 1.0f))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: avg = %g must be in [1/n_layers = %g, 1] (r_1 = 1 alone averages 1/n_layers)",
                        fn, (double)avg, lo);
    ratios[0] = 1.0f;
    if (n_layers == 1) return KVMEM_OK;
    /* c: mean of layers 2..n; linear from hi to 2c - hi keeps that mean */
    double c = ((double)avg * n_layers - 1.0) / (n_layers - 1);
    if (c < 0) c = 0;
    if (c > 1) c = 1;
    double hi = KVM_MIN(1.0, 1.5 * c), end = 2 * c - hi;
    for (int32_t i = 1; i < n_layers; i++) {
        double f = n_layers > 2 ? (double)(i - 1) / (n_layers - 2) : 0.5;
        double r = hi + (end - hi) * f;
        ratios[i] = (float)(r < 0 ? 0 : r);
    }
    return KVMEM_OK;
}

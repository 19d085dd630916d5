/* Kept-set selection: IntentKV's forced set plus top-C*, and the
 * StreamingLLM and H2O baselines on the same output format (ascending
 * kept positions, applied with kvmem_slotmap_evict). */
#include "../internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float s;
    int32_t j;
} cand;

/* Best first; equal scores: the older (smaller) position first, so the
 * result is deterministic. */
static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->j > y->j) - (x->j < y->j);
}

kvmem_status kvmem_select_keep(const float *scores, int64_t n, int64_t budget, int64_t protect,
                               int64_t span_begin, int64_t span_end, int32_t *kept, int64_t *n_kept) {
    static const char fn[] = "kvmem_select_keep";
    if (!scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores is NULL", fn);
    if (!kept) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: kept is NULL", fn);
    if (!n_kept) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_kept is NULL", fn);
    if (n < 1 || n > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: N = %lld outside [1, INT32_MAX]", fn, (long long)n);
    if (budget < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: budget %lld is negative", fn, (long long)budget);
    if (protect < 0 || protect > n)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: protected prefix %lld outside [0, N = %lld]", fn,
                        (long long)protect, (long long)n);
    if (span_begin < 0 || span_end < span_begin || span_end > n)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: query span [%lld, %lld) not inside [0, N = %lld)", fn,
                        (long long)span_begin, (long long)span_end, (long long)n);
    for (int64_t j = 0; j < n; j++)
        if (isnan(scores[j])) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores[%lld] is NaN", fn, (long long)j);
    if (n <= budget) { /* no compression */
        for (int64_t j = 0; j < n; j++) kept[j] = (int32_t)j;
        *n_kept = n;
        return KVMEM_OK;
    }
    unsigned char *keep = kvm_calloc((size_t)n, 1);
    cand *c = kvm_malloc((size_t)n * sizeof *c);
    if (!keep || !c) {
        kvm_free(keep);
        kvm_free(c);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %lld candidates", fn, (long long)n);
    }
    int64_t forced = 0, nc = 0;
    for (int64_t j = 0; j < n; j++) {
        if (j < protect || (j >= span_begin && j < span_end)) {
            keep[j] = 1;
            forced++;
        } else {
            c[nc].s = scores[j];
            c[nc].j = (int32_t)j;
            nc++;
        }
    }
    int64_t room = budget > forced ? budget - forced : 0;
    if (room > 0 && room < nc) qsort(c, (size_t)nc, sizeof *c, cand_cmp);
    for (int64_t i = 0; i < KVM_MIN(room, nc); i++) keep[c[i].j] = 1;
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (keep[j]) kept[m++] = (int32_t)j;
    *n_kept = m;
    kvm_free(keep);
    kvm_free(c);
    return KVMEM_OK;
}

kvmem_status kvmem_streaming_keep(int64_t n, int64_t n_sink, int64_t window, int32_t *kept, int64_t *n_kept) {
    static const char fn[] = "kvmem_streaming_keep";
    if (!kept || !n_kept) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: kept or n_kept is NULL", fn);
    if (n < 1 || n > INT32_MAX)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: N = %lld outside [1, INT32_MAX]", fn, (long long)n);
    if (n_sink < 0 || window < 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_sink %lld and window %lld must be >= 0", fn,
                        (long long)n_sink, (long long)window);
    int64_t m = 0, recent0 = n - KVM_MIN(window, n);
    for (int64_t j = 0; j < n; j++)
        if (j < n_sink || j >= recent0) kept[m++] = (int32_t)j;
    *n_kept = m;
    return KVMEM_OK;
}

kvmem_status kvmem_h2o_accumulate(const float *probs, int64_t n_rows, int64_t n, float *acc) {
    static const char fn[] = "kvmem_h2o_accumulate";
    if (!probs || !acc) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: probs or acc is NULL", fn);
    if (n < 1 || n > INT32_MAX || n_rows < 0 || (n_rows > 0 && n > INT64_MAX / n_rows))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: shape [%lld][%lld] is invalid", fn, (long long)n_rows,
                        (long long)n);
    /* validate everything first, so a bad row changes nothing */
    for (int64_t i = 0; i < n_rows * n; i++)
        if (!(probs[i] >= 0.0f) || !isfinite(probs[i]))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: probs[%lld][%lld] = %g is not a probability", fn,
                            (long long)(i / n), (long long)(i % n), (double)probs[i]);
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t j = 0; j < n; j++) acc[j] += probs[r * n + j];
    return KVMEM_OK;
}

kvmem_status kvmem_h2o_keep(const float *acc, int64_t n, int64_t budget, int64_t recent, int32_t *kept,
                            int64_t *n_kept) {
    if (recent < 0 || recent > budget)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_h2o_keep: recent window %lld outside [0, budget = %lld]",
                        (long long)recent, (long long)budget);
    if (n >= 1 && recent > n) recent = n;
    /* the recent floor is H2O's forced set; heavy hitters fill the rest */
    return kvmem_select_keep(acc, n, budget, 0, n - recent, n, kept, n_kept);
}

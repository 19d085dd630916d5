/* The CPU backend's top-k: the bounded heap retrieval ranks its candidates
 * with, and the dev_topk entry over it (core/backend/backend.h). */
#include "cpu_backend.h"
#include "../internal.h"
#include "../backend/dev_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* a ranks before b: larger value, ties toward the lower index */
static int before(const float *v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

/* Heap of the k best so far in out_idx[0..m), the worst at the root. */
static void sift_down(const float *v, int32_t *h, int32_t m, int32_t i) {
    for (;;) {
        int32_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < m && before(v, h[w], h[l])) w = l;
        if (r < m && before(v, h[w], h[r])) w = r;
        if (w == i) return;
        int32_t t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

kvmem_status kvm_cpu_topk(kvmem_backend *be, const float *score, int32_t n, int32_t k, int32_t *out_idx,
                          int32_t *n_out) {
    (void)be;
    *n_out = 0;
    if (n <= 0 || k <= 0) return KVMEM_OK;
    /* a bounded heap: O(n log k), no allocation, no sort of all n */
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(score[i])) continue;
        if (m < k) {
            out_idx[m++] = i;
            for (int32_t c = m - 1; c > 0;) { /* sift up: the worst to the root */
                int32_t par = (c - 1) / 2;
                if (!before(score, out_idx[par], out_idx[c])) break;
                int32_t t = out_idx[par];
                out_idx[par] = out_idx[c];
                out_idx[c] = t;
                c = par;
            }
        } else if (before(score, i, out_idx[0])) {
            out_idx[0] = i;
            sift_down(score, out_idx, m, 0);
        }
    }
    /* heap sort in place: the worst goes last */
    for (int32_t e = m - 1; e > 0; e--) {
        int32_t t = out_idx[0];
        out_idx[0] = out_idx[e];
        out_idx[e] = t;
        sift_down(score, out_idx, e, 0);
    }
    *n_out = m;
    return KVMEM_OK;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

kvmem_status kvm_cpu_dev_topk(kvmem_backend *be, const kvm_dev_topk_args *a) {
    char msg[256];
    kvmem_status st = kvm_dev_topk_check(a, kvm_cpu_buffer_size, msg, sizeof msg);
    if (st != KVMEM_OK) return kvm_fail(st, "%s", msg);
    if (a->n == 0 || a->k == 0) {
        *a->n_out = 0;
        return KVMEM_OK;
    }
    /* the heap works in idx itself (min(k, n) entries, checked), then the
     * chosen indices are put in ascending order: nothing to allocate */
    int32_t c = 0, *idx = kvm_cpu_at(a->idx, a->idx_off);
    st = kvm_cpu_topk(be, (const float *)kvm_cpu_at(a->scores, a->scores_off), a->n, a->k, idx, &c);
    if (st == KVMEM_OK) {
        qsort(idx, (size_t)c, sizeof *idx, cmp_i32);
        *a->n_out = c;
    }
    return st;
}


/* KEEP layer-balanced KV loading. Recompute sets shrink with depth, so the
 * plain next-layer pipeline has little to load early (everything is being
 * recomputed) and a lot late; the compute stream then waits on the load
 * stream. A segment dropped from the recompute set at layer e is never
 * recomputed again (multi-hop selection is monotone), so its KV for every
 * layer >= e may be loaded as soon as that is known, into the load stream's
 * idle time under earlier layers. This file simulates both pipelines. */
#include "../internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kvmem_status kvmem_load_plan_params_init(kvmem_load_plan_params *params, size_t struct_size) {
    kvmem_load_plan_params p;
    memset(&p, 0, sizeof p);
    p.bandwidth_gbps = 25.0;
    p.max_ahead = 0;
    return KVM_PARAMS_INIT(kvmem_load_plan_params, params, struct_size, &p, "kvmem_load_plan_params_init");
}

typedef struct lp_sim {
    int32_t L, n;
    const double *comp;    /* [L] */
    const double *dur;     /* [n] ms per load */
    const int32_t *first;  /* [n] first layer that does not recompute j (L = never) */
    const int32_t *ord;    /* [n] segments sorted by (first, index): release order */
    const int32_t *rank;   /* [n] position of j in ord */
    int naive;
    int32_t ahead;         /* balanced: 0 = any */
    /* state */
    int32_t *head;         /* [n] next layer to load for j */
    int32_t *bucket;       /* [L][n]: released segments whose next load is for layer i, in ord order */
    int32_t *bn;           /* [L] bucket sizes */
    double *ready;         /* [L] end of the last load of layer i */
    double *cstart, *cend;
    kvmem_load_item *items; /* n_loads, load-stream order, or NULL */
    size_t n_items;
    double makespan, load_idle;
} lp_sim;

/* Earliest start of segment j's load for layer i; j is released (its
 * decision layer has run) and the gate layer, if any, has started. */
static double avail(const lp_sim *s, int32_t j, int32_t i) {
    int32_t e = s->first[j];
    double rel = e > 0 ? s->cend[e - 1] : 0;
    int32_t g = s->naive ? i - 1 : (s->ahead > 0 ? i - s->ahead : -1);
    double gate = g >= 0 ? s->cstart[g] : 0;
    return KVM_MAX(rel, gate);
}

static void bucket_insert(lp_sim *s, int32_t layer, int32_t j) {
    int32_t *b = s->bucket + (size_t)layer * (size_t)s->n, n = s->bn[layer];
    int32_t lo = 0, hi = n;
    while (lo < hi) { /* first position whose rank exceeds j's */
        int32_t mid = (lo + hi) / 2;
        if (s->rank[b[mid]] < s->rank[j]) lo = mid + 1;
        else hi = mid;
    }
    memmove(b + lo + 1, b + lo, (size_t)(n - lo) * sizeof *b);
    b[lo] = j;
    s->bn[layer]++;
}

static void bucket_remove(lp_sim *s, int32_t layer, int32_t pos) {
    int32_t *b = s->bucket + (size_t)layer * (size_t)s->n;
    memmove(b + pos, b + pos + 1, (size_t)(s->bn[layer] - pos - 1) * sizeof *b);
    s->bn[layer]--;
}

/* Run one pipeline. Loads for the layer compute waits on go first, in
 * release order (release time, then decision layer, then segment). The
 * balanced plan fills the load stream's wait for them with released loads
 * of the nearest later layer that end in time (in release order among
 * those that fit). Cost: O(loads x (n_layers + bucket size)). */
static void simulate(lp_sim *s) {
    const int32_t L = s->L, n = s->n;
    int32_t next = 0, released = 0;
    double cfree = 0, tload = 0;
    s->n_items = 0;
    s->load_idle = 0;
    for (int32_t i = 0; i < L; i++) {
        s->bn[i] = 0;
        s->ready[i] = 0;
    }
    for (int32_t j = 0; j < n; j++) s->head[j] = s->first[j];
    for (;;) {
        /* release the segments decided by now: first <= next */
        while (released < n && s->first[s->ord[released]] <= next && s->first[s->ord[released]] < L) {
            int32_t j = s->ord[released++];
            bucket_insert(s, s->first[j], j);
        }
        if (next < L && s->bn[next] == 0) {
            double st = KVM_MAX(cfree, s->ready[next]);
            s->cstart[next] = st;
            s->cend[next] = cfree = st + s->comp[next];
            next++;
            continue;
        }
        if (next == L) break;
        const int32_t b = next;
        int32_t pick = s->bucket[(size_t)b * (size_t)n], layer = b, pos = 0;
        double need_at = avail(s, pick, b), pick_at = KVM_MAX(need_at, tload);
        if (!s->naive && need_at > tload) {
            int32_t hi = s->ahead > 0 ? KVM_MIN(L - 1, b + s->ahead - 1) : L - 1;
            int found = 0;
            for (int32_t i = b + 1; i <= hi && !found; i++) {
                const int32_t *bk = s->bucket + (size_t)i * (size_t)n;
                for (int32_t q = 0; q < s->bn[i]; q++) {
                    int32_t j = bk[q];
                    double at = KVM_MAX(avail(s, j, i), tload);
                    if (at >= need_at) break; /* later ones start no earlier */
                    if (at + s->dur[j] <= need_at) {
                        pick = j;
                        layer = i;
                        pos = q;
                        pick_at = at;
                        found = 1;
                        break;
                    }
                }
            }
        }
        double end = pick_at + s->dur[pick];
        s->load_idle += pick_at - tload;
        tload = end;
        if (s->items) {
            kvmem_load_item *it = &s->items[s->n_items];
            memset(it, 0, sizeof *it);
            it->segment = pick;
            it->layer = layer;
            it->start_ms = pick_at;
            it->end_ms = end;
        }
        s->n_items++;
        bucket_remove(s, layer, pos);
        s->head[pick]++;
        if (s->head[pick] < L) bucket_insert(s, s->head[pick], pick);
        s->ready[layer] = KVM_MAX(s->ready[layer], end);
    }
    s->makespan = s->cend[L - 1];
    if (s->items) /* the layer computing when each load starts; -1 = before layer 0 */
        for (size_t k = 0, lay = 0; k < s->n_items; k++) {
            while (lay < (size_t)L && s->cstart[lay] <= s->items[k].start_ms) lay++;
            s->items[k].issue_layer = (int32_t)lay - 1;
        }
}

kvmem_status kvmem_load_plan(const kvmem_load_plan_params *params, const double *compute_ms, int32_t L,
                             const uint64_t *load_bytes, int32_t n, const uint8_t *recompute, kvmem_load_item *items,
                             size_t capacity, size_t *n_items, double *layer_start_ms,
                             kvmem_load_plan_stats *stats) {
    const char *fn = "kvmem_load_plan";
    if (!compute_ms || !n_items)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, compute_ms ? "n_items" : "compute_ms");
    if (L < 1 || L > 65536) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_layers = %d must be in [1, 65536]", fn, L);
    if (n < 0 || n > (1 << 20)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_segments = %d must be in [0, 2^20]", fn, n);
    if (n > 0 && (!load_bytes || !recompute))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s is NULL", fn, load_bytes ? "recompute" : "load_bytes");
    if (capacity > 0 && !items) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: items is NULL with capacity %zu", fn, capacity);
    kvmem_load_plan_params p = kvmem_load_plan_default_params();
    kvmem_status st = KVM_PARAMS_IN(kvmem_load_plan_params, &p, params, fn);
    if (st == KVMEM_OK) st = kvm_params_reserved(p.reserved, "kvmem_load_plan_params", fn);
    if (st != KVMEM_OK) return st;
    if (!(p.bandwidth_gbps > 0) || !isfinite(p.bandwidth_gbps))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: bandwidth_gbps = %g must be finite and > 0", fn, p.bandwidth_gbps);
    if (p.max_ahead < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: max_ahead = %d must be >= 0", fn, p.max_ahead);
    double csum = 0;
    for (int32_t i = 0; i < L; i++) {
        if (!(compute_ms[i] >= 0) || !isfinite(compute_ms[i]))
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: compute_ms[%d] = %g must be finite and >= 0", fn, i, compute_ms[i]);
        csum += compute_ms[i];
    }
    size_t n_loads = 0;
    for (int32_t i = 0; i < L; i++)
        for (int32_t j = 0; j < n; j++) {
            uint8_t r = recompute[(size_t)i * (size_t)n + (size_t)j];
            if (r > 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: recompute[%d][%d] = %u must be 0 or 1", fn, i, j, r);
            if (i > 0 && r > recompute[(size_t)(i - 1) * (size_t)n + (size_t)j])
                return kvm_fail(KVMEM_ERR_INVALID_ARG,
                                "%s: segment %d is recomputed at layer %d but not at layer %d: recompute sets must shrink with depth",
                                fn, j, i, i - 1);
            n_loads += !r;
        }
    if (capacity > 0 && capacity < n_loads) {
        *n_items = n_loads; /* the size the caller needs */
        return kvm_fail(KVMEM_ERR_CAPACITY, "%s: items holds %zu, the plan has %zu loads", fn, capacity, n_loads);
    }

    lp_sim s;
    memset(&s, 0, sizeof s);
    s.L = L;
    s.n = n;
    s.comp = compute_ms;
    size_t nn = (size_t)(n ? n : 1), nl = (size_t)L, nb;
    if (!kvm_mul_size(nn, nl, &nb) || nb > SIZE_MAX / sizeof(int32_t))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: n_layers x n_segments too large", fn);
    double *dur = kvm_malloc(nn * sizeof *dur);
    int32_t *first = kvm_malloc(nn * sizeof *first), *head = kvm_malloc(nn * sizeof *head);
    int32_t *ord = kvm_malloc(nn * sizeof *ord), *rank = kvm_malloc(nn * sizeof *rank);
    int32_t *bucket = kvm_malloc(nb * sizeof *bucket), *bn = kvm_malloc(nl * sizeof *bn);
    int32_t *cnt = kvm_calloc(nl + 2, sizeof *cnt);
    double *ready = kvm_malloc(nl * sizeof *ready), *cst = kvm_malloc(nl * sizeof *cst), *cen = kvm_malloc(nl * sizeof *cen);
    if (!dur || !first || !head || !ord || !rank || !bucket || !bn || !cnt || !ready || !cst || !cen) {
        kvm_free(dur), kvm_free(first), kvm_free(head), kvm_free(ord), kvm_free(rank), kvm_free(bucket), kvm_free(bn), kvm_free(cnt);
        kvm_free(ready), kvm_free(cst), kvm_free(cen);
        return kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the schedule of %zu loads", fn, nn);
    }
    double lsum = 0;
    for (int32_t j = 0; j < n; j++) {
        dur[j] = (double)load_bytes[j] / (p.bandwidth_gbps * 1e9) * 1e3;
        int32_t e = 0;
        while (e < L && recompute[(size_t)e * (size_t)n + (size_t)j]) e++;
        first[j] = e;
        cnt[e + 1]++;
        lsum += dur[j] * (L - e);
    }
    /* release order: by decision layer, then segment (a stable counting sort) */
    for (int32_t i = 0; i <= L; i++) cnt[i + 1] += cnt[i];
    for (int32_t j = 0; j < n; j++) {
        ord[cnt[first[j]]] = j;
        rank[j] = cnt[first[j]]++;
    }
    s.dur = dur;
    s.first = first;
    s.ord = ord;
    s.rank = rank;
    s.head = head;
    s.bucket = bucket;
    s.bn = bn;
    s.ready = ready;
    s.cstart = cst;
    s.cend = cen;

    s.naive = 1;
    simulate(&s);
    double nm = s.makespan, nli = s.load_idle;
    s.naive = 0;
    s.ahead = p.max_ahead;
    simulate(&s);
    /* The gap filling is greedy; should it ever lose to the plain pipeline,
     * the plain pipeline is the balanced plan. */
    if (s.makespan > nm + 1e-9 * (1.0 + nm)) {
        s.naive = 1;
        s.makespan = nm;
        s.load_idle = nli;
    }
    if (capacity > 0 || layer_start_ms) {
        s.items = capacity > 0 ? items : NULL;
        simulate(&s);
    }
    if (layer_start_ms) memcpy(layer_start_ms, cst, nl * sizeof *cst);
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->naive_makespan_ms = nm;
        stats->naive_compute_idle_ms = KVM_MAX(0.0, nm - csum);
        stats->naive_load_idle_ms = nli;
        stats->balanced_makespan_ms = s.makespan;
        stats->balanced_compute_idle_ms = KVM_MAX(0.0, s.makespan - csum);
        stats->balanced_load_idle_ms = s.load_idle;
        stats->compute_ms = csum;
        stats->load_ms = lsum;
        stats->n_loads = n_loads;
    }
    kvm_free(dur), kvm_free(first), kvm_free(head), kvm_free(ord), kvm_free(rank), kvm_free(bucket), kvm_free(bn), kvm_free(cnt);
    kvm_free(ready), kvm_free(cst), kvm_free(cen);
    *n_items = n_loads;
    return KVMEM_OK;
}

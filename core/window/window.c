/* The model's window when retrieved memory goes into it: the order of the
 * retrieved blocks before the live context (kvmem_arrange) and how the
 * window is shared between memory and the live context
 * (kvmem_window_split). Plain logic: no backend, no agent. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>

typedef struct unit {
    int32_t id, run;
    float score, run_score;
} unit;

static int by_id(const void *a, const void *b) {
    const unit *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* ascending score, ties: the older block first (farther from the new tokens) */
static int by_score(const void *a, const void *b) {
    const unit *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ascending best score of the run, ties: the older run first; by id inside a run */
static int by_run(const void *a, const void *b) {
    const unit *x = a, *y = b;
    if (x->run != y->run) {
        if (x->run_score != y->run_score) return x->run_score < y->run_score ? -1 : 1;
        return x->run < y->run ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

kvmem_status kvmem_arrange(const int32_t *blocks, const float *scores, int32_t n, kvmem_arrange_order order,
                           int32_t *out) {
    if (n < 0) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: n %d < 0", n);
    if (order != KVMEM_ARRANGE_CHRONO && order != KVMEM_ARRANGE_SCORE && order != KVMEM_ARRANGE_RUNS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: order %d is not a kvmem_arrange_order", (int)order);
    if (n == 0) return KVMEM_OK;
    if (!blocks || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: blocks or out is NULL");
    if (order != KVMEM_ARRANGE_CHRONO && !scores)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: the %s order needs scores",
                        order == KVMEM_ARRANGE_SCORE ? "SCORE" : "RUNS");
    unit *u = kvm_malloc((size_t)n * sizeof *u);
    if (!u) return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_arrange: %d blocks", n);
    for (int32_t i = 0; i < n; i++) {
        if (blocks[i] < 0 || (scores && isnan(scores[i]))) {
            kvm_free(u);
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: block %d: id %d%s", i, blocks[i],
                            blocks[i] < 0 ? " < 0" : " has a NaN score");
        }
        u[i].id = blocks[i];
        u[i].score = scores ? scores[i] : 0.0f;
        u[i].run = 0;
        u[i].run_score = 0.0f;
    }
    qsort(u, (size_t)n, sizeof *u, by_id);
    for (int32_t i = 1; i < n; i++)
        if (u[i].id == u[i - 1].id) {
            int32_t id = u[i].id;
            kvm_free(u);
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_arrange: block %d is listed twice", id);
        }
    if (order == KVMEM_ARRANGE_SCORE) {
        qsort(u, (size_t)n, sizeof *u, by_score);
    } else if (order == KVMEM_ARRANGE_RUNS) {
        int32_t run = 0;
        for (int32_t i = 0; i < n;) {
            int32_t j = i + 1;
            float best = u[i].score;
            while (j < n && u[j].id == u[j - 1].id + 1) {
                if (u[j].score > best) best = u[j].score;
                j++;
            }
            for (int32_t k = i; k < j; k++) {
                u[k].run = run;
                u[k].run_score = best;
            }
            run++;
            i = j;
        }
        qsort(u, (size_t)n, sizeof *u, by_run);
    }
    for (int32_t i = 0; i < n; i++) out[i] = u[i].id; /* written only on success */
    kvm_free(u);
    return KVMEM_OK;
}

kvmem_status kvmem_window_split(int32_t window, int32_t reserve, float memory_share, float live_share,
                                int32_t block_size, kvmem_window_plan *out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_window_split: out is NULL");
    if (window < 1 || reserve < 0 || reserve > window)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_window_split: window %d, reserve %d: need 0 <= reserve <= "
                        "window, window >= 1", window, reserve);
    if (!(memory_share >= 0.0f && memory_share <= 1.0f) || !(live_share >= 0.0f && live_share <= 1.0f))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_window_split: shares %g, %g: each in [0, 1]",
                        (double)memory_share, (double)live_share);
    if (block_size < 1) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_window_split: block size %d < 1", block_size);
    int32_t room = window - reserve;
    int32_t memory = (int32_t)floor((double)memory_share * window + 1e-9) / block_size * block_size;
    if (memory > room) memory = room / block_size * block_size;
    int32_t left = room - memory;
    int32_t live = live_share > 0.0f ? (int32_t)floor((double)live_share * window + 1e-9) : left;
    if (live > left) live = left;
    out->memory_tokens = memory;
    out->top_k = memory / block_size;
    out->live_tokens = live;
    return KVMEM_OK;
}

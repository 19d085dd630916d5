/* tinyllm: where retrieved memory goes in the window, and how the window is
 * split between memory and the live context (beyond.h). Plain logic: no
 * model, no kvmem. */
#include <stdlib.h>
#include <string.h>

#include "beyond.h"

const char *tl_order_name(tl_order o) {
    switch (o) {
    case TL_ORDER_CHRONO: return "chrono";
    case TL_ORDER_SCORE: return "score";
    case TL_ORDER_RUNS: return "runs";
    }
    return "?";
}

typedef struct unit {
    int32_t id, run;
    float score, run_score;
} unit;

static int by_id(const void *a, const void *b) {
    const unit *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

/* ascending score, ties: the older (smaller id) first, i.e. farther from the cue */
static int by_score(const void *a, const void *b) {
    const unit *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* ascending run score, ties: the older run first; inside a run, by id */
static int by_run(const void *a, const void *b) {
    const unit *x = a, *y = b;
    if (x->run != y->run) {
        if (x->run_score != y->run_score) return x->run_score < y->run_score ? -1 : 1;
        return x->run < y->run ? -1 : 1;
    }
    return (x->id > y->id) - (x->id < y->id);
}

int tl_place(const int32_t *ids, const float *scores, int32_t n, tl_order order, int32_t *out) {
    if (n < 0 || (n > 0 && (!ids || !out)) || (order != TL_ORDER_CHRONO && order != TL_ORDER_SCORE &&
                                               order != TL_ORDER_RUNS))
        return -1;
    if (n > 0 && order != TL_ORDER_CHRONO && !scores) return -1;
    if (n == 0) return 0;
    unit *u = malloc((size_t)n * sizeof *u);
    if (!u) return -1;
    for (int32_t i = 0; i < n; i++) {
        u[i].id = ids[i];
        u[i].score = scores ? scores[i] : 0.0f;
    }
    qsort(u, (size_t)n, sizeof *u, by_id);
    if (order == TL_ORDER_SCORE) {
        qsort(u, (size_t)n, sizeof *u, by_score);
    } else if (order == TL_ORDER_RUNS) {
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
    for (int32_t i = 0; i < n; i++) out[i] = u[i].id;
    free(u);
    return 0;
}

tl_split tl_window_split(int32_t window, int32_t reserve, double mem_frac, double live_frac, int32_t block) {
    tl_split s = {0, 0};
    if (block < 1) block = 1;
    int32_t room = window - reserve;
    if (room <= 0) return s;
    if (mem_frac > 0) s.memory = (int32_t)(mem_frac * window + 1e-9) / block * block;
    if (s.memory > room) s.memory = room / block * block;
    int32_t left = room - s.memory;
    s.live = live_frac > 0 ? (int32_t)(live_frac * window + 1e-9) : left;
    if (s.live > left) s.live = left;
    if (s.live < 0) s.live = 0;
    return s;
}

/* tinyllm: where retrieved memory goes in the window, and how the window is
 * split between memory and the live context (beyond.h): kvmem's
 * kvmem_arrange and kvmem_window_split, for blocks and text chunks alike. */
#define KVMEM_EXPERIMENTAL /* kvmem_arrange, kvmem_window_split */
#include "beyond.h"

const char *tl_order_name(tl_order o) {
    switch (o) {
    case TL_ORDER_CHRONO: return "chrono";
    case TL_ORDER_SCORE: return "score";
    case TL_ORDER_RUNS: return "runs";
    }
    return "?";
}

int tl_place(const int32_t *ids, const float *scores, int32_t n, tl_order order, int32_t *out) {
    _Static_assert(TL_ORDER_CHRONO == (int)KVMEM_ARRANGE_CHRONO && TL_ORDER_SCORE == (int)KVMEM_ARRANGE_SCORE &&
                   TL_ORDER_RUNS == (int)KVMEM_ARRANGE_RUNS, "tl_order follows kvmem_arrange_order");
    return kvmem_arrange(ids, scores, n, (kvmem_arrange_order)order, out) == KVMEM_OK ? 0 : -1;
}

tl_split tl_window_split(int32_t window, int32_t reserve, double mem_frac, double live_frac, int32_t block) {
    tl_split s = {0, 0};
    kvmem_window_plan p;
    if (kvmem_window_split(window, reserve, (float)mem_frac, (float)live_frac, block, &p) == KVMEM_OK) {
        s.memory = p.memory_tokens;
        s.live = p.live_tokens;
    }
    return s;
}

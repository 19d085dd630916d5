/* IntentKV eviction meets ART attention: a slot map evicted by redirection
 * to the sentinel dead slot, read by kvmem_attend as an engine's physical
 * KV store. The paper's sentinel values (K = -1e4, V = 0) drag a query with
 * sum(q) < 0 onto the zero value when read; kvmem's attention skips the dead
 * slot and equals attention over the kept positions only. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { L = 2, NQ = 4, H = 2, D = 16, T = 40 };

/* Softmax attention of one query head over the given rows, in double. */
static void ref_attend(const float *q, const float *k, const float *v, const int32_t *rows, int n_rows,
                       double *out) {
    double m = -INFINITY, s = 0, acc[D] = {0};
    double scale = 1.0 / sqrt((double)D);
    for (int i = 0; i < n_rows; i++) {
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * k[(size_t)rows[i] * H * D + d];
        m = fmax(m, dot * scale);
    }
    for (int i = 0; i < n_rows; i++) {
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)q[d] * k[(size_t)rows[i] * H * D + d];
        double w = exp(dot * scale - m);
        s += w;
        for (int d = 0; d < D; d++) acc[d] += w * v[(size_t)rows[i] * H * D + d];
    }
    for (int d = 0; d < D; d++) out[d] = acc[d] / s;
}

static void evicted_slots_are_skipped_by_attention(void **state) {
    (void)state;
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_kvstore *store = NULL;
    kvmem_slotmap *map = NULL;
    assert_ok(kvmem_kvstore_create(&spec, NULL, &store));
    assert_ok(kvmem_slotmap_create(store, &map));
    uint64_t rng = 77;
    static float k[L * T * H * D], v[L * T * H * D];
    tu_fill_kv(k, L * T * H * D, &rng);
    tu_fill_kv(v, L * T * H * D, &rng);
    for (size_t i = 0; i < L * T * H * D; i++) v[i] += 3.0f; /* values far from the sentinel's 0 */
    int64_t shape[4] = {L, T, H, D};
    kvmem_tensor kt, vt;
    kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
    kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
    assert_ok(kvmem_slotmap_append(map, &kt, &vt));
    int32_t kept[T];
    int n_kept = 0;
    for (int t = 0; t < T; t++)
        if (t < 4 || t % 3 == 0 || t >= T - 6) kept[n_kept++] = t;
    assert_ok(kvmem_slotmap_evict(map, kept, n_kept, NULL));

    /* The engine's physical store for layer 0, slot-major, sentinel included. */
    kvmem_kvstore_info si;
    assert_ok(kvmem_kvstore_get_info(store, &si));
    size_t n_slots = (size_t)si.n_slots;
    float *pk = calloc(n_slots * H * D, sizeof(float)), *pv = calloc(n_slots * H * D, sizeof(float));
    float *rowk = malloc(L * H * D * sizeof(float)), *rowv = malloc(L * H * D * sizeof(float));
    for (size_t s = 0; s < n_slots; s++) {
        if (kvmem_kvstore_read_slot(store, (int32_t)s, rowk, rowv) != KVMEM_OK) continue;
        memcpy(pk + s * H * D, rowk, H * D * sizeof(float)); /* layer 0 rows */
        memcpy(pv + s * H * D, rowv, H * D * sizeof(float));
    }
    const int32_t *slots;
    int64_t len;
    int32_t dead;
    assert_ok(kvmem_slotmap_slots(map, &slots, &len, &dead));
    assert_int_equal(len, T);
    assert_int_equal(dead, KVMEM_DEAD_SLOT);
    assert_true(pk[(size_t)dead * H * D] == KVMEM_SENTINEL_K); /* written for external kernels */

    /* a query with sum(q) < 0 on every head */
    float q[NQ * D];
    for (int i = 0; i < NQ * D; i++) q[i] = -fabsf(tu_normal(&rng)) - 0.1f;

    int32_t live_rows[T], all_rows[T];
    for (int i = 0; i < n_kept; i++) live_rows[i] = slots[kept[i]];
    for (int t = 0; t < T; t++) all_rows[t] = slots[t];

    /* kvmem's attention over the slot map, full (tau = 0) and with ART on */
    int64_t qshape[3] = {1, NQ, D}, pshape[3] = {(int64_t)n_slots, H, D};
    float out[NQ * D], out_art[NQ * D];
    kvmem_tensor qt, ot, oat, pkt, pvt;
    kvmem_tensor_init(&qt, q, KVMEM_F32, 3, qshape);
    kvmem_tensor_init(&ot, out, KVMEM_F32, 3, qshape);
    kvmem_tensor_init(&oat, out_art, KVMEM_F32, 3, qshape);
    kvmem_tensor_init(&pkt, pk, KVMEM_F32, 3, pshape);
    kvmem_tensor_init(&pvt, pv, KVMEM_F32, 3, pshape);
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    src.k = &pkt;
    src.v = &pvt;
    src.slots = slots;
    src.n_positions = len;
    src.dead_slot = dead;
    kvmem_context *ctx = tu_context(2);
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 0;
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &qt, &src, &ap, &ot, &st));
    assert_int_equal(st.positions_read, (int64_t)n_kept * H); /* dead positions never read */
    ap = kvmem_attend_default_params();
    assert_ok(kvmem_attend(ctx, &qt, &src, &ap, &oat, NULL));

    double worst_kvmem = 0, worst_art = 0, hazard_gap = 0;
    for (int h = 0; h < NQ; h++) {
        int kvh = h / (NQ / H);
        double kept_ref[D], naive[D];
        ref_attend(q + h * D, pk + kvh * D, pv + kvh * D, live_rows, n_kept, kept_ref);
        ref_attend(q + h * D, pk + kvh * D, pv + kvh * D, all_rows, T, naive); /* reads the sentinel */
        double gap = 0, nrm = 0;
        for (int d = 0; d < D; d++) {
            worst_kvmem = fmax(worst_kvmem, fabs(out[h * D + d] - kept_ref[d]));
            worst_art = fmax(worst_art, fabs(out_art[h * D + d] - kept_ref[d]));
            gap += (naive[d] - kept_ref[d]) * (naive[d] - kept_ref[d]);
            nrm += kept_ref[d] * kept_ref[d];
        }
        hazard_gap = fmax(hazard_gap, sqrt(gap / nrm));
    }
    assert_true(worst_kvmem < 2e-5);   /* equals attention over the kept positions */
    assert_true(hazard_gap > 0.9);      /* the sentinel path lands on V = 0: wrong */
    assert_true(worst_art < 0.1);       /* ART on top stays close to it */

    free(pk);
    free(pv);
    free(rowk);
    free(rowv);
    kvmem_context_free(ctx);
    kvmem_slotmap_free(map);
    kvmem_kvstore_free(store);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(evicted_slots_are_skipped_by_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

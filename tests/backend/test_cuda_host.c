/* The CUDA backend's host-side logic, on the CPU: argument validation,
 * launch parameters, the caching allocator's bookkeeping and the pinned
 * staging plan; and the per-element rules the kernels run (host/rules.h),
 * compared bit for bit with the core's scalar references: f16 conversion,
 * the RoPE pair rotation and the ART stop rule. None of it needs a GPU. */
#include "testutil.h"
#include "cuda_host.h"
#include "rules.h"

#include "backend/backend.h"
#include "cpu/half.h"
#include "rope/rope.h"

#include <math.h>

#include <stdlib.h>
#include <string.h>

static void ranges_reject_overflow_and_outside(void **state) {
    (void)state;
    assert_true(kvm_cu_in_range(100, 0, 100));
    assert_true(kvm_cu_in_range(100, 100, 0));
    assert_false(kvm_cu_in_range(100, 101, 0));
    assert_false(kvm_cu_in_range(100, 1, 100));
    assert_false(kvm_cu_in_range(100, 50, SIZE_MAX));
    size_t b = 0;
    assert_true(kvm_cu_tensor_bytes(KVMEM_BF16, 3, &b));
    assert_int_equal(b, 6);
    assert_false(kvm_cu_tensor_bytes(KVMEM_F32, SIZE_MAX / 2, &b));
    assert_false(kvm_cu_tensor_bytes(KVMEM_Q4, 8, &b));
}

static void grids_cover_the_work_and_respect_caps(void **state) {
    (void)state;
    kvm_cu_grid g = kvm_cu_grid_1d(0, 256, 100);
    assert_int_equal(g.blocks, 0);
    g = kvm_cu_grid_1d(1000, 256, 100);
    assert_int_equal(g.blocks, 4);
    assert_int_equal(g.threads, 256);
    g = kvm_cu_grid_1d((size_t)1 << 40, 256, 1056);
    assert_int_equal(g.blocks, 1056); /* grid-stride loops take the rest */
    assert_true(kvm_cu_head_dim_supported(128) && kvm_cu_head_dim_supported(64) && kvm_cu_head_dim_supported(256));
    assert_false(kvm_cu_head_dim_supported(80));
}

static void score_plan_pads_to_mma_tiles_and_falls_back_to_workspace(void **state) {
    (void)state;
    /* Llama-3.1-8B, 14k tokens in blocks of 16, 32 query tokens */
    kvm_cu_score_shape s = {32, 32, 8, 128, 32, 875, 0};
    kvm_cu_score_plan p;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    /* the 4 heads of a KV head would need 128 rows: 450 KiB of scores; one
     * head's 32 rows fit in shared memory */
    assert_int_equal(p.heads_per_cta, 1);
    assert_int_equal(p.rows_pad, 32);
    assert_int_equal(p.nb_pad, 880);
    assert_int_equal(p.sort_len, 0);
    assert_true(p.in_smem);
    size_t qp_tile = 32 * 256 * 2, scores = 32 * 880 * 4;
    assert_int_equal(p.smem_bytes, qp_tile + scores);
    assert_int_equal(p.qp_bytes, (size_t)32 * 32 * qp_tile);
    assert_int_equal(p.blk_bytes, (size_t)32 * 8 * 880 * 256 * 2);
    assert_int_equal(p.ws_bytes % 256, 0);
    assert_true(p.ws_bytes >= p.qp_bytes);
    /* RR sorts in a power-of-two buffer */
    s.norm_rr = 1;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_int_equal(p.sort_len, 1024);
    assert_int_equal(p.smem_bytes, qp_tile + scores + 1024 * 8);
    /* a decode step (1 query token): the 4 heads of a KV head share a CTA,
     * their 4 rows padded to one 16-row tile, scores in shared memory */
    s.norm_rr = 0;
    s.n_q = 1;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_int_equal(p.heads_per_cta, 4);
    assert_int_equal(p.rows_pad, 16);
    assert_true(p.in_smem);
    assert_int_equal(p.smem_bytes, (size_t)16 * 256 * 2 + (size_t)16 * 880 * 4);
    assert_int_equal(p.qp_bytes, (size_t)32 * 8 * 16 * 256 * 2);
    /* 200k tokens: scores no longer fit, they go to the workspace, and the
     * CTA takes the whole group (its 128-row query operand fits) */
    s.norm_rr = 1;
    s.n_q = 32;
    s.n_blocks = 12500;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_OK);
    assert_false(p.in_smem);
    assert_int_equal(p.heads_per_cta, 4);
    assert_int_equal(p.rows_pad, 128);
    assert_int_equal(p.smem_bytes, (size_t)128 * 256 * 2);
    size_t per_cta = (size_t)128 * 12512 * 4 + (size_t)16384 * 8;
    assert_true(p.ws_bytes >= p.qp_bytes + (size_t)32 * 8 * per_cta);
    /* a query operand that fits no shared memory: refused, saying why */
    assert_int_equal(kvm_cu_score_plan_make(&s, 8 * 1024, &p), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvm_cu_last_error(), "shared memory"));
    /* bad shapes */
    s.n_q = 65;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "65 query tokens"));
    s.n_q = 32;
    s.head_dim = 96;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_UNSUPPORTED);
    s.head_dim = 128;
    s.n_q_heads = 30;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
    s.n_q_heads = 32;
    s.n_blocks = 0;
    assert_int_equal(kvm_cu_score_plan_make(&s, 227 * 1024, &p), KVMEM_ERR_INVALID_ARG);
}

static void topk_plan_clamps_k_to_n(void **state) {
    (void)state;
    kvm_cu_topk_plan p;
    assert_int_equal(kvm_cu_topk_plan_make(875, 64, &p), KVMEM_OK);
    assert_int_equal(p.k, 64);
    assert_int_equal(p.sort_len, 64);
    assert_int_equal(kvm_cu_topk_plan_make(5, 64, &p), KVMEM_OK);
    assert_int_equal(p.k, 5);
    assert_int_equal(p.sort_len, 8);
    assert_true(p.smem_bytes >= 256 * 4 + 8 * 4);
    assert_int_equal(kvm_cu_topk_plan_make(100, 0, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_topk_plan_make(100, KVM_CU_TOPK_MAX_K + 1, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_topk_plan_make(0, 4, &p), KVMEM_ERR_INVALID_ARG);
}

/* ---- the kernels' per-element rules against the core's references ---- */

/* Values that stress f16 rounding: random magnitudes over the whole f16
 * range, subnormals, exact f16 values and their neighbours, signed zeros. */
static float tricky_value(uint64_t *rng, int i) {
    switch (i % 6) {
    case 0: return tu_normal(rng) * ldexpf(1.0f, (int)(tu_next(rng) % 40) - 24);
    case 1: return kvm_f16_to_f32((uint16_t)(tu_next(rng) & 0x7bff)) * ((tu_next(rng) & 1) ? -1.0f : 1.0f);
    case 2: {
        float h = kvm_f16_to_f32((uint16_t)(tu_next(rng) & 0x7bff));
        return nextafterf(h, (tu_next(rng) & 1) ? INFINITY : -INFINITY);
    }
    case 3: return (tu_next(rng) & 1) ? -0.0f : 0.0f;
    case 4: return ldexpf((float)(tu_next(rng) % 2048), -24) * ((tu_next(rng) & 1) ? -1.0f : 1.0f);
    default: return ((float)(tu_next(rng) % 131009) - 65504.0f);
    }
}

static void f16_conversions_match_the_core_bit_for_bit(void **state) {
    (void)state;
    uint64_t rng = 5;
    for (int i = 0; i < 600000; i++) {
        const float x = tricky_value(&rng, i);
        assert_int_equal(kvm_cu_f32_to_f16(x), kvm_f32_to_f16(x));
        const uint16_t h = (uint16_t)tu_next(&rng);
        const float a = kvm_cu_f16_to_f32(h), b = kvm_f16_to_f32(h);
        assert_memory_equal(&a, &b, 4);
    }
}

static void rope_pair_matches_kvm_rope_rotate(void **state) {
    (void)state;
    uint64_t rng = 13;
    kvm_rope r;
    memset(&r, 0, sizeof r);
    r.head_dim = 2;
    r.rotary_dim = 2;
    r.n_pairs = 1;
    r.style = KVMEM_ROPE_NEOX;
    for (int i = 0; i < 200000; i++) {
        r.attn_factor = i % 3 == 0 ? 1.0 : (double)(float)(1.0 + 0.3 * tu_uniform(&rng, 0.0f, 1.0f));
        float x[2] = {tu_normal(&rng) * 100.0f, tu_normal(&rng)};
        const double ang = tu_normal(&rng) * 1000.0;
        const float c = (float)cos(ang), s = (float)sin(ang);
        float y0, y1;
        kvm_cu_host_rope_pair(x[0], x[1], c, s, (float)r.attn_factor, &y0, &y1);
        kvm_rope_rotate(&r, x, &c, &s, 0);
        assert_memory_equal(&y0, &x[0], 4);
        assert_memory_equal(&y1, &x[1], 4);
    }
}

/* The mirror's keys at base + p (backend.h, dev_attend): the angle sum in
 * f32 as the contract writes it (no fused operations), exact at base 0, and
 * within a few ulps of the double-precision angle (what the CPU rotates by). */
static void rope_angle_add_matches_the_contract(void **state) {
    (void)state;
    uint64_t rng = 17;
    for (int i = 0; i < 200000; i++) {
        const double b = i % 4 == 0 ? 0.0 : floor(tu_uniform(&rng, 0.0f, 100000.0f));
        const double pp = floor(tu_uniform(&rng, 0.0f, 100000.0f)), f = pow(10000.0, -tu_uniform(&rng, 0.0f, 1.0f));
        const float cb = (float)cos(b * f), sb = (float)sin(b * f), cp = (float)cos(pp * f), sp = (float)sin(pp * f);
        float c, s;
        kvm_cu_host_rope_angle_add(cb, sb, cp, sp, &c, &s);
        volatile float t0 = cb * cp, t1 = sb * sp, t2 = sb * cp, t3 = cb * sp; /* one rounding each */
        const float rc = t0 - t1, rs = t2 + t3;
        assert_memory_equal(&c, &rc, 4);
        assert_memory_equal(&s, &rs, 4);
        if (b == 0.0) {
            assert_memory_equal(&c, &cp, 4);
            assert_memory_equal(&s, &sp, 4);
        }
        assert_true(fabs((double)c - cos((b + pp) * f)) < 4e-7 && fabs((double)s - sin((b + pp) * f)) < 4e-7);
    }
}

/* dev_attend's mirror fields: the shared checks refuse what lies outside
 * the buffers or contradicts itself, and a slot beyond 32 bits. */
static void attend_mirror_checks(void **state) {
    (void)state;
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    kvmem_buffer *b = (kvmem_buffer *)(uintptr_t)16; /* never dereferenced */
    a.n_slots = 100;
    a.n_pos = 100;
    a.n_kv_heads = 2;
    a.head_dim = 64;
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 0, 0, 0), KVMEM_OK); /* unused */
    a.k_tail = b;
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 1 << 20, 1 << 20, 0), KVMEM_ERR_INVALID_ARG); /* no v_tail */
    a.v_tail = b;
    a.tail_slot = 90; /* 10 rows of 2 x 64 floats */
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 0), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4 - 4, 10 * 128 * 4, 0), KVMEM_ERR_INVALID_ARG);
    a.rotary_dim = 64;
    a.attn_factor = 1.0f;
    a.rope_cs = b; /* 1 + 100 rows of 64 floats */
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 101 * 64 * 4), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 100 * 64 * 4), KVMEM_ERR_INVALID_ARG);
    a.rotary_dim = 66; /* past head_dim */
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 101 * 66 * 4), KVMEM_ERR_INVALID_ARG);
    a.rotary_dim = 64;
    a.attn_factor = 0.0f;
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 101 * 64 * 4), KVMEM_ERR_INVALID_ARG);
    a.attn_factor = 1.0f;
    a.n_slots = (int64_t)INT32_MAX + 20;
    a.tail_slot = (int64_t)INT32_MAX + 10;
    assert_int_equal(kvm_cu_check_dev_attend_mirror(&a, 10 * 128 * 4, 10 * 128 * 4, 101 * 64 * 4), KVMEM_ERR_UNSUPPORTED);
}

/* The stop rule, written again from include/kvmem.h's text. */
static int rule_ref(double *prev_norm, float *prev, int *has_prev, int *streak, const float *z, int n, float tau_s,
                    float tau_d, int patience) {
    double nz = 0, dot = 0;
    for (int i = 0; i < n; i++) {
        nz += (double)z[i] * (double)z[i];
        dot += (double)z[i] * (double)prev[i];
    }
    nz = sqrt(nz);
    int fire = 0;
    if (*has_prev) {
        int ok = (*prev_norm == 0 || nz == 0) ? (*prev_norm == 0 && nz == 0)
                                               : (fabs(nz - *prev_norm) <= (double)tau_s * *prev_norm &&
                                                  1.0 - dot / (nz * *prev_norm) <= (double)tau_d);
        *streak = ok ? *streak + 1 : 0;
        fire = (tau_s != 0 || tau_d != 0) && *streak >= patience;
    }
    memcpy(prev, z, (size_t)n * 4);
    *prev_norm = nz;
    *has_prev = 1;
    return fire;
}

static void stop_rule_and_strided_probe_follow_the_reference(void **state) {
    (void)state;
    /* probe positions: z_i = o[i*s + s/2], s = N/32; the whole vector when N <= 32 */
    assert_int_equal(kvm_cu_probe_len(4 * 128), 32);
    assert_int_equal(kvm_cu_probe_elem(4 * 128, 0), 8);
    assert_int_equal(kvm_cu_probe_elem(4 * 128, 31), 31 * 16 + 8);
    assert_int_equal(kvm_cu_probe_elem(100, 5), 5 * 3 + 1);
    assert_int_equal(kvm_cu_probe_len(24), 24);
    assert_int_equal(kvm_cu_probe_elem(24, 23), 23);
    assert_true(kvm_cu_probe_value(512, 3.0f, 4.0f) == 0.75f);
    assert_true(kvm_cu_probe_value(512, 3.0f, 0.0f) == 0.0f);
    assert_true(kvm_cu_probe_value(16, 3.0f, 3.0f) == 3.0f * (1.0f / 3.0f));
    /* boundaries: an unchanged output passes with zero thresholds (<=) but
     * never stops (tau 0 disables the rule); a zero output passes only
     * after a zero one */
    {
        kvm_cu_rule r = {0.0, 0, 0, 0, 0};
        float prev[2] = {0, 0};
        const float z[2] = {3.0f, 4.0f}, zero[2] = {0, 0};
        assert_int_equal(kvm_cu_rule_step(&r, prev, z, 2, 0.0f, 0.0f, 1, 0), 0);
        assert_int_equal(kvm_cu_rule_step(&r, prev, z, 2, 0.0f, 0.0f, 1, 0), 0);
        assert_int_equal(r.streak, 1);
        assert_true(r.prev_norm == 5.0);
        assert_int_equal(kvm_cu_rule_step(&r, prev, z, 2, 0.0f, 1e-9f, 2, 1), 1); /* streak 2 >= patience 2 */
        assert_int_equal(kvm_cu_rule_step(&r, prev, zero, 2, 0.5f, 0.5f, 1, 1), 0);
        assert_int_equal(r.streak, 0);
        assert_int_equal(kvm_cu_rule_step(&r, prev, zero, 2, 0.5f, 0.5f, 1, 1), 1);
    }
    uint64_t rng = 17;
    for (int trial = 0; trial < 2000; trial++) {
        const int n = 1 + (int)(tu_next(&rng) % 32), patience = 1 + (int)(tu_next(&rng) % 4);
        const float tau_s = trial % 7 == 0 ? 0.0f : 0.05f * tu_uniform(&rng, 0.0f, 1.0f);
        const float tau_d = trial % 7 == 0 ? 0.0f : 0.01f * tu_uniform(&rng, 0.0f, 1.0f);
        kvm_cu_rule r = {0.0, 0, 0, 0, 0};
        float prev[32] = {0}, prev2[32] = {0}, z[32], base[32];
        double pn = 0;
        int hp = 0, streak = 0;
        for (int i = 0; i < n; i++) base[i] = tu_normal(&rng);
        for (int t = 0; t < 40; t++) {
            /* converging outputs, with an occasional jump and a zero vector */
            const float eps = 1.0f / (float)((t + 1) * (t + 1));
            for (int i = 0; i < n; i++) z[i] = t == 5 ? 0.0f : base[i] + eps * tu_normal(&rng) * (t % 11 == 3 ? 50.0f : 1.0f);
            const int a = kvm_cu_rule_step(&r, prev, z, n, tau_s, tau_d, patience, tau_s != 0 || tau_d != 0);
            const int b = rule_ref(&pn, prev2, &hp, &streak, z, n, tau_s, tau_d, patience);
            assert_int_equal(a, b);
            assert_int_equal(r.streak, streak);
            assert_true(r.prev_norm == pn);
            if (a) break;
        }
    }
}

/* ---- argument checks of the table entries ---- */

/* stand-ins for buffers: the checks only compare them with NULL */
#define FAKE(i) ((kvmem_buffer *)(uintptr_t)(0x1000 * (i)))

static void dev_score_checks_shapes_ranges_and_plans(void **state) {
    (void)state;
    kvm_dev_score_args a;
    memset(&a, 0, sizeof a);
    a.q = FAKE(1), a.s_min = FAKE(2), a.s_max = FAKE(3), a.out = FAKE(4);
    a.n_q = 4, a.n_blocks = 100, a.n_layers = 2, a.n_q_heads = 8, a.n_kv_heads = 2, a.head_dim = 64;
    a.norm = KVMEM_NORM_SOFTMAX, a.agg = KVMEM_AGG_MAX, a.tau = 0.125f, a.rr_c = 60.0f;
    const size_t q = 4 * 2 * 8 * 64 * 4, sb = 100 * 2 * 2 * 64 * 4, ob = 2 * 8 * 100 * 4;
    kvm_cu_dev_score_plan p;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_OK);
    assert_int_equal(p.score_ctas, 2 * 2 * 2); /* L * Hkv * ceil(100 / 64) */
    assert_int_equal(p.ws_scores, (2 * 8 * 4 * 100 * 4 + 255) / 256 * 256);
    assert_int_equal(p.sort_len, 0);
    assert_int_equal(kvm_cu_check_dev_score(&a, q - 4, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "outside"));
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb - 1, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob - 4, NULL, &p), KVMEM_ERR_INVALID_ARG);
    a.out_off = 2;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob + 8, NULL, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "multiples of 4"));
    a.out_off = 0;
    a.n_q = 0;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "empty or negative"));
    a.n_q = 4;
    a.tau = 0.0f; /* both constants are checked whichever norm is used */
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "tau"));
    a.tau = 0.125f;
    a.out_off = 0;
    a.norm = KVMEM_NORM_RR;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_OK);
    assert_int_equal(p.sort_len, 128);
    assert_int_equal(p.sort_in_smem, 1);
    a.rr_c = 0.0f;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    a.rr_c = 60.0f;
    a.n_q_heads = 7;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    a.n_q_heads = 8;
    a.head_dim = 512; /* ranges are checked first: a valid range, then the limit */
    assert_int_equal(kvm_cu_check_dev_score(&a, q * 8, sb * 8, sb * 8, ob, NULL, &p), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvm_cu_last_error(), "head_dim 512"));
    a.head_dim = 64;
    a.s_max = NULL;
    assert_int_equal(kvm_cu_check_dev_score(&a, q, sb, sb, ob, NULL, &p), KVMEM_ERR_INVALID_ARG);
    a.s_max = FAKE(3);
    a.n_blocks = INT32_MAX;
    assert_int_equal(kvm_cu_check_dev_score(&a, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, NULL, &p), KVMEM_ERR_UNSUPPORTED);
}

static void dev_topk_gather_qmem_check_their_ranges(void **state) {
    (void)state;
    int32_t n_out = 7;
    kvm_dev_topk_args t = {FAKE(1), FAKE(2), 0, 0, 100, 10, &n_out};
    assert_int_equal(kvm_cu_check_dev_topk(&t, 400, 40), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_topk(&t, 396, 40), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_topk(&t, 400, 36), KVMEM_ERR_INVALID_ARG);
    t.k = 1000; /* idx holds min(k, n) */
    assert_int_equal(kvm_cu_check_dev_topk(&t, 400, 400), KVMEM_OK);
    t.k = -1;
    assert_int_equal(kvm_cu_check_dev_topk(&t, 400, 400), KVMEM_ERR_INVALID_ARG);
    t.k = 10;
    t.idx_off = 2;
    assert_int_equal(kvm_cu_check_dev_topk(&t, 400, 400), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "multiples of 4"));
    t.idx_off = 0;
    t.k = 0;
    t.scores = NULL; /* nothing to do: no buffer needed */
    assert_int_equal(kvm_cu_check_dev_topk(&t, 0, 0), KVMEM_OK);
    t.n_out = NULL;
    assert_int_equal(kvm_cu_check_dev_topk(&t, 0, 0), KVMEM_ERR_INVALID_ARG);

    kvm_dev_gather_args g;
    memset(&g, 0, sizeof g);
    g.src = FAKE(1), g.idx = FAKE(2), g.cs = FAKE(3), g.out = FAKE(4);
    g.n_src = 10, g.src_rs = 300, g.n_out = 5, g.n_heads = 2, g.head_dim = 128, g.rotary_dim = 64, g.attn_factor = 1;
    const size_t src = (9 * 300 + 256) * 4, cs = 5 * 64 * 4, out = 5 * 256 * 4;
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_gather(&g, src - 4, 20, cs, out), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs - 4, out), KVMEM_ERR_INVALID_ARG);
    g.rotary_dim = 0; /* plain gather: cos/sin unused */
    g.cs = NULL;
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, 0, out), KVMEM_OK);
    g.rotary_dim = 63;
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "even"));
    g.rotary_dim = 64;
    g.n_out = 0; /* the shared rule: empty input is refused */
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "empty"));
    g.n_out = 5;
    g.attn_factor = 0.0f;
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "attn_factor"));
    g.attn_factor = 1.0f;
    g.rotary_dim = 64;
    g.cs = FAKE(3);
    g.src_rs = 255; /* rows overlap */
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "outside"));
    g.src_rs = 300;
    g.gptj = 2;
    assert_int_equal(kvm_cu_check_dev_gather(&g, src, 20, cs, out), KVMEM_ERR_INVALID_ARG);

    kvm_dev_qmem_args m = {FAKE(1), FAKE(2), FAKE(3), 0, 0, 0, 2, 8, 2, 64, 50, NULL};
    const size_t mb = 2 * 8 * 64 * 4, kb = 2 * 50 * 2 * 64 * 4;
    assert_int_equal(kvm_cu_check_dev_qmem(&m, mb, kb, 200), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_qmem(&m, mb, kb - 4, 200), KVMEM_ERR_INVALID_ARG);
    m.n_kv_heads = 3;
    assert_int_equal(kvm_cu_check_dev_qmem(&m, mb, kb, 200), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "multiple"));
    m.n_kv_heads = 2;
    m.mem = NULL; /* a NULL buffer: its range is outside */
    assert_int_equal(kvm_cu_check_dev_qmem(&m, 0, kb, 200), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "outside"));
}

static void dev_score_reduce_checks_sets_and_ranges(void **state) {
    (void)state;
    /* 4 layers x 8 heads x 100 blocks in; GLOBAL 100 or PER_LAYER 400 out */
    kvm_dev_score_reduce_args r = {FAKE(1), FAKE(2), 0, 0, 4, 8, 100, 1};
    const size_t ib = 4 * 8 * 100 * 4;
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, 400), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib - 4, 400), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "outside"));
    r.n_sets = 4;
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, 400), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, 1600), KVMEM_OK);
    r.n_sets = 2; /* neither 1 nor n_layers */
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, 1600), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "n_sets"));
    r.n_sets = 1;
    r.out = FAKE(1); /* in place */
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, ib), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "overlap"));
    r.out_off = ib; /* after in: disjoint */
    assert_int_equal(kvm_cu_check_dev_score_reduce(&r, ib, ib + 400), KVMEM_OK);
    assert_int_equal(kvm_cu_check_dev_score_reduce(NULL, ib, 400), KVMEM_ERR_INVALID_ARG);
}

static void dev_attend_checks_and_plans_waves(void **state) {
    (void)state;
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    a.q = FAKE(1), a.k = FAKE(2), a.v = FAKE(3), a.slot_map = FAKE(4), a.order = FAKE(5), a.out = FAKE(6);
    a.visited = FAKE(7);
    a.n_slots = 20000, a.n_pos = 14000, a.n_q_heads = 32, a.n_kv_heads = 8, a.head_dim = 128, a.tile = 64;
    a.n_visit = 219, a.dtype = KVMEM_F16, a.scale = 0.088f, a.tau_s = 1e-3f, a.tau_d = 1e-4f, a.patience = 4;
    const size_t kv = 20000 * 8 * 128 * 2;
    kvm_cu_dev_attend_plan p;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_OK);
    assert_int_equal(p.n_tiles, 219);
    assert_int_equal(p.group, 4);
    assert_int_equal(p.n_gchunks, 1);
    assert_int_equal(p.vec, 4);
    assert_int_equal(p.tiles_per_wave, (4 * 132 + 7) / 8);
    assert_int_equal(p.n_waves, (219 + p.tiles_per_wave - 1) / p.tiles_per_wave);
    assert_true((int64_t)p.n_waves * p.tiles_per_wave >= a.n_visit); /* every tile has a wave */
    assert_int_equal(p.probe_n, 32);
    assert_true(p.off_rule + 8 * sizeof(kvm_cu_rule) <= p.ws_bytes);
    /* each failure on its own */
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv - 2, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 28, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    a.n_visit = 220;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 220 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "exceeds the 219 tiles"));
    a.n_visit = 0; /* nothing visited: zeros out, no order needed */
    a.order = NULL;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 0, 32 * 128 * 4, 32, 132, &p), KVMEM_OK);
    assert_int_equal(p.n_waves, 0);
    a.order = FAKE(5);
    a.n_visit = 219;
    a.dtype = KVMEM_BF16;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    a.dtype = KVMEM_F32; /* f32 KV: twice the bytes */
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, 2 * kv, 2 * kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_OK);
    a.patience = 0;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, 2 * kv, 2 * kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    a.patience = 4;
    a.tau_s = NAN;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, 2 * kv, 2 * kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    a.tau_s = 0;
    /* G = 12 query heads per KV head: two chunks of up to 8; head_dim 40 -> 2 per lane */
    a.n_q_heads = 12, a.n_kv_heads = 1, a.head_dim = 40, a.n_slots = 100, a.n_pos = 100, a.tile = 7, a.n_visit = 15;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 12 * 40 * 4, 100 * 40 * 4, 100 * 40 * 4, 400, 60, 12 * 40 * 4, 4, 132, &p),
                     KVMEM_OK);
    assert_int_equal(p.n_tiles, 15);
    assert_int_equal(p.n_gchunks, 2);
    assert_int_equal(p.vec, 2);
    assert_int_equal(p.tiles_per_wave, 15);
    assert_int_equal(p.n_waves, 1);
    a.head_dim = 300;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 12 * 300 * 4, 100 * 300 * 4, 100 * 300 * 4, 400, 60, 12 * 300 * 4, 4, 132, &p),
                     KVMEM_ERR_UNSUPPORTED);
    a.head_dim = 2000; /* beyond the shared rule: invalid, not unsupported */
    assert_int_equal(kvm_cu_check_dev_attend(&a, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, SIZE_MAX, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "head_dim"));
    a.head_dim = 40;
    a.n_pos = 0, a.n_visit = 0, a.slot_map = NULL, a.order = NULL; /* no positions: zeros, nothing visited */
    assert_int_equal(kvm_cu_check_dev_attend(&a, 12 * 40 * 4, 100 * 40 * 4, 100 * 40 * 4, 0, 0, 12 * 40 * 4, 4, 132, &p),
                     KVMEM_OK);
    assert_int_equal(p.n_tiles, 0);
    assert_int_equal(p.n_waves, 0);
    /* the scored form: every tile, an order per KV head written back, two
     * visited entries per stream, the scores in the workspace */
    a.n_q_heads = 32, a.n_kv_heads = 8, a.head_dim = 128, a.n_slots = 20000, a.n_pos = 14000, a.tile = 64;
    a.slot_map = FAKE(4), a.order = FAKE(5), a.n_visit = 219, a.dtype = KVMEM_F16, a.scored = 1;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 8 * 219 * 4, 32 * 128 * 4, 64, 132, &p),
                     KVMEM_OK);
    assert_true(p.off_pos >= p.off_rule + 8 * sizeof(kvm_cu_rule) && p.off_score >= p.off_pos + 8 * 4);
    assert_true(p.off_score + 8 * 219 * 4 <= p.ws_bytes);
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 219 * 4, 32 * 128 * 4, 64, 132, &p),
                     KVMEM_ERR_INVALID_ARG); /* one order, not one per KV head */
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 8 * 219 * 4, 32 * 128 * 4, 32, 132, &p),
                     KVMEM_ERR_INVALID_ARG); /* visited without the positions */
    a.n_visit = 200;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 8 * 219 * 4, 32 * 128 * 4, 64, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "must be the 219 tiles"));
    a.n_visit = 219, a.scored = 2;
    assert_int_equal(kvm_cu_check_dev_attend(&a, 32 * 128 * 4, kv, kv, 14000 * 4, 8 * 219 * 4, 32 * 128 * 4, 64, 132, &p),
                     KVMEM_ERR_INVALID_ARG);
}

static void staging_chunks_tile_the_transfer_and_alternate(void **state) {
    (void)state;
    const size_t chunk = 1000;
    for (size_t bytes = 0; bytes < 5000; bytes += 333) {
        size_t n = kvm_cu_staging_n_chunks(bytes, chunk), next = 0;
        assert_int_equal(n, (bytes + chunk - 1) / chunk);
        for (size_t i = 0; i < n; i++) {
            kvm_cu_chunk c = kvm_cu_staging_chunk(bytes, chunk, i);
            assert_int_equal(c.offset, next);
            assert_true(c.size > 0 && c.size <= chunk);
            assert_int_equal(c.slot, (int)(i % 2));
            next += c.size;
        }
        assert_int_equal(next, bytes);
        assert_int_equal(kvm_cu_staging_chunk(bytes, chunk, n).size, 0);
    }
    assert_int_equal(kvm_cu_staging_n_chunks(10, 0), 0);
}

/* ---- the caching allocator over malloc ---- */
typedef struct {
    int live, allocs, frees, fail_after;
} raw_state;
static void *t_alloc(void *u, size_t n) {
    raw_state *r = u;
    if (r->fail_after >= 0 && r->allocs >= r->fail_after) return NULL;
    r->allocs++;
    r->live++;
    return malloc(n);
}
static void t_free(void *u, void *p) {
    raw_state *r = u;
    r->frees++;
    r->live--;
    free(p);
}

static void size_classes_round_up_without_overflow(void **state) {
    (void)state;
    assert_int_equal(kvm_cu_round_size(0), 512);
    assert_int_equal(kvm_cu_round_size(1), 512);
    assert_int_equal(kvm_cu_round_size(513), 1024);
    assert_int_equal(kvm_cu_round_size((size_t)1 << 20), (size_t)1 << 20);
    assert_int_equal(kvm_cu_round_size(((size_t)1 << 20) + 1), (size_t)2 << 20);
    assert_int_equal(kvm_cu_round_size(SIZE_MAX - 5), 0);
}

static void allocator_reuses_released_blocks(void **state) {
    (void)state;
    raw_state r = {0, 0, 0, -1};
    kvm_cu_allocator *a = kvm_cu_allocator_create(t_alloc, t_free, &r, (size_t)64 << 20);
    assert_non_null(a);
    size_t g1, g2, g3;
    void *p1 = kvm_cu_alloc(a, 3000, &g1);
    assert_non_null(p1);
    assert_int_equal(g1, 3072);
    memset(p1, 1, g1); /* the granted size is usable */
    kvm_cu_release(a, p1, g1);
    kvm_cu_alloc_stats s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.in_use, 0);
    assert_int_equal(s.cached, 3072);
    void *p2 = kvm_cu_alloc(a, 2900, &g2); /* same class: the same block, no raw call */
    assert_ptr_equal(p2, p1);
    assert_int_equal(r.allocs, 1);
    /* a small request does not take a block more than twice its size */
    kvm_cu_release(a, p2, g2);
    void *p3 = kvm_cu_alloc(a, 100, &g3);
    assert_ptr_not_equal(p3, p1);
    assert_int_equal(r.allocs, 2);
    s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.reuses, 1);
    assert_int_equal(s.raw_allocs, 2);
    assert_int_equal(s.in_use, 512);
    assert_int_equal(s.cached, 3072);
    assert_int_equal(s.peak_in_use, 3072);
    kvm_cu_release(a, p3, g3);
    kvm_cu_allocator_trim(a);
    s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.cached, 0);
    assert_int_equal(r.live, 0);
    kvm_cu_allocator_free(a);
    assert_int_equal(r.live, 0);
}

static void allocator_respects_the_cache_cap_and_retries_after_trim(void **state) {
    (void)state;
    raw_state r = {0, 0, 0, -1};
    kvm_cu_allocator *a = kvm_cu_allocator_create(t_alloc, t_free, &r, 4096);
    size_t g[4];
    void *p[4];
    for (int i = 0; i < 4; i++) p[i] = kvm_cu_alloc(a, 2048, &g[i]);
    for (int i = 0; i < 4; i++) kvm_cu_release(a, p[i], g[i]);
    kvm_cu_alloc_stats s = kvm_cu_allocator_stats(a);
    assert_int_equal(s.cached, 4096); /* two kept, two returned */
    assert_int_equal(r.live, 2);
    /* the raw allocator fails: the cache is emptied and the call retried */
    r.fail_after = r.allocs + 1;
    size_t gb;
    void *big = kvm_cu_alloc(a, 1 << 20, &gb); /* first raw call succeeds */
    assert_non_null(big);
    void *big2 = kvm_cu_alloc(a, 1 << 20, &gb); /* fails, trim, fails again */
    assert_null(big2);
    assert_int_equal(kvm_cu_allocator_stats(a).cached, 0);
    r.fail_after = -1;
    kvm_cu_release(a, big, (size_t)1 << 20);
    kvm_cu_allocator_free(a);
    assert_int_equal(r.live, 0);
    /* no callbacks, no allocator; NULL is a no-op everywhere */
    assert_null(kvm_cu_allocator_create(NULL, t_free, NULL, 0));
    kvm_cu_allocator_free(NULL);
    kvm_cu_release(NULL, NULL, 0);
    assert_null(kvm_cu_alloc(NULL, 10, NULL));
}

/* Device tensors on CUDA: what the plugin checks before it wraps a
 * caller's pointer, from the descriptor and what cudaPointerGetAttributes
 * said of the pointer (passed in: no GPU here). */
static void wrap_check_names_kind_device_and_pointer(void **state) {
    (void)state;
    kvmem_device_memory m;
    memset(&m, 0, sizeof m);
    m.struct_size = sizeof m;
    m.kind = KVMEM_MEMORY_CUDA;
    m.handle = 0x7f0000000000ull;
    m.size = 4096;
    m.device = 1;
    assert_int_equal(kvm_cu_wrap_check(&m, 1, 1, 1), KVMEM_OK);
    assert_int_equal(kvm_cu_wrap_check(NULL, 1, 1, 1), KVMEM_ERR_INVALID_ARG);
    /* the tensor names another device than the backend's */
    assert_int_equal(kvm_cu_wrap_check(&m, 0, 1, 1), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvm_cu_last_error(), "the tensor is on CUDA device 1, the context on device 0"));
    /* the pointer is host memory, or not one CUDA knows */
    assert_int_equal(kvm_cu_wrap_check(&m, 1, -1, 0), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "is not device memory"));
    /* the descriptor says device 1, the pointer lives on device 2 */
    assert_int_equal(kvm_cu_wrap_check(&m, 1, 2, 1), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvm_cu_last_error(), "belongs to CUDA device 2"));
    /* a VkBuffer handed to the CUDA backend */
    m.kind = KVMEM_MEMORY_VULKAN;
    assert_int_equal(kvm_cu_wrap_check(&m, 1, 1, 1), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvm_cu_last_error(), "not a CUDA device pointer"));
    m.kind = KVMEM_MEMORY_CUDA;
    m.handle = 0;
    assert_int_equal(kvm_cu_wrap_check(&m, 1, 1, 1), KVMEM_ERR_INVALID_ARG);
    m.handle = UINT64_MAX - 100; /* 4096 bytes from there wrap around */
    assert_int_equal(kvm_cu_wrap_check(&m, 1, 1, 1), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvm_cu_last_error(), "wrap around"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wrap_check_names_kind_device_and_pointer),
        cmocka_unit_test(ranges_reject_overflow_and_outside),
        cmocka_unit_test(grids_cover_the_work_and_respect_caps),
        cmocka_unit_test(score_plan_pads_to_mma_tiles_and_falls_back_to_workspace),
        cmocka_unit_test(topk_plan_clamps_k_to_n),
        cmocka_unit_test(f16_conversions_match_the_core_bit_for_bit),
        cmocka_unit_test(rope_pair_matches_kvm_rope_rotate),
        cmocka_unit_test(rope_angle_add_matches_the_contract),
        cmocka_unit_test(attend_mirror_checks),
        cmocka_unit_test(stop_rule_and_strided_probe_follow_the_reference),
        cmocka_unit_test(dev_score_checks_shapes_ranges_and_plans),
        cmocka_unit_test(dev_topk_gather_qmem_check_their_ranges),
        cmocka_unit_test(dev_score_reduce_checks_sets_and_ranges),
        cmocka_unit_test(dev_attend_checks_and_plans_waves),
        cmocka_unit_test(staging_chunks_tile_the_transfer_and_alternate),
        cmocka_unit_test(size_classes_round_up_without_overflow),
        cmocka_unit_test(allocator_reuses_released_blocks),
        cmocka_unit_test(allocator_respects_the_cache_cap_and_retries_after_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

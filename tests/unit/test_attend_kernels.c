/* The ART micro-kernels: every SIMD table equals the scalar reference (and
 * the scalar reference equals plain double loops written here), over head
 * dimensions that exercise the vector tails, for f32, f16 and bf16 rows and
 * the online-softmax step. Also: KVMEM_CPU picks the table. */
#include "testutil.h"
#include "attend_ref.h"
#include "attend/attend.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A SIMD table's attention kernels, NULL where this CPU or build has none. */
static const kvm_attend_kernels *attend_named(const char *isa) {
    const kvm_cpu_kernels *k = kvm_cpu_kernels_named(isa);
    return k ? k->attend : NULL;
}

static const char *const simd_names[2] = {"avx2", "avx512"};

static void fill(float *x, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) x[i] = tu_normal(rng);
}

static void check_qk(const kvm_attend_kernels *kt, size_t nq, size_t nk, size_t dim, uint64_t *rng) {
    float *q = malloc(nq * dim * 4), *k = malloc(nk * dim * 4), *s = malloc(nq * 70 * 4);
    fill(q, nq * dim, rng);
    fill(k, nk * dim, rng);
    const float *qp[70], *kp[70];
    for (size_t i = 0; i < nq; i++) qp[i] = q + i * dim;
    for (size_t i = 0; i < nk; i++) kp[i] = k + (nk - 1 - i) * dim; /* rows in any order */
    for (size_t i = 0; i < nq * 70; i++) s[i] = -12345.f;
    kt->qk(qp, nq, kp, nk, dim, 0.3f, s, 70);
    for (size_t g = 0; g < nq; g++) {
        for (size_t i = 0; i < nk; i++) {
            double ref = 0, mag = 0;
            for (size_t d = 0; d < dim; d++) ref += (double)qp[g][d] * kp[i][d], mag += fabs((double)qp[g][d] * kp[i][d]);
            ref *= 0.3;
            if (!(fabs(s[g * 70 + i] - ref) <= 1e-6 * 0.3 * mag + 1e-6))
                fail_msg("%s qk nq=%zu nk=%zu dim=%zu: s[%zu][%zu] = %g, expected %g", kt->name, nq, nk, dim, g, i,
                         (double)s[g * 70 + i], ref);
        }
        for (size_t i = nk; i < 70; i++) assert_true(s[g * 70 + i] == -12345.f); /* nothing past nk */
    }
    free(q), free(k), free(s);
}

static void check_exp_sum(const kvm_attend_kernels *kt, size_t n, uint64_t *rng) {
    float x[200], y[200];
    for (size_t i = 0; i < n; i++) x[i] = -fabsf(tu_normal(rng)) * 20.0f;
    x[0] = 0.0f;
    if (n > 3) x[3] = -95.0f; /* below expf's normal range */
    memcpy(y, x, sizeof x);
    float sum = kt->exp_sum(y, n, 0.0f);
    double ref = 0;
    for (size_t i = 0; i < n; i++) {
        double e = exp((double)x[i]);
        ref += e;
        if (!(fabs(y[i] - e) <= 4e-7 * e + 1e-37))
            fail_msg("%s exp(%g) = %g, expected %g", kt->name, (double)x[i], (double)y[i], e);
    }
    assert_true(fabs(sum - ref) <= 1e-6 * ref);
}

static void check_pv(const kvm_attend_kernels *kt, size_t nq, size_t nk, size_t dim, uint64_t *rng) {
    float *acc = malloc(nq * dim * 4), *acc0 = malloc(nq * dim * 4), *p = malloc(nq * 64 * 4), *v = malloc(nk * dim * 4);
    float c[70];
    fill(acc, nq * dim, rng);
    memcpy(acc0, acc, nq * dim * 4);
    fill(v, nk * dim, rng);
    for (size_t i = 0; i < nq * 64; i++) p[i] = fabsf(tu_normal(rng));
    for (size_t g = 0; g < nq; g++) c[g] = tu_uniform(rng, 0.f, 1.f);
    float *ap[70];
    const float *vp[70];
    for (size_t g = 0; g < nq; g++) ap[g] = acc + g * dim;
    for (size_t i = 0; i < nk; i++) vp[i] = v + i * dim;
    kt->pv(ap, nq, c, p, 64, vp, nk, dim);
    for (size_t g = 0; g < nq; g++)
        for (size_t d = 0; d < dim; d++) {
            double ref = (double)c[g] * acc0[g * dim + d], mag = fabs(ref);
            for (size_t i = 0; i < nk; i++) {
                ref += (double)p[g * 64 + i] * vp[i][d];
                mag += fabs((double)p[g * 64 + i] * vp[i][d]);
            }
            if (!(fabs(acc[g * dim + d] - ref) <= 1e-6 * mag + 1e-6))
                fail_msg("%s pv nq=%zu nk=%zu dim=%zu: acc[%zu][%zu] = %g, expected %g", kt->name, nq, nk, dim, g, d,
                         (double)acc[g * dim + d], ref);
        }
    free(acc), free(acc0), free(p), free(v);
}

/* f16 rows: values on a 1/64 grid in [-4, 4], exact in f16, so the double
 * reference uses the same numbers the kernel converts. */
static void check_f16(const kvm_attend_kernels *kt, size_t nq, size_t nk, size_t dim, uint64_t *rng) {
    float *q = malloc(nq * dim * 4), *kf = malloc(nk * dim * 4), *vf = malloc(nk * dim * 4), *s = malloc(nq * 64 * 4);
    uint16_t *kh = malloc(nk * dim * 2), *vh = malloc(nk * dim * 2);
    float *acc = malloc(nq * dim * 4), *acc0 = malloc(nq * dim * 4);
    fill(q, nq * dim, rng);
    fill(acc, nq * dim, rng);
    memcpy(acc0, acc, nq * dim * 4);
    for (size_t i = 0; i < nk * dim; i++) {
        kf[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 64.f) / 64.f;
        vf[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 64.f) / 64.f;
        kh[i] = ref_f16_exact(kf[i]);
        vh[i] = ref_f16_exact(vf[i]);
    }
    const float *qp[16];
    const uint16_t *kp[64], *vp[64];
    float *ap[16], c[16];
    for (size_t g = 0; g < nq; g++) qp[g] = q + g * dim, ap[g] = acc + g * dim, c[g] = 0.5f;
    for (size_t i = 0; i < nk; i++) kp[i] = kh + i * dim, vp[i] = vh + i * dim;
    kt->qk_f16(qp, nq, kp, nk, dim, 0.5f, s, 64);
    for (size_t g = 0; g < nq; g++)
        for (size_t i = 0; i < nk; i++) {
            double ref = 0, mag = 0;
            for (size_t d = 0; d < dim; d++) ref += (double)qp[g][d] * kf[i * dim + d], mag += fabs((double)qp[g][d] * kf[i * dim + d]);
            if (!(fabs(s[g * 64 + i] - 0.5 * ref) <= 1e-6 * mag + 1e-6))
                fail_msg("%s qk_f16 dim=%zu: %g vs %g", kt->name, dim, (double)s[g * 64 + i], 0.5 * ref);
        }
    for (size_t i = 0; i < nq * 64; i++) s[i] = fabsf(s[i]);
    kt->pv_f16(ap, nq, c, s, 64, vp, nk, dim);
    for (size_t g = 0; g < nq; g++)
        for (size_t d = 0; d < dim; d++) {
            double ref = 0.5 * acc0[g * dim + d], mag = fabs(ref);
            for (size_t i = 0; i < nk; i++) ref += (double)s[g * 64 + i] * vf[i * dim + d], mag += fabs((double)s[g * 64 + i] * vf[i * dim + d]);
            if (!(fabs(acc[g * dim + d] - ref) <= 1e-6 * mag + 1e-6))
                fail_msg("%s pv_f16 dim=%zu: %g vs %g", kt->name, dim, (double)acc[g * dim + d], ref);
        }
    free(q), free(kf), free(vf), free(s), free(kh), free(vh), free(acc), free(acc0);
}

/* bf16 rows: values on a 1/16 grid in [-4, 4] (8 significant bits), exact
 * in bf16: the top half of the f32 bits. */
static void check_bf16(const kvm_attend_kernels *kt, size_t nq, size_t nk, size_t dim, uint64_t *rng) {
    float *q = malloc(nq * dim * 4), *kf = malloc(nk * dim * 4), *vf = malloc(nk * dim * 4), *s = malloc(nq * 64 * 4);
    uint16_t *kb = malloc(nk * dim * 2), *vb = malloc(nk * dim * 2);
    float *acc = malloc(nq * dim * 4), *acc0 = malloc(nq * dim * 4);
    fill(q, nq * dim, rng);
    fill(acc, nq * dim, rng);
    memcpy(acc0, acc, nq * dim * 4);
    for (size_t i = 0; i < nk * dim; i++) {
        kf[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 16.f) / 16.f;
        vf[i] = roundf(fmaxf(-4.f, fminf(4.f, tu_normal(rng))) * 16.f) / 16.f;
        uint32_t u;
        memcpy(&u, &kf[i], 4);
        kb[i] = (uint16_t)(u >> 16);
        memcpy(&u, &vf[i], 4);
        vb[i] = (uint16_t)(u >> 16);
    }
    const float *qp[16];
    const uint16_t *kp[64], *vp[64];
    float *ap[16], c[16];
    for (size_t g = 0; g < nq; g++) qp[g] = q + g * dim, ap[g] = acc + g * dim, c[g] = 0.25f;
    for (size_t i = 0; i < nk; i++) kp[i] = kb + (nk - 1 - i) * dim, vp[i] = vb + (nk - 1 - i) * dim;
    kt->qk_bf16(qp, nq, kp, nk, dim, 0.5f, s, 64);
    for (size_t g = 0; g < nq; g++)
        for (size_t i = 0; i < nk; i++) {
            const float *kr = kf + (nk - 1 - i) * dim;
            double ref = 0, mag = 0;
            for (size_t d = 0; d < dim; d++) ref += (double)qp[g][d] * kr[d], mag += fabs((double)qp[g][d] * kr[d]);
            if (!(fabs(s[g * 64 + i] - 0.5 * ref) <= 1e-6 * mag + 1e-6))
                fail_msg("%s qk_bf16 dim=%zu: %g vs %g", kt->name, dim, (double)s[g * 64 + i], 0.5 * ref);
        }
    for (size_t i = 0; i < nq * 64; i++) s[i] = fabsf(s[i]);
    kt->pv_bf16(ap, nq, c, s, 64, vp, nk, dim);
    for (size_t g = 0; g < nq; g++)
        for (size_t d = 0; d < dim; d++) {
            double ref = 0.25 * acc0[g * dim + d], mag = fabs(ref);
            for (size_t i = 0; i < nk; i++) {
                const double x = (double)s[g * 64 + i] * vf[(nk - 1 - i) * dim + d];
                ref += x, mag += fabs(x);
            }
            if (!(fabs(acc[g * dim + d] - ref) <= 1e-6 * mag + 1e-6))
                fail_msg("%s pv_bf16 dim=%zu: %g vs %g", kt->name, dim, (double)acc[g * dim + d], ref);
        }
    free(q), free(kf), free(vf), free(s), free(kb), free(vb), free(acc), free(acc0);
}

/* One online-softmax step against double loops, from a fresh state (m =
 * -inf: c = 0) and from a running one, on rows where the new scores raise
 * the maximum and where they do not; a NaN or Inf score names its row. */
static void check_softmax_step(const kvm_attend_kernels *kt, size_t nq, size_t nk, uint64_t *rng) {
    enum { LDS = 80 };
    float s[20 * LDS], x[20 * LDS], m[20], l[20], c[20], m0[20], l0[20];
    for (size_t g = 0; g < nq; g++) {
        m0[g] = g == 0 ? -INFINITY : 3.0f * tu_normal(rng);
        l0[g] = g == 0 ? 0.0f : tu_uniform(rng, 0.5f, 4.0f);
        m[g] = m0[g], l[g] = l0[g];
        for (size_t i = 0; i < LDS; i++) x[g * LDS + i] = s[g * LDS + i] = 4.0f * tu_normal(rng);
    }
    if (nq > 2) x[2 * LDS] = s[2 * LDS] = -200.0f; /* exp underflows */
    assert_int_equal(kt->softmax_step(s, LDS, nq, nk, m, l, c), -1);
    for (size_t g = 0; g < nq; g++) {
        double t = -INFINITY, sum = 0;
        for (size_t i = 0; i < nk; i++) t = fmax(t, x[g * LDS + i]);
        const double mn = fmax(t, m0[g]), cr = m0[g] == -INFINITY ? 0.0 : exp(m0[g] - mn);
        for (size_t i = 0; i < nk; i++) {
            const double e = exp(x[g * LDS + i] - mn);
            sum += e;
            /* the f32 difference x - mn rounds by up to half an ulp of |x - mn| */
            if (!(fabs(s[g * LDS + i] - e) <= (4e-7 + 6e-8 * fabs(x[g * LDS + i] - mn)) * e + 1e-30))
                fail_msg("%s softmax_step nq=%zu nk=%zu: s[%zu][%zu] = %g, expected %g", kt->name, nq, nk, g, i,
                         (double)s[g * LDS + i], e);
        }
        for (size_t i = nk; i < LDS; i++) assert_true(s[g * LDS + i] == x[g * LDS + i]); /* nothing past nk */
        assert_true(m[g] == (float)mn);
        const double dm = m0[g] == -INFINITY ? 0.0 : fabs(m0[g] - mn);
        if (!(fabs(c[g] - cr) <= (4e-7 + 6e-8 * dm) * cr))
            fail_msg("%s softmax_step nq=%zu nk=%zu: c[%zu] = %g, expected %g (m %g -> %g)", kt->name, nq, nk, g, (double)c[g], cr, (double)m0[g], mn);
        const double lr = l0[g] * cr + sum;
        if (!(fabs(l[g] - lr) <= (2e-6 + 6e-8 * dm) * lr + 1e-30)) fail_msg("%s softmax_step: l[%zu] = %g, expected %g", kt->name, g, (double)l[g], lr);
    }
    /* a non-finite score in row r (r = nq - 1): -1 is not returned */
    for (int bad = 0; bad < 2; bad++) {
        for (size_t g = 0; g < nq; g++) {
            m[g] = 0.0f, l[g] = 1.0f;
            for (size_t i = 0; i < nk; i++) s[g * LDS + i] = 1.0f;
        }
        s[(nq - 1) * LDS + nk - 1] = bad ? NAN : INFINITY;
        assert_int_equal(kt->softmax_step(s, LDS, nq, nk, m, l, c), (int)(nq - 1));
    }
}

static void every_table_matches_double_loops(void **state) {
    (void)state;
    const kvm_attend_kernels *tables[3] = {(&kvm_attend_scalar), attend_named("avx2"),
                                           attend_named("avx512")};
    const size_t dims[7] = {2, 8, 16, 40, 64, 128, 136};
    const size_t nqs[6] = {1, 2, 3, 4, 5, 9};
    const size_t nks[6] = {1, 3, 4, 7, 17, 64};
    uint64_t rng = 77;
    for (int t = 0; t < 3; t++) {
        if (!tables[t]) continue;
        for (size_t di = 0; di < 7; di++)
            for (size_t qi = 0; qi < 6; qi++)
                for (size_t ki = 0; ki < 6; ki++) {
                    check_qk(tables[t], nqs[qi], nks[ki], dims[di], &rng);
                    check_pv(tables[t], nqs[qi], nks[ki], dims[di], &rng);
                }
        for (size_t di = 0; di < 7; di++) {
            check_f16(tables[t], 4, 64, dims[di], &rng);
            check_f16(tables[t], 3, 5, dims[di], &rng);
            check_f16(tables[t], 9, 17, dims[di], &rng);
            check_bf16(tables[t], 4, 64, dims[di], &rng);
            check_bf16(tables[t], 3, 5, dims[di], &rng);
            check_bf16(tables[t], 9, 17, dims[di], &rng);
        }
        const size_t sq[5] = {1, 3, 4, 16, 19}, sk[6] = {1, 7, 8, 16, 17, 64};
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 6; b++) check_softmax_step(tables[t], sq[a], sk[b], &rng);
        const size_t ns[6] = {1, 7, 8, 16, 33, 200};
        for (int i = 0; i < 6; i++) check_exp_sum(tables[t], ns[i], &rng);
    }
}

/* SIMD tables agree with the scalar one within float rounding on the same
 * inputs; skipped (not passed) where the CPU lacks them. */
static void simd_tables_equal_scalar(void **state) {
    (void)state;
    const kvm_attend_kernels *sc = (&kvm_attend_scalar);
    int ran = 0;
    for (int t = 0; t < 2; t++) {
        const kvm_attend_kernels *kt = attend_named(simd_names[t]);
        if (!kt) continue;
        ran++;
        uint64_t rng = 5;
        const size_t D = 72, NQ = 6, NK = 37;
        float q[6 * 72], k[37 * 72], s1[6 * 40], s2[6 * 40];
        fill(q, sizeof q / 4, &rng);
        fill(k, sizeof k / 4, &rng);
        const float *qp[6], *kp[37];
        for (size_t i = 0; i < NQ; i++) qp[i] = q + i * D;
        for (size_t i = 0; i < NK; i++) kp[i] = k + i * D;
        sc->qk(qp, NQ, kp, NK, D, 0.125f, s1, 40);
        kt->qk(qp, NQ, kp, NK, D, 0.125f, s2, 40);
        for (size_t g = 0; g < NQ; g++)
            for (size_t i = 0; i < NK; i++) assert_float_equal(s1[g * 40 + i], s2[g * 40 + i], 2e-5);
        float a1[6 * 72], a2[6 * 72], c[6] = {1, 0.5f, 0.25f, 0, 1, 0.75f};
        fill(a1, sizeof a1 / 4, &rng);
        memcpy(a2, a1, sizeof a1);
        float *ap1[6], *ap2[6];
        for (size_t g = 0; g < NQ; g++) ap1[g] = a1 + g * D, ap2[g] = a2 + g * D;
        for (size_t i = 0; i < NQ * 40; i++) s1[i] = fabsf(s1[i]);
        sc->pv(ap1, NQ, c, s1, 40, kp, NK, D);
        kt->pv(ap2, NQ, c, s1, 40, kp, NK, D);
        for (size_t i = 0; i < NQ * D; i++) assert_float_equal(a1[i], a2[i], 1e-4 * fmax(1.0, fabs(a1[i])));
    }
    if (!ran) skip();
}

/* The prefetching forms (qk_pf, pv_pf) compute exactly what qk and pv do,
 * bit for bit, whatever the prefetched run (none, shorter or longer than
 * the kernel's keys, not a multiple of a line), and leave the run as it
 * was; a table without them has neither. */
static void prefetching_kernels_equal_plain(void **state) {
    (void)state;
    const kvm_attend_kernels *tables[3] = {(&kvm_attend_scalar), attend_named("avx2"), attend_named("avx512")};
    const size_t dims[4] = {8, 40, 128, 136}, nqs[3] = {1, 4, 9}, nks[4] = {1, 3, 16, 33};
    const size_t runs[5] = {0, 1, 100, 8192, 70000};
    float *run = malloc(70000), *run0 = malloc(70000);
    uint64_t rng = 91;
    fill(run, 70000 / 4, &rng);
    memcpy(run0, run, 70000);
    int ran = 0;
    for (int t = 0; t < 3; t++) {
        if (!tables[t]) continue;
        const kvm_attend_kernels *kt = tables[t];
        assert_true((kt->qk_pf == NULL) == (kt->pv_pf == NULL));
        if (!kt->qk_pf) continue;
        ran++;
        for (size_t di = 0; di < 4; di++)
            for (size_t qi = 0; qi < 3; qi++)
                for (size_t ki = 0; ki < 4; ki++) {
                    const size_t D = dims[di], nq = nqs[qi], nk = nks[ki], L = 40;
                    float *q = malloc(nq * D * 4), *k = malloc(nk * D * 4), *s1 = malloc(nq * L * 4);
                    float *s2 = malloc(nq * L * 4), *a1 = malloc(nq * D * 4), *a2 = malloc(nq * D * 4);
                    const float *qp[9], *kp[33];
                    float *ap1[9], *ap2[9], c[9];
                    fill(q, nq * D, &rng);
                    fill(k, nk * D, &rng);
                    for (size_t g = 0; g < nq; g++) qp[g] = q + g * D, c[g] = 0.25f * (float)(g % 4);
                    for (size_t i = 0; i < nk; i++) kp[i] = k + i * D;
                    const size_t len = runs[(di + qi + ki) % 5];
                    kt->qk(qp, nq, kp, nk, D, 0.3f, s1, L);
                    kt->qk_pf(qp, nq, kp, nk, D, 0.3f, s2, L, len ? run : NULL, len);
                    for (size_t g = 0; g < nq; g++) assert_memory_equal(s1 + g * L, s2 + g * L, nk * 4);
                    for (size_t i = 0; i < nq * L; i++) s1[i] = fabsf(s1[i]);
                    fill(a1, nq * D, &rng);
                    memcpy(a2, a1, nq * D * 4);
                    for (size_t g = 0; g < nq; g++) ap1[g] = a1 + g * D, ap2[g] = a2 + g * D;
                    kt->pv(ap1, nq, c, s1, L, kp, nk, D);
                    kt->pv_pf(ap2, nq, c, s1, L, kp, nk, D, len ? run : NULL, len);
                    assert_memory_equal(a1, a2, nq * D * 4);
                    free(q), free(k), free(s1), free(s2), free(a1), free(a2);
                }
    }
    assert_memory_equal(run, run0, 70000);
    free(run);
    free(run0);
    if (!ran) skip();
}

static void kvmem_cpu_forces_the_table(void **state) {
    (void)state;
    const char *force = getenv("KVMEM_CPU");
    const kvm_attend_kernels *k = kvm_cpu_kernels_get()->attend;
    assert_non_null(k);
    assert_string_equal(k->name, kvm_cpu_kernels_get()->name);
    if (force && strcmp(force, "scalar") == 0) assert_string_equal(k->name, "scalar");
    assert_null(kvm_cpu_kernels_named("neon-nope"));
    assert_null(kvm_cpu_kernels_named(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_table_matches_double_loops),
        cmocka_unit_test(simd_tables_equal_scalar),
        cmocka_unit_test(prefetching_kernels_equal_plain),
        cmocka_unit_test(kvmem_cpu_forces_the_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

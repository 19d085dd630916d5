/* AVX2 + FMA micro-kernels for ART attention. Compiled with -mavx2 -mfma;
 * only called after run-time detection. Dimension tails (head_dim not a
 * multiple of 8) run scalar. */
#include "../../half.h"
#include "../../kernels.h"

#include <immintrin.h>
#include "../../simd_math.h"
#include <math.h>

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Row loads of f32 (dt 0), f16 (1) or bf16 (2), converted in registers,
 * vector and scalar. */
static inline __attribute__((always_inline)) __m256 ld8(const void *row, size_t d, int dt) {
    if (dt == 1) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d)));
    if (dt == 2)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + d))), 16));
    return _mm256_loadu_ps((const float *)row + d);
}
static inline __attribute__((always_inline)) float ld1(const void *row, size_t d, int dt) {
    if (dt == 1) return kvm_f16_to_f32(((const uint16_t *)row)[d]);
    if (dt == 2) return kvm_bf16_to_f32(((const uint16_t *)row)[d]);
    return ((const float *)row)[d];
}

/* Eight dot products of one step in one vector, in registers: lane 2g + j
 * = the lane sum of a[g][j] (query g, key j). Two rounds of horizontal adds
 * leave each 128-bit half with half of every sum; one cross-half add ends
 * it. (One key at a time with four scalar lane sums ran q.k at about half
 * the AVX-512 speed.) */
static inline __attribute__((always_inline)) __m256 hsum8(__m256 a00, __m256 a01, __m256 a10, __m256 a11, __m256 a20,
                                                          __m256 a21, __m256 a30, __m256 a31) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a00, a01), _mm256_hadd_ps(a10, a11));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a20, a21), _mm256_hadd_ps(a30, a31));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* Keeps a loaded vector in a register: gcc folds a load used by two FMAs
 * into both as memory operands, and two loads per FMA pair left q.k bound
 * by the load ports (ten loads to eight FMAs), not by the FMAs. */
#define KVM_IN_REG(x) __asm__("" : "+x"(x))

/* Four queries against two keys per step: eight independent FMA chains
 * (with the two key rows and a query, eleven of the sixteen registers),
 * reduced together by hsum8; an odd last key runs alone. */
static inline __attribute__((always_inline)) void qk_impl(const float *const *q, size_t nq, const void *const *k,
                                                          size_t nk, size_t dim, float scale, float *s, size_t lds,
                                                          int f16, const char *pf, size_t pf_len) {
    const size_t full = dim & ~(size_t)7;
    const __m256 vscale = _mm256_set1_ps(scale);
    const char *pfc = pf, *const pfe = pf ? pf + pf_len : NULL;
    const size_t pf_key = pf && nk ? (pf_len / nk + 63) & ~(size_t)63 : 0; /* bytes per key */
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const float *q0 = q[g0], *q1 = q[g0 + (ng > 1 ? 1 : 0)], *q2 = q[g0 + (ng > 2 ? 2 : 0)];
        const float *q3 = q[g0 + (ng > 3 ? 3 : 0)];
        const float *qq[4] = {q0, q1, q2, q3};
        size_t i = 0;
        for (; i + 2 <= nk; i += 2) {
            const void *k0 = k[i], *k1 = k[i + 1];
            kvm_pf_lines(&pfc, pfe, 2 * pf_key);
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00,
                   a31 = a00;
            for (size_t d = 0; d < full; d += 8) {
                const __m256 x0 = ld8(k0, d, f16), x1 = ld8(k1, d, f16);
                __m256 y = _mm256_loadu_ps(q0 + d);
                KVM_IN_REG(y);
                a00 = _mm256_fmadd_ps(y, x0, a00), a01 = _mm256_fmadd_ps(y, x1, a01);
                y = _mm256_loadu_ps(q1 + d);
                KVM_IN_REG(y);
                a10 = _mm256_fmadd_ps(y, x0, a10), a11 = _mm256_fmadd_ps(y, x1, a11);
                y = _mm256_loadu_ps(q2 + d);
                KVM_IN_REG(y);
                a20 = _mm256_fmadd_ps(y, x0, a20), a21 = _mm256_fmadd_ps(y, x1, a21);
                y = _mm256_loadu_ps(q3 + d);
                KVM_IN_REG(y);
                a30 = _mm256_fmadd_ps(y, x0, a30), a31 = _mm256_fmadd_ps(y, x1, a31);
            }
            const __m256 r8 = hsum8(a00, a01, a10, a11, a20, a21, a30, a31);
            if (full == dim) { /* lanes 2g, 2g + 1: query g's two scores */
                const __m256 sc = _mm256_mul_ps(r8, vscale);
                const __m128 lo = _mm256_castps256_ps128(sc), hi = _mm256_extractf128_ps(sc, 1);
                _mm_storel_pi((__m64 *)(s + g0 * lds + i), lo);
                if (ng > 1) _mm_storeh_pi((__m64 *)(s + (g0 + 1) * lds + i), lo);
                if (ng > 2) _mm_storel_pi((__m64 *)(s + (g0 + 2) * lds + i), hi);
                if (ng > 3) _mm_storeh_pi((__m64 *)(s + (g0 + 3) * lds + i), hi);
                continue;
            }
            float r[8];
            _mm256_storeu_ps(r, r8);
            for (size_t g = 0; g < ng; g++) {
                float r0 = r[2 * g], r1 = r[2 * g + 1];
                for (size_t d = full; d < dim; d++) {
                    r0 += qq[g][d] * ld1(k0, d, f16);
                    r1 += qq[g][d] * ld1(k1, d, f16);
                }
                s[(g0 + g) * lds + i] = r0 * scale;
                s[(g0 + g) * lds + i + 1] = r1 * scale;
            }
        }
        for (; i < nk; i++) {
            const void *k0 = k[i];
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < full; d += 8) {
                const __m256 x = ld8(k0, d, f16);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), x, a3);
            }
            float r[4] = {hsum256(a0), hsum256(a1), hsum256(a2), hsum256(a3)};
            for (size_t g = 0; g < ng; g++) {
                for (size_t d = full; d < dim; d++) r[g] += qq[g][d] * ld1(k0, d, f16);
                s[(g0 + g) * lds + i] = r[g] * scale;
            }
        }
    }
    kvm_pf_lines(&pfc, pfe, (size_t)-1);
}

static void a_qk(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                 float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 0, NULL, 0);
}

static void a_qk_pf(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim, float scale,
                    float *s, size_t lds, const void *pf, size_t pf_len) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 0, (const char *)pf, pf_len);
}

static void a_qk_f16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                     float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 1, NULL, 0);
}

static void a_qk_bf16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                      float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 2, NULL, 0);
}

static float a_exp_sum(float *s, size_t n, float m) {
    const __m256 vm = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = kvm_exp_neg256(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
        _mm256_storeu_ps(s + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = hsum256(sum);
    for (; i < n; i++) {
        s[i] = expf(s[i] - m);
        t += s[i];
    }
    return t;
}

/* Four queries by 16 columns [d, d + 16) (eight accumulators, two value
 * rows and a weight: eleven registers) while the tile's keys stream past
 * from L1: 2 value loads, 4 broadcasts and 8 FMAs per key. Eight columns
 * per pass loaded one value row for every four broadcasts and ran at load
 * speed, not FMA speed. */
static inline __attribute__((always_inline)) void pv_chunk16(float *const *rr, size_t ng, const float *const *pp,
                                                             const float *cc, const void *const *v, size_t nk,
                                                             size_t d, int f16, const char **pfc, const char *pfe,
                                                             size_t pf_key) {
    const __m256 c0 = _mm256_set1_ps(cc[0]), c1 = _mm256_set1_ps(cc[1]);
    const __m256 c2 = _mm256_set1_ps(cc[2]), c3 = _mm256_set1_ps(cc[3]);
    __m256 a00 = _mm256_mul_ps(_mm256_loadu_ps(rr[0] + d), c0), a01 = _mm256_mul_ps(_mm256_loadu_ps(rr[0] + d + 8), c0);
    __m256 a10 = _mm256_mul_ps(_mm256_loadu_ps(rr[1] + d), c1), a11 = _mm256_mul_ps(_mm256_loadu_ps(rr[1] + d + 8), c1);
    __m256 a20 = _mm256_mul_ps(_mm256_loadu_ps(rr[2] + d), c2), a21 = _mm256_mul_ps(_mm256_loadu_ps(rr[2] + d + 8), c2);
    __m256 a30 = _mm256_mul_ps(_mm256_loadu_ps(rr[3] + d), c3), a31 = _mm256_mul_ps(_mm256_loadu_ps(rr[3] + d + 8), c3);
    const float *p0 = pp[0], *p1 = pp[1], *p2 = pp[2], *p3 = pp[3];
    for (size_t i = 0; i < nk; i++) {
        const void *vi = (const char *)v[i] + d * (f16 ? 2 : 4);
        const __m256 x0 = ld8(vi, 0, f16), x1 = ld8(vi, 8, f16);
        kvm_pf_lines(pfc, pfe, pf_key);
        __m256 w = _mm256_broadcast_ss(p0 + i);
        a00 = _mm256_fmadd_ps(w, x0, a00), a01 = _mm256_fmadd_ps(w, x1, a01);
        w = _mm256_broadcast_ss(p1 + i);
        a10 = _mm256_fmadd_ps(w, x0, a10), a11 = _mm256_fmadd_ps(w, x1, a11);
        w = _mm256_broadcast_ss(p2 + i);
        a20 = _mm256_fmadd_ps(w, x0, a20), a21 = _mm256_fmadd_ps(w, x1, a21);
        w = _mm256_broadcast_ss(p3 + i);
        a30 = _mm256_fmadd_ps(w, x0, a30), a31 = _mm256_fmadd_ps(w, x1, a31);
    }
    /* rows beyond ng alias row 0 and are not stored */
    if (ng > 3) _mm256_storeu_ps(rr[3] + d, a30), _mm256_storeu_ps(rr[3] + d + 8, a31);
    if (ng > 2) _mm256_storeu_ps(rr[2] + d, a20), _mm256_storeu_ps(rr[2] + d + 8, a21);
    if (ng > 1) _mm256_storeu_ps(rr[1] + d, a10), _mm256_storeu_ps(rr[1] + d + 8, a11);
    _mm256_storeu_ps(rr[0] + d, a00), _mm256_storeu_ps(rr[0] + d + 8, a01);
}

static inline __attribute__((always_inline)) void pv_impl(float *const *acc, size_t nq, const float *c,
                                                          const float *p, size_t ldp, const void *const *v,
                                                          size_t nk, size_t dim, int f16, const char *pf,
                                                          size_t pf_len) {
    const size_t full16 = dim & ~(size_t)15, full = dim & ~(size_t)7;
    const char *pfc = pf, *const pfe = pf ? pf + pf_len : NULL;
    const size_t passes = nk * (full16 / 16) * ((nq + 3) / 4); /* keys the 16-column passes visit */
    const size_t pf_key = pf && passes ? (pf_len / passes + 63) & ~(size_t)63 : 0;
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const size_t g1 = g0 + (ng > 1 ? 1 : 0), g2 = g0 + (ng > 2 ? 2 : 0), g3 = g0 + (ng > 3 ? 3 : 0);
        float *const rr[4] = {acc[g0], acc[g1], acc[g2], acc[g3]};
        const float cc[4] = {c[g0], c[g1], c[g2], c[g3]};
        const float *const pp[4] = {p + g0 * ldp, p + g1 * ldp, p + g2 * ldp, p + g3 * ldp};
        size_t d = 0;
        for (; d < full16; d += 16) pv_chunk16(rr, ng, pp, cc, v, nk, d, f16, &pfc, pfe, pf_key);
        if (d < full) { /* one 8-column chunk */
            __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(rr[0] + d), _mm256_set1_ps(cc[0]));
            __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(rr[1] + d), _mm256_set1_ps(cc[1]));
            __m256 a2 = _mm256_mul_ps(_mm256_loadu_ps(rr[2] + d), _mm256_set1_ps(cc[2]));
            __m256 a3 = _mm256_mul_ps(_mm256_loadu_ps(rr[3] + d), _mm256_set1_ps(cc[3]));
            for (size_t i = 0; i < nk; i++) {
                const __m256 x = ld8(v[i], d, f16);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(pp[0] + i), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(pp[1] + i), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(pp[2] + i), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(pp[3] + i), x, a3);
            }
            if (ng > 3) _mm256_storeu_ps(rr[3] + d, a3);
            if (ng > 2) _mm256_storeu_ps(rr[2] + d, a2);
            if (ng > 1) _mm256_storeu_ps(rr[1] + d, a1);
            _mm256_storeu_ps(rr[0] + d, a0);
            d += 8;
        }
        for (size_t g = 0; g < ng; g++)
            for (size_t e = full; e < dim; e++) {
                float t = rr[g][e] * cc[g];
                for (size_t i = 0; i < nk; i++) t += pp[g][i] * ld1(v[i], e, f16);
                rr[g][e] = t;
            }
    }
    kvm_pf_lines(&pfc, pfe, (size_t)-1);
}

/* gcc's register allocator, by regions (its default), spilled the value
 * rows of pv_chunk16's f32 loop to the stack (three stack loads per key);
 * allocating the function as one region keeps them in registers. */
#if defined(__GNUC__) && !defined(__clang__)
#define KVM_PV_RA __attribute__((optimize("ira-region=one")))
#else
#define KVM_PV_RA
#endif

KVM_PV_RA static void a_pv(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                 const float *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 0, NULL, 0);
}

KVM_PV_RA static void a_pv_pf(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                              const float *const *v, size_t nk, size_t dim, const void *pf, size_t pf_len) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 0, (const char *)pf, pf_len);
}

KVM_PV_RA static void a_pv_f16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                     const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 1, NULL, 0);
}

KVM_PV_RA static void a_pv_bf16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                      const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 2, NULL, 0);
}

static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Rows of scores: the maxima and finiteness in one pass, then the exps and
 * sums; the rescale factors of 8 rows at a time in one vector exp (a
 * scalar expf per row cost as much as a tile's q.k of a head at 16 keys). */
static int a_softmax_step(float *s, size_t lds, size_t nq, size_t nk, float *m, float *l, float *c) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (size_t g0 = 0; g0 < nq; g0 += 8) {
        const size_t ng = nq - g0 < 8 ? nq - g0 : 8;
        float mo[8], mn[8], sums[8], lo[8];
        for (size_t g = 0; g < 8; g++) {
            const size_t r = g0 + (g < ng ? g : 0);
            mo[g] = m[r];
            lo[g] = l[r];
        }
        for (size_t g = 0; g < ng; g++) {
            float *x = s + (g0 + g) * lds;
            __m256 mx = ninf, bad = _mm256_setzero_ps();
            size_t i = 0;
            for (; i + 8 <= nk; i += 8) {
                const __m256 v = _mm256_loadu_ps(x + i);
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
                mx = _mm256_max_ps(mx, v);
            }
            if (_mm256_movemask_ps(bad)) return (int)(g0 + g);
            float t = hmax256(mx);
            for (; i < nk; i++) {
                if (!isfinite(x[i])) return (int)(g0 + g);
                t = x[i] > t ? x[i] : t;
            }
            mn[g] = t > mo[g] ? t : mo[g];
            sums[g] = a_exp_sum(x, nk, mn[g]);
        }
        for (size_t g = ng; g < 8; g++) mn[g] = mo[g] = sums[g] = 0.0f;
        const __m256 vo = _mm256_loadu_ps(mo), vn = _mm256_loadu_ps(mn);
        const __m256 live = _mm256_cmp_ps(vo, ninf, _CMP_NEQ_OQ);
        /* exp(m - mn) <= 1; rows that had no maximum yet get 0 */
        const __m256 cv = _mm256_and_ps(live, kvm_exp_neg256(_mm256_sub_ps(_mm256_blendv_ps(vn, vo, live), vn)));
        const __m256 lv = _mm256_fmadd_ps(_mm256_loadu_ps(lo), cv, _mm256_loadu_ps(sums));
        float cs[8], ls[8];
        _mm256_storeu_ps(cs, cv);
        _mm256_storeu_ps(ls, lv);
        for (size_t g = 0; g < ng; g++) {
            c[g0 + g] = cs[g];
            l[g0 + g] = ls[g];
            m[g0 + g] = mn[g];
        }
    }
    return -1;
}

const kvm_attend_kernels kvm_attend_avx2 = {"avx2",   a_qk,      a_exp_sum, a_pv,          a_qk_f16,
                                              a_pv_f16, a_qk_bf16, a_pv_bf16, a_softmax_step,
                                              a_qk_pf, a_pv_pf};

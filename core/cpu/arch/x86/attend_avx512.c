/* AVX-512 micro-kernels for ART attention. Compiled with -mavx512f
 * -mavx512bw -mavx512vl -mfma; only called after run-time detection.
 * Dimension tails use masked loads, so any head_dim works. */
#include "../../kernels.h"

#include <immintrin.h>
#include "../../simd_math.h"
#include <math.h>

static inline __mmask16 tail_mask(size_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* Lane sums of 16 vectors in one vector, in registers: lane j = sum of the
 * lanes of v[j]. Each level pairs two vectors and halves the lanes each one
 * holds: lanes with bit s clear keep a's sums of lanes (j, j ^ s), lanes
 * with it set b's (two blends, one swap, one add). Pairing v[j] with
 * v[j ^ 8] first, then ^ 4, ^ 2, ^ 1 leaves the sums in order. (The array
 * version before it, which gcc kept on the stack, ran q.k at half the
 * speed.) */
#define KVM_RED(a, b, m, swap) _mm512_add_ps(_mm512_mask_blend_ps(m, a, b), swap(_mm512_mask_blend_ps(m, b, a)))
#define KVM_SW8(w) _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(1, 0, 3, 2))
#define KVM_SW4(w) _mm512_shuffle_f32x4(w, w, _MM_SHUFFLE(2, 3, 0, 1))
#define KVM_SW2(w) _mm512_permute_ps(w, _MM_SHUFFLE(1, 0, 3, 2))
#define KVM_SW1(w) _mm512_permute_ps(w, _MM_SHUFFLE(2, 3, 0, 1))
static inline __attribute__((always_inline)) __m512 hsum16(__m512 v0, __m512 v1, __m512 v2, __m512 v3, __m512 v4,
                                                           __m512 v5, __m512 v6, __m512 v7, __m512 v8, __m512 v9,
                                                           __m512 v10, __m512 v11, __m512 v12, __m512 v13,
                                                           __m512 v14, __m512 v15) {
    const __m512 p0 = KVM_RED(v0, v8, 0xFF00, KVM_SW8), p1 = KVM_RED(v4, v12, 0xFF00, KVM_SW8);
    const __m512 p2 = KVM_RED(v2, v10, 0xFF00, KVM_SW8), p3 = KVM_RED(v6, v14, 0xFF00, KVM_SW8);
    const __m512 p4 = KVM_RED(v1, v9, 0xFF00, KVM_SW8), p5 = KVM_RED(v5, v13, 0xFF00, KVM_SW8);
    const __m512 p6 = KVM_RED(v3, v11, 0xFF00, KVM_SW8), p7 = KVM_RED(v7, v15, 0xFF00, KVM_SW8);
    const __m512 q0 = KVM_RED(p0, p1, 0xF0F0, KVM_SW4), q1 = KVM_RED(p2, p3, 0xF0F0, KVM_SW4);
    const __m512 q2 = KVM_RED(p4, p5, 0xF0F0, KVM_SW4), q3 = KVM_RED(p6, p7, 0xF0F0, KVM_SW4);
    const __m512 r0 = KVM_RED(q0, q1, 0xCCCC, KVM_SW2), r1 = KVM_RED(q2, q3, 0xCCCC, KVM_SW2);
    return KVM_RED(r0, r1, 0xAAAA, KVM_SW1);
}
#undef KVM_RED
#undef KVM_SW8
#undef KVM_SW4
#undef KVM_SW2
#undef KVM_SW1

/* Row loads of f32 (dt 0), f16 (1) or bf16 (2), converted in registers. */
static inline __attribute__((always_inline)) __m512 ld(const void *row, size_t d, __mmask16 m, int dt) {
    if (dt == 1) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + d));
    if (dt == 2) /* bf16 is the top half of an f32 */
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)row + d)), 16));
    return _mm512_maskz_loadu_ps(m, (const float *)row + d);
}

/* Four queries against four keys per step: sixteen independent FMA chains,
 * reduced together by hsum16; the full 16-wide steps unmasked, then the
 * tail. */
static inline __attribute__((always_inline)) void qk_impl(const float *const *q, size_t nq, const void *const *k,
                                                          size_t nk, size_t dim, float scale, float *s, size_t lds,
                                                          int f16, const char *pf, size_t pf_len) {
    const size_t full = dim & ~(size_t)15;
    const char *pfc = pf, *const pfe = pf ? pf + pf_len : NULL;
    const size_t pf_key = pf && nk ? (pf_len / nk + 63) & ~(size_t)63 : 0; /* bytes per key */
    const __mmask16 tm = tail_mask(dim - full);
    const __m512 vscale = _mm512_set1_ps(scale);
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const float *q0 = q[g0], *q1 = q[g0 + (ng > 1 ? 1 : 0)], *q2 = q[g0 + (ng > 2 ? 2 : 0)];
        const float *q3 = q[g0 + (ng > 3 ? 3 : 0)];
        size_t i = 0;
        for (; i + 4 <= nk; i += 4) {
            const void *k0 = k[i], *k1 = k[i + 1], *k2 = k[i + 2], *k3 = k[i + 3];
            kvm_pf_lines(&pfc, pfe, 4 * pf_key);
            /* sixteen named accumulators: an array indexed in a loop ends
             * up on the stack at -O2 */
            __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00, a10 = a00, a11 = a00, a12 = a00,
                   a13 = a00, a20 = a00, a21 = a00, a22 = a00, a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
#define KVM_QK_STEP(m)                                                                 \
    do {                                                                               \
        const __m512 x0 = ld(k0, d, m, f16), x1 = ld(k1, d, m, f16);                  \
        const __m512 x2 = ld(k2, d, m, f16), x3 = ld(k3, d, m, f16);                  \
        __m512 y = _mm512_maskz_loadu_ps(m, q0 + d);                                   \
        a00 = _mm512_fmadd_ps(y, x0, a00), a01 = _mm512_fmadd_ps(y, x1, a01);         \
        a02 = _mm512_fmadd_ps(y, x2, a02), a03 = _mm512_fmadd_ps(y, x3, a03);         \
        y = _mm512_maskz_loadu_ps(m, q1 + d);                                          \
        a10 = _mm512_fmadd_ps(y, x0, a10), a11 = _mm512_fmadd_ps(y, x1, a11);         \
        a12 = _mm512_fmadd_ps(y, x2, a12), a13 = _mm512_fmadd_ps(y, x3, a13);         \
        y = _mm512_maskz_loadu_ps(m, q2 + d);                                          \
        a20 = _mm512_fmadd_ps(y, x0, a20), a21 = _mm512_fmadd_ps(y, x1, a21);         \
        a22 = _mm512_fmadd_ps(y, x2, a22), a23 = _mm512_fmadd_ps(y, x3, a23);         \
        y = _mm512_maskz_loadu_ps(m, q3 + d);                                          \
        a30 = _mm512_fmadd_ps(y, x0, a30), a31 = _mm512_fmadd_ps(y, x1, a31);         \
        a32 = _mm512_fmadd_ps(y, x2, a32), a33 = _mm512_fmadd_ps(y, x3, a33);         \
    } while (0)
            size_t d = 0;
            for (; d < full; d += 16) KVM_QK_STEP((__mmask16)0xffff);
            if (d < dim) KVM_QK_STEP(tm);
#undef KVM_QK_STEP
            const __m512 r = _mm512_mul_ps(
                hsum16(a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33), vscale);
            /* 128-bit lane g holds query g's four scores */
            _mm_storeu_ps(s + (g0 + 0) * lds + i, _mm512_extractf32x4_ps(r, 0));
            if (ng > 1) _mm_storeu_ps(s + (g0 + 1) * lds + i, _mm512_extractf32x4_ps(r, 1));
            if (ng > 2) _mm_storeu_ps(s + (g0 + 2) * lds + i, _mm512_extractf32x4_ps(r, 2));
            if (ng > 3) _mm_storeu_ps(s + (g0 + 3) * lds + i, _mm512_extractf32x4_ps(r, 3));
        }
        for (; i < nk; i++) {
            const void *k0 = k[i];
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (size_t d = 0; d < dim; d += 16) {
                __mmask16 m = d < full ? (__mmask16)0xffff : tm;
                __m512 x0 = ld(k0, d, m, f16);
                a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q0 + d), x0, a0);
                a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q1 + d), x0, a1);
                a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q2 + d), x0, a2);
                a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q3 + d), x0, a3);
            }
            float r[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                          _mm512_reduce_add_ps(a3)};
            for (size_t g = 0; g < ng; g++) s[(g0 + g) * lds + i] = r[g] * scale;
        }
    }
    kvm_pf_lines(&pfc, pfe, (size_t)-1);
}

static void x_qk(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                 float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 0, NULL, 0);
}

static void x_qk_pf(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim, float scale,
                    float *s, size_t lds, const void *pf, size_t pf_len) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 0, (const char *)pf, pf_len);
}

static void x_qk_f16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                     float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 1, NULL, 0);
}

static void x_qk_bf16(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                      float scale, float *s, size_t lds) {
    qk_impl(q, nq, (const void *const *)k, nk, dim, scale, s, lds, 2, NULL, 0);
}

static float x_exp_sum(float *s, size_t n, float m) {
    const __m512 vm = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    size_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 msk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 e = kvm_exp_neg512(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, s + i), vm));
        _mm512_mask_storeu_ps(s + i, msk, e);
        sum = _mm512_mask_add_ps(sum, msk, sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

static inline __mmask16 chunk_mask(size_t dim, size_t d) {
    return d >= dim ? 0 : dim - d >= 16 ? (__mmask16)0xffff : tail_mask(dim - d);
}

/* Four queries by four 16-wide column chunks [d, d + 64): sixteen
 * accumulators stay in registers while the keys stream past (4 value loads,
 * 4 broadcasts and 16 FMAs per key). Inlined with constant masks for full
 * chunks, so those loads are plain; the tail chunk's are masked. */
static inline __attribute__((always_inline)) void pv_chunk(float *const *rr, int ng, const float *p0, const float *p1,
                                                           const float *p2, const float *p3, const float *cc,
                                                           const void *const *v, size_t nk, size_t d, __mmask16 m0,
                                                           __mmask16 m1, __mmask16 m2, __mmask16 m3, int f16,
                                                           const char **pfc, const char *pfe, size_t pf_key) {
#define KVM_PV_INIT(g)                                                                     \
    const __m512 c##g = _mm512_set1_ps(cc[g]);                                             \
    __m512 a##g##0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, rr[g] + d), c##g);            \
    __m512 a##g##1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, rr[g] + d + 16), c##g);       \
    __m512 a##g##2 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m2, rr[g] + d + 32), c##g);       \
    __m512 a##g##3 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m3, rr[g] + d + 48), c##g)
    KVM_PV_INIT(0);
    KVM_PV_INIT(1);
    KVM_PV_INIT(2);
    KVM_PV_INIT(3);
#undef KVM_PV_INIT
    for (size_t i = 0; i < nk; i++) {
        /* the chunk's address once: the four loads take constant offsets */
        const void *vi = (const char *)v[i] + d * (f16 ? 2 : 4);
        const __m512 v0 = ld(vi, 0, m0, f16), v1 = ld(vi, 16, m1, f16);
        const __m512 v2 = ld(vi, 32, m2, f16), v3 = ld(vi, 48, m3, f16);
        kvm_pf_lines(pfc, pfe, pf_key);
        __m512 w = _mm512_set1_ps(p0[i]);
        a00 = _mm512_fmadd_ps(w, v0, a00), a01 = _mm512_fmadd_ps(w, v1, a01);
        a02 = _mm512_fmadd_ps(w, v2, a02), a03 = _mm512_fmadd_ps(w, v3, a03);
        w = _mm512_set1_ps(p1[i]);
        a10 = _mm512_fmadd_ps(w, v0, a10), a11 = _mm512_fmadd_ps(w, v1, a11);
        a12 = _mm512_fmadd_ps(w, v2, a12), a13 = _mm512_fmadd_ps(w, v3, a13);
        w = _mm512_set1_ps(p2[i]);
        a20 = _mm512_fmadd_ps(w, v0, a20), a21 = _mm512_fmadd_ps(w, v1, a21);
        a22 = _mm512_fmadd_ps(w, v2, a22), a23 = _mm512_fmadd_ps(w, v3, a23);
        w = _mm512_set1_ps(p3[i]);
        a30 = _mm512_fmadd_ps(w, v0, a30), a31 = _mm512_fmadd_ps(w, v1, a31);
        a32 = _mm512_fmadd_ps(w, v2, a32), a33 = _mm512_fmadd_ps(w, v3, a33);
    }
    /* rows beyond ng alias row 0 and are not stored */
#define KVM_PV_STORE(g)                                                                                    \
    _mm512_mask_storeu_ps(rr[g] + d, m0, a##g##0), _mm512_mask_storeu_ps(rr[g] + d + 16, m1, a##g##1), \
        _mm512_mask_storeu_ps(rr[g] + d + 32, m2, a##g##2), _mm512_mask_storeu_ps(rr[g] + d + 48, m3, a##g##3)
    if (ng > 3) KVM_PV_STORE(3);
    if (ng > 2) KVM_PV_STORE(2);
    if (ng > 1) KVM_PV_STORE(1);
    KVM_PV_STORE(0);
#undef KVM_PV_STORE
}

static inline __attribute__((always_inline)) void pv_impl(float *const *acc, size_t nq, const float *c,
                                                          const float *p, size_t ldp, const void *const *v,
                                                          size_t nk, size_t dim, int f16, const char *pf,
                                                          size_t pf_len) {
    const size_t full = dim & ~(size_t)63;
    const char *pfc = pf, *const pfe = pf ? pf + pf_len : NULL;
    const size_t passes = nk * ((dim + 63) / 64) * ((nq + 3) / 4); /* keys the 64-column passes visit */
    const size_t pf_key = pf && passes ? (pf_len / passes + 63) & ~(size_t)63 : 0;
    for (size_t g0 = 0; g0 < nq; g0 += 4) {
        const size_t ng = nq - g0 < 4 ? nq - g0 : 4;
        const size_t g1 = g0 + (ng > 1 ? 1 : 0), g2 = g0 + (ng > 2 ? 2 : 0), g3 = g0 + (ng > 3 ? 3 : 0);
        float *const rr[4] = {acc[g0], acc[g1], acc[g2], acc[g3]};
        const float cc[4] = {c[g0], c[g1], c[g2], c[g3]};
        const float *p0 = p + g0 * ldp, *p1 = p + g1 * ldp, *p2 = p + g2 * ldp, *p3 = p + g3 * ldp;
        size_t d = 0;
        for (; d < full; d += 64)
            pv_chunk(rr, (int)ng, p0, p1, p2, p3, cc, v, nk, d, 0xffff, 0xffff, 0xffff, 0xffff, f16, &pfc, pfe, pf_key);
        if (d < dim)
            pv_chunk(rr, (int)ng, p0, p1, p2, p3, cc, v, nk, d, chunk_mask(dim, d), chunk_mask(dim, d + 16),
                     chunk_mask(dim, d + 32), chunk_mask(dim, d + 48), f16, &pfc, pfe, pf_key);
    }
    kvm_pf_lines(&pfc, pfe, (size_t)-1);
}

/* gcc's register allocator, by regions (its default), spills the value rows
 * or the accumulators of pv_chunk's loop to the stack whatever the source
 * says (p.v at 95-130 GFLOP/s in L2 on the machine of BENCHMARKS.md's
 * attend section); allocating the function as one region keeps them in
 * registers (190-215). q.k does not want it (200 -> 180). */
#if defined(__GNUC__) && !defined(__clang__)
#define KVM_PV_RA __attribute__((optimize("ira-region=one")))
#else
#define KVM_PV_RA
#endif

KVM_PV_RA static void x_pv(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                 const float *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 0, NULL, 0);
}

KVM_PV_RA static void x_pv_pf(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                              const float *const *v, size_t nk, size_t dim, const void *pf, size_t pf_len) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 0, (const char *)pf, pf_len);
}

KVM_PV_RA static void x_pv_f16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                     const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 1, NULL, 0);
}

KVM_PV_RA static void x_pv_bf16(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                      const uint16_t *const *v, size_t nk, size_t dim) {
    pv_impl(acc, nq, c, p, ldp, (const void *const *)v, nk, dim, 2, NULL, 0);
}

/* Rows of scores: the maxima and finiteness in one pass, then the exps and
 * sums; the rescale factors of 16 rows at a time in one vector exp. */
static int x_softmax_step(float *s, size_t lds, size_t nq, size_t nk, float *m, float *l, float *c) {
    const __m512 zero = _mm512_setzero_ps();
    for (size_t g0 = 0; g0 < nq; g0 += 16) {
        const size_t ng = nq - g0 < 16 ? nq - g0 : 16;
        float mn[16], sums[16];
        for (size_t g = 0; g < ng; g++) {
            float *x = s + (g0 + g) * lds;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            __mmask16 bad = 0;
            for (size_t i = 0; i < nk; i += 16) {
                const __mmask16 msk = nk - i >= 16 ? (__mmask16)0xffff : tail_mask(nk - i);
                const __m512 v = _mm512_maskz_loadu_ps(msk, x + i);
                bad |= _mm512_mask_cmp_ps_mask(msk, _mm512_sub_ps(v, v), zero, _CMP_NEQ_UQ); /* Inf - Inf, NaN */
                mx = _mm512_mask_max_ps(mx, msk, mx, v);
            }
            if (bad) return (int)(g0 + g);
            const float t = _mm512_reduce_max_ps(mx), mo = m[g0 + g];
            mn[g] = t > mo ? t : mo;
            const __m512 vm = _mm512_set1_ps(mn[g]);
            __m512 sum = zero;
            for (size_t i = 0; i < nk; i += 16) {
                const __mmask16 msk = nk - i >= 16 ? (__mmask16)0xffff : tail_mask(nk - i);
                const __m512 e = kvm_exp_neg512(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, x + i), vm));
                _mm512_mask_storeu_ps(x + i, msk, e);
                sum = _mm512_mask_add_ps(sum, msk, sum, e);
            }
            sums[g] = _mm512_reduce_add_ps(sum);
        }
        const __mmask16 gm = tail_mask(ng);
        const __m512 mo = _mm512_maskz_loadu_ps(gm, m + g0), mv = _mm512_maskz_loadu_ps(gm, mn);
        const __mmask16 live = _mm512_mask_cmp_ps_mask(gm, mo, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
        const __m512 cv = _mm512_maskz_mov_ps(live, kvm_exp_neg512(_mm512_sub_ps(_mm512_mask_mov_ps(mv, live, mo), mv)));
        const __m512 lv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(gm, l + g0), cv, _mm512_maskz_loadu_ps(gm, sums));
        _mm512_mask_storeu_ps(l + g0, gm, lv);
        _mm512_mask_storeu_ps(c + g0, gm, cv);
        _mm512_mask_storeu_ps(m + g0, gm, mv);
    }
    return -1;
}

const kvm_attend_kernels kvm_attend_avx512 = {"avx512", x_qk,      x_exp_sum, x_pv,          x_qk_f16,
                                                x_pv_f16, x_qk_bf16, x_pv_bf16, x_softmax_step,
                                                x_qk_pf, x_pv_pf};

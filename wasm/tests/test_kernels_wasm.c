/* The WASM SIMD128 kernel table against the scalar reference, run under
 * Node: conversions, minmax and the non-finite count bit for bit on random
 * bit patterns and edge values (denormals, f16 rounding ties and overflow,
 * Inf, NaN with payloads), odd sizes for the tails; dot within f32 rounding
 * of a double-precision sum; with retrieval in the tree, its SIMD128 scoring
 * kernels (panel and row products, exp) against double-precision references.
 * Prints "N passed, N failed". */
#include "cpu/half.h"
#include "cpu/kernels.h"
#if defined(KVMEM_WASM_HAVE_RETRIEVE)
#  include "retrieve/score.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_pass, g_fail;

static void check(int ok, const char *what, size_t n) {
    if (ok) g_pass++;
    else {
        g_fail++;
        printf("FAIL: %s (n = %zu)\n", what, n);
    }
}

static uint64_t next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const uint32_t k_edge[] = {
    0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x33800000u, 0x33000000u, 0x33000001u, 0x387fe000u,
    0x38800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
    0xffc12345u, 0x3f800000u, 0xbf7fffffu, 0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x4b800001u,
};
#define N_EDGE (sizeof k_edge / sizeof k_edge[0])

static void fill(float *x, size_t n, uint64_t *rng, int finite) {
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next(rng);
        float f;
        switch (r % 4) {
        case 0: f = kvm_bits_f32(k_edge[(r >> 8) % N_EDGE]); break;
        case 1: f = kvm_bits_f32((uint32_t)(r >> 16)); break;
        default: f = ((float)(int32_t)(r >> 32) / 2147483648.0f) * ldexpf(1.0f, (int)((r >> 8) % 40) - 20); break;
        }
        /* dot inputs: finite, |x| < 2^20, so no product or sum overflows */
        if (finite && !(fabsf(f) < 1048576.0f)) f = 1.5f;
        x[i] = f;
    }
}

#if defined(KVMEM_WASM_HAVE_RETRIEVE)
/* out[j * ldo + r] = sum_k q_r[k] * b_j[k] for both kernel shapes, against
 * double sums (tolerance: f32 accumulation over K terms); exp_neg against exp. */
static void check_score(uint64_t *rng) {
    const kvm_score_kernels *w = &kvm_score_wasm128;
    check(w != NULL && kvm_cpu_kernels_get()->score == w, "score kernels: wasm128 chosen", 0);
    if (!w) return;
    enum { K = 128, R = 37, N = 11, RP = 48 };
    static float qrow[R * K], qt[K * RP], blk[N][K], out[N * RP];
    const float *bp[N];
    for (size_t i = 0; i < R * K; i++) qrow[i] = (float)((int64_t)(next(rng) % 2001) - 1000) / 250.0f;
    for (size_t kk = 0; kk < K; kk++)
        for (size_t r = 0; r < RP; r++) qt[kk * RP + r] = r < R ? qrow[r * K + kk] : 0.0f;
    for (size_t j = 0; j < N; j++) {
        for (size_t kk = 0; kk < K; kk++) blk[j][kk] = (float)((int64_t)(next(rng) % 2001) - 1000) / 250.0f;
        bp[j] = blk[j];
    }
    for (int shape = 0; shape < 2; shape++) {
        size_t rows = shape ? 3 : R, n = shape ? N - 2 : N; /* odd tails in both */
        if (shape) w->rows(qrow, rows, bp, n, K, out, rows);
        else w->panel(qt, RP, bp, n, K, out, RP);
        size_t ldo = shape ? rows : RP;
        int ok = 1;
        for (size_t j = 0; j < n; j++)
            for (size_t r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (size_t kk = 0; kk < K; kk++) {
                    ref += (double)qrow[r * K + kk] * blk[j][kk];
                    mag += fabs((double)qrow[r * K + kk] * blk[j][kk]);
                }
                if (fabs(out[j * ldo + r] - ref) > (double)(K + 1) * 6e-8 * mag + 1e-6) ok = 0;
            }
        check(ok, shape ? "score rows kernel vs double" : "score panel kernel vs double", n);
    }
    float x[67], x0[67];
    int ok = 1;
    for (int i = 0; i < 67; i++) x[i] = -(float)i * 1.37f;
    x[66] = -200.0f; /* below the clamp: underflows to ~0 */
    memcpy(x0, x, sizeof x);
    w->exp_neg(x, 67);
    for (int i = 0; i < 66; i++) {
        /* relative accuracy down to the kernel's clamp at -87; below it only
         * a value near 0 (the softmax terms there vanish anyway) */
        double ref = exp((double)x0[i]);
        if (x0[i] > -87.0f ? fabs(x[i] - ref) > 2e-7 * ref : !(x[i] >= 0.0f && x[i] < 1e-37f)) ok = 0;
    }
    if (!(x[66] >= 0.0f && x[66] < 1e-37f)) ok = 0;
    check(ok, "score exp_neg vs exp", 67);

    /* AABB rows on stored boxes: sum_d q_d * (q_d < 0 ? s_min : s_max), f16
     * boxes (finite f16 values, exactly representable) and their f32 twins.
     * Widths cover the f16 kernel's 8-, 4- and 1-wide steps, 5-7 rows its
     * groups of 4 and partial ones; subnormal halves. */
    enum { BDMAX = 78, BRMAX = 7, BN = 3 };
    static float bq[BRMAX * BDMAX], bf[BN][2 * BDMAX], o16[BN * BRMAX], o32[BN * BRMAX];
    static uint16_t bh[BN][2 * BDMAX];
    const float *pf[BN];
    const uint16_t *ph[BN];
    const kvm_cpu_kernels *sc = (&kvm_cpu_scalar);
    static const size_t widths[3] = {72, 76, 78};
    ok = 1;
    for (int pass = 0; pass < 3; pass++) {
        const size_t BD = widths[pass], BR = 5 + (size_t)pass; /* groups of 4 rows and 1, 2, 3 more */
        for (size_t i = 0; i < BR * BD; i++)
            bq[i] = i % 9 == 4 ? 0.0f : (float)((int64_t)(next(rng) % 2001) - 1000) / 250.0f;
        for (size_t j = 0; j < BN; j++) {
            for (size_t d = 0; d < BD; d++) {
                float u = (float)((int64_t)(next(rng) % 2001) - 1000) / 64.0f, v = (float)((int64_t)(next(rng) % 2001) - 1000) / 64.0f;
                if (d == 5) u = 0x1p-20f, v = -0x1p-24f; /* f16 subnormals */
                bf[j][d] = u > v ? u : v, bf[j][BD + d] = u > v ? v : u; /* multiples of 1/64: exact in f16 */
            }
            sc->f32_to_f16(bf[j], bh[j], 2 * BD);
            pf[j] = bf[j], ph[j] = bh[j];
        }
        w->aabb_rows_f16(bq, BR, ph, BN, BD, o16, BR);
        w->aabb_rows_f32(bq, BR, pf, BN, BD, o32, BR);
        for (size_t j = 0; j < BN; j++)
            for (size_t r = 0; r < BR; r++) {
                double ref = 0, mag = 0;
                for (size_t d = 0; d < BD; d++) {
                    double qv = bq[r * BD + d], hi = bf[j][d], lo = bf[j][BD + d];
                    ref += (qv > 0 ? qv * hi : 0) + (qv < 0 ? qv * lo : 0);
                    mag += fabs(qv) * (fabs(hi) > fabs(lo) ? fabs(hi) : fabs(lo));
                }
                if (fabs(o16[j * BR + r] - ref) > (double)(BD + 1) * 6e-8 * mag + 1e-6 ||
                    fabs(o32[j * BR + r] - ref) > (double)(BD + 1) * 6e-8 * mag + 1e-6)
                    ok = 0;
            }
    }
    check(ok, "score aabb_rows (f16 and f32 boxes; widths 72, 76, 78) vs double", 3 * BN);

    /* EXACT on a section of stored keys: max over the rows of q . k, f16
     * keys (multiples of 1/64, exact in f16) and their f32 twins */
    enum { EN = 5, BD = 72, BR = 5 };
    for (size_t i = 0; i < BR * BD; i++) bq[i] = i % 9 == 4 ? 0.0f : (float)((int64_t)(next(rng) % 2001) - 1000) / 250.0f;
    static float ek[EN * BD], e16[BR], e32[BR];
    static uint16_t ekh[EN * BD];
    for (size_t i = 0; i < EN * BD; i++) ek[i] = (float)((int64_t)(next(rng) % 2001) - 1000) / 64.0f;
    sc->f32_to_f16(ek, ekh, EN * BD);
    w->exact_f16(bq, BR, ekh, EN, BD, e16);
    w->exact_f32(bq, BR, ek, EN, BD, e32);
    ok = 1;
    for (size_t r = 0; r < BR; r++) {
        double ref = -INFINITY, mag = 0;
        for (size_t i = 0; i < EN; i++) {
            double x = 0, m = 0;
            for (size_t d = 0; d < BD; d++) x += (double)bq[r * BD + d] * ek[i * BD + d], m += fabs((double)bq[r * BD + d] * ek[i * BD + d]);
            ref = x > ref ? x : ref;
            mag = m > mag ? m : mag;
        }
        if (fabs(e16[r] - ref) > (double)(BD + 1) * 6e-8 * mag + 1e-6 || fabs(e32[r] - ref) > (double)(BD + 1) * 6e-8 * mag + 1e-6)
            ok = 0;
    }
    check(ok, "score exact (f16 and f32 keys) vs double", BR);

    /* the fused softmax's column ops and the dot product */
    enum { CR = 5, CC = 11, CL = 13 };
    static float cx[CR * CL], ce[CR * CL], cm[CL], cz[CL];
    for (size_t i = 0; i < CR * CL; i++) cx[i] = (float)((int64_t)(next(rng) % 2001) - 1000) / 300.0f;
    for (size_t c = 0; c < CC; c++) cm[c] = -INFINITY, cz[c] = 0.0f;
    w->col_max(cx, CR, CL, CC, cm);
    memcpy(ce, cx, sizeof cx);
    w->col_exp_sum(ce, CR, CL, CC, cm, 0.5f, cz);
    ok = 1;
    for (size_t c = 0; c < CC; c++) {
        float m = cx[c];
        double zs = 0;
        for (size_t r = 1; r < CR; r++) m = cx[r * CL + c] > m ? cx[r * CL + c] : m;
        if (m != cm[c]) ok = 0;
        for (size_t r = 0; r < CR; r++) {
            double e = exp(0.5 * ((double)cx[r * CL + c] - m));
            zs += e;
            if (fabs(ce[r * CL + c] - e) > 1e-6 * e) ok = 0;
        }
        if (fabs(cz[c] - zs) > 1e-6 * zs) ok = 0;
    }
    double dref = 0;
    for (size_t i = 0; i < CR * CL; i++) dref += (double)cx[i] * ce[i];
    if (fabs(w->dot(cx, ce, CR * CL) - dref) > 1e-5 * (fabs(dref) + 1)) ok = 0;
    check(ok, "score col_max, col_exp_sum, dot vs double", CC);
}
#endif

int main(void) {
    const kvm_cpu_kernels *s = (&kvm_cpu_scalar), *w = kvm_cpu_kernels_named("wasm128");
    check(w != NULL && strcmp(w->name, "wasm128") == 0, "wasm128 table present", 0);
    check(kvm_cpu_kernels_get() == w, "dispatch picks wasm128 under __wasm_simd128__", 0);
    if (!w) {
        printf("%d passed, %d failed\n", g_pass, g_fail);
        return 1;
    }
    uint64_t rng = 7;
    enum { MAXN = 515 };
    static float x[MAXN], y[MAXN], a[MAXN], b[MAXN];
    static uint16_t h1[MAXN], h2[MAXN];
    /* every f16 / bf16 bit pattern through both tables */
    static uint16_t all[65536];
    static float fa[65536], fb[65536];
    for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    s->f16_to_f32(all, fa, 65536);
    w->f16_to_f32(all, fb, 65536);
    check(memcmp(fa, fb, sizeof fa) == 0, "f16_to_f32 on all 65536 halves", 65536);
    s->bf16_to_f32(all, fa, 65536);
    w->bf16_to_f32(all, fb, 65536);
    check(memcmp(fa, fb, sizeof fa) == 0, "bf16_to_f32 on all 65536 halves", 65536);
    for (int iter = 0; iter < 200; iter++) {
        size_t n = 1 + next(&rng) % MAXN;
        fill(x, n, &rng, 0);
        s->f32_to_f16(x, h1, n);
        w->f32_to_f16(x, h2, n);
        check(memcmp(h1, h2, n * 2) == 0, "f32_to_f16", n);
        s->f32_to_bf16(x, h1, n);
        w->f32_to_bf16(x, h2, n);
        check(memcmp(h1, h2, n * 2) == 0, "f32_to_bf16", n);
        check(s->count_nonfinite(x, n) == w->count_nonfinite(x, n), "count_nonfinite", n);
        /* minmax over rows of a strided matrix, NaNs included */
        size_t dim = 1 + next(&rng) % 37, stride = dim + next(&rng) % 5, rows = 1 + (n - 1) / stride;
        if (rows * stride > n) rows = n / stride;
        if (rows >= 1) {
            s->minmax_rows(x, rows, stride, dim, a, b);
            w->minmax_rows(x, rows, stride, dim, y, y + dim);
            check(memcmp(a, y, dim * 4) == 0 && memcmp(b, y + dim, dim * 4) == 0, "minmax_rows", rows * stride);
        }
        fill(a, n, &rng, 1);
        fill(b, n, &rng, 1);
        double ref = 0, mag = 0;
        for (size_t i = 0; i < n; i++) {
            ref += (double)a[i] * (double)b[i];
            mag += fabs((double)a[i] * (double)b[i]);
        }
        double got = (double)w->dot(a, b, n);
        /* f32 summation bound: n * 2^-24 * sum |a_i b_i| (products are exact in f32 here or round once) */
        check(fabs(got - ref) <= (double)(n + 1) * 6e-8 * mag + 1e-30, "dot vs double reference", n);
    }
#if defined(KVMEM_WASM_HAVE_RETRIEVE)
    check_score(&rng);
#endif
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail != 0;
}

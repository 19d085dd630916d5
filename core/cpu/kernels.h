/* The CPU backend's kernels: one table per instruction set, chosen once per
 * process by the one dispatcher (dispatch.c). The scalar table is the
 * reference every SIMD table is tested against; a table holds the kernel
 * families of every op (conversions and reductions, retrieval scoring,
 * attention, the rule score and SnapKV, quantization, RoPE rows, the
 * checksum), so one switch (KVMEM_CPU) forces all of them.
 *
 * Where the code lives: the scalar references in core/cpu (name_scalar.c), the
 * SIMD kernels per architecture under core/cpu/arch/ (x86: name_avx2.c and
 * name_avx512.c, compiled with their -m flags and only called after run-time
 * detection; wasm: name_wasm128.c, the Emscripten build's; arm: where NEON
 * kernels would go), the vector math they share in simd_math.h. A table
 * may leave a family to a narrower one (the AVX-512 table's SnapKV packing
 * of bf16 is the AVX2 one's): each table below says which it uses. */
#ifndef KVMEM_CPU_KERNELS_H
#define KVMEM_CPU_KERNELS_H

#include "../format/hash.h" /* kvm_acc64_fn */
#include "../rope/rope.h"   /* kvm_rope */

#include <stddef.h>
#include <stdint.h>

/* ---- retrieval scoring ----
 * Scoring is a matrix product. For one (layer, KV head) the R query rows of
 * its head group (n_q tokens x G query heads) meet the candidate blocks:
 *   AABB:  I[j][r] = [q+ || q-]_r . [s_max || s_min]_j     (K = 2 * head_dim)
 *   EXACT: I[j][r] = max_i q_r . k_{j,i}                    (K = head_dim)
 * Scores are kept block-major, out[j * ldo + r], so per-token normalisation
 * over blocks runs down columns with whole vectors of rows. */

/* Rows of a transposed query panel are padded to a multiple of this. */
#define KVM_SCORE_ROW_PAD 16

typedef struct kvm_score_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "wasm128" */
    /* Panel product, for many query rows (prefill):
     *   out[j * ldo + r] = sum_k qt[k * rp + r] * b[j][k],  j < n, r < rp,
     * qt is the transposed query panel [K][rp], rp a multiple of
     * KVM_SCORE_ROW_PAD; b[j] points at K floats. */
    void (*panel)(const float *qt, size_t rp, const float *const *b, size_t n, size_t K, float *out,
                  size_t ldo);
    /* Row product, for few query rows (decode):
     *   out[j * ldo + r] = sum_k q[r * K + k] * b[j][k],  j < n, r < R. */
    void (*rows)(const float *q, size_t R, const float *const *b, size_t n, size_t K, float *out,
                 size_t ldo);
    /* In place x[i] = exp(x[i]) for x[i] <= 0 (arguments of a max-shifted
     * softmax); relative error below 2e-7 (SIMD) vs expf. */
    void (*exp_neg)(float *x, size_t n);
    /* Below this many query rows `rows` beats `panel`. */
    size_t rows_below;
    /* AABB row product on the stored boxes, for few query rows (decode):
     *   out[j * ldo + r] = sum_d q_rd * (q_rd < 0 ? b[j][D + d] : b[j][d]),  j < n, r < R,
     * q [R][D] raw query rows, b[j] a box of 2*D elements (s_max, then s_min):
     * f16 (aabb_rows_f16) or f32 (aabb_rows_f32). This is [q+ || q-] .
     * [s_max || s_min] with one multiply-add per (row, dimension) instead of
     * two: the half of the products that are zero are never formed. The
     * boxes of the following items of a block are prefetched (the pool keeps
     * them right after b[j]). */
    void (*aabb_rows_f16)(const float *q, size_t R, const uint16_t *const *b, size_t n, size_t D, float *out,
                          size_t ldo);
    void (*aabb_rows_f32)(const float *q, size_t R, const float *const *b, size_t n, size_t D, float *out,
                          size_t ldo);
    /* Column maxima: m[c] = max(m[c], x[j * ld + c]), j < n, c < cols. */
    void (*col_max)(const float *x, size_t n, size_t ld, size_t cols, float *m);
    /* Shifted exponentials and their column sums: x[j * ld + c] =
     * exp(tau * (x[j * ld + c] - m[c])) (<= 1: m holds the column maxima),
     * z[c] += x[j * ld + c]. Accuracy of exp_neg. */
    void (*col_exp_sum)(float *x, size_t n, size_t ld, size_t cols, const float *m, float tau, float *z);
    /* sum_i a[i] * b[i], f32 lanes (order differs by table). */
    float (*dot)(const float *a, const float *b, size_t n);
    /* EXACT on one stored section of keys, for few query rows (decode):
     *   out[r] = max_{i < n} sum_d q[r * D + d] * k[i * D + d],  r < R,
     * q [R][D] raw query rows, k [n][D] contiguous key rows as the pool
     * stores them: f16 (exact_f16) or f32 (exact_f32). The keys are
     * widened in registers and each key row meets every query row of the
     * KV head while it is loaded, the max over the rows kept there: one
     * pass over the stored bytes, no f32 copy. */
    void (*exact_f16)(const float *q, size_t R, const uint16_t *k, size_t n, size_t D, float *out);
    void (*exact_f32)(const float *q, size_t R, const float *k, size_t n, size_t D, float *out);
    /* Group maxima of weighted scores, the AGG_MAX aggregation over a
     * block's query tokens: out[g] = max_{t < n} x[g * n + t] * w[g * n + t]
     * (w NULL: x[g * n + t]), g < n_groups, n >= 1. Each product is rounded
     * once and max is exact, so every table gives the same bits. */
    void (*group_max)(const float *x, const float *w, size_t n_groups, size_t n, float *out);
} kvm_score_kernels;

/* ---- attention ---- */

/* Micro-kernels over rows of head_dim floats. */
typedef struct kvm_attend_kernels {
    const char *name;
    /* s[g * lds + i] = scale * dot(q[g], k[i]), g < nq, i < nk */
    void (*qk)(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
               float scale, float *s, size_t lds);
    /* s[i] = exp(s[i] - m) in place (s[i] <= m); returns the sum */
    float (*exp_sum)(float *s, size_t n, float m);
    /* acc[g][:] = c[g] * acc[g][:] + sum_i p[g * ldp + i] * v[i][:], g < nq */
    void (*pv)(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
               const float *const *v, size_t nk, size_t dim);
    /* qk and pv over f16 rows, converted in registers: caller f16 caches are
     * read once, with no f32 copy */
    void (*qk_f16)(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                   float scale, float *s, size_t lds);
    void (*pv_f16)(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                   const uint16_t *const *v, size_t nk, size_t dim);
    /* the same over bf16 rows (HF caches are often bf16) */
    void (*qk_bf16)(const float *const *q, size_t nq, const uint16_t *const *k, size_t nk, size_t dim,
                    float scale, float *s, size_t lds);
    void (*pv_bf16)(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                    const uint16_t *const *v, size_t nk, size_t dim);
    /* One online-softmax step over nq rows of nk >= 1 scores s[g * lds + i]:
     * with mn = max(m[g], max_i s[g][i]), c[g] = exp(m[g] - mn) (0 while
     * m[g] = -inf), s[g][i] = exp(s[g][i] - mn), l[g] = l[g] * c[g] +
     * sum_i s[g][i], m[g] = mn. Returns the first row holding a score that
     * is not finite (rows from it on are left in any state), else -1: a NaN
     * would be skipped by max and clamped by a vector exp. */
    int (*softmax_step)(float *s, size_t lds, size_t nq, size_t nk, float *m, float *l, float *c);
    /* (optional: NULL where the table has none) qk and pv over f32 rows that
     * also prefetch the bytes [pf, pf + pf_len), rows a later call reads, a
     * few lines per key: asked for in one burst ahead of the kernel, a
     * tile's lines waited on the core's few miss buffers and the kernel with
     * them. pf NULL: plain qk / pv. */
    void (*qk_pf)(const float *const *q, size_t nq, const float *const *k, size_t nk, size_t dim,
                  float scale, float *s, size_t lds, const void *pf, size_t pf_len);
    void (*pv_pf)(float *const *acc, size_t nq, const float *c, const float *p, size_t ldp,
                  const float *const *v, size_t nk, size_t dim, const void *pf, size_t pf_len);
} kvm_attend_kernels;

/* The prefetch of the *_pf kernels: lines from *cur up to `end`, at most
 * `bytes` of them, *cur advanced past them. */
static inline void kvm_pf_lines(const char **cur, const char *end, size_t bytes) {
    const char *a = *cur;
    if (a >= end) return;
    const char *e = (size_t)(end - a) < bytes ? end : a + bytes;
    for (; a < e; a += 64) __builtin_prefetch(a, 0, 3);
    *cur = a;
}

/* ---- the rule score and SnapKV ---- */

#define KVM_QK_TILE 32 /* keys per packed tile of the SnapKV GEMM */

/* Rows to prefetch while a tile computes (qk_tile). */
typedef struct {
    const char *base;
    size_t stride, bytes, n;
} kvm_qk_prefetch;

typedef struct kvm_qk_kernels {
    const char *name;
    /* out[g * out_stride + j] = scale * (m[g*D ..] . k[j*kstride ..]) for
     * g < G, j < n: G query rows (contiguous, D floats each) against n key
     * rows. */
    void (*qk)(const float *m, size_t G, size_t D, const float *k, size_t n, size_t kstride,
               float scale, float *out, size_t out_stride);
    /* Softmax of x[0..n) accumulated: acc[j] += exp(x_j - max) / sum.
     * x is overwritten (scratch). n >= 1. */
    void (*softmax_acc)(float *x, size_t n, float *acc);
    /* SnapKV's GEMM, one tile of keys against all of a KV head's query rows:
     * kt[d * KVM_QK_TILE + j] = rows[j][d] for j < nk <= KVM_QK_TILE, 0 for
     * nk <= j < KVM_QK_TILE (kt 64-byte aligned): the keys packed by
     * dimension once, so the tile kernel reads one pointer. */
    void (*kt_pack)(const float *const *rows, size_t nk, size_t D, float *kt);
    /* out[r * ldo + j] = scale * sum_d q(r, d) * kt[d * KVM_QK_TILE + j] for
     * r < nr, j < nk <= KVM_QK_TILE, with q(r, d) = qp[(r / 8) * D * 8 + d * 8
     * + r % 8]: query rows packed by dimension in blocks of 8 (rows past nr in
     * the last block zero; qp 64-byte aligned). Nothing past nk or nr is
     * written. While it runs it prefetches (to L2) pf->n rows of pf->bytes
     * bytes, pf->stride bytes apart, from pf->base (the next tile's keys),
     * spread over its work so the requests do not queue up at once; pf may
     * be NULL. */
    void (*qk_tile)(const float *qp, size_t nr, const float *kt, size_t nk, size_t D, float scale, float *out,
                    size_t ldo, const kvm_qk_prefetch *pf);
    /* One softmax row piece: *mx = max x[0..n) (-inf when n = 0), x[j] =
     * exp(x[j] - *mx) for j < n and 0 for n <= j < nz; returns the sum of the
     * exps, or NaN when some x[0..n) is not finite. */
    float (*exp_row)(float *x, size_t n, size_t nz, float *mx);
    /* vote[j] = sum_i f[i] * e[i * lde + j] for j < n, i < nr (nr >= 1):
     * the window's rows weighted into one vote per position. */
    void (*wsum)(const float *e, size_t lde, const float *f, size_t nr, size_t n, float *vote);
    /* kt_pack from f16 rows, widened on the way (exact); NULL where a table
     * has none (the caller then widens rows itself and uses kt_pack). */
    void (*kt_pack_f16)(const uint16_t *const *rows, size_t nk, size_t D, float *kt);
} kvm_qk_kernels;

/* ---- quantized sections (formats: core/quant/quant_layout.h) ---- */

/* Host kernels on one section. `n` rows of `dim` floats, rows `dim` apart. */
typedef struct kvm_quant_kernels {
    const char *name;
    void (*q8_quant)(const float *x, size_t n, size_t dim, uint16_t *scales, int8_t *codes);
    void (*q8_dequant)(const uint16_t *scales, const int8_t *codes, size_t n, size_t dim, float *out);
    void (*q4_quant)(const float *x, size_t n, size_t dim, uint32_t *words, uint16_t *scales,
                     uint16_t *biases);
    void (*q4_dequant)(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                       size_t dim, float *out);
    /* KIVI keys: per-channel scale/bias from the channel min/max over the
     * n rows (mn, mx given: the block's AABB). */
    void (*q4c_quant)(const float *x, size_t n, size_t dim, const float *mn, const float *mx,
                      uint32_t *words, uint16_t *scales, uint16_t *biases);
    void (*q4c_dequant)(const uint32_t *words, const uint16_t *scales, const uint16_t *biases, size_t n,
                        size_t dim, float *out);
    /* out[i] = x[i] rounded to f16 toward +inf (up) or -inf (AABB corners:
     * a box rounded outward still holds its keys). Bit-identical across tables. */
    void (*f16_round)(const float *x, size_t n, int up, uint16_t *out);
    /* Checks n f16 boxes of 2*dim values (s_max, then s_min) as a loader
     * must: the number of non-finite values plus the number of boxes with
     * some s_min > s_max (+0 and -0 equal). 0: all sane. */
    size_t (*f16_boxes_bad)(const uint16_t *boxes, size_t n, size_t dim);
} kvm_quant_kernels;

/* ---- the table ---- */

/* NEOX rotation of rows forward in place (kvm_rope_rotate_rows' SIMD loop,
 * the arguments of kvm_rope_rotate_rows), bit-identical to kvm_rope_rotate. */
typedef void (*kvm_rope_rows_fn)(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                                 size_t cs_stride);

typedef struct kvm_cpu_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "wasm128" */
    void (*f16_to_f32)(const uint16_t *src, float *dst, size_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, size_t n);
    void (*bf16_to_f32)(const uint16_t *src, float *dst, size_t n);
    void (*f32_to_bf16)(const float *src, uint16_t *dst, size_t n);
    /* Per-column min and max over n_rows rows of `dim` floats, rows `stride`
     * floats apart (the AABB of a block's keys). n_rows >= 1. NaN: like
     * x86 min/max, a NaN in the row is ignored unless it is the first row. */
    void (*minmax_rows)(const float *x, size_t n_rows, size_t stride, size_t dim, float *mn,
                        float *mx);
    /* Number of elements that are Inf or NaN. */
    size_t (*count_nonfinite)(const float *x, size_t n);
    /* Sum of a[i] * b[i], accumulated in f32 lanes (order differs by path). */
    float (*dot)(const float *a, const float *b, size_t n);
    /* the families */
    const kvm_score_kernels *score;
    const kvm_attend_kernels *attend;
    const kvm_qk_kernels *qk;
    const kvm_quant_kernels *quant;
    kvm_rope_rows_fn rope_rows_neox; /* NULL: the scalar kvm_rope_rotate per row */
    kvm_acc64_fn acc64_stripes;      /* the checksum's stripe kernel (format/hash.h) */
} kvm_cpu_kernels;

/* The table in use: the best the CPU supports, unless KVMEM_CPU=scalar|avx2|avx512|wasm128
 * forces one (a forced table the CPU lacks falls back to the best available).
 * Chosen on the first call, then fixed for the process. */
const kvm_cpu_kernels *kvm_cpu_kernels_get(void);
/* A specific table, or NULL if this build or CPU cannot run it. */
const kvm_cpu_kernels *kvm_cpu_kernels_named(const char *name);

/* CPU feature detection (x86); false elsewhere. */
int kvm_cpu_has_avx2(void);
int kvm_cpu_has_avx512(void);

/* Rotate n_rows rows forward (x <- af * R x) in place, rows `stride` floats
 * apart; row i uses cos = cs + i * cs_stride and sin = cos + n_pairs.
 * Through the table's rope_rows_neox for NEOX; bit-identical to
 * kvm_rope_rotate on every path. */
void kvm_rope_rotate_rows(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                          size_t cs_stride);

/* The tables and their parts, for the dispatcher and the tables themselves
 * (dispatch.c references only what this build compiled). */
extern const kvm_cpu_kernels kvm_cpu_scalar, kvm_cpu_avx2, kvm_cpu_avx512, kvm_cpu_wasm128;
extern const kvm_score_kernels kvm_score_scalar, kvm_score_avx2, kvm_score_avx512, kvm_score_wasm128;
extern const kvm_attend_kernels kvm_attend_scalar, kvm_attend_avx2, kvm_attend_avx512;
extern const kvm_qk_kernels kvm_qk_scalar, kvm_qk_avx2, kvm_qk_avx512;
extern const kvm_quant_kernels kvm_quant_scalar, kvm_quant_avx2, kvm_quant_avx512;
void kvm_rope_rows_neox_avx2(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                             size_t cs_stride);
void kvm_rope_rows_neox_avx512(const kvm_rope *r, float *x, size_t n_rows, size_t stride, const float *cs,
                               size_t cs_stride);
void kvm_acc64_stripes_avx2(uint64_t acc[8], const unsigned char *p, size_t n_stripes);
void kvm_acc64_stripes_avx512(uint64_t acc[8], const unsigned char *p, size_t n_stripes);

#endif

/* Kernels of the QueryMemory rule score and of SnapKV: a small table per
 * instruction set, chosen with the core's kernel table (so KVMEM_CPU forces
 * the scalar path here too). The scalar table is the reference. */
#ifndef KVMEM_QMEM_QK_KERNELS_H
#define KVMEM_QMEM_QK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

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

const kvm_qk_kernels *kvm_qk_kernels_get(void);
/* The plain C kt_pack (scalar table; the AVX2 table's too: it is bound by
 * the rows' loads, not by the loop). */
void kvm_qk_kt_pack_plain(const float *const *rows, size_t nk, size_t D, float *kt);
const kvm_qk_kernels *kvm_qk_kernels_scalar(void);
const kvm_qk_kernels *kvm_qk_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_qk_kernels *kvm_qk_kernels_avx512(void); /* NULL when not compiled in */

#endif

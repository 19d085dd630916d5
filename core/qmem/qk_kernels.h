/* Kernels of the QueryMemory rule score and of SnapKV: a small table per
 * instruction set, chosen with the core's kernel table (so KVMEM_CPU forces
 * the scalar path here too). The scalar table is the reference. */
#ifndef KVMEM_QMEM_QK_KERNELS_H
#define KVMEM_QMEM_QK_KERNELS_H

#include <stddef.h>

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
    /* out[r * ldo + j] = scale * sum_d qp[d * 16 + r] * k[j][d] for r < 16,
     * j < nk <= 16: 16 query rows packed by dimension (qp [D][16], 64-byte
     * aligned) against nk f32 key rows, a GEMM block (SnapKV: every query
     * row of a KV head's group and window against its keys read once). */
    void (*qk16)(const float *qp, const float *const *k, size_t nk, size_t D, float scale, float *out, size_t ldo);
} kvm_qk_kernels;

const kvm_qk_kernels *kvm_qk_kernels_get(void);
const kvm_qk_kernels *kvm_qk_kernels_scalar(void);
const kvm_qk_kernels *kvm_qk_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_qk_kernels *kvm_qk_kernels_avx512(void); /* NULL when not compiled in */

#endif

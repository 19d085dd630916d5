/* The CPU backend's host kernels. One table per instruction set; the scalar
 * table is the reference every SIMD table is tested against. */
#ifndef KVMEM_CPU_KERNELS_H
#define KVMEM_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

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
} kvm_cpu_kernels;

/* The table in use: the best the CPU supports, unless KVMEM_CPU=scalar|avx2|avx512|wasm128
 * forces one (a forced table the CPU lacks falls back to the best available). */
const kvm_cpu_kernels *kvm_cpu_kernels_get(void);
/* A specific table, or NULL if this build or CPU cannot run it. */
const kvm_cpu_kernels *kvm_cpu_kernels_named(const char *name);

const kvm_cpu_kernels *kvm_cpu_kernels_scalar(void);
const kvm_cpu_kernels *kvm_cpu_kernels_avx2(void);   /* NULL when not compiled in */
const kvm_cpu_kernels *kvm_cpu_kernels_avx512(void); /* NULL when not compiled in */
/* WebAssembly SIMD128 (kernels_wasm128.c, Emscripten builds only); NULL elsewhere. */
const kvm_cpu_kernels *kvm_cpu_kernels_wasm128(void);

/* CPU feature detection (x86); false elsewhere. */
int kvm_cpu_has_avx2(void);
int kvm_cpu_has_avx512(void);

#endif

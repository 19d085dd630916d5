/* The one choice of CPU kernel table, made once per process. The x86 tables
 * are compiled only on x86-64 (KVMEM_HAVE_AVX2 / KVMEM_HAVE_AVX512 come
 * from CMake) and the SIMD128 one only by the Emscripten build with
 * -msimd128 (a wasm module either validates with SIMD or does not load, so
 * there is nothing to detect at run time); this is the only file that asks
 * which were built. */
#include "kernels.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
/* __builtin_cpu_supports also checks that the OS saves the wide registers. */
int kvm_cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
int kvm_cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && kvm_cpu_has_avx2();
}
#else
int kvm_cpu_has_avx2(void) { return 0; }
int kvm_cpu_has_avx512(void) { return 0; }
#endif

const kvm_cpu_kernels *kvm_cpu_kernels_named(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, "scalar") == 0) return &kvm_cpu_scalar;
#if defined(KVMEM_HAVE_AVX2)
    if (strcmp(name, "avx2") == 0) return kvm_cpu_has_avx2() ? &kvm_cpu_avx2 : NULL;
#endif
#if defined(KVMEM_HAVE_AVX512)
    if (strcmp(name, "avx512") == 0) return kvm_cpu_has_avx512() ? &kvm_cpu_avx512 : NULL;
#endif
#if defined(__wasm_simd128__)
    if (strcmp(name, "wasm128") == 0) return &kvm_cpu_wasm128;
#endif
    return NULL;
}

static const kvm_cpu_kernels *best(void) {
    static const char *const order[] = {"avx512", "avx2", "wasm128"};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const kvm_cpu_kernels *k = kvm_cpu_kernels_named(order[i]);
        if (k) return k;
    }
    return &kvm_cpu_scalar;
}

/* Resolved on every call from a cached pointer: cheap, and the environment
 * is read once. Racing first calls compute the same answer. */
static const kvm_cpu_kernels *_Atomic g_chosen;

const kvm_cpu_kernels *kvm_cpu_kernels_get(void) {
    const kvm_cpu_kernels *k = g_chosen;
    if (k) return k;
    const char *force = getenv("KVMEM_CPU");
    k = force ? kvm_cpu_kernels_named(force) : NULL;
    if (!k) k = best();
    g_chosen = k;
    return k;
}

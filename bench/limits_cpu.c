/* This machine's limits on the calling thread's CPU clock: on a machine
 * shared with other jobs a wall-clock measure counts the time the thread
 * waited for a core (the FMA peak read a third of its quiet value at a load
 * average of 4 on 2 vCPUs), so every ratio to it came out inflated. The
 * suites that time their own work on the CPU clock divide by these. Memory
 * contention from other jobs still lowers both sides alike. Best of the
 * medians of `rounds` measurements: load only ever lowers a limit. */
#include "bench.h"

#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#endif

double kvm_thread_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static volatile float g_sink;

#if defined(__x86_64__) && defined(__GNUC__)
/* 16 independent FMA chains (the latency hidden) in named registers: an
 * array of accumulators indexed in a loop stays in memory at -O2 (load,
 * FMA, store per element), which times store forwarding, not the FMA unit
 * (kvm_measure_peak_gflops has that form; the kernels beat it by half) */
__attribute__((target("avx512f"))) static double fma512_cpu(long iters) {
    const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3);
    __m512 a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7);
    __m512 a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    __m512 a12 = _mm512_set1_ps(12), a13 = _mm512_set1_ps(13), a14 = _mm512_set1_ps(14), a15 = _mm512_set1_ps(15);
    double t0 = kvm_thread_cpu_now();
    for (long i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c), a2 = _mm512_fmadd_ps(a2, m, c);
        a3 = _mm512_fmadd_ps(a3, m, c), a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c), a8 = _mm512_fmadd_ps(a8, m, c);
        a9 = _mm512_fmadd_ps(a9, m, c), a10 = _mm512_fmadd_ps(a10, m, c), a11 = _mm512_fmadd_ps(a11, m, c);
        a12 = _mm512_fmadd_ps(a12, m, c), a13 = _mm512_fmadd_ps(a13, m, c), a14 = _mm512_fmadd_ps(a14, m, c);
        a15 = _mm512_fmadd_ps(a15, m, c);
    }
    double t = kvm_thread_cpu_now() - t0;
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                                       _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
    g_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * 16 * (double)iters / t / 1e9;
}

/* a streaming read with four independent sums, 64 bytes per load */
__attribute__((target("avx512f"))) static void read512(const float *x, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 64 <= n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(x + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(x + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(x + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(x + i + 48));
    }
    g_sink = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}
#endif

double kvm_measure_peak_gflops_cpu(int rounds) {
    double best = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return kvm_measure_peak_gflops();
    for (int r = 0; r < rounds; r++) {
        double v[7];
        for (int i = 0; i < 7; i++) v[i] = fma512_cpu(2000000);
        const double m = kvm_median(v, 7);
        best = m > best ? m : best;
    }
#else
    (void)rounds;
    best = kvm_measure_peak_gflops();
#endif
    return best;
}

double kvm_measure_read_bw_gbps_cpu(size_t bytes, int rounds) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f")) return kvm_measure_read_bw_gbps(bytes);
    const size_t n = bytes / sizeof(float) / 64 * 64;
    float *x = aligned_alloc(64, n * sizeof(float));
    if (!x) return 0;
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    double best = 0;
    for (int r = 0; r < rounds; r++) {
        double v[7];
        read512(x, n); /* warm-up: pages touched, TLB */
        for (int i = 0; i < 7; i++) {
            const double t0 = kvm_thread_cpu_now();
            read512(x, n);
            v[i] = (double)(n * sizeof(float)) / (kvm_thread_cpu_now() - t0) / 1e9;
        }
        const double m = kvm_median(v, 7);
        best = m > best ? m : best;
    }
    free(x);
    return best;
#else
    (void)rounds;
    return kvm_measure_read_bw_gbps(bytes);
#endif
}

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
    for (int r = 0; r < rounds; r++) {
        double v[7];
        for (int i = 0; i < 7; i++) v[i] = kvm_fma_gflops_once(kvm_thread_cpu_now);
        const double m = kvm_median(v, 7);
        best = m > best ? m : best;
    }
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

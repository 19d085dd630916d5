/* Timing, machine limits and JSON output shared by every suite. */
#include "bench.h"
#include "cpu/threadpool.h"

#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#  include <immintrin.h>
#endif

double kvm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kvm_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double kvm_time_median(void (*fn)(void *), void *arg, int warm, int reps) {
    for (int i = 0; i < warm; i++) fn(arg);
    double t[64];
    if (reps > 64) reps = 64;
    if (reps < 1) reps = 1;
    for (int i = 0; i < reps; i++) {
        double t0 = kvm_now();
        fn(arg);
        t[i] = kvm_now() - t0;
    }
    return kvm_median(t, reps);
}

/* A sink the compiler cannot see through, so measured loops are not removed. */
volatile float kvm_bench_sink;

typedef struct { const float *x; size_t n; } read_arg;

#if defined(__x86_64__) && defined(__GNUC__)
/* Several independent accumulators: bound by memory, not by add latency. */
__attribute__((target("avx2"))) static void read_avx2(const float *x, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(x + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(x + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(x + i + 24));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    kvm_bench_sink = out[0] + out[7];
}
#endif

static void read_once(void *p) {
    const read_arg *a = p;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        read_avx2(a->x, a->n);
        return;
    }
#endif
    float s[16] = {0};
    for (size_t i = 0; i + 16 <= a->n; i += 16)
        for (int j = 0; j < 16; j++) s[j] += a->x[i + (size_t)j];
    kvm_bench_sink = s[0] + s[15];
}

double kvm_measure_read_bw_gbps(size_t bytes) {
    size_t n = bytes / sizeof(float);
    float *x = aligned_alloc(64, n * sizeof(float));
    if (!x) return 0;
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    read_arg a = {x, n};
    double t = kvm_time_median(read_once, &a, 2, 9);
    free(x);
    return (double)bytes / t / 1e9;
}

typedef struct {
    const float *x;
    size_t n, parts;
} split_arg;

static void read_part(void *p, size_t b, size_t e) {
    const split_arg *a = p;
    for (size_t i = b; i < e; i++) {
        size_t n0 = a->n / a->parts * i, n1 = i + 1 == a->parts ? a->n : a->n / a->parts * (i + 1);
        read_arg r = {a->x + n0, n1 - n0};
        read_once(&r);
    }
}

typedef struct {
    kvm_threadpool *tp;
    split_arg a;
} threads_arg;

static void read_threads_once(void *p) {
    threads_arg *t = p;
    kvm_parallel_for(t->tp, t->a.parts, 1, read_part, &t->a);
}

double kvm_measure_read_bw_threads_gbps(size_t bytes, int n_threads) {
    if (n_threads <= 1) return kvm_measure_read_bw_gbps(bytes);
    size_t n = bytes / sizeof(float);
    float *x = aligned_alloc(64, n * sizeof(float));
    kvm_threadpool *tp = kvm_threadpool_create(n_threads);
    if (!x || !tp) {
        free(x);
        kvm_threadpool_free(tp);
        return 0;
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    threads_arg t = {tp, {x, n, (size_t)n_threads}};
    double s = kvm_time_median(read_threads_once, &t, 2, 9);
    free(x);
    kvm_threadpool_free(tp);
    return (double)bytes / s / 1e9;
}

double kvm_measure_disk_write_gbps(const char *dir, size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s/.kvmem-bench-disk-%ld", dir, (long)getpid());
    const size_t chunk = (size_t)1 << 20;
    unsigned char *buf = malloc(chunk);
    if (!buf) return 0;
    for (size_t i = 0; i < chunk; i++) buf[i] = (unsigned char)(i * 31 + 7);
    double t0 = kvm_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int ok = fd >= 0;
    for (size_t w = 0; ok && w < bytes; w += chunk) {
        size_t m = bytes - w < chunk ? bytes - w : chunk;
        ok = write(fd, buf, m) == (ssize_t)m;
    }
    ok = ok && fsync(fd) == 0;
    if (fd >= 0) ok = close(fd) == 0 && ok;
    double t = kvm_now() - t0;
    unlink(path);
    free(buf);
    return ok ? (double)bytes / t / 1e9 : 0;
}

typedef struct { void *d; const void *s; size_t n; } copy_arg;
static void copy_once(void *p) {
    copy_arg *a = p;
    memcpy(a->d, a->s, a->n);
}

double kvm_measure_memcpy_gbps(size_t bytes) {
    void *s = aligned_alloc(64, bytes), *d = aligned_alloc(64, bytes);
    if (!s || !d) {
        free(s);
        free(d);
        return 0;
    }
    memset(s, 1, bytes);
    memset(d, 2, bytes);
    copy_arg a = {d, s, bytes};
    double t = kvm_time_median(copy_once, &a, 2, 9);
    free(s);
    free(d);
    return (double)bytes / t / 1e9;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Peak FMA throughput of one core with the widest vectors the CPU runs:
 * 16 independent chains hide the FMA latency. The inner loops are unrolled
 * so the chains live in registers: a loop over the accumulator array kept
 * it in memory at -O2 and timed a load-FMA-store per element (a third of
 * the FMA peak, below what the kernels reach). */
__attribute__((target("avx512f"))) static double fma_avx512(long iters, double (*now)(void)) {
    __m512 a[16], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int j = 0; j < 16; j++) a[j] = _mm512_set1_ps((float)j);
    double t0 = now();
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_fmadd_ps(a[j], m, c);
    double t = now() - t0;
    __m512 s = a[0];
    for (int j = 1; j < 16; j++) s = _mm512_add_ps(s, a[j]);
    kvm_bench_sink = _mm512_reduce_add_ps(s);
    return 2.0 * 16 * 16 * (double)iters / t / 1e9;
}
__attribute__((target("avx2,fma"))) static double fma_avx2(long iters, double (*now)(void)) {
    __m256 a[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
    double t0 = now();
    for (long i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], m, c);
    double t = now() - t0;
    float out[8];
    __m256 s = a[0];
    for (int j = 1; j < 12; j++) s = _mm256_add_ps(s, a[j]);
    _mm256_storeu_ps(out, s);
    kvm_bench_sink = out[0];
    return 2.0 * 8 * 12 * (double)iters / t / 1e9;
}
#endif

double kvm_fma_gflops_once(double (*now)(void)) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return fma_avx512(2000000, now);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return fma_avx2(2000000, now);
#else
    (void)now;
#endif
    return 0;
}

double kvm_measure_peak_gflops(void) {
    double v[7];
    for (int r = 0; r < 7; r++) v[r] = kvm_fma_gflops_once(kvm_now);
    return kvm_median(v, 7);
}

static int g_first;
void kvm_json_begin(FILE *f, const char *suite) {
    fputc('{', f);
    g_first = 1;
    kvm_json_str(f, "suite", suite);
}
void kvm_json_str(FILE *f, const char *k, const char *v) {
    fprintf(f, "%s\"%s\":\"", g_first ? "" : ",", k);
    for (const char *c = v; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', f);
        fputc(*c, f);
    }
    fputc('"', f);
    g_first = 0;
}
void kvm_json_num(FILE *f, const char *k, double v) {
    if (isfinite(v)) fprintf(f, "%s\"%s\":%.6g", g_first ? "" : ",", k, v);
    else fprintf(f, "%s\"%s\":null", g_first ? "" : ",", k);
    g_first = 0;
}
void kvm_json_int(FILE *f, const char *k, long long v) {
    fprintf(f, "%s\"%s\":%lld", g_first ? "" : ",", k, v);
    g_first = 0;
}
void kvm_json_end(FILE *f) {
    fputs("}\n", f);
    fflush(f);
}

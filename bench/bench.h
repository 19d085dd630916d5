/* Benchmark suites for `kvmem bench --json SUITE`. Each suite prints one
 * flat JSON object per configuration (one line each), measures this
 * machine's own limits in the same run and reports ratios to them.
 * Timings are medians of repeated runs after a warm-up. */
#ifndef KVMEM_BENCH_H
#define KVMEM_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct kvm_bench_opts {
    int json;            /* 1: JSON lines; 0: human-readable */
    int quick;           /* 1: small sizes and few repeats (tests, CI) */
    const char *backend; /* "cpu", ... */
    int n_threads;       /* 0 = all cores */
    FILE *out;
    const char *store;   /* --store URL: a networked store for the store suite (redis://...), or NULL */
} kvm_bench_opts;

typedef struct kvm_bench_suite {
    const char *name;
    const char *what;
    int (*run)(const kvm_bench_opts *o); /* 0 on success */
} kvm_bench_suite;

/* All suites, NULL-terminated. New suites add one line in bench/suites.c. */
extern const kvm_bench_suite *const kvm_bench_suites[];

/* Monotonic clock in seconds. */
double kvm_now(void);
/* Median of n samples (sorts them in place). */
double kvm_median(double *v, int n);

/* Time fn(arg) `reps` times after `warm` warm-up calls; returns the median seconds. */
double kvm_time_median(void (*fn)(void *), void *arg, int warm, int reps);

/* This machine's limits, measured now on the calling thread. */
double kvm_measure_read_bw_gbps(size_t bytes);  /* streaming read, one thread */
/* Streaming read of one buffer split among n_threads threads (all bytes / s). */
double kvm_measure_read_bw_threads_gbps(size_t bytes, int n_threads);
/* Write+fsync of a new file of `bytes` in dir (1 MiB writes from memory,
 * fsync, close; the file removed afterwards, outside the timing): the
 * disk's bandwidth as a crash-safe save meets it. 0 on failure. */
double kvm_measure_disk_write_gbps(const char *dir, size_t bytes);
double kvm_measure_memcpy_gbps(size_t bytes);   /* memcpy, one thread (bytes copied / s) */
double kvm_measure_peak_gflops(void);           /* one core's f32 FMA throughput */
/* One FMA-peak measurement (GFLOP/s, 0 without AVX2/AVX-512) timed on the
 * clock now (kvm_now: wall; kvm_thread_cpu_now: the thread's CPU time). */
double kvm_fma_gflops_once(double (*now)(void));

/* The same limits on the calling thread's CPU clock (bench/limits_cpu.c),
 * best of `rounds` medians: the denominators of results timed on the CPU
 * clock, which a shared machine's scheduling does not distort. The read
 * uses 64-byte loads where the CPU has them. */
double kvm_thread_cpu_now(void);
double kvm_measure_read_bw_gbps_cpu(size_t bytes, int rounds);
double kvm_measure_peak_gflops_cpu(int rounds);

/* The store suite's lines for agents opened in place (bench/store_mapped.c),
 * in the suite's directory dir. 0 on success. */
struct kvmem_context;
int kvm_bench_store_mapped(const kvm_bench_opts *o, struct kvmem_context *ctx, const char *dir);

/* JSON line helpers: begin, add keys, end (prints "}\n"). */
void kvm_json_begin(FILE *f, const char *suite);
void kvm_json_str(FILE *f, const char *key, const char *val);
void kvm_json_num(FILE *f, const char *key, double val);
void kvm_json_int(FILE *f, const char *key, long long val);
void kvm_json_end(FILE *f);

#endif

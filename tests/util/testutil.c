#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvm_test_assert_msg(const char *call, const char *needle) {
    const char *msg = kvmem_last_error();
    if (!needle) return;
    if (!msg || !strstr(msg, needle)) fail_msg("%s: message '%s' lacks '%s'", call, msg ? msg : "(null)", needle);
}

uint64_t tu_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tu_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)(tu_next(s) >> 40) * (1.0f / 16777216.0f);
}

float tu_normal(uint64_t *s) {
    float u1 = tu_uniform(s, 1e-7f, 1.0f), u2 = tu_uniform(s, 0.0f, 1.0f);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

kvmem_model_spec tu_spec(int32_t L, int32_t D) {
    kvmem_model_spec s = kvmem_model_spec_default();
    s.n_layers = L;
    s.n_q_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = D;
    snprintf(s.model_id, sizeof s.model_id, "test-%dL-%dD", L, D);
    return s;
}

kvmem_context *tu_context(int32_t n_threads) {
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "cpu";
    p.n_threads = n_threads;
    kvmem_context *ctx = NULL;
    assert_ok(kvmem_context_create(&p, &ctx));
    return ctx;
}

void tu_fill_kv(float *buf, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) buf[i] = tu_normal(rng);
}

/* Every finite f16 value, ascending (-65504 .. 65504; -0 and +0 both kept). */
static double g_f16[63488];
static size_t g_f16_n;

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void f16_table(void) {
    if (g_f16_n) return;
    size_t n = 0;
    for (unsigned h = 0; h < 65536; h++) {
        unsigned e = (h >> 10) & 31, m = h & 1023;
        if (e == 31) continue; /* Inf, NaN */
        double v = e ? ldexp(1.0 + m / 1024.0, (int)e - 15) : ldexp(m / 1024.0, -14);
        g_f16[n++] = (h & 0x8000) ? -v : v;
    }
    qsort(g_f16, n, sizeof *g_f16, cmp_dbl);
    g_f16_n = n;
}

double tu_f16_below(double x) {
    f16_table();
    size_t lo = 0, hi = g_f16_n; /* the first value > x */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_f16[mid] <= x) lo = mid + 1;
        else hi = mid;
    }
    assert_true(lo > 0);
    return g_f16[lo - 1];
}

double tu_f16_above(double x) {
    f16_table();
    size_t lo = 0, hi = g_f16_n; /* the first value >= x */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_f16[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    assert_true(lo < g_f16_n);
    return g_f16[lo];
}

int tu_tmpdir_make(char *dir, size_t size, const char *tag) {
    if (snprintf(dir, size, "/tmp/kvmem-%s-XXXXXX", tag) >= (int)size) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

int tu_tmpdir_remove(const char *dir) {
    char cmd[600];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd) return -1;
    return system(cmd) == 0 ? 0 : -1;
}

int tu_skips;

int tu_group_result(int failed, size_t n_tests) {
    if (failed) return 1;
    return n_tests > 0 && (size_t)tu_skips >= n_tests ? 77 : 0;
}

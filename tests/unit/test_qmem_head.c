/* The residual head: strict safetensors loading, zero output weights give
 * the rule score exactly, and the forward pass against a double-precision
 * reference written here. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NT 8
static const char *const NAMES[NT] = {"alpha", "w_q", "w_k", "w_v", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"};

typedef struct {
    int D;
    float alpha;
    float *t[NT];
    int64_t shape[NT][2];
    int ndim[NT];
} weights;

static size_t nelem(const weights *w, int i) {
    size_t n = 1;
    for (int d = 0; d < w->ndim[i]; d++) n *= (size_t)w->shape[i][d];
    return n;
}

static void make_weights(weights *w, int D, uint64_t seed, int zero_out) {
    uint64_t rng = seed;
    int64_t F = 3 * D + 1;
    int64_t sh[NT][2] = {{1, 0}, {128, F}, {128, D}, {128, D}, {256, F + 128}, {256, 0}, {1, 256}, {1, 0}};
    int nd[NT] = {1, 2, 2, 2, 2, 1, 2, 1};
    w->D = D;
    for (int i = 0; i < NT; i++) {
        w->ndim[i] = nd[i];
        w->shape[i][0] = sh[i][0];
        w->shape[i][1] = sh[i][1];
        size_t n = nelem(w, i);
        w->t[i] = malloc(n * sizeof(float));
        float sc = i == 0 ? 1.0f : 1.0f / sqrtf((float)(nd[i] == 2 ? sh[i][1] : 16));
        for (size_t e = 0; e < n; e++) w->t[i][e] = sc * tu_normal(&rng);
    }
    w->t[0][0] = 0.7f;
    if (zero_out) {
        memset(w->t[6], 0, 256 * sizeof(float));
        w->t[7][0] = 0.0f;
    }
}

static void free_weights(weights *w) {
    for (int i = 0; i < NT; i++) free(w->t[i]);
}

/* A safetensors image of the weights, in the order given, with optional
 * mutations for the strictness tests. */
static int g_skip = -1; /* a tensor to leave out */

static unsigned char *write_st(const weights *w, const char *extra_json, size_t *size) {
    char hdr[4096];
    size_t at = 0, off = 0;
    at += (size_t)snprintf(hdr + at, sizeof hdr - at, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < NT; i++) {
        size_t b = nelem(w, i) * 4;
        if (i == g_skip) continue;
        if (w->ndim[i] == 1)
            at += (size_t)snprintf(hdr + at, sizeof hdr - at, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                   NAMES[i], (long long)w->shape[i][0], off, off + b);
        else
            at += (size_t)snprintf(hdr + at, sizeof hdr - at,
                                   ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}", NAMES[i],
                                   (long long)w->shape[i][0], (long long)w->shape[i][1], off, off + b);
        off += b;
    }
    if (extra_json) at += (size_t)snprintf(hdr + at, sizeof hdr - at, "%s", extra_json);
    at += (size_t)snprintf(hdr + at, sizeof hdr - at, "}");
    while (at % 8) hdr[at++] = ' ';
    *size = 8 + at + off;
    unsigned char *buf = malloc(*size);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)at >> (8 * i));
    memcpy(buf + 8, hdr, at);
    size_t p = 8 + at;
    for (int i = 0; i < NT; i++) {
        if (i == g_skip) continue;
        memcpy(buf + p, w->t[i], nelem(w, i) * 4); /* little-endian host assumed (x86, ARM) */
        p += nelem(w, i) * 4;
    }
    return buf;
}

static double gelu_d(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* The head in double with plain loops. mem [L][HQ][D], k [L][N][HKV][D]. */
static void ref_head(const weights *w, int L, int HQ, int HKV, int64_t N, const float *mem, const float *k,
                     const float *rule, int64_t qb, int64_t qe, double *out) {
    int D = w->D, F = 3 * D + 1, X = F + 128;
    double alpha = w->t[0][0] > 5 ? 5 : w->t[0][0] < -5 ? -5 : w->t[0][0];
    double *kbar = calloc((size_t)N * D, sizeof *kbar), *mbar = calloc((size_t)D, sizeof *mbar);
    int G = HQ / HKV;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < HQ; h++)
            for (int d = 0; d < D; d++) mbar[d] += mem[((size_t)l * HQ + h) * D + d] / (double)(L * HQ);
    for (int64_t j = 0; j < N; j++)
        for (int l = 0; l < L; l++)
            for (int h = 0; h < HQ; h++) /* expanded query heads */
                for (int d = 0; d < D; d++)
                    kbar[j * D + d] += k[(((size_t)l * N + j) * HKV + h / G) * D + d] / (double)(L * HQ);
    int64_t S = qe - qb;
    double *kk = calloc((size_t)S * 128, sizeof *kk), *vv = calloc((size_t)S * 128, sizeof *vv);
    for (int64_t i = 0; i < S; i++)
        for (int o = 0; o < 128; o++)
            for (int d = 0; d < D; d++) {
                kk[i * 128 + o] += w->t[2][o * D + d] * kbar[(qb + i) * D + d];
                vv[i * 128 + o] += w->t[3][o * D + d] * kbar[(qb + i) * D + d];
            }
    double *x = malloc((size_t)X * sizeof *x), *att = malloc((size_t)S * sizeof *att);
    for (int64_t j = 0; j < N; j++) {
        for (int d = 0; d < D; d++) {
            x[d] = kbar[j * D + d];
            x[D + d] = mbar[d];
            x[2 * D + d] = kbar[j * D + d] * mbar[d];
        }
        x[3 * D] = rule[j];
        double q[128] = {0};
        for (int o = 0; o < 128; o++)
            for (int f = 0; f < F; f++) q[o] += w->t[1][o * F + f] * x[f];
        for (int a = 0; a < 4; a++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t i = 0; i < S; i++) {
                double s = 0;
                for (int o = 0; o < 32; o++) s += q[a * 32 + o] * kk[i * 128 + a * 32 + o];
                att[i] = s / sqrt(32.0);
                mx = att[i] > mx ? att[i] : mx;
            }
            for (int64_t i = 0; i < S; i++) sum += exp(att[i] - mx);
            for (int o = 0; o < 32; o++) {
                double v = 0;
                for (int64_t i = 0; i < S; i++) v += exp(att[i] - mx) / sum * vv[i * 128 + a * 32 + o];
                x[F + a * 32 + o] = v;
            }
        }
        double o2 = w->t[7][0];
        for (int u = 0; u < 256; u++) {
            double hsum = w->t[5][u];
            for (int f = 0; f < X; f++) hsum += w->t[4][(size_t)u * X + f] * x[f];
            o2 += w->t[6][u] * gelu_d(hsum);
        }
        out[j] = rule[j] + alpha * o2;
    }
    free(kbar);
    free(mbar);
    free(kk);
    free(vv);
    free(x);
    free(att);
}

typedef struct {
    int L, D;
    int64_t N;
    float *mem, *k, *rule;
    kvmem_tensor kt;
    kvmem_model_spec spec;
} request;

static void make_request(request *r, int L, int D, int64_t N, uint64_t seed) {
    uint64_t rng = seed;
    r->L = L;
    r->D = D;
    r->N = N;
    r->spec = tu_spec(L, D);
    size_t E = (size_t)L * 4 * D, KE = (size_t)L * N * 2 * D;
    r->mem = malloc(E * 4);
    r->k = malloc(KE * 4);
    r->rule = malloc((size_t)N * 4);
    for (size_t i = 0; i < E; i++) r->mem[i] = 0.3f * tu_normal(&rng);
    for (size_t i = 0; i < KE; i++) r->k[i] = tu_normal(&rng);
    for (int64_t j = 0; j < N; j++) r->rule[j] = tu_uniform(&rng, 0.0f, 3.0f);
    int64_t shape[4] = {L, N, 2, D};
    assert_ok(kvmem_tensor_init(&r->kt, r->k, KVMEM_F32, 4, shape));
}

static void free_request(request *r) {
    free(r->mem);
    free(r->k);
    free(r->rule);
}

static void zero_output_weights_reproduce_the_rule_exactly(void **state) {
    (void)state;
    weights w;
    make_weights(&w, 16, 1, 1);
    size_t size;
    unsigned char *img = write_st(&w, NULL, &size);
    kvmem_qmem_head *h = NULL;
    assert_ok(kvmem_qmem_head_load_buffer(img, size, &h));
    assert_int_equal(kvmem_qmem_head_dim(h), 16);
    request r;
    make_request(&r, 3, 16, 50, 2);
    float *s = malloc(50 * 4);
    assert_ok(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, r.rule, 40, 50, s));
    assert_memory_equal(s, r.rule, 50 * 4);
    /* in place too */
    float *inplace = malloc(50 * 4);
    memcpy(inplace, r.rule, 50 * 4);
    assert_ok(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, inplace, 40, 50, inplace));
    assert_memory_equal(inplace, r.rule, 50 * 4);
    free(inplace);
    free(s);
    free(img);
    free_request(&r);
    kvmem_qmem_head_free(h);
    free_weights(&w);
}

static void forward_matches_reference(void **state) {
    (void)state;
    weights w;
    make_weights(&w, 8, 3, 0);
    size_t size;
    unsigned char *img = write_st(&w, NULL, &size);
    /* through a file this time */
    char path[] = "/tmp/kvmem_head_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, size), (ssize_t)size);
    close(fd);
    kvmem_qmem_head *h = NULL;
    assert_ok(kvmem_qmem_head_load(path, &h));
    unlink(path);
    assert_true(kvmem_qmem_head_alpha(h) == 0.7f);
    request r;
    make_request(&r, 2, 8, 33, 4);
    float s[33];
    double ref[33];
    assert_ok(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, r.rule, 25, 33, s));
    ref_head(&w, 2, 4, 2, 33, r.mem, r.k, r.rule, 25, 33, ref);
    double moved = 0;
    for (int j = 0; j < 33; j++) {
        if (fabs(s[j] - ref[j]) > 1e-4 * (1 + fabs(ref[j]))) fail_msg("j=%d: %.8g vs %.8g", j, s[j], ref[j]);
        moved += fabs(ref[j] - r.rule[j]);
    }
    assert_true(moved > 1e-2); /* the residual really contributes */
    free(img);
    free_request(&r);
    kvmem_qmem_head_free(h);
    /* alpha outside [-5, 5] is clipped */
    w.t[0][0] = 40.0f;
    img = write_st(&w, NULL, &size);
    assert_ok(kvmem_qmem_head_load_buffer(img, size, &h));
    assert_true(kvmem_qmem_head_alpha(h) == 5.0f);
    kvmem_qmem_head_free(h);
    free(img);
    w.t[0][0] = -40.0f;
    img = write_st(&w, NULL, &size);
    assert_ok(kvmem_qmem_head_load_buffer(img, size, &h));
    assert_true(kvmem_qmem_head_alpha(h) == -5.0f);
    kvmem_qmem_head_free(h);
    free(img);
    free_weights(&w);
}

static void strict_reader_rejects_bad_files(void **state) {
    (void)state;
    weights w;
    make_weights(&w, 4, 5, 0);
    size_t size;
    kvmem_qmem_head *h = NULL;
    unsigned char *img = write_st(&w, NULL, &size);
    /* every truncation fails, none crashes */
    for (size_t cut = 0; cut < size; cut += (cut < 300 ? 1 : 97))
        assert_true(kvmem_qmem_head_load_buffer(img, cut, &h) != KVMEM_OK);
    assert_null(h);
    /* header length larger than the file */
    unsigned char *bad = malloc(size);
    memcpy(bad, img, size);
    bad[5] = 1;
    assert_status(kvmem_qmem_head_load_buffer(bad, size, &h), KVMEM_ERR_FORMAT, "header length");
    /* corrupt JSON */
    memcpy(bad, img, size);
    bad[8] = '[';
    assert_status(kvmem_qmem_head_load_buffer(bad, size, &h), KVMEM_ERR_FORMAT, "not a JSON object");
    free(bad);
    free(img);
    /* unknown tensor */
    img = write_st(&w, ",\"extra\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "unexpected tensor 'extra'");
    free(img);
    /* duplicate name */
    img = write_st(&w, ",\"alpha\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "twice");
    free(img);
    /* an unknown field inside a tensor entry */
    img = write_st(&w, ",\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"foo\":1}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "nothing else");
    free(img);
    /* unsupported dtype */
    img = write_st(&w, ",\"x\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "F32/F16/BF16");
    free(img);
    /* overlapping data (a zero-size tensor does not overlap; this one does) */
    w.shape[0][0] = 1;
    img = write_st(&w, ",\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_CORRUPT, "overlap");
    free(img);
    /* offsets outside the data */
    img = write_st(&w, ",\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[99999999,99999999]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_CORRUPT, "outside");
    free(img);
    /* size does not match the shape */
    img = write_st(&w, ",\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}", &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_CORRUPT, "data bytes");
    free(img);
    /* wrong shape of a known tensor */
    w.shape[5][0] = 255;
    img = write_st(&w, NULL, &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "'mlp.0.bias' has shape [255]");
    free(img);
    w.shape[5][0] = 256;
    /* every tensor is required */
    for (g_skip = 0; g_skip < NT; g_skip++) {
        img = write_st(&w, NULL, &size);
        char want[64];
        snprintf(want, sizeof want, "'%s' is missing", NAMES[g_skip]);
        assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, want);
        free(img);
    }
    g_skip = -1;
    /* non-finite weight */
    w.t[1][3] = NAN;
    img = write_st(&w, NULL, &size);
    assert_status(kvmem_qmem_head_load_buffer(img, size, &h), KVMEM_ERR_FORMAT, "non-finite");
    free(img);
    assert_null(h);
    assert_status(kvmem_qmem_head_load("/nonexistent/dir/head.safetensors", &h), KVMEM_ERR_IO, "cannot open");
    assert_status(kvmem_qmem_head_load(NULL, &h), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_qmem_head_load_buffer(NULL, 10, &h), KVMEM_ERR_INVALID_ARG, "data is NULL");
    assert_status(kvmem_qmem_head_load_buffer("12345678", 8, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    assert_null(h);
    kvmem_qmem_head_free(NULL);
    assert_int_equal(kvmem_qmem_head_dim(NULL), 0);
    assert_true(kvmem_qmem_head_alpha(NULL) == 0.0f);
    free_weights(&w);
}

static void apply_rejects_bad_input(void **state) {
    (void)state;
    weights w;
    make_weights(&w, 8, 6, 0);
    size_t size;
    unsigned char *img = write_st(&w, NULL, &size);
    kvmem_qmem_head *h = NULL;
    assert_ok(kvmem_qmem_head_load_buffer(img, size, &h));
    request r;
    make_request(&r, 2, 8, 10, 7);
    float s[10];
    for (int i = 0; i < 10; i++) s[i] = -3.0f;
    assert_status(kvmem_qmem_head_apply(NULL, &r.spec, r.mem, &r.kt, r.rule, 0, 1, s), KVMEM_ERR_INVALID_ARG, "head is NULL");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, NULL, &r.kt, r.rule, 0, 1, s), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, NULL, 0, 1, s), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, r.rule, 0, 1, NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, r.rule, 3, 3, s), KVMEM_ERR_INVALID_ARG, "span");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, r.mem, &r.kt, r.rule, 5, 11, s), KVMEM_ERR_INVALID_ARG, "span");
    assert_status(kvmem_qmem_head_apply(h, &r.spec, r.mem, NULL, r.rule, 0, 1, s), KVMEM_ERR_INVALID_ARG, "K is NULL");
    kvmem_model_spec other = tu_spec(2, 16);
    int64_t shape[4] = {2, 5, 2, 16};
    float *k16 = calloc(2 * 5 * 2 * 16, 4);
    kvmem_tensor kt16;
    assert_ok(kvmem_tensor_init(&kt16, k16, KVMEM_F32, 4, shape));
    assert_status(kvmem_qmem_head_apply(h, &other, r.mem, &kt16, r.rule, 0, 1, s), KVMEM_ERR_MISMATCH, "trained for 8");
    for (int i = 0; i < 10; i++) assert_true(s[i] == -3.0f);
    free(k16);
    free(img);
    free_request(&r);
    kvmem_qmem_head_free(h);
    free_weights(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(zero_output_weights_reproduce_the_rule_exactly),
        cmocka_unit_test(forward_matches_reference),
        cmocka_unit_test(strict_reader_rejects_bad_files),
        cmocka_unit_test(apply_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Prefix matching (against an independent code-point reference), truncation
 * (against an agent built directly with the kept tokens) and batch
 * merge/extract (against kvmem_agent_read). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static kvmem_pool *make_pool(kvmem_context *ctx, int32_t L, int32_t D, kvmem_dtype dt, int32_t bs) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = bs;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

/* Append tokens of `text` split at offs[0..T) (KV from rng, small L/D). */
static void append_text(kvmem_agent *a, int32_t L, int32_t D, const char *text, size_t len, const int32_t *offs, int32_t T,
                        uint64_t seed, float *keep_k, float *keep_v) {
    size_t n = (size_t)L * (size_t)T * 2 * (size_t)D;
    float *k = keep_k ? keep_k : malloc(n * 4 + 4), *v = keep_v ? keep_v : malloc(n * 4 + 4);
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, 2, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.text = text;
    ap.text_len = len;
    ap.token_text_offsets = offs;
    assert_ok(kvmem_agent_append(a, &tk, &tv, &ap));
    if (!keep_k) free(k);
    if (!keep_v) free(v);
}

/* ---- an independent reference: compare code points, not bytes ---- */

static size_t cp_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4; }

static size_t ref_common(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0;
    for (;;) {
        if (i >= na || i >= nb) return i;
        size_t ka = cp_len((unsigned char)a[i]), kb = cp_len((unsigned char)b[i]);
        if (ka != kb || i + ka > na || i + kb > nb || memcmp(a + i, b + i, ka) != 0) return i;
        i += ka;
    }
}

static void check_against_reference(kvmem_agent *a, const char *stored, size_t ns, const int32_t *offs, int32_t T,
                                    const char *nt, size_t nn) {
    kvmem_prefix_result r;
    assert_ok(kvmem_prefix_match(a, nt, nn, NULL, &r));
    size_t c = ref_common(stored, ns, nt, nn);
    assert_int_equal(r.common_bytes, c);
    if (c == ns && c == nn) {
        assert_int_equal(r.kind, KVMEM_PREFIX_EXACT);
        assert_int_equal(r.reuse_tokens, T - 1);
        assert_int_equal(r.process_from, (size_t)offs[T - 1]);
    } else if (c == ns) {
        assert_int_equal(r.kind, KVMEM_PREFIX_EXTEND);
        assert_int_equal(r.reuse_tokens, T);
        assert_int_equal(r.process_from, ns);
    } else {
        assert_int_equal(r.kind, KVMEM_PREFIX_DIVERGE);
        int64_t want = 0;
        if (c > 0 && (double)c >= 0.8 * (double)ns)
            while (want < T && (size_t)(want + 1 < T ? offs[want + 1] : (int32_t)ns) <= c) want++;
        assert_int_equal(r.reuse_tokens, want);
        size_t from = want == 0 ? 0 : want < T ? (size_t)offs[want] : ns;
        assert_int_equal(r.process_from, from);
        assert_true(r.process_from <= c);
    }
}

static void prefix_cases_by_hand(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 1, 8, KVMEM_F16, 4);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "p", &a));
    const char *s = "The quick brown fox jumps over the lazy dog.";
    int32_t offs[] = {0, 3, 9, 15, 19, 25, 30, 34, 39}; /* word tokens " quick" ... " dog." */
    append_text(a, 1, 8, s, strlen(s), offs, 9, 1, NULL, NULL);
    kvmem_prefix_result r;
    assert_ok(kvmem_prefix_match(a, s, strlen(s), NULL, &r));
    assert_int_equal(r.kind, KVMEM_PREFIX_EXACT);
    assert_int_equal(r.reuse_tokens, 8); /* the last token is re-run */
    assert_int_equal(r.process_from, 39);
    const char *ext = "The quick brown fox jumps over the lazy dog. And then?";
    assert_ok(kvmem_prefix_match(a, ext, strlen(ext), NULL, &r));
    assert_int_equal(r.kind, KVMEM_PREFIX_EXTEND);
    assert_int_equal(r.reuse_tokens, 9);
    assert_int_equal(r.process_from, 44);
    const char *div = "The quick brown fox jumps over the lazy cat.";
    assert_ok(kvmem_prefix_match(a, div, strlen(div), NULL, &r));
    assert_int_equal(r.kind, KVMEM_PREFIX_DIVERGE);
    assert_int_equal(r.common_bytes, 40);
    assert_int_equal(r.reuse_tokens, 8); /* " dog." is not whole inside "...lazy " */
    assert_int_equal(r.process_from, 39);
    const char *early = "The quick brown cat jumps over the lazy dog.";
    assert_ok(kvmem_prefix_match(a, early, strlen(early), NULL, &r));
    assert_int_equal(r.kind, KVMEM_PREFIX_DIVERGE);
    assert_int_equal(r.reuse_tokens, 0); /* 16 of 44 bytes < 80% */
    kvmem_prefix_params pp = kvmem_prefix_default_params();
    pp.min_ratio = 0.3;
    assert_ok(kvmem_prefix_match(a, early, strlen(early), &pp, &r));
    assert_int_equal(r.reuse_tokens, 3);
    /* bad input changes nothing and says why */
    assert_status(kvmem_prefix_match(a, NULL, 3, NULL, &r), KVMEM_ERR_INVALID_ARG, "NULL");
    assert_status(kvmem_prefix_match(a, s, 3, NULL, NULL), KVMEM_ERR_INVALID_ARG, "out is NULL");
    pp.min_ratio = 1.5;
    assert_status(kvmem_prefix_match(a, s, 3, &pp, &r), KVMEM_ERR_INVALID_ARG, "min_ratio");
    assert_status(kvmem_prefix_match(NULL, s, 3, NULL, &r), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    kvmem_agent *dead = a;
    kvmem_agent_close(a);
    assert_status(kvmem_prefix_match(dead, s, 3, NULL, &r), KVMEM_ERR_CLOSED, "closed");
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void multibyte_character_at_the_boundary(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 1, 8, KVMEM_F16, 4);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "u", &a));
    /* byte-level tokens split the final "é" (C3 A9) in two */
    const char *s = "un long texte en fran\xc3\xa7" "ais avec caf\xc3\xa9";
    size_t n = strlen(s);
    int32_t offs[] = {0, 2, 7, 13, 16, 24, 29, 32, (int32_t)n - 2, (int32_t)n - 1};
    append_text(a, 1, 8, s, n, offs, 10, 2, NULL, NULL);
    /* "è" is C3 A8: the bytes share C3, the characters differ */
    const char *t = "un long texte en fran\xc3\xa7" "ais avec caf\xc3\xa8";
    kvmem_prefix_result r;
    assert_ok(kvmem_prefix_match(a, t, strlen(t), NULL, &r));
    assert_int_equal(r.kind, KVMEM_PREFIX_DIVERGE);
    assert_int_equal(r.common_bytes, n - 2); /* not n - 1: half a character is not common */
    assert_int_equal(r.reuse_tokens, 8);     /* up to "caf", without the C3 token */
    assert_int_equal(r.process_from, n - 2);
    check_against_reference(a, s, n, offs, 10, t, strlen(t));
    /* the new text stops inside the character */
    assert_ok(kvmem_prefix_match(a, t, n - 1, NULL, &r));
    assert_int_equal(r.common_bytes, n - 2);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void random_texts_match_the_reference(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    const char *alpha[] = {"a", "b", " ", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "z"};
    uint64_t rng = 42;
    for (int iter = 0; iter < 300; iter++) {
        kvmem_pool *p = make_pool(ctx, 1, 4, KVMEM_F16, 4);
        kvmem_agent *a;
        assert_ok(kvmem_agent_open(p, "r", &a));
        char s[400], t[800];
        size_t ns = 0;
        int nch = 5 + (int)(tu_next(&rng) % 60);
        for (int i = 0; i < nch; i++) {
            const char *c = alpha[tu_next(&rng) % 7];
            memcpy(s + ns, c, strlen(c));
            ns += strlen(c);
        }
        /* random byte-level tokenization, mid-character splits included */
        int32_t offs[400];
        int32_t T = 0;
        for (size_t i = 0; i < ns; i++)
            if (i == 0 || tu_next(&rng) % 3 == 0) offs[T++] = (int32_t)i;
        append_text(a, 1, 4, s, ns, offs, T, (uint64_t)iter, NULL, NULL);
        /* a random edit: keep a prefix, then append random characters */
        size_t keep = (size_t)(tu_next(&rng) % (ns + 1));
        memcpy(t, s, keep);
        size_t nt = keep;
        int extra = (int)(tu_next(&rng) % 6);
        for (int i = 0; i < extra; i++) {
            const char *c = alpha[tu_next(&rng) % 7];
            memcpy(t + nt, c, strlen(c));
            nt += strlen(c);
        }
        if (tu_next(&rng) % 4 == 0) { /* or the exact text / an extension */
            memcpy(t, s, ns);
            nt = ns + (tu_next(&rng) % 2 ? 0 : 1);
            t[ns] = 'q';
        }
        check_against_reference(a, s, ns, offs, T, t, nt);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
    }
    kvmem_context_free(ctx);
}

/* ---- truncate ---- */

static void read_all(kvmem_agent *a, int32_t L, int32_t D, int64_t first, int64_t T, float *k, float *v) {
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, 2, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_agent_read(a, first, T, &tk, &tv));
}

static void truncate_equals_building_the_kept_tokens(void **state) {
    (void)state;
    const int32_t L = 2, D = 16, T = 37;
    kvmem_context *ctx = tu_context(2);
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_Q4};
    const int64_t cuts[] = {20, 16, 34, 0, 36, 1};
    char text[64];
    int32_t offs[37];
    for (int i = 0; i < T; i++) text[i] = (char)('a' + i % 26), offs[i] = i;
    for (int di = 0; di < 2; di++)
        for (size_t ci = 0; ci < sizeof cuts / sizeof *cuts; ci++) {
            int64_t n = cuts[ci];
            kvmem_pool *p = make_pool(ctx, L, D, dts[di], 16);
            kvmem_agent *a;
            assert_ok(kvmem_agent_open(p, "t", &a));
            size_t ne = (size_t)L * T * 2 * D;
            float *k = malloc(ne * 4), *v = malloc(ne * 4), *k0 = malloc(ne * 4), *v0 = malloc(ne * 4);
            float *k1 = malloc(ne * 4), *v1 = malloc(ne * 4);
            append_text(a, L, D, text, (size_t)T, offs, T, 9, k, v);
            read_all(a, L, D, 0, T, k0, v0);
            assert_ok(kvmem_agent_truncate(a, n));
            kvmem_agent_info info;
            assert_ok(kvmem_agent_get_info(a, &info));
            assert_int_equal(info.n_tokens, n);
            assert_int_equal(info.n_sealed, n / 16 + (dts[di] == KVMEM_F32 ? 0 : 0));
            assert_int_equal(info.text_bytes, (uint64_t)n); /* cut at token n's offset */
            read_all(a, L, D, 0, n, k1, v1);
            /* the kept tokens read back as before the cut (re-opened rows decoded once) */
            for (int32_t l = 0; l < L; l++)
                assert_memory_equal(k1 + (size_t)l * (size_t)n * 2 * D, k0 + (size_t)l * T * 2 * D, (size_t)n * 2 * D * 4);
            kvmem_pool_info pi;
            assert_ok(kvmem_pool_get_info(p, &pi));
            assert_int_equal(pi.used_bytes, info.bytes);
            if (dts[di] == KVMEM_F32) {
                /* appending the rest again gives the same agent as never cutting */
                size_t rest = (size_t)(T - n);
                float *rk = malloc(rest * (size_t)L * 2 * D * 4 + 4), *rv = malloc(rest * (size_t)L * 2 * D * 4 + 4);
                for (int32_t l = 0; l < L; l++) {
                    memcpy(rk + (size_t)l * rest * 2 * D, k + ((size_t)l * T + (size_t)n) * 2 * D, rest * 2 * D * 4);
                    memcpy(rv + (size_t)l * rest * 2 * D, v + ((size_t)l * T + (size_t)n) * 2 * D, rest * 2 * D * 4);
                }
                kvmem_tensor tk, tv;
                int64_t shape[4] = {L, (int64_t)rest, 2, D};
                assert_ok(kvmem_tensor_init(&tk, rk, KVMEM_F32, 4, shape));
                assert_ok(kvmem_tensor_init(&tv, rv, KVMEM_F32, 4, shape));
                assert_ok(kvmem_agent_append(a, &tk, &tv, NULL));
                read_all(a, L, D, 0, T, k1, v1);
                assert_memory_equal(k1, k0, ne * 4);
                assert_memory_equal(v1, v0, ne * 4);
                float mn[2 * 2 * 16], mx[2 * 2 * 16];
                assert_ok(kvmem_agent_block_aabb(a, 1, mn, mx));
                for (int32_t d = 0; d < D; d++) {
                    float lo = INFINITY;
                    for (int r = 16; r < 32; r++) lo = fminf(lo, k[((size_t)r * 2) * D + (size_t)d]);
                    assert_true(mn[d] == lo);
                }
                free(rk), free(rv);
            }
            kvmem_agent_close(a);
            kvmem_pool_free(p);
            free(k), free(v), free(k0), free(v0), free(k1), free(v1);
        }
    kvmem_context_free(ctx);
}

static void truncate_refuses_bad_counts(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 1, 8, KVMEM_F16, 4);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "t", &a));
    int32_t offs[6] = {0, 1, 2, 3, 4, 5};
    append_text(a, 1, 8, "abcdef", 6, offs, 6, 1, NULL, NULL);
    assert_status(kvmem_agent_truncate(a, -1), KVMEM_ERR_INVALID_ARG, "outside [0, 6]");
    assert_status(kvmem_agent_truncate(a, 7), KVMEM_ERR_INVALID_ARG, "outside [0, 6]");
    assert_status(kvmem_agent_truncate(NULL, 1), KVMEM_ERR_INVALID_ARG, "NULL");
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 6);
    assert_ok(kvmem_agent_truncate(a, 6)); /* a no-op */
    kvmem_agent *dead = a;
    kvmem_agent_close(a);
    assert_status(kvmem_agent_truncate(dead, 1), KVMEM_ERR_CLOSED, "closed");
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* ---- batch ---- */

static void merge_left_pads_and_extract_takes_rows_back(void **state) {
    (void)state;
    const int32_t L = 2, D = 64, H = 2;
    kvmem_context *ctx = tu_context(2);
    const kvmem_dtype dts[] = {KVMEM_F16, KVMEM_Q4};
    for (int di = 0; di < 2; di++) {
        kvmem_pool *p = make_pool(ctx, L, D, dts[di], 8);
        kvmem_agent *ag[3];
        const int32_t lens[3] = {5, 20, 13};
        const char *ids[3] = {"b0", "b1", "b2"};
        for (int b = 0; b < 3; b++) {
            assert_ok(kvmem_agent_open(p, ids[b], &ag[b]));
            append_text(ag[b], L, D, NULL, 0, NULL, lens[b], 30 + (uint64_t)b, NULL, NULL);
        }
        const int64_t max_len = 24;
        size_t nb = 3 * (size_t)H * max_len * D;
        float *bk = malloc(nb * 4), *bv = malloc(nb * 4);
        for (size_t i = 0; i < nb; i++) bk[i] = bv[i] = NAN; /* padding must be written */
        kvmem_tensor tk, tv;
        int64_t shape[4] = {3, H, max_len, D};
        assert_ok(kvmem_tensor_init(&tk, bk, KVMEM_F32, 4, shape));
        assert_ok(kvmem_tensor_init(&tv, bv, KVMEM_F32, 4, shape));
        int64_t got[3];
        assert_ok(kvmem_batch_merge(ag, 3, 1, &tk, &tv, got));
        for (int b = 0; b < 3; b++) {
            assert_int_equal(got[b], lens[b]);
            size_t ne = (size_t)L * (size_t)lens[b] * H * D;
            float *k = malloc(ne * 4), *v = malloc(ne * 4);
            read_all(ag[b], L, D, 0, lens[b], k, v);
            for (int32_t h = 0; h < H; h++)
                for (int64_t pos = 0; pos < max_len; pos++)
                    for (int32_t d = 0; d < D; d++) {
                        size_t at = (((size_t)b * H + (size_t)h) * max_len + (size_t)pos) * D + (size_t)d;
                        int64_t t = pos - (max_len - lens[b]);
                        float ek = t < 0 ? 0.0f : k[(((size_t)1 * lens[b] + (size_t)t) * H + (size_t)h) * D + (size_t)d];
                        float ev = t < 0 ? 0.0f : v[(((size_t)1 * lens[b] + (size_t)t) * H + (size_t)h) * D + (size_t)d];
                        assert_true(bk[at] == ek && bv[at] == ev);
                    }
            /* extract tokens [3, 3 + n) of the row back, as F16 */
            int64_t n = lens[b] - 3;
            uint16_t *out = malloc((size_t)n * H * D * 2);
            kvmem_tensor to;
            int64_t oshape[3] = {n, H, D};
            assert_ok(kvmem_tensor_init(&to, out, KVMEM_F16, 3, oshape));
            assert_ok(kvmem_batch_extract(&tk, b, lens[b], 3, n, &to));
            float *back = malloc((size_t)n * H * D * 4);
            kvmem_tensor tb;
            assert_ok(kvmem_tensor_init(&tb, back, KVMEM_F32, 3, oshape));
            for (int64_t i = 0; i < n * H * D; i++) { /* f16 -> f32 by hand */
                uint16_t hb = out[i];
                int e = (hb >> 10) & 31, m = hb & 1023;
                float f = e ? ldexpf((float)(m | 1024), e - 25) : ldexpf((float)m, -24);
                back[i] = (hb & 0x8000) ? -f : f;
            }
            for (int64_t t = 0; t < n; t++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t d = 0; d < D; d++) {
                        float want = k[(((size_t)lens[b] + (size_t)(t + 3)) * H + (size_t)h) * D + (size_t)d];
                        assert_true(fabsf(back[((size_t)t * H + (size_t)h) * D + (size_t)d] - want) <= fabsf(want) * 0x1p-11f + 1e-7f);
                    }
            free(out), free(back), free(k), free(v);
        }
        /* bad input */
        kvmem_tensor small = tk;
        small.shape[2] = 19;
        assert_status(kvmem_batch_merge(ag, 3, 1, &small, NULL, got), KVMEM_ERR_INVALID_ARG, "shorter than the longest");
        assert_status(kvmem_batch_merge(ag, 3, 2, &tk, NULL, got), KVMEM_ERR_INVALID_ARG, "layer 2");
        assert_status(kvmem_batch_merge(ag, 0, 1, &tk, NULL, got), KVMEM_ERR_INVALID_ARG, "at least 1");
        assert_status(kvmem_batch_merge(ag, 3, 1, NULL, NULL, got), KVMEM_ERR_INVALID_ARG, "both NULL");
        assert_status(kvmem_batch_merge(ag, 3, 1, &tk, NULL, NULL), KVMEM_ERR_INVALID_ARG, "lengths is NULL");
        kvmem_agent *dup[2] = {ag[0], ag[0]};
        assert_status(kvmem_batch_merge(dup, 2, 1, &tk, NULL, got), KVMEM_ERR_INVALID_ARG, "twice");
        kvmem_tensor wrong = tk;
        wrong.shape[0] = 2;
        assert_status(kvmem_batch_merge(ag, 3, 1, &wrong, NULL, got), KVMEM_ERR_INVALID_ARG, "does not match");
        float o[64];
        kvmem_tensor to;
        int64_t oshape[3] = {1, H, D};
        assert_ok(kvmem_tensor_init(&to, o, KVMEM_F32, 3, oshape));
        assert_status(kvmem_batch_extract(&tk, 3, 5, 0, 1, &to), KVMEM_ERR_INVALID_ARG, "row 3");
        assert_status(kvmem_batch_extract(&tk, 0, 25, 0, 1, &to), KVMEM_ERR_INVALID_ARG, "length 25");
        assert_status(kvmem_batch_extract(&tk, 0, 5, 5, 1, &to), KVMEM_ERR_INVALID_ARG, "outside");
        /* first + n beyond int64: refused, and the message forms no such sum (UBSan) */
        assert_status(kvmem_batch_extract(&tk, 0, 5, 1, INT64_MAX, &to), KVMEM_ERR_INVALID_ARG, "outside");
        assert_status(kvmem_batch_extract(NULL, 0, 5, 0, 1, &to), KVMEM_ERR_INVALID_ARG, "NULL");
        kvmem_agent *dead = ag[2];
        kvmem_agent_close(ag[2]);
        assert_status(kvmem_batch_merge(ag, 3, 1, &tk, NULL, got), KVMEM_ERR_CLOSED, "closed");
        kvmem_agent_close(ag[0]);
        kvmem_agent_close(ag[1]);
        (void)dead;
        kvmem_pool_free(p);
        free(bk), free(bv);
    }
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prefix_cases_by_hand),
        cmocka_unit_test(multibyte_character_at_the_boundary),
        cmocka_unit_test(random_texts_match_the_reference),
        cmocka_unit_test(truncate_equals_building_the_kept_tokens),
        cmocka_unit_test(truncate_refuses_bad_counts),
        cmocka_unit_test(merge_left_pads_and_extract_takes_rows_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Format version 1 files still load. This test writes them the old way
 * itself, from the same f32 KV it appends to a reference agent: per layer
 * and KV head tensors (layer_{L}_k, or layer_{L}_k_weights|scales|biases
 * [H][T][...] with each block's sections encoded by the scalar reference
 * quantizer), f32 AABBs per layer (layer_{L}_aabb_min|max [blocks][H][D]),
 * f32 tails, and the checksum. Loaded, the agent must read back exactly the
 * reference's KV, and hold the boxes of the pool's element type: f16 rounded
 * outward from the file's f32 min/max. It re-saves as version 2 and loads
 * again unchanged; a version 1 box beyond f16's range is refused. */
#include "testutil.h"
#include "internal.h"
#include "cpu/half.h"
#include "quant/quant.h"
#include "cpu/quant_codec.h"
#include "cpu/kernels.h"
#include "format/hash.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define L 2
#define H 2
#define D 64
#define BS 16

typedef struct buf {
    unsigned char *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 4096;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void putf(buf *b, const char *fmt, ...) {
    char tmp[4096];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    assert_true(k >= 0 && (size_t)k < sizeof tmp);
    put(b, tmp, (size_t)k);
}

/* The history: T tokens of f32 K and V, [L][T][H][D]. */
typedef struct hist {
    int32_t T, n_blocks, block_n[8], tail;
    float *k, *v;
} hist;

static float kv_at(const float *x, int32_t T, int32_t l, int32_t t, int32_t h, int32_t d) {
    return x[(((size_t)l * (size_t)T + (size_t)t) * H + (size_t)h) * D + (size_t)d];
}

/* A tensor's header entry and its bytes in the data section. */
static void tensor(buf *hdr, buf *data, const char *name, const char *dtype, const char *shape, const void *bytes,
                   size_t n) {
    putf(hdr, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%zu,%zu]}", name, dtype, shape, data->n,
         data->n + n);
    put(data, bytes, n);
}

/* The section [n rows of D] of (which, l, h) of the block starting at token t0, f32. */
static void rows_of(const hist *s, int which, int32_t l, int32_t h, int32_t t0, int32_t n, float *out) {
    for (int32_t r = 0; r < n; r++)
        for (int32_t d = 0; d < D; d++) out[r * D + d] = kv_at(which ? s->v : s->k, s->T, l, t0 + r, h, d);
}

/* Write the history as a version 1 file. spec_str: the pool's canonical
 * spec string. aabb_scale multiplies the boxes written (1: the true ones). */
static void write_v1(const char *path, const hist *s, kvmem_dtype dt, const char *spec_str, float aabb_scale) {
    buf hdr = {0}, data = {0};
    const kvm_quant_kernels *q = (&kvm_quant_scalar);
    const int32_t ts = s->T - s->tail;
    const size_t W = (D + 7) / 8, G4 = (D + 63) / 64, G8 = (D + 31) / 32;
    char shape[64];
    float *rows = malloc((size_t)BS * D * sizeof(float));
    for (int32_t l = 0; l < L; l++)
        for (int which = 0; which < 2; which++) {
            const char kv = which ? 'v' : 'k';
            char name[64];
            if (dt == KVMEM_F16) {
                buf t = {0};
                for (int32_t h = 0; h < H; h++)
                    for (int32_t tok = 0; tok < ts; tok++)
                        for (int32_t d = 0; d < D; d++) {
                            uint16_t x = kvm_f32_to_f16(kv_at(which ? s->v : s->k, s->T, l, tok, h, d));
                            put(&t, &x, 2);
                        }
                snprintf(name, sizeof name, "layer_%d_%c", l, kv);
                snprintf(shape, sizeof shape, "%d,%d,%d", H, ts, D);
                tensor(&hdr, &data, name, "F16", shape, t.p, t.n);
                free(t.p);
            } else { /* Q4 or Q4 KIVI: [H][T][W] words, [H][T][G] (KIVI keys: [H][blocks][D]) scales and biases */
                const int chan = dt == KVMEM_Q4_KIVI && which == 0;
                buf tw = {0}, tsc = {0}, tb = {0};
                for (int32_t h = 0; h < H; h++)
                    for (int32_t b = 0, t0 = 0; b < s->n_blocks; t0 += s->block_n[b], b++) {
                        const int32_t n = s->block_n[b];
                        uint32_t words[BS * ((D + 7) / 8)];
                        uint16_t sc[BS * D], bi[BS * D];
                        rows_of(s, which, l, h, t0, n, rows);
                        if (chan) {
                            float mn[D], mx[D];
                            for (int32_t d = 0; d < D; d++) {
                                mn[d] = mx[d] = rows[d];
                                for (int32_t r = 1; r < n; r++) mn[d] = fminf(mn[d], rows[r * D + d]), mx[d] = fmaxf(mx[d], rows[r * D + d]);
                            }
                            q->q4c_quant(rows, (size_t)n, D, mn, mx, words, sc, bi);
                            put(&tsc, sc, D * 2);
                            put(&tb, bi, D * 2);
                        } else {
                            q->q4_quant(rows, (size_t)n, D, words, sc, bi);
                            put(&tsc, sc, (size_t)n * G4 * 2);
                            put(&tb, bi, (size_t)n * G4 * 2);
                        }
                        put(&tw, words, (size_t)n * W * 4);
                    }
                snprintf(name, sizeof name, "layer_%d_%c_weights", l, kv);
                snprintf(shape, sizeof shape, "%d,%d,%zu", H, ts, W);
                tensor(&hdr, &data, name, "U32", shape, tw.p, tw.n);
                if (chan) snprintf(shape, sizeof shape, "%d,%d,%d", H, s->n_blocks, D);
                else snprintf(shape, sizeof shape, "%d,%d,%zu", H, ts, G4);
                snprintf(name, sizeof name, "layer_%d_%c_scales", l, kv);
                tensor(&hdr, &data, name, "F16", shape, tsc.p, tsc.n);
                snprintf(name, sizeof name, "layer_%d_%c_biases", l, kv);
                tensor(&hdr, &data, name, "F16", shape, tb.p, tb.n);
                free(tw.p), free(tsc.p), free(tb.p);
            }
            if (s->tail) {
                buf t = {0};
                for (int32_t h = 0; h < H; h++)
                    for (int32_t tok = ts; tok < s->T; tok++)
                        for (int32_t d = 0; d < D; d++) {
                            float x = kv_at(which ? s->v : s->k, s->T, l, tok, h, d);
                            put(&t, &x, 4);
                        }
                snprintf(name, sizeof name, "layer_%d_%c_tail", l, kv);
                snprintf(shape, sizeof shape, "%d,%d,%d", H, s->tail, D);
                tensor(&hdr, &data, name, "F32", shape, t.p, t.n);
                free(t.p);
            }
            (void)G8;
        }
    for (int32_t l = 0; l < L; l++)
        for (int mx = 0; mx < 2; mx++) {
            buf t = {0};
            for (int32_t b = 0, t0 = 0; b < s->n_blocks; t0 += s->block_n[b], b++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t d = 0; d < D; d++) {
                        float e = kv_at(s->k, s->T, l, t0, h, d);
                        for (int32_t r = 1; r < s->block_n[b]; r++) {
                            float x = kv_at(s->k, s->T, l, t0 + r, h, d);
                            e = mx ? fmaxf(e, x) : fminf(e, x);
                        }
                        e *= aabb_scale;
                        put(&t, &e, 4);
                    }
            char name[64];
            snprintf(name, sizeof name, "layer_%d_aabb_%s", l, mx ? "max" : "min");
            snprintf(shape, sizeof shape, "%d,%d,%d", s->n_blocks, H, D);
            tensor(&hdr, &data, name, "F32", shape, t.p, t.n);
            free(t.p);
        }
    free(rows);
    /* metadata, the checksum over the data section's 1 MiB chunks */
    kvm_xxh64_state xs;
    kvm_xxh64_init(&xs, 0);
    for (size_t c = 0; c < data.n; c += (size_t)1 << 20) {
        uint64_t dg = kvm_acc64(data.p + c, data.n - c < ((size_t)1 << 20) ? data.n - c : ((size_t)1 << 20));
        unsigned char le[8];
        for (int i = 0; i < 8; i++) le[i] = (unsigned char)(dg >> (8 * i));
        kvm_xxh64_update(&xs, le, 8);
    }
    buf h = {0};
    putf(&h, "{\"__metadata__\":{\"format\":\"kvmem-agent\",\"format_version\":\"1\",\"agent_id\":\"old\",");
    putf(&h, "\"model_id\":\"%s\",\"model_spec\":\"%s\",\"storage_dtype\":\"%s\",\"block_size\":\"%d\",", "test-model",
         spec_str, kvmem_dtype_name(dt), BS);
    putf(&h, "\"n_tokens\":\"%d\",\"block_tokens\":\"", s->T);
    for (int32_t b = 0; b < s->n_blocks; b++) putf(&h, b ? ",%d" : "%d", s->block_n[b]);
    putf(&h, "\",\"token_ids\":\"");
    for (int32_t t = 0; t < s->T; t++) putf(&h, t ? ",%d" : "%d", 7 * t);
    putf(&h, "\",\"token_text_offsets\":\"");
    for (int32_t t = 0; t < s->T; t++) putf(&h, t ? ",-1" : "-1");
    putf(&h, "\",\"text\":\"old text\",\"checksum\":\"acc64-1m:%016llx\"}", (unsigned long long)kvm_xxh64_final(&xs));
    put(&h, hdr.p, hdr.n);
    putf(&h, "}");
    while (h.n % 8) putf(&h, " ");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(h.p, 1, h.n, f), h.n);
    assert_int_equal(fwrite(data.p, 1, data.n, f), data.n);
    assert_int_equal(fclose(f), 0);
    free(h.p), free(hdr.p), free(data.p);
}

static kvmem_pool *make_pool(kvmem_context *ctx, kvmem_dtype dt) {
    kvmem_model_spec spec = tu_spec(L, D);
    snprintf(spec.model_id, sizeof spec.model_id, "test-model");
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = BS;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

/* The pool's canonical spec string, as its own (version 2) files carry it. */
static void spec_string(kvmem_pool *p, const char *dir, char *out, size_t cap) {
    kvmem_agent *a;
    char path[512];
    snprintf(path, sizeof path, "%s/spec.safetensors", dir);
    assert_ok(kvmem_agent_open(p, "spec", &a));
    assert_ok(kvmem_agent_save(a, path));
    kvmem_agent_close(a);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char head[8192];
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[n] = '\0';
    const char *at = strstr(head + 8, "\"model_spec\":\"");
    assert_non_null(at);
    at += 14;
    const char *end = strchr(at, '"');
    assert_non_null(end);
    assert_true((size_t)(end - at) < cap);
    memcpy(out, at, (size_t)(end - at));
    out[end - at] = '\0';
    assert_ok(kvmem_pool_remove_agent(p, "spec"));
    unlink(path);
}

static void read_all(kvmem_agent *a, int32_t T, float *k, float *v) {
    kvmem_tensor tk, tv;
    int64_t sh[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, sh));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, sh));
    assert_ok(kvmem_agent_read(a, 0, T, &tk, &tv));
}

static void version_1_files_load_with_their_boxes_rounded_outward(void **state) {
    (void)state;
    char dir[] = "/tmp/kvmem-v1-XXXXXX";
    assert_non_null(mkdtemp(dir));
    kvmem_context *ctx = tu_context(2);
    const kvmem_dtype dts[3] = {KVMEM_F16, KVMEM_Q4, KVMEM_Q4_KIVI};
    for (int di = 0; di < 3; di++) {
        kvmem_pool *pool = make_pool(ctx, dts[di]);
        char spec_str[2048];
        spec_string(pool, dir, spec_str, sizeof spec_str);
        /* 37 tokens, flushed (blocks 16, 16, 5), then 3 more in the tail */
        hist s = {40, 3, {16, 16, 5}, 3, NULL, NULL};
        size_t n = (size_t)L * 40 * H * D;
        s.k = malloc(n * 4), s.v = malloc(n * 4);
        uint64_t rng = 5 + (uint64_t)di;
        tu_fill_kv(s.k, n, &rng);
        tu_fill_kv(s.v, n, &rng);
        /* the reference agent: the same KV appended through the API */
        kvmem_agent *ref, *old;
        assert_ok(kvmem_agent_open(pool, "ref", &ref));
        float *part = malloc(n * 4), *pv = malloc(n * 4);
        for (int pass = 0; pass < 2; pass++) {
            int32_t t0 = pass ? 37 : 0, cnt = pass ? 3 : 37;
            for (int32_t l = 0; l < L; l++)
                for (int32_t t = 0; t < cnt; t++)
                    for (int32_t h = 0; h < H; h++)
                        for (int32_t d = 0; d < D; d++) {
                            size_t at = (((size_t)l * (size_t)cnt + (size_t)t) * H + (size_t)h) * D + (size_t)d;
                            part[at] = kv_at(s.k, 40, l, t0 + t, h, d);
                            pv[at] = kv_at(s.v, 40, l, t0 + t, h, d);
                        }
            kvmem_tensor tk, tv;
            int64_t sh[4] = {L, cnt, H, D};
            assert_ok(kvmem_tensor_init(&tk, part, KVMEM_F32, 4, sh));
            assert_ok(kvmem_tensor_init(&tv, pv, KVMEM_F32, 4, sh));
            assert_ok(kvmem_agent_append(ref, &tk, &tv, NULL));
            if (!pass) assert_ok(kvmem_agent_flush(ref));
        }
        char path[512], path2[512];
        snprintf(path, sizeof path, "%s/old.safetensors", dir);
        snprintf(path2, sizeof path2, "%s/resaved.safetensors", dir);
        write_v1(path, &s, dts[di], spec_str, 1.0f);
        assert_ok(kvmem_agent_open(pool, "old", &old));
        assert_ok(kvmem_agent_load(old, path));
        kvmem_agent_info info;
        assert_ok(kvmem_agent_get_info(old, &info));
        assert_int_equal(info.n_tokens, 40);
        assert_int_equal(info.n_sealed, 3);
        /* the same KV as the reference agent, bit for bit (the same codes) */
        float *k1 = malloc(n * 4), *v1 = malloc(n * 4), *k2 = malloc(n * 4), *v2 = malloc(n * 4);
        read_all(ref, 40, k1, v1);
        read_all(old, 40, k2, v2);
        assert_memory_equal(k1, k2, n * 4);
        assert_memory_equal(v1, v2, n * 4);
        int32_t ids[40];
        assert_ok(kvmem_agent_tokens(old, 0, 40, ids));
        for (int32_t t = 0; t < 40; t++) assert_int_equal(ids[t], 7 * t);
        /* boxes: the file's f32 min/max, rounded outward to f16 */
        float mn[L * H * D], mx[L * H * D];
        for (int32_t b = 0, t0 = 0; b < 3; t0 += s.block_n[b], b++) {
            assert_ok(kvmem_agent_block_aabb(old, b, mn, mx));
            for (int32_t l = 0; l < L; l++)
                for (int32_t h = 0; h < H; h++)
                    for (int32_t d = 0; d < D; d++) {
                        double lo = INFINITY, hi = -INFINITY;
                        for (int32_t r = 0; r < s.block_n[b]; r++) {
                            lo = fmin(lo, kv_at(s.k, 40, l, t0 + r, h, d));
                            hi = fmax(hi, kv_at(s.k, 40, l, t0 + r, h, d));
                        }
                        size_t o = ((size_t)l * H + (size_t)h) * D + (size_t)d;
                        assert_true(mn[o] == (float)tu_f16_below(lo) && mx[o] == (float)tu_f16_above(hi));
                    }
        }
        /* re-saved in the current format, it loads again unchanged */
        assert_ok(kvmem_agent_save(old, path2));
        kvmem_pool *pool2 = make_pool(ctx, dts[di]);
        kvmem_agent *again;
        assert_ok(kvmem_agent_open(pool2, "old", &again));
        assert_ok(kvmem_agent_load(again, path2));
        read_all(again, 40, k1, v1);
        assert_memory_equal(k1, k2, n * 4);
        assert_memory_equal(v1, v2, n * 4);
        kvmem_agent_close(again);
        kvmem_pool_free(pool2);
        /* a version 1 box beyond f16's range cannot become an f16 box: refused,
         * the agent unchanged */
        write_v1(path, &s, dts[di], spec_str, 1e6f);
        assert_status(kvmem_agent_load(old, path), KVMEM_ERR_CORRUPT, "beyond f16's range");
        read_all(old, 40, k1, v1);
        assert_memory_equal(k1, k2, n * 4);
        kvmem_agent_close(ref);
        kvmem_agent_close(old);
        kvmem_pool_free(pool);
        free(s.k), free(s.v), free(part), free(pv), free(k1), free(v1), free(k2), free(v2);
        unlink(path);
        unlink(path2);
    }
    kvmem_context_free(ctx);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(version_1_files_load_with_their_boxes_rounded_outward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

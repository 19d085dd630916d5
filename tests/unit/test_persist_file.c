/* Agent files: round trips in every dtype, the strict loader against
 * truncated, garbled, oversized, overlapping, wrong-dtype and huge-shape
 * files, spec mismatches, isolation between agents, the store tier (LRU
 * spill and reload), the JSON reader and the checksum. */
#include "testutil.h"
#include "internal.h"
#include "cpu/kernels.h"
#include "format/hash.h"
#include "format/json.h"
#include "pool/pool.h" /* the spare block list: what a reload reuses */
#include "store/store.h" /* a gate in front of the store's writes */

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return tu_tmpdir_make(g_dir, sizeof g_dir, "test");
}

static int teardown(void **state) {
    (void)state;
    return tu_tmpdir_remove(g_dir);
}

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static kvmem_pool *make_pool(kvmem_context *ctx, int32_t L, int32_t D, kvmem_dtype dt, const char *store,
                             uint64_t cap, uint64_t budget) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = 8;
    pp.store_dir = store;
    pp.capacity_bytes = cap;
    pp.host_budget_bytes = budget;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

static const char *k_text = "Hello, world! caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 and more text";

/* Append T tokens (deterministic from seed) with ids, text and offsets. */
static kvmem_status append_tokens(kvmem_agent *a, int32_t L, int32_t D, int32_t T, uint64_t seed) {
    const int32_t H = 2;
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    int32_t *ids = malloc((size_t)T * 4), *offs = malloc((size_t)T * 4);
    size_t tl = strlen(k_text);
    for (int32_t i = 0; i < T; i++) {
        ids[i] = 1000 + i;
        offs[i] = (int32_t)((size_t)i * tl / (size_t)T);
    }
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = ids;
    ap.text = k_text;
    ap.text_len = tl;
    ap.token_text_offsets = offs;
    kvmem_status st = kvmem_agent_append(a, &tk, &tv, &ap);
    free(k), free(v), free(ids), free(offs);
    return st;
}

static void fill_agent(kvmem_agent *a, int32_t L, int32_t D, int32_t T, uint64_t seed) {
    assert_ok(append_tokens(a, L, D, T, seed));
}

/* Everything observable about an agent, read through the public API. */
typedef struct snap {
    kvmem_agent_info info;
    float *k, *v, *aabb;
    int32_t *ids;
    char *text;
    size_t text_len;
    kvmem_block_info blocks[64];
} snap;

static snap take(kvmem_agent *a, int32_t L, int32_t D) {
    snap s;
    memset(&s, 0, sizeof s);
    assert_ok(kvmem_agent_get_info(a, &s.info));
    int64_t T = s.info.n_tokens;
    size_t n = (size_t)L * (size_t)T * 2 * (size_t)D;
    s.k = malloc(n * 4 + 4);
    s.v = malloc(n * 4 + 4);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, 2, D};
    assert_ok(kvmem_tensor_init(&tk, s.k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, s.v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_agent_read(a, 0, T, &tk, &tv));
    size_t per = (size_t)L * 2 * (size_t)D;
    s.aabb = malloc(((size_t)s.info.n_sealed * 2 * per + 1) * 4);
    for (int32_t b = 0; b < s.info.n_sealed; b++)
        assert_ok(kvmem_agent_block_aabb(a, b, s.aabb + (size_t)b * 2 * per, s.aabb + (size_t)b * 2 * per + per));
    s.ids = malloc((size_t)T * 4 + 4);
    assert_ok(kvmem_agent_tokens(a, 0, T, s.ids));
    const char *t;
    assert_ok(kvmem_agent_text(a, &t, &s.text_len));
    s.text = malloc(s.text_len + 1);
    memcpy(s.text, t, s.text_len);
    for (int32_t b = 0; b < s.info.n_blocks && b < 64; b++) assert_ok(kvmem_agent_block_info(a, b, &s.blocks[b]));
    return s;
}

static void snap_equal(const snap *x, const snap *y, int32_t L, int32_t D) {
    assert_int_equal(x->info.n_tokens, y->info.n_tokens);
    assert_int_equal(x->info.n_blocks, y->info.n_blocks);
    assert_int_equal(x->info.n_sealed, y->info.n_sealed);
    assert_int_equal(x->info.bytes, y->info.bytes);
    size_t n = (size_t)L * (size_t)x->info.n_tokens * 2 * (size_t)D;
    assert_memory_equal(x->k, y->k, n * 4); /* bit-exact, whatever the dtype */
    assert_memory_equal(x->v, y->v, n * 4);
    assert_memory_equal(x->aabb, y->aabb, (size_t)x->info.n_sealed * 2 * (size_t)L * 2 * (size_t)D * 4);
    assert_memory_equal(x->ids, y->ids, (size_t)x->info.n_tokens * 4);
    assert_int_equal(x->text_len, y->text_len);
    assert_memory_equal(x->text, y->text, x->text_len);
    assert_memory_equal(x->blocks, y->blocks, sizeof x->blocks);
}

static void snap_free(snap *s) { free(s->k), free(s->v), free(s->aabb), free(s->ids), free(s->text); }

/* Fill, save, drop, load and compare bit for bit: 2 sealed blocks of 8, a
 * short sealed block, a tail. */
static void round_trip(kvmem_context *ctx, int32_t L, int32_t D, kvmem_dtype dt, uint64_t seed) {
    kvmem_pool *p = make_pool(ctx, L, D, dt, NULL, 0, 0);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "agent-1", &a));
    fill_agent(a, L, D, 21, 5 + seed); /* 2 sealed blocks of 8 + tail of 5 */
    assert_ok(kvmem_agent_flush(a));   /* a short sealed block */
    fill_agent(a, L, D, 3, 50 + seed); /* and a tail again */
    snap before = take(a, L, D);
    char path[300];
    path_of(path, sizeof path, "agent-1.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(p, "agent-1"));
    assert_ok(kvmem_agent_open(p, "agent-1", &a));
    assert_ok(kvmem_agent_load(a, path));
    snap after = take(a, L, D);
    snap_equal(&before, &after, L, D);
    /* the pool accounts exactly what the agent holds */
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.used_bytes, after.info.bytes);
    /* and the agent keeps working: append seals the reloaded tail */
    fill_agent(a, L, D, 9, 77);
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 33);
    snap_free(&before);
    snap_free(&after);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    unlink(path);
}

static void every_dtype_saves_and_loads_bit_exact(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    for (size_t t = 0; t < 6; t++) round_trip(ctx, 2, t % 2 ? 80 : 64, dts[t], t);
    kvmem_context_free(ctx);
}

/* Blocks of 2 MiB and more come from the huge-page allocator (2 MiB
 * aligned, advised onto THP): exactly 2 MiB (64 layers of 2 heads x 8
 * tokens x 256 f32), 2.5 MiB (80 layers: the advice covers only the
 * whole 2 MiB page), and 1.25 MiB of f16 (below: the plain allocator). */
static void large_blocks_save_and_load_bit_exact(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    round_trip(ctx, 64, 256, KVMEM_F32, 101);
    round_trip(ctx, 80, 256, KVMEM_F32, 102);
    round_trip(ctx, 80, 256, KVMEM_F16, 103);
    kvmem_context_free(ctx);
}

static void empty_agent_round_trips(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_Q4, NULL, 0, 0);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "empty", &a));
    char path[300];
    path_of(path, sizeof path, "empty.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    fill_agent(a, 1, 64, 3, 1);
    assert_ok(kvmem_agent_load(a, path)); /* back to empty */
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    assert_int_equal(info.n_tokens, 0);
    assert_int_equal(info.bytes, 0);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* ---- hostile files ---- */

typedef struct file {
    unsigned char *data;
    size_t size;
} file;

static file read_file(const char *path) {
    file f = {0};
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    f.size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f.data = malloc(f.size);
    assert_int_equal(fread(f.data, 1, f.size, fp), f.size);
    fclose(fp);
    return f;
}

static void write_bytes(const char *path, const void *d, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(d, 1, n, fp), n);
    fclose(fp);
}

/* A file with a replaced header (the data section kept). */
static void write_with_header(const char *path, const file *orig, const char *header) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | orig->data[i];
    size_t nh = strlen(header), data = orig->size - 8 - (size_t)hl;
    unsigned char *b = malloc(8 + nh + data);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)nh >> (8 * i));
    memcpy(b + 8, header, nh);
    memcpy(b + 8 + nh, orig->data + 8 + hl, data);
    write_bytes(path, b, 8 + nh + data);
    free(b);
}

static char *header_of(const file *f) {
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f->data[i];
    char *h = malloc((size_t)hl + 1);
    memcpy(h, f->data + 8, (size_t)hl);
    h[hl] = '\0';
    return h;
}

/* Replace the first occurrence of `from` after `after` in s (new string). */
static char *replace(const char *s, const char *after, const char *from, const char *to) {
    const char *a = after ? strstr(s, after) : s;
    assert_non_null(a);
    const char *at = strstr(a, from);
    assert_non_null(at);
    size_t n = strlen(s) - strlen(from) + strlen(to);
    char *r = malloc(n + 1);
    size_t pre = (size_t)(at - s);
    memcpy(r, s, pre);
    strcpy(r + pre, to);
    strcat(r, at + strlen(from));
    return r;
}

static void expect_refused(kvmem_agent *a, const char *path, kvmem_status code, const char *needle, const snap *before,
                           int32_t L, int32_t D) {
    kvmem_status st = kvmem_agent_load(a, path);
    if (st != code) fail_msg("loading %s: got %s (%s), expected %s", needle, kvmem_status_str(st), kvmem_last_error(), kvmem_status_str(code));
    kvm_test_assert_msg("kvmem_agent_load", needle);
    snap now = take(a, L, D); /* nothing changed */
    snap_equal(before, &now, L, D);
    snap_free(&now);
}

static void loader_refuses_hostile_files_with_the_right_code(void **state) {
    (void)state;
    const int32_t L = 2, D = 64;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_Q4, NULL, 0, 0);
    kvmem_agent *src, *a;
    assert_ok(kvmem_agent_open(p, "victim", &src));
    fill_agent(src, L, D, 19, 3);
    char good[300], bad[300];
    path_of(good, sizeof good, "good.safetensors");
    path_of(bad, sizeof bad, "bad.safetensors");
    assert_ok(kvmem_agent_save(src, good));
    kvmem_agent_close(src);
    assert_ok(kvmem_agent_open(p, "victim", &a));
    fill_agent(a, L, D, 4, 9); /* different current content, which must survive */
    snap before = take(a, L, D);
    file f = read_file(good);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | f.data[i];

    /* truncated: everywhere */
    size_t cuts[] = {0, 5, 8, 8 + (size_t)hl / 2, 8 + (size_t)hl, 8 + (size_t)hl + 100, f.size - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        write_bytes(bad, f.data, cuts[i]);
        kvmem_status st = kvmem_agent_load(a, bad);
        assert_true(st == (cuts[i] < 8 ? KVMEM_ERR_FORMAT : KVMEM_ERR_CORRUPT));
    }
    write_bytes(bad, f.data, f.size - 1);
    expect_refused(a, bad, KVMEM_ERR_CORRUPT, "truncated", &before, L, D);
    /* garbled JSON */
    unsigned char *g = malloc(f.size);
    memcpy(g, f.data, f.size);
    g[8] = 'x';
    write_bytes(bad, g, f.size);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "JSON header, byte 0", &before, L, D);
    /* a flipped data byte: the checksum */
    memcpy(g, f.data, f.size);
    g[f.size - 300] ^= 0x10;
    write_bytes(bad, g, f.size);
    expect_refused(a, bad, KVMEM_ERR_CORRUPT, "checksum", &before, L, D);
    /* oversized header length, and one past the end of the file */
    memcpy(g, f.data, f.size);
    g[5] = 0x01; /* 2^40 + hl */
    write_bytes(bad, g, f.size);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "header length", &before, L, D);
    memcpy(g, f.data, f.size);
    uint64_t past = f.size;
    for (int i = 0; i < 8; i++) g[i] = (unsigned char)(past >> (8 * i));
    write_bytes(bad, g, f.size);
    expect_refused(a, bad, KVMEM_ERR_CORRUPT, "past the end", &before, L, D);
    free(g);

    char *h = header_of(&f);
    /* overlapping offsets: k_scales starts inside v_weights */
    char *w = replace(h, "\"k_scales\"", "\"data_offsets\":[", "\"data_offsets\":[8,");
    char *w2 = replace(w, "\"k_scales\"", ",", ","); /* keep a valid second number */
    {
        /* rebuild: [8,X,Y] is not [b,e]; make it [8, 8 + bytes] instead */
        const char *at = strstr(strstr(h, "\"k_scales\""), "\"data_offsets\":[") + 16;
        long b0 = strtol(at, NULL, 10), e0 = strtol(strchr(at, ',') + 1, NULL, 10);
        char from[64], to[64];
        snprintf(from, sizeof from, "[%ld,%ld]", b0, e0);
        snprintf(to, sizeof to, "[%ld,%ld]", b0 - 8, e0 - 8);
        free(w);
        w = replace(h, "\"k_scales\"", from, to);
        write_with_header(bad, &f, w);
        expect_refused(a, bad, KVMEM_ERR_CORRUPT, "overlaps", &before, L, D);
    }
    free(w), free(w2);
    /* wrong dtype */
    w = replace(h, "\"v_weights\"", "\"dtype\":\"U32\"", "\"dtype\":\"F32\"");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "has dtype F32, expected U32", &before, L, D);
    free(w);
    /* huge shape */
    w = replace(h, "\"aabb\"", "\"shape\":[2,", "\"shape\":[99999999999999,");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "has shape", &before, L, D);
    free(w);
    w = replace(h, "\"n_tokens\":\"", "19", "2000000000");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_CORRUPT, "does not fit", &before, L, D);
    free(w);
    w = replace(h, "\"n_tokens\":\"", "19", "99999999999999999999");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "n_tokens", &before, L, D);
    free(w);
    /* an unexpected tensor, a missing one, a non-string metadata value */
    w = replace(h, "\"aabb\"", "\"aabb\"", "\"aabx\"");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "unexpected tensor 'aabx'", &before, L, D);
    free(w);
    w = replace(h, "\"format_version\":", "\"2\"", "2");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "format_version", &before, L, D);
    free(w);
    /* duplicate keys: two readers could disagree, so refused */
    w = replace(h, "{\"__metadata__\"", "{", "{\"layer_0_k_tail\":{},");
    write_with_header(bad, &f, w);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "duplicate member name", &before, L, D);
    free(w);
    /* a NaN in an AABB behind a valid checksum (a hostile writer, not a torn file) */
    {
        const char *at = strstr(strstr(h, "\"aabb\""), "\"data_offsets\":[") + 16;
        long b0 = strtol(at, NULL, 10);
        unsigned char *g2 = malloc(f.size);
        memcpy(g2, f.data, f.size);
        size_t data0 = 8 + (size_t)hl;
        const unsigned char nan16[2] = {0x00, 0x7e}; /* an f16 NaN */
        memcpy(g2 + data0 + (size_t)b0 + 8, nan16, 2);
        size_t data_n = f.size - data0;
        kvm_xxh64_state xs;
        kvm_xxh64_init(&xs, 0);
        for (size_t c = 0; c < data_n; c += (size_t)1 << 20) {
            uint64_t dg = kvm_acc64(g2 + data0 + c, data_n - c < ((size_t)1 << 20) ? data_n - c : ((size_t)1 << 20));
            unsigned char le[8];
            for (int i = 0; i < 8; i++) le[i] = (unsigned char)(dg >> (8 * i));
            kvm_xxh64_update(&xs, le, 8);
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)kvm_xxh64_final(&xs));
        char *cs = strstr((char *)g2 + 8, "acc64-1m:");
        assert_non_null(cs);
        memcpy(cs + 9, hex, 16);
        write_bytes(bad, g2, f.size);
        expect_refused(a, bad, KVMEM_ERR_CORRUPT, "AABBs hold", &before, L, D);
        free(g2);
    }
    /* not a safetensors file at all */
    write_bytes(bad, "hello world, this is text", 25);
    expect_refused(a, bad, KVMEM_ERR_FORMAT, "header length", &before, L, D);
    /* a directory, a missing file */
    expect_refused(a, g_dir, KVMEM_ERR_IO, "not a regular file", &before, L, D);
    path_of(bad, sizeof bad, "missing.safetensors");
    expect_refused(a, bad, KVMEM_ERR_NOT_FOUND, "no file", &before, L, D);
    free(h);
    free(f.data);
    snap_free(&before);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void spec_dtype_and_agent_mismatches_are_refused(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 2, 64, KVMEM_F16, NULL, 0, 0);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "alice", &a));
    fill_agent(a, 2, 64, 10, 1);
    char path[300];
    path_of(path, sizeof path, "alice.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    kvmem_agent_close(a);
    /* another agent cannot take alice's memory */
    assert_ok(kvmem_agent_open(p, "bob", &a));
    assert_status(kvmem_agent_load(a, path), KVMEM_ERR_MISMATCH, "belongs to agent 'alice', not 'bob'");
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    /* another geometry, dtype, model, RoPE */
    struct {
        int32_t L, D;
        kvmem_dtype dt;
        const char *needle;
    } cases[] = {{2, 32, KVMEM_F16, "model"}, {2, 64, KVMEM_Q4, "stores f16"}, {2, 64, KVMEM_F32, "stores f16"}};
    for (int i = 0; i < 3; i++) {
        p = make_pool(ctx, cases[i].L, cases[i].D, cases[i].dt, NULL, 0, 0);
        assert_ok(kvmem_agent_open(p, "alice", &a));
        assert_status(kvmem_agent_load(a, path), KVMEM_ERR_MISMATCH, cases[i].needle);
        kvmem_agent_close(a);
        kvmem_pool_free(p);
    }
    kvmem_model_spec spec = tu_spec(2, 64);
    spec.rope_theta = 500000.0;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 8;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    assert_ok(kvmem_agent_open(p, "alice", &a));
    assert_status(kvmem_agent_load(a, path), KVMEM_ERR_MISMATCH, "rope_theta=10000");
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void bad_arguments_change_nothing(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, NULL, 0, 0);
    kvmem_agent *a, *dead;
    assert_status(kvmem_agent_save(NULL, "/tmp/x"), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_status(kvmem_agent_load(NULL, "/tmp/x"), KVMEM_ERR_INVALID_ARG, "agent is NULL");
    assert_ok(kvmem_agent_open(p, "x", &a));
    assert_status(kvmem_agent_save(a, NULL), KVMEM_ERR_NOT_FOUND, "no store_dir");
    assert_status(kvmem_agent_load(a, NULL), KVMEM_ERR_NOT_FOUND, "no store_dir");
    assert_status(kvmem_agent_save(a, ""), KVMEM_ERR_INVALID_ARG, "empty");
    assert_status(kvmem_agent_save(a, "/nonexistent-dir-kvmem/x.safetensors"), KVMEM_ERR_NOT_FOUND, "cannot create");
    assert_status(kvmem_pool_sync(p), KVMEM_ERR_NOT_FOUND, "no store_dir");
    assert_status(kvmem_pool_sync(NULL), KVMEM_ERR_INVALID_ARG, "NULL");
    dead = a;
    kvmem_agent_close(a);
    assert_status(kvmem_agent_save(dead, "/tmp/x"), KVMEM_ERR_CLOSED, "closed");
    assert_status(kvmem_agent_load(dead, "/tmp/x"), KVMEM_ERR_CLOSED, "closed");
    /* ids with path separators never reach the file system */
    assert_status(kvmem_agent_open(p, "../etc/passwd", &a), KVMEM_ERR_INVALID_ARG, "invalid");
    assert_status(kvmem_agent_open(p, "a/b", &a), KVMEM_ERR_INVALID_ARG, "invalid");
    assert_status(kvmem_agent_open(p, ".hidden", &a), KVMEM_ERR_INVALID_ARG, "invalid");
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.store_dir = "/nonexistent-dir-kvmem";
    kvmem_model_spec spec = tu_spec(1, 64);
    kvmem_pool *q = NULL;
    assert_status(kvmem_pool_create(ctx, &spec, &pp, &q), KVMEM_ERR_NOT_FOUND, "does not exist");
    assert_null(q);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* The pool's spare memory (pool.h) stays within its bound: no more than
 * the agents hold and within the capacity left. */
static void spare_within_bound(kvmem_pool *p) {
    pthread_mutex_lock(&p->mu);
    uint64_t spare = p->spare_bytes + p->spare_aabb_bytes, lim = kvm_pool_spare_limit(p), used = p->used_bytes;
    uint64_t cap = p->params.capacity_bytes, n = 0;
    for (void *b = p->spare; b; b = *(void **)b) n++;
    pthread_mutex_unlock(&p->mu);
    assert_true(n * kvm_block_kv_bytes(p, p->params.block_size) == p->spare_bytes);
    if (!(spare <= lim && spare <= used && (!cap || used + spare <= cap)))
        fail_msg("spare %llu bytes, bound %llu, used %llu, capacity %llu", (unsigned long long)spare,
                 (unsigned long long)lim, (unsigned long long)used, (unsigned long long)cap);
}

/* A load that replaces an agent frees its old full blocks and AABB array
 * to the pool, and the next load writes into exactly that memory (no fresh
 * allocations to fault in); the agent reads back bit for bit after each
 * reload; short blocks are never kept. The spare memory counts against the
 * capacity (an append that needs its room gets it, instead of failing) and
 * shrinks with the live data (truncate, remove). */
static void reloads_reuse_freed_blocks_within_the_pool_bound(void **state) {
    (void)state;
    const int32_t L = 2, D = 64;
    kvmem_context *ctx = tu_context(2);
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, NULL, 0, 0);
    const size_t full = kvm_block_kv_bytes(p, 8);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "a", &a));
    fill_agent(a, L, D, 45, 3);       /* 5 full blocks + a tail of 5 */
    assert_ok(kvmem_agent_flush(a)); /* a short sealed block */
    fill_agent(a, L, D, 3, 4);
    snap before = take(a, L, D);
    char path[300];
    path_of(path, sizeof path, "reuse.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    assert_true(p->spare == NULL && p->spare_aabb == NULL);
    assert_ok(kvmem_agent_load(a, path));
    assert_int_equal(p->spare_bytes, 5 * full); /* the old agent's full blocks, not its short one */
    assert_non_null(p->spare_aabb);
    spare_within_bound(p);
    void *kept[5], *aabb = p->spare_aabb;
    int n = 0;
    for (void *b = p->spare; b; b = *(void **)b) kept[n++] = b;
    assert_ok(kvmem_agent_load(a, path));
    for (int32_t i = 0; i < 5; i++) {
        int found = 0;
        for (int j = 0; j < 5; j++) found |= a->mem->blocks[i].kv == kept[j];
        assert_true(found);
    }
    assert_ptr_equal(a->mem->aabb, aabb);
    assert_int_equal(p->spare_bytes, 5 * full);
    snap after = take(a, L, D);
    snap_equal(&before, &after, L, D);
    snap_free(&after);
    spare_within_bound(p);
    /* truncating to 2 blocks frees 4 (one short) and the bound follows */
    assert_ok(kvmem_agent_truncate(a, 16));
    spare_within_bound(p);
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(p, "a"));
    assert_true(p->spare == NULL && p->spare_bytes == 0 && p->spare_aabb == NULL);

    /* with a capacity: after a reload the pool holds the agent and its spare
     * memory within the capacity; a second agent whose tail needs the spare
     * memory's room (no block of it: nothing to reuse) gets it */
    kvmem_pool_free(p);
    p = make_pool(ctx, L, D, KVMEM_F16, NULL, 0, 0);
    assert_ok(kvmem_agent_open(p, "a", &a));
    assert_ok(kvmem_agent_load(a, path));
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    const uint64_t one = info.bytes, cap = 2 * one + 1024; /* room for the reload's old and new agent */
    p = make_pool(ctx, L, D, KVMEM_F16, NULL, cap, 0);
    assert_ok(kvmem_agent_open(p, "a", &a));
    assert_ok(kvmem_agent_load(a, path));
    assert_ok(kvmem_agent_load(a, path));
    spare_within_bound(p);
    const uint64_t spare = p->spare_bytes + p->spare_aabb_bytes, tail = kvm_tail_bytes(p);
    assert_true(one + tail <= cap && one + spare + tail > cap);
    kvmem_agent *b;
    assert_ok(kvmem_agent_open(p, "b", &b));
    fill_agent(b, L, D, 3, 9); /* a tail only */
    spare_within_bound(p);
    assert_true(p->spare_bytes + p->spare_aabb_bytes < spare);
    kvmem_agent_close(b);
    kvmem_agent_close(a);
    snap_free(&before);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void store_spills_lru_closed_agents_and_reloads_them(void **state) {
    (void)state;
    const int32_t L = 2, D = 64;
    kvmem_context *ctx = tu_context(2);
    char store[300];
    path_of(store, sizeof store, "store");
    mkdir(store, 0755);
    /* measure one agent's bytes, then allow room for about two */
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_Q4, store, 0, 0);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "probe", &a));
    fill_agent(a, L, D, 20, 1);
    kvmem_agent_info info;
    assert_ok(kvmem_agent_get_info(a, &info));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    uint64_t one = info.bytes;
    p = make_pool(ctx, L, D, KVMEM_Q4, store, 2 * one + one / 2, 0);
    snap snaps[4];
    const char *ids[4] = {"a0", "a1", "a2", "a3"};
    for (int i = 0; i < 4; i++) {
        assert_ok(kvmem_agent_open(p, ids[i], &a));
        fill_agent(a, L, D, 20, 10 + (uint64_t)i);
        snaps[i] = take(a, L, D);
        kvmem_agent_close(a);
        kvmem_pool_info pi;
        assert_ok(kvmem_pool_get_info(p, &pi));
        assert_true(pi.used_bytes <= 2 * one + one / 2);
    }
    /* a0 and a1 were the least recently used: spilled to files */
    char f0[400];
    snprintf(f0, sizeof f0, "%s/a0.safetensors", store);
    struct stat st;
    assert_int_equal(stat(f0, &st), 0);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 4);
    assert_int_equal(pi.used_bytes, 2 * one);
    /* opening them reloads them exactly (and spills others) */
    for (int i = 0; i < 4; i++) {
        assert_ok(kvmem_agent_open(p, ids[i], &a));
        snap s = take(a, L, D);
        snap_equal(&snaps[i], &s, L, D);
        snap_free(&s);
        kvmem_agent_close(a);
    }
    /* an open agent is never spilled: with a0, a1 open nothing more fits */
    kvmem_agent *h0, *h1, *h2;
    assert_ok(kvmem_agent_open(p, "a0", &h0));
    assert_ok(kvmem_agent_open(p, "a1", &h1));
    assert_status(kvmem_agent_open(p, "a2", &h2), KVMEM_ERR_CAPACITY, "no closed agent left to spill");
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 4);
    kvmem_agent_close(h0);
    kvmem_agent_close(h1);
    /* a new pool on the same directory finds the agents (restart) */
    assert_ok(kvmem_pool_sync(p));
    kvmem_pool_free(p);
    p = make_pool(ctx, L, D, KVMEM_Q4, store, 0, 0);
    for (int i = 0; i < 4; i++) {
        assert_ok(kvmem_agent_open(p, ids[i], &a));
        snap s = take(a, L, D);
        snap_equal(&snaps[i], &s, L, D);
        snap_free(&s);
        kvmem_agent_close(a);
        snap_free(&snaps[i]);
    }
    /* remove deletes the file too */
    assert_ok(kvmem_pool_remove_agent(p, "a0"));
    assert_int_equal(stat(f0, &st), -1);
    assert_status(kvmem_pool_remove_agent(p, "a0"), KVMEM_ERR_NOT_FOUND, "no agent 'a0'");
    kvmem_pool_free(p);
    /* the soft budget spills at close */
    p = make_pool(ctx, L, D, KVMEM_Q4, store, 0, one);
    assert_ok(kvmem_agent_open(p, "a1", &a));
    kvmem_agent_close(a);
    assert_ok(kvmem_agent_open(p, "a2", &a));
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_true(pi.used_bytes <= one);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* A gate in front of a store's writes: while shut, open_write waits there
 * (a spill whose write to a slow disk or a stalled Redis has not ended);
 * while failing, it refuses (a store that is down). Writes are counted. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int shut, waiting, failing, writes;
    const kvm_store_iface *inner;
    kvm_store_iface iface;
} g_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, {0}};

static kvmem_status gated_open_write(kvm_store *s, const char *key, kvm_store_writer **out) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.writes++;
    g_gate.waiting++;
    while (g_gate.shut) pthread_cond_wait(&g_gate.cv, &g_gate.mu);
    g_gate.waiting--;
    const int failing = g_gate.failing;
    pthread_mutex_unlock(&g_gate.mu);
    if (failing) return kvm_fail(KVMEM_ERR_IO, "store down (test)");
    return g_gate.inner->open_write(s, key, out);
}

static void gate_install(kvmem_pool *p) {
    g_gate.inner = p->store->iface;
    g_gate.iface = *p->store->iface;
    g_gate.iface.open_write = gated_open_write;
    p->store->iface = &g_gate.iface;
}

static void gate_set(int shut) {
    pthread_mutex_lock(&g_gate.mu);
    g_gate.shut = shut;
    pthread_cond_broadcast(&g_gate.cv);
    pthread_mutex_unlock(&g_gate.mu);
}

static int gate_waiting(void) {
    pthread_mutex_lock(&g_gate.mu);
    int n = g_gate.waiting;
    pthread_mutex_unlock(&g_gate.mu);
    return n;
}

typedef struct spill_job {
    kvmem_pool *p;
    const char *id;
    int32_t T;
    kvmem_status st;
    uint64_t used_after; /* pool_info's used_bytes after the append */
    snap s;              /* agent `id` as opened (the "reopen" job) */
    atomic_int done;
} spill_job;

/* Open job->id, append T tokens, read the pool's numbers, close. */
static void *append_job(void *arg) {
    spill_job *j = arg;
    kvmem_agent *a;
    if ((j->st = kvmem_agent_open(j->p, j->id, &a)) == KVMEM_OK) {
        fill_agent(a, 2, 64, j->T, 77);
        kvmem_pool_info pi;
        j->st = kvmem_pool_get_info(j->p, &pi);
        j->used_after = pi.used_bytes;
        kvmem_agent_close(a);
    }
    atomic_store(&j->done, 1);
    return NULL;
}

/* Open job->id (a spilled or spilling agent: reloaded) and take what it holds. */
static void *reopen_job(void *arg) {
    spill_job *j = arg;
    kvmem_agent *a;
    if ((j->st = kvmem_agent_open(j->p, j->id, &a)) == KVMEM_OK) {
        j->s = take(a, 2, 64);
        kvmem_agent_close(a);
    }
    atomic_store(&j->done, 1);
    return NULL;
}

/* 1 once *flag is set, 0 after `ms` milliseconds without. */
static int wait_for(atomic_int *flag, int ms) {
    for (int i = 0; i < ms && !atomic_load(flag); i++) nanosleep(&(struct timespec){0, 1000000}, NULL);
    return atomic_load(flag);
}

/* Bytes an agent of T tokens holds (a pool without a store or a cap). */
static uint64_t agent_bytes(kvmem_context *ctx, int32_t L, int32_t D, int32_t T) {
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, NULL, 0, 0);
    kvmem_agent *a;
    kvmem_agent_info info;
    assert_ok(kvmem_agent_open(p, "probe", &a));
    fill_agent(a, L, D, T, 1);
    assert_ok(kvmem_agent_get_info(a, &info));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    return info.bytes;
}

/* A spill writes its agent without the pool's mutex: while one waits on its
 * store, another agent opens, appends a few tokens (the room the spilling
 * reservation left) and closes, and the pool answers; opening the agent
 * being spilled waits for the write and reloads it whole. Before, the spill
 * held the mutex through the write and all of these waited for it. */
static void a_spill_in_progress_blocks_only_its_own_agent(void **state) {
    (void)state;
    const int32_t L = 2, D = 64, T = 196; /* 24 blocks and a tail: bytes equal after a reload */
    kvmem_context *ctx = tu_context(2);
    char store[300];
    path_of(store, sizeof store, "store-gated");
    mkdir(store, 0755);
    const uint64_t one = agent_bytes(ctx, L, D, T), small = agent_bytes(ctx, L, D, 3);
    assert_true(4 * small < one / 2);

    /* room for two agents and a half: a third spills the least recently used */
    const uint64_t cap = 2 * one + one / 2;
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, store, cap, 0);
    kvmem_agent *a;
    gate_install(p);
    assert_ok(kvmem_agent_open(p, "a0", &a));
    fill_agent(a, L, D, T, 10);
    snap a0 = take(a, L, D);
    kvmem_agent_close(a);
    assert_ok(kvmem_agent_open(p, "a1", &a));
    fill_agent(a, L, D, T, 11);
    kvmem_agent_close(a);

    gate_set(1);
    spill_job big = {.p = p, .id = "big", .T = T}, other = {.p = p, .id = "other", .T = 3}, back = {.p = p, .id = "a0"};
    pthread_t tb, to, tr;
    assert_int_equal(pthread_create(&tb, NULL, append_job, &big), 0);
    int spilling = 0;
    for (int i = 0; i < 10000 && !spilling; i++) { /* big's append spills a0 and waits at the gate */
        spilling = gate_waiting() == 1;
        if (!spilling) nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    int other_done = 0, back_early = 0;
    if (spilling) {
        assert_int_equal(pthread_create(&to, NULL, append_job, &other), 0);
        other_done = wait_for(&other.done, 10000); /* milliseconds in practice; the mutex: forever */
        assert_int_equal(pthread_create(&tr, NULL, reopen_job, &back), 0);
        back_early = wait_for(&back.done, 50);
    }
    const int still_spilling = gate_waiting() == 1;
    gate_set(0); /* whatever happened: let every thread finish before asserting */
    pthread_join(tb, NULL);
    if (spilling) {
        pthread_join(to, NULL);
        pthread_join(tr, NULL);
    }
    assert_true(spilling);
    assert_true(other_done);
    assert_true(still_spilling);
    assert_int_equal(other.st, KVMEM_OK);
    assert_true(other.used_after <= cap);
    assert_int_equal(big.st, KVMEM_OK);
    assert_true(big.used_after <= cap);
    /* the agent being spilled was opened only once its write ended: whole */
    assert_false(back_early);
    assert_int_equal(back.st, KVMEM_OK);
    snap_equal(&a0, &back.s, L, D);
    char f0[400];
    struct stat sb;
    snprintf(f0, sizeof f0, "%s/a0.safetensors", store);
    assert_int_equal(stat(f0, &sb), 0);
    snap_free(&a0);
    snap_free(&back.s);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* The one who fills the pool pays for the spills: a large append that
 * would leave the pool all but full spills then, so another agent's few
 * tokens fit after it while the store's writes are held up. Before, the
 * large append took the last bytes without spilling and the small one had
 * to spill, waiting on the store (an fsync, behind a flood's writes). */
static void a_large_append_leaves_room_for_small_ones(void **state) {
    (void)state;
    const int32_t L = 2, D = 64;
    kvmem_context *ctx = tu_context(1);
    const uint64_t one = agent_bytes(ctx, L, D, 192), big = agent_bytes(ctx, L, D, 96), small = agent_bytes(ctx, L, D, 3);
    /* four closed agents, and room for the big append and half the small
     * one's bytes: the big one fits, the small one after it would not */
    const uint64_t cap = 4 * one + big + small / 2;
    assert_true(big > cap / 64 && small <= cap / 64); /* large and small as the pool counts them */
    char store[300];
    path_of(store, sizeof store, "store-room");
    mkdir(store, 0755);
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, store, cap, 0);
    gate_install(p);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "a%d", i);
        kvmem_agent *a;
        assert_ok(kvmem_agent_open(p, id, &a));
        fill_agent(a, L, D, 192, 10 + (uint64_t)i);
        kvmem_agent_close(a);
    }
    spill_job bigj = {.p = p, .id = "big", .T = 96}, smallj = {.p = p, .id = "small", .T = 3};
    append_job(&bigj);
    assert_int_equal(bigj.st, KVMEM_OK);
    /* a sixteenth of the capacity is free after it: a0 went to the store */
    assert_true(bigj.used_after <= cap - cap / 16);
    char f0[400];
    struct stat sb;
    snprintf(f0, sizeof f0, "%s/a0.safetensors", store);
    assert_int_equal(stat(f0, &sb), 0);
    /* with the store's writes held, the small append needs none */
    gate_set(1);
    pthread_t ts;
    assert_int_equal(pthread_create(&ts, NULL, append_job, &smallj), 0);
    const int done = wait_for(&smallj.done, 10000);
    const int waited_at_gate = gate_waiting() > 0;
    gate_set(0);
    pthread_join(ts, NULL);
    assert_false(waited_at_gate);
    assert_true(done);
    assert_int_equal(smallj.st, KVMEM_OK);
    assert_true(smallj.used_after <= cap);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* A store that is down: a large append that fits tries one spill to keep
 * room, and after that failure the next ones that fit do not try again (each
 * would wait on the failing store); one that does not fit still tries, fails
 * with the store's error, and succeeds once the store is back. */
static void a_failing_store_is_not_retried_by_appends_that_fit(void **state) {
    (void)state;
    const int32_t L = 2, D = 64;
    kvmem_context *ctx = tu_context(1);
    const uint64_t one = agent_bytes(ctx, L, D, 192), big = agent_bytes(ctx, L, D, 96), small = agent_bytes(ctx, L, D, 3);
    const uint64_t cap = 4 * one + big + small / 2; /* a big append fits, with less than a sixteenth left */
    char store[300];
    path_of(store, sizeof store, "store-down");
    mkdir(store, 0755);
    kvmem_pool *p = make_pool(ctx, L, D, KVMEM_F16, store, cap, 0);
    gate_install(p);
    kvmem_agent *a;
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "a%d", i);
        assert_ok(kvmem_agent_open(p, id, &a));
        fill_agent(a, L, D, 192, 20 + (uint64_t)i);
        kvmem_agent_close(a);
    }
    pthread_mutex_lock(&g_gate.mu);
    g_gate.failing = 1;
    g_gate.writes = 0;
    pthread_mutex_unlock(&g_gate.mu);
    assert_ok(kvmem_agent_open(p, "b0", &a));
    fill_agent(a, L, D, 96, 30); /* fits: one spill tried, failed */
    kvmem_agent_close(a);
    assert_int_equal(g_gate.writes, 1);
    assert_ok(kvmem_pool_remove_agent(p, "b0"));
    assert_ok(kvmem_agent_open(p, "b1", &a));
    fill_agent(a, L, D, 96, 31); /* fits again: no second try */
    kvmem_agent_close(a);
    assert_int_equal(g_gate.writes, 1);
    kvmem_pool_info pi, pj;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_ok(kvmem_agent_open(p, "b2", &a));
    assert_int_equal(append_tokens(a, L, D, 96, 32), KVMEM_ERR_IO); /* does not fit: tries, and says why */
    assert_int_equal(g_gate.writes, 2);
    assert_ok(kvmem_pool_get_info(p, &pj));
    assert_int_equal(pj.used_bytes, pi.used_bytes); /* nothing reserved by the failed append */
    pthread_mutex_lock(&g_gate.mu);
    g_gate.failing = 0;
    pthread_mutex_unlock(&g_gate.mu);
    fill_agent(a, L, D, 96, 32); /* the store is back: it spills and fits */
    kvmem_agent_close(a);
    assert_true(g_gate.writes >= 3);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void corrupt_store_file_fails_open_cleanly(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    char store[300], f[400];
    path_of(store, sizeof store, "store2");
    mkdir(store, 0755);
    snprintf(f, sizeof f, "%s/zed.safetensors", store);
    write_bytes(f, "\x10\0\0\0\0\0\0\0{\"a\":1}         ", 24);
    kvmem_pool *p = make_pool(ctx, 1, 64, KVMEM_F16, store, 0, 0);
    kvmem_agent *a = NULL;
    assert_status(kvmem_agent_open(p, "zed", &a), KVMEM_ERR_FORMAT, "__metadata__");
    assert_null(a);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 0);
    assert_ok(kvmem_pool_remove_agent(p, "zed")); /* removable from the store */
    assert_ok(kvmem_agent_open(p, "zed", &a));    /* now a fresh agent */
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* ---- JSON reader and checksum ---- */

static int parses(const char *s) {
    kvm_json_doc d;
    char err[256];
    int r = kvm_json_parse(s, strlen(s), &d, err, sizeof err);
    if (r == 0) kvm_json_free(&d);
    return r == 0;
}

static void json_reader_is_strict(void **state) {
    (void)state;
    const char *good[] = {"{}", "[]", " {\"a\":[1,2,{\"b\":null}],\"c\":\"\\u00e9\\ud83d\\ude00\"}  ", "-0", "1.5e-3", "\"\"",
                          "[true,false]"};
    const char *bad[] = {"", "{", "{\"a\":1,}", "[1,]", "{\"a\":1 \"b\":2}", "{\"a\":1,\"a\":2}", "01", "1.", "+1", "\"\\x\"",
                         "\"\x01\"", "\"\xff\"", "\"\xc3\"", "\"\\ud800\"", "\"\\udc00\"", "{} x", "nul", "[1]]", "'a'",
                         "\"\xed\xa0\x80\"", "\"\xc0\xaf\""};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!parses(good[i])) fail_msg("refused valid JSON %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (parses(bad[i])) fail_msg("accepted invalid JSON '%s'", bad[i]);
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    assert_false(kvm_json_parse(deep, 200, &(kvm_json_doc){0}, NULL, 0) == 0);
    kvm_json_doc d;
    const char *s = "{\"k\":\"a\\nb\\u00e9\",\"n\":-9223372036854775808,\"m\":9223372036854775808}";
    assert_int_equal(kvm_json_parse(s, strlen(s), &d, NULL, 0), 0);
    const kvm_json *k = kvm_json_get(&d, &d.nodes[0], "k");
    assert_int_equal(k->len, 5);
    assert_memory_equal(k->str, "a\nb\xc3\xa9", 5);
    assert_true(kvm_json_get(&d, &d.nodes[0], "n")->is_int);
    assert_true(kvm_json_get(&d, &d.nodes[0], "n")->i == INT64_MIN);
    assert_false(kvm_json_get(&d, &d.nodes[0], "m")->is_int);
    assert_null(kvm_json_get(&d, &d.nodes[0], "zz"));
    kvm_json_free(&d);
    /* the reader never reads past n: a string cut at the buffer end */
    char cut[4] = {'"', 'a', 'b', '"'};
    assert_int_equal(kvm_json_parse(cut, 3, &d, NULL, 0), -1);
}

static void xxh64_matches_published_vectors(void **state) {
    (void)state;
    assert_true(kvm_xxh64_once("", 0, 0) == 0xEF46DB3751D8E999ull);
    assert_true(kvm_xxh64_once("abc", 3, 0) == 0x44BC2CF5AD770999ull);
    /* streaming in odd pieces equals one shot */
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7 + 3);
    kvm_xxh64_state h;
    kvm_xxh64_init(&h, 0);
    size_t at = 0, step = 1;
    while (at < 1000) {
        size_t k = step < 1000 - at ? step : 1000 - at;
        kvm_xxh64_update(&h, buf + at, k);
        at += k;
        step = step * 3 % 41 + 1;
    }
    assert_true(kvm_xxh64_final(&h) == kvm_xxh64_once(buf, 1000, 0));
}

/* acc64 written out plainly here, against the library's scalar and SIMD lanes */
static uint64_t ref_acc64_lanes(uint64_t acc[8], const unsigned char *p, size_t stripes) {
    for (size_t s = 0; s < stripes; s++)
        for (int i = 0; i < 8; i++) {
            uint64_t d = 0;
            for (int b = 7; b >= 0; b--) d = (d << 8) | p[s * 64 + (size_t)i * 8 + (size_t)b];
            uint64_t v = d ^ kvm_acc64_keys[i];
            acc[i ^ 1] += d;
            acc[i] += (v & 0xffffffffull) * (v >> 32);
        }
    return acc[0];
}

static void acc64_lanes_agree_across_isas(void **state) {
    (void)state;
    unsigned char buf[64 * 37];
    uint64_t rng = 5;
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)tu_next(&rng);
    uint64_t want[8], got[8];
    for (int i = 0; i < 8; i++) want[i] = got[i] = kvm_acc64_keys[i] * 3;
    ref_acc64_lanes(want, buf, 37);
    if (kvm_cpu_kernels_named("avx2")) {
        kvm_cpu_kernels_named("avx2")->acc64_stripes(got, buf, 37);
        assert_memory_equal(want, got, sizeof want);
    }
    for (int i = 0; i < 8; i++) got[i] = kvm_acc64_keys[i] * 3;
    if (kvm_cpu_kernels_named("avx512")) {
        kvm_cpu_kernels_named("avx512")->acc64_stripes(got, buf, 37);
        assert_memory_equal(want, got, sizeof want);
    }
    /* streaming in odd pieces equals one shot; a flipped bit changes the digest */
    kvm_acc64_state st;
    kvm_acc64_init(&st, sizeof buf, NULL);
    for (size_t at = 0, step = 1; at < sizeof buf; at += step, step = step * 5 % 97 + 1)
        kvm_acc64_update(&st, buf + at, step < sizeof buf - at ? step : sizeof buf - at);
    uint64_t one = kvm_acc64(buf, sizeof buf);
    assert_true(kvm_acc64_final(&st) == one);
    for (size_t bit = 0; bit < sizeof buf * 8; bit += 13) {
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
        assert_true(kvm_acc64(buf, sizeof buf) != one);
        buf[bit / 8] ^= (unsigned char)(1u << (bit % 8));
    }
    assert_true(kvm_acc64(buf, 10) != kvm_acc64(buf, 11));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_saves_and_loads_bit_exact),
        cmocka_unit_test(large_blocks_save_and_load_bit_exact),
        cmocka_unit_test(empty_agent_round_trips),
        cmocka_unit_test(loader_refuses_hostile_files_with_the_right_code),
        cmocka_unit_test(spec_dtype_and_agent_mismatches_are_refused),
        cmocka_unit_test(bad_arguments_change_nothing),
        cmocka_unit_test(reloads_reuse_freed_blocks_within_the_pool_bound),
        cmocka_unit_test(store_spills_lru_closed_agents_and_reloads_them),
        cmocka_unit_test(a_spill_in_progress_blocks_only_its_own_agent),
        cmocka_unit_test(a_large_append_leaves_room_for_small_ones),
        cmocka_unit_test(a_failing_store_is_not_retried_by_appends_that_fit),
        cmocka_unit_test(corrupt_store_file_fails_open_cleanly),
        cmocka_unit_test(json_reader_is_strict),
        cmocka_unit_test(xxh64_matches_published_vectors),
        cmocka_unit_test(acc64_lanes_agree_across_isas),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

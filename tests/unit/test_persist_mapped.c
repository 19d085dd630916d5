/* Agents larger than the pool (kvmem_agent_open_file): a saved agent opened
 * in place gives, bit for bit, what the same file loaded into memory gives
 * (read, AABB and EXACT retrieval, gather, attention, batch merge) in every
 * storage dtype; the pool counts only its resident index, so an agent four
 * times the capacity opens and works; it is read-only; a truncated or
 * corrupt file is a status at open, and a file that shrinks after open is a
 * status at the read that needs the missing bytes. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return tu_tmpdir_make(g_dir, sizeof g_dir, "mapped");
}

static int teardown(void **state) {
    (void)state;
    return tu_tmpdir_remove(g_dir);
}

/* 48 sealed blocks and a tail of 3: even Q4 (whose KV is only ~10 times
 * its f16 boxes at this block size) is over 4 times its resident bytes */
enum { L = 3, D = 40, H = 2, HQ = 4, BS = 32, NB = 48, TAIL = 3, T = BS * NB + TAIL };

static kvmem_pool *make_pool(kvmem_context *ctx, kvmem_dtype dt, uint64_t cap) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = BS;
    pp.capacity_bytes = cap;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

static long file_size(const char *path) {
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (long)st.st_size;
}

/* Write agent "a" of T tokens (KV from seed) in dtype dt to path; the f32
 * KV appended is returned in k, v ([L][T][H][D]). */
static void write_agent(kvmem_context *ctx, kvmem_dtype dt, const char *path, float *k, float *v) {
    uint64_t seed = 17;
    size_t n = (size_t)L * T * H * D;
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    int32_t *ids = malloc(T * sizeof *ids);
    for (int32_t i = 0; i < T; i++) ids[i] = 500 + i;
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.token_ids = ids;
    ap.text = "mapped agent text";
    ap.text_len = strlen(ap.text);
    kvmem_pool *p = make_pool(ctx, dt, 0);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "a", &a));
    assert_ok(kvmem_agent_append(a, &tk, &tv, &ap));
    assert_ok(kvmem_agent_save(a, path));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    free(ids);
}

static void read_all(kvmem_agent *a, float *k, float *v) {
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, T, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_agent_read(a, 0, T, &tk, &tv));
}

/* Everything a reader of blocks computes, into one buffer per call. */
typedef struct outputs {
    int32_t blocks[2][16];
    float scores[2][16];
    int32_t n[2];
    float *gk, *gv;   /* gather of the EXACT selection: [L][M][H][D] */
    int64_t m;
    float att[2 * HQ * D]; /* attention of 2 rows on layer 1 */
    float *merged; /* [H][T][D] */
    float window[2][L * 50 * H * D]; /* kvmem_agent_read of tokens [BS + 5, BS + 55): rows inside blocks */
} outputs;

static void run_readers(kvmem_context *ctx, kvmem_agent *a, outputs *o) {
    memset(o, 0, sizeof *o);
    uint64_t seed = 99;
    float q[2 * L * HQ * D];
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = tu_normal(&seed);
    kvmem_tensor tq;
    int64_t qs[4] = {2, L, HQ, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 4, qs));
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    for (int mode = 0; mode < 2; mode++) {
        kvmem_retrieve_params rp = kvmem_retrieve_default_params();
        rp.top_k = 5;
        rp.mode = mode ? KVMEM_RETRIEVE_EXACT : KVMEM_RETRIEVE_AABB;
        assert_ok(kvmem_retrieve(a, &tq, &rp, r));
        assert_ok(kvmem_retrieval_copy(r, 0, o->blocks[mode], o->scores[mode], 16, &o->n[mode]));
        assert_int_equal(o->n[mode], 5);
    }
    int64_t M = 0;
    assert_ok(kvmem_retrieval_n_tokens(r, 0, &M));
    kvmem_retrieval_free(r);
    o->m = M;
    o->gk = calloc((size_t)L * (size_t)M * H * D, 4);
    o->gv = calloc((size_t)L * (size_t)M * H * D, 4);
    kvmem_tensor gk, gv;
    int64_t gs[4] = {L, M, H, D};
    assert_ok(kvmem_tensor_init(&gk, o->gk, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&gv, o->gv, KVMEM_F32, 4, gs));
    assert_ok(kvmem_gather(a, o->blocks[1], o->n[1], 7, &gk, &gv));

    kvmem_tensor aq, ao;
    int64_t as[3] = {2, HQ, D};
    assert_ok(kvmem_tensor_init(&aq, q, KVMEM_F32, 3, as));
    assert_ok(kvmem_tensor_init(&ao, o->att, KVMEM_F32, 3, as));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = a;
    src.layer = 1;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tau_s = ap.tau_d = 0;
    assert_ok(kvmem_attend(ctx, &aq, &src, &ap, &ao, NULL));

    kvmem_tensor wk, wv;
    int64_t ws[4] = {L, 50, H, D};
    assert_ok(kvmem_tensor_init(&wk, o->window[0], KVMEM_F32, 4, ws));
    assert_ok(kvmem_tensor_init(&wv, o->window[1], KVMEM_F32, 4, ws));
    assert_ok(kvmem_agent_read(a, BS + 5, 50, &wk, &wv));

    kvmem_tensor mk;
    o->merged = malloc((size_t)H * T * D * 4);
    int64_t ms[4] = {1, H, T, D};
    assert_ok(kvmem_tensor_init(&mk, o->merged, KVMEM_F32, 4, ms));
    int64_t len = 0;
    kvmem_agent *one[1] = {a};
    assert_ok(kvmem_batch_merge(one, 1, 2, &mk, NULL, &len));
    assert_int_equal(len, T);
}

static void same_outputs(const outputs *x, const outputs *y) {
    for (int mode = 0; mode < 2; mode++) {
        assert_int_equal(x->n[mode], y->n[mode]);
        assert_memory_equal(x->blocks[mode], y->blocks[mode], sizeof x->blocks[mode]);
        assert_memory_equal(x->scores[mode], y->scores[mode], sizeof x->scores[mode]);
    }
    assert_int_equal(x->m, y->m);
    assert_memory_equal(x->gk, y->gk, (size_t)L * (size_t)x->m * H * D * 4);
    assert_memory_equal(x->gv, y->gv, (size_t)L * (size_t)x->m * H * D * 4);
    assert_memory_equal(x->att, y->att, sizeof x->att);
    assert_memory_equal(x->merged, y->merged, (size_t)H * T * D * 4);
    assert_memory_equal(x->window, y->window, sizeof x->window);
}

static void free_outputs(outputs *o) {
    free(o->gk);
    free(o->gv);
    free(o->merged);
}

/* Bytes the pool must count for the mapped agent: its AABBs (f16 boxes for
 * f16-range dtypes, f32 for F32/BF16) and its f32 tail buffer, nothing of
 * its KV. */
static uint64_t resident_bytes(kvmem_dtype dt) {
    uint64_t esize = dt == KVMEM_F32 || dt == KVMEM_BF16 ? 4 : 2;
    return (uint64_t)NB * L * H * 2 * D * esize + 2ull * L * H * BS * D * 4;
}

static void mapped_agent_equals_the_loaded_agent_bit_for_bit(void **state) {
    (void)state;
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    kvmem_context *ctx = tu_context(2);
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4), *mk = malloc(n * 4), *mv = malloc(n * 4), *lk = malloc(n * 4),
          *lv = malloc(n * 4);
    for (size_t di = 0; di < sizeof dts / sizeof *dts; di++) {
        char path[300];
        snprintf(path, sizeof path, "%s/a-%s.safetensors", g_dir, kvmem_dtype_name(dts[di]));
        write_agent(ctx, dts[di], path, k, v);
        /* the reference: the same file loaded into memory */
        kvmem_pool *pl = make_pool(ctx, dts[di], 0);
        kvmem_agent *la;
        assert_ok(kvmem_agent_open(pl, "a", &la));
        assert_ok(kvmem_agent_load(la, path));
        /* mapped, in a pool of a quarter of the file's size */
        uint64_t cap = (uint64_t)file_size(path) / 4;
        kvmem_pool *pm = make_pool(ctx, dts[di], cap);
        kvmem_agent *ma = NULL;
        assert_ok(kvmem_agent_open_file(pm, path, 0, &ma));
        assert_string_equal(kvmem_agent_get_id(ma), "a");
        kvmem_pool_info pi;
        assert_ok(kvmem_pool_get_info(pm, &pi));
        assert_int_equal(pi.used_bytes, resident_bytes(dts[di]));
        assert_true(pi.used_bytes <= cap);

        read_all(la, lk, lv);
        read_all(ma, mk, mv);
        assert_memory_equal(lk, mk, n * 4);
        assert_memory_equal(lv, mv, n * 4);
        if (dts[di] == KVMEM_F32) { /* and against what was appended, independently */
            assert_memory_equal(k, mk, n * 4);
            assert_memory_equal(v, mv, n * 4);
        }
        outputs ol, om;
        run_readers(ctx, la, &ol);
        run_readers(ctx, ma, &om);
        same_outputs(&ol, &om);
        free_outputs(&ol);
        free_outputs(&om);

        /* metadata came along */
        int32_t *ids = malloc(T * sizeof *ids);
        assert_ok(kvmem_agent_tokens(ma, 0, T, ids));
        for (int32_t i = 0; i < T; i++) assert_int_equal(ids[i], 500 + i);
        free(ids);
        const char *text;
        size_t tl;
        assert_ok(kvmem_agent_text(ma, &text, &tl));
        assert_int_equal(tl, strlen("mapped agent text"));
        assert_memory_equal(text, "mapped agent text", tl);

        /* the same file loaded into the small pool does not fit: the agent
         * really is larger than the pool */
        kvmem_agent *b;
        kvmem_pool *small = make_pool(ctx, dts[di], cap);
        assert_ok(kvmem_agent_open(small, "a", &b));
        assert_int_equal(kvmem_agent_load(b, path), KVMEM_ERR_CAPACITY);
        kvmem_agent_close(b);
        kvmem_pool_free(small);

        kvmem_agent_close(la);
        kvmem_agent_close(ma);
        kvmem_pool_free(pl);
        kvmem_pool_free(pm);
    }
    free(k), free(v), free(mk), free(mv), free(lk), free(lv);
    kvmem_context_free(ctx);
}

static void mapped_agent_is_read_only_and_reopens(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4), *k2 = malloc(n * 4), *v2 = malloc(n * 4);
    char path[300];
    snprintf(path, sizeof path, "%s/ro.safetensors", g_dir);
    write_agent(ctx, KVMEM_Q4, path, k, v);
    kvmem_pool *p = make_pool(ctx, KVMEM_Q4, 0);
    kvmem_agent *a;
    /* bad input changes nothing */
    assert_int_equal(kvmem_agent_open_file(NULL, path, 0, &a), KVMEM_ERR_INVALID_ARG);
    assert_null(a);
    assert_int_equal(kvmem_agent_open_file(p, NULL, 0, &a), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_agent_open_file(p, "", 0, &a), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_agent_open_file(p, path, 0, NULL), KVMEM_ERR_INVALID_ARG);
    assert_int_equal(kvmem_agent_open_file(p, path, 0x80, &a), KVMEM_ERR_INVALID_ARG);
    assert_non_null(strstr(kvmem_last_error(), "flags"));
    char missing[300];
    snprintf(missing, sizeof missing, "%s/none.safetensors", g_dir);
    assert_int_equal(kvmem_agent_open_file(p, missing, 0, &a), KVMEM_ERR_NOT_FOUND);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 0);
    assert_int_equal(pi.used_bytes, 0);

    /* a pool too small for even the index refuses it, changing nothing */
    kvmem_pool *tiny = make_pool(ctx, KVMEM_Q4, 4096);
    assert_int_equal(kvmem_agent_open_file(tiny, path, 0, &a), KVMEM_ERR_CAPACITY);
    assert_ok(kvmem_pool_get_info(tiny, &pi));
    assert_int_equal(pi.n_agents, 0);
    assert_int_equal(pi.used_bytes, 0);
    kvmem_pool_free(tiny);

    assert_ok(kvmem_agent_open_file(p, path, KVMEM_OPEN_FILE_NO_VERIFY, &a));
    read_all(a, k, v);
    kvmem_agent *dup;
    assert_int_equal(kvmem_agent_open_file(p, path, 0, &dup), KVMEM_ERR_EXISTS);
    kvmem_agent_info before, after;
    assert_ok(kvmem_agent_get_info(a, &before));
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, 1, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_int_equal(kvmem_agent_append(a, &tk, &tv, NULL), KVMEM_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvmem_last_error(), "read-only"));
    assert_int_equal(kvmem_agent_flush(a), KVMEM_ERR_UNSUPPORTED);
    assert_int_equal(kvmem_agent_truncate(a, 5), KVMEM_ERR_UNSUPPORTED);
    char other[300];
    snprintf(other, sizeof other, "%s/copy.safetensors", g_dir);
    assert_int_equal(kvmem_agent_save(a, other), KVMEM_ERR_UNSUPPORTED);
    assert_int_equal(access(other, F_OK), -1);
    assert_ok(kvmem_agent_get_info(a, &after));
    assert_memory_equal(&before, &after, sizeof before);

    /* closed and reopened by id: still the mapped agent, same KV */
    kvmem_agent_close(a);
    assert_ok(kvmem_agent_open(p, "a", &a));
    read_all(a, k2, v2);
    assert_memory_equal(k, k2, n * 4);
    assert_memory_equal(v, v2, n * 4);
    assert_int_equal(kvmem_agent_flush(a), KVMEM_ERR_UNSUPPORTED);
    /* loading replaces it with an in-memory copy, which can change */
    assert_ok(kvmem_agent_load(a, path));
    read_all(a, k2, v2);
    assert_memory_equal(k, k2, n * 4);
    assert_ok(kvmem_agent_flush(a));
    assert_ok(kvmem_agent_truncate(a, 20));
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(p, "a"));
    /* removed: the id is free for the file again */
    assert_ok(kvmem_agent_open_file(p, path, 0, &a));
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(p, "a"));
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.used_bytes, 0);
    kvmem_pool_free(p);
    free(k), free(v), free(k2), free(v2);
    kvmem_context_free(ctx);
}

static void copy_file(const char *from, const char *to, long keep, long flip_at) {
    FILE *f = fopen(from, "rb");
    assert_non_null(f);
    long n = file_size(from);
    unsigned char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    if (flip_at >= 0) buf[flip_at] ^= 0x40;
    f = fopen(to, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, (size_t)keep, f), (size_t)keep);
    fclose(f);
    free(buf);
}

static void bad_files_fail_with_a_status_at_open_or_at_the_read(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    char path[300], bad[300];
    snprintf(path, sizeof path, "%s/good.safetensors", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", g_dir);
    write_agent(ctx, KVMEM_F16, path, k, v);
    const long size = file_size(path);
    kvmem_pool *p = make_pool(ctx, KVMEM_F16, 0);
    kvmem_agent *a = NULL;
    /* truncated: the header no longer fits the file */
    copy_file(path, bad, size - 100, -1);
    assert_int_equal(kvmem_agent_open_file(p, bad, 0, &a), KVMEM_ERR_CORRUPT);
    assert_null(a);
    /* one flipped bit in the data section: the checksum pass finds it;
     * without the pass the open succeeds (documented) */
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)len8[i] << (8 * i);
    const long tails = 2L * L * H * TAIL * D * 4; /* the f32 tails come first (widest), then KV */
    copy_file(path, bad, size, (long)(8 + hl) + tails + 3);
    assert_int_equal(kvmem_agent_open_file(p, bad, 0, &a), KVMEM_ERR_CORRUPT);
    assert_non_null(strstr(kvmem_last_error(), "checksum"));
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 0);
    assert_int_equal(pi.used_bytes, 0);
    assert_ok(kvmem_agent_open_file(p, bad, KVMEM_OPEN_FILE_NO_VERIFY, &a));
    {   /* unverified bytes are used as they are: wrong values, any status, no crash */
        float *bk = malloc(n * 4), *bv = malloc(n * 4);
        kvmem_tensor tk, tv;
        int64_t shape[4] = {L, T, H, D};
        assert_ok(kvmem_tensor_init(&tk, bk, KVMEM_F32, 4, shape));
        assert_ok(kvmem_tensor_init(&tv, bv, KVMEM_F32, 4, shape));
        (void)kvmem_agent_read(a, 0, T, &tk, &tv);
        free(bk), free(bv);
    }
    kvmem_agent_close(a);
    assert_ok(kvmem_pool_remove_agent(p, "a"));

    /* the file shrinks after open: the data section's second half is gone */
    copy_file(path, bad, size, -1);
    assert_ok(kvmem_agent_open_file(p, bad, 0, &a));
    assert_int_equal(truncate(bad, (off_t)(8 + hl + (size - 8 - (long)hl) / 2)), 0);
    uint64_t seed = 5;
    float q[L * HQ * D];
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = tu_normal(&seed);
    kvmem_tensor tq;
    int64_t qs[4] = {1, L, HQ, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 4, qs));
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 3;
    assert_ok(kvmem_retrieve(a, &tq, &rp, r)); /* AABB: the index is in memory */
    int32_t sel[3], sel2[3], cnt = 0;
    assert_ok(kvmem_retrieval_copy(r, 0, sel, NULL, 3, &cnt));
    rp.mode = KVMEM_RETRIEVE_EXACT; /* reads every block's keys */
    assert_int_equal(kvmem_retrieve(a, &tq, &rp, r), KVMEM_ERR_CORRUPT);
    assert_non_null(strstr(kvmem_last_error(), "shrank"));
    assert_ok(kvmem_retrieval_copy(r, 0, sel2, NULL, 3, &cnt)); /* the result is as it was */
    assert_memory_equal(sel, sel2, sizeof sel);
    int32_t last = NB - 1; /* its layer 2 lies in the lost half */
    size_t gn = (size_t)L * BS * H * D;
    float *gk = malloc(gn * 4), *gv = malloc(gn * 4);
    kvmem_tensor tgk, tgv;
    int64_t gs[4] = {L, BS, H, D};
    assert_ok(kvmem_tensor_init(&tgk, gk, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&tgv, gv, KVMEM_F32, 4, gs));
    memset(gk, 0x5a, gn * 4);
    memset(gv, 0x5a, gn * 4);
    assert_int_equal(kvmem_gather(a, &last, 1, 0, &tgk, &tgv), KVMEM_ERR_CORRUPT);
    /* nothing written on error: every output byte is as the caller left it */
    for (size_t i = 0; i < gn * 4; i++)
        if (((unsigned char *)gk)[i] != 0x5a || ((unsigned char *)gv)[i] != 0x5a)
            fail_msg("kvmem_gather failed but changed output byte %zu of %s", i % (gn * 4),
                     ((unsigned char *)gk)[i] != 0x5a ? "k_out" : "v_out");
    /* the note was consumed: a call that reads only what is still there
     * (layer 0: the file holds the f32 tails, then layer 0's K and V, ...) works */
    float out[HQ * D];
    kvmem_tensor aq, ao;
    int64_t as[3] = {1, HQ, D};
    assert_ok(kvmem_tensor_init(&aq, q, KVMEM_F32, 3, as));
    assert_ok(kvmem_tensor_init(&ao, out, KVMEM_F32, 3, as));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = a;
    kvmem_attend_params ap = kvmem_attend_default_params();
    assert_ok(kvmem_attend(ctx, &aq, &src, &ap, &ao, NULL));
    src.layer = 2;
    assert_int_equal(kvmem_attend(ctx, &aq, &src, &ap, &ao, NULL), KVMEM_ERR_CORRUPT);
    free(gk), free(gv);
    kvmem_retrieval_free(r);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    free(k), free(v);
    kvmem_context_free(ctx);
}

/* A pool with a store spills closed agents to make room: never a mapped one
 * (its KV is in its own file, and it holds only its index), and a sync does
 * not write it. */
static void mapped_agents_are_never_spilled_or_synced(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4), *k2 = malloc(n * 4), *v2 = malloc(n * 4);
    char path[300], store[300];
    snprintf(path, sizeof path, "%s/sp.safetensors", g_dir);
    snprintf(store, sizeof store, "%s/store", g_dir);
    assert_int_equal(mkdir(store, 0700), 0);
    write_agent(ctx, KVMEM_F16, path, k, v);
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = KVMEM_F16;
    pp.block_size = BS;
    pp.store_dir = store;
    pp.capacity_bytes = resident_bytes(KVMEM_F16) + 1000;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    kvmem_agent *a, *b;
    assert_ok(kvmem_agent_open_file(p, path, 0, &a));
    read_all(a, k, v);
    kvmem_agent_close(a);
    /* another agent needs more than is left: the only closed agent is mapped */
    assert_ok(kvmem_agent_open(p, "b", &b));
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L, BS, H, D};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_int_equal(kvmem_agent_append(b, &tk, &tv, NULL), KVMEM_ERR_CAPACITY);
    assert_non_null(strstr(kvmem_last_error(), "no closed agent left to spill"));
    kvmem_agent_close(b);
    assert_ok(kvmem_pool_sync(p));
    char stored[400];
    snprintf(stored, sizeof stored, "%s/a.safetensors", store);
    assert_int_equal(access(stored, F_OK), -1);
    assert_ok(kvmem_agent_open(p, "a", &a)); /* still mapped, still the same */
    read_all(a, k2, v2);
    assert_memory_equal(k, k2, n * 4);
    assert_memory_equal(v, v2, n * 4);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    free(k), free(v), free(k2), free(v2);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mapped_agent_equals_the_loaded_agent_bit_for_bit),
        cmocka_unit_test(mapped_agent_is_read_only_and_reopens),
        cmocka_unit_test(bad_files_fail_with_a_status_at_open_or_at_the_read),
        cmocka_unit_test(mapped_agents_are_never_spilled_or_synced),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

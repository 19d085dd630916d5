/* Regression tests for the defects of issue 17, each named by what it
 * proves: a save that cannot allocate its header never writes a file that
 * does not load; out of memory is KVMEM_ERR_NOMEM (never INVALID_ARG or
 * FORMAT), and removing a stored agent needs no memory at all; a huge
 * text_len returns instead of spinning; the loader refuses a NUL inside any
 * metadata string; FIFOs and other non-regular files are refused without
 * blocking and never replaced; kvmem_rope_apply refuses a stride whose
 * offsets wrap; a refused file's bytes are not quoted; non-finite K reaches
 * no score or attention output. The allocator hook (core/alloc.h) fails
 * chosen allocations; alarm() turns a hang into a failure. */
#include "testutil.h"
#include "alloc.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define L_ 2
#define D_ 8
#define H_ 2

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    kvm_alloc_test_begin();
    return tu_tmpdir_make(g_dir, sizeof g_dir, "rel");
}

static int teardown(void **state) {
    (void)state;
    return tu_tmpdir_remove(g_dir);
}

static const char *path_of(const char *name) {
    static char buf[4][400];
    static int at;
    at = (at + 1) % 4;
    snprintf(buf[at], sizeof buf[at], "%s/%s", g_dir, name);
    return buf[at];
}

static kvmem_pool *make_pool(kvmem_context *ctx, const char *store) {
    kvmem_model_spec spec = tu_spec(L_, D_);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = 8;
    pp.store_dir = store;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &p));
    return p;
}

static void append(kvmem_agent *a, int32_t T, uint64_t seed) {
    size_t n = (size_t)L_ * (size_t)T * H_ * D_;
    float *k = malloc(n * 4), *v = malloc(n * 4);
    tu_fill_kv(k, n, &seed);
    tu_fill_kv(v, n, &seed);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L_, T, H_, D_};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.text = "some text";
    ap.text_len = 9;
    assert_ok(kvmem_agent_append(a, &tk, &tv, &ap));
    free(k), free(v);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_all(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* The high-severity one: the model-spec string of the header failing to
 * allocate made a save write "model_spec": "" and return OK, replacing a
 * good file with one no pool loads. Fail each allocation of a save in
 * turn: every outcome must leave a file that loads into the same agent. */
static void save_that_cannot_allocate_never_leaves_a_file_that_does_not_load(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "alice", &a));
    append(a, 20, 1);
    const char *path = path_of("alice.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    kvm_alloc_fail_at(0, 0);
    assert_ok(kvmem_agent_save(a, path));
    uint64_t calls = kvm_alloc_calls();
    assert_true(calls > 3);
    int failed = 0;
    for (uint64_t n = 1; n <= calls; n++) {
        kvm_alloc_fail_at(n, 0);
        kvmem_status st = kvmem_agent_save(a, path);
        kvm_alloc_fail_at(0, 0);
        if (st != KVMEM_OK) {
            failed++;
            assert_int_equal(st, KVMEM_ERR_NOMEM);
        }
        /* into alice herself: the file is hers, and reloading her own
         * memory changes nothing when it is intact */
        if (kvmem_agent_load(a, path) != KVMEM_OK)
            fail_msg("allocation %llu failed: the save left a file that does not load: %s", (unsigned long long)n,
                     kvmem_last_error());
    }
    assert_int_equal(failed, (int)calls); /* no allocation of a save is optional */
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* The directory store's key-path helper allocated, and its callers said
 * INVALID_ARG "out of memory"; now it needs no memory, so a stored agent
 * can be removed, and a unit of a segment store dropped, with every
 * allocation failing. */
static void removing_a_stored_agent_needs_no_memory(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    char store[300];
    snprintf(store, sizeof store, "%s/store1", g_dir);
    mkdir(store, 0700);
    kvmem_pool *p = make_pool(ctx, store);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "bob", &a));
    append(a, 9, 2);
    assert_ok(kvmem_agent_save(a, NULL));
    kvmem_agent_close(a);
    kvm_alloc_fail_at(1, 1); /* every allocation fails */
    kvmem_status st = kvmem_pool_remove_agent(p, "bob");
    kvm_alloc_fail_at(0, 0);
    if (st != KVMEM_OK) fail_msg("remove with no memory: %s (%s)", kvmem_status_str(st), kvmem_last_error());
    struct stat sb;
    assert_int_equal(stat(path_of("store1/bob.safetensors"), &sb), -1);
    /* an agent that is only in the store: exists/open path, failing memory
     * gives NOMEM, never INVALID_ARG */
    assert_ok(kvmem_agent_open(p, "carol", &a));
    append(a, 9, 3);
    assert_ok(kvmem_agent_save(a, NULL));
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    p = make_pool(ctx, store);
    kvm_alloc_fail_at(0, 0);
    assert_ok(kvmem_agent_open(p, "carol", &a));
    uint64_t calls = kvm_alloc_calls();
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    for (uint64_t n = 1; n <= calls; n++) {
        p = make_pool(ctx, store);
        kvm_alloc_fail_at(n, 0);
        st = kvmem_agent_open(p, "carol", &a);
        kvm_alloc_fail_at(0, 0);
        if (st == KVMEM_OK) kvmem_agent_close(a);
        else if (st != KVMEM_ERR_NOMEM)
            fail_msg("open from the store, allocation %llu failed: %s (%s)", (unsigned long long)n, kvmem_status_str(st),
                     kvmem_last_error());
        kvmem_pool_free(p);
    }
    kvmem_context_free(ctx);
}

/* kvmem_segments_free dropped its unit agents through the same helper and
 * forgot them when the removal failed: the units stayed in the pool. */
static void segments_free_removes_its_units_even_without_memory(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    char store[300];
    snprintf(store, sizeof store, "%s/store2", g_dir);
    mkdir(store, 0700);
    kvmem_pool *p = make_pool(ctx, store);
    kvmem_segments *s;
    assert_ok(kvmem_segments_create(p, "own", NULL, &s));
    int32_t idx;
    assert_ok(kvmem_segments_add(s, "seg", 0, &idx));
    size_t n = (size_t)L_ * 5 * H_ * D_;
    float *k = calloc(n, 4), *v = calloc(n, 4);
    kvmem_tensor tk, tv;
    int64_t shape[4] = {L_, 5, H_, D_};
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
    assert_ok(kvmem_segments_store_segment(s, idx, &tk, &tv, NULL));
    free(k), free(v);
    assert_ok(kvmem_pool_sync(p)); /* the unit is in the store too */
    kvm_alloc_fail_at(1, 1);
    kvmem_segments_free(s);
    kvm_alloc_fail_at(0, 0);
    kvmem_pool_info pi;
    assert_ok(kvmem_pool_get_info(p, &pi));
    assert_int_equal(pi.n_agents, 0);
    /* a new store for the same owner starts: nothing with its prefix is left */
    assert_ok(kvmem_segments_create(p, "own", NULL, &s));
    kvmem_segments_free(s);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* The JSON reader said FORMAT "out of memory": a caller that deletes files
 * on FORMAT would delete a good file. */
static void json_out_of_memory_is_nomem_not_format(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "dave", &a));
    append(a, 12, 4);
    const char *path = path_of("dave.safetensors");
    assert_ok(kvmem_agent_save(a, path));
    kvm_alloc_fail_at(0, 0);
    assert_ok(kvmem_agent_load(a, path));
    uint64_t calls = kvm_alloc_calls();
    for (uint64_t n = 1; n <= calls; n++)
        for (int from_on = 0; from_on < 2; from_on++) {
            kvm_alloc_fail_at(n, from_on);
            kvmem_status st = kvmem_agent_load(a, path);
            kvm_alloc_fail_at(0, 0);
            if (st != KVMEM_OK && st != KVMEM_ERR_NOMEM)
                fail_msg("load, allocation %llu%s failed: %s (%s)", (unsigned long long)n, from_on ? " on" : "",
                         kvmem_status_str(st), kvmem_last_error());
        }
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "hung: alarm fired (a growth loop spins or an open blocks)\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

/* text_len > SIZE_MAX/2 made the doubling loop of the text buffer wrap to
 * 0 and spin forever. */
static void huge_text_len_returns_instead_of_spinning(void **state) {
    (void)state;
    signal(SIGALRM, on_alarm);
    alarm(30);
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "erin", &a));
    append(a, 3, 5);
    kvmem_agent_info before, after;
    assert_ok(kvmem_agent_get_info(a, &before));
    float kv[1];
    kvmem_tensor tk;
    int64_t shape[4] = {L_, 0, H_, D_};
    assert_ok(kvmem_tensor_init(&tk, kv, KVMEM_F32, 4, shape));
    kvmem_append_params ap = kvmem_append_default_params();
    ap.text = "x"; /* never read: no buffer of that size exists */
    ap.text_len = SIZE_MAX / 2 + 2;
    assert_status(kvmem_agent_append(a, &tk, &tk, &ap), KVMEM_ERR_INVALID_ARG, "text_len");
    ap.text_len = SIZE_MAX - 5;
    assert_status(kvmem_agent_append(a, &tk, &tk, &ap), KVMEM_ERR_INVALID_ARG, "text_len");
    /* addressable in principle: the growth is computed without wrapping and
     * the allocation of ~2^63 bytes fails (failed by the hook here: the
     * sanitizers' allocators abort on such a request instead of failing) */
    ap.text_len = (size_t)PTRDIFF_MAX - 100;
    kvm_alloc_fail_at(1, 1);
    kvmem_status st = kvmem_agent_append(a, &tk, &tk, &ap);
    kvm_alloc_fail_at(0, 0);
    assert_int_equal(st, KVMEM_ERR_NOMEM);
    assert_ok(kvmem_agent_get_info(a, &after));
    assert_memory_equal(&before, &after, sizeof before);
    alarm(0);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* Replace `from` (once) in the JSON header of an agent file by `to` and fix
 * the header length. */
static void edit_header(const char *src, const char *dst, const char *from, const char *to) {
    size_t n;
    unsigned char *b = read_all(src, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    char *hdr = malloc(hl + 1);
    memcpy(hdr, b + 8, hl);
    hdr[hl] = '\0';
    char *at = strstr(hdr, from);
    assert_non_null(at);
    size_t nh = hl - strlen(from) + strlen(to);
    unsigned char *o = malloc(8 + nh + (n - 8 - hl));
    for (int i = 0; i < 8; i++) o[i] = (unsigned char)((uint64_t)nh >> (8 * i));
    size_t pre = (size_t)(at - hdr);
    memcpy(o + 8, hdr, pre);
    memcpy(o + 8 + pre, to, strlen(to));
    memcpy(o + 8 + pre + strlen(to), at + strlen(from), hl - pre - strlen(from));
    memcpy(o + 8 + nh, b + 8 + hl, n - 8 - hl);
    write_all(dst, o, 8 + nh + (n - 8 - hl));
    free(b), free(hdr), free(o);
}

/* "alice\u0000-evil" in a file's agent_id was cut at the NUL: the file
 * loaded into agent "alice". Any NUL in a header string is refused. */
static void loader_refuses_a_nul_inside_any_metadata_string(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "alice", &a));
    append(a, 10, 6);
    const char *good = path_of("nul-good.safetensors"), *bad = path_of("nul-bad.safetensors");
    assert_ok(kvmem_agent_save(a, good));
    edit_header(good, bad, "\"agent_id\":\"alice\"", "\"agent_id\":\"alice\\u0000-evil\"");
    assert_status(kvmem_agent_load(a, bad), KVMEM_ERR_FORMAT, "NUL");
    edit_header(good, bad, "\"format\":\"kvmem-agent\"", "\"format\":\"kvmem-agent\\u0000x\"");
    assert_status(kvmem_agent_load(a, bad), KVMEM_ERR_FORMAT, "NUL");
    edit_header(good, bad, "\"text\":\"", "\"text\":\"\\u0000");
    assert_status(kvmem_agent_load(a, bad), KVMEM_ERR_FORMAT, "NUL");
    assert_ok(kvmem_agent_load(a, good)); /* the untouched file still loads */
    /* ids are C strings everywhere in the API: the one with a NUL is just "alice" */
    assert_int_equal(kvmem_agent_id_valid("alice\0-evil"), 1);
    assert_int_equal(kvmem_agent_id_valid("alice-evil\x01"), 0);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* kvmem_agent_load on a FIFO opened it first and blocked forever waiting
 * for a writer; kvmem_agent_save renamed over whatever had the name. */
static void fifos_and_other_non_regular_files_are_refused_without_blocking(void **state) {
    (void)state;
    signal(SIGALRM, on_alarm);
    alarm(30);
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "frank", &a));
    append(a, 10, 7);
    const char *fifo = path_of("frank.fifo"), *link = path_of("frank.link"), *dir = path_of("frank.dir");
    const char *file = path_of("frank.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_status(kvmem_agent_load(a, fifo), KVMEM_ERR_IO, "FIFO");
    assert_status(kvmem_agent_save(a, fifo), KVMEM_ERR_INVALID_ARG, "FIFO");
    struct stat sb;
    assert_int_equal(lstat(fifo, &sb), 0);
    assert_true(S_ISFIFO(sb.st_mode)); /* still the FIFO */
    assert_ok(kvmem_agent_save(a, file));
    assert_int_equal(symlink(file, link), 0);
    assert_status(kvmem_agent_save(a, link), KVMEM_ERR_INVALID_ARG, "symbolic link");
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_ok(kvmem_agent_load(a, link)); /* reading through a link to a regular file is fine */
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_status(kvmem_agent_save(a, dir), KVMEM_ERR_INVALID_ARG, "directory");
    assert_status(kvmem_agent_load(a, dir), KVMEM_ERR_IO, "directory");
    if (access("/dev/null", R_OK) == 0) assert_status(kvmem_agent_load(a, "/dev/null"), KVMEM_ERR_IO, "device");
    alarm(0);
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* n_rows * stride was not checked: a stride of 2^62 floats made row 1's
 * offset wrap onto row 0, which was rotated twice and OK returned. */
static void rope_apply_refuses_a_stride_whose_offsets_wrap(void **state) {
    (void)state;
    kvmem_model_spec spec = tu_spec(1, D_);
    float x[D_], y[D_];
    for (int i = 0; i < D_; i++) x[i] = y[i] = (float)(i + 1);
    int32_t pos[2] = {3, 5};
    size_t wrap = (size_t)1 << (sizeof(size_t) * 8 - 2); /* * sizeof(float) = 2^64 */
    assert_status(kvmem_rope_apply(&spec, x, 2, wrap, pos, 0), KVMEM_ERR_INVALID_ARG, "stride");
    assert_memory_equal(x, y, sizeof x);
    assert_status(kvmem_rope_apply(&spec, x, 3, SIZE_MAX / 2, pos, 0), KVMEM_ERR_INVALID_ARG, "stride");
    assert_memory_equal(x, y, sizeof x);
    /* one row of any stride touches head_dim floats only: fine */
    assert_ok(kvmem_rope_apply(&spec, x, 1, wrap, pos, 0));
}

/* Loading /etc/passwd answered "header length 3475222254926655346": the
 * first 8 bytes of the file as a number. Messages name what was wrong. */
static void refusing_a_file_quotes_none_of_its_bytes(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(1);
    kvmem_pool *p = make_pool(ctx, NULL);
    kvmem_agent *a;
    assert_ok(kvmem_agent_open(p, "gina", &a));
    const char *path = path_of("passwd");
    const char *text = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n";
    write_all(path, text, strlen(text));
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | (unsigned char)text[i];
    char num[32];
    snprintf(num, sizeof num, "%llu", (unsigned long long)hl);
    assert_int_equal(kvmem_agent_load(a, path), KVMEM_ERR_FORMAT);
    if (strstr(kvmem_last_error(), num) || strstr(kvmem_last_error(), "root"))
        fail_msg("the message quotes the file: %s", kvmem_last_error());
    /* a plausible length, then JSON that breaks on a byte: the byte is not named */
    unsigned char img[64] = {0};
    img[0] = 7;
    memcpy(img + 8, "{\"a\":\x01}", 7);
    write_all(path, img, 8 + 7);
    assert_int_equal(kvmem_agent_load(a, path), KVMEM_ERR_FORMAT);
    if (strstr(kvmem_last_error(), "0x01") || strstr(kvmem_last_error(), "\x01"))
        fail_msg("the message quotes the file: %s", kvmem_last_error());
    /* and a length past the end is reported without the number */
    img[0] = 0;
    img[1] = 0x40; /* 16384 */
    write_all(path, img, 24);
    assert_int_equal(kvmem_agent_load(a, path), KVMEM_ERR_CORRUPT);
    if (strstr(kvmem_last_error(), "16384")) fail_msg("the message quotes the file: %s", kvmem_last_error());
    kvmem_agent_close(a);
    kvmem_pool_free(p);
    kvmem_context_free(ctx);
}

/* kvmem_qmem_score took NaN keys and, on the SIMD tables, returned
 * plausible scores (the max skipped the NaN, the exp clamped it). Unit
 * tests run once per CPU kernel table, so each table is held to it. */
static void non_finite_keys_reach_no_score(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec spec = tu_spec(L_, D_);
    enum { N = 40 };
    const size_t nk = (size_t)L_ * N * H_ * D_;
    float *k = malloc(nk * 4), mem[L_ * 4 * D_], sc[N], keep[N];
    uint64_t rng = 9;
    tu_fill_kv(k, nk, &rng);
    tu_fill_kv(mem, sizeof mem / 4, &rng);
    kvmem_tensor kt;
    int64_t shape[4] = {L_, N, H_, D_};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape));
    float bad[3] = {NAN, INFINITY, -INFINITY};
    size_t where[3] = {5, nk / 2 + 3, nk - 1};
    for (int b = 0; b < 3; b++) {
        for (int i = 0; i < N; i++) sc[i] = keep[i] = (float)i;
        float old = k[where[b]];
        k[where[b]] = bad[b];
        assert_status(kvmem_qmem_score(ctx, &spec, mem, &kt, sc), KVMEM_ERR_INVALID_ARG, "non-finite");
        assert_memory_equal(sc, keep, sizeof sc); /* scores untouched */
        /* SnapKV reads the same logits */
        float qobs[2 * L_ * 4 * D_];
        tu_fill_kv(qobs, sizeof qobs / 4, &rng);
        kvmem_tensor qt;
        int64_t qs[4] = {2, L_, 4, D_};
        assert_ok(kvmem_tensor_init(&qt, qobs, KVMEM_F32, 4, qs));
        assert_status(kvmem_snapkv_score(ctx, &spec, &qt, &kt, 3, sc), KVMEM_ERR_INVALID_ARG, "non-finite");
        k[where[b]] = old;
    }
    assert_ok(kvmem_qmem_score(ctx, &spec, mem, &kt, sc));
    for (int i = 0; i < N; i++) assert_true(isfinite(sc[i]));
    free(k);
    kvmem_context_free(ctx);
}

/* kvmem_attend with a TENSORS source and NaN K returned plausible outputs
 * on the SIMD tables. Stated behaviour (kvmem.h): a non-finite K or V at a
 * position the call reads is refused, the output untouched; a position it
 * never reads (here: masked) is not scanned. */
static void attention_refuses_non_finite_kv_it_reads_and_skips_what_it_does_not(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    enum { T = 48, HQ = 4 };
    static float k[T * H_ * D_], v[T * H_ * D_], q[HQ * D_], o[HQ * D_], ref[HQ * D_];
    uint64_t rng = 10;
    tu_fill_kv(k, T * H_ * D_, &rng);
    tu_fill_kv(v, T * H_ * D_, &rng);
    tu_fill_kv(q, HQ * D_, &rng);
    kvmem_tensor kt, vt, qt, ot;
    int64_t s3[3] = {T, H_, D_}, sq[3] = {1, HQ, D_};
    assert_ok(kvmem_tensor_init(&kt, k, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init(&vt, v, KVMEM_F32, 3, s3));
    assert_ok(kvmem_tensor_init(&qt, q, KVMEM_F32, 3, sq));
    assert_ok(kvmem_tensor_init(&ot, o, KVMEM_F32, 3, sq));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &kt;
    src.v = &vt;
    static uint8_t mask[T];
    for (int i = 0; i < T; i++) mask[i] = i != 20;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.tile_size = 8;
    ap.tau_s = ap.tau_d = 0; /* read everything that is not masked */
    src.mask = mask;
    assert_ok(kvmem_attend(ctx, &qt, &src, &ap, &ot, NULL));
    memcpy(ref, o, sizeof o);
    /* NaN / Inf at a read position, in K (newest tile, a middle one) and in V */
    size_t at[4] = {(size_t)(T - 1) * H_ * D_ + 3, (size_t)9 * H_ * D_ + D_ + 1, (size_t)(T - 2) * H_ * D_, 2};
    for (int c = 0; c < 4; c++) {
        float *arr = c < 2 ? k : v;
        float old = arr[at[c]];
        arr[at[c]] = c == 1 ? INFINITY : NAN;
        memset(o, 0x5a, sizeof o);
        unsigned char canary[sizeof o];
        memcpy(canary, o, sizeof o);
        assert_status(kvmem_attend(ctx, &qt, &src, &ap, &ot, NULL), KVMEM_ERR_INVALID_ARG, "not finite");
        assert_memory_equal(o, canary, sizeof o);
        arr[at[c]] = old;
    }
    /* masked position 20: never read, never scanned, the same result */
    k[(size_t)20 * H_ * D_ + 2] = NAN;
    v[(size_t)20 * H_ * D_ + 5] = NAN;
    assert_ok(kvmem_attend(ctx, &qt, &src, &ap, &ot, NULL));
    assert_memory_equal(o, ref, sizeof o);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(save_that_cannot_allocate_never_leaves_a_file_that_does_not_load),
        cmocka_unit_test(removing_a_stored_agent_needs_no_memory),
        cmocka_unit_test(segments_free_removes_its_units_even_without_memory),
        cmocka_unit_test(json_out_of_memory_is_nomem_not_format),
        cmocka_unit_test(huge_text_len_returns_instead_of_spinning),
        cmocka_unit_test(loader_refuses_a_nul_inside_any_metadata_string),
        cmocka_unit_test(fifos_and_other_non_regular_files_are_refused_without_blocking),
        cmocka_unit_test(rope_apply_refuses_a_stride_whose_offsets_wrap),
        cmocka_unit_test(refusing_a_file_quotes_none_of_its_bytes),
        cmocka_unit_test(non_finite_keys_reach_no_score),
        cmocka_unit_test(attention_refuses_non_finite_kv_it_reads_and_skips_what_it_does_not),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

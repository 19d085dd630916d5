/* Two builds of libkvmem in one process: kvmem_gather and the slot maps'
 * eviction timed call by call, A and B alternating, on the same data and
 * the same output buffers.
 *
 *   cc -O2 -Iinclude scripts/bench-ab.c -o bench-ab -ldl
 *   ./bench-ab [--json] [--quick] [--rounds N] OLD/libkvmem.so NEW/libkvmem.so
 *
 * Why: on a shared machine, two processes run one after the other see
 * different neighbours, page placement and frequency; rows of a few percent
 * move by more than that between runs (scripts/bench-interleave.py shows
 * it). Here both libraries run in one process (dlopen, RTLD_LOCAL), each call
 * of A next to a call of B, so what differs is the code. Each row reports the
 * two medians and the median of the per-round ratios B / A, and whether the
 * two builds gave the same result (they must: the redesign changes no result).
 *
 * Rows: gathers from an agent in memory (32 blocks of 16 tokens, outputs
 * f32/f16/bf16, contiguous [L][M][H][D] and head-major [L][H][M][D] as HF
 * caches are) and from the same agent opened in place with
 * kvmem_agent_open_file (8 blocks: a decode step's selection). Geometry
 * Llama-3.1-8B (32 layers, 8 KV heads, head_dim 128), 4096 tokens stored as
 * f16, one thread; --quick: 2 layers, 512 tokens, 5 rounds. Then eviction
 * applied to a slot map of 2^20 positions (2^14 with --quick), every other
 * one kept, as kvmem_slotmap_evict and as kvmem_slotmap_compact (the evict
 * suite's "apply" case, whose half is random); their "equal" is the number
 * of slots freed.
 *
 * Only ABI calls both builds have are used; the pool's params are sized to
 * the largest struct_size the library accepts ("ABI and versioning"). */
#define _GNU_SOURCE
#include "kvmem.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct lib {
    const char *path;
    void *h;
    kvmem_status (*ctx_init)(kvmem_context_params *, size_t);
    kvmem_status (*ctx_create)(const kvmem_context_params *, kvmem_context **);
    void (*ctx_free)(kvmem_context *);
    kvmem_model_spec (*spec_default)(void);
    kvmem_status (*pool_init)(kvmem_pool_params *, size_t);
    kvmem_status (*pool_create)(kvmem_context *, const kvmem_model_spec *, const kvmem_pool_params *, kvmem_pool **);
    void (*pool_free)(kvmem_pool *);
    kvmem_status (*agent_open)(kvmem_pool *, const char *, kvmem_agent **);
    kvmem_status (*append)(kvmem_agent *, const kvmem_tensor *, const kvmem_tensor *, const int32_t *);
    kvmem_status (*flush)(kvmem_agent *);
    kvmem_status (*save)(kvmem_agent *, const char *);
    kvmem_status (*open_file)(kvmem_pool *, const char *, uint32_t, kvmem_agent **);
    kvmem_status (*gather)(kvmem_agent *, const int32_t *, int32_t, int64_t, const kvmem_tensor *, const kvmem_tensor *);
    kvmem_status (*store_create)(const kvmem_model_spec *, const kvmem_kvstore_params *, kvmem_kvstore **);
    void (*store_free)(kvmem_kvstore *);
    kvmem_status (*map_create)(kvmem_kvstore *, kvmem_slotmap **);
    void (*map_free)(kvmem_slotmap *);
    kvmem_status (*map_append)(kvmem_slotmap *, const kvmem_tensor *, const kvmem_tensor *);
    kvmem_status (*map_protect)(kvmem_slotmap *, int64_t);
    kvmem_status (*map_evict)(kvmem_slotmap *, const int32_t *, int64_t, int64_t *);
    kvmem_status (*map_compact)(kvmem_slotmap *, const int32_t *, int64_t, int64_t *);
    const char *(*err)(void);
    kvmem_context *ctx;
    kvmem_kvstore *store;
    kvmem_pool *pool, *map_pool;
    kvmem_agent *mem, *map;
} lib;

typedef struct geom {
    int L, H, D, T, BS;
} geom;

static const int HQ = 32;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The agent files written so far, removed however the run ends (die exits). */
static char files[2][256];

static void remove_files(void) {
    for (int i = 0; i < 2; i++)
        if (files[i][0]) unlink(files[i]);
}

static void die(const lib *l, const char *what) {
    fprintf(stderr, "bench-ab: %s: %s: %s\n", l->path, what, l->err ? l->err() : dlerror());
    exit(1);
}

static void *sym(lib *l, const char *name) {
    void *p = dlsym(l->h, name);
    if (!p) die(l, name);
    return p;
}

/* The same T tokens of KV in both builds (an LCG, as the bench suites use). */
static void fill(float *k, float *v, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        k[i] = (float)((int64_t)(*s >> 40) - (1 << 23)) / (float)(1 << 22);
        v[i] = k[i] * 0.5f;
    }
}

static void setup(lib *l, const geom *g, char tag) {
    l->h = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
    if (!l->h) die(l, "dlopen");
    *(void **)&l->ctx_init = sym(l, "kvmem_context_params_init");
    *(void **)&l->ctx_create = sym(l, "kvmem_context_create");
    *(void **)&l->ctx_free = sym(l, "kvmem_context_free");
    *(void **)&l->spec_default = sym(l, "kvmem_model_spec_default");
    *(void **)&l->pool_init = sym(l, "kvmem_pool_params_init");
    *(void **)&l->pool_create = sym(l, "kvmem_pool_create");
    *(void **)&l->pool_free = sym(l, "kvmem_pool_free");
    *(void **)&l->agent_open = sym(l, "kvmem_agent_open");
    *(void **)&l->append = sym(l, "kvmem_agent_append");
    *(void **)&l->flush = sym(l, "kvmem_agent_flush");
    *(void **)&l->save = sym(l, "kvmem_agent_save");
    *(void **)&l->open_file = sym(l, "kvmem_agent_open_file");
    *(void **)&l->gather = sym(l, "kvmem_gather");
    *(void **)&l->err = sym(l, "kvmem_last_error");
    *(void **)&l->store_create = sym(l, "kvmem_kvstore_create");
    *(void **)&l->store_free = sym(l, "kvmem_kvstore_free");
    *(void **)&l->map_create = sym(l, "kvmem_slotmap_create");
    *(void **)&l->map_free = sym(l, "kvmem_slotmap_free");
    *(void **)&l->map_append = sym(l, "kvmem_slotmap_append");
    *(void **)&l->map_protect = sym(l, "kvmem_slotmap_set_protected");
    *(void **)&l->map_evict = sym(l, "kvmem_slotmap_evict");
    *(void **)&l->map_compact = sym(l, "kvmem_slotmap_compact");
    kvmem_context_params cp;
    if (l->ctx_init(&cp, sizeof cp) != KVMEM_OK) die(l, "kvmem_context_params_init");
    cp.backend = "cpu";
    cp.n_threads = 1;
    if (l->ctx_create(&cp, &l->ctx) != KVMEM_OK) die(l, "kvmem_context_create");
    kvmem_model_spec s = l->spec_default();
    s.n_layers = g->L;
    s.n_q_heads = HQ;
    s.n_kv_heads = g->H;
    s.head_dim = g->D;
    s.rope_theta = 500000.0;
    kvmem_pool_params pp;
    size_t sz = sizeof pp; /* an older build knows a shorter struct */
    while (sz >= 16 && l->pool_init(&pp, sz) != KVMEM_OK) sz -= 8;
    if (sz < 16) die(l, "kvmem_pool_params_init");
    pp.block_size = g->BS;
    pp.storage_dtype = KVMEM_F16;
    if (l->pool_create(l->ctx, &s, &pp, &l->pool) != KVMEM_OK || l->pool_create(l->ctx, &s, &pp, &l->map_pool) != KVMEM_OK)
        die(l, "kvmem_pool_create");
    if (l->agent_open(l->pool, "ab", &l->mem) != KVMEM_OK) die(l, "kvmem_agent_open");
    const int chunk = 256;
    const size_t cn = (size_t)g->L * chunk * g->H * g->D;
    float *k = malloc(cn * sizeof *k), *v = malloc(cn * sizeof *v);
    if (!k || !v) die(l, "out of memory");
    uint64_t seed = 7;
    for (int t0 = 0; t0 < g->T; t0 += chunk) {
        fill(k, v, cn, &seed);
        kvmem_tensor tk, tv;
        memset(&tk, 0, sizeof tk);
        tk.data = k;
        tk.dtype = KVMEM_F32;
        tk.ndim = 4;
        const int64_t shape[4] = {g->L, chunk, g->H, g->D};
        for (int i = 3; i >= 0; i--) {
            tk.shape[i] = shape[i];
            tk.strides[i] = i == 3 ? 1 : tk.strides[i + 1] * shape[i + 1];
        }
        tv = tk;
        tv.data = v;
        if (l->append(l->mem, &tk, &tv, NULL) != KVMEM_OK) die(l, "kvmem_agent_append");
    }
    free(k);
    free(v);
    if (l->flush(l->mem) != KVMEM_OK) die(l, "kvmem_agent_flush");
    const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char *file = files[tag - 'a'];
    snprintf(file, sizeof files[0], "%s/bench-ab-%ld-%c.safetensors", tmp, (long)getpid(), tag);
    if (l->save(l->mem, file) != KVMEM_OK) die(l, "kvmem_agent_save");
    if (l->open_file(l->map_pool, file, 0, &l->map) != KVMEM_OK) die(l, "kvmem_agent_open_file");
    /* the slot maps' store: one layer, one head of 8 (the evict suite's) */
    kvmem_model_spec ss = l->spec_default();
    ss.n_layers = ss.n_q_heads = ss.n_kv_heads = 1;
    ss.head_dim = 8;
    if (l->store_create(&ss, NULL, &l->store) != KVMEM_OK) die(l, "kvmem_kvstore_create");
}

static void teardown(lib *l) {
    l->store_free(l->store);
    l->pool_free(l->map_pool); /* closes the mapped agent's file */
    l->pool_free(l->pool);
    l->ctx_free(l->ctx);
}

typedef struct row {
    int mapped; /* 0: the agent in memory, 1: the one opened in place */
    int n_blocks;
    kvmem_dtype dt;
    int head_major;
} row;

static const char *dtype_name(kvmem_dtype dt) { return dt == KVMEM_F32 ? "f32" : dt == KVMEM_F16 ? "f16" : "bf16"; }

/* Output tensor [L][M][H][D] over buf, head-major strides when asked. */
static kvmem_tensor out_tensor(const geom *g, const row *r, void *buf) {
    const int64_t M = (int64_t)r->n_blocks * g->BS;
    kvmem_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.dtype = r->dt;
    t.ndim = 4;
    t.shape[0] = g->L, t.shape[1] = M, t.shape[2] = g->H, t.shape[3] = g->D;
    t.strides[3] = 1;
    if (r->head_major) t.strides[1] = g->D, t.strides[2] = M * g->D, t.strides[0] = (int64_t)g->H * M * g->D;
    else t.strides[2] = g->D, t.strides[1] = (int64_t)g->H * g->D, t.strides[0] = M * g->H * g->D;
    return t;
}

static double timed(const lib *l, const geom *g, const row *r, const int32_t *blocks, void *kb, void *vb) {
    const kvmem_tensor tk = out_tensor(g, r, kb), tv = out_tensor(g, r, vb);
    const double t0 = now();
    if (l->gather(r->mapped ? l->map : l->mem, blocks, r->n_blocks, g->T, &tk, &tv) != KVMEM_OK)
        die(l, "kvmem_gather");
    return now() - t0;
}

/* A slot map of n positions (the evict suite's fill), 4 protected. */
static kvmem_slotmap *filled_map(const lib *l, int64_t n, float *rows) {
    kvmem_slotmap *m = NULL;
    if (l->map_create(l->store, &m) != KVMEM_OK) die(l, "kvmem_slotmap_create");
    for (int64_t at = 0; at < n; at += 4096) {
        kvmem_tensor t;
        memset(&t, 0, sizeof t);
        t.data = rows;
        t.dtype = KVMEM_F32;
        t.ndim = 4;
        t.shape[0] = 1, t.shape[1] = n - at < 4096 ? n - at : 4096, t.shape[2] = 1, t.shape[3] = 8;
        t.strides[3] = 1, t.strides[2] = 8, t.strides[1] = 8, t.strides[0] = t.shape[1] * 8;
        if (l->map_append(m, &t, &t) != KVMEM_OK) die(l, "kvmem_slotmap_append");
    }
    if (l->map_protect(m, 4) != KVMEM_OK) die(l, "kvmem_slotmap_set_protected");
    return m;
}

/* kvmem_slotmap_evict (compact = 0) or _compact of a fresh map: seconds, and the slots freed. */
static double timed_map(const lib *l, int compact, int64_t n, float *rows, const int32_t *kept, int64_t n_kept,
                        int64_t *freed) {
    kvmem_slotmap *m = filled_map(l, n, rows);
    const double t0 = now();
    const kvmem_status st = (compact ? l->map_compact : l->map_evict)(m, kept, n_kept, freed);
    const double t = now() - t0;
    if (st != KVMEM_OK) die(l, compact ? "kvmem_slotmap_compact" : "kvmem_slotmap_evict");
    l->map_free(m);
    return t;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *x, int n) {
    double *t = malloc((size_t)n * sizeof *t);
    if (!t) return 0;
    memcpy(t, x, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    const double m = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    free(t);
    return m;
}

/* One round's call of a build: seconds. */
typedef double (*round_fn)(const lib *l, const void *ctx);

/* rounds rounds of A and B, who goes first alternating: the medians and the
 * median of the per-round B / A. */
static void alternate(const lib *a, const lib *b, int rounds, round_fn fn, const void *ctx, double out[3]) {
    double *ta = malloc((size_t)rounds * 3 * sizeof *ta), *tb = ta + rounds, *ratio = tb + rounds;
    if (!ta) die(a, "out of memory");
    for (int k = 0; k < rounds; k++) {
        const double t1 = fn(k % 2 ? b : a, ctx), t2 = fn(k % 2 ? a : b, ctx);
        ta[k] = k % 2 ? t2 : t1;
        tb[k] = k % 2 ? t1 : t2;
        ratio[k] = tb[k] / ta[k];
    }
    out[0] = median(ta, rounds), out[1] = median(tb, rounds), out[2] = median(ratio, rounds);
    free(ta);
}

/* fields: the row's JSON keys (after "suite"), name: its text label */
static void report(int json, const char *fields, const char *name, int rounds, const double m[3], int equal) {
    if (json)
        printf("{\"suite\":\"ab\",%s,\"rounds\":%d,\"a_ms\":%.4f,\"b_ms\":%.4f,\"b_over_a\":%.4f,"
               "\"paired_b_over_a\":%.4f,\"outputs_equal\":%d}\n",
               fields, rounds, m[0] * 1e3, m[1] * 1e3, m[1] / m[0], m[2], equal);
    else
        printf("%-36s %9.3f %9.3f %7.3f %7.3f %s\n", name, m[0] * 1e3, m[1] * 1e3, m[1] / m[0], m[2], equal ? "yes" : "NO");
    fflush(stdout);
}

typedef struct gather_ctx {
    const geom *g;
    const row *r;
    const int32_t *blocks;
    void *kb, *vb;
} gather_ctx;

static double gather_round(const lib *l, const void *ctx) {
    const gather_ctx *c = ctx;
    return timed(l, c->g, c->r, c->blocks, c->kb, c->vb);
}

typedef struct map_ctx {
    int compact;
    int64_t n, n_kept;
    float *rows;
    const int32_t *kept;
} map_ctx;

static double map_round(const lib *l, const void *ctx) {
    const map_ctx *c = ctx;
    int64_t freed;
    return timed_map(l, c->compact, c->n, c->rows, c->kept, c->n_kept, &freed);
}

int main(int argc, char **argv) {
    int json = 0, quick = 0, rounds = 0;
    const char *paths[2] = {NULL, NULL};
    int np = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (argv[i][0] != '-' && np < 2) paths[np++] = argv[i];
        else np = 3;
    }
    if (np != 2 || rounds < 0 || rounds > 1000) {
        fprintf(stderr, "usage: %s [--json] [--quick] [--rounds N] LIB_A LIB_B\n", argv[0]);
        return 2;
    }
    if (!rounds) rounds = quick ? 5 : 41;
    const geom g = quick ? (geom){2, 8, 128, 512, 16} : (geom){32, 8, 128, 4096, 16};
    atexit(remove_files);
    lib a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    a.path = paths[0];
    b.path = paths[1];
    setup(&a, &g, 'a');
    setup(&b, &g, 'b');
    const row rows[] = {
        {0, 32, KVMEM_F32, 0}, {0, 32, KVMEM_F32, 1}, {0, 32, KVMEM_F16, 0}, {0, 32, KVMEM_F16, 1}, {0, 32, KVMEM_BF16, 0},
        {0, 32, KVMEM_BF16, 1}, {1, 8, KVMEM_F32, 0},  {1, 8, KVMEM_F16, 1},  {0, 8, KVMEM_F32, 0},
    };
    const size_t out_bytes = (size_t)g.L * 32 * g.BS * g.H * g.D * sizeof(float);
    unsigned char *buf[4];
    for (int i = 0; i < 4; i++)
        if (!(buf[i] = malloc(out_bytes))) die(&a, "out of memory");
    /* distinct blocks in a scattered order, as a retrieval returns them */
    int32_t blocks[32];
    uint64_t s = 99;
    for (int i = 0; i < 32; i++)
        for (int dup = 1; dup;) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            blocks[i] = (int32_t)((s >> 33) % (uint64_t)(g.T / g.BS));
            dup = 0;
            for (int j = 0; j < i; j++) dup |= blocks[j] == blocks[i];
        }
    if (!json) printf("A %s\nB %s\n%-36s %9s %9s %7s %7s %s\n", a.path, b.path, "row", "A ms", "B ms", "B/A", "paired", "equal");
    int all_equal = 1;
    for (size_t ri = 0; ri < sizeof rows / sizeof *rows; ri++) {
        const row *r = &rows[ri];
        /* the two builds' outputs, each from bytes neither wrote */
        for (int i = 0; i < 4; i++) memset(buf[i], 0xA5 + i, out_bytes);
        timed(&a, &g, r, blocks, buf[0], buf[1]);
        timed(&b, &g, r, blocks, buf[2], buf[3]);
        const size_t used = (size_t)g.L * (size_t)r->n_blocks * g.BS * g.H * g.D * (r->dt == KVMEM_F32 ? 4 : 2);
        const int equal = !memcmp(buf[0], buf[2], used) && !memcmp(buf[1], buf[3], used);
        all_equal &= equal;
        const gather_ctx c = {&g, r, blocks, buf[0], buf[1]};
        double m[3];
        alternate(&a, &b, rounds, gather_round, &c, m);
        const char *source = r->mapped ? "mapped" : "memory", *layout = r->head_major ? "head_major" : "contiguous";
        char fields[256], name[64];
        snprintf(fields, sizeof fields,
                 "\"op\":\"gather\",\"source\":\"%s\",\"blocks\":%d,\"tokens\":%d,\"n_layers\":%d,\"dtype\":\"%s\",\"layout\":\"%s\"",
                 source, r->n_blocks, r->n_blocks * g.BS, g.L, dtype_name(r->dt), layout);
        snprintf(name, sizeof name, "%s %2d blocks %-4s %s", source, r->n_blocks, dtype_name(r->dt), layout);
        report(json, fields, name, rounds, m, equal);
    }
    /* eviction applied to a slot map: keep half of n positions, the 4
     * protected ones, the last 64 and every other one in between */
    const int64_t n = quick ? (int64_t)1 << 14 : (int64_t)1 << 20;
    float *chunk = calloc((size_t)4096 * 8, sizeof *chunk);
    int32_t *kept = malloc((size_t)n * sizeof *kept);
    if (!chunk || !kept) die(&a, "out of memory");
    int64_t n_kept = 0;
    for (int64_t j = 0; j < n; j++)
        if (j < 4 || j >= n - 64 || j % 2 == 0) kept[n_kept++] = (int32_t)j;
    for (int compact = 0; compact < 2; compact++) {
        int64_t fa = -1, fb = -2;
        timed_map(&a, compact, n, chunk, kept, n_kept, &fa);
        timed_map(&b, compact, n, chunk, kept, n_kept, &fb);
        const int equal = fa == fb;
        all_equal &= equal;
        const int mr = compact ? (rounds + 1) / 2 : rounds; /* compact is 30 times the work */
        const map_ctx c = {compact, n, n_kept, chunk, kept};
        double m[3];
        alternate(&a, &b, mr, map_round, &c, m);
        const char *op = compact ? "slotmap_compact" : "slotmap_evict";
        char fields[160], name[64];
        snprintf(fields, sizeof fields, "\"op\":\"%s\",\"positions\":%lld,\"kept\":%lld", op, (long long)n, (long long)n_kept);
        snprintf(name, sizeof name, "%s, %lld positions", op, (long long)n);
        report(json, fields, name, mr, m, equal);
    }
    free(chunk);
    free(kept);
    teardown(&a);
    teardown(&b);
    for (int i = 0; i < 4; i++) free(buf[i]);
    return all_equal ? 0 : 3;
}

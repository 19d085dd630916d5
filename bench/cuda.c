/* Suite "cuda": the CUDA backend against the device's own limits.
 *   device        name, compute capability, SMs, driver; device-to-device
 *                 copy bandwidth (bytes read + written per second), the
 *                 denominator of kv_gbps ratios
 *   selection     MemArt block selection for Llama-3.1-8B geometry (32 layers,
 *                 32/8 heads, head_dim 128), 14k and 128k tokens in blocks
 *                 of 16, 1 and 32 query tokens: query operand + fused
 *                 tensor-core scores with normalisation/aggregation + top-k
 *                 (target <= 0.2 ms at 14k, against MemArt's 117.5 ms)
 *   selection_f32 the same through the table entries the core uses
 *                 (dev_score in f32 on the CUDA cores, dev_topk)
 *   attend        decode attention (dev_attend, full: no early stop) over 32k
 *                 tokens of one layer: kv_gbps and kv_gbps / copy_gbps
 *                 (target >= 0.8)
 *   gather_rope   14k tokens gathered with RoPE, f16 in and out, GB/s moved
 * The PyTorch baselines on the same GPU come from bench/cuda_torch_baseline.py
 * (scripts/gpu-check.sh runs both). Without a usable GPU the suite prints
 * one line with "skipped" and the reason. */
#include "bench.h"
#include "backend/route/context.h"
#include "kvmem.h"
#include "../backends/cuda/kvmem_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    kvmem_backend *be;
    kvmem_status st;
} cu_env;

static void *get(kvmem_backend *be, const char *name) { return be->iface->get_proc_address(be, name); }

/* Wait for the device (the plugin's proc; the backend table has no such entry). */
static kvmem_status cu_sync(kvmem_backend *be) {
    kvmem_cuda_synchronize_fn f;
    *(void **)(&f) = get(be, KVMEM_CUDA_PROC_SYNCHRONIZE);
    return f ? f(be) : KVMEM_ERR_UNSUPPORTED;
}

static kvmem_buffer *dbuf(kvmem_backend *be, const void *host, size_t bytes) {
    kvmem_buffer *b = NULL;
    if (be->iface->buffer_alloc(be, bytes, &b) != KVMEM_OK) return NULL;
    if (host && be->iface->buffer_upload(be, b, 0, host, bytes) != KVMEM_OK) {
        be->iface->buffer_free(be, b);
        return NULL;
    }
    return b;
}

static kvmem_cuda_ref R(kvmem_buffer *b) {
    kvmem_cuda_ref r = {b, 0};
    return r;
}

/* A timed op: run it, then wait for the device. */
typedef struct {
    kvmem_backend *be;
    kvmem_status (*op)(void *);
    void *arg;
    kvmem_status st;
} timed;

static void run_synced(void *p) {
    timed *t = p;
    kvmem_status s = t->op(t->arg);
    if (s == KVMEM_OK) s = cu_sync(t->be);
    if (s != KVMEM_OK) t->st = s;
}

/* median seconds per call (each call synchronised), and the pipelined time
 * per call (n calls back to back, one synchronisation) */
static double time_op(timed *t, int reps, double *pipelined) {
    double med = kvm_time_median(run_synced, t, 3, reps);
    double t0 = kvm_now();
    for (int i = 0; i < reps && t->st == KVMEM_OK; i++) {
        kvmem_status s = t->op(t->arg);
        if (s != KVMEM_OK) t->st = s;
    }
    if (cu_sync(t->be) != KVMEM_OK) t->st = KVMEM_ERR_BACKEND;
    *pipelined = (kvm_now() - t0) / reps;
    return med;
}

/* ---- selection ---- */
typedef struct {
    kvmem_backend *be;
    kvmem_cuda_aabb_score_fn score;
    kvmem_cuda_topk_fn topk;
    kvmem_cuda_score_args sa;
    kvmem_cuda_topk_args ta;
} sel_arg;

static kvmem_status sel_op(void *p) {
    sel_arg *a = p;
    kvmem_status s = a->score(a->be, &a->sa);
    return s == KVMEM_OK ? a->topk(a->be, &a->ta) : s;
}

/* the table entries (what the core runs): f32 scores, then top-k */
typedef struct {
    kvmem_backend *be;
    kvm_dev_score_args sa;
    kvm_dev_topk_args ta;
} dsel_arg;
static kvmem_status dsel_op(void *p) {
    dsel_arg *a = p;
    kvmem_status s = a->be->iface->dev_score(a->be, &a->sa);
    return s == KVMEM_OK ? a->be->iface->dev_topk(a->be, &a->ta) : s;
}

typedef struct {
    kvmem_backend *be;
    kvm_dev_attend_args aa;
} att_arg;
static kvmem_status att_op(void *p) {
    att_arg *a = p;
    return a->be->iface->dev_attend(a->be, &a->aa);
}

typedef struct {
    kvmem_backend *be;
    kvmem_cuda_gather_rope_fn gather;
    kvmem_cuda_gather_args ga;
} gat_arg;
static kvmem_status gat_op(void *p) {
    gat_arg *a = p;
    return a->gather(a->be, &a->ga);
}

static const char *cu_msg(kvmem_backend *be) {
    kvmem_cuda_last_error_fn f;
    *(void **)(&f) = get(be, KVMEM_CUDA_PROC_LAST_ERROR);
    return f ? f() : "";
}

/* The fields every selection line has (the caller adds its own and ends it). */
static void sel_line(FILE *f, const char *name, int rr, int64_t tokens, int64_t nb, int64_t nq, int64_t k, double med,
                     double pip) {
    kvm_json_begin(f, "cuda");
    kvm_json_str(f, "case", name);
    kvm_json_str(f, "norm", rr ? "rr" : "softmax");
    kvm_json_str(f, "agg", "max");
    kvm_json_int(f, "tokens", tokens);
    kvm_json_int(f, "blocks", nb);
    kvm_json_int(f, "n_q", nq);
    kvm_json_int(f, "k", k);
    kvm_json_num(f, "ms", med * 1e3);
    kvm_json_num(f, "ms_pipelined", pip * 1e3);
    if (tokens == 14000) { /* MemArt's reported block selection, 14k tokens of Llama-3.1-8B */
        kvm_json_num(f, "target_ms", 0.2);
        kvm_json_num(f, "x_memart", 117.5 / (med * 1e3));
    }
}

static int fail(const kvm_bench_opts *o, kvmem_backend *be, const char *what) {
    kvm_json_begin(o->out, "cuda");
    kvm_json_str(o->out, "error", what);
    kvm_json_str(o->out, "detail", cu_msg(be));
    kvm_json_end(o->out);
    return 1;
}

static int run_cuda(const kvm_bench_opts *o) {
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cuda";
    kvmem_context *ctx = NULL;
    if (kvmem_context_create(&cp, &ctx) != KVMEM_OK) {
        kvm_json_begin(o->out, "cuda");
        kvm_json_str(o->out, "skipped", kvmem_last_error());
        kvm_json_end(o->out);
        if (!o->json) fprintf(stderr, "cuda: skipped: %s\n", kvmem_last_error());
        return 0;
    }
    kvmem_backend *be = ctx->backend;
    int rc = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
#define RNG_NORMAL() ((float)(((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f)

    /* ---- device and copy bandwidth ---- */
    kvmem_cuda_device_info_fn info_fn;
    kvmem_cuda_copy_gbps_fn copy_fn;
    *(void **)(&info_fn) = get(be, KVMEM_CUDA_PROC_DEVICE_INFO);
    *(void **)(&copy_fn) = get(be, KVMEM_CUDA_PROC_COPY_GBPS);
    kvmem_cuda_device_info di;
    double copy_gbps = 0;
    if (!info_fn || !copy_fn || info_fn(be, &di) != KVMEM_OK ||
        copy_fn(be, o->quick ? ((size_t)32 << 20) : ((size_t)512 << 20), o->quick ? 5 : 21, &copy_gbps) != KVMEM_OK) {
        rc = fail(o, be, "device");
        goto done;
    }
    kvm_json_begin(o->out, "cuda");
    kvm_json_str(o->out, "case", "device");
    kvm_json_str(o->out, "device", di.name);
    kvm_json_int(o->out, "cc", di.cc_major * 10 + di.cc_minor);
    kvm_json_int(o->out, "sms", di.n_sms);
    kvm_json_int(o->out, "driver", di.driver_version);
    kvm_json_int(o->out, "runtime", di.runtime_version);
    kvm_json_num(o->out, "copy_gbps", copy_gbps);
    kvm_json_end(o->out);

    /* ---- selection: Llama-3.1-8B geometry, MemArt's 14k-token context and
     * a 128k one, for a decode step (1 query token) and a 32-token prompt ---- */
    static const int sel_tokens[2] = {14000, 131072}, sel_nq[2] = {1, 32};
    for (int ci = 0; ci < (o->quick ? 1 : 4); ci++) {
        const int L = 32, Hq = 32, Hkv = 8, D = 128, BS = 16, nq = o->quick ? 32 : sel_nq[ci % 2], k = 64;
        const int tokens = o->quick ? 2048 : sel_tokens[ci / 2], NB = tokens / BS, nb_pad = (NB + 15) / 16 * 16;
        const size_t an = (size_t)NB * L * Hkv * D, qn = (size_t)nq * L * Hq * D;
        float *amin = malloc(an * 4), *amax = malloc(an * 4), *q = malloc(qn * 4);
        for (size_t i = 0; i < an; i++) {
            float a = RNG_NORMAL(), b = RNG_NORMAL();
            amin[i] = fminf(a, b);
            amax[i] = fmaxf(a, b);
        }
        for (size_t i = 0; i < qn; i++) q[i] = RNG_NORMAL();
        kvmem_buffer *dmn = dbuf(be, amin, an * 4), *dmx = dbuf(be, amax, an * 4), *dq = dbuf(be, q, qn * 4);
        kvmem_buffer *dblk = dbuf(be, NULL, (size_t)L * Hkv * nb_pad * 2 * D * 2), *dout = dbuf(be, NULL, (size_t)NB * 4);
        kvmem_buffer *didx = dbuf(be, NULL, (size_t)k * 4), *dsc = dbuf(be, NULL, (size_t)k * 4), *dn = dbuf(be, NULL, 4);
        free(amin);
        free(amax);
        free(q);
        kvmem_cuda_score_blocks_fn blocks;
        sel_arg sa;
        memset(&sa, 0, sizeof sa);
        sa.be = be;
        *(void **)(&blocks) = get(be, KVMEM_CUDA_PROC_SCORE_BLOCKS);
        *(void **)(&sa.score) = get(be, KVMEM_CUDA_PROC_AABB_SCORE);
        *(void **)(&sa.topk) = get(be, KVMEM_CUDA_PROC_TOPK);
        if (!dmn || !dmx || !dq || !dblk || !dout || !didx || !dsc || !dn || !blocks || !sa.score || !sa.topk) {
            rc = fail(o, be, "selection setup");
            goto done;
        }
        kvmem_cuda_blocks_args ba = {R(dmn), R(dmx), R(dblk), L, Hkv, D, NB, KVMEM_F16};
        double t0 = kvm_now();
        if (blocks(be, &ba) != KVMEM_OK || cu_sync(be) != KVMEM_OK) {
            rc = fail(o, be, "score_blocks");
            goto done;
        }
        double prep_ms = (kvm_now() - t0) * 1e3;
        sa.sa.q = R(dq);
        sa.sa.blk = R(dblk);
        sa.sa.out = R(dout);
        sa.sa.n_layers = L;
        sa.sa.n_q_heads = Hq;
        sa.sa.n_kv_heads = Hkv;
        sa.sa.head_dim = D;
        sa.sa.n_q = nq;
        sa.sa.n_blocks = NB;
        sa.sa.dtype = KVMEM_F16;
        kvmem_cuda_topk_args ta = {R(dout), R(didx), R(dsc), R(dn), NB, k};
        sa.ta = ta;
        for (int mode = 0; mode < 2; mode++) {
            sa.sa.norm_rr = mode;
            timed t = {be, sel_op, &sa, KVMEM_OK};
            double pip, med = time_op(&t, o->quick ? 5 : 50, &pip);
            if (t.st != KVMEM_OK) {
                rc = fail(o, be, "selection");
                goto done;
            }
            sel_line(o->out, "selection", mode, tokens, NB, nq, k, med, pip);
            kvm_json_num(o->out, "blocks_prep_ms", prep_ms);
            /* the block operand is read once per (layer, query head) CTA group */
            kvm_json_num(o->out, "operand_gbps", (double)L * Hkv * nb_pad * 2 * D * 2 / pip / 1e9);
            kvm_json_end(o->out);
        }
        /* the same selection through the table entries: f32 CUDA-core scores
         * per query head ([L][Hq][NB]), the core then sums heads and layers */
        kvmem_buffer *dagg = dbuf(be, NULL, (size_t)L * Hq * NB * 4);
        if (!dagg || !be->iface->dev_score || !be->iface->dev_topk) {
            rc = fail(o, be, "selection (table entries) setup");
            goto done;
        }
        dsel_arg ds;
        memset(&ds, 0, sizeof ds);
        ds.be = be;
        ds.sa.q = dq;
        ds.sa.s_min = dmn;
        ds.sa.s_max = dmx;
        ds.sa.out = dagg;
        ds.sa.n_q = nq;
        ds.sa.n_blocks = NB;
        ds.sa.n_layers = L;
        ds.sa.n_q_heads = Hq;
        ds.sa.n_kv_heads = Hkv;
        ds.sa.head_dim = D;
        ds.sa.agg = KVMEM_AGG_MAX;
        ds.sa.tau = 1.0f / sqrtf((float)D);
        ds.sa.rr_c = 60.0f;
        int32_t n_sel = 0;
        ds.ta.scores = dagg; /* the first head's row: top-k over NB scores */
        ds.ta.idx = didx;
        ds.ta.n = NB;
        ds.ta.k = k;
        ds.ta.n_out = &n_sel;
        for (int mode = 0; mode < 2; mode++) {
            ds.sa.norm = mode ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
            timed t = {be, dsel_op, &ds, KVMEM_OK};
            double pip, med = time_op(&t, o->quick ? 5 : 20, &pip);
            if (t.st != KVMEM_OK) {
                rc = fail(o, be, "selection (table entries)");
                goto done;
            }
            sel_line(o->out, "selection_f32", mode, tokens, NB, nq, k, med, pip);
            kvm_json_end(o->out);
        }
        kvmem_buffer *bs[] = {dmn, dmx, dq, dblk, dout, didx, dsc, dn, dagg};
        for (int i = 0; i < 9; i++) be->iface->buffer_free(be, bs[i]);
    }

    /* ---- decode attention ---- */
    {
        const int Hq = 32, Hkv = 8, D = 128, tile = 64;
        const int n = o->quick ? 4096 : 32768, n_tiles = (n + tile - 1) / tile;
        const size_t kvn = (size_t)n * Hkv * D;
        uint16_t *kv = malloc(kvn * 2);
        for (size_t i = 0; i < kvn; i++) kv[i] = (uint16_t)(0x3000u + (uint16_t)(i * 2654435761u >> 22)); /* small f16 values */
        float *q = malloc((size_t)Hq * D * 4);
        for (int i = 0; i < Hq * D; i++) q[i] = RNG_NORMAL();
        int32_t *sm = malloc((size_t)n * 4), *ord = malloc((size_t)n_tiles * 4);
        for (int i = 0; i < n; i++) sm[i] = i;
        for (int t = 0; t < n_tiles; t++) ord[t] = n_tiles - 1 - t;
        att_arg aa;
        memset(&aa, 0, sizeof aa);
        aa.be = be;
        kvmem_buffer *dk = dbuf(be, kv, kvn * 2), *dv = dbuf(be, kv, kvn * 2), *dq = dbuf(be, q, (size_t)Hq * D * 4);
        kvmem_buffer *ds = dbuf(be, sm, (size_t)n * 4), *dord = dbuf(be, ord, (size_t)n_tiles * 4);
        kvmem_buffer *dout = dbuf(be, NULL, (size_t)Hq * D * 4), *dvis = dbuf(be, NULL, (size_t)Hkv * 4);
        free(kv);
        free(q);
        free(sm);
        free(ord);
        if (!be->iface->dev_attend || !dk || !dv || !dq || !ds || !dord || !dout || !dvis) {
            rc = fail(o, be, "attend setup");
            goto done;
        }
        aa.aa.q = dq;
        aa.aa.k = dk;
        aa.aa.v = dv;
        aa.aa.slot_map = ds;
        aa.aa.order = dord;
        aa.aa.out = dout;
        aa.aa.visited = dvis;
        aa.aa.n_slots = n;
        aa.aa.n_pos = n;
        aa.aa.n_q_heads = Hq;
        aa.aa.n_kv_heads = Hkv;
        aa.aa.head_dim = D;
        aa.aa.tile = tile;
        aa.aa.n_visit = n_tiles;
        aa.aa.dtype = KVMEM_F16;
        aa.aa.scale = 1.0f / sqrtf((float)D);
        aa.aa.patience = 4; /* tau_s = tau_d = 0: full attention, every tile read */
        {
            timed t = {be, att_op, &aa, KVMEM_OK};
            double pip, med = time_op(&t, o->quick ? 5 : 50, &pip);
            if (t.st != KVMEM_OK) {
                rc = fail(o, be, "attend");
                goto done;
            }
            const double bytes = (double)kvn * 2 * 2;
            kvm_json_begin(o->out, "cuda");
            kvm_json_str(o->out, "case", "attend");
            kvm_json_int(o->out, "tokens", n);
            kvm_json_num(o->out, "ms", med * 1e3);
            kvm_json_num(o->out, "ms_pipelined", pip * 1e3);
            kvm_json_num(o->out, "kv_gbps", bytes / pip / 1e9);
            kvm_json_num(o->out, "kv_over_copy", bytes / pip / 1e9 / copy_gbps);
            kvm_json_num(o->out, "target_ratio", 0.8);
            kvm_json_end(o->out);
        }
        kvmem_buffer *bs[] = {dk, dv, dq, ds, dord, dout, dvis};
        for (int i = 0; i < 7; i++) be->iface->buffer_free(be, bs[i]);
    }

    /* ---- gather with RoPE ---- */
    {
        const int Hkv = 8, D = 128, M = o->quick ? 2048 : 14000, n_src = M;
        const size_t row = (size_t)Hkv * D;
        uint16_t *kv = malloc((size_t)n_src * row * 2);
        for (size_t i = 0; i < (size_t)n_src * row; i++) kv[i] = (uint16_t)(0x3000u + (uint16_t)(i * 2654435761u >> 22));
        int64_t *rows = malloc((size_t)M * 8);
        int32_t *pos = malloc((size_t)M * 4);
        double inv[64];
        for (int j = 0; j < D / 2; j++) inv[j] = pow(500000.0, -2.0 * j / D);
        for (int i = 0; i < M; i++) {
            rows[i] = (int64_t)((i * 7919) % n_src);
            pos[i] = i;
        }
        gat_arg ga;
        memset(&ga, 0, sizeof ga);
        ga.be = be;
        *(void **)(&ga.gather) = get(be, KVMEM_CUDA_PROC_GATHER_ROPE);
        kvmem_buffer *sk = dbuf(be, kv, (size_t)n_src * row * 2), *sv = dbuf(be, kv, (size_t)n_src * row * 2);
        kvmem_buffer *dr = dbuf(be, rows, (size_t)M * 8), *dp = dbuf(be, pos, (size_t)M * 4), *dinv = dbuf(be, inv, sizeof inv);
        kvmem_buffer *ok_ = dbuf(be, NULL, (size_t)M * row * 2), *ov = dbuf(be, NULL, (size_t)M * row * 2);
        free(kv);
        free(rows);
        free(pos);
        if (!ga.gather || !sk || !sv || !dr || !dp || !dinv || !ok_ || !ov) {
            rc = fail(o, be, "gather setup");
            goto done;
        }
        kvmem_cuda_gather_args g = {R(sk), R(sv), R(dr), R(dp), R(dinv), R(ok_), R(ov), n_src, M, Hkv, D, D,
                                    KVMEM_ROPE_NEOX, 0.0f, KVMEM_F16, KVMEM_F16};
        ga.ga = g;
        timed t = {be, gat_op, &ga, KVMEM_OK};
        double pip, med = time_op(&t, o->quick ? 5 : 50, &pip);
        if (t.st != KVMEM_OK) {
            rc = fail(o, be, "gather_rope");
            goto done;
        }
        const double bytes = (double)M * row * 2 * 4; /* K and V read and written */
        kvm_json_begin(o->out, "cuda");
        kvm_json_str(o->out, "case", "gather_rope");
        kvm_json_int(o->out, "tokens", M);
        kvm_json_num(o->out, "ms", med * 1e3);
        kvm_json_num(o->out, "ms_pipelined", pip * 1e3);
        kvm_json_num(o->out, "gbps", bytes / pip / 1e9);
        kvm_json_num(o->out, "over_copy", bytes / pip / 1e9 / copy_gbps);
        kvm_json_end(o->out);
        kvmem_buffer *bs[] = {sk, sv, dr, dp, dinv, ok_, ov};
        for (int i = 0; i < 7; i++) be->iface->buffer_free(be, bs[i]);
    }
done:
    kvmem_context_free(ctx);
    return rc;
}

const kvm_bench_suite kvm_bench_cuda = {"cuda", "CUDA backend: selection, decode attention, gather+RoPE vs copy bandwidth",
                                        run_cuda};

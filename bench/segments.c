/* Suite "segments" (KEEP).
 *
 * 1. Invalidated tokens per memory update on a synthetic embodied trace,
 *    fixed blocks / prefix caching vs KEEP segments.
 *    The trace (deterministic, seed 7): R rooms of O objects each, one
 *    segment per object ("the mug is on the counter", 24-48 tokens). The
 *    agent works in one room at a time and moves on every `stay` steps;
 *    each step an object in the active room moves with probability 0.15, an
 *    object elsewhere with probability 0.005 (someone else moved it), and a
 *    task completes with probability 0.2, adding a task segment (40-64
 *    tokens) to the current task-history group (8 tasks per group).
 *    Object groups come from kvmem_cluster_kmeans over synthetic sentence
 *    embeddings (room direction + noise), as an engine would group them.
 *    Fixed blocks: memory is one sequence in creation order (objects by
 *    room, then tasks); an update invalidates every token from the first
 *    changed segment to the end, new tasks cost their own tokens.
 *    KEEP: the tokens the segment store's events ask to recompute: the
 *    segment on SEGMENT_STALE, the whole group on GROUP_STATIC (t = 10).
 *    Both totals are divided by the number of updates (moves + new tasks).
 *
 * 2. Predicted idle time of the layer pipeline for Qwen2.5-14B geometry
 *    (48 layers, 40 query / 8 KV heads, head_dim 128, hidden 5120, MLP
 *    13824, bf16 KV: 4096 bytes per token per layer): memory of S segments
 *    of 64 tokens, 128 query tokens; recompute sets from
 *    kvmem_multihop_select over synthetic attention with the
 *    kvmem_multihop_schedule ratios (average r = 0.15); compute time per
 *    layer = (recomputed + query tokens) x (2 x 275.3M weights + 4 x context
 *    x 5120 attention) FLOP at 150 TFLOP/s (an A100-class GPU at about half
 *    of its bf16 peak); host->device 25 GB/s (PCIe 4.0 x16, the stated
 *    bandwidth), plus 12 and 6 GB/s (shared or older links) and 3 GB/s (KV
 *    streamed from an NVMe SSD) to show where balancing matters.
 *    idle_*_ms = the compute stream's idle time (waiting for KV: what the
 *    plan is for; it adds to latency); load-stream idle is reported beside.
 *
 * 3. Wall time of the CPU-side calls (multi-hop, load plan, k-means). */
#include "bench.h"
#include "kvmem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rnd(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *x) { return (double)(rnd(x) >> 11) * (1.0 / 9007199254740992.0); }
static double gauss(uint64_t *x) {
    double u1 = unif(x) + 1e-12, u2 = unif(x);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#define CHECK(call)                                                                 \
    do {                                                                            \
        kvmem_status st_ = (call);                                                  \
        if (st_ != KVMEM_OK) {                                                      \
            fprintf(stderr, "segments bench: %s: %s\n", #call, kvmem_last_error()); \
            goto fail;                                                              \
        }                                                                           \
    } while (0)

typedef struct trace_result {
    long long steps, updates, moves, tasks, final_tokens;
    double fixed_tokens, keep_tokens, keep_segment_tokens, keep_group_tokens;
    double kmeans_purity;
    int32_t n_groups, n_static;
} trace_result;

static int run_trace(const kvm_bench_opts *o, kvmem_pool *pool, trace_result *res) {
    const int R = o->quick ? 4 : 6, O = o->quick ? 6 : 10, steps = o->quick ? 120 : 1000, stay = o->quick ? 30 : 50;
    const int dim = 64, n_obj = R * O;
    const int max_seg = n_obj + steps + 1;
    uint64_t rng = 7;
    int ok = 0;
    kvmem_segments *s = NULL;
    int32_t *tok = calloc((size_t)max_seg, sizeof *tok);   /* tokens per segment index */
    int32_t *grp = calloc((size_t)max_seg, sizeof *grp);   /* group per segment index */
    long long *pos = calloc((size_t)max_seg, sizeof *pos); /* start in the fixed sequence */
    float *emb = malloc((size_t)n_obj * dim * sizeof *emb);
    float *room_dir = malloc((size_t)R * dim * sizeof *room_dir);
    int32_t *lab = malloc((size_t)n_obj * sizeof *lab);
    long long *grp_tokens = calloc(65536, sizeof *grp_tokens);
    kvmem_segment_event ev[256];
    if (!tok || !grp || !pos || !emb || !room_dir || !lab || !grp_tokens) goto fail;
    memset(res, 0, sizeof *res);

    /* sentence embeddings: room direction + noise; k-means gives the groups */
    for (int i = 0; i < R * dim; i++) room_dir[i] = (float)gauss(&rng);
    for (int i = 0; i < n_obj; i++)
        for (int d = 0; d < dim; d++) emb[i * dim + d] = room_dir[(i / O) * dim + d] + 0.4f * (float)gauss(&rng);
    kvmem_kmeans_params kp = kvmem_kmeans_default_params();
    kp.k = R;
    CHECK(kvmem_cluster_kmeans(emb, (size_t)n_obj, (size_t)dim, &kp, lab, NULL, NULL));
    {   /* purity: share of objects whose cluster's majority room is their room */
        int agree = 0;
        for (int c = 0; c < R; c++) {
            int best = 0;
            for (int r = 0; r < R; r++) {
                int cnt = 0;
                for (int i = 0; i < n_obj; i++) cnt += lab[i] == c && i / O == r;
                if (cnt > best) best = cnt;
            }
            agree += best;
        }
        res->kmeans_purity = (double)agree / n_obj;
    }

    kvmem_segments_params sp = kvmem_segments_default_params();
    CHECK(kvmem_segments_create(pool, "bench-keep", &sp, &s));
    long long total = 0;
    char name[64];
    for (int i = 0; i < n_obj; i++) {
        snprintf(name, sizeof name, "room%d/object%d", i / O, i % O);
        int32_t idx;
        CHECK(kvmem_segments_add(s, name, lab[i], &idx));
        tok[idx] = 24 + (int32_t)(rnd(&rng) % 25);
        grp[idx] = lab[i];
        pos[idx] = total;
        total += tok[idx];
    }
    int n_seg = n_obj, n_tasks = 0;
    size_t got = 0, left = 0;
    CHECK(kvmem_segments_drain_events(s, ev, 256, &got, &left)); /* initial build: not an update */
    while (left) CHECK(kvmem_segments_drain_events(s, ev, 256, &got, &left));

    for (int step = 0; step < steps; step++) {
        int active = (step / stay) % R;
        long long first_changed = -1;
        long long new_tokens = 0;
        for (int i = 0; i < n_obj; i++) {
            double pmove = (i / O == active) ? 0.15 : 0.005;
            if (unif(&rng) < pmove) {
                CHECK(kvmem_segments_update(s, i));
                res->moves++;
                if (first_changed < 0 || pos[i] < first_changed) first_changed = pos[i];
            }
        }
        if (unif(&rng) < 0.2) {
            int32_t g = R + n_tasks / 8, idx;
            snprintf(name, sizeof name, "task%d", n_tasks);
            CHECK(kvmem_segments_add(s, name, g, &idx));
            tok[idx] = 40 + (int32_t)(rnd(&rng) % 25);
            grp[idx] = g;
            pos[idx] = total;
            total += tok[idx];
            new_tokens += tok[idx];
            n_tasks++;
            n_seg++;
            res->tasks++;
        }
        /* fixed blocks: everything after the first changed token, plus new tokens */
        if (first_changed >= 0) res->fixed_tokens += (double)(total - new_tokens - first_changed);
        res->fixed_tokens += (double)new_tokens;

        CHECK(kvmem_segments_step(s));
        memset(grp_tokens, 0, 65536 * sizeof *grp_tokens);
        for (int i = 0; i < n_seg; i++) grp_tokens[grp[i]] += tok[i];
        do {
            CHECK(kvmem_segments_drain_events(s, ev, 256, &got, &left));
            for (size_t e = 0; e < got; e++) {
                if (ev[e].kind == KVMEM_SEG_EVENT_SEGMENT_STALE) res->keep_segment_tokens += tok[ev[e].segment];
                else if (ev[e].kind == KVMEM_SEG_EVENT_GROUP_STATIC) res->keep_group_tokens += (double)grp_tokens[ev[e].group];
            }
        } while (left);
    }
    res->steps = steps;
    res->updates = res->moves + res->tasks;
    res->keep_tokens = res->keep_segment_tokens + res->keep_group_tokens;
    res->final_tokens = total;
    kvmem_segments_info info;
    CHECK(kvmem_segments_get_info(s, &info));
    res->n_groups = info.n_groups;
    res->n_static = info.n_static;
    ok = 1;
fail:
    kvmem_segments_free(s);
    free(tok), free(grp), free(pos), free(emb), free(room_dir), free(lab), free(grp_tokens);
    return ok ? 0 : -1;
}

/* Peaky random attention rows (sum 1), like softmax outputs. */
static void att_row(uint64_t *rng, float *row, int n) {
    double sum = 0;
    for (int j = 0; j < n; j++) {
        double u = unif(rng);
        row[j] = (float)(u * u * u * u);
        sum += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = (float)(row[j] / sum);
}

typedef struct plan_case {
    int L, S, seg_tokens, q_tokens;
    float avg_ratio;
    double tflops;
    uint8_t *rec;      /* [L][S] */
    double *comp;      /* [L] ms */
    uint64_t *bytes;   /* [S] */
    double mh_us;      /* median multihop_select per layer */
    double recomputed; /* mean |R_i| / S */
} plan_case;

typedef struct mh_arg {
    const float *q2s, *s2s;
    int nq, n;
    const uint8_t *cand;
    uint8_t *sel;
    float ratio;
} mh_arg;

static void mh_once(void *p) {
    mh_arg *a = p;
    kvmem_multihop_params mp = kvmem_multihop_default_params();
    mp.ratio = a->ratio;
    kvmem_multihop_select(&mp, a->q2s, a->nq, a->s2s, a->n, a->cand, a->sel, NULL, NULL);
}

static int build_plan_case(const kvm_bench_opts *o, plan_case *c) {
    c->L = 48;
    c->S = o->quick ? 64 : 512;
    c->seg_tokens = 64;
    c->q_tokens = 128;
    c->avg_ratio = 0.15f;
    c->tflops = 150.0;
    const int L = c->L, S = c->S;
    c->rec = malloc((size_t)L * S);
    c->comp = malloc((size_t)L * sizeof *c->comp);
    c->bytes = malloc((size_t)S * sizeof *c->bytes);
    float *ratios = malloc((size_t)L * sizeof *ratios);
    float *q2s = malloc((size_t)c->q_tokens * S * sizeof *q2s), *s2s = malloc((size_t)S * S * sizeof *s2s);
    uint8_t *prev = malloc((size_t)S);
    if (!c->rec || !c->comp || !c->bytes || !ratios || !q2s || !s2s || !prev) goto fail;
    CHECK(kvmem_multihop_schedule(L, c->avg_ratio, ratios));
    uint64_t rng = 1234;
    const double ctx = (double)S * c->seg_tokens + c->q_tokens;
    const double flop_per_token = 2.0 * 275.3e6 + 4.0 * ctx * 5120.0;
    double mh_t[48];
    c->recomputed = 0;
    for (int l = 0; l < L; l++) {
        for (int q = 0; q < c->q_tokens; q++) att_row(&rng, q2s + (size_t)q * S, S);
        for (int a = 0; a < S; a++) att_row(&rng, s2s + (size_t)a * S, S);
        mh_arg arg = {q2s, s2s, c->q_tokens, S, l ? prev : NULL, c->rec + (size_t)l * S, ratios[l]};
        mh_t[l] = kvm_time_median(mh_once, &arg, 0, 1);
        int cnt = 0;
        for (int j = 0; j < S; j++) cnt += c->rec[(size_t)l * S + j];
        memcpy(prev, c->rec + (size_t)l * S, (size_t)S);
        c->recomputed += (double)cnt / S / L;
        c->comp[l] = ((double)cnt * c->seg_tokens + c->q_tokens) * flop_per_token / (c->tflops * 1e12) * 1e3;
    }
    c->mh_us = kvm_median(mh_t, L) * 1e6;
    for (int j = 0; j < S; j++) c->bytes[j] = (uint64_t)c->seg_tokens * 4096u;
    free(ratios), free(q2s), free(s2s), free(prev);
    return 0;
fail:
    free(ratios), free(q2s), free(s2s), free(prev);
    return -1;
}

typedef struct lp_arg {
    const plan_case *c;
    kvmem_load_plan_params p;
    kvmem_load_item *items;
    size_t cap;
} lp_arg;

static void lp_once(void *p) {
    lp_arg *a = p;
    size_t n = 0;
    kvmem_load_plan(&a->p, a->c->comp, a->c->L, a->c->bytes, a->c->S, a->c->rec, a->items, a->cap, &n, NULL, NULL);
}

typedef struct km_arg {
    const float *x;
    size_t n, dim;
    int32_t *lab;
} km_arg;

static void km_once(void *p) {
    km_arg *a = p;
    kvmem_kmeans_params kp = kvmem_kmeans_default_params();
    kp.k = 16;
    kvmem_cluster_kmeans(a->x, a->n, a->dim, &kp, a->lab, NULL, NULL);
}

static int run_segments(const kvm_bench_opts *o) {
    int rc = -1;
    kvmem_context *ctx = NULL;
    kvmem_pool *pool = NULL;
    plan_case c;
    memset(&c, 0, sizeof c);
    kvmem_load_item *items = NULL;
    float *kx = NULL;
    int32_t *klab = NULL;
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = o->backend;
    cp.n_threads = o->n_threads;
    CHECK(kvmem_context_create(&cp, &ctx));
    kvmem_model_spec spec = kvmem_model_spec_default();
    CHECK(kvmem_pool_create(ctx, &spec, NULL, &pool));
    double read_bw = kvm_measure_read_bw_gbps(o->quick ? ((size_t)8 << 20) : ((size_t)128 << 20));

    trace_result tr;
    if (run_trace(o, pool, &tr) != 0) goto fail;
    double per_fixed = tr.updates ? tr.fixed_tokens / (double)tr.updates : 0;
    double per_keep = tr.updates ? tr.keep_tokens / (double)tr.updates : 0;
    if (o->json) {
        kvm_json_begin(o->out, "segments");
        kvm_json_str(o->out, "case", "embodied_trace");
        kvm_json_int(o->out, "steps", tr.steps);
        kvm_json_int(o->out, "updates", tr.updates);
        kvm_json_int(o->out, "object_moves", tr.moves);
        kvm_json_int(o->out, "tasks_completed", tr.tasks);
        kvm_json_int(o->out, "memory_tokens_final", tr.final_tokens);
        kvm_json_int(o->out, "static_after_steps", 10);
        kvm_json_num(o->out, "invalidated_tokens_fixed", per_fixed);
        kvm_json_num(o->out, "invalidated_tokens_keep", per_keep);
        kvm_json_num(o->out, "keep_segment_tokens_per_update", tr.updates ? tr.keep_segment_tokens / (double)tr.updates : 0);
        kvm_json_num(o->out, "keep_group_tokens_per_update", tr.updates ? tr.keep_group_tokens / (double)tr.updates : 0);
        kvm_json_num(o->out, "fixed_over_keep", per_keep > 0 ? per_fixed / per_keep : 0);
        kvm_json_int(o->out, "groups_final", tr.n_groups);
        kvm_json_int(o->out, "static_groups_final", tr.n_static);
        kvm_json_num(o->out, "kmeans_room_purity", tr.kmeans_purity);
        kvm_json_end(o->out);
    } else {
        fprintf(o->out, "segments: %lld updates over %lld steps; invalidated tokens per update: fixed blocks %.0f, KEEP %.0f (%.1fx fewer)\n",
                tr.updates, tr.steps, per_fixed, per_keep, per_keep > 0 ? per_fixed / per_keep : 0);
    }

    if (build_plan_case(o, &c) != 0) goto fail;
    size_t n_items = 0;
    kvmem_load_plan_params lp = kvmem_load_plan_default_params();
    CHECK(kvmem_load_plan(&lp, c.comp, c.L, c.bytes, c.S, c.rec, NULL, 0, &n_items, NULL, NULL));
    items = malloc((n_items ? n_items : 1) * sizeof *items);
    if (!items) goto fail;
    const double bws[] = {25.0, 12.0, 6.0, 3.0};
    double plan_us = 0;
    for (int b = 0; b < (int)(sizeof bws / sizeof bws[0]); b++) {
        lp.bandwidth_gbps = bws[b];
        kvmem_load_plan_stats st;
        size_t got = 0;
        CHECK(kvmem_load_plan(&lp, c.comp, c.L, c.bytes, c.S, c.rec, items, n_items, &got, NULL, &st));
        size_t early = 0; /* loads issued before the layer just in front of theirs */
        for (size_t k = 0; k < got; k++) early += items[k].issue_layer < items[k].layer - 1;
        if (b == 0) {
            lp_arg la = {&c, lp, items, n_items};
            plan_us = kvm_time_median(lp_once, &la, 1, o->quick ? 3 : 9) * 1e6;
        }
        double idle_naive = st.naive_compute_idle_ms, idle_bal = st.balanced_compute_idle_ms;
        if (o->json) {
            kvm_json_begin(o->out, "segments");
            kvm_json_str(o->out, "case", "load_plan");
            kvm_json_str(o->out, "model", "Qwen2.5-14B");
            kvm_json_int(o->out, "n_layers", c.L);
            kvm_json_int(o->out, "n_q_heads", 40);
            kvm_json_int(o->out, "n_kv_heads", 8);
            kvm_json_int(o->out, "head_dim", 128);
            kvm_json_int(o->out, "segments", c.S);
            kvm_json_int(o->out, "segment_tokens", c.seg_tokens);
            kvm_json_int(o->out, "query_tokens", c.q_tokens);
            kvm_json_num(o->out, "avg_ratio", c.avg_ratio);
            kvm_json_num(o->out, "recomputed_fraction", c.recomputed);
            kvm_json_num(o->out, "device_tflops", c.tflops);
            kvm_json_num(o->out, "bandwidth_gbps", bws[b]);
            kvm_json_num(o->out, "compute_ms", st.compute_ms);
            kvm_json_num(o->out, "load_ms", st.load_ms);
            kvm_json_int(o->out, "loads", (long long)st.n_loads);
            kvm_json_int(o->out, "loads_preloaded", (long long)early);
            kvm_json_num(o->out, "idle_naive_ms", idle_naive);
            kvm_json_num(o->out, "idle_balanced_ms", idle_bal);
            kvm_json_num(o->out, "compute_idle_naive_ms", st.naive_compute_idle_ms);
            kvm_json_num(o->out, "compute_idle_balanced_ms", st.balanced_compute_idle_ms);
            kvm_json_num(o->out, "load_idle_naive_ms", st.naive_load_idle_ms);
            kvm_json_num(o->out, "load_idle_balanced_ms", st.balanced_load_idle_ms);
            kvm_json_num(o->out, "makespan_naive_ms", st.naive_makespan_ms);
            kvm_json_num(o->out, "makespan_balanced_ms", st.balanced_makespan_ms);
            kvm_json_end(o->out);
        } else {
            fprintf(o->out, "segments: Qwen2.5-14B, %d segments, %.0f GB/s: idle naive %.2f ms, balanced %.2f ms; makespan %.2f -> %.2f ms\n",
                    c.S, bws[b], idle_naive, idle_bal, st.naive_makespan_ms, st.balanced_makespan_ms);
        }
    }

    /* k-means on sentence-embedding-sized data */
    size_t kn = o->quick ? 256 : 2048, kd = 384;
    kx = malloc(kn * kd * sizeof *kx);
    klab = malloc(kn * sizeof *klab);
    if (!kx || !klab) goto fail;
    uint64_t rng = 3;
    for (size_t i = 0; i < kn * kd; i++) kx[i] = (float)gauss(&rng) + (float)((i / kd) % 16 == i % 16) * 4.0f;
    km_arg ka = {kx, kn, kd, klab};
    double km_ms = kvm_time_median(km_once, &ka, 1, o->quick ? 3 : 5) * 1e3;
    if (o->json) {
        kvm_json_begin(o->out, "segments");
        kvm_json_str(o->out, "case", "timing");
        kvm_json_int(o->out, "multihop_segments", c.S);
        kvm_json_int(o->out, "multihop_query_tokens", c.q_tokens);
        kvm_json_num(o->out, "multihop_us", c.mh_us);
        kvm_json_int(o->out, "load_plan_loads", (long long)n_items);
        kvm_json_num(o->out, "load_plan_us", plan_us);
        kvm_json_int(o->out, "kmeans_n", (long long)kn);
        kvm_json_int(o->out, "kmeans_dim", (long long)kd);
        kvm_json_int(o->out, "kmeans_k", 16);
        kvm_json_num(o->out, "kmeans_ms", km_ms);
        kvm_json_num(o->out, "read_bw_gbps", read_bw);
        kvm_json_end(o->out);
    } else {
        fprintf(o->out, "segments: multihop %.0f us (%d segments), load plan %.0f us, k-means %.1f ms (%zu x %zu, k=16)\n",
                c.mh_us, c.S, plan_us, km_ms, kn, kd);
    }
    rc = 0;
fail:
    free(c.rec), free(c.comp), free(c.bytes), free(items), free(kx), free(klab);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    return rc;
}

const kvm_bench_suite kvm_bench_segments = {
    "segments", "KEEP: invalidated tokens per update, layer-balanced load plan idle time", run_segments};

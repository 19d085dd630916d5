/* The SCORED order (kvmem_attend's default): every KV head visits the tiles
 * by their largest logit. Caller tensors: the scores are the exact largest
 * logits, each query row counting the keys it sees, in every dtype and
 * layout, masks included. Agents: the scores bound every logit of a block
 * from its AABB and its positions, RoPE included, in both RoPE styles, with
 * partial rotary dims, YaRN's attention factor and arbitrary positions, and
 * equal the logit for a block of one key. Through the public API: every KV
 * head follows its own order, and on a history whose far tokens matter the
 * defaults keep the output that RECENT's early stop loses. References are
 * double loops here; keys are rotated with kvmem_rope_apply (RoPE has its
 * own tests), logits and attention are computed here. */
#include "testutil.h"
#include "attend_ref.h"
#include "attend/attend.h"
#include "pool/pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double dot(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* The order of each head is a permutation of the tiles by descending
 * score, equal scores newest first. */
static void assert_orders_follow_scores(const int32_t *order, const float *score, int H, int NT) {
    for (int h = 0; h < H; h++) {
        uint8_t seen[512] = {0};
        for (int i = 0; i < NT; i++) {
            const int t = order[h * NT + i];
            assert_true(t >= 0 && t < NT && !seen[t]);
            seen[t] = 1;
            if (i == 0) continue;
            const int u = order[h * NT + i - 1];
            const float a = score[h * NT + u], b = score[h * NT + t];
            assert_true(a > b || (a == b && u > t));
        }
    }
}

/* ---- caller tensors: exact largest logits ---- */

static void tensor_scores_are_the_exact_largest_logits(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const int R = 5, H = 3, G = 2, Hq = H * G, D = 24, T = 203, TS = 16, PAD = 5;
    const int NT = (T + TS - 1) / TS;
    const float scale = 0.3f;
    uint64_t rng = 17;
    float *q = malloc(sizeof(float) * R * Hq * D), *kf = malloc(sizeof(float) * T * H * (D + PAD));
    uint16_t *kh = malloc(sizeof(uint16_t) * T * H * (D + PAD));
    for (int i = 0; i < R * Hq * D; i++) q[i] = tu_normal(&rng);
    for (int i = 0; i < T * H * (D + PAD); i++) /* on a 1/64 grid in [-4, 4]: exact in f16 and bf16 */
        kf[i] = roundf(fmaxf(-4.f, fminf(4.f, 1.5f * tu_normal(&rng))) * 64.f) / 64.f;
    uint8_t mask[203];
    int64_t live_prefix[204];
    live_prefix[0] = 0;
    for (int j = 0; j < T; j++) {
        mask[j] = (uint8_t)(j % 9 != 4 && !(j >= 48 && j < 64)); /* tile 3 wholly masked */
        live_prefix[j + 1] = live_prefix[j] + mask[j];
    }
    int64_t tile_start[14], row_lo[5], row_hi[5];
    for (int t = 0; t <= NT; t++) tile_start[t] = t < NT ? (int64_t)t * TS : T;
    for (int r = 0; r < R; r++) row_lo[r] = 0, row_hi[r] = T - R + r + 1;
    float score[3 * 13];
    int32_t order[3 * 13];
    for (int variant = 0; variant < 4; variant++) {
        /* 0: f32 rows; 1: f16 rows; 2: bf16, padded rows (converted); 3: f32, masked */
        const kvmem_dtype dt = variant == 1 ? KVMEM_F16 : variant == 2 ? KVMEM_BF16 : KVMEM_F32;
        const int rs = variant == 2 ? D + PAD : D;
        for (int j = 0; j < T * H; j++)
            for (int d = 0; d < D; d++) {
                const float x = kf[j * (D + PAD) + d];
                uint32_t u;
                memcpy(&u, &x, 4);
                kh[j * rs + d] = dt == KVMEM_F16 ? ref_f16_exact(x) : (uint16_t)(u >> 16);
            }
        float *kc = malloc(sizeof(float) * T * H * D); /* contiguous f32 copy the f32 variants read */
        for (int j = 0; j < T * H; j++) memcpy(kc + j * D, kf + j * (D + PAD), sizeof(float) * D);
        kvmem_tensor tk;
        const int64_t ks[3] = {T, H, D};
        assert_ok(kvmem_tensor_init(&tk, dt == KVMEM_F32 ? (void *)kc : (void *)kh, dt, 3, ks));
        tk.strides[1] = rs;
        tk.strides[0] = (int64_t)H * rs;
        kvm_attend_plan pl;
        memset(&pl, 0, sizeof pl);
        pl.n_rows = R, pl.n_q_heads = Hq, pl.n_kv_heads = H, pl.head_dim = D, pl.group = G;
        pl.scale = scale;
        pl.q = q;
        pl.kind = KVMEM_ATTEND_SRC_TENSORS;
        pl.T = T;
        pl.k = &tk;
        pl.n_tiles = NT;
        pl.tile_start = tile_start;
        pl.row_lo = row_lo;
        pl.row_hi = row_hi;
        pl.causal = 1;
        if (variant == 3) pl.mask = mask, pl.live_prefix = live_prefix;
        int64_t rows = -1;
        float *logits = malloc(sizeof(float) * R * Hq * T);
        for (int i = 0; i < R * Hq * T; i++) logits[i] = 777.0f;
        assert_ok(kvm_attend_scored_order(ctx, &pl, order, score, logits, &rows));
        int64_t n_live = 0;
        for (int j = 0; j < T; j++) n_live += !pl.mask || mask[j];
        assert_int_equal(rows, n_live * H); /* every live K row once, nothing masked */
        for (int h = 0; h < H; h++)
            for (int t = 0; t < NT; t++) {
                double best = -INFINITY;
                for (int r = 0; r < R; r++)
                    for (int g = 0; g < G; g++)
                        for (int64_t j = tile_start[t]; j < tile_start[t + 1] && j < row_hi[r]; j++) {
                            if (pl.mask && !mask[j]) continue;
                            const double s = scale * dot(q + (r * Hq + h * G + g) * D, kc + (j * H + h) * D, D);
                            best = s > best ? s : best;
                        }
                for (int r = 0; r < R; r++) /* the kept logits: each a row sees, the rest untouched */
                    for (int g = 0; g < G; g++)
                        for (int64_t j = tile_start[t]; j < tile_start[t + 1]; j++) {
                            const double s = scale * dot(q + (r * Hq + h * G + g) * D, kc + (j * H + h) * D, D);
                            const float kept = logits[(r * Hq + h * G + g) * T + j];
                            const int sees = j < row_hi[r] && (!pl.mask || mask[j]);
                            if (sees ? !(fabs(kept - s) <= 1e-5 * (1.0 + fabs(s))) : kept != 777.0f)
                                fail_msg("variant %d row %d head %d position %lld: kept %.9g, logit %.9g", variant, r,
                                         h * G + g, (long long)j, (double)kept, sees ? s : 777.0);
                        }
                const double got = score[h * NT + t];
                if (isinf(best)) {
                    assert_true(isinf(got) && got < 0);
                } else if (!(fabs(got - best) <= 1e-5 * (1.0 + fabs(best)))) {
                    fail_msg("variant %d head %d tile %d: score %.9g, largest logit %.9g", variant, h, t, got, best);
                }
            }
        assert_orders_follow_scores(order, score, H, NT);
        free(kc), free(logits);
    }
    free(q), free(kf), free(kh);
    kvmem_context_free(ctx);
}

/* ---- agents: an upper bound from the AABBs, RoPE included ---- */

typedef struct agent_case {
    const char *what;
    kvmem_rope_style style;
    int32_t rotary_dim; /* 0 = head_dim */
    kvmem_rope_scaling scaling;
    int32_t block_size;
    int positions; /* 0: base_position; 1: an array with jumps and a step back */
    int64_t base;
} agent_case;

static void agent_scores_bound_every_logit(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const agent_case cases[] = {
        {"neox", KVMEM_ROPE_NEOX, 0, KVMEM_ROPE_SCALING_NONE, 8, 0, 0},
        {"gptj, half the dims rotated, base 5000", KVMEM_ROPE_GPTJ, 16, KVMEM_ROPE_SCALING_NONE, 8, 0, 5000},
        {"neox, yarn x4, positions with jumps", KVMEM_ROPE_NEOX, 0, KVMEM_ROPE_SCALING_YARN, 16, 1, 0},
        {"neox, llama3, blocks of one key", KVMEM_ROPE_NEOX, 0, KVMEM_ROPE_SCALING_LLAMA3, 1, 1, 0},
        {"gptj, blocks of one key, base 100000", KVMEM_ROPE_GPTJ, 24, KVMEM_ROPE_SCALING_NONE, 1, 0, 100000},
    };
    const int L = 2, H = 2, G = 2, Hq = 4, D = 32, T = 61, R = 3, layer = 1;
    uint64_t rng = 5;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const agent_case *c = &cases[ci];
        kvmem_model_spec spec = tu_spec(L, D);
        spec.rope_style = c->style;
        spec.rotary_dim = c->rotary_dim;
        spec.rope_scaling = c->scaling;
        if (c->scaling != KVMEM_ROPE_SCALING_NONE) spec.rope_factor = 4.0, spec.rope_original_max_pos = 64;
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = KVMEM_F32;
        pp.block_size = c->block_size;
        kvmem_pool *pool = NULL;
        kvmem_agent *ag = NULL;
        assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
        assert_ok(kvmem_agent_open(pool, "b", &ag));
        const size_t n = (size_t)L * T * H * D;
        float *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        tu_fill_kv(k, n, &rng);
        tu_fill_kv(v, n, &rng);
        for (int t = 0; t < T; t++) /* a few keys far out, so the boxes differ */
            if (t % 13 == 5)
                for (int d = 0; d < H * D; d++) k[((size_t)layer * T + t) * H * D + d] *= 6.0f;
        const int64_t sh[4] = {L, T, H, D};
        kvmem_tensor tk, tv;
        assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, sh));
        assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, sh));
        assert_ok(kvmem_agent_append(ag, &tk, &tv, NULL));
        int32_t pos[61];
        for (int t = 0; t < T; t++)
            pos[t] = c->positions ? 5 * t + 3 - (t % 7 == 2 ? 4 : 0) + (t > 40 ? 900 : 0) : (int32_t)(c->base + t);
        /* the keys as ART sees them: stored raw keys rotated to their positions */
        float *kr = malloc((size_t)T * H * D * sizeof(float));
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                float *x = kr + ((size_t)t * H + h) * D;
                memcpy(x, k + (((size_t)layer * T + t) * H + h) * D, D * sizeof(float));
                assert_ok(kvmem_rope_apply(&spec, x, 1, (size_t)D, &pos[t], 0));
            }
        float q[3 * 4 * 32];
        for (int i = 0; i < R * Hq * D; i++) q[i] = tu_normal(&rng);
        const kvm_agent_mem *m = ag->mem;
        const int NT = m->n_sealed + (m->tail_n > 0);
        int64_t *tile_start = malloc(sizeof(int64_t) * (size_t)(NT + 1));
        for (int t = 0; t < m->n_sealed; t++) tile_start[t] = m->blocks[t].first_token;
        tile_start[m->n_sealed] = T - m->tail_n;
        tile_start[NT] = T;
        for (int causal = 1; causal >= 0; causal--) {
            int64_t row_lo[3], row_hi[3];
            for (int r = 0; r < R; r++) row_lo[r] = 0, row_hi[r] = causal ? T - R + r + 1 : T;
            kvm_attend_plan pl;
            memset(&pl, 0, sizeof pl);
            pl.n_rows = R, pl.n_q_heads = Hq, pl.n_kv_heads = H, pl.head_dim = D, pl.group = G;
            pl.scale = 1.0f / sqrtf((float)D);
            pl.q = q;
            pl.kind = KVMEM_ATTEND_SRC_AGENT;
            pl.T = T;
            pl.pool = pool;
            pl.mem = m;
            pl.layer = layer;
            pl.positions = c->positions ? pos : NULL;
            pl.base_position = c->positions ? 0 : c->base;
            pl.n_tiles = NT;
            pl.tile_start = tile_start;
            pl.row_lo = row_lo;
            pl.row_hi = row_hi;
            pl.causal = causal;
            float *score = malloc(sizeof(float) * (size_t)(H * NT));
            int32_t *order = malloc(sizeof(int32_t) * (size_t)(H * NT));
            int64_t rows = -1;
            assert_ok(kvm_attend_scored_order(ctx, &pl, order, score, NULL, &rows));
            assert_int_equal(rows, 0); /* no K row read: boxes only */
            for (int h = 0; h < H; h++)
                for (int t = 0; t < NT; t++) {
                    double best = -INFINITY, best_all = -INFINITY, mag = 0;
                    for (int r = 0; r < R; r++)
                        for (int g = 0; g < G; g++)
                            for (int64_t j = tile_start[t]; j < tile_start[t + 1]; j++) {
                                const float *qq = q + (r * Hq + h * G + g) * D, *kk = kr + (j * H + h) * D;
                                const double s = dot(qq, kk, D) / sqrt((double)D);
                                mag = fmax(mag, sqrt(dot(qq, qq, D) * dot(kk, kk, D)) / sqrt((double)D));
                                best_all = s > best_all ? s : best_all;
                                if (j < row_hi[r]) best = s > best ? s : best;
                            }
                    const double got = score[h * NT + t], tol = 1e-5 * (1.0 + mag);
                    if (isinf(best)) { /* no row sees it */
                        assert_true(isinf(got) && got < 0);
                        continue;
                    }
                    if (!(got >= best - tol))
                        fail_msg("%s, causal %d, head %d block %d: score %.9g below the largest logit %.9g", c->what,
                                 causal, h, t, got, best);
                    /* one key at one position: the box is the key, the bound is its logit */
                    if (c->block_size == 1 && !(got <= best_all + tol))
                        fail_msg("%s, causal %d, head %d block %d: score %.9g, logit %.9g", c->what, causal, h, t,
                                 got, best_all);
                }
            assert_orders_follow_scores(order, score, H, NT);
            free(score), free(order);
        }
        free(tile_start), free(kr), free(k), free(v);
        kvmem_agent_close(ag);
        kvmem_pool_free(pool);
    }
    kvmem_context_free(ctx);
}

/* ---- the public API: an order per KV head ---- */

/* Each KV head holds two strong keys in its own two tiles. With thresholds
 * every tile passes and patience 1, a stream stops after its second tile,
 * so each head's output is attention over exactly its two tiles. */
static void every_kv_head_follows_its_own_order(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    const int H = 2, G = 2, Hq = 4, D = 16, TS = 16, T = 16 * TS;
    const int strong[2][2] = {{2, 9}, {5, 13}}; /* tiles per KV head */
    uint64_t rng = 23;
    float q[4 * 16], out[4 * 16];
    float *k = malloc(sizeof(float) * T * H * D), *v = malloc(sizeof(float) * T * H * D);
    for (int i = 0; i < Hq * D; i++) q[i] = tu_normal(&rng);
    for (int i = 0; i < T * H * D; i++) k[i] = 0.1f * tu_normal(&rng), v[i] = tu_normal(&rng);
    for (int h = 0; h < H; h++)
        for (int s = 0; s < 2; s++) {
            const int j = strong[h][s] * TS + 3 + 5 * s;
            for (int d = 0; d < D; d++) k[(j * H + h) * D + d] = 2.0f * (q[(h * G) * D + d] + q[(h * G + 1) * D + d]);
        }
    kvmem_tensor tq, to, tk, tv;
    const int64_t qs[3] = {1, Hq, D}, ks[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 3, ks));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &tk;
    src.v = &tv;
    kvmem_attend_params ap = kvmem_attend_default_params();
    assert_int_equal(ap.order, KVMEM_ATTEND_SCORED);
    ap.tile_size = TS;
    ap.tau_s = ap.tau_d = 1e30f;
    ap.patience = 1;
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
    assert_int_equal(st.tiles_visited, 2 * H);
    /* the scan reads every K row, the attention V of its two tiles: half a row each */
    assert_int_equal(st.positions_read, 2 * TS * H / 2 + T * H / 2);
    for (int h = 0; h < H; h++) {
        /* the reference: this head's keys in its two tiles only */
        float kh[2 * 16 * 16], vh[2 * 16 * 16];
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < TS; i++) {
                memcpy(kh + (s * TS + i) * D, k + (((strong[h][s] * TS + i) * H) + h) * D, sizeof(float) * D);
                memcpy(vh + (s * TS + i) * D, v + (((strong[h][s] * TS + i) * H) + h) * D, sizeof(float) * D);
            }
        double ref[2 * 16];
        ref_attend(q + h * G * D, 1, G, 1, D, kh, vh, 2 * TS, NULL, 1.0 / sqrt(D), ref_all_visible, NULL, ref);
        const double e = ref_max_err(out + h * G * D, ref, (size_t)(G * D));
        if (!(e <= 2e-5)) fail_msg("KV head %d: error %g against its two strong tiles", h, e);
    }
    free(k), free(v);
    kvmem_context_free(ctx);
}

/* ---- the public API: a far token that matters ---- */

/* A recall-heavy history (as bench/attend.c's, smaller): logits decay with
 * age, 10 exp(-age / 32) - 3, except one far token per KV head whose logit
 * (9) beats them all and whose value points elsewhere. RECENT stops while the newest tiles agree
 * and never reaches it; the defaults (SCORED) read it first. Relative
 * error |o - o_full| / |o_full| over all heads. */
static double rel_err(const float *o, const double *ref, int n) {
    double a = 0, b = 0;
    for (int i = 0; i < n; i++) a += (o[i] - ref[i]) * (o[i] - ref[i]), b += ref[i] * ref[i];
    return sqrt(a / b);
}

static void defaults_keep_a_far_token_that_recent_loses(void **state) {
    (void)state;
    kvmem_context *ctx = tu_context(2);
    kvmem_model_spec spec = tu_spec(1, 32); /* 4 q heads, 2 KV heads */
    const int H = 2, G = 2, Hq = 4, D = 32, T = 1024, far = 100;
    uint64_t rng = 31;
    float u[2][32], w[2][32];
    for (int h = 0; h < H; h++) {
        double nu = 0;
        for (int d = 0; d < D; d++) {
            u[h][d] = tu_normal(&rng), w[h][d] = tu_normal(&rng);
            nu += (double)u[h][d] * u[h][d];
        }
        for (int d = 0; d < D; d++) u[h][d] /= (float)sqrt(nu);
    }
    float q[4 * 32], out[4 * 32];
    for (int hq = 0; hq < Hq; hq++)
        for (int d = 0; d < D; d++) q[hq * D + d] = 8.0f * u[hq / G][d] + 0.05f * tu_normal(&rng);
    /* post-RoPE keys (what ART attends to) and the raw keys an agent stores */
    float *k = malloc(sizeof(float) * T * H * D), *v = malloc(sizeof(float) * T * H * D);
    float *kraw = malloc(sizeof(float) * T * H * D);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const double age = T - 1 - t;
            const float boost = t == far ? 9.0f : (float)(10.0 * exp(-age / 32.0) - 3.0);
            for (int d = 0; d < D; d++) {
                /* logit = scale * q . k ~ boost (|q| = 8, scale = 1/sqrt(32)) */
                k[(t * H + h) * D + d] = 0.2f * tu_normal(&rng) + boost * u[h][d] * (float)sqrt(D) / 8.0f;
                v[(t * H + h) * D + d] = (t == far ? 3.0f * w[h][d] : 0.0f) + 0.5f * tu_normal(&rng) + 1.0f;
            }
            float *x = kraw + (t * H + h) * D;
            memcpy(x, k + (t * H + h) * D, sizeof(float) * D);
            const int32_t p = t;
            assert_ok(kvmem_rope_apply(&spec, x, 1, (size_t)D, &p, 1));
        }
    double ref[4 * 32];
    ref_attend(q, 1, Hq, H, D, k, v, T, NULL, 1.0 / sqrt(D), ref_all_visible, NULL, ref);
    kvmem_tensor tq, to, tk, tv;
    const int64_t qs[3] = {1, Hq, D}, ks[3] = {T, H, D};
    assert_ok(kvmem_tensor_init(&tq, q, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
    assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 3, ks));
    assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 3, ks));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_TENSORS;
    src.k = &tk;
    src.v = &tv;
    kvmem_attend_params ap = kvmem_attend_default_params();
    kvmem_attend_stats st;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
    const double e_scored = rel_err(out, ref, Hq * D);
    assert_int_equal(st.stopped_early, 1);
    ap.order = KVMEM_ATTEND_RECENT;
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
    const double e_recent = rel_err(out, ref, Hq * D);
    assert_int_equal(st.stopped_early, 1);
    if (!(e_scored <= 0.01 && e_recent >= 0.1))
        fail_msg("tensors: relative error %g with the defaults (SCORED), %g with RECENT", e_scored, e_recent);

    /* the same history in an agent (blocks of 16): SCORED from the AABBs */
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = KVMEM_F32;
    kvmem_pool *pool = NULL;
    kvmem_agent *ag = NULL;
    assert_ok(kvmem_pool_create(ctx, &spec, &pp, &pool));
    assert_ok(kvmem_agent_open(pool, "far", &ag));
    const int64_t as[4] = {1, T, H, D};
    kvmem_tensor ak, av;
    assert_ok(kvmem_tensor_init(&ak, kraw, KVMEM_F32, 4, as));
    assert_ok(kvmem_tensor_init(&av, v, KVMEM_F32, 4, as));
    assert_ok(kvmem_agent_append(ag, &ak, &av, NULL));
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = ag;
    ap = kvmem_attend_default_params();
    assert_ok(kvmem_attend(ctx, &tq, &src, &ap, &to, &st));
    const double e_agent = rel_err(out, ref, Hq * D);
    assert_int_equal(st.stopped_early, 1);
    if (!(e_agent <= 0.01)) fail_msg("agent: relative error %g with the defaults (SCORED)", e_agent);
    assert_true(st.positions_read < (int64_t)T * H / 2); /* stopped early, no K scan */
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    free(k), free(v), free(kraw);
    kvmem_context_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tensor_scores_are_the_exact_largest_logits),
        cmocka_unit_test(agent_scores_bound_every_logit),
        cmocka_unit_test(every_kv_head_follows_its_own_order),
        cmocka_unit_test(defaults_keep_a_far_token_that_recent_loses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* Backend conformance of dev_attend (core/backend/backend.h): one decode row of ART
 * attention on a slot-mapped K/V, run on the backend under test and on the
 * CPU backend's entry (kvm_attend_cpu on a one-row SLOTMAP plan), both
 * checked against a double-precision reference written here (scores, a
 * softmax over the live positions of the visited tiles, and the stop rule of
 * include/kvmem.h replayed in double).
 *
 * Tolerances (per query head; n = live positions read, D = head_dim,
 * u = 2^-24, A = scale * max over read rows of sum_d |q_d k_d|, Vm = the
 * largest |v| read):
 *   logits: |s - s_ref| <= e_s = 2 D u A (dot product of D terms, f32)
 *   weights: relative error <= e_w = 2 e_s + (3 + 4 A) 2u (exp within
 *            3 + 2|x| ulp, as Vulkan's precision rules allow; |x| <= 2A)
 *   output:  |o - o_ref| <= (2 e_w + 2 (n + 8) u) Vm (numerator and
 *            denominator, f32 accumulation of n terms)
 * Shapes: G 1/2/3/4/8/32, head_dim 1/16/32/33/64/80/128/256, tiles of 1 to
 * 500 positions with a partial last tile, dead slots (negative ids), orders
 * (sink then newest first, shuffled, a shuffled half), F32 and F16 K/V,
 * byte offsets on every buffer.
 * the same bound against the CPU entry (both are within it of the double
 * result: the bound is doubled). F16 K/V: both sides read the same f16
 * values exactly, so the bound is the same.
 *
 * Visited tiles: equal to the double-precision replay of the rule, for the
 * CPU entry and the backend, for every stream whose verdicts (up to where
 * the replay stops) are clear: each metric at least 2% of its threshold
 * (plus 1e-5 |z_prev| for scale, 1e-7 for direction) away from it, or the
 * other metric clearly failing. f32 evaluation of the metrics errs by about
 * 1e-6 relative, far inside that margin; a stream within it could flip on
 * rounding, so only its output is checked (against attention over exactly
 * the tiles it reports). Tests with the rule active assert that most
 * streams are clear and that some of them stop early, so the comparison is
 * never vacuous. tau_s = tau_d = 0: every live tile is visited, exactly.
 *
 * Long histories (a device kernel that goes wrong only past some length:
 * Vulkan on lavapipe once ran out of loop iterations past ~150 tiles):
 * tau 0 over thousands of positions and hundreds to thousands of tiles
 * (tiles of 1, 16, 64, 128, head_dim 32 to 256, GQA) must equal full
 * attention within the bound above and visit every live tile, at the
 * buffer level and through kvmem_attend on the backend's context (stats:
 * tiles_visited == tiles_total, stopped_early == 0). Vulkan runs a long
 * visit as many dispatches carrying the streams' state; a run with
 * KVMEM_VULKAN_LOOP_BUDGET=1 (one chunk per dispatch: tiles resumed
 * mid-way, the stop rule's state carried across) checks that machinery on
 * small cases too.
 *
 * Device-only contract (a device cannot read its memory to refuse): slot
 * ids >= n_slots are skipped like dead slots and tile ids outside
 * [0, n_tiles) are skipped; the CPU reference rejects both.
 *
 * Harness: conformance.h. */
#include "conformance.h"
#include "cpu/half.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct acase {
    int32_t H, G, D, tile, n_visit, patience;
    int64_t n_pos, n_slots;
    kvmem_dtype dt;
    float scale, tau_s, tau_d;
    float *q;          /* [H*G][D] */
    float *k, *v;      /* [n_slots][H][D] as read (f16-rounded when dt is F16) */
    uint16_t *kh, *vh; /* F16 bits */
    int32_t *slots;    /* n_pos */
    int32_t *order;    /* n_visit */
    size_t off;        /* byte offset used for every buffer */
} acase;

static void case_free(acase *c) {
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->kh);
    free(c->vh);
    free(c->slots);
    free(c->order);
    memset(c, 0, sizeof *c);
}

/* order kinds */
enum { ORD_RECENT, ORD_SHUFFLE, ORD_SUBSET };

/* A random case: ~dead_pct% of positions dead (-1 or another negative id),
 * live positions mapped to distinct random slots of a larger slot space. */
static void case_make(acase *c, uint64_t seed, int32_t H, int32_t G, int32_t D, int64_t n_pos, int32_t tile,
                      kvmem_dtype dt, int dead_pct, int ord) {
    memset(c, 0, sizeof *c);
    uint64_t rng = seed;
    c->H = H, c->G = G, c->D = D, c->n_pos = n_pos, c->tile = tile, c->dt = dt;
    c->n_slots = n_pos + n_pos / 3 + 1;
    c->scale = 1.0f / sqrtf((float)D);
    c->patience = 1;
    c->off = 8;
    const size_t nq = (size_t)H * G * D, nkv = (size_t)c->n_slots * H * D;
    c->q = malloc(nq * sizeof(float));
    c->k = malloc(nkv * sizeof(float));
    c->v = malloc(nkv * sizeof(float));
    c->kh = malloc(nkv * 2);
    c->vh = malloc(nkv * 2);
    c->slots = malloc(((size_t)n_pos + 1) * sizeof(int32_t));
    for (size_t i = 0; i < nq; i++) c->q[i] = 1.5f * tu_normal(&rng);
    for (size_t i = 0; i < nkv; i++) {
        float a = tu_normal(&rng), b = tu_normal(&rng);
        c->kh[i] = kvm_f32_to_f16(a);
        c->vh[i] = kvm_f32_to_f16(b);
        c->k[i] = dt == KVMEM_F16 ? kvm_f16_to_f32(c->kh[i]) : a;
        c->v[i] = dt == KVMEM_F16 ? kvm_f16_to_f32(c->vh[i]) : b;
    }
    /* a random injection of positions into slots: a shuffled slot list */
    int32_t *perm = malloc((size_t)c->n_slots * sizeof(int32_t));
    for (int64_t i = 0; i < c->n_slots; i++) perm[i] = (int32_t)i;
    for (int64_t i = c->n_slots - 1; i > 0; i--) {
        int64_t j = (int64_t)(tu_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t j = 0; j < n_pos; j++) {
        int dead = (int)(tu_next(&rng) % 100) < dead_pct;
        c->slots[j] = dead ? ((j & 1) ? -1 : -7) : perm[j];
    }
    free(perm);
    const int32_t n_tiles = (int32_t)((n_pos + tile - 1) / tile);
    c->order = malloc(((size_t)n_tiles + 1) * sizeof(int32_t));
    int32_t n = 0;
    if (ord == ORD_RECENT) { /* the sink tile, then newest to oldest */
        if (n_tiles > 0) c->order[n++] = 0;
        for (int32_t t = n_tiles - 1; t >= 1; t--) c->order[n++] = t;
    } else {
        for (int32_t t = 0; t < n_tiles; t++) c->order[n++] = t;
        for (int32_t i = n - 1; i > 0; i--) {
            int32_t j = (int32_t)(tu_next(&rng) % (uint64_t)(i + 1)), t = c->order[i];
            c->order[i] = c->order[j];
            c->order[j] = t;
        }
        if (ord == ORD_SUBSET) n = (n + 1) / 2;
    }
    c->n_visit = n;
}

static int is_live(const acase *c, int64_t j) { return c->slots[j] >= 0 && c->slots[j] < c->n_slots; }

/* Live tiles of the order, in order. */
static int32_t live_tiles(const acase *c, int32_t *out) {
    int32_t n = 0;
    for (int32_t i = 0; i < c->n_visit; i++) {
        const int32_t t = c->order[i];
        int any = 0;
        for (int64_t j = (int64_t)t * c->tile; j < KVM_MIN(((int64_t)t + 1) * c->tile, c->n_pos); j++) any |= is_live(c, j);
        if (any) out[n++] = t;
    }
    return n;
}

/* The stream of KV head g in double: runs the rule over the live tiles in
 * order (the rule decides when limit < 0, else exactly `limit` tiles),
 * writes the output [G][D] and the tolerance per head, returns the tiles
 * visited; *clear says whether every verdict was clear of the thresholds. */
static int32_t ref_stream(const acase *c, int32_t g, int32_t limit, double *out, double *tol, int *clear) {
    const int32_t G = c->G, D = c->D, N = G * D;
    int32_t *lt = malloc(((size_t)c->n_visit + 1) * sizeof(int32_t));
    const int32_t n_live = live_tiles(c, lt);
    double *num = calloc((size_t)N, sizeof(double)), *den = calloc((size_t)G, sizeof(double));
    double *mx = malloc((size_t)G * sizeof(double)), *z = malloc(32 * sizeof(double)), *zp = malloc(32 * sizeof(double));
    double *amax = calloc((size_t)G, sizeof(double));
    double vmax = 0;
    int64_t n_read = 0;
    /* the largest logit over all live positions: a fixed shift, exact in double */
    for (int32_t h = 0; h < G; h++) mx[h] = -INFINITY;
    for (int64_t j = 0; j < c->n_pos; j++) {
        if (!is_live(c, j)) continue;
        const float *kr = c->k + ((size_t)c->slots[j] * c->H + g) * D;
        for (int32_t h = 0; h < G; h++) {
            const float *qr = c->q + ((size_t)g * G + h) * D;
            double s = 0;
            for (int32_t d = 0; d < D; d++) s += (double)qr[d] * kr[d];
            s *= c->scale;
            mx[h] = fmax(mx[h], s);
        }
    }
    const int32_t np = N > 32 ? 32 : N, stride = N / 32;
    int has_prev = 0, streak = 0;
    double prev_norm = 0;
    int32_t visited = 0;
    *clear = 1;
    const int stop_enabled = c->tau_s > 0 || c->tau_d > 0;
    for (int32_t i = 0; i < n_live; i++) {
        if (limit >= 0 && visited == limit) break;
        const int32_t t = lt[i];
        for (int64_t j = (int64_t)t * c->tile; j < KVM_MIN(((int64_t)t + 1) * c->tile, c->n_pos); j++) {
            if (!is_live(c, j)) continue;
            n_read++;
            const float *kr = c->k + ((size_t)c->slots[j] * c->H + g) * D;
            const float *vr = c->v + ((size_t)c->slots[j] * c->H + g) * D;
            for (int32_t d = 0; d < D; d++) vmax = fmax(vmax, fabs(vr[d]));
            for (int32_t h = 0; h < G; h++) {
                const float *qr = c->q + ((size_t)g * G + h) * D;
                double s = 0, sa = 0;
                for (int32_t d = 0; d < D; d++) {
                    s += (double)qr[d] * kr[d];
                    sa += fabs((double)qr[d] * kr[d]);
                }
                amax[h] = fmax(amax[h], sa * c->scale);
                const double w = exp(s * c->scale - mx[h]);
                den[h] += w;
                for (int32_t d = 0; d < D; d++) num[h * D + d] += w * vr[d];
            }
        }
        visited++;
        /* the probe and the rule */
        double nz = 0;
        for (int32_t p = 0; p < np; p++) {
            const int32_t f = N > 32 ? p * stride + stride / 2 : p;
            z[p] = num[f] / den[f / D];
            nz += z[p] * z[p];
        }
        nz = sqrt(nz);
        int fire = 0;
        if (has_prev) {
            int ok;
            if (prev_norm == 0 || nz == 0) {
                ok = prev_norm == 0 && nz == 0;
            } else {
                double e2 = 0;
                for (int32_t p = 0; p < np; p++) {
                    const double e = z[p] / nz - zp[p] / prev_norm;
                    e2 += e * e;
                }
                const double ms = fabs(nz - prev_norm), ts = (double)c->tau_s * prev_norm;
                const double md = 0.5 * e2, td = c->tau_d;
                const int s_ok = ms <= ts, d_ok = md <= td;
                const int s_clear = fabs(ms - ts) > 0.02 * ts + 1e-5 * prev_norm;
                const int d_clear = fabs(md - td) > 0.02 * td + 1e-7;
                if (stop_enabled && limit < 0 && !((s_clear && d_clear) || (s_clear && !s_ok) || (d_clear && !d_ok)))
                    *clear = 0;
                ok = s_ok && d_ok;
            }
            streak = ok ? streak + 1 : 0;
            fire = stop_enabled && streak >= c->patience;
        }
        memcpy(zp, z, 32 * sizeof(double));
        prev_norm = nz;
        has_prev = 1;
        if (fire && limit < 0) break;
    }
    const double u = ldexp(1.0, -24);
    for (int32_t h = 0; h < G; h++) {
        for (int32_t d = 0; d < D; d++) out[h * D + d] = den[h] > 0 ? num[h * D + d] / den[h] : 0.0;
        const double es = 2.0 * D * u * amax[h], ew = 2.0 * es + (3.0 + 4.0 * amax[h]) * 2.0 * u;
        tol[h] = (2.0 * ew + 2.0 * ((double)n_read + 8.0) * u) * vmax + 1e-30;
    }
    free(lt);
    free(num);
    free(den);
    free(mx);
    free(z);
    free(zp);
    free(amax);
    return visited;
}

/* Buffers of one case on one backend. */
typedef struct abufs {
    kvmem_buffer *q, *k, *v, *s, *o, *out, *vis;
} abufs;

static kvmem_buffer *bnew_at(kvmem_backend *be, const void *src, size_t n, size_t off) {
    kvmem_buffer *b = balloc(be, off + n + 4);
    unsigned char fill[64];
    memset(fill, 0x5c, sizeof fill);
    bput(be, b, 0, fill, off); /* bytes before the data: garbage to be skipped */
    if (n) bput(be, b, off, src, n);
    return b;
}

static void abufs_make(kvmem_backend *be, const acase *c, abufs *b) {
    const size_t es = c->dt == KVMEM_F32 ? 4 : 2, nq = (size_t)c->H * c->G * c->D * 4;
    const size_t nkv = (size_t)c->n_slots * c->H * c->D * es;
    b->q = bnew_at(be, c->q, nq, c->off);
    b->k = bnew_at(be, c->dt == KVMEM_F32 ? (const void *)c->k : (const void *)c->kh, nkv, c->off);
    b->v = bnew_at(be, c->dt == KVMEM_F32 ? (const void *)c->v : (const void *)c->vh, nkv, c->off);
    b->s = bnew_at(be, c->slots, (size_t)c->n_pos * 4, c->off);
    b->o = bnew_at(be, c->order, (size_t)c->n_visit * 4, c->off);
    float *sent = malloc(nq);
    for (size_t i = 0; i < nq / 4; i++) sent[i] = 12345.0f;
    b->out = bnew_at(be, sent, nq, c->off);
    int32_t vs[1024];
    for (int i = 0; i < 1024; i++) vs[i] = -99;
    b->vis = bnew_at(be, vs, (size_t)c->H * 4, c->off);
    free(sent);
}

static void abufs_free(kvmem_backend *be, abufs *b) {
    kvmem_buffer *all[7] = {b->q, b->k, b->v, b->s, b->o, b->out, b->vis};
    for (int i = 0; i < 7; i++) be->iface->buffer_free(be, all[i]);
}

static kvm_dev_attend_args args_of(const acase *c, const abufs *b) {
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    a.q = b->q, a.k = b->k, a.v = b->v, a.slot_map = b->s, a.order = b->o, a.out = b->out, a.visited = b->vis;
    a.q_off = a.k_off = a.v_off = a.slot_map_off = a.order_off = a.out_off = a.visited_off = c->off;
    a.n_slots = c->n_slots, a.n_pos = c->n_pos;
    a.n_q_heads = c->H * c->G, a.n_kv_heads = c->H, a.head_dim = c->D, a.tile = c->tile, a.n_visit = c->n_visit;
    a.dtype = c->dt, a.scale = c->scale, a.tau_s = c->tau_s, a.tau_d = c->tau_d, a.patience = c->patience;
    return a;
}

/* Run on one backend: outputs and visited counts into out / vis. */
static kvmem_status run_on(kvmem_backend *be, const acase *c, float *out, int32_t *vis) {
    abufs b;
    abufs_make(be, c, &b);
    kvm_dev_attend_args a = args_of(c, &b);
    kvmem_status st = be->iface->dev_attend(be, &a);
    if (st == KVMEM_OK) {
        bget(be, b.out, c->off, out, (size_t)c->H * c->G * c->D * 4);
        bget(be, b.vis, c->off, vis, (size_t)c->H * 4);
    }
    abufs_free(be, &b);
    return st;
}

typedef struct outcome {
    int32_t clear, stopped, ambiguous;
} outcome;

/* Count stream g's verdicts; where they were clear, the backend (vb) and
 * the CPU entry (vc) read the reference's rv of n_live tiles. */
static void tally(outcome *r, int clear, int32_t g, int32_t rv, int32_t n_live, int32_t vb, int32_t vc) {
    if (!clear) {
        r->ambiguous++;
        return;
    }
    r->clear++;
    r->stopped += rv < n_live;
    if (vb != rv || vc != rv)
        fail_msg("KV head %d: visited %d (%s), %d (cpu), reference %d of %d live tiles", g, vb, g_name, vc, rv, n_live);
}

/* The case on the backend under test and on the CPU entry, each against the
 * double-precision reference; returns counts over streams. */
static outcome check_case_on(const acase *c, int with_cpu) {
    outcome r = {0, 0, 0};
    const size_t nq = (size_t)c->H * c->G * c->D;
    float *ob = malloc(nq * 4), *oc = malloc(nq * 4);
    int32_t *vb = malloc((size_t)c->H * 4), *vc = malloc((size_t)c->H * 4);
    assert_ok(run_on(g_be, c, ob, vb));
    if (with_cpu) {
        assert_ok(run_on(g_cpu, c, oc, vc));
    } else { /* inputs only a device accepts: the replay alone */
        memcpy(oc, ob, nq * 4);
        memcpy(vc, vb, (size_t)c->H * 4);
    }
    int32_t *lt = malloc(((size_t)c->n_visit + 1) * sizeof(int32_t));
    const int32_t n_live = live_tiles(c, lt);
    double *ref = malloc(nq / c->H * sizeof(double)), *tol = malloc((size_t)c->G * sizeof(double));
    for (int32_t g = 0; g < c->H; g++) {
        int clear;
        const int32_t rv = ref_stream(c, g, -1, ref, tol, &clear); /* ref, tol: the output after rv tiles */
        if (!(c->tau_s > 0 || c->tau_d > 0)) assert_int_equal(rv, n_live);
        tally(&r, clear, g, rv, n_live, vb[g], vc[g]);
        assert_true(vb[g] >= 0 && vb[g] <= n_live && vc[g] >= 0 && vc[g] <= n_live);
        const float *outs[2] = {ob, oc};
        const int32_t vis[2] = {vb[g], vc[g]};
        for (int x = 0; x < 2; x++) {
            int cl;
            if (vis[x] != (x ? vis[0] : rv)) ref_stream(c, g, vis[x], ref, tol, &cl); /* else ref holds it */
            for (int32_t h = 0; h < c->G; h++)
                for (int32_t d = 0; d < c->D; d++) {
                    const size_t i = ((size_t)g * c->G + h) * c->D + d;
                    const double e = fabs((double)outs[x][i] - ref[h * c->D + d]);
                    if (!(e <= tol[h]))
                        fail_msg("%s: head %d dim %d: %.9g vs reference %.9g (tolerance %.3g, %d tiles)",
                                 x ? "cpu" : g_name, g * c->G + h, d, (double)outs[x][i], ref[h * c->D + d], tol[h],
                                 vis[x]);
                    if (x == 0 && vb[g] == vc[g] && !(fabs((double)ob[i] - oc[i]) <= 2 * tol[h]))
                        fail_msg("head %d dim %d: %s %.9g vs cpu %.9g", g * c->G + h, d, g_name, (double)ob[i],
                                 (double)oc[i]);
                }
        }
    }
    free(ob);
    free(oc);
    free(vb);
    free(vc);
    free(lt);
    free(ref);
    free(tol);
    return r;
}

static outcome check_case(const acase *c) { return check_case_on(c, 1); }

/* ---- full attention: tau 0 ---- */

static void test_full_attention_shapes_orders_dtypes(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    const int32_t Gs[] = {1, 4, 8}, Ds[] = {64, 128, 80};
    uint64_t seed = 100;
    for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 3; di++)
            for (int ord = 0; ord < 3; ord++) {
                acase c;
                /* 301 positions in tiles of 32: the last tile is partial */
                case_make(&c, seed++, 2, Gs[gi], Ds[di], 301, 32, (gi + di + ord) % 2 ? KVMEM_F16 : KVMEM_F32, 20, ord);
                check_case(&c);
                case_free(&c);
            }
}

static void test_full_attention_large_head_dim_and_tiles(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    /* head_dim 256 with G = 8 (2048 outputs per stream), one big tile */
    acase c;
    case_make(&c, 7, 2, 8, 256, 200, 64, KVMEM_F32, 10, ORD_SHUFFLE);
    check_case(&c);
    case_free(&c);
    /* tiles longer than a workgroup's chunk, mostly dead */
    case_make(&c, 8, 3, 1, 64, 1000, 500, KVMEM_F16, 70, ORD_RECENT);
    check_case(&c);
    case_free(&c);
    /* tile 1 */
    case_make(&c, 9, 1, 2, 32, 40, 1, KVMEM_F32, 30, ORD_SHUFFLE);
    check_case(&c);
    case_free(&c);
    /* odd head_dim in f16: rows start in either half of a 32-bit word */
    case_make(&c, 10, 3, 3, 33, 150, 16, KVMEM_F16, 20, ORD_SHUFFLE);
    c.tau_s = 0.01f, c.tau_d = 0.001f;
    check_case(&c);
    case_free(&c);
    /* head_dim 1, one KV head with 8 query heads (the probe is the whole output) */
    case_make(&c, 15, 1, 8, 1, 64, 4, KVMEM_F16, 10, ORD_RECENT);
    check_case(&c);
    case_free(&c);
}

/* ---- long histories ---- */

typedef struct long_shape {
    int32_t H, G, D;
    int64_t T;
    int32_t tile;
    kvmem_dtype dt;
    int dead_pct, ord;
} long_shape;

/* Every case visits hundreds to thousands of tiles: far past the ~150 where
 * the single-dispatch Vulkan kernel went wrong. */
static void test_full_attention_long_histories(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    const long_shape shapes[] = {
        {2, 1, 128, 1200, 1, KVMEM_F32, 10, ORD_SHUFFLE},  /* 1200 tiles of one position */
        {2, 4, 64, 8000, 16, KVMEM_F16, 10, ORD_RECENT},   /* GQA 4:1, 500 tiles */
        {1, 8, 32, 16000, 64, KVMEM_F32, 20, ORD_SHUFFLE}, /* GQA 8:1, 250 tiles */
        {1, 2, 256, 6400, 16, KVMEM_F16, 10, ORD_SHUFFLE}, /* head_dim 256, 400 tiles */
        {1, 1, 32, 64000, 128, KVMEM_F16, 10, ORD_RECENT}, /* 500 tiles of 128 */
        {1, 16, 64, 6400, 32, KVMEM_F32, 5, ORD_SHUFFLE},  /* 16 heads per stream: 4 chunks per tile */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const long_shape *x = &shapes[i];
        acase c;
        case_make(&c, 900 + i, x->H, x->G, x->D, x->T, x->tile, x->dt, x->dead_pct, x->ord);
        print_message("H %d G %d head_dim %d: %lld positions in %d tiles of %d, %d visited\n", x->H, x->G, x->D,
                      (long long)x->T, (int)((x->T + x->tile - 1) / x->tile), x->tile, c.n_visit);
        check_case(&c); /* tau 0: every live tile visited, full attention within the bound */
        case_free(&c);
    }
}

/* kvmem_attend on the backend's context (the device path: one row, a
 * TENSORS source, tau 0): the shapes of the report, and GQA in f16. */
static void test_attend_api_long_histories(void **state) {
    (void)state;
    NEED_BACKEND();
    const long_shape shapes[] = {
        {1, 1, 128, 200, 1, KVMEM_F32, 0, ORD_RECENT},  {1, 1, 128, 12800, 64, KVMEM_F32, 0, ORD_RECENT},
        {1, 1, 64, 400, 1, KVMEM_F32, 0, ORD_RECENT},   {1, 1, 32, 2000, 1, KVMEM_F32, 0, ORD_RECENT},
        {2, 4, 128, 4096, 16, KVMEM_F16, 0, ORD_RECENT},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const long_shape *x = &shapes[i];
        acase c;
        case_make(&c, 950 + i, x->H, x->G, x->D, x->T, x->tile, x->dt, 0, x->ord);
        /* a TENSORS source: K and V rows in position order (the reference
         * then reads slot j for position j) */
        const size_t row = (size_t)x->H * x->D, es = x->dt == KVMEM_F32 ? 4 : 2;
        float *k = malloc((size_t)x->T * row * 4), *v = malloc((size_t)x->T * row * 4);
        uint16_t *kh = malloc((size_t)x->T * row * 2), *vh = malloc((size_t)x->T * row * 2);
        for (int64_t j = 0; j < x->T; j++) {
            const size_t from = (size_t)c.slots[j] * row, to = (size_t)j * row;
            memcpy(k + to, c.k + from, row * 4);
            memcpy(v + to, c.v + from, row * 4);
            memcpy(kh + to, c.kh + from, row * 2);
            memcpy(vh + to, c.vh + from, row * 2);
            c.slots[j] = (int32_t)j;
        }
        free(c.k), free(c.v), free(c.kh), free(c.vh);
        c.k = k, c.v = v, c.kh = kh, c.vh = vh, c.n_slots = x->T;
        const int64_t qs[3] = {1, (int64_t)x->H * x->G, x->D}, kvs[3] = {x->T, x->H, x->D};
        float *out = malloc((size_t)x->H * x->G * x->D * 4);
        kvmem_tensor tq, tk, tv, to;
        assert_ok(kvmem_tensor_init(&tq, c.q, KVMEM_F32, 3, qs));
        assert_ok(kvmem_tensor_init(&to, out, KVMEM_F32, 3, qs));
        assert_ok(kvmem_tensor_init(&tk, es == 4 ? (void *)c.k : (void *)c.kh, x->dt, 3, kvs));
        assert_ok(kvmem_tensor_init(&tv, es == 4 ? (void *)c.v : (void *)c.vh, x->dt, 3, kvs));
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_TENSORS;
        src.k = &tk;
        src.v = &tv;
        kvmem_attend_params prm = kvmem_attend_default_params();
        prm.tile_size = x->tile;
        prm.tau_s = prm.tau_d = 0.0f;
        prm.scale = c.scale;
        kvmem_attend_stats st;
        assert_ok(kvmem_attend(g_ctx, &tq, &src, &prm, &to, &st));
        const int64_t n_tiles = (x->T + x->tile - 1) / x->tile;
        if (st.stopped_early || st.streams_stopped || st.tiles_visited != st.tiles_total ||
            st.tiles_total != x->H * n_tiles || st.positions_read != x->H * x->T)
            fail_msg("kvmem_attend on %s, head_dim %d, T %lld, tile %d: stopped_early %d, %lld streams stopped, "
                     "%lld of %lld tiles visited (%lld expected), %lld positions read",
                     g_name, x->D, (long long)x->T, x->tile, st.stopped_early, (long long)st.streams_stopped,
                     (long long)st.tiles_visited, (long long)st.tiles_total, (long long)(x->H * n_tiles),
                     (long long)st.positions_read);
        double *ref = malloc((size_t)x->G * x->D * sizeof(double)), *tol = malloc((size_t)x->G * sizeof(double));
        for (int32_t g = 0; g < x->H; g++) {
            int clear;
            assert_int_equal(ref_stream(&c, g, -1, ref, tol, &clear), n_tiles);
            for (int32_t h = 0; h < x->G; h++)
                for (int32_t d = 0; d < x->D; d++) {
                    const double got = out[((size_t)g * x->G + h) * x->D + d], e = fabs(got - ref[h * x->D + d]);
                    if (!(e <= tol[h]))
                        fail_msg("kvmem_attend on %s, head_dim %d, T %lld, tile %d: head %d dim %d: %.9g vs "
                                 "reference %.9g (tolerance %.3g)",
                                 g_name, x->D, (long long)x->T, x->tile, g * x->G + h, d, got, ref[h * x->D + d],
                                 tol[h]);
                }
        }
        free(ref);
        free(tol);
        free(out);
        case_free(&c);
    }
}

/* ---- the stop rule ---- */

static void test_stop_rule_matches_replay(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    const struct {
        float tau_s, tau_d;
        int32_t patience;
    } rules[] = {{0.01f, 0.001f, 1}, {0.003f, 0.0003f, 2}, {0.05f, 0.0005f, 3}, {0.02f, 0.002f, 1}, {0.001f, 0.0001f, 4}};
    const int32_t Gs[] = {1, 4, 8}, Ds[] = {64, 128, 80};
    outcome tot = {0, 0, 0};
    uint64_t seed = 500;
    for (size_t ri = 0; ri < sizeof rules / sizeof rules[0]; ri++)
        for (int si = 0; si < 3; si++) {
            acase c;
            case_make(&c, seed++, 4, Gs[si], Ds[(si + ri) % 3], 1500, 16, (ri + si) % 2 ? KVMEM_F16 : KVMEM_F32, 15,
                      (int)(ri + si) % 3);
            c.tau_s = rules[ri].tau_s;
            c.tau_d = rules[ri].tau_d;
            c.patience = rules[ri].patience;
            outcome o = check_case(&c);
            tot.clear += o.clear;
            tot.stopped += o.stopped;
            tot.ambiguous += o.ambiguous;
            case_free(&c);
        }
    print_message("stop rule: %d streams compared (%d stopped early), %d within rounding of a threshold\n", tot.clear,
                  tot.stopped, tot.ambiguous);
    assert_true(tot.clear >= 4 * tot.ambiguous);
    assert_true(tot.stopped >= tot.clear / 4);
}

/* One chunk per dispatch on Vulkan (the env is read by each call; other
 * backends ignore it): tiles longer than a chunk resumed mid-way, the stop
 * rule's streak and previous probe carried from dispatch to dispatch, and
 * streams that stop while others go on. */
static void test_state_across_dispatches(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    setenv("KVMEM_VULKAN_LOOP_BUDGET", "1", 1);
    outcome tot = {0, 0, 0};
    acase c;
    /* tiles of 200 and 500 positions: 7 and 4 chunks each */
    case_make(&c, 61, 2, 4, 64, 1000, 200, KVMEM_F32, 10, ORD_SHUFFLE);
    check_case(&c);
    case_free(&c);
    case_make(&c, 62, 3, 1, 32, 1800, 500, KVMEM_F16, 30, ORD_RECENT);
    check_case(&c);
    case_free(&c);
    const struct {
        float tau_s, tau_d;
        int32_t patience;
    } rules[] = {{0.01f, 0.001f, 1}, {0.003f, 0.0003f, 2}, {0.02f, 0.002f, 3}};
    for (int ri = 0; ri < 3; ri++) {
        case_make(&c, 63 + (uint64_t)ri, 4, ri == 1 ? 8 : 2, 64, 400, ri == 2 ? 40 : 8,
                  ri % 2 ? KVMEM_F16 : KVMEM_F32, 15, ri);
        c.tau_s = rules[ri].tau_s;
        c.tau_d = rules[ri].tau_d;
        c.patience = rules[ri].patience;
        outcome o = check_case(&c);
        tot.clear += o.clear;
        tot.stopped += o.stopped;
        tot.ambiguous += o.ambiguous;
        case_free(&c);
    }
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
    print_message("one chunk per dispatch: %d streams compared (%d stopped early), %d within rounding of a "
                  "threshold\n", tot.clear, tot.stopped, tot.ambiguous);
    assert_true(tot.clear >= 4 * tot.ambiguous);
    assert_true(tot.stopped >= 1 && tot.stopped < tot.clear); /* some stop, some run to the end */
}

/* ---- edges ---- */

static void test_empty_and_dead_streams(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    acase c;
    /* no positions: zeros, no tile visited */
    case_make(&c, 11, 2, 2, 16, 0, 8, KVMEM_F32, 0, ORD_RECENT);
    check_case(&c);
    case_free(&c);
    /* positions but an empty order */
    case_make(&c, 12, 2, 2, 16, 50, 8, KVMEM_F32, 0, ORD_RECENT);
    c.n_visit = 0;
    check_case(&c);
    case_free(&c);
    /* every position dead: zeros, nothing read */
    case_make(&c, 13, 2, 4, 32, 77, 8, KVMEM_F16, 100, ORD_SHUFFLE);
    check_case(&c);
    case_free(&c);
    /* whole dead tiles between live ones (not counted as visited) */
    case_make(&c, 14, 2, 4, 32, 96, 8, KVMEM_F32, 0, ORD_SHUFFLE);
    for (int64_t j = 16; j < 48; j++) c.slots[j] = -1;
    c.tau_s = 0.05f, c.tau_d = 0.01f, c.patience = 1;
    check_case(&c);
    case_free(&c);
}

/* Slot ids >= n_slots and tile ids out of range: the CPU reference refuses
 * them; a device skips them (a CPU run with them removed is the reference). */
static void test_out_of_range_ids(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    acase c;
    case_make(&c, 21, 2, 4, 64, 120, 16, KVMEM_F32, 10, ORD_SHUFFLE);
    c.slots[5] = (int32_t)c.n_slots;
    c.slots[70] = (int32_t)c.n_slots + 1000;
    float *out = malloc(2 * 4 * 64 * 4);
    int32_t vis[2];
    assert_status(run_on(g_cpu, &c, out, vis), KVMEM_ERR_INVALID_ARG, "slot_map[5]");
    if (g_be != g_cpu) check_case_on(&c, 0); /* the replay treats them as dead */
    c.slots[5] = c.slots[70] = 0;
    int32_t keep = c.order[0];
    c.order[0] = 100; /* tile id outside [0, 8) */
    assert_status(run_on(g_cpu, &c, out, vis), KVMEM_ERR_INVALID_ARG, "order[0]");
    c.order[0] = c.order[1]; /* repeated */
    assert_status(run_on(g_cpu, &c, out, vis), KVMEM_ERR_INVALID_ARG, "repeated");
    if (g_be != g_cpu) {
        c.order[0] = -3;
        float *o2 = malloc(2 * 4 * 64 * 4);
        int32_t v2[2];
        assert_ok(run_on(g_be, &c, out, vis));
        c.order[0] = keep;
        c.order++; /* the same order without the bad id */
        c.n_visit--;
        assert_ok(run_on(g_cpu, &c, o2, v2));
        c.order--;
        c.n_visit++;
        assert_int_equal(vis[0], v2[0]);
        assert_int_equal(vis[1], v2[1]);
        for (int i = 0; i < 2 * 4 * 64; i++) assert_true(fabsf(out[i] - o2[i]) <= 1e-4f * (1.0f + fabsf(o2[i])));
        free(o2);
    }
    free(out);
    case_free(&c);
}

/* A live position whose logit is not finite (a NaN or infinite K element,
 * or a query so large the product overflows) is reported by the stream that
 * reads it, visited = -1 - a position where it is so, for the CPU entry and
 * every device (the other outputs of such a call are unspecified). */
static void test_nonfinite_logits_are_reported(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    const kvmem_dtype dts[2] = {KVMEM_F32, KVMEM_F16};
    for (int di = 0; di < 2; di++)
        for (int kind = 0; kind < 3; kind++) {
            acase c;
            case_make(&c, 31 + (uint64_t)kind, 3, 2, 32, 200, 16, dts[di], 10, ORD_SHUFFLE);
            const int32_t g = 1; /* the stream with the bad value */
            int64_t j = 137;     /* a live position of it */
            while (!is_live(&c, j)) j++;
            const size_t row = ((size_t)c.slots[j] * (size_t)c.H + (size_t)g) * (size_t)c.D;
            if (kind == 0) { /* NaN in K */
                c.k[row + 5] = NAN;
                c.kh[row + 5] = 0x7e00;
            } else if (kind == 1) { /* +inf in K */
                c.k[row + 3] = INFINITY;
                c.kh[row + 3] = 0x7c00;
            } else { /* finite K, a query head of the stream whose products overflow */
                for (int32_t d = 0; d < c.D; d++) c.q[((size_t)g * c.G + 1) * c.D + (size_t)d] = 3e38f;
            }
            float *out = malloc((size_t)c.H * c.G * c.D * 4);
            int32_t vis[3];
            assert_ok(run_on(g_be, &c, out, vis));
            if (vis[g] >= 0) fail_msg("%s, kind %d: stream %d reported %d tiles, not its non-finite logit", g_name, kind, g, vis[g]);
            const int64_t p = -1 - (int64_t)vis[g];
            assert_true(p >= 0 && p < c.n_pos && is_live(&c, p));
            if (kind < 2) assert_int_equal(p, j); /* the only position with a bad K row */
            free(out);
            case_free(&c);
        }
}

/* A shape beyond a device's limits: computed, or refused as unsupported
 * with a message and nothing written. */
static void test_large_group_supported_or_refused(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    acase c;
    case_make(&c, 31, 1, 32, 256, 70, 32, KVMEM_F32, 0, ORD_RECENT); /* 8192 outputs per stream */
    abufs b;
    abufs_make(g_be, &c, &b);
    kvm_dev_attend_args a = args_of(&c, &b);
    kvmem_status st = g_be->iface->dev_attend(g_be, &a);
    abufs_free(g_be, &b);
    if (st == KVMEM_OK) {
        check_case(&c);
    } else {
        assert_int_equal(st, KVMEM_ERR_UNSUPPORTED);
        assert_non_null(strstr(kvmem_last_error(), "dev_attend")); /* a message naming the op and the limit */
        assert_true(g_be != g_cpu);
    }
    case_free(&c);
}

/* ---- bad input: a status, a message, nothing written ---- */

static void test_bad_input(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    acase c;
    case_make(&c, 41, 2, 2, 16, 40, 8, KVMEM_F32, 0, ORD_RECENT);
    abufs b;
    abufs_make(g_be, &c, &b);
    const kvm_dev_attend_args good = args_of(&c, &b);
    kvm_dev_attend_args a;
    const kvmem_status INV = KVMEM_ERR_INVALID_ARG;
#define BAD(mod, needle)                                              \
    do {                                                              \
        a = good;                                                     \
        mod;                                                          \
        assert_status(g_be->iface->dev_attend(g_be, &a), INV, needle); \
    } while (0)
    assert_status(g_be->iface->dev_attend(g_be, NULL), INV, "args is NULL");
    BAD(a.q = NULL, "NULL");
    BAD(a.out = NULL, "NULL");
    BAD(a.visited = NULL, "NULL");
    BAD(a.slot_map = NULL, "NULL");
    BAD(a.order = NULL, "NULL");
    BAD(a.n_q_heads = 3, "multiple of n_kv_heads");
    BAD(a.n_kv_heads = 0, "multiple of n_kv_heads");
    BAD(a.head_dim = 0, "head_dim");
    BAD(a.head_dim = 2000, "head_dim");
    BAD(a.tile = 0, "tile");
    BAD(a.n_pos = -1, "n_pos");
    BAD(a.n_slots = -1, "n_slots");
    BAD(a.n_visit = 6, "exceeds the 5 tiles");
    BAD(a.n_visit = -1, "n_visit");
    BAD(a.dtype = KVMEM_BF16, "F32 or F16");
    BAD(a.scale = 0.0f, "scale");
    BAD(a.scale = NAN, "scale");
    BAD(a.tau_s = -1.0f, "tau_s");
    BAD(a.tau_d = INFINITY, "tau_d");
    BAD(a.patience = 0, "patience");
    BAD(a.q_off = 2, "multiples of 4");
    BAD(a.k_off = 6, "multiples of 4");
    BAD(a.n_slots = c.n_slots + 1, "outside the buffers");
    BAD(a.n_pos = 200, "outside the buffers");
    BAD(a.out_off = 64, "outside the buffers");
    BAD(a.visited_off = 4096, "outside the buffers");
    BAD(a.head_dim = 32, "outside the buffers");
    BAD(a.scored = 2, "scored");
    BAD((a.scored = 1, a.n_visit = 4), "must be the 5 tiles");
    BAD(a.scored = 1, "outside the buffers"); /* an order per KV head and two counts each: the buffers hold one */
#undef BAD
    /* nothing written */
    float out[2 * 2 * 16];
    int32_t vis[2];
    bget(g_be, b.out, c.off, out, sizeof out);
    bget(g_be, b.vis, c.off, vis, sizeof vis);
    for (size_t i = 0; i < sizeof out / sizeof out[0]; i++) assert_true(out[i] == 12345.0f);
    assert_int_equal(vis[0], -99);
    assert_int_equal(vis[1], -99);
    /* and the good arguments still run */
    assert_ok(g_be->iface->dev_attend(g_be, &good));
    abufs_free(g_be, &b);
    case_free(&c);
}

/* ---- the scored form: each stream's SCORED order found by the backend ----
 * Reference: each tile's largest logit in double over its live positions
 * and the stream's query heads, sorted highest first, ties newest first.
 * The backend's order must equal the CPU entry's and be sorted by the
 * reference scores within the logit bound e_s (a pair closer than that may
 * come either way in f32); visited, the positions each stream reports and
 * the output are checked against the replay of the rule over the
 * backend's own order of that stream, as check_case does for a given order. */

static void ref_scores(const acase *c, int32_t g, double *score, double *es) {
    const int32_t n_tiles = (int32_t)((c->n_pos + c->tile - 1) / c->tile);
    *es = 0;
    for (int32_t t = 0; t < n_tiles; t++) {
        score[t] = -INFINITY;
        for (int64_t j = (int64_t)t * c->tile; j < KVM_MIN(((int64_t)t + 1) * c->tile, c->n_pos); j++) {
            if (!is_live(c, j)) continue;
            const float *kr = c->k + ((size_t)c->slots[j] * c->H + g) * c->D;
            for (int32_t h = 0; h < c->G; h++) {
                const float *qr = c->q + ((size_t)g * c->G + h) * c->D;
                double x = 0, xa = 0;
                for (int32_t d = 0; d < c->D; d++) x += (double)qr[d] * kr[d], xa += fabs((double)qr[d] * kr[d]);
                score[t] = fmax(score[t], x * c->scale);
                *es = fmax(*es, 4.0 * c->D * ldexp(1.0, -24) * xa * c->scale);
            }
        }
    }
}

static kvmem_status run_scored(kvmem_backend *be, const acase *c, float *out, int32_t *vis, int32_t *ord) {
    const int32_t n_tiles = (int32_t)((c->n_pos + c->tile - 1) / c->tile);
    acase x = *c;
    x.n_visit = 0; /* the order buffer is the output: no input order */
    abufs b;
    abufs_make(be, &x, &b);
    be->iface->buffer_free(be, b.o);
    be->iface->buffer_free(be, b.vis);
    int32_t *junk = malloc(((size_t)c->H * n_tiles + 2 * c->H) * 4);
    for (size_t i = 0; i < (size_t)c->H * n_tiles + 2 * c->H; i++) junk[i] = -99;
    b.o = bnew_at(be, junk, (size_t)c->H * n_tiles * 4, c->off);
    b.vis = bnew_at(be, junk, (size_t)c->H * 8, c->off);
    kvm_dev_attend_args a = args_of(c, &b);
    a.scored = 1;
    a.n_visit = n_tiles;
    kvmem_status st = be->iface->dev_attend(be, &a);
    if (st == KVMEM_OK) {
        bget(be, b.out, c->off, out, (size_t)c->H * c->G * c->D * 4);
        bget(be, b.vis, c->off, vis, (size_t)c->H * 8);
        bget(be, b.o, c->off, ord, (size_t)c->H * n_tiles * 4);
    }
    free(junk);
    abufs_free(be, &b);
    return st;
}

/* Returns the streams whose verdicts were clear and how many of them stopped. */
static outcome check_scored(const acase *c) {
    outcome r = {0, 0, 0};
    const int32_t n_tiles = (int32_t)((c->n_pos + c->tile - 1) / c->tile), H = c->H;
    const size_t nq = (size_t)H * c->G * c->D;
    float *ob = malloc(nq * 4), *oc = malloc(nq * 4);
    int32_t *vb = malloc((size_t)H * 8), *vc = malloc((size_t)H * 8);
    int32_t *ordb = malloc(((size_t)H * n_tiles + 1) * 4), *ordc = malloc(((size_t)H * n_tiles + 1) * 4);
    assert_ok(run_scored(g_be, c, ob, vb, ordb));
    assert_ok(run_scored(g_cpu, c, oc, vc, ordc));
    double *score = malloc(((size_t)n_tiles + 1) * sizeof(double));
    double *ref = malloc((size_t)c->G * c->D * sizeof(double)), *tol = malloc((size_t)c->G * sizeof(double));
    uint8_t *seen = malloc((size_t)n_tiles + 1);
    for (int32_t g = 0; g < H; g++) {
        const int32_t *og = ordb + (size_t)g * n_tiles, *ogc = ordc + (size_t)g * n_tiles;
        double es;
        ref_scores(c, g, score, &es);
        memset(seen, 0, (size_t)n_tiles + 1);
        for (int32_t i = 0; i < n_tiles; i++) {
            if (og[i] != ogc[i])
                fail_msg("KV head %d: order[%d] = %d on %s, %d on cpu (scores %.9g, %.9g)", g, i, og[i], g_name, ogc[i],
                         og[i] >= 0 && og[i] < n_tiles ? score[og[i]] : NAN,
                         ogc[i] >= 0 && ogc[i] < n_tiles ? score[ogc[i]] : NAN);
            assert_true(og[i] >= 0 && og[i] < n_tiles && !seen[og[i]]);
            seen[og[i]] = 1;
            if (i > 0) { /* highest first; newest first among equal scores */
                const double a = score[og[i - 1]], b = score[og[i]];
                if (!(a > b + es || (fabs(a - b) <= es && (a != b || og[i - 1] > og[i])) || (a == b && og[i - 1] > og[i])))
                    fail_msg("KV head %d: tiles %d (%.9g) then %d (%.9g) out of order", g, og[i - 1], a, og[i], b);
            }
        }
        /* the rule over this stream's order, replayed */
        acase cg = *c;
        int32_t *og_copy = malloc(((size_t)n_tiles + 1) * sizeof(int32_t));
        memcpy(og_copy, og, (size_t)n_tiles * sizeof(int32_t));
        cg.order = og_copy;
        cg.n_visit = n_tiles;
        int clear;
        int32_t *lt = malloc(((size_t)n_tiles + 1) * sizeof(int32_t));
        const int32_t n_live = live_tiles(&cg, lt);
        const int32_t rv = ref_stream(&cg, g, -1, ref, tol, &clear);
        tally(&r, clear, g, rv, n_live, vb[g], vc[g]);
        assert_true(vb[g] >= 0 && vb[g] <= n_live);
        int64_t pos = 0; /* the live positions of the first vb[g] live tiles */
        for (int32_t i = 0; i < vb[g]; i++)
            for (int64_t j = (int64_t)lt[i] * c->tile; j < KVM_MIN(((int64_t)lt[i] + 1) * c->tile, c->n_pos); j++)
                pos += is_live(c, j);
        if (vb[H + g] != pos) fail_msg("KV head %d: %s reports %d positions read, %lld expected", g, g_name, vb[H + g], (long long)pos);
        if (vc[g] == vb[g]) assert_int_equal(vc[H + g], pos);
        if (vb[g] != rv) ref_stream(&cg, g, vb[g], ref, tol, &clear);
        for (int32_t h = 0; h < c->G; h++)
            for (int32_t d = 0; d < c->D; d++) {
                const size_t i = ((size_t)g * c->G + h) * c->D + d;
                if (!(fabs((double)ob[i] - ref[h * c->D + d]) <= tol[h]))
                    fail_msg("%s: head %d dim %d: %.9g vs reference %.9g (tolerance %.3g, %d tiles)", g_name,
                             g * c->G + h, d, (double)ob[i], ref[h * c->D + d], tol[h], vb[g]);
                if (vb[g] == vc[g] && !(fabs((double)ob[i] - oc[i]) <= 2 * tol[h]))
                    fail_msg("head %d dim %d: %s %.9g vs cpu %.9g", g * c->G + h, d, g_name, (double)ob[i], (double)oc[i]);
            }
        free(lt);
        free(og_copy);
    }
    free(ob), free(oc), free(vb), free(vc), free(ordb), free(ordc), free(score), free(ref), free(tol), free(seen);
    return r;
}

static void test_scored_order_matches_reference(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    const struct {
        int32_t H, G, D;
        int64_t T;
        int32_t tile;
        kvmem_dtype dt;
        int dead_pct;
        float tau_s, tau_d;
        int32_t patience;
    } cases[] = {
        {2, 4, 64, 301, 16, KVMEM_F32, 20, 0.01f, 0.001f, 1},   /* partial last tile, dead slots */
        {2, 1, 128, 512, 16, KVMEM_F16, 10, 0.003f, 0.0003f, 2}, /* f16 */
        {1, 8, 32, 2000, 16, KVMEM_F32, 0, 0.02f, 0.002f, 1},    /* GQA 8:1, 125 tiles */
        {3, 3, 33, 400, 7, KVMEM_F16, 30, 0.01f, 0.001f, 1},     /* odd head_dim and tile */
        {1, 2, 64, 1000, 500, KVMEM_F32, 60, 0.05f, 0.0005f, 1}, /* tiles of 500, mostly dead */
        {2, 2, 16, 3000, 1, KVMEM_F32, 10, 0.001f, 0.0001f, 4},  /* 3000 tiles of one position */
        {1, 4, 128, 4096, 16, KVMEM_F16, 0, 0.0f, 0.0f, 1},      /* tau 0: every tile, in the scored order */
    };
    outcome tot = {0, 0, 0};
    /* pass 1: a loop budget of 300 splits Vulkan's scan into spans of a
     * tile and its ranking into many dispatches of a few hundred tiles */
    const size_t runs[] = {0, 1, 2, 3, 4, 5, 6, 4, 5};
    for (size_t ri = 0; ri < sizeof runs / sizeof runs[0]; ri++) {
        const size_t i = runs[ri];
        if (ri == 7) setenv("KVMEM_VULKAN_LOOP_BUDGET", "300", 1);
        acase c;
        case_make(&c, 1300 + i, cases[i].H, cases[i].G, cases[i].D, cases[i].T, cases[i].tile, cases[i].dt,
                  cases[i].dead_pct, ORD_RECENT);
        c.tau_s = cases[i].tau_s, c.tau_d = cases[i].tau_d, c.patience = cases[i].patience;
        /* a few recalled positions far back: high logits an old tile holds */
        for (int r = 0; r < 3 && c.n_pos > 64; r++) {
            const int64_t j = (int64_t)(r + 1) * c.n_pos / 7;
            if (!is_live(&c, j)) continue;
            for (int32_t g = 0; g < c.H; g++)
                for (int32_t d = 0; d < c.D; d++) {
                    const size_t at = ((size_t)c.slots[j] * c.H + g) * c.D + d;
                    const float x = 2.0f * c.q[((size_t)g * c.G) * c.D + d];
                    c.kh[at] = kvm_f32_to_f16(x);
                    c.k[at] = c.dt == KVMEM_F16 ? kvm_f16_to_f32(c.kh[at]) : x;
                }
        }
        const outcome o = check_scored(&c);
        tot.clear += o.clear, tot.stopped += o.stopped, tot.ambiguous += o.ambiguous;
        case_free(&c);
    }
    unsetenv("KVMEM_VULKAN_LOOP_BUDGET");
    print_message("scored: %d streams clear (%d stopped early), %d ambiguous\n", tot.clear, tot.stopped, tot.ambiguous);
    assert_true(tot.clear > 2 * tot.ambiguous);
    assert_true(tot.stopped > 0);
}

/* kvmem_attend with the default (SCORED) order on the backend's context and
 * on a CPU context: the same output within the bound and the same tiles
 * per stream (stats), a TENSORS source of a few thousand positions. */
static void test_scored_attend_api_matches_cpu(void **state) {
    (void)state;
    NEED_BACKEND();
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 2;
    kvmem_context *cpu_ctx = NULL;
    assert_ok(kvmem_context_create(&cp, &cpu_ctx));
    const int32_t H = 2, G = 4, D = 64;
    const int64_t T = 3000;
    for (int x = 0; x < 2; x++) {
        const kvmem_dtype dt = x ? KVMEM_F16 : KVMEM_F32;
        acase c;
        case_make(&c, 1400 + x, H, G, D, T, 16, dt, 0, ORD_RECENT);
        const size_t row = (size_t)H * D;
        void *k = malloc((size_t)T * row * 4), *v = malloc((size_t)T * row * 4);
        for (int64_t j = 0; j < T; j++) { /* TENSORS: rows in position order */
            const size_t from = (size_t)c.slots[j] * row, to = (size_t)j * row;
            if (dt == KVMEM_F32) {
                memcpy((float *)k + to, c.k + from, row * 4);
                memcpy((float *)v + to, c.v + from, row * 4);
            } else {
                memcpy((uint16_t *)k + to, c.kh + from, row * 2);
                memcpy((uint16_t *)v + to, c.vh + from, row * 2);
            }
        }
        const int64_t qs[3] = {1, (int64_t)H * G, D}, kvs[3] = {T, H, D};
        float *out[2] = {malloc(row * G * 4), malloc(row * G * 4)};
        kvmem_tensor tq, tk, tv, to[2];
        assert_ok(kvmem_tensor_init(&tq, c.q, KVMEM_F32, 3, qs));
        assert_ok(kvmem_tensor_init(&tk, k, dt, 3, kvs));
        assert_ok(kvmem_tensor_init(&tv, v, dt, 3, kvs));
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_TENSORS;
        src.k = &tk;
        src.v = &tv;
        kvmem_attend_params prm = kvmem_attend_default_params();
        assert_int_equal(prm.order, KVMEM_ATTEND_SCORED);
        prm.tau_s = 0.01f, prm.tau_d = 0.001f, prm.patience = 2;
        kvmem_attend_stats st[2];
        kvmem_context *ctxs[2] = {g_ctx, cpu_ctx};
        uint64_t h0, d0, h1, d1;
        assert_ok(kvmem_context_transfer_stats(g_ctx, &h0, &d0));
        for (int i = 0; i < 2; i++) {
            assert_ok(kvmem_tensor_init(&to[i], out[i], KVMEM_F32, 3, qs));
            assert_ok(kvmem_attend(ctxs[i], &tq, &src, &prm, &to[i], &st[i]));
        }
        assert_ok(kvmem_context_transfer_stats(g_ctx, &h1, &d1));
        if (g_be != g_cpu) { /* on the device: q, K and V up (host tensors), no tile list; out and 2 counts per stream down */
            const uint64_t up = row * G * 4 + 2 * (uint64_t)T * row * (dt == KVMEM_F32 ? 4 : 2) + (uint64_t)T * 4;
            if (h1 - h0 != up || d1 - d0 != row * G * 4 + 2 * (uint64_t)H * 4)
                fail_msg("SCORED on %s moved %llu bytes up (%llu expected), %llu down", g_name,
                         (unsigned long long)(h1 - h0), (unsigned long long)up, (unsigned long long)(d1 - d0));
        }
        print_message("kvmem_attend SCORED on %s: %lld of %lld tiles (cpu %lld), %lld positions read (cpu %lld)\n",
                      g_name, (long long)st[0].tiles_visited, (long long)st[0].tiles_total, (long long)st[1].tiles_visited,
                      (long long)st[0].positions_read, (long long)st[1].positions_read);
        assert_int_equal(st[0].tiles_total, st[1].tiles_total);
        assert_int_equal(st[0].tiles_visited, st[1].tiles_visited);
        assert_int_equal(st[0].streams_stopped, st[1].streams_stopped);
        assert_true(st[1].streams_stopped > 0); /* the comparison is not full attention */
        double tolmax = 0;
        for (size_t i = 0; i < row * G; i++) tolmax = fmax(tolmax, fabs((double)out[0][i] - out[1][i]));
        /* both read the same tiles: f32 accumulation differences only */
        assert_true(tolmax <= 1e-4);
        free(out[0]), free(out[1]), free(k), free(v);
        case_free(&c);
    }
    kvmem_context_free(cpu_ctx);
}

/* The device mirror's form (backend.h, dev_attend): f16 rows of the sealed
 * slots, f32 tail rows past tail_slot, raw keys rotated on the fly to base +
 * position from a cos/sin table (NEOX and GPT-J pairs, attn_factor), on the
 * backend and on the CPU entry, against a plain-loop reference that rotates
 * each key by the same angle sum and attends in double precision. */
static void mirror_run(kvmem_backend *be, const float *q, const uint16_t *kh, const uint16_t *vh, const float *kt,
                       const float *vt, const float *cs, const int32_t *slots, const int32_t *order, int n_sealed,
                       int n_pos, int tile, int n_visit, int rot, int gptj, float af, float *out) {
    enum { HH = 2, GG = 2, DD = 16 };
    kvmem_buffer *bq = bnew(be, q, HH * GG * DD * 4), *bk = bnew(be, kh, (size_t)n_sealed * HH * DD * 2);
    kvmem_buffer *bv = bnew(be, vh, (size_t)n_sealed * HH * DD * 2);
    kvmem_buffer *bkt = bnew(be, kt, (size_t)(n_pos - n_sealed) * HH * DD * 4);
    kvmem_buffer *bvt = bnew(be, vt, (size_t)(n_pos - n_sealed) * HH * DD * 4);
    kvmem_buffer *bcs = bnew(be, cs, (size_t)(n_pos + 1) * rot * 4), *bs = bnew(be, slots, (size_t)n_pos * 4);
    kvmem_buffer *bo = bnew(be, order, (size_t)n_visit * 4), *bout = bnew(be, NULL, HH * GG * DD * 4);
    kvmem_buffer *bvis = bnew(be, NULL, HH * 4);
    kvm_dev_attend_args a;
    memset(&a, 0, sizeof a);
    a.q = bq, a.k = bk, a.v = bv, a.slot_map = bs, a.order = bo, a.out = bout, a.visited = bvis;
    a.n_slots = n_pos, a.n_pos = n_pos, a.n_q_heads = HH * GG, a.n_kv_heads = HH, a.head_dim = DD, a.tile = tile;
    a.n_visit = n_visit, a.dtype = KVMEM_F16, a.scale = 0.25f, a.patience = 1;
    a.k_tail = bkt, a.v_tail = bvt, a.tail_slot = n_sealed, a.rope_cs = bcs, a.rotary_dim = rot, a.gptj = gptj;
    a.attn_factor = af;
    assert_ok(be->iface->dev_attend(be, &a));
    bget(be, bout, 0, out, HH * GG * DD * 4);
    int32_t vis[HH];
    bget(be, bvis, 0, vis, sizeof vis);
    for (int g = 0; g < HH; g++) assert_int_equal(vis[g], n_visit);
    kvmem_buffer *all[10] = {bq, bk, bv, bkt, bvt, bcs, bs, bo, bout, bvis};
    for (int i = 0; i < 10; i++) be->iface->buffer_free(be, all[i]);
}

static void test_mirror_form_rotates_on_the_fly(void **state) {
    (void)state;
    NEED_ENTRY(dev_attend);
    enum { HH = 2, GG = 2, DD = 16, NS = 37, NP = 45, TILE = 8 };
    uint64_t rng = 91;
    float q[HH * GG * DD], kt[(NP - NS) * HH * DD], vt[(NP - NS) * HH * DD];
    uint16_t kh[NS * HH * DD], vh[NS * HH * DD];
    for (int i = 0; i < HH * GG * DD; i++) q[i] = tu_normal(&rng);
    for (int i = 0; i < NS * HH * DD; i++) kh[i] = kvm_f32_to_f16(tu_normal(&rng)), vh[i] = kvm_f32_to_f16(tu_normal(&rng));
    for (int i = 0; i < (NP - NS) * HH * DD; i++) kt[i] = tu_normal(&rng), vt[i] = tu_normal(&rng);
    int32_t slots[NP], order[(NP + TILE - 1) / TILE];
    for (int p = 0; p < NP; p++) slots[p] = p % 11 == 5 ? -1 : p; /* some dead positions */
    const int n_tiles = (NP + TILE - 1) / TILE;
    for (int t = 0; t < n_tiles; t++) order[t] = n_tiles - 1 - t;
    for (int cfg = 0; cfg < 4; cfg++) {
        const int rot = cfg == 3 ? 8 : DD, gptj = cfg == 1, np = rot / 2;
        const float af = cfg == 2 ? 1.25f : 1.0f;
        const double base = cfg == 0 ? 0.0 : 5000.0 + 17.0 * cfg;
        float cs[(NP + 1) * DD];
        for (int r = 0; r <= NP; r++)
            for (int j = 0; j < np; j++) {
                const double ang = (r == 0 ? base : (double)(r - 1)) * pow(10000.0, -2.0 * j / rot);
                cs[r * rot + j] = (float)cos(ang);
                cs[r * rot + np + j] = (float)sin(ang);
            }
        /* the reference: rows as the contract reads them, in double */
        double ref[HH * GG * DD];
        for (int g = 0; g < HH; g++)
            for (int h = 0; h < GG; h++) {
                double m = -INFINITY, den = 0, acc[DD] = {0};
                double lg[NP];
                for (int p = 0; p < NP; p++) {
                    lg[p] = -INFINITY;
                    if (slots[p] < 0) continue;
                    float k[DD];
                    for (int d = 0; d < DD; d++)
                        k[d] = p >= NS ? kt[((p - NS) * HH + g) * DD + d] : kvm_f16_to_f32(kh[(p * HH + g) * DD + d]);
                    for (int j = 0; j < np; j++) {
                        const float *rb = cs, *rp = cs + (p + 1) * rot;
                        const float c = rb[j] * rp[j] - rb[np + j] * rp[np + j];
                        const float sn = rb[np + j] * rp[j] + rb[j] * rp[np + j];
                        const int i0 = gptj ? 2 * j : j, i1 = gptj ? i0 + 1 : j + np;
                        const float x0 = k[i0], x1 = k[i1];
                        k[i0] = (x0 * c - x1 * sn) * af;
                        k[i1] = (x0 * sn + x1 * c) * af;
                    }
                    double dot = 0;
                    for (int d = 0; d < DD; d++) dot += (double)q[(g * GG + h) * DD + d] * k[d];
                    lg[p] = 0.25 * dot;
                    m = fmax(m, lg[p]);
                }
                for (int p = 0; p < NP; p++) {
                    if (slots[p] < 0) continue;
                    const double w = exp(lg[p] - m);
                    den += w;
                    for (int d = 0; d < DD; d++)
                        acc[d] += w * (p >= NS ? vt[((p - NS) * HH + g) * DD + d] : kvm_f16_to_f32(vh[(p * HH + g) * DD + d]));
                }
                for (int d = 0; d < DD; d++) ref[(g * GG + h) * DD + d] = acc[d] / den;
            }
        float ob[HH * GG * DD], oc[HH * GG * DD];
        mirror_run(g_be, q, kh, vh, kt, vt, cs, slots, order, NS, NP, TILE, n_tiles, rot, gptj, af, ob);
        mirror_run(g_cpu, q, kh, vh, kt, vt, cs, slots, order, NS, NP, TILE, n_tiles, rot, gptj, af, oc);
        for (int i = 0; i < HH * GG * DD; i++) {
            assert_true(fabs(ob[i] - ref[i]) <= 2e-5 * (1 + fabs(ref[i])));
            assert_true(fabs(oc[i] - ref[i]) <= 2e-5 * (1 + fabs(ref[i])));
        }
    }
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_full_attention_shapes_orders_dtypes),
    cmocka_unit_test(test_full_attention_large_head_dim_and_tiles),
    cmocka_unit_test(test_full_attention_long_histories),
    cmocka_unit_test(test_attend_api_long_histories),
    cmocka_unit_test(test_stop_rule_matches_replay),
    cmocka_unit_test(test_state_across_dispatches),
    cmocka_unit_test(test_empty_and_dead_streams),
    cmocka_unit_test(test_out_of_range_ids),
    cmocka_unit_test(test_nonfinite_logits_are_reported),
    cmocka_unit_test(test_large_group_supported_or_refused),
    cmocka_unit_test(test_bad_input),
    cmocka_unit_test(test_scored_order_matches_reference),
    cmocka_unit_test(test_scored_attend_api_matches_cpu),
    cmocka_unit_test(test_mirror_form_rotates_on_the_fly),
};

CONF_MAIN(tests)

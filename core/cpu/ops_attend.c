/* The CPU backend's ART attention op: one work item per (KV head, chunk of
 * query rows), each running its streams (row, KV head) through the tiles in
 * the plan's order with an online softmax, and stopping each stream when the
 * stop rule fires. The rule reads 32 (or N) floats of the item's own
 * accumulators per tile: a constant cost and no extra memory traffic. */
#include "attend_plan.h"
#include "cpu_backend.h"
#include "kernels.h"
#include "tensor.h"
#include "../backend/attend_dev.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One stop rule's state for one stream. */
typedef struct rule_state {
    float *prev;      /* previous probe */
    double prev_norm;
    int32_t has_prev, streak, done, visited;
} rule_state;

/* Incremental cos/sin of RoPE angles: positions visited one after the other
 * (ascending or descending, the usual case in every order) advance by one
 * angle-addition step in double precision instead of 2 * n_pairs libm calls;
 * any jump resynchronises through kvm_rope_cos_sin. */
typedef struct rope_cursor {
    const kvm_rope *r;
    int64_t pos;
    int32_t valid;
    double *c, *s, *c1, *s1; /* state at pos; cos/sin of one step */
    float *cf, *sf;          /* float copies handed to kvm_rope_rotate */
} rope_cursor;

static void rope_at(rope_cursor *rc, int64_t pos) {
    const int32_t np = rc->r->n_pairs;
    if (rc->valid && pos == rc->pos) return;
    if (rc->valid && (pos == rc->pos + 1 || pos == rc->pos - 1)) {
        const double dir = pos > rc->pos ? 1.0 : -1.0;
        for (int32_t j = 0; j < np; j++) {
            double c = rc->c[j], s = rc->s[j], s1 = dir * rc->s1[j];
            rc->c[j] = c * rc->c1[j] - s * s1;
            rc->s[j] = s * rc->c1[j] + c * s1;
            rc->cf[j] = (float)rc->c[j];
            rc->sf[j] = (float)rc->s[j];
        }
    } else {
        kvm_rope_cos_sin(rc->r, (double)pos, rc->cf, rc->sf);
        for (int32_t j = 0; j < np; j++) {
            rc->c[j] = rc->cf[j];
            rc->s[j] = rc->sf[j];
        }
        rc->valid = 1;
    }
    rc->pos = pos;
}

/* What one work item returns: its stats, and the first position whose
 * logit was not finite (K non-finite there, or so large the logit overflows). */
typedef struct item_result {
    kvmem_attend_stats s;
    int64_t bad_pos;
    int32_t bad_head, bad;
} item_result;

typedef struct attend_job {
    const kvm_attend_plan *p;
    const kvm_attend_kernels *kern;
    int32_t rows_per_item, n_row_chunks, heads_per_item, n_head_chunks;
    int32_t max_tile;
    size_t scratch_floats; /* per item */
    float *scratch;
    item_result *item_stats;
    int32_t probe_g[KVMEM_ATTEND_PROBE_SIZE], probe_d[KVMEM_ATTEND_PROBE_SIZE]; /* head, dim */
    int32_t probe_n;
    int32_t row_total[KVMEM_ATTEND_MAX_ROWS]; /* tiles with a live position each row sees */
    int32_t prefetch; /* software prefetch of the next tile: only when KV outgrows the caches */
} attend_job;

static int64_t live_count(const kvm_attend_plan *p, int64_t a, int64_t b) {
    if (b <= a) return 0;
    return p->live_prefix ? p->live_prefix[b] - p->live_prefix[a] : b - a;
}

static int is_live(const kvm_attend_plan *p, int64_t j) {
    if (p->mask && !p->mask[j]) return 0;
    if (p->slots && p->slots[j] == p->dead_slot) return 0;
    return 1;
}

/* Probe of one stream: z[i] for the rule's elements, normalised per head. */
static size_t probe_fill(const attend_job *j, int oracle, float *const *acc, const float *l, float *z) {
    const int32_t D = j->p->head_dim, N = j->p->group * D;
    if (oracle || j->probe_n == N) {
        for (int32_t g = 0; g < j->p->group; g++) {
            const float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
            for (int32_t d = 0; d < D; d++) z[g * D + d] = acc[g][d] * inv;
        }
        return (size_t)N;
    }
    for (int32_t i = 0; i < j->probe_n; i++) {
        const int32_t g = j->probe_g[i];
        z[i] = l[g] > 0 ? acc[g][j->probe_d[i]] / l[g] : 0.0f;
    }
    return (size_t)j->probe_n;
}

/* One tile's verdict: returns 1 when the stream should stop now. */
static int rule_step(const kvm_attend_plan *p, rule_state *rs, const float *z, size_t n) {
    double nz = 0, dot = 0;
    for (size_t i = 0; i < n; i++) {
        nz += (double)z[i] * z[i];
        dot += (double)z[i] * rs->prev[i];
    }
    nz = sqrt(nz);
    int fire = 0;
    if (rs->has_prev) {
        const double np = rs->prev_norm;
        int ok;
        if (np == 0 || nz == 0) {
            ok = np == 0 && nz == 0;
        } else {
            int scale_ok = fabs(nz - np) <= (double)p->tau_s * np;
            int dir_ok = 1.0 - dot / (nz * np) <= (double)p->tau_d;
            ok = scale_ok && dir_ok;
        }
        rs->streak = ok ? rs->streak + 1 : 0;
        fire = p->stop_enabled && rs->streak >= p->patience;
    }
    memcpy(rs->prev, z, n * sizeof(float));
    rs->prev_norm = nz;
    rs->has_prev = 1;
    return fire;
}

/* Write acc / l of one stream (G heads) into the output rows. */
static void write_stream(const kvm_attend_plan *p, int32_t r, int32_t h, float *const *acc, const float *l) {
    const int32_t D = p->head_dim, G = p->group;
    for (int32_t g = 0; g < G; g++) {
        float *o = p->out + ((size_t)r * (size_t)p->n_q_heads + (size_t)(h * G + g)) * (size_t)D;
        const float inv = l[g] > 0 ? 1.0f / l[g] : 0.0f;
        for (int32_t d = 0; d < D; d++) o[d] = acc[g][d] * inv;
    }
}

/* Fetch K and V rows (f32) of the live positions pos[0..n) of tile `tile`
 * for the KV heads [ha, hb) of an item whose first head is h0. Row i of head
 * h lands at krow[(h - h0) * mt + i]. Only these positions are read, all
 * heads of one position at once, so the reads stream through memory. */
/* Rows with a unit last stride are read in place, f16 and bf16 converted in
 * registers by the kernels: caller caches are read once, with no f32 copy. */
static int direct(const kvmem_tensor *t) { return t->strides[2] == 1; }

static void fetch_rows(const kvm_attend_plan *p, int32_t h0, int32_t ha, int32_t hb, int32_t tile, const int64_t *pos,
                       int32_t n, int32_t mt, float *kbuf, float *vbuf, const void **krow, const void **vrow,
                       rope_cursor *rc) {
    const size_t D = (size_t)p->head_dim, nh = (size_t)(hb - ha);
    if (p->kind != KVMEM_ATTEND_SRC_AGENT) {
        const kvmem_tensor *k = p->k, *v = p->v;
        const int kdirect = direct(k), vdirect = direct(v);
        const int kspan = k->strides[2] == 1 && k->strides[1] == (int64_t)D;
        const int vspan = v->strides[2] == 1 && v->strides[1] == (int64_t)D;
        const size_t kes = kvm_dtype_size(k->dtype), ves = kvm_dtype_size(v->dtype);
        /* 16-bit rows of several heads per position ([T][H][D], llama.cpp's
         * and kvmem's own layout): a head's rows of the tile are copied
         * into one run, as raw 16-bit values, so the kernels do not read 16
         * rows a whole position apart (f16 at 16k tokens, one thread: 7.2-7.5
         * ms in place, 6.2-6.5 packed; f32 rows gained nothing) */
        const int kpack = nh > 1 && kspan && kes == 2 && !p->logits, vpack = nh > 1 && vspan && ves == 2; /* span: direct */
        for (int32_t i = 0; i < n; i++) {
            const int64_t row = p->slots ? p->slots[pos[i]] : pos[i];
            float *kb = kbuf + (size_t)i * nh * D, *vb = vbuf + (size_t)i * nh * D;
            const int64_t ko = row * k->strides[0] + ha * k->strides[1];
            const int64_t vo = row * v->strides[0] + ha * v->strides[1];
            if (!kdirect && kspan && !p->logits)
                kvm_convert_host(kb, KVMEM_F32, (const unsigned char *)k->data + (size_t)ko * kes, k->dtype, nh * D);
            if (!vdirect && vspan)
                kvm_convert_host(vb, KVMEM_F32, (const unsigned char *)v->data + (size_t)vo * ves, v->dtype, nh * D);
            for (int32_t h = ha; h < hb; h++) {
                const size_t at = (size_t)(h - h0) * (size_t)mt + (size_t)i, hh = (size_t)(h - ha);
                const int64_t kho = ko + (h - ha) * k->strides[1], vho = vo + (h - ha) * v->strides[1];
                if (kpack) {
                    float *dst = kbuf + ((size_t)(h - ha) * (size_t)mt + (size_t)i) * D;
                    memcpy(dst, (const unsigned char *)k->data + (size_t)kho * kes, D * kes);
                    krow[at] = dst;
                } else if (kdirect) {
                    krow[at] = (const unsigned char *)k->data + (size_t)kho * kes;
                } else {
                    if (!kspan && !p->logits) kvm_tensor_read_f32(k, kho, kb + hh * D, D);
                    krow[at] = kb + hh * D;
                }
                if (vpack) {
                    float *dst = vbuf + ((size_t)(h - ha) * (size_t)mt + (size_t)i) * D;
                    memcpy(dst, (const unsigned char *)v->data + (size_t)vho * ves, D * ves);
                    vrow[at] = dst;
                } else if (vdirect) {
                    vrow[at] = (const unsigned char *)v->data + (size_t)vho * ves;
                } else {
                    if (!vspan) kvm_tensor_read_f32(v, vho, vb + hh * D, D);
                    vrow[at] = vb + hh * D;
                }
            }
        }
        return;
    }
    /* an agent's block: head-major storage, so read each head's runs */
    const kvm_attend_agent *ag = &p->agent;
    for (int32_t h = ha; h < hb; h++) {
        const size_t hh = (size_t)(h - ha);
        float *kb = kbuf + hh * (size_t)mt * D, *vb = vbuf + hh * (size_t)mt * D;
        const size_t at = (size_t)(h - h0) * (size_t)mt;
        const int64_t first = p->tile_start[tile];
        if (tile < ag->n_sealed) {
            for (int32_t i = 0; i < n;) { /* runs of consecutive live positions: one read each */
                int32_t e = i + 1;
                while (e < n && pos[e] == pos[e - 1] + 1) e++;
                const int32_t row0 = (int32_t)(pos[i] - first);
                ag->read(ag->ctx, tile, 0, p->layer, h, row0, e - i, kb + (size_t)i * D);
                ag->read(ag->ctx, tile, 1, p->layer, h, row0, e - i, vb + (size_t)i * D);
                i = e;
            }
            for (int32_t i = 0; i < n; i++) vrow[at + (size_t)i] = vb + (size_t)i * D;
        } else {
            const float *kt = ag->tail(ag->ctx, 0, p->layer, h);
            const float *vt = ag->tail(ag->ctx, 1, p->layer, h);
            for (int32_t i = 0; i < n; i++) {
                memcpy(kb + (size_t)i * D, kt + (size_t)(pos[i] - first) * D, D * sizeof(float));
                vrow[at + (size_t)i] = vt + (size_t)(pos[i] - first) * D;
            }
        }
    }
    /* keys are stored raw: rotate to their positions, newest first so the
     * cursor steps by one in RECENT order; one cos/sin for all heads */
    for (int32_t i = n - 1; i >= 0; i--) {
        const int64_t t = pos[i];
        rope_at(rc, p->positions ? p->positions[t] : p->base_position + t);
        for (int32_t h = ha; h < hb; h++) {
            float *x = kbuf + ((size_t)(h - ha) * (size_t)mt + (size_t)i) * D;
            kvm_rope_rotate(p->agent.rope, x, rc->cf, rc->sf, 0);
            krow[(size_t)(h - h0) * (size_t)mt + (size_t)i] = x;
        }
    }
}

/* Caller K or V whose rows of one head lie closer together than the rows
 * of one position ([H][T][D] viewed as [T][H][D]: HF caches). */
static int head_major(const kvm_attend_plan *p) {
    if (p->kind == KVMEM_ATTEND_SRC_AGENT || p->n_kv_heads < 2) return 0;
    return p->k->strides[1] > p->k->strides[0] || p->v->strides[1] > p->v->strides[0];
}

/* Prefetch the K (which 0) or V (which 1) rows of KV head h in tile
 * `tile` towards L1 while the current tile computes (caller tensors and slot
 * maps; agent blocks go through kvm_block_read_f32). The hardware
 * prefetcher of the machine measured does not follow these reads, and a
 * whole tile asked for at once queues up (BENCHMARKS.md, "attend"): each
 * head's rows are asked for just before the kernel that reads the current
 * tile's rows of that head, in ascending addresses (descending requests ran
 * at a third of the speed). Row by row, so head-major caches (a head's rows
 * adjacent, heads far apart: HF) fetch exactly what is read, in one run.
 * Masked and dead positions are not touched. */
static void prefetch_rows(const kvm_attend_plan *p, int which, int32_t tile, int down, int32_t h) {
    const kvmem_tensor *t = which ? p->v : p->k;
    const int64_t t0 = p->tile_start[tile], n = p->tile_start[tile + 1] - t0;
    const size_t es = kvm_dtype_size(t->dtype);
    const size_t bytes = (size_t)((int64_t)(p->head_dim - 1) * t->strides[2] + 1) * es;
    const char *base = (const char *)t->data + (size_t)(h * t->strides[1]) * es;
    if (!p->mask && !p->slots && (size_t)t->strides[0] * es == bytes) { /* the rows make one run */
        const char *a = base + (size_t)(t0 * t->strides[0]) * es;
        const size_t run = (size_t)n * bytes;
        if (down) { /* the tiles go down (RECENT): so does the run */
            /* a plain step of 64: the same lines as clamping each step with
             * KVM_MIN, which cost 5 us per call (1.1x the contiguous time)
             * when the rule stops RECENT after a few tiles in cache */
            for (size_t x = run; x > 64; x -= 64) __builtin_prefetch(a + x - 64, 0, 3);
            __builtin_prefetch(a, 0, 3);
        } else
            for (size_t x = 0; x < run; x += 64) __builtin_prefetch(a + x, 0, 3);
        return;
    }
    for (int64_t q = t0; q < t0 + n; q++) {
        if (!is_live(p, q)) continue;
        const char *a = base + (size_t)((p->slots ? p->slots[q] : q) * t->strides[0]) * es;
        for (size_t x = 0; x < bytes; x += 64) __builtin_prefetch(a + x, 0, 3);
    }
}

/* Prefetch for an item of several KV heads over position-major K or V
 * ([T][H][D], the heads of a position adjacent): the item's heads of one
 * position are one run, and the next tile's runs are asked for in slices,
 * slice `part` of `parts` before head `part`'s kernels, so the requests
 * spread over the tile's compute instead of queueing at its start. Per head
 * (prefetch_rows) each request touched a 512-byte piece of every 4-KiB
 * position: 0.22 of the read bandwidth at 16k tokens, against 0.35 this way
 * (BENCHMARKS.md, "peers"). Returns 0 (nothing asked) when the heads of a
 * position are not adjacent. */
static int prefetch_slice(const kvm_attend_plan *p, int which, int32_t tile, int32_t h0, int32_t h1, int32_t part,
                          int32_t parts) {
    const kvmem_tensor *t = which ? p->v : p->k;
    if (t->strides[2] != 1 || t->strides[1] != p->head_dim) return 0;
    const int64_t t0 = p->tile_start[tile], n = p->tile_start[tile + 1] - t0;
    const size_t es = kvm_dtype_size(t->dtype), bytes = (size_t)(h1 - h0) * (size_t)p->head_dim * es;
    const char *base = (const char *)t->data + (size_t)((int64_t)h0 * t->strides[1]) * es;
    for (int64_t q = t0 + n * part / parts; q < t0 + n * (part + 1) / parts; q++) {
        if (!is_live(p, q)) continue;
        const char *a = base + (size_t)((p->slots ? p->slots[q] : q) * t->strides[0]) * es;
        for (size_t x = 0; x < bytes; x += 64) __builtin_prefetch(a + x, 0, 3);
    }
    return 1;
}

/* The bytes of K (which 0) or V (1) of tile `tile` that head h's *_pf
 * kernel prefetches, when they are one run of f32 rows: position-major rows
 * of an item holding every KV head (the heads of a position adjacent, the
 * positions too), slice h - h0 of h1 - h0 of the tile's positions, all
 * heads; head-major rows (HF), head h's rows of the tile. 0: no such run. */
static int pf_run(const kvm_attend_plan *p, int which, int32_t tile, int32_t h0, int32_t h1, int32_t h,
                  const void **at, size_t *len) {
    const kvmem_tensor *t = which ? p->v : p->k;
    if (p->kind == KVMEM_ATTEND_SRC_AGENT || p->mask || p->slots || t->dtype != KVMEM_F32 || t->strides[2] != 1)
        return 0;
    const int64_t t0 = p->tile_start[tile], n = p->tile_start[tile + 1] - t0, D = p->head_dim;
    int64_t a, b, off;
    if (t->strides[1] == D && t->strides[0] == (int64_t)(h1 - h0) * D) { /* [T][H][D], every head */
        a = t0 + n * (h - h0) / (h1 - h0);
        b = t0 + n * (h - h0 + 1) / (h1 - h0);
        off = a * t->strides[0] + h0 * D;
    } else if (t->strides[0] == D) { /* [H][T][D] */
        a = t0;
        b = t0 + n;
        off = t0 * D + h * t->strides[1];
    } else {
        return 0;
    }
    *at = (const float *)t->data + off;
    *len = (size_t)(b - a) * (size_t)D * sizeof(float) * (t->strides[0] == D ? 1 : (size_t)(h1 - h0));
    return 1;
}

/* Float offsets of an item's scratch arrays, each 64-byte aligned. */
typedef struct item_offsets {
    size_t kbuf, vbuf, s, acc, mx, l, c, z, prev, rd, rf, pos, krow, vrow, qg, ag, rule;
} item_offsets;

static size_t take(size_t *at, size_t n_floats) {
    size_t o = *at;
    *at += (n_floats + 15) & ~(size_t)15;
    return o;
}

/* Streams of an item are indexed st = hh * nr + r (head hh of the item, row r). */
static size_t item_layout(const attend_job *j, item_offsets *o) {
    const size_t D = (size_t)j->p->head_dim, G = (size_t)j->p->group, N = G * D;
    const size_t MT = (size_t)j->max_tile, nr = (size_t)j->rows_per_item, nh = (size_t)j->heads_per_item;
    const size_t ns = nr * nh, ptr = sizeof(void *) / sizeof(float);
    size_t at = 0;
    o->kbuf = take(&at, MT * nh * D);
    o->vbuf = take(&at, MT * nh * D);
    o->s = take(&at, G * MT);
    o->acc = take(&at, ns * N);
    o->mx = take(&at, ns * G);
    o->l = take(&at, ns * G);
    o->c = take(&at, G);
    o->z = take(&at, N);
    o->prev = take(&at, ns * 2 * N);
    o->rd = take(&at, 4 * KVM_ROPE_MAX_PAIRS * 2);
    o->rf = take(&at, 2 * KVM_ROPE_MAX_PAIRS);
    o->pos = take(&at, MT * 2);
    o->krow = take(&at, MT * nh * ptr);
    o->vrow = take(&at, MT * nh * ptr);
    o->qg = take(&at, G * ptr);
    o->ag = take(&at, G * ptr);
    o->rule = take(&at, ns * 2 * (sizeof(rule_state) + sizeof(float) - 1) / sizeof(float));
    return at;
}

static void attend_item(attend_job *j, size_t item) {
    const kvm_attend_plan *p = j->p;
    const kvm_attend_kernels *kern = j->kern;
    const int32_t h0 = (int32_t)(item / (size_t)j->n_row_chunks) * j->heads_per_item;
    const int32_t h1 = KVM_MIN(h0 + j->heads_per_item, p->n_kv_heads);
    const int32_t r0 = (int32_t)(item % (size_t)j->n_row_chunks) * j->rows_per_item;
    const int32_t r1 = KVM_MIN(r0 + j->rows_per_item, p->n_rows);
    const int32_t nr = r1 - r0, nh = h1 - h0, G = p->group, D = p->head_dim, MT = j->max_tile;
    const size_t N = (size_t)G * (size_t)D;
    item_result *res = &j->item_stats[item];
    memset(res, 0, sizeof *res);
    kvmem_attend_stats *st = &res->s;
    if (nr <= 0 || nh <= 0) return;
    const int32_t ns = nr * nh;

    /* carve the item's scratch (layout in item_layout) */
    item_offsets o;
    item_layout(j, &o);
    float *w = j->scratch + item * j->scratch_floats;
    float *kbuf = w + o.kbuf, *vbuf = w + o.vbuf, *s = w + o.s, *acc = w + o.acc, *mx = w + o.mx;
    float *l = w + o.l, *c = w + o.c, *z = w + o.z, *prev = w + o.prev, *rf = w + o.rf;
    double *rd = (double *)(void *)(w + o.rd);
    int64_t *pos = (int64_t *)(void *)(w + o.pos);
    const void **krow = (const void **)(void *)(w + o.krow);
    const void **vrow = (const void **)(void *)(w + o.vrow);
    const float **qg = (const float **)(void *)(w + o.qg);
    float **ag = (float **)(void *)(w + o.ag);
    rule_state *rule = (rule_state *)(void *)(w + o.rule); /* [ns][2]: primary, oracle */

    memset(acc, 0, (size_t)ns * N * sizeof(float));
    for (size_t i = 0; i < (size_t)ns * (size_t)G; i++) {
        mx[i] = -INFINITY;
        l[i] = 0.0f;
    }
    for (int32_t i = 0; i < ns; i++)
        for (int x = 0; x < 2; x++) {
            rule_state *rs = &rule[2 * i + x];
            memset(rs, 0, sizeof *rs);
            rs->prev = prev + ((size_t)i * 2 + (size_t)x) * N;
        }
    const int32_t *total = j->row_total + r0; /* tiles each row sees */
    int32_t reading = ns;                      /* streams still reading */
    const int same_rules = p->probe == KVMEM_ATTEND_PROBE_ORACLE;
    const int compare = p->compare && !same_rules;
    const int agent = p->kind == KVMEM_ATTEND_SRC_AGENT;
    /* the kernels for the rows as they are read: agent rows are f32 copies */
    const kvmem_dtype kdt = agent || !direct(p->k) ? KVMEM_F32 : p->k->dtype;
    const kvmem_dtype vdt = agent || !direct(p->v) ? KVMEM_F32 : p->v->dtype;
    const int rules = p->stop_enabled || compare; /* the rule off: nothing to watch but the count */
    rope_cursor rc;
    memset(&rc, 0, sizeof rc);
    if (p->kind == KVMEM_ATTEND_SRC_AGENT) {
        const kvm_rope *r = p->agent.rope;
        rc.r = r;
        rc.c = rd;
        rc.s = rd + KVM_ROPE_MAX_PAIRS;
        rc.c1 = rd + 2 * KVM_ROPE_MAX_PAIRS;
        rc.s1 = rd + 3 * KVM_ROPE_MAX_PAIRS;
        rc.cf = rf;
        rc.sf = rf + KVM_ROPE_MAX_PAIRS;
        for (int32_t q = 0; q < r->n_pairs; q++) {
            rc.c1[q] = cos(r->inv_freq[q]);
            rc.s1[q] = sin(r->inv_freq[q]);
        }
    }

    /* SCORED: an item is one KV head, visiting in its own order */
    const int32_t *order = p->head_order ? p->head_order + (size_t)h0 * (size_t)p->n_order : p->order;
    for (int32_t oi = 0; oi < p->n_order && reading > 0; oi++) { /* every stream stopped: the rest is skipped */
        const int32_t tile = order[oi];
        const int64_t t0 = p->tile_start[tile], t1 = p->tile_start[tile + 1];
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        uint64_t vis = 0; /* rows that see this tile */
        for (int32_t r = 0; r < nr; r++) {
            int64_t a = KVM_MAX(t0, p->row_lo[r0 + r]), b = KVM_MIN(t1, p->row_hi[r0 + r]);
            if (live_count(p, a, b) == 0) continue;
            vis |= (uint64_t)1 << r;
            lo = KVM_MIN(lo, a);
            hi = KVM_MAX(hi, b);
        }
        if (!vis) continue;
        /* heads with a stream that still reads */
        int32_t ha = h1, hb = h0;
        for (int32_t h = h0; h < h1; h++)
            for (int32_t r = 0; r < nr; r++) {
                const rule_state *rs = &rule[2 * ((h - h0) * nr + r)];
                if ((vis >> r & 1) && (!rs[0].done || (compare && !rs[1].done))) {
                    ha = KVM_MIN(ha, h);
                    hb = KVM_MAX(hb, h + 1);
                }
            }
        if (ha >= hb) continue;
        int32_t n = 0;
        for (int64_t q = lo; q < hi; q++)
            if (is_live(p, q)) pos[n++] = q;
        /* the next tile's KV travels to the cache while this one computes */
        const int32_t next = j->prefetch && oi + 1 < p->n_order ? order[oi + 1] : -1;
        /* every head of the item still reads: its heads' runs are prefetched
         * together (f32 rows read in place; 16-bit rows, packed per head by
         * fetch_rows, ran faster with the per-head requests: 5.1-5.3 ms
         * against 6.4 at 16k) */
        const int sliced = next >= 0 && nh > 1 && ha == h0 && hb == h1 && !head_major(p) &&
                           kvm_dtype_size(p->k->dtype) == 4 && kvm_dtype_size(p->v->dtype) == 4;
        const int down = next >= 0 && next < tile;
        fetch_rows(p, h0, ha, hb, tile, pos, n, MT, kbuf, vbuf, krow, vrow, &rc);
        st->positions_read += (int64_t)n * (hb - ha);
        for (int32_t h = ha; h < hb; h++) {
            int pf_k = next >= 0 && !p->logits, pf_v = next >= 0; /* once per head, before its first kernel */
            /* f32 rows in one run: the kernels ask for them a few lines a
             * key (every head of the item still reading, for position-major
             * rows: the run holds them all) */
            const void *pfk = NULL, *pfv = NULL;
            size_t pfk_len = 0, pfv_len = 0;
            const int whole = ha == h0 && hb == h1;
            if (pf_k && kern->qk_pf && kdt == KVMEM_F32 && pf_run(p, 0, next, h0, h1, h, &pfk, &pfk_len) &&
                (whole || p->k->strides[0] == D))
                pf_k = 0;
            else
                pfk = NULL;
            if (pf_v && kern->pv_pf && vdt == KVMEM_F32 && pf_run(p, 1, next, h0, h1, h, &pfv, &pfv_len) &&
                (whole || p->v->strides[0] == D))
                pf_v = 0;
            else
                pfv = NULL;
            if (sliced) { /* this head's slice of the next tile, all the item's heads */
                if (pf_k && prefetch_slice(p, 0, next, h0, h1, h - h0, nh)) pf_k = 0;
                if (pf_v && prefetch_slice(p, 1, next, h0, h1, h - h0, nh)) pf_v = 0;
            }
            const void *const *kr = krow + (size_t)(h - h0) * (size_t)MT;
            const void *const *vr = vrow + (size_t)(h - h0) * (size_t)MT;
            for (int32_t r = 0; r < nr; r++) {
                const int32_t si = (h - h0) * nr + r, row = r0 + r;
                rule_state *pr = &rule[2 * si], *orc = &rule[2 * si + 1];
                if (!(vis >> r & 1) || (pr->done && (!compare || orc->done))) continue;
                int32_t a = 0, b = n;
                while (a < n && pos[a] < p->row_lo[row]) a++;
                while (b > a && pos[b - 1] >= p->row_hi[row]) b--;
                for (int32_t g = 0; g < G; g++) {
                    qg[g] = p->q + ((size_t)row * (size_t)p->n_q_heads + (size_t)(h * G + g)) * (size_t)D;
                    ag[g] = acc + (size_t)si * N + (size_t)g * (size_t)D;
                }
                const int32_t nk = b - a;
                if (pf_k) prefetch_rows(p, 0, next, down, h), pf_k = 0;
                if (p->logits) /* SCORED's scan kept every logit: K is not read again */
                    for (int32_t g = 0; g < G; g++) {
                        const size_t hq = (size_t)row * (size_t)p->n_q_heads + (size_t)(h * G + g);
                        const float *lg = p->logits + hq * (size_t)p->T;
                        for (int32_t i = 0; i < nk; i++) s[(size_t)g * (size_t)MT + (size_t)i] = lg[pos[a + i]];
                    }
                else if (kdt == KVMEM_F16)
                    kern->qk_f16(qg, (size_t)G, (const uint16_t *const *)(kr + a), (size_t)nk, (size_t)D, p->scale, s,
                                 (size_t)MT);
                else if (kdt == KVMEM_BF16)
                    kern->qk_bf16(qg, (size_t)G, (const uint16_t *const *)(kr + a), (size_t)nk, (size_t)D, p->scale,
                                  s, (size_t)MT);
                else if (pfk) {
                    kern->qk_pf(qg, (size_t)G, (const float *const *)(kr + a), (size_t)nk, (size_t)D, p->scale, s,
                                (size_t)MT, pfk, pfk_len);
                    pfk = NULL;
                } else
                    kern->qk(qg, (size_t)G, (const float *const *)(kr + a), (size_t)nk, (size_t)D, p->scale, s,
                             (size_t)MT);
                const int bad_g = kern->softmax_step(s, (size_t)MT, (size_t)G, (size_t)nk, mx + (size_t)si * (size_t)G,
                                                     l + (size_t)si * (size_t)G, c);
                if (bad_g >= 0) { /* K not finite there, or a logit overflows */
                    const float *sg = s + (size_t)bad_g * (size_t)MT;
                    int32_t i = 0;
                    while (i < nk && isfinite(sg[i])) i++;
                    res->bad = 1;
                    res->bad_pos = pos[a + KVM_MIN(i, nk - 1)];
                    res->bad_head = h;
                    return;
                }
                if (pf_v) prefetch_rows(p, 1, next, down, h), pf_v = 0;
                if (vdt == KVMEM_F16)
                    kern->pv_f16(ag, (size_t)G, c, s, (size_t)MT, (const uint16_t *const *)(vr + a), (size_t)nk,
                                 (size_t)D);
                else if (vdt == KVMEM_BF16)
                    kern->pv_bf16(ag, (size_t)G, c, s, (size_t)MT, (const uint16_t *const *)(vr + a), (size_t)nk,
                                  (size_t)D);
                else if (pfv) {
                    kern->pv_pf(ag, (size_t)G, c, s, (size_t)MT, (const float *const *)(vr + a), (size_t)nk,
                                (size_t)D, pfv, pfv_len);
                    pfv = NULL;
                } else
                    kern->pv(ag, (size_t)G, c, s, (size_t)MT, (const float *const *)(vr + a), (size_t)nk, (size_t)D);
                /* the stop rules on this stream's running output */
                const float *lr = l + (size_t)si * (size_t)G;
                if (!rules) {
                    pr->visited++;
                    continue;
                }
                const int was_reading = !pr->done || (compare && !orc->done);
                if (!pr->done) {
                    pr->visited++;
                    size_t zn = probe_fill(j, same_rules, ag, lr, z);
                    if (rule_step(p, pr, z, zn)) {
                        pr->done = 1;
                        write_stream(p, row, h, ag, lr);
                    }
                }
                if (compare && !orc->done) {
                    orc->visited++;
                    size_t zn = probe_fill(j, 1, ag, lr, z);
                    if (rule_step(p, orc, z, zn)) orc->done = 1;
                }
                reading -= was_reading && pr->done && (!compare || orc->done);
            }
        }
    }
    for (int32_t h = h0; h < h1; h++)
        for (int32_t r = 0; r < nr; r++) {
            const int32_t si = (h - h0) * nr + r;
            rule_state *pr = &rule[2 * si], *orc = &rule[2 * si + 1];
            if (!pr->done) {
                for (int32_t g = 0; g < G; g++) ag[g] = acc + (size_t)si * N + (size_t)g * (size_t)D;
                write_stream(p, r0 + r, h, ag, l + (size_t)si * (size_t)G);
            }
            if (p->stream_visited) p->stream_visited[(size_t)(r0 + r) * (size_t)p->n_kv_heads + (size_t)h] = pr->visited;
            const int32_t ov = same_rules ? pr->visited : compare ? orc->visited : 0;
            st->n_streams++;
            st->tiles_total += total[r];
            st->tiles_visited += pr->visited;
            st->streams_stopped += pr->visited < total[r];
            if (p->compare) {
                st->oracle_tiles += ov;
                st->oracle_agree += ov == pr->visited;
            }
        }
}

static void attend_task(void *arg, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) attend_item(arg, i);
}

kvmem_status kvm_attend_cpu(kvmem_backend *be, const kvm_attend_plan *p, kvmem_attend_stats *stats) {
    attend_job j;
    memset(&j, 0, sizeof j);
    j.p = p;
    j.kern = kvm_cpu_kernels_get()->attend;
    kvm_threadpool *tp = kvm_cpu_backend_tp(be);
    const int32_t nt = tp ? kvm_threadpool_size(tp) : 1;
    /* each item takes a run of KV heads (read together, so the KV of one
     * position streams from memory) and, when there are fewer KV heads than
     * threads, a chunk of the rows; SCORED: one KV head per item, each head
     * with its own order; head-major K or V (a head's rows adjacent) out of
     * cache: one KV head per item too, so an item streams two runs of
     * memory, not two per head (16 interleaved streams ran at 0.6 of the
     * speed of 2).
     * KV that fits in one core's L2 stays there from call to call and
     * prefetch instructions only cost issue slots; the shared L3 does not
     * keep 8 MiB between calls on a busy machine (2048 tokens of Llama-8B
     * heads ran at a third of the speed without them) */
    if (p->kind != KVMEM_ATTEND_SRC_AGENT) {
        const double kv_bytes = (double)p->T * (double)p->n_kv_heads * (double)p->head_dim *
                                (double)(kvm_dtype_size(p->k->dtype) + kvm_dtype_size(p->v->dtype));
        j.prefetch = kv_bytes > 1.0 * 1024 * 1024;
    }
    j.n_head_chunks = p->head_order || (j.prefetch && head_major(p)) ? p->n_kv_heads : KVM_MIN(p->n_kv_heads, nt);
    j.heads_per_item = (p->n_kv_heads + j.n_head_chunks - 1) / j.n_head_chunks;
    j.n_head_chunks = (p->n_kv_heads + j.heads_per_item - 1) / j.heads_per_item;
    int32_t chunks = 1;
    if (j.n_head_chunks < nt && p->n_rows > 1) chunks = KVM_MIN(p->n_rows, (nt + j.n_head_chunks - 1) / j.n_head_chunks);
    j.rows_per_item = (p->n_rows + chunks - 1) / chunks;
    j.n_row_chunks = (p->n_rows + j.rows_per_item - 1) / j.rows_per_item;
    int64_t mt = 1;
    for (int32_t t = 0; t < p->n_tiles; t++) mt = KVM_MAX(mt, p->tile_start[t + 1] - p->tile_start[t]);
    j.max_tile = (int32_t)mt;
    item_offsets o;
    const size_t per = item_layout(&j, &o);
    size_t items = (size_t)j.n_head_chunks * (size_t)j.n_row_chunks;
    j.scratch_floats = per;
    kvm_scratch *sc = kvm_cpu_backend_scratch(be);
    j.scratch = kvm_scratch_take(sc, items * per * sizeof(float));
    j.item_stats = kvm_calloc(items, sizeof *j.item_stats);
    if (!j.scratch || !j.item_stats) {
        kvm_scratch_give(sc, j.scratch);
        kvm_free(j.item_stats);
        return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_attend: out of memory for %zu work items", items);
    }
    /* the strided probe: element i at i*s + s/2 of the stream's G*D outputs */
    const size_t N = (size_t)p->group * (size_t)p->head_dim;
    if (N > KVMEM_ATTEND_PROBE_SIZE) {
        size_t stride = N / KVMEM_ATTEND_PROBE_SIZE;
        for (int32_t i = 0; i < KVMEM_ATTEND_PROBE_SIZE; i++) {
            const size_t f = (size_t)i * stride + stride / 2;
            j.probe_g[i] = (int32_t)(f / (size_t)p->head_dim);
            j.probe_d[i] = (int32_t)(f % (size_t)p->head_dim);
        }
        j.probe_n = KVMEM_ATTEND_PROBE_SIZE;
    } else {
        j.probe_n = (int32_t)N;
    }
    for (int32_t oi = 0; oi < p->n_order; oi++) /* the same for every item, whatever its order */
        for (int32_t r = 0; r < p->n_rows; r++) {
            const int64_t t0 = p->tile_start[p->order[oi]], t1 = p->tile_start[p->order[oi] + 1];
            j.row_total[r] += live_count(p, KVM_MAX(t0, p->row_lo[r]), KVM_MIN(t1, p->row_hi[r])) > 0;
        }
    kvm_parallel_for(tp, items, 1, attend_task, &j);
    for (size_t i = 0; i < items; i++) /* the first in item order: the same message on any thread count */
        if (j.item_stats[i].bad && p->stream_visited && p->n_rows == 1) {
            /* dev_attend's form (core/backend/backend.h): the stream reports it */
            p->stream_visited[j.item_stats[i].bad_head] = (int32_t)(-1 - j.item_stats[i].bad_pos);
        } else if (j.item_stats[i].bad) {
            kvmem_status bad = kvm_fail(KVMEM_ERR_INVALID_ARG,
                                        "kvmem_attend: K at position %lld, KV head %d is not finite (or its logit overflows)",
                                        (long long)j.item_stats[i].bad_pos, j.item_stats[i].bad_head);
            kvm_scratch_give(sc, j.scratch);
            kvm_free(j.item_stats);
            return bad;
        }
    memset(stats, 0, sizeof *stats);
    for (size_t i = 0; i < items; i++) {
        const kvmem_attend_stats *s = &j.item_stats[i].s;
        stats->n_streams += s->n_streams;
        stats->tiles_total += s->tiles_total;
        stats->tiles_visited += s->tiles_visited;
        stats->streams_stopped += s->streams_stopped;
        stats->oracle_tiles += s->oracle_tiles;
        stats->oracle_agree += s->oracle_agree;
        stats->positions_read += s->positions_read;
    }
    if (p->logits) stats->positions_read = (stats->positions_read + 1) / 2; /* V rows alone: half a row each */
    stats->stopped_early = stats->streams_stopped > 0;
    kvm_scratch_give(sc, j.scratch);
    kvm_free(j.item_stats);
    return KVMEM_OK;
}

/* ---- dev_attend ----
 * The buffer-level form (core/backend/backend.h) as a one-row SLOTMAP plan
 * run by kvm_attend_cpu, so the device kernels are compared with exactly the
 * rule kvmem_attend() runs. */

/* The scored form's orders (backend.h): each KV head's tiles by their
 * largest logit, highest first, equal scores newest first, the logits from
 * the attention kernels as kvmem_attend's own scan takes them
 * (core/attend/attend_order.c: runs of SCORED_RUN live positions of a tile,
 * SCORED_RUN query heads a call), so the CPU entry orders as kvmem_attend
 * does on the CPU. pl: a one-row SLOTMAP plan of contiguous F32 / F16 K. */
#define SCORED_RUN 16
typedef struct scored_tile {
    float score;
    int32_t tile;
} scored_tile;

static int scored_cmp(const void *a, const void *b) {
    const scored_tile *x = a, *y = b;
    if (x->score != y->score) return x->score < y->score ? 1 : -1;
    return (x->tile < y->tile) - (x->tile > y->tile);
}

static kvmem_status dev_scored_order(const kvm_attend_plan *pl, int32_t *head_order) {
    const kvm_attend_kernels *kern = kvm_cpu_kernels_get()->attend;
    const int32_t H = pl->n_kv_heads, G = pl->group, NT = pl->n_tiles;
    const size_t D = (size_t)pl->head_dim, es = kvm_dtype_size(pl->k->dtype);
    scored_tile *st = kvm_malloc((size_t)NT * sizeof *st + 1);
    if (!st) return kvm_fail(KVMEM_ERR_NOMEM, "dev_attend: out of memory for the scores of %d tiles", NT);
    float s[SCORED_RUN * SCORED_RUN];
    const void *kr[SCORED_RUN];
    const float *qv[SCORED_RUN];
    for (int32_t g = 0; g < H; g++) {
        for (int32_t t = 0; t < NT; t++) {
            float best = -INFINITY;
            for (int64_t x = pl->tile_start[t]; x < pl->tile_start[t + 1];) {
                size_t n = 0;
                for (; x < pl->tile_start[t + 1] && n < SCORED_RUN; x++)
                    if (pl->slots[x] >= 0)
                        kr[n++] = (const unsigned char *)pl->k->data +
                                  (size_t)(pl->slots[x] * pl->k->strides[0] + g * pl->k->strides[1]) * es;
                for (int32_t g0 = 0; n > 0 && g0 < G; g0 += SCORED_RUN) {
                    const size_t nq = (size_t)KVM_MIN(SCORED_RUN, G - g0);
                    for (size_t i = 0; i < nq; i++) qv[i] = pl->q + ((size_t)g * (size_t)G + (size_t)g0 + i) * D;
                    if (pl->k->dtype == KVMEM_F16)
                        kern->qk_f16(qv, nq, (const uint16_t *const *)kr, n, D, pl->scale, s, SCORED_RUN);
                    else
                        kern->qk(qv, nq, (const float *const *)kr, n, D, pl->scale, s, SCORED_RUN);
                    for (size_t i = 0; i < nq; i++)
                        for (size_t j = 0; j < n; j++) best = s[i * SCORED_RUN + j] > best ? s[i * SCORED_RUN + j] : best;
                }
            }
            st[t].score = best;
            st[t].tile = t;
        }
        qsort(st, (size_t)NT, sizeof *st, scored_cmp);
        for (int32_t t = 0; t < NT; t++) head_order[(size_t)g * (size_t)NT + (size_t)t] = st[t].tile;
    }
    kvm_free(st);
    return KVMEM_OK;
}

/* The device mirror's rows (backend.h, dev_attend) of every live position
 * p (slots[p] >= 0): *k and *v f32 [n_pos][n_kv_heads][head_dim], the key
 * rotated to base + p; slots[p] becomes p. */
static kvmem_status mirror_rows(const kvm_dev_attend_args *a, unsigned char *const *host, int32_t *slots, float **k,
                                float **v) {
    const size_t T = (size_t)a->n_pos, H = (size_t)a->n_kv_heads, D = (size_t)a->head_dim, row = H * D;
    const size_t es = kvm_dtype_size(a->dtype), np = (size_t)a->rotary_dim / 2;
    *k = kvm_malloc((T + 1) * row * sizeof(float));
    *v = kvm_malloc((T + 1) * row * sizeof(float));
    if (!*k || !*v) return kvm_fail(KVMEM_ERR_NOMEM, "dev_attend: out of memory for %zu positions' rows", T);
    const float *tk = a->k_tail ? (const float *)kvm_cpu_at(a->k_tail, a->tail_off) : NULL;
    const float *tv = a->v_tail ? (const float *)kvm_cpu_at(a->v_tail, a->tail_off) : NULL;
    const float *cs = a->rotary_dim ? (const float *)kvm_cpu_at(a->rope_cs, a->rope_off) : NULL;
    for (size_t p = 0; p < T; p++) {
        if (slots[p] < 0) continue;
        const size_t s = (size_t)slots[p];
        float *kr = *k + p * row, *vr = *v + p * row;
        if (tk && (int64_t)s >= a->tail_slot) {
            memcpy(kr, tk + (s - (size_t)a->tail_slot) * row, row * sizeof(float));
            memcpy(vr, tv + (s - (size_t)a->tail_slot) * row, row * sizeof(float));
        } else {
            kvm_convert_host(kr, KVMEM_F32, host[KVM_DA_K] + a->k_off + s * row * es, a->dtype, row);
            kvm_convert_host(vr, KVMEM_F32, host[KVM_DA_V] + a->v_off + s * row * es, a->dtype, row);
        }
        for (size_t h = 0; cs && h < H; h++)
            for (size_t j = 0; j < np; j++) {
                const float *rp = cs + (p + 1) * 2 * np;
                const float c = cs[j] * rp[j] - cs[np + j] * rp[np + j];
                const float sn = cs[np + j] * rp[j] + cs[j] * rp[np + j];
                float *x0 = kr + h * D + (a->gptj ? 2 * j : j), *x1 = x0 + (a->gptj ? 1 : np);
                float y0 = *x0 * c - *x1 * sn, y1 = *x0 * sn + *x1 * c;
                if (a->attn_factor != 1.0f) {
                    y0 *= a->attn_factor;
                    y1 *= a->attn_factor;
                }
                *x0 = y0;
                *x1 = y1;
            }
        slots[p] = (int32_t)p;
    }
    return KVMEM_OK;
}

kvmem_status kvm_attend_dev_cpu(kvmem_backend *be, const kvm_dev_attend_args *a) {
    const char *fn = "dev_attend";
    if (!a) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: args is NULL", fn);
    const kvmem_buffer *bufs[KVM_DA_N] = {a->q, a->k, a->v, a->slot_map, a->order, a->out, a->visited};
    unsigned char *host[KVM_DA_N];
    size_t size[KVM_DA_N];
    for (int i = 0; i < KVM_DA_N; i++) {
        size[i] = bufs[i] ? kvm_cpu_buffer_size(bufs[i]) : 0;
        host[i] = bufs[i] ? kvm_cpu_at(bufs[i], 0) : NULL;
    }
    char msg[256];
    if (!kvm_dev_attend_check(a, size, msg, sizeof msg)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s", fn, msg);
    if (!kvm_dev_attend_check_mirror(a, a->k_tail ? kvm_cpu_buffer_size(a->k_tail) : 0,
                                     a->v_tail ? kvm_cpu_buffer_size(a->v_tail) : 0,
                                     a->rope_cs ? kvm_cpu_buffer_size(a->rope_cs) : 0, msg, sizeof msg))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s", fn, msg);

    const int64_t T = a->n_pos, ts = a->tile, n_tiles = (T + ts - 1) / ts;
    float *mk = NULL, *mv = NULL;
    int32_t *slots = kvm_malloc(((size_t)T + 1) * sizeof *slots);
    int32_t *order = kvm_malloc(((size_t)a->n_visit + 1) * sizeof *order);
    int64_t *tile_start = kvm_malloc(((size_t)n_tiles + 1) * sizeof *tile_start);
    int64_t *live = kvm_malloc(((size_t)T + 1) * sizeof *live);
    int32_t *seen = kvm_calloc((size_t)n_tiles + 1, sizeof *seen);
    int32_t *head_order = NULL;
    kvmem_status st = KVMEM_OK;
    if (!slots || !order || !tile_start || !live || !seen) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for %lld positions", fn, (long long)T);
        goto done;
    }
    /* every negative slot is dead: one dead id (-1) for the plan */
    const int32_t *sm = (const int32_t *)(const void *)(host[KVM_DA_SLOTS] + a->slot_map_off);
    live[0] = 0;
    for (int64_t j = 0; j < T; j++) {
        int32_t s = sm[j] < 0 ? -1 : sm[j];
        if (s >= a->n_slots) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: slot_map[%lld] = %d outside [0, %lld) and not dead (< 0)", fn,
                          (long long)j, s, (long long)a->n_slots);
            goto done;
        }
        slots[j] = s;
        live[j + 1] = live[j] + (s >= 0);
    }
    const int32_t *om = (const int32_t *)(const void *)(host[KVM_DA_ORDER] + a->order_off);
    for (int32_t i = 0; a->scored && i < a->n_visit; i++) order[i] = (int32_t)(n_tiles - 1 - i); /* every tile */
    for (int32_t i = 0; !a->scored && i < a->n_visit; i++) {
        if (om[i] < 0 || om[i] >= n_tiles || seen[om[i]]) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: order[%d] = %d is outside [0, %lld) or repeated", fn, i, om[i],
                          (long long)n_tiles);
            goto done;
        }
        seen[om[i]] = 1;
        order[i] = om[i];
    }
    for (int64_t t = 0; t < n_tiles; t++) tile_start[t] = t * ts;
    tile_start[n_tiles] = T;

    kvmem_tensor k, v;
    if (kvm_dev_attend_mirror_form(a)) {
        /* the device mirror's form: each live position's rows, as the
         * contract reads them (the tail's f32 rows, keys rotated to base +
         * position by angle addition), at slot = position */
        if ((st = mirror_rows(a, host, slots, &mk, &mv)) != KVMEM_OK) goto done;
        const int64_t mshape[3] = {T, a->n_kv_heads, a->head_dim};
        if ((st = kvmem_tensor_init(&k, mk, KVMEM_F32, 3, mshape)) != KVMEM_OK) goto done;
        if ((st = kvmem_tensor_init(&v, mv, KVMEM_F32, 3, mshape)) != KVMEM_OK) goto done;
    } else {
        const int64_t shape[3] = {a->n_slots, a->n_kv_heads, a->head_dim};
        if ((st = kvmem_tensor_init(&k, host[KVM_DA_K] + a->k_off, a->dtype, 3, shape)) != KVMEM_OK) goto done;
        if ((st = kvmem_tensor_init(&v, host[KVM_DA_V] + a->v_off, a->dtype, 3, shape)) != KVMEM_OK) goto done;
    }
    int64_t row_lo = 0, row_hi = T;
    kvm_attend_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.n_rows = 1;
    pl.n_q_heads = a->n_q_heads;
    pl.n_kv_heads = a->n_kv_heads;
    pl.head_dim = a->head_dim;
    pl.group = a->n_q_heads / a->n_kv_heads;
    pl.scale = a->scale;
    pl.q = (const float *)(const void *)(host[KVM_DA_Q] + a->q_off);
    pl.out = (float *)(void *)(host[KVM_DA_OUT] + a->out_off);
    pl.kind = KVMEM_ATTEND_SRC_SLOTMAP;
    pl.T = T;
    pl.k = &k;
    pl.v = &v;
    pl.slots = slots;
    pl.dead_slot = -1;
    pl.n_tiles = (int32_t)n_tiles;
    pl.tile_start = tile_start;
    pl.order = order;
    pl.n_order = a->n_visit;
    pl.live_prefix = live;
    pl.row_lo = &row_lo;
    pl.row_hi = &row_hi;
    pl.stop_enabled = a->tau_s > 0 || a->tau_d > 0;
    pl.tau_s = a->tau_s;
    pl.tau_d = a->tau_d;
    pl.patience = a->patience;
    pl.probe = KVMEM_ATTEND_PROBE_STRIDED;
    pl.stream_visited = (int32_t *)(void *)(host[KVM_DA_VISITED] + a->visited_off);
    if (a->scored) { /* the order as kvmem_attend's scan finds it, written to `order` */
        head_order = kvm_malloc((size_t)a->n_kv_heads * (size_t)n_tiles * sizeof *head_order + 1);
        if (!head_order) {
            st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for the order of %lld tiles", fn, (long long)n_tiles);
            goto done;
        }
        if ((st = dev_scored_order(&pl, head_order)) != KVMEM_OK) goto done;
        pl.head_order = head_order;
    }
    kvmem_attend_stats stats;
    st = kvm_attend_cpu(be, &pl, &stats);
    if (st == KVMEM_OK && a->scored) {
        int32_t *ord_out = (int32_t *)(void *)(host[KVM_DA_ORDER] + a->order_off);
        memcpy(ord_out, head_order, (size_t)a->n_kv_heads * (size_t)n_tiles * sizeof *head_order);
        for (int32_t g = 0; g < a->n_kv_heads; g++) { /* the live positions of the tiles stream g counted */
            const int32_t *ho = head_order + (size_t)g * (size_t)n_tiles;
            int64_t n = 0;
            for (int32_t i = 0, seen_live = 0; i < n_tiles && seen_live < pl.stream_visited[g]; i++) {
                const int64_t c = live[tile_start[ho[i] + 1]] - live[tile_start[ho[i]]];
                seen_live += c > 0;
                n += c;
            }
            pl.stream_visited[a->n_kv_heads + g] = (int32_t)n;
        }
    }
done:
    kvm_free(head_order);
    kvm_free(slots);
    kvm_free(order);
    kvm_free(tile_start);
    kvm_free(live);
    kvm_free(seen);
    kvm_free(mk);
    kvm_free(mv);
    return st;
}

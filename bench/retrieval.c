/* Suite "retrieval": AABB block scoring (decode: 1 query token, prefill: 32)
 * against EXACT scoring on the same agent, recall of the AABB top-k against
 * the EXACT top-k for each normalisation/aggregation, and the gather of the
 * selected blocks, at Llama-3.1-8B geometry (32 layers, 32/8 heads,
 * head_dim 128, block size 16, f16 storage: f16 AABBs), single thread and
 * all threads.
 *
 * --backend NAME (e.g. vulkan): AABB scoring and the gather run on that
 * backend's device kernels, with "backend" added to each line; the default
 * (cpu) output is unchanged.
 *
 * The decode timing and the machine's read bandwidth are measured in
 * alternation, `rounds` times (7; --quick 3), and each is the median of its
 * rounds: on a shared machine the bandwidth moves from minute to minute.
 *
 * Keys per line (one line per tokens x threads):
 *   read_bw_gbps, peak_gflops, memcpy_gbps  this machine, measured in the run (one thread;
 *                       read_bw_same_bytes_gbps: a buffer of aabb_bytes)
 *   read_bw_threads_gbps  the same read split among this line's threads
 *   aabb_dtype, aabb_bytes  the AABBs' element type and bytes of all (block, layer, KV head)
 *   aabb_ms             kvmem_retrieve, 1 query token, AABB (median)
 *   aabb_decode_gbps    aabb_bytes / aabb_ms;  aabb_decode_ratio = / read_bw_gbps (one thread's limit),
 *                       aabb_decode_ratio_threads = / read_bw_threads_gbps (this thread count's)
 *   speedup_vs_1_thread   aabb_ms with one thread / aabb_ms here (all-threads lines)
 *   aabb_prefill_ms     32 query tokens;  aabb_prefill_gflops = 2*n_q*q_heads*layers*blocks*2*head_dim / time
 *   aabb_prefill_ratio  / (peak_gflops * threads)
 *   exact_ms            the same call in EXACT mode (reads every key, f16)
 *   speedup_vs_exact    exact_ms / aabb_ms
 *   recall_at_k_<norm>_<agg>  |AABB top-k n EXACT top-k| / k, 4-token queries about the topic of one
 *                       256-token segment (16 blocks = k = 16); the history has one topic per segment
 *   gather_ms, gather_gbps    kvmem_gather of 64 blocks to f16 (bytes read + written per second)
 *
 * Lines with "kind":"layout" (at the first size): the tensors a retrieval
 * step takes and gives in an HF/PyTorch engine, contiguous against
 * head-major (the same values; calls of the two layouts alternating, one
 * thread, medians of the thread's CPU time), per dtype (f32, f16, bf16):
 *   op "append"            kvmem_agent_append of `n` tokens (every layer); head-major K/V are
 *                          per layer [n_kv_heads][n][head_dim] (a cache's batch row)
 *   op "retrieve_decode"   kvmem_retrieve, 1 query token;  op "retrieve_prefill": 32 tokens; head-major
 *                          queries are per layer [n_q_heads][n][head_dim] (HF's query_states)
 *   op "gather"            kvmem_gather of `n` tokens (32 blocks) into K/V outputs, head-major: per
 *                          layer [n_kv_heads][n][head_dim] (past_key_values)
 *   ms_1thread, vs_contiguous (ms_1thread over the contiguous line's), gbps_1thread (append and
 *   gather: bytes read + written; retrieve: aabb_bytes), to_read_bw_1thread (over read_bw_cpu_gbps,
 *   one thread's streaming read on the CPU clock, measured in the same run), outputs_equal (1: the
 *   head-major call's output equals the contiguous one's bit for bit: the agent's KV read back,
 *   the selected blocks and every block's score, the gathered K/V)
 *
 * Lines with "kind":"decode_step" (--backend NAME only): host <-> device
 * bytes of one decode step on an agent of `tokens` tokens (two sizes, 4x
 * apart), after one warm-up step: kvmem_retrieve of 1 query token (top_k
 * blocks), kvmem_gather of the selection (f32 K and V), kvmem_attend over
 * the agent (AGENT source, every layer, full attention). Transfer counts
 * (kvmem_context_transfer_stats), not timings:
 *   h2d_bytes, d2h_bytes    the whole step;  retrieve_/gather_/attend_ h2d_bytes, d2h_bytes: per phase
 *   attend_stop_rule_h2d_bytes, _d2h_bytes  the attend phase again with the stop rule on (RECENT
 *                           order, default tau_s, tau_d), not in the totals
 *   query_bytes             the step's query rows (retrieval and attention, f32)
 *   result_bytes            what the step returns: gathered K and V, attention outputs, the selection
 *   block_score_bytes       the result's per-block scores S(b) (kvmem_retrieval_block_scores), 4 bytes a
 *                           block: what retrieval reads back (summed over layers and heads on the device,
 *                           dev_score_reduce; before, the per-(layer, query head) scores, L x Hq times this)
 * Each decode_step line is preceded by a "decode_cases" line on the same agent:
 *   host_bytes              the agent's KV and AABB bytes in host memory (kvmem_agent_info.bytes)
 *   mirror_device_bytes     what its device mirror holds (core/pool/resident.h: boxes, K and V in the
 *                           pool's element type, the f32 tail, the RoPE table, at their allocated
 *                           capacity); mirror_per_host_byte the ratio;
 *                           mirror_device_bytes_after_truncate after the truncate below (0: dropped)
 *   <case>_h2d_bytes, _d2h_bytes  one whole step (retrieve, gather, attend every layer, full
 *                           attention) in turn: steady; exclude_first (exclude = {block 0}: the
 *                           candidates stay one run of blocks); exclude_middle (the middle block:
 *                           two runs); steady_again; new_base (attention at base_position 7);
 *                           truncate (after truncating the agent by 4 blocks) */
#include "bench.h"
#include "kvmem.h"
#include "cpu/kernels.h"
#include "pool/pool.h"
#include "pool/resident.h"
#include "synth.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct rb_call {
    kvmem_agent *ag;
    kvmem_tensor q;
    kvmem_retrieve_params p;
    kvmem_retrieval *r;
    int failed;
} rb_call;

static void rb_retrieve(void *arg) {
    rb_call *c = arg;
    if (kvmem_retrieve(c->ag, &c->q, &c->p, c->r) != KVMEM_OK) c->failed = 1;
}

typedef struct rb_gather {
    kvmem_agent *ag;
    const int32_t *blocks;
    int32_t n;
    kvmem_tensor k, v;
    int failed;
} rb_gather;

static void rb_gather_once(void *arg) {
    rb_gather *g = arg;
    if (kvmem_gather(g->ag, g->blocks, g->n, 0, &g->k, &g->v) != KVMEM_OK) g->failed = 1;
}

static double recall(const kvmem_retrieval *a, const kvmem_retrieval *e) {
    const int32_t *x, *y;
    int32_t nx, ny;
    if (kvmem_retrieval_get(a, 0, &x, NULL, &nx) != KVMEM_OK || kvmem_retrieval_get(e, 0, &y, NULL, &ny) != KVMEM_OK ||
        ny == 0)
        return NAN;
    int hit = 0;
    for (int32_t i = 0; i < nx; i++)
        for (int32_t j = 0; j < ny; j++) hit += x[i] == y[j];
    return (double)hit / (double)ny;
}

/* ---- kind "layout" (see the top of the file) ---- */

/* Fill the 4-D view t (any strides) from f32 rows src, in t's index order. */
static void lay_fill(const kvmem_tensor *t, const float *src) {
    const size_t es = kvm_dtype_size(t->dtype), D = (size_t)t->shape[3];
    size_t i = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++, i++) {
                const int64_t off = a * t->strides[0] + b * t->strides[1] + c * t->strides[2];
                kvm_convert_host((unsigned char *)t->data + (size_t)off * es, t->dtype, src + i * D, KVMEM_F32, D);
            }
}

/* 1 when the two 4-D views (same shape and dtype) hold the same bytes. */
static int lay_equal(const kvmem_tensor *x, const kvmem_tensor *y) {
    const size_t es = kvm_dtype_size(x->dtype), D = (size_t)x->shape[3];
    for (int64_t a = 0; a < x->shape[0]; a++)
        for (int64_t b = 0; b < x->shape[1]; b++)
            for (int64_t c = 0; c < x->shape[2]; c++) {
                const int64_t ox = a * x->strides[0] + b * x->strides[1] + c * x->strides[2];
                const int64_t oy = a * y->strides[0] + b * y->strides[1] + c * y->strides[2];
                if (memcmp((const unsigned char *)x->data + (size_t)ox * es, (const unsigned char *)y->data + (size_t)oy * es,
                           D * es) != 0)
                    return 0;
            }
    return 1;
}

/* K/V [L][n][H][D] over buf: contiguous, or head-major (each layer
 * [H][n][D], as one batch row of an HF cache). */
static void lay_kv(kvmem_tensor *t, void *buf, kvmem_dtype dt, int64_t L, int64_t n, int64_t H, int64_t D, int hm) {
    int64_t sh[4] = {L, n, H, D};
    kvmem_tensor_init(t, buf, dt, 4, sh);
    if (hm) t->strides[1] = D, t->strides[2] = n * D;
}

/* Queries [nq][L][NQ][D] over buf: contiguous, or as HF hands them, per
 * layer [NQ][nq][D] (query_states of batch row 0), the layers one after
 * the other (what kvmem.torch's query_view passes). */
static void lay_q(kvmem_tensor *t, void *buf, kvmem_dtype dt, int64_t nq, int64_t L, int64_t NQ, int64_t D, int hm) {
    int64_t sh[4] = {nq, L, NQ, D};
    kvmem_tensor_init(t, buf, dt, 4, sh);
    if (hm) t->strides[0] = D, t->strides[1] = NQ * nq * D, t->strides[2] = nq * D;
}

/* 1 when two retrievals chose the same blocks with the same scores, and
 * gave every block the same aggregated score (bit for bit). */
static int same_retrieval(const kvmem_retrieval *a, const kvmem_retrieval *b) {
    const int32_t *ba, *bb;
    const float *sa, *sb;
    int32_t na, nb;
    if (kvmem_retrieval_get(a, 0, &ba, &sa, &na) != KVMEM_OK || kvmem_retrieval_get(b, 0, &bb, &sb, &nb) != KVMEM_OK ||
        na != nb || memcmp(ba, bb, (size_t)na * sizeof *ba) || memcmp(sa, sb, (size_t)na * sizeof *sa))
        return 0;
    if (kvmem_retrieval_block_scores(a, 0, &sa, &na) != KVMEM_OK || kvmem_retrieval_block_scores(b, 0, &sb, &nb) != KVMEM_OK ||
        na != nb)
        return 0;
    return memcmp(sa, sb, (size_t)na * sizeof *sa) == 0; /* NaN for non-candidates: the same bits both ways */
}

typedef struct lay_ctx {
    const kvm_bench_opts *o;
    kvmem_pool *pool;
    kvmem_agent *ag; /* the history */
    int64_t T;
    double aabb_bytes, rd_cpu;
    int reps;
} lay_ctx;

static void lay_line(const lay_ctx *c, const char *op, kvmem_dtype dt, int x, int64_t n, double t, double t0,
                     double bytes, int equal) {
    static const char *const lname[2] = {"contiguous", "head_major"};
    const char *dname = dt == KVMEM_F32 ? "f32" : dt == KVMEM_F16 ? "f16" : "bf16";
    const double gbps = bytes / t / 1e9;
    if (c->o->json) {
        kvm_json_begin(c->o->out, "retrieval");
        kvm_json_str(c->o->out, "kind", "layout");
        kvm_json_str(c->o->out, "op", op);
        kvm_json_str(c->o->out, "layout", lname[x]);
        kvm_json_str(c->o->out, "dtype", dname);
        kvm_json_int(c->o->out, "tokens", (long long)c->T);
        kvm_json_int(c->o->out, "n", (long long)n);
        kvm_json_int(c->o->out, "threads", 1);
        kvm_json_num(c->o->out, "ms_1thread", t * 1e3);
        kvm_json_num(c->o->out, "vs_contiguous", t / t0);
        kvm_json_num(c->o->out, "gbps_1thread", gbps);
        kvm_json_num(c->o->out, "to_read_bw_1thread", gbps / c->rd_cpu);
        kvm_json_num(c->o->out, "read_bw_cpu_gbps", c->rd_cpu);
        kvm_json_int(c->o->out, "outputs_equal", equal);
        kvm_json_end(c->o->out);
    } else {
        fprintf(c->o->out, "retrieval layout %-16s %-10s %-4s n=%lld: %.3f ms one thread (%.2fx contiguous), %.1f GB/s%s\n",
                op, lname[x], dname, (long long)n, t * 1e3, t / t0, gbps, equal ? "" : ", OUTPUTS DIFFER");
    }
}

/* Append n tokens (every layer), both layouts, into one agent emptied
 * before each call: the new blocks then reuse the same freed memory in both
 * layouts. (Two agents measured 17 vs 29 ms for the same work, from where
 * each agent's freed blocks lay in the allocator's heap: page faults.) */
static int lay_append(const lay_ctx *c, kvmem_dtype dt, const float *k, const float *v, int64_t n) {
    const kvmem_model_spec *s = &c->pool->spec;
    const int64_t L = s->n_layers, H = s->n_kv_heads, D = s->head_dim;
    const size_t elems = (size_t)(L * n * H * D), es = kvm_dtype_size(dt);
    void *buf[2][2] = {{malloc(elems * es), malloc(elems * es)}, {malloc(elems * es), malloc(elems * es)}};
    float *back[2][2] = {{malloc(elems * sizeof(float)), malloc(elems * sizeof(float))},
                         {malloc(elems * sizeof(float)), malloc(elems * sizeof(float))}};
    kvmem_agent *ag = NULL;
    double t[2][64];
    int rc = kvmem_agent_open(c->pool, "layout", &ag) != KVMEM_OK;
    kvmem_tensor kt[2], vt[2], bk[2], bv[2];
    for (int x = 0; x < 2 && !rc; x++) {
        rc = !buf[x][0] || !buf[x][1] || !back[x][0] || !back[x][1];
        if (rc) break;
        lay_kv(&kt[x], buf[x][0], dt, L, n, H, D, x);
        lay_kv(&vt[x], buf[x][1], dt, L, n, H, D, x);
        lay_fill(&kt[x], k);
        lay_fill(&vt[x], v);
        lay_kv(&bk[x], back[x][0], KVMEM_F32, L, n, H, D, 0);
        lay_kv(&bv[x], back[x][1], KVMEM_F32, L, n, H, D, 0);
    }
    for (int r = -1; r < c->reps && !rc; r++)
        for (int x = 0; x < 2 && !rc; x++) { /* layouts alternate: load changes hit both alike */
            if (kvmem_agent_truncate(ag, 0) != KVMEM_OK) rc = 1;
            const double a = kvm_thread_cpu_now();
            if (!rc && kvmem_agent_append(ag, &kt[x], &vt[x], NULL) != KVMEM_OK) rc = 1;
            if (r >= 0) t[x][r] = kvm_thread_cpu_now() - a;
            /* what the agent holds after each layout's last append, read back contiguous */
            if (!rc && r == c->reps - 1 && kvmem_agent_read(ag, 0, n, &bk[x], &bv[x]) != KVMEM_OK) rc = 1;
        }
    if (!rc) {
        const int equal = memcmp(back[0][0], back[1][0], elems * sizeof(float)) == 0 &&
                          memcmp(back[0][1], back[1][1], elems * sizeof(float)) == 0;
        const double bytes = 2.0 * (double)elems * (double)(es + kvm_dtype_size(c->pool->params.storage_dtype));
        const double m0 = kvm_median(t[0], c->reps), m1 = kvm_median(t[1], c->reps);
        lay_line(c, "append", dt, 0, n, m0, m0, bytes, equal);
        lay_line(c, "append", dt, 1, n, m1, m0, bytes, equal);
    }
    if (ag) {
        kvmem_agent_close(ag);
        if (!rc) kvmem_pool_remove_agent(c->pool, "layout"); /* on failure: keep the message */
    }
    for (int x = 0; x < 2; x++) free(buf[x][0]), free(buf[x][1]), free(back[x][0]), free(back[x][1]);
    return rc;
}

/* kvmem_retrieve with nq query tokens q ([nq][L][NQ][D] f32), both layouts. */
static int lay_retrieve(const lay_ctx *c, kvmem_dtype dt, const float *q, int64_t nq, int top_k) {
    const kvmem_model_spec *s = &c->pool->spec;
    const int64_t L = s->n_layers, NQ = s->n_q_heads, D = s->head_dim;
    const size_t elems = (size_t)(nq * L * NQ * D), es = kvm_dtype_size(dt);
    void *buf[2] = {malloc(elems * es), malloc(elems * es)};
    kvmem_retrieval *res[2] = {NULL, NULL};
    int rc = !buf[0] || !buf[1] || kvmem_retrieval_create(&res[0]) != KVMEM_OK ||
             kvmem_retrieval_create(&res[1]) != KVMEM_OK;
    kvmem_tensor qt[2];
    kvmem_retrieve_params p = kvmem_retrieve_default_params();
    p.top_k = top_k;
    double t[2][64];
    /* decode: 2 ms calls whose query is a tiny part of the work; more of them against the noise */
    const int reps = nq == 1 ? KVM_MIN(4 * c->reps + 1, 61) : c->reps;
    for (int x = 0; x < 2 && !rc; x++) {
        lay_q(&qt[x], buf[x], dt, nq, L, NQ, D, x);
        lay_fill(&qt[x], q);
    }
    for (int r = -1; r < reps && !rc; r++)
        for (int x = 0; x < 2 && !rc; x++) {
            const double a = kvm_thread_cpu_now();
            if (kvmem_retrieve(c->ag, &qt[x], &p, res[x]) != KVMEM_OK) rc = 1;
            if (r >= 0) t[x][r] = kvm_thread_cpu_now() - a;
        }
    if (!rc) {
        const int equal = same_retrieval(res[0], res[1]);
        const double m0 = kvm_median(t[0], reps), m1 = kvm_median(t[1], reps);
        const char *op = nq == 1 ? "retrieve_decode" : "retrieve_prefill";
        lay_line(c, op, dt, 0, nq, m0, m0, c->aabb_bytes, equal);
        lay_line(c, op, dt, 1, nq, m1, m0, c->aabb_bytes, equal);
    }
    kvmem_retrieval_free(res[0]);
    kvmem_retrieval_free(res[1]);
    free(buf[0]), free(buf[1]);
    return rc;
}

/* kvmem_gather of the blocks into K/V of dtype dt, both layouts. */
static int lay_gather(const lay_ctx *c, kvmem_dtype dt, const int32_t *blocks, int32_t nb, int64_t M) {
    const kvmem_model_spec *s = &c->pool->spec;
    const int64_t L = s->n_layers, H = s->n_kv_heads, D = s->head_dim;
    const size_t elems = (size_t)(L * M * H * D), es = kvm_dtype_size(dt);
    void *buf[2][2] = {{malloc(elems * es), malloc(elems * es)}, {malloc(elems * es), malloc(elems * es)}};
    int rc = !buf[0][0] || !buf[0][1] || !buf[1][0] || !buf[1][1];
    kvmem_tensor kt[2], vt[2];
    double t[2][64];
    for (int x = 0; x < 2 && !rc; x++) {
        lay_kv(&kt[x], buf[x][0], dt, L, M, H, D, x);
        lay_kv(&vt[x], buf[x][1], dt, L, M, H, D, x);
    }
    for (int r = -1; r < c->reps && !rc; r++)
        for (int x = 0; x < 2 && !rc; x++) {
            const double a = kvm_thread_cpu_now();
            if (kvmem_gather(c->ag, blocks, nb, 0, &kt[x], &vt[x]) != KVMEM_OK) rc = 1;
            if (r >= 0) t[x][r] = kvm_thread_cpu_now() - a;
        }
    if (!rc) {
        const int equal = lay_equal(&kt[0], &kt[1]) && lay_equal(&vt[0], &vt[1]);
        const double bytes = 2.0 * (double)elems * (double)(es + kvm_dtype_size(c->pool->params.storage_dtype));
        const double m0 = kvm_median(t[0], c->reps), m1 = kvm_median(t[1], c->reps);
        lay_line(c, "gather", dt, 0, M, m0, m0, bytes, equal);
        lay_line(c, "gather", dt, 1, M, m1, m0, bytes, equal);
    }
    for (int x = 0; x < 2; x++) free(buf[x][0]), free(buf[x][1]);
    return rc;
}

/* kvmem_attend of one query row (q: [L][NQ][D]) over every layer of the
 * agent, keys at positions base + index; nonzero on the first failure. */
static int attend_layers(kvmem_context *ctx, kvmem_agent *ag, const float *q, const kvmem_attend_params *ap, float *out,
                         int32_t L, int32_t NQ, int32_t D, int64_t base) {
    for (int32_t l = 0; l < L; l++) {
        int64_t as[3] = {1, NQ, D};
        kvmem_tensor aq, ao;
        kvmem_tensor_init(&aq, (void *)(uintptr_t)(q + (size_t)l * (size_t)NQ * (size_t)D), KVMEM_F32, 3, as);
        kvmem_tensor_init(&ao, out, KVMEM_F32, 3, as);
        kvmem_attend_source src;
        memset(&src, 0, sizeof src);
        src.kind = KVMEM_ATTEND_SRC_AGENT;
        src.agent = ag;
        src.layer = l;
        src.base_position = base;
        if (kvmem_attend(ctx, &aq, &src, ap, &ao, NULL) != KVMEM_OK) return 1;
    }
    return 0;
}

/* One whole decode step (retrieve 1 query token, gather the selection, attend
 * every layer over the agent at positions base + index, full attention) and
 * its host <-> device bytes in x[0] (up) and x[1] (down). */
static int whole_step(kvmem_context *ctx, kvmem_agent *ag, kvmem_retrieval *r, const kvmem_model_spec *spec,
                      const float *q, float *gk, float *gv, float *out, int top_k, const int32_t *excl, int32_t n_excl,
                      int64_t base, uint64_t x[2]) {
    const int32_t L = spec->n_layers, H = spec->n_kv_heads, NQ = spec->n_q_heads, D = spec->head_dim;
    uint64_t h0, d0, h1, d1;
    kvmem_context_transfer_stats(ctx, &h0, &d0);
    int64_t qs[4] = {1, L, NQ, D};
    kvmem_tensor qt;
    kvmem_tensor_init(&qt, (void *)(uintptr_t)q, KVMEM_F32, 4, qs);
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = top_k;
    rp.exclude = excl;
    rp.n_exclude = n_excl;
    const int32_t *sel = NULL;
    int32_t n_sel = 0;
    int64_t m = 0;
    int rc = kvmem_retrieve(ag, &qt, &rp, r) != KVMEM_OK || kvmem_retrieval_get(r, 0, &sel, NULL, &n_sel) != KVMEM_OK ||
             kvmem_retrieval_n_tokens(r, 0, &m) != KVMEM_OK;
    int64_t gs[4] = {L, m, H, D};
    kvmem_tensor kt, vt;
    kvmem_tensor_init(&kt, gk, KVMEM_F32, 4, gs);
    kvmem_tensor_init(&vt, gv, KVMEM_F32, 4, gs);
    rc = rc || kvmem_gather(ag, sel, n_sel, 0, &kt, &vt) != KVMEM_OK;
    kvmem_attend_params ap = kvmem_attend_default_params();
    ap.order = KVMEM_ATTEND_RECENT;
    ap.tau_s = ap.tau_d = 0;
    rc = rc || attend_layers(ctx, ag, q, &ap, out, L, NQ, D, base);
    kvmem_context_transfer_stats(ctx, &h1, &d1);
    x[0] = h1 - h0;
    x[1] = d1 - d0;
    return rc;
}

/* Bytes the agent's device mirror holds (core/pool/resident.h), 0 without one. */
static uint64_t mirror_bytes(const kvmem_agent *ag) {
    const kvm_resident *r = ag->mem ? ag->mem->res : NULL;
    return r ? r->bytes : 0;
}

/* One decode step's transfers on an agent of T tokens (see "decode_step"). */
static int decode_step_line(const kvm_bench_opts *o, kvmem_context *ctx, const kvmem_model_spec *spec, kvm_synth *syn,
                            int64_t T, int top_k) {
    const int32_t L = spec->n_layers, H = spec->n_kv_heads, NQ = spec->n_q_heads, D = spec->head_dim, BS = 16;
    const int chunk = 256;
    const size_t tok_elems = (size_t)L * (size_t)H * (size_t)D;
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.block_size = BS;
    pp.storage_dtype = KVMEM_F16;
    kvmem_pool *pool = NULL;
    kvmem_agent *ag = NULL;
    kvmem_retrieval *r = NULL;
    float *k = malloc((size_t)chunk * tok_elems * sizeof(float)), *v = malloc((size_t)chunk * tok_elems * sizeof(float));
    float *q = malloc((size_t)L * (size_t)NQ * (size_t)D * sizeof(float)), *out = malloc((size_t)NQ * (size_t)D * sizeof(float));
    const size_t M = (size_t)top_k * BS;
    float *gk = malloc(M * tok_elems * sizeof(float)), *gv = malloc(M * tok_elems * sizeof(float));
    int rc = !k || !v || !q || !out || !gk || !gv || kvmem_pool_create(ctx, spec, &pp, &pool) != KVMEM_OK ||
             kvmem_agent_open(pool, "step", &ag) != KVMEM_OK || kvmem_retrieval_create(&r) != KVMEM_OK;
    uint64_t rng = 99;
    for (int64_t t = 0; t < T && !rc; t += chunk) {
        kvm_synth_tokens(syn, (int32_t)(t / chunk) % syn->n_topics, chunk, &rng, k, v);
        int64_t sh[4] = {L, chunk, H, D};
        kvmem_tensor kt, vt;
        kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh);
        kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh);
        rc = kvmem_agent_append(ag, &kt, &vt, NULL) != KVMEM_OK;
    }
    uint64_t x[8][2] = {{0}};
    for (int rep = 0; rep < 2 && !rc; rep++) { /* rep 0 warms up: the blocks go up once */
        kvm_synth_query(syn, 0, 1, &rng, q);
        int64_t qs[4] = {1, L, NQ, D};
        kvmem_tensor qt;
        kvmem_tensor_init(&qt, q, KVMEM_F32, 4, qs);
        kvmem_retrieve_params rp = kvmem_retrieve_default_params();
        rp.top_k = top_k;
        const int32_t *sel = NULL;
        int32_t n_sel = 0;
        int64_t m = 0;
        kvmem_context_transfer_stats(ctx, &x[0][0], &x[0][1]);
        rc = kvmem_retrieve(ag, &qt, &rp, r) != KVMEM_OK || kvmem_retrieval_get(r, 0, &sel, NULL, &n_sel) != KVMEM_OK ||
             kvmem_retrieval_n_tokens(r, 0, &m) != KVMEM_OK;
        kvmem_context_transfer_stats(ctx, &x[1][0], &x[1][1]);
        if (rc) break;
        int64_t gs[4] = {L, m, H, D};
        kvmem_tensor kt, vt;
        kvmem_tensor_init(&kt, gk, KVMEM_F32, 4, gs);
        kvmem_tensor_init(&vt, gv, KVMEM_F32, 4, gs);
        rc = kvmem_gather(ag, sel, n_sel, 0, &kt, &vt) != KVMEM_OK;
        kvmem_context_transfer_stats(ctx, &x[2][0], &x[2][1]);
        /* full attention, then (outside the step's totals) again with the
         * stop rule on, whose RECENT tile list is the one part that differs */
        for (int stop = 0; stop < 2 && !rc; stop++) {
            kvmem_attend_params ap = kvmem_attend_default_params();
            ap.order = KVMEM_ATTEND_RECENT;
            if (!stop) ap.tau_s = ap.tau_d = 0;
            rc = attend_layers(ctx, ag, q, &ap, out, L, NQ, D, 0);
            kvmem_context_transfer_stats(ctx, &x[3 + stop][0], &x[3 + stop][1]);
        }
    }
    /* the mirror's size, and the whole step again: steady, after an exclude
     * list, after a new base_position, after a truncate (see "decode_cases") */
    uint64_t cs[6][2] = {{0}}, mirror = 0, mirror_trunc = 0, host = 0;
    if (!rc) {
        kvmem_agent_info ai;
        rc = kvmem_agent_get_info(ag, &ai) != KVMEM_OK;
        host = ai.bytes;
        mirror = mirror_bytes(ag);
        const int32_t excl_first[1] = {0}, excl_mid[1] = {(int32_t)(T / BS / 2)};
        rc = rc || whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, NULL, 0, 0, cs[0]) ||
             whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, excl_first, 1, 0, cs[1]) ||
             whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, excl_mid, 1, 0, cs[2]) ||
             whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, NULL, 0, 0, cs[3]) ||
             whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, NULL, 0, 7, cs[4]) ||
             kvmem_agent_truncate(ag, T - 4 * BS) != KVMEM_OK ||
             whole_step(ctx, ag, r, spec, q, gk, gv, out, top_k, NULL, 0, 0, cs[5]);
        mirror_trunc = mirror_bytes(ag);
        if (!rc && o->json) {
            kvm_json_begin(o->out, "retrieval");
            kvm_json_str(o->out, "kind", "decode_cases");
            kvm_json_str(o->out, "backend", kvmem_context_backend(ctx));
            kvm_json_str(o->out, "model", spec->model_id);
            kvm_json_int(o->out, "tokens", (long long)T);
            kvm_json_int(o->out, "top_k", top_k);
            kvm_json_int(o->out, "host_bytes", (long long)host);
            kvm_json_int(o->out, "mirror_device_bytes", (long long)mirror);
            kvm_json_num(o->out, "mirror_per_host_byte", host ? (double)mirror / (double)host : 0);
            kvm_json_int(o->out, "mirror_device_bytes_after_truncate", (long long)mirror_trunc);
            static const char *cn[6] = {"steady", "exclude_first", "exclude_middle", "steady_again", "new_base",
                                        "truncate"};
            for (int i = 0; i < 6; i++) {
                char key[48];
                snprintf(key, sizeof key, "%s_h2d_bytes", cn[i]);
                kvm_json_int(o->out, key, (long long)cs[i][0]);
                snprintf(key, sizeof key, "%s_d2h_bytes", cn[i]);
                kvm_json_int(o->out, key, (long long)cs[i][1]);
            }
            kvm_json_end(o->out);
        }
    }
    if (!rc) {
        const double query = 2.0 * L * NQ * D * 4;
        const double result = 2.0 * (double)M * (double)tok_elems * 4 + (double)L * NQ * D * 4 + (double)top_k * 4;
        const double scores = (double)(T / BS) * 4; /* one set (GLOBAL) */
        if (o->json) {
            kvm_json_begin(o->out, "retrieval");
            kvm_json_str(o->out, "kind", "decode_step");
            kvm_json_str(o->out, "backend", kvmem_context_backend(ctx));
            kvm_json_str(o->out, "model", spec->model_id);
            kvm_json_int(o->out, "tokens", (long long)T);
            kvm_json_int(o->out, "top_k", top_k);
            kvm_json_int(o->out, "h2d_bytes", (long long)(x[3][0] - x[0][0]));
            kvm_json_int(o->out, "d2h_bytes", (long long)(x[3][1] - x[0][1]));
            static const char *ph[3] = {"retrieve", "gather", "attend"};
            for (int i = 0; i < 3; i++) {
                char key[32];
                snprintf(key, sizeof key, "%s_h2d_bytes", ph[i]);
                kvm_json_int(o->out, key, (long long)(x[i + 1][0] - x[i][0]));
                snprintf(key, sizeof key, "%s_d2h_bytes", ph[i]);
                kvm_json_int(o->out, key, (long long)(x[i + 1][1] - x[i][1]));
            }
            kvm_json_int(o->out, "attend_stop_rule_h2d_bytes", (long long)(x[4][0] - x[3][0]));
            kvm_json_int(o->out, "attend_stop_rule_d2h_bytes", (long long)(x[4][1] - x[3][1]));
            kvm_json_num(o->out, "query_bytes", query);
            kvm_json_num(o->out, "result_bytes", result);
            kvm_json_num(o->out, "block_score_bytes", scores);
            kvm_json_end(o->out);
        } else {
            fprintf(o->out, "[backend %s] decode step %lld tokens: %llu bytes up, %llu down (query %.0f, result %.0f, block scores %.0f)\n",
                    kvmem_context_backend(ctx), (long long)T, (unsigned long long)(x[3][0] - x[0][0]),
                    (unsigned long long)(x[3][1] - x[0][1]), query, result, scores);
        }
    } else {
        fprintf(stderr, "retrieval bench (decode step): %s\n", kvmem_last_error());
    }
    kvmem_retrieval_free(r);
    kvmem_agent_close(ag);
    kvmem_pool_free(pool);
    free(k), free(v), free(q), free(out), free(gk), free(gv);
    return rc;
}

static int run_retrieval(const kvm_bench_opts *o) {
    const int quick = o->quick;
    kvmem_model_spec spec = kvmem_model_spec_default();
    spec.n_layers = quick ? 4 : 32;
    spec.n_q_heads = quick ? 8 : 32;
    spec.n_kv_heads = quick ? 2 : 8;
    spec.head_dim = 128;
    spec.rope_theta = 500000.0;
    snprintf(spec.model_id, sizeof spec.model_id, "%s", quick ? "quick-4L-8q2kv-128" : "llama-3.1-8b-geometry");
    const int64_t sizes_full[3] = {4096, 16384, 65536}, sizes_quick[1] = {2048};
    const int64_t *sizes = quick ? sizes_quick : sizes_full;
    int n_sizes = quick ? 1 : 3;
    /* KVMEM_BENCH_MAX_TOKENS=N skips the larger sizes (e.g. on a small machine) */
    const char *cap = getenv("KVMEM_BENCH_MAX_TOKENS");
    while (cap && n_sizes > 1 && sizes[n_sizes - 1] > atoll(cap)) n_sizes--;
    const int BS = 16, top_k = 16, n_prefill = 32, chunk = 256;
    const int32_t L = spec.n_layers, H = spec.n_kv_heads, NQ = spec.n_q_heads, D = spec.head_dim;

    size_t big = quick ? ((size_t)32 << 20) : ((size_t)256 << 20);
    double memcpy_bw = kvm_measure_memcpy_gbps(big);

    /* --backend: AABB scoring and the gather run on that backend's device
     * kernels when it has them (core/retrieve/dev_route.c), over the agent's
     * device-resident blocks (core/pool/resident.h); EXACT scoring and top-k
     * stay on the host. */
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = o->backend ? o->backend : "cpu";
    cp.n_threads = o->n_threads;
    kvmem_context *ctx_all = NULL, *ctx_one = NULL;
    if (kvmem_context_create(&cp, &ctx_all) != KVMEM_OK) return 1;
    cp.n_threads = 1;
    if (kvmem_context_create(&cp, &ctx_one) != KVMEM_OK) {
        kvmem_context_free(ctx_all);
        return 1;
    }
    const int all_threads = kvmem_context_n_threads(ctx_all);
    /* named in the output only when not the CPU (the CPU lines stay as they were) */
    const char *be_name = kvmem_context_backend(ctx_all);
    const int on_device = strcmp(be_name, "cpu") != 0;
    kvm_synth syn;
    /* one topic per 256-token segment: a question's topic then has exactly
     * chunk / BS = 16 = top_k relevant blocks, so recall@k asks whether AABB
     * finds the same blocks as EXACT, not how it orders a crowd of ties */
    const int32_t n_topics = (int32_t)(sizes[n_sizes - 1] / chunk);
    if (!kvm_synth_init(&syn, &spec, n_topics, 7)) return 1;
    const size_t tok_elems = (size_t)L * (size_t)H * (size_t)D;
    float *k = malloc((size_t)chunk * tok_elems * sizeof(float)), *v = malloc((size_t)chunk * tok_elems * sizeof(float));
    float *q = malloc((size_t)n_prefill * (size_t)L * (size_t)NQ * (size_t)D * sizeof(float));
    int rc = 0;
    for (int si = 0; si < n_sizes && !rc; si++) {
        const int64_t T = sizes[si];
        /* f16 KV (2 * T * tok_elems * 2 bytes) plus f32 AABBs and slack */
        double need = (double)T * (double)tok_elems * 4.0 + (double)T / BS * (double)tok_elems * 8.0 + 1e9;
        double avail = (double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
        if (need > avail) {
            if (o->json) {
                kvm_json_begin(o->out, "retrieval");
                kvm_json_int(o->out, "tokens", (long long)T);
                kvm_json_str(o->out, "skipped", "not enough free memory for the f16 KV of this size");
                kvm_json_num(o->out, "need_gb", need / 1e9);
                kvm_json_num(o->out, "free_gb", avail / 1e9);
                kvm_json_end(o->out);
            } else {
                fprintf(o->out, "retrieval %lld tokens: skipped, needs %.1f GB, %.1f GB free\n", (long long)T, need / 1e9,
                        avail / 1e9);
            }
            continue;
        }
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.block_size = BS;
        pp.storage_dtype = KVMEM_F16;
        kvmem_pool *pool = NULL;
        kvmem_agent *ag = NULL;
        if (kvmem_pool_create(ctx_all, &spec, &pp, &pool) != KVMEM_OK || kvmem_agent_open(pool, "bench", &ag) != KVMEM_OK) {
            kvmem_pool_free(pool);
            rc = 1;
            break;
        }
        /* the history: topic segments of `chunk` tokens */
        uint64_t rng = 1234 + (uint64_t)si;
        int32_t n_chunks = (int32_t)(T / chunk);
        int32_t *topics = malloc((size_t)n_chunks * sizeof(int32_t));
        for (int32_t c = 0; c < n_chunks && !rc; c++) {
            topics[c] = c % n_topics;
            kvm_synth_tokens(&syn, topics[c], chunk, &rng, k, v);
            int64_t sh[4] = {L, chunk, H, D};
            kvmem_tensor kt, vt;
            kvmem_tensor_init(&kt, k, KVMEM_F32, 4, sh);
            kvmem_tensor_init(&vt, v, KVMEM_F32, 4, sh);
            if (kvmem_agent_append(ag, &kt, &vt, NULL) != KVMEM_OK) rc = 1;
        }
        const int64_t nb = T / BS;
        const double aabb_bytes = (double)nb * (double)kvm_aabb_block_bytes(pool);
        double t_dec_one = NAN; /* the one-thread decode time, for the all-threads line */
        kvmem_retrieval *ra = NULL, *re = NULL;
        kvmem_retrieval_create(&ra);
        kvmem_retrieval_create(&re);
        for (int th = 0; th < 2 && !rc; th++) {
            int threads = th == 0 ? 1 : all_threads;
            if (th == 1 && all_threads == 1) break;
            /* the same agent and data, scored on a context with this many
             * threads (internal access: the pool's context is swapped) */
            pool->ctx = th == 0 ? ctx_one : ctx_all;
            const int reps = quick ? 3 : 5, rounds = quick ? 3 : 7, reps_exact = quick ? 2 : 3;
            /* The machine's limits, measured in alternation with this line's
             * decode timings: on a shared machine they move from minute to
             * minute. read_bw_same: streaming read of a buffer as large as
             * the AABB array (the same cache level). */
            double peak = kvm_measure_peak_gflops();
            double read_bw_same = kvm_measure_read_bw_gbps((size_t)aabb_bytes);
            rb_call c = {ag, {0}, kvmem_retrieve_default_params(), ra, 0};
            c.p.top_k = top_k;
            int64_t qs[4] = {1, L, NQ, D};
            int32_t qtopic = topics[kvm_synth_next(&rng) % (uint64_t)n_chunks];
            kvm_synth_query(&syn, qtopic, n_prefill, &rng, q);
            kvmem_tensor_init(&c.q, q, KVMEM_F32, 4, qs);
            double rbw[16], rbw_t[16], tdec[16];
            for (int r = 0; r < rounds; r++) {
                rbw[r] = kvm_measure_read_bw_gbps(big);
                rbw_t[r] = kvm_measure_read_bw_threads_gbps(big, threads);
                tdec[r] = kvm_time_median(rb_retrieve, &c, 1, reps);
            }
            double read_bw = kvm_median(rbw, rounds), read_bw_t = kvm_median(rbw_t, rounds);
            double t_dec = kvm_median(tdec, rounds);
            if (th == 0) t_dec_one = t_dec;
            c.p.mode = KVMEM_RETRIEVE_EXACT;
            c.r = re;
            double t_exact = kvm_time_median(rb_retrieve, &c, 1, reps_exact);
            c.p.mode = KVMEM_RETRIEVE_AABB;
            c.r = ra;
            qs[0] = n_prefill;
            kvmem_tensor_init(&c.q, q, KVMEM_F32, 4, qs);
            double t_pre = kvm_time_median(rb_retrieve, &c, 1, quick ? 3 : 5);
            double pre_flops = 2.0 * n_prefill * NQ * (double)L * (double)nb * 2.0 * D;
            /* recall per normalisation/aggregation: 4-token queries */
            double rec[4] = {0, 0, 0, 0};
            const int n_rq = quick ? 2 : 3;
            for (int m = 0; m < 4; m++) {
                for (int i = 0; i < n_rq; i++) {
                    kvm_synth_query(&syn, topics[kvm_synth_next(&rng) % (uint64_t)n_chunks], 4, &rng, q);
                    qs[0] = 4;
                    kvmem_tensor_init(&c.q, q, KVMEM_F32, 4, qs);
                    c.p.norm = m / 2 ? KVMEM_NORM_RR : KVMEM_NORM_SOFTMAX;
                    c.p.agg = m % 2 ? KVMEM_AGG_SUM : KVMEM_AGG_MAX;
                    c.p.mode = KVMEM_RETRIEVE_AABB;
                    c.r = ra;
                    rb_retrieve(&c);
                    c.p.mode = KVMEM_RETRIEVE_EXACT;
                    c.r = re;
                    rb_retrieve(&c);
                    rec[m] += recall(ra, re) / n_rq;
                }
            }
            /* gather 64 blocks into f16 K and V */
            const int32_t gn = (int32_t)KVM_MIN((int64_t)64, nb);
            int32_t gblocks[64];
            for (int32_t i = 0; i < gn; i++) gblocks[i] = (int32_t)((int64_t)i * nb / gn);
            size_t gel = (size_t)gn * (size_t)BS * tok_elems;
            uint16_t *gk = malloc(gel * 2), *gv = malloc(gel * 2);
            rb_gather g = {ag, gblocks, gn, {0}, {0}, 0};
            int64_t gs[4] = {L, (int64_t)gn * BS, H, D};
            kvmem_tensor_init(&g.k, gk, KVMEM_F16, 4, gs);
            kvmem_tensor_init(&g.v, gv, KVMEM_F16, 4, gs);
            double t_g = gk && gv ? kvm_time_median(rb_gather_once, &g, 1, quick ? 3 : 7) : NAN;
            /* host <-> device bytes of one decode retrieval (1 query token)
             * and of one gather, after the timed (warm) calls */
            uint64_t xf[8] = {0};
            qs[0] = 1;
            kvmem_tensor_init(&c.q, q, KVMEM_F32, 4, qs);
            c.p.norm = KVMEM_NORM_SOFTMAX;
            c.p.agg = KVMEM_AGG_MAX;
            c.p.mode = KVMEM_RETRIEVE_AABB;
            c.r = ra;
            kvmem_context_transfer_stats(pool->ctx, &xf[0], &xf[1]);
            rb_retrieve(&c);
            kvmem_context_transfer_stats(pool->ctx, &xf[2], &xf[3]);
            if (gk && gv) rb_gather_once(&g);
            kvmem_context_transfer_stats(pool->ctx, &xf[4], &xf[5]);
            free(gk);
            free(gv);
            if (c.failed || g.failed) {
                fprintf(stderr, "retrieval bench: %s\n", kvmem_last_error());
                rc = 1;
                break;
            }
            double dec_gbps = aabb_bytes / t_dec / 1e9, pre_gflops = pre_flops / t_pre / 1e9;
            double g_gbps = 2.0 * 2.0 * (double)gel * 2.0 / t_g / 1e9; /* K+V, read f16 + write f16 */
            if (o->json) {
                kvm_json_begin(o->out, "retrieval");
                if (on_device) kvm_json_str(o->out, "backend", be_name);
                kvm_json_str(o->out, "model", spec.model_id);
                kvm_json_int(o->out, "layers", L);
                kvm_json_int(o->out, "q_heads", NQ);
                kvm_json_int(o->out, "kv_heads", H);
                kvm_json_int(o->out, "head_dim", D);
                kvm_json_int(o->out, "block_size", BS);
                kvm_json_int(o->out, "tokens", (long long)T);
                kvm_json_int(o->out, "blocks", (long long)nb);
                kvm_json_int(o->out, "threads", threads);
                kvm_json_int(o->out, "top_k", top_k);
                kvm_json_str(o->out, "kernels", kvm_cpu_kernels_get()->name);
                kvm_json_num(o->out, "read_bw_gbps", read_bw);
                kvm_json_num(o->out, "read_bw_threads_gbps", read_bw_t);
                kvm_json_num(o->out, "read_bw_same_bytes_gbps", read_bw_same);
                kvm_json_num(o->out, "memcpy_gbps", memcpy_bw);
                kvm_json_num(o->out, "peak_gflops", peak);
                kvm_json_str(o->out, "aabb_dtype", kvm_aabb_esize(pool) == 2 ? "f16" : "f32");
                kvm_json_num(o->out, "aabb_bytes", aabb_bytes);
                kvm_json_num(o->out, "aabb_ms", t_dec * 1e3);
                kvm_json_num(o->out, "aabb_decode_gbps", dec_gbps);
                kvm_json_num(o->out, "aabb_decode_ratio", dec_gbps / read_bw);
                kvm_json_num(o->out, "aabb_decode_ratio_threads", dec_gbps / read_bw_t);
                kvm_json_num(o->out, "aabb_decode_ratio_same_bytes", dec_gbps / read_bw_same);
                if (th == 1) kvm_json_num(o->out, "speedup_vs_1_thread", t_dec_one / t_dec);
                kvm_json_int(o->out, "prefill_tokens", n_prefill);
                kvm_json_num(o->out, "aabb_prefill_ms", t_pre * 1e3);
                kvm_json_num(o->out, "aabb_prefill_gflops", pre_gflops);
                kvm_json_num(o->out, "aabb_prefill_ratio", pre_gflops / (peak * threads));
                kvm_json_num(o->out, "exact_ms", t_exact * 1e3);
                kvm_json_num(o->out, "speedup_vs_exact", t_exact / t_dec);
                kvm_json_num(o->out, "recall_at_k_softmax_max", rec[0]);
                kvm_json_num(o->out, "recall_at_k_softmax_sum", rec[1]);
                kvm_json_num(o->out, "recall_at_k_rr_max", rec[2]);
                kvm_json_num(o->out, "recall_at_k_rr_sum", rec[3]);
                kvm_json_num(o->out, "gather_ms", t_g * 1e3);
                kvm_json_num(o->out, "gather_gbps", g_gbps);
                if (on_device) {
                    kvm_json_int(o->out, "h2d_bytes", (long long)(xf[2] - xf[0])); /* one decode retrieval */
                    kvm_json_int(o->out, "d2h_bytes", (long long)(xf[3] - xf[1]));
                    kvm_json_int(o->out, "gather_h2d_bytes", (long long)(xf[4] - xf[2])); /* one gather */
                    kvm_json_int(o->out, "gather_d2h_bytes", (long long)(xf[5] - xf[3]));
                }
                kvm_json_end(o->out);
            } else {
                if (on_device) fprintf(o->out, "[backend %s] ", be_name);
                fprintf(o->out,
                        "retrieval %6lld tokens %d thr: decode %.2f ms (%.1f GB/s, %.2f x read bw), prefill %.1f ms (%.1f GFLOP/s, "
                        "%.2f x peak), exact %.1f ms (x%.1f), recall@%d %.2f/%.2f/%.2f/%.2f, gather %.2f ms (%.1f GB/s)\n",
                        (long long)T, threads, t_dec * 1e3, dec_gbps, dec_gbps / read_bw, t_pre * 1e3, pre_gflops,
                        pre_gflops / (peak * threads), t_exact * 1e3, t_exact / t_dec, top_k, rec[0], rec[1], rec[2], rec[3],
                        t_g * 1e3, g_gbps);
            }
        }
        if (!rc && si == 0) { /* layouts, on one thread (the CPU clock: see bench/limits_cpu.c) */
            pool->ctx = ctx_one;
            lay_ctx lc = {o, pool, ag, T, aabb_bytes, kvm_measure_read_bw_gbps_cpu(big, 3), quick ? 3 : 15};
            kvm_synth_tokens(&syn, topics[0], chunk, &rng, k, v);
            kvm_synth_query(&syn, topics[kvm_synth_next(&rng) % (uint64_t)n_chunks], n_prefill, &rng, q);
            const int32_t gn = (int32_t)KVM_MIN((int64_t)32, nb);
            int32_t gblocks[32];
            int64_t gm = 0;
            for (int32_t i = 0; i < gn; i++) {
                gblocks[i] = (int32_t)((int64_t)i * nb / gn);
                gm += BS;
            }
            static const kvmem_dtype dts[3] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16};
            for (int d = 0; d < 3 && !rc; d++) {
                rc = lay_append(&lc, dts[d], k, v, chunk) || lay_retrieve(&lc, dts[d], q, 1, top_k) ||
                     lay_retrieve(&lc, dts[d], q, n_prefill, top_k) || lay_gather(&lc, dts[d], gblocks, gn, gm);
            }
            if (rc) fprintf(stderr, "retrieval bench (layout): %s\n", kvmem_last_error());
        }
        pool->ctx = ctx_all;
        kvmem_retrieval_free(ra);
        kvmem_retrieval_free(re);
        free(topics);
        kvmem_agent_close(ag);
        kvmem_pool_free(pool);
    }
    /* a device backend: one decode step's transfers at two history sizes */
    for (int i = 0; on_device && !rc && i < 2; i++)
        rc = decode_step_line(o, ctx_all, &spec, &syn, (int64_t)(quick ? 512 : 1024) << (2 * i), top_k);
    free(k);
    free(v);
    free(q);
    kvm_synth_free(&syn);
    kvmem_context_free(ctx_one);
    kvmem_context_free(ctx_all);
    return rc;
}

const kvm_bench_suite kvm_bench_retrieval = {
    "retrieval", "AABB block scoring vs EXACT (decode/prefill), recall, gather; Llama-3.1-8B geometry", run_retrieval};

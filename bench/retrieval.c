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
 *   gather_ms, gather_gbps    kvmem_gather of 64 blocks to f16 (bytes read + written per second) */
#include "bench.h"
#include "kvmem.h"
#include "cpu/kernels.h"
#include "pool/pool.h"
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
     * kernels when it has them (core/retrieve/dev_route.c); EXACT scoring,
     * top-k and the agent's data stay on the host. */
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
        pool->ctx = ctx_all;
        kvmem_retrieval_free(ra);
        kvmem_retrieval_free(re);
        free(topics);
        kvmem_agent_close(ag);
        kvmem_pool_free(pool);
    }
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

/* Suite "webref": the workload of the browser benchmark (wasm/demo/bench.js,
 * run by `make test-web` in headless Chromium), natively and single-thread,
 * so BENCHMARKS.md can put the WebAssembly build beside the native one on
 * the same data: the demo model (8 layers, 8/2 heads, head_dim 64, block
 * size 16, f16 storage), 8192 tokens appended in 256-token turns (topic =
 * turn % 9, synth/synth.c, seed 42), retrieval of the top 16 blocks
 * (SOFTMAX-MAX, GLOBAL) for 1 query token (decode) and 32 (prefill), AABB
 * and EXACT. The browser side times the JavaScript API (agent.retrieve into
 * a reused Retrieval), which adds the query copy to the C call.
 *
 * Keys: tokens, blocks, threads (1), read_bw_gbps (this machine, measured in
 *   the run), aabb_decode_ms, aabb_prefill_ms, exact_decode_ms (medians). */
#include "bench.h"
#include "demo_script.h"
#include "kvmem.h"
#include "synth.h"

#include <stdlib.h>

typedef struct wr_call {
    kvmem_agent *ag;
    kvmem_tensor q;
    kvmem_retrieve_params p;
    kvmem_retrieval *r;
    int failed;
} wr_call;

static void wr_retrieve(void *arg) {
    wr_call *c = arg;
    if (kvmem_retrieve(c->ag, &c->q, &c->p, c->r) != KVMEM_OK) c->failed = 1;
}

static int run_webref(const kvm_bench_opts *o) {
    const int T = o->quick ? 1024 : 8192, turn = 256, reps = o->quick ? 3 : 15;
    kvmem_model_spec spec = kvm_demo_spec();
    kvmem_context_params cp = kvmem_context_default_params();
    cp.n_threads = 1;
    kvmem_context *ctx = NULL;
    kvmem_pool *pool = NULL;
    kvmem_agent *ag = NULL;
    kvmem_retrieval *r = NULL;
    kvm_synth syn;
    int syn_ok = 0, rc = 1;
    const size_t row = (size_t)spec.n_layers * (size_t)spec.n_kv_heads * (size_t)spec.head_dim;
    const size_t qrow = (size_t)spec.n_layers * (size_t)spec.n_q_heads * (size_t)spec.head_dim;
    float *k = malloc(row * (size_t)turn * sizeof(float)), *v = malloc(row * (size_t)turn * sizeof(float));
    float *q = malloc(qrow * 32 * sizeof(float));
    if (!k || !v || !q || kvmem_context_create(&cp, &ctx) != KVMEM_OK ||
        kvmem_pool_create(ctx, &spec, NULL, &pool) != KVMEM_OK || kvmem_agent_open(pool, "bench", &ag) != KVMEM_OK ||
        kvmem_retrieval_create(&r) != KVMEM_OK || !(syn_ok = kvm_synth_init(&syn, &spec, KVM_DEMO_TOPICS, 42)))
        goto done;
    uint64_t rng = 42 ^ 0x5eedull;
    for (int c = 0; c < T / turn; c++) {
        kvm_synth_tokens(&syn, c % KVM_DEMO_TOPICS, turn, &rng, k, v);
        int64_t shape[4] = {spec.n_layers, turn, spec.n_kv_heads, spec.head_dim};
        kvmem_tensor kt, vt;
        kvmem_tensor_init(&kt, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&vt, v, KVMEM_F32, 4, shape);
        if (kvmem_agent_append(ag, &kt, &vt, NULL) != KVMEM_OK) goto done;
    }
    kvmem_agent_info ai;
    kvmem_agent_get_info(ag, &ai);
    kvm_synth_query(&syn, 3, 32, &rng, q);
    wr_call c = {ag, {0}, kvmem_retrieve_default_params(), r, 0};
    c.p.top_k = 16;
    double ms[3];
    for (int i = 0; i < 3; i++) {
        int nq = i == 1 ? 32 : 1;
        int64_t qs[4] = {nq, spec.n_layers, spec.n_q_heads, spec.head_dim};
        kvmem_tensor_init(&c.q, q, KVMEM_F32, 4, qs);
        c.p.mode = i == 2 ? KVMEM_RETRIEVE_EXACT : KVMEM_RETRIEVE_AABB;
        ms[i] = 1e3 * kvm_time_median(wr_retrieve, &c, 3, reps);
    }
    if (c.failed) goto done;
    double bw = kvm_measure_read_bw_gbps((size_t)64 << 20);
    if (o->json) {
        kvm_json_begin(o->out, "webref");
        kvm_json_str(o->out, "model", spec.model_id);
        kvm_json_int(o->out, "tokens", (long long)ai.n_tokens);
        kvm_json_int(o->out, "blocks", ai.n_sealed);
        kvm_json_int(o->out, "threads", 1);
        kvm_json_num(o->out, "read_bw_gbps", bw);
        kvm_json_num(o->out, "aabb_decode_ms", ms[0]);
        kvm_json_num(o->out, "aabb_prefill_ms", ms[1]);
        kvm_json_num(o->out, "exact_decode_ms", ms[2]);
        kvm_json_end(o->out);
    } else {
        fprintf(o->out, "webref %lld tokens (%d blocks), 1 thread: AABB decode %.3f ms, prefill (32) %.3f ms, EXACT decode %.3f ms\n",
                (long long)ai.n_tokens, ai.n_sealed, ms[0], ms[1], ms[2]);
    }
    rc = 0;
done:
    kvmem_retrieval_free(r);
    kvmem_agent_close(ag);
    if (syn_ok) kvm_synth_free(&syn);
    kvmem_pool_free(pool);
    kvmem_context_free(ctx);
    free(k);
    free(v);
    free(q);
    return rc;
}

const kvm_bench_suite kvm_bench_webref = {
    "webref", "the browser benchmark's retrieval workload (8k tokens, demo model), native, 1 thread", run_webref};

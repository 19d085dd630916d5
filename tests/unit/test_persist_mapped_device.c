/* An agent opened in place on a device context ("vulkan": lavapipe here,
 * any GPU elsewhere): retrieval (the device's AABB scoring), gather (the
 * device's RoPE gather, fed from the file) and attention give, bit for bit,
 * what the same file loaded into memory gives on the same context. Without
 * a usable Vulkan backend every test says "skipped: why". */
#include "testutil.h"
#include "context.h"
#include "backend/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_dir[256], g_why[300];
static kvmem_context *g_dev;

enum { L = 2, D = 64, H = 2, HQ = 4, BS = 16, NB = 24, T = BS * NB + 5 };

static int setup(void **state) {
    (void)state;
    if (tu_tmpdir_make(g_dir, sizeof g_dir, "mapdev") != 0) return -1;
    kvmem_context_params p = kvmem_context_default_params();
    p.backend = "vulkan";
    p.n_threads = 2;
    if (kvmem_context_create(&p, &g_dev) != KVMEM_OK) {
        snprintf(g_why, sizeof g_why, "vulkan: %s", kvmem_last_error());
        g_dev = NULL;
    } else if (!g_dev->backend->iface->dev_gather_rope || !g_dev->backend->iface->dev_score) {
        snprintf(g_why, sizeof g_why, "vulkan backend has no dev_gather_rope or dev_score entry");
        kvmem_context_free(g_dev);
        g_dev = NULL;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    kvmem_context_free(g_dev);
    return tu_tmpdir_remove(g_dir);
}

static kvmem_pool *make_pool(kvmem_dtype dt, uint64_t cap) {
    kvmem_model_spec spec = tu_spec(L, D);
    kvmem_pool_params pp = kvmem_pool_default_params();
    pp.storage_dtype = dt;
    pp.block_size = BS;
    pp.capacity_bytes = cap;
    kvmem_pool *p = NULL;
    assert_ok(kvmem_pool_create(g_dev, &spec, &pp, &p));
    return p;
}

typedef struct outs {
    int32_t blocks[8];
    float scores[8];
    int32_t n;
    float gk[L * 8 * BS * H * D], gv[L * 8 * BS * H * D];
    float att[HQ * D];
} outs;

static void run(kvmem_agent *a, const float *q, outs *o) {
    memset(o, 0, sizeof *o);
    kvmem_tensor tq;
    int64_t qs[4] = {1, L, HQ, D};
    assert_ok(kvmem_tensor_init(&tq, (void *)(uintptr_t)q, KVMEM_F32, 4, qs));
    kvmem_retrieval *r;
    assert_ok(kvmem_retrieval_create(&r));
    kvmem_retrieve_params rp = kvmem_retrieve_default_params();
    rp.top_k = 6;
    assert_ok(kvmem_retrieve(a, &tq, &rp, r));
    assert_ok(kvmem_retrieval_copy(r, 0, o->blocks, o->scores, 8, &o->n));
    assert_int_equal(o->n, 6);
    kvmem_retrieval_free(r);
    kvmem_tensor gk, gv;
    int64_t gs[4] = {L, (int64_t)o->n * BS, H, D};
    assert_ok(kvmem_tensor_init(&gk, o->gk, KVMEM_F32, 4, gs));
    assert_ok(kvmem_tensor_init(&gv, o->gv, KVMEM_F32, 4, gs));
    assert_ok(kvmem_gather(a, o->blocks, o->n, 3, &gk, &gv));
    kvmem_tensor aq, ao;
    int64_t as[3] = {1, HQ, D};
    assert_ok(kvmem_tensor_init(&aq, (void *)(uintptr_t)q, KVMEM_F32, 3, as));
    assert_ok(kvmem_tensor_init(&ao, o->att, KVMEM_F32, 3, as));
    kvmem_attend_source src;
    memset(&src, 0, sizeof src);
    src.kind = KVMEM_ATTEND_SRC_AGENT;
    src.agent = a;
    src.layer = 1;
    kvmem_attend_params ap = kvmem_attend_default_params();
    assert_ok(kvmem_attend(g_dev, &aq, &src, &ap, &ao, NULL));
}

static void mapped_agent_on_a_device_equals_the_loaded_agent(void **state) {
    (void)state;
    if (!g_dev) {
        print_message("skipped: %s\n", g_why);
        skip();
    }
    const kvmem_dtype dts[] = {KVMEM_F16, KVMEM_Q4};
    size_t n = (size_t)L * T * H * D;
    float *k = malloc(n * 4), *v = malloc(n * 4), q[L * HQ * D];
    outs *ol = malloc(sizeof *ol), *om = malloc(sizeof *om);
    uint64_t seed = 3;
    for (size_t i = 0; i < sizeof q / sizeof *q; i++) q[i] = tu_normal(&seed);
    for (size_t di = 0; di < 2; di++) {
        tu_fill_kv(k, n, &seed);
        tu_fill_kv(v, n, &seed);
        char path[300];
        snprintf(path, sizeof path, "%s/d%zu.safetensors", g_dir, di);
        kvmem_pool *pl = make_pool(dts[di], 0);
        kvmem_agent *la, *ma;
        assert_ok(kvmem_agent_open(pl, "a", &la));
        kvmem_tensor tk, tv;
        int64_t shape[4] = {L, T, H, D};
        assert_ok(kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape));
        assert_ok(kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape));
        assert_ok(kvmem_agent_append(la, &tk, &tv, NULL));
        assert_ok(kvmem_agent_save(la, path));
        assert_ok(kvmem_agent_load(la, path)); /* the reference decodes what the file holds */
        kvmem_pool *pm = make_pool(dts[di], 0);
        assert_ok(kvmem_agent_open_file(pm, path, 0, &ma));
        run(la, q, ol);
        run(ma, q, om);
        assert_int_equal(ol->n, om->n);
        assert_memory_equal(ol->blocks, om->blocks, sizeof ol->blocks);
        assert_memory_equal(ol->scores, om->scores, sizeof ol->scores);
        assert_memory_equal(ol->gk, om->gk, sizeof ol->gk);
        assert_memory_equal(ol->gv, om->gv, sizeof ol->gv);
        assert_memory_equal(ol->att, om->att, sizeof ol->att);
        kvmem_agent_close(la);
        kvmem_agent_close(ma);
        kvmem_pool_free(pl);
        kvmem_pool_free(pm);
    }
    free(k), free(v), free(ol), free(om);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mapped_agent_on_a_device_equals_the_loaded_agent),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

/* Writes agent files in every storage dtype with KV given by a closed-form
 * formula, for the independent Python reader (st_reader.py) to check. */
#include <kvmem.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define L 2
#define H 2
#define T 21

static float kval(int which, int l, int t, int h, int d) {
    double x = 0.1 * (l * 1000 + t * 37 + h * 11 + d);
    return (float)(which ? cos(x) * 1.5 : sin(x) * 2.0 + 0.01 * d);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    kvmem_context *ctx;
    if (kvmem_context_create(NULL, &ctx) != KVMEM_OK) return 1;
    const kvmem_dtype dts[] = {KVMEM_F32, KVMEM_F16, KVMEM_BF16, KVMEM_Q8, KVMEM_Q4, KVMEM_Q4_KIVI};
    const char *text = "r\xc3\xa9sum\xc3\xa9 of a \"quoted\"\ttext\n with \xe2\x82\xac and more words here";
    for (int i = 0; i < 6; i++) {
        int D = i % 2 ? 80 : 128; /* 80: partial groups */
        kvmem_model_spec spec = kvmem_model_spec_default();
        spec.n_layers = L;
        spec.n_q_heads = 4;
        spec.n_kv_heads = H;
        spec.head_dim = D;
        snprintf(spec.model_id, sizeof spec.model_id, "py-check-%d", D);
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.storage_dtype = dts[i];
        pp.block_size = 8;
        kvmem_pool *pool;
        kvmem_agent *a;
        if (kvmem_pool_create(ctx, &spec, &pp, &pool) != KVMEM_OK) return 1;
        char id[64];
        snprintf(id, sizeof id, "py-%s", kvmem_dtype_name(dts[i]));
        if (kvmem_agent_open(pool, id, &a) != KVMEM_OK) return 1;
        size_t n = (size_t)L * T * H * (size_t)D;
        float *k = malloc(n * 4), *v = malloc(n * 4);
        for (int l = 0; l < L; l++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++)
                    for (int d = 0; d < D; d++) {
                        size_t at = (((size_t)l * T + (size_t)t) * H + (size_t)h) * (size_t)D + (size_t)d;
                        k[at] = kval(0, l, t, h, d);
                        v[at] = kval(1, l, t, h, d);
                    }
        int32_t ids[T], offs[T];
        size_t tl = strlen(text);
        for (int t = 0; t < T; t++) ids[t] = 500 + t * 3, offs[t] = (int32_t)((size_t)t * 2);
        offs[T - 1] = -1; /* an unknown offset is written as -1 */
        (void)tl;
        kvmem_tensor tk, tv;
        int64_t shape[4] = {L, T, H, D};
        kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
        kvmem_tensor_init(&tv, v, KVMEM_F32, 4, shape);
        kvmem_append_params ap = kvmem_append_default_params();
        ap.token_ids = ids;
        ap.text = text;
        ap.text_len = strlen(text);
        ap.token_text_offsets = NULL;
        if (kvmem_agent_append(a, &tk, &tv, &ap) != KVMEM_OK) {
            fprintf(stderr, "append: %s\n", kvmem_last_error());
            return 1;
        }
        char path[512];
        snprintf(path, sizeof path, "%s/%s.safetensors", argv[1], id);
        if (kvmem_agent_save(a, path) != KVMEM_OK) {
            fprintf(stderr, "save: %s\n", kvmem_last_error());
            return 1;
        }
        free(k);
        free(v);
        kvmem_agent_close(a);
        kvmem_pool_free(pool);
    }
    kvmem_context_free(ctx);
    return 0;
}

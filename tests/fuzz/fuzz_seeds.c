/* Writes the fuzz seed corpus: valid agent files (F16, Q4, Q8; empty, tail
 * only, sealed blocks plus a tail, flushed short blocks, odd text) prefixed
 * with the target byte (each for its loader and for the safetensors reader
 * alone), and a few JSON documents. */
#include "fuzz_common.h"

#include <stdlib.h>
#include <string.h>

static int write_seed(const char *dir, const char *name, int target, const char *src) {
    char out[1024];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    FILE *in = src ? fopen(src, "rb") : NULL, *o = fopen(out, "wb");
    if ((src && !in) || !o) return 1;
    fputc(target, o);
    int c;
    while (in && (c = fgetc(in)) != EOF) fputc(c, o);
    if (in) fclose(in);
    fclose(o);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *dir = argv[1];
    kvmem_context *ctx;
    if (kvmem_context_create(NULL, &ctx) != KVMEM_OK) return 1;
    kvmem_model_spec spec = kvm_fuzz_spec();
    const int Ts[4] = {0, 3, 9, 13};
    int rc = 0;
    for (int d = 0; d < 3; d++)
        for (int v = 0; v < 4; v++) {
            kvmem_pool_params pp = kvm_fuzz_params(d);
            kvmem_pool *pool;
            kvmem_agent *a;
            if (kvmem_pool_create(ctx, &spec, &pp, &pool) != KVMEM_OK || kvmem_agent_open(pool, "seed", &a) != KVMEM_OK) return 1;
            int T = Ts[v];
            size_t n = (size_t)2 * (size_t)T * 80 + 1;
            float *k = malloc(n * 4), *vv = malloc(n * 4);
            for (size_t i = 0; i < n; i++) k[i] = (float)((int)(i * 37 % 200) - 100) / 13.0f, vv[i] = -k[i] / 2;
            int32_t offs[16], ids[16];
            const char *text = v == 3 ? "\xff\xfe not utf-8 \x01" : "seed text with \"quotes\" and \xc3\xa9";
            for (int t = 0; t < T; t++) offs[t] = t, ids[t] = t * 7 - 3;
            kvmem_tensor tk, tv;
            int64_t shape[4] = {2, T, 1, 80};
            kvmem_tensor_init(&tk, k, KVMEM_F32, 4, shape);
            kvmem_tensor_init(&tv, vv, KVMEM_F32, 4, shape);
            kvmem_append_params ap = kvmem_append_default_params();
            ap.token_ids = ids;
            ap.text = text;
            ap.text_len = strlen(text);
            ap.token_text_offsets = v == 2 ? NULL : offs;
            if (T && kvmem_agent_append(a, &tk, &tv, &ap) != KVMEM_OK) return 1;
            if (v == 2) kvmem_agent_flush(a);
            char path[1024], name[64];
            snprintf(path, sizeof path, "%s/tmp.safetensors", dir);
            if (kvmem_agent_save(a, path) != KVMEM_OK) return 1;
            snprintf(name, sizeof name, "agent_%s_%d", kvmem_dtype_name(pp.storage_dtype), T);
            rc |= write_seed(dir, name, d + 1, path);
            snprintf(name, sizeof name, "reader_%s_%d", kvmem_dtype_name(pp.storage_dtype), T);
            rc |= write_seed(dir, name, v & 1 ? 9 : 4, path); /* the reader alone (9: names quoted) */
            remove(path);
            free(k);
            free(vv);
            kvmem_agent_close(a);
            kvmem_pool_free(pool);
        }
    const char *js[] = {"{\"a\":[1,2.5e3,-0,true,false,null],\"b\":{\"c\":\"\\u00e9\\ud83d\\ude00\"}}", "[]", "\"x\""};
    for (int i = 0; i < 3; i++) {
        char name[32], path[1024];
        snprintf(name, sizeof name, "json_%d", i);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *o = fopen(path, "wb");
        if (!o) return 1;
        fputc(0, o);
        fputs(js[i], o);
        fclose(o);
    }
    kvmem_context_free(ctx);
    return rc;
}

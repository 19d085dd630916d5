/* kvmem inspect FILE [--json]: what an agent file holds (spec, dtype,
 * blocks, tensors, sizes, tokens, a text preview), whether its checksum
 * matches, and whether kvmem's strict loader accepts it (by loading it into a
 * pool built from the file's own spec). */
#include "commands.h"
#include "kvmem.h"
#include "store/hash.h"
#include "store/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *meta_get(const kvm_json_doc *d, const kvm_json *meta, const char *key) {
    const kvm_json *v = kvm_json_get(d, meta, key);
    return v && v->type == KVM_JSON_STRING ? v->str : NULL;
}

/* Build a spec from the file's canonical "key=value;..." string. */
static int spec_from(const char *s, kvmem_model_spec *spec, int32_t *window, int32_t max_layers) {
    *spec = kvmem_model_spec_default();
    char *copy = strdup(s);
    if (!copy) return 0;
    int ok = 1;
    for (char *save = NULL, *kv = strtok_r(copy, ";", &save); kv; kv = strtok_r(NULL, ";", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            ok = 0;
            break;
        }
        *eq = '\0';
        const char *k = kv, *v = eq + 1;
        if (!strcmp(k, "n_layers")) spec->n_layers = atoi(v);
        else if (!strcmp(k, "n_q_heads")) spec->n_q_heads = atoi(v);
        else if (!strcmp(k, "n_kv_heads")) spec->n_kv_heads = atoi(v);
        else if (!strcmp(k, "head_dim")) spec->head_dim = atoi(v);
        else if (!strcmp(k, "rotary_dim")) spec->rotary_dim = atoi(v);
        else if (!strcmp(k, "rope_style")) spec->rope_style = (kvmem_rope_style)atoi(v);
        else if (!strcmp(k, "rope_theta")) spec->rope_theta = strtod(v, NULL);
        else if (!strcmp(k, "rope_scaling")) spec->rope_scaling = (kvmem_rope_scaling)atoi(v);
        else if (!strcmp(k, "rope_factor")) spec->rope_factor = strtod(v, NULL);
        else if (!strcmp(k, "rope_low_freq_factor")) spec->rope_low_freq_factor = strtod(v, NULL);
        else if (!strcmp(k, "rope_high_freq_factor")) spec->rope_high_freq_factor = strtod(v, NULL);
        else if (!strcmp(k, "rope_original_max_pos")) spec->rope_original_max_pos = atoi(v);
        else if (!strcmp(k, "yarn_beta_fast")) spec->yarn_beta_fast = strtod(v, NULL);
        else if (!strcmp(k, "yarn_beta_slow")) spec->yarn_beta_slow = strtod(v, NULL);
        else if (!strcmp(k, "yarn_attn_factor")) spec->yarn_attn_factor = strtod(v, NULL);
        else if (!strcmp(k, "layer_window")) {
            int32_t n = 0, any = 0;
            for (const char *c = v; *c && n < max_layers; n++) {
                window[n] = (int32_t)strtol(c, NULL, 10);
                any |= window[n] != 0;
                c = strchr(c, ',');
                if (!c) {
                    n++;
                    break;
                }
                c++;
            }
            spec->layer_window = any ? window : NULL;
        }
    }
    free(copy);
    return ok && spec->n_layers >= 1 && spec->n_layers <= max_layers;
}

static void json_escape(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = 1;
        else if (!path) path = argv[i];
        else path = NULL, i = argc;
    }
    if (!path) {
        fprintf(stderr, "usage: kvmem inspect FILE [--json]\n");
        return 2;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "kvmem inspect: cannot open '%s': %s\n", path, strerror(errno));
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *blob = sz > 0 ? malloc((size_t)sz) : NULL;
    if (!blob || fread(blob, 1, (size_t)sz, fp) != (size_t)sz) {
        fclose(fp);
        free(blob);
        fprintf(stderr, "kvmem inspect: cannot read '%s'\n", path);
        return 1;
    }
    fclose(fp);
    uint64_t hl = 0;
    if (sz >= 8)
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | blob[i];
    kvm_json_doc doc;
    char err[256];
    if (sz < 8 || hl > (uint64_t)sz - 8 || kvm_json_parse((const char *)blob + 8, (size_t)hl, &doc, err, sizeof err) != 0) {
        fprintf(stderr, "kvmem inspect: '%s' is not a readable safetensors file%s%s\n", path, sz >= 8 && hl <= (uint64_t)sz - 8 ? ": " : "",
                sz >= 8 && hl <= (uint64_t)sz - 8 ? err : "");
        free(blob);
        return 1;
    }
    const kvm_json *root = &doc.nodes[0];
    const kvm_json *meta = kvm_json_get(&doc, root, "__metadata__");
    const char *fmt = meta_get(&doc, meta, "format"), *ver = meta_get(&doc, meta, "format_version");
    const char *id = meta_get(&doc, meta, "agent_id"), *model = meta_get(&doc, meta, "model_id");
    const char *specs = meta_get(&doc, meta, "model_spec"), *dt = meta_get(&doc, meta, "storage_dtype");
    const char *bs = meta_get(&doc, meta, "block_size"), *nt = meta_get(&doc, meta, "n_tokens");
    const char *blocks = meta_get(&doc, meta, "block_tokens"), *sum = meta_get(&doc, meta, "checksum");
    const kvm_json *textv = kvm_json_get(&doc, meta, "text");
    uint64_t data = (uint64_t)sz - 8 - hl;
    char computed[32];
    { /* the file's checksum rule, computed here independently of the loader */
        kvm_xxh64_state h;
        kvm_xxh64_init(&h, 0);
        for (uint64_t c = 0; c < data; c += (uint64_t)1 << 20) {
            uint64_t d = kvm_acc64(blob + 8 + hl + c, (size_t)(data - c < ((uint64_t)1 << 20) ? data - c : ((uint64_t)1 << 20)));
            unsigned char le[8];
            for (int b = 0; b < 8; b++) le[b] = (unsigned char)(d >> (8 * b));
            kvm_xxh64_update(&h, le, 8);
        }
        snprintf(computed, sizeof computed, "acc64-1m:%016" PRIx64, kvm_xxh64_final(&h));
    }
    int sum_ok = sum && !strcmp(sum, computed);
    int n_blocks = blocks && *blocks ? 1 : 0;
    for (const char *c = blocks ? blocks : ""; *c; c++) n_blocks += *c == ',';

    /* full validation: load into a pool made from the file's own spec */
    kvmem_status vst = KVMEM_ERR_FORMAT;
    char vmsg[512] = "not a kvmem agent file";
    int32_t window[4096];
    kvmem_model_spec spec;
    if (fmt && specs && dt && bs && id && model && spec_from(specs, &spec, window, 4096)) {
        snprintf(spec.model_id, sizeof spec.model_id, "%s", model);
        kvmem_context *ctx = NULL;
        kvmem_pool *pool = NULL;
        kvmem_agent *a = NULL;
        kvmem_pool_params pp = kvmem_pool_default_params();
        pp.block_size = atoi(bs);
        for (int d = 0; d <= 5; d++)
            if (!strcmp(kvmem_dtype_name((kvmem_dtype)d), dt)) pp.storage_dtype = (kvmem_dtype)d;
        if ((vst = kvmem_context_create(NULL, &ctx)) == KVMEM_OK && (vst = kvmem_pool_create(ctx, &spec, &pp, &pool)) == KVMEM_OK &&
            (vst = kvmem_agent_open(pool, id, &a)) == KVMEM_OK)
            vst = kvmem_agent_load(a, path);
        snprintf(vmsg, sizeof vmsg, "%s", vst == KVMEM_OK ? "ok" : kvmem_last_error());
        kvmem_agent_close(a);
        kvmem_pool_free(pool);
        kvmem_context_free(ctx);
    }
    size_t preview = textv ? (textv->len < 160 ? textv->len : 160) : 0;
    if (json) {
        printf("{\"file\":");
        json_escape(stdout, path, strlen(path));
        printf(",\"bytes\":%ld,\"header_bytes\":%" PRIu64 ",\"data_bytes\":%" PRIu64, sz, hl, data);
        const char *keys[] = {"format", "format_version", "agent_id", "model_id", "model_spec", "storage_dtype", "block_size", "n_tokens", "checksum"};
        const char *vals[] = {fmt, ver, id, model, specs, dt, bs, nt, sum};
        for (int i = 0; i < 9; i++) {
            printf(",\"%s\":", keys[i]);
            if (vals[i]) json_escape(stdout, vals[i], strlen(vals[i]));
            else printf("null");
        }
        printf(",\"n_blocks\":%d,\"checksum_ok\":%s,\"valid\":%s,\"validation\":", n_blocks, sum_ok ? "true" : "false",
               vst == KVMEM_OK ? "true" : "false");
        json_escape(stdout, vmsg, strlen(vmsg));
        printf(",\"text_preview\":");
        if (textv) json_escape(stdout, textv->str, preview);
        else printf("null");
        printf(",\"tensors\":[");
        int first = 1;
        for (const kvm_json *c = kvm_json_child(&doc, root); c; c = kvm_json_next(&doc, c)) {
            if (c == meta) continue;
            const kvm_json *tdt = kvm_json_get(&doc, c, "dtype"), *sh = kvm_json_get(&doc, c, "shape"), *of = kvm_json_get(&doc, c, "data_offsets");
            printf("%s{\"name\":", first ? "" : ",");
            json_escape(stdout, c->key, c->key_len);
            printf(",\"dtype\":");
            if (tdt && tdt->type == KVM_JSON_STRING) json_escape(stdout, tdt->str, tdt->len);
            else printf("null");
            printf(",\"shape\":[");
            if (sh && sh->type == KVM_JSON_ARRAY)
                for (const kvm_json *e = kvm_json_child(&doc, sh); e; e = kvm_json_next(&doc, e))
                    printf("%s%lld", e == kvm_json_child(&doc, sh) ? "" : ",", (long long)e->i);
            long long nb = -1;
            if (of && of->type == KVM_JSON_ARRAY && of->n == 2) nb = kvm_json_next(&doc, kvm_json_child(&doc, of))->i - kvm_json_child(&doc, of)->i;
            printf("],\"bytes\":%lld}", nb);
            first = 0;
        }
        printf("]}\n");
    } else {
        printf("file:       %s (%ld bytes: header %" PRIu64 ", data %" PRIu64 ")\n", path, sz, hl, data);
        printf("format:     %s version %s\n", fmt ? fmt : "(none: not a kvmem agent file)", ver ? ver : "?");
        printf("agent:      %s\nmodel:      %s\nspec:       %s\n", id ? id : "?", model ? model : "?", specs ? specs : "?");
        printf("storage:    %s, block size %s, %s tokens, %d sealed blocks\n", dt ? dt : "?", bs ? bs : "?", nt ? nt : "?", n_blocks);
        printf("checksum:   %s (%s)\n", sum ? sum : "(none)", sum_ok ? "matches the data" : "MISMATCH");
        printf("validation: %s\n", vmsg);
        if (textv) {
            printf("text:       ");
            json_escape(stdout, textv->str, preview);
            printf("%s (%zu bytes)\n", textv->len > preview ? "..." : "", textv->len);
        }
        printf("tensors:\n");
        for (const kvm_json *c = kvm_json_child(&doc, root); c; c = kvm_json_next(&doc, c)) {
            if (c == meta) continue;
            const kvm_json *tdt = kvm_json_get(&doc, c, "dtype"), *sh = kvm_json_get(&doc, c, "shape");
            printf("  %-24.*s %-5s [", (int)c->key_len, c->key, tdt && tdt->type == KVM_JSON_STRING ? tdt->str : "?");
            if (sh && sh->type == KVM_JSON_ARRAY)
                for (const kvm_json *e = kvm_json_child(&doc, sh); e; e = kvm_json_next(&doc, e))
                    printf("%s%lld", e == kvm_json_child(&doc, sh) ? "" : ", ", (long long)e->i);
            printf("]\n");
        }
    }
    kvm_json_free(&doc);
    free(blob);
    return vst == KVMEM_OK ? 0 : 1;
}

const kvm_command kvm_cmd_inspect = {"inspect", "FILE [--json]: what an agent file holds, checksum and validation", cmd_inspect};

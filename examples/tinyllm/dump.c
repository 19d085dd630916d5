/* tinyllm-dump: the engine's full-context forward pass over given token ids,
 * as JSON, so another implementation of the same model (the PyTorch one in
 * examples/python/torch_agent.py) can be checked against it value by value.
 *
 *   tinyllm-dump MODEL ID [ID...]
 *
 * The ids run as one chunk at positions 0..n-1 on an empty cache. Prints
 *   {"vocab_size": V, "n_layers": L, "dim": d, "tokens": [...],
 *    "logits": [[V floats] per token],
 *    "q_raw": [[[d floats] per layer] per token]}
 * q_raw: each layer's queries before RoPE (what kvmem retrieval takes).
 * Floats are printed with 9 significant digits (exact for f32). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "tinyllm.h"

#define USAGE "usage: tinyllm-dump MODEL ID [ID...]   (token ids, run at positions 0..n-1)\n"

static void put_floats(const float *x, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf("%s%.9g", i ? "," : "", (double)x[i]);
    putchar(']');
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "tinyllm-dump: %s\n" USAGE, argc < 2 ? "MODEL is missing" : "no token ids given");
        return 2;
    }
    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(argv[1], &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm-dump: %s\n", err);
        return 1;
    }
    const tl_config *c = &m.cfg;
    int32_t n = argc - 2;
    int rc = 2;
    int32_t *ids = malloc((size_t)n * sizeof *ids), *pos = malloc((size_t)n * sizeof *pos);
    float *logits = malloc((size_t)n * (size_t)c->vocab_size * sizeof(float));
    float *q_raw = malloc((size_t)n * (size_t)c->n_layers * (size_t)c->dim * sizeof(float));
    tl_state *s = NULL;
    tl_kv kv;
    int have_kv = 0;
    if (n > c->seq_len) {
        fprintf(stderr, "tinyllm-dump: %d ids; the model's context is %d tokens\n", n, c->seq_len);
        goto out;
    }
    if (!ids || !pos || !logits || !q_raw) {
        fprintf(stderr, "tinyllm-dump: out of memory\n");
        rc = 1;
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        const char *a = argv[i + 2];
        char *end;
        errno = 0;
        long v = strtol(a, &end, 10);
        if (!*a || *end || errno || v < 0 || v >= c->vocab_size) {
            fprintf(stderr, "tinyllm-dump: '%s' is not a token id (0..%d)\n" USAGE, a, c->vocab_size - 1);
            goto out;
        }
        ids[i] = (int32_t)v;
        pos[i] = i;
    }
    rc = 1;
    s = tl_state_create(c, n);
    if (!s || tl_kv_init(&kv, c, n)) {
        fprintf(stderr, "tinyllm-dump: out of memory\n");
        goto out;
    }
    have_kv = 1;
    tl_trace tr = {0};
    tr.q_raw = q_raw;
    if (tl_forward(&m, s, &kv, ids, n, pos, logits, &tr, NULL, NULL)) {
        fprintf(stderr, "tinyllm-dump: the forward pass failed\n");
        goto out;
    }
    printf("{\"vocab_size\": %d, \"n_layers\": %d, \"dim\": %d, \"tokens\": [", c->vocab_size, c->n_layers, c->dim);
    for (int32_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\n\"logits\": [");
    for (int32_t i = 0; i < n; i++) {
        if (i) printf(",\n");
        put_floats(logits + (size_t)i * (size_t)c->vocab_size, (size_t)c->vocab_size);
    }
    printf("],\n\"q_raw\": [");
    for (int32_t i = 0; i < n; i++) {
        printf("%s[", i ? ",\n" : "");
        for (int32_t l = 0; l < c->n_layers; l++) {
            if (l) putchar(',');
            put_floats(q_raw + ((size_t)i * (size_t)c->n_layers + (size_t)l) * (size_t)c->dim, (size_t)c->dim);
        }
        putchar(']');
    }
    printf("]}\n");
    rc = fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
    if (rc) fprintf(stderr, "tinyllm-dump: cannot write the output\n");
out:
    if (have_kv) tl_kv_free(&kv);
    tl_state_free(s);
    free(ids);
    free(pos);
    free(logits);
    free(q_raw);
    tl_model_free(&m);
    return rc;
}

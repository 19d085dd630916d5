/* tinyllm: a tiny Llama engine on kvmem.
 *   tinyllm generate MODEL [-n N] [--seed S] [--temp T]   sample token ids
 *   tinyllm eval MODEL [--quick] [--json FILE] [--md FILE] the fidelity harness
 *   tinyllm demo MODEL [--state DIR] [--phase 1|2|all]     the end-to-end demo */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"

static int generate(int argc, char **argv) {
    if (argc < 1) {
        fprintf(stderr, "usage: tinyllm generate MODEL [-n N] [--seed S] [--temp T]\n");
        return 2;
    }
    int n = 64;
    uint64_t seed = 42;
    float temp = 1.0f;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--temp") && i + 1 < argc) temp = (float)atof(argv[++i]);
        else {
            fprintf(stderr, "tinyllm generate: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(argv[0], &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm: %s\n", err);
        return 1;
    }
    if (n < 1 || n > m.cfg.seq_len) n = m.cfg.seq_len;
    int32_t *toks = malloc((size_t)n * sizeof(int32_t));
    int rc = toks && tl_sample_sequence(&m, seed, temp, n, toks) == 0 ? 0 : 1;
    if (!rc) {
        for (int i = 0; i < n; i++) printf("%d%c", toks[i], i + 1 < n ? ' ' : '\n');
    } else {
        fprintf(stderr, "tinyllm: generation failed\n");
    }
    free(toks);
    tl_model_free(&m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "generate")) return generate(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "eval")) return tl_eval_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "demo")) return tl_demo_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "tour")) return tl_tour_main(argc - 2, argv + 2);
    fprintf(stderr,
            "usage: tinyllm generate MODEL [-n N] [--seed S] [--temp T]\n"
            "       tinyllm eval MODEL [--quick] [--seqs N] [--json FILE] [--md FILE]\n"
            "       tinyllm demo MODEL [--tokenizer FILE] [--state DIR] [--phase 1|2|all]\n"
            "       tinyllm tour MODEL [--state DIR] [--phase 1|2|all]\n"
            "MODEL: a llama2.c checkpoint or a GGUF file (llama, F32/F16)\n");
    return 2;
}

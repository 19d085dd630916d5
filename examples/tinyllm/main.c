/* tinyllm: a tiny Llama engine on kvmem.
 *   tinyllm generate MODEL [--prompt TEXT] [--tokenizer FILE] [-n N] [--seed S] [--temp T] [--ids]
 *   tinyllm tokenize MODEL [--tokenizer FILE] [--no-bos] [--decode] [TEXT]
 *   tinyllm eval MODEL [--quick] [--json FILE] [--md FILE]    the fidelity harness
 *   tinyllm demo MODEL [--state DIR] [--phase 1|2|all]       the end-to-end demo */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app.h"
#include "cli.h"

#define GENERATE_USAGE                                                                          \
    "usage: tinyllm generate MODEL [--prompt TEXT] [--tokenizer FILE] [-n N] [--seed S] "       \
    "[--temp T] [--ids] [--past-window]\n"                                                      \
    "  --past-window  let -n exceed the model's trained length (it attends past its window)\n"
#define TOKENIZE_USAGE "usage: tinyllm tokenize MODEL [--tokenizer FILE] [--no-bos] [--decode] [TEXT]\n"

/* The tokenizer for a model: the file given, else the vocabulary a GGUF
 * file carries, else tok512.bin beside the model. NULL with a message. */
static tl_tokenizer *open_tokenizer(const char *cmd, const tl_model *m, const char *model_path,
                                    const char *file) {
    char err[TL_ERR_SIZE], near[4096];
    tl_tokenizer *t = NULL;
    if (file) {
        if (tl_tokenizer_load(file, m->cfg.vocab_size, &t, err, sizeof err) == 0) return t;
        fprintf(stderr, "tinyllm %s: --tokenizer: %s\n", cmd, err);
        return NULL;
    }
    if (m->vocab && tl_tokenizer_from_model(m, &t, err, sizeof err) == 0) return t;
    const char *found = tl_find_tokenizer(model_path, near, sizeof near);
    if (!found) {
        fprintf(stderr, "tinyllm %s: no tokenizer: %s%sgive --tokenizer FILE (none found beside the "
                "model, tok512.bin, or in $KVMEM_TEST_TOKENIZER)%s\n", cmd,
                m->vocab_note[0] ? m->vocab_note : "", m->vocab_note[0] ? "; " : "",
                strcmp(cmd, "generate") == 0 ? ", or --ids for token ids" : "");
        return NULL;
    }
    if (tl_tokenizer_load(found, m->cfg.vocab_size, &t, err, sizeof err) == 0) return t;
    fprintf(stderr, "tinyllm %s: the tokenizer beside the model: %s\n", cmd, err);
    return NULL;
}

/* Write a piece as the model's bytes (pieces may be parts of a UTF-8 character). */
static void put_bytes(const char *p, size_t n) {
    if (n) fwrite(p, 1, n, stdout);
}

static int generate(int argc, char **argv) {
    static const struct option opts[] = {
        {"prompt", required_argument, NULL, 'p'}, {"tokenizer", required_argument, NULL, 'k'},
        {"seed", required_argument, NULL, 's'},   {"temp", required_argument, NULL, 't'},
        {"ids", no_argument, NULL, 'i'},          {"help", no_argument, NULL, 'h'},
        {"past-window", no_argument, NULL, 'w'},  {NULL, 0, NULL, 0}};
    const char *prompt = NULL, *tok_file = NULL;
    int past_window = 0;
    int64_t n = -1; /* default: 256 tokens of text, 64 ids */
    uint64_t seed = 42;
    float temp = 1.0f;
    int ids = 0, c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (tl_cli_int("generate", "-n", optarg, 1, 1 << 24, &n)) return 2;
            break;
        case 's':
            if (tl_cli_u64("generate", "--seed", optarg, &seed)) return 2;
            break;
        case 't':
            if (tl_cli_float("generate", "--temp", optarg, 0.0f, 100.0f, &temp)) return 2;
            break;
        case 'p': prompt = optarg; break;
        case 'k': tok_file = optarg; break;
        case 'i': ids = 1; break;
        case 'w': past_window = 1; break;
        case 'h': fputs(GENERATE_USAGE, stdout); return 0;
        default: return tl_cli_bad_option("generate", argc, argv, c, GENERATE_USAGE);
        }
    }
    const char *path;
    if (tl_cli_one_positional("generate", argc, argv, "MODEL", GENERATE_USAGE, &path)) return 2;
    int n_given = n > 0;
    if (!n_given) n = ids ? 64 : 256;

    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm generate: %s\n", err);
        return 1;
    }
    int rc = 1;
    tl_tokenizer *tok = NULL;
    int32_t *seq = NULL, n_prompt = 1;
    float *logits = NULL;
    tl_state *s = NULL;
    tl_kv kv;
    memset(&kv, 0, sizeof kv);
    if (n > m.cfg.seq_len && !n_given) n = m.cfg.seq_len;
    if (n > m.cfg.seq_len && !past_window) {
        fprintf(stderr, "tinyllm generate: -n %lld: the model's context is %d tokens (-n counts them "
                "all, BOS and prompt included; --past-window runs past it)\n", (long long)n, m.cfg.seq_len);
        rc = 2;
        goto out;
    }
    /* ids alone need no tokenizer; text in or out does */
    if ((!ids || prompt || tok_file) && !(tok = open_tokenizer("generate", &m, path, tok_file))) goto out;
    int32_t bos = tok ? tl_tokenizer_bos(tok) : 1, eos = tok ? tl_tokenizer_eos(tok) : 2;
    if (bos < 0) bos = 1; /* llama2.c's fixed BOS when a GGUF vocabulary names none */
    seq = malloc((size_t)n * sizeof *seq);
    if (!seq) {
        fprintf(stderr, "tinyllm generate: out of memory\n");
        goto out;
    }
    seq[0] = bos;
    if (prompt && *prompt) {
        int32_t need = 0;
        int enc = tl_encode(tok, prompt, strlen(prompt), 1, seq, (int32_t)n, &need, err, sizeof err);
        if (enc && need <= n) {
            fprintf(stderr, "tinyllm generate: --prompt: %s\n", err);
            goto out;
        }
        if (need >= n) {
            fprintf(stderr, "tinyllm generate: --prompt is %d tokens (with BOS), -n %lld leaves no room "
                    "to generate: raise -n (the model's context is %d)\n", need, (long long)n, m.cfg.seq_len);
            rc = 2;
            goto out;
        }
        n_prompt = need;
    }
    s = tl_state_create(&m.cfg, n_prompt);
    logits = malloc((size_t)n_prompt * (size_t)m.cfg.vocab_size * sizeof *logits);
    if (!s || !logits || tl_kv_init(&kv, &m.cfg, (int32_t)n)) {
        fprintf(stderr, "tinyllm generate: out of memory\n");
        goto out;
    }
    tl_state_allow_past_window(s, past_window);
    /* the prompt in one pass, then a token at a time; the RNG is drawn only
     * for sampled tokens, so with no prompt the ids are tl_sample_sequence's */
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos) {
        fprintf(stderr, "tinyllm generate: out of memory\n");
        goto out;
    }
    for (int32_t i = 0; i < (int32_t)n; i++) pos[i] = i;
    uint64_t rng = seed;
    int32_t len = n_prompt, V = m.cfg.vocab_size;
    int failed = tl_forward(&m, s, &kv, seq, n_prompt, pos, logits, NULL, NULL, NULL);
    const float *last = logits + (size_t)(n_prompt - 1) * (size_t)V;
    int32_t prev = seq[n_prompt - 1];
    while (!failed && len < n) {
        int32_t next = tl_sample(last, V, temp, &rng);
        seq[len++] = next;
        if (!ids) {
            /* text ends where the model ends the story */
            if (next == eos || next == bos) break;
            size_t pl;
            const char *p = tl_token_piece(tok, prev, next, &pl);
            put_bytes(p, pl);
            fflush(stdout);
        }
        prev = next;
        if (len < n) {
            failed = tl_forward(&m, s, &kv, &seq[len - 1], 1, &pos[len - 1], logits, NULL, NULL, NULL);
            last = logits;
        }
    }
    free(pos);
    if (failed) {
        fprintf(stderr, "tinyllm generate: the forward pass failed: %s\n", tl_state_error(s));
        goto out;
    }
    if (ids)
        for (int32_t i = 0; i < len; i++) printf("%d%c", seq[i], i + 1 < len ? ' ' : '\n');
    else
        putchar('\n');
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    tl_kv_free(&kv);
    tl_state_free(s);
    free(logits);
    free(seq);
    tl_tokenizer_free(tok);
    tl_model_free(&m);
    return rc;
}

/* Read all of stdin (text to encode, or ids to decode). */
static char *read_stdin(size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (n < cap) break;
        char *nb = cap < ((size_t)1 << 30) ? realloc(b, 2 * cap + 1) : NULL;
        if (!nb) {
            free(b);
            return NULL;
        }
        b = nb;
        cap *= 2;
    }
    if (!b || ferror(stdin)) {
        free(b);
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

/* Text to ids (or, with --decode, ids to text): the tokenizer on its own,
 * for scripts and for checking it against another implementation. */
static int tokenize(int argc, char **argv) {
    static const struct option opts[] = {
        {"tokenizer", required_argument, NULL, 'k'}, {"no-bos", no_argument, NULL, 'b'},
        {"decode", no_argument, NULL, 'd'},          {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *tok_file = NULL;
    int bos = 1, decode = 0, c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'k': tok_file = optarg; break;
        case 'b': bos = 0; break;
        case 'd': decode = 1; break;
        case 'h': fputs(TOKENIZE_USAGE, stdout); return 0;
        default: return tl_cli_bad_option("tokenize", argc, argv, c, TOKENIZE_USAGE);
        }
    }
    if (optind >= argc || argc - optind > 2) {
        fprintf(stderr, "tinyllm tokenize: %s\n" TOKENIZE_USAGE,
                optind >= argc ? "MODEL is missing" : "more than MODEL and TEXT given (quote the text)");
        return 2;
    }
    const char *path = argv[optind];
    tl_model m;
    char err[TL_ERR_SIZE];
    if (tl_model_load(path, &m, err, sizeof err)) {
        fprintf(stderr, "tinyllm tokenize: %s\n", err);
        return 1;
    }
    tl_tokenizer *tok = open_tokenizer("tokenize", &m, path, tok_file);
    size_t len = 0;
    char *in = NULL;
    if (optind + 1 < argc) {
        len = strlen(argv[optind + 1]);
        in = malloc(len + 1);
        if (in) memcpy(in, argv[optind + 1], len + 1);
    } else {
        in = read_stdin(&len);
    }
    int rc = 1;
    if (!tok || !in) {
        if (tok) fprintf(stderr, "tinyllm tokenize: cannot read the input\n");
        goto out;
    }
    if (decode) {
        int32_t cap = 0, n = 0, *ids = NULL;
        char *p = in, *end;
        for (;;) {
            while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
            if (!*p) break;
            long v = strtol(p, &end, 10);
            if (end == p || (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r') ||
                v < 0 || v >= tl_tokenizer_vocab(tok)) {
                fprintf(stderr, "tinyllm tokenize --decode: '%.*s' is not a token id (0..%d)\n",
                        (int)strcspn(p, " \n\t\r"), p, tl_tokenizer_vocab(tok) - 1);
                free(ids);
                goto out;
            }
            if (n == cap) {
                int32_t *ni = realloc(ids, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *ids);
                if (!ni) {
                    free(ids);
                    goto out;
                }
                ids = ni;
            }
            ids[n++] = (int32_t)v;
            p = end;
        }
        size_t tl;
        char *text = tl_decode_len(tok, ids, n, &tl);
        free(ids);
        if (!text) goto out;
        put_bytes(text, tl);
        free(text);
    } else {
        int32_t need;
        tl_encode(tok, in, len, bos, NULL, 0, &need, NULL, 0);
        int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
        if (!ids || tl_encode(tok, in, len, bos, ids, need, &need, err, sizeof err)) {
            fprintf(stderr, "tinyllm tokenize: %s\n", ids ? err : "out of memory");
            free(ids);
            goto out;
        }
        for (int32_t i = 0; i < need; i++) printf("%d%c", ids[i], i + 1 < need ? ' ' : '\n');
        if (!need) putchar('\n');
        free(ids);
    }
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(in);
    tl_tokenizer_free(tok);
    tl_model_free(&m);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "generate")) return generate(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "eval")) return tl_eval_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "demo")) return tl_demo_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "tour")) return tl_tour_main(argc - 1, argv + 1);
    if (argc >= 2) fprintf(stderr, "tinyllm: unknown command '%s'\n", argv[1]);
    fprintf(stderr,
            GENERATE_USAGE
            "       tinyllm tokenize MODEL [--tokenizer FILE] [--no-bos] [--decode] [TEXT]\n"
            "       tinyllm eval MODEL [--quick] [--seqs N] [--json FILE] [--md FILE]\n"
            "       tinyllm demo MODEL [--tokenizer FILE] [--state DIR] [--phase 1|2|all]\n"
            "       tinyllm tour MODEL [--state DIR] [--phase 1|2|all]\n"
            "MODEL: a llama2.c checkpoint or a GGUF file (llama, F32/F16)\n"
            "generate prints the continuation of --prompt (or of BOS) as text until the model ends\n"
            "the story, or all token ids with --ids; -n counts every token (BOS and prompt\n"
            "included) as llama2.c's -n does (default 256 for text, 64 for ids).\n"
            "The tokenizer is --tokenizer FILE, else the GGUF file's own vocabulary, else\n"
            "tok512.bin beside the model.\n");
    return 2;
}

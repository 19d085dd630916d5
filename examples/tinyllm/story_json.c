/* tinyllm-story: the browser page's story sessions, run natively and
 * printed as JSON. The page runs the same code (story_session.c, compiled
 * to WebAssembly); wasm/tests/browser_test.mjs compares the two.
 *
 *   tinyllm-story MODEL [--tokenizer FILE] [--art] [--art-tile N] [--mem F]
 *                 [--live F] [--order chrono|score|runs] [--bytes] [--repeat R] TEXT...
 *
 * Each TEXT is one session, in order. --mem, --live, --order: the window's
 * shares and the placement (tl_story_opts). Prints one JSON document:
 * {"model": {...}, "sessions": [...]} (story_session.h describes both).
 * --bytes: open the story from the files' bytes (tl_story_open_bytes, the
 * page's way). --repeat R: run the whole story R times (reset between) and
 * add "session_ms" (the median time of each session) and "story_ms" (the
 * median of the whole story): the native side of BENCHMARKS.md's per-session
 * times. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "story_session.h"

static const char k_usage[] =
    "usage: tinyllm-story MODEL [--tokenizer FILE] [--art] [--art-tile N] [--mem F] [--live F]\n"
    "                     [--order chrono|score|runs] [--bytes] [--repeat R] TEXT...\n";

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int main(int argc, char **argv) {
    const char *model = NULL, *tok = NULL;
    const char *texts[64];
    int n_texts = 0, bytes = 0, repeat = 0;
    tl_story_opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tokenizer") && i + 1 < argc) tok = argv[++i];
        else if (!strcmp(a, "--art")) o.art = 1;
        else if (!strcmp(a, "--art-tile") && i + 1 < argc) o.art_tile = atoi(argv[++i]);
        else if (!strcmp(a, "--bytes")) bytes = 1;
        else if (!strcmp(a, "--mem") && i + 1 < argc) o.mem_frac = atof(argv[++i]);
        else if (!strcmp(a, "--live") && i + 1 < argc) o.live_frac = atof(argv[++i]);
        else if (!strcmp(a, "--order") && i + 1 < argc) {
            const char *v = argv[++i];
            o.order = 0;
            for (int k = 0; k <= TL_ORDER_RUNS; k++)
                if (!strcmp(v, tl_order_name((tl_order)k))) o.order = k + 1;
            if (!o.order) {
                fprintf(stderr, "tinyllm-story: --order %s: expected chrono, score or runs\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strncmp(a, "--", 2)) {
            fprintf(stderr, "tinyllm-story: unknown option %s\n%s", a, k_usage);
            return 2;
        } else if (!model) model = a;
        else if (n_texts < 64) texts[n_texts++] = a;
        else {
            fprintf(stderr, "tinyllm-story: at most 64 sessions\n");
            return 2;
        }
    }
    if (!model || n_texts == 0 || repeat < 0 || repeat > 1000) {
        fputs(k_usage, stderr);
        return 2;
    }
    char err[TL_ERR_SIZE] = "";
    tl_story *s = NULL;
    int rc;
    if (bytes) {
        uint8_t *mb = NULL, *tb = NULL;
        size_t ms = 0, ts = 0;
        rc = tl_read_file(model, &mb, &ms, err, sizeof err);
        if (!rc && tok) rc = tl_read_file(tok, &tb, &ts, err, sizeof err);
        if (!rc) rc = tl_story_open_bytes(mb, ms, tb, ts, &s, err, sizeof err);
        free(mb);
        free(tb);
    } else {
        rc = tl_story_open(model, tok, &s, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "tinyllm-story: %s\n", err);
        return 1;
    }
    char *desc = tl_story_describe(s);
    printf("{\"model\":%s,\"sessions\":[", desc ? desc : "null");
    free(desc);
    double *ms = calloc((size_t)(repeat > 0 ? repeat : 1) * (size_t)(n_texts + 1), sizeof(double));
    int runs = repeat > 0 ? repeat : 1;
    for (int r = 0; !rc && r < runs; r++) {
        if (r > 0) rc = tl_story_reset(s, err, sizeof err);
        double t_story = now_ms();
        for (int i = 0; !rc && i < n_texts; i++) {
            char *json = NULL;
            double t0 = now_ms();
            rc = tl_story_session(s, texts[i], strlen(texts[i]), &o, &json, err, sizeof err);
            if (ms) ms[(size_t)i * (size_t)runs + (size_t)r] = now_ms() - t0;
            if (!rc && r == 0) printf("%s%s", i ? "," : "", json);
            free(json);
        }
        if (ms) ms[(size_t)n_texts * (size_t)runs + (size_t)r] = now_ms() - t_story;
    }
    printf("]");
    if (!rc && repeat > 0 && ms) {
        printf(",\"repeat\":%d,\"session_ms\":[", repeat);
        for (int i = 0; i < n_texts; i++) printf("%s%.3f", i ? "," : "", median(ms + (size_t)i * (size_t)runs, runs));
        printf("],\"story_ms\":%.3f", median(ms + (size_t)n_texts * (size_t)runs, runs));
    }
    printf("}\n");
    free(ms);
    if (rc) fprintf(stderr, "tinyllm-story: %s\n", err);
    tl_story_free(s);
    return rc ? 1 : 0;
}

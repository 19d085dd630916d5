/* A story agent one session at a time (story_session.h): story.c's session,
 * with ART as an option and the result as JSON, for the browser page and
 * its native reference. The window composition comes from beyond.h. */
#include "story_session.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

enum { GEN = TL_STORY_GEN, PROBE_WINDOW = TL_STORY_PROBE_WINDOW, MAX_PROMPT = TL_STORY_MAX_PROMPT };

struct tl_story {
    tl_model m;
    tl_tokenizer *tok;
    kvmem_context *ctx;
    tl_history h;
    tl_state *st;
    tl_method memart, full; /* MemArt's scoring; the whole history */
    int32_t V, L, d, kvd, sessions;
    float *logits; /* [MAX_PROMPT][V] the prompt's logits */
    float *next;   /* [V] one decode step's */
    float *q;      /* [MAX_PROMPT][L][d] the probe's raw queries */
};

/* The agent's capacity: TL_STORY_WINDOWS windows of the model. */
static int64_t story_cap(const tl_model *m) { return (int64_t)TL_STORY_WINDOWS * m->cfg.seq_len; }

/* ---- JSON out: a growing buffer; text as valid UTF-8 ---- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
    int oom;
} jbuf;

static void jput(jbuf *j, const char *s, size_t n) {
    if (j->oom) return;
    if (j->n + n + 1 > j->cap) {
        size_t cap = j->cap ? j->cap : 1024;
        while (cap < j->n + n + 1) cap *= 2;
        char *p = realloc(j->p, cap);
        if (!p) {
            j->oom = 1;
            return;
        }
        j->p = p;
        j->cap = cap;
    }
    memcpy(j->p + j->n, s, n);
    j->n += n;
    j->p[j->n] = '\0';
}

static void jputs(jbuf *j, const char *s) { jput(j, s, strlen(s)); }

static void jf(jbuf *j, const char *fmt, ...) TL_PRINTF(2, 3);
static void jf(jbuf *j, const char *fmt, ...) {
    char b[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof b, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof b) j->oom = 1; /* never: the formats here are short */
    else jput(j, b, (size_t)n);
}

/* A JSON string of len bytes. Decoded token pieces can split a UTF-8
 * character (byte fallback), so ill-formed sequences become U+FFFD, one per
 * maximal subpart, as a browser's TextDecoder does: the page and the native
 * reference then show the same text. */
static void jstr(jbuf *j, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    jputs(j, "\"");
    for (size_t i = 0; i < len;) {
        unsigned c = u[i];
        if (c < 0x80) {
            char e[8];
            if (c == '"') jputs(j, "\\\"");
            else if (c == '\\') jputs(j, "\\\\");
            else if (c == '\n') jputs(j, "\\n");
            else if (c < 0x20) jput(j, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c));
            else jput(j, (const char *)u + i, 1);
            i++;
            continue;
        }
        /* continuation bytes needed, and the range of the first one (Unicode Table 3-7) */
        size_t need = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
        unsigned lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        unsigned hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t k = 1;
        while (need && k <= need && i + k < len && u[i + k] >= lo && u[i + k] <= hi) {
            k++;
            lo = 0x80;
            hi = 0xBF;
        }
        if (need && k == need + 1) jput(j, (const char *)u + i, k);
        else jputs(j, "\\ufffd");
        i += k;
    }
    jputs(j, "\"");
}

static void jids(jbuf *j, const int32_t *ids, int32_t n) {
    jputs(j, "[");
    for (int32_t i = 0; i < n; i++) jf(j, i ? ",%d" : "%d", ids[i]);
    jputs(j, "]");
}

/* "ids":[...],"text":"..." of n ids (the fields, inside an object the caller opened). */
static void jtext_fields(jbuf *j, const tl_story *s, const int32_t *ids, int32_t n) {
    char *t = tl_decode(s->tok, ids, n);
    if (!t) {
        j->oom = 1;
        return;
    }
    jputs(j, "\"ids\":");
    jids(j, ids, n);
    jputs(j, ",\"text\":");
    jstr(j, t, strlen(t));
    free(t);
}

/* The history's tokens [first, first + n) as the fields "first", "n", "ids", "text". */
static int jrange_fields(jbuf *j, tl_story *s, int64_t first, int64_t n, char *err, size_t err_size) {
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!ids) return tl_errf(err, err_size, "out of memory");
    if (n > 0 && kvmem_agent_tokens(s->h.agent, first, n, ids) != KVMEM_OK) {
        free(ids);
        return tl_errf(err, err_size, "agent tokens: %s", kvmem_last_error());
    }
    jf(j, "\"first\":%lld,\"n\":%lld,", (long long)first, (long long)n);
    jtext_fields(j, s, ids, (int32_t)n);
    free(ids);
    return 0;
}

/* ---- opening ---- */

static int story_finish_open(tl_story *s, char *err, size_t err_size) {
    const tl_config *c = &s->m.cfg;
    s->V = c->vocab_size;
    s->L = c->n_layers;
    s->d = c->dim;
    s->kvd = c->n_kv_heads * c->head_dim;
    if (tl_tokenizer_vocab(s->tok) != s->V)
        return tl_errf(err, err_size, "the tokenizer has %d tokens, the model %d: not this model's tokenizer",
                       tl_tokenizer_vocab(s->tok), s->V);
    if (c->seq_len < GEN + 2 + 16)
        return tl_errf(err, err_size, "the model's context (%d) is too short", c->seq_len);
    tl_method ms[32];
    int32_t n = tl_method_list(ms, 32, NULL, 0), found = 0;
    for (int32_t i = 0; i < n && i < 32; i++) {
        if (!strcmp(ms[i].name, "memart")) s->memart = ms[i], found |= 1;
        if (!strcmp(ms[i].name, "full")) s->full = ms[i], found |= 4;
    }
    if (found != 5) return tl_errf(err, err_size, "this build has no MemArt retrieval");
    kvmem_context_params cp = kvmem_context_default_params();
    cp.backend = "cpu";
    cp.n_threads = 1;
    if (kvmem_context_create(&cp, &s->ctx) != KVMEM_OK)
        return tl_errf(err, err_size, "context: %s", kvmem_last_error());
    s->st = tl_state_create(c, MAX_PROMPT + GEN);
    s->logits = malloc((size_t)MAX_PROMPT * (size_t)s->V * sizeof(float));
    s->next = malloc((size_t)s->V * sizeof(float));
    s->q = malloc((size_t)MAX_PROMPT * (size_t)s->L * (size_t)s->d * sizeof(float));
    if (!s->st || !s->logits || !s->next || !s->q) return tl_errf(err, err_size, "out of memory");
    return tl_history_init(&s->h, s->ctx, &s->m, story_cap(&s->m), KVMEM_F16, 16, "story-agent", err, err_size);
}

int tl_story_open(const char *model_path, const char *tokenizer_path, tl_story **out, char *err, size_t err_size) {
    if (!model_path || !out) return tl_errf(err, err_size, "model path and out must not be NULL");
    *out = NULL;
    tl_story *s = calloc(1, sizeof *s);
    if (!s) return tl_errf(err, err_size, "out of memory");
    int rc = tl_model_load(model_path, &s->m, err, err_size);
    if (!rc) {
        if (tokenizer_path) rc = tl_tokenizer_load(tokenizer_path, s->m.cfg.vocab_size, &s->tok, err, err_size);
        else if (tl_tokenizer_from_model(&s->m, &s->tok, NULL, 0))
            rc = tl_errf(err, err_size, "the model has no vocabulary of its own: give a tokenizer file");
    }
    if (!rc && !s->tok) rc = tl_errf(err, err_size, "the tokenizer did not load");
    if (!rc) rc = story_finish_open(s, err, err_size);
    if (rc) {
        tl_story_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

/* The loaders read files: a file image in memory goes through a temporary
 * file (in the browser, Emscripten's in-memory file system). */
static int temp_file(const uint8_t *data, size_t size, char *path, size_t path_size, char *err, size_t err_size) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, path_size, "%s/tinyllm-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return tl_errf(err, err_size, "cannot create a temporary file in %s", dir && *dir ? dir : "/tmp");
    for (size_t at = 0; at < size;) {
        ssize_t w = write(fd, data + at, size - at);
        if (w <= 0) {
            close(fd);
            unlink(path);
            return tl_errf(err, err_size, "cannot write a temporary file");
        }
        at += (size_t)w;
    }
    if (close(fd) != 0) {
        unlink(path);
        return tl_errf(err, err_size, "cannot write a temporary file");
    }
    return 0;
}

/* A loader's message names the temporary file: name the input instead. */
static void rename_in_message(char *err, size_t err_size, const char *path, const char *what) {
    size_t n = strlen(path);
    if (!err || !err_size || strncmp(err, path, n)) return;
    char tail[TL_ERR_SIZE];
    snprintf(tail, sizeof tail, "%s", err + n);
    snprintf(err, err_size, "%s%s", what, tail);
}

int tl_story_open_bytes(const uint8_t *model, size_t model_size, const uint8_t *tok, size_t tok_size,
                        tl_story **out, char *err, size_t err_size) {
    if (!model || !model_size || !out || (!tok && tok_size))
        return tl_errf(err, err_size, "no model given (%zu bytes)", model_size);
    *out = NULL;
    char mpath[512], tpath[512] = "";
    if (temp_file(model, model_size, mpath, sizeof mpath, err, err_size)) return -1;
    if (tok && tok_size && temp_file(tok, tok_size, tpath, sizeof tpath, err, err_size)) {
        unlink(mpath);
        return -1;
    }
    int rc = tl_story_open(mpath, tpath[0] ? tpath : NULL, out, err, err_size);
    unlink(mpath);
    if (tpath[0]) unlink(tpath);
    if (rc) {
        rename_in_message(err, err_size, mpath, "the model file");
        if (tpath[0]) rename_in_message(err, err_size, tpath, "the tokenizer file");
    }
    return rc;
}

void tl_story_free(tl_story *s) {
    if (!s) return;
    tl_history_free(&s->h);
    tl_state_free(s->st);
    kvmem_context_free(s->ctx);
    tl_tokenizer_free(s->tok);
    tl_model_free(&s->m);
    free(s->logits);
    free(s->next);
    free(s->q);
    free(s);
}

int tl_story_reset(tl_story *s, char *err, size_t err_size) {
    if (!s) return tl_errf(err, err_size, "story is NULL");
    tl_history h;
    if (tl_history_init(&h, s->ctx, &s->m, story_cap(&s->m), KVMEM_F16, 16, "story-agent", err, err_size))
        return -1;
    tl_history_free(&s->h);
    s->h = h;
    s->sessions = 0;
    return 0;
}

int64_t tl_story_history(const tl_story *s) { return s ? s->h.n : 0; }

char *tl_story_describe(const tl_story *s) {
    if (!s) return NULL;
    const tl_config *c = &s->m.cfg;
    jbuf j = {0};
    int32_t tile = 0;
#ifdef TINYLLM_HAVE_ATTEND
    tile = kvmem_attend_default_params().tile_size;
    if (tile == 0) tile = KVMEM_ATTEND_DEFAULT_TILE;
#endif
    jf(&j, "{\"format\":\"%s\",\"dim\":%d,\"hidden_dim\":%d,\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,",
       s->m.format, c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads);
    jf(&j, "\"head_dim\":%d,\"vocab\":%d,\"seq_len\":%d,\"block_size\":%d,\"storage\":\"f16\",", c->head_dim,
       c->vocab_size, c->seq_len, s->h.block_size);
    jf(&j, "\"gen\":%d,\"max_prompt\":%d,\"probe_window\":%d,\"art\":%s,\"art_default_tile\":%d}", GEN, MAX_PROMPT,
       PROBE_WINDOW, tile ? "true" : "false", tile);
    if (j.oom) {
        free(j.p);
        return NULL;
    }
    return j.p;
}

/* ---- one session ---- */

/* Prefill the prompt on the context in kv at positions base.., then continue
 * greedily for up to GEN tokens, stopping at a story boundary. art (may be
 * NULL): attend with ART; *pre gets its stats after the prefill. */
static int continue_text(tl_story *s, tl_kv *kv, const int32_t *prompt, int32_t np, int32_t base, int32_t *gen,
                         int32_t *n_gen, tl_art *art, tl_art *pre, char *err, size_t err_size) {
    int32_t pos[MAX_PROMPT + GEN];
    for (int32_t i = 0; i < np + GEN; i++) pos[i] = base + i;
    if (tl_forward(&s->m, s->st, kv, prompt, np, pos, s->logits, NULL, art, NULL))
        return tl_errf(err, err_size, "prefill: %s%s%s", tl_state_error(s->st), art ? " " : "",
                       art ? kvmem_last_error() : "");
    if (art) *pre = *art;
    int32_t t = tl_argmax(s->logits + (size_t)(np - 1) * (size_t)s->V, s->V);
    *n_gen = 0;
    while (*n_gen < GEN && t > 2) { /* 0 unk, 1 BOS, 2 EOS: the story ends */
        gen[(*n_gen)++] = t;
        if (*n_gen == GEN) break; /* nothing reads the last token's logits */
        if (tl_forward(&s->m, s->st, kv, &t, 1, pos + np + *n_gen - 1, s->next, NULL, art, NULL))
            return tl_errf(err, err_size, "decode: %s%s%s", tl_state_error(s->st), art ? " " : "",
                           art ? kvmem_last_error() : "");
        t = tl_argmax(s->next, s->V);
    }
    return 0;
}

/* The prompt's raw queries over the newest history: what retrieval is asked with. */
static int probe(tl_story *s, const int32_t *prompt, int32_t np, char *err, size_t err_size) {
    int64_t n = s->h.n < PROBE_WINDOW ? s->h.n : PROBE_WINDOW;
    tl_kv kv;
    int32_t pos[MAX_PROMPT];
    for (int32_t i = 0; i < np; i++) pos[i] = (int32_t)n + i;
    if (tl_kv_init(&kv, &s->m.cfg, (int32_t)n + np)) return tl_errf(err, err_size, "out of memory");
    int rc = tl_window_put_tokens(&s->h, s->h.n - n, n, 0, &kv, err, err_size);
    tl_trace tr = {0};
    tr.q_raw = s->q;
    if (!rc && tl_forward(&s->m, s->st, &kv, prompt, np, pos, NULL, &tr, NULL, NULL))
        rc = tl_errf(err, err_size, "probe: %s", tl_state_error(s->st));
    tl_kv_free(&kv);
    return rc;
}

/* The window's shares for a session of np tokens, and where the live context starts. */
static void plan(const tl_story *s, const tl_story_opts *o, int32_t np, tl_story_run *r, int64_t *live_first) {
    int32_t W = s->m.cfg.seq_len, bs = s->h.block_size;
    r->split = tl_window_split(W, np + GEN, o->mem_frac, o->live_frac, bs);
    r->order = o->order - 1;
    int64_t N = s->h.n, live = r->split.live < N ? r->split.live : N;
    /* the live context starts on a block boundary, so the blocks before it are whole */
    int64_t first = (N - live + bs - 1) / bs * bs;
    *live_first = first < N ? first : N;
    r->budget = r->split.memory + r->split.live;
}

/* kvmem's context for the prompt into kv (reset first): the retrieved
 * blocks before the live context, re-encoded from position 0. info gets the
 * choice (blocks in window order), scores their retrieval scores. */
static int kvmem_window(tl_story *s, const int32_t *prompt, int32_t np, const tl_story_run *r, int64_t live_first,
                        tl_kv *kv, tl_build_info *info, float *scores, char *err, size_t err_size) {
    int64_t N = s->h.n;
    kv->n = 0;
    memset(info, 0, sizeof *info);
    info->local_rows = N - live_first;
    if (N == 0) return 0;
    int32_t cand = tl_history_blocks_before(&s->h, live_first), top_k = r->split.memory / s->h.block_size;
    int rc = 0;
    if (cand > 0 && top_k > 0) {
        kvmem_agent_info ai;
        kvmem_retrieval *ret = NULL;
        const int32_t *blocks;
        const float *sc;
        int32_t nb = 0, placed[TL_MAX_BLOCKS];
        if (probe(s, prompt, np, err, err_size)) return -1;
        kvmem_retrieve_params p = kvmem_retrieve_default_params();
        p.top_k = top_k < TL_MAX_BLOCKS ? top_k : TL_MAX_BLOCKS;
        p.mode = (kvmem_retrieve_mode)s->memart.mode;
        p.norm = (kvmem_retrieve_norm)s->memart.norm;
        p.agg = (kvmem_retrieve_agg)s->memart.agg;
        kvmem_tensor qt;
        int64_t qs[4] = {np, s->L, s->m.cfg.n_heads, s->m.cfg.head_dim};
        kvmem_tensor_init(&qt, s->q, KVMEM_F32, 4, qs);
        if (kvmem_agent_get_info(s->h.agent, &ai) != KVMEM_OK || kvmem_retrieval_create(&ret) != KVMEM_OK)
            return tl_errf(err, err_size, "retrieval: %s", kvmem_last_error());
        p.skip_recent = ai.n_sealed - cand;
        if (kvmem_retrieve(s->h.agent, &qt, &p, ret) != KVMEM_OK ||
            kvmem_retrieval_get(ret, 0, &blocks, &sc, &nb) != KVMEM_OK)
            rc = tl_errf(err, err_size, "retrieve: %s", kvmem_last_error());
        if (!rc && tl_place(blocks, sc, nb, (tl_order)r->order, placed))
            rc = tl_errf(err, err_size, "placement order %d", r->order);
        for (int32_t i = 0; !rc && i < nb; i++) {
            info->blocks[i] = placed[i];
            for (int32_t j = 0; j < nb; j++)
                if (blocks[j] == placed[i]) scores[i] = sc[j];
        }
        if (!rc) info->n_blocks = nb;
        kvmem_retrieval_free(ret);
        if (!rc) rc = tl_window_put_blocks(&s->h, info->blocks, nb, 0, kv, err, err_size);
        info->retrieved_rows = kv->n;
    }
    if (!rc) rc = tl_window_put_tokens(&s->h, live_first, N - live_first, kv->n, kv, err, err_size);
    return rc;
}

/* Text RAG's context into kv (reset first), the prompt a text-memory agent
 * builds: BOS, the 16-token chunks of the history BM25 ranks best against
 * the new text (in the history's order, within the memory's share of the
 * window), then the live context's text; all of it run through the model. */
static int rag_window(tl_story *s, const char *text, size_t len, tl_story_run *r, int64_t live_first, tl_kv *kv,
                      char *err, size_t err_size) {
    int64_t N = s->h.n;
    int32_t live = (int32_t)(N - live_first), room = 1 + r->split.memory + live;
    int32_t *ids = malloc((size_t)N * sizeof(int32_t)), *toks = malloc((size_t)room * sizeof(int32_t));
    int32_t *chosen = NULL;
    float *sc = NULL;
    tl_textmem *tm = NULL;
    int rc = 0;
    kv->n = 0;
    if (!ids || !toks) rc = tl_errf(err, err_size, "out of memory");
    if (!rc && kvmem_agent_tokens(s->h.agent, 0, N, ids) != KVMEM_OK)
        rc = tl_errf(err, err_size, "agent tokens: %s", kvmem_last_error());
    if (!rc) rc = tl_textmem_create(s->tok, ids, (int32_t)N, TL_CHUNK_TOKENS, s->h.block_size, &tm, err, err_size);
    int32_t n = rc ? 0 : tl_textmem_count(tm), at = 0;
    sc = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    chosen = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!rc && (!sc || !chosen)) rc = tl_errf(err, err_size, "out of memory");
    if (!rc) {
        tl_textmem_score(tm, text, len, sc);
        int32_t nc = tl_textmem_choose(tm, sc, r->split.memory - 1, (int32_t)live_first, chosen, n, NULL);
        r->n_rag_chunks = nc < TL_STORY_MAX_CHUNKS ? nc : TL_STORY_MAX_CHUNKS;
        toks[at++] = tl_tokenizer_bos(s->tok) >= 0 ? tl_tokenizer_bos(s->tok) : 1;
        for (int32_t c = 0; c < r->n_rag_chunks; c++) {
            tl_chunk ch = tl_textmem_chunk(tm, chosen[c]);
            r->rag_chunks[c] = ch;
            memcpy(toks + at, ids + ch.first, (size_t)ch.n * sizeof(int32_t));
            at += ch.n;
        }
        memcpy(toks + at, ids + live_first, (size_t)live * sizeof(int32_t));
        at += live;
        r->rag_tokens = at;
        int32_t step = tl_state_max_chunk(s->st), pos[MAX_PROMPT + GEN];
        for (int32_t i = 0; !rc && i < at; i += step) {
            int32_t m = at - i < step ? at - i : step;
            for (int32_t k = 0; k < m; k++) pos[k] = i + k;
            if (tl_forward(&s->m, s->st, kv, toks + i, m, pos, NULL, NULL, NULL, NULL))
                rc = tl_errf(err, err_size, "text RAG prefill: %s", tl_state_error(s->st));
        }
    }
    tl_textmem_free(tm);
    free(ids);
    free(chosen);
    free(toks);
    free(sc);
    return rc;
}

static void jart(jbuf *j, const char *name, int64_t visited, int64_t total, int64_t read) {
    jf(j, "\"%s\":{\"tiles_visited\":%lld,\"tiles_total\":%lld,\"positions_read\":%lld}", name, (long long)visited,
       (long long)total, (long long)read);
}

/* The session's JSON; the memory's blocks and live context read from the agent. */
static int session_json(tl_story *s, jbuf *j, const char *text, size_t len, const tl_story_run *r, char *err,
                        size_t err_size) {
    const tl_build_info *info = &r->info;
    jf(j, "{\"session\":%d,\"history\":%lld,\"budget\":%lld,", r->session, (long long)r->history,
       (long long)r->budget);
    jf(j, "\"split\":{\"memory\":%d,\"live\":%d,\"order\":\"%s\"},\"text\":", r->split.memory, r->split.live,
       tl_order_name((tl_order)r->order));
    jstr(j, text, len);
    jputs(j, ",\"prompt\":");
    jids(j, r->prompt, r->n_prompt);
    jputs(j, ",\"memory\":");
    if (!r->has_memory) {
        jputs(j, "null");
    } else {
        jf(j, "{\"rows\":%d,\"local_rows\":%lld,\"retrieved_rows\":%lld,\"blocks\":[", r->mem_rows,
           (long long)info->local_rows, (long long)info->retrieved_rows);
        for (int32_t b = 0; b < info->n_blocks; b++) {
            kvmem_block_info bi;
            if (kvmem_agent_block_info(s->h.agent, info->blocks[b], &bi) != KVMEM_OK)
                return tl_errf(err, err_size, "block info: %s", kvmem_last_error());
            jf(j, "%s{\"id\":%d,\"score\":%.6g,", b ? "," : "", info->blocks[b], (double)r->scores[b]);
            if (jrange_fields(j, s, bi.first_token, bi.n_tokens, err, err_size)) return -1;
            jputs(j, "}");
        }
        jputs(j, "],\"live\":{");
        if (jrange_fields(j, s, r->history - info->local_rows, info->local_rows, err, err_size)) return -1;
        jputs(j, "}}");
    }
    jputs(j, ",\"art\":");
    if (!r->art_on) {
        jputs(j, "null");
    } else {
        const tl_art *art = &r->art, *pre = &r->art_prefill;
        jputs(j, "{");
#ifdef TINYLLM_HAVE_ATTEND
        jf(j, "\"tile_size\":%d,", art->params.tile_size ? art->params.tile_size : KVMEM_ATTEND_DEFAULT_TILE);
#endif
        jart(j, "prefill", pre->tiles_visited, pre->tiles_total, pre->positions_read);
        jputs(j, ",");
        jart(j, "decode", art->tiles_visited - pre->tiles_visited, art->tiles_total - pre->tiles_total,
             art->positions_read - pre->positions_read);
        jputs(j, "}");
    }
    jputs(j, ",\"kvmem\":{");
    jtext_fields(j, s, r->gen, r->n_gen);
    if (!r->compared) {
        jputs(j, "},\"rag\":null,\"recent\":null,\"full\":null");
    } else {
        jputs(j, "},\"rag\":{");
        jtext_fields(j, s, r->rag, r->n_rag);
        jputs(j, ",\"chunks\":[");
        for (int32_t c = 0; c < r->n_rag_chunks; c++) {
            jf(j, "%s{", c ? "," : "");
            if (jrange_fields(j, s, r->rag_chunks[c].first, r->rag_chunks[c].n, err, err_size)) return -1;
            jputs(j, "}");
        }
        jputs(j, "]},\"recent\":{");
        jtext_fields(j, s, r->recent, r->n_recent);
        jf(j, ",\"window\":%lld},\"full\":{", (long long)(r->history < r->budget ? r->history : r->budget));
        jtext_fields(j, s, r->full, r->n_full);
        jf(j, ",\"past_window\":%s}", r->full_past_window ? "true" : "false");
    }
    jf(j, ",\"tokens\":{\"prefilled\":%d,\"probed\":%d,\"rag_prefilled\":%d,\"reread\":%lld}}", r->n_prompt,
       r->info.n_blocks ? r->n_prompt : 0, r->compared ? r->rag_tokens + r->n_prompt : r->n_prompt,
       (long long)(r->history + r->n_prompt));
    return j->oom ? tl_errf(err, err_size, "out of memory") : 0;
}

/* Append the session's text (rows mem_rows.. of kvmem's run in kv) to the
 * agent. The continuations are the model's guesses, not the story: the
 * history is what the sessions said, so every memory is built from the same
 * text, and a name said once stays where it was said. Blocks stay aligned
 * to 16 tokens (the tail is not flushed): text RAG's chunks are the blocks. */
static int append_text(tl_story *s, const tl_kv *kv, int32_t mem_rows, const int32_t *prompt, int32_t np, char *err,
                       size_t err_size) {
    size_t row = (size_t)np * (size_t)s->kvd;
    float *k = malloc((size_t)s->L * row * sizeof(float)), *v = malloc((size_t)s->L * row * sizeof(float));
    int rc = 0;
    if (!k || !v) rc = tl_errf(err, err_size, "out of memory");
    for (int32_t l = 0; !rc && l < s->L; l++) {
        size_t src = ((size_t)l * (size_t)kv->cap + (size_t)mem_rows) * (size_t)s->kvd;
        memcpy(k + (size_t)l * row, kv->k + src, row * sizeof(float));
        memcpy(v + (size_t)l * row, kv->v + src, row * sizeof(float));
    }
    if (!rc)
        rc = tl_history_append_ex(&s->h, k, v, np, kv->pos + mem_rows, prompt, NULL, NULL, 0, 0, err, err_size);
    free(k);
    free(v);
    return rc;
}

/* The session's prompt ids, checked against the story's limits. */
static int encode_prompt(tl_story *s, const char *text, size_t len, int32_t *prompt, int32_t *np, char *err,
                         size_t err_size) {
    if (!text || len == 0) return tl_errf(err, err_size, "the session's text is empty");
    int64_t N = s->h.n;
    char e[TL_ERR_SIZE] = "";
    if (tl_encode(s->tok, text, len, N == 0, prompt, MAX_PROMPT, np, e, sizeof e))
        return tl_errf(err, err_size, "the session's text: %s (at most %d tokens)", e, MAX_PROMPT);
    if (*np < 1 || *np > MAX_PROMPT)
        return tl_errf(err, err_size, "the session's text is %d tokens: expected 1 to %d", *np, MAX_PROMPT);
    if (*np + GEN + s->h.block_size > s->m.cfg.seq_len)
        return tl_errf(err, err_size,
                       "the session's text is %d tokens: with %d to generate it leaves less than a block of "
                       "the model's window of %d tokens for memory",
                       *np, GEN, s->m.cfg.seq_len);
    if (N + *np > story_cap(&s->m))
        return tl_errf(err, err_size,
                       "the story is full: %lld history tokens + %d new pass the agent's %lld tokens (%d windows "
                       "of the model; start the story over)",
                       (long long)N, *np, (long long)story_cap(&s->m), TL_STORY_WINDOWS);
    return 0;
}

static int check_opts(const tl_story_opts *o, char *err, size_t err_size) {
#ifndef TINYLLM_HAVE_ATTEND
    if (o->art) return tl_errf(err, err_size, "ART (kvmem_attend) is not in this build");
#endif
    if (o->art_tile < 0 || o->art_tile > 4096)
        return tl_errf(err, err_size, "ART tile size %d: expected 0 (kvmem's default) to 4096", o->art_tile);
    if (!(o->mem_frac >= 0 && o->mem_frac <= 1) || !(o->live_frac >= 0 && o->live_frac <= 1))
        return tl_errf(err, err_size, "window shares %g (memory) and %g (live): expected 0 to 1", o->mem_frac,
                       o->live_frac);
    if (o->order < 0 || o->order > TL_ORDER_RUNS + 1)
        return tl_errf(err, err_size, "placement order %d: expected 0 (the default) to %d", o->order,
                       TL_ORDER_RUNS + 1);
    return 0;
}

/* The options with the defaults filled in. */
static tl_story_opts resolve_opts(const tl_story_opts *opts) {
    tl_story_opts o = {0};
    if (opts) o = *opts;
    if (o.mem_frac == 0) o.mem_frac = TL_STORY_MEM_FRAC;
    if (o.live_frac == 0) o.live_frac = TL_STORY_LIVE_FRAC;
    if (o.order == 0) o.order = TL_STORY_ORDER + 1;
    return o;
}

void tl_story_run_free(tl_story_run *run) {
    if (run) tl_kv_free(&run->kv);
}

int tl_story_step(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, tl_story_run *r,
                  char *err, size_t err_size) {
    if (!s || !r || (!text && len)) return tl_errf(err, err_size, "story, text and run must not be NULL");
    memset(r, 0, sizeof *r);
    if (opts && check_opts(opts, err, err_size)) return -1;
    tl_story_opts o = resolve_opts(opts);
    if (encode_prompt(s, text, len, r->prompt, &r->n_prompt, err, err_size)) return -1;
    int64_t N = s->h.n, live_first = 0;
    int32_t np = r->n_prompt, W = s->m.cfg.seq_len;
    r->session = s->sessions + 1;
    r->history = N;
    r->has_memory = N > 0;
    r->compared = N > 0 && !o.kvmem_only;
    r->art_on = o.art;
    plan(s, &o, np, r, &live_first);
#ifdef TINYLLM_HAVE_ATTEND
    r->art.ctx = s->ctx;
    r->art.params = kvmem_attend_default_params();
    if (o.art_tile) r->art.params.tile_size = o.art_tile;
#endif
    tl_kv other;
    int32_t cap_other = (int32_t)(N > W ? N : W) + np + GEN;
    int have_other = r->compared && !tl_kv_init(&other, &s->m.cfg, cap_other);
    int rc = tl_kv_init(&r->kv, &s->m.cfg, W) || (r->compared && !have_other) ? tl_errf(err, err_size, "out of memory")
                                                                              : 0;
    if (!rc) rc = kvmem_window(s, r->prompt, np, r, live_first, &r->kv, &r->info, r->scores, err, err_size);
    r->mem_rows = r->kv.n;
    if (!rc)
        rc = continue_text(s, &r->kv, r->prompt, np, r->mem_rows, r->gen, &r->n_gen, o.art ? &r->art : NULL,
                           &r->art_prefill, err, err_size);
    if (!rc && r->compared) {
        rc = rag_window(s, text, len, r, live_first, &other, err, err_size) ||
                     continue_text(s, &other, r->prompt, np, other.n, r->rag, &r->n_rag, NULL, NULL, err, err_size)
                 ? -1
                 : 0;
        int64_t R = N < r->budget ? N : r->budget;
        other.n = 0;
        if (!rc)
            rc = tl_window_put_tokens(&s->h, N - R, R, 0, &other, err, err_size) ||
                         continue_text(s, &other, r->prompt, np, other.n, r->recent, &r->n_recent, NULL, NULL, err,
                                       err_size)
                     ? -1
                     : 0;
        /* the whole history at its own positions: past the window the model was never trained there */
        r->full_past_window = N + np + GEN > W;
        tl_state_allow_past_window(s->st, 1);
        if (!rc)
            rc = tl_memory_build(&s->h, &s->full, 0, NULL, 0, (int32_t)N, &other, err, err_size) ||
                         continue_text(s, &other, r->prompt, np, (int32_t)N, r->full, &r->n_full, NULL, NULL, err,
                                       err_size)
                     ? -1
                     : 0;
        tl_state_allow_past_window(s->st, 0);
    }
    if (have_other) tl_kv_free(&other);
    if (rc) tl_story_run_free(r);
    return rc;
}

int tl_story_commit(tl_story *s, tl_story_run *r, char *err, size_t err_size) {
    if (!s || !r || r->history != s->h.n) return tl_errf(err, err_size, "the run is not of this story's history");
    if (append_text(s, &r->kv, r->mem_rows, r->prompt, r->n_prompt, err, err_size)) return -1;
    s->sessions++;
    return 0;
}

char *tl_story_run_json(tl_story *s, const char *text, size_t len, const tl_story_run *r) {
    jbuf j = {0};
    char err[TL_ERR_SIZE];
    if (!s || !r || session_json(s, &j, text ? text : "", text ? len : 0, r, err, sizeof err)) {
        free(j.p);
        return NULL;
    }
    return j.p;
}

int tl_story_session(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, char **json, char *err,
                     size_t err_size) {
    if (!s || !json || (!text && len)) return tl_errf(err, err_size, "story, text and json must not be NULL");
    *json = NULL;
    tl_story_run r;
    if (tl_story_step(s, text, len, opts, &r, err, err_size)) return -1;
    jbuf j = {0};
    int rc = session_json(s, &j, text, len, &r, err, err_size);
    /* last: a failure before it leaves the story as it was */
    if (!rc) rc = tl_story_commit(s, &r, err, err_size);
    tl_story_run_free(&r);
    if (rc) {
        free(j.p);
        return -1;
    }
    *json = j.p;
    return 0;
}

char *tl_story_text(tl_story *s, int64_t first, int64_t n) {
    if (!s || first < 0 || n < 0 || first + n > s->h.n) return NULL;
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    char *t = ids && (n == 0 || kvmem_agent_tokens(s->h.agent, first, n, ids) == KVMEM_OK)
                  ? tl_decode(s->tok, ids, (int32_t)n)
                  : NULL;
    free(ids);
    return t;
}

int tl_story_prompt_logits(tl_story *s, const char *text, size_t len, const tl_story_opts *opts, float *logits,
                           int32_t cap_rows, int32_t *n_prompt, char *err, size_t err_size) {
    if (!s || !logits || !n_prompt) return tl_errf(err, err_size, "story, logits and n_prompt must not be NULL");
    if (opts && check_opts(opts, err, err_size)) return -1;
    tl_story_opts o = resolve_opts(opts);
    tl_story_run *r = calloc(1, sizeof *r);
    if (!r) return tl_errf(err, err_size, "out of memory");
    int rc = encode_prompt(s, text, len, r->prompt, &r->n_prompt, err, err_size);
    int32_t np = r->n_prompt;
    if (!rc && np > cap_rows) rc = tl_errf(err, err_size, "the prompt is %d tokens, room for %d", np, cap_rows);
    int64_t live_first = 0;
    if (!rc) plan(s, &o, np, r, &live_first);
    tl_kv kv;
    if (!rc && tl_kv_init(&kv, &s->m.cfg, s->m.cfg.seq_len)) rc = tl_errf(err, err_size, "out of memory");
    else if (!rc) {
        int32_t pos[MAX_PROMPT];
        rc = kvmem_window(s, r->prompt, np, r, live_first, &kv, &r->info, r->scores, err, err_size);
        for (int32_t i = 0; i < np; i++) pos[i] = kv.n + i;
        if (!rc && tl_forward(&s->m, s->st, &kv, r->prompt, np, pos, logits, NULL, NULL, NULL))
            rc = tl_errf(err, err_size, "prefill: %s", tl_state_error(s->st));
        tl_kv_free(&kv);
    }
    if (!rc) *n_prompt = np;
    free(r);
    return rc;
}

int tl_story_save(tl_story *s, const char *path, char *err, size_t err_size) {
    if (!s || !path) return tl_errf(err, err_size, "story and path must not be NULL");
    return tl_history_save(&s->h, path, err, err_size);
}

int tl_story_load(tl_story *s, const char *path, char *err, size_t err_size) {
    if (!s || !path) return tl_errf(err, err_size, "story and path must not be NULL");
    if (tl_history_load(&s->h, path, err, err_size)) return -1;
    s->sessions = 0; /* numbering of what this process runs */
    return 0;
}

int tl_story_block_info(tl_story *s, int32_t block, kvmem_block_info *out) {
    return s && kvmem_agent_block_info(s->h.agent, block, out) == KVMEM_OK ? 0 : -1;
}

const tl_model *tl_story_model(const tl_story *s) { return s ? &s->m : NULL; }

const char *tl_story_agent_id(const tl_story *s) { return s ? s->h.agent_id : ""; }

int tl_story_encode(const tl_story *s, const char *text, size_t len, int bos, int32_t *out, int32_t cap,
                    int32_t *n_out, char *err, size_t err_size) {
    if (!s || (!text && len) || !out || !n_out) return tl_errf(err, err_size, "NULL argument");
    return tl_encode(s->tok, text ? text : "", len, bos, out, cap, n_out, err, err_size);
}

char *tl_story_decode(const tl_story *s, const int32_t *ids, int32_t n) {
    if (!s || (!ids && n) || n < 0) return NULL;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->V) return NULL;
    return tl_decode(s->tok, ids, n);
}

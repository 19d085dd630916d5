/* The agent file format: key names, the tensor plan, the header writer, the
 * metadata reader, the checksum rule (agent_file.h; docs/format.md). */
#include "agent_file.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* In kvm_af_key's order. */
const char *const kvm_af_keys[KVM_AF_N_KEYS + 1] = {
    "format",   "format_version", "agent_id",  "model_id",           "model_spec", "storage_dtype", "block_size",
    "n_tokens", "block_tokens",   "token_ids", "token_text_offsets", "text",       "text_hex",      "checksum",
    NULL};

kvm_st_rules kvm_af_rules(void) {
    kvm_st_rules r = kvm_st_default_rules();
    r.dtypes = KVM_ST_DTYPE_BIT(KVM_ST_F32) | KVM_ST_DTYPE_BIT(KVM_ST_F16) | KVM_ST_DTYPE_BIT(KVM_ST_BF16) |
               KVM_ST_DTYPE_BIT(KVM_ST_U32) | KVM_ST_DTYPE_BIT(KVM_ST_I8);
    r.require_meta = 1;
    r.known_keys = kvm_af_keys;
    return r;
}

/* ---- the model spec string ---- */

void kvm_af_spec_write(const kvmem_model_spec *s, kvm_jbuf *b) {
    kvm_jbuf_fmt(b, "n_layers=%d;n_q_heads=%d;n_kv_heads=%d;head_dim=%d;rotary_dim=%d;rope_style=%d;", s->n_layers,
                 s->n_q_heads, s->n_kv_heads, s->head_dim, s->rotary_dim ? s->rotary_dim : s->head_dim,
                 (int)s->rope_style);
    kvm_jbuf_fmt(b, "rope_theta=%.17g;rope_scaling=%d;rope_factor=%.17g;rope_low_freq_factor=%.17g;", s->rope_theta,
                 (int)s->rope_scaling, s->rope_factor, s->rope_low_freq_factor);
    kvm_jbuf_fmt(b, "rope_high_freq_factor=%.17g;rope_original_max_pos=%d;yarn_beta_fast=%.17g;yarn_beta_slow=%.17g;",
                 s->rope_high_freq_factor, s->rope_original_max_pos, s->yarn_beta_fast, s->yarn_beta_slow);
    kvm_jbuf_fmt(b, "yarn_attn_factor=%.17g;layer_window=", s->yarn_attn_factor);
    for (int32_t l = 0; l < s->n_layers; l++) kvm_jbuf_fmt(b, l ? ",%d" : "%d", s->layer_window ? s->layer_window[l] : 0);
}

/* Strict decimal integer in [lo, hi]. */
static int parse_i64(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out) {
    if (n == 0 || n > 20) return 0;
    size_t i = 0;
    int neg = s[0] == '-';
    if (neg) i++;
    if (i == n) return 0;
    if (s[i] == '0' && n - i > 1) return 0;
    int64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        int d = s[i] - '0';
        if (v > (INT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    if (neg) v = -v;
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

/* The spec string's fields in order; 'i' an int32, 'd' a double, 'w' the window list. */
static const struct spec_field {
    const char *name;
    char type;
    size_t off;
} k_spec_fields[] = {
    {"n_layers", 'i', offsetof(kvmem_model_spec, n_layers)},
    {"n_q_heads", 'i', offsetof(kvmem_model_spec, n_q_heads)},
    {"n_kv_heads", 'i', offsetof(kvmem_model_spec, n_kv_heads)},
    {"head_dim", 'i', offsetof(kvmem_model_spec, head_dim)},
    {"rotary_dim", 'i', offsetof(kvmem_model_spec, rotary_dim)},
    {"rope_style", 'e', offsetof(kvmem_model_spec, rope_style)},
    {"rope_theta", 'd', offsetof(kvmem_model_spec, rope_theta)},
    {"rope_scaling", 'e', offsetof(kvmem_model_spec, rope_scaling)},
    {"rope_factor", 'd', offsetof(kvmem_model_spec, rope_factor)},
    {"rope_low_freq_factor", 'd', offsetof(kvmem_model_spec, rope_low_freq_factor)},
    {"rope_high_freq_factor", 'd', offsetof(kvmem_model_spec, rope_high_freq_factor)},
    {"rope_original_max_pos", 'i', offsetof(kvmem_model_spec, rope_original_max_pos)},
    {"yarn_beta_fast", 'd', offsetof(kvmem_model_spec, yarn_beta_fast)},
    {"yarn_beta_slow", 'd', offsetof(kvmem_model_spec, yarn_beta_slow)},
    {"yarn_attn_factor", 'd', offsetof(kvmem_model_spec, yarn_attn_factor)},
    {"layer_window", 'w', 0},
};

kvmem_status kvm_af_spec_read(const char *s, size_t n, kvmem_model_spec *spec, int32_t *window, int32_t max_layers) {
    kvmem_model_spec out = *spec;
    size_t at = 0;
    for (size_t f = 0; f < sizeof k_spec_fields / sizeof k_spec_fields[0]; f++) {
        const struct spec_field *fd = &k_spec_fields[f];
        size_t kl = strlen(fd->name);
        if (n - at < kl + 1 || memcmp(s + at, fd->name, kl) != 0 || s[at + kl] != '=')
            return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: '%s=' expected at byte %zu", fd->name, at);
        at += kl + 1;
        size_t e = at;
        while (e < n && s[e] != ';') e++;
        if (fd->type == 'w') {
            if (e != n) return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: text after layer_window");
            int any = 0;
            for (int32_t l = 0; l < out.n_layers; l++) {
                size_t c = at;
                while (c < n && s[c] != ',') c++;
                int64_t w;
                if (!parse_i64(s + at, c - at, 0, INT32_MAX, &w) || (c == n) != (l == out.n_layers - 1))
                    return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: layer_window must list %d windows", out.n_layers);
                window[l] = (int32_t)w;
                any |= w != 0;
                at = c + 1;
            }
            out.layer_window = any ? window : NULL;
            *spec = out;
            return KVMEM_OK;
        }
        if (e == n) return kvm_fail(KVMEM_ERR_FORMAT, "model spec string ends after '%s'", fd->name);
        char num[64];
        if (e - at == 0 || e - at >= sizeof num)
            return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: '%s' has no value", fd->name);
        memcpy(num, s + at, e - at);
        num[e - at] = '\0';
        if (fd->type == 'd') {
            char *end;
            double v = strtod(num, &end);
            if (*end) return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: '%s' is not a number", fd->name);
            memcpy((char *)&out + fd->off, &v, sizeof v);
        } else {
            int64_t v;
            if (!parse_i64(num, e - at, INT32_MIN, INT32_MAX, &v))
                return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: '%s' is not an integer", fd->name);
            if (fd->type == 'i') {
                int32_t x = (int32_t)v;
                memcpy((char *)&out + fd->off, &x, sizeof x);
            } else if (fd->off == offsetof(kvmem_model_spec, rope_style)) {
                out.rope_style = (kvmem_rope_style)v;
            } else {
                out.rope_scaling = (kvmem_rope_scaling)v;
            }
        }
        if (f == 0 && (out.n_layers < 1 || out.n_layers > max_layers))
            return kvm_fail(KVMEM_ERR_FORMAT, "model spec string: n_layers %d outside [1, %d]", out.n_layers, max_layers);
        at = e + 1;
    }
    return kvm_fail(KVMEM_ERR_INTERNAL, "model spec string: no layer_window field"); /* the table ends with it */
}

/* ---- the plan: which tensors a file holds ----
 *
 * Version 2 (written by this build):
 *   raw dtypes   layer_{L}_k, layer_{L}_v          [H][T][D]     (F32/F16/BF16)
 *   quantized    k_weights, v_weights, k_scales, v_scales, k_biases, v_biases:
 *                2-D, one row per (block, layer, head, token) in that order
 *                ([rows][W] U32 Q4 words, [rows][D] I8 Q8 codes, [rows][G]
 *                F16 scales/biases; KIVI key scales/biases one row per
 *                (block, layer, head): [n_blocks * L * H][D]), each block's
 *                rows being one region of its memory
 *   tails        layer_{L}_k_tail, layer_{L}_v_tail [H][tail][D]  F32
 *   aabb         [n_blocks][L][H][2][D], s_max then s_min, F16 rounded
 *                outward (F32 for F32 and BF16 pools)
 * Version 1 (still read): the same raw and tail tensors; quantized tensors
 * per layer, layer_{L}_k_weights|scales|biases [H][T][...] (MLX's per-head
 * layout); AABBs per layer, layer_{L}_aabb_min|max [n_blocks][H][D] F32. */

static const char *st_dtype(kvmem_dtype dt) {
    switch (dt) {
    case KVMEM_F32: return "F32";
    case KVMEM_F16: return "F16";
    case KVMEM_BF16: return "BF16";
    default: return "?";
    }
}

static int add_t(kvm_af_plan *pl, const char *name, const char *dtype, uint64_t esize, int ndim, const uint64_t *dims,
                 kvm_af_kind kind, int which, int layer, int part) {
    kvm_af_tensor *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    uint64_t e = esize;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = dims[i];
        if (dims[i] && e > UINT64_MAX / dims[i]) return 0;
        e *= dims[i];
    }
    t->bytes = e;
    t->esize = esize;
    t->index = pl->n - 1;
    t->kind = kind, t->which = which, t->layer = layer, t->part = part;
    return 1;
}

kvmem_status kvm_af_plan_build(const kvm_af_geom *g, int version, uint64_t n_sealed, uint64_t ts, uint64_t tail_n,
                               kvm_af_plan *pl) {
    const int L = g->n_layers;
    const uint64_t H = (uint64_t)g->n_kv_heads, D = (uint64_t)g->head_dim, LH = (uint64_t)L * H;
    const kvmem_dtype dt = g->dtype;
    const int quant = !kvm_is_tensor_dtype(dt);
    pl->t = kvm_calloc((size_t)L * 10 + 8, sizeof *pl->t);
    pl->n = 0;
    if (!pl->t) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the tensor list of %d layers", L);
    const uint64_t W = (D + 7) / 8, G8 = (D + 31) / 32, G4 = (D + 63) / 64;
    char nm[48];
    int ok = 1;
    if (quant && version >= 2) {
        static const char *parts[3] = {"weights", "scales", "biases"};
        const uint64_t rows = LH * ts; /* overflow: LH < 2^31, ts < 2^31 */
        for (int part = 0; part < (dt == KVMEM_Q8 ? 2 : 3) && ok; part++)
            for (int which = 0; which < 2 && ok; which++) {
                int chan = dt == KVMEM_Q4_KIVI && which == 0 && part > 0;
                uint64_t dims[2] = {chan ? n_sealed * LH : rows,
                                    part == 0 ? (dt == KVMEM_Q8 ? D : W) : chan ? D : dt == KVMEM_Q8 ? G8 : G4};
                snprintf(nm, sizeof nm, "%c_%s", which ? 'v' : 'k', parts[part]);
                ok &= add_t(pl, nm, part ? "F16" : dt == KVMEM_Q8 ? "I8" : "U32", part ? 2 : dt == KVMEM_Q8 ? 1 : 4, 2,
                            dims, KVM_AF_T_QKV, which, 0, part);
            }
    }
    for (int l = 0; l < L && ok; l++) {
        for (int which = 0; which < 2 && ok; which++) {
            const char kv = which ? 'v' : 'k';
            if (quant && version < 2) {
                int chan = dt == KVMEM_Q4_KIVI && which == 0;
                uint64_t dw[3] = {H, ts, dt == KVMEM_Q8 ? D : W};
                uint64_t ds[3] = {H, chan ? n_sealed : ts, chan ? D : dt == KVMEM_Q8 ? G8 : G4};
                snprintf(nm, sizeof nm, "layer_%d_%c_weights", l, kv);
                ok &= add_t(pl, nm, dt == KVMEM_Q8 ? "I8" : "U32", dt == KVMEM_Q8 ? 1 : 4, 3, dw, KVM_AF_T_KV, which, l, 0);
                snprintf(nm, sizeof nm, "layer_%d_%c_scales", l, kv);
                ok &= add_t(pl, nm, "F16", 2, 3, ds, KVM_AF_T_KV, which, l, 1);
                if (dt != KVMEM_Q8) {
                    snprintf(nm, sizeof nm, "layer_%d_%c_biases", l, kv);
                    ok &= add_t(pl, nm, "F16", 2, 3, ds, KVM_AF_T_KV, which, l, 2);
                }
            } else if (!quant) {
                uint64_t dims[3] = {H, ts, D};
                snprintf(nm, sizeof nm, "layer_%d_%c", l, kv);
                ok &= add_t(pl, nm, st_dtype(dt), kvm_dtype_size(dt), 3, dims, KVM_AF_T_KV, which, l, 0);
            }
            if (tail_n) {
                uint64_t dims[3] = {H, tail_n, D};
                snprintf(nm, sizeof nm, "layer_%d_%c_tail", l, kv);
                ok &= add_t(pl, nm, "F32", 4, 3, dims, KVM_AF_T_TAIL, which, l, 0);
            }
        }
        if (version < 2) {
            uint64_t dims[3] = {n_sealed, H, D};
            snprintf(nm, sizeof nm, "layer_%d_aabb_min", l);
            ok &= add_t(pl, nm, "F32", 4, 3, dims, KVM_AF_T_AABB1, 0, l, 0);
            snprintf(nm, sizeof nm, "layer_%d_aabb_max", l);
            ok &= add_t(pl, nm, "F32", 4, 3, dims, KVM_AF_T_AABB1, 1, l, 0);
        }
    }
    if (version >= 2 && ok) {
        uint64_t dims[5] = {n_sealed, (uint64_t)L, H, 2, D};
        ok &= add_t(pl, "aabb", g->aabb_esize == 2 ? "F16" : "F32", (uint64_t)g->aabb_esize, 5, dims, KVM_AF_T_AABB, 0, 0, 0);
    }
    if (!ok) {
        kvm_af_plan_free(pl);
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor sizes overflow: %" PRIu64 " tokens is not a real agent", ts);
    }
    return KVMEM_OK;
}

void kvm_af_plan_free(kvm_af_plan *pl) {
    kvm_free(pl->t);
    pl->t = NULL;
    pl->n = 0;
}

static int by_width(const void *a, const void *b) {
    const kvm_af_tensor *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

uint64_t kvm_af_plan_lay_out(kvm_af_plan *pl) {
    qsort(pl->t, (size_t)pl->n, sizeof *pl->t, by_width);
    uint64_t off = 0;
    for (int32_t i = 0; i < pl->n; i++) {
        pl->t[i].begin = off;
        off += pl->t[i].bytes;
        pl->t[i].end = off;
    }
    return off;
}

static int cmp_begin(const void *a, const void *b) {
    const kvm_af_tensor *x = *(const kvm_af_tensor *const *)a, *y = *(const kvm_af_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* One tensor of the file against the plan: its name, dtype and shape (the
 * reader has checked the entry's form; the layout is checked after). */
static kvmem_status match_tensor(kvm_af_plan *pl, const kvm_st_tensor *v) {
    kvm_af_tensor *t = NULL;
    for (int32_t i = 0; i < pl->n && !t; i++)
        if (strlen(pl->t[i].name) == v->name_len && memcmp(pl->t[i].name, v->name, v->name_len) == 0) t = &pl->t[i];
    if (!t) return kvm_fail(KVMEM_ERR_FORMAT, "unexpected tensor '%.60s' for this pool and metadata", v->name);
    if (strcmp(kvm_st_dtype_name(v->dtype), t->dtype) != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' has dtype %s, expected %s", t->name, kvm_st_dtype_name(v->dtype), t->dtype);
    int same = v->ndim == t->ndim;
    for (int k = 0; same && k < t->ndim; k++) same = v->shape[k] == t->shape[k];
    if (!same) {
        char want[128], got[128];
        int w = 0, g = 0;
        for (int i = 0; i < t->ndim && w >= 0 && (size_t)w < sizeof want; i++)
            w += snprintf(want + w, sizeof want - (size_t)w, i ? ", %" PRIu64 : "%" PRIu64, t->shape[i]);
        for (int i = 0; i < v->ndim && g >= 0 && (size_t)g < sizeof got; i++)
            g += snprintf(got + g, sizeof got - (size_t)g, i ? ", %" PRIu64 : "%" PRIu64, v->shape[i]);
        return kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%s]", t->name, got, want);
    }
    t->begin = v->begin;
    t->end = v->end;
    t->seen = 1;
    return KVMEM_OK;
}

kvmem_status kvm_af_plan_match(kvm_af_plan *pl, const kvm_st_header *h, kvm_af_tensor ***order) {
    *order = NULL;
    kvmem_status st;
    for (int32_t i = 0; i < h->n_tensors; i++)
        if ((st = match_tensor(pl, &h->tensors[i])) != KVMEM_OK) return st;
    kvm_af_tensor **o = kvm_malloc((size_t)(pl->n ? pl->n : 1) * sizeof *o);
    if (!o) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the order of %d tensors", pl->n);
    for (int32_t i = 0; i < pl->n; i++) {
        if (!pl->t[i].seen) {
            kvm_free(o);
            return kvm_fail(KVMEM_ERR_FORMAT, "tensor '%s' is missing", pl->t[i].name);
        }
        o[i] = &pl->t[i];
    }
    qsort(o, (size_t)pl->n, sizeof *o, cmp_begin);
    *order = o;
    return KVMEM_OK;
}

/* ---- the header writer ---- */

kvmem_status kvm_af_header_build(const kvm_af_meta *m, const kvm_af_plan *pl, uint64_t sum, kvm_af_header *h) {
    memset(h, 0, sizeof *h);
    kvm_jbuf *b = &h->b;
    kvm_jbuf_put(b, "\0\0\0\0\0\0\0\0", 8); /* the length, set last */
    kvm_jbuf_fmt(b, "{\"__metadata__\":{\"%s\":\"" KVM_AF_MAGIC "\",", kvm_af_keys[KVM_AF_FORMAT]);
    kvm_jbuf_fmt(b, "\"%s\":\"%d\",\"%s\":", kvm_af_keys[KVM_AF_FORMAT_VERSION], KVM_AF_VERSION, kvm_af_keys[KVM_AF_AGENT_ID]);
    kvm_jbuf_str(b, m->agent_id, strlen(m->agent_id));
    kvm_jbuf_fmt(b, ",\"%s\":", kvm_af_keys[KVM_AF_MODEL_ID]);
    kvm_jbuf_str(b, m->spec->model_id, strnlen(m->spec->model_id, KVMEM_MAX_MODEL_ID));
    kvm_jbuf sp = {0};
    kvm_af_spec_write(m->spec, &sp);
    if (sp.oom) b->oom = 1; /* an empty spec would write a file no pool loads */
    kvm_jbuf_fmt(b, ",\"%s\":", kvm_af_keys[KVM_AF_MODEL_SPEC]);
    kvm_jbuf_str(b, sp.s ? sp.s : "", sp.n);
    kvm_jbuf_free(&sp);
    kvm_jbuf_fmt(b, ",\"%s\":\"%s\",\"%s\":\"%d\",\"%s\":\"%" PRId64 "\",\"%s\":\"", kvm_af_keys[KVM_AF_STORAGE_DTYPE],
                 kvmem_dtype_name(m->dtype), kvm_af_keys[KVM_AF_BLOCK_SIZE], m->block_size, kvm_af_keys[KVM_AF_N_TOKENS],
                 m->n_tokens, kvm_af_keys[KVM_AF_BLOCK_TOKENS]);
    for (int64_t i = 0; i < m->n_sealed; i++)
        kvm_jbuf_fmt(b, i ? ",%d" : "%d",
                     *(const int32_t *)(const void *)((const char *)m->block_tokens + (size_t)i * m->block_tokens_stride));
    kvm_jbuf_fmt(b, "\",\"%s\":\"", kvm_af_keys[KVM_AF_TOKEN_IDS]);
    for (int64_t i = 0; i < m->n_tokens; i++) kvm_jbuf_fmt(b, i ? ",%d" : "%d", m->token_ids[i]);
    kvm_jbuf_fmt(b, "\",\"%s\":\"", kvm_af_keys[KVM_AF_TOKEN_TEXT_OFFSETS]);
    for (int64_t i = 0; i < m->n_tokens; i++) kvm_jbuf_fmt(b, i ? ",%" PRId64 : "%" PRId64, m->token_text_off[i]);
    kvm_jbuf_puts(b, "\",");
    /* a NUL is valid UTF-8, but the reader refuses it in any header string */
    if (kvm_json_utf8_valid(m->text, m->text_len) && !(m->text_len && memchr(m->text, '\0', m->text_len))) {
        kvm_jbuf_fmt(b, "\"%s\":", kvm_af_keys[KVM_AF_TEXT]);
        kvm_jbuf_str(b, m->text ? m->text : "", m->text_len);
    } else { /* not UTF-8 (so not a JSON string) or holding a NUL: hex keeps it exact */
        kvm_jbuf_fmt(b, "\"%s\":\"", kvm_af_keys[KVM_AF_TEXT_HEX]);
        for (size_t i = 0; i < m->text_len; i++) kvm_jbuf_fmt(b, "%02x", (unsigned char)m->text[i]);
        kvm_jbuf_puts(b, "\"");
    }
    kvm_jbuf_fmt(b, ",\"%s\":\"", kvm_af_keys[KVM_AF_CHECKSUM]);
    h->hex_at = b->n + 9; /* after "acc64-1m:" */
    char sum_text[KVM_AF_CHECKSUM_LEN + 1];
    kvm_af_checksum_text(sum, sum_text);
    kvm_jbuf_fmt(b, "%s\"}", sum_text);
    for (int32_t i = 0; i < pl->n; i++) {
        const kvm_af_tensor *t = &pl->t[i];
        kvm_jbuf_fmt(b, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->dtype);
        for (int d = 0; d < t->ndim; d++) kvm_jbuf_fmt(b, d ? ",%" PRIu64 : "%" PRIu64, t->shape[d]);
        kvm_jbuf_fmt(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", t->begin, t->end);
    }
    kvm_jbuf_puts(b, "}");
    /* The data starts 8-byte aligned; and where the KV tensors' offset
     * allows, padded so they start on a page: each block's run then lies
     * on whole page-cache pages at its blocks' 64-byte alignment, which the
     * kernel copies ~20% faster than runs shifted by 8 (load, one thread). */
    uint64_t kv_begin = 0;
    for (int32_t i = 0; i < pl->n; i++)
        if (pl->t[i].kind == KVM_AF_T_KV || pl->t[i].kind == KVM_AF_T_QKV) {
            kv_begin = pl->t[i].begin;
            break;
        }
    const uint64_t page = kv_begin % 8 ? 8 : 4096;
    while (!b->oom && (b->n + (page == 8 ? 0 : kv_begin)) % page) kvm_jbuf_puts(b, " ");
    if (b->oom) {
        size_t cap = b->cap;
        kvm_af_header_free(h);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the file header (%zu bytes so far)", cap);
    }
    for (int i = 0; i < 8; i++) b->s[i] = (char)(unsigned char)((uint64_t)(b->n - 8) >> (8 * i));
    return KVMEM_OK;
}

void kvm_af_header_set_checksum(kvm_af_header *h, uint64_t sum) {
    char sum_text[KVM_AF_CHECKSUM_LEN + 1];
    kvm_af_checksum_text(sum, sum_text);
    memcpy(h->b.s + h->hex_at, sum_text + 9, 16);
}

/* ---- reading the metadata ---- */

static const char *meta_str(const kvm_st_header *h, kvm_af_key k, size_t *len) {
    const kvm_json *v = kvm_st_meta(h, kvm_af_keys[k]);
    if (!v) return NULL;
    *len = v->len;
    return v->str;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

kvmem_status kvm_af_check_meta(const kvm_st_header *h, const kvm_af_expect *want, kvm_af_info *out) {
    size_t n;
    const char *v;
    memset(out, 0, sizeof *out);
#define META(k)                                                                                                 \
    do {                                                                                                        \
        if (!(v = meta_str(h, k, &n)))                                                                          \
            return kvm_fail(KVMEM_ERR_FORMAT, "metadata '%s' is missing: not a kvmem agent file", kvm_af_keys[k]); \
    } while (0)
    /* strings are NUL-free and every metadata value is a string: the reader */
    META(KVM_AF_FORMAT);
    if (strcmp(v, KVM_AF_MAGIC) != 0) return kvm_fail(KVMEM_ERR_FORMAT, "metadata format is not '" KVM_AF_MAGIC "'");
    META(KVM_AF_FORMAT_VERSION);
    if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "this format version is not supported (this build reads 1 and 2)");
    out->version = v[0] - '0';
    META(KVM_AF_AGENT_ID);
    if (!kvmem_agent_id_valid(v)) return kvm_fail(KVMEM_ERR_FORMAT, "metadata agent_id is not a valid agent id");
    if (want->agent_id && strcmp(v, want->agent_id) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file belongs to agent '%s', not '%s'", v, want->agent_id);
    out->agent_id = v;
    META(KVM_AF_MODEL_ID);
    if (strcmp(v, want->spec->model_id) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file was written for model '%.60s', the pool is '%.60s'", v,
                        want->spec->model_id);
    META(KVM_AF_MODEL_SPEC);
    kvm_jbuf sp = {0};
    kvm_af_spec_write(want->spec, &sp);
    if (sp.oom) {
        kvm_jbuf_free(&sp);
        return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the pool's model spec string");
    }
    if (n != sp.n || memcmp(v, sp.s, n) != 0) {
        /* name the first field that differs */
        size_t i = 0;
        while (i < n && i < sp.n && v[i] == sp.s[i]) i++;
        size_t f = i;
        while (f > 0 && sp.s[f - 1] != ';') f--;
        size_t e = f;
        while (e < sp.n && sp.s[e] != ';') e++;
        size_t fe = f;
        while (fe < n && v[fe] != ';') fe++;
        kvmem_status st = kvm_fail(KVMEM_ERR_MISMATCH, "model spec differs: file has %.*s, the pool %.*s",
                                   (int)KVM_MIN(fe - KVM_MIN(f, fe), (size_t)80), v + KVM_MIN(f, n),
                                   (int)KVM_MIN(e - f, (size_t)80), sp.s + f);
        kvm_jbuf_free(&sp);
        return st;
    }
    kvm_jbuf_free(&sp);
    META(KVM_AF_STORAGE_DTYPE);
    if (strcmp(v, kvmem_dtype_name(want->dtype)) != 0)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file stores %.20s, the pool stores %s", v, kvmem_dtype_name(want->dtype));
    META(KVM_AF_BLOCK_SIZE);
    int64_t bs;
    if (!parse_i64(v, n, 1, 4096, &bs)) return kvm_fail(KVMEM_ERR_FORMAT, "metadata block_size '%.20s' is not a block size", v);
    if (bs != want->block_size)
        return kvm_fail(KVMEM_ERR_MISMATCH, "the file has block size %lld, the pool %d", (long long)bs, want->block_size);
    META(KVM_AF_N_TOKENS);
    if (!parse_i64(v, n, 0, INT32_MAX, &out->n_tokens))
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata n_tokens '%.20s' is not a token count in [0, 2^31)", v);
    if (want->max_tokens > 0 && out->n_tokens > want->max_tokens)
        return kvm_fail(KVMEM_ERR_CAPACITY, "the file holds %lld tokens, more than max_tokens_per_agent %d",
                        (long long)out->n_tokens, want->max_tokens);
    META(KVM_AF_CHECKSUM);
    if (n != KVM_AF_CHECKSUM_LEN || strncmp(v, "acc64-1m:", 9) != 0)
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata checksum is not 'acc64-1m:<16 hex digits>'");
    for (int i = 9; i < KVM_AF_CHECKSUM_LEN; i++) {
        int x = hexval(v[i]);
        if (x < 0) return kvm_fail(KVMEM_ERR_FORMAT, "metadata checksum is not 'acc64-1m:<16 hex digits>'");
        out->checksum = (out->checksum << 4) | (uint64_t)x;
    }
#undef META
    return KVMEM_OK;
}

/* Comma-separated integers into out (n_expect entries). -1: syntax, -2: count. */
static int parse_list(const char *s, size_t len, int64_t lo, int64_t hi, int64_t n_expect, void *out, int wide) {
    int64_t k = 0;
    size_t i = 0;
    if (len == 0) return n_expect == 0 ? 0 : -2;
    while (i <= len) {
        size_t j = i;
        while (j < len && s[j] != ',') j++;
        int64_t v;
        if (!parse_i64(s + i, j - i, lo, hi, &v)) return -1;
        if (k >= n_expect) return -2;
        if (wide) ((int64_t *)out)[k] = v;
        else ((int32_t *)out)[k] = (int32_t)v;
        k++;
        i = j + 1;
    }
    return k == n_expect ? 0 : -2;
}

kvmem_status kvm_af_block_lengths(const kvm_st_header *h, int32_t block_size, int64_t n_tokens, int32_t **lengths,
                                  int64_t *n_sealed_out, int64_t *tail_n) {
    *lengths = NULL;
    size_t n;
    const char *v = meta_str(h, KVM_AF_BLOCK_TOKENS, &n);
    if (!v) return kvm_fail(KVMEM_ERR_FORMAT, "metadata 'block_tokens' is missing");
    int64_t n_sealed = n ? 1 : 0;
    for (size_t i = 0; i < n; i++) n_sealed += v[i] == ',';
    if (n_sealed > n_tokens)
        return kvm_fail(KVMEM_ERR_CORRUPT, "%lld blocks for %lld tokens", (long long)n_sealed, (long long)n_tokens);
    int32_t *len = kvm_malloc((size_t)(n_sealed ? n_sealed : 1) * sizeof *len);
    if (!len) return kvm_fail(KVMEM_ERR_NOMEM, "out of memory for the lengths of %lld blocks", (long long)n_sealed);
    if (parse_list(v, n, 1, block_size, n_sealed, len, 0) != 0) {
        kvm_free(len);
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata block_tokens must list block lengths in [1, %d]", block_size);
    }
    int64_t ts = 0;
    for (int64_t i = 0; i < n_sealed; i++) ts += len[i];
    if (n_tokens - ts < 0 || n_tokens - ts >= block_size) {
        kvm_free(len);
        return kvm_fail(KVMEM_ERR_CORRUPT, "blocks hold %lld of %lld tokens: the rest does not fit an unsealed block of %d",
                        (long long)ts, (long long)n_tokens, block_size);
    }
    *lengths = len;
    *n_sealed_out = n_sealed;
    *tail_n = n_tokens - ts;
    return KVMEM_OK;
}

kvmem_status kvm_af_text_len(const kvm_st_header *h, size_t *len) {
    size_t n;
    if (meta_str(h, KVM_AF_TEXT, &n)) {
        *len = n;
        return KVMEM_OK;
    }
    if (!meta_str(h, KVM_AF_TEXT_HEX, &n) || n % 2)
        return kvm_fail(KVMEM_ERR_FORMAT, "metadata has neither 'text' nor an even-length 'text_hex'");
    *len = n / 2;
    return KVMEM_OK;
}

kvmem_status kvm_af_text(const kvm_st_header *h, char *text, size_t len) {
    size_t n;
    const char *v = meta_str(h, KVM_AF_TEXT, &n);
    if (v) {
        memcpy(text, v, KVM_MIN(n, len));
        return KVMEM_OK;
    }
    const char *hex = meta_str(h, KVM_AF_TEXT_HEX, &n);
    for (size_t i = 0; hex && i < len && 2 * i + 1 < n; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return kvm_fail(KVMEM_ERR_FORMAT, "metadata text_hex is not lowercase hex");
        text[i] = (char)(hi * 16 + lo);
    }
    return KVMEM_OK;
}

kvmem_status kvm_af_token_ids(const kvm_st_header *h, int64_t n_tokens, int32_t *out) {
    size_t n;
    const char *v = meta_str(h, KVM_AF_TOKEN_IDS, &n);
    int rc = v ? parse_list(v, n, INT32_MIN, INT32_MAX, n_tokens, out, 0) : -1;
    if (rc != 0)
        return kvm_fail(rc == -2 ? KVMEM_ERR_CORRUPT : KVMEM_ERR_FORMAT, "metadata token_ids must list %lld int32 ids",
                        (long long)n_tokens);
    return KVMEM_OK;
}

kvmem_status kvm_af_token_offsets(const kvm_st_header *h, int64_t n_tokens, size_t text_len, int64_t *out) {
    size_t n;
    const char *v = meta_str(h, KVM_AF_TOKEN_TEXT_OFFSETS, &n);
    int rc = v ? parse_list(v, n, -1, (int64_t)text_len, n_tokens, out, 1) : -1;
    if (rc != 0)
        return kvm_fail(rc == -2 ? KVMEM_ERR_CORRUPT : KVMEM_ERR_FORMAT,
                        "metadata token_text_offsets must list %lld offsets in [-1, %zu]", (long long)n_tokens, text_len);
    int64_t last = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        int64_t o = out[i];
        if (o < 0) continue;
        if (o < last) return kvm_fail(KVMEM_ERR_CORRUPT, "token_text_offsets decrease at token %lld", (long long)i);
        last = o;
    }
    return KVMEM_OK;
}

/* ---- the checksum ---- */

uint64_t kvm_af_checksum_combine(const uint64_t *dig, size_t n) {
    unsigned char le[8];
    kvm_xxh64_state h;
    kvm_xxh64_init(&h, 0);
    for (size_t c = 0; c < n; c++) {
        for (int b = 0; b < 8; b++) le[b] = (unsigned char)(dig[c] >> (8 * b));
        kvm_xxh64_update(&h, le, 8);
    }
    return kvm_xxh64_final(&h);
}

uint64_t kvm_af_checksum(const void *data, uint64_t size, kvm_acc64_fn stripes) {
    const unsigned char *p = data;
    unsigned char le[8];
    kvm_xxh64_state h;
    kvm_xxh64_init(&h, 0);
    for (uint64_t c = 0; c < size; c += KVM_AF_CHUNK) {
        uint64_t d = kvm_acc64_with(stripes, p + c, (size_t)KVM_MIN(size - c, KVM_AF_CHUNK));
        for (int b = 0; b < 8; b++) le[b] = (unsigned char)(d >> (8 * b));
        kvm_xxh64_update(&h, le, 8);
    }
    return kvm_xxh64_final(&h);
}

void kvm_af_checksum_text(uint64_t sum, char out[KVM_AF_CHECKSUM_LEN + 1]) {
    snprintf(out, KVM_AF_CHECKSUM_LEN + 1, "acc64-1m:%016" PRIx64, sum);
}

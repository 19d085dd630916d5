/* The IntentKV residual head at inference (weights from safetensors):
 * s_j = rule_j + alpha * MLP(phi_j ++ c_j), see kvmem.h for the tensors. */
#include "qmem_internal.h"
#include "../format/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_XW 128   /* cross-attention width */
#define HEAD_XH 4     /* cross-attention heads */
#define HEAD_HID 256  /* MLP hidden width */
#define HEAD_ALPHA_MAX 5.0f

struct kvmem_qmem_head {
    int32_t D, F;        /* head_dim, 3D + 1 */
    float alpha;         /* clipped */
    float *w_q, *w_k, *w_v; /* [128][F], [128][D], [128][D] */
    float *w1, *b1;      /* [256][F + 128], [256] */
    float *w2, b2;       /* [256], scalar */
};

void kvmem_qmem_head_free(kvmem_qmem_head *h) {
    if (!h) return;
    kvm_free(h->w_q);
    kvm_free(h->w_k);
    kvm_free(h->w_v);
    kvm_free(h->w1);
    kvm_free(h->b1);
    kvm_free(h->w2);
    kvm_free(h);
}

int32_t kvmem_qmem_head_dim(const kvmem_qmem_head *h) { return h ? h->D : 0; }
float kvmem_qmem_head_alpha(const kvmem_qmem_head *h) { return h ? h->alpha : 0.0f; }

typedef struct {
    const char *name;
    int32_t ndim;
    int64_t shape[2]; /* -1: the head_dim-derived size, filled at run time */
} want;

#define HEAD_MAX_HEADER ((uint64_t)100 << 20) /* refuse larger JSON headers */

/* The weights' dtypes as kvmem dtypes (the reader accepts only these). */
static kvmem_dtype dtype_of(kvm_st_dtype d) {
    return d == KVM_ST_F16 ? KVMEM_F16 : d == KVM_ST_BF16 ? KVMEM_BF16 : KVMEM_F32;
}

/* Copy a tensor as f32 into a fresh buffer after checking its shape. */
static kvmem_status take_t(const unsigned char *data, const kvm_st_tensor *t, int32_t ndim, const int64_t *shape,
                           float **out) {
    int ok = t->ndim == ndim;
    size_t ne = 1;
    for (int d = 0; ok && d < ndim; d++) {
        ok = t->shape[d] == (uint64_t)shape[d];
        ne *= (size_t)shape[d];
    }
    if (!ok) {
        char want_s[64], got[64];
        size_t a = 0, b = 0;
        want_s[0] = got[0] = '\0';
        for (int d = 0; d < ndim; d++) a += (size_t)snprintf(want_s + a, sizeof want_s - a, "[%lld]", (long long)shape[d]);
        for (int d = 0; d < t->ndim && b < sizeof got; d++)
            b += (size_t)snprintf(got + b, sizeof got - b, "[%lld]", (long long)t->shape[d]);
        return kvm_fail(KVMEM_ERR_FORMAT, "qmem head: tensor '%s' has shape %s, expected %s", t->name, got, want_s);
        /* t->name: the reader's NUL-terminated copy */
    }
    float *f = kvm_malloc(KVM_MAX(ne, (size_t)1) * sizeof *f);
    if (!f) return kvm_fail(KVMEM_ERR_NOMEM, "qmem head: out of memory for tensor '%s' (%zu floats)", t->name, ne);
    /* the data may be unaligned (a caller's buffer): convert from a byte copy */
    const kvmem_dtype dt = dtype_of(t->dtype);
    size_t es = kvm_dtype_size(dt);
    unsigned char *tmp = kvm_malloc(KVM_MAX(ne * es, (size_t)1));
    if (!tmp) {
        kvm_free(f);
        return kvm_fail(KVMEM_ERR_NOMEM, "qmem head: out of memory for a copy of tensor '%s' (%zu bytes)", t->name, ne * es);
    }
    memcpy(tmp, data + t->begin, ne * es);
    kvm_convert_host(f, KVMEM_F32, tmp, dt, ne);
    kvm_free(tmp);
    for (size_t i = 0; i < ne; i++)
        if (!isfinite(f[i])) {
            kvm_free(f);
            return kvm_fail(KVMEM_ERR_FORMAT, "qmem head: tensor '%s' has a non-finite value at %zu", t->name, i);
        }
    *out = f;
    return KVMEM_OK;
}

/* The head from the tensors tt (in the order of `names`), checked. */
static kvmem_status head_from(const void *data, size_t doff, const kvm_st_tensor *const *tt, kvmem_qmem_head **out) {
    kvmem_status st;
    /* head_dim from w_k [128][D] */
    if (tt[2]->ndim != 2 || tt[2]->shape[1] < 2 || tt[2]->shape[1] > 1024)
        return kvm_fail(KVMEM_ERR_FORMAT, "qmem head: 'w_k' must be [128][head_dim] with head_dim in [2, 1024]");
    const int64_t D = (int64_t)tt[2]->shape[1], F = 3 * D + 1;
    const int64_t s_alpha[1] = {1}, s_q[2] = {HEAD_XW, F}, s_kv[2] = {HEAD_XW, D}, s_w1[2] = {HEAD_HID, F + HEAD_XW},
                  s_b1[1] = {HEAD_HID}, s_w2[2] = {1, HEAD_HID}, s_b2[1] = {1};
    kvmem_qmem_head *h = kvm_calloc(1, sizeof *h);
    if (!h) return kvm_fail(KVMEM_ERR_NOMEM, "qmem head: out of memory for the head");
    const unsigned char *d0 = (const unsigned char *)data + doff;
    float *alpha = NULL, *b2 = NULL;
    st = take_t(d0, tt[0], 1, s_alpha, &alpha);
    if (st == KVMEM_OK) st = take_t(d0, tt[1], 2, s_q, &h->w_q);
    if (st == KVMEM_OK) st = take_t(d0, tt[2], 2, s_kv, &h->w_k);
    if (st == KVMEM_OK) st = take_t(d0, tt[3], 2, s_kv, &h->w_v);
    if (st == KVMEM_OK) st = take_t(d0, tt[4], 2, s_w1, &h->w1);
    if (st == KVMEM_OK) st = take_t(d0, tt[5], 1, s_b1, &h->b1);
    if (st == KVMEM_OK) st = take_t(d0, tt[6], 2, s_w2, &h->w2);
    if (st == KVMEM_OK) st = take_t(d0, tt[7], 1, s_b2, &b2);
    if (st != KVMEM_OK) {
        kvm_free(alpha);
        kvm_free(b2);
        kvmem_qmem_head_free(h);
        return st;
    }
    h->D = (int32_t)D;
    h->F = (int32_t)F;
    h->alpha = alpha[0] > HEAD_ALPHA_MAX ? HEAD_ALPHA_MAX : alpha[0] < -HEAD_ALPHA_MAX ? -HEAD_ALPHA_MAX : alpha[0];
    h->b2 = b2[0];
    kvm_free(alpha);
    kvm_free(b2);
    *out = h;
    return KVMEM_OK;
}

kvmem_status kvmem_qmem_head_load_buffer(const void *data, size_t size, kvmem_qmem_head **out) {
    static const char *const names[] = {"alpha", "w_q", "w_k", "w_v", "mlp.0.weight", "mlp.0.bias",
                                        "mlp.2.weight", "mlp.2.bias"};
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_head_load: out is NULL");
    if (!data && size) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_head_load: data is NULL");
    /* the one strict reader: header, entries and layout; then the head's own rules */
    kvm_st_rules rules = kvm_st_default_rules();
    rules.dtypes = KVM_ST_DTYPE_BIT(KVM_ST_F32) | KVM_ST_DTYPE_BIT(KVM_ST_F16) | KVM_ST_DTYPE_BIT(KVM_ST_BF16);
    rules.max_tensors = 32;
    rules.max_dims = 4;
    rules.quote = 1; /* weights the caller chose to load: naming their tensors helps */
    kvm_st_header hdr;
    size_t doff = 0;
    kvmem_status st = kvm_st_read(data, size, HEAD_MAX_HEADER, &rules, &hdr, &doff);
    if (st != KVMEM_OK) {
        char why[400]; /* the reader's message, copied: kvm_fail writes the same buffer */
        snprintf(why, sizeof why, "%s", kvmem_last_error());
        kvm_st_header_free(&hdr);
        return kvm_fail(st, "qmem head: %s", why);
    }
    const kvm_st_tensor *tt[8];
    for (int32_t i = 0; i < hdr.n_tensors && st == KVMEM_OK; i++) {
        int known = 0;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) known |= strcmp(hdr.tensors[i].name, names[k]) == 0;
        if (!known) st = kvm_fail(KVMEM_ERR_FORMAT, "qmem head: unexpected tensor '%.64s'", hdr.tensors[i].name);
    }
    for (size_t k = 0; k < 8 && st == KVMEM_OK; k++) {
        tt[k] = kvm_st_find(&hdr, names[k]);
        if (!tt[k]) st = kvm_fail(KVMEM_ERR_FORMAT, "qmem head: tensor '%s' is missing", names[k]);
    }
    if (st == KVMEM_OK) st = head_from(data, doff, tt, out);
    kvm_st_header_free(&hdr);
    return st;
}


kvmem_status kvmem_qmem_head_load(const char *path, kvmem_qmem_head **out) {
    if (!path || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_qmem_head_load: path or out is NULL");
    FILE *f = fopen(path, "rb");
    if (!f) return kvm_fail(KVMEM_ERR_IO, "kvmem_qmem_head_load: cannot open '%s'", path);
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            if (cap >= ((size_t)1 << 30)) {
                fclose(f);
                kvm_free(buf);
                return kvm_fail(KVMEM_ERR_FORMAT, "kvmem_qmem_head_load: '%s' is larger than 1 GiB", path);
            }
            cap = cap ? cap * 2 : 1 << 16;
            unsigned char *p = kvm_realloc(buf, cap);
            if (!p) {
                fclose(f);
                kvm_free(buf);
                return kvm_fail(KVMEM_ERR_NOMEM, "kvmem_qmem_head_load: out of memory for a %zu-byte read buffer", cap);
            }
            buf = p;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        kvm_free(buf);
        return kvm_fail(KVMEM_ERR_IO, "kvmem_qmem_head_load: read error on '%s'", path);
    }
    kvmem_status st = kvmem_qmem_head_load_buffer(buf, n, out);
    kvm_free(buf);
    return st;
}

static float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

static float dotf(const float *a, const float *b, size_t n) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

kvmem_status kvmem_qmem_head_apply(const kvmem_qmem_head *h, const kvmem_model_spec *spec, const float *memory,
                                   const kvmem_tensor *k, const float *rule, int64_t span_begin, int64_t span_end,
                                   float *scores_out) {
    static const char fn[] = "kvmem_qmem_head_apply";
    if (!h) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: head is NULL", fn);
    int64_t N;
    kvmem_status st = kvm_qmem_check_k(fn, spec, k, &N);
    if (st != KVMEM_OK) return st;
    if (!memory || !rule || !scores_out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: memory, rule or scores_out is NULL", fn);
    if (spec->head_dim != h->D)
        return kvm_fail(KVMEM_ERR_MISMATCH, "%s: spec head_dim %d, the head was trained for %d", fn, spec->head_dim, h->D);
    if (span_begin < 0 || span_end <= span_begin || span_end > N)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: query span [%lld, %lld) is empty or outside [0, N = %lld)", fn,
                        (long long)span_begin, (long long)span_end, (long long)N);
    const size_t L = (size_t)spec->n_layers, Hq = (size_t)spec->n_q_heads, Hkv = (size_t)spec->n_kv_heads;
    const size_t D = (size_t)h->D, F = (size_t)h->F, X = F + HEAD_XW, S = (size_t)(span_end - span_begin);
    const size_t n = (size_t)N;
    float *kbar = kvm_malloc(n * D * sizeof *kbar), *row = kvm_malloc(D * sizeof *row);
    float *kk = kvm_malloc(S * HEAD_XW * sizeof *kk), *vv = kvm_malloc(S * HEAD_XW * sizeof *vv);
    float *att = kvm_malloc(S * sizeof *att), *mbar = kvm_calloc(D, sizeof *mbar), *x = kvm_malloc(X * sizeof *x);
    if (!kbar || !row || !kk || !vv || !att || !mbar || !x) {
        st = kvm_fail(KVMEM_ERR_NOMEM, "%s: out of memory for scratch of %zu candidates", fn, n);
        goto done;
    }
    /* Means over layers and expanded query heads: each KV head stands for
     * G query heads, so the mean over KV heads is the same number. */
    for (size_t r = 0; r < L * Hq; r++)
        for (size_t d = 0; d < D; d++) mbar[d] += memory[r * D + d];
    for (size_t d = 0; d < D; d++) mbar[d] /= (float)(L * Hq);
    for (size_t j = 0; j < n; j++) {
        float *kb = kbar + j * D;
        memset(kb, 0, D * sizeof *kb);
        for (size_t l = 0; l < L; l++)
            for (size_t g = 0; g < Hkv; g++) {
                int64_t idx[3] = {(int64_t)l, (int64_t)j, (int64_t)g};
                kvm_tensor_read_f32(k, kvm_tensor_row_offset(k, idx), row, D);
                for (size_t d = 0; d < D; d++) kb[d] += row[d];
            }
        for (size_t d = 0; d < D; d++) kb[d] /= (float)(L * Hkv);
    }
    /* every K value went into a mean: a non-finite one shows there (and the
     * inputs are checked before anything is written to scores_out) */
    for (size_t i = 0; i < n * D; i++)
        if (!isfinite(kbar[i])) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: K of candidate %zu holds a non-finite value", fn, i / D);
            goto done;
        }
    for (size_t j = 0; j < n; j++)
        if (!isfinite(rule[j])) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: rule[%zu] is not finite", fn, j);
            goto done;
        }
    for (size_t i = 0; i < L * Hq * D; i++)
        if (!isfinite(memory[i])) {
            st = kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: memory[%zu] is not finite", fn, i);
            goto done;
        }
    for (size_t i = 0; i < S; i++)
        for (size_t o = 0; o < HEAD_XW; o++) {
            kk[i * HEAD_XW + o] = dotf(h->w_k + o * D, kbar + ((size_t)span_begin + i) * D, D);
            vv[i * HEAD_XW + o] = dotf(h->w_v + o * D, kbar + ((size_t)span_begin + i) * D, D);
        }
    const size_t hw = HEAD_XW / HEAD_XH;
    const float sc = 1.0f / sqrtf((float)hw);
    for (size_t j = 0; j < n; j++) {
        const float *kb = kbar + j * D;
        for (size_t d = 0; d < D; d++) {
            x[d] = kb[d];
            x[D + d] = mbar[d];
            x[2 * D + d] = kb[d] * mbar[d];
        }
        x[3 * D] = rule[j];
        float qv[HEAD_XW];
        for (size_t o = 0; o < HEAD_XW; o++) qv[o] = dotf(h->w_q + o * F, x, F);
        float *c = x + F;
        for (size_t a = 0; a < HEAD_XH; a++) {
            float mx = -INFINITY, sum = 0.0f;
            for (size_t i = 0; i < S; i++) {
                att[i] = dotf(qv + a * hw, kk + i * HEAD_XW + a * hw, hw) * sc;
                mx = att[i] > mx ? att[i] : mx;
            }
            for (size_t i = 0; i < S; i++) {
                att[i] = expf(att[i] - mx);
                sum += att[i];
            }
            for (size_t o = 0; o < hw; o++) {
                float v = 0.0f;
                for (size_t i = 0; i < S; i++) v += att[i] * vv[i * HEAD_XW + a * hw + o];
                c[a * hw + o] = v / sum;
            }
        }
        float out = h->b2;
        for (size_t u = 0; u < HEAD_HID; u++) out += h->w2[u] * gelu(h->b1[u] + dotf(h->w1 + u * X, x, X));
        scores_out[j] = rule[j] + h->alpha * out;
    }
    st = KVMEM_OK;
done:
    kvm_free(kbar);
    kvm_free(row);
    kvm_free(kk);
    kvm_free(vv);
    kvm_free(att);
    kvm_free(mbar);
    kvm_free(x);
    return st;
}

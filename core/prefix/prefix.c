/* Character-level prefix matching between an agent's stored text and a new
 * prompt (the "Semantic" rule): EXACT, EXTEND or DIVERGE, and how many
 * tokens of the cache stay valid. */
#include "../pool/pool.h"

#include <string.h>

kvmem_status kvmem_prefix_params_init(kvmem_prefix_params *params, size_t struct_size) {
    kvmem_prefix_params p;
    memset(&p, 0, sizeof p);
    p.min_ratio = 0.8;
    return KVM_PARAMS_INIT(kvmem_prefix_params, params, struct_size, &p, "kvmem_prefix_params_init");
}

static int cont(unsigned char c) { return (c & 0xc0) == 0x80; }

/* Leading tokens whose whole text lies in [0, c): token i spans
 * [off_i, off_{i+1}) (the last one up to the end of the text). A token with
 * an unknown offset ends the run. */
static int64_t whole_tokens(const kvm_agent_mem *m, size_t c) {
    int64_t k = 0;
    for (; k < m->n_tokens; k++) {
        int64_t b = m->token_text_off[k];
        int64_t e = k + 1 < m->n_tokens ? m->token_text_off[k + 1] : (int64_t)m->text_len;
        if (b < 0 || e < 0 || (size_t)e > c) break;
    }
    return k;
}

static kvmem_status prefix_match_taken(kvmem_agent *a, const char *new_text, size_t new_len, const kvmem_prefix_params *params,
                                kvmem_prefix_result *out) {
    kvmem_status st = kvm_agent_check(a, "kvmem_prefix_match");
    if (st != KVMEM_OK) return st;
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_prefix_match: out is NULL");
    if (!new_text && new_len) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_prefix_match: new_text is NULL with length %zu", new_len);
    kvmem_prefix_params pp = kvmem_prefix_default_params();
    if ((st = KVM_PARAMS_IN(kvmem_prefix_params, &pp, params, "kvmem_prefix_match")) != KVMEM_OK) return st;
    if (!(pp.min_ratio >= 0.0 && pp.min_ratio <= 1.0))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_prefix_match: min_ratio %g outside [0, 1]", pp.min_ratio);
    const kvm_agent_mem *m = a->mem;
    const unsigned char *S = (const unsigned char *)m->text, *N = (const unsigned char *)new_text;
    size_t s = m->text_len;
    memset(out, 0, sizeof *out);
    if (m->n_tokens > 0 && s == 0) { /* tokens without text: nothing to compare with */
        out->kind = new_len ? KVMEM_PREFIX_DIVERGE : KVMEM_PREFIX_EXACT;
        return KVMEM_OK;
    }
    size_t c = 0;
    while (c < s && c < new_len && S[c] == N[c]) c++;
    /* a character split between the two texts is not common */
    while (c > 0 && ((c < s && cont(S[c])) || (c < new_len && cont(N[c])))) c--;
    out->common_bytes = c;
    if (c == s && c == new_len) {
        out->kind = KVMEM_PREFIX_EXACT;
        out->reuse_tokens = m->n_tokens > 0 ? m->n_tokens - 1 : 0;
        int64_t o = m->n_tokens > 0 ? m->token_text_off[m->n_tokens - 1] : -1;
        out->process_from = o >= 0 ? (size_t)o : s;
    } else if (c == s) {
        out->kind = KVMEM_PREFIX_EXTEND;
        out->reuse_tokens = m->n_tokens;
        out->process_from = s;
    } else {
        out->kind = KVMEM_PREFIX_DIVERGE;
        if ((double)c >= pp.min_ratio * (double)s && c > 0) {
            int64_t k = whole_tokens(m, c);
            out->reuse_tokens = k;
            out->process_from = k == 0 ? 0 : k < m->n_tokens ? (size_t)m->token_text_off[k] : s;
        }
    }
    return KVMEM_OK;
}

kvmem_status kvmem_prefix_match(kvmem_agent *a, const char *new_text, size_t new_len, const kvmem_prefix_params *params,
                                kvmem_prefix_result *out) {
    kvmem_status st = kvm_agent_enter(a, "kvmem_prefix_match");
    if (st != KVMEM_OK) return st;
    st = prefix_match_taken(a, new_text, new_len, params, out);
    kvm_agent_leave(a);
    return st;
}

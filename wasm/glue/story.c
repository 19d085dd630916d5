/* Glue for the real-model story (examples/tinyllm/story_session.c, the
 * tinyllm engine compiled into the module): flat arguments, kvmem statuses,
 * messages through kvmem_last_error() like the rest of the glue. Strings
 * come in as (bytes, length) so text may hold any byte; strings going out
 * are malloc'd and freed by kvmem.js. */
#include "glue.h"

#include "story_session.h"

#include <stdlib.h>

kvmem_status kvmw_story_open(const uint8_t *model, double model_size, const uint8_t *tok, double tok_size,
                             tl_story **out) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!model || !(model_size > 0)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "no model file given (0 bytes)");
    if (tok_size < 0 || (!tok && tok_size > 0)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "bad tokenizer bytes");
    char err[TL_ERR_SIZE] = "";
    if (tl_story_open_bytes(model, (size_t)model_size, tok, (size_t)tok_size, out, err, sizeof err))
        return kvm_fail(KVMEM_ERR_FORMAT, "%s", err[0] ? err : "the model or tokenizer did not load");
    return KVMEM_OK;
}

void kvmw_story_free(tl_story *s) { tl_story_free(s); }

kvmem_status kvmw_story_reset(tl_story *s) {
    if (!s) return kvm_fail(KVMEM_ERR_INVALID_ARG, "story is NULL");
    char err[TL_ERR_SIZE] = "";
    if (tl_story_reset(s, err, sizeof err)) return kvm_fail(KVMEM_ERR_NOMEM, "reset: %s", err);
    return KVMEM_OK;
}

double kvmw_story_history(tl_story *s) { return (double)tl_story_history(s); }

kvmem_status kvmw_story_describe(tl_story *s, char **out) {
    if (!s || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "story and out must not be NULL");
    *out = tl_story_describe(s);
    return *out ? KVMEM_OK : kvm_fail(KVMEM_ERR_NOMEM, "out of memory");
}

kvmem_status kvmw_story_session(tl_story *s, const char *text, int32_t len, int32_t art, int32_t art_tile,
                                char **json) {
    if (!s || !json || len < 0 || (!text && len)) return kvm_fail(KVMEM_ERR_INVALID_ARG, "bad story session arguments");
    tl_story_opts o = {0}; /* the defaults but ART */
    o.art = art != 0;
    o.art_tile = art_tile;
    char err[TL_ERR_SIZE] = "";
    if (tl_story_session(s, text, (size_t)len, &o, json, err, sizeof err))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s", err[0] ? err : "the session failed");
    return KVMEM_OK;
}

kvmem_status kvmw_story_encode(tl_story *s, const char *text, int32_t len, int32_t bos, int32_t *out, int32_t cap,
                               int32_t *n_out) {
    if (!s || len < 0 || (!text && len) || !out || cap < 1 || !n_out)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "bad encode arguments");
    char err[TL_ERR_SIZE] = "";
    if (tl_story_encode(s, text, (size_t)len, bos, out, cap, n_out, err, sizeof err))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "encode: %s", err[0] ? err : "failed");
    return KVMEM_OK;
}

kvmem_status kvmw_story_decode(tl_story *s, const int32_t *ids, int32_t n, char **out) {
    if (!s || n < 0 || (!ids && n) || !out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "bad decode arguments");
    *out = tl_story_decode(s, ids, n);
    return *out ? KVMEM_OK : kvm_fail(KVMEM_ERR_INVALID_ARG, "decode: a token id outside the vocabulary");
}

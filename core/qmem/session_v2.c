/* kvmem_session_key_derive_v2: the source struct with struct_size first
 * (kvmem.h, "ABI and versioning"), read as params structs are
 * (core/params.h), then the same derivation. New source fields are read
 * here when they come. */
#include "qmem_internal.h"

kvmem_status kvmem_session_key_derive_v2(const kvmem_qmem_store *store, const kvmem_session_source_v2 *src,
                                         kvmem_session_key *out) {
    static const char fn[] = "kvmem_session_key_derive_v2";
    if (!src) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: src is NULL", fn);
    kvmem_session_source_v2 s;
    kvmem_session_source_v2_init(&s);
    kvmem_status st = KVM_PARAMS_IN(kvmem_session_source_v2, &s, src, fn);
    if (st != KVMEM_OK) return st;
    const kvmem_session_source v1 = {s.session_id, s.token_ids, s.n_tokens, s.mark_begin, s.mark_end};
    return kvmem_session_key_derive(store, &v1, out);
}

/* kvmem_attend_v2: the source struct with struct_size first (kvmem.h, "ABI
 * and versioning"), read as params structs are (core/params.h), then the
 * same call. New source fields are read here when they come. */
#include "attend.h"
#include "../backend/route/context.h"

kvmem_status kvmem_attend_v2(kvmem_context *ctx, const kvmem_tensor *q, const kvmem_attend_source_v2 *source,
                             const kvmem_attend_params *params, const kvmem_tensor *out, kvmem_attend_stats *stats) {
    static const char fn[] = "kvmem_attend_v2";
    int own = ctx ? kvm_err_begin(&ctx->err) : 0; /* failures are the context's last error too */
    kvmem_attend_source_v2 s;
    kvmem_attend_source_v2_init(&s);
    kvmem_status st = source ? KVM_PARAMS_IN(kvmem_attend_source_v2, &s, source, fn)
                             : kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: source is NULL", fn);
    if (st == KVMEM_OK) st = kvm_params_reserved(s.reserved, "kvmem_attend_source_v2", fn);
    if (st == KVMEM_OK) {
        kvmem_attend_source v1 = {s.kind,  s.layer, s.k,          s.v,     s.slots,         s.n_positions,
                                  s.dead_slot, 0,   s.agent,      s.positions, s.base_position, s.mask};
        st = kvmem_attend(ctx, q, &v1, params, out, stats);
    }
    kvm_err_end(own);
    return st;
}

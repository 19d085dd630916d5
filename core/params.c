/* The params copy-in shared by every public function (params.h). */
#include "params.h"

#include "internal.h"

#include <stdalign.h>
#include <stdio.h>
#include <string.h>

/* Each params struct: struct_size first, and no trailing padding (a
 * reserved field fills it). Without padding at the end, a field added later
 * starts at the old sizeof, so an older binary's struct_size covers exactly
 * the fields it knows; a field slipped into old padding would read as
 * whatever garbage older binaries leave there. Appending a field means
 * naming it here as the new last one. */
#define KVM_PARAMS_LAYOUT(type, last)                                                             \
    _Static_assert(offsetof(type, struct_size) == 0, #type ": struct_size must be the first field"); \
    _Static_assert(sizeof(type) == offsetof(type, last) + sizeof(((type *)0)->last),              \
                   #type ": no padding after `" #last "`: end it with an int32_t reserved field")

KVM_PARAMS_LAYOUT(kvmem_context_params, reserved);
KVM_PARAMS_LAYOUT(kvmem_pool_params, device_capacity_bytes);
KVM_PARAMS_LAYOUT(kvmem_append_params, reserved);
KVM_PARAMS_LAYOUT(kvmem_retrieve_params, reserved);
KVM_PARAMS_LAYOUT(kvmem_qmem_params, lambda);
KVM_PARAMS_LAYOUT(kvmem_kvstore_params, max_slots);
KVM_PARAMS_LAYOUT(kvmem_attend_params, reserved);
KVM_PARAMS_LAYOUT(kvmem_prefix_params, min_ratio);
KVM_PARAMS_LAYOUT(kvmem_segments_params, max_segments);
KVM_PARAMS_LAYOUT(kvmem_kmeans_params, seed);
KVM_PARAMS_LAYOUT(kvmem_multihop_params, max_iters);
KVM_PARAMS_LAYOUT(kvmem_load_plan_params, reserved);
/* the growable forms of the source structs follow the same rules */
KVM_PARAMS_LAYOUT(kvmem_attend_source_v2, base_position);
KVM_PARAMS_LAYOUT(kvmem_session_source_v2, mark_end);
KVM_PARAMS_LAYOUT(kvmem_model_spec_v2, model_id);

/* The function that sets a struct's size, for messages:
 * "kvmem_attend_default_params()" for "kvmem_attend_params",
 * "kvmem_attend_source_v2_init()" for the other growable structs. */
static void setter_name(const char *type, char *out, size_t size) {
    size_t n = strlen(type);
    const size_t suffix = sizeof "_params" - 1;
    if (n > suffix && strcmp(type + n - suffix, "_params") == 0)
        snprintf(out, size, "%.*s_default_params()", (int)(n - suffix), type);
    else
        snprintf(out, size, "%s_init()", type);
}

/* A size some version of a params struct can have: it holds struct_size,
 * is a multiple of that field's alignment (every struct holding a size_t
 * is), and stays below the bound. */
static kvmem_status check_size(size_t size, size_t dst_size, const char *type, const char *fn) {
    char setter[96];
    setter_name(type, setter, sizeof setter);
    const int is_params = strstr(setter, "_default_params()") != NULL;
    if (size == 0)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: %s.struct_size is 0: start from %s, which sets it%s", fn, type,
                        setter, is_params ? ", or pass NULL for the defaults" : "");
    if (size < sizeof(size_t) || size % alignof(size_t) != 0 || size > KVM_PARAMS_MAX_SIZE)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: %s.struct_size %zu is not the size of any version of it (this library's is "
                        "%zu): start from %s, which sets it",
                        fn, type, size, dst_size, setter);
    return KVMEM_OK;
}

kvmem_status kvm_params_in(void *dst, size_t dst_size, const void *src, const char *type, const char *fn) {
    if (!src) return KVMEM_OK;
    size_t size;
    memcpy(&size, src, sizeof size); /* struct_size, the first field of every params struct */
    kvmem_status st = check_size(size, dst_size, type, fn);
    if (st != KVMEM_OK) return st;
    if (size > dst_size) {
        /* A newer binary: its extra fields must all be left at zero. */
        const unsigned char *tail = (const unsigned char *)src;
        for (size_t i = dst_size; i < size; i++)
            if (tail[i] != 0)
                return kvm_fail(KVMEM_ERR_UNSUPPORTED,
                                "%s: %s has %zu bytes, this library (kvmem %s) knows %zu: byte %zu is set, "
                                "a field this version does not have (use a newer libkvmem, or leave it zero)",
                                fn, type, size, kvmem_version(), dst_size, i);
        size = dst_size;
    }
    memcpy(dst, src, size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return KVMEM_OK;
}

kvmem_status kvm_params_init(void *params, size_t struct_size, const void *defaults, size_t dst_size,
                             const char *type, const char *fn) {
    if (!params) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: params is NULL", fn);
    kvmem_status st = check_size(struct_size, dst_size, type, fn);
    if (st != KVMEM_OK) return st;
    unsigned char *out = params;
    const size_t n = struct_size < dst_size ? struct_size : dst_size;
    memcpy(out, defaults, n);
    if (struct_size > n) memset(out + n, 0, struct_size - n); /* a newer caller's fields: "as before" */
    memcpy(out, &struct_size, sizeof struct_size);
    return KVMEM_OK;
}

kvmem_status kvm_params_reserved(int32_t value, const char *type, const char *fn) {
    if (value == 0) return KVMEM_OK;
    return kvm_fail(KVMEM_ERR_UNSUPPORTED,
                    "%s: %s.reserved is %d: it must be 0 (a field of a newer kvmem this library does not have)",
                    fn, type, (int)value);
}

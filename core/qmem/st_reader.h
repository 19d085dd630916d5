/* A minimal, strict safetensors reader for the residual head's weights,
 * over the project's strict JSON reader (core/store/json.h): it accepts F32/F16/BF16 tensors of up to 4 dims, names up to 63 bytes,
 * an optional "__metadata__" object of strings, and rejects everything
 * else: bad header length, malformed JSON, duplicate names, unknown keys,
 * offsets out of bounds, overlapping or mis-sized data. */
#ifndef KVMEM_QMEM_ST_READER_H
#define KVMEM_QMEM_ST_READER_H

#include "../internal.h"

#define KVM_ST_MAX_TENSORS 32

typedef struct kvm_st_tensor {
    char name[64];
    kvmem_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    size_t begin, end; /* byte offsets into the data section */
} kvm_st_tensor;

/* Parse the header of a safetensors image of `size` bytes. Fills up to
 * KVM_ST_MAX_TENSORS entries, *n_out their number and *data_off the offset
 * of the data section in buf. Errors: KVMEM_ERR_FORMAT, KVMEM_ERR_CORRUPT. */
kvmem_status kvm_st_parse(const unsigned char *buf, size_t size, kvm_st_tensor *out, int *n_out,
                          size_t *data_off);

#endif

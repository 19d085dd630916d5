/* Host tensor views (kvmem_tensor): validation against an expected shape,
 * and rows read and written in any tensor dtype through the CPU kernels. */
#ifndef KVMEM_TENSOR_H
#define KVMEM_TENSOR_H

#include "../internal.h"

/* Convert n elements between F32/F16/BF16 on the host (the CPU kernels). */
void kvm_convert_host(void *dst, kvmem_dtype dst_dtype, const void *src, kvmem_dtype src_dtype,
                      size_t n);

/* Check that t is a readable/writable view of dtype F32/F16/BF16 with
 * exactly `shape` (ndim dims). `what` names it in messages ("K"), `dims`
 * spells the layout ("[n_layers][T][n_kv_heads][head_dim]"). */
kvmem_status kvm_tensor_expect(const kvmem_tensor *t, const char *what, const char *dims, int32_t ndim,
                               const int64_t *shape);

/* Element offset of the row at index idx[0..ndim-2] (last dim 0). */
static inline int64_t kvm_tensor_row_offset(const kvmem_tensor *t, const int64_t *idx) {
    int64_t off = 0;
    for (int32_t d = 0; d + 1 < t->ndim; d++) off += idx[d] * t->strides[d];
    return off;
}

/* Read n elements of the last dimension starting at element offset `off`
 * into dst as f32. */
void kvm_tensor_read_f32(const kvmem_tensor *t, int64_t off, float *dst, size_t n);
/* Write n f32 values to the last dimension at element offset `off`. */
void kvm_tensor_write_f32(const kvmem_tensor *t, int64_t off, const float *src, size_t n);

#endif

/* Internal helpers shared by core/qmem and core/evict. */
#ifndef KVMEM_QMEM_INTERNAL_H
#define KVMEM_QMEM_INTERNAL_H

#include "../backend/backend.h"
#include "../internal.h"
#include "../cpu/tensor.h"

/* Validate spec and K = [n_layers][N][n_kv_heads][head_dim] with N >= 1;
 * *n gets N. `fn` names the caller in messages. */
kvmem_status kvm_qmem_check_k(const char *fn, const kvmem_model_spec *spec, const kvmem_tensor *k,
                              int64_t *n);

#endif

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

/* The rule score on the CPU (kvmem_qmem_score calls it when no device op
 * takes the call; inputs validated by the caller). */
kvmem_status kvm_cpu_qmem_score(kvmem_backend *be, const kvmem_model_spec *spec, const float *memory,
                                const kvmem_tensor *k, float *scores);

/* The CPU backend's dev_qmem_score (core/backend/backend.h): the reference the
 * device backends are compared with (qmem_dev.c). */
kvmem_status kvm_cpu_dev_qmem_score(kvmem_backend *be, const struct kvm_dev_qmem_args *a);

#endif

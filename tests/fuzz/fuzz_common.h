/* Shared by the fuzz harness and its seed generator: the pools a fuzz input
 * is loaded into. Input byte 0 picks the target (modulo 5): 0 = the JSON
 * reader, 1..3 = the agent-file loader into an F16, Q4 or Q8 pool of this
 * spec, 4 = the safetensors reader alone (bit 3: names quoted). */
#ifndef KVMEM_FUZZ_COMMON_H
#define KVMEM_FUZZ_COMMON_H

#include "kvmem.h"

#include <stdio.h>

static const kvmem_dtype kvm_fuzz_dtypes[3] = {KVMEM_F16, KVMEM_Q4, KVMEM_Q8};

static inline kvmem_model_spec kvm_fuzz_spec(void) {
    kvmem_model_spec s = kvmem_model_spec_default();
    s.n_layers = 2;
    s.n_q_heads = 2;
    s.n_kv_heads = 1;
    s.head_dim = 80; /* partial Q4/Q8 groups */
    snprintf(s.model_id, sizeof s.model_id, "fuzz-model");
    return s;
}

static inline kvmem_pool_params kvm_fuzz_params(int which) {
    kvmem_pool_params p = kvmem_pool_default_params();
    p.block_size = 4;
    p.storage_dtype = kvm_fuzz_dtypes[which];
    p.capacity_bytes = (uint64_t)64 << 20;
    return p;
}

#endif

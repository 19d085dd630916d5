/* dev_qmem_score on the CPU backend: the buffer-level form of the rule
 * score, the reference every device backend's entry is compared with. The
 * buffers are host memory, so this builds host views and runs the same
 * kernel as kvmem_qmem_score (kvm_cpu_qmem_score). */
#include "qmem_internal.h"
#include "../cpu/cpu_backend.h"

#include <string.h>

kvmem_status kvm_cpu_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    static const char op[] = "dev_qmem_score";
    if (!a) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: args is NULL", op);
    if (a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1 || a->n < 1 ||
        a->n_q_heads % a->n_kv_heads)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: need n_layers, n_q_heads, n_kv_heads, head_dim, n >= 1 and n_q_heads a multiple of "
                        "n_kv_heads (got %d, %d, %d, %d, %d)",
                        op, a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n);
    size_t L = (size_t)a->n_layers, Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads, D = (size_t)a->head_dim,
           N = (size_t)a->n, mb, kb;
    if (a->mem_off % 4 || a->k_off % 4 || a->scores_off % 4)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: offsets must be multiples of 4 bytes", op);
    const float *mem = NULL, *k = NULL;
    float *scores = NULL;
    if (kvm_mul_size(L * Hq, D * 4, &mb) && kvm_mul_size(L * N, Hkv, &kb) && kvm_mul_size(kb, D * 4, &kb)) {
        mem = kvm_cpu_buf_at(a->mem, a->mem_off, mb);
        k = kvm_cpu_buf_at(a->k, a->k_off, kb);
        scores = kvm_cpu_buf_at(a->scores, a->scores_off, N * 4);
    }
    if (!mem || !k || !scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ranges outside the buffers", op);
    kvmem_model_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.n_layers = a->n_layers;
    spec.n_q_heads = a->n_q_heads;
    spec.n_kv_heads = a->n_kv_heads;
    spec.head_dim = a->head_dim;
    kvmem_tensor kt;
    memset(&kt, 0, sizeof kt);
    kt.data = (void *)(uintptr_t)k; /* read only */
    kt.dtype = KVMEM_F32;
    kt.ndim = 4;
    int64_t shape[4] = {a->n_layers, a->n, a->n_kv_heads, a->head_dim};
    int64_t stride = 1;
    for (int d = 3; d >= 0; d--) {
        kt.shape[d] = shape[d];
        kt.strides[d] = stride;
        stride *= shape[d];
    }
    return kvm_cpu_qmem_score(be, &spec, mem, &kt, scores);
}

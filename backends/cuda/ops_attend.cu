// The IntentKV rule score proc of the CUDA backend (qmem_score.cuh); the
// table's dev_qmem_score is in dev_attend.cu.
#include "backend_impl.h"
#include "qmem_score.cuh"

#include <math.h>

extern "C" kvmem_status kvm_cu_op_qmem_score(kvmem_backend *be, const kvmem_cuda_qmem_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "qmem_score: NULL argument");
    kvm_cu_backend *b = cu_impl(be);
    if (a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->n_q_heads % a->n_kv_heads || a->n < 1)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "qmem_score: %d layers, %d/%d heads, %d candidates: bad shape",
                           a->n_layers, a->n_q_heads, a->n_kv_heads, a->n);
    if (!kvm_cu_head_dim_supported(a->head_dim))
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "qmem_score: head_dim %d has no CUDA kernel (64, 128, 256)", a->head_dim);
    size_t es;
    if (!kvm_cu_tensor_bytes(a->dtype, 1, &es)) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "qmem_score: bad dtype");
    const size_t L = (size_t)a->n_layers, D = (size_t)a->head_dim, N = (size_t)a->n;
    kvmem_status st = KVMEM_OK;
    const float *mem = static_cast<const float *>(cu_ref(a->mem, L * a->n_q_heads * D * 4, "qmem_score: mem", &st));
    const void *k = cu_ref(a->k, L * N * a->n_kv_heads * D * es, "qmem_score: k", &st);
    float *rule = static_cast<float *>(cu_ref(a->rule, N * 4, "qmem_score: rule", &st));
    float *ws = static_cast<float *>(cu_scratch(b, L * a->n_q_heads * N * 4, &st));
    if (st != KVMEM_OK) return st;
    cudaSetDevice(b->device);
    return cu_check(kvmcu::qmem_score(mem, k, (kvmcu::DType)a->dtype, a->n_layers, a->n_q_heads, a->n_kv_heads,
                                      a->head_dim, a->n, a->scale > 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim), ws,
                                      rule, b->stream),
                    "qmem_score");
}

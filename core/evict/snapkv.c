/* kvmem_snapkv_score: the arguments checked here, the scores computed by
 * the CPU backend (cpu/ops_snapkv.c). */
#include "../backend/route/context.h"
#include "../cpu/cpu_backend.h"
#include "../qmem/qmem_internal.h"

kvmem_status kvmem_snapkv_score(kvmem_context *ctx, const kvmem_model_spec *spec, const kvmem_tensor *q_obs,
                                const kvmem_tensor *k, int32_t pool_kernel, float *scores) {
    static const char fn[] = "kvmem_snapkv_score";
    if (!ctx) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: ctx is NULL", fn);
    int64_t N;
    kvmem_status st = kvm_qmem_check_k(fn, spec, k, &N);
    if (st != KVMEM_OK) return st;
    if (!q_obs) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: q_obs is NULL", fn);
    if (q_obs->ndim != 4 || q_obs->shape[0] < 1 || q_obs->shape[0] > N)
        return kvm_fail(KVMEM_ERR_INVALID_ARG,
                        "%s: q_obs must be [W][n_layers][n_q_heads][head_dim] with W in [1, N = %lld]", fn,
                        (long long)N);
    int64_t qs[4] = {q_obs->shape[0], spec->n_layers, spec->n_q_heads, spec->head_dim};
    st = kvm_tensor_expect(q_obs, "q_obs", "[W][n_layers][n_q_heads][head_dim]", 4, qs);
    if (st != KVMEM_OK) return st;
    if (pool_kernel < 1 || pool_kernel % 2 == 0 || pool_kernel > 1025)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: pool kernel %d must be odd, in [1, 1025]", fn, pool_kernel);
    if (!scores) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: scores is NULL", fn);

    return kvm_cpu_snapkv_score(ctx->cpu, spec, q_obs, k, pool_kernel, scores);
}

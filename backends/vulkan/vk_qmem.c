/* dev_qmem_score on Vulkan (shaders/qmem_score.comp): per (layer, query
 * head) softmax statistics, then per token the sum over layers and heads,
 * in one submission: each pass is as many dispatches (ranges of tokens,
 * ranges of (layer, head) slices) as keep an invocation within the loop
 * budget (vk_internal.h). Validation mirrors the CPU reference entry
 * (core/qmem/qmem_dev.c). */
#include "vk_internal.h"
#include "arith.h"

#include <string.h>

static kvm_vk *impl(kvmem_backend *be) { return be->impl; }

/* sqrt(x) for x >= 1 by Newton's iteration from above (the plugin does not
 * link libm): converges to within an ulp of the correctly rounded root, so
 * (float)(1 / root) is the CPU's 1/sqrt(D) in float. */
static double root(double x) {
    double s = x, prev;
    do {
        prev = s;
        s = 0.5 * (s + x / s);
    } while (s < prev);
    return prev < s ? prev : s;
}

/* The buffer holds [off, off + 4*el) and shaders index it with 32 bits. */
static int holds(const kvmem_buffer *b, size_t off, size_t el) {
    size_t bytes;
    return b && off % 4 == 0 && off / 4 + el <= UINT32_MAX && kvm_mul_size(el, 4, &bytes) && off <= b->size &&
           bytes <= b->size - off;
}

/* Loop iterations of the shader, each loop at its largest trip count plus
 * one for the exit test: pass 0 per 128 tokens of a range (a logit: D + 1),
 * plus the reduction and the combine; pass 1 per slice of one token. */
#define PASS0_FIXED 160u /* the reduction over subgroups or a 7-level tree, the rest */
#define PASS1_FIXED 8u

kvmem_status kvm_vk_dev_qmem_score(kvmem_backend *be, const kvm_dev_qmem_args *a) {
    static const char op[] = "dev_qmem_score";
    kvm_vk *v = impl(be);
    if (!a) return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: args is NULL", op);
    if (a->n_layers < 1 || a->n_q_heads < 1 || a->n_kv_heads < 1 || a->head_dim < 1 || a->n < 1 ||
        a->n_q_heads % a->n_kv_heads)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG,
                           "%s: need n_layers, n_q_heads, n_kv_heads, head_dim, n >= 1 and n_q_heads a multiple of "
                           "n_kv_heads (got %d, %d, %d, %d, %d)",
                           op, a->n_layers, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n);
    size_t L = (size_t)a->n_layers, Hq = (size_t)a->n_q_heads, Hkv = (size_t)a->n_kv_heads, D = (size_t)a->head_dim,
           N = (size_t)a->n, me, ke;
    if (a->mem_off % 4 || a->k_off % 4 || a->scores_off % 4)
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: offsets must be multiples of 4 bytes", op);
    int ok = kvm_mul_size(L * Hq, D, &me) && kvm_mul_size(L * N, Hkv, &ke) && kvm_mul_size(ke, D, &ke);
    if (!ok || !holds(a->mem, a->mem_off, me) || !holds(a->k, a->k_off, ke) || !holds(a->scores, a->scores_off, N))
        return kvm_vk_fail(v, KVMEM_ERR_INVALID_ARG, "%s: ranges outside the buffers", op);
    const uint32_t *lim = v->props.limits.maxComputeWorkGroupCount;
    if (Hq > lim[0] || L > lim[1])
        return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED, "%s: %zu layers x %zu heads exceed the dispatch limits", op, L, Hq);
    const kvmem_buffer *chk[3] = {a->mem, a->k, a->scores};
    for (int i = 0; i < 3; i++)
        if (chk[i]->cap > v->props.limits.maxStorageBufferRange)
            return kvm_vk_fail(v, KVMEM_ERR_UNSUPPORTED,
                               "vulkan %s: a buffer of %llu bytes exceeds this device's storage buffer range (%u)", op,
                               (unsigned long long)chk[i]->cap, v->props.limits.maxStorageBufferRange);
    float scale = (float)(1.0 / root((double)D)); /* as the CPU computes it */
    uint32_t sb;
    memcpy(&sb, &scale, 4);
    /* pass 0: a range of 128 * per0 tokens; pass 1: per1 slices for each
     * token an invocation takes (grid-stride over at most 4096 groups) */
    const uint32_t budget = kvm_vk_loop_budget();
    const uint64_t per0 = budget > PASS0_FIXED + D + 2 ? (budget - PASS0_FIXED) / (D + 2) : 1;
    const uint64_t range0 = per0 * KVM_VK_WG;
    const uint64_t groups1 = KVM_MIN((N + KVM_VK_WG - 1) / KVM_VK_WG, (uint64_t)4096);
    const uint64_t tokens1 = (N + groups1 * KVM_VK_WG - 1) / (groups1 * KVM_VK_WG);
    const uint64_t per1 = budget / tokens1 > PASS1_FIXED + D + 3 ? (budget / tokens1 - PASS1_FIXED) / (D + 3) : 1;
    uint32_t push[16] = {(uint32_t)L, (uint32_t)Hq, (uint32_t)Hkv, (uint32_t)D, (uint32_t)N,
                         (uint32_t)(a->mem_off / 4), (uint32_t)(a->k_off / 4), (uint32_t)(a->scores_off / 4), sb, 0,
                         0, 0, 0, 0, 0, 0};
    kvm_vk_kernel kern = v->subgroup_ops ? KVM_VK_QMEM_SCORE_SG : KVM_VK_QMEM_SCORE;
    pthread_mutex_lock(&v->mu);
    kvmem_buffer *stats = NULL;
    kvmem_status st = kvm_vk_buffer_create(v, L * Hq * 2 * 4, 1, &stats);
    if (st != KVMEM_OK) {
        pthread_mutex_unlock(&v->mu);
        return st;
    }
    const kvmem_buffer *bufs[4] = {a->mem, a->k, stats, a->scores};
    VkResult r = kvm_vk_begin(v);
    if (r == VK_SUCCESS) r = kvm_vk_bind(v, kern, bufs, 4, sizeof push);
    for (uint64_t j0 = 0; r == VK_SUCCESS && j0 < N; j0 += range0) { /* pass 0 */
        push[10] = (uint32_t)j0;
        push[11] = (uint32_t)KVM_MIN((uint64_t)N, j0 + range0);
        push[12] = j0 == 0;
        push[13] = j0 + range0 >= N;
        r = kvm_vk_dispatch(v, kern, push, sizeof push, (uint32_t)Hq, (uint32_t)L, 1);
    }
    push[9] = 1;
    for (uint64_t s0 = 0; r == VK_SUCCESS && s0 < L * Hq; s0 += per1) { /* pass 1 */
        push[14] = (uint32_t)s0;
        push[15] = (uint32_t)KVM_MIN((uint64_t)(L * Hq), s0 + per1);
        r = kvm_vk_dispatch(v, kern, push, sizeof push, (uint32_t)groups1, 1, 1);
    }
    if (r == VK_SUCCESS) r = kvm_vk_submit_wait(v, 1);
    else v->vk.vkEndCommandBuffer(v->cmd);
    kvm_vk_buffer_destroy(v, stats);
    pthread_mutex_unlock(&v->mu);
    return r == VK_SUCCESS ? KVMEM_OK : kvm_vk_fail(v, KVMEM_ERR_BACKEND, "vulkan %s failed (%s)", op, kvm_vk_result_str(r));
}

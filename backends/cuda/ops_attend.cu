// ART attention and the IntentKV rule score of the CUDA backend
// (attend.cuh, qmem_score.cuh).
#include "attend.cuh"
#include "backend_impl.h"
#include "qmem_score.cuh"

#include <math.h>

extern "C" kvmem_status kvm_cu_op_attend(kvmem_backend *be, const kvmem_cuda_attend_args *a) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "attend: NULL argument");
    kvm_cu_backend *b = cu_impl(be);
    if (a->dtype != KVMEM_F16 && a->dtype != KVMEM_BF16)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "attend: KV dtype must be f16 or bf16");
    if (a->n_kv_heads >= 1 && a->n_q_heads / a->n_kv_heads > kvmcu::kAttendMaxGroup)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "attend: %d query heads per KV head: at most %d", a->n_q_heads / a->n_kv_heads,
                           kvmcu::kAttendMaxGroup);
    if (a->patience < 0 || !(a->tau_s >= 0) || !(a->tau_d >= 0) || a->n_slots < 1)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "attend: patience, tau_s, tau_d must be >= 0 and n_slots >= 1");
    kvm_cu_attend_shape shape = {a->n_pos, a->tile, a->n_q_heads, a->n_kv_heads, a->head_dim, a->n_visit,
                                 a->tiles_per_wave, b->props.multiProcessorCount};
    kvm_cu_attend_plan plan;
    kvmem_status st = kvm_cu_attend_plan_make(&shape, &plan);
    if (st != KVMEM_OK) return st;
    const size_t D = (size_t)a->head_dim, Hq = (size_t)a->n_q_heads;
    const size_t kv_bytes = (size_t)a->n_slots * a->n_kv_heads * D * 2;
    const float *q = static_cast<const float *>(cu_ref(a->q, Hq * D * 4, "attend: q", &st));
    const void *k = cu_ref(a->k, kv_bytes, "attend: k", &st);
    const void *v = cu_ref(a->v, kv_bytes, "attend: v", &st);
    const int32_t *sm = static_cast<const int32_t *>(cu_ref(a->slot_map, (size_t)a->n_pos * 4, "attend: slot_map", &st));
    const int32_t *ord = static_cast<const int32_t *>(cu_ref(a->order, (size_t)a->n_visit * 4, "attend: order", &st));
    float *out = static_cast<float *>(cu_ref(a->out, Hq * D * 4, "attend: out", &st));
    int32_t *vis = static_cast<int32_t *>(cu_ref(a->visited, Hq * 4, "attend: visited", &st));
    int32_t *stp = static_cast<int32_t *>(cu_ref(a->stopped, Hq * 4, "attend: stopped", &st));
    void *ws = cu_scratch(b, plan.ws_bytes, &st);
    if (st != KVMEM_OK) return st;
    // slot ids outside [0, n_slots) are skipped like dead slots and tile ids
    // outside [0, n_tiles) visit nothing: a bad map cannot read out of bounds
    if (a->n_slots > INT32_MAX) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "attend: n_slots must be < 2^31");
    kvmcu::AttendParams p;
    p.n_q_heads = a->n_q_heads;
    p.n_kv_heads = a->n_kv_heads;
    p.n_pos = (int)a->n_pos;
    p.tile = a->tile;
    p.n_visit = a->n_visit;
    p.tiles_per_wave = plan.tiles_per_wave;
    p.n_slots = (int)a->n_slots;
    p.scale = a->scale > 0 ? a->scale : 1.0f / sqrtf((float)a->head_dim);
    p.tau_s = a->tau_s;
    p.tau_d = a->tau_d;
    p.patience = a->patience;
    p.oracle = a->oracle != 0;
    p.state_stride = plan.state_stride;
    cudaSetDevice(b->device);
    return cu_check(kvmcu::attend(q, k, v, (kvmcu::DType)a->dtype, a->head_dim, sm, ord, p, plan.partial_bytes, ws, out,
                                  vis, stp, b->stream),
                    "attend");
}

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

// Q8 / Q4 quantize and dequantize ops of the CUDA backend (quant.cuh).
#include "backend_impl.h"
#include "quant.cuh"

static kvmem_status quant_refs(kvmem_backend *be, const kvmem_cuda_quant_args *a, int dequant, void **x, void **q,
                               void **s, void **bias) {
    if (!be || !a) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "quantize: NULL argument");
    const char *op = dequant ? "dequantize" : "quantize";
    const size_t group = a->qtype == KVMEM_Q8 ? 32 : a->qtype == KVMEM_Q4 ? 64 : 0;
    if (!group) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "%s: qtype must be Q8 or Q4", op);
    if (a->n % group)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "%s: %zu values: must be a multiple of the group size %zu", op, a->n, group);
    size_t xb;
    if (!kvm_cu_tensor_bytes(a->dtype, a->n, &xb))
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "%s: dtype must be f32, f16 or bf16 (%zu values)", op, a->n);
    kvmem_status st = KVMEM_OK;
    *x = cu_ref(a->x, xb, dequant ? "dequantize: y" : "quantize: x", &st);
    *q = cu_ref(a->q, a->qtype == KVMEM_Q8 ? a->n : a->n / 2, "quantize: q", &st);
    *s = cu_ref(a->scales, a->n / group * 2, "quantize: scales", &st);
    *bias = a->qtype == KVMEM_Q4 ? cu_ref(a->biases, a->n / group * 2, "quantize: biases", &st) : nullptr;
    return st;
}

extern "C" kvmem_status kvm_cu_op_quantize(kvmem_backend *be, const kvmem_cuda_quant_args *a) {
    void *x, *q, *s, *bias;
    kvmem_status st = quant_refs(be, a, 0, &x, &q, &s, &bias);
    if (st != KVMEM_OK) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    const unsigned blocks = (unsigned)b->props.multiProcessorCount * 8u;
    if (a->qtype == KVMEM_Q8)
        return cu_check(kvmcu::quantize_q8(x, (kvmcu::DType)a->dtype, a->n, static_cast<int8_t *>(q),
                                           static_cast<__half *>(s), blocks, b->stream),
                        "quantize");
    return cu_check(kvmcu::quantize_q4(x, (kvmcu::DType)a->dtype, a->n, static_cast<uint32_t *>(q),
                                       static_cast<__half *>(s), static_cast<__half *>(bias), blocks, b->stream),
                    "quantize");
}

extern "C" kvmem_status kvm_cu_op_dequantize(kvmem_backend *be, const kvmem_cuda_quant_args *a) {
    void *y, *q, *s, *bias;
    kvmem_status st = quant_refs(be, a, 1, &y, &q, &s, &bias);
    if (st != KVMEM_OK) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    const unsigned blocks = (unsigned)b->props.multiProcessorCount * 8u;
    if (a->qtype == KVMEM_Q8)
        return cu_check(kvmcu::dequantize_q8(static_cast<const int8_t *>(q), static_cast<const __half *>(s), a->n, y,
                                             (kvmcu::DType)a->dtype, blocks, b->stream),
                        "dequantize");
    return cu_check(kvmcu::dequantize_q4(static_cast<const uint32_t *>(q), static_cast<const __half *>(s),
                                         static_cast<const __half *>(bias), a->n, y, (kvmcu::DType)a->dtype, blocks,
                                         b->stream),
                    "dequantize");
}

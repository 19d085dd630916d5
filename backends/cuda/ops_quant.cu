// quantize / dequantize table entries: one storage section of
// core/backend/quant_layout.h (Q8, Q4, Q4 KIVI) per call, bit for bit the CPU
// backend's bytes. The per-group arithmetic is host/rules.h, shared with the
// host and tested there against the core's scalar reference; the kernels
// only decide which thread runs which group, in the reference's order:
// each thread scans its group (or KIVI channel) sequentially, so min, max
// and absmax see the values in the same order as the CPU loops.
#include "backend_impl.h"
#include "common.cuh"
#include "host/rules.h"

namespace {

// First index (or n) of a value that is not finite within +-65504.
__global__ void quant_check_kernel(const float *__restrict__ x, size_t n, unsigned long long *__restrict__ first_bad) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (!(fabsf(x[i]) <= 65504.0f)) atomicMin(first_bad, (unsigned long long)i);
}

// Q8: one thread per (row, group of 32).
__global__ void q8_quant_kernel(const float *__restrict__ x, size_t n, size_t dim, uint16_t *__restrict__ scales,
                                int8_t *__restrict__ codes) {
    const size_t G = (dim + KVM_CU_Q8_GROUP - 1) / KVM_CU_Q8_GROUP, total = n * G;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / G, g = t % G, i0 = g * KVM_CU_Q8_GROUP;
        const size_t k = dim - i0 < KVM_CU_Q8_GROUP ? dim - i0 : KVM_CU_Q8_GROUP;
        const float *xr = x + r * dim + i0;
        float amax = 0.0f, inv;
        for (size_t i = 0; i < k; i++) amax = kvm_cu_max_step(amax, fabsf(xr[i]));
        scales[r * G + g] = kvm_cu_q8_params(amax, &inv);
        for (size_t i = 0; i < k; i++) codes[r * dim + i0 + i] = kvm_cu_q8_code(xr[i], inv);
    }
}

// Q4 (values, and keys of plain Q4): one thread per (row, group of 64).
__global__ void q4_quant_kernel(const float *__restrict__ x, size_t n, size_t dim, uint32_t *__restrict__ words,
                                uint16_t *__restrict__ scales, uint16_t *__restrict__ biases) {
    const size_t G = (dim + KVM_CU_Q4_GROUP - 1) / KVM_CU_Q4_GROUP, W = (dim + 7) / 8, total = n * G;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / G, g = t % G, i0 = g * KVM_CU_Q4_GROUP;
        const size_t k = dim - i0 < KVM_CU_Q4_GROUP ? dim - i0 : KVM_CU_Q4_GROUP;
        const float *xr = x + r * dim + i0;
        float mn = xr[0], mx = xr[0], b, inv;
        for (size_t i = 1; i < k; i++) {
            mn = kvm_cu_min_step(mn, xr[i]);
            mx = kvm_cu_max_step(mx, xr[i]);
        }
        uint16_t sh, bh;
        kvm_cu_q4_params(mn, mx, &sh, &bh, &b, &inv);
        scales[r * G + g] = sh;
        biases[r * G + g] = bh;
        for (size_t i = 0; i < k; i += 8) {
            uint32_t w = 0; // nibbles past the group's end stay 0
            for (size_t j = 0; j < 8 && i + j < k; j++) w |= kvm_cu_q4_code(xr[i + j], b, inv) << (4 * j);
            words[r * W + (i0 + i) / 8] = w;
        }
    }
}

// KIVI keys, step 1: one thread per channel, min and max over the rows in
// row order (the CPU's minmax_rows), then the channel's scale and bias.
__global__ void kivi_params_kernel(const float *__restrict__ x, size_t n, size_t dim, uint16_t *__restrict__ scales,
                                   uint16_t *__restrict__ biases) {
    for (size_t d = (size_t)blockIdx.x * blockDim.x + threadIdx.x; d < dim; d += (size_t)gridDim.x * blockDim.x) {
        float mn = x[d], mx = x[d], b, inv;
        for (size_t r = 1; r < n; r++) {
            mn = kvm_cu_min_step(mn, x[r * dim + d]);
            mx = kvm_cu_max_step(mx, x[r * dim + d]);
        }
        kvm_cu_q4_params(mn, mx, &scales[d], &biases[d], &b, &inv);
    }
}

// KIVI keys, step 2: one thread per (row, word) of codes.
__global__ void kivi_codes_kernel(const float *__restrict__ x, size_t n, size_t dim, const uint16_t *__restrict__ scales,
                                  const uint16_t *__restrict__ biases, uint32_t *__restrict__ words) {
    const size_t W = (dim + 7) / 8, total = n * W;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / W, w0 = (t % W) * 8;
        uint32_t w = 0;
        for (size_t j = 0; j < 8 && w0 + j < dim; j++) {
            const size_t d = w0 + j;
            const float b = kvm_cu_f16_to_f32(biases[d]), inv = kvm_cu_q4_recip(scales[d]);
            w |= kvm_cu_q4_code(x[r * dim + d], b, inv) << (4 * j);
        }
        words[t] = w;
    }
}

// Decode rows [row0, row0 + cnt): one thread per output value.
__global__ void dequant_kernel(int kind, const unsigned char *__restrict__ sec, size_t codes_off, size_t scales_off,
                               size_t biases_off, size_t dim, size_t row0, size_t cnt, float *__restrict__ out) {
    const size_t total = cnt * dim, W = (dim + 7) / 8;
    const size_t G8 = (dim + KVM_CU_Q8_GROUP - 1) / KVM_CU_Q8_GROUP, G4 = (dim + KVM_CU_Q4_GROUP - 1) / KVM_CU_Q4_GROUP;
    const uint16_t *sc = reinterpret_cast<const uint16_t *>(sec + scales_off);
    const uint16_t *bi = reinterpret_cast<const uint16_t *>(sec + biases_off);
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = row0 + t / dim, d = t % dim;
        float v;
        if (kind == 0) { // Q8
            const int8_t *codes = reinterpret_cast<const int8_t *>(sec + codes_off);
            v = kvm_cu_q8_value(codes[r * dim + d], sc[r * G8 + d / KVM_CU_Q8_GROUP]);
        } else {
            const uint32_t *words = reinterpret_cast<const uint32_t *>(sec + codes_off);
            const uint32_t q = (words[r * W + d / 8] >> (4 * (d % 8))) & 15u;
            const size_t g = kind == 2 ? d : r * G4 + d / KVM_CU_Q4_GROUP; // 2: KIVI keys, per channel
            v = kvm_cu_q4_value(q, sc[g], bi[g]);
        }
        out[t] = v;
    }
}

uint32_t max_blocks(const kvm_cu_backend *b) { return (uint32_t)b->props.multiProcessorCount * 8u; }

}  // namespace

kvmem_status kvm_cu_quantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src, size_t src_off,
                             size_t n, size_t dim, kvmem_buffer *dst, size_t dst_off) {
    if (!be) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "quantize: backend is NULL");
    // a NULL buffer has size 0: its range is outside (the CPU backend's rule)
    kvmem_status st = kvm_cu_check_quantize(dt, which, cu_size(src), src_off, n, dim, cu_size(dst), dst_off);
    if (st != KVMEM_OK) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    const kvm_cu_qsection q = kvm_cu_qsection_layout(dt, which, n, dim);
    const float *x = reinterpret_cast<const float *>(static_cast<const unsigned char *>(src->dev) + src_off);
    unsigned char *sec = static_cast<unsigned char *>(dst->dev) + dst_off;

    // inputs must be finite within +-65504 (quant_layout.h): checked first, so a
    // refused call leaves dst untouched, with the CPU backend's message
    unsigned long long *bad = static_cast<unsigned long long *>(cu_scratch(b, 256, &st));
    if (st != KVMEM_OK) return st;
    const size_t total = n * dim;
    unsigned long long first = ~0ull;
    st = cu_check(cudaMemsetAsync(bad, 0xff, sizeof first, b->stream), "quantize"); // ~0: none yet
    kvm_cu_grid g = kvm_cu_grid_1d(total, 256, max_blocks(b));
    if (st == KVMEM_OK) {
        quant_check_kernel<<<g.blocks, g.threads, 0, b->stream>>>(x, total, bad);
        st = cu_check(cudaGetLastError(), "quantize");
    }
    if (st == KVMEM_OK) st = cu_check(cudaMemcpyAsync(&first, bad, sizeof first, cudaMemcpyDeviceToHost, b->stream), "quantize");
    if (st == KVMEM_OK) st = cu_check(cudaStreamSynchronize(b->stream), "quantize");
    if (st != KVMEM_OK) return st;
    if (first < total) {
        float v = 0.0f;
        st = cu_check(cudaMemcpyAsync(&v, x + first, 4, cudaMemcpyDeviceToHost, b->stream), "quantize");
        if (st == KVMEM_OK) st = cu_check(cudaStreamSynchronize(b->stream), "quantize");
        if (st != KVMEM_OK) return st;
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "quantize: value %g at %llu is not finite within +-65504", (double)v,
                           first);
    }

    // padding bytes and unused nibbles are 0, as the CPU writes them
    st = cu_check(cudaMemsetAsync(sec, 0, q.bytes, b->stream), "quantize");
    if (st != KVMEM_OK) return st;
    uint16_t *scales = reinterpret_cast<uint16_t *>(sec + q.scales_off);
    if (dt == KVMEM_Q8) {
        g = kvm_cu_grid_1d(n * ((dim + KVM_CU_Q8_GROUP - 1) / KVM_CU_Q8_GROUP), 128, max_blocks(b));
        q8_quant_kernel<<<g.blocks, g.threads, 0, b->stream>>>(x, n, dim, scales, reinterpret_cast<int8_t *>(sec + q.codes_off));
    } else if (q.per_channel) {
        uint16_t *biases = reinterpret_cast<uint16_t *>(sec + q.biases_off);
        g = kvm_cu_grid_1d(dim, 128, max_blocks(b));
        kivi_params_kernel<<<g.blocks, g.threads, 0, b->stream>>>(x, n, dim, scales, biases);
        if ((st = cu_check(cudaGetLastError(), "quantize")) != KVMEM_OK) return st;
        g = kvm_cu_grid_1d(n * ((dim + 7) / 8), 256, max_blocks(b));
        kivi_codes_kernel<<<g.blocks, g.threads, 0, b->stream>>>(x, n, dim, scales, biases,
                                                                 reinterpret_cast<uint32_t *>(sec + q.codes_off));
    } else {
        g = kvm_cu_grid_1d(n * ((dim + KVM_CU_Q4_GROUP - 1) / KVM_CU_Q4_GROUP), 128, max_blocks(b));
        q4_quant_kernel<<<g.blocks, g.threads, 0, b->stream>>>(x, n, dim, reinterpret_cast<uint32_t *>(sec + q.codes_off),
                                                               scales, reinterpret_cast<uint16_t *>(sec + q.biases_off));
    }
    return cu_check(cudaGetLastError(), "quantize");
}

kvmem_status kvm_cu_dequantize(kvmem_backend *be, kvmem_dtype dt, int which, const kvmem_buffer *src, size_t src_off,
                               size_t n, size_t dim, size_t row0, size_t cnt, kvmem_buffer *dst, size_t dst_off) {
    if (!be) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "dequantize: backend is NULL");
    kvmem_status st = kvm_cu_check_dequantize(dt, which, cu_size(src), src_off, n, dim, row0, cnt, cu_size(dst), dst_off);
    if (st != KVMEM_OK || cnt == 0) return st;
    kvm_cu_backend *b = cu_impl(be);
    cudaSetDevice(b->device);
    const kvm_cu_qsection q = kvm_cu_qsection_layout(dt, which, n, dim);
    const int kind = dt == KVMEM_Q8 ? 0 : q.per_channel ? 2 : 1;
    kvm_cu_grid g = kvm_cu_grid_1d(cnt * dim, 256, max_blocks(b));
    dequant_kernel<<<g.blocks, g.threads, 0, b->stream>>>(
        kind, static_cast<const unsigned char *>(src->dev) + src_off, q.codes_off, q.scales_off, q.biases_off, dim, row0,
        cnt, reinterpret_cast<float *>(static_cast<unsigned char *>(dst->dev) + dst_off));
    return cu_check(cudaGetLastError(), "dequantize");
}

#include "tensor.h"
#include "kernels.h"

#include <stdio.h>
#include <string.h>

kvmem_status kvmem_tensor_init(kvmem_tensor *out, void *data, kvmem_dtype dtype, int32_t ndim,
                               const int64_t *shape) {
    if (!out) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: out is NULL");
    if (!kvm_is_tensor_dtype(dtype))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: dtype %d is not f32, f16 or bf16", (int)dtype);
    if (ndim < 1 || ndim > KVMEM_MAX_DIMS)
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: ndim %d outside [1, %d]", ndim, KVMEM_MAX_DIMS);
    if (!shape) return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: shape is NULL");
    int64_t st[KVMEM_MAX_DIMS], n = 1;
    for (int32_t d = ndim - 1; d >= 0; d--) {
        if (shape[d] < 0)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: shape[%d] = %lld is negative", d,
                            (long long)shape[d]);
        st[d] = n;
        if (shape[d] != 0 && n > INT64_MAX / 16 / shape[d])
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "kvmem_tensor_init: element count overflows");
        n *= shape[d] ? shape[d] : 1;
    }
    memset(out, 0, sizeof *out);
    out->data = data;
    out->dtype = dtype;
    out->ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) {
        out->shape[d] = shape[d];
        out->strides[d] = st[d];
    }
    return KVMEM_OK;
}

static void fmt_shape(char *buf, size_t size, int32_t ndim, const int64_t *shape) {
    size_t at = 0;
    buf[0] = '\0';
    for (int32_t d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, "[%lld]", (long long)shape[d]);
}

kvmem_status kvm_tensor_expect(const kvmem_tensor *t, const char *what, const char *dims, int32_t ndim,
                               const int64_t *shape) {
    char got[128], want[128];
    if (!t) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s is NULL", what);
    /* calls that take device tensors resolve them before they get here */
    if ((unsigned)t->dtype & KVMEM_DTYPE_DEVICE)
        return kvm_fail(KVMEM_ERR_UNSUPPORTED,
                        "%s is a device tensor: this call reads and writes host memory only (device tensors go to "
                        "kvmem_agent_append, kvmem_retrieve, kvmem_gather and kvmem_attend)",
                        what);
    if (!kvm_is_tensor_dtype(t->dtype))
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: dtype %d is not f32, f16 or bf16", what, (int)t->dtype);
    fmt_shape(want, sizeof want, ndim, shape);
    if (t->ndim != ndim) {
        if (t->ndim >= 1 && t->ndim <= KVMEM_MAX_DIMS) fmt_shape(got, sizeof got, t->ndim, t->shape);
        else snprintf(got, sizeof got, "(ndim %d)", t->ndim);
        return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: shape %s does not match %s %s", what, got, want, dims);
    }
    int64_t max_off = 0, n = 1;
    for (int32_t d = 0; d < ndim; d++) {
        if (t->shape[d] != shape[d]) {
            fmt_shape(got, sizeof got, t->ndim, t->shape);
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: shape %s does not match %s %s", what, got, want, dims);
        }
        if (t->strides[d] < 0)
            return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: stride[%d] = %lld is negative", what, d,
                            (long long)t->strides[d]);
        if (shape[d] == 0) n = 0;
        if (shape[d] > 0) {
            if (t->strides[d] > 0 && shape[d] - 1 > (INT64_MAX / 8 - max_off) / t->strides[d])
                return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: strides overflow the address space", what);
            max_off += (shape[d] - 1) * t->strides[d];
        }
    }
    if (n > 0 && !t->data) return kvm_fail(KVMEM_ERR_INVALID_ARG, "%s: data is NULL", what);
    return KVMEM_OK;
}

void kvm_tensor_read_f32(const kvmem_tensor *t, int64_t off, float *dst, size_t n) {
    const int64_t s = t->strides[t->ndim - 1];
    const size_t es = kvm_dtype_size(t->dtype);
    const unsigned char *base = (const unsigned char *)t->data + (size_t)off * es;
    if (s == 1 || n <= 1) {
        kvm_convert_host(dst, KVMEM_F32, base, t->dtype, n);
        return;
    }
    for (size_t i = 0; i < n; i++) kvm_convert_host(dst + i, KVMEM_F32, base + (size_t)s * i * es, t->dtype, 1);
}

void kvm_tensor_write_f32(const kvmem_tensor *t, int64_t off, const float *src, size_t n) {
    const int64_t s = t->strides[t->ndim - 1];
    const size_t es = kvm_dtype_size(t->dtype);
    unsigned char *base = (unsigned char *)t->data + (size_t)off * es;
    if (s == 1 || n <= 1) {
        kvm_convert_host(base, t->dtype, src, KVMEM_F32, n);
        return;
    }
    for (size_t i = 0; i < n; i++) kvm_convert_host(base + (size_t)s * i * es, t->dtype, src + i, KVMEM_F32, 1);
}

/* Host conversion between tensor dtypes through the chosen kernel table. */
void kvm_convert_host(void *dst, kvmem_dtype ddt, const void *src, kvmem_dtype sdt, size_t n) {
    const kvm_cpu_kernels *k = kvm_cpu_kernels_get();
    if (ddt == sdt) {
        memcpy(dst, src, n * kvm_dtype_size(ddt));
    } else if (sdt == KVMEM_F32) {
        if (ddt == KVMEM_F16) k->f32_to_f16(src, dst, n);
        else k->f32_to_bf16(src, dst, n);
    } else if (ddt == KVMEM_F32) {
        if (sdt == KVMEM_F16) k->f16_to_f32(src, dst, n);
        else k->bf16_to_f32(src, dst, n);
    } else { /* f16 <-> bf16 through f32, in chunks on the stack */
        float tmp[256];
        const uint16_t *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i += 256) {
            size_t c = KVM_MIN(n - i, (size_t)256);
            kvm_convert_host(tmp, KVMEM_F32, s + i, sdt, c);
            kvm_convert_host(d + i, ddt, tmp, KVMEM_F32, c);
        }
    }
}

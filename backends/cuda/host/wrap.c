/* Device tensors on the CUDA backend: the checks of a caller's memory
 * descriptor before the plugin wraps it (cuda_host.h). */
#include "cuda_host.h"

kvmem_status kvm_cu_wrap_check(const kvmem_device_memory *mem, int32_t backend_device, int32_t pointer_device,
                               int pointer_is_device) {
    if (!mem) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda buffer_wrap: mem is NULL");
    if (mem->kind != KVMEM_MEMORY_CUDA)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED, "cuda buffer_wrap: memory of kind %d is not a CUDA device pointer",
                           (int)mem->kind);
    if (mem->handle == 0) return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda buffer_wrap: the device pointer is 0");
    if (mem->size > SIZE_MAX || mem->handle > UINT64_MAX - mem->size)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG, "cuda buffer_wrap: %llu bytes from 0x%llx wrap around the address space",
                           (unsigned long long)mem->size, (unsigned long long)mem->handle);
    if (mem->device != backend_device)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED,
                           "cuda buffer_wrap: the tensor is on CUDA device %d, the context on device %d (KVMEM_CUDA_DEVICE "
                           "picks the context's)",
                           mem->device, backend_device);
    if (!pointer_is_device)
        return kvm_cu_fail(KVMEM_ERR_INVALID_ARG,
                           "cuda buffer_wrap: 0x%llx is not device memory (host or unregistered memory: pass it as a host "
                           "tensor)",
                           (unsigned long long)mem->handle);
    if (pointer_device != backend_device)
        return kvm_cu_fail(KVMEM_ERR_UNSUPPORTED,
                           "cuda buffer_wrap: 0x%llx belongs to CUDA device %d, not to the context's device %d",
                           (unsigned long long)mem->handle, pointer_device, backend_device);
    return KVMEM_OK;
}

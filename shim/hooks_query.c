/* Memory and pointer queries: the program sees the budget, and sees managed allocations as device
 * memory on their device whatever their residency (a host-backed VA would otherwise answer HOST). */
#include "engine.h"
#include "hook.h"

FS_EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    __typeof__(&cudaMemGetInfo) real = FS_CUDART(cudaMemGetInfo);
    if (!real)
        return fs_hook_missing_real("cudaMemGetInfo");
    if (fs_hook_enter() || !free_bytes || !total) {
        fs_hook_leave();
        return real(free_bytes, total);
    }
    /* The runtime call first: it initializes the context and reports errors the program expects. */
    cudaError_t res = real(free_bytes, total);
    uint64_t f, t;
    if (res == cudaSuccess && fs_engine_mem_info(fs_hook_current_device(), &f, &t) == FS_OK) {
        *free_bytes = f;
        *total = t;
    }
    fs_hook_leave();
    return res;
}

FS_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    __typeof__(&cudaPointerGetAttributes) real = FS_CUDART(cudaPointerGetAttributes);
    if (!real)
        return fs_hook_missing_real("cudaPointerGetAttributes");
    cudaError_t res = real(attr, ptr);
    int ordinal;
    if (res == cudaSuccess && attr && fs_engine_owns((uint64_t)(uintptr_t)ptr, &ordinal)) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = ordinal;
        attr->devicePointer = (void *)ptr;
        attr->hostPointer = NULL;
    }
    return res;
}

/* Patch one driver pointer attribute of a managed allocation in place. */
static void patch_attribute(CUpointer_attribute attribute, void *data, CUdeviceptr ptr,
                            int ordinal)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = ordinal;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = NULL;
        break;
    default:
        break;
    }
}

FS_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    if (fs_cuda_load_driver() != FS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    int ordinal;
    if (!fs_engine_owns(ptr, &ordinal))
        return fs_cuda.cuPointerGetAttribute(data, attribute, ptr);
    if (attribute == CU_POINTER_ATTRIBUTE_HOST_POINTER)
        return CUDA_ERROR_INVALID_VALUE; /* what device memory answers */
    CUresult res = fs_cuda.cuPointerGetAttribute(data, attribute, ptr);
    if (res == CUDA_SUCCESS)
        patch_attribute(attribute, data, ptr, ordinal);
    return res;
}

FS_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes,
                                          void **data, CUdeviceptr ptr)
{
    if (fs_cuda_load_driver() != FS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult res = fs_cuda.cuPointerGetAttributes(n, attributes, data, ptr);
    int ordinal;
    if (res == CUDA_SUCCESS && fs_engine_owns(ptr, &ordinal))
        for (unsigned int i = 0; i < n; i++)
            if (data[i])
                patch_attribute(attributes[i], data[i], ptr, ordinal);
    return res;
}

FS_EXPORT CUresult cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (fs_cuda_load_driver() != FS_OK)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult res = fs_cuda.cuMemGetInfo(free_bytes, total);
    uint64_t f, t;
    CUdevice ctx_dev;
    int ordinal = fs_cuda.cuCtxGetDevice(&ctx_dev) == CUDA_SUCCESS ? (int)ctx_dev : -1;
    if (res == CUDA_SUCCESS && fs_hook_depth == 0 && fs_engine_mem_info(ordinal, &f, &t) == FS_OK) {
        *free_bytes = f;
        *total = t;
    }
    return res;
}

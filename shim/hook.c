#include "hook.h"

#include "log.h"

FS_TLS int fs_hook_depth;

cudaError_t fs_to_cuda_rt(int err)
{
    switch (err) {
    case FS_OK: return cudaSuccess;
    case FS_ERR_NOMEM: return cudaErrorMemoryAllocation;
    case FS_ERR_INVALID: return cudaErrorInvalidValue;
    case FS_ERR_NOT_READY: return cudaErrorNotReady;
    case FS_ERR_NOT_FOUND: return cudaErrorInvalidDevicePointer;
    case FS_ERR_UNSUPPORTED: return cudaErrorNotSupported;
    case FS_ERR_STICKY: return cudaErrorIllegalAddress;
    default: return cudaErrorUnknown;
    }
}

CUresult fs_to_cuda_drv(int err)
{
    switch (err) {
    case FS_OK: return CUDA_SUCCESS;
    case FS_ERR_NOMEM: return CUDA_ERROR_OUT_OF_MEMORY;
    case FS_ERR_INVALID: return CUDA_ERROR_INVALID_VALUE;
    case FS_ERR_NOT_READY: return CUDA_ERROR_NOT_READY;
    case FS_ERR_NOT_FOUND: return CUDA_ERROR_INVALID_VALUE;
    case FS_ERR_UNSUPPORTED: return CUDA_ERROR_NOT_SUPPORTED;
    case FS_ERR_STICKY: return CUDA_ERROR_ILLEGAL_ADDRESS;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

cudaError_t fs_hook_missing_real(const char *name)
{
    FS_LOG_ONCE(FS_LOG_ERROR, "%s: the real CUDA runtime function was not found in the process; "
                "is libcudart loaded?", name);
    return cudaErrorSharedObjectSymbolNotFound;
}

int fs_hook_current_device(void)
{
    int dev = 0;
    __typeof__(&cudaGetDevice) get = FS_CUDART(cudaGetDevice);
    if (!get || get(&dev) != cudaSuccess)
        return -1;
    return dev;
}

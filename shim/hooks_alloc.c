/* The CUDA runtime's allocation entry points. */
#include "engine.h"
#include "hook.h"
#include "log.h"

FS_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    __typeof__(&cudaMalloc) real = FS_CUDART(cudaMalloc);
    if (!real)
        return fs_hook_missing_real("cudaMalloc");
    if (fs_hook_enter() || !devPtr || size == 0) {
        fs_hook_leave();
        return real(devPtr, size);
    }
    uint64_t ptr = 0;
    int rc = fs_engine_active() ? fs_engine_alloc(size, fs_hook_current_device(), &ptr)
                                : FS_ERR_UNSUPPORTED;
    cudaError_t res;
    if (rc == FS_ERR_UNSUPPORTED) {
        res = real(devPtr, size);
        if (res == cudaSuccess)
            fs_engine_note_passthrough(size);
    } else {
        res = fs_to_cuda_rt(rc);
        if (rc == FS_OK)
            *devPtr = (void *)(uintptr_t)ptr;
    }
    fs_hook_leave();
    return res;
}

FS_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    __typeof__(&cudaMallocPitch) real = FS_CUDART(cudaMallocPitch);
    __typeof__(&cudaFree) real_free = FS_CUDART(cudaFree);
    if (!real || !real_free)
        return fs_hook_missing_real("cudaMallocPitch");
    uint64_t min = fs_config_u64(fs_engine_config(), FS_P_MIN_OFFLOAD_BYTES);
    if (fs_hook_enter() || !devPtr || !pitch || width == 0 || height == 0 ||
        !fs_engine_active() || (uint64_t)width * height < min) {
        cudaError_t direct = real(devPtr, pitch, width, height);
        if (direct == cudaSuccess && fs_hook_depth == 1)
            fs_engine_note_passthrough((uint64_t)*pitch * height);
        fs_hook_leave();
        return direct;
    }
    /* CUDA chooses the pitch: learn it from a one-row allocation, then manage pitch x height
     * like any allocation. Pitched allocations are rare, so the extra call does not matter. */
    void *probe = NULL;
    size_t p = 0;
    cudaError_t res = real(&probe, &p, width, 1);
    if (res == cudaSuccess) {
        real_free(probe);
        uint64_t ptr = 0;
        int rc = fs_engine_alloc((uint64_t)p * height, fs_hook_current_device(), &ptr);
        if (rc == FS_OK) {
            *devPtr = (void *)(uintptr_t)ptr;
            *pitch = p;
            fs_hook_leave();
            return cudaSuccess;
        }
        res = real(devPtr, pitch, width, height);
        if (res == cudaSuccess)
            fs_engine_note_passthrough((uint64_t)*pitch * height);
    }
    fs_hook_leave();
    return res;
}

FS_EXPORT cudaError_t cudaFree(void *devPtr)
{
    __typeof__(&cudaFree) real = FS_CUDART(cudaFree);
    if (!real)
        return fs_hook_missing_real("cudaFree");
    if (fs_hook_enter() || !devPtr) {
        fs_hook_leave();
        return real(devPtr);
    }
    int rc = fs_engine_free((uint64_t)(uintptr_t)devPtr);
    cudaError_t res = rc == FS_ERR_NOT_FOUND ? real(devPtr) : fs_to_cuda_rt(rc);
    fs_hook_leave();
    return res;
}

/* Stream-ordered pool allocations cannot be remapped by flexshim: passed through, counted, and
 * said once. */
FS_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    __typeof__(&cudaMallocAsync) real = FS_CUDART(cudaMallocAsync);
    if (!real)
        return fs_hook_missing_real("cudaMallocAsync");
    cudaError_t res = real(devPtr, size, stream);
    if (res == cudaSuccess && !fs_hook_enter()) {
        FS_LOG_ONCE(FS_LOG_WARN, "cudaMallocAsync allocations pass through unmanaged (memory "
                    "pools cannot be remapped); for PyTorch, remove backend:cudaMallocAsync from "
                    "PYTORCH_CUDA_ALLOC_CONF");
        fs_engine_note_passthrough(size);
    }
    fs_hook_leave();
    return res;
}

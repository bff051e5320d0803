/* The one table of real CUDA entry points, resolved once.
 *
 * Driver and CUPTI functions come from dlopen'ed libcuda.so.1 / libcupti.so (nothing is linked, so
 * the same build loads on a machine with no driver). Runtime functions are the program's own
 * libcudart ones that our exported hooks shadow: dlsym(RTLD_NEXT), falling back to an already
 * loaded libcudart found with RTLD_NOLOAD (libraries opened RTLD_LOCAL are not in the global
 * scope). The cuda.h macros (cuMemGetInfo -> cuMemGetInfo_v2, ...) pick the versioned symbol. */
#ifndef FS_CUDA_API_H
#define FS_CUDA_API_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>

/* clang-format off */
#define FS_CUDA_DRIVER_FUNCS(X) \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName) \
    X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
    X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) \
    X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize) \
    X(cuMemGetInfo) X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease) \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) \
    X(cuStreamCreateWithPriority) X(cuCtxGetStreamPriorityRange) \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamWaitEvent) \
    X(cuStreamIsCapturing) X(cuMemcpyDtoDAsync) \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) \
    X(cuEventSynchronize) X(cuEventElapsedTime) \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes) \
    X(cuFuncGetParamInfo) X(cuKernelGetParamInfo) X(cuFuncGetName) X(cuKernelGetName) \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD32) \
    X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) \
    X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer) X(cuMemAlloc) X(cuMemFree)

#define FS_CUPTI_FUNCS(X) \
    X(cuptiSubscribe_v2) X(cuptiUnsubscribe) X(cuptiEnableCallback) X(cuptiEnableDomain) \
    X(cuptiGetResultString) X(cuptiGetCallbackName)

#define FS_CUDART_FUNCS(X) \
    X(cudaMalloc) X(cudaFree) X(cudaMallocPitch) X(cudaMemGetInfo) X(cudaPointerGetAttributes) \
    X(cudaGetDevice) X(cudaMallocAsync)
/* clang-format on */

struct fs_cuda_api {
#define FS_CUDA_FIELD_(fn) __typeof__(&fn) fn;
    FS_CUDA_DRIVER_FUNCS(FS_CUDA_FIELD_)
    FS_CUPTI_FUNCS(FS_CUDA_FIELD_)
    FS_CUDART_FUNCS(FS_CUDA_FIELD_)
#undef FS_CUDA_FIELD_
};

/* The table. Driver and CUPTI fields stay NULL until fs_cuda_load_driver / fs_cuda_load_cupti
 * succeed; runtime fields are filled on first use by fs_cuda_rt(). */
extern struct fs_cuda_api fs_cuda;

/* Load libcuda.so.1 and resolve the driver table (once; later calls return the first result).
 * FS_ERR_UNSUPPORTED when there is no driver or a symbol is missing. Does not call cuInit. */
int fs_cuda_load_driver(void);

/* Load CUPTI (next to the CUDA toolkit or on the library path). */
int fs_cuda_load_cupti(void);

/* Resolve the real runtime function NAME into *SLOT if it is still NULL; returns *SLOT (NULL if
 * libcudart is nowhere to be found). Callers pass the table's field: FS_CUDART(cudaMalloc). */
void *fs_cuda_resolve_rt(void **slot, const char *name);
#define FS_CUDART(fn) ((__typeof__(&fn))fs_cuda_resolve_rt((void **)&fs_cuda.fn, #fn))

/* "CUDA_ERROR_OUT_OF_MEMORY (2)" style text for logs; never NULL. */
const char *fs_cuda_errstr(CUresult res);

#endif

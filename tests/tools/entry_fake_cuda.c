/* A stand-in for libcuda.so.1 in the entry-point probe's test (tests/tools/entry_probe.sh): the
 * launch functions count their calls, and cuGetProcAddress_v2 hands them out as the driver does,
 * the per-thread-stream variant for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
#include <cuda.h>
#include <stdbool.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT unsigned long fake_calls[4]; /* cuLaunchKernel, _ptsz, cuLaunchKernelEx, _ptsz */

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned sm, CUstream s, void **p,
                               void **e)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sm, (void)s;
    (void)p, (void)e;
    fake_calls[0]++;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned sm, CUstream s,
                                    void **p, void **e)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)sm, (void)s;
    (void)p, (void)e;
    fake_calls[1]++;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)c, (void)f, (void)p, (void)e;
    fake_calls[2]++;
    return CUDA_ERROR_INVALID_VALUE; /* a result the wrapper must pass back */
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e)
{
    (void)c, (void)f, (void)p, (void)e;
    fake_calls[3]++;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status)
{
    (void)version;
    bool ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    void *f = NULL;
    if (!strcmp(symbol, "cuLaunchKernel"))
        f = ptds ? (void *)cuLaunchKernel_ptsz : (void *)cuLaunchKernel;
    else if (!strcmp(symbol, "cuLaunchKernelEx"))
        f = ptds ? (void *)cuLaunchKernelEx_ptsz : (void *)cuLaunchKernelEx;
    else if (!strcmp(symbol, "cuGetProcAddress"))
        f = (void *)cuGetProcAddress_v2;
    if (status)
        *status = f ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *pfn = f;
    return f ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

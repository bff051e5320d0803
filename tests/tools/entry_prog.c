/* The program of the entry-point probe's test (tests/tools/entry_probe.sh): it reaches the launch
 * functions of DRIVER (argv[1], tests/tools/entry_fake_cuda.c) the way the CUDA runtime and
 * Triton do (dlsym of cuGetProcAddress_v2, then cuGetProcAddress; dlsym of a launch function by
 * name) and calls them: 3 cuLaunchKernel, 5 cuLaunchKernel_ptsz, 7 cuLaunchKernelEx (whose
 * error it must get back), 2 through cuLaunchKernel found by name, 1 through cuLaunchKernel from
 * the cuGetProcAddress that cuGetProcAddress gives for CUDA 13 (the five-argument one, whose
 * status it must fill). Prints the driver's counts, and the library each of the five launch
 * functions it was handed lies in (the driver's, or an interposer's wrapper). */
#define _GNU_SOURCE /* dladdr */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef PFN_cuGetProcAddress_v12000 gpa_fn; /* the toolkit's types (cudaTypedefs.h) */
typedef PFN_cuLaunchKernel_v4000 launch_fn;
typedef PFN_cuLaunchKernelEx_v11060 launch_ex_fn;

static const char *lib_of(void *fn)
{
    Dl_info info;
    if (!dladdr(fn, &info) || !info.dli_fname)
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

int main(int argc, char **argv)
{
    void *h = argc > 1 ? dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) : NULL;
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        fprintf(stderr, "entry_prog: no driver: %s\n", dlerror());
        return 1;
    }
    void *plain = NULL, *ptsz = NULL, *ex = NULL;
    if (gpa("cuLaunchKernel", &plain, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) ||
        gpa("cuLaunchKernel", &ptsz, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL) ||
        gpa("cuLaunchKernelEx", &ex, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL)) {
        fprintf(stderr, "entry_prog: cuGetProcAddress failed\n");
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < 3; i++)
        bad |= ((launch_fn)plain)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS;
    for (int i = 0; i < 5; i++)
        bad |= ((launch_fn)ptsz)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS;
    for (int i = 0; i < 7; i++)
        bad |= ((launch_ex_fn)ex)(NULL, NULL, NULL, NULL) != CUDA_ERROR_INVALID_VALUE;
    launch_fn named = (launch_fn)dlsym(h, "cuLaunchKernel");
    for (int i = 0; i < 2; i++)
        bad |= named(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS;
    gpa_fn gpa2 = NULL;
    void *again = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (gpa("cuGetProcAddress", (void **)&gpa2, 13000, CU_GET_PROC_ADDRESS_DEFAULT, NULL) ||
        gpa2("cuLaunchKernel", &again, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) ||
        st != CU_GET_PROC_ADDRESS_SUCCESS) {
        fprintf(stderr, "entry_prog: cuGetProcAddress through cuGetProcAddress failed\n");
        return 1;
    }
    bad |= ((launch_fn)again)(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS;
    const unsigned long *calls = dlsym(h, "fake_calls");
    printf("driver calls: %lu %lu %lu %lu; results %s\n", calls[0], calls[1], calls[2], calls[3],
           bad ? "WRONG" : "as the driver gave them");
    printf("launch functions from: %s %s %s %s %s\n", lib_of(plain), lib_of(ptsz), lib_of(ex),
           lib_of((void *)named), lib_of(again));
    return 0;
}

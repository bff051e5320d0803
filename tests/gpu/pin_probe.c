/* How fast can pinned host memory be made, and does it scale with threads? A measurement for
 * issue 5 (start-up from a profile pins the bytes the plan offloads while the program builds its
 * model), not a test: it prints one line per thread count, the wall time to create TOTAL MiB of
 * host physical memory (cuMemCreate, location HOST_NUMA 0, as the shim's pinner does) in
 * allocations of SIZE MiB split over the threads, and the rate.
 *
 *   pin_probe [SIZE_MIB [TOTAL_MIB]]     (defaults 256 and 4096) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda_api.h"

#define MAXN 4096

static CUcontext ctx;
static size_t size;
static CUmemGenericAllocationHandle handles[MAXN];

struct work {
    int first, n;
    int failed;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void *create_some(void *arg)
{
    struct work *w = arg;
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    p.location.id = 0;
    fs_cuda.cuCtxSetCurrent(ctx);
    for (int i = w->first; i < w->first + w->n; i++)
        if (fs_cuda.cuMemCreate(&handles[i], size, &p, 0) != CUDA_SUCCESS) {
            handles[i] = 0;
            w->failed++;
        }
    return NULL;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    size_t total = argc > 2 ? strtoull(argv[2], NULL, 10) : 4096;
    int n = mib ? (int)(total / mib) : 0;
    if (mib < 2 || mib % 2 || n < 8 || n > MAXN) {
        fprintf(stderr, "pin_probe: SIZE_MIB must be even, TOTAL_MIB/SIZE_MIB from 8 to %d\n",
                MAXN);
        return 2;
    }
    size = mib << 20;
    CUdevice dev;
    if (fs_cuda_load_driver() || fs_cuda.cuInit(0) != CUDA_SUCCESS ||
        fs_cuda.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        fs_cuda.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS) {
        fprintf(stderr, "pin_probe: no CUDA device\n");
        return 1;
    }
    static const int counts[] = {1, 2, 4, 8};
    int rc = 0;
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
        int t = counts[c];
        pthread_t th[8];
        struct work w[8];
        double t0 = now_ms();
        for (int k = 0; k < t; k++) {
            w[k] = (struct work){.first = k * (n / t), .n = n / t};
            pthread_create(&th[k], NULL, create_some, &w[k]);
        }
        int failed = 0;
        for (int k = 0; k < t; k++) {
            pthread_join(th[k], NULL);
            failed += w[k].failed;
        }
        double ms = now_ms() - t0;
        int made = (n / t) * t - failed;
        printf("pin_probe: %d thread(s): %d x %zu MiB of host memory in %.1f ms: %.2f GB/s "
               "(%.1f ms per allocation per thread)%s\n",
               t, made, mib, ms, (double)made * (double)size / ms / 1e6, ms / (n / t),
               failed ? " (some failed)" : "");
        rc |= failed != 0;
        double r0 = now_ms();
        for (int i = 0; i < n; i++)
            if (handles[i])
                fs_cuda.cuMemRelease(handles[i]);
        printf("pin_probe: released in %.1f ms\n", now_ms() - r0);
        memset(handles, 0, sizeof(handles));
    }
    fs_cuda.cuDevicePrimaryCtxRelease(dev);
    return rc;
}

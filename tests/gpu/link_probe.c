/* Does the link copy as fast from the host memory the shim copies from as from the pinned memory
 * a framework uses? A measurement for issue 5, not a test. In stop 31 the shim's decode copies
 * delivered about 50 GB/s while bench.py's W (torch's pinned memory) measured 53.5 and the
 * pipeline streamed at about 52.5 in the same session (docs/PERFORMANCE.md): this tells the kind
 * of host memory and copy apart from the host itself. It prints one line per case, size and
 * direction: the median of REPS timed copies, in GB/s.
 *
 *   link_probe [MiB ...]     (default 8 112 1024; 112 MiB is one of the 7b model's MLP matrices)
 *
 * Cases:
 *   vmm NODE     host physical memory (cuMemCreate, location HOST_NUMA NODE) mapped into a VA
 *                range, copied to and from VMM device memory by VA with cuMemcpyDtoDAsync: the
 *                shim's copies (core/device_cuda.c). NODE is the device's host NUMA node, as the
 *                shim picks it, and node 0 as well when that differs.
 *   vmm x3       three copies of the size at once on three streams (the executor's copy slots),
 *                rated by all their bytes over the time from the first start to the last end.
 *   hostalloc    cuMemHostAlloc memory, cuMemcpyHtoD / cuMemcpyDtoH to plain device memory,
 *                timed on the host: a framework's pinned copies (bench.py's W).
 * Uses the driver through the core's symbol table, like the shim. Exit 1 when a case could not
 * run, 2 on bad arguments. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda_api.h"

#define REPS 5
#define MAX_SIZES 8
#define MAX_MIB 16384
#define SLOTS 3

static CUdevice dev;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return v[n / 2];
}

static bool ok(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return true;
    const char *name = NULL;
    fs_cuda.cuGetErrorName(r, &name);
    fprintf(stderr, "link_probe: %s: %s\n", what, name ? name : "unknown error");
    return false;
}

/* A VA range of at least SIZE bytes (rounded up to the allocation granularity) backed by one
 * physical allocation at (TYPE, ID), readable and writable by the device. */
struct mapping {
    CUdeviceptr va;
    CUmemGenericAllocationHandle handle;
    size_t size;
};

static bool map_new(CUmemLocationType type, int id, size_t size, struct mapping *m)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = type;
    prop.location.id = id;
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)dev;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    memset(m, 0, sizeof(*m));
    size_t gran = 0;
    if (!ok(fs_cuda.cuMemGetAllocationGranularity(&gran, &prop,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity"))
        return false;
    if (gran)
        size = (size + gran - 1) / gran * gran;
    if (!ok(fs_cuda.cuMemAddressReserve(&m->va, size, 0, 0, 0), "cuMemAddressReserve"))
        return false;
    m->size = size;
    if (!ok(fs_cuda.cuMemCreate(&m->handle, size, &prop, 0), "cuMemCreate")) {
        m->handle = 0;
        return false;
    }
    return ok(fs_cuda.cuMemMap(m->va, size, 0, m->handle, 0), "cuMemMap") &&
           ok(fs_cuda.cuMemSetAccess(m->va, size, &access, 1), "cuMemSetAccess");
}

static void map_free(struct mapping *m)
{
    if (m->va && m->handle)
        fs_cuda.cuMemUnmap(m->va, m->size);
    if (m->handle)
        fs_cuda.cuMemRelease(m->handle);
    if (m->va)
        fs_cuda.cuMemAddressFree(m->va, m->size);
    memset(m, 0, sizeof(*m));
}

/* GB/s of NCOPIES copies of SIZE bytes from SRC[i] to DST[i], one per stream, all begun together
 * (median of REPS); negative on a failure. */
static double time_dtod(CUdeviceptr *dst, CUdeviceptr *src, int ncopies, size_t size,
                        CUstream *streams, CUevent start, CUevent *ends)
{
    double rate[REPS];
    for (int r = -1; r < REPS; r++) { /* r = -1: a warm-up */
        if (!ok(fs_cuda.cuEventRecord(start, streams[0]), "cuEventRecord"))
            return -1;
        for (int i = 0; i < ncopies; i++)
            if (!ok(fs_cuda.cuStreamWaitEvent(streams[i], start, 0), "cuStreamWaitEvent") ||
                !ok(fs_cuda.cuMemcpyDtoDAsync(dst[i], src[i], size, streams[i]),
                    "cuMemcpyDtoDAsync") ||
                !ok(fs_cuda.cuEventRecord(ends[i], streams[i]), "cuEventRecord"))
                return -1;
        float longest = 0;
        for (int i = 0; i < ncopies; i++) {
            float ms = 0;
            if (!ok(fs_cuda.cuEventSynchronize(ends[i]), "cuEventSynchronize") ||
                !ok(fs_cuda.cuEventElapsedTime(&ms, start, ends[i]), "cuEventElapsedTime"))
                return -1;
            if (ms > longest)
                longest = ms;
        }
        if (r >= 0)
            rate[r] = (double)size * ncopies / (longest * 1e6);
    }
    return median(rate, REPS);
}

static void report(const char *label, size_t mib, const char *dir, double gbps, int *bad)
{
    if (gbps < 0) {
        printf("link_probe: %-12s %5zu MiB %s: failed\n", label, mib, dir);
        *bad = 1;
    } else {
        printf("link_probe: %-12s %5zu MiB %s: %6.2f GB/s\n", label, mib, dir, gbps);
    }
}

/* The shim's copies: host VMM memory on NODE against VMM device memory, one copy and SLOTS at
 * once, both directions. */
static void probe_vmm(int node, size_t mib, CUstream *streams, CUevent start, CUevent *ends,
                      int *bad)
{
    size_t size = mib << 20;
    struct mapping host[SLOTS], devm[SLOTS];
    memset(host, 0, sizeof(host));
    memset(devm, 0, sizeof(devm));
    bool made = true;
    for (int i = 0; i < SLOTS && made; i++)
        made = map_new(CU_MEM_LOCATION_TYPE_HOST_NUMA, node, size, &host[i]) &&
               map_new(CU_MEM_LOCATION_TYPE_DEVICE, (int)dev, size, &devm[i]);
    char label[32], label3[32];
    snprintf(label, sizeof(label), "vmm %d", node);
    snprintf(label3, sizeof(label3), "vmm %d x%d", node, SLOTS);
    CUdeviceptr h[SLOTS], d[SLOTS];
    for (int i = 0; i < SLOTS; i++) {
        h[i] = host[i].va;
        d[i] = devm[i].va;
    }
    report(label, mib, "h2d", made ? time_dtod(d, h, 1, size, streams, start, ends) : -1, bad);
    report(label, mib, "d2h", made ? time_dtod(h, d, 1, size, streams, start, ends) : -1, bad);
    report(label3, mib, "h2d", made ? time_dtod(d, h, SLOTS, size, streams, start, ends) : -1,
           bad);
    report(label3, mib, "d2h", made ? time_dtod(h, d, SLOTS, size, streams, start, ends) : -1,
           bad);
    for (int i = 0; i < SLOTS; i++) {
        map_free(&host[i]);
        map_free(&devm[i]);
    }
}

/* A framework's copies: cuMemHostAlloc memory and plain device memory, synchronous copies timed
 * on the host (GB/s, median of REPS; negative on a failure). */
static double time_sync(bool h2d, CUdeviceptr d, void *h, size_t size)
{
    double rate[REPS];
    for (int r = -1; r < REPS; r++) {
        double t0 = now_ms();
        CUresult res = h2d ? fs_cuda.cuMemcpyHtoD(d, h, size) : fs_cuda.cuMemcpyDtoH(h, d, size);
        double ms = now_ms() - t0;
        if (!ok(res, h2d ? "cuMemcpyHtoD" : "cuMemcpyDtoH"))
            return -1;
        if (r >= 0)
            rate[r] = (double)size / (ms * 1e6);
    }
    return median(rate, REPS);
}

static void probe_hostalloc(size_t mib, int *bad)
{
    size_t size = mib << 20;
    void *h = NULL;
    CUdeviceptr d = 0;
    bool made = ok(fs_cuda.cuMemHostAlloc(&h, size, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc") &&
                ok(fs_cuda.cuMemAlloc(&d, size), "cuMemAlloc");
    report("hostalloc", mib, "h2d", made ? time_sync(true, d, h, size) : -1, bad);
    report("hostalloc", mib, "d2h", made ? time_sync(false, d, h, size) : -1, bad);
    if (d)
        fs_cuda.cuMemFree(d);
    if (h)
        fs_cuda.cuMemFreeHost(h);
}

int main(int argc, char **argv)
{
    size_t sizes[MAX_SIZES] = {8, 112, 1024};
    int nsizes = 3;
    if (argc > 1) {
        nsizes = 0;
        for (int i = 1; i < argc; i++) {
            char *end = NULL;
            unsigned long long v = strtoull(argv[i], &end, 10);
            if (nsizes == MAX_SIZES || !end || *end || v < 2 || v > MAX_MIB || v % 2) {
                fprintf(stderr,
                        "link_probe: '%s': sizes are even MiB from 2 to %d, at most %d of them "
                        "(e.g. link_probe 8 112 1024)\n",
                        argv[i], MAX_MIB, MAX_SIZES);
                return 2;
            }
            sizes[nsizes++] = (size_t)v;
        }
    }
    CUcontext ctx;
    if (fs_cuda_load_driver() || fs_cuda.cuInit(0) != CUDA_SUCCESS ||
        fs_cuda.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        fs_cuda.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        fs_cuda.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "link_probe: no CUDA device\n");
        return 1;
    }
    /* The shim's node: the device's host NUMA node when it has one, else 0. */
    int nodes[2] = {0, 0}, nnodes = 1, attr = -1;
    if (fs_cuda.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev) ==
            CUDA_SUCCESS &&
        attr > 0)
        nodes[nnodes++] = attr;
    printf("link_probe: the device's host NUMA node %d; the shim uses node %d\n", attr,
           nodes[nnodes - 1]);
    CUstream streams[SLOTS] = {0};
    CUevent start = NULL, ends[SLOTS] = {0};
    int bad = 0;
    for (int i = 0; i < SLOTS && !bad; i++)
        bad = !ok(fs_cuda.cuStreamCreateWithPriority(&streams[i], CU_STREAM_NON_BLOCKING, 0),
                  "cuStreamCreateWithPriority") ||
              !ok(fs_cuda.cuEventCreate(&ends[i], CU_EVENT_DEFAULT), "cuEventCreate");
    if (!bad)
        bad = !ok(fs_cuda.cuEventCreate(&start, CU_EVENT_DEFAULT), "cuEventCreate");
    for (int s = 0; s < nsizes && !bad; s++) {
        for (int n = nnodes - 1; n >= 0; n--)
            probe_vmm(nodes[n], sizes[s], streams, start, ends, &bad);
        probe_hostalloc(sizes[s], &bad);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (streams[i])
            fs_cuda.cuStreamDestroy(streams[i]);
        if (ends[i])
            fs_cuda.cuEventDestroy(ends[i]);
    }
    if (start)
        fs_cuda.cuEventDestroy(start);
    fs_cuda.cuDevicePrimaryCtxRelease(dev);
    return bad;
}

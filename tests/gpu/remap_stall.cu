// Do the driver's remaps slow the GPU's kernels? A measurement for issue 5, not a test.
//
// The default mode (OFFLOAD_MODE=prefetch) makes about 624 remaps a prefill step at half the 7b
// weights (four a prefetch/eviction pair: unmap device, map host, unmap host, map device) and
// runs about 5 ms a step (2%) behind noshim, while redirect mode (no remaps) and the hand-written
// pipeline do not, and the program's stream idles only 0.6-0.8 ms a step (stop 40). One
// explanation the host-side traces cannot check: each remap changes the GPU's page tables, and
// the kernels running meanwhile pay for it (TLB invalidations). This program measures that.
//
// usage: remap_stall [RANGES [MIB [SECONDS]]]   (defaults: 16 ranges of 64 MiB, 3 s a phase)
// build: nvcc -O2 -arch=sm_90 -o remap_stall remap_stall.cu -lcuda
//
// A 1 GiB buffer, created and mapped with the virtual memory API as the shim maps managed
// allocations, is read by a memory-bound kernel (a sum of every word: about 0.4 ms on an H100),
// launched in batches of BATCH, each batch timed with events. Three phases of SECONDS each:
// quiet, remapping (a second thread moves each of RANGES ranges of MIB through the default
// mode's four remaps, one after another, as fast as the driver allows) and quiet again. Nothing
// the kernel reads is remapped.
// stdout, one line a phase: batches, median and p90 ms a launch, remaps and remaps a ms; then
// the extra kernel time the remapping phase took over the quiet phases' median, per remap (us).
// Every CUDA call is checked; on an error it prints it and exits 1.
#include <cuda.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
#include <vector>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *s_ = "?";                                                                  \
            cuGetErrorString(r_, &s_);                                                             \
            fprintf(stderr, "remap_stall: %s failed: %s (line %d)\n", #call, s_, __LINE__);       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

enum { BATCH = 10, READ_MIB = 1024 };

__global__ void read_all(const uint4 *p, size_t n, unsigned long long *out)
{
    uint32_t s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        s += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (s == 0x9e3779b9u) // never true for the zeroed buffer: keeps the reads alive
        atomicAdd(out, 1ull);
}

static CUdevice dev;
static CUcontext ctx;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static CUmemAllocationProp prop_for(bool host)
{
    CUmemAllocationProp p = {};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = host ? 0 : (int)dev;
    return p;
}

static size_t granule(bool host)
{
    CUmemAllocationProp p = prop_for(host);
    size_t g = 0;
    CHECK(cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    return g;
}

static size_t round_up(size_t n, size_t g)
{
    return (n + g - 1) / g * g;
}

// Map HANDLE (SIZE bytes) at VA, readable and writable by the device.
static void map_rw(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle handle)
{
    CHECK(cuMemMap(va, size, 0, handle, 0));
    CUmemAccessDesc a = {};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = (int)dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(va, size, &a, 1));
}

struct ranges {
    size_t n, size;
    std::vector<CUdeviceptr> va;
    std::vector<CUmemGenericAllocationHandle> on_dev, on_host;
    volatile bool stop;
    unsigned long long remaps;
};

// The default mode's cycle, range after range: evict (unmap device, map host), then prefetch
// (unmap host, map device). The copies are left out: only the remaps are measured.
static void *remap_loop(void *arg)
{
    ranges *r = (ranges *)arg;
    CHECK(cuCtxSetCurrent(ctx));
    for (size_t k = 0; !r->stop; k = (k + 1) % r->n) {
        CHECK(cuMemUnmap(r->va[k], r->size));
        map_rw(r->va[k], r->size, r->on_host[k]);
        CHECK(cuMemUnmap(r->va[k], r->size));
        map_rw(r->va[k], r->size, r->on_dev[k]);
        __atomic_add_fetch(&r->remaps, 4, __ATOMIC_RELAXED);
    }
    return NULL;
}

struct phase {
    std::vector<double> ms; // a launch, batch by batch
    unsigned long long remaps;
    double seconds;
};

static phase run_phase(const char *name, double seconds, CUstream st, CUdeviceptr buf, size_t n16,
                       CUdeviceptr out, ranges *r)
{
    phase ph = {};
    CUevent a, b;
    CHECK(cuEventCreate(&a, CU_EVENT_DEFAULT));
    CHECK(cuEventCreate(&b, CU_EVENT_DEFAULT));
    pthread_t t;
    unsigned long long r0 = r ? __atomic_load_n(&r->remaps, __ATOMIC_RELAXED) : 0;
    if (r) {
        r->stop = false;
        if (pthread_create(&t, NULL, remap_loop, r) != 0) {
            fprintf(stderr, "remap_stall: pthread_create failed\n");
            exit(1);
        }
    }
    double t0 = now_s();
    while (now_s() - t0 < seconds) {
        CHECK(cuEventRecord(a, st));
        for (int i = 0; i < BATCH; i++)
            read_all<<<1056, 512, 0, st>>>((const uint4 *)buf, n16, (unsigned long long *)out);
        CHECK(cuEventRecord(b, st));
        CHECK(cuEventSynchronize(b));
        float ms = 0;
        CHECK(cuEventElapsedTime(&ms, a, b));
        ph.ms.push_back(ms / BATCH);
    }
    ph.seconds = now_s() - t0;
    if (r) {
        r->stop = true;
        pthread_join(t, NULL);
        ph.remaps = __atomic_load_n(&r->remaps, __ATOMIC_RELAXED) - r0;
    }
    std::vector<double> s = ph.ms;
    std::sort(s.begin(), s.end());
    printf("remap_stall: %-9s %5zu batches of %d: a launch median %.4f ms, p90 %.4f ms; "
           "%llu remaps (%.2f a ms)\n",
           name, s.size(), BATCH, s[s.size() / 2], s[s.size() * 9 / 10], ph.remaps,
           ph.remaps / (ph.seconds * 1e3));
    CHECK(cuEventDestroy(a));
    CHECK(cuEventDestroy(b));
    return ph;
}

int main(int argc, char **argv)
{
    ranges r = {};
    r.n = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 64;
    double seconds = argc > 3 ? atof(argv[3]) : 3.0;
    if (r.n < 1 || r.n > 256 || mib < 2 || mib > 4096 || !(seconds > 0 && seconds <= 60)) {
        fprintf(stderr, "usage: remap_stall [RANGES 1-256 [MIB 2-4096 [SECONDS 0-60]]]\n");
        return 2;
    }
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    r.size = round_up(mib << 20, std::max(granule(false), granule(true)));

    // The kernel's buffer, mapped as the shim maps a managed allocation, and zeroed.
    size_t rsize = round_up((size_t)READ_MIB << 20, granule(false));
    CUmemAllocationProp dp = prop_for(false);
    CUmemGenericAllocationHandle rh;
    CUdeviceptr buf, out;
    CHECK(cuMemCreate(&rh, rsize, &dp, 0));
    CHECK(cuMemAddressReserve(&buf, rsize, 0, 0, 0));
    map_rw(buf, rsize, rh);
    CHECK(cuMemsetD8(buf, 0, rsize));
    CHECK(cuMemAlloc(&out, sizeof(unsigned long long)));
    CHECK(cuMemsetD8(out, 0, sizeof(unsigned long long)));

    // The remapped ranges: each with device and host memory of its own, mapped on the device.
    CUmemAllocationProp hp = prop_for(true);
    CUdeviceptr base;
    CHECK(cuMemAddressReserve(&base, r.n * r.size, 0, 0, 0));
    for (size_t k = 0; k < r.n; k++) {
        CUmemGenericAllocationHandle d, h;
        CHECK(cuMemCreate(&d, r.size, &dp, 0));
        CHECK(cuMemCreate(&h, r.size, &hp, 0));
        r.va.push_back(base + k * r.size);
        r.on_dev.push_back(d);
        r.on_host.push_back(h);
        map_rw(r.va[k], r.size, d);
    }

    CUstream st;
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    size_t n16 = rsize / sizeof(uint4);
    run_phase("warm-up", 0.5, st, buf, n16, out, NULL);
    phase q1 = run_phase("quiet", seconds, st, buf, n16, out, NULL);
    phase rm = run_phase("remapping", seconds, st, buf, n16, out, &r);
    phase q2 = run_phase("quiet", seconds, st, buf, n16, out, NULL);
    CHECK(cuCtxSynchronize());

    std::vector<double> quiet = q1.ms;
    quiet.insert(quiet.end(), q2.ms.begin(), q2.ms.end());
    std::sort(quiet.begin(), quiet.end());
    double base_ms = quiet[quiet.size() / 2], extra_ms = 0;
    for (double ms : rm.ms)
        extra_ms += (ms - base_ms) * BATCH;
    printf("remap_stall: %zu ranges of %zu MiB; the remapping phase's kernels took %.3f ms more "
           "than the quiet median (%.4f ms a launch) would: %.2f us a remap\n",
           r.n, r.size >> 20, extra_ms, base_ms,
           rm.remaps ? extra_ms * 1e3 / rm.remaps : 0.0);

    for (size_t k = 0; k < r.n; k++) {
        CHECK(cuMemUnmap(r.va[k], r.size));
        CHECK(cuMemRelease(r.on_dev[k]));
        CHECK(cuMemRelease(r.on_host[k]));
    }
    CHECK(cuMemAddressFree(base, r.n * r.size));
    CHECK(cuMemUnmap(buf, rsize));
    CHECK(cuMemRelease(rh));
    CHECK(cuMemAddressFree(buf, rsize));
    CHECK(cuMemFree(out));
    CHECK(cuStreamDestroy(st));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

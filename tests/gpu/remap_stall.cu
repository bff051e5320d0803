// Do the driver's remaps slow the GPU's kernels? A measurement for issue 5, not a test.
//
// The default mode (OFFLOAD_MODE=prefetch) makes about 624 remaps a prefill step at half the 7b
// weights (four a prefetch/eviction pair: unmap device, map host, unmap host, map device) and
// ran 2.0-3.6% (5-9 ms a step) over noshim in stop 40, redirect mode (no remaps) 0.1-1.4%, while
// the program's stream idled only 0.6-0.8 ms a step. One explanation the host-side traces
// cannot check: each remap changes the GPU's page tables, and the kernels running meanwhile pay
// for it (TLB invalidations). This program measures that.
//
// usage: remap_stall [RANGES [MIB [SECONDS [GROUP]]]]
//        (defaults: 16 ranges of 64 MiB, 2 s a phase, groups of 4)
// build: nvcc -O2 -arch=sm_90 -o remap_stall remap_stall.cu -lcuda
//
// A 1 GiB buffer, created and mapped with the virtual memory API as the shim maps managed
// allocations, is read by a memory-bound kernel (a sum of every word: about 0.4 ms on an H100),
// launched in batches of BATCH, each batch timed with events. Five phases of SECONDS each:
// quiet; remapping, where a second thread moves the RANGES adjacent ranges of MIB, one after
// another and as fast as the driver allows, through the default mode's cycle (unmap device, map
// host, unmap host, map device; each map with its set-access call); quiet; remapping in groups of
// GROUP adjacent ranges (one unmap and one set-access call over the group, a map call per range:
// does batching the remaps, a lever issue 5 names, cost the GPU or the host less?); quiet.
// Nothing the kernel reads is remapped.
// stdout, one line a phase: batches, median and p90 ms a launch, and for a remapping phase the
// range cycles and the host's ms a cycle (the driver does one remap at a time); then, for each
// remapping phase, the extra kernel time over the quiet phases' median launch, per range cycle
// (us). Every CUDA call is checked; on an error (a grouped unmap or set-access call the driver
// refuses included) it prints it and exits 1.
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

struct ranges {
    size_t n, size, group;
    CUdeviceptr base; // range K is at base + K * size
    std::vector<CUmemGenericAllocationHandle> on_dev, on_host;
    bool stop;                 // set by the main thread (atomic)
    unsigned long long cycles; // ranges moved to host and back (the remapping thread's)
    char failed[160];          // the driver call that failed on the remapping thread, if one did
};

static CUdeviceptr at(const ranges *r, size_t k)
{
    return r->base + k * r->size;
}

static CUmemAccessDesc rw_access(void)
{
    CUmemAccessDesc a = {};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = (int)dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return a;
}

// On the remapping thread a failure ends the loop, and the main thread reports it after the join
// (an exit() there could run while the main thread is inside the driver).
static bool remap_ok(ranges *r, CUresult rc, const char *what)
{
    if (rc == CUDA_SUCCESS)
        return true;
    const char *msg = "?";
    cuGetErrorString(rc, &msg);
    snprintf(r->failed, sizeof(r->failed), "%s over %zu ranges failed: %s", what, r->group, msg);
    return false;
}

// Map the GROUP ranges from K at their addresses, backed by HANDLES, with one set-access call.
static bool map_group(ranges *r, size_t k, const std::vector<CUmemGenericAllocationHandle> &h)
{
    for (size_t j = k; j < k + r->group; j++)
        if (!remap_ok(r, cuMemMap(at(r, j), r->size, 0, h[j], 0), "cuMemMap"))
            return false;
    CUmemAccessDesc a = rw_access();
    return remap_ok(r, cuMemSetAccess(at(r, k), r->group * r->size, &a, 1), "cuMemSetAccess");
}

// The default mode's cycle, group after group: evict (unmap device, map host), then prefetch
// (unmap host, map device). The copies are left out: only the remaps are measured.
static void *remap_loop(void *arg)
{
    ranges *r = (ranges *)arg;
    if (!remap_ok(r, cuCtxSetCurrent(ctx), "cuCtxSetCurrent"))
        return NULL;
    for (size_t k = 0; !__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE); k = (k + r->group) % r->n) {
        size_t bytes = r->group * r->size;
        if (!remap_ok(r, cuMemUnmap(at(r, k), bytes), "cuMemUnmap") ||
            !map_group(r, k, r->on_host) ||
            !remap_ok(r, cuMemUnmap(at(r, k), bytes), "cuMemUnmap") || !map_group(r, k, r->on_dev))
            return NULL;
        r->cycles += r->group;
    }
    return NULL;
}

struct phase {
    std::vector<double> ms; // a launch, batch by batch
    unsigned long long cycles;
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
    unsigned long long c0 = r ? r->cycles : 0;
    if (r) {
        __atomic_store_n(&r->stop, false, __ATOMIC_RELEASE);
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
        __atomic_store_n(&r->stop, true, __ATOMIC_RELEASE);
        pthread_join(t, NULL);
        if (r->failed[0]) {
            fprintf(stderr, "remap_stall: %s: %s\n", name, r->failed);
            exit(1);
        }
        ph.cycles = r->cycles - c0;
    }
    std::vector<double> s = ph.ms;
    std::sort(s.begin(), s.end());
    char moved[96] = "";
    if (r)
        snprintf(moved, sizeof(moved), "; %llu range cycles (host %.3f ms a cycle)", ph.cycles,
                 ph.cycles ? ph.seconds * 1e3 / ph.cycles : 0.0);
    printf("remap_stall: %-18s %5zu batches of %d: a launch median %.4f ms, p90 %.4f ms%s\n", name,
           s.size(), BATCH, s[s.size() / 2], s[s.size() * 9 / 10], moved);
    CHECK(cuEventDestroy(a));
    CHECK(cuEventDestroy(b));
    return ph;
}

int main(int argc, char **argv)
{
    ranges r = {};
    r.n = argc > 1 ? strtoul(argv[1], NULL, 10) : 16;
    size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 64;
    double seconds = argc > 3 ? atof(argv[3]) : 2.0;
    size_t group = argc > 4 ? strtoul(argv[4], NULL, 10) : 4;
    if (r.n < 1 || r.n > 256 || mib < 2 || mib > 4096 || !(seconds > 0 && seconds <= 60) ||
        group < 1 || r.n % group != 0) {
        fprintf(stderr, "usage: remap_stall [RANGES 1-256 [MIB 2-4096 [SECONDS 0-60 [GROUP, "
                        "dividing RANGES]]]]\n");
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
    CUmemAccessDesc rw = rw_access();
    CHECK(cuMemMap(buf, rsize, 0, rh, 0));
    CHECK(cuMemSetAccess(buf, rsize, &rw, 1));
    CHECK(cuMemsetD8(buf, 0, rsize));
    CHECK(cuMemAlloc(&out, sizeof(unsigned long long)));
    CHECK(cuMemsetD8(out, 0, sizeof(unsigned long long)));

    // The remapped ranges: each with device and host memory of its own, mapped on the device.
    CUmemAllocationProp hp = prop_for(true);
    CHECK(cuMemAddressReserve(&r.base, r.n * r.size, 0, 0, 0));
    for (size_t k = 0; k < r.n; k++) {
        CUmemGenericAllocationHandle d, h;
        CHECK(cuMemCreate(&d, r.size, &dp, 0));
        CHECK(cuMemCreate(&h, r.size, &hp, 0));
        r.on_dev.push_back(d);
        r.on_host.push_back(h);
        CHECK(cuMemMap(at(&r, k), r.size, 0, d, 0));
    }
    CHECK(cuMemSetAccess(r.base, r.n * r.size, &rw, 1));

    CUstream st;
    CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    size_t n16 = rsize / sizeof(uint4);
    run_phase("warm-up", 0.5, st, buf, n16, out, NULL);
    std::vector<double> quiet;
    phase rm[2];
    for (int i = 0; i < 5; i++) {
        if (i % 2) {
            r.group = i == 1 ? 1 : group;
            char name[48];
            snprintf(name, sizeof(name), "remapping, by %zu", r.group);
            rm[i / 2] = run_phase(name, seconds, st, buf, n16, out, &r);
        } else {
            phase q = run_phase("quiet", seconds, st, buf, n16, out, NULL);
            quiet.insert(quiet.end(), q.ms.begin(), q.ms.end());
        }
    }
    CHECK(cuCtxSynchronize());

    std::sort(quiet.begin(), quiet.end());
    double base_ms = quiet[quiet.size() / 2];
    for (int i = 0; i < 2; i++) {
        double extra_ms = 0;
        for (double ms : rm[i].ms)
            extra_ms += (ms - base_ms) * BATCH;
        printf("remap_stall: %zu ranges of %zu MiB, by %zu: the kernels took %.3f ms more than "
               "the quiet median (%.4f ms a launch) would: %.2f us a range cycle\n",
               r.n, r.size >> 20, i ? group : 1, extra_ms, base_ms,
               rm[i].cycles ? extra_ms * 1e3 / rm[i].cycles : 0.0);
    }

    for (size_t k = 0; k < r.n; k++) {
        CHECK(cuMemUnmap(at(&r, k), r.size));
        CHECK(cuMemRelease(r.on_dev[k]));
        CHECK(cuMemRelease(r.on_host[k]));
    }
    CHECK(cuMemAddressFree(r.base, r.n * r.size));
    CHECK(cuMemUnmap(buf, rsize));
    CHECK(cuMemRelease(rh));
    CHECK(cuMemAddressFree(buf, rsize));
    CHECK(cuMemFree(out));
    CHECK(cuStreamDestroy(st));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}

/* What does it cost to move a VA range between device and host physical memory, and what makes
 * that cheaper? A measurement for issue 5, not a test: it prints one line per case, the median of
 * REPS runs in ms per GiB (and per call), so the remap levers can be ranked on the real driver.
 *
 *   remap_probe [MiB]     (default 256: the size of one range)
 *
 * Cases: host memory as one physical allocation or as 2 MiB pieces (one set-access call over
 * all of them, or one per piece); read-only access; the recommended host granularity; range
 * sizes; location HOST instead of HOST_NUMA; the first mapping of a fresh host allocation against later ones; device memory; and
 * two threads at once (does the driver serialize remaps, and does a device remap wait behind a
 * host one?). Uses the driver through the core's symbol table, like the shim. */
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda_api.h"
#include "core/fs.h"

#define REPS 7
#define PIECE (2ull << 20)
#define MAXP 1024

static CUdevice dev;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "remap_probe: %s failed: %s\n", what, fs_cuda_errstr(r));
        return -1;
    }
    return 0;
}

/* Host memory's location type: HOST_NUMA (node 0, what the shim uses) or HOST. */
static CUmemLocationType host_type = CU_MEM_LOCATION_TYPE_HOST_NUMA;

static void prop_for(CUmemAllocationProp *p, bool host)
{
    memset(p, 0, sizeof(*p));
    p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->location.type = host ? host_type : CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = host ? 0 : (int)dev;
}

/* A range of SIZE bytes backed by N physical pieces of equal size. */
struct range {
    CUdeviceptr va;
    size_t size, piece;
    int n;
    CUmemGenericAllocationHandle h[MAXP];
};

static int range_create(struct range *r, size_t size, size_t piece, bool host)
{
    CUmemAllocationProp p;
    prop_for(&p, host);
    memset(r, 0, sizeof(*r));
    r->size = size;
    r->piece = piece;
    r->n = (int)(size / piece);
    if (r->n > MAXP || check(fs_cuda.cuMemAddressReserve(&r->va, size, 2ull << 20, 0, 0), "reserve"))
        return -1;
    for (int i = 0; i < r->n; i++)
        if (check(fs_cuda.cuMemCreate(&r->h[i], piece, &p, 0), "cuMemCreate"))
            return -1;
    return 0;
}

static void range_destroy(struct range *r)
{
    for (int i = 0; i < r->n; i++)
        fs_cuda.cuMemRelease(r->h[i]);
    fs_cuda.cuMemAddressFree(r->va, r->size);
}

/* Map every piece, then set access (one call over the range or one per piece). Times each
 * half into MAP and ACC (ms). */
static int range_map(struct range *r, bool per_piece_access, CUmemAccess_flags flags, double *map,
                     double *acc)
{
    CUmemAccessDesc a = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)dev},
                         .flags = flags};
    double t0 = now_ms();
    for (int i = 0; i < r->n; i++)
        if (check(fs_cuda.cuMemMap(r->va + i * r->piece, r->piece, 0, r->h[i], 0), "cuMemMap"))
            return -1;
    double t1 = now_ms();
    if (per_piece_access) {
        for (int i = 0; i < r->n; i++)
            if (check(fs_cuda.cuMemSetAccess(r->va + i * r->piece, r->piece, &a, 1), "access"))
                return -1;
    } else if (check(fs_cuda.cuMemSetAccess(r->va, r->size, &a, 1), "cuMemSetAccess")) {
        return -1;
    }
    *map = t1 - t0;
    *acc = now_ms() - t1;
    return 0;
}

static int range_unmap(struct range *r, double *ms)
{
    double t0 = now_ms();
    for (int i = 0; i < r->n; i++)
        if (check(fs_cuda.cuMemUnmap(r->va + i * r->piece, r->piece), "cuMemUnmap"))
            return -1;
    *ms = now_ms() - t0;
    return 0;
}

/* One case: REPS map/access/unmap cycles on a fresh range; the first cycle is reported apart. */
static int run_case(const char *name, size_t size, size_t piece, bool host, bool per_piece,
                    CUmemAccess_flags flags)
{
    struct range r;
    double map[REPS], acc[REPS], un[REPS];
    if (range_create(&r, size, piece, host))
        return -1;
    for (int i = 0; i < REPS; i++)
        if (range_map(&r, per_piece, flags, &map[i], &acc[i]) || range_unmap(&r, &un[i]))
            return -1;
    double gib = (double)size / (1ull << 30), first = map[0] + acc[0];
    double m = fs_median(map, REPS), a = fs_median(acc, REPS), u = fs_median(un, REPS);
    printf("%-44s %6zu MiB  map %7.3f  access %7.3f  unmap %7.3f ms/GiB  (%.3f ms a range; "
           "first map+access %.3f ms)\n",
           name, size >> 20, m / gib, a / gib, u / gib, m + a + u, first);
    range_destroy(&r);
    return 0;
}

/* Two threads remapping at once: each cycles its own range COUNT times. */
struct worker {
    struct range r;
    CUcontext ctx;
    int count;
    double ms;     /* wall time of the loop */
    double max_ms; /* longest single map+access+unmap */
    int rc;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    fs_cuda.cuCtxSetCurrent(w->ctx);
    double t0 = now_ms();
    for (int i = 0; i < w->count && !w->rc; i++) {
        double m, a, u, s = now_ms();
        w->rc = range_map(&w->r, false, CU_MEM_ACCESS_FLAGS_PROT_READWRITE, &m, &a) ||
                range_unmap(&w->r, &u);
        double d = now_ms() - s;
        if (d > w->max_ms)
            w->max_ms = d;
    }
    w->ms = now_ms() - t0;
    return NULL;
}

/* Host remaps on one thread alone, device remaps alone, then both at once. */
static int run_pair(CUcontext ctx, size_t size)
{
    static struct worker h, d;
    memset(&h, 0, sizeof(h));
    memset(&d, 0, sizeof(d));
    if (range_create(&h.r, size, size, true) || range_create(&d.r, 32ull << 20, 32ull << 20, false))
        return -1;
    h.ctx = d.ctx = ctx;
    h.count = 8;
    d.count = 200;
    worker_main(&h);
    double h_alone = h.ms;
    worker_main(&d);
    double d_alone = d.ms, d_alone_max = d.max_ms;
    h.max_ms = d.max_ms = 0;
    pthread_t th, td;
    pthread_create(&th, NULL, worker_main, &h);
    pthread_create(&td, NULL, worker_main, &d);
    pthread_join(th, NULL);
    pthread_join(td, NULL);
    if (h.rc || d.rc)
        return -1;
    printf("concurrent: %d host remaps of %zu MiB alone %.1f ms; 200 device remaps of 32 MiB "
           "alone %.1f ms (longest %.3f)\n",
           h.count, size >> 20, h_alone, d_alone, d_alone_max);
    printf("concurrent: together host %.1f ms, device %.1f ms (longest device remap %.3f ms)\n",
           h.ms, d.ms, d.max_ms);
    range_destroy(&h.r);
    range_destroy(&d.r);
    return 0;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    size_t size = mib << 20;
    CUcontext ctx;
    if (mib < 2 || mib % 2 || mib > 2048) {
        fprintf(stderr, "remap_probe: MiB must be an even number from 2 to 2048\n");
        return 2;
    }
    if (fs_cuda_load_driver() || check(fs_cuda.cuInit(0), "cuInit") ||
        check(fs_cuda.cuDeviceGet(&dev, 0), "cuDeviceGet") ||
        check(fs_cuda.cuDevicePrimaryCtxRetain(&ctx, dev), "retain") ||
        check(fs_cuda.cuCtxSetCurrent(ctx), "set current"))
        return 1;
    CUmemAllocationProp p;
    size_t gmin = 0, grec = 0;
    prop_for(&p, true);
    fs_cuda.cuMemGetAllocationGranularity(&gmin, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    fs_cuda.cuMemGetAllocationGranularity(&grec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    printf("host NUMA granularity: minimum %zu KiB, recommended %zu KiB\n", gmin >> 10, grec >> 10);
    const CUmemAccess_flags rw = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    int rc = run_case("host, one allocation", size, size, true, false, rw) ||
             run_case("host, 2 MiB pieces, one set-access call", size, PIECE, true, false, rw) ||
             run_case("host, 2 MiB pieces, a set-access call each", size, PIECE, true, true, rw) ||
             run_case("host, one allocation, read-only access", size, size, true, false,
                      CU_MEM_ACCESS_FLAGS_PROT_READ) ||
             run_case("host, one allocation", 32ull << 20, 32ull << 20, true, false, rw) ||
             run_case("host, one allocation", 1ull << 30, 1ull << 30, true, false, rw) ||
             (grec > PIECE && size % grec == 0 &&
              run_case("host, recommended-granularity pieces", size, grec, true, false, rw)) ||
             run_case("device, one allocation", size, size, false, false, rw) ||
             (host_type = CU_MEM_LOCATION_TYPE_HOST,
              run_case("host (location HOST), one allocation", size, size, true, false, rw)) ||
             (host_type = CU_MEM_LOCATION_TYPE_HOST_NUMA, 0) ||
             run_pair(ctx, size);
    fs_cuda.cuDevicePrimaryCtxRelease(dev);
    return rc ? 1 : 0;
}

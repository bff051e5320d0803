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
 *   shim         the shim's own copies, through the device interface (core/device_cuda.c): host-
 *                and device-located physical blocks (fs_phys_block_create, host memory on the
 *                NUMA node the shim picks) copied by VA with copy_async, timed with its events.
 *   shim x3      three such copies at once on three streams (the executor's copy slots), rated
 *                by all their bytes over the time from the first start to the last end.
 *   hostalloc    host_alloc memory (cuMemHostAlloc) and mem_alloc device memory (cuMemAlloc),
 *                copied with cuMemcpyHtoD / cuMemcpyDtoH and timed on the host: a framework's
 *                pinned copies (bench.py's W).
 * Exit 1 when a case could not run, 2 on bad arguments. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda_api.h"
#include "core/device.h"
#include "core/phys_pool.h"

#define REPS 5
#define MAX_SIZES 8
#define MAX_MIB 16384
#define SLOTS 3

/* RC, said on stderr when it is a failure. */
static int said(int rc, const char *what)
{
    if (rc != FS_OK)
        fprintf(stderr, "link_probe: %s: %s\n", what, fs_err_str(rc));
    return rc;
}

/* The streams and events the timed copies use. */
struct timing {
    fs_stream streams[SLOTS];
    fs_event start, ends[SLOTS];
};

/* GB/s of NCOPIES copies of SIZE bytes from SRC[i] to DST[i], one per stream, all begun together
 * (median of REPS); negative on a failure. */
static double time_copies(struct fs_device *dev, const struct timing *t, const fs_dptr *dst,
                          const fs_dptr *src, int ncopies, uint64_t size)
{
    double rate[REPS];
    for (int r = -1; r < REPS; r++) { /* r = -1: a warm-up */
        if (said(fs_dev_call(dev, event_record, t->start, t->streams[0]), "event_record"))
            return -1;
        for (int i = 0; i < ncopies; i++)
            if (said(fs_dev_call(dev, stream_wait_event, t->streams[i], t->start),
                     "stream_wait_event") ||
                said(fs_dev_call(dev, copy_async, dst[i], src[i], size, t->streams[i]),
                     "copy_async") ||
                said(fs_dev_call(dev, event_record, t->ends[i], t->streams[i]), "event_record"))
                return -1;
        float longest = 0;
        for (int i = 0; i < ncopies; i++) {
            float ms = 0;
            if (said(fs_dev_call(dev, event_sync, t->ends[i]), "event_sync") ||
                said(fs_dev_call(dev, event_elapsed_ms, t->start, t->ends[i], &ms),
                     "event_elapsed_ms"))
                return -1;
            if (ms > longest)
                longest = ms;
        }
        if (r >= 0)
            rate[r] = (double)size * ncopies / (longest * 1e6);
    }
    return fs_median(rate, REPS);
}

static void report(const char *label, size_t mib, const char *dir, double gbps, int *bad)
{
    if (gbps < 0) {
        printf("link_probe: %-9s %5zu MiB %s: failed\n", label, mib, dir);
        *bad = 1;
    } else {
        printf("link_probe: %-9s %5zu MiB %s: %6.2f GB/s\n", label, mib, dir, gbps);
    }
}

/* The shim's copies: host blocks against device blocks, one copy and SLOTS at once, both ways. */
static void probe_shim(struct fs_device *dev, const struct timing *t, size_t mib, int *bad)
{
    uint64_t size = (uint64_t)mib << 20, gran = dev->props.granularity;
    uint64_t block = fs_round_up(size, gran);
    struct fs_block *host[SLOTS] = {0}, *devb[SLOTS] = {0};
    bool made = true;
    for (int i = 0; i < SLOTS && made; i++)
        made = !said(fs_phys_block_create(dev, FS_LOC_HOST, block, &host[i]), "host block") &&
               !said(fs_phys_block_create(dev, FS_LOC_DEVICE, block, &devb[i]), "device block");
    fs_dptr h[SLOTS] = {0}, d[SLOTS] = {0};
    for (int i = 0; i < SLOTS && made; i++) {
        h[i] = host[i]->copy_va;
        d[i] = devb[i]->copy_va;
    }
    report("shim", mib, "h2d", made ? time_copies(dev, t, d, h, 1, size) : -1, bad);
    report("shim", mib, "d2h", made ? time_copies(dev, t, h, d, 1, size) : -1, bad);
    report("shim x3", mib, "h2d", made ? time_copies(dev, t, d, h, SLOTS, size) : -1, bad);
    report("shim x3", mib, "d2h", made ? time_copies(dev, t, h, d, SLOTS, size) : -1, bad);
    for (int i = 0; i < SLOTS; i++) {
        if (host[i])
            fs_phys_block_release(dev, host[i]);
        if (devb[i])
            fs_phys_block_release(dev, devb[i]);
    }
}

/* A framework's copies: synchronous, timed on the host (GB/s, median of REPS; negative on a
 * failure). */
static double time_sync(bool h2d, fs_dptr d, void *h, uint64_t size)
{
    double rate[REPS];
    for (int r = -1; r < REPS; r++) {
        uint64_t t0 = fs_now_ns();
        CUresult res = h2d ? fs_cuda.cuMemcpyHtoD(d, h, size) : fs_cuda.cuMemcpyDtoH(h, d, size);
        uint64_t ns = fs_now_ns() - t0;
        if (res != CUDA_SUCCESS) {
            fprintf(stderr, "link_probe: %s: %s\n", h2d ? "cuMemcpyHtoD" : "cuMemcpyDtoH",
                    fs_cuda_errstr(res));
            return -1;
        }
        if (r >= 0)
            rate[r] = (double)size / (double)ns;
    }
    return fs_median(rate, REPS);
}

static void probe_hostalloc(struct fs_device *dev, size_t mib, int *bad)
{
    uint64_t size = (uint64_t)mib << 20;
    void *h = NULL;
    fs_dptr d = 0;
    bool made = !said(fs_dev_call(dev, host_alloc, size, &h), "host_alloc") &&
                !said(fs_dev_call(dev, mem_alloc, size, &d), "mem_alloc");
    report("hostalloc", mib, "h2d", made ? time_sync(true, d, h, size) : -1, bad);
    report("hostalloc", mib, "d2h", made ? time_sync(false, d, h, size) : -1, bad);
    if (d)
        fs_dev_call(dev, mem_free, d);
    if (h)
        fs_dev_call(dev, host_free, h);
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
    struct fs_device *dev = NULL;
    if (said(fs_device_cuda_open(0, &dev), "no CUDA device 0"))
        return 1;
    /* The hostalloc case calls the driver itself: the device's context on this thread. */
    if (said(fs_dev_call(dev, bind_thread), "bind_thread")) {
        fs_dev_call(dev, close);
        return 1;
    }
    if (!dev->props.host_phys_supported) {
        fprintf(stderr, "link_probe: %s cannot map host-located memory: the shim cannot run "
                        "here\n", dev->props.name);
        fs_dev_call(dev, close);
        return 1;
    }
    printf("link_probe: %s\n", dev->props.name);
    struct timing t;
    memset(&t, 0, sizeof(t));
    int bad =
        said(fs_dev_call(dev, event_create, FS_EVENT_TIMING, &t.start), "event_create") != FS_OK;
    for (int i = 0; i < SLOTS && !bad; i++)
        bad = said(fs_dev_call(dev, stream_create, &t.streams[i]), "stream_create") ||
              said(fs_dev_call(dev, event_create, FS_EVENT_TIMING, &t.ends[i]), "event_create");
    for (int s = 0; s < nsizes && !bad; s++) {
        probe_shim(dev, &t, sizes[s], &bad);
        probe_hostalloc(dev, sizes[s], &bad);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (t.streams[i])
            fs_dev_call(dev, stream_destroy, t.streams[i]);
        if (t.ends[i])
            fs_dev_call(dev, event_destroy, t.ends[i]);
    }
    if (t.start)
        fs_dev_call(dev, event_destroy, t.start);
    fs_dev_call(dev, close);
    return bad;
}

/* GPU test of core/device_cuda.c: the real device interface on device 0.
 *
 * Exercises fs_device_cuda_open for real: properties, device- and host-located physical memory
 * mapped at device VAs, remapping one VA between the two while keeping its contents, copies,
 * streams and events (timing a 256 MiB host->device copy), a second thread, and failure paths.
 * Only the fs_device interface is used, plus fs_cuda.cuMemcpyHtoD/DtoH/MemsetD32 to put data in
 * and read it back.
 *
 * Usage: test_device_cuda [-v]   (-v: debug log)
 * Prints one line per check and "device_cuda: N passed, M failed"; exit 0 only if all passed. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "device.h"
#include "fs.h"
#include "fingerprint.h"
#include "log.h"

#define MiB ((uint64_t)1 << 20)

static int n_pass, n_fail;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            n_pass++;                                                                              \
            printf("PASS ");                                                                       \
        } else {                                                                                   \
            n_fail++;                                                                              \
            printf("FAIL ");                                                                       \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
    } while (0)

/* A device call that must succeed: prints the check line with the error if it did not. */
#define OK(dev, expr, what)                                                                        \
    ({                                                                                             \
        int ok_err_ = (expr);                                                                      \
        CHECK(ok_err_ == FS_OK, "%s -> %s (native %d)", (what), fs_err_str(ok_err_),               \
              ok_err_ == FS_OK ? 0 : (dev)->ops->last_native_error(dev));                          \
        ok_err_ == FS_OK;                                                                          \
    })

static int finish(void)
{
    printf("device_cuda: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail == 0 && n_pass > 0 ? 0 : 1;
}

static void fill_pattern(uint32_t *buf, uint64_t bytes, uint32_t seed)
{
    for (uint64_t i = 0; i < bytes / 4; i++)
        buf[i] = (uint32_t)(i * 2654435761u) ^ seed;
}

/* This thread's CPU time. */
static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Index of the first differing 32-bit word, or -1. */
static int64_t first_diff(const uint32_t *a, const uint32_t *b, uint64_t bytes)
{
    for (uint64_t i = 0; i < bytes / 4; i++)
        if (a[i] != b[i])
            return (int64_t)i;
    return -1;
}

static bool all_words(const uint32_t *a, uint64_t bytes, uint32_t v)
{
    for (uint64_t i = 0; i < bytes / 4; i++)
        if (a[i] != v)
            return false;
    return true;
}

static bool htod(fs_dptr dst, const void *src, uint64_t size, const char *what)
{
    CUresult r = fs_cuda.cuMemcpyHtoD((CUdeviceptr)dst, src, size);
    CHECK(r == CUDA_SUCCESS, "%s: cuMemcpyHtoD %" PRIu64 " MiB -> %s", what, size / MiB,
          fs_cuda_errstr(r));
    return r == CUDA_SUCCESS;
}

static bool dtoh(void *dst, fs_dptr src, uint64_t size, const char *what)
{
    CUresult r = fs_cuda.cuMemcpyDtoH(dst, (CUdeviceptr)src, size);
    CHECK(r == CUDA_SUCCESS, "%s: cuMemcpyDtoH %" PRIu64 " MiB -> %s", what, size / MiB,
          fs_cuda_errstr(r));
    return r == CUDA_SUCCESS;
}

struct thread_arg {
    struct fs_device *dev;
    fs_dptr dst, src;
    uint64_t size;
    int bind_err, stream_err, copy_err, sync_err, destroy_err;
    int query_err; /* event_query from a thread that never called bind_thread */
    fs_event event;
    bool bind;
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    struct fs_device *dev = a->dev;
    if (!a->bind) {
        a->query_err = fs_dev_call(dev, event_query, a->event);
        return NULL;
    }
    fs_stream s = NULL;
    a->bind_err = dev->ops->bind_thread(dev);
    a->stream_err = fs_dev_call(dev, stream_create, &s);
    if (a->stream_err != FS_OK)
        return NULL;
    a->copy_err = fs_dev_call(dev, copy_async, a->dst, a->src, a->size, s);
    a->sync_err = fs_dev_call(dev, stream_sync, s);
    a->destroy_err = fs_dev_call(dev, stream_destroy, s);
    return NULL;
}

/* Time COPIES copies of SIZE bytes from SRC to DST on STREAM; GB/s or 0 on failure. */
static double time_copy(struct fs_device *dev, fs_stream stream, fs_dptr dst, fs_dptr src,
                        uint64_t size, int copies, const char *what)
{
    fs_event t0 = NULL, t1 = NULL;
    float ms = 0.0f;
    double gbs = 0.0;
    if (!OK(dev, fs_dev_call(dev, event_create, FS_EVENT_TIMING, &t0), "event_create(timing)") ||
        !OK(dev, fs_dev_call(dev, event_create, FS_EVENT_TIMING, &t1), "event_create(timing)"))
        goto out;
    /* warm-up */
    if (!OK(dev, fs_dev_call(dev, copy_async, dst, src, size, stream), "copy_async warm-up"))
        goto out;
    OK(dev, fs_dev_call(dev, event_record, t0, stream), "event_record start");
    for (int i = 0; i < copies; i++)
        if (fs_dev_call(dev, copy_async, dst, src, size, stream) != FS_OK)
            break;
    OK(dev, fs_dev_call(dev, event_record, t1, stream), "event_record end");
    int q = fs_dev_call(dev, event_query, t1);
    CHECK(q == FS_OK || q == FS_ERR_NOT_READY, "event_query while copying -> %s",
          fs_err_str(q));
    OK(dev, fs_dev_call(dev, event_sync, t1), "event_sync end");
    CHECK(fs_dev_call(dev, event_query, t1) == FS_OK, "event_query after event_sync -> FS_OK");
    if (!OK(dev, fs_dev_call(dev, event_elapsed_ms, t0, t1, &ms), "event_elapsed_ms"))
        goto out;
    CHECK(ms > 0.0f, "%s: %d x %" PRIu64 " MiB in %.3f ms", what, copies, size / MiB, ms);
    if (ms > 0.0f)
        gbs = (double)size * copies / (ms * 1e-3) / 1e9;
    printf("INFO %s: %.1f GB/s\n", what, gbs);
out:
    if (t0)
        OK(dev, fs_dev_call(dev, event_destroy, t0), "event_destroy");
    if (t1)
        OK(dev, fs_dev_call(dev, event_destroy, t1), "event_destroy");
    return gbs;
}

/* Remapping host memory from several threads at once (the plan's finishers and the program's
 * thread do it side by side): each thread maps and unmaps its own host-located block at its own
 * VA, REPS times. */
struct remap_arg {
    struct fs_device *dev;
    fs_phys phys;
    fs_dptr va;
    uint64_t size;
    int reps, err;
};

static void *remap_main(void *p)
{
    struct remap_arg *a = p;
    a->err = a->dev->ops->bind_thread(a->dev);
    for (int i = 0; i < a->reps && a->err == FS_OK; i++) {
        a->err = fs_dev_call(a->dev, map, a->va, a->size, a->phys, 0);
        if (a->err == FS_OK)
            a->err = fs_dev_call(a->dev, unmap, a->va, a->size);
    }
    return NULL;
}

/* GiB per second of host map + unmap with NTHREADS threads, 0 on failure. */
static double time_remaps(struct remap_arg *args, int nthreads)
{
    pthread_t th[8];
    uint64_t t0 = fs_now_ns();
    int started = 0;
    for (; started < nthreads; started++)
        if (pthread_create(&th[started], NULL, remap_main, &args[started]) != 0)
            break;
    bool ok = started == nthreads;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        ok = ok && args[i].err == FS_OK;
    }
    double sec = (double)(fs_now_ns() - t0) / 1e9;
    double gib = 0;
    for (int i = 0; i < nthreads; i++)
        gib += (double)args[i].size * args[i].reps / (double)(1ull << 30);
    CHECK(ok, "host remaps from %d thread(s)", nthreads);
    return ok && sec > 0 ? gib / sec : 0.0;
}

int main(int argc, char **argv)
{
    struct fs_device *dev = NULL;
    struct fs_device_props props;
    if (argc > 1 && strcmp(argv[1], "-v") == 0)
        fs_log_set_level(FS_LOG_DEBUG);
    setvbuf(stdout, NULL, _IOLBF, 0);

    int err = fs_device_cuda_open(0, &dev);
    if (err != FS_OK) {
        const char *why = fs_cuda_load_driver() != FS_OK
                              ? "no CUDA driver (libcuda.so.1 could not be loaded)"
                              : "the CUDA driver is present but device 0 could not be opened";
        CHECK(false, "fs_device_cuda_open(0) -> %s: %s", fs_err_str(err), why);
        return finish();
    }
    CHECK(true, "fs_device_cuda_open(0)");
    CHECK(strcmp(dev->ops->name, "cuda") == 0, "ops name is \"%s\"", dev->ops->name);

    /* ---- properties ---------------------------------------------------------------------- */
    memset(&props, 0, sizeof(props));
    OK(dev, fs_dev_call(dev, props, &props), "props");
    printf("INFO device 0: \"%s\" cc %d.%d, %" PRIu64 " MiB, granularity %" PRIu64
           " KiB, host-located physical memory: %s\n",
           props.name, props.cc_major, props.cc_minor, props.total_bytes / MiB,
           props.granularity / 1024, props.host_phys_supported ? "yes" : "no");
    CHECK(props.name[0] != '\0', "props.name non-empty");
    CHECK(props.ordinal == 0, "props.ordinal == 0");
    CHECK(props.cc_major >= 7, "props.cc %d.%d >= 7.0", props.cc_major, props.cc_minor);
    CHECK(props.total_bytes >= 1024 * MiB, "props.total_bytes >= 1 GiB");
    CHECK(props.granularity >= 64 * 1024 && (props.granularity & (props.granularity - 1)) == 0,
          "props.granularity %" PRIu64 " is a power of two >= 64 KiB", props.granularity);
    CHECK(props.host_phys_supported, "props.host_phys_supported (expected on H200)");
    if (!props.host_phys_supported || props.granularity == 0 || 64 * MiB % props.granularity) {
        printf("cannot continue without host-located physical memory and a 64 MiB-dividing "
               "granularity\n");
        dev->ops->close(dev);
        return finish();
    }

    uint64_t free0 = 0, total0 = 0;
    OK(dev, fs_dev_call(dev, mem_info, &free0, &total0), "mem_info");
    CHECK(total0 > 0 && free0 > 0 && free0 <= total0,
          "mem_info: free %" PRIu64 " MiB <= total %" PRIu64 " MiB", free0 / MiB, total0 / MiB);

    /* ---- remap one VA between device- and host-located memory ----------------------------- */
    const uint64_t SZ = 64 * MiB;
    fs_dptr va_a = 0, va_b = 0;
    fs_phys pd = NULL, ph = NULL;
    fs_stream s1 = NULL, s2 = NULL;
    uint32_t *pat = malloc(SZ), *back = malloc(SZ);
    if (!pat || !back) {
        CHECK(false, "malloc host buffers");
        return finish();
    }

    if (!OK(dev, fs_dev_call(dev, va_reserve, SZ, &va_a), "va_reserve 64 MiB (A)") ||
        !OK(dev, fs_dev_call(dev, va_reserve, SZ, &va_b), "va_reserve 64 MiB (B)") ||
        !OK(dev, fs_dev_call(dev, phys_create, SZ, FS_LOC_DEVICE, &pd), "phys_create device") ||
        !OK(dev, fs_dev_call(dev, phys_create, SZ, FS_LOC_HOST, &ph), "phys_create host") ||
        !OK(dev, fs_dev_call(dev, stream_create, &s1), "stream_create s1") ||
        !OK(dev, fs_dev_call(dev, stream_create, &s2), "stream_create s2"))
        return finish();
    CHECK(va_a % props.granularity == 0 && va_b % props.granularity == 0,
          "reserved VAs are granularity-aligned (A 0x%" PRIx64 ", B 0x%" PRIx64 ")", va_a, va_b);

    if (!OK(dev, fs_dev_call(dev, map, va_a, SZ, pd, 0), "map A -> device phys") ||
        !OK(dev, fs_dev_call(dev, map, va_b, SZ, ph, 0), "map B -> host phys"))
        return finish();

    /* 1. fill the host-located memory through B, copy it to device memory at A. */
    fill_pattern(pat, SZ, 0x1234abcdu);
    if (htod(va_b, pat, SZ, "fill host phys via B")) {
        OK(dev, fs_dev_call(dev, copy_async, va_a, va_b, SZ, s1), "copy_async B(host) -> A(dev)");
        OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
        memset(back, 0, SZ);
        if (dtoh(back, va_a, SZ, "read A (device)")) {
            int64_t d = first_diff(pat, back, SZ);
            CHECK(d < 0, "A (device) holds the pattern copied from host phys (first diff %" PRId64
                  ")", d);
        }
    }

    /* 2. change the data on the device, write it back into host phys, remap A to host phys. */
    fill_pattern(pat, SZ, 0x5a5a0f0fu);
    if (htod(va_a, pat, SZ, "new pattern into A (device)")) {
        OK(dev, fs_dev_call(dev, copy_async, va_b, va_a, SZ, s1), "copy_async A(dev) -> B(host)");
        OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
        OK(dev, fs_dev_call(dev, unmap, va_a, SZ), "unmap A (device phys)");
        if (OK(dev, fs_dev_call(dev, map, va_a, SZ, ph, 0), "map A -> host phys")) {
            memset(back, 0, SZ);
            if (dtoh(back, va_a, SZ, "read A (host-located)")) {
                int64_t d = first_diff(pat, back, SZ);
                CHECK(d < 0, "A (host-located) holds the written-back data (first diff %" PRId64
                      ")", d);
            }
            /* A write through A lands in host phys and is visible through B. */
            CUresult r = fs_cuda.cuMemsetD32((CUdeviceptr)va_a, 0xC0FFEE00u, SZ / 4);
            CHECK(r == CUDA_SUCCESS, "cuMemsetD32 on host-located A -> %s", fs_cuda_errstr(r));
            memset(back, 0, SZ);
            if (r == CUDA_SUCCESS && dtoh(back, va_b, SZ, "read B after writing through A"))
                CHECK(all_words(back, SZ, 0xC0FFEE00u), "write through A is visible through B");

            /* 3. back to device memory: unmap, map device phys, copy host data in. */
            OK(dev, dev->ops->ctx_sync(dev), "ctx_sync");
            OK(dev, fs_dev_call(dev, unmap, va_a, SZ), "unmap A (host phys)");
            if (OK(dev, fs_dev_call(dev, map, va_a, SZ, pd, 0), "map A -> device phys again")) {
                OK(dev, fs_dev_call(dev, copy_async, va_a, va_b, SZ, s1),
                   "copy_async B(host) -> A(dev)");
                OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
                memset(back, 0, SZ);
                if (dtoh(back, va_a, SZ, "read A (device again)"))
                    CHECK(all_words(back, SZ, 0xC0FFEE00u),
                          "A (device again) holds the data written while host-located");
            }
        }
    }

    /* ---- plain device memory (mem_alloc): copies reach it, and it goes back --------------- */
    {
        fs_dptr plain = 0;
        if (OK(dev, fs_dev_call(dev, mem_alloc, SZ, &plain), "mem_alloc 64 MiB")) {
            fill_pattern(pat, SZ, 0x0badf00du);
            if (htod(va_b, pat, SZ, "pattern into B for the plain copy")) {
                OK(dev, fs_dev_call(dev, copy_async, plain, va_b, SZ, s1),
                   "copy_async B(host) -> plain");
                OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
                memset(back, 0, SZ);
                if (dtoh(back, plain, SZ, "read plain"))
                    CHECK(first_diff(pat, back, SZ) < 0, "plain memory holds the copied pattern");
            }
            unsigned int type = 0;
            CUresult r = fs_cuda.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                       (CUdeviceptr)plain);
            CHECK(r == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE,
                  "plain memory is device memory to the driver (%s, type %u)", fs_cuda_errstr(r),
                  type);
            OK(dev, fs_dev_call(dev, mem_free, plain), "mem_free");
        }
    }

    /* ---- fingerprints (core/fingerprint.cu): the GPU computes what the host computes -------- */
    {
        uint64_t *parts = NULL, *want = malloc(FS_FP_PARTS_BYTES);
        fill_pattern(pat, SZ, 0x600dcafeu);
        if (want && OK(dev, fs_dev_call(dev, host_alloc, FS_FP_PARTS_BYTES, (void **)&parts),
                       "host_alloc fingerprint parts") &&
            htod(va_a, pat, SZ, "pattern into A for fingerprints")) {
            fs_fp_host(pat, SZ, want);
            struct fs_fp ref = fs_fp_combine(want);
            OK(dev, fs_dev_call(dev, fingerprint, va_a, SZ, s1, parts), "fingerprint A (device)");
            OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
            CHECK(fs_fp_equal(fs_fp_combine(parts), ref),
                  "GPU fingerprint of 64 MiB equals the host's");
            /* A size that leaves the unrolled loop a tail (core/fingerprint.cu). */
            const uint64_t odd = SZ - 3 * 16;
            fs_fp_host(pat, odd, want);
            OK(dev, fs_dev_call(dev, fingerprint, va_a, odd, s1, parts), "fingerprint A's head");
            OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
            CHECK(fs_fp_equal(fs_fp_combine(parts), fs_fp_combine(want)),
                  "GPU fingerprint of 64 MiB - 48 bytes equals the host's");
            /* One word changed in the last 16 bytes. */
            CUresult r = fs_cuda.cuMemsetD32((CUdeviceptr)(va_a + SZ - 4), 0x12345678u, 1);
            CHECK(r == CUDA_SUCCESS, "cuMemsetD32 one word -> %s", fs_cuda_errstr(r));
            OK(dev, fs_dev_call(dev, fingerprint, va_a, SZ, s1, parts), "fingerprint A again");
            OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
            CHECK(!fs_fp_equal(fs_fp_combine(parts), ref), "one changed word changes it");
            /* Speed: what a clean eviction costs instead of a copy back. */
            const int reps = 20;
            uint64_t t0 = fs_now_ns();
            for (int i = 0; i < reps; i++)
                fs_dev_call(dev, fingerprint, va_a, SZ, s1, parts);
            OK(dev, fs_dev_call(dev, stream_sync, s1), "stream_sync s1");
            double sec = (double)(fs_now_ns() - t0) / 1e9;
            printf("INFO fingerprint: %.0f GB/s over 64 MiB (%d runs)\n",
                   (double)SZ * reps / sec / 1e9, reps);
        }
        if (parts)
            fs_dev_call(dev, host_free, parts);
        free(want);
    }

    /* ---- host remaps from several threads (the finishers' case) ---------------------------- */
    {
        enum { NT = 4, REPS = 8 };
        const uint64_t RSZ = 128 * MiB;
        struct remap_arg ra[NT];
        memset(ra, 0, sizeof(ra));
        bool ready = true;
        for (int i = 0; i < NT && ready; i++) {
            ra[i] = (struct remap_arg){.dev = dev, .size = RSZ, .reps = REPS};
            ready = OK(dev, fs_dev_call(dev, phys_create, RSZ, FS_LOC_HOST, &ra[i].phys),
                       "phys_create host 128 MiB (remap threads)") &&
                    OK(dev, fs_dev_call(dev, va_reserve, RSZ, &ra[i].va), "va_reserve 128 MiB");
        }
        if (ready) {
            double one = time_remaps(ra, 1);
            double four = time_remaps(ra, NT);
            printf("INFO host map+unmap: %.1f GiB/s from 1 thread, %.1f GiB/s from %d threads "
                   "(%.2fx)\n", one, four, NT, one > 0 ? four / one : 0.0);
        }
        for (int i = 0; i < NT; i++) {
            if (ra[i].va)
                fs_dev_call(dev, va_release, ra[i].va, RSZ);
            if (ra[i].phys)
                fs_dev_call(dev, phys_release, ra[i].phys);
        }
    }

    /* ---- partial maps: the driver maps whole physical allocations only ---------------------- */
    {
        fs_dptr va_h = 0;
        const uint64_t half = SZ / 2;
        if (OK(dev, fs_dev_call(dev, va_reserve, half, &va_h), "va_reserve 32 MiB")) {
            int e = fs_dev_call(dev, map, va_h, half, ph, 0);
            CHECK(e == FS_ERR_UNSUPPORTED, "map the first half of a phys -> %s", fs_err_str(e));
            if (e == FS_OK)
                fs_dev_call(dev, unmap, va_h, half);
            e = fs_dev_call(dev, map, va_h, half, ph, half);
            CHECK(e == FS_ERR_UNSUPPORTED,
                  "map at a non-zero phys_offset -> %s (cuMemMap: offset must be zero)",
                  fs_err_str(e));
            if (e == FS_OK)
                fs_dev_call(dev, unmap, va_h, half);
            OK(dev, fs_dev_call(dev, va_release, va_h, half), "va_release 32 MiB");
        }
    }

    /* ---- failure paths: errors, not crashes ------------------------------------------------ */
    {
        fs_dptr va_f = 0;
        fs_phys small = NULL;
        const uint64_t g = props.granularity;
        if (OK(dev, fs_dev_call(dev, va_reserve, 4 * g, &va_f), "va_reserve 4 granules") &&
            OK(dev, fs_dev_call(dev, phys_create, g, FS_LOC_DEVICE, &small),
               "phys_create 1 granule")) {
            int e = fs_dev_call(dev, map, va_f, 2 * g, small, 0);
            CHECK(e == FS_ERR_INVALID, "map 2 granules of a 1-granule phys -> %s", fs_err_str(e));
            e = fs_dev_call(dev, map, va_f, g, small, g);
            CHECK(e == FS_ERR_INVALID, "map at offset == phys size -> %s", fs_err_str(e));
            e = fs_dev_call(dev, map, va_f, g, NULL, 0);
            CHECK(e == FS_ERR_INVALID, "map of a NULL phys -> %s", fs_err_str(e));
            e = fs_dev_call(dev, map, va_f + 4096, g, small, 0);
            CHECK(e == FS_ERR_INVALID, "map at a misaligned VA (driver check) -> %s (native %d)",
                  fs_err_str(e), dev->ops->last_native_error(dev));
            CHECK(e == FS_OK || dev->ops->last_native_error(dev) != 0,
                  "last_native_error set after a driver failure");
            if (e == FS_OK)
                fs_dev_call(dev, unmap, va_f + 4096, g);
            /* unmapping part of a mapping is refused by the driver (whole mappings only) */
            fs_phys two = NULL;
            if (OK(dev, fs_dev_call(dev, phys_create, 2 * g, FS_LOC_DEVICE, &two),
                   "phys_create 2 granules") &&
                OK(dev, fs_dev_call(dev, map, va_f, 2 * g, two, 0), "map 2 granules")) {
                e = fs_dev_call(dev, unmap, va_f + g, g);
                CHECK(e == FS_ERR_INVALID, "unmap the second half of a mapping -> %s (native %d)",
                      fs_err_str(e), dev->ops->last_native_error(dev));
                OK(dev, fs_dev_call(dev, unmap, va_f, 2 * g), "unmap the whole mapping");
            }
            if (two)
                OK(dev, fs_dev_call(dev, phys_release, two), "phys_release 2 granules");
            /* and a correct map still works afterwards */
            if (OK(dev, fs_dev_call(dev, map, va_f, g, small, 0), "map after failures"))
                OK(dev, fs_dev_call(dev, unmap, va_f, g), "unmap");
        }
        fs_phys bad = NULL;
        int e = fs_dev_call(dev, phys_create, 0, FS_LOC_DEVICE, &bad);
        CHECK(e == FS_ERR_INVALID && bad == NULL, "phys_create 0 bytes -> %s", fs_err_str(e));
        e = fs_dev_call(dev, phys_create, g + 4096, FS_LOC_DEVICE, &bad);
        CHECK(e == FS_ERR_INVALID && bad == NULL, "phys_create non-multiple -> %s",
              fs_err_str(e));
        fs_event nt0 = NULL, nt1 = NULL;
        if (OK(dev, fs_dev_call(dev, event_create, 0, &nt0), "event_create(no timing)") &&
            OK(dev, fs_dev_call(dev, event_create, 0, &nt1), "event_create(no timing)")) {
            float ms = -1.0f;
            fs_dev_call(dev, event_record, nt0, s1);
            fs_dev_call(dev, event_record, nt1, s1);
            fs_dev_call(dev, event_sync, nt1);
            e = fs_dev_call(dev, event_elapsed_ms, nt0, nt1, &ms);
            CHECK(e == FS_ERR_INVALID && ms == -1.0f,
                  "event_elapsed_ms on non-timing events -> %s (native %d)", fs_err_str(e),
                  dev->ops->last_native_error(dev));
        }
        if (nt0)
            OK(dev, fs_dev_call(dev, event_destroy, nt0), "event_destroy");
        if (nt1)
            OK(dev, fs_dev_call(dev, event_destroy, nt1), "event_destroy");
        if (small)
            OK(dev, fs_dev_call(dev, phys_release, small), "phys_release 1 granule");
        if (va_f)
            OK(dev, fs_dev_call(dev, va_release, va_f, 4 * g), "va_release 4 granules");
        OK(dev, dev->ops->ctx_sync(dev), "ctx_sync after failures (context still alive)");
    }

    /* ---- 256 MiB: bandwidth, stream ordering, a second thread ------------------------------ */
    {
        const uint64_t BIG = 256 * MiB;
        fs_dptr va_h = 0, va_d = 0, va_d2 = 0;
        fs_phys bh = NULL, bd = NULL, bd2 = NULL;
        uint32_t *bpat = malloc(BIG), *bback = malloc(BIG);
        if (!bpat || !bback) {
            CHECK(false, "malloc 256 MiB host buffers");
            goto big_out;
        }
        if (!OK(dev, fs_dev_call(dev, va_reserve, BIG, &va_h), "va_reserve 256 MiB (host)") ||
            !OK(dev, fs_dev_call(dev, va_reserve, BIG, &va_d), "va_reserve 256 MiB (dev)") ||
            !OK(dev, fs_dev_call(dev, va_reserve, BIG, &va_d2), "va_reserve 256 MiB (dev 2)") ||
            !OK(dev, fs_dev_call(dev, phys_create, BIG, FS_LOC_HOST, &bh), "phys_create 256 MiB host") ||
            !OK(dev, fs_dev_call(dev, phys_create, BIG, FS_LOC_DEVICE, &bd), "phys_create 256 MiB dev") ||
            !OK(dev, fs_dev_call(dev, phys_create, BIG, FS_LOC_DEVICE, &bd2), "phys_create 256 MiB dev 2") ||
            !OK(dev, fs_dev_call(dev, map, va_h, BIG, bh, 0), "map 256 MiB host") ||
            !OK(dev, fs_dev_call(dev, map, va_d, BIG, bd, 0), "map 256 MiB dev") ||
            !OK(dev, fs_dev_call(dev, map, va_d2, BIG, bd2, 0), "map 256 MiB dev 2"))
            goto big_out;

        fill_pattern(bpat, BIG, 0xfeedbeefu);
        if (!htod(va_h, bpat, BIG, "fill 256 MiB host phys"))
            goto big_out;

        double h2d = time_copy(dev, s1, va_d, va_h, BIG, 4, "H2D host-located -> device phys");
        double d2h = time_copy(dev, s1, va_h, va_d, BIG, 4, "D2H device phys -> host-located");
        CHECK(h2d > 5.0, "H2D bandwidth %.1f GB/s > 5 GB/s (PCIe Gen5 x16 expect about 50)", h2d);
        CHECK(d2h > 5.0, "D2H bandwidth %.1f GB/s > 5 GB/s", d2h);
        printf("INFO note: the D2H pass rewrote the host phys with the same data\n");

        /* stream ordering: s1 copies host -> dev, s2 waits on s1's event and copies dev -> dev2 */
        fs_event ev = NULL;
        CUresult r = fs_cuda.cuMemsetD32((CUdeviceptr)va_d, 0, BIG / 4);
        CHECK(r == CUDA_SUCCESS, "cuMemsetD32 clears dev -> %s", fs_cuda_errstr(r));
        r = fs_cuda.cuMemsetD32((CUdeviceptr)va_d2, 0, BIG / 4);
        CHECK(r == CUDA_SUCCESS, "cuMemsetD32 clears dev 2 -> %s", fs_cuda_errstr(r));
        OK(dev, dev->ops->ctx_sync(dev), "ctx_sync");
        if (OK(dev, fs_dev_call(dev, event_create, 0, &ev), "event_create(no timing)")) {
            OK(dev, fs_dev_call(dev, copy_async, va_d, va_h, BIG, s1), "copy_async on s1");
            OK(dev, fs_dev_call(dev, event_record, ev, s1), "event_record on s1");
            OK(dev, fs_dev_call(dev, stream_wait_event, s2, ev), "stream_wait_event s2 <- ev");
            OK(dev, fs_dev_call(dev, copy_async, va_d2, va_d, BIG, s2), "copy_async on s2");

            /* a thread that never bound the context can still query */
            struct thread_arg qa = {.dev = dev, .event = ev, .bind = false};
            pthread_t qt;
            if (pthread_create(&qt, NULL, thread_main, &qa) == 0) {
                pthread_join(qt, NULL);
                CHECK(qa.query_err == FS_OK || qa.query_err == FS_ERR_NOT_READY,
                      "event_query from an unbound thread -> %s", fs_err_str(qa.query_err));
            }
            OK(dev, fs_dev_call(dev, stream_sync, s2), "stream_sync s2");
            memset(bback, 0, BIG);
            if (dtoh(bback, va_d2, BIG, "read dev 2"))
                CHECK(first_diff(bpat, bback, BIG) < 0,
                      "s2's copy saw s1's completed copy (stream_wait_event ordering)");
            OK(dev, fs_dev_call(dev, event_destroy, ev), "event_destroy");
        }

        /* FS_EVENT_BLOCKING: a wait on such an event sleeps (COPY_WAIT=block). Ten 256 MiB
         * copies (about 50 ms) queued, then one wait each way: under this context's default
         * scheduling the thread spins through a default event's wait, CPU time about its wall
         * time, and sleeps through a blocking one's. */
        double cpu_share[2] = {-1.0, -1.0};
        for (int blocking = 0; blocking < 2; blocking++) {
            fs_event w = NULL;
            if (!OK(dev, fs_dev_call(dev, event_create, blocking ? FS_EVENT_BLOCKING : 0, &w),
                    blocking ? "event_create(blocking)" : "event_create(default)"))
                continue;
            bool queued = true;
            for (int i = 0; i < 10 && queued; i++)
                queued = OK(dev, fs_dev_call(dev, copy_async, va_d, va_h, BIG, s1), "copy_async");
            if (!queued || !OK(dev, fs_dev_call(dev, event_record, w, s1), "event_record")) {
                fs_dev_call(dev, event_destroy, w);
                continue;
            }
            uint64_t wall0 = fs_now_ns(), cpu0 = thread_cpu_ns();
            OK(dev, fs_dev_call(dev, event_sync, w), "event_sync");
            uint64_t wall = fs_now_ns() - wall0, cpu = thread_cpu_ns() - cpu0;
            CHECK(fs_dev_call(dev, event_query, w) == FS_OK, "event_query after event_sync");
            cpu_share[blocking] = wall ? (double)cpu / (double)wall : -1.0;
            printf("INFO event_sync (%s) waited %.1f ms, %.0f%% of it on the CPU\n",
                   blocking ? "blocking" : "default", wall / 1e6, 100.0 * cpu_share[blocking]);
            OK(dev, fs_dev_call(dev, event_destroy, w), "event_destroy");
        }
        CHECK(cpu_share[1] >= 0.0 && cpu_share[1] < 0.5 && cpu_share[0] > cpu_share[1],
              "a blocking event's wait sleeps (%.0f%% on the CPU, a default event's %.0f%%)",
              100.0 * cpu_share[1], 100.0 * cpu_share[0]);
        fs_event bad_ev = NULL;
        int bad_rc = fs_dev_call(dev, event_create, FS_EVENT_ALL + 1, &bad_ev);
        CHECK(bad_rc == FS_ERR_INVALID && !bad_ev, "event_create with an unknown flag -> %s",
              fs_err_str(bad_rc));

        /* a second thread: bind_thread, own stream, copy */
        r = fs_cuda.cuMemsetD32((CUdeviceptr)va_d2, 0, BIG / 4);
        OK(dev, dev->ops->ctx_sync(dev), "ctx_sync");
        struct thread_arg ta = {.dev = dev, .dst = va_d2, .src = va_h, .size = BIG, .bind = true};
        pthread_t t;
        if (pthread_create(&t, NULL, thread_main, &ta) == 0) {
            pthread_join(t, NULL);
            CHECK(ta.bind_err == FS_OK && ta.stream_err == FS_OK && ta.copy_err == FS_OK &&
                      ta.sync_err == FS_OK && ta.destroy_err == FS_OK,
                  "second thread: bind %s, stream %s, copy %s, sync %s, destroy %s",
                  fs_err_str(ta.bind_err), fs_err_str(ta.stream_err), fs_err_str(ta.copy_err),
                  fs_err_str(ta.sync_err), fs_err_str(ta.destroy_err));
            memset(bback, 0, BIG);
            if (r == CUDA_SUCCESS && dtoh(bback, va_d2, BIG, "read dev 2 after thread copy"))
                CHECK(first_diff(bpat, bback, BIG) < 0, "second thread's copy landed");
        }

        uint64_t free1 = 0, total1 = 0;
        if (OK(dev, fs_dev_call(dev, mem_info, &free1, &total1), "mem_info with 2x256 MiB mapped"))
            printf("INFO free %" PRIu64 " MiB now, %" PRIu64 " MiB at start\n", free1 / MiB,
                   free0 / MiB);

    big_out:
        if (va_h && bh)
            fs_dev_call(dev, unmap, va_h, BIG);
        if (va_d && bd)
            fs_dev_call(dev, unmap, va_d, BIG);
        if (va_d2 && bd2)
            fs_dev_call(dev, unmap, va_d2, BIG);
        if (bh)
            OK(dev, fs_dev_call(dev, phys_release, bh), "phys_release 256 MiB host");
        if (bd)
            OK(dev, fs_dev_call(dev, phys_release, bd), "phys_release 256 MiB dev");
        if (bd2)
            OK(dev, fs_dev_call(dev, phys_release, bd2), "phys_release 256 MiB dev 2");
        if (va_h)
            OK(dev, fs_dev_call(dev, va_release, va_h, BIG), "va_release 256 MiB");
        if (va_d)
            OK(dev, fs_dev_call(dev, va_release, va_d, BIG), "va_release 256 MiB");
        if (va_d2)
            OK(dev, fs_dev_call(dev, va_release, va_d2, BIG), "va_release 256 MiB");
        free(bpat);
        free(bback);
    }

    /* ---- clean-up ---------------------------------------------------------------------------- */
    OK(dev, dev->ops->ctx_sync(dev), "ctx_sync");
    OK(dev, fs_dev_call(dev, unmap, va_a, SZ), "unmap A");
    OK(dev, fs_dev_call(dev, unmap, va_b, SZ), "unmap B");
    OK(dev, fs_dev_call(dev, phys_release, pd), "phys_release device");
    OK(dev, fs_dev_call(dev, phys_release, ph), "phys_release host");
    OK(dev, fs_dev_call(dev, va_release, va_a, SZ), "va_release A");
    OK(dev, fs_dev_call(dev, va_release, va_b, SZ), "va_release B");
    OK(dev, fs_dev_call(dev, stream_destroy, s1), "stream_destroy s1");
    OK(dev, fs_dev_call(dev, stream_destroy, s2), "stream_destroy s2");
    OK(dev, dev->ops->bind_thread(dev), "bind_thread on the main thread");
    free(pat);
    free(back);

    uint64_t free2 = 0, total2 = 0;
    if (OK(dev, fs_dev_call(dev, mem_info, &free2, &total2), "mem_info after clean-up"))
        CHECK(free2 + 64 * MiB >= free0,
              "free memory back to the start (%" PRIu64 " MiB vs %" PRIu64 " MiB)", free2 / MiB,
              free0 / MiB);
    dev->ops->close(dev);
    return finish();
}

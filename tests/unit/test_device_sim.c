/* The simulated device: capacity, VA and mapping rules (whole allocations only, as the driver),
 * data through mappings, the clock (copy timing, engines, deferred effects), events, kernels,
 * graph capture, kernel parameter layouts, sticky failures, unsafe unmaps, failure injection and
 * threads. */
#include <pthread.h>

#include "device_sim.h"
#include "fingerprint.h"
#include "fs.h"
#include "test_util.h"

#define G (64ull << 10) /* granularity of the small test devices */
#define MIB (1ull << 20)

static struct fs_device *open_dev(uint64_t device_bytes, uint64_t host_bytes, uint64_t gran)
{
    struct fs_sim_config cfg = {
        .device_bytes = device_bytes,
        .host_bytes = host_bytes,
        .granularity = gran,
        .h2d_bytes_per_s = 55e9,
        .d2h_bytes_per_s = 55e9,
        .d2d_bytes_per_s = 2e12,
        .copy_latency_ns = 2000,
        .host_phys_supported = true,
    };
    struct fs_device *dev = NULL;
    assert_int_equal(fs_sim_open(&cfg, &dev), FS_OK);
    assert_non_null(dev);
    return dev;
}

static struct fs_device *open_small(void)
{
    return open_dev(64 * MIB, 0, G);
}

/* Duration of a copy of SIZE bytes at BW with the default latency, as the model computes it. */
static uint64_t copy_ns(uint64_t size, double bw)
{
    return 2000 + (uint64_t)((double)size * 1e9 / bw + 0.5);
}

/* One physical allocation mapped at its own reservation. */
struct buf {
    fs_phys phys;
    fs_dptr va;
    uint64_t size;
};

static void buf_make(struct fs_device *d, struct buf *b, uint64_t size, enum fs_mem_loc loc)
{
    b->size = size;
    assert_int_equal(fs_dev_call(d, phys_create, size, loc, &b->phys), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, size, &b->va), FS_OK);
    assert_int_equal(fs_dev_call(d, map, b->va, size, b->phys, 0), FS_OK);
}

static void buf_free(struct fs_device *d, struct buf *b)
{
    assert_int_equal(fs_dev_call(d, unmap, b->va, b->size), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, b->va, b->size), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, b->phys), FS_OK);
}

static void fill(struct fs_device *d, fs_dptr va, uint64_t size, unsigned char v)
{
    unsigned char *tmp = malloc(size);
    assert_non_null(tmp);
    memset(tmp, v, size);
    assert_int_equal(fs_sim_write(d, va, tmp, size), FS_OK);
    free(tmp);
}

/* Whether every byte of [VA, VA+SIZE) equals V. */
static bool all_eq(struct fs_device *d, fs_dptr va, uint64_t size, unsigned char v)
{
    unsigned char *tmp = malloc(size);
    assert_non_null(tmp);
    assert_int_equal(fs_sim_read(d, tmp, va, size), FS_OK);
    bool ok = true;
    for (uint64_t i = 0; i < size && ok; i++)
        ok = tmp[i] == v;
    free(tmp);
    return ok;
}

static void assert_no_leaks(struct fs_device *d)
{
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.live_phys, 0);
    assert_int_equal(st.live_va_ranges, 0);
    assert_int_equal(st.live_streams, 0);
    assert_int_equal(st.live_events, 0);
    assert_int_equal(st.device_bytes_in_use, 0);
    assert_int_equal(st.host_bytes_in_use, 0);
}

/* ---- open, props, capacity ---------------------------------------------------------------- */

static void test_open_defaults(void **state)
{
    (void)state;
    struct fs_device *d = NULL;
    assert_int_equal(fs_sim_open(NULL, NULL), FS_ERR_INVALID);
    assert_int_equal(fs_sim_open(NULL, &d), FS_OK);
    assert_string_equal(d->ops->name, "sim");
    struct fs_device_props p;
    assert_int_equal(fs_dev_call(d, props, &p), FS_OK);
    assert_string_equal(p.name, "flexshim simulated device");
    assert_int_equal(p.cc_major, 9);
    assert_int_equal(p.cc_minor, 0);
    assert_int_equal(p.total_bytes, 8ull << 30);
    assert_int_equal(p.granularity, 2 * MIB);
    assert_true(p.host_phys_supported);
    uint64_t fr = 0, tot = 0;
    assert_int_equal(fs_dev_call(d, mem_info, &fr, &tot), FS_OK);
    assert_int_equal(fr, 8ull << 30);
    assert_int_equal(tot, 8ull << 30);
    assert_int_equal(d->ops->bind_thread(d), FS_OK);
    assert_int_equal(d->ops->last_native_error(d), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 0);
    d->ops->close(d);

    /* Zero fields take defaults; a granularity that is not a power of two is refused. */
    struct fs_sim_config cfg = {.device_bytes = 32 * MIB};
    assert_int_equal(fs_sim_open(&cfg, &d), FS_OK);
    assert_int_equal(d->props.granularity, 2 * MIB);
    assert_int_equal(d->props.total_bytes, 32 * MIB);
    assert_false(d->props.host_phys_supported);
    d->ops->close(d);
    cfg.granularity = 3000;
    d = NULL;
    assert_int_equal(fs_sim_open(&cfg, &d), FS_ERR_CONFIG);
    assert_null(d);
}

static void test_device_capacity_nomem(void **state)
{
    (void)state;
    struct fs_device *d = open_dev(4 * G, 0, G);
    fs_phys a, b, c, x = NULL;
    assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_DEVICE, &a), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &b), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_DEVICE, &x), FS_ERR_NOMEM);
    assert_null(x);
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_NOMEM);
    assert_int_equal(fs_dev_call(d, phys_create, UINT64_MAX & ~(G - 1), FS_LOC_DEVICE, &x),
                     FS_ERR_NOMEM);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &c), FS_OK);
    uint64_t fr, tot;
    assert_int_equal(fs_dev_call(d, mem_info, &fr, &tot), FS_OK);
    assert_int_equal(fr, 0);
    assert_int_equal(tot, 4 * G);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &x), FS_ERR_NOMEM);
    /* Host memory is not device memory. */
    assert_int_equal(fs_dev_call(d, phys_create, 8 * G, FS_LOC_HOST, &x), FS_OK);

    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.device_bytes_in_use, 4 * G);
    assert_int_equal(st.host_bytes_in_use, 8 * G);
    assert_int_equal(st.live_phys, 4);

    assert_int_equal(fs_dev_call(d, phys_release, a), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, a), FS_ERR_INVALID); /* already gone */
    assert_int_equal(fs_dev_call(d, phys_release, b), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, c), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, x), FS_OK);
    assert_int_equal(fs_dev_call(d, mem_info, &fr, NULL), FS_OK);
    assert_int_equal(fr, 4 * G);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.peak_device_bytes, 4 * G);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_host_capacity_and_bad_sizes(void **state)
{
    (void)state;
    struct fs_device *d = open_dev(4 * G, 2 * G, G);
    fs_phys h, x = NULL;
    assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_HOST, &h), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &x), FS_ERR_NOMEM);
    assert_int_equal(fs_dev_call(d, phys_create, 0, FS_LOC_DEVICE, &x), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, phys_create, G + 1, FS_LOC_DEVICE, &x), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, phys_create, G, (enum fs_mem_loc)7, &x), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, NULL), FS_ERR_INVALID);
    assert_null(x);
    assert_int_equal(fs_dev_call(d, phys_release, h), FS_OK);
    assert_no_leaks(d);
    d->ops->close(d);

    struct fs_sim_config cfg = {.device_bytes = 4 * G, .granularity = G,
                                .host_phys_supported = false};
    assert_int_equal(fs_sim_open(&cfg, &d), FS_OK);
    assert_false(d->props.host_phys_supported);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &x), FS_ERR_UNSUPPORTED);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &x), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, x), FS_OK);
    d->ops->close(d);
}

/* ---- VA and mappings ---------------------------------------------------------------------- */

static void test_va_reserve_release(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_dptr a, b, c, x = 0;
    assert_int_equal(fs_dev_call(d, va_reserve, 2 * G, &a), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &b), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, 4 * G, &c), FS_OK);
    assert_int_equal(a % G, 0);
    assert_int_equal(b % G, 0);
    assert_int_equal(c % G, 0);
    assert_true(a >= 0x7f0000000000ull);
    assert_true(b >= a + 2 * G && c >= b + G); /* disjoint */
    assert_int_equal(fs_dev_call(d, va_reserve, 0, &x), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, va_reserve, G / 2, &x), FS_ERR_INVALID);
    assert_int_equal(x, 0);

    assert_int_equal(fs_dev_call(d, va_release, b, 2 * G), FS_ERR_INVALID); /* wrong size */
    assert_int_equal(fs_dev_call(d, va_release, b + G, G), FS_ERR_INVALID); /* unknown */
    assert_int_equal(fs_dev_call(d, va_release, a + G, G), FS_ERR_INVALID); /* a part */
    assert_int_equal(fs_dev_call(d, va_release, b, G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, b, G), FS_ERR_INVALID); /* twice */
    /* Addresses are never reused. */
    assert_int_equal(fs_dev_call(d, va_reserve, G, &x), FS_OK);
    assert_true(x > c);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.live_va_ranges, 3);
    assert_int_equal(fs_dev_call(d, va_release, a, 2 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, c, 4 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, x, G), FS_OK);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_map_rules(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_phys p, q;
    fs_dptr va, vb;
    assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_DEVICE, &p), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &q), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, 4 * G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, 4 * G, &vb), FS_OK);

    /* Misaligned address, size, offset; zero size. */
    assert_int_equal(fs_dev_call(d, map, va + 4096, G, p, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, G + 4096, p, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, G, p, 4096), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, 0, p, 0), FS_ERR_INVALID);
    /* Beyond the physical allocation. */
    assert_int_equal(fs_dev_call(d, map, va, 3 * G, p, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, 2 * G, p, G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, G, p, 2 * G), FS_ERR_INVALID);
    /* Outside any reservation, or running off the end of one. */
    assert_int_equal(fs_dev_call(d, map, va - 8 * G, 2 * G, p, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va + 3 * G, 2 * G, p, 0), FS_ERR_INVALID);
    /* Not a phys handle of ours. */
    fs_phys bogus = (fs_phys)&vb;
    assert_int_equal(fs_dev_call(d, map, va, G, bogus, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, G, NULL, 0), FS_ERR_INVALID);

    /* Only whole allocations map (as on the GPU): part of one, or from an offset, is refused
     * with UNSUPPORTED and changes nothing. */
    struct fs_sim_stats st;
    assert_int_equal(fs_dev_call(d, map, va, G, p, 0), FS_ERR_UNSUPPORTED);
    assert_int_equal(fs_dev_call(d, map, va, G, p, G), FS_ERR_UNSUPPORTED);
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_UNSUPPORTED);
    enum fs_mem_loc loc;
    assert_int_equal(fs_sim_location(d, va, &loc), FS_ERR_NOT_FOUND);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.maps, 0);
    assert_int_equal(fs_dev_call(d, phys_release, q), FS_OK); /* not referenced */
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &q), FS_OK);

    assert_int_equal(fs_dev_call(d, map, va + G, 2 * G, p, 0), FS_OK);
    /* Overlaps: same range, start inside, end inside. */
    assert_int_equal(fs_dev_call(d, map, va + G, G, q, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va + 2 * G, G, q, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, map, va, 2 * G, p, 0), FS_ERR_INVALID);
    /* Neighbours are fine, and one phys can be mapped twice (aliases). */
    assert_int_equal(fs_dev_call(d, map, va, G, q, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va + 3 * G, G, p, G), FS_ERR_UNSUPPORTED);
    assert_int_equal(fs_dev_call(d, map, vb, 2 * G, p, 0), FS_OK);
    fill(d, vb + G, G, 0x5a);
    assert_true(all_eq(d, va + 2 * G, G, 0x5a));
    assert_true(all_eq(d, va + G, G, 0));
    assert_int_equal(fs_sim_location(d, va + 3 * G, &loc), FS_ERR_NOT_FOUND);

    fs_sim_get_stats(d, &st);
    assert_int_equal(st.maps, 3);
    assert_int_equal(st.maps_by_loc[FS_LOC_DEVICE], 2);
    assert_int_equal(st.maps_by_loc[FS_LOC_HOST], 1);

    /* A mapped phys cannot be released, a mapped range cannot be given back. */
    assert_int_equal(fs_dev_call(d, phys_release, p), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, va_release, vb, 4 * G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, unmap, vb, 2 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, vb, 4 * G), FS_OK);
    /* One mapping per unmap: two adjacent ones at once are refused. */
    assert_int_equal(fs_dev_call(d, unmap, va, 3 * G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va + G, 2 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, q), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, 4 * G), FS_OK);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* mem_alloc: device memory rounded up to the granularity, that copies reach and the device
 * counts; map, unmap and va_release refuse it; mem_free gives all of it back, refuses any other
 * address, and, like an unmap, fails the context if queued work still touches the memory. */
static void test_plain_memory(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_dptr p = 0, q = 0, va = 0;
    fs_phys h = NULL;
    struct fs_sim_stats st;
    assert_int_equal(fs_dev_call(d, mem_alloc, G + 1, &p), FS_OK);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.plain_allocs, 1);
    assert_int_equal(st.device_bytes_in_use, 2 * G);
    assert_int_equal(st.maps, 0);
    enum fs_mem_loc loc = FS_LOC_HOST;
    assert_int_equal(fs_sim_location(d, p + G, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_DEVICE);
    fill(d, p, 2 * G, 0x3c);
    assert_true(all_eq(d, p, 2 * G, 0x3c));

    assert_int_equal(fs_dev_call(d, unmap, p, 2 * G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, va_release, p, 2 * G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &h), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, mem_free, va), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, mem_free, p + G), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, mem_alloc, 64 * MIB, &q), FS_ERR_NOMEM); /* 2 G in use */
    assert_int_equal(fs_dev_call(d, mem_alloc, 0, &q), FS_ERR_INVALID);
    assert_int_equal(q, 0);

    /* Copies reach it both ways. */
    fs_stream s = NULL;
    assert_int_equal(fs_dev_call(d, map, va, G, h, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, va, p, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_true(all_eq(d, va, G, 0x3c));
    assert_int_equal(fs_dev_call(d, mem_alloc, G, &q), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, q, va, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_true(all_eq(d, q, G, 0x3c));
    assert_int_equal(fs_dev_call(d, mem_free, q), FS_OK);
    assert_int_equal(fs_dev_call(d, mem_free, q), FS_ERR_INVALID); /* twice */
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.plain_allocs, 1);
    assert_int_equal(st.illegal_accesses, 0);

    /* Freed under queued work: an illegal access, as unmapping it would be. */
    assert_int_equal(fs_dev_call(d, copy_async, va, p, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, mem_free, p), FS_OK);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.plain_allocs, 0);
    assert_int_equal(st.illegal_accesses, 1);
    assert_int_equal(fs_dev_call(d, mem_alloc, G, &q), FS_ERR_STICKY);
    d->ops->close(d);
}

static void test_unmap_rules(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_phys p, q;
    fs_dptr va;
    assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_DEVICE, &p), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &q), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, 8 * G, &va), FS_OK);
    /* p at [0,2G), q at [2G,3G), p again (an alias) at [4G,6G); a hole at [3G,4G). */
    assert_int_equal(fs_dev_call(d, map, va, 2 * G, p, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va + 2 * G, G, q, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va + 4 * G, 2 * G, p, 0), FS_OK);

    /* Exactly one earlier mapping or nothing (the driver refuses part of a mapping). */
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_ERR_INVALID);         /* head half */
    assert_int_equal(fs_dev_call(d, unmap, va + G, G), FS_ERR_INVALID);     /* tail half */
    assert_int_equal(fs_dev_call(d, unmap, va + G, 2 * G), FS_ERR_INVALID); /* straddles */
    assert_int_equal(fs_dev_call(d, unmap, va, 3 * G), FS_ERR_INVALID);     /* two mappings */
    assert_int_equal(fs_dev_call(d, unmap, va, 4 * G), FS_ERR_INVALID);     /* and the hole */
    assert_int_equal(fs_dev_call(d, unmap, va, 6 * G), FS_ERR_INVALID);     /* over the hole */
    assert_int_equal(fs_dev_call(d, unmap, va + 3 * G, G), FS_ERR_INVALID); /* the hole */
    assert_int_equal(fs_dev_call(d, unmap, va + 2 * G, 2 * G), FS_ERR_INVALID); /* too long */
    assert_int_equal(fs_dev_call(d, unmap, va, 0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, unmap, UINT64_MAX - G + 1, 2 * G), FS_ERR_INVALID);
    enum fs_mem_loc loc;
    for (uint64_t off = 0; off < 6 * G; off += G) /* nothing was unmapped */
        assert_int_equal(fs_sim_location(d, va + off, &loc),
                         off == 3 * G ? FS_ERR_NOT_FOUND : FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.unmaps, 0);

    assert_int_equal(fs_dev_call(d, unmap, va, 2 * G), FS_OK);
    assert_int_equal(fs_sim_location(d, va, &loc), FS_ERR_NOT_FOUND);
    assert_int_equal(fs_sim_location(d, va + G, &loc), FS_ERR_NOT_FOUND);
    assert_int_equal(fs_sim_location(d, va + 2 * G, &loc), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va, 2 * G), FS_ERR_INVALID); /* already unmapped */
    assert_int_equal(fs_dev_call(d, unmap, va + 2 * G, G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p), FS_ERR_INVALID); /* still one mapping */
    assert_int_equal(fs_dev_call(d, unmap, va + 4 * G, 2 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, q), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, 8 * G), FS_OK);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.maps, 3);
    assert_int_equal(st.unmaps, 3);
    assert_int_equal(st.unsafe_unmaps, 0);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_write_read_location(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv, hv;
    buf_make(d, &dv, 2 * G, FS_LOC_DEVICE);
    buf_make(d, &hv, G, FS_LOC_HOST);
    enum fs_mem_loc loc = FS_LOC_HOST;
    assert_int_equal(fs_sim_location(d, dv.va + G + 17, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_DEVICE);
    assert_int_equal(fs_sim_location(d, hv.va, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_HOST);
    assert_int_equal(fs_sim_location(d, hv.va + G, &loc), FS_ERR_NOT_FOUND);

    const char msg[] = "flexshim";
    char back[sizeof(msg)] = {0};
    assert_int_equal(fs_sim_write(d, dv.va + G - 3, msg, sizeof(msg)), FS_OK);
    assert_int_equal(fs_sim_read(d, back, dv.va + G - 3, sizeof(msg)), FS_OK);
    assert_string_equal(back, msg);
    /* Memory starts zeroed; ranges that leave the mapping are refused. */
    assert_true(all_eq(d, hv.va, G, 0));
    assert_int_equal(fs_sim_read(d, back, hv.va + G - 2, 4), FS_ERR_INVALID);
    assert_int_equal(fs_sim_write(d, dv.va + 2 * G, msg, 1), FS_ERR_INVALID);
    buf_free(d, &dv);
    buf_free(d, &hv);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* Evict and fetch back: device phys -> host phys, remap the host phys at the same VA, then back
 * to fresh device phys at the same VA. The program's address never changes and sees its data. */
static void test_roundtrip_remap_same_va(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_stream s;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    const uint64_t size = 2 * G;
    fs_phys dp, hp, dp2;
    fs_dptr va, stage;
    assert_int_equal(fs_dev_call(d, phys_create, size, FS_LOC_DEVICE, &dp), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, size, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va, size, dp, 0), FS_OK);
    unsigned char *pat = malloc(size), *got = malloc(size);
    for (uint64_t i = 0; i < size; i++)
        pat[i] = (unsigned char)(i * 7 + 3);
    assert_int_equal(fs_sim_write(d, va, pat, size), FS_OK);

    /* Evict: copy to host phys mapped at a staging VA, then swap the mapping at VA. */
    assert_int_equal(fs_dev_call(d, phys_create, size, FS_LOC_HOST, &hp), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, size, &stage), FS_OK);
    assert_int_equal(fs_dev_call(d, map, stage, size, hp, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, stage, va, size, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, stage, size), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va, size), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, dp), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va, size, hp, 0), FS_OK);
    enum fs_mem_loc loc;
    assert_int_equal(fs_sim_location(d, va, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_HOST);
    memset(got, 0, size);
    assert_int_equal(fs_sim_read(d, got, va, size), FS_OK);
    assert_memory_equal(got, pat, size);

    /* Fetch back into new device memory. */
    assert_int_equal(fs_dev_call(d, phys_create, size, FS_LOC_DEVICE, &dp2), FS_OK);
    assert_int_equal(fs_dev_call(d, map, stage, size, dp2, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, stage, va, size, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, stage, size), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va, size), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, hp), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va, size, dp2, 0), FS_OK);
    assert_int_equal(fs_sim_location(d, va, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_DEVICE);
    memset(got, 0, size);
    assert_int_equal(fs_sim_read(d, got, va, size), FS_OK);
    assert_memory_equal(got, pat, size);

    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.bytes_d2h, size);
    assert_int_equal(st.bytes_h2d, size);
    assert_int_equal(st.copies, 2);
    assert_int_equal(st.unsafe_unmaps, 0);

    assert_int_equal(fs_dev_call(d, unmap, va, size), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, dp2), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, size), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, stage, size), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    assert_no_leaks(d);
    free(pat);
    free(got);
    d->ops->close(d);
}

/* ---- the clock ---------------------------------------------------------------------------- */

#define BIG 55000000ull /* 55 MB: 1 ms at 55 GB/s */
#define BIG_PHYS (53 * MIB)
#define BIG_NS (2000 + 1000000ull)

static struct fs_device *open_big(void)
{
    return open_dev(512 * MIB, 0, MIB);
}

static void test_copy_timing_h2d(void **state)
{
    (void)state;
    struct fs_device *d = open_big();
    struct buf h, dv;
    buf_make(d, &h, BIG_PHYS, FS_LOC_HOST);
    buf_make(d, &dv, BIG_PHYS, FS_LOC_DEVICE);
    fill(d, h.va, BIG_PHYS, 0x11);
    fs_stream s;
    fs_event e;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &e), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 0); /* queuing takes no time */
    assert_int_equal(fs_dev_call(d, event_query, e), FS_ERR_NOT_READY);

    fs_sim_advance(d, BIG_NS - 1);
    assert_int_equal(fs_sim_now_ns(d), BIG_NS - 1);
    assert_int_equal(fs_dev_call(d, event_query, e), FS_ERR_NOT_READY);
    assert_true(all_eq(d, dv.va, 4096, 0)); /* not there yet */
    fs_sim_advance(d, 1);
    assert_int_equal(fs_dev_call(d, event_query, e), FS_OK);
    assert_true(all_eq(d, dv.va, BIG, 0x11));
    assert_true(all_eq(d, dv.va + BIG, BIG_PHYS - BIG, 0)); /* exactly SIZE bytes */
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), BIG_NS); /* nothing left: the clock stays */

    assert_int_equal(fs_dev_call(d, event_destroy, e), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_copies_on_one_stream_serialize(void **state)
{
    (void)state;
    struct fs_device *d = open_big();
    struct buf h, dv;
    buf_make(d, &h, BIG_PHYS, FS_LOC_HOST);
    buf_make(d, &dv, BIG_PHYS, FS_LOC_DEVICE);
    fs_stream s;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    /* H2D then D2H on one stream: different engines, but stream order serializes them. */
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, h.va, dv.va, BIG, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 2 * BIG_NS);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    d->ops->close(d);
}

static void test_h2d_and_d2h_overlap(void **state)
{
    (void)state;
    struct fs_device *d = open_big();
    struct buf h, dv;
    buf_make(d, &h, BIG_PHYS, FS_LOC_HOST);
    buf_make(d, &dv, BIG_PHYS, FS_LOC_DEVICE);
    fs_stream s1, s2;
    fs_event e1, e2;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s2), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e2), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, h.va, dv.va, BIG, s2), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e1, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e2, s2), FS_OK);
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), BIG_NS); /* overlapped: both done after one copy time */
    float ms = -1;
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e2, e1, &ms), FS_OK);
    assert_float_equal(ms, 0.0f, 1e-9f); /* both started at 0 and ended together */
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.bytes_h2d, BIG);
    assert_int_equal(st.bytes_d2h, BIG);
    assert_int_equal(fs_dev_call(d, event_destroy, e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, e2), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    d->ops->close(d);
}

static void test_two_h2d_serialize_on_engine(void **state)
{
    (void)state;
    struct fs_device *d = open_big();
    struct buf h, dv;
    buf_make(d, &h, BIG_PHYS, FS_LOC_HOST);
    buf_make(d, &dv, BIG_PHYS, FS_LOC_DEVICE);
    fs_stream s1, s2;
    fs_event e1;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s2), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &e1), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e1, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s2), FS_OK);
    /* Syncing s2 waits for both: s2's copy queued behind s1's on the one H2D engine. */
    assert_int_equal(fs_dev_call(d, stream_sync, s2), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 2 * BIG_NS);
    assert_int_equal(fs_dev_call(d, event_query, e1), FS_OK);
    /* A D2D copy does not wait for the H2D engine. */
    fs_event e2;
    assert_int_equal(fs_dev_call(d, event_create, 0, &e2), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, BIG, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va + 2 * MIB, dv.va, 2000000, s2), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e2, s2), FS_OK);
    fs_sim_advance(d, 3000 - 1);
    assert_int_equal(fs_dev_call(d, event_query, e2), FS_ERR_NOT_READY);
    fs_sim_advance(d, 1); /* 2 MB at 2 TB/s: 1000 ns + 2000 latency */
    assert_int_equal(fs_dev_call(d, event_query, e2), FS_OK);
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 3 * BIG_NS);
    assert_int_equal(fs_dev_call(d, event_destroy, e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, e2), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_data_visible_only_after_sync(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv, hv;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    buf_make(d, &hv, G, FS_LOC_HOST);
    fill(d, dv.va, G, 0x77);
    fs_stream s;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, s), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.copies, 0); /* counted when it executes */
    assert_true(all_eq(d, hv.va, G, 0));
    fs_sim_advance(d, 1000);
    assert_true(all_eq(d, hv.va, G, 0));
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), copy_ns(G, 55e9));
    assert_true(all_eq(d, hv.va, G, 0x77));
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.copies, 1);
    assert_int_equal(st.bytes_d2h, G);

    /* Zero bytes: nothing queued, nothing moves. */
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, 0, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), copy_ns(G, 55e9));
    /* An unknown stream is refused. */
    fs_stream bogus = (fs_stream)&st;
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, bogus), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, stream_sync, bogus), FS_ERR_INVALID);

    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_ERR_INVALID);
    buf_free(d, &dv);
    buf_free(d, &hv);
    d->ops->close(d);
}

/* Effects land in end-time order, not queue order: a long H2D queued first and a short D2D
 * queued second, both into the same bytes: the D2D's value shows first, the H2D's wins. */
static void test_effects_in_end_order(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dst, h, dsrc;
    buf_make(d, &dst, G, FS_LOC_DEVICE);
    buf_make(d, &h, G, FS_LOC_HOST);
    buf_make(d, &dsrc, G, FS_LOC_DEVICE);
    fill(d, h.va, G, 0xaa);
    fill(d, dsrc.va, G, 0xbb);
    fs_stream s1, s2;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s2), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dst.va, h.va, G, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dst.va, dsrc.va, G, s2), FS_OK);
    uint64_t d2d = copy_ns(G, 2e12), h2d = copy_ns(G, 55e9);
    assert_true(d2d < h2d);
    fs_sim_advance(d, d2d);
    assert_true(all_eq(d, dst.va, G, 0xbb));
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), h2d);
    assert_true(all_eq(d, dst.va, G, 0xaa));
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    buf_free(d, &dst);
    buf_free(d, &h);
    buf_free(d, &dsrc);
    d->ops->close(d);
}

/* Pointers resolve when the copy executes: a copy queued into a reserved but unmapped range is
 * fine if the range is mapped before it runs; data lands in whatever is mapped then. */
static void test_copy_resolves_at_execution(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf src;
    buf_make(d, &src, 2 * G, FS_LOC_DEVICE);
    fill(d, src.va, 2 * G, 0x3c);
    fs_dptr va;
    fs_phys a, b;
    assert_int_equal(fs_dev_call(d, va_reserve, 2 * G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, va, src.va, 2 * G, NULL), FS_OK);
    /* Mapped as two allocations side by side: a copy may span mappings. */
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &a), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &b), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va, G, a, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va + G, G, b, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, NULL), FS_OK);
    assert_true(all_eq(d, va, 2 * G, 0x3c));
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.illegal_accesses, 0);
    assert_int_equal(st.bytes_d2d, 2 * G); /* the engine was picked from the (unmapped) dst */
    /* And back out across both mappings at once, into one allocation. */
    fill(d, va, G, 0x01);
    fill(d, va + G, G, 0x02);
    assert_int_equal(fs_dev_call(d, copy_async, src.va, va, 2 * G, NULL), FS_OK);
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_true(all_eq(d, src.va, G, 0x01));
    assert_true(all_eq(d, src.va + G, G, 0x02));
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va + G, G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, 2 * G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, a), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, b), FS_OK);
    buf_free(d, &src);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* ---- events ------------------------------------------------------------------------------- */

static void test_events(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv, hv;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    buf_make(d, &hv, G, FS_LOC_HOST);
    fs_stream s;
    fs_event e0, e1, plain, blocking, bad = NULL;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e0), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &plain), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_ALL + 1, &bad),
                     FS_ERR_INVALID); /* unknown flag */
    assert_null(bad);
    /* A blocking event behaves as any other here (the simulator never spins); it is counted. */
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_BLOCKING, &blocking), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.blocking_events_made, 1);

    /* Never recorded: complete, sync returns at once, no timing. */
    assert_int_equal(fs_dev_call(d, event_query, e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_sync, e1), FS_OK);
    float ms = -1;
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e0, e1, &ms), FS_ERR_INVALID);

    fs_sim_advance(d, 500);
    assert_int_equal(fs_dev_call(d, event_record, e0, s), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, hv.va, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e1, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, plain, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, blocking, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_query, e0), FS_OK); /* idle stream: done at once */
    assert_int_equal(fs_dev_call(d, event_query, e1), FS_ERR_NOT_READY);
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e0, e1, &ms), FS_ERR_NOT_READY);
    /* Not ready is no failure: the last error is still the INVALID above. */
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_INVALID);

    assert_int_equal(fs_dev_call(d, event_sync, e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_sync, blocking), FS_OK); /* right behind e1 */
    assert_int_equal(fs_sim_now_ns(d), 500 + copy_ns(G, 55e9));
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e0, e1, &ms), FS_OK);
    assert_float_equal(ms, (copy_ns(G, 55e9) / 1e6), 1e-6);
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e0, plain, &ms), FS_ERR_INVALID);

    /* Re-recording moves the event. */
    fs_sim_advance(d, 1000);
    assert_int_equal(fs_dev_call(d, event_record, e0, s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_elapsed_ms, e1, e0, &ms), FS_OK);
    assert_float_equal(ms, 0.001, 1e-6);
    /* The NULL stream is a stream too. */
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, plain, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, event_query, plain), FS_ERR_NOT_READY);
    assert_int_equal(fs_dev_call(d, stream_sync, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, event_query, plain), FS_OK);

    fs_event bogus = (fs_event)&ms;
    assert_int_equal(fs_dev_call(d, event_query, bogus), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, event_destroy, e0), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, e0), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, event_destroy, e1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, plain), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, blocking), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    buf_free(d, &dv);
    buf_free(d, &hv);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* ---- kernels ------------------------------------------------------------------------------ */

struct sum_ctx {
    uint64_t n;
    uint64_t sum;
    int calls;
};

static void kernel_sum(void *ctx, void *const *ptrs, int nptrs)
{
    struct sum_ctx *c = ctx;
    assert_int_equal(nptrs, 1);
    const unsigned char *p = ptrs[0];
    c->sum = 0;
    for (uint64_t i = 0; i < c->n; i++)
        c->sum += p[i];
    c->calls++;
}

/* ptrs[1][i] = ptrs[0][i] + 1 over n bytes. */
static void kernel_inc(void *ctx, void *const *ptrs, int nptrs)
{
    uint64_t n = *(const uint64_t *)ctx;
    assert_int_equal(nptrs, 2);
    const unsigned char *in = ptrs[0];
    unsigned char *out = ptrs[1];
    for (uint64_t i = 0; i < n; i++)
        out[i] = (unsigned char)(in[i] + 1);
}

static void test_stream_wait_event_orders_kernel(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf h, dv;
    buf_make(d, &h, G, FS_LOC_HOST);
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    fill(d, h.va, G, 2);
    fs_stream s1, s2, s3;
    fs_event ev, done;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_sim_stream_create(d, &s2), FS_OK);
    assert_int_equal(fs_sim_stream_create(d, &s3), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &ev), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &done), FS_OK);

    uint64_t size = G;
    struct sum_ctx early = {G, 0, 0}, late = {G, 0, 0};
    /* Control: a kernel with no wait runs at once and sees the old (zero) data. */
    assert_int_equal(fs_sim_launch(d, s3, 500, &dv.va, &size, 1, kernel_sum, &early), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, G, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, ev, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_wait_event, s2, ev), FS_OK);
    assert_int_equal(fs_sim_launch(d, s2, 500, &dv.va, &size, 1, kernel_sum, &late), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, done, s2), FS_OK);

    uint64_t copy_end = copy_ns(G, 55e9);
    fs_sim_advance(d, copy_end + 499);
    assert_int_equal(early.calls, 1);
    assert_int_equal(early.sum, 0);
    assert_int_equal(late.calls, 0);
    assert_int_equal(fs_dev_call(d, event_query, done), FS_ERR_NOT_READY);
    assert_int_equal(fs_dev_call(d, stream_sync, s2), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), copy_end + 500);
    assert_int_equal(late.calls, 1);
    assert_int_equal(late.sum, 2 * G);
    assert_int_equal(fs_dev_call(d, event_query, done), FS_OK);

    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.kernels, 2);
    assert_int_equal(st.live_streams, 3);
    assert_int_equal(fs_dev_call(d, event_destroy, ev), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, done), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s3), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    assert_no_leaks(d);
    d->ops->close(d);
}

static void test_kernels_serialize_and_run(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf in, out;
    buf_make(d, &in, G, FS_LOC_DEVICE);
    buf_make(d, &out, G, FS_LOC_HOST); /* kernels reach host-located memory too */
    fill(d, in.va, G, 41);
    fs_stream s1, s2;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s2), FS_OK);
    uint64_t n = G;
    fs_dptr ptrs[2] = {in.va, out.va};
    uint64_t sizes[2] = {G, G};
    assert_int_equal(fs_sim_launch(d, s1, 1000, ptrs, sizes, 2, kernel_inc, &n), FS_OK);
    assert_int_equal(fs_sim_launch(d, s2, 1000, NULL, NULL, 0, NULL, NULL), FS_OK);
    assert_true(all_eq(d, out.va, G, 0));
    assert_int_equal(fs_dev_call(d, stream_sync, s1), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 1000);
    assert_true(all_eq(d, out.va, G, 42));
    assert_int_equal(fs_dev_call(d, stream_sync, s2), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 2000); /* one compute engine */

    /* A zero-length kernel on an idle device runs during the launch. */
    struct sum_ctx c = {G, 0, 0};
    assert_int_equal(fs_sim_launch(d, s1, 0, &out.va, &n, 1, kernel_sum, &c), FS_OK);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.sum, 42 * G);

    /* Bad launches. */
    uint64_t zero = 0;
    assert_int_equal(fs_sim_launch(d, s1, 10, &out.va, &zero, 1, NULL, NULL), FS_ERR_INVALID);
    assert_int_equal(fs_sim_launch(d, s1, 10, ptrs, sizes, FS_SIM_MAX_KERNEL_PTRS + 1, NULL,
                                   NULL),
                     FS_ERR_INVALID);
    assert_int_equal(fs_sim_launch(d, s1, 10, NULL, sizes, 1, NULL, NULL), FS_ERR_INVALID);

    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.kernels, 3);
    assert_int_equal(st.illegal_accesses, 0);
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    buf_free(d, &in);
    buf_free(d, &out);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* The recorder sees each operation once, as it completes, with its kind, stream, addresses and
 * times on the simulated clock: a host-to-device copy and a kernel queued after it on the same
 * stream, then a device-to-host copy on another. */
struct recs {
    struct fs_sim_record r[8];
    int n;
};

static void keep_record(void *arg, const struct fs_sim_record *rec)
{
    struct recs *rs = arg;
    if (rs->n < 8)
        rs->r[rs->n] = *rec;
    rs->n++;
}

static void test_recorder_sees_every_operation(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf h, dv;
    buf_make(d, &h, G, FS_LOC_HOST);
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    fs_stream s1, s2;
    assert_int_equal(fs_dev_call(d, stream_create, &s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s2), FS_OK);
    struct recs rs = {.n = 0};
    fs_sim_set_recorder(d, keep_record, &rs);
    uint64_t g = G;
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, G, s1), FS_OK);
    assert_int_equal(fs_sim_launch(d, s1, 1000, &dv.va, &g, 1, NULL, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, copy_async, h.va, dv.va, G, s2), FS_OK);
    assert_int_equal(rs.n, 0); /* nothing has completed yet */
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_int_equal(rs.n, 3);
    uint64_t c = copy_ns(G, 55e9);
    /* Completion order: the two copies end together (two engines), then the kernel. */
    assert_int_equal(rs.r[0].kind, FS_SIM_REC_COPY_H2D);
    assert_ptr_equal(rs.r[0].stream, s1);
    assert_int_equal(rs.r[0].dst, dv.va);
    assert_int_equal(rs.r[0].src, h.va);
    assert_int_equal(rs.r[0].bytes, G);
    assert_int_equal(rs.r[0].start_ns, 0);
    assert_int_equal(rs.r[0].end_ns, c);
    assert_false(rs.r[0].by_engine); /* queued by this (the program's) thread */
    assert_int_equal(rs.r[1].kind, FS_SIM_REC_COPY_D2H);
    assert_ptr_equal(rs.r[1].stream, s2);
    assert_int_equal(rs.r[1].end_ns, c);
    assert_int_equal(rs.r[2].kind, FS_SIM_REC_KERNEL);
    assert_ptr_equal(rs.r[2].stream, s1);
    assert_int_equal(rs.r[2].src, dv.va);
    assert_int_equal(rs.r[2].start_ns, c); /* after the copy on its stream */
    assert_int_equal(rs.r[2].end_ns, c + 1000);
    fs_sim_set_recorder(d, NULL, NULL);
    assert_int_equal(fs_sim_launch(d, s1, 1000, NULL, NULL, 0, NULL, NULL), FS_OK);
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    assert_int_equal(rs.n, 3); /* off */
    assert_int_equal(fs_dev_call(d, stream_destroy, s1), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s2), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* With host_read_bytes_per_s, a kernel takes longer by the bytes of its ranges that host memory
 * backs, read at that rate; device-backed ranges cost nothing more. */
static void test_kernel_reading_host_memory_takes_longer(void **state)
{
    (void)state;
    struct fs_sim_config cfg = {.device_bytes = 64 * MIB, .granularity = G,
                                .host_phys_supported = true, .host_read_bytes_per_s = 1e9};
    struct fs_device *d = NULL;
    assert_int_equal(fs_sim_open(&cfg, &d), FS_OK);
    struct buf on_dev, on_host;
    buf_make(d, &on_dev, 16 * G, FS_LOC_DEVICE);
    buf_make(d, &on_host, 16 * G, FS_LOC_HOST);
    fs_stream s;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    uint64_t size = 16 * G;
    assert_int_equal(fs_sim_launch(d, s, 1000, &on_dev.va, &size, 1, NULL, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 1000);
    assert_int_equal(fs_sim_launch(d, s, 1000, &on_host.va, &size, 1, NULL, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), 2000 + size); /* 1 byte per ns */
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    buf_free(d, &on_dev);
    buf_free(d, &on_host);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* A kernel range must lie within one mapping. Two adjacent mappings are not one range, even
 * when they alias the same allocation; a copy over the same bytes is fine. */
static void test_kernel_range_across_mappings(void **state)
{
    (void)state;
    for (int alias = 0; alias < 2; alias++) {
        struct fs_device *d = open_small();
        fs_phys p, q;
        fs_dptr va, vb;
        assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_DEVICE, &p), FS_OK);
        assert_int_equal(fs_dev_call(d, phys_create, 2 * G, FS_LOC_HOST, &q), FS_OK);
        assert_int_equal(fs_dev_call(d, va_reserve, 2 * G, &va), FS_OK);
        assert_int_equal(fs_dev_call(d, va_reserve, 4 * G, &vb), FS_OK);
        assert_int_equal(fs_dev_call(d, map, va, 2 * G, p, 0), FS_OK);
        fill(d, va, G, 1);
        fill(d, va + G, G, 2);
        /* Within one mapping: fine, up to its last byte. */
        struct sum_ctx c = {2 * G, 0, 0};
        uint64_t size = 2 * G;
        assert_int_equal(fs_sim_launch(d, NULL, 100, &va, &size, 1, kernel_sum, &c), FS_OK);
        assert_int_equal(d->ops->ctx_sync(d), FS_OK);
        assert_int_equal(c.sum, 3 * G);

        /* vb: p then (alias ? p again : q), back to back. */
        assert_int_equal(fs_dev_call(d, map, vb, 2 * G, p, 0), FS_OK);
        assert_int_equal(fs_dev_call(d, map, vb + 2 * G, 2 * G, alias ? p : q, 0), FS_OK);
        if (!alias)
            fill(d, vb + 2 * G, 2 * G, 1);
        /* A copy across the seam reads the tail of one mapping and the head of the next. */
        struct buf dst;
        buf_make(d, &dst, 2 * G, FS_LOC_DEVICE);
        fs_dptr mid = vb + G;
        assert_int_equal(fs_dev_call(d, copy_async, dst.va, mid, 2 * G, NULL), FS_OK);
        assert_int_equal(d->ops->ctx_sync(d), FS_OK);
        assert_true(all_eq(d, dst.va, G, 2));
        assert_true(all_eq(d, dst.va + G, G, 1));

        c.calls = 0;
        assert_int_equal(fs_sim_launch(d, NULL, 100, &mid, &size, 1, kernel_sum, &c), FS_OK);
        assert_int_equal(d->ops->ctx_sync(d), FS_ERR_STICKY);
        assert_int_equal(c.calls, 0);
        struct fs_sim_stats st;
        fs_sim_get_stats(d, &st);
        assert_int_equal(st.illegal_accesses, 1);
        assert_int_equal(st.kernels, 1);
        d->ops->close(d); /* leaked mappings and allocations: close frees them */
    }
}

/* ---- graph capture ------------------------------------------------------------------------ */

static void test_capture_forbids_sync(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv, hv;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    buf_make(d, &hv, G, FS_LOC_HOST);
    fill(d, dv.va, G, 0x42);
    fs_stream s, other;
    fs_event e;
    assert_int_equal(fs_sim_stream_create(d, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &other), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &e), FS_OK);

    bool cap = true;
    assert_int_equal(fs_dev_call(d, stream_capturing, s, &cap), FS_OK);
    assert_false(cap);
    cap = true;
    assert_int_equal(fs_dev_call(d, stream_capturing, NULL, &cap), FS_OK);
    assert_false(cap);
    fs_stream bogus = (fs_stream)&cap;
    assert_int_equal(fs_dev_call(d, stream_capturing, bogus, &cap), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, stream_capturing, s, NULL), FS_ERR_INVALID);

    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, other), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e, other), FS_OK);
    fs_sim_set_capturing(d, s, true);
    assert_int_equal(fs_dev_call(d, stream_capturing, s, &cap), FS_OK);
    assert_true(cap);
    assert_int_equal(fs_dev_call(d, stream_capturing, other, &cap), FS_OK);
    assert_false(cap);

    /* Every synchronizing call fails, whichever stream or event it names; nothing moves. Queries
     * and queuing are not synchronizing. */
    assert_int_equal(fs_dev_call(d, event_query, e), FS_ERR_NOT_READY);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, stream_sync, other), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, stream_sync, NULL), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, event_sync, e), FS_ERR_INVALID);
    assert_int_equal(d->ops->ctx_sync(d), FS_ERR_INVALID);
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_INVALID);
    assert_int_equal(fs_sim_now_ns(d), 0);
    assert_true(all_eq(d, hv.va, G, 0));
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.capture_violations, 5);
    assert_int_equal(st.copies, 0);
    assert_int_equal(st.illegal_accesses, 0);

    /* Map and unmap still work, but every call counts (the engine must not remap now). */
    fs_phys p;
    fs_dptr va;
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, map, va, G, p, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_ERR_INVALID); /* refused, still counted */
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.capture_violations, 8);
    assert_int_equal(st.maps, 3);
    assert_int_equal(st.unmaps, 1);

    /* Marks are per stream: clearing one leaves the other; destroying a stream clears its own. */
    fs_sim_set_capturing(d, s, true); /* again: no double count */
    fs_sim_set_capturing(d, other, true);
    fs_sim_set_capturing(d, s, false);
    assert_int_equal(d->ops->ctx_sync(d), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, stream_destroy, other), FS_OK);
    assert_int_equal(fs_dev_call(d, event_sync, e), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), copy_ns(G, 55e9));
    assert_true(all_eq(d, hv.va, G, 0x42));

    /* The legacy default stream can be marked too; unknown streams are ignored. */
    fs_sim_set_capturing(d, NULL, true);
    assert_int_equal(fs_dev_call(d, stream_capturing, NULL, &cap), FS_OK);
    assert_true(cap);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_ERR_INVALID);
    fs_sim_set_capturing(d, NULL, false);
    fs_sim_set_capturing(d, bogus, true);
    assert_int_equal(d->ops->ctx_sync(d), FS_OK);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.capture_violations, 10);

    assert_int_equal(fs_dev_call(d, phys_release, p), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, event_destroy, e), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    buf_free(d, &dv);
    buf_free(d, &hv);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* ---- kernel parameter layouts ------------------------------------------------------------- */

static void test_param_layout(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    static const char k1 = 1, k2 = 2, many[100]; /* distinct addresses stand for kernels */
    uint32_t off[8], sz[8];
    int n = -1;
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.param_layout_queries, 0);

    /* Unregistered: the layout cannot be told. */
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 8, &n), FS_ERR_UNSUPPORTED);
    assert_int_equal(n, -1);

    const uint32_t o1[3] = {0, 8, 16}, s1[3] = {8, 4, 8};
    assert_int_equal(fs_sim_register_kernel(d, &k1, o1, s1, 3), FS_OK);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 8, &n), FS_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(off, o1, sizeof(o1));
    assert_memory_equal(sz, s1, sizeof(s1));
    n = -1;
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 3, &n), FS_OK); /* exact fit */
    assert_int_equal(n, 3);
    /* More parameters than the caller has room for: unreadable, nothing written. */
    n = -1;
    memset(off, 0xff, sizeof(off));
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 2, &n), FS_ERR_UNSUPPORTED);
    assert_int_equal(n, -1);
    assert_int_equal(off[0], 0xffffffffu);
    assert_int_equal(fs_dev_call(d, param_layout, &k2, off, sz, 8, &n), FS_ERR_UNSUPPORTED);

    /* No parameters at all; re-registration replaces. */
    assert_int_equal(fs_sim_register_kernel(d, &k2, NULL, NULL, 0), FS_OK);
    assert_int_equal(fs_dev_call(d, param_layout, &k2, NULL, NULL, 0, &n), FS_OK);
    assert_int_equal(n, 0);
    const uint32_t o2[1] = {0}, s2[1] = {16};
    assert_int_equal(fs_sim_register_kernel(d, &k1, o2, s2, 1), FS_OK);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 8, &n), FS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(off[0], 0);
    assert_int_equal(sz[0], 16);

    /* Bad registrations change nothing. */
    assert_int_equal(fs_sim_register_kernel(d, NULL, o1, s1, 3), FS_ERR_INVALID);
    assert_int_equal(fs_sim_register_kernel(d, &k1, NULL, s1, 3), FS_ERR_INVALID);
    assert_int_equal(fs_sim_register_kernel(d, &k1, o1, NULL, 3), FS_ERR_INVALID);
    assert_int_equal(fs_sim_register_kernel(d, &k1, o1, s1, -1), FS_ERR_INVALID);
    assert_int_equal(fs_sim_register_kernel(d, &k1, o1, s1, FS_SIM_MAX_KERNEL_PARAMS + 1),
                     FS_ERR_INVALID);
    assert_int_equal(fs_sim_register_kernel(NULL, &k1, o1, s1, 3), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 8, &n), FS_OK);
    assert_int_equal(n, 1);

    /* Bad queries. */
    assert_int_equal(fs_dev_call(d, param_layout, NULL, off, sz, 8, &n), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, 8, NULL), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, sz, -1, &n), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, NULL, sz, 8, &n), FS_ERR_INVALID);
    assert_int_equal(fs_dev_call(d, param_layout, &k1, off, NULL, 8, &n), FS_ERR_INVALID);

    /* Many kernels, each its own layout. */
    for (int i = 0; i < 100; i++) {
        uint32_t o[2] = {0, 8}, z[2] = {8, (uint32_t)i + 1};
        assert_int_equal(fs_sim_register_kernel(d, &many[i], o, z, 1 + i % 2), FS_OK);
    }
    for (int i = 0; i < 100; i++) {
        assert_int_equal(fs_dev_call(d, param_layout, &many[i], off, sz, 8, &n), FS_OK);
        assert_int_equal(n, 1 + i % 2);
        if (n == 2)
            assert_int_equal(sz[1], (uint32_t)i + 1);
    }

    /* Every call counts, failed ones included (the engine's cache is tested against this). */
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.param_layout_queries, 13 + 100);
    d->ops->close(d); /* the registry is freed here */
}

/* ---- sticky failures ---------------------------------------------------------------------- */

static void test_illegal_kernel_access_is_sticky(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    fs_dptr hole;
    assert_int_equal(fs_dev_call(d, va_reserve, G, &hole), FS_OK);
    fs_stream s;
    fs_event e;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &e), FS_OK);
    struct sum_ctx c = {G, 0, 0};
    uint64_t size = G;
    /* Half mapped is still illegal: the range runs past dv's mapping. */
    fs_dptr ptr = dv.va + G / 2;
    assert_int_equal(fs_sim_launch(d, s, 100, &ptr, &size, 1, kernel_sum, &c), FS_OK);
    assert_int_equal(fs_sim_launch(d, s, 100, &dv.va, &size, 1, kernel_sum, &c), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_ERR_STICKY);
    assert_int_equal(c.calls, 0); /* neither ran: the context died at the first */
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.illegal_accesses, 1);

    fs_phys p = NULL;
    fs_dptr va = 0;
    uint64_t fr;
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p), FS_ERR_STICKY);
    assert_null(p);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, map, hole, G, dv.phys, 0), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, dv.va, 16, s), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, event_record, e, s), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, event_query, e), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, event_sync, e), FS_ERR_STICKY);
    assert_int_equal(d->ops->ctx_sync(d), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, mem_info, &fr, NULL), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_ERR_STICKY);
    assert_int_equal(fs_sim_launch(d, s, 1, NULL, NULL, 0, NULL, NULL), FS_ERR_STICKY);
    bool cap = true;
    assert_int_equal(fs_dev_call(d, stream_capturing, s, &cap), FS_ERR_STICKY);
    assert_true(cap);
    static const char k = 0;
    const uint32_t zero32 = 0;
    assert_int_equal(fs_sim_register_kernel(d, &k, &zero32, &zero32, 1), FS_OK); /* a helper */
    uint32_t off, sz;
    int n = -1;
    assert_int_equal(fs_dev_call(d, param_layout, &k, &off, &sz, 1, &n), FS_ERR_STICKY);
    assert_int_equal(n, -1);
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_STICKY);
    struct fs_device_props props;
    assert_int_equal(fs_dev_call(d, props, &props), FS_OK);
    d->ops->close(d); /* everything still live is freed here */
}

static void test_illegal_copy_is_sticky(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    fs_dptr hole;
    assert_int_equal(fs_dev_call(d, va_reserve, G, &hole), FS_OK);
    fill(d, dv.va, G, 9);
    assert_int_equal(fs_dev_call(d, copy_async, hole, dv.va, G, NULL), FS_OK);
    fs_sim_advance(d, 1000000);
    assert_int_equal(fs_dev_call(d, stream_sync, NULL), FS_ERR_STICKY);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.illegal_accesses, 1);
    assert_int_equal(st.copies, 0);
    assert_true(all_eq(d, dv.va, G, 9)); /* the test helpers still read */
    d->ops->close(d);
}

static void test_unsafe_unmap(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf dv, hv, other;
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    buf_make(d, &hv, G, FS_LOC_HOST);
    buf_make(d, &other, G, FS_LOC_DEVICE);
    fs_stream s;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);

    /* Quiet: unmapping memory no queued work touches is fine while work is queued. */
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, other.va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.unsafe_unmaps, 0);
    /* After the sync the source is quiet too. */
    assert_int_equal(fs_dev_call(d, map, other.va, G, other.phys, 0), FS_OK);

    /* Not quiet: the copy has not run when its source goes away. */
    assert_int_equal(fs_dev_call(d, copy_async, hv.va, dv.va, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, dv.va, G), FS_OK); /* performed... */
    enum fs_mem_loc loc;
    assert_int_equal(fs_sim_location(d, dv.va, &loc), FS_ERR_NOT_FOUND);
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.unsafe_unmaps, 1); /* ...counted, and the context is dead */
    assert_int_equal(st.illegal_accesses, 1);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, unmap, hv.va, G), FS_ERR_STICKY);
    d->ops->close(d);
}

/* ---- failure injection -------------------------------------------------------------------- */

#define INJ FS_ERR_IO /* an error the simulator never produces by itself */

static int track(int rc, int *injected)
{
    if (rc == INJ)
        (*injected)++;
    return rc;
}

/* Every injectable operation at least once (most twice), tolerating failures, then a cleanup
 * that retries. Returns how many calls failed with the injected error. */
static int workload(struct fs_device *d)
{
    int n = 0;
    fs_phys pd = NULL, ph = NULL;
    fs_dptr vd = 0, vh = 0;
    fs_stream s = NULL;
    fs_event e = NULL;
    bool md = false, mh = false, copied = false;

    track(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &pd), &n);
    track(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &ph), &n);
    track(fs_dev_call(d, va_reserve, G, &vd), &n);
    track(fs_dev_call(d, va_reserve, G, &vh), &n);
    if (pd && vd)
        md = track(fs_dev_call(d, map, vd, G, pd, 0), &n) == FS_OK;
    if (ph && vh)
        mh = track(fs_dev_call(d, map, vh, G, ph, 0), &n) == FS_OK;
    track(fs_dev_call(d, stream_create, &s), &n);
    track(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e), &n);
    fs_dptr plain = 0;
    track(fs_dev_call(d, mem_alloc, G, &plain), &n);
    if (md)
        fill(d, vd, G, 0xee);
    if (s && md && mh)
        copied = track(fs_dev_call(d, copy_async, vh, vd, G, s), &n) == FS_OK;
    uint64_t *parts = NULL;
    bool fingerprinted = false;
    assert_int_equal(fs_dev_call(d, host_alloc, FS_FP_PARTS_BYTES, (void **)&parts), FS_OK);
    if (s && md)
        fingerprinted = track(fs_dev_call(d, fingerprint, vd, G, s, parts), &n) == FS_OK;
    if (s && e) {
        track(fs_dev_call(d, event_record, e, s), &n);
        track(fs_dev_call(d, stream_wait_event, s, e), &n);
        track(fs_dev_call(d, event_sync, e), &n);
    }
    if (s)
        track(fs_dev_call(d, stream_sync, s), &n);
    track(d->ops->ctx_sync(d), &n);
    int rc;
    while ((rc = track(d->ops->ctx_sync(d), &n)) == INJ)
        ;
    assert_int_equal(rc, FS_OK);
    if (mh) /* a failed copy did nothing */
        assert_true(all_eq(d, vh, G, copied ? 0xee : 0));
    if (fingerprinted) { /* the fingerprint of G bytes of 0xee, as the host computes it */
        unsigned char *ref = malloc(G);
        uint64_t *want = malloc(FS_FP_PARTS_BYTES);
        assert_non_null(ref);
        assert_non_null(want);
        memset(ref, 0xee, G);
        fs_fp_host(ref, G, want);
        assert_true(fs_fp_equal(fs_fp_combine(parts), fs_fp_combine(want)));
        free(ref);
        free(want);
    }
    assert_int_equal(fs_dev_call(d, host_free, parts), FS_OK);

    if (md)
        while ((rc = track(fs_dev_call(d, unmap, vd, G), &n)) == INJ)
            ;
    if (mh)
        while ((rc = track(fs_dev_call(d, unmap, vh, G), &n)) == INJ)
            ;
    fs_dptr vas[2] = {vd, vh};
    fs_phys ps[2] = {pd, ph};
    for (int i = 0; i < 2; i++) {
        if (vas[i]) {
            while ((rc = track(fs_dev_call(d, va_release, vas[i], G), &n)) == INJ)
                ;
            assert_int_equal(rc, FS_OK);
        }
        if (ps[i]) {
            while ((rc = track(fs_dev_call(d, phys_release, ps[i]), &n)) == INJ)
                ;
            assert_int_equal(rc, FS_OK);
        }
    }
    if (s)
        assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    if (e)
        assert_int_equal(fs_dev_call(d, event_destroy, e), FS_OK);
    if (plain)
        assert_int_equal(fs_dev_call(d, mem_free, plain), FS_OK);
    return n;
}

static void test_failure_injection_every_op(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    assert_int_equal(workload(d), 0); /* nothing armed: nothing fails */
    assert_no_leaks(d);
    for (int op = 0; op < FS_SIM_OP_COUNT; op++) {
        for (uint64_t nth = 1; nth <= 2; nth++) {
            fs_sim_fail_nth(d, (enum fs_sim_op)op, nth, INJ);
            int n = workload(d);
            /* Every op runs at least once in the workload, so nth=1 always fires. */
            if (nth == 1)
                assert_int_equal(n, 1);
            else
                assert_true(n <= 1);
            if (n == 1)
                assert_int_equal(d->ops->last_native_error(d), INJ);
            fs_sim_fail_nth(d, (enum fs_sim_op)op, 0, 0);
            assert_no_leaks(d);
            struct fs_sim_stats st;
            fs_sim_get_stats(d, &st);
            assert_int_equal(st.illegal_accesses, 0);
            assert_int_equal(st.unsafe_unmaps, 0);
        }
    }
    d->ops->close(d);
}

static void test_fail_nth_counts_and_disarms(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    fs_phys p[4] = {NULL, NULL, NULL, NULL};
    fs_sim_fail_nth(d, FS_SIM_OP_PHYS_CREATE, 3, FS_ERR_NOMEM);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p[0]), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p[1]), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p[2]), FS_ERR_NOMEM);
    assert_null(p[2]);
    assert_int_equal(d->ops->last_native_error(d), FS_ERR_NOMEM);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &p[3]), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.live_phys, 3);
    assert_int_equal(st.device_bytes_in_use, 3 * G);

    /* Counted per op: other ops do not move the count. */
    fs_sim_fail_nth(d, FS_SIM_OP_PHYS_RELEASE, 2, FS_ERR_DEVICE);
    fs_dptr va;
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p[0]), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p[1]), FS_ERR_DEVICE);
    assert_int_equal(fs_dev_call(d, phys_release, p[1]), FS_OK);

    /* nth = 0 disarms. */
    fs_sim_fail_nth(d, FS_SIM_OP_VA_RELEASE, 1, FS_ERR_DEVICE);
    fs_sim_fail_nth(d, FS_SIM_OP_VA_RELEASE, 0, 0);
    assert_int_equal(fs_dev_call(d, va_release, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, p[3]), FS_OK);
    assert_no_leaks(d);

    /* An injected sticky error kills the context. */
    fs_sim_fail_nth(d, FS_SIM_OP_SYNC, 1, FS_ERR_STICKY);
    assert_int_equal(d->ops->ctx_sync(d), FS_ERR_STICKY);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_ERR_STICKY);
    d->ops->close(d);
}

/* ---- teardown and threads ----------------------------------------------------------------- */

static void test_close_frees_leaked_objects(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf a, b;
    buf_make(d, &a, 2 * G, FS_LOC_DEVICE);
    buf_make(d, &b, G, FS_LOC_HOST);
    fs_stream s;
    fs_event e;
    fs_phys loose;
    fs_dptr va;
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_sim_stream_create(d, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, FS_EVENT_TIMING, &e), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &loose), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_OK);
    /* Work still queued at close. */
    assert_int_equal(fs_dev_call(d, copy_async, b.va, a.va, G, s), FS_OK);
    uint64_t size = G;
    assert_int_equal(fs_sim_launch(d, s, 100000, &a.va, &size, 1, NULL, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, e, s), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.live_phys, 3);
    assert_int_equal(st.live_streams, 2);
    assert_int_equal(st.live_events, 1);
    assert_int_equal(st.live_va_ranges, 3);
    d->ops->close(d); /* valgrind checks that nothing is lost */
}

#define NTHREADS 4
#define ITERS 50

struct thread_arg {
    struct fs_device *dev;
    int id;
    int failures;
};

static void *thread_main(void *p)
{
    struct thread_arg *t = p;
    struct fs_device *d = t->dev;
    struct buf h, dv, back;
    fs_stream s;
    fs_event e;
    if (d->ops->bind_thread(d) != FS_OK || fs_dev_call(d, stream_create, &s) != FS_OK ||
        fs_dev_call(d, event_create, 0, &e) != FS_OK) {
        t->failures++;
        return NULL;
    }
    /* buf_make asserts, and CMocka asserts are not for other threads: do it by hand. */
    struct buf *bufs[3] = {&h, &dv, &back};
    enum fs_mem_loc locs[3] = {FS_LOC_HOST, FS_LOC_DEVICE, FS_LOC_HOST};
    for (int i = 0; i < 3; i++) {
        bufs[i]->size = G;
        if (fs_dev_call(d, phys_create, G, locs[i], &bufs[i]->phys) != FS_OK ||
            fs_dev_call(d, va_reserve, G, &bufs[i]->va) != FS_OK ||
            fs_dev_call(d, map, bufs[i]->va, G, bufs[i]->phys, 0) != FS_OK) {
            t->failures++;
            return NULL;
        }
    }
    static unsigned char pat[NTHREADS][G], got[NTHREADS][G];
    uint64_t n = G;
    for (int it = 0; it < ITERS; it++) {
        for (uint64_t i = 0; i < G; i++)
            pat[t->id][i] = (unsigned char)(i + (uint64_t)it * 13 + (uint64_t)t->id * 101);
        fs_dptr kp[2] = {dv.va, dv.va};
        uint64_t ks[2] = {G, G};
        if (fs_sim_write(d, h.va, pat[t->id], G) != FS_OK ||
            fs_dev_call(d, copy_async, dv.va, h.va, G, s) != FS_OK ||
            fs_sim_launch(d, s, 700, kp, ks, 2, kernel_inc, &n) != FS_OK ||
            fs_dev_call(d, copy_async, back.va, dv.va, G, s) != FS_OK ||
            fs_dev_call(d, event_record, e, s) != FS_OK) {
            t->failures++;
            break;
        }
        int rc = (it % 2) ? fs_dev_call(d, stream_sync, s) : fs_dev_call(d, event_sync, e);
        if (rc != FS_OK || fs_dev_call(d, event_query, e) != FS_OK ||
            fs_sim_read(d, got[t->id], back.va, G) != FS_OK) {
            t->failures++;
            break;
        }
        for (uint64_t i = 0; i < G; i++)
            if (got[t->id][i] != (unsigned char)(pat[t->id][i] + 1)) {
                t->failures++;
                break;
            }
    }
    for (int i = 0; i < 3; i++)
        if (fs_dev_call(d, unmap, bufs[i]->va, G) != FS_OK ||
            fs_dev_call(d, va_release, bufs[i]->va, G) != FS_OK ||
            fs_dev_call(d, phys_release, bufs[i]->phys) != FS_OK)
            t->failures++;
    if (fs_dev_call(d, stream_destroy, s) != FS_OK || fs_dev_call(d, event_destroy, e) != FS_OK)
        t->failures++;
    return NULL;
}

static void test_threads_smoke(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    pthread_t th[NTHREADS];
    struct thread_arg args[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        args[i] = (struct thread_arg){d, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    struct fs_sim_stats st;
    fs_sim_get_stats(d, &st);
    assert_int_equal(st.copies, 2 * NTHREADS * ITERS);
    assert_int_equal(st.kernels, NTHREADS * ITERS);
    assert_int_equal(st.illegal_accesses, 0);
    assert_int_equal(st.unsafe_unmaps, 0);
    assert_int_equal(st.capture_violations, 0);
    assert_int_equal(st.maps, 3 * NTHREADS);
    assert_int_equal(st.maps_by_loc[FS_LOC_HOST], 2 * NTHREADS);
    assert_int_equal(st.peak_device_bytes <= NTHREADS * G, true);
    assert_no_leaks(d);
    d->ops->close(d);
}

/* Host time of remaps (replaying a profile): on the program's thread the clock moves; on an engine
 * thread only that thread is busy, so the copy it queues next starts after the remap while the
 * program's work is not held back. */
static void test_remap_host_time_per_thread(void **state)
{
    (void)state;
    struct fs_sim_config cfg = {.device_bytes = 64 * MIB, .granularity = G,
                                .host_phys_supported = true, .copy_latency_ns = 2000};
    const uint64_t per_gib = 1ull << 40; /* 1024 ns per byte: COST per map of G bytes */
    const uint64_t cost = G * 1024;
    cfg.map_ns_per_gib[FS_LOC_HOST] = per_gib;
    struct fs_device *d = NULL;
    assert_int_equal(fs_sim_open(&cfg, &d), FS_OK);
    fs_phys ph, pd;
    fs_dptr va, vd;
    fs_stream s;
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_HOST, &ph), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_create, G, FS_LOC_DEVICE, &pd), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &va), FS_OK);
    assert_int_equal(fs_dev_call(d, va_reserve, G, &vd), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &s), FS_OK);
    assert_int_equal(fs_dev_call(d, map, vd, G, pd, 0), FS_OK);

    assert_int_equal(fs_dev_call(d, map, va, G, ph, 0), FS_OK); /* program thread */
    assert_int_equal(fs_sim_now_ns(d), cost);
    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_OK);

    fs_thread_internal = true;
    assert_int_equal(fs_dev_call(d, map, va, G, ph, 0), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), cost); /* the clock did not move */
    assert_int_equal(fs_dev_call(d, copy_async, vd, va, G, s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, s), FS_OK);
    fs_thread_internal = false;
    /* The engine thread's wait did not hold the program back... */
    assert_int_equal(fs_sim_now_ns(d), cost);
    /* ...and the copy started once the engine thread's remap was done. */
    fs_sim_join_engine_clock(d);
    assert_int_equal(fs_sim_now_ns(d), 2 * cost + copy_ns(G, 55e9));

    assert_int_equal(fs_dev_call(d, unmap, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, unmap, vd, G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, va, G), FS_OK);
    assert_int_equal(fs_dev_call(d, va_release, vd, G), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, ph), FS_OK);
    assert_int_equal(fs_dev_call(d, phys_release, pd), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, s), FS_OK);
    d->ops->close(d);
}

/* Two clocks: an engine thread waiting for a copy leaves the program's thread where it is (its
 * next kernel starts at its own clock), while what the engine thread queues after the wait starts
 * after it; the copy's bytes are there when the engine thread's wait returns. */
static void test_engine_wait_keeps_the_program_clock(void **state)
{
    (void)state;
    struct fs_device *d = open_small();
    struct buf h, dv;
    buf_make(d, &h, G, FS_LOC_HOST);
    buf_make(d, &dv, G, FS_LOC_DEVICE);
    fs_stream copy_s, prog_s, next_s;
    fs_event ev;
    assert_int_equal(fs_dev_call(d, stream_create, &copy_s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_create, &next_s), FS_OK);
    assert_int_equal(fs_sim_stream_create(d, &prog_s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_create, 0, &ev), FS_OK);
    fill(d, h.va, G, 0x5a);
    const uint64_t t0 = fs_sim_now_ns(d);

    fs_thread_internal = true;
    assert_int_equal(fs_dev_call(d, copy_async, dv.va, h.va, G, copy_s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_record, ev, copy_s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_sync, ev), FS_OK);
    assert_true(all_eq(d, dv.va, G, 0x5a));
    const uint64_t copied = t0 + copy_ns(G, 55e9);
    /* Queued after the wait: starts after the copy, though the program's clock is behind. */
    assert_int_equal(fs_dev_call(d, event_record, ev, next_s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_query, ev), FS_OK);
    fs_thread_internal = false;
    assert_int_equal(fs_sim_now_ns(d), t0);
    /* The program's event on an idle stream is done at its own clock, not the engine's. */
    assert_int_equal(fs_dev_call(d, event_record, ev, prog_s), FS_OK);
    assert_int_equal(fs_dev_call(d, event_query, ev), FS_OK);
    /* Its kernel starts now, beside the engine's wait, and ends 1 us later. */
    assert_int_equal(fs_sim_launch(d, prog_s, 1000, NULL, NULL, 0, NULL, NULL), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_sync, prog_s), FS_OK);
    assert_int_equal(fs_sim_now_ns(d), t0 + 1000);
    assert_true(t0 + 1000 < copied);
    fs_sim_join_engine_clock(d);
    assert_int_equal(fs_sim_now_ns(d), copied);

    assert_int_equal(fs_dev_call(d, event_destroy, ev), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, copy_s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, next_s), FS_OK);
    assert_int_equal(fs_dev_call(d, stream_destroy, prog_s), FS_OK);
    buf_free(d, &h);
    buf_free(d, &dv);
    assert_no_leaks(d);
    d->ops->close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_defaults),
        cmocka_unit_test(test_device_capacity_nomem),
        cmocka_unit_test(test_host_capacity_and_bad_sizes),
        cmocka_unit_test(test_va_reserve_release),
        cmocka_unit_test(test_map_rules),
        cmocka_unit_test(test_unmap_rules),
        cmocka_unit_test(test_write_read_location),
        cmocka_unit_test(test_roundtrip_remap_same_va),
        cmocka_unit_test(test_copy_timing_h2d),
        cmocka_unit_test(test_copies_on_one_stream_serialize),
        cmocka_unit_test(test_h2d_and_d2h_overlap),
        cmocka_unit_test(test_two_h2d_serialize_on_engine),
        cmocka_unit_test(test_data_visible_only_after_sync),
        cmocka_unit_test(test_effects_in_end_order),
        cmocka_unit_test(test_copy_resolves_at_execution),
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_stream_wait_event_orders_kernel),
        cmocka_unit_test(test_kernels_serialize_and_run),
        cmocka_unit_test(test_kernel_reading_host_memory_takes_longer),
        cmocka_unit_test(test_recorder_sees_every_operation),
        cmocka_unit_test(test_kernel_range_across_mappings),
        cmocka_unit_test(test_capture_forbids_sync),
        cmocka_unit_test(test_param_layout),
        cmocka_unit_test(test_illegal_kernel_access_is_sticky),
        cmocka_unit_test(test_illegal_copy_is_sticky),
        cmocka_unit_test(test_unsafe_unmap),
        cmocka_unit_test(test_plain_memory),
        cmocka_unit_test(test_failure_injection_every_op),
        cmocka_unit_test(test_fail_nth_counts_and_disarms),
        cmocka_unit_test(test_close_frees_leaked_objects),
        cmocka_unit_test(test_threads_smoke),
        cmocka_unit_test(test_remap_host_time_per_thread),
        cmocka_unit_test(test_engine_wait_keeps_the_program_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

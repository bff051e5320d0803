/* The residency engine on the simulated device: budget, eviction with write-back, fault-in
 * before launches, the quiet-range rule, parameter scanning, failure injection, threads. */
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "device_sim.h"
#include "launch.h"
#include "residency.h"
#include "run_trace.h"
#include "test_util.h"

#define MIB (1024ull * 1024ull)
#ifndef THREADS
#define THREADS 4
#endif

struct env {
    struct fs_device *dev;
    struct fs_residency res;
    fs_stream stream; /* the program's stream */
};

/* Kernel handle of the test "program": one parameter per pointer, 8 bytes each. */
static const int kernel_token;
#define KERNEL ((const void *)&kernel_token)

/* D2D_BYTES_PER_S: the simulated device's speed for fingerprints (0: its default). */
static void env_open_sim(struct env *e, uint64_t budget, bool strict, bool fingerprint,
                         double d2d_bytes_per_s)
{
    struct fs_sim_config cfg = {.device_bytes = 4096 * MIB, .host_phys_supported = true,
                                .d2d_bytes_per_s = d2d_bytes_per_s};
    assert_int_equal(fs_sim_open(&cfg, &e->dev), FS_OK);
    struct fs_res_config rc = {.budget = budget,
                               .va_space_bytes = 64ull << 30,
                               .strict_remap = strict,
                               .fingerprint = fingerprint};
    assert_int_equal(fs_res_init(&e->res, e->dev, &rc), FS_OK);
    assert_int_equal(fs_launch_init(e->dev), FS_OK);
    assert_int_equal(fs_sim_stream_create(e->dev, &e->stream), FS_OK);
    uint32_t offsets[4] = {0, 8, 16, 24}, sizes[4] = {8, 8, 8, 8};
    assert_int_equal(fs_sim_register_kernel(e->dev, KERNEL, offsets, sizes, 4), FS_OK);
}

static void env_open_fp(struct env *e, uint64_t budget, bool strict, bool fingerprint)
{
    env_open_sim(e, budget, strict, fingerprint, 0.0);
}

/* Every test runs with fingerprints on, as the engine does by default (WRITEBACK). */
static void env_open(struct env *e, uint64_t budget, bool strict)
{
    env_open_fp(e, budget, strict, true);
}

static void env_close(struct env *e)
{
    struct fs_sim_stats st;
    fs_sim_get_stats(e->dev, &st);
    assert_int_equal(st.illegal_accesses, 0);
    assert_int_equal(st.unsafe_unmaps, 0);
    fs_launch_shutdown();
    fs_res_destroy(&e->res);
    fs_sim_get_stats(e->dev, &st);
    assert_int_equal(st.live_phys, 0);  /* everything the engine created is gone */
    assert_int_equal(st.live_va_ranges, 0);
    e->dev->ops->close(e->dev);
}

/* A kernel that adds 1 to every uint32 of its first range and checks the second is intact. */
struct kctx {
    uint32_t words; /* per range */
};

/* Add D (modulo 2^32) to every word of the first range. */
static void add_to_words(const struct kctx *k, void *const *ptrs, uint32_t d)
{
    uint32_t *p = ptrs[0];
    for (uint32_t i = 0; i < k->words; i++)
        p[i] += d;
}

static void add_one(void *ctx, void *const *ptrs, int nptrs)
{
    (void)nptrs;
    add_to_words(ctx, ptrs, 1);
}

static void sub_one(void *ctx, void *const *ptrs, int nptrs)
{
    (void)nptrs;
    add_to_words(ctx, ptrs, UINT32_MAX);
}

/* The program launches kernel FN over the first NPTRS allocations of PTRS (as parameters). The
 * kernel runs on the addresses its parameters hold once the launch is entered (redirected ones,
 * for staged allocations); the exit puts the program's values back. */
static void launch(struct env *e, const fs_dptr *ptrs, const uint64_t *sizes, int nptrs,
                   uint64_t duration_ns, fs_sim_kernel_fn fn, void *ctx)
{
    uint64_t params[4] = {0};
    void *argv[4];
    for (int i = 0; i < 4; i++) {
        params[i] = i < nptrs ? ptrs[i] + 64 : 0; /* point inside, not at the base */
        argv[i] = &params[i];
    }
    struct fs_launch_desc d = {.func = KERNEL, .stream = e->stream, .kernel_params = argv};
    struct fs_launch_ticket t;
    fs_launch_enter(&e->res, &d, &t);
    fs_dptr used[4];
    for (int i = 0; i < nptrs; i++)
        used[i] = params[i] - 64;
    assert_int_equal(fs_sim_launch(e->dev, e->stream, duration_ns, used, sizes, nptrs, fn, ctx),
                     FS_OK);
    fs_launch_exit(&e->res, &t, true);
    for (int i = 0; i < nptrs; i++)
        assert_int_equal(params[i], ptrs[i] + 64);
}

static void fill(struct env *e, fs_dptr va, uint64_t size, uint32_t seed)
{
    uint32_t *buf = malloc(size);
    for (uint64_t i = 0; i < size / 4; i++)
        buf[i] = seed * 2654435761u + (uint32_t)i;
    assert_int_equal(fs_sim_write(e->dev, va, buf, size), FS_OK);
    free(buf);
}

static void check(struct env *e, fs_dptr va, uint64_t size, uint32_t seed, uint32_t plus)
{
    uint32_t *buf = malloc(size);
    assert_int_equal(fs_sim_read(e->dev, buf, va, size), FS_OK);
    for (uint64_t i = 0; i < size / 4; i++)
        if (buf[i] != seed * 2654435761u + (uint32_t)i + plus)
            fail_msg("word %llu of 0x%llx: %u", (unsigned long long)i, (unsigned long long)va,
                     buf[i]);
    free(buf);
}

static enum fs_mem_loc where(struct env *e, fs_dptr va)
{
    enum fs_mem_loc loc;
    assert_int_equal(fs_sim_location(e->dev, va, &loc), FS_OK);
    return loc;
}

/* N allocations of SIZE bytes into V, allocation I filled with seed I. */
static void alloc_filled(struct env *e, fs_dptr *v, int n, uint64_t size)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(fs_res_alloc(&e->res, size, &v[i]), FS_OK);
        fill(e, v[i], size, (uint32_t)i);
    }
}

/* A plan's roles (1: kept) for fs_res_set_plan_roles, which takes a malloc'd list. */
static uint8_t *kept(const uint8_t *ids, int n)
{
    uint8_t *k = malloc((size_t)n);
    assert_non_null(k);
    memcpy(k, ids, (size_t)n);
    return k;
}

/* An asynchronous move's event and fingerprint buffer, as the plan executor gives each slot. */
/* A move set up as the executor's slots are (core/executor.c slots_init). */
static void move_init(struct env *e, struct fs_res_move *m)
{
    assert_int_equal(fs_dev_call(e->dev, event_create, 0, &m->ev), FS_OK);
    assert_int_equal(fs_dev_call(e->dev, event_create, 0, &m->fp_ev), FS_OK);
    assert_int_equal(fs_dev_call(e->dev, host_alloc, FS_FP_PARTS_BYTES, (void **)&m->parts), FS_OK);
}

static void move_fini(struct env *e, struct fs_res_move *m)
{
    fs_dev_call(e->dev, event_destroy, m->ev);
    fs_dev_call(e->dev, event_destroy, m->fp_ev);
    fs_dev_call(e->dev, host_free, m->parts);
}

static void test_alloc_within_budget_stays_on_device(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr a, b;
    uint64_t odd = 19 * MIB + 100; /* rounded up to 20 MiB */
    assert_int_equal(fs_res_alloc(&e.res, odd, &a), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 30 * MIB, &b), FS_OK);
    assert_int_equal(where(&e, a), FS_LOC_DEVICE);
    assert_int_equal(where(&e, b), FS_LOC_DEVICE);
    assert_int_equal(fs_res_lookup(&e.res, a + odd - 1)->va, a);
    assert_null(fs_res_lookup(&e.res, a + odd)); /* the rounding slack is not the allocation */
    assert_null(fs_res_lookup(&e.res, a - 1));
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.device_bytes_held, 20 * MIB + 30 * MIB);
    assert_int_equal(fs_res_free(&e.res, a), FS_OK);
    assert_int_equal(fs_res_free(&e.res, b), FS_OK);
    env_close(&e);
}

/* While allocations are frozen as they are placed (launch tracking paused), one that fits the
 * budget gets plain device memory outside the VA space, counted against the budget; one whose
 * plain memory cannot be had is frozen in the VA space; one that does not fit goes to host. Plain
 * ones are freed, found, and given back at shutdown; after fs_res_stop_freezing none is made. */
static void test_frozen_allocations_get_plain_memory(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 10 * MIB, true);
    assert_int_equal(fs_res_freeze(&e.res), FS_OK);
    fs_dptr a, b, c, d, last;
    uint64_t odd = 3 * MIB + 100; /* 4 MiB of plain memory */
    assert_int_equal(fs_res_alloc(&e.res, odd, &a), FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(e.dev, &st);
    assert_int_equal(st.plain_allocs, 1);
    assert_int_equal(st.maps, 0);
    assert_null(fs_res_lookup(&e.res, a)); /* not in the VA space: launches never see it */
    struct fs_alloc *pa = fs_res_find(&e.res, a + odd - 1);
    assert_non_null(pa);
    assert_true(pa->plain && pa->frozen);
    assert_int_equal(pa->va, a);
    assert_null(fs_res_find(&e.res, a + odd));
    assert_int_equal(where(&e, a), FS_LOC_DEVICE);
    fill(&e, a, odd, 9);
    check(&e, a, odd, 9, 0);

    fs_sim_fail_nth(e.dev, FS_SIM_OP_MEM_ALLOC, 1, FS_ERR_DEVICE);
    assert_int_equal(fs_res_alloc(&e.res, 2 * MIB, &b), FS_OK);
    struct fs_alloc *pb = fs_res_lookup(&e.res, b);
    assert_non_null(pb); /* in the VA space, frozen there */
    assert_true(pb->frozen && !pb->plain);
    assert_int_equal(where(&e, b), FS_LOC_DEVICE);
    assert_int_equal(fs_res_device_bytes(&e.res), 6 * MIB);

    assert_int_equal(fs_res_alloc(&e.res, 6 * MIB, &c), FS_OK); /* 4 + 2 + 6 > 10 */
    assert_int_equal(where(&e, c), FS_LOC_HOST);
    assert_false(fs_res_lookup(&e.res, c)->plain);
    struct fs_res_stats rs;
    fs_res_get_stats(&e.res, &rs);
    assert_int_equal(rs.plain_made, 1);
    assert_int_equal(rs.plain_bytes, 4 * MIB);
    assert_int_equal(rs.frozen, 2);
    assert_int_equal(rs.evictions, 0);
    assert_int_equal(rs.device_bytes_peak, 6 * MIB); /* the plain memory with the pool's */

    assert_int_equal(fs_res_free(&e.res, a + MIB), FS_ERR_INVALID);
    assert_int_equal(fs_res_free(&e.res, a), FS_OK);
    assert_int_equal(fs_res_free(&e.res, a), FS_ERR_NOT_FOUND);
    fs_sim_get_stats(e.dev, &st);
    assert_int_equal(st.plain_allocs, 0);
    fs_res_get_stats(&e.res, &rs);
    assert_int_equal(rs.plain_bytes, 0);
    assert_int_equal(rs.allocs_live, 2);
    assert_int_equal(fs_res_alloc(&e.res, 4 * MIB, &last), FS_OK); /* room again: plain */
    assert_true(fs_res_find(&e.res, last)->plain);

    fs_res_stop_freezing(&e.res);
    assert_int_equal(fs_res_free(&e.res, c), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 2 * MIB, &d), FS_OK);
    assert_false(fs_res_lookup(&e.res, d)->plain);
    fs_res_get_stats(&e.res, &rs);
    assert_int_equal(rs.plain_made, 2);
    env_close(&e); /* LAST is still allocated: shutdown gives its plain memory back */
}

/* The exit line's device blocks: a freed block is reused by an allocation of its size; one of
 * another size, with the budget full, costs a block given back and one made. */
static void test_pool_counts_blocks_made_and_given_back(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr a, b, c;
    assert_int_equal(fs_res_alloc(&e.res, 32 * MIB, &a), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 32 * MIB, &b), FS_OK);
    assert_int_equal(fs_res_free(&e.res, a), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 32 * MIB, &a), FS_OK); /* the cached block */
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.device_blocks.made, 2);
    assert_int_equal(s.device_blocks.released, 0);
    assert_true(s.device_blocks.made_ns > 0);
    assert_int_equal(s.device_blocks.released_ns, 0);
    assert_int_equal(fs_res_free(&e.res, a), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 20 * MIB, &c), FS_OK);
    assert_int_equal(where(&e, c), FS_LOC_DEVICE);
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.device_blocks.made, 3);
    assert_int_equal(s.device_blocks.released, 1);
    assert_true(s.device_blocks.released_ns > 0);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(fs_res_free(&e.res, b), FS_OK);
    assert_int_equal(fs_res_free(&e.res, c), FS_OK);
    env_close(&e);
}

static void test_eviction_preserves_data(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr v[4];
    alloc_filled(&e, v, 4, 32 * MIB);
    /* 128 MiB under 64: the two oldest went to host, data intact and still addressable. */
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST);
    assert_int_equal(where(&e, v[1]), FS_LOC_HOST);
    assert_int_equal(where(&e, v[3]), FS_LOC_DEVICE);
    for (int i = 0; i < 4; i++)
        check(&e, v[i], 32 * MIB, (uint32_t)i, 0);
    struct fs_sim_stats st;
    fs_sim_get_stats(e.dev, &st);
    assert_true(st.peak_device_bytes <= 64 * MIB + 128 * MIB); /* pool blocks + copy VAs only */
    assert_true(fs_res_device_bytes(&e.res) <= 64 * MIB);
    env_close(&e);
}

static void test_launch_faults_in_and_kernel_sees_data(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr v[4];
    uint64_t sz[4];
    for (int i = 0; i < 4; i++) {
        sz[i] = 32 * MIB;
        assert_int_equal(fs_res_alloc(&e.res, sz[i], &v[i]), FS_OK);
        fill(&e, v[i], sz[i], (uint32_t)i);
    }
    struct kctx k = {.words = (uint32_t)(32 * MIB / 4)};
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 4; i++) {
            launch(&e, &v[i], &sz[i], 1, 100000, add_one, &k);
            assert_int_equal(where(&e, v[i]), FS_LOC_DEVICE);
            assert_true(fs_res_device_bytes(&e.res) <= 64 * MIB);
        }
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    for (int i = 0; i < 4; i++)
        check(&e, v[i], sz[i], (uint32_t)i, 3);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_true(s.faults >= 8); /* cyclic access under LRU: every launch after the first two */
    assert_true(s.evictions >= 8);
    assert_int_equal(s.failures, 0);
    struct fs_launch_stats ls;
    fs_launch_get_stats(&ls);
    assert_int_equal(ls.unknown, 0);
    env_close(&e);
}

static void test_allocation_larger_than_budget_lives_on_host(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr big;
    uint64_t size = 100 * MIB;
    assert_int_equal(fs_res_alloc(&e.res, size, &big), FS_OK);
    assert_int_equal(where(&e, big), FS_LOC_HOST);
    fill(&e, big, size, 7);
    struct kctx k = {.words = (uint32_t)(size / 4)};
    launch(&e, &big, &size, 1, 1000, add_one, &k); /* cannot fit: runs from host, correctly */
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    check(&e, big, size, 7, 1);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.placed_on_host, 1);
    assert_int_equal(s.host_served, 1);
    env_close(&e);
}

/* A long kernel still reads allocation X (as a parameter) when the next launch needs room. */
static void quiet_rule_case(bool strict, bool hidden)
{
    struct env e;
    env_open(&e, 64 * MIB, strict);
    fs_dptr v[3];
    uint64_t sz[3] = {32 * MIB, 32 * MIB, 32 * MIB};
    for (int i = 0; i < 3; i++)
        assert_int_equal(fs_res_alloc(&e.res, sz[i], &v[i]), FS_OK);
    /* v[0] is on host now; bring v[1] and v[2] in use, then a long kernel on v[1]. */
    struct kctx k = {.words = 16};
    launch(&e, &v[2], &sz[2], 1, 1000, add_one, &k);
    if (hidden) {
        /* The kernel reaches v[1] through memory, not through its parameters. */
        struct fs_launch_desc d = {.func = KERNEL, .stream = e.stream,
                                   .kernel_params = (void *[4]){&(uint64_t){0}, &(uint64_t){0},
                                                                &(uint64_t){0}, &(uint64_t){0}}};
        struct fs_launch_ticket t;
        fs_launch_enter(&e.res, &d, &t);
        assert_int_equal(fs_sim_launch(e.dev, e.stream, 50000000, &v[1], &sz[1], 1, add_one, &k),
                         FS_OK);
        fs_launch_exit(&e.res, &t, true);
    } else {
        launch(&e, &v[1], &sz[1], 1, 50000000, add_one, &k);
    }
    /* v[0] needs room: the least recently used victim is v[1] (no launch named it), which the
     * long kernel is still using. */
    if (hidden && !strict) {
        struct fs_test_capture cap;
        fs_test_capture_start(&cap);
        uint64_t p = v[0];
        struct fs_launch_desc d = {.func = KERNEL, .stream = e.stream,
                                   .kernel_params = (void *[4]){&p, &p, &p, &p}};
        struct fs_launch_ticket t;
        fs_launch_enter(&e.res, &d, &t); /* the unsafe remap of v[1] happens here */
        fs_launch_exit(&e.res, &t, false);
        /* The dead context makes the engine's own calls fail, and it says so. */
        assert_non_null(strstr(fs_test_capture_end(&cap), "evicting allocation 1"));
    } else {
        launch(&e, &v[0], &sz[0], 1, 1000, add_one, &k);
        launch(&e, &v[2], &sz[2], 1, 1000, add_one, &k);
    }
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), hidden && !strict ? FS_ERR_STICKY : FS_OK);
    struct fs_sim_stats st;
    fs_sim_get_stats(e.dev, &st);
    if (hidden && !strict) {
        /* tracked mode cannot see pointers kept in memory: the simulator catches the unsafe
         * remap, which is why strict is the default. */
        assert_true(st.unsafe_unmaps > 0);
        fs_launch_shutdown();
        fs_res_destroy(&e.res);
        e.dev->ops->close(e.dev);
        return;
    }
    env_close(&e);
}

static void test_quiet_rule_strict(void **state)
{
    (void)state;
    quiet_rule_case(true, false);
}

static void test_quiet_rule_tracked(void **state)
{
    (void)state;
    quiet_rule_case(false, false);
}

static void test_strict_protects_pointers_kept_in_memory(void **state)
{
    (void)state;
    quiet_rule_case(true, true);
}

static void test_tracked_misses_pointers_kept_in_memory(void **state)
{
    (void)state;
    quiet_rule_case(false, true);
}

static void test_layout_cache_and_unknown_launches(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    uint64_t sz = 8 * MIB;
    assert_int_equal(fs_res_alloc(&e.res, sz, &v), FS_OK);
    struct fs_launch_stats before, after;
    fs_launch_get_stats(&before);
    struct kctx k = {.words = 4};
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    struct fs_sim_stats st;
    fs_sim_get_stats(e.dev, &st);
    assert_int_equal(st.param_layout_queries, 1); /* cached after the first launch */
    /* A kernel the driver cannot describe is unknown; the extra buffer is scanned whole. */
    static const int other;
    uint64_t word = v + 100;
    struct fs_launch_desc unknown = {.func = &other, .stream = e.stream,
                                     .kernel_params = (void *[1]){&word}};
    struct fs_launch_ticket t;
    fs_launch_enter(&e.res, &unknown, &t);
    fs_launch_exit(&e.res, &t, true);
    uint64_t buf[5] = {1, 2, 3, v + 12345, 5};
    struct fs_launch_desc extra = {.func = &other, .stream = e.stream, .param_buf = buf,
                                   .param_buf_size = sizeof(buf)};
    fs_launch_enter(&e.res, &extra, &t);
    assert_int_equal(t.n, 1);
    assert_int_equal(t.refs[0]->va, v);
    fs_launch_exit(&e.res, &t, true);
    /* A copy's device range: its first and last byte. */
    const uint64_t ends[2] = {v + 64, v + 64 + 4095};
    struct fs_launch_desc copy = {.stream = e.stream, .ptrs = ends, .nptrs = 2};
    fs_launch_enter(&e.res, &copy, &t);
    assert_int_equal(t.n, 1);
    fs_launch_exit(&e.res, &t, true);
    fs_launch_get_stats(&after);
    assert_int_equal(after.unknown - before.unknown, 1);
    assert_int_equal(after.with_refs - before.with_refs, 4);
    /* Where each was found: the two add_one launches in their parameters, the packed buffer,
     * the copy's range. */
    assert_int_equal(after.refs_in_params - before.refs_in_params, 2);
    assert_int_equal(after.refs_in_extra - before.refs_in_extra, 1);
    assert_int_equal(after.refs_in_ranges - before.refs_in_ranges, 1);
    env_close(&e);
}

static void test_capture_never_remaps(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr v[3];
    uint64_t sz[3] = {32 * MIB, 32 * MIB, 32 * MIB};
    for (int i = 0; i < 3; i++)
        assert_int_equal(fs_res_alloc(&e.res, sz[i], &v[i]), FS_OK);
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST);
    fs_sim_set_capturing(e.dev, e.stream, true);
    struct kctx k = {.words = 4};
    launch(&e, &v[0], &sz[0], 1, 1000, add_one, &k);
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST); /* used where it is */
    fs_sim_set_capturing(e.dev, e.stream, false);
    struct fs_sim_stats st;
    fs_sim_get_stats(e.dev, &st);
    assert_int_equal(st.capture_violations, 0);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.host_served, 1);
    launch(&e, &v[0], &sz[0], 1, 1000, add_one, &k); /* after the capture: faulted in */
    assert_int_equal(where(&e, v[0]), FS_LOC_DEVICE);
    env_close(&e);
}

/* Each device operation the engine uses fails once, at each of its first calls: the program's
 * call gets an error or a correct result, data is never lost, nothing leaks. Three allocations
 * where two fit make every operation happen; small ones keep the copies and checks cheap. */
static void test_failure_injection(void **state)
{
    (void)state;
    fs_log_set_level(FS_LOG_ERROR); /* each injected failure is logged as a warning */
    static const enum fs_sim_op ops[] = {FS_SIM_OP_PHYS_CREATE, FS_SIM_OP_VA_RESERVE,
                                         FS_SIM_OP_MAP, FS_SIM_OP_UNMAP, FS_SIM_OP_COPY,
                                         FS_SIM_OP_SYNC};
    for (size_t o = 0; o < FS_ARRAY_LEN(ops); o++) {
        int fired = 0;
        for (uint64_t nth = 1; nth <= 6; nth++) {
            struct env e;
            env_open(&e, 8 * MIB, true);
            fs_sim_fail_nth(e.dev, ops[o], nth, FS_ERR_DEVICE);
            fs_dptr v[3] = {0};
            uint64_t sz[3] = {4 * MIB, 4 * MIB, 4 * MIB};
            bool ok[3];
            for (int i = 0; i < 3; i++) {
                ok[i] = fs_res_alloc(&e.res, sz[i], &v[i]) == FS_OK;
                if (ok[i])
                    fill(&e, v[i], sz[i], (uint32_t)i);
            }
            struct kctx k = {.words = (uint32_t)(sz[0] / 4)};
            for (int i = 0; i < 3; i++)
                if (ok[i])
                    launch(&e, &v[i], &sz[i], 1, 1000, add_one, &k);
            fired += fs_sim_fail_pending(e.dev, ops[o]) == 0;
            fs_sim_fail_nth(e.dev, ops[o], 0, 0);
            assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
            for (int i = 0; i < 3; i++)
                if (ok[i])
                    check(&e, v[i], sz[i], (uint32_t)i, 1);
            env_close(&e);
        }
        assert_true(fired >= 5); /* armed failures that never came would test nothing */
    }
    fs_log_set_level(FS_LOG_WARN);
}

struct worker {
    struct env *e;
    fs_dptr v[2];
    uint64_t sz[2];
    int rounds;
    struct kctx k; /* outlives the thread: kernels run when the clock reaches them */
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    w->k.words = (uint32_t)(w->sz[0] / 4);
    for (int r = 0; r < w->rounds; r++)
        for (int i = 0; i < 2; i++)
            launch(w->e, &w->v[i], &w->sz[i], 1, 20000, add_one, &w->k);
    return NULL;
}

static void test_threads_under_pressure(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    enum { T = THREADS };
    struct worker w[T];
    pthread_t th[T];
    for (int t = 0; t < T; t++) {
        w[t] = (struct worker){.e = &e, .sz = {16 * MIB, 16 * MIB}, .rounds = 10};
        for (int i = 0; i < 2; i++) {
            assert_int_equal(fs_res_alloc(&e.res, w[t].sz[i], &w[t].v[i]), FS_OK);
            fill(&e, w[t].v[i], w[t].sz[i], (uint32_t)(t * 2 + i));
        }
    }
    for (int t = 0; t < T; t++)
        assert_int_equal(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < 2; i++)
            check(&e, w[t].v[i], w[t].sz[i], (uint32_t)(t * 2 + i), 10);
    assert_true(fs_res_device_bytes(&e.res) <= 64 * MIB);
    env_close(&e);
}

static void test_free_returns_memory_and_rejects_interior(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr a;
    assert_int_equal(fs_res_alloc(&e.res, 24 * MIB, &a), FS_OK);
    assert_int_equal(fs_res_free(&e.res, a + 4096), FS_ERR_INVALID);
    assert_int_equal(fs_res_free(&e.res, 0x1234), FS_ERR_NOT_FOUND);
    assert_int_equal(fs_res_free(&e.res, a), FS_OK);
    assert_null(fs_res_lookup(&e.res, a));
    assert_int_equal(fs_res_free(&e.res, a), FS_ERR_NOT_FOUND);
    fs_dptr b;
    assert_int_equal(fs_res_alloc(&e.res, 24 * MIB, &b), FS_OK); /* the cached block is reused */
    assert_int_equal(e.res.dev_pool.counts.made, 1);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.allocs_live, 1);
    env_close(&e);
}

/* The planner's entry points: evict now, make resident ahead of use. */
static void test_evict_and_make_resident(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr v;
    assert_int_equal(fs_res_alloc(&e.res, 16 * MIB, &v), FS_OK);
    fill(&e, v, 16 * MIB, 9);
    struct fs_alloc *a = fs_res_lookup(&e.res, v);
    assert_int_equal(fs_res_evict_id(&e.res, a->id), FS_OK);
    assert_int_equal(where(&e, v), FS_LOC_HOST);
    assert_int_equal(fs_res_evict_id(&e.res, a->id), FS_OK); /* already on host: nothing to do */
    check(&e, v, 16 * MIB, 9, 0);
    assert_int_equal(fs_res_prefetch_id(&e.res, a->id), FS_OK);
    assert_int_equal(where(&e, v), FS_LOC_DEVICE);
    assert_int_equal(fs_res_prefetch_id(&e.res, a->id), FS_OK); /* already there */
    check(&e, v, 16 * MIB, 9, 0);
    assert_int_equal(fs_res_prefetch_id(&e.res, a->id + 1), FS_ERR_NOT_FOUND);
    assert_int_equal(fs_res_evict_id(&e.res, a->id + 1), FS_ERR_NOT_FOUND);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.prefetches, 1);
    env_close(&e);
}

/* A plan known at start-up pins the host memory of what it will evict in the background, before
 * the program allocates: the first evictions find their blocks in the pool. */
static void test_prepin_fills_the_host_pool_ahead(void **state)
{
    (void)state;
    struct env e;
    struct fs_sim_config cfg = {.device_bytes = 4096 * MIB, .host_phys_supported = true};
    assert_int_equal(fs_sim_open(&cfg, &e.dev), FS_OK);
    struct fs_res_config rc = {.budget = 64 * MIB,
                               .va_space_bytes = 64ull << 30,
                               .background_pinning = true,
                               .fingerprint = true};
    assert_int_equal(fs_res_init(&e.res, e.dev, &rc), FS_OK);
    assert_int_equal(fs_launch_init(e.dev), FS_OK);
    uint64_t sizes[2] = {32 * MIB, 32 * MIB};
    /* A plan's kept set outlives the pre-pinning (it once freed the set: a double free below). */
    static const uint8_t keep[2] = {1, 0};
    fs_res_set_plan_roles(&e.res, kept(keep, 2), 2);
    fs_res_prepin(&e.res, sizes, 2);
    fs_res_set_plan_roles(&e.res, kept(keep, 2), 2);
    struct fs_res_stats st;
    for (int i = 0; i < 2000; i++) { /* at most 2 s */
        fs_res_get_stats(&e.res, &st);
        if (st.host_bytes_held >= 64 * MIB)
            break;
        usleep(1000);
    }
    assert_int_equal(st.host_bytes_held, 64 * MIB);
    uint64_t created = e.res.host_pool.counts.made;
    fs_dptr v[4];
    alloc_filled(&e, v, 4, 32 * MIB); /* 128 MiB under 64: two evictions */
    fs_res_get_stats(&e.res, &st);
    assert_true(st.evictions >= 2);
    assert_int_equal(e.res.host_pool.counts.made, created); /* nothing pinned on demand */
    for (int i = 0; i < 4; i++)
        check(&e, v[i], 32 * MIB, (uint32_t)i, 0);
    env_close(&e);
}

/* The program on a thread of its own: one add_one launch over its first N allocations of SIZE
 * bytes each, lasting DURATION_NS; DONE once it is queued. */
struct program_arg {
    struct env *e;
    fs_dptr v[2];
    int n;
    uint64_t size, duration_ns;
    struct kctx k;
    bool done;
};

static void *program_main(void *p)
{
    struct program_arg *r = p;
    uint64_t sizes[2] = {r->size, r->size};
    launch(r->e, r->v, sizes, r->n, r->duration_ns, add_one, &r->k);
    __atomic_store_n(&r->done, true, __ATOMIC_RELEASE);
    return NULL;
}

/* A launch that waits in its slow path (here for B's prefetch) drops the lock; an asynchronous
 * eviction of A, already looked at, may begin meanwhile. The launch must not take its holds while
 * A moves: it waits for that move too and brings A back, so the remap never runs under its kernel
 * (found in review: the simulator then reported an unsafe unmap). */
static void test_launch_waits_for_moves_begun_while_it_waited(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 256 * MIB, false);
    struct program_arg r = {.e = &e, .n = 2, .size = 8 * MIB,
                            .duration_ns = 50000000, /* long: still queued at a remap */
                            .k = {.words = (uint32_t)(8 * MIB / 4)}};
    assert_int_equal(fs_res_alloc(&e.res, 8 * MIB, &r.v[0]), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 8 * MIB, &r.v[1]), FS_OK);
    fill(&e, r.v[0], 8 * MIB, 1);
    fill(&e, r.v[1], 8 * MIB, 2);
    struct fs_alloc *A = fs_res_lookup(&e.res, r.v[0]), *B = fs_res_lookup(&e.res, r.v[1]);
    assert_int_equal(fs_res_evict_id(&e.res, B->id), FS_OK);
    struct fs_res_move mb = {0}, ma = {0};
    move_init(&e, &mb);
    move_init(&e, &ma);
    assert_int_equal(fs_res_move_begin(&e.res, B->id, false, &mb), FS_OK);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, program_main, &r), 0);
    usleep(100000); /* the program waits for B, its holds dropped */
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &ma), FS_OK);
    assert_int_equal(fs_res_move_end(&e.res, &mb, true), FS_OK);
    usleep(100000); /* it would take its holds now, were A not checked again */
    assert_int_equal(fs_res_move_end(&e.res, &ma, true), FS_OK);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    check(&e, r.v[0], 8 * MIB, 1, 1); /* the kernel's +1 on A kept */
    move_fini(&e, &mb);
    move_fini(&e, &ma);
    env_close(&e); /* no unsafe unmap, no illegal access */
}

/* An asynchronous eviction gives its device memory back before it maps host memory at the VA (the
 * slow part): a prefetch waiting for that room starts from the room callback, while the evicted
 * VA is still unmapped and the allocation still moving. Both end with their data intact. */
struct room_probe {
    struct env *e;
    struct fs_alloc *evicted, *wanted;
    struct fs_res_move *prefetch;
    int calls, prefetch_rc, state, loc_rc;
};

static void room_probe(void *arg)
{
    struct room_probe *p = arg;
    enum fs_mem_loc loc;
    p->calls++;
    p->state = __atomic_load_n(&p->evicted->state, __ATOMIC_ACQUIRE);
    p->loc_rc = fs_sim_location(p->e->dev, p->evicted->va, &loc);
    p->prefetch_rc = fs_res_move_begin(&p->e->res, p->wanted->id, false, p->prefetch);
}

/* ONLY_IF_QUIET (an eviction passing a prefetch held for room): while a launch that used the
 * allocation may still run, the eviction does not begin and leaves everything as it was; once
 * the launch is done it begins, and the kernel's result is what goes to host. */
static void test_eviction_only_if_quiet(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr w[3];
    uint64_t sz = 32 * MIB;
    alloc_filled(&e, w, 3, sz); /* one went to host: launches now record their last use */
    fs_dptr v = w[2];
    struct fs_alloc *A = fs_res_lookup(&e.res, v);
    assert_int_equal(A->state, FS_RES_DEVICE);
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    launch(&e, &v, &sz, 1, 5000000, add_one, &k); /* 5 ms of simulated time, not waited for */
    struct fs_res_move m = {0};
    move_init(&e, &m);
    m.only_if_quiet = true;
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &m), FS_ERR_NOT_READY);
    assert_int_equal(A->state, FS_RES_DEVICE);
    assert_int_equal(where(&e, v), FS_LOC_DEVICE);
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &m), FS_OK);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    assert_int_equal(A->state, FS_RES_HOST);
    check(&e, v, sz, 2, 1);
    move_fini(&e, &m);
    env_close(&e);
}

static void test_eviction_gives_room_before_mapping_host(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 32 * MIB, false);
    fs_dptr v[3];
    alloc_filled(&e, v, 2, 16 * MIB);
    struct fs_alloc *A = fs_res_lookup(&e.res, v[0]), *B = fs_res_lookup(&e.res, v[1]);
    assert_int_equal(fs_res_evict_id(&e.res, B->id), FS_OK);
    assert_int_equal(fs_res_alloc(&e.res, 16 * MIB, &v[2]), FS_OK); /* takes B's old block */
    fill(&e, v[2], 16 * MIB, 2);
    struct fs_res_move ma = {0}, mb = {0};
    move_init(&e, &ma);
    move_init(&e, &mb);
    /* No room for B until A's eviction ends. */
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &ma), FS_OK);
    assert_int_equal(fs_res_move_begin(&e.res, B->id, false, &mb), FS_ERR_NOT_READY);
    struct room_probe p = {.e = &e, .evicted = A, .wanted = B, .prefetch = &mb};
    ma.on_room = room_probe;
    ma.on_room_arg = &p;
    assert_int_equal(fs_res_move_end(&e.res, &ma, true), FS_OK);
    assert_int_equal(p.calls, 1);
    assert_int_equal(p.state, FS_RES_MOVING);
    assert_int_not_equal(p.loc_rc, FS_OK); /* host memory not mapped yet */
    assert_int_equal(p.prefetch_rc, FS_OK);
    assert_int_equal(fs_res_move_end(&e.res, &mb, true), FS_OK);
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST);
    assert_int_equal(where(&e, v[1]), FS_LOC_DEVICE);
    assert_true(fs_res_device_bytes(&e.res) <= 32 * MIB);
    for (int i = 0; i < 3; i++)
        check(&e, v[i], 16 * MIB, (uint32_t)i, 0);
    move_fini(&e, &ma);
    move_fini(&e, &mb);
    env_close(&e);
}

/* COPY_WAIT=predict: a move's copy is predicted from the link model (latency + bytes / rate)
 * when it begins, none without a plausible model; the wake-up is a fifth of the copy, or
 * FS_COPY_WAKE_MARGIN_NS, before its end, counted from the later of its queueing and the end of
 * the copy before it, and none for a copy shorter than the margin. */
static void test_copy_wait_prediction(void **state)
{
    (void)state;
    const uint64_t ms = 1000000, margin = FS_COPY_WAKE_MARGIN_NS;
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 0, ms), 10 * ms + ms - ms / 5);
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 12 * ms, ms), 12 * ms + ms - ms / 5);
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 9 * ms, ms), 10 * ms + ms - ms / 5);
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 0, 500000), 10 * ms + 500000 - margin);
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 0, margin), 0);
    assert_int_equal(fs_res_copy_wake_ns(10 * ms, 0, 0), 0);

    struct env e;
    env_open(&e, 64 * MIB, false);
    e.res.predicted_waits = true;
    fs_res_set_link(&e.res, 5.0, 55000.0, 7.0, 50000.0); /* us, bytes/us */
    fs_dptr v;
    alloc_filled(&e, &v, 1, 16 * MIB);
    struct fs_alloc *A = fs_res_lookup(&e.res, v);
    struct fs_res_move m = {0};
    move_init(&e, &m);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &m), FS_OK);
    double want = 7000.0 + 16.0 * MIB * 1000.0 / 50000.0; /* device to host */
    assert_true(fabs((double)m.copy_ns - want) < 2.0);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, false, &m), FS_OK);
    want = 5000.0 + 16.0 * MIB * 1000.0 / 55000.0;
    assert_true(fabs((double)m.copy_ns - want) < 2.0);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    /* A model no real link has: nothing is predicted. */
    fs_res_set_link(&e.res, 5.0, 1e-12, 7.0, 1e-12);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &m), FS_OK);
    assert_int_equal(m.copy_ns, 0);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    move_fini(&e, &m);
    env_close(&e);
}

/* A prefetch of a quiet allocation maps the device block at the VA while its copy runs: a launch
 * then does not wait on the host (it runs on another thread here, joined with a deadline) but its
 * kernel runs after the copy on the device, and sees the copied data. */
static void test_prefetch_maps_early_and_launch_waits_on_its_stream(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    struct program_arg a = {.e = &e, .n = 1, .size = 16 * MIB, .duration_ns = 1000,
                            .k = {.words = (uint32_t)(16 * MIB / 4)}};
    alloc_filled(&e, a.v, 1, 16 * MIB);
    struct fs_alloc *A = fs_res_lookup(&e.res, a.v[0]);
    assert_int_equal(fs_res_evict_id(&e.res, A->id), FS_OK);
    struct fs_res_stats s0, s1;
    fs_res_get_stats(&e.res, &s0);
    struct fs_res_move m = {0};
    move_init(&e, &m);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, false, &m), FS_OK);
    assert_int_equal(where(&e, a.v[0]), FS_LOC_HOST); /* begun: the copy is queued, VA unchanged */
    assert_int_equal(fs_res_move_map(&e.res, &m), FS_OK);
    assert_true(m.mapped_early);
    assert_true(A->arriving);
    assert_int_equal(A->state, FS_RES_MOVING);
    assert_int_equal(where(&e, a.v[0]), FS_LOC_DEVICE); /* before the copy has landed */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, program_main, &a), 0);
    for (int i = 0; i < 5000 && !__atomic_load_n(&a.done, __ATOMIC_ACQUIRE); i++)
        usleep(1000);
    assert_true(__atomic_load_n(&a.done, __ATOMIC_ACQUIRE)); /* queued while still moving */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    assert_false(A->arriving);
    assert_int_equal(A->state, FS_RES_DEVICE);
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    check(&e, a.v[0], 16 * MIB, 0, 1); /* the kernel ran on the copied data, after the copy */
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.early_maps, s0.early_maps + 1);
    assert_int_equal(s1.ordered_waits, s0.ordered_waits + 1);
    assert_int_equal(s1.prefetches, s0.prefetches + 1);
    move_fini(&e, &m);
    env_close(&e);
}

/* With the run trace on, a launch ordered after an arriving copy is measured for the device time
 * its stream waited for the copy (stream_probe.h): the simulated copy of 16 MiB takes 305 us at
 * 55 GB/s, and the stream had nothing else queued, so it waited for most of it, never more. A
 * launch on an allocation already on the device, and one with the trace off, are not measured. */
static void ordered_launch(struct env *e, uint64_t size, bool trace, uint64_t *idle_ns,
                           uint64_t *measured)
{
    fs_dptr v[1];
    uint64_t sizes[1] = {size};
    struct kctx k = {.words = (uint32_t)(size / 4)};
    alloc_filled(e, v, 1, size);
    struct fs_alloc *A = fs_res_lookup(&e->res, v[0]);
    assert_int_equal(fs_res_evict_id(&e->res, A->id), FS_OK);
    assert_int_equal(fs_dev_call(e->dev, ctx_sync), FS_OK); /* the stream is dry */
    struct fs_res_move m = {0};
    move_init(e, &m);
    assert_int_equal(fs_res_move_begin(&e->res, A->id, false, &m), FS_OK);
    assert_int_equal(fs_res_move_map(&e->res, &m), FS_OK);
    assert_true(m.mapped_early);
    if (trace)
        assert_int_equal(fs_rt_open(1024), FS_OK);
    launch(e, v, sizes, 1, 1000, add_one, &k); /* ordered after the copy */
    assert_int_equal(fs_res_move_end(&e->res, &m, true), FS_OK);
    launch(e, v, sizes, 1, 1000, add_one, &k); /* on the device: no wait */
    assert_int_equal(fs_dev_call(e->dev, ctx_sync), FS_OK);
    struct fs_res_stats st;
    fs_res_get_stats(&e->res, &st);
    if (trace)
        fs_rt_close();
    check(e, v[0], size, 0, 2);
    assert_int_equal(st.ordered_wait.missed, 0);
    *idle_ns = st.ordered_wait.idle_ns;
    *measured = st.ordered_wait.measured;
    move_fini(e, &m);
}

static void test_ordered_wait_measured_on_the_device(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    uint64_t idle_ns, measured;
    ordered_launch(&e, 16 * MIB, false, &idle_ns, &measured);
    assert_int_equal(measured, 0);
    assert_int_equal(idle_ns, 0);
    ordered_launch(&e, 16 * MIB, true, &idle_ns, &measured);
    assert_int_equal(measured, 1);
    uint64_t copy_ns = (uint64_t)(16.0 * MIB / 55e9 * 1e9);
    assert_true(idle_ns > copy_ns / 2 && idle_ns <= copy_ns + 1000);
    env_close(&e);
}

/* If host memory cannot be mapped after the device memory went back, the data comes back on the
 * device (over the budget if need be): the VA is mapped, the data intact, the failure counted. */
static void test_eviction_host_map_failure_keeps_data(void **state)
{
    (void)state;
    fs_log_set_level(FS_LOG_ERROR); /* the failure is logged as a warning */
    struct env e;
    env_open(&e, 32 * MIB, false);
    fs_dptr v;
    assert_int_equal(fs_res_alloc(&e.res, 16 * MIB, &v), FS_OK);
    fill(&e, v, 16 * MIB, 7);
    struct fs_alloc *A = fs_res_lookup(&e.res, v);
    struct fs_res_move m = {0};
    move_init(&e, &m);
    struct fs_res_stats s0, s1;
    fs_res_get_stats(&e.res, &s0);
    assert_int_equal(fs_res_move_begin(&e.res, A->id, true, &m), FS_OK);
    fs_sim_fail_nth(e.dev, FS_SIM_OP_MAP, 1, FS_ERR_DEVICE); /* the host mapping */
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_ERR_DEVICE);
    fs_sim_fail_nth(e.dev, FS_SIM_OP_MAP, 0, 0);
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.failures, s0.failures + 1);
    assert_int_equal(s1.evictions, s0.evictions);
    assert_int_equal(A->state, FS_RES_DEVICE);
    assert_int_equal(where(&e, v), FS_LOC_DEVICE);
    check(&e, v, 16 * MIB, 7, 0);
    /* It can be evicted again later, and comes back intact. */
    assert_int_equal(fs_res_evict_id(&e.res, A->id), FS_OK);
    assert_int_equal(where(&e, v), FS_LOC_HOST);
    check(&e, v, 16 * MIB, 7, 0);
    move_fini(&e, &m);
    env_close(&e);
    fs_log_set_level(FS_LOG_WARN);
}

/* Room made on demand evicts what the plan does not keep resident first, even when a kept
 * allocation is older, and a kept one only when nothing else is left; without a plan, LRU. */
static void plan_keep_case(bool with_plan)
{
    struct env e;
    env_open(&e, 32 * MIB, false);
    fs_dptr v[4];
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    alloc_filled(&e, v, 2, sz);
    launch(&e, &v[0], &sz, 1, 1000, add_one, &k); /* A used first: the least recently used */
    launch(&e, &v[1], &sz, 1, 1000, add_one, &k);
    static const uint8_t keep[4] = {1, 0, 1, 0}; /* ids 0 (A) and 2 (C) kept */
    if (with_plan)
        fs_res_set_plan_roles(&e.res, kept(keep, 4), 4);
    assert_int_equal(fs_res_alloc(&e.res, sz, &v[2]), FS_OK); /* C: room for it */
    fill(&e, v[2], sz, 2);
    assert_int_equal(where(&e, v[0]), with_plan ? FS_LOC_DEVICE : FS_LOC_HOST);
    assert_int_equal(where(&e, v[1]), with_plan ? FS_LOC_HOST : FS_LOC_DEVICE);
    if (with_plan) {
        /* Only kept ones on the device now: one of them makes room for D all the same. */
        assert_int_equal(fs_res_alloc(&e.res, sz, &v[3]), FS_OK);
        fill(&e, v[3], sz, 3);
        assert_true((where(&e, v[0]) == FS_LOC_HOST) != (where(&e, v[2]) == FS_LOC_HOST));
        check(&e, v[3], sz, 3, 0);
    }
    check(&e, v[0], sz, 0, 1);
    check(&e, v[1], sz, 1, 1);
    check(&e, v[2], sz, 2, 0);
    fs_res_set_plan_roles(&e.res, NULL, 0);
    env_close(&e);
}

static void test_plan_kept_allocations_are_evicted_last(void **state)
{
    (void)state;
    plan_keep_case(true);
    plan_keep_case(false);
}

/* An allocation the plan serves from host (OFFLOAD_MODE=host_read) is not faulted in by a launch
 * that references it while it is on host: the kernel reads and writes it there (counted as
 * host-served), nothing else is evicted for it, and the data stays exact. */
static void test_plan_host_role_is_read_in_place(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 32 * MIB, false);
    fs_dptr v[3];
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    alloc_filled(&e, v, 3, sz); /* the third pushed the first (the least recently used) out */
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST);
    static const uint8_t roles[3] = {FS_PLAN_HOST, FS_PLAN_MOVED, FS_PLAN_MOVED};
    fs_res_set_plan_roles(&e.res, kept(roles, 3), 3);
    struct fs_res_stats before, after;
    fs_res_get_stats(&e.res, &before);
    launch(&e, &v[0], &sz, 1, 1000, add_one, &k);
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    fs_res_get_stats(&e.res, &after);
    assert_int_equal(where(&e, v[0]), FS_LOC_HOST);
    assert_int_equal(where(&e, v[1]), FS_LOC_DEVICE);
    assert_int_equal(where(&e, v[2]), FS_LOC_DEVICE);
    assert_int_equal(after.faults, before.faults);
    assert_int_equal(after.host_served, before.host_served + 1);
    check(&e, v[0], sz, 0, 1);
    /* Without the role the same launch faults it in. */
    fs_res_set_plan_roles(&e.res, NULL, 0);
    launch(&e, &v[0], &sz, 1, 1000, add_one, &k);
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    assert_int_equal(where(&e, v[0]), FS_LOC_DEVICE);
    check(&e, v[0], sz, 0, 2);
    env_close(&e);
}

/* FS_PLAN_START_ON_HOST: the allocation with that id starts on host when it is made, although
 * the budget has room, and nothing is evicted for it; the others (kept, or offloaded without the
 * flag) take the device. A launch that references it reads it in place (staged role, no stage
 * yet), and the data is exact. */
static void test_plan_places_offloaded_on_host_when_made(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    static const uint8_t roles[3] = {FS_PLAN_KEPT, FS_PLAN_STAGED | FS_PLAN_START_ON_HOST,
                                     FS_PLAN_STAGED};
    fs_res_set_plan_roles(&e.res, kept(roles, 3), 3);
    fs_dptr v[4];
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    alloc_filled(&e, v, 4, sz); /* the fourth is past the plan: no role */
    assert_int_equal(where(&e, v[0]), FS_LOC_DEVICE);
    assert_int_equal(where(&e, v[1]), FS_LOC_HOST);
    assert_int_equal(where(&e, v[2]), FS_LOC_DEVICE);
    assert_int_equal(where(&e, v[3]), FS_LOC_DEVICE);
    struct fs_res_stats before, after;
    fs_res_get_stats(&e.res, &before);
    assert_int_equal(before.evictions, 0);
    assert_int_equal(before.placed_on_host, 1);
    assert_int_equal(before.device_bytes_held, 3 * sz);
    launch(&e, &v[1], &sz, 1, 1000, add_one, &k);
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    fs_res_get_stats(&e.res, &after);
    assert_int_equal(where(&e, v[1]), FS_LOC_HOST);
    assert_int_equal(after.faults, 0);
    assert_int_equal(after.host_served, before.host_served + 1);
    for (int i = 0; i < 4; i++)
        check(&e, v[i], sz, (uint32_t)i, i == 1);
    /* No host memory to pin: it takes the device instead, where the budget still has room. */
    static const uint8_t more[6] = {[5] = FS_PLAN_STAGED | FS_PLAN_START_ON_HOST};
    fs_res_set_plan_roles(&e.res, kept(more, 6), 6);
    fs_dptr spare, last;
    assert_int_equal(fs_res_alloc(&e.res, 2 * MIB, &spare), FS_OK); /* id 4: no flag */
    assert_int_equal(where(&e, spare), FS_LOC_DEVICE);
    fs_sim_fail_nth(e.dev, FS_SIM_OP_PHYS_CREATE, 1, FS_ERR_NOMEM);
    assert_int_equal(fs_res_alloc(&e.res, sz, &last), FS_OK); /* id 5 */
    assert_int_equal(where(&e, last), FS_LOC_DEVICE);
    fs_res_get_stats(&e.res, &after);
    assert_int_equal(after.placed_on_host, 1);
    fs_res_set_plan_roles(&e.res, NULL, 0);
    env_close(&e);
}

/* Evict A (it must succeed); the full synchronizes that took. */
static uint64_t evict_syncs(struct env *e, const struct fs_alloc *a)
{
    struct fs_res_stats s0, s1;
    fs_res_get_stats(&e->res, &s0);
    assert_int_equal(fs_res_evict_id(&e->res, a->id), FS_OK);
    fs_res_get_stats(&e->res, &s1);
    return s1.quiesce_syncs - s0.quiesce_syncs;
}

static void alloc_with_roles(struct env *e, fs_dptr *v, int n, uint64_t size,
                             const uint8_t *roles)
{
    alloc_filled(e, v, n, size);
    fs_res_set_plan_roles(&e->res, kept(roles, n), n);
}

static struct fs_alloc *alloc_staged_role(struct env *e, fs_dptr *v, uint64_t size)
{
    static const uint8_t roles[1] = {FS_PLAN_STAGED};
    alloc_with_roles(e, v, 1, size, roles);
    struct fs_alloc *a = fs_res_lookup(&e->res, *v);
    assert_int_equal(fs_res_evict_id(&e->res, a->id), FS_OK);
    return a;
}

static uint64_t remaps_of(const struct fs_res_stats *s)
{
    return s->remaps[0][0] + s->remaps[0][1] + s->remaps[1][0] + s->remaps[1][1];
}

/* Begin and end one stage move of allocation ID (EVICT: its end). */
static void stage_move(struct env *e, uint64_t id, bool evict, struct fs_res_move *m)
{
    assert_int_equal(fs_res_move_begin(&e->res, id, evict, m), FS_OK);
    assert_true(m->staged);
    assert_int_equal(fs_res_move_end(&e->res, m, true), FS_OK);
}

/* OFFLOAD_MODE=redirect: a staged allocation's VA stays mapped to host memory; a prefetch makes a
 * device copy and launches that reference it run on the copy (their parameters redirected while
 * they are queued, put back after), waiting for its copy on their stream; the end of the stage
 * writes a changed copy back, skips an unchanged one, and nothing is remapped. A copy or memset
 * (which cannot be redirected) first ends the stage, so it touches the current data. */
static void test_stage_redirects_launches_and_writes_back(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    struct fs_res_stats s0, s1, s2;
    struct fs_sim_stats st0, st1;
    fs_res_get_stats(&e.res, &s0);
    struct fs_res_move m = {0};
    move_init(&e, &m);

    /* Stage in; a launch queued before the copy landed runs on the copy, after it. */
    assert_int_equal(fs_res_move_begin(&e.res, A->id, false, &m), FS_OK);
    assert_true(m.staged);
    assert_true(A->stage_va != 0 && A->arriving);
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    assert_int_equal(fs_res_move_end(&e.res, &m, true), FS_OK);
    assert_int_equal(A->state, FS_RES_STAGED);
    launch(&e, &v, &sz, 1, 1000, add_one, &k); /* the fast path redirects too */
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    assert_int_equal(where(&e, v), FS_LOC_HOST);
    check(&e, v, sz, 0, 0);           /* the host copy did not change */
    check(&e, A->stage_va, sz, 0, 2); /* both kernels ran on the device copy */
    /* Stage out: the changed copy is written back. */
    stage_move(&e, A->id, true, &m);
    assert_int_equal(A->state, FS_RES_HOST);
    assert_int_equal(A->stage_va, 0);
    check(&e, v, sz, 0, 2);
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.stage_ins, s0.stage_ins + 1);
    assert_int_equal(s1.stage_outs, s0.stage_outs + 1);
    assert_int_equal(s1.redirected, s0.redirected + 2);
    assert_int_equal(s1.clean_evictions, s0.clean_evictions);

    /* An unchanged copy goes back without a copy over the link. */
    fs_sim_get_stats(e.dev, &st0);
    stage_move(&e, A->id, false, &m);
    stage_move(&e, A->id, true, &m);
    fs_sim_get_stats(e.dev, &st1);
    fs_res_get_stats(&e.res, &s2);
    assert_int_equal(s2.clean_evictions, s1.clean_evictions + 1);
    assert_int_equal(st1.bytes_d2h, st0.bytes_d2h);

    /* A copy referencing the staged allocation ends the stage first (writing back the kernel's
     * change), and is not redirected. */
    stage_move(&e, A->id, false, &m);
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    uint64_t addr = v + 64;
    struct fs_launch_desc copy = {.stream = e.stream, .ptrs = &addr, .nptrs = 1};
    struct fs_launch_ticket t;
    fs_launch_enter(&e.res, &copy, &t);
    assert_int_equal(A->state, FS_RES_HOST);
    assert_int_equal(A->stage_va, 0);
    fs_launch_exit(&e.res, &t, true);
    check(&e, v, sz, 0, 3);
    fs_res_get_stats(&e.res, &s2);
    assert_int_equal(s2.unstage_syncs, s1.unstage_syncs + 1);
    assert_int_equal(remaps_of(&s2), remaps_of(&s0)); /* no remap since the first eviction */
    move_fini(&e, &m);
    env_close(&e);
}

/* A prefetch's fingerprint runs beside the link: the next copy does not wait for it (with
 * fingerprints as slow as the copies, two stage-ins end at 3 copy times, not 4). A launch
 * redirected to the new copy still runs after the fingerprint, so its write is written back at
 * the stage's end (the fingerprint describes the host's data, not the kernel's result). */
static void test_prefetch_fingerprint_beside_the_link(void **state)
{
    (void)state;
    struct env e;
    env_open_sim(&e, 64 * MIB, false, true, 55e9);
    uint64_t sz = 16 * MIB, sizes[2] = {sz, sz};
    fs_dptr v[2];
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    static const uint8_t roles[2] = {FS_PLAN_STAGED, FS_PLAN_STAGED};
    alloc_with_roles(&e, v, 2, sz, roles);
    struct fs_alloc *A[2];
    struct fs_res_move m[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        A[i] = fs_res_lookup(&e.res, v[i]);
        assert_int_equal(fs_res_evict_id(&e.res, A[i]->id), FS_OK);
        A[i]->fp_valid = false; /* as after a launch served from host: the stage-in takes one */
        move_init(&e, &m[i]);
    }
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    uint64_t t0 = fs_sim_now_ns(e.dev);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fs_res_move_begin(&e.res, A[i]->id, false, &m[i]), FS_OK);
        assert_true(m[i].fp_side);
    }
    launch(&e, &v[0], &sizes[0], 1, 1000, add_one, &k);
    for (int i = 0; i < 2; i++)
        assert_int_equal(fs_res_move_end(&e.res, &m[i], true), FS_OK);
    double copy_ns = (double)sz / 55e9 * 1e9;
    double took = (double)(fs_sim_now_ns(e.dev) - t0);
    if (took > 3.2 * copy_ns)
        fail_msg("two stage-ins took %.0f ns, %.2f copy times", took, took / copy_ns);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(A[i]->state, FS_RES_STAGED);
        stage_move(&e, A[i]->id, true, &m[i]);
        move_fini(&e, &m[i]);
    }
    check(&e, v[0], sz, 0, 1); /* written back */
    check(&e, v[1], sz, 1, 0);
    env_close(&e);
}

/* A stage-in of a host copy whose fingerprint is known takes none (an HBM read of every staged
 * byte saved): the stage's end compares with the host copy's; a changed stage is written back,
 * an unchanged one is not. */
static void test_stage_in_reuses_the_host_fingerprint(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    assert_true(A->fp_valid); /* the eviction fingerprinted what it wrote back */
    struct fs_res_move m = {0};
    move_init(&e, &m);
    stage_move(&e, A->id, false, &m);
    assert_false(m.fp_queued);
    assert_true(A->fp_valid);
    launch(&e, &v, &sz, 1, 1000, add_one, &k); /* redirected to the stage */
    struct fs_res_stats s0, s1;
    fs_res_get_stats(&e.res, &s0);
    stage_move(&e, A->id, true, &m);
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.clean_evictions, s0.clean_evictions); /* changed: written back */
    check(&e, v, sz, 0, 1);
    stage_move(&e, A->id, false, &m);
    assert_false(m.fp_queued);
    stage_move(&e, A->id, true, &m);
    fs_res_get_stats(&e.res, &s0);
    assert_int_equal(s0.clean_evictions, s1.clean_evictions + 1); /* unchanged: not */
    check(&e, v, sz, 0, 1);
    move_fini(&e, &m);
    env_close(&e);
}

/* A launch served from host memory may write the host copy, so its known fingerprint is
 * forgotten: the next stage-in takes one. Else a stage turned back into the old bytes (here
 * add_one on host, then sub_one on the stage) would compare equal to the old fingerprint and the
 * host copy keep the write the stage undid. */
static void test_host_served_launch_forgets_the_fingerprint(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    assert_true(A->fp_valid);
    launch(&e, &v, &sz, 1, 1000, add_one, &k); /* on host: not staged yet */
    assert_false(A->fp_valid);
    struct fs_res_move m = {0};
    move_init(&e, &m);
    stage_move(&e, A->id, false, &m);
    assert_true(m.fp_queued);
    launch(&e, &v, &sz, 1, 1000, sub_one, &k); /* on the stage */
    stage_move(&e, A->id, true, &m);
    check(&e, v, sz, 0, 0);
    move_fini(&e, &m);
    env_close(&e);
}

/* Tracked mode under a plan: a launch that references only allocations the plan keeps resident
 * records no last-use event (a driver call per launch); one that references an allocation that
 * may move does, for all its references. A kept allocation used without an event since the last
 * full synchronize is not covered, even by a later launch's event (the use without one may be on
 * another stream): evicted on demand, it synchronizes first, and its data is intact. */
static void test_kept_allocations_record_no_events(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    uint64_t sz = 16 * MIB, sizes[2] = {sz, sz};
    fs_dptr v[2];
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    static const uint8_t roles[2] = {FS_PLAN_KEPT, FS_PLAN_MOVED};
    alloc_with_roles(&e, v, 2, sz, roles);
    fs_res_expect_moves(&e.res);
    struct fs_alloc *A = fs_res_lookup(&e.res, v[0]), *B = fs_res_lookup(&e.res, v[1]);
    assert_true(A->kept && !B->kept);
    launch(&e, &v[0], &sizes[0], 1, 1000, add_one, &k);
    assert_null(A->last_use);
    launch(&e, &v[1], &sizes[1], 1, 1000, add_one, &k);
    assert_non_null(B->last_use);
    launch(&e, v, sizes, 2, 1000, add_one, &k); /* B may move: an event for both */
    assert_non_null(A->last_use);
    assert_true(A->event_tick >= A->last_tick);
    assert_int_equal(evict_syncs(&e, A), 1);
    check(&e, v[0], sz, 0, 2);
    check(&e, v[1], sz, 1, 1); /* add_one changes only its first range */
    env_close(&e);
}

/* The hazard behind skip_epoch: a long kernel on a second stream writes a kept allocation (no
 * event), then a launch on the first stream references it with one that may move (an event, on
 * the first stream). Evicting the kept allocation must wait for the second stream's kernel: a
 * full synchronize, no unmap under the kernel, and the kernel's write in the host copy. */
static void test_kept_use_on_another_stream_is_waited_for(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    uint64_t sz = 16 * MIB;
    fs_dptr v[3];
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    static const uint8_t roles[3] = {FS_PLAN_KEPT, FS_PLAN_MOVED, FS_PLAN_MOVED};
    alloc_with_roles(&e, v, 3, sz, roles);
    fs_res_expect_moves(&e.res);
    struct fs_alloc *A = fs_res_lookup(&e.res, v[0]), *B = fs_res_lookup(&e.res, v[1]);
    /* A full synchronize first, so that events are trusted from then on. */
    assert_int_equal(fs_res_evict_id(&e.res, fs_res_lookup(&e.res, v[2])->id), FS_OK);
    fs_stream s2;
    assert_int_equal(fs_sim_stream_create(e.dev, &s2), FS_OK);
    uint64_t params[4] = {v[0] + 64, 0, 0, 0};
    void *argv[4] = {&params[0], &params[1], &params[2], &params[3]};
    struct fs_launch_desc d = {.func = KERNEL, .stream = s2, .kernel_params = argv};
    struct fs_launch_ticket t;
    fs_launch_enter(&e.res, &d, &t);
    assert_int_equal(fs_sim_launch(e.dev, s2, 1000000000ull, &v[0], &sz, 1, add_one, &k), FS_OK);
    fs_launch_exit(&e.res, &t, true);
    assert_null(A->last_use);
    struct fs_alloc *ab[2] = {A, B};
    uint64_t tick = fs_res_launch_begin(&e.res, ab, 2, e.stream, false, false, NULL);
    fs_res_launch_done(&e.res, tick, e.stream, ab, 2, true, false);
    assert_non_null(A->last_use);
    assert_int_equal(evict_syncs(&e, A), 1);
    check(&e, v[0], sz, 0, 1);
    assert_int_equal(fs_dev_call(e.dev, stream_destroy, s2), FS_OK);
    env_close(&e); /* no illegal access, no unsafe unmap */
}

/* The synchronous stage (strict mode, or the mover's fallback): fs_res_prefetch_id of a staged
 * allocation makes its device copy without remapping, a launch runs on the copy, and
 * fs_res_evict_id ends the stage with the write-back of the change. */
static void test_stage_synchronous_moves(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, true);
    fs_dptr v;
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    struct fs_res_stats s0, s1;
    fs_res_get_stats(&e.res, &s0);
    assert_int_equal(fs_res_prefetch_id(&e.res, A->id), FS_OK);
    assert_int_equal(A->state, FS_RES_STAGED);
    assert_int_equal(where(&e, v), FS_LOC_HOST);
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    check(&e, v, sz, 0, 0);
    check(&e, A->stage_va, sz, 0, 1);
    assert_int_equal(fs_res_evict_id(&e.res, A->id), FS_OK);
    assert_int_equal(A->state, FS_RES_HOST);
    check(&e, v, sz, 0, 1);
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.stage_ins, s0.stage_ins + 1);
    assert_int_equal(s1.stage_outs, s0.stage_outs + 1);
    assert_int_equal(s1.redirected, s0.redirected + 1);
    assert_int_equal(remaps_of(&s1), remaps_of(&s0));
    env_close(&e);
}

/* A launch whose parameters cannot be read may touch any allocation through its VA: every stage
 * ends before it is queued, writing the device copy's change back. */
static void test_unknown_launch_ends_stages(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    uint64_t sz = 16 * MIB;
    struct kctx k = {.words = (uint32_t)(sz / 4)};
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    assert_int_equal(fs_res_prefetch_id(&e.res, A->id), FS_OK);
    launch(&e, &v, &sz, 1, 1000, add_one, &k); /* on the device copy */
    struct fs_launch_desc d = {.func = KERNEL, .stream = e.stream, .unreadable = true};
    struct fs_launch_ticket t;
    fs_launch_enter(&e.res, &d, &t);
    assert_int_equal(A->state, FS_RES_HOST);
    assert_int_equal(e.res.staged_live, 0);
    check(&e, v, sz, 0, 1); /* written back before the unknown launch */
    fs_launch_exit(&e.res, &t, true);
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_int_equal(s.unstage_syncs, 1);
    env_close(&e);
}

/* A pointer one past the end of an allocation (a loop bound) is taken as pointing into it, so a
 * redirected launch gets both bounds in the same device copy; the exit puts both back. */
static void test_end_pointer_goes_with_its_allocation(void **state)
{
    (void)state;
    struct env e;
    env_open(&e, 64 * MIB, false);
    fs_dptr v;
    const uint64_t sz = 16 * MIB; /* a whole number of granules: nothing of it lies past the end */
    struct fs_alloc *A = alloc_staged_role(&e, &v, sz);
    assert_int_equal(fs_res_prefetch_id(&e.res, A->id), FS_OK);
    assert_int_equal(A->state, FS_RES_STAGED);
    uint64_t params[4] = {v, v + sz, 0, 0}; /* the test kernel has four parameters */
    void *argv[4] = {&params[0], &params[1], &params[2], &params[3]};
    struct fs_launch_desc d = {.func = KERNEL, .stream = e.stream, .kernel_params = argv};
    struct fs_launch_ticket t;
    fs_launch_enter(&e.res, &d, &t);
    assert_int_equal(t.n, 1);
    assert_int_equal(t.nwords, 2);
    assert_int_equal(params[0], A->stage_va);
    assert_int_equal(params[1], A->stage_va + sz);
    fs_launch_exit(&e.res, &t, true);
    assert_int_equal(params[0], v);
    assert_int_equal(params[1], v + sz);
    env_close(&e);
}

/* Write-back is skipped only for data proven unchanged: evicting data that nothing touched since
 * the fault-in copies nothing back; a kernel's change, a host write through the VA or a single
 * changed word anywhere makes the next eviction copy, and the data read afterwards is the new one.
 * With fingerprints off every eviction copies. */
static void clean_eviction_case(bool fingerprint)
{
    struct env e;
    env_open_fp(&e, 64 * MIB, false, fingerprint);
    fs_dptr v;
    const uint64_t size = 16 * MIB;
    assert_int_equal(fs_res_alloc(&e.res, size, &v), FS_OK);
    fill(&e, v, size, 5);
    uint64_t id = fs_res_lookup(&e.res, v)->id;
    struct fs_res_stats s0, s1;
    struct fs_sim_stats st0, st1;

    /* First eviction: no fingerprint yet, so the data is copied (and fingerprinted). */
    assert_int_equal(fs_res_evict_id(&e.res, id), FS_OK);
    assert_int_equal(fs_res_prefetch_id(&e.res, id), FS_OK);
    fs_res_get_stats(&e.res, &s0);
    fs_sim_get_stats(e.dev, &st0);
    /* Unchanged since the prefetch: nothing goes back over the link. */
    assert_int_equal(fs_res_evict_id(&e.res, id), FS_OK);
    fs_res_get_stats(&e.res, &s1);
    fs_sim_get_stats(e.dev, &st1);
    assert_int_equal(s1.clean_evictions - s0.clean_evictions, fingerprint ? 1 : 0);
    assert_int_equal(st1.bytes_d2h - st0.bytes_d2h, fingerprint ? 0 : size);
    check(&e, v, size, 5, 0);

    /* A kernel changes it on the device: the eviction must copy. */
    assert_int_equal(fs_res_prefetch_id(&e.res, id), FS_OK);
    struct kctx k = {.words = (uint32_t)(size / 4)};
    uint64_t sz = size;
    launch(&e, &v, &sz, 1, 1000, add_one, &k);
    assert_int_equal(fs_dev_call(e.dev, ctx_sync), FS_OK);
    fs_sim_get_stats(e.dev, &st0);
    assert_int_equal(fs_res_evict_id(&e.res, id), FS_OK);
    fs_sim_get_stats(e.dev, &st1);
    assert_int_equal(st1.bytes_d2h - st0.bytes_d2h, size);
    check(&e, v, size, 5, 1);

    /* One word changed, in the middle and at the very end: copied, new value kept. */
    for (int round = 0; round < 2; round++) {
        assert_int_equal(fs_res_prefetch_id(&e.res, id), FS_OK);
        uint64_t off = round == 0 ? size / 2 : size - 8;
        uint64_t word;
        assert_int_equal(fs_sim_read(e.dev, &word, v + off, 8), FS_OK);
        word ^= 1ull << (round * 63);
        assert_int_equal(fs_sim_write(e.dev, v + off, &word, 8), FS_OK);
        fs_sim_get_stats(e.dev, &st0);
        assert_int_equal(fs_res_evict_id(&e.res, id), FS_OK);
        fs_sim_get_stats(e.dev, &st1);
        assert_int_equal(st1.bytes_d2h - st0.bytes_d2h, size);
        uint64_t back;
        assert_int_equal(fs_sim_read(e.dev, &back, v + off, 8), FS_OK);
        assert_int_equal(back, word);
    }

    /* Written while on host (a host-served use): the fault-in fingerprints the new host copy, so
     * the unchanged data that follows is clean again and what is read back is the new data. */
    fill(&e, v, size, 6);
    assert_int_equal(fs_res_prefetch_id(&e.res, id), FS_OK);
    fs_res_get_stats(&e.res, &s0);
    assert_int_equal(fs_res_evict_id(&e.res, id), FS_OK);
    fs_res_get_stats(&e.res, &s1);
    assert_int_equal(s1.clean_evictions - s0.clean_evictions, fingerprint ? 1 : 0);
    check(&e, v, size, 6, 0);
    assert_int_equal(s1.fingerprints > 0, fingerprint);
    assert_int_equal(fs_res_free(&e.res, v), FS_OK);
    env_close(&e);
}

static void test_clean_eviction_skips_write_back(void **state)
{
    (void)state;
    clean_eviction_case(true);
}

static void test_write_back_always_without_fingerprints(void **state)
{
    (void)state;
    clean_eviction_case(false);
}

/* Each kernel adds 1 to the first word of each allocation it references, and checks that the
 * allocation's second word (its identity) is intact. */
struct count_ctx {
    uint32_t expect_id[4];
    int bad;
};

static void count_kernel(void *ctx, void *const *ptrs, int nptrs)
{
    struct count_ctx *c = ctx;
    for (int i = 0; i < nptrs; i++) {
        uint32_t *w = ptrs[i];
        w[0] += 1;
        if (w[1] != c->expect_id[i])
            c->bad++;
    }
}

/* A long random run under heavy eviction, allocations of repeating sizes coming and going (pool
 * reuse), kernels over 1-3 allocations, in both remap modes: no count is lost, nothing is read
 * from the wrong allocation, and the budget holds throughout. */
static void stress_case(bool strict)
{
    struct env e;
    env_open(&e, 48 * MIB, strict);
    enum { N = 24, LAUNCHES = 600 };
    fs_dptr v[N];
    uint64_t sz[N];
    uint32_t expect[N];
    static struct count_ctx ctx[LAUNCHES];
    uint64_t rng = 12345;
    for (int i = 0; i < N; i++) {
        sz[i] = (2 + (uint64_t)(i % 4) * 2) * MIB;
        assert_int_equal(fs_res_alloc(&e.res, sz[i], &v[i]), FS_OK);
        uint32_t init[2] = {0, (uint32_t)i + 1000};
        assert_int_equal(fs_sim_write(e.dev, v[i], init, sizeof(init)), FS_OK);
        expect[i] = 0;
    }
    for (int l = 0; l < LAUNCHES; l++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        int n = 1 + (int)((rng >> 33) % 3);
        fs_dptr ptrs[3];
        uint64_t sizes[3];
        int idx[3];
        for (int k = 0; k < n; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int i = (int)((rng >> 33) % N);
            for (int j = 0; j < k; j++)
                if (idx[j] == i)
                    i = (i + 1) % N;
            idx[k] = i;
            ptrs[k] = v[i];
            sizes[k] = 8;
            ctx[l].expect_id[k] = (uint32_t)i + 1000;
        }
        bool dup = n > 1 && (idx[0] == idx[1] || (n > 2 && (idx[2] == idx[0] || idx[2] == idx[1])));
        if (dup)
            n = 1;
        for (int k = 0; k < n; k++)
            expect[idx[k]]++;
        launch(&e, ptrs, sizes, n, 1000 + (rng >> 50), count_kernel, &ctx[l]);
        assert_true(fs_res_device_bytes(&e.res) <= 48 * MIB);
        if (l % 97 == 96) { /* an allocation is freed and one of the same size comes back */
            int i = (int)((rng >> 20) % N);
            assert_int_equal(fs_res_free(&e.res, v[i]), FS_OK);
            assert_int_equal(fs_res_alloc(&e.res, sz[i], &v[i]), FS_OK);
            uint32_t init[2] = {0, (uint32_t)i + 1000};
            assert_int_equal(fs_sim_write(e.dev, v[i], init, sizeof(init)), FS_OK);
            expect[i] = 0;
        }
    }
    assert_int_equal(e.dev->ops->ctx_sync(e.dev), FS_OK);
    for (int l = 0; l < LAUNCHES; l++)
        assert_int_equal(ctx[l].bad, 0);
    for (int i = 0; i < N; i++) {
        uint32_t got[2];
        assert_int_equal(fs_sim_read(e.dev, got, v[i], sizeof(got)), FS_OK);
        assert_int_equal(got[1], (uint32_t)i + 1000);
        assert_int_equal(got[0], expect[i]);
    }
    struct fs_res_stats s;
    fs_res_get_stats(&e.res, &s);
    assert_true(s.evictions > 100);
    assert_int_equal(s.failures, 0);
    env_close(&e);
}

static void test_stress_strict(void **state)
{
    (void)state;
    stress_case(true);
}

static void test_stress_tracked(void **state)
{
    (void)state;
    stress_case(false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_within_budget_stays_on_device),
        cmocka_unit_test(test_frozen_allocations_get_plain_memory),
        cmocka_unit_test(test_pool_counts_blocks_made_and_given_back),
        cmocka_unit_test(test_eviction_preserves_data),
        cmocka_unit_test(test_launch_faults_in_and_kernel_sees_data),
        cmocka_unit_test(test_allocation_larger_than_budget_lives_on_host),
        cmocka_unit_test(test_quiet_rule_strict),
        cmocka_unit_test(test_quiet_rule_tracked),
        cmocka_unit_test(test_strict_protects_pointers_kept_in_memory),
        cmocka_unit_test(test_tracked_misses_pointers_kept_in_memory),
        cmocka_unit_test(test_layout_cache_and_unknown_launches),
        cmocka_unit_test(test_capture_never_remaps),
        cmocka_unit_test(test_failure_injection),
        cmocka_unit_test(test_threads_under_pressure),
        cmocka_unit_test(test_free_returns_memory_and_rejects_interior),
        cmocka_unit_test(test_evict_and_make_resident),
        cmocka_unit_test(test_prepin_fills_the_host_pool_ahead),
        cmocka_unit_test(test_launch_waits_for_moves_begun_while_it_waited),
        cmocka_unit_test(test_eviction_gives_room_before_mapping_host),
        cmocka_unit_test(test_eviction_only_if_quiet),
        cmocka_unit_test(test_prefetch_maps_early_and_launch_waits_on_its_stream),
        cmocka_unit_test(test_ordered_wait_measured_on_the_device),
        cmocka_unit_test(test_eviction_host_map_failure_keeps_data),
        cmocka_unit_test(test_plan_kept_allocations_are_evicted_last),
        cmocka_unit_test(test_plan_host_role_is_read_in_place),
        cmocka_unit_test(test_plan_places_offloaded_on_host_when_made),
        cmocka_unit_test(test_stage_redirects_launches_and_writes_back),
        cmocka_unit_test(test_stage_synchronous_moves),
        cmocka_unit_test(test_prefetch_fingerprint_beside_the_link),
        cmocka_unit_test(test_stage_in_reuses_the_host_fingerprint),
        cmocka_unit_test(test_host_served_launch_forgets_the_fingerprint),
        cmocka_unit_test(test_kept_allocations_record_no_events),
        cmocka_unit_test(test_kept_use_on_another_stream_is_waited_for),
        cmocka_unit_test(test_end_pointer_goes_with_its_allocation),
        cmocka_unit_test(test_unknown_launch_ends_stages),
        cmocka_unit_test(test_clean_eviction_skips_write_back),
        cmocka_unit_test(test_write_back_always_without_fingerprints),
        cmocka_unit_test(test_copy_wait_prediction),
        cmocka_unit_test(test_stress_strict),
        cmocka_unit_test(test_stress_tracked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

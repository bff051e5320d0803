/* Replaying a profile on the simulated device (core/replay.h): the sample profile at a budget
 * that keeps everything resident takes its compute time, or the program's host time when that is
 * longer; under a budget that offloads, the plan
 * moves allocations on the mover thread, every iteration, without failures, and takes longer;
 * bad budgets are refused with a reason. */
#include <string.h>

#include "profile.h"
#include "replay.h"
#include "test_util.h"

#define MIB (1024ull * 1024ull)
#define SAMPLE "tests/data/small.json"

static void load_sample(struct fs_profile *p)
{
    char err[512] = "";
    assert_int_equal(fs_profile_load(SAMPLE, p, err, sizeof(err)), FS_OK);
}

static double compute_us(const struct fs_profile *p)
{
    double c = 0;
    for (int i = 0; i < p->nlaunches; i++)
        c += p->launches[i].duration_us;
    return c;
}

static void test_everything_resident_takes_the_compute_time(void **state)
{
    (void)state;
    struct fs_profile p;
    load_sample(&p);
    struct fs_replay_config cfg = {.budget = 1024 * MIB, .strategy = NULL, .iterations = 6};
    struct fs_replay_result r;
    char err[512] = "";
    assert_int_equal(fs_replay(&p, &cfg, &r, err, sizeof(err)), FS_OK);
    double c = compute_us(&p);
    /* One stream, back to back; the synchronize at each end adds nothing on the device. */
    assert_true(r.step_us >= c - 1 && r.step_us < c * 1.01);
    /* The plan leaves the allocations no launch uses off its resident set, but all of them fit
     * the budget together: the plan moves nothing, and those stay where they are. */
    uint64_t unused = 0, all = 0;
    for (int a = 0; a < p.nallocs; a++) {
        unused += p.allocs[a].first_use < 0;
        all += p.allocs[a].mapped;
    }
    assert_true(unused > 0 && all <= cfg.budget);
    assert_int_equal(r.res.evictions, 0);
    assert_int_equal(r.res.faults, 0);
    /* Nothing to wait for: no late launch, no time in the launch hook on the simulated clock. */
    assert_int_equal(r.timed, 4);
    assert_int_equal(r.timed_late, 0);
    assert_int_equal(r.timed_blocks, 0); /* nothing moves: no device block is made */
    assert_int_equal(r.exec.late_wait_ns, 0);
    assert_true(r.timed_hook_us < 1.0);
    assert_int_equal(r.exec.plans, 1);
    assert_true(r.exec.synced > 0);
    fs_profile_free(&p);
}

/* The program's own host time between launches (2 ms before each of 7 launches) bounds the
 * iteration when it exceeds the compute. */
static void test_program_host_time_counts(void **state)
{
    (void)state;
    struct fs_profile p;
    load_sample(&p);
    for (int i = 0; i < p.nlaunches; i++)
        p.launches[i].host_us = 2000;
    struct fs_replay_config cfg = {.budget = 1024 * MIB, .strategy = NULL, .iterations = 6};
    struct fs_replay_result r;
    char err[512] = "";
    assert_int_equal(fs_replay(&p, &cfg, &r, err, sizeof(err)), FS_OK);
    double host = 2000.0 * p.nlaunches;
    assert_true(host > compute_us(&p));
    assert_true(r.step_us >= host && r.step_us < host + p.launches[p.nlaunches - 1].duration_us + 1);
    fs_profile_free(&p);
}

static void test_offloading_moves_every_iteration(void **state)
{
    (void)state;
    struct fs_profile p;
    load_sample(&p);
    enum { ITERS = 8 };
    struct fs_replay_config cfg = {.budget = 128 * MIB, .strategy = "knapsack",
                                   .iterations = ITERS};
    struct fs_replay_result r;
    char err[512] = "";
    assert_int_equal(fs_replay(&p, &cfg, &r, err, sizeof(err)), FS_OK);
    /* Slower than compute alone: 210 MiB of allocations under 128 MiB must move over a 25 GB/s
     * link and be remapped. */
    assert_true(r.step_us > compute_us(&p) * 1.5);
    assert_true(r.first_us > 0);
    assert_true(r.res.prefetches >= ITERS - 2);
    assert_true(r.res.evictions >= ITERS - 2);
    assert_int_equal(r.res.failures, 0);
    assert_int_equal(r.exec.move_failures, 0);
    assert_int_equal(r.exec.departures, 0);
    assert_true(r.res.device_bytes_peak <= 128 * MIB);
    /* The link is the bottleneck: launches wait for late prefetches, for at least half the time
     * over the compute (on the simulated clock, timed iterations; the executor's own count is
     * wall time). The thread may also wait while the device still computes: it can be more. */
    assert_int_equal(r.timed, ITERS - 2);
    assert_true(r.timed_late > 0);
    /* Allocations of seven sizes share the room: the pool gives blocks back and makes others. */
    assert_true(r.timed_blocks > 0 && r.timed_blocks < r.res.device_blocks.made);
    /* Prefetches wait for room here, and evictions queued behind them begin first (4-13 in
     * every run seen, ASan and valgrind included). */
    assert_true(r.exec.passed > 0);
    assert_true(r.exec.late_wait_ns > 0);
    double over = (r.step_us - compute_us(&p)) * r.timed;
    assert_true(r.timed_hook_us > 0.5 * over && r.timed_hook_us <= r.step_us * r.timed);
    fs_profile_free(&p);
}

/* The trace of the last iteration: one compute event per launch, in order on the profile's one
 * stream; copies in of allocations the plan offloads, lasting their bytes over the link; the
 * program's waits within the iteration. Events come one at a time. */
struct tl {
    int n[4];
    int next_launch;
    bool order_ok, copies_ok, waits_ok;
    const struct fs_profile *p;
    double last_end;
};

static void collect(const struct fs_tl_event *ev, void *arg)
{
    struct tl *t = arg;
    t->n[ev->lane]++;
    if (ev->lane == FS_TL_COMPUTE) {
        t->order_ok = t->order_ok && ev->launch == t->next_launch++ && ev->start_us >= t->last_end;
        t->last_end = ev->end_us;
    } else if (ev->lane == FS_TL_H2D) {
        double link_us = (double)ev->bytes / t->p->bw.h2d_bytes_per_us;
        t->copies_ok = t->copies_ok && ev->alloc >= 0 && ev->alloc < t->p->nallocs &&
                       ev->bytes == t->p->allocs[ev->alloc].mapped &&
                       ev->end_us - ev->start_us >= link_us;
    } else if (ev->lane == FS_TL_WAIT) {
        t->waits_ok = t->waits_ok && ev->end_us > ev->start_us && ev->launch >= 0 &&
                      ev->launch < t->p->nlaunches;
    }
}

static void test_trace_draws_the_last_iteration(void **state)
{
    (void)state;
    struct fs_profile p;
    load_sample(&p);
    struct tl t = {.order_ok = true, .copies_ok = true, .waits_ok = true, .p = &p};
    struct fs_replay_config cfg = {.budget = 128 * MIB, .strategy = "knapsack", .iterations = 6,
                                   .trace = collect, .trace_arg = &t};
    struct fs_replay_result r;
    char err[512] = "";
    assert_int_equal(fs_replay(&p, &cfg, &r, err, sizeof(err)), FS_OK);
    assert_int_equal(t.n[FS_TL_COMPUTE], p.nlaunches);
    assert_true(t.order_ok);
    assert_true(t.n[FS_TL_H2D] > 0); /* 210 MiB under 128 MiB: allocations move every iteration */
    assert_true(t.copies_ok);
    assert_true(t.waits_ok);
    fs_profile_free(&p);
}

static void test_bad_requests_are_refused(void **state)
{
    (void)state;
    struct fs_profile p;
    load_sample(&p);
    struct fs_replay_result r;
    char err[512] = "";
    struct fs_replay_config small = {.budget = 32 * MIB, .strategy = NULL, .iterations = 6};
    assert_int_equal(fs_replay(&p, &small, &r, err, sizeof(err)), FS_ERR_CONFIG);
    assert_non_null(strstr(err, "at least 64 MiB"));
    struct fs_replay_config few = {.budget = 128 * MIB, .strategy = NULL, .iterations = 2};
    assert_int_equal(fs_replay(&p, &few, &r, err, sizeof(err)), FS_ERR_INVALID);
    assert_non_null(strstr(err, "at least 3 iterations"));
    fs_profile_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_everything_resident_takes_the_compute_time),
        cmocka_unit_test(test_program_host_time_counts),
        cmocka_unit_test(test_offloading_moves_every_iteration),
        cmocka_unit_test(test_trace_draws_the_last_iteration),
        cmocka_unit_test(test_bad_requests_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* The engine's entry points (what the hooks call) on the simulated device. */
#include <jansson.h>
#include <pthread.h>

#include "device_sim.h"
#include "engine.h"
#include "profile.h"
#include "recorder.h"
#include "strategies/schedule.h"
#include "strategies/strategy.h"
#include "test_util.h"

#define MIB (1024ull * 1024ull)

static int tracker_paused; /* the PAUSE_TRACKING tests' tracker (below) */

static double sim_link_bytes_per_s; /* the simulated link's rate both ways; 0: the default */

static struct fs_device *open_sim(void)
{
    struct fs_sim_config cfg = {.device_bytes = 2048 * MIB, .host_phys_supported = true,
                                .h2d_bytes_per_s = sim_link_bytes_per_s,
                                .d2h_bytes_per_s = sim_link_bytes_per_s};
    struct fs_device *dev;
    assert_int_equal(fs_sim_open(&cfg, &dev), FS_OK);
    return dev;
}

static int tracker_refuses; /* ... and how it fails */

/* start() also calls fs_engine_start_early, as the library does, and then says in
 * STARTED_EARLY whether the engine started within 2 s, before any allocation. */
static bool start_early, started_early;

static void start(struct fs_device *dev, char **envp)
{
    __atomic_store_n(&tracker_paused, 0, __ATOMIC_RELEASE);
    tracker_refuses = 0;
    fs_engine_teardown();
    fs_engine_use_device(dev);
    assert_int_equal(fs_engine_init(envp), FS_OK);
    if (!start_early)
        return;
    fs_engine_start_early();
    for (int i = 0; i < 200 && !fs_engine_started(); i++)
        usleep(10000);
    started_early = fs_engine_started();
}

static void stop(struct fs_device *dev)
{
    fs_engine_teardown();
    struct fs_sim_stats st;
    fs_sim_get_stats(dev, &st);
    assert_int_equal(st.live_phys, 0);
    dev->ops->close(dev);
}

static void test_small_allocations_pass_through(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_MIN_OFFLOAD_BYTES=8MiB", NULL};
    start(dev, envp);
    uint64_t p;
    assert_int_equal(fs_engine_alloc(4 * MIB, 0, &p), FS_ERR_UNSUPPORTED);
    fs_engine_note_passthrough(4 * MIB);
    assert_int_equal(fs_engine_alloc(8 * MIB, 0, &p), FS_OK);
    int ordinal = -1;
    assert_true(fs_engine_owns(p + 100, &ordinal));
    assert_int_equal(ordinal, 0);
    assert_false(fs_engine_owns(0x1000, &ordinal));
    struct fs_engine_stats s;
    fs_engine_get_stats(&s);
    assert_int_equal(s.managed_allocs, 1);
    assert_int_equal(s.passthrough_allocs, 1);
    assert_int_equal(s.passthrough_bytes, 4 * MIB);
    assert_int_equal(s.pointer_queries, 2); /* both asked, found or not */
    assert_int_equal(fs_engine_free(p), FS_OK);
    assert_int_equal(fs_engine_free(p), FS_ERR_NOT_FOUND); /* the hook passes it to CUDA */
    stop(dev);
}

static void test_mem_info_reports_the_budget(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=256MiB", NULL};
    start(dev, envp);
    uint64_t f, t, p;
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_OK);
    assert_int_equal(t, 256 * MIB);
    assert_int_equal(f, 256 * MIB);
    assert_int_equal(fs_engine_alloc(100 * MIB, 0, &p), FS_OK);
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_OK);
    assert_int_equal(f, 156 * MIB);
    /* Beyond the budget it still succeeds; free never goes below zero. */
    uint64_t q, r;
    assert_int_equal(fs_engine_alloc(200 * MIB, 0, &q), FS_OK);
    assert_int_equal(fs_engine_alloc(300 * MIB, 0, &r), FS_OK);
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_OK);
    /* The 300 MiB one can never fit: it starts on host without evicting the 200 MiB one. */
    assert_int_equal(f, 56 * MIB);
    struct fs_engine_stats es;
    fs_engine_get_stats(&es);
    assert_int_equal(es.res.placed_on_host, 1);
    assert_int_equal(es.res.evictions, 1);
    assert_int_equal(es.meminfo_queries, 3);
    stop(dev);
}

static void test_mem_info_device_view_passes_through(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_MEMINFO_VIEW=device", NULL};
    start(dev, envp);
    uint64_t f, t;
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_ERR_UNSUPPORTED);
    stop(dev);
}

static void test_percentage_budget(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=25%", NULL};
    start(dev, envp);
    uint64_t f, t;
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_OK);
    assert_int_equal(t, 512 * MIB); /* 25% of the 2 GiB simulated device */
    stop(dev);
}

static void test_other_device_passes_through_and_says_so(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", NULL};
    start(dev, envp);
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    uint64_t p;
    assert_int_equal(fs_engine_alloc(64 * MIB, 1, &p), FS_ERR_UNSUPPORTED);
    assert_int_equal(fs_engine_alloc(64 * MIB, 1, &p), FS_ERR_UNSUPPORTED);
    const char *log = fs_test_capture_end(&cap);
    const char *first = strstr(log, "allocations on device 1 pass through unmanaged");
    assert_non_null(first);
    assert_null(strstr(first + 1, "allocations on device 1")); /* once */
    /* Memory queries about device 1 pass through too. */
    uint64_t f, t;
    assert_int_equal(fs_engine_mem_info(1, &f, &t), FS_ERR_UNSUPPORTED);
    assert_int_equal(fs_engine_mem_info(0, &f, &t), FS_OK);
    stop(dev);
}

static void test_disabled_and_misconfigured_engine_manages_nothing(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *off[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_ENABLED=0", NULL};
    start(dev, off);
    uint64_t p;
    assert_false(fs_engine_active());
    assert_int_equal(fs_engine_alloc(64 * MIB, 0, &p), FS_ERR_UNSUPPORTED);
    fs_engine_teardown();
    fs_engine_use_device(dev);
    char *bad[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMT=1GiB", NULL};
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    assert_int_equal(fs_engine_init(bad), FS_ERR_CONFIG);
    const char *log = fs_test_capture_end(&cap);
    assert_non_null(strstr(log, "did you mean FLEXTENSOR_GPU_MEMORY_LIMIT?"));
    assert_non_null(strstr(log, "the program runs unmanaged"));
    assert_false(fs_engine_active());
    assert_int_equal(fs_engine_alloc(64 * MIB, 0, &p), FS_ERR_UNSUPPORTED);
    stop(dev);
}

static int refuse_tracking(void)
{
    return FS_ERR_UNSUPPORTED;
}

static void test_no_launch_tracking_means_unmanaged(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", NULL};
    start(dev, envp);
    static const struct fs_tracker refuse = {refuse_tracking, NULL};
    fs_engine_set_tracker(&refuse);
    uint64_t p;
    assert_int_equal(fs_engine_alloc(64 * MIB, 0, &p), FS_ERR_UNSUPPORTED);
    assert_false(fs_engine_active());
    stop(dev);
}

static void test_allocation_failure_falls_back(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_LOG_LEVEL=error", NULL};
    start(dev, envp);
    uint64_t p;
    assert_int_equal(fs_engine_alloc(64 * MIB, 0, &p), FS_OK); /* started */
    fs_sim_fail_nth(dev, FS_SIM_OP_VA_RESERVE, 0, 0);
    fs_sim_fail_nth(dev, FS_SIM_OP_MAP, 1, FS_ERR_DEVICE);
    fs_sim_fail_nth(dev, FS_SIM_OP_PHYS_CREATE, 2, FS_ERR_DEVICE);
    /* Every internal failure ends in pass-through (the hook then calls CUDA), never an error. */
    uint64_t q;
    int rc = fs_engine_alloc(64 * MIB, 0, &q);
    assert_true(rc == FS_OK || rc == FS_ERR_UNSUPPORTED);
    stop(dev);
}

static const int layer_kernel, head_kernel, start_kernel;

/* Each layer kernel checks that its weight still holds the layer's mark (evictions and prefetches
 * must carry the bytes along, and no remap may happen under a kernel). */
struct mark_check {
    uint64_t expect;
    int *errors;
};

static void check_mark(void *ctx, void *const *ptrs, int nptrs)
{
    const struct mark_check *c = ctx;
    uint64_t got;
    memcpy(&got, ptrs[0], sizeof(got));
    if (nptrs != 1 || got != c->expect)
        (*c->errors)++;
}

/* The head kernel writes the activations (a step counter in their first word), so that they
 * change every iteration while the weights do not. */
static void bump(void *ctx, void *const *ptrs, int nptrs)
{
    (void)ctx;
    uint64_t n;
    memcpy(&n, ptrs[0], sizeof(n));
    n += (uint64_t)nptrs;
    memcpy(ptrs[0], &n, sizeof(n));
}

/* The program's allocations: activations (56 MiB) then NLAYERS weights (2 MiB, or WSIZE2 for
 * the third), each weight marked with its layer number + 1. Small, so that the copies the
 * simulator makes stay cheap under valgrind; the smallest budget is 64 MiB. */
static void alloc_program(struct fs_device *dev, uint64_t *w, int nlayers, uint64_t *act,
                          uint64_t wsize2)
{
    assert_int_equal(fs_engine_alloc(56 * MIB, 0, act), FS_OK);
    for (int l = 0; l < nlayers; l++) {
        assert_int_equal(fs_engine_alloc(l == 2 ? wsize2 : 2 * MIB, 0, &w[l]), FS_OK);
        uint64_t mark = (uint64_t)l + 1;
        assert_int_equal(fs_sim_write(dev, w[l], &mark, sizeof(mark)), FS_OK);
    }
}

/* The program: NLAYERS layers, each a kernel reading its weight and the activations followed by
 * ACT_KERNELS kernels on the activations alone, then a head on the activations, in a loop.
 * Returns the number of layer kernels that found a wrong mark. */
enum { ACT_KERNELS = 4 };
/* MARK_*: how iterations are marked; EXTRA_LAUNCH: no mark, but every 4th iteration makes one
 * launch more, in its middle; CHANGED: another program, whose first activation kernel of each
 * layer is another kernel. */
enum mark_mode { NO_MARK, MARK_CALL, MARK_KERNEL, EXTRA_LAUNCH, CHANGED };

/* The launch tracker of the PAUSE_TRACKING tests: like CUPTI, no reports before it is started or
 * while paused; TRACKER_STARTS counts the calls to start it. TRACKER_REFUSES 1: refuse to pause;
 * 2: refuse to start; 3: pause, yet fail, and refuse to resume (a tracker that fails partway). */
static int tracker_starts;
static int start_tracking(void)
{
    tracker_starts++;
    if (tracker_refuses == 2)
        return FS_ERR_DEVICE;
    __atomic_store_n(&tracker_paused, 0, __ATOMIC_RELEASE);
    return FS_OK;
}
static int pause_tracking(bool paused)
{
    if (tracker_refuses == 1 && paused)
        return FS_ERR_DEVICE;
    if (tracker_refuses == 3 && !paused)
        return FS_ERR_DEVICE;
    __atomic_store_n(&tracker_paused, paused, __ATOMIC_RELEASE);
    return tracker_refuses == 3 ? FS_ERR_DEVICE : FS_OK;
}
static const struct fs_tracker pausing_tracker = {start_tracking, pause_tracking};

/* A launch's reports, as the tracker gives them. */
static void report_enter(const struct fs_launch_desc *d, struct fs_launch_ticket *t)
{
    t->active = false;
    if (!__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE))
        fs_engine_launch_enter(d, t);
}

static void report_exit(struct fs_launch_ticket *t)
{
    if (!__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE))
        fs_engine_launch_exit(t, true);
}

static void launch_start_kernel(struct fs_device *dev, fs_stream s)
{
    struct fs_launch_desc d = {.func = &start_kernel, .stream = s, .kernel_params = NULL};
    struct fs_launch_ticket t;
    report_enter(&d, &t);
    assert_int_equal(fs_sim_launch(dev, s, 1000, NULL, NULL, 0, NULL, NULL), FS_OK);
    report_exit(&t);
}

/* The program's stream is being captured into a graph while it runs (run_marked_program). */
static bool program_captures;

static int run_marked_program(struct fs_device *dev, uint64_t *w, int nlayers, uint64_t act,
                              int iterations, enum mark_mode mark)
{
    fs_stream s;
    int errors = 0;
    struct mark_check checks[16];
    assert_true(nlayers <= 16);
    for (int l = 0; l < nlayers; l++)
        checks[l] = (struct mark_check){(uint64_t)l + 1, &errors};
    assert_int_equal(fs_sim_stream_create(dev, &s), FS_OK);
    fs_sim_set_capturing(dev, s, program_captures);
    for (int it = 0; it < iterations; it++) {
        if (mark == MARK_CALL)
            fs_engine_mark_iteration();
        else if (mark == MARK_KERNEL)
            launch_start_kernel(dev, s);
        for (int k = 0; k <= nlayers * (ACT_KERNELS + 1); k++) {
            int l = k / (ACT_KERNELS + 1);
            bool head = k % (ACT_KERNELS + 1) != 0 || l == nlayers;
            if (mark == EXTRA_LAUNCH && it % 4 == 3 && k == 12)
                launch_start_kernel(dev, s);
            if (mark == CHANGED && k % (ACT_KERNELS + 1) == 1) {
                launch_start_kernel(dev, s);
                continue;
            }
            uint64_t params[2] = {head ? act : w[l], act};
            void *argv[2] = {&params[0], &params[1]};
            struct fs_launch_desc d = {.func = head ? &head_kernel : &layer_kernel,
                                       .stream = s, .kernel_params = argv};
            struct fs_launch_ticket t;
            report_enter(&d, &t);
            fs_dptr ptrs[1] = {params[0]};
            uint64_t sizes[1] = {64};
            assert_int_equal(fs_sim_launch(dev, s, head ? 50000 : 100000 + 10000 * (uint64_t)l,
                                           ptrs, sizes, 1, head ? bump : check_mark,
                                           head ? NULL : &checks[l]),
                             FS_OK);
            report_exit(&t);
        }
    }
    fs_sim_set_capturing(dev, s, false);
    assert_int_equal(dev->ops->ctx_sync(dev), FS_OK);
    fs_engine_drain_moves();
    assert_int_equal(dev->ops->ctx_sync(dev), FS_OK);
    assert_int_equal(dev->ops->stream_destroy(dev, s), FS_OK);
    return errors;
}

static int run_program(struct fs_device *dev, uint64_t *w, int nlayers, uint64_t act,
                       int iterations)
{
    return run_marked_program(dev, w, nlayers, act, iterations, NO_MARK);
}

/* sim_kernel_0, _1 and _2 (the simulator names kernels in registration order). */
static void register_kernels(struct fs_device *dev)
{
    uint32_t off[2] = {0, 8}, sz[2] = {8, 8};
    fs_sim_register_kernel(dev, &layer_kernel, off, sz, 2);
    fs_sim_register_kernel(dev, &head_kernel, off, sz, 2);
    fs_sim_register_kernel(dev, &start_kernel, off, sz, 0);
}

/* A path for a profile that does not exist yet. */
static void fresh_path(char *path, size_t len)
{
    fs_test_write_file(path, len, "");
    unlink(path);
}

enum { L = 6, PER_ITER = L * (ACT_KERNELS + 1) + 1 };
#define MIN_OFFLOAD "FLEXTENSOR_MIN_OFFLOAD_BYTES=1MiB"

static void test_profile_recorded_and_planned(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    register_kernels(dev);
    char path[64], out_env[128];
    fresh_path(path, sizeof(path));
    snprintf(out_env, sizeof(out_env), "FLEXTENSOR_PROFILE_OUT=%s", path);
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", MIN_OFFLOAD,
                    "FLEXTENSOR_PROFILING_ITERS=3", "FLEXTENSOR_STRATEGY=global", out_env, NULL};
    start(dev, envp);
    uint64_t w[L], act;
    alloc_program(dev, w, L, &act, 2 * MIB);
    /* 9300 launches: discovery looks every 1024 and takes the period when two looks agree; then
     * profiling follows it for 4096 launches; then the plan runs. */
    assert_int_equal(run_program(dev, w, L, act, 300), 0);

    struct fs_profile p;
    char err[512] = "";
    assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
    assert_int_equal(p.nlaunches, PER_ITER);
    assert_int_equal(p.nallocs, L + 1);
    assert_string_equal(p.device_name, "flexshim simulated device");
    /* The iteration starts where the program's does (no pauses here: any rotation is one
     * iteration), and each launch kept its kernel and its references. */
    int heads = 0;
    for (int i = 0; i < p.nlaunches; i++) {
        const char *name = p.kernel_names[i];
        assert_non_null(name);
        bool head = strcmp(name, "sim_kernel_1") == 0;
        heads += head;
        assert_int_equal(p.launches[i].nrefs, head ? 1 : 2);
        /* Back-to-back kernels on one stream: the time between two is the kernel's own. */
        if (head)
            assert_true(p.launches[i].duration_us > 49.0 && p.launches[i].duration_us < 51.0);
        else
            assert_true(p.launches[i].duration_us >= 99.0);
    }
    assert_int_equal(heads, PER_ITER - L);
    /* The program's host time between launches was measured (a few microseconds here). */
    double host = 0;
    for (int i = 0; i < p.nlaunches; i++) {
        assert_true(p.launches[i].host_us >= 0 && p.launches[i].host_us < 1e6);
        host += p.launches[i].host_us;
    }
    assert_true(host > 0);
    assert_int_equal(p.allocs[0].mapped, 56 * MIB);
    assert_true(p.allocs[1].first_use >= 0);
    /* Profiling fingerprinted every allocation at its start and end: the weights were left as
     * they were (evicting them needs no write-back), the activations were written. */
    assert_false(p.allocs[0].unchanged);
    for (int a = 1; a <= L; a++)
        assert_true(p.allocs[a].unchanged);
    /* The plan: made by the configured strategy for the budget less the default headroom (at
     * most 1/32 of the limit), and valid. */
    assert_string_equal(p.plan.strategy, "global");
    assert_int_equal(p.plan.budget, 64 * MIB - 64 * MIB / 32);
    assert_true(p.plan.peak_bytes <= 64 * MIB);
    assert_int_equal(fs_plan_evaluate(&p, &p.plan), FS_OK);
    assert_true(p.bw.h2d_bytes_per_us > 0);
    /* The device's copy rate bounds reads in place (the simulator copies at 2e6 bytes/us). */
    assert_true(p.bw.read_bytes_per_us > 0.9 * FS_READ_BOUND_COPIES * 2e6 &&
                p.bw.read_bytes_per_us < 1.1 * FS_READ_BOUND_COPIES * 2e6);
    assert_true(p.bw.handover_us == FS_ROOM_HANDOVER_US);
    /* ... and it ran for the rest of the program. */
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.plans, 1);
    assert_true(st.exec.synced > 500);
    assert_true(st.exec.departures == 0);
    assert_true(st.exec.prefetches > 0);
    assert_int_equal(st.exec.move_failures, 0);
    fs_profile_free(&p);
    unlink(path);
    stop(dev);
}

/* Profiling that begins while the program captures a graph takes no fingerprints: they would
 * synchronize the device under the capture (a real GPU invalidates the program's capture then).
 * The simulator counts any synchronize during a capture. */
static void test_profiling_begins_under_capture(void **state)
{
    (void)state;
    struct fs_device *dev = open_sim();
    register_kernels(dev);
    char path[64], out_env[128], log_path[64], log_env[128], log[16384];
    fresh_path(path, sizeof(path));
    fresh_path(log_path, sizeof(log_path));
    snprintf(out_env, sizeof(out_env), "FLEXTENSOR_PROFILE_OUT=%s", path);
    snprintf(log_env, sizeof(log_env), "FLEXTENSOR_LOG_FILE=%s", log_path);
    char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB", MIN_OFFLOAD,
                    "FLEXTENSOR_PROFILING_ITERS=3", "FLEXTENSOR_LOG_LEVEL=info", log_env,
                    out_env, NULL};
    start(dev, envp);
    uint64_t w[L], act;
    alloc_program(dev, w, L, &act, 2 * MIB);
    /* 100 iterations (3100 launches): discovery ends and profiling begins, under the capture */
    program_captures = true;
    assert_int_equal(run_program(dev, w, L, act, 100), 0);
    program_captures = false;
    struct fs_sim_stats st;
    fs_sim_get_stats(dev, &st);
    stop(dev);
    fs_test_read_file(log_path, log, sizeof(log));
    assert_non_null(strstr(log, "discovery: an iteration of"));
    assert_int_equal(st.capture_violations, 0);
    unlink(path);
    unlink(log_path);
}

/* Iterations the program marks (the C API, or ITERATION_KERNEL naming the kernel each starts
 * with) are taken from the marks: a profile after a few iterations instead of thousands of
 * launches, starting where the program's iteration does. */
static void test_marked_iterations(void **state)
{
    (void)state;
    for (int mode = MARK_CALL; mode <= MARK_KERNEL; mode++) {
        struct fs_device *dev = open_sim();
        register_kernels(dev);
        char path[64], out_env[128];
        fresh_path(path, sizeof(path));
        snprintf(out_env, sizeof(out_env), "FLEXTENSOR_PROFILE_OUT=%s", path);
        char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", MIN_OFFLOAD,
                        "FLEXTENSOR_PROFILING_ITERS=2", out_env,
                        mode == MARK_KERNEL ? "FLEXTENSOR_ITERATION_KERNEL=kernel_2" : NULL,
                        NULL};
        start(dev, envp);
        uint64_t w[L], act;
        alloc_program(dev, w, L, &act, 2 * MIB);
        /* Marks 1-3 close two identical iterations; two more are timed; the 6th mark is in. */
        assert_int_equal(run_marked_program(dev, w, L, act, 6,
                                            (enum mark_mode)mode), 0);
        struct fs_profile p;
        char err[512] = "";
        assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
        int n = PER_ITER + (mode == MARK_KERNEL);
        assert_int_equal(p.nlaunches, n);
        /* The first launch of the recorded iteration is the one after the mark. */
        assert_string_equal(p.kernel_names[0], mode == MARK_KERNEL ? "sim_kernel_2"
                                                                   : "sim_kernel_0");
        assert_string_equal(p.kernel_names[n - 1], "sim_kernel_1");
        fs_profile_free(&p);
        stop(dev);
        unlink(path);
    }
}

static void copy_file(const char *from, const char *to)
{
    char buf[1 << 16];
    FILE *in = fopen(from, "r"), *out = fopen(to, "w");
    assert_non_null(in);
    assert_non_null(out);
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    assert_int_equal(ferror(in), 0);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* Recordings made in this process, by budget and unused size: a recording runs about 270
 * iterations (discovery needs 2048 launches, then confirmation 4096), most of this file's time
 * under valgrind, so each is made once and later tests get a copy (which they may edit). */
static struct recording {
    char budget_env[64];
    uint64_t unused;
    char path[64];
} recordings[4];
static int nrecordings;

static void forget_recordings(void)
{
    for (int i = 0; i < nrecordings; i++)
        unlink(recordings[i].path);
}

static void record_profile_fresh(const char *path, const char *budget_env, uint64_t unused);

/* Record a profile of the program at BUDGET into PATH (a fresh engine); with UNUSED, one more
 * allocation of that size the program never uses. */
static void record_profile_unused(const char *path, const char *budget_env, uint64_t unused)
{
    for (int i = 0; i < nrecordings; i++) {
        struct recording *r = &recordings[i];
        if (strcmp(r->budget_env, budget_env) == 0 && r->unused == unused) {
            copy_file(r->path, path);
            return;
        }
    }
    record_profile_fresh(path, budget_env, unused);
    if (nrecordings < (int)FS_ARRAY_LEN(recordings)) {
        struct recording *r = &recordings[nrecordings++];
        snprintf(r->budget_env, sizeof(r->budget_env), "%s", budget_env);
        r->unused = unused;
        fresh_path(r->path, sizeof(r->path));
        copy_file(path, r->path);
    }
}

static void record_profile_fresh(const char *path, const char *budget_env, uint64_t unused)
{
    struct fs_device *dev = open_sim();
    register_kernels(dev);
    char out_env[128];
    snprintf(out_env, sizeof(out_env), "FLEXTENSOR_PROFILE_OUT=%s", path);
    char *envp[] = {"FLEXTENSOR_CONFIG=", (char *)budget_env, MIN_OFFLOAD,
                    "FLEXTENSOR_PROFILING_ITERS=3", out_env, NULL};
    start(dev, envp);
    uint64_t w[L], act, idle;
    alloc_program(dev, w, L, &act, 2 * MIB);
    if (unused)
        assert_int_equal(fs_engine_alloc(unused, 0, &idle), FS_OK);
    assert_int_equal(run_program(dev, w, L, act, 270), 0);
    stop(dev);
    struct fs_profile p;
    char err[512];
    assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
    fs_profile_free(&p);
}

static void record_profile(const char *path, const char *budget_env)
{
    record_profile_unused(path, budget_env, 0);
}

/* PTR lies in host memory on simulated device DEV. */
static void assert_on_host(struct fs_device *dev, uint64_t ptr)
{
    enum fs_mem_loc loc;
    assert_int_equal(fs_sim_location(dev, ptr, &loc), FS_OK);
    assert_int_equal(loc, FS_LOC_HOST);
}

/* Record a profile at BUDGET_ENV into PATH and edit its plan to read w[3] in place, as if by
 * planning code PLANNER (NULL: this build's). */
static void record_plan_reading_w3(const char *path, const char *budget_env, const char *planner)
{
    char err[512];
    record_profile(path, budget_env);
    struct fs_profile p;
    assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
    p.plan.entries[4] = (struct fs_plan_entry){false, -1, -1}; /* w[3] (act is 0) */
    assert_int_equal(fs_plan_evaluate(&p, &p.plan), FS_OK);
    if (planner)
        snprintf(p.plan.planner, sizeof(p.plan.planner), "%s", planner);
    assert_int_equal(fs_profile_save(path, &p, err, sizeof(err)), FS_OK);
    fs_profile_free(&p);
}

/* A fresh engine on a new simulated device, started from the saved profile PATH (64 MiB,
 * tracked remaps, and EXTRA if given: settings separated by spaces; with LOG, the log at level
 * info into that file), with the program's allocations made. */
static struct fs_device *start_logged(const char *path, const char *extra, const char *log,
                                      uint64_t *w, uint64_t *act)
{
    static char in_env[128], level_env[64], log_env[128], extra_env[256];
    struct fs_device *dev = open_sim();
    register_kernels(dev);
    snprintf(in_env, sizeof(in_env), "FLEXTENSOR_PROFILE=%s", path);
    snprintf(level_env, sizeof(level_env), "FLEXTENSOR_LOG_LEVEL=%s", log ? "info" : "warn");
    snprintf(log_env, sizeof(log_env), "FLEXTENSOR_LOG_FILE=%s", log ? log : "");
    char *envp[12] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", MIN_OFFLOAD,
                      "FLEXTENSOR_REMAP_SAFETY=tracked", in_env, level_env, log_env};
    int n = 7;
    snprintf(extra_env, sizeof(extra_env), "%s", extra ? extra : "");
    for (char *save, *tok = strtok_r(extra_env, " ", &save); tok && n < 11;
         tok = strtok_r(NULL, " ", &save))
        envp[n++] = tok;
    envp[n] = NULL;
    start(dev, envp);
    alloc_program(dev, w, L, act, 2 * MIB);
    return dev;
}

/* A fresh engine from the profile PATH with EXTRA settings, logging to LOG_PATH: the program runs
 * ITERS iterations (its data checked) and the engine shuts down as at exit (its report in the
 * log) and stops; its stats in ST, its log in LOG. */
static void run_logged(const char *path, const char *extra, const char *log_path, int iters,
                       struct fs_engine_stats *st, char *log, size_t log_size)
{
    uint64_t w[L], act;
    struct fs_device *dev = start_logged(path, extra, log_path, w, &act);
    assert_int_equal(run_program(dev, w, L, act, iters), 0);
    fs_engine_get_stats(st);
    fs_engine_shutdown();
    stop(dev);
    fs_test_read_file(log_path, log, log_size);
}

static struct fs_device *start_from_profile(const char *path, const char *extra, uint64_t *w,
                                            uint64_t *act)
{
    return start_logged(path, extra, NULL, w, act);
}

/* A saved profile: the next run skips discovery and profiling and runs the plan from its first
 * iteration; the data stays exact; evictions follow the plan instead of fault-ins. */
static void test_plan_runs_from_saved_profile(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, NULL, w, &act);
    enum { ITERS = 40 };
    assert_int_equal(run_program(dev, w, L, act, ITERS), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.plans, 1);
    /* Found within the first iteration after the window filled, and followed from then on. */
    assert_int_equal(st.exec.syncs, 1);
    assert_int_equal(st.exec.departures, 0);
    assert_true(st.exec.synced >= (uint64_t)ITERS * PER_ITER - FS_EXEC_SYNC_WINDOW);
    /* 68 MiB of weights and activations under 64 MiB: the plan moves weights every iteration,
     * and the mover (not the launching thread) does it. */
    assert_true(st.exec.prefetches >= ITERS);
    assert_true(st.res.prefetches >= ITERS);
    assert_int_equal(st.exec.move_failures, 0);
    assert_true(st.res.device_bytes_peak <= 64 * MIB);
    /* Tracked mode: the moves overlap; the weights are never written, so once fingerprinted
     * their evictions copy nothing back. */
    assert_true(st.exec.overlapped >= ITERS);
    assert_true(st.res.async_moves >= ITERS);
    assert_true(st.exec.max_inflight >= 1 && st.exec.max_inflight <= FS_EXEC_MOVES_INFLIGHT);
    assert_true(st.res.clean_evictions >= ITERS / 2);
    /* The fingerprints reported are those the device ran: a stage-in that reuses the host
     * copy's runs none. */
    struct fs_sim_stats sim;
    fs_engine_drain_moves();
    fs_engine_get_stats(&st);
    fs_sim_get_stats(dev, &sim);
    assert_true(st.res.fingerprints > 0);
    assert_int_equal(st.res.fingerprints, sim.fingerprints);
    assert_int_equal(sim.blocking_events_made, 0); /* COPY_WAIT=predict, the default */
    stop(dev);
    unlink(path);
}

/* Start from the profile at PATH with the settings EXTRA, run ITERS iterations of the program,
 * let the moves end and give the engine's stats in ST; the device is left open (its stats). */
static struct fs_device *run_from_profile(const char *path, const char *extra, int iters,
                                          struct fs_engine_stats *st)
{
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, extra, w, &act);
    assert_int_equal(run_program(dev, w, L, act, iters), 0);
    fs_engine_drain_moves();
    fs_engine_get_stats(st);
    return dev;
}

/* COPY_WAIT=block: the events the engine waits on (the executor's copy slots', each launch's
 * last use) are made blocking; the plan runs as with the default. */
static void test_copy_wait_block(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    enum { ITERS = 20 };
    struct fs_engine_stats st;
    struct fs_device *dev = run_from_profile(path, "FLEXTENSOR_COPY_WAIT=block", ITERS, &st);
    assert_int_equal(st.exec.plans, 1);
    assert_true(st.exec.prefetches >= ITERS);
    assert_true(st.exec.overlapped >= ITERS);
    assert_int_equal(st.exec.move_failures, 0);
    struct fs_sim_stats sim;
    fs_sim_get_stats(dev, &sim);
    /* Two a copy slot (its copy's and its fingerprint's), and the launches' shared events. */
    assert_true(sim.blocking_events_made > 2 * FS_EXEC_MOVES_INFLIGHT);
    stop(dev);
    unlink(path);
}

/* COPY_WAIT=predict: the finishers sleep through the part of each copy the profile's link model
 * predicts, then wait on its event; the plan runs as before. The link is slowed to 5 GB/s, so
 * that the weights' 2 MiB copies (0.4 ms) are long enough to sleep through. (Whether the sleep
 * ends before the copy does is the GPU's to show: the simulated device's clock is not the
 * host's; fs_res_copy_wake_ns's arithmetic is test_residency's.) */
static char predict_path[64];

static void test_copy_wait_predict(void **state)
{
    (void)state;
    fresh_path(predict_path, sizeof(predict_path));
    sim_link_bytes_per_s = 5e9;
    /* not a cached recording: those are of the default link */
    record_profile_fresh(predict_path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", 0);
    enum { ITERS = 20 };
    struct fs_engine_stats st;
    struct fs_device *dev =
        run_from_profile(predict_path, "FLEXTENSOR_COPY_WAIT=predict", ITERS, &st);
    assert_int_equal(st.exec.plans, 1);
    assert_true(st.exec.prefetches >= ITERS);
    assert_int_equal(st.exec.move_failures, 0);
    assert_true(st.res.predicted_sleeps > 0);
    struct fs_sim_stats sim;
    fs_sim_get_stats(dev, &sim);
    assert_int_equal(sim.blocking_events_made, 0); /* it waits as the context does */
    stop(dev);
}

/* Run even when the test fails: the later tests use the default link. */
static int copy_wait_predict_teardown(void **state)
{
    (void)state;
    sim_link_bytes_per_s = 0;
    unlink(predict_path);
    return 0;
}

/* Which command lines a profile's program stands for: the same command, options and script (or
 * first argument); later arguments may differ. */
static void test_same_program(void **state)
{
    (void)state;
    static const struct {
        const char *recorded, *cmdline; /* the command line's words separated by '|' */
        bool same;
    } cases[] = {
        {"python3 bench/bench.py --budget-pct 50", "python3|bench/bench.py|--budget-pct|25", true},
        {"python3 bench/bench.py", "python3|bench/bench.pyx", false},
        {"python3 bench/bench.pyx", "python3|bench/bench.py", false},
        {"python3 -u train.py --lr 1", "python3|-u|train.py", true},
        {"python3 -u train.py", "python3|-u|eval.py", false},
        {"python3 -m pkg.run", "python3|-m|pkg.other", false},
        {"python3", "python3|x.py", false},
        {"./prog --size 4", "./prog", true},
        {"./prog", "./prog2", false},
        {"", "./prog", false},
        {"./prog", "", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char cmd[128];
        size_t n = strlen(cases[i].cmdline);
        memcpy(cmd, cases[i].cmdline, n + 1);
        for (size_t k = 0; k < n; k++)
            if (cmd[k] == '|')
                cmd[k] = '\0';
        size_t len = n ? n + 1 : 0; /* every word ends with a NUL, the last one too */
        if (fs_rec_same_program(cases[i].recorded, cmd, len) != cases[i].same)
            fail_msg("case %zu: '%s' against '%s'", i, cases[i].recorded, cases[i].cmdline);
    }
}

/* A profile recorded from this program starts the engine as the library loads, on a thread of
 * its own (fs_engine_start_early), so the plan's host memory is pinned before the program's
 * first allocation; a profile of another program (another command) leaves the start to the first
 * allocation. Either way the allocations the plan offloads start in host memory and the run is
 * exact. A budget that holds every allocation of the profile has nothing to pin early: the start
 * is left to the first allocation too, and nothing goes to host; so has a plan that moves nothing
 * but reads an allocation in place. */
static void test_early_start(void **state)
{
    (void)state;
    char path[64], other[64], log_path[64], log[16384], err[256];
    fresh_path(path, sizeof(path));
    fresh_path(other, sizeof(other));
    fresh_path(log_path, sizeof(log_path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    struct fs_profile p;
    assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
    snprintf(p.program, sizeof(p.program), "another-program --with args");
    assert_int_equal(fs_profile_save(other, &p, err, sizeof(err)), FS_OK);
    fs_profile_free(&p);
    for (int ours = 1; ours >= 0; ours--) {
        struct fs_engine_stats st;
        start_early = true;
        run_logged(ours ? path : other, NULL, log_path, 8, &st, log, sizeof(log));
        start_early = false;
        assert_int_equal(started_early, ours);
        assert_int_equal(strstr(log, "starting early: the profile is this program's") != NULL,
                         ours);
        assert_int_equal(st.exec.plans, 1);
        assert_true(st.res.placed_on_host > 0);
        assert_true(st.res.device_bytes_peak <= 64 * MIB);
        assert_int_equal(st.res.pinner_starts, 1); /* the plan offloads: pinned ahead */
        assert_non_null(strstr(log, "; background pinner started ("));
    }
    struct fs_engine_stats st;
    start_early = true;
    run_logged(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=1GiB", log_path, 8, &st, log, sizeof(log));
    start_early = false;
    assert_false(started_early);
    assert_null(strstr(log, "starting early"));
    assert_int_equal(st.res.placed_on_host, 0);
    assert_int_equal(st.res.background_pins, 0);
    assert_int_equal(st.res.pinner_starts, 0);

    /* A plan that moves nothing, w[3] read in place (68 MiB of allocations, 66 without it, within
     * 67): nothing to pin early either, no pinner thread; w[3] is pinned as it is made. */
    record_plan_reading_w3(other, "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB", NULL);
    assert_int_equal(fs_profile_load(other, &p, err, sizeof(err)), FS_OK);
    p.plan.budget = 67 * MIB;
    assert_int_equal(fs_profile_save(other, &p, err, sizeof(err)), FS_OK);
    fs_profile_free(&p);
    start_early = true;
    run_logged(other, "FLEXTENSOR_GPU_MEMORY_LIMIT=67MiB FLEXTENSOR_PLAN_HEADROOM=0", log_path, 8,
               &st, log, sizeof(log));
    start_early = false;
    assert_false(started_early);
    assert_null(strstr(log, "starting early"));
    assert_non_null(strstr(log, "plan adaptive(knapsack) at 67 MiB"));
    assert_int_equal(st.res.placed_on_host, 1);
    assert_int_equal(st.res.background_pins, 0);
    assert_int_equal(st.res.pinner_starts, 0);
    assert_non_null(strstr(log, "; background pinner not started (0 blocks)"));
    assert_int_equal(st.res.evictions, 0);
    unlink(log_path);
    unlink(other);
    unlink(path);
}

/* Where the program's allocations start under a plan: those the plan offloads and the iteration
 * uses start in host memory, except those the plan has on the device where its iteration begins
 * (a buffer made during the first iteration, before the executor has found its place, would
 * otherwise be read from host by every launch until its window came round); those take the
 * device, within the budget. Counted from the profile's own plan. */
static void test_plan_places_new_allocations(void **state)
{
    (void)state;
    char path[64], err[256];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    struct fs_profile p;
    assert_int_equal(fs_profile_load(path, &p, err, sizeof(err)), FS_OK);
    int on_host = 0, on_device = 0;
    for (int a = 0; a < p.nallocs; a++) {
        const struct fs_plan_entry *e = &p.plan.entries[a];
        if (e->resident || p.allocs[a].first_use < 0)
            continue;
        if (e->prefetch_at >= 0 && fs_window_covers(e->prefetch_at, e->evict_after, 0, 0))
            on_device++;
        else
            on_host++;
    }
    fs_profile_free(&p);
    assert_true(on_host > 0);
    assert_true(on_device > 0); /* the case this test is about */
    for (int mode = 0; mode < 2; mode++) {
        uint64_t w[L], act;
        struct fs_device *dev =
            start_from_profile(path, mode ? "FLEXTENSOR_OFFLOAD_MODE=redirect" : NULL, w, &act);
        struct fs_engine_stats st;
        fs_engine_get_stats(&st);
        assert_int_equal(st.res.placed_on_host, on_host);
        assert_int_equal(st.res.evictions, 0);
        assert_true(st.res.device_bytes_peak <= 64 * MIB);
        assert_int_equal(run_program(dev, w, L, act, 6), 0);
        stop(dev);
    }
    unlink(path);
}

/* A launch that finds an allocation the plan has on the device there in host memory, with no
 * prefetch on its way, queues one and waits for it (redirect mode would otherwise read it from
 * host until its window came round). Here the program makes its last allocation (one the
 * iteration never uses) only after the plan runs; placing it evicts what is on the device between
 * two iterations, the stages the next iteration begins with among them. While the program
 * captures a graph no move may begin: then the launches read those stages from host, exact, and
 * queue nothing they would wait for in vain. */
static void test_plan_restages_what_was_pushed_out(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile_unused(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", 40 * MIB);
    for (int capture = 0; capture < 2; capture++) {
        uint64_t w[L], act, idle;
        struct fs_device *dev =
            start_from_profile(path, "FLEXTENSOR_OFFLOAD_MODE=redirect", w, &act);
        assert_int_equal(run_program(dev, w, L, act, 4), 0);
        struct fs_engine_stats s0, s1;
        fs_engine_get_stats(&s0);
        assert_int_equal(fs_engine_alloc(40 * MIB, 0, &idle), FS_OK);
        program_captures = capture;
        assert_int_equal(run_program(dev, w, L, act, capture ? 1 : 4), 0); /* marks read right */
        program_captures = false;
        fs_engine_get_stats(&s1);
        /* Placing it pushed stages out (without the launches' prefetches, 3 host reads followed) */
        assert_true(s1.res.evictions > s0.res.evictions);
        if (capture) {
            assert_true(s1.res.host_served > s0.res.host_served);
            assert_int_equal(s1.exec.restaged, s0.exec.restaged);
        } else {
            assert_int_equal(s1.res.host_served, s0.res.host_served);
            assert_true(s1.exec.restaged > s0.exec.restaged);
        }
        assert_int_equal(s1.exec.departures, 0);
        assert_true(s1.res.device_bytes_peak <= 64 * MIB);
        stop(dev);
    }
    unlink(path);
}

/* The run trace's spans of KIND (named KIND then the allocation) in EVENTS, as [allocation,
 * start, end] in microseconds, in file order, at most MAX; returns how many there are. */
static int trace_spans(json_t *events, const char *kind, double (*out)[3], int max)
{
    int n = 0;
    size_t i, len = strlen(kind);
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (!name || !ph || strcmp(ph, "X") || strncmp(name, kind, len) || name[len] != ' ' ||
            !(name[len + 1] >= '0' && name[len + 1] <= '9'))
            continue;
        if (n < max) {
            double ts = json_number_value(json_object_get(e, "ts"));
            out[n][0] = (double)json_integer_value(
                json_object_get(json_object_get(e, "args"), "allocation"));
            out[n][1] = ts;
            out[n][2] = ts + json_number_value(json_object_get(e, "dur"));
        }
        n++;
    }
    return n;
}

/* FLEXTENSOR_TRACE_OUT: the run trace is written at exit and holds every remap the counters
 * count, each move's life in its slot, and the iterations; an eviction's slot is given back at
 * its release, before its host mapping (the mover may start another move in it meanwhile). An
 * unwritable path is one warning that names the setting. */
static void test_run_trace(void **state)
{
    (void)state;
    char path[64], trace[96], env[128];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    snprintf(trace, sizeof(trace), "%s.trace.json", path);
    snprintf(env, sizeof(env), "FLEXTENSOR_TRACE_OUT=%s", trace);
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, env, w, &act);
    enum { ITERS = 12, MAX = 4096 };
    assert_int_equal(run_program(dev, w, L, act, ITERS), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    fs_engine_shutdown();
    stop(dev);

    json_error_t err;
    json_t *root = json_load_file(trace, 0, &err);
    assert_non_null(root);
    json_t *events = json_object_get(root, "traceEvents");
    assert_true(json_is_array(events));
    static double host_maps[MAX][3], evictions[MAX][3], spans[MAX][3];
    int nhost = trace_spans(events, "map host", host_maps, MAX);
    int nev = trace_spans(events, "eviction", evictions, MAX);
    assert_true(nhost < MAX && nev < MAX);
    /* Every remap is drawn (none was dropped), by kind. */
    assert_int_equal(nhost, st.res.remaps[FS_REMAP_MAP][FS_LOC_HOST]);
    assert_int_equal(trace_spans(events, "map device", spans, MAX),
                     st.res.remaps[FS_REMAP_MAP][FS_LOC_DEVICE]);
    assert_int_equal(trace_spans(events, "unmap device", spans, MAX),
                     st.res.remaps[FS_REMAP_UNMAP][FS_LOC_DEVICE]);
    assert_int_equal(trace_spans(events, "unmap host", spans, MAX),
                     st.res.remaps[FS_REMAP_UNMAP][FS_LOC_HOST]);
    assert_true(st.res.remaps[FS_REMAP_MAP][FS_LOC_HOST] >= ITERS / 2);
    /* So is every fault-in and whole-device synchronize. */
    assert_int_equal(trace_spans(events, "fault-in", spans, MAX), st.res.faults);
    assert_int_equal(trace_spans(events, "synchronize", spans, MAX), st.res.quiesce_syncs);
    assert_true(st.res.faults > 0 && st.res.quiesce_syncs > 0); /* the checks count something */
    assert_int_equal(trace_spans(events, "prefetch", spans, MAX), st.exec.overlapped - nev);
    assert_true(trace_spans(events, "begin prefetch", spans, MAX) >= ITERS);
    size_t iterations = 0, i;
    json_t *e;
    json_array_foreach(events, i, e)
        iterations += !strcmp(json_string_value(json_object_get(e, "name")), "iteration");
    assert_true(iterations >= ITERS - 2);
    /* Each eviction's slot ended before its allocation's next host mapping began. */
    assert_true(nev >= ITERS / 2);
    for (int k = 0; k < nev; k++) {
        int next = -1;
        for (int h = 0; h < nhost && next < 0; h++)
            if (host_maps[h][0] == evictions[k][0] && host_maps[h][1] >= evictions[k][1])
                next = h;
        assert_true(next >= 0);
        assert_true(evictions[k][2] <= host_maps[next][1]);
    }
    json_decref(root);
    unlink(trace);

    struct fs_test_capture cap;
    dev = start_from_profile(path, "FLEXTENSOR_TRACE_OUT=/nonexistent-dir/t.json", w, &act);
    assert_int_equal(run_program(dev, w, L, act, 2), 0);
    fs_test_capture_start(&cap);
    fs_engine_shutdown();
    const char *log = fs_test_capture_end(&cap);
    assert_non_null(strstr(log, "FLEXTENSOR_TRACE_OUT=/nonexistent-dir/t.json: cannot write"));
    stop(dev);
    unlink(path);
}

/* PLAN_HEADROOM: the plan is made for the limit less the headroom (and the run stays exact and
 * within the limit); a headroom not less than the limit is ignored with one warning naming it;
 * 0 plans for the whole limit. */
static void test_plan_headroom(void **state)
{
    (void)state;
    char path[64], log_path[64], log[16384];
    fresh_path(path, sizeof(path));
    fresh_path(log_path, sizeof(log_path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    struct fs_engine_stats st;
    run_logged(path, "FLEXTENSOR_PLAN_HEADROOM=4MiB", log_path, 8, &st, log, sizeof(log));
    assert_non_null(strstr(log, " at 60 MiB, predicted"));
    assert_true(st.exec.plans == 1 && st.exec.prefetches > 0);
    assert_true(st.res.device_bytes_peak <= 64 * MIB);

    uint64_t w[L], act;
    struct fs_device *dev = start_logged(path, "FLEXTENSOR_PLAN_HEADROOM=64MiB", log_path, w, &act);
    stop(dev);
    fs_test_read_file(log_path, log, sizeof(log));
    assert_non_null(strstr(log, "FLEXTENSOR_PLAN_HEADROOM (64 MiB) is not less than the budget "
                                "(64 MiB); it is ignored"));
    assert_non_null(strstr(log, " at 64 MiB, predicted"));

    /* 0 plans for the whole limit (the default would leave 1/32 of it). */
    dev = start_logged(path, "FLEXTENSOR_PLAN_HEADROOM=0", log_path, w, &act);
    stop(dev);
    fs_test_read_file(log_path, log, sizeof(log));
    assert_non_null(strstr(log, " at 64 MiB, predicted"));
    assert_null(strstr(log, "not less than the budget"));
    unlink(log_path);
    unlink(path);
}

/* OFFLOAD_MODE=host_read: the plan keeps what fits resident and the rest stays in host memory,
 * read in place by its kernels: after the first placement nothing is prefetched or faulted in,
 * the data stays exact and the device holds no more than the budget. */
static void test_host_read_mode(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, "FLEXTENSOR_OFFLOAD_MODE=host_read", w, &act);
    enum { ITERS = 12 };
    assert_int_equal(run_program(dev, w, L, act, ITERS), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.plans, 1);
    assert_int_equal(st.exec.departures, 0);
    /* Only the first placement (what the plan keeps resident comes back once), no per-iteration
     * prefetches. */
    assert_true(st.exec.prefetches <= L + 1);
    assert_true(st.res.prefetches <= L + 1);
    assert_int_equal(st.exec.unplanned, 0);
    /* 68 MiB under 64: at least one weight is read from host in every iteration after the
     * first, and none is faulted in once the plan runs. */
    assert_true(st.res.host_served >= ITERS - 2);
    assert_true(st.res.faults <= 2);
    assert_true(st.res.device_bytes_peak <= 64 * MIB);
    stop(dev);
    unlink(path);
}

/* OFFLOAD_MODE=redirect: the plan's moves make and end device copies instead of remapping; the
 * layer kernels read their marks through redirected parameters (exact data), every iteration
 * stages weights in and out, and once the first placement is done nothing is remapped. */
/* A plan may read an offloaded allocation in place: it stays in host memory and its launches
 * read it there, in every offload mode; nothing moves it, nothing faults it in, the data stays
 * exact, and its references are planned ones. */
static void test_plan_reads_in_place(void **state)
{
    (void)state;
    static const char *const modes[] = {NULL, "FLEXTENSOR_OFFLOAD_MODE=redirect"};
    for (size_t m = 0; m < FS_ARRAY_LEN(modes); m++) {
        char path[64];
        fresh_path(path, sizeof(path));
        record_plan_reading_w3(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", NULL);
        uint64_t w[L], act;
        struct fs_device *dev = start_from_profile(path, modes[m], w, &act);
        assert_int_equal(run_program(dev, w, L, act, 3), 0);
        struct fs_engine_stats s0, s1;
        fs_engine_get_stats(&s0);
        enum { ITERS = 10 };
        assert_int_equal(run_program(dev, w, L, act, ITERS), 0); /* every mark read right */
        fs_engine_get_stats(&s1);
        assert_int_equal(s1.exec.departures, 0);
        assert_int_equal(s1.exec.unplanned, 0);
        assert_int_equal(s1.res.faults, s0.res.faults);
        assert_true(s1.res.host_served - s0.res.host_served >= ITERS);
        assert_on_host(dev, w[3]);
        stop(dev);
        unlink(path);
    }
}

/* A saved plan that other planning code made (an older flexshim's, or one saved before plans
 * named their planner) is planned again, and the log says so: the edited plan's read in place
 * is not run. */
static void test_plan_of_other_planning_code_made_again(void **state)
{
    (void)state;
    static const char *const planners[] = {"0123456789ab", ""};
    for (size_t i = 0; i < FS_ARRAY_LEN(planners); i++) {
        char path[64], log_path[64], log[16384];
        fresh_path(path, sizeof(path));
        fresh_path(log_path, sizeof(log_path));
        record_plan_reading_w3(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", planners[i]);
        struct fs_engine_stats st;
        run_logged(path, NULL, log_path, 6, &st, log, sizeof(log));
        assert_non_null(strstr(log, "its plan was made by other planning code"));
        assert_non_null(strstr(log, fs_planner_id()));
        assert_int_equal(st.exec.plans, 1);
        assert_int_equal(st.res.host_served, 0);
        assert_true(st.exec.prefetches > 0);
        unlink(log_path);
        unlink(path);
    }
}

static void test_redirect_mode(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, "FLEXTENSOR_OFFLOAD_MODE=redirect", w, &act);
    assert_int_equal(run_program(dev, w, L, act, 3), 0);
    struct fs_engine_stats s0, s1;
    fs_engine_get_stats(&s0);
    enum { ITERS = 10 };
    assert_int_equal(run_program(dev, w, L, act, ITERS), 0);
    fs_engine_get_stats(&s1);
    assert_int_equal(s1.exec.plans, 1);
    assert_int_equal(s1.exec.departures, 0);
    assert_int_equal(s1.exec.unplanned, 0);
    /* 68 MiB under 64: at least one weight is staged in and out in every iteration. */
    assert_true(s1.res.stage_ins - s0.res.stage_ins >= ITERS);
    assert_true(s1.res.stage_outs - s0.res.stage_outs >= ITERS - 1);
    assert_true(s1.res.redirected - s0.res.redirected >= ITERS);
    assert_true(s1.launch.rewritten - s0.launch.rewritten >= ITERS);
    for (int op = 0; op < 2; op++)
        for (int loc = 0; loc < 2; loc++)
            assert_int_equal(s1.res.remaps[op][loc], s0.res.remaps[op][loc]);
    assert_int_equal(s1.res.faults, s0.res.faults);
    assert_int_equal(s1.res.unstage_syncs, 0);
    assert_true(s1.res.device_bytes_peak <= 64 * MIB);
    stop(dev);
    unlink(path);
}

/* LATE_PREFETCH=read_in_place: a launch that finds a staged weight's copy not begun reads it from
 * host memory instead of waiting, and that copy is dropped (never begun later); the data stays
 * exact and nothing waits for a late copy that had not begun. */
static void test_redirect_late_reads_in_place(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    struct fs_engine_stats s[2];
    for (int in_place = 0; in_place < 2; in_place++) {
        uint64_t w[L], act;
        struct fs_device *dev = start_from_profile(
            path,
            in_place ? "FLEXTENSOR_OFFLOAD_MODE=redirect FLEXTENSOR_LATE_PREFETCH=read_in_place"
                     : "FLEXTENSOR_OFFLOAD_MODE=redirect",
            w, &act);
        assert_int_equal(run_program(dev, w, L, act, 12), 0); /* exact data either way */
        fs_engine_get_stats(&s[in_place]);
        stop(dev);
    }
    /* Waiting: late copies are waited for, none is dropped. */
    assert_true(s[0].exec.late > 0 && s[0].exec.late_wait_ns > 0);
    assert_int_equal(s[0].exec.read_in_place, 0);
    /* In place: late references whose copies had not begun are served from host, and those
     * copies are never made (the same plan made every copy while waiting). */
    assert_true(s[1].exec.read_in_place > 0);
    assert_true(s[1].res.host_served >= s[1].exec.read_in_place);
    uint64_t made = s[1].res.stage_ins + s[1].exec.read_in_place;
    assert_true(made + 2 >= s[0].res.stage_ins && made <= s[0].res.stage_ins + 2);
    unlink(path);
}

/* With the run trace on, each late wait is measured for the time the launch's stream ran out of
 * work meanwhile: every wait is measured (or counted as not), the exit log says how much, and
 * the trace draws a "stream idle" span for each wait that had some. The simulated device's
 * program clock stands still while the program's thread waits for the mover (the replay moves it
 * only after the wait, fs_sim_join_engine_clock), and the program queues nothing meanwhile, so
 * here its stream is never idle in a wait: no time, no span. Non-zero idle is for the GPU. The
 * launches queued behind an arriving copy are measured as well (test_residency checks the time). */
static void test_run_trace_stream_idle(void **state)
{
    (void)state;
    char path[64], trace[96], env[192];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    snprintf(trace, sizeof(trace), "%s.trace.json", path);
    snprintf(env, sizeof(env),
             "FLEXTENSOR_OFFLOAD_MODE=redirect FLEXTENSOR_LOG_LEVEL=info FLEXTENSOR_TRACE_OUT=%s",
             trace);
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, env, w, &act);
    assert_int_equal(run_program(dev, w, L, act, 12), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    struct fs_test_capture cap;
    fs_test_capture_start(&cap);
    fs_engine_shutdown();
    const char *log = fs_test_capture_end(&cap);
    stop(dev);
    assert_true(st.exec.late > 0 && st.exec.late_wait_ns > 0);
    assert_int_equal(st.exec.idle.measured + st.exec.idle.missed, st.exec.late);
    assert_true(st.exec.idle.measured >= st.exec.late / 2);
    assert_int_equal(st.exec.idle.idle_ns, 0);
    char want[160];
    snprintf(want, sizeof(want),
             "plan: the launches' streams had run out of work for 0.0 ms of those waits (%llu "
             "waits measured, %llu not;",
             (unsigned long long)st.exec.idle.measured, (unsigned long long)st.exec.idle.missed);
    assert_non_null(strstr(log, want));
    /* The launches ordered after a copy are measured too, one probe per launch (a launch may
     * wait for several copies), and the exit log says how much they waited on the device. */
    uint64_t probed = st.res.ordered_wait.measured + st.res.ordered_wait.missed;
    assert_true(st.res.ordered_waits > 0);
    assert_true(probed > 0 && probed <= st.res.ordered_waits);
    snprintf(want, sizeof(want),
             "plan: the launches ordered after a prefetch's copy waited %.1f ms for it on the "
             "device (%llu launches measured, %llu not;",
             (double)st.res.ordered_wait.idle_ns / 1e6, (unsigned long long)st.res.ordered_wait.measured,
             (unsigned long long)st.res.ordered_wait.missed);
    assert_non_null(strstr(log, want));

    json_error_t err;
    json_t *root = json_load_file(trace, 0, &err);
    assert_non_null(root);
    json_t *events = json_object_get(root, "traceEvents");
    enum { MAX = 4096 };
    static double spans[MAX][3];
    assert_int_equal(trace_spans(events, "late wait", spans, MAX), st.exec.late);
    assert_int_equal(trace_spans(events, "stream idle", spans, MAX), 0);
    json_decref(root);
    unlink(trace);
    unlink(path);
}

/* TIMING_REPORT: at exit a file with every remap kind (calls matching the counters), the moves and
 * the plan's waits; '-' writes the same lines to the log; an unwritable path is one warning that
 * names the setting. */
static void test_timing_report(void **state)
{
    (void)state;
    char path[64], report[96], env[128], log_path[64], text[16384];
    fresh_path(path, sizeof(path));
    fresh_path(log_path, sizeof(log_path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    snprintf(report, sizeof(report), "%s.timing.txt", path);
    snprintf(env, sizeof(env), "FLEXTENSOR_TIMING_REPORT=%s", report);
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, env, w, &act);
    assert_int_equal(run_program(dev, w, L, act, 8), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    fs_engine_shutdown();
    stop(dev);
    fs_test_read_file(report, text, sizeof(text));
    assert_non_null(strstr(text, "flexshim timing report, pid "));
    assert_non_null(strstr(text, "device flexshim simulated device, budget 0.06 GiB"));
    char expect[128];
    snprintf(expect, sizeof(expect), "  map host      %9llu calls",
             (unsigned long long)st.res.remaps[FS_REMAP_MAP][FS_LOC_HOST]);
    assert_true(st.res.remaps[FS_REMAP_MAP][FS_LOC_HOST] > 0);
    assert_non_null(strstr(text, expect));
    snprintf(expect, sizeof(expect), "moves: %llu prefetches",
             (unsigned long long)st.res.prefetches);
    assert_non_null(strstr(text, expect));
    assert_non_null(strstr(text, "\nplan: "));
    unlink(report);

    dev = start_logged(path, "FLEXTENSOR_TIMING_REPORT=-", log_path, w, &act);
    assert_int_equal(run_program(dev, w, L, act, 2), 0);
    fs_engine_shutdown();
    stop(dev);
    fs_test_read_file(log_path, text, sizeof(text));
    assert_non_null(strstr(text, "info: timing: remaps (host time in the driver"));
    assert_non_null(strstr(text, "info: timing:   unmap host "));

    dev = start_logged(path, "FLEXTENSOR_TIMING_REPORT=/nonexistent-dir/t.txt", log_path, w,
                       &act);
    fs_engine_shutdown();
    stop(dev);
    fs_test_read_file(log_path, text, sizeof(text));
    assert_non_null(strstr(text, "FLEXTENSOR_TIMING_REPORT=/nonexistent-dir/t.txt: cannot write "
                                 "the timing report"));
    unlink(log_path);
    unlink(path);
}

/* A launch the plan does not have (here one in the middle of every 4th iteration) keeps the
 * place: counted as extra, never a departure, and the plan still runs. */
static void test_plan_tolerates_an_extra_launch(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, NULL, w, &act);
    enum { ITERS = 40 };
    assert_int_equal(run_marked_program(dev, w, L, act, ITERS, EXTRA_LAUNCH), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.syncs, 1);
    assert_int_equal(st.exec.departures, 0);
    assert_int_equal(st.exec.extra, ITERS / 4);
    assert_int_equal(st.exec.skipped, 0);
    assert_true(st.exec.synced >= (uint64_t)ITERS * PER_ITER - FS_EXEC_SYNC_WINDOW);
    assert_true(st.exec.prefetches >= ITERS);
    stop(dev);
    unlink(path);
}

/* A program that leaves the plan's iteration for good: the executor departs, runs reactively,
 * gives up after a while, and discovery makes a new plan for what the program does now. */
static void test_plan_given_up_and_made_again(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    uint64_t w[L], act;
    struct fs_device *dev = start_from_profile(path, "FLEXTENSOR_PROFILING_ITERS=2", w, &act);
    assert_int_equal(run_marked_program(dev, w, L, act, 10, NO_MARK), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.syncs, 1);
    assert_int_equal(st.exec.departures, 0);
    /* Lost for 4 x 31 + 8192 launches (about 270 iterations), then discovery (2048) and
     * confirmation (4096 launches): 520 iterations of the changed program are enough. */
    assert_int_equal(run_marked_program(dev, w, L, act, 520, CHANGED), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.departures, 1);
    assert_int_equal(st.exec.give_ups, 1);
    assert_int_equal(st.exec.plans, 2);
    assert_true(st.exec.syncs >= 2);
    assert_int_equal(st.exec.move_failures, 0);
    stop(dev);
    unlink(path);
}

/* A profile that does not describe the program (another size for allocation 3), or that cannot
 * be read, is refused and the program is discovered again (a new profile is saved). */
static void test_mismatched_or_corrupt_profile_rediscovers(void **state)
{
    (void)state;
    char path[64], out[64], in_env[128], out_env[128];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    for (int corrupt = 0; corrupt < 2; corrupt++) {
        char bad[64];
        if (corrupt)
            fs_test_write_file(bad, sizeof(bad), "{\"schema_version\": 1, \"alloc");
        snprintf(in_env, sizeof(in_env), "FLEXTENSOR_PROFILE=%s", corrupt ? bad : path);
        fresh_path(out, sizeof(out));
        snprintf(out_env, sizeof(out_env), "FLEXTENSOR_PROFILE_OUT=%s", out);
        struct fs_device *dev = open_sim();
        register_kernels(dev);
        char *envp[] = {"FLEXTENSOR_CONFIG=", "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB", MIN_OFFLOAD,
                        in_env, out_env, "FLEXTENSOR_PROFILING_ITERS=2", NULL};
        start(dev, envp);
        uint64_t w[L], act;
        alloc_program(dev, w, L, &act, corrupt ? 2 * MIB : 4 * MIB);
        assert_int_equal(run_program(dev, w, L, act, 270), 0);
        struct fs_engine_stats st;
        fs_engine_get_stats(&st);
        /* Mismatch: the saved plan was installed, then refused at allocation 3 before any
         * launch; corrupt: never installed. Either way the plan that runs is a new one. */
        assert_int_equal(st.exec.plans, corrupt ? 1 : 2);
        struct fs_profile p;
        char err[512];
        assert_int_equal(fs_profile_load(out, &p, err, sizeof(err)), FS_OK);
        assert_int_equal(p.allocs[3].size, corrupt ? 2 * MIB : 4 * MIB);
        fs_profile_free(&p);
        stop(dev);
        unlink(out);
        if (corrupt)
            unlink(bad);
    }
    unlink(path);
}

/* A fresh engine from the profile PATH at BUDGET MiB with the pausing tracker (EXTRA: one more
 * setting, or NULL). */
static struct fs_device *start_with_room(const char *path, int budget, char *extra)
{
    static char in_env[128], budget_env[64];
    struct fs_device *dev = open_sim();
    register_kernels(dev);
    snprintf(in_env, sizeof(in_env), "FLEXTENSOR_PROFILE=%s", path);
    snprintf(budget_env, sizeof(budget_env), "FLEXTENSOR_GPU_MEMORY_LIMIT=%dMiB", budget);
    char *envp[] = {"FLEXTENSOR_CONFIG=", budget_env, MIN_OFFLOAD,
                    "FLEXTENSOR_REMAP_SAFETY=tracked", "FLEXTENSOR_LOG_LEVEL=error", in_env, extra,
                    NULL};
    start(dev, envp);
    fs_engine_set_tracker(&pausing_tracker);
    __atomic_store_n(&tracker_paused, 1, __ATOMIC_RELEASE); /* not started yet */
    tracker_starts = 0;
    return dev;
}

/* Tracking started paused (the tracker not even set up) and FROZEN allocations are frozen. */
static void assert_started_paused(uint64_t frozen)
{
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_true(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(tracker_starts, 0);
    assert_int_equal(st.tracking_pauses, 1);
    assert_int_equal(st.res.frozen, frozen);
}

/* One launch of the head kernel on PTR (tracked or not, as the tracker says). */
static void launch_on(struct fs_device *dev, fs_stream s, uint64_t ptr)
{
    uint64_t params[2] = {ptr, ptr};
    void *argv[2] = {&params[0], &params[1]};
    struct fs_launch_desc d = {.func = &head_kernel, .stream = s, .kernel_params = argv};
    struct fs_launch_ticket t;
    report_enter(&d, &t);
    fs_dptr ptrs[1] = {ptr};
    uint64_t sizes[1] = {64};
    assert_int_equal(fs_sim_launch(dev, s, 1000, ptrs, sizes, 1, NULL, NULL), FS_OK);
    report_exit(&t);
}

struct free_call {
    uint64_t ptr;
    int rc;
};

static void *free_in_thread(void *arg)
{
    struct free_call *f = arg;
    f->rc = fs_engine_free(f->ptr);
    return NULL;
}

/* PAUSE_TRACKING: with a plan that moves nothing (the weights and activations resident, an
 * allocation the iteration never uses left where it is, all 76 MiB within 128), tracking starts
 * paused, the tracker not even set up, and the program runs unseen and exact. An allocation that
 * does not fit sets the tracker up; it works from host memory, the allocations made while paused are never evicted
 * for it. Once it is freed tracking pauses again, but only after the launch being tracked on
 * another thread has ended. */
static void test_tracking_pauses_while_nothing_moves(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile_unused(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB", 8 * MIB);
    struct fs_device *dev = start_with_room(path, 128, NULL);
    uint64_t w[L], act, idle;
    alloc_program(dev, w, L, &act, 2 * MIB);
    assert_int_equal(fs_engine_alloc(8 * MIB, 0, &idle), FS_OK);
    assert_started_paused(L + 2);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.res.plain_made, L + 2); /* all in plain device memory */
    assert_int_equal(st.res.plain_bytes, 76 * MIB);
    uint64_t seen = st.launch.launches; /* the launch counters live across engines */
    assert_int_equal(run_program(dev, w, L, act, 10), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.launch.launches, seen);

    /* 76 MiB + 80 MiB > 128 MiB: placed on host, tracking resumes before the program has it. */
    uint64_t big;
    assert_int_equal(fs_engine_alloc(80 * MIB, 0, &big), FS_OK);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(tracker_starts, 1);
    fs_stream s;
    assert_int_equal(fs_sim_stream_create(dev, &s), FS_OK);
    launch_on(dev, s, big);
    assert_int_equal(run_program(dev, w, L, act, 5), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.tracking_resumes, 1);
    assert_int_equal(st.res.placed_on_host, 1); /* the plain bytes count against the budget */
    assert_int_equal(st.res.plain_made, L + 2);  /* BIG is managed as usual */
    assert_int_equal(st.res.evictions, 0); /* the frozen were not moved for it */
    assert_true(st.res.host_served >= 1);
    assert_true(st.launch.launches > seen);

    /* A tracked launch is open on this thread while another frees BIG: the pause waits for it. */
    uint64_t params[2] = {act, act};
    void *argv[2] = {&params[0], &params[1]};
    struct fs_launch_desc d = {.func = &head_kernel, .stream = s, .kernel_params = argv};
    struct fs_launch_ticket t;
    report_enter(&d, &t);
    assert_true(t.active);
    struct free_call f = {big, -100};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, free_in_thread, &f), 0);
    do { /* freed: the thread goes on to pause */
        usleep(1000);
        fs_engine_get_stats(&st);
    } while (st.res.allocs_live != L + 2);
    usleep(50 * 1000);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    report_exit(&t);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(f.rc, FS_OK);
    fs_engine_get_stats(&st);
    assert_true(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(st.tracking_pauses, 2);
    assert_int_equal(run_program(dev, w, L, act, 3), 0);
    /* Outgrown again: the tracker, set up now, resumes reporting without a second start. */
    assert_int_equal(fs_engine_alloc(80 * MIB, 0, &big), FS_OK);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(tracker_starts, 1);
    fs_engine_get_stats(&st);
    assert_int_equal(st.tracking_resumes, 2);
    assert_int_equal(run_program(dev, w, L, act, 3), 0);
    assert_int_equal(dev->ops->stream_destroy(dev, s), FS_OK);
    stop(dev);
    unlink(path);
}

/* A plan that reads w[3] in place and keeps the rest (66 MiB within 128) moves nothing too:
 * tracking starts paused, w[3] is made in host memory and frozen there, the others in plain device
 * memory, and the program runs unseen and exact, w[3] read over the link. An allocation that
 * does not fit resumes tracking; w[3] stays in host memory, read there, never faulted in. */
static void test_tracking_pauses_with_reads_in_place(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_plan_reading_w3(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB", NULL);
    struct fs_device *dev = start_with_room(path, 128, NULL);
    uint64_t w[L], act;
    alloc_program(dev, w, L, &act, 2 * MIB);
    assert_started_paused(L + 1);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.res.plain_made, L);
    assert_int_equal(st.res.placed_on_host, 1);
    assert_on_host(dev, w[3]);
    uint64_t seen = st.launch.launches; /* the launch counters live across engines */
    assert_int_equal(run_program(dev, w, L, act, 10), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.launch.launches, seen);

    uint64_t big; /* 66 MiB + 80 MiB > 128 MiB */
    assert_int_equal(fs_engine_alloc(80 * MIB, 0, &big), FS_OK);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(tracker_starts, 1);
    assert_int_equal(run_program(dev, w, L, act, 5), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.tracking_resumes, 1);
    assert_true(st.launch.launches > seen);
    assert_int_equal(st.res.faults, 0);
    assert_int_equal(st.res.evictions, 0);
    assert_true(st.res.host_served >= 5);
    assert_on_host(dev, w[3]);
    stop(dev);
    unlink(path);
}

/* OFFLOAD_MODE=host_read moves nothing either: what the plan offloads stays in host memory and is
 * read there. So tracking starts paused there too (the 64 MiB plan: 4 allocations in plain device
 * memory, the 3 it offloads in host memory), and the program runs unseen and exact. */
static void test_tracking_pauses_in_host_read_mode(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=64MiB");
    struct fs_device *dev = start_with_room(path, 64, "FLEXTENSOR_OFFLOAD_MODE=host_read");
    uint64_t w[L], act;
    alloc_program(dev, w, L, &act, 2 * MIB);
    assert_started_paused(L + 1);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.res.placed_on_host + st.res.plain_made, L + 1);
    assert_true(st.res.placed_on_host > 0);
    uint64_t seen = st.launch.launches; /* the launch counters live across engines */
    assert_int_equal(run_program(dev, w, L, act, 10), 0);
    fs_engine_get_stats(&st);
    assert_int_equal(st.launch.launches, seen);
    assert_int_equal(st.res.faults, 0);
    assert_int_equal(st.res.evictions, 0);
    assert_true(st.res.device_bytes_peak <= 64 * MIB);
    stop(dev);
    unlink(path);
}

/* Tracking stays on with PAUSE_TRACKING=0, and where the allocations do not all fit together (an
 * unused 40 MiB beside 68 MiB the plan keeps, within 100 MiB). A profile the program leaves
 * (another size for allocation 1) resumes it, since discovering the program needs its launches. */
static void test_tracking_kept_or_resumed_for_discovery(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile_unused(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB", 40 * MIB);
    uint64_t w[L], act, idle;
    struct fs_device *dev = start_with_room(path, 100, NULL);
    alloc_program(dev, w, L, &act, 2 * MIB);
    assert_int_equal(fs_engine_alloc(40 * MIB, 0, &idle), FS_OK);
    assert_int_equal(run_program(dev, w, L, act, 3), 0);
    struct fs_engine_stats st;
    fs_engine_get_stats(&st);
    assert_int_equal(st.exec.plans, 1);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(st.tracking_pauses, 0);
    stop(dev);

    dev = start_with_room(path, 128, "FLEXTENSOR_PAUSE_TRACKING=0");
    alloc_program(dev, w, L, &act, 2 * MIB);
    assert_int_equal(fs_engine_alloc(40 * MIB, 0, &idle), FS_OK);
    fs_engine_get_stats(&st);
    uint64_t seen = st.launch.launches; /* the launch counters live across engines */
    assert_int_equal(run_program(dev, w, L, act, 3), 0);
    fs_engine_get_stats(&st);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(st.tracking_pauses, 0);
    assert_int_equal(st.launch.launches - seen, 3 * PER_ITER);
    /* The plan moves nothing: once it found its place, the unused allocation stayed put. */
    assert_int_equal(st.exec.syncs, 1);
    assert_int_equal(st.res.evictions, 0);
    stop(dev);

    dev = start_with_room(path, 128, NULL);
    assert_int_equal(fs_engine_alloc(56 * MIB, 0, &act), FS_OK);
    assert_true(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(fs_engine_alloc(3 * MIB, 0, &w[0]), FS_OK); /* the profile has 2 MiB */
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(fs_engine_alloc(2 * MIB, 0, &w[1]), FS_OK); /* discovering: no pause */
    fs_engine_get_stats(&st);
    assert_false(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE));
    assert_int_equal(st.tracking_pauses, 1);
    assert_int_equal(st.tracking_resumes, 1);
    stop(dev);
    unlink(path);
}

/* A plan that moves nothing starts paused, the tracker not set up; an allocation that does not fit
 * (68 + 64 MiB > 128) sets it up. A tracker that refuses to pause again once that allocation is
 * freed (1): tracking goes on and is not paused again; what was frozen stays so. One that cannot
 * start (2): the pause stands, it is not tried again, and what does not fit is frozen on host,
 * read there, never faulted in. One that pauses again but fails, then cannot resume (3): the pause
 * stands, and the next allocation that does not fit is frozen on host. */
static void test_tracking_pause_failures(void **state)
{
    (void)state;
    char path[64];
    fresh_path(path, sizeof(path));
    record_profile(path, "FLEXTENSOR_GPU_MEMORY_LIMIT=128MiB");
    for (int refuses = 1; refuses <= 3; refuses++) {
        struct fs_device *dev = start_with_room(path, 128, NULL);
        tracker_refuses = refuses;
        uint64_t w[L], act, big, more;
        alloc_program(dev, w, L, &act, 2 * MIB);
        assert_started_paused(L + 1);
        struct fs_engine_stats st;
        assert_int_equal(fs_engine_alloc(64 * MIB, 0, &big), FS_OK);
        fs_stream s;
        assert_int_equal(fs_sim_stream_create(dev, &s), FS_OK);
        launch_on(dev, s, big);
        assert_int_equal(run_program(dev, w, L, act, 3), 0);
        fs_engine_get_stats(&st);
        assert_int_equal(tracker_starts, 1);
        assert_int_equal(st.res.placed_on_host, 1);
        assert_int_equal(st.res.evictions, 0); /* the frozen were not moved for it */
        assert_int_equal(st.res.faults, 0);
        assert_int_equal(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE), refuses == 2);
        assert_int_equal(st.tracking_resumes, refuses != 2);
        assert_int_equal(st.res.frozen, refuses == 2 ? L + 2 : L + 1);
        if (refuses != 2) {
            assert_int_equal(fs_engine_free(big), FS_OK); /* everything fits: pauses again */
            assert_int_equal(fs_engine_alloc(2 * MIB, 0, &more), FS_OK);
            assert_int_equal(fs_engine_free(more), FS_OK); /* refused: not tried again */
        }
        assert_int_equal(fs_engine_alloc(64 * MIB, 0, &more), FS_OK); /* does not fit */
        launch_on(dev, s, more);
        assert_int_equal(run_program(dev, w, L, act, 3), 0);
        fs_engine_get_stats(&st);
        assert_int_equal(tracker_starts, 1);
        assert_int_equal(st.tracking_pauses, refuses == 3 ? 2 : 1);
        assert_int_equal(st.tracking_resumes, refuses != 2);
        assert_int_equal(__atomic_load_n(&tracker_paused, __ATOMIC_ACQUIRE), refuses != 1);
        assert_int_equal(st.res.faults, 0);
        /* Tracked (1): MORE is managed as usual. Paused for good (2, 3): frozen where it went,
         * as was BIG (2) or the small one made meanwhile (3). */
        assert_int_equal(st.res.frozen, refuses == 1 ? L + 1 : L + 3);
        assert_int_equal(dev->ops->stream_destroy(dev, s), FS_OK);
        stop(dev);
    }
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_allocations_pass_through),
        cmocka_unit_test(test_mem_info_reports_the_budget),
        cmocka_unit_test(test_mem_info_device_view_passes_through),
        cmocka_unit_test(test_percentage_budget),
        cmocka_unit_test(test_other_device_passes_through_and_says_so),
        cmocka_unit_test(test_disabled_and_misconfigured_engine_manages_nothing),
        cmocka_unit_test(test_no_launch_tracking_means_unmanaged),
        cmocka_unit_test(test_allocation_failure_falls_back),
        cmocka_unit_test(test_profile_recorded_and_planned),
        cmocka_unit_test(test_marked_iterations),
        cmocka_unit_test(test_plan_runs_from_saved_profile),
        cmocka_unit_test(test_copy_wait_block),
        cmocka_unit_test_teardown(test_copy_wait_predict, copy_wait_predict_teardown),
        cmocka_unit_test(test_same_program),
        cmocka_unit_test(test_early_start),
        cmocka_unit_test(test_plan_places_new_allocations),
        cmocka_unit_test(test_plan_restages_what_was_pushed_out),
        cmocka_unit_test(test_run_trace),
        cmocka_unit_test(test_plan_headroom),
        cmocka_unit_test(test_host_read_mode),
        cmocka_unit_test(test_plan_reads_in_place),
        cmocka_unit_test(test_plan_of_other_planning_code_made_again),
        cmocka_unit_test(test_profiling_begins_under_capture),
        cmocka_unit_test(test_redirect_mode),
        cmocka_unit_test(test_redirect_late_reads_in_place),
        cmocka_unit_test(test_run_trace_stream_idle),
        cmocka_unit_test(test_timing_report),
        cmocka_unit_test(test_plan_tolerates_an_extra_launch),
        cmocka_unit_test(test_plan_given_up_and_made_again),
        cmocka_unit_test(test_mismatched_or_corrupt_profile_rediscovers),
        cmocka_unit_test(test_tracking_pauses_while_nothing_moves),
        cmocka_unit_test(test_tracking_pauses_with_reads_in_place),
        cmocka_unit_test(test_tracking_pauses_in_host_read_mode),
        cmocka_unit_test(test_tracking_kept_or_resumed_for_discovery),
        cmocka_unit_test(test_tracking_pause_failures),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    forget_recordings();
    return failed;
}

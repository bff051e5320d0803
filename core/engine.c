#include "engine.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"
#include "fs.h"
#include "log.h"
#include "recorder.h"
#include "residency.h"
#include "run_trace.h"
#include "timing_report.h"
#include "strategies/schedule.h"

/* The managed address range: 1 TiB, or less if the driver refuses (halving down to 16 GiB). */
#define VA_SPACE_BYTES (1ull << 40)
/* Spans the run trace keeps (a 7B decode step at half its weights makes about 1200). The
 * TRACE_OUT doc in config_params.h says this number. */
#define RUN_TRACE_SPANS 262144

enum start_state { NOT_STARTED, STARTED, START_FAILED };

static struct {
    struct fs_config cfg;
    bool cfg_ready;
    bool active;
    int start_state; /* atomic */
    pthread_mutex_t start_lock;
    const struct fs_tracker *tracker;
    struct fs_device *dev;
    bool dev_injected;
    struct fs_residency res;
    /* Planning, when PROFILE or PROFILE_OUT is set: discovery and profiling, then the plan. */
    bool planning;
    struct fs_recorder rec;
    struct fs_executor exec;
    /* Launch tracking paused (try_pause): PAUSING lets launches through untracked (atomic),
     * PAUSED says the tracker stopped reporting them, OPEN counts the tracked launches between
     * enter and exit while a pause is possible (atomic). */
    pthread_mutex_t pause_lock;
    bool can_pause;
    int pausing;
    bool paused;
    /* A run that starts paused sets the tracker up only when it resumes, and tries once. */
    enum { TRACKER_NOT_SET_UP, TRACKER_ON, TRACKER_FAILED } tracker_state;
    uint64_t open;
    pthread_t early;    /* fs_engine_start_early's thread */
    bool early_running; /* EARLY is to be joined */
    bool early_began;   /* EARLY decided to start the engine (atomic) */
    struct fs_engine_stats stats;
} eng = {.start_lock = PTHREAD_MUTEX_INITIALIZER, .pause_lock = PTHREAD_MUTEX_INITIALIZER};

#define STAT_ADD(field, n) __atomic_add_fetch(&eng.stats.field, (n), __ATOMIC_RELAXED)

static void apply_log_settings(const struct fs_config *cfg)
{
    fs_log_set_level((enum fs_log_level)fs_config_u64(cfg, FS_P_LOG_LEVEL));
    const char *file = fs_config_str(cfg, FS_P_LOG_FILE);
    if (fs_log_set_file(file) != FS_OK)
        FS_ERROR("FLEXTENSOR_LOG_FILE=%s: cannot open the file for appending; logging to stderr",
                 file);
}

/* Settings whose phase this version does not run: a user who sets one is told, rather than left
 * to guess why nothing happened. Discovery, profiling and planning run only with a profile to
 * start from (PROFILE) or to save (PROFILE_OUT). */
static void warn_inactive_settings(const struct fs_config *cfg)
{
    static const enum fs_param_id with_profile[] = {FS_P_STRATEGY, FS_P_DISCOVERY_ITERS,
                                                    FS_P_PROFILING_ITERS, FS_P_ITERATION_KERNEL,
                                                    FS_P_PLAN_HEADROOM, FS_P_OFFLOAD_MODE,
                                                    FS_P_LATE_PREFETCH, FS_P_PAUSE_TRACKING};
    if (cfg->v[FS_P_LATE_PREFETCH].src != FS_SRC_DEFAULT &&
        fs_config_u64(cfg, FS_P_OFFLOAD_MODE) != FS_OFFLOAD_REDIRECT)
        FS_WARN("%s is set but acts only with %s=redirect",
                fs_param_defs[FS_P_LATE_PREFETCH].env_name,
                fs_param_defs[FS_P_OFFLOAD_MODE].env_name);
    if (fs_config_str(cfg, FS_P_PROFILE_OUT)[0] || fs_config_str(cfg, FS_P_PROFILE)[0])
        return;
    for (size_t i = 0; i < FS_ARRAY_LEN(with_profile); i++)
        if (cfg->v[with_profile[i]].src != FS_SRC_DEFAULT)
            FS_WARN("%s is set but has no effect without FLEXTENSOR_PROFILE_OUT or "
                    "FLEXTENSOR_PROFILE: in this version discovery, profiling and planning run "
                    "only with a profile to save or to start from",
                    fs_param_defs[with_profile[i]].env_name);
}

static const char *env_value(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, n) && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

/* PyTorch settings under which its memory never reaches cudaMalloc (invariant 5: say so once,
 * with the fix). */
static void warn_unmanageable_setup(char *const *envp)
{
    const char *conf = env_value(envp, "PYTORCH_CUDA_ALLOC_CONF");
    if (!conf)
        conf = env_value(envp, "PYTORCH_ALLOC_CONF");
    if (!conf)
        return;
    if (strstr(conf, "expandable_segments:True") || strstr(conf, "expandable_segments:true"))
        FS_WARN("PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True: PyTorch then maps its own "
                "memory (cuMemCreate) and flexshim cannot manage it; remove that option");
    if (strstr(conf, "backend:cudaMallocAsync"))
        FS_WARN("PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync: stream-ordered pool "
                "memory passes through unmanaged; remove that option to use flexshim");
}

int fs_engine_init(char *const *envp)
{
    struct fs_config_errors errs = {0};
    int rc = fs_config_load(&eng.cfg, envp, &errs);
    eng.cfg_ready = true;
    apply_log_settings(&eng.cfg);
    if (rc != FS_OK) {
        for (int i = 0; i < errs.count; i++)
            FS_ERROR("%s", errs.msg[i]);
        FS_ERROR("configuration error: the program runs unmanaged (no memory limit); fix the "
                 "setting above, then check with 'flexshim-profile config --check'");
        eng.active = false;
        return FS_ERR_CONFIG;
    }
    eng.active = fs_config_u64(&eng.cfg, FS_P_ENABLED) != 0;
    FS_INFO("flexshim loaded (%s)", eng.active ? "enabled" : "disabled by FLEXTENSOR_ENABLED=0");
    if (eng.active) {
        warn_unmanageable_setup(envp);
        warn_inactive_settings(&eng.cfg);
    }
    return FS_OK;
}

void fs_engine_set_tracker(const struct fs_tracker *t)
{
    eng.tracker = t;
}

void fs_engine_use_device(struct fs_device *dev)
{
    eng.dev = dev;
    eng.dev_injected = dev != NULL;
}

const struct fs_config *fs_engine_config(void)
{
    if (!eng.cfg_ready) {
        fs_config_defaults(&eng.cfg);
        eng.cfg_ready = true;
    }
    return &eng.cfg;
}

bool fs_engine_active(void)
{
    return eng.active && __atomic_load_n(&eng.start_state, __ATOMIC_ACQUIRE) != START_FAILED;
}

static void format_bytes(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double d = (double)v;
    int u = 0;
    while (d >= 1024 && u < 4) {
        d /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", d, units[u]);
}

/* The recorder's fingerprints of the managed allocations (the residency takes them). */
static int fingerprint_allocs(void *arg, struct fs_fp *fp, bool *known, int n)
{
    (void)arg;
    return fs_res_fingerprint_all(&eng.res, fp, known, n);
}

/* The recorder hands over a finished plan. */
static bool take_plan(void *arg, struct fs_profile *p)
{
    (void)arg;
    int rc = fs_exec_install(&eng.exec, p);
    if (rc == FS_OK)
        FS_INFO("plan: running it from the next launch");
    else
        FS_WARN("plan: cannot run it (%s); allocations stay managed reactively", fs_err_str(rc));
    return true;
}

/* P's plan for BUDGET with the configured strategy: the saved one when it was made for the same
 * request by this planning code, else made again; made again because only the planning code
 * differed, the log says so for PATH (NULL: nothing said). FS_OK, or the planner's error;
 * STRATEGY (CAP bytes): the one asked. */
static int plan_profile(const struct fs_config *cfg, struct fs_profile *p, uint64_t budget,
                        const char *path, char *strategy, size_t cap)
{
    fs_config_choice(cfg, FS_P_STRATEGY, strategy, cap);
    bool same_request = p->plan.entries && p->plan.budget == budget &&
                        (cfg->v[FS_P_STRATEGY].src == FS_SRC_DEFAULT ||
                         strncmp(p->plan.strategy, strategy, strlen(strategy)) == 0);
    bool same_planner = strcmp(p->plan.planner, fs_planner_id()) == 0;
    if (same_request && same_planner)
        return FS_OK;
    if (same_request) {
        if (path)
            FS_INFO("%s: its plan was made by other planning code (%s; this flexshim's is %s); "
                    "planning it again", path, p->plan.planner[0] ? p->plan.planner : "unnamed",
                    fs_planner_id());
        /* "adaptive(global)": the strategy asked for, then the one it chose */
        if (cfg->v[FS_P_STRATEGY].src == FS_SRC_DEFAULT)
            snprintf(strategy, cap, "%.*s", (int)strcspn(p->plan.strategy, "("),
                     p->plan.strategy);
    }
    const struct fs_strategy *st = fs_strategy_find(strategy);
    fs_plan_free(&p->plan);
    return st ? st->plan(p, budget, &p->plan) : FS_ERR_INVALID;
}

/* Load the profile PATH for this device and BUDGET (or take LOADED, PATH as read already,
 * leaving it empty). Its saved plan runs as it is when this build's planning code made it for this
 * budget and strategy; otherwise it is planned again (milliseconds; said when only the planning
 * code differs, since an older flexshim's plan may be slower). False (said why) when the profile
 * cannot be used: discovery runs. */
static bool load_profile(const struct fs_config *cfg, const char *path, uint64_t budget,
                         struct fs_profile *loaded, struct fs_profile *p)
{
    char err[512];
    if (loaded) {
        *p = *loaded;
        memset(loaded, 0, sizeof(*loaded));
    } else if (fs_profile_load(path, p, err, sizeof(err)) != FS_OK) {
        FS_WARN("%s; discovering the program instead", err);
        return false;
    }
    const struct fs_device_props *d = &eng.dev->props;
    if (fs_profile_match_device(p, d->name, d->cc_major, d->cc_minor, d->total_bytes, err,
                                sizeof(err)) != FS_OK) {
        FS_WARN("%s: %s; discovering the program instead", path, err);
        fs_profile_free(p);
        return false;
    }
    char strategy[32];
    int rc = plan_profile(cfg, p, budget, path, strategy, sizeof(strategy));
    if (rc != FS_OK) {
        FS_WARN("%s: planning with %s for a budget of %llu bytes failed (%s); allocations are "
                "managed reactively", path, strategy, (unsigned long long)budget, fs_err_str(rc));
        return true; /* the program matches; there is just no plan to run */
    }
    FS_INFO("profile %s: %d launches per iteration, %d allocations; plan %s at %llu MiB, "
            "predicted %.3f ms per iteration; discovery and profiling skipped", path,
            p->nlaunches, p->nallocs, p->plan.strategy, (unsigned long long)(budget >> 20),
            p->plan.predicted_us / 1000);
    return true;
}

static void stop_planning(void)
{
    if (!eng.planning)
        return;
    fs_exec_destroy(&eng.exec);
    fs_rec_destroy(&eng.rec);
    eng.planning = false;
}

/* Discovery and planning (PROFILE_OUT), or a saved profile (PROFILE), and the plan executor. */
/* Pin host memory for what the plan offloads now, while the program is still starting; none for
 * a plan that moves nothing: what it reads in place is pinned as it is made, and an idle pinner
 * thread costs a paused step (stop 31). */
static void prepin_offloaded(const struct fs_profile *p)
{
    if (p->nallocs <= 0 || fs_plan_moves_nothing(p, &p->plan))
        return;
    uint64_t *sizes = malloc((size_t)p->nallocs * sizeof(*sizes));
    if (!sizes)
        return;
    int n = 0;
    for (int i = 0; i < p->nallocs; i++)
        if (!p->plan.entries[i].resident)
            sizes[n++] = p->allocs[i].mapped;
    fs_res_prepin(&eng.res, sizes, n);
    free(sizes);
}

/* The budget plans are made for: GPU_MEMORY_LIMIT less PLAN_HEADROOM (the limit itself when the
 * headroom is not less, said when SAY). The default headroom is at most 1/32 of the limit, so a
 * small limit keeps most of its room for the plan. */
static uint64_t plan_budget(const struct fs_config *cfg, uint64_t budget, bool say)
{
    uint64_t room = fs_config_u64(cfg, FS_P_PLAN_HEADROOM);
    if (cfg->v[FS_P_PLAN_HEADROOM].src == FS_SRC_DEFAULT && room > budget / 32)
        room = budget / 32;
    if (room < budget)
        return budget - room;
    if (say)
        FS_WARN("%s (%llu MiB) is not less than the budget (%llu MiB); it is ignored (lower it or "
                "raise %s)", fs_param_defs[FS_P_PLAN_HEADROOM].env_name,
                (unsigned long long)(room >> 20), (unsigned long long)(budget >> 20),
                fs_param_defs[FS_P_GPU_MEMORY_LIMIT].env_name);
    return budget;
}

static int start_planning(const struct fs_config *cfg, uint64_t limit, struct fs_profile *loaded)
{
    uint64_t budget = plan_budget(cfg, limit, true);
    const char *in = fs_config_str(cfg, FS_P_PROFILE), *out = fs_config_str(cfg, FS_P_PROFILE_OUT);
    if (!in[0] && !out[0])
        return FS_OK;
    int rc = fs_exec_init(&eng.exec, &eng.res);
    if (rc != FS_OK)
        return rc;
    fs_exec_set_offload_mode(&eng.exec,
                             (enum fs_offload_mode)fs_config_u64(cfg, FS_P_OFFLOAD_MODE),
                             fs_config_u64(cfg, FS_P_LATE_PREFETCH) == 1);
    struct fs_profile p = {0};
    bool from_profile = in[0] && load_profile(cfg, in, budget, loaded, &p);
    char strategy[32];
    struct fs_rec_config rec = {
        .discovery_iters = (int)fs_config_u64(cfg, FS_P_DISCOVERY_ITERS),
        .profiling_iters = (int)fs_config_u64(cfg, FS_P_PROFILING_ITERS),
        .budget = budget,
        .strategy = fs_config_choice(cfg, FS_P_STRATEGY, strategy, sizeof(strategy)),
        .out_path = out,
        .iteration_kernel = fs_config_str(cfg, FS_P_ITERATION_KERNEL),
        .idle = from_profile,
        .on_plan = take_plan,
        .fingerprint = fingerprint_allocs,
    };
    rc = fs_rec_init(&eng.rec, eng.dev, &rec);
    if (rc != FS_OK) {
        fs_profile_free(&p);
        fs_exec_destroy(&eng.exec);
        return rc;
    }
    eng.planning = true;
    if (from_profile && p.plan.entries)
        prepin_offloaded(&p);
    if (from_profile && p.plan.entries && fs_exec_install(&eng.exec, &p) != FS_OK)
        FS_WARN("%s: its plan does not fit its own profile; allocations are managed reactively",
                in);
    fs_profile_free(&p);
    return FS_OK;
}

/* The device to manage: FLEXTENSOR_DEVICE when set, else WANT, the device of the program's first
 * call that starts the engine (each process of a torchrun job then manages its own), else 0. */
static int device_to_manage(const struct fs_config *cfg, int want)
{
    if (cfg->v[FS_P_DEVICE].src != FS_SRC_DEFAULT || want < 0)
        return (int)fs_config_u64(cfg, FS_P_DEVICE);
    return want;
}

static int start_locked(int want, struct fs_profile *loaded)
{
    const struct fs_config *cfg = fs_engine_config();
    int ordinal = device_to_manage(cfg, want);
    int rc = FS_OK;
    if (!eng.dev) {
        rc = fs_device_cuda_open(ordinal, &eng.dev);
        if (rc != FS_OK) {
            FS_WARN("no usable CUDA device %d (%s): the program runs unmanaged", ordinal,
                    fs_err_str(rc));
            eng.dev = NULL;
            return rc;
        }
    }
    const struct fs_device_props *p = &eng.dev->props;
    if (!p->host_phys_supported) {
        FS_WARN("device %d (%s) cannot map pinned host memory at a device address, which "
                "eviction needs: the program runs unmanaged", ordinal, p->name);
        rc = FS_ERR_UNSUPPORTED;
        goto fail_dev;
    }
    uint64_t budget = fs_config_bytes(cfg, FS_P_GPU_MEMORY_LIMIT, p->total_bytes);
    struct fs_res_config rcfg = {
        .budget = budget,
        .va_space_bytes = VA_SPACE_BYTES,
        .background_pinning = fs_config_u64(cfg, FS_P_PIN_MODE) == 0,
        .strict_remap = fs_config_u64(cfg, FS_P_REMAP_SAFETY) == 0,
        .fingerprint = fs_config_u64(cfg, FS_P_WRITEBACK) == 0,
        .copy_wait = (enum fs_copy_wait)fs_config_u64(cfg, FS_P_COPY_WAIT),
    };
    rc = fs_res_init(&eng.res, eng.dev, &rcfg);
    if (rc != FS_OK) {
        FS_WARN("cannot set up managed memory (%s): the program runs unmanaged", fs_err_str(rc));
        goto fail_dev;
    }
    rc = fs_launch_init(eng.dev);
    if (rc != FS_OK)
        goto fail_res;
    rc = start_planning(cfg, budget, loaded);
    if (rc != FS_OK)
        goto fail_launch;
    if (eng.tracker) {
        /* Before the first report: launches count themselves open only where a pause may come
         * (a plan can move nothing only with a profile). */
        bool can_pause = eng.tracker->pause && eng.planning &&
                         fs_config_u64(cfg, FS_P_PAUSE_TRACKING) != 0;
        __atomic_store_n(&eng.can_pause, can_pause, __ATOMIC_RELAXED);
        if (can_pause && !fs_rec_active(&eng.rec) && fs_exec_moves_nothing(&eng.exec) &&
            fs_res_freeze(&eng.res) == FS_OK) {
            /* A tracker set up and then paused still costs the program's launches time (CUPTI,
             * measured on an H100 decode); this one is set up only if tracking must resume. */
            __atomic_store_n(&eng.pausing, 1, __ATOMIC_SEQ_CST);
            eng.paused = true;
            STAT_ADD(tracking_pauses, 1);
            FS_INFO("launch tracking starts paused: the plan moves nothing and every allocation "
                    "fits (what it reads in place stays in host memory); it is set up only if "
                    "that changes");
        } else {
            rc = eng.tracker->start();
            if (rc != FS_OK) {
                FS_WARN("without launch tracking the program runs unmanaged");
                goto fail_rec; /* the tracker said why */
            }
            eng.tracker_state = TRACKER_ON;
        }
    }
    eng.stats.budget = budget;
    if (fs_config_str(cfg, FS_P_TRACE_OUT)[0] && !fs_rt_on() &&
        fs_rt_open(RUN_TRACE_SPANS) != FS_OK)
        FS_WARN("%s: no memory for the run trace (%d spans); it is not written",
                fs_param_defs[FS_P_TRACE_OUT].env_name, RUN_TRACE_SPANS);
    char b1[32], b2[32], b3[32];
    format_bytes(budget, b1, sizeof(b1));
    format_bytes(p->total_bytes, b2, sizeof(b2));
    format_bytes(fs_config_u64(cfg, FS_P_MIN_OFFLOAD_BYTES), b3, sizeof(b3));
    FS_INFO("managing device %d (%s, %s): budget %s for allocations of %s and more", ordinal,
            p->name, b2, b1, b3);
    return FS_OK;
fail_rec:
    stop_planning();
fail_launch:
    fs_launch_shutdown();
fail_res:
    fs_res_destroy(&eng.res);
fail_dev:
    if (!eng.dev_injected) {
        eng.dev->ops->close(eng.dev);
        eng.dev = NULL;
    }
    return rc;
}

/* Start unless started or failed (WANT: the device the call is about, -1 unknown; LOADED: the
 * PROFILE as read already, or NULL); FS_OK once started. */
static int start_once(int want, struct fs_profile *loaded)
{
    int state = __atomic_load_n(&eng.start_state, __ATOMIC_ACQUIRE);
    if (FS_LIKELY(state == STARTED))
        return FS_OK;
    if (state == START_FAILED || !eng.active)
        return FS_ERR_UNSUPPORTED;
    pthread_mutex_lock(&eng.start_lock);
    state = __atomic_load_n(&eng.start_state, __ATOMIC_ACQUIRE);
    if (state == NOT_STARTED) {
        state = start_locked(want, loaded) == FS_OK ? STARTED : START_FAILED;
        __atomic_store_n(&eng.start_state, state, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&eng.start_lock);
    return state == STARTED ? FS_OK : FS_ERR_UNSUPPORTED;
}

/* Start on first use. */
static int ensure_started(int want)
{
    return start_once(want, NULL);
}

static bool started(void)
{
    return __atomic_load_n(&eng.start_state, __ATOMIC_ACQUIRE) == STARTED;
}

/* Is exactly one device visible to this process? Told without initialising the driver where
 * possible: a driver initialised now would ignore a CUDA_VISIBLE_DEVICES the program sets itself
 * later, so with several GPUs and no CUDA_VISIBLE_DEVICES the answer is no at once. */
static bool one_device_visible(void)
{
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible)
        return visible[0] && !strchr(visible, ',');
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    int gpus = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        gpus += e->d_name[0] != '.';
    if (d)
        closedir(d);
    int count = 0;
    return gpus <= 1 && fs_device_cuda_count(&count) == FS_OK && count == 1;
}

/* A child forked once the early start began would inherit the start lock held by a thread it
 * does not have, or a started engine without its threads and context: it runs unmanaged (a child
 * forked before then starts the engine itself, as always). */
static void early_start_forked_child(void)
{
    eng.early_running = false; /* the thread is the parent's */
    if (!__atomic_load_n(&eng.early_began, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    eng.start_lock = lock;
    eng.active = false;
    __atomic_store_n(&eng.start_state, START_FAILED, __ATOMIC_RELEASE);
}

static int atfork_rc = -1;

static void register_atfork(void)
{
    atfork_rc = pthread_atfork(NULL, NULL, early_start_forked_child);
}

/* Profile P's plan for this budget (the one the engine would run, planned here on a copy, or P
 * fits whole) moves nothing (fs_plan_moves_nothing): there is nothing to pin early, since what it
 * reads in place is pinned as it is made, and the engine starts at the program's first call. An
 * early start, and the pinner thread it starts, each cost a paused decode step about 5% (an
 * H100, docs/PERFORMANCE.md, stops 30 and 31). */
static bool moves_nothing_here(const struct fs_config *cfg, const struct fs_profile *p)
{
    uint64_t limit = fs_config_bytes(cfg, FS_P_GPU_MEMORY_LIMIT, p->device_total);
    uint64_t budget = plan_budget(cfg, limit, false);
    if (fs_profile_total_mapped(p) <= budget)
        return true;
    struct fs_profile q = *p; /* P's launches and allocations, read only; a plan of its own */
    if (p->plan.entries && fs_plan_copy(&q.plan, &p->plan) != FS_OK)
        return false;
    char strategy[32];
    bool still = plan_profile(cfg, &q, budget, NULL, strategy, sizeof(strategy)) == FS_OK &&
                 fs_plan_moves_nothing(&q, &q.plan);
    fs_plan_free(&q.plan);
    return still;
}

static void *early_start_main(void *arg)
{
    (void)arg;
    fs_thread_internal = true;
    const struct fs_config *cfg = fs_engine_config();
    struct fs_profile p = {0};
    char err[512];
    if (fs_profile_load(fs_config_str(cfg, FS_P_PROFILE), &p, err, sizeof(err)) != FS_OK)
        return NULL; /* said when the engine starts and loads it */
    /* The device check last: it loads and initialises the driver on this thread, before the
     * program's main(), which a plan that moves nothing never needs. (It was not the paused
     * engine's 4-9% at decode 100%: docs/PERFORMANCE.md, stop 39.) */
    if (fs_rec_is_this_program(p.program) && !moves_nothing_here(cfg, &p) &&
        (eng.dev_injected || cfg->v[FS_P_DEVICE].src != FS_SRC_DEFAULT || one_device_visible())) {
        __atomic_store_n(&eng.early_began, true, __ATOMIC_RELEASE);
        FS_INFO("starting early: the profile is this program's; pinning what its plan offloads");
        start_once(-1, &p); /* takes P, unless the program's first call started the engine */
    }
    fs_profile_free(&p);
    return NULL;
}

void fs_engine_start_early(void)
{
    const struct fs_config *cfg = fs_engine_config();
    if (!eng.active || !fs_config_str(cfg, FS_P_PROFILE)[0] ||
        fs_config_u64(cfg, FS_P_PIN_MODE) != 0)
        return;
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    if (atfork_rc != 0)
        return; /* a fork could deadlock the child: the engine starts at first use */
    eng.early_running = pthread_create(&eng.early, NULL, early_start_main, NULL) == 0;
}

bool fs_engine_started(void)
{
    return started();
}

/* ---- pausing launch tracking ------------------------------------------------------------------
 * While the plan moves nothing (fs_plan_moves_nothing) and every allocation is on the device, or
 * in host memory where the plan reads it in place, watching launches only costs time (CUPTI's
 * callbacks, about 0.5 us a launch: a few percent of a launch-bound step), so tracking pauses. A
 * plan from a profile that moves nothing starts paused, the tracker not even set up
 * (tracker_resume sets it up if tracking must resume). Launches the engine does not see may use
 * any allocation that exists, at any time, so every allocation then is frozen where it is (never
 * moved again, residency.h): one on host is read there over the link by any launch, as its plan
 * has it; so is every one placed while paused. An allocation that does not fit resumes tracking
 * before the program gets it; it, and the ones after it, are managed as usual among themselves.
 *
 * The switch: launches already being tracked must end first (their exit reports would be lost),
 * so PAUSING is set, the tracked launches in flight (OPEN) are waited for, and only then is the
 * tracker stopped; a launch that begins meanwhile sees PAUSING and passes untracked. Once a launch
 * may have passed untracked, what is frozen stays frozen, whatever happens after.
 *
 * Resuming always takes PAUSE_LOCK (a switch in progress holds it to its end): an allocation
 * placed on host while another thread pauses, or a plan given up meanwhile, then sees the pause
 * and resumes it. If the tracker cannot resume, the allocation is frozen too (on host: read
 * over the link) and tracking stays paused: nothing may move while launches go unseen. */

/* Tracking may pause in this run (atomic: cleared under PAUSE_LOCK when the tracker fails). */
static bool may_pause(void)
{
    return __atomic_load_n(&eng.can_pause, __ATOMIC_RELAXED);
}

/* Tracking may be paused now, or be pausing on another thread. */
static bool pause_possible(void)
{
    return may_pause() || __atomic_load_n(&eng.pausing, __ATOMIC_ACQUIRE);
}

/* Called by the program's allocation and free calls (never from a launch report). */
static void try_pause(void)
{
    if (!may_pause() || __atomic_load_n(&eng.pausing, __ATOMIC_ACQUIRE) ||
        fs_rec_active(&eng.rec) || !fs_exec_moves_nothing(&eng.exec))
        return;
    pthread_mutex_lock(&eng.pause_lock);
    if (eng.pausing || fs_res_freeze(&eng.res) != FS_OK)
        goto out;
    __atomic_store_n(&eng.pausing, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&eng.open, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
    /* A tracked launch's exit may have given the plan up (discovery needs the launches). */
    bool still = !fs_rec_active(&eng.rec) && fs_exec_moves_nothing(&eng.exec);
    if (still && eng.tracker->pause(true) == FS_OK) {
        eng.paused = true;
        STAT_ADD(tracking_pauses, 1);
        FS_INFO("launch tracking paused: the plan moves nothing and every allocation fits (what "
                "it reads in place stays in host memory)");
        goto out;
    }
    if (still) {
        /* Some reports may be off: all on again, or the pause stands. */
        __atomic_store_n(&eng.can_pause, false, __ATOMIC_RELAXED);
        if (eng.tracker->pause(false) != FS_OK) {
            eng.paused = true;
            STAT_ADD(tracking_pauses, 1);
            FS_WARN("launch tracking could neither pause fully nor resume: it stays paused and "
                    "nothing moves from now on");
            goto out;
        }
        FS_WARN("launch tracking could not pause; it goes on");
    }
    __atomic_store_n(&eng.pausing, 0, __ATOMIC_SEQ_CST);
    fs_res_stop_freezing(&eng.res);
out:
    pthread_mutex_unlock(&eng.pause_lock);
}

/* The tracker reporting again: set up now if the run started paused (once: a tracker that could
 * not be set up is not tried again). PAUSE_LOCK held. */
static int tracker_resume(void)
{
    if (eng.tracker_state == TRACKER_ON)
        return eng.tracker->pause(false);
    if (eng.tracker_state == TRACKER_FAILED)
        return FS_ERR_UNSUPPORTED;
    int rc = eng.tracker->start();
    eng.tracker_state = rc == FS_OK ? TRACKER_ON : TRACKER_FAILED;
    return rc;
}

/* Track launches again if they are not (WHY: a line for the log); NEW_VA: an allocation not yet
 * handed to the program (0: none), frozen if tracking cannot resume. Rare: the caller checked
 * that something needs it. */
static void resume_tracking(const char *why, fs_dptr new_va)
{
    pthread_mutex_lock(&eng.pause_lock);
    if (!eng.pausing)
        goto out;
    if (eng.paused && tracker_resume() != FS_OK) {
        if (new_va)
            fs_res_freeze_alloc(&eng.res, new_va);
        FS_WARN("%s, but launch tracking cannot resume: it stays paused and nothing moves (the "
                "allocation works where it is)", why);
        goto out;
    }
    eng.paused = false;
    __atomic_store_n(&eng.pausing, 0, __ATOMIC_SEQ_CST);
    fs_res_stop_freezing(&eng.res);
    STAT_ADD(tracking_resumes, 1);
    struct fs_res_stats r;
    fs_res_get_stats(&eng.res, &r);
    FS_WARN("%s: launch tracking resumed; the allocations frozen while it was paused (%llu in "
            "this run) stay where they are, and what does not fit beside them works from "
            "host memory (record the profile again at this budget, or set %s=0)", why,
            (unsigned long long)r.frozen, fs_param_defs[FS_P_PAUSE_TRACKING].env_name);
out:
    pthread_mutex_unlock(&eng.pause_lock);
}

int fs_engine_alloc(uint64_t size, int ordinal, uint64_t *ptr_out)
{
    if (!eng.active || size < fs_config_u64(&eng.cfg, FS_P_MIN_OFFLOAD_BYTES))
        return FS_ERR_UNSUPPORTED;
    if (ensure_started(ordinal) != FS_OK)
        return FS_ERR_UNSUPPORTED;
    if (ordinal != eng.dev->props.ordinal) {
        FS_LOG_ONCE(FS_LOG_WARN, "allocations on device %d pass through unmanaged: flexshim "
                    "manages one device per process, device %d (set FLEXTENSOR_DEVICE)",
                    ordinal, eng.dev->props.ordinal);
        return FS_ERR_UNSUPPORTED;
    }
    fs_dptr va;
    int rc = fs_res_alloc(&eng.res, size, &va);
    if (rc != FS_OK) {
        /* Invariant 4: an internal failure falls back to a plain allocation. */
        FS_WARN("managing a %llu-byte allocation failed (%s); it passes through",
                (unsigned long long)size, fs_err_str(rc));
        return FS_ERR_UNSUPPORTED;
    }
    STAT_ADD(managed_allocs, 1);
    STAT_ADD(managed_bytes, size);
    const struct fs_alloc *a = fs_res_find(&eng.res, va);
    if (eng.planning) {
        const char *why = NULL;
        fs_rec_note_alloc(&eng.rec, a->id, a->size, a->mapped);
        if (fs_exec_note_alloc(&eng.exec, a->id, a->size, &why) != FS_OK) {
            FS_WARN("the plan's profile does not match this program: %s; discovering it again",
                    why);
            if (pause_possible())
                resume_tracking("the program left its profile", 0);
            fs_rec_restart(&eng.rec);
        }
    }
    /* Also while a pause is under way on another thread (resume_tracking waits for it). One
     * frozen on host is read in place there by the plan. */
    if (FS_UNLIKELY(pause_possible()) && !fs_res_on_device(a) && !fs_res_frozen(&eng.res, a)) {
        char line[96];
        snprintf(line, sizeof(line), "an allocation of %llu bytes does not fit the budget",
                 (unsigned long long)size);
        resume_tracking(line, va);
    }
    try_pause();
    *ptr_out = va;
    return FS_OK;
}

void fs_engine_note_passthrough(uint64_t size)
{
    STAT_ADD(passthrough_allocs, 1);
    STAT_ADD(passthrough_bytes, size);
}

int fs_engine_free(uint64_t ptr)
{
    STAT_ADD(free_calls, 1);
    if (!started())
        return FS_ERR_NOT_FOUND;
    int rc = fs_res_free(&eng.res, ptr);
    if (rc == FS_OK)
        try_pause();
    return rc;
}

bool fs_engine_owns(uint64_t ptr, int *ordinal)
{
    if (!started())
        return false;
    STAT_ADD(pointer_queries, 1);
    if (!fs_res_lookup(&eng.res, ptr))
        return false;
    *ordinal = eng.dev->props.ordinal;
    return true;
}

int fs_engine_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes)
{
    if (fs_config_u64(&eng.cfg, FS_P_MEMINFO_VIEW) != 0 || ensure_started(ordinal) != FS_OK ||
        (ordinal >= 0 && ordinal != eng.dev->props.ordinal))
        return FS_ERR_UNSUPPORTED;
    STAT_ADD(meminfo_queries, 1);
    uint64_t dev_free, dev_total;
    int rc = fs_dev_call(eng.dev, mem_info, &dev_free, &dev_total);
    if (rc != FS_OK)
        return rc;
    /* The budget's view: what managed allocations may still take, never more than is free. */
    uint64_t total = eng.stats.budget < dev_total ? eng.stats.budget : dev_total;
    uint64_t used = fs_res_device_bytes(&eng.res);
    uint64_t left = used < total ? total - used : 0;
    *total_bytes = total;
    *free_bytes = left < dev_free ? left : dev_free;
    return FS_OK;
}

void fs_engine_launch_enter(const struct fs_launch_desc *d, struct fs_launch_ticket *t)
{
    if (FS_UNLIKELY(!started())) {
        t->active = false;
        return;
    }
    /* Counted only where tracking may pause: no shared counter on every launch otherwise. */
    t->counted = may_pause();
    if (t->counted)
        __atomic_add_fetch(&eng.open, 1, __ATOMIC_SEQ_CST);
    if (FS_UNLIKELY(__atomic_load_n(&eng.pausing, __ATOMIC_SEQ_CST))) {
        if (t->counted)
            __atomic_sub_fetch(&eng.open, 1, __ATOMIC_SEQ_CST);
        t->active = false;
        return;
    }
    uint64_t t0 = fs_rec_active(&eng.rec) ? fs_now_ns() : 0;
    fs_launch_scan(&eng.res, d, t);
    t->t_enter_ns = t0;
    fs_exec_launch_enter(&eng.exec, t);
    fs_launch_hold(&eng.res, t);
    if (fs_rec_active(&eng.rec))
        fs_rec_launch_start(&eng.rec, t->stream);
}

void fs_engine_launch_exit(struct fs_launch_ticket *t, bool queued)
{
    if (!t->active)
        return;
    bool record = queued && fs_rec_active(&eng.rec);
    uint64_t orders[FS_LAUNCH_MAX_REFS];
    int n = t->n;
    for (int i = 0; record && i < n; i++) /* read while the launch still holds them */
        orders[i] = t->refs[i]->id;
    fs_launch_exit(&eng.res, t, queued);
    fs_exec_launch_exit(&eng.exec, t);
    if (record)
        fs_rec_launch(&eng.rec, t->func, t->sig, t->stream, orders, n, t->t_enter_ns);
    if (FS_UNLIKELY(eng.planning && fs_exec_take_give_up(&eng.exec)))
        fs_rec_restart(&eng.rec);
    if (t->counted)
        __atomic_sub_fetch(&eng.open, 1, __ATOMIC_SEQ_CST);
}

void fs_engine_get_stats(struct fs_engine_stats *out)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(out, &eng.stats, sizeof(*out));
    if (started())
        fs_res_get_stats(&eng.res, &out->res);
    fs_launch_get_stats(&out->launch);
    if (started() && eng.planning)
        fs_exec_get_stats(&eng.exec, &out->exec);
}

uint64_t fs_engine_late_waits(void)
{
    if (!started() || !eng.planning)
        return 0;
    struct fs_exec_stats st;
    fs_exec_get_stats(&eng.exec, &st);
    return st.late;
}

uint64_t fs_engine_iterations_followed(void)
{
    if (!started() || !eng.planning)
        return 0;
    return fs_exec_iterations(&eng.exec);
}

void fs_engine_mark_iteration(void)
{
    if (started() && eng.planning)
        fs_rec_mark_iteration(&eng.rec);
}

void fs_engine_drain_moves(void)
{
    if (started() && eng.planning)
        fs_exec_drain(&eng.exec);
}

int fs_engine_host_blocks(uint64_t *alloc_va, uint64_t *block_va, int max)
{
    if (__atomic_load_n(&eng.start_state, __ATOMIC_ACQUIRE) != STARTED)
        return 0;
    return fs_res_host_blocks(&eng.res, alloc_va, block_va, max);
}

/* CUDA is in use but no allocation reached the hooks: cudart is linked statically (nvcc's
 * default) or the program allocates with the driver API. */
static void warn_if_nothing_seen(const struct fs_engine_stats *s)
{
    if (!eng.active || s->managed_allocs || s->passthrough_allocs)
        return;
    void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!cuda)
        return;
    dlclose(cuda);
    FS_WARN("the program used the CUDA driver but no cudaMalloc reached flexshim: it probably "
            "links the CUDA runtime statically (nvcc's default) or allocates with the driver API; "
            "rebuild with 'nvcc -cudart shared' so its allocations can be managed");
}

/* The executor's counters, and no moves from now on while the program's libraries shut down. */
static void stop_and_log_plan(const struct fs_engine_stats *s)
{
    const struct fs_exec_stats x = s->exec;
    fs_exec_shutdown(&eng.exec);
    FS_INFO("plan: %llu installed; %llu launches followed (%llu of the plan's skipped, %llu "
            "extra), %llu departures, %llu launches run reactively, found %llu times; %llu "
            "prefetches (%llu bytes moved in) and %llu evictions queued; %llu late and %llu "
            "unplanned references; %.1f ms waited for late prefetches; %llu references "
            "ordered after a prefetch's copy on their stream (%llu prefetches mapped early); "
            "%llu evictions skipped (in use), %llu failed moves, %llu dropped, %llu give-ups; "
            "%llu moves overlapped (at most %llu at once); %llu evictions begun ahead of a "
            "prefetch waiting for room; %llu prefetches queued by a launch that found none on "
            "the way; %llu evictions' host mappings moved ahead for a prefetch of theirs, %llu "
            "put off for a prefetch's mapping",
            (unsigned long long)x.plans, (unsigned long long)x.synced,
            (unsigned long long)x.skipped, (unsigned long long)x.extra,
            (unsigned long long)x.departures, (unsigned long long)x.lost_launches,
            (unsigned long long)x.syncs, (unsigned long long)x.prefetches,
            (unsigned long long)s->res.prefetched_bytes, (unsigned long long)x.evictions,
            (unsigned long long)x.late, (unsigned long long)x.unplanned,
            (double)x.late_wait_ns / 1e6, (unsigned long long)s->res.ordered_waits,
            (unsigned long long)s->res.early_maps, (unsigned long long)x.evict_busy,
            (unsigned long long)x.move_failures,
            (unsigned long long)x.dropped, (unsigned long long)x.give_ups,
            (unsigned long long)x.overlapped, (unsigned long long)x.max_inflight,
            (unsigned long long)x.passed, (unsigned long long)x.restaged,
            (unsigned long long)x.host_maps_first, (unsigned long long)x.host_maps_put_off);
    if (x.idle.measured + x.idle.missed > 0)
        FS_INFO("plan: the launches' streams had run out of work for %.1f ms of those waits "
                "(%llu waits measured, %llu not; measured only with the run trace on)",
                (double)x.idle.idle_ns / 1e6, (unsigned long long)x.idle.measured,
                (unsigned long long)x.idle.missed);
    if (s->res.ordered_wait.measured + s->res.ordered_wait.missed > 0)
        FS_INFO("plan: the launches ordered after a prefetch's copy waited %.1f ms for it on the "
                "device (%llu launches measured, %llu not; measured only with the run trace on)",
                (double)s->res.ordered_wait.idle_ns / 1e6,
                (unsigned long long)s->res.ordered_wait.measured,
                (unsigned long long)s->res.ordered_wait.missed);
}

/* A file setting (TIMING_REPORT, TRACE_OUT) whose file could not be written (errno says why). */
static void warn_unwritable(enum fs_param_id id, const char *path, const char *what)
{
    FS_WARN("%s=%s: cannot write the %s (%s); check that the folder exists and is writable",
            fs_param_defs[id].env_name, path, what, strerror(errno));
}

/* The timing report (TIMING_REPORT), for a run that managed DEVICE (NULL: none). */
static void write_timing_report(const struct fs_engine_stats *s, const char *device)
{
    const char *path = fs_config_str(fs_engine_config(), FS_P_TIMING_REPORT);
    char text[4096];
    if (!path[0])
        return;
    fs_timing_report(s, device, eng.planning, text, sizeof(text));
    if (fs_timing_report_write(path, text) != FS_OK)
        warn_unwritable(FS_P_TIMING_REPORT, path, "timing report");
}

/* The run trace, once the engine's threads stopped moving. */
static void write_run_trace(void)
{
    const char *path = fs_config_str(fs_engine_config(), FS_P_TRACE_OUT);
    uint64_t kept = 0, dropped = 0;
    if (!fs_rt_on())
        return;
    if (fs_rt_write(path, &kept, &dropped) != FS_OK)
        warn_unwritable(FS_P_TRACE_OUT, path, "run trace");
    else
        FS_INFO("run trace: %llu spans written to %s; %llu later ones did not fit",
                (unsigned long long)kept, path, (unsigned long long)dropped);
}

/* Where the driver's remap time went: the cost that decides how fast allocations can move
 * (DESIGN.md: host memory's set access is the slow part). */
static void log_remaps(const struct fs_res_stats *r)
{
    FS_INFO("remaps: %llu device maps %.1f ms, %llu host maps %.1f ms, %llu device unmaps "
            "%.1f ms, %llu host unmaps %.1f ms (host time in the driver)",
            (unsigned long long)r->remaps[FS_REMAP_MAP][FS_LOC_DEVICE],
            (double)r->remap_ns[FS_REMAP_MAP][FS_LOC_DEVICE] / 1e6,
            (unsigned long long)r->remaps[FS_REMAP_MAP][FS_LOC_HOST],
            (double)r->remap_ns[FS_REMAP_MAP][FS_LOC_HOST] / 1e6,
            (unsigned long long)r->remaps[FS_REMAP_UNMAP][FS_LOC_DEVICE],
            (double)r->remap_ns[FS_REMAP_UNMAP][FS_LOC_DEVICE] / 1e6,
            (unsigned long long)r->remaps[FS_REMAP_UNMAP][FS_LOC_HOST],
            (double)r->remap_ns[FS_REMAP_UNMAP][FS_LOC_HOST] / 1e6);
}

static void join_early_start(void)
{
    if (eng.early_running)
        pthread_join(eng.early, NULL);
    eng.early_running = false;
}

void fs_engine_shutdown(void)
{
    join_early_start();
    struct fs_engine_stats s;
    fs_engine_get_stats(&s);
    warn_if_nothing_seen(&s);
    FS_INFO("allocations: %llu managed (%llu bytes), %llu passed through (%llu bytes); %llu frees; "
            "%llu pointer queries, %llu memory-info queries",
            (unsigned long long)s.managed_allocs, (unsigned long long)s.managed_bytes,
            (unsigned long long)s.passthrough_allocs, (unsigned long long)s.passthrough_bytes,
            (unsigned long long)s.free_calls, (unsigned long long)s.pointer_queries,
            (unsigned long long)s.meminfo_queries);
    if (!started()) {
        write_timing_report(&s, NULL);
        return;
    }
    char budget[32], peak[32], held[32];
    format_bytes(s.budget, budget, sizeof(budget));
    format_bytes(s.res.device_bytes_peak, peak, sizeof(peak));
    format_bytes(s.res.host_bytes_held, held, sizeof(held));
    FS_INFO("residency: budget %s, device peak %s, pinned host %s; %llu evictions (%llu bytes), "
            "%llu fault-ins (%llu bytes), %llu placed on host, %llu host-served references, "
            "%llu forced synchronizes, %llu internal failures; device blocks %llu made (%.1f ms), "
            "%llu given back for another size (%.1f ms); background pinner %s (%llu blocks)",
            budget, peak, held, (unsigned long long)s.res.evictions,
            (unsigned long long)s.res.evicted_bytes, (unsigned long long)s.res.faults,
            (unsigned long long)s.res.faulted_bytes, (unsigned long long)s.res.placed_on_host,
            (unsigned long long)s.res.host_served, (unsigned long long)s.res.quiesce_syncs,
            (unsigned long long)s.res.failures, (unsigned long long)s.res.device_blocks.made,
            (double)s.res.device_blocks.made_ns / 1e6,
            (unsigned long long)s.res.device_blocks.released,
            (double)s.res.device_blocks.released_ns / 1e6,
            s.res.pinner_starts ? "started" : "not started",
            (unsigned long long)s.res.background_pins);
    FS_INFO("write-back: %llu evictions skipped it (fingerprint unchanged, %llu bytes); %llu "
            "fingerprints taken", (unsigned long long)s.res.clean_evictions,
            (unsigned long long)s.res.clean_bytes, (unsigned long long)s.res.fingerprints);
    if (eng.res.predicted_waits)
        FS_INFO("copy waits: %llu slept through the predicted part of their copy, %llu of them "
                "past its end (COPY_WAIT=predict)", (unsigned long long)s.res.predicted_sleeps,
                (unsigned long long)s.res.overslept);
    FS_INFO("launches: %llu seen, %llu referencing managed memory, %llu unknown (parameters "
            "unreadable), %llu layout queries; tracking paused %llu and resumed %llu times (%llu "
            "allocations frozen where they were, %llu of them in plain device memory)",
            (unsigned long long)s.launch.launches, (unsigned long long)s.launch.with_refs,
            (unsigned long long)s.launch.unknown, (unsigned long long)s.launch.layout_queries,
            (unsigned long long)s.tracking_pauses, (unsigned long long)s.tracking_resumes,
            (unsigned long long)s.res.frozen, (unsigned long long)s.res.plain_made);
    FS_INFO("launch references found in: %llu copies' and memsets' ranges, %llu packed (extra) "
            "parameter buffers, %llu kernels' parameters (each referencing launch once, where its "
            "first was found)",
            (unsigned long long)s.launch.refs_in_ranges, (unsigned long long)s.launch.refs_in_extra,
            (unsigned long long)s.launch.refs_in_params);
    if (s.res.stage_ins > 0 || s.res.redirected > 0)
        FS_INFO("redirect: %llu device copies made (%llu bytes), %llu ended; %llu launches "
                "redirected to them (%llu parameter words); %llu copies ended early for a launch "
                "that could not be redirected; %llu copies dropped for late references read in "
                "place",
                (unsigned long long)s.res.stage_ins, (unsigned long long)s.res.staged_bytes,
                (unsigned long long)s.res.stage_outs, (unsigned long long)s.res.redirected,
                (unsigned long long)s.launch.rewritten, (unsigned long long)s.res.unstage_syncs,
                (unsigned long long)s.exec.read_in_place);
    if (eng.planning)
        stop_and_log_plan(&s);
    log_remaps(&s.res);
    write_timing_report(&s, eng.dev->props.name);
    write_run_trace();
}

void fs_engine_teardown(void)
{
    join_early_start();
    if (started()) {
        stop_planning();
        fs_launch_shutdown();
        fs_res_destroy(&eng.res);
        if (!eng.dev_injected)
            eng.dev->ops->close(eng.dev);
    }
    fs_rt_close();
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    memset(&eng, 0, sizeof(eng));
    eng.start_lock = lock;
    eng.pause_lock = lock;
    fs_log_close();
}

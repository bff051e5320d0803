#include "replay.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_sim.h"
#include "engine.h"
#include "iteration.h"
#include "launch.h"
#include "strategies/schedule.h"

#define WARMUP 2

static void seterr(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

#define MAX_STREAMS 64 /* the program's streams; later ones share the last */

static int stream_slot(const struct fs_prof_launch *l)
{
    return l->stream < MAX_STREAMS ? (int)l->stream : MAX_STREAMS - 1;
}

/* What the replay owns, released by cleanup. */
struct replay {
    struct fs_device *dev;
    char path[256];          /* the profile as the simulated device sees it */
    unsigned char *keys;     /* one byte per distinct kernel: its address is the kernel handle */
    int *kernel_of;          /* per launch: index into keys, or -1 for copies */
    fs_dptr *va;             /* per allocation */
    uint64_t *read_bytes;    /* per allocation: what one referencing launch reads of it */
    fs_stream streams[MAX_STREAMS];
    int nstreams;
    double *ends_us;         /* per iteration */
    uint64_t program_free_ns; /* when the program thread's last call returned (sim clock) */
    uint64_t hook_ns;         /* sim clock time the program thread spent in the launch hook */
    bool engine_started;
    /* tracing the last iteration (cfg->trace) */
    const struct fs_profile *p;
    const struct fs_replay_config *cfg;
    bool tracing;
    uint64_t trace_t0_ns;     /* the traced iteration's start */
    int next_done[MAX_STREAMS]; /* per stream: the first launch whose kernel is not done yet */
    uint64_t *block_va;       /* per allocation: its host block's copy address (0: none) */
    pthread_mutex_t trace_lock; /* one sink call at a time */
};

static void cleanup(struct replay *r)
{
    if (r->tracing)
        fs_sim_set_recorder(r->dev, NULL, NULL);
    if (r->engine_started)
        fs_engine_teardown();
    for (int i = 0; i < r->nstreams; i++)
        if (r->streams[i])
            r->dev->ops->stream_destroy(r->dev, r->streams[i]);
    if (r->dev)
        r->dev->ops->close(r->dev);
    if (r->path[0])
        unlink(r->path);
    free(r->keys);
    free(r->kernel_of);
    free(r->va);
    free(r->read_bytes);
    free(r->block_va);
    free(r->ends_us);
    pthread_mutex_destroy(&r->trace_lock);
}

/* The simulated device with the profile's memory and link, moving no bytes. */
static int open_device(const struct fs_profile *p, struct fs_device **dev)
{
    const struct fs_bw_model *bw = &p->bw;
    struct fs_sim_config sc = {
        .device_bytes = p->device_total ? p->device_total : 80ull << 30,
        .h2d_bytes_per_s = bw->h2d_bytes_per_us * 1e6,
        .d2h_bytes_per_s = bw->d2h_bytes_per_us * 1e6,
        .copy_latency_ns = (uint64_t)(bw->h2d_latency_us * 1000),
        .host_phys_supported = true,
        .timing_only = true,
        .map_ns_per_gib = {FS_REPLAY_MAP_DEVICE_NS_PER_GIB, FS_REPLAY_MAP_HOST_NS_PER_GIB},
        .unmap_ns_per_gib = {FS_REPLAY_UNMAP_DEVICE_NS_PER_GIB, FS_REPLAY_UNMAP_HOST_NS_PER_GIB},
        .host_read_bytes_per_s = FS_REPLAY_HOST_READ_BYTES_PER_S,
    };
    return fs_sim_open(&sc, dev);
}

/* Kernels: one simulated kernel per distinct signature; the profile saved for the engine names
 * them as the simulator does, on the simulator's device. */
static int write_profile(struct replay *r, const struct fs_profile *p, char *err, size_t errlen)
{
    int n = p->nlaunches, nk = 0;
    uint64_t *sigs = malloc(((size_t)n + 1) * sizeof(*sigs));
    struct fs_prof_launch *launches = malloc(((size_t)n + 1) * sizeof(*launches));
    r->keys = calloc((size_t)n + 1, 1);
    r->kernel_of = malloc(((size_t)n + 1) * sizeof(int));
    int rc = sigs && launches && r->keys && r->kernel_of ? FS_OK : FS_ERR_NOMEM;
    for (int i = 0; i < n && rc == FS_OK; i++) {
        launches[i] = p->launches[i];
        r->kernel_of[i] = -1;
        if (p->launches[i].kernel == FS_SIG_COPY)
            continue; /* copies and memsets have no kernel: the same signature here */
        int k = 0;
        while (k < nk && sigs[k] != p->launches[i].kernel)
            k++;
        if (k == nk) {
            sigs[nk++] = p->launches[i].kernel;
            rc = fs_sim_register_kernel(r->dev, &r->keys[k], NULL, NULL, 0);
        }
        r->kernel_of[i] = k;
    }
    /* Every launch of a kernel takes that kernel's simulated name. */
    for (int i = 0; i < n && rc == FS_OK; i++) {
        if (r->kernel_of[i] < 0)
            continue;
        const char *name = NULL;
        rc = r->dev->ops->kernel_name(r->dev, &r->keys[r->kernel_of[i]], &name);
        if (rc == FS_OK)
            launches[i].kernel = fs_iter_hash_name(name);
    }
    if (rc == FS_OK) {
        struct fs_profile q = *p;
        q.launches = launches;
        q.kernel_names = NULL;
        snprintf(q.device_name, sizeof(q.device_name), "%s", r->dev->props.name);
        q.cc_major = r->dev->props.cc_major;
        q.cc_minor = r->dev->props.cc_minor;
        q.device_total = r->dev->props.total_bytes;
        const char *tmp = getenv("TMPDIR");
        snprintf(r->path, sizeof(r->path), "%s/flexshim-replay-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        int fd = mkstemp(r->path);
        if (fd < 0) {
            r->path[0] = '\0';
            seterr(err, errlen, "cannot create a temporary file in %s", tmp && *tmp ? tmp : "/tmp");
            rc = FS_ERR_IO;
        } else {
            close(fd);
            rc = fs_profile_save(r->path, &q, err, errlen);
        }
    } else if (rc == FS_ERR_NOMEM) {
        seterr(err, errlen, "out of memory");
    }
    free(sigs);
    free(launches);
    return rc;
}

static int start_engine(struct replay *r, const struct fs_replay_config *cfg, char *err,
                        size_t errlen)
{
    char budget[64], profile[300], strategy[64], mode[64];
    char list[FS_REPLAY_SETTINGS_TEXT];
    char set[FS_REPLAY_SETTINGS][sizeof(list) + sizeof("FLEXTENSOR_")];
    snprintf(budget, sizeof(budget), "FLEXTENSOR_GPU_MEMORY_LIMIT=%llu",
             (unsigned long long)cfg->budget);
    snprintf(profile, sizeof(profile), "FLEXTENSOR_PROFILE=%s", r->path);
    snprintf(strategy, sizeof(strategy), "FLEXTENSOR_STRATEGY=%s",
             cfg->strategy ? cfg->strategy : "adaptive");
    /* PLAN_HEADROOM=0: the engine plans for the budget itself, as the model it is compared with
     * did (the settings, after it, may say otherwise). */
    char *envp[11 + FS_REPLAY_SETTINGS] = {"FLEXTENSOR_CONFIG=", budget, profile,
                                           "FLEXTENSOR_MIN_OFFLOAD_BYTES=0",
                                           "FLEXTENSOR_REMAP_SAFETY=tracked",
                                           "FLEXTENSOR_LOG_LEVEL=error",
                                           "FLEXTENSOR_PLAN_HEADROOM=0"};
    int n = 7;
    if (cfg->strategy)
        envp[n++] = strategy;
    if (cfg->offload_mode) {
        snprintf(mode, sizeof(mode), "FLEXTENSOR_OFFLOAD_MODE=%s", cfg->offload_mode);
        envp[n++] = mode;
    }
    snprintf(list, sizeof(list), "%s", cfg->settings ? cfg->settings : "");
    char *save = NULL;
    int k = 0;
    for (char *kv = strtok_r(list, ",", &save); kv && k < FS_REPLAY_SETTINGS;
         kv = strtok_r(NULL, ",", &save), k++) {
        snprintf(set[k], sizeof(set[k]), "FLEXTENSOR_%s", kv);
        envp[n++] = set[k];
    }
    envp[n] = NULL;
    fs_engine_teardown();
    fs_engine_use_device(r->dev);
    fs_engine_set_tracker(NULL);
    r->engine_started = true;
    if (fs_engine_init(envp) != FS_OK) {
        seterr(err, errlen, "the engine refused its settings (budget %llu bytes, strategy %s)",
               (unsigned long long)cfg->budget, cfg->strategy ? cfg->strategy : "adaptive");
        return FS_ERR_CONFIG;
    }
    return FS_OK;
}

static double us_since(const struct replay *r, uint64_t ns)
{
    return ((double)ns - (double)r->trace_t0_ns) / 1000;
}

static void trace_event(struct replay *r, const struct fs_tl_event *ev)
{
    pthread_mutex_lock(&r->trace_lock);
    r->cfg->trace(ev, r->cfg->trace_arg);
    pthread_mutex_unlock(&r->trace_lock);
}

/* The allocation A whose range [BASE[A], BASE[A] + its mapped size) holds VA, or -1; BASE is
 * the allocations' VAs or their host blocks' addresses (0: none). */
static int alloc_in(const struct replay *r, const fs_dptr *base, fs_dptr va)
{
    for (int a = 0; a < r->p->nallocs; a++)
        if (base[a] && va >= base[a] && va - base[a] < r->p->allocs[a].mapped)
            return a;
    return -1;
}

/* The simulated device's record of a completed operation, as a trace event (sim lock held). */
static void on_record(void *arg, const struct fs_sim_record *rec)
{
    struct replay *r = arg;
    struct fs_tl_event ev = {.launch = -1, .alloc = -1, .bytes = rec->bytes,
                             .start_us = us_since(r, rec->start_ns),
                             .end_us = us_since(r, rec->end_ns)};
    if (rec->kind == FS_SIM_REC_KERNEL) {
        /* A stream runs its kernels in the order they were queued: the profile's launches on it,
         * in order (the previous iteration ended with a synchronize). */
        int s = 0;
        while (s < r->nstreams && r->streams[s] != rec->stream)
            s++;
        if (s == r->nstreams)
            return;
        int i = r->next_done[s];
        while (i < r->p->nlaunches && stream_slot(&r->p->launches[i]) != s)
            i++;
        if (i == r->p->nlaunches)
            return;
        r->next_done[s] = i + 1;
        ev.lane = FS_TL_COMPUTE;
        ev.launch = i;
    } else if (rec->kind == FS_SIM_REC_COPY_H2D || rec->kind == FS_SIM_REC_COPY_D2H) {
        /* Fault-ins read the allocation's VA (mapped to host memory), prefetches its host
         * block; evictions write its host block from the VA. */
        ev.lane = rec->kind == FS_SIM_REC_COPY_H2D ? FS_TL_H2D : FS_TL_D2H;
        ev.fault_in = ev.lane == FS_TL_H2D && !rec->by_engine;
        ev.alloc = alloc_in(r, r->va, rec->src);
        if (ev.alloc < 0 && ev.lane == FS_TL_H2D)
            ev.alloc = alloc_in(r, r->block_va, rec->src);
        if (ev.alloc < 0)
            return;
    } else {
        return; /* fingerprints and other copies are not drawn */
    }
    trace_event(r, &ev);
}

/* Start tracing: what completes from now on, the launches queued from now on. */
static int trace_begin(struct replay *r)
{
    /* Host blocks are attached by now: every allocation the plan moves was moved before. */
    int n = r->p->nallocs;
    uint64_t *alloc_va = malloc(((size_t)n + 1) * sizeof(uint64_t));
    uint64_t *block_va = malloc(((size_t)n + 1) * sizeof(uint64_t));
    r->block_va = calloc((size_t)n + 1, sizeof(uint64_t));
    if (!alloc_va || !block_va || !r->block_va) {
        free(alloc_va);
        free(block_va);
        return FS_ERR_NOMEM;
    }
    int nb = fs_engine_host_blocks(alloc_va, block_va, n);
    for (int i = 0; i < nb; i++) {
        int a = alloc_in(r, r->va, alloc_va[i]);
        if (a >= 0)
            r->block_va[a] = block_va[i];
    }
    free(alloc_va);
    free(block_va);
    r->trace_t0_ns = fs_sim_now_ns(r->dev);
    r->tracing = true;
    fs_sim_set_recorder(r->dev, on_record, r);
    return FS_OK;
}

/* What each launch that references an allocation reads of it: its size shared among the
 * iteration's referencing launches (a framework's segment often holds several tensors, each
 * read by its own kernel), at least 1 byte. It is what a kernel reading host memory in place
 * pays for (fs_sim_config.host_read_bytes_per_s). */
static void share_reads(const struct fs_profile *p, uint64_t *read_bytes)
{
    fs_profile_count_uses(p, read_bytes); /* then turned into bytes in place */
    for (int a = 0; a < p->nallocs; a++) {
        uint64_t uses = read_bytes[a] ? read_bytes[a] : 1;
        read_bytes[a] = (p->allocs[a].size + uses - 1) / uses;
    }
}

/* One iteration of the profile's launches through the engine. The program thread spends each
 * launch's host time (host_us) before queueing it, starting when its previous launch returned:
 * it moves the clock only if nothing else (the mover's remaps, waits) already took it there. */
static int run_iteration(struct replay *r, const struct fs_profile *p, char *err, size_t errlen)
{
    for (int i = 0; i < p->nlaunches; i++) {
        const struct fs_prof_launch *l = &p->launches[i];
        if (l->host_us > 0)
            fs_sim_advance_to(r->dev, r->program_free_ns + (uint64_t)(l->host_us * 1000));
        uint64_t ptrs[FS_LAUNCH_MAX_REFS], sizes[FS_SIM_MAX_KERNEL_PTRS];
        int n = l->nrefs < FS_LAUNCH_MAX_REFS ? l->nrefs : FS_LAUNCH_MAX_REFS;
        for (int j = 0; j < n; j++) {
            int a = p->refs[l->ref_start + j];
            ptrs[j] = r->va[a];
            if (j < FS_SIM_MAX_KERNEL_PTRS)
                sizes[j] = r->read_bytes[a];
        }
        /* As a packed parameter buffer, so that OFFLOAD_MODE=redirect can rewrite it (copies,
         * with no kernel, are never redirected). */
        struct fs_launch_desc d = {
            .func = r->kernel_of[i] >= 0 ? &r->keys[r->kernel_of[i]] : NULL,
            .stream = r->streams[stream_slot(l)],
            .param_buf = ptrs,
            .param_buf_size = (size_t)n * sizeof(ptrs[0]),
        };
        struct fs_launch_ticket t;
        uint64_t t0 = fs_sim_now_ns(r->dev);
        uint64_t late = fs_engine_late_waits();
        fs_engine_launch_enter(&d, &t); /* waits here for late prefetches, faults in */
        if (fs_engine_late_waits() != late) /* it waited for the mover: the mover's clock */
            fs_sim_join_engine_clock(r->dev);
        uint64_t t1 = fs_sim_now_ns(r->dev);
        r->hook_ns += t1 - t0;
        if (r->tracing && t1 > t0)
            trace_event(r, &(struct fs_tl_event){.lane = FS_TL_WAIT, .launch = i, .alloc = -1,
                                                  .start_us = us_since(r, t0),
                                                  .end_us = us_since(r, t1)});
        int rc = fs_sim_launch(r->dev, d.stream, (uint64_t)(l->duration_us * 1000), ptrs, sizes,
                               n < FS_SIM_MAX_KERNEL_PTRS ? n : FS_SIM_MAX_KERNEL_PTRS, NULL,
                               NULL);
        fs_engine_launch_exit(&t, rc == FS_OK);
        r->program_free_ns = fs_sim_now_ns(r->dev);
        if (rc != FS_OK) {
            seterr(err, errlen, "the simulated device failed at launch %d (%s): a remap under "
                   "queued work, which is a flexshim bug", i, fs_err_str(rc));
            return rc;
        }
    }
    int rc = r->dev->ops->ctx_sync(r->dev);
    r->program_free_ns = fs_sim_now_ns(r->dev);
    return rc;
}

int fs_replay(const struct fs_profile *p, const struct fs_replay_config *cfg,
              struct fs_replay_result *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (!cfg || cfg->iterations <= WARMUP || fs_profile_check(p) != FS_OK || p->nlaunches == 0) {
        seterr(err, errlen, "nothing to replay: it needs a profile with launches and at least "
               "%d iterations", WARMUP + 1);
        return FS_ERR_INVALID;
    }
    if (cfg->budget < 64ull << 20) {
        seterr(err, errlen, "a budget of %llu bytes is too small for GPU_MEMORY_LIMIT (at least "
               "64 MiB)", (unsigned long long)cfg->budget);
        return FS_ERR_CONFIG;
    }
    struct replay r = {.p = p, .cfg = cfg};
    pthread_mutex_init(&r.trace_lock, NULL);
    int rc = open_device(p, &r.dev);
    if (rc != FS_OK) {
        seterr(err, errlen, "the simulated device cannot be set up for this profile (%s)",
               fs_err_str(rc));
        return rc;
    }
    rc = write_profile(&r, p, err, errlen);
    if (rc == FS_OK)
        rc = start_engine(&r, cfg, err, errlen);
    r.va = calloc((size_t)p->nallocs + 1, sizeof(*r.va));
    r.read_bytes = calloc((size_t)p->nallocs + 1, sizeof(*r.read_bytes));
    r.ends_us = calloc((size_t)cfg->iterations, sizeof(*r.ends_us));
    if (rc == FS_OK && (!r.va || !r.read_bytes || !r.ends_us)) {
        seterr(err, errlen, "out of memory");
        rc = FS_ERR_NOMEM;
    }
    if (rc == FS_OK)
        share_reads(p, r.read_bytes);
    for (int a = 0; a < p->nallocs && rc == FS_OK; a++) {
        rc = fs_engine_alloc(p->allocs[a].size, 0, &r.va[a]);
        if (rc != FS_OK)
            seterr(err, errlen, "allocation %d (%llu bytes) could not be made on the simulated "
                   "device (%s)", a, (unsigned long long)p->allocs[a].size, fs_err_str(rc));
    }
    for (int i = 0; i < p->nlaunches && rc == FS_OK; i++)
        while (r.nstreams <= stream_slot(&p->launches[i]) &&
               rc == FS_OK)
            rc = fs_sim_stream_create(r.dev, &r.streams[r.nstreams++]);
    double start_us = (double)fs_sim_now_ns(r.dev) / 1000;
    struct fs_engine_stats warm = {0};
    for (int it = 0; it < cfg->iterations && rc == FS_OK; it++) {
        if (it == WARMUP) {
            fs_engine_get_stats(&warm);
            r.hook_ns = 0;
        }
        if (it == cfg->iterations - 1 && cfg->trace && (rc = trace_begin(&r)) != FS_OK) {
            seterr(err, errlen, "out of memory for the trace");
            break;
        }
        rc = run_iteration(&r, p, err, errlen);
        r.ends_us[it] = (double)fs_sim_now_ns(r.dev) / 1000;
    }
    if (rc == FS_OK) {
        fs_engine_drain_moves();
        if (r.tracing) { /* the moves the last iteration started, up to the end */
            rc = r.dev->ops->ctx_sync(r.dev);
            fs_sim_set_recorder(r.dev, NULL, NULL);
        }
    }
    if (rc == FS_OK) {
        struct fs_engine_stats st;
        fs_engine_get_stats(&st);
        out->exec = st.exec;
        out->res = st.res;
        int m = cfg->iterations - WARMUP;
        out->timed = m;
        out->timed_late = st.exec.late - warm.exec.late;
        out->timed_unplanned = st.exec.unplanned - warm.exec.unplanned;
        out->timed_faults = st.res.faults - warm.res.faults;
        out->timed_ordered = st.res.ordered_waits - warm.res.ordered_waits;
        out->timed_blocks = st.res.device_blocks.made - warm.res.device_blocks.made;
        out->timed_hook_us = (double)r.hook_ns / 1000;
        double *d = r.ends_us; /* differences in place, from the end: each needs its left */
        for (int it = cfg->iterations - 1; it >= WARMUP; it--)
            d[it] -= d[it - 1];
        out->step_us = fs_median(d + WARMUP, m);
        out->first_us = d[0] - start_us;
    }
    cleanup(&r);
    return rc;
}

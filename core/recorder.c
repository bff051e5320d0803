#include "recorder.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "phys_pool.h"
#include "strategies/strategy.h"

/* Launches kept while looking for the iteration; older ones are dropped. */
#define DISCOVERY_WINDOW (1 << 18)
/* How often (in launches) discovery looks for the iteration. */
#define DETECT_EVERY 1024
/* Launches a found iteration must be followed without a departure before it is taken: identical
 * layers repeat inside one pass of a model (22 x 41 launches in the Llama test model), and until
 * two whole passes have been seen they are the longest periodic stretch. A period the program
 * leaves is rejected for the rest of the discovery. */
#define CONFIRM_LAUNCHES (4 * DETECT_EVERY)

int fs_rec_init(struct fs_recorder *r, struct fs_device *dev, const struct fs_rec_config *cfg)
{
    memset(r, 0, sizeof(*r));
    r->dev = dev;
    r->discovery_iters = cfg->discovery_iters < 1 ? 1 : cfg->discovery_iters;
    r->profiling_iters = cfg->profiling_iters < 0 ? 0 : cfg->profiling_iters;
    r->budget = cfg->budget;
    snprintf(r->strategy, sizeof(r->strategy), "%s", cfg->strategy ? cfg->strategy : "adaptive");
    snprintf(r->out_path, sizeof(r->out_path), "%s", cfg->out_path ? cfg->out_path : "");
    snprintf(r->iteration_kernel, sizeof(r->iteration_kernel), "%s",
             cfg->iteration_kernel ? cfg->iteration_kernel : "");
    int rc = fs_iter_init(&r->det, DISCOVERY_WINDOW);
    if (rc != FS_OK)
        return rc;
    r->on_plan = cfg->on_plan;
    r->on_plan_arg = cfg->on_plan_arg;
    r->fingerprint = cfg->fingerprint;
    r->fingerprint_arg = cfg->fingerprint_arg;
    pthread_mutex_init(&r->lock, NULL);
    __atomic_store_n(&r->phase, cfg->idle ? FS_REC_DONE : FS_REC_DISCOVERY, __ATOMIC_RELEASE);
    return FS_OK;
}

static void free_events(struct fs_recorder *r)
{
    free(r->host_us);
    r->host_us = NULL;
    free(r->fp);
    free(r->fp_known);
    r->fp = NULL;
    r->fp_known = NULL;
    r->fp_n = 0;
    if (!r->events)
        return;
    for (int i = 0; i < 2 * r->period * r->profiling_iters; i++)
        if (r->events[i])
            fs_dev_call(r->dev, event_destroy, r->events[i]);
    free(r->events);
    r->events = NULL;
}

void fs_rec_destroy(struct fs_recorder *r)
{
    if (!r->dev)
        return;
    free_events(r);
    fs_iter_destroy(&r->det);
    free(r->launches);
    free(r->refs);
    free(r->tmpl);
    free(r->tmpl_refs);
    free(r->alloc_size);
    free(r->alloc_mapped);
    for (int i = 0; i < r->nnames; i++)
        free(r->names[i].name);
    free(r->names);
    pthread_mutex_destroy(&r->lock);
    memset(r, 0, sizeof(*r));
}

void fs_rec_note_alloc(struct fs_recorder *r, uint64_t order, uint64_t size, uint64_t mapped)
{
    pthread_mutex_lock(&r->lock);
    int need = (int)order + 1;
    if (fs_grow((void **)&r->alloc_size, &r->cap_allocs, (size_t)need, sizeof(uint64_t))) {
        uint64_t *m = realloc(r->alloc_mapped, r->cap_allocs * sizeof(uint64_t));
        if (m) {
            r->alloc_mapped = m;
            for (int i = r->nallocs; i < need; i++)
                r->alloc_size[i] = r->alloc_mapped[i] = 0;
            r->alloc_size[order] = size;
            r->alloc_mapped[order] = mapped;
            if (need > r->nallocs)
                r->nallocs = need;
        }
    }
    pthread_mutex_unlock(&r->lock);
}

/* FUNC's entry in the name table, made on first sight: its name for the profile and whether it
 * starts an iteration (lock held). NULL for copies or without memory. */
static const struct fs_rec_name *note_name(struct fs_recorder *r, const void *func, uint64_t sig)
{
    if (!func)
        return NULL;
    for (int i = 0; i < r->nnames; i++)
        if (r->names[i].func == func)
            return &r->names[i];
    const char *name = NULL;
    if (fs_dev_call(r->dev, kernel_name, func, &name) != FS_OK)
        name = NULL;
    if (!fs_grow((void **)&r->names, &r->cap_names, (size_t)r->nnames + 1, sizeof(*r->names)))
        return NULL;
    bool starts = r->iteration_kernel[0] && name && strstr(name, r->iteration_kernel);
    r->names[r->nnames] = (struct fs_rec_name){func, sig, name ? strdup(name) : NULL, starts};
    return &r->names[r->nnames++];
}

static const char *name_of(const struct fs_recorder *r, const void *func)
{
    for (int i = 0; i < r->nnames; i++)
        if (r->names[i].func == func)
            return r->names[i].name;
    return NULL;
}

static void reset_discovery(struct fs_recorder *r)
{
    free_events(r);
    free(r->tmpl);
    free(r->tmpl_refs);
    r->tmpl = NULL;
    r->tmpl_refs = NULL;
    r->period = r->pos = r->iters_timed = 0;
    r->counting = false;
    r->nlaunches = r->nrefs = 0;
    r->det.n = 0;
    r->last_period = 0;
    r->nmarks = 0;
    r->marked_period = false;
    __atomic_store_n(&r->phase, FS_REC_DISCOVERY, __ATOMIC_RELEASE);
}

void fs_rec_restart(struct fs_recorder *r)
{
    if (!r->dev)
        return;
    pthread_mutex_lock(&r->lock);
    reset_discovery(r);
    r->nrejected = 0;
    pthread_mutex_unlock(&r->lock);
}

void fs_rec_mark_iteration(struct fs_recorder *r)
{
    if (!r->dev)
        return;
    pthread_mutex_lock(&r->lock);
    r->mark_pending = true;
    pthread_mutex_unlock(&r->lock);
}

static bool rejected(const struct fs_recorder *r, int period)
{
    for (int i = 0; i < r->nrejected; i++)
        if (r->rejected[i] == period)
            return true;
    return false;
}

/* The fingerprints of allocations 0 .. N-1 now, into new arrays *FP and *KNOWN (the caller frees
 * them, whatever the result); false when none could be taken. */
static bool fingerprints_now(struct fs_recorder *r, int n, struct fs_fp **fp, bool **known)
{
    *fp = malloc((size_t)n * sizeof(**fp));
    *known = malloc((size_t)n * sizeof(**known));
    return *fp && *known && r->fingerprint(r->fingerprint_arg, *fp, *known, n) == FS_OK;
}

/* Profiling begins: the allocations' fingerprints now, to compare with those at its end (lock
 * held; the launch that began it was queued on STREAM). They synchronize the device, which a
 * graph capture must not see: then none are taken. Without them (no callback, no memory,
 * fingerprints off, a capture) no allocation is marked unchanged. */
static void take_first_fingerprints(struct fs_recorder *r, fs_stream stream)
{
    int n = r->nallocs;
    bool capturing = true;
    if (!r->fingerprint || n == 0 ||
        fs_dev_call(r->dev, stream_capturing, stream, &capturing) != FS_OK || capturing)
        return;
    if (fingerprints_now(r, n, &r->fp, &r->fp_known))
        r->fp_n = n;
}

/* Profiling is over (the device synchronized): an allocation whose fingerprint is the one it had
 * when profiling began, an iteration or more ago, is marked unchanged in P: the plan's model
 * evicts it without a write-back, as the engine will (its fingerprint will match). */
static void mark_unchanged(struct fs_recorder *r, struct fs_profile *p)
{
    int n = r->fp_n < p->nallocs ? r->fp_n : p->nallocs, same = 0;
    /* At least one whole iteration between the two, or a write by its first launches may not
     * be seen. */
    if (r->iters_timed == 0)
        n = 0;
    struct fs_fp *now = NULL;
    bool *known = NULL;
    bool taken = n > 0 && fingerprints_now(r, n, &now, &known);
    for (int a = 0; taken && a < n; a++) {
        p->allocs[a].unchanged = r->fp_known[a] && known[a] && fs_fp_equal(r->fp[a], now[a]);
        same += p->allocs[a].unchanged;
    }
    free(now);
    free(known);
    if (taken)
        FS_INFO("profiling: %d of %d allocations were left unchanged by the iteration (evicting "
                "them needs no write-back)", same, p->nallocs);
    else
        FS_INFO("profiling: the allocations were not fingerprinted (fingerprints off, a graph "
                "capture, or no whole iteration profiled); the plan assumes every eviction "
                "writes back");
}

/* The iteration was found: keep launches [START, START + PERIOD) as the template (lock held;
 * STREAM: the stream of the launch being recorded). */
static int begin_profiling(struct fs_recorder *r, int start, int period, int n_in_buffer,
                           fs_stream stream)
{
    /* The detector may have dropped old launches; its buffer holds the newest ones, as ours. */
    int offset = r->nlaunches - n_in_buffer;
    start += offset;
    int nrefs = 0;
    for (int i = start; i < start + period; i++)
        nrefs += r->launches[i].nrefs;
    r->tmpl = malloc((size_t)period * sizeof(*r->tmpl));
    r->tmpl_refs = malloc(((size_t)nrefs + 1) * sizeof(*r->tmpl_refs));
    size_t slots = (size_t)period * (size_t)(r->profiling_iters ? r->profiling_iters : 1);
    r->events = calloc(2 * slots, sizeof(*r->events));
    r->host_us = malloc(slots * sizeof(*r->host_us));
    if (!r->tmpl || !r->tmpl_refs || !r->events || !r->host_us)
        return FS_ERR_NOMEM;
    for (size_t i = 0; i < slots; i++)
        r->host_us[i] = -1;
    int k = 0;
    for (int i = 0; i < period; i++) {
        struct fs_rec_launch l = r->launches[start + i];
        if (l.nrefs > 0)
            memcpy(&r->tmpl_refs[k], &r->refs[l.ref_start], (size_t)l.nrefs * sizeof(uint64_t));
        l.ref_start = k;
        k += l.nrefs;
        r->tmpl[i] = l;
    }
    take_first_fingerprints(r, stream);
    r->period = period;
    r->pos = (r->nlaunches - start) % period; /* where the program is now */
    r->counting = r->pos == 0;
    r->iters_timed = 0;
    r->followed = 0;
    FS_INFO("discovery: an iteration of %d launches, seen %d times after %d launches", period,
            (r->nlaunches - start) / period, r->nlaunches);
    __atomic_store_n(&r->phase, FS_REC_PROFILING, __ATOMIC_RELEASE);
    return FS_OK;
}

/* Per launch, medians over the timed iterations (lock held): its GPU time, from just before it
 * was queued to its end (the gaps while the device waited for the program or for fault-ins are
 * left out), and the program's host time before it. */
static void launch_times(struct fs_recorder *r, double *dur_us, double *host_us)
{
    int P = r->period, I = r->iters_timed;
    double *gpu = malloc(((size_t)I + 1) * sizeof(double));
    double *host = malloc(((size_t)I + 1) * sizeof(double));
    for (int i = 0; i < P && gpu && host; i++) {
        int ng = 0, nh = 0;
        for (int it = 0; it < I; it++) {
            int idx = it * P + i;
            float ms;
            if (r->events[2 * idx] && r->events[2 * idx + 1] &&
                fs_dev_call(r->dev, event_elapsed_ms, r->events[2 * idx], r->events[2 * idx + 1],
                            &ms) == FS_OK)
                gpu[ng++] = ms * 1000.0;
            if (r->host_us[idx] >= 0)
                host[nh++] = r->host_us[idx];
        }
        dur_us[i] = fs_median(gpu, ng);
        host_us[i] = fs_median(host, nh);
    }
    free(gpu);
    free(host);
}

/* This process's command line as the kernel keeps it (each word ended by a NUL) into BUF, with
 * one more NUL after it; its length, 0 when it cannot be read. */
static size_t read_cmdline(char *buf, size_t len)
{
    buf[0] = '\0';
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    return (size_t)n;
}

/* The program's command line, for show: its words joined by spaces. */
static void read_program(char *buf, size_t len)
{
    size_t n = read_cmdline(buf, len);
    for (size_t i = 0; i + 1 < n; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
}

bool fs_rec_same_program(const char *recorded, const char *cmdline, size_t len)
{
    const char *end = cmdline + len;
    if (len == 0)
        return false;
    for (int k = 0; cmdline < end; k++) {
        size_t wlen = strlen(cmdline);
        if (strncmp(recorded, cmdline, wlen) != 0 || (recorded[wlen] != ' ' && recorded[wlen]))
            return false;
        if (k > 0 && cmdline[0] != '-')
            return true; /* the script, module or first argument of the command */
        recorded += wlen + (recorded[wlen] == ' ');
        cmdline += wlen + 1;
    }
    return true; /* the command and its options alone, all the same */
}

bool fs_rec_is_this_program(const char *recorded)
{
    char cmd[4096];
    size_t n = read_cmdline(cmd, sizeof(cmd));
    return fs_rec_same_program(recorded, cmd, n);
}

int fs_rec_build_profile(struct fs_recorder *r, struct fs_profile *p)
{
    memset(p, 0, sizeof(*p));
    int P = r->period;
    if (P == 0)
        return FS_ERR_INVALID;
    p->version = FS_PROFILE_SCHEMA_VERSION;
    const struct fs_device_props *dp = &r->dev->props;
    snprintf(p->device_name, sizeof(p->device_name), "%s", dp->name);
    p->cc_major = dp->cc_major;
    p->cc_minor = dp->cc_minor;
    p->device_total = dp->total_bytes;
    p->driver_version = dp->driver_version;
    read_program(p->program, sizeof(p->program));
    p->nallocs = r->nallocs;
    p->allocs = calloc((size_t)r->nallocs + 1, sizeof(*p->allocs));
    p->nlaunches = P;
    p->launches = calloc((size_t)P, sizeof(*p->launches));
    p->kernel_names = calloc((size_t)P, sizeof(char *));
    int total_refs = 0;
    for (int i = 0; i < P; i++)
        total_refs += r->tmpl[i].nrefs;
    p->refs = malloc(((size_t)total_refs + 1) * sizeof(int));
    double *dur = calloc(2 * (size_t)P, sizeof(double)), *host = dur ? dur + P : NULL;
    if (!p->allocs || !p->launches || !p->kernel_names || !p->refs || !dur) {
        free(dur);
        fs_profile_free(p);
        return FS_ERR_NOMEM;
    }
    for (int a = 0; a < r->nallocs; a++)
        p->allocs[a] = (struct fs_prof_alloc){.order = (uint64_t)a, .size = r->alloc_size[a],
                                              .mapped = r->alloc_mapped[a], .first_use = -1,
                                              .last_use = -1};
    if (r->iters_timed > 0)
        launch_times(r, dur, host);
    uint32_t stream_ids[64];
    fs_stream streams[64];
    int nstreams = 0;
    int k = 0;
    for (int i = 0; i < P; i++) {
        const struct fs_rec_launch *l = &r->tmpl[i];
        int sid = 0;
        while (sid < nstreams && streams[sid] != l->stream)
            sid++;
        if (sid == nstreams && nstreams < 64) {
            streams[nstreams] = l->stream;
            stream_ids[nstreams] = (uint32_t)nstreams;
            nstreams++;
        }
        struct fs_prof_launch *pl = &p->launches[i];
        pl->kernel = l->sig;
        pl->stream = sid < nstreams ? stream_ids[sid] : 63;
        pl->duration_us = dur[i];
        pl->host_us = host[i];
        pl->ref_start = k;
        const char *name = l->func ? name_of(r, l->func) : "memcpy/memset";
        p->kernel_names[i] = name ? strdup(name) : NULL;
        for (int j = 0; j < l->nrefs; j++) {
            uint64_t order = r->tmpl_refs[l->ref_start + j];
            if (order >= (uint64_t)r->nallocs)
                continue; /* an allocation this recorder never saw made (should not happen) */
            int a = (int)order;
            p->refs[k++] = a;
            if (p->allocs[a].first_use < 0)
                p->allocs[a].first_use = i;
            p->allocs[a].last_use = i;
        }
        pl->nrefs = k - pl->ref_start;
    }
    p->nrefs = k;
    free(dur);
    return FS_OK;
}

/* Median of three timed copies of BYTES on STREAM from SRC to DST, in microseconds. */
static int time_copy(struct fs_device *dev, fs_stream s, fs_event e0, fs_event e1, fs_dptr dst,
                     fs_dptr src, uint64_t bytes, double *us)
{
    double t[3];
    for (int i = 0; i < 3; i++) {
        float ms = 0;
        int rc = fs_dev_call(dev, event_record, e0, s);
        if (rc == FS_OK)
            rc = fs_dev_call(dev, copy_async, dst, src, bytes, s);
        if (rc == FS_OK)
            rc = fs_dev_call(dev, event_record, e1, s);
        if (rc == FS_OK)
            rc = fs_dev_call(dev, event_sync, e1);
        if (rc == FS_OK)
            rc = fs_dev_call(dev, event_elapsed_ms, e0, e1, &ms);
        if (rc != FS_OK)
            return rc;
        t[i] = ms * 1000.0;
    }
    *us = fs_median(t, 3);
    return FS_OK;
}

int fs_rec_measure_link(struct fs_device *dev, struct fs_bw_model *bw)
{
    static const uint64_t sizes[2] = {8ull << 20, 64ull << 20};
    struct fs_block *h = NULL, *d = NULL, *d2 = NULL;
    fs_stream s = NULL;
    fs_event e0 = NULL, e1 = NULL;
    memset(bw, 0, sizeof(*bw));
    int rc = fs_phys_block_create(dev, FS_LOC_HOST, sizes[1], &h);
    if (rc == FS_OK)
        rc = fs_phys_block_create(dev, FS_LOC_DEVICE, sizes[1], &d);
    if (rc == FS_OK)
        rc = fs_dev_call(dev, stream_create, &s);
    if (rc == FS_OK)
        rc = fs_dev_call(dev, event_create, FS_EVENT_TIMING, &e0);
    if (rc == FS_OK)
        rc = fs_dev_call(dev, event_create, FS_EVENT_TIMING, &e1);
    bw->points = calloc(2, sizeof(*bw->points));
    if (rc == FS_OK && !bw->points)
        rc = FS_ERR_NOMEM;
    for (int i = 0; i < 2 && rc == FS_OK; i++) {
        bw->points[i].bytes = sizes[i];
        rc = time_copy(dev, s, e0, e1, d->copy_va, h->copy_va, sizes[i], &bw->points[i].h2d_us);
        if (rc == FS_OK)
            rc = time_copy(dev, s, e0, e1, h->copy_va, d->copy_va, sizes[i],
                           &bw->points[i].d2h_us);
    }
    if (rc == FS_OK) {
        bw->npoints = 2;
        double db = (double)(sizes[1] - sizes[0]);
        double dh = bw->points[1].h2d_us - bw->points[0].h2d_us;
        double dd = bw->points[1].d2h_us - bw->points[0].d2h_us;
        bw->h2d_bytes_per_us = dh > 0 ? db / dh : 0;
        bw->d2h_bytes_per_us = dd > 0 ? db / dd : 0;
        bw->h2d_latency_us = bw->h2d_bytes_per_us > 0
                                 ? bw->points[0].h2d_us - (double)sizes[0] / bw->h2d_bytes_per_us
                                 : 0;
        bw->d2h_latency_us = bw->d2h_bytes_per_us > 0
                                 ? bw->points[0].d2h_us - (double)sizes[0] / bw->d2h_bytes_per_us
                                 : 0;
        if (bw->h2d_latency_us < 0)
            bw->h2d_latency_us = 0;
        if (bw->d2h_latency_us < 0)
            bw->d2h_latency_us = 0;
        /* The device's own copy rate bounds what a kernel can read (read_bytes_per_us); without
         * it (no second block) nothing is read in place. */
        double us = 0;
        bw->handover_us = FS_ROOM_HANDOVER_US;
        if (fs_phys_block_create(dev, FS_LOC_DEVICE, sizes[1], &d2) == FS_OK &&
            time_copy(dev, s, e0, e1, d2->copy_va, d->copy_va, sizes[1], &us) == FS_OK && us > 0)
            bw->read_bytes_per_us = FS_READ_BOUND_COPIES * (double)sizes[1] / us;
    } else {
        free(bw->points);
        memset(bw, 0, sizeof(*bw)); /* the strategies then assume the measured PCIe default */
    }
    if (e1)
        fs_dev_call(dev, event_destroy, e1);
    if (e0)
        fs_dev_call(dev, event_destroy, e0);
    if (s)
        fs_dev_call(dev, stream_destroy, s);
    if (d2)
        fs_phys_block_release(dev, d2);
    if (d)
        fs_phys_block_release(dev, d);
    if (h)
        fs_phys_block_release(dev, h);
    return rc;
}

/* Profiling is over: measure the link, plan, save (lock held). */
static void finish(struct fs_recorder *r)
{
    struct fs_profile p;
    __atomic_store_n(&r->phase, FS_REC_DONE, __ATOMIC_RELEASE);
    if (r->profiling_iters > 0 && fs_dev_call(r->dev, ctx_sync) != FS_OK) {
        FS_WARN("profiling: cannot synchronize to read the kernel timings; no profile saved");
        return;
    }
    int rc = fs_rec_build_profile(r, &p);
    if (rc != FS_OK) {
        FS_WARN("profiling: building the profile failed (%s); no profile saved", fs_err_str(rc));
        return;
    }
    mark_unchanged(r, &p);
    if (fs_rec_measure_link(r->dev, &p.bw) != FS_OK)
        FS_WARN("profiling: measuring the host-to-device link failed; the plan assumes 55 GB/s");
    const struct fs_strategy *st = fs_strategy_find(r->strategy);
    rc = st ? st->plan(&p, r->budget, &p.plan) : FS_ERR_INVALID;
    if (rc != FS_OK)
        FS_WARN("planning with %s for a budget of %llu bytes failed (%s); the profile is saved "
                "without a plan", r->strategy, (unsigned long long)r->budget, fs_err_str(rc));
    else
        FS_INFO("plan (%s): predicted %.3f ms per iteration, %.3f ms of it waiting for "
                "transfers, peak %llu MiB", p.plan.strategy, p.plan.predicted_us / 1000,
                p.plan.predicted_stall_us / 1000, (unsigned long long)(p.plan.peak_bytes >> 20));
    if (r->out_path[0]) {
        char err[512];
        if (fs_profile_save(r->out_path, &p, err, sizeof(err)) == FS_OK)
            FS_INFO("profile saved to %s: %d launches per iteration, %d allocations",
                    r->out_path, p.nlaunches, p.nallocs);
        else
            FS_ERROR("%s", err);
    }
    if (p.plan.entries && r->on_plan)
        r->on_plan(r->on_plan_arg, &p);
    fs_profile_free(&p);
    free_events(r);
}

/* Discovery with marks: the launch just added (index I) starts an iteration. Takes the last
 * marked iteration when DISCOVERY_ITERS + 1 were seen and the last two are the same (lock held).
 * Returns the period taken, or 0. */
static int marked_iteration(struct fs_recorder *r, int i)
{
    r->marks[0] = r->marks[1];
    r->marks[1] = r->marks[2];
    r->marks[2] = i;
    if (++r->nmarks < r->discovery_iters + 2 || r->nmarks < 3)
        return 0;
    int a = r->marks[0], b = r->marks[1], c = r->marks[2], period = b - a;
    if (period <= 0 || c - b != period)
        return 0;
    for (int k = 0; k < period; k++)
        if (r->launches[a + k].sig != r->launches[b + k].sig)
            return 0;
    return period;
}

/* Lock held: the timing event at slot END (0: before, 1: after) of the launch being profiled,
 * recorded on STREAM. */
static void record_timing(struct fs_recorder *r, int end, fs_stream stream)
{
    if (!r->counting || r->iters_timed >= r->profiling_iters)
        return;
    fs_event *ev = &r->events[2 * (r->iters_timed * r->period + r->pos) + end];
    if (!*ev && fs_dev_call(r->dev, event_create, FS_EVENT_TIMING, ev) != FS_OK)
        *ev = NULL;
    if (*ev)
        fs_dev_call(r->dev, event_record, *ev, stream);
}

void fs_rec_launch_start(struct fs_recorder *r, fs_stream stream)
{
    pthread_mutex_lock(&r->lock);
    if (__atomic_load_n(&r->phase, __ATOMIC_ACQUIRE) == FS_REC_PROFILING)
        record_timing(r, 0, stream);
    pthread_mutex_unlock(&r->lock);
}

void fs_rec_launch(struct fs_recorder *r, const void *func, uint64_t sig, fs_stream stream,
                   const uint64_t *orders, int n, uint64_t t_enter_ns)
{
    pthread_mutex_lock(&r->lock);
    int phase = __atomic_load_n(&r->phase, __ATOMIC_ACQUIRE);
    const struct fs_rec_name *nm = phase != FS_REC_DONE ? note_name(r, func, sig) : NULL;
    bool mark = r->mark_pending || (nm && nm->starts_iteration);
    r->mark_pending = false;
    if (phase == FS_REC_DISCOVERY) {
        if (r->nlaunches == DISCOVERY_WINDOW) { /* keep the newer half, like the detector */
            int keep = DISCOVERY_WINDOW / 2, drop = r->nlaunches - keep;
            int ref_drop = r->launches[drop].ref_start;
            memmove(r->refs, r->refs + ref_drop, (size_t)(r->nrefs - ref_drop) * sizeof(*r->refs));
            r->nrefs -= ref_drop;
            memmove(r->launches, r->launches + drop, (size_t)keep * sizeof(*r->launches));
            for (int i = 0; i < keep; i++)
                r->launches[i].ref_start -= ref_drop;
            r->nlaunches = keep;
            for (int k = 0; k < 3; k++)
                r->marks[k] -= drop;
            if (r->marks[0] < 0) /* older than the window: start counting again */
                r->nmarks = 0;
        }
        if (fs_grow((void **)&r->launches, &r->cap_launches, (size_t)r->nlaunches + 1,
                    sizeof(*r->launches)) &&
            fs_grow((void **)&r->refs, &r->cap_refs, (size_t)(r->nrefs + n), sizeof(*r->refs))) {
            if (n > 0)
                memcpy(&r->refs[r->nrefs], orders, (size_t)n * sizeof(*orders));
            r->launches[r->nlaunches++] = (struct fs_rec_launch){sig, stream, func, n, r->nrefs};
            r->nrefs += n;
            fs_iter_push(&r->det, sig, fs_now_ns());
        }
        int marked = mark && r->nlaunches > 0 ? marked_iteration(r, r->nlaunches - 1) : 0;
        if (marked > 0) {
            r->marked_period = true;
            if (begin_profiling(r, r->marks[1], marked, r->nlaunches, stream) != FS_OK) {
                FS_WARN("discovery: out of host memory; no profile is recorded");
                __atomic_store_n(&r->phase, FS_REC_DONE, __ATOMIC_RELEASE);
            }
        } else if (r->nmarks == 0 && r->nlaunches % DETECT_EVERY == 0) {
            struct fs_iter_result it;
            fs_iter_detect(&r->det, 2, r->discovery_iters + 1, &it);
            /* Accept a period only when two detections in a row agree: early on, the layers
             * repeating inside one pass can be the longest periodic stretch (measured on the
             * Llama test model: 41 launches, one layer, before two whole passes were seen). */
            int seen = r->last_period;
            r->last_period = it.period;
            if (it.period != seen || rejected(r, it.period))
                it.period = 0;
            if (it.period > 0 &&
                begin_profiling(r, it.start, it.period, r->det.n, stream) != FS_OK) {
                FS_WARN("discovery: out of host memory; no profile is recorded");
                __atomic_store_n(&r->phase, FS_REC_DONE, __ATOMIC_RELEASE);
            }
        }
    } else if (phase == FS_REC_PROFILING) {
        if (sig != r->tmpl[r->pos].sig || stream != r->tmpl[r->pos].stream) {
            r->departures++;
            FS_INFO("profiling: the program left the %d-launch pattern after following it for "
                    "%llu launches, so it is not the whole iteration; discovering again",
                    r->period, (unsigned long long)r->followed);
            if (r->nrejected < FS_REC_MAX_REJECTED)
                r->rejected[r->nrejected++] = r->period;
            reset_discovery(r);
        } else {
            r->followed++;
            if (r->counting && r->iters_timed < r->profiling_iters && t_enter_ns &&
                r->last_exit_ns && t_enter_ns >= r->last_exit_ns)
                r->host_us[r->iters_timed * r->period + r->pos] =
                    (float)(t_enter_ns - r->last_exit_ns) / 1000.0f;
            record_timing(r, 1, stream);
            if (++r->pos == r->period) {
                r->pos = 0;
                if (r->counting && r->iters_timed < r->profiling_iters)
                    r->iters_timed++;
                r->counting = true;
                if (r->iters_timed >= r->profiling_iters &&
                    (r->marked_period || r->followed >= CONFIRM_LAUNCHES))
                    finish(r);
            }
        }
    }
    r->last_exit_ns = fs_now_ns();
    pthread_mutex_unlock(&r->lock);
}

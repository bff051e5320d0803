#include "residency.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "log.h"
#include "run_trace.h"

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define STAT(res, field, n) ((res)->stats.field += (n)) /* under res->lock */

/* ---- shared events ------------------------------------------------------------------------ */

static struct fs_shared_event *event_get(struct fs_residency *res)
{
    pthread_mutex_lock(&res->ev_lock);
    struct fs_shared_event *e = res->free_events;
    if (e)
        res->free_events = e->next_free;
    pthread_mutex_unlock(&res->ev_lock);
    if (e)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    if (fs_dev_call(res->dev, event_create, res->wait_event_flags, &e->ev) != FS_OK) {
        free(e);
        return NULL;
    }
    return e;
}

static void event_put(struct fs_residency *res, struct fs_shared_event *e)
{
    if (!e || __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_lock(&res->ev_lock);
    e->next_free = res->free_events;
    res->free_events = e;
    pthread_mutex_unlock(&res->ev_lock);
}

static void events_destroy(struct fs_residency *res)
{
    while (res->free_events) {
        struct fs_shared_event *e = res->free_events;
        res->free_events = e->next_free;
        fs_dev_call(res->dev, event_destroy, e->ev);
        free(e);
    }
}

/* ---- background pinning --------------------------------------------------------------------- */

/* Bytes the budget will push to host that have no host block yet (lock held). */
static uint64_t host_deficit(struct fs_residency *res)
{
    uint64_t live = res->stats.bytes_live;
    uint64_t over = live > res->budget ? live - res->budget : 0;
    uint64_t have = res->host_backed_bytes + res->host_pool.free_bytes;
    return over > have ? over - have : 0;
}

/* The coldest resident allocation without a host block (lock held). */
static struct fs_alloc *pick_unbacked(struct fs_residency *res)
{
    struct fs_alloc *best = NULL;
    for (int i = 0; i < res->nallocs; i++) {
        struct fs_alloc *a = res->allocs[i];
        if (a->host || LOAD(&a->state) != FS_RES_DEVICE)
            continue;
        if (!best || LOAD(&a->lru_tick) < LOAD(&best->lru_tick))
            best = a;
    }
    return best;
}

static struct fs_alloc *find_by_id(struct fs_residency *res, uint64_t id)
{
    for (int i = 0; i < res->nallocs; i++)
        if (res->allocs[i]->id == id)
            return res->allocs[i];
    return NULL;
}

static void attach_host(struct fs_residency *res, struct fs_alloc *a, struct fs_block *b)
{
    a->host = b;
    a->fp_valid = false; /* a block new to A holds nothing of it */
    res->host_backed_bytes += b->size;
}

static void *pinner_main(void *arg)
{
    struct fs_residency *res = arg;
    fs_thread_internal = true;
    fs_rt_set_lane(FS_RT_PINNER);
    fs_dev_call(res->dev, bind_thread);
    pthread_mutex_lock(&res->lock);
    while (!res->pinner_stop) {
        struct fs_alloc *a = host_deficit(res) > 0 ? pick_unbacked(res) : NULL;
        uint64_t id = 0, size;
        if (a) {
            id = a->id;
            size = a->mapped;
        } else if (res->prepin_next < res->nprepin) {
            size = res->prepin[res->prepin_next++]; /* for the pool, no allocation yet */
        } else {
            pthread_cond_wait(&res->pinner_wake, &res->lock);
            continue;
        }
        pthread_mutex_unlock(&res->lock);
        struct fs_block *b;
        int rc = fs_phys_block_create(res->dev, FS_LOC_HOST, size, &b); /* slow: no lock */
        pthread_mutex_lock(&res->lock);
        if (rc != FS_OK) {
            FS_WARN("pinning %llu bytes of host memory in the background failed (%s); evictions "
                    "pin on demand", (unsigned long long)size, fs_err_str(rc));
            break;
        }
        fs_phys_pool_adopt(&res->host_pool, b);
        STAT(res, background_pins, 1);
        if (a)
            a = find_by_id(res, id); /* it may have been freed or evicted meanwhile */
        if (a && !a->host)
            attach_host(res, a, b);
        else
            fs_phys_pool_put(&res->host_pool, b);
    }
    pthread_mutex_unlock(&res->lock);
    return NULL;
}

/* Wake the pinner, started now if this is its first work (lock held). Not started before: an idle
 * pinner thread was measured to slow a paused decode step by 6% (an H100, docs/PERFORMANCE.md,
 * stop 30), and a plan that moves nothing never needs one. */
static void wake_pinner(struct fs_residency *res)
{
    if (!res->pinner_started && res->background_pinning && !res->pinner_failed) {
        res->pinner_started = pthread_create(&res->pinner, NULL, pinner_main, res) == 0;
        res->pinner_failed = !res->pinner_started;
        STAT(res, pinner_starts, res->pinner_started);
        if (res->pinner_failed)
            FS_WARN("cannot start the background pinning thread; host memory is pinned on demand");
    }
    if (res->pinner_started)
        pthread_cond_signal(&res->pinner_wake);
}

void fs_res_prepin(struct fs_residency *res, const uint64_t *sizes, int n)
{
    if (!res->background_pinning || n <= 0)
        return;
    uint64_t *copy = malloc((size_t)n * sizeof(*copy));
    if (!copy)
        return; /* pinned on demand, as without a plan */
    memcpy(copy, sizes, (size_t)n * sizeof(*copy));
    pthread_mutex_lock(&res->lock);
    free(res->prepin);
    res->prepin = copy;
    res->nprepin = n;
    res->prepin_next = 0;
    wake_pinner(res);
    pthread_mutex_unlock(&res->lock);
}

/* A host block of SIZE bytes: a pinned one from the pool, else one pinned now, on the caller's
 * thread, which stands for a block of that size still to come in the pre-pinning list (so the
 * pinner does not pin it again: the pool would keep both). Lock held. */
static int host_block_get(struct fs_residency *res, uint64_t size, struct fs_block **out)
{
    bool ready = fs_phys_pool_has(&res->host_pool, size);
    int rc = fs_phys_pool_get(&res->host_pool, size, true, out);
    if (rc != FS_OK || ready)
        return rc;
    for (int i = res->prepin_next; i < res->nprepin; i++)
        if (res->prepin[i] == size) {
            res->prepin[i] = res->prepin[res->prepin_next++];
            break;
        }
    return rc;
}

/* Wake the pinner when the budget leaves allocations without host memory (lock held). */
static void update_host_target(struct fs_residency *res)
{
    if (res->background_pinning && host_deficit(res) > 0)
        wake_pinner(res);
}

/* ---- init and teardown ---------------------------------------------------------------------- */

int fs_res_init(struct fs_residency *res, struct fs_device *dev, const struct fs_res_config *cfg)
{
    memset(res, 0, sizeof(*res));
    res->dev = dev;
    res->budget = cfg->budget;
    res->strict = cfg->strict_remap;
    uint64_t g = dev->props.granularity;
    int rc = fs_va_space_init(&res->vs, dev, cfg->va_space_bytes, 64 * g);
    if (rc != FS_OK)
        return rc;
    fs_phys_pool_init(&res->dev_pool, dev, FS_LOC_DEVICE);
    fs_phys_pool_init(&res->host_pool, dev, FS_LOC_HOST);
    rc = fs_dev_call(dev, stream_create, &res->h2d);
    if (rc != FS_OK)
        goto fail_pools;
    rc = fs_dev_call(dev, stream_create, &res->d2h);
    if (rc != FS_OK)
        goto fail_h2d;
    if (fs_dev_call(dev, stream_create, &res->fp_side) != FS_OK)
        res->fp_side = NULL;
    fs_probe_pool_init(&res->ordered_probes, dev, -1);
    pthread_mutex_init(&res->lock, NULL);
    pthread_mutex_init(&res->ev_lock, NULL);
    pthread_cond_init(&res->moved, NULL);
    pthread_cond_init(&res->pinner_wake, NULL);
    res->epoch = res->synced_epoch = 1;
    if (cfg->fingerprint && fs_dev_call(dev, host_alloc, FS_FP_PARTS_BYTES,
                                        (void **)&res->fp_parts) != FS_OK) {
        res->fp_parts = NULL;
        FS_INFO("no host memory for fingerprints: every eviction copies its data back to host");
    }
    res->background_pinning = cfg->background_pinning;
    res->wait_event_flags = cfg->copy_wait == FS_COPY_WAIT_BLOCK ? FS_EVENT_BLOCKING : 0;
    res->predicted_waits = cfg->copy_wait == FS_COPY_WAIT_PREDICT;
    return FS_OK;
fail_h2d:
    fs_dev_call(dev, stream_destroy, res->h2d);
fail_pools:
    fs_phys_pool_destroy(&res->host_pool);
    fs_phys_pool_destroy(&res->dev_pool);
    fs_va_space_destroy(&res->vs);
    return rc;
}

/* A remap of A (OP: FS_REMAP_MAP or FS_REMAP_UNMAP, of memory at LOC) that ran from T0 to T1:
 * the driver's remap time, counted by kind and drawn in the run trace. */
static void count_remap(struct fs_residency *res, const struct fs_alloc *a, int op,
                        enum fs_mem_loc loc, uint64_t t0, uint64_t t1)
{
    static const enum fs_rt_kind kinds[2][2] = {
        [FS_REMAP_MAP] = {[FS_LOC_DEVICE] = FS_RT_MAP_DEVICE, [FS_LOC_HOST] = FS_RT_MAP_HOST},
        [FS_REMAP_UNMAP] = {[FS_LOC_DEVICE] = FS_RT_UNMAP_DEVICE, [FS_LOC_HOST] = FS_RT_UNMAP_HOST}};
    __atomic_add_fetch(&res->stats.remaps[op][loc], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&res->stats.remap_ns[op][loc], t1 - t0, __ATOMIC_RELAXED);
    __atomic_add_fetch(&res->stats.remap_bytes[op][loc], a->mapped, __ATOMIC_RELAXED);
    fs_rt_span(kinds[op][loc], a->id, a->mapped, t0, t1);
}

/* Map block B at A's VA (map + set access) / unmap A's VA, backed by LOC. */
static int map_at(struct fs_residency *res, const struct fs_alloc *a, const struct fs_block *b)
{
    uint64_t t0 = fs_now_ns();
    int rc = fs_dev_call(res->dev, map, a->va, a->mapped, b->phys, 0);
    count_remap(res, a, FS_REMAP_MAP, b->loc, t0, fs_now_ns());
    return rc;
}

static int unmap_at(struct fs_residency *res, const struct fs_alloc *a, enum fs_mem_loc loc)
{
    uint64_t t0 = fs_now_ns();
    int rc = fs_dev_call(res->dev, unmap, a->va, a->mapped);
    count_remap(res, a, FS_REMAP_UNMAP, loc, t0, fs_now_ns());
    return rc;
}

/* A's stage address (0: none), counted in staged_live. Lock held. */
static void set_stage(struct fs_residency *res, struct fs_alloc *a, fs_dptr stage_va)
{
    if ((LOAD(&a->stage_va) != 0) != (stage_va != 0))
        __atomic_add_fetch(&res->staged_live, stage_va ? 1 : -1, __ATOMIC_ACQ_REL);
    STORE(&a->stage_va, stage_va);
}

/* ---- plain device memory (fs_alloc.plain) ---------------------------------------------------- */

/* Device bytes the budget counts: the pool's (used and cached) and the plain allocations' (lock
 * held). */
static uint64_t device_used(struct fs_residency *res)
{
    return fs_phys_pool_held(&res->dev_pool) + fs_phys_pool_outside(&res->dev_pool);
}

/* Index in plain[] of the first allocation above ADDR (lock held). */
static size_t plain_upper(const struct fs_residency *res, fs_dptr addr)
{
    size_t lo = 0, hi = res->nplain;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (res->plain[mid]->va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The plain allocation containing ADDR, or NULL (lock held). */
static struct fs_alloc *plain_find(const struct fs_residency *res, fs_dptr addr)
{
    size_t i = plain_upper(res, addr);
    struct fs_alloc *a = i ? res->plain[i - 1] : NULL;
    return a && addr - a->va < a->size ? a : NULL;
}

/* Give A plain device memory if the budget has room for it without evicting anything (lock
 * held): FS_ERR_NOMEM without room, or the device's error; A is then untouched. */
static int place_plain(struct fs_residency *res, struct fs_alloc *a)
{
    if (device_used(res) + a->mapped > res->budget)
        return FS_ERR_NOMEM;
    if (!fs_grow((void **)&res->plain, &res->cap_plain, res->nplain + 1, sizeof(*res->plain)))
        return FS_ERR_NOMEM;
    int rc = fs_dev_call(res->dev, mem_alloc, a->mapped, &a->va);
    if (rc != FS_OK)
        return rc;
    size_t i = plain_upper(res, a->va);
    memmove(&res->plain[i + 1], &res->plain[i], (res->nplain - i) * sizeof(*res->plain));
    res->plain[i] = a;
    res->nplain++;
    a->plain = true;
    a->state = FS_RES_DEVICE;
    STAT(res, plain_made, 1);
    fs_phys_pool_add_outside(&res->dev_pool, (int64_t)a->mapped);
    return FS_OK;
}

/* Give plain A's memory back and forget it (lock held); A stays listed if the device fails. */
static int release_plain(struct fs_residency *res, struct fs_alloc *a)
{
    int rc = fs_dev_call(res->dev, mem_free, a->va);
    if (rc != FS_OK) {
        FS_WARN("freeing a plain %llu-byte allocation failed (%s)",
                (unsigned long long)a->size, fs_err_str(rc));
        return rc;
    }
    size_t i = plain_upper(res, a->va) - 1;
    memmove(&res->plain[i], &res->plain[i + 1], (res->nplain - i - 1) * sizeof(*res->plain));
    res->nplain--;
    fs_phys_pool_add_outside(&res->dev_pool, -(int64_t)a->mapped);
    STAT(res, allocs_live, -1);
    STAT(res, bytes_live, -a->mapped);
    return FS_OK;
}

static void alloc_release_memory(struct fs_residency *res, struct fs_alloc *a)
{
    bool on_host = !a->dev || LOAD(&a->state) == FS_RES_STAGED;
    set_stage(res, a, 0);
    int rc = unmap_at(res, a, on_host ? FS_LOC_HOST : FS_LOC_DEVICE);
    if (rc != FS_OK)
        FS_WARN("unmapping a freed allocation failed (%s)", fs_err_str(rc));
    fs_phys_pool_put(&res->dev_pool, a->dev);
    fs_phys_pool_put(&res->host_pool, a->host);
    if (a->host)
        res->host_backed_bytes -= a->host->size;
    a->dev = a->host = NULL;
    fs_va_space_set_owner(&res->vs, a->va, a->mapped, NULL);
    fs_va_space_free(&res->vs, a->va, a->mapped);
    event_put(res, a->last_use);
    a->last_use = NULL;
}

void fs_res_destroy(struct fs_residency *res)
{
    if (!res->dev)
        return;
    if (res->pinner_started) {
        pthread_mutex_lock(&res->lock);
        res->pinner_stop = true;
        pthread_cond_signal(&res->pinner_wake);
        pthread_mutex_unlock(&res->lock);
        pthread_join(res->pinner, NULL);
    }
    free(res->prepin);
    free(res->plan_role);
    fs_dev_call(res->dev, ctx_sync);
    for (int i = 0; i < res->nallocs; i++) {
        alloc_release_memory(res, res->allocs[i]);
        free(res->allocs[i]);
    }
    free(res->allocs);
    while (res->nplain > 0) {
        struct fs_alloc *a = res->plain[res->nplain - 1];
        if (release_plain(res, a) != FS_OK)
            res->nplain--; /* the device failed: nothing more can be given back */
        free(a);
    }
    free(res->plain);
    events_destroy(res);
    fs_probe_pool_destroy(&res->ordered_probes);
    fs_dev_call(res->dev, stream_destroy, res->h2d);
    fs_dev_call(res->dev, stream_destroy, res->d2h);
    if (res->fp_side)
        fs_dev_call(res->dev, stream_destroy, res->fp_side);
    fs_dev_call(res->dev, host_free, res->fp_parts);
    fs_phys_pool_destroy(&res->host_pool);
    fs_phys_pool_destroy(&res->dev_pool);
    fs_va_space_destroy(&res->vs);
    pthread_cond_destroy(&res->pinner_wake);
    pthread_cond_destroy(&res->moved);
    pthread_mutex_destroy(&res->ev_lock);
    pthread_mutex_destroy(&res->lock);
    memset(res, 0, sizeof(*res));
}

/* ---- the quiet-range rule ------------------------------------------------------------------- */

/* Mark A as moving; fails (FS_ERR_NOT_READY) if a launch holds it. Pairs with the hold in
 * fs_res_launch_begin: each side writes, then reads the other's variable, both sequentially
 * consistent, so at least one of them sees the other. Lock held. */
static int begin_move(struct fs_alloc *a)
{
    int old = LOAD(&a->state);
    __atomic_store_n(&a->state, FS_RES_MOVING, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&a->inflight, __ATOMIC_SEQ_CST) != 0) {
        STORE(&a->state, old);
        return FS_ERR_NOT_READY;
    }
    return FS_OK;
}

static void end_move(struct fs_residency *res, struct fs_alloc *a, int state)
{
    STORE(&a->state, state);
    pthread_cond_broadcast(&res->moved);
}

/* Tracked mode: what may still be using A. *UNTOUCHED: nothing, since the last full
 * synchronize; else its last-use event, which covers every use of A; NULL when that is not
 * known (an unknown launch, or a use no event covers): only a full synchronize tells. */
static struct fs_shared_event *last_use_of(struct fs_residency *res, struct fs_alloc *a,
                                           bool *untouched)
{
    uint64_t synced = LOAD(&res->synced_epoch);
    *untouched = false;
    if (LOAD(&res->unknown_epoch) >= synced)
        return NULL;
    if (LOAD(&a->touch_epoch) < synced) {
        *untouched = true;
        return NULL;
    }
    if (LOAD(&a->skip_epoch) >= synced) /* a use since the synchronize that no event covers */
        return NULL;
    struct fs_shared_event *e = a->last_use;
    return e && a->event_tick >= LOAD(&a->last_tick) ? e : NULL;
}

/* Strict mode: stop new launches at the gate, let the ones being queued finish queuing, and wait
 * for all queued work, so nothing (not even a kernel holding A's address in device memory) can be
 * touching A during the remap. Tracked mode: wait only for what may reference A; with ORDER_ON,
 * when A's last use is one event, make that stream wait for it instead of the host (work queued
 * there afterwards, and the remap once it completed, come after A's last use). Lock held, A
 * moving. Pair with quiesce_end. */
static int quiesce_on(struct fs_residency *res, struct fs_alloc *a, fs_stream order_on)
{
    /* Close the gate and let the launches being queued finish queuing: every launch in strict
     * mode, the unknown ones (parameters unreadable, so they hold nothing) in tracked mode. */
    __atomic_add_fetch(&res->gate, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&res->launches_inflight, __ATOMIC_SEQ_CST) != 0)
        sched_yield();
    if (!res->strict) {
        bool untouched;
        struct fs_shared_event *e = last_use_of(res, a, &untouched);
        if (untouched)
            return FS_OK;
        if (e) {
            if (!order_on)
                return fs_dev_call(res->dev, event_sync, e->ev);
            /* Waiting on an event recorded in a capture would pull our stream into the
             * program's graph: try again once the capture is over. */
            bool capturing = false;
            if (fs_dev_call(res->dev, stream_capturing, e->stream, &capturing) != FS_OK ||
                capturing)
                return FS_ERR_NOT_READY;
            return fs_dev_call(res->dev, stream_wait_event, order_on, e->ev);
        }
    }
    STAT(res, quiesce_syncs, 1);
    /* The new epoch starts before the synchronize: a launch stamped with an older one was
     * queued before it began, so the synchronize covers it. */
    uint64_t next = __atomic_add_fetch(&res->epoch, 1, __ATOMIC_ACQ_REL);
    uint64_t t0 = fs_now_ns();
    int rc = fs_dev_call(res->dev, ctx_sync);
    fs_rt_span(FS_RT_SYNC, a->id, a->mapped, t0, fs_now_ns());
    if (rc == FS_OK && LOAD(&res->synced_epoch) < next)
        STORE(&res->synced_epoch, next);
    return rc;
}

static void quiesce_end(struct fs_residency *res)
{
    if (__atomic_sub_fetch(&res->gate, 1, __ATOMIC_SEQ_CST) == 0)
        pthread_cond_broadcast(&res->moved); /* launches waiting at the gate (lock held) */
}

/* Tracked mode, A moving: has every use of A that may run finished? Never waits. */
static bool quiet_now(struct fs_residency *res, struct fs_alloc *a)
{
    bool untouched;
    struct fs_shared_event *e = last_use_of(res, a, &untouched);
    return untouched || (e && fs_dev_call(res->dev, event_query, e->ev) == FS_OK);
}

/* Replace A's mapping FROM by TO; on failure map FROM again so the VA stays mapped. */
static int remap(struct fs_residency *res, struct fs_alloc *a, struct fs_block *from,
                 struct fs_block *to)
{
    int rc = unmap_at(res, a, from->loc);
    if (rc != FS_OK)
        return rc;
    rc = map_at(res, a, to);
    if (rc == FS_OK)
        return FS_OK;
    if (map_at(res, a, from) != FS_OK)
        FS_ERROR("allocation %llu (%llu bytes at 0x%llx) could not be mapped again after a failed "
                 "remap; a kernel touching it will fail",
                 (unsigned long long)a->id, (unsigned long long)a->size,
                 (unsigned long long)a->va);
    return rc;
}

/* ---- fingerprints and write-back ------------------------------------------------------------ */

/* The fingerprint of SIZE bytes at VA, queued on STREAM and waited for (the stream's earlier work
 * too). FS_ERR_UNSUPPORTED when fingerprints are off or the device cannot take them. Lock held:
 * one result buffer. */
static int fp_take(struct fs_residency *res, fs_dptr va, uint64_t size, fs_stream stream,
                   struct fs_fp *out)
{
    if (!res->fp_parts)
        return FS_ERR_UNSUPPORTED;
    int rc = fs_dev_call(res->dev, fingerprint, va, size, stream, res->fp_parts);
    if (rc == FS_ERR_UNSUPPORTED) {
        fs_dev_call(res->dev, host_free, res->fp_parts);
        res->fp_parts = NULL; /* say it once (the device did), then stop asking */
        return rc;
    }
    if (rc == FS_OK)
        rc = fs_dev_call(res->dev, stream_sync, stream);
    if (rc != FS_OK)
        return rc;
    STAT(res, fingerprints, 1);
    *out = fs_fp_combine(res->fp_parts);
    return FS_OK;
}

int fs_res_fingerprint_all(struct fs_residency *res, struct fs_fp *fp, bool *known, int n)
{
    for (int i = 0; i < n; i++)
        known[i] = false;
    pthread_mutex_lock(&res->lock);
    int rc = res->fp_parts ? fs_dev_call(res->dev, ctx_sync) : FS_ERR_UNSUPPORTED;
    fs_stream stream = res->fp_side ? res->fp_side : res->h2d;
    for (int k = 0; rc == FS_OK && k < res->nallocs; k++) {
        struct fs_alloc *a = res->allocs[k];
        if (!a || a->id >= (uint64_t)n || LOAD(&a->state) == FS_RES_MOVING)
            continue;
        /* a stage holds the current bytes: launches were redirected to it */
        fs_dptr va = LOAD(&a->stage_va) ? LOAD(&a->stage_va) : a->va;
        int one = fp_take(res, va, a->mapped, stream, &fp[a->id]);
        if (one == FS_ERR_UNSUPPORTED)
            rc = one;
        known[a->id] = one == FS_OK;
    }
    pthread_mutex_unlock(&res->lock);
    return rc;
}

/* Make A's host block hold the bytes of its device block (mapped at A's VA, or A's stage), with
 * the write-back finished: skipped when the device bytes' fingerprint equals the one of the host
 * copy (invariant 3's check), else copied, and the fingerprint then describes the new host copy.
 * The range is quiet. Lock held. */
static int write_back(struct fs_residency *res, struct fs_alloc *a)
{
    fs_dptr src = a->dev->copy_va;
    struct fs_fp now;
    bool known = a->fp_valid && fp_take(res, src, a->mapped, res->d2h, &now) == FS_OK;
    if (known && fs_fp_equal(now, a->fp)) {
        STAT(res, clean_evictions, 1);
        STAT(res, clean_bytes, a->mapped);
        return FS_OK;
    }
    a->fp_valid = false;
    int rc = fs_block_copy(res->dev, a->host, src, a->mapped, true, res->d2h);
    if (rc != FS_OK)
        return rc;
    /* Not known yet: fingerprint what was just copied (it waits for the copy too). */
    if (!known)
        known = fp_take(res, src, a->mapped, res->d2h, &now) == FS_OK;
    rc = fs_dev_call(res->dev, stream_sync, res->d2h);
    if (rc == FS_OK && known) {
        a->fp = now;
        a->fp_valid = true;
    }
    return rc;
}

/* ---- eviction and fault-in (lock held) ------------------------------------------------------ */

/* A is never moved again (residency.h, fs_alloc.frozen). Lock held. */
static void freeze_locked(struct fs_residency *res, struct fs_alloc *a)
{
    if (!a->frozen)
        STAT(res, frozen, 1);
    a->frozen = true;
}

/* A move of A that failed, left in STATE: counted, and said in one warning ("DOING allocation
 * N (B bytes) failed (why); OUTCOME"). Lock held. */
static void move_abandoned(struct fs_residency *res, struct fs_alloc *a, const char *doing,
                           int rc, const char *outcome, int state)
{
    STAT(res, failures, 1);
    FS_WARN("%s allocation %llu (%llu bytes) failed (%s); %s", doing, (unsigned long long)a->id,
            (unsigned long long)a->size, fs_err_str(rc), outcome);
    end_move(res, a, state);
}

/* A is on the device now, brought in by the plan (STAGED: as a device copy). */
static void count_move_in(struct fs_residency *res, const struct fs_alloc *a, bool staged)
{
    if (staged) {
        STAT(res, stage_ins, 1);
        STAT(res, staged_bytes, a->mapped);
    } else {
        STAT(res, prefetches, 1);
        STAT(res, prefetched_bytes, a->mapped);
    }
}

/* End A's stage: once its last use is done, write its device copy back if it changed, and give
 * the block back; launches then read A from host. */
static int unstage_locked(struct fs_residency *res, struct fs_alloc *a)
{
    int rc = begin_move(a);
    if (rc != FS_OK)
        return rc;
    fs_dptr stage_va = LOAD(&a->stage_va);
    set_stage(res, a, 0);
    rc = quiesce_on(res, a, NULL);
    if (rc == FS_OK)
        rc = write_back(res, a);
    quiesce_end(res);
    if (rc != FS_OK) {
        set_stage(res, a, stage_va); /* the device copy may be the only current one */
        move_abandoned(res, a, "ending the device copy of", rc, "launches keep using it",
                       FS_RES_STAGED);
        return rc;
    }
    fs_phys_pool_put(&res->dev_pool, a->dev);
    a->dev = NULL;
    STAT(res, stage_outs, 1);
    end_move(res, a, FS_RES_HOST);
    return FS_OK;
}

static int evict_locked(struct fs_residency *res, struct fs_alloc *a)
{
    if (LOAD(&a->state) == FS_RES_STAGED)
        return unstage_locked(res, a);
    if (LOAD(&a->state) != FS_RES_DEVICE)
        return FS_ERR_INVALID;
    if (a->frozen)
        return FS_ERR_NOT_READY; /* as if a launch held it, for good */
    int rc = begin_move(a);
    if (rc != FS_OK)
        return rc;
    if (!a->host) {
        struct fs_block *b;
        rc = host_block_get(res, a->mapped, &b);
        if (rc != FS_OK)
            goto fail;
        attach_host(res, a, b);
    }
    rc = quiesce_on(res, a, NULL);
    if (rc == FS_OK)
        rc = write_back(res, a);
    if (rc == FS_OK)
        rc = remap(res, a, a->dev, a->host);
    quiesce_end(res);
    if (rc != FS_OK)
        goto fail;
    fs_phys_pool_put(&res->dev_pool, a->dev);
    a->dev = NULL;
    STAT(res, evictions, 1);
    STAT(res, evicted_bytes, a->mapped);
    STORE(&res->pressure, 1);
    end_move(res, a, FS_RES_HOST);
    return FS_OK;
fail:
    move_abandoned(res, a, "evicting", rc, "it stays on the device", FS_RES_DEVICE);
    return rc;
}

static bool in_list(const struct fs_alloc *a, struct fs_alloc *const *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] == a)
            return true;
    return false;
}

static int plan_role(const struct fs_residency *res, const struct fs_alloc *a)
{
    return a->id < (uint64_t)res->nplan_role ? res->plan_role[a->id] & FS_PLAN_ROLE_MASK
                                             : FS_PLAN_MOVED;
}

/* May A be frozen where it is: on the device, or on host where the plan serves it from (a plan
 * that moves nothing reads it in place)? Lock held. */
static bool freezable(const struct fs_residency *res, const struct fs_alloc *a)
{
    int state = LOAD(&a->state);
    return state == FS_RES_DEVICE || (state == FS_RES_HOST && plan_role(res, a) == FS_PLAN_HOST);
}

/* The least recently used allocation on the device, not in KEEP, one the plan does not keep
 * resident if there is such. Lock held. */
static struct fs_alloc *pick_victim(struct fs_residency *res, struct fs_alloc *const *keep,
                                    int nkeep)
{
    struct fs_alloc *best = NULL;
    bool best_kept = false;
    for (int i = 0; i < res->nallocs; i++) {
        struct fs_alloc *a = res->allocs[i];
        int state = LOAD(&a->state);
        if ((state != FS_RES_DEVICE && state != FS_RES_STAGED) || LOAD(&a->inflight) != 0 ||
            a->frozen || in_list(a, keep, nkeep))
            continue;
        bool kept = plan_role(res, a) == FS_PLAN_KEPT;
        if (!best || (best_kept && !kept) ||
            (kept == best_kept && LOAD(&a->lru_tick) < LOAD(&best->lru_tick))) {
            best = a;
            best_kept = kept;
        }
    }
    return best;
}

void fs_res_set_plan_roles(struct fs_residency *res, uint8_t *role, int n)
{
    pthread_mutex_lock(&res->lock);
    free(res->plan_role);
    res->plan_role = role;
    res->nplan_role = role ? n : 0;
    for (int i = 0; i < res->nallocs; i++)
        STORE(&res->allocs[i]->kept, plan_role(res, res->allocs[i]) == FS_PLAN_KEPT);
    pthread_mutex_unlock(&res->lock);
}

/* Is there room for NEED bytes now, without evicting: a cached block of that size (*GROW false)
 * or budget left for a new one (*GROW true)? */
static bool room_now(struct fs_residency *res, uint64_t need, bool *grow)
{
    *grow = !fs_phys_pool_has(&res->dev_pool, need);
    return !*grow || device_used(res) + need <= res->budget;
}

/* Device memory for NEED bytes within the budget, evicting least recently used allocations not
 * in KEEP. On success *GROW says whether the pool must create memory for it. */
static int make_room(struct fs_residency *res, uint64_t need, struct fs_alloc *const *keep,
                     int nkeep, bool *grow)
{
    if (need + fs_phys_pool_outside(&res->dev_pool) > res->budget)
        return FS_ERR_NOMEM; /* evicting others would not help */
    /* Each round returns, releases a cached block or evicts one allocation: bounded. */
    for (int round = 0; round < 4 * res->nallocs + 8; round++) {
        if (room_now(res, need, grow))
            return FS_OK;
        if (fs_phys_pool_trim(&res->dev_pool, device_used(res) + need - res->budget) > 0)
            continue;
        struct fs_alloc *victim = pick_victim(res, keep, nkeep);
        if (!victim)
            return FS_ERR_NOMEM;
        int rc = evict_locked(res, victim);
        if (rc != FS_OK && rc != FS_ERR_NOT_READY)
            return rc;
    }
    return FS_ERR_NOMEM;
}

/* Bring A onto the device: at its VA, or (STAGE) as a device copy its launches are redirected
 * to, the VA still showing host memory. */
static int fault_in_locked(struct fs_residency *res, struct fs_alloc *a,
                           struct fs_alloc *const *keep, int nkeep, bool stage)
{
    if (LOAD(&a->state) != FS_RES_HOST)
        return LOAD(&a->state) == FS_RES_DEVICE || LOAD(&a->state) == FS_RES_STAGED
                   ? FS_OK
                   : FS_ERR_INVALID;
    if (a->frozen)
        return FS_ERR_NOMEM; /* stays on host: read in place, as when there is no room */
    bool grow;
    int rc = make_room(res, a->mapped, keep, nkeep, &grow);
    if (rc != FS_OK)
        return rc;
    rc = fs_phys_pool_get(&res->dev_pool, a->mapped, grow, &a->dev);
    if (rc != FS_OK)
        return rc;
    /* Launches reading A from host may still be queued: they must finish before the remap. */
    while ((rc = begin_move(a)) == FS_ERR_NOT_READY)
        sched_yield();
    rc = quiesce_on(res, a, NULL);
    if (rc == FS_OK)
        rc = fs_block_copy(res->dev, a->dev, a->va, a->mapped, true, res->h2d);
    /* Host and device copies now agree: their fingerprint lets the next eviction skip the
     * write-back if nothing changes A meanwhile (fp_take waits for the copy too). */
    struct fs_fp fp;
    a->fp_valid = false;
    if (rc == FS_OK && fp_take(res, a->dev->copy_va, a->mapped, res->h2d, &fp) == FS_OK) {
        a->fp = fp;
        a->fp_valid = true;
    } else if (rc == FS_OK) {
        rc = fs_dev_call(res->dev, stream_sync, res->h2d);
    }
    if (rc == FS_OK && !stage)
        rc = remap(res, a, a->host, a->dev);
    quiesce_end(res);
    if (rc != FS_OK) {
        fs_phys_pool_put(&res->dev_pool, a->dev);
        a->dev = NULL;
        move_abandoned(res, a, "bringing back", rc, "it is read from host memory", FS_RES_HOST);
        return rc;
    }
    /* Just brought in for a use to come: not the least recently used. */
    STORE(&a->lru_tick, LOAD(&res->tick));
    if (stage) {
        set_stage(res, a, a->dev->copy_va);
        count_move_in(res, a, true);
    }
    end_move(res, a, stage ? FS_RES_STAGED : FS_RES_DEVICE);
    return FS_OK;
}

/* ---- allocations ---------------------------------------------------------------------------- */

static int list_add(struct fs_residency *res, struct fs_alloc *a)
{
    if (res->nallocs == res->cap_allocs) {
        int cap = res->cap_allocs ? res->cap_allocs * 2 : 64;
        struct fs_alloc **grown = realloc(res->allocs, (size_t)cap * sizeof(*grown));
        if (!grown)
            return FS_ERR_NOMEM;
        res->allocs = grown;
        res->cap_allocs = cap;
    }
    a->index = res->nallocs;
    res->allocs[res->nallocs++] = a;
    return FS_OK;
}

static void list_remove(struct fs_residency *res, struct fs_alloc *a)
{
    struct fs_alloc *last = res->allocs[--res->nallocs];
    res->allocs[a->index] = last;
    last->index = a->index;
}

/* Map the new allocation A to block B of POOL; B goes back to POOL when that fails (lock
 * held). */
static int map_new(struct fs_residency *res, struct fs_alloc *a, struct fs_phys_pool *pool,
                   struct fs_block *b)
{
    int rc = map_at(res, a, b);
    if (rc != FS_OK)
        fs_phys_pool_put(pool, b);
    return rc;
}

/* Map the new allocation A to a device block, evicting others for room (lock held). */
static int place_on_device(struct fs_residency *res, struct fs_alloc *a)
{
    bool grow;
    struct fs_block *b = NULL;
    int rc = make_room(res, a->mapped, NULL, 0, &grow);
    if (rc == FS_OK)
        rc = fs_phys_pool_get(&res->dev_pool, a->mapped, grow, &b);
    if (rc == FS_OK)
        rc = map_new(res, a, &res->dev_pool, b);
    if (rc != FS_OK)
        return rc;
    a->dev = b;
    a->state = FS_RES_DEVICE;
    return FS_OK;
}

/* Map the new allocation A to a pinned host block (lock held). */
static int place_on_host(struct fs_residency *res, struct fs_alloc *a)
{
    struct fs_block *b = NULL;
    int rc = host_block_get(res, a->mapped, &b);
    if (rc == FS_OK)
        rc = map_new(res, a, &res->host_pool, b);
    if (rc != FS_OK)
        return rc;
    attach_host(res, a, b);
    a->state = FS_RES_HOST;
    STAT(res, placed_on_host, 1);
    return FS_OK;
}

/* The plan's role for the allocation made next, with its flags (FS_PLAN_MOVED: none). Lock
 * held. */
static int next_role(const struct fs_residency *res)
{
    return res->next_id < (uint64_t)res->nplan_role ? res->plan_role[res->next_id] : FS_PLAN_MOVED;
}

/* The new allocation A in the VA space: on the device while the budget allows, else on host,
 * where it still works; one the plan offloads starts on host (and takes the device only if no
 * host memory can be pinned). Lock held. */
static int place_in_va_space(struct fs_residency *res, struct fs_alloc *a)
{
    int rc = fs_va_space_alloc(&res->vs, a->mapped, &a->va);
    if (rc != FS_OK)
        return rc;
    bool host_first = next_role(res) & FS_PLAN_START_ON_HOST;
    rc = host_first ? place_on_host(res, a) : place_on_device(res, a);
    if (rc != FS_OK)
        rc = host_first ? place_on_device(res, a) : place_on_host(res, a);
    if (rc != FS_OK) {
        fs_va_space_free(&res->vs, a->va, a->mapped);
        return rc;
    }
    rc = list_add(res, a);
    if (rc != FS_OK)
        alloc_release_memory(res, a); /* also gives the VA range back */
    return rc;
}

int fs_res_alloc(struct fs_residency *res, uint64_t size, fs_dptr *out)
{
    if (size == 0)
        return FS_ERR_INVALID;
    struct fs_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return FS_ERR_NOMEM;
    a->size = size;
    a->mapped = fs_round_up(size, res->dev->props.granularity);
    pthread_mutex_lock(&res->lock);
    /* One the plan starts on host goes there while paused too (a plan that moves nothing: it
     * reads it in place). */
    bool plain = res->freeze_new && !(next_role(res) & FS_PLAN_START_ON_HOST);
    int rc = plain ? place_plain(res, a) : FS_ERR_UNSUPPORTED;
    if (rc != FS_OK)
        rc = place_in_va_space(res, a);
    if (rc != FS_OK) {
        pthread_mutex_unlock(&res->lock);
        free(a);
        return rc;
    }
    a->id = res->next_id++;
    a->touch_epoch = 0;
    if (res->freeze_new && freezable(res, a))
        freeze_locked(res, a);
    STORE(&a->kept, plan_role(res, a) == FS_PLAN_KEPT);
    STAT(res, allocs_live, 1);
    STAT(res, bytes_live, a->mapped);
    update_host_target(res);
    if (!a->plain)
        fs_va_space_set_owner(&res->vs, a->va, a->mapped, a);
    pthread_mutex_unlock(&res->lock);
    *out = a->va;
    return FS_OK;
}

struct fs_alloc *fs_res_find(struct fs_residency *res, uint64_t addr)
{
    struct fs_alloc *a = fs_res_lookup(res, addr);
    if (a)
        return a;
    pthread_mutex_lock(&res->lock);
    a = plain_find(res, addr);
    pthread_mutex_unlock(&res->lock);
    return a;
}

int fs_res_free(struct fs_residency *res, fs_dptr va)
{
    struct fs_alloc *a = (struct fs_alloc *)fs_va_space_lookup(&res->vs, va);
    if (!a) {
        pthread_mutex_lock(&res->lock);
        a = plain_find(res, va);
        pthread_mutex_unlock(&res->lock);
    }
    if (!a)
        return FS_ERR_NOT_FOUND;
    if (a->va != va)
        return FS_ERR_INVALID;
    /* cudaFree synchronizes the device; the program may rely on it. */
    int rc = fs_dev_call(res->dev, ctx_sync);
    if (rc != FS_OK)
        return rc;
    pthread_mutex_lock(&res->lock);
    if (a->plain) {
        rc = release_plain(res, a);
        pthread_mutex_unlock(&res->lock);
        if (rc == FS_OK)
            free(a);
        return rc;
    }
    while (LOAD(&a->state) == FS_RES_MOVING)
        pthread_cond_wait(&res->moved, &res->lock);
    alloc_release_memory(res, a);
    list_remove(res, a);
    STAT(res, allocs_live, -1);
    STAT(res, bytes_live, -a->mapped);
    pthread_mutex_unlock(&res->lock);
    free(a);
    return FS_OK;
}

/* ---- launches ------------------------------------------------------------------------------- */

/* Launches a remap must see finish queuing: all in strict mode, the unknown ones in tracked. */
static bool gated(const struct fs_residency *res, bool unknown)
{
    return res->strict || unknown;
}

/* Wait until the gate is open (lock held). While a launch waits here no asynchronous move
 * begins (gate_waiters), so the moves in flight end and the gate opens. */
static void wait_gate_open(struct fs_residency *res)
{
    __atomic_add_fetch(&res->gate_waiters, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&res->gate, __ATOMIC_SEQ_CST) != 0)
        pthread_cond_wait(&res->moved, &res->lock);
    __atomic_sub_fetch(&res->gate_waiters, 1, __ATOMIC_SEQ_CST);
}

/* A gated launch counts as being queued, unless a remap is waiting at the gate. */
static void enter_gate(struct fs_residency *res, bool unknown)
{
    if (!gated(res, unknown))
        return;
    for (;;) {
        __atomic_add_fetch(&res->launches_inflight, 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&res->gate, __ATOMIC_SEQ_CST) == 0)
            return;
        __atomic_sub_fetch(&res->launches_inflight, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&res->lock);
        wait_gate_open(res);
        pthread_mutex_unlock(&res->lock);
    }
}

static void leave_gate(struct fs_residency *res, bool unknown)
{
    if (gated(res, unknown))
        __atomic_sub_fetch(&res->launches_inflight, 1, __ATOMIC_SEQ_CST);
}

/* End A's stage on the program's thread, for a launch that cannot be redirected (counted): once
 * the launches being queued that hold it are through. Lock held. */
static void unstage_now(struct fs_residency *res, struct fs_alloc *a)
{
    int rc;
    while ((rc = unstage_locked(res, a)) == FS_ERR_NOT_READY)
        sched_yield();
    if (rc == FS_OK)
        STAT(res, unstage_syncs, 1);
}

/* End every stage (for an unknown launch). False during a capture, where nothing may wait: the
 * captured work then reads host copies. */
static bool unstage_all(struct fs_residency *res, fs_stream stream)
{
    bool capturing = false;
    if (fs_dev_call(res->dev, stream_capturing, stream, &capturing) != FS_OK || capturing)
        return false;
    pthread_mutex_lock(&res->lock);
    for (int i = 0; i < res->nallocs && LOAD(&res->staged_live) > 0; i++) {
        struct fs_alloc *a = res->allocs[i];
        if (LOAD(&a->state) == FS_RES_MOVING && LOAD(&a->stage_va) != 0) {
            pthread_cond_wait(&res->moved, &res->lock);
            i = -1; /* the list may have changed meanwhile */
            continue;
        }
        if (LOAD(&a->state) != FS_RES_STAGED)
            continue;
        unstage_now(res, a);
    }
    pthread_mutex_unlock(&res->lock);
    return true;
}

/* An unknown launch may touch any allocation through its host mapping, so it passes the gate
 * only with no stage live. Once it is through, a stage that begins closes the gate and waits for
 * it to be queued (quiesce_on), then synchronizes (unknown_epoch): none can begin under it. One
 * that began before it keeps the gate closed until it is made, and is ended on the next round. */
static void enter_gate_unstaged(struct fs_residency *res, fs_stream stream)
{
    for (;;) {
        if (LOAD(&res->staged_live) > 0 && !unstage_all(res, stream))
            break; /* a capture: it reads host copies */
        enter_gate(res, true);
        if (LOAD(&res->staged_live) == 0)
            return;
        leave_gate(res, true);
    }
    enter_gate(res, true);
}

uint64_t fs_res_launch_begin(struct fs_residency *res, struct fs_alloc *const *allocs, int n,
                             fs_stream stream, bool unknown, bool fixed, bool *redirect)
{
    bool redirected = false;
    uint64_t tick = 0;
    if (FS_UNLIKELY(unknown))
        enter_gate_unstaged(res, stream);
    else
        enter_gate(res, false);
    if (n == 0)
        goto out; /* most launches: nothing managed to hold, no shared counter to touch */
    tick = __atomic_add_fetch(&res->tick, 1, __ATOMIC_RELAXED);
    uint64_t epoch = LOAD(&res->epoch);
    bool slow = false, staged = false;
    for (int i = 0; i < n; i++) {
        struct fs_alloc *a = allocs[i];
        STORE(&a->lru_tick, tick);
        STORE(&a->touch_epoch, epoch);
        __atomic_add_fetch(&a->inflight, 1, __ATOMIC_SEQ_CST);
        int state = __atomic_load_n(&a->state, __ATOMIC_SEQ_CST);
        if (state == FS_RES_STAGED)
            staged = true;
        else if (state != FS_RES_DEVICE)
            slow = true;
    }
    bool capturing = false;
    if (staged || slow)
        if (fs_dev_call(res->dev, stream_capturing, stream, &capturing) != FS_OK)
            capturing = true; /* cannot tell: do nothing that a capture forbids */
    if (FS_LIKELY(!slow) && (!staged || (!fixed && !capturing))) {
        redirected = staged;
        goto counted;
    }

    /* Slow path: drop the holds, move what is needed under the lock, take the holds again. */
    for (int i = 0; i < n; i++)
        __atomic_sub_fetch(&allocs[i]->inflight, 1, __ATOMIC_SEQ_CST);
    leave_gate(res, unknown);
    pthread_mutex_lock(&res->lock);
    /* Any wait drops the lock, and an asynchronous move may begin meanwhile on an allocation
     * already looked at: start over after each, until one pass needs none. Moves begin only
     * under the lock, so once a pass ends without waiting nothing in the list is moving. */
    for (int i = 0; i < n; i++) {
        struct fs_alloc *a = allocs[i];
        /* Arriving: its VA (or its stage) shows the block its copy fills, the launch will wait
         * for the copy on its stream (below). A capture must not depend on work outside it, and
         * a launch that cannot be redirected must not see a stage begin: wait here. */
        bool arriving = LOAD(&a->state) == FS_RES_MOVING && LOAD(&a->arriving) && !capturing &&
                        !(fixed && LOAD(&a->stage_va) != 0);
        if ((LOAD(&a->state) == FS_RES_MOVING && !arriving) ||
            (gated(res, unknown) && __atomic_load_n(&res->gate, __ATOMIC_SEQ_CST) != 0)) {
            if (LOAD(&a->state) == FS_RES_MOVING)
                pthread_cond_wait(&res->moved, &res->lock);
            else
                wait_gate_open(res);
            i = -1;
            continue;
        }
        /* A copy or memset reads or writes the VA itself: end the stage, so that it touches
         * the only copy. It waits for the stage's last use (another launch may hold it). */
        if (LOAD(&a->state) == FS_RES_STAGED && fixed && !capturing)
            unstage_now(res, a);
        int role = plan_role(res, a);
        bool faulted = false;
        if (LOAD(&a->state) == FS_RES_HOST && !capturing && role != FS_PLAN_HOST &&
            role != FS_PLAN_STAGED) {
            uint64_t t0 = fs_now_ns();
            faulted = fault_in_locked(res, a, allocs, n, false) == FS_OK;
            if (faulted) {
                STAT(res, faults, 1);
                STAT(res, faulted_bytes, a->mapped);
                fs_rt_span(FS_RT_FAULT_IN, a->id, a->mapped, t0, fs_now_ns());
            }
        }
        if (!faulted && (LOAD(&a->state) == FS_RES_HOST ||
                         (LOAD(&a->state) == FS_RES_STAGED && (fixed || capturing)))) {
            STAT(res, host_served, 1);
            a->fp_valid = false; /* the launch may write the host copy */
            uint64_t now = fs_now_ns();
            fs_rt_span(FS_RT_HOST_READ, a->id, a->mapped, now, now);
        }
    }
    /* A prefetch ends under the lock: what is arriving now stays so until the holds are taken,
     * and a hold keeps it from being moved again. With the run trace on, a probe measures what
     * the waits cost the stream on the device (stream_probe.h). */
    struct fs_probe *probe = NULL;
    int waits = 0;
    for (int i = 0; i < n; i++) {
        struct fs_alloc *a = allocs[i];
        if (LOAD(&a->state) != FS_RES_MOVING)
            continue;
        if (waits++ == 0 && fs_rt_on()) /* arriving: not in a graph capture (above) */
            probe = fs_probe_begin(&res->ordered_probes, stream, true);
        if (fs_dev_call(res->dev, stream_wait_event, stream, a->arrive_ev) != FS_OK)
            fs_dev_call(res->dev, event_sync, a->arrive_ev); /* the copy has landed, or failed */
        STAT(res, ordered_waits, 1);
    }
    /* a wait on the device: no allocation or host time to draw it with */
    fs_probe_end(&res->ordered_probes, probe, stream, 0, 0, 0, 0);
    /* Under the lock no move begins and, for a gated launch, the gate is open (checked in the
     * pass above, and closed only under the lock), so these holds need no handshake. */
    if (gated(res, unknown))
        __atomic_add_fetch(&res->launches_inflight, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n; i++) {
        __atomic_add_fetch(&allocs[i]->inflight, 1, __ATOMIC_SEQ_CST);
        if (LOAD(&allocs[i]->stage_va) != 0 && !fixed && !capturing)
            redirected = true;
    }
    pthread_mutex_unlock(&res->lock);
counted:
    if (redirected) /* also on the fast path, without the lock */
        __atomic_add_fetch(&res->stats.redirected, 1, __ATOMIC_RELAXED);
out:
    if (redirect)
        *redirect = redirected;
    return tick;
}

void fs_res_launch_done(struct fs_residency *res, uint64_t tick, fs_stream stream,
                        struct fs_alloc *const *allocs, int n, bool queued, bool unknown)
{
    struct fs_shared_event *e = NULL;
    /* An event costs a driver call per launch: only where an allocation may move. */
    bool may_move = false;
    if (queued && !res->strict && LOAD(&res->pressure))
        for (int i = 0; i < n && !may_move; i++)
            may_move = !LOAD(&allocs[i]->kept);
    if (may_move) {
        e = event_get(res);
        if (e && fs_dev_call(res->dev, event_record, e->ev, stream) != FS_OK) {
            e->refs = 1;
            event_put(res, e);
            e = NULL;
        }
    }
    if (e) {
        e->stream = stream;
        __atomic_store_n(&e->refs, n, __ATOMIC_RELEASE);
        for (int i = 0; i < n; i++) {
            struct fs_alloc *a = allocs[i];
            struct fs_shared_event *old = __atomic_exchange_n(&a->last_use, e, __ATOMIC_ACQ_REL);
            /* An older use on another stream that may still run is not covered by E. */
            bool covered = !old || old->stream == stream ||
                           fs_dev_call(res->dev, event_query, old->ev) == FS_OK;
            STORE(&a->event_tick, covered ? tick : 0);
            event_put(res, old);
        }
    }
    /* Stamped again now that the launch is queued: a synchronize that began before this point
     * may not cover it. Its tick becomes the use a remap must wait for only now, so a launch
     * that faults an allocation in does not wait for itself. */
    uint64_t epoch = LOAD(&res->epoch);
    for (int i = 0; i < n; i++) {
        STORE(&allocs[i]->touch_epoch, epoch);
        if (queued) {
            STORE(&allocs[i]->last_tick, tick);
            if (!e)
                STORE(&allocs[i]->skip_epoch, epoch);
        }
        __atomic_sub_fetch(&allocs[i]->inflight, 1, __ATOMIC_SEQ_CST);
    }
    /* Stamped before leaving the gate: a remap waiting there then sees it and synchronizes. */
    if (unknown && queued)
        STORE(&res->unknown_epoch, epoch);
    leave_gate(res, unknown);
}

/* ---- planner entry points ------------------------------------------------------------------- */

/* Queue EV after the moved data's fingerprint (into PARTS), if fingerprints are on. Lock held. */
static void move_queue_fp(struct fs_residency *res, struct fs_res_move *m, fs_dptr va,
                          fs_stream stream)
{
    m->fp_queued = res->fp_parts &&
                   fs_dev_call(res->dev, fingerprint, va, m->a->mapped, stream, m->parts) == FS_OK;
    STAT(res, fingerprints, m->fp_queued);
}

/* A prefetch's copy has been queued on h2d and EV recorded after it: its fingerprint runs on the
 * side stream when the move has an event for it (the link then goes on with the next copy at
 * once), else on h2d, recording EV again. Lock held. */
static int move_queue_prefetch_fp(struct fs_residency *res, struct fs_res_move *m)
{
    if (res->fp_parts && res->fp_side && m->fp_ev &&
        fs_dev_call(res->dev, stream_wait_event, res->fp_side, m->ev) == FS_OK) {
        move_queue_fp(res, m, m->block->copy_va, res->fp_side);
        if (m->fp_queued) {
            int rc = fs_dev_call(res->dev, event_record, m->fp_ev, res->fp_side);
            m->fp_side = rc == FS_OK;
            return rc;
        }
    }
    move_queue_fp(res, m, m->block->copy_va, res->h2d);
    return m->fp_queued ? fs_dev_call(res->dev, event_record, m->ev, res->h2d) : FS_OK;
}

/* The event after which M is over: its copy done and, for a prefetch, its fingerprint taken
 * (a launch writing the block before that would make the fingerprint describe its result). */
static fs_event move_done_ev(const struct fs_res_move *m)
{
    return m->fp_side ? m->fp_ev : m->ev;
}

/* Where M's allocation was before the move began: where a failed move leaves it. */
static int move_origin(const struct fs_res_move *m)
{
    return !m->evict ? FS_RES_HOST : m->staged ? FS_RES_STAGED : FS_RES_DEVICE;
}

/* A link model outside these bounds is no measurement of a real link (a profile edited by hand,
 * or measured wrong): waits do not sleep on it. */
#define LINK_MIN_BYTES_PER_US 1e3  /* 1 GB/s */
#define LINK_MAX_BYTES_PER_US 1e7  /* 10 TB/s */
#define LINK_MAX_LATENCY_US 1e4    /* 10 ms */

void fs_res_set_link(struct fs_residency *res, double h2d_latency_us, double h2d_bytes_per_us,
                     double d2h_latency_us, double d2h_bytes_per_us)
{
    const double lat[2] = {[FS_LINK_H2D] = h2d_latency_us, [FS_LINK_D2H] = d2h_latency_us};
    const double bw[2] = {[FS_LINK_H2D] = h2d_bytes_per_us, [FS_LINK_D2H] = d2h_bytes_per_us};
    bool all_ok = true;
    pthread_mutex_lock(&res->lock);
    for (int d = 0; d < 2; d++) {
        bool ok = bw[d] >= LINK_MIN_BYTES_PER_US && bw[d] <= LINK_MAX_BYTES_PER_US &&
                  lat[d] >= 0 && lat[d] <= LINK_MAX_LATENCY_US;
        res->link[d].latency_ns = ok ? lat[d] * 1e3 : 0;
        res->link[d].ns_per_byte = ok ? 1e3 / bw[d] : 0;
        all_ok &= ok;
    }
    pthread_mutex_unlock(&res->lock);
    if (res->predicted_waits && !all_ok)
        FS_INFO("COPY_WAIT=predict: the profile's link model (host to device %.0f bytes/us after "
                "%.1f us, device to host %.0f after %.1f) is not a plausible link; copy waits of "
                "that direction wait as the context does (record the profile again on this "
                "machine)", h2d_bytes_per_us, h2d_latency_us, d2h_bytes_per_us, d2h_latency_us);
}

/* The link direction of M's copies. */
static int move_link(const struct fs_res_move *m)
{
    return m->evict ? FS_LINK_D2H : FS_LINK_H2D;
}

/* COPY_WAIT=predict: how long a copy of BYTES in direction DIR takes on the link model (0: no
 * model). Lock held. */
static uint64_t predicted_copy_ns(const struct fs_residency *res, int dir, uint64_t bytes)
{
    const struct fs_res_link *l = &res->link[dir];
    if (!res->predicted_waits || l->ns_per_byte <= 0)
        return 0;
    double ns = l->latency_ns + (double)bytes * l->ns_per_byte;
    return ns < 1e12 ? (uint64_t)ns : 0; /* over 1000 s: no copy; not worth predicting */
}

uint64_t fs_res_copy_wake_ns(uint64_t queued_ns, uint64_t prev_end_ns, uint64_t copy_ns)
{
    uint64_t began = prev_end_ns > queued_ns ? prev_end_ns : queued_ns;
    uint64_t margin = copy_ns / 5 > FS_COPY_WAKE_MARGIN_NS ? copy_ns / 5 : FS_COPY_WAKE_MARGIN_NS;
    return copy_ns > margin ? began + copy_ns - margin : 0;
}

/* Queue M's copy of its allocation from SRC into block DST on its direction's stream, stamped
 * just before for COPY_WAIT=predict (its earliest start). */
static int move_copy(struct fs_residency *res, struct fs_res_move *m, const struct fs_block *dst,
                     fs_dptr src)
{
    m->t_queued_ns = fs_now_ns();
    return fs_block_copy(res->dev, dst, src, m->a->mapped, true, m->evict ? res->d2h : res->h2d);
}

/* Eviction: compare fingerprints first when the host copy has one, else copy right away (from
 * the device block: A's VA shows host memory when A is staged). */
static int move_begin_evict(struct fs_residency *res, struct fs_res_move *m)
{
    struct fs_alloc *a = m->a;
    fs_dptr src = a->dev->copy_va;
    if (a->fp_valid && res->fp_parts &&
        fs_dev_call(res->dev, fingerprint, src, a->mapped, res->d2h, m->parts) == FS_OK) {
        STAT(res, fingerprints, 1);
        m->comparing = true;
        return FS_OK;
    }
    a->fp_valid = false;
    int rc = move_copy(res, m, a->host, src);
    if (rc == FS_OK)
        move_queue_fp(res, m, src, res->d2h);
    return rc;
}

int fs_res_move_begin(struct fs_residency *res, uint64_t id, bool evict, struct fs_res_move *m)
{
    /* A launch waiting at the gate: end the asynchronous moves so that the gate opens. */
    if (res->strict || LOAD(&res->unknown_epoch) != 0 ||
        __atomic_load_n(&res->gate_waiters, __ATOMIC_SEQ_CST) != 0)
        return FS_ERR_UNSUPPORTED;
    pthread_mutex_lock(&res->lock);
    struct fs_alloc *a = find_by_id(res, id);
    int rc = FS_OK;
    if (!a) {
        rc = FS_ERR_NOT_FOUND;
    } else if (LOAD(&a->state) == FS_RES_MOVING) {
        rc = FS_ERR_NOT_READY;
    } else if (evict ? LOAD(&a->state) == FS_RES_HOST : LOAD(&a->state) != FS_RES_HOST) {
        rc = FS_RES_NOTHING;
    } else if (a->frozen) {
        rc = evict ? FS_ERR_NOT_READY /* as if a launch held it, for good */
                   : FS_ERR_NOMEM;    /* a prefetch: no room, for good */
    }
    if (rc != FS_OK)
        goto out;
    m->a = a;
    m->evict = evict;
    m->comparing = m->fp_queued = m->fp_side = m->fp_known = m->mapped_early = false;
    m->released = false;
    m->clean = false;
    /* A stage begins for the plan's staged allocations and ends for staged ones. */
    m->staged = evict ? LOAD(&a->state) == FS_RES_STAGED : plan_role(res, a) == FS_PLAN_STAGED;
    m->failed_rc = FS_OK;
    m->block = NULL;
    m->t_begin_ns = m->t_queued_ns = fs_now_ns();
    /* an eviction that compares fingerprints first copies the same bytes if the data changed */
    m->copy_ns = predicted_copy_ns(res, move_link(m), a->mapped);
    if (evict) {
        if (!a->host) {
            struct fs_block *b;
            rc = host_block_get(res, a->mapped, &b);
            if (rc != FS_OK)
                goto out;
            attach_host(res, a, b);
        }
    } else {
        /* Room comes from evictions: those in flight first, else synchronous ones. */
        bool grow;
        if (!room_now(res, a->mapped, &grow)) {
            rc = res->evictions_inflight > 0 ? FS_ERR_NOT_READY
                                             : make_room(res, a->mapped, NULL, 0, &grow);
            if (rc != FS_OK)
                goto out;
        }
        rc = fs_phys_pool_get(&res->dev_pool, a->mapped, grow, &m->block);
        if (rc != FS_OK)
            goto out;
    }
    rc = begin_move(a);
    if (rc != FS_OK)
        goto undo_block;
    if (evict && m->only_if_quiet && !quiet_now(res, a)) { /* asked once A is held */
        end_move(res, a, move_origin(m));
        rc = FS_ERR_NOT_READY;
        goto undo_block;
    }
    /* No launch holds A now: new ones wait for the move (an eviction's, then read the host
     * copy) or, once a stage-in publishes its block, are redirected to it. */
    fs_dptr stage_va = LOAD(&a->stage_va);
    if (evict)
        set_stage(res, a, 0);
    /* The gate stays closed until the move ends (for unknown launches only: none so far). */
    rc = quiesce_on(res, a, evict ? res->d2h : res->h2d);
    bool queued = rc == FS_OK; /* from here on, work may be queued on our stream */
    if (rc == FS_OK) {
        if (evict) {
            rc = move_begin_evict(res, m);
            if (rc == FS_OK)
                rc = fs_dev_call(res->dev, event_record, m->ev, res->d2h);
        } else {
            /* Block to block, not from A's VA: the VA may be remapped while this runs. */
            rc = move_copy(res, m, m->block, a->host->copy_va);
            if (rc == FS_OK)
                rc = fs_dev_call(res->dev, event_record, m->ev, res->h2d);
            if (rc == FS_OK && a->fp_valid) {
                /* The copy is of a host copy whose fingerprint is known: nothing wrote it since
                 * (a launch served from host memory forgets it), and moves begin here only in
                 * tracked mode with no unreadable launch, so no unseen one wrote it either. */
                m->fp = a->fp;
                m->fp_known = true;
            } else if (rc == FS_OK) {
                rc = move_queue_prefetch_fp(res, m);
            }
        }
    }
    if (rc == FS_OK && m->staged && !evict) {
        /* Launches are redirected to the block at once and wait for its copy (and fingerprint)
         * on their streams, as for a prefetch mapped early; nothing to remap. */
        m->mapped_early = true;
        a->arrive_ev = move_done_ev(m);
        STORE(&a->arriving, true);
        set_stage(res, a, m->block->copy_va);
        pthread_cond_broadcast(&res->moved);
    }
    if (rc != FS_OK) {
        set_stage(res, a, stage_va);
        /* Queued work may still write the block: wait for it before giving the block back;
         * if even that fails, the block is never reused. */
        bool stuck = queued &&
                     (fs_dev_call(res->dev, stream_sync, evict ? res->d2h : res->h2d) != FS_OK ||
                      (!evict && m->fp_queued && res->fp_side &&
                       fs_dev_call(res->dev, stream_sync, res->fp_side) != FS_OK));
        if (stuck && m->block) {
            FS_WARN("a device block of %llu bytes is set aside: its copy may still be running",
                    (unsigned long long)m->block->size);
            m->block = NULL;
        }
        quiesce_end(res);
        end_move(res, a, move_origin(m));
        if (rc != FS_ERR_NOT_READY) { /* NOT_READY: a capture is running, try again later */
            STAT(res, failures, 1);
            FS_WARN("%s allocation %llu (%llu bytes) failed (%s)",
                    evict ? "evicting" : "prefetching", (unsigned long long)a->id,
                    (unsigned long long)a->size, fs_err_str(rc));
        }
        goto undo_block;
    }
    if (evict)
        res->evictions_inflight++;
    pthread_mutex_unlock(&res->lock);
    return FS_OK;
undo_block:
    if (m->block)
        fs_phys_pool_put(&res->dev_pool, m->block);
    m->block = NULL;
out:
    pthread_mutex_unlock(&res->lock);
    return rc;
}

int fs_res_move_map(struct fs_residency *res, struct fs_res_move *m)
{
    struct fs_alloc *a = m->a;
    if (m->evict || m->mapped_early)
        return FS_ERR_INVALID;
    /* A is moving, so nobody else touches it: no lock needed for the check and the remap. */
    if (!quiet_now(res, a))
        return FS_ERR_NOT_READY;
    int rc = remap(res, a, a->host, m->block);
    if (rc != FS_OK)
        return rc;
    pthread_mutex_lock(&res->lock);
    m->mapped_early = true;
    a->arrive_ev = move_done_ev(m);
    STORE(&a->arriving, true);
    STAT(res, early_maps, 1);
    pthread_cond_broadcast(&res->moved); /* launches waiting for A may go on */
    pthread_mutex_unlock(&res->lock);
    return FS_OK;
}

/* COPY_WAIT=predict: sleep until M's copy is near its predicted end (fs_res_copy_wake_ns), in
 * slices with a look at its event between them, so that a wrong model or a late wake-up costs
 * at most a slice. A comparing eviction's wait is for its fingerprint, not for a copy. Sleeps
 * shorter than PREDICT_MIN_SLEEP_NS are not worth a wake-up. Returns whether the copy was still
 * running when the sleep ended (its end is then seen as it happens). */
#define PREDICT_MIN_SLEEP_NS 100000
#define PREDICT_SLICE_NS 2000000
static bool sleep_before_wait(struct fs_residency *res, struct fs_res_move *m, uint64_t now)
{
    static __thread bool slack_set;
    if (fs_dev_call(res->dev, event_query, move_done_ev(m)) != FS_ERR_NOT_READY)
        return false;
    uint64_t prev_end = LOAD(&res->link[move_link(m)].last_end_ns);
    uint64_t wake = m->comparing ? 0 : fs_res_copy_wake_ns(m->t_queued_ns, prev_end, m->copy_ns);
    if (wake < now + PREDICT_MIN_SLEEP_NS)
        return true;
    if (!slack_set) {
        /* The default timer slack (50 us) would eat most of the margin; a failure leaves it. */
        slack_set = prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL) == 0;
    }
    __atomic_fetch_add(&res->stats.predicted_sleeps, 1, __ATOMIC_RELAXED);
    for (; now < wake; now = fs_now_ns()) {
        uint64_t ns = wake - now < PREDICT_SLICE_NS ? wake - now : PREDICT_SLICE_NS;
        /* An interrupted sleep is only a shorter slice. */
        nanosleep(&(struct timespec){.tv_nsec = (long)ns}, NULL);
        if (fs_dev_call(res->dev, event_query, move_done_ev(m)) != FS_ERR_NOT_READY) {
            __atomic_fetch_add(&res->stats.overslept, 1, __ATOMIC_RELAXED);
            return false;
        }
    }
    return true;
}

static int move_wait(struct fs_residency *res, struct fs_res_move *m, bool wait)
{
    if (!wait)
        return fs_dev_call(res->dev, event_query, move_done_ev(m));
    uint64_t t0 = fs_now_ns();
    bool predicting = res->predicted_waits;
    bool seen_end = predicting && sleep_before_wait(res, m, t0);
    int rc = fs_dev_call(res->dev, event_sync, move_done_ev(m));
    if (predicting) /* the copy's own event on its stream, whose end was seen: the next anchor */
        STORE(&res->link[move_link(m)].last_end_ns,
              rc == FS_OK && seen_end && !m->fp_side ? fs_now_ns() : 0);
    fs_rt_span(FS_RT_COPY_WAIT, m->a->id, m->a->mapped, t0, fs_now_ns());
    return rc;
}

/* A move whose copy or remap failed (copy failure: the other side keeps the data): wait for the
 * stream before the block goes back (never reused if that fails too). Lock held. */
static void move_failed(struct fs_residency *res, struct fs_res_move *m, int rc)
{
    struct fs_alloc *a = m->a;
    /* A stage-in's block may be used by launches redirected to it already: all work must end
     * before it goes back (a failed copy means a broken context, so this rarely succeeds). */
    bool quiet = fs_dev_call(res->dev, stream_sync, m->evict ? res->d2h : res->h2d) == FS_OK &&
                 (!m->fp_side || fs_dev_call(res->dev, stream_sync, res->fp_side) == FS_OK) &&
                 (!m->staged || m->evict || fs_dev_call(res->dev, ctx_sync) == FS_OK);
    if (quiet) {
        if (m->block)
            fs_phys_pool_put(&res->dev_pool, m->block);
    } else if (m->block) {
        FS_WARN("a device block of %llu bytes is set aside: its copy may still be running",
                (unsigned long long)m->block->size);
    }
    if (m->evict) {
        a->fp_valid = false;
        res->evictions_inflight--;
    }
    /* A stage that did not end keeps its device copy (maybe the only current one). */
    set_stage(res, a, m->evict && m->staged ? a->dev->copy_va : 0);
    move_abandoned(res, a, m->evict ? "evicting" : "prefetching", rc, "it stays where it was",
                   move_origin(m));
}

/* A's VA is unmapped and its data is in its host block, which could not be mapped there: bring
 * the data back on the device, over the budget if need be, so that the VA is mapped again.
 * Without the lock; the move still holds A. */
static int evict_undo(struct fs_residency *res, struct fs_alloc *a, int why)
{
    struct fs_block *b = NULL;
    pthread_mutex_lock(&res->lock);
    int rc = fs_phys_pool_get(&res->dev_pool, a->mapped, true, &b);
    pthread_mutex_unlock(&res->lock);
    if (rc == FS_OK) {
        rc = map_at(res, a, b);
        if (rc != FS_OK) {
            pthread_mutex_lock(&res->lock);
            fs_phys_pool_put(&res->dev_pool, b);
            pthread_mutex_unlock(&res->lock);
        }
    }
    if (rc == FS_OK) {
        rc = fs_block_copy(res->dev, a->host, a->va, a->mapped, false, res->h2d);
        if (rc == FS_OK)
            rc = fs_dev_call(res->dev, stream_sync, res->h2d);
        if (rc == FS_OK) {
            a->dev = b;
            FS_WARN("evicting allocation %llu (%llu bytes): host memory could not be mapped (%s); "
                    "it stays on the device", (unsigned long long)a->id,
                    (unsigned long long)a->size, fs_err_str(why));
            return FS_OK;
        }
        /* Its copy may still run: the block is never reused; the VA must not show it. */
        unmap_at(res, a, FS_LOC_DEVICE);
    }
    FS_ERROR("allocation %llu (%llu bytes at 0x%llx) could not be mapped again after a failed "
             "eviction (%s, then %s); a kernel touching it will fail",
             (unsigned long long)a->id, (unsigned long long)a->size,
             (unsigned long long)a->va, fs_err_str(why), fs_err_str(rc));
    return rc;
}

/* The copy of M is done (or, WAIT false, FS_ERR_NOT_READY): an eviction that compared
 * fingerprints first copies now if the data changed (M->clean says whether it did not). */
static int move_copy_done(struct fs_residency *res, struct fs_res_move *m, bool wait)
{
    struct fs_alloc *a = m->a;
    int rc = move_wait(res, m, wait);
    if (rc != FS_OK)
        return rc;
    if (m->comparing) {
        /* Nothing else touches A or the d2h stream's state for it: no lock needed here. */
        m->fp = fs_fp_combine(m->parts);
        m->fp_known = true;
        m->comparing = false;
        m->clean = fs_fp_equal(m->fp, a->fp);
        if (m->clean)
            return FS_OK;
        a->fp_valid = false;
        rc = move_copy(res, m, a->host, a->dev->copy_va);
        if (rc == FS_OK)
            rc = fs_dev_call(res->dev, event_record, m->ev, res->d2h);
        return rc == FS_OK ? move_wait(res, m, wait) : rc;
    }
    if (m->fp_queued && !m->fp_known) {
        m->fp = fs_fp_combine(m->parts);
        m->fp_known = true;
    }
    return FS_OK;
}

int fs_res_move_release(struct fs_residency *res, struct fs_res_move *m, bool wait)
{
    if (m->released || m->failed_rc)
        return m->failed_rc;
    struct fs_alloc *a = m->a;
    int rc = move_copy_done(res, m, wait);
    if (rc == FS_ERR_NOT_READY)
        return rc;
    /* The copy is done and the range quiet since its last use: unmap without the lock (a stage
     * has nothing mapped at the VA). */
    if (rc == FS_OK && !m->staged)
        rc = unmap_at(res, a, FS_LOC_DEVICE);
    pthread_mutex_lock(&res->lock);
    if (rc != FS_OK) { /* still mapped on the device, the data there */
        quiesce_end(res);
        STAT(res, async_moves, 1);
        move_failed(res, m, rc);
        pthread_mutex_unlock(&res->lock);
        m->failed_rc = rc;
        return rc;
    }
    fs_phys_pool_put(&res->dev_pool, a->dev);
    a->dev = NULL;
    res->evictions_inflight--;
    STORE(&res->pressure, 1);
    pthread_mutex_unlock(&res->lock);
    m->released = true;
    if (m->on_room)
        m->on_room(m->on_room_arg);
    return FS_OK;
}

/* The end of a released eviction: host memory mapped at A's VA, the slow part (about 10 ms per
 * GiB, DESIGN.md). A is quiet and still marked moving meanwhile, so nothing the shim knows of
 * touches the unmapped VA. */
static int move_map_host(struct fs_residency *res, struct fs_res_move *m)
{
    struct fs_alloc *a = m->a;
    int rc = m->staged ? FS_OK : map_at(res, a, a->host); /* a stage's VA shows host already */
    int undo = rc == FS_OK ? FS_OK : evict_undo(res, a, rc);
    pthread_mutex_lock(&res->lock);
    quiesce_end(res);
    STAT(res, async_moves, 1);
    if (rc == FS_OK) {
        if (m->fp_known) {
            a->fp = m->fp;
            a->fp_valid = true;
        }
        if (m->staged) {
            STAT(res, stage_outs, 1);
        } else {
            STAT(res, evictions, 1);
            STAT(res, evicted_bytes, a->mapped);
        }
        if (m->clean) {
            STAT(res, clean_evictions, 1);
            STAT(res, clean_bytes, a->mapped);
        }
        end_move(res, a, FS_RES_HOST);
    } else {
        /* Back on the device (the host copy matches it, so its fingerprint holds), or lost. */
        a->fp = m->fp;
        a->fp_valid = undo == FS_OK && m->fp_known;
        STAT(res, failures, 1);
        end_move(res, a, undo == FS_OK ? FS_RES_DEVICE : FS_RES_HOST);
    }
    pthread_mutex_unlock(&res->lock);
    return rc;
}

int fs_res_move_end(struct fs_residency *res, struct fs_res_move *m, bool wait)
{
    struct fs_alloc *a = m->a;
    if (m->evict) {
        int rc = fs_res_move_release(res, m, wait);
        return rc == FS_OK ? move_map_host(res, m) : rc;
    }
    int rc = move_copy_done(res, m, wait);
    if (rc == FS_ERR_NOT_READY)
        return rc;
    /* The copy is done and the range quiet since its last use: remap without the lock. */
    if (rc == FS_OK && !m->mapped_early)
        rc = remap(res, a, a->host, m->block);
    else if (rc != FS_OK && m->mapped_early) {
        /* Only a broken context fails a queued copy; its launches fail with it. */
        FS_ERROR("prefetching allocation %llu failed after its VA showed the device block (%s); "
                 "launches queued since read undefined data", (unsigned long long)a->id,
                 fs_err_str(rc));
        if (!m->staged && remap(res, a, m->block, a->host) != FS_OK)
            FS_ERROR("allocation %llu could not be mapped back to host memory",
                     (unsigned long long)a->id);
    }
    pthread_mutex_lock(&res->lock);
    STORE(&a->arriving, false);
    quiesce_end(res);
    STAT(res, async_moves, 1);
    if (rc == FS_OK) {
        a->dev = m->block;
        a->fp = m->fp;
        a->fp_valid = m->fp_known;
        STORE(&a->lru_tick, LOAD(&res->tick)); /* brought in for a use to come */
        count_move_in(res, a, m->staged);
        end_move(res, a, m->staged ? FS_RES_STAGED : FS_RES_DEVICE);
    } else {
        move_failed(res, m, rc);
    }
    m->block = NULL;
    pthread_mutex_unlock(&res->lock);
    return rc;
}

int fs_res_prefetch_id(struct fs_residency *res, uint64_t id)
{
    pthread_mutex_lock(&res->lock);
    struct fs_alloc *a = find_by_id(res, id);
    while (a && LOAD(&a->state) == FS_RES_MOVING) {
        pthread_cond_wait(&res->moved, &res->lock);
        a = find_by_id(res, id); /* freed meanwhile? */
    }
    int rc = FS_ERR_NOT_FOUND;
    if (a) {
        /* After an unknown launch, staged allocations move as prefetches do (each unknown launch
         * would end every stage). */
        bool stage = plan_role(res, a) == FS_PLAN_STAGED && LOAD(&res->unknown_epoch) == 0;
        bool moves = LOAD(&a->state) == FS_RES_HOST && !stage; /* a stage counts itself */
        rc = fault_in_locked(res, a, NULL, 0, stage);
        if (rc == FS_OK && moves)
            count_move_in(res, a, false);
    }
    pthread_mutex_unlock(&res->lock);
    return rc;
}

int fs_res_evict_id(struct fs_residency *res, uint64_t id)
{
    pthread_mutex_lock(&res->lock);
    struct fs_alloc *a = find_by_id(res, id);
    while (a && LOAD(&a->state) == FS_RES_MOVING) {
        pthread_cond_wait(&res->moved, &res->lock);
        a = find_by_id(res, id);
    }
    int rc = !a ? FS_ERR_NOT_FOUND
                : LOAD(&a->state) == FS_RES_HOST ? FS_OK : evict_locked(res, a);
    pthread_mutex_unlock(&res->lock);
    return rc;
}

void fs_res_get_stats(struct fs_residency *res, struct fs_res_stats *out)
{
    pthread_mutex_lock(&res->lock);
    fs_probe_collect(&res->ordered_probes);
    *out = res->stats;
    out->ordered_wait = res->ordered_probes.counts;
    pthread_mutex_unlock(&res->lock);
    /* counted by the finishers without the lock */
    out->predicted_sleeps = __atomic_load_n(&res->stats.predicted_sleeps, __ATOMIC_RELAXED);
    out->overslept = __atomic_load_n(&res->stats.overslept, __ATOMIC_RELAXED);
    out->device_bytes_held = fs_phys_pool_held(&res->dev_pool);
    out->device_bytes_peak = fs_phys_pool_held_peak(&res->dev_pool);
    out->plain_bytes = fs_phys_pool_outside(&res->dev_pool);
    out->device_blocks = fs_phys_pool_counts(&res->dev_pool);
    out->host_bytes_held = fs_phys_pool_held(&res->host_pool);
}

int fs_res_host_blocks(struct fs_residency *res, fs_dptr *alloc_va, fs_dptr *block_va, int max)
{
    int n = 0;
    pthread_mutex_lock(&res->lock);
    for (int i = 0; i < res->nallocs && n < max; i++)
        if (res->allocs[i]->host) {
            alloc_va[n] = res->allocs[i]->va;
            block_va[n++] = res->allocs[i]->host->copy_va;
        }
    pthread_mutex_unlock(&res->lock);
    return n;
}

uint64_t fs_res_device_bytes(struct fs_residency *res)
{
    pthread_mutex_lock(&res->lock);
    uint64_t used = device_used(res);
    pthread_mutex_unlock(&res->lock);
    return used;
}

int fs_res_freeze(struct fs_residency *res)
{
    int rc = FS_OK;
    pthread_mutex_lock(&res->lock);
    for (int i = 0; i < res->nallocs && rc == FS_OK; i++)
        if (!freezable(res, res->allocs[i]))
            rc = FS_ERR_NOT_READY;
    for (int i = 0; i < res->nallocs && rc == FS_OK; i++)
        freeze_locked(res, res->allocs[i]);
    if (rc == FS_OK)
        res->freeze_new = true;
    pthread_mutex_unlock(&res->lock);
    return rc;
}

void fs_res_freeze_alloc(struct fs_residency *res, fs_dptr va)
{
    pthread_mutex_lock(&res->lock);
    struct fs_alloc *a = fs_res_lookup(res, va);
    if (a)
        freeze_locked(res, a);
    pthread_mutex_unlock(&res->lock);
}

bool fs_res_frozen(struct fs_residency *res, const struct fs_alloc *a)
{
    pthread_mutex_lock(&res->lock);
    bool frozen = a->frozen;
    pthread_mutex_unlock(&res->lock);
    return frozen;
}

void fs_res_stop_freezing(struct fs_residency *res)
{
    pthread_mutex_lock(&res->lock);
    res->freeze_new = false;
    pthread_mutex_unlock(&res->lock);
}

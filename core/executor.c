#include "executor.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "run_trace.h"
#include "strategies/schedule.h"

#define HASH_MUL 0x100000001b3ull /* odd: the rolling hash's base */
#define TAB_EMPTY (-1)
#define TAB_AMBIGUOUS (-2)

/* ---- the mover ------------------------------------------------------------------------------ */

/* Is the program capturing a graph on its latest stream? Then nothing may synchronize or remap. */
static bool capture_in_progress(struct fs_executor *x)
{
    bool capturing = false;
    fs_stream st = __atomic_load_n(&x->last_stream, __ATOMIC_ACQUIRE);
    return fs_dev_call(x->res->dev, stream_capturing, st, &capturing) != FS_OK || capturing;
}

/* A job is over (lock held): a launch waiting for this prefetch may go on. */
static void job_done(struct fs_executor *x, const struct fs_exec_job *job, int rc)
{
    /* A job of a plan since replaced counts for nothing in the new plan's tables. */
    if (!job->evict && job->gen == x->q_gen && job->id < (uint64_t)x->prof.nallocs &&
        x->pf[job->id].pending > 0)
        x->pf[job->id].pending--;
    pthread_cond_broadcast(&x->done);
    if (rc == FS_ERR_NOT_READY)
        x->stats.evict_busy++;
    else if (rc != FS_OK && rc != FS_ERR_NOT_FOUND && rc != FS_RES_NOTHING)
        x->stats.move_failures++;
}

/* Of this plan, a prefetch (lock held)? */
static bool current_prefetch(const struct fs_executor *x, const struct fs_exec_job *job)
{
    return !job->evict && job->gen == x->q_gen && job->id < (uint64_t)x->prof.nallocs;
}

/* A prefetch held back for room waits for evictions in flight; an eviction queued behind it
 * would give room too but waited for it, and with none in flight the room was made by
 * synchronous evictions of whatever was least recently used (on the simulated 7b decode at half
 * the weights, passing cut the late launches 4x and the device blocks made 2x).
 * Index in the queue (from its head) of the first eviction that may pass the prefetch held back:
 * not of the held prefetch's allocation, and no prefetch of its allocation before it (their
 * order stays); -1 if none within the first EVICT_PASS_SCAN jobs (lock held). */
#define EVICT_PASS_SCAN 64
static int passing_eviction(const struct fs_executor *x)
{
    if (!x->has_held || x->held.evict || x->pass_at == x->completions)
        return -1;
    for (int i = 0; (size_t)i < x->q_len && i < EVICT_PASS_SCAN; i++) {
        const struct fs_exec_job *e = &x->q[(x->q_head + i) % x->q_cap];
        if (!e->evict || e->id == x->held.id)
            continue;
        bool after_prefetch = false;
        for (int j = 0; j < i && !after_prefetch; j++) {
            const struct fs_exec_job *b = &x->q[(x->q_head + j) % x->q_cap];
            after_prefetch = !b->evict && b->id == e->id;
        }
        if (!after_prefetch)
            return i;
    }
    return -1;
}

/* Take the job at queue index I out of the queue (lock held). */
static struct fs_exec_job take_at(struct fs_executor *x, int i)
{
    struct fs_exec_job job = x->q[(x->q_head + i) % x->q_cap];
    for (int k = i; k > 0; k--)
        x->q[(x->q_head + k) % x->q_cap] = x->q[(x->q_head + k - 1) % x->q_cap];
    x->q_head = (x->q_head + 1) % x->q_cap;
    x->q_len--;
    return job;
}

/* The next job (lock held): while the prefetch held back waits for a move to end, an eviction
 * passing it (*PASSING), then that prefetch; else the queue's head, leaving out the prefetches a
 * launch dropped. */
static bool next_job(struct fs_executor *x, struct fs_exec_job *job, bool *passing)
{
    *passing = false;
    if (x->has_held) {
        if (x->completions == x->held_at) {
            int i = passing_eviction(x);
            if (i < 0)
                return false;
            *job = take_at(x, i);
            *passing = true;
            return true;
        }
        *job = x->held;
        x->has_held = false;
        fs_rt_span(FS_RT_HELD, job->id, 0, x->held_ns, fs_now_ns());
        return true;
    }
    while (x->q_len > 0) {
        *job = x->q[x->q_head];
        x->q_head = (x->q_head + 1) % x->q_cap;
        x->q_len--;
        if (!current_prefetch(x, job))
            return true;
        struct fs_exec_prefetches *c = &x->pf[job->id];
        c->queued--;
        if (c->drop == 0)
            return true;
        c->drop--;
        job_done(x, job, FS_RES_NOTHING);
    }
    return false;
}

/* May a late launch read allocation ID in place rather than wait for its prefetch (lock held)?
 * Yes when no prefetch of it is being begun: the one held back for room is dropped, or one still
 * queued is marked to be dropped (if one is left unmarked). No when the mover has taken one and
 * not yet begun it: wait for that. */
static bool drop_prefetch(struct fs_executor *x, uint64_t id)
{
    if (x->has_held && x->held.id == id && current_prefetch(x, &x->held)) {
        x->has_held = false;
        fs_rt_span(FS_RT_HELD, id, 0, x->held_ns, fs_now_ns());
        job_done(x, &x->held, FS_RES_NOTHING);
        x->stats.read_in_place++;
        pthread_cond_signal(&x->wake);
        return true;
    }
    struct fs_exec_prefetches *c = &x->pf[id];
    if (c->pending > c->queued)
        return false;
    if (c->queued > c->drop) {
        c->drop++;
        x->stats.read_in_place++;
    }
    return true;
}

/* Hand slot I to finisher F (lock held). */
static void push_slot(struct fs_exec_finisher *f, int i)
{
    f->ring[(f->head + f->len) % FS_EXEC_MOVES_INFLIGHT] = i;
    f->len++;
    pthread_cond_signal(&f->wake);
}

/* Start the next jobs while slots are free (lock held; dropped around device work). A prefetch
 * that must wait for the room of evictions in flight is held back until they end. */
static void start_jobs(struct fs_executor *x)
{
    struct fs_exec_job job;
    bool passing;
    while (!x->stop && (x->nslots == 0 || x->inflight < x->nslots) &&
           next_job(x, &job, &passing)) {
        struct fs_exec_slot *slot = NULL;
        for (int i = 0; i < x->nslots && !slot; i++)
            if (!x->slots[i].busy)
                slot = &x->slots[i];
        uint64_t gen = x->q_gen;
        if (slot) /* one passing the held prefetch must not wait there for its last use */
            slot->m.only_if_quiet = passing;
        pthread_mutex_unlock(&x->lock);
        uint64_t t0 = fs_now_ns();
        int rc = capture_in_progress(x) ? FS_ERR_NOT_READY
                 : slot                 ? fs_res_move_begin(x->res, job.id, job.evict, &slot->m)
                                        : FS_ERR_UNSUPPORTED; /* no slots: one at a time */
        fs_rt_span(job.evict ? FS_RT_BEGIN_EVICT : FS_RT_BEGIN_PREFETCH, job.id, 0, t0,
                   fs_now_ns());
        pthread_mutex_lock(&x->lock);
        if (passing && rc == FS_ERR_NOT_READY) {
            /* The eviction that was to pass the held prefetch waits in its place: back in front
             * (unless its plan was dropped meanwhile), and none passes before a move ends. If
             * the last move in flight ended meanwhile, the held prefetch is retried next. */
            if (x->q_gen == gen && x->q_len == x->q_cap) {
                x->stats.dropped++;
            } else if (x->q_gen == gen) {
                x->q_head = (x->q_head + x->q_cap - 1) % x->q_cap;
                x->q[x->q_head] = job;
                x->q_len++;
            }
            x->pass_at = x->completions;
            return;
        }
        if (rc == FS_ERR_NOT_READY && x->inflight > 0) {
            if (x->q_gen == gen) { /* else the plan it came from was dropped meanwhile */
                x->held = job;
                x->held_ns = t0;
                x->has_held = true;
                x->held_at = x->completions; /* retried once a move has ended */
            }
            return;
        }
        if (rc == FS_OK) {
            x->stats.passed += passing;
            slot->job = job;
            slot->busy = true;
            slot->map_tried = false;
            x->inflight++;
            x->stats.overlapped++;
            if ((uint64_t)x->inflight > x->stats.max_inflight)
                x->stats.max_inflight = (uint64_t)x->inflight;
            push_slot(&x->fin[job.evict ? FIN_EVICT : FIN_PREFETCH], (int)(slot - x->slots));
            if (!job.evict)
                push_slot(&x->fin[FIN_MAP], (int)(slot - x->slots));
            continue;
        }
        if (rc == FS_ERR_UNSUPPORTED || (rc == FS_ERR_NOT_READY && !job.evict)) {
            /* Strict mode, unknown launches, or a prefetch of an allocation being moved by the
             * program's thread: the synchronous move (it waits as it must). */
            pthread_mutex_unlock(&x->lock);
            rc = capture_in_progress(x) ? FS_ERR_NOT_READY
                 : job.evict            ? fs_res_evict_id(x->res, job.id)
                                        : fs_res_prefetch_id(x->res, job.id);
            pthread_mutex_lock(&x->lock);
        }
        job_done(x, &job, rc);
    }
}

/* Can the mover start something now (lock held)? A held job waits for a move to end; evictions
 * may pass it meanwhile. */
static bool can_start(const struct fs_executor *x)
{
    if (x->nslots > 0 && x->inflight >= x->nslots)
        return false;
    if (x->has_held)
        return x->completions != x->held_at || passing_eviction(x) >= 0;
    return x->q_len > 0;
}

/* Nothing queued, held or in flight (lock held). */
static bool idle(const struct fs_executor *x)
{
    return x->q_len == 0 && !x->has_held && x->inflight == 0 && x->released_len == 0;
}

static void *mover_main(void *arg)
{
    struct fs_executor *x = arg;
    fs_thread_internal = true;
    fs_rt_set_lane(FS_RT_MOVER);
    fs_dev_call(x->res->dev, bind_thread);
    pthread_mutex_lock(&x->lock);
    for (;;) {
        while (!x->stop && !can_start(x)) {
            x->busy = false;
            if (idle(x))
                pthread_cond_broadcast(&x->done);
            pthread_cond_wait(&x->wake, &x->lock);
        }
        if (x->stop)
            break;
        x->busy = true;
        start_jobs(x);
    }
    /* Moves begun are ended by the finishers before they stop. */
    while (x->inflight > 0)
        pthread_cond_wait(&x->wake, &x->lock);
    for (int i = 0; i < FS_EXEC_FINISHERS; i++) {
        x->fin[i].stop = true;
        pthread_cond_signal(&x->fin[i].wake);
    }
    x->busy = false;
    pthread_cond_broadcast(&x->done);
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* FIN_MAP: map the block of the begun prefetch at the head of F's ring at its VA (lock held;
 * dropped around the remap), so that launches needing it wait for the copy on their streams
 * instead of on the finisher's remap after the copy. The prefetch finisher ends it only after. */
static void map_next(struct fs_executor *x, struct fs_exec_finisher *f)
{
    struct fs_exec_slot *slot = &x->slots[f->ring[f->head]];
    f->head = (f->head + 1) % FS_EXEC_MOVES_INFLIGHT;
    f->len--;
    x->early_mapping = true;
    pthread_mutex_unlock(&x->lock);
    int rc = capture_in_progress(x) ? FS_ERR_NOT_READY : fs_res_move_map(x->res, &slot->m);
    pthread_mutex_lock(&x->lock);
    x->early_mapping = false;
    slot->map_tried = true;
    if (rc == FS_OK)
        pthread_cond_broadcast(&x->done); /* launches waiting for it go on */
    pthread_cond_signal(&x->fin[FIN_PREFETCH].wake);
    pthread_cond_signal(&x->fin[FIN_EVICT].wake); /* a host mapping put off may go on */
}

/* The slot at the head of F's ring is done with (lock held): the mover may start another move in
 * it, and a prefetch held back may retry. JOB_RC: the job's result, or FS_RES_NOTHING when an
 * eviction's job goes on without the slot (its host mapping). */
static void free_head_slot(struct fs_executor *x, struct fs_exec_finisher *f, int job_rc)
{
    int i = f->ring[f->head];
    struct fs_exec_slot *slot = &x->slots[i];
    f->head = (f->head + 1) % FS_EXEC_MOVES_INFLIGHT;
    f->len--;
    fs_rt_span_on(FS_RT_SLOTS + i, slot->job.evict ? FS_RT_EVICT : FS_RT_PREFETCH, slot->job.id,
                  slot->m.a ? slot->m.a->mapped : 0, slot->m.t_begin_ns, fs_now_ns());
    slot->busy = false;
    x->inflight--;
    x->completions++;
    if (job_rc != FS_RES_NOTHING)
        job_done(x, &slot->job, job_rc);
    pthread_cond_signal(&x->wake);
}

/* The released queue's entry K places from its head (lock held). */
static struct fs_exec_released *released_at(struct fs_executor *x, int k)
{
    return &x->released[(x->released_head + k) % FS_EXEC_RELEASED_MAX];
}

/* FIN_EVICT, first half: give back the device memory of the evictions whose copies are done, in
 * the order they began (WAIT: the oldest one's copy is waited for), and free their slots at once:
 * their host mapping (slow, serialized with every other remap in the driver) needs neither the
 * event nor the fingerprint buffer, so it goes to the released queue and prefetches do not wait
 * for a slot behind it (lock held; dropped around each release). */
static void release_evictions(struct fs_executor *x, struct fs_exec_finisher *f, bool wait)
{
    while (f->len > 0 && x->released_len < FS_EXEC_RELEASED_MAX) {
        struct fs_exec_slot *slot = &x->slots[f->ring[f->head]];
        pthread_mutex_unlock(&x->lock);
        bool capturing = capture_in_progress(x);
        int rc = capturing ? FS_ERR_NOT_READY : fs_res_move_release(x->res, &slot->m, wait);
        if (capturing && wait) /* nothing may synchronize or remap now: do not spin */
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        pthread_mutex_lock(&x->lock);
        if (rc == FS_ERR_NOT_READY)
            return; /* the later ones are behind it on the stream */
        wait = false;
        if (rc == FS_OK) {
            struct fs_exec_released *r = released_at(x, x->released_len);
            r->job = slot->job;
            r->m = slot->m;
            x->released_len++;
        }
        free_head_slot(x, f, rc == FS_OK ? FS_RES_NOTHING : rc);
    }
}

/* Is a prefetch of allocation ID of this plan queued, held or in flight (lock held)? */
static bool prefetch_pending(const struct fs_executor *x, uint64_t id)
{
    return id < (uint64_t)x->prof.nallocs && x->pf[id].pending > 0;
}

/* A prefetch of an allocation whose eviction waits in the released queue cannot begin before the
 * host mapping ends that eviction; behind other evictions' mappings (0.3-1.5 ms each on an H100)
 * it came up to 25 ms late at the start of each prefill step (stop 40, OFFLOAD_MODE=prefetch) while
 * the program's stream ran dry. */
void fs_exec_released_needed_first(struct fs_executor *x)
{
    if (x->released_len == 0 || prefetch_pending(x, released_at(x, 0)->job.id))
        return; /* the oldest goes first anyway */
    int k = 1;
    while (k < x->released_len && !prefetch_pending(x, released_at(x, k)->job.id))
        k++;
    if (k == x->released_len)
        return;
    struct fs_exec_released r = *released_at(x, k);
    for (; k > 0; k--)
        *released_at(x, k) = *released_at(x, k - 1);
    *released_at(x, 0) = r;
    x->stats.host_maps_first++;
}

/* FIN_EVICT, second half: map host memory at the VA of a released eviction (the oldest, or one a
 * prefetch waits for), which ends it (lock held; dropped around the remap). It waits while
 * FIN_MAP maps a begun prefetch or has one to map: the driver runs remaps one at a time, and
 * back-to-back host mappings kept a prefetch's unmapping waiting 11 ms behind eleven of them
 * (stop 40). The host mapping only makes the VA safe to reach; a prefetch's is on the way to a
 * launch. Returns with nothing done when it waited. */
static void map_released(struct fs_executor *x)
{
    fs_exec_released_needed_first(x);
    /* A stage's end (redirect mode) maps nothing: it need not wait. */
    if (!released_at(x, 0)->m.staged &&
        (x->early_mapping || x->fin[FIN_MAP].len > 0)) {
        x->stats.host_maps_put_off++;
        pthread_cond_wait(&x->fin[FIN_EVICT].wake, &x->lock);
        return;
    }
    /* Left in the queue until it ends (only this thread takes from or adds to it), so that
     * idle() does not see the executor idle before then. */
    struct fs_exec_released r = *released_at(x, 0);
    pthread_mutex_unlock(&x->lock);
    while (capture_in_progress(x))
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    int rc = fs_res_move_end(x->res, &r.m, true);
    pthread_mutex_lock(&x->lock);
    x->released_head = (x->released_head + 1) % FS_EXEC_RELEASED_MAX;
    x->released_len--;
    x->completions++; /* a prefetch of this allocation held back may begin now */
    job_done(x, &r.job, rc);
    pthread_cond_signal(&x->wake);
}

/* FIN_PREFETCH: end the oldest prefetch, once FIN_MAP has tried to map it early (lock held;
 * dropped around the wait for its copy and the remap). */
static void end_prefetch(struct fs_executor *x, struct fs_exec_finisher *f)
{
    struct fs_exec_slot *slot = &x->slots[f->ring[f->head]];
    if (!slot->map_tried) {
        pthread_cond_wait(&f->wake, &x->lock); /* FIN_MAP is at it */
        return;
    }
    pthread_mutex_unlock(&x->lock);
    /* Nothing may synchronize or remap while the program captures a graph. */
    while (capture_in_progress(x))
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    int rc = fs_res_move_end(x->res, &slot->m, true);
    pthread_mutex_lock(&x->lock);
    free_head_slot(x, f, rc);
}

static bool has_work(const struct fs_executor *x, const struct fs_exec_finisher *f)
{
    return f->len > 0 || (f == &x->fin[FIN_EVICT] && x->released_len > 0);
}

/* A finisher ends the moves of one kind in the order they began (the order of their stream):
 * it waits for each copy and remaps, so the mover keeps starting copies meanwhile (it does no
 * remap itself: the driver serializes remaps, and the evictions' host mappings are slow). The
 * eviction finisher gives memory back before it maps host memory: released evictions first,
 * then one host mapping, then a wait for the next copy. */
static void *finisher_main(void *arg)
{
    static const int lanes[FS_EXEC_FINISHERS] = {
        [FIN_EVICT] = FS_RT_FIN_EVICT, [FIN_PREFETCH] = FS_RT_FIN_PREFETCH,
        [FIN_MAP] = FS_RT_FIN_MAP};
    struct fs_exec_finisher *f = arg;
    struct fs_executor *x = f->x;
    fs_thread_internal = true;
    fs_rt_set_lane(lanes[f - x->fin]);
    fs_dev_call(x->res->dev, bind_thread);
    pthread_mutex_lock(&x->lock);
    for (;;) {
        while (!has_work(x, f) && !f->stop)
            pthread_cond_wait(&f->wake, &x->lock);
        if (!has_work(x, f))
            break;
        if (f == &x->fin[FIN_MAP]) {
            map_next(x, f);
        } else if (f == &x->fin[FIN_PREFETCH]) {
            end_prefetch(x, f);
        } else {
            release_evictions(x, f, false);
            if (x->released_len > 0)
                map_released(x);
            else
                release_evictions(x, f, true);
        }
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

/* An eviction's device memory is back in the pool: a prefetch held back for room may start. */
static void room_freed(void *arg)
{
    struct fs_executor *x = arg;
    pthread_mutex_lock(&x->lock);
    x->completions++;
    pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->lock);
}

/* Lock held. */
static void queue_move(struct fs_executor *x, uint64_t id, bool evict)
{
    if (x->q_len == x->q_cap) {
        x->stats.dropped++;
        return;
    }
    x->q[(x->q_head + x->q_len) % x->q_cap] = (struct fs_exec_job){id, evict, x->q_gen};
    x->q_len++;
    if (!evict && id < (uint64_t)x->prof.nallocs) {
        x->pf[id].pending++;
        x->pf[id].queued++;
    }
    if (evict)
        x->stats.evictions++;
    else
        x->stats.prefetches++;
    pthread_cond_signal(&x->wake);
}

/* Each slot's event and fingerprint buffer; without them moves run one at a time. */
static void slots_init(struct fs_executor *x)
{
    struct fs_device *dev = x->res->dev;
    unsigned flags = x->res->wait_event_flags; /* the finishers wait on these events */
    for (x->nslots = 0; x->nslots < FS_EXEC_MOVES_INFLIGHT; x->nslots++) {
        struct fs_res_move *m = &x->slots[x->nslots].m;
        m->on_room = room_freed;
        m->on_room_arg = x;
        if (fs_dev_call(dev, event_create, flags, &m->ev) != FS_OK)
            break;
        if (fs_dev_call(dev, host_alloc, FS_FP_PARTS_BYTES, (void **)&m->parts) != FS_OK) {
            fs_dev_call(dev, event_destroy, m->ev);
            break;
        }
        if (fs_dev_call(dev, event_create, flags, &m->fp_ev) != FS_OK)
            m->fp_ev = NULL; /* its prefetches' fingerprints run on the copy stream */
    }
    if (x->nslots < FS_EXEC_MOVES_INFLIGHT)
        FS_INFO("plan executor: %d of %d overlapping moves could be set up", x->nslots,
                FS_EXEC_MOVES_INFLIGHT);
}

static void slots_destroy(struct fs_executor *x)
{
    for (int i = 0; i < x->nslots; i++) {
        fs_dev_call(x->res->dev, event_destroy, x->slots[i].m.ev);
        if (x->slots[i].m.fp_ev)
            fs_dev_call(x->res->dev, event_destroy, x->slots[i].m.fp_ev);
        fs_dev_call(x->res->dev, host_free, x->slots[i].m.parts);
    }
    x->nslots = 0;
}

int fs_exec_init(struct fs_executor *x, struct fs_residency *res)
{
    memset(x, 0, sizeof(*x));
    x->res = res;
    x->pass_at = UINT64_MAX; /* no pass has waited yet */
    slots_init(x);
    fs_probe_pool_init(&x->idle, res->dev, FS_RT_STREAM_IDLE);
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->wake, NULL);
    pthread_cond_init(&x->done, NULL);
    int nfin = 0;
    for (; nfin < FS_EXEC_FINISHERS; nfin++) {
        x->fin[nfin].x = x;
        pthread_cond_init(&x->fin[nfin].wake, NULL);
        if (pthread_create(&x->fin[nfin].thread, NULL, finisher_main, &x->fin[nfin]) != 0) {
            pthread_cond_destroy(&x->fin[nfin].wake);
            break;
        }
    }
    if (nfin < FS_EXEC_FINISHERS || pthread_create(&x->mover, NULL, mover_main, x) != 0) {
        pthread_mutex_lock(&x->lock);
        for (int i = 0; i < nfin; i++) {
            x->fin[i].stop = true;
            pthread_cond_signal(&x->fin[i].wake);
        }
        pthread_mutex_unlock(&x->lock);
        for (int i = 0; i < nfin; i++) {
            pthread_join(x->fin[i].thread, NULL);
            pthread_cond_destroy(&x->fin[i].wake);
        }
        slots_destroy(x);
        pthread_cond_destroy(&x->done);
        pthread_cond_destroy(&x->wake);
        pthread_mutex_destroy(&x->lock);
        return FS_ERR_NOMEM;
    }
    x->mover_started = true;
    return FS_OK;
}

/* The installed plan's tables and profile (lock held or executor stopped). */
static void free_plan(struct fs_executor *x)
{
    fs_profile_free(&x->prof);
    free(x->pf_start);
    free(x->pf_ids);
    free(x->ev_start);
    free(x->ev_ids);
    free(x->tab_key);
    free(x->tab_pos);
    free(x->q);
    free(x->pf);
    x->pf = NULL;
    x->pf_start = x->pf_ids = x->ev_start = x->ev_ids = x->tab_pos = NULL;
    x->tab_key = NULL;
    x->q = NULL;
    x->q_cap = x->q_len = x->q_head = 0;
    x->has_held = false;
    x->q_gen++;
}

void fs_exec_shutdown(struct fs_executor *x)
{
    if (!x->mover_started)
        return;
    pthread_mutex_lock(&x->lock);
    x->stop = true;
    __atomic_store_n(&x->running, 0, __ATOMIC_RELEASE);
    x->q_len = 0;
    x->has_held = false;
    pthread_cond_broadcast(&x->done); /* a launch waiting for a prefetch goes on */
    pthread_cond_signal(&x->wake);
    pthread_mutex_unlock(&x->lock);
    pthread_join(x->mover, NULL); /* it waits for the moves in flight and stops the finishers */
    for (int i = 0; i < FS_EXEC_FINISHERS; i++)
        pthread_join(x->fin[i].thread, NULL);
    x->mover_started = false;
    x->mover_joined = true;
}

void fs_exec_destroy(struct fs_executor *x)
{
    if (!x->mover_started && !x->mover_joined)
        return;
    fs_exec_shutdown(x);
    free_plan(x);
    slots_destroy(x);
    fs_probe_pool_destroy(&x->idle);
    for (int i = 0; i < FS_EXEC_FINISHERS; i++)
        pthread_cond_destroy(&x->fin[i].wake);
    pthread_cond_destroy(&x->done);
    pthread_cond_destroy(&x->wake);
    pthread_mutex_destroy(&x->lock);
    memset(x, 0, sizeof(*x));
}

/* ---- the plan's tables ---------------------------------------------------------------------- */

/* Does the plan keep allocation E on the device during launch I? */
static bool present_at(const struct fs_plan_entry *e, int i)
{
    return e->resident || (e->prefetch_at >= 0 && fs_window_covers(e->prefetch_at, e->evict_after,
                                                                   i, i));
}

/* Does the plan read allocation ID in place (offloaded, used by the iteration, no window)? */
static bool read_in_place(const struct fs_executor *x, uint64_t id)
{
    return id < (uint64_t)x->prof.nallocs && fs_reads_in_place(&x->prof, &x->prof.plan, (int)id);
}

/* Where allocation E's prefetch (EVICT false) or eviction is planned, or -1. */
static int action_at(const struct fs_plan_entry *e, bool evict)
{
    return e->resident ? -1 : evict ? e->evict_after : e->prefetch_at;
}

/* CSR lists: for each launch, the allocations whose prefetch (EVICT false) or eviction is
 * planned there. */
static int build_actions(const struct fs_profile *p, bool evict, int **start_out, int **ids_out)
{
    int n = p->nlaunches;
    int *start = calloc((size_t)n + 2, sizeof(int));
    int *ids = malloc(((size_t)p->nallocs + 1) * sizeof(int));
    if (!start || !ids) {
        free(start);
        free(ids);
        return FS_ERR_NOMEM;
    }
    /* Count into start[at + 2], sum, then fill through start[at + 1]: it ends as the start. */
    for (int a = 0; a < p->nallocs; a++) {
        int at = action_at(&p->plan.entries[a], evict);
        if (at >= 0)
            start[at + 2]++;
    }
    for (int i = 0; i < n; i++)
        start[i + 2] += start[i + 1];
    for (int a = 0; a < p->nallocs; a++) {
        int at = action_at(&p->plan.entries[a], evict);
        if (at >= 0)
            ids[start[at + 1]++] = a;
    }
    *start_out = start;
    *ids_out = ids;
    return FS_OK;
}

static uint64_t window_hash(const struct fs_profile *p, int end)
{
    int n = p->nlaunches;
    uint64_t h = 0;
    for (int k = FS_EXEC_SYNC_WINDOW - 1; k >= 0; k--) {
        int i = ((end - k) % n + n) % n;
        h = h * HASH_MUL + p->launches[i].kernel;
    }
    return h;
}

static size_t tab_slot(const struct fs_executor *x, uint64_t key)
{
    size_t i = (size_t)((key ^ (key >> 29)) * 0x9E3779B97F4A7C15ull) & x->tab_mask;
    while (x->tab_pos[i] != TAB_EMPTY && x->tab_key[i] != key)
        i = (i + 1) & x->tab_mask;
    return i;
}

/* Each launch's window of FS_EXEC_SYNC_WINDOW signatures (ending with it) -> the launch, unless
 * the same window ends several launches (repeated layers): those cannot tell where we are. */
static int build_table(struct fs_executor *x)
{
    size_t cap = 64;
    while (cap < 2 * (size_t)x->prof.nlaunches)
        cap *= 2;
    x->tab_key = malloc(cap * sizeof(uint64_t));
    x->tab_pos = malloc(cap * sizeof(int));
    if (!x->tab_key || !x->tab_pos)
        return FS_ERR_NOMEM;
    x->tab_mask = cap - 1;
    for (size_t i = 0; i < cap; i++)
        x->tab_pos[i] = TAB_EMPTY;
    for (int q = 0; q < x->prof.nlaunches; q++) {
        uint64_t key = window_hash(&x->prof, q);
        size_t s = tab_slot(x, key);
        x->tab_pos[s] = x->tab_pos[s] == TAB_EMPTY ? q : TAB_AMBIGUOUS;
        x->tab_key[s] = key;
    }
    return FS_OK;
}

int fs_exec_install(struct fs_executor *x, struct fs_profile *p)
{
    struct fs_executor staged = {0};
    staged.prof = *p;
    memset(p, 0, sizeof(*p));
    struct fs_profile *sp = &staged.prof;
    int rc = FS_OK;
    if (sp->nlaunches <= 0 || !sp->plan.entries || sp->plan.nallocs != sp->nallocs ||
        fs_plan_evaluate(sp, &sp->plan) != FS_OK)
        rc = FS_ERR_INVALID;
    if (rc == FS_OK && x->mode == FS_OFFLOAD_HOST_READ)
        rc = fs_plan_host_read(sp, &sp->plan);
    if (rc == FS_OK)
        rc = build_actions(sp, false, &staged.pf_start, &staged.pf_ids);
    if (rc == FS_OK)
        rc = build_actions(sp, true, &staged.ev_start, &staged.ev_ids);
    if (rc == FS_OK)
        rc = build_table(&staged);
    if (rc == FS_OK) {
        /* Every planned move of one iteration plus a full re-placement fit at once. */
        staged.q_cap = 4 * (size_t)sp->nallocs + 1024;
        staged.q = malloc(staged.q_cap * sizeof(*staged.q));
        staged.pf = calloc((size_t)sp->nallocs + 1, sizeof(*staged.pf));
        if (!staged.q || !staged.pf)
            rc = FS_ERR_NOMEM;
    }
    if (rc != FS_OK) {
        free_plan(&staged);
        return rc;
    }
    /* Nothing to move: each allocation stays resident, is read in place from host memory, or is
     * never used in the iteration (it then stays where it is), and all but those read in place
     * fit the budget together. */
    bool moves_nothing = fs_plan_moves_nothing(sp, &sp->plan);
    /* What the plan keeps resident is evicted last when room is made on demand (without
     * memory for the list, LRU alone decides); in host-read mode the rest is read in place, in
     * redirect mode it is staged. Where the plan moves something, an allocation it offloads and
     * the iteration uses starts on host when the program makes it, unless the plan has it on
     * the device where the iteration begins: a buffer the program makes during its first
     * iteration, often before the executor has found its place, would stay on host and be read
     * over the link by every launch until its window came round (a 7b prefill's first forward:
     * 3.0 s against 0.66 s). One the iteration never uses may be the program's scratch while
     * it starts: it takes the device while there is room. */
    static const uint8_t offloaded_role[] = {[FS_OFFLOAD_PREFETCH] = FS_PLAN_MOVED,
                                             [FS_OFFLOAD_HOST_READ] = FS_PLAN_HOST,
                                             [FS_OFFLOAD_REDIRECT] = FS_PLAN_STAGED};
    uint8_t *role = malloc((size_t)sp->nallocs + 1);
    for (int a = 0; role && a < sp->nallocs; a++) {
        const struct fs_plan_entry *e = &sp->plan.entries[a];
        bool used = sp->allocs[a].first_use >= 0;
        bool in_place = fs_reads_in_place(sp, &sp->plan, a);
        bool host_first = (!moves_nothing || in_place) && used && !present_at(e, 0);
        /* one the plan reads in place is served from host memory in every mode */
        uint8_t off = in_place ? FS_PLAN_HOST : offloaded_role[x->mode];
        role[a] = e->resident ? FS_PLAN_KEPT : off | (host_first ? FS_PLAN_START_ON_HOST : 0);
    }
    fs_res_set_plan_roles(x->res, role, sp->nallocs);
    fs_res_set_link(x->res, sp->bw.h2d_latency_us, sp->bw.h2d_bytes_per_us, sp->bw.d2h_latency_us,
                    sp->bw.d2h_bytes_per_us);
    pthread_mutex_lock(&x->lock);
    free_plan(x);
    x->prof = staged.prof;
    x->pf_start = staged.pf_start;
    x->pf_ids = staged.pf_ids;
    x->ev_start = staged.ev_start;
    x->ev_ids = staged.ev_ids;
    x->tab_key = staged.tab_key;
    x->tab_pos = staged.tab_pos;
    x->tab_mask = staged.tab_mask;
    x->q = staged.q;
    x->q_cap = staged.q_cap;
    x->pf = staged.pf;
    x->synced = x->ever_synced = false;
    x->ring_len = x->ring_head = 0;
    x->roll = 0;
    x->roll_out_pow = 1;
    for (int k = 1; k < FS_EXEC_SYNC_WINDOW; k++)
        x->roll_out_pow *= HASH_MUL;
    x->lost_run = 0;
    x->gave_up = false;
    __atomic_store_n(&x->moves_nothing, moves_nothing, __ATOMIC_RELAXED);
    x->stats.plans++;
    fs_res_expect_moves(x->res);
    __atomic_store_n(&x->running, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&x->done); /* launches waiting for the old plan's prefetches */
    pthread_mutex_unlock(&x->lock);
    return FS_OK;
}

/* Lock held. */
static void stop_locked(struct fs_executor *x)
{
    __atomic_store_n(&x->running, 0, __ATOMIC_RELEASE);
    x->q_len = 0;
    x->has_held = false;
    x->q_gen++;
    if (x->pf)
        memset(x->pf, 0, (size_t)x->prof.nallocs * sizeof(*x->pf));
    pthread_cond_broadcast(&x->done); /* nobody waits for a dropped prefetch */
}

void fs_exec_set_offload_mode(struct fs_executor *x, enum fs_offload_mode mode,
                              bool late_in_place)
{
    x->mode = mode;
    x->late_in_place = late_in_place && mode == FS_OFFLOAD_REDIRECT;
}

void fs_exec_stop(struct fs_executor *x)
{
    pthread_mutex_lock(&x->lock);
    stop_locked(x);
    pthread_mutex_unlock(&x->lock);
    fs_res_set_plan_roles(x->res, NULL, 0);
}

int fs_exec_note_alloc(struct fs_executor *x, uint64_t id, uint64_t size, const char **why)
{
    if (!fs_exec_running(x))
        return FS_OK;
    int rc = FS_OK;
    pthread_mutex_lock(&x->lock);
    if (fs_exec_running(x) &&
        fs_profile_match_alloc(&x->prof, id, size, x->mismatch, sizeof(x->mismatch)) != FS_OK) {
        stop_locked(x);
        if (why)
            *why = x->mismatch;
        rc = FS_ERR_NOT_FOUND;
    }
    pthread_mutex_unlock(&x->lock);
    if (rc != FS_OK) /* the roles describe a plan that no longer runs */
        fs_res_set_plan_roles(x->res, NULL, 0);
    return rc;
}

/* ---- following the program ------------------------------------------------------------------ */

/* The place was found at launch Q: queue what the plan wants there (lock held). Evictions
 * first, so the prefetches find room; none when the plan moves nothing (fs_exec_moves_nothing):
 * the allocations the iteration never uses then stay where they are, and those it reads in place
 * started on host. */
static void place_for(struct fs_executor *x, int q)
{
    const struct fs_plan_entry *e = x->prof.plan.entries;
    bool evict = !__atomic_load_n(&x->moves_nothing, __ATOMIC_RELAXED);
    for (int a = 0; a < x->prof.nallocs && evict; a++)
        if (!present_at(&e[a], q))
            queue_move(x, (uint64_t)a, true);
    for (int a = 0; a < x->prof.nallocs; a++)
        if (present_at(&e[a], q))
            queue_move(x, (uint64_t)a, false);
}

static void ring_push(struct fs_executor *x, uint64_t sig)
{
    if (x->ring_len == FS_EXEC_SYNC_WINDOW) {
        x->roll -= x->ring[x->ring_head] * x->roll_out_pow;
        x->ring_head = (x->ring_head + 1) % FS_EXEC_SYNC_WINDOW;
        x->ring_len--;
    }
    x->ring[(x->ring_head + x->ring_len) % FS_EXEC_SYNC_WINDOW] = sig;
    x->ring_len++;
    x->roll = x->roll * HASH_MUL + sig;
}

static int find_place(const struct fs_executor *x)
{
    if (x->ring_len < FS_EXEC_SYNC_WINDOW)
        return -1;
    size_t s = tab_slot(x, x->roll);
    return x->tab_pos[s] >= 0 ? x->tab_pos[s] : -1;
}

static void give_up(struct fs_executor *x)
{
    stop_locked(x);
    x->gave_up = true;
    x->stats.give_ups++;
    FS_WARN("plan: the program has not followed the profile's iteration for %llu launches; "
            "running reactively (if the program's work changed, record its profile again)",
            (unsigned long long)x->lost_run);
}

/* Launches left out or added that one iteration may have while the place is kept. */
static int max_mismatches(int n)
{
    return n / 8 > FS_EXEC_SKIP_MAX ? n / 8 : FS_EXEC_SKIP_MAX;
}

/* The launch at CUR was matched: the next one expected; mismatches count per iteration. */
static void advance(struct fs_executor *x, int cur)
{
    int n = x->prof.nlaunches;
    if (cur + 1 >= n)
        x->mismatches_here = 0;
    x->pos = (cur + 1) % n;
}

/* Lock held: the place of the launch with signature SIG in the iteration, or -1 (lost). */
static int follow(struct fs_executor *x, uint64_t sig)
{
    int n = x->prof.nlaunches;
    ring_push(x, sig);
    if (x->synced) {
        if (x->prof.launches[x->pos].kernel == sig) {
            int cur = x->pos;
            advance(x, cur);
            x->stats.synced++;
            x->extra_run = 0;
            return cur;
        }
        /* A launch or a few this run does not make (another kernel choice, a copy fewer), or
         * one it makes in addition, keep the place; but not too many in one iteration: then the
         * program does something else. */
        int k = 1;
        while (k <= FS_EXEC_SKIP_MAX && x->prof.launches[(x->pos + k) % n].kernel != sig)
            k++;
        bool extra = k > FS_EXEC_SKIP_MAX;
        x->mismatches_here += extra ? 1 : k;
        bool keep = x->mismatches_here <= max_mismatches(n) &&
                    (!extra || ++x->extra_run <= FS_EXEC_SKIP_MAX);
        if (keep && extra) {
            x->stats.extra++;
            return -1;
        }
        if (keep) {
            int cur = (x->pos + k) % n;
            if (x->pos + k >= n)
                x->mismatches_here = 0; /* a new iteration began */
            x->stats.skipped += (uint64_t)k;
            x->stats.synced++;
            x->extra_run = 0;
            advance(x, cur);
            return cur;
        }
        x->synced = false;
        x->stats.departures++;
        FS_DEBUG("plan: launch %d of the iteration expected, other kernels came", x->pos);
    }
    int q = find_place(x);
    if (q >= 0) {
        if (!x->ever_synced)
            FS_INFO("plan: the program reached the profile's iteration (launch %d of %d); "
                    "running the plan", q, n);
        x->synced = x->ever_synced = true;
        x->extra_run = x->mismatches_here = 0;
        advance(x, q);
        x->stats.syncs++;
        x->stats.synced++;
        x->lost_run = 0;
        place_for(x, q);
        return q;
    }
    x->stats.lost_launches++;
    x->lost_run++;
    /* Before the first match the program may still be loading or warming up: wait longer. */
    uint64_t limit = x->ever_synced ? 4 * (uint64_t)n + 8192 : 16 * (uint64_t)n + 65536;
    if (x->lost_run > limit)
        give_up(x);
    return -1;
}

void fs_exec_launch_enter(struct fs_executor *x, struct fs_launch_ticket *t)
{
    t->pos = -1;
    if (!fs_exec_running(x))
        return;
    /* Nothing may synchronize or remap during a graph capture: the mover asks whether this
     * stream captures before each move (once per move, not on every launch). */
    __atomic_store_n(&x->last_stream, (void *)t->stream, __ATOMIC_RELEASE);
    pthread_mutex_lock(&x->lock);
    if (!fs_exec_running(x))
        goto out;
    int cur = follow(x, t->sig);
    if (cur < 0)
        goto out;
    /* Its exit takes the lock only where evictions follow it (most launches have none). */
    t->pos = x->ev_start[cur] < x->ev_start[cur + 1] ? cur : -1;
    if (cur == 0)
        x->iterations++;
    if (cur == 0 && fs_rt_on()) {
        uint64_t now = fs_now_ns();
        fs_rt_span(FS_RT_ITERATION, 0, 0, now, now);
    }
    for (int k = x->pf_start[cur]; k < x->pf_start[cur + 1]; k++)
        queue_move(x, (uint64_t)x->pf_ids[k], false);
    /* A planned allocation still on its way: wait for the mover rather than fault it in here
     * (the thread usually runs ahead of the device, so this often waits for the device to reach
     * the launch whose end frees the memory, not for a stall). */
    for (int i = 0; i < t->n; i++) {
        const struct fs_alloc *a = t->refs[i];
        if (fs_res_on_device(a))
            continue;
        bool planned = a->id < (uint64_t)x->prof.nallocs &&
                       present_at(&x->prof.plan.entries[a->id], cur);
        if (!planned) {
            /* read in place where the plan or the mode says so (residency counts it) */
            if (x->mode != FS_OFFLOAD_HOST_READ && !read_in_place(x, a->id))
                x->stats.unplanned++;
            continue;
        }
        x->stats.late++;
        if (x->late_in_place && drop_prefetch(x, a->id))
            continue; /* the residency serves it from host */
        /* None on its way: it was made after its prefetch point or pushed out for room, and
         * the plan brings it in only when its window comes round again (in redirect mode every
         * launch until then would read it from host). Its own prefetch now, once an iteration,
         * so that one that finds no room is not tried again at every launch; not during a graph
         * capture, when no move may begin and this launch would wait for nothing. */
        struct fs_exec_prefetches *pf = &x->pf[a->id];
        if (!x->late_in_place && pf->pending == 0 && pf->restaged_in != x->iterations + 1 &&
            !capture_in_progress(x)) {
            pf->restaged_in = x->iterations + 1;
            queue_move(x, a->id, false);
            x->stats.restaged++;
        }
        uint64_t t0 = fs_now_ns();
        /* the stream's idle time in the wait (stream_probe.h); none in a graph capture */
        struct fs_probe *probe =
            fs_rt_on() ? fs_probe_begin(&x->idle, t->stream, !capture_in_progress(x)) : NULL;
        /* The plan may be replaced while this waits: check the bound again each time. */
        while (fs_exec_running(x) && a->id < (uint64_t)x->prof.nallocs &&
               x->pf[a->id].pending > 0 && !fs_res_on_device(a))
            pthread_cond_wait(&x->done, &x->lock);
        uint64_t t1 = fs_now_ns();
        x->stats.late_wait_ns += t1 - t0;
        fs_rt_span(FS_RT_LATE_WAIT, a->id, a->mapped, t0, t1);
        fs_probe_end(&x->idle, probe, t->stream, a->id, a->mapped, t0, t1);
        if (!fs_exec_running(x))
            break;
    }
out:
    pthread_mutex_unlock(&x->lock);
}

void fs_exec_launch_exit(struct fs_executor *x, const struct fs_launch_ticket *t)
{
    if (t->pos < 0 || !fs_exec_running(x))
        return;
    pthread_mutex_lock(&x->lock);
    if (fs_exec_running(x) && t->pos < x->prof.nlaunches)
        for (int k = x->ev_start[t->pos]; k < x->ev_start[t->pos + 1]; k++)
            queue_move(x, (uint64_t)x->ev_ids[k], true);
    pthread_mutex_unlock(&x->lock);
}

bool fs_exec_take_give_up(struct fs_executor *x)
{
    if (!__atomic_load_n(&x->gave_up, __ATOMIC_ACQUIRE))
        return false;
    pthread_mutex_lock(&x->lock);
    bool g = x->gave_up;
    x->gave_up = false;
    pthread_mutex_unlock(&x->lock);
    if (g) /* the roles describe a plan that no longer runs */
        fs_res_set_plan_roles(x->res, NULL, 0);
    return g;
}

void fs_exec_drain(struct fs_executor *x)
{
    pthread_mutex_lock(&x->lock);
    while (!idle(x) || x->busy)
        pthread_cond_wait(&x->done, &x->lock);
    pthread_mutex_unlock(&x->lock);
}

uint64_t fs_exec_iterations(struct fs_executor *x)
{
    pthread_mutex_lock(&x->lock);
    uint64_t n = x->iterations;
    pthread_mutex_unlock(&x->lock);
    return n;
}

void fs_exec_get_stats(struct fs_executor *x, struct fs_exec_stats *out)
{
    pthread_mutex_lock(&x->lock);
    fs_probe_collect(&x->idle);
    *out = x->stats;
    out->idle = x->idle.counts;
    pthread_mutex_unlock(&x->lock);
}

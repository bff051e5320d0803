/* Residency: where each managed allocation's bytes live, and moving them under a budget.
 *
 * A managed allocation is a VA range of the managed space (va_space.h) that is always mapped
 * (invariant 1): to device physical memory when resident, to pinned host memory when evicted.
 * Moving it copies the bytes into the other side's block (phys_pool.h), then remaps the VA once
 * the range is quiet (invariant 2). A launch between its enter and exit notifications holds the
 * allocations it references (inflight > 0), so none is remapped under a launch being queued.
 * Then, by REMAP_SAFETY:
 *   - strict (default): a remap closes a gate that makes new launches wait, lets launches being
 *     queued finish queuing, and synchronizes the device: nothing can touch the range, not even
 *     a kernel that reaches it through a pointer kept in device memory;
 *   - tracked: only launches that referenced the allocation are waited for: its last-use event
 *     (recorded once memory pressure began, or a plan runs, by launches that reference an
 *     allocation the plan does not keep resident) must have fired; an allocation
 *     touched since the last full synchronize with no covering event, or any launch whose
 *     parameters could not be read queued since then, forces a full synchronize first. Epochs
 *     tell "since": a full synchronize starts a new epoch before it begins, and launches are
 *     stamped with the epoch once queued, so work stamped with an older epoch than the last
 *     completed synchronize's is done. Launches whose parameters could not be read hold
 *     nothing, so they pass the strict gate in this mode too: a remap waits for those being
 *     queued and keeps new ones out until it is done.
 * Eviction writes the device bytes back to host unless their fingerprint (fingerprint.h) equals
 * the one taken when host and device copies last agreed (after a fault-in or a write-back): the
 * check invariant 3 asks of the shortcut. WRITEBACK=always turns the shortcut off.
 * Staging (OFFLOAD_MODE=redirect, plan role FS_PLAN_STAGED) moves without remapping: the VA stays
 * mapped to host memory, a prefetch fills a device block (FS_RES_STAGED: stage_va is its address)
 * and launches that reference the allocation have their pointers redirected to it (launch.h); the
 * stage's end is an eviction without the remaps. A launch that cannot be redirected ends the stage
 * first, so the VA's bytes are the current ones whenever such a launch touches them.
 * Plain allocations (fs_alloc.plain) are the exception to the first line: made while launch
 * tracking is paused, they would be frozen on the device anyway, so they get plain device memory
 * outside the managed space (device.h mem_alloc), never move, and only count against the budget.
 *
 * All state changes happen under one mutex; the launch hot path (launch.c) only reads atomics. */
#ifndef FS_RESIDENCY_H
#define FS_RESIDENCY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "fingerprint.h"
#include "phys_pool.h"
#include "stream_probe.h"
#include "va_space.h"

enum fs_res_state {
    FS_RES_DEVICE = 0,    /* mapped to device memory */
    FS_RES_HOST = 1,      /* mapped to pinned host memory */
    FS_RES_MOVING = 2,    /* being remapped: launches wait on the residency lock */
    FS_RES_STAGED = 3,    /* mapped to pinned host memory, with a copy in DEV that launches'
                           * pointers are redirected to (OFFLOAD_MODE=redirect) */
};

/* A reference-counted event: the last use of several allocations can share one. */
struct fs_shared_event {
    fs_event ev;
    fs_stream stream; /* where it was recorded */
    int refs;         /* atomic */
    struct fs_shared_event *next_free;
};

struct fs_alloc {
    fs_dptr va;
    uint64_t size;   /* as requested */
    uint64_t mapped; /* rounded up to the granularity */
    uint64_t id;     /* allocation order, stable across runs of a deterministic program */
    int state;       /* enum fs_res_state, atomic */
    int inflight;    /* launches between enter and exit that reference it, atomic */
    uint64_t touch_epoch;  /* quiescence epoch of the last referencing launch, atomic */
    uint64_t lru_tick;     /* launch counter at the last reference or move here (LRU), atomic */
    uint64_t last_tick;    /* tick of the last launch queued with a reference to it, atomic */
    struct fs_block *dev;   /* device memory, when resident */
    struct fs_block *host;  /* host memory: the bytes when evicted; kept as write-back target */
    struct fs_shared_event *last_use; /* swapped atomically by launch exits */
    uint64_t event_tick;    /* the launch tick last_use covers; < last_tick: not covered */
    /* the plan keeps it resident (atomic; changes under the lock): a launch that references only
     * such allocations records no last-use event (an eviction on demand synchronizes instead) */
    bool kept;
    /* epoch of the last launch queued with a reference to it and no last-use event (atomic):
     * until a full synchronize completes after it, no event covers A, not even a later one
     * (which may be on another stream) */
    uint64_t skip_epoch;
    /* never moved again (lock): it existed while launch tracking was paused, so a launch the
     * engine did not see may use it at any time; on the device or, as FS_PLAN_HOST, on host
     * (fs_res_freeze, fs_res_alloc), or on host when tracking could not resume
     * (fs_res_freeze_alloc) */
    bool frozen;
    /* plain device memory of its own (mem_alloc), outside the VA space, never in allocs[]: made
     * frozen, while launch tracking was paused, so nothing about it is ever remapped (lock) */
    bool plain;
    int index;              /* in fs_residency.allocs */
    struct fs_fp fp;        /* fingerprint of the host copy, when fp_valid */
    bool fp_valid;          /* host block and device copy agreed when fp was taken, and no
                             * launch served from host memory has run since (it may write it) */
    /* moving onto the device with its VA already on the device block: launches make their
     * stream wait for ARRIVE_EV (the copy) instead of waiting on the host (atomic; both change
     * under the lock) */
    bool arriving;
    fs_event arrive_ev;
    /* OFFLOAD_MODE=redirect: while A has a device copy that launches use instead of its VA, the
     * copy's address (DEV's copy_va); 0 otherwise (atomic; set and cleared under the lock, and
     * cleared only while no launch holds A, but for a stage-in whose copy failed) */
    fs_dptr stage_va;
};

struct fs_res_stats {
    uint64_t allocs_live, bytes_live;
    uint64_t device_bytes_held; /* device pool, in use and cached */
    uint64_t device_bytes_peak; /* device pool and plain allocations together */
    /* device pool blocks made (device memory created and mapped) and given back (trimmed to
     * make room for a block of another size), with the host time in the driver for them: work
     * on the mover's path */
    struct fs_pool_counts device_blocks;
    uint64_t host_bytes_held;   /* host pool */
    uint64_t background_pins;   /* host blocks the pinner thread pinned */
    uint64_t pinner_starts;     /* 1 once the pinner thread is started (at its first work) */
    uint64_t evictions, evicted_bytes;
    uint64_t faults, faulted_bytes;   /* on-demand fault-ins */
    uint64_t prefetches, prefetched_bytes;
    uint64_t placed_on_host;          /* allocations that started on host: no room, or the plan's
                                       * FS_PLAN_START_ON_HOST */
    uint64_t host_served;             /* references left on host (no room, capture) */
    uint64_t quiesce_syncs;           /* full synchronizes forced by the quiet-range rule */
    uint64_t clean_evictions, clean_bytes; /* evictions whose write-back the fingerprint skipped */
    uint64_t fingerprints;            /* fingerprints taken (queued on the device) */
    uint64_t async_moves;             /* moves through fs_res_move_begin/end */
    uint64_t early_maps;              /* prefetches mapped at their VA before the copy landed */
    uint64_t ordered_waits;           /* launches that waited for such a copy on their stream */
    /* Run trace only (stream_probe.h): the device time those streams spent waiting for the
     * copies; launches measured, and launches that could not be */
    struct fs_probe_counts ordered_wait;
    uint64_t failures;                /* internal failures that fell back (logged) */
    /* COPY_WAIT=predict: waits that slept before waiting on the copy's event, and those whose
     * copy had already ended when the sleep did (the prediction was late; atomic) */
    uint64_t predicted_sleeps, overslept;
    uint64_t frozen;                  /* allocations never moved again (fs_res_freeze) */
    uint64_t plain_made;  /* allocations given plain device memory (fs_alloc.plain) */
    uint64_t plain_bytes; /* live plain device memory (the device pool's outside bytes) */
    /* OFFLOAD_MODE=redirect: device copies made and ended, their bytes, launches whose pointers
     * were redirected to them, and stages ended on the program's thread for a launch that could
     * not be redirected (a copy, a memset, an unreadable launch) */
    uint64_t stage_ins, stage_outs, staged_bytes, redirected, unstage_syncs;
    /* Remaps by kind, [FS_REMAP_MAP or FS_REMAP_UNMAP][enum fs_mem_loc]: calls, host time spent
     * in them and bytes (atomic: some are made without the lock) */
    uint64_t remaps[2][2], remap_ns[2][2], remap_bytes[2][2];
};
enum { FS_REMAP_MAP, FS_REMAP_UNMAP };

struct fs_residency {
    struct fs_device *dev;
    struct fs_va_space vs;
    struct fs_phys_pool dev_pool, host_pool;
    uint64_t budget;
    pthread_mutex_t lock;
    pthread_cond_t moved; /* broadcast when an allocation leaves FS_RES_MOVING */
    fs_stream h2d, d2h;
    /* a prefetch's fingerprint runs here, after its copy, so that the next copy on h2d does not
     * wait for it (NULL: on h2d) */
    fs_stream fp_side;
    struct fs_alloc **allocs;
    int nallocs, cap_allocs;
    /* fs_alloc.plain ones, sorted by VA (lock); their bytes count against the budget */
    struct fs_alloc **plain;
    size_t nplain, cap_plain;
    uint64_t next_id;
    uint64_t epoch;         /* atomic; a full synchronize starts a new one before it begins */
    uint64_t synced_epoch;  /* atomic; work stamped with an older epoch has completed */
    uint64_t unknown_epoch; /* epoch of the last unreadable launch (stamped once queued), atomic */
    uint64_t tick;          /* launch counter, atomic */
    bool strict;            /* REMAP_SAFETY=strict */
    int gate;               /* strict: remaps waiting or running, atomic */
    int gate_waiters;       /* launches waiting for the gate to open, atomic */
    int launches_inflight;  /* strict: launches between enter and exit, atomic */
    int pressure;           /* record last-use events (atomic); set at the first eviction */
    uint64_t *fp_parts;     /* fingerprint results (device-writable host memory); NULL: off */
    int evictions_inflight; /* asynchronous evictions begun, not ended (lock) */
    int staged_live;        /* allocations with a stage_va (atomic; changes under the lock) */
    uint8_t *plan_role;     /* by allocation id: enum fs_plan_role (lock) */
    bool freeze_new;        /* launch tracking is paused: allocations placed on the device, or
                             * on host where the plan serves them from, are frozen (lock) */
    int nplan_role;
    pthread_mutex_t ev_lock; /* guards free_events only */
    struct fs_shared_event *free_events;
    unsigned wait_event_flags; /* event_create flags of the events the engine waits on */
    /* COPY_WAIT=predict: the link model per direction (FS_LINK_H2D, FS_LINK_D2H; 0 ns a byte:
     * none, no sleeps; lock), and when a finisher last saw a copy of that stream end while it
     * waited (0: not seen; atomic): the next copy began no earlier */
    bool predicted_waits;
    struct fs_res_link {
        double latency_ns, ns_per_byte;
        uint64_t last_end_ns;
    } link[2];
    struct fs_res_stats stats;
    struct fs_probe_pool ordered_probes; /* waits on arriving copies (run trace only; lock) */
    /* background pinning: host blocks for the allocations the budget will push out (one
     * thread: the driver makes pinned host memory at about 4 GB/s however many threads ask,
     * tests/gpu/pin_probe.c) */
    pthread_t pinner;
    bool background_pinning; /* PIN_MODE=background: the pinner starts at the first need */
    bool pinner_started, pinner_failed, pinner_stop;
    pthread_cond_t pinner_wake;
    uint64_t host_backed_bytes; /* host blocks attached to allocations */
    uint64_t *prepin;           /* sizes of host blocks to pin ahead of any need (a plan's) */
    int nprepin, prepin_next;
};

/* COPY_WAIT: how the engine's threads wait for the copies of its moves (the context's way;
 * sleeping on blocking events; a sleep through the copy's predicted time, then the context's). */
enum fs_copy_wait { FS_COPY_WAIT_CONTEXT, FS_COPY_WAIT_BLOCK, FS_COPY_WAIT_PREDICT };
enum { FS_LINK_H2D, FS_LINK_D2H }; /* the link's directions: fs_residency.link */

struct fs_res_config {
    uint64_t budget;
    uint64_t va_space_bytes; /* managed address range to reserve */
    bool background_pinning;
    bool strict_remap;       /* REMAP_SAFETY=strict */
    bool fingerprint;        /* WRITEBACK=fingerprint: skip the write-back of unchanged data */
    enum fs_copy_wait copy_wait; /* COPY_WAIT, in its values' order */
};

int fs_res_init(struct fs_residency *res, struct fs_device *dev, const struct fs_res_config *cfg);
/* Frees everything (the program's allocations included): only at shutdown. */
void fs_res_destroy(struct fs_residency *res);

/* A new managed allocation: on the device if the budget allows after eviction, else on host.
 * While allocations are frozen as they are placed (fs_res_freeze), one that fits the budget
 * without eviction gets plain device memory (fs_alloc.plain): it will never move, and plain
 * memory costs the program's kernels less than VMM-mapped memory (docs/PERFORMANCE.md, stop 28).
 * The VA space falls back to the usual path when plain memory cannot be had. */
int fs_res_alloc(struct fs_residency *res, uint64_t size, fs_dptr *out);
/* Any managed allocation containing ADDR, plain ones included (slower than fs_res_lookup, which
 * sees only the VA space: no launch ever needs a plain one, which never moves); NULL if none. */
struct fs_alloc *fs_res_find(struct fs_residency *res, uint64_t addr);
/* Free a managed allocation by its base address; FS_ERR_NOT_FOUND if not ours,
 * FS_ERR_INVALID for an address inside one. Synchronizes the device first (cudaFree does). */
int fs_res_free(struct fs_residency *res, fs_dptr va);

static inline struct fs_alloc *fs_res_lookup(const struct fs_residency *res, uint64_t addr)
{
    struct fs_alloc *a = (struct fs_alloc *)fs_va_space_lookup(&res->vs, addr);
    return a && addr < a->va + a->size ? a : NULL;
}

/* On the device, staged, or arriving (its VA, or its stage, shows the device block its copy
 * fills): a launch needs no wait on the host for it, only on its stream for the copy
 * (fs_res_launch_begin). */
static inline bool fs_res_on_device(const struct fs_alloc *a)
{
    int state = __atomic_load_n(&a->state, __ATOMIC_ACQUIRE);
    return state == FS_RES_DEVICE || state == FS_RES_STAGED ||
           __atomic_load_n(&a->arriving, __ATOMIC_ACQUIRE);
}

/* The planner's moves, by allocation order ID (the allocation may have been freed meanwhile:
 * FS_ERR_NOT_FOUND). Prefetch: bring it onto the device now (the caller waits; "make resident
 * ahead of use"); FS_ERR_NOMEM when the budget cannot make room (it stays on host). Evict: to
 * host with write-back; FS_OK when it is there already, FS_ERR_NOT_READY while a launch being
 * queued holds it. */
int fs_res_prefetch_id(struct fs_residency *res, uint64_t id);
int fs_res_evict_id(struct fs_residency *res, uint64_t id);

/* What a plan does with each allocation (by id, ROLE[id] for ids below N):
 *   FS_PLAN_MOVED   prefetched and evicted by the plan (or not in it);
 *   FS_PLAN_KEPT    kept resident: when room must be made on demand, others are evicted first,
 *                   since the plan never brings a kept one back and each of its next uses would
 *                   fault it in and evict another;
 *   FS_PLAN_HOST    served from host memory (OFFLOAD_MODE=host_read, or a plan that reads it in
 *                   place in any mode): a launch that references it while it is on host reads
 *                   it there over the link, never faults it in.
 *   FS_PLAN_STAGED  moved by the plan without remapping (OFFLOAD_MODE=redirect): its VA stays
 *                   mapped to host memory; a prefetch copies it into a device block and the
 *                   pointers of launches that reference it are redirected to that copy until
 *                   the plan's eviction (which writes it back if it changed); a launch that
 *                   finds no copy reads it from host, never faults it in.
 * A role may carry FS_PLAN_START_ON_HOST: an allocation with that id not made yet is placed in
 * pinned host memory when it is made, not on the device, since the plan would only push it out
 * again (its next uses come from its prefetches or read it in place); it takes the device only
 * if no host memory can be pinned. Without the flag a new allocation takes the device while the
 * budget allows, evicting others. A program that builds its model under a plan then evicts none
 * of the allocations its iteration uses to make room for others.
 * Takes ROLE (malloc'd; freed with the next call or fs_res_destroy); NULL forgets them. */
enum fs_plan_role { FS_PLAN_MOVED, FS_PLAN_KEPT, FS_PLAN_HOST, FS_PLAN_STAGED };
enum { FS_PLAN_ROLE_MASK = 0x0f, FS_PLAN_START_ON_HOST = 0x10 };
void fs_res_set_plan_roles(struct fs_residency *res, uint8_t *role, int n);

/* Pin host blocks of these SIZES (granularity multiples) into the pool in the background, ahead
 * of need: a plan loaded at start-up knows which allocations it will evict, so the evictions
 * during the program's start find their pinned memory ready instead of pinning on demand. A
 * second call replaces what is left of the first; without the background pinner, nothing. */
void fs_res_prepin(struct fs_residency *res, const uint64_t *sizes, int n);
/* COPY_WAIT=predict: the link model the waits predict copies with (a profile's, measured on this
 * machine's link: fs_bw_model's latency and bytes per microsecond of each direction). */
void fs_res_set_link(struct fs_residency *res, double h2d_latency_us, double h2d_bytes_per_us,
                     double d2h_latency_us, double d2h_bytes_per_us);
/* COPY_WAIT=predict: when a wait for a copy of COPY_NS (predicted) should wake, the copy having
 * begun at the earliest when it was queued (QUEUED_NS) or when the copy before it on its stream
 * was seen to end (PREV_END_NS, 0: not seen): FS_COPY_WAKE_MARGIN_NS or a fifth of the copy,
 * whichever is more, before its predicted end, so that a link a little faster than the model
 * and a late wake-up still find the waiter before the copy ends. 0: the copy is too short. */
#define FS_COPY_WAKE_MARGIN_NS 150000
uint64_t fs_res_copy_wake_ns(uint64_t queued_ns, uint64_t prev_end_ns, uint64_t copy_ns);

/* Asynchronous moves, for the plan's mover: several can be in flight, so write-backs,
 * prefetches and remaps overlap (both link directions busy; the CPU remaps one allocation while
 * the link copies the next). fs_res_move_begin marks the allocation moving, orders the copy after
 * its last use on the engine's stream (no host wait), queues the copy (an eviction first
 * compares fingerprints and copies only if the data changed) and records M->EV. A begun
 * prefetch whose range is quiet already (no use of it may still run) can then map the device
 * block at the VA while the copy runs (fs_res_move_map): a launch that references it makes its
 * stream wait for M->EV (fs_res_launch_begin), so the program's thread waits for no copy. The
 * residency lock is free until fs_res_move_end, which waits for (or, WAIT false, polls) the
 * copy, remaps if that was not done yet, and finishes. Only in tracked mode with no unknown launch seen so far: a move in flight keeps
 * the gate closed, which would stall strict mode's every launch (FS_ERR_UNSUPPORTED: use the
 * synchronous calls above). */
#define FS_RES_NOTHING 1 /* begin: already where the move would put it */

struct fs_res_move {
    fs_event ev;     /* the caller's: recorded after the queued work */
    fs_event fp_ev;  /* the caller's, optional: a prefetch's fingerprint on res->fp_side lands
                      * with it (the move is over, and launches may use the data, only then) */
    uint64_t *parts; /* the caller's: FS_FP_PARTS_BYTES from the device's host_alloc */
    /* the caller's, optional: called (no lock held) when an eviction's device memory is back in
     * the pool, before the slower mapping of host memory that ends the move */
    void (*on_room)(void *arg);
    void *on_room_arg;
    /* the caller's: an eviction begins only if every use of the allocation has finished (else
     * FS_ERR_NOT_READY), so that its copy does not wait for the last use on the device-to-host
     * stream (where the copies queued after it would wait too) */
    bool only_if_quiet;
    /* set by begin */
    struct fs_alloc *a;
    bool evict;
    bool comparing;        /* eviction: the fingerprint is compared before any copy */
    bool fp_queued;        /* a fingerprint of the moved data lands in PARTS with EV */
    bool fp_side;          /* ... with FP_EV instead, on res->fp_side */
    bool fp_known;         /* FP holds the moved data's fingerprint */
    bool mapped_early;     /* prefetch: the VA shows the block already (A->arriving) */
    bool released;         /* eviction: its device memory is back in the pool */
    int failed_rc;         /* eviction: why its release failed (the move is over), or FS_OK */
    bool clean;            /* eviction: the fingerprint showed the data unchanged (no copy) */
    bool staged;           /* a stage's begin or end (FS_PLAN_STAGED): nothing is remapped */
    struct fs_fp fp;
    struct fs_block *block; /* prefetch: the device block being filled */
    uint64_t t_begin_ns;
    /* COPY_WAIT=predict: the copy's predicted duration on the link (0: none to predict) and
     * when it was queued (just before the copy) */
    uint64_t copy_ns, t_queued_ns;
};

/* FS_OK: started, finish with fs_res_move_end. FS_RES_NOTHING; FS_ERR_NOT_FOUND (freed);
 * FS_ERR_NOT_READY: in use or moving, or (prefetch) room comes only when moves in flight end,
 * or (eviction, ONLY_IF_QUIET) a use may still run: retry later; FS_ERR_UNSUPPORTED (see
 * above); FS_ERR_NOMEM (no room within the budget). */
int fs_res_move_begin(struct fs_residency *res, uint64_t id, bool evict, struct fs_res_move *m);
/* A begun prefetch: map its device block at the VA now, if no use of the range may still run
 * (FS_ERR_NOT_READY: not known to be quiet; the end remaps). A remap costs driver time that
 * other threads' remaps wait for, so it is not done on the thread that begins copies. */
int fs_res_move_map(struct fs_residency *res, struct fs_res_move *m);
/* A begun eviction's first half: once its copy is done (WAIT false: FS_ERR_NOT_READY before),
 * unmap the device memory and give it back (M->ON_ROOM). FS_OK: fs_res_move_end then maps the
 * host memory at the VA; another error: the move failed and is over (logged, counted; later
 * calls, fs_res_move_end's too, return the same error and do nothing). Ending
 * the evictions whose copies are done before any of them maps host memory (slow) frees room for
 * prefetches sooner. */
int fs_res_move_release(struct fs_residency *res, struct fs_res_move *m, bool wait);
/* FS_ERR_NOT_READY while the copy runs (WAIT false); FS_OK when moved; another error: the move
 * failed and the allocation stayed where it was (logged, counted). An eviction gives its device
 * memory back (M->ON_ROOM) before it maps the host memory. */
int fs_res_move_end(struct fs_residency *res, struct fs_res_move *m, bool wait);

/* Record last-use events from now on (tracked mode), as the first eviction does: a plan is about
 * to move allocations, and each move should wait only for the launches that used it. */
static inline void fs_res_expect_moves(struct fs_residency *res)
{
    __atomic_store_n(&res->pressure, 1, __ATOMIC_RELEASE);
}

/* Begin a launch (every launch, N may be 0) that references ALLOCS (distinct); UNKNOWN: its
 * parameters could not be read. In strict mode, or when UNKNOWN, wait while a remap is in
 * progress (the gate); take a hold on each allocation so none is remapped while the launch is
 * queued, bringing evicted ones onto the device first (on-demand fault-in; while STREAM is
 * capturing nothing may synchronize or remap, so they are used where they are). Returns the
 * launch's tick for fs_res_launch_done. Never fails: what cannot be made resident is read from
 * host memory (counted).
 * Staged allocations: *REDIRECT (optional) says whether the caller must redirect the launch's
 * pointers into staged allocations to their stage_va (held, so it stays until the launch is
 * done). A launch that cannot be redirected (FIXED: a copy, a memset, too many pointers; or an
 * unknown one) first ends the stages it may touch, so that it reads and writes the only copy;
 * one queued into a graph capture reads the host copy (nothing may wait during a capture). */
uint64_t fs_res_launch_begin(struct fs_residency *res, struct fs_alloc *const *allocs, int n,
                             fs_stream stream, bool unknown, bool fixed, bool *redirect);

/* After the launch was queued on STREAM (QUEUED false: the driver refused it): record its
 * last-use event under pressure, note an unknown launch (the next remap synchronizes first) and
 * release the holds and the gate. */
void fs_res_launch_done(struct fs_residency *res, uint64_t tick, fs_stream stream,
                        struct fs_alloc *const *allocs, int n, bool queued, bool unknown);

void fs_res_get_stats(struct fs_residency *res, struct fs_res_stats *out);

/* For drawing copies (a prefetch reads the host block, not the VA): up to MAX allocations with a
 * host block, each as its VA and its host block's copy address. Returns how many. */
int fs_res_host_blocks(struct fs_residency *res, fs_dptr *alloc_va, fs_dptr *block_va, int max);

/* Launch tracking is about to pause: if every allocation is on the device, or on host where the
 * plan serves it from (FS_PLAN_HOST: a plan that moves nothing reads it in place), and none is
 * moving, freeze them all (never moved again) and the ones placed so from now on, until
 * fs_res_stop_freezing; FS_OK. FS_ERR_NOT_READY (nothing changed) otherwise. */
int fs_res_freeze(struct fs_residency *res);

/* Freeze the allocation at VA wherever it is (launch tracking could not resume). */
void fs_res_freeze_alloc(struct fs_residency *res, fs_dptr va);

/* Is A frozen (never moved again)? */
bool fs_res_frozen(struct fs_residency *res, const struct fs_alloc *a);

/* Launch tracking resumed: new allocations are managed as usual again (the frozen stay so). */
void fs_res_stop_freezing(struct fs_residency *res);

/* The fingerprints of the managed allocations with ids below N as their bytes are once the device
 * has finished the work queued so far (the device is synchronized): FP[id] where KNOWN[id]; not
 * known when the allocation is not live, is moving, or its fingerprint failed. The recorder takes
 * two, an iteration or more apart, to learn which allocations the iteration leaves unchanged.
 * FS_ERR_UNSUPPORTED when fingerprints are off (WRITEBACK=always, or the device cannot). */
int fs_res_fingerprint_all(struct fs_residency *res, struct fs_fp *fp, bool *known, int n);

/* Device bytes managed allocations hold now (pool, used and cached). */
uint64_t fs_res_device_bytes(struct fs_residency *res);

#endif

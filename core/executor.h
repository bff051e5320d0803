/* The plan executor: the inference phase. It runs a profile's plan while the program runs.
 *
 * Following the program: launches are matched to the profile's iteration one by one by kernel
 * signature (launch.h). While they match, the executor knows the program's place in the plan; a
 * few launches left out or added at one point are tolerated (counted). When the sequence differs
 * for longer (another code path, other shapes) it is lost: the program runs reactively
 * (residency.h) and every launch is counted as a departure until the last FS_EXEC_SYNC_WINDOW
 * signatures match exactly one place of the iteration again. When it stays lost for long the
 * executor gives up, so that the engine can discover and plan again.
 *
 * Running the plan: at the launch where an allocation's prefetch is planned, a prefetch is
 * queued; after the launch that ends its window, an eviction. A mover thread starts them in
 * order, up to FS_EXEC_MOVES_INFLIGHT at once (residency.h's asynchronous moves: write-backs,
 * prefetches and remaps overlap; an eviction's copy waits on the device for the allocation's last
 * use, as residency.h requires; a prefetch that needs the room of evictions in flight waits for
 * them, and meanwhile evictions queued behind it whose allocation is quiet begin first), so the
 * program's thread never copies or remaps for a plan: when a launch finds a planned
 * allocation whose prefetch has not begun and been mapped yet it waits for that (counted as
 * late; the launch's own fault-in brings it only if that prefetch failed; one with no prefetch on
 * its way, made after its prefetch point or pushed out for room, gets one queued by that launch,
 * once an iteration); once it is mapped the
 * launch waits for the copy on its stream (residency.h, "arriving"). The thread usually runs
 * ahead of the device, so such a wait often holds the thread back while the device still has
 * work queued, rather than stalling the device. Three threads finish the moves (fin[]): one maps
 * begun prefetches early, one ends prefetches, one ends evictions (it gives each one's device
 * memory back and its slot free as soon as its copy is done, and maps host memory at its VA
 * after, from the released queue). When the position is found,
 * the executor first queues what the plan wants at that point: allocations outside their window
 * go to host, resident ones come back.
 *
 * Matching the program: a profile describes allocations by order and size; each new managed
 * allocation is checked, and the first that differs stops the executor (the engine says so and
 * discovers again). */
#ifndef FS_EXECUTOR_H
#define FS_EXECUTOR_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "launch.h"
#include "profile.h"
#include "residency.h"
#include "stream_probe.h"

/* Signatures that must match to find the place in the iteration again. */
#define FS_EXEC_SYNC_WINDOW 32
/* Launches of the plan a run may leave out, or add, at one point without losing its place (and
 * in one iteration, at most this many or an eighth of its launches, whichever is more). */
#define FS_EXEC_SKIP_MAX 8
enum { FIN_EVICT, FIN_PREFETCH, FIN_MAP, FS_EXEC_FINISHERS };

/* Moves the mover keeps in flight (each has its own event and fingerprint buffer). */
#define FS_EXEC_MOVES_INFLIGHT 32
/* Released evictions waiting for their host mapping, off the slots (more: releases wait). */
#define FS_EXEC_RELEASED_MAX 256

struct fs_exec_stats {
    uint64_t plans;            /* plans installed */
    uint64_t synced;           /* launches matched to their place in the plan */
    uint64_t departures;       /* times the program left the plan's iteration */
    uint64_t skipped;          /* plan launches the program did not make (place kept) */
    uint64_t extra;            /* launches not in the plan (place kept) */
    uint64_t lost_launches;    /* launches run while lost (reactively) */
    uint64_t syncs;            /* times the place was found (first time included) */
    uint64_t prefetches;       /* prefetches queued */
    uint64_t evictions;        /* evictions queued */
    uint64_t late;             /* references to planned-present allocations not on the device
                                * nor arriving (residency.h) when the launch was about to be
                                * queued (the thread waited) */
    uint64_t late_wait_ns;     /* time the launching threads spent waiting for late prefetches */
    /* Run trace only (stream_probe.h): of those waits, the time the launch's stream had run
     * out of work; waits measured, and waits that could not be */
    struct fs_probe_counts idle;
    uint64_t unplanned;        /* references to allocations the plan had on host there */
    uint64_t evict_busy;       /* evictions skipped: a launch held the allocation */
    uint64_t read_in_place;    /* prefetches dropped: a late reference read it from host */
    uint64_t move_failures;    /* moves that failed (the residency engine said why) */
    uint64_t dropped;          /* moves not queued: queue full */
    uint64_t overlapped;       /* moves run asynchronously (the others: one at a time) */
    uint64_t max_inflight;     /* most moves in flight at once */
    uint64_t passed;           /* evictions begun ahead of a prefetch held back for room */
    uint64_t restaged;         /* prefetches queued for a launch that found a planned allocation
                                * on host with none pending (made after its prefetch point, or
                                * pushed out for room) */
    uint64_t host_maps_first;  /* released evictions' host mappings moved ahead of older ones:
                                * a prefetch of the allocation waited for it */
    uint64_t host_maps_put_off; /* times the host mapping waited for a begun prefetch's */
    uint64_t give_ups;
};

struct fs_exec_job {
    uint64_t id;
    bool evict;
    uint64_t gen; /* the queue generation (q_gen) it was queued in */
};

/* Per profile allocation: its prefetches queued or running (PENDING), of those the ones still in
 * the queue (QUEUED), and how many of these the mover drops when it takes them (DROP: a launch
 * read the allocation in place instead of waiting, fs_exec_set_offload_mode). */
struct fs_exec_prefetches {
    int pending, queued, drop;
    uint64_t restaged_in; /* iteration (+1) of its last prefetch queued by a launch, 0: none */
};

struct fs_executor;

/* An eviction whose device memory is back in the pool, waiting for host memory at its VA. */
struct fs_exec_released {
    struct fs_exec_job job;
    struct fs_res_move m; /* its event and fingerprint buffer are no longer used */
};

/* A thread that finishes moves of one kind in the order they began (fin[] says which). */
struct fs_exec_finisher {
    struct fs_executor *x;
    pthread_t thread;
    pthread_cond_t wake;
    int ring[FS_EXEC_MOVES_INFLIGHT]; /* slot indices */
    int head, len;
    bool stop;
};

/* A move in flight on the mover (an eviction: until its device memory is released). */
struct fs_exec_slot {
    struct fs_exec_job job;
    struct fs_res_move m;
    bool busy;
    bool map_tried; /* prefetch: FIN_MAP tried to map it early (fs_res_move_map) */
};

struct fs_executor {
    struct fs_residency *res;
    pthread_mutex_t lock;
    int running; /* atomic: a plan is installed and being followed */
    bool moves_nothing; /* the plan moves nothing (fs_exec_moves_nothing), atomic */
    struct fs_profile prof; /* owned; its plan is the one run */
    /* actions per launch, CSR: prefetches queued at launch i, evictions after it */
    int *pf_start, *pf_ids, *ev_start, *ev_ids;
    /* where the program is */
    bool synced, ever_synced;
    int pos;                 /* the next expected launch when synced */
    uint64_t ring[FS_EXEC_SYNC_WINDOW];
    int ring_len, ring_head;
    uint64_t roll, roll_out_pow; /* rolling hash of the ring; its oldest entry's multiplier */
    uint64_t *tab_key;       /* window hash -> position (or -2: ambiguous), open addressing */
    int *tab_pos;
    size_t tab_mask;
    uint64_t lost_run;       /* consecutive lost launches */
    int extra_run;           /* consecutive launches not in the plan while synced */
    int mismatches_here;     /* launches left out or added in this iteration so far */
    bool gave_up;            /* set when giving up; fs_exec_take_give_up clears it */
    char mismatch[256];      /* why the profile was refused, for the log */
    /* the mover */
    pthread_t mover;
    bool mover_started, mover_joined, stop, busy;
    void *last_stream;       /* atomic: the stream of the latest launch (capture check) */
    pthread_cond_t wake, done; /* jobs queued; the queue drained */
    struct fs_exec_job *q;
    size_t q_cap, q_head, q_len;
    struct fs_exec_prefetches *pf; /* per profile allocation */
    struct fs_exec_slot slots[FS_EXEC_MOVES_INFLIGHT];
    int nslots;              /* slots with an event and a fingerprint buffer (0: one at a time) */
    int inflight;            /* busy slots (mover thread only) */
    struct fs_exec_job held; /* a job taken off the queue that waits for moves in flight */
    bool has_held;
    uint64_t pass_at;        /* COMPLETIONS when a passing eviction last had to wait: none
                              * passes again before a move ends */
    uint64_t held_ns;        /* when it was held (run trace) */
    /* released evictions, oldest first but for one a prefetch waits for, moved to the head
     * (fs_exec_released_needed_first); only FIN_EVICT takes from or adds to it */
    struct fs_exec_released released[FS_EXEC_RELEASED_MAX];
    int released_head, released_len;
    bool early_mapping;      /* FIN_MAP is remapping a begun prefetch (host mappings wait) */
    uint64_t completions;    /* moves ended or evictions' room freed so far; held_at: the count
                              * when HELD was held */
    uint64_t held_at;
    /* [FIN_EVICT] ends evictions, [FIN_PREFETCH] prefetches; [FIN_MAP] maps begun prefetches at
     * their VAs early (it never waits for a copy, so a prefetch begun while the finisher waits
     * for an older one is mapped at once) */
    struct fs_exec_finisher fin[FS_EXEC_FINISHERS];
    uint64_t q_gen;          /* changes whenever the queue is emptied or replaced */
    uint64_t iterations;     /* times the program reached the iteration's first launch */
    int mode;                /* enum fs_offload_mode (fs_exec_set_offload_mode) */
    bool late_in_place;      /* LATE_PREFETCH=read_in_place (fs_exec_set_offload_mode) */
    struct fs_probe_pool idle; /* the streams' idle time in late waits (run trace only) */
    struct fs_exec_stats stats;
};

/* The eviction finisher's next host mapping: the oldest released eviction whose allocation a
 * prefetch of the plan waits for is moved to the head of the released queue, unless the head's is
 * waited for too (lock held). */
void fs_exec_released_needed_first(struct fs_executor *x);

/* Start the mover thread (no plan yet). */
int fs_exec_init(struct fs_executor *x, struct fs_residency *res);
void fs_exec_destroy(struct fs_executor *x);
/* At exit: stop following and join the mover, but keep the tables (other threads may still be
 * launching); fs_exec_destroy frees them later. */
void fs_exec_shutdown(struct fs_executor *x);

/* Run P's plan from now on; the executor takes P (on success and failure: P is emptied).
 * FS_ERR_INVALID when P has no valid plan for its allocations. */
int fs_exec_install(struct fs_executor *x, struct fs_profile *p);

/* OFFLOAD_MODE, in the order of its values in the configuration table:
 *   PREFETCH   the plan's moves remap each allocation's VA between device and host memory;
 *   HOST_READ  fs_plan_host_read turns each plan into one that keeps what fits resident and
 *              leaves the rest in host memory, read in place by its kernels (never prefetched
 *              nor faulted in);
 *   REDIRECT   the plan's moves make and end device copies of allocations whose VAs stay mapped
 *              to host memory, and launches are redirected to the copies (FS_PLAN_STAGED).
 * Set before the first fs_exec_install. */
enum fs_offload_mode { FS_OFFLOAD_PREFETCH, FS_OFFLOAD_HOST_READ, FS_OFFLOAD_REDIRECT };
/* LATE_IN_PLACE (redirect mode only): a launch that finds a staged allocation's prefetch not begun
 * yet (still queued, or held back for room) reads the allocation from host memory instead of
 * waiting, and that prefetch is dropped; a prefetch already begun is waited for as always. */
void fs_exec_set_offload_mode(struct fs_executor *x, enum fs_offload_mode mode,
                              bool late_in_place);

/* Stop following the plan (moves already queued are dropped); the program runs reactively. */
void fs_exec_stop(struct fs_executor *x);

static inline bool fs_exec_running(const struct fs_executor *x)
{
    return __atomic_load_n(&x->running, __ATOMIC_ACQUIRE) != 0;
}

/* A plan runs that moves nothing (fs_plan_moves_nothing: every allocation of its profile stays
 * resident, is read in place from host memory, or is never used in the iteration, and those not
 * read in place fit the budget all together): following the program does nothing then. */
static inline bool fs_exec_moves_nothing(const struct fs_executor *x)
{
    return fs_exec_running(x) && __atomic_load_n(&x->moves_nothing, __ATOMIC_RELAXED);
}

/* A managed allocation of SIZE bytes with order ID was made. FS_ERR_NOT_FOUND when the profile
 * has another size for that order: the executor stops and forgets the plan's roles (residency.h),
 * and *WHY (optional) points to a line saying which allocation differed. */
int fs_exec_note_alloc(struct fs_executor *x, uint64_t id, uint64_t size, const char **why);

/* Launch T, scanned and not yet holding its references: follow the program, queue the
 * prefetches planned here, count late and unplanned references. Sets T->pos
 * (-1 where no eviction follows the launch, so that its exit takes no lock). */
void fs_exec_launch_enter(struct fs_executor *x, struct fs_launch_ticket *t);
/* After launch T was queued (or refused): queue the evictions planned after it. */
void fs_exec_launch_exit(struct fs_executor *x, const struct fs_launch_ticket *t);

/* True once after the executor gave up following a program that left its plan for good (the
 * plan's roles are then forgotten). */
bool fs_exec_take_give_up(struct fs_executor *x);

/* Wait until the mover has done every move queued so far (tests, shutdown). */
void fs_exec_drain(struct fs_executor *x);

/* Times the program reached the iteration's first launch under a plan (ITERATIONS). */
uint64_t fs_exec_iterations(struct fs_executor *x);
void fs_exec_get_stats(struct fs_executor *x, struct fs_exec_stats *out);

#endif

/* Strategies: pure planning code. A strategy reads a profile (one iteration's launches, their
 * durations and references, the allocations, the link model) and a budget, and writes a plan:
 * which allocations stay resident and, for each offloaded one, where its prefetch starts and
 * after which launch it may be evicted. No CUDA calls, no globals: every function here runs on a
 * machine without a GPU and is tested on synthetic profiles.
 *
 * Adding a strategy is one file (strategies/<name>.c defining a const struct fs_strategy) and one
 * line in the table in strategies/strategy.c. */
#ifndef FS_STRATEGY_H
#define FS_STRATEGY_H

#include "profile.h"

struct fs_strategy {
    const char *name;
    const char *summary;
    /* Fill OUT (entries allocated by the strategy, freed with fs_plan_free) for BUDGET bytes.
     * (OUT's previous content is overwritten, not freed; on any failure OUT is left empty.)
     * Returns FS_OK, or FS_ERR_NOMEM when even the allocations one launch needs together exceed
     * the budget (no plan can keep them all on the device; the engine then runs such launches
     * from host memory), FS_ERR_INVALID for a malformed profile. */
    int (*plan)(const struct fs_profile *p, uint64_t budget, struct fs_plan *out);
};

/* The strategies by name ("adaptive" first: the default). NULL-terminated. */
extern const struct fs_strategy *const fs_strategies[];
const struct fs_strategy *fs_strategy_find(const char *name);

/* The timeline model every strategy and `flexshim-profile simulate` share: compute runs the
 * launches in order (each waits for the prefetches of the offloaded allocations it references);
 * prefetches run in order on one host-to-device link, each starting no earlier than its issue
 * point and than the moment the device memory it needs is free (evictions after the planned
 * launches complete). Writes predicted_us, predicted_stall_us and peak_bytes into PLAN.
 * Returns FS_ERR_INVALID if the plan does not cover every use or exceeds its budget at some
 * launch. */
int fs_plan_evaluate(const struct fs_profile *p, struct fs_plan *plan);

/* This build's planning code: a hash of strategies/ and core/profile.h taken at build time. Every
 * evaluation stamps it into the plan (plan.planner), so a run can tell a saved plan that an older
 * flexshim made, and plan again. */
const char *fs_planner_id(void);

/* One interval of the iteration the model measures (its second), for fs_plan_evaluate_trace.
 * Times are microseconds from the iteration's start (the end of the previous iteration's last
 * launch): the launches lie within [0, predicted_us]; a transfer may end after predicted_us (it
 * overlaps the next iteration, as the previous iteration's tail overlaps this one's start). */
enum fs_tl_lane {
    FS_TL_COMPUTE,
    FS_TL_H2D,
    FS_TL_D2H,
    FS_TL_WAIT, /* only in a replay (core/replay.h): the program's thread held in the launch hook */
};

struct fs_tl_event {
    enum fs_tl_lane lane;
    int launch;      /* compute: the launch; H2D: the launch whose queueing issues the prefetch
                      * (prefetch_at); D2H: the launch after which it is written back
                      * (evict_after); wait: the launch being queued; -1 where a replay does
                      * not know it (its transfers) */
    int alloc;       /* H2D, D2H: the allocation moved; compute: the offloaded allocation whose
                      * prefetch it waited for (the latest ready), or -1 */
    uint64_t bytes;  /* H2D, D2H: mapped bytes moved; compute: 0 */
    double start_us, end_us;
    double wait_us;  /* compute: how long it waited for that prefetch (its stall); else 0 */
    bool fault_in;   /* H2D in a replay: queued by the program's thread (a fault-in), not by
                      * the plan's mover */
    bool in_place;   /* H2D: launch LAUNCH reading its allocations that the plan reads in place
                      * (ALLOC: the first of them; BYTES: what it reads at most), not a copy */
};

typedef void (*fs_tl_sink)(const struct fs_tl_event *ev, void *arg);

/* fs_plan_evaluate with the same results and return value; in addition, when the plan is valid,
 * SINK (optional) is called with ARG once per launch, prefetch and write-back of the measured
 * iteration, in the order the model queues them (each lane's events in time order). */
int fs_plan_evaluate_trace(const struct fs_profile *p, struct fs_plan *plan, fs_tl_sink sink,
                           void *arg);

/* The iteration with every allocation resident under the same model: kernels in queue order,
 * each no earlier than the program's host time (host_us) lets it be queued. The sum of the
 * kernel times when no host time was measured. */
double fs_profile_resident_us(const struct fs_profile *p);

/* Transfer time in microseconds of BYTES host-to-device under the profile's link model. */
double fs_bw_h2d_us(const struct fs_bw_model *bw, uint64_t bytes);
/* The same for device-to-host (write-back of an evicted allocation). A model with no fitted
 * bandwidth (bytes_per_us 0) uses the measured PCIe Gen5 figures: 55000 bytes/us, 10 us. */
double fs_bw_d2h_us(const struct fs_bw_model *bw, uint64_t bytes);

/* The strategies of the table, for callers that want one directly (tests, `global`). */
extern const struct fs_strategy fs_strategy_adaptive;
extern const struct fs_strategy fs_strategy_knapsack;
extern const struct fs_strategy fs_strategy_greedy;
extern const struct fs_strategy fs_strategy_global;

#endif

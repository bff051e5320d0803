/* Internals shared by the strategies (not part of the strategy contract in strategy.h): profile
 * checks, plan helpers, the timeline model with per-allocation stall attribution, and the window
 * scheduler that turns a resident set into a plan. */
#ifndef FS_SCHEDULE_H
#define FS_SCHEDULE_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "strategy.h"

/* Lookahead without limit for fs_schedule. */
#define FS_SCHED_UNLIMITED INT_MAX

/* FS_OK when P is well formed: counts >= 0, arrays present, every launch's references inside
 * refs[] and naming existing allocations, first_use/last_use in range (both -1 or
 * 0 <= first_use <= last_use < nlaunches), every reference of launch I to allocation A with
 * first_use <= I <= last_use, durations finite and >= 0. Else FS_ERR_INVALID. */
int fs_profile_check(const struct fs_profile *p);

/* fs_plan_evaluate, and when STALL_BY_ALLOC (nallocs doubles) is given, the stall of the
 * measured iteration charged to the allocation whose late prefetch held each launch back. */
int fs_plan_evaluate_ex(const struct fs_profile *p, struct fs_plan *plan, double *stall_by_alloc);

/* Zeroes OUT, names it, sets budget and nallocs and allocates zeroed entries. FS_ERR_NOMEM if
 * the allocation fails (OUT stays empty). */
int fs_plan_begin(struct fs_plan *out, const char *name, uint64_t budget, int nallocs);

/* Every strategy's first step: OUT is emptied whatever happens; FS_ERR_INVALID for a NULL OUT
 * or a malformed profile. */
int fs_plan_open(const struct fs_profile *p, struct fs_plan *out);
/* Deep copy of SRC into DST (DST's previous content is not freed). */
int fs_plan_copy(struct fs_plan *dst, const struct fs_plan *src);

/* Bytes that offloading the allocations not in RESIDENT (and keeping those in it) needs at least:
 * resident bytes + the most bytes of offloaded allocations whose use range [first_use, last_use]
 * spans one launch. */
uint64_t fs_schedule_need(const struct fs_profile *p, const bool *resident);

/* Writes ENTRIES (nallocs) for the resident set RESIDENT under BUDGET:
 *   - resident: {true, -1, -1}; offloaded and never used: {false, -1, -1};
 *   - offloaded and used: evict_after = last_use; the window first holds [first_use, last_use]
 *     (every allocation's at once; if that alone exceeds the budget at some launch the set is
 *     infeasible: FS_ERR_NOMEM); then each window grows backwards from first_use, cyclically
 *     into the previous iteration, launch by launch while the bytes held at that launch plus
 *     its own stay within the budget, by at most LOOKAHEAD launches and never over its own
 *     previous last use (a window stays within one cycle); prefetch_at is where it stops.
 *     Windows grow in rounds (to 1, 2, 4, ... launches before first_use; within a round in
 *     order of first_use, then index), so the memory left is shared between the prefetches
 *     rather than taken by whichever comes first; a window that meets a full launch stops.
 * NEED (optional) receives fs_schedule_need. FS_ERR_INVALID for a malformed profile. */
int fs_schedule(const struct fs_profile *p, uint64_t budget, const bool *resident, int lookahead,
                struct fs_plan_entry *entries, uint64_t *need);

/* An allocation ranked by KEY, for qsort with fs_ranked_desc: key descending, then allocation
 * ascending (deterministic plans). */
struct fs_ranked {
    double key;
    int alloc;
};
int fs_ranked_desc(const void *x, const void *y);

/* PLAN for host reading (OFFLOAD_MODE=host_read): what it keeps resident stays so; then, while
 * the budget allows, the offloaded allocations with the most referencing launches per byte
 * become resident too (no room is needed for prefetches); every other one gets no window
 * ({false, -1, -1}): it stays in host memory and its kernels read it over the link. The
 * prediction is left as it was (the timeline model would charge those reads as reads in place)
 * and peak_bytes is the resident bytes. FS_ERR_NOMEM, FS_ERR_INVALID. */
int fs_plan_host_read(const struct fs_profile *p, struct fs_plan *plan);

/* Convenience for strategies: schedule RESIDENT into PLAN (already begun) with LOOKAHEAD and
 * evaluate it; then the same with the sparse offloaded allocations read in place (64 MiB or more,
 * their launches unable to read three quarters of them), kept when the model predicts less.
 * NEED (optional) receives fs_schedule_need of the windowed schedule. FS_OK, FS_ERR_NOMEM
 * (infeasible even with every offloaded allocation windowed), FS_ERR_INVALID. */
int fs_schedule_plan(const struct fs_profile *p, const bool *resident, int lookahead,
                     struct fs_plan *plan, uint64_t *need);

/* Does the cyclic window [PF, EV] of a plan entry contain the launches [F, L] as one piece? */
bool fs_window_covers(int pf, int ev, int f, int l);

/* Of BYTES that a launch of DURATION_US references in place, what it can read at most: the
 * profile's read_bytes_per_us bound, or all of them when that was not measured or the launch was
 * not timed. */
double fs_read_in_place_bytes(const struct fs_profile *p, double duration_us, double bytes);

/* Does allocation A appear in some launch? */
static inline bool fs_alloc_used(const struct fs_profile *p, int a)
{
    return p->allocs[a].first_use >= 0;
}

/* Does PLAN read allocation A in place: offloaded, used by the iteration, no window? */
static inline bool fs_reads_in_place(const struct fs_profile *p, const struct fs_plan *plan, int a)
{
    const struct fs_plan_entry *e = &plan->entries[a];
    return !e->resident && e->prefetch_at < 0 && fs_alloc_used(p, a);
}

/* ---- strategy internals (tests and the composite strategies use them) -------------------- */

/* Does PLAN (one entry per allocation of P) move nothing: each allocation kept resident, read in
 * place or never used, and all but those read in place fit its budget together? Launch tracking
 * then pauses (engine.c). */
bool fs_plan_moves_nothing(const struct fs_profile *p, const struct fs_plan *plan);

/* What watching one launch costs the program (CUPTI with a counting callback on a tiny launch,
 * docs/PERFORMANCE.md): a plan that moves something has every launch watched, one that moves
 * nothing none. */
#define FS_WATCH_US_PER_LAUNCH 0.46

/* PLAN's predicted step with the watch's cost when it moves something: what adaptive compares,
 * so that of two plans the timeline ties, the one that lets tracking pause wins. */
double fs_plan_cost_us(const struct fs_profile *p, const struct fs_plan *plan);

/* Is plan A better than plan B: less predicted time, then fewer offloaded bytes? */
bool fs_plan_better(const struct fs_profile *p, const struct fs_plan *a, const struct fs_plan *b);

/* Bytes of the allocations that plan PLAN offloads and some launch uses. */
uint64_t fs_plan_offloaded_bytes(const struct fs_profile *p, const struct fs_plan *plan);
/* Of them, the bytes the plan moves every iteration (those it reads in place left out). */
uint64_t fs_plan_moved_bytes(const struct fs_profile *p, const struct fs_plan *plan);

/* The knapsack objective: weight unit (max(2 MiB, total used bytes / 4096), rounded up), an item's
 * weight in units (its mapped bytes rounded up), and its value: the stall in microseconds its
 * offloading would cost, max(0, h2d(mapped) - compute time of the launches between its last use
 * and its first use, cyclically), plus FS_KNAPSACK_EPS_US_PER_BYTE * mapped so that, all else
 * equal, more bytes stay resident. */
#define FS_KNAPSACK_EPS_US_PER_BYTE 1e-9
uint64_t fs_knapsack_bucket(const struct fs_profile *p);
uint32_t fs_knapsack_weight(uint64_t mapped, uint64_t bucket);
double fs_knapsack_value(const struct fs_profile *p, int a);
/* Every allocation's value at once into V (nallocs); 0 for unused ones. */
int fs_knapsack_values(const struct fs_profile *p, double *v);

/* 0/1 knapsack by dynamic programming: the best total value of N items (weights W, values V)
 * with total weight <= CAP. TAKE (n, optional) receives the chosen items; BEST the value.
 * FS_ERR_NOMEM if the table cannot be allocated. */
int fs_knapsack_solve(int n, const uint32_t *w, const double *v, uint32_t cap, bool *take,
                      double *best);

/* The knapsack strategy; *CAP_UNITS (optional) receives the capacity, in weight units, whose
 * optimal set the plan keeps resident, or -1 when no knapsack was solved (everything fits) or
 * greedy's answer was used. */
int fs_knapsack_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out,
                     long *cap_units);

/* The global strategy's local search from START (a valid plan for BUDGET) into OUT. */
int fs_global_improve(const struct fs_profile *p, uint64_t budget, const struct fs_plan *start,
                      struct fs_plan *out);

#endif

/* The timeline model: what a plan costs in device memory and in time. Shared by every strategy
 * and by `flexshim-profile simulate`.
 *
 * What a plan means
 * -----------------
 * One iteration is the launches 0 .. N-1 of the profile; it repeats. A resident allocation holds
 * its `mapped` bytes on the device all the time. An offloaded allocation that some launch uses
 * holds them during its window, the cyclic launch interval [prefetch_at, evict_after]:
 *   - prefetch_at <= evict_after: launches prefetch_at .. evict_after;
 *   - prefetch_at >  evict_after: it wraps, prefetch_at .. N-1 and then 0 .. evict_after of the
 *     next iteration (the prefetch is issued in the previous iteration).
 * The window must contain the use range [first_use, last_use] as one piece (so every launch that
 * references the allocation finds it on the device). A window has 1 .. N launches; one of N
 * launches evicts after evict_after and prefetches again before the next launch. An offloaded
 * allocation no launch uses (first_use == -1) has prefetch_at = evict_after = -1 and holds
 * nothing. `resident` entries ignore prefetch_at and evict_after.
 *
 * An offloaded allocation that some launch uses, with prefetch_at = evict_after = -1, is read in
 * place (fs_reads_in_place): it holds no device memory and is never moved; each launch that
 * references it reads over the link what it can read in its duration (fs_read_in_place_bytes).
 *
 * Memory: the bytes held during launch i are the resident bytes plus the offloaded allocations
 * whose window contains i; peak_bytes is their maximum over i (the resident bytes when N = 0).
 * The plan is invalid (FS_ERR_INVALID) if peak_bytes > budget, if a window does not contain its
 * use range, if an index is out of range, or if the profile itself is malformed.
 *
 * Time: the model simulates two consecutive iterations on three resources, each FIFO:
 *   compute: launch i starts at max(end of launch i-1, the moment the program queues it, ready
 *            time of every offloaded allocation it references). Streams are not modelled:
 *            launches run one after another in queue order. Its reads in place (at most what
 *            the read bound lets it read in its duration, all its in-place allocations
 *            together) share the H2D link from its start: it takes at least their transfer
 *            time, and the link is busy that much longer (drawn from the launch's start, beside
 *            any copy in flight).
 *   the program: it queues launch i once its host time before it (host_us, when the profile
 *            measured it) has passed since it queued launch i-1, counted from the iteration's
 *            start (a program that waits for each iteration's result, as a decode loop does);
 *            and, as the engine's launch hook makes it, not before the prefetch of every
 *            offloaded allocation launch i references has begun: the host time of the launches
 *            after such a wait comes after it.
 *   H2D link (prefetches): the prefetch of a window starting at p begins (is issued) when the
 *            program is about to queue launch p and the memory it moves into is free: every
 *            eviction after launches up to p-1 (in this iteration or, wrapping, the previous
 *            one) has freed its memory. The copy starts at max(that, H2D link free) and takes
 *            fs_bw_h2d_us(mapped); its end is the allocation's ready time.
 *            Prefetches issued at the same launch queue in order of their next use (cyclic
 *            distance from p to first_use), then allocation index.
 *   D2H link (write-backs): when launch evict_after ends, an allocation the iteration changes
 *            is copied back to the host: it starts at max(that end, D2H link free), takes
 *            fs_bw_d2h_us(mapped), and its device memory is free when it ends. Write-backs after
 *            the same launch queue in allocation order. An allocation profiling found unchanged
 *            (fs_prof_alloc.unchanged) needs none, as the engine's fingerprint check will show:
 *            its memory is free the link model's handover_us after launch evict_after ends:
 *            the engine hands its block over to the next copy (a write-back's own time, which
 *            the model charges, covers that).
 * Because a prefetch begins only after every earlier eviction has freed its memory, the bytes
 * physically held at any moment never exceed peak_bytes.
 * Iteration 0 starts at time 0 with empty links, the resident allocations present and the
 * offloaded ones whose window wraps present and ready (their prefetch belonged to iteration -1);
 * every other offloaded allocation is fetched by its own prefetch. predicted_us is the duration of
 * iteration 1: the end of its last launch minus the end of iteration 0's last launch, so the
 * prefetches iteration 0 issues for iteration 1 and its write-backs are accounted for.
 * predicted_stall_us = predicted_us - fs_profile_resident_us (the iteration with everything
 * resident: kernels and the program's host time): the time compute waits for transfers.
 * The stall of iteration 1 at launch i (its start minus the end of launch i-1) is charged to the
 * referenced allocation with the latest ready time, and the time its reads in place add to it to
 * the first allocation read in place (fs_plan_evaluate_ex). fs_plan_evaluate_trace
 * reports iteration 1's launches, prefetches and write-backs as intervals (what
 * `flexshim-profile trace` draws). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

#ifndef FS_PLANNER_ID
#error "FS_PLANNER_ID: the Makefile defines it (a hash of the planning sources)"
#endif

const char *fs_planner_id(void)
{
    return FS_PLANNER_ID;
}

int fs_profile_check(const struct fs_profile *p)
{
    if (!p || p->nallocs < 0 || p->nlaunches < 0 || p->nrefs < 0)
        return FS_ERR_INVALID;
    if ((p->nallocs > 0 && !p->allocs) || (p->nlaunches > 0 && !p->launches) ||
        (p->nrefs > 0 && !p->refs))
        return FS_ERR_INVALID;
    int n = p->nlaunches;
    for (int a = 0; a < p->nallocs; a++) {
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (al->first_use == -1 && al->last_use == -1)
            continue;
        if (al->first_use < 0 || al->last_use < al->first_use || al->last_use >= n)
            return FS_ERR_INVALID;
    }
    for (int i = 0; i < n; i++) {
        const struct fs_prof_launch *l = &p->launches[i];
        if (!(l->duration_us >= 0.0) || !isfinite(l->duration_us))
            return FS_ERR_INVALID;
        if (l->nrefs < 0 || l->ref_start < 0 || l->ref_start > p->nrefs ||
            l->nrefs > p->nrefs - l->ref_start)
            return FS_ERR_INVALID;
        for (int r = l->ref_start; r < l->ref_start + l->nrefs; r++) {
            int a = p->refs[r];
            if (a < 0 || a >= p->nallocs)
                return FS_ERR_INVALID;
            if (i < p->allocs[a].first_use || i > p->allocs[a].last_use)
                return FS_ERR_INVALID;
        }
    }
    return FS_OK;
}

bool fs_window_covers(int pf, int ev, int f, int l)
{
    if (pf <= ev)
        return pf <= f && l <= ev;
    return l <= ev || f >= pf;
}

struct pf_item {
    int alloc;
    int at;   /* prefetch_at */
    int dist; /* launches from prefetch_at to first_use, cyclic */
};

static int pf_item_cmp(const void *x, const void *y)
{
    const struct pf_item *a = x, *b = y;
    if (a->at != b->at)
        return a->at < b->at ? -1 : 1;
    if (a->dist != b->dist)
        return a->dist < b->dist ? -1 : 1;
    return (a->alloc > b->alloc) - (a->alloc < b->alloc);
}

static double max2(double a, double b)
{
    return a > b ? a : b;
}

/* The model itself: fs_plan_evaluate, plus the stall attribution of fs_plan_evaluate_ex and the
 * measured iteration's intervals of fs_plan_evaluate_trace. STALL_BY_ALLOC and SINK are
 * optional and change nothing in the results. */
static int evaluate(const struct fs_profile *p, struct fs_plan *plan, double *stall_by_alloc,
                    fs_tl_sink sink, void *sink_arg)
{
    int rc = fs_profile_check(p);
    if (rc != FS_OK)
        return rc;
    if (!plan || plan->nallocs != p->nallocs || (p->nallocs > 0 && !plan->entries))
        return FS_ERR_INVALID;

    const int n = p->nlaunches, na = p->nallocs;
    int64_t *diff = NULL;
    struct pf_item *pf = NULL;
    int *pf_start = NULL, *ev_start = NULL, *ev_list = NULL;
    double *ready = NULL, *begun = NULL;
    uint64_t base = 0;
    int npf = 0;

    diff = calloc((size_t)n + 1, sizeof(*diff));
    pf = calloc((size_t)na + 1, sizeof(*pf));
    pf_start = calloc((size_t)n + 2, sizeof(*pf_start));
    ev_start = calloc((size_t)n + 2, sizeof(*ev_start));
    ev_list = calloc((size_t)na + 1, sizeof(*ev_list));
    ready = calloc((size_t)na + 1, sizeof(*ready));
    begun = calloc((size_t)na + 1, sizeof(*begun));
    if (!diff || !pf || !pf_start || !ev_start || !ev_list || !ready || !begun) {
        rc = FS_ERR_NOMEM;
        goto out;
    }

    /* Check every entry and add up the bytes held per launch. */
    for (int a = 0; a < na; a++) {
        const struct fs_plan_entry *e = &plan->entries[a];
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (e->resident) {
            base += al->mapped;
            continue;
        }
        if (al->first_use < 0) {
            if (e->prefetch_at != -1 || e->evict_after != -1) {
                rc = FS_ERR_INVALID;
                goto out;
            }
            continue;
        }
        int pa = e->prefetch_at, ev = e->evict_after;
        if (pa == -1 && ev == -1)
            continue; /* read in place: holds no device memory */
        if (pa < 0 || pa >= n || ev < 0 || ev >= n ||
            !fs_window_covers(pa, ev, al->first_use, al->last_use)) {
            rc = FS_ERR_INVALID;
            goto out;
        }
        int64_t m = (int64_t)al->mapped;
        if (pa <= ev) {
            diff[pa] += m;
            diff[ev + 1] -= m;
        } else {
            diff[pa] += m;
            diff[0] += m;
            diff[ev + 1] -= m;
        }
        pf[npf].alloc = a;
        pf[npf].at = pa;
        pf[npf].dist = (al->first_use - pa + n) % n;
        npf++;
        ev_start[ev + 1]++;
    }
    int64_t held = 0, most = 0;
    for (int i = 0; i < n; i++) {
        held += diff[i];
        if (held > most)
            most = held;
    }
    uint64_t peak = base + (uint64_t)most;
    /* Intervals are reported only for a valid plan. */
    const bool emit = sink && peak <= plan->budget;

    /* Prefetches by issue launch, in queue order; write-backs by launch, in allocation order. */
    qsort(pf, (size_t)npf, sizeof(*pf), pf_item_cmp);
    for (int k = 0; k < npf; k++)
        pf_start[pf[k].at + 1]++;
    for (int i = 0; i < n; i++) {
        pf_start[i + 1] += pf_start[i];
        ev_start[i + 1] += ev_start[i];
    }
    /* Fill the write-back lists: walk allocations in index order (the per-launch byte counts
     * are done with, so the cursor reuses diff's storage). */
    {
        int64_t *cursor = diff;
        for (int i = 0; i < n; i++)
            cursor[i] = ev_start[i];
        for (int a = 0; a < na; a++) {
            const struct fs_plan_entry *e = &plan->entries[a];
            if (!e->resident && fs_alloc_used(p, a) && !fs_reads_in_place(p, plan, a))
                ev_list[cursor[e->evict_after]++] = a;
        }
    }

    /* Two iterations. Wrapped windows start present (ready 0); the others are fetched by their
     * own prefetch in iteration 0 before their first use. */
    if (stall_by_alloc)
        for (int a = 0; a < na; a++)
            stall_by_alloc[a] = 0.0;
    double t = 0.0, h2d_free = 0.0, d2h_free = 0.0, room_free = 0.0, iter0_end = 0.0;
    for (int iter = 0; iter < 2; iter++) {
        const bool report = emit && iter == 1;
        double issue = t; /* the program's host time: it queues launch i no earlier than this */
        for (int i = 0; i < n; i++) {
            const struct fs_prof_launch *l = &p->launches[i];
            issue += l->host_us;
            for (int k = pf_start[i]; k < pf_start[i + 1]; k++) {
                int a = pf[k].alloc;
                begun[a] = max2(issue, room_free);
                double s = max2(begun[a], h2d_free);
                h2d_free = s + fs_bw_h2d_us(&p->bw, p->allocs[a].mapped);
                ready[a] = h2d_free;
                if (report)
                    sink(&(struct fs_tl_event){.lane = FS_TL_H2D, .launch = i, .alloc = a,
                                               .bytes = p->allocs[a].mapped,
                                               .start_us = s - iter0_end,
                                               .end_us = h2d_free - iter0_end},
                         sink_arg);
            }
            /* The program's thread waits in the launch hook until the prefetches of the
             * allocations this launch references have begun (each begins before it is ready,
             * so the launch's start is unchanged by it), and its later host time comes after. */
            double queued = max2(t, issue), start = queued, in_place = 0.0;
            int culprit = -1, first_in_place = -1;
            for (int r = l->ref_start; r < l->ref_start + l->nrefs; r++) {
                int a = p->refs[r];
                if (plan->entries[a].resident)
                    continue;
                if (fs_reads_in_place(p, plan, a)) {
                    in_place += (double)p->allocs[a].mapped;
                    if (first_in_place < 0)
                        first_in_place = a;
                    continue;
                }
                issue = max2(issue, begun[a]);
                if (ready[a] > start) {
                    start = ready[a];
                    culprit = a;
                }
            }
            /* Reads in place cross the link: the launch takes at least their transfer time,
             * and the copies after them wait that much longer. */
            double dur = l->duration_us;
            if (in_place > 0.0) {
                /* what the kernel can read in its duration, all its in-place allocations together */
                in_place = fs_read_in_place_bytes(p, l->duration_us, in_place);
                uint64_t bytes = in_place < 0x1p63 ? (uint64_t)in_place : UINT64_C(1) << 63;
                double link = fs_bw_h2d_us(&p->bw, bytes);
                if (report)
                    sink(&(struct fs_tl_event){.lane = FS_TL_H2D, .launch = i,
                                               .alloc = first_in_place, .in_place = true,
                                               .bytes = bytes,
                                               .start_us = start - iter0_end,
                                               .end_us = start + link - iter0_end},
                         sink_arg);
                h2d_free = max2(h2d_free, start) + link;
                dur = max2(dur, link);
                if (iter == 1 && stall_by_alloc)
                    stall_by_alloc[first_in_place] += dur - l->duration_us;
            }
            if (iter == 1 && stall_by_alloc && culprit >= 0)
                stall_by_alloc[culprit] += start - queued;
            if (report)
                sink(&(struct fs_tl_event){.lane = FS_TL_COMPUTE, .launch = i, .alloc = culprit,
                                           .start_us = start - iter0_end,
                                           .end_us = start + dur - iter0_end,
                                           .wait_us = start - queued},
                     sink_arg);
            t = start + dur;
            for (int k = ev_start[i]; k < ev_start[i + 1]; k++) {
                int a = ev_list[k];
                if (p->allocs[a].unchanged) { /* no write-back */
                    room_free = max2(room_free, t + p->bw.handover_us);
                    continue;
                }
                double s = max2(t, d2h_free);
                d2h_free = s + fs_bw_d2h_us(&p->bw, p->allocs[a].mapped);
                room_free = max2(room_free, d2h_free);
                if (report)
                    sink(&(struct fs_tl_event){.lane = FS_TL_D2H, .launch = i, .alloc = a,
                                               .bytes = p->allocs[a].mapped,
                                               .start_us = s - iter0_end,
                                               .end_us = d2h_free - iter0_end},
                         sink_arg);
            }
        }
        if (iter == 0)
            iter0_end = t;
    }

    plan->peak_bytes = peak;
    plan->predicted_us = t - iter0_end;
    snprintf(plan->planner, sizeof(plan->planner), "%s", fs_planner_id());
    plan->predicted_stall_us = max2(0.0, plan->predicted_us - fs_profile_resident_us(p));
    rc = peak > plan->budget ? FS_ERR_INVALID : FS_OK;
out:
    free(diff);
    free(pf);
    free(pf_start);
    free(ev_start);
    free(ev_list);
    free(ready);
    free(begun);
    return rc;
}

double fs_read_in_place_bytes(const struct fs_profile *p, double duration_us, double bytes)
{
    /* no bound measured, or no duration (not timed): it may read all of them */
    if (!(p->bw.read_bytes_per_us > 0.0) || !(duration_us > 0.0))
        return bytes;
    double bound = duration_us * p->bw.read_bytes_per_us;
    return bound < bytes ? bound : bytes;
}

double fs_profile_resident_us(const struct fs_profile *p)
{
    double t = 0.0, issue = 0.0;
    for (int i = 0; i < p->nlaunches; i++) {
        issue += p->launches[i].host_us;
        t = max2(t, issue) + p->launches[i].duration_us;
    }
    return t;
}

int fs_plan_evaluate_ex(const struct fs_profile *p, struct fs_plan *plan, double *stall_by_alloc)
{
    return evaluate(p, plan, stall_by_alloc, NULL, NULL);
}

int fs_plan_evaluate(const struct fs_profile *p, struct fs_plan *plan)
{
    return evaluate(p, plan, NULL, NULL, NULL);
}

int fs_plan_evaluate_trace(const struct fs_profile *p, struct fs_plan *plan, fs_tl_sink sink,
                           void *arg)
{
    return evaluate(p, plan, NULL, sink, arg);
}

/* greedy: offload the largest allocations first, as few as it takes for the plan to fit the
 * budget; everything stays resident when it all fits. Prefetches then go as early as the memory
 * left allows (fs_schedule). */
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

static void set_prefix(bool *resident, const struct fs_ranked *order, int nused, int k)
{
    for (int i = 0; i < nused; i++)
        resident[order[i].alloc] = i >= k;
}

static int greedy_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out)
{
    bool *resident = NULL;
    struct fs_ranked *order = NULL;
    int rc = fs_plan_open(p, out);
    if (rc != FS_OK)
        return rc;
    rc = fs_plan_begin(out, "greedy", budget, p->nallocs);
    if (rc != FS_OK)
        return rc;
    resident = calloc((size_t)p->nallocs + 1, sizeof(*resident));
    order = calloc((size_t)p->nallocs + 1, sizeof(*order));
    if (!resident || !order) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    /* Even offloading everything does not fit: no plan. */
    if (fs_schedule_need(p, resident) > budget) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    int nused = 0;
    for (int a = 0; a < p->nallocs; a++)
        if (fs_alloc_used(p, a))
            order[nused++] = (struct fs_ranked){(double)p->allocs[a].mapped, a};
    qsort(order, (size_t)nused, sizeof(*order), fs_ranked_desc);

    /* The bytes needed only fall as more is offloaded: binary search the fewest. */
    int lo = 0, hi = nused; /* hi fits */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        set_prefix(resident, order, nused, mid);
        if (fs_schedule_need(p, resident) <= budget)
            hi = mid;
        else
            lo = mid + 1;
    }
    set_prefix(resident, order, nused, hi);
    rc = fs_schedule_plan(p, resident, FS_SCHED_UNLIMITED, out, NULL);
out:
    free(resident);
    free(order);
    if (rc != FS_OK)
        fs_plan_free(out);
    return rc;
}

const struct fs_strategy fs_strategy_greedy = {
    .name = "greedy",
    .summary = "offload the largest allocations first until the plan fits the budget",
    .plan = greedy_plan,
};

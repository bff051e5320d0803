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

/* V's low BITS bits in reverse order. */
static unsigned reverse_bits(unsigned v, int bits)
{
    unsigned r = 0;
    for (int b = 0; b < bits; b++, v >>= 1)
        r = (r << 1) | (v & 1u);
    return r;
}

/* Allocations of one size are alike in bytes but not in where the program uses them: a run of
 * them taken in allocation order (a model's first layers) leaves the link idle while the
 * program runs the layers kept resident after them. So within each run of equal sizes the
 * order becomes the bit-reversed order of first use: every prefix of it is spread over the
 * iteration. (ORDER is sorted by size; its keys are scratch here and restored.) */
static void spread_ties(const struct fs_profile *p, struct fs_ranked *order, int n)
{
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && order[j].key == order[i].key)
            j++;
        double size = order[i].key;
        int m = j - i, bits = 0;
        while ((1 << bits) < m)
            bits++;
        /* by first use (then allocation), ... */
        for (int k = i; k < j; k++)
            order[k].key = -(double)p->allocs[order[k].alloc].first_use;
        qsort(order + i, (size_t)m, sizeof(*order), fs_ranked_desc);
        /* ... then by the bit-reversed rank in that order */
        for (int k = i; k < j; k++)
            order[k].key = -(double)reverse_bits((unsigned)(k - i), bits);
        qsort(order + i, (size_t)m, sizeof(*order), fs_ranked_desc);
        for (int k = i; k < j; k++)
            order[k].key = size;
        i = j;
    }
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
    spread_ties(p, order, nused);

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

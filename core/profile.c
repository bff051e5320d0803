/* Releasing profiles and plans, and what is read off a profile in several places. (Saving and
 * loading live in core/profile_io.c.) */
#include <stdlib.h>
#include <string.h>

#include "profile.h"

void fs_plan_free(struct fs_plan *plan)
{
    if (!plan)
        return;
    free(plan->entries);
    memset(plan, 0, sizeof(*plan));
}

void fs_profile_count_uses(const struct fs_profile *p, uint64_t *uses)
{
    for (int l = 0; l < p->nlaunches; l++)
        for (int r = 0; r < p->launches[l].nrefs; r++)
            uses[p->refs[p->launches[l].ref_start + r]]++;
}

uint64_t fs_profile_total_mapped(const struct fs_profile *p)
{
    uint64_t t = 0;
    for (int a = 0; a < p->nallocs; a++)
        t += p->allocs[a].mapped;
    return t;
}

void fs_profile_free(struct fs_profile *p)
{
    if (!p)
        return;
    if (p->kernel_names) {
        for (int i = 0; i < p->nlaunches; i++)
            free(p->kernel_names[i]);
        free(p->kernel_names);
    }
    free(p->allocs);
    free(p->launches);
    free(p->refs);
    free(p->bw.points);
    fs_plan_free(&p->plan);
    memset(p, 0, sizeof(*p));
}

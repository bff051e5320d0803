/* adaptive (the default): runs knapsack, greedy and global and keeps the plan with the least
 * predicted time, a plan that moves something charged for watching every launch
 * (fs_plan_cost_us: one that moves nothing lets tracking pause); ties: fs_plan_better, then
 * that order. Global's local search starts from the better of the knapsack and greedy
 * plans already made, exactly as the global strategy would, so nothing is computed twice. The
 * plan is named "adaptive(<winner>)". */
#include <stdio.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

enum { AD_KNAPSACK, AD_GREEDY, AD_GLOBAL, AD_N };

static bool cheaper(const struct fs_profile *p, const struct fs_plan *a, const struct fs_plan *b)
{
    double ca = fs_plan_cost_us(p, a), cb = fs_plan_cost_us(p, b);
    return ca != cb ? ca < cb : fs_plan_better(p, a, b);
}

static int adaptive_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out)
{
    static const char *const names[AD_N] = {"knapsack", "greedy", "global"};
    struct fs_plan c[AD_N];
    int rc = fs_plan_open(p, out);
    if (rc != FS_OK)
        return rc;
    memset(c, 0, sizeof(c));
    rc = fs_strategy_knapsack.plan(p, budget, &c[AD_KNAPSACK]);
    if (rc != FS_OK)
        goto out;
    rc = fs_strategy_greedy.plan(p, budget, &c[AD_GREEDY]);
    if (rc != FS_OK)
        goto out;
    const struct fs_plan *start = fs_plan_better(p, &c[AD_GREEDY], &c[AD_KNAPSACK])
                                      ? &c[AD_GREEDY]
                                      : &c[AD_KNAPSACK];
    rc = fs_global_improve(p, budget, start, &c[AD_GLOBAL]);
    if (rc != FS_OK)
        goto out;
    int win = 0;
    for (int i = 1; i < AD_N; i++)
        if (cheaper(p, &c[i], &c[win]))
            win = i;
    *out = c[win];
    c[win].entries = NULL;
    snprintf(out->strategy, sizeof(out->strategy), "adaptive(%s)", names[win]);
out:
    for (int i = 0; i < AD_N; i++)
        fs_plan_free(&c[i]);
    return rc;
}

const struct fs_strategy fs_strategy_adaptive = {
    .name = "adaptive",
    .summary = "the best of knapsack, greedy and global by predicted time (default)",
    .plan = adaptive_plan,
};

/* knapsack: which allocations stay resident, by a true 0/1 knapsack solved with dynamic
 * programming.
 *   items:    the allocations some launch uses (with mapped bytes > 0; empty ones stay resident);
 *   weight:   mapped bytes in units of max(2 MiB, total / 4096), rounded up, so the table has at
 *             most ~4096 columns whatever the sizes;
 *   value:    the stall its offloading would cost: max(0, h2d(mapped) - the compute time between
 *             its last use and its next first use), plus a tiny per-byte epsilon so that ties
 *             keep more bytes resident;
 *   capacity: the budget less room for the offloaded allocations' windows. It starts at
 *             budget - the largest allocation the full-budget optimum offloads; while the
 *             schedule does not fit, it drops by the overflow (at least one unit), at most 64
 *             times, else greedy's plan is used. From that first capacity that fits, up to three
 *             more are tried, each leaving room for one more largest window (prefetches that
 *             overlap compute need it), and the plan with the least predicted time is kept.
 * The table is solved once for the largest capacity; its decision bits give the optimal set for
 * every smaller capacity, so each try costs O(items) plus one schedule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

#define MIB (1024ull * 1024ull)
#define KS_GRANULE (2 * MIB)
#define KS_MAX_UNITS 4096u
#define KS_TRIES 64
#define KS_EXTRA 3

uint64_t fs_knapsack_bucket(const struct fs_profile *p)
{
    uint64_t total = 0;
    for (int a = 0; a < p->nallocs; a++)
        if (fs_alloc_used(p, a))
            total += p->allocs[a].mapped;
    uint64_t b = (total + KS_MAX_UNITS - 1) / KS_MAX_UNITS;
    return b > KS_GRANULE ? b : KS_GRANULE;
}

uint32_t fs_knapsack_weight(uint64_t mapped, uint64_t bucket)
{
    uint64_t w = (mapped + bucket - 1) / bucket;
    return w > UINT32_MAX ? UINT32_MAX : (uint32_t)w;
}

/* PRE: prefix sums of the launch durations (nlaunches + 1). */
static double ks_value(const struct fs_profile *p, int a, const double *pre)
{
    const struct fs_prof_alloc *al = &p->allocs[a];
    if (al->first_use < 0)
        return 0.0;
    double gap = pre[p->nlaunches] - (pre[al->last_use + 1] - pre[al->first_use]);
    double stall = fs_bw_h2d_us(&p->bw, al->mapped) - gap;
    return (stall > 0.0 ? stall : 0.0) + FS_KNAPSACK_EPS_US_PER_BYTE * (double)al->mapped;
}

static double *duration_prefix(const struct fs_profile *p)
{
    double *pre = calloc((size_t)p->nlaunches + 1, sizeof(*pre));
    if (pre)
        for (int i = 0; i < p->nlaunches; i++)
            pre[i + 1] = pre[i] + p->launches[i].duration_us;
    return pre;
}

double fs_knapsack_value(const struct fs_profile *p, int a)
{
    double *pre = duration_prefix(p);
    if (!pre)
        return 0.0;
    double v = ks_value(p, a, pre);
    free(pre);
    return v;
}

int fs_knapsack_values(const struct fs_profile *p, double *v)
{
    double *pre = duration_prefix(p);
    if (!pre)
        return FS_ERR_NOMEM;
    for (int a = 0; a < p->nallocs; a++)
        v[a] = ks_value(p, a, pre);
    free(pre);
    return FS_OK;
}

/* The DP with its decision bits: keep[i][c] says item i is in the best set of items 0..i with
 * capacity c. */
struct ks_table {
    int n;
    uint32_t cap;
    size_t row; /* 64-bit words per item */
    uint64_t *keep;
    double best;
};

static int ks_build(struct ks_table *t, int n, const uint32_t *w, const double *v, uint32_t cap)
{
    int rc = FS_OK;
    double *dp = NULL;
    memset(t, 0, sizeof(*t));
    t->n = n;
    t->cap = cap;
    t->row = ((size_t)cap + 1 + 63) / 64;
    t->keep = calloc((size_t)n * t->row + 1, sizeof(*t->keep));
    dp = calloc((size_t)cap + 1, sizeof(*dp));
    if (!t->keep || !dp) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        uint64_t *k = t->keep + (size_t)i * t->row;
        if (w[i] > cap)
            continue;
        for (uint32_t c = cap + 1; c-- > w[i];) {
            double with = dp[c - w[i]] + v[i];
            if (with > dp[c]) {
                dp[c] = with;
                k[c / 64] |= 1ull << (c % 64);
            }
        }
    }
    t->best = dp[cap];
out:
    free(dp);
    if (rc != FS_OK) {
        free(t->keep);
        t->keep = NULL;
    }
    return rc;
}

/* The optimal set for capacity C <= t->cap into TAKE; returns its value. */
static double ks_take(const struct ks_table *t, const uint32_t *w, const double *v, uint32_t c,
                      bool *take)
{
    double val = 0.0;
    for (int i = t->n - 1; i >= 0; i--) {
        const uint64_t *k = t->keep + (size_t)i * t->row;
        take[i] = (k[c / 64] >> (c % 64)) & 1u;
        if (take[i]) {
            c -= w[i];
            val += v[i];
        }
    }
    return val;
}

int fs_knapsack_solve(int n, const uint32_t *w, const double *v, uint32_t cap, bool *take,
                      double *best)
{
    struct ks_table t;
    if (n < 0 || (n > 0 && (!w || !v)))
        return FS_ERR_INVALID;
    int rc = ks_build(&t, n, w, v, cap);
    if (rc != FS_OK)
        return rc;
    if (take)
        ks_take(&t, w, v, cap, take);
    if (best)
        *best = t.best;
    free(t.keep);
    return FS_OK;
}

struct ks_items {
    int n;
    int *alloc;
    uint32_t *w;
    double *v;
    bool *take;
};

static void set_resident(const struct fs_profile *p, const struct ks_items *it, bool *resident)
{
    for (int a = 0; a < p->nallocs; a++)
        resident[a] = fs_alloc_used(p, a) && p->allocs[a].mapped == 0;
    for (int i = 0; i < it->n; i++)
        resident[it->alloc[i]] = it->take[i];
}

/* The largest mapped size among items not taken, in units (rounded up). */
static uint32_t max_left_units(const struct ks_items *it)
{
    uint32_t m = 0;
    for (int i = 0; i < it->n; i++)
        if (!it->take[i] && it->w[i] > m)
            m = it->w[i];
    return m;
}

int fs_knapsack_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out,
                     long *cap_units)
{
    struct ks_items it = {0};
    struct ks_table t = {0};
    struct fs_plan trial = {0};
    bool *resident = NULL;
    double *pre = NULL;
    long chosen = -1;
    if (cap_units)
        *cap_units = -1;
    int rc = fs_plan_open(p, out);
    if (rc != FS_OK)
        return rc;
    rc = fs_plan_begin(out, "knapsack", budget, p->nallocs);
    if (rc != FS_OK)
        return rc;
    const int na = p->nallocs;
    resident = calloc((size_t)na + 1, sizeof(*resident));
    it.alloc = calloc((size_t)na + 1, sizeof(*it.alloc));
    it.w = calloc((size_t)na + 1, sizeof(*it.w));
    it.v = calloc((size_t)na + 1, sizeof(*it.v));
    it.take = calloc((size_t)na + 1, sizeof(*it.take));
    pre = duration_prefix(p);
    if (!resident || !it.alloc || !it.w || !it.v || !it.take || !pre) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    if (fs_schedule_need(p, resident) > budget) { /* nothing resident: the least it can need */
        rc = FS_ERR_NOMEM;
        goto out;
    }
    uint64_t total = 0;
    for (int a = 0; a < na; a++)
        if (fs_alloc_used(p, a))
            total += p->allocs[a].mapped;
    if (total <= budget) { /* everything fits */
        for (int a = 0; a < na; a++)
            resident[a] = fs_alloc_used(p, a);
        rc = fs_schedule_plan(p, resident, FS_SCHED_UNLIMITED, out, NULL);
        goto out;
    }

    const uint64_t bucket = fs_knapsack_bucket(p);
    for (int a = 0; a < na; a++) {
        if (!fs_alloc_used(p, a) || p->allocs[a].mapped == 0)
            continue;
        it.alloc[it.n] = a;
        it.w[it.n] = fs_knapsack_weight(p->allocs[a].mapped, bucket);
        it.v[it.n] = ks_value(p, a, pre);
        it.n++;
    }
    /* total > budget, so budget / bucket < total / bucket <= ~4096 units. */
    uint64_t full = budget / bucket;
    rc = ks_build(&t, it.n, it.w, it.v, (uint32_t)(full > UINT32_MAX ? UINT32_MAX : full));
    if (rc != FS_OK)
        goto out;

    /* First capacity: room for the largest allocation the full-budget optimum offloads. */
    ks_take(&t, it.w, it.v, t.cap, it.take);
    long c = (long)t.cap - (long)max_left_units(&it);
    if (c < 0)
        c = 0;
    bool fits = false;
    for (int tries = 0; tries < KS_TRIES; tries++) {
        uint64_t need = 0;
        ks_take(&t, it.w, it.v, (uint32_t)c, it.take);
        set_resident(p, &it, resident);
        rc = fs_schedule_plan(p, resident, FS_SCHED_UNLIMITED, out, &need);
        if (rc == FS_OK) {
            fits = true;
            break;
        }
        if (rc != FS_ERR_NOMEM || c == 0)
            goto out;
        uint64_t over = need > budget ? need - budget : 0;
        uint64_t drop = (over + bucket - 1) / bucket;
        c -= drop > 1 ? (long)(drop > (uint64_t)c ? (uint64_t)c : drop) : 1;
        if (c < 0)
            c = 0;
    }
    if (!fits) { /* give up: greedy's answer */
        fs_plan_free(out);
        rc = fs_strategy_greedy.plan(p, budget, out);
        if (rc == FS_OK)
            snprintf(out->strategy, sizeof(out->strategy), "knapsack");
        goto out;
    }
    chosen = c;

    /* Leave room for more prefetch windows: keep whichever predicts least. */
    rc = fs_plan_begin(&trial, "knapsack", budget, na);
    if (rc != FS_OK)
        goto out;
    for (int k = 0; k < KS_EXTRA && c > 0; k++) {
        uint32_t room = max_left_units(&it);
        c -= room > 0 ? (long)room : 1;
        if (c < 0)
            c = 0;
        ks_take(&t, it.w, it.v, (uint32_t)c, it.take);
        set_resident(p, &it, resident);
        rc = fs_schedule_plan(p, resident, FS_SCHED_UNLIMITED, &trial, NULL);
        if (rc == FS_ERR_NOMEM) /* a smaller capacity's optimum may spread wider: skip it */
            continue;
        if (rc != FS_OK)
            goto out;
        if (trial.predicted_us < out->predicted_us) {
            struct fs_plan_entry *e = out->entries;
            out->entries = trial.entries;
            trial.entries = e;
            out->predicted_us = trial.predicted_us;
            out->predicted_stall_us = trial.predicted_stall_us;
            out->peak_bytes = trial.peak_bytes;
            chosen = c;
        }
    }
    rc = FS_OK;
out:
    if (rc == FS_OK && cap_units)
        *cap_units = chosen;
    fs_plan_free(&trial);
    free(t.keep);
    free(pre);
    free(resident);
    free(it.alloc);
    free(it.w);
    free(it.v);
    free(it.take);
    if (rc != FS_OK)
        fs_plan_free(out);
    return rc;
}

static int knapsack_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out)
{
    return fs_knapsack_plan(p, budget, out, NULL);
}

const struct fs_strategy fs_strategy_knapsack = {
    .name = "knapsack",
    .summary = "0/1 knapsack (dynamic programming) of the stall each resident allocation avoids",
    .plan = knapsack_plan,
};

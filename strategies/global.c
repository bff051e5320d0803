/* global: starts from the better of greedy and knapsack and improves the plan by local search on
 * the predicted time of the timeline model (fs_plan_evaluate):
 *   1. the prefetch lookahead limit: 0, 1, 4, 16, ... launches (fewer, later prefetches leave
 *      memory to others);
 *   2. rounds of moves, the first improvement taken each round:
 *        - bring in: make resident one of the 4 offloaded allocations charged the most stall, or
 *          when that does not fit, swap it with one of the 3 resident allocations of least
 *          knapsack value (fs_knapsack_value);
 *        - push out: offload one of the 4 resident allocations of least value (more room for
 *          the windows of the others);
 *        - only when neither improves: swap one of those 4 stalled allocations with one of 4
 *          resident allocations of its own size spread over the iteration. A model's layers
 *          have the same shapes: the same bytes stay resident and the transfer moves to where
 *          the link has time (on the 7b prefill at half the weights the plans streamed the last
 *          eight layers' MLP weights back to back, 7.3 ms of predicted stall, and the GPU lost
 *          that time in those layers, stop 25);
 *      until a round finds nothing or the evaluation budget is spent;
 *   3. the lookahead limits once more.
 * A move is kept only when the predicted time drops, so the result is never worse than its
 * start, and the search stops once nothing stalls. The budget is a count of evaluations (200,
 * fewer for large profiles: about 1.5e7 units of estimated work, at least 16), not a clock, so the
 * result is deterministic; 4000 allocations x 20000 launches take about half a second. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

#define GL_MAX_EVALS 200
#define GL_MIN_EVALS 16
#define GL_WORK 1.5e7
#define GL_BRING_IN 4
#define GL_SWAP_WITH 3
#define GL_PUSH_OUT 4
#define GL_SWAP_SAME 4
/* A swap changes which blocks the engine's device pool can reuse, which the model does not see:
 * on the 7b decode at a quarter of the weights a swap the model gained 1 us from replayed 5-9%
 * slower. The prefill swaps that matter gain 0.5-0.7 ms each. */
#define GL_SWAP_MIN_GAIN_US 100.0

struct search {
    const struct fs_profile *p;
    uint64_t budget;
    bool *res;       /* resident set of BEST */
    bool *tr;        /* scratch set */
    double *value;   /* knapsack value per allocation */
    double *stall;   /* stall charged per allocation */
    struct fs_plan best, trial;
    int lookahead;
    int evals, max_evals;
};

/* Schedules and evaluates RES with LOOKAHEAD; keeps it when it predicts less than the best, by
 * more than MIN_GAIN_US. */
static int try_set(struct search *s, const bool *res, int lookahead, double min_gain_us,
                   bool *improved)
{
    *improved = false;
    if (s->evals >= s->max_evals || s->best.predicted_stall_us <= 0.0) /* nothing to gain */
        return FS_OK;
    if (fs_schedule_need(s->p, res) > s->budget)
        return FS_OK;
    s->evals++;
    int rc = fs_schedule_plan(s->p, res, lookahead, &s->trial, NULL);
    if (rc == FS_ERR_NOMEM)
        return FS_OK;
    if (rc != FS_OK)
        return rc;
    double gain = fmax(min_gain_us, 1e-9 * (1.0 + s->best.predicted_us));
    if (s->trial.predicted_us < s->best.predicted_us - gain) {
        struct fs_plan_entry *e = s->best.entries;
        s->best.entries = s->trial.entries;
        s->trial.entries = e;
        s->best.predicted_us = s->trial.predicted_us;
        s->best.predicted_stall_us = s->trial.predicted_stall_us;
        s->best.peak_bytes = s->trial.peak_bytes;
        /* the plan's own set: scheduling may keep more resident than RES asked */
        for (int a = 0; a < s->p->nallocs; a++)
            s->res[a] = s->best.entries[a].resident;
        s->lookahead = lookahead;
        *improved = true;
    }
    return FS_OK;
}

static int try_lookaheads(struct search *s)
{
    bool improved;
    int base = s->lookahead;
    for (int l = 0; l < s->p->nlaunches; l = l ? 4 * l : 1) {
        if (l == base)
            continue;
        int rc = try_set(s, s->res, l, 0.0, &improved);
        if (rc != FS_OK)
            return rc;
    }
    if (base != FS_SCHED_UNLIMITED)
        return try_set(s, s->res, FS_SCHED_UNLIMITED, 0.0, &improved);
    return FS_OK;
}

static int top_k(const struct search *s, struct fs_ranked *all, int k, bool resident_ones,
                 int *out)
{
    const struct fs_profile *p = s->p;
    int n = 0;
    for (int a = 0; a < p->nallocs; a++) {
        if (!fs_alloc_used(p, a) || p->allocs[a].mapped == 0 || s->res[a] != resident_ones)
            continue;
        if (resident_ones) /* least value first: cheapest to offload */
            all[n++] = (struct fs_ranked){-s->value[a], a};
        else if (s->stall[a] > 0.0)
            all[n++] = (struct fs_ranked){s->stall[a], a};
    }
    qsort(all, (size_t)n, sizeof(*all), fs_ranked_desc);
    if (n > k)
        n = k;
    for (int i = 0; i < n; i++)
        out[i] = all[i].alloc;
    return n;
}

/* Up to K resident allocations of the size of A (an offloaded one), evenly spaced in the order of
 * their first use (ALL: scratch). */
static int same_size_residents(const struct search *s, int a, struct fs_ranked *all, int k,
                               int *out)
{
    const struct fs_profile *p = s->p;
    int n = 0;
    for (int b = 0; b < p->nallocs; b++)
        if (s->res[b] && fs_alloc_used(p, b) && p->allocs[b].mapped == p->allocs[a].mapped)
            all[n++] = (struct fs_ranked){-(double)p->allocs[b].first_use, b};
    qsort(all, (size_t)n, sizeof(*all), fs_ranked_desc); /* earliest first */
    if (n < k)
        k = n;
    for (int i = 0; i < k; i++)
        out[i] = all[(2 * i + 1) * n / (2 * k)].alloc;
    return k;
}

/* S->tr is the best set with one offloaded allocation brought in: offload each of the N
 * allocations of OUT in turn instead, until one predicts less by more than MIN_GAIN_US. */
static int try_swaps(struct search *s, const int *out, int n, double min_gain_us, bool *improved)
{
    for (int j = 0; j < n && !*improved; j++) {
        s->tr[out[j]] = false;
        int rc = try_set(s, s->tr, s->lookahead, min_gain_us, improved);
        if (rc != FS_OK)
            return rc;
        s->tr[out[j]] = true;
    }
    return FS_OK;
}

static int search_round(struct search *s, struct fs_ranked *scratch, bool *improved)
{
    const struct fs_profile *p = s->p;
    const size_t setsz = (size_t)p->nallocs * sizeof(bool);
    int in[GL_BRING_IN], out[GL_PUSH_OUT], same[GL_SWAP_SAME];
    *improved = false;
    int rc = fs_plan_evaluate_ex(p, &s->best, s->stall);
    if (rc != FS_OK)
        return rc;
    int nin = top_k(s, scratch, GL_BRING_IN, false, in);
    int nout = top_k(s, scratch, GL_PUSH_OUT, true, out);

    for (int i = 0; i < nin && !*improved; i++) {
        memcpy(s->tr, s->res, setsz);
        s->tr[in[i]] = true;
        if (fs_schedule_need(p, s->tr) <= s->budget)
            rc = try_set(s, s->tr, s->lookahead, 0.0, improved);
        else
            rc = try_swaps(s, out, nout < GL_SWAP_WITH ? nout : GL_SWAP_WITH, 0.0, improved);
        if (rc != FS_OK)
            return rc;
    }
    for (int j = 0; j < nout && !*improved; j++) {
        memcpy(s->tr, s->res, setsz);
        s->tr[out[j]] = false;
        rc = try_set(s, s->tr, s->lookahead, 0.0, improved);
        if (rc != FS_OK)
            return rc;
    }
    /* Last: until the moves above find nothing, the search takes the path it took without
     * this one, so it ends no worse than that path did. */
    for (int i = 0; i < nin && !*improved; i++) {
        int nsame = same_size_residents(s, in[i], scratch, GL_SWAP_SAME, same);
        memcpy(s->tr, s->res, setsz);
        s->tr[in[i]] = true;
        rc = try_swaps(s, same, nsame, GL_SWAP_MIN_GAIN_US, improved);
        if (rc != FS_OK)
            return rc;
    }
    return FS_OK;
}

int fs_global_improve(const struct fs_profile *p, uint64_t budget, const struct fs_plan *start,
                      struct fs_plan *out)
{
    struct search s = {.p = p, .budget = budget, .lookahead = FS_SCHED_UNLIMITED};
    struct fs_ranked *scratch = NULL;
    const int na = p->nallocs;
    int rc = FS_OK;
    if (!start || !out || start->nallocs != na)
        return FS_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    s.res = calloc((size_t)na + 1, sizeof(*s.res));
    s.tr = calloc((size_t)na + 1, sizeof(*s.tr));
    s.value = calloc((size_t)na + 1, sizeof(*s.value));
    s.stall = calloc((size_t)na + 1, sizeof(*s.stall));
    scratch = calloc((size_t)na + 1, sizeof(*scratch));
    if (!s.res || !s.tr || !s.value || !s.stall || !scratch) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    rc = fs_plan_copy(&s.best, start);
    if (rc != FS_OK)
        goto out;
    rc = fs_plan_begin(&s.trial, "global", budget, na);
    if (rc != FS_OK)
        goto out;
    rc = fs_knapsack_values(p, s.value);
    if (rc != FS_OK)
        goto out;
    for (int a = 0; a < na; a++)
        s.res[a] = start->entries[a].resident;

    /* One evaluation: the profile and plan checks and the timeline are linear, the schedule
     * costs about log2(N) rounds of log2(N) tree operations per offloaded allocation. */
    double lg = 1.0;
    while ((1 << (int)lg) < p->nlaunches && lg < 30.0)
        lg += 1.0;
    double work = 2.0 * p->nlaunches + 2.0 * p->nrefs + 0.5 * lg * lg * na + 1.0;
    double evals = GL_WORK / work;
    if (evals > GL_MAX_EVALS)
        s.max_evals = GL_MAX_EVALS;
    else if (evals < GL_MIN_EVALS)
        s.max_evals = GL_MIN_EVALS;
    else
        s.max_evals = (int)evals;

    rc = try_lookaheads(&s);
    if (rc != FS_OK)
        goto out;
    for (;;) {
        bool improved;
        if (s.evals >= s.max_evals || s.best.predicted_stall_us <= 0.0)
            break;
        rc = search_round(&s, scratch, &improved);
        if (rc != FS_OK)
            goto out;
        if (!improved)
            break;
    }
    rc = try_lookaheads(&s);
    if (rc != FS_OK)
        goto out;
    *out = s.best;
    s.best.entries = NULL;
    snprintf(out->strategy, sizeof(out->strategy), "global");
    out->budget = budget;
out:
    fs_plan_free(&s.best);
    fs_plan_free(&s.trial);
    free(s.res);
    free(s.tr);
    free(s.value);
    free(s.stall);
    free(scratch);
    return rc;
}

static int global_plan(const struct fs_profile *p, uint64_t budget, struct fs_plan *out)
{
    struct fs_plan g = {0}, k = {0};
    int rc = fs_plan_open(p, out);
    if (rc != FS_OK)
        return rc;
    rc = fs_strategy_greedy.plan(p, budget, &g);
    if (rc != FS_OK)
        goto out;
    rc = fs_strategy_knapsack.plan(p, budget, &k);
    if (rc != FS_OK)
        goto out;
    /* Start from the better (fs_plan_better; a tie: knapsack). */
    rc = fs_global_improve(p, budget, fs_plan_better(p, &g, &k) ? &g : &k, out);
out:
    fs_plan_free(&g);
    fs_plan_free(&k);
    return rc;
}

const struct fs_strategy fs_strategy_global = {
    .name = "global",
    .summary = "local search on the predicted time from the better of greedy and knapsack",
    .plan = global_plan,
};

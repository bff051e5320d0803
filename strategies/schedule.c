/* The window scheduler shared by the strategies: a resident set in, a plan's windows out (see
 * schedule.h), plus small plan helpers. Bytes held per launch live in a segment tree (range add,
 * range max, "last launch in a range above a threshold"), so scheduling A allocations over N
 * launches costs O(N + A log^2 N): log N rounds of tree operations. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fs.h"
#include "schedule.h"

int fs_plan_open(const struct fs_profile *p, struct fs_plan *out)
{
    if (!out)
        return FS_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    return fs_profile_check(p) == FS_OK ? FS_OK : FS_ERR_INVALID;
}

int fs_plan_begin(struct fs_plan *out, const char *name, uint64_t budget, int nallocs)
{
    if (!out || nallocs < 0)
        return FS_ERR_INVALID;
    memset(out, 0, sizeof(*out));
    snprintf(out->strategy, sizeof(out->strategy), "%s", name ? name : "");
    out->budget = budget;
    out->nallocs = nallocs;
    out->entries = calloc((size_t)nallocs + 1, sizeof(*out->entries));
    if (!out->entries) {
        memset(out, 0, sizeof(*out));
        return FS_ERR_NOMEM;
    }
    return FS_OK;
}

int fs_plan_copy(struct fs_plan *dst, const struct fs_plan *src)
{
    struct fs_plan tmp = *src;
    tmp.entries = calloc((size_t)src->nallocs + 1, sizeof(*tmp.entries));
    if (!tmp.entries)
        return FS_ERR_NOMEM;
    if (src->nallocs > 0)
        memcpy(tmp.entries, src->entries, (size_t)src->nallocs * sizeof(*tmp.entries));
    *dst = tmp;
    return FS_OK;
}

/* ---- segment tree over launches: bytes held by offloaded windows --------------------------- */

struct segtree {
    int n;
    int64_t *mx; /* max of the node's range, its pending add included */
    int64_t *lz; /* add still to be pushed to the children */
};

static void seg_build(struct segtree *st, const int64_t *v, int node, int l, int r)
{
    st->lz[node] = 0;
    if (l == r) {
        st->mx[node] = v[l];
        return;
    }
    int mid = l + (r - l) / 2;
    seg_build(st, v, 2 * node, l, mid);
    seg_build(st, v, 2 * node + 1, mid + 1, r);
    st->mx[node] = st->mx[2 * node] > st->mx[2 * node + 1] ? st->mx[2 * node] : st->mx[2 * node + 1];
}

static void seg_push(struct segtree *st, int node)
{
    int64_t z = st->lz[node];
    if (z) {
        for (int c = 2 * node; c <= 2 * node + 1; c++) {
            st->mx[c] += z;
            st->lz[c] += z;
        }
        st->lz[node] = 0;
    }
}

static void seg_add(struct segtree *st, int node, int l, int r, int lo, int hi, int64_t v)
{
    if (hi < l || r < lo)
        return;
    if (lo <= l && r <= hi) {
        st->mx[node] += v;
        st->lz[node] += v;
        return;
    }
    seg_push(st, node);
    int mid = l + (r - l) / 2;
    seg_add(st, 2 * node, l, mid, lo, hi, v);
    seg_add(st, 2 * node + 1, mid + 1, r, lo, hi, v);
    st->mx[node] = st->mx[2 * node] > st->mx[2 * node + 1] ? st->mx[2 * node] : st->mx[2 * node + 1];
}

/* The last index in [lo, hi] whose value exceeds THR, or -1. */
static int seg_last_above(struct segtree *st, int node, int l, int r, int lo, int hi, int64_t thr)
{
    if (hi < l || r < lo || st->mx[node] <= thr)
        return -1;
    if (l == r)
        return l;
    seg_push(st, node);
    int mid = l + (r - l) / 2;
    int j = seg_last_above(st, 2 * node + 1, mid + 1, r, lo, hi, thr);
    if (j >= 0)
        return j;
    return seg_last_above(st, 2 * node, l, mid, lo, hi, thr);
}

static void range_add(struct segtree *st, int lo, int hi, int64_t v)
{
    if (lo <= hi)
        seg_add(st, 1, 0, st->n - 1, lo, hi, v);
}

static int last_above(struct segtree *st, int lo, int hi, int64_t thr)
{
    if (lo > hi)
        return -1;
    return seg_last_above(st, 1, 0, st->n - 1, lo, hi, thr);
}

/* Cyclic ranges: X in [lo, hi] with -n <= lo, hi < n names launch X mod n; the part >= 0 comes
 * later in the cycle than the part < 0 (which lies in the previous iteration). */

/* The largest X in [lo, hi] whose launch holds more than THR, or INT_MIN. */
static int cyc_last_above(struct segtree *st, int lo, int hi, int64_t thr)
{
    int j = last_above(st, lo < 0 ? 0 : lo, hi, thr);
    if (j >= 0)
        return j;
    j = last_above(st, lo + st->n, (hi < -1 ? hi : -1) + st->n, thr);
    return j >= 0 ? j - st->n : INT_MIN;
}

static void cyc_add(struct segtree *st, int lo, int hi, int64_t v)
{
    range_add(st, lo < 0 ? 0 : lo, hi, v);
    range_add(st, lo + st->n, (hi < -1 ? hi : -1) + st->n, v);
}

/* ---- the scheduler ------------------------------------------------------------------------ */

#define FS_IN_PLACE_MIN_BYTES (64ull << 20)

/* Does allocation A get a window: offloaded, used, not read in place? */
static bool windowed(const struct fs_profile *p, const bool *resident, const bool *in_place, int a)
{
    return !resident[a] && p->allocs[a].first_use >= 0 && !(in_place && in_place[a]);
}

/* Per-launch bytes of the offloaded allocations' use ranges into HELD (n), resident bytes into
 * *RES; those IN_PLACE marks (optional) are read in place and hold none. Returns resident + the
 * most held. */
static uint64_t core_bytes(const struct fs_profile *p, const bool *resident, const bool *in_place,
                           int64_t *held, uint64_t *res)
{
    const int n = p->nlaunches;
    uint64_t r = 0;
    for (int i = 0; i < n; i++)
        held[i] = 0;
    for (int a = 0; a < p->nallocs; a++) {
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (resident[a]) {
            r += al->mapped;
        } else if (windowed(p, resident, in_place, a)) {
            held[al->first_use] += (int64_t)al->mapped;
            if (al->last_use + 1 < n)
                held[al->last_use + 1] -= (int64_t)al->mapped;
        }
    }
    int64_t run = 0, most = 0;
    for (int i = 0; i < n; i++) {
        run += held[i];
        held[i] = run;
        if (run > most)
            most = run;
    }
    *res = r;
    return r + (uint64_t)most;
}

uint64_t fs_schedule_need(const struct fs_profile *p, const bool *resident)
{
    uint64_t res = 0, need = 0;
    int64_t *held = calloc((size_t)p->nlaunches + 1, sizeof(*held));
    if (!held)
        return UINT64_MAX;
    need = core_bytes(p, resident, NULL, held, &res);
    free(held);
    return need;
}

/* fs_schedule, where the offloaded allocations IN_PLACE marks (optional) are read in place:
 * no window, no room. */
static int schedule(const struct fs_profile *p, uint64_t budget, const bool *resident,
                    const bool *in_place, int lookahead, struct fs_plan_entry *entries,
                    uint64_t *need_out)
{
    if (!p || !resident || !entries || p->nlaunches < 0 || p->nallocs < 0 ||
        (p->nallocs > 0 && !p->allocs))
        return FS_ERR_INVALID;
    const int n = p->nlaunches, na = p->nallocs;
    int rc = FS_OK;
    int64_t *held = NULL;
    int *order = NULL, *count = NULL, *ext = NULL;
    struct segtree st = {0};
    uint64_t res = 0;

    if (lookahead < 0)
        lookahead = 0;
    held = calloc((size_t)n + 1, sizeof(*held));
    order = calloc((size_t)na + 1, sizeof(*order));
    count = calloc((size_t)n + 1, sizeof(*count));
    ext = calloc((size_t)na + 1, sizeof(*ext));
    if (!held || !order || !count || !ext) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    for (int a = 0; a < na; a++) {
        const struct fs_prof_alloc *al = &p->allocs[a];
        if (al->first_use < -1 || al->last_use < al->first_use || al->last_use >= n ||
            (al->first_use == -1) != (al->last_use == -1)) {
            rc = FS_ERR_INVALID;
            goto out;
        }
    }
    uint64_t need = core_bytes(p, resident, in_place, held, &res);
    if (need_out)
        *need_out = need;
    if (need > budget) {
        rc = FS_ERR_NOMEM;
        goto out;
    }

    /* Offloaded used allocations in order of first use, then index (counting sort). */
    int nord = 0;
    for (int a = 0; a < na; a++) {
        struct fs_plan_entry *e = &entries[a];
        e->resident = resident[a];
        e->prefetch_at = -1;
        e->evict_after = -1;
        if (windowed(p, resident, in_place, a)) {
            count[p->allocs[a].first_use + 1]++;
            nord++;
        }
    }
    if (nord == 0)
        goto out;
    for (int i = 0; i < n; i++)
        count[i + 1] += count[i];
    for (int a = 0; a < na; a++)
        if (windowed(p, resident, in_place, a))
            order[count[p->allocs[a].first_use]++] = a;

    st.n = n;
    st.mx = calloc(4 * (size_t)n, sizeof(*st.mx));
    st.lz = calloc(4 * (size_t)n, sizeof(*st.lz));
    if (!st.mx || !st.lz) {
        rc = FS_ERR_NOMEM;
        goto out;
    }
    seg_build(&st, held, 1, 0, n - 1);

    /* Room left for offloaded windows at any launch; budget may be "unlimited". */
    uint64_t room_u = budget - res;
    int64_t room = room_u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)room_u;
    /* Windows grow in rounds, to 1, 2, 4, ... launches before their first use, so the room is
     * shared rather than taken by whichever comes first. A window that meets a launch without
     * room for it stops for good: windows only grow, room only shrinks. ext[k] is how far
     * order[k]'s window reaches back, -1 once it has stopped. */
    int active = nord;
    for (int k = 0; k < nord; k++)
        ext[k] = 0;
    for (int reach = 1; active > 0; reach = reach > INT_MAX / 2 ? INT_MAX : 2 * reach) {
        for (int k = 0; k < nord; k++) {
            if (ext[k] < 0)
                continue;
            int a = order[k], d = ext[k];
            const struct fs_prof_alloc *al = &p->allocs[a];
            const int f = al->first_use;
            const int64_t m = (int64_t)al->mapped;
            int dmax = n - (al->last_use - f + 1); /* never over its own previous last use */
            if (dmax > lookahead)
                dmax = lookahead;
            int target = reach < dmax ? reach : dmax;
            int nd = target;
            if (d < target) {
                /* launches f-d-1 down to f-target: the nearest without room stops it */
                int j = cyc_last_above(&st, f - target, f - d - 1, room - m);
                if (j != INT_MIN)
                    nd = f - 1 - j;
                cyc_add(&st, f - nd, f - d - 1, m);
            }
            if (nd < target || nd == dmax) {
                entries[a].prefetch_at = ((f - nd) % n + n) % n;
                entries[a].evict_after = al->last_use;
                ext[k] = -1;
                active--;
            } else {
                ext[k] = nd;
            }
        }
    }
out:
    free(held);
    free(order);
    free(count);
    free(ext);
    free(st.mx);
    free(st.lz);
    return rc;
}

int fs_schedule(const struct fs_profile *p, uint64_t budget, const bool *resident, int lookahead,
                struct fs_plan_entry *entries, uint64_t *need_out)
{
    return schedule(p, budget, resident, NULL, lookahead, entries, need_out);
}

/* The offloaded allocations that RESIDENT leaves to be moved and whose launches cannot read
 * three quarters of them (fs_read_in_place_bytes): candidates to be read in place. Only those of
 * FS_IN_PLACE_MIN_BYTES or more: a smaller one may sit in the GPU's L2 cache (60 MB on an H200)
 * and be read faster than the bound assumes. Returns how many, marked in IN_PLACE (nallocs). */
static int sparse_offloaded(const struct fs_profile *p, const bool *resident, bool *in_place,
                            double *read)
{
    if (!(p->bw.read_bytes_per_us > 0.0))
        return 0;
    for (int a = 0; a < p->nallocs; a++)
        read[a] = 0.0;
    for (int i = 0; i < p->nlaunches; i++) {
        const struct fs_prof_launch *l = &p->launches[i];
        for (int r = l->ref_start; r < l->ref_start + l->nrefs; r++)
            read[p->refs[r]] += fs_read_in_place_bytes(p, l->duration_us,
                                                       (double)p->allocs[p->refs[r]].mapped);
    }
    int k = 0;
    for (int a = 0; a < p->nallocs; a++) {
        in_place[a] = !resident[a] && fs_alloc_used(p, a) &&
                      p->allocs[a].mapped >= FS_IN_PLACE_MIN_BYTES &&
                      read[a] < 0.75 * (double)p->allocs[a].mapped;
        k += in_place[a];
    }
    return k;
}

/* PLAN with what it moves kept resident, when that fits beside what stays on the device (those
 * it reads in place, read in place still): moving it would gain nothing and have every launch
 * watched (fs_plan_cost_us). A resident set chosen before some allocations were found to be
 * read in place leaves such room (a 7b decode at 100% of its weights: the token embedding read
 * in place, the lm_head then moved out and back every step). SCRATCH: nallocs entries, swapped
 * with PLAN's when taken. */
static void keep_what_fits(const struct fs_profile *p, struct fs_plan *plan,
                           struct fs_plan_entry **scratch)
{
    if (fs_plan_moves_nothing(p, plan))
        return;
    struct fs_plan t = *plan;
    t.entries = *scratch;
    for (int a = 0; a < p->nallocs; a++) {
        t.entries[a] = plan->entries[a];
        if (!t.entries[a].resident && fs_alloc_used(p, a) && !fs_reads_in_place(p, plan, a))
            t.entries[a] = (struct fs_plan_entry){true, -1, -1};
    }
    if (fs_plan_moves_nothing(p, &t) && fs_plan_evaluate(p, &t) == FS_OK &&
        t.predicted_us <= plan->predicted_us) {
        *scratch = plan->entries;
        *plan = t;
    }
}

int fs_schedule_plan(const struct fs_profile *p, const bool *resident, int lookahead,
                     struct fs_plan *plan, uint64_t *need)
{
    int rc = fs_schedule(p, plan->budget, resident, lookahead, plan->entries, need);
    if (rc == FS_OK)
        rc = fs_plan_evaluate(p, plan);
    if (rc != FS_OK)
        return rc;
    /* The same resident set with the sparse allocations read in place, when that is faster. */
    bool *in_place = malloc(((size_t)p->nallocs + 1) * sizeof(*in_place));
    double *read = malloc(((size_t)p->nallocs + 1) * sizeof(*read));
    struct fs_plan trial = *plan;
    trial.entries = malloc(((size_t)p->nallocs + 1) * sizeof(*trial.entries));
    if (in_place && read && trial.entries && sparse_offloaded(p, resident, in_place, read) > 0 &&
        schedule(p, plan->budget, resident, in_place, lookahead, trial.entries, NULL) == FS_OK &&
        fs_plan_evaluate(p, &trial) == FS_OK && trial.predicted_us < plan->predicted_us) {
        struct fs_plan_entry *e = plan->entries;
        *plan = trial;
        trial.entries = e;
    }
    if (trial.entries)
        keep_what_fits(p, plan, &trial.entries);
    free(trial.entries);
    free(read);
    free(in_place);
    return FS_OK;
}

/* Bytes of the allocations PLAN offloads and some launch uses; MOVED: only those it moves. */
static uint64_t plan_bytes(const struct fs_profile *p, const struct fs_plan *plan, bool moved)
{
    uint64_t b = 0;
    for (int a = 0; a < p->nallocs && a < plan->nallocs; a++)
        if (!plan->entries[a].resident && fs_alloc_used(p, a) &&
            !(moved && fs_reads_in_place(p, plan, a)))
            b += p->allocs[a].mapped;
    return b;
}

uint64_t fs_plan_offloaded_bytes(const struct fs_profile *p, const struct fs_plan *plan)
{
    return plan_bytes(p, plan, false);
}

uint64_t fs_plan_moved_bytes(const struct fs_profile *p, const struct fs_plan *plan)
{
    return plan_bytes(p, plan, true);
}

bool fs_plan_moves_nothing(const struct fs_profile *p, const struct fs_plan *plan)
{
    if (!plan->entries || plan->nallocs != p->nallocs)
        return false;
    uint64_t on_device = 0;
    for (int a = 0; a < p->nallocs; a++) {
        const struct fs_plan_entry *e = &plan->entries[a];
        if (fs_reads_in_place(p, plan, a))
            continue;
        if (!e->resident && (e->prefetch_at >= 0 || e->evict_after >= 0))
            return false;
        on_device += p->allocs[a].mapped;
    }
    return on_device <= plan->budget;
}

double fs_plan_cost_us(const struct fs_profile *p, const struct fs_plan *plan)
{
    double watch = fs_plan_moves_nothing(p, plan) ? 0.0 : FS_WATCH_US_PER_LAUNCH * p->nlaunches;
    return plan->predicted_us + watch;
}

bool fs_plan_better(const struct fs_profile *p, const struct fs_plan *a, const struct fs_plan *b)
{
    if (a->predicted_us != b->predicted_us)
        return a->predicted_us < b->predicted_us;
    return fs_plan_offloaded_bytes(p, a) < fs_plan_offloaded_bytes(p, b);
}

int fs_ranked_desc(const void *x, const void *y)
{
    const struct fs_ranked *a = x, *b = y;
    if (a->key != b->key)
        return a->key > b->key ? -1 : 1;
    return (a->alloc > b->alloc) - (a->alloc < b->alloc);
}

int fs_plan_host_read(const struct fs_profile *p, struct fs_plan *plan)
{
    if (!p || !plan || !plan->entries || plan->nallocs != p->nallocs)
        return FS_ERR_INVALID;
    int n = p->nallocs, ncand = 0;
    uint64_t *uses = calloc((size_t)n + 1, sizeof(*uses));
    struct fs_ranked *cand = malloc(((size_t)n + 1) * sizeof(*cand));
    if (!uses || !cand) {
        free(uses);
        free(cand);
        return FS_ERR_NOMEM;
    }
    fs_profile_count_uses(p, uses);
    uint64_t held = 0;
    for (int a = 0; a < n; a++) {
        if (plan->entries[a].resident)
            held += p->allocs[a].mapped;
        else if (uses[a] > 0)
            cand[ncand++] = (struct fs_ranked){(double)uses[a] / (double)p->allocs[a].mapped, a};
    }
    qsort(cand, (size_t)ncand, sizeof(*cand), fs_ranked_desc);
    for (int k = 0; k < ncand; k++) {
        uint64_t size = p->allocs[cand[k].alloc].mapped;
        if (held + size <= plan->budget) {
            plan->entries[cand[k].alloc].resident = true;
            held += size;
        }
    }
    for (int a = 0; a < n; a++) {
        if (plan->entries[a].resident)
            plan->entries[a].prefetch_at = plan->entries[a].evict_after = -1;
        else
            plan->entries[a] = (struct fs_plan_entry){false, -1, -1};
    }
    free(uses);
    free(cand);
    plan->peak_bytes = held;
    return FS_OK;
}

#include "launch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "iteration.h"
#include "log.h"

/* Largest parameter list remembered; kernels with more are scanned as unknown. */
#define MAX_PARAMS 512
/* Layout cache: open addressing on the function handle, never shrinks; when full, layouts are
 * queried every time (correct, slower). */
#define CACHE_SLOTS 16384

struct layout {
    uint64_t sig;     /* the kernel's identity across runs (launch.h) */
    int n;            /* parameters that can hold a pointer (8 bytes or more) */
    bool unknown;     /* the driver could not tell */
    struct { uint32_t index, offset, size; } p[];
};

struct slot {
    const void *func;       /* atomic; NULL = empty */
    struct layout *layout;  /* atomic; published after func */
};

static struct {
    struct fs_device *dev;
    struct slot *slots;
    pthread_mutex_t insert_lock;
    struct fs_launch_stats stats;
} lc = {.insert_lock = PTHREAD_MUTEX_INITIALIZER};

#define STAT(field) __atomic_add_fetch(&lc.stats.field, 1, __ATOMIC_RELAXED)

int fs_launch_init(struct fs_device *dev)
{
    lc.slots = calloc(CACHE_SLOTS, sizeof(*lc.slots));
    if (!lc.slots)
        return FS_ERR_NOMEM;
    lc.dev = dev;
    return FS_OK;
}

void fs_launch_shutdown(void)
{
    if (!lc.slots)
        return;
    for (int i = 0; i < CACHE_SLOTS; i++)
        free(lc.slots[i].layout);
    free(lc.slots);
    lc.slots = NULL;
}

static struct layout *query_layout(const void *func)
{
    uint32_t offsets[MAX_PARAMS], sizes[MAX_PARAMS];
    int n = 0;
    STAT(layout_queries);
    int rc = fs_dev_call(lc.dev, param_layout, func, offsets, sizes, MAX_PARAMS, &n);
    int wide = 0;
    if (rc == FS_OK)
        for (int i = 0; i < n; i++)
            wide += sizes[i] >= 8;
    struct layout *l = malloc(sizeof(*l) + (size_t)wide * sizeof(l->p[0]));
    if (!l)
        return NULL;
    l->unknown = rc != FS_OK;
    l->n = 0;
    if (rc == FS_OK)
        for (int i = 0; i < n; i++)
            if (sizes[i] >= 8)
                l->p[l->n++] = (__typeof__(l->p[0])){(uint32_t)i, offsets[i], sizes[i]};
    if (l->unknown)
        FS_DEBUG("kernel %p: parameter layout unavailable (%s)", func, fs_err_str(rc));
    const char *name = NULL;
    char fallback[32];
    if (fs_dev_call(lc.dev, kernel_name, func, &name) != FS_OK || !name) {
        snprintf(fallback, sizeof(fallback), "kernel@%p", func); /* this run only */
        name = fallback;
    }
    l->sig = fs_iter_hash_name(name);
    return l;
}

/* The layout of FUNC, from the cache or the driver. *OWNED: the caller frees it (cache full). */
static const struct layout *get_layout(const void *func, bool *owned)
{
    *owned = false;
    size_t h = ((uintptr_t)func >> 4) * 0x9E3779B97F4A7C15ull;
    for (int probe = 0; probe < CACHE_SLOTS; probe++) {
        struct slot *s = &lc.slots[(h + (size_t)probe) & (CACHE_SLOTS - 1)];
        const void *f = __atomic_load_n(&s->func, __ATOMIC_ACQUIRE);
        if (f == func) {
            struct layout *l = __atomic_load_n(&s->layout, __ATOMIC_ACQUIRE);
            if (l)
                return l;
            break; /* being inserted by another thread: query ourselves */
        }
        if (f == NULL) {
            struct layout *l = query_layout(func);
            if (!l)
                return NULL;
            pthread_mutex_lock(&lc.insert_lock);
            const void *expect = NULL;
            bool claimed = __atomic_compare_exchange_n(&s->func, &expect, func, false,
                                                       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
            if (claimed)
                __atomic_store_n(&s->layout, l, __ATOMIC_RELEASE);
            pthread_mutex_unlock(&lc.insert_lock);
            if (claimed)
                return l;
            if (expect == func) { /* lost a race for the same function */
                *owned = true;
                return l;
            }
            free(l);
            continue; /* the slot went to another function: keep probing */
        }
    }
    struct layout *l = query_layout(func);
    *owned = l != NULL;
    return l;
}

/* Add the allocation holding ADDR, if any, to T (deduplicated); AT: where the word lies in
 * parameter memory (NULL: an explicit address of a copy). False when T is full. */
static inline bool add_ref(struct fs_residency *res, struct fs_launch_ticket *t, uint64_t addr,
                           unsigned char *at)
{
    struct fs_alloc *a = fs_res_lookup(res, addr);
    if (FS_LIKELY(!a)) {
        /* One past the end (a loop bound) goes with its allocation, unless another allocation
         * starts there: a redirected launch must get both bounds in the same copy. */
        a = (struct fs_alloc *)fs_va_space_lookup(&res->vs, addr - 1);
        if (FS_LIKELY(!a) || addr != a->va + a->size)
            return true;
    }
    int i = 0;
    while (i < t->n && t->refs[i] != a)
        i++;
    if (i == t->n) {
        if (t->n == FS_LAUNCH_MAX_REFS)
            return false;
        t->refs[t->n++] = a;
    }
    if (at && t->nwords < FS_LAUNCH_MAX_WORDS)
        t->words[t->nwords++] = (__typeof__(t->words[0])){at, addr, i};
    else
        t->fixed = true;
    return true;
}

static bool scan_words(struct fs_residency *res, struct fs_launch_ticket *t, const void *buf,
                       size_t size)
{
    unsigned char *p = (unsigned char *)buf; /* the caller's; written only to redirect */
    for (size_t off = 0; off + 8 <= size; off += 8) {
        uint64_t w;
        memcpy(&w, p + off, sizeof(w));
        if (!add_ref(res, t, w, p + off))
            return false;
    }
    return true;
}

void fs_launch_scan(struct fs_residency *res, const struct fs_launch_desc *d,
                    struct fs_launch_ticket *t)
{
    t->n = 0;
    t->nwords = t->nrewritten = 0;
    t->fixed = false;
    t->active = false;
    t->stream = d->stream;
    t->func = d->func;
    t->sig = FS_SIG_COPY;
    t->pos = -1;
    STAT(launches);
    bool readable = !d->unreadable;
    if (readable && d->ptrs)
        for (int i = 0; i < d->nptrs && readable; i++)
            readable = add_ref(res, t, d->ptrs[i], NULL);
    int in_ranges = t->n;
    if (readable && d->param_buf)
        readable = scan_words(res, t, d->param_buf, d->param_buf_size);
    int in_extra = t->n - in_ranges;
    if (d->func) {
        bool owned;
        const struct layout *l = get_layout(d->func, &owned);
        t->sig = l ? l->sig : FS_SIG_UNKNOWN;
        if (readable && d->kernel_params) {
            if (!l || l->unknown) {
                readable = false;
            } else {
                for (int i = 0; i < l->n && readable; i++)
                    readable = scan_words(res, t, d->kernel_params[l->p[i].index], l->p[i].size);
            }
        }
        if (owned)
            free((void *)l);
    }
    t->unknown = !readable;
    if (FS_UNLIKELY(!readable))
        STAT(unknown);
    if (in_ranges > 0)
        STAT(refs_in_ranges);
    else if (in_extra > 0)
        STAT(refs_in_extra);
    else if (t->n > 0)
        STAT(refs_in_params);
}

/* Point every word into a staged allocation at the same offset of its device copy. The holds
 * keep each stage until fs_launch_exit. */
static void redirect(struct fs_launch_ticket *t)
{
    for (int k = 0; k < t->nwords; k++) {
        const struct fs_alloc *a = t->refs[t->words[k].ref];
        fs_dptr stage = __atomic_load_n(&a->stage_va, __ATOMIC_ACQUIRE);
        if (!stage)
            continue;
        /* Keep the words to restore first in the list. */
        __typeof__(t->words[0]) w = t->words[k];
        t->words[k] = t->words[t->nrewritten];
        t->words[t->nrewritten++] = w;
        uint64_t v = stage + (w.was - a->va);
        memcpy(w.at, &v, sizeof(v));
    }
    __atomic_add_fetch(&lc.stats.rewritten, (uint64_t)t->nrewritten, __ATOMIC_RELAXED);
}

void fs_launch_hold(struct fs_residency *res, struct fs_launch_ticket *t)
{
    bool redirect_now = false;
    t->tick = fs_res_launch_begin(res, t->refs, t->n, t->stream, t->unknown,
                                  t->fixed || !t->func, &redirect_now);
    t->active = true;
    if (redirect_now)
        redirect(t);
}

void fs_launch_enter(struct fs_residency *res, const struct fs_launch_desc *d,
                     struct fs_launch_ticket *t)
{
    fs_launch_scan(res, d, t);
    fs_launch_hold(res, t);
}

void fs_launch_exit(struct fs_residency *res, struct fs_launch_ticket *t, bool queued)
{
    if (!t->active)
        return;
    for (int k = 0; k < t->nrewritten; k++)
        memcpy(t->words[k].at, &t->words[k].was, sizeof(t->words[k].was));
    t->nrewritten = 0;
    fs_res_launch_done(res, t->tick, t->stream, t->refs, t->n, queued, t->unknown);
    t->active = false;
}

void fs_launch_get_stats(struct fs_launch_stats *out)
{
    out->launches = __atomic_load_n(&lc.stats.launches, __ATOMIC_RELAXED);
    out->refs_in_ranges = __atomic_load_n(&lc.stats.refs_in_ranges, __ATOMIC_RELAXED);
    out->refs_in_extra = __atomic_load_n(&lc.stats.refs_in_extra, __ATOMIC_RELAXED);
    out->refs_in_params = __atomic_load_n(&lc.stats.refs_in_params, __ATOMIC_RELAXED);
    out->with_refs = out->refs_in_ranges + out->refs_in_extra + out->refs_in_params;
    out->unknown = __atomic_load_n(&lc.stats.unknown, __ATOMIC_RELAXED);
    out->rewritten = __atomic_load_n(&lc.stats.rewritten, __ATOMIC_RELAXED);
    out->layout_queries = __atomic_load_n(&lc.stats.layout_queries, __ATOMIC_RELAXED);
}

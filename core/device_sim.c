/* The simulated device (see device_sim.h for the model).
 *
 * State: one mutex around everything. Physical allocations are calloc'd host buffers; VA
 * reservations are handed out from a counter that never goes back (with a one-granule gap
 * between reservations, so no two are ever contiguous) and kept in a sorted array; mappings are
 * a sorted array of segments (binary search for translation). Queued operations carry start and
 * end times fixed at enqueue time (stream order, event waits, engine occupancy, the clock) and
 * sit in a pending array sorted by (end, enqueue order); they take effect when the clock reaches
 * their end.
 *
 * Clocks: NOW_NS is the program's thread's (it moves when that thread waits or the tests advance
 * it). The engine's threads (fs_thread_internal) share another, ENGINE_NS: their waits move it
 * and execute what ends by then, but leave the program's clock alone, as on a GPU, where the
 * program goes on queueing work while the engine's finishers wait for copies (the engine's
 * threads hand work to each other, so one clock for all of them). Each engine thread's own host
 * work (remaps) delays only what that thread queues next (tl_host_ready_ns). An operation starts
 * no earlier than the clock of the thread that queued it; a program thread that waited for the
 * engine takes the engine's clock (fs_sim_join_engine_clock).
 *
 * Engines: H2D (host->device and host->host copies), D2H, D2D and one compute engine for kernels.
 * Each engine runs one operation at a time, in enqueue order.
 *
 * Mapping rules (as the CUDA driver): a map call maps one whole physical allocation (offset 0,
 * its full size; anything else is FS_ERR_UNSUPPORTED) and an unmap call removes exactly one
 * earlier mapping (same start and size; anything else is FS_ERR_INVALID).
 *
 * Translation rules: a copy may span several adjacent mappings as long as the whole range is
 * mapped. A kernel range must lie within one mapping; otherwise it is an illegal access. A copy's
 * engine is chosen from the locations mapped when it is queued (unmapped counts as device); the
 * memory itself is resolved when it executes.
 *
 * Capture: a stream marked capturing (fs_sim_set_capturing) makes every synchronizing call
 * (stream_sync and event_sync of any stream, ctx_sync) fail with FS_ERR_INVALID, as a sync during
 * a global-mode capture does on the GPU; map and unmap still work but are counted too
 * (fs_sim_stats.capture_violations). The mark stays until the test clears it or the stream is
 * destroyed.
 *
 * Kernel parameter layouts come from a registry filled by fs_sim_register_kernel.
 *
 * Sticky failure: the first illegal access (or unsafe unmap, or an injected FS_ERR_STICKY) kills
 * the context: queued work is dropped and every later device call returns FS_ERR_STICKY, except
 * props, bind_thread, last_native_error and close. The fs_sim_* test helpers (read, write,
 * location, stats, clock) keep working so tests can inspect the wreck. */
#include "device_sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fingerprint.h"
#include "log.h"

#define SIM_VA_BASE 0x7f0000000000ull

enum sim_engine { ENG_H2D, ENG_D2H, ENG_D2D, ENG_COMPUTE, ENG_COUNT };
enum sim_dir { DIR_H2D, DIR_D2H, DIR_D2D, DIR_H2H };
enum sim_op_kind { OPK_COPY, OPK_KERNEL };

struct sim_link {
    struct sim_link *prev, *next;
};

struct fs_phys_ {
    struct sim_link link; /* first member: the list node is the object */
    uint64_t size;
    enum fs_mem_loc loc;
    unsigned char *data;
    uint64_t refs; /* mapping segments that point here */
};

struct fs_stream_ {
    struct sim_link link;
    uint64_t tail_ns; /* when everything queued so far on the stream (waits included) is done */
    bool capturing;   /* marked by fs_sim_set_capturing */
};

struct fs_event_ {
    struct sim_link link;
    bool timing, recorded;
    uint64_t done_ns; /* completion time of the last record */
};

struct sim_resv {
    fs_dptr va;
    uint64_t size;
    bool plain; /* made by mem_alloc with its memory and mapping: only mem_free gives it back */
};

struct sim_seg {
    fs_dptr va;
    uint64_t size;
    struct fs_phys_ *phys;
    uint64_t offset;
};

/* A registered kernel parameter layout (offsets and sizes share one allocation). */
struct sim_kernel {
    const void *func;
    int n;
    uint32_t *offsets, *sizes;
    char name[32]; /* "sim_kernel_<registration number>" */
};

/* A queued copy (va[0] = dst, va[1] = src) or kernel (va[0..nranges)). */
struct sim_op {
    enum sim_op_kind kind;
    enum sim_dir dir;
    struct fs_stream_ *stream;
    bool by_engine;
    uint64_t start_ns, end_ns, seq;
    int nranges;
    fs_dptr va[FS_SIM_MAX_KERNEL_PTRS];
    uint64_t len[FS_SIM_MAX_KERNEL_PTRS];
    fs_sim_kernel_fn fn;
    void *ctx;
    uint64_t *fp_parts; /* a fingerprint (va[0], len[0]) goes here */
};

struct sim {
    struct fs_device dev;
    pthread_mutex_t lock;
    struct fs_sim_config cfg;
    uint64_t now_ns;    /* the program's thread's clock */
    uint64_t engine_ns; /* the engine's threads' clock */
    uint64_t id;        /* from sims_opened */
    uint64_t horizon_ns; /* the latest end of anything queued (ctx_sync target) */
    uint64_t engine_free_ns[ENG_COUNT];
    uint64_t seq;
    bool sticky;
    int last_err;
    fs_dptr next_va;
    struct fs_sim_stats st;
    struct {
        uint64_t countdown;
        int err;
    } fail[FS_SIM_OP_COUNT];
    struct sim_link phys, streams, events; /* list heads */
    struct fs_stream_ default_stream;      /* stands for the NULL (legacy default) stream */
    struct sim_resv *resv;
    size_t nresv, cap_resv;
    struct sim_seg *segs;
    size_t nsegs, cap_segs;
    struct sim_op **pending; /* sorted by (end, seq) descending: the next to run is last */
    size_t npending, cap_pending;
    uint64_t ncapturing; /* streams marked capturing (the default stream included) */
    fs_sim_record_fn recorder; /* fs_sim_set_recorder */
    void *recorder_arg;
    struct sim_kernel *kernels;
    size_t nkernels, cap_kernels;
};

static const struct fs_device_ops sim_ops;

/* When the calling engine thread's own host work (remaps) is done, on the modelled clock of the
 * simulated device numbered TL_SIM (a thread that outlives one device starts afresh on the next). */
static __thread uint64_t tl_host_ready_ns;
static __thread uint64_t tl_sim;
static uint64_t sims_opened; /* atomic; numbers the devices from 1 */

static uint64_t host_ready(const struct sim *s)
{
    return tl_sim == s->id ? tl_host_ready_ns : 0;
}

/* ---- small helpers ---------------------------------------------------------------------- */

static struct sim *sim_of(struct fs_device *dev)
{
    return dev && dev->ops == &sim_ops ? dev->impl : NULL;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

static void list_init(struct sim_link *head)
{
    head->prev = head->next = head;
}

static void list_add(struct sim_link *head, struct sim_link *node)
{
    node->prev = head->prev;
    node->next = head;
    head->prev->next = node;
    head->prev = node;
}

static void list_del(struct sim_link *node)
{
    node->prev->next = node->next;
    node->next->prev = node->prev;
    node->prev = node->next = NULL;
}

static bool list_has(const struct sim_link *head, const void *node)
{
    for (const struct sim_link *l = head->next; l != head; l = l->next)
        if ((const void *)l == node)
            return true;
    return false;
}

/* Make room for NEED elements of ELEM bytes in *ARR. */
static bool range_ok(fs_dptr va, uint64_t size)
{
    return size <= UINT64_MAX - va;
}

static bool ranges_overlap(fs_dptr a, uint64_t alen, fs_dptr b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

/* ---- mapping segments --------------------------------------------------------------------- */

/* Index of the first segment whose va >= ADDR. */
static size_t seg_lower_bound(const struct sim *s, fs_dptr addr)
{
    size_t lo = 0, hi = s->nsegs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->segs[mid].va < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The segment containing ADDR, or NULL. */
static struct sim_seg *seg_find(const struct sim *s, fs_dptr addr)
{
    size_t i = seg_lower_bound(s, addr);
    if (i < s->nsegs && s->segs[i].va == addr)
        return &s->segs[i];
    if (i == 0)
        return NULL;
    struct sim_seg *g = &s->segs[i - 1];
    return addr - g->va < g->size ? g : NULL;
}

/* Whether every byte of [VA, VA+SIZE) is mapped. */
static bool range_mapped(const struct sim *s, fs_dptr va, uint64_t size)
{
    if (!range_ok(va, size))
        return false;
    fs_dptr end = va + size, cur = va;
    while (cur < end) {
        const struct sim_seg *g = seg_find(s, cur);
        if (!g)
            return false;
        cur = g->va + g->size;
    }
    return true;
}

/* A host pointer for [VA, VA+SIZE) when the range lies within one mapping; else NULL. (Every
 * mapping covers a whole allocation, so adjacent mappings are never contiguous in host memory.) */
static unsigned char *resolve_contig(const struct sim *s, fs_dptr va, uint64_t size)
{
    if (!range_ok(va, size))
        return NULL;
    const struct sim_seg *g = seg_find(s, va);
    if (!g || size > g->size - (va - g->va))
        return NULL;
    return g->phys->data + g->offset + (va - g->va);
}

/* Copy between host memory and a mapped VA range, segment by segment. The range must be mapped
 * (checked by the caller). TO_VA: copy HOST into VA, else VA into HOST. */
static void host_xfer(const struct sim *s, fs_dptr va, unsigned char *host, uint64_t size,
                      bool to_va)
{
    while (size) {
        const struct sim_seg *g = seg_find(s, va);
        uint64_t off = va - g->va, n = g->size - off;
        if (n > size)
            n = size;
        unsigned char *p = g->phys->data + g->offset + off;
        if (to_va)
            memcpy(p, host, n);
        else
            memcpy(host, p, n);
        va += n;
        host += n;
        size -= n;
    }
}

static enum fs_mem_loc loc_of(const struct sim *s, fs_dptr va)
{
    const struct sim_seg *g = seg_find(s, va);
    return g ? g->phys->loc : FS_LOC_DEVICE;
}

/* ---- the clock ---------------------------------------------------------------------------- */

static void drop_pending(struct sim *s)
{
    for (size_t i = 0; i < s->npending; i++)
        free(s->pending[i]);
    s->npending = 0;
}

static void make_sticky(struct sim *s, const char *why)
{
    if (!s->sticky)
        FS_DEBUG("sim: context failed at %llu ns: %s", (unsigned long long)s->now_ns, why);
    s->sticky = true;
    s->last_err = FS_ERR_STICKY;
    drop_pending(s);
}

static void illegal_access(struct sim *s, const char *why)
{
    s->st.illegal_accesses++;
    make_sticky(s, why);
}

static void exec_copy(struct sim *s, const struct sim_op *op)
{
    fs_dptr dst = op->va[0], src = op->va[1];
    uint64_t size = op->len[0];
    if (!range_mapped(s, dst, size) || !range_mapped(s, src, size)) {
        illegal_access(s, "copy touches unmapped memory");
        return;
    }
    if (s->cfg.timing_only)
        return;
    unsigned char *d = resolve_contig(s, dst, size), *sp = resolve_contig(s, src, size);
    if (d && sp) {
        memmove(d, sp, size);
    } else {
        /* Piecewise: walk the destination's segments and copy from the source into each. */
        while (size) {
            const struct sim_seg *g = seg_find(s, dst);
            uint64_t off = dst - g->va, n = g->size - off;
            if (n > size)
                n = size;
            host_xfer(s, src, g->phys->data + g->offset + off, n, false);
            dst += n;
            src += n;
            size -= n;
        }
    }
    s->st.copies++;
    switch (op->dir) {
    case DIR_H2D:
    case DIR_H2H: s->st.bytes_h2d += op->len[0]; break;
    case DIR_D2H: s->st.bytes_d2h += op->len[0]; break;
    case DIR_D2D: s->st.bytes_d2d += op->len[0]; break;
    }
}

static void exec_kernel(struct sim *s, const struct sim_op *op)
{
    void *ptrs[FS_SIM_MAX_KERNEL_PTRS];
    for (int i = 0; i < op->nranges; i++) {
        ptrs[i] = resolve_contig(s, op->va[i], op->len[i]);
        if (!ptrs[i]) {
            illegal_access(s, "kernel touches unmapped memory (or more than one mapping)");
            return;
        }
    }
    if (op->fp_parts) {
        s->st.fingerprints++;
        /* Timing only: no data, so the parts keep what they held (every range looks unchanged). */
        if (!s->cfg.timing_only)
            fs_fp_host(ptrs[0], op->len[0], op->fp_parts);
        return;
    }
    s->st.kernels++;
    if (op->fn && !s->cfg.timing_only)
        op->fn(op->ctx, ptrs, op->nranges);
}

static void record(struct sim *s, const struct sim_op *op)
{
    struct fs_sim_record r = {
        .stream = op->stream == &s->default_stream ? NULL : op->stream,
        .start_ns = op->start_ns,
        .end_ns = op->end_ns,
        .by_engine = op->by_engine,
    };
    if (op->kind == OPK_COPY) {
        r.kind = op->dir == DIR_H2D ? FS_SIM_REC_COPY_H2D
                 : op->dir == DIR_D2H ? FS_SIM_REC_COPY_D2H
                                      : FS_SIM_REC_COPY_OTHER;
        r.dst = op->va[0];
        r.src = op->va[1];
        r.bytes = op->len[0];
    } else {
        r.kind = op->fp_parts ? FS_SIM_REC_FINGERPRINT : FS_SIM_REC_KERNEL;
        r.src = op->nranges ? op->va[0] : 0;
        r.bytes = op->fp_parts ? op->len[0] : 0;
    }
    s->recorder(s->recorder_arg, &r);
}

/* The calling thread's clock (see the top of the file). */
static uint64_t thread_now(const struct sim *s)
{
    return fs_thread_internal ? max_u64(max_u64(s->now_ns, s->engine_ns), host_ready(s))
                              : s->now_ns;
}

/* Execute every pending operation that ends by TARGET, in (end, enqueue) order. */
static int execute_until(struct sim *s, uint64_t target)
{
    while (!s->sticky && s->npending && s->pending[s->npending - 1]->end_ns <= target) {
        struct sim_op *op = s->pending[--s->npending];
        if (op->kind == OPK_COPY)
            exec_copy(s, op);
        else
            exec_kernel(s, op);
        if (s->recorder)
            record(s, op);
        free(op);
    }
    return s->sticky ? FS_ERR_STICKY : FS_OK;
}

/* The calling thread waits until TARGET: its clock moves there (never backwards) and what ends
 * by then is executed. */
static int run_until(struct sim *s, uint64_t target)
{
    if (fs_thread_internal)
        s->engine_ns = max_u64(s->engine_ns, target);
    else
        s->now_ns = max_u64(s->now_ns, target);
    return execute_until(s, target);
}

/* Queue OP (malloc'd) on STREAM using ENGINE for DURATION_NS. Takes ownership of OP. */
static int enqueue(struct sim *s, struct sim_op *op, struct fs_stream_ *stream,
                   enum sim_engine engine, uint64_t duration_ns)
{
    if (!fs_grow((void **)&s->pending, &s->cap_pending, s->npending + 1, sizeof(*s->pending))) {
        free(op);
        return FS_ERR_NOMEM;
    }
    uint64_t start = max_u64(max_u64(thread_now(s), stream->tail_ns), s->engine_free_ns[engine]);
    op->stream = stream;
    op->by_engine = fs_thread_internal;
    op->start_ns = start;
    op->end_ns = start + duration_ns;
    op->seq = s->seq++;
    s->engine_free_ns[engine] = op->end_ns;
    stream->tail_ns = op->end_ns;
    s->horizon_ns = max_u64(s->horizon_ns, op->end_ns);

    /* Position: after every op ending later, before those ending at the same time or earlier
     * (they were queued before this one, so they run first). */
    size_t lo = 0, hi = s->npending;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->pending[mid]->end_ns > op->end_ns)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(&s->pending[lo + 1], &s->pending[lo], (s->npending - lo) * sizeof(*s->pending));
    s->pending[lo] = op;
    s->npending++;
    /* Zero-length work that is already due happens now. */
    return execute_until(s, thread_now(s));
}

/* ---- call framing ------------------------------------------------------------------------- */

/* Locks, then refuses the call if the context is dead or an injected failure is due for OP
 * (-1: not injectable). On a non-OK result the lock is still held; finish with sim_end. */
static int sim_begin(struct sim *s, int op)
{
    pthread_mutex_lock(&s->lock);
    if (s->sticky)
        return FS_ERR_STICKY;
    if (op >= 0 && s->fail[op].countdown && --s->fail[op].countdown == 0) {
        int err = s->fail[op].err;
        if (err == FS_ERR_STICKY)
            make_sticky(s, "injected failure");
        return err;
    }
    return FS_OK;
}

static int sim_end(struct sim *s, int rc)
{
    if (rc < 0 && rc != FS_ERR_NOT_READY)
        s->last_err = rc;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static struct fs_stream_ *stream_of(struct sim *s, fs_stream stream)
{
    if (!stream)
        return &s->default_stream;
    return list_has(&s->streams, stream) ? stream : NULL;
}

static struct fs_event_ *event_of(struct sim *s, fs_event event)
{
    return event && list_has(&s->events, event) ? event : NULL;
}

static bool aligned(const struct sim *s, uint64_t v)
{
    return (v & (s->cfg.granularity - 1)) == 0;
}

/* ---- device operations -------------------------------------------------------------------- */

static int sim_props(struct fs_device *dev, struct fs_device_props *out)
{
    if (!sim_of(dev) || !out)
        return FS_ERR_INVALID;
    *out = dev->props;
    return FS_OK;
}

static int sim_mem_info(struct fs_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        if (free_bytes)
            *free_bytes = s->cfg.device_bytes - s->st.device_bytes_in_use;
        if (total_bytes)
            *total_bytes = s->cfg.device_bytes;
    }
    return sim_end(s, rc);
}

static int phys_create_locked(struct sim *s, uint64_t size, enum fs_mem_loc loc, fs_phys *out)
{
    if (!out || size == 0 || !aligned(s, size) || (loc != FS_LOC_DEVICE && loc != FS_LOC_HOST))
        return FS_ERR_INVALID;
    if (loc == FS_LOC_HOST && !s->cfg.host_phys_supported)
        return FS_ERR_UNSUPPORTED;
    if (loc == FS_LOC_DEVICE && size > s->cfg.device_bytes - s->st.device_bytes_in_use)
        return FS_ERR_NOMEM;
    if (loc == FS_LOC_HOST && s->cfg.host_bytes &&
        size > s->cfg.host_bytes - s->st.host_bytes_in_use)
        return FS_ERR_NOMEM;
    struct fs_phys_ *p = calloc(1, sizeof(*p));
    if (!p)
        return FS_ERR_NOMEM;
    p->data = size <= SIZE_MAX ? calloc(1, (size_t)size) : NULL;
    if (!p->data) {
        free(p);
        return FS_ERR_NOMEM;
    }
    p->size = size;
    p->loc = loc;
    list_add(&s->phys, &p->link);
    if (loc == FS_LOC_DEVICE) {
        s->st.device_bytes_in_use += size;
        s->st.peak_device_bytes = max_u64(s->st.peak_device_bytes, s->st.device_bytes_in_use);
    } else {
        s->st.host_bytes_in_use += size;
    }
    s->st.live_phys++;
    *out = p;
    return FS_OK;
}

static int sim_phys_create(struct fs_device *dev, uint64_t size, enum fs_mem_loc loc, fs_phys *out)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_PHYS_CREATE);
    if (rc == FS_OK)
        rc = phys_create_locked(s, size, loc, out);
    return sim_end(s, rc);
}

static void phys_free(struct sim *s, struct fs_phys_ *p)
{
    list_del(&p->link);
    if (p->loc == FS_LOC_DEVICE)
        s->st.device_bytes_in_use -= p->size;
    else
        s->st.host_bytes_in_use -= p->size;
    s->st.live_phys--;
    free(p->data);
    free(p);
}

static int sim_phys_release(struct fs_device *dev, fs_phys phys)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_PHYS_RELEASE);
    if (rc == FS_OK) {
        if (!phys || !list_has(&s->phys, phys) || phys->refs)
            rc = FS_ERR_INVALID;
        else
            phys_free(s, phys);
    }
    return sim_end(s, rc);
}

static int resv_add_locked(struct sim *s, uint64_t size, bool plain, fs_dptr *out)
{
    if (!out || size == 0 || !aligned(s, size))
        return FS_ERR_INVALID;
    if (size > UINT64_MAX - s->next_va - s->cfg.granularity)
        return FS_ERR_NOMEM;
    if (!fs_grow((void **)&s->resv, &s->cap_resv, s->nresv + 1, sizeof(*s->resv)))
        return FS_ERR_NOMEM;
    /* Addresses only go up, so the array stays sorted by appending. */
    s->resv[s->nresv++] = (struct sim_resv){s->next_va, size, plain};
    *out = s->next_va;
    s->next_va += size + s->cfg.granularity; /* a gap: reservations never touch */
    s->st.live_va_ranges++;
    return FS_OK;
}

static int sim_va_reserve(struct fs_device *dev, uint64_t size, fs_dptr *out)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_VA_RESERVE);
    if (rc == FS_OK)
        rc = resv_add_locked(s, size, false, out);
    return sim_end(s, rc);
}

static void resv_remove(struct sim *s, size_t i)
{
    memmove(&s->resv[i], &s->resv[i + 1], (s->nresv - i - 1) * sizeof(*s->resv));
    s->nresv--;
    s->st.live_va_ranges--;
}

/* Index of the reservation containing ADDR, or -1. */
static long resv_find(const struct sim *s, fs_dptr addr)
{
    size_t lo = 0, hi = s->nresv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->resv[mid].va <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    const struct sim_resv *r = &s->resv[lo - 1];
    return addr - r->va < r->size ? (long)(lo - 1) : -1;
}

static int sim_va_release(struct fs_device *dev, fs_dptr va, uint64_t size)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_VA_RELEASE);
    if (rc == FS_OK) {
        long i = resv_find(s, va);
        if (i < 0 || s->resv[i].va != va || s->resv[i].size != size || s->resv[i].plain) {
            rc = FS_ERR_INVALID;
        } else {
            size_t j = seg_lower_bound(s, va);
            if (j < s->nsegs && s->segs[j].va < va + size)
                rc = FS_ERR_INVALID; /* still mapped */
            else
                resv_remove(s, (size_t)i);
        }
    }
    return sim_end(s, rc);
}

/* A synchronizing call, or a remap, while a stream captures. */
static void capture_violation(struct sim *s, const char *what)
{
    s->st.capture_violations++;
    FS_DEBUG("sim: %s while a stream is capturing", what);
}

/* The host spends NS_PER_GIB per GiB of SIZE on a map or unmap: the device works on meanwhile.
 * On an engine thread (fs_thread_internal) only that thread is busy: the work it queues next
 * starts after it, while the program's thread goes on; on the program's thread the clock moves. */
static void host_time(struct sim *s, uint64_t size, uint64_t ns_per_gib)
{
    if (!ns_per_gib)
        return;
    uint64_t cost = (uint64_t)((double)size * (double)ns_per_gib / (1ull << 30));
    if (fs_thread_internal) {
        tl_host_ready_ns = thread_now(s) + cost;
        tl_sim = s->id;
    } else {
        run_until(s, s->now_ns + cost);
    }
}

/* Show all of PHYS at VA (inside one reservation). */
static int seg_insert(struct sim *s, fs_dptr va, uint64_t size, struct fs_phys_ *phys)
{
    size_t i = seg_lower_bound(s, va);
    if (i > 0 && s->segs[i - 1].va + s->segs[i - 1].size > va)
        return FS_ERR_INVALID;
    if (i < s->nsegs && s->segs[i].va < va + size)
        return FS_ERR_INVALID;
    if (!fs_grow((void **)&s->segs, &s->cap_segs, s->nsegs + 1, sizeof(*s->segs)))
        return FS_ERR_NOMEM;
    memmove(&s->segs[i + 1], &s->segs[i], (s->nsegs - i) * sizeof(*s->segs));
    s->segs[i] = (struct sim_seg){va, size, phys, 0};
    s->nsegs++;
    phys->refs++;
    return FS_OK;
}

static int map_locked(struct sim *s, fs_dptr va, uint64_t size, struct fs_phys_ *phys,
                      uint64_t off)
{
    if (!phys || !list_has(&s->phys, phys) || size == 0 || !aligned(s, va) || !aligned(s, size) ||
        !aligned(s, off) || off > phys->size || size > phys->size - off || !range_ok(va, size))
        return FS_ERR_INVALID;
    /* The driver maps whole allocations only. */
    if (off != 0 || size != phys->size)
        return FS_ERR_UNSUPPORTED;
    long r = resv_find(s, va);
    if (r < 0 || va + size > s->resv[r].va + s->resv[r].size || s->resv[r].plain)
        return FS_ERR_INVALID;
    int rc = seg_insert(s, va, size, phys);
    if (rc != FS_OK)
        return rc;
    s->st.maps++;
    s->st.maps_by_loc[phys->loc]++;
    host_time(s, size, s->cfg.map_ns_per_gib[phys->loc]);
    return FS_OK;
}

static int sim_map(struct fs_device *dev, fs_dptr va, uint64_t size, fs_phys phys,
                   uint64_t phys_offset)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_MAP);
    if (rc == FS_OK) {
        if (s->ncapturing)
            capture_violation(s, "map");
        rc = map_locked(s, va, size, phys, phys_offset);
    }
    return sim_end(s, rc);
}

/* Forget segment I; its memory, no longer mapped there. */
static struct fs_phys_ *seg_remove(struct sim *s, size_t i)
{
    struct fs_phys_ *phys = s->segs[i].phys;
    phys->refs--;
    memmove(&s->segs[i], &s->segs[i + 1], (s->nsegs - i - 1) * sizeof(*s->segs));
    s->nsegs--;
    return phys;
}

/* The quiet-range rule: does queued work still touch the range? */
static bool range_pending(const struct sim *s, fs_dptr va, uint64_t size)
{
    for (size_t k = 0; k < s->npending; k++)
        for (int r = 0; r < s->pending[k]->nranges; r++)
            if (ranges_overlap(va, size, s->pending[k]->va[r], s->pending[k]->len[r]))
                return true;
    return false;
}

static int unmap_locked(struct sim *s, fs_dptr va, uint64_t size)
{
    if (size == 0 || !range_ok(va, size))
        return FS_ERR_INVALID;
    /* Exactly one earlier mapping: same start, same size. */
    size_t i = seg_lower_bound(s, va);
    if (i >= s->nsegs || s->segs[i].va != va || s->segs[i].size != size)
        return FS_ERR_INVALID;
    long r = resv_find(s, va);
    if (r >= 0 && s->resv[r].plain)
        return FS_ERR_INVALID; /* mem_free gives it back */
    bool unsafe = range_pending(s, va, size);
    uint64_t cost = s->cfg.unmap_ns_per_gib[seg_remove(s, i)->loc];
    s->st.unmaps++;
    host_time(s, size, cost);
    if (unsafe) {
        s->st.unsafe_unmaps++;
        illegal_access(s, "unmap of a range queued work still touches");
    }
    return FS_OK;
}

static int sim_unmap(struct fs_device *dev, fs_dptr va, uint64_t size)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_UNMAP);
    if (rc == FS_OK) {
        if (s->ncapturing)
            capture_violation(s, "unmap");
        rc = unmap_locked(s, va, size);
    }
    return sim_end(s, rc);
}

/* Plain memory: a reservation of its own, device memory and the mapping, made together. */
static int sim_mem_alloc(struct fs_device *dev, uint64_t size, fs_dptr *out)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_MEM_ALLOC);
    if (rc != FS_OK || !out || size == 0 || size > UINT64_MAX - s->cfg.granularity) {
        rc = rc != FS_OK ? rc : FS_ERR_INVALID;
        goto out;
    }
    uint64_t rounded = (size + s->cfg.granularity - 1) & ~(s->cfg.granularity - 1);
    fs_phys phys = NULL;
    fs_dptr va = 0;
    rc = phys_create_locked(s, rounded, FS_LOC_DEVICE, &phys);
    if (rc != FS_OK)
        goto out;
    rc = resv_add_locked(s, rounded, true, &va);
    if (rc == FS_OK) {
        rc = seg_insert(s, va, rounded, phys);
        if (rc != FS_OK)
            resv_remove(s, (size_t)resv_find(s, va));
    }
    if (rc != FS_OK) {
        phys_free(s, phys);
        goto out;
    }
    s->st.plain_allocs++;
    *out = va;
out:
    return sim_end(s, rc);
}

/* As cudaFree: work still queued on the memory makes the context fail (an illegal address). */
static int sim_mem_free(struct fs_device *dev, fs_dptr ptr)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    long r = rc == FS_OK ? resv_find(s, ptr) : -1;
    if (rc == FS_OK && (r < 0 || !s->resv[r].plain || s->resv[r].va != ptr))
        rc = FS_ERR_INVALID;
    if (rc != FS_OK)
        goto out;
    size_t i = seg_lower_bound(s, ptr);
    bool unsafe = range_pending(s, ptr, s->segs[i].size);
    phys_free(s, seg_remove(s, i));
    resv_remove(s, (size_t)r);
    s->st.plain_allocs--;
    if (unsafe)
        illegal_access(s, "free of plain memory queued work still touches");
out:
    return sim_end(s, rc);
}

static int sim_stream_create(struct fs_device *dev, fs_stream *out)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_STREAM_CREATE);
    if (rc == FS_OK) {
        struct fs_stream_ *st = out ? calloc(1, sizeof(*st)) : NULL;
        if (!out) {
            rc = FS_ERR_INVALID;
        } else if (!st) {
            rc = FS_ERR_NOMEM;
        } else {
            list_add(&s->streams, &st->link);
            s->st.live_streams++;
            *out = st;
        }
    }
    return sim_end(s, rc);
}

static int sim_stream_destroy(struct fs_device *dev, fs_stream stream)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        /* Queued work does not refer to its stream: it completes after the stream is gone. */
        if (!stream || !list_has(&s->streams, stream)) {
            rc = FS_ERR_INVALID;
        } else {
            if (stream->capturing)
                s->ncapturing--;
            list_del(&stream->link);
            free(stream);
            s->st.live_streams--;
        }
    }
    return sim_end(s, rc);
}

static int sim_stream_sync(struct fs_device *dev, fs_stream stream)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_SYNC);
    if (rc == FS_OK) {
        struct fs_stream_ *st = stream_of(s, stream);
        if (!st) {
            rc = FS_ERR_INVALID;
        } else if (s->ncapturing) {
            capture_violation(s, "stream_sync");
            rc = FS_ERR_INVALID;
        } else {
            rc = run_until(s, max_u64(thread_now(s), st->tail_ns));
        }
    }
    return sim_end(s, rc);
}

static int copy_locked(struct sim *s, fs_dptr dst, fs_dptr src, uint64_t size, fs_stream stream)
{
    struct fs_stream_ *st = stream_of(s, stream);
    if (!st || !range_ok(dst, size) || !range_ok(src, size))
        return FS_ERR_INVALID;
    if (size == 0)
        return FS_OK;
    struct sim_op *op = calloc(1, sizeof(*op));
    if (!op)
        return FS_ERR_NOMEM;
    op->kind = OPK_COPY;
    op->nranges = 2;
    op->va[0] = dst;
    op->va[1] = src;
    op->len[0] = op->len[1] = size;
    bool src_host = loc_of(s, src) == FS_LOC_HOST, dst_host = loc_of(s, dst) == FS_LOC_HOST;
    enum sim_engine eng;
    double bw;
    if (src_host) { /* host->device, and host->host, go through the H2D engine */
        op->dir = dst_host ? DIR_H2H : DIR_H2D;
        eng = ENG_H2D;
        bw = s->cfg.h2d_bytes_per_s;
    } else if (dst_host) {
        op->dir = DIR_D2H;
        eng = ENG_D2H;
        bw = s->cfg.d2h_bytes_per_s;
    } else {
        op->dir = DIR_D2D;
        eng = ENG_D2D;
        bw = s->cfg.d2d_bytes_per_s;
    }
    uint64_t dur = s->cfg.copy_latency_ns + (uint64_t)((double)size * 1e9 / bw + 0.5);
    return enqueue(s, op, st, eng, dur);
}

static int sim_copy_async(struct fs_device *dev, fs_dptr dst, fs_dptr src, uint64_t size,
                          fs_stream stream)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_COPY);
    if (rc == FS_OK)
        rc = copy_locked(s, dst, src, size, stream);
    return sim_end(s, rc);
}

static int sim_fingerprint(struct fs_device *dev, fs_dptr va, uint64_t size, fs_stream stream,
                           uint64_t *parts)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_FINGERPRINT);
    if (rc == FS_OK) {
        struct fs_stream_ *st = stream_of(s, stream);
        struct sim_op *op = NULL;
        if (!st || !parts || size == 0 || size % 16 != 0 || !range_ok(va, size))
            rc = FS_ERR_INVALID;
        else if (!(op = calloc(1, sizeof(*op))))
            rc = FS_ERR_NOMEM;
        if (op) {
            op->kind = OPK_KERNEL;
            op->nranges = 1;
            op->va[0] = va;
            op->len[0] = size;
            op->fp_parts = parts;
            /* Reads the range once at device-memory speed, beside the program's kernels. */
            uint64_t dur = (uint64_t)((double)size * 1e9 / s->cfg.d2d_bytes_per_s + 0.5);
            rc = enqueue(s, op, st, ENG_D2D, dur);
        }
    }
    return sim_end(s, rc);
}

static int sim_host_alloc(struct fs_device *dev, uint64_t size, void **out)
{
    if (!sim_of(dev) || !out || size == 0)
        return FS_ERR_INVALID;
    void *p = calloc(1, size);
    if (!p)
        return FS_ERR_NOMEM;
    *out = p;
    return FS_OK;
}

static int sim_host_free(struct fs_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
    return FS_OK;
}

static int sim_event_create(struct fs_device *dev, unsigned flags, fs_event *out)
{
    struct sim *s = sim_of(dev);
    if (!s || (flags & ~FS_EVENT_ALL))
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_EVENT_CREATE);
    if (rc == FS_OK) {
        struct fs_event_ *e = out ? calloc(1, sizeof(*e)) : NULL;
        if (!out) {
            rc = FS_ERR_INVALID;
        } else if (!e) {
            rc = FS_ERR_NOMEM;
        } else {
            e->timing = flags & FS_EVENT_TIMING;
            list_add(&s->events, &e->link);
            s->st.live_events++;
            s->st.blocking_events_made += (flags & FS_EVENT_BLOCKING) != 0;
            *out = e;
        }
    }
    return sim_end(s, rc);
}

static int sim_event_destroy(struct fs_device *dev, fs_event event)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        struct fs_event_ *e = event_of(s, event);
        if (!e) {
            rc = FS_ERR_INVALID;
        } else {
            list_del(&e->link);
            free(e);
            s->st.live_events--;
        }
    }
    return sim_end(s, rc);
}

static int sim_event_record(struct fs_device *dev, fs_event event, fs_stream stream)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_EVENT_RECORD);
    if (rc == FS_OK) {
        struct fs_event_ *e = event_of(s, event);
        struct fs_stream_ *st = stream_of(s, stream);
        if (!e || !st) {
            rc = FS_ERR_INVALID;
        } else {
            /* Zero time: complete once everything before it on the stream is. */
            e->recorded = true;
            e->done_ns = max_u64(thread_now(s), st->tail_ns);
        }
    }
    return sim_end(s, rc);
}

static int sim_event_query(struct fs_device *dev, fs_event event)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        struct fs_event_ *e = event_of(s, event);
        if (!e)
            rc = FS_ERR_INVALID;
        else if (e->recorded && e->done_ns > thread_now(s))
            rc = FS_ERR_NOT_READY;
        else if (e->recorded) /* an engine thread's clock may be ahead of what was executed */
            rc = execute_until(s, e->done_ns);
    }
    return sim_end(s, rc);
}

static int sim_event_sync(struct fs_device *dev, fs_event event)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_EVENT_SYNC);
    if (rc == FS_OK) {
        struct fs_event_ *e = event_of(s, event);
        if (!e) {
            rc = FS_ERR_INVALID;
        } else if (s->ncapturing) {
            capture_violation(s, "event_sync");
            rc = FS_ERR_INVALID;
        } else {
            rc = run_until(s, e->recorded ? max_u64(thread_now(s), e->done_ns) : thread_now(s));
        }
    }
    return sim_end(s, rc);
}

static int sim_stream_wait_event(struct fs_device *dev, fs_stream stream, fs_event event)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_STREAM_WAIT);
    if (rc == FS_OK) {
        struct fs_event_ *e = event_of(s, event);
        struct fs_stream_ *st = stream_of(s, stream);
        if (!e || !st) {
            rc = FS_ERR_INVALID;
        } else if (e->recorded) {
            st->tail_ns = max_u64(st->tail_ns, e->done_ns);
            s->horizon_ns = max_u64(s->horizon_ns, st->tail_ns);
        }
    }
    return sim_end(s, rc);
}

static int sim_event_elapsed_ms(struct fs_device *dev, fs_event start, fs_event end, float *ms)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        struct fs_event_ *a = event_of(s, start), *b = event_of(s, end);
        if (!a || !b || !ms || !a->timing || !b->timing || !a->recorded || !b->recorded)
            rc = FS_ERR_INVALID;
        else if (max_u64(a->done_ns, b->done_ns) > thread_now(s))
            rc = FS_ERR_NOT_READY;
        else
            *ms = (float)(((double)b->done_ns - (double)a->done_ns) / 1e6);
    }
    return sim_end(s, rc);
}

static int sim_ctx_sync(struct fs_device *dev)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, FS_SIM_OP_SYNC);
    if (rc == FS_OK) {
        if (s->ncapturing) {
            capture_violation(s, "ctx_sync");
            rc = FS_ERR_INVALID;
        } else {
            rc = run_until(s, max_u64(thread_now(s), s->horizon_ns));
        }
    }
    return sim_end(s, rc);
}

static int sim_stream_capturing(struct fs_device *dev, fs_stream stream, bool *capturing)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        struct fs_stream_ *st = stream_of(s, stream);
        if (!st || !capturing)
            rc = FS_ERR_INVALID;
        else
            *capturing = st->capturing;
    }
    return sim_end(s, rc);
}

static const struct sim_kernel *kernel_find(const struct sim *s, const void *func)
{
    for (size_t i = 0; i < s->nkernels; i++)
        if (s->kernels[i].func == func)
            return &s->kernels[i];
    return NULL;
}

static int sim_param_layout(struct fs_device *dev, const void *func, uint32_t *offsets,
                            uint32_t *sizes, int max, int *n)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    s->st.param_layout_queries++; /* every call, failed ones too */
    if (rc == FS_OK) {
        const struct sim_kernel *k = func ? kernel_find(s, func) : NULL;
        if (!func || !n || max < 0 || (max > 0 && (!offsets || !sizes))) {
            rc = FS_ERR_INVALID;
        } else if (!k) {
            rc = FS_ERR_UNSUPPORTED; /* the driver cannot tell either */
        } else if (k->n > max) {
            /* More parameters than the caller has room for: unreadable, nothing written (as
             * device_cuda.c: a partial layout could hide pointers). */
            rc = FS_ERR_UNSUPPORTED;
        } else {
            for (int i = 0; i < k->n; i++) {
                offsets[i] = k->offsets[i];
                sizes[i] = k->sizes[i];
            }
            *n = k->n;
        }
    }
    return sim_end(s, rc);
}

static int sim_kernel_name(struct fs_device *dev, const void *func, const char **name)
{
    struct sim *s = sim_of(dev);
    if (!s || !func || !name)
        return FS_ERR_INVALID;
    pthread_mutex_lock(&s->lock);
    const struct sim_kernel *k = kernel_find(s, func);
    if (k)
        *name = k->name; /* stable until the kernel is registered again or the device closes */
    pthread_mutex_unlock(&s->lock);
    return k ? FS_OK : FS_ERR_UNSUPPORTED;
}

static int sim_bind_thread(struct fs_device *dev)
{
    return sim_of(dev) ? FS_OK : FS_ERR_INVALID;
}

static int sim_last_native_error(struct fs_device *dev)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    pthread_mutex_lock(&s->lock);
    int err = s->last_err;
    pthread_mutex_unlock(&s->lock);
    return err;
}

static void free_list(struct sim_link *head)
{
    struct sim_link *l = head->next;
    while (l != head) {
        struct sim_link *next = l->next;
        free(l); /* the link is the first member of every listed object */
        l = next;
    }
    list_init(head);
}

static void sim_close(struct fs_device *dev)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    drop_pending(s);
    free(s->pending);
    for (size_t i = 0; i < s->nkernels; i++)
        free(s->kernels[i].offsets);
    free(s->kernels);
    free(s->segs);
    free(s->resv);
    for (struct sim_link *l = s->phys.next; l != &s->phys; l = l->next)
        free(((struct fs_phys_ *)l)->data);
    free_list(&s->phys);
    free_list(&s->streams);
    free_list(&s->events);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static const struct fs_device_ops sim_ops = {
    .name = "sim",
    .props = sim_props,
    .mem_info = sim_mem_info,
    .phys_create = sim_phys_create,
    .phys_release = sim_phys_release,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_sync = sim_stream_sync,
    .copy_async = sim_copy_async,
    .fingerprint = sim_fingerprint,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .stream_wait_event = sim_stream_wait_event,
    .event_elapsed_ms = sim_event_elapsed_ms,
    .stream_capturing = sim_stream_capturing,
    .param_layout = sim_param_layout,
    .kernel_name = sim_kernel_name,
    .ctx_sync = sim_ctx_sync,
    .bind_thread = sim_bind_thread,
    .last_native_error = sim_last_native_error,
    .close = sim_close,
};

/* ---- the simulator's own API ------------------------------------------------------------ */

int fs_sim_open(const struct fs_sim_config *cfg, struct fs_device **out)
{
    if (!out)
        return FS_ERR_INVALID;
    struct fs_sim_config c = {
        .device_bytes = 8ull << 30,
        .host_bytes = 0,
        .granularity = 2ull << 20,
        .h2d_bytes_per_s = 55e9,
        .d2h_bytes_per_s = 55e9,
        .d2d_bytes_per_s = 2e12,
        .copy_latency_ns = 2000,
        .host_phys_supported = true,
    };
    if (cfg) {
        /* Zero means "default" where zero would be meaningless; latency and host_bytes are
         * taken as given (0 host_bytes = unlimited). */
        c.host_bytes = cfg->host_bytes;
        c.copy_latency_ns = cfg->copy_latency_ns;
        c.host_phys_supported = cfg->host_phys_supported;
        c.timing_only = cfg->timing_only;
        memcpy(c.map_ns_per_gib, cfg->map_ns_per_gib, sizeof(c.map_ns_per_gib));
        memcpy(c.unmap_ns_per_gib, cfg->unmap_ns_per_gib, sizeof(c.unmap_ns_per_gib));
        c.host_read_bytes_per_s = cfg->host_read_bytes_per_s;
        if (cfg->device_bytes)
            c.device_bytes = cfg->device_bytes;
        if (cfg->granularity)
            c.granularity = cfg->granularity;
        if (cfg->h2d_bytes_per_s != 0)
            c.h2d_bytes_per_s = cfg->h2d_bytes_per_s;
        if (cfg->d2h_bytes_per_s != 0)
            c.d2h_bytes_per_s = cfg->d2h_bytes_per_s;
        if (cfg->d2d_bytes_per_s != 0)
            c.d2d_bytes_per_s = cfg->d2d_bytes_per_s;
    }
    if ((c.granularity & (c.granularity - 1)) != 0 || !(c.h2d_bytes_per_s > 0) ||
        !(c.d2h_bytes_per_s > 0) || !(c.d2d_bytes_per_s > 0))
        return FS_ERR_CONFIG;

    struct sim *s = calloc(1, sizeof(*s));
    if (!s)
        return FS_ERR_NOMEM;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        free(s);
        return FS_ERR_NOMEM;
    }
    s->cfg = c;
    s->id = __atomic_add_fetch(&sims_opened, 1, __ATOMIC_RELAXED);
    s->next_va = SIM_VA_BASE;
    list_init(&s->phys);
    list_init(&s->streams);
    list_init(&s->events);
    s->dev.ops = &sim_ops;
    s->dev.impl = s;
    struct fs_device_props *p = &s->dev.props;
    snprintf(p->name, sizeof(p->name), "flexshim simulated device");
    p->ordinal = 0;
    p->cc_major = 9;
    p->cc_minor = 0;
    p->total_bytes = c.device_bytes;
    p->granularity = c.granularity;
    p->host_phys_supported = c.host_phys_supported;
    *out = &s->dev;
    return FS_OK;
}

int fs_sim_stream_create(struct fs_device *dev, fs_stream *out)
{
    return sim_stream_create(dev, out);
}

int fs_sim_launch(struct fs_device *dev, fs_stream stream, uint64_t duration_ns,
                  const fs_dptr *ptrs, const uint64_t *sizes, int nptrs, fs_sim_kernel_fn fn,
                  void *ctx)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return FS_ERR_INVALID;
    int rc = sim_begin(s, -1);
    if (rc == FS_OK) {
        struct fs_stream_ *st = stream_of(s, stream);
        bool ok = st && nptrs >= 0 && nptrs <= FS_SIM_MAX_KERNEL_PTRS &&
                  (nptrs == 0 || (ptrs && sizes));
        for (int i = 0; ok && i < nptrs; i++)
            ok = sizes[i] > 0 && range_ok(ptrs[i], sizes[i]);
        struct sim_op *op = ok ? calloc(1, sizeof(*op)) : NULL;
        if (!ok) {
            rc = FS_ERR_INVALID;
        } else if (!op) {
            rc = FS_ERR_NOMEM;
        } else {
            op->kind = OPK_KERNEL;
            op->nranges = nptrs;
            for (int i = 0; i < nptrs; i++) {
                op->va[i] = ptrs[i];
                op->len[i] = sizes[i];
                /* Nothing remaps a range under a queued kernel: its backing now is the one the
                 * kernel will read. */
                if (s->cfg.host_read_bytes_per_s > 0 && loc_of(s, ptrs[i]) == FS_LOC_HOST)
                    duration_ns += (uint64_t)((double)sizes[i] / s->cfg.host_read_bytes_per_s * 1e9);
            }
            op->fn = fn;
            op->ctx = ctx;
            rc = enqueue(s, op, st, ENG_COMPUTE, duration_ns);
        }
    }
    return sim_end(s, rc);
}

static int host_access(struct fs_device *dev, fs_dptr va, void *host, uint64_t size, bool to_va)
{
    struct sim *s = sim_of(dev);
    if (!s || (size && !host))
        return FS_ERR_INVALID;
    pthread_mutex_lock(&s->lock);
    int rc = FS_OK;
    if (!range_mapped(s, va, size))
        rc = FS_ERR_INVALID;
    else
        host_xfer(s, va, host, size, to_va);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int fs_sim_write(struct fs_device *dev, fs_dptr dst, const void *src, uint64_t size)
{
    return host_access(dev, dst, (void *)(uintptr_t)src, size, true);
}

int fs_sim_read(struct fs_device *dev, void *dst, fs_dptr src, uint64_t size)
{
    return host_access(dev, src, dst, size, false);
}

int fs_sim_location(struct fs_device *dev, fs_dptr va, enum fs_mem_loc *loc)
{
    struct sim *s = sim_of(dev);
    if (!s || !loc)
        return FS_ERR_INVALID;
    pthread_mutex_lock(&s->lock);
    const struct sim_seg *g = seg_find(s, va);
    if (g)
        *loc = g->phys->loc;
    pthread_mutex_unlock(&s->lock);
    return g ? FS_OK : FS_ERR_NOT_FOUND;
}

void fs_sim_fail_nth(struct fs_device *dev, enum fs_sim_op op, uint64_t nth, int err)
{
    struct sim *s = sim_of(dev);
    if (!s || (int)op < 0 || op >= FS_SIM_OP_COUNT)
        return;
    pthread_mutex_lock(&s->lock);
    s->fail[op].countdown = nth;
    s->fail[op].err = err < 0 ? err : FS_ERR_DEVICE; /* a "failure" must be an error */
    pthread_mutex_unlock(&s->lock);
}

uint64_t fs_sim_fail_pending(struct fs_device *dev, enum fs_sim_op op)
{
    struct sim *s = sim_of(dev);
    if (!s || (int)op < 0 || op >= FS_SIM_OP_COUNT)
        return 0;
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->fail[op].countdown;
    pthread_mutex_unlock(&s->lock);
    return n;
}

void fs_sim_advance(struct fs_device *dev, uint64_t ns)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    uint64_t target = ns > UINT64_MAX - s->now_ns ? UINT64_MAX : s->now_ns + ns;
    run_until(s, target);
    pthread_mutex_unlock(&s->lock);
}

void fs_sim_advance_to(struct fs_device *dev, uint64_t t_ns)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    run_until(s, t_ns); /* never backwards */
    pthread_mutex_unlock(&s->lock);
}

void fs_sim_join_engine_clock(struct fs_device *dev)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    run_until(s, s->engine_ns);
    pthread_mutex_unlock(&s->lock);
}

uint64_t fs_sim_now_ns(struct fs_device *dev)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return 0;
    pthread_mutex_lock(&s->lock);
    uint64_t now = s->now_ns;
    pthread_mutex_unlock(&s->lock);
    return now;
}

void fs_sim_set_capturing(struct fs_device *dev, fs_stream stream, bool capturing)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    struct fs_stream_ *st = stream_of(s, stream);
    if (st && st->capturing != capturing) {
        st->capturing = capturing;
        if (capturing)
            s->ncapturing++;
        else
            s->ncapturing--;
    }
    pthread_mutex_unlock(&s->lock);
}

int fs_sim_register_kernel(struct fs_device *dev, const void *func, const uint32_t *offsets,
                           const uint32_t *sizes, int n)
{
    struct sim *s = sim_of(dev);
    if (!s || !func || n < 0 || n > FS_SIM_MAX_KERNEL_PARAMS || (n > 0 && (!offsets || !sizes)))
        return FS_ERR_INVALID;
    /* One allocation for both arrays; at least one element so malloc never sees zero. */
    uint32_t *mem = malloc(2 * ((size_t)n + 1) * sizeof(*mem));
    if (!mem)
        return FS_ERR_NOMEM;
    for (int i = 0; i < n; i++) {
        mem[i] = offsets[i];
        mem[(size_t)n + 1 + (size_t)i] = sizes[i];
    }
    struct sim_kernel k = {func, n, mem, mem + n + 1, ""};
    pthread_mutex_lock(&s->lock);
    int rc = FS_OK;
    struct sim_kernel *old = (struct sim_kernel *)kernel_find(s, func);
    snprintf(k.name, sizeof(k.name), "sim_kernel_%zu", old ? (size_t)(old - s->kernels)
                                                          : s->nkernels);
    if (old) {
        free(old->offsets);
        *old = k;
    } else if (fs_grow((void **)&s->kernels, &s->cap_kernels, s->nkernels + 1, sizeof(*s->kernels))) {
        s->kernels[s->nkernels++] = k;
    } else {
        free(mem);
        rc = FS_ERR_NOMEM;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void fs_sim_set_recorder(struct fs_device *dev, fs_sim_record_fn fn, void *arg)
{
    struct sim *s = sim_of(dev);
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->recorder = fn;
    s->recorder_arg = arg;
    pthread_mutex_unlock(&s->lock);
}

void fs_sim_get_stats(struct fs_device *dev, struct fs_sim_stats *out)
{
    struct sim *s = sim_of(dev);
    if (!s || !out)
        return;
    pthread_mutex_lock(&s->lock);
    *out = s->st;
    pthread_mutex_unlock(&s->lock);
}

/* Launch tracking through CUPTI driver-API callbacks: every kernel launch of every library
 * (PyTorch, cuBLAS with its static cudart, Triton) reaches cuLaunchKernel* in the driver, so one
 * subscription sees them all, before they are queued (API enter) and after (API exit).
 * Copies and memsets are seen too: the common ones (linear copies and memsets, synchronous and
 * asynchronous) reference the allocations at both ends of their device ranges; 2D/3D, peer and
 * batched copies and graph launches count as launches whose parameters are unknown (the next
 * remap synchronizes first).
 *
 * With LAUNCH_HOOK=entry the launches come from the driver entry points' wrappers (entry.c)
 * instead, through fs_shim_launch_enter/exit, and CUPTI keeps the copies and memsets. Its launch
 * callbacks stay on as a check until the plan has followed the program through two iterations:
 * a launch that no wrapper passed on is tracked here, and CUPTI then keeps reporting launches for
 * the rest of the run. After a check with no such launch, CUPTI reports no launches. */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "hook.h"
#include "log.h"
#include "shim.h"

/* cupti.h already includes generated_cuda_meta.h (the launch parameter structs). */

static CUpti_SubscriberHandle subscriber;
static FS_TLS struct fs_launch_ticket ticket;

/* LAUNCH_HOOK=entry: ENTRY_ON while the wrappers report launches (atomic; off while paused).
 * CHECK (atomic) is where CUPTI's launch check stands: CHECKING (CUPTI reports launches too, and
 * tracks any that no wrapper reported), CHECKED (CUPTI reports none), MISSED (a launch came past
 * the wrappers: CUPTI reports launches for the rest of the run and tracks the ones the wrappers
 * do not). It changes only by compare-and-swap or exchange, so a miss seen in a callback (which
 * must not take REPORT_LOCK: the thread switching CUPTI's reports holds it) and the check's end
 * cannot both win. LATE_MISS: a miss the check's end had already passed, for the next wrapper
 * call to act on outside any callback. */
enum { CHECKING, CHECKED, MISSED };
static bool entry_on, late_miss;
static int check = CHECKING;
static bool paused_now; /* the engine paused tracking (REPORT_LOCK) */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER; /* CUPTI's switches */
/* The calling thread is in a wrapper's call of the driver (IN_WRAPPER), and the wrapper reported
 * the launch (IN_ENTRY_LAUNCH): CUPTI's callbacks for it pass. */
static FS_TLS bool in_wrapper, in_entry_launch;
static FS_TLS unsigned entry_launches; /* this thread's, for spacing the check's look */
#define CHECK_EVERY 1024
#define CHECK_ITERATIONS 3 /* the plan's first launch reached 3 times: 2 iterations followed */

enum kind { KIND_NONE, KIND_KERNEL, KIND_OPAQUE, KIND_COPY };

static unsigned char cbid_kind[CUPTI_DRIVER_TRACE_CBID_SIZE];

/* Where a copy's or memset's device addresses, length and stream are in its parameters
 * (offsets; -1: absent). Its device ranges are [dst, dst + len) and [src, src + len). */
struct copy_layout {
    CUpti_CallbackId cbid;
    short dst, src, count, stream;
    unsigned char elem;   /* bytes per counted element (memsets count elements) */
    bool per_thread;      /* _ptds/_ptsz: no stream given means the per-thread stream */
};

#define F(name, field) ((short)offsetof(name##_params, field))
#define CBID(name) CUPTI_DRIVER_TRACE_CBID_##name
/* a copy between two device addresses, with and without a stream */
#define DD(name, d, s, pt) {CBID(name), F(name, d), F(name, s), F(name, ByteCount), -1, 1, pt}
#define DDS(name, d, s, pt)                                                                        \
    {CBID(name), F(name, d), F(name, s), F(name, ByteCount), F(name, hStream), 1, pt}
/* one device end (the other is host memory) */
#define D1(name, d, pt) {CBID(name), F(name, d), -1, F(name, ByteCount), -1, 1, pt}
#define D1S(name, d, pt) {CBID(name), F(name, d), -1, F(name, ByteCount), F(name, hStream), 1, pt}
/* memsets of 1, 2 or 4-byte elements */
#define MS(name, e, pt) {CBID(name), F(name, dstDevice), -1, F(name, N), -1, e, pt}
#define MSS(name, e, pt) {CBID(name), F(name, dstDevice), -1, F(name, N), F(name, hStream), e, pt}

static const struct copy_layout copy_layouts[] = {
    DD(cuMemcpy, dst, src, false), DD(cuMemcpy_ptds, dst, src, true),
    DDS(cuMemcpyAsync, dst, src, false), DDS(cuMemcpyAsync_ptsz, dst, src, true),
    DD(cuMemcpyDtoD_v2, dstDevice, srcDevice, false),
    DD(cuMemcpyDtoD_v2_ptds, dstDevice, srcDevice, true),
    DDS(cuMemcpyDtoDAsync_v2, dstDevice, srcDevice, false),
    DDS(cuMemcpyDtoDAsync_v2_ptsz, dstDevice, srcDevice, true),
    D1(cuMemcpyHtoD_v2, dstDevice, false), D1(cuMemcpyHtoD_v2_ptds, dstDevice, true),
    D1S(cuMemcpyHtoDAsync_v2, dstDevice, false), D1S(cuMemcpyHtoDAsync_v2_ptsz, dstDevice, true),
    D1(cuMemcpyDtoH_v2, srcDevice, false), D1(cuMemcpyDtoH_v2_ptds, srcDevice, true),
    D1S(cuMemcpyDtoHAsync_v2, srcDevice, false), D1S(cuMemcpyDtoHAsync_v2_ptsz, srcDevice, true),
    MS(cuMemsetD8_v2, 1, false), MS(cuMemsetD8_v2_ptds, 1, true),
    MS(cuMemsetD16_v2, 2, false), MS(cuMemsetD16_v2_ptds, 2, true),
    MS(cuMemsetD32_v2, 4, false), MS(cuMemsetD32_v2_ptds, 4, true),
    MSS(cuMemsetD8Async, 1, false), MSS(cuMemsetD8Async_ptsz, 1, true),
    MSS(cuMemsetD16Async, 2, false), MSS(cuMemsetD16Async_ptsz, 2, true),
    MSS(cuMemsetD32Async, 4, false), MSS(cuMemsetD32Async_ptsz, 4, true),
};

/* Index into copy_layouts by callback id, + 1 (0: not a parsed copy). */
static unsigned char copy_index[CUPTI_DRIVER_TRACE_CBID_SIZE];

/* The device addresses of a copy or memset: the first and last byte of each device range. */
static FS_TLS uint64_t copy_ptrs[4];

static void describe_copy(const struct copy_layout *l, const void *params,
                          struct fs_launch_desc *d)
{
    const char *p = params;
    size_t count;
    memcpy(&count, p + l->count, sizeof(count));
    uint64_t len = (uint64_t)count * l->elem;
    int n = 0;
    for (int k = 0; k < 2; k++) {
        short off = k == 0 ? l->dst : l->src;
        if (off < 0 || len == 0)
            continue;
        CUdeviceptr a;
        memcpy(&a, p + off, sizeof(a));
        copy_ptrs[n++] = a;
        copy_ptrs[n++] = a + len - 1;
    }
    d->ptrs = copy_ptrs;
    d->nptrs = n;
    CUstream st = NULL;
    if (l->stream >= 0)
        memcpy(&st, p + l->stream, sizeof(st));
    d->stream = st == NULL && l->per_thread ? (fs_stream)CU_STREAM_PER_THREAD : (fs_stream)st;
}

/* The packed parameter buffer of a launch's `extra` list, if it has one. */
static void parse_extra(void **extra, struct fs_launch_desc *d)
{
    if (!extra)
        return;
    for (int i = 0; i < 32 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            d->param_buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            d->param_buf_size = *(size_t *)extra[i + 1];
    }
    if (d->param_buf && d->param_buf_size == 0)
        d->unreadable = true;
}

/* Fill D from the driver call's parameters; false when this callback is not a launch. */
static bool describe(CUpti_CallbackId cbid, const void *params, struct fs_launch_desc *d)
{
    memset(d, 0, sizeof(*d));
    bool ptsz = false;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        ptsz = true;
        __attribute__((fallthrough));
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: {
        const cuLaunchKernel_params *p = params;
        d->func = p->f;
        d->stream = (fs_stream)p->hStream;
        d->kernel_params = (void *const *)p->kernelParams;
        parse_extra(p->extra, d);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
        ptsz = true;
        __attribute__((fallthrough));
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: {
        const cuLaunchKernelEx_params *p = params;
        d->func = p->f;
        d->stream = p->config ? (fs_stream)p->config->hStream : NULL;
        d->kernel_params = (void *const *)p->kernelParams;
        parse_extra(p->extra, d);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        ptsz = true;
        __attribute__((fallthrough));
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel: {
        const cuLaunchCooperativeKernel_params *p = params;
        d->func = p->f;
        d->stream = (fs_stream)p->hStream;
        d->kernel_params = (void *const *)p->kernelParams;
        break;
    }
    default:
        if (cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE)
            return false;
        if (cbid_kind[cbid] == KIND_COPY) {
            describe_copy(&copy_layouts[copy_index[cbid] - 1], params, d);
            return true;
        }
        if (cbid_kind[cbid] != KIND_OPAQUE)
            return false;
        d->unreadable = true; /* other copies and memsets, graph launches */
        return true;
    }
    if (!d->kernel_params && !d->param_buf)
        d->unreadable = true;
    if (ptsz && d->stream == NULL)
        d->stream = (fs_stream)CU_STREAM_PER_THREAD;
    return true;
}

static bool missed_launch(const CUpti_CallbackData *cb);

static void CUPTIAPI on_driver_call(void *userdata, CUpti_CallbackDomain domain,
                                    CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    /* Our own driver calls (copies on the engine's streams) run inside the shim or on the
     * engine's threads; a launch a wrapper reported is the wrapper's. */
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || fs_hook_depth > 0 || fs_thread_internal ||
        in_entry_launch)
        return;
    const CUpti_CallbackData *cb = data;
    fs_hook_depth++;
    if (cb->callbackSite == CUPTI_API_ENTER) {
        struct fs_launch_desc d;
        bool track = describe(cbid, cb->functionParams, &d);
        if (FS_UNLIKELY(track && cbid_kind[cbid] == KIND_KERNEL && !in_wrapper &&
                        __atomic_load_n(&entry_on, __ATOMIC_SEQ_CST)))
            track = missed_launch(cb);
        if (track)
            fs_engine_launch_enter(&d, &ticket);
        else
            ticket.active = false;
    } else if (ticket.active) {
        const CUresult *res = cb->functionReturnValue;
        fs_engine_launch_exit(&ticket, res && *res == CUDA_SUCCESS);
    }
    fs_hook_depth--;
}

static bool name_starts(const char *name, const char *prefix)
{
    return strncmp(name, prefix, strlen(prefix)) == 0;
}

/* Have CUPTI report driver call CBID (ON) or stop reporting it. */
static int report(CUpti_CallbackId cbid, bool on)
{
    CUptiResult r = fs_cuda.cuptiEnableCallback(on, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, cbid);
    if (r != CUPTI_SUCCESS) {
        const char *msg = "?";
        fs_cuda.cuptiGetResultString(r, &msg);
        FS_WARN("CUPTI refused to %s driver call %u (%s)", on ? "report" : "stop reporting",
                (unsigned)cbid, msg);
        return FS_ERR_DEVICE;
    }
    return FS_OK;
}

/* Whether CUPTI reports driver call CBID while tracking is on. */
static bool reported(uint32_t cbid)
{
    return cbid_kind[cbid] != KIND_NONE &&
           (cbid_kind[cbid] != KIND_KERNEL || __atomic_load_n(&check, __ATOMIC_SEQ_CST) != CHECKED);
}

int fs_shim_tracking_pause(bool paused)
{
    int rc = FS_OK;
    pthread_mutex_lock(&report_lock);
    for (uint32_t cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE; cbid++)
        if (reported(cbid) && report(cbid, !paused) != FS_OK)
            rc = FS_ERR_DEVICE;
    paused_now = paused;
    __atomic_store_n(&entry_on, fs_shim_entry_mode && !paused, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&report_lock);
    return rc;
}

/* ---- LAUNCH_HOOK=entry -------------------------------------------------------------------------- */
/* Have CUPTI report the launch functions (ON) or not, all of them or none: FS_OK when done.
 * REPORT_LOCK held. */
static int report_launches(bool on)
{
    int rc = FS_OK;
    for (uint32_t cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE && rc == FS_OK; cbid++)
        if (cbid_kind[cbid] == KIND_KERNEL)
            rc = report(cbid, on);
    if (rc != FS_OK && !on)
        report_launches(true);
    return rc;
}

/* CUPTI reports launches again for the rest of the run (MISSED), WHY said once. Never inside a
 * CUPTI callback. */
static void back_to_cupti(const char *why)
{
    pthread_mutex_lock(&report_lock);
    __atomic_store_n(&late_miss, false, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&check, __ATOMIC_SEQ_CST) == CHECKED && !paused_now &&
        report_launches(true) != FS_OK)
        FS_WARN("LAUNCH_HOOK=entry: CUPTI would not report launches again; launches that reach the "
                "driver past flexshim's wrappers go unseen");
    if (__atomic_exchange_n(&check, MISSED, __ATOMIC_SEQ_CST) != MISSED)
        FS_WARN("LAUNCH_HOOK=entry: %s; launches are watched through CUPTI as well for the rest of "
                "the run",
                why);
    pthread_mutex_unlock(&report_lock);
}

bool fs_shim_launch_enter(CUpti_CallbackId cbid, const void *params)
{
    in_wrapper = true;
    if (!__atomic_load_n(&entry_on, __ATOMIC_SEQ_CST) || fs_hook_depth > 0 || fs_thread_internal)
        return false;
    fs_hook_depth++;
    struct fs_launch_desc d;
    describe(cbid, params, &d);
    fs_engine_launch_enter(&d, &ticket);
    fs_hook_depth--;
    in_entry_launch = true;
    return true;
}

/* The check's end: two iterations followed with every launch through a wrapper. */
static void end_check(void)
{
    pthread_mutex_lock(&report_lock);
    int want = CHECKING;
    if (__atomic_load_n(&check, __ATOMIC_SEQ_CST) != CHECKING || paused_now ||
        report_launches(false) != FS_OK)
        goto out; /* (CUPTI refused: it goes on checking, and the next look tries again) */
    if (!__atomic_compare_exchange_n(&check, &want, CHECKED, false, __ATOMIC_SEQ_CST,
                                     __ATOMIC_SEQ_CST)) {
        report_launches(true); /* a miss meanwhile: CUPTI tracks launches again */
        goto out;
    }
    FS_INFO("LAUNCH_HOOK=entry: every launch of %d iterations came through the driver's entry "
            "points; CUPTI reports no launches from now on",
            CHECK_ITERATIONS - 1);
out:
    pthread_mutex_unlock(&report_lock);
}

void fs_shim_launch_exit(bool tracked, bool queued)
{
    in_wrapper = in_entry_launch = false;
    if (!tracked)
        return;
    if (ticket.active) {
        fs_hook_depth++;
        fs_engine_launch_exit(&ticket, queued);
        fs_hook_depth--;
    }
    if (FS_UNLIKELY(__atomic_load_n(&late_miss, __ATOMIC_RELAXED)))
        back_to_cupti("a launch reached the driver through no entry point that flexshim wraps "
                      "as its check ended");
    else if (FS_UNLIKELY(++entry_launches % CHECK_EVERY == 0) &&
             __atomic_load_n(&check, __ATOMIC_RELAXED) == CHECKING &&
             fs_engine_iterations_followed() >= CHECK_ITERATIONS)
        end_check();
}

void fs_shim_entry_unwrapped(const char *name)
{
    char why[128];
    snprintf(why, sizeof(why), "%s was handed out unwrapped (more variants than it has room for)",
             name);
    back_to_cupti(why);
}

/* In a CUPTI callback: a launch reached the driver past the wrappers (ENTRY_ON, and not inside a
 * wrapper); true when it is to be tracked here. While the check runs, CUPTI reports launches for
 * the rest of the run from now on (MISSED) and tracks the ones no wrapper reported. Where the
 * check has just ended, CUPTI may not report this launch's exit, so it goes untracked, and the
 * next wrapper call has CUPTI report launches again. */
static bool missed_launch(const CUpti_CallbackData *cb)
{
    int want = CHECKING;
    if (__atomic_compare_exchange_n(&check, &want, MISSED, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST)) {
        FS_WARN("LAUNCH_HOOK=entry: a launch of %s (%s) reached the driver through no entry point "
                "that flexshim wraps; launches are watched through CUPTI as well for the rest of "
                "the run",
                cb->symbolName ? cb->symbolName : "a kernel", cb->functionName);
        return true;
    }
    if (want == MISSED)
        return true;
    __atomic_store_n(&late_miss, true, __ATOMIC_SEQ_CST);
    return false;
}

int fs_shim_tracking_start(void)
{
    if (fs_cuda_load_cupti() != FS_OK) {
        FS_WARN("CUPTI (libcupti.so.13) was not found, so kernel launches cannot be seen; put "
                "the CUDA toolkit's CUPTI on LD_LIBRARY_PATH");
        return FS_ERR_UNSUPPORTED;
    }
    char other[256] = "";
    CUpti_SubscriberParams sp = {
        .structSize = CUpti_SubscriberParams_STRUCT_SIZE,
        .subscriberName = "flexshim",
        .oldSubscriberName = other,
        .oldSubscriberSize = sizeof(other),
    };
    CUptiResult r = fs_cuda.cuptiSubscribe_v2(&subscriber, on_driver_call, NULL, &sp);
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        FS_WARN("CUPTI is already in use by %s (a profiler such as torch.profiler, nsys or "
                "compute-sanitizer): flexshim cannot see kernel launches; run without the "
                "profiler to use flexshim",
                other[0] ? other : "another tool");
        return FS_ERR_UNSUPPORTED;
    }
    if (r != CUPTI_SUCCESS) {
        const char *msg = "?";
        fs_cuda.cuptiGetResultString(r, &msg);
        FS_WARN("CUPTI subscription failed (%s): kernel launches cannot be seen", msg);
        return FS_ERR_UNSUPPORTED;
    }
    static const CUpti_CallbackId launches[] = {
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    };
    int rc = FS_OK;
    for (size_t i = 0; i < FS_ARRAY_LEN(launches) && rc == FS_OK; i++) {
        cbid_kind[launches[i]] = KIND_KERNEL;
        rc = report(launches[i], true);
    }
    for (size_t i = 0; i < FS_ARRAY_LEN(copy_layouts) && rc == FS_OK; i++) {
        cbid_kind[copy_layouts[i].cbid] = KIND_COPY;
        copy_index[copy_layouts[i].cbid] = (unsigned char)(i + 1);
        rc = report(copy_layouts[i].cbid, true);
    }
    /* Everything else that can touch device memory from the GPU side, found by name so every
     * versioned and per-thread variant is included. */
    for (uint32_t cbid = 1; cbid < CUPTI_DRIVER_TRACE_CBID_SIZE && rc == FS_OK; cbid++) {
        const char *name = NULL;
        if (cbid_kind[cbid] != KIND_NONE ||
            fs_cuda.cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, cbid, &name) !=
                CUPTI_SUCCESS ||
            !name)
            continue;
        if (name_starts(name, "cuMemcpy") || name_starts(name, "cuMemset") ||
            name_starts(name, "cuGraphLaunch")) {
            cbid_kind[cbid] = KIND_OPAQUE;
            rc = report(cbid, true);
        }
    }
    if (rc != FS_OK) {
        fs_cuda.cuptiUnsubscribe(subscriber);
        /* Unmarked, so that a later start (a paused run resuming) reports them all again. */
        memset(cbid_kind, KIND_NONE, sizeof(cbid_kind));
        memset(copy_index, 0, sizeof(copy_index));
        FS_WARN("CUPTI would not report every driver call that touches device memory, so kernel "
                "launches cannot be tracked");
        return FS_ERR_UNSUPPORTED;
    }
    pthread_mutex_lock(&report_lock);
    paused_now = false;
    __atomic_store_n(&entry_on, fs_shim_entry_mode, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&report_lock);
    FS_DEBUG("launch tracking through %s is on",
             fs_shim_entry_mode ? "the driver's entry points" : "CUPTI");
    return FS_OK;
}

/* libfs_entry_probe.so: a benchmark-only experiment, not part of the library. Can the launch hook
 * see every kernel launch without CUPTI, by handing the program wrappers for the driver's launch
 * entry points, and what does that cost a launch? (CUPTI's callbacks cost the 7b decode step
 * about 2 us a launch, docs/PERFORMANCE.md, stop 33.)
 *
 * The CUDA runtime (libcudart, and the static copy inside cuBLAS) opens libcuda.so.1 and asks it
 * for cuGetProcAddress with dlsym; every other driver function then comes from cuGetProcAddress.
 * Triton's launcher asks dlsym for cuLaunchKernelEx (or cuGetProcAddress) itself. So this library
 * exports dlsym: asked for cuGetProcAddress(_v2) it returns a wrapper of it, and that wrapper
 * hands out wrappers for cuLaunchKernel and cuLaunchKernelEx (each driver variant it returns,
 * per-thread-stream ones included); asked for a launch function by name it returns the wrapper
 * too. A wrapper counts the launch and calls the driver's function: the least an entry-point hook
 * can cost.
 *
 *     LD_PRELOAD=dist/lib/libfs_entry_probe.so python3 bench/bench.py ...
 *     ENTRY_PROBE_CUPTI=1 ...: also subscribe to CUPTI's launch callbacks and count the launches
 *                              the driver saw that no wrapper passed on (coverage)
 *
 * At exit one line on stderr (from a process that reached the driver): "entry_probe: pid P: N launches through the wrappers (...); CUPTI saw M,
 * B not through a wrapper (the first ones' kernels ...)". bench/overhead.sh runs it as the
 * sides `entry` (cost, against noshim) and `entrycheck` (coverage, with CUPTI). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef PFN_cuGetProcAddress_v12000 gpa_v2_fn; /* the toolkit's types (cudaTypedefs.h) */
typedef PFN_cuGetProcAddress_v11030 gpa_v1_fn;

static dlsym_fn real_dlsym;
static gpa_v2_fn real_gpa_v2;
static gpa_v1_fn real_gpa_v1;

/* Each distinct driver function handed out gets a slot: its real address and a wrapper of its
 * own. A launch function beyond the slots is handed out unwrapped and counted. */
#define SLOTS 8
static void *slot_real[SLOTS];
static uint64_t slot_calls[SLOTS];
static const char *slot_name[SLOTS];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t gpa_queries, unwrapped, next_lookups;

static __thread __attribute__((tls_model("initial-exec"))) int in_wrapper;

#define LAUNCH_WRAPPER(k)                                                                          \
    static CUresult launch_##k(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,   \
                               unsigned by, unsigned bz, unsigned sm, CUstream s, void **p,        \
                               void **e)                                                           \
    {                                                                                              \
        __atomic_add_fetch(&slot_calls[k], 1, __ATOMIC_RELAXED);                                   \
        in_wrapper++;                                                                              \
        CUresult r = ((PFN_cuLaunchKernel_v4000)slot_real[k])(f, gx, gy, gz, bx, by, bz, sm, s, p, e);            \
        in_wrapper--;                                                                              \
        return r;                                                                                  \
    }                                                                                              \
    static CUresult launch_ex_##k(const CUlaunchConfig *c, CUfunction f, void **p, void **e)       \
    {                                                                                              \
        __atomic_add_fetch(&slot_calls[k], 1, __ATOMIC_RELAXED);                                   \
        in_wrapper++;                                                                              \
        CUresult r = ((PFN_cuLaunchKernelEx_v11060)slot_real[k])(c, f, p, e);                                     \
        in_wrapper--;                                                                              \
        return r;                                                                                  \
    }
LAUNCH_WRAPPER(0) LAUNCH_WRAPPER(1) LAUNCH_WRAPPER(2) LAUNCH_WRAPPER(3)
LAUNCH_WRAPPER(4) LAUNCH_WRAPPER(5) LAUNCH_WRAPPER(6) LAUNCH_WRAPPER(7)
static void *const wrap_plain[SLOTS] = {launch_0, launch_1, launch_2, launch_3,
                                        launch_4, launch_5, launch_6, launch_7};
static void *const wrap_ex[SLOTS] = {launch_ex_0, launch_ex_1, launch_ex_2, launch_ex_3,
                                     launch_ex_4, launch_ex_5, launch_ex_6, launch_ex_7};

/* 1: a cuLaunchKernel variant, 2: a cuLaunchKernelEx variant, 0: neither. */
static int launch_kind(const char *name)
{
    if (!strcmp(name, "cuLaunchKernel") || !strcmp(name, "cuLaunchKernel_ptsz"))
        return 1;
    if (!strcmp(name, "cuLaunchKernelEx") || !strcmp(name, "cuLaunchKernelEx_ptsz"))
        return 2;
    return 0;
}

/* The wrapper standing for REAL, a launch function of KIND. */
static void *wrap(void *real, int kind)
{
    if (!real || !kind)
        return real;
    void *out = real;
    pthread_mutex_lock(&slot_lock);
    int k = 0;
    while (k < SLOTS && slot_real[k] && slot_real[k] != real)
        k++;
    if (k == SLOTS) {
        unwrapped++;
    } else {
        if (!slot_real[k]) {
            Dl_info info; /* the driver's own name for it (a _ptsz variant), where it has one */
            slot_name[k] = dladdr(real, &info) && info.dli_sname ? info.dli_sname
                           : kind == 1                            ? "cuLaunchKernel"
                                                                  : "cuLaunchKernelEx";
            __atomic_store_n(&slot_real[k], real, __ATOMIC_RELEASE);
        }
        out = kind == 1 ? wrap_plain[k] : wrap_ex[k];
    }
    pthread_mutex_unlock(&slot_lock);
    return out;
}

static CUresult gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status);
static CUresult gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags);

/* What a lookup of SYMBOL that found REAL hands out instead. V2_ABI: a "cuGetProcAddress" found
 * is the five-argument cuGetProcAddress_v2 (asked of cuGetProcAddress for CUDA 12 or later; the
 * library's exported "cuGetProcAddress" is the four-argument one). */
static void *substitute(const char *symbol, void *real, bool v2_abi)
{
    if (!real || !symbol)
        return real;
    bool gpa = !strcmp(symbol, "cuGetProcAddress");
    if (!strcmp(symbol, "cuGetProcAddress_v2") || (gpa && (v2_abi || real == (void *)real_gpa_v2))) {
        real_gpa_v2 = (gpa_v2_fn)real;
        return (void *)gpa_v2;
    }
    if (gpa) {
        real_gpa_v1 = (gpa_v1_fn)real;
        return (void *)gpa_v1;
    }
    return wrap(real, launch_kind(symbol));
}

static CUresult gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    __atomic_add_fetch(&gpa_queries, 1, __ATOMIC_RELAXED);
    CUresult r = real_gpa_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = substitute(symbol, *pfn, version >= 12000);
    return r;
}

static CUresult gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    __atomic_add_fetch(&gpa_queries, 1, __ATOMIC_RELAXED);
    CUresult r = real_gpa_v1(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = substitute(symbol, *pfn, version >= 12000);
    return r;
}

EXPORT void *dlsym(void *handle, const char *symbol)
{
    dlsym_fn d = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
    if (!d) {
        d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!d)
            d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (!d)
            return NULL;
        __atomic_store_n(&real_dlsym, d, __ATOMIC_RELEASE);
    }
    /* RTLD_NEXT is relative to the caller, and resolved here relative to this library, which
     * comes first: the same for any caller but another preloaded interposer (counted). */
    if (handle == RTLD_NEXT)
        __atomic_add_fetch(&next_lookups, 1, __ATOMIC_RELAXED);
    return substitute(symbol, d(handle, symbol), false);
}

/* ---- ENTRY_PROBE_CUPTI=1: what the driver saw that no wrapper passed on ----------------------- */
static uint64_t cupti_seen, cupti_missed;
static char missed_names[3][96];

static void CUPTIAPI on_launch(void *u, CUpti_CallbackDomain dom, CUpti_CallbackId cbid,
                               const void *data)
{
    (void)u, (void)dom, (void)cbid;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite != CUPTI_API_ENTER)
        return;
    __atomic_add_fetch(&cupti_seen, 1, __ATOMIC_RELAXED);
    if (in_wrapper)
        return;
    uint64_t n = __atomic_fetch_add(&cupti_missed, 1, __ATOMIC_RELAXED);
    if (n < 3)
        snprintf(missed_names[n], sizeof(missed_names[n]), "%s via %s",
                 cb->symbolName ? cb->symbolName : "?", cb->functionName);
}

static void cupti_check_start(void)
{
    void *h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "entry_probe: ENTRY_PROBE_CUPTI=1 but libcupti.so.13 did not load\n");
        return;
    }
    CUptiResult (*subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *) =
        (CUptiResult(*)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *))dlsym(
            h, "cuptiSubscribe");
    CUptiResult (*enable)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                          CUpti_CallbackId) =
        (CUptiResult(*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                        CUpti_CallbackId))dlsym(h, "cuptiEnableCallback");
    CUpti_SubscriberHandle sub;
    if (!subscribe || !enable || subscribe(&sub, on_launch, NULL) != CUPTI_SUCCESS) {
        fprintf(stderr, "entry_probe: CUPTI subscription failed\n");
        return;
    }
    static const CUpti_CallbackId ids[] = {
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        if (enable(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, ids[i]) != CUPTI_SUCCESS)
            fprintf(stderr, "entry_probe: CUPTI refused callback %u\n", (unsigned)ids[i]);
}

__attribute__((constructor)) static void probe_init(void)
{
    const char *c = getenv("ENTRY_PROBE_CUPTI");
    if (c && !strcmp(c, "1"))
        cupti_check_start();
}

__attribute__((destructor)) static void probe_report(void)
{
    if (!gpa_queries && !slot_real[0] && !cupti_seen)
        return; /* a process that never reached the driver (the program's helpers) */
    uint64_t total = 0;
    char slots[256] = "";
    size_t len = 0;
    for (int k = 0; k < SLOTS && slot_real[k]; k++) {
        total += slot_calls[k];
        len += (size_t)snprintf(slots + len, sizeof(slots) - len, "%s%s@%p %llu",
                                k ? ", " : "", slot_name[k], slot_real[k],
                                (unsigned long long)slot_calls[k]);
        if (len >= sizeof(slots))
            break;
    }
    char missed[320] = "";
    len = 0;
    for (uint64_t i = 0; i < cupti_missed && i < 3 && len < sizeof(missed); i++)
        len += (size_t)snprintf(missed + len, sizeof(missed) - len, "%s%s", i ? "; " : " (first: ",
                                missed_names[i]);
    if (cupti_missed && len < sizeof(missed))
        snprintf(missed + len, sizeof(missed) - len, ")");
    fprintf(stderr,
            "entry_probe: pid %d: %llu launches through the wrappers (%s); %llu cuGetProcAddress queries, "
            "%llu launch functions handed out unwrapped, %llu RTLD_NEXT lookups; CUPTI saw %llu, "
            "%llu not through a wrapper%s\n",
            (int)getpid(), (unsigned long long)total, slots, (unsigned long long)gpa_queries,
            (unsigned long long)unwrapped, (unsigned long long)next_lookups,
            (unsigned long long)cupti_seen, (unsigned long long)cupti_missed, missed);
}

/* Launch tracking at the driver's entry points (LAUNCH_HOOK=entry).
 *
 * CUPTI's launch callbacks cost a launch-bound program about 2 us a launch, the driver's path for
 * a subscriber included (docs/PERFORMANCE.md, stop 33). Every library reaches the driver's launch
 * functions by name: the CUDA runtime (and the static copy inside cuBLAS) asks dlsym for
 * cuGetProcAddress and then cuGetProcAddress for the rest, and Triton asks dlsym or
 * cuGetProcAddress. So this file exports dlsym, wraps cuGetProcAddress, and hands out wrappers of
 * the launch functions that report to the same enter and exit as CUPTI's callbacks (cupti.c).
 * Copies and memsets stay with CUPTI, whose launch callbacks check the wrappers' coverage for a
 * while (cupti.c): a program linked against libcuda, calling its launch functions by symbol,
 * is one that check finds. (The launch functions themselves are not exported: the driver's own
 * references to them could bind to ours.)
 *
 * With LAUNCH_HOOK=cupti (or before the configuration is read) lookups are not substituted. */
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include <cudaTypedefs.h>

#ifndef __OPTIMIZE__
#error "shim/entry.c must be built with optimisation (-O1 or more): dlsym forwards by a tail call"
#endif

#include "engine.h"
#include "hook.h"
#include "shim.h"

/* The driver functions' types: the toolkit's (cudaTypedefs.h), each named by the version that
 * introduced its signature. */
typedef void *(*dlsym_fn)(void *, const char *);
typedef PFN_cuGetProcAddress_v12000 gpa_v2_fn; /* five arguments: cuGetProcAddress_v2 */
typedef PFN_cuGetProcAddress_v11030 gpa_v1_fn;

static dlsym_fn real_dlsym;
static gpa_v2_fn real_gpa_v2;
static gpa_v1_fn real_gpa_v1;
bool fs_shim_entry_mode;

/* ---- the launch wrappers -----------------------------------------------------------------------
 * Each driver function handed out gets a slot of its kind: its address, and its CUPTI callback id
 * (the per-thread-stream variant's where the driver gave that one), which says how describe()
 * reads the arguments. A slot's wrapper calls its own function. */
enum kind { K_PLAIN, K_EX, K_COOP, NKINDS };
#define NSLOTS 4

struct slot {
    void *real;
    CUpti_CallbackId cbid;
};
static struct slot slots[NKINDS][NSLOTS];
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

static inline CUresult call_plain(void *fn, CUpti_CallbackId cbid, CUfunction f, unsigned gx,
                                  unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                  unsigned sm, CUstream s, void **p, void **e)
{
    cuLaunchKernel_params args = {f, gx, gy, gz, bx, by, bz, sm, s, p, e};
    bool tracked = fs_shim_launch_enter(cbid, &args);
    CUresult r = ((PFN_cuLaunchKernel_v4000)fn)(f, gx, gy, gz, bx, by, bz, sm, s, p, e);
    fs_shim_launch_exit(tracked, r == CUDA_SUCCESS);
    return r;
}

static inline CUresult call_ex(void *fn, CUpti_CallbackId cbid, const CUlaunchConfig *c,
                               CUfunction f, void **p, void **e)
{
    cuLaunchKernelEx_params args = {c, f, p, e};
    bool tracked = fs_shim_launch_enter(cbid, &args);
    CUresult r = ((PFN_cuLaunchKernelEx_v11060)fn)(c, f, p, e);
    fs_shim_launch_exit(tracked, r == CUDA_SUCCESS);
    return r;
}

static inline CUresult call_coop(void *fn, CUpti_CallbackId cbid, CUfunction f, unsigned gx,
                                 unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                 unsigned sm, CUstream s, void **p)
{
    cuLaunchCooperativeKernel_params args = {f, gx, gy, gz, bx, by, bz, sm, s, p};
    bool tracked = fs_shim_launch_enter(cbid, &args);
    CUresult r = ((PFN_cuLaunchCooperativeKernel_v9000)fn)(f, gx, gy, gz, bx, by, bz, sm, s, p);
    fs_shim_launch_exit(tracked, r == CUDA_SUCCESS);
    return r;
}

#define PLAIN_ARGS                                                                                 \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,    \
        unsigned sm, CUstream s, void **p
#define SLOT_WRAPPERS(k)                                                                           \
    static CUresult plain_##k(PLAIN_ARGS, void **e)                                                \
    {                                                                                              \
        const struct slot *sl = &slots[K_PLAIN][k];                                                \
        return call_plain(sl->real, sl->cbid, f, gx, gy, gz, bx, by, bz, sm, s, p, e);             \
    }                                                                                              \
    static CUresult ex_##k(const CUlaunchConfig *c, CUfunction f, void **p, void **e)              \
    {                                                                                              \
        const struct slot *sl = &slots[K_EX][k];                                                   \
        return call_ex(sl->real, sl->cbid, c, f, p, e);                                            \
    }                                                                                              \
    static CUresult coop_##k(PLAIN_ARGS)                                                           \
    {                                                                                              \
        const struct slot *sl = &slots[K_COOP][k];                                                 \
        return call_coop(sl->real, sl->cbid, f, gx, gy, gz, bx, by, bz, sm, s, p);                 \
    }
SLOT_WRAPPERS(0)
SLOT_WRAPPERS(1)
SLOT_WRAPPERS(2)
SLOT_WRAPPERS(3)
static void *const wrappers[NKINDS][NSLOTS] = {
    {(void *)plain_0, (void *)plain_1, (void *)plain_2, (void *)plain_3},
    {(void *)ex_0, (void *)ex_1, (void *)ex_2, (void *)ex_3},
    {(void *)coop_0, (void *)coop_1, (void *)coop_2, (void *)coop_3},
};

/* The launch functions by name: kind and callback ids (plain, per-thread stream). */
static const struct {
    const char *name;
    enum kind kind;
    CUpti_CallbackId cbid, cbid_ptsz;
} launch_names[] = {
    {"cuLaunchKernel", K_PLAIN, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
     CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz},
    {"cuLaunchKernelEx", K_EX, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
     CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz},
    {"cuLaunchCooperativeKernel", K_COOP, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
     CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz},
};

/* Which launch function NAME is (an index into launch_names, -1: none); PTSZ set for a name
 * ending in _ptsz. */
static int launch_index(const char *name, bool *ptsz)
{
    for (size_t i = 0; i < FS_ARRAY_LEN(launch_names); i++) {
        size_t n = strlen(launch_names[i].name);
        if (strncmp(name, launch_names[i].name, n) != 0)
            continue;
        if (name[n] == '\0' || !strcmp(name + n, "_ptsz")) {
            *ptsz = name[n] != '\0';
            return (int)i;
        }
    }
    return -1;
}

/* The wrapper standing for REAL, the launch function launch_names[I] (its per-thread-stream
 * variant if PTSZ); REAL itself when the slots are full, and launch tracking then goes back to
 * CUPTI. */
static void *wrap(void *real, int i, bool ptsz)
{
    enum kind k = launch_names[i].kind;
    CUpti_CallbackId cbid = ptsz ? launch_names[i].cbid_ptsz : launch_names[i].cbid;
    void *out = real;
    pthread_mutex_lock(&slot_lock);
    for (int n = 0; n < NSLOTS; n++) {
        struct slot *sl = &slots[k][n];
        if (!sl->real) {
            sl->cbid = cbid;
            __atomic_store_n(&sl->real, real, __ATOMIC_RELEASE);
        }
        if (sl->real == real && sl->cbid == cbid) {
            out = wrappers[k][n];
            break;
        }
    }
    pthread_mutex_unlock(&slot_lock);
    if (out == real)
        fs_shim_entry_unwrapped(launch_names[i].name);
    return out;
}

/* ---- lookups ------------------------------------------------------------------------------------ */
/* The sanitizer runtime looks its functions up through dlsym (this one, exported) before it has
 * set itself up, so the path of a lookup that substitutes nothing is not instrumented. */
#define NOT_INSTRUMENTED __attribute__((no_sanitize("address", "undefined")))

static CUresult gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status);
static CUresult gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags);

/* A lookup of SYMBOL may be substituted: LAUNCH_HOOK=entry, and cuGetProcAddress or a launch
 * function. */
NOT_INSTRUMENTED static bool substitutable(const char *symbol)
{
    bool ptsz;
    return fs_shim_entry_mode && symbol && symbol[0] == 'c' &&
           symbol[1] == 'u' &&
           (!strncmp(symbol, "cuGetProcAddress", 16) || launch_index(symbol, &ptsz) >= 0);
}

/* What a lookup of SYMBOL that found REAL hands out instead (LAUNCH_HOOK=entry). PTSZ_FLAG:
 * cuGetProcAddress was asked for the per-thread default stream's variant. GPA_V2_ABI: a
 * "cuGetProcAddress" found is the five-argument cuGetProcAddress_v2 (asked of cuGetProcAddress for
 * CUDA 12 or later; the library's exported "cuGetProcAddress" is the four-argument one).
 * flexshim's own lookups get wrappers too, which pass its launches (engine threads, inside a hook)
 * straight on. */
static void *substitute(const char *symbol, void *real, bool ptsz_flag, bool gpa_v2_abi)
{
    if (!real || !symbol)
        return real;
    bool gpa = !strcmp(symbol, "cuGetProcAddress");
    if (!strcmp(symbol, "cuGetProcAddress_v2") ||
        (gpa && (gpa_v2_abi || real == (void *)real_gpa_v2))) {
        __atomic_store_n(&real_gpa_v2, (gpa_v2_fn)real, __ATOMIC_RELEASE);
        return (void *)gpa_v2;
    }
    if (gpa) {
        __atomic_store_n(&real_gpa_v1, (gpa_v1_fn)real, __ATOMIC_RELEASE);
        return (void *)gpa_v1;
    }
    bool ptsz;
    int i = launch_index(symbol, &ptsz);
    return i < 0 ? real : wrap(real, i, ptsz || ptsz_flag);
}

static CUresult gpa_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    CUresult r = real_gpa_v2(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = substitute(symbol, *pfn, flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                          version >= 12000);
    return r;
}

static CUresult gpa_v1(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CUresult r = real_gpa_v1(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn)
        *pfn = substitute(symbol, *pfn, flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                          version >= 12000);
    return r;
}

NOT_INSTRUMENTED static dlsym_fn next_dlsym(void)
{
    dlsym_fn d = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
    if (FS_LIKELY(d != NULL))
        return d;
    /* glibc 2.34 moved dlsym into libc under a new version; older ones have only the first. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.17", "GLIBC_2.2.5"};
    for (size_t i = 0; i < FS_ARRAY_LEN(versions) && !d; i++)
        d = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&real_dlsym, d, __ATOMIC_RELEASE);
    return d;
}

/* Every lookup but one to substitute is the real dlsym's own, by a tail call (a jump), so the
 * return address it reads is still the caller's: RTLD_NEXT, and the namespace RTLD_DEFAULT
 * searches, are the caller's. */
NOT_INSTRUMENTED __attribute__((optimize("optimize-sibling-calls"))) FS_EXPORT void *
dlsym(void *handle, const char *symbol)
{
    dlsym_fn d = next_dlsym();
    if (!d)
        return NULL;
    if (handle == RTLD_NEXT || !substitutable(symbol))
        return d(handle, symbol);
    void *real = d(handle, symbol);
    if (!real && handle == RTLD_DEFAULT) {
        /* The caller's own scope may hold the driver where flexshim's does not (a library opened
         * RTLD_LOCAL with its libcuda): the driver already loaded, asked directly. */
        void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            real = d(h, symbol);
            dlclose(h);
        }
    }
    return substitute(symbol, real, false, false);
}

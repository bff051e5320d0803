#include "cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "fs.h"
#include "log.h"

struct fs_cuda_api fs_cuda;

static pthread_once_t driver_once = PTHREAD_ONCE_INIT;
static int driver_result = FS_ERR_UNSUPPORTED;
static pthread_once_t cupti_once = PTHREAD_ONCE_INIT;
static int cupti_result = FS_ERR_UNSUPPORTED;

/* Two-level stringizing so the cuda.h renames (cuMemGetInfo -> cuMemGetInfo_v2) are applied. */
#define FS_STR_(x) #x
#define FS_XSTR_(x) FS_STR_(x)

/* Resolve every name of a list from HANDLE; fails on the first missing one, naming it. */
#define FS_RESOLVE_(fn)                                                                            \
    do {                                                                                           \
        *(void **)&fs_cuda.fn = dlsym(handle, FS_XSTR_(fn));                                       \
        if (!fs_cuda.fn) {                                                                         \
            FS_WARN("%s has no %s; the CUDA library is too old for flexshim", lib,                 \
                    FS_XSTR_(fn));                                                                 \
            return FS_ERR_UNSUPPORTED;                                                             \
        }                                                                                          \
    } while (0);

static int resolve_driver(void *handle, const char *lib)
{
    FS_CUDA_DRIVER_FUNCS(FS_RESOLVE_)
    return FS_OK;
}

static int resolve_cupti(void *handle, const char *lib)
{
    FS_CUPTI_FUNCS(FS_RESOLVE_)
    return FS_OK;
}

static void load_driver_once(void)
{
    const char *lib = "libcuda.so.1";
    void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        FS_DEBUG("no CUDA driver: %s", dlerror());
        return;
    }
    driver_result = resolve_driver(handle, lib);
}

int fs_cuda_load_driver(void)
{
    pthread_once(&driver_once, load_driver_once);
    return driver_result;
}

static void load_cupti_once(void)
{
    /* The toolkit's copy first (what the program's CUDA was built with), then the library path. */
    static const char *const candidates[] = {
        "libcupti.so.13",
        "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
        "/usr/local/cuda/lib64/libcupti.so.13",
        "libcupti.so",
    };
    for (size_t i = 0; i < FS_ARRAY_LEN(candidates); i++) {
        const char *lib = candidates[i];
        void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!handle)
            continue;
        cupti_result = resolve_cupti(handle, lib);
        FS_DEBUG("CUPTI loaded from %s", lib);
        return;
    }
    FS_DEBUG("CUPTI not found: %s", dlerror());
}

int fs_cuda_load_cupti(void)
{
    pthread_once(&cupti_once, load_cupti_once);
    return cupti_result;
}

void *fs_cuda_resolve_rt(void **slot, const char *name)
{
    void *fn = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (FS_LIKELY(fn != NULL))
        return fn;
    fn = dlsym(RTLD_NEXT, name);
    if (!fn) {
        /* libcudart may sit in a library scope opened with RTLD_LOCAL (Python extensions). */
        static const char *const libs[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
        for (size_t i = 0; i < FS_ARRAY_LEN(libs) && !fn; i++) {
            void *h = dlopen(libs[i], RTLD_LAZY | RTLD_NOLOAD);
            if (h) {
                fn = dlsym(h, name);
                dlclose(h);
            }
        }
    }
    if (fn)
        __atomic_store_n(slot, fn, __ATOMIC_RELEASE);
    return fn;
}

const char *fs_cuda_errstr(CUresult res)
{
    static __thread char buf[96];
    const char *name = NULL;
    if (fs_cuda.cuGetErrorName && fs_cuda.cuGetErrorName(res, &name) != CUDA_SUCCESS)
        name = NULL;
    snprintf(buf, sizeof(buf), "%s (%d)", name ? name : "CUDA error", (int)res);
    return buf;
}

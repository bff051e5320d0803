/* Common definitions shared by every flexshim source file: error codes, visibility, helpers. */
#ifndef FS_FS_H
#define FS_FS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* Everything is hidden by default (-fvisibility=hidden); only the intercepted CUDA entry points
 * and the public flexshim_* API carry FS_EXPORT. tests/preload/test_exports.sh checks this. */
#define FS_EXPORT __attribute__((visibility("default")))

#define FS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define FS_LIKELY(x) __builtin_expect(!!(x), 1)
#define FS_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Internal result codes. Device implementations translate their native errors into these and
 * keep the native code for the log (fs_device_last_native_error). */
enum fs_err {
    FS_OK = 0,
    FS_ERR_INVALID = -1,     /* bad argument or state */
    FS_ERR_NOMEM = -2,       /* out of device or host memory */
    FS_ERR_NOT_READY = -3,   /* an event or stream has not completed yet (not a failure) */
    FS_ERR_DEVICE = -4,      /* the device or driver failed */
    FS_ERR_UNSUPPORTED = -5, /* the operation is not available here */
    FS_ERR_NOT_FOUND = -6,   /* no such object (pointer, file, key) */
    FS_ERR_IO = -7,          /* a file could not be read or written */
    FS_ERR_CONFIG = -8,      /* the configuration is invalid */
    FS_ERR_STICKY = -9,      /* the context is dead (an illegal address was touched) */
};

const char *fs_err_str(int err);

/* V rounded up to a multiple of G. */
static inline uint64_t fs_round_up(uint64_t v, uint64_t g)
{
    return (v + g - 1) / g * g;
}

/* Make the array *ARR (elements of ELEM bytes, capacity *CAP) hold at least NEED elements,
 * doubling; false (and nothing changed) when out of memory. */
_Bool fs_grow(void **arr, size_t *cap, size_t need, size_t elem);

/* Create (or truncate) PATH and let EMIT write it (FS_OK, or FS_ERR_IO when the stream failed).
 * FS_ERR_IO when the file cannot be opened, written or closed; errno says why. */
int fs_write_file(const char *path, int (*emit)(FILE *f, void *arg), void *arg);

/* The median of the N values in V (sorted in place): the mean of the middle two for an even N, 0
 * for none. */
double fs_median(double *v, int n);

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t fs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Thread-locals read on every kernel launch. The library is loaded with the program (LD_PRELOAD
 * or linked), never dlopened, so they can sit in the static TLS block: a plain %fs-relative load
 * instead of a __tls_get_addr call per access. */
#define FS_TLS __thread __attribute__((tls_model("initial-exec")))

/* True on the engine's own threads (the plan executor's mover, the host pinner): the CUDA calls
 * they make are not the program's, and launch tracking must not see them. */
extern FS_TLS _Bool fs_thread_internal;

#endif

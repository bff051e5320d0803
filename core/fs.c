#include "fs.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

FS_TLS bool fs_thread_internal;

bool fs_grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = n;
    return true;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fs_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int fs_write_file(const char *path, int (*emit)(FILE *f, void *arg), void *arg)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return FS_ERR_IO;
    int rc = emit(f, arg) == FS_OK && !ferror(f) ? FS_OK : FS_ERR_IO;
    int err = errno;
    if (fclose(f) != 0 && rc == FS_OK) {
        rc = FS_ERR_IO;
        err = errno;
    }
    errno = err;
    return rc;
}

const char *fs_err_str(int err)
{
    switch (err) {
    case FS_OK: return "ok";
    case FS_ERR_INVALID: return "invalid argument";
    case FS_ERR_NOMEM: return "out of memory";
    case FS_ERR_NOT_READY: return "not ready";
    case FS_ERR_DEVICE: return "device error";
    case FS_ERR_UNSUPPORTED: return "not supported";
    case FS_ERR_NOT_FOUND: return "not found";
    case FS_ERR_IO: return "input/output error";
    case FS_ERR_CONFIG: return "invalid configuration";
    case FS_ERR_STICKY: return "device context failed (illegal address)";
    default: return "unknown error";
    }
}

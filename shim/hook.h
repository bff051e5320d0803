/* What every hook shares: the re-entry guard and the translation of engine results.
 *
 * A hook does three things: guard re-entry (a CUDA library calling another hooked function from
 * inside our own work goes straight to the real one), forward to a core function, and translate
 * the result into the caller's API. */
#ifndef FS_SHIM_HOOK_H
#define FS_SHIM_HOOK_H

#include <stdbool.h>

#include "cuda_api.h"
#include "fs.h"

extern FS_TLS int fs_hook_depth;

/* True when the calling thread is already inside the shim: the hook must pass through. */
static inline bool fs_hook_enter(void)
{
    return fs_hook_depth++ > 0;
}

static inline void fs_hook_leave(void)
{
    fs_hook_depth--;
}

/* An engine result as a CUDA runtime error. */
cudaError_t fs_to_cuda_rt(int err);

/* An engine result as a CUDA driver error. */
CUresult fs_to_cuda_drv(int err);

/* The runtime's current device of the calling thread (-1 when it cannot be told). */
int fs_hook_current_device(void);

/* Logged once when the real runtime function cannot be found (no libcudart in the process). */
cudaError_t fs_hook_missing_real(const char *name);

#endif

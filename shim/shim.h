/* What the shim's files share besides hook.h. */
#ifndef FS_SHIM_SHIM_H
#define FS_SHIM_SHIM_H

#include <stdbool.h>

#include "cuda_api.h"

/* Subscribe to CUPTI and enable the launch callbacks; the engine calls it once, when it starts.
 * On failure it has said why, and the program runs unmanaged. */
int fs_shim_tracking_start(void);

/* Stop (PAUSED) or resume the launch reports; FS_OK once every one changed (the engine's
 * PAUSE_TRACKING). */
int fs_shim_tracking_pause(bool paused);

/* LAUNCH_HOOK=entry (cupti.c): a wrapper of a driver launch function (entry.c) calls
 * fs_shim_launch_enter before calling the driver, with PARAMS the CUPTI parameter struct of
 * callback id CBID; true when it reported the launch. fs_shim_launch_exit follows the driver's
 * call in every case, with that result (TRACKED) and QUEUED when the driver accepted the launch. */
bool fs_shim_launch_enter(CUpti_CallbackId cbid, const void *params);
void fs_shim_launch_exit(bool tracked, bool queued);

/* A launch function NAME was handed out unwrapped (entry.c): launch tracking goes back to CUPTI. */
void fs_shim_entry_unwrapped(const char *name);

/* LAUNCH_HOOK=entry, the engine enabled: set by the library's constructor once the configuration
 * is read, never changed after. entry.c then substitutes the driver's launch functions in dlsym
 * and cuGetProcAddress lookups, and cupti.c takes the launches from its wrappers. */
extern bool fs_shim_entry_mode;

#endif

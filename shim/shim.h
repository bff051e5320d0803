/* What the shim's files share besides hook.h. */
#ifndef FS_SHIM_SHIM_H
#define FS_SHIM_SHIM_H

#include <stdbool.h>

/* Subscribe to CUPTI and enable the launch callbacks; the engine calls it once, when it starts.
 * On failure it has said why, and the program runs unmanaged. */
int fs_shim_tracking_start(void);

/* Stop (PAUSED) or resume the launch reports; FS_OK once every one changed (the engine's
 * PAUSE_TRACKING). */
int fs_shim_tracking_pause(bool paused);

#endif

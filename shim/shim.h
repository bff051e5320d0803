/* What the shim's files share besides hook.h. */
#ifndef FS_SHIM_SHIM_H
#define FS_SHIM_SHIM_H

/* Subscribe to CUPTI and enable the launch callbacks; the engine calls it once, when it starts.
 * On failure it has said why, and the program runs unmanaged. */
int fs_shim_tracking_start(void);

#endif

/* Library constructor and destructor: read the configuration before main(), report at exit. */
#include "engine.h"
#include "hook.h"
#include "shim.h"

extern char **environ;

static const struct fs_tracker cupti_tracker = {fs_shim_tracking_start, fs_shim_tracking_pause};

__attribute__((constructor)) static void fs_shim_load(void)
{
    fs_hook_depth++;
    fs_engine_set_tracker(&cupti_tracker);
    if (fs_engine_init(environ) == FS_OK) {
        fs_shim_entry_mode = fs_engine_active() && fs_config_u64(fs_engine_config(),
                                                                 FS_P_LAUNCH_HOOK) ==
                                                       FS_LAUNCH_HOOK_ENTRY;
        fs_engine_start_early();
    }
    fs_hook_depth--;
}

__attribute__((destructor)) static void fs_shim_unload(void)
{
    fs_hook_depth++;
    fs_engine_shutdown();
    fs_hook_depth--;
}

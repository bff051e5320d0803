/* The public flexshim_* API (shim/flexshim.h). */
#include "flexshim.h"

#include "engine.h"
#include "fs.h"

FS_EXPORT const char *flexshim_version(void)
{
    return FLEXSHIM_VERSION_STRING;
}

FS_EXPORT int flexshim_active(void)
{
    return fs_engine_active() ? 1 : 0;
}

FS_EXPORT void flexshim_mark_iteration(void)
{
    fs_engine_mark_iteration();
}

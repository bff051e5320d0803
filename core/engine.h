/* The engine's entry points: what the shim's hooks forward to. The engine never knows how it was
 * called; hooks translate its fs_err results into the caller's API. */
#ifndef FS_ENGINE_H
#define FS_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct fs_engine_stats {
    uint64_t free_calls;
    uint64_t managed_allocs;     /* backed by flexshim's virtual memory */
    uint64_t passthrough_allocs; /* handed to CUDA unchanged (small, unmanageable, or disabled) */
    uint64_t passthrough_bytes;
    uint64_t managed_bytes;
};

/* Read the configuration from ENVP (and the INI file it names), set up the log. Called once,
 * from the library constructor. Configuration errors are logged one per line, followed by one
 * line saying the program runs unmanaged; FS_ERR_CONFIG is then returned and the engine stays
 * inactive (every call passes through). */
int fs_engine_init(char *const *envp);

/* The configuration in force (defaults until fs_engine_init ran). */
const struct fs_config *fs_engine_config(void);

/* True when allocations may be managed (enabled and configured without errors). */
bool fs_engine_active(void);

/* Allocation of SIZE bytes. FS_ERR_UNSUPPORTED: not managed, the caller passes it through and
 * then reports it with fs_engine_note_passthrough. */
int fs_engine_alloc(uint64_t size, uint64_t *ptr_out);
void fs_engine_note_passthrough(uint64_t size);

/* Free. FS_ERR_NOT_FOUND: not a managed allocation, the caller passes it through. */
int fs_engine_free(uint64_t ptr);

void fs_engine_get_stats(struct fs_engine_stats *out);

/* At exit: the summary line(s) at info level, timing report if configured. */
void fs_engine_shutdown(void);

#endif

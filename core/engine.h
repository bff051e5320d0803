/* The engine's entry points: what the shim's hooks forward to. The engine never knows how it was
 * called; hooks translate its fs_err results into the caller's API.
 *
 * The engine starts at the first allocation it could manage (or the first memory query), or as
 * the library loads when it runs a profile of this program (fs_engine_start_early): it opens the
 * device, reserves the managed address range and starts the launch tracker the shim registered.
 * If any of that fails it says why once and every call passes through. */
#ifndef FS_ENGINE_H
#define FS_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "device.h"
#include "executor.h"
#include "launch.h"

struct fs_engine_stats {
    uint64_t managed_allocs;     /* live and past */
    uint64_t managed_bytes;
    uint64_t passthrough_allocs; /* handed to CUDA unchanged (small, other device, unmanaged) */
    uint64_t passthrough_bytes;
    uint64_t free_calls;
    uint64_t pointer_queries;    /* pointer attribute queries asked of the engine */
    uint64_t meminfo_queries;    /* free/total memory queries asked of the engine */
    uint64_t budget;
    uint64_t tracking_pauses;    /* times launch tracking paused (PAUSE_TRACKING) */
    uint64_t tracking_resumes;   /* and resumed */
    struct fs_res_stats res;
    struct fs_launch_stats launch;
    struct fs_exec_stats exec;   /* zero unless PROFILE or PROFILE_OUT is set */
};

/* Read the configuration from ENVP (and the INI file it names), set up the log. Called once,
 * from the library constructor. Configuration errors are logged one per line, followed by one
 * line saying the program runs unmanaged; FS_ERR_CONFIG is then returned and the engine stays
 * inactive (every call passes through). */
int fs_engine_init(char *const *envp);

/* Launch tracking (CUPTI in the shim). START begins reporting launches to
 * fs_engine_launch_enter/exit; the engine calls it once, when it starts. PAUSE (NULL: tracking
 * never pauses) stops the reports (true) or resumes them (false), FS_OK once done: the engine
 * pauses tracking while nothing can move (PAUSE_TRACKING). Without a tracker (tests), launches
 * are reported by the caller alone. */
struct fs_tracker {
    int (*start)(void);
    int (*pause)(bool paused);
};
void fs_engine_set_tracker(const struct fs_tracker *t);
/* LAUNCH_HOOK, in its values' order: the mechanism the shim's tracker watches launches with. */
enum fs_launch_hook { FS_LAUNCH_HOOK_CUPTI, FS_LAUNCH_HOOK_ENTRY };

/* How many times the running plan has seen the program reach its iteration's first launch (0:
 * no plan followed). */
uint64_t fs_engine_iterations_followed(void);

/* Start the engine now, on a thread of its own, when PROFILE names a profile recorded from this
 * program (fs_rec_same_program: the same command, options and script; not a helper process that
 * inherited the environment) and the device to manage is known (FLEXTENSOR_DEVICE set, or one
 * device visible):
 * the pinner then pins the host memory the plan needs while the program is still starting (the
 * driver pins at about 4 GB/s, and the program's CUDA calls wait behind it). Otherwise, and when
 * the profile cannot be read, the engine starts at first use as always. Called by the library
 * constructor, after fs_engine_init; the thread is joined by fs_engine_shutdown. A child forked
 * once the early start began runs unmanaged. The driver is initialised during the program's
 * imports then: a program that sets CUDA_VISIBLE_DEVICES itself, or forks children that use
 * CUDA, should set PIN_MODE=on_demand. */
void fs_engine_start_early(void);

/* Has the engine started (successfully)? */
bool fs_engine_started(void);

/* Use DEV instead of opening the CUDA device (tests with the simulated device). */
void fs_engine_use_device(struct fs_device *dev);

/* The configuration in force (defaults until fs_engine_init ran). */
const struct fs_config *fs_engine_config(void);

/* True when allocations may be managed (enabled, configured without errors, started or not yet
 * tried). */
bool fs_engine_active(void);

/* Allocation of SIZE bytes on device ORDINAL. FS_ERR_UNSUPPORTED: not managed, the caller passes
 * it through and then reports it with fs_engine_note_passthrough. */
int fs_engine_alloc(uint64_t size, int ordinal, uint64_t *ptr_out);
void fs_engine_note_passthrough(uint64_t size);

/* Free. FS_ERR_NOT_FOUND: not a managed allocation, the caller passes it through. */
int fs_engine_free(uint64_t ptr);

/* Is PTR inside a managed allocation? Its device ordinal in *ORDINAL. */
bool fs_engine_owns(uint64_t ptr, int *ordinal);

/* Free and total memory of device ORDINAL (-1: unknown) as the program should see them
 * (MEMINFO_VIEW). FS_ERR_UNSUPPORTED: pass the query through (another device, or not managed). */
int fs_engine_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes);

/* Launch notifications (see launch.h); cheap no-ops until the engine has started. */
void fs_engine_launch_enter(const struct fs_launch_desc *d, struct fs_launch_ticket *t);
void fs_engine_launch_exit(struct fs_launch_ticket *t, bool queued);

void fs_engine_get_stats(struct fs_engine_stats *out);
/* References that waited for a late prefetch so far (fs_exec_stats.late; 0 without a plan): one
 * counter, for the replay to ask at every launch without copying all the statistics. */
uint64_t fs_engine_late_waits(void);

/* The program's next launch starts an iteration (flexshim_mark_iteration): discovery uses such
 * marks instead of finding the iteration itself. */
void fs_engine_mark_iteration(void);

/* Tests: wait until the plan executor has done every move queued so far. */
void fs_engine_drain_moves(void);

/* The replay's trace: managed allocations with a host block (fs_res_host_blocks); 0 before the
 * engine started. */
int fs_engine_host_blocks(uint64_t *alloc_va, uint64_t *block_va, int max);

/* At exit: the summary at info level. The program's memory stays mapped (CUDA may already be
 * tearing down, and the program may still touch it from other destructors). */
void fs_engine_shutdown(void);

/* Tests: release everything the engine holds and return to the state before fs_engine_init. */
void fs_engine_teardown(void);

#endif

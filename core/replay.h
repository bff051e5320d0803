/* Replaying a profile on the simulated device: the real engine (residency and plan executor) runs
 * the profile's plan against its own launches, with the profile's kernel times and link, and the
 * remap costs measured on the GPU (DESIGN.md). Unlike the timeline model the strategies use
 * (strategy.h), this includes what the executor actually does: moves one at a time on its mover
 * thread, write-backs and prefetches that do not overlap, host time spent mapping, the program
 * thread waiting for late prefetches, and a synchronize at the end of every iteration (as a
 * decode loop does when it reads its token).
 *
 * The engine is a process-wide singleton: a replay must not run while it manages a program (the
 * tool runs it, never the preloaded library). */
#ifndef FS_REPLAY_H
#define FS_REPLAY_H

#include <stdint.h>

#include "executor.h"
#include "profile.h"
#include "residency.h"
#include "strategies/strategy.h"

/* Host time per GiB mapped or unmapped, measured on the H200 machine (DESIGN.md): device memory
 * map + set access about 0.1 ms, unmap 0.05 ms; pinned host memory map + set access about
 * 10.5 ms, unmap 2.3 ms. */
#define FS_REPLAY_MAP_DEVICE_NS_PER_GIB 103000ull
#define FS_REPLAY_UNMAP_DEVICE_NS_PER_GIB 50000ull
#define FS_REPLAY_MAP_HOST_NS_PER_GIB 10500000ull
#define FS_REPLAY_UNMAP_HOST_NS_PER_GIB 2300000ull
/* Kernels reading host memory in place (OFFLOAD_MODE=host_read): about 36 GB/s, estimated from
 * the 7B decode steps at half the weights (7.45 GB read per step in 190-217 ms, 2026-12-03,
 * docs/PERFORMANCE.md); the copy engines reach 55 GB/s. */
#define FS_REPLAY_HOST_READ_BYTES_PER_S 36e9

struct fs_replay_config {
    uint64_t budget;      /* GPU_MEMORY_LIMIT in bytes (at least 64 MiB); the engine plans for
                           * all of it (PLAN_HEADROOM 0 unless SETTINGS say otherwise) */
    const char *strategy; /* NULL: the profile's plan if made for BUDGET, else adaptive */
    int iterations;       /* run; the first two are warm-up */
    const char *offload_mode; /* OFFLOAD_MODE's value (a valid one); NULL: the default */
    /* more settings, "KEY=VALUE,..." (names without the FLEXTENSOR_ prefix, at most
     * FS_REPLAY_SETTINGS, shorter than FS_REPLAY_SETTINGS_TEXT; the engine refuses bad ones);
     * NULL: none */
    const char *settings;
    /* Optional: the last iteration as it ran on the simulated device, one event per kernel
     * (compute), copy in (H2D) and out (D2H) of an allocation, and stretch the program's thread
     * spent in the launch hook (wait), in microseconds from that iteration's start. Called from
     * several threads, one call at a time. */
    fs_tl_sink trace;
    void *trace_arg;
};

#define FS_REPLAY_SETTINGS 8
#define FS_REPLAY_SETTINGS_TEXT 512

struct fs_replay_result {
    double step_us;  /* median iteration time after the warm-up */
    double first_us; /* the first iteration (reactive until the executor finds its place) */
    struct fs_exec_stats exec; /* totals, warm-up included */
    struct fs_res_stats res;
    /* over the timed iterations only (after the warm-up): their number, launches that waited
     * for a late prefetch, references to allocations the plan had on host, fault-ins, launches
     * ordered after a prefetch's copy on their stream, device blocks the pool made (driver work
     * on a GPU, about 0.8 ms each under load: the simulated device hardly charges it) */
    int timed;
    uint64_t timed_late, timed_unplanned, timed_faults, timed_ordered, timed_blocks;
    double timed_hook_us; /* the program's thread in the launch hook (those waits, fault-ins) */
};

/* FS_OK, or an error with ERR saying why (the budget is too small, out of memory, ...). */
int fs_replay(const struct fs_profile *p, const struct fs_replay_config *cfg,
              struct fs_replay_result *out, char *err, size_t errlen);

#endif

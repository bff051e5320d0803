/* The run trace (FLEXTENSOR_TRACE_OUT): what the engine's threads did while the program ran, as
 * spans on the host clock, written at exit as a Chrome trace-event file (Perfetto,
 * chrome://tracing). It shows where a step's time goes that the exit counters only sum up: the
 * program's thread waiting for a late prefetch, the mover beginning copies or held for room, each
 * remap by kind (device or host memory, map or unmap) on the thread that made it, the copies
 * waited for, and each move's life in its executor slot.
 *
 * Spans go into one preallocated buffer (a fetch-add per span, no lock); when it is full later
 * spans are counted and dropped. With no trace open every call returns at once. Each thread
 * writes to its own lane (fs_rt_set_lane), the program's threads to FS_RT_PROGRAM. */
#ifndef FS_RUN_TRACE_H
#define FS_RUN_TRACE_H

#include <stdbool.h>
#include <stdint.h>

enum fs_rt_lane {
    FS_RT_PROGRAM,      /* the program's threads (launch hooks, fault-ins) */
    FS_RT_MOVER,        /* the executor's mover: begins moves */
    FS_RT_FIN_EVICT,    /* the executor's finishers */
    FS_RT_FIN_PREFETCH,
    FS_RT_FIN_MAP,
    FS_RT_PINNER,       /* the residency's background pinner */
    FS_RT_SLOTS,        /* FS_RT_SLOTS + k: executor slot k, one move's life */
};

enum fs_rt_kind {
    FS_RT_LATE_WAIT,     /* the program waited for a late prefetch (ID) */
    FS_RT_BEGIN_PREFETCH,
    FS_RT_BEGIN_EVICT,
    FS_RT_HELD,          /* the mover held a prefetch (ID) back until room came */
    FS_RT_COPY_WAIT,     /* a thread waited for a move's copy (ID) */
    FS_RT_MAP_DEVICE,    /* device memory mapped at ID's VA (map + set access) */
    FS_RT_MAP_HOST,      /* host memory mapped at ID's VA */
    FS_RT_UNMAP_DEVICE,
    FS_RT_UNMAP_HOST,
    FS_RT_PREFETCH,      /* slot lanes: a prefetch from begin to end */
    FS_RT_EVICT,         /* slot lanes: an eviction from begin to release */
    FS_RT_ITERATION,     /* the program reached the start of the plan's iteration (instant) */
    FS_RT_HOST_READ,     /* a launch was queued reading ID in host memory (no room, a capture, the
                          * plan's read in place, or its copy not begun): its kernel reads it over
                          * the link (a span of no length) */
    FS_RT_STREAM_IDLE,   /* the launch's stream had run out of work while the program waited
                          * for ID: the GPU time from its last work's end to the wait's end */
    FS_RT_FAULT_IN,      /* a launch brought ID onto the device itself (no plan had it there) */
    FS_RT_SYNC,          /* the whole device synchronized before ID moved (strict mode, or no
                          * last use known for it) */
    FS_RT_KINDS
};

/* Start collecting up to CAPACITY spans. FS_ERR_NOMEM; FS_ERR_INVALID when already open. */
int fs_rt_open(uint64_t capacity);
bool fs_rt_on(void);
/* The lane of the calling thread's spans from now on. */
void fs_rt_set_lane(int lane);
/* A span of KIND about allocation ID (BYTES, 0 when none) from T0 to T1 (fs_now_ns), on the
 * calling thread's lane or (fs_rt_span_on) on LANE. T1 == T0: an instant. */
void fs_rt_span(enum fs_rt_kind kind, uint64_t id, uint64_t bytes, uint64_t t0, uint64_t t1);
void fs_rt_span_on(int lane, enum fs_rt_kind kind, uint64_t id, uint64_t bytes, uint64_t t0,
                   uint64_t t1);
/* Write the spans collected so far to PATH and close the trace. *KEPT and *DROPPED say how many
 * spans were written and how many did not fit. FS_ERR_IO (errno is kept). */
int fs_rt_write(const char *path, uint64_t *kept, uint64_t *dropped);
/* Drop the spans without writing them. */
void fs_rt_close(void);

#endif

/* The simulated device: host memory standing in for device and pinned host memory, streams as
 * ordered queues on a modelled clock, events, a configurable capacity, and failure injection.
 *
 * Time is virtual. Every queued operation gets a start time (after the previous operation on its
 * stream, after the events it waits for, after the engine it uses frees up, and no earlier than
 * the current clock) and a duration (copies: size / bandwidth of their direction plus a fixed
 * latency; kernels: the duration given at launch). The clock moves forward only when the host
 * waits (stream_sync, event_sync, ctx_sync) or calls fs_sim_advance; an operation's effect on
 * memory (the copy, the kernel's function) happens when the clock passes its end, in end order.
 * Two clocks: the program's thread's, and one the engine's threads (fs_thread_internal) share:
 * an engine thread waiting for a copy does not hold the program's thread back, which on a GPU
 * goes on queueing (fs_sim_join_engine_clock: the program waited for the engine).
 *
 * Invariant checks: an operation that touches a VA range that is not mapped when it executes
 * makes the context sticky-failed (as an illegal address does on a real GPU): every later call
 * returns FS_ERR_STICKY and fs_sim_stats.illegal_accesses counts it. Unmapping a range that a
 * not-yet-executed operation touches is counted in fs_sim_stats.unsafe_unmaps and is also an
 * illegal access.
 *
 * Plain memory (mem_alloc) is a reservation of its own with device memory mapped at once; map,
 * unmap and va_release refuse it, mem_free gives all of it back (and, like unmapping, makes the
 * context fail if queued work still touches it); it counts in fs_sim_stats.plain_allocs.
 *
 * Mappings follow the CUDA driver: map takes one whole physical allocation (offset 0 and its full
 * size, else FS_ERR_UNSUPPORTED), unmap takes exactly one earlier mapping (same start and size,
 * else FS_ERR_INVALID). Copies may span adjacent mappings; a kernel range must lie within one.
 *
 * Graph capture: while any stream is marked capturing (fs_sim_set_capturing), stream_sync,
 * event_sync and ctx_sync fail with FS_ERR_INVALID (a sync invalidates a global-mode capture on
 * the GPU) and count in fs_sim_stats.capture_violations; map and unmap calls work as usual but
 * count there too. The mark stays until cleared (or the stream is destroyed).
 *
 * Kernel parameter layouts (param_layout) come from fs_sim_register_kernel; an unregistered
 * kernel's layout is FS_ERR_UNSUPPORTED. */
#ifndef FS_DEVICE_SIM_H
#define FS_DEVICE_SIM_H

#include "device.h"

/* Device operations that can be made to fail, for failure-injection tests. */
enum fs_sim_op {
    FS_SIM_OP_PHYS_CREATE,
    FS_SIM_OP_PHYS_RELEASE,
    FS_SIM_OP_VA_RESERVE,
    FS_SIM_OP_VA_RELEASE,
    FS_SIM_OP_MAP,
    FS_SIM_OP_UNMAP,
    FS_SIM_OP_STREAM_CREATE,
    FS_SIM_OP_COPY,
    FS_SIM_OP_EVENT_CREATE,
    FS_SIM_OP_EVENT_RECORD,
    FS_SIM_OP_EVENT_SYNC,
    FS_SIM_OP_STREAM_WAIT,
    FS_SIM_OP_SYNC,
    FS_SIM_OP_FINGERPRINT,
    FS_SIM_OP_MEM_ALLOC,
    FS_SIM_OP_COUNT
};

struct fs_sim_config {
    uint64_t device_bytes;    /* device memory capacity (physical, FS_LOC_DEVICE) */
    uint64_t host_bytes;      /* pinned host capacity (FS_LOC_HOST); 0 = unlimited */
    uint64_t granularity;     /* default 2 MiB */
    double h2d_bytes_per_s;   /* default 55e9 */
    double d2h_bytes_per_s;   /* default 55e9 */
    double d2d_bytes_per_s;   /* default 2e12 */
    uint64_t copy_latency_ns; /* fixed cost per copy, default 2000 */
    bool host_phys_supported; /* default true */
    /* Replaying a profile (core/replay.h): copies and kernels take their time but move no
     * bytes (memory is never touched, so large profiles cost no host memory). */
    bool timing_only;
    /* Host time a map (with set access) or an unmap of one GiB takes, by enum fs_mem_loc of
     * the physical memory: the clock moves on by it, as the device keeps working while the
     * host remaps. Default 0. */
    uint64_t map_ns_per_gib[2], unmap_ns_per_gib[2];
    /* A kernel reads each byte of its ranges that host memory backs over the link at this rate:
     * its duration grows by those bytes / rate (0: not modelled). */
    double host_read_bytes_per_s;
};

struct fs_sim_stats {
    uint64_t device_bytes_in_use;
    uint64_t host_bytes_in_use;
    uint64_t peak_device_bytes;
    uint64_t maps, unmaps, copies, kernels;
    uint64_t fingerprints; /* fingerprint ops executed */
    uint64_t bytes_h2d, bytes_d2h, bytes_d2d;
    uint64_t illegal_accesses;
    uint64_t unsafe_unmaps;
    uint64_t capture_violations;   /* syncs (refused), map and unmap calls, while capturing */
    uint64_t param_layout_queries; /* param_layout calls, failed ones included */
    uint64_t maps_by_loc[2];       /* successful maps, by enum fs_mem_loc of the allocation */
    uint64_t live_phys, live_va_ranges, live_streams, live_events; /* leak checks */
    uint64_t blocking_events_made; /* events made with FS_EVENT_BLOCKING */
    uint64_t plain_allocs;         /* live mem_alloc memory */
};

/* A simulated kernel: FN runs when the kernel completes on the clock, with host pointers for the
 * device addresses it was launched with (translated through the mappings at that moment). FN runs
 * with the simulator locked, on whichever thread moved the clock: it must not call the device. */
typedef void (*fs_sim_kernel_fn)(void *ctx, void *const *ptrs, int nptrs);

#define FS_SIM_MAX_KERNEL_PTRS 16
#define FS_SIM_MAX_KERNEL_PARAMS 4096 /* registry limit per kernel */

/* A NULL config takes every default (8 GiB device). In a given config, zero device_bytes,
 * granularity or bandwidths take the default too; FS_ERR_CONFIG if granularity is not a power of
 * two. */
int fs_sim_open(const struct fs_sim_config *cfg, struct fs_device **out);

/* The program's own streams, as the engine would see them (CUstream handles on the GPU). */
int fs_sim_stream_create(struct fs_device *dev, fs_stream *out);

/* Queue a kernel on STREAM that touches the NPTRS ranges [ptrs[i], ptrs[i] + sizes[i]) for
 * DURATION_NS; FN may be NULL for a kernel that only takes time. */
int fs_sim_launch(struct fs_device *dev, fs_stream stream, uint64_t duration_ns,
                  const fs_dptr *ptrs, const uint64_t *sizes, int nptrs, fs_sim_kernel_fn fn,
                  void *ctx);

/* Write or read device memory from the host, synchronously, bypassing the clock (test set-up
 * and checks). The range must be mapped. */
int fs_sim_write(struct fs_device *dev, fs_dptr dst, const void *src, uint64_t size);
int fs_sim_read(struct fs_device *dev, void *dst, fs_dptr src, uint64_t size);

/* Where the range is mapped now: FS_LOC_DEVICE or FS_LOC_HOST; FS_ERR_NOT_FOUND if unmapped. */
int fs_sim_location(struct fs_device *dev, fs_dptr va, enum fs_mem_loc *loc);

/* Make the Nth call (1 = the next one) of OP fail with ERR. N = 0 disarms. */
void fs_sim_fail_nth(struct fs_device *dev, enum fs_sim_op op, uint64_t nth, int err);

/* The calls of OP left before the armed failure: 0 once it fired (or when none is armed). */
uint64_t fs_sim_fail_pending(struct fs_device *dev, enum fs_sim_op op);

/* Move the clock forward by NS, completing whatever finishes by then. */
void fs_sim_advance(struct fs_device *dev, uint64_t ns);
/* Move the clock to T_NS if it is earlier (another thread may have moved it meanwhile). */
void fs_sim_advance_to(struct fs_device *dev, uint64_t t_ns);
/* The program's clock (the calling thread's, for a thread that is not the engine's). */
uint64_t fs_sim_now_ns(struct fs_device *dev);
/* The calling thread waited for the engine's threads (a late prefetch): its clock moves to
 * theirs, if that is later. */
void fs_sim_join_engine_clock(struct fs_device *dev);

/* Mark STREAM (NULL: the legacy default stream) as capturing into a graph, or not. Unknown
 * streams are ignored. Destroying a stream clears its mark. */
void fs_sim_set_capturing(struct fs_device *dev, fs_stream stream, bool capturing);

/* Register the parameter layout that param_layout reports for FUNC (any non-NULL key; N may be
 * 0, at most FS_SIM_MAX_KERNEL_PARAMS). Registering FUNC again replaces its layout. param_layout
 * refuses a layout of more than its MAX entries with FS_ERR_UNSUPPORTED, writing nothing. */
int fs_sim_register_kernel(struct fs_device *dev, const void *func, const uint32_t *offsets,
                           const uint32_t *sizes, int n);

/* An executed operation, for drawing the simulated timeline. */
enum fs_sim_rec_kind {
    FS_SIM_REC_KERNEL,      /* a program's kernel (fs_sim_launch) */
    FS_SIM_REC_FINGERPRINT, /* the engine's fingerprint kernel */
    FS_SIM_REC_COPY_H2D,
    FS_SIM_REC_COPY_D2H,
    FS_SIM_REC_COPY_OTHER, /* device to device, host to host */
};

struct fs_sim_record {
    enum fs_sim_rec_kind kind;
    fs_stream stream;      /* the stream it was queued on (NULL: the default stream) */
    fs_dptr dst, src;      /* copies; a kernel's first range is SRC */
    uint64_t bytes;        /* copies and fingerprints */
    uint64_t start_ns, end_ns; /* on the simulated clock */
    bool by_engine;        /* queued by an engine thread (fs_thread_internal) */
};

typedef void (*fs_sim_record_fn)(void *arg, const struct fs_sim_record *rec);

/* FN (NULL: none) is called for every operation as it completes, in completion order, with the
 * device's lock held: it must not call the device. */
void fs_sim_set_recorder(struct fs_device *dev, fs_sim_record_fn fn, void *arg);

void fs_sim_get_stats(struct fs_device *dev, struct fs_sim_stats *out);

#endif

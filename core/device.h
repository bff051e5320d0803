/* The device interface: every operation the engine needs from a GPU, and nothing else.
 *
 * Two implementations: core/device_cuda.c (the CUDA driver API, resolved at run time through
 * core/cuda_api.h) and core/device_sim.c (host memory standing in for both sides, streams as
 * ordered queues on a modelled clock, failure injection). The engine above this line never sees
 * CUDA types, so all of it is tested on a machine without a GPU.
 *
 * Conventions: every function returns FS_OK or a negative enum fs_err; on failure nothing was
 * created and output arguments are untouched. Addresses are device virtual addresses (fs_dptr),
 * which in the real implementation are plain CUDA device pointers. */
#ifndef FS_DEVICE_H
#define FS_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "fs.h"

typedef uint64_t fs_dptr;
typedef struct fs_phys_ *fs_phys;     /* a physical allocation (device or pinned host memory) */
typedef struct fs_stream_ *fs_stream; /* a stream; the real one is a CUstream */
typedef struct fs_event_ *fs_event;   /* an event; the real one is a CUevent */

enum fs_mem_loc { FS_LOC_DEVICE, FS_LOC_HOST };

/* event_create's flags. */
enum { FS_EVENT_TIMING = 1u << 0, FS_EVENT_BLOCKING = 1u << 1 };
#define FS_EVENT_ALL ((unsigned)(FS_EVENT_TIMING | FS_EVENT_BLOCKING))

struct fs_device_props {
    char name[96];
    int ordinal;
    int cc_major, cc_minor;
    uint64_t total_bytes;      /* device memory */
    uint64_t granularity;      /* VA reservation and physical allocation granularity */
    bool host_phys_supported;  /* physical memory located on the host can be mapped (invariant 1) */
    int driver_version;        /* the driver's CUDA version (13000 = 13.0); 0 when unknown */
};

struct fs_device;

struct fs_device_ops {
    const char *name; /* "cuda" or "sim" */

    int (*props)(struct fs_device *dev, struct fs_device_props *out);
    /* Free and total device memory as the device sees it (all users, not only ours). */
    int (*mem_info)(struct fs_device *dev, uint64_t *free_bytes, uint64_t *total_bytes);

    /* Physical memory of SIZE bytes (a multiple of granularity) on the device or pinned on the
     * host. Host-located memory can be mapped at a device VA and read by kernels over the link. */
    int (*phys_create)(struct fs_device *dev, uint64_t size, enum fs_mem_loc loc, fs_phys *out);
    int (*phys_release)(struct fs_device *dev, fs_phys phys);

    /* A range of device virtual addresses, SIZE a multiple of granularity. */
    int (*va_reserve)(struct fs_device *dev, uint64_t size, fs_dptr *out);
    int (*va_release)(struct fs_device *dev, fs_dptr va, uint64_t size);

    /* Map PHYS at VA and make it readable and writable by the device (map + set access in CUDA
     * terms). The driver maps only whole physical allocations: SIZE must be PHYS's size and
     * PHYS_OFFSET 0 (FS_ERR_UNSUPPORTED otherwise, on the GPU and in the simulator alike). */
    int (*map)(struct fs_device *dev, fs_dptr va, uint64_t size, fs_phys phys,
               uint64_t phys_offset);
    /* Unmap exactly what one map call mapped. The caller guarantees the range is quiet (no
     * queued work touches it). */
    int (*unmap)(struct fs_device *dev, fs_dptr va, uint64_t size);

    /* Plain device memory of SIZE bytes (cuMemAlloc), outside every reservation, never mapped
     * or unmapped: for allocations that will never move (made while launch tracking is paused),
     * which then cost the program nothing that VMM-mapped memory might (an H100 decode's fastest
     * steps were 0.7-5% faster on plain memory, docs/PERFORMANCE.md, stop 28). mem_free takes
     * what mem_alloc gave. */
    int (*mem_alloc)(struct fs_device *dev, uint64_t size, fs_dptr *out);
    int (*mem_free)(struct fs_device *dev, fs_dptr ptr);

    /* Streams the engine owns (prefetch, write-back). Non-blocking with respect to the legacy
     * default stream. */
    int (*stream_create)(struct fs_device *dev, fs_stream *out);
    int (*stream_destroy)(struct fs_device *dev, fs_stream stream);
    int (*stream_sync)(struct fs_device *dev, fs_stream stream);

    /* Copy SIZE bytes between two mapped device addresses, ordered on STREAM. */
    int (*copy_async)(struct fs_device *dev, fs_dptr dst, fs_dptr src, uint64_t size,
                      fs_stream stream);

    /* Queue a fingerprint (core/fingerprint.h) of SIZE bytes at VA (a multiple of 16) on STREAM:
     * when the stream passes this point, PARTS (FS_FP_PARTS_BYTES from host_alloc) holds the
     * partial pairs for fs_fp_combine. FS_ERR_UNSUPPORTED when this build or device cannot. */
    int (*fingerprint)(struct fs_device *dev, fs_dptr va, uint64_t size, fs_stream stream,
                       uint64_t *parts);
    /* Pinned host memory the device can write (fingerprint results), and its release. */
    int (*host_alloc)(struct fs_device *dev, uint64_t size, void **out);
    int (*host_free)(struct fs_device *dev, void *ptr);

    /* FLAGS: FS_EVENT_TIMING, the event can be used with event_elapsed_ms (costs a little more
     * to record); FS_EVENT_BLOCKING, event_sync sleeps until the event completes, whatever the
     * context's scheduling (by default a spin on a CPU core while a process has few contexts).
     * Other bits: FS_ERR_INVALID. */
    int (*event_create)(struct fs_device *dev, unsigned flags, fs_event *out);
    int (*event_destroy)(struct fs_device *dev, fs_event event);
    int (*event_record)(struct fs_device *dev, fs_event event, fs_stream stream);
    /* FS_OK when everything recorded before the event has completed, FS_ERR_NOT_READY if not. */
    int (*event_query)(struct fs_device *dev, fs_event event);
    int (*event_sync)(struct fs_device *dev, fs_event event);
    /* Work queued on STREAM after this call waits for EVENT; the host does not wait. */
    int (*stream_wait_event)(struct fs_device *dev, fs_stream stream, fs_event event);
    /* Milliseconds between two completed events. */
    int (*event_elapsed_ms)(struct fs_device *dev, fs_event start, fs_event end, float *ms);

    /* Whether work is being captured into a graph on STREAM (nothing may synchronize then). */
    int (*stream_capturing)(struct fs_device *dev, fs_stream stream, bool *capturing);

    /* Byte offset and size of each parameter of kernel FUNC (the CUfunction or CUkernel handle a
     * launch names), at most MAX of them; their count in *N. FS_ERR_UNSUPPORTED: unknown. */
    int (*param_layout)(struct fs_device *dev, const void *func, uint32_t *offsets,
                        uint32_t *sizes, int max, int *n);

    /* The name of kernel FUNC (as param_layout takes it), owned by the driver.
     * FS_ERR_UNSUPPORTED when it cannot be told. */
    int (*kernel_name)(struct fs_device *dev, const void *func, const char **name);

    /* Wait for all work on the device (every stream, the program's too). */
    int (*ctx_sync)(struct fs_device *dev);

    /* Make the device's context current on the calling thread (engine threads). */
    int (*bind_thread)(struct fs_device *dev);

    /* The native error code of the last failure on this thread, for the log. */
    int (*last_native_error)(struct fs_device *dev);

    void (*close)(struct fs_device *dev);
};

struct fs_device {
    const struct fs_device_ops *ops;
    struct fs_device_props props;
    void *impl; /* the implementation's private state */
};

/* Open device ORDINAL through the CUDA driver. FS_ERR_UNSUPPORTED when no driver is present
 * (the shim then passes everything through). */
int fs_device_cuda_open(int ordinal, struct fs_device **out);
/* Devices the driver shows this process (CUDA_VISIBLE_DEVICES applies); FS_ERR_UNSUPPORTED when
 * no driver is present. */
int fs_device_cuda_count(int *count);

/* Convenience wrappers so call sites read as verbs. */
#define fs_dev_call(dev, op, ...) ((dev)->ops->op((dev), ##__VA_ARGS__))

#endif

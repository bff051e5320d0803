/* The device interface (core/device.h) on the CUDA driver API.
 *
 * Every driver call goes through the fs_cuda table (core/cuda_api.h): nothing links against
 * libcuda, so the same library loads on a machine without a driver and opening then answers
 * FS_ERR_UNSUPPORTED. The device's primary context is retained, the one the CUDA runtime uses, so
 * the program's pointers and streams are valid in it. Each operation first makes that context
 * current on the calling thread (a cheap cuCtxGetCurrent; cuCtxSetCurrent only if another or none
 * is current; never push/pop), then calls the driver and translates the CUresult to enum fs_err.
 * The native code of the last failure is kept per thread for the log.
 *
 * Physical memory is a small heap record (the CUmemGenericAllocationHandle, its size and its
 * location) so that map can check ranges before the driver sees them. The driver maps only a whole
 * physical allocation (offset 0, its full size; measured: a prefix or a non-zero offset answers
 * CUDA_ERROR_NOT_SUPPORTED): other ranges answer FS_ERR_UNSUPPORTED here, so the engine needs one
 * physical allocation per mapped piece. Likewise unmap takes exactly a mapped range: unmapping
 * part of one answers CUDA_ERROR_INVALID_VALUE (FS_ERR_INVALID). Host-located physical
 * memory is cuMemCreate with a CU_MEM_LOCATION_TYPE_HOST_NUMA location (HOST_NUMA_CURRENT is
 * refused by the driver): the NUMA node closest to the device when the driver names one, node 0
 * otherwise; opening probes it once (create, reserve, map, set access) and records the result in
 * props.host_phys_supported. */
#include "device.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_api.h"
#include "fs.h"
#include "log.h"

struct cuda_impl {
    int ordinal;
    CUdevice cudev;
    CUcontext ctx;     /* the retained primary context */
    int host_numa_id;  /* node for host-located physical memory, valid if host_phys_supported */
    uint64_t dev_gran; /* minimum granularity of device-located physical memory */
    uint64_t host_gran;
};

struct cuda_phys {
    CUmemGenericAllocationHandle handle;
    uint64_t size;
    enum fs_mem_loc loc;
};

/* The native code of the last failure on this thread (CUDA_SUCCESS until one happens). */
static __thread CUresult tl_last_error;

static struct cuda_impl *impl_of(struct fs_device *dev)
{
    return (struct cuda_impl *)dev->impl;
}

/* Errors after which the context is unusable: every later call fails the same way. */
static bool cu_is_sticky(CUresult res)
{
    switch (res) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
        return true;
    default:
        return false;
    }
}

static int cu_translate(CUresult res)
{
    switch (res) {
    case CUDA_SUCCESS:
        return FS_OK;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return FS_ERR_NOMEM;
    case CUDA_ERROR_NOT_READY:
        return FS_ERR_NOT_READY;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
        return FS_ERR_INVALID;
    case CUDA_ERROR_NOT_SUPPORTED:
        return FS_ERR_UNSUPPORTED;
    default:
        return cu_is_sticky(res) ? FS_ERR_STICKY : FS_ERR_DEVICE;
    }
}

/* Record and log a failed call; returns the fs_err for RES (FS_OK on success). */
static int cu_check(CUresult res, const char *what)
{
    if (FS_LIKELY(res == CUDA_SUCCESS))
        return FS_OK;
    tl_last_error = res;
    FS_DEBUG("cuda: %s failed: %s", what, fs_cuda_errstr(res));
    return cu_translate(res);
}

#define CU_CHECK(call) cu_check(fs_cuda.call, #call)

/* Make the primary context current on this thread if it is not already. */
static int ensure_ctx(struct cuda_impl *c)
{
    CUcontext cur = NULL;
    if (FS_LIKELY(fs_cuda.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c->ctx))
        return FS_OK;
    if (cur != NULL)
        FS_TRACE("cuda: thread had another context current (%p); switching to the primary one",
                 (void *)cur);
    return CU_CHECK(cuCtxSetCurrent(c->ctx));
}

#define ENSURE_CTX(c)                                                                              \
    do {                                                                                           \
        int ctx_err_ = ensure_ctx(c);                                                              \
        if (FS_UNLIKELY(ctx_err_ != FS_OK))                                                        \
            return ctx_err_;                                                                       \
    } while (0)

static void fill_prop(CUmemAllocationProp *prop, CUmemLocationType type, int id)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    prop->location.type = type;
    prop->location.id = id;
}

static void fill_access(CUmemAccessDesc *desc, int ordinal)
{
    memset(desc, 0, sizeof(*desc));
    desc->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc->location.id = ordinal;
    desc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* ---- operations ---------------------------------------------------------------------------- */

static int cuda_props(struct fs_device *dev, struct fs_device_props *out)
{
    if (!out)
        return FS_ERR_INVALID;
    *out = dev->props;
    return FS_OK;
}

static int cuda_mem_info(struct fs_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct cuda_impl *c = impl_of(dev);
    size_t fr = 0, tot = 0;
    if (!free_bytes || !total_bytes)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuMemGetInfo(&fr, &tot));
    if (err != FS_OK)
        return err;
    *free_bytes = fr;
    *total_bytes = tot;
    return FS_OK;
}

static int cuda_phys_create(struct fs_device *dev, uint64_t size, enum fs_mem_loc loc,
                            fs_phys *out)
{
    struct cuda_impl *c = impl_of(dev);
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle handle = 0;
    struct cuda_phys *p = NULL;
    int err;

    if (!out || size == 0 || size % dev->props.granularity != 0)
        return FS_ERR_INVALID;
    if (loc == FS_LOC_DEVICE)
        fill_prop(&prop, CU_MEM_LOCATION_TYPE_DEVICE, c->ordinal);
    else if (loc == FS_LOC_HOST) {
        if (!dev->props.host_phys_supported)
            return FS_ERR_UNSUPPORTED;
        fill_prop(&prop, CU_MEM_LOCATION_TYPE_HOST_NUMA, c->host_numa_id);
    } else
        return FS_ERR_INVALID;

    p = calloc(1, sizeof(*p));
    if (!p)
        return FS_ERR_NOMEM;
    err = ensure_ctx(c);
    if (err != FS_OK)
        goto out;
    err = CU_CHECK(cuMemCreate(&handle, size, &prop, 0));
    if (err != FS_OK)
        goto out;
    p->handle = handle;
    p->size = size;
    p->loc = loc;
    *out = (fs_phys)p;
    p = NULL;
out:
    free(p);
    return err;
}

/* On failure the record is kept (the handle is still live) so that the caller may retry. */
static int cuda_phys_release(struct fs_device *dev, fs_phys phys)
{
    struct cuda_impl *c = impl_of(dev);
    struct cuda_phys *p = (struct cuda_phys *)phys;
    if (!p)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuMemRelease(p->handle));
    if (err != FS_OK)
        return err;
    free(p);
    return FS_OK;
}

static int cuda_va_reserve(struct fs_device *dev, uint64_t size, fs_dptr *out)
{
    struct cuda_impl *c = impl_of(dev);
    CUdeviceptr va = 0;
    if (!out || size == 0 || size % dev->props.granularity != 0)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuMemAddressReserve(&va, size, dev->props.granularity, 0, 0));
    if (err != FS_OK)
        return err;
    *out = (fs_dptr)va;
    return FS_OK;
}

static int cuda_va_release(struct fs_device *dev, fs_dptr va, uint64_t size)
{
    struct cuda_impl *c = impl_of(dev);
    if (va == 0 || size == 0)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuMemAddressFree((CUdeviceptr)va, size));
}

static int cuda_map(struct fs_device *dev, fs_dptr va, uint64_t size, fs_phys phys,
                    uint64_t phys_offset)
{
    struct cuda_impl *c = impl_of(dev);
    struct cuda_phys *p = (struct cuda_phys *)phys;
    CUmemAccessDesc access;
    int err;

    if (!p || va == 0 || size == 0 || phys_offset > p->size || size > p->size - phys_offset)
        return FS_ERR_INVALID;
    if (phys_offset != 0 || size != p->size) {
        /* cuMemMap: "offset ... currently must be zero", and the driver (580, H200) answers
         * CUDA_ERROR_NOT_SUPPORTED for a prefix of the allocation too: only whole ones map. */
        FS_DEBUG("cuda: map of %llu bytes at offset %llu of a %llu-byte physical allocation: "
                 "the driver maps only whole allocations",
                 (unsigned long long)size, (unsigned long long)phys_offset,
                 (unsigned long long)p->size);
        return FS_ERR_UNSUPPORTED;
    }
    ENSURE_CTX(c);
    err = CU_CHECK(cuMemMap((CUdeviceptr)va, size, phys_offset, p->handle, 0));
    if (err != FS_OK)
        return err;
    fill_access(&access, c->ordinal);
    err = CU_CHECK(cuMemSetAccess((CUdeviceptr)va, size, &access, 1));
    if (err != FS_OK) {
        /* Leave nothing half done; the set-access error is the one reported. */
        CUresult res = fs_cuda.cuMemUnmap((CUdeviceptr)va, size);
        if (res != CUDA_SUCCESS)
            FS_DEBUG("cuda: cuMemUnmap after failed cuMemSetAccess failed: %s",
                     fs_cuda_errstr(res));
        return err;
    }
    return FS_OK;
}

static int cuda_unmap(struct fs_device *dev, fs_dptr va, uint64_t size)
{
    struct cuda_impl *c = impl_of(dev);
    if (va == 0 || size == 0)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuMemUnmap((CUdeviceptr)va, size));
}

static int cuda_stream_create(struct fs_device *dev, fs_stream *out)
{
    struct cuda_impl *c = impl_of(dev);
    CUstream s = NULL;
    if (!out)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (err != FS_OK)
        return err;
    *out = (fs_stream)s;
    return FS_OK;
}

static int cuda_stream_destroy(struct fs_device *dev, fs_stream stream)
{
    struct cuda_impl *c = impl_of(dev);
    if (!stream)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuStreamDestroy((CUstream)stream));
}

static int cuda_stream_sync(struct fs_device *dev, fs_stream stream)
{
    struct cuda_impl *c = impl_of(dev);
    ENSURE_CTX(c);
    return CU_CHECK(cuStreamSynchronize((CUstream)stream));
}

static int cuda_copy_async(struct fs_device *dev, fs_dptr dst, fs_dptr src, uint64_t size,
                           fs_stream stream)
{
    struct cuda_impl *c = impl_of(dev);
    if (dst == 0 || src == 0)
        return FS_ERR_INVALID;
    if (size == 0)
        return FS_OK;
    ENSURE_CTX(c);
    return CU_CHECK(
        cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, size, (CUstream)stream));
}

static int cuda_event_create(struct fs_device *dev, bool timing, fs_event *out)
{
    struct cuda_impl *c = impl_of(dev);
    CUevent e = NULL;
    if (!out)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuEventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING));
    if (err != FS_OK)
        return err;
    *out = (fs_event)e;
    return FS_OK;
}

static int cuda_event_destroy(struct fs_device *dev, fs_event event)
{
    struct cuda_impl *c = impl_of(dev);
    if (!event)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuEventDestroy((CUevent)event));
}

static int cuda_event_record(struct fs_device *dev, fs_event event, fs_stream stream)
{
    struct cuda_impl *c = impl_of(dev);
    if (!event)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuEventRecord((CUevent)event, (CUstream)stream));
}

static int cuda_event_query(struct fs_device *dev, fs_event event)
{
    struct cuda_impl *c = impl_of(dev);
    if (!event)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    CUresult res = fs_cuda.cuEventQuery((CUevent)event);
    if (res == CUDA_ERROR_NOT_READY) /* an answer, not a failure */
        return FS_ERR_NOT_READY;
    return cu_check(res, "cuEventQuery");
}

static int cuda_event_sync(struct fs_device *dev, fs_event event)
{
    struct cuda_impl *c = impl_of(dev);
    if (!event)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuEventSynchronize((CUevent)event));
}

static int cuda_stream_wait_event(struct fs_device *dev, fs_stream stream, fs_event event)
{
    struct cuda_impl *c = impl_of(dev);
    if (!event)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    return CU_CHECK(cuStreamWaitEvent((CUstream)stream, (CUevent)event, CU_EVENT_WAIT_DEFAULT));
}

static int cuda_event_elapsed_ms(struct fs_device *dev, fs_event start, fs_event end, float *ms)
{
    struct cuda_impl *c = impl_of(dev);
    float v = 0.0f;
    if (!start || !end || !ms)
        return FS_ERR_INVALID;
    ENSURE_CTX(c);
    int err = CU_CHECK(cuEventElapsedTime(&v, (CUevent)start, (CUevent)end));
    if (err != FS_OK)
        return err;
    *ms = v;
    return FS_OK;
}

/* The two queries below run on the program's own threads, inside the CUPTI callback of a launch,
 * once per new kernel or per slow-path launch: they call nothing that synchronizes or blocks, and
 * they leave the thread's current context as they found it. A runtime program has the primary
 * context current already (one cuCtxGetCurrent); a driver-API program with a context of its own
 * would otherwise find it silently replaced by ours after its launch returns. */
static int ctx_enter(struct cuda_impl *c, CUcontext *prev)
{
    CUcontext cur = NULL;
    *prev = NULL;
    if (FS_LIKELY(fs_cuda.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c->ctx))
        return FS_OK;
    int err = CU_CHECK(cuCtxSetCurrent(c->ctx));
    if (err == FS_OK)
        *prev = cur; /* NULL when nothing was current: then nothing to restore */
    return err;
}

static void ctx_leave(CUcontext prev)
{
    if (FS_UNLIKELY(prev != NULL)) {
        CUresult res = fs_cuda.cuCtxSetCurrent(prev);
        if (res != CUDA_SUCCESS)
            FS_DEBUG("cuda: restoring the program's context %p failed: %s", (void *)prev,
                     fs_cuda_errstr(res));
    }
}

/* STREAM is passed to the driver as is: a stream of ours or the program's, the legacy default
 * stream (NULL; the non-_ptsz entry point is resolved, so NULL means legacy) or
 * CU_STREAM_PER_THREAD. INVALIDATED counts as capturing (the capture is still open until
 * cuStreamEndCapture). CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, answered for the legacy stream while a
 * blocking stream of the context is capturing, counts as capturing too: work on the legacy stream
 * would depend on that capture, so nothing that a capture forbids may be done for it. */
static int cuda_stream_capturing(struct fs_device *dev, fs_stream stream, bool *capturing)
{
    struct cuda_impl *c = impl_of(dev);
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUcontext prev;
    if (!capturing)
        return FS_ERR_INVALID;
    int err = ctx_enter(c, &prev);
    if (FS_UNLIKELY(err != FS_OK))
        return err;
    CUresult res = fs_cuda.cuStreamIsCapturing((CUstream)stream, &status);
    ctx_leave(prev);
    if (res == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        *capturing = true;
        return FS_OK;
    }
    err = cu_check(res, "cuStreamIsCapturing");
    if (err != FS_OK)
        return err;
    *capturing = status != CU_STREAM_CAPTURE_STATUS_NONE;
    return FS_OK;
}

/* Parameter I of FUNC, through cuFuncGetParamInfo or (AS_KERNEL) cuKernelGetParamInfo. */
static CUresult param_info(const void *func, bool as_kernel, int i, size_t *offset, size_t *size)
{
    if (as_kernel)
        return fs_cuda.cuKernelGetParamInfo((CUkernel)(uintptr_t)func, (size_t)i, offset, size);
    return fs_cuda.cuFuncGetParamInfo((CUfunction)(uintptr_t)func, (size_t)i, offset, size);
}

/* Query parameters 0, 1, ... until the driver answers CUDA_ERROR_INVALID_VALUE (past the end).
 * FS_OK with the count in *N; FS_ERR_UNSUPPORTED for more than MAX parameters; otherwise the
 * CUresult of the failing call in *RES (its index in *AT). */
static int param_walk(const void *func, bool as_kernel, uint32_t *offsets, uint32_t *sizes,
                      int max, int *n, CUresult *res, int *at)
{
    for (int i = 0;; i++) {
        size_t off = 0, sz = 0;
        CUresult r = param_info(func, as_kernel, i, &off, &sz);
        if (r == CUDA_ERROR_INVALID_VALUE) {
            *n = i;
            return FS_OK;
        }
        if (r != CUDA_SUCCESS) {
            *res = r;
            *at = i;
            return FS_ERR_DEVICE;
        }
        if (i >= max) {
            /* More parameters than the caller has room for. A partial layout would let the
             * caller miss pointers in the parameters it was not told about, so report the
             * launch as unreadable (the caller then treats it conservatively). */
            FS_DEBUG("cuda: kernel %p has more than %d parameters", func, max);
            return FS_ERR_UNSUPPORTED;
        }
        if (off > UINT32_MAX || sz > UINT32_MAX)
            return FS_ERR_UNSUPPORTED; /* cannot be: the parameter space is a few KiB */
        offsets[i] = (uint32_t)off;
        sizes[i] = (uint32_t)sz;
    }
}

/* FUNC is whatever the launch named as its CUfunction. Runtime launches (cudaLaunchKernel) pass a
 * CUkernel cast to CUfunction, for which cuFuncGetParamInfo answers CUDA_ERROR_INVALID_HANDLE
 * (measured) while cuKernelGetParamInfo works; so when the very first cuFuncGetParamInfo fails
 * with anything but INVALID_VALUE (which means zero parameters), the walk is repeated as a
 * CUkernel. Neither reads anything but the module's metadata: no synchronization.
 * *N is set only on success; OFFSETS and SIZES may have been written on failure. */
static int cuda_param_layout(struct fs_device *dev, const void *func, uint32_t *offsets,
                             uint32_t *sizes, int max, int *n)
{
    struct cuda_impl *c = impl_of(dev);
    CUresult res = CUDA_SUCCESS;
    CUcontext prev;
    int at = 0, count = 0;
    if (!func || !n || max < 0 || (max > 0 && (!offsets || !sizes)))
        return FS_ERR_INVALID;
    int err = ctx_enter(c, &prev);
    if (FS_UNLIKELY(err != FS_OK))
        return err;
    err = param_walk(func, false, offsets, sizes, max, &count, &res, &at);
    if (err == FS_ERR_DEVICE && at == 0) {
        CUresult as_func = res;
        err = param_walk(func, true, offsets, sizes, max, &count, &res, &at);
        if (err == FS_ERR_DEVICE)
            FS_DEBUG("cuda: parameter layout of %p unknown: cuFuncGetParamInfo: %s, "
                     "cuKernelGetParamInfo: %s",
                     func, fs_cuda_errstr(as_func), fs_cuda_errstr(res));
    } else if (err == FS_ERR_DEVICE) {
        FS_DEBUG("cuda: cuFuncGetParamInfo(%p, %d) failed: %s", func, at, fs_cuda_errstr(res));
    }
    ctx_leave(prev);
    if (err == FS_ERR_DEVICE) {
        tl_last_error = res;
        return FS_ERR_UNSUPPORTED;
    }
    if (err != FS_OK)
        return err;
    *n = count;
    return FS_OK;
}

/* Runtime-launched kernels are CUkernel handles (cuFuncGetName refuses them), driver-launched
 * ones CUfunction: try both, like param_layout. */
static int cuda_kernel_name(struct fs_device *dev, const void *func, const char **name)
{
    struct cuda_impl *c = impl_of(dev);
    CUcontext prev;
    if (!func || !name)
        return FS_ERR_INVALID;
    int err = ctx_enter(c, &prev);
    if (FS_UNLIKELY(err != FS_OK))
        return err;
    const char *got = NULL;
    CUresult res = fs_cuda.cuFuncGetName(&got, (CUfunction)func);
    if (res != CUDA_SUCCESS || !got)
        res = fs_cuda.cuKernelGetName(&got, (CUkernel)func);
    ctx_leave(prev);
    if (res != CUDA_SUCCESS || !got) {
        tl_last_error = res;
        return FS_ERR_UNSUPPORTED;
    }
    *name = got;
    return FS_OK;
}

static int cuda_ctx_sync(struct fs_device *dev)
{
    struct cuda_impl *c = impl_of(dev);
    ENSURE_CTX(c);
    return CU_CHECK(cuCtxSynchronize());
}

static int cuda_bind_thread(struct fs_device *dev)
{
    struct cuda_impl *c = impl_of(dev);
    return CU_CHECK(cuCtxSetCurrent(c->ctx));
}

static int cuda_last_native_error(struct fs_device *dev)
{
    (void)dev;
    return (int)tl_last_error;
}

static void cuda_close(struct fs_device *dev)
{
    if (!dev)
        return;
    struct cuda_impl *c = impl_of(dev);
    if (c) {
        CUresult res = fs_cuda.cuDevicePrimaryCtxRelease(c->cudev);
        if (res != CUDA_SUCCESS)
            FS_DEBUG("cuda: cuDevicePrimaryCtxRelease failed: %s", fs_cuda_errstr(res));
        free(c);
    }
    free(dev);
}

static const struct fs_device_ops cuda_ops = {
    .name = "cuda",
    .props = cuda_props,
    .mem_info = cuda_mem_info,
    .phys_create = cuda_phys_create,
    .phys_release = cuda_phys_release,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .copy_async = cuda_copy_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .stream_wait_event = cuda_stream_wait_event,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .stream_capturing = cuda_stream_capturing,
    .param_layout = cuda_param_layout,
    .kernel_name = cuda_kernel_name,
    .ctx_sync = cuda_ctx_sync,
    .bind_thread = cuda_bind_thread,
    .last_native_error = cuda_last_native_error,
    .close = cuda_close,
};

/* ---- opening ------------------------------------------------------------------------------- */

/* Can host-located physical memory on NUMA node NODE be created, mapped at a device VA and made
 * accessible to the device? Fills *GRAN with its minimum granularity when it can. The primary
 * context is current. Leaves nothing behind. */
static bool probe_host_phys(struct cuda_impl *c, int node, uint64_t *gran)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr va = 0;
    size_t g = 0;
    size_t size;
    bool created = false, reserved = false, mapped = false, ok = false;
    CUresult res;

    fill_prop(&prop, CU_MEM_LOCATION_TYPE_HOST_NUMA, node);
    res = fs_cuda.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (res != CUDA_SUCCESS || g == 0) {
        FS_DEBUG("cuda: host NUMA node %d: granularity query failed: %s", node,
                 fs_cuda_errstr(res));
        goto out;
    }
    size = g > c->dev_gran ? g : c->dev_gran;
    res = fs_cuda.cuMemCreate(&handle, size, &prop, 0);
    if (res != CUDA_SUCCESS) {
        FS_DEBUG("cuda: host NUMA node %d: cuMemCreate failed: %s", node, fs_cuda_errstr(res));
        goto out;
    }
    created = true;
    res = fs_cuda.cuMemAddressReserve(&va, size, size, 0, 0);
    if (res != CUDA_SUCCESS) {
        FS_DEBUG("cuda: host probe: cuMemAddressReserve failed: %s", fs_cuda_errstr(res));
        goto out;
    }
    reserved = true;
    res = fs_cuda.cuMemMap(va, size, 0, handle, 0);
    if (res != CUDA_SUCCESS) {
        FS_DEBUG("cuda: host NUMA node %d: cuMemMap failed: %s", node, fs_cuda_errstr(res));
        goto out;
    }
    mapped = true;
    fill_access(&access, c->ordinal);
    res = fs_cuda.cuMemSetAccess(va, size, &access, 1);
    if (res != CUDA_SUCCESS) {
        FS_DEBUG("cuda: host NUMA node %d: cuMemSetAccess failed: %s", node,
                 fs_cuda_errstr(res));
        goto out;
    }
    *gran = g;
    ok = true;
out:
    if (mapped && (res = fs_cuda.cuMemUnmap(va, size)) != CUDA_SUCCESS) {
        FS_DEBUG("cuda: host probe: cuMemUnmap failed: %s", fs_cuda_errstr(res));
        ok = false;
    }
    if (reserved && (res = fs_cuda.cuMemAddressFree(va, size)) != CUDA_SUCCESS)
        FS_DEBUG("cuda: host probe: cuMemAddressFree failed: %s", fs_cuda_errstr(res));
    if (created && (res = fs_cuda.cuMemRelease(handle)) != CUDA_SUCCESS)
        FS_DEBUG("cuda: host probe: cuMemRelease failed: %s", fs_cuda_errstr(res));
    return ok;
}

/* cuInit failures that mean "no usable GPU here" rather than a broken one. */
static bool cu_means_absent(CUresult res)
{
    switch (res) {
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_NOT_SUPPORTED:
        return true;
    default:
        return false;
    }
}

int fs_device_cuda_open(int ordinal, struct fs_device **out)
{
    struct fs_device *dev = NULL;
    struct cuda_impl *c = NULL;
    bool retained = false;
    CUmemAllocationProp prop;
    size_t gran = 0, total = 0;
    int vmm = 0, attr = 0;
    CUresult res;
    int err;

    if (!out || ordinal < 0)
        return FS_ERR_INVALID;
    if (fs_cuda_load_driver() != FS_OK)
        return FS_ERR_UNSUPPORTED;

    res = fs_cuda.cuInit(0);
    if (res != CUDA_SUCCESS) {
        err = cu_check(res, "cuInit");
        if (cu_means_absent(res))
            err = FS_ERR_UNSUPPORTED;
        return err;
    }

    dev = calloc(1, sizeof(*dev));
    c = calloc(1, sizeof(*c));
    if (!dev || !c) {
        err = FS_ERR_NOMEM;
        goto out;
    }
    c->ordinal = ordinal;
    res = fs_cuda.cuDeviceGet(&c->cudev, ordinal);
    if (res != CUDA_SUCCESS) {
        err = cu_check(res, "cuDeviceGet");
        if (res == CUDA_ERROR_INVALID_DEVICE)
            err = FS_ERR_INVALID;
        goto out;
    }
    err = CU_CHECK(cuDevicePrimaryCtxRetain(&c->ctx, c->cudev));
    if (err != FS_OK)
        goto out;
    retained = true;
    err = CU_CHECK(cuCtxSetCurrent(c->ctx));
    if (err != FS_OK)
        goto out;

    err = CU_CHECK(cuDeviceGetAttribute(
        &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, c->cudev));
    if (err != FS_OK)
        goto out;
    if (!vmm) {
        FS_INFO("cuda: device %d does not support virtual memory management", ordinal);
        err = FS_ERR_UNSUPPORTED;
        goto out;
    }

    dev->props.ordinal = ordinal;
    err = CU_CHECK(cuDeviceGetName(dev->props.name, (int)sizeof(dev->props.name), c->cudev));
    if (err != FS_OK)
        goto out;
    dev->props.name[sizeof(dev->props.name) - 1] = '\0';
    err = CU_CHECK(cuDeviceGetAttribute(&dev->props.cc_major,
                                        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, c->cudev));
    if (err != FS_OK)
        goto out;
    err = CU_CHECK(cuDeviceGetAttribute(&dev->props.cc_minor,
                                        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, c->cudev));
    if (err != FS_OK)
        goto out;
    err = CU_CHECK(cuDeviceTotalMem(&total, c->cudev));
    if (err != FS_OK)
        goto out;
    dev->props.total_bytes = total;
    if (fs_cuda.cuDriverGetVersion(&dev->props.driver_version) != CUDA_SUCCESS)
        dev->props.driver_version = 0; /* only shown */

    fill_prop(&prop, CU_MEM_LOCATION_TYPE_DEVICE, ordinal);
    err = CU_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    if (err != FS_OK)
        goto out;
    if (gran == 0 || (gran & (gran - 1)) != 0) {
        FS_WARN("cuda: device %d reports an unusable allocation granularity %zu", ordinal, gran);
        err = FS_ERR_DEVICE;
        goto out;
    }
    c->dev_gran = gran;

    /* Host-located physical memory: the NUMA node next to the device first, then node 0. */
    {
        int nodes[2] = {0, 0};
        int nnodes = 0;
        if (fs_cuda.cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, c->cudev) ==
                CUDA_SUCCESS &&
            attr > 0)
            nodes[nnodes++] = attr;
        nodes[nnodes++] = 0;
        for (int i = 0; i < nnodes && !dev->props.host_phys_supported; i++) {
            uint64_t hg = 0;
            if (probe_host_phys(c, nodes[i], &hg)) {
                dev->props.host_phys_supported = true;
                c->host_numa_id = nodes[i];
                c->host_gran = hg;
            }
        }
        if (!dev->props.host_phys_supported)
            FS_INFO("cuda: device %d cannot map host-located physical memory "
                    "(cuMemCreate with CU_MEM_LOCATION_TYPE_HOST_NUMA failed)",
                    ordinal);
    }
    dev->props.granularity = c->dev_gran;
    if (dev->props.host_phys_supported && c->host_gran > dev->props.granularity) {
        if (c->host_gran % c->dev_gran != 0) {
            FS_WARN("cuda: host granularity %llu is not a multiple of device granularity %llu",
                    (unsigned long long)c->host_gran, (unsigned long long)c->dev_gran);
            err = FS_ERR_DEVICE;
            goto out;
        }
        dev->props.granularity = c->host_gran;
    }

    FS_DEBUG("cuda: device %d \"%s\" cc %d.%d, %llu MiB, granularity %llu KiB, host-located "
             "physical memory %s (NUMA node %d)",
             ordinal, dev->props.name, dev->props.cc_major, dev->props.cc_minor,
             (unsigned long long)(dev->props.total_bytes >> 20),
             (unsigned long long)(dev->props.granularity >> 10),
             dev->props.host_phys_supported ? "yes" : "no", c->host_numa_id);

    dev->ops = &cuda_ops;
    dev->impl = c;
    *out = dev;
    return FS_OK;

out:
    if (retained) {
        res = fs_cuda.cuDevicePrimaryCtxRelease(c->cudev);
        if (res != CUDA_SUCCESS)
            FS_DEBUG("cuda: cuDevicePrimaryCtxRelease failed: %s", fs_cuda_errstr(res));
    }
    free(c);
    free(dev);
    return err;
}

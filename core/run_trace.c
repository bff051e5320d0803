#include "run_trace.h"

#include <stdio.h>
#include <stdlib.h>

#include "fs.h"

struct span {
    uint64_t t0, t1, id, bytes;
    int32_t lane;
    uint32_t tag; /* kind + 1 once the span is complete (release), 0 before */
};

static struct {
    struct span *buf;
    uint64_t cap;
    uint64_t next; /* atomic: spans reserved, including those that did not fit */
    int on;        /* atomic */
} rt;

static FS_TLS int lane_tls = FS_RT_PROGRAM;

/* Each kind's name in the trace and its category (Perfetto colours and filters by it). */
static const struct {
    const char *name, *cat;
} kinds[FS_RT_KINDS] = {
    [FS_RT_LATE_WAIT] = {"late wait", "wait"},
    [FS_RT_BEGIN_PREFETCH] = {"begin prefetch", "begin"},
    [FS_RT_BEGIN_EVICT] = {"begin eviction", "begin"},
    [FS_RT_HELD] = {"held for room", "wait"},
    [FS_RT_COPY_WAIT] = {"copy wait", "wait"},
    [FS_RT_MAP_DEVICE] = {"map device", "remap"},
    [FS_RT_MAP_HOST] = {"map host", "remap"},
    [FS_RT_UNMAP_DEVICE] = {"unmap device", "remap"},
    [FS_RT_UNMAP_HOST] = {"unmap host", "remap"},
    [FS_RT_PREFETCH] = {"prefetch", "move"},
    [FS_RT_EVICT] = {"eviction", "move"},
    [FS_RT_ITERATION] = {"iteration", "step"},
    [FS_RT_HOST_READ] = {"host read", "host"},
    [FS_RT_STREAM_IDLE] = {"stream idle", "wait"},
    [FS_RT_FAULT_IN] = {"fault-in", "move"},
    [FS_RT_SYNC] = {"synchronize", "wait"},
};

static const char *const lane_names[FS_RT_SLOTS] = {
    [FS_RT_PROGRAM] = "program",          [FS_RT_MOVER] = "mover",
    [FS_RT_FIN_EVICT] = "evict finisher", [FS_RT_FIN_PREFETCH] = "prefetch finisher",
    [FS_RT_FIN_MAP] = "early mapper",     [FS_RT_PINNER] = "pinner",
};

int fs_rt_open(uint64_t capacity)
{
    if (rt.buf)
        return FS_ERR_INVALID;
    rt.buf = calloc(capacity, sizeof(*rt.buf));
    if (!rt.buf)
        return FS_ERR_NOMEM;
    rt.cap = capacity;
    __atomic_store_n(&rt.next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&rt.on, 1, __ATOMIC_RELEASE);
    return FS_OK;
}

bool fs_rt_on(void)
{
    return __atomic_load_n(&rt.on, __ATOMIC_ACQUIRE) != 0;
}

void fs_rt_set_lane(int lane)
{
    lane_tls = lane;
}

void fs_rt_span_on(int lane, enum fs_rt_kind kind, uint64_t id, uint64_t bytes, uint64_t t0,
                   uint64_t t1)
{
    if (!fs_rt_on())
        return;
    uint64_t i = __atomic_fetch_add(&rt.next, 1, __ATOMIC_RELAXED);
    if (i >= rt.cap)
        return;
    struct span *s = &rt.buf[i];
    *s = (struct span){.t0 = t0, .t1 = t1 < t0 ? t0 : t1, .id = id, .bytes = bytes, .lane = lane};
    __atomic_store_n(&s->tag, (uint32_t)kind + 1, __ATOMIC_RELEASE);
}

void fs_rt_span(enum fs_rt_kind kind, uint64_t id, uint64_t bytes, uint64_t t0, uint64_t t1)
{
    fs_rt_span_on(lane_tls, kind, id, bytes, t0, t1);
}

static void lane_name(int lane, char *buf, size_t n)
{
    if (lane >= 0 && lane < FS_RT_SLOTS)
        snprintf(buf, n, "%s", lane_names[lane]);
    else
        snprintf(buf, n, "slot %d", lane - FS_RT_SLOTS);
}

/* One JSON event per span of the first *N (a uint64_t); the lanes seen get a name and their
 * order. */
static int write_events(FILE *f, void *arg)
{
    uint64_t n = *(const uint64_t *)arg;
    uint64_t base = UINT64_MAX;
    int max_lane = 0;
    for (uint64_t i = 0; i < n; i++)
        if (__atomic_load_n(&rt.buf[i].tag, __ATOMIC_ACQUIRE)) {
            base = rt.buf[i].t0 < base ? rt.buf[i].t0 : base;
            max_lane = rt.buf[i].lane > max_lane ? rt.buf[i].lane : max_lane;
        }
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
    fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"args\":{\"name\":\"flexshim\"}}",
          f);
    for (int lane = 0; lane <= max_lane; lane++) {
        char name[32];
        lane_name(lane, name, sizeof(name));
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                "\"args\":{\"name\":\"%s\"}}"
                ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                lane, name, lane, lane);
    }
    for (uint64_t i = 0; i < n; i++) {
        const struct span *s = &rt.buf[i];
        uint32_t tag = __atomic_load_n(&s->tag, __ATOMIC_ACQUIRE);
        if (!tag)
            continue;
        enum fs_rt_kind k = (enum fs_rt_kind)(tag - 1);
        double ts = (double)(s->t0 - base) / 1e3, dur = (double)(s->t1 - s->t0) / 1e3;
        if (k == FS_RT_ITERATION)
            fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,"
                       "\"pid\":1,\"tid\":%d}",
                    kinds[k].name, kinds[k].cat, ts, s->lane);
        else
            fprintf(f, ",\n{\"name\":\"%s %llu\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,"
                       "\"dur\":%.3f,\"pid\":1,\"tid\":%d,\"args\":{\"allocation\":%llu,"
                       "\"bytes\":%llu}}",
                    kinds[k].name, (unsigned long long)s->id, kinds[k].cat, ts, dur, s->lane,
                    (unsigned long long)s->id, (unsigned long long)s->bytes);
    }
    fputs("\n]}\n", f);
    return FS_OK;
}

int fs_rt_write(const char *path, uint64_t *kept, uint64_t *dropped)
{
    if (!fs_rt_on())
        return FS_ERR_INVALID;
    __atomic_store_n(&rt.on, 0, __ATOMIC_RELEASE);
    uint64_t reserved = __atomic_load_n(&rt.next, __ATOMIC_ACQUIRE);
    uint64_t n = reserved < rt.cap ? reserved : rt.cap;
    *kept = n;
    *dropped = reserved - n;
    /* The buffer stays: a span being stored now must not write into freed memory. */
    return fs_write_file(path, write_events, &n);
}

void fs_rt_close(void)
{
    __atomic_store_n(&rt.on, 0, __ATOMIC_RELEASE);
    free(rt.buf);
    rt.buf = NULL;
    rt.cap = 0;
}

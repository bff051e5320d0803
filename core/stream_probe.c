/* Stream probes: see stream_probe.h. */
#include "stream_probe.h"

#include <string.h>

#include "run_trace.h"

void fs_probe_pool_init(struct fs_probe_pool *pp, struct fs_device *dev, int span_kind)
{
    memset(pp, 0, sizeof(*pp));
    pp->dev = dev;
    pp->span_kind = span_kind;
}

static void setup(struct fs_probe_pool *pp)
{
    pp->setup = true;
    for (; pp->n < FS_PROBES; pp->n++) {
        struct fs_probe *p = &pp->p[pp->n];
        if (fs_dev_call(pp->dev, event_create, FS_EVENT_TIMING, &p->before) != FS_OK)
            break;
        if (fs_dev_call(pp->dev, event_create, FS_EVENT_TIMING, &p->after) != FS_OK) {
            fs_dev_call(pp->dev, event_destroy, p->before);
            break;
        }
    }
}

void fs_probe_pool_destroy(struct fs_probe_pool *pp)
{
    for (int i = 0; i < pp->n; i++) {
        fs_dev_call(pp->dev, event_destroy, pp->p[i].before);
        fs_dev_call(pp->dev, event_destroy, pp->p[i].after);
    }
    pp->n = 0;
}

void fs_probe_collect(struct fs_probe_pool *pp)
{
    for (int i = 0; i < pp->n; i++) {
        struct fs_probe *p = &pp->p[i];
        float ms = 0.0f;
        if (p->state != FS_PROBE_RECORDED)
            continue;
        int rc = fs_dev_call(pp->dev, event_elapsed_ms, p->before, p->after, &ms);
        if (rc == FS_ERR_NOT_READY)
            continue;
        p->state = FS_PROBE_FREE;
        if (rc != FS_OK) {
            pp->counts.missed++;
            continue;
        }
        uint64_t ns = ms > 0.0f ? (uint64_t)((double)ms * 1e6) : 0;
        bool host_wait = pp->span_kind >= 0;
        /* GPU and host clocks differ a little: never more than the host wait itself */
        if (host_wait && ns > p->t1 - p->t0)
            ns = p->t1 - p->t0;
        pp->counts.measured++;
        pp->counts.idle_ns += ns;
        if (host_wait && ns > 0)
            fs_rt_span_on(FS_RT_PROGRAM, (enum fs_rt_kind)pp->span_kind, p->id, p->bytes,
                          p->t1 - ns, p->t1);
    }
}

static struct fs_probe *free_probe(struct fs_probe_pool *pp)
{
    for (int i = 0; i < pp->n; i++)
        if (pp->p[i].state == FS_PROBE_FREE)
            return &pp->p[i];
    return NULL;
}

struct fs_probe *fs_probe_begin(struct fs_probe_pool *pp, fs_stream stream, bool recordable)
{
    if (!pp->setup)
        setup(pp);
    struct fs_probe *p = NULL;
    if (recordable) {
        /* read the completed ones only when none is free: one pass over the pool per FS_PROBES
         * waits, not one per wait (the ordered waits are on the launch path) */
        p = free_probe(pp);
        if (!p) {
            fs_probe_collect(pp);
            p = free_probe(pp);
        }
    }
    if (!p || fs_dev_call(pp->dev, event_record, p->before, stream) != FS_OK) {
        pp->counts.missed++;
        return NULL;
    }
    p->state = FS_PROBE_WAITING;
    return p;
}

void fs_probe_end(struct fs_probe_pool *pp, struct fs_probe *p, fs_stream stream, uint64_t id,
                  uint64_t bytes, uint64_t t0, uint64_t t1)
{
    if (!p)
        return;
    if (fs_dev_call(pp->dev, event_record, p->after, stream) != FS_OK) {
        p->state = FS_PROBE_FREE;
        pp->counts.missed++;
        return;
    }
    p->id = id;
    p->bytes = bytes;
    p->t0 = t0;
    p->t1 = t1;
    p->state = FS_PROBE_RECORDED;
}

/* Stream probes (run trace only): how long a stream had nothing to run because of a wait.
 *
 * A timing event recorded on the stream before the wait completes when the work queued before it
 * ends; one recorded after the wait completes once that work and the wait are both over. The time
 * between the two is what the wait cost the stream's device time (0 when its earlier work
 * outlasted the wait). Two uses, one pool each:
 *   - the executor's late waits: the program's thread waits on the host for a prefetch to begin,
 *     and the stream may run dry meanwhile ("stream idle" spans, ending where the wait ended);
 *   - the residency's ordered waits: a launch queued behind an arriving copy
 *     (cuStreamWaitEvent) waits on the device if the stream reaches it before the copy lands.
 *     Its place on the host clock is unknown (the device reaches it later), so it is counted, not
 *     drawn.
 * Events are read once both have completed, when the pool is next used or collected. The pool
 * has no lock of its own: its owner's lock guards every call. */
#ifndef FS_STREAM_PROBE_H
#define FS_STREAM_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"

#define FS_PROBES 128

/* What a pool measured: the stream's idle time over the waits measured, the waits measured, and
 * the waits that could not be. The counters' owners hand it out as it is. */
struct fs_probe_counts {
    uint64_t idle_ns, measured, missed;
};

struct fs_probe {
    fs_event before, after;
    uint64_t id, bytes; /* a host wait's allocation, for its span (0 for a device wait) */
    uint64_t t0, t1;    /* when a host wait began and ended (fs_now_ns; 0 for a device wait) */
    /* FREE; WAITING: taken by a thread in its wait (the owner's lock may be let go meanwhile,
     * and another thread's wait must not take it); RECORDED: both events recorded, not read */
    enum { FS_PROBE_FREE, FS_PROBE_WAITING, FS_PROBE_RECORDED } state;
};

struct fs_probe_pool {
    struct fs_device *dev;
    /* Waits on the host (the late waits): the run trace's kind of the span drawn for a wait
     * with idle time, which is at most the host wait. -1 for waits on the device (the ordered
     * waits): counted only, and bounded by nothing the host saw. */
    int span_kind;
    struct fs_probe p[FS_PROBES];
    int n;             /* probes with their events (made at the first wait traced) */
    bool setup;        /* their making was tried */
    struct fs_probe_counts counts;
};

void fs_probe_pool_init(struct fs_probe_pool *pp, struct fs_device *dev, int span_kind);
void fs_probe_pool_destroy(struct fs_probe_pool *pp);

/* A free probe with its first event recorded on STREAM, or NULL (counted as missed): !RECORDABLE
 * (a graph capture), none free, a failed record. Called only with the run trace on. */
struct fs_probe *fs_probe_begin(struct fs_probe_pool *pp, fs_stream stream, bool recordable);

/* The second event, after the wait (P NULL: nothing). */
void fs_probe_end(struct fs_probe_pool *pp, struct fs_probe *p, fs_stream stream, uint64_t id,
                  uint64_t bytes, uint64_t t0, uint64_t t1);

/* Read the probes whose events have completed into the counters (and spans). */
void fs_probe_collect(struct fs_probe_pool *pp);

#endif

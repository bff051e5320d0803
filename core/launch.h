/* Launch tracking: which managed allocations a kernel launch (or a copy) references.
 *
 * Kernel parameters are scanned word by word against the managed address range: with the layout
 * the driver reports for the kernel (cached per function), or the whole `extra` parameter buffer
 * when the launch passes one. A launch whose parameters cannot be read is "unknown": the next
 * remap synchronizes the device first (residency.h). */
#ifndef FS_LAUNCH_H
#define FS_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device.h"
#include "residency.h"

/* References kept per launch; a launch with more distinct managed allocations is unknown. */
#define FS_LAUNCH_MAX_REFS 256
/* Parameter words pointing into managed allocations that one launch can have redirected
 * (OFFLOAD_MODE=redirect); a launch with more is not redirected (its stages end first). */
#define FS_LAUNCH_MAX_WORDS 512

struct fs_launch_desc {
    const void *func;       /* kernel handle (layout cache key); NULL for copies */
    fs_stream stream;
    void *const *kernel_params; /* one pointer per parameter, or NULL */
    const void *param_buf;      /* the packed parameter buffer of `extra`, or NULL */
    size_t param_buf_size;
    const uint64_t *ptrs;       /* explicit addresses (copies, memsets), or NULL */
    int nptrs;
    bool unreadable;            /* the caller could not read the parameters at all */
};

/* Kernel identity across runs (the hash of its name, iteration.h); copies and memsets share one
 * signature, and a kernel whose layout could not even be allocated gets another. */
#define FS_SIG_COPY 1ull
#define FS_SIG_UNKNOWN 2ull

struct fs_launch_ticket {
    uint64_t tick;
    uint64_t sig;     /* FS_SIG_COPY for copies and memsets */
    int pos;          /* its place in the running plan's iteration where evictions follow it
                       (executor.h), else -1 */
    uint64_t t_enter_ns; /* when the launch reached flexshim, while profiling (else 0) */
    fs_stream stream;
    const void *func; /* the kernel, NULL for copies and memsets */
    bool unknown;     /* parameters could not be read */
    int n;
    bool active; /* references were taken: fs_launch_exit must run */
    bool counted; /* among the engine's open launches (engine.c, pausing launch tracking) */
    struct fs_alloc *refs[FS_LAUNCH_MAX_REFS];
    /* Where the scan found each pointer into a managed allocation (in the caller's parameter
     * memory), for redirection; FIXED: the launch cannot be redirected (a copy or memset, whose
     * addresses are not parameter words, or more words than fit). */
    bool fixed;
    int nwords, nrewritten; /* words found; words rewritten (the first ones), to restore */
    struct {
        unsigned char *at;
        uint64_t was;
        int ref; /* index in refs */
    } words[FS_LAUNCH_MAX_WORDS];
};

struct fs_launch_stats {
    uint64_t launches;       /* seen */
    uint64_t with_refs;      /* referencing at least one managed allocation: the sum of */
    /* ... by where its first reference was found: a copy's or memset's device range, the packed
     * `extra` parameter buffer, the kernel's parameters (counted; WITH_REFS is derived) */
    uint64_t refs_in_ranges, refs_in_extra, refs_in_params;
    uint64_t unknown;        /* parameters could not be read */
    uint64_t rewritten;      /* parameter words redirected to a staged allocation's copy */
    uint64_t layout_queries; /* driver queries (misses of the layout cache) */
};

struct fs_layout_cache;

int fs_launch_init(struct fs_device *dev);
void fs_launch_shutdown(void);

/* Before the launch is queued: find the references (scan), then hold them, faulting in what is
 * evicted, and redirect its pointers into staged allocations to their device copies (hold).
 * fs_launch_enter does both; the engine runs the plan between the two. The redirection writes
 * the launch's parameter memory (the caller's: the driver reads it when the launch is queued) and
 * fs_launch_exit puts the original values back. */
void fs_launch_scan(struct fs_residency *res, const struct fs_launch_desc *d,
                    struct fs_launch_ticket *t);
void fs_launch_hold(struct fs_residency *res, struct fs_launch_ticket *t);
void fs_launch_enter(struct fs_residency *res, const struct fs_launch_desc *d,
                     struct fs_launch_ticket *t);
/* After the driver queued it (QUEUED) or refused it. */
void fs_launch_exit(struct fs_residency *res, struct fs_launch_ticket *t, bool queued);

void fs_launch_get_stats(struct fs_launch_stats *out);

#endif

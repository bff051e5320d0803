/* The recorder: discovery and profiling, turned into a saved profile with a plan.
 *
 * Discovery records every launch (kernel, stream, the managed allocations it references) and the
 * sequence of managed allocations, until the iteration detector (iteration.h) finds the program's
 * iteration repeated DISCOVERY_ITERS + 1 times, with the same answer at two checks in a row.
 * Profiling then follows the iteration for PROFILING_ITERS more passes, recording timing events
 * just before and after each launch, and keeps per launch the median time between them (what
 * the GPU spends on it, and so the compute a transfer can hide behind; measured this way, the
 * gaps while the device waited for the program or for reactive fault-ins are left out). It also
 * follows it for at least 4096 launches: a layer repeated within each pass can look like the
 * iteration for a while. A launch sequence that departs from the recorded iteration sends the
 * recorder back to discovery (counted), and that period is not taken again.
 *
 * Where the program marks its iterations (flexshim_mark_iteration, or the ITERATION_KERNEL
 * setting naming the kernel each starts with), marks replace detection: the iteration is the
 * launches between two marks, taken once DISCOVERY_ITERS + 1 marked iterations were seen and the
 * last two are the same. When profiling is done the
 * link is measured, the configured strategy plans the iteration for the budget, the profile is
 * written to PROFILE_OUT (when set) and handed to the plan executor (executor.h), which runs it
 * from the next launch on. */
#ifndef FS_RECORDER_H
#define FS_RECORDER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "fingerprint.h"
#include "iteration.h"
#include "profile.h"

#define FS_REC_MAX_REJECTED 16

/* Called (recorder locked) with the finished profile and its plan; returns true when it took
 * the profile (then emptied it). */
typedef bool (*fs_rec_plan_fn)(void *arg, struct fs_profile *p);

/* Fingerprints of the managed allocations 0 .. N-1 as they are once the work queued so far is
 * done: FP[a] where KNOWN[a] (fs_res_fingerprint_all). Not FS_OK: none is used. */
typedef int (*fs_rec_fingerprint_fn)(void *arg, struct fs_fp *fp, bool *known, int n);

enum fs_rec_phase { FS_REC_OFF, FS_REC_DISCOVERY, FS_REC_PROFILING, FS_REC_DONE };

struct fs_rec_launch {
    uint64_t sig;
    fs_stream stream;
    const void *func;
    int nrefs, ref_start;
};

struct fs_rec_name {
    const void *func;
    uint64_t sig;
    char *name;
    bool starts_iteration; /* its name contains ITERATION_KERNEL */
};

struct fs_recorder {
    struct fs_device *dev;
    pthread_mutex_t lock;
    int phase; /* enum fs_rec_phase, atomic */
    int discovery_iters, profiling_iters;
    uint64_t budget;
    char strategy[32];
    char out_path[4096];
    /* discovery */
    struct fs_iter_detector det;
    struct fs_rec_launch *launches;
    int nlaunches;
    size_t cap_launches;
    uint64_t *refs;
    int nrefs;
    size_t cap_refs;
    int last_period; /* the previous detection's answer: a period is taken when two agree */
    /* explicit iteration starts (flexshim_mark_iteration, ITERATION_KERNEL): launch indices of
     * the last three, and how many were seen since discovery began */
    char iteration_kernel[256];
    bool mark_pending;
    int marks[3];
    int nmarks;
    bool marked_period; /* the period being profiled came from marks: no confirmation needed */
    /* the iteration being profiled */
    struct fs_rec_launch *tmpl;
    uint64_t *tmpl_refs;
    int period, pos, iters_timed;
    bool counting; /* pos reached 0 since profiling began */
    fs_event *events; /* 2 * period * profiling_iters: before and after each launch */
    float *host_us;   /* period * profiling_iters: host time before each launch, -1 unknown */
    uint64_t last_exit_ns; /* when the previous launch had been queued */
    /* allocations in order */
    uint64_t *alloc_size, *alloc_mapped;
    int nallocs;
    size_t cap_allocs;
    /* kernel names by function */
    struct fs_rec_name *names;
    int nnames;
    size_t cap_names;
    uint64_t departures;
    uint64_t followed;  /* launches matched since profiling began */
    int rejected[FS_REC_MAX_REJECTED]; /* periods the program left: not its iteration */
    int nrejected;
    fs_rec_plan_fn on_plan;
    void *on_plan_arg;
    /* the allocations' fingerprints when profiling began (fp_n of them; 0: none taken): those
     * the same at its end are marked unchanged in the profile */
    fs_rec_fingerprint_fn fingerprint;
    void *fingerprint_arg;
    struct fs_fp *fp;
    bool *fp_known;
    int fp_n;
};

struct fs_rec_config {
    int discovery_iters, profiling_iters;
    uint64_t budget;
    const char *strategy;
    const char *out_path;    /* where the profile is saved; "" or NULL: not saved */
    const char *iteration_kernel; /* part of the name of the kernel starting an iteration */
    bool idle;               /* start done, not discovering (a saved profile runs instead) */
    fs_rec_plan_fn on_plan;  /* optional: who runs the plan */
    void *on_plan_arg;
    fs_rec_fingerprint_fn fingerprint; /* optional: without it no allocation is unchanged */
    void *fingerprint_arg;
};

int fs_rec_init(struct fs_recorder *r, struct fs_device *dev, const struct fs_rec_config *cfg);
void fs_rec_destroy(struct fs_recorder *r);

static inline bool fs_rec_active(const struct fs_recorder *r)
{
    int phase = __atomic_load_n(&r->phase, __ATOMIC_ACQUIRE);
    return phase == FS_REC_DISCOVERY || phase == FS_REC_PROFILING;
}

/* Discover again from the next launch (the program left the plan's iteration, or a saved
 * profile did not match it). */
void fs_rec_restart(struct fs_recorder *r);

/* The program says an iteration starts with its next launch (flexshim_mark_iteration). */
void fs_rec_mark_iteration(struct fs_recorder *r);

/* A managed allocation was made (ORDER counts from 0 in allocation order); noted in every
 * phase, so a later discovery knows every allocation. */
void fs_rec_note_alloc(struct fs_recorder *r, uint64_t order, uint64_t size, uint64_t mapped);

/* A launch was queued: FUNC (NULL for copies), its signature SIG (launch.h), STREAM, the
 * allocation orders it referenced, and when it reached flexshim (T_ENTER_NS, 0 if unknown): the
 * time since the previous launch was queued is the program's own host time. */
void fs_rec_launch(struct fs_recorder *r, const void *func, uint64_t sig, fs_stream stream,
                   const uint64_t *orders, int n, uint64_t t_enter_ns);

/* A launch is about to be queued on STREAM (its references held): while profiling, the event
 * its time is measured from. */
void fs_rec_launch_start(struct fs_recorder *r, fs_stream stream);

/* Was RECORDED, a profile's program (the words of its command line joined by spaces), recorded
 * from the command line CMDLINE (LEN bytes, each word ended by a NUL, as /proc/self/cmdline)? The
 * words must be the same up to the first one after the command that is not an option (the
 * script of "python3 -u train.py", the module of "python3 -m pkg"); later arguments may differ.
 * fs_rec_is_this_program asks it of this process. */
bool fs_rec_same_program(const char *recorded, const char *cmdline, size_t len);
bool fs_rec_is_this_program(const char *recorded);

/* Build the profile recorded so far (used by fs_rec_launch when profiling ends; exposed for
 * tests). Durations are left 0 when no iteration was timed. */
int fs_rec_build_profile(struct fs_recorder *r, struct fs_profile *out);

/* Measure the link with a host and a device block (fills BW). */
int fs_rec_measure_link(struct fs_device *dev, struct fs_bw_model *bw);

#endif

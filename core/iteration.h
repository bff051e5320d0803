/* Finding the iteration in a stream of launches, with no code change in the program.
 *
 * A program that runs the same forward pass again and again queues the same sequence of kernels
 * each time. The detector keeps the recent launch signatures (kernel identities) and finds the
 * longest recent stretch that repeats with a fixed period, at least twice: that period is the
 * iteration. Warm-up passes that differ from the steady state fall outside the stretch. The
 * boundary inside the period is chosen where the program paused longest between two launches
 * (iterations usually end with host work: sampling, a copy back, Python), so the recorded
 * iteration starts where the program's does. */
#ifndef FS_ITERATION_H
#define FS_ITERATION_H

#include <stdint.h>

struct fs_iter_detector {
    uint64_t *sig;    /* signatures, oldest first */
    uint64_t *t_ns;   /* host time each launch was queued */
    int *pi;          /* scratch for the prefix function */
    int n, cap;
};

struct fs_iter_result {
    int period;       /* launches per iteration; 0 = none found */
    int repeats;      /* whole periods in the periodic stretch */
    int start;        /* index (in the detector's buffer) of a launch that starts an iteration;
                       * start + period <= n */
};

/* CAP: the most recent launches kept (older ones are dropped). */
int fs_iter_init(struct fs_iter_detector *d, int cap);
void fs_iter_destroy(struct fs_iter_detector *d);
void fs_iter_push(struct fs_iter_detector *d, uint64_t sig, uint64_t t_ns);

/* Find the iteration among what was pushed: the longest periodic recent stretch with at least
 * MIN_REPEATS whole periods (and a period of at least MIN_PERIOD launches, so a loop of one
 * kernel is not taken for the program's iteration). O(n). */
void fs_iter_detect(struct fs_iter_detector *d, int min_period, int min_repeats,
                    struct fs_iter_result *out);

/* A stable 64-bit hash of a kernel name (FNV-1a), the signature across runs. */
uint64_t fs_iter_hash_name(const char *name);

#endif

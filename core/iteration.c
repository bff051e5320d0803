#include "iteration.h"

#include <stdlib.h>
#include <string.h>

#include "fs.h"

int fs_iter_init(struct fs_iter_detector *d, int cap)
{
    memset(d, 0, sizeof(*d));
    d->sig = malloc((size_t)cap * sizeof(*d->sig));
    d->t_ns = malloc((size_t)cap * sizeof(*d->t_ns));
    d->pi = malloc((size_t)cap * sizeof(*d->pi));
    if (!d->sig || !d->t_ns || !d->pi) {
        fs_iter_destroy(d);
        return FS_ERR_NOMEM;
    }
    d->cap = cap;
    return FS_OK;
}

void fs_iter_destroy(struct fs_iter_detector *d)
{
    free(d->sig);
    free(d->t_ns);
    free(d->pi);
    memset(d, 0, sizeof(*d));
}

void fs_iter_push(struct fs_iter_detector *d, uint64_t sig, uint64_t t_ns)
{
    if (d->n == d->cap) { /* keep the newer half */
        int keep = d->cap / 2;
        memmove(d->sig, d->sig + d->n - keep, (size_t)keep * sizeof(*d->sig));
        memmove(d->t_ns, d->t_ns + d->n - keep, (size_t)keep * sizeof(*d->t_ns));
        d->n = keep;
    }
    d->sig[d->n] = sig;
    d->t_ns[d->n] = t_ns;
    d->n++;
}

void fs_iter_detect(struct fs_iter_detector *d, int min_period, int min_repeats,
                    struct fs_iter_result *out)
{
    memset(out, 0, sizeof(*out));
    int n = d->n;
    if (min_repeats < 2)
        min_repeats = 2;
    if (min_period < 1)
        min_period = 1;
    if (n < 2)
        return;
    /* Prefix function of the sequence read newest first: R[k] = sig[n-1-k]. For each prefix
     * length m of R, its smallest period is m - pi[m-1]; the longest prefix that holds at least
     * MIN_REPEATS periods is the most recent periodic stretch. */
#define R(k) (d->sig[n - 1 - (k)])
    int *pi = d->pi;
    pi[0] = 0;
    int best_m = 0, best_p = 0;
    for (int m = 1; m < n; m++) {
        int k = pi[m - 1];
        while (k > 0 && R(m) != R(k))
            k = pi[k - 1];
        if (R(m) == R(k))
            k++;
        pi[m] = k;
        int len = m + 1, p = len - k;
        if (p >= min_period && len >= p * min_repeats) {
            best_m = len;
            best_p = p;
        }
    }
#undef R
    if (best_p == 0)
        return;
    out->period = best_p;
    out->repeats = best_m / best_p;
    /* Within the newest period, the iteration starts after the longest pause; report the same
     * boundary one period earlier, so a whole iteration follows it (min_repeats >= 2). */
    int start = n - best_p;
    uint64_t longest = 0;
    for (int i = n - best_p; i < n; i++) {
        uint64_t gap = d->t_ns[i] > d->t_ns[i - 1] ? d->t_ns[i] - d->t_ns[i - 1] : 0;
        if (gap > longest) {
            longest = gap;
            start = i;
        }
    }
    out->start = start - best_p;
}

uint64_t fs_iter_hash_name(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 1099511628211ull;
    }
    return h;
}

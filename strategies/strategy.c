/* The strategy table and the link model's transfer times. */
#include <math.h>
#include <string.h>

#include "strategy.h"

/* "adaptive" first: the default. Adding a strategy: one file and one line here. */
const struct fs_strategy *const fs_strategies[] = {
    &fs_strategy_adaptive,
    &fs_strategy_knapsack,
    &fs_strategy_greedy,
    &fs_strategy_global,
    NULL,
};

const struct fs_strategy *fs_strategy_find(const char *name)
{
    if (!name)
        return NULL;
    for (int i = 0; fs_strategies[i]; i++)
        if (strcmp(fs_strategies[i]->name, name) == 0)
            return fs_strategies[i];
    return NULL;
}

/* Measured pinned PCIe Gen5 x16 copies on the target machine (DESIGN.md): about 55 GB/s each
 * way; the latency is a round figure for one cuMemcpyAsync. */
#define FS_BW_DEFAULT_BYTES_PER_US 55000.0
#define FS_BW_DEFAULT_LATENCY_US 10.0

static double link_us(double latency_us, double bytes_per_us, uint64_t bytes)
{
    if (!(bytes_per_us > 0.0) || !isfinite(bytes_per_us)) {
        bytes_per_us = FS_BW_DEFAULT_BYTES_PER_US;
        latency_us = FS_BW_DEFAULT_LATENCY_US;
    }
    if (!(latency_us >= 0.0) || !isfinite(latency_us))
        latency_us = 0.0;
    return latency_us + (double)bytes / bytes_per_us;
}

double fs_bw_h2d_us(const struct fs_bw_model *bw, uint64_t bytes)
{
    if (!bw)
        return link_us(0.0, 0.0, bytes);
    return link_us(bw->h2d_latency_us, bw->h2d_bytes_per_us, bytes);
}

double fs_bw_d2h_us(const struct fs_bw_model *bw, uint64_t bytes)
{
    if (!bw)
        return link_us(0.0, 0.0, bytes);
    return link_us(bw->d2h_latency_us, bw->d2h_bytes_per_us, bytes);
}

/* Fingerprints computed on the host (the simulated device, tests); see fingerprint.h. The GPU
 * kernel in core/fingerprint.cu computes the same function. */
#include "fingerprint.h"

#include <string.h>

static uint64_t term(uint64_t i, uint64_t w)
{
    uint64_t z = w + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl29(uint64_t v)
{
    return (v << 29) | (v >> 35);
}

struct fs_fp fs_fp_combine(const uint64_t *parts)
{
    struct fs_fp fp = {0, 0};
    for (int b = 0; b < FS_FP_PARTS; b++) {
        fp.sum += parts[2 * b];
        fp.x ^= parts[2 * b + 1];
    }
    return fp;
}

void fs_fp_host(const void *data, uint64_t size, uint64_t *parts)
{
    const unsigned char *p = data;
    uint64_t sum = 0, x = 0;
    for (uint64_t i = 0; i < size / 8; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, sizeof(w));
        uint64_t t = term(i, w);
        sum += t;
        x ^= rotl29(t);
    }
    memset(parts, 0, FS_FP_PARTS_BYTES);
    parts[0] = sum;
    parts[1] = x;
}

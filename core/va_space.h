/* The managed VA space: one large reserved range that holds every managed allocation, and a
 * granule-indexed table from address to allocation.
 *
 * Because all managed addresses come from one range, "is this kernel parameter word a managed
 * pointer, and whose" is one subtraction, one compare and one atomic load: the launch hook scans
 * every parameter word with it and takes no lock. */
#ifndef FS_VA_SPACE_H
#define FS_VA_SPACE_H

#include <pthread.h>
#include <stdint.h>

#include "device.h"

struct fs_va_hole; /* a free range, kept sorted by address */

struct fs_va_space {
    struct fs_device *dev;
    fs_dptr base;
    uint64_t size;
    unsigned shift;       /* log2(granularity) */
    void **owner;         /* one entry per granule: the allocation there, or NULL */
    pthread_mutex_t lock; /* guards the holes; the owner table is read without it */
    struct fs_va_hole *holes;
    int nholes, cap_holes;
};

/* Reserve the range: SIZE bytes if possible, halving down to MIN_SIZE when the device refuses. */
int fs_va_space_init(struct fs_va_space *vs, struct fs_device *dev, uint64_t size,
                     uint64_t min_size);
void fs_va_space_destroy(struct fs_va_space *vs);

/* A free sub-range of SIZE bytes (rounded up to the granularity), first fit. */
int fs_va_space_alloc(struct fs_va_space *vs, uint64_t size, fs_dptr *out);
void fs_va_space_free(struct fs_va_space *vs, fs_dptr va, uint64_t size);

/* Record OWNER (or NULL) for every granule of [va, va + size). */
void fs_va_space_set_owner(struct fs_va_space *vs, fs_dptr va, uint64_t size, void *owner);

/* The owner of the granule holding ADDR, or NULL. Lock-free. */
static inline void *fs_va_space_lookup(const struct fs_va_space *vs, uint64_t addr)
{
    uint64_t off = addr - vs->base; /* wraps for addresses below base */
    if (off >= vs->size)
        return NULL;
    return __atomic_load_n(&vs->owner[off >> vs->shift], __ATOMIC_ACQUIRE);
}

#endif

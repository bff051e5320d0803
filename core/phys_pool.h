/* Pools of physical memory, one per location (device, pinned host).
 *
 * The driver maps and unmaps only whole physical allocations (measured on the H200: a non-zero
 * offset or a partial size is CUDA_ERROR_NOT_SUPPORTED), so an allocation's backing is one
 * physical block of exactly its mapped size, and the pool reuses blocks by size: the segments a
 * framework allocates repeat (every layer's weights have the same shapes), so an evicted block is
 * what the next fault-in of that size needs. Each block is also mapped once at a VA of its own,
 * so the engine can copy into or out of it while the allocation's VA maps the other side.
 * Creating host blocks pins memory (slow, about 3.9 GB/s): the engine does it ahead of need on a
 * background thread (fs_phys_block_create outside the pool's lock), never per eviction. */
#ifndef FS_PHYS_POOL_H
#define FS_PHYS_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "device.h"

struct fs_block {
    fs_phys phys;
    uint64_t size;
    fs_dptr copy_va; /* where the block is mapped for copies */
    enum fs_mem_loc loc;
};

/* Over a pool's life: blocks created and released (trimmed), and the host time spent making
 * them and giving the trimmed ones back. */
struct fs_pool_counts {
    uint64_t made, released, made_ns, released_ns;
};

struct fs_phys_pool {
    struct fs_device *dev;
    enum fs_mem_loc loc;
    pthread_mutex_t lock;
    struct fs_block **free_blocks; /* cached, most recently returned last */
    int nfree, cap_free;
    uint64_t held_bytes; /* every block of this pool, in use or cached */
    uint64_t free_bytes; /* cached */
    uint64_t outside_bytes; /* held beside the pool, counted in its peak (plain allocations) */
    uint64_t held_peak;     /* of held_bytes + outside_bytes */
    struct fs_pool_counts counts;
};

int fs_phys_pool_init(struct fs_phys_pool *pool, struct fs_device *dev, enum fs_mem_loc loc);
/* Releases the cached blocks; blocks still in use must have been put back. */
void fs_phys_pool_destroy(struct fs_phys_pool *pool);

/* A block of exactly SIZE bytes: a cached one, else (GROW) a new one. FS_ERR_NOMEM without one. */
int fs_phys_pool_get(struct fs_phys_pool *pool, uint64_t size, bool grow, struct fs_block **out);
/* Is a cached block of SIZE bytes available? */
bool fs_phys_pool_has(struct fs_phys_pool *pool, uint64_t size);
void fs_phys_pool_put(struct fs_phys_pool *pool, struct fs_block *b);

/* Create a block outside any lock, then account it with fs_phys_pool_adopt (background pinning). */
int fs_phys_block_create(struct fs_device *dev, enum fs_mem_loc loc, uint64_t size,
                         struct fs_block **out);
void fs_phys_pool_adopt(struct fs_phys_pool *pool, struct fs_block *b);
/* Give a block that no pool accounts for back to the driver (logged on failure). */
void fs_phys_block_release(struct fs_device *dev, struct fs_block *b);

/* Give cached blocks back to the driver until WANT bytes were released or none is left; returns
 * the bytes released. */
uint64_t fs_phys_pool_trim(struct fs_phys_pool *pool, uint64_t want);

uint64_t fs_phys_pool_held(struct fs_phys_pool *pool);
/* Memory of the same kind held beside the pool grew (or, negative, shrank) by DELTA bytes: the
 * peak counts it too. */
void fs_phys_pool_add_outside(struct fs_phys_pool *pool, int64_t delta);
uint64_t fs_phys_pool_outside(struct fs_phys_pool *pool);
uint64_t fs_phys_pool_held_peak(struct fs_phys_pool *pool);
struct fs_pool_counts fs_phys_pool_counts(struct fs_phys_pool *pool);

/* Copy SIZE bytes between an allocation at VA and block B on STREAM (TO_BLOCK: va -> block). */
int fs_block_copy(struct fs_device *dev, const struct fs_block *b, fs_dptr va, uint64_t size,
                  bool to_block, fs_stream stream);

#endif

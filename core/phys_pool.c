#include "phys_pool.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

int fs_phys_block_create(struct fs_device *dev, enum fs_mem_loc loc, uint64_t size,
                         struct fs_block **out)
{
    struct fs_block *b = calloc(1, sizeof(*b));
    if (!b)
        return FS_ERR_NOMEM;
    int rc = fs_dev_call(dev, phys_create, size, loc, &b->phys);
    if (rc != FS_OK)
        goto fail_struct;
    rc = fs_dev_call(dev, va_reserve, size, &b->copy_va);
    if (rc != FS_OK)
        goto fail_phys;
    rc = fs_dev_call(dev, map, b->copy_va, size, b->phys, 0);
    if (rc != FS_OK)
        goto fail_va;
    b->size = size;
    b->loc = loc;
    *out = b;
    return FS_OK;
fail_va:
    fs_dev_call(dev, va_release, b->copy_va, size);
fail_phys:
    fs_dev_call(dev, phys_release, b->phys);
fail_struct:
    free(b);
    return rc;
}

void fs_phys_block_release(struct fs_device *dev, struct fs_block *b)
{
    int rc = fs_dev_call(dev, unmap, b->copy_va, b->size);
    if (rc == FS_OK)
        rc = fs_dev_call(dev, va_release, b->copy_va, b->size);
    if (rc == FS_OK)
        rc = fs_dev_call(dev, phys_release, b->phys);
    if (rc != FS_OK)
        FS_WARN("releasing a %llu-byte %s block failed (%s); it stays allocated",
                (unsigned long long)b->size, b->loc == FS_LOC_HOST ? "host" : "device",
                fs_err_str(rc));
    free(b);
}

/* Lock held. */
static void note_peak(struct fs_phys_pool *pool)
{
    uint64_t now = pool->held_bytes + pool->outside_bytes;
    if (now > pool->held_peak)
        pool->held_peak = now;
}

int fs_phys_pool_init(struct fs_phys_pool *pool, struct fs_device *dev, enum fs_mem_loc loc)
{
    memset(pool, 0, sizeof(*pool));
    pool->dev = dev;
    pool->loc = loc;
    pthread_mutex_init(&pool->lock, NULL);
    return FS_OK;
}

void fs_phys_pool_destroy(struct fs_phys_pool *pool)
{
    if (!pool->dev)
        return;
    for (int i = 0; i < pool->nfree; i++)
        fs_phys_block_release(pool->dev, pool->free_blocks[i]);
    free(pool->free_blocks);
    pthread_mutex_destroy(&pool->lock);
    memset(pool, 0, sizeof(*pool));
}

/* Index of a cached block of SIZE, newest first, or -1 (lock held). */
static int find_free(const struct fs_phys_pool *pool, uint64_t size)
{
    for (int i = pool->nfree - 1; i >= 0; i--)
        if (pool->free_blocks[i]->size == size)
            return i;
    return -1;
}

static struct fs_block *take_free(struct fs_phys_pool *pool, int i)
{
    struct fs_block *b = pool->free_blocks[i];
    memmove(&pool->free_blocks[i], &pool->free_blocks[i + 1],
            (size_t)(pool->nfree - i - 1) * sizeof(*pool->free_blocks));
    pool->nfree--;
    pool->free_bytes -= b->size;
    return b;
}

int fs_phys_pool_get(struct fs_phys_pool *pool, uint64_t size, bool grow, struct fs_block **out)
{
    pthread_mutex_lock(&pool->lock);
    int i = find_free(pool, size);
    if (i >= 0) {
        *out = take_free(pool, i);
        pthread_mutex_unlock(&pool->lock);
        return FS_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    if (!grow)
        return FS_ERR_NOMEM;
    uint64_t t0 = fs_now_ns();
    int rc = fs_phys_block_create(pool->dev, pool->loc, size, out);
    if (rc != FS_OK)
        return rc;
    pthread_mutex_lock(&pool->lock);
    pool->counts.made_ns += fs_now_ns() - t0;
    pool->held_bytes += size;
    note_peak(pool);
    pool->counts.made++;
    pthread_mutex_unlock(&pool->lock);
    return FS_OK;
}

bool fs_phys_pool_has(struct fs_phys_pool *pool, uint64_t size)
{
    pthread_mutex_lock(&pool->lock);
    bool has = find_free(pool, size) >= 0;
    pthread_mutex_unlock(&pool->lock);
    return has;
}

/* Cache B (lock held); a block that cannot be cached (out of host memory) is released. */
static void cache_block(struct fs_phys_pool *pool, struct fs_block *b)
{
    if (pool->nfree == pool->cap_free) {
        int cap = pool->cap_free ? pool->cap_free * 2 : 32;
        struct fs_block **grown = realloc(pool->free_blocks, (size_t)cap * sizeof(*grown));
        if (!grown) {
            pool->held_bytes -= b->size;
            pool->counts.released++;
            fs_phys_block_release(pool->dev, b);
            return;
        }
        pool->free_blocks = grown;
        pool->cap_free = cap;
    }
    pool->free_blocks[pool->nfree++] = b;
    pool->free_bytes += b->size;
}

void fs_phys_pool_put(struct fs_phys_pool *pool, struct fs_block *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&pool->lock);
    cache_block(pool, b);
    pthread_mutex_unlock(&pool->lock);
}

void fs_phys_pool_adopt(struct fs_phys_pool *pool, struct fs_block *b)
{
    pthread_mutex_lock(&pool->lock);
    pool->held_bytes += b->size;
    note_peak(pool);
    pool->counts.made++;
    pthread_mutex_unlock(&pool->lock);
}

uint64_t fs_phys_pool_trim(struct fs_phys_pool *pool, uint64_t want)
{
    uint64_t released = 0;
    pthread_mutex_lock(&pool->lock);
    while (pool->nfree > 0 && released < want) {
        struct fs_block *b = take_free(pool, 0); /* oldest first */
        pool->held_bytes -= b->size;
        pool->counts.released++;
        released += b->size;
        uint64_t t0 = fs_now_ns();
        fs_phys_block_release(pool->dev, b);
        pool->counts.released_ns += fs_now_ns() - t0;
    }
    pthread_mutex_unlock(&pool->lock);
    return released;
}

uint64_t fs_phys_pool_held(struct fs_phys_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    uint64_t v = pool->held_bytes;
    pthread_mutex_unlock(&pool->lock);
    return v;
}

void fs_phys_pool_add_outside(struct fs_phys_pool *pool, int64_t delta)
{
    pthread_mutex_lock(&pool->lock);
    pool->outside_bytes += (uint64_t)delta;
    note_peak(pool);
    pthread_mutex_unlock(&pool->lock);
}

uint64_t fs_phys_pool_outside(struct fs_phys_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    uint64_t v = pool->outside_bytes;
    pthread_mutex_unlock(&pool->lock);
    return v;
}

uint64_t fs_phys_pool_held_peak(struct fs_phys_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    uint64_t v = pool->held_peak;
    pthread_mutex_unlock(&pool->lock);
    return v;
}

struct fs_pool_counts fs_phys_pool_counts(struct fs_phys_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    struct fs_pool_counts c = pool->counts;
    pthread_mutex_unlock(&pool->lock);
    return c;
}

int fs_block_copy(struct fs_device *dev, const struct fs_block *b, fs_dptr va, uint64_t size,
                  bool to_block, fs_stream stream)
{
    return to_block ? fs_dev_call(dev, copy_async, b->copy_va, va, size, stream)
                    : fs_dev_call(dev, copy_async, va, b->copy_va, size, stream);
}

#include "va_space.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

struct fs_va_hole {
    fs_dptr va;
    uint64_t size;
};

int fs_va_space_init(struct fs_va_space *vs, struct fs_device *dev, uint64_t size,
                     uint64_t min_size)
{
    memset(vs, 0, sizeof(*vs));
    uint64_t g = dev->props.granularity;
    if (g == 0 || (g & (g - 1)) != 0)
        return FS_ERR_INVALID;
    vs->dev = dev;
    vs->shift = (unsigned)__builtin_ctzll(g);
    int rc = FS_ERR_NOMEM;
    for (size = fs_round_up(size, g); size >= min_size && size >= g; size = fs_round_up(size / 2, g)) {
        rc = fs_dev_call(dev, va_reserve, size, &vs->base);
        if (rc == FS_OK)
            break;
    }
    if (rc != FS_OK) {
        FS_WARN("cannot reserve a managed address range of at least %llu MiB: %s",
                (unsigned long long)(min_size >> 20), fs_err_str(rc));
        return rc;
    }
    vs->size = size;
    /* calloc of a large table: the kernel hands out zero pages lazily, so only granules in use
     * cost memory. */
    vs->owner = calloc(size >> vs->shift, sizeof(void *));
    vs->cap_holes = 16;
    vs->holes = malloc((size_t)vs->cap_holes * sizeof(*vs->holes));
    if (!vs->owner || !vs->holes) {
        rc = FS_ERR_NOMEM;
        goto fail;
    }
    vs->holes[0] = (struct fs_va_hole){vs->base, size};
    vs->nholes = 1;
    pthread_mutex_init(&vs->lock, NULL);
    return FS_OK;
fail:
    free(vs->owner);
    free(vs->holes);
    fs_dev_call(dev, va_release, vs->base, size);
    memset(vs, 0, sizeof(*vs));
    return rc;
}

void fs_va_space_destroy(struct fs_va_space *vs)
{
    if (!vs->dev)
        return;
    fs_dev_call(vs->dev, va_release, vs->base, vs->size);
    free(vs->owner);
    free(vs->holes);
    pthread_mutex_destroy(&vs->lock);
    memset(vs, 0, sizeof(*vs));
}

int fs_va_space_alloc(struct fs_va_space *vs, uint64_t size, fs_dptr *out)
{
    size = fs_round_up(size, 1ull << vs->shift);
    int rc = FS_ERR_NOMEM;
    pthread_mutex_lock(&vs->lock);
    for (int i = 0; i < vs->nholes; i++) {
        struct fs_va_hole *h = &vs->holes[i];
        if (h->size < size)
            continue;
        *out = h->va;
        h->va += size;
        h->size -= size;
        if (h->size == 0) {
            memmove(h, h + 1, (size_t)(vs->nholes - i - 1) * sizeof(*h));
            vs->nholes--;
        }
        rc = FS_OK;
        break;
    }
    pthread_mutex_unlock(&vs->lock);
    return rc;
}

void fs_va_space_free(struct fs_va_space *vs, fs_dptr va, uint64_t size)
{
    size = fs_round_up(size, 1ull << vs->shift);
    pthread_mutex_lock(&vs->lock);
    int i = 0;
    while (i < vs->nholes && vs->holes[i].va < va)
        i++;
    bool merge_prev = i > 0 && vs->holes[i - 1].va + vs->holes[i - 1].size == va;
    bool merge_next = i < vs->nholes && va + size == vs->holes[i].va;
    if (merge_prev && merge_next) {
        vs->holes[i - 1].size += size + vs->holes[i].size;
        memmove(&vs->holes[i], &vs->holes[i + 1], (size_t)(vs->nholes - i - 1) * sizeof(*vs->holes));
        vs->nholes--;
    } else if (merge_prev) {
        vs->holes[i - 1].size += size;
    } else if (merge_next) {
        vs->holes[i].va = va;
        vs->holes[i].size += size;
    } else {
        if (vs->nholes == vs->cap_holes) {
            struct fs_va_hole *grown =
                realloc(vs->holes, (size_t)vs->cap_holes * 2 * sizeof(*vs->holes));
            if (!grown) { /* lose the range rather than corrupt the list; say so */
                FS_WARN("out of host memory: %llu bytes of managed address space are not reused",
                        (unsigned long long)size);
                goto out;
            }
            vs->holes = grown;
            vs->cap_holes *= 2;
        }
        memmove(&vs->holes[i + 1], &vs->holes[i], (size_t)(vs->nholes - i) * sizeof(*vs->holes));
        vs->holes[i] = (struct fs_va_hole){va, size};
        vs->nholes++;
    }
out:
    pthread_mutex_unlock(&vs->lock);
}

void fs_va_space_set_owner(struct fs_va_space *vs, fs_dptr va, uint64_t size, void *owner)
{
    uint64_t first = (va - vs->base) >> vs->shift;
    uint64_t n = (size + (1ull << vs->shift) - 1) >> vs->shift;
    for (uint64_t i = 0; i < n; i++)
        __atomic_store_n(&vs->owner[first + i], owner, __ATOMIC_RELEASE);
}

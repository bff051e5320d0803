/* The plan executor's order of the evictions' host mappings (core/executor.h): a released eviction
 * whose allocation a prefetch waits for is mapped before older ones, the rest keep their order. */
#include <stdlib.h>

#include "executor.h"
#include "test_util.h"

enum { NALLOCS = 20 };

/* The released queue's entry K places from its head. */
static struct fs_exec_released *entry(struct fs_executor *x, int k)
{
    return &x->released[(x->released_head + k) % FS_EXEC_RELEASED_MAX];
}

static struct fs_executor *executor_with(const uint64_t *ids, int n, int head)
{
    struct fs_executor *x = calloc(1, sizeof(*x));
    assert_non_null(x);
    x->prof.nallocs = NALLOCS;
    x->pf = calloc(NALLOCS, sizeof(*x->pf));
    assert_non_null(x->pf);
    x->released_head = head;
    x->released_len = n;
    for (int k = 0; k < n; k++)
        entry(x, k)->job.id = ids[k];
    return x;
}

static void assert_order(struct fs_executor *x, const uint64_t *ids, int n)
{
    assert_int_equal(x->released_len, n);
    for (int k = 0; k < n; k++)
        assert_int_equal(entry(x, k)->job.id, ids[k]);
}

static void free_executor(struct fs_executor *x)
{
    free(x->pf);
    free(x);
}

static void test_needed_mapping_goes_first(void **state)
{
    (void)state;
    /* across the ring's end, so that the shift wraps */
    const uint64_t ids[] = {10, 11, 12, 13, 12};
    struct fs_executor *x = executor_with(ids, 5, FS_EXEC_RELEASED_MAX - 2);
    x->pf[12].pending = 1;
    entry(x, 2)->job.gen = 7; /* travels along */
    fs_exec_released_needed_first(x);
    assert_order(x, (const uint64_t[]){12, 10, 11, 13, 12}, 5);
    assert_int_equal(entry(x, 0)->job.gen, 7);
    assert_int_equal(x->stats.host_maps_first, 1);
    /* Now at the head: it stays there, and nothing else moves. */
    fs_exec_released_needed_first(x);
    assert_order(x, (const uint64_t[]){12, 10, 11, 13, 12}, 5);
    assert_int_equal(x->stats.host_maps_first, 1);
    free_executor(x);
}

static void test_order_kept_when_none_or_the_oldest_is_needed(void **state)
{
    (void)state;
    const uint64_t ids[] = {3, 4, 5};
    struct fs_executor *x = executor_with(ids, 3, 0);
    fs_exec_released_needed_first(x);
    assert_order(x, ids, 3);
    x->pf[3].pending = 2;
    x->pf[5].pending = 1;
    fs_exec_released_needed_first(x);
    assert_order(x, ids, 3);
    assert_int_equal(x->stats.host_maps_first, 0);
    free_executor(x);
}

static void test_allocations_outside_the_plan_are_not_needed(void **state)
{
    (void)state;
    /* 25 is past the plan's allocations (made after the profile): no prefetch of the plan's can
     * wait for it, and its id indexes no table. */
    const uint64_t ids[] = {1, 25, 2, 6};
    struct fs_executor *x = executor_with(ids, 4, 9);
    x->pf[6].pending = 1;
    fs_exec_released_needed_first(x);
    assert_order(x, (const uint64_t[]){6, 1, 25, 2}, 4);
    assert_int_equal(x->stats.host_maps_first, 1);
    free_executor(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_needed_mapping_goes_first),
        cmocka_unit_test(test_order_kept_when_none_or_the_oldest_is_needed),
        cmocka_unit_test(test_allocations_outside_the_plan_are_not_needed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
